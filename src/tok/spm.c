/*
 * spm.c — SentencePiece-style (SPM) tokenization of one raw fragment, as llama.cpp's
 * llm_tokenizer_spm_session does it:
 *   1. split the text into UTF-8 characters (by lead byte; a stray byte is one symbol);
 *   2. every adjacent pair whose concatenation is a token is a candidate; repeatedly
 *      merge the candidate with the highest token score (ties: leftmost), skipping
 *      candidates whose symbols have changed since they were queued;
 *   3. each final symbol is its token, or, when it is not a token (a character missing
 *      from the vocabulary), one <0xXX> byte token per byte.
 * The caller has already prefixed the space and replaced ' ' by U+2581.
 */
#include "tok/tok_impl.h"
#include "tok/unicode.h"

#include <stdlib.h>

typedef struct sym {
    int32_t prev, next;
    uint32_t off, n;
    int32_t id; /* token of the current text, -1 when unknown */
} sym;

typedef struct bigram {
    float score;
    int32_t left, right;
    uint32_t size;
    int32_t id;
} bigram;

/* max-heap on (score, -left) */
static inline bool bg_before(const bigram *a, const bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

typedef struct heap {
    bigram *a;
    size_t n, cap;
} heap;

static bool heap_push(heap *h, bigram b) {
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 256;
        bigram *p = realloc(h->a, nc * sizeof *p);
        if (!p) return false;
        h->a = p;
        h->cap = nc;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bg_before(&b, &h->a[parent])) break;
        h->a[i] = h->a[parent];
        i = parent;
    }
    h->a[i] = b;
    return true;
}

static bigram heap_pop(heap *h) {
    bigram top = h->a[0], last = h->a[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t l = 2 * i + 1, best = i;
        const bigram *bb = &last;
        if (l < n && bg_before(&h->a[l], bb)) best = l, bb = &h->a[l];
        if (l + 1 < n && bg_before(&h->a[l + 1], bb)) best = l + 1;
        if (best == i) break;
        h->a[i] = h->a[best];
        i = best;
    }
    if (n) h->a[i] = last;
    return top;
}

static bool try_add(const kiln_vocab *v, const char *text, sym *s, heap *h, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return true;
    uint32_t size = s[l].n + s[r].n;
    int32_t id = kiln_strtab_find(&v->str, text + s[l].off, size);
    if (id < 0 || (uint32_t)id >= v->n_tokens) return true;
    bigram b = {v->score[id], l, r, size, id};
    return heap_push(h, b);
}

kiln_status kiln_spm_tokenize(const kiln_vocab *v, const char *text, size_t len, kiln_tokens *out,
                              kiln_err *err) {
    if (len == 0) return KILN_OK;
    if (len > INT32_MAX)
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "fragment of %zu bytes is too long", len);
    sym *s = malloc(sizeof(sym) * len);
    heap h = {0};
    if (!s) return kiln_err_set(err, KILN_ERR_NOMEM, "SPM symbols for %zu bytes", len);
    int32_t n = 0;
    for (size_t off = 0; off < len;) {
        size_t cl = kiln_tok_utf8_len((uint8_t)text[off]);
        if (cl > len - off) cl = len - off;
        s[n].off = (uint32_t)off;
        s[n].n = (uint32_t)cl;
        s[n].prev = n - 1;
        off += cl;
        s[n].next = off == len ? -1 : n + 1;
        s[n].id = -2; /* not looked up yet */
        n++;
    }
    kiln_status st = KILN_OK;
    for (int32_t i = 1; i < n; i++)
        if (!try_add(v, text, s, &h, i - 1, i)) goto oom;
    while (h.n) {
        bigram b = heap_pop(&h);
        sym *l = &s[b.left], *r = &s[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;
        l->n += r->n;
        l->id = b.id;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = b.left;
        if (!try_add(v, text, s, &h, l->prev, b.left) || !try_add(v, text, s, &h, b.left, l->next))
            goto oom;
    }
    for (int32_t i = 0; i != -1; i = s[i].next) {
        int32_t id = s[i].id;
        if (id == -2) {
            id = kiln_strtab_find(&v->str, text + s[i].off, s[i].n);
            if (id >= 0 && (uint32_t)id >= v->n_tokens) id = -1;
        }
        if (id >= 0) {
            if (!kiln_tokens_push(out, id)) goto oom;
            continue;
        }
        for (uint32_t j = 0; j < s[i].n; j++) {
            uint8_t byte = (uint8_t)text[s[i].off + j];
            int32_t bt = v->byte_tok[byte];
            if (bt < 0) bt = v->unk; /* llama.cpp throws here; kiln falls back to unk */
            if (bt < 0) {
                st = kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                                  "byte 0x%02X has no token (<0x%02X>) and there is no unknown "
                                  "token",
                                  byte, byte);
                goto done;
            }
            if (!kiln_tokens_push(out, bt)) goto oom;
        }
    }
    goto done;
oom:
    st = kiln_err_set(err, KILN_ERR_NOMEM, "SPM tokenization of %zu bytes: out of memory", len);
done:
    free(s);
    free(h.a);
    return st;
}
