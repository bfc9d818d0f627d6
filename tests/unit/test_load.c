/* test_load.c — the load plan: lane choice, planning errors, and byte-exactness of every
 * lane and reader against the residual lane (and against values computed here), for
 * whole tensors, row and column shards, layer ranges and every built-in layout. */
#include "format/dtype.h"
#include "format/model_file.h"
#include "load/layout.h"
#include "load/load.h"
#include "test_safetensors_builder.h"
#include "testutil.h"

#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char model_path[256];
static kiln_model_file *mf;

/* A GGUF with float and quantized tensors in two layers (random contents). */
static int setup(void **state) {
    (void)state;
    kt_rng rng;
    kt_rng_seed(&rng, 42);
    static float f32a[64 * 8];
    static uint16_t f16a[64 * 12], bf16a[96];
    static uint8_t q8[4 * 34 * 8], q4k[144 * 2 * 8], q8b[3 * 34 * 5];
    kt_fill_normal(&rng, f32a, 64 * 8, 1.0f);
    for (int i = 0; i < 64 * 12; i++) f16a[i] = kiln_f32_to_fp16(kt_rng_normal(&rng));
    for (int i = 0; i < 96; i++) bf16a[i] = kiln_f32_to_bf16(kt_rng_normal(&rng));
    for (size_t i = 0; i < sizeof q8; i++) q8[i] = (uint8_t)kt_rng_u64(&rng);
    for (size_t i = 0; i < sizeof q4k; i++) q4k[i] = (uint8_t)kt_rng_u64(&rng);
    for (size_t i = 0; i < sizeof q8b; i++) q8b[i] = (uint8_t)kt_rng_u64(&rng);
    /* keep quantized scales finite: q8_0 d is the first 2 bytes of each 34-byte block */
    for (size_t b = 0; b < sizeof q8 / 34; b++) memcpy(q8 + b * 34, &(uint16_t){0x3c00}, 2);
    for (size_t b = 0; b < sizeof q8b / 34; b++) memcpy(q8b + b * 34, &(uint16_t){0x2c00}, 2);
    for (size_t b = 0; b < sizeof q4k / 144; b++) {
        memcpy(q4k + b * 144, &(uint16_t){0x3000}, 2);
        memcpy(q4k + b * 144 + 2, &(uint16_t){0x2000}, 2);
    }
    gb_tensor ts[] = {
        {"token_embd.weight", KILN_DTYPE_F16, 2, {64, 12}, f16a, sizeof f16a},
        {"output_norm.weight", KILN_DTYPE_BF16, 1, {96}, bf16a, sizeof bf16a},
        {"blk.0.attn_q.weight", KILN_DTYPE_Q8_0, 2, {128, 8}, q8, sizeof q8},
        {"blk.0.ffn_down.weight", KILN_DTYPE_Q4_K, 2, {512, 8}, q4k, sizeof q4k},
        {"blk.1.attn_q.weight", KILN_DTYPE_F32, 2, {64, 8}, f32a, sizeof f32a},
        {"blk.1.attn_k.weight", KILN_DTYPE_Q8_0, 2, {96, 5}, q8b, sizeof q8b},
    };
    gb_buf b = {0};
    gb_header(&b, 3, sizeof ts / sizeof ts[0], 1);
    gb_kv_str(&b, "general.architecture", "llama");
    gb_tensors(&b, ts, sizeof ts / sizeof ts[0], 32);
    const char *p = kt_write_temp(b.p, b.n, ".gguf");
    gb_free(&b);
    if (!p) return -1;
    snprintf(model_path, sizeof model_path, "%s", p);
    kiln_err e;
    if (kiln_model_file_open(model_path, 0, &mf, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    kiln_model_file_close(mf);
    remove(model_path);
    return 0;
}

static kiln_load_plan *load(const kiln_load_request *req) {
    kiln_load_plan *p = NULL;
    kiln_err e;
    if (kiln_load_plan_build(mf, req, &p, &e)) fail_msg("plan: %s", e.msg);
    if (kiln_load_execute(p, &e)) fail_msg("execute: %s", e.msg);
    return p;
}

/* Every item of a equals the residual-lane result of the same request. */
static void check_against_residual(const kiln_load_request *req, kiln_load_plan *a) {
    kiln_load_request r = *req;
    r.force_lane = KILN_LANE_RESIDUAL;
    r.io = KILN_IO_PREAD;
    kiln_load_plan *ref = load(&r);
    assert_int_equal(kiln_load_plan_count(a), kiln_load_plan_count(ref));
    for (size_t i = 0; i < kiln_load_plan_count(a); i++) {
        const kiln_load_item *x = kiln_load_plan_item(a, i), *y = kiln_load_plan_item(ref, i);
        assert_string_equal(x->src->name, y->src->name);
        assert_int_equal(y->lane, KILN_LANE_RESIDUAL);
        assert_true(x->done && y->done);
        assert_int_equal(x->nbytes, y->nbytes);
        assert_int_equal(x->dtype, y->dtype);
        if (memcmp(x->data, y->data, x->nbytes) != 0)
            fail_msg("tensor %s: lane %s differs from residual", x->src->name,
                     kiln_lane_name(x->lane));
    }
    kiln_load_plan_free(ref);
}

static bool uring_ok(void) {
    struct io_uring ring;
    if (io_uring_queue_init(2, &ring, 0) != 0) return false;
    io_uring_queue_exit(&ring);
    return true;
}

static void test_native_alias(void **state) {
    (void)state;
    kiln_load_request req;
    kiln_load_request_init(&req);
    kiln_load_plan *p = load(&req);
    const kiln_load_report *r = kiln_load_plan_report(p);
    assert_int_equal(r->lane[KILN_LANE_ALIAS].tensors, 6);
    assert_int_equal(r->lane[KILN_LANE_RESIDUAL].tensors, 0);
    for (size_t i = 0; i < kiln_load_plan_count(p); i++) {
        const kiln_load_item *it = kiln_load_plan_item(p, i);
        assert_int_equal(it->lane, KILN_LANE_ALIAS);
        assert_ptr_equal(it->data, it->src->data); /* zero copy */
    }
    check_against_residual(&req, p);
    /* the report renders */
    char *j = kiln_load_report_json(p, true);
    assert_non_null(j);
    assert_non_null(strstr(j, "\"alias\""));
    free(j);
    kiln_load_plan_free(p);
}

static kiln_load_target norms_f32(void *user, const kiln_tensor_info *t) {
    (void)user;
    kiln_load_target tg = {KILN_PLACE_HOST, 0, NULL, false};
    if (t->dtype == KILN_DTYPE_F16 || t->dtype == KILN_DTYPE_BF16 || t->dtype == KILN_DTYPE_F32)
        tg.layout = "f32";
    else if (t->shape[1] % 4 == 0)
        tg.layout = "blocks_x4";
    else
        tg.writable = true; /* native bytes, owned copy */
    return tg;
}

static kiln_load_target to_f16(void *user, const kiln_tensor_info *t) {
    (void)user;
    kiln_load_target tg = {KILN_PLACE_HOST, 0, NULL, true};
    if (t->dtype == KILN_DTYPE_F32 || t->dtype == KILN_DTYPE_BF16) tg.layout = "f16";
    if (t->dtype == KILN_DTYPE_F16) tg.layout = "bf16";
    return tg;
}

/* Transforms on every reader, compared with the residual lane and with values computed
 * here. */
static void test_transforms(void **state) {
    (void)state;
    kiln_io ios[3] = {KILN_IO_MMAP, KILN_IO_PREAD, KILN_IO_URING};
    for (int k = 0; k < 3; k++) {
        if (ios[k] == KILN_IO_URING && !uring_ok()) continue;
        for (int v = 0; v < 2; v++) {
            kiln_load_request req;
            kiln_load_request_init(&req);
            req.io = ios[k];
            req.threads = 2;
            req.target_for = v == 0 ? norms_f32 : to_f16;
            kiln_load_plan *p = load(&req);
            assert_int_equal(kiln_load_plan_report(p)->lane[KILN_LANE_TRANSFORM].tensors,
                             v == 0 ? 6 : 6);
            check_against_residual(&req, p);
            const kiln_load_item *emb = kiln_load_plan_find(p, "token_embd.weight");
            const uint16_t *src = emb->src->data;
            if (v == 0) {
                assert_int_equal(emb->dtype, KILN_DTYPE_F32);
                const float *out = emb->data;
                for (int i = 0; i < 64 * 12; i++) assert_true(out[i] == kiln_fp16_to_f32(src[i]));
                /* blocks_x4 on the q8_0 weight: block b of row r at (b * 4 + r) */
                const kiln_load_item *q = kiln_load_plan_find(p, "blk.0.attn_q.weight");
                const uint8_t *qs = q->src->data, *qo = q->data;
                for (int g = 0; g < 8; g += 4)
                    for (int bl = 0; bl < 4; bl++)
                        for (int r = 0; r < 4; r++)
                            assert_memory_equal(qo + (size_t)g * 136 + (size_t)(bl * 4 + r) * 34,
                                                qs + (size_t)(g + r) * 136 + (size_t)bl * 34, 34);
            } else {
                assert_int_equal(emb->dtype, KILN_DTYPE_BF16);
                const uint16_t *out = emb->data;
                for (int i = 0; i < 64 * 12; i++)
                    assert_int_equal(out[i], kiln_f32_to_bf16(kiln_fp16_to_f32(src[i])));
                const kiln_load_item *w = kiln_load_plan_find(p, "blk.1.attn_q.weight");
                const float *fs = w->src->data;
                const uint16_t *fo = w->data;
                for (int i = 0; i < 64 * 8; i++) assert_int_equal(fo[i], kiln_f32_to_fp16(fs[i]));
                /* a writable native copy is owned memory with the file's bytes */
                const kiln_load_item *q = kiln_load_plan_find(p, "blk.0.attn_q.weight");
                assert_int_equal(q->lane, KILN_LANE_TRANSFORM);
                assert_ptr_not_equal(q->data, q->src->data);
                assert_memory_equal(q->data, q->src->data, q->nbytes);
            }
            kiln_load_plan_free(p);
        }
    }
}

/* Dequantization to f32 (q8_0, q4_K) through the transform lane on every reader equals
 * the reference kiln_dequantize_row and the residual lane. */
static void test_dequant(void **state) {
    (void)state;
    kiln_io ios[3] = {KILN_IO_MMAP, KILN_IO_PREAD, KILN_IO_URING};
    for (int k = 0; k < 3; k++) {
        if (ios[k] == KILN_IO_URING && !uring_ok()) continue;
        kiln_load_request req;
        kiln_load_request_init(&req);
        req.io = ios[k];
        req.target.layout = "f32";
        kiln_load_plan *p = load(&req);
        assert_int_equal(kiln_load_plan_report(p)->lane[KILN_LANE_TRANSFORM].tensors, 6);
        check_against_residual(&req, p);
        const char *names[] = {"blk.0.attn_q.weight", "blk.0.ffn_down.weight",
                               "blk.1.attn_k.weight"};
        for (int n = 0; n < 3; n++) {
            const kiln_load_item *it = kiln_load_plan_find(p, names[n]);
            assert_int_equal(it->dtype, KILN_DTYPE_F32);
            int64_t ne = it->shape[0] * it->shape[1];
            float *want = malloc((size_t)ne * 4);
            kiln_err e;
            assert_int_equal(kiln_dequantize_row(it->src->dtype, it->src->data, want, ne, &e),
                             KILN_OK);
            assert_memory_equal(it->data, want, (size_t)ne * 4);
            free(want);
        }
        kiln_load_plan_free(p);
    }
}

/* Row and column tensor-parallel shards: each shard is the right slice; all shards
 * together cover the tensor; every lane equals the residual lane. */
static void test_shards(void **state) {
    (void)state;
    for (int mode = KILN_SHARD_ROWS; mode <= KILN_SHARD_COLS; mode++) {
        for (int si = 0; si < 2; si++) {
            kiln_load_request req;
            kiln_load_request_init(&req);
            req.shard = (kiln_shard_mode)mode;
            req.shard_count = 2;
            req.shard_index = si;
            req.pattern = "blk.0.*";
            kiln_load_plan *p = load(&req);
            assert_int_equal(kiln_load_plan_count(p), 2);
            const kiln_load_item *q = kiln_load_plan_find(p, "blk.0.attn_q.weight");
            const uint8_t *src = q->src->data;
            if (mode == KILN_SHARD_ROWS) {
                assert_int_equal(q->lane, KILN_LANE_ALIAS); /* contiguous: still zero-copy */
                assert_true(q->shape[0] == 128 && q->shape[1] == 4);
                assert_memory_equal(q->data, src + (size_t)si * 4 * 136, 4 * 136);
            } else {
                assert_int_equal(q->lane, KILN_LANE_RESIDUAL);
                assert_non_null(strstr(q->why, "strided"));
                assert_true(q->shape[0] == 64 && q->shape[1] == 8);
                for (int r = 0; r < 8; r++)
                    assert_memory_equal((const uint8_t *)q->data + r * 68, src + r * 136 + si * 68,
                                        68);
            }
            check_against_residual(&req, p);
            kiln_load_plan_free(p);
            /* column shard with a layout goes through the transform lane */
            req.target.layout = "blocks_x4";
            p = load(&req);
            assert_int_equal(kiln_load_plan_find(p, "blk.0.ffn_down.weight")->lane,
                             KILN_LANE_TRANSFORM);
            check_against_residual(&req, p);
            kiln_load_plan_free(p);
        }
    }
}

static void test_selection(void **state) {
    (void)state;
    kiln_load_request req;
    kiln_load_request_init(&req);
    req.layer_begin = 1;
    req.layer_end = 2;
    kiln_load_plan *p = load(&req);
    assert_int_equal(kiln_load_plan_count(p), 4); /* 2 globals + layer 1 */
    assert_null(kiln_load_plan_find(p, "blk.0.attn_q.weight"));
    assert_non_null(kiln_load_plan_find(p, "blk.1.attn_k.weight"));
    kiln_load_plan_free(p);
    req.skip_globals = true;
    p = load(&req);
    assert_int_equal(kiln_load_plan_count(p), 2);
    kiln_load_plan_free(p);
    kiln_load_request_init(&req);
    req.pattern = "*attn_q*";
    p = load(&req);
    assert_int_equal(kiln_load_plan_count(p), 2);
    kiln_load_plan_free(p);
}

static void expect_plan_fail(const kiln_load_request *req, kiln_status code, const char *n1,
                             const char *n2) {
    kiln_load_plan *p = NULL;
    kiln_err e;
    kiln_status st = kiln_load_plan_build(mf, req, &p, &e);
    if (st == KILN_OK) fail_msg("planning succeeded, expected %s", n1);
    assert_null(p);
    if (st != code)
        fail_msg("expected %s, got %s: %s", kiln_status_name(code), kiln_status_name(st), e.msg);
    if (n1 && !strstr(e.msg, n1)) fail_msg("message lacks '%s': %s", n1, e.msg);
    if (n2 && !strstr(e.msg, n2)) fail_msg("message lacks '%s': %s", n2, e.msg);
}

static void test_plan_errors(void **state) {
    (void)state;
    kiln_load_request req;
    kiln_load_request_init(&req);
    req.target.layout = "nope";
    expect_plan_fail(&req, KILN_ERR_NOT_FOUND, "unknown target layout 'nope'", "token_embd.weight");
    req.target.layout = "f16";
    expect_plan_fail(&req, KILN_ERR_UNSUPPORTED, "blk.0.attn_q.weight", "f16");
    kiln_load_request_init(&req);
    req.pattern = "blk.1.attn_k.weight";
    req.target.layout = "blocks_x4"; /* 5 rows */
    expect_plan_fail(&req, KILN_ERR_UNSUPPORTED, "blk.1.attn_k.weight", "multiple of 4");
    kiln_load_request_init(&req);
    req.target.place = KILN_PLACE_CUDA;
#ifndef KILN_HAVE_CUDA
    expect_plan_fail(&req, KILN_ERR_UNSUPPORTED, "without CUDA", "token_embd.weight");
#endif
    kiln_load_request_init(&req);
    req.shard = KILN_SHARD_ROWS;
    req.shard_count = 3;
    req.pattern = "blk.0.*";
    expect_plan_fail(&req, KILN_ERR_UNSUPPORTED, "not divisible by 3", "blk.0.attn_q.weight");
    req.shard = KILN_SHARD_COLS;
    req.shard_count = 8; /* 128 / 8 = 16 is not a whole q8_0 block */
    expect_plan_fail(&req, KILN_ERR_UNSUPPORTED, "whole q8_0 blocks", "blk.0.attn_q.weight");
    kiln_load_request_init(&req);
    req.target.layout = "f32";
    req.pattern = "blk.1.attn_q.weight";
    req.force_lane = KILN_LANE_ALIAS;
    expect_plan_fail(&req, KILN_ERR_UNSUPPORTED, "lane alias cannot serve it", "layout f32");
    kiln_load_request_init(&req);
    req.target.writable = true;
    req.memory_budget = 1000;
    expect_plan_fail(&req, KILN_ERR_CAPACITY, "budget", NULL);
    kiln_load_request_init(&req);
    req.shard = KILN_SHARD_ROWS;
    req.shard_index = 2;
    req.shard_count = 2;
    expect_plan_fail(&req, KILN_ERR_INVALID_ARG, "shard 2 of 2", NULL);
}

/* A GGUF tensor of a type kiln cannot compute with opens, but the loader refuses it. */
static void test_unsupported_refused(void **state) {
    (void)state;
    gb_buf b = {0};
    gb_header(&b, 3, 1, 0);
    gb_tensor t = {"blk.0.ffn_up.weight", KILN_DTYPE_IQ2_XXS, 2, {256, 2}, NULL, 132};
    gb_tensors(&b, &t, 1, 32);
    const char *p = kt_write_temp(b.p, b.n, ".gguf");
    gb_free(&b);
    kiln_model_file *m;
    kiln_err e;
    assert_int_equal(kiln_model_file_open(p, 0, &m, &e), KILN_OK);
    kiln_load_request req;
    kiln_load_request_init(&req);
    kiln_load_plan *pl;
    assert_int_equal(kiln_load_plan_build(m, &req, &pl, &e), KILN_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "blk.0.ffn_up.weight"));
    assert_non_null(strstr(e.msg, "iq2_xxs"));
    kiln_model_file_close(m);
    remove(p);
}

/* Gemma norms from safetensors get +1 on load (transform lane), other tensors alias. */
static void test_fixup(void **state) {
    (void)state;
    const char *dir = sb_tmpdir();
    sb_write_str(dir, "config.json",
                 "{\"model_type\":\"gemma3_text\",\"hidden_size\":8,\"num_attention_heads\":1,"
                 "\"num_hidden_layers\":1}");
    uint16_t norm[8], emb[16];
    for (int i = 0; i < 8; i++) norm[i] = kiln_f32_to_bf16(0.25f * (float)i - 1.0f);
    for (int i = 0; i < 16; i++) emb[i] = kiln_f32_to_bf16((float)i);
    uint8_t data[48];
    memcpy(data, emb, 32);
    memcpy(data + 32, norm, 16);
    gb_buf b = {0};
    sb_image(&b,
             "{\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[2,8],\"data_offsets\":["
             "0,32]},"
             "\"model.layers.0.input_layernorm.weight\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_"
             "offsets\":[32,48]}}",
             data, sizeof data);
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    sb_write(p, b.p, b.n);
    gb_free(&b);
    kiln_model_file *m;
    kiln_err e;
    if (kiln_model_file_open(dir, 0, &m, &e)) fail_msg("%s", e.msg);
    kiln_load_request req;
    kiln_load_request_init(&req);
    req.alias_align = 2;
    for (int layout = 0; layout < 2; layout++) {
        req.target.layout = layout ? "f32" : NULL;
        kiln_load_plan *pl;
        if (kiln_load_plan_build(m, &req, &pl, &e) || kiln_load_execute(pl, &e))
            fail_msg("%s", e.msg);
        const kiln_load_item *n = kiln_load_plan_find(pl, "blk.0.attn_norm.weight");
        assert_non_null(n);
        assert_int_equal(n->lane, KILN_LANE_TRANSFORM);
        for (int i = 0; i < 8; i++) {
            float want = kiln_bf16_to_f32(norm[i]) + 1.0f;
            float got = layout ? ((const float *)n->data)[i]
                               : kiln_bf16_to_f32(((const uint16_t *)n->data)[i]);
            if (!layout) want = kiln_bf16_to_f32(kiln_f32_to_bf16(want));
            assert_true(got == want);
        }
        const kiln_load_item *t = kiln_load_plan_find(pl, "token_embd.weight");
        assert_int_equal(t->lane, layout ? KILN_LANE_TRANSFORM : KILN_LANE_ALIAS);
        kiln_load_plan_free(pl);
    }
    kiln_model_file_close(m);
    sb_rmdir(dir);
}

/* A tiny HF checkpoint of each family (config.json + model.safetensors with HF names):
 * every tensor maps to the GGUF name the family reads, and loads byte-exactly. */
static void test_families(void **state) {
    (void)state;
    static const struct {
        const char *cfg;
        const char *arch;
        bool qk_norm, bias, gemma;
    } fam[] = {
        {"{\"model_type\":\"llama\",\"hidden_size\":32,\"intermediate_size\":64,"
         "\"num_attention_heads\":2,\"num_hidden_layers\":1,\"vocab_size\":16}",
         "llama", false, false, false},
        {"{\"model_type\":\"qwen2\",\"hidden_size\":32,\"intermediate_size\":64,"
         "\"num_attention_heads\":2,\"num_hidden_layers\":1}",
         "qwen2", false, true, false},
        {"{\"model_type\":\"qwen3\",\"hidden_size\":32,\"intermediate_size\":64,"
         "\"num_attention_heads\":2,\"num_hidden_layers\":1,\"head_dim\":16}",
         "qwen3", true, false, false},
        {"{\"model_type\":\"gemma3_text\",\"hidden_size\":32,\"intermediate_size\":64,"
         "\"num_attention_heads\":2,\"num_hidden_layers\":1,\"head_dim\":16}",
         "gemma3", true, false, true},
    };
    for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
        /* HF name, GGUF name, rows, cols (row-major [rows, cols]) */
        struct {
            const char *hf, *gguf;
            int rows, cols;
        } ts[20];
        int n = 0;
#define ADD(h, g, r, c) ts[n].hf = h, ts[n].gguf = g, ts[n].rows = r, ts[n].cols = c, n++
        ADD("model.embed_tokens.weight", "token_embd.weight", 16, 32);
        ADD("model.norm.weight", "output_norm.weight", 0, 32);
        ADD("model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight", 0, 32);
        ADD("model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight", 32, 32);
        ADD("model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight", 32, 32);
        ADD("model.layers.0.self_attn.v_proj.weight", "blk.0.attn_v.weight", 32, 32);
        ADD("model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight", 32, 32);
        ADD("model.layers.0.mlp.gate_proj.weight", "blk.0.ffn_gate.weight", 64, 32);
        ADD("model.layers.0.mlp.up_proj.weight", "blk.0.ffn_up.weight", 64, 32);
        ADD("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight", 32, 64);
        if (fam[f].gemma) {
            ADD("model.layers.0.post_attention_layernorm.weight",
                "blk.0.post_attention_norm.weight", 0, 32);
            ADD("model.layers.0.pre_feedforward_layernorm.weight", "blk.0.ffn_norm.weight", 0, 32);
            ADD("model.layers.0.post_feedforward_layernorm.weight", "blk.0.post_ffw_norm.weight", 0,
                32);
        } else {
            ADD("model.layers.0.post_attention_layernorm.weight", "blk.0.ffn_norm.weight", 0, 32);
            ADD("lm_head.weight", "output.weight", 16, 32);
        }
        if (fam[f].qk_norm) {
            ADD("model.layers.0.self_attn.q_norm.weight", "blk.0.attn_q_norm.weight", 0, 16);
            ADD("model.layers.0.self_attn.k_norm.weight", "blk.0.attn_k_norm.weight", 0, 16);
        }
        if (fam[f].bias) {
            ADD("model.layers.0.self_attn.q_proj.bias", "blk.0.attn_q.bias", 0, 32);
            ADD("model.layers.0.self_attn.k_proj.bias", "blk.0.attn_k.bias", 0, 32);
            ADD("model.layers.0.self_attn.v_proj.bias", "blk.0.attn_v.bias", 0, 32);
        }
#undef ADD
        char hdr[8192];
        int o = snprintf(hdr, sizeof hdr, "{");
        size_t off = 0;
        for (int i = 0; i < n; i++) {
            size_t bytes = (size_t)(ts[i].rows ? ts[i].rows : 1) * (size_t)ts[i].cols * 2;
            char shape[32];
            if (ts[i].rows)
                snprintf(shape, sizeof shape, "[%d,%d]", ts[i].rows, ts[i].cols);
            else
                snprintf(shape, sizeof shape, "[%d]", ts[i].cols);
            o += snprintf(hdr + o, sizeof hdr - (size_t)o,
                          "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                          i ? "," : "", ts[i].hf, shape, off, off + bytes);
            off += bytes;
        }
        snprintf(hdr + o, sizeof hdr - (size_t)o, "}");
        const char *dir = sb_tmpdir();
        sb_write_str(dir, "config.json", fam[f].cfg);
        gb_buf b = {0};
        sb_image(&b, hdr, NULL, off);
        char p[512];
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        sb_write(p, b.p, b.n);
        gb_free(&b);
        kiln_model_file *m;
        kiln_err e;
        if (kiln_model_file_open(dir, 0, &m, &e)) fail_msg("%s: %s", fam[f].arch, e.msg);
        assert_string_equal(kiln_model_file_arch(m), fam[f].arch);
        assert_int_equal(kiln_model_file_tensor_count(m), (size_t)n);
        for (int i = 0; i < n; i++) {
            const kiln_tensor_info *t = kiln_model_file_find_tensor(m, ts[i].gguf);
            if (!t) fail_msg("%s: %s not mapped to %s", fam[f].arch, ts[i].hf, ts[i].gguf);
            assert_int_equal(t->shape[0], ts[i].cols);
            assert_int_equal(t->shape[1], ts[i].rows ? ts[i].rows : 1);
            bool norm = strstr(ts[i].hf, "norm.weight") != NULL;
            assert_int_equal(t->fixup, fam[f].gemma && norm ? KILN_FIXUP_ADD_ONE : KILN_FIXUP_NONE);
        }
        kiln_model_file *keep = mf;
        mf = m;
        kiln_load_request req;
        kiln_load_request_init(&req);
        req.alias_align = 2;
        kiln_load_plan *pl = load(&req);
        check_against_residual(&req, pl);
        assert_int_equal(kiln_load_plan_report(pl)->lane[KILN_LANE_TRANSFORM].tensors,
                         fam[f].gemma ? 7 : 0);
        kiln_load_plan_free(pl);
        mf = keep;
        kiln_model_file_close(m);
        sb_rmdir(dir);
    }
}

/* The upload lane (CUDA builds with a device: the GPU machine): every tensor copied to
 * the device, native and as f32, reads back equal to the residual lane. */
static void test_upload(void **state) {
    (void)state;
#ifdef KILN_HAVE_CUDA
    kiln_load_request probe;
    kiln_load_request_init(&probe);
    probe.target.place = KILN_PLACE_CUDA;
    kiln_load_plan *p = NULL;
    kiln_err e;
    if (kiln_load_plan_build(mf, &probe, &p, &e) == KILN_ERR_DEVICE) {
        print_message("skipped: no CUDA device (%s)\n", e.msg);
        skip();
    }
    kiln_load_plan_free(p);
    /* every way of filling the lane (KILN_UPLOAD, upload.c), whole tensors and a row shard,
     * the native layout and a transform on the way */
    static const char *const modes[] = {"pread", "stream", "direct", "hybrid", "stream"};
    for (int c = 0; c < 5 * 3; c++) {
        const int layout = c % 3 == 1, shard = c % 3 == 2;
        setenv("KILN_UPLOAD", modes[c / 3], 1);
        if (c / 3 == 4) { /* stream with 1 MiB windows, 64 KiB granules, streaming stores */
            setenv("KILN_UPLOAD_WINDOW_MB", "1", 1);
            setenv("KILN_UPLOAD_GRANULE_KB", "64", 1);
            setenv("KILN_UPLOAD_STORES", "stream", 1);
        }
        kiln_load_request req;
        kiln_load_request_init(&req);
        req.target.place = KILN_PLACE_CUDA;
        req.target.layout = layout ? "f32" : NULL;
        if (shard) {
            req.shard = KILN_SHARD_ROWS;
            req.shard_count = 2;
            req.shard_index = 1;
            req.pattern = "blk.0.*";
        }
        p = load(&req);
        assert_string_equal(kiln_load_plan_report(p)->upload_mode, modes[c / 3]);
        assert_int_equal(kiln_load_plan_report(p)->lane[KILN_LANE_UPLOAD].tensors,
                         kiln_load_plan_count(p));
        kiln_load_request r = req;
        r.target.place = KILN_PLACE_HOST;
        r.force_lane = KILN_LANE_RESIDUAL;
        kiln_load_plan *ref = load(&r);
        for (size_t i = 0; i < kiln_load_plan_count(p); i++) {
            const kiln_load_item *it = kiln_load_plan_item(p, i);
            assert_non_null(it->device_ptr);
            void *host = malloc(it->nbytes);
            assert_int_equal(kiln_load_item_read(it, host, &e), KILN_OK);
            assert_memory_equal(host, kiln_load_plan_item(ref, i)->data, it->nbytes);
            free(host);
        }
        kiln_load_plan_free(ref);
        kiln_load_plan_free(p);
    }
    unsetenv("KILN_UPLOAD");
    unsetenv("KILN_UPLOAD_WINDOW_MB");
    unsetenv("KILN_UPLOAD_GRANULE_KB");
    unsetenv("KILN_UPLOAD_STORES");
#else
    print_message("skipped: built without CUDA\n");
    skip();
#endif
}

static kiln_status dummy_plan(uint32_t src, int64_t ne0, int64_t n_rows, uint32_t fixup,
                              uint32_t *out_dtype, uint64_t *out_row_bytes, kiln_err *err) {
    (void)n_rows, (void)fixup, (void)err;
    *out_dtype = src;
    *out_row_bytes = (uint64_t)ne0 * 4;
    return src == KILN_DTYPE_F32 ? KILN_OK : KILN_ERR_UNSUPPORTED;
}
static kiln_status dummy_run(uint32_t src, int64_t ne0, uint32_t fixup, const void *in,
                             int64_t n_rows, void *dst, kiln_err *err) {
    (void)src, (void)fixup, (void)err;
    const float *s = in;
    float *d = dst;
    for (int64_t i = 0; i < ne0 * n_rows; i++) d[i] = -s[i];
    return KILN_OK;
}

static kiln_status failing_plan(uint32_t src, int64_t ne0, int64_t n_rows, uint32_t fixup,
                                uint32_t *out_dtype, uint64_t *out_row_bytes, kiln_err *err) {
    return kiln_layout_find("f32")->plan(src, ne0, n_rows, fixup, out_dtype, out_row_bytes, err);
}
static kiln_status failing_run(uint32_t src, int64_t ne0, uint32_t fixup, const void *in,
                               int64_t n_rows, void *dst, kiln_err *err) {
    if (src == KILN_DTYPE_F32) return kiln_err_set(err, KILN_ERR_IO, "simulated failure");
    return kiln_layout_find("f32")->run(src, ne0, fixup, in, n_rows, dst, err);
}

static kiln_load_target failing_target(void *user, const kiln_tensor_info *t) {
    (void)user;
    kiln_load_target tg = {KILN_PLACE_HOST, 0, NULL, false};
    if (t->dtype == KILN_DTYPE_F16 || t->dtype == KILN_DTYPE_F32) tg.layout = "test_failing";
    return tg;
}

/* A failing tensor fails the load, naming lane and tensor; tensors finished before it
 * stay committed; nothing is retried on another lane. */
static void test_failure_commits(void **state) {
    (void)state;
    static const kiln_layout failing = {"test_failing", "fails on f32", 1,
                                        failing_plan,   failing_run,    false};
    kiln_err e;
    if (!kiln_layout_find("test_failing"))
        assert_int_equal(kiln_layout_register(&failing, &e), KILN_OK);
    kiln_load_request req;
    kiln_load_request_init(&req);
    req.target_for = failing_target;
    req.threads = 1; /* chunks in file order: token_embd (f16) before blk.1.attn_q (f32) */
    kiln_load_plan *p = NULL;
    assert_int_equal(kiln_load_plan_build(mf, &req, &p, &e), KILN_OK);
    assert_int_equal(kiln_load_execute(p, &e), KILN_ERR_IO);
    assert_non_null(strstr(e.msg, "lane transform"));
    assert_non_null(strstr(e.msg, "blk.1.attn_q.weight"));
    assert_non_null(strstr(e.msg, "simulated failure"));
    assert_true(kiln_load_plan_find(p, "token_embd.weight")->done);
    assert_false(kiln_load_plan_find(p, "blk.1.attn_q.weight")->done);
    assert_int_equal(kiln_load_plan_find(p, "blk.1.attn_q.weight")->lane, KILN_LANE_TRANSFORM);
    assert_int_equal(kiln_load_execute(p, &e), KILN_ERR_STATE); /* a plan runs once */
    kiln_load_plan_free(p);
}

/* A layout registered from outside (as the kernel layer will) is used like a built-in. */
static void test_registry(void **state) {
    (void)state;
    static const kiln_layout neg = {"test_negate", "negate f32", 1, dummy_plan, dummy_run, false};
    kiln_err e;
    assert_int_equal(kiln_layout_register(&neg, &e), KILN_OK);
    assert_int_equal(kiln_layout_register(&neg, &e), KILN_ERR_STATE);
    assert_ptr_equal(kiln_layout_find("test_negate"), &neg);
    assert_non_null(kiln_layout_find(NULL));
    assert_string_equal(kiln_layout_find(NULL)->name, "native");
    kiln_load_request req;
    kiln_load_request_init(&req);
    req.pattern = "blk.1.attn_q.weight";
    req.target.layout = "test_negate";
    kiln_load_plan *p = load(&req);
    const kiln_load_item *it = kiln_load_plan_item(p, 0);
    assert_true(((const float *)it->data)[3] == -((const float *)it->src->data)[3]);
    check_against_residual(&req, p);
    kiln_load_plan_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_native_alias),
        cmocka_unit_test(test_transforms),
        cmocka_unit_test(test_dequant),
        cmocka_unit_test(test_shards),
        cmocka_unit_test(test_selection),
        cmocka_unit_test(test_plan_errors),
        cmocka_unit_test(test_unsupported_refused),
        cmocka_unit_test(test_fixup),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_failure_commits),
        cmocka_unit_test(test_families),
        cmocka_unit_test(test_upload),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
