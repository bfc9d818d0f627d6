/*
 * vocab.c — building a kiln_vocab from a kiln_vocab_desc: token table, attributes,
 * special ids and their defaults, end-of-generation set, BPE merge table, special-
 * token trie and the piece cache. Every rule here mirrors llama.cpp's
 * llama_vocab::impl::load so that ids and pieces agree with it (docs/TOKENIZER.md).
 */
#include "base/log.h"
#include "base/mem.h"
#include "tok/tok_impl.h"
#include "tok/unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kiln_vocab_desc_init(kiln_vocab_desc *d) {
    memset(d, 0, sizeof *d);
    d->bos = d->eos = d->eot = d->eom = d->unk = d->sep = d->pad = d->mask = KILN_TOKEN_NULL;
    d->add_bos = d->add_eos = d->add_sep = d->add_space_prefix = -1;
}

void kiln_tokens_free(kiln_tokens *t) {
    if (!t) return;
    kiln_free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
}

bool kiln_tokens_push(kiln_tokens *t, kiln_token id) {
    if (t->n == t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 64;
        if (nc > SIZE_MAX / sizeof(kiln_token)) return false;
        kiln_token *p = kiln_realloc(t->ids, nc * sizeof(kiln_token));
        if (!p) return false;
        t->ids = p;
        t->cap = nc;
    }
    t->ids[t->n++] = id;
    return true;
}

void kiln_vocab_free(kiln_vocab *v) {
    if (!v) return;
    kiln_strtab_free(&v->str);
    kiln_free(v->score);
    kiln_free(v->attr);
    kiln_free(v->eog);
    kiln_u64map_free(&v->merges);
    kiln_pretok_free(&v->pretok);
    kiln_u64map_free(&v->trie);
    kiln_free(v->trie_tok);
    kiln_free(v->special_rank);
    kiln_free(v->piece_blob);
    kiln_free(v->piece_off_len);
    kiln_free(v);
}

static bool text_is(const kiln_vocab *v, int32_t id, const char *s) {
    kiln_str t = kiln_strtab_get(&v->str, id);
    size_t n = strlen(s);
    return t.len == n && memcmp(t.ptr, s, n) == 0;
}

static const char *const k_eot_texts[] = {
    "<|eot_id|>",         "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>",    "<EOT>",      "_<EOT>",  "[EOT]",         "<｜end▁of▁sentence｜>",
    "<end_of_utterance>", NULL};
static const char *const k_eom_texts[] = {"<|eom_id|>", NULL};
static const char *const k_fim_pre[] = {"<|fim_prefix|>",  "<fim-prefix>", "<fim_prefix>",
                                        "<｜fim▁begin｜>", "<PRE>",        "▁<PRE>",
                                        "<|code_prefix|>", "<|prefix|>",   NULL};
static const char *const k_fim_suf[] = {"<|fim_suffix|>",  "<fim-suffix>", "<fim_suffix>",
                                        "<｜fim▁hole｜>",  "<SUF>",        "▁<SUF>",
                                        "<|code_suffix|>", "<|suffix|>",   NULL};
static const char *const k_fim_mid[] = {"<|fim_middle|>",  "<fim-middle>", "<fim_middle>",
                                        "<｜fim▁end｜>",   "<MID>",        "▁<MID>",
                                        "<|code_middle|>", "<|middle|>",   NULL};
static const char *const k_fim_pad[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>",
                                        "<PAD>",       "[PAD]",     NULL};
static const char *const k_fim_rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                        "<REPO>",       "<reponame>",    NULL};
static const char *const k_fim_sep[] = {"<|file_sep|>", NULL};
static const char *const k_eog_texts[] = {"<|eot_id|>",
                                          "<|im_end|>",
                                          "<|end|>",
                                          "<|return|>",
                                          "<|call|>",
                                          "<|flush|>",
                                          "<|calls|>",
                                          "<end_of_turn>",
                                          "<|endoftext|>",
                                          "</s>",
                                          "<|eom_id|>",
                                          "<EOT>",
                                          "_<EOT>",
                                          "[EOT]",
                                          "[EOS]",
                                          "<|end_of_text|>",
                                          "<end_of_utterance>",
                                          "<eos>",
                                          "<turn|>",
                                          "<|tool_response>",
                                          "<｜end▁of▁sentence｜>",
                                          "[e~[",
                                          NULL};

static int32_t find_token(const kiln_vocab *v, const char *s, size_t n);

/* Lowest id whose text is in list; marks it control. */
static int32_t detect(kiln_vocab *v, const char *const *list) {
    int32_t best = KILN_TOKEN_NULL;
    for (; *list; list++) {
        int32_t id = find_token(v, *list, strlen(*list));
        if (id >= 0 && (best < 0 || id < best)) best = id;
    }
    if (best >= 0) v->attr[best] |= KILN_TOKEN_ATTR_CONTROL;
    return best;
}

static bool eog_has(const kiln_vocab *v, kiln_token t) {
    for (size_t i = 0; i < v->n_eog; i++)
        if (v->eog[i] == t) return true;
    return false;
}

static void eog_add(kiln_vocab *v, kiln_token t) {
    if (t == KILN_TOKEN_NULL || eog_has(v, t)) return;
    v->eog[v->n_eog++] = t;
}

static void eog_remove(kiln_vocab *v, kiln_token t) {
    for (size_t i = 0; i < v->n_eog; i++) {
        if (v->eog[i] == t) {
            v->eog[i] = v->eog[--v->n_eog];
            return;
        }
    }
}

static kiln_status derive_specials(kiln_vocab *v, kiln_err *err) {
    if (v->eot == KILN_TOKEN_NULL) {
        v->eot = detect(v, k_eot_texts);
    }
    if (v->eom == KILN_TOKEN_NULL) v->eom = detect(v, k_eom_texts);
    (void)detect(v, k_fim_pre);
    (void)detect(v, k_fim_suf);
    (void)detect(v, k_fim_mid);
    int32_t fim_pad = detect(v, k_fim_pad);
    int32_t fim_rep = detect(v, k_fim_rep);
    int32_t fim_sep = detect(v, k_fim_sep);

    /* control tokens whose text says "unused" are unused */
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        if (!(v->attr[i] & KILN_TOKEN_ATTR_CONTROL)) continue;
        kiln_str t = kiln_strtab_get(&v->str, (int32_t)i);
        if (t.len >= 6 && memmem(t.ptr, t.len, "unused", 6)) v->attr[i] |= KILN_TOKEN_ATTR_UNUSED;
    }

    /* end-of-generation set; its texts are forced to control (a text is one token: the
     * table maps each text to one id) */
    size_t n_text = sizeof k_eog_texts / sizeof k_eog_texts[0];
    if (kiln_xcalloc(n_text + 6, sizeof(kiln_token), (void **)&v->eog, "end-of-generation ids",
                     err))
        return err ? err->code : KILN_ERR_NOMEM;
    eog_add(v, fim_pad);
    eog_add(v, fim_rep);
    eog_add(v, fim_sep);
    for (const char *const *t = k_eog_texts; *t; t++) {
        int32_t id = find_token(v, *t, strlen(*t));
        if (id < 0) continue;
        eog_add(v, id);
        v->attr[id] |= KILN_TOKEN_ATTR_CONTROL;
    }
    /* gpt-oss: always render these (llama.cpp makes them user-defined) */
    static const char *const k_render[] = {"<|channel|>", "<|message|>", "<|start|>",
                                           "<|constrain|>", NULL};
    for (const char *const *t = k_render; *t; t++) {
        int32_t id = find_token(v, *t, strlen(*t));
        if (id >= 0) v->attr[id] = KILN_TOKEN_ATTR_USER_DEFINED;
    }
    eog_add(v, v->eos);
    eog_add(v, v->eot);
    eog_add(v, v->eom);

    /* o200k_harmony / solar-open: "<|end|>" is not end-of-generation there */
    bool has_return = false, has_call = false, has_end = false, has_flush = false;
    bool has_tool_response = false, has_s = false;
    kiln_token end_id = KILN_TOKEN_NULL, s_id = KILN_TOKEN_NULL;
    for (size_t i = 0; i < v->n_eog; i++) {
        kiln_token t = v->eog[i];
        if (text_is(v, t, "<|return|>")) has_return = true;
        if (text_is(v, t, "<|call|>") || text_is(v, t, "<|calls|>")) has_call = true;
        if (text_is(v, t, "<|flush|>")) has_flush = true;
        if (text_is(v, t, "<|end|>")) has_end = true, end_id = t;
        if (text_is(v, t, "<|tool_response>")) has_tool_response = true;
        if (text_is(v, t, "</s>")) has_s = true, s_id = t;
    }
    if ((has_return && has_call && has_end) || (has_call && has_flush && has_end)) {
        eog_remove(v, end_id);
        v->attr[end_id] = KILN_TOKEN_ATTR_USER_DEFINED;
    }
    if (has_tool_response && has_s) { /* gemma4: "</s>" is an ordinary token */
        eog_remove(v, s_id);
        v->attr[s_id] = KILN_TOKEN_ATTR_NORMAL;
    }
    return KILN_OK;
}

/* ---- special-token trie (for splitting text at special tokens) ---- */

static kiln_status build_trie(kiln_vocab *v, kiln_err *err) {
    size_t total = 0, n_special = 0;
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        if (v->attr[i] &
            (KILN_TOKEN_ATTR_CONTROL | KILN_TOKEN_ATTR_USER_DEFINED | KILN_TOKEN_ATTR_UNKNOWN)) {
            total += kiln_strtab_get(&v->str, (int32_t)i).len;
            n_special++;
        }
    }
    KILN_TRY(kiln_u64map_init(&v->trie, total + 1, err));
    v->trie_cap = (uint32_t)(total + 1);
    if (kiln_xmalloc(sizeof(int32_t) * v->trie_cap, (void **)&v->trie_tok, "special-token trie",
                     err) ||
        kiln_xmalloc(sizeof(int32_t) * v->n_tokens, (void **)&v->special_rank,
                     "special-token ranks", err))
        return err ? err->code : KILN_ERR_NOMEM;
    v->trie_nodes = 1;
    v->trie_tok[0] = -1;
    /* order of precedence: longer texts first, then lower ids (llama.cpp sorts by
     * length only; equal-length special tokens that overlap in a text are unheard of) */
    int32_t *order = NULL;
    if (kiln_xmalloc(sizeof(int32_t) * (n_special + 1), (void **)&order, "special tokens", err))
        return err ? err->code : KILN_ERR_NOMEM;
    size_t k = 0;
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        v->special_rank[i] = -1;
        if (v->attr[i] &
            (KILN_TOKEN_ATTR_CONTROL | KILN_TOKEN_ATTR_USER_DEFINED | KILN_TOKEN_ATTR_UNKNOWN))
            order[k++] = (int32_t)i;
    }
    /* counting sort by length, descending (stable) */
    size_t maxlen = 0;
    for (size_t i = 0; i < k; i++) {
        size_t n = kiln_strtab_get(&v->str, order[i]).len;
        if (n > maxlen) maxlen = n;
    }
    int32_t rank = 0;
    for (size_t len = maxlen + 1; len-- > 0;) {
        for (size_t i = 0; i < k; i++)
            if (kiln_strtab_get(&v->str, order[i]).len == len) v->special_rank[order[i]] = rank++;
        if (len == 0) break;
    }
    kiln_free(order);
    v->n_special = (size_t)rank;
    memset(v->trie_first, 0, sizeof v->trie_first);
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        if (v->special_rank[i] < 0) continue;
        kiln_str t = kiln_strtab_get(&v->str, (int32_t)i);
        if (t.len == 0) continue;
        v->trie_first[(uint8_t)t.ptr[0]] = 1;
        uint32_t node = 0;
        for (size_t j = 0; j < t.len; j++) {
            uint64_t key = ((uint64_t)node << 8 | (uint8_t)t.ptr[j]) + 1, child;
            if (!kiln_u64map_get(&v->trie, key, &child)) {
                child = v->trie_nodes++;
                v->trie_tok[child] = -1;
                if (!kiln_u64map_put_first(&v->trie, key, child))
                    return kiln_err_set(err, KILN_ERR_NOMEM, "special-token trie: out of memory");
            }
            node = (uint32_t)child;
        }
        v->trie_tok[node] = (int32_t)i; /* same text twice: the later id, as llama.cpp */
    }
    return KILN_OK;
}

/* ---- piece cache ---- */

/* GPT-2 byte map in reverse; a code point outside the map is written as
 * "[UNK_BYTE_0x<hex of its UTF-8><token text>]", as llama.cpp does. out == NULL: only
 * the length (build_pieces sizes the cache with it). */
static size_t decode_bpe_text(const char *t, size_t n, char *out) {
    static const char unk[] = "[UNK_BYTE_0x";
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = kiln_tok_decode((const uint8_t *)t + i, n - i, &cp);
        int b = kiln_tok_cpt_to_byte(cp);
        if (b >= 0) {
            if (out) out[k] = (char)b;
            k++;
        } else {
            char u[4];
            int ul = kiln_tok_encode(cp, u);
            if (out) {
                memcpy(out + k, unk, sizeof unk - 1);
                for (int j = 0; j < ul; j++)
                    snprintf(out + k + sizeof unk - 1 + 2 * (size_t)j, 3, "%02x", (uint8_t)u[j]);
                memcpy(out + k + sizeof unk - 1 + 2 * (size_t)ul, t, n);
                out[k + sizeof unk - 1 + 2 * (size_t)ul + n] = ']';
            }
            k += sizeof unk - 1 + 2 * (size_t)ul + n + 1;
        }
        i += l;
    }
    return k;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static kiln_status build_pieces(kiln_vocab *v, kiln_err *err) {
    /* the exact size: a byte-level BPE piece expands each code point outside the byte map
     * to "[UNK_BYTE_0x..<token>]" (quadratic in the token's length), so the worst case
     * n * (24 + n) per token, which this used to allocate, was megabytes for a real vocab
     * and hundreds of them for a fuzzed tokenizer.json with one long token */
    size_t cap = 1;
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        kiln_str t = kiln_strtab_get(&v->str, (int32_t)i);
        uint32_t a = v->attr[i];
        size_t w = t.len;
        if ((a & KILN_TOKEN_ATTR_NORMAL) &&
            !(a &
              (KILN_TOKEN_ATTR_UNKNOWN | KILN_TOKEN_ATTR_CONTROL | KILN_TOKEN_ATTR_USER_DEFINED)) &&
            v->type != KILN_VOCAB_SPM && !v->escape_ws)
            w = decode_bpe_text(t.ptr, t.len, NULL);
        /* piece_off_len packs the offset (40 bits) and the length (24 bits) */
        if (w >= (1u << 24))
            return kiln_err_set(err, KILN_ERR_OVERFLOW,
                                "token %u: its text decodes to %zu bytes (at most 16 MiB)", i, w);
        if (!kiln_size_add(cap, w + 1, &cap) || cap >= ((size_t)1 << 40))
            return kiln_err_set(err, KILN_ERR_OVERFLOW, "piece cache size overflows");
    }
    if (kiln_xmalloc(cap, (void **)&v->piece_blob, "piece cache", err) ||
        kiln_xmalloc(sizeof(uint64_t) * v->n_tokens, (void **)&v->piece_off_len, "piece cache",
                     err))
        return err ? err->code : KILN_ERR_NOMEM;
    size_t off = 0;
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        kiln_str t = kiln_strtab_get(&v->str, (int32_t)i);
        uint32_t a = v->attr[i];
        char *o = v->piece_blob + off;
        size_t n = 0;
        if (a &
            (KILN_TOKEN_ATTR_UNKNOWN | KILN_TOKEN_ATTR_CONTROL | KILN_TOKEN_ATTR_USER_DEFINED)) {
            memcpy(o, t.ptr, t.len);
            n = t.len;
        } else if (a & KILN_TOKEN_ATTR_NORMAL) {
            if (v->type == KILN_VOCAB_SPM || v->escape_ws) {
                for (size_t j = 0; j < t.len;) { /* U+2581 -> ' ' */
                    if (j + 3 <= t.len && memcmp(t.ptr + j, "\xe2\x96\x81", 3) == 0) {
                        o[n++] = ' ';
                        j += 3;
                    } else {
                        o[n++] = t.ptr[j++];
                    }
                }
            } else {
                n = decode_bpe_text(t.ptr, t.len, o);
            }
        } else if (a & KILN_TOKEN_ATTR_BYTE) {
            /* "<0xXX>": llama.cpp reads the two characters at offset 3 with strtol */
            int hi = t.len > 3 ? hexval(t.ptr[3]) : -1, lo = t.len > 4 ? hexval(t.ptr[4]) : -1;
            int val = hi < 0 ? 0 : (lo < 0 ? hi : hi * 16 + lo);
            o[n++] = (char)val;
        }
        v->piece_off_len[i] = (uint64_t)off << 24 | n;
        off += n;
    }
    return KILN_OK;
}

/* ---- merges and byte tables ---- */

static kiln_status build_merges(kiln_vocab *v, const kiln_vocab_desc *d, kiln_err *err) {
    KILN_TRY(kiln_u64map_init(&v->merges, d->n_merges + 1, err));
    char *tmp = NULL;
    size_t tmp_cap = 0;
    for (size_t i = 0; i < d->n_merges; i++) {
        kiln_str m = d->merges[i];
        const char *sp = m.len > 1 ? memchr(m.ptr + 1, ' ', m.len - 1) : NULL;
        if (!sp) continue; /* llama.cpp stores ("", ""), which never matches */
        size_t ln = (size_t)(sp - m.ptr), rn = m.len - ln - 1;
        if (ln + rn > tmp_cap) {
            tmp_cap = (ln + rn) * 2;
            char *nt = kiln_realloc(tmp, tmp_cap);
            if (!nt) {
                kiln_free(tmp);
                return kiln_err_set(err, KILN_ERR_NOMEM, "merges: out of memory");
            }
            tmp = nt;
        }
        memcpy(tmp, m.ptr, ln);
        memcpy(tmp + ln, sp + 1, rn);
        int32_t l = kiln_strtab_intern(&v->str, m.ptr, ln);
        int32_t r = kiln_strtab_intern(&v->str, sp + 1, rn);
        int32_t lr = kiln_strtab_intern(&v->str, tmp, ln + rn);
        if (l < 0 || r < 0 || lr < 0 ||
            !kiln_u64map_put_first(&v->merges, ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1,
                                   (uint64_t)i << 32 | (uint32_t)lr)) {
            kiln_free(tmp);
            return kiln_err_set(err, KILN_ERR_NOMEM, "merges: out of memory");
        }
    }
    kiln_free(tmp);
    return KILN_OK;
}

static int32_t find_token(const kiln_vocab *v, const char *s, size_t n) {
    int32_t id = kiln_strtab_find(&v->str, s, n);
    return id >= 0 && (uint32_t)id < v->n_tokens ? id : -1;
}

static void build_byte_tables(kiln_vocab *v) {
    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        char raw = (char)b;
        if (v->type == KILN_VOCAB_SPM) {
            int32_t t = find_token(v, hex, 6);
            v->byte_tok[b] = t >= 0 ? t : find_token(v, &raw, 1);
            v->byte_id[b] = -1;
        } else if (v->pretok.byte_encode) {
            char u[4];
            int ul = kiln_tok_encode(kiln_tok_byte_to_cpt((uint8_t)b), u);
            v->byte_id[b] = kiln_strtab_find(&v->str, u, (size_t)ul);
            v->byte_tok[b] = find_token(v, &raw, 1); /* fallback lookups of raw bytes */
        } else {
            v->byte_id[b] = -1;
            v->byte_tok[b] = find_token(v, hex, 6);
        }
    }
}

/* ---- create ---- */

static void set_special(const kiln_vocab *v, kiln_token *slot, int64_t given, const char *what) {
    if (*slot >= 0 && (uint32_t)*slot >= v->n_tokens) {
        KILN_WARN("vocab: default %s token %d out of range, disabling", what, *slot);
        *slot = KILN_TOKEN_NULL;
    }
    if (given == KILN_TOKEN_NULL) return;
    if (given < 0 || (uint64_t)given >= v->n_tokens) {
        KILN_WARN("vocab: bad %s token id %lld (vocab has %u), using %d", what, (long long)given,
                  v->n_tokens, *slot);
        return;
    }
    *slot = (kiln_token)given;
}

static kiln_status create(const kiln_vocab_desc *d, kiln_vocab *v, kiln_err *err) {
    const char *model = d->model ? d->model : "";
    const char *pre = d->pre && *d->pre ? d->pre : "default";
    snprintf(v->model, sizeof v->model, "%s", model);
    v->bos = v->eos = v->eot = v->eom = v->unk = v->sep = v->pad = v->mask = KILN_TOKEN_NULL;
    const kiln_pre_info *pi = NULL;
    if (strcmp(model, "llama") == 0) {
        v->type = KILN_VOCAB_SPM;
        v->bos = 1, v->eos = 2, v->unk = 0;
        v->add_space_prefix = true, v->clean_spaces = false, v->add_bos = true;
        pre = "default";
    } else if (strcmp(model, "gpt2") == 0 || strcmp(model, "gemma4") == 0) {
        v->type = KILN_VOCAB_BPE;
        if (strcmp(model, "gpt2") == 0)
            v->bos = 11, v->eos = 11;
        else
            pre = "gemma4";
        v->clean_spaces = true;
        pi = kiln_pre_lookup(pre);
        if (!pi)
            return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                                "unknown or unsupported pre-tokenizer '%s' "
                                "(tokenizer.ggml.pre); see docs/TOKENIZER.md for the list",
                                pre);
        if (pi->clean_spaces >= 0) v->clean_spaces = pi->clean_spaces;
        if (pi->ignore_merges >= 0) v->ignore_merges = pi->ignore_merges;
        if (pi->add_bos >= 0) v->add_bos = pi->add_bos;
        if (pi->escape_ws >= 0) v->escape_ws = pi->escape_ws;
        if (strcmp(pre, "glm4") == 0 || strcmp(pre, "chatglm-bpe") == 0) v->bos = KILN_TOKEN_NULL;
    } else {
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "tokenizer model '%s' (tokenizer.ggml.model) is not supported; kiln "
                            "supports 'llama' (SPM), 'gpt2' (byte-level BPE) and 'gemma4'",
                            model);
    }
    snprintf(v->pre, sizeof v->pre, "%s", pre);
    if (d->add_space_prefix >= 0) v->add_space_prefix = d->add_space_prefix;
    v->metaspace_prefix = d->metaspace_prefix;

    if (d->n_tokens == 0 || !d->tokens)
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "vocabulary has no tokens (tokenizer.ggml.tokens)");
    if (d->n_tokens > INT32_MAX / 2)
        return kiln_err_set(err, KILN_ERR_RANGE, "vocabulary of %zu tokens is too large",
                            d->n_tokens);
    v->n_tokens = (uint32_t)d->n_tokens;
    KILN_TRY(kiln_strtab_init(&v->str, v->n_tokens + (uint32_t)(d->n_merges / 8) + 16, err));
    if (kiln_xmalloc(sizeof(float) * v->n_tokens, (void **)&v->score, "token scores", err) ||
        kiln_xmalloc(sizeof(uint32_t) * v->n_tokens, (void **)&v->attr, "token attributes", err))
        return err ? err->code : KILN_ERR_NOMEM;
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        kiln_str t = d->tokens[i];
        char empty[32];
        if (t.len == 0) {
            KILN_WARN("vocab: empty token at index %u", i);
            t.len = (size_t)snprintf(empty, sizeof empty, "[EMPTY_%u]", i);
            t.ptr = empty;
        }
        if (!t.ptr || t.len >= (1u << 24))
            return kiln_err_set(err, KILN_ERR_FORMAT, "token %u: bad text (length %zu)", i, t.len);
        if (kiln_strtab_add(&v->str, t.ptr, t.len) < 0)
            return kiln_err_set(err, KILN_ERR_NOMEM, "token table: out of memory");
        v->score[i] = d->scores ? d->scores[i] : 0.0f;
        uint32_t a = KILN_TOKEN_ATTR_NORMAL;
        if (d->token_type) {
            switch (d->token_type[i]) {
            case 1:
                a = KILN_TOKEN_ATTR_NORMAL;
                break;
            case 2:
                a = KILN_TOKEN_ATTR_UNKNOWN;
                break;
            case 3:
                a = KILN_TOKEN_ATTR_CONTROL;
                break;
            case 4:
                a = KILN_TOKEN_ATTR_USER_DEFINED;
                break;
            case 5:
                a = KILN_TOKEN_ATTR_UNUSED;
                break;
            case 6:
                a = KILN_TOKEN_ATTR_BYTE;
                break;
            default:
                a = KILN_TOKEN_ATTR_UNDEFINED;
                break;
            }
        }
        v->attr[i] = a;
    }

    set_special(v, &v->bos, d->bos, "bos");
    set_special(v, &v->eos, d->eos, "eos");
    set_special(v, &v->eot, d->eot, "eot");
    set_special(v, &v->eom, d->eom, "eom");
    set_special(v, &v->unk, d->unk, "unknown");
    set_special(v, &v->sep, d->sep, "separator");
    set_special(v, &v->pad, d->pad, "padding");
    set_special(v, &v->mask, d->mask, "mask");
    if (d->add_bos >= 0) v->add_bos = d->add_bos;
    if (d->add_eos >= 0) v->add_eos = d->add_eos;
    if (d->add_sep >= 0) v->add_sep = d->add_sep;
    v->gemma4_newlines =
        v->type == KILN_VOCAB_BPE &&
        (strcmp(v->pre, "gemma4") == 0 || strcmp(v->pre, "granite-embed-multi-311m") == 0);
    if (v->gemma4_newlines) v->add_bos = true; /* llama.cpp's Gemma 4 override */
    if (v->add_bos && v->bos == KILN_TOKEN_NULL)
        return kiln_err_set(err, KILN_ERR_FORMAT, "vocabulary adds BOS but has no BOS token");
    if (v->add_eos && v->eos == KILN_TOKEN_NULL)
        return kiln_err_set(err, KILN_ERR_FORMAT, "vocabulary adds EOS but has no EOS token");

    KILN_TRY(derive_specials(v, err));
    if (v->type == KILN_VOCAB_BPE) {
        KILN_TRY(kiln_pretok_init(&v->pretok, pi->regex_set, err));
        if (d->n_merges == 0 || !d->merges)
            return kiln_err_set(err, KILN_ERR_FORMAT,
                                "BPE vocabulary has no merges (tokenizer.ggml.merges)");
        KILN_TRY(build_merges(v, d, err));
    }
    build_byte_tables(v);
    KILN_TRY(build_trie(v, err));
    KILN_TRY(build_pieces(v, err));
    return KILN_OK;
}

kiln_status kiln_vocab_create(const kiln_vocab_desc *d, kiln_vocab **out, kiln_err *err) {
    *out = NULL;
    kiln_vocab *v = kiln_calloc(1, sizeof *v);
    if (!v) return kiln_err_set(err, KILN_ERR_NOMEM, "vocabulary: out of memory");
    kiln_status st = create(d, v, err);
    if (st) {
        kiln_vocab_free(v);
        if (d->source) kiln_err_wrap(err, st, "%s", d->source);
        return st;
    }
    *out = v;
    return KILN_OK;
}

/* ---- queries ---- */

size_t kiln_vocab_n_tokens(const kiln_vocab *v) {
    return v->n_tokens;
}
kiln_vocab_type kiln_vocab_get_type(const kiln_vocab *v) {
    return v->type;
}
const char *kiln_vocab_model_name(const kiln_vocab *v) {
    return v->model;
}
const char *kiln_vocab_pre_name(const kiln_vocab *v) {
    return v->pre;
}
kiln_token kiln_vocab_bos(const kiln_vocab *v) {
    return v->bos;
}
kiln_token kiln_vocab_eos(const kiln_vocab *v) {
    return v->eos;
}
kiln_token kiln_vocab_eot(const kiln_vocab *v) {
    return v->eot;
}
kiln_token kiln_vocab_pad(const kiln_vocab *v) {
    return v->pad;
}
kiln_token kiln_vocab_unk(const kiln_vocab *v) {
    return v->unk;
}
bool kiln_vocab_add_bos(const kiln_vocab *v) {
    return v->add_bos;
}
bool kiln_vocab_add_eos(const kiln_vocab *v) {
    return v->add_eos;
}
bool kiln_vocab_is_eog(const kiln_vocab *v, kiln_token t) {
    return t != KILN_TOKEN_NULL && eog_has(v, t);
}
uint32_t kiln_vocab_attr(const kiln_vocab *v, kiln_token t) {
    return t >= 0 && (uint32_t)t < v->n_tokens ? v->attr[t] : 0;
}
kiln_str kiln_vocab_text(const kiln_vocab *v, kiln_token t) {
    kiln_str e = {"", 0};
    return t >= 0 && (uint32_t)t < v->n_tokens ? kiln_strtab_get(&v->str, t) : e;
}
kiln_token kiln_vocab_find(const kiln_vocab *v, const char *text, size_t len) {
    return find_token(v, text, len);
}
