/*
 * tok_impl.h — internals shared by the files of src/tok/ (not for other layers).
 *
 * A vocabulary keeps every token text in one blob and indexes it with an
 * open-addressing hash table (text -> id). BPE merges become integer pairs:
 * (left id, right id) -> (rank, merged id). Merge parts or results that are not
 * tokens get "pseudo ids" >= n_tokens in the same string table, so the merge loop
 * never touches strings and still behaves exactly like llama.cpp's string-based one.
 */
#ifndef KILN_TOK_IMPL_H
#define KILN_TOK_IMPL_H

#include "tok/tok.h"

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

/* ---- string table: byte strings <-> dense ids ---- */
typedef struct kiln_strtab {
    char *blob;
    size_t blob_len, blob_cap;
    uint64_t *off_len; /* per id: offset << 24 | length (length < 16 MiB) */
    uint32_t n, cap;   /* ids in use / allocated */
    uint64_t *slots;   /* hash << 32 | (id + 1); 0 = empty */
    uint32_t slot_mask;
} kiln_strtab;

kiln_status kiln_strtab_init(kiln_strtab *t, uint32_t expect, kiln_err *err);
void kiln_strtab_free(kiln_strtab *t);
/* Id of s[0..n), or -1. */
int32_t kiln_strtab_find(const kiln_strtab *t, const char *s, size_t n);
/* Adds s as a new id even if present (the table then maps the text to the newest id,
 * like llama.cpp's token_to_id[word] = i); returns the id or -1 on out-of-memory. */
int32_t kiln_strtab_add(kiln_strtab *t, const char *s, size_t n);
/* Finds s or adds it. */
int32_t kiln_strtab_intern(kiln_strtab *t, const char *s, size_t n);
static inline kiln_str kiln_strtab_get(const kiln_strtab *t, int32_t id) {
    uint64_t ol = t->off_len[id];
    kiln_str r = {t->blob + (ol >> 24), (size_t)(ol & 0xFFFFFF)};
    return r;
}

/* ---- integer map: uint64 key -> uint64 value (open addressing, key 0 reserved) ---- */
typedef struct kiln_u64slot {
    uint64_t key, val; /* key 0 = empty; one slot per probe (one cache line) */
} kiln_u64slot;
typedef struct kiln_u64map {
    kiln_u64slot *slots;
    size_t mask, n;
} kiln_u64map;
kiln_status kiln_u64map_init(kiln_u64map *m, size_t expect, kiln_err *err);
void kiln_u64map_free(kiln_u64map *m);
/* Inserts when absent (keeps the first value, like std::map::emplace). false on OOM. */
bool kiln_u64map_put_first(kiln_u64map *m, uint64_t key, uint64_t val);
static inline size_t kiln_u64map_mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k;
}
static inline bool kiln_u64map_get(const kiln_u64map *m, uint64_t key, uint64_t *val) {
    if (!m->slots) return false;
    for (size_t i = kiln_u64map_mix(key) & m->mask;; i = (i + 1) & m->mask) {
        if (m->slots[i].key == key) {
            *val = m->slots[i].val;
            return true;
        }
        if (!m->slots[i].key) return false;
    }
}

/* ---- pre-tokenizer ---- */
#define KILN_PRETOK_MAX_RE 8
typedef struct kiln_pretok {
    const char *name; /* canonical llama.cpp pre name of the regex set */
    int n_re;
    pcre2_code *re[KILN_PRETOK_MAX_RE];
    bool collapsed[KILN_PRETOK_MAX_RE]; /* runs on the category-collapsed text */
    bool any_collapsed, any_wide;
    bool byte_encode; /* GPT-2 byte map (false for gemma4-style BPE) */
} kiln_pretok;

/* Settings llama.cpp ties to a pre-tokenizer name. */
typedef struct kiln_pre_info {
    const char *name;
    int regex_set; /* index into the regex table of pretok.c */
    int clean_spaces, ignore_merges, add_bos, escape_ws; /* -1 = family default */
} kiln_pre_info;

/* The i-th supported tokenizer.ggml.pre name, NULL past the end (tests, docs). */
const char *kiln_pre_name_at(size_t i);
/* Looks up a tokenizer.ggml.pre name; NULL when kiln does not support it. */
const kiln_pre_info *kiln_pre_lookup(const char *name);
kiln_status kiln_pretok_init(kiln_pretok *p, int regex_set, kiln_err *err);
void kiln_pretok_free(kiln_pretok *p);

/* Splits text[0..len) (already lenient-decoded: see kiln_tok_decode) into pieces.
 * Output: the byte offsets of piece boundaries in the sanitized UTF-8 text, which is
 * also returned (llama.cpp re-encodes invalid input as U+FFFD before BPE). */
typedef struct kiln_pretok_buf {
    uint32_t *cps;
    size_t cps_cap;
    char *utf8; /* sanitized text */
    size_t utf8_cap;
    uint32_t *cp_off; /* byte offset of each code point in utf8, plus the end */
    size_t cp_off_cap;
    uint8_t *collapsed;
    size_t collapsed_cap;
    char *wide; /* UTF-8 with non-ASCII white space replaced by 0x0B */
    size_t wide_cap;
    uint32_t *wide_b2c; /* byte offset in wide -> code point index */
    size_t wide_b2c_cap;
    uint32_t *wide_off; /* code point index -> byte offset in wide */
    size_t wide_off_cap;
    uint32_t *bounds[2]; /* piece boundaries in code points */
    size_t bounds_cap[2];
    /* BPE merge workspace (bpe.c) */
    int32_t *s_id, *s_prev, *s_next;
    uint32_t *s_off, *s_len, *s_rank;
    size_t s_cap;
    void *heap;
    size_t heap_n, heap_cap;
    char *enc;
    size_t enc_cap;
    /* piece -> ids cache for one kiln_tokenize call (bpe.c); pieces repeat a lot */
    struct kiln_bpe_cache_slot *cache;
    size_t cache_mask, cache_n;
    char *cache_text;
    size_t cache_text_len, cache_text_cap;
    int32_t *cache_ids;
    size_t cache_ids_len, cache_ids_cap;
    struct kiln_spm_memo_slot *spm_memo; /* spm.c: lookup memo for one call */
    size_t spm_memo_mask;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
} kiln_pretok_buf;
void kiln_pretok_buf_free(kiln_pretok_buf *b);
/* On success *pieces (cp boundaries, n_pieces+1 entries, into b) and b->utf8/b->cp_off
 * describe the pieces. */
kiln_status kiln_pretok_split(const kiln_pretok *p, kiln_pretok_buf *b, const char *text,
                              size_t len, const uint32_t **pieces, size_t *n_pieces,
                              size_t *utf8_len, kiln_err *err);

/* ---- the vocabulary ---- */
struct kiln_vocab {
    kiln_vocab_type type;
    char model[32];
    char pre[64];
    uint32_t n_tokens;
    kiln_strtab str; /* ids < n_tokens are tokens; the rest are merge-only strings */
    float *score;
    uint32_t *attr;
    kiln_token bos, eos, eot, eom, unk, sep, pad, mask;
    kiln_token *eog;
    size_t n_eog;
    bool add_bos, add_eos, add_sep, add_space_prefix, clean_spaces, ignore_merges;
    int metaspace_prefix; /* kiln_vocab_desc.metaspace_prefix */
    bool escape_ws;
    bool gemma4_newlines; /* pre type GEMMA4: newline runs that are tokens stay whole */
    /* SPM: <0xXX> token per byte (-1 when absent); BPE: the token of each byte's
     * GPT-2 code point, or of the raw byte for byte_encode == false */
    int32_t byte_tok[256];
    int32_t byte_id[256]; /* BPE: string-table id of each byte's initial symbol */
    /* BPE merges */
    kiln_u64map merges; /* (l << 32 | r) + 1 -> rank << 32 | merged id */
    kiln_pretok pretok;
    /* special-token partition: tokens with CONTROL/USER_DEFINED/UNKNOWN, as a byte trie */
    kiln_u64map trie;  /* (node << 8 | byte) + 1 -> child node */
    int32_t *trie_tok; /* node -> token ending here, or -1 */
    uint32_t trie_nodes, trie_cap;
    uint8_t trie_first[256]; /* root has an edge for this byte */
    int32_t *special_rank;   /* token -> processing order (longer first), -1 if none */
    size_t n_special;        /* tokens with a rank */
    /* piece cache (token_to_piece with special = true, no lstrip) */
    char *piece_blob;
    uint64_t *piece_off_len;
};

/* kiln_tokenize flag for tests: always use the per-token scan of the special-token
 * partition (tokenize.c), so both of its paths can be checked against the goldens. */
#define KILN_TOK_TEST_SCAN_PARTITION (1u << 30)

/* Algorithms (spm.c, bpe.c): append the ids of one raw fragment. */
kiln_status kiln_spm_tokenize(const kiln_vocab *v, kiln_pretok_buf *pb, const char *text,
                              size_t len, size_t total_len, kiln_tokens *out, kiln_err *err);
kiln_status kiln_bpe_tokenize(const kiln_vocab *v, kiln_pretok_buf *pb, const char *text,
                              size_t len, kiln_tokens *out, kiln_err *err);
bool kiln_tokens_push(kiln_tokens *t, kiln_token id);

#endif /* KILN_TOK_IMPL_H */
