/*
 * select.h — choosing one kernel per call site and shape bucket.
 *
 * When a plan is bound to a device, the binding (src/runtime/kselect.c) describes every
 * kernel call site of every adapter as a selection context (kiln_sel_ctx: op, dtypes,
 * shapes, features, bucket) and calls kiln_select once per site and token bucket. The
 * selection pipeline is
 *
 *   policy lock -> cache -> filter (every failing constraint -> a reason code)
 *     -> score (priority + policy prefer + PerfDB timings, bounded) -> select
 *
 * and the chosen function pointers form the one dispatch table there is: the bound
 * plan's per-site table (runtime/backend.h, kiln_site.fn[bucket]). In the hot loop an
 * adapter picks the bucket once per step and calls site.fn[bucket]: no selection per
 * token. `kiln solve` bakes that same table to a file and `kiln run --dispatch` reads it
 * back through the same binding (kernels/dispatch.h).
 *
 * When no candidate is valid the op's fallback (ref) kernel is chosen (res.fallback;
 * the binding warns once per call site) — or, with policy `strict`, kiln_select fails
 * with KILN_ERR_UNSUPPORTED and a message listing every candidate's reasons.
 *
 * Circuit breaker: kiln_selector_mark_unhealthy excludes a kernel (BACKEND_UNHEALTHY
 * from then on, cached choices dropped); the runtime calls it for a kernel that faulted
 * and rebinds the sites that used it (runtime/kselect.h).
 *
 * Thread safety: kiln_select may be called from any number of threads on one selector
 * (the cache is sharded, each shard under its own lock; health bits are atomic).
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

/* A call site as the kernel tools (`kiln explain`, `kiln tune`) describe it. ctx carries
 * everything but the bucket fields; ctx.tokens_max / ctx.seq_max hold the plan's limits
 * (most tokens per step, context length; 0 = unbounded). */
typedef struct kiln_sel_site {
    char name[64]; /* "blk.3.attn.q" — unique within a plan                        */
    int instr;     /* plan instruction index (explain), -1 = none                  */
    kiln_sel_ctx ctx;
} kiln_sel_site;

#endif /* KILN_KERNELS_SELECT_H */
