/* loop.c — `kiln serve`'s requests over the scheduler (loop.h, src/sched/sched.h). */
#include "serve/loop.h"

#include "base/log.h"
#include "base/mem.h"
#include "base/timer.h"
#include "sched/sched.h"
#include "serve/tenants.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct kiln_srv_loop {
    const kiln_model *model;
    const kiln_vocab *vocab;
    kiln_sched *s;
    kiln_srv_loop_opts o;
    pthread_mutex_t mu;
    bool draining;
    int busy;    /* submitted requests without all their final events */
    int running; /* of those, requests that have had an event (generating) */
    /* parked requests, oldest first (loop.h) */
    kiln_srv_req *park_head, *park_tail;
    bool no_park;
    void (*wake)(void *const *users, int n);
    /* step batching (loop.h): unparked users waiting for the batch's end */
    void **pend;
    int n_pend, cap_pend;
};

/* a streaming request that is generating is looked at by the idle tick after this */
#define KILN_SRV_LIVE_LOOK_NS 2000000000ull

/* Under the mutex: takes r off the parked list; returns whom to wake (after the unlock). */
static void *unpark(kiln_srv_loop *l, kiln_srv_req *r) {
    if (!r->parked) return NULL;
    if (r->park_prev)
        r->park_prev->park_next = r->park_next;
    else
        l->park_head = r->park_next;
    if (r->park_next)
        r->park_next->park_prev = r->park_prev;
    else
        l->park_tail = r->park_prev;
    r->park_prev = r->park_next = NULL;
    r->parked = false;
    return r->user;
}

void kiln_srv_loop_set_wake(kiln_srv_loop *l, void (*wake)(void *const *users, int n)) {
    l->wake = wake;
}

/* Under the mutex: holds u for the batch's end; false when out of memory (wake it now). */
static bool pend_push(kiln_srv_loop *l, void *u) {
    if (l->n_pend == l->cap_pend) {
        int nc = l->cap_pend ? l->cap_pend * 2 : 64;
        void **q = kiln_realloc(l->pend, (size_t)nc * sizeof(*q));
        if (!q) return false;
        l->pend = q;
        l->cap_pend = nc;
    }
    l->pend[l->n_pend++] = u;
    return true;
}

/* Wakes everything held (takes the mutex; wakes outside it). A held user's connection
 * stays suspended until then: nothing frees it meanwhile. */
static int flush_pending(kiln_srv_loop *l) {
    int n = 0;
    for (;;) {
        void *users[64];
        pthread_mutex_lock(&l->mu);
        int k = l->n_pend < 64 ? l->n_pend : 64;
        l->n_pend -= k;
        if (k) memcpy(users, l->pend + l->n_pend, (size_t)k * sizeof(*users));
        pthread_mutex_unlock(&l->mu);
        if (k) l->wake(users, k);
        n += k;
        if (k < 64) return n;
    }
}

/* The scheduler's step-end hook (kiln_sched_opts.on_step_end): one wake for every stream
 * the step fed. */
static void step_end(void *user) {
    (void)flush_pending((kiln_srv_loop *)user);
}

bool kiln_srv_park(kiln_srv_loop *l, kiln_srv_req *r, bool final_only) {
    if (l->no_park || !l->wake) return false;
    if (r->parked) return true;
    r->parked = true;
    r->park_final_only = final_only;
    r->t_parked = kiln_now_ns();
    r->park_prev = l->park_tail;
    r->park_next = NULL;
    if (l->park_tail)
        l->park_tail->park_next = r;
    else
        l->park_head = r;
    l->park_tail = r;
    return true;
}

/* Unparks (under the mutex) and wakes (outside it) the parked requests that pass: all
 * when stop (and no parking after), else those parked for min_age_ns (the list is oldest
 * first); first, what a step left held. A woken connection stays suspended until its
 * wake: nothing frees it meanwhile. */
static int wake_parked(kiln_srv_loop *l, uint64_t min_age_ns, bool stop) {
    if (stop) { /* before the flush: a sink that holds a wake after it flushes at once */
        pthread_mutex_lock(&l->mu);
        l->no_park = true;
        pthread_mutex_unlock(&l->mu);
    }
    int n = flush_pending(l);
    for (;;) {
        void *users[64];
        int k = 0;
        pthread_mutex_lock(&l->mu);
        uint64_t now = kiln_now_ns();
        kiln_srv_req *next;
        for (kiln_srv_req *r = l->park_head; r && k < 64; r = next) {
            next = r->park_next;
            uint64_t age = now - r->t_parked;
            if (!stop && age < min_age_ns) break; /* (oldest first: the rest are younger) */
            /* a stream that has tokens coming is woken by them, and a gone client fails
             * its next write: looked at only after a long pause (preempted) */
            if (!stop && r->state == 2 && !r->park_final_only && age < KILN_SRV_LIVE_LOOK_NS)
                continue;
            r->idle_woken = true;
            users[k++] = unpark(l, r);
        }
        pthread_mutex_unlock(&l->mu);
        if (k) l->wake(users, k);
        n += k;
        if (k < 64) return n;
    }
}

bool kiln_srv_unpark(kiln_srv_loop *l, kiln_srv_req *r) {
    return unpark(l, r) != NULL;
}

int kiln_srv_wake_idle(kiln_srv_loop *l, uint64_t min_age_ns) {
    return l->wake ? wake_parked(l, min_age_ns, false) : 0;
}

void kiln_srv_stop_parking(kiln_srv_loop *l) {
    if (l->wake)
        wake_parked(l, 0, true);
    else {
        pthread_mutex_lock(&l->mu);
        l->no_park = true;
        pthread_mutex_unlock(&l->mu);
    }
}

static void choice_free(kiln_srv_choice *c) {
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
    r->p = p;
    r->n_choices = p->n;
    r->want_logprobs = p->logprobs;
    r->seed = seed;
    r->max_tokens = max_tokens;
    r->refs = 1;
    snprintf(r->tenant, sizeof(r->tenant), "default");
    *out = r;
    return KILN_OK;
}

static void req_destroy(kiln_srv_req *r) {
    for (int i = 0; i < KILN_OAI_MAX_N; i++) choice_free(&r->ch[i]);
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

static json_t *token_json(const kiln_vocab *v, int32_t id, double lp) {
    kiln_str s = kiln_token_piece(v, id, true, 0);
    json_t *bytes = json_array();
    for (size_t i = 0; bytes && i < s.len; i++)
        json_array_append_new(bytes, json_integer((unsigned char)s.ptr[i]));
    json_t *o = json_object();
    json_t *tok = json_stringn(s.ptr, s.len);
    if (!o || !bytes) {
        json_decref(o);
        json_decref(bytes);
        json_decref(tok);
        return NULL;
    }
    /* a token that is part of a UTF-8 character has no text of its own */
    json_object_set_new(o, "token", tok ? tok : json_string("\xef\xbf\xbd"));
    json_object_set_new(o, "logprob", json_real(isfinite(lp) ? lp : -9999.0));
    json_object_set_new(o, "bytes", bytes);
    return o;
}

/* The scheduler thread calls this for every token of every choice; never blocks beyond
 * the loop mutex (text is buffered without bound; the connection drains it). */
static kiln_sink_result sink(void *user, const kiln_token_event *ev) {
    struct kiln_srv_sink_ctx *sc = user;
    kiln_srv_loop *l = sc->l;
    kiln_srv_req *r = sc->r;
    kiln_srv_choice *c = &r->ch[sc->ch];
    json_t *lp = NULL;
    bool real = ev->token >= 0 && !kiln_vocab_is_eog(l->vocab, ev->token);
    if (real && r->want_logprobs) {
        lp = token_json(l->vocab, ev->token, ev->logprob);
        json_t *tops = json_array();
        for (int32_t j = 0; tops && j < ev->n_top; j++)
            json_array_append_new(tops, token_json(l->vocab, ev->top[j].token, ev->top[j].logprob));
        if (lp) json_object_set_new(lp, "top_logprobs", tops ? tops : json_array());
    }
    pthread_mutex_lock(&l->mu);
    if (ev->token >= 0 && !r->t_first) r->t_first = kiln_now_ns();
    c->n_generated = ev->n_generated;
    bool oom = false;
    if (real) {
        if (c->n_ids == c->ids_cap) {
            size_t nc = c->ids_cap ? c->ids_cap * 2 : 64;
            int32_t *q = kiln_realloc(c->ids, nc * sizeof(int32_t));
            if (q) {
                c->ids = q;
                c->ids_cap = nc;
            }
        }
        if (c->n_ids < c->ids_cap)
            c->ids[c->n_ids++] = ev->token;
        else
            oom = true;
        if (lp && c->lp)
            json_array_append_new(c->lp, lp);
        else
            json_decref(lp);
    }
    if (ev->text_len && append_text(c, ev->text, ev->text_len)) oom = true;
    if (oom && !r->err_code) {
        r->err_code = KILN_ERR_NOMEM;
        snprintf(r->err_msg, sizeof(r->err_msg), "out of memory buffering the output");
    }
    if (ev->finish != KILN_FINISH_NONE) {
        switch (ev->finish) {
        case KILN_FINISH_STOP:
            c->finish = KILN_FIN_STOP;
            break;
        case KILN_FINISH_LENGTH:
            c->finish = KILN_FIN_LENGTH;
            break;
        default:
            c->finish = KILN_FIN_CANCEL;
            if (!r->err_code) {
                r->err_code =
                    ev->finish == KILN_FINISH_CANCELLED || ev->finish == KILN_FINISH_DISCONNECTED
                        ? KILN_ERR_CANCELLED
                        : KILN_ERR_INTERNAL;
                snprintf(r->err_msg, sizeof(r->err_msg), "%s%s%.200s", kiln_finish_name(ev->finish),
                         ev->error ? ": " : "", ev->error ? ev->error : "");
            }
        }
        if (++r->n_final == r->n_choices) {
            if (r->state == 2) l->running--;
            r->state = 3;
            r->t_done = kiln_now_ns();
            l->busy--;
            r->version++;
            pthread_cond_broadcast(&r->cv);
            void *wake = unpark(l, r);
            if (wake && pend_push(l, wake)) wake = NULL;
            bool last = --r->refs == 0; /* (never while parked: the server holds a ref) */
            pthread_mutex_unlock(&l->mu);
            if (wake) l->wake(&wake, 1);
            flush_pending(l);
            if (last) req_destroy(r);
            return KILN_SINK_OK;
        }
    } else if (oom) {
        pthread_mutex_unlock(&l->mu);
        kiln_srv_cancel(l, r);
        pthread_mutex_lock(&l->mu);
    }
    if (r->state == 1) {
        r->state = 2;
        l->running++;
    }
    r->version++;
    /* step batching (loop.h): held until the scheduler's step ends (step_end), or now
     * at a final event */
    bool flush = ev->finish != KILN_FINISH_NONE;
    void *wake = r->park_final_only ? NULL : unpark(l, r);
    if (wake && pend_push(l, wake)) wake = NULL;
    if (l->no_park) flush = true; /* shutting down: nothing waits for a batch */
    pthread_mutex_unlock(&l->mu);
    /* woken after the unlock, a waiter finds the mutex free (woken under it, it would
     * block on it at once); r stays valid: the loop's reference goes only with the last
     * final event, which this thread (the scheduler's, the only caller of sinks) has not
     * sent yet. A wake resumes a suspended connection: it cannot be freed before. */
    pthread_cond_broadcast(&r->cv);
    if (wake) l->wake(&wake, 1);
    if (flush) flush_pending(l);
    return KILN_SINK_OK;
}

kiln_status kiln_srv_submit(kiln_srv_loop *l, kiln_srv_req *r, int *http, int *retry_after,
                            kiln_err *err) {
    const kiln_oai_req *p = r->p;
    *http = 0;
    *retry_after = 0;
    pthread_mutex_lock(&l->mu);
    bool draining = l->draining;
    if (!draining) {
        l->busy++;
        r->refs++;
        r->state = 1;
        r->t_submit = kiln_now_ns();
        for (int i = 0; i < r->n_choices; i++) r->sink[i] = (struct kiln_srv_sink_ctx){l, r, i};
        for (int i = 0; i < r->n_choices; i++)
            if (p->logprobs && !(r->ch[i].lp = json_array())) draining = true;
    }
    pthread_mutex_unlock(&l->mu);
    if (draining) {
        *http = 503;
        *retry_after = 5;
        return kiln_err_set(err, KILN_ERR_STATE, "the server is shutting down");
    }
    kiln_logit_bias bias[KILN_OAI_MAX_BIAS];
    for (int b = 0; b < p->n_bias; b++) bias[b] = (kiln_logit_bias){p->bias_id[b], p->bias_val[b]};
    kiln_status st = KILN_OK;
    int submitted = 0;
    for (int i = 0; i < r->n_choices; i++) {
        kiln_request_params rp;
        kiln_request_params_default(&rp);
        rp.tenant = r->tenant;
        rp.prompt = r->prompt;
        rp.n_prompt = (int32_t)r->n_prompt;
        rp.max_tokens = (int32_t)r->max_tokens;
        kiln_sampler_params *sp = &rp.sampling;
        sp->temperature = (float)p->temperature;
        sp->top_k = p->top_k;
        sp->top_p = (float)p->top_p;
        sp->min_p = (float)p->min_p;
        sp->repeat_penalty = (float)p->repetition_penalty;
        sp->repeat_last_n = -1;
        sp->frequency_penalty = (float)p->frequency_penalty;
        sp->presence_penalty = (float)p->presence_penalty;
        sp->seed = r->seed + (uint64_t)i;
        sp->logit_bias = p->n_bias ? bias : NULL;
        sp->n_logit_bias = p->n_bias;
        rp.stop = (const char *const *)p->stop;
        rp.n_stop = p->n_stop;
        rp.logprobs = p->logprobs;
        rp.top_logprobs = p->top_logprobs;
        rp.sink = sink;
        rp.user = &r->sink[i];
        kiln_rejection rej;
        memset(&rej, 0, sizeof(rej));
        uint64_t id = 0;
        st = kiln_sched_submit(l->s, &rp, &id, &rej, err);
        if (st) {
            *http = rej.http_status ? rej.http_status : 500;
            *retry_after = rej.retry_after_s > 0 ? (int)ceil(rej.retry_after_s) : 0;
            if (rej.message[0]) kiln_err_set(err, st, "%s", rej.message);
            break;
        }
        pthread_mutex_lock(&l->mu);
        r->ch[i].id = id;
        pthread_mutex_unlock(&l->mu);
        submitted++;
    }
    if (st) {
        /* the choices already queued are cancelled; their final events finish r */
        pthread_mutex_lock(&l->mu);
        for (int i = submitted; i < r->n_choices; i++) r->ch[i].finish = KILN_FIN_CANCEL;
        if (!r->err_code) {
            r->err_code = KILN_ERR_CANCELLED;
            snprintf(r->err_msg, sizeof(r->err_msg), "rejected");
        }
        r->n_final += r->n_choices - submitted;
        if (r->n_final == r->n_choices) { /* nothing queued, or all already final */
            if (r->state == 2) l->running--;
            r->state = 3;
            r->t_done = kiln_now_ns();
            l->busy--;
            r->refs--; /* the loop's reference; the caller still holds its own */
            r->version++;
            pthread_cond_broadcast(&r->cv);
        }
        pthread_mutex_unlock(&l->mu);
        for (int i = 0; i < submitted; i++) kiln_sched_cancel(l->s, r->ch[i].id);
    }
    return st;
}

void kiln_srv_cancel(kiln_srv_loop *l, kiln_srv_req *r) {
    uint64_t ids[KILN_OAI_MAX_N];
    int n = 0;
    pthread_mutex_lock(&l->mu);
    if (r->state != 3) {
        r->cancel = true;
        for (int i = 0; i < r->n_choices; i++)
            if (r->ch[i].id && r->ch[i].finish == KILN_FIN_NONE) ids[n++] = r->ch[i].id;
    }
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < n; i++) kiln_sched_cancel(l->s, ids[i]);
}

int kiln_srv_loop_busy(kiln_srv_loop *l) {
    pthread_mutex_lock(&l->mu);
    int n = l->busy;
    pthread_mutex_unlock(&l->mu);
    return n;
}

void kiln_srv_loop_drain(kiln_srv_loop *l) {
    pthread_mutex_lock(&l->mu);
    l->draining = true;
    pthread_mutex_unlock(&l->mu);
}

char *kiln_srv_loop_metrics(kiln_srv_loop *l) {
    kiln_sched_stats st;
    kiln_sched_stats_get(l->s, &st);
    pthread_mutex_lock(&l->mu);
    int running = l->running, waiting = l->busy - l->running;
    pthread_mutex_unlock(&l->mu);
    char *s = NULL;
    double hit = st.prefix_lookup_tokens
                     ? (double)st.prefix_hit_tokens / (double)st.prefix_lookup_tokens
                     : 0.0;
    int k =
        asprintf(&s,
                 "# TYPE kiln_requests_running gauge\nkiln_requests_running %d\n"
                 "# TYPE kiln_requests_waiting gauge\nkiln_requests_waiting %d\n"
                 "# TYPE kiln_requests_parked gauge\nkiln_requests_parked %d\n"
                 "# TYPE kiln_sched_slots_active gauge\nkiln_sched_slots_active %d\n"
                 "# TYPE kiln_sched_requests_queued gauge\nkiln_sched_requests_queued %d\n"
                 "# TYPE kiln_slots gauge\nkiln_slots %d\n"
                 "# TYPE kiln_kv_blocks_used gauge\nkiln_kv_blocks_used %d\n"
                 "# TYPE kiln_kv_blocks_total gauge\nkiln_kv_blocks_total %d\n"
                 "# TYPE kiln_kv_blocks_cached gauge\nkiln_kv_blocks_cached %d\n"
                 "# TYPE kiln_prefix_hit_rate gauge\nkiln_prefix_hit_rate %.6f\n"
                 "# TYPE kiln_prefix_hit_tokens_total counter\nkiln_prefix_hit_tokens_total %llu\n"
                 "# TYPE kiln_steps_total counter\nkiln_steps_total %llu\n"
                 "# TYPE kiln_prefill_tokens_total counter\nkiln_prefill_tokens_total %llu\n"
                 "# TYPE kiln_decode_tokens_total counter\nkiln_decode_tokens_total %llu\n"
                 "# TYPE kiln_preemptions_total counter\nkiln_preemptions_total %llu\n"
                 "# TYPE kiln_sched_step_overhead_us gauge\nkiln_sched_step_overhead_us %.2f\n",
                 running, waiting, st.requests_parked, st.slots_active, st.requests_queued,
                 st.slots_total, st.kv_blocks_used, st.kv_blocks_total, st.kv_blocks_cached, hit,
                 (unsigned long long)st.prefix_hit_tokens, (unsigned long long)st.steps,
                 (unsigned long long)st.prefill_tokens, (unsigned long long)st.decode_tokens,
                 (unsigned long long)(st.preempt_kept + st.preempt_recompute), st.sched_us_mean);
    return k < 0 ? NULL : kiln_adopt(s);
}

kiln_status kiln_srv_loop_create(const kiln_model *m, kiln_engine *e, const kiln_srv_loop_opts *o,
                                 const kiln_srv_tenants *tenants, kiln_srv_loop **out,
                                 kiln_err *err) {
    kiln_srv_loop *l = kiln_calloc(1, sizeof(*l));
    if (!l) return kiln_err_set(err, KILN_ERR_NOMEM, "serve loop");
    l->model = m;
    l->vocab = m->vocab;
    l->o = *o;
    pthread_mutex_init(&l->mu, NULL);
    kiln_sched_opts so;
    kiln_sched_opts_default(&so);
    so.max_slots = o->slots;
    so.max_queued = o->max_queue;
    so.step_tokens = o->max_step;
    so.deterministic = o->deterministic;
    so.on_step_end = step_end;
    so.step_end_user = l;
    kiln_status st = kiln_sched_create(e, m->vocab, &so, &l->s, err);
    for (int i = 0; !st && tenants && i < tenants->n; i++) {
        kiln_tenant_config tc;
        kiln_tenant_config_default(&tc);
        tc.id = tenants->t[i].id;
        int q = kiln_qos_parse(tenants->t[i].qos);
        if (q >= 0) tc.qos = (kiln_qos)q;
        /* the server's queue limit is the scheduler's global one (503 when full); the
         * per-tenant limits are tenants.c's (max_concurrent, tokens_per_minute: 429) and
         * the scheduler's quotas from the same entry */
        tc.max_queued =
            tenants->t[i].max_queued > 0 ? (int32_t)tenants->t[i].max_queued : o->max_queue + 1;
        tc.max_slots = (int32_t)tenants->t[i].max_slots;
        tc.max_kv_blocks = tenants->t[i].max_kv_blocks;
        tc.max_context = (int32_t)tenants->t[i].max_context;
        tc.decode_tokens_per_s = tenants->t[i].decode_tokens_per_s;
        tc.prefill_tokens_per_s = tenants->t[i].prefill_tokens_per_s;
        tc.isolation_group =
            tenants->t[i].isolation_group[0] ? tenants->t[i].isolation_group : NULL;
        st = kiln_sched_add_tenant(l->s, &tc, err);
    }
    if (!st) st = kiln_sched_start(l->s, err);
    if (st) {
        kiln_srv_loop_free(l);
        return st;
    }
    *out = l;
    return KILN_OK;
}

void kiln_srv_loop_free(kiln_srv_loop *l) {
    if (!l) return;
    kiln_sched_free(l->s); /* ends pending requests: their sinks run (refs drop) */
    kiln_free(l->pend);
    pthread_mutex_destroy(&l->mu);
    kiln_free(l);
}
