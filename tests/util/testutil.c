#include "testutil.h"

#include "format/dtype.h"

#include <math.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void kt_rng_seed(kt_rng *r, uint64_t seed) {
    r->s = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
    if (!r->s) r->s = 1;
}

uint64_t kt_rng_u64(kt_rng *r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

float kt_rng_uniform(kt_rng *r, float lo, float hi) {
    return lo + (hi - lo) * (float)((kt_rng_u64(r) >> 40) * (1.0 / 16777216.0));
}

float kt_rng_normal(kt_rng *r) {
    float s = 0;
    for (int i = 0; i < 4; i++) s += kt_rng_uniform(r, -1.0f, 1.0f);
    return s * 0.8660254f; /* var of U(-1,1) is 1/3; 4 of them: 4/3 -> scale to 1 */
}

void kt_fill_normal(kt_rng *r, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = kt_rng_normal(r) * scale;
}

const char *kt_source_dir(void) {
    const char *s = getenv("KILN_SOURCE_DIR");
    return s ? s : ".";
}

const char *kt_shared_dir(void) {
    const char *s = getenv("KILN_SHARED_DIR");
    return s ? s : "../shared";
}

/* every file kt_write_temp made, unlinked at exit (tests must not litter $TMPDIR) */
static char **g_temp_files;
static size_t g_n_temp_files;

static void unlink_temp_files(void) {
    for (size_t i = 0; i < g_n_temp_files; i++) {
        unlink(g_temp_files[i]);
        free(g_temp_files[i]);
    }
    free(g_temp_files);
    g_temp_files = NULL;
    g_n_temp_files = 0;
}

static void remember_temp_file(const char *path) {
    if (g_n_temp_files == 0 && atexit(unlink_temp_files) != 0) return;
    char **grown = realloc(g_temp_files, (g_n_temp_files + 1) * sizeof *grown);
    if (!grown) return;
    g_temp_files = grown;
    char *copy = strdup(path);
    if (copy) g_temp_files[g_n_temp_files++] = copy;
}

const char *kt_write_temp(const void *data, size_t len, const char *suffix) {
    static char paths[8][256];
    static int slot;
    char *p = paths[slot++ % 8];
    const char *tmp = getenv("TMPDIR");
    snprintf(p, 256, "%s/kiln-test-XXXXXX%s", tmp && *tmp ? tmp : "/tmp", suffix ? suffix : "");
    int fd = mkstemps(p, suffix ? (int)strlen(suffix) : 0);
    if (fd < 0) return NULL;
    remember_temp_file(p);
    const char *b = data;
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, b + off, len - off);
        if (w <= 0) {
            close(fd);
            return NULL;
        }
        off += (size_t)w;
    }
    close(fd);
    return p;
}

/* ---- random weights ---- */

static void put_half(uint8_t *p, float v) {
    uint16_t h = kiln_f32_to_fp16(v);
    memcpy(p, &h, 2);
}

void kt_fill_weights(kt_rng *r, uint32_t dt, uint8_t *w, int64_t n, int64_t k, size_t row_bytes) {
    for (size_t i = 0; i < (size_t)n * row_bytes; i++) w[i] = (uint8_t)kt_rng_u64(r);
    for (int64_t row = 0; row < n; row++) {
        uint8_t *x = w + row * row_bytes;
        if (dt == KILN_DTYPE_F32 || dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_BF16) {
            for (int64_t i = 0; i < k; i++) {
                float v = kt_rng_normal(r) * 0.1f;
                if (dt == KILN_DTYPE_F32) memcpy(x + 4 * i, &v, 4);
                if (dt == KILN_DTYPE_F16) put_half(x + 2 * i, v);
                if (dt == KILN_DTYPE_BF16) {
                    uint16_t h = kiln_f32_to_bf16(v);
                    memcpy(x + 2 * i, &h, 2);
                }
            }
            continue;
        }
        const kiln_dtype_info *info = kiln_dtype_get(dt);
        for (int64_t b = 0; b < k / info->block_size; b++) {
            uint8_t *blk = x + b * info->block_bytes;
            float d = kt_rng_uniform(r, 0.002f, 0.02f), m = kt_rng_uniform(r, -0.1f, 0.1f);
            switch (dt) {
            case KILN_DTYPE_Q4_1:
            case KILN_DTYPE_Q5_1:
                put_half(blk + 2, m); /* fallthrough */
            case KILN_DTYPE_Q4_0:
            case KILN_DTYPE_Q5_0:
            case KILN_DTYPE_Q8_0:
                put_half(blk, d);
                break;
            case KILN_DTYPE_Q4_K:
            case KILN_DTYPE_Q5_K:
                put_half(blk, d * 0.05f);
                put_half(blk + 2, fabsf(m) * 0.05f);
                break;
            case KILN_DTYPE_Q6_K:
                put_half(blk + 208, d * 0.05f);
                break;
            default:
                break;
            }
        }
    }
}

int kt_tmpdir(char *dir, size_t n, const char *prefix) {
    const char *tmp = getenv("TMPDIR");
    if (snprintf(dir, n, "%s/%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", prefix) >= (int)n) return -1;
    return mkdtemp(dir) ? 0 : -1;
}

int kt_tmpdir_remove(const char *dir) {
    char cmd[600];
    if (!dir[0] || snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir) >= (int)sizeof cmd) return -1;
    return system(cmd) == 0 ? 0 : -1;
}

void kt_kiln_gen(const char *args, const char *path) {
    const char *b = getenv("KILN_BINARY_DIR");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s/kiln-gen' -q %s -o '%s'", b ? b : ".", args, path);
    if (system(cmd) != 0) fail_msg("failed: %s", cmd);
}
