/*
 * sched_impl.h — the scheduler's internals, shared by sched.c (API, threads, ledger),
 * step.c (admission, planning, running, streaming, retiring, preemption) and tests.
 *
 * Locks: `mu` guards the inbox (arrivals, cancels, resumes, session closes), the id
 * map, queue counters used by submit and the session table; `lmu` guards the ledger
 * (tenant usage, percentile rings, stats). Everything else belongs to the scheduler
 * thread. A sink is never called with either lock held.
 */
#ifndef KILN_SCHED_SCHED_IMPL_H
#define KILN_SCHED_SCHED_IMPL_H

#include "runtime/engine.h"
#include "sched/adapter.h"
#include "sched/prefix.h"
#include "sched/sched.h"

#include <pthread.h>
#include <stdio.h>

typedef struct kiln_detok_stream kiln_detok_stream;

#define KS_PCTL_N 4096
typedef struct ks_ring {
    float v[KS_PCTL_N];
    uint32_t n, pos;
} ks_ring;

typedef struct ks_req ks_req;
typedef struct ks_session ks_session;

typedef struct ks_tenant {
    kiln_tenant_config cfg; /* strings point into own_* */
    char *own_id, *own_group;
    char **own_keys;
    uint64_t scope;
    /* scheduler thread */
    int32_t slots_used;
    int64_t kv_reserved, pinned_blocks;
    double dec_bucket, pre_bucket;
    double recent_dec, recent_pre; /* decayed token counts (tau 1 s) ~ tokens/s */
    ks_req *qhead, *qtail;
    int32_t n_wait;
    /* under mu */
    int32_t n_queued_m;   /* accepted, never admitted yet */
    int64_t backlog_m;    /* prompt tokens of those */
    int32_t slots_used_m; /* slots_used, mirrored for submit's queue limit */
    /* under lmu */
    kiln_tenant_usage u;
    ks_ring ttft, itl;
} ks_tenant;

enum { KS_INCOMING, KS_WAIT, KS_RUN, KS_DONE };

struct ks_req {
    uint64_t id, arrival, admitted;
    int32_t ti;
    ks_session *sess;
    int32_t *tok;
    int32_t n_prompt, n_tok, cap;
    int32_t max_tokens, n_gen, reserve;
    kiln_sampler_params sp;
    kiln_logit_bias *bias; /* owned copy of sp.logit_bias (the submitter's is borrowed) */
    bool plain_greedy, ignore_eos, logprobs, ever_admitted;
    int32_t top_logprobs;
    char **stops;
    int32_t n_stops;
    int32_t *stop_toks;
    int32_t n_stop_toks;
    kiln_sink_fn sink;
    void *user;
    int state;
    int32_t slot, seq, n_kv;
    int32_t *ent; /* prefix entries of full blocks [0, n_ent) (users held) */
    int32_t n_ent, ent_cap;
    bool ent_broken;
    int32_t n_cached;
    kiln_sampler *smp;
    kiln_detok_stream *ds;
    kiln_stopper stopper;
    bool stopper_ok;
    char *tbuf;
    size_t tlen, tcap;
    uint64_t t_submit, t_last;
    bool got_first;
    bool text_lost; /* a piece of output text could not be buffered (out of memory) */
    bool parked, cancel_seen;
    uint64_t park_since;
    int32_t plan_cnt;      /* tokens in this step's plan */
    int32_t row;           /* logits row in this step (-1) */
    ks_req *qnext, *qprev; /* tenant queue / inbox */
    ks_req *hnext;         /* id map */
};

struct ks_session {
    uint64_t id;
    int32_t ti;
    bool closed, used;
    ks_req *owner; /* the request of this session now (one at a time) */
    int32_t *ent;
    int32_t n_ent;
};

typedef struct ks_trace {
    FILE *f;
    uint64_t t0;
    bool first;
} ks_trace;

#define KS_MAP_N 4096

struct kiln_sched {
    kiln_sched_engine eng;
    bool own_wrap;
    const kiln_vocab *vocab;
    int32_t n_vocab_tok;
    kiln_sched_opts o;
    int32_t max_slots, step_tokens, latency_tokens, max_queued, park_max_ms;
    ks_tenant *t;
    int32_t n_t, cap_t;
    bool frozen;
    ks_req **slots;
    int32_t n_running;
    kiln_prefix_cache pc;
    bool pc_on;
    /* step buffers */
    kiln_batch_entry *en;
    ks_req **en_rq;
    int32_t *ids;
    float *logits;
    size_t logits_rows;
    /* sampled steps (the engine's device samples): per row parameters, overrides */
    struct kiln_sample_row_params *srows; /* [max_slots] */
    int32_t *sov_id, *sov_count;
    float *sov_bias;
    int32_t sov_cap, srows_cap;
    kiln_sample_step sstep;
    kiln_top_logprob *top;
    ks_req **plan; /* requests in this step's plan */
    int32_t n_plan;
    float *lpbuf;
    /* inbox and map (mu) */
    pthread_mutex_t mu, lmu;
    pthread_cond_t cv;
    ks_req *in_head, *in_tail;
    uint64_t *cancels, *resumes;
    int32_t n_cancels, cap_cancels, n_resumes, cap_resumes;
    uint64_t *closes;
    int32_t n_closes, cap_closes;
    ks_req *map[KS_MAP_N];
    uint64_t next_id;
    int32_t n_queued_m;
    int32_t n_running_m; /* n_running, mirrored under mu for submit's queue limit */
    bool closing, started, stop;
    pthread_t th;
    ks_session *sess;
    int32_t n_sess, cap_sess;
    uint64_t next_sess;
    /* scheduler thread */
    uint64_t arrival_seq, admit_seq;
    uint64_t last_ns;
    double done_rate; /* finished requests per second (EWMA) */
    uint64_t last_done_ns;
    int32_t fail_streak;
    ks_trace trace;
    /* ledger (lmu) */
    kiln_sched_stats stats;
    double sched_us_sum;
};

/* The scheduler over any kiln_sched_engine (tests pass a fake one; copied). */
kiln_status kiln_sched_create_with(const kiln_sched_engine *eng, const kiln_vocab *v,
                                   const kiln_sched_opts *o, kiln_sched **out, kiln_err *err);

/* step.c */
kiln_status ks_step(kiln_sched *s, bool *worked, kiln_err *err);
/* Frees a request and everything it owns (prompt/tokens, stops, logit_bias copy, text). */
void ks_req_free(ks_req *r);
void ks_shutdown_all(kiln_sched *s);
void ks_ring_add(ks_ring *r, float v);
kiln_pctl ks_ring_pctl(const ks_ring *r);
/* Checks the scheduler's bookkeeping (tests; scheduler thread, between steps): slots,
 * sequences, entry users, tenant counters, quotas. false + a message on the first
 * violation. */
bool kiln_sched_check(kiln_sched *s, char *msg, size_t cap);
/* Whether some waiting request could be admitted now (a free slot, its tenant under
 * quota, memory for its first chunk) — after a step's admission this must be false. */
bool kiln_sched_admittable(kiln_sched *s, char *msg, size_t cap);

/* trace.c */
kiln_status ks_trace_open(ks_trace *t, const char *path, kiln_err *err);
void ks_trace_close(ks_trace *t);
void ks_trace_event(ks_trace *t, const char *name, char ph, uint64_t ts_ns, uint64_t dur_ns,
                    const char *args_json);

#endif /* KILN_SCHED_SCHED_IMPL_H */
