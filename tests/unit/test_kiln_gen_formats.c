/* test_kiln_gen_formats.c — a kiln-gen GGUF file and the HF (safetensors + config.json)
 * directory of the same seed describe the same model, read through kiln's model-file
 * layer: same tensors (GGUF names), same shapes, same values up to the documented source
 * differences (llama q/k row permutation, Gemma's 1 + w norms), same hyperparameters.
 * Also: sharded HF output opens through model.safetensors.index.json. */
#include "format/dtype.h"
#include "format/meta.h"
#include "format/model_file.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char gen_path[1024];

static int setup(void **state) {
    (void)state;
    const char *b = getenv("KILN_BINARY_DIR");
    snprintf(gen_path, sizeof gen_path, "%s/kiln-gen", b ? b : ".");
    return 0;
}

static void run(const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' -q %s", gen_path, args);
    if (system(cmd) != 0) fail_msg("failed: %s", cmd);
}

static kiln_model_file *open_mf(const char *path) {
    kiln_model_file *mf;
    kiln_err e;
    if (kiln_model_file_open(path, 0, &mf, &e) != KILN_OK) fail_msg("%s", e.msg);
    return mf;
}

/* GGUF row r of a llama q/k tensor with heads of hd rows is HF row perm(r). */
static int64_t perm_row(int64_t r, int64_t hd) {
    const int64_t h = r / hd, k = r % hd;
    return h * hd + (k % 2) * (hd / 2) + k / 2;
}

static void compare(const char *family) {
    char dir[256], gguf[300], hf[300], args[1024];
    snprintf(dir, sizeof dir, "/tmp/kiln-test-gen-%d-%s", (int)getpid(), family);
    snprintf(gguf, sizeof gguf, "%s.gguf", dir);
    snprintf(hf, sizeof hf, "%s-hf", dir);
    snprintf(args, sizeof args, "-f %s -t f32 -s 7 -o '%s'", family, gguf);
    run(args);
    snprintf(args, sizeof args, "-f %s -t f32 -s 7 --format hf -o '%s'", family, hf);
    run(args);
    kiln_model_file *g = open_mf(gguf), *h = open_mf(hf);
    assert_int_equal(kiln_model_file_source(g), KILN_SOURCE_GGUF);
    assert_int_equal(kiln_model_file_source(h), KILN_SOURCE_SAFETENSORS);
    assert_string_equal(kiln_model_file_arch(g), family);
    assert_string_equal(kiln_model_file_arch(h), family);

    /* hyperparameters: every <arch>.* key of the GGUF that the HF mapping also gives */
    const kiln_meta *gm = kiln_model_file_meta(g), *hm = kiln_model_file_meta(h);
    const char *keys[] = {"block_count",          "embedding_length",
                          "feed_forward_length",  "context_length",
                          "attention.head_count", "attention.head_count_kv",
                          "attention.key_length", "attention.sliding_window",
                          "rope.dimension_count", "vocab_size"};
    int checked = 0;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char k[128];
        snprintf(k, sizeof k, "%s.%s", family, keys[i]);
        if (!kiln_meta_has(gm, k)) continue;
        uint32_t a = 0, b = 0;
        kiln_err e;
        if (kiln_meta_get_u32(gm, k, &a, &e) || kiln_meta_get_u32(hm, k, &b, &e))
            fail_msg("%s: %s", k, e.msg);
        if (a != b) fail_msg("%s: gguf %u, hf %u", k, a, b);
        checked++;
    }
    assert_true(checked >= 6);
    const char *fkeys[] = {"rope.freq_base", "attention.layer_norm_rms_epsilon",
                           "rope.freq_base_swa"};
    for (size_t i = 0; i < 3; i++) {
        char k[128];
        snprintf(k, sizeof k, "%s.%s", family, fkeys[i]);
        if (!kiln_meta_has(gm, k)) continue;
        float a = 0, b = 0;
        kiln_err e;
        if (kiln_meta_get_f32(gm, k, &a, &e) || kiln_meta_get_f32(hm, k, &b, &e))
            fail_msg("%s: %s", k, e.msg);
        if (a != b) fail_msg("%s: gguf %g, hf %g", k, a, b);
    }

    /* tensors */
    const size_t n = kiln_model_file_tensor_count(g);
    assert_int_equal(kiln_model_file_tensor_count(h), n);
    uint32_t hd = 0;
    if (strcmp(family, "llama") == 0) {
        kiln_err e;
        assert_int_equal(kiln_meta_get_u32(gm, "llama.rope.dimension_count", &hd, &e), KILN_OK);
    }
    for (size_t i = 0; i < n; i++) {
        const kiln_tensor_info *a = kiln_model_file_tensor(g, i);
        const kiln_tensor_info *b = kiln_model_file_find_tensor(h, a->name);
        if (!b) fail_msg("%s: tensor %s missing from the HF model", family, a->name);
        assert_int_equal(a->rank, b->rank);
        for (int d = 0; d < a->rank; d++) assert_int_equal(a->shape[d], b->shape[d]);
        assert_int_equal(a->dtype, KILN_DTYPE_F32);
        assert_int_equal(b->dtype, KILN_DTYPE_F32);
        const bool permuted =
            hd && (strstr(a->name, "attn_q.weight") || strstr(a->name, "attn_k.weight"));
        const float add = b->fixup == KILN_FIXUP_ADD_ONE ? 1.0f : 0.0f;
        if (strcmp(family, "gemma3") == 0 && strstr(a->name, "norm"))
            assert_int_equal(b->fixup, KILN_FIXUP_ADD_ONE);
        const int64_t row = a->shape[0], rows = a->rank > 1 ? a->shape[1] : 1;
        for (int64_t r = 0; r < rows; r++) {
            const int64_t hr = permuted ? perm_row(r, hd) : r;
            const float *x = (const float *)a->data + r * row;
            const float *y = (const float *)b->data + hr * row;
            for (int64_t c = 0; c < row; c++)
                if (x[c] != y[c] + add)
                    fail_msg("%s %s [%lld, %lld]: gguf %g, hf %g (+%g)", family, a->name,
                             (long long)r, (long long)c, x[c], y[c], add);
        }
    }
    assert_non_null(kiln_model_file_tokenizer_json(h));
    kiln_model_file_close(g);
    kiln_model_file_close(h);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", gguf, hf);
    assert_int_equal(system(cmd), 0);
}

static void test_llama(void **state) {
    (void)state;
    compare("llama");
}
static void test_qwen2(void **state) {
    (void)state;
    compare("qwen2");
}
static void test_qwen3(void **state) {
    (void)state;
    compare("qwen3");
}
static void test_gemma3(void **state) {
    (void)state;
    compare("gemma3");
}

static void test_sharded(void **state) {
    (void)state;
    char dir[256], args[512];
    snprintf(dir, sizeof dir, "/tmp/kiln-test-gen-%d-shards", (int)getpid());
    snprintf(args, sizeof args, "-f qwen2 -t bf16 --format hf --shard-mb 1 -o '%s'", dir);
    run(args);
    char idx[300];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    assert_int_equal(access(idx, F_OK), 0);
    kiln_model_file *mf = open_mf(dir);
    assert_true(kiln_model_file_shard_count(mf) >= 2);
    assert_non_null(kiln_model_file_find_tensor(mf, "blk.1.attn_q.bias"));
    assert_non_null(kiln_model_file_find_tensor(mf, "token_embd.weight"));
    kiln_model_file_close(mf);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    setup(NULL);
    if (access(gen_path, X_OK) != 0) {
        printf("skipping: %s not built\n", gen_path);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama),  cmocka_unit_test(test_qwen2),   cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_gemma3), cmocka_unit_test(test_sharded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
