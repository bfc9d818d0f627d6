/*
 * gemm_i8.cu — an int8 tensor-core GEMM on T16 weights (q4_0 / q8_0, kernels/cuda_t16.h) at
 * the exactness contract (docs/CUDA.md, "The int8 GEMM"; issues 12 and 17).
 *
 * The weights' integers are exact int8 (q4_0: q - 8; q8_0: q) and the T16 layout already
 * gives each lane its mma.sync m16n8k32 s8 A fragment: for block bb of a superchunk, lane
 * (g, tig)'s words hold row g's and row g + 8's elements 4 tig .. 4 tig + 3 (q4_0: low
 * nibbles; q8_0: the first 16-byte half) and 16 + 4 tig .. (high nibbles; second half),
 * which is exactly the s8 A fragment's (a0-a3: row g, k 4 tig + i; a4-a7: row g + 8; a8-a15
 * the same at k + 16). So the weights are read as the T16 gemv reads them (no second copy),
 * the nibbles become bytes by a mask, an add and an xor per 4, and no permutation is needed.
 *
 * The activations: per (token, 32-block) a power of two 2^P with the block's largest |x|
 * times 2^(P - 16) in [63.5, 127) and X = rint(x 2^P) (|X| < 127 2^16, exact in f32 and
 * within 2^-23 of the block's largest |x|: split f16's level), written as three balanced
 * base-256 digits X = 2^16 d1 + 2^8 d2 + d3, each in [-128, 127] (d1 in [-127, 127]). The
 * prep kernel below stores them in B-fragment order, 32 bytes a lane per (block, 8 tokens):
 * d1's two words, d2's, d3's, then the factors 2^-P of the lane's two C-fragment tokens.
 *
 * Per 32-block, row tile and token tile: three mma (one per digit) into fresh int32
 * accumulators S1..S3: exact integer dot products. Then the block's value
 * 2^-P (2^16 S1 + 2^8 S2 + S3): for q4_0 (|q - 8| <= 8) that sum fits in int32 and is
 * converted once (correctly rounded); for q8_0 (up to 2^35) as f32(2^8 S1 + S2) 2^8 + S3
 * (within 2^-23). Then tot += (d_row 2^-P) value in f32, blocks in k order within a warp's
 * superchunks, the warps' partial sums (a CTA's SW warps split k) added in warp order:
 * deterministic (the order is a function of n, k and the token count's configuration), not
 * batch invariant (the configuration depends on the call's token count) and not bitwise the
 * T16 gemv. So the spec row (cuda.gemm_i8.matmul) is deterministic only: the default policy
 * takes it, the deterministic policy keeps the T16 GEMM (prov_cuda.c).
 *
 * Work split (version 2, the default: gemm_i8s_kernel): a CTA of 8 warps, each owning 2 T16
 * tiles (256 rows a CTA) and NT (2 or 4) tiles of 8 tokens; per superchunk the CTA's B
 * fragments and each warp's weights are copied to shared memory by cp.async, double-buffered.
 * Grid x: token groups; y: row groups (of every member of a group of one dtype: one launch
 * for q / k / v or gate / up, session 19); z: the k split into ranges of superchunks, as many
 * as make the fewest waves x range length (at most 16, their partial sums in scratch, added
 * in range order by i8_reduce_grp_kernel, then + bias). Version 1 (gemm_i8_kernel,
 * KILN_I8_V=1): the warps load
 * weights and B fragments from global memory (L1) themselves, the k split also over the
 * CTA's warps.
 *
 * Measured (session 12 run 3, H100, bench_cuda --gemm: the 8B's matmuls of a step in one
 * graph): q4_0 16 / 32 / 64 / 128 / 512 tokens 4.90 / 7.61 / 14.13 / 25.6 / 83.1 ms (T16
 * GEMM 5.36 / 9.17 / 15.24 / 28.5 / 119.4; cuBLAS on dequantized T16 at 128 / 512: 34.6 /
 * 51.1). So cuda.gemm_i8.matmul serves up to 64 tokens; prefill keeps cuBLAS. Far from the
 * int8 rate (~280 TOPS at 512 tokens): latency-bound at 16 warps per SM (docs/CUDA.md,
 * "The int8 GEMM").
 */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda_t16.h"
#include "kernels/select.h"
#include "kernels/spec.h"

#include <stdlib.h>
#include <string.h>

#define I8_WARPS  8   /* warps per CTA */
#define I8_CHUNK  512 /* most tokens quantized per prep launch (the workspace holds them) */
#define I8_MAX_KS 16  /* most ranges the grid splits k into */
#define I8_MIN_T  12  /* the fewest tokens the GEMM takes by default (fewer: the gemv) */
/* the most tokens it takes by default (more: cuBLAS on the dequantized T16 weights): the 8B's
 * matmuls of a step at 128 tokens 22.7 vs 34.5 ms, at 512 79.6 vs 51.1 (session 19): the
 * lines cross near 240 */
#define I8_MAX_T      192
#define I8_PART_BYTES ((size_t)16 << 20) /* the workspace's room for their partial sums */

template <int DT> struct i8_geom;
template <> struct i8_geom<KILN_DTYPE_Q4_0> { static constexpr int SCB = 1152, NQ = 2; };
template <> struct i8_geom<KILN_DTYPE_Q8_0> { static constexpr int SCB = 2176, NQ = 4; };

/* x rows (T tokens, stride xs) -> the digits and factors of tokens 0 .. Tp (a multiple of
 * 8; tokens past T are zeros with factor 0). Record of (token tile j, block b), lane L =
 * 4 g + tig: 8 words at ((j nb + b) 32 + L) 8: words 0 / 1 = d1 of token 8 j + g, elements
 * 4 tig .. + 3 / 16 + 4 tig .. + 3 (one byte each, element order), 2 / 3 = d2, 4 / 5 = d3,
 * 6 / 7 = 2^-P of tokens 8 j + 2 tig, 8 j + 2 tig + 1 (f32 bits). One thread per 4 values. */
__global__ void xq8_prep_kernel(const float *__restrict__ x, int64_t xs, int64_t k, int T, int Tp,
                                uint32_t *__restrict__ out) {
    const int64_t k4 = k / 4, nb = k / 32;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)Tp * k4) return; /* whole 8-thread groups leave together (k % 32 == 0) */
    const int lane = threadIdx.x & 31;
    const unsigned gmask = 0xFFu << (lane & ~7);
    const int t = (int)(i / k4);
    const int64_t j4 = i % k4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < T) v = ((const float4 *)(x + t * xs))[j4];
    float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    m = fmaxf(m, __shfl_xor_sync(gmask, m, 1));
    m = fmaxf(m, __shfl_xor_sync(gmask, m, 2));
    m = fmaxf(m, __shfl_xor_sync(gmask, m, 4));
    /* NaN: fmaxf drops it; a block holding one gets the factor NaN (so do its outputs) */
    const bool bad = !(isfinite(v.x) && isfinite(v.y) && isfinite(v.z) && isfinite(v.w));
    const bool anybad = __any_sync(gmask, bad) != 0;
    float sc = 0.0f, f = 0.0f; /* 2^P, 2^-P */
    if (anybad) {
        f = __int_as_float(0x7FC00000); /* NaN */
    } else if (m > 0.0f) {
        int e;
        const float fr = frexpf(m, &e);                /* m = fr 2^e, fr in [0.5, 1) */
        int P = (fr >= 127.0f / 128.0f ? 22 : 23) - e; /* m 2^(P - 16) in [63.5, 127) */
        P = P > 126 ? 126 : P;                         /* e <= 128: P >= -105 */
        sc = __int_as_float((P + 127) << 23);
        f = __int_as_float((127 - P) << 23);
    }
    const float a[4] = {v.x, v.y, v.z, v.w};
    uint32_t w1 = 0, w2 = 0, w3 = 0;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int X = anybad ? 0 : __float2int_rn(a[e] * sc); /* exact: |a sc| < 127 2^16 */
        const int d3 = ((X + 128) & 255) - 128;
        const int X1 = (X - d3) >> 8;
        const int d2 = ((X1 + 128) & 255) - 128;
        const int d1 = (X1 - d2) >> 8;
        w1 |= (uint32_t)(d1 & 255) << (8 * e);
        w2 |= (uint32_t)(d2 & 255) << (8 * e);
        w3 |= (uint32_t)(d3 & 255) << (8 * e);
    }
    const int64_t b = j4 / 8;
    const int q = (int)(j4 % 8), tig = q & 3, half = q >> 2, tt = t & 7;
    uint32_t *rec = out + (((int64_t)(t / 8) * nb + b) * 32) * 8;
    uint32_t *o = rec + (4 * tt + tig) * 8;
    o[half] = w1;
    o[2 + half] = w2;
    o[4 + half] = w3;
    /* token tt is column 2 tig' + (tt & 1) of lanes 4 g' + tig', tig' = tt / 2: the
     * block's 8 threads (q = 0..7) write lane g' = q's copy */
    rec[(4 * q + tt / 2) * 8 + 6 + (tt & 1)] = __float_as_uint(f);
}

/* mma.sync m16n8k32 s8 x s8 -> s32, C = 0 */
__device__ __forceinline__ void i8_mma(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
#else
    (void)a, (void)b0, (void)b1;
    c[0] = c[1] = c[2] = c[3] = 0;
    __trap(); /* the spec asks for sm_80; never reached */
#endif
}

/* 4 nibbles (0..15, one a byte) -> 4 int8 q - 8: (v + 120) ^ 128 per byte, no carries */
__device__ __forceinline__ uint32_t i8_nib(uint32_t v) {
    return (v + 0x78787878u) ^ 0x80808080u;
}

/* 16 bytes of weights through L1 (the next CTA of the same rows reads them too) */
__device__ __forceinline__ uint4 i8_ldw(const uint8_t *p) {
    return __ldg((const uint4 *)p);
}

template <int DT, int MT, int NT, int MINB>
__global__ void __launch_bounds__(I8_WARPS * 32, MINB)
    gemm_i8_kernel(const uint8_t *__restrict__ W, int64_t n, int64_t k,
                   const uint4 *__restrict__ xq, int T, float *__restrict__ y, int64_t ys,
                   const float *__restrict__ bias, int wr_n, int per, float *__restrict__ part) {
    constexpr int SCB = i8_geom<DT>::SCB, NQ = i8_geom<DT>::NQ;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    const int wr = w % wr_n, ws = w / wr_n, sw = I8_WARPS / wr_n;
    const int64_t nb = k / 32;
    /* this CTA's superchunks [sc0, nsc): a range of per of them (grid z: the k split) */
    const int64_t sc0 = (int64_t)blockIdx.z * per, nk = k / KILN_CUDA_T16_K;
    const int64_t nsc = sc0 + per < nk ? sc0 + per : nk;
    const int64_t tiles = (n + 15) / 16, tile0 = ((int64_t)blockIdx.y * wr_n + wr) * MT;
    const int ntt = (T + 7) / 8, j0 = (int)blockIdx.x * NT;
    const int nj = ntt - j0 < NT ? ntt - j0 : NT; /* this CTA's token tiles (uniform) */
    int mlive = 0;
#pragma unroll
    for (int m = 0; m < MT; m++) mlive += tile0 + m < tiles;
    float tot[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) tot[m][j][e] = 0.0f;
    const uint4 *xl = xq + (int64_t)j0 * nb * 64 + lane * 2; /* + 64 per block, nb 64 per tile */
    /* the next superchunk's weights prefetched into registers (one CTA per SM), or two CTAs
     * per SM under 128 registers and none */
    constexpr bool PF = MT == 2 && MINB == 1;
    uint4 q[MT][NQ], sd[MT];
    auto wload = [&](int64_t sc, uint4(&qq)[MT][NQ], uint4(&dd)[MT]) {
#pragma unroll
        for (int m = 0; m < MT; m++) {
            /* a missing tile reloads the first (an L1 hit; never used) */
            const uint8_t *c = W + ((size_t)(tile0 + (m < mlive ? m : 0)) * nk + sc) * SCB;
#pragma unroll
            for (int i = 0; i < NQ; i++) qq[m][i] = i8_ldw(c + i * 512 + lane * 16);
            dd[m] = i8_ldw(c + NQ * 512 + g * 16);
        }
    };
    if (PF && mlive > 0 && sc0 + ws < nsc) wload(sc0 + ws, q, sd);
    for (int64_t sc = sc0 + ws; mlive > 0 && sc < nsc; sc += sw) {
        uint4 qn[MT][NQ], sdn[MT];
        if (!PF)
            wload(sc, q, sd);
        else if (sc + sw < nsc)
            wload(sc + sw, qn, sdn);
#pragma unroll
        for (int bb = 0; bb < 4; bb++) {
            const int64_t b = sc * 4 + bb;
            uint32_t a[MT][4];
            float dd[MT][2];
#pragma unroll
            for (int m = 0; m < MT; m++) {
                const uint32_t dw = bb == 0   ? sd[m].x
                                    : bb == 1 ? sd[m].y
                                    : bb == 2 ? sd[m].z
                                              : sd[m].w;
                dd[m][0] = kc_h2f((uint16_t)(dw & 0xFFFFu));
                dd[m][1] = kc_h2f((uint16_t)(dw >> 16));
                if constexpr (DT == KILN_DTYPE_Q4_0) {
                    const uint4 v = q[m][bb / 2];
                    const uint32_t r0 = bb % 2 ? v.z : v.x, r8 = bb % 2 ? v.w : v.y;
                    a[m][0] = i8_nib(r0 & 0x0F0F0F0Fu);
                    a[m][1] = i8_nib(r8 & 0x0F0F0F0Fu);
                    a[m][2] = i8_nib((r0 >> 4) & 0x0F0F0F0Fu);
                    a[m][3] = i8_nib((r8 >> 4) & 0x0F0F0F0Fu);
                } else {
                    const uint4 v = q[m][bb];
                    a[m][0] = v.x, a[m][1] = v.z, a[m][2] = v.y, a[m][3] = v.w;
                }
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                if (j >= nj) break; /* uniform */
                const uint4 *p = xl + ((int64_t)j * nb + b) * 64;
                const uint4 u = __ldg(p), u2 = __ldg(p + 1);
                const float f0 = __uint_as_float(u2.z), f1 = __uint_as_float(u2.w);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    if (m >= mlive) break; /* uniform */
                    int c1[4], c2[4], c3[4];
                    i8_mma(c1, a[m], u.x, u.y);
                    i8_mma(c2, a[m], u.z, u.w);
                    i8_mma(c3, a[m], u2.x, u2.y);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float v;
                        if constexpr (DT == KILN_DTYPE_Q4_0) {
                            v = (float)(c1[e] * 65536 + c2[e] * 256 + c3[e]); /* < 2^31 */
                        } else {
                            v = fmaf((float)(c1[e] * 256 + c2[e]), 256.0f, (float)c3[e]);
                        }
                        const float s = dd[m][e >> 1] * ((e & 1) ? f1 : f0);
                        tot[m][j][e] = fmaf(s, v, tot[m][j][e]);
                    }
                }
            }
        }
        if (PF && sc + sw < nsc) {
#pragma unroll
            for (int m = 0; m < MT; m++) {
                sd[m] = sdn[m];
#pragma unroll
                for (int i = 0; i < NQ; i++) q[m][i] = qn[m][i];
            }
        }
    }
    auto store = [&](int m, int j, int e, float s) {
        const int64_t row = (tile0 + m) * 16 + g + (e >= 2 ? 8 : 0);
        const int64_t tok = (int64_t)(j0 + j) * 8 + 2 * tig + (e & 1);
        if (row >= n || tok >= T) return;
        if (part) /* one of the k split's partial sums: i8_reduce_grp_kernel adds them in order */
            part[((int64_t)blockIdx.z * T + tok) * n + row] = s;
        else
            y[tok * ys + row] = s + (bias ? bias[row] : 0.0f);
    };
    if (sw == 1) {
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (m < mlive && j < nj) store(m, j, e, tot[m][j][e]);
        return;
    }
    /* the SW partial sums of each row group in warp order, a token tile at a time */
    __shared__ float red[I8_WARPS][MT * 4][32];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        if (j >= nj) break; /* uniform */
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int e = 0; e < 4; e++) red[w][m * 4 + e][lane] = tot[m][j][e];
        __syncthreads();
        if (ws == 0) {
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float s = red[wr][m * 4 + e][lane];
                    for (int p = 1; p < sw; p++) s += red[p * wr_n + wr][m * 4 + e][lane];
                    if (m < mlive) store(m, j, e, s);
                }
        }
        __syncthreads();
    }
}

/* ---- version 2: the activations and the weights staged in shared memory ----
 *
 * Version 1 above stalls on its loads (ncu, run 2, pp512 gate / up: 57 % of the cycles
 * between issues wait on L1TEX, 40 % of the issue slots busy, 25 % occupancy at 119
 * registers; ~200 int8 TOPS). Here the 8 warps of a CTA split rows only (MT tiles each: 256
 * rows a CTA) and share the activations of the CTA's tokens: per superchunk one copy of
 * their B fragments (4 blocks x NT tiles x 1 KB) and each warp's weights (MT x SCB bytes, the
 * T16 bytes as stored) go to shared memory by cp.async, double-buffered: the next
 * superchunk's copies run while this one computes. The arithmetic per block, the order
 * of the blocks and the k split over the grid are version 1's: the same values as version 1
 * at the same k split (the test checks both against ref). */

#define I8S_MT 2 /* row tiles a warp in version 2 */
template <int DT, int NT> struct i8s_smem {
    uint4 x[2][4][NT][64]; /* [buffer][block][token tile][d1 d2 words of lanes 0-31, d3 f ...] */
    uint4 w[2][I8_WARPS][I8S_MT][i8_geom<DT>::SCB / 16]; /* [buffer][warp][tile][T16 bytes] */
};

/* The matmuls of one version-2 launch: one, or the members of a group sharing x, k and the
 * dtype (grid y: member i's row groups from gy0[i]) */
struct i8_mm {
    const uint8_t *W;
    float *y;
    const float *bias;
    int64_t n, ys;
    int64_t poff; /* the member's partial sums from part + poff (ks T n floats) */
    int gy0;
};
struct i8_grp {
    i8_mm m[KILN_MATMUL_GROUP_MAX];
    int nm;
};

template <int DT, int NT>
__global__ void __launch_bounds__(I8_WARPS * 32, 2)
    gemm_i8s_kernel(const i8_grp gp, int64_t k, const uint4 *__restrict__ xq, int T, int per,
                    float *__restrict__ part) {
    constexpr int SCB = i8_geom<DT>::SCB, NQ = i8_geom<DT>::NQ, MT = I8S_MT, NC = SCB / 16;
    extern __shared__ uint4 i8s_raw[];
    i8s_smem<DT, NT> &sm = *reinterpret_cast<i8s_smem<DT, NT> *>(i8s_raw);
    int mi = 0;
#pragma unroll
    for (int i = 1; i < KILN_MATMUL_GROUP_MAX; i++)
        if (i < gp.nm && (int)blockIdx.y >= gp.m[i].gy0) mi = i;
    const uint8_t *__restrict__ W = gp.m[mi].W;
    float *__restrict__ y = gp.m[mi].y;
    const float *__restrict__ bias = gp.m[mi].bias;
    const int64_t n = gp.m[mi].n, ys = gp.m[mi].ys, by = (int64_t)blockIdx.y - gp.m[mi].gy0;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tig = lane & 3;
    const int64_t nb = k / 32, nk = k / KILN_CUDA_T16_K;
    const int64_t sc0 = (int64_t)blockIdx.z * per, sc1 = sc0 + per < nk ? sc0 + per : nk;
    const int64_t tiles = (n + 15) / 16, tile0 = (by * I8_WARPS + w) * MT;
    const int ntt = (T + 7) / 8, j0 = (int)blockIdx.x * NT;
    const int nj = ntt - j0 < NT ? ntt - j0 : NT;
    int mlive = 0;
#pragma unroll
    for (int m = 0; m < MT; m++) mlive += tile0 + m < tiles;
    auto stage = [&](int64_t sc, int bf) {
        for (int i = tid; i < 4 * nj * 64; i += I8_WARPS * 32) {
            const int blk = i / (nj * 64), jt = (i / 64) % nj, u = i % 64;
            kc_cp16(&sm.x[bf][blk][jt][(u & 1) * 32 + (u >> 1)],
                    xq + ((int64_t)(j0 + jt) * nb + sc * 4 + blk) * 64 + u);
        }
#pragma unroll
        for (int m = 0; m < MT; m++) {
            if (m >= mlive) break;
            const uint4 *src = (const uint4 *)(W + ((size_t)(tile0 + m) * nk + sc) * SCB);
            for (int c = lane; c < NC; c += 32) kc_cp16(&sm.w[bf][w][m][c], src + c);
        }
    };
    float tot[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) tot[m][j][e] = 0.0f;
    int bf = 0;
    stage(sc0, 0);
    kc_cp_commit();
    for (int64_t sc = sc0; sc < sc1; sc++, bf ^= 1) {
        if (sc + 1 < sc1) stage(sc + 1, bf ^ 1);
        kc_cp_commit();
        kc_cp_wait<1>();
        __syncthreads();
        if (mlive > 0) {
#pragma unroll
            for (int bb = 0; bb < 4; bb++) {
                uint32_t a[MT][4];
                float dd[MT][2];
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    const uint4 sd = sm.w[bf][w][m][NQ * 32 + g];
                    const uint32_t dw = bb == 0 ? sd.x : bb == 1 ? sd.y : bb == 2 ? sd.z : sd.w;
                    dd[m][0] = kc_h2f((uint16_t)(dw & 0xFFFFu));
                    dd[m][1] = kc_h2f((uint16_t)(dw >> 16));
                    if constexpr (DT == KILN_DTYPE_Q4_0) {
                        const uint4 v = sm.w[bf][w][m][(bb / 2) * 32 + lane];
                        const uint32_t r0 = bb % 2 ? v.z : v.x, r8 = bb % 2 ? v.w : v.y;
                        a[m][0] = i8_nib(r0 & 0x0F0F0F0Fu);
                        a[m][1] = i8_nib(r8 & 0x0F0F0F0Fu);
                        a[m][2] = i8_nib((r0 >> 4) & 0x0F0F0F0Fu);
                        a[m][3] = i8_nib((r8 >> 4) & 0x0F0F0F0Fu);
                    } else {
                        const uint4 v = sm.w[bf][w][m][bb * 32 + lane];
                        a[m][0] = v.x, a[m][1] = v.z, a[m][2] = v.y, a[m][3] = v.w;
                    }
                }
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    if (j >= nj) break; /* uniform */
                    const uint4 u = sm.x[bf][bb][j][lane], u2 = sm.x[bf][bb][j][32 + lane];
                    const float f0 = __uint_as_float(u2.z), f1 = __uint_as_float(u2.w);
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        if (m >= mlive) break; /* uniform */
                        int c1[4], c2[4], c3[4];
                        i8_mma(c1, a[m], u.x, u.y);
                        i8_mma(c2, a[m], u.z, u.w);
                        i8_mma(c3, a[m], u2.x, u2.y);
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            float v;
                            if constexpr (DT == KILN_DTYPE_Q4_0)
                                v = (float)(c1[e] * 65536 + c2[e] * 256 + c3[e]);
                            else
                                v = fmaf((float)(c1[e] * 256 + c2[e]), 256.0f, (float)c3[e]);
                            const float sx = dd[m][e >> 1] * ((e & 1) ? f1 : f0);
                            tot[m][j][e] = fmaf(sx, v, tot[m][j][e]);
                        }
                    }
                }
            }
        }
        __syncthreads(); /* the buffer is restaged two superchunks on */
    }
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (m >= mlive || j >= nj) continue;
                const int64_t row = (tile0 + m) * 16 + g + (e >= 2 ? 8 : 0);
                const int64_t tok = (int64_t)(j0 + j) * 8 + 2 * tig + (e & 1);
                if (row >= n || tok >= T) continue;
                if (part)
                    part[gp.m[mi].poff + ((int64_t)blockIdx.z * T + tok) * n + row] = tot[m][j][e];
                else
                    y[tok * ys + row] = tot[m][j][e] + (bias ? bias[row] : 0.0f);
            }
}

/* y = the ks partial sums of the k split in split order, + bias, for each matmul of a launch
 * (one, or a group's members, their sums from part + poff): one thread per output */
__global__ void i8_reduce_grp_kernel(const float *__restrict__ part, int ks, const i8_grp gp,
                                     int T) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int mi = 0;
    for (; mi < gp.nm; mi++) {
        if (i < (int64_t)T * gp.m[mi].n) break;
        i -= (int64_t)T * gp.m[mi].n;
    }
    if (mi >= gp.nm) return;
    const i8_mm &mm = gp.m[mi];
    const int64_t tok = i / mm.n, row = i % mm.n, step = (int64_t)T * mm.n;
    const float *p = part + mm.poff;
    float s = p[i];
    for (int z = 1; z < ks; z++) s += p[z * step + i];
    mm.y[tok * mm.ys + row] = s + (mm.bias ? mm.bias[row] : 0.0f);
}

/* ---- host side ---- */

static int i8_on_state = -1, i8_mt = 0, i8_min_t = I8_MIN_T, i8_occ = 0, i8_ks_fixed = 0, i8_v = 0,
           i8_max_t = 0;

/* the most tokens the GEMM serves (n > 0; tests take every size with 1 << 30); 0: KILN_I8_MAX_T
 * or I8_MAX_T */
extern "C" void kiln_cuda_gemm_i8_max_t(int n) {
    i8_max_t = n > 0 ? n : 0;
}
static int64_t i8_max_t_get(void) {
    if (i8_max_t > 0) return i8_max_t;
    const char *e = getenv("KILN_I8_MAX_T");
    const long v = e ? strtol(e, NULL, 10) : 0;
    return v > 0 ? v : I8_MAX_T;
}

/* 1: version 1 (loads through L1), 2: version 2 (shared memory, cp.async: the default); 0:
 * KILN_I8_V=1, else 2 */
extern "C" void kiln_cuda_gemm_i8_variant(int v) {
    i8_v = v == 1 || v == 2 ? v : 0;
}
static int i8_v_get(void) {
    if (!i8_v) {
        const char *e = getenv("KILN_I8_V");
        i8_v = e && e[0] == '1' ? 1 : 2;
    }
    return i8_v;
}

/* Tests: the grid's k split forced to ks ranges (0: by the grid size; still bounded by the
 * superchunks, 16 and the scratch) */
extern "C" void kiln_cuda_gemm_i8_ksplit(int ks) {
    i8_ks_fixed = ks > 0 ? ks : 0;
}

extern "C" void kiln_cuda_gemm_i8_set(int on) {
    i8_on_state = on < 0 ? -1 : on ? 1 : 0;
}
extern "C" void kiln_cuda_gemm_i8_config(int mt, int min_t, int occ) {
    i8_mt = mt == 2 || mt == 4 ? mt : 0;
    i8_min_t = min_t > 0 ? min_t : I8_MIN_T;
    i8_occ = occ == 1 || occ == 2 ? occ : 0;
}

/* CTAs per SM the kernel is built for (2 row tiles a warp): two (under 128 registers, no
 * prefetch: the default, faster at 16-512 tokens in run 1) or, with KILN_I8_OCC=1 or the
 * setter, one (the next superchunk's weights prefetched into registers) */
static int i8_occ_get(void) {
    if (!i8_occ) {
        const char *e = getenv("KILN_I8_OCC");
        i8_occ = e && e[0] == '1' ? 1 : 2;
    }
    return i8_occ;
}

static bool i8_on(void) {
    if (i8_on_state < 0) {
        const char *e = getenv("KILN_CUDA_NO_I8");
        i8_on_state = e && e[0] == '1' ? 0 : 1;
    }
    return i8_on_state != 0;
}

/* row tiles per warp for t tokens: KILN_I8_MT=2|4 or the setter; else 2 (4: not measured
 * faster yet) */
static int i8_mt_for(int64_t t) {
    (void)t;
    if (!i8_mt) {
        const char *e = getenv("KILN_I8_MT");
        i8_mt = e && e[0] == '4' ? 4 : 2;
    }
    return i8_mt;
}

/* digits + factors of ch tokens (a multiple of 8): 32 bytes a lane per (block, 8 tokens) */
static size_t i8_bytes(int64_t k, int64_t ch) {
    return (size_t)ch / 8 * (size_t)(k / 32) * 1024;
}

extern "C" size_t kiln_cuda_gemm_i8_workspace(const struct kiln_sel_ctx *ctx) {
    size_t ws = kiln_cuda_gemm_t16_workspace(ctx); /* the fallbacks: T16 GEMM / gemv */
    if (ctx->tokens_max > 64) {                    /* and cuBLAS (KILN_CUDA_NO_I8=1) */
        const size_t b = kiln_cuda_matmul_cublas_workspace(ctx);
        ws = b > ws ? b : ws;
    }
    if (ctx->k <= 0 || ctx->tokens_max < I8_MIN_T) return ws; /* fewer: never the GEMM */
    int64_t ch = ctx->tokens_max < I8_CHUNK ? ctx->tokens_max : I8_CHUNK;
    ch = ch < i8_max_t_get() ? ch : i8_max_t_get(); /* more tokens: cuBLAS */
    ch = (ch + 7) / 8 * 8;
    /* the k split's partial sums: at most I8_MAX_KS x ch x n floats, at most I8_PART_BYTES
     * (a call with less room splits k less: i8_split) */
    size_t part = I8_PART_BYTES;
    if (ctx->n > 0 && (size_t)ctx->n <= I8_PART_BYTES) {
        const size_t need = (size_t)I8_MAX_KS * (size_t)ch * (size_t)ctx->n * sizeof(float);
        part = need < part ? need : part;
    }
    const size_t g = i8_bytes(ctx->k, ch) + 256 + part;
    return g > ws ? g : ws;
}

static bool i8_ok(const kiln_matmul_args *a) {
    return a->w_layout == KILN_WLAYOUT_CUDA_T16 &&
           (a->w_dtype == KILN_DTYPE_Q4_0 || a->w_dtype == KILN_DTYPE_Q8_0) && a->k > 0 &&
           a->k % KILN_CUDA_T16_K == 0 && ((uintptr_t)a->w & 15) == 0 &&
           ((uintptr_t)a->x & 15) == 0 && (a->x_stride & 3) == 0 && a->n > 0 &&
           (a->n + 15) / 16 <= (int64_t)65535 * 16 && a->k <= (int64_t)1 << 24;
}

/* Tokens per chunk the scratch holds (a multiple of 8, at most I8_CHUNK); 0: none */
static int64_t i8_chunk(const kiln_kctx *c, int64_t k, int64_t t) {
    if (!c || !c->scratch || ((uintptr_t)c->scratch & 15)) return 0;
    int64_t ch = t < I8_CHUNK ? (t + 7) / 8 * 8 : I8_CHUNK;
    while (ch >= 8 && i8_bytes(k, ch) > c->scratch_size) ch -= 8;
    return ch >= 8 ? ch : 0;
}

static bool i8_use(const kiln_kctx *c, const kiln_matmul_args *m, int nm) {
    if (!i8_on() || m[0].t < i8_min_t || m[0].t > i8_max_t_get()) return false;
    for (int i = 0; i < nm; i++)
        if (!i8_ok(&m[i])) return false;
    return i8_chunk(c, m[0].k, m[0].t) >= 8;
}

/* the k split for a grid of ctas CTAs: enough for 2 CTAs per SM, at most I8_MAX_KS ranges
 * and nk superchunks, partial sums within pb bytes; returns the range length (per) */
static int i8_split(int64_t ctas, int64_t nk, int64_t T, int64_t n, size_t pb, int64_t *ks_out,
                    int64_t most = I8_MAX_KS) {
    const int64_t want = 2 * (int64_t)kc_device_sms();
    int64_t ks = i8_ks_fixed > 0 ? i8_ks_fixed : (want + ctas - 1) / ctas;
    const int64_t maxks = nk < most ? nk : most;
    ks = ks < 1 ? 1 : ks > maxks ? maxks : ks;
    while (ks > 1 && (size_t)ks * (size_t)T * (size_t)n * sizeof(float) > pb) ks--;
    const int per = (int)((nk + ks - 1) / ks);
    *ks_out = (nk + per - 1) / per; /* no empty range */
    return per;
}

template <int DT, int MT, int NT, int MINB>
static void launch_i8_cfg(cudaStream_t s, const kiln_matmul_args *a, const uint4 *xq, int T,
                          float *y, float *part, size_t part_bytes) {
    const int64_t tiles = (a->n + 15) / 16, nk = a->k / KILN_CUDA_T16_K;
    const int ntt = (T + 7) / 8;
    const unsigned gx = (unsigned)((ntt + NT - 1) / NT);
    /* the warps split rows (sharing the activations through L1) as far as the rows go, the
     * rest split k inside the CTA; then the grid splits k (ks ranges, partial sums in
     * scratch, added in order by i8_reduce_grp_kernel) until there are 2 CTAs per SM */
    int wr = I8_WARPS;
    while (wr > 1 && (int64_t)(wr / 2) * MT >= tiles) wr /= 2;
    const int64_t gy = (tiles + (int64_t)wr * MT - 1) / ((int64_t)wr * MT);
    int64_t ks = 1;
    const int per = i8_split(gy * gx, nk, T, a->n, part_bytes, &ks);
    gemm_i8_kernel<DT, MT, NT, MINB><<<dim3(gx, (unsigned)gy, (unsigned)ks), I8_WARPS * 32, 0, s>>>(
        (const uint8_t *)a->w, a->n, a->k, xq, T, y, a->y_stride, a->bias, wr, per,
        ks > 1 ? part : NULL);
    if (ks > 1) {
        i8_grp gp;
        memset(&gp, 0, sizeof gp);
        gp.nm = 1;
        gp.m[0] = i8_mm{(const uint8_t *)a->w, y, a->bias, a->n, a->y_stride, 0, 0};
        const int64_t m = (int64_t)T * a->n;
        i8_reduce_grp_kernel<<<(unsigned)((m + 255) / 256), 256, 0, s>>>(part, (int)ks, gp, T);
    }
}

template <int DT, int NT> static void i8s_attrs(size_t smem) {
    /* the shared memory past 48 KB, asked once per device (setting it twice is harmless) */
    static unsigned long long attr_set = 0;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) dev = 63;
    if (!((__atomic_load_n(&attr_set, __ATOMIC_RELAXED) >> dev) & 1ull)) {
        (void)cudaFuncSetAttribute(gemm_i8s_kernel<DT, NT>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        __atomic_fetch_or(&attr_set, 1ull << dev, __ATOMIC_RELAXED);
    }
}

/* Version 2's k split: the ks (<= 16, <= the superchunks, partial sums of
 * ntot rows within pb bytes) whose waves x (range length + 1) is least, fewest ranges on
 * ties; a wave is 2 CTAs per SM (the +1: a CTA's fixed cost, about one superchunk's) */
static int i8_split_waves(int64_t ctas, int64_t nk, int64_t T, int64_t ntot, size_t pb,
                          int64_t *ks_out) {
    const int64_t slots = 2 * (int64_t)kc_device_sms();
    int64_t most = i8_ks_fixed > 0 ? i8_ks_fixed : I8_MAX_KS;
    most = most < nk ? most : nk;
    while (most > 1 && (size_t)most * (size_t)T * (size_t)ntot * sizeof(float) > pb) most--;
    int64_t best = 1, best_cost = INT64_MAX;
    for (int64_t ks = i8_ks_fixed > 0 ? most : 1; ks <= most; ks++) {
        const int64_t per = (nk + ks - 1) / ks, waves = (ctas * ks + slots - 1) / slots;
        if (waves * (per + 1) < best_cost) best_cost = waves * (per + 1), best = ks;
    }
    const int per = (int)((nk + best - 1) / best);
    *ks_out = (nk + per - 1) / per; /* no empty range */
    return per;
}

/* Version 2 on nm matmuls of one dtype sharing x, in one launch: the k split's partial sums
 * in part (pb bytes), added in split order by i8_reduce_grp_kernel. (Session 19 also tried
 * the split reduced in thread-block clusters through distributed shared memory: the same
 * bits, slower; removed, docs/CUDA.md.) */
template <int DT, int NT>
static void launch_i8s(cudaStream_t s, const kiln_matmul_args *m, int nm, const uint4 *xq, int T,
                       float *part, size_t pb) {
    const int64_t nk = m[0].k / KILN_CUDA_T16_K;
    const int ntt = (T + 7) / 8;
    const unsigned gx = (unsigned)((ntt + NT - 1) / NT);
    i8_grp gp;
    memset(&gp, 0, sizeof gp);
    gp.nm = nm;
    int64_t gy = 0, ntot = 0;
    for (int i = 0; i < nm; i++) {
        const int64_t tiles = (m[i].n + 15) / 16;
        gp.m[i] =
            i8_mm{(const uint8_t *)m[i].w, m[i].y, m[i].bias, m[i].n, m[i].y_stride, 0, (int)gy};
        gy += (tiles + I8_WARPS * I8S_MT - 1) / (I8_WARPS * I8S_MT);
        ntot += m[i].n;
    }
    int64_t ks = 1;
    const size_t smem = sizeof(i8s_smem<DT, NT>);
    i8s_attrs<DT, NT>(smem);
    const int per = i8_split_waves(gy * gx, nk, T, ntot, pb, &ks);
    for (int i = 1; i < nm; i++) gp.m[i].poff = gp.m[i - 1].poff + ks * (int64_t)T * m[i - 1].n;
    gemm_i8s_kernel<DT, NT><<<dim3(gx, (unsigned)gy, (unsigned)ks), I8_WARPS * 32, smem, s>>>(
        gp, m[0].k, xq, T, per, ks > 1 ? part : NULL);
    if (ks > 1) {
        const int64_t e = (int64_t)T * ntot;
        i8_reduce_grp_kernel<<<(unsigned)((e + 255) / 256), 256, 0, s>>>(part, (int)ks, gp, T);
    }
}

/* Version 2 (the default) on nm matmuls of dtype DT sharing x */
template <int DT>
static void launch_i8v2(cudaStream_t s, const kiln_matmul_args *m, int nm, const uint4 *xq, int T,
                        float *part, size_t pb) {
    if ((T + 7) / 8 <= 2)
        launch_i8s<DT, 2>(s, m, nm, xq, T, part, pb);
    else
        launch_i8s<DT, 4>(s, m, nm, xq, T, part, pb);
}

/* Version 1 (KILN_I8_V=1) on one matmul */
template <int DT>
static void launch_i8(cudaStream_t s, const kiln_matmul_args *a, const uint4 *xq, int T, float *y,
                      float *part, size_t pb) {
    const int ntt = (T + 7) / 8;
    const bool o2 = i8_occ_get() == 2;
    if (ntt <= 2) {
        if (o2)
            launch_i8_cfg<DT, 2, 2, 2>(s, a, xq, T, y, part, pb);
        else
            launch_i8_cfg<DT, 2, 2, 1>(s, a, xq, T, y, part, pb);
    } else if (i8_mt_for(T) == 4 && ntt > 8)
        launch_i8_cfg<DT, 4, 4, 1>(s, a, xq, T, y, part, pb);
    else if (o2)
        launch_i8_cfg<DT, 2, 4, 2>(s, a, xq, T, y, part, pb);
    else
        launch_i8_cfg<DT, 2, 4, 1>(s, a, xq, T, y, part, pb);
}

/* matmuls m[0..nm) sharing x (one prep per chunk of tokens), then one GEMM each */
static kiln_status i8_run(const kiln_kctx *c, const kiln_matmul_args *m, int nm) {
    const int64_t k = m[0].k, t = m[0].t, ch = i8_chunk(c, k, t);
    cudaStream_t s = KC_STREAM(c);
    uint32_t *xq = (uint32_t *)c->scratch;
    const size_t dq = (i8_bytes(k, ch) + 255) / 256 * 256; /* then the partial sums */
    float *part = (float *)((char *)c->scratch + dq);
    const size_t pb = c->scratch_size > dq ? c->scratch_size - dq : 0;
    const bool v2 = i8_v_get() == 2;
    for (int64_t t0 = 0; t0 < t; t0 += ch) {
        const int T = (int)(t - t0 < ch ? t - t0 : ch), Tp = (T + 7) / 8 * 8;
        const int64_t thr = (int64_t)Tp * (k / 4);
        xq8_prep_kernel<<<(unsigned)((thr + 255) / 256), 256, 0, s>>>(m[0].x + t0 * m[0].x_stride,
                                                                      m[0].x_stride, k, T, Tp, xq);
        /* this chunk's members: their outputs from token t0 */
        kiln_matmul_args mc[KILN_MATMUL_GROUP_MAX];
        bool one_dt = true;
        for (int i = 0; i < nm; i++) {
            mc[i] = m[i];
            mc[i].y = m[i].y + t0 * m[i].y_stride;
            one_dt = one_dt && m[i].w_dtype == m[0].w_dtype;
        }
        if (v2 && one_dt) { /* one launch for the group */
            if (m[0].w_dtype == KILN_DTYPE_Q4_0)
                launch_i8v2<KILN_DTYPE_Q4_0>(s, mc, nm, (const uint4 *)xq, T, part, pb);
            else
                launch_i8v2<KILN_DTYPE_Q8_0>(s, mc, nm, (const uint4 *)xq, T, part, pb);
            continue;
        }
        for (int i = 0; i < nm; i++) {
            const bool q4 = m[i].w_dtype == KILN_DTYPE_Q4_0;
            if (v2 && q4)
                launch_i8v2<KILN_DTYPE_Q4_0>(s, &mc[i], 1, (const uint4 *)xq, T, part, pb);
            else if (v2)
                launch_i8v2<KILN_DTYPE_Q8_0>(s, &mc[i], 1, (const uint4 *)xq, T, part, pb);
            else if (q4)
                launch_i8<KILN_DTYPE_Q4_0>(s, &mc[i], (const uint4 *)xq, T, mc[i].y, part, pb);
            else
                launch_i8<KILN_DTYPE_Q8_0>(s, &mc[i], (const uint4 *)xq, T, mc[i].y, part, pb);
        }
    }
    return kc_launched();
}

/* cuda.gemm_i8.matmul: the int8 GEMM from 12 tokens; else (fewer tokens, the GEMM off,
 * shapes it does not take) the previous selection: up to 64 tokens the T16 GEMM's entry (the
 * T16 gemv below 12), above cuBLAS on the T16 weights */
extern "C" kiln_status kiln_cuda_matmul_i8(const kiln_kctx *c, const kiln_matmul_args *a) {
    if (a->t <= 0 || a->n <= 0) return KILN_OK;
    if (i8_use(c, a, 1)) return i8_run(c, a, 1);
    return a->t <= 64 ? kiln_cuda_matmul_t16_gemm(c, a) : kiln_cuda_matmul_cublas(c, a);
}

/* A matmul group whose members all run kiln_cuda_matmul_i8: one prep of x per chunk and a
 * GEMM per member; else the previous selection's group entries. KILN_ERR_UNSUPPORTED: not
 * such a group (the caller runs the members one by one). */
extern "C" kiln_status kiln_cuda_matmul_i8_group(const kiln_kctx *c, const kiln_matmul_args *m,
                                                 int nm) {
    if (nm < 1 || nm > KILN_MATMUL_GROUP_MAX) return KILN_ERR_UNSUPPORTED;
    for (int i = 0; i < nm; i++)
        if (m[i].k != m[0].k || m[i].t != m[0].t || m[i].x != m[0].x ||
            m[i].x_stride != m[0].x_stride || m[i].t <= 0)
            return KILN_ERR_UNSUPPORTED;
    if (i8_use(c, m, nm)) return i8_run(c, m, nm);
    return m[0].t <= 64 ? kiln_cuda_matmul_t16_gemm_group(c, m, nm)
                        : kiln_cuda_matmul_cublas_group(c, m, nm);
}
