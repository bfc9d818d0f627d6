/*
 * backend.h — backends, adapters, call sites and the dispatch table.
 *
 * A backend has a static adapter table indexed by opcode: one adapter per macro-op,
 * NULL = unsupported, which is a bind-time error (never a per-token check). An
 * adapter runs its op for every token of the step — all sequences at once — by
 * calling kernels through its call sites.
 *
 * A call site is one kernel call inside one bound instruction (the attention of layer
 * 3 has call sites q, k, v, q_norm, k_norm, rope, kv_write, attn, o). When a plan is
 * bound, every call site is described by a kiln_callsite and kiln_bind_callsite()
 * picks a kernel for each tokens-in-step bucket; the chosen function pointers form the
 * dispatch table the adapter reads in the hot loop. kiln_bind_callsite is the single
 * place where kernels are chosen: today it returns the reference kernel; the
 * selection engine (kernels/select.h) plugs in there.
 *
 * Backends ref and cpu share the host adapters below (adapters.c): they differ only in
 * which kernels kiln_bind_callsite picks (cpu: SIMD kernels where valid). A CUDA
 * backend has its own adapter table (device buffers, streams).
 */
#ifndef KILN_RUNTIME_BACKEND_H
#define KILN_RUNTIME_BACKEND_H

#include "kernels/kernel.h"
#include "plan/plan.h"

#include <stdbool.h>
#include <stdint.h>

/* Tokens-in-step buckets: 1, 2-8, 9-64, 65-512, > 512. */
#define KILN_BUCKETS 5
int kiln_bucket_of(int64_t tokens);
/* Largest token count of a bucket (for sizing), INT32_MAX for the last. */
int64_t kiln_bucket_max(int bucket);

/* Features of a call site (bit flags). */
enum {
    KILN_CS_BIAS = 1u << 0,    /* matmul adds a bias                      */
    KILN_CS_GQA = 1u << 1,     /* attention with n_head > n_kv_head        */
    KILN_CS_WINDOW = 1u << 2,  /* sliding-window attention                 */
    KILN_CS_SOFTCAP = 1u << 3, /* attention logit softcap                  */
    KILN_CS_PAGED = 1u << 4,   /* reads/writes the paged KV cache          */
    KILN_CS_CAUSAL = 1u << 5,
    KILN_CS_YARN = 1u << 6,     /* rope with YaRN extrapolation             */
    KILN_CS_FREQ_FAC = 1u << 7, /* rope with per-dim frequency factors      */
};

/* What the selection engine needs to know about one kernel call. */
typedef struct kiln_callsite {
    kiln_kop op;
    char name[64];      /* "blk.3.attention.q" (for explain and errors)         */
    uint32_t w_dtype;   /* weight dtype (matmul, embed); KILN_DTYPE_F32 else    */
    uint32_t kv_dtype;  /* KV cache dtype (kv_write, attention)                 */
    uint32_t act_dtype; /* KILN_DTYPE_F32 (0, exact); with numerics "ggml" the
                           type llama.cpp computes in: a quantized matmul's q8
                           vec_dot type, f16 for attention and glu (ref.h)        */
    int64_t n, k;       /* matmul/embed: outputs and inputs; norms: n = width   */
    int32_t head_dim, n_head, n_kv_head;
    int32_t window;
    uint32_t features; /* KILN_CS_* */
    int32_t bucket;    /* tokens-in-step bucket being bound                    */
} kiln_callsite;

typedef struct kiln_site {
    kiln_callsite desc;
    kiln_kernel_fn fn[KILN_BUCKETS];
    uint32_t layout[KILN_BUCKETS]; /* weight layout each bucket's kernel asks for (spec) */
    int8_t widx;                   /* matmul: index of its weight in kiln_bound_insn.w, else -1 */
} kiln_site;

typedef struct kiln_bound_weight {
    const void *data; /* NULL: slot unused */
    uint32_t dtype;
    uint32_t layout; /* kiln_wlayout of data (0: the file's rows; see bind.c) */
    size_t row_bytes;
    int64_t n, k; /* rows, elements per row */
} kiln_bound_weight;

#define KILN_MAX_SITES 12

/* One instruction bound to weights, decoded params, buffers and kernels. */
typedef struct kiln_bound_insn {
    const kiln_insn *insn;
    kiln_params prm;
    kiln_bound_weight w[KILN_PLAN_MAX_WEIGHTS];
    int32_t phys_in[KILN_PLAN_MAX_IO], phys_out[KILN_PLAN_MAX_IO];
    uint32_t width_in[KILN_PLAN_MAX_IO], width_out[KILN_PLAN_MAX_IO];
    kiln_site site[KILN_MAX_SITES];
    int n_sites;
    int32_t kv_layer; /* attention: cache layer */
} kiln_bound_insn;

struct kiln_exec;
typedef kiln_status (*kiln_adapter_fn)(struct kiln_exec *x, const kiln_bound_insn *bi);

typedef struct kiln_backend {
    const char *name;
    const kiln_adapter_fn *adapters; /* [KILN_OP_LIMIT] */
    bool (*weight_dtype_ok)(uint32_t dtype);
} kiln_backend;

/* "ref" or "cpu" (host backends built in), NULL for an unknown name. */
const kiln_backend *kiln_backend_find(const char *name);

/* The binding function: describes call site `cs` (its bucket set) to the kernel
 * chooser (the selection engine, runtime/kselect.h) and returns the kernel and, in
 * *layout (may be NULL), the weight layout that kernel asks for (kiln_wlayout). Fails
 * with KILN_ERR_UNSUPPORTED when no kernel of the backend can run it. */
kiln_status kiln_bind_callsite(const kiln_backend *be, const kiln_callsite *cs, kiln_kernel_fn *out,
                               uint32_t *layout, kiln_err *err);

#endif /* KILN_RUNTIME_BACKEND_H */
