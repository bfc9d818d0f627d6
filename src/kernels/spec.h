/*
 * spec.h — what a kernel declares about itself: the kernel spec.
 *
 * Every kernel kiln can run (ref, own SIMD, own CUDA, OpenBLAS, oneDNN, cuBLAS) is
 * described by one kiln_kernel_spec in a static table of its provider (registry.h).
 * The selection engine (select.h) never calls a kernel to find out whether it fits: it
 * compares the spec with the call site's context (kiln_sel_ctx) and records, for every
 * constraint that fails, a structured reason code.
 *
 * How to write a spec (src/kernels/prov_ref.c and prov_cpu.c have complete tables):
 *
 *   { .id = "cpu.avx512.matmul",           // provider.variant.op[.detail], unique
 *     .op = KILN_KOP_MATMUL, .provider = "cpu", .platform = KILN_PLATFORM_HOST,
 *     .isa = KILN_ISA_AVX512F | KILN_ISA_AVX512BW,
 *     .w_dtypes = KILN_DT(KILN_DTYPE_Q4_K), .act_dtypes = KILN_DT(KILN_DTYPE_F32),
 *     .k_multiple = 32,
 *     .features = KILN_KFEAT_BIAS,
 *     .props = KILN_KPROP_DETERMINISTIC,
 *     .priority = 90, .fn.matmul = kiln_cpu_matmul_avx512 }
 *
 * Zero means "no constraint" for every limit field (isa, sm_min, sm_max, head_dim_*,
 * max_tokens, max_seq, *_multiple) and "none supported" for every set (dtype masks,
 * features, props). So a spec that forgets a dtype mask supports no dtype: it fails
 * closed, never open.
 *
 * Specs are immutable and live for the whole process (static tables). The registry
 * keeps an effective copy of each, narrowed by the provider's capabilities descriptor
 * when one is installed (registry.h).
 */
#ifndef KILN_KERNELS_SPEC_H
#define KILN_KERNELS_SPEC_H

#include "base/cpu.h"
#include "format/dtype.h"
#include "kernels/kernel.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where a kernel's data lives. */
typedef enum kiln_platform {
    KILN_PLATFORM_HOST = 0, /* host memory, runs on CPU threads     */
    KILN_PLATFORM_CUDA = 1, /* device memory, launched on a stream   */
    KILN_PLATFORM_COUNT
} kiln_platform;

/* Backends a plan can be bound to (src/runtime/). ref and cpu are host backends. */
typedef enum kiln_backend_id {
    KILN_BACKEND_REF = 0,
    KILN_BACKEND_CPU = 1,
    KILN_BACKEND_CUDA = 2,
    KILN_BACKEND_COUNT
} kiln_backend_id;

#define KILN_BACKEND_BIT(b) (1u << (b))

const char *kiln_backend_name(kiln_backend_id b); /* "ref", "cpu", "cuda", or "unknown" */
bool kiln_backend_from_name(const char *name, kiln_backend_id *out);
kiln_platform kiln_backend_platform(kiln_backend_id b);
const char *kiln_platform_name(kiln_platform p);
bool kiln_kop_from_name(const char *name, kiln_kop *out);

/* A set of kiln_dtype ids (ids are < 64). */
#define KILN_DT(d) (1ull << (d))
/* Every plain float weight type. */
#define KILN_DT_FLOATS                                                                             \
    (KILN_DT(KILN_DTYPE_F32) | KILN_DT(KILN_DTYPE_F16) | KILN_DT(KILN_DTYPE_BF16))
/* Every block-quantized type kiln computes with (kiln_dtype_info.supported). */
#define KILN_DT_QUANTS                                                                             \
    (KILN_DT(KILN_DTYPE_Q4_0) | KILN_DT(KILN_DTYPE_Q4_1) | KILN_DT(KILN_DTYPE_Q5_0) |              \
     KILN_DT(KILN_DTYPE_Q5_1) | KILN_DT(KILN_DTYPE_Q8_0) | KILN_DT(KILN_DTYPE_Q2_K) |              \
     KILN_DT(KILN_DTYPE_Q3_K) | KILN_DT(KILN_DTYPE_Q4_K) | KILN_DT(KILN_DTYPE_Q5_K) |              \
     KILN_DT(KILN_DTYPE_Q6_K) | KILN_DT(KILN_DTYPE_Q8_K))
/* "no dtype" in a context: the op has no weight (or no KV). */
#define KILN_DTYPE_NONE 0xffu

/* Features a call site may need; a kernel lists those it implements. */
typedef enum kiln_kfeat {
    KILN_KFEAT_GQA = 1u << 0,            /* attention: n_head != n_kv_head          */
    KILN_KFEAT_SLIDING_WINDOW = 1u << 1, /* attention: window > 0                   */
    KILN_KFEAT_SOFTCAP = 1u << 2,        /* attention: logit softcap                */
    KILN_KFEAT_PAGED_KV = 1u << 3,       /* attention/kv_write: paged block tables  */
    KILN_KFEAT_CAUSAL = 1u << 4,         /* attention: causal mask                  */
    KILN_KFEAT_BIAS = 1u << 5,           /* matmul: bias add                        */
    KILN_KFEAT_RESIDUAL = 1u << 6,       /* rms_norm: fused residual add            */
    KILN_KFEAT_ROPE_NEOX = 1u << 7,      /* rope: NEOX pairing                      */
    KILN_KFEAT_ROPE_YARN = 1u << 8,      /* rope: YaRN extension                    */
    KILN_KFEAT_ROPE_FREQS = 1u << 9,     /* rope: per-dim frequency factors         */
    KILN_KFEAT_PARTIAL_ROT = 1u << 10,   /* rope: n_rot < head_dim                  */
    KILN_KFEAT_GEGLU = 1u << 11,         /* glu: GeGLU activations (tanh and erf)   */
} kiln_kfeat;
#define KILN_KFEAT_COUNT 12
/* Name of one feature bit ("gqa", "sliding_window", ...), or NULL. */
const char *kiln_kfeat_name(uint32_t bit);
bool kiln_kfeat_from_name(const char *name, uint32_t *bit);

/* Execution properties a kernel guarantees. */
typedef enum kiln_kprop {
    KILN_KPROP_DETERMINISTIC = 1u << 0,   /* same inputs + thread count -> same bits  */
    KILN_KPROP_BATCH_INVARIANT = 1u << 1, /* a row's result does not depend on the others */
    KILN_KPROP_GRAPH_SAFE = 1u << 2,      /* no alloc/sync: may be captured in a CUDA graph */
} kiln_kprop;
#define KILN_KPROP_COUNT 3
const char *kiln_kprop_name(uint32_t bit);
bool kiln_kprop_from_name(const char *name, uint32_t *bit);

struct kiln_sel_ctx; /* select.h */

/* Workspace a kernel needs for a context (bytes, handed in kiln_kctx.scratch).
 * Must be cheap and pure. NULL in a spec means 0. */
typedef size_t (*kiln_workspace_fn)(const struct kiln_sel_ctx *ctx);

/* Weight layouts a kernel may ask the loader for (kiln_matmul_args.w_layout). */
typedef enum kiln_wlayout {
    KILN_WLAYOUT_PLAIN = 0,    /* the file's rows as stored                                  */
    KILN_WLAYOUT_F32 = 1,      /* rows converted to f32 at load (f16/bf16 -> f32; for sgemm) */
    KILN_WLAYOUT_CPU_R16 = 2,  /* 16-row interleaved quant blocks (src/kernels/cpu/cpu_kernels.h) */
    KILN_WLAYOUT_CUDA_T16 = 3, /* 16-row tiles in mma fragment order (src/kernels/cuda_t16.h) */
    /* 4..15: reserved for kiln's own repacks (interleaved quant blocks, ...) */
} kiln_wlayout;

typedef struct kiln_kernel_spec {
    const char *id;       /* unique, "provider.variant.op.dtype"; stable (PerfDB key) */
    kiln_kop op;          /* which kernel op (kernel.h) it implements             */
    const char *provider; /* "ref", "cpu", "openblas", "onednn", "cuda", "cublas" */
    kiln_platform platform;
    uint32_t backends; /* KILN_BACKEND_BIT mask; 0 = every backend of the platform  */

    /* hardware */
    uint32_t isa;   /* kiln_isa bits required (host kernels)                   */
    int32_t sm_min; /* CUDA compute capability x10 (80 = sm_80), 0 = any       */
    int32_t sm_max; /* highest compute capability supported, 0 = no bound     */

    /* dtypes (KILN_DT masks) */
    uint64_t w_dtypes;   /* weight dtypes; ops without weights: ignored           */
    uint64_t act_dtypes; /* activation dtypes (f32 today)                         */
    uint64_t kv_dtypes;  /* KV cache dtypes (kv_write, attention)                 */

    /* shape limits (0 = none) */
    int32_t head_dim_min, head_dim_max, head_dim_multiple;
    int64_t max_tokens;  /* most tokens (rows) in one call                         */
    int64_t max_seq;     /* longest attended context (attention)                   */
    int32_t max_gqa;     /* most query heads per KV head (attention); 0 = any       */
    int32_t k_multiple;  /* matmul/embed inner size k (or row size n) alignment    */
    int32_t n_multiple;  /* matmul output size n alignment                         */
    int64_t good_tokens; /* performance hint: below this many tokens per call the
                            kernel is slow (e.g. dequant + sgemm); scoring penalty  */

    uint32_t features; /* kiln_kfeat bits implemented                              */
    uint32_t props;    /* kiln_kprop bits guaranteed                                */
    kiln_workspace_fn workspace;
    int32_t priority;    /* 0..100: static preference among valid kernels             */
    uint32_t w_layout;   /* kiln_wlayout the kernel wants its weights in              */
    kiln_kernel_fn fn;   /* the entry point; NULL = not built in this binary          */
    const char *summary; /* one line for `kiln kernels`                             */
} kiln_kernel_spec;

#endif /* KILN_KERNELS_SPEC_H */
