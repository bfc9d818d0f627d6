/* loop.c — continuous batching over the engine for `kiln serve` (loop.h). */
#include "serve/loop.h"
#include "base/mem.h"

#include "base/log.h"
#include "base/timer.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct kiln_srv_loop {
    const kiln_model *model;
    kiln_engine *engine;
    const kiln_vocab *vocab;
    kiln_srv_loop_opts o;
    int32_t n_vocab, n_vocab_tok;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t work; /* queue or cancellations changed */
    bool stopping, draining;
    /* queue (FIFO) and running set; guarded by mu */
    kiln_srv_req **queue;
    int32_t q_head, q_len;
    kiln_srv_req **run;
    int32_t n_run, seqs_used;
    /* loop thread only */
    kiln_batch_entry *batch;
    struct {
        kiln_srv_req *r;
        int ch; /* -1: prompt end of choice 0 (fork after); >= 0: decode */
    } * rows;
    float *logits, *scratch;
    /* counters (guarded by mu) */
    uint64_t steps, tokens_prefill, tokens_decode;
    double step_seconds;
};

static void choice_free(kiln_srv_choice *c) {
    kiln_sampler_free(c->smp);
    kiln_detok_stream_free(c->ds);
    kiln_stopper_free(&c->stop);
    kiln_free(c->text);
    kiln_free(c->ids);
    json_decref(c->lp);
    memset(c, 0, sizeof(*c));
}

kiln_status kiln_srv_req_create(const kiln_oai_req *p, const int32_t *prompt, size_t n,
                                int64_t max_tokens, uint64_t seed, kiln_srv_req **out,
                                kiln_err *err) {
    kiln_srv_req *r = kiln_calloc(1, sizeof(*r));
    if (!r) return kiln_err_set(err, KILN_ERR_NOMEM, "request");
    r->prompt = kiln_malloc((n ? n : 1) * sizeof(int32_t));
    if (!r->prompt || pthread_cond_init(&r->cv, NULL)) {
        kiln_free(r->prompt);
        kiln_free(r);
        return kiln_err_set(err, KILN_ERR_NOMEM, "request");
    }
    memcpy(r->prompt, prompt, n * sizeof(int32_t));
    r->n_prompt = n;
    r->params = *p;
    r->params.root = r->params.messages = r->params.tools = NULL;
    r->params.prompt = NULL;
    r->params.prompt_ids = NULL;
    r->params.n_prompt_ids = 0;
    for (int i = 0; i < p->n_stop; i++)
        if (!(r->params.stop[i] = kiln_strdup(p->stop[i]))) {
            for (int j = 0; j < i; j++) kiln_free(r->params.stop[j]);
            pthread_cond_destroy(&r->cv);
            kiln_free(r->prompt);
            kiln_free(r);
            return kiln_err_set(err, KILN_ERR_NOMEM, "request");
        }
    r->p = &r->params;
    r->n_choices = p->n;
    r->seed = seed;
    r->max_tokens = max_tokens;
    r->refs = 1;
    for (int i = 0; i < KILN_OAI_MAX_N; i++) r->ch[i].seq = -1;
    *out = r;
    return KILN_OK;
}

static void req_destroy(kiln_srv_req *r) {
    for (int i = 0; i < KILN_OAI_MAX_N; i++) choice_free(&r->ch[i]);
    for (int i = 0; i < r->params.n_stop; i++) kiln_free(r->params.stop[i]);
    pthread_cond_destroy(&r->cv);
    kiln_free(r->prompt);
    kiln_free(r);
}

void kiln_srv_req_release(kiln_srv_loop *l, kiln_srv_req *r) {
    if (!r) return;
    pthread_mutex_lock(&l->mu);
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&l->mu);
    if (last) req_destroy(r);
}

void kiln_srv_lock(kiln_srv_loop *l) {
    pthread_mutex_lock(&l->mu);
}
void kiln_srv_unlock(kiln_srv_loop *l) {
    pthread_mutex_unlock(&l->mu);
}

bool kiln_srv_wait(kiln_srv_loop *l, kiln_srv_req *r, uint64_t seen, int timeout_ms) {
    pthread_mutex_lock(&l->mu);
    if (r->version != seen) return true;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    while (r->version == seen)
        if (pthread_cond_timedwait(&r->cv, &l->mu, &ts) == ETIMEDOUT) break;
    return r->version != seen;
}

kiln_status kiln_srv_submit(kiln_srv_loop *l, kiln_srv_req *r, kiln_err *err) {
    pthread_mutex_lock(&l->mu);
    kiln_status st = KILN_OK;
    if (l->draining || l->stopping)
        st = kiln_err_set(err, KILN_ERR_STATE, "the server is shutting down");
    else if (l->q_len >= l->o.max_queue)
        st = kiln_err_set(err, KILN_ERR_CAPACITY,
                          "the server is busy: %d requests are waiting (queue limit %d)", l->q_len,
                          l->o.max_queue);
    if (!st) {
        l->queue[(l->q_head + l->q_len) % l->o.max_queue] = r;
        l->q_len++;
        r->refs++;
        r->state = 1;
        r->t_submit = kiln_now_ns();
        pthread_cond_signal(&l->work);
    }
    pthread_mutex_unlock(&l->mu);
    return st;
}

void kiln_srv_cancel(kiln_srv_loop *l, kiln_srv_req *r) {
    pthread_mutex_lock(&l->mu);
    if (r->state != 3) {
        r->cancel = true;
        pthread_cond_signal(&l->work);
    }
    pthread_mutex_unlock(&l->mu);
}

int kiln_srv_loop_busy(kiln_srv_loop *l) {
    pthread_mutex_lock(&l->mu);
    int n = l->q_len + l->n_run;
    pthread_mutex_unlock(&l->mu);
    return n;
}

void kiln_srv_loop_drain(kiln_srv_loop *l) {
    pthread_mutex_lock(&l->mu);
    l->draining = true;
    pthread_mutex_unlock(&l->mu);
}

char *kiln_srv_loop_metrics(kiln_srv_loop *l) {
    char *s = NULL;
    pthread_mutex_lock(&l->mu);
    int k = asprintf(&s,
                     "# TYPE kiln_requests_running gauge\nkiln_requests_running %d\n"
                     "# TYPE kiln_requests_waiting gauge\nkiln_requests_waiting %d\n"
                     "# TYPE kiln_sequences_used gauge\nkiln_sequences_used %d\n"
                     "# TYPE kiln_slots gauge\nkiln_slots %d\n"
                     "# TYPE kiln_steps_total counter\nkiln_steps_total %llu\n"
                     "# TYPE kiln_step_seconds_total counter\nkiln_step_seconds_total %.6f\n"
                     "# TYPE kiln_prefill_tokens_total counter\nkiln_prefill_tokens_total %llu\n"
                     "# TYPE kiln_decode_tokens_total counter\nkiln_decode_tokens_total %llu\n",
                     l->n_run, l->q_len, l->seqs_used, l->o.slots, (unsigned long long)l->steps,
                     l->step_seconds, (unsigned long long)l->tokens_prefill,
                     (unsigned long long)l->tokens_decode);
    pthread_mutex_unlock(&l->mu);
    return k < 0 ? NULL : s;
}

/* ---- the loop thread ----------------------------------------------------------------- */

static void bump(kiln_srv_req *r) {
    r->version++;
    pthread_cond_broadcast(&r->cv);
}

/* under mu */
static void finish_req(kiln_srv_loop *l, kiln_srv_req *r) {
    for (int i = 0; i < r->n_choices; i++) {
        if (r->ch[i].seq >= 0) {
            kiln_seq_free(l->engine, r->ch[i].seq);
            r->ch[i].seq = -1;
            l->seqs_used--;
        }
        if (r->ch[i].finish == KILN_FIN_NONE) r->ch[i].finish = KILN_FIN_CANCEL;
    }
    r->state = 3;
    r->t_done = kiln_now_ns();
    bump(r);
}

static kiln_status append_text(kiln_srv_choice *c, const char *s, size_t n) {
    if (c->len + n + 1 > c->cap) {
        size_t nc = (c->len + n + 1) * 2;
        char *q = kiln_realloc(c->text, nc);
        if (!q) return KILN_ERR_NOMEM;
        c->text = q;
        c->cap = nc;
    }
    memcpy(c->text + c->len, s, n);
    c->len += n;
    c->text[c->len] = 0;
    return KILN_OK;
}

static kiln_status init_choice(kiln_srv_loop *l, kiln_srv_req *r, int i, kiln_err *err) {
    kiln_srv_choice *c = &r->ch[i];
    const kiln_oai_req *p = r->p;
    kiln_sampler_params sp;
    kiln_sampler_params_default(&sp);
    sp.temperature = (float)p->temperature;
    sp.top_k = p->top_k;
    sp.top_p = (float)p->top_p;
    sp.min_p = (float)p->min_p;
    sp.repeat_penalty = (float)p->repetition_penalty;
    sp.repeat_last_n = -1;
    sp.frequency_penalty = (float)p->frequency_penalty;
    sp.presence_penalty = (float)p->presence_penalty;
    sp.seed = r->seed + (uint64_t)i;
    KILN_TRY(kiln_sampler_create(&sp, l->n_vocab_tok, &c->smp, err));
    KILN_TRY(kiln_detok_stream_create(l->vocab, false, &c->ds, err));
    /* Prime the stream with the last prompt token so that the first generated token
     * is not treated as the start of a text (SPM vocabularies drop the leading space of
     * a text's first token: "lived" + " мат" must not become "lived" + "мат"). */
    if (r->n_prompt > 0) {
        const char *t;
        size_t tl;
        KILN_TRY(kiln_detok_stream_push(c->ds, r->prompt[r->n_prompt - 1], &t, &tl, err));
    }
    KILN_TRY(kiln_stopper_init(&c->stop, (const char *const *)p->stop, p->n_stop, NULL, 0, err));
    if (p->logprobs && !(c->lp = json_array()))
        return kiln_err_set(err, KILN_ERR_NOMEM, "logprobs");
    return KILN_OK;
}

/* admits queued requests while sequences are free; under mu */
static void admit(kiln_srv_loop *l) {
    while (l->q_len > 0) {
        kiln_srv_req *r = l->queue[l->q_head];
        if (!r->cancel && l->seqs_used + r->n_choices > l->o.slots) break;
        l->q_head = (l->q_head + 1) % l->o.max_queue;
        l->q_len--;
        kiln_err err;
        kiln_err_clear(&err);
        kiln_status st = r->cancel ? KILN_ERR_CANCELLED : KILN_OK;
        for (int i = 0; !st && i < r->n_choices; i++) st = init_choice(l, r, i, &err);
        if (!st) st = kiln_seq_create(l->engine, &r->ch[0].seq, &err);
        if (!st) l->seqs_used++;
        l->run[l->n_run++] = r;
        r->state = 2;
        if (st) {
            r->err_code = st;
            snprintf(r->err_msg, sizeof(r->err_msg), "%.255s",
                     st == KILN_ERR_CANCELLED ? "cancelled" : err.msg);
        }
    }
}

static void top_logprobs(const float *lg, int32_t n, double lse, int32_t k, int32_t *ids,
                         float *vals) {
    int m = 0;
    for (int32_t i = 0; i < n; i++) {
        float v = lg[i];
        if (m == k && !(v > vals[m - 1])) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && vals[j - 1] < v) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = v;
        ids[j] = i;
    }
    for (int j = 0; j < m; j++) vals[j] = (float)(vals[j] - lse);
}

static json_t *token_json(const kiln_vocab *v, int32_t id, double lp) {
    kiln_str s = kiln_token_piece(v, id, true, 0);
    json_t *bytes = json_array();
    for (size_t i = 0; bytes && i < s.len; i++)
        json_array_append_new(bytes, json_integer((unsigned char)s.ptr[i]));
    json_t *o = json_object();
    if (!o || !bytes) {
        json_decref(o);
        json_decref(bytes);
        return NULL;
    }
    json_object_set_new(o, "token",
                        json_stringn(s.ptr, s.len) ? json_stringn(s.ptr, s.len)
                                                   : json_string("\xef\xbf\xbd"));
    json_object_set_new(o, "logprob", json_real(isfinite(lp) ? lp : -9999.0));
    json_object_set_new(o, "bytes", bytes);
    return o;
}

/* Samples choice i of r from logits row lg; under no lock (reads only loop-owned
 * state); text goes in under mu (caller). Returns the token or -1 at the end. */
static int32_t sample_one(kiln_srv_loop *l, kiln_srv_req *r, int i, const float *lg,
                          json_t **lp_out) {
    kiln_srv_choice *c = &r->ch[i];
    const kiln_oai_req *p = r->p;
    const float *row = lg;
    if (p->n_bias > 0) {
        memcpy(l->scratch, lg, (size_t)l->n_vocab * sizeof(float));
        for (int b = 0; b < p->n_bias; b++) l->scratch[p->bias_id[b]] += p->bias_val[b];
        row = l->scratch;
    }
    int32_t id = kiln_sampler_sample(c->smp, row, l->n_vocab_tok);
    *lp_out = NULL;
    if (id >= 0 && p->logprobs) {
        double mx = -INFINITY, sum = 0;
        for (int32_t k = 0; k < l->n_vocab_tok; k++)
            if (lg[k] > mx) mx = lg[k];
        for (int32_t k = 0; k < l->n_vocab_tok; k++) sum += exp((double)lg[k] - mx);
        double lse = mx + log(sum);
        json_t *o = token_json(l->vocab, id, (double)(float)((double)lg[id] - lse));
        json_t *tops = json_array();
        if (o && tops && p->top_logprobs > 0) {
            int32_t ids[KILN_OAI_MAX_TOP_LOGPROBS];
            float vals[KILN_OAI_MAX_TOP_LOGPROBS];
            int32_t k = p->top_logprobs < l->n_vocab_tok ? p->top_logprobs : l->n_vocab_tok;
            top_logprobs(lg, l->n_vocab_tok, lse, k, ids, vals);
            for (int j = 0; j < k; j++)
                json_array_append_new(tops, token_json(l->vocab, ids[j], vals[j]));
        }
        if (o) json_object_set_new(o, "top_logprobs", tops ? tops : json_array());
        *lp_out = o;
    }
    return id;
}

/* Records token id for choice i (under mu). */
static void accept_token(kiln_srv_loop *l, kiln_srv_req *r, int i, int32_t id, json_t *lp) {
    kiln_srv_choice *c = &r->ch[i];
    if (!r->t_first) r->t_first = kiln_now_ns();
    if (id < 0 || kiln_vocab_is_eog(l->vocab, id)) {
        json_decref(lp);
        c->finish = KILN_FIN_STOP;
        c->eog = id >= 0;
    } else {
        kiln_sampler_accept(c->smp, id);
        c->last = id;
        if (c->n_ids == c->ids_cap) {
            size_t nc = c->ids_cap ? c->ids_cap * 2 : 64;
            int32_t *q = kiln_realloc(c->ids, nc * sizeof(int32_t));
            if (!q) {
                json_decref(lp);
                c->finish = KILN_FIN_CANCEL;
                return;
            }
            c->ids = q;
            c->ids_cap = nc;
        }
        c->ids[c->n_ids++] = id;
        if (lp) json_array_append_new(c->lp, lp);
        const char *t, *emit;
        size_t tl, el;
        bool stopped = false;
        kiln_err err;
        if (kiln_detok_stream_push(c->ds, id, &t, &tl, &err) ||
            kiln_stopper_feed(&c->stop, t, tl, &emit, &el, &stopped, &err) ||
            append_text(c, emit, el)) {
            c->finish = KILN_FIN_CANCEL;
            return;
        }
        if (stopped) {
            c->finish = KILN_FIN_STOP;
        } else if ((int64_t)c->n_ids >= r->max_tokens) {
            c->finish = KILN_FIN_LENGTH;
        }
    }
    if (c->finish == KILN_FIN_STOP || c->finish == KILN_FIN_LENGTH) {
        /* the end: held bytes and held stop-prefix text come out */
        const char *t, *emit;
        size_t tl, el;
        bool stopped = false;
        kiln_err err;
        if (!c->stop.stopped) {
            kiln_detok_stream_flush(c->ds, &t, &tl);
            if (!kiln_stopper_feed(&c->stop, t, tl, &emit, &el, &stopped, &err))
                append_text(c, emit, el);
            if (!stopped) {
                kiln_stopper_flush(&c->stop, &emit, &el);
                append_text(c, emit, el);
            } else {
                c->finish = KILN_FIN_STOP;
            }
        }
        if (c->seq >= 0) {
            kiln_seq_free(l->engine, c->seq);
            c->seq = -1;
            l->seqs_used--;
        }
    }
    l->tokens_decode++;
}

static bool req_all_done(const kiln_srv_req *r) {
    for (int i = 0; i < r->n_choices; i++)
        if (r->ch[i].finish == KILN_FIN_NONE) return false;
    return true;
}

static void *loop_main(void *arg) {
    kiln_srv_loop *l = arg;
    kiln_err err;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        admit(l);
        /* retire cancelled, failed and finished requests */
        for (int32_t i = 0; i < l->n_run;) {
            kiln_srv_req *r = l->run[i];
            if (r->cancel || r->err_code || req_all_done(r)) {
                if (r->cancel && !r->err_code) r->err_code = KILN_ERR_CANCELLED;
                finish_req(l, r);
                l->run[i] = l->run[--l->n_run];
                if (--r->refs == 0) {
                    pthread_mutex_unlock(&l->mu);
                    req_destroy(r);
                    pthread_mutex_lock(&l->mu);
                }
                continue;
            }
            i++;
        }
        if (l->n_run == 0) {
            if (l->stopping && l->q_len == 0) break;
            if (l->q_len == 0) pthread_cond_wait(&l->work, &l->mu);
            continue;
        }
        /* plan the step: decode tokens first, then prompt chunks */
        int32_t nb = 0, nrows = 0;
        for (int32_t i = 0; i < l->n_run; i++) {
            kiln_srv_req *r = l->run[i];
            if (r->n_fed < r->n_prompt) continue;
            for (int c = 0; c < r->n_choices; c++) {
                kiln_srv_choice *ch = &r->ch[c];
                if (ch->finish != KILN_FIN_NONE || ch->seq < 0) continue;
                if (nb >= l->o.max_step) break;
                l->batch[nb++] =
                    (kiln_batch_entry){ch->seq, ch->last, kiln_seq_len(l->engine, ch->seq), 1};
                l->rows[nrows].r = r;
                l->rows[nrows++].ch = c;
            }
        }
        for (int32_t i = 0; i < l->n_run && nb < l->o.max_step; i++) {
            kiln_srv_req *r = l->run[i];
            if (r->n_fed >= r->n_prompt) continue;
            size_t m = r->n_prompt - r->n_fed;
            if (m > (size_t)(l->o.max_step - nb)) m = (size_t)(l->o.max_step - nb);
            for (size_t j = 0; j < m; j++) {
                size_t k = r->n_fed + j;
                bool last = k == r->n_prompt - 1;
                l->batch[nb++] = (kiln_batch_entry){r->ch[0].seq, r->prompt[k], (int32_t)k, last};
                if (last) {
                    l->rows[nrows].r = r;
                    l->rows[nrows++].ch = -1;
                }
            }
            r->n_fed += m;
            l->tokens_prefill += m;
        }
        pthread_mutex_unlock(&l->mu);
        uint64_t t0 = kiln_now_ns();
        kiln_err_clear(&err);
        kiln_status st = kiln_engine_step(l->engine, l->batch, nb, l->logits, &err);
        double dt = (double)(kiln_now_ns() - t0) * 1e-9;
        /* sample outside the lock (loop-owned state), then publish */
        json_t *lps[1];
        pthread_mutex_lock(&l->mu);
        l->steps++;
        l->step_seconds += dt;
        if (st) {
            KILN_ERROR("serve: engine step failed: %s", err.msg);
            for (int32_t i = 0; i < l->n_run; i++) {
                l->run[i]->err_code = st;
                snprintf(l->run[i]->err_msg, sizeof(l->run[i]->err_msg), "%.255s", err.msg);
            }
            continue;
        }
        for (int32_t k = 0; k < nrows; k++) {
            kiln_srv_req *r = l->rows[k].r;
            const float *lg = l->logits + (size_t)k * (size_t)l->n_vocab;
            if (l->rows[k].ch >= 0) {
                int c = l->rows[k].ch;
                pthread_mutex_unlock(&l->mu);
                int32_t id = sample_one(l, r, c, lg, &lps[0]);
                pthread_mutex_lock(&l->mu);
                accept_token(l, r, c, id, lps[0]);
            } else {
                /* prompt done: fork the other choices, then each samples its first token */
                for (int c = 1; c < r->n_choices && !r->err_code; c++) {
                    if (kiln_seq_fork(l->engine, r->ch[0].seq, &r->ch[c].seq, &err)) {
                        r->err_code = KILN_ERR_CAPACITY;
                        snprintf(r->err_msg, sizeof(r->err_msg), "%.255s", err.msg);
                        r->ch[c].seq = -1;
                    } else {
                        l->seqs_used++;
                    }
                }
                if (r->err_code) continue;
                for (int c = 0; c < r->n_choices; c++) {
                    pthread_mutex_unlock(&l->mu);
                    int32_t id = sample_one(l, r, c, lg, &lps[0]);
                    pthread_mutex_lock(&l->mu);
                    accept_token(l, r, c, id, lps[0]);
                }
            }
            bump(r);
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

kiln_status kiln_srv_loop_create(const kiln_model *m, kiln_engine *e, const kiln_srv_loop_opts *o,
                                 kiln_srv_loop **out, kiln_err *err) {
    if (o->slots < 1 || o->max_queue < 1 || o->max_step < o->slots || o->n_ctx < 2)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "serve loop: slots %d, queue %d, step %d (>= slots), ctx %lld",
                            o->slots, o->max_queue, o->max_step, (long long)o->n_ctx);
    kiln_srv_loop *l = kiln_calloc(1, sizeof(*l));
    if (!l) return kiln_err_set(err, KILN_ERR_NOMEM, "serve loop");
    l->model = m;
    l->engine = e;
    l->vocab = m->vocab;
    l->o = *o;
    l->n_vocab = m->cfg.n_vocab;
    l->n_vocab_tok = (int32_t)kiln_vocab_n_tokens(m->vocab);
    if (l->n_vocab_tok > l->n_vocab) l->n_vocab_tok = l->n_vocab;
    l->queue = kiln_calloc((size_t)o->max_queue, sizeof(*l->queue));
    l->run = kiln_calloc((size_t)o->slots + (size_t)o->max_queue, sizeof(*l->run));
    l->batch = kiln_calloc((size_t)o->max_step, sizeof(*l->batch));
    l->rows = kiln_calloc((size_t)o->max_step, sizeof(*l->rows));
    size_t rows = (size_t)o->slots + 1;
    l->logits = kiln_malloc(rows * (size_t)l->n_vocab * sizeof(float));
    l->scratch = kiln_malloc((size_t)l->n_vocab * sizeof(float));
    if (!l->queue || !l->run || !l->batch || !l->rows || !l->logits || !l->scratch) {
        kiln_srv_loop_free(l);
        return kiln_err_set(err, KILN_ERR_NOMEM, "serve loop buffers");
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->work, NULL);
    if (pthread_create(&l->thread, NULL, loop_main, l)) {
        kiln_srv_loop_free(l);
        return kiln_err_set(err, KILN_ERR_INTERNAL, "serve loop: pthread_create failed");
    }
    l->thread_started = true;
    *out = l;
    return KILN_OK;
}

void kiln_srv_loop_free(kiln_srv_loop *l) {
    if (!l) return;
    if (l->thread_started) {
        pthread_mutex_lock(&l->mu);
        l->stopping = true;
        pthread_cond_signal(&l->work);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->work);
    }
    kiln_free(l->queue);
    kiln_free(l->run);
    kiln_free(l->batch);
    kiln_free(l->rows);
    kiln_free(l->logits);
    kiln_free(l->scratch);
    kiln_free(l);
}
