/*
 * matmul.cu — GEMV / small-batch matmul (1..8 tokens per pass over the weights), the
 * greedy LM head (matmul + argmax) and the grouped matmul, for every weight dtype of
 * common.cuh.
 *
 * GEMV: one warp per output row; lane l takes the row's 32-element groups l, l + 32,
 * ... (so a warp reads a contiguous stretch of the row per step: coalesced), dequantizes
 * each group into registers (common.cuh) and accumulates its dot with each of the T
 * token rows of x (read through the read-only cache; x is small and shared by every
 * warp); a butterfly reduction and one store per (token, row). Deterministic and batch
 * invariant: a row's sum never depends on the other tokens (each token has its own
 * accumulator and the same order). More than 8 tokens: passes of 8.
 */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/select.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GEMV_WARPS 4

template <int DT, int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n, int64_t k,
                const float *__restrict__ x, int64_t xs, float *__restrict__ y, int64_t ys,
                const float *__restrict__ bias) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (r >= n) return;
    const uint8_t *row = W + (size_t)r * row_bytes;
    const int64_t groups = k / 32;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (int64_t g = lane; g < groups; g += 32) {
        float w[32];
        kc_dq32<DT>(row, g, w);
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float4 *xp = (const float4 *)(x + t * xs + g * 32);
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 v = __ldg(xp + i);
                s = fmaf(w[4 * i], v.x, s);
                s = fmaf(w[4 * i + 1], v.y, s);
                s = fmaf(w[4 * i + 2], v.z, s);
                s = fmaf(w[4 * i + 3], v.w, s);
            }
            acc[t] += s;
        }
    }
#pragma unroll
    for (int t = 0; t < T; t++) {
        float v = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        acc[t] = v;
    }
    if (lane == 0) {
        const float b = bias ? bias[r] : 0.0f;
#pragma unroll
        for (int t = 0; t < T; t++) y[t * ys + r] = acc[t] + b;
    }
}

/* The tiled gemv (default): a block of TW warps computes TW rows (one per warp) and
 * shares the activations: x is staged in shared memory one tile of 2048 (T > 4: 1024)
 * columns at a time (T rows of it, loaded once per block with coalesced 16-byte loads, each
 * 32-element group padded by 16 bytes so that the lanes' 16-byte reads of 32 consecutive groups hit
 * distinct banks), then lane l dequantizes groups l (and l + 32) of the tile of its row (straight
 * from global memory) and dots it with the staged x. x is read from L2 once per TW rows instead of
 * once per row, which is what held the direct kernel back (measured: docs/CUDA.md). */
#define TW 8

/* groups per tile: 32 PER (PER = 2: two groups per lane, both loads in flight before
 * either is used; only while the staged x fits in 48 KB of static shared memory) */
/* blk: the block's index among its matmul's blocks (blockIdx.x, or its place in a group
 * launch: gemv_tiled_group_kernel) */
template <int DT, int T, int PER>
__device__ __forceinline__ void gemv_tiled_body(const uint8_t *__restrict__ W, size_t row_bytes,
                                                int64_t n, int64_t k, const float *__restrict__ x,
                                                int64_t xs, float *__restrict__ y, int64_t ys,
                                                const float *__restrict__ bias, unsigned blk) {
    constexpr int G = 32 * PER;
    static_assert(T * G * 144 <= 48 * 1024, "staged x exceeds static shared memory");
    __shared__ float4 xsm[T][G][9];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int64_t r = (int64_t)blk * TW + wi;
    const bool live = r < n;
    const uint8_t *row = W + (size_t)(live ? r : 0) * row_bytes;
    const int64_t groups = k / 32;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (int64_t g0 = 0; g0 < groups; g0 += G) {
        const int ng = groups - g0 < G ? (int)(groups - g0) : G;
        __syncthreads();
        for (int i = threadIdx.x; i < T * G * 8; i += TW * 32) {
            const int t = i / (G * 8), gi = (i / 8) % G, q = i % 8;
            if (gi < ng) xsm[t][gi][q] = __ldg((const float4 *)(x + t * xs + (g0 + gi) * 32) + q);
        }
        __syncthreads();
        if (!live) continue;
        float w[PER][32];
#pragma unroll
        for (int p = 0; p < PER; p++)
            if (lane + 32 * p < ng) kc_dq32<DT>(row, g0 + lane + 32 * p, w[p]);
#pragma unroll
        for (int p = 0; p < PER; p++) {
            const int gl = lane + 32 * p;
            if (gl >= ng) break;
#pragma unroll
            for (int t = 0; t < T; t++) {
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const float4 v = xsm[t][gl][i];
                    s = fmaf(w[p][4 * i], v.x, s);
                    s = fmaf(w[p][4 * i + 1], v.y, s);
                    s = fmaf(w[p][4 * i + 2], v.z, s);
                    s = fmaf(w[p][4 * i + 3], v.w, s);
                }
                acc[t] += s;
            }
        }
    }
    if (!live) return;
#pragma unroll
    for (int t = 0; t < T; t++) {
        float v = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        acc[t] = v;
    }
    if (lane == 0) {
        const float b = bias ? bias[r] : 0.0f;
#pragma unroll
        for (int t = 0; t < T; t++) y[t * ys + r] = acc[t] + b;
    }
}

template <int DT, int T, int PER>
__global__ void __launch_bounds__(TW * 32)
    gemv_tiled_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n, int64_t k,
                      const float *__restrict__ x, int64_t xs, float *__restrict__ y, int64_t ys,
                      const float *__restrict__ bias) {
    gemv_tiled_body<DT, T, PER>(W, row_bytes, n, k, x, xs, y, ys, bias, blockIdx.x);
}

/* A matmul group's members of one dtype sharing x at one token, each a tiled gemv, in one
 * launch (session 11): member i owns the blocks [the blocks before it, + its blocks); each
 * block runs the body a launch of its member alone would (the same bits). The small
 * models' q / k / v and gate / up (Gemma 3 270M's q5_0, SmolLM2's q4_1: no T16 layout) were
 * a launch each, ~4 us apiece at ~0.5 MB of weights. */
#define GT_JOBS 3
struct gt_job {
    const uint8_t *W;
    size_t rb;
    int64_t n;
    float *y;
    const float *bias;
    unsigned blocks;
};
struct gt_jobs {
    gt_job m[GT_JOBS];
};
template <int DT>
__global__ void __launch_bounds__(TW * 32)
    gemv_tiled_group_kernel(const gt_jobs J, int64_t k, const float *__restrict__ x) {
    unsigned b = blockIdx.x;
    int m = 0;
    if (b >= J.m[0].blocks) {
        b -= J.m[0].blocks, m = 1;
        if (b >= J.m[1].blocks) b -= J.m[1].blocks, m = 2;
    }
    const gt_job &o = m == 0 ? J.m[0] : m == 1 ? J.m[1] : J.m[2];
    gemv_tiled_body<DT, 1, 1>(o.W, o.rb, o.n, k, x, 0, o.y, 0, o.bias, b);
}

/* ---- the tensor-core gemv (f16, q8_0, q4_0; kind 3, the default where it applies) ----
 *
 * The decode matmul is bound by memory, but dequantizing into f32 FMAs costs ~5 issue slots
 * per weight (q4_0: 18-byte blocks read 2 bytes at a time, nibble -> float, * d, fma): at
 * HBM speed that is more than the SM can issue, and the fma gemv reached 32 % of the
 * bound (docs/CUDA.md). Here the weights go to the tensor cores instead, as exact f16
 * integers: a quantized value q - 8 (q4_0) or q (q8_0) is an f16 integer made by one PRMT
 * (the byte into the mantissa of 1024.0) and one HSUB2 per two weights; an f16 weight is
 * itself. The activations keep f32 accuracy as kiln's numerics require (docs/CUDA.md,
 * "split f16"): a prep kernel scales each 32-block of each token row by a power of two (its
 * max |x| < 2^15: nothing overflows or goes subnormal where it matters) and splits it into
 * hi = f16(v) and lo = f16(v - hi); both go through mma.sync m16n8k16 (f16 x f16 products
 * are exact in f32, f32 accumulation) into the same fresh accumulators, and per 32-block
 * and row y += d * inv_scale * acc (inv_scale a power of two: exact).
 *
 * Mapping: a CTA computes 16 rows for up to 8 tokens (the mma's n = 8 columns: lane group
 * g = lane / 4 is token g); its warps split k, partial sums reduced through shared memory
 * in warp order (deterministic; a token's sums never depend on the other tokens: batch
 * invariant). Within a 32-block, lane tig = lane % 4 holds 8 of the 32 k positions for
 * rows g and g + 8: for q8_0 / q4_0 the 4 bytes at 4 tig (elements 4 tig .. +3, and for
 * q4_0 their high nibbles 16 + 4 tig .. +3; q8_0 the bytes at 16 + 4 tig), for f16 the 8
 * halves at 8 tig (one 16-byte load). The order of k inside the mma is free (a dot
 * product), so the B fragments (x) are loaded with the same permutation. f16 rows are read
 * straight from global memory (8 warps, 4 blocks per warp in flight); q8_0 / q4_0 rows go
 * through shared memory (gemv_mma_staged2_kernel below). */
#define MMA_WARPS 8
#define MMA_U     4 /* 32-blocks per warp per iteration (loads in flight) */

/* q8_0 / q4_0: 2 weights and activations staged through shared memory (default), 0 read
 * straight from global memory (variant 4, for A/B). (Staging only the weights, the first
 * version, measured in run 19: q4_0 4.55 ms vs 3.93 staged with the activations.) */
static int kc_gemv_staged = 2;
static int kc_gemv_split = 0; /* warps per CTA of the staged gemv: 0 = by shape */

/* x rows (T <= 8, stride xs) -> scratch: hi halves [8][k], lo halves [8][k], then the
 * inverse scales [k / 32][8] (one per 32-block and token). Each 32-block of a token row is
 * scaled by its own power of two s = 2^(15 - e) (block max < 2^e, so every |v s| < 2^15:
 * no f16 overflow, and lo = f16(v s - hi) stays out of the subnormals except for values
 * 2^-25 below the block's largest, whose share of the block's dot product is below f32
 * rounding). A zero, inf or NaN block keeps s = 1 (inf / NaN propagate as in f32). One
 * thread per 4 values, 8 threads per block; fully parallel (grid over T * k / 4). */
__global__ void xsplit_kernel(const float *__restrict__ x, int64_t xs, int64_t k, int T,
                              __half *__restrict__ xh, __half *__restrict__ xl,
                              float *__restrict__ inv) {
    const int64_t k4 = k / 4;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * k4) return; /* whole 8-thread groups leave together (k % 32 == 0) */
    const int lane = threadIdx.x & 31;
    const unsigned gmask = 0xFFu << (lane & ~7);
    const int t = (int)(i / k4);
    const int64_t j = i % k4;
    const float4 v = ((const float4 *)(x + t * xs))[j];
    __half2 h[2], l[2];
    const float sc = kc_split4(v, gmask, h, l);
    ((uint2 *)(xh + t * k))[j] = *(const uint2 *)h;
    ((uint2 *)(xl + t * k))[j] = *(const uint2 *)l;
    if ((lane & 7) == 0) inv[(j / 8) * 8 + t] = 1.0f / sc;
}

/* The B fragments (hi, lo: mma 0's two registers then mma 1's) and the two inverse scales
 * (tokens 2 tig, 2 tig + 1) of 32-block b; zeros for a lane whose token g is not live. The
 * scales of tokens >= T are whatever the scratch holds (the prep kernel writes T tokens):
 * they only multiply the accumulator columns of those tokens, which are never stored. */
template <bool E8>
__device__ __forceinline__ void kc_bfrag(const __half *xhr, const __half *xlr, const float *inv,
                                         int64_t b, int tig, bool live, uint32_t bh[4],
                                         uint32_t bl[4], float2 *iv) {
    *iv = *(const float2 *)(inv + b * 8 + 2 * tig);
    if (!live) {
#pragma unroll
        for (int j = 0; j < 4; j++) bh[j] = bl[j] = 0u;
    } else if constexpr (E8) {
        const uint4 h = *(const uint4 *)(xhr + b * 32 + 8 * tig);
        const uint4 l = *(const uint4 *)(xlr + b * 32 + 8 * tig);
        bh[0] = h.x, bh[1] = h.y, bh[2] = h.z, bh[3] = h.w;
        bl[0] = l.x, bl[1] = l.y, bl[2] = l.z, bl[3] = l.w;
    } else {
        const __half *hp = xhr + b * 32 + 4 * tig, *lp = xlr + b * 32 + 4 * tig;
        const uint2 h0 = *(const uint2 *)hp, h1 = *(const uint2 *)(hp + 16);
        const uint2 l0 = *(const uint2 *)lp, l1 = *(const uint2 *)(lp + 16);
        bh[0] = h0.x, bh[1] = h0.y, bh[2] = h1.x, bh[3] = h1.y;
        bl[0] = l0.x, bl[1] = l0.y, bl[2] = l1.x, bl[3] = l1.y;
    }
}

/* Weights read straight from global memory (f16: one 16-byte load per row and block; the
 * quantized types when their rows cannot be staged). */
template <int DT>
__global__ void __launch_bounds__(MMA_WARPS * 32)
    gemv_mma_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n, int64_t k,
                    const __half *__restrict__ xh, const __half *__restrict__ xl,
                    const float *__restrict__ inv, int T, float *__restrict__ y, int64_t ys,
                    const float *__restrict__ bias) {
    using MQ = kc_mq<DT>;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    const int64_t r0 = (int64_t)blockIdx.x * 16;
    const int64_t ra = r0 + g < n ? r0 + g : n - 1, rb = r0 + g + 8 < n ? r0 + g + 8 : n - 1;
    const uint8_t *const rp[2] = {W + (size_t)ra * row_bytes, W + (size_t)rb * row_bytes};
    const bool live = g < T;
    const __half *xhr = xh + (live ? g : 0) * k, *xlr = xl + (live ? g : 0) * k;
    const int64_t nb = k / 32;
    float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t b0 = (int64_t)w * MMA_U; b0 < nb; b0 += MMA_WARPS * MMA_U) {
        MQ raw[MMA_U];
        uint32_t bh[MMA_U][4], bl[MMA_U][4];
        float2 iv[MMA_U];
#pragma unroll
        for (int u = 0; u < MMA_U; u++) {
            if (b0 + u >= nb) break;
            raw[u].load(rp, b0 + u, tig);
            kc_bfrag<MQ::E8>(xhr, xlr, inv, b0 + u, tig, live, bh[u], bl[u], &iv[u]);
        }
#pragma unroll
        for (int u = 0; u < MMA_U; u++) {
            if (b0 + u >= nb) break;
            kc_mma_block(raw[u], bh[u], bl[u], iv[u], tot);
        }
    }
    __shared__ float red[MMA_WARPS][32][4];
    kc_mma_store<MMA_WARPS>(red, tot, w, lane, r0, n, T, y, ys, bias);
}

/* q8_0 / q4_0 rows staged through shared memory: 2-byte aligned blocks read 2 bytes at a
 * time straight from global memory cost a load instruction (and an L1 wavefront per row
 * touched) per 4 weights, which capped the gemvs at ~30 % of the bandwidth bound (device
 * run 14). Here each warp copies stages of 8 blocks x 16 rows (8 blocks are a multiple of
 * 16 bytes: 144 / 272 bytes per row) with 16-byte cp.async, double-buffered, and reads the
 * fragments from shared memory (row pitch 36 / 68 words: the lanes' 2-byte reads of rows
 * g = 0..7 at 4 tig fall in 32 distinct banks). Needs k % 256 == 0 and 16-byte aligned
 * rows. */
#define MMA_SW 4 /* warps per CTA (split k) */

/* The activations are staged too: each stage's x hi / lo halves (8 blocks x 32 values x T
 * tokens) and inverse scales come in with the weights by cp.async, so no global load sits
 * on a block's critical path (staging only the weights, the B fragments were global loads
 * at L2 latency with few warps per SM to hide it: q4_0 4.55 vs 3.93 ms, run 19). Dynamic
 * shared memory per warp and buffer: 16 rows x SB, then T token rows of hi and of lo
 * halves (pitch 544 bytes: the 8-byte reads of tokens g = 0..3 in a half-warp fall in
 * distinct banks), then 8 x 8 inverse scales. */
#define XPITCH 544
template <int DT> __host__ __device__ constexpr int kc_stage_bytes(int T) {
    return 16 * 8 * kc_dt<DT>::BYTES + 2 * T * XPITCH + 256;
}

template <int DT, int SW>
__global__ void __launch_bounds__(SW * 32)
    gemv_mma_staged2_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n, int64_t k,
                            const __half *__restrict__ xh, const __half *__restrict__ xl,
                            const float *__restrict__ inv, int T, float *__restrict__ y, int64_t ys,
                            const float *__restrict__ bias) {
    using MQ = kc_mq<DT>;
    constexpr int SB = 8 * kc_dt<DT>::BYTES;
    constexpr int C = SB / 16;
    static_assert(SB % 16 == 0, "a stage of 8 blocks must be whole 16-byte chunks");
    extern __shared__ __align__(16) uint8_t dsm[];
    __shared__ float red[SW][32][4];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    const int64_t r0 = (int64_t)blockIdx.x * 16;
    const bool live = g < T;
    const int BB = kc_stage_bytes<DT>(T);
    uint8_t *const wb = dsm + (size_t)w * 2 * BB;
    const int64_t nst = k / 256;
    auto issue = [&](int64_t st, int q) {
        uint8_t *b = wb + q * BB;
        for (int i = lane; i < 16 * C; i += 32) {
            const int row = i / C, c = i % C;
            const int64_t r = r0 + row < n ? r0 + row : n - 1;
            kc_cp16(b + row * SB + c * 16, W + (size_t)r * row_bytes + st * SB + c * 16);
        }
        uint8_t *xb = b + 16 * SB;
        for (int i = lane; i < T * 64; i += 32) {
            const int t = i >> 6, half = (i >> 5) & 1, c = i & 31;
            const __half *src = (half ? xl : xh) + t * k + st * 256 + c * 8;
            kc_cp16(xb + (half * T + t) * XPITCH + c * 16, src);
        }
        if (lane < 16) kc_cp16(xb + 2 * T * XPITCH + lane * 16, inv + st * 64 + lane * 4);
        kc_cp_commit();
    };
    float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int q = 0;
    if (w < nst) issue(w, 0);
    for (int64_t st = w; st < nst; st += SW, q ^= 1) {
        if (st + SW < nst) {
            issue(st + SW, q ^ 1);
            kc_cp_wait<1>();
        } else {
            kc_cp_wait<0>();
        }
        __syncwarp();
        const uint8_t *b = wb + q * BB;
        const uint8_t *const rp[2] = {b + g * SB, b + (g + 8) * SB};
        const __half *xs = (const __half *)(b + 16 * SB + (live ? g : 0) * XPITCH);
        const __half *ls = (const __half *)(b + 16 * SB + (T + (live ? g : 0)) * XPITCH);
        const float *is = (const float *)(b + 16 * SB + 2 * T * XPITCH);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            MQ raw[4];
            uint32_t bh[4][4], bl[4][4];
            float2 iv[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                raw[u].load(rp, 4 * h + u, tig);
                kc_bfrag<MQ::E8>(xs, ls, is, 4 * h + u, tig, live, bh[u], bl[u], &iv[u]);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) kc_mma_block(raw[u], bh[u], bl[u], iv[u], tot);
        }
        __syncwarp();
    }
    kc_mma_store<SW>(red, tot, w, lane, r0, n, T, y, ys, bias);
}

/* Scratch the tensor-core gemv needs for k columns (one pass of up to 8 tokens): the hi and
 * lo halves and the per-block inverse scales. */
/* (the T16 gemv, gemv_t16.cu, also keeps q4_K's sums of x per 32-block: the second term) */
static size_t kc_gemv_mma_bytes(int64_t k) {
    return (size_t)KILN_CUDA_GEMV_MAX_T * (size_t)k * 2 * sizeof(__half) +
           2 * (size_t)(k / 32) * KILN_CUDA_GEMV_MAX_T * sizeof(float) + 256;
}

extern "C" size_t kiln_cuda_gemv_workspace(const struct kiln_sel_ctx *ctx) {
    return ctx->k > 0 ? kc_gemv_mma_bytes(ctx->k) : 0;
}

/* The current device's compute capability x10 (cached per host thread and device). */
static int kc_device_sm(void) {
    static __thread int dev_cached = -1, sm_cached = 0;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    if (dev != dev_cached) {
        int ma = 0, mi = 0;
        if (cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
            return 0;
        dev_cached = dev, sm_cached = ma * 10 + mi;
    }
    return sm_cached;
}

static bool kc_mma_dtype(uint32_t dt) {
    return dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_Q8_0 || dt == KILN_DTYPE_Q4_0;
}

/* The tensor-core gemv when it applies (dtype, scratch, alignment, a device of sm_80+);
 * false: the caller runs the fma gemv. */
static bool kc_mma_ok(const kiln_kctx *c, const kiln_matmul_args *a) {
    if (!kc_mma_dtype(a->w_dtype) || !c || !c->scratch) return false;
    if (c->scratch_size < kc_gemv_mma_bytes(a->k) || ((uintptr_t)c->scratch & 15)) return false;
    if (a->w_dtype == KILN_DTYPE_F16 && (((uintptr_t)a->w & 15) || (a->w_row_bytes & 15)))
        return false;
    if (((uintptr_t)a->w & 1) || (a->w_row_bytes & 1)) return false;
    return kc_device_sm() >= 80;
}

template <int DT>
static void launch_gemv_mma(const kiln_kctx *c, const kiln_matmul_args *a, int64_t t0, int T) {
    cudaStream_t s = KC_STREAM(c);
    const size_t xk = (size_t)KILN_CUDA_GEMV_MAX_T * (size_t)a->k;
    __half *xh = (__half *)c->scratch, *xl = xh + xk;
    float *inv = (float *)(xl + xk);
    const int64_t thr = (int64_t)T * (a->k / 4);
    xsplit_kernel<<<(unsigned)((thr + 255) / 256), 256, 0, s>>>(a->x + t0 * a->x_stride,
                                                                a->x_stride, a->k, T, xh, xl, inv);
    const unsigned grid = (unsigned)((a->n + 15) / 16);
    float *y = a->y + t0 * a->y_stride;
    if constexpr (DT != KILN_DTYPE_F16) {
        if (a->k % 256 == 0 && ((uintptr_t)a->w & 15) == 0 && (a->w_row_bytes & 15) == 0 &&
            kc_gemv_staged == 2) {
            /* warps per CTA (the split of k): 4, or 8 / 16 when 16-row tiles are too few to
             * give every SM several CTAs (n = 4096: 256 tiles on 132 SMs) and k has the
             * stages for them; kc_gemv_split forces one (A/B) */
            const int64_t tiles = (a->n + 15) / 16, nst = a->k / 256;
            /* the opt-in above 48 KB, once per device and instantiation (idempotent): up to
             * what the device allows a block beside the kernel's static shared memory; a
             * refused attribute leaves no error behind for the launch checks */
            static int dmax[64][3];
            int dev = 0;
            if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) dev = 0;
            if (!dmax[dev][0]) {
                int mx = 48 * 1024;
                if (cudaDeviceGetAttribute(&mx, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
                    cudaSuccess)
                    mx = 48 * 1024;
                const void *fn[3] = {(const void *)gemv_mma_staged2_kernel<DT, 4>,
                                     (const void *)gemv_mma_staged2_kernel<DT, 8>,
                                     (const void *)gemv_mma_staged2_kernel<DT, 16>};
                for (int i = 0; i < 3; i++) {
                    cudaFuncAttributes fa;
                    int st = 0;
                    if (cudaFuncGetAttributes(&fa, fn[i]) == cudaSuccess)
                        st = (int)fa.sharedSizeBytes;
                    const int want = (4 << i) * 2 * kc_stage_bytes<DT>(KILN_CUDA_GEMV_MAX_T);
                    const int cap = mx - st;
                    dmax[dev][i] = want < cap ? want : cap;
                    if (cudaFuncSetAttribute(fn[i], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             dmax[dev][i]) != cudaSuccess)
                        dmax[dev][i] = 48 * 1024 - st;
                }
                (void)cudaGetLastError();
            }
            int sw = kc_gemv_split;
            if (sw == 0) sw = tiles < 600 && nst >= 32 ? 16 : tiles < 600 && nst >= 8 ? 8 : 4;
            if (sw != 4 && sw != 8 && sw != 16) sw = 4;
            /* by the largest pass, not this one's T: the split decides the order of the sums,
             * and a row's result must not depend on how many tokens share the pass */
            while (sw > 4 &&
                   sw * 2 * kc_stage_bytes<DT>(KILN_CUDA_GEMV_MAX_T) > dmax[dev][sw == 16 ? 2 : 1])
                sw /= 2;
            const int smem = sw * 2 * kc_stage_bytes<DT>(T);
#define KC_STAGED(SWV)                                                                             \
    gemv_mma_staged2_kernel<DT, SWV>                                                               \
        <<<grid, SWV * 32, smem, s>>>((const uint8_t *)a->w, a->w_row_bytes, a->n, a->k, xh, xl,   \
                                      inv, T, y, a->y_stride, a->bias)
            if (sw == 16)
                KC_STAGED(16);
            else if (sw == 8)
                KC_STAGED(8);
            else
                KC_STAGED(4);
#undef KC_STAGED
            return;
        }
    }
    gemv_mma_kernel<DT><<<grid, MMA_WARPS * 32, 0, s>>>(
        (const uint8_t *)a->w, a->w_row_bytes, a->n, a->k, xh, xl, inv, T, y, a->y_stride, a->bias);
}

/* Which gemv runs: 3 (default) the tensor-core one where it applies, else the tiled fma
 * one; 4 the same without the shared-memory staging of q8_0 / q4_0; 5 the same with 4
 * warps per CTA at every shape (before device run 11); 1 the tiled, 0 the
 * direct, 2 the tiled with two groups per lane (A/B benchmarks and tests select it with
 * kiln_cuda_gemv_variant). */
static int kc_gemv_kind = 3;

extern "C" void kiln_cuda_gemv_variant(int kind) {
    kc_gemv_kind = kind >= 0 && kind <= 5 ? kind : 3;
    kc_gemv_staged = kc_gemv_kind == 4 ? 0 : 2;
    kc_gemv_split = kc_gemv_kind == 5 ? 4 : 0;
    if (kc_gemv_kind == 4 || kc_gemv_kind == 5) kc_gemv_kind = 3;
}

template <int DT>
static void launch_gemv(cudaStream_t s, const kiln_matmul_args *a, int64_t t0, int T) {
    const int kind = kc_gemv_kind == 3 ? 1 : kc_gemv_kind;
    const bool tiled = kind != 0;
    dim3 grid((unsigned)((a->n + (tiled ? TW : GEMV_WARPS) - 1) / (tiled ? TW : GEMV_WARPS)));
    dim3 block((tiled ? TW : GEMV_WARPS) * 32);
    const uint8_t *W = (const uint8_t *)a->w;
    const float *x = a->x + t0 * a->x_stride;
    float *y = a->y + t0 * a->y_stride;
#define GL(TT)                                                                                     \
    do {                                                                                           \
        if (kind == 2 && TT <= 4)                                                                  \
            gemv_tiled_kernel<DT, TT, (TT <= 4 ? 2 : 1)><<<grid, block, 0, s>>>(                   \
                W, a->w_row_bytes, a->n, a->k, x, a->x_stride, y, a->y_stride, a->bias);           \
        else if (tiled)                                                                            \
            gemv_tiled_kernel<DT, TT, 1><<<grid, block, 0, s>>>(                                   \
                W, a->w_row_bytes, a->n, a->k, x, a->x_stride, y, a->y_stride, a->bias);           \
        else                                                                                       \
            gemv_kernel<DT, TT><<<grid, block, 0, s>>>(W, a->w_row_bytes, a->n, a->k, x,           \
                                                       a->x_stride, y, a->y_stride, a->bias);      \
    } while (0)
    switch (T) {
    case 1:
        GL(1);
        break;
    case 2:
        GL(2);
        break;
    case 3:
        GL(3);
        break;
    case 4:
        GL(4);
        break;
    case 5:
        GL(5);
        break;
    case 6:
        GL(6);
        break;
    case 7:
        GL(7);
        break;
    default:
        GL(8);
        break;
    }
#undef GL
}

int kiln_cuda_weight_dtype_ok(uint32_t dtype) {
    return kc_block_elems(dtype) != 0;
}

#define GEMV_CASE(DT, s, a, t0, T) launch_gemv<DT>(s, a, t0, T)

/* inv: the batch-invariant entry (one kernel at every token count); else the tensor-core
 * gemv runs passes of 2..8 tokens (~2x the fma gemv at t = 4: device run 16, docs/CUDA.md)
 * and single tokens as kc_gemv1_mma says. */
/* Which gemv a single token gets: KILN_CUDA_GEMV1=mma / fma forces one (A/B in
 * benchmarks; read once per process); by default the tensor-core one for q8_0 / q4_0 (with
 * activations staged it beat the fma gemv at t = 1: 8B q4_0 decode 181 -> 192 tok/s, q8_0
 * 161 -> 164 on an H200, device run 19) and the fma one for f16 (5.26 vs 5.54 ms for the
 * 8B's matmuls, same run). */
static bool kc_gemv1_mma(uint32_t dtype) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("KILN_CUDA_GEMV1");
        v = !e ? 2 : strcmp(e, "mma") == 0 ? 1 : strcmp(e, "fma") == 0 ? 0 : 2;
    }
    return v == 2 ? dtype != KILN_DTYPE_F16 : v == 1;
}

static kiln_status gemv_entry(const kiln_kctx *c, const kiln_matmul_args *a, bool inv) {
    if (a->t <= 0 || a->n <= 0) return KILN_OK;
    const int be = kc_block_elems(a->w_dtype);
    if (!be || a->k % be || a->k % 32 || a->w_layout != 0) return KILN_ERR_INVALID_ARG;
    if (((uintptr_t)a->x & 15) || (a->x_stride & 3)) return KILN_ERR_INVALID_ARG;
    cudaStream_t s = KC_STREAM(c);
    const bool mma = kc_gemv_kind == 3 && kc_mma_ok(c, a);
    for (int64_t t0 = 0; t0 < a->t; t0 += KILN_CUDA_GEMV_MAX_T) {
        int T = (int)(a->t - t0 < KILN_CUDA_GEMV_MAX_T ? a->t - t0 : KILN_CUDA_GEMV_MAX_T);
        if (mma && (inv || T >= 2 || kc_gemv1_mma(a->w_dtype))) {
            if (a->w_dtype == KILN_DTYPE_F16)
                launch_gemv_mma<KILN_DTYPE_F16>(c, a, t0, T);
            else if (a->w_dtype == KILN_DTYPE_Q8_0)
                launch_gemv_mma<KILN_DTYPE_Q8_0>(c, a, t0, T);
            else
                launch_gemv_mma<KILN_DTYPE_Q4_0>(c, a, t0, T);
            continue;
        }
        KC_DTYPE_SWITCH(a->w_dtype, GEMV_CASE, s, a, t0, T);
    }
    return kc_launched();
}

extern "C" kiln_status kiln_cuda_matmul_gemv(const kiln_kctx *c, const kiln_matmul_args *a) {
    return gemv_entry(c, a, false);
}

extern "C" kiln_status kiln_cuda_matmul_gemv_inv(const kiln_kctx *c, const kiln_matmul_args *a) {
    return gemv_entry(c, a, true);
}

/* ---- argmax over logits rows (lowest index among equal maxima; NaN, -inf skipped) ---- */

__device__ __forceinline__ void better(float v, int i, float *bv, int *bi) {
    if (i < 0) return;
    if (*bi < 0 || v > *bv || (v == *bv && i < *bi)) *bv = v, *bi = i;
}

/* The block's pick of the threads' (bv, bi) (better() order) into ids[t] / vals[t]: warps
 * by shuffles, then warp 0 over the warps' picks. Every thread of the block calls it. */
__device__ __forceinline__ void argmax_block_store(float bv, int bi, int64_t t, int32_t *ids,
                                                   float *vals) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        better(ov, oi, &bv, &bi);
    }
    __shared__ float sv[32];
    __shared__ int si[32];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sv[w] = bv, si[w] = bi;
    __syncthreads();
    if (w == 0) {
        const int nw = blockDim.x >> 5;
        bv = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : -1;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            better(ov, oi, &bv, &bi);
        }
        if (lane == 0) {
            ids[t] = bi;
            if (vals) vals[t] = bi >= 0 ? bv : -INFINITY;
        }
    }
}

__global__ void argmax_kernel(const float *__restrict__ logits, int64_t ls, int64_t n_limit,
                              float softcap, int32_t *ids, float *vals) {
    const int64_t t = blockIdx.x;
    const float *row = logits + t * ls;
    float bv = -INFINITY;
    int bi = -1;
    for (int64_t i = threadIdx.x; i < n_limit; i += blockDim.x) {
        float v = row[i];
        if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
        if (isnan(v) || v == -INFINITY) continue;
        better(v, (int)i, &bv, &bi);
    }
    argmax_block_store(bv, bi, t, ids, vals);
}

/* The same pick over a row by 1024 threads, 4 float4 loads in flight each (the row's
 * values in any order: the lowest index among equal maxima is order-free): 126 us per
 * 128256-logit row in session 9's profile for argmax_kernel, whose 256 threads waited on
 * one load at a time. Needs ls % 4 == 0 and 16-byte aligned rows. */
__global__ void __launch_bounds__(1024)
    argmax4_kernel(const float *__restrict__ logits, int64_t ls, int64_t n_limit, float softcap,
                   int32_t *ids, float *vals) {
    const int64_t t = blockIdx.x;
    const float *row = logits + t * ls;
    const int64_t n4 = n_limit / 4;
    float bv = -INFINITY;
    int bi = -1;
#define KC_PICK(v, i)                                                                              \
    do {                                                                                           \
        float v_ = (v);                                                                            \
        if (softcap > 0.0f) v_ = softcap * tanhf(v_ / softcap);                                    \
        if (!isnan(v_) && v_ != -INFINITY) better(v_, (int)(i), &bv, &bi);                         \
    } while (0)
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
        const float4 v = ((const float4 *)row)[i];
        KC_PICK(v.x, 4 * i);
        KC_PICK(v.y, 4 * i + 1);
        KC_PICK(v.z, 4 * i + 2);
        KC_PICK(v.w, 4 * i + 3);
    }
    for (int64_t i = 4 * n4 + threadIdx.x; i < n_limit; i += blockDim.x) KC_PICK(row[i], i);
#undef KC_PICK
    argmax_block_store(bv, bi, t, ids, vals);
}

extern "C" size_t kiln_cuda_matmul_argmax_workspace(const struct kiln_sel_ctx *ctx) {
    int64_t t = ctx->tokens_max < 64 ? ctx->tokens_max : 64;
    if (t < 1) t = 1;
    size_t logits = (size_t)t * (size_t)ctx->n * sizeof(float);
    /* the bound matmul may be the cuBLAS one, which needs its own scratch after ours */
    size_t blas = ctx->tokens_max > KILN_CUDA_GEMV_MAX_T
                      ? kiln_cuda_matmul_cublas_bytes(ctx->w_dtype, ctx->n, ctx->k)
                      : 0;
    size_t gemv = kiln_cuda_gemv_workspace(ctx);
    return ((logits + 255) & ~(size_t)255) + (blas > gemv ? blas : gemv);
}

/* Logits of up to 64 rows at a time into scratch, then the argmax of each row. */
extern "C" kiln_status kiln_cuda_matmul_argmax(const kiln_kctx *c,
                                               const kiln_matmul_argmax_args *a) {
    const kiln_matmul_args *m = &a->mm;
    if (m->t <= 0) return KILN_OK;
    if (a->n_limit > m->n || a->n_limit > INT32_MAX) return KILN_ERR_INVALID_ARG;
    int64_t chunk = 64;
    size_t lbytes = (size_t)chunk * (size_t)m->n * sizeof(float);
    size_t lpad = (lbytes + 255) & ~(size_t)255;
    if (!c || !c->scratch || c->scratch_size < lbytes) {
        chunk = 1;
        lbytes = (size_t)m->n * sizeof(float);
        lpad = (lbytes + 255) & ~(size_t)255;
        if (!c || !c->scratch || c->scratch_size < lbytes) return KILN_ERR_NOMEM;
    }
    kiln_kctx inner = *c;
    inner.scratch = (uint8_t *)c->scratch + lpad;
    inner.scratch_size = c->scratch_size > lpad ? c->scratch_size - lpad : 0;
    kiln_matmul_fn fn = a->fn ? a->fn : kiln_cuda_matmul_gemv;
    for (int64_t t0 = 0; t0 < m->t; t0 += chunk) {
        kiln_matmul_args mm = *m;
        mm.t = m->t - t0 < chunk ? m->t - t0 : chunk;
        mm.x = m->x + t0 * m->x_stride;
        mm.y = (float *)c->scratch;
        mm.y_stride = m->n;
        kiln_status st = fn(&inner, &mm);
        if (st) return st;
        if (kiln_cuda_decode_fused() && m->n % 4 == 0 && ((uintptr_t)c->scratch & 15) == 0)
            argmax4_kernel<<<(unsigned)mm.t, 1024, 0, KC_STREAM(c)>>>(
                (const float *)c->scratch, m->n, a->n_limit, a->softcap, a->ids + t0,
                a->vals ? a->vals + t0 : NULL);
        else
            argmax_kernel<<<(unsigned)mm.t, 256, 0, KC_STREAM(c)>>>(
                (const float *)c->scratch, m->n, a->n_limit, a->softcap, a->ids + t0,
                a->vals ? a->vals + t0 : NULL);
        if ((st = kc_launched())) return st;
    }
    return KILN_OK;
}

/* The grouped tiled gemv: on unless KILN_CUDA_GEMV_GROUP=0 or kiln_cuda_gemv_group_set(0)
 * (A/B; the same values either way) or the decode fusion is off. */
static int kc_gemv_group = -1;
extern "C" void kiln_cuda_gemv_group_set(int on) {
    kc_gemv_group = on < 0 ? -1 : on ? 1 : 0;
}
static bool kc_gemv_group_on(void) {
    if (kc_gemv_group < 0) {
        const char *e = getenv("KILN_CUDA_GEMV_GROUP");
        kc_gemv_group = e && e[0] == '0' ? 0 : 1;
    }
    return kc_gemv_group && kiln_cuda_decode_fused();
}

#define GT_CASE(DT, s, J, grid, k, x) gemv_tiled_group_kernel<DT><<<grid, TW * 32, 0, s>>>(J, k, x)

/* Members all on cuda.gemv.matmul's entry at one token that would each run the tiled fma
 * gemv (gemv_entry: not the tensor-core one), sharing x and k: one launch per dtype, up to
 * GT_JOBS members a launch. KILN_ERR_UNSUPPORTED: not such a group (run them one by one). */
static kiln_status gemv_tiled_group(const kiln_kctx *c, const kiln_matmul_group_args *a) {
    if (!kc_gemv_group_on() || (kc_gemv_kind != 3 && kc_gemv_kind != 1) || a->n < 2)
        return KILN_ERR_UNSUPPORTED;
    const kiln_matmul_args *m0 = &a->m[0];
    for (int i = 0; i < a->n; i++) {
        const kiln_matmul_args *m = &a->m[i];
        const int be = kc_block_elems(m->w_dtype);
        if (a->fn[i] != kiln_cuda_matmul_gemv || m->t != 1 || m->n <= 0 || m->x != m0->x ||
            m->k != m0->k || m->w_layout != 0 || !be || m->k % be || m->k % 32 ||
            ((uintptr_t)m->x & 15) || (m->n + TW - 1) / TW > (int64_t)(UINT32_MAX / 4))
            return KILN_ERR_UNSUPPORTED;
        if (kc_gemv_kind == 3 && kc_mma_ok(c, m) && kc_gemv1_mma(m->w_dtype))
            return KILN_ERR_UNSUPPORTED; /* that member runs the tensor-core gemv */
    }
    cudaStream_t s = KC_STREAM(c);
    bool done[KILN_MATMUL_GROUP_MAX] = {false};
    for (int i = 0; i < a->n; i++) {
        if (done[i]) continue;
        gt_jobs J;
        memset(&J, 0, sizeof J);
        unsigned grid = 0;
        for (int j = i, nj = 0; j < a->n && nj < GT_JOBS; j++) {
            if (done[j] || a->m[j].w_dtype != a->m[i].w_dtype) continue;
            const kiln_matmul_args *m = &a->m[j];
            J.m[nj] = (gt_job){(const uint8_t *)m->w,           m->w_row_bytes, m->n, m->y, m->bias,
                               (unsigned)((m->n + TW - 1) / TW)};
            grid += J.m[nj].blocks;
            done[j] = true;
            nj++;
        }
        KC_DTYPE_SWITCH(a->m[i].w_dtype, GT_CASE, s, J, grid, m0->k, m0->x);
    }
    return kc_launched();
}

extern "C" kiln_status kiln_cuda_matmul_group(const kiln_kctx *c, const kiln_matmul_group_args *a) {
    if (a->n < 1 || a->n > KILN_MATMUL_GROUP_MAX) return KILN_ERR_INVALID_ARG;
    /* every member on the int8 GEMM's or the T16 GEMM's entry: its group entry; T16 gemv
     * and GEMM members mixed (e.g. a q6_K v beside q4_0 q / k): the gemv's group launch for
     * all of them (the T16 GEMM's values are the gemv's; the int8 GEMM's are within its
     * tolerance of them) */
    bool all_t16 = true, all_g16 = true, all_blas = true, all_i8 = true;
    for (int i = 0; i < a->n; i++) {
        const bool g16 = a->fn[i] == kiln_cuda_matmul_t16_gemm;
        const bool i8 = a->fn[i] == kiln_cuda_matmul_i8;
        all_i8 &= i8;
        /* an int8-GEMM member beside T16 gemv members (a q6_K v beside q4_0 q / k): the
         * gemv's group launch, as for the T16 GEMM's members */
        all_t16 &= g16 || i8 || a->fn[i] == kiln_cuda_matmul_t16;
        all_g16 &= g16;
        all_blas &= a->fn[i] == kiln_cuda_matmul_cublas; /* prefill: one split of x */
    }
    kiln_status gs = all_i8     ? kiln_cuda_matmul_i8_group(c, a->m, a->n)
                     : all_g16  ? kiln_cuda_matmul_t16_gemm_group(c, a->m, a->n)
                     : all_t16  ? kiln_cuda_matmul_t16_group(c, a->m, a->n)
                     : all_blas ? kiln_cuda_matmul_cublas_group(c, a->m, a->n)
                                : gemv_tiled_group(c, a);
    if (gs != KILN_ERR_UNSUPPORTED) {
        if (gs) return gs;
    } else
        for (int i = 0; i < a->n; i++) {
            kiln_matmul_fn fn = a->fn[i] ? a->fn[i] : kiln_cuda_matmul_gemv;
            kiln_status st = fn(c, &a->m[i]);
            if (st) return st;
        }
    if (a->glu_fn) {
        if (a->n != 2 || a->m[0].n != a->m[1].n) return KILN_ERR_INVALID_ARG;
        kiln_glu_args g;
        g.gate = a->m[0].y;
        g.up = a->m[1].y;
        g.y = a->glu_y;
        g.t = a->m[0].t;
        g.n = a->m[0].n;
        g.gate_stride = a->m[0].y_stride;
        g.up_stride = a->m[1].y_stride;
        g.y_stride = a->glu_y_stride;
        g.act = a->act;
        return a->glu_fn(c, &g);
    }
    return KILN_OK;
}
