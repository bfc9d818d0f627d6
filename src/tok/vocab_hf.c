/*
 * vocab_hf.c — a vocabulary from a Hugging Face tokenizer.json (plus, when present,
 * tokenizer_config.json beside it for BOS/EOS and add_bos/add_eos).
 *
 * Supported: model.type "BPE" with a ByteLevel pre-tokenizer (GPT-2 style byte-level
 * BPE), alone (the GPT-2 regex) or after a Split whose regex is one kiln knows
 * (llama3, qwen2, gpt-4o...). The Split regex is matched against the upstream
 * patterns; for another regex pass pre_override (a tokenizer.ggml.pre name). Added
 * tokens become control tokens ("special": true) or user-defined tokens. Anything else
 * (WordPiece, Unigram, SentencePiece-style BPE with byte_fallback) is rejected with a
 * message naming it.
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
        st = kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                          "%s: SentencePiece-style BPE (byte_fallback) is not supported from "
                          "tokenizer.json; use the model's GGUF",
                          path);
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
    if (cfg) {
        const char *bos = config_token(cfg, "bos_token"), *eos = config_token(cfg, "eos_token");
        for (size_t k = 0; k < n; k++) {
            if (bos && tokens[k].len == strlen(bos) &&
                memcmp(tokens[k].ptr, bos, tokens[k].len) == 0)
                d.bos = (int64_t)k;
            if (eos && tokens[k].len == strlen(eos) &&
                memcmp(tokens[k].ptr, eos, tokens[k].len) == 0)
                d.eos = (int64_t)k;
        }
        json_t *ab = json_object_get(cfg, "add_bos_token"),
               *ae = json_object_get(cfg, "add_eos_token");
        if (json_is_boolean(ab)) d.add_bos = json_is_true(ab);
        if (json_is_boolean(ae)) d.add_eos = json_is_true(ae);
    }
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
