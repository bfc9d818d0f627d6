/*
 * matmul_f_avx512.c — float-weight matmul (f32, f16, bf16 weights; f32 activations)
 * for AVX-512. Weights are widened to f32 exactly (f16 by vcvtph2ps, bf16 by a 16-bit
 * shift), so results match an f32 dot product up to summation order.
 *
 *  - t == 1: one row at a time, two accumulators, masked tail for k % 16.
 *  - t > 1: the driver (matmul.c) transposes the activations once per call (xt: for each
 *    element, the t tokens side by side); 8 rows are widened once into an f32 panel and
 *    an 8-row x 48-token micro-kernel (24 zmm accumulators) broadcasts each weight over
 *    3 vectors of 16 tokens: no horizontal sums, one vector load per 8 FMAs. Measured
 *    (one core, t 128): 93-100 GFLOP/s on tinyllama shapes, the 4-row x 4-token dot-
 *    product kernel it replaced 82-84 (OpenBLAS sgemm on f32 weights: 79).
 *  - t > 1 with f16 / bf16 weights on a CPU with AVX512-BF16 (p->bf16): the activations
 *    and a 4-row panel are rounded to bf16 (round to nearest even) and multiplied with
 *    vdpbf16ps, 32 multiply-adds per instruction instead of 16, accumulated in f32.
 *    Rounding error: at most 2^-7 relative per product (2^-8 on each factor), about the
 *    size of the int8 activation step the quantized types use; decode (t == 1, the
 *    memory-bound case) stays exact.
 */
#include "format/dtype.h"
#include "kernels/cpu/cpu_impl.h"

#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

/* 16 weights starting at element i of a row, widened to f32; m masks the valid ones. */
INLINE __m512 wload(uint32_t dt, const uint8_t *row, int64_t i, __mmask16 m) {
    switch (dt) {
    case KILN_DTYPE_F32:
        return _mm512_maskz_loadu_ps(m, (const float *)row + i);
    case KILN_DTYPE_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i));
    default: /* bf16 */
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i)), 16));
    }
}

INLINE float gemv_row(uint32_t dt, const uint8_t *row, int64_t k, const float *x) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        a0 = _mm512_fmadd_ps(wload(dt, row, i, 0xFFFF), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(wload(dt, row, i + 16, 0xFFFF), _mm512_loadu_ps(x + i + 16), a1);
    }
    for (; i < k; i += 16) {
        __mmask16 m = k - i >= 16 ? 0xFFFF : (__mmask16)((1u << (k - i)) - 1);
        a0 = _mm512_fmadd_ps(wload(dt, row, i, m), _mm512_maskz_loadu_ps(m, x + i), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

INLINE void widen_row(uint32_t dt, const uint8_t *row, int64_t k, float *p) {
    for (int64_t i = 0; i < k; i += 16) {
        __mmask16 m = k - i >= 16 ? 0xFFFF : (__mmask16)((1u << (k - i)) - 1);
        _mm512_store_ps(p + i, wload(dt, row, i, m));
    }
}

/* ---- prefill without transposed activations (p->xt NULL: callers other than matmul.c)
 * 4 rows x 4 tokens of dot products, horizontal sums at the end. */
INLINE void micro(int R, int T, const float *panel, int64_t pstride, int64_t k, const float *x,
                  int64_t xs, float *out) {
    __m512 acc[4][4];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 16) {
        __mmask16 m = k - i >= 16 ? 0xFFFF : (__mmask16)((1u << (k - i)) - 1);
        __m512 w[4];
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) w[r] = _mm512_load_ps(panel + r * pstride + i);
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + t * xs + i);
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(w[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) out[r * 4 + t] = _mm512_reduce_add_ps(acc[r][t]);
}

static void micro_dispatch(int R, int T, const float *panel, int64_t pstride, int64_t k,
                           const float *x, int64_t xs, float *out) {
    if (R == 4) {
        switch (T) {
        case 4:
            micro(4, 4, panel, pstride, k, x, xs, out);
            return;
        case 3:
            micro(4, 3, panel, pstride, k, x, xs, out);
            return;
        case 2:
            micro(4, 2, panel, pstride, k, x, xs, out);
            return;
        default:
            micro(4, 1, panel, pstride, k, x, xs, out);
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
        int R = r1 - r >= KILN_CPU_MM_ROWS ? KILN_CPU_MM_ROWS : 1;
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

/* ---- prefill on transposed activations (p->xt) ----
 * R (<= 8) widened weight rows x TV (<= 3) vectors of 16 tokens: per element i, TV
 * token vectors are loaded from xt and each row's weight is broadcast from the panel
 * (folded into the FMA), 24 accumulators: 24 FMAs per 3 vector loads + 8 broadcasts,
 * no horizontal sums. Each weight row is summed over i in order (per token), exactly
 * as f32 FMAs. */
INLINE void micro_xt(int R, int TV, const float *panel, int64_t pstride, int64_t k, const float *xt,
                     int64_t ts, __m512 out[8][3]) {
    __m512 acc[8][3];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int v = 0; v < TV; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i++) {
        __m512 xv[3];
#pragma GCC unroll 3
        for (int v = 0; v < TV; v++) xv[v] = _mm512_load_ps(xt + i * ts + 16 * v);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 w = _mm512_set1_ps(panel[r * pstride + i]);
#pragma GCC unroll 3
            for (int v = 0; v < TV; v++) acc[r][v] = _mm512_fmadd_ps(w, xv[v], acc[r][v]);
        }
    }
#pragma GCC unroll 8
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
                              const float *xt, int64_t ts, __m512 out[8][3]) {
    switch (R) {
        MICRO_XT_TV(8);
        MICRO_XT_TV(7);
        MICRO_XT_TV(6);
        MICRO_XT_TV(5);
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
    __m512 out[8][3];
    _Alignas(64) float tmp[16];
    for (int64_t r = r0; r < r1; r += KILN_CPU_MMF_ROWS) {
        const int R = r1 - r >= KILN_CPU_MMF_ROWS ? KILN_CPU_MMF_ROWS : (int)(r1 - r);
        for (int i = 0; i < R; i++)
            widen_dispatch(p->dtype, p->w + (r + i) * p->w_row_bytes, p->k, panel + i * pstride);
        for (int64_t t0 = 0; t0 < p->t; t0 += 48) {
            const int64_t nt = p->t - t0 < 48 ? p->t - t0 : 48;
            const int TV = (int)((nt + 15) / 16);
            micro_xt_dispatch(R, TV, panel, pstride, p->k, p->xt + t0, ts, out);
            for (int i = 0; i < R; i++) {
                const float b = p->bias ? p->bias[r + i] : 0.0f;
                for (int v = 0; v < TV; v++) {
                    _mm512_store_ps(tmp, out[i][v]);
                    for (int j = 0; j < 16 && 16 * v + j < nt; j++)
                        p->y[(t0 + 16 * v + j) * p->y_stride + r + i] = tmp[j] + b;
                }
            }
        }
    }
}

/* ---- bf16 prefill ---- */

/* n floats (or f16 / bf16 values of dtype dt) -> kp bf16 values, zero padded. */
INLINE void to_bf16(uint32_t dt, const void *src, int64_t n, int64_t kp, uint16_t *dst) {
    for (int64_t i = 0; i < kp; i += 32) {
        __m512 lo, hi;
        __mmask16 m0 = n - i >= 16 ? 0xFFFF : n - i <= 0 ? 0 : (__mmask16)((1u << (n - i)) - 1);
        __mmask16 m1 = n - i - 16 >= 16  ? 0xFFFF
                       : n - i - 16 <= 0 ? 0
                                         : (__mmask16)((1u << (n - i - 16)) - 1);
        if (dt == KILN_DTYPE_BF16) { /* already bf16: copy with zero padding */
            __mmask32 m = (__mmask32)m0 | ((__mmask32)m1 << 16);
            _mm512_store_si512((void *)(dst + i),
                               _mm512_maskz_loadu_epi16(m, (const uint16_t *)src + i));
            continue;
        }
        lo = wload(dt, (const uint8_t *)src, i, m0);
        hi = m1 ? wload(dt, (const uint8_t *)src, i + 16, m1) : _mm512_setzero_ps();
        _mm512_store_si512((void *)(dst + i), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

INLINE void micro16(int R, int T, const uint16_t *panel, int64_t kp, const uint16_t *x,
                    float *out) {
    __m512 acc[4][4];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < kp; i += 32) {
        __m512i w[4];
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) w[r] = _mm512_load_si512((const void *)(panel + r * kp + i));
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            __m512i xv = _mm512_load_si512((const void *)(x + t * kp + i));
#pragma GCC unroll 16
            for (int r = 0; r < R; r++)
                acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)w[r], (__m512bh)xv);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) out[r * 4 + t] = _mm512_reduce_add_ps(acc[r][t]);
}

static void micro16_dispatch(int R, int T, const uint16_t *panel, int64_t kp, const uint16_t *x,
                             float *out) {
    if (R == 4) {
        switch (T) {
        case 4:
            micro16(4, 4, panel, kp, x, out);
            return;
        case 3:
            micro16(4, 3, panel, kp, x, out);
            return;
        case 2:
            micro16(4, 2, panel, kp, x, out);
            return;
        default:
            micro16(4, 1, panel, kp, x, out);
            return;
        }
    }
    switch (T) {
    case 4:
        micro16(1, 4, panel, kp, x, out);
        return;
    case 3:
        micro16(1, 3, panel, kp, x, out);
        return;
    case 2:
        micro16(1, 2, panel, kp, x, out);
        return;
    default:
        micro16(1, 1, panel, kp, x, out);
        return;
    }
}

static void gemm_bf16(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *scratch) {
    const int64_t kp = (p->k + 31) / 32 * 32;
    uint16_t *xb = (uint16_t *)scratch, *panel = xb + p->t * kp;
    for (int64_t t = 0; t < p->t; t++)
        to_bf16(KILN_DTYPE_F32, p->x + t * p->x_stride, p->k, kp, xb + t * kp);
    float out[16];
    for (int64_t r = r0; r < r1;) {
        int R = r1 - r >= KILN_CPU_MM_ROWS ? KILN_CPU_MM_ROWS : 1;
        for (int i = 0; i < R; i++)
            to_bf16(p->dtype, p->w + (r + i) * p->w_row_bytes, p->k, kp, panel + i * kp);
        for (int64_t t = 0; t < p->t; t += 4) {
            int T = p->t - t >= 4 ? 4 : (int)(p->t - t);
            micro16_dispatch(R, T, panel, kp, xb + t * kp, out);
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

void kiln_cpu_mmf_avx512(const kiln_cpu_mm *pp, int64_t r0, int64_t r1, uint8_t *panel) {
    /* a private copy: the caller's struct shares cache lines with its stack, and y
     * stores would otherwise force reloads of it (false sharing between threads) */
    const kiln_cpu_mm m = *pp, *p = &m;
    if (p->t > 1) {
        if (p->bf16)
            gemm_bf16(p, r0, r1, panel);
        else if (p->xt)
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
