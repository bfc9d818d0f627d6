/*
 * prov_cuda.c — the "cuda" provider: kiln's own CUDA kernels (src/kernels/cuda/, one .cu per
 * family) and the cuBLAS prefill matmul, one spec row each. Compiled only in a CUDA build (CMake
 * globs this folder under KILN_CUDA).
 *
 * Availability: a device of compute capability >= 8.0 that the runtime can see
 * (cudaGetDeviceCount / cudaGetDeviceProperties); otherwise the provider is listed as
 * unavailable with the runtime's reason, never an error.
 *
 * Matmul selection: cuda.gemv.matmul (priority 80) serves buckets 1 and 2-8
 * (max_tokens 8; the tensor-core gemv for q8_0/q4_0, and for f16 at 2-8 tokens; the fma
 * gemv otherwise);
 * for f16/q8_0/q4_0 cuda.gemv_tc.matmul (85) the same gemv up to 64 tokens (passes of 8:
 * bench_cuda, device run 15: 8B q4_0 matmuls at t = 4 ran 771 tok/s, cuBLAS at t = 16
 * 303); cuda.cublas.matmul (70) the larger ones; cuda.gemv_any.matmul (30, one gemv in passes of
 * 8 tokens) is the batch-invariant choice for every bucket, for deterministic policies
 * (cuBLAS tiles depend on t).
 * q4_0 / q8_0 weights with k % 128 == 0, and q4_K / q6_K weights (session 9), get rows of
 * their own that ask for the T16 layout
 * (kernels/cuda_t16.h; gemv_t16.cu reads the mma fragments straight from global memory),
 * each one point above its plain counterpart so that every bucket asks for T16 and the
 * binding loads the weight in it: cuda.gemv_t16.matmul (86, up to 64 tokens),
 * cuda.cublas_t16.matmul (71, the cuBLAS path dequantizing T16), cuda.gemv_t16_any.matmul
 * (31, batch invariant at every size). Other shapes keep the plain rows and kernels.
 * Session 10: cuda.gemm_t16.matmul (87, q4_0 / q8_0, up to 64 tokens) sits above them
 * all: the T16 GEMM from 12 tokens (gemm_t16.cu), the T16 gemv below, the same bits either
 * way; above 64 tokens cuBLAS on dequantized T16 stays faster (8B matmuls at 512 tokens:
 * 76 vs 118 ms, session 10 run 2), so cuda.gemm_t16_any.matmul (32, every t, above
 * gemv_t16_any) serves only the batch-invariant policies there.
 * KILN_AVOID=cuda.gemm_t16.matmul,cuda.gemm_t16_any.matmul gives the previous selection.
 * Session 12: cuda.gemm_i8.matmul (88, q4_0 / q8_0, up to 64 tokens; session 19: up to 512,
 * the GEMM to 192 tokens, cuBLAS above) above them: the int8
 * tensor-core GEMM (gemm_i8.cu) from 12 tokens, deterministic but not batch invariant (so
 * the deterministic policy keeps the T16 GEMM / gemv rows); KILN_CUDA_NO_I8=1 (or
 * KILN_AVOID=cuda.gemm_i8.matmul) gives the previous selection.
 * Session 11: f16 weights with k % 128 == 0 get cuda.gemv_f16.matmul (86, up to 64 tokens)
 * and cuda.gemv_f16_any.matmul (31, every size, batch invariant): the T16 gemv's kernel
 * structure on the plain rows (gemv_t16.cu, gemv_f16r_kernel; no repack, so prefill's
 * cuBLAS keeps reading the stored weights); KILN_AVOID=cuda.gemv_f16.matmul,
 * cuda.gemv_f16_any.matmul gives the previous selection (A/B).
 */
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/registry.h"

#include <cuda_runtime_api.h>
#include <stdio.h>

#define F32   KILN_DT(KILN_DTYPE_F32)
#define KV_DT (KILN_DT(KILN_DTYPE_F32) | KILN_DT(KILN_DTYPE_F16))
#define W_DT                                                                                       \
    (KILN_DT_FLOATS | KILN_DT(KILN_DTYPE_Q4_0) | KILN_DT(KILN_DTYPE_Q4_1) |                        \
     KILN_DT(KILN_DTYPE_Q5_0) | KILN_DT(KILN_DTYPE_Q5_1) | KILN_DT(KILN_DTYPE_Q8_0) |              \
     KILN_DT(KILN_DTYPE_Q4_K) | KILN_DT(KILN_DTYPE_Q5_K) | KILN_DT(KILN_DTYPE_Q6_K))
#define ALL_PROPS (KILN_KPROP_DETERMINISTIC | KILN_KPROP_BATCH_INVARIANT | KILN_KPROP_GRAPH_SAFE)
#define ROPE_FEATS                                                                                 \
    (KILN_KFEAT_ROPE_NEOX | KILN_KFEAT_ROPE_YARN | KILN_KFEAT_ROPE_FREQS | KILN_KFEAT_PARTIAL_ROT)
#define ATTN_FEATS                                                                                 \
    (KILN_KFEAT_GQA | KILN_KFEAT_SLIDING_WINDOW | KILN_KFEAT_SOFTCAP | KILN_KFEAT_PAGED_KV |       \
     KILN_KFEAT_CAUSAL)

/* k_multiple 128 below: q4_K / q6_K rows are whole 256-blocks, so k % 256 == 0 holds for them */
#define T16_DT                                                                                     \
    (KILN_DT(KILN_DTYPE_Q8_0) | KILN_DT(KILN_DTYPE_Q4_0) | KILN_DT(KILN_DTYPE_Q4_K) |              \
     KILN_DT(KILN_DTYPE_Q6_K))

#define CUDA_SPEC .provider = "cuda", .platform = KILN_PLATFORM_CUDA, .sm_min = 80

static const kiln_kernel_spec cuda_specs[] = {
    {.id = "cuda.gemv.matmul",
     .op = KILN_KOP_MATMUL,
     CUDA_SPEC,
     .w_dtypes = W_DT,
     .act_dtypes = F32,
     .k_multiple = 32,
     .max_tokens = KILN_CUDA_GEMV_MAX_T,
     .features = KILN_KFEAT_BIAS,
     /* not batch invariant: f16 runs the fma gemv for 1 token, the tensor-core one for 2-8 */
     .props = KILN_KPROP_DETERMINISTIC | KILN_KPROP_GRAPH_SAFE,
     .workspace = kiln_cuda_gemv_workspace,
     .priority = 80,
     .fn.matmul = kiln_cuda_matmul_gemv,
     .summary = "f16/q8_0/q4_0: tensor cores on exact f16 integers, split-f16 x; others: warp "
                "per row, fma; 1-8 tokens per weight pass"},
    {.id = "cuda.gemv_tc.matmul",
     .op = KILN_KOP_MATMUL,
     CUDA_SPEC,
     .w_dtypes = KILN_DT(KILN_DTYPE_F16) | KILN_DT(KILN_DTYPE_Q8_0) | KILN_DT(KILN_DTYPE_Q4_0),
     .act_dtypes = F32,
     .k_multiple = 32,
     .max_tokens = 64,
     .features = KILN_KFEAT_BIAS,
     .props = KILN_KPROP_DETERMINISTIC | KILN_KPROP_GRAPH_SAFE,
     .workspace = kiln_cuda_gemv_workspace,
     .priority = 85,
     .fn.matmul = kiln_cuda_matmul_gemv,
     .summary = "the gemv up to 64 tokens in passes of 8 (tensor cores: 8 tokens cost about "
                "what 1 does): above cuBLAS's split-f16 path, which dequantizes the whole "
                "weight per call, for 9-64 tokens"},
    {.id = "cuda.cublas.matmul",
     .op = KILN_KOP_MATMUL,
     CUDA_SPEC,
     .w_dtypes = W_DT,
     .act_dtypes = F32,
     .k_multiple = 32,
     .good_tokens = 16,
     .features = KILN_KFEAT_BIAS,
     .props = KILN_KPROP_DETERMINISTIC,
     .workspace = kiln_cuda_matmul_cublas_workspace,
     .priority = 70,
     .fn.matmul = kiln_cuda_matmul_cublas,
     .summary = "weights dequantized to f16 + cublasGemmEx (f32 accumulate); f32/bf16: sgemm"},
    {.id = "cuda.gemv_any.matmul",
     .op = KILN_KOP_MATMUL,
     CUDA_SPEC,
     .w_dtypes = W_DT,
     .act_dtypes = F32,
     .k_multiple = 32,
     .features = KILN_KFEAT_BIAS,
     .props = ALL_PROPS,
     .workspace = kiln_cuda_gemv_workspace,
     .priority = 30,
     .fn.matmul = kiln_cuda_matmul_gemv_inv,
     .summary = "the gemv in passes of 8 tokens (batch invariant at any size)"},
    {.id = "cuda.gemv_t16.matmul",
     .op = KILN_KOP_MATMUL,
     CUDA_SPEC,
     .w_dtypes = T16_DT,
     .act_dtypes = F32,
     .k_multiple = 128,
     .max_tokens = 64,
     .features = KILN_KFEAT_BIAS,
     .props = ALL_PROPS,
     .workspace = kiln_cuda_gemv_workspace,
     .priority = 86,
     .w_layout = KILN_WLAYOUT_CUDA_T16,
     .fn.matmul = kiln_cuda_matmul_t16,
     .summary = "q8_0/q4_0/q4_K/q6_K in the T16 layout: mma fragments loaded 16 bytes a lane "
                "from global memory, split-f16 x; passes of 8 tokens"},
    {.id = "cuda.gemm_t16.matmul",
     .op = KILN_KOP_MATMUL,
     CUDA_SPEC,
     .w_dtypes = KILN_DT(KILN_DTYPE_Q8_0) | KILN_DT(KILN_DTYPE_Q4_0),
     .act_dtypes = F32,
     .k_multiple = 128,
     .max_tokens = 64,
     .features = KILN_KFEAT_BIAS,
     .props = ALL_PROPS,
     .workspace = kiln_cuda_gemm_t16_workspace,
     .priority = 87,
     .w_layout = KILN_WLAYOUT_CUDA_T16,
     .fn.matmul = kiln_cuda_matmul_t16_gemm,
     .summary = "q8_0/q4_0 in the T16 layout, 12-64 tokens: tensor-core GEMM reading the "
                "weights once per 16-32 tokens (the T16 gemv below 12), bitwise the gemv's "
                "values"},
    {.id = "cuda.gemm_i8.matmul",
     .op = KILN_KOP_MATMUL,
     CUDA_SPEC,
     .w_dtypes = KILN_DT(KILN_DTYPE_Q8_0) | KILN_DT(KILN_DTYPE_Q4_0),
     .act_dtypes = F32,
     .k_multiple = 128,
     /* buckets 1-512 (below 12 tokens: the T16 GEMM's entry, the gemv; above 192 inside the
      * 65-512 bucket: cuBLAS on the dequantized T16 weights, kiln_cuda_matmul_i8): 8B
      * matmuls of a step at 16 / 64 / 128 tokens 4.56 / 12.03 / 22.7 ms vs the T16 GEMM's
      * 5.37 / 15.1 / 28.3 and cuBLAS's 34.5 at 128; at 512 79.6 vs cuBLAS's 51.1 (q4_0,
      * session 19) */
     .max_tokens = 512,
     .features = KILN_KFEAT_BIAS,
     /* deterministic; not batch invariant (its values are not the T16 gemv's, and its
      * configuration depends on the token count): the deterministic policy keeps the T16
      * GEMM / gemv rows below */
     .props = KILN_KPROP_DETERMINISTIC | KILN_KPROP_GRAPH_SAFE,
     .workspace = kiln_cuda_gemm_i8_workspace,
     .priority = 88,
     .w_layout = KILN_WLAYOUT_CUDA_T16,
     .fn.matmul = kiln_cuda_matmul_i8,
     .summary = "q8_0/q4_0 in the T16 layout, 12-64 tokens: int8 tensor cores (mma m16n8k32) "
                "on the exact quant integers and x in three int8 digits per 32-block (2^-23 "
                "of the block's max), f32 epilogue per block; below 12 tokens the T16 "
                "GEMM's entry (gemv)"},
    {.id = "cuda.cublas_t16.matmul",
     .op = KILN_KOP_MATMUL,
     CUDA_SPEC,
     .w_dtypes = T16_DT,
     .act_dtypes = F32,
     .k_multiple = 128,
     .good_tokens = 16,
     .features = KILN_KFEAT_BIAS,
     .props = KILN_KPROP_DETERMINISTIC,
     .workspace = kiln_cuda_matmul_cublas_workspace,
     .priority = 71,
     .w_layout = KILN_WLAYOUT_CUDA_T16,
     .fn.matmul = kiln_cuda_matmul_cublas,
     .summary = "cuda.cublas.matmul on T16 weights (dequantized from the T16 layout)"},
    {.id = "cuda.gemm_t16_any.matmul",
     .op = KILN_KOP_MATMUL,
     CUDA_SPEC,
     .w_dtypes = KILN_DT(KILN_DTYPE_Q8_0) | KILN_DT(KILN_DTYPE_Q4_0),
     .act_dtypes = F32,
     .k_multiple = 128,
     .features = KILN_KFEAT_BIAS,
     .props = ALL_PROPS,
     .workspace = kiln_cuda_gemm_t16_workspace,
     .priority = 32,
     .w_layout = KILN_WLAYOUT_CUDA_T16,
     .fn.matmul = kiln_cuda_matmul_t16_gemm,
     .summary = "the T16 GEMM at every t (batch invariant: the deterministic policy's choice "
                "above 64 tokens, where cuBLAS is faster but not invariant)"},
    {.id = "cuda.gemv_t16_any.matmul",
     .op = KILN_KOP_MATMUL,
     CUDA_SPEC,
     .w_dtypes = T16_DT,
     .act_dtypes = F32,
     .k_multiple = 128,
     .features = KILN_KFEAT_BIAS,
     .props = ALL_PROPS,
     .workspace = kiln_cuda_gemv_workspace,
     .priority = 31,
     .w_layout = KILN_WLAYOUT_CUDA_T16,
     .fn.matmul = kiln_cuda_matmul_t16,
     .summary = "the T16 gemv in passes of 8 tokens (batch invariant at any size)"},
    {.id = "cuda.gemv_f16.matmul",
     .op = KILN_KOP_MATMUL,
     CUDA_SPEC,
     .w_dtypes = KILN_DT(KILN_DTYPE_F16),
     .act_dtypes = F32,
     .k_multiple = 128,
     .max_tokens = 64,
     .features = KILN_KFEAT_BIAS,
     .props = ALL_PROPS,
     .workspace = kiln_cuda_gemv_workspace,
     .priority = 86,
     .fn.matmul = kiln_cuda_matmul_t16,
     .summary = "f16 rows as stored (16-byte aligned), the T16 gemv's structure: mma fragments "
                "loaded 16 bytes a lane from global memory, split-f16 x fused at one token, one "
                "launch per matmul group; passes of 8 tokens"},
    {.id = "cuda.gemv_f16_any.matmul",
     .op = KILN_KOP_MATMUL,
     CUDA_SPEC,
     .w_dtypes = KILN_DT(KILN_DTYPE_F16),
     .act_dtypes = F32,
     .k_multiple = 128,
     .features = KILN_KFEAT_BIAS,
     .props = ALL_PROPS,
     .workspace = kiln_cuda_gemv_workspace,
     .priority = 31,
     .fn.matmul = kiln_cuda_matmul_t16,
     .summary = "cuda.gemv_f16.matmul in passes of 8 tokens at every size (batch invariant)"},
    {.id = "cuda.embed",
     .op = KILN_KOP_EMBED,
     CUDA_SPEC,
     .w_dtypes = W_DT,
     .act_dtypes = F32,
     .k_multiple = 32,
     .max_tokens = 65535,
     .props = ALL_PROPS,
     .priority = 80,
     .fn.embed = kiln_cuda_embed,
     .summary = "row lookup, dequantized in registers"},
    {.id = "cuda.rms_norm",
     .op = KILN_KOP_RMS_NORM,
     CUDA_SPEC,
     .w_dtypes = F32,
     .act_dtypes = F32,
     .features = KILN_KFEAT_RESIDUAL,
     .props = ALL_PROPS,
     .priority = 80,
     .fn.rms_norm = kiln_cuda_rms_norm,
     .summary = "block per row, f64 sum of squares, fused residual add"},
    {.id = "cuda.rope",
     .op = KILN_KOP_ROPE,
     CUDA_SPEC,
     .act_dtypes = F32,
     .features = ROPE_FEATS,
     .props = ALL_PROPS,
     .priority = 80,
     .fn.rope = kiln_cuda_rope,
     .summary = "ggml angle recurrence, both pairings, YaRN"},
    {.id = "cuda.kv_write",
     .op = KILN_KOP_KV_WRITE,
     CUDA_SPEC,
     .act_dtypes = F32,
     .kv_dtypes = KV_DT,
     .features = KILN_KFEAT_PAGED_KV,
     .props = ALL_PROPS,
     .priority = 80,
     .fn.kv_write = kiln_cuda_kv_write,
     .summary = "block table read in the kernel; f16 or f32 cache"},
    {.id = "cuda.attention",
     .op = KILN_KOP_ATTENTION,
     CUDA_SPEC,
     .act_dtypes = F32,
     .kv_dtypes = KV_DT,
     .head_dim_min = 32,
     .head_dim_max = 256,
     .head_dim_multiple = 32,
     .max_tokens = 65535,
     .features = ATTN_FEATS,
     .props = ALL_PROPS,
     .workspace = kiln_cuda_attention_workspace,
     .priority = 80,
     .fn.attention = kiln_cuda_attention,
     .summary = "paged, varlen, online softmax: block per (head, token), 8 warps split keys; "
                "past 1024 positions a token is split into ranges of 256 (up to 64 blocks, "
                "a KV head's query heads in one; split-K)"},
    {.id = "cuda.flash_attn.attention",
     .op = KILN_KOP_ATTENTION,
     CUDA_SPEC,
     .act_dtypes = F32,
     .kv_dtypes = KV_DT,
     .head_dim_min = 32,
     .head_dim_max = 256,
     .head_dim_multiple = 32,
     .max_tokens = 65535,
     .features = ATTN_FEATS,
     /* deterministic; not batch invariant: steps of few tokens per sequence (decode) and
      * head dims other than 64 / 128 / 256 run cuda.attention's kernel */
     .props = KILN_KPROP_DETERMINISTIC | KILN_KPROP_GRAPH_SAFE,
     .workspace = kiln_cuda_attention_workspace, /* its fallback's split-K */
     .priority = 81,
     .fn.attention = kiln_cuda_attention_flash,
     .summary = "tensor cores (mma.sync, split-f16 Q / P), 16 query rows per warp, key "
                "tiles of 16 in shared memory; >= 16 query tokens per sequence, else "
                "cuda.attention's kernel"},
    {.id = "cuda.glu",
     .op = KILN_KOP_GLU,
     CUDA_SPEC,
     .act_dtypes = F32,
     .features = KILN_KFEAT_GEGLU,
     .max_tokens = 65535,
     .props = ALL_PROPS,
     .priority = 80,
     .fn.glu = kiln_cuda_glu,
     .summary = "elementwise SwiGLU / GeGLU (tanh, erf)"},
    {.id = "cuda.add",
     .op = KILN_KOP_ADD,
     CUDA_SPEC,
     .act_dtypes = F32,
     .max_tokens = 65535,
     .props = ALL_PROPS,
     .priority = 80,
     .fn.add = kiln_cuda_add,
     .summary = "elementwise"},
    {.id = "cuda.matmul_group",
     .op = KILN_KOP_MATMUL_GROUP,
     CUDA_SPEC,
     .w_dtypes = W_DT,
     .act_dtypes = F32,
     .features = KILN_KFEAT_BIAS | KILN_KFEAT_GEGLU,
     .props = ALL_PROPS,
     .workspace = kiln_cuda_gemv_workspace, /* its members' gemv (same k) */
     .priority = 80,
     .fn.matmul_group = kiln_cuda_matmul_group,
     .summary = "T16 members sharing x: one launch per dtype (no split launch at one token); "
                "others: each member's own kernel; then the glu kernel"},
    {.id = "cuda.rope_kv",
     .op = KILN_KOP_ROPE_KV,
     CUDA_SPEC,
     .act_dtypes = F32,
     .kv_dtypes = KV_DT,
     .features = ROPE_FEATS | KILN_KFEAT_PAGED_KV,
     .props = ALL_PROPS,
     .priority = 80,
     .fn.rope_kv = kiln_cuda_rope_kv,
     .summary = "rope q, rope k into the cache, kv write: one launch"},
    {.id = "cuda.matmul_argmax",
     .op = KILN_KOP_MATMUL_ARGMAX,
     CUDA_SPEC,
     .w_dtypes = W_DT,
     .act_dtypes = F32,
     .props = KILN_KPROP_DETERMINISTIC | KILN_KPROP_BATCH_INVARIANT,
     .workspace = kiln_cuda_matmul_argmax_workspace,
     .priority = 80,
     .fn.matmul_argmax = kiln_cuda_matmul_argmax,
     .summary = "logits of 64 rows at a time into scratch, softcap, argmax by 1024 threads"},
    {.id = "cuda.sample",
     .op = KILN_KOP_SAMPLE,
     CUDA_SPEC,
     .act_dtypes = F32,
     .props = ALL_PROPS,
     .workspace = kiln_cuda_sample_workspace,
     .priority = 80,
     .fn.sample = kiln_cuda_sample,
     .summary = "a bound of the row's K-th best key per 8192-logit chunk, a gather of the keys "
                "above it, then a block per row: penalties, top-k by threshold passes, bitonic "
                "sort of <= 4096, top-p / min-p / draw in double (warp 0)"},
};

int kiln_cuda_probe(int *sm, char *why, size_t why_size) {
    int n = 0, usable = 0, first = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why) snprintf(why, why_size, "no CUDA device: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return 0;
    }
    for (int d = 0; d < n; d++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
        if (p.major < 8) continue;
        if (!usable) first = p.major * 10 + p.minor;
        usable++;
    }
    if (!usable) {
        if (why) snprintf(why, why_size, "%d CUDA device(s), none of compute capability >= 8.0", n);
        return 0;
    }
    if (sm) *sm = first;
    return usable;
}

static bool cuda_probe(char *why, size_t why_size) {
    return kiln_cuda_probe(NULL, why, why_size) > 0;
}

const kiln_provider kiln_provider_cuda = {
    .name = "cuda",
    .summary = "kiln's CUDA kernels and the cuBLAS prefill matmul (sm_80+)",
    .specs = cuda_specs,
    .n_specs = (int)(sizeof cuda_specs / sizeof cuda_specs[0]),
    .probe = cuda_probe,
    .fallback = false,
};
