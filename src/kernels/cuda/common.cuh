/*
 * common.cuh — shared device helpers of kiln's CUDA kernels: launch checking (errors
 * become kiln_status, never exit/abort) and the per-dtype dequantization of one
 * 32-element sub-block of a weight row into registers (ggml block layouts, the same
 * formulas as src/format/quants.c).
 */
#ifndef KILN_KERNELS_CUDA_COMMON_CUH
#define KILN_KERNELS_CUDA_COMMON_CUH

#include "format/dtype.h"
#include "kernels/cuda/cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define KC_STREAM(c) ((cudaStream_t)((c) ? (c)->stream : NULL))

/* After a launch: the launch's own error (bad configuration, no device). */
static inline kiln_status kc_launched(void) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? KILN_OK : KILN_ERR_DEVICE;
}

/* Programmatic dependent launch (sm_90; no-ops below and in a kernel launched without the
 * attribute): kc_pdl_trigger lets the next kernel on the stream, when it is launched with
 * programmatic stream serialization (kc_launch_pdl), start while this one runs; that kernel
 * calls kc_pdl_wait before it reads what this one writes or writes anything (the wait
 * returns once this grid has completed and its writes are visible). */
__device__ __forceinline__ void kc_pdl_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void kc_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* bytes (a multiple of 16) at p (16-byte aligned) into L2, asynchronously (sm_90) */
__device__ __forceinline__ void kc_prefetch_l2(const void *p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    (void)p, (void)bytes;
#endif
}

/* the 128-byte line at p into L2 (a hint: no registers, nothing waits on it) */
__device__ __forceinline__ void kc_prefetch_line_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

#ifdef __CUDACC__
/* kernel<<<grid, block, 0, s>>>(args...), with programmatic stream serialization when pdl */
template <typename... KArgs, typename... Args>
static inline void kc_launch_pdl(void (*kernel)(KArgs...), unsigned grid, unsigned block,
                                 cudaStream_t s, bool pdl, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    (void)cudaLaunchKernelEx(&cfg, kernel, args...); /* an error stays for kc_launched */
}
#endif

__device__ __forceinline__ float kc_h2f(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ float kc_bf2f(uint16_t b) {
    return __uint_as_float((uint32_t)b << 16);
}
__device__ __forceinline__ uint16_t kc_ld16(const uint8_t *p) {
    return *(const uint16_t *)p;
}
__device__ __forceinline__ uint32_t kc_ld32u(const uint8_t *p) { /* 2-byte aligned */
    return (uint32_t)kc_ld16(p) | ((uint32_t)kc_ld16(p + 2) << 16);
}

/* Byte j of u as the float 2^23 + byte (0x4B0000bb): subtracting 2^23 (+ an offset)
 * gives the byte's integer value exactly. */
__device__ __forceinline__ float kc_magic(uint32_t u, int j) {
    return __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7640u | (uint32_t)j));
}

/* Bytes of one 32-element group in the row (block-size aware: K-quants have 8 groups
 * per 256-element block of sizeof(block) bytes). */
template <int DT> struct kc_dt;
template <> struct kc_dt<KILN_DTYPE_F32> { static constexpr int BLK = 32, BYTES = 128; };
template <> struct kc_dt<KILN_DTYPE_F16> { static constexpr int BLK = 32, BYTES = 64; };
template <> struct kc_dt<KILN_DTYPE_BF16> { static constexpr int BLK = 32, BYTES = 64; };
template <> struct kc_dt<KILN_DTYPE_Q4_0> { static constexpr int BLK = 32, BYTES = 18; };
template <> struct kc_dt<KILN_DTYPE_Q4_1> { static constexpr int BLK = 32, BYTES = 20; };
template <> struct kc_dt<KILN_DTYPE_Q5_0> { static constexpr int BLK = 32, BYTES = 22; };
template <> struct kc_dt<KILN_DTYPE_Q5_1> { static constexpr int BLK = 32, BYTES = 24; };
template <> struct kc_dt<KILN_DTYPE_Q8_0> { static constexpr int BLK = 32, BYTES = 34; };
template <> struct kc_dt<KILN_DTYPE_Q4_K> { static constexpr int BLK = 256, BYTES = 144; };
template <> struct kc_dt<KILN_DTYPE_Q5_K> { static constexpr int BLK = 256, BYTES = 176; };
template <> struct kc_dt<KILN_DTYPE_Q6_K> { static constexpr int BLK = 256, BYTES = 210; };

__device__ __forceinline__ void kc_scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Dequantizes 32-element group g (elements [32 g, 32 g + 32)) of a weight row (global
 * or shared memory: plain loads, the compiler picks the space). */
template <int DT>
__device__ __forceinline__ void kc_dq32(const uint8_t *row, int64_t g, float w[32]) {
    if constexpr (DT == KILN_DTYPE_F32) {
        const float4 *p = (const float4 *)(row + g * 128);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float4 v = p[i];
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
    } else if constexpr (DT == KILN_DTYPE_F16 || DT == KILN_DTYPE_BF16) {
        const uint4 *p = (const uint4 *)(row + g * 64);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint4 v = p[i];
            uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint16_t lo = (uint16_t)(u[j] & 0xffff), hi = (uint16_t)(u[j] >> 16);
                if constexpr (DT == KILN_DTYPE_F16) {
                    w[8 * i + 2 * j] = kc_h2f(lo);
                    w[8 * i + 2 * j + 1] = kc_h2f(hi);
                } else {
                    w[8 * i + 2 * j] = kc_bf2f(lo);
                    w[8 * i + 2 * j + 1] = kc_bf2f(hi);
                }
            }
        }
    } else if constexpr (DT == KILN_DTYPE_Q4_0) {
        /* nibbles -> exact floats by the magic-number trick (one PRMT + one FADD each,
         * no integer shifts or I2F per element), then * d as before: bitwise the same
         * values as (float)(q - 8) * d */
        const uint8_t *b = row + g * 18;
        const float d = kc_h2f(kc_ld16(b));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t u = kc_ld32u(b + 2 + 4 * i);
            const uint32_t lo = u & 0x0F0F0F0Fu, hi = (u >> 4) & 0x0F0F0F0Fu;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                w[4 * i + j] = (kc_magic(lo, j) - 8388616.0f) * d;
                w[4 * i + j + 16] = (kc_magic(hi, j) - 8388616.0f) * d;
            }
        }
    } else if constexpr (DT == KILN_DTYPE_Q4_1) {
        const uint8_t *b = row + g * 20;
        const uint32_t dm = *(const uint32_t *)b;
        const float d = kc_h2f((uint16_t)(dm & 0xffff)), m = kc_h2f((uint16_t)(dm >> 16));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t q = *(const uint32_t *)(b + 4 + 4 * i);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int qb = (q >> (8 * j)) & 0xff;
                w[4 * i + j] = (float)(qb & 0xF) * d + m;
                w[4 * i + j + 16] = (float)(qb >> 4) * d + m;
            }
        }
    } else if constexpr (DT == KILN_DTYPE_Q5_0 || DT == KILN_DTYPE_Q5_1) {
        constexpr bool one = DT == KILN_DTYPE_Q5_1;
        const uint8_t *b = row + g * (one ? 24 : 22);
        const float d = kc_h2f(kc_ld16(b));
        const float m = one ? kc_h2f(kc_ld16(b + 2)) : 0.0f;
        const uint8_t *hq = b + (one ? 4 : 2);
        const uint32_t qh = kc_ld32u(hq);
        const uint8_t *qs = hq + 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint16_t q = kc_ld16(qs + 2 * i);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                int e = 2 * i + j;
                int qb = (q >> (8 * j)) & 0xff;
                int x0 = (qb & 0xF) | (((qh >> e) << 4) & 0x10);
                int x1 = (qb >> 4) | ((qh >> (e + 12)) & 0x10);
                if constexpr (one) {
                    w[e] = (float)x0 * d + m;
                    w[e + 16] = (float)x1 * d + m;
                } else {
                    w[e] = (float)(x0 - 16) * d;
                    w[e + 16] = (float)(x1 - 16) * d;
                }
            }
        }
    } else if constexpr (DT == KILN_DTYPE_Q8_0) {
        /* signed bytes -> offset binary (xor 0x80) -> exact floats by the magic number */
        const uint8_t *b = row + g * 34;
        const float d = kc_h2f(kc_ld16(b));
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t u = kc_ld32u(b + 2 + 4 * i) ^ 0x80808080u;
#pragma unroll
            for (int j = 0; j < 4; j++) w[4 * i + j] = (kc_magic(u, j) - 8388736.0f) * d;
        }
    } else if constexpr (DT == KILN_DTYPE_Q4_K || DT == KILN_DTYPE_Q5_K) {
        constexpr bool five = DT == KILN_DTYPE_Q5_K;
        const uint8_t *b = row + (g >> 3) * (five ? 176 : 144);
        const int j = (int)(g & 7);
        const uint32_t dm = *(const uint32_t *)b;
        const float d = kc_h2f((uint16_t)(dm & 0xffff)), dmin = kc_h2f((uint16_t)(dm >> 16));
        int sc, mn;
        kc_scale_min_k4(j, b + 4, &sc, &mn);
        const float d1 = d * (float)sc, m1 = dmin * (float)mn;
        const uint4 *qs = (const uint4 *)(b + (five ? 48 : 16) + (j >> 1) * 32);
        const int shift = (j & 1) * 4;
        uint4 qv[2] = {qs[0], qs[1]};
        uint4 hv[2];
        if constexpr (five) {
            const uint4 *qh = (const uint4 *)(b + 16);
            hv[0] = qh[0], hv[1] = qh[1];
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            uint32_t u[4] = {qv[i].x, qv[i].y, qv[i].z, qv[i].w};
            uint32_t h[4] = {0, 0, 0, 0};
            if constexpr (five) h[0] = hv[i].x, h[1] = hv[i].y, h[2] = hv[i].z, h[3] = hv[i].w;
#pragma unroll
            for (int k = 0; k < 16; k++) {
                int qb = (u[k >> 2] >> (8 * (k & 3))) & 0xff;
                int q = (qb >> shift) & 0xF;
                if constexpr (five) q += ((h[k >> 2] >> (8 * (k & 3) + j)) & 1) << 4;
                w[16 * i + k] = d1 * (float)q - m1;
            }
        }
    } else if constexpr (DT == KILN_DTYPE_Q6_K) {
        const uint8_t *b = row + (g >> 3) * 210;
        const int j = (int)(g & 7), nh = j >> 2, r = j & 3;
        const uint8_t *ql = b + nh * 64 + (r & 1) * 32;
        const uint8_t *qh = b + 128 + nh * 32;
        const int8_t *scs = (const int8_t *)(b + 192) + nh * 8 + 2 * r;
        const float d = kc_h2f(kc_ld16(b + 208));
        const float d0 = d * (float)scs[0], d1 = d * (float)scs[1];
        const int lshift = (r >> 1) * 4, hshift = 2 * r;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            uint16_t l2 = kc_ld16(ql + 2 * i), h2 = kc_ld16(qh + 2 * i);
#pragma unroll
            for (int k = 0; k < 2; k++) {
                int e = 2 * i + k;
                int lb = (l2 >> (8 * k)) & 0xff, hb = (h2 >> (8 * k)) & 0xff;
                int q = (((lb >> lshift) & 0xF) | (((hb >> hshift) & 3) << 4)) - 32;
                w[e] = (e < 16 ? d0 : d1) * (float)q;
            }
        }
    }
}

/* Runtime dtype -> template dispatch: F(DT) is instantiated for every dtype. */
#define KC_DTYPE_SWITCH(dt, F, ...)                                                                \
    switch (dt) {                                                                                  \
    case KILN_DTYPE_F32:                                                                           \
        F(KILN_DTYPE_F32, __VA_ARGS__);                                                            \
        break;                                                                                     \
    case KILN_DTYPE_F16:                                                                           \
        F(KILN_DTYPE_F16, __VA_ARGS__);                                                            \
        break;                                                                                     \
    case KILN_DTYPE_BF16:                                                                          \
        F(KILN_DTYPE_BF16, __VA_ARGS__);                                                           \
        break;                                                                                     \
    case KILN_DTYPE_Q4_0:                                                                          \
        F(KILN_DTYPE_Q4_0, __VA_ARGS__);                                                           \
        break;                                                                                     \
    case KILN_DTYPE_Q4_1:                                                                          \
        F(KILN_DTYPE_Q4_1, __VA_ARGS__);                                                           \
        break;                                                                                     \
    case KILN_DTYPE_Q5_0:                                                                          \
        F(KILN_DTYPE_Q5_0, __VA_ARGS__);                                                           \
        break;                                                                                     \
    case KILN_DTYPE_Q5_1:                                                                          \
        F(KILN_DTYPE_Q5_1, __VA_ARGS__);                                                           \
        break;                                                                                     \
    case KILN_DTYPE_Q8_0:                                                                          \
        F(KILN_DTYPE_Q8_0, __VA_ARGS__);                                                           \
        break;                                                                                     \
    case KILN_DTYPE_Q4_K:                                                                          \
        F(KILN_DTYPE_Q4_K, __VA_ARGS__);                                                           \
        break;                                                                                     \
    case KILN_DTYPE_Q5_K:                                                                          \
        F(KILN_DTYPE_Q5_K, __VA_ARGS__);                                                           \
        break;                                                                                     \
    case KILN_DTYPE_Q6_K:                                                                          \
        F(KILN_DTYPE_Q6_K, __VA_ARGS__);                                                           \
        break;                                                                                     \
    default:                                                                                       \
        return KILN_ERR_UNSUPPORTED;                                                               \
    }

/* Elements per block of a dtype the kernels read (0: not one of them). */
static inline int kc_block_elems(uint32_t dt) {
    switch (dt) {
    case KILN_DTYPE_F32:
    case KILN_DTYPE_F16:
    case KILN_DTYPE_BF16:
    case KILN_DTYPE_Q4_0:
    case KILN_DTYPE_Q4_1:
    case KILN_DTYPE_Q5_0:
    case KILN_DTYPE_Q5_1:
    case KILN_DTYPE_Q8_0:
        return 32;
    case KILN_DTYPE_Q4_K:
    case KILN_DTYPE_Q5_K:
    case KILN_DTYPE_Q6_K:
        return 256;
    default:
        return 0;
    }
}

/* 16 bytes global -> shared without registers (cp.async, sm_80+; a no-op below, where no
 * kernel using it is built), completed by kc_cp_commit + kc_cp_wait<N> (N groups may stay
 * in flight). Shared by the kernels that stage tiles through shared memory. */
__device__ __forceinline__ void kc_cp16(void *smem, const void *gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem));
#else
    (void)smem, (void)gmem;
#endif
}
__device__ __forceinline__ void kc_cp_commit(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void kc_cp_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

/* The current device's SMs (cached per host thread and device; 132 when the runtime cannot
 * say). For grid sizing on the host. */
static inline int kc_device_sms(void) {
    static __thread int dev_cached = -1, sms = 132;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return sms;
    if (dev != dev_cached) {
        int v = 0;
        if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && v > 0)
            sms = v;
        dev_cached = dev;
    }
    return sms;
}

#endif /* KILN_KERNELS_CUDA_COMMON_CUH */
