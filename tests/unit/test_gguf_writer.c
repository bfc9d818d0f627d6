/* test_gguf_writer.c — the GGUF writer: writes files with metadata of every type and
 * tensors given by pointer and by parallel fill callbacks, then parses the bytes back
 * independently (a small parser below) and checks sizes, offsets, alignment, values and
 * tensor bytes; error paths (bad names, duplicates, a failing fill leaves no file). */
#include "base/pool.h"
#include "format/dtype.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "format/meta.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct rd {
    const uint8_t *p;
    size_t len, off;
} rd;

static uint64_t rd_u(rd *r, size_t n) {
    assert_true(r->off + n <= r->len);
    uint64_t v = 0;
    memcpy(&v, r->p + r->off, n);
    r->off += n;
    return v;
}

static char *rd_str(rd *r) {
    uint64_t n = rd_u(r, 8);
    assert_true(r->off + n <= r->len);
    char *s = malloc(n + 1);
    assert_non_null(s);
    memcpy(s, r->p + r->off, n);
    s[n] = 0;
    r->off += n;
    return s;
}

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* fill: row r of a q8_0 tensor = quantized (r * 1000 + i) * 0.001 */
static kiln_status fill_q8(const kiln_gguf_wtensor *t, int64_t row0, int64_t n, void *dst, int ith,
                           kiln_err *err) {
    (void)ith;
    float x[512];
    assert_true(t->shape[0] <= 512);
    for (int64_t r = 0; r < n; r++) {
        for (int64_t i = 0; i < t->shape[0]; i++) x[i] = (float)((row0 + r) % 97 + i) * 0.01f;
        KILN_TRY(kiln_quantize_row(t->dtype, x, (uint8_t *)dst + (size_t)r * t->row_bytes,
                                   t->shape[0], err));
    }
    return KILN_OK;
}

static kiln_status fill_fail(const kiln_gguf_wtensor *t, int64_t row0, int64_t n, void *dst,
                             int ith, kiln_err *err) {
    (void)t, (void)n, (void)dst, (void)ith;
    if (row0 + n > 100) return kiln_err_set(err, KILN_ERR_IO, "synthetic failure");
    return KILN_OK;
}

static void test_write_and_parse(void **state) {
    (void)state;
    kiln_err e;
    kiln_gguf_writer *w;
    assert_int_equal(kiln_gguf_writer_create(0, &w, &e), KILN_OK);
    assert_int_equal(kiln_gguf_writer_set_str(w, "general.architecture", "llama", &e), KILN_OK);
    assert_int_equal(kiln_gguf_writer_set_u32(w, "llama.block_count", 7, &e), KILN_OK);
    assert_int_equal(kiln_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f, &e), KILN_OK);
    assert_int_equal(kiln_gguf_writer_set_bool(w, "x.flag", true, &e), KILN_OK);
    assert_int_equal(kiln_gguf_writer_set_u64(w, "x.big", 1ull << 40, &e), KILN_OK);
    assert_int_equal(kiln_gguf_writer_set_i32(w, "x.neg", -5, &e), KILN_OK);
    const char *toks[] = {"<s>", "a", "bc"};
    assert_int_equal(kiln_gguf_writer_set_arr_str(w, "tok.tokens", toks, NULL, 3, &e), KILN_OK);
    const float sc[3] = {0, -1, -2};
    assert_int_equal(kiln_gguf_writer_set_arr(w, "tok.scores", KILN_GGUF_F32, sc, 3, &e), KILN_OK);
    /* replacing keeps the position, changes the value */
    assert_int_equal(kiln_gguf_writer_set_u32(w, "llama.block_count", 2, &e), KILN_OK);
    /* raw value: a u32 9 */
    const uint8_t raw[8] = {KILN_GGUF_U32, 0, 0, 0, 9, 0, 0, 0};
    assert_int_equal(kiln_gguf_writer_set_raw(w, "x.raw", raw, 8, &e), KILN_OK);
    assert_int_equal(kiln_gguf_writer_set_raw(w, "x.bad", raw, 7, &e), KILN_ERR_INVALID_ARG);
    assert_int_equal(kiln_gguf_writer_kv_count(w), 10); /* + general.alignment */

    float small[5] = {1, 2, 3, 4, 5}; /* 20 bytes: forces padding */
    const int64_t s1[1] = {5};
    assert_int_equal(kiln_gguf_writer_add_tensor(w, "a.weight", KILN_DTYPE_F32, 1, s1, small, &e),
                     KILN_OK);
    const int64_t s2[2] = {256, 300};
    assert_int_equal(
        kiln_gguf_writer_add_tensor_fill(w, "b.weight", KILN_DTYPE_Q8_0, 2, s2, fill_q8, NULL, &e),
        KILN_OK);
    const int64_t s3[3] = {32, 3, 2};
    assert_int_equal(
        kiln_gguf_writer_add_tensor_fill(w, "c.weight", KILN_DTYPE_Q4_0, 3, s3, fill_q8, NULL, &e),
        KILN_OK);
    /* errors */
    assert_int_equal(kiln_gguf_writer_add_tensor(w, "a.weight", KILN_DTYPE_F32, 1, s1, small, &e),
                     KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(e.msg, "duplicate"));
    const int64_t bad[1] = {33};
    assert_int_not_equal(kiln_gguf_writer_add_tensor(w, "d", KILN_DTYPE_Q4_0, 1, bad, small, &e),
                         KILN_OK);
    char longname[80];
    memset(longname, 'x', 79);
    longname[79] = 0;
    assert_int_equal(kiln_gguf_writer_add_tensor(w, longname, KILN_DTYPE_F32, 1, s1, small, &e),
                     KILN_ERR_INVALID_ARG);

    char path[256];
    snprintf(path, sizeof path, "%s/kiln-test-writer-%d.gguf",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    kiln_pool *pool;
    assert_int_equal(kiln_pool_create(3, &pool, &e), KILN_OK);
    kiln_gguf_write_stats st;
    assert_int_equal(kiln_gguf_writer_write(w, path, pool, false, &st, &e), KILN_OK);
    kiln_pool_free(pool);

    size_t len;
    uint8_t *buf = slurp(path, &len);
    assert_int_equal(len, st.file_bytes);
    rd r = {buf, len, 0};
    assert_memory_equal(buf, "GGUF", 4);
    r.off = 4;
    assert_int_equal(rd_u(&r, 4), 3);
    assert_int_equal(rd_u(&r, 8), 3);
    assert_int_equal(rd_u(&r, 8), 10);
    /* kvs in insertion order */
    const char *keys[] = {"general.alignment",
                          "general.architecture",
                          "llama.block_count",
                          "llama.rope.freq_base",
                          "x.flag",
                          "x.big",
                          "x.neg",
                          "tok.tokens",
                          "tok.scores"};
    for (int i = 0; i < 8; i++) {
        char *k = rd_str(&r);
        assert_string_equal(k, keys[i]);
        free(k);
        uint32_t type = (uint32_t)rd_u(&r, 4);
        switch (i) {
        case 0:
            assert_int_equal(type, KILN_GGUF_U32), assert_int_equal(rd_u(&r, 4), 32);
            break;
        case 1: {
            assert_int_equal(type, KILN_GGUF_STRING);
            char *s = rd_str(&r);
            assert_string_equal(s, "llama");
            free(s);
            break;
        }
        case 2:
            assert_int_equal(type, KILN_GGUF_U32), assert_int_equal(rd_u(&r, 4), 2);
            break;
        case 3: {
            assert_int_equal(type, KILN_GGUF_F32);
            uint32_t u = (uint32_t)rd_u(&r, 4);
            float f;
            memcpy(&f, &u, 4);
            assert_float_equal(f, 10000.0f, 0);
            break;
        }
        case 4:
            assert_int_equal(type, KILN_GGUF_BOOL), assert_int_equal(rd_u(&r, 1), 1);
            break;
        case 5:
            assert_int_equal(type, KILN_GGUF_U64), assert_int_equal(rd_u(&r, 8), 1ull << 40);
            break;
        case 6:
            assert_int_equal(type, KILN_GGUF_I32), assert_int_equal((int32_t)rd_u(&r, 4), -5);
            break;
        case 7: {
            assert_int_equal(type, KILN_GGUF_ARRAY);
            assert_int_equal(rd_u(&r, 4), KILN_GGUF_STRING);
            assert_int_equal(rd_u(&r, 8), 3);
            for (int j = 0; j < 3; j++) {
                char *s = rd_str(&r);
                assert_string_equal(s, toks[j]);
                free(s);
            }
            break;
        }
        }
    }
    char *k = rd_str(&r);
    assert_string_equal(k, "tok.scores");
    free(k);
    assert_int_equal(rd_u(&r, 4), KILN_GGUF_ARRAY);
    assert_int_equal(rd_u(&r, 4), KILN_GGUF_F32);
    assert_int_equal(rd_u(&r, 8), 3);
    r.off += 12;
    k = rd_str(&r);
    assert_string_equal(k, "x.raw");
    free(k);
    assert_int_equal(rd_u(&r, 4), KILN_GGUF_U32);
    assert_int_equal(rd_u(&r, 4), 9);
    /* tensor infos */
    const char *names[] = {"a.weight", "b.weight", "c.weight"};
    const uint32_t types[] = {KILN_DTYPE_F32, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_0};
    const size_t sizes[] = {20, 300 * 8 * 34, 6 * 18};
    uint64_t offs[3];
    for (int i = 0; i < 3; i++) {
        char *n = rd_str(&r);
        assert_string_equal(n, names[i]);
        free(n);
        const uint32_t nd = (uint32_t)rd_u(&r, 4);
        assert_int_equal(nd, i == 0 ? 1 : i == 1 ? 2 : 3);
        for (uint32_t d = 0; d < nd; d++) rd_u(&r, 8);
        assert_int_equal(rd_u(&r, 4), types[i]);
        offs[i] = rd_u(&r, 8);
        assert_int_equal(offs[i] % 32, 0);
    }
    assert_int_equal(offs[0], 0);
    assert_int_equal(offs[1], 32); /* 20 bytes padded to 32 */
    assert_int_equal(offs[2], 32 + sizes[1] + (32 - sizes[1] % 32) % 32);
    const size_t data = (r.off + 31) / 32 * 32;
    assert_int_equal(data, st.data_offset);
    for (size_t i = r.off; i < data; i++) assert_int_equal(buf[i], 0);
    assert_int_equal(len, data + offs[2] + (sizes[2] + 31) / 32 * 32);
    /* tensor bytes */
    assert_memory_equal(buf + data + offs[0], small, 20);
    uint8_t *want = malloc(sizes[1]);
    assert_int_equal(fill_q8(&(kiln_gguf_wtensor){.shape = {256, 300, 1, 1},
                                                  .dtype = KILN_DTYPE_Q8_0,
                                                  .row_bytes = 8 * 34},
                             0, 300, want, 0, &e),
                     KILN_OK);
    assert_memory_equal(buf + data + offs[1], want, sizes[1]);
    /* full round trip through kiln's GGUF reader */
    kiln_gguf *g;
    if (kiln_gguf_open(path, 0, &g, &e) != KILN_OK) fail_msg("%s", e.msg);
    const kiln_meta *m = kiln_gguf_meta(g);
    uint32_t u;
    assert_int_equal(kiln_meta_get_u32(m, "llama.block_count", &u, &e), KILN_OK);
    assert_int_equal(u, 2);
    assert_int_equal(kiln_meta_get_u32(m, "x.raw", &u, &e), KILN_OK);
    assert_int_equal(u, 9);
    uint64_t big;
    assert_int_equal(kiln_meta_get_u64(m, "x.big", &big, &e), KILN_OK);
    assert_int_equal(big, 1ull << 40);
    kiln_str sv;
    assert_int_equal(kiln_meta_get_str(m, "general.architecture", &sv, &e), KILN_OK);
    assert_true(kiln_str_eq(sv, "llama"));
    const kiln_meta_value *arr;
    assert_int_equal(kiln_meta_get_arr(m, "tok.tokens", KILN_META_STRING, &arr, &e), KILN_OK);
    assert_int_equal(arr->count, 3);
    assert_int_equal(kiln_gguf_alignment(g), 32);
    assert_int_equal(kiln_gguf_data_offset(g), data);
    assert_int_equal(kiln_gguf_tensor_count(g), 3);
    const kiln_tensor_info *ti = kiln_gguf_find_tensor(g, "b.weight");
    assert_non_null(ti);
    assert_int_equal(ti->dtype, KILN_DTYPE_Q8_0);
    assert_int_equal(ti->shape[0], 256);
    assert_int_equal(ti->shape[1], 300);
    assert_int_equal(ti->nbytes, sizes[1]);
    assert_memory_equal(ti->data, buf + data + offs[1], sizes[1]);
    ti = kiln_gguf_find_tensor(g, "c.weight");
    assert_non_null(ti);
    assert_int_equal(ti->rank, 3);
    assert_int_equal(ti->shape[2], 2);
    /* copying every key through kiln_gguf_writer_set_value gives identical bytes */
    kiln_gguf_writer *w2;
    assert_int_equal(kiln_gguf_writer_create(0, &w2, &e), KILN_OK);
    for (size_t i = 0; i < kiln_meta_count(m); i++) {
        const kiln_meta_entry *en = kiln_meta_at(m, i);
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)en->key.len, en->key.ptr);
        assert_int_equal(kiln_gguf_writer_set_value(w2, key, &en->value, &e), KILN_OK);
    }
    for (size_t i = 0; i < kiln_gguf_tensor_count(g); i++) {
        const kiln_tensor_info *t = kiln_gguf_tensor(g, i);
        assert_int_equal(
            kiln_gguf_writer_add_tensor(w2, t->name, t->dtype, t->rank, t->shape, t->data, &e),
            KILN_OK);
    }
    char path2[300];
    snprintf(path2, sizeof path2, "%s.copy", path);
    assert_int_equal(kiln_gguf_writer_write(w2, path2, NULL, false, NULL, &e), KILN_OK);
    kiln_gguf_writer_free(w2);
    size_t len2;
    uint8_t *buf2 = slurp(path2, &len2);
    assert_int_equal(len2, len);
    assert_memory_equal(buf2, buf, len);
    free(buf2);
    unlink(path2);
    kiln_gguf_close(g);
    free(want);
    free(buf);
    unlink(path);
    kiln_gguf_writer_free(w);
}

static void test_failing_fill_leaves_no_file(void **state) {
    (void)state;
    kiln_err e;
    kiln_gguf_writer *w;
    assert_int_equal(kiln_gguf_writer_create(64, &w, &e), KILN_OK);
    const int64_t s[2] = {32, 1000};
    assert_int_equal(
        kiln_gguf_writer_add_tensor_fill(w, "x", KILN_DTYPE_F32, 2, s, fill_fail, NULL, &e),
        KILN_OK);
    char path[256];
    snprintf(path, sizeof path, "/tmp/kiln-test-writer-fail-%d.gguf", (int)getpid());
    assert_int_equal(kiln_gguf_writer_write(w, path, NULL, false, NULL, &e), KILN_ERR_IO);
    assert_non_null(strstr(e.msg, "synthetic failure"));
    assert_non_null(strstr(e.msg, "tensor 'x'"));
    assert_int_not_equal(access(path, F_OK), 0);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_not_equal(access(tmp, F_OK), 0);
    /* unwritable directory */
    assert_int_equal(kiln_gguf_writer_write(w, "/nonexistent-dir/x.gguf", NULL, false, NULL, &e),
                     KILN_ERR_NOT_FOUND);
    kiln_gguf_writer_free(w);
    assert_int_equal(kiln_gguf_writer_create(24, &w, &e), KILN_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_and_parse),
        cmocka_unit_test(test_failing_fill_leaves_no_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
