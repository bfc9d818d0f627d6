/* gen.c — shared model/engine setup and prefill for the generating commands. */
#include "cli/gen.h"
#include "base/mem.h"

#include "cli/commands.h"
#include "tok/template.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kiln_status kiln_gen_open(const kiln_gen_opts *o, kiln_gen_ctx *g, kiln_err *err) {
    memset(g, 0, sizeof(*g));
    char path[4096];
    KILN_TRY(kiln_resolve_model(o->model, path, sizeof(path), err));
    KILN_TRY(kiln_model_load(path, &g->model, err));
    kiln_status st = kiln_model_load_vocab(g->model, err);
    if (st) {
        kiln_gen_close(g);
        return st;
    }
    g->n_vocab = g->model->cfg.n_vocab;
    g->n_vocab_tok = (int32_t)kiln_vocab_n_tokens(g->model->vocab);
    g->n_ctx = o->n_ctx > 0 ? o->n_ctx
                            : (g->model->cfg.n_ctx_train < 4096 ? g->model->cfg.n_ctx_train : 4096);
    g->max_step = o->max_step > 0 ? o->max_step : 512;
    kiln_engine_opts eo;
    kiln_engine_opts_default(&eo);
    eo.backend = kiln_cli_backend(o->backend);
    eo.n_threads = o->n_threads;
    eo.n_ctx = g->n_ctx * (o->max_seqs > 0 ? o->max_seqs : 1);
    eo.max_step_tokens = g->max_step;
    eo.max_seqs = o->max_seqs > 0 ? o->max_seqs : 4;
    eo.kv_f16 = o->kv_f16;
    eo.numerics = o->numerics;
    eo.tp = o->tp;
    st = kiln_engine_create(g->model, &eo, &g->engine, err);
    if (!st && o->load_report) kiln_cli_print_load_report(g->engine);
    if (!st) {
        g->logits = kiln_malloc((size_t)g->max_step * (size_t)g->n_vocab * sizeof(float));
        if (!g->logits) st = kiln_err_set(err, KILN_ERR_NOMEM, "logits buffer");
    }
    if (st) kiln_gen_close(g);
    return st;
}

void kiln_gen_close(kiln_gen_ctx *g) {
    kiln_engine_free(g->engine);
    kiln_model_free(g->model);
    kiln_free(g->logits);
    memset(g, 0, sizeof(*g));
}

kiln_status kiln_gen_prefill(kiln_gen_ctx *g, int32_t seq, const int32_t *ids, size_t n,
                             float *last_logits, kiln_err *err) {
    kiln_batch_entry *b = kiln_malloc((size_t)g->max_step * sizeof(*b));
    if (!b) return kiln_err_set(err, KILN_ERR_NOMEM, "batch");
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < n && !st; i += (size_t)g->max_step) {
        size_t m = n - i < (size_t)g->max_step ? n - i : (size_t)g->max_step;
        int32_t pos = kiln_seq_len(g->engine, seq);
        for (size_t j = 0; j < m; j++)
            b[j] = (kiln_batch_entry){seq, ids[i + j], pos + (int32_t)j,
                                      last_logits && i + j == n - 1};
        st = kiln_engine_step(g->engine, b, (int32_t)m, g->logits, err);
    }
    if (!st && last_logits && n > 0)
        memcpy(last_logits, g->logits, (size_t)g->n_vocab * sizeof(float));
    kiln_free(b);
    return st;
}

/* The Gemma turn format (as llama.cpp's built-in "gemma" template), for Gemma GGUFs
 * published without tokenizer.chat_template: system text is prepended to the first
 * user turn; the assistant role is "model". */
static const char gemma_template[] =
    "{{ bos_token }}{% set sys = '' %}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set sys = m['content'] + '\n\n' %}"
    "{% else %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' "
    "}}"
    "{% if loop.index0 <= 1 %}{{ sys }}{% endif %}{{ m['content'] | trim }}{{ '<end_of_turn>\n' "
    "}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

kiln_status kiln_gen_render_chat(const kiln_model *m, const char *tpl, const json_t *msgs,
                                 char **out, kiln_err *err) {
    const char *src = tpl ? tpl : m->chat_template;
    const char *name = tpl ? "--chat-template" : "tokenizer.chat_template";
    if (!src && strncmp(m->cfg.arch, "gemma", 5) == 0) {
        src = gemma_template;
        name = "built-in gemma template";
    }
    if (!src)
        return kiln_err_set(
            err, KILN_ERR_NOT_FOUND,
            "%s: no chat template (tokenizer.chat_template); give one with --chat-template FILE",
            m->path);
    kiln_chat_template *t;
    KILN_TRY(kiln_chat_template_parse(src, strlen(src), name, &t, err));
    char bos[256] = "", eos[256] = "";
    kiln_str s;
    if (m->cfg.bos_id >= 0) {
        s = kiln_vocab_text(m->vocab, m->cfg.bos_id);
        snprintf(bos, sizeof(bos), "%.*s", (int)s.len, s.ptr);
    }
    if (m->cfg.eos_id >= 0) {
        s = kiln_vocab_text(m->vocab, m->cfg.eos_id);
        snprintf(eos, sizeof(eos), "%.*s", (int)s.len, s.ptr);
    }
    kiln_chat_inputs in = {
        .messages = msgs, .add_generation_prompt = true, .bos_token = bos, .eos_token = eos};
    size_t len;
    kiln_status st = kiln_chat_template_render(t, &in, out, &len, err);
    kiln_chat_template_free(t);
    return st;
}

kiln_status kiln_gen_tokenize_chat(const kiln_model *m, const char *text, kiln_tokens *out,
                                   kiln_err *err) {
    const kiln_vocab *v = m->vocab;
    kiln_str bos = kiln_vocab_text(v, kiln_vocab_bos(v));
    bool has_bos = bos.len > 0 && strncmp(text, bos.ptr, bos.len) == 0;
    unsigned fl = KILN_TOK_PARSE_SPECIAL | (has_bos ? 0 : KILN_TOK_ADD_SPECIAL);
    return kiln_tokenize(v, text, strlen(text), fl, out, err);
}

kiln_status kiln_gen_chat_prompt(const kiln_model *m, const char *tpl, const char *user, char **out,
                                 kiln_err *err) {
    json_t *msgs = json_array();
    json_t *msg = json_pack("{s:s, s:s}", "role", "user", "content", user);
    if (!msgs || !msg || json_array_append_new(msgs, msg)) {
        json_decref(msgs);
        return kiln_err_set(err, KILN_ERR_NOMEM, "chat messages");
    }
    kiln_status st = kiln_gen_render_chat(m, tpl, msgs, out, err);
    json_decref(msgs);
    return st;
}

kiln_status kiln_gen_read_file(const char *path, char **out, size_t *len, kiln_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_err_errno(err, errno, "opening %s", path);
    size_t cap = 1 << 16, n = 0, k;
    char *b = kiln_malloc(cap + 1);
    while (b && (k = fread(b + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            char *q = kiln_realloc(b, cap * 2 + 1);
            if (!q) {
                kiln_free(b);
                b = NULL;
                break;
            }
            b = q;
            cap *= 2;
        }
    }
    int ferr = ferror(f);
    fclose(f);
    if (!b) return kiln_err_set(err, KILN_ERR_NOMEM, "reading %s", path);
    if (ferr) {
        kiln_free(b);
        return kiln_err_set(err, KILN_ERR_IO, "reading %s failed", path);
    }
    b[n] = 0;
    *out = b;
    *len = n;
    return KILN_OK;
}
