/*
 * matmul_f_avx2.c — float-weight matmul (f32, f16, bf16 weights; f32 activations) for
 * AVX2 + FMA + F16C. Same structure as matmul_f_avx512.c, 8 floats per register; the
 * GEMM micro-kernel is 2 rows x 4 tokens (8 ymm accumulators).
 */
#include "format/dtype.h"
#include "kernels/cpu/cpu_impl.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

INLINE __m256 wload8(uint32_t dt, const uint8_t *row, int64_t i) {
    switch (dt) {
    case KILN_DTYPE_F32:
        return _mm256_loadu_ps((const float *)row + i);
    case KILN_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    default:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i))),
            16));
    }
}

INLINE float wload1(uint32_t dt, const uint8_t *row, int64_t i) {
    uint16_t h;
    switch (dt) {
    case KILN_DTYPE_F32:
        return ((const float *)row)[i];
    case KILN_DTYPE_F16:
        memcpy(&h, row + 2 * i, 2);
        return _cvtsh_ss(h);
    default: {
        memcpy(&h, row + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    }
}

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE float gemv_row(uint32_t dt, const uint8_t *row, int64_t k, const float *x) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        a0 = _mm256_fmadd_ps(wload8(dt, row, i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(wload8(dt, row, i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    for (; i + 8 <= k; i += 8) a0 = _mm256_fmadd_ps(wload8(dt, row, i), _mm256_loadu_ps(x + i), a0);
    float s = hsum8(_mm256_add_ps(a0, a1));
    for (; i < k; i++) s += wload1(dt, row, i) * x[i];
    return s;
}

INLINE void widen_row(uint32_t dt, const uint8_t *row, int64_t k, float *p) {
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_store_ps(p + i, wload8(dt, row, i));
    for (; i < k; i++) p[i] = wload1(dt, row, i);
    for (; i % 8; i++) p[i] = 0.0f;
}

INLINE void micro(int R, int T, const float *panel, int64_t pstride, int64_t k, const float *x,
                  int64_t xs, float *out) {
    __m256 acc[2][4];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 w[2];
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) w[r] = _mm256_load_ps(panel + r * pstride + i);
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            __m256 xv = _mm256_loadu_ps(x + t * xs + i);
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(w[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            float s = hsum8(acc[r][t]);
            for (int64_t j = i; j < k; j++) s += panel[r * pstride + j] * x[t * xs + j];
            out[r * 4 + t] = s;
        }
}

static void micro_dispatch(int R, int T, const float *panel, int64_t pstride, int64_t k,
                           const float *x, int64_t xs, float *out) {
    if (R == 2) {
        switch (T) {
        case 4:
            micro(2, 4, panel, pstride, k, x, xs, out);
            return;
        case 3:
            micro(2, 3, panel, pstride, k, x, xs, out);
            return;
        case 2:
            micro(2, 2, panel, pstride, k, x, xs, out);
            return;
        default:
            micro(2, 1, panel, pstride, k, x, xs, out);
            return;
        }
    }
    switch (T) {
    case 4:
        micro(1, 4, panel, pstride, k, x, xs, out);
        return;
    case 3:
        micro(1, 3, panel, pstride, k, x, xs, out);
        return;
    case 2:
        micro(1, 2, panel, pstride, k, x, xs, out);
        return;
    default:
        micro(1, 1, panel, pstride, k, x, xs, out);
        return;
    }
}

static void widen_dispatch(uint32_t dt, const uint8_t *row, int64_t k, float *p) {
    switch (dt) {
    case KILN_DTYPE_F32:
        widen_row(KILN_DTYPE_F32, row, k, p);
        break;
    case KILN_DTYPE_F16:
        widen_row(KILN_DTYPE_F16, row, k, p);
        break;
    default:
        widen_row(KILN_DTYPE_BF16, row, k, p);
        break;
    }
}

static void gemm(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel_bytes) {
    float *panel = (float *)panel_bytes;
    const int64_t pstride = (p->k + 15) / 16 * 16;
    float out[16];
    for (int64_t r = r0; r < r1;) {
        int R = r1 - r >= 2 ? 2 : 1;
        for (int i = 0; i < R; i++)
            widen_dispatch(p->dtype, p->w + (r + i) * p->w_row_bytes, p->k, panel + i * pstride);
        for (int64_t t = 0; t < p->t; t += 4) {
            int T = p->t - t >= 4 ? 4 : (int)(p->t - t);
            micro_dispatch(R, T, panel, pstride, p->k, p->x + t * p->x_stride, p->x_stride, out);
            for (int i = 0; i < R; i++)
                for (int j = 0; j < T; j++)
                    p->y[(t + j) * p->y_stride + r + i] =
                        out[i * 4 + j] + (p->bias ? p->bias[r + i] : 0.0f);
        }
        r += R;
    }
}

#define GEMV_CASE(DT)                                                                              \
    case DT:                                                                                       \
        for (int64_t r = r0; r < r1; r++)                                                          \
            p->y[r] =                                                                              \
                gemv_row(DT, p->w + r * p->w_row_bytes, p->k, p->x) + (p->bias ? p->bias[r] : 0);  \
        break

void kiln_cpu_mmf_avx2(const kiln_cpu_mm *pp, int64_t r0, int64_t r1, uint8_t *panel) {
    /* a private copy: the caller's struct shares cache lines with its stack, and y
     * stores would otherwise force reloads of it (false sharing between threads) */
    const kiln_cpu_mm m = *pp, *p = &m;
    if (p->t > 1) {
        gemm(p, r0, r1, panel);
        return;
    }
    switch (p->dtype) {
        GEMV_CASE(KILN_DTYPE_F32);
        GEMV_CASE(KILN_DTYPE_F16);
        GEMV_CASE(KILN_DTYPE_BF16);
    default:
        break;
    }
}
