/*
 * bpe.c — byte-level BPE of one raw fragment, as llama.cpp's llm_tokenizer_bpe_session:
 *   1. the pre-tokenizer splits the (sanitized) text into pieces (pretok.c);
 *   2. a piece starts as one symbol per byte (GPT-2 byte map: each byte is one
 *      character of the token alphabet) or, without the byte map, per UTF-8 char;
 *   3. repeatedly merge the adjacent pair with the lowest merge rank (ties: leftmost);
 *   4. each final symbol is its token; a symbol that is no token falls back to
 *      single-byte tokens of its text where they exist (and is dropped otherwise).
 * With ignore_merges (llama3 and others), a piece that is itself a token is emitted
 * whole. Merges work on integer ids (tok_impl.h), so no strings are built here.
 */
#include "tok/tok_impl.h"
#include "base/mem.h"
#include "tok/unicode.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define NO_RANK  UINT32_MAX
#define SCAN_MAX 24 /* pieces up to this many symbols use a linear scan, longer a heap */

typedef struct bg {
    uint32_t rank;
    int32_t left, right;
    int32_t lid, rid;
    int32_t merged;
} bg;

static inline bool bg_before(const bg *a, const bg *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static inline bool pair_rank(const kiln_vocab *v, int32_t l, int32_t r, uint32_t *rank,
                             int32_t *merged) {
    if (l < 0 || r < 0) return false;
    uint64_t val;
    if (!kiln_u64map_get(&v->merges, ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1, &val))
        return false;
    *rank = (uint32_t)(val >> 32);
    *merged = (int32_t)(uint32_t)val;
    return true;
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (*cap >= need) return true;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    if (nc > SIZE_MAX / elem) return false;
    void *q = kiln_realloc(*p, nc * elem);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}

static bool ws_reserve(kiln_pretok_buf *b, size_t n) {
    if (b->s_cap >= n) return true;
    size_t nc = b->s_cap ? b->s_cap : 64;
    while (nc < n) nc *= 2;
    int32_t *a = kiln_realloc(b->s_id, nc * sizeof(int32_t));
    if (a) b->s_id = a;
    int32_t *c = kiln_realloc(b->s_prev, nc * sizeof(int32_t));
    if (c) b->s_prev = c;
    int32_t *d = kiln_realloc(b->s_next, nc * sizeof(int32_t));
    if (d) b->s_next = d;
    uint32_t *e = kiln_realloc(b->s_off, nc * sizeof(uint32_t));
    if (e) b->s_off = e;
    uint32_t *f = kiln_realloc(b->s_len, nc * sizeof(uint32_t));
    if (f) b->s_len = f;
    uint32_t *g = kiln_realloc(b->s_rank, nc * sizeof(uint32_t));
    if (g) b->s_rank = g;
    if (!a || !c || !d || !e || !f || !g) return false;
    b->s_cap = nc;
    return true;
}

static bool heap_push(kiln_pretok_buf *b, bg x) {
    if (!grow(&b->heap, &b->heap_cap, b->heap_n + 1, sizeof(bg))) return false;
    bg *h = b->heap;
    size_t i = b->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bg_before(&x, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
    return true;
}

static bg heap_pop(kiln_pretok_buf *b) {
    bg *h = b->heap;
    bg top = h[0], last = h[--b->heap_n];
    size_t i = 0, n = b->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, best = i;
        const bg *bb = &last;
        if (l < n && bg_before(&h[l], bb)) best = l, bb = &h[l];
        if (l + 1 < n && bg_before(&h[l + 1], bb)) best = l + 1;
        if (best == i) break;
        h[i] = h[best];
        i = best;
    }
    if (n) h[i] = last;
    return top;
}

static bool heap_add(const kiln_vocab *v, kiln_pretok_buf *b, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return true;
    bg x;
    if (!pair_rank(v, b->s_id[l], b->s_id[r], &x.rank, &x.merged)) return true;
    x.left = l, x.right = r, x.lid = b->s_id[l], x.rid = b->s_id[r];
    return heap_push(b, x);
}

/* Encoded (token-alphabet) text of raw bytes: GPT-2 byte map or identity. */
static size_t encode_bytes(const kiln_vocab *v, const char *s, size_t n, char *out) {
    if (!v->pretok.byte_encode) {
        memcpy(out, s, n);
        return n;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += (size_t)kiln_tok_encode(kiln_tok_byte_to_cpt((uint8_t)s[i]), out + k);
    return k;
}

static kiln_status emit_symbol(const kiln_vocab *v, kiln_pretok_buf *b, const char *text, int32_t i,
                               kiln_tokens *out, kiln_err *err) {
    int32_t id = b->s_id[i];
    if (id >= 0 && (uint32_t)id < v->n_tokens) {
        if (!kiln_tokens_push(out, id)) goto oom;
        return KILN_OK;
    }
    /* not a token: single-byte tokens of the symbol's text, where they exist */
    const char *s = text + b->s_off[i];
    size_t n = b->s_len[i];
    if (v->pretok.byte_encode) {
        if (!grow((void **)&b->enc, &b->enc_cap, n * 2 + 1, 1)) goto oom;
        size_t en = encode_bytes(v, s, n, b->enc);
        for (size_t j = 0; j < en; j++) {
            int32_t t = v->byte_tok[(uint8_t)b->enc[j]];
            if (t >= 0 && !kiln_tokens_push(out, t)) goto oom;
        }
    } else {
        for (size_t j = 0; j < n; j++) {
            int32_t t = v->byte_tok[(uint8_t)s[j]];
            if (t >= 0 && !kiln_tokens_push(out, t)) goto oom;
        }
    }
    return KILN_OK;
oom:
    return kiln_err_set(err, KILN_ERR_NOMEM, "BPE: out of memory");
}

static kiln_status bpe_piece(const kiln_vocab *v, kiln_pretok_buf *b, const char *text, uint32_t pa,
                             uint32_t pb, kiln_tokens *out, kiln_err *err) {
    size_t plen = pb - pa;
    const char *p = text + pa;
    bool whole = false;
    if (v->ignore_merges || (v->gemma4_newlines && plen > 0 && p[0] == '\n')) {
        bool only_nl = true;
        if (!v->ignore_merges)
            for (size_t j = 0; j < plen && only_nl; j++) only_nl = p[j] == '\n';
        if (only_nl) {
            if (!grow((void **)&b->enc, &b->enc_cap, plen * 2 + 1, 1))
                return kiln_err_set(err, KILN_ERR_NOMEM, "BPE: out of memory");
            size_t en = encode_bytes(v, p, plen, b->enc);
            int32_t id = kiln_strtab_find(&v->str, b->enc, en);
            if (id >= 0 && (uint32_t)id < v->n_tokens) {
                if (v->ignore_merges) {
                    if (!kiln_tokens_push(out, id))
                        return kiln_err_set(err, KILN_ERR_NOMEM, "BPE: out of memory");
                    return KILN_OK;
                }
                whole = true; /* gemma4: a newline run that is a token stays whole */
            }
        }
    }
    if (!ws_reserve(b, plen + 1)) return kiln_err_set(err, KILN_ERR_NOMEM, "BPE: out of memory");
    int32_t n = 0;
    if (whole) {
        b->s_off[0] = pa;
        b->s_len[0] = (uint32_t)plen;
        b->s_id[0] = kiln_strtab_find(&v->str, b->enc, encode_bytes(v, p, plen, b->enc));
        n = 1;
    } else if (v->pretok.byte_encode) {
        for (size_t j = 0; j < plen; j++, n++) {
            b->s_off[n] = pa + (uint32_t)j;
            b->s_len[n] = 1;
            b->s_id[n] = v->byte_id[(uint8_t)p[j]];
        }
    } else {
        for (size_t j = 0; j < plen; n++) {
            size_t cl = kiln_tok_utf8_len((uint8_t)p[j]);
            if (cl > plen - j) cl = plen - j;
            b->s_off[n] = pa + (uint32_t)j;
            b->s_len[n] = (uint32_t)cl;
            b->s_id[n] = kiln_strtab_find(&v->str, p + j, cl);
            j += cl;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        b->s_prev[i] = i - 1;
        b->s_next[i] = i + 1 < n ? i + 1 : -1;
    }
    if (n <= SCAN_MAX) {
        /* linear scan: rank of the pair starting at each live symbol */
        int32_t merged_of[SCAN_MAX + 1];
        for (int32_t i = 0; i < n; i++) {
            int32_t m;
            b->s_rank[i] =
                (i + 1 < n && pair_rank(v, b->s_id[i], b->s_id[i + 1], &b->s_rank[i], &m))
                    ? b->s_rank[i]
                    : NO_RANK;
            merged_of[i] = b->s_rank[i] != NO_RANK ? m : -1;
        }
        for (;;) {
            int32_t best = -1;
            uint32_t br = NO_RANK;
            for (int32_t i = 0; i != -1; i = b->s_next[i])
                if (b->s_rank[i] < br) br = b->s_rank[i], best = i;
            if (best < 0) break;
            int32_t r = b->s_next[best];
            b->s_id[best] = merged_of[best];
            b->s_len[best] += b->s_len[r];
            b->s_next[best] = b->s_next[r];
            if (b->s_next[r] >= 0) b->s_prev[b->s_next[r]] = best;
            int32_t pv = b->s_prev[best];
            int32_t m;
            if (pv >= 0) {
                b->s_rank[pv] = pair_rank(v, b->s_id[pv], b->s_id[best], &b->s_rank[pv], &m)
                                    ? b->s_rank[pv]
                                    : NO_RANK;
                merged_of[pv] = b->s_rank[pv] != NO_RANK ? m : -1;
            }
            int32_t nx = b->s_next[best];
            if (nx >= 0 && pair_rank(v, b->s_id[best], b->s_id[nx], &b->s_rank[best], &m)) {
                merged_of[best] = m;
            } else {
                b->s_rank[best] = NO_RANK;
            }
        }
    } else {
        b->heap_n = 0;
        for (int32_t i = 1; i < n; i++)
            if (!heap_add(v, b, i - 1, i))
                return kiln_err_set(err, KILN_ERR_NOMEM, "BPE: out of memory");
        while (b->heap_n) {
            bg x = heap_pop(b);
            if (b->s_len[x.left] == 0 || b->s_len[x.right] == 0 || b->s_id[x.left] != x.lid ||
                b->s_id[x.right] != x.rid || b->s_next[x.left] != x.right)
                continue; /* outdated */
            int32_t l = x.left, r = x.right;
            b->s_id[l] = x.merged;
            b->s_len[l] += b->s_len[r];
            b->s_len[r] = 0;
            b->s_next[l] = b->s_next[r];
            if (b->s_next[r] >= 0) b->s_prev[b->s_next[r]] = l;
            if (!heap_add(v, b, b->s_prev[l], l) || !heap_add(v, b, l, b->s_next[l]))
                return kiln_err_set(err, KILN_ERR_NOMEM, "BPE: out of memory");
        }
    }
    for (int32_t i = 0; i != -1 && n > 0; i = b->s_next[i])
        KILN_TRY(emit_symbol(v, b, text, i, out, err));
    return KILN_OK;
}

/* ---- piece cache: the ids of a piece depend only on its bytes ---- */

struct kiln_bpe_cache_slot {
    uint64_t hash; /* 0 = empty */
    uint32_t text_off, text_len, ids_off, ids_n;
};

#define CACHE_MAX_PIECE 64
#define CACHE_MAX_SLOTS (1u << 17)

static const struct kiln_bpe_cache_slot *cache_find(const kiln_pretok_buf *b, uint64_t h,
                                                    const char *s, size_t n) {
    if (!b->cache) return NULL;
    for (size_t i = h & b->cache_mask;; i = (i + 1) & b->cache_mask) {
        const struct kiln_bpe_cache_slot *c = &b->cache[i];
        if (!c->hash) return NULL;
        if (c->hash == h && c->text_len == n && memcmp(b->cache_text + c->text_off, s, n) == 0)
            return c;
    }
}

/* Remembers piece s -> ids; silently does nothing when full or out of memory (the cache
 * is only an accelerator). */
static void cache_put(kiln_pretok_buf *b, uint64_t h, const char *s, size_t n,
                      const kiln_token *ids, size_t n_ids) {
    /* start small (short texts are common: chat turns, the runtime's stop strings) and
     * double up to CACHE_MAX_SLOTS */
    size_t slots = b->cache ? b->cache_mask + 1 : 0;
    if (!b->cache || (b->cache_n + 1) * 2 > slots) {
        size_t ns = slots ? slots * 2 : 256;
        if (ns > CACHE_MAX_SLOTS) return; /* full: no more caching in this call */
        struct kiln_bpe_cache_slot *nc = kiln_calloc(ns, sizeof *nc);
        if (!nc) return;
        for (size_t i = 0; i < slots; i++) {
            if (!b->cache[i].hash) continue;
            size_t j = b->cache[i].hash & (ns - 1);
            while (nc[j].hash) j = (j + 1) & (ns - 1);
            nc[j] = b->cache[i];
        }
        kiln_free(b->cache);
        b->cache = nc;
        b->cache_mask = ns - 1;
    }
    if (!grow((void **)&b->cache_text, &b->cache_text_cap, b->cache_text_len + n, 1) ||
        !grow((void **)&b->cache_ids, &b->cache_ids_cap, b->cache_ids_len + n_ids, sizeof(int32_t)))
        return;
    size_t i = h & b->cache_mask;
    while (b->cache[i].hash) i = (i + 1) & b->cache_mask;
    struct kiln_bpe_cache_slot *c = &b->cache[i];
    c->hash = h;
    c->text_off = (uint32_t)b->cache_text_len;
    c->text_len = (uint32_t)n;
    c->ids_off = (uint32_t)b->cache_ids_len;
    c->ids_n = (uint32_t)n_ids;
    if (n) memcpy(b->cache_text + b->cache_text_len, s, n);
    b->cache_text_len += n;
    if (n_ids) memcpy(b->cache_ids + b->cache_ids_len, ids, n_ids * sizeof *ids);
    b->cache_ids_len += n_ids;
    b->cache_n++;
}

static inline uint64_t piece_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a: pieces are short */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ULL;
    return h | 1;
}

kiln_status kiln_bpe_tokenize(const kiln_vocab *v, kiln_pretok_buf *pb, const char *text,
                              size_t len, kiln_tokens *out, kiln_err *err) {
    if (len == 0) return KILN_OK;
    const uint32_t *pieces;
    size_t n_pieces, ulen;
    KILN_TRY(kiln_pretok_split(&v->pretok, pb, text, len, &pieces, &n_pieces, &ulen, err));
    for (size_t k = 0; k < n_pieces; k++) {
        uint32_t a = pb->cp_off[pieces[k]], e = pb->cp_off[pieces[k + 1]];
        const char *s = pb->utf8 + a;
        size_t n = e - a;
        if (n > CACHE_MAX_PIECE) {
            KILN_TRY(bpe_piece(v, pb, pb->utf8, a, e, out, err));
            continue;
        }
        uint64_t h = piece_hash(s, n);
        const struct kiln_bpe_cache_slot *c = cache_find(pb, h, s, n);
        if (c) {
            for (uint32_t j = 0; j < c->ids_n; j++)
                if (!kiln_tokens_push(out, pb->cache_ids[c->ids_off + j]))
                    return kiln_err_set(err, KILN_ERR_NOMEM, "BPE: out of memory");
            continue;
        }
        size_t n0 = out->n;
        KILN_TRY(bpe_piece(v, pb, pb->utf8, a, e, out, err));
        cache_put(pb, h, s, n, out->n > n0 ? out->ids + n0 : NULL, out->n - n0);
    }
    return KILN_OK;
}
