/* test_tok_hf_spm.c — SentencePiece-style BPE tokenizer.json files (byte_fallback; Llama 2
 * / TinyLlama style with a Prepend + Replace normalizer, Mistral style with a Metaspace
 * pre-tokenizer), made from the shared llama SPM vocabulary by
 * scripts/gen-spm-tokenizer-json.py (tests/data/tok/hf-spm/): on every shared tokenizer
 * input, kiln's ids equal those of HF `tokenizers` 0.23.3 (ids.txt, written by the same
 * script), and for the Prepend style also kiln's own GGUF SPM path on the same
 * vocabulary (llama.cpp's ids). Also: special ids and flags, and rejection of a
 * normalizer kiln does not read. */
#include "testutil.h"
#include "tok/tok.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)l + 1);
    assert_non_null(b);
    *n = fread(b, 1, (size_t)l, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

#define SEP "\n__ggml_vocab_test__\n"

/* Tokenizes every input of the shared llama-spm .inp with v, compares with the id lines
 * of want_path (one line per input); returns the number of inputs. */
static int check_inputs(const kiln_vocab *v, const kiln_vocab *gguf, const char *want_path) {
    char path[1024];
    snprintf(path, sizeof path, "%s/testdata/tokenizer/ggml-vocab-llama-spm.gguf.inp",
             kt_shared_dir());
    size_t n = 0, wn = 0;
    char *inp = slurp(path, &n), *want = slurp(want_path, &wn);
    assert_non_null(inp);
    assert_non_null(want);
    char *p = inp, *w = want;
    int count = 0;
    while (p < inp + n) {
        char *e = strstr(p, SEP);
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char *wl = strchr(w, '\n');
        assert_non_null(wl);
        *wl = 0;
        kiln_tokens t = {0};
        assert_int_equal(kiln_tokenize(v, p, len, 0, &t, NULL), KILN_OK);
        char got[8192] = "";
        size_t gl = 0;
        for (size_t i = 0; i < t.n; i++)
            gl += (size_t)snprintf(got + gl, sizeof got - gl, i ? " %d" : "%d", t.ids[i]);
        if (strcmp(got, w) != 0)
            fail_msg("%s input %d '%.*s': kiln [%s], tokenizers [%s]", want_path, count,
                     (int)(len < 40 ? len : 40), p, got, w);
        if (gguf) {
            kiln_tokens g = {0};
            assert_int_equal(kiln_tokenize(gguf, p, len, 0, &g, NULL), KILN_OK);
            assert_int_equal(g.n, t.n);
            assert_memory_equal(g.ids, t.ids, t.n * sizeof(kiln_token));
            kiln_tokens_free(&g);
        }
        kiln_tokens_free(&t);
        count++;
        w = wl + 1;
        if (!e) break;
        p = e + strlen(SEP);
    }
    free(inp);
    free(want);
    return count;
}

/* The Prepend-style file as committed; the Metaspace style is the same file with the
 * normalizer and pre-tokenizer the generator writes for it (saves 1.4 MB of test data). */
static kiln_vocab *load_style(const char *style) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/tok/hf-spm/prepend/tokenizer.json", kt_source_dir());
    const char *use = path;
    if (strcmp(style, "metaspace") == 0) {
        json_t *root = json_load_file(path, 0, NULL);
        assert_non_null(root);
        json_object_set_new(root, "normalizer", json_null());
        json_object_set_new(root, "pre_tokenizer",
                            json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement",
                                      "\xE2\x96\x81", "prepend_scheme", "first", "split", 0));
        char *text = json_dumps(root, JSON_COMPACT);
        assert_non_null(text);
        use = kt_write_temp(text, strlen(text), ".json");
        free(text);
        json_decref(root);
    }
    kiln_vocab *v = NULL;
    kiln_err err;
    if (kiln_vocab_load_hf(use, NULL, &v, &err)) fail_msg("%s", err.msg);
    if (use != path) remove(use);
    return v;
}

static void test_prepend(void **state) {
    (void)state;
    kiln_vocab *v = load_style("prepend"), *g = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/testdata/tokenizer/ggml-vocab-llama-spm.gguf", kt_shared_dir());
    assert_int_equal(kiln_vocab_load_gguf(path, &g, NULL), KILN_OK);
    assert_int_equal(kiln_vocab_get_type(v), KILN_VOCAB_SPM);
    assert_int_equal(kiln_vocab_n_tokens(v), kiln_vocab_n_tokens(g));
    assert_int_equal(kiln_vocab_bos(v), 1);
    assert_int_equal(kiln_vocab_eos(v), 2);
    assert_int_equal(kiln_vocab_unk(v), 0);
    assert_true(kiln_vocab_add_bos(v));
    for (kiln_token t = 0; t < 300; t++)
        assert_int_equal(kiln_vocab_attr(v, t), kiln_vocab_attr(g, t));
    snprintf(path, sizeof path, "%s/tests/data/tok/hf-spm/prepend/ids.txt", kt_source_dir());
    int n = check_inputs(v, g, path);
    print_message("prepend: %d inputs identical to tokenizers and to the GGUF path\n", n);
    assert_true(n >= 40);
    kiln_vocab_free(v);
    kiln_vocab_free(g);
}

static void test_metaspace(void **state) {
    (void)state;
    kiln_vocab *v = load_style("metaspace");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/tok/hf-spm/metaspace/ids.txt", kt_source_dir());
    int n = check_inputs(v, NULL, path);
    print_message("metaspace: %d inputs identical to tokenizers\n", n);
    kiln_vocab_free(v);
}

static void test_rejects(void **state) {
    (void)state;
    const char *bad =
        "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {\"a\": 0},"
        " \"merges\": []}, \"normalizer\": {\"type\": \"NFKC\"}}";
    const char *p = kt_write_temp(bad, strlen(bad), ".json");
    kiln_vocab *v = NULL;
    kiln_err err;
    assert_int_equal(kiln_vocab_load_hf(p, NULL, &v, &err), KILN_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "NFKC"));
    remove(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prepend),
        cmocka_unit_test(test_metaspace),
        cmocka_unit_test(test_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
