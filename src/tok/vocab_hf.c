/*
 * vocab_hf.c — a vocabulary from a Hugging Face tokenizer.json (plus, when present,
 * tokenizer_config.json beside it for BOS/EOS and add_bos/add_eos).
 *
 * Supported: model.type "BPE" with a ByteLevel pre-tokenizer (GPT-2 style byte-level
 * BPE), alone (the GPT-2 regex) or after a Split whose regex is one kiln knows
 * (llama3, qwen2, gpt-4o...). The Split regex is matched against the upstream
 * patterns; for another regex pass pre_override (a tokenizer.ggml.pre name). Added
 * tokens become control tokens ("special": true) or user-defined tokens.
 * Also model.type "BPE" with byte_fallback (SentencePiece-style: Llama 2, Mistral, Gemma,
 * TinyLlama), read as an SPM vocabulary (load_spm below). Anything else (WordPiece,
 * Unigram, other normalizers) is rejected with a message naming it.
 */
#include "tok/tok_impl.h"
#include "base/mem.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Upstream Split patterns (as they appear in tokenizer.json) -> GGUF pre names. */
static const struct {
    const char *re;
    const char *pre;
} k_known[] = {
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
     "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "llama3"},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
     "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "qwen2"},
    {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:"
     "'s|"
     "'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}"
     "\\p{"
     "Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*"
     "[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "gpt-4o"},
    {"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)", "gpt-2"},
};

static kiln_status detect_pre(json_t *pt, const char *path, const char **pre, kiln_err *err) {
    const char *type = json_string_value(json_object_get(pt, "type"));
    if (!type) return kiln_err_set(err, KILN_ERR_FORMAT, "%s: pre_tokenizer has no type", path);
    if (strcmp(type, "ByteLevel") == 0) {
        json_t *ur = json_object_get(pt, "use_regex");
        if (ur && json_is_false(ur))
            return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                                "%s: ByteLevel pre-tokenizer without a regex is not supported",
                                path);
        *pre = "gpt-2";
        return KILN_OK;
    }
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(pt, "pretokenizers"), *it;
        size_t i;
        const char *found = NULL;
        bool byte_level = false;
        json_array_foreach(list, i, it) {
            const char *t = json_string_value(json_object_get(it, "type"));
            if (t && strcmp(t, "ByteLevel") == 0) byte_level = true;
            if (t && strcmp(t, "Split") == 0) {
                const char *re =
                    json_string_value(json_object_get(json_object_get(it, "pattern"), "Regex"));
                if (!re) continue;
                for (size_t k = 0; k < sizeof k_known / sizeof k_known[0]; k++)
                    if (strcmp(re, k_known[k].re) == 0) found = k_known[k].pre;
                if (!found)
                    return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                                        "%s: unknown pre-tokenizer regex '%.200s' (pass the "
                                        "tokenizer.ggml.pre name to use)",
                                        path, re);
            }
        }
        if (found && byte_level) {
            *pre = found;
            return KILN_OK;
        }
    }
    return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                        "%s: pre-tokenizer '%s' is not supported (kiln reads byte-level BPE)", path,
                        type);
}

/* "bos_token": "<s>" or {"content": "<s>", ...} */
static const char *config_token(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_string_value(v);
}

/* ---- SentencePiece-style BPE (byte_fallback): read as an SPM vocabulary ----
 * Llama 2, TinyLlama (normalizer Prepend("▁") + Replace(" ", "▁")), Mistral and newer
 * conversions (pre-tokenizer Metaspace), Gemma (Replace only: no space prefix). The
 * merges become SPM scores: a piece made by merge r scores -r (the first merge making
 * it), so "highest score first" is "lowest rank first"; pieces no merge makes score
 * below every merge. <0xXX> pieces are byte tokens, model.unk_token the unknown token,
 * special added tokens control tokens, other added tokens user-defined. */

static bool is_str(json_t *o, const char *key, const char *want) {
    const char *v = json_string_value(json_object_get(o, key));
    return v && strcmp(v, want) == 0;
}

/* Replace(" " -> "▁") as tokenizers writes it: {"pattern": {"String": " "}, "content": "▁"} */
static bool is_space_replace(json_t *n) {
    return is_str(n, "type", "Replace") && is_str(json_object_get(n, "pattern"), "String", " ") &&
           is_str(n, "content", "\xE2\x96\x81");
}

/* How the space prefix is added: sets *prefix (0/1) and *metaspace (desc field). */
static kiln_status spm_style(json_t *root, const char *path, int *prefix, int *metaspace,
                             kiln_err *err) {
    json_t *norm = json_object_get(root, "normalizer"),
           *pt = json_object_get(root, "pre_tokenizer");
    bool replace = false, prepend = false;
    json_t *list = is_str(norm, "type", "Sequence") ? json_object_get(norm, "normalizers") : NULL;
    size_t i;
    json_t *it;
    if (list) {
        json_array_foreach(list, i, it) {
            if (is_space_replace(it))
                replace = true;
            else if (is_str(it, "type", "Prepend") && is_str(it, "prepend", "\xE2\x96\x81"))
                prepend = true;
            else
                return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                                    "%s: normalizer '%s' in a SentencePiece-style tokenizer is "
                                    "not supported (kiln reads Prepend and Replace)",
                                    path, json_string_value(json_object_get(it, "type")));
        }
    } else if (norm && !json_is_null(norm)) {
        if (!is_space_replace(norm))
            return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                                "%s: normalizer '%s' in a SentencePiece-style tokenizer is not "
                                "supported (kiln reads Prepend and Replace)",
                                path, json_string_value(json_object_get(norm, "type")));
        replace = true;
    }
    *prefix = prepend;
    *metaspace = 0;
    if (pt && !json_is_null(pt)) {
        if (!is_str(pt, "type", "Metaspace") || !is_str(pt, "replacement", "\xE2\x96\x81") ||
            json_is_true(json_object_get(pt, "split")) || replace || prepend)
            return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                                "%s: pre-tokenizer '%s' in a SentencePiece-style tokenizer is not "
                                "supported (kiln reads Metaspace with split false)",
                                path, json_string_value(json_object_get(pt, "type")));
        const char *scheme = json_string_value(json_object_get(pt, "prepend_scheme"));
        if (!scheme) /* older files: add_prefix_space */
            scheme = json_is_false(json_object_get(pt, "add_prefix_space")) ? "never" : "always";
        *prefix = strcmp(scheme, "never") != 0;
        *metaspace = strcmp(scheme, "first") == 0 ? 1 : 2;
        return KILN_OK;
    }
    if (!replace)
        return kiln_err_set(
            err, KILN_ERR_UNSUPPORTED,
            "%s: SentencePiece-style tokenizer without a Replace(' ', '\xE2\x96\x81') "
            "normalizer or a Metaspace pre-tokenizer",
            path);
    return KILN_OK;
}

static bool is_byte_piece(const char *t) {
    return strlen(t) == 6 && t[0] == '<' && t[1] == '0' && t[2] == 'x' && t[5] == '>';
}

static void apply_config(json_t *cfg, kiln_vocab_desc *d, const kiln_str *tokens, size_t n) {
    const char *bos = config_token(cfg, "bos_token"), *eos = config_token(cfg, "eos_token");
    for (size_t k = 0; k < n; k++) {
        if (bos && tokens[k].len == strlen(bos) && memcmp(tokens[k].ptr, bos, tokens[k].len) == 0)
            d->bos = (int64_t)k;
        if (eos && tokens[k].len == strlen(eos) && memcmp(tokens[k].ptr, eos, tokens[k].len) == 0)
            d->eos = (int64_t)k;
    }
    json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
    if (json_is_boolean(ab)) d->add_bos = json_is_true(ab);
    if (json_is_boolean(ae)) d->add_eos = json_is_true(ae);
}

static kiln_status load_spm(json_t *root, json_t *model, const char *path, kiln_vocab **out,
                            kiln_err *err) {
    int prefix = 0, metaspace = 0;
    KILN_TRY(spm_style(root, path, &prefix, &metaspace, err));
    json_t *vocab = json_object_get(model, "vocab"), *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab))
        return kiln_err_set(err, KILN_ERR_FORMAT, "%s: model.vocab is not an object", path);
    size_t n = json_object_size(vocab);
    const char *key;
    json_t *val, *it;
    size_t i;
    json_array_foreach(added, i, it) {
        json_int_t id = json_integer_value(json_object_get(it, "id"));
        if (id >= 0 && (size_t)id >= n) n = (size_t)id + 1;
    }
    if (n == 0 || n > (1u << 24))
        return kiln_err_set(err, KILN_ERR_FORMAT, "%s: vocabulary of %zu tokens", path, n);
    kiln_status st = KILN_OK;
    kiln_str *tokens = kiln_calloc(n, sizeof *tokens);
    int32_t *types = kiln_calloc(n, sizeof *types);
    float *scores = kiln_calloc(n, sizeof *scores);
    kiln_vocab *tmp = NULL;
    json_t *cfg = NULL;
    if (!tokens || !types || !scores) goto oom;
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    kiln_vocab_desc d;
    kiln_vocab_desc_init(&d);
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || (size_t)id >= n || tokens[id].ptr) {
            st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: vocab entry '%.64s' has a bad id", path,
                              key);
            goto done;
        }
        tokens[id] = (kiln_str){key, strlen(key)};
        types[id] = is_byte_piece(key) ? 6 : 1;
        if (unk && strcmp(key, unk) == 0) types[id] = 2, d.unk = id;
    }
    json_array_foreach(added, i, it) {
        json_int_t id = json_integer_value(json_object_get(it, "id"));
        json_t *c = json_object_get(it, "content");
        if (id < 0 || (size_t)id >= n || !json_is_string(c)) {
            st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: added_tokens[%zu] is malformed", path, i);
            goto done;
        }
        tokens[id] = (kiln_str){json_string_value(c), json_string_length(c)};
        if (types[id] != 2) types[id] = json_is_true(json_object_get(it, "special")) ? 3 : 4;
    }
    for (size_t k = 0; k < n; k++)
        if (!tokens[k].ptr) {
            st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: no token has id %zu", path, k);
            goto done;
        }
    /* scores from the merges, looked up through a first vocabulary without them */
    d.model = "llama";
    d.source = path;
    d.n_tokens = n;
    d.tokens = tokens;
    d.token_type = types;
    if ((st = kiln_vocab_create(&d, &tmp, err))) goto done;
    json_t *jm = json_object_get(model, "merges");
    size_t nm = json_array_size(jm);
    for (size_t k = 0; k < n; k++) scores[k] = -(float)nm - 1.0f;
    char buf[1024];
    json_array_foreach(jm, i, it) {
        size_t len = 0;
        if (json_is_string(it)) {
            const char *m = json_string_value(it), *sp = strchr(m, ' ');
            if (!sp) goto bad_merge;
            len = strlen(m) - 1;
            if (len >= sizeof buf) continue; /* longer than any piece kiln merges */
            memcpy(buf, m, (size_t)(sp - m));
            memcpy(buf + (sp - m), sp + 1, strlen(sp + 1));
        } else if (json_is_array(it) && json_array_size(it) == 2) {
            const char *l = json_string_value(json_array_get(it, 0));
            const char *r = json_string_value(json_array_get(it, 1));
            if (!l || !r) goto bad_merge;
            size_t ll = strlen(l), rl = strlen(r);
            len = ll + rl;
            if (len >= sizeof buf) continue;
            memcpy(buf, l, ll);
            memcpy(buf + ll, r, rl);
        } else {
            goto bad_merge;
        }
        kiln_token t = kiln_vocab_find(tmp, buf, len);
        if (t >= 0 && scores[t] < -(float)i) scores[t] = -(float)i;
        continue;
    bad_merge:
        st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: merges[%zu] is malformed", path, i);
        goto done;
    }
    d.scores = scores;
    d.add_space_prefix = prefix;
    d.metaspace_prefix = metaspace;
    /* special tokens by their usual texts, then tokenizer_config.json beside the file */
    kiln_token bos = kiln_vocab_find(tmp, "<s>", 3), eos = kiln_vocab_find(tmp, "</s>", 4);
    if (bos < 0) bos = kiln_vocab_find(tmp, "<bos>", 5);
    if (eos < 0) eos = kiln_vocab_find(tmp, "<eos>", 5);
    if (bos >= 0) d.bos = bos;
    if (eos >= 0) d.eos = eos;
    char cfg_path[4096];
    const char *slash = strrchr(path, '/');
    int dl = slash ? (int)(slash - path + 1) : 0;
    snprintf(cfg_path, sizeof cfg_path, "%.*stokenizer_config.json", dl, path);
    json_error_t je;
    cfg = json_load_file(cfg_path, 0, &je);
    if (cfg) apply_config(cfg, &d, tokens, n);
    st = kiln_vocab_create(&d, out, err);
    goto done;
oom:
    st = kiln_err_set(err, KILN_ERR_NOMEM, "%s: out of memory", path);
done:
    kiln_vocab_free(tmp);
    json_decref(cfg);
    kiln_free(tokens);
    kiln_free(types);
    kiln_free(scores);
    return st;
}

kiln_status kiln_vocab_load_hf(const char *path, const char *pre_override, kiln_vocab **out,
                               kiln_err *err) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return kiln_err_set(err, KILN_ERR_FORMAT, "%s:%d:%d: %s", path, je.line, je.column,
                            je.text);
    kiln_status st = KILN_OK;
    kiln_str *tokens = NULL, *merges = NULL;
    int32_t *types = NULL;
    char **owned = NULL;
    size_t n_owned = 0;
    json_t *cfg = NULL;
    json_t *model = json_object_get(root, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!mtype || strcmp(mtype, "BPE") != 0) {
        st = kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                          "%s: tokenizer model type '%s' is not supported (kiln reads BPE)", path,
                          mtype ? mtype : "(none)");
        goto done;
    }
    if (json_is_true(json_object_get(model, "byte_fallback"))) {
        st = load_spm(root, model, path, out, err);
        goto done;
    }
    const char *pre = pre_override;
    if (!pre) {
        json_t *pt = json_object_get(root, "pre_tokenizer");
        if (!pt || json_is_null(pt)) {
            st = kiln_err_set(err, KILN_ERR_UNSUPPORTED, "%s: no pre_tokenizer", path);
            goto done;
        }
        if ((st = detect_pre(pt, path, &pre, err))) goto done;
    }
    json_t *vocab = json_object_get(model, "vocab"), *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab)) {
        st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: model.vocab is not an object", path);
        goto done;
    }
    /* vocabulary size: the largest id + 1 (gaps become "[PAD<i>]" as llama.cpp's
     * converter fills them) */
    int64_t max_id = -1;
    const char *key;
    json_t *val, *it;
    size_t i;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) > (1 << 24)) {
            st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: vocab entry '%.64s' has a bad id", path,
                              key);
            goto done;
        }
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    json_array_foreach(added, i, it) {
        json_int_t id = json_integer_value(json_object_get(it, "id"));
        if (id < 0 || id > (1 << 24)) {
            st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: added_tokens[%zu] has a bad id", path, i);
            goto done;
        }
        if (id > max_id) max_id = id;
    }
    size_t n = (size_t)(max_id + 1);
    if (n == 0) {
        st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: empty vocabulary", path);
        goto done;
    }
    tokens = kiln_calloc(n, sizeof *tokens);
    types = kiln_calloc(n, sizeof *types);
    owned = kiln_calloc(n, sizeof *owned);
    if (!tokens || !types || !owned) goto oom;
    json_object_foreach(vocab, key, val) {
        size_t id = (size_t)json_integer_value(val);
        tokens[id].ptr = key;
        tokens[id].len = strlen(key);
        types[id] = 1;
    }
    json_array_foreach(added, i, it) {
        size_t id = (size_t)json_integer_value(json_object_get(it, "id"));
        json_t *c = json_object_get(it, "content");
        if (!json_is_string(c)) {
            st =
                kiln_err_set(err, KILN_ERR_FORMAT, "%s: added_tokens[%zu] has no content", path, i);
            goto done;
        }
        tokens[id].ptr = json_string_value(c);
        tokens[id].len = json_string_length(c);
        types[id] = json_is_true(json_object_get(it, "special")) ? 3 : 4;
    }
    for (size_t k = 0; k < n; k++) {
        if (tokens[k].ptr) continue;
        char buf[32];
        int l = snprintf(buf, sizeof buf, "[PAD%zu]", k);
        owned[n_owned] = kiln_strdup(buf);
        if (!owned[n_owned]) goto oom;
        tokens[k].ptr = owned[n_owned++];
        tokens[k].len = (size_t)l;
        types[k] = 5; /* unused */
    }
    json_t *jm = json_object_get(model, "merges");
    size_t nm = json_array_size(jm);
    merges = kiln_calloc(nm + 1, sizeof *merges);
    if (!merges) goto oom;
    json_array_foreach(jm, i, it) {
        if (json_is_string(it)) {
            merges[i].ptr = json_string_value(it);
            merges[i].len = json_string_length(it);
        } else if (json_is_array(it) && json_array_size(it) == 2) {
            /* newer files: ["left", "right"] */
            const char *l = json_string_value(json_array_get(it, 0));
            const char *r = json_string_value(json_array_get(it, 1));
            if (!l || !r) {
                st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: merges[%zu] is malformed", path, i);
                goto done;
            }
            size_t ll = strlen(l), rl = strlen(r);
            char *s = kiln_malloc(ll + rl + 2);
            if (!s) goto oom;
            memcpy(s, l, ll);
            s[ll] = ' ';
            memcpy(s + ll + 1, r, rl + 1);
            char **no = kiln_realloc(owned, (n + nm + 1) * sizeof *owned);
            if (!no) {
                kiln_free(s);
                goto oom;
            }
            owned = no;
            owned[n_owned++] = s;
            merges[i].ptr = s;
            merges[i].len = ll + rl + 1;
        } else {
            st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: merges[%zu] is malformed", path, i);
            goto done;
        }
    }

    kiln_vocab_desc d;
    kiln_vocab_desc_init(&d);
    d.model = "gpt2";
    d.pre = pre;
    d.source = path;
    d.n_tokens = n;
    d.tokens = tokens;
    d.token_type = types;
    d.n_merges = nm;
    d.merges = merges;
    /* tokenizer_config.json beside it: BOS/EOS texts and whether to add them */
    char cfg_path[4096];
    const char *slash = strrchr(path, '/');
    int dl = slash ? (int)(slash - path + 1) : 0;
    snprintf(cfg_path, sizeof cfg_path, "%.*stokenizer_config.json", dl, path);
    cfg = json_load_file(cfg_path, 0, &je);
    if (cfg) apply_config(cfg, &d, tokens, n);
    st = kiln_vocab_create(&d, out, err);
    goto done;
oom:
    st = kiln_err_set(err, KILN_ERR_NOMEM, "%s: out of memory", path);
done:
    for (size_t k = 0; k < n_owned; k++) kiln_free(owned[k]);
    kiln_free(owned);
    kiln_free(tokens);
    kiln_free(types);
    kiln_free(merges);
    json_decref(cfg);
    json_decref(root);
    return st;
}
