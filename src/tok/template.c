/*
 * template.c — the chat-template layer over jinja.h: builds the context Hugging Face's
 * apply_chat_template passes (messages, tools, documents, add_generation_prompt,
 * special tokens, extra variables) and renders.
 */
#include "tok/template.h"
#include "base/mem.h"
#include "tok/jinja.h"
#include "format/meta.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kiln_chat_template {
    jinja_template *t;
    char name[256];
};

kiln_status kiln_chat_template_parse(const char *src, size_t len, const char *name,
                                     kiln_chat_template **out, kiln_err *err) {
    *out = NULL;
    kiln_chat_template *ct = kiln_calloc(1, sizeof *ct);
    if (!ct) return kiln_err_set(err, KILN_ERR_NOMEM, "chat template: out of memory");
    snprintf(ct->name, sizeof ct->name, "%s", name && *name ? name : "chat template");
    kiln_status st = jinja_parse(src, len, &ct->t, err);
    if (st) {
        kiln_free(ct);
        return kiln_err_wrap(err, st, "%s", name && *name ? name : "chat template");
    }
    *out = ct;
    return KILN_OK;
}

void kiln_chat_template_free(kiln_chat_template *t) {
    if (!t) return;
    jinja_free(t->t);
    kiln_free(t);
}

kiln_status kiln_chat_template_render(const kiln_chat_template *t, const kiln_chat_inputs *in,
                                      char **out, size_t *out_len, kiln_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!in->messages || !json_is_array(in->messages))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "%s: messages must be a JSON array",
                            t->name);
    if (in->tools && !json_is_array(in->tools) && !json_is_null(in->tools))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "%s: tools must be a JSON array", t->name);
    if (in->extra && !json_is_object(in->extra))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "%s: extra variables must be a JSON object",
                            t->name);
    json_t *null = json_null();
    jinja_vars v = {0};
    bool ok = true;
    /* extra variables first, so the standard ones win (as in transformers, where they
     * are keyword arguments of the same render call) */
    if (in->extra) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)in->extra, key, val) ok &= jinja_vars_json(&v, key, val);
    }
    ok &= jinja_vars_json(&v, "messages", in->messages);
    ok &= jinja_vars_json(&v, "tools", in->tools ? in->tools : null);
    ok &= jinja_vars_json(&v, "documents", null);
    ok &= jinja_vars_bool(&v, "add_generation_prompt", in->add_generation_prompt);
    if (in->bos_token) ok &= jinja_vars_str(&v, "bos_token", in->bos_token);
    if (in->eos_token) ok &= jinja_vars_str(&v, "eos_token", in->eos_token);
    if (!ok)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "%s: more than %d context variables",
                            t->name, JINJA_MAX_VARS);
    v.now_iso = in->now_iso ? in->now_iso : getenv("KILN_TEMPLATE_NOW");
    if (v.now_iso && !*v.now_iso) v.now_iso = NULL;
    kiln_status st = jinja_render(t->t, &v, out, out_len, err);
    if (st) return kiln_err_wrap(err, st, "%s", t->name);
    return KILN_OK;
}

bool kiln_chat_template_key(const char *name, char *out, size_t out_size) {
    int k = name && *name ? snprintf(out, out_size, "tokenizer.chat_template.%s", name)
                          : snprintf(out, out_size, "tokenizer.chat_template");
    return k > 0 && (size_t)k < out_size;
}

kiln_status kiln_chat_template_from_meta(const kiln_meta *m, const char *name, char **out,
                                         size_t *out_len, kiln_err *err) {
    *out = NULL;
    char key[512];
    if (!kiln_chat_template_key(name, key, sizeof key))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "template name too long");
    const kiln_meta_value *v = kiln_meta_find(m, key);
    if (!v) {
        char names[512] = "";
        size_t used = 0;
        static const char prefix[] = "tokenizer.chat_template.";
        for (size_t i = 0; i < kiln_meta_count(m); i++) {
            const kiln_meta_entry *e = kiln_meta_at(m, i);
            if (!e || e->key.len <= sizeof prefix - 1 ||
                memcmp(e->key.ptr, prefix, sizeof prefix - 1) != 0)
                continue;
            int k =
                snprintf(names + used, sizeof names - used, "%s%.*s", used ? ", " : "",
                         (int)(e->key.len - (sizeof prefix - 1)), e->key.ptr + sizeof prefix - 1);
            if (k < 0 || (size_t)k >= sizeof names - used) break;
            used += (size_t)k;
        }
        return kiln_err_set(err, KILN_ERR_NOT_FOUND, "model has no metadata key '%s'%s%s%s", key,
                            used ? " (named templates: " : "", names, used ? ")" : "");
    }
    if (v->type != KILN_META_STRING)
        return kiln_err_set(err, KILN_ERR_TYPE, "metadata key '%s' is a %s, not a string", key,
                            kiln_meta_type_name(v->type));
    char *p = kiln_malloc(v->v.s.len + 1);
    if (!p) return kiln_err_set(err, KILN_ERR_NOMEM, "copying '%s': out of memory", key);
    memcpy(p, v->v.s.ptr, v->v.s.len);
    p[v->v.s.len] = 0;
    *out = p;
    if (out_len) *out_len = v->v.s.len;
    return KILN_OK;
}

static kiln_status dup_json_str(const json_t *s, char **out, size_t *out_len, kiln_err *err) {
    size_t n = json_string_length(s);
    char *p = kiln_malloc(n + 1);
    if (!p) return kiln_err_set(err, KILN_ERR_NOMEM, "chat template: out of memory");
    memcpy(p, json_string_value(s), n);
    p[n] = 0;
    *out = p;
    if (out_len) *out_len = n;
    return KILN_OK;
}

kiln_status kiln_chat_template_from_hf_dir(const char *dir, const char *name, char **out,
                                           size_t *out_len, kiln_err *err) {
    *out = NULL;
    char path[4096];
    if (!name || !*name) {
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t cap = 1 << 16, n = 0;
            char *p = kiln_malloc(cap);
            while (p) {
                n += fread(p + n, 1, cap - n - 1, f);
                if (n < cap - 1) break;
                char *np = kiln_realloc(p, cap * 2);
                if (!np) kiln_free(p);
                p = np;
                cap *= 2;
            }
            fclose(f);
            if (!p) return kiln_err_set(err, KILN_ERR_NOMEM, "reading %s: out of memory", path);
            p[n] = 0;
            *out = p;
            if (out_len) *out_len = n;
            return KILN_OK;
        }
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    if (!cfg)
        return kiln_err_set(err, KILN_ERR_NOT_FOUND, "no chat template: %s: %s", path, je.text);
    json_t *ct = json_object_get(cfg, "chat_template");
    kiln_status st = KILN_OK;
    if (json_is_string(ct) && (!name || !*name || !strcmp(name, "default"))) {
        st = dup_json_str(ct, out, out_len, err);
    } else if (json_is_array(ct)) {
        size_t i;
        json_t *e;
        const char *want = name && *name ? name : "default";
        json_array_foreach(ct, i, e) {
            const char *n = json_string_value(json_object_get(e, "name"));
            json_t *t = json_object_get(e, "template");
            if (n && !strcmp(n, want) && json_is_string(t)) {
                st = dup_json_str(t, out, out_len, err);
                break;
            }
        }
        if (!*out && !st)
            st = kiln_err_set(err, KILN_ERR_NOT_FOUND, "%s: no chat template named '%s'", path,
                              want);
    } else {
        st = kiln_err_set(err, KILN_ERR_NOT_FOUND, "%s: no chat template%s%s", path,
                          name && *name ? " named " : "", name && *name ? name : "");
    }
    json_decref(cfg);
    return st;
}

static kiln_status token_text(const kiln_meta *m, const char *id_key, char **out, kiln_err *err) {
    *out = NULL;
    const kiln_meta_value *idv = kiln_meta_find(m, id_key);
    if (!idv) return KILN_OK;
    uint64_t id;
    KILN_TRY(kiln_meta_value_u64(idv, &id, id_key, err));
    const kiln_meta_value *toks;
    KILN_TRY(kiln_meta_get_arr(m, "tokenizer.ggml.tokens", KILN_META_STRING, &toks, err));
    kiln_str s;
    if (!kiln_meta_arr_str(toks, id, &s))
        return kiln_err_set(err, KILN_ERR_RANGE, "%s = %llu is past the vocabulary (%llu tokens)",
                            id_key, (unsigned long long)id, (unsigned long long)toks->count);
    char *p = kiln_malloc(s.len + 1);
    if (!p) return kiln_err_set(err, KILN_ERR_NOMEM, "out of memory");
    memcpy(p, s.ptr, s.len);
    p[s.len] = 0;
    *out = p;
    return KILN_OK;
}

kiln_status kiln_chat_template_special_tokens(const kiln_meta *m, char **bos, char **eos,
                                              kiln_err *err) {
    *bos = *eos = NULL;
    kiln_status st = token_text(m, "tokenizer.ggml.bos_token_id", bos, err);
    if (!st) st = token_text(m, "tokenizer.ggml.eos_token_id", eos, err);
    if (st) {
        kiln_free(*bos);
        kiln_free(*eos);
        *bos = *eos = NULL;
    }
    return st;
}
