/*
 * fuzz_tokenizer.c — libFuzzer target for tokenizer input: arbitrary bytes go through
 * kiln_tokenize (both flags), kiln_detokenize and the streaming detokenizer, on an SPM
 * and a byte-level BPE vocabulary. Checks, beyond "no crash / no sanitizer report":
 *   - every id is in range;
 *   - the streaming detokenizer only ever emits valid UTF-8;
 *   - for valid UTF-8 input without special-token text, BPE and SPM detokenize back to
 *     the input (SPM: after its leading-space rule).
 * Vocabularies: the llama-spm and gpt-2 vocab GGUFs of $KILN_SHARED_DIR/testdata/tokenizer
 * (or ../shared, tests/data/shared); without them a small synthetic SPM vocabulary.
 *
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DKILN_FUZZ=ON && cmake --build build-fuzz
 *   build-fuzz/tests/fuzz_tokenizer tests/fuzz/corpus/fuzz_tokenizer
 */
#include "base/utf8.h"
#include "tok/tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static kiln_vocab *g_vocab[3];
static int g_n;

static kiln_vocab *try_load(const char *name) {
    static const char *dirs[] = {"", "../shared", "../../shared", "tests/data/shared",
                                 "../tests/data/shared"};
    const char *env = getenv("KILN_SHARED_DIR");
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        const char *d = i == 0 ? env : dirs[i];
        if (!d) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/testdata/tokenizer/ggml-vocab-%s.gguf", d, name);
        if (access(p, R_OK) != 0) continue;
        kiln_vocab *v;
        kiln_err e;
        if (kiln_vocab_load_gguf(p, &v, &e) == KILN_OK) return v;
        fprintf(stderr, "fuzz_tokenizer: %s\n", e.msg);
    }
    return NULL;
}

static kiln_vocab *synthetic(void) {
    static char hex[256][8];
    static kiln_str toks[300];
    static int32_t types[300];
    static float scores[300];
    static const char *extra[] = {"\xe2\x96\x81",  "a",  "b",     "ab",
                                  "\xe2\x96\x81t", "he", "<ctl>", "\xe6\x97\xa5"};
    size_t n = 0;
    toks[n] = (kiln_str){"<unk>", 5}, types[n++] = 2;
    toks[n] = (kiln_str){"<s>", 3}, types[n++] = 3;
    toks[n] = (kiln_str){"</s>", 4}, types[n++] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(hex[b], 8, "<0x%02X>", b);
        toks[n] = (kiln_str){hex[b], 6}, types[n++] = 6;
    }
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        toks[n] = (kiln_str){extra[i], strlen(extra[i])};
        types[n] = strcmp(extra[i], "<ctl>") == 0 ? 3 : 1;
        scores[n++] = -(float)i;
    }
    kiln_vocab_desc d;
    kiln_vocab_desc_init(&d);
    d.model = "llama";
    d.n_tokens = n;
    d.tokens = toks;
    d.token_type = types;
    d.scores = scores;
    kiln_vocab *v;
    kiln_err e;
    if (kiln_vocab_create(&d, &v, &e)) {
        fprintf(stderr, "fuzz_tokenizer: synthetic vocab: %s\n", e.msg);
        abort();
    }
    return v;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g_vocab[g_n++] = synthetic();
    kiln_vocab *v;
    if ((v = try_load("llama-spm"))) g_vocab[g_n++] = v;
    if ((v = try_load("gpt-2"))) g_vocab[g_n++] = v;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const kiln_vocab *v = g_vocab[data[0] % g_n];
    unsigned flags = (data[0] >> 4) & 3;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    kiln_tokens t = {0};
    kiln_err e;
    if (kiln_tokenize(v, text, len, flags, &t, &e) != KILN_OK) {
        /* only resource errors are acceptable */
        if (e.code != KILN_ERR_NOMEM && e.code != KILN_ERR_UNSUPPORTED) abort();
        return 0;
    }
    size_t nv = kiln_vocab_n_tokens(v);
    for (size_t i = 0; i < t.n; i++)
        if (t.ids[i] < 0 || (size_t)t.ids[i] >= nv) abort();
    char *back;
    size_t bl;
    if (kiln_detokenize(v, t.ids, t.n, KILN_DETOK_UNPARSE_SPECIAL, &back, &bl, &e) != KILN_OK)
        abort();
    /* valid UTF-8, no special-token text parsed, no clean-up rules: exact round trip */
    bool plain = kiln_utf8_valid(text, len, NULL) && !(flags & KILN_TOK_PARSE_SPECIAL) &&
                 kiln_vocab_get_type(v) == KILN_VOCAB_BPE && !memchr(text, '\'', len) &&
                 !memchr(text, '?', len) && !memchr(text, '!', len) && !memchr(text, '.', len) &&
                 !memchr(text, ',', len);
    if (plain && (bl != len || memcmp(back, text, len) != 0)) abort();
    free(back);
    kiln_detok_stream *s;
    if (kiln_detok_stream_create(v, true, &s, &e) != KILN_OK) abort();
    for (size_t i = 0; i < t.n; i++) {
        const char *o;
        size_t ol;
        if (kiln_detok_stream_push(s, t.ids[i], &o, &ol, &e) != KILN_OK) abort();
        if (!kiln_utf8_valid(o, ol, NULL)) abort();
    }
    const char *o;
    size_t ol;
    kiln_detok_stream_flush(s, &o, &ol);
    if (!kiln_utf8_valid(o, ol, NULL)) abort();
    kiln_detok_stream_free(s);
    kiln_tokens_free(&t);
    return 0;
}
