/*
 * step.c — one scheduler step (issue #12 "Each step"):
 *   inbox     arrivals -> tenant queues; cancels, resumes, session closes; park timeouts
 *   admit     free slots to waiting requests: QoS class first, then the tenant with the
 *             lowest dominant share, FIFO on ties; hard quotas (slots, KV reservation)
 *             hold; an interactive arrival with no free slot preempts a batch (then
 *             standard) slot of the tenant with the highest dominant share
 *   plan      every decoding slot gets its token; prefill chunks fill the rest of the
 *             token budget; one flat list of (seq, token, pos); KV blocks checked up
 *             front (evict cached blocks, drop pins, shrink prefill, preempt)
 *   run       one engine step (fused greedy pick when no row needs logits)
 *   stream    sample per slot, detokenize, cut stop strings, call sinks
 *   retire    finished / cancelled / disconnected requests free their slot and blocks
 * Everything here runs on the scheduler thread; sinks are called without locks.
 */
#include "sched/sched_impl.h"
#include "base/mem.h"

#include "base/timer.h"
#include "sample/sample.h"
#include "tok/tok.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int32_t blocks_of(int64_t n) {
    return (int32_t)((n + KILN_SCHED_BLOCK - 1) / KILN_SCHED_BLOCK);
}

/* ---- tenant queues (ordered by arrival) ---- */

static void q_insert(ks_tenant *t, ks_req *r) {
    ks_req *after = t->qtail;
    while (after && after->arrival > r->arrival) after = after->qprev;
    r->qprev = after;
    r->qnext = after ? after->qnext : t->qhead;
    if (r->qnext)
        r->qnext->qprev = r;
    else
        t->qtail = r;
    if (after)
        after->qnext = r;
    else
        t->qhead = r;
    t->n_wait++;
}

static void q_remove(ks_tenant *t, ks_req *r) {
    if (r->qprev)
        r->qprev->qnext = r->qnext;
    else
        t->qhead = r->qnext;
    if (r->qnext)
        r->qnext->qprev = r->qprev;
    else
        t->qtail = r->qprev;
    r->qnext = r->qprev = NULL;
    t->n_wait--;
}

/* ---- small helpers ---- */

static bool tb_add(ks_req *r, const char *p, size_t n) {
    if (!n) return true;
    if (r->tlen + n + 1 > r->tcap) {
        size_t nc = r->tcap ? r->tcap : 256;
        while (nc < r->tlen + n + 1) nc *= 2;
        char *q = kiln_realloc(r->tbuf, nc);
        if (!q) {
            r->text_lost = true;
            return false;
        }
        r->tbuf = q;
        r->tcap = nc;
    }
    memcpy(r->tbuf + r->tlen, p, n);
    r->tlen += n;
    r->tbuf[r->tlen] = 0;
    return true;
}

static bool ent_push(ks_req *r, int32_t e) {
    if (r->n_ent == r->ent_cap) {
        int32_t nc = r->ent_cap ? r->ent_cap * 2 : 16;
        int32_t *q = kiln_realloc(r->ent, (size_t)nc * sizeof(int32_t));
        if (!q) return false;
        r->ent = q;
        r->ent_cap = nc;
    }
    r->ent[r->n_ent++] = e;
    return true;
}

static void release_entries(kiln_sched *s, ks_req *r) {
    /* deepest block first, so the LRU list evicts chains from their ends */
    for (int32_t i = r->n_ent - 1; i >= 0; i--) kiln_prefix_release(&s->pc, r->ent[i]);
    r->n_ent = 0;
    r->ent_broken = false;
}

static void trace_req(kiln_sched *s, const char *name, const ks_req *r, const char *extra) {
    if (!s->trace.f) return;
    char a[320];
    snprintf(a, sizeof(a), "{\"id\":%llu,\"tenant\":\"%s\"%s%s}", (unsigned long long)r->id,
             s->t[r->ti].cfg.id, extra ? "," : "", extra ? extra : "");
    ks_trace_event(&s->trace, name, 'i', kiln_now_ns(), 0, a);
}

static double share(const kiln_sched *s, const ks_tenant *t) {
    double a = (double)t->slots_used / (t->cfg.max_slots > 0 ? t->cfg.max_slots : s->max_slots);
    double b = (double)t->kv_reserved /
               (double)(t->cfg.max_kv_blocks > 0 ? t->cfg.max_kv_blocks : s->eng.total_blocks);
    double m = a > b ? a : b;
    if (t->cfg.decode_tokens_per_s > 0 && t->recent_dec / t->cfg.decode_tokens_per_s > m)
        m = t->recent_dec / t->cfg.decode_tokens_per_s;
    if (t->cfg.prefill_tokens_per_s > 0 && t->recent_pre / t->cfg.prefill_tokens_per_s > m)
        m = t->recent_pre / t->cfg.prefill_tokens_per_s;
    return m;
}

static int32_t mem_avail(kiln_sched *s) {
    return s->eng.blocks_free(s->eng.impl) + s->pc.n_evictable;
}

/* blocks a request needs for its first step after admission */
static int32_t first_need(const kiln_sched *s, const ks_req *r) {
    int32_t rem = r->n_tok - KILN_SCHED_BLOCK * r->n_ent;
    if (rem > s->step_tokens) rem = s->step_tokens;
    return blocks_of(rem) + 1;
}

/* ---- finishing ---- */

/* n_running and a tenant's slots_used change here only: submit reads the mirrors under mu
 * (free slots are not queue places taken, the scheduler's nor the tenant's) */
static void add_running(kiln_sched *s, ks_tenant *t, int32_t d) {
    s->n_running += d;
    t->slots_used += d;
    pthread_mutex_lock(&s->mu);
    s->n_running_m = s->n_running;
    t->slots_used_m = t->slots_used;
    pthread_mutex_unlock(&s->mu);
}

static void map_remove(kiln_sched *s, ks_req *r) {
    pthread_mutex_lock(&s->mu);
    ks_req **pp = &s->map[r->id % KS_MAP_N];
    while (*pp && *pp != r) pp = &(*pp)->hnext;
    if (*pp) *pp = r->hnext;
    if (!r->ever_admitted) {
        s->t[r->ti].n_queued_m--;
        s->t[r->ti].backlog_m -= r->n_prompt;
        s->n_queued_m--;
        r->ever_admitted = true; /* counted once */
    }
    pthread_mutex_unlock(&s->mu);
}

static kiln_sink_result deliver(kiln_sched *s, ks_req *r, int32_t token, kiln_finish fin,
                                int32_t stop_index, const char *error, const float *row) {
    kiln_token_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.request_id = r->id;
    ev.token = token;
    ev.text = r->tbuf ? r->tbuf : "";
    ev.text_len = r->tlen;
    ev.finish = fin;
    ev.stop_index = stop_index;
    ev.error = error;
    ev.n_prompt = r->n_prompt;
    ev.n_cached = r->n_cached;
    ev.n_generated = r->n_gen;
    if (row && r->logprobs && token >= 0) {
        /* log-softmax of the raw row over the sampling range */
        const int32_t nv = s->n_vocab_tok;
        float mx = -INFINITY;
        for (int32_t i = 0; i < nv; i++)
            if (row[i] > mx) mx = row[i];
        double sum = 0;
        for (int32_t i = 0; i < nv; i++) sum += exp((double)row[i] - mx);
        const float lse = (float)(mx + log(sum));
        ev.logprob = row[token] - lse;
        int32_t k = r->top_logprobs;
        for (int32_t j = 0; j < k; j++) s->top[j].token = -1, s->top[j].logprob = -INFINITY;
        for (int32_t i = 0; i < nv && k > 0; i++) {
            float v = row[i] - lse;
            if (v <= s->top[k - 1].logprob) continue;
            int32_t j = k - 1;
            while (j > 0 && s->top[j - 1].logprob < v) {
                s->top[j] = s->top[j - 1];
                j--;
            }
            s->top[j].token = i;
            s->top[j].logprob = v;
        }
        ev.top = s->top;
        ev.n_top = k;
    }
    kiln_sink_result res = r->sink(r->user, &ev);
    r->tlen = 0;
    if (r->tbuf) r->tbuf[0] = 0;
    return res;
}

/* Frees the request's slot, sequence and blocks; its entries go to its session (when
 * it ended normally) or back to the cache. Then frees the request. */
static void retire(kiln_sched *s, ks_req *r, kiln_finish fin) {
    ks_tenant *t = &s->t[r->ti];
    if (r->state == KS_RUN) {
        s->eng.seq_free(s->eng.impl, r->seq);
        s->slots[r->slot] = NULL;
        add_running(s, t, -1);
        t->kv_reserved -= r->reserve;
    } else if (r->state == KS_WAIT) {
        q_remove(t, r);
        t->pinned_blocks -= r->n_ent;
    }
    ks_session *se = r->sess;
    if (se && se->owner == r) {
        se->owner = NULL;
        bool keep = !se->closed && (fin == KILN_FINISH_STOP || fin == KILN_FINISH_LENGTH);
        if (keep) {
            for (int32_t i = se->n_ent - 1; i >= 0; i--) kiln_prefix_release(&s->pc, se->ent[i]);
            t->pinned_blocks -= se->n_ent;
            kiln_free(se->ent);
            se->ent = r->ent;
            se->n_ent = r->n_ent;
            t->pinned_blocks += se->n_ent;
            r->ent = NULL;
            r->n_ent = r->ent_cap = 0;
        }
        if (se->closed) {
            for (int32_t i = se->n_ent - 1; i >= 0; i--) kiln_prefix_release(&s->pc, se->ent[i]);
            t->pinned_blocks -= se->n_ent;
            kiln_free(se->ent);
            se->ent = NULL;
            se->n_ent = 0;
            pthread_mutex_lock(&s->mu);
            se->used = false;
            pthread_mutex_unlock(&s->mu);
        }
    }
    release_entries(s, r);
    r->state = KS_DONE;
    kiln_sampler_free(r->smp);
    kiln_detok_stream_free(r->ds);
    if (r->stopper_ok) kiln_stopper_free(&r->stopper);
    uint64_t now = kiln_now_ns();
    if (s->last_done_ns) {
        double dt = (double)(now - s->last_done_ns) * 1e-9;
        double inst = dt > 1e-6 ? 1.0 / dt : 1e6;
        double a = dt < 1 ? dt : 1; /* ~1 s smoothing */
        s->done_rate = s->done_rate * (1 - a) + inst * a;
    }
    s->last_done_ns = now;
    pthread_mutex_lock(&s->lmu);
    t->u.requests_finished++;
    if (fin == KILN_FINISH_CANCELLED || fin == KILN_FINISH_DISCONNECTED) t->u.requests_cancelled++;
    pthread_mutex_unlock(&s->lmu);
    if (s->trace.f) {
        char a[64];
        snprintf(a, sizeof(a), "\"reason\":\"%s\"", kiln_finish_name(fin));
        trace_req(s, "finish", r, a);
    }
    ks_req_free(r); /* with its logit_bias copy (leaked before: test_serve_lifetime, LSan) */
}

/* Moves the text held by the detokenizer and the stopper into the text buffer. */
static void flush_text(ks_req *r) {
    const char *p;
    size_t n;
    if (r->ds) {
        kiln_detok_stream_flush(r->ds, &p, &n);
        if (n && r->stopper_ok) {
            const char *e;
            size_t en;
            bool stopped = false;
            if (kiln_stopper_feed(&r->stopper, p, n, &e, &en, &stopped, NULL))
                r->text_lost = true;
            else
                tb_add(r, e, en);
            if (stopped) return;
        } else {
            tb_add(r, p, n);
        }
    }
    if (r->stopper_ok && !r->stopper.stopped) {
        kiln_stopper_flush(&r->stopper, &p, &n);
        tb_add(r, p, n);
    }
}

/* Ends a request that did not end on a token of its own. */
static void finish(kiln_sched *s, ks_req *r, kiln_finish fin, const char *error) {
    map_remove(s, r);
    flush_text(r);
    deliver(s, r, -1, fin, -1, error, NULL);
    retire(s, r, fin);
}

/* ---- preemption ---- */

static void preempt(kiln_sched *s, ks_req *r, bool keep, const char *why) {
    ks_tenant *t = &s->t[r->ti];
    if (!keep) release_entries(s, r);
    s->eng.seq_free(s->eng.impl, r->seq);
    r->seq = -1;
    r->n_kv = 0;
    s->slots[r->slot] = NULL;
    r->slot = -1;
    add_running(s, t, -1);
    t->kv_reserved -= r->reserve;
    t->pinned_blocks += r->n_ent;
    r->state = KS_WAIT;
    r->plan_cnt = 0;
    r->row = -1;
    q_insert(t, r);
    pthread_mutex_lock(&s->lmu);
    t->u.requests_preempted++;
    if (keep)
        s->stats.preempt_kept++;
    else
        s->stats.preempt_recompute++;
    pthread_mutex_unlock(&s->lmu);
    if (s->trace.f) {
        char a[160];
        snprintf(a, sizeof(a), "\"mode\":\"%s\",\"kept_blocks\":%d,\"why\":\"%s\"",
                 keep ? "keep" : "recompute", (int)r->n_ent, why);
        trace_req(s, "preempt", r, a);
    }
}

/* Memory pressure: waiting requests and idle sessions give up their pinned blocks
 * (they recompute later). Returns the blocks unpinned. */
static int32_t drop_pins(kiln_sched *s) {
    int32_t n = 0;
    for (int32_t ti = 0; ti < s->n_t; ti++) {
        ks_tenant *t = &s->t[ti];
        for (ks_req *r = t->qhead; r; r = r->qnext)
            if (r->n_ent > 0) {
                n += r->n_ent;
                t->pinned_blocks -= r->n_ent;
                release_entries(s, r);
                pthread_mutex_lock(&s->lmu);
                if (s->stats.preempt_kept > 0) s->stats.preempt_kept--;
                s->stats.preempt_recompute++;
                pthread_mutex_unlock(&s->lmu);
            }
    }
    for (int32_t i = 0; i < s->n_sess; i++) {
        ks_session *se = &s->sess[i];
        if (se->used && !se->owner && se->n_ent > 0) {
            n += se->n_ent;
            s->t[se->ti].pinned_blocks -= se->n_ent;
            for (int32_t j = se->n_ent - 1; j >= 0; j--) kiln_prefix_release(&s->pc, se->ent[j]);
            se->n_ent = 0;
        }
    }
    return n;
}

/* The running request to preempt for a request of class qos: a lower class (batch
 * first), then the tenant with the highest dominant share, then the latest admitted. */
static ks_req *pick_victim(kiln_sched *s, int qos) {
    ks_req *best = NULL;
    double best_share = -1;
    int best_q = -1;
    for (int32_t i = 0; i < s->max_slots; i++) {
        ks_req *r = s->slots[i];
        if (!r) continue;
        int q = (int)s->t[r->ti].cfg.qos;
        if (q <= qos) continue;
        double sh = share(s, &s->t[r->ti]);
        if (q > best_q || (q == best_q && (sh > best_share ||
                                           (sh == best_share && r->admitted > best->admitted)))) {
            best = r;
            best_q = q;
            best_share = sh;
        }
    }
    return best;
}

/* ---- admission ---- */

static ks_req *eligible_head(const kiln_sched *s, const ks_tenant *t) {
    if (t->cfg.max_slots > 0 && t->slots_used >= t->cfg.max_slots) return NULL;
    /* a tenant out of decode-rate tokens could not use another slot now */
    if (t->cfg.decode_tokens_per_s > 0 && t->dec_bucket < 1 && t->slots_used > 0) return NULL;
    int32_t scanned = 0;
    for (ks_req *r = t->qhead; r && scanned < 32; r = r->qnext, scanned++) {
        if (r->sess && r->sess->owner && r->sess->owner != r) continue; /* session busy */
        if (t->cfg.max_kv_blocks > 0 && t->kv_reserved + r->reserve > t->cfg.max_kv_blocks)
            return NULL; /* FIFO within a tenant: wait for the head */
        (void)s;
        return r;
    }
    return NULL;
}

/* The request admission would pick next (ignoring free slots and memory). */
static ks_req *pick(const kiln_sched *s) {
    ks_req *best = NULL;
    int best_q = 0;
    double best_share = 0;
    for (int32_t ti = 0; ti < s->n_t; ti++) {
        const ks_tenant *t = &s->t[ti];
        if (!t->n_wait) continue;
        ks_req *r = eligible_head(s, t);
        if (!r) continue;
        int q = (int)t->cfg.qos;
        double sh = share(s, t);
        if (!best || q < best_q || (q == best_q && sh < best_share) ||
            (q == best_q && sh == best_share && r->arrival < best->arrival)) {
            best = r;
            best_q = q;
            best_share = sh;
        }
    }
    return best;
}

static bool mem_ok(kiln_sched *s, const ks_req *r) {
    return s->n_running == 0 || mem_avail(s) - s->n_running >= first_need(s, r);
}

static kiln_status admit(kiln_sched *s, ks_req *r, kiln_err *err) {
    ks_tenant *t = &s->t[r->ti];
    kiln_status st = KILN_OK;
    if (!r->ever_admitted) {
        /* per-request sampling and text state, created on first admission */
        st = kiln_sampler_create(&r->sp, s->eng.n_vocab, &r->smp, err);
        if (!st && s->vocab) st = kiln_detok_stream_create(s->vocab, false, &r->ds, err);
        /* exact text: the stream emits detokenize(prompt + generated) minus
         * detokenize(prompt) (keeps an SPM first token's leading space) */
        if (!st && r->ds) kiln_detok_stream_prime(r->ds, r->tok, (size_t)r->n_prompt);
        if (!st && s->vocab) {
            st = kiln_stopper_init(&r->stopper, (const char *const *)r->stops, r->n_stops, NULL, 0,
                                   err);
            r->stopper_ok = !st;
        }
        if (st) return st;
        for (int32_t i = 0; i < r->n_prompt; i++) kiln_sampler_accept(r->smp, r->tok[i]);
    }
    int32_t seq = -1;
    KILN_TRY(s->eng.seq_create(s->eng.impl, &seq, err));
    /* prefix cache: extend the kept entries with any cached continuation */
    const uint64_t scope = t->scope;
    while (s->pc_on && !r->ent_broken &&
           (int64_t)KILN_SCHED_BLOCK * (r->n_ent + 1) <= (int64_t)r->n_tok - 1) {
        uint64_t parent = r->n_ent ? s->pc.e[r->ent[r->n_ent - 1]].key : 0;
        const int32_t *tk = r->tok + (size_t)KILN_SCHED_BLOCK * r->n_ent;
        uint64_t key = kiln_prefix_key(&s->pc, scope, parent, tk);
        int32_t e = kiln_prefix_find(&s->pc, scope, parent, key, tk);
        if (e < 0) break;
        if (!ent_push(r, e)) break;
        kiln_prefix_use(&s->pc, e);
    }
    /* kept pins were counted as the tenant's pinned blocks while waiting */
    if (r->n_ent > 0) {
        int32_t *blk = kiln_malloc((size_t)r->n_ent * sizeof(int32_t));
        if (!blk) st = kiln_err_set(err, KILN_ERR_NOMEM, "scheduler: out of memory");
        for (int32_t i = 0; !st && i < r->n_ent; i++) blk[i] = s->pc.e[r->ent[i]].block;
        if (!st) st = s->eng.seq_attach(s->eng.impl, seq, blk, r->n_ent, err);
        kiln_free(blk);
        if (st) {
            s->eng.seq_free(s->eng.impl, seq);
            release_entries(s, r);
            return st;
        }
    }
    r->seq = seq;
    r->n_kv = KILN_SCHED_BLOCK * r->n_ent;
    int32_t slot = 0;
    while (s->slots[slot]) slot++;
    q_remove(t, r);
    s->slots[slot] = r;
    r->slot = slot;
    add_running(s, t, 1);
    t->kv_reserved += r->reserve;
    r->state = KS_RUN;
    r->admitted = ++s->admit_seq;
    if (r->sess) r->sess->owner = r;
    bool first = !r->ever_admitted;
    if (first) {
        r->n_cached = r->n_kv < r->n_prompt ? r->n_kv : r->n_prompt;
        pthread_mutex_lock(&s->mu);
        t->n_queued_m--;
        t->backlog_m -= r->n_prompt;
        s->n_queued_m--;
        r->ever_admitted = true;
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_lock(&s->lmu);
    if (first) {
        t->u.requests_admitted++;
        t->u.tokens_prompted += (uint64_t)r->n_prompt;
        t->u.prefix_hit_tokens += (uint64_t)r->n_cached;
        s->stats.prefix_hit_tokens += (uint64_t)r->n_cached;
        s->stats.prefix_lookup_tokens += (uint64_t)r->n_prompt;
    }
    pthread_mutex_unlock(&s->lmu);
    if (s->trace.f) {
        char a[96];
        snprintf(a, sizeof(a), "\"cached\":%d,\"resume\":%s", (int)r->n_kv,
                 first ? "false" : "true");
        trace_req(s, "admit", r, a);
    }
    return KILN_OK;
}

static void admit_all(kiln_sched *s) {
    for (;;) {
        ks_req *r = pick(s);
        if (!r) return;
        if (s->n_running == s->max_slots) {
            ks_req *v = s->t[r->ti].cfg.qos == KILN_QOS_INTERACTIVE
                            ? pick_victim(s, KILN_QOS_INTERACTIVE)
                            : NULL;
            if (!v) return;
            /* keep the victim's KV when memory is plentiful, else recompute later */
            bool keep = mem_avail(s) - v->n_ent >= s->eng.total_blocks / 4;
            preempt(s, v, keep, "interactive arrival");
        }
        if (!mem_ok(s, r)) return;
        /* pins of a kept request move to its sequence */
        s->t[r->ti].pinned_blocks -= r->n_ent;
        kiln_err e;
        kiln_status st = admit(s, r, &e);
        if (st) {
            release_entries(s, r);
            finish(s, r, KILN_FINISH_ERROR, e.msg);
        }
    }
}

/* ---- planning ---- */

static int32_t growth(const ks_req *r, int32_t cnt) {
    return blocks_of((int64_t)r->n_kv + cnt) - blocks_of(r->n_kv);
}

static int cmp_prio(const void *a, const void *b, const kiln_sched *s) {
    const ks_req *x = *(ks_req *const *)a, *y = *(ks_req *const *)b;
    int qx = (int)s->t[x->ti].cfg.qos, qy = (int)s->t[y->ti].cfg.qos;
    if (qx != qy) return qx < qy ? -1 : 1;
    return x->admitted < y->admitted ? -1 : x->admitted > y->admitted;
}

/* insertion sort (a few dozen entries) by priority */
static void sort_prio(kiln_sched *s, ks_req **a, int32_t n) {
    for (int32_t i = 1; i < n; i++) {
        ks_req *x = a[i];
        int32_t j = i;
        while (j > 0 && cmp_prio(&a[j - 1], &x, s) > 0) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = x;
    }
}

/* Fills r->plan_cnt for every running request and s->plan (priority order); makes the
 * KV blocks fit. Returns the number of tokens planned. */
static int32_t plan(kiln_sched *s) {
    int32_t budget = s->step_tokens;
    s->n_plan = 0;
    for (int32_t i = 0; i < s->max_slots; i++) {
        ks_req *r = s->slots[i];
        if (!r) continue;
        r->plan_cnt = 0;
        r->row = -1;
        if (!r->parked) s->plan[s->n_plan++] = r;
    }
    sort_prio(s, s->plan, s->n_plan);
    for (int32_t i = 0; i < s->n_plan; i++) {
        ks_req *r = s->plan[i];
        if (r->n_tok - r->n_kv == 1 && s->t[r->ti].cfg.qos == KILN_QOS_INTERACTIVE) {
            budget = s->latency_tokens;
            break;
        }
    }
    /* decode tokens first */
    for (int32_t i = 0; i < s->n_plan; i++) {
        ks_req *r = s->plan[i];
        ks_tenant *t = &s->t[r->ti];
        if (r->n_tok - r->n_kv != 1) continue;
        if (t->cfg.decode_tokens_per_s > 0) {
            if (t->dec_bucket < 1) continue;
            t->dec_bucket -= 1;
        }
        r->plan_cnt = 1;
        budget--;
    }
    /* prefill chunks, by priority */
    for (int32_t i = 0; i < s->n_plan && budget > 0; i++) {
        ks_req *r = s->plan[i];
        ks_tenant *t = &s->t[r->ti];
        int32_t pend = r->n_tok - r->n_kv;
        if (pend <= 1) continue;
        int32_t c = pend < budget ? pend : budget;
        if (c == pend && t->cfg.decode_tokens_per_s > 0) {
            /* the chunk that ends the prompt generates a token: a decode-rate token */
            if (t->dec_bucket < 1)
                c = pend - 1;
            else
                t->dec_bucket -= 1;
        }
        if (t->cfg.prefill_tokens_per_s > 0) {
            int32_t lim = (int32_t)floor(t->pre_bucket);
            if (c > lim) c = lim;
            if (c <= 0) continue;
            t->pre_bucket -= c;
        }
        r->plan_cnt = c;
        budget -= c;
    }
    /* KV blocks: evict cached blocks, then unpin, then shrink prefill, then preempt */
    for (;;) {
        int32_t need = 0;
        for (int32_t i = 0; i < s->n_plan; i++) need += growth(s->plan[i], s->plan[i]->plan_cnt);
        int32_t avail = s->eng.blocks_free(s->eng.impl);
        if (need <= avail) break;
        if (s->pc.n_evictable > 0) {
            kiln_prefix_evict(&s->pc, need - avail);
            continue;
        }
        if (drop_pins(s) > 0) continue;
        /* the lowest-priority request with a prefill chunk shrinks */
        ks_req *v = NULL;
        for (int32_t i = s->n_plan - 1; i >= 0 && !v; i--)
            if (s->plan[i]->plan_cnt > 1 ||
                (s->plan[i]->plan_cnt == 1 && s->plan[i]->n_tok - s->plan[i]->n_kv > 1))
                v = s->plan[i];
        if (v) {
            int32_t short_by = need - avail;
            int32_t g = growth(v, v->plan_cnt);
            int32_t keep_blocks = g - short_by;
            int32_t room = blocks_of(v->n_kv) * KILN_SCHED_BLOCK - v->n_kv; /* free in last */
            int32_t c = keep_blocks > 0 ? room + keep_blocks * KILN_SCHED_BLOCK : room;
            if (c >= v->plan_cnt) c = v->plan_cnt - 1;
            v->plan_cnt = c > 0 ? c : 0;
            continue;
        }
        /* only decode tokens left: preempt the lowest-priority running request */
        ks_req *victim = NULL;
        int32_t vi = -1;
        for (int32_t i = s->n_plan - 1; i >= 0 && !victim; i--)
            if (s->plan[i]->plan_cnt > 0) victim = s->plan[i], vi = i;
        if (!victim || s->n_plan == 1) {
            /* a lone request that cannot fit (the context check at submit should make
             * this impossible): end it rather than stall */
            for (int32_t i = 0; i < s->n_plan; i++)
                finish(s, s->plan[i], KILN_FINISH_ERROR, "KV cache full");
            s->n_plan = 0;
            break;
        }
        preempt(s, victim, false, "KV memory");
        for (int32_t i = vi; i + 1 < s->n_plan; i++) s->plan[i] = s->plan[i + 1];
        s->n_plan--;
    }
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_plan; i++) n += s->plan[i]->plan_cnt;
    return n;
}

/* ---- streaming ---- */

/* Handles a sampled token of r; may retire r. */
static void on_token(kiln_sched *s, ks_req *r, int32_t tok, const float *row) {
    if (tok < 0) {
        finish(s, r, KILN_FINISH_ERROR, "no finite logit to sample from");
        return;
    }
    if (r->n_tok == r->cap) {
        int32_t nc = r->cap * 2;
        int32_t *q = kiln_realloc(r->tok, (size_t)nc * sizeof(int32_t));
        if (!q) {
            finish(s, r, KILN_FINISH_ERROR, "out of memory");
            return;
        }
        r->tok = q;
        r->cap = nc;
    }
    r->tok[r->n_tok++] = tok;
    r->n_gen++;
    kiln_sampler_accept(r->smp, tok);
    ks_tenant *t = &s->t[r->ti];
    uint64_t now = kiln_now_ns();
    pthread_mutex_lock(&s->lmu);
    t->u.tokens_generated++;
    if (!r->got_first)
        ks_ring_add(&t->ttft, (float)((double)(now - r->t_submit) * 1e-6));
    else
        ks_ring_add(&t->itl, (float)((double)(now - r->t_last) * 1e-6));
    pthread_mutex_unlock(&s->lmu);
    r->got_first = true;
    r->t_last = now;

    kiln_finish fin = KILN_FINISH_NONE;
    int32_t stop_index = -1;
    bool stoptok = false;
    for (int32_t i = 0; i < r->n_stop_toks; i++) stoptok |= r->stop_toks[i] == tok;
    if (stoptok || (!r->ignore_eos && s->vocab && kiln_vocab_is_eog(s->vocab, tok))) {
        fin = KILN_FINISH_STOP;
        flush_text(r);
    } else {
        if (r->ds) {
            const char *p;
            size_t n;
            if (kiln_detok_stream_push(r->ds, tok, &p, &n, NULL)) {
                r->text_lost = true;
            } else if (n) {
                if (r->stopper_ok) {
                    const char *e;
                    size_t en;
                    bool stopped = false;
                    if (kiln_stopper_feed(&r->stopper, p, n, &e, &en, &stopped, NULL))
                        r->text_lost = true;
                    else
                        tb_add(r, e, en);
                    if (stopped) {
                        fin = KILN_FINISH_STOP;
                        stop_index = r->n_stops == 1 ? 0 : -1;
                    }
                } else {
                    tb_add(r, p, n);
                }
            }
        }
        if (!fin && r->n_gen >= r->max_tokens) {
            fin = KILN_FINISH_LENGTH;
            flush_text(r);
        }
    }
    if (r->text_lost) { /* never a text with a hole in it: the request ends with an error */
        finish(s, r, KILN_FINISH_ERROR, "out of memory buffering the output text");
        return;
    }
    if (fin) {
        map_remove(s, r);
        deliver(s, r, tok, fin, stop_index, NULL, row);
        retire(s, r, fin);
        return;
    }
    kiln_sink_result res = deliver(s, r, tok, KILN_FINISH_NONE, -1, NULL, row);
    if (res == KILN_SINK_CLOSED) {
        finish(s, r, KILN_FINISH_DISCONNECTED, NULL);
    } else if (res == KILN_SINK_WOULD_BLOCK) {
        r->parked = true;
        r->park_since = now;
    }
}

/* Registers r's newly completed full blocks in the prefix cache. */
static void register_blocks(kiln_sched *s, ks_req *r) {
    if (!s->pc_on || r->ent_broken) return;
    int32_t full = r->n_kv / KILN_SCHED_BLOCK;
    if (r->n_ent >= full) return;
    const int32_t *blk;
    int32_t nb;
    s->eng.seq_blocks(s->eng.impl, r->seq, &blk, &nb);
    const uint64_t scope = s->t[r->ti].scope;
    while (r->n_ent < full && r->n_ent < nb) {
        uint64_t parent = r->n_ent ? s->pc.e[r->ent[r->n_ent - 1]].key : 0;
        const int32_t *tk = r->tok + (size_t)KILN_SCHED_BLOCK * r->n_ent;
        uint64_t key = kiln_prefix_key(&s->pc, scope, parent, tk);
        int32_t e = kiln_prefix_find(&s->pc, scope, parent, key, tk);
        if (e >= 0) {
            kiln_prefix_use(&s->pc, e); /* computed twice (concurrent prefill): share it */
        } else {
            e = kiln_prefix_insert(&s->pc, scope, parent, key, tk, blk[r->n_ent]);
            if (e < 0) {
                r->ent_broken = true;
                return;
            }
        }
        if (!ent_push(r, e)) {
            kiln_prefix_release(&s->pc, e);
            r->ent_broken = true;
            return;
        }
    }
}

/* ---- the step ---- */

static void drain_inbox(kiln_sched *s, bool *had_cancels, uint64_t **closes, int32_t *n_closes) {
    pthread_mutex_lock(&s->mu);
    ks_req *in = s->in_head;
    s->in_head = s->in_tail = NULL;
    for (int32_t i = 0; i < s->n_cancels; i++)
        for (ks_req *r = s->map[s->cancels[i] % KS_MAP_N]; r; r = r->hnext)
            if (r->id == s->cancels[i]) r->cancel_seen = true;
    *had_cancels = s->n_cancels > 0;
    s->n_cancels = 0;
    for (int32_t i = 0; i < s->n_resumes; i++)
        for (ks_req *r = s->map[s->resumes[i] % KS_MAP_N]; r; r = r->hnext)
            if (r->id == s->resumes[i]) r->parked = false;
    s->n_resumes = 0;
    *closes = NULL;
    *n_closes = 0;
    if (s->n_closes) {
        *closes = malloc((size_t)s->n_closes * sizeof(uint64_t));
        if (*closes) {
            memcpy(*closes, s->closes, (size_t)s->n_closes * sizeof(uint64_t));
            *n_closes = s->n_closes;
            s->n_closes = 0;
        }
    }
    pthread_mutex_unlock(&s->mu);
    while (in) {
        ks_req *nx = in->qnext;
        in->state = KS_WAIT;
        in->arrival = ++s->arrival_seq;
        q_insert(&s->t[in->ti], in);
        in = nx;
    }
}

static void close_sessions(kiln_sched *s, const uint64_t *ids, int32_t n) {
    for (int32_t k = 0; k < n; k++)
        for (int32_t i = 0; i < s->n_sess; i++) {
            ks_session *se = &s->sess[i];
            if (!se->used || se->closed || se->id != ids[k]) continue;
            se->closed = true;
            if (!se->owner) {
                for (int32_t j = se->n_ent - 1; j >= 0; j--)
                    kiln_prefix_release(&s->pc, se->ent[j]);
                s->t[se->ti].pinned_blocks -= se->n_ent;
                kiln_free(se->ent);
                se->ent = NULL;
                se->n_ent = 0;
                pthread_mutex_lock(&s->mu);
                se->used = false;
                pthread_mutex_unlock(&s->mu);
            }
        }
}

static void refill(kiln_sched *s, uint64_t now) {
    double dt = s->last_ns ? (double)(now - s->last_ns) * 1e-9 : 0;
    s->last_ns = now;
    double decay = exp(-dt);
    for (int32_t i = 0; i < s->n_t; i++) {
        ks_tenant *t = &s->t[i];
        t->recent_dec *= decay;
        t->recent_pre *= decay;
        double r = t->cfg.decode_tokens_per_s;
        if (r > 0) {
            double burst = r > 1 ? r : 1;
            t->dec_bucket += r * dt;
            if (t->dec_bucket > burst) t->dec_bucket = burst;
        }
        r = t->cfg.prefill_tokens_per_s;
        if (r > 0) {
            double burst = r > 1 ? r : 1;
            t->pre_bucket += r * dt;
            if (t->pre_bucket > burst) t->pre_bucket = burst;
        }
    }
}

static void publish(kiln_sched *s, uint64_t t_step, uint64_t eng_ns, int32_t n_dec, int32_t n_pre) {
    int32_t parked = 0;
    pthread_mutex_lock(&s->lmu);
    for (int32_t i = 0; i < s->n_t; i++) s->t[i].u.kv_blocks = s->t[i].pinned_blocks;
    for (int32_t i = 0; i < s->max_slots; i++) {
        ks_req *r = s->slots[i];
        if (!r) continue;
        s->t[r->ti].u.kv_blocks += blocks_of(r->n_kv);
        parked += r->parked;
    }
    int32_t queued = 0;
    for (int32_t i = 0; i < s->n_t; i++) {
        kiln_tenant_usage *u = &s->t[i].u;
        u->slots_active = s->t[i].slots_used;
        if (u->slots_active > u->slots_peak) u->slots_peak = u->slots_active;
        if (u->kv_blocks > u->kv_blocks_peak) u->kv_blocks_peak = u->kv_blocks;
        u->requests_queued = s->t[i].n_wait;
        queued += s->t[i].n_wait;
    }
    kiln_sched_stats *st = &s->stats;
    if (n_dec + n_pre > 0) {
        st->steps++;
        st->step_tokens += (uint64_t)(n_dec + n_pre);
        st->decode_tokens += (uint64_t)n_dec;
        st->prefill_tokens += (uint64_t)n_pre;
        double us = (double)(t_step - eng_ns) * 1e-3;
        st->sched_us_last = us;
        s->sched_us_sum += us;
        st->sched_us_mean = s->sched_us_sum / (double)st->steps;
    }
    st->slots_active = s->n_running;
    st->requests_queued = queued;
    st->requests_parked = parked;
    st->kv_blocks_used = s->eng.total_blocks - s->eng.blocks_free(s->eng.impl);
    st->kv_blocks_cached = s->pc.n_evictable;
    pthread_mutex_unlock(&s->lmu);
}

/* The parameters of a sampled step (s->sstep): each row's sampler's parameters, overrides
 * and draw, in row order (at most n_ov overrides in all). */
static kiln_status build_sampled(kiln_sched *s, int32_t rows, int64_t n_ov, kiln_err *err) {
    if (n_ov > INT32_MAX / 4) return kiln_err_set(err, KILN_ERR_RANGE, "scheduler: overrides");
    if (rows > s->srows_cap) {
        kiln_sample_row_params *q = kiln_realloc(s->srows, (size_t)rows * sizeof(*q));
        if (!q) return kiln_err_set(err, KILN_ERR_NOMEM, "scheduler: sample rows");
        s->srows = q;
        s->srows_cap = rows;
    }
    if (n_ov > s->sov_cap) {
        int32_t *a = kiln_realloc(s->sov_id, (size_t)n_ov * sizeof(int32_t));
        if (a) s->sov_id = a;
        int32_t *c = kiln_realloc(s->sov_count, (size_t)n_ov * sizeof(int32_t));
        if (c) s->sov_count = c;
        float *b = kiln_realloc(s->sov_bias, (size_t)n_ov * sizeof(float));
        if (b) s->sov_bias = b;
        if (!a || !b || !c) return kiln_err_set(err, KILN_ERR_NOMEM, "scheduler: overrides");
        s->sov_cap = (int32_t)n_ov;
    }
    int32_t off = 0;
    for (int32_t i = 0; i < s->n_plan; i++) {
        ks_req *r = s->plan[i];
        if (!r->plan_cnt || r->row < 0) continue;
        kiln_sample_row_params *rp = &s->srows[r->row];
        rp->ov_off = off;
        KILN_TRY(kiln_sampler_device_row(r->smp, s->n_vocab_tok, rp, s->sov_id + off,
                                         s->sov_bias + off, s->sov_count + off, s->sov_cap - off,
                                         err));
        off += rp->n_ov;
    }
    s->sstep = (kiln_sample_step){.rows = s->srows,
                                  .ov_id = s->sov_id,
                                  .ov_bias = s->sov_bias,
                                  .ov_count = s->sov_count,
                                  .n_ov = off};
    return KILN_OK;
}

kiln_status ks_step(kiln_sched *s, bool *worked, kiln_err *err) {
    const uint64_t t0 = kiln_now_ns();
    *worked = false;
    bool had_cancels;
    uint64_t *closes;
    int32_t n_closes;
    drain_inbox(s, &had_cancels, &closes, &n_closes);
    if (n_closes) {
        close_sessions(s, closes, n_closes);
        *worked = true;
    }
    kiln_free(closes);
    /* cancels, then park timeouts */
    if (had_cancels) {
        for (int32_t i = 0; i < s->max_slots; i++)
            if (s->slots[i] && s->slots[i]->cancel_seen) {
                finish(s, s->slots[i], KILN_FINISH_CANCELLED, NULL);
                *worked = true;
            }
        for (int32_t ti = 0; ti < s->n_t; ti++)
            for (ks_req *r = s->t[ti].qhead, *nx; r; r = nx) {
                nx = r->qnext;
                if (r->cancel_seen) {
                    finish(s, r, KILN_FINISH_CANCELLED, NULL);
                    *worked = true;
                }
            }
    }
    for (int32_t i = 0; i < s->max_slots; i++) {
        ks_req *r = s->slots[i];
        if (r && r->parked && (t0 - r->park_since) / 1000000 >= (uint64_t)s->park_max_ms) {
            finish(s, r, KILN_FINISH_ERROR,
                   "the client did not take tokens in time (backpressure)");
            *worked = true;
        }
    }
    refill(s, t0);
    int32_t before = s->n_running;
    uint64_t admitted_before = s->admit_seq;
    admit_all(s);
    if (s->admit_seq != admitted_before || s->n_running != before) *worked = true;

    int32_t n_tok = plan(s);
    uint64_t eng_ns = 0;
    int32_t n_dec = 0, n_pre = 0;
    kiln_status st = KILN_OK;
    if (n_tok > 0) {
        /* one flat list: decode tokens, then prefill chunks */
        int32_t n = 0, rows = 0;
        bool need_logits = false;
        for (int pass = 0; pass < 2; pass++)
            for (int32_t i = 0; i < s->n_plan; i++) {
                ks_req *r = s->plan[i];
                if (!r->plan_cnt) continue;
                bool dec = r->n_tok - r->n_kv == 1;
                if (dec != (pass == 0)) continue;
                for (int32_t k = 0; k < r->plan_cnt; k++) {
                    int32_t pos = r->n_kv + k;
                    kiln_batch_entry *e = &s->en[n];
                    e->seq = r->seq;
                    e->token = r->tok[pos];
                    e->pos = pos;
                    e->want_logits = pos == r->n_tok - 1;
                    s->en_rq[n++] = r;
                    if (e->want_logits) {
                        r->row = rows++;
                        need_logits |= !r->plain_greedy;
                    }
                }
                if (dec)
                    n_dec += r->plan_cnt;
                else
                    n_pre += r->plan_cnt;
            }
        /* rows that need the sampler: on the engine's device when it can run every one of
         * them (no logprobs; kiln_sampler_device_ok), so only ids come back */
        bool sampled = false;
        if (need_logits && !st && s->eng.step_sampled) {
            sampled = true;
            int64_t n_ov = 0;
            for (int32_t i = 0; i < n && sampled; i++) {
                ks_req *r = s->en_rq[i];
                if (!s->en[i].want_logits) continue;
                sampled = !r->logprobs && kiln_sampler_device_ok(r->smp, s->n_vocab_tok);
                n_ov += kiln_sampler_device_max_overrides(r->smp);
            }
            if (sampled) st = build_sampled(s, rows, n_ov, err);
            if (!st && sampled) need_logits = false;
            sampled = sampled && !st;
        }
        if (need_logits && s->logits_rows < (size_t)rows) {
            size_t want = (size_t)s->max_slots;
            float *q = kiln_realloc(s->logits, want * (size_t)s->eng.n_vocab * sizeof(float));
            if (!q) {
                need_logits = false;
                st = kiln_err_set(err, KILN_ERR_NOMEM, "scheduler: logits buffer");
            } else {
                s->logits = q;
                s->logits_rows = want;
            }
        }
        const uint64_t te = kiln_now_ns();
        if (!st && sampled)
            st = s->eng.step_sampled(s->eng.impl, s->en, n, &s->sstep, s->ids, s->n_vocab_tok, err);
        else if (!st)
            st = s->eng.step(s->eng.impl, s->en, n, need_logits ? s->logits : NULL,
                             need_logits ? NULL : s->ids, s->n_vocab_tok, err);
        eng_ns = kiln_now_ns() - te;
        *worked = true;
        if (st) {
            /* sequences are unchanged after a failed step; the circuit breaker rebinds a
             * failing kernel, so retry once before failing the step's requests */
            if (++s->fail_streak >= 2) {
                char msg[KILN_ERR_MSG_MAX + 32];
                snprintf(msg, sizeof(msg), "engine step failed: %s", err ? err->msg : "");
                for (int32_t i = 0; i < s->n_plan; i++)
                    if (s->plan[i]->plan_cnt) finish(s, s->plan[i], KILN_FINISH_ERROR, msg);
                s->fail_streak = 0;
            }
        } else {
            s->fail_streak = 0;
            for (int32_t i = 0; i < s->n_plan; i++) {
                ks_req *r = s->plan[i];
                if (!r->plan_cnt) continue;
                ks_tenant *t = &s->t[r->ti];
                if (r->n_tok - r->n_kv == 1)
                    t->recent_dec += r->plan_cnt;
                else
                    t->recent_pre += r->plan_cnt;
                r->n_kv += r->plan_cnt;
                register_blocks(s, r);
            }
            /* sample and stream in plan order (retiring may free requests) */
            for (int32_t i = 0; i < s->n_plan; i++) {
                ks_req *r = s->plan[i];
                int32_t row = r->row;
                r->plan_cnt = 0;
                r->row = -1;
                if (row < 0) continue;
                const float *lr = need_logits ? s->logits + (size_t)row * s->eng.n_vocab : NULL;
                int32_t tok =
                    need_logits ? kiln_sampler_sample(r->smp, lr, s->n_vocab_tok) : s->ids[row];
                on_token(s, r, tok, lr);
            }
        }
    }
    /* slots freed by this step's retirements go to waiting requests now, so nothing
     * that could run waits across a step boundary */
    admit_all(s);
    const uint64_t t1 = kiln_now_ns();
    publish(s, t1 - t0, eng_ns, n_dec, n_pre);
    if (s->trace.f && n_tok > 0) {
        char a[256];
        snprintf(a, sizeof(a),
                 "{\"tokens\":%d,\"decode\":%d,\"prefill\":%d,\"slots\":%d,\"engine_us\":%.1f,"
                 "\"sched_us\":%.1f}",
                 (int)n_tok, (int)n_dec, (int)n_pre, (int)s->n_running, (double)eng_ns * 1e-3,
                 (double)(t1 - t0 - eng_ns) * 1e-3);
        ks_trace_event(&s->trace, "step", 'X', t0, t1 - t0, a);
    }
    if (*worked && s->o.on_step_end) s->o.on_step_end(s->o.step_end_user);
    return st;
}

void ks_shutdown_all(kiln_sched *s) {
    bool hc;
    uint64_t *closes;
    int32_t nc;
    drain_inbox(s, &hc, &closes, &nc);
    kiln_free(closes);
    for (int32_t i = 0; i < s->max_slots; i++)
        if (s->slots && s->slots[i]) finish(s, s->slots[i], KILN_FINISH_SHUTDOWN, NULL);
    for (int32_t ti = 0; ti < s->n_t; ti++)
        while (s->t[ti].qhead) finish(s, s->t[ti].qhead, KILN_FINISH_SHUTDOWN, NULL);
    if (s->o.on_step_end) s->o.on_step_end(s->o.step_end_user);
}

/* ---- checks (tests) ---- */

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(msg, cap, __VA_ARGS__);                                                           \
        kiln_free(users);                                                                          \
        kiln_free(refs);                                                                           \
        return false;                                                                              \
    } while (0)

bool kiln_sched_check(kiln_sched *s, char *msg, size_t cap) {
    int32_t *users = kiln_calloc((size_t)(s->pc.cap > 0 ? s->pc.cap : 1), sizeof(int32_t));
    int32_t *refs =
        kiln_calloc((size_t)(s->eng.total_blocks > 0 ? s->eng.total_blocks : 1), sizeof(int32_t));
    if (!users || !refs) FAIL("check: out of memory");
    int32_t running = 0;
    for (int32_t ti = 0; ti < s->n_t; ti++) {
        ks_tenant *t = &s->t[ti];
        int32_t slots = 0, nw = 0;
        int64_t kv = 0, pinned = 0;
        for (int32_t i = 0; i < s->max_slots; i++) {
            ks_req *r = s->slots[i];
            if (!r || r->ti != ti) continue;
            if (r->state != KS_RUN || r->slot != i || r->seq < 0)
                FAIL("slot %d: request %llu in state %d, slot %d, seq %d", (int)i,
                     (unsigned long long)r->id, r->state, (int)r->slot, (int)r->seq);
            slots++;
            kv += r->reserve;
            const int32_t *blk;
            int32_t nb;
            s->eng.seq_blocks(s->eng.impl, r->seq, &blk, &nb);
            if (nb != blocks_of(r->n_kv))
                FAIL("request %llu: %d blocks for %d positions", (unsigned long long)r->id, (int)nb,
                     (int)r->n_kv);
            for (int32_t b = 0; b < nb; b++) {
                if (blk[b] < 0 || blk[b] >= s->eng.total_blocks)
                    FAIL("request %llu: block %d out of range", (unsigned long long)r->id,
                         (int)blk[b]);
                refs[blk[b]]++;
            }
            if (r->n_ent > nb)
                FAIL("request %llu: %d prefix entries for %d blocks", (unsigned long long)r->id,
                     (int)r->n_ent, (int)nb);
            for (int32_t e = 0; e < r->n_ent; e++) {
                users[r->ent[e]]++;
                if (memcmp(s->pc.e[r->ent[e]].tokens, r->tok + (size_t)e * KILN_SCHED_BLOCK,
                           sizeof(int32_t) * KILN_SCHED_BLOCK) != 0 ||
                    s->pc.e[r->ent[e]].scope != t->scope)
                    FAIL("request %llu: prefix entry %d does not match its tokens or scope",
                         (unsigned long long)r->id, (int)e);
            }
        }
        running += slots;
        for (ks_req *r = t->qhead; r; r = r->qnext) {
            if (r->state != KS_WAIT || r->ti != ti)
                FAIL("queue of '%s': request %llu in state %d", t->cfg.id,
                     (unsigned long long)r->id, r->state);
            nw++;
            pinned += r->n_ent;
            for (int32_t e = 0; e < r->n_ent; e++) users[r->ent[e]]++;
        }
        for (int32_t i = 0; i < s->n_sess; i++)
            if (s->sess[i].used && s->sess[i].ti == ti) {
                pinned += s->sess[i].n_ent;
                for (int32_t e = 0; e < s->sess[i].n_ent; e++) users[s->sess[i].ent[e]]++;
            }
        if (slots != t->slots_used)
            FAIL("tenant '%s': %d running, counted %d", t->cfg.id, (int)slots, (int)t->slots_used);
        if (kv != t->kv_reserved)
            FAIL("tenant '%s': %lld blocks reserved, counted %lld", t->cfg.id, (long long)kv,
                 (long long)t->kv_reserved);
        if (pinned != t->pinned_blocks)
            FAIL("tenant '%s': %lld blocks pinned, counted %lld", t->cfg.id, (long long)pinned,
                 (long long)t->pinned_blocks);
        if (nw != t->n_wait)
            FAIL("tenant '%s': %d waiting, counted %d", t->cfg.id, (int)nw, (int)t->n_wait);
        if (t->cfg.max_slots > 0 && slots > t->cfg.max_slots)
            FAIL("tenant '%s': %d slots over its quota %d", t->cfg.id, (int)slots,
                 (int)t->cfg.max_slots);
        if (t->cfg.max_kv_blocks > 0 && kv > t->cfg.max_kv_blocks)
            FAIL("tenant '%s': %lld KV blocks reserved over its quota %lld", t->cfg.id,
                 (long long)kv, (long long)t->cfg.max_kv_blocks);
    }
    if (running != s->n_running)
        FAIL("%d requests in slots, counted %d", (int)running, (int)s->n_running);
    int32_t evictable = 0;
    for (int32_t i = 0; i < s->pc.cap; i++) {
        const kiln_prefix_entry *x = &s->pc.e[i];
        if (!x->live) {
            if (users[i]) FAIL("dead prefix entry %d has %d users", (int)i, (int)users[i]);
            continue;
        }
        if (x->users != users[i])
            FAIL("prefix entry %d: %d users counted, %d found", (int)i, (int)x->users,
                 (int)users[i]);
        evictable += x->users == 0;
        refs[x->block]++;
    }
    if (evictable != s->pc.n_evictable)
        FAIL("%d evictable prefix entries, counted %d", (int)evictable, (int)s->pc.n_evictable);
    int32_t used = 0;
    for (int32_t b = 0; b < s->eng.total_blocks; b++) {
        int32_t rc = s->eng.block_refcount(s->eng.impl, b);
        if (rc != refs[b])
            FAIL("KV block %d: refcount %d, %d holders found", (int)b, (int)rc, (int)refs[b]);
        used += rc > 0;
    }
    if (s->eng.total_blocks - s->eng.blocks_free(s->eng.impl) != used)
        FAIL("%d blocks in use, pool says %d", (int)used,
             (int)(s->eng.total_blocks - s->eng.blocks_free(s->eng.impl)));
    kiln_free(users);
    kiln_free(refs);
    return true;
}

bool kiln_sched_admittable(kiln_sched *s, char *msg, size_t cap) {
    if (s->n_running >= s->max_slots) return false;
    ks_req *r = pick(s);
    if (!r || !mem_ok(s, r)) return false;
    snprintf(msg, cap, "request %llu of '%s' could run: %d of %d slots busy, %d blocks available",
             (unsigned long long)r->id, s->t[r->ti].cfg.id, (int)s->n_running, (int)s->max_slots,
             (int)mem_avail(s));
    return true;
}
