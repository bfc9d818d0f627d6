/*
 * tokenize.c — text -> ids (special-token partition, then SPM or BPE per raw
 * fragment) and ids -> text.
 *
 * Special-token partition, as llama.cpp's tokenizer_st_partition: special tokens
 * (control, user-defined, unknown; only user-defined unless PARSE_SPECIAL) are taken in
 * order of precedence (longer texts first); each splits every still-raw fragment at
 * all its non-overlapping occurrences, left to right. llama.cpp does one substring
 * search per special token over the whole text (thousands for Gemma); kiln finds all
 * occurrences of all special tokens in one pass with a trie and then resolves them in
 * the same order of precedence, which gives the same fragments.
 */
#include "base/mem.h"
#include "tok/tok_impl.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

typedef struct occ {
    int32_t rank;
    int32_t tok;
    size_t pos;
} occ;

enum { FREE = 0, TAKEN = 1, DROPPED = 2 };

static bool eligible(const kiln_vocab *v, int32_t t, bool parse_special) {
    return parse_special || !(v->attr[t] & (KILN_TOKEN_ATTR_CONTROL | KILN_TOKEN_ATTR_UNKNOWN));
}

/* Fills mark[0..len) (FREE / TAKEN / DROPPED) and tok_at[] (token starting at pos, or
 * -1) for the accepted special tokens. */
static inline bool c_isspace(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Accepts token t at p: marks it taken and applies its lstrip/rstrip; returns where the
 * next search for the same token may start. */
static size_t accept(const kiln_vocab *v, const char *text, size_t len, uint8_t *mark,
                     int32_t *tok_at, int32_t t, size_t p, size_t tl) {
    memset(mark + p, TAKEN, tl);
    tok_at[p] = t;
    size_t next = p + tl;
    uint32_t a = v->attr[t];
    if (a & KILN_TOKEN_ATTR_LSTRIP)
        for (size_t j = p; j > 0 && mark[j - 1] == FREE && c_isspace(text[j - 1]); j--)
            mark[j - 1] = DROPPED;
    if (a & KILN_TOKEN_ATTR_RSTRIP)
        for (; next < len && mark[next] == FREE && c_isspace(text[next]); next++)
            mark[next] = DROPPED;
    return next;
}

/* The same partition the way llama.cpp computes it: for each special token present, in
 * order of precedence, search every free region left to right. Used when the text has
 * so many overlapping occurrences (long runs of a repeated user-defined token such as
 * "\n") that listing them all would take too much memory. */
static kiln_status partition_scan(const kiln_vocab *v, const char *text, size_t len,
                                  bool parse_special, uint8_t *mark, int32_t *tok_at,
                                  kiln_err *err) {
    uint8_t *seen = kiln_calloc(v->n_special ? v->n_special : 1, 1);
    int32_t *by_rank = kiln_malloc(sizeof(int32_t) * (v->n_special ? v->n_special : 1));
    if (!seen || !by_rank) {
        kiln_free(seen);
        kiln_free(by_rank);
        return kiln_err_set(err, KILN_ERR_NOMEM, "special tokens: out of memory");
    }
    for (size_t i = 0; i < len; i++) {
        if (!v->trie_first[(uint8_t)text[i]]) continue;
        uint32_t node = 0;
        for (size_t j = i; j < len; j++) {
            uint64_t child;
            if (!kiln_u64map_get(&v->trie, ((uint64_t)node << 8 | (uint8_t)text[j]) + 1, &child))
                break;
            node = (uint32_t)child;
            int32_t t = v->trie_tok[node];
            if (t >= 0 && eligible(v, t, parse_special)) {
                seen[v->special_rank[t]] = 1;
                by_rank[v->special_rank[t]] = t;
            }
        }
    }
    memset(mark, FREE, len);
    for (size_t i = 0; i < len; i++) tok_at[i] = -1;
    for (size_t r = 0; r < v->n_special; r++) {
        if (!seen[r]) continue;
        int32_t t = by_rank[r];
        kiln_str ts = kiln_strtab_get(&v->str, t);
        for (size_t i = 0; i < len;) {
            if (mark[i] != FREE) {
                i++;
                continue;
            }
            size_t end = i;
            while (end < len && mark[end] == FREE) end++;
            /* search [i, end); an accepted match may shrink the region (rstrip) */
            size_t p = i;
            while (p + ts.len <= end) {
                const char *f = memmem(text + p, end - p, ts.ptr, ts.len);
                if (!f) break;
                size_t q = (size_t)(f - text);
                p = accept(v, text, len, mark, tok_at, t, q, ts.len);
            }
            i = end;
        }
    }
    kiln_free(seen);
    kiln_free(by_rank);
    return KILN_OK;
}

static kiln_status partition(const kiln_vocab *v, const char *text, size_t len, bool parse_special,
                             bool force_scan, uint8_t *mark, int32_t *tok_at, kiln_err *err) {
    occ *o = NULL;
    size_t n = 0, cap = 0;
    size_t budget = 4 * len + 4096; /* occurrences listed before switching to the scan */
    if (force_scan) return partition_scan(v, text, len, parse_special, mark, tok_at, err);
    for (size_t i = 0; i < len; i++) tok_at[i] = -1;
    for (size_t i = 0; i < len; i++) {
        if (!v->trie_first[(uint8_t)text[i]]) continue;
        uint32_t node = 0;
        for (size_t j = i; j < len; j++) {
            uint64_t child;
            if (!kiln_u64map_get(&v->trie, ((uint64_t)node << 8 | (uint8_t)text[j]) + 1, &child))
                break;
            node = (uint32_t)child;
            int32_t t = v->trie_tok[node];
            if (t >= 0 && eligible(v, t, parse_special)) {
                if (n == budget) {
                    kiln_free(o);
                    return partition_scan(v, text, len, parse_special, mark, tok_at, err);
                }
                if (n == cap) {
                    size_t nc = cap ? cap * 2 : 64;
                    occ *no = kiln_realloc(o, nc * sizeof *no);
                    if (!no) {
                        kiln_free(o);
                        return kiln_err_set(err, KILN_ERR_NOMEM, "special tokens: out of memory");
                    }
                    o = no;
                    cap = nc;
                }
                o[n++] = (occ){v->special_rank[t], t, i};
            }
        }
    }
    memset(mark, FREE, len);
    if (n == 0) {
        kiln_free(o);
        return KILN_OK;
    }
    /* order by (rank, position): occurrences were found in position order, so a stable
     * counting sort on the rank is enough */
    size_t n_ranks = v->n_special;
    size_t *start = kiln_calloc(n_ranks + 1, sizeof *start);
    occ *sorted = kiln_malloc(n * sizeof *sorted);
    if (!start || !sorted) {
        kiln_free(start);
        kiln_free(sorted);
        kiln_free(o);
        return kiln_err_set(err, KILN_ERR_NOMEM, "special tokens: out of memory");
    }
    for (size_t k = 0; k < n; k++) start[o[k].rank + 1]++;
    for (size_t r = 0; r < n_ranks; r++) start[r + 1] += start[r];
    for (size_t k = 0; k < n; k++) sorted[start[o[k].rank]++] = o[k];
    kiln_free(start);
    kiln_free(o);
    o = sorted;
    size_t last_end = 0;
    int32_t cur = -1;
    for (size_t k = 0; k < n; k++) {
        if (o[k].tok != cur) cur = o[k].tok, last_end = 0;
        size_t p = o[k].pos, tl = kiln_strtab_get(&v->str, cur).len;
        if (p < last_end) continue;
        bool free_span = true;
        for (size_t j = p; j < p + tl && free_span; j++) free_span = mark[j] == FREE;
        if (!free_span) continue;
        last_end = accept(v, text, len, mark, tok_at, cur, p, tl);
    }
    kiln_free(o);
    return KILN_OK;
}

static kiln_status raw_fragment(const kiln_vocab *v, kiln_pretok_buf *pb, char **scratch,
                                size_t *scratch_cap, const char *s, size_t n, size_t total,
                                bool prefix_space, kiln_tokens *out, kiln_err *err) {
    bool escape = v->type == KILN_VOCAB_SPM || v->escape_ws;
    if (!escape && !prefix_space) return kiln_bpe_tokenize(v, pb, s, n, out, err);
    /* ' ' -> U+2581 (3 bytes), optional leading space */
    size_t need;
    if (!kiln_size_mul(n + 1, 3, &need))
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "text too long");
    if (*scratch_cap < need) {
        char *ns = kiln_realloc(*scratch, need);
        if (!ns) return kiln_err_set(err, KILN_ERR_NOMEM, "tokenize: out of memory");
        *scratch = ns;
        *scratch_cap = need;
    }
    char *o = *scratch;
    size_t k = 0;
    if (prefix_space) {
        if (escape) {
            memcpy(o, "\xe2\x96\x81", 3);
            k = 3;
        } else {
            o[k++] = ' ';
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ' && escape) {
            memcpy(o + k, "\xe2\x96\x81", 3);
            k += 3;
        } else {
            o[k++] = s[i];
        }
    }
    if (v->type == KILN_VOCAB_SPM) return kiln_spm_tokenize(v, pb, o, k, total, out, err);
    return kiln_bpe_tokenize(v, pb, o, k, out, err);
}

kiln_status kiln_tokenize(const kiln_vocab *v, const char *text, size_t len, unsigned flags,
                          kiln_tokens *out, kiln_err *err) {
    if (!v || !out || (!text && len))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "kiln_tokenize: NULL argument");
    bool add_special = flags & KILN_TOK_ADD_SPECIAL, parse_special = flags & KILN_TOK_PARSE_SPECIAL;
    size_t n0 = out->n;
    uint8_t *mark = NULL;
    int32_t *tok_at = NULL;
    char *scratch = NULL;
    size_t scratch_cap = 0;
    kiln_pretok_buf pb = {0};
    kiln_status st = KILN_OK;
    if (len) {
        mark = kiln_malloc(len);
        tok_at = kiln_malloc(len * sizeof(int32_t));
        if (!mark || !tok_at) {
            st = kiln_err_set(err, KILN_ERR_NOMEM, "tokenize %zu bytes: out of memory", len);
            goto done;
        }
        st = partition(v, text, len, parse_special, flags & KILN_TOK_TEST_SCAN_PARTITION, mark,
                       tok_at, err);
        if (st) goto done;
    }
    if (add_special && v->add_bos && !kiln_tokens_push(out, v->bos)) goto oom;
    bool prev_special = true; /* SPM: space prefix for the first fragment and after specials */
    for (size_t i = 0; i < len;) {
        if (mark[i] == TAKEN) {
            if (tok_at[i] >= 0) {
                if (!kiln_tokens_push(out, tok_at[i])) goto oom;
                prev_special = true;
            }
            i++;
            continue;
        }
        if (mark[i] == DROPPED) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < len && mark[j] == FREE) j++;
        bool prefix = v->type == KILN_VOCAB_SPM && v->add_space_prefix && prev_special;
        st = raw_fragment(v, &pb, &scratch, &scratch_cap, text + i, j - i, len, prefix, out, err);
        if (st) goto done;
        prev_special = false;
        i = j;
    }
    if (add_special && v->add_eos && !kiln_tokens_push(out, v->eos)) goto oom;
    goto done;
oom:
    st = kiln_err_set(err, KILN_ERR_NOMEM, "tokenize: out of memory");
done:
    if (st) out->n = n0;
    kiln_free(mark);
    kiln_free(tok_at);
    kiln_free(scratch);
    kiln_pretok_buf_free(&pb);
    return st;
}

/* ---- detokenize ---- */

kiln_str kiln_token_piece(const kiln_vocab *v, kiln_token t, bool special, int lstrip) {
    kiln_str r = {"", 0};
    if (t < 0 || (uint32_t)t >= v->n_tokens) return r;
    if (!special && (v->attr[t] & (KILN_TOKEN_ATTR_UNKNOWN | KILN_TOKEN_ATTR_CONTROL))) return r;
    uint64_t ol = v->piece_off_len[t];
    r.ptr = v->piece_blob + (ol >> 24);
    r.len = (size_t)(ol & 0xFFFFFF);
    for (int i = 0; i < lstrip && r.len && *r.ptr == ' '; i++) r.ptr++, r.len--;
    return r;
}

static size_t clean_spaces(char *t, size_t total) {
    /* llama.cpp's three passes: " ?" " !" " ." " ,"; " ' "; " 's" " 'm" " 're" " 've" */
    size_t n1 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < n1; i++) {
        char x = t[i];
        if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) total--;
        t[total++] = x;
    }
    size_t n2 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < n2; i++) {
        char x = t[i];
        if (x == '\'' && i + 1 < n2 && t[i - 1] == ' ' && t[i + 1] == ' ') {
            total--;
            t[++i] = '\0';
        }
        t[total++] = x;
    }
    size_t n3 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < n3; i++) {
        char x = t[i];
        if (t[i - 1] == ' ' && x == '\'' && i + 1 < n3) {
            char x1 = t[i + 1];
            if (x1 == 's' || x1 == 'm') {
                total--;
            } else if (x1 != 't' && x1 != 'd' && i + 2 < n3) {
                char x2 = t[i + 2];
                if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) total--;
            }
        }
        t[total++] = x;
    }
    return total;
}

kiln_status kiln_detokenize(const kiln_vocab *v, const kiln_token *ids, size_t n, unsigned flags,
                            char **out, size_t *out_len, kiln_err *err) {
    *out = NULL;
    *out_len = 0;
    bool remove_special = flags & KILN_DETOK_REMOVE_SPECIAL;
    bool unparse = flags & KILN_DETOK_UNPARSE_SPECIAL;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= v->n_tokens)
            return kiln_err_set(err, KILN_ERR_RANGE,
                                "token %d at position %zu is not in the "
                                "vocabulary (%u tokens)",
                                ids[i], i, v->n_tokens);
    bool remove_space = v->add_space_prefix;
    const bool sequence = flags & KILN_DETOK_SEQUENCE;
    if (sequence && n > 0 && ids[0] == v->bos && (v->attr[ids[0]] & KILN_TOKEN_ATTR_CONTROL)) {
        ids++, n--; /* the BOS the tokenizer added; the space prefix goes with the next */
    } else if (remove_special && v->add_bos && n > 0 && ids[0] == v->bos) {
        remove_space = false;
        ids++, n--;
    }
    if (remove_special && v->add_eos && n > 0 && ids[n - 1] == v->eos) n--;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        kiln_str p = kiln_token_piece(v, ids[i], unparse, i == 0 && remove_space);
        if (!kiln_size_add(total, p.len, &total))
            return kiln_err_set(err, KILN_ERR_OVERFLOW, "detokenized text too long");
    }
    char *t = kiln_malloc(total + 1);
    if (!t) return kiln_err_set(err, KILN_ERR_NOMEM, "detokenize: %zu bytes", total);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        kiln_str p = kiln_token_piece(v, ids[i], unparse, i == 0 && remove_space);
        memcpy(t + k, p.ptr, p.len);
        k += p.len;
    }
    if (v->clean_spaces && !sequence) k = clean_spaces(t, k);
    t[k] = 0;
    *out = t;
    *out_len = k;
    return KILN_OK;
}
