/* generate.c — one sequence from prompt ids to streamed text (see generate.h) and the
 * public text API of include/kiln/kiln.h ("text and generation"). */
#include "runtime/generate.h"
#include "base/mem.h"

#include "base/timer.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "sample/text.h"

#include <stdlib.h>
#include <string.h>

/* One step through the engine's own outputs (no copy of the logits): *logits points at
 * the engine's row 0 until the next step. */
static kiln_status run_step(kiln_engine *e, const kiln_batch_entry *b, int32_t n, bool greedy,
                            const kiln_sample_step *ss, int32_t n_tok, const float **logits,
                            int32_t *token, kiln_err *err) {
    kiln_step_opts so = {.greedy = greedy, .n_vocab_limit = n_tok, .sample = ss};
    KILN_TRY(kiln_engine_prepare(e, b, n, &so, err));
    KILN_TRY(kiln_engine_run(e, err));
    if (greedy || ss)
        *token = kiln_engine_token(e, 0);
    else
        *logits = kiln_engine_logits(e, 0);
    return KILN_OK;
}

static kiln_status prefill(kiln_engine *e, int32_t seq, const int32_t *ids, size_t n,
                           const float **logits, kiln_err *err) {
    const int32_t step = kiln_engine_max_step_tokens(e) > 0 ? kiln_engine_max_step_tokens(e) : 512;
    kiln_batch_entry *b = kiln_malloc((size_t)step * sizeof(*b));
    if (!b) return kiln_err_set(err, KILN_ERR_NOMEM, "generate: batch of %d", (int)step);
    kiln_status st = KILN_OK;
    int32_t unused;
    for (size_t i = 0; i < n && !st; i += (size_t)step) {
        size_t m = n - i < (size_t)step ? n - i : (size_t)step;
        int32_t pos = kiln_seq_len(e, seq);
        for (size_t j = 0; j < m; j++)
            b[j] = (kiln_batch_entry){seq, ids[i + j], pos + (int32_t)j, i + j == n - 1};
        st = run_step(e, b, (int32_t)m, false, NULL, 0, logits, &unused, err);
    }
    kiln_free(b);
    return st;
}

kiln_status kiln_generate_seq(kiln_engine *e, const kiln_vocab *v, const kiln_gen_run *r,
                              kiln_token_cb cb, void *user, kiln_gen_stats *stats, kiln_err *err) {
    kiln_gen_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof(*stats));
    if (!r->prompt || r->n_prompt == 0 || !r->sampling)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "generate: the prompt has no tokens");
    const int32_t n_vocab = e->model->cfg.n_vocab;
    const int32_t n_tok = (int32_t)kiln_vocab_n_tokens(v);
    const kiln_sampler_params *sp = r->sampling;
    kiln_sampler *smp = NULL;
    kiln_text_stream ts;
    memset(&ts, 0, sizeof(ts));
    const float *logits = NULL;                          /* the engine's row */
    int32_t *ov_id = NULL, *ov_count = NULL, ov_cap = 0; /* a device-sampled step's overrides */
    float *ov_bias = NULL;
    kiln_status st = kiln_sampler_create(sp, n_vocab, &smp, err);
    if (!st && !r->no_text)
        st = kiln_text_stream_init(&ts, v, r->prompt, r->n_prompt, r->stops, r->n_stops, err);
    if (st) goto done;
    for (size_t i = 0; i < r->n_prompt; i++) kiln_sampler_accept(smp, r->prompt[i]);
    uint64_t t0 = kiln_now_ns();
    if ((st = prefill(e, r->seq, r->prompt, r->n_prompt, &logits, err))) goto done;
    stats->n_prompt = (int64_t)r->n_prompt;
    stats->prompt_ms = kiln_elapsed_ms(t0);
    uint64_t t1 = kiln_now_ns();
    /* greedy without anything that needs the logits: the engine picks the token */
    const bool fused = sp->temperature <= 0 && sp->repeat_penalty == 1.0f &&
                       sp->frequency_penalty == 0.0f && sp->presence_penalty == 0.0f &&
                       sp->n_logit_bias == 0 && sp->n_logprobs < 0;
    /* otherwise, on a device backend (cuda) whose sample kernel gives this sampler's
     * tokens: the device samples each decode step and only the id comes back */
    const bool on_dev = !fused && !r->host_sampling && kiln_engine_device_sampling(e);
    kiln_sample_row_params srow;
    kiln_sample_step ss = {.rows = &srow};
    int32_t next = -2; /* -2: sample from logits */
    bool stop = false;
    while (stats->n_gen < r->n_predict && !stop) {
        int32_t id = next != -2 ? next : logits ? kiln_sampler_sample(smp, logits, n_tok) : -1;
        if (id < 0) {
            st = kiln_err_set(err, KILN_ERR_INTERNAL,
                              "generate: no token could be sampled (every logit NaN or -inf)");
            goto done;
        }
        stats->n_gen++;
        if (!r->ignore_eos && kiln_vocab_is_eog(v, id)) {
            stats->stopped = true;
            break;
        }
        kiln_sampler_accept(smp, id);
        const char *txt = "";
        size_t len = 0;
        if (!r->no_text && (st = kiln_text_stream_push(&ts, id, &txt, &len, &stop, err))) goto done;
        if (cb && cb(user, id, txt, len)) stop = true;
        if (stop) {
            stats->stopped = true;
            break;
        }
        if (stats->n_gen == r->n_predict) break;
        kiln_batch_entry b = {r->seq, id, kiln_seq_len(e, r->seq), 1};
        const kiln_sample_step *sstep = NULL;
        if (on_dev && kiln_sampler_device_ok(smp, n_tok)) {
            int32_t need = kiln_sampler_device_max_overrides(smp);
            if (need > ov_cap) {
                kiln_free(ov_id);
                kiln_free(ov_bias);
                kiln_free(ov_count);
                ov_cap = need;
                ov_id = kiln_malloc((size_t)need * sizeof(int32_t));
                ov_bias = kiln_malloc((size_t)need * sizeof(float));
                ov_count = kiln_malloc((size_t)need * sizeof(int32_t));
                if (!ov_id || !ov_bias || !ov_count) {
                    st = kiln_err_set(err, KILN_ERR_NOMEM, "generate: out of memory");
                    goto done;
                }
            }
            srow.ov_off = 0;
            st = kiln_sampler_device_row(smp, n_tok, &srow, ov_id, ov_bias, ov_count, ov_cap, err);
            if (st) goto done;
            ss.ov_id = ov_id;
            ss.ov_bias = ov_bias;
            ss.ov_count = ov_count;
            ss.n_ov = srow.n_ov;
            sstep = &ss;
        }
        if ((st = run_step(e, &b, 1, fused, sstep, n_tok, &logits, &next, err))) goto done;
        if (!sstep && !fused) next = -2;
    }
    if (!r->no_text) {
        char *rest;
        size_t len;
        if ((st = kiln_text_stream_finish(&ts, &rest, &len, err))) goto done;
        if (cb && len > 0) cb(user, -1, rest, len);
        kiln_free(rest);
    }
    stats->gen_ms = kiln_elapsed_ms(t1);
done:
    kiln_free(ov_id);
    kiln_free(ov_bias);
    kiln_free(ov_count);
    kiln_text_stream_free(&ts);
    kiln_sampler_free(smp);
    return st;
}

/* ---- public text API ---- */

kiln_status kiln_model_load_tokenizer(kiln_model *m, kiln_err *err) {
    if (!m) return kiln_err_set(err, KILN_ERR_INVALID_ARG, "kiln_model_load_tokenizer: no model");
    return kiln_model_load_vocab(m, err);
}

static kiln_status need_vocab(const kiln_model *m, const char *fn, kiln_err *err) {
    if (!m) return kiln_err_set(err, KILN_ERR_INVALID_ARG, "%s: no model", fn);
    if (!m->vocab)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "%s: %s has no tokenizer loaded (call kiln_model_load_tokenizer)", fn,
                            m->path);
    return KILN_OK;
}

kiln_status kiln_model_tokenize(const kiln_model *m, const char *text, size_t len, int add_special,
                                int parse_special, int32_t *ids, int32_t cap, int32_t *n_out,
                                kiln_err *err) {
    *n_out = 0;
    KILN_TRY(need_vocab(m, "kiln_model_tokenize", err));
    if (!text && len > 0)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "kiln_model_tokenize: no text");
    kiln_tokens t = {0};
    unsigned fl =
        (add_special ? KILN_TOK_ADD_SPECIAL : 0) | (parse_special ? KILN_TOK_PARSE_SPECIAL : 0);
    KILN_TRY(kiln_tokenize(m->vocab, text ? text : "", len, fl, &t, err));
    kiln_status st = KILN_OK;
    if (t.n > INT32_MAX) {
        st = kiln_err_set(err, KILN_ERR_OVERFLOW, "kiln_model_tokenize: %zu tokens", t.n);
    } else {
        *n_out = (int32_t)t.n;
        if ((int32_t)t.n > cap)
            st = kiln_err_set(err, KILN_ERR_RANGE,
                              "kiln_model_tokenize: the text has %zu tokens, room for %d", t.n,
                              (int)cap);
        else if (t.n > 0)
            memcpy(ids, t.ids, t.n * sizeof(int32_t));
    }
    kiln_tokens_free(&t);
    return st;
}

kiln_status kiln_model_detokenize(const kiln_model *m, const int32_t *ids, int32_t n, char *buf,
                                  size_t cap, size_t *len_out, kiln_err *err) {
    *len_out = 0;
    KILN_TRY(need_vocab(m, "kiln_model_detokenize", err));
    if (n < 0 || (n > 0 && !ids))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "kiln_model_detokenize: %d ids", (int)n);
    char *t;
    size_t len;
    KILN_TRY(kiln_detokenize(m->vocab, ids, (size_t)n, KILN_DETOK_SEQUENCE, &t, &len, err));
    *len_out = len;
    kiln_status st = KILN_OK;
    if (len >= cap)
        st = kiln_err_set(err, KILN_ERR_RANGE,
                          "kiln_model_detokenize: the text has %zu bytes, room for %zu", len, cap);
    else
        memcpy(buf, t, len + 1);
    kiln_free(t);
    return st;
}

void kiln_gen_params_default(kiln_gen_params *p) {
    memset(p, 0, sizeof(*p));
    kiln_sampler_params sp;
    kiln_sampler_params_default(&sp);
    p->n_predict = 128;
    p->temperature = sp.temperature;
    p->top_k = sp.top_k;
    p->top_p = sp.top_p;
    p->min_p = sp.min_p;
    p->repeat_penalty = sp.repeat_penalty;
    p->repeat_last_n = sp.repeat_last_n;
    p->frequency_penalty = sp.frequency_penalty;
    p->presence_penalty = sp.presence_penalty;
    p->seed = sp.seed;
}

kiln_status kiln_generate(kiln_engine *e, const kiln_model *m, const char *prompt,
                          const kiln_gen_params *p, kiln_token_cb cb, void *user, kiln_err *err) {
    KILN_TRY(need_vocab(m, "kiln_generate", err));
    if (!e || e->model != m)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "kiln_generate: the engine was not created for this model");
    if (!prompt || !p)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "kiln_generate: no prompt or parameters");
    if (p->n_predict < 0 || p->n_stop < 0 || (p->n_stop > 0 && !p->stop))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "kiln_generate: n_predict %d, %d stop strings", (int)p->n_predict,
                            (int)p->n_stop);
    kiln_sampler_params sp;
    kiln_sampler_params_default(&sp);
    sp.temperature = p->temperature;
    sp.top_k = p->top_k;
    sp.top_p = p->top_p;
    sp.min_p = p->min_p;
    sp.repeat_penalty = p->repeat_penalty;
    sp.repeat_last_n = p->repeat_last_n;
    sp.frequency_penalty = p->frequency_penalty;
    sp.presence_penalty = p->presence_penalty;
    sp.seed = p->seed;
    kiln_tokens toks = {0};
    KILN_TRY(kiln_tokenize(m->vocab, prompt, strlen(prompt), KILN_TOK_ADD_SPECIAL, &toks, err));
    kiln_status st = KILN_OK;
    int32_t seq = -1;
    if (toks.n == 0) {
        st = kiln_err_set(err, KILN_ERR_INVALID_ARG, "kiln_generate: the prompt has no tokens");
        goto done;
    }
    if ((st = kiln_seq_create(e, &seq, err))) goto done;
    kiln_gen_run r = {.seq = seq,
                      .prompt = toks.ids,
                      .n_prompt = toks.n,
                      .sampling = &sp,
                      .n_predict = p->n_predict,
                      .stops = p->stop,
                      .n_stops = (int)p->n_stop,
                      .ignore_eos = p->ignore_eos != 0};
    st = kiln_generate_seq(e, m->vocab, &r, cb, user, NULL, err);
done:
    if (seq >= 0) kiln_seq_free(e, seq);
    kiln_tokens_free(&toks);
    return st;
}
