/*
 * cuda_kernels.h — kiln's own CUDA kernels (src/kernels/cuda/, one .cu file per family) and the
 * cuBLAS prefill matmul, as kernel-ABI entry points (kernels/kernel.h) callable from C.
 *
 * Every pointer in the args (weights, activations, ids, positions, the packed block table and
 * seq_len of kiln_kv_blocks, the KV cache) is DEVICE memory; kctx->stream is the
 * cudaStream_t the kernel is launched on (NULL: the legacy default stream) and
 * kctx->scratch is device memory of at least the spec's workspace bytes. The entry
 * points only enqueue work: they never synchronize, never allocate, and return
 * KILN_ERR_DEVICE when a launch (or cuBLAS) reports an error, KILN_ERR_INVALID_ARG for a
 * shape they do not support (argument shapes are validated at bind; this is a guard),
 * KILN_ERR_NOMEM when the scratch handed in is too small. Out-of-range ids / positions
 * are skipped in the kernel (the engine validates them), never a fault.
 *
 * Numerics: f32 accumulation everywhere; rms_norm sums squares in f64 (as the ref);
 * softmax online in f32; the prefill matmul rounds weights and activations to f16
 * (cuBLAS, f32 accumulation) — f32 weights stay f32 (sgemm) and bf16 weights go through
 * f32 (bf16 -> f16 would lose range). See docs/CUDA.md.
 */
#ifndef KILN_KERNELS_CUDA_KERNELS_H
#define KILN_KERNELS_CUDA_KERNELS_H

#include "kernels/kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kiln_sel_ctx;

/* matmul.cu: GEMV / small-batch matmul, t <= KILN_CUDA_GEMV_MAX_T tokens per weight
 * pass (more tokens: repeated passes), weights dequantized in registers. */
#define KILN_CUDA_GEMV_MAX_T 8
kiln_status kiln_cuda_matmul_gemv(const kiln_kctx *c, const kiln_matmul_args *a);
/* The same, batch invariant: one kernel at every token count (the tensor-core one for
 * f16/q8_0/q4_0, which the default entry uses only for 2..8 tokens per pass). */
kiln_status kiln_cuda_matmul_gemv_inv(const kiln_kctx *c, const kiln_matmul_args *a);
/* Scratch the gemv wants (the tensor-core path's split activations: 33 k + 256 bytes);
 * with less it runs the fma gemv. */
size_t kiln_cuda_gemv_workspace(const struct kiln_sel_ctx *ctx);
/* LM head + argmax (logits into scratch through a->fn or the gemv, then a row argmax). */
kiln_status kiln_cuda_matmul_argmax(const kiln_kctx *c, const kiln_matmul_argmax_args *a);
size_t kiln_cuda_matmul_argmax_workspace(const struct kiln_sel_ctx *ctx);
/* The members one after another (each with its own bound kernel), then the GLU. */
kiln_status kiln_cuda_matmul_group(const kiln_kctx *c, const kiln_matmul_group_args *a);
/* Benchmarks / tests: which gemv runs. 3 (default) = the tensor-core gemv for f16, q8_0
 * and q4_0 weights (matmul.cu; other dtypes, or too little scratch: the tiled one), 4 = the
 * same without staging q8_0 / q4_0 rows through shared memory, 1 =
 * tiled (activations shared through shared memory by 8 rows, one 32-element group per lane
 * per tile), 2 = tiled with two groups per lane in flight (t <= 4), 0 = direct (each warp
 * reads x itself), 5 = as 3 with the staged kernel at 4 warps per CTA for every shape (3
 * takes 8 when the 16-row tiles are few). Process-wide; not thread-safe against running
 * kernels. */
void kiln_cuda_gemv_variant(int kind);
/* True for the weight dtypes the gemv / embed kernels read. */
int kiln_cuda_weight_dtype_ok(uint32_t dtype);

/* gemv_t16.cu: the tensor-core gemv on T16 weights (kernels/cuda_t16.h; q4_0 / q8_0 /
 * q4_K / q6_K), and on f16 rows as stored (16-byte aligned, k % 128 == 0: the same kernel
 * structure, session 11), passes of up to 8 tokens, batch invariant; other plain rows go
 * to kiln_cuda_matmul_gemv_inv. Workspace: kiln_cuda_gemv_workspace. */
kiln_status kiln_cuda_matmul_t16(const kiln_kctx *c, const kiln_matmul_args *a);
/* Benchmarks / tests: warps per CTA (4, 8, 16, 32) and superchunks per warp in flight (1, 2,
 * 4) of the T16 gemv; 0 = by shape (the default). Process-wide. */
void kiln_cuda_t16_config(int sw, int u);
/* The members of a matmul group (same k, t and x, every one in T16): one launch per dtype
 * over their tiles and, for passes of one token, no prep launch (the split of x fused into
 * the gemv). KILN_ERR_UNSUPPORTED when the members are not such a group or the fusion is
 * off: run them one by one. */
kiln_status kiln_cuda_matmul_t16_group(const kiln_kctx *c, const kiln_matmul_args *m, int nm);
/* Decode fusion (session 9: the split fused into the T16 gemv, grouped launches, one
 * rope+kv-write launch, the register-resident RMS norm, the wide argmax): on by default;
 * off with KILN_CUDA_OLD_DECODE=1 in the environment or kiln_cuda_decode_fusion(0) — the
 * previous kernels, for A/B runs. Same values either way. Process-wide. */
void kiln_cuda_decode_fusion(int on);
int kiln_cuda_decode_fused(void);
/* With the fusion on: the T16 gemv launched as a programmatic dependent launch (its first
 * weights prefetched into L2 while the kernel before it runs; the small kernels let it
 * start early); off with KILN_CUDA_PDL=0 or kiln_cuda_decode_pdl_set(0). Session 9 run 3:
 * tg128 8B q4_0 333-335 vs 314-320 tok/s without, q8_0 257-264 vs 254-255. Process-wide. */
void kiln_cuda_decode_pdl_set(int on);
int kiln_cuda_decode_pdl(void);
/* Benchmarks: q4_K's T16 gemv at 2 CTAs of 16 warps per SM (64 registers, the default) or 1
 * (128; KILN_T16K_MB=1). */
void kiln_cuda_t16k_occupancy(int mb);
/* Benchmarks: the f16 rows' gemv at one token at 1 CTA of 16 warps per SM (no register cap,
 * the default) or 2 (64 registers; KILN_F16R_MB=2); 0: by the environment again. */
void kiln_cuda_f16r_occupancy(int mb);
/* Benchmarks: the q4_0 / q8_0 T16 gemv's L2 prefetch distance in rounds of loads for every
 * dtype (0: none, up to 4), or -1: the defaults (q4_0 1, q8_0 0) or KILN_T16_PF. Values never
 * change with it. Process-wide. */
void kiln_cuda_t16_prefetch(int rounds);
/* matmul.cu: a matmul group's members at one token that each run the tiled fma gemv (the
 * dtypes without a tensor-core or T16 path: q4_1, q5_0, q5_1, plain K-quants, f32, bf16)
 * in one launch per dtype (session 11); off with KILN_CUDA_GEMV_GROUP=0 or
 * kiln_cuda_gemv_group_set(0) (-1: by the environment again), or with the decode fusion.
 * Same values either way. Process-wide. */
void kiln_cuda_gemv_group_set(int on);
/* The T16 gemv's warps per CTA for (dtype, k) (its summation order; kiln_cuda_t16_config's
 * override included). */
int kiln_cuda_t16_warps(uint32_t dtype, int64_t k);

/* gemm_t16.cu: the tensor-core GEMM on T16 q4_0 / q8_0 weights (batched decode; prefill
 * under the deterministic policy): the weights read once per 16-32 tokens, bit for bit the
 * T16 gemv's values for every token (batch invariant with it); below 12 tokens, and for
 * what it does not take (q4_K, q6_K, plain rows), it runs the T16 gemv. Workspace: the
 * split activations of up to 512 tokens (kiln_cuda_gemm_t16_workspace, at least the
 * gemv's). */
kiln_status kiln_cuda_matmul_t16_gemm(const kiln_kctx *c, const kiln_matmul_args *a);
size_t kiln_cuda_gemm_t16_workspace(const struct kiln_sel_ctx *ctx);
/* A matmul group's members that all run the GEMM entry: one split of x, a GEMM each (below
 * 12 tokens: kiln_cuda_matmul_t16_group). KILN_ERR_UNSUPPORTED: run them one by one. */
kiln_status kiln_cuda_matmul_t16_gemm_group(const kiln_kctx *c, const kiln_matmul_args *m, int nm);
/* The GEMM on (default) or off (KILN_CUDA_OLD_GEMM=1: the T16 gemv in passes of 8 at every
 * token count, the A/B switch). Process-wide. */
void kiln_cuda_gemm_t16_set(int on);
/* Which GEMM: 1 (a CTA's warps split k, as the gemv: the default) or 2 (warps split rows,
 * the split activations staged once per CTA: slower, kept for A/B runs); 0: KILN_G16_V=2
 * or the default. Same values. Process-wide. */
void kiln_cuda_gemm_t16_variant(int v);

/* gemm_i8.cu: the int8 tensor-core GEMM on T16 q4_0 / q8_0 weights (session 12): x per
 * (token, 32-block) as a power of two and three int8 digits (within 2^-23 of the block's
 * largest |x|), exact int32 sums per block from mma m16n8k32 s8, the f32 epilogue per
 * block. Deterministic, not batch invariant, not bitwise the gemv. From 12 tokens; else
 * (and with KILN_CUDA_NO_I8=1 / kiln_cuda_gemm_i8_set(0)) the previous selection: up to 64
 * tokens kiln_cuda_matmul_t16_gemm, above kiln_cuda_matmul_cublas. Workspace: the digits of
 * up to 512 tokens (4 k bytes a token) and the fallbacks'. */
kiln_status kiln_cuda_matmul_i8(const kiln_kctx *c, const kiln_matmul_args *a);
size_t kiln_cuda_gemm_i8_workspace(const struct kiln_sel_ctx *ctx);
/* A matmul group whose members all run kiln_cuda_matmul_i8: one prep of x, a GEMM each (or
 * the previous selection's group entries). KILN_ERR_UNSUPPORTED: run them one by one. */
kiln_status kiln_cuda_matmul_i8_group(const kiln_kctx *c, const kiln_matmul_args *m, int nm);
/* 1 on, 0 off (the previous selection, the A/B switch), -1 by the environment
 * (KILN_CUDA_NO_I8=1: off). Process-wide. */
void kiln_cuda_gemm_i8_set(int on);
/* Tests / benchmarks: row tiles per warp above 64 tokens (2 or 4; 0: KILN_I8_MT, else 2),
 * the fewest tokens the GEMM takes (0: 12) and CTAs per SM (1: the next superchunk's weights
 * prefetched, 2: under 128 registers; 0: KILN_I8_OCC, else 2). Process-wide. */
void kiln_cuda_gemm_i8_config(int mt, int min_t, int occ);
/* Tests: the grid's split of k forced to ks ranges (0: by the grid size). Process-wide. */
void kiln_cuda_gemm_i8_ksplit(int ks);
/* Which kernel: 1 (version 1: loads through L1), 2 (version 2: activations and weights staged
 * in shared memory by cp.async, the default); 0: KILN_I8_V=1, else 2. Process-wide. */
void kiln_cuda_gemm_i8_variant(int v);
/* The most tokens the int8 GEMM serves (more: cuBLAS on the dequantized T16 weights); n <= 0:
 * KILN_I8_MAX_T or the default, 192 */
void kiln_cuda_gemm_i8_max_t(int n);

/* T16 weights (n x k) -> f16 hi halves at out[0, n k), 2^11-scaled lo at out[n k, 2 n k)
 * (the cuBLAS path's split-f16 weights), on the stream. */
kiln_status kiln_cuda_t16_dequant_f16(void *stream, const void *w, uint32_t dtype, int64_t n,
                                      int64_t k, void *out);
/* Tests / A-B runs: which T16 dequantization runs: 0 the thread-per-32-block
 * kernels (KILN_CUDA_OLD_DQ=1 at start; the split of x in blas.cu then runs one element per
 * thread and a matmul group splits x per member), 1 the coalesced one (a warp per
 * superchunk), 2 with 2 superchunks per warp, 3 (default) 1 with evict-first stores, 4 2
 * with evict-first stores (KILN_CUDA_DQ_V=N at start); q4_K / q6_K: the coalesced kernel
 * (one superchunk a warp) in 1-4, evict-first in 3-4, the old one in 0 or with
 * KILN_CUDA_OLD_DQK=1 at start. The same bits in every variant.
 * Process-wide. kiln_cuda_t16_dequant_coalesced: the variant is not 0. */
void kiln_cuda_t16_dequant_variant(int v);
int kiln_cuda_t16_dequant_coalesced(void);

/* blas.cu: prefill matmul through cuBLAS (weights dequantized to f16 in scratch). */
kiln_status kiln_cuda_matmul_cublas(const kiln_kctx *c, const kiln_matmul_args *a);
/* A matmul group whose members all run kiln_cuda_matmul_cublas on one x (t <= one chunk):
 * x split once for all of them (the same bits as one by one). KILN_ERR_UNSUPPORTED: not
 * such a group (KILN_CUDA_OLD_DQ=1: never), the caller runs the members. */
kiln_status kiln_cuda_matmul_cublas_group(const kiln_kctx *c, const kiln_matmul_args *m, int nm);
size_t kiln_cuda_matmul_cublas_workspace(const struct kiln_sel_ctx *ctx);
/* Rows of activations converted per cuBLAS call (the workspace holds this many). */
#define KILN_CUDA_BLAS_CHUNK 512
/* Scratch bytes the cuBLAS matmul needs for a weight of n x k and dtype. */
size_t kiln_cuda_matmul_cublas_bytes(uint32_t w_dtype, int64_t n, int64_t k);

/* ops.cu */
kiln_status kiln_cuda_embed(const kiln_kctx *c, const kiln_embed_args *a);
kiln_status kiln_cuda_rms_norm(const kiln_kctx *c, const kiln_rms_norm_args *a);
kiln_status kiln_cuda_rope(const kiln_kctx *c, const kiln_rope_args *a);
kiln_status kiln_cuda_kv_write(const kiln_kctx *c, const kiln_kv_write_args *a);
kiln_status kiln_cuda_rope_kv(const kiln_kctx *c, const kiln_rope_kv_args *a);
kiln_status kiln_cuda_glu(const kiln_kctx *c, const kiln_glu_args *a);
kiln_status kiln_cuda_add(const kiln_kctx *c, const kiln_add_args *a);

/* attention.cu: paged attention (block tables read in the kernel). head_dim a multiple
 * of 32 up to 256. */
kiln_status kiln_cuda_attention(const kiln_kctx *c, const kiln_attention_args *a);
/* Its workspace: a token attending to more than 1024 positions is split over up to 64
 * blocks (split-K), their partial states in kctx->scratch (kiln_cuda_attention_ws_bytes for
 * t tokens of n_head heads, longest attended length max_len; 0 when no token can split).
 * Too small a scratch is KILN_ERR_INVALID_ARG. */
size_t kiln_cuda_attention_ws_bytes(int64_t t, int32_t n_head, int32_t head_dim, int64_t max_len);
size_t kiln_cuda_attention_workspace(const struct kiln_sel_ctx *ctx);
/* The query heads of a KV head in one block (attn_kernel with G > 1, same bits; head_dim 64 / 128,
 * 2 / 4 / 8 heads per KV head, when KV heads x tokens >= 264) on (default) or off
 * (KILN_CUDA_OLD_ATTN=1). Process-wide. */
void kiln_cuda_attention_gqa(int on);
/* Session 11's split ranges (attn_kernel, up to 16 ranges, G = 1 for a decode token) instead
 * of session 12's (attn_split_kernel: 256-position ranges up to 64, the KV head's query
 * heads in one block): on, or off (default; KILN_CUDA_OLD_SPLITK=1 at start: on).
 * Process-wide. */
void kiln_cuda_attention_old_splitk(int on);
/* attn_split_kernel with the next group's K / V loads in flight (f16 cache; KILN_CUDA_ATT2_PF=1
 * at start) or not (default: faster on the H100, 294.0 vs 282.5 tok/s at depth 8192, session
 * 12 run 2): the same bits. Process-wide. */
void kiln_cuda_attention_split_prefetch(int on);
/* flash_attn.cu: the tensor-core attention for steps of many query tokens per sequence
 * (t >= 16 x the step's sequences; head_dim 64 / 128 / 256, f16 or f32 cache); other steps
 * and shapes go to kiln_cuda_attention. Same op and contract, split-f16 exact (2e-5 of the
 * ref), deterministic. kiln_cuda_attention_flash_ok: whether a call runs the flash kernel.
 * kiln_cuda_attention_flash_mode: 0 never (KILN_CUDA_FLASH=0 at start), 1 the default
 * rule, 2 every call it can run (tests). Process-wide. */
kiln_status kiln_cuda_attention_flash(const kiln_kctx *c, const kiln_attention_args *a);
int kiln_cuda_attention_flash_ok(const kiln_attention_args *a);
void kiln_cuda_attention_flash_mode(int mode);
/* Tests / A-B runs: the flash kernel's fragments by ldmatrix (1, default) or plain shared
 * loads (0; KILN_CUDA_FA_LDSM=0 at start). Process-wide. */
void kiln_cuda_attention_flash_ldsm(int on);

/* sample.cu: the sampling chain (kernel.h, kiln_sample_args); rows with k + 2 n_ov >
 * KILN_SAMPLE_MAX_CAND get id -2 (callers check before the launch). With kctx->scratch of
 * at least kiln_cuda_sample_ws_bytes(t, n) bytes the search for a row's candidates is split
 * over many blocks (three launches); without it (or KILN_CUDA_OLD_SAMPLE=1) one block per row
 * runs the whole chain. Both give the same ids. */
kiln_status kiln_cuda_sample(const kiln_kctx *c, const kiln_sample_args *a);
size_t kiln_cuda_sample_ws_bytes(int64_t rows, int64_t n);         /* 0 on overflow / bad sizes */
size_t kiln_cuda_sample_workspace(const struct kiln_sel_ctx *ctx); /* tokens_max rows of n */

/* util.cu: a streaming read of `bytes` (a multiple of 16) from buf on the stream, the
 * sum written to sink[0..1023] (device) so nothing is optimized away: the device's read
 * bandwidth for `kiln doctor` and bench_cuda. */
kiln_status kiln_cuda_read_bandwidth(void *stream, const void *buf, size_t bytes, float *sink);

/* Device probe (prov_cuda.c): number of usable devices (compute capability >= 8.0),
 * the first one's capability x10 in *sm; 0 and a reason in why otherwise. */
int kiln_cuda_probe(int *sm, char *why, size_t why_size);

#ifdef __cplusplus
}
#endif

#endif /* KILN_KERNELS_CUDA_KERNELS_H */
