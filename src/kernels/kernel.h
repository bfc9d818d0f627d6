/*
 * kernel.h — the kernel ABI: what every kernel of an op takes, whoever provides it
 * (ref, cpu SIMD, CUDA, OpenBLAS, oneDNN, cuBLAS).
 *
 * Adapters (src/runtime/) compose kernels into the macro-ops of the plan: e.g. the
 * attention adapter calls matmul (q, k, v), rope, kv_write, attention, matmul (o). Each
 * of those calls is a *call site*; the selection engine (src/kernels/select.h) picks one
 * kernel per call site and shape bucket when a plan is bound, and the adapter calls the
 * chosen function pointer. Nothing here knows about models.
 *
 * Conventions:
 *  - Activations are f32, row-major, one row per token: x[t * x_stride + i].
 *  - Weights are rows of `n` outputs by `k` inputs in their stored dtype (ggml block
 *    layout for quantized types: each row is k / block_size blocks), row stride
 *    w_row_bytes. A kernel may ask the loader for another layout (w_layout != 0,
 *    declared in its spec); then w points to that repacked layout.
 *  - Every pointer in an argument struct is in the memory of the backend the kernel
 *    belongs to (host memory for ref/cpu, device memory for CUDA): activations, weights,
 *    the KV pool and the step's packed inputs (token ids, positions, block table) all
 *    come from the backend's buffer interface (runtime/backend.h).
 *  - The KV cache is paged: blocks of KILN_KV_BLOCK tokens. The step's block table is one
 *    packed [n_seqs][stride] array of physical block ids (kiln_kv_blocks): row s maps
 *    logical block i (positions [16 i, 16 i + 16)) of the step's s-th sequence.
 *  - Kernels are deterministic for a given kernel and thread count unless their spec
 *    says otherwise; batch-invariant kernels compute each token's row independently of
 *    the other rows in the call.
 *  - A kernel returns KILN_OK or a status, and may write a message into c->err (use
 *    kiln_kerr; only from the calling thread, never from pool workers). Statuses say
 *    whose fault a failure is (the circuit breaker in runtime/kselect.h acts on it):
 *      KILN_ERR_DEVICE    a device / driver call failed (a CUDA error string goes into
 *                         the message): a fault of the kernel on this device;
 *      KILN_ERR_INTERNAL  the kernel detected an invalid result of its own (NaN where
 *                         none can be, a failed self-check): a fault of the kernel;
 *      anything else      not the kernel's fault: KILN_ERR_NOMEM (transient), RANGE
 *                         (input outside what the step promised), UNSUPPORTED (args
 *                         the kernel cannot take: a binding bug). The kernel stays.
 *    Argument shapes are validated at plan-bind time, not per call.
 */
#ifndef KILN_KERNELS_KERNEL_H
#define KILN_KERNELS_KERNEL_H

#include "base/pool.h"
#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KILN_KV_BLOCK 16

/* Kernel-level ops (call-site kinds). Keep kiln_kop_name() in sync. */
typedef enum kiln_kop {
    KILN_KOP_MATMUL = 0,    /* y[t, n] = sum_k x[t, k] * W[n, k] (+ bias[n])          */
    KILN_KOP_EMBED,         /* y[t, :] = W[ids[t], :] * scale                          */
    KILN_KOP_RMS_NORM,      /* y = (x (+ r)) * rsqrt(mean((x (+ r))^2) + eps) * (w + w_offset) */
    KILN_KOP_ROPE,          /* rotate q/k head vectors in place by position            */
    KILN_KOP_KV_WRITE,      /* store k, v rows of the step into the paged cache        */
    KILN_KOP_ATTENTION,     /* softmax(q K^T * scale (softcap)) V over the paged cache */
    KILN_KOP_GLU,           /* y = act(gate) * up  (SwiGLU / GeGLU)                    */
    KILN_KOP_ADD,           /* y = a + b                                               */
    KILN_KOP_MATMUL_GROUP,  /* several matmuls over the same x in one call (q/k/v, gate/up) */
    KILN_KOP_ROPE_KV,       /* rope(q), rope(k) and the k, v write into the paged cache   */
    KILN_KOP_MATMUL_ARGMAX, /* LM head + greedy pick: argmax_n (x W^T) without the logits */
    KILN_KOP_SAMPLE,        /* the sampling chain over logits rows -> token ids (no weights) */
    KILN_KOP_COUNT
} kiln_kop;

const char *kiln_kop_name(kiln_kop op);

/* Per-call context handed to every kernel (kernels take it as const; err points to
 * the caller's error context, which a failing kernel may fill). */
typedef struct kiln_kctx {
    kiln_pool *pool; /* host thread pool (NULL: single-threaded)              */
    void *scratch;   /* workspace of at least the spec's workspace bytes (in the
                        backend's memory: device memory on CUDA)              */
    size_t scratch_size;
    void *stream;  /* the step's queue (cudaStream_t on CUDA), NULL on the host */
    void *dev;     /* the backend's device state (kiln_device.impl), NULL on host */
    kiln_err *err; /* where a failing kernel writes its message, or NULL      */
} kiln_kctx;

/* A kernel's failure: sets c->err (when there is one) to the message and returns code. */
kiln_status kiln_kerr(const kiln_kctx *c, kiln_status code, const char *fmt, ...) KILN_PRINTF(3, 4);

/* ---- matmul ---- */
typedef struct kiln_matmul_args {
    const void *w;      /* [n][k] in w_dtype (layout w_layout)                   */
    uint32_t w_dtype;   /* kiln_dtype                                           */
    uint32_t w_layout;  /* 0: plain ggml rows; others: kernel-specific repacks   */
    size_t w_row_bytes; /* bytes per row of n (plain layout)                     */
    int64_t n, k;
    const float *x; /* [t][k], row stride x_stride (floats)                  */
    int64_t x_stride;
    float *y; /* [t][n], row stride y_stride                           */
    int64_t y_stride;
    int64_t t;         /* tokens (rows of x)                                    */
    const float *bias; /* [n] or NULL                                           */
} kiln_matmul_args;

/* ---- embedding lookup ---- */
typedef struct kiln_embed_args {
    const void *w; /* [n_vocab][dim] in w_dtype                             */
    uint32_t w_dtype;
    size_t w_row_bytes;
    int64_t n_vocab, dim;
    const int32_t *ids; /* [t], validated < n_vocab by the engine                */
    int64_t t;
    float *y; /* [t][dim], row stride y_stride                         */
    int64_t y_stride;
    float scale; /* 1, or sqrt(dim) for Gemma                             */
    /* a vocabulary shard (tensor parallelism): w holds the rows of ids [id_base,
     * id_base + n_vocab); ids outside give zero rows. Without shard every id must be
     * in [0, n_vocab). */
    bool shard;
    int64_t id_base;
} kiln_embed_args;

/* ---- RMS norm (optionally fused with a residual add) ----
 * For each of `rows` rows of length n: if r != NULL, the sum u = x[row] + r[row] first,
 * written to s[row] when s != NULL (x is then left as it is: a residual add whose sum has
 * a buffer of its own, fused with the norm of that sum), else to x[row] in place (the
 * residual stream keeps the sum); without r, u = x[row]. Then
 * y[row] = u / sqrt(mean(u^2) + eps) * (w + w_offset). y may equal x; s must not alias
 * x, r or y. Every rms_norm kernel implements r and s (KILN_KFEAT_RESIDUAL). With w2 set,
 * rows from w2_row on take w2 as their weights instead of w (the per-head q and k norms of
 * one token block in one call: k's rows follow q's). */
typedef struct kiln_rms_norm_args {
    float *x;
    const float *r; /* residual to add first, or NULL                        */
    float *s;       /* where x + r goes (with r), or NULL: into x in place   */
    float *y;
    const float *w;  /* [n] f32 weights, or NULL for no weights               */
    float w_offset;  /* 0, or 1 for Gemma checkpoints that store w - 1        */
    const float *w2; /* [n] f32 weights of rows >= w2_row, or NULL           */
    int64_t w2_row;
    int64_t rows, n;
    int64_t x_stride, r_stride, y_stride, s_stride;
    float eps;
} kiln_rms_norm_args;

typedef enum kiln_rope_mode {
    KILN_ROPE_NORM = 0, /* pairs (2i, 2i+1): llama GGUF layout               */
    KILN_ROPE_NEOX = 1, /* pairs (i, i + rot/2): HF / gemma / qwen layout    */
} kiln_rope_mode;

/* ---- RoPE, in place on `rows` tokens of n_head head vectors of head_dim ----
 * theta_i = pos * base^(-2i/n_rot) / freq_factors[i] (freq_factors may be NULL), with
 * optional YaRN (ext_factor != 0) exactly as ggml's rope. Only the first n_rot dims of
 * each head rotate. */
typedef struct kiln_rope_args {
    float *x; /* [rows][x_stride], heads at x + h * head_dim           */
    int64_t rows, x_stride;
    int32_t n_head, head_dim, n_rot;
    const int32_t *pos; /* [rows] positions                                      */
    kiln_rope_mode mode;
    float base;                /* rope theta                                            */
    float freq_scale;          /* 1 / linear scaling factor                             */
    const float *freq_factors; /* [n_rot / 2] or NULL (llama3 scaling)            */
    float ext_factor, attn_factor, beta_fast, beta_slow; /* YaRN; ext_factor 0 = off */
    int32_t n_ctx_orig;
} kiln_rope_args;

/* ---- paged KV cache (one layer) ----
 * Element (block b, slot s in [0, 16), kv head h, dim d) of K is at
 *   k + b * block_bytes + ((s * n_kv_head + h) * head_dim + d) * elt_size
 * and likewise for V. dtype is KILN_DTYPE_F16 or KILN_DTYPE_F32. */
typedef struct kiln_kv_layer {
    void *k, *v;
    uint32_t dtype;
    int32_t n_kv_head, head_dim;
    size_t block_bytes;
} kiln_kv_layer;

/* The step's block table, packed (built once per step by the engine, in a buffer of
 * the backend's memory; one copy to a device). Row s is the step's s-th sequence
 * (tok_seq[t] == s): table[s * stride + i] is the physical block of its positions
 * [16 i, 16 i + 16). seq_len[s] is the sequence's context length after the step's
 * writes: positions < seq_len[s] are valid, blocks < ceil(seq_len[s] / 16) mapped
 * (entries past them are -1). */
typedef struct kiln_kv_blocks {
    const int32_t *table;   /* [n_seqs][stride] physical block ids                   */
    const int32_t *seq_len; /* [n_seqs]                                              */
    int32_t n_seqs, stride;
} kiln_kv_blocks;

typedef struct kiln_kv_write_args {
    kiln_kv_layer kv;
    const float *k, *v; /* [t][n_kv_head * head_dim], strides k_stride, v_stride */
    int64_t k_stride, v_stride, t;
    const int32_t *tok_seq; /* [t] row of the block table                            */
    const int32_t *tok_pos; /* [t] position                                          */
    kiln_kv_blocks blocks;
} kiln_kv_write_args;

/* ---- attention over the paged cache ----
 * Token i (of block-table row tok_seq[i], at position tok_pos[i]) attends to the cached
 * positions p with p <= tok_pos[i] and, when window > 0, p > tok_pos[i] - window.
 * Scores are dot(q, k) * scale, then softcap * tanh(s / softcap) when softcap > 0.
 * Query head h reads KV head h / (n_head / n_kv_head) (GQA). Every KV entry a token
 * attends to was written before the call (kv_write of the same step comes first). */
typedef struct kiln_attention_args {
    kiln_kv_layer kv;
    const float *q; /* [t][n_head * head_dim], stride q_stride               */
    int64_t q_stride;
    float *out; /* [t][n_head * head_dim], stride out_stride             */
    int64_t out_stride, t;
    int32_t n_head;
    const int32_t *tok_seq, *tok_pos;
    kiln_kv_blocks blocks;
    float scale, softcap;
    int32_t window; /* 0: full causal                                        */
} kiln_attention_args;

typedef enum kiln_glu_act {
    KILN_GLU_SWIGLU = 0, /* silu(gate) * up                          */
    KILN_GLU_GEGLU_TANH, /* gelu_tanh(gate) * up (Gemma)             */
    KILN_GLU_GEGLU_ERF,  /* gelu_erf(gate) * up                      */
} kiln_glu_act;

/* ---- gated activation: y[t, i] = act(gate[t, i]) * up[t, i], i < n ---- */
typedef struct kiln_glu_args {
    const float *gate, *up;
    float *y;
    int64_t t, n, gate_stride, up_stride, y_stride;
    kiln_glu_act act;
} kiln_glu_args;

/* ---- y = a + b over t rows of n ---- */
typedef struct kiln_add_args {
    const float *a, *b;
    float *y;
    int64_t t, n, a_stride, b_stride, y_stride;
} kiln_add_args;

/* ---- fused kernels (the fused ops of the issue: fewer passes and pool dispatches) ---- */

/* A grouped matmul: n members y_m = x W_m^T over the same x and t (each member's x, t
 * are equal; w, dtype, layout, n, y, bias are its own). fn[m] is the kernel chosen for
 * member m's own call site: a group kernel computes in one pass (activations quantized
 * once, the rows of all members handed out in one pool dispatch) the members whose
 * kernel it can reproduce exactly, and calls fn[m] for the others, so the result is
 * always what the separate calls would give.
 * glu (optional, glu_fn != NULL, n == 2, member 0 the gate and member 1 the up
 * projection of equal n): afterwards glu_y[t, i] = act(gate[t, i]) * up[t, i], as
 * glu_fn would compute it (a fusing kernel applies it to each row chunk right after
 * computing it; glu_y may alias up's y). */
#define KILN_MATMUL_GROUP_MAX 4
typedef kiln_status (*kiln_matmul_fn)(const kiln_kctx *c, const kiln_matmul_args *a);
typedef kiln_status (*kiln_glu_fn)(const kiln_kctx *c, const kiln_glu_args *a);
typedef struct kiln_matmul_group_args {
    int n;
    kiln_matmul_args m[KILN_MATMUL_GROUP_MAX];
    kiln_matmul_fn fn[KILN_MATMUL_GROUP_MAX];
    kiln_glu_fn glu_fn; /* NULL: no activation                                 */
    kiln_glu_act act;
    float *glu_y;
    int64_t glu_y_stride;
} kiln_matmul_group_args;

/* RoPE of q and k (rope semantics: q rotated in place) fused with the kv_write of the
 * rotated k and of v (kv_write semantics). rope.x / x_stride / n_head describe q;
 * k / k_stride / n_kv_head = kv.n_kv_head describe k, whose contents are unspecified
 * afterwards (a kernel may rotate it in place or write the rotation straight into the
 * cache); v and rows = kv.t are read only. rope.rows == kv.t, rope.pos == kv.tok_pos. */
typedef struct kiln_rope_kv_args {
    kiln_rope_args rope; /* q                                                    */
    kiln_kv_write_args kv;
} kiln_rope_kv_args;

/* The LM head for greedy sampling: for each of t rows, ids[t] = the lowest i < n_limit
 * maximizing f(y[t, i]), y = the logits fn would compute for mm, f(v) = softcap
 * tanh(v / softcap) when softcap > 0, else v (the same f32 expressions as the matmul +
 * softcap it replaces); i with f = NaN or -inf is never picked; -1 when none is left.
 * vals[t] (optional) gets f of the winner. A fusing kernel never stores the logits (it
 * reduces each row chunk as it is computed) when it can reproduce fn; otherwise it
 * calls fn into a temporary. mm.y / y_stride are ignored. */
typedef struct kiln_matmul_argmax_args {
    kiln_matmul_args mm;
    kiln_matmul_fn fn; /* the LM head's matmul kernel (NULL: the reference)    */
    int64_t n_limit;   /* rows considered: [0, n_limit), n_limit <= mm.n          */
    float softcap;
    int32_t *ids; /* [t]                                                      */
    float *vals;  /* [t] or NULL                                              */
} kiln_matmul_argmax_args;

/* Sampling of t logits rows, one token id per row: the chain of src/sample/sample.h
 * (docs/SAMPLING.md) on the sorted-candidate path of its CPU implementation, so that a
 * row gives the CPU chain's token for the same uniform draw u:
 *   f(v) = softcap tanh(v / softcap) when softcap > 0, else v (the final softcap);
 *   overrides: for each of the row's n_ov entries (ids sorted, distinct, < n)
 *     l = f(logits[id]) + bias; if count > 0: l = l <= 0 ? l * repeat_penalty
 *     : l / repeat_penalty, then l -= count * frequency_penalty + presence_penalty
 *     (float, in this order; bias 0 for window-only tokens);
 *   candidates: the k best of the effective logits (k = top_k when 0 < top_k < n, else
 *     n; NaN / -inf never; larger logit first, ties to the lower id); temperature <= 0:
 *     k = 1 and the result is that token (u unused);
 *   top-p (top_p < 1, more than one candidate): the shortest prefix whose cumulative
 *     sum of exp((double)l - max) (1 for the max itself) reaches top_p * their total;
 *   min-p (min_p > 0): keeps l >= max + log_min_p (log_min_p = logf(min_p), computed
 *     by the caller so both chains use the same float), the max always;
 *   draw: w_i = exp(((double)l_i - max) / temperature) (1 for the max), the first
 *     candidate whose cumulative weight exceeds u * sum (the last one otherwise).
 * -1 when no logit is alive. Kernels may restrict k + 2 n_ov (the CUDA one: <= 4096;
 * KILN_ERR_INVALID_ARG above). Every pointer is in the backend's memory. */
#define KILN_SAMPLE_MAX_CAND 4096
typedef struct kiln_sample_row_params {
    double u; /* uniform draw in [0, 1) */
    float temperature, top_p, min_p, log_min_p;
    float repeat_penalty, frequency_penalty, presence_penalty;
    int32_t top_k;
    int32_t ov_off, n_ov; /* the row's overrides: [ov_off, ov_off + n_ov) of ov_* */
    int32_t pad_;
} kiln_sample_row_params;
typedef struct kiln_sample_args {
    const float *logits; /* [t][ld] */
    int64_t ld, t, n;    /* row stride, rows, candidates per row (ids [0, n), n <= ld) */
    float softcap;
    const kiln_sample_row_params *rows; /* [t] */
    const int32_t *ov_id;               /* overrides of all rows */
    const float *ov_bias;
    const int32_t *ov_count;
    int32_t *ids; /* [t] out */
} kiln_sample_args;

typedef kiln_status (*kiln_embed_fn)(const kiln_kctx *c, const kiln_embed_args *a);
typedef kiln_status (*kiln_rms_norm_fn)(const kiln_kctx *c, const kiln_rms_norm_args *a);
typedef kiln_status (*kiln_rope_fn)(const kiln_kctx *c, const kiln_rope_args *a);
typedef kiln_status (*kiln_kv_write_fn)(const kiln_kctx *c, const kiln_kv_write_args *a);
typedef kiln_status (*kiln_attention_fn)(const kiln_kctx *c, const kiln_attention_args *a);
typedef kiln_status (*kiln_add_fn)(const kiln_kctx *c, const kiln_add_args *a);
typedef kiln_status (*kiln_matmul_group_fn)(const kiln_kctx *c, const kiln_matmul_group_args *a);
typedef kiln_status (*kiln_rope_kv_fn)(const kiln_kctx *c, const kiln_rope_kv_args *a);
typedef kiln_status (*kiln_matmul_argmax_fn)(const kiln_kctx *c, const kiln_matmul_argmax_args *a);
typedef kiln_status (*kiln_sample_fn)(const kiln_kctx *c, const kiln_sample_args *a);

/* A kernel's entry point, typed by its op. */
typedef union kiln_kernel_fn {
    kiln_matmul_fn matmul;
    kiln_embed_fn embed;
    kiln_rms_norm_fn rms_norm;
    kiln_rope_fn rope;
    kiln_kv_write_fn kv_write;
    kiln_attention_fn attention;
    kiln_glu_fn glu;
    kiln_add_fn add;
    kiln_matmul_group_fn matmul_group;
    kiln_rope_kv_fn rope_kv;
    kiln_matmul_argmax_fn matmul_argmax;
    kiln_sample_fn sample;
    void (*any)(void);
} kiln_kernel_fn;

#endif /* KILN_KERNELS_KERNEL_H */
