/*
 * mma.cuh — the tensor-core pieces the gemv kernels share (matmul.cu, gemv_t16.cu): the
 * mma.sync m16n8k16 f16 -> f32 instruction, exact f16 integers from quant bytes, the raw
 * A-fragment words of one 32-block for rows g and g + 8 (kc_mq), one block's four mma on
 * split-f16 activations (kc_mma_block), the CTA's warp-order reduction (kc_mma_store) and
 * the prep kernels' split of the activations into hi / lo halves (kc_split4).
 * See matmul.cu's tensor-core gemv comment for the fragment mapping and the numerics.
 */
#ifndef KILN_KERNELS_CUDA_MMA_CUH
#define KILN_KERNELS_CUDA_MMA_CUH

#include "kernels/cuda/common.cuh"

__device__ __forceinline__ void kc_mma16816(float c[4], const uint32_t a[4], uint32_t b0,
                                            uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)c, (void)a, (void)b0, (void)b1;
    __trap(); /* the spec asks for sm_80; never reached */
#endif
}

/* bytes sel of u as two f16 integers 1024 + byte, minus bias2 (two f16): exact */
__device__ __forceinline__ uint32_t kc_bytes_h2(uint32_t u, uint32_t sel, uint32_t bias2) {
    uint32_t v = __byte_perm(u, 0x64646464u, sel);
    __half2 h = __hsub2(*reinterpret_cast<__half2 *>(&v), *reinterpret_cast<__half2 *>(&bias2));
    return *reinterpret_cast<uint32_t *>(&h);
}

template <int DT> struct kc_mq; /* raw loads of one 32-block for rows g, g + 8 */
template <> struct kc_mq<KILN_DTYPE_Q4_0> {
    static constexpr bool E8 = false;
    uint32_t q[2];
    uint16_t d[2];
    __device__ __forceinline__ void load(const uint8_t *const rp[2], int64_t b, int tig) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint8_t *p = rp[i] + b * 18;
            d[i] = kc_ld16(p);
            q[i] = kc_ld32u(p + 2 + 4 * tig);
        }
    }
    __device__ __forceinline__ void frag(uint32_t a0[4], uint32_t a1[4], float dd[2]) const {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t lo = q[i] & 0x0F0F0F0Fu, hi = (q[i] >> 4) & 0x0F0F0F0Fu;
            a0[i] = kc_bytes_h2(lo, 0x4140u, 0x64086408u); /* 1032 = 1024 + 8 */
            a0[2 + i] = kc_bytes_h2(lo, 0x4342u, 0x64086408u);
            a1[i] = kc_bytes_h2(hi, 0x4140u, 0x64086408u);
            a1[2 + i] = kc_bytes_h2(hi, 0x4342u, 0x64086408u);
            dd[i] = kc_h2f(d[i]);
        }
    }
};
template <> struct kc_mq<KILN_DTYPE_Q8_0> {
    static constexpr bool E8 = false;
    uint32_t q[2][2];
    uint16_t d[2];
    __device__ __forceinline__ void load(const uint8_t *const rp[2], int64_t b, int tig) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint8_t *p = rp[i] + b * 34;
            d[i] = kc_ld16(p);
            q[i][0] = kc_ld32u(p + 2 + 4 * tig);
            q[i][1] = kc_ld32u(p + 18 + 4 * tig);
        }
    }
    __device__ __forceinline__ void frag(uint32_t a0[4], uint32_t a1[4], float dd[2]) const {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t u0 = q[i][0] ^ 0x80808080u, u1 = q[i][1] ^ 0x80808080u;
            a0[i] = kc_bytes_h2(u0, 0x4140u, 0x64806480u); /* 1152 = 1024 + 128 */
            a0[2 + i] = kc_bytes_h2(u0, 0x4342u, 0x64806480u);
            a1[i] = kc_bytes_h2(u1, 0x4140u, 0x64806480u);
            a1[2 + i] = kc_bytes_h2(u1, 0x4342u, 0x64806480u);
            dd[i] = kc_h2f(d[i]);
        }
    }
};
template <> struct kc_mq<KILN_DTYPE_F16> {
    static constexpr bool E8 = true;
    uint4 v[2];
    __device__ __forceinline__ void load(const uint8_t *const rp[2], int64_t b, int tig) {
#pragma unroll
        for (int i = 0; i < 2; i++) v[i] = *(const uint4 *)(rp[i] + b * 64 + 16 * tig);
    }
    __device__ __forceinline__ void frag(uint32_t a0[4], uint32_t a1[4], float dd[2]) const {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            a0[i] = v[i].x, a0[2 + i] = v[i].y, a1[i] = v[i].z, a1[2 + i] = v[i].w;
            dd[i] = 1.0f;
        }
    }
};

/* One 32-block: four mma (A = the block's exact f16 integers, B = hi then lo) into fresh
 * accumulators, then tot += d_row * acc * inv_token. ONE (a pass of one token, whose
 * column is 2 tig = 0: tot[1] and tot[3] hold tokens 2 tig + 1 >= 1, never stored): only
 * tot[0] and tot[2], the same operations on them. */
template <typename MQ, bool ONE = false>
__device__ __forceinline__ void kc_mma_block(const MQ &raw, const uint32_t bh[4],
                                             const uint32_t bl[4], float2 iv, float tot[4]) {
    uint32_t a0[4], a1[4];
    float dd[2];
    raw.frag(a0, a1, dd);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    kc_mma16816(acc, a0, bh[0], bh[1]);
    kc_mma16816(acc, a1, bh[2], bh[3]);
    kc_mma16816(acc, a0, bl[0], bl[1]);
    kc_mma16816(acc, a1, bl[2], bl[3]);
    /* c0, c1: row g, tokens 2 tig, 2 tig + 1; c2, c3: row g + 8 */
    tot[0] = fmaf(dd[0] * iv.x, acc[0], tot[0]);
    if constexpr (!ONE) tot[1] = fmaf(dd[0] * iv.y, acc[1], tot[1]);
    tot[2] = fmaf(dd[1] * iv.x, acc[2], tot[2]);
    if constexpr (!ONE) tot[3] = fmaf(dd[1] * iv.y, acc[3], tot[3]);
}

/* The CTA's partial sums (one set per warp) -> y, summed in warp order. */
template <int NW>
__device__ __forceinline__ void
kc_mma_store(float (*red)[32][4], const float tot[4], int w, int lane, int64_t r0, int64_t n, int T,
             float *__restrict__ y, int64_t ys, const float *__restrict__ bias) {
#pragma unroll
    for (int j = 0; j < 4; j++) red[w][lane][j] = tot[j];
    __syncthreads();
    if (w != 0) return;
    const int g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float v = red[0][lane][j];
#pragma unroll
        for (int ww = 1; ww < NW; ww++) v += red[ww][lane][j];
        const int64_t row = r0 + g + (j >= 2 ? 8 : 0);
        const int tok = 2 * tig + (j & 1);
        if (row < n && tok < T) y[tok * ys + row] = v + (bias ? bias[row] : 0.0f);
    }
}

/* The activation split shared by the tensor-core gemvs' prep kernels (xsplit_kernel,
 * matmul.cu; xsplit_t16_kernel, gemv_t16.cu): one thread's 4 values v of a 32-block, the
 * block's 8 threads being the lanes of gmask. Returns the block's power-of-two scale s =
 * 2^(15 - e) (block max < 2^e, so every |v s| < 2^15; 1 for a zero, inf or NaN block) and
 * writes the hi f16 halves of v s and the lo halves f16(v s - hi). */
__device__ __forceinline__ float kc_split4(float4 v, unsigned gmask, __half2 h[2], __half2 l[2]) {
    float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    m = fmaxf(m, __shfl_xor_sync(gmask, m, 1));
    m = fmaxf(m, __shfl_xor_sync(gmask, m, 2));
    m = fmaxf(m, __shfl_xor_sync(gmask, m, 4));
    float sc = 1.0f;
    if (m > 0.0f && isfinite(m)) {
        int e;
        frexpf(m, &e);
        int p = 15 - e;
        p = p > 126 ? 126 : p < -126 ? -126 : p;
        sc = ldexpf(1.0f, p);
    }
    const float a[4] = {v.x * sc, v.y * sc, v.z * sc, v.w * sc};
#pragma unroll
    for (int q = 0; q < 2; q++) {
        h[q] = __floats2half2_rn(a[2 * q], a[2 * q + 1]);
        const float2 hf = __half22float2(h[q]);
        l[q] = __floats2half2_rn(a[2 * q] - hf.x, a[2 * q + 1] - hf.y);
    }
    return sc;
}

#endif /* KILN_KERNELS_CUDA_MMA_CUH */
