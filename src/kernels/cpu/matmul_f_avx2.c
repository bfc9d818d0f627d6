/*
 * matmul_f_avx2.c — float-weight matmul (f32, f16, bf16 weights; f32 activations) for
 * AVX2 + FMA + F16C. Same structure as matmul_f_avx512.c, 8 floats per register; the
 * prefill micro-kernel is 4 rows x 24 tokens on the transposed activations (12 ymm
 * accumulators), or 2 rows x 4 tokens of dot products when the caller gives none.
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

/* ---- prefill on transposed activations (p->xt; as matmul_f_avx512.c) ----
 * R (<= 4) widened rows x TV (<= 3) vectors of 8 tokens: 12 accumulators, per element
 * 3 token-vector loads and 4 weight broadcasts for 12 FMAs. */
INLINE void micro_xt(int R, int TV, const float *panel, int64_t pstride, int64_t k, const float *xt,
                     int64_t ts, __m256 out[4][3]) {
    __m256 acc[4][3];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int v = 0; v < TV; v++) acc[r][v] = _mm256_setzero_ps();
    for (int64_t i = 0; i < k; i++) {
        __m256 xv[3];
#pragma GCC unroll 3
        for (int v = 0; v < TV; v++) xv[v] = _mm256_load_ps(xt + i * ts + 8 * v);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 w = _mm256_broadcast_ss(panel + r * pstride + i);
#pragma GCC unroll 3
            for (int v = 0; v < TV; v++) acc[r][v] = _mm256_fmadd_ps(w, xv[v], acc[r][v]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int v = 0; v < TV; v++) out[r][v] = acc[r][v];
}

#define MICRO_XT_TV(R)                                                                             \
    case R:                                                                                        \
        if (TV == 3)                                                                               \
            micro_xt(R, 3, panel, pstride, k, xt, ts, out);                                        \
        else if (TV == 2)                                                                          \
            micro_xt(R, 2, panel, pstride, k, xt, ts, out);                                        \
        else                                                                                       \
            micro_xt(R, 1, panel, pstride, k, xt, ts, out);                                        \
        break

static void micro_xt_dispatch(int R, int TV, const float *panel, int64_t pstride, int64_t k,
                              const float *xt, int64_t ts, __m256 out[4][3]) {
    switch (R) {
        MICRO_XT_TV(4);
        MICRO_XT_TV(3);
        MICRO_XT_TV(2);
    default:
        if (TV == 3)
            micro_xt(1, 3, panel, pstride, k, xt, ts, out);
        else if (TV == 2)
            micro_xt(1, 2, panel, pstride, k, xt, ts, out);
        else
            micro_xt(1, 1, panel, pstride, k, xt, ts, out);
        break;
    }
}

static void gemm_xt(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel_bytes) {
    float *panel = (float *)panel_bytes;
    const int64_t pstride = (p->k + 15) / 16 * 16, ts = p->xt_stride;
    __m256 out[4][3];
    _Alignas(32) float tmp[8];
    for (int64_t r = r0; r < r1; r += 4) {
        const int R = r1 - r >= 4 ? 4 : (int)(r1 - r);
        for (int i = 0; i < R; i++)
            widen_dispatch(p->dtype, p->w + (r + i) * p->w_row_bytes, p->k, panel + i * pstride);
        for (int64_t t0 = 0; t0 < p->t; t0 += 24) {
            const int64_t nt = p->t - t0 < 24 ? p->t - t0 : 24;
            const int TV = (int)((nt + 7) / 8);
            micro_xt_dispatch(R, TV, panel, pstride, p->k, p->xt + t0, ts, out);
            for (int i = 0; i < R; i++) {
                const float b = p->bias ? p->bias[r + i] : 0.0f;
                for (int v = 0; v < TV; v++) {
                    _mm256_store_ps(tmp, out[i][v]);
                    for (int j = 0; j < 8 && 8 * v + j < nt; j++)
                        p->y[(t0 + 8 * v + j) * p->y_stride + r + i] = tmp[j] + b;
                }
            }
        }
    }
}

void kiln_cpu_mmf_avx2(const kiln_cpu_mm *pp, int64_t r0, int64_t r1, uint8_t *panel) {
    /* a private copy: the caller's struct shares cache lines with its stack, and y
     * stores would otherwise force reloads of it (false sharing between threads) */
    const kiln_cpu_mm m = *pp, *p = &m;
    if (p->t > 1) {
        if (p->xt)
            gemm_xt(p, r0, r1, panel); /* matmul.c transposed the activations */
        else
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
