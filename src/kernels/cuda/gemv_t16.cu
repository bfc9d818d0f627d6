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
 * x 16 bytes per lane each, q8_0: 5) before the first mma (U = 2, SW = 16 for k >= 4096:
 * t16_split); the warps' partial sums meet in
 * shared memory in warp order (kc_mma_store). SW and U depend on the shape (n, k) only,
 * never on the token count: a token's sums are computed in the same order whatever else
 * shares the pass (batch invariant; each token is its own mma column). Tokens: passes of
 * up to 8 (the mma's n = 8).
 */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda_t16.h"
#include "kernels/select.h"
#include "kernels/spec.h"

/* x rows (T <= 8, stride xs) -> xf: per 32-block b, token t and lane column tig the 8 hi
 * halves then the 8 lo halves the lane's B fragments hold (elements 4 tig .. + 3 and
 * 16 + 4 tig .. + 3 of the block), 32 bytes at ((b * 8 + t) * 4 + tig) * 32; inv[b * 8 + t]
 * the block's inverse scale. The arithmetic is xsplit_kernel's (matmul.cu). xsum (q4_K's
 * min term; NULL: not written): xsum[b * 8 + t] = the f32 sum of the block's 32 x, in an
 * order that depends on nothing but the block (batch invariant). */
__global__ void xsplit_t16_kernel(const float *__restrict__ x, int64_t xs, int64_t k, int T,
                                  __half *__restrict__ xf, float *__restrict__ inv,
                                  float *__restrict__ xsum) {
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
    const int q = (int)(j % 8), tg = q & 3, slot = (q >> 2) * 4;
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

template <int DT> struct t16_geom;
template <> struct t16_geom<KILN_DTYPE_Q4_0> { static constexpr int SCB = 1152, NQ = 2; };
template <> struct t16_geom<KILN_DTYPE_Q8_0> { static constexpr int SCB = 2176, NQ = 4; };

template <int DT, int SW, int U>
__global__ void __launch_bounds__(SW * 32)
    gemv_t16_kernel(const uint8_t *__restrict__ W, int64_t n, int64_t k,
                    const uint4 *__restrict__ xf, const float *__restrict__ inv, int T,
                    float *__restrict__ y, int64_t ys, const float *__restrict__ bias) {
    constexpr int SCB = t16_geom<DT>::SCB, NQ = t16_geom<DT>::NQ;
    using MQ = kc_mq<DT>;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    const int64_t nsc = k / KILN_CUDA_T16_K;
    const uint8_t *tb = W + (size_t)blockIdx.x * (size_t)nsc * SCB;
    const bool live = g < T;
    const uint4 *xp = xf + ((live ? g : 0) * 4 + tig) * 2; /* + 64 per block */
    const float *ip = inv + 2 * tig;                       /* + 8 per block */
    float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t s0 = w; s0 < nsc; s0 += (int64_t)SW * U) {
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
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t sc = s0 + (int64_t)u * SW;
            if (sc >= nsc) break;
#pragma unroll
            for (int bb = 0; bb < 4; bb++) {
                const int64_t b = sc * 4 + bb;
                uint32_t bh[4] = {0u, 0u, 0u, 0u}, bl[4] = {0u, 0u, 0u, 0u};
                if (live) {
                    const uint4 h = xp[b * 64], l = xp[b * 64 + 1];
                    bh[0] = h.x, bh[1] = h.y, bh[2] = h.z, bh[3] = h.w;
                    bl[0] = l.x, bl[1] = l.y, bl[2] = l.z, bl[3] = l.w;
                }
                const float2 iv = *(const float2 *)(ip + b * 8);
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
                kc_mma_block(raw, bh, bl, iv, tot);
            }
        }
    }
    __shared__ float red[SW][32][4];
    kc_mma_store<SW>(red, tot, w, lane, (int64_t)blockIdx.x * 16, n, T, y, ys, bias);
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

/* A fragment words of one mma (16 columns) from 4 quant bytes of row g (u0) and g + 8 (u1) */
__device__ __forceinline__ void kc_afrag(uint32_t a[4], uint32_t u0, uint32_t u1, uint32_t bias2) {
    a[0] = kc_bytes_h2(u0, 0x4140u, bias2);
    a[1] = kc_bytes_h2(u1, 0x4140u, bias2);
    a[2] = kc_bytes_h2(u0, 0x4342u, bias2);
    a[3] = kc_bytes_h2(u1, 0x4342u, bias2);
}

/* q6_K: 1024 threads per SM worth of CTAs (64 registers; without the bound ptxas took 82
 * at 16 warps, one CTA of 512 threads per SM: not measured either way) */
#define T16K_MINB(DT, SW) ((DT) == KILN_DTYPE_Q6_K ? 1024 / ((SW)*32) : 1)
template <int DT, int SW, int U>
__global__ void __launch_bounds__(SW * 32, T16K_MINB(DT, SW))
    gemv_t16k_kernel(const uint8_t *__restrict__ W, int64_t n, int64_t k,
                     const uint4 *__restrict__ xf, const float *__restrict__ inv,
                     const float *__restrict__ xsum, int T, float *__restrict__ y, int64_t ys,
                     const float *__restrict__ bias) {
    constexpr int SCB = t16k_geom<DT>::SCB, NQ = t16k_geom<DT>::NQ, SO = t16k_geom<DT>::SO;
    constexpr bool Q4K = DT == KILN_DTYPE_Q4_K;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    const int64_t nsc = k / 256;
    const uint8_t *tb = W + (size_t)blockIdx.x * (size_t)nsc * SCB;
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
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t sc = s0 + (int64_t)u * SW;
            if (sc >= nsc) break;
            float dg, dg8, mg = 0.0f, mg8 = 0.0f;
            if constexpr (Q4K) {
                dg = kc_h2f((uint16_t)(sa[u].x & 0xFFFFu)), mg = kc_h2f((uint16_t)(sa[u].x >> 16));
                dg8 = kc_h2f((uint16_t)(sb[u].x & 0xFFFFu)),
                mg8 = kc_h2f((uint16_t)(sb[u].x >> 16));
            } else {
                dg = kc_h2f((uint16_t)(dq[u] & 0xFFFFu)), dg8 = kc_h2f((uint16_t)(dq[u] >> 16));
            }
#pragma unroll
            for (int bb = 0; bb < 8; bb++) {
                const int64_t b = sc * 8 + bb;
                uint32_t bh[4] = {0u, 0u, 0u, 0u}, bl[4] = {0u, 0u, 0u, 0u};
                if (live) {
                    const uint4 h = xp[b * 64], l = xp[b * 64 + 1];
                    bh[0] = h.x, bh[1] = h.y, bh[2] = h.z, bh[3] = h.w;
                    bl[0] = l.x, bl[1] = l.y, bl[2] = l.z, bl[3] = l.w;
                }
                const float2 iv = *(const float2 *)(ip + b * 8);
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
                    /* 6-bit scale and min of 32-block bb: S, M low nibbles, H high bits */
                    const int scg =
                        (int)(((sa[u].y >> (4 * bb)) & 15u) | (((sa[u].w >> (2 * bb)) & 3u) << 4));
                    const int mng = (int)(((sa[u].z >> (4 * bb)) & 15u) |
                                          (((sa[u].w >> (16 + 2 * bb)) & 3u) << 4));
                    const int scg8 =
                        (int)(((sb[u].y >> (4 * bb)) & 15u) | (((sb[u].w >> (2 * bb)) & 3u) << 4));
                    const int mng8 = (int)(((sb[u].z >> (4 * bb)) & 15u) |
                                           (((sb[u].w >> (16 + 2 * bb)) & 3u) << 4));
                    const float d1 = dg * (float)scg, m1 = mg * (float)mng;
                    const float d18 = dg8 * (float)scg8, m18 = mg8 * (float)mng8;
                    const float2 xsv = *(const float2 *)(sp + b * 8);
                    tot[0] = fmaf(d1 * iv.x, acc[0], tot[0]);
                    tot[0] = fmaf(-m1, xsv.x, tot[0]);
                    tot[1] = fmaf(d1 * iv.y, acc[1], tot[1]);
                    tot[1] = fmaf(-m1, xsv.y, tot[1]);
                    tot[2] = fmaf(d18 * iv.x, acc[2], tot[2]);
                    tot[2] = fmaf(-m18, xsv.x, tot[2]);
                    tot[3] = fmaf(d18 * iv.y, acc[3], tot[3]);
                    tot[3] = fmaf(-m18, xsv.y, tot[3]);
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
                    const int sh = 16 * (bb % 2);
                    const float f0 = dg * (float)(int8_t)(wg >> sh),
                                f1 = dg * (float)(int8_t)(wg >> (sh + 8));
                    const float f08 = dg8 * (float)(int8_t)(wg8 >> sh),
                                f18 = dg8 * (float)(int8_t)(wg8 >> (sh + 8));
                    tot[0] = fmaf(f0 * iv.x, acc0[0], tot[0]);
                    tot[0] = fmaf(f1 * iv.x, acc1[0], tot[0]);
                    tot[1] = fmaf(f0 * iv.y, acc0[1], tot[1]);
                    tot[1] = fmaf(f1 * iv.y, acc1[1], tot[1]);
                    tot[2] = fmaf(f08 * iv.x, acc0[2], tot[2]);
                    tot[2] = fmaf(f18 * iv.x, acc1[2], tot[2]);
                    tot[3] = fmaf(f08 * iv.y, acc0[3], tot[3]);
                    tot[3] = fmaf(f18 * iv.y, acc1[3], tot[3]);
                }
            }
        }
    }
    __shared__ float red[SW][32][4];
    kc_mma_store<SW>(red, tot, w, lane, (int64_t)blockIdx.x * 16, n, T, y, ys, bias);
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
static void t16_split(uint32_t dt, int64_t n, int64_t k, int *sw, int *u) {
    (void)n;
    const int64_t nsc = k / kiln_cuda_t16_k(dt);
    /* K-quants: one superchunk in flight by default (2304 / 3360 bytes a warp, about the
     * q4_0 / q8_0 kernel's 2 x 1152 / 2176; not measured yet); at most 2 (4 -> 2) */
    const bool kq = dt == KILN_DTYPE_Q4_K || dt == KILN_DTYPE_Q6_K;
    *u = kc_t16_u ? (kq && kc_t16_u > 2 ? 2 : kc_t16_u) : kq ? 1 : 2;
    const int64_t need = (nsc + *u - 1) / *u;
    *sw = need <= 4 ? 4 : need <= 8 ? 8 : 16;
    if (kc_t16_sw) *sw = kc_t16_sw;
}

template <int DT>
static void launch_t16(cudaStream_t s, const uint8_t *W, int64_t n, int64_t k, const uint4 *xf,
                       const float *inv, int T, float *y, int64_t ys, const float *bias) {
    int sw, u;
    t16_split(DT, n, k, &sw, &u);
    const unsigned grid = (unsigned)((n + 15) / 16);
#define KC_T16(SWV, UV)                                                                            \
    gemv_t16_kernel<DT, SWV, UV><<<grid, SWV * 32, 0, s>>>(W, n, k, xf, inv, T, y, ys, bias)
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

template <int DT>
static void launch_t16k(cudaStream_t s, const uint8_t *W, int64_t n, int64_t k, const uint4 *xf,
                        const float *inv, const float *xsum, int T, float *y, int64_t ys,
                        const float *bias) {
    int sw, u;
    t16_split(DT, n, k, &sw, &u);
    const unsigned grid = (unsigned)((n + 15) / 16);
#define KC_T16K(SWV, UV)                                                                           \
    gemv_t16k_kernel<DT, SWV, UV><<<grid, SWV * 32, 0, s>>>(W, n, k, xf, inv, xsum, T, y, ys, bias)
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
}

/* The entry of cuda.gemv_t16.matmul / cuda.gemv_t16_any.matmul: T16 weights; plain rows
 * (a weight the binding kept plain) go to the batch-invariant tensor-core gemv. */
extern "C" kiln_status kiln_cuda_matmul_t16(const kiln_kctx *c, const kiln_matmul_args *a) {
    if (a->t <= 0 || a->n <= 0) return KILN_OK;
    if (a->w_layout == KILN_WLAYOUT_PLAIN) return kiln_cuda_matmul_gemv_inv(c, a);
    if (a->w_layout != KILN_WLAYOUT_CUDA_T16 || !kiln_cuda_t16_supports(a->w_dtype) || a->k <= 0 ||
        a->k % kiln_cuda_t16_k(a->w_dtype) || ((uintptr_t)a->w & 15))
        return KILN_ERR_INVALID_ARG;
    if (((uintptr_t)a->x & 15) || (a->x_stride & 3)) return KILN_ERR_INVALID_ARG;
    if (!c || !c->scratch || c->scratch_size < t16_scratch(a->k) || ((uintptr_t)c->scratch & 15))
        return KILN_ERR_NOMEM;
    cudaStream_t s = KC_STREAM(c);
    __half *xf = (__half *)c->scratch;
    float *inv = (float *)(xf + (size_t)KILN_CUDA_GEMV_MAX_T * (size_t)a->k * 2);
    float *xsum = a->w_dtype == KILN_DTYPE_Q4_K ? inv + (size_t)(a->k / 32) * KILN_CUDA_GEMV_MAX_T
                                                : NULL; /* only q4_K's min term reads it */
    for (int64_t t0 = 0; t0 < a->t; t0 += KILN_CUDA_GEMV_MAX_T) {
        const int T = (int)(a->t - t0 < KILN_CUDA_GEMV_MAX_T ? a->t - t0 : KILN_CUDA_GEMV_MAX_T);
        const int64_t thr = (int64_t)T * (a->k / 4);
        xsplit_t16_kernel<<<(unsigned)((thr + 255) / 256), 256, 0, s>>>(
            a->x + t0 * a->x_stride, a->x_stride, a->k, T, xf, inv, xsum);
        float *y = a->y + t0 * a->y_stride;
        if (a->w_dtype == KILN_DTYPE_Q4_K)
            launch_t16k<KILN_DTYPE_Q4_K>(s, (const uint8_t *)a->w, a->n, a->k, (const uint4 *)xf,
                                         inv, xsum, T, y, a->y_stride, a->bias);
        else if (a->w_dtype == KILN_DTYPE_Q6_K)
            launch_t16k<KILN_DTYPE_Q6_K>(s, (const uint8_t *)a->w, a->n, a->k, (const uint4 *)xf,
                                         inv, inv, T, y, a->y_stride, a->bias);
        else if (a->w_dtype == KILN_DTYPE_Q4_0)
            launch_t16<KILN_DTYPE_Q4_0>(s, (const uint8_t *)a->w, a->n, a->k, (const uint4 *)xf,
                                        inv, T, y, a->y_stride, a->bias);
        else
            launch_t16<KILN_DTYPE_Q8_0>(s, (const uint8_t *)a->w, a->n, a->k, (const uint4 *)xf,
                                        inv, T, y, a->y_stride, a->bias);
    }
    return kc_launched();
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

extern "C" kiln_status kiln_cuda_t16_dequant_f16(void *stream, const void *w, uint32_t dtype,
                                                 int64_t n, int64_t k, void *out) {
    if (!kiln_cuda_t16_supports(dtype) || k % kiln_cuda_t16_k(dtype) || ((uintptr_t)w & 15))
        return KILN_ERR_INVALID_ARG;
    const int64_t tot = n * (k / 32);
    const unsigned grid = (unsigned)((tot + 255) / 256);
    cudaStream_t s = (cudaStream_t)stream;
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
