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
#include "base/mem.h"
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
        bigram *p = kiln_realloc(h->a, nc * sizeof *p);
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

/* Memo of lookups for one call: the same character pairs recur all over a text, and a
 * probe of this small table is much cheaper than a lookup in the vocabulary's string
 * table. Direct-mapped; a collision just overwrites. */
typedef struct kiln_spm_memo_slot memo_slot;
struct kiln_spm_memo_slot {
    uint64_t key; /* 0 = empty */
    int32_t val;
};
typedef struct memo {
    memo_slot *slot;
    size_t mask;
} memo;

static inline size_t memo_mix(uint64_t k) {
    k ^= k >> 31;
    k *= 0x9E3779B97F4A7C15ULL;
    return (size_t)(k >> 20);
}

/* Token of text[off..off+n), through the memo when the text is the concatenation of two
 * known tokens (key: their ids) or a single character (key: its bytes). */
static int32_t lookup(const kiln_vocab *v, memo *m, uint64_t key, const char *p, size_t n) {
    memo_slot *sl = NULL;
    if (key && m->slot) {
        sl = &m->slot[memo_mix(key) & m->mask];
        if (sl->key == key) return sl->val;
    }
    int32_t id = kiln_strtab_find(&v->str, p, n);
    if (id >= 0 && (uint32_t)id >= v->n_tokens) id = -1;
    if (sl) sl->key = key, sl->val = id;
    return id;
}

static bool try_add(const kiln_vocab *v, memo *m, const char *text, sym *s, heap *h, int32_t l,
                    int32_t r) {
    if (l < 0 || r < 0) return true;
    uint32_t size = s[l].n + s[r].n;
    uint64_t key = 0;
    if (s[l].id >= 0 && s[r].id >= 0) /* tag 1 in the top bit: pair keys */
        key = (uint64_t)1 << 63 | (uint64_t)(uint32_t)s[l].id << 31 | (uint32_t)s[r].id;
    int32_t id = lookup(v, m, key, text + s[l].off, size);
    if (id < 0) return true;
    bigram b = {v->score[id], l, r, size, id};
    return heap_push(h, b);
}

kiln_status kiln_spm_tokenize(const kiln_vocab *v, kiln_pretok_buf *pb, const char *text,
                              size_t len, size_t total_len, kiln_tokens *out, kiln_err *err) {
    if (len == 0) return KILN_OK;
    if (len > INT32_MAX)
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "fragment of %zu bytes is too long", len);
    sym *s = kiln_malloc(sizeof(sym) * len);
    heap h = {0};
    if (!s) return kiln_err_set(err, KILN_ERR_NOMEM, "SPM symbols for %zu bytes", len);
    /* the memo lives for the whole kiln_tokenize call (all fragments) */
    if (!pb->spm_memo) {
        size_t slots = 1024;
        while (slots < 65536 && slots < total_len * 2) slots *= 2;
        pb->spm_memo = kiln_calloc(slots, sizeof(memo_slot)); /* NULL: no memo, still correct */
        pb->spm_memo_mask = slots - 1;
    }
    memo m = {pb->spm_memo, pb->spm_memo_mask};
    int32_t n = 0;
    for (size_t off = 0; off < len;) {
        size_t cl = kiln_tok_utf8_len((uint8_t)text[off]);
        if (cl > len - off) cl = len - off;
        s[n].off = (uint32_t)off;
        s[n].n = (uint32_t)cl;
        s[n].prev = n - 1;
        /* single characters: key = bit 62 | length | bytes (pairs: bit 63) */
        uint64_t key = (uint64_t)1 << 62 | (uint64_t)cl << 32;
        for (size_t j = 0; j < cl; j++) key |= (uint64_t)(uint8_t)text[off + j] << (8 * j);
        s[n].id = lookup(v, &m, key, text + off, cl);
        off += cl;
        s[n].next = off == len ? -1 : n + 1;
        n++;
    }
    kiln_status st = KILN_OK;
    for (int32_t i = 1; i < n; i++)
        if (!try_add(v, &m, text, s, &h, i - 1, i)) goto oom;
    while (h.n) {
        bigram b = heap_pop(&h);
        sym *l = &s[b.left], *r = &s[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;
        l->n += r->n;
        l->id = b.id;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = b.left;
        if (!try_add(v, &m, text, s, &h, l->prev, b.left) ||
            !try_add(v, &m, text, s, &h, b.left, l->next))
            goto oom;
    }
    for (int32_t i = 0; i != -1; i = s[i].next) {
        int32_t id = s[i].id;
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
    kiln_free(s);
    kiln_free(h.a);
    return st;
}
