/*
 * vocab.c — the built-in SentencePiece-style vocabulary.
 *
 * Layout: 0 <unk> (unknown), 1 <s> (control, BOS), 2 </s> (control, EOS), 3..258 byte
 * tokens <0x00>..<0xFF> (byte fallback), then normal pieces in priority order: single
 * characters (letters, digits, punctuation, U+2581 "▁" the SentencePiece space), then
 * "▁" + each letter, then longer pieces. Every piece of two or more characters is an
 * earlier piece plus one character, so it is reachable by merges (llama.cpp's SPM
 * tokenizer merges by score; the HF tokenizer.json lists the merges explicitly).
 * Scores: byte and special tokens 0, piece i gets -(i - first piece).
 */
#include "gen.h"
#include "base/mem.h"

#include "format/gguf.h"
#include "format/meta.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPACE "\xe2\x96\x81" /* U+2581 */

static const char *const WORDS[] = {
    "the",  "of",     "and",  "to",    "in",    "is",     "that", "it",    "was",    "for",
    "on",   "are",    "as",   "with",  "he",    "she",    "they", "at",    "be",     "this",
    "have", "from",   "or",   "one",   "had",   "by",     "word", "but",   "not",    "what",
    "all",  "were",   "we",   "when",  "your",  "can",    "said", "there", "use",    "an",
    "each", "which",  "do",   "how",   "their", "if",     "will", "up",    "other",  "about",
    "out",  "many",   "then", "them",  "these", "so",     "some", "her",   "would",  "make",
    "like", "him",    "into", "time",  "has",   "look",   "two",  "more",  "write",  "go",
    "see",  "number", "no",   "way",   "could", "people", "my",   "than",  "first",  "water",
    "been", "call",   "who",  "oil",   "its",   "now",    "find", "long",  "down",   "day",
    "did",  "get",    "come", "made",  "may",   "part",   "once", "upon",  "little", "girl",
    "boy",  "cat",    "dog",  "happy", "big",   "tree",   "sun",
};

typedef struct vb {
    gen_vocab *v;
    size_t cap;
    uint32_t *set; /* open addressing: token index + 1, 0 = empty */
    size_t set_cap;
    bool oom;
} vb;

static uint64_t hash_bytes(const char *s, size_t len) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h;
}

/* Slot of s in the set: where it is, or the empty slot where it would go. */
static size_t slot(const vb *b, const char *s, size_t len) {
    size_t i = (size_t)hash_bytes(s, len) & (b->set_cap - 1);
    while (b->set[i]) {
        const size_t t = b->set[i] - 1;
        if (b->v->lens[t] == len && memcmp(b->v->tokens[t], s, len) == 0) break;
        i = (i + 1) & (b->set_cap - 1);
    }
    return i;
}

static bool has(const vb *b, const char *s, size_t len) {
    return b->set[slot(b, s, len)] != 0;
}

/* Adds s unless present or full. */
static void push(vb *b, const char *s, size_t len, float score, int32_t type) {
    gen_vocab *v = b->v;
    if (b->oom || v->n >= b->cap) return;
    const size_t i = slot(b, s, len);
    if (b->set[i]) return;
    char *p = kiln_malloc(len + 1);
    if (!p) {
        b->oom = true;
        return;
    }
    memcpy(p, s, len);
    p[len] = 0;
    v->tokens[v->n] = p;
    v->lens[v->n] = len;
    v->scores[v->n] = score;
    v->types[v->n] = type;
    b->set[i] = (uint32_t)(v->n + 1);
    v->n++;
}

kiln_status gen_vocab_builtin(size_t n, gen_vocab *v, kiln_err *err) {
    memset(v, 0, sizeof *v);
    if (n < 300 || n > ((size_t)1 << 24))
        return kiln_err_set(err, KILN_ERR_RANGE,
                            "vocab size %zu outside 300..2^24 for the built-in vocabulary", n);
    vb b = {v, n, NULL, 1, false};
    while (b.set_cap < 2 * n) b.set_cap *= 2;
    b.set = kiln_calloc(b.set_cap, sizeof *b.set);
    v->tokens = kiln_calloc(n, sizeof *v->tokens);
    v->lens = kiln_calloc(n, sizeof *v->lens);
    v->scores = kiln_calloc(n, sizeof *v->scores);
    v->types = kiln_calloc(n, sizeof *v->types);
    if (!b.set || !v->tokens || !v->lens || !v->scores || !v->types) b.oom = true;
    v->builtin = true;
    v->unk_id = 0, v->bos_id = 1, v->eos_id = 2;
    snprintf(v->model, sizeof v->model, "llama");
    snprintf(v->pre, sizeof v->pre, "default");
    v->add_bos = v->add_space_prefix = true;
    if (!b.oom) {
        push(&b, "<unk>", 5, 0, 2);
        push(&b, "<s>", 3, 0, 3);
        push(&b, "</s>", 4, 0, 3);
        for (int i = 0; i < 256; i++) {
            char s[8];
            snprintf(s, sizeof s, "<0x%02X>", i);
            push(&b, s, 6, 0, 6);
        }
    }
    const size_t first = v->n;
#define PIECE(s, l) push(&b, s, l, -(float)(v->n - first), 1)
    static const char chars[] = "etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZ"
                                "0123456789.,!?'\"-:;()";
    static const char lower[] = "etaoinshrdlcumwfgypbvkjxqz";
    char buf[64];
    if (!b.oom) {
        PIECE(SPACE, 3);
        for (const char *c = chars; *c; c++) PIECE(c, 1);
        memcpy(buf, SPACE, 3);
        for (const char *c = chars; *c && c - chars < 52; c++) {
            buf[3] = *c;
            PIECE(buf, 4);
        }
        /* whole words "▁word", with their prefixes so each is one merge away */
        for (size_t w = 0; w < sizeof WORDS / sizeof WORDS[0]; w++) {
            const size_t wl = strlen(WORDS[w]);
            for (size_t k = 2; k <= wl; k++) {
                memcpy(buf + 3, WORDS[w], k);
                PIECE(buf, 3 + k);
            }
        }
    }
    /* then every lowercase string of length 2, 3, ... and "▁" + it, in an order where
     * s[:-1] (and "▁" + s[:-1]) always come first */
    for (int len = 2; len <= 6 && v->n < n && !b.oom; len++) {
        long long combos = 1;
        for (int k = 0; k < len; k++) combos *= 26;
        for (long long c = 0; c < combos && v->n < n && !b.oom; c++) {
            long long x = c;
            char s[8];
            for (int k = len - 1; k >= 0; k--, x /= 26) s[k] = lower[x % 26];
            PIECE(s, (size_t)len);
            memcpy(buf + 3, s, (size_t)len);
            if (has(&b, buf, 3 + (size_t)len - 1)) PIECE(buf, 3 + (size_t)len);
        }
    }
#undef PIECE
    kiln_free(b.set);
    if (b.oom) {
        gen_vocab_free(v);
        return kiln_err_set(err, KILN_ERR_NOMEM, "building the built-in vocabulary");
    }
    if (v->n < n) {
        size_t got = v->n;
        gen_vocab_free(v);
        return kiln_err_set(err, KILN_ERR_RANGE,
                            "built-in vocabulary stops at %zu tokens (%zu asked)", got, n);
    }
    return KILN_OK;
}

static char *dup_bytes(const char *p, size_t n) {
    char *s = kiln_malloc(n + 1);
    if (s) {
        memcpy(s, p, n);
        s[n] = 0;
    }
    return s;
}

kiln_status gen_vocab_from_gguf(const char *path, gen_vocab *v, kiln_err *err) {
    memset(v, 0, sizeof *v);
    kiln_gguf *g;
    KILN_TRY(kiln_gguf_open(path, 0, &g, err));
    v->src = g;
    const kiln_meta *m = kiln_gguf_meta(g);
    const kiln_meta_value *toks, *arr;
    kiln_status st = kiln_meta_get_arr(m, "tokenizer.ggml.tokens", KILN_META_STRING, &toks, err);
    if (st) goto fail;
    const size_t n = (size_t)toks->count;
    v->tokens = kiln_calloc(n ? n : 1, sizeof *v->tokens);
    v->lens = kiln_calloc(n ? n : 1, sizeof *v->lens);
    v->scores = kiln_calloc(n ? n : 1, sizeof *v->scores);
    v->types = kiln_calloc(n ? n : 1, sizeof *v->types);
    if (!v->tokens || !v->lens || !v->scores || !v->types) goto oom;
    for (size_t i = 0; i < n; i++) {
        kiln_str s;
        kiln_meta_arr_str(toks, i, &s);
        if (!(v->tokens[i] = dup_bytes(s.ptr, s.len))) goto oom;
        v->lens[i] = s.len;
        v->types[i] = 1;
        v->n = i + 1;
    }
    if (kiln_meta_has(m, "tokenizer.ggml.scores")) {
        st = kiln_meta_get_arr(m, "tokenizer.ggml.scores", -1, &arr, err);
        if (!st && arr->count != n)
            st = kiln_err_set(err, KILN_ERR_FORMAT,
                              "tokenizer.ggml.scores has %llu entries, %zu tokens",
                              (unsigned long long)arr->count, n);
        if (!st) st = kiln_meta_arr_copy_f32(arr, v->scores, n, "tokenizer.ggml.scores", err);
        if (st) goto fail;
    }
    if (kiln_meta_has(m, "tokenizer.ggml.token_type")) {
        st = kiln_meta_get_arr(m, "tokenizer.ggml.token_type", -1, &arr, err);
        if (!st && arr->count != n)
            st = kiln_err_set(err, KILN_ERR_FORMAT,
                              "tokenizer.ggml.token_type has %llu entries, %zu tokens",
                              (unsigned long long)arr->count, n);
        if (!st) st = kiln_meta_arr_copy_i32(arr, v->types, n, "tokenizer.ggml.token_type", err);
        if (st) goto fail;
    }
    kiln_str s;
    if ((st = kiln_meta_opt_str(m, "tokenizer.ggml.model", "llama", &s, err))) goto fail;
    snprintf(v->model, sizeof v->model, "%.*s", (int)s.len, s.ptr);
    if ((st = kiln_meta_opt_str(m, "tokenizer.ggml.pre", "default", &s, err))) goto fail;
    snprintf(v->pre, sizeof v->pre, "%.*s", (int)s.len, s.ptr);
    /* llama.cpp's defaults: SPM adds BOS and a space prefix, BPE neither */
    const bool spm = strcmp(v->model, "llama") == 0;
    if ((st = kiln_meta_opt_bool(m, "tokenizer.ggml.add_bos_token", spm, &v->add_bos, err)))
        goto fail;
    if ((st = kiln_meta_opt_bool(m, "tokenizer.ggml.add_space_prefix", spm, &v->add_space_prefix,
                                 err)))
        goto fail;
    int64_t id;
    if ((st = kiln_meta_opt_i64(m, "tokenizer.ggml.bos_token_id", -1, &id, err))) goto fail;
    v->bos_id = id;
    if ((st = kiln_meta_opt_i64(m, "tokenizer.ggml.eos_token_id", -1, &id, err))) goto fail;
    v->eos_id = id;
    if ((st = kiln_meta_opt_i64(m, "tokenizer.ggml.unknown_token_id", -1, &id, err))) goto fail;
    v->unk_id = id;
    if (kiln_meta_has(m, "tokenizer.ggml.merges")) {
        if ((st = kiln_meta_get_arr(m, "tokenizer.ggml.merges", KILN_META_STRING, &arr, err)))
            goto fail;
        v->merges = kiln_calloc(arr->count ? arr->count : 1, sizeof *v->merges);
        v->merge_lens = kiln_calloc(arr->count ? arr->count : 1, sizeof *v->merge_lens);
        if (!v->merges || !v->merge_lens) goto oom;
        for (uint64_t i = 0; i < arr->count; i++) {
            kiln_meta_arr_str(arr, i, &s);
            if (!(v->merges[i] = dup_bytes(s.ptr, s.len))) goto oom;
            v->merge_lens[i] = s.len;
            v->n_merges = i + 1;
        }
    }
    return KILN_OK;
oom:
    st = kiln_err_set(err, KILN_ERR_NOMEM, "reading the vocabulary");
fail:
    gen_vocab_free(v);
    return kiln_err_wrap(err, st, "vocabulary %s", path);
}

void gen_vocab_free(gen_vocab *v) {
    if (v->merges)
        for (size_t i = 0; i < v->n_merges; i++) kiln_free(v->merges[i]);
    kiln_free(v->merges);
    kiln_free(v->merge_lens);
    kiln_gguf_close(v->src);
    if (v->tokens)
        for (size_t i = 0; i < v->n; i++) kiln_free(v->tokens[i]);
    kiln_free(v->tokens);
    kiln_free(v->lens);
    kiln_free(v->scores);
    kiln_free(v->types);
    memset(v, 0, sizeof *v);
}
