/*
 * select.h — choosing one kernel per call site and shape bucket, and the dispatch table
 * that adapters index directly.
 *
 * When a plan is bound to a backend, the binding (src/runtime/) describes every kernel
 * call site of every adapter (kiln_sel_site: op, dtypes, shapes, features...) and calls
 * kiln_dispatch_build. For each site and each shape bucket it runs the selection
 * pipeline:
 *
 *   policy lock -> cache -> filter (every failing constraint -> a reason code)
 *     -> score (priority + policy prefer + PerfDB timings, bounded) -> select
 *
 * and stores the chosen function pointer in the table. In the hot loop an adapter does
 *
 *   int b = kiln_bucket_index(step_tokens, step_max_seq);        // once per step
 *   kiln_dispatch_get(d, site, b)->fn.matmul(&kctx, &args);      // per call
 *
 * and nothing else: no selection per token.
 *
 * When no candidate is valid the op's fallback (ref) kernel is used with a warning, once
 * per call site — or, with policy `strict`, binding fails with KILN_ERR_UNSUPPORTED and a
 * message listing every candidate's reasons.
 *
 * Circuit breaker: a kernel that returns an error at run time is reported with
 * kiln_dispatch_fail; it is marked unhealthy in the selector (BACKEND_UNHEALTHY from then
 * on) and every table entry that used it is rebound to the next candidate.
 *
 * Thread safety: kiln_select may be called from any number of threads on one selector
 * (the cache is sharded, each shard under its own lock; health bits are atomic).
 * A dispatch table is read by the executor thread without locks; kiln_dispatch_fail must
 * be called from that same thread between kernel calls.
 */
#ifndef KILN_KERNELS_SELECT_H
#define KILN_KERNELS_SELECT_H

#include "base/status.h"
#include "kernels/policy.h"
#include "kernels/registry.h"
#include "kernels/spec.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kiln_selector kiln_selector;
typedef struct kiln_perf_table kiln_perf_table; /* perfdb.h */

/* ---- shape buckets ----
 * tokens in the step: 1, 2-8, 9-64, 65-512, >512;
 * attended context (attention only; other ops use bucket 0): <=512, <=4096, <=32768, more. */
enum { KILN_TOK_BUCKETS = 5, KILN_SEQ_BUCKETS = 4 };
#define KILN_SEL_BUCKETS (KILN_TOK_BUCKETS * KILN_SEQ_BUCKETS)

static inline int kiln_tok_bucket(int64_t tokens) {
    return tokens <= 1 ? 0 : tokens <= 8 ? 1 : tokens <= 64 ? 2 : tokens <= 512 ? 3 : 4;
}
static inline int kiln_seq_bucket(int64_t seq) {
    return seq <= 512 ? 0 : seq <= 4096 ? 1 : seq <= 32768 ? 2 : 3;
}
static inline int kiln_bucket_index(int64_t tokens, int64_t seq) {
    return kiln_tok_bucket(tokens) * KILN_SEQ_BUCKETS + kiln_seq_bucket(seq);
}
/* Upper bound of a bucket (INT64_MAX for the last). */
int64_t kiln_tok_bucket_max(int b);
int64_t kiln_seq_bucket_max(int b);
const char *kiln_tok_bucket_name(int b); /* "1", "2-8", "9-64", "65-512", ">512" */
const char *kiln_seq_bucket_name(int b); /* "<=512", "<=4K", "<=32K", ">32K" */
bool kiln_tok_bucket_from_name(const char *s, int *out);

/* ---- the call-site context ---- */
typedef struct kiln_sel_ctx {
    kiln_kop op;
    kiln_backend_id backend;
    uint32_t isa; /* host kiln_isa bits of the device (kiln_cpu_info()->isa)   */
    int32_t sm;   /* CUDA compute capability x10, 0 on the host                */
    uint32_t w_dtype, act_dtype, kv_dtype; /* kiln_dtype or KILN_DTYPE_NONE    */
    int32_t tok_bucket, seq_bucket;        /* performance buckets              */
    int64_t tokens_max;                    /* most tokens one call can carry in this bucket       */
    int64_t seq_max;                       /* longest attended context in this bucket (attention) */
    int64_t n, k;                          /* matmul n x k; embed/norm/glu/add row size in n      */
    int32_t head_dim, n_head, n_kv_head;   /* rope / kv_write / attention        */
    uint32_t features;                     /* kiln_kfeat bits the site needs     */
    bool deterministic;                    /* only deterministic kernels                        */
    bool batch_invariant;                  /* only batch-invariant kernels                      */
    bool graph_capture;                    /* only graph-safe kernels (CUDA graphs)             */
    uint64_t headroom_bytes;               /* workspace budget, 0 = unlimited                */
} kiln_sel_ctx;

/* A context with everything "none": op and backend set, isa from kiln_cpu_info() for
 * host backends, dtypes KILN_DTYPE_NONE, act f32, bucket 0 (1 token). */
void kiln_sel_ctx_init(kiln_sel_ctx *c, kiln_kop op, kiln_backend_id backend);
/* Sets tok/seq buckets and their tokens_max/seq_max, clamped to the plan's limits
 * (max_tokens, max_seq; 0 = unbounded). */
void kiln_sel_ctx_set_bucket(kiln_sel_ctx *c, int tok_bucket, int seq_bucket, int64_t max_tokens,
                             int64_t max_seq);

/* ---- reasons ---- */
typedef enum kiln_reason {
    KILN_REASON_PLATFORM_MISMATCH = 0, /* another platform/backend; the ref backend
                                          (the oracle) runs fallback kernels only    */
    KILN_REASON_ISA_MISSING,           /* CPU lacks a required ISA extension         */
    KILN_REASON_SM_TOO_OLD,
    KILN_REASON_SM_TOO_NEW,
    KILN_REASON_DTYPE_UNSUPPORTED, /* weight, activation or KV dtype               */
    KILN_REASON_HEAD_DIM_INVALID,  /* outside [head_dim_min, head_dim_max]         */
    KILN_REASON_HEAD_DIM_ALIGNMENT,
    KILN_REASON_SEQ_TOO_LONG,
    KILN_REASON_GQA_UNSUPPORTED,
    KILN_REASON_FEATURE_UNSUPPORTED,
    KILN_REASON_NON_DETERMINISTIC,
    KILN_REASON_NOT_BATCH_INVARIANT,
    KILN_REASON_GRAPH_UNSAFE,
    KILN_REASON_WORKSPACE_EXCEEDS_HEADROOM,
    KILN_REASON_PROVIDER_UNAVAILABLE, /* library missing, descriptor rejected, not built */
    KILN_REASON_BACKEND_UNHEALTHY,    /* circuit breaker tripped                        */
    KILN_REASON_POLICY_AVOIDED,       /* avoid list, or reference_only                  */
    KILN_REASON_POLICY_LOCKED,        /* another kernel is locked for this op           */
    KILN_REASON_TOO_MANY_TOKENS,      /* bucket's tokens above the kernel's max_tokens  */
    KILN_REASON_SHAPE_ALIGNMENT,      /* n or k not a multiple the kernel needs         */
    KILN_REASON_COUNT
} kiln_reason;

#define KILN_REASON_BIT(r) (1u << (r))
/* Reasons a fallback kernel may not ignore (it must run correctly). */
#define KILN_REASONS_HARD                                                                          \
    (KILN_REASON_BIT(KILN_REASON_PLATFORM_MISMATCH) | KILN_REASON_BIT(KILN_REASON_ISA_MISSING) |   \
     KILN_REASON_BIT(KILN_REASON_SM_TOO_OLD) | KILN_REASON_BIT(KILN_REASON_SM_TOO_NEW) |           \
     KILN_REASON_BIT(KILN_REASON_DTYPE_UNSUPPORTED) |                                              \
     KILN_REASON_BIT(KILN_REASON_HEAD_DIM_INVALID) |                                               \
     KILN_REASON_BIT(KILN_REASON_HEAD_DIM_ALIGNMENT) | KILN_REASON_BIT(KILN_REASON_SEQ_TOO_LONG) | \
     KILN_REASON_BIT(KILN_REASON_GQA_UNSUPPORTED) |                                                \
     KILN_REASON_BIT(KILN_REASON_FEATURE_UNSUPPORTED) |                                            \
     KILN_REASON_BIT(KILN_REASON_PROVIDER_UNAVAILABLE) |                                           \
     KILN_REASON_BIT(KILN_REASON_BACKEND_UNHEALTHY) |                                              \
     KILN_REASON_BIT(KILN_REASON_TOO_MANY_TOKENS) | KILN_REASON_BIT(KILN_REASON_SHAPE_ALIGNMENT))

const char *kiln_reason_name(kiln_reason r); /* "DTYPE_UNSUPPORTED" */
/* Human text for one reason of kernel k in context c: "needs avx512f avx512bw". */
void kiln_reason_message(kiln_reason r, const kiln_selector *s, const kiln_reg_kernel *k,
                         const kiln_sel_ctx *c, char *buf, size_t n);
/* All reasons of a mask, "CODE (message); CODE (message)". */
void kiln_reasons_format(uint32_t mask, const kiln_selector *s, const kiln_reg_kernel *k,
                         const kiln_sel_ctx *c, char *buf, size_t n);

/* ---- the selector ---- */

/* Borrows reg, policy and perf (may be NULL: no timings); they must outlive it. */
kiln_status kiln_selector_new(const kiln_registry *reg, const kiln_policy *policy,
                              const kiln_perf_table *perf, kiln_selector **out, kiln_err *err);
void kiln_selector_free(kiln_selector *s);
const kiln_registry *kiln_selector_registry(const kiln_selector *s);
const kiln_policy *kiln_selector_policy(const kiln_selector *s);
const kiln_perf_table *kiln_selector_perf(const kiln_selector *s); /* NULL: no timings */

/* Replace policy or perf table (borrowed); both invalidate the cache. */
void kiln_selector_set_policy(kiln_selector *s, const kiln_policy *policy);
void kiln_selector_set_perf(kiln_selector *s, const kiln_perf_table *perf);
/* Circuit breaker state: mark / clear a kernel unhealthy (invalidates the cache). */
void kiln_selector_mark_unhealthy(kiln_selector *s, int kernel_index);
void kiln_selector_clear_health(kiln_selector *s);
bool kiln_selector_is_healthy(const kiln_selector *s, int kernel_index);
/* Cache statistics (tests, bench). */
void kiln_selector_cache_stats(const kiln_selector *s, uint64_t *hits, uint64_t *misses);
/* Key that identifies the selector's state (registry, policy, perf, health): equal
 * epochs give equal choices for equal contexts. */
uint64_t kiln_selector_state_hash(const kiln_selector *s);

/* Scoring constants (docs/KERNELS.md). */
#define KILN_SCORE_PREFER_FIRST   50.0    /* first preferred name; each next one 10 less (min 10) */
#define KILN_SCORE_SMALL_BATCH    (-40.0) /* tokens_max < spec.good_tokens              */
#define KILN_SCORE_PERF_MAX_BONUS 10.0    /* fastest measured candidate, full confidence */
#define KILN_SCORE_PERF_MAX_MALUS 40.0    /* slowest, full confidence                   */

typedef struct kiln_sel_cand {
    const kiln_reg_kernel *k;
    uint32_t reasons; /* KILN_REASON_BIT mask; 0 = valid */
    double score;     /* total (valid candidates)           */
    double perf_adj;  /* PerfDB part of score               */
    double perf_us;   /* measured median, 0 = none          */
} kiln_sel_cand;

enum {
    KILN_SEL_NO_CACHE = 1u << 0, /* evaluate everything (explain), do not read the cache */
};

typedef struct kiln_sel_result {
    const kiln_reg_kernel *chosen; /* NULL only on error                         */
    double score;
    bool fallback;  /* nothing valid: the op's fallback kernel                   */
    bool locked;    /* chosen by a policy lock                                   */
    bool cached;    /* came from the cache: cands[] is empty                     */
    int lock_src;   /* kiln_policy_src of the lock                               */
    char note[160]; /* e.g. "lock 'x' ignored: DTYPE_UNSUPPORTED"               */
    int n_cands;
    kiln_sel_cand cands[KILN_REG_MAX_PER_OP]; /* every candidate, best first      */
} kiln_sel_result;

/* The reasons kernel k is invalid for context c (0 = valid): the filter step alone. */
uint32_t kiln_select_check(const kiln_selector *s, const kiln_reg_kernel *k, const kiln_sel_ctx *c);

/* Runs the pipeline. KILN_ERR_UNSUPPORTED when no kernel can run (strict mode, or the
 * fallback itself is invalid), with a message listing every candidate's reasons.
 * res is filled (candidates with reasons) on that error too. */
kiln_status kiln_select(kiln_selector *s, const kiln_sel_ctx *ctx, unsigned flags,
                        kiln_sel_result *res, kiln_err *err);

/* ---- dispatch tables ---- */

/* A call site as the binding describes it. ctx carries everything but the bucket fields;
 * ctx.tokens_max / ctx.seq_max hold the plan's limits (most tokens per step, context
 * length; 0 = unbounded). */
typedef struct kiln_sel_site {
    char name[64]; /* "blk.3.attn.q" — unique within a table                       */
    int instr;     /* plan instruction index (explain), -1 = none                  */
    kiln_sel_ctx ctx;
} kiln_sel_site;

typedef struct kiln_dispatch_entry {
    kiln_kernel_fn fn;        /* what the adapter calls                           */
    const kiln_reg_kernel *k; /* chosen kernel                                     */
    size_t workspace;         /* bytes of scratch it needs                         */
    float score;
    uint8_t fallback, locked;
} kiln_dispatch_entry;

typedef struct kiln_dispatch {
    int n_sites;
    kiln_sel_site *sites;   /* owned copies                                         */
    kiln_dispatch_entry *e; /* [n_sites][KILN_SEL_BUCKETS]                          */
    size_t max_workspace;   /* the scratch an executor must provide                 */
    uint64_t state_hash;    /* kiln_selector_state_hash at build time               */
    int rebinds;            /* circuit-breaker rebinds so far                       */
} kiln_dispatch;

static inline const kiln_dispatch_entry *kiln_dispatch_get(const kiln_dispatch *d, int site,
                                                           int bucket) {
    return &d->e[(size_t)site * KILN_SEL_BUCKETS + (size_t)bucket];
}

/* Selects every (site, bucket). Buckets the plan cannot reach (above its max tokens or
 * context) get the entry of the largest reachable one. Warns once per site that falls
 * back to the ref kernel. On error *out is NULL. */
kiln_status kiln_dispatch_build(kiln_selector *s, const kiln_sel_site *sites, int n_sites,
                                kiln_dispatch **out, kiln_err *err);
void kiln_dispatch_free(kiln_dispatch *d);

/* Circuit breaker: the kernel at (site, bucket) failed with `failure`. Marks it unhealthy
 * and rebinds every entry that used it. KILN_OK when the entry now holds another kernel
 * (retry the call); an error when nothing else can run. */
kiln_status kiln_dispatch_fail(kiln_dispatch *d, kiln_selector *s, int site, int bucket,
                               const kiln_err *failure, kiln_err *err);

#endif /* KILN_KERNELS_SELECT_H */
