/*
 * exec.h — binding a plan to a backend and running it (the generic executor).
 *
 * kiln_bind_plan validates the plan against the backend (adapter present for every
 * opcode, weights present with the reference's shape and a dtype the backend computes
 * with, param blocks decoded), binds weights, and builds the dispatch table (one
 * kernel per call site and bucket, via kiln_bind_callsite). After that nothing is
 * chosen or checked per token.
 *
 * kiln_exec_run walks the instructions and calls the backend's adapter for each: no
 * model-family branch, no per-sequence loop. The step's tokens (from any number of
 * sequences) are rows of every register.
 */
#ifndef KILN_RUNTIME_EXEC_H
#define KILN_RUNTIME_EXEC_H

#include "model/model.h"
#include "runtime/backend.h"
#include "runtime/kv.h"

/* Everything an adapter sees of the current step. Every pointer is in the backend's
 * memory (kiln_buf.ptr of DEVICE buffers): adapters never dereference them, they hand
 * them to kernels or to the device's copy functions.
 *
 * Rows: the step's t tokens are rows of every register. The engine orders them decode
 * rows first: rows [0, n_decode) are the single new token of a sequence with cached
 * context (one row per sequence), rows [n_decode, t) the prefill rows (several tokens
 * of one sequence, or its first). Ops that treat rows alike (matmuls, norms, adds) run
 * once over all t rows with the kernel of bucket; attention runs the decode rows and
 * the prefill rows as two calls, each with the kernel bound for its own row count
 * (kiln_bucket_of(n_decode), kiln_bucket_of(t - n_decode)). */
typedef struct kiln_exec {
    kiln_kctx kctx;
    kiln_device *dev;
    int64_t t; /* tokens in the step */
    int bucket;
    int64_t n_decode;
    int cur_site;        /* call site of the kernel being called (circuit breaker) */
    int cur_bucket;      /* the bucket that call used                               */
    int32_t failed_insn; /* instruction whose adapter failed, -1 = none          */
    const int32_t *ids, *tok_seq, *tok_pos; /* [t] (packed inputs, backend memory)   */
    kiln_kv_blocks blocks;                  /* the step's block table                */
    const int32_t *logit_rows;              /* [n_logits] rows that want logits (host) */
    int32_t n_logits;
    float *logits; /* [n_logits][n_vocab] output (backend memory) */
    /* greedy steps: instead of logits, the argmax token of each logits row over
     * [0, greedy_limit) (backend memory); NULL = logits wanted */
    int32_t *greedy_ids;
    int32_t greedy_limit;
    float **bufs; /* physical register buffers */
    size_t *buf_bytes;
    float *work; /* adapter workspace, work_floats */
    size_t work_floats;
    kiln_kv_pool *kv;
    uint64_t *counters; /* [KILN_OP_LIMIT] dispatch counts, or NULL (off) */
    /* KILN_OP_PROFILE (engine.c): [2 * KILN_OP_LIMIT] wall ns then calls per opcode, the
     * device synced before and after each instruction (so launch + run), or NULL (off) */
    uint64_t *op_ns;
    /* tensor parallelism (plan/tp.h, runtime/tp.c): the group and this rank's index in it;
     * NULL on one device. With a vocabulary-sharded LM head, logits is this rank's shard
     * [n_logits][n_vocab / ranks] and gather_logits writes the full rows to logits_full
     * [n_logits][n_vocab] through logits_tmp (same size); both backend memory. */
    struct kiln_comm *comm;
    int comm_rank;
    float *logits_full, *logits_tmp;
} kiln_exec;

typedef struct kiln_bound_plan {
    kiln_plan plan;
    kiln_bound_insn *bi; /* [plan.n_insns] */
    const kiln_backend *be;
    kiln_device *dev;      /* borrowed: the device the plan is bound on */
    size_t work_per_token; /* floats of adapter workspace per token row */
    int32_t n_vocab;
    kiln_arena arena;   /* f32 copies of vector weights stored as f16/bf16 */
    bool ggml_numerics; /* quantized matmuls in llama.cpp's arithmetic (ref.h) */
    uint32_t kv_dtype;  /* the KV pool's dtype the attention sites are bound for */
    int64_t max_tokens; /* largest step (0 = unbounded) */
    /* the weights: the executed load plan owns (or aliases) every byte a kernel reads;
     * wants is the load request binding derived from the chosen kernels; mem describes
     * the tensors that live in memory (computed by a family, or a model from tensors) */
    struct kiln_load_plan *load;
    struct kiln_load_want *wants;
    size_t n_wants;
    struct kiln_tensor_info *mem;
    size_t n_mem;
    struct kiln_load_plan **extra; /* layouts loaded later (circuit breaker) */
    size_t n_extra;
} kiln_bound_plan;

/* How a plan is bound (kiln_bind_opts_default: exact numerics, f32 KV, unbounded). */
typedef struct kiln_bind_opts {
    /* ggml numerics: every call site asks for the activation dtype llama.cpp computes in
     * (kiln_callsite.act_dtype): a quantized matmul its q8 vec_dot type, attention and glu
     * f16; only the ggml-numerics reference kernels (kernels/ref/ref.h) accept those, so
     * they are bound there */
    bool ggml_numerics;
    uint32_t kv_dtype;  /* KILN_DTYPE_F32 or F16: the engine's KV pool dtype */
    int64_t max_tokens; /* the engine's largest step (bucket sizes are clamped to it) */
} kiln_bind_opts;
void kiln_bind_opts_default(kiln_bind_opts *o);

/* Takes ownership of *plan (the caller's copy is cleared, also on failure). On a
 * validation failure returns KILN_ERR_PLAN and fills *chk (may be NULL) with the typed
 * error. The bound plan borrows dev (close it after kiln_bound_plan_free). o may be
 * NULL (the defaults). */
kiln_status kiln_bind_plan_opts(kiln_device *dev, const kiln_model *m, kiln_plan *plan,
                                const kiln_bind_opts *o, kiln_bound_plan *out, kiln_plan_check *chk,
                                kiln_err *err);
kiln_status kiln_bind_plan(kiln_device *dev, const kiln_model *m, kiln_plan *plan,
                           kiln_bound_plan *out, kiln_plan_check *chk, kiln_err *err);
/* The same in its three steps, which the engine runs (kiln_bind_plan_load; kiln_bind_plan
 * and _opts run them with default load knobs) and `kiln inspect --load` stops after the
 * second:
 *   kiln_bind_select       validate, compile, describe every weight and call site and choose
 *                          every kernel; no weight byte is read (bound weights have no data);
 *   kiln_bind_load_plan    the load request of the chosen kernels (per tensor: layout and
 *                          placement: host, or the CUDA device of a device backend) -> the
 *                          load plan (lanes decided, nothing read); base gives the execution
 *                          knobs (io, threads, progress; NULL: defaults);
 *   kiln_bind_execute_load executes the plan (the bound plan takes it over, also on failure)
 *                          and points every bound weight at its bytes (host, or device ptr).
 * kiln_bind_plan_load runs all three; on failure *out is freed. */
struct kiln_load_request;
kiln_status kiln_bind_plan_load(kiln_device *dev, const kiln_model *m, kiln_plan *plan,
                                const kiln_bind_opts *o, const struct kiln_load_request *load,
                                kiln_bound_plan *out, kiln_plan_check *chk, kiln_err *err);
kiln_status kiln_bind_select(kiln_device *dev, const kiln_model *m, kiln_plan *plan,
                             const kiln_bind_opts *o, kiln_bound_plan *out, kiln_plan_check *chk,
                             kiln_err *err);
kiln_status kiln_bind_load_plan(kiln_bound_plan *bp, const kiln_model *m,
                                const struct kiln_load_request *base, struct kiln_load_plan **out,
                                kiln_err *err);
kiln_status kiln_bind_execute_load(kiln_bound_plan *bp, const kiln_model *m,
                                   struct kiln_load_plan *load, kiln_err *err);
/* Points weight (insn, widx) at its bytes in layout wlayout (PLAIN, CPU_R16 or CUDA_T16):
 * a copy the load plans already hold, else a load of just that layout through the loader
 * (never a read of the file behind the plan). The circuit breaker uses it when a weight's
 * replacement kernel reads another layout. KILN_ERR_STATE without a load plan. */
kiln_status kiln_bind_relayout_weight(kiln_bound_plan *bp, int32_t insn, int widx, uint32_t wlayout,
                                      kiln_err *err);
void kiln_bound_plan_free(kiln_bound_plan *bp);

kiln_status kiln_exec_run(const kiln_bound_plan *bp, kiln_exec *x, kiln_err *err);

/* Register view helpers for adapters. */
static inline float *kiln_reg_in(const kiln_exec *x, const kiln_bound_insn *bi, int i) {
    return x->bufs[bi->phys_in[i]];
}
static inline float *kiln_reg_out(const kiln_exec *x, const kiln_bound_insn *bi, int i) {
    return x->bufs[bi->phys_out[i]];
}

/* The adapter table (adapters.c): the one composition of every macro-op over kernel
 * calls, shared by every backend. */
extern const kiln_adapter_fn kiln_adapters[KILN_OP_LIMIT];
/* A residual add and the RMS norm of its sum (the instruction after it) in one norm call
 * (adapters.c); KILN_ERR_UNSUPPORTED when that does not apply (run the two adapters). */
kiln_status kiln_adapter_add_norm(kiln_exec *x, const kiln_bound_insn *add,
                                  const kiln_bound_insn *norm);
/* Tests and A/B runs: the fusion on (default; KILN_ADD_NORM=0 in the environment turns it
 * off) or off for the whole process, and how many pairs ran fused since it started
 * (process-wide singletons). */
void kiln_adapter_add_norm_enable(int on);
uint64_t kiln_adapter_add_norm_count(void);
/* Call-site indexes of the adapters. */
enum {
    KILN_SITE_EMBED = 0,
    KILN_SITE_NORM = 0,
    KILN_SITE_ADD = 0,
    KILN_SITE_LM_HEAD = 0,
    KILN_SITE_Q = 0,
    KILN_SITE_K,
    KILN_SITE_V,
    KILN_SITE_Q_NORM,
    KILN_SITE_K_NORM,
    KILN_SITE_ROPE,
    KILN_SITE_KV_WRITE,
    KILN_SITE_ATTN,
    KILN_SITE_O,
    KILN_SITE_QKV,     /* matmul_group of q, k, v (members: the Q, K, V sites' kernels) */
    KILN_SITE_ROPE_KV, /* rope(q), rope(k), kv_write in one kernel                     */
    KILN_SITE_ATT_COUNT,
    KILN_SITE_GATE = 0,
    KILN_SITE_UP,
    KILN_SITE_GLU,
    KILN_SITE_DOWN,
    KILN_SITE_GATE_UP, /* matmul_group of gate, up (+ the GLU site's kernel)           */
    KILN_SITE_FFN_COUNT,
    KILN_SITE_LM_ARGMAX = 1, /* the LM head for greedy steps (matmul_argmax)            */
};

#endif /* KILN_RUNTIME_EXEC_H */
