/* test_safetensors.c — the safetensors reader (one test per validation error), HF
 * config.json mapping per family, HF -> GGUF tensor names, and kiln_model_file on GGUF,
 * single-file and sharded safetensors directories. */
#include "format/dtype.h"
#include "format/gguf.h"
#include "format/hf_map.h"
#include "format/model_file.h"
#include "format/safetensors.h"
#include "test_safetensors_builder.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kiln_safetensors *open_img(const gb_buf *b, kiln_err *e) {
    kiln_safetensors *st = NULL;
    if (kiln_st_open_buffer(b->p, b->n, "t.safetensors", 0, &st, e)) return NULL;
    return st;
}

static void test_valid(void **state) {
    (void)state;
    gb_buf b = {0};
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"n\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                      "\"s\":{\"dtype\":\"I8\",\"shape\":[],\"data_offsets\":[32,33]},"
                      "\"z\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[33,33]}}";
    sb_image(&b, hdr, NULL, 33);
    kiln_err e;
    kiln_safetensors *st = open_img(&b, &e);
    if (!st) fail_msg("%s", e.msg);
    assert_int_equal(kiln_st_tensor_count(st), 4);
    const kiln_tensor_info *w = kiln_st_find_tensor(st, "w");
    assert_non_null(w);
    assert_int_equal(w->dtype, KILN_DTYPE_F32);
    assert_int_equal(w->rank, 2);
    /* row-major [2, 3] -> ggml {3, 2} */
    assert_true(w->shape[0] == 3 && w->shape[1] == 2 && w->shape[2] == 1);
    assert_int_equal(w->nbytes, 24);
    assert_int_equal(w->offset, kiln_st_data_offset(st));
    assert_ptr_equal(w->data, b.p + w->offset);
    const kiln_tensor_info *n = kiln_st_tensor(st, 1);
    assert_string_equal(n->name, "n");
    assert_int_equal(n->dtype, KILN_DTYPE_BF16);
    assert_int_equal(n->offset - kiln_st_data_offset(st), 24);
    assert_int_equal(kiln_st_find_tensor(st, "s")->rank, 0);
    assert_int_equal(kiln_st_find_tensor(st, "z")->nbytes, 0);
    kiln_str fmt;
    assert_int_equal(kiln_meta_get_str(kiln_st_meta(st), "format", &fmt, &e), KILN_OK);
    assert_true(kiln_str_eq(fmt, "pt"));
    /* the data section starts at a multiple of 8 and the I8 at data offset 32 is the
     * last non-empty tensor: every offset is a multiple of 8 */
    assert_int_equal(kiln_st_alignment(st), 8);
    kiln_st_close(st);
    kiln_st_close(NULL);
    gb_free(&b);
}

static void expect_fail(const char *hdr, size_t data, kiln_status code, const char *n1,
                        const char *n2) {
    gb_buf b = {0};
    sb_image(&b, hdr, NULL, data);
    kiln_safetensors *st = NULL;
    kiln_err e;
    kiln_status rc = kiln_st_open_buffer(b.p, b.n, "bad.safetensors", 0, &st, &e);
    if (rc == KILN_OK) fail_msg("expected failure for %s", hdr);
    assert_null(st);
    if (rc != code)
        fail_msg("expected %s, got %s: %s", kiln_status_name(code), kiln_status_name(rc), e.msg);
    if (!strstr(e.msg, "bad.safetensors")) fail_msg("no file name: %s", e.msg);
    if (n1 && !strstr(e.msg, n1)) fail_msg("message lacks '%s': %s", n1, e.msg);
    if (n2 && !strstr(e.msg, n2)) fail_msg("message lacks '%s': %s", n2, e.msg);
    gb_free(&b);
}

#define OFFS(a, b)        ",\"data_offsets\":[" #a "," #b "]}}"
#define T1(n, d, s, a, b) "{\"" n "\":{\"dtype\":\"" d "\",\"shape\":" s OFFS(a, b)

static void test_truncated_and_header(void **state) {
    (void)state;
    kiln_safetensors *st = NULL;
    kiln_err e;
    assert_int_equal(kiln_st_open_buffer("abc", 3, "bad.safetensors", 0, &st, &e), KILN_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "truncated"));
    gb_buf b = {0};
    gb_u64(&b, 1000);
    gb_put(&b, "{}", 2);
    assert_int_equal(kiln_st_open_buffer(b.p, b.n, "bad.safetensors", 0, &st, &e), KILN_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "truncated"));
    gb_free(&b);
    gb_u64(&b, 1ull << 40);
    gb_put(&b, "{}", 2);
    assert_int_equal(kiln_st_open_buffer(b.p, b.n, "bad.safetensors", 0, &st, &e), KILN_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "absurd header length"));
    gb_free(&b);
    /* every prefix of a valid file fails cleanly */
    sb_image(&b, T1("w", "F32", "[4]", 0, 16), NULL, 16);
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *cut = malloc(n ? n : 1);
        memcpy(cut, b.p, n);
        assert_int_equal(kiln_st_open_buffer(cut, n, "cut", 0, &st, &e), KILN_ERR_FORMAT);
        free(cut);
    }
    gb_free(&b);
    expect_fail("{\"w\": [1,", 0, KILN_ERR_FORMAT, "header JSON", "line 1");
    expect_fail("[1, 2]", 0, KILN_ERR_FORMAT, "not an object", NULL);
    expect_fail("{\"w\xff\": 1}", 0, KILN_ERR_FORMAT, "header JSON", "decode byte 0xff");
    expect_fail("{\"__metadata__\": {\"a\": 1}}", 0, KILN_ERR_FORMAT, "__metadata__ 'a'", NULL);
}

static void test_duplicate(void **state) {
    (void)state;
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                8, KILN_ERR_FORMAT, "duplicate", NULL);
}

static void test_tensor_entries(void **state) {
    (void)state;
    expect_fail("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, KILN_ERR_FORMAT, "'w'",
                "dtype");
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, KILN_ERR_FORMAT, "'w'",
                "shape");
    expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
                KILN_ERR_FORMAT, "'w'", "data_offsets");
    expect_fail("{\"w\": 5}", 4, KILN_ERR_FORMAT, "'w'", "not an object");
    /* unknown / unsupported dtypes */
    expect_fail(T1("w.u8", "U8", "[4]", 0, 4), 4, KILN_ERR_UNSUPPORTED, "w.u8", "\"U8\"");
    expect_fail(T1("w.f8", "F8_E4M3", "[4]", 0, 4), 4, KILN_ERR_UNSUPPORTED, "w.f8", "F8_E4M3");
    expect_fail(T1("w.x", "Q9", "[4]", 0, 4), 4, KILN_ERR_UNSUPPORTED, "w.x", "Q9");
    /* rank, negative and non-integer dims, overflow */
    expect_fail(T1("w.r5", "F32", "[1,1,1,1,1]", 0, 4), 4, KILN_ERR_UNSUPPORTED, "w.r5", "rank 5");
    expect_fail(T1("w.neg", "F32", "[-1]", 0, 4), 4, KILN_ERR_FORMAT, "w.neg", "shape[0]");
    expect_fail(T1("w.flt", "F32", "[1.5]", 0, 4), 4, KILN_ERR_FORMAT, "w.flt", "shape[0]");
    expect_fail(T1("w.big", "F32", "[4294967296,4294967296]", 0, 4), 4, KILN_ERR_OVERFLOW, "w.big",
                "overflow");
    /* offsets */
    expect_fail(T1("w.rev", "F32", "[1]", 8, 4), 8, KILN_ERR_FORMAT, "w.rev", "end before begin");
    expect_fail(T1("w.out", "F32", "[4]", 0, 16), 12, KILN_ERR_FORMAT, "w.out", "outside the data");
    expect_fail(T1("w.neg", "F32", "[1]", -4, 0), 4, KILN_ERR_FORMAT, "w.neg", "non-negative");
    /* shape x dtype != size */
    expect_fail(T1("w.size", "F32", "[3]", 0, 16), 16, KILN_ERR_FORMAT, "w.size",
                "shape x dtype = 12");
    /* misaligned: an F32 at data offset 2 */
    expect_fail("{\"a\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                "\"w.mis\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}",
                6, KILN_ERR_FORMAT, "w.mis", "not aligned");
}

static void test_coverage(void **state) {
    (void)state;
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                12, KILN_ERR_FORMAT, "overlaps", "'a'");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                12, KILN_ERR_FORMAT, "hole", "'b'");
    expect_fail(T1("a", "F32", "[1]", 0, 4), 8, KILN_ERR_FORMAT, "4 trailing bytes", NULL);
}

/* ---- config.json mapping ------------------------------------------------------------- */

static const char *llama_cfg =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":64,"
    "\"intermediate_size\":128,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"num_hidden_layers\":2,\"max_position_embeddings\":256,\"rms_norm_eps\":1e-05,"
    "\"rope_theta\":500000.0,\"vocab_size\":100,\"bos_token_id\":1,\"eos_token_id\":[2,3],"
    "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
    "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192},"
    "\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\"}";

static const char *gemma_cfg =
    "{\"architectures\":[\"Gemma3ForCausalLM\"],\"model_type\":\"gemma3_text\","
    "\"hidden_size\":64,\"intermediate_size\":96,\"num_attention_heads\":4,"
    "\"num_key_value_heads\":1,\"head_dim\":32,\"num_hidden_layers\":2,"
    "\"max_position_embeddings\":32768,\"rms_norm_eps\":1e-06,\"rope_theta\":1000000.0,"
    "\"rope_local_base_freq\":10000.0,\"sliding_window\":512,\"query_pre_attn_scalar\":256,"
    "\"final_logit_softcapping\":null,\"vocab_size\":100,"
    "\"layer_types\":[\"sliding_attention\",\"full_attention\"]}";

static void test_config_mapping(void **state) {
    (void)state;
    kiln_meta m;
    kiln_err e;
    uint32_t u;
    float f;
    kiln_str s;
    kiln_meta_init(&m);
    if (kiln_hf_config_to_meta(llama_cfg, strlen(llama_cfg), "config.json", &m, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(kiln_meta_get_str(&m, "general.architecture", &s, &e), KILN_OK);
    assert_true(kiln_str_eq(s, "llama"));
    assert_int_equal(kiln_meta_get_u32(&m, "llama.block_count", &u, &e), KILN_OK),
        assert_int_equal(u, 2);
    assert_int_equal(kiln_meta_get_u32(&m, "llama.embedding_length", &u, &e), KILN_OK),
        assert_int_equal(u, 64);
    assert_int_equal(kiln_meta_get_u32(&m, "llama.feed_forward_length", &u, &e), KILN_OK),
        assert_int_equal(u, 128);
    assert_int_equal(kiln_meta_get_u32(&m, "llama.attention.head_count", &u, &e), KILN_OK),
        assert_int_equal(u, 4);
    assert_int_equal(kiln_meta_get_u32(&m, "llama.attention.head_count_kv", &u, &e), KILN_OK),
        assert_int_equal(u, 2);
    assert_int_equal(kiln_meta_get_u32(&m, "llama.context_length", &u, &e), KILN_OK),
        assert_int_equal(u, 256);
    assert_int_equal(kiln_meta_get_u32(&m, "llama.rope.dimension_count", &u, &e), KILN_OK),
        assert_int_equal(u, 16);
    assert_int_equal(kiln_meta_get_u32(&m, "llama.vocab_size", &u, &e), KILN_OK),
        assert_int_equal(u, 100);
    assert_int_equal(kiln_meta_get_f32(&m, "llama.attention.layer_norm_rms_epsilon", &f, &e),
                     KILN_OK);
    assert_true(f == 1e-5f);
    assert_int_equal(kiln_meta_get_f32(&m, "llama.rope.freq_base", &f, &e), KILN_OK);
    assert_true(f == 500000.0f);
    assert_int_equal(kiln_meta_get_str(&m, "llama.rope.scaling.type", &s, &e), KILN_OK);
    assert_true(kiln_str_eq(s, "llama3"));
    assert_int_equal(kiln_meta_get_f32(&m, "llama.rope.scaling.factor", &f, &e), KILN_OK);
    assert_true(f == 8.0f);
    assert_int_equal(kiln_meta_get_u32(&m, "llama.rope.scaling.original_context_length", &u, &e),
                     KILN_OK);
    assert_int_equal(u, 8192);
    assert_int_equal(kiln_meta_get_f32(&m, "llama.rope.scaling.high_freq_factor", &f, &e), KILN_OK);
    assert_true(f == 4.0f);
    assert_int_equal(kiln_meta_get_u32(&m, "tokenizer.ggml.bos_token_id", &u, &e), KILN_OK),
        assert_int_equal(u, 1);
    assert_int_equal(kiln_meta_get_u32(&m, "tokenizer.ggml.eos_token_id", &u, &e), KILN_OK),
        assert_int_equal(u, 2);
    bool tie;
    assert_int_equal(kiln_meta_get_bool(&m, "hf.config.tie_word_embeddings", &tie, &e), KILN_OK);
    assert_true(tie);
    assert_int_equal(kiln_meta_get_str(&m, "hf.config.torch_dtype", &s, &e), KILN_OK);
    assert_true(kiln_str_eq(s, "bfloat16"));
    kiln_meta_free(&m);

    kiln_meta_init(&m);
    if (kiln_hf_config_to_meta(gemma_cfg, strlen(gemma_cfg), "config.json", &m, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(kiln_meta_get_str(&m, "general.architecture", &s, &e), KILN_OK);
    assert_true(kiln_str_eq(s, "gemma3"));
    assert_int_equal(kiln_meta_get_u32(&m, "gemma3.attention.key_length", &u, &e), KILN_OK),
        assert_int_equal(u, 32);
    assert_int_equal(kiln_meta_get_u32(&m, "gemma3.attention.head_count_kv", &u, &e), KILN_OK),
        assert_int_equal(u, 1);
    assert_int_equal(kiln_meta_get_u32(&m, "gemma3.attention.sliding_window", &u, &e), KILN_OK),
        assert_int_equal(u, 512);
    assert_int_equal(kiln_meta_get_f32(&m, "gemma3.rope.freq_base_swa", &f, &e), KILN_OK);
    assert_true(f == 10000.0f);
    assert_false(kiln_meta_has(&m, "gemma3.final_logit_softcapping"));
    const kiln_meta_value *lt;
    assert_int_equal(kiln_meta_get_arr(&m, "hf.config.layer_types", KILN_META_STRING, &lt, &e),
                     KILN_OK);
    assert_true(kiln_meta_arr_str(lt, 1, &s) && kiln_str_eq(s, "full_attention"));
    int64_t q;
    assert_int_equal(kiln_meta_get_i64(&m, "hf.config.query_pre_attn_scalar", &q, &e), KILN_OK);
    assert_int_equal(q, 256);
    kiln_meta_free(&m);

    /* qwen2 / qwen3 / multimodal gemma3 text_config */
    static const char *qwen2 =
        "{\"model_type\":\"qwen2\",\"hidden_size\":32,\"num_attention_heads\":2,"
        "\"num_hidden_layers\":1,\"rope_theta\":1000000.0,\"rms_norm_eps\":1e-6}";
    kiln_meta_init(&m);
    assert_int_equal(kiln_hf_config_to_meta(qwen2, strlen(qwen2), "c", &m, &e), KILN_OK);
    assert_int_equal(kiln_meta_get_u32(&m, "qwen2.attention.head_count_kv", &u, &e), KILN_OK),
        assert_int_equal(u, 2);
    assert_false(kiln_meta_has(&m, "qwen2.rope.dimension_count"));
    kiln_meta_free(&m);
    static const char *qwen3 = "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":32,"
                               "\"num_attention_heads\":2,\"num_hidden_layers\":1,\"head_dim\":64}";
    kiln_meta_init(&m);
    assert_int_equal(kiln_hf_config_to_meta(qwen3, strlen(qwen3), "c", &m, &e), KILN_OK);
    assert_int_equal(kiln_meta_get_u32(&m, "qwen3.attention.value_length", &u, &e), KILN_OK),
        assert_int_equal(u, 64);
    kiln_meta_free(&m);
    static const char *g3mm = "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],"
                              "\"eos_token_id\":[1,106],\"text_config\":{\"hidden_size\":32,"
                              "\"num_attention_heads\":2,\"num_hidden_layers\":3}}";
    kiln_meta_init(&m);
    assert_int_equal(kiln_hf_config_to_meta(g3mm, strlen(g3mm), "c", &m, &e), KILN_OK);
    assert_int_equal(kiln_meta_get_u32(&m, "gemma3.block_count", &u, &e), KILN_OK),
        assert_int_equal(u, 3);
    assert_int_equal(kiln_meta_get_u32(&m, "tokenizer.ggml.eos_token_id", &u, &e), KILN_OK),
        assert_int_equal(u, 1);
    assert_int_equal(kiln_meta_get_f32(&m, "gemma3.rope.freq_base", &f, &e), KILN_OK);
    assert_true(f == 1000000.0f);
    kiln_meta_free(&m);

    /* errors name the field or the model type */
    static const char *bad1 =
        "{\"model_type\":\"llama\",\"hidden_size\":32,\"num_hidden_layers\":1}";
    kiln_meta_init(&m);
    assert_int_equal(kiln_hf_config_to_meta(bad1, strlen(bad1), "c.json", &m, &e),
                     KILN_ERR_NOT_FOUND);
    assert_non_null(strstr(e.msg, "num_attention_heads"));
    kiln_meta_free(&m);
    static const char *bad2 =
        "{\"model_type\":\"llama\",\"hidden_size\":\"big\",\"num_hidden_layers\":1,"
        "\"num_attention_heads\":2}";
    kiln_meta_init(&m);
    assert_int_equal(kiln_hf_config_to_meta(bad2, strlen(bad2), "c.json", &m, &e), KILN_ERR_TYPE);
    assert_non_null(strstr(e.msg, "hidden_size"));
    kiln_meta_free(&m);
    static const char *bad3 = "{\"model_type\":\"gpt_neox\"}";
    kiln_meta_init(&m);
    assert_int_equal(kiln_hf_config_to_meta(bad3, strlen(bad3), "c.json", &m, &e),
                     KILN_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "gpt_neox"));
    kiln_meta_free(&m);
}

static void test_tensor_names(void **state) {
    (void)state;
    char out[128];
    uint32_t fx;
    static const struct {
        const char *arch, *hf, *gguf;
        uint32_t fixup;
    } cases[] = {
        {"llama", "model.embed_tokens.weight", "token_embd.weight", 0},
        {"llama", "model.norm.weight", "output_norm.weight", 0},
        {"llama", "lm_head.weight", "output.weight", 0},
        {"llama", "model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight", 0},
        {"llama", "model.layers.31.self_attn.o_proj.weight", "blk.31.attn_output.weight", 0},
        {"llama", "model.layers.3.post_attention_layernorm.weight", "blk.3.ffn_norm.weight", 0},
        {"llama", "model.layers.3.mlp.down_proj.weight", "blk.3.ffn_down.weight", 0},
        {"qwen2", "model.layers.1.self_attn.k_proj.bias", "blk.1.attn_k.bias", 0},
        {"qwen3", "model.layers.1.self_attn.k_norm.weight", "blk.1.attn_k_norm.weight", 0},
        {"gemma3", "model.layers.2.post_attention_layernorm.weight",
         "blk.2.post_attention_norm.weight", 1},
        {"gemma3", "model.layers.2.pre_feedforward_layernorm.weight", "blk.2.ffn_norm.weight", 1},
        {"gemma3", "model.layers.2.post_feedforward_layernorm.weight", "blk.2.post_ffw_norm.weight",
         1},
        {"gemma3", "model.layers.2.self_attn.q_norm.weight", "blk.2.attn_q_norm.weight", 1},
        {"gemma3", "model.norm.weight", "output_norm.weight", 1},
        {"gemma3", "model.layers.2.mlp.gate_proj.weight", "blk.2.ffn_gate.weight", 0},
        {"gemma3", "language_model.model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight",
         1},
        {"gemma3", "model.language_model.embed_tokens.weight", "token_embd.weight", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!kiln_hf_tensor_name(cases[i].arch, cases[i].hf, out, sizeof out, &fx))
            fail_msg("%s not mapped", cases[i].hf);
        assert_string_equal(out, cases[i].gguf);
        assert_int_equal(fx, cases[i].fixup);
    }
    assert_false(
        kiln_hf_tensor_name("llama", "model.layers.x.mlp.up_proj.weight", out, sizeof out, &fx));
    assert_string_equal(out, "model.layers.x.mlp.up_proj.weight");
    assert_false(
        kiln_hf_tensor_name("llama", "model.layers.01.mlp.up_proj.weight", out, sizeof out, &fx));
    assert_false(
        kiln_hf_tensor_name("gemma3", "vision_tower.encoder.weight", out, sizeof out, &fx));
    assert_false(
        kiln_hf_tensor_name("llama", "model.layers.0.rotary_emb.inv_freq", out, sizeof out, &fx));
}

/* ---- kiln_model_file ----------------------------------------------------------------- */

static void test_model_dir(void **state) {
    (void)state;
    const char *dir = sb_tmpdir();
    sb_write_str(dir, "config.json", gemma_cfg);
    sb_write_str(dir, "tokenizer.json", "{}");
    gb_buf b = {0};
    sb_image(
        &b,
        "{\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[100,64],\"data_offsets\":[0,"
        "12800]},"
        "\"model.norm.weight\":{\"dtype\":\"BF16\",\"shape\":[64],\"data_offsets\":[12800,12928]},"
        "\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[128,64],\"data_"
        "offsets\":[12928,29312]}}",
        NULL, 29312);
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    sb_write(p, b.p, b.n);
    gb_free(&b);
    kiln_model_file *mf;
    kiln_err e;
    if (kiln_model_file_open(dir, 0, &mf, &e)) fail_msg("%s", e.msg);
    assert_int_equal(kiln_model_file_source(mf), KILN_SOURCE_SAFETENSORS);
    assert_string_equal(kiln_model_file_arch(mf), "gemma3");
    assert_int_equal(kiln_model_file_tensor_count(mf), 3);
    const kiln_tensor_info *t = kiln_model_file_find_tensor(mf, "blk.0.attn_q.weight");
    assert_non_null(t);
    assert_true(t->shape[0] == 64 && t->shape[1] == 128);
    assert_int_equal(t->fixup, KILN_FIXUP_NONE);
    t = kiln_model_file_find_tensor(mf, "output_norm.weight");
    assert_non_null(t);
    assert_int_equal(t->fixup, KILN_FIXUP_ADD_ONE);
    assert_string_equal(kiln_model_file_tensor_src_name(mf, 1), "model.norm.weight");
    assert_non_null(kiln_model_file_tokenizer_json(mf));
    assert_non_null(strstr(kiln_model_file_tokenizer_json(mf), "tokenizer.json"));
    assert_int_equal(kiln_model_file_shard_count(mf), 1);
    uint32_t u;
    assert_int_equal(kiln_meta_get_u32(kiln_model_file_meta(mf), "gemma3.block_count", &u, &e),
                     KILN_OK);
    assert_int_equal(kiln_model_file_tensor_bytes(mf), 29312);
    kiln_model_file_close(mf);
    /* the .safetensors file itself opens the same way */
    if (kiln_model_file_open(p, 0, &mf, &e)) fail_msg("%s", e.msg);
    assert_non_null(kiln_model_file_find_tensor(mf, "token_embd.weight"));
    kiln_model_file_close(mf);
    sb_rmdir(dir);
}

static void write_shard(const char *dir, const char *name, const char *tname, size_t n) {
    char hdr[256], p[512];
    snprintf(hdr, sizeof hdr,
             "{\"%s\":{\"dtype\":\"F32\",\"shape\":[%zu],\"data_offsets\":[0,%zu]}}", tname, n,
             n * 4);
    gb_buf b = {0};
    sb_image(&b, hdr, NULL, n * 4);
    snprintf(p, sizeof p, "%s/%s", dir, name);
    sb_write(p, b.p, b.n);
    gb_free(&b);
}

static void test_sharded(void **state) {
    (void)state;
    const char *dir = sb_tmpdir();
    sb_write_str(dir, "config.json", llama_cfg);
    write_shard(dir, "model-00001-of-00002.safetensors", "model.embed_tokens.weight", 64);
    write_shard(dir, "model-00002-of-00002.safetensors", "model.norm.weight", 64);
    sb_write_str(dir, "model.safetensors.index.json",
                 "{\"metadata\":{\"total_size\":512},\"weight_map\":{"
                 "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                 "\"model.norm.weight\":\"model-00002-of-00002.safetensors\"}}");
    kiln_model_file *mf;
    kiln_err e;
    if (kiln_model_file_open(dir, 0, &mf, &e)) fail_msg("%s", e.msg);
    assert_int_equal(kiln_model_file_shard_count(mf), 2);
    const kiln_tensor_info *t = kiln_model_file_find_tensor(mf, "output_norm.weight");
    assert_non_null(t);
    assert_int_equal(t->file, 1);
    assert_int_equal(t->fixup, KILN_FIXUP_NONE); /* llama norms need no fixup */
    assert_null(kiln_model_file_tokenizer_json(mf));
    const kiln_model_shard *sh = kiln_model_file_shard(mf, 1);
    assert_memory_equal(t->data, sh->base + t->offset, 16);
    kiln_model_file_close(mf);

    /* the index names a tensor its shard lacks */
    sb_write_str(
        dir, "model.safetensors.index.json",
        "{\"weight_map\":{\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
        "\"model.norm.weight\":\"model-00002-of-00002.safetensors\","
        "\"lm_head.weight\":\"model-00002-of-00002.safetensors\"}}");
    assert_int_equal(kiln_model_file_open(dir, 0, &mf, &e), KILN_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "lm_head.weight"));
    /* a shard holds a tensor the index does not list */
    sb_write_str(
        dir, "model.safetensors.index.json",
        "{\"weight_map\":{\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\"}}");
    write_shard(dir, "model-00001-of-00002.safetensors", "model.embed_tokens.weight", 64);
    sb_write_str(dir, "model.safetensors.index.json",
                 "{\"weight_map\":{\"model.norm.weight\":\"model-00002-of-00002.safetensors\","
                 "\"model.embed_tokens.weight\":\"model-00002-of-00002.safetensors\"}}");
    assert_int_equal(kiln_model_file_open(dir, 0, &mf, &e), KILN_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "model.embed_tokens.weight"));
    /* shard names must stay in the directory */
    sb_write_str(dir, "model.safetensors.index.json",
                 "{\"weight_map\":{\"model.norm.weight\":\"../x.safetensors\"}}");
    assert_int_equal(kiln_model_file_open(dir, 0, &mf, &e), KILN_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "not a plain file name"));
    /* a missing shard is reported with its path */
    sb_write_str(dir, "model.safetensors.index.json",
                 "{\"weight_map\":{\"model.norm.weight\":\"missing.safetensors\"}}");
    assert_int_equal(kiln_model_file_open(dir, 0, &mf, &e), KILN_ERR_NOT_FOUND);
    assert_non_null(strstr(e.msg, "missing.safetensors"));
    /* an unsupported config is an error naming the model type */
    sb_write_str(dir, "config.json", "{\"model_type\":\"bert\"}");
    assert_int_equal(kiln_model_file_open(dir, 0, &mf, &e), KILN_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "bert"));
    sb_rmdir(dir);
}

static void test_model_file_gguf(void **state) {
    (void)state;
    gb_buf b = {0};
    gb_header(&b, 3, 1, 1);
    gb_kv_str(&b, "general.architecture", "qwen3");
    gb_tensor t = {"blk.0.attn_k.weight", KILN_DTYPE_F16, 2, {32, 4}, NULL, 256};
    gb_tensors(&b, &t, 1, 32);
    const char *p = kt_write_temp(b.p, b.n, ".gguf");
    kiln_model_file *mf;
    kiln_err e;
    if (kiln_model_file_open(p, 0, &mf, &e)) fail_msg("%s", e.msg);
    assert_int_equal(kiln_model_file_source(mf), KILN_SOURCE_GGUF);
    assert_string_equal(kiln_model_source_name(kiln_model_file_source(mf)), "gguf");
    assert_string_equal(kiln_model_file_arch(mf), "qwen3");
    assert_non_null(kiln_model_file_find_tensor(mf, "blk.0.attn_k.weight"));
    assert_int_equal(kiln_model_file_shard(mf, 0)->alignment, 32);
    assert_null(kiln_model_file_tokenizer_json(mf));
    kiln_model_file_close(mf);
    remove(p);
    gb_free(&b);
    assert_int_equal(kiln_model_file_open("/nonexistent/model", 0, &mf, &e), KILN_ERR_NOT_FOUND);
    const char *junk = kt_write_temp("hello world", 11, ".bin");
    assert_int_equal(kiln_model_file_open(junk, 0, &mf, &e), KILN_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "neither a GGUF"));
    remove(junk);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),        cmocka_unit_test(test_truncated_and_header),
        cmocka_unit_test(test_duplicate),    cmocka_unit_test(test_tensor_entries),
        cmocka_unit_test(test_coverage),     cmocka_unit_test(test_config_mapping),
        cmocka_unit_test(test_tensor_names), cmocka_unit_test(test_model_dir),
        cmocka_unit_test(test_sharded),      cmocka_unit_test(test_model_file_gguf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
