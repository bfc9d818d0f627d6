/* test_exact_text.c — generated text is exact: what the streaming path hands out after a
 * prompt equals detokenize(prompt + generated, KILN_DETOK_SEQUENCE) minus
 * detokenize(prompt), and the prompt's text is detokenize(prompt). Checked
 *  - on the tokenizer level for the llama SPM vocabulary (add_space_prefix), GPT-2's
 *    byte-level BPE and Gemma 3's SPM (skipped with a message when the model is not in
 *    the cache), over English, code, CJK and emoji texts, splitting each token sequence
 *    at every token boundary where the prompt part is whole UTF-8 — including
 *    sequences where multi-byte characters are split across (byte) tokens, counted;
 *  - end to end through the public C API (kiln_generate's callback) on kiln-gen models
 *    with the llama SPM and GPT-2 vocabularies, sampling at a high temperature so byte
 *    tokens and odd pieces come out. */
#include "base/utf8.h"
#include "kiln/kiln.h"
#include "model/model.h"
#include "sample/text.h"
#include "testutil.h"
#include "tok/tok.h"

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

static bool valid_utf8(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int r = kiln_utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (r <= 0) return false;
        i += (size_t)r;
    }
    return true;
}

static char *seq_text(const kiln_vocab *v, const kiln_token *ids, size_t n, size_t *len) {
    char *t;
    assert_int_equal(kiln_detokenize(v, ids, n, KILN_DETOK_SEQUENCE, &t, len, NULL), KILN_OK);
    return t;
}

/* Streams ids[k..n) after prompt ids[0..k) and returns the text. */
static char *stream_after(const kiln_vocab *v, const kiln_token *ids, size_t k, size_t n,
                          size_t *len) {
    kiln_text_stream ts;
    assert_int_equal(kiln_text_stream_init(&ts, v, ids, k, NULL, 0, NULL), KILN_OK);
    size_t cap = 64, m = 0;
    char *out = malloc(cap);
    assert_non_null(out);
    for (size_t i = k; i <= n; i++) {
        const char *t;
        size_t tl;
        char *rest = NULL;
        if (i < n) {
            bool stopped;
            assert_int_equal(kiln_text_stream_push(&ts, ids[i], &t, &tl, &stopped, NULL), KILN_OK);
        } else {
            assert_int_equal(kiln_text_stream_finish(&ts, &rest, &tl, NULL), KILN_OK);
            t = rest;
        }
        if (m + tl + 1 > cap) {
            cap = (m + tl + 1) * 2;
            out = realloc(out, cap);
            assert_non_null(out);
        }
        memcpy(out + m, t, tl);
        m += tl;
        free(rest);
    }
    kiln_text_stream_free(&ts);
    out[m] = 0;
    *len = m;
    return out;
}

/* Returns how many token boundaries fell inside a UTF-8 character. */
static int check_text(const kiln_vocab *v, const char *text, size_t len, const char *what) {
    kiln_tokens t = {0};
    assert_int_equal(kiln_tokenize(v, text, len, KILN_TOK_ADD_SPECIAL, &t, NULL), KILN_OK);
    size_t wl;
    char *whole = seq_text(v, t.ids, t.n, &wl);
    if (wl != len || memcmp(whole, text, len) != 0)
        fail_msg("%s: detokenize(tokenize(text)) is not the text (%zu vs %zu bytes)", what, wl,
                 len);
    int split_chars = 0;
    for (size_t k = 0; k < t.n; k++) {
        size_t pl;
        char *pre = seq_text(v, t.ids, k, &pl);
        if (!valid_utf8(pre, pl)) { /* a boundary inside a character: no prompt ends there */
            split_chars++;
            free(pre);
            continue;
        }
        assert_true(pl <= wl && memcmp(pre, whole, pl) == 0);
        size_t gl;
        char *gen = stream_after(v, t.ids, k, t.n, &gl);
        if (gl != wl - pl || memcmp(gen, whole + pl, gl) != 0)
            fail_msg("%s: prompt of %zu tokens: streamed '%.60s' (%zu bytes), want '%.60s' (%zu)",
                     what, k, gen, gl, whole + pl, wl - pl);
        free(gen);
        free(pre);
    }
    free(whole);
    kiln_tokens_free(&t);
    return split_chars;
}

static void check_vocab(const kiln_vocab *v, const char *name) {
    static const char *const extra[] = {
        "The capital of France is Paris, además de ser la ciudad más grande.",
        " leading space, and  two  spaces\n\nnewlines\ttabs",
        "naïve café — 東京 🙂👍🏽 ελληνικά",
    };
    int split = 0;
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        split += check_text(v, extra[i], strlen(extra[i]), name);
    static const char *const files[] = {"english", "code", "cjk", "emoji"};
    for (size_t i = 0; i < 4; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tests/data/tok/gemma3/%s.txt", kt_source_dir(), files[i]);
        size_t n = 0;
        char *text = slurp(path, &n);
        assert_non_null(text);
        if (n > 1500) n = 1500; /* every split point is O(n^2): keep it to seconds */
        while (n > 0 && ((unsigned char)text[n] & 0xC0) == 0x80) n--;
        split += check_text(v, text, n, files[i]);
        free(text);
    }
    print_message("%s: %d token boundaries inside a UTF-8 character exercised\n", name, split);
    assert_true(split > 0);
}

static kiln_vocab *shared_vocab(const char *file) {
    char path[1024];
    snprintf(path, sizeof path, "%s/testdata/tokenizer/%s", kt_shared_dir(), file);
    kiln_vocab *v = NULL;
    assert_int_equal(kiln_vocab_load_gguf(path, &v, NULL), KILN_OK);
    return v;
}

static void test_llama_spm(void **state) {
    (void)state;
    kiln_vocab *v = shared_vocab("ggml-vocab-llama-spm.gguf");
    check_vocab(v, "llama-spm");
    kiln_vocab_free(v);
}

static void test_gpt2(void **state) {
    (void)state;
    kiln_vocab *v = shared_vocab("ggml-vocab-gpt-2.gguf");
    check_vocab(v, "gpt-2");
    kiln_vocab_free(v);
}

static const char *gemma_path(void) {
    static char path[1024];
    const char *cache = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (cache && *cache)
        snprintf(path, sizeof path, "%s/kiln/models/gemma-3-270m-q4_k_m.gguf", cache);
    else
        snprintf(path, sizeof path, "%s/.cache/kiln/models/gemma-3-270m-q4_k_m.gguf",
                 home ? home : ".");
    return path;
}

static void test_gemma(void **state) {
    (void)state;
    FILE *f = fopen(gemma_path(), "rb");
    if (!f) {
        print_message("skipped: %s absent (scripts/fetch-model.sh gemma3-270m)\n", gemma_path());
        skip();
    }
    fclose(f);
    kiln_vocab *v = NULL;
    assert_int_equal(kiln_vocab_load_gguf(gemma_path(), &v, NULL), KILN_OK);
    check_vocab(v, "gemma3");
    kiln_vocab_free(v);
}

/* ---- end to end: kiln_generate's callback ---- */

typedef struct collect {
    int32_t ids[256];
    int n;
    char text[8192];
    size_t len;
} collect;

static int on_token(void *user, int32_t token, const char *text, size_t len) {
    collect *c = user;
    if (token >= 0 && c->n < 256) c->ids[c->n++] = token;
    assert_true(c->len + len < sizeof c->text);
    memcpy(c->text + c->len, text, len);
    c->len += len;
    return 0;
}

static void generate_exact(const char *vocab_file, const char *prompt) {
    char vocab[1024], model[1024], cmd[4096];
    snprintf(vocab, sizeof vocab, "%s/testdata/tokenizer/%s", kt_shared_dir(), vocab_file);
    snprintf(model, sizeof model, "%s", kt_write_temp("", 0, ".gguf"));
    snprintf(cmd, sizeof cmd, "'%s/kiln-gen' -q -p tiny -f llama -t q8_0 -s 7 --vocab '%s' -o '%s'",
             getenv("KILN_BINARY_DIR"), vocab, model);
    assert_int_equal(system(cmd), 0);
    kiln_model *m = NULL;
    kiln_err *err = kiln_err_new();
    if (kiln_model_load(model, &m, err) || kiln_model_load_tokenizer(m, err))
        fail_msg("%s", kiln_err_message(err));
    kiln_engine_opts eo;
    kiln_engine_opts_default(&eo);
    eo.backend = "cpu";
    eo.n_threads = 2;
    kiln_engine *e = NULL;
    if (kiln_engine_create(m, &eo, &e, err)) fail_msg("%s", kiln_err_message(err));
    for (uint64_t seed = 1; seed <= 3; seed++) {
        kiln_gen_params p;
        kiln_gen_params_default(&p);
        p.n_predict = 48;
        p.temperature = 3.0f; /* far from greedy: byte tokens, odd pieces */
        p.top_k = 0;
        p.top_p = 1;
        p.min_p = 0;
        p.seed = seed;
        p.ignore_eos = 1;
        collect c;
        memset(&c, 0, sizeof c);
        if (kiln_generate(e, m, prompt, &p, on_token, &c, err))
            fail_msg("%s", kiln_err_message(err));
        int32_t ids[512], np;
        assert_int_equal(kiln_model_tokenize(m, prompt, strlen(prompt), 1, 0, ids, 256, &np, err),
                         KILN_OK);
        memcpy(ids + np, c.ids, (size_t)c.n * sizeof(int32_t));
        static char whole[16384], ptext[4096];
        size_t wl, pl;
        assert_int_equal(kiln_model_detokenize(m, ids, np, ptext, sizeof ptext, &pl, err), KILN_OK);
        assert_string_equal(ptext, prompt);
        assert_int_equal(kiln_model_detokenize(m, ids, np + c.n, whole, sizeof whole, &wl, err),
                         KILN_OK);
        /* the stream makes bytes that never form a character U+FFFD: compare where valid */
        if (valid_utf8(whole, wl)) {
            if (wl != pl + c.len || memcmp(whole + pl, c.text, c.len) != 0)
                fail_msg("%s seed %d: callback text '%.*s' != '%s' minus the prompt", vocab_file,
                         (int)seed, (int)c.len, c.text, whole);
        } else {
            print_message("%s seed %d: sequence text not valid UTF-8, prefix checked\n", vocab_file,
                          (int)seed);
            assert_true(memcmp(whole, prompt, pl) == 0);
        }
    }
    kiln_engine_free(e);
    kiln_model_free(m);
    kiln_err_free(err);
    remove(model);
}

static void test_generate_llama_spm(void **state) {
    (void)state;
    generate_exact("ggml-vocab-llama-spm.gguf", "The capital of France is");
}

static void test_generate_gpt2(void **state) {
    (void)state;
    generate_exact("ggml-vocab-gpt-2.gguf", "The capital of France is");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_spm),     cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_gemma),         cmocka_unit_test(test_generate_llama_spm),
        cmocka_unit_test(test_generate_gpt2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
