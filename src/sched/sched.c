/*
 * sched.c — the scheduler's API: creation, tenants, the scheduler thread, submit /
 * cancel / resume (thread-safe, O(1) under `mu`), sessions, ledger reads. The step
 * itself is in step.c. Decisions and reasons: docs/SCHED.md.
 */
#include "sched/sched_impl.h"
#include "base/mem.h"

#include "base/log.h"
#include "base/timer.h"
#include "base/utf8.h"
#include "tok/tok.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void kiln_sched_opts_default(kiln_sched_opts *o) {
    memset(o, 0, sizeof(*o));
    o->prefix_cache = 1;
}

void kiln_request_params_default(kiln_request_params *p) {
    memset(p, 0, sizeof(*p));
    kiln_sampler_params_default(&p->sampling);
}

const char *kiln_finish_name(kiln_finish f) {
    switch (f) {
    case KILN_FINISH_STOP:
        return "stop";
    case KILN_FINISH_LENGTH:
        return "length";
    case KILN_FINISH_CANCELLED:
        return "cancelled";
    case KILN_FINISH_DISCONNECTED:
        return "disconnected";
    case KILN_FINISH_ERROR:
        return "error";
    case KILN_FINISH_SHUTDOWN:
        return "shutdown";
    default:
        return "";
    }
}

/* ---- creation ---- */

kiln_status kiln_sched_create_with(const kiln_sched_engine *eng, const kiln_vocab *v,
                                   const kiln_sched_opts *o, kiln_sched **out, kiln_err *err) {
    kiln_sched_opts d;
    if (!o) {
        kiln_sched_opts_default(&d);
        o = &d;
    }
    if (o->max_slots < 0 || o->step_tokens < 0 || o->max_queued < 0 || o->park_max_ms < 0 ||
        o->latency_step_tokens < 0)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "scheduler: negative option");
    kiln_sched *s = kiln_calloc(1, sizeof(*s));
    if (!s) return kiln_err_set(err, KILN_ERR_NOMEM, "scheduler: out of memory");
    s->eng = *eng;
    s->vocab = v;
    s->o = *o;
    s->n_vocab_tok = eng->n_vocab;
    if (v && (int64_t)kiln_vocab_n_tokens(v) < s->n_vocab_tok)
        s->n_vocab_tok = (int32_t)kiln_vocab_n_tokens(v);
    s->max_slots = o->max_slots > 0 ? o->max_slots : eng->max_seqs;
    if (s->max_slots > eng->max_seqs) s->max_slots = eng->max_seqs;
    if (s->max_slots > eng->max_step) s->max_slots = eng->max_step;
    s->step_tokens = o->step_tokens > 0 ? o->step_tokens : eng->max_step;
    if (s->step_tokens > eng->max_step) s->step_tokens = eng->max_step;
    if (s->step_tokens < s->max_slots) s->step_tokens = s->max_slots;
    s->latency_tokens = o->latency_step_tokens > 0 ? o->latency_step_tokens : 64;
    if (s->latency_tokens < s->max_slots) s->latency_tokens = s->max_slots;
    if (s->latency_tokens > s->step_tokens) s->latency_tokens = s->step_tokens;
    s->max_queued = o->max_queued > 0 ? o->max_queued : 4096;
    s->park_max_ms = o->park_max_ms > 0 ? o->park_max_ms : 30000;
    s->next_id = 1;
    s->next_sess = 1;
    s->done_rate = 0;
    kiln_status st = KILN_OK;
    if (pthread_mutex_init(&s->mu, NULL) || pthread_mutex_init(&s->lmu, NULL) ||
        pthread_cond_init(&s->cv, NULL)) {
        kiln_free(s);
        return kiln_err_set(err, KILN_ERR_IO, "scheduler: mutex init failed");
    }
    s->slots = kiln_calloc((size_t)s->max_slots, sizeof(ks_req *));
    s->en = kiln_calloc((size_t)s->step_tokens, sizeof(kiln_batch_entry));
    s->en_rq = kiln_calloc((size_t)s->step_tokens, sizeof(ks_req *));
    s->ids = kiln_calloc((size_t)s->step_tokens, sizeof(int32_t));
    s->top = kiln_calloc(21, sizeof(kiln_top_logprob));
    s->plan = kiln_calloc((size_t)s->max_slots, sizeof(ks_req *));
    s->cap_sess = 4096;
    s->sess = kiln_calloc((size_t)s->cap_sess, sizeof(ks_session));
    if (!s->slots || !s->en || !s->en_rq || !s->ids || !s->top || !s->sess || !s->plan)
        st = kiln_err_set(err, KILN_ERR_NOMEM, "scheduler: out of memory");
    s->pc_on = o->prefix_cache != 0;
    if (!st) st = kiln_prefix_init(&s->pc, &s->eng, eng->total_blocks, err);
    if (!st && o->trace_path) st = ks_trace_open(&s->trace, o->trace_path, err);
    if (st) {
        kiln_sched_free(s);
        return st;
    }
    if (o->deterministic && !eng->batch_invariant)
        KILN_WARN("scheduler: deterministic mode asked, but the %s backend does not promise "
                  "batch-invariant kernels: greedy outputs may depend on the batch",
                  eng->backend ? eng->backend : "?");
    s->stats.slots_total = s->max_slots;
    s->stats.kv_blocks_total = eng->total_blocks;
    *out = s;
    return KILN_OK;
}

kiln_status kiln_sched_create(kiln_engine *e, const kiln_vocab *v, const kiln_sched_opts *o,
                              kiln_sched **out, kiln_err *err) {
    kiln_sched_engine se;
    KILN_TRY(kiln_sched_engine_wrap(e, &se, err));
    kiln_status st = kiln_sched_create_with(&se, v, o, out, err);
    if (st) {
        kiln_sched_engine_unwrap(&se);
        return st;
    }
    (*out)->own_wrap = true;
    return KILN_OK;
}

static void tenant_free(ks_tenant *t) {
    kiln_free(t->own_id);
    kiln_free(t->own_group);
    for (int32_t i = 0; i < t->cfg.n_api_keys; i++) kiln_free(t->own_keys[i]);
    kiln_free(t->own_keys);
}

void kiln_sched_free(kiln_sched *s) {
    if (!s) return;
    kiln_sched_stop(s);
    pthread_mutex_lock(&s->mu);
    s->closing = true;
    pthread_mutex_unlock(&s->mu);
    ks_shutdown_all(s);
    for (int32_t i = 0; i < s->n_sess; i++) {
        for (int32_t j = s->sess[i].n_ent - 1; j >= 0; j--)
            kiln_prefix_release(&s->pc, s->sess[i].ent[j]);
        kiln_free(s->sess[i].ent);
    }
    kiln_free(s->sess);
    kiln_prefix_free(&s->pc);
    ks_trace_close(&s->trace);
    for (int32_t i = 0; i < s->n_t; i++) tenant_free(&s->t[i]);
    kiln_free(s->t);
    kiln_free(s->slots);
    kiln_free(s->en);
    kiln_free(s->en_rq);
    kiln_free(s->ids);
    kiln_free(s->logits);
    kiln_free(s->srows);
    kiln_free(s->sov_id);
    kiln_free(s->sov_count);
    kiln_free(s->sov_bias);
    kiln_free(s->top);
    kiln_free(s->plan);
    kiln_free(s->lpbuf);
    kiln_free(s->cancels);
    kiln_free(s->resumes);
    kiln_free(s->closes);
    if (s->own_wrap) kiln_sched_engine_unwrap(&s->eng);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->lmu);
    pthread_cond_destroy(&s->cv);
    kiln_free(s);
}

/* ---- tenants ---- */

static bool id_ok(const char *id) {
    size_t n = id ? strlen(id) : 0;
    if (n < 1 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

static int32_t tenant_find(const kiln_sched *s, const char *id) {
    for (int32_t i = 0; i < s->n_t; i++)
        if (!strcmp(s->t[i].cfg.id, id)) return i;
    return -1;
}

static kiln_status add_tenant(kiln_sched *s, const kiln_tenant_config *c, kiln_err *err) {
    if (!id_ok(c->id))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "tenant id '%s': 1 to 64 characters of [A-Za-z0-9._-]",
                            c->id ? c->id : "(null)");
    if (tenant_find(s, c->id) >= 0)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "tenant '%s' added twice", c->id);
    if (c->max_slots < 0 || c->max_kv_blocks < 0 || c->max_context < 0 || c->max_queued < 0 ||
        !(c->decode_tokens_per_s >= 0) || !(c->prefill_tokens_per_s >= 0) || (int)c->qos < 0 ||
        c->qos >= KILN_QOS_COUNT || c->n_api_keys < 0)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "tenant '%s': a negative or invalid limit",
                            c->id);
    for (int32_t k = 0; k < c->n_api_keys; k++) {
        if (!c->api_keys[k] || !*c->api_keys[k])
            return kiln_err_set(err, KILN_ERR_INVALID_ARG, "tenant '%s': empty API key", c->id);
        /* the server's rule (serve/tenants.c): a key as a client can send it */
        if (!kiln_ascii_visible(c->api_keys[k], strlen(c->api_keys[k]), ""))
            return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                "tenant '%s': API key %d has a space, a control byte or a "
                                "non-ASCII byte (keys are visible ASCII)",
                                c->id, (int)k);
        for (int32_t i = 0; i < s->n_t; i++)
            for (int32_t j = 0; j < s->t[i].cfg.n_api_keys; j++)
                if (!strcmp(s->t[i].cfg.api_keys[j], c->api_keys[k]))
                    return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                        "tenant '%s': API key already belongs to tenant '%s'",
                                        c->id, s->t[i].cfg.id);
    }
    if (s->n_t == s->cap_t) {
        int32_t nc = s->cap_t ? s->cap_t * 2 : 8;
        ks_tenant *q = kiln_realloc(s->t, (size_t)nc * sizeof(ks_tenant));
        if (!q) return kiln_err_set(err, KILN_ERR_NOMEM, "tenants: out of memory");
        s->t = q;
        s->cap_t = nc;
    }
    ks_tenant *t = &s->t[s->n_t];
    memset(t, 0, sizeof(*t));
    t->cfg = *c;
    t->own_id = kiln_strdup(c->id);
    t->own_group = c->isolation_group ? kiln_strdup(c->isolation_group) : NULL;
    t->own_keys = kiln_calloc((size_t)(c->n_api_keys > 0 ? c->n_api_keys : 1), sizeof(char *));
    bool ok = t->own_id && t->own_keys && (!c->isolation_group || t->own_group);
    for (int32_t k = 0; ok && k < c->n_api_keys; k++)
        ok = (t->own_keys[k] = kiln_strdup(c->api_keys[k]));
    if (!ok) {
        t->cfg.n_api_keys = c->n_api_keys;
        tenant_free(t);
        return kiln_err_set(err, KILN_ERR_NOMEM, "tenants: out of memory");
    }
    t->cfg.id = t->own_id;
    t->cfg.isolation_group = t->own_group;
    t->cfg.api_keys = (const char *const *)t->own_keys;
    char scope[160];
    if (t->own_group)
        snprintf(scope, sizeof(scope), "group:%s", t->own_group);
    else
        snprintf(scope, sizeof(scope), "tenant:%s", t->own_id);
    t->scope = kiln_prefix_scope(scope);
    t->dec_bucket = c->decode_tokens_per_s > 1 ? c->decode_tokens_per_s : 1;
    t->pre_bucket = c->prefill_tokens_per_s > 1 ? c->prefill_tokens_per_s : 1;
    s->n_t++;
    return KILN_OK;
}

kiln_status kiln_sched_add_tenant(kiln_sched *s, const kiln_tenant_config *t, kiln_err *err) {
    pthread_mutex_lock(&s->mu);
    kiln_status st = s->frozen ? kiln_err_set(err, KILN_ERR_STATE,
                                              "tenants are added before the scheduler's first step")
                               : add_tenant(s, t, err);
    pthread_mutex_unlock(&s->mu);
    return st;
}

kiln_status kiln_sched_add_tenants(kiln_sched *s, const kiln_tenant_list *l, kiln_err *err) {
    for (int32_t i = 0; i < l->n; i++) KILN_TRY(kiln_sched_add_tenant(s, &l->items[i], err));
    return KILN_OK;
}

/* Freezes the tenant table (under mu); adds "default" when no tenant exists. */
static kiln_status freeze(kiln_sched *s, kiln_err *err) {
    if (s->frozen) return KILN_OK;
    if (tenant_find(s, "default") < 0 && s->n_t == 0) {
        kiln_tenant_config c;
        kiln_tenant_config_default(&c);
        c.id = "default";
        KILN_TRY(add_tenant(s, &c, err));
    }
    s->frozen = true;
    return KILN_OK;
}

bool kiln_sched_tenant_by_key(kiln_sched *s, const char *key, char *id, size_t cap) {
    if (!key) return false;
    bool found = false;
    pthread_mutex_lock(&s->mu);
    for (int32_t i = 0; i < s->n_t && !found; i++)
        for (int32_t j = 0; j < s->t[i].cfg.n_api_keys; j++)
            if (!strcmp(s->t[i].cfg.api_keys[j], key)) {
                if (id && cap) snprintf(id, cap, "%s", s->t[i].cfg.id);
                found = true;
                break;
            }
    pthread_mutex_unlock(&s->mu);
    return found;
}

int32_t kiln_sched_tenant_count(const kiln_sched *s) {
    return s->n_t;
}

const char *kiln_sched_tenant_id(const kiln_sched *s, int32_t i) {
    return i >= 0 && i < s->n_t ? s->t[i].cfg.id : NULL;
}

/* ---- thread ---- */

static void *thread_main(void *arg) {
    kiln_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        pthread_mutex_unlock(&s->mu);
        bool worked = false;
        kiln_err e;
        (void)ks_step(s, &worked, &e);
        pthread_mutex_lock(&s->mu);
        if (s->stop) break;
        if (!worked && !s->in_head && !s->n_cancels && !s->n_resumes && !s->n_closes) {
            /* idle, or waiting on a quota / parked sink: sleep until news or 2 ms */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            bool busy = s->n_running > 0 || s->n_queued_m > 0;
            ts.tv_nsec += 2000000;
            if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
            if (busy)
                pthread_cond_timedwait(&s->cv, &s->mu, &ts);
            else {
                bool any_wait = false;
                for (int32_t i = 0; i < s->n_t; i++) any_wait |= s->t[i].n_wait > 0;
                if (any_wait)
                    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
                else
                    pthread_cond_wait(&s->cv, &s->mu);
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

kiln_status kiln_sched_start(kiln_sched *s, kiln_err *err) {
    pthread_mutex_lock(&s->mu);
    kiln_status st = KILN_OK;
    if (s->started) st = kiln_err_set(err, KILN_ERR_STATE, "scheduler thread already started");
    if (!st) st = freeze(s, err);
    if (!st) {
        s->stop = false;
        if (pthread_create(&s->th, NULL, thread_main, s))
            st = kiln_err_set(err, KILN_ERR_IO, "scheduler: cannot create its thread");
        else
            s->started = true;
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

void kiln_sched_stop(kiln_sched *s) {
    pthread_mutex_lock(&s->mu);
    bool was = s->started;
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (was) pthread_join(s->th, NULL);
    pthread_mutex_lock(&s->mu);
    s->started = false;
    pthread_mutex_unlock(&s->mu);
}

kiln_status kiln_sched_step(kiln_sched *s, bool *worked, kiln_err *err) {
    pthread_mutex_lock(&s->mu);
    kiln_status st = s->started ? kiln_err_set(err, KILN_ERR_STATE,
                                               "kiln_sched_step while the scheduler thread runs")
                                : freeze(s, err);
    pthread_mutex_unlock(&s->mu);
    if (st) return st;
    bool w = false;
    st = ks_step(s, &w, err);
    if (worked) *worked = w;
    return st;
}

kiln_status kiln_sched_drain(kiln_sched *s, kiln_err *err) {
    for (;;) {
        bool w = false;
        KILN_TRY(kiln_sched_step(s, &w, err));
        pthread_mutex_lock(&s->mu);
        bool inbox = s->in_head || s->n_cancels || s->n_resumes || s->n_closes;
        pthread_mutex_unlock(&s->mu);
        bool waiting = false;
        for (int32_t i = 0; i < s->n_t; i++) waiting |= s->t[i].n_wait > 0;
        if (!w && !inbox) {
            if (s->n_running == 0 && !waiting) return KILN_OK;
            /* blocked on a rate quota or a parked sink: let time pass */
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
}

/* ---- submit / cancel / resume ---- */

static double retry_estimate(kiln_sched *s, int32_t ahead) {
    double rate = s->done_rate > 0.1 ? s->done_rate : 0.1;
    double r = (ahead + 1) / rate;
    if (r < 1) r = 1;
    if (r > 600) r = 600;
    return r;
}

static int32_t tenant_index(kiln_sched *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    int32_t ti = s->frozen ? tenant_find(s, id ? id : "default") : -1;
    pthread_mutex_unlock(&s->mu);
    return ti;
}

static kiln_status reject(kiln_sched *s, int32_t ti, kiln_rejection *rej, kiln_err *err,
                          kiln_reject why, int http, double retry, kiln_status st, const char *fmt,
                          ...) KILN_PRINTF(9, 10);
static kiln_status reject(kiln_sched *s, int32_t ti, kiln_rejection *rej, kiln_err *err,
                          kiln_reject why, int http, double retry, kiln_status st, const char *fmt,
                          ...) {
    char m[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof(m), fmt, ap);
    va_end(ap);
    if (rej) {
        rej->reason = why;
        rej->http_status = http;
        rej->retry_after_s = retry;
        snprintf(rej->message, sizeof(rej->message), "%s", m);
    }
    if (ti >= 0) {
        pthread_mutex_lock(&s->lmu);
        s->t[ti].u.requests_rejected++;
        pthread_mutex_unlock(&s->lmu);
    }
    return kiln_err_set(err, st, "%s", m);
}

void ks_req_free(ks_req *r) {
    if (!r) return;
    kiln_free(r->tok);
    for (int32_t i = 0; i < r->n_stops; i++) kiln_free(r->stops[i]);
    kiln_free(r->stops);
    kiln_free(r->stop_toks);
    kiln_free(r->bias);
    kiln_free(r->ent);
    kiln_free(r->tbuf);
    kiln_free(r);
}

kiln_status kiln_sched_submit(kiln_sched *s, const kiln_request_params *p, uint64_t *id,
                              kiln_rejection *rej, kiln_err *err) {
    if (rej) memset(rej, 0, sizeof(*rej));
    if (id) *id = 0;
    if (!p || !p->sink || !p->prompt || p->n_prompt < 1)
        return reject(s, -1, rej, err, KILN_REJECT_BAD_REQUEST, 400, 0, KILN_ERR_INVALID_ARG,
                      "request: %s",
                      !p         ? "no params"
                      : !p->sink ? "no sink"
                                 : "empty prompt");
    if (p->max_tokens < 0 || p->n_stop < 0 || p->n_stop_tokens < 0 || p->top_logprobs < 0 ||
        p->top_logprobs > 20)
        return reject(s, -1, rej, err, KILN_REJECT_BAD_REQUEST, 400, 0, KILN_ERR_INVALID_ARG,
                      "request: max_tokens, stops or top_logprobs (0..20) out of range");
    for (int32_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= s->eng.n_vocab)
            return reject(s, tenant_index(s, p->tenant), rej, err, KILN_REJECT_BAD_REQUEST, 400, 0,
                          KILN_ERR_INVALID_ARG,
                          "prompt token %d at position %d is outside the vocabulary (%d)",
                          (int)p->prompt[i], (int)i, (int)s->eng.n_vocab);
    /* build the request outside the lock */
    ks_req *r = kiln_calloc(1, sizeof(*r));
    bool ok = r != NULL;
    if (ok) {
        r->cap = p->n_prompt + 16;
        r->tok = kiln_malloc((size_t)r->cap * sizeof(int32_t));
        r->stops = p->n_stop ? kiln_calloc((size_t)p->n_stop, sizeof(char *)) : NULL;
        r->stop_toks =
            p->n_stop_tokens ? kiln_malloc((size_t)p->n_stop_tokens * sizeof(int32_t)) : NULL;
        ok = r->tok && (!p->n_stop || r->stops) && (!p->n_stop_tokens || r->stop_toks);
    }
    for (int32_t i = 0; ok && i < p->n_stop; i++) {
        ok = p->stop[i] && (r->stops[i] = kiln_strdup(p->stop[i]));
        if (ok) r->n_stops = i + 1;
    }
    if (!ok) {
        ks_req_free(r);
        return reject(s, -1, rej, err, KILN_REJECT_BAD_REQUEST, 400, 0, KILN_ERR_NOMEM,
                      "request: out of memory (or a NULL stop string)");
    }
    memcpy(r->tok, p->prompt, (size_t)p->n_prompt * sizeof(int32_t));
    r->n_prompt = r->n_tok = p->n_prompt;
    if (p->n_stop_tokens) memcpy(r->stop_toks, p->stop_tokens, (size_t)p->n_stop_tokens * 4);
    r->n_stop_toks = p->n_stop_tokens;
    r->sp = p->sampling;
    /* the submitter's logit_bias array is borrowed for the call only: the sampler is
     * created later, on the scheduler thread, from this owned copy */
    r->sp.logit_bias = NULL;
    r->sp.n_logit_bias = 0;
    if (p->sampling.logit_bias && p->sampling.n_logit_bias > 0) {
        size_t nb = (size_t)p->sampling.n_logit_bias;
        r->bias = kiln_malloc(nb * sizeof(*r->bias));
        if (!r->bias) {
            ks_req_free(r);
            return reject(s, -1, rej, err, KILN_REJECT_BAD_REQUEST, 400, 0, KILN_ERR_NOMEM,
                          "request: out of memory (logit_bias)");
        }
        memcpy(r->bias, p->sampling.logit_bias, nb * sizeof(*r->bias));
        r->sp.logit_bias = r->bias;
        r->sp.n_logit_bias = p->sampling.n_logit_bias;
    }
    /* the fused argmax sees raw logits: anything that changes them needs the sampler */
    r->plain_greedy = p->sampling.temperature <= 0 && r->sp.n_logit_bias == 0 &&
                      (p->sampling.repeat_penalty == 1.0f || p->sampling.repeat_last_n == 0) &&
                      p->sampling.frequency_penalty == 0 && p->sampling.presence_penalty == 0 &&
                      !p->logprobs && p->top_logprobs == 0;
    r->ignore_eos = p->ignore_eos;
    r->logprobs = p->logprobs || p->top_logprobs > 0;
    r->top_logprobs = p->top_logprobs;
    r->sink = p->sink;
    r->user = p->user;
    r->slot = r->seq = r->row = -1;
    r->state = KS_INCOMING;
    r->t_submit = kiln_now_ns();

    pthread_mutex_lock(&s->mu);
    kiln_status st = KILN_OK;
    int32_t ti = -1;
    if (s->closing) {
        pthread_mutex_unlock(&s->mu);
        ks_req_free(r);
        return reject(s, -1, rej, err, KILN_REJECT_SHUTDOWN, 503, 0, KILN_ERR_STATE,
                      "the scheduler is shutting down");
    }
    st = freeze(s, err);
    if (!st) ti = tenant_find(s, p->tenant ? p->tenant : "default");
    if (st || ti < 0) {
        pthread_mutex_unlock(&s->mu);
        ks_req_free(r);
        if (st) return st;
        return reject(s, -1, rej, err, KILN_REJECT_UNKNOWN_TENANT, 404, 0, KILN_ERR_NOT_FOUND,
                      "unknown tenant '%s'", p->tenant ? p->tenant : "default");
    }
    ks_tenant *t = &s->t[ti];
    r->ti = ti;
    /* context */
    int64_t ctx = s->eng.n_ctx;
    if (t->cfg.max_context > 0 && t->cfg.max_context < ctx) ctx = t->cfg.max_context;
    int64_t want = (int64_t)p->n_prompt + (p->max_tokens > 0 ? p->max_tokens : 1);
    if (want > ctx) {
        pthread_mutex_unlock(&s->mu);
        ks_req_free(r);
        return reject(s, ti, rej, err, KILN_REJECT_CONTEXT, 400, 0, KILN_ERR_RANGE,
                      "prompt (%d tokens) + max_tokens (%d) exceeds the context limit of %lld "
                      "tokens%s",
                      (int)p->n_prompt, (int)p->max_tokens, (long long)ctx,
                      t->cfg.max_context > 0 ? " (tenant max_context)" : "");
    }
    r->max_tokens = p->max_tokens > 0 ? p->max_tokens : (int32_t)(ctx - p->n_prompt);
    r->reserve =
        (int32_t)((p->n_prompt + (int64_t)r->max_tokens + KILN_SCHED_BLOCK - 1) / KILN_SCHED_BLOCK);
    if (t->cfg.max_kv_blocks > 0 && r->reserve > t->cfg.max_kv_blocks) {
        pthread_mutex_unlock(&s->mu);
        int32_t need = r->reserve;
        ks_req_free(r);
        return reject(s, ti, rej, err, KILN_REJECT_KV_QUOTA, 400, 0, KILN_ERR_RANGE,
                      "request needs up to %d KV blocks (prompt + max_tokens); tenant '%s' may "
                      "hold %lld",
                      (int)need, t->cfg.id, (long long)t->cfg.max_kv_blocks);
    }
    if (p->session) {
        ks_session *se = NULL;
        for (int32_t i = 0; i < s->n_sess; i++)
            if (s->sess[i].used && !s->sess[i].closed && s->sess[i].id == p->session)
                se = &s->sess[i];
        if (!se || se->ti != ti) {
            pthread_mutex_unlock(&s->mu);
            ks_req_free(r);
            return reject(s, ti, rej, err, KILN_REJECT_BAD_REQUEST, 400, 0, KILN_ERR_NOT_FOUND,
                          "session %llu does not exist for tenant '%s'",
                          (unsigned long long)p->session, t->cfg.id);
        }
        r->sess = se;
    }
    /* the queue holds requests waiting for a slot: accepted ones not admitted yet take
     * the free slots first (the scheduler thread may not have stepped since they came) */
    int32_t free_slots = s->max_slots - s->n_running_m;
    if (free_slots < 0) free_slots = 0;
    /* a tenant's own queue limit, where it has one, counts past the free slots it may
     * take (its slot quota): a burst on an idle server was refused with slots free (six
     * streams at once to 4 slots and a queue of 2: the 4th got 429) */
    int32_t tq = t->cfg.max_queued, tfree = free_slots;
    if (t->cfg.max_slots > 0) {
        const int32_t left = t->cfg.max_slots - t->slots_used_m;
        tfree = left < 0 ? 0 : left < tfree ? left : tfree;
    }
    if (tq > 0 && t->n_queued_m - tfree >= tq) {
        int32_t q = t->n_queued_m - tfree;
        double ra = retry_estimate(s, q);
        pthread_mutex_unlock(&s->mu);
        ks_req_free(r);
        return reject(s, ti, rej, err, KILN_REJECT_QUOTA, 429, ra, KILN_ERR_CAPACITY,
                      "tenant '%s' has %d requests queued (its limit)", t->cfg.id, (int)q);
    }
    if (t->cfg.prefill_tokens_per_s > 0) {
        /* backlog of unprefilled prompt tokens longer than 30 s at the tenant's rate */
        double wait = (double)(t->backlog_m + p->n_prompt) / t->cfg.prefill_tokens_per_s;
        if (wait > 30 && t->backlog_m > 0) {
            double ra = (double)t->backlog_m / t->cfg.prefill_tokens_per_s - 30 + 1;
            pthread_mutex_unlock(&s->mu);
            ks_req_free(r);
            return reject(s, ti, rej, err, KILN_REJECT_QUOTA, 429, ra > 1 ? ra : 1,
                          KILN_ERR_CAPACITY,
                          "tenant '%s': %.0f s of queued prompt tokens at its prefill rate of "
                          "%.0f tokens/s",
                          t->cfg.id, wait, t->cfg.prefill_tokens_per_s);
        }
    }
    if (s->n_queued_m - free_slots >= s->max_queued) {
        double ra = retry_estimate(s, s->n_queued_m);
        int32_t q = s->n_queued_m - free_slots;
        pthread_mutex_unlock(&s->mu);
        ks_req_free(r);
        return reject(s, ti, rej, err, KILN_REJECT_OVERLOADED, 503, ra, KILN_ERR_CAPACITY,
                      "overloaded: %d requests queued", (int)q);
    }
    r->id = s->next_id++;
    t->n_queued_m++;
    t->backlog_m += p->n_prompt;
    s->n_queued_m++;
    r->hnext = s->map[r->id % KS_MAP_N];
    s->map[r->id % KS_MAP_N] = r;
    r->qnext = NULL;
    if (s->in_tail)
        s->in_tail->qnext = r;
    else
        s->in_head = r;
    s->in_tail = r;
    pthread_cond_signal(&s->cv);
    if (id) *id = r->id;
    pthread_mutex_unlock(&s->mu);
    return KILN_OK;
}

static bool push_id(uint64_t **a, int32_t *n, int32_t *cap, uint64_t id) {
    if (*n == *cap) {
        int32_t nc = *cap ? *cap * 2 : 64;
        uint64_t *q = kiln_realloc(*a, (size_t)nc * sizeof(uint64_t));
        if (!q) return false;
        *a = q;
        *cap = nc;
    }
    (*a)[(*n)++] = id;
    return true;
}

static ks_req *map_get(kiln_sched *s, uint64_t id) {
    for (ks_req *r = s->map[id % KS_MAP_N]; r; r = r->hnext)
        if (r->id == id) return r;
    return NULL;
}

bool kiln_sched_cancel(kiln_sched *s, uint64_t id) {
    pthread_mutex_lock(&s->mu);
    bool ok = map_get(s, id) != NULL && push_id(&s->cancels, &s->n_cancels, &s->cap_cancels, id);
    if (ok) pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return ok;
}

void kiln_sched_resume(kiln_sched *s, uint64_t id) {
    pthread_mutex_lock(&s->mu);
    if (map_get(s, id) && push_id(&s->resumes, &s->n_resumes, &s->cap_resumes, id))
        pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- sessions ---- */

kiln_status kiln_sched_session_open(kiln_sched *s, const char *tenant, uint64_t *session,
                                    kiln_err *err) {
    pthread_mutex_lock(&s->mu);
    kiln_status st = freeze(s, err);
    int32_t ti = st ? -1 : tenant_find(s, tenant ? tenant : "default");
    if (!st && ti < 0)
        st = kiln_err_set(err, KILN_ERR_NOT_FOUND, "unknown tenant '%s'",
                          tenant ? tenant : "default");
    ks_session *se = NULL;
    for (int32_t i = 0; !st && i < s->n_sess && !se; i++)
        if (!s->sess[i].used) se = &s->sess[i];
    if (!st && !se) {
        if (s->n_sess == s->cap_sess) {
            /* sessions are referenced by pointer from requests: the table never moves */
            st = kiln_err_set(err, KILN_ERR_CAPACITY, "too many open sessions (%d)",
                              (int)s->cap_sess);
        } else {
            se = &s->sess[s->n_sess++];
        }
    }
    if (!st) {
        memset(se, 0, sizeof(*se));
        se->used = true;
        se->ti = ti;
        se->id = s->next_sess++;
        *session = se->id;
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

void kiln_sched_session_close(kiln_sched *s, uint64_t session) {
    pthread_mutex_lock(&s->mu);
    if (push_id(&s->closes, &s->n_closes, &s->cap_closes, session)) pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- ledger ---- */

void ks_ring_add(ks_ring *r, float v) {
    r->v[r->pos] = v;
    r->pos = (r->pos + 1) % KS_PCTL_N;
    if (r->n < KS_PCTL_N) r->n++;
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

kiln_pctl ks_ring_pctl(const ks_ring *r) {
    kiln_pctl p = {0, 0};
    if (!r->n) return p;
    float *tmp = kiln_malloc(r->n * sizeof(float));
    if (!tmp) return p;
    memcpy(tmp, r->v, r->n * sizeof(float));
    qsort(tmp, r->n, sizeof(float), cmp_f);
    p.p50 = tmp[(size_t)((r->n - 1) * 0.50 + 0.5)];
    p.p99 = tmp[(size_t)((r->n - 1) * 0.99 + 0.5)];
    kiln_free(tmp);
    return p;
}

kiln_status kiln_sched_usage(kiln_sched *s, const char *tenant, kiln_tenant_usage *out,
                             kiln_err *err) {
    pthread_mutex_lock(&s->mu);
    kiln_status st = freeze(s, err);
    int32_t ti = st ? -1 : tenant_find(s, tenant ? tenant : "default");
    pthread_mutex_unlock(&s->mu);
    if (st) return st;
    if (ti < 0) return kiln_err_set(err, KILN_ERR_NOT_FOUND, "unknown tenant '%s'", tenant);
    pthread_mutex_lock(&s->lmu);
    *out = s->t[ti].u;
    out->ttft_ms = ks_ring_pctl(&s->t[ti].ttft);
    out->inter_token_ms = ks_ring_pctl(&s->t[ti].itl);
    pthread_mutex_unlock(&s->lmu);
    return KILN_OK;
}

void kiln_sched_stats_get(kiln_sched *s, kiln_sched_stats *out) {
    pthread_mutex_lock(&s->lmu);
    *out = s->stats;
    pthread_mutex_unlock(&s->lmu);
}
