/*
 * bench_prefill_providers.c — prefill matmul rate of every registered host matmul kernel
 * that can run a weight dtype: kiln's cpu kernels, OpenBLAS, oneDNN.
 *
 *   bench_prefill_providers [-t THREADS] [-r REPS] [-n TOKENS] [-d DTYPE,...] [-k ID,...]
 *
 * Shapes: 2048 x 2048 and tinyllama-1.1b's (q/o 2048x2048, k/v 256x2048, gate/up
 * 5632x2048, down 2048x5632), TOKENS (default 128) tokens per call. Per (dtype, kernel,
 * shape): 2 warm-up calls, then REPS calls; the minimum time -> GFLOP/s (2 t n k flops).
 * "tinyllama layer" sums one call per matrix of a layer. Random weights quantized to the
 * dtype; kernels that ask for the R16 layout get repacked weights. The workspace is the
 * spec's (for the bucket of TOKENS), so primitive creation and first-use conversions
 * fall in the warm-up. Results: docs/PERF.md ("CPU backend", providers).
 */
#include "base/mem.h"
#include "base/pool.h"
#include "base/timer.h"
#include "format/dtype.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/registry.h"
#include "kernels/select.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape {
    const char *name;
    int64_t n, k;
} shape;

static const shape shapes[] = {
    {"2048x2048", 2048, 2048},
    {"tl.kv 256x2048", 256, 2048},
    {"tl.up 5632x2048", 5632, 2048},
    {"tl.down 2048x5632", 2048, 5632},
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

static bool in_list(const char *list, const char *s) {
    if (!list) return true;
    size_t n = strlen(s);
    for (const char *p = list; (p = strstr(p, s)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return true;
    return false;
}

/* Minimum seconds per call, or a negative value on failure. */
static double bench_one(const kiln_reg_kernel *k, uint32_t dt, const shape *s, int64_t t,
                        kiln_pool *pool, int reps) {
    kiln_err e;
    kiln_err_clear(&e);
    size_t rb;
    if (kiln_dtype_row_bytes(dt, s->k, &rb, &e)) return -1;
    uint8_t *w = kiln_alloc_aligned(rb * (size_t)s->n);
    float *row = malloc(sizeof(float) * (size_t)s->k);
    float *x = kiln_alloc_aligned(sizeof(float) * (size_t)(t * s->k));
    float *y = kiln_alloc_aligned(sizeof(float) * (size_t)(t * s->n));
    void *packed = NULL, *scratch = NULL;
    double best = -1;
    if (!w || !row || !x || !y) goto done;
    for (int64_t r = 0; r < s->n; r++) {
        for (int64_t i = 0; i < s->k; i++) row[i] = frand() * 0.1f;
        if (kiln_quantize_row(dt, row, w + (size_t)r * rb, s->k, &e)) goto done;
    }
    for (int64_t i = 0; i < t * s->k; i++) x[i] = frand();
    kiln_matmul_args a = {.w = w,
                          .w_dtype = dt,
                          .w_row_bytes = rb,
                          .n = s->n,
                          .k = s->k,
                          .x = x,
                          .x_stride = s->k,
                          .y = y,
                          .y_stride = s->n,
                          .t = t};
    if (k->spec.w_layout == KILN_WLAYOUT_CPU_R16) {
        size_t bytes;
        if (kiln_cpu_r16_size(dt, s->n, s->k, &bytes, &e)) goto done;
        if (!(packed = kiln_alloc_aligned(bytes))) goto done;
        if (kiln_cpu_r16_repack(dt, w, rb, s->n, s->k, packed, &e)) goto done;
        a.w = packed;
        a.w_layout = KILN_WLAYOUT_CPU_R16;
    }
    kiln_sel_ctx c;
    kiln_sel_ctx_init(&c, KILN_KOP_MATMUL, KILN_BACKEND_CPU);
    c.w_dtype = dt;
    c.n = s->n;
    c.k = s->k;
    kiln_sel_ctx_set_bucket(&c, kiln_tok_bucket(t), 0, 0, 0);
    size_t ws = k->spec.workspace ? k->spec.workspace(&c) : 0;
    if (ws && !(scratch = kiln_alloc_aligned(ws))) goto done;
    kiln_kctx kc = {.pool = pool, .scratch = scratch, .scratch_size = ws};
    for (int i = 0; i < 2 + reps; i++) {
        uint64_t t0 = kiln_now_ns();
        kiln_status st = k->spec.fn.matmul(&kc, &a);
        double sec = (double)(kiln_now_ns() - t0) * 1e-9;
        if (st) {
            fprintf(stderr, "%s %s %s: %s\n", k->spec.id, kiln_dtype_name(dt), s->name,
                    kiln_status_name(st));
            best = -1;
            goto done;
        }
        if (i >= 2 && (best < 0 || sec < best)) best = sec;
    }
done:
    kiln_free_aligned(w);
    kiln_free_aligned(x);
    kiln_free_aligned(y);
    kiln_free_aligned(packed);
    kiln_free_aligned(scratch);
    free(row);
    return best;
}

int main(int argc, char **argv) {
    int threads = 2, reps = 5;
    int64_t t = 128;
    const char *dts = "f32,f16,q8_0", *ids = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc)
            t = atoll(argv[++i]);
        else if (!strcmp(argv[i], "-d") && i + 1 < argc)
            dts = argv[++i];
        else if (!strcmp(argv[i], "-k") && i + 1 < argc)
            ids = argv[++i];
        else {
            fprintf(stderr,
                    "usage: %s [-t THREADS] [-r REPS] [-n TOKENS] [-d DTYPE,...] "
                    "[-k KERNEL_ID,...]\n",
                    argv[0]);
            return 2;
        }
    }
    if (reps < 1 || t < 1) return 2;
    kiln_pool *pool = NULL;
    if (kiln_pool_create(threads, &pool, NULL)) return 1;
    const kiln_registry *r = kiln_registry_default();
    printf("prefill GFLOP/s, t = %lld, %d threads, min of %d calls\n", (long long)t,
           kiln_pool_size(pool), reps);
    printf("| dtype | kernel | 2048x2048 | tl.kv 256x2048 | tl.up 5632x2048 | tl.down 2048x5632 | "
           "tinyllama layer |\n|---|---|---:|---:|---:|---:|---:|\n");
    for (uint32_t dt = 0; dt < 64; dt++) {
        const kiln_dtype_info *di = kiln_dtype_get(dt);
        if (!di || !di->name || !in_list(dts, di->name)) continue;
        for (int i = 0; i < r->n_by_op[KILN_KOP_MATMUL]; i++) {
            const kiln_reg_kernel *k = &r->kernels[r->by_op[KILN_KOP_MATMUL][i]];
            if (!kiln_registry_kernel_available(r, k) || !(k->spec.w_dtypes & KILN_DT(dt)) ||
                strcmp(k->spec.provider, "ref") == 0 || !in_list(ids, k->spec.id) ||
                (k->spec.isa & kiln_cpu_info()->isa) != k->spec.isa)
                continue;
            printf("| %s | %s |", di->name, k->spec.id);
            fflush(stdout);
            double layer_s = 0, layer_f = 0;
            bool ok = true;
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                double sec = bench_one(k, dt, &shapes[s], t, pool, reps);
                double fl = 2.0 * (double)t * (double)shapes[s].n * (double)shapes[s].k;
                if (sec <= 0) {
                    printf(" fail |");
                    ok = false;
                    continue;
                }
                printf(" %.1f |", fl / sec * 1e-9);
                fflush(stdout);
                /* a layer: q, o (2048x2048), k, v (256x2048), gate, up, down */
                int times = s == 0 ? 2 : s == 1 ? 2 : s == 2 ? 2 : 1;
                layer_s += times * sec;
                layer_f += times * fl;
            }
            if (ok)
                printf(" %.1f |\n", layer_f / layer_s * 1e-9);
            else
                printf(" - |\n");
        }
    }
    kiln_pool_free(pool);
    return 0;
}
