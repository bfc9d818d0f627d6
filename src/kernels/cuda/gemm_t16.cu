/*
 * gemm_t16.cu — the tensor-core GEMM on T16 weights (q4_0 / q8_0, kernels/cuda_t16.h) for
 * prefill and batched decode (docs/CUDA.md, "The T16 GEMM"): the weights are read once per
 * tile of 16-32 tokens instead of once per pass of 8 (the T16 gemv) or dequantized to f16
 * halves in scratch on every call (the cuBLAS path: 3 products, 4 bytes a weight written).
 *
 * Numerics: bit for bit those of the T16 gemv (gemv_t16.cu) for every token, whatever the
 * token count, so the two together stay batch invariant:
 *  - the activations split by kc_split4 per 32-block and token (the prep kernel below is
 *    xsplit_t16_kernel's arithmetic, stored per tile of 8 tokens);
 *  - per 32-block the quants as exact f16 integers (kc_mq::frag), four mma into fresh f32
 *    accumulators (hi then lo, as kc_mma_block), tot += d_row * inv_token * acc;
 *  - warp w of SW sums the superchunks w, w + SW, w + 2 SW, ... (SW = the gemv's warps per
 *    CTA for (dtype, k): kiln_cuda_t16_warps), the SW partial sums meet in shared memory in
 *    warp order, then + bias (kc_mma_store's order).
 * Each column of an mma is its own dot products, so which tokens share a tile changes no
 * bit of a token's result.
 *
 * Work split: a CTA owns G16_MT (2) T16 tiles (32 rows) and NT tiles of 8 tokens (16 or
 * 32 tokens); each warp keeps MT x NT x 4 accumulators per lane, loads its superchunk's
 * weights straight into A fragments (16 bytes a lane, the T16 layout's point) and the
 * activations' B fragments per 32-block and token tile (32 bytes a lane, L2-resident).
 * The grid's x runs over token groups (CTAs of the same rows next to each other share the
 * weights in L2), y over row pairs.
 *
 * Measured (session 10, H100, bench_cuda --gemm, the 8B's matmuls of a step in one graph,
 * q4_0): 16 tokens 5.3 ms (gemv passes of 8: 6.2), 64 tokens 15.0 ms (24.5), 512 tokens
 * 118 ms (196; cuBLAS on dequantized T16: 76 ms). So it serves up to 64 tokens
 * (cuda.gemm_t16.matmul) and, batch invariant, every size under the deterministic policy
 * (cuda.gemm_t16_any.matmul); prefill keeps cuBLAS (docs/CUDA.md, "The T16 GEMM").
 */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda_t16.h"
#include "kernels/select.h"
#include "kernels/spec.h"

#include <stdlib.h>
#include <string.h>

#define G16_MT 2 /* T16 tiles (16 rows each) per CTA */

template <int DT> struct g16_geom;
template <> struct g16_geom<KILN_DTYPE_Q4_0> { static constexpr int SCB = 1152, NQ = 2; };
template <> struct g16_geom<KILN_DTYPE_Q8_0> { static constexpr int SCB = 2176, NQ = 4; };

/* x rows (T tokens, stride xs) -> xf / inv per tile of 8 tokens: tokens 8 j .. 8 j + 7 of
 * 32-block b are "block" bt = j * (k / 32) + b of xsplit_t16_kernel's layout (hi / lo
 * halves of lane (token, tig) at ((bt * 8 + token % 8) * 4 + tig) * 32 bytes, the inverse
 * scale at inv[bt * 8 + token % 8]); the arithmetic is kc_split4's, as there. */
__global__ void xsplit_g16_kernel(const float *__restrict__ x, int64_t xs, int64_t k, int T,
                                  __half *__restrict__ xf, float *__restrict__ inv) {
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
    const int64_t bt = (int64_t)(t / 8) * (k / 32) + j / 8;
    const int q = (int)(j % 8), tg = q & 3, slot = (q >> 2) * 4;
    __half *o = xf + ((bt * 8 + t % 8) * 4 + tg) * 16;
    *(uint2 *)(o + slot) = *(const uint2 *)h;
    *(uint2 *)(o + 8 + slot) = *(const uint2 *)l;
    if ((lane & 7) == 0) inv[bt * 8 + t % 8] = 1.0f / sc;
}

/* 16 bytes of weights through L1 (the CTA's other warps and the next CTA of the same rows
 * read them too) */
__device__ __forceinline__ uint4 g16_ldw(const uint8_t *p) {
    return __ldg((const uint4 *)p);
}

template <int DT, int SW, int NT>
__global__ void __launch_bounds__(SW * 32, 1)
    gemm_t16_kernel(const uint8_t *__restrict__ W, int64_t n, int64_t k,
                    const uint4 *__restrict__ xf, const float *__restrict__ inv, int T,
                    float *__restrict__ y, int64_t ys, const float *__restrict__ bias) {
    constexpr int SCB = g16_geom<DT>::SCB, NQ = g16_geom<DT>::NQ, MT = G16_MT;
    using MQ = kc_mq<DT>;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    const int64_t nsc = k / KILN_CUDA_T16_K, nb = k / 32;
    const int64_t tiles = (n + 15) / 16, tile0 = (int64_t)blockIdx.y * MT;
    const int ntt = (T + 7) / 8, j0 = (int)blockIdx.x * NT; /* token tiles: all, this CTA's */
    int mlive = 0; /* this CTA's tiles that exist (the last pair may have one) */
#pragma unroll
    for (int m = 0; m < MT; m++) mlive += tile0 + m < tiles;
    float tot[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) tot[m][j][e] = 0.0f;
    const uint4 *xl = xf + (g * 4 + tig) * 2; /* + 64 per (token tile, block) */
    const float *il = inv + 2 * tig;          /* + 8 per (token tile, block)  */
    for (int64_t sc = w; sc < nsc; sc += SW) {
        uint4 q[MT][NQ], sd[MT];
#pragma unroll
        for (int m = 0; m < MT; m++) {
            /* a missing second tile reloads the first (an L1 hit; never used) */
            const uint8_t *c = W + ((size_t)(tile0 + (m < mlive ? m : 0)) * nsc + sc) * SCB;
#pragma unroll
            for (int i = 0; i < NQ; i++) q[m][i] = g16_ldw(c + i * 512 + lane * 16);
            sd[m] = g16_ldw(c + NQ * 512 + g * 16);
        }
#pragma unroll
        for (int bb = 0; bb < 4; bb++) {
            const int64_t b = sc * 4 + bb;
            uint32_t a0[MT][4], a1[MT][4];
            float dd[MT][2];
#pragma unroll
            for (int m = 0; m < MT; m++) {
                const uint32_t dw = bb == 0   ? sd[m].x
                                    : bb == 1 ? sd[m].y
                                    : bb == 2 ? sd[m].z
                                              : sd[m].w;
                MQ raw;
                raw.d[0] = (uint16_t)(dw & 0xFFFFu);
                raw.d[1] = (uint16_t)(dw >> 16);
                if constexpr (DT == KILN_DTYPE_Q4_0) {
                    const uint4 v = q[m][bb / 2];
                    raw.q[0] = bb % 2 ? v.z : v.x;
                    raw.q[1] = bb % 2 ? v.w : v.y;
                } else {
                    const uint4 v = q[m][bb];
                    raw.q[0][0] = v.x, raw.q[0][1] = v.y, raw.q[1][0] = v.z, raw.q[1][1] = v.w;
                }
                raw.frag(a0[m], a1[m], dd[m]);
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int jt = j0 + j;
                if (jt >= ntt) break; /* uniform */
                const int64_t bt = (int64_t)jt * nb + b;
                uint32_t bh[4] = {0u, 0u, 0u, 0u}, bl[4] = {0u, 0u, 0u, 0u};
                if (jt * 8 + g < T) { /* t16_xprep's zeros for a lane past the tokens */
                    const uint4 h = xl[bt * 64], l = xl[bt * 64 + 1];
                    bh[0] = h.x, bh[1] = h.y, bh[2] = h.z, bh[3] = h.w;
                    bl[0] = l.x, bl[1] = l.y, bl[2] = l.z, bl[3] = l.w;
                }
                const float2 iv = *(const float2 *)(il + bt * 8);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    if (m >= mlive) break; /* uniform */
                    /* kc_mma_block's four mma and epilogue, the A fragments shared */
                    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    kc_mma16816(acc, a0[m], bh[0], bh[1]);
                    kc_mma16816(acc, a1[m], bh[2], bh[3]);
                    kc_mma16816(acc, a0[m], bl[0], bl[1]);
                    kc_mma16816(acc, a1[m], bl[2], bl[3]);
                    tot[m][j][0] = fmaf(dd[m][0] * iv.x, acc[0], tot[m][j][0]);
                    tot[m][j][1] = fmaf(dd[m][0] * iv.y, acc[1], tot[m][j][1]);
                    tot[m][j][2] = fmaf(dd[m][1] * iv.x, acc[2], tot[m][j][2]);
                    tot[m][j][3] = fmaf(dd[m][1] * iv.y, acc[3], tot[m][j][3]);
                }
            }
        }
    }
    /* The SW partial sums in warp order (kc_mma_store's), 2 token tiles (16 values a lane)
     * at a time: red[warp][value][lane] */
    __shared__ float red[SW][MT * 2 * 4][32];
#pragma unroll
    for (int h = 0; h < NT / 2; h++) {
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    red[w][(m * 2 + j) * 4 + e][lane] = tot[m][2 * h + j][e];
        __syncthreads();
        for (int i = threadIdx.x; i < MT * 2 * 4 * 32; i += SW * 32) {
            const int v = i / 32, ln = i % 32, m = v / 8, j = (v / 4) % 2, e = v % 4;
            float s = red[0][v][ln];
#pragma unroll
            for (int ww = 1; ww < SW; ww++) s += red[ww][v][ln];
            const int64_t row = (tile0 + m) * 16 + (ln >> 2) + (e >= 2 ? 8 : 0);
            const int64_t tok = (int64_t)(j0 + 2 * h + j) * 8 + 2 * (ln & 3) + (e & 1);
            if (row < n && tok < T) y[tok * ys + row] = s + (bias ? bias[row] : 0.0f);
        }
        __syncthreads();
    }
}

/* ---- version 2: warps split rows, the activations staged once per CTA ----
 *
 * Version 1 above has the gemv's shape (the SW warps of a CTA split k, each reads its own
 * B fragments from L2): 8B prefill ran at 4.5k tok/s of matmuls (session 10 run 1), by
 * the estimate bound by L2 (each warp's 32 tokens x 32 columns of split x, 4 KB a 32-block,
 * feed only 32 rows; not profiled). Here a CTA's WN warps own G16_MT tiles each (128 or 256 rows)
 * and share one copy of the superchunk's B fragments in shared memory (cp.async, double-buffered;
 * the weights of the next superchunk are loaded into registers while this one computes); each warp
 * walks the gemv's SW partial sums itself: superchunks p, p + SW, ... into tot, then
 * S = tot (p = 0) or S += tot, in the order p = 0 .. SW - 1 (empty partials add 0.0f, as
 * the gemv's idle warps do), then y = S + bias: the operations of kc_mma_store on the same
 * values, so the same bits. Measured (session 10 run 2, bench_cuda --gemm, 8B q4_0 matmuls
 * of a step): slower than version 1 at every size, 4.9x at 16 tokens, 1.14x at 512: each
 * warp walks all of k, one barrier and cp.async wait per superchunk, 4-8 warps per SM at
 * 219-242 registers: latency-bound. Kept for A/B runs (KILN_G16_V=2); the default is
 * version 1. */

/* The superchunk after sc in the walk (partial p = sc % SW: sc + SW, else the next
 * partial's first), -1 at the end */
__device__ __forceinline__ int64_t g2_next(int64_t sc, int64_t nsc, int sw) {
    if (sc + sw < nsc) return sc + sw;
    const int64_t p = sc % sw + 1;
    return p < sw && p < nsc ? p : -1;
}

template <int DT, int NT> struct g2_smem {
    uint4 x[2][4][NT][64]; /* [buffer][block][token tile][hi words of lanes 0..31, lo ...] */
    float iv[2][4][NT][8]; /* inverse scales of the 8 tokens */
};

template <int DT, int NT, int WN>
__global__ void __launch_bounds__(WN * 32, 1)
    gemm2_t16_kernel(const uint8_t *__restrict__ W, int64_t n, int64_t k,
                     const uint4 *__restrict__ xf, const float *__restrict__ inv, int T,
                     float *__restrict__ y, int64_t ys, const float *__restrict__ bias, int sw) {
    constexpr int SCB = g16_geom<DT>::SCB, NQ = g16_geom<DT>::NQ, MT = G16_MT;
    using MQ = kc_mq<DT>;
    __shared__ g2_smem<DT, NT> sm;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tig = lane & 3;
    const int64_t nsc = k / KILN_CUDA_T16_K, nb = k / 32;
    const int64_t tiles = (n + 15) / 16, tw = (int64_t)blockIdx.y * (WN * MT) + w * MT;
    const int ntt = (T + 7) / 8, j0 = (int)blockIdx.x * NT;
    const int nj = ntt - j0 < NT ? ntt - j0 : NT; /* this CTA's token tiles */
    int mlive = 0;
#pragma unroll
    for (int m = 0; m < MT; m++) mlive += tw + m < tiles;
    /* stage superchunk sc's activations: 4 blocks x nj tiles x 64 words, then the scales */
    auto stage = [&](int64_t sc, int bf) {
        for (int i = tid; i < 4 * NT * 64; i += WN * 32) {
            const int blk = i / (NT * 64), jt = (i / 64) % NT, u = i % 64;
            if (jt < nj)
                kc_cp16(&sm.x[bf][blk][jt][(u & 1) * 32 + (u >> 1)],
                        xf + ((int64_t)(j0 + jt) * nb + sc * 4 + blk) * 64 + u);
        }
        if (tid < 4 * NT * 2) {
            const int blk = tid / (NT * 2), jt = (tid / 2) % NT, hf = tid % 2;
            if (jt < nj)
                kc_cp16(&sm.iv[bf][blk][jt][hf * 4],
                        inv + ((int64_t)(j0 + jt) * nb + sc * 4 + blk) * 8 + hf * 4);
        }
    };
    auto wload = [&](int64_t sc, uint4(&q)[MT][NQ], uint4(&sd)[MT]) {
#pragma unroll
        for (int m = 0; m < MT; m++) {
            const uint8_t *c = W + ((size_t)(tw + (m < mlive ? m : 0)) * nsc + sc) * SCB;
            if (mlive > 0) {
#pragma unroll
                for (int i = 0; i < NQ; i++) q[m][i] = __ldg((const uint4 *)(c + i * 512) + lane);
                sd[m] = __ldg((const uint4 *)(c + NQ * 512) + g);
            }
        }
    };
    float S[MT][NT][4], tot[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) S[m][j][e] = 0.0f, tot[m][j][e] = 0.0f;
    uint4 q[MT][NQ], sd[MT], qn[MT][NQ], sdn[MT];
    int64_t sc = 0;
    int bf = 0;
    stage(0, 0);
    kc_cp_commit();
    wload(0, q, sd);
    while (sc >= 0) {
        const int64_t nx = g2_next(sc, nsc, sw);
        if (nx >= 0) {
            stage(nx, bf ^ 1);
            wload(nx, qn, sdn);
        }
        kc_cp_commit();
        kc_cp_wait<1>();
        __syncthreads();
#pragma unroll
        for (int bb = 0; bb < 4; bb++) {
            uint32_t a0[MT][4], a1[MT][4];
            float dd[MT][2];
#pragma unroll
            for (int m = 0; m < MT; m++) {
                const uint32_t dw = bb == 0   ? sd[m].x
                                    : bb == 1 ? sd[m].y
                                    : bb == 2 ? sd[m].z
                                              : sd[m].w;
                MQ raw;
                raw.d[0] = (uint16_t)(dw & 0xFFFFu);
                raw.d[1] = (uint16_t)(dw >> 16);
                if constexpr (DT == KILN_DTYPE_Q4_0) {
                    const uint4 v = q[m][bb / 2];
                    raw.q[0] = bb % 2 ? v.z : v.x;
                    raw.q[1] = bb % 2 ? v.w : v.y;
                } else {
                    const uint4 v = q[m][bb];
                    raw.q[0][0] = v.x, raw.q[0][1] = v.y, raw.q[1][0] = v.z, raw.q[1][1] = v.w;
                }
                raw.frag(a0[m], a1[m], dd[m]);
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                if (j >= nj) break; /* uniform */
                uint32_t bh[4] = {0u, 0u, 0u, 0u}, bl[4] = {0u, 0u, 0u, 0u};
                if ((j0 + j) * 8 + g < T) { /* t16_xprep's zeros for a lane past the tokens */
                    const uint4 h = sm.x[bf][bb][j][lane], l = sm.x[bf][bb][j][32 + lane];
                    bh[0] = h.x, bh[1] = h.y, bh[2] = h.z, bh[3] = h.w;
                    bl[0] = l.x, bl[1] = l.y, bl[2] = l.z, bl[3] = l.w;
                }
                const float2 iv = *(const float2 *)&sm.iv[bf][bb][j][2 * tig];
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    if (m >= mlive) break; /* uniform */
                    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    kc_mma16816(acc, a0[m], bh[0], bh[1]);
                    kc_mma16816(acc, a1[m], bh[2], bh[3]);
                    kc_mma16816(acc, a0[m], bl[0], bl[1]);
                    kc_mma16816(acc, a1[m], bl[2], bl[3]);
                    tot[m][j][0] = fmaf(dd[m][0] * iv.x, acc[0], tot[m][j][0]);
                    tot[m][j][1] = fmaf(dd[m][0] * iv.y, acc[1], tot[m][j][1]);
                    tot[m][j][2] = fmaf(dd[m][1] * iv.x, acc[2], tot[m][j][2]);
                    tot[m][j][3] = fmaf(dd[m][1] * iv.y, acc[3], tot[m][j][3]);
                }
            }
        }
        __syncthreads();                    /* the buffer is restaged two superchunks on */
        if (nx < 0 || nx % sw != sc % sw) { /* partial sc % sw is complete: into S in order */
            const bool first = sc % sw == 0;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        S[m][j][e] = first ? tot[m][j][e] : S[m][j][e] + tot[m][j][e];
                        tot[m][j][e] = 0.0f;
                    }
        }
#pragma unroll
        for (int m = 0; m < MT; m++) {
            sd[m] = sdn[m];
#pragma unroll
            for (int i = 0; i < NQ; i++) q[m][i] = qn[m][i];
        }
        sc = nx;
        bf ^= 1;
    }
    /* the gemv's idle warps (partials past the last superchunk) add their 0.0f */
    for (int64_t p = nsc; p < sw; p++)
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) S[m][j][e] += 0.0f;
#pragma unroll
    for (int m = 0; m < MT; m++) {
        if (m >= mlive) break;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            if (j >= nj) break;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t row = (tw + m) * 16 + g + (e >= 2 ? 8 : 0);
                const int64_t tok = (int64_t)(j0 + j) * 8 + 2 * tig + (e & 1);
                if (row < n && tok < T) y[tok * ys + row] = S[m][j][e] + (bias ? bias[row] : 0.0f);
            }
        }
    }
}

/* ---- host side ---- */

/* The GEMM from this many tokens per call (fewer: the T16 gemv, bitwise the same);
 * KILN_CUDA_OLD_GEMM=1 or kiln_cuda_gemm_t16_set(0): never (passes of 8 at every size,
 * the A/B switch of docs/PERF_GPU.md session 10). */
#define G16_MIN_T 12
#define G16_CHUNK 512 /* most tokens split per prep launch (the workspace holds them) */
static int kc_gemm_on = -1, kc_gemm_v = 0;
extern "C" void kiln_cuda_gemm_t16_set(int on) {
    kc_gemm_on = on ? 1 : 0;
}
/* 1: version 1 (warps split k: the default), 2: version 2 (warps split rows; slower at
 * every size measured, session 10 run 2: kept for A/B runs); 0: by the environment,
 * KILN_G16_V=2 (else 1) */
extern "C" void kiln_cuda_gemm_t16_variant(int v) {
    kc_gemm_v = v == 1 || v == 2 ? v : 0;
}
static int gemm_v(void) {
    if (!kc_gemm_v) {
        const char *e = getenv("KILN_G16_V");
        kc_gemm_v = e && e[0] == '2' ? 2 : 1;
    }
    return kc_gemm_v;
}
/* The version for a matmul (version 1 takes SW 4, 8 or 16 only; the gemv's split for k
 * <= 16384 at the default settings). Same values either way. */
static int gemm_v_for(int sw) {
    return sw != 4 && sw != 8 && sw != 16 ? 2 : gemm_v();
}

static bool gemm_on(void) {
    if (kc_gemm_on < 0) {
        const char *e = getenv("KILN_CUDA_OLD_GEMM");
        kc_gemm_on = e && e[0] == '1' ? 0 : 1;
    }
    return kc_gemm_on != 0;
}

/* scratch for ch tokens (a multiple of 8): the halves and the inverse scales */
static size_t g16_bytes(int64_t k, int64_t ch) {
    return (size_t)ch * (size_t)k * 4 + (size_t)ch * (size_t)(k / 32) * sizeof(float);
}

extern "C" size_t kiln_cuda_gemm_t16_workspace(const struct kiln_sel_ctx *ctx) {
    const size_t gemv = kiln_cuda_gemv_workspace(ctx);
    if (ctx->k <= 0) return gemv;
    int64_t ch = ctx->tokens_max < G16_CHUNK ? ctx->tokens_max : G16_CHUNK;
    ch = (ch + 7) / 8 * 8;
    const size_t g = g16_bytes(ctx->k, ch) + 256;
    return g > gemv ? g : gemv;
}

template <int DT, int SW>
static void launch_g16(cudaStream_t s, const kiln_matmul_args *a, const uint4 *xf, const float *inv,
                       int T, float *y) {
    const unsigned pairs = (unsigned)(((a->n + 15) / 16 + G16_MT - 1) / G16_MT);
    const int ntt = (T + 7) / 8;
    if (ntt <= 2) {
        gemm_t16_kernel<DT, SW, 2><<<dim3(1, pairs), SW * 32, 0, s>>>(
            (const uint8_t *)a->w, a->n, a->k, xf, inv, T, y, a->y_stride, a->bias);
    } else {
        gemm_t16_kernel<DT, SW, 4><<<dim3((unsigned)((ntt + 3) / 4), pairs), SW * 32, 0, s>>>(
            (const uint8_t *)a->w, a->n, a->k, xf, inv, T, y, a->y_stride, a->bias);
    }
}

template <int DT>
static void launch_g16_dt(cudaStream_t s, const kiln_matmul_args *a, int sw, const uint4 *xf,
                          const float *inv, int T, float *y) {
    if (gemm_v_for(sw) == 2) {
        const int64_t tiles = (a->n + 15) / 16;
        const int ntt = (T + 7) / 8;
        const unsigned gx = (unsigned)(ntt <= 2 ? 1 : (ntt + 3) / 4);
        const unsigned r8 = (unsigned)((tiles + 15) / 16), r4 = (unsigned)((tiles + 7) / 8);
        const bool w8 = (int64_t)r8 * gx >= 2 * (int64_t)kc_device_sms();
#define KC_G2(NTV, WNV)                                                                            \
    gemm2_t16_kernel<DT, NTV, WNV><<<dim3(gx, WNV == 8 ? r8 : r4), WNV * 32, 0, s>>>(              \
        (const uint8_t *)a->w, a->n, a->k, xf, inv, T, y, a->y_stride, a->bias, sw)
        if (ntt <= 2) {
            if (w8)
                KC_G2(2, 8);
            else
                KC_G2(2, 4);
        } else if (w8)
            KC_G2(4, 8);
        else
            KC_G2(4, 4);
#undef KC_G2
        return;
    }
    if (sw == 16)
        launch_g16<DT, 16>(s, a, xf, inv, T, y);
    else if (sw == 8)
        launch_g16<DT, 8>(s, a, xf, inv, T, y);
    else
        launch_g16<DT, 4>(s, a, xf, inv, T, y);
}

static bool g16_ok(const kiln_matmul_args *a) {
    return a->w_layout == KILN_WLAYOUT_CUDA_T16 &&
           (a->w_dtype == KILN_DTYPE_Q4_0 || a->w_dtype == KILN_DTYPE_Q8_0) && a->k > 0 &&
           a->k % KILN_CUDA_T16_K == 0 && ((uintptr_t)a->w & 15) == 0 &&
           ((uintptr_t)a->x & 15) == 0 && (a->x_stride & 3) == 0 && a->n > 0 &&
           ((a->n + 15) / 16 + G16_MT - 1) / G16_MT <= 65535 && a->k <= (int64_t)1 << 24;
}

/* Tokens per chunk the scratch holds (a multiple of 8, at most G16_CHUNK); 0: none */
static int64_t g16_chunk(const kiln_kctx *c, int64_t k, int64_t t) {
    if (!c || !c->scratch || ((uintptr_t)c->scratch & 15)) return 0;
    int64_t ch = t < G16_CHUNK ? (t + 7) / 8 * 8 : G16_CHUNK;
    while (ch >= 8 && g16_bytes(k, ch) > c->scratch_size) ch -= 8;
    return ch >= 8 ? ch : 0;
}

/* Whether the GEMM runs these matmuls (same k, t, x: checked by the callers); else the
 * T16 gemv does (bitwise the same values) */
static bool g16_use(const kiln_kctx *c, const kiln_matmul_args *m, int nm) {
    if (!gemm_on() || m[0].t < G16_MIN_T) return false;
    const int sw = kiln_cuda_t16_warps(m[0].w_dtype, m[0].k);
    for (int i = 0; i < nm; i++)
        if (!g16_ok(&m[i]) || kiln_cuda_t16_warps(m[i].w_dtype, m[i].k) != sw) return false;
    return g16_chunk(c, m[0].k, m[0].t) >= 8;
}

/* matmuls m[0..nm) sharing x (one split per chunk of tokens), then one GEMM each */
static kiln_status g16_run(const kiln_kctx *c, const kiln_matmul_args *m, int nm) {
    const int64_t k = m[0].k, t = m[0].t, ch = g16_chunk(c, k, t);
    const int sw = kiln_cuda_t16_warps(m[0].w_dtype, k);
    cudaStream_t s = KC_STREAM(c);
    __half *xf = (__half *)c->scratch;
    float *inv = (float *)(xf + (size_t)ch * (size_t)k * 2);
    for (int64_t t0 = 0; t0 < t; t0 += ch) {
        const int T = (int)(t - t0 < ch ? t - t0 : ch);
        const int64_t thr = (int64_t)T * (k / 4);
        xsplit_g16_kernel<<<(unsigned)((thr + 255) / 256), 256, 0, s>>>(
            m[0].x + t0 * m[0].x_stride, m[0].x_stride, k, T, xf, inv);
        for (int i = 0; i < nm; i++) {
            float *y = m[i].y + t0 * m[i].y_stride;
            if (m[i].w_dtype == KILN_DTYPE_Q4_0)
                launch_g16_dt<KILN_DTYPE_Q4_0>(s, &m[i], sw, (const uint4 *)xf, inv, T, y);
            else
                launch_g16_dt<KILN_DTYPE_Q8_0>(s, &m[i], sw, (const uint4 *)xf, inv, T, y);
        }
    }
    return kc_launched();
}

/* cuda.gemm_t16.matmul: the GEMM from G16_MIN_T tokens, the T16 gemv below (and for
 * what the GEMM does not take: q4_K / q6_K, plain rows, too little scratch) */
extern "C" kiln_status kiln_cuda_matmul_t16_gemm(const kiln_kctx *c, const kiln_matmul_args *a) {
    if (a->t <= 0 || a->n <= 0) return KILN_OK;
    if (!g16_use(c, a, 1)) return kiln_cuda_matmul_t16(c, a);
    return g16_run(c, a, 1);
}

/* A matmul group whose members all run kiln_cuda_matmul_t16_gemm: one split of x per chunk
 * and a GEMM per member; below G16_MIN_T tokens the T16 gemv's group launch.
 * KILN_ERR_UNSUPPORTED: not such a group (the caller runs the members one by one). */
extern "C" kiln_status kiln_cuda_matmul_t16_gemm_group(const kiln_kctx *c,
                                                       const kiln_matmul_args *m, int nm) {
    if (nm < 1 || nm > KILN_MATMUL_GROUP_MAX) return KILN_ERR_UNSUPPORTED;
    for (int i = 0; i < nm; i++)
        if (m[i].k != m[0].k || m[i].t != m[0].t || m[i].x != m[0].x ||
            m[i].x_stride != m[0].x_stride || m[i].t <= 0)
            return KILN_ERR_UNSUPPORTED;
    if (!g16_use(c, m, nm)) return kiln_cuda_matmul_t16_group(c, m, nm);
    return g16_run(c, m, nm);
}
