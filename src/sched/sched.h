/*
 * sched.h — kiln's multitenant continuous-batching scheduler (issue #12, DESIGN.md
 * "Scheduler and sampling"). The layer the HTTP server, `kiln run/chat` and embedders
 * build on: many requests from many tenants share one engine; every step mixes decode
 * tokens and prefill chunks; policy decides whose token comes next.
 *
 * Model of work: tenant (quotas, QoS class, isolation group, ledger) -> session (a
 * multi-turn conversation whose KV is kept between turns) -> request (prompt tokens,
 * sampling, stops, sink, cancel handle = its id) -> slot (an engine sequence).
 *
 * ---- Threads and ownership -------------------------------------------------------
 *  - One scheduler thread steps the engine: either the thread kiln_sched_start spawns,
 *    or the caller of kiln_sched_step (single-threaded embedders, tests). Never both.
 *  - kiln_sched_submit / _cancel / _resume / _usage / _stats / _tenant_by_key /
 *    _session_open / _session_close are thread-safe: any thread, any time between
 *    create and free. They take one mutex for O(1) work (submit copies the prompt) and
 *    never wait for a step.
 *  - Tenants are added between kiln_sched_create and the first step/start (not after:
 *    KILN_ERR_STATE); from then on they are immutable.
 *  - Sinks are called only from the scheduler thread, never under the scheduler's
 *    mutex (a sink may call submit/cancel/resume/usage). A sink must not block: it
 *    returns KILN_SINK_WOULD_BLOCK to ask for backpressure (see kiln_sink_fn).
 *  - Every submitted (accepted) request gets exactly ONE final event (finish !=
 *    KILN_FINISH_NONE); it is the last call of the sink for that request, so the
 *    caller may free its `user` state inside/after it. A rejected submit never calls
 *    the sink.
 *  - The scheduler borrows the engine and vocab (free the scheduler first) and owns
 *    every engine sequence it creates; do not step the engine yourself meanwhile.
 *
 * ---- Decisions (docs/SCHED.md gives the reasons) ----------------------------------
 *  - n > 1 (OpenAI `n`): the server fans out: n submits, seeds seed, seed+1, ...; the
 *    prefix cache shares their prompt blocks once the first has prefilled them.
 *  - Token-rate quotas are token buckets (burst = one second of rate). Prefill rate:
 *    a submit while the tenant's prefill bucket is in debt gets 429 with retry-after =
 *    time to repay. Decode rate: a tenant whose decode bucket is empty gets no decode
 *    tokens that step (its slots stall, nothing is lost).
 *  - KV quota: admission reserves a request's worst case, ceil((prompt + max_tokens) /
 *    16) blocks, against max_kv_blocks; a request whose worst case alone exceeds the
 *    quota is rejected (KILN_REJECT_KV_QUOTA, HTTP 400: it could never run).
 *  - max_slots is a concurrency limit: extra requests wait in the queue (not rejected).
 *  - logprobs are of the model's distribution (log-softmax of the raw logits, after
 *    the model's final softcap, before penalties / temperature), like vLLM's default.
 */
#ifndef KILN_SCHED_SCHED_H
#define KILN_SCHED_SCHED_H

#include "base/status.h"
#include "sample/sample.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kiln_vocab kiln_vocab;
typedef struct kiln_sched kiln_sched;

/* ---- tenants --------------------------------------------------------------------- */

typedef enum kiln_qos {
    KILN_QOS_INTERACTIVE = 0, /* admitted first; may preempt batch, then standard slots */
    KILN_QOS_STANDARD = 1,    /* the default                                              */
    KILN_QOS_BATCH = 2,       /* first to be preempted                                    */
    KILN_QOS_COUNT
} kiln_qos;

/* "interactive" | "standard" | "batch" (-1 when unknown) and back. */
int kiln_qos_parse(const char *s);
const char *kiln_qos_name(kiln_qos q);

/* Every limit: 0 means "no limit". Strings are copied by kiln_sched_add_tenant. */
typedef struct kiln_tenant_config {
    const char *id;              /* required, unique, [A-Za-z0-9._-]{1,64}           */
    const char *const *api_keys; /* for the server's key -> tenant lookup            */
    int32_t n_api_keys;
    kiln_qos qos;                /* default KILN_QOS_STANDARD                         */
    int32_t max_slots;           /* concurrent running requests                       */
    int64_t max_kv_blocks;       /* KV blocks (16 tokens each) reserved at once       */
    double decode_tokens_per_s;  /* generated tokens per second                       */
    double prefill_tokens_per_s; /* prompt tokens (not prefix-cache hits) per second  */
    int32_t max_context;         /* prompt + max_tokens of one request                */
    int32_t max_queued;          /* waiting requests of this tenant (0: no own limit) */
    const char *isolation_group; /* tenants of one group share prefix-cache blocks;
                                    NULL: the tenant is its own group                 */
} kiln_tenant_config;

void kiln_tenant_config_default(kiln_tenant_config *c);

/* A list of tenant configs read from kiln.yaml's `tenants:` key (other top-level keys
 * — the kernel policy — are ignored here). Owns every string it points to. */
typedef struct kiln_tenant_list {
    kiln_tenant_config *items;
    int32_t n;
    void *arena_; /* private */
} kiln_tenant_list;

/* Parses the `tenants:` sequence of a YAML file (shape in docs/SCHED.md and issue #12).
 * A file without `tenants:` gives an empty list. Errors name the file, line and key:
 * KILN_ERR_IO, KILN_ERR_FORMAT (YAML syntax, wrong type, unknown key, duplicate id,
 * bad qos), KILN_ERR_RANGE (negative limit). */
kiln_status kiln_tenants_load_yaml(const char *path, kiln_tenant_list *out, kiln_err *err);
/* Same from a buffer; `name` is used in messages. */
kiln_status kiln_tenants_parse_yaml(const char *text, size_t len, const char *name,
                                    kiln_tenant_list *out, kiln_err *err);
void kiln_tenant_list_free(kiln_tenant_list *l);

/* ---- scheduler ------------------------------------------------------------------- */

typedef struct kiln_sched_opts {
    int32_t max_slots;           /* running requests at once (0: the engine's max_seqs)      */
    int32_t step_tokens;         /* token budget of one step, decode + prefill chunks
                                    (--step-tokens; 0: per-backend default, <= the engine's
                                    max_step_tokens)                                         */
    int32_t max_queued;          /* waiting requests over all tenants (0: 4096)              */
    int32_t park_max_ms;         /* a slot whose sink keeps answering WOULD_BLOCK this long
                                    ends with KILN_FINISH_ERROR (0: 30000)                   */
    int32_t prefix_cache;        /* 1 (default via _opts_default): on; 0: off                */
    const char *model_id;        /* model identity mixed into prefix-cache keys (NULL: the
                                    engine's model path + architecture)                      */
    const char *trace_path;      /* --trace FILE: Chrome trace of steps, admissions,
                                    preemptions (NULL: off)                                  */
    bool deterministic;          /* greedy outputs independent of the batch: the scheduler
                                    then plans only on batch-invariant kernels (ref, cpu)    */
    int32_t latency_step_tokens; /* budget of a step while a slot of an interactive tenant
                                    decodes, so prefill chunks do not stretch its
                                    inter-token time (0: 64; >= step_tokens: off)      */
    /* Called after every scheduler step that did work (engine step, admissions,
     * cancellations, retirements), once all of that step's sink calls have returned, and
     * after the shutdown's final events; on the thread that ran the step (the scheduler's
     * thread once started). A server batches the wakeups of one step's streams on it.
     * Must not call back into the scheduler's stepping. NULL: none. */
    void (*on_step_end)(void *user);
    void *step_end_user;
} kiln_sched_opts;

void kiln_sched_opts_default(kiln_sched_opts *o);

typedef struct kiln_engine kiln_engine;

/* Creates a scheduler over an engine (borrowed; the scheduler owns all its sequences
 * from now on) and a vocabulary (borrowed; for detokenizing, EOS and stop strings; may
 * be NULL: events then carry no text, and only stop tokens and length end a request).
 * With no tenant added before the first step, one tenant "default" without limits
 * exists. Errors: KILN_ERR_INVALID_ARG, KILN_ERR_NOMEM, KILN_ERR_IO (trace file). */
kiln_status kiln_sched_create(kiln_engine *e, const kiln_vocab *v, const kiln_sched_opts *o,
                              kiln_sched **out, kiln_err *err);
/* Stops the thread (if started), ends every pending request with KILN_FINISH_SHUTDOWN
 * (sinks called), frees engine sequences, closes the trace. NULL is fine. */
void kiln_sched_free(kiln_sched *s);

/* Before the first step only. Errors: KILN_ERR_STATE (after start), KILN_ERR_INVALID_ARG
 * (bad id, duplicate id or API key, negative limit), KILN_ERR_NOMEM. */
kiln_status kiln_sched_add_tenant(kiln_sched *s, const kiln_tenant_config *t, kiln_err *err);
kiln_status kiln_sched_add_tenants(kiln_sched *s, const kiln_tenant_list *l, kiln_err *err);

/* The tenant id of an API key, copied to id (cap bytes, NUL-terminated). false when no
 * tenant has the key. Constant time in the key's content is not promised. */
bool kiln_sched_tenant_by_key(kiln_sched *s, const char *api_key, char *id, size_t cap);

/* Spawns the scheduler thread: it steps while there is work and sleeps on a condition
 * variable otherwise. Errors: KILN_ERR_STATE (already started), KILN_ERR_IO (thread). */
kiln_status kiln_sched_start(kiln_sched *s, kiln_err *err);
/* Joins the thread after finishing nothing: pending requests stay queued (freed, with
 * KILN_FINISH_SHUTDOWN, by kiln_sched_free). Idempotent. */
void kiln_sched_stop(kiln_sched *s);

/* One step on the caller's thread (when not started): admit, plan, run the engine,
 * sample, stream, retire. *worked: whether anything ran or changed (false = idle).
 * Errors are engine failures (the step's requests end with KILN_FINISH_ERROR and the
 * scheduler stays usable); KILN_ERR_STATE when the thread is running. */
kiln_status kiln_sched_step(kiln_sched *s, bool *worked, kiln_err *err);
/* Steps until no request is queued or running (tests, `kiln run`). */
kiln_status kiln_sched_drain(kiln_sched *s, kiln_err *err);

/* ---- requests -------------------------------------------------------------------- */

typedef enum kiln_finish {
    KILN_FINISH_NONE = 0,     /* not final: more events follow                            */
    KILN_FINISH_STOP,         /* end-of-generation token, a stop token or a stop string   */
    KILN_FINISH_LENGTH,       /* max_tokens or the context limit reached                  */
    KILN_FINISH_CANCELLED,    /* kiln_sched_cancel                                        */
    KILN_FINISH_DISCONNECTED, /* the sink answered KILN_SINK_CLOSED                       */
    KILN_FINISH_ERROR,        /* engine failure, or backpressure past park_max_ms         */
    KILN_FINISH_SHUTDOWN      /* kiln_sched_free with the request pending                 */
} kiln_finish;
/* "stop", "length", "cancelled", "disconnected", "error", "shutdown" ("" for NONE). */
const char *kiln_finish_name(kiln_finish f);

typedef struct kiln_top_logprob {
    int32_t token;
    float logprob;
} kiln_top_logprob;

/* One call of a sink. Pointers are valid only during the call. */
typedef struct kiln_token_event {
    uint64_t request_id;
    int32_t token;    /* the generated token, -1 in a final event that carries none     */
    const char *text; /* newly complete text (UTF-8, stop strings and anything held
                         back excluded); may be empty (len 0), never NULL              */
    size_t text_len;
    float logprob;               /* of `token` (when the request asked for logprobs)   */
    const kiln_top_logprob *top; /* the top_logprobs most likely tokens, best first    */
    int32_t n_top;
    kiln_finish finish; /* != NONE: the last event of this request            */
    int32_t stop_index; /* which stop string matched (-1: none / a token)     */
    const char *error;  /* KILN_FINISH_ERROR: why; else NULL                  */
    /* usage, valid in every event */
    int32_t n_prompt, n_cached, n_generated; /* n_cached: prompt tokens from the cache */
} kiln_token_event;

typedef enum kiln_sink_result {
    KILN_SINK_OK = 0,      /* taken; keep going                                          */
    KILN_SINK_WOULD_BLOCK, /* taken, but the consumer is full: the slot is parked (no
                              tokens generated for it) until kiln_sched_resume or
                              park_max_ms, then KILN_FINISH_ERROR                       */
    KILN_SINK_CLOSED       /* the client is gone: the request ends (one more final call
                              with KILN_FINISH_DISCONNECTED follows)                    */
} kiln_sink_result;

/* Called on the scheduler thread; must not block; see the thread rules above. The
 * event of a final call is always taken (the return value is ignored). */
typedef kiln_sink_result (*kiln_sink_fn)(void *user, const kiln_token_event *ev);

typedef struct kiln_request_params {
    const char *tenant;           /* NULL: "default"                                       */
    uint64_t session;             /* 0: none; else from kiln_sched_session_open            */
    const int32_t *prompt;        /* the whole prompt (for a session: the whole
                                     conversation; its cached prefix is reused); copied   */
    int32_t n_prompt;             /* >= 1                                                  */
    int32_t max_tokens;           /* 0: up to the context limit                            */
    kiln_sampler_params sampling; /* kiln_sampler_params_default; temperature <= 0 greedy */
    const char *const *stop;      /* stop strings (copied)                                 */
    int32_t n_stop;
    const int32_t *stop_tokens; /* extra stop token ids (copied)                         */
    int32_t n_stop_tokens;
    bool ignore_eos;      /* do not stop at the vocabulary's end-of-generation ids */
    bool logprobs;        /* fill logprob                                          */
    int32_t top_logprobs; /* 0..20 entries of top per event                        */
    kiln_sink_fn sink;    /* required                                              */
    void *user;           /* passed to sink                                        */
} kiln_request_params;

void kiln_request_params_default(kiln_request_params *p);

typedef enum kiln_reject {
    KILN_REJECT_NONE = 0,
    KILN_REJECT_BAD_REQUEST,    /* 400: malformed params (empty prompt, token id range...) */
    KILN_REJECT_CONTEXT,        /* 400: prompt + max_tokens over max_context / engine ctx  */
    KILN_REJECT_KV_QUOTA,       /* 400: worst case needs more KV blocks than the quota     */
    KILN_REJECT_UNKNOWN_TENANT, /* 404 (the server maps keys first: 401 for a bad key)     */
    KILN_REJECT_QUOTA,          /* 429 + retry_after_s: token-rate or tenant queue quota   */
    KILN_REJECT_OVERLOADED,     /* 503 + retry_after_s: the scheduler's queue is full      */
    KILN_REJECT_SHUTDOWN        /* 503: the scheduler is being freed                       */
} kiln_reject;

typedef struct kiln_rejection {
    kiln_reject reason;
    int http_status;      /* 400, 404, 429 or 503 (0 when accepted)                         */
    double retry_after_s; /* > 0 for 429 / 503: when a retry may succeed (an estimate)     */
    char message[256];    /* human-readable, names the limit and the numbers              */
} kiln_rejection;

/* Queues a request. KILN_OK: accepted, *id is its handle (never 0; ids are not reused).
 * Rejected: returns KILN_ERR_CAPACITY (429/503), KILN_ERR_RANGE (context / KV quota),
 * KILN_ERR_NOT_FOUND (tenant) or KILN_ERR_INVALID_ARG (params), fills *rej (may be NULL)
 * and err, counts requests_rejected, and never calls the sink. */
kiln_status kiln_sched_submit(kiln_sched *s, const kiln_request_params *p, uint64_t *id,
                              kiln_rejection *rej, kiln_err *err);
/* Ends the request at the next step boundary with KILN_FINISH_CANCELLED (its slot and
 * blocks are free for that step's admission). Unknown or finished ids: no-op (false). */
bool kiln_sched_cancel(kiln_sched *s, uint64_t id);
/* Un-parks a request whose sink answered WOULD_BLOCK (no-op otherwise). */
void kiln_sched_resume(kiln_sched *s, uint64_t id);

/* ---- sessions -------------------------------------------------------------------- */
/* A session keeps the KV blocks of its last finished turn (prompt + output, full
 * blocks) pinned in the tenant's prefix cache, so the next turn — whose prompt starts
 * with that conversation — skips their prefill. Pinned blocks count against the
 * tenant's max_kv_blocks. Requests of a session run one at a time (a second one waits).
 * Errors: KILN_ERR_NOT_FOUND (tenant), KILN_ERR_CAPACITY (too many sessions). */
kiln_status kiln_sched_session_open(kiln_sched *s, const char *tenant, uint64_t *session,
                                    kiln_err *err);
/* Unpins the blocks (they stay in the cache, LRU-evictable). Unknown ids: no-op. */
void kiln_sched_session_close(kiln_sched *s, uint64_t session);

/* ---- ledger ---------------------------------------------------------------------- */

typedef struct kiln_pctl {
    double p50, p99; /* over the last 4096 samples; 0 when none */
} kiln_pctl;

/* Per tenant; the names are the JSON keys of /v1/tenants/{id}/usage. */
typedef struct kiln_tenant_usage {
    uint64_t tokens_prompted; /* prompt tokens of admitted requests (cached included)  */
    uint64_t tokens_generated;
    uint64_t prefix_hit_tokens; /* prompt tokens served from the prefix cache             */
    uint64_t requests_admitted;
    uint64_t requests_rejected;
    uint64_t requests_preempted; /* preemption events (a request may count twice)         */
    uint64_t requests_cancelled; /* cancelled + disconnected                               */
    int32_t slots_active;
    int32_t slots_peak;
    int64_t kv_blocks; /* blocks held now by the tenant's requests + sessions    */
    int64_t kv_blocks_peak;
    kiln_pctl ttft_ms;        /* submit -> first token event                           */
    kiln_pctl inter_token_ms; /* between consecutive token events of a request         */
    /* extras (not in the list) */
    int32_t requests_queued;
    uint64_t requests_finished;
} kiln_tenant_usage;

/* Errors: KILN_ERR_NOT_FOUND. */
kiln_status kiln_sched_usage(kiln_sched *s, const char *tenant, kiln_tenant_usage *out,
                             kiln_err *err);
/* Tenant ids (borrowed, valid until kiln_sched_free), for /metrics. */
int32_t kiln_sched_tenant_count(const kiln_sched *s);
const char *kiln_sched_tenant_id(const kiln_sched *s, int32_t i);

/* Whole-scheduler counters (for /metrics and benchmarks). */
typedef struct kiln_sched_stats {
    uint64_t steps, step_tokens, decode_tokens, prefill_tokens;
    uint64_t preempt_kept;      /* preemptions whose KV stayed pinned (resume in place)  */
    uint64_t preempt_recompute; /* ... whose KV was dropped (prefix recomputed later)    */
    uint64_t prefix_hit_tokens, prefix_lookup_tokens;
    int32_t slots_active, slots_total, requests_queued, requests_parked;
    int32_t kv_blocks_used, kv_blocks_total, kv_blocks_cached; /* cached: held by cache only */
    double sched_us_last, sched_us_mean; /* host time per step outside the engine step */
} kiln_sched_stats;
void kiln_sched_stats_get(kiln_sched *s, kiln_sched_stats *out);

#endif /* KILN_SCHED_SCHED_H */
