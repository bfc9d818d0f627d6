/* test_tok_gemma.c — the Gemma 3 270M tokenizer against llama.cpp's ids on the corpus
 * in tests/data/tok/gemma3 (English, code, CJK, emoji, white space, mixed with special
 * tokens and invalid UTF-8; made by scripts/gen-tok-goldens.py). Also checks that
 * detokenizing the ids gives the text back wherever the text is valid UTF-8. Skipped
 * (with a message) when the model is not in the cache. */
#include "base/utf8.h"
#include "testutil.h"
#include "tok/tok.h"
#include "tok/tok_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)l + 1);
    *n = fread(b, 1, (size_t)l, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

static kiln_vocab *g_vocab;

static int setup(void **state) {
    (void)state;
    char path[1024];
    const char *cache = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (cache && *cache)
        snprintf(path, sizeof path, "%s/kiln/models/gemma-3-270m-q4_k_m.gguf", cache);
    else
        snprintf(path, sizeof path, "%s/.cache/kiln/models/gemma-3-270m-q4_k_m.gguf",
                 home ? home : "");
    if (access(path, R_OK) != 0) {
        print_message("skipped: %s absent (scripts/fetch-model.sh gemma3-270m)\n", path);
        return 0;
    }
    kiln_err e;
    if (kiln_vocab_load_gguf(path, &g_vocab, &e)) {
        print_message("loading %s: %s\n", path, e.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    kiln_vocab_free(g_vocab);
    return 0;
}

static void check1(const char *name, const char *ids_suffix, unsigned flags) {
    if (!g_vocab) skip();
    char tp[1024], ip[1024];
    snprintf(tp, sizeof tp, "%s/tests/data/tok/gemma3/%s.txt", kt_source_dir(), name);
    snprintf(ip, sizeof ip, "%s/tests/data/tok/gemma3/%s%s", kt_source_dir(), name, ids_suffix);
    size_t tn = 0, in = 0;
    char *text = read_file(tp, &tn), *ids = read_file(ip, &in);
    assert_non_null(text);
    assert_non_null(ids);
    kiln_tokens t = {0};
    kiln_err e;
    assert_int_equal(kiln_tokenize(g_vocab, text, tn, flags, &t, &e), KILN_OK);
    size_t k = 0;
    for (char *p = ids;; k++) {
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p) break;
        p = end;
        if (k >= t.n || t.ids[k] != id)
            fail_msg("%s: token %zu is %d, llama.cpp has %ld", name, k, k < t.n ? t.ids[k] : -1,
                     id);
    }
    assert_int_equal(t.n, k);
    assert_true(k > 1000);
    assert_true(t.n > 0);
    if (kiln_utf8_valid(text, tn, NULL) && !(flags & KILN_TOK_PARSE_SPECIAL) &&
        !(flags & KILN_TOK_TEST_SCAN_PARTITION)) {
        char *back;
        size_t bl;
        assert_int_equal(
            kiln_detokenize(g_vocab, t.ids, t.n, KILN_DETOK_UNPARSE_SPECIAL, &back, &bl, &e),
            KILN_OK);
        assert_int_equal(bl, tn);
        assert_memory_equal(back, text, tn);
        free(back);
    }
    kiln_tokens_free(&t);
    free(text);
    free(ids);
}

/* Each file twice: the partition's trie path and its per-token scan must agree. */
static void check(const char *name, const char *ids_suffix, unsigned flags) {
    check1(name, ids_suffix, flags);
    check1(name, ids_suffix, flags | KILN_TOK_TEST_SCAN_PARTITION);
}

static void test_english(void **s) {
    (void)s, check("english", ".ids", 0);
}
static void test_code(void **s) {
    (void)s, check("code", ".ids", 0);
}
static void test_cjk(void **s) {
    (void)s, check("cjk", ".ids", 0);
}
static void test_emoji(void **s) {
    (void)s, check("emoji", ".ids", 0);
}
static void test_spaces(void **s) {
    (void)s, check("spaces", ".ids", 0);
}
static void test_mixed(void **s) {
    (void)s, check("mixed", ".ids", 0);
}
static void test_mixed_special(void **s) {
    (void)s, check("mixed", ".special.ids", KILN_TOK_PARSE_SPECIAL);
}
/* long runs: so many overlapping special-token matches that kiln switches to its
 * per-token scan of the partition */
static void test_runs(void **s) {
    (void)s, check("runs", ".ids", 0);
}
static void test_runs_special(void **s) {
    (void)s, check("runs", ".special.ids", KILN_TOK_PARSE_SPECIAL);
}

/* Metadata the runtime relies on. */
static void test_specials(void **state) {
    (void)state;
    if (!g_vocab) skip();
    assert_int_equal(kiln_vocab_get_type(g_vocab), KILN_VOCAB_SPM);
    assert_int_equal(kiln_vocab_bos(g_vocab), 2);
    assert_int_equal(kiln_vocab_eos(g_vocab), 1);
    assert_true(kiln_vocab_add_bos(g_vocab));
    kiln_token eot = kiln_vocab_find(g_vocab, "<end_of_turn>", 13);
    assert_int_equal(kiln_vocab_eot(g_vocab), eot);
    assert_true(kiln_vocab_is_eog(g_vocab, eot));
    assert_true(kiln_vocab_is_eog(g_vocab, 1));
    kiln_tokens t = {0};
    kiln_err e;
    const char *p = "<start_of_turn>user\nHi<end_of_turn>";
    assert_int_equal(
        kiln_tokenize(g_vocab, p, strlen(p), KILN_TOK_ADD_SPECIAL | KILN_TOK_PARSE_SPECIAL, &t, &e),
        KILN_OK);
    assert_int_equal(t.ids[0], 2);
    assert_int_equal(t.ids[t.n - 1], eot);
    kiln_tokens_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_english),       cmocka_unit_test(test_code),
        cmocka_unit_test(test_cjk),           cmocka_unit_test(test_emoji),
        cmocka_unit_test(test_spaces),        cmocka_unit_test(test_mixed),
        cmocka_unit_test(test_mixed_special), cmocka_unit_test(test_runs),
        cmocka_unit_test(test_runs_special),  cmocka_unit_test(test_specials),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
