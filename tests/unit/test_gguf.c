/* test_gguf.c — the GGUF reader: every metadata type, typed accessors, tensor table, and
 * one test per validation error (each checks the status and that the message names the
 * key or tensor). Real files: the vocab GGUFs in ../shared/testdata/tokenizer and the
 * Gemma 3 270M model (skipped when absent). */
#include "format/dtype.h"
#include "format/gguf.h"
#include "test_gguf_builder.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A valid file with every value type, nested arrays and three tensors. */
static void build_full(gb_buf *b, uint32_t version) {
    gb_header(b, version, 3, 17);
    gb_kv_str(b, "general.architecture", "llama");
    gb_kv_u32(b, "llama.attention.head_count", 8);
    gb_kv_f32(b, "llama.rope.freq_base", 10000.0f);
    gb_str(b, "t.u8"), gb_u32(b, GT_U8), gb_u8(b, 200);
    gb_str(b, "t.i8"), gb_u32(b, GT_I8), gb_u8(b, (uint8_t)-5);
    gb_str(b, "t.u16"), gb_u32(b, GT_U16), gb_put(b, &(uint16_t){60000}, 2);
    gb_str(b, "t.i16"), gb_u32(b, GT_I16), gb_put(b, &(int16_t){-300}, 2);
    gb_str(b, "t.i32"), gb_u32(b, GT_I32), gb_put(b, &(int32_t){-70000}, 4);
    gb_str(b, "t.bool"), gb_u32(b, GT_BOOL), gb_u8(b, 1);
    gb_str(b, "t.u64"), gb_u32(b, GT_U64), gb_u64(b, 1ull << 40);
    gb_str(b, "t.i64"), gb_u32(b, GT_I64), gb_put(b, &(int64_t){-(1ll << 40)}, 8);
    gb_str(b, "t.f64"), gb_u32(b, GT_F64), gb_put(b, &(double){0.1}, 8);
    /* arrays: f32, strings, nested arrays of i32, empty, bool */
    gb_str(b, "tokenizer.ggml.scores"), gb_u32(b, GT_ARR), gb_u32(b, GT_F32), gb_u64(b, 3);
    gb_f32(b, 0.5f), gb_f32(b, -1.0f), gb_f32(b, 2.25f);
    gb_str(b, "tokenizer.ggml.tokens"), gb_u32(b, GT_ARR), gb_u32(b, GT_STR), gb_u64(b, 3);
    gb_str(b, "<s>"), gb_str(b, "hello"), gb_strn(b, "a\0b", 3);
    gb_str(b, "t.nested"), gb_u32(b, GT_ARR), gb_u32(b, GT_ARR), gb_u64(b, 2);
    gb_u32(b, GT_I32), gb_u64(b, 2), gb_put(b, &(int32_t){7}, 4), gb_put(b, &(int32_t){-8}, 4);
    gb_u32(b, GT_STR), gb_u64(b, 1), gb_str(b, "x");
    gb_str(b, "t.empty"), gb_u32(b, GT_ARR), gb_u32(b, GT_U32), gb_u64(b, 0);
    gb_str(b, "t.bools"), gb_u32(b, GT_ARR), gb_u32(b, GT_BOOL), gb_u64(b, 2);
    gb_u8(b, 0), gb_u8(b, 1);
    float emb[4 * 3];
    for (int i = 0; i < 12; i++) emb[i] = (float)i * 0.5f;
    uint8_t q8[2 * 34];
    for (int i = 0; i < 68; i++) q8[i] = (uint8_t)(i * 3);
    gb_tensor ts[3] = {
        {"token_embd.weight", KILN_DTYPE_F32, 2, {4, 3}, emb, sizeof emb},
        {"blk.0.attn_q.weight", KILN_DTYPE_Q8_0, 2, {32, 2}, q8, sizeof q8},
        {"output_norm.weight", KILN_DTYPE_F16, 1, {5}, NULL, 10},
    };
    gb_tensors(b, ts, 3, 32);
}

static kiln_gguf *open_buf(const gb_buf *b, kiln_err *e) {
    kiln_gguf *g = NULL;
    kiln_status st = kiln_gguf_open_buffer(b->p, b->n, "test.gguf", 0, &g, e);
    if (st) return NULL;
    return g;
}

static void test_full_file(void **state) {
    (void)state;
    for (uint32_t version = 2; version <= 3; version++) {
        gb_buf b = {0};
        build_full(&b, version);
        kiln_err e;
        kiln_gguf *g = open_buf(&b, &e);
        if (!g) fail_msg("open failed: %s", e.msg);
        assert_int_equal(kiln_gguf_version(g), version);
        assert_int_equal(kiln_gguf_alignment(g), 32);
        assert_int_equal(kiln_gguf_data_offset(g) % 32, 0);
        const kiln_meta *m = kiln_gguf_meta(g);
        assert_int_equal(kiln_meta_count(m), 17);
        assert_true(kiln_str_eq(kiln_meta_at(m, 0)->key, "general.architecture"));

        kiln_str s;
        assert_int_equal(kiln_meta_get_str(m, "general.architecture", &s, &e), KILN_OK);
        assert_true(kiln_str_eq(s, "llama"));
        char *dup = NULL;
        assert_int_equal(kiln_meta_dup_str(m, "general.architecture", &dup, &e), KILN_OK);
        assert_string_equal(dup, "llama");
        free(dup);

        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
        float f32;
        double f64;
        bool bl;
        assert_int_equal(kiln_meta_get_u32(m, "llama.attention.head_count", &u32, &e), KILN_OK);
        assert_int_equal(u32, 8);
        /* widening: u8 -> u32, i8 -> i32, u16 -> i64, u32 -> f32, i64 fits i64 */
        assert_int_equal(kiln_meta_get_u32(m, "t.u8", &u32, &e), KILN_OK);
        assert_int_equal(u32, 200);
        assert_int_equal(kiln_meta_get_i32(m, "t.i8", &i32, &e), KILN_OK);
        assert_int_equal(i32, -5);
        assert_int_equal(kiln_meta_get_i64(m, "t.u16", &i64, &e), KILN_OK);
        assert_int_equal(i64, 60000);
        assert_int_equal(kiln_meta_get_i32(m, "t.i16", &i32, &e), KILN_OK);
        assert_int_equal(i32, -300);
        assert_int_equal(kiln_meta_get_f32(m, "llama.attention.head_count", &f32, &e), KILN_OK);
        assert_true(f32 == 8.0f);
        assert_int_equal(kiln_meta_get_i64(m, "t.i64", &i64, &e), KILN_OK);
        assert_true(i64 == -(1ll << 40));
        assert_int_equal(kiln_meta_get_u64(m, "t.u64", &u64, &e), KILN_OK);
        assert_true(u64 == 1ull << 40);
        assert_int_equal(kiln_meta_get_f64(m, "t.f64", &f64, &e), KILN_OK);
        assert_true(f64 == 0.1);
        assert_int_equal(kiln_meta_get_f64(m, "llama.rope.freq_base", &f64, &e), KILN_OK);
        assert_true(f64 == 10000.0);
        assert_int_equal(kiln_meta_get_f32(m, "t.f64", &f32, &e), KILN_OK);
        assert_true(f32 == 0.1f);
        assert_int_equal(kiln_meta_get_bool(m, "t.bool", &bl, &e), KILN_OK);
        assert_true(bl);
        /* lossy or wrong type conversions fail with TYPE and name the key */
        assert_int_equal(kiln_meta_get_u32(m, "t.i8", &u32, &e), KILN_ERR_TYPE);
        assert_non_null(strstr(e.msg, "t.i8"));
        assert_int_equal(kiln_meta_get_u32(m, "t.u64", &u32, &e), KILN_ERR_TYPE);
        assert_int_equal(kiln_meta_get_i32(m, "t.i64", &i32, &e), KILN_ERR_TYPE);
        assert_int_equal(kiln_meta_get_u32(m, "llama.rope.freq_base", &u32, &e), KILN_ERR_TYPE);
        assert_int_equal(kiln_meta_get_f32(m, "t.u64", &f32, &e), KILN_ERR_TYPE);
        assert_int_equal(kiln_meta_get_bool(m, "t.u8", &bl, &e), KILN_ERR_TYPE);
        assert_int_equal(kiln_meta_get_str(m, "t.u8", &s, &e), KILN_ERR_TYPE);
        assert_non_null(strstr(e.msg, "expected a string, found u8 200"));
        assert_int_equal(kiln_meta_get_u32(m, "general.architecture", &u32, &e), KILN_ERR_TYPE);
        /* missing: required fails, optional gives the default, wrong type still fails */
        assert_int_equal(kiln_meta_get_u32(m, "nope", &u32, &e), KILN_ERR_NOT_FOUND);
        assert_non_null(strstr(e.msg, "'nope'"));
        assert_int_equal(kiln_meta_opt_u32(m, "nope", 77, &u32, &e), KILN_OK);
        assert_int_equal(u32, 77);
        assert_int_equal(kiln_meta_opt_f32(m, "nope", 1e-6f, &f32, &e), KILN_OK);
        assert_true(f32 == 1e-6f);
        assert_int_equal(kiln_meta_opt_bool(m, "nope", true, &bl, &e), KILN_OK);
        assert_true(bl);
        assert_int_equal(kiln_meta_opt_str(m, "nope", "dflt", &s, &e), KILN_OK);
        assert_true(kiln_str_eq(s, "dflt"));
        assert_int_equal(kiln_meta_opt_u32(m, "general.architecture", 1, &u32, &e), KILN_ERR_TYPE);

        /* arrays */
        const kiln_meta_value *a;
        assert_int_equal(kiln_meta_get_arr(m, "tokenizer.ggml.scores", KILN_META_F32, &a, &e),
                         KILN_OK);
        assert_int_equal(a->count, 3);
        float sc[3];
        assert_int_equal(kiln_meta_arr_copy_f32(a, sc, 3, "scores", &e), KILN_OK);
        assert_true(sc[0] == 0.5f && sc[1] == -1.0f && sc[2] == 2.25f);
        assert_true(kiln_meta_arr_f32(a, 2, &f32) && f32 == 2.25f);
        assert_false(kiln_meta_arr_f32(a, 3, &f32));
        assert_int_equal(kiln_meta_get_arr(m, "tokenizer.ggml.scores", KILN_META_STRING, &a, &e),
                         KILN_ERR_TYPE);
        assert_int_equal(kiln_meta_get_arr(m, "tokenizer.ggml.tokens", KILN_META_STRING, &a, &e),
                         KILN_OK);
        assert_true(kiln_meta_arr_str(a, 1, &s) && kiln_str_eq(s, "hello"));
        assert_true(kiln_meta_arr_str(a, 2, &s) && s.len == 3 && memcmp(s.ptr, "a\0b", 3) == 0);
        assert_false(kiln_meta_arr_str(a, 3, &s));
        assert_int_equal(kiln_meta_get_arr(m, "t.nested", -1, &a, &e), KILN_OK);
        assert_int_equal(a->elem_type, KILN_META_ARRAY);
        const kiln_meta_value *in = kiln_meta_arr_item(a, 0);
        assert_non_null(in);
        assert_true(kiln_meta_arr_i64(in, 1, &i64) && i64 == -8);
        int32_t iv[2];
        assert_int_equal(kiln_meta_arr_copy_i32(in, iv, 2, "nested", &e), KILN_OK);
        assert_true(iv[0] == 7 && iv[1] == -8);
        assert_true(kiln_meta_arr_str(kiln_meta_arr_item(a, 1), 0, &s) && kiln_str_eq(s, "x"));
        assert_null(kiln_meta_arr_item(a, 2));
        assert_int_equal(kiln_meta_get_arr(m, "t.empty", KILN_META_U32, &a, &e), KILN_OK);
        assert_int_equal(a->count, 0);
        assert_int_equal(kiln_meta_get_arr(m, "t.bools", KILN_META_BOOL, &a, &e), KILN_OK);
        assert_true(kiln_meta_arr_bool(a, 1, &bl) && bl);
        assert_true(kiln_meta_arr_bool(a, 0, &bl) && !bl);
        char fmt[64];
        kiln_meta_value_fmt(kiln_meta_find(m, "tokenizer.ggml.tokens"), fmt, sizeof fmt, 10);
        assert_string_equal(fmt, "[array of 3 string]");

        /* tensors */
        assert_int_equal(kiln_gguf_tensor_count(g), 3);
        const kiln_tensor_info *t = kiln_gguf_find_tensor(g, "blk.0.attn_q.weight");
        assert_non_null(t);
        assert_int_equal(t->dtype, KILN_DTYPE_Q8_0);
        assert_int_equal(t->rank, 2);
        assert_true(t->shape[0] == 32 && t->shape[1] == 2 && t->shape[2] == 1 && t->shape[3] == 1);
        assert_int_equal(t->nbytes, 68);
        assert_true(t->supported);
        assert_int_equal(t->offset % 32, 0);
        assert_ptr_equal(t->data, (const uint8_t *)b.p + t->offset);
        assert_int_equal(((const uint8_t *)t->data)[5], 15);
        const kiln_tensor_info *t0 = kiln_gguf_tensor(g, 0);
        assert_string_equal(t0->name, "token_embd.weight");
        assert_true(((const float *)t0->data)[11] == 5.5f);
        assert_int_equal(t0->offset, kiln_gguf_data_offset(g));
        assert_null(kiln_gguf_find_tensor(g, "missing"));
        assert_null(kiln_gguf_tensor(g, 3));
        assert_int_equal(kiln_gguf_unsupported_count(g), 0);
        kiln_gguf_close(g);
        gb_free(&b);
    }
    kiln_gguf_close(NULL);
}

/* The same image through a real file (mmap path). */
static void test_open_path(void **state) {
    (void)state;
    gb_buf b = {0};
    build_full(&b, 3);
    const char *p = kt_write_temp(b.p, b.n, ".gguf");
    assert_non_null(p);
    kiln_gguf *g = NULL;
    kiln_err e;
    assert_int_equal(kiln_gguf_open(p, 0, &g, &e), KILN_OK);
    assert_int_equal(kiln_gguf_file_size(g), b.n);
    assert_true(kiln_gguf_fd(g) >= 0);
    const kiln_tensor_info *t = kiln_gguf_find_tensor(g, "token_embd.weight");
    assert_memory_equal(t->data, b.p + t->offset, t->nbytes);
    kiln_gguf_close(g);
    remove(p);
    assert_int_equal(kiln_gguf_open("/nonexistent/x.gguf", 0, &g, &e), KILN_ERR_NOT_FOUND);
    assert_non_null(strstr(e.msg, "/nonexistent/x.gguf"));
    assert_null(g);
    gb_free(&b);
}

/* Expects open to fail with code and a message containing each of the needles. */
static void expect_fail(const gb_buf *b, uint32_t flags, kiln_status code, const char *n1,
                        const char *n2) {
    kiln_gguf *g = NULL;
    kiln_err e;
    kiln_status st = kiln_gguf_open_buffer(b->p, b->n, "bad.gguf", flags, &g, &e);
    if (st == KILN_OK) fail_msg("expected failure (%s, %s), opened fine", n1, n2 ? n2 : "");
    assert_null(g);
    if (st != code)
        fail_msg("expected %s, got %s: %s", kiln_status_name(code), kiln_status_name(st), e.msg);
    if (!strstr(e.msg, "bad.gguf")) fail_msg("message lacks the file name: %s", e.msg);
    if (n1 && !strstr(e.msg, n1)) fail_msg("message lacks '%s': %s", n1, e.msg);
    if (n2 && !strstr(e.msg, n2)) fail_msg("message lacks '%s': %s", n2, e.msg);
}

static void one_tensor(gb_buf *b, const char *name, uint32_t n_dims, const uint64_t *dims,
                       uint32_t type, uint64_t offset, size_t data_bytes) {
    gb_header(b, 3, 1, 0);
    gb_tensor_info(b, name, n_dims, dims, type, offset);
    gb_pad(b, 32);
    for (size_t i = 0; i < data_bytes; i++) gb_u8(b, (uint8_t)i);
}

static void test_bad_magic_version(void **state) {
    (void)state;
    gb_buf b = {0};
    build_full(&b, 3);
    b.p[0] = 'X';
    expect_fail(&b, 0, KILN_ERR_FORMAT, "bad magic", NULL);
    b.p[0] = 'G';
    uint32_t v = 1;
    memcpy(b.p + 4, &v, 4);
    expect_fail(&b, 0, KILN_ERR_UNSUPPORTED, "version 1", NULL);
    v = 4;
    memcpy(b.p + 4, &v, 4);
    expect_fail(&b, 0, KILN_ERR_UNSUPPORTED, "version 4", NULL);
    v = 3u << 24; /* a big-endian v3 file read little-endian */
    memcpy(b.p + 4, &v, 4);
    expect_fail(&b, 0, KILN_ERR_UNSUPPORTED, "big-endian", NULL);
    gb_free(&b);
    gb_buf e = {0};
    expect_fail(&e, 0, KILN_ERR_FORMAT, "truncated", NULL);
}

/* Every proper prefix of a valid file fails cleanly (no crash, no out-of-bounds read:
 * the prefix is copied into an exact-size allocation so ASan would catch an overread). */
static void test_truncated(void **state) {
    (void)state;
    gb_buf b = {0};
    build_full(&b, 3);
    kiln_gguf *g;
    kiln_err e;
    /* the last tensor is followed by padding, which may be cut without harm */
    size_t last_end = 0;
    assert_int_equal(kiln_gguf_open_buffer(b.p, b.n, "full", 0, &g, &e), KILN_OK);
    for (size_t i = 0; i < kiln_gguf_tensor_count(g); i++) {
        const kiln_tensor_info *t = kiln_gguf_tensor(g, i);
        if (t->offset + t->nbytes > last_end) last_end = t->offset + t->nbytes;
    }
    kiln_gguf_close(g);
    for (size_t n = 0; n < last_end; n++) {
        uint8_t *cut = malloc(n ? n : 1);
        assert_non_null(cut);
        memcpy(cut, b.p, n);
        kiln_status st = kiln_gguf_open_buffer(cut, n, "cut.gguf", 0, &g, &e);
        if (st == KILN_OK) fail_msg("prefix of %zu/%zu bytes opened", n, b.n);
        assert_int_equal(st, KILN_ERR_FORMAT);
        assert_true(strstr(e.msg, "truncated") || strstr(e.msg, "absurd") ||
                    strstr(e.msg, "outside the data section"));
        free(cut);
    }
    gb_free(&b);
}

static void test_absurd_counts(void **state) {
    (void)state;
    gb_buf b = {0};
    gb_header(&b, 3, 0, 1ull << 60);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "absurd metadata count", NULL);
    gb_free(&b);
    gb_header(&b, 3, UINT64_MAX, 0);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "absurd tensor count", NULL);
    gb_free(&b);
    /* string length beyond the file */
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "general.name");
    gb_u32(&b, GT_STR);
    gb_u64(&b, 1ull << 62);
    gb_put(&b, "abc", 3);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "absurd string value length", "general.name");
    gb_free(&b);
    /* key length beyond the file */
    gb_header(&b, 3, 0, 1);
    gb_u64(&b, UINT64_MAX);
    gb_put(&b, "abcdefghijklmnop", 16);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "absurd key length", NULL);
    gb_free(&b);
    /* array count whose byte size would overflow */
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "tokenizer.ggml.scores");
    gb_u32(&b, GT_ARR);
    gb_u32(&b, GT_F64);
    gb_u64(&b, UINT64_MAX / 4);
    gb_u64(&b, 0);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "absurd array length", "tokenizer.ggml.scores");
    gb_free(&b);
    /* string array count beyond the file */
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "tokenizer.ggml.tokens");
    gb_u32(&b, GT_ARR);
    gb_u32(&b, GT_STR);
    gb_u64(&b, 1000000);
    gb_str(&b, "a");
    expect_fail(&b, 0, KILN_ERR_FORMAT, "absurd array length", "tokenizer.ggml.tokens");
    gb_free(&b);
}

static void test_bad_values(void **state) {
    (void)state;
    gb_buf b = {0};
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "x.type");
    gb_u32(&b, 13);
    gb_u32(&b, 0);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "unknown value type 13", "x.type");
    gb_free(&b);
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "x.bool");
    gb_u32(&b, GT_BOOL);
    gb_u8(&b, 2);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "bool byte 2", "x.bool");
    gb_free(&b);
    /* arrays nested too deep */
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "x.deep");
    gb_u32(&b, GT_ARR);
    for (int i = 0; i < 12; i++) gb_u32(&b, GT_ARR), gb_u64(&b, 1);
    gb_u32(&b, GT_U32), gb_u64(&b, 0);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "nested deeper", "x.deep");
    gb_free(&b);
    /* general.alignment must be a u32 power of two */
    gb_header(&b, 3, 0, 1);
    gb_kv_u32(&b, "general.alignment", 48);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "general.alignment", "power of two");
    gb_free(&b);
    gb_header(&b, 3, 0, 1);
    gb_kv_f32(&b, "general.alignment", 32.0f);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "general.alignment", "expected u32");
    gb_free(&b);
}

static void test_duplicate_key(void **state) {
    (void)state;
    gb_buf b = {0};
    gb_header(&b, 3, 0, 2);
    gb_kv_u32(&b, "llama.block_count", 2);
    gb_kv_u32(&b, "llama.block_count", 3);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "duplicate key 'llama.block_count'", NULL);
    gb_free(&b);
}

static void test_invalid_utf8(void **state) {
    (void)state;
    gb_buf b = {0};
    gb_header(&b, 3, 0, 1);
    gb_strn(&b, "general.n\xffme", 12);
    gb_u32(&b, GT_U32);
    gb_u32(&b, 1);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "not valid UTF-8", "general.n");
    gb_free(&b);
    /* an overlong encoding is invalid too */
    gb_header(&b, 3, 0, 1);
    gb_strn(&b, "a\xc0\xaf", 3);
    gb_u32(&b, GT_U32);
    gb_u32(&b, 1);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "not valid UTF-8", NULL);
    gb_free(&b);
    /* tensor names too */
    uint64_t d[1] = {8};
    gb_header(&b, 3, 1, 0);
    gb_tensor_info(&b, "blk.\xe2\x28.w", 1, d, KILN_DTYPE_F32, 0);
    gb_pad(&b, 32);
    for (int i = 0; i < 32; i++) gb_u8(&b, 0);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "tensor name is not valid UTF-8", NULL);
    gb_free(&b);
    /* a NUL inside a tensor name (C strings would cut it) */
    gb_header(&b, 3, 1, 0);
    gb_strn(&b, "a\0b", 3);
    gb_u32(&b, 1), gb_u64(&b, 8), gb_u32(&b, KILN_DTYPE_F32), gb_u64(&b, 0);
    gb_pad(&b, 32);
    for (int i = 0; i < 32; i++) gb_u8(&b, 0);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "tensor name contains a NUL byte", NULL);
    gb_free(&b);
    /* empty key */
    gb_header(&b, 3, 0, 1);
    gb_kv_u32(&b, "", 1);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "empty key", NULL);
    gb_free(&b);
}

static void test_tensor_errors(void **state) {
    (void)state;
    gb_buf b = {0};
    uint64_t d2[2] = {32, 4};
    /* unknown type id */
    one_tensor(&b, "w.unknown", 2, d2, 5, 0, 512);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "unknown tensor type id 5", "w.unknown");
    gb_free(&b);
    one_tensor(&b, "w.unknown", 2, d2, 1000, 0, 512);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "unknown tensor type id 1000", "w.unknown");
    gb_free(&b);
    /* too many dims */
    uint64_t d5[5] = {1, 1, 1, 1, 1};
    one_tensor(&b, "w.rank5", 5, d5, KILN_DTYPE_F32, 0, 32);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "5 dimensions", "w.rank5");
    gb_free(&b);
    /* negative dimension */
    uint64_t dn[2] = {32, (uint64_t)-4};
    one_tensor(&b, "w.neg", 2, dn, KILN_DTYPE_F32, 0, 32);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "negative", "w.neg");
    gb_free(&b);
    /* element count overflow */
    uint64_t dov[4] = {1ull << 32, 1ull << 32, 1, 1};
    one_tensor(&b, "w.huge", 4, dov, KILN_DTYPE_F32, 0, 32);
    expect_fail(&b, 0, KILN_ERR_OVERFLOW, "overflow", "w.huge");
    gb_free(&b);
    /* shape x dtype: a q4_K row of 100 elements is not a whole number of blocks */
    uint64_t dq[2] = {100, 2};
    one_tensor(&b, "w.rows", 2, dq, KILN_DTYPE_Q4_K, 0, 512);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "block size", "w.rows");
    gb_free(&b);
    /* shape x dtype larger than the data: outside the data section (truncated data) */
    one_tensor(&b, "w.big", 2, d2, KILN_DTYPE_F32, 0, 511);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "outside the data section", "w.big");
    gb_free(&b);
    /* offset past the end */
    one_tensor(&b, "w.far", 2, d2, KILN_DTYPE_F32, 1ull << 40, 512);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "outside the data section", "w.far");
    gb_free(&b);
    /* offset + size overflow */
    one_tensor(&b, "w.wrap", 2, d2, KILN_DTYPE_F32, UINT64_MAX - 31, 512);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "outside the data section", "w.wrap");
    gb_free(&b);
    /* misaligned offset */
    one_tensor(&b, "w.mis", 1, d2, KILN_DTYPE_F32, 4, 512);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "not a multiple of the alignment 32", "w.mis");
    gb_free(&b);
    /* empty name */
    one_tensor(&b, "", 1, d2, KILN_DTYPE_F32, 0, 512);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "empty tensor name", NULL);
    gb_free(&b);
}

static void test_overlap_and_duplicates(void **state) {
    (void)state;
    gb_buf b = {0};
    uint64_t d[1] = {64}; /* 256 bytes of f32 */
    gb_header(&b, 3, 2, 0);
    gb_tensor_info(&b, "a.weight", 1, d, KILN_DTYPE_F32, 0);
    gb_tensor_info(&b, "b.weight", 1, d, KILN_DTYPE_F32, 224);
    gb_pad(&b, 32);
    for (int i = 0; i < 512; i++) gb_u8(&b, 0);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "overlaps", "a.weight");
    gb_free(&b);
    gb_header(&b, 3, 2, 0);
    gb_tensor_info(&b, "same.weight", 1, d, KILN_DTYPE_F32, 0);
    gb_tensor_info(&b, "same.weight", 1, d, KILN_DTYPE_F32, 256);
    gb_pad(&b, 32);
    for (int i = 0; i < 512; i++) gb_u8(&b, 0);
    expect_fail(&b, 0, KILN_ERR_FORMAT, "duplicate tensor name 'same.weight'", NULL);
    gb_free(&b);
    /* adjacent (touching) tensors and a custom alignment are fine */
    gb_header(&b, 3, 2, 1);
    gb_kv_u32(&b, "general.alignment", 64);
    gb_tensor_info(&b, "a.weight", 1, d, KILN_DTYPE_F32, 0);
    gb_tensor_info(&b, "b.weight", 1, d, KILN_DTYPE_F32, 256);
    gb_pad(&b, 64);
    for (int i = 0; i < 512; i++) gb_u8(&b, 0);
    kiln_gguf *g;
    kiln_err e;
    assert_int_equal(kiln_gguf_open_buffer(b.p, b.n, "ok", 0, &g, &e), KILN_OK);
    assert_int_equal(kiln_gguf_alignment(g), 64);
    assert_int_equal(kiln_gguf_data_offset(g) % 64, 0);
    kiln_gguf_close(g);
    gb_free(&b);
}

static void test_unsupported_dtype(void **state) {
    (void)state;
    gb_buf b = {0};
    uint64_t d[2] = {256, 2};
    one_tensor(&b, "w.iq2", 2, d, KILN_DTYPE_IQ2_XXS, 0, 132);
    kiln_gguf *g;
    kiln_err e;
    assert_int_equal(kiln_gguf_open_buffer(b.p, b.n, "iq.gguf", 0, &g, &e), KILN_OK);
    const kiln_tensor_info *t = kiln_gguf_find_tensor(g, "w.iq2");
    assert_false(t->supported);
    assert_int_equal(t->nbytes, 132);
    assert_int_equal(kiln_gguf_unsupported_count(g), 1);
    kiln_gguf_close(g);
    expect_fail(&b, KILN_FILE_REQUIRE_SUPPORTED, KILN_ERR_UNSUPPORTED, "iq2_xxs", "w.iq2");
    gb_free(&b);
}

/* Real GGUF files written by llama.cpp's gguf-py. */
static void test_vocab_files(void **state) {
    (void)state;
    static const char *names[] = {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf",
                                  "ggml-vocab-qwen2.gguf"};
    int opened = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/testdata/tokenizer/%s", kt_shared_dir(), names[i]);
        struct stat sb;
        if (stat(path, &sb) != 0) continue;
        kiln_gguf *g;
        kiln_err e;
        if (kiln_gguf_open(path, 0, &g, &e)) fail_msg("%s", e.msg);
        const kiln_meta *m = kiln_gguf_meta(g);
        const kiln_meta_value *tok;
        assert_int_equal(kiln_meta_get_arr(m, "tokenizer.ggml.tokens", KILN_META_STRING, &tok, &e),
                         KILN_OK);
        assert_true(tok->count > 1000);
        kiln_str model;
        assert_int_equal(kiln_meta_get_str(m, "tokenizer.ggml.model", &model, &e), KILN_OK);
        assert_true(model.len > 0);
        kiln_gguf_close(g);
        opened++;
    }
    if (!opened) skip(); /* ../shared/testdata/tokenizer absent */
}

/* A file written by gguf-py (tests/fuzz/make_seeds.py): every value type, nested arrays,
 * f32/f16/q8_0/q4_K tensors, as an independent writer lays them out. */
static void test_gguf_py_file(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fuzz/corpus/fuzz_gguf/rich_v3.gguf", kt_source_dir());
    kiln_gguf *g;
    kiln_err e;
    if (kiln_gguf_open(path, 0, &g, &e)) fail_msg("%s", e.msg);
    const kiln_meta *m = kiln_gguf_meta(g);
    int32_t i32;
    int64_t i64;
    double f64;
    assert_int_equal(kiln_meta_get_i32(m, "t.i32", &i32, &e), KILN_OK);
    assert_int_equal(i32, -70000);
    assert_int_equal(kiln_meta_get_i64(m, "t.i64", &i64, &e), KILN_OK);
    assert_true(i64 == -(1ll << 40));
    assert_int_equal(kiln_meta_get_f64(m, "t.f64", &f64, &e), KILN_OK);
    assert_true(f64 == 0.1);
    const kiln_meta_value *a;
    assert_int_equal(kiln_meta_get_arr(m, "t.nested", KILN_META_ARRAY, &a, &e), KILN_OK);
    assert_int_equal(a->count, 2);
    assert_true(kiln_meta_arr_i64(kiln_meta_arr_item(a, 1), 0, &i64) && i64 == 3);
    assert_int_equal(kiln_meta_get_arr(m, "tokenizer.ggml.tokens", KILN_META_STRING, &a, &e),
                     KILN_OK);
    kiln_str s;
    assert_true(kiln_meta_arr_str(a, 3, &s) && kiln_str_eq(s, "\xc3\xa9"));
    const kiln_tensor_info *t = kiln_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(t);
    assert_true(t->dtype == KILN_DTYPE_F32 && t->shape[0] == 32 && t->shape[1] == 4);
    t = kiln_gguf_find_tensor(g, "blk.0.ffn_down.weight");
    assert_true(t->dtype == KILN_DTYPE_Q4_K && t->shape[0] == 256 && t->nbytes == 144);
    assert_int_equal(kiln_gguf_find_tensor(g, "blk.0.attn_q.weight")->dtype, KILN_DTYPE_Q8_0);
    kiln_gguf_close(g);
}

static void test_gemma_model(void **state) {
    (void)state;
    char path[1024];
    const char *home = getenv("HOME");
    snprintf(path, sizeof path, "%s/.cache/kiln/models/gemma-3-270m-q4_k_m.gguf", home ? home : "");
    struct stat sb;
    if (stat(path, &sb) != 0) {
        print_message("skipped: %s absent (scripts/fetch-model.sh gemma3-270m)\n", path);
        skip();
    }
    kiln_gguf *g;
    kiln_err e;
    if (kiln_gguf_open(path, 0, &g, &e)) fail_msg("%s", e.msg);
    const kiln_meta *m = kiln_gguf_meta(g);
    kiln_str arch;
    assert_int_equal(kiln_meta_get_str(m, "general.architecture", &arch, &e), KILN_OK);
    assert_true(kiln_str_eq(arch, "gemma3"));
    uint32_t n_layer;
    assert_int_equal(kiln_meta_get_u32(m, "gemma3.block_count", &n_layer, &e), KILN_OK);
    assert_int_equal(n_layer, 18);
    const kiln_tensor_info *t = kiln_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->shape[0], 640);
    uint64_t total = 0;
    for (size_t i = 0; i < kiln_gguf_tensor_count(g); i++) total += kiln_gguf_tensor(g, i)->nbytes;
    assert_true(total <= kiln_gguf_file_size(g) - kiln_gguf_data_offset(g));
    assert_true(total > kiln_gguf_file_size(g) / 2);
    kiln_gguf_close(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_file),         cmocka_unit_test(test_open_path),
        cmocka_unit_test(test_bad_magic_version), cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_absurd_counts),     cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_duplicate_key),     cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_tensor_errors),     cmocka_unit_test(test_overlap_and_duplicates),
        cmocka_unit_test(test_unsupported_dtype), cmocka_unit_test(test_vocab_files),
        cmocka_unit_test(test_gguf_py_file),      cmocka_unit_test(test_gemma_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
