/*
 * gemv_t16.cu — the tensor-core gemv on the T16 weight layout (kernels/cuda_t16.h): q4_0 /
 * q8_0 weights read straight from global memory into the mma.sync m16n8k16 A fragments,
 * 16 bytes per lane and load, no shared-memory staging (the staged gemv of matmul.cu was
 * latency-bound at 32-37 % of DRAM bandwidth: 29-46 KB of shared memory per CTA held
 * occupancy at 25-44 %, docs/CUDA.md).
 *
 * Numerics: those of matmul.cu's tensor-core gemv (docs/CUDA.md, "split f16"): the quants
 * as exact f16 integers (kc_mq: PRMT + HSUB2, the 0x6400 magic number), the activations
 * as hi + lo f16 halves of each 32-block scaled by its own power of two (the prep kernel
 * below: xsplit_kernel's arithmetic, stored in fragment order), four mma per 32-block
 * into fresh f32 accumulators, then tot += d_row * acc * inv_token in f32 (kc_mma_block).
 *
 * Work split: one CTA per 16-row tile; its SW warps split the tile's k / 128 superchunks
 * (warp w takes w, w + SW, ...), each warp issuing the loads of U superchunks (q4_0: 3
 * x 16 bytes per lane each, q8_0: 5) before the first mma (SW = 16 for k >= 4096; U = 2,
 * or 1 with FS: t16_split); the warps' partial sums meet in shared memory in warp order
 * (kc_mma_store). SW depends on (dtype, k) only (U does not change the order), never on
 * the token count: a token's sums are computed in the same order whatever else shares the
 * pass (batch invariant; each token is its own mma column). Tokens: passes of up to 8 (the
 * mma's n = 8).
 *
 * Session 9 (docs/CUDA.md "Decode fusion"): a pass of one token splits x inside the gemv
 * (FS: no prep launch); a matmul group's members sharing x run as one launch per dtype
 * (t16_jobs); the gemv is a programmatic dependent launch (t16_pdl_start). Session 18:
 * q4_0 prefetches each warp's next superchunk into L2 (t16_pf).
 */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda_t16.h"
#include "kernels/select.h"
#include "kernels/spec.h"

#include <stdlib.h>
#include <string.h>

/* x rows (T <= 8, stride xs) -> xf: per 32-block b, token t and lane column tig the 8 hi
 * halves then the 8 lo halves the lane's B fragments hold (elements 4 tig .. + 3 and
 * 16 + 4 tig .. + 3 of the block; E8, the f16 rows' order: 8 tig .. 8 tig + 7), 32 bytes
 * at ((b * 8 + t) * 4 + tig) * 32; inv[b * 8 + t]
 * the block's inverse scale. The arithmetic is xsplit_kernel's (matmul.cu). xsum (q4_K's
 * min term; NULL: not written): xsum[b * 8 + t] = the f32 sum of the block's 32 x, in an
 * order that depends on nothing but the block (batch invariant). */
template <bool E8>
__global__ void xsplit_t16_kernel(const float *__restrict__ x, int64_t xs, int64_t k, int T,
                                  __half *__restrict__ xf, float *__restrict__ inv,
                                  float *__restrict__ xsum) {
    kc_pdl_trigger();
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
    const int64_t b = j / 8;
    /* E8 (f16 rows): lane tig holds elements 8 tig .. 8 tig + 7 of the block */
    const int q = (int)(j % 8), tg = E8 ? q >> 1 : q & 3, slot = E8 ? (q & 1) * 4 : (q >> 2) * 4;
    __half *o = xf + ((b * 8 + t) * 4 + tg) * 16;
    *(uint2 *)(o + slot) = *(const uint2 *)h;
    *(uint2 *)(o + 8 + slot) = *(const uint2 *)l;
    if ((lane & 7) == 0) inv[b * 8 + t] = 1.0f / sc;
    if (xsum) { /* uniform per launch */
        float sum = (v.x + v.y) + (v.z + v.w);
        sum += __shfl_xor_sync(gmask, sum, 1);
        sum += __shfl_xor_sync(gmask, sum, 2);
        sum += __shfl_xor_sync(gmask, sum, 4);
        if ((lane & 7) == 0) xsum[b * 8 + t] = sum;
    }
}

/* 16 bytes of weights: read once, not kept in L1 (the activations are) */
__device__ __forceinline__ uint4 kc_ldw(const uint8_t *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

/* The matrices of one launch (a matmul group's members of one dtype and k sharing x: q, k,
 * v or gate, up; or one matmul): member i owns the launch's tiles [sum of the tiles before
 * it, + tiles). Each tile's arithmetic is that of a launch of its member alone. */
#define T16_JOBS 3
struct t16_job {
    const uint8_t *W;
    float *y;
    const float *bias;
    int64_t n, ys;
    int64_t rs; /* f16 rows (gemv_f16r_kernel): the row stride in bytes */
    unsigned tiles;
};
struct t16_jobs {
    t16_job m[T16_JOBS];
    int pf; /* gemv_t16_kernel: L2 prefetch this many rounds ahead (t16_pf; 0: none) */
};

/* this CTA's member and tile (uniform per CTA): its weights first, its outputs at the
 * end (read from the parameters again there rather than kept in registers) */
__device__ __forceinline__ int t16_member(const t16_jobs &J, int64_t *tile) {
    unsigned b = blockIdx.x;
    if (b < J.m[0].tiles) return *tile = b, 0;
    b -= J.m[0].tiles;
    if (b < J.m[1].tiles) return *tile = b, 1;
    return *tile = b - J.m[1].tiles, 2;
}
__device__ __forceinline__ const uint8_t *t16_w(const t16_jobs &J, int64_t *tile) {
    const int m = t16_member(J, tile);
    return m == 0 ? J.m[0].W : m == 1 ? J.m[1].W : J.m[2].W;
}
template <int SW>
__device__ __forceinline__ void t16_store(const t16_jobs &J, float (*red)[32][4],
                                          const float tot[4], int w, int lane, int T) {
    int64_t tile;
    const int m = t16_member(J, &tile);
    const t16_job &o = m == 0 ? J.m[0] : m == 1 ? J.m[1] : J.m[2];
    kc_mma_store<SW>(red, tot, w, lane, tile * 16, o.n, T, o.y, o.ys, o.bias);
}

/* Programmatic dependent launch (launch_jobs with pdl): the weights of the CTA's first
 * round into L2 (they never depend on the kernel before), then the wait for that kernel's
 * writes (x, or xf); and let the next kernel start early. Without the launch attribute the
 * wait returns at once. */
__device__ __forceinline__ void t16_pdl_start(const uint8_t *tb, int64_t bytes) {
    kc_pdl_trigger();
    if (threadIdx.x == 0) kc_prefetch_l2(tb, (uint32_t)bytes);
    kc_pdl_wait();
}

/* The fused split (FS: passes of one token): each warp splits the 128 columns of x it
 * needs next itself, lane l holding elements 4 l .. 4 l + 3 (32-block l / 8: kc_split4's
 * 8-lane groups, the arithmetic of xsplit_t16_kernel), and hands each 32-block's B
 * fragments to the lanes of token 0 (g = 0) by shuffles: no prep launch, no xf round trip.
 * The other lanes' columns (tokens 1..7) get copies of token 0's: their results are
 * computed and never stored (each column of an mma is its own dot products). */
struct t16_xs {
    uint32_t h0, h1, l0, l1; /* this lane's hi / lo halves (two words each)   */
    float inv, sum;          /* its 32-block's inverse scale, f32 sum of x     */
};
__device__ __forceinline__ float4 t16_xload(const float *__restrict__ x4c, int lane) {
    return __ldg((const float4 *)x4c + lane);
}
template <bool SUM> __device__ __forceinline__ t16_xs t16_xsplit(const float4 v, int lane) {
    const unsigned gmask = 0xFFu << (lane & ~7);
    __half2 h[2], l[2];
    const float sc = kc_split4(v, gmask, h, l);
    t16_xs r;
    r.h0 = *(const uint32_t *)&h[0], r.h1 = *(const uint32_t *)&h[1];
    r.l0 = *(const uint32_t *)&l[0], r.l1 = *(const uint32_t *)&l[1];
    r.inv = 1.0f / sc;
    r.sum = 0.0f;
    if constexpr (SUM) { /* xsplit_t16_kernel's order */
        float sum = (v.x + v.y) + (v.z + v.w);
        sum += __shfl_xor_sync(gmask, sum, 1);
        sum += __shfl_xor_sync(gmask, sum, 2);
        sum += __shfl_xor_sync(gmask, sum, 4);
        r.sum = sum;
    }
    return r;
}
/* 32-block q (0..3) of a t16_xsplit: the B fragments of lane tig (elements 4 tig .. + 3 and
 * 16 + 4 tig .. + 3 of the block; E8, the f16 rows' order: 8 tig .. 8 tig + 7) */
template <bool E8 = false>
__device__ __forceinline__ void t16_xfrag(const t16_xs &s, int q, int tig, uint32_t bh[4],
                                          uint32_t bl[4], float2 *iv) {
    const int a = q * 8 + (E8 ? 2 * tig : tig), b = a + (E8 ? 1 : 4);
    bh[0] = __shfl_sync(0xFFFFFFFFu, s.h0, a), bh[1] = __shfl_sync(0xFFFFFFFFu, s.h1, a);
    bh[2] = __shfl_sync(0xFFFFFFFFu, s.h0, b), bh[3] = __shfl_sync(0xFFFFFFFFu, s.h1, b);
    bl[0] = __shfl_sync(0xFFFFFFFFu, s.l0, a), bl[1] = __shfl_sync(0xFFFFFFFFu, s.l1, a);
    bl[2] = __shfl_sync(0xFFFFFFFFu, s.l0, b), bl[3] = __shfl_sync(0xFFFFFFFFu, s.l1, b);
    const float i = __shfl_sync(0xFFFFFFFFu, s.inv, q * 8);
    *iv = make_float2(i, i);
}

template <int DT> struct t16_geom;
template <> struct t16_geom<KILN_DTYPE_Q4_0> { static constexpr int SCB = 1152, NQ = 2; };
template <> struct t16_geom<KILN_DTYPE_Q8_0> { static constexpr int SCB = 2176, NQ = 4; };

/* Block b's prepared activation fragments (the prep launch's hi / lo halves at xp, the
 * block's inverse scales at ip) for a lane; zeros for a lane past the pass's tokens. */
__device__ __forceinline__ void t16_xprep(const uint4 *xp, const float *ip, int64_t b, bool live,
                                          uint32_t bh[4], uint32_t bl[4], float2 *iv) {
    if (live) {
        const uint4 h = xp[b * 64], l = xp[b * 64 + 1];
        bh[0] = h.x, bh[1] = h.y, bh[2] = h.z, bh[3] = h.w;
        bl[0] = l.x, bl[1] = l.y, bl[2] = l.z, bl[3] = l.w;
    }
    *iv = *(const float2 *)(ip + b * 8);
}

/* FS: at most 64 registers (two CTAs of 16 warps per SM, as without FS) */
template <int DT, int SW, int U, bool FS>
__global__ void __launch_bounds__(SW * 32, FS &&SW <= 16 ? 1024 / (SW * 32) : 1)
    gemv_t16_kernel(const t16_jobs J, int64_t k, const float *__restrict__ x,
                    const uint4 *__restrict__ xf, const float *__restrict__ inv, int T) {
    constexpr int SCB = t16_geom<DT>::SCB, NQ = t16_geom<DT>::NQ;
    using MQ = kc_mq<DT>;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    const int64_t nsc = k / KILN_CUDA_T16_K;
    int64_t tile;
    const uint8_t *tb = t16_w(J, &tile);
    tb += (size_t)tile * (size_t)nsc * SCB;
    t16_pdl_start(tb, (nsc < SW * U ? nsc : SW * U) * SCB);
    const bool live = g < T;
    const uint4 *xp = xf + ((live ? g : 0) * 4 + tig) * 2; /* + 64 per block */
    const float *ip = inv + 2 * tig;                       /* + 8 per block */
    float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t s0 = w; s0 < nsc; s0 += (int64_t)SW * U) {
        /* the warp's superchunks pf rounds ahead into L2, one 128-byte line a lane (session
         * 18: q4_0 at pf = 1, t16_pf) */
        if (J.pf > 0 && lane < SCB / 128) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t sa = s0 + (int64_t)J.pf * SW * U + (int64_t)u * SW;
                if (sa < nsc) kc_prefetch_line_l2(tb + (size_t)sa * SCB + lane * 128);
            }
        }
        uint4 q[U][NQ], sd[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t sc = s0 + (int64_t)u * SW;
            /* a superchunk past the tile reloads the round's first (an L2 hit, in flight
             * with it; U = 4 x 16 warps on k = 4096 does that for half its loads: 4.23 vs
             * 3.30 ms at U = 2, device run 1). Skipping the load instead made the
             * compiler keep every load in flight at 68-88 registers: half the CTAs per SM
             * of the measured 64. */
            const uint8_t *c = tb + (size_t)(sc < nsc ? sc : s0) * SCB;
#pragma unroll
            for (int i = 0; i < NQ; i++) q[u][i] = kc_ldw(c + i * 512 + lane * 16);
            sd[u] = kc_ldw(c + NQ * 512 + g * 16);
        }
        float4 xv[U]; /* FS: x loaded with the weights, split superchunk by superchunk */
        if constexpr (FS) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t sc = s0 + (int64_t)u * SW;
                xv[u] = t16_xload(x + (sc < nsc ? sc : s0) * KILN_CUDA_T16_K, lane);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t sc = s0 + (int64_t)u * SW;
            if (sc >= nsc) break;
            t16_xs xs;
            if constexpr (FS) xs = t16_xsplit<false>(xv[u], lane);
#pragma unroll
            for (int bb = 0; bb < 4; bb++) {
                const int64_t b = sc * 4 + bb;
                uint32_t bh[4] = {0u, 0u, 0u, 0u}, bl[4] = {0u, 0u, 0u, 0u};
                float2 iv;
                if constexpr (FS) {
                    t16_xfrag(xs, bb, tig, bh, bl, &iv);
                } else {
                    t16_xprep(xp, ip, b, live, bh, bl, &iv);
                }
                const uint32_t dw = bb == 0   ? sd[u].x
                                    : bb == 1 ? sd[u].y
                                    : bb == 2 ? sd[u].z
                                              : sd[u].w;
                MQ raw;
                raw.d[0] = (uint16_t)(dw & 0xFFFFu);
                raw.d[1] = (uint16_t)(dw >> 16);
                if constexpr (DT == KILN_DTYPE_Q4_0) {
                    const uint4 v = q[u][bb / 2];
                    raw.q[0] = bb % 2 ? v.z : v.x;
                    raw.q[1] = bb % 2 ? v.w : v.y;
                } else {
                    const uint4 v = q[u][bb];
                    raw.q[0][0] = v.x, raw.q[0][1] = v.y, raw.q[1][0] = v.z, raw.q[1][1] = v.w;
                }
                /* all four sums also under FS: the token-0-only epilogue (ONE) measured
                 * 2 % slower end to end on q4_0 / q8_0 (session 11 run 3) */
                kc_mma_block(raw, bh, bl, iv, tot);
            }
        }
    }
    __shared__ float red[SW][32][4];
    t16_store<SW>(J, red, tot, w, lane, T);
}

/* f16 weights (session 11) in their plain rows, with the kernel above's structure: one CTA
 * per 16-row tile, its SW warps splitting the tile's k / 128 superchunks of 128 columns,
 * the split of x fused for a pass of one token (FS), the groups' launches, PDL. No repack:
 * an f16 row's 32-block is 64 bytes, so lane (g, tig) loads the 16 bytes at 16 tig of rows
 * g and g + 8 (elements 8 tig .. 8 tig + 7: one mma's A words x, y and the next's z, w,
 * kc_mq<F16>'s order) and the activations come in the same order (E8: t16_xfrag<true>,
 * xsplit_t16_kernel<true>); a load instruction covers 64 contiguous bytes of 8 rows (two
 * whole sectors each) and a warp's superchunk 256 contiguous bytes of each of its 16 rows.
 * The weights stay what cuBLAS reads in prefill (a T16 repack would need a copy back for
 * cuBLAS, or 2 bytes a weight written per prefill call). Rows past n (a partial last tile)
 * read row n - 1 and are never stored. Numerics: the quantized kernels' with d = 1 (the
 * weight is its own exact f16: two products per 32-block on the split-f16 x, f32
 * accumulation per block, tot += inv acc); the order depends on (n, k) only. MB: CTAs per
 * SM the registers must allow (FS: two of 16 warps by default, 64 registers, 40 bytes
 * spilled; kiln_cuda_f16r_occupancy(1) / KILN_F16R_MB=1: one, no cap). */
template <int SW, int U, bool FS, int MB>
__global__ void __launch_bounds__(SW * 32, MB)
    gemv_f16r_kernel(const t16_jobs J, int64_t k, const float *__restrict__ x,
                     const uint4 *__restrict__ xf, const float *__restrict__ inv, int T) {
    using MQ = kc_mq<KILN_DTYPE_F16>;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    const int64_t nsc = k / KILN_CUDA_T16_K;
    int64_t tile;
    const int m = t16_member(J, &tile);
    const uint8_t *W = m == 0 ? J.m[0].W : m == 1 ? J.m[1].W : J.m[2].W;
    const int64_t n = m == 0 ? J.m[0].n : m == 1 ? J.m[1].n : J.m[2].n;
    const int64_t rs = m == 0 ? J.m[0].rs : m == 1 ? J.m[1].rs : J.m[2].rs;
    const int64_t r0 = tile * 16;
    kc_pdl_trigger(); /* t16_pdl_start, row by row: the first round's bytes of the 16 rows */
    if (threadIdx.x < 16) {
        const int64_t r = r0 + threadIdx.x < n ? r0 + threadIdx.x : n - 1;
        kc_prefetch_l2(W + (size_t)r * (size_t)rs,
                       (uint32_t)((nsc < SW * U ? nsc : SW * U) * KILN_CUDA_T16_K * 2));
    }
    kc_pdl_wait();
    const uint8_t *pa = W + (size_t)(r0 + g < n ? r0 + g : n - 1) * (size_t)rs + 16 * tig;
    const uint8_t *pb = W + (size_t)(r0 + g + 8 < n ? r0 + g + 8 : n - 1) * (size_t)rs + 16 * tig;
    const bool live = g < T;
    const uint4 *xp = xf + ((live ? g : 0) * 4 + tig) * 2; /* + 64 per block */
    const float *ip = inv + 2 * tig;                       /* + 8 per block */
    float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t s0 = w; s0 < nsc; s0 += (int64_t)SW * U) {
        MQ raw[U][4];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t sc = s0 + (int64_t)u * SW;
            const size_t off = (size_t)(sc < nsc ? sc : s0) * (KILN_CUDA_T16_K * 2);
#pragma unroll
            for (int bb = 0; bb < 4; bb++) { /* see gemv_t16_kernel for the reload past k */
                raw[u][bb].v[0] = kc_ldw(pa + off + 64 * bb);
                raw[u][bb].v[1] = kc_ldw(pb + off + 64 * bb);
            }
        }
        float4 xv[U];
        if constexpr (FS) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t sc = s0 + (int64_t)u * SW;
                xv[u] = t16_xload(x + (sc < nsc ? sc : s0) * KILN_CUDA_T16_K, lane);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t sc = s0 + (int64_t)u * SW;
            if (sc >= nsc) break;
            t16_xs xs;
            if constexpr (FS) xs = t16_xsplit<false>(xv[u], lane);
#pragma unroll
            for (int bb = 0; bb < 4; bb++) {
                uint32_t bh[4] = {0u, 0u, 0u, 0u}, bl[4] = {0u, 0u, 0u, 0u};
                float2 iv;
                if constexpr (FS)
                    t16_xfrag<true>(xs, bb, tig, bh, bl, &iv);
                else
                    t16_xprep(xp, ip, sc * 4 + bb, live, bh, bl, &iv);
                kc_mma_block<MQ, FS>(raw[u][bb], bh, bl, iv, tot);
            }
        }
    }
    __shared__ float red[SW][32][4];
    t16_store<SW>(J, red, tot, w, lane, T);
}

/* The K-quants (q4_K, q6_K; cuda_t16.h): a superchunk is one 256-column block of the
 * tile (8 32-blocks), loaded as NQ 16-byte words of quants per lane plus the two rows'
 * scales (rows g and g + 8: 32 bytes, 4 lanes read the same). Numerics as above per
 * 32-block: the quants as exact f16 integers (q4_K: q in 0..15; q6_K: q - 32), four mma on
 * the split-f16 x into fresh f32 accumulators, then in f32
 *   q4_K: tot += (d sc) inv acc - (dmin m) xsum (xsum: the block's f32 sum of x, from the
 *         prep kernel; the min term of sum (d sc q - dmin m) x);
 *   q6_K: the two 16-element halves of the 32-block have scales of their own: acc0 (the
 *         first mma pair, elements 0..15) and acc1 (16..31) separately, tot += (d sc0) inv
 *         acc0, then += (d sc1) inv acc1.
 * Every order depends on (n, k) only: batch invariant as the q4_0 / q8_0 kernel. */
template <int DT> struct t16k_geom;
template <> struct t16k_geom<KILN_DTYPE_Q4_K> {
    static constexpr int SCB = 2304, NQ = 4, SO = 2048;
};
template <> struct t16k_geom<KILN_DTYPE_Q6_K> {
    static constexpr int SCB = 3360, NQ = 6, SO = 3072;
};

__device__ __forceinline__ uint32_t kc_word(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* Byte i of w as a float without I2F (the conversion pipe is a sixteenth of the FMA one):
 * 2^23 + byte read as a float, minus 2^23; signed: the byte offset by 128, minus 2^23 + 128.
 * Exact (the same value as (float) of the byte). */
__device__ __forceinline__ float kc_byte_f(uint32_t w, int i) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u | (unsigned)i)) - 8388608.0f;
}
__device__ __forceinline__ float kc_sbyte_f(uint32_t w, int i) {
    return __uint_as_float(__byte_perm(w ^ 0x80808080u, 0x4B000000u, 0x7540u | (unsigned)i)) -
           8388736.0f;
}
/* q4_K's 6-bit scales and mins of a superchunk's 8 32-blocks as bytes, from a row's S, M, H
 * words (s.y, s.z, s.w; cuda_t16.h): e[0] byte j = scale of 32-block 2 j, e[1] of 2 j + 1,
 * e[2] / e[3] the same for the mins. S's nibble i is block i's low 4 bits, so S's bytes
 * already pair blocks 2 j, 2 j + 1; H's 2-bit high parts are spread to one nibble a byte. */
__device__ __forceinline__ void kc_q4k_sm(const uint4 &s, uint32_t e[4]) {
    uint32_t hs = s.w & 0xFFFFu, hm = s.w >> 16;
    hs = (hs | (hs << 8)) & 0x00FF00FFu, hm = (hm | (hm << 8)) & 0x00FF00FFu;
    hs = (hs | (hs << 4)) & 0x0F0F0F0Fu, hm = (hm | (hm << 4)) & 0x0F0F0F0Fu;
    e[0] = (s.y & 0x0F0F0F0Fu) | ((hs << 4) & 0x30303030u);
    e[1] = ((s.y >> 4) & 0x0F0F0F0Fu) | ((hs << 2) & 0x30303030u);
    e[2] = (s.z & 0x0F0F0F0Fu) | ((hm << 4) & 0x30303030u);
    e[3] = ((s.z >> 4) & 0x0F0F0F0Fu) | ((hm << 2) & 0x30303030u);
}

/* A fragment words of one mma (16 columns) from 4 quant bytes of row g (u0) and g + 8 (u1) */
__device__ __forceinline__ void kc_afrag(uint32_t a[4], uint32_t u0, uint32_t u1, uint32_t bias2) {
    a[0] = kc_bytes_h2(u0, 0x4140u, bias2);
    a[1] = kc_bytes_h2(u1, 0x4140u, bias2);
    a[2] = kc_bytes_h2(u0, 0x4342u, bias2);
    a[3] = kc_bytes_h2(u1, 0x4342u, bias2);
}

/* q6_K: 1024 threads per SM worth of CTAs (64 registers; without the bound ptxas took 82
 * at 16 warps, one CTA of 512 threads per SM: not measured either way) */
/* MB CTAs of SW warps per SM at least: q6_K 1024 threads' worth (64 registers; without
 * the bound ptxas took 82 at 16 warps); q4_K either (MB = 1024 / threads) or 1 (ptxas then
 * takes 128 registers at 16 warps: one CTA per SM): kiln_cuda_t16k_occupancy */
template <int DT, int SW, int U, bool FS, int MB>
__global__ void __launch_bounds__(SW * 32, MB)
    gemv_t16k_kernel(const t16_jobs J, int64_t k, const float *__restrict__ x,
                     const uint4 *__restrict__ xf, const float *__restrict__ inv,
                     const float *__restrict__ xsum, int T) {
    constexpr int SCB = t16k_geom<DT>::SCB, NQ = t16k_geom<DT>::NQ, SO = t16k_geom<DT>::SO;
    constexpr bool Q4K = DT == KILN_DTYPE_Q4_K;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    const int64_t nsc = k / 256;
    int64_t tile;
    const uint8_t *tb = t16_w(J, &tile);
    tb += (size_t)tile * (size_t)nsc * SCB;
    t16_pdl_start(tb, (nsc < SW * U ? nsc : SW * U) * SCB);
    const bool live = g < T;
    const uint4 *xp = xf + ((live ? g : 0) * 4 + tig) * 2; /* + 64 per 32-block */
    const float *ip = inv + 2 * tig;                       /* + 8 per 32-block */
    const float *sp = xsum + 2 * tig;                      /* q4_K: + 8 per 32-block */
    float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t s0 = w; s0 < nsc; s0 += (int64_t)SW * U) {
        uint4 q[U][NQ], sa[U], sb[U];
        uint32_t dq[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t sc = s0 + (int64_t)u * SW;
            const uint8_t *c = tb + (size_t)(sc < nsc ? sc : s0) * SCB; /* see gemv_t16_kernel */
#pragma unroll
            for (int i = 0; i < NQ; i++) q[u][i] = kc_ldw(c + i * 512 + lane * 16);
            sa[u] = kc_ldw(c + SO + g * 32);      /* row g */
            sb[u] = kc_ldw(c + SO + g * 32 + 16); /* row g + 8 */
            dq[u] = Q4K ? 0u : __ldg((const unsigned int *)(c + 3328 + g * 4));
        }
        float4 xv[U][2]; /* FS: the superchunk's two halves of 128 columns */
        if constexpr (FS) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t sc = s0 + (int64_t)u * SW;
                const float *xc = x + (sc < nsc ? sc : s0) * 256;
                xv[u][0] = t16_xload(xc, lane);
                xv[u][1] = t16_xload(xc + 128, lane);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t sc = s0 + (int64_t)u * SW;
            if (sc >= nsc) break;
            t16_xs xs; /* FS: the half of 128 columns in use (split at bb = 0 and 4) */
            float dg, dg8, mg = 0.0f, mg8 = 0.0f;
            uint32_t ea[4], eb[4]; /* q4_K: rows g, g + 8 (kc_q4k_sm) */
            if constexpr (Q4K) {
                dg = kc_h2f((uint16_t)(sa[u].x & 0xFFFFu)), mg = kc_h2f((uint16_t)(sa[u].x >> 16));
                dg8 = kc_h2f((uint16_t)(sb[u].x & 0xFFFFu)),
                mg8 = kc_h2f((uint16_t)(sb[u].x >> 16));
                kc_q4k_sm(sa[u], ea), kc_q4k_sm(sb[u], eb);
            } else {
                dg = kc_h2f((uint16_t)(dq[u] & 0xFFFFu)), dg8 = kc_h2f((uint16_t)(dq[u] >> 16));
            }
#pragma unroll
            for (int bb = 0; bb < 8; bb++) {
                const int64_t b = sc * 8 + bb;
                uint32_t bh[4] = {0u, 0u, 0u, 0u}, bl[4] = {0u, 0u, 0u, 0u};
                float2 iv, xsv = make_float2(0.0f, 0.0f);
                if constexpr (FS) {
                    if (bb % 4 == 0) xs = t16_xsplit<Q4K>(xv[u][bb / 4], lane);
                    t16_xfrag(xs, bb % 4, tig, bh, bl, &iv);
                    if constexpr (Q4K) {
                        const float sm = __shfl_sync(0xFFFFFFFFu, xs.sum, (bb % 4) * 8);
                        xsv = make_float2(sm, sm);
                    }
                } else {
                    t16_xprep(xp, ip, b, live, bh, bl, &iv);
                    if constexpr (Q4K) xsv = *(const float2 *)(sp + b * 8);
                }
                uint32_t a0[4], a1[4];
                if constexpr (Q4K) {
                    /* words 2 h + s of piece bb / 2; nibble bb % 2 */
                    const uint4 v = q[u][bb / 2];
                    const int sh = 4 * (bb % 2);
                    const uint32_t m4 = 0x0F0F0F0Fu;
                    kc_afrag(a0, (v.x >> sh) & m4, (v.z >> sh) & m4, 0x64006400u);
                    kc_afrag(a1, (v.y >> sh) & m4, (v.w >> sh) & m4, 0x64006400u);
                    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    kc_mma16816(acc, a0, bh[0], bh[1]);
                    kc_mma16816(acc, a1, bh[2], bh[3]);
                    kc_mma16816(acc, a0, bl[0], bl[1]);
                    kc_mma16816(acc, a1, bl[2], bl[3]);
                    /* 6-bit scale and min of 32-block bb (kc_q4k_sm), d sc and dmin m exact
                     * in f32. FS: only token 0's columns (tot[0], tot[2]; kc_mma_block) */
                    const int j = bb / 2, o = bb % 2;
                    const float d1 = dg * kc_byte_f(ea[o], j), m1 = mg * kc_byte_f(ea[2 + o], j);
                    const float d18 = dg8 * kc_byte_f(eb[o], j),
                                m18 = mg8 * kc_byte_f(eb[2 + o], j);
                    tot[0] = fmaf(d1 * iv.x, acc[0], tot[0]);
                    tot[0] = fmaf(-m1, xsv.x, tot[0]);
                    if constexpr (!FS) {
                        tot[1] = fmaf(d1 * iv.y, acc[1], tot[1]);
                        tot[1] = fmaf(-m1, xsv.y, tot[1]);
                    }
                    tot[2] = fmaf(d18 * iv.x, acc[2], tot[2]);
                    tot[2] = fmaf(-m18, xsv.x, tot[2]);
                    if constexpr (!FS) {
                        tot[3] = fmaf(d18 * iv.y, acc[3], tot[3]);
                        tot[3] = fmaf(-m18, xsv.y, tot[3]);
                    }
                } else {
                    /* low nibbles: word 2 (bb % 2) + h of piece bb / 2; high bits: word bb % 4
                     * of piece 4 + bb / 4 (row g bits 4-7, row g + 8 bits 0-3 of each byte) */
                    const uint4 v = q[u][bb / 2];
                    const uint32_t lg = bb % 2 ? v.z : v.x, lg8 = bb % 2 ? v.w : v.y;
                    const uint32_t hw = kc_word(q[u][4 + bb / 4], bb % 4);
                    const uint32_t m4 = 0x0F0F0F0Fu, m2 = 0x30303030u;
                    const uint32_t r0a = (lg & m4) | (hw & m2);
                    const uint32_t r0b = ((lg >> 4) & m4) | ((hw >> 2) & m2);
                    const uint32_t r1a = (lg8 & m4) | ((hw << 4) & m2);
                    const uint32_t r1b = ((lg8 >> 4) & m4) | ((hw << 2) & m2);
                    kc_afrag(a0, r0a, r1a, 0x64206420u); /* 1056 = 1024 + 32 */
                    kc_afrag(a1, r0b, r1b, 0x64206420u);
                    float acc0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    kc_mma16816(acc0, a0, bh[0], bh[1]);
                    kc_mma16816(acc1, a1, bh[2], bh[3]);
                    kc_mma16816(acc0, a0, bl[0], bl[1]);
                    kc_mma16816(acc1, a1, bl[2], bl[3]);
                    /* int8 scales 2 bb, 2 bb + 1: bytes 2 (bb % 2), + 1 of word bb / 2 */
                    const uint32_t wg = kc_word(sa[u], bb / 2), wg8 = kc_word(sb[u], bb / 2);
                    const int sb2 = 2 * (bb % 2);
                    const float f0 = dg * kc_sbyte_f(wg, sb2), f1 = dg * kc_sbyte_f(wg, sb2 + 1);
                    const float f08 = dg8 * kc_sbyte_f(wg8, sb2),
                                f18 = dg8 * kc_sbyte_f(wg8, sb2 + 1);
                    tot[0] = fmaf(f0 * iv.x, acc0[0], tot[0]);
                    tot[0] = fmaf(f1 * iv.x, acc1[0], tot[0]);
                    if constexpr (!FS) {
                        tot[1] = fmaf(f0 * iv.y, acc0[1], tot[1]);
                        tot[1] = fmaf(f1 * iv.y, acc1[1], tot[1]);
                    }
                    tot[2] = fmaf(f08 * iv.x, acc0[2], tot[2]);
                    tot[2] = fmaf(f18 * iv.x, acc1[2], tot[2]);
                    if constexpr (!FS) {
                        tot[3] = fmaf(f08 * iv.y, acc0[3], tot[3]);
                        tot[3] = fmaf(f18 * iv.y, acc1[3], tot[3]);
                    }
                }
            }
        }
    }
    __shared__ float red[SW][32][4];
    t16_store<SW>(J, red, tot, w, lane, T);
}

/* Scratch of one pass: xf (8 tokens x k x hi, lo), the inverse scales and (q4_K) the
 * blocks' sums of x. kc_gemv_mma_bytes (matmul.cu, the spec rows' workspace) covers it. */
static size_t t16_scratch(int64_t k) {
    return (size_t)KILN_CUDA_GEMV_MAX_T * (size_t)k * 4 +
           2 * (size_t)(k / 32) * KILN_CUDA_GEMV_MAX_T * sizeof(float);
}

/* A/B overrides (bench_cuda, tests): warps per CTA 4 / 8 / 16 / 32 and superchunks per
 * warp in flight 1 / 2 / 4 (0: by shape) */
static int kc_t16_sw = 0, kc_t16_u = 0;
extern "C" void kiln_cuda_t16_config(int sw, int u) {
    kc_t16_sw = sw == 4 || sw == 8 || sw == 16 || sw == 32 ? sw : 0;
    kc_t16_u = u == 1 || u == 2 || u == 4 ? u : 0;
}

/* Warps per CTA and superchunks in flight per warp, by shape: U = 2 and enough warps
 * (up to 16) that each does about U superchunks per round of loads. Device run 1 (H100,
 * 8B matmuls at t = 1, every setting): 16 warps x 2 in flight was the best for both
 * types (q4_0 3.30 ms, q8_0 4.12), 8 x 4 / 16 x 4 / 4 x any were 10-60 % slower. */
static void t16_split(uint32_t dt, bool fs, int64_t k, int *sw, int *u) {
    const int64_t nsc = k / (dt == KILN_DTYPE_F16 ? KILN_CUDA_T16_K : kiln_cuda_t16_k(dt));
    /* K-quants: one superchunk in flight by default (2304 / 3360 bytes a warp, about the
     * q4_0 / q8_0 kernel's 2 x 1152 / 2176; not measured yet); at most 2 (4 -> 2). The
     * fused split (fs): one for every type (session 9 run 2, 8B matmuls at t = 1, 16 warps:
     * q8_0 3.10 ms at 1 vs 4.26 at 2, whose 104 bytes of spills ptxas needed at 64
     * registers; q4_0 2.34 vs 2.39). The warps per CTA (the summation order) are those of
     * U = 2 either way: a function of (dtype, k) alone. */
    /* f16 rows (gemv_f16r_kernel): 4 KB a superchunk, one in flight by default (two need 64
     * registers for the weights alone); the warps as q8_0's */
    const bool kq = dt == KILN_DTYPE_Q4_K || dt == KILN_DTYPE_Q6_K, f16 = dt == KILN_DTYPE_F16;
    const int u2 = kq ? 1 : 2;
    *u = kc_t16_u ? ((kq || f16) && kc_t16_u > 2 ? 2 : kc_t16_u) : fs || f16 ? 1 : u2;
    const int64_t need = (nsc + u2 - 1) / u2;
    *sw = need <= 4 ? 4 : need <= 8 ? 8 : 16;
    if (kc_t16_sw) *sw = kc_t16_sw;
}

/* The warps per CTA (the summation order) of the T16 gemv for (dtype, k): the GEMM
 * (gemm_t16.cu) splits k the same way to give the same bits. */
extern "C" int kiln_cuda_t16_warps(uint32_t dtype, int64_t k) {
    int sw, u;
    t16_split(dtype, false, k, &sw, &u);
    return sw;
}

/* The fused split for passes of one token (FS above); KILN_CUDA_OLD_DECODE=1 or
 * kiln_cuda_decode_fusion(0) turn it off (a prep launch per matmul, as before: the A/B of
 * docs/PERF_GPU.md session 9). Both ways compute the same values. */
static int kc_fused = -1;
extern "C" void kiln_cuda_decode_fusion(int on) {
    kc_fused = on ? 1 : 0;
}
extern "C" int kiln_cuda_decode_fused(void) {
    if (kc_fused < 0) {
        const char *e = getenv("KILN_CUDA_OLD_DECODE");
        kc_fused = e && e[0] == '1' ? 0 : 1;
    }
    return kc_fused;
}
/* The T16 gemv launched with programmatic stream serialization (t16_pdl_start): with the
 * decode fusion, unless KILN_CUDA_PDL=0 or kiln_cuda_decode_pdl_set(0). */
static int kc_pdl = -1, kc_pdl_cc = -1;
extern "C" void kiln_cuda_decode_pdl_set(int on) {
    kc_pdl = on ? 1 : 0;
}
extern "C" int kiln_cuda_decode_pdl(void) {
    if (kc_pdl < 0) {
        const char *e = getenv("KILN_CUDA_PDL");
        kc_pdl = e && e[0] == '0' ? 0 : 1;
    }
    if (kc_pdl && kc_pdl_cc < 0) { /* programmatic launches need sm_90 */
        int dev = 0, major = 0;
        kc_pdl_cc = cudaGetDevice(&dev) == cudaSuccess &&
                            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                                   dev) == cudaSuccess
                        ? major
                        : 0;
        (void)cudaGetLastError();
    }
    return kc_pdl && kc_pdl_cc >= 9 && kiln_cuda_decode_fused();
}
/* q4_K's T16 gemv at two CTAs of 16 warps per SM (64 registers; the default) or one (128
 * registers: KILN_T16K_MB=1 or kiln_cuda_t16k_occupancy(1)). Session 9 run 3: the 8B
 * q4_K_M decode matmuls 3.34 ms at 2 vs 3.77 at 1; kiln bench tg128 233-235 vs 219 tok/s. */
static int kc_mb2 = -1;
extern "C" void kiln_cuda_t16k_occupancy(int mb) {
    kc_mb2 = mb == 1 ? 0 : 1;
}
static int kc_t16k_mb2(void) {
    if (kc_mb2 < 0) {
        const char *e = getenv("KILN_T16K_MB");
        kc_mb2 = e && e[0] == '1' ? 0 : 1;
    }
    return kc_mb2;
}

/* gemv_t16_kernel's L2 prefetch distance in rounds of loads (session 18, docs/CUDA.md): before
 * it loads a round, each warp asks for its superchunk of the round pf later with one
 * `prefetch.global.L2` a lane (a 128-byte line each). q4_0:
 * 1 (8B decode matmuls 2.322 -> 2.237 ms, tg128 302-305 -> 312-316 tok/s, same host); q8_0:
 * 0 (2.977 -> 3.165 ms with it: its loads already stream at ~90 %); 2 rounds was slower for
 * q4_0 too. KILN_T16_PF=N (0-4) or kiln_cuda_t16_prefetch(N) sets every dtype (A/B; -1: the
 * defaults again). Values never change with it. */
static int kc_t16_pf = -1, kc_t16_pf_env = -2;
extern "C" void kiln_cuda_t16_prefetch(int rounds) {
    kc_t16_pf = rounds < 0 ? -1 : rounds > 4 ? 4 : rounds;
}
static int t16_pf(uint32_t dt) {
    if (kc_t16_pf >= 0) return kc_t16_pf;
    if (kc_t16_pf_env == -2) {
        const char *e = getenv("KILN_T16_PF");
        kc_t16_pf_env = e && e[0] >= '0' && e[0] <= '4' && !e[1] ? e[0] - '0' : -1;
    }
    if (kc_t16_pf_env >= 0) return kc_t16_pf_env;
    return dt == KILN_DTYPE_Q4_0 ? 1 : 0;
}

template <int DT, bool FS>
static void launch_t16(cudaStream_t s, const t16_jobs &J, unsigned grid, int64_t k, const float *x,
                       const uint4 *xf, const float *inv, int T, bool pdl) {
    int sw, u;
    t16_split(DT, FS, k, &sw, &u);
#define KC_T16(SWV, UV)                                                                            \
    kc_launch_pdl(gemv_t16_kernel<DT, SWV, UV, FS>, grid, SWV * 32, s, pdl, J, k, x, xf, inv, T)
#define KC_T16_U(SWV)                                                                              \
    do {                                                                                           \
        if (u == 4)                                                                                \
            KC_T16(SWV, 4);                                                                        \
        else if (u == 2)                                                                           \
            KC_T16(SWV, 2);                                                                        \
        else                                                                                       \
            KC_T16(SWV, 1);                                                                        \
    } while (0)
    if (sw == 32)
        KC_T16_U(32);
    else if (sw == 16)
        KC_T16_U(16);
    else if (sw == 8)
        KC_T16_U(8);
    else
        KC_T16_U(4);
#undef KC_T16_U
#undef KC_T16
}

template <int DT, bool FS>
static void launch_t16k(cudaStream_t s, const t16_jobs &J, unsigned grid, int64_t k, const float *x,
                        const uint4 *xf, const float *inv, const float *xsum, int T, bool pdl) {
    int sw, u;
    t16_split(DT, FS, k, &sw, &u);
#define KC_T16K_MB(SWV, UV, MBV)                                                                   \
    kc_launch_pdl(gemv_t16k_kernel<DT, SWV, UV, FS, MBV>, grid, SWV * 32, s, pdl, J, k, x, xf,     \
                  inv, xsum, T)
#define KC_T16K(SWV, UV)                                                                           \
    do {                                                                                           \
        if (DT == KILN_DTYPE_Q6_K || kc_t16k_mb2())                                                \
            KC_T16K_MB(SWV, UV, 1024 / (SWV * 32));                                                \
        else                                                                                       \
            KC_T16K_MB(SWV, UV, 1);                                                                \
    } while (0)
#define KC_T16K_U(SWV)                                                                             \
    do {                                                                                           \
        if (u == 2)                                                                                \
            KC_T16K(SWV, 2);                                                                       \
        else                                                                                       \
            KC_T16K(SWV, 1);                                                                       \
    } while (0)
    if (sw == 32)
        KC_T16K_U(32);
    else if (sw == 16)
        KC_T16K_U(16);
    else if (sw == 8)
        KC_T16K_U(8);
    else
        KC_T16K_U(4);
#undef KC_T16K_U
#undef KC_T16K
#undef KC_T16K_MB
}

/* f16 rows at one token (FS): one CTA of 16 warps per SM (no register cap; the default) or
 * two (64 registers, 40 bytes spilled: KILN_F16R_MB=2, kiln_cuda_f16r_occupancy(2)). Run 1
 * of session 11 (bench_cuda, 8B matmuls in the engine's groups, one graph): 5.28 ms at one,
 * 5.46 ms at two. */
static int kc_f16r_mb2 = -1;
extern "C" void kiln_cuda_f16r_occupancy(int mb) {
    kc_f16r_mb2 = mb == 1 ? 0 : mb == 2 ? 1 : -1;
}
static int kc_f16r_mb(void) {
    if (kc_f16r_mb2 < 0) {
        const char *e = getenv("KILN_F16R_MB");
        kc_f16r_mb2 = e && e[0] == '2' ? 1 : 0;
    }
    return kc_f16r_mb2 ? 2 : 1;
}

template <bool FS>
static void launch_f16r(cudaStream_t s, const t16_jobs &J, unsigned grid, int64_t k, const float *x,
                        const uint4 *xf, const float *inv, int T, bool pdl) {
    int sw, u;
    t16_split(KILN_DTYPE_F16, FS, k, &sw, &u);
    const bool mb2 = FS && kc_f16r_mb() == 2;
    /* one superchunk in flight (t16_split); two only by kiln_cuda_t16_config at one CTA per
     * SM (at 64 registers two spilled 348 bytes under FS) */
#define KC_F16R(SWV)                                                                               \
    do {                                                                                           \
        if (mb2 && SWV <= 16)                                                                      \
            kc_launch_pdl(gemv_f16r_kernel<SWV, 1, FS, (FS && SWV <= 16 ? 1024 / (SWV * 32) : 1)>, \
                          grid, SWV * 32, s, pdl, J, k, x, xf, inv, T);                            \
        else if (u == 2)                                                                           \
            kc_launch_pdl(gemv_f16r_kernel<SWV, 2, FS, 1>, grid, SWV * 32, s, pdl, J, k, x, xf,    \
                          inv, T);                                                                 \
        else                                                                                       \
            kc_launch_pdl(gemv_f16r_kernel<SWV, 1, FS, 1>, grid, SWV * 32, s, pdl, J, k, x, xf,    \
                          inv, T);                                                                 \
    } while (0)
#define KC_F16R_U(SWV) KC_F16R(SWV)
    if (sw == 32)
        KC_F16R_U(32);
    else if (sw == 16)
        KC_F16R_U(16);
    else if (sw == 8)
        KC_F16R_U(8);
    else
        KC_F16R_U(4);
#undef KC_F16R_U
#undef KC_F16R
}

/* One launch over the jobs (all of dtype dt) for a pass of T tokens: x (FS, T = 1) or the
 * pass's split activations xf / inv / xsum */
template <bool FS>
static void launch_jobs(cudaStream_t s, uint32_t dt, const t16_jobs &J, int64_t k, const float *x,
                        const uint4 *xf, const float *inv, const float *xsum, int T) {
    const unsigned grid = J.m[0].tiles + J.m[1].tiles + J.m[2].tiles;
    const bool pdl = kiln_cuda_decode_pdl() != 0;
    if (dt == KILN_DTYPE_F16)
        launch_f16r<FS>(s, J, grid, k, x, xf, inv, T, pdl);
    else if (dt == KILN_DTYPE_Q4_K)
        launch_t16k<KILN_DTYPE_Q4_K, FS>(s, J, grid, k, x, xf, inv, xsum, T, pdl);
    else if (dt == KILN_DTYPE_Q6_K)
        launch_t16k<KILN_DTYPE_Q6_K, FS>(s, J, grid, k, x, xf, inv, inv, T, pdl);
    else if (dt == KILN_DTYPE_Q4_0)
        launch_t16<KILN_DTYPE_Q4_0, FS>(s, J, grid, k, x, xf, inv, T, pdl);
    else
        launch_t16<KILN_DTYPE_Q8_0, FS>(s, J, grid, k, x, xf, inv, T, pdl);
}

/* f16 weights in plain rows that gemv_f16r_kernel reads: 16-byte aligned rows of k % 128 */
static bool f16r_ok(const kiln_matmul_args *a) {
    return a->w_layout == KILN_WLAYOUT_PLAIN && a->w_dtype == KILN_DTYPE_F16 && a->k > 0 &&
           a->k % KILN_CUDA_T16_K == 0 && (a->w_row_bytes & 15) == 0 &&
           a->w_row_bytes / 2 >= (size_t)a->k;
}

static bool t16_ok(const kiln_matmul_args *a) {
    const bool lay =
        f16r_ok(a) || (a->w_layout == KILN_WLAYOUT_CUDA_T16 && kiln_cuda_t16_supports(a->w_dtype) &&
                       a->k > 0 && a->k % kiln_cuda_t16_k(a->w_dtype) == 0);
    return lay && ((uintptr_t)a->w & 15) == 0 && ((uintptr_t)a->x & 15) == 0 &&
           (a->x_stride & 3) == 0 && a->n > 0 && (a->n + 15) / 16 <= (int64_t)(INT32_MAX / 4);
}

/* matmuls m[0..nm) of the same k, t, x and x_stride (checked by the callers), every one
 * T16: per pass of up to 8 tokens one split of x (none for a pass of one token: FS) and
 * one launch per dtype over its members' tiles */
static kiln_status t16_run(const kiln_kctx *c, const kiln_matmul_args *m, int nm) {
    const int64_t k = m[0].k, t = m[0].t;
    bool any_q4k = false;
    for (int i = 0; i < nm; i++) any_q4k |= m[i].w_dtype == KILN_DTYPE_Q4_K;
    if (!c || !c->scratch || c->scratch_size < t16_scratch(k) || ((uintptr_t)c->scratch & 15))
        return KILN_ERR_NOMEM;
    cudaStream_t s = KC_STREAM(c);
    __half *xf = (__half *)c->scratch;
    float *inv = (float *)(xf + (size_t)KILN_CUDA_GEMV_MAX_T * (size_t)k * 2);
    float *xsum = any_q4k ? inv + (size_t)(k / 32) * KILN_CUDA_GEMV_MAX_T
                          : NULL; /* only q4_K's min term reads it */
    const bool fused = kiln_cuda_decode_fused() != 0;
    for (int64_t t0 = 0; t0 < t; t0 += KILN_CUDA_GEMV_MAX_T) {
        const int T = (int)(t - t0 < KILN_CUDA_GEMV_MAX_T ? t - t0 : KILN_CUDA_GEMV_MAX_T);
        const bool fs = fused && T == 1;
        const float *x = m[0].x + t0 * m[0].x_stride;
        /* the split's element order: f16 rows' (E8) or the T16 layouts'; a group mixing the
         * two splits again before the members of the other order (stream order: the launch
         * before has read xf) */
        int prepped = -1;
        bool done[KILN_MATMUL_GROUP_MAX] = {false};
        for (int i = 0; i < nm; i++) {
            if (done[i]) continue;
            const int e8 = m[i].w_dtype == KILN_DTYPE_F16;
            if (!fs && prepped != e8) {
                const int64_t thr = (int64_t)T * (k / 4);
                const unsigned grid = (unsigned)((thr + 255) / 256);
                if (e8)
                    xsplit_t16_kernel<true>
                        <<<grid, 256, 0, s>>>(x, m[0].x_stride, k, T, xf, inv, NULL);
                else
                    xsplit_t16_kernel<false>
                        <<<grid, 256, 0, s>>>(x, m[0].x_stride, k, T, xf, inv, xsum);
                prepped = e8;
            }
            /* this dtype's members, T16_JOBS at a time (all of them when fused) */
            t16_jobs J;
            memset(&J, 0, sizeof J);
            J.pf = fs ? t16_pf(m[i].w_dtype) : 0; /* measured at one token only */
            int nj = 0;
            for (int j = i; j < nm && nj < (fused ? T16_JOBS : 1); j++) {
                if (done[j] || m[j].w_dtype != m[i].w_dtype) continue;
                J.m[nj].W = (const uint8_t *)m[j].w;
                J.m[nj].y = m[j].y + t0 * m[j].y_stride;
                J.m[nj].ys = m[j].y_stride;
                J.m[nj].bias = m[j].bias;
                J.m[nj].n = m[j].n;
                J.m[nj].rs = (int64_t)m[j].w_row_bytes;
                J.m[nj].tiles = (unsigned)((m[j].n + 15) / 16);
                done[j] = true;
                nj++;
            }
            if (fs)
                launch_jobs<true>(s, m[i].w_dtype, J, k, x, NULL, NULL, NULL, 1);
            else
                launch_jobs<false>(s, m[i].w_dtype, J, k, NULL, (const uint4 *)xf, inv, xsum, T);
        }
    }
    return kc_launched();
}

/* The entry of cuda.gemv_t16.matmul / cuda.gemv_t16_any.matmul (T16 weights) and of
 * cuda.gemv_f16.matmul / cuda.gemv_f16_any.matmul (f16 rows: gemv_f16r_kernel). Other plain
 * rows (a weight the binding kept plain; f16 rows the f16 kernel cannot read) go to the
 * batch-invariant tensor-core gemv: a function of the weight alone, so every token count
 * of one weight still runs one arithmetic. */
extern "C" kiln_status kiln_cuda_matmul_t16(const kiln_kctx *c, const kiln_matmul_args *a) {
    if (a->t <= 0 || a->n <= 0) return KILN_OK;
    if (a->w_layout == KILN_WLAYOUT_PLAIN && !(f16r_ok(a) && ((uintptr_t)a->w & 15) == 0))
        return kiln_cuda_matmul_gemv_inv(c, a);
    if (!t16_ok(a)) return KILN_ERR_INVALID_ARG;
    return t16_run(c, a, 1);
}

/* A matmul group's members (matmul.cu's kiln_cuda_matmul_group) when every one is a T16
 * matmul of the same k, t and x: one split per pass (none for one token) and one launch
 * per dtype over their tiles, instead of a split and a gemv per member (q, k, v: the k / v
 * projections' 64 tiles alone filled half the SMs). KILN_ERR_UNSUPPORTED: not such a
 * group, or the fusion is off; the caller runs the members one by one. */
extern "C" kiln_status kiln_cuda_matmul_t16_group(const kiln_kctx *c, const kiln_matmul_args *m,
                                                  int nm) {
    if (!kiln_cuda_decode_fused() || nm < 1 || nm > KILN_MATMUL_GROUP_MAX)
        return KILN_ERR_UNSUPPORTED;
    for (int i = 0; i < nm; i++)
        if (!t16_ok(&m[i]) || m[i].k != m[0].k || m[i].t != m[0].t || m[i].x != m[0].x ||
            m[i].x_stride != m[0].x_stride || m[i].t <= 0)
            return KILN_ERR_UNSUPPORTED;
    return t16_run(c, m, nm);
}

/* 32 values of row r, 32-block b -> hi halves at out[r k + 32 b ..], 2^11-scaled lo halves
 * n k further on (blas.cu's split of dequantized weights) */
__device__ __forceinline__ void t16_store_split(const float w[32], __half *__restrict__ out,
                                                int64_t n, int64_t k, int64_t r, int64_t b) {
    __half *o = out + r * k + b * 32;
    uint4 *o4 = (uint4 *)o, *l4 = (uint4 *)(o + n * k);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __half2 hh[4], ll[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float a0 = w[8 * i + 2 * j], a1 = w[8 * i + 2 * j + 1];
            hh[j] = __floats2half2_rn(a0, a1);
            const float2 hf = __half22float2(hh[j]);
            ll[j] = __floats2half2_rn((a0 - hf.x) * 2048.0f, (a1 - hf.y) * 2048.0f);
        }
        o4[i] = *(const uint4 *)hh;
        l4[i] = *(const uint4 *)ll;
    }
}

/* The cuBLAS path's dequantization of T16 weights: rows < n into hi halves out[0, n k)
 * and 2^11-scaled lo halves out[n k, 2 n k), the values (q - 8) d / q d of kc_dq32. One
 * thread per (row, 32-block). */
template <int DT>
__global__ void dequant_t16_kernel(const uint8_t *__restrict__ W, int64_t n, int64_t k,
                                   __half *__restrict__ out) {
    constexpr int SCB = t16_geom<DT>::SCB;
    const int64_t nb = k / 32;
    const int64_t gi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (gi >= n * nb) return;
    const int64_t r = gi / nb, b = gi % nb;
    const int ri = (int)(r % 16), g = ri % 8, h = ri / 8, bb = (int)(b % 4);
    const uint8_t *c =
        W + ((size_t)(r / 16) * (size_t)(k / KILN_CUDA_T16_K) + (size_t)(b / 4)) * SCB;
    const float d = kc_h2f(*(const uint16_t *)(c + (SCB - 128) + g * 16 + (2 * bb + h) * 2));
    float w[32];
#pragma unroll
    for (int tg = 0; tg < 4; tg++) {
        const uint8_t *lane = c + (4 * g + tg) * 16;
        if constexpr (DT == KILN_DTYPE_Q4_0) {
            const uint32_t u = *(const uint32_t *)(lane + (bb / 2) * 512 + (2 * (bb % 2) + h) * 4);
            const uint32_t lo = u & 0x0F0F0F0Fu, hi = (u >> 4) & 0x0F0F0F0Fu;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                w[4 * tg + e] = (kc_magic(lo, e) - 8388616.0f) * d;
                w[16 + 4 * tg + e] = (kc_magic(hi, e) - 8388616.0f) * d;
            }
        } else {
            const uint8_t *l8 = lane + bb * 512 + (2 * h) * 4;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const uint32_t u = *(const uint32_t *)(l8 + 4 * j) ^ 0x80808080u;
#pragma unroll
                for (int e = 0; e < 4; e++)
                    w[16 * j + 4 * tg + e] = (kc_magic(u, e) - 8388736.0f) * d;
            }
        }
    }
    t16_store_split(w, out, n, k, r, b);
}

/* The same values, coalesced (session 11): one warp per superchunk (16 rows x 128 columns,
 * SCB contiguous bytes), staged in shared memory by 16-byte loads, then written as 8 rounds
 * of 16-byte stores in which lanes 0-15 write row 2i's 256 bytes of hi (and of lo) and
 * lanes 16-31 row 2i + 1's. Lane j of a half-warp writes columns 8 j .. 8 j + 7 of the
 * superchunk: 32-block bb = j / 4, 8-column piece p = j % 4, whose values are elements
 * 4 tg + e + 16 (p / 2) of the block for tg = 2 (p % 2) + {0, 1} (the fragment words of
 * lanes 4 g + tg; q4_0: the low nibbles for p < 2, the high ones above; q8_0: word p / 2).
 * Per value the arithmetic of dequant_t16_kernel (the same bits; test_cuda_prefill). The
 * old kernel's per-thread 4-byte loads were scattered over the superchunk and its stores
 * 64 bytes apart (0.9 TB/s, ncu session 10). */
#define DQC_WARPS 8
/* U superchunks per warp (their loads all issued before the first store), CS: stores with
 * the evict-first hint (__stcs: the halves are read back once, by cuBLAS) */
template <int DT, int U, bool CS>
__global__ void __launch_bounds__(DQC_WARPS * 32)
    dequant_t16c_kernel(const uint8_t *__restrict__ W, int64_t n, int64_t k,
                        __half *__restrict__ out) {
    constexpr int SCB = t16_geom<DT>::SCB, NU = SCB / 16;
    __shared__ uint4 sm[DQC_WARPS][U * NU];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t nsc = k / KILN_CUDA_T16_K, tot = (n + 15) / 16 * nsc;
    const int64_t sc0 = ((int64_t)blockIdx.x * DQC_WARPS + w) * U;
    if (sc0 >= tot) return;
    const int nv = tot - sc0 < U ? (int)(tot - sc0) : U;
    const uint4 *src = (const uint4 *)(W + (size_t)sc0 * SCB);
    for (int i = lane; i < nv * NU; i += 32) sm[w][i] = src[i];
    __syncwarp();
    const int j = lane & 15, bb = j >> 2, p = j & 3;
    for (int u = 0; u < nv; u++) {
        const uint8_t *c = (const uint8_t *)(sm[w] + u * NU);
        const int64_t tile = (sc0 + u) / nsc, s = (sc0 + u) % nsc;
#pragma unroll 2
        for (int i = 0; i < 8; i++) {
            const int ri = 2 * i + (lane >> 4), g = ri % 8, h = ri / 8;
            const int64_t r = tile * 16 + ri;
            if (r >= n) break; /* the last tile's zero padding; ri grows with i */
            const float d =
                kc_h2f(*(const uint16_t *)(c + (SCB - 128) + g * 16 + (2 * bb + h) * 2));
            float v[8];
#pragma unroll
            for (int tt = 0; tt < 2; tt++) {
                const int tg = 2 * (p % 2) + tt;
                const uint8_t *ln = c + (4 * g + tg) * 16;
                if constexpr (DT == KILN_DTYPE_Q4_0) {
                    const uint32_t uw =
                        *(const uint32_t *)(ln + (bb / 2) * 512 + (2 * (bb % 2) + h) * 4);
                    const uint32_t q = p < 2 ? (uw & 0x0F0F0F0Fu) : ((uw >> 4) & 0x0F0F0F0Fu);
#pragma unroll
                    for (int e = 0; e < 4; e++) v[4 * tt + e] = (kc_magic(q, e) - 8388616.0f) * d;
                } else {
                    const uint32_t uw =
                        *(const uint32_t *)(ln + bb * 512 + (2 * h) * 4 + 4 * (p / 2)) ^
                        0x80808080u;
#pragma unroll
                    for (int e = 0; e < 4; e++) v[4 * tt + e] = (kc_magic(uw, e) - 8388736.0f) * d;
                }
            }
            __half2 hh[4], ll[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float a0 = v[2 * q], a1 = v[2 * q + 1];
                hh[q] = __floats2half2_rn(a0, a1);
                const float2 hf = __half22float2(hh[q]);
                ll[q] = __floats2half2_rn((a0 - hf.x) * 2048.0f, (a1 - hf.y) * 2048.0f);
            }
            __half *o = out + r * k + s * KILN_CUDA_T16_K + 8 * j;
            if constexpr (CS) {
                __stcs((uint4 *)o, *(const uint4 *)hh);
                __stcs((uint4 *)(o + n * k), *(const uint4 *)ll);
            } else {
                *(uint4 *)o = *(const uint4 *)hh;
                *(uint4 *)(o + n * k) = *(const uint4 *)ll;
            }
        }
    }
}

/* The K-quants' dequantization (layout: cuda_t16.h), one thread per (row, 32-block bb of a
 * superchunk): the values of kc_dq32 (q4_K: d sc q - dmin m; q6_K: (d sc) (q - 32)). */
template <int DT>
__global__ void dequant_t16k_kernel(const uint8_t *__restrict__ W, int64_t n, int64_t k,
                                    __half *__restrict__ out) {
    constexpr int SCB = t16k_geom<DT>::SCB;
    const int64_t nb = k / 32;
    const int64_t gi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (gi >= n * nb) return;
    const int64_t r = gi / nb, b = gi % nb;
    const int ri = (int)(r % 16), g = ri % 8, h = ri / 8, bb = (int)(b % 8);
    const uint8_t *c = W + ((size_t)(r / 16) * (size_t)(k / 256) + (size_t)(b / 8)) * SCB;
    float w[32];
    if constexpr (DT == KILN_DTYPE_Q4_K) {
        const uint8_t *sp = c + 2048 + 16 * (2 * g + h);
        const uint32_t dm = *(const uint32_t *)sp, S = *(const uint32_t *)(sp + 4),
                       M = *(const uint32_t *)(sp + 8), H = *(const uint32_t *)(sp + 12);
        const float d = kc_h2f((uint16_t)(dm & 0xffff)), dmin = kc_h2f((uint16_t)(dm >> 16));
        const int sc = (int)(((S >> (4 * bb)) & 15u) | (((H >> (2 * bb)) & 3u) << 4));
        const int mn = (int)(((M >> (4 * bb)) & 15u) | (((H >> (16 + 2 * bb)) & 3u) << 4));
        const float d1 = d * (float)sc, m1 = dmin * (float)mn;
        const int sh = 4 * (bb % 2);
#pragma unroll
        for (int tg = 0; tg < 4; tg++) {
            const uint8_t *lw = c + 512 * (bb / 2) + 16 * (4 * g + tg) + 4 * (2 * h);
            const uint32_t ua = *(const uint32_t *)lw, ub = *(const uint32_t *)(lw + 4);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                w[4 * tg + e] = d1 * (float)((ua >> (8 * e + sh)) & 15u) - m1;
                w[16 + 4 * tg + e] = d1 * (float)((ub >> (8 * e + sh)) & 15u) - m1;
            }
        }
    } else {
        const int8_t *scs = (const int8_t *)(c + 3072 + 16 * (2 * g + h));
        const float d = kc_h2f(*(const uint16_t *)(c + 3328 + 2 * (2 * g + h)));
        const float d0 = d * (float)scs[2 * bb], d1 = d * (float)scs[2 * bb + 1];
#pragma unroll
        for (int tg = 0; tg < 4; tg++) {
            const int lane = 4 * g + tg;
            const uint32_t lw =
                *(const uint32_t *)(c + 512 * (bb / 2) + 16 * lane + 4 * (2 * (bb % 2) + h));
            const uint32_t hw =
                *(const uint32_t *)(c + 2048 + 512 * (bb / 4) + 16 * lane + 4 * (bb % 4));
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const uint32_t l8 = (lw >> (8 * e)) & 0xFFu, h8 = (hw >> (8 * e)) & 0xFFu;
                const int qa = (int)((l8 & 15u) | (h ? (h8 & 3u) : ((h8 >> 4) & 3u)) << 4) - 32;
                const int qb =
                    (int)((l8 >> 4) | (h ? ((h8 >> 2) & 3u) : ((h8 >> 6) & 3u)) << 4) - 32;
                w[4 * tg + e] = d0 * (float)qa;
                w[16 + 4 * tg + e] = d1 * (float)qb;
            }
        }
    }
    t16_store_split(w, out, n, k, r, b);
}

/* The K-quants' values, coalesced (session 12): dequant_t16c_kernel's design for a q4_K /
 * q6_K superchunk (16 rows x 256 columns, SCB = 2304 / 3360 contiguous bytes): one warp per
 * superchunk, staged in shared memory by 16-byte loads, then 16 rounds of 16-byte stores;
 * round i writes row i, lanes 0-15 its columns 0-127 and lanes 16-31 columns 128-255 (512
 * contiguous bytes of hi, the same of lo). Lane j of a half-warp writes 8 columns of
 * 32-block bb = 4 (lane / 16) + j / 4, piece p = j % 4: elements 4 tg + e + 16 (p / 2) for
 * tg = 2 (p % 2) + {0, 1}, as in dequant_t16c_kernel. Per value the arithmetic of
 * dequant_t16k_kernel, expression for expression (the same bits; test_cuda_prefill). CS:
 * evict-first stores. */
template <int DT, bool CS>
__global__ void __launch_bounds__(DQC_WARPS * 32)
    dequant_t16kc_kernel(const uint8_t *__restrict__ W, int64_t n, int64_t k,
                         __half *__restrict__ out) {
    constexpr int SCB = t16k_geom<DT>::SCB, NU = SCB / 16;
    __shared__ uint4 sm[DQC_WARPS][NU];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t nsc = k / 256, tot = (n + 15) / 16 * nsc;
    const int64_t sc0 = (int64_t)blockIdx.x * DQC_WARPS + w;
    if (sc0 >= tot) return;
    const uint4 *src = (const uint4 *)(W + (size_t)sc0 * SCB);
    for (int i = lane; i < NU; i += 32) sm[w][i] = src[i];
    __syncwarp();
    const uint8_t *c = (const uint8_t *)sm[w];
    const int64_t tile = sc0 / nsc, s = sc0 % nsc;
    const int j = lane & 15, bb = 4 * (lane >> 4) + (j >> 2), p = j & 3;
#pragma unroll 2
    for (int ri = 0; ri < 16; ri++) {
        const int64_t r = tile * 16 + ri;
        if (r >= n) break; /* the last tile's zero padding */
        const int g = ri % 8, h = ri / 8;
        float v[8];
        if constexpr (DT == KILN_DTYPE_Q4_K) {
            const uint8_t *sp = c + 2048 + 16 * (2 * g + h);
            const uint32_t dm = *(const uint32_t *)sp, S = *(const uint32_t *)(sp + 4),
                           M = *(const uint32_t *)(sp + 8), H = *(const uint32_t *)(sp + 12);
            const float d = kc_h2f((uint16_t)(dm & 0xffff)), dmin = kc_h2f((uint16_t)(dm >> 16));
            const int sc = (int)(((S >> (4 * bb)) & 15u) | (((H >> (2 * bb)) & 3u) << 4));
            const int mn = (int)(((M >> (4 * bb)) & 15u) | (((H >> (16 + 2 * bb)) & 3u) << 4));
            const float d1 = d * (float)sc, m1 = dmin * (float)mn;
            const int sh = 4 * (bb % 2);
#pragma unroll
            for (int tt = 0; tt < 2; tt++) {
                const int tg = 2 * (p % 2) + tt;
                const uint8_t *lw = c + 512 * (bb / 2) + 16 * (4 * g + tg) + 4 * (2 * h);
                const uint32_t u = *(const uint32_t *)(lw + 4 * (p / 2));
#pragma unroll
                for (int e = 0; e < 4; e++)
                    v[4 * tt + e] = d1 * (float)((u >> (8 * e + sh)) & 15u) - m1;
            }
        } else {
            const int8_t *scs = (const int8_t *)(c + 3072 + 16 * (2 * g + h));
            const float d = kc_h2f(*(const uint16_t *)(c + 3328 + 2 * (2 * g + h)));
            const float d0 = d * (float)scs[2 * bb], d1 = d * (float)scs[2 * bb + 1];
#pragma unroll
            for (int tt = 0; tt < 2; tt++) {
                const int tg = 2 * (p % 2) + tt, ln = 4 * g + tg;
                const uint32_t lw =
                    *(const uint32_t *)(c + 512 * (bb / 2) + 16 * ln + 4 * (2 * (bb % 2) + h));
                const uint32_t hw =
                    *(const uint32_t *)(c + 2048 + 512 * (bb / 4) + 16 * ln + 4 * (bb % 4));
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const uint32_t l8 = (lw >> (8 * e)) & 0xFFu, h8 = (hw >> (8 * e)) & 0xFFu;
                    if (p < 2) {
                        const int qa =
                            (int)((l8 & 15u) | (h ? (h8 & 3u) : ((h8 >> 4) & 3u)) << 4) - 32;
                        v[4 * tt + e] = d0 * (float)qa;
                    } else {
                        const int qb =
                            (int)((l8 >> 4) | (h ? ((h8 >> 2) & 3u) : ((h8 >> 6) & 3u)) << 4) - 32;
                        v[4 * tt + e] = d1 * (float)qb;
                    }
                }
            }
        }
        __half2 hh[4], ll[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float a0 = v[2 * q], a1 = v[2 * q + 1];
            hh[q] = __floats2half2_rn(a0, a1);
            const float2 hf = __half22float2(hh[q]);
            ll[q] = __floats2half2_rn((a0 - hf.x) * 2048.0f, (a1 - hf.y) * 2048.0f);
        }
        __half *o = out + r * k + s * 256 + 128 * (lane >> 4) + 8 * j;
        if constexpr (CS) {
            __stcs((uint4 *)o, *(const uint4 *)hh);
            __stcs((uint4 *)(o + n * k), *(const uint4 *)ll);
        } else {
            *(uint4 *)o = *(const uint4 *)hh;
            *(uint4 *)(o + n * k) = *(const uint4 *)ll;
        }
    }
}

/* Which dequantization of T16 weights runs: 0 the thread-per-32-block kernels
 * (KILN_CUDA_OLD_DQ=1), 1 the coalesced one, 2 the same with 2 superchunks per warp, 3
 * (default) with evict-first stores, 4 both (KILN_CUDA_DQ_V=N; A/B runs, test_cuda_prefill's
 * bitwise checks: every variant gives the same bits). Session 11 run 2, 8B pp512: 1 8226
 * tok/s (q4_0) / 7810 (q8_0), 2 8221 / 7540, 3 9116 / 8734, 4 9059 / 8814. q4_K / q6_K
 * (session 12): dequant_t16kc_kernel in variants 1-4 (one superchunk a warp; evict-first in
 * 3 and 4), the old kernel in 0 or with KILN_CUDA_OLD_DQK=1 (A/B of the K-quants alone). */
static int kc_dq_var = -1, kc_dqk_old = -1;
static bool dqk_old(void) {
    if (kc_dqk_old < 0) {
        const char *e = getenv("KILN_CUDA_OLD_DQK");
        kc_dqk_old = e && e[0] == '1';
    }
    return kc_dqk_old == 1;
}
extern "C" void kiln_cuda_t16_dequant_variant(int v) {
    kc_dq_var = v < 0 || v > 4 ? 3 : v;
}
static int dq_variant(void) {
    if (kc_dq_var < 0) {
        const char *e = getenv("KILN_CUDA_OLD_DQ"), *v = getenv("KILN_CUDA_DQ_V");
        int x = v && v[0] >= '0' && v[0] <= '4' && !v[1] ? v[0] - '0' : 3;
        kc_dq_var = e && e[0] == '1' ? 0 : x;
    }
    return kc_dq_var;
}
extern "C" int kiln_cuda_t16_dequant_coalesced(void) {
    return dq_variant() != 0;
}

template <int DT, int U, bool CS>
static kiln_status dqc_launch(cudaStream_t s, const void *w, int64_t n, int64_t k, void *out) {
    const int64_t nsc = ((n + 15) / 16) * (k / KILN_CUDA_T16_K);
    const int64_t gc = (nsc + DQC_WARPS * U - 1) / (DQC_WARPS * U);
    if (gc > INT32_MAX) return KILN_ERR_INVALID_ARG;
    dequant_t16c_kernel<DT, U, CS>
        <<<(unsigned)gc, DQC_WARPS * 32, 0, s>>>((const uint8_t *)w, n, k, (__half *)out);
    return kc_launched();
}
template <int DT>
static kiln_status dqc_run(int v, cudaStream_t s, const void *w, int64_t n, int64_t k, void *out) {
    switch (v) {
    case 2:
        return dqc_launch<DT, 2, false>(s, w, n, k, out);
    case 4:
        return dqc_launch<DT, 2, true>(s, w, n, k, out);
    case 1:
        return dqc_launch<DT, 1, false>(s, w, n, k, out);
    default:
        return dqc_launch<DT, 1, true>(s, w, n, k, out);
    }
}

extern "C" kiln_status kiln_cuda_t16_dequant_f16(void *stream, const void *w, uint32_t dtype,
                                                 int64_t n, int64_t k, void *out) {
    if (!kiln_cuda_t16_supports(dtype) || k % kiln_cuda_t16_k(dtype) || ((uintptr_t)w & 15) ||
        ((uintptr_t)out & 15) || n <= 0 || k <= 0)
        return KILN_ERR_INVALID_ARG;
    const int64_t tot = n * (k / 32);
    const unsigned grid = (unsigned)((tot + 255) / 256);
    cudaStream_t s = (cudaStream_t)stream;
    const int v = dq_variant();
    if (v && dtype == KILN_DTYPE_Q4_0) return dqc_run<KILN_DTYPE_Q4_0>(v, s, w, n, k, out);
    if (v && dtype == KILN_DTYPE_Q8_0) return dqc_run<KILN_DTYPE_Q8_0>(v, s, w, n, k, out);
    if (v && !dqk_old() && (dtype == KILN_DTYPE_Q4_K || dtype == KILN_DTYPE_Q6_K)) {
        /* the K-quants: one superchunk per warp in every variant (U = 2 would not fit q6_K's
         * 2 x 3360 bytes a warp in static shared memory); evict-first stores in 3 and 4 */
        const int64_t nsc = ((n + 15) / 16) * (k / 256), gc = (nsc + DQC_WARPS - 1) / DQC_WARPS;
        if (gc > INT32_MAX) return KILN_ERR_INVALID_ARG;
        const bool cs = v >= 3;
        const uint8_t *wb = (const uint8_t *)w;
        __half *ob = (__half *)out;
        if (dtype == KILN_DTYPE_Q4_K) {
            if (cs)
                dequant_t16kc_kernel<KILN_DTYPE_Q4_K, true>
                    <<<(unsigned)gc, DQC_WARPS * 32, 0, s>>>(wb, n, k, ob);
            else
                dequant_t16kc_kernel<KILN_DTYPE_Q4_K, false>
                    <<<(unsigned)gc, DQC_WARPS * 32, 0, s>>>(wb, n, k, ob);
        } else {
            if (cs)
                dequant_t16kc_kernel<KILN_DTYPE_Q6_K, true>
                    <<<(unsigned)gc, DQC_WARPS * 32, 0, s>>>(wb, n, k, ob);
            else
                dequant_t16kc_kernel<KILN_DTYPE_Q6_K, false>
                    <<<(unsigned)gc, DQC_WARPS * 32, 0, s>>>(wb, n, k, ob);
        }
        return kc_launched();
    }
    if (dtype == KILN_DTYPE_Q4_K)
        dequant_t16k_kernel<KILN_DTYPE_Q4_K>
            <<<grid, 256, 0, s>>>((const uint8_t *)w, n, k, (__half *)out);
    else if (dtype == KILN_DTYPE_Q6_K)
        dequant_t16k_kernel<KILN_DTYPE_Q6_K>
            <<<grid, 256, 0, s>>>((const uint8_t *)w, n, k, (__half *)out);
    else if (dtype == KILN_DTYPE_Q4_0)
        dequant_t16_kernel<KILN_DTYPE_Q4_0>
            <<<grid, 256, 0, s>>>((const uint8_t *)w, n, k, (__half *)out);
    else
        dequant_t16_kernel<KILN_DTYPE_Q8_0>
            <<<grid, 256, 0, s>>>((const uint8_t *)w, n, k, (__half *)out);
    return kc_launched();
}
