/*
 * template.c — the chat-template layer over jinja.h: builds the context Hugging Face's
 * apply_chat_template passes (messages, tools, documents, add_generation_prompt,
 * special tokens, extra variables) and renders.
 */
#include "tok/template.h"
#include "tok/jinja.h"

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
    kiln_chat_template *ct = calloc(1, sizeof *ct);
    if (!ct) return kiln_err_set(err, KILN_ERR_NOMEM, "chat template: out of memory");
    snprintf(ct->name, sizeof ct->name, "%s", name && *name ? name : "chat template");
    kiln_status st = jinja_parse(src, len, &ct->t, err);
    if (st) {
        free(ct);
        return kiln_err_wrap(err, st, "%s", name && *name ? name : "chat template");
    }
    *out = ct;
    return KILN_OK;
}

void kiln_chat_template_free(kiln_chat_template *t) {
    if (!t) return;
    jinja_free(t->t);
    free(t);
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
