/*
 * matmul_r16_avx512.c — quantized matmul on the R16 layout (cpu_kernels.h) with AVX-512
 * VNNI. One 64-byte register holds 4 consecutive elements of 16 rows; vpdpbusd with a
 * broadcast 4-byte activation word accumulates 16 row sums at once, so there is no
 * horizontal reduction and the block scales of the 16 rows are one vector.
 *
 * A "unit" is 64 elements x 16 rows: u[16] (element group j = elements 4j..4j+3, as
 * unsigned bytes), s[4] (row scales of each 16 elements), o[4] (row offsets of each 16
 * elements): w = s * u + o, exactly as in qblocks.h but transposed.
 *
 *  - t == 1 (decode): unpack and dot fused, one group of 16 rows at a time.
 *  - t > 1 (prefill): a group's units are unpacked once into the thread's panel, then
 *    tiles of 8 tokens stream over it (8 x 3 accumulators in registers).
 */
#include "format/dtype.h"
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu_kernels.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

typedef struct unit {
    __m512i u[16];
    __m512 s[4], o[4];
} unit;

INLINE __m512 ld_h16(const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
INLINE __m512 ld_u8f(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
INLINE __m512 ld_i8f(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
INLINE __m512i ld(const uint8_t *p) {
    return _mm512_loadu_si512((const void *)p);
}

/* Scales per 32 elements (true) or per 16 (q6_K). */
INLINE bool per32(uint32_t dt) {
    return dt != KILN_DTYPE_Q6_K;
}

/* 0x10 in every byte whose bit is set in the 64-bit mask at p (q5 high bits). */
INLINE __m512i hibits(const uint8_t *p) {
    uint64_t m;
    memcpy(&m, p, 8);
    return _mm512_maskz_set1_epi8(m, 0x10);
}

/* Unit c (elements [64c, 64c + 64)) of the group whose stream starts at g, unpacked
 * into U. two: the unit's second 32-block exists (32-block types with k % 64 == 32 end
 * on a half unit). Layouts: cpu_kernels.h; offsets: cpu_impl.h. */
INLINE void unpack(uint32_t dt, const uint8_t *g, int64_t c, bool two, unit *U) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const uint8_t *b = g + kiln_r16_unit_off(dt, c);
    switch (dt) {
    case KILN_DTYPE_Q4_0:
    case KILN_DTYPE_Q4_1:
    case KILN_DTYPE_Q5_0:
    case KILN_DTYPE_Q5_1:
    case KILN_DTYPE_Q8_0: {
        const size_t hdr = kiln_r16_hdr(dt), bl = kiln_r16_blk(dt);
        const bool five = dt == KILN_DTYPE_Q5_0 || dt == KILN_DTYPE_Q5_1;
        const bool min = dt == KILN_DTYPE_Q4_1 || dt == KILN_DTYPE_Q5_1;
        const float off = dt == KILN_DTYPE_Q4_0 ? -8.0f : dt == KILN_DTYPE_Q5_0 ? -16.0f : -128.0f;
        /* the d line holds both blocks' scales (zero for a missing second block) */
        const __m512 dd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b));
        const __m512 d1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 32)));
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            if (h == 1 && !two) {
#pragma GCC unroll 16
                for (int j = 8; j < 16; j++) U->u[j] = _mm512_setzero_si512();
                U->s[2] = U->s[3] = U->o[2] = U->o[3] = _mm512_setzero_ps();
                break;
            }
            const uint8_t *q = b + hdr + (size_t)h * bl;
            const __m512 d = h ? d1 : dd;
            if (dt == KILN_DTYPE_Q8_0) {
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++)
                    U->u[8 * h + j] = _mm512_xor_si512(ld(q + 64 * j), _mm512_set1_epi8(-128));
            } else {
                const uint8_t *qs = five ? q + 64 : q;
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    __m512i v = ld(qs + 64 * i);
                    __m512i lo = _mm512_and_si512(v, m4);
                    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    if (five) {
                        lo = _mm512_or_si512(lo, hibits(q + 8 * i));
                        hi = _mm512_or_si512(hi, hibits(q + 32 + 8 * i));
                    }
                    U->u[8 * h + i] = lo;
                    U->u[8 * h + 4 + i] = hi;
                }
            }
            U->s[2 * h] = U->s[2 * h + 1] = d;
            U->o[2 * h] = U->o[2 * h + 1] =
                min ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 64 + 32 * h)))
                    : _mm512_mul_ps(d, _mm512_set1_ps(off));
        }
        break;
    }
    case KILN_DTYPE_Q4_K:
    case KILN_DTYPE_Q5_K: {
        const int cc = (int)(c & 3);
        const bool five = dt == KILN_DTYPE_Q5_K;
        __m512 d = ld_h16(b), dmin = ld_h16(b + 32);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m512 s = _mm512_mul_ps(ld_u8f(b + 64 + 16 * (2 * cc + h)), d);
            __m512 o = _mm512_mul_ps(ld_u8f(b + 192 + 16 * (2 * cc + h)), dmin);
            U->s[2 * h] = U->s[2 * h + 1] = s;
            U->o[2 * h] = U->o[2 * h + 1] = _mm512_sub_ps(_mm512_setzero_ps(), o);
        }
        const uint8_t *qs = b + (five ? 832 : 320) + 512 * cc, *qh = b + 320 + 128 * cc;
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            __m512i v = ld(qs + 64 * i);
            __m512i lo = _mm512_and_si512(v, m4);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            if (five) {
                lo = _mm512_or_si512(lo, hibits(qh + 8 * i));
                hi = _mm512_or_si512(hi, hibits(qh + 64 + 8 * i));
            }
            U->u[i] = lo;
            U->u[8 + i] = hi;
        }
        break;
    }
    default: { /* q6_K */
        const int cc = (int)(c & 3);
        __m512 d = _mm512_loadu_ps((const float *)b);
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            U->s[q] = _mm512_mul_ps(ld_i8f(b + 64 + 16 * (4 * cc + q)), d);
            U->o[q] = _mm512_mul_ps(U->s[q], _mm512_set1_ps(-32.0f));
        }
        const __m512i m3 = _mm512_set1_epi8(0x30);
        __m512i hi[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) hi[i] = ld(b + 2368 + 64 * (4 * cc + i));
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            __m512i v = ld(b + 320 + 64 * (8 * cc + i));
            __m512i lo_a = _mm512_and_si512(v, m4);
            __m512i lo_b = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            /* element group j = i (q = i / 4) and j = 8 + i (q = 2 + i / 4) */
            const int i4 = i & 3, qa = i >> 2, qb = 2 + (i >> 2);
            __m512i ha = qa == 0 ? _mm512_slli_epi16(hi[i4], 4) : _mm512_slli_epi16(hi[i4], 2);
            __m512i hb = qb == 2 ? hi[i4] : _mm512_srli_epi16(hi[i4], 2);
            U->u[i] = _mm512_or_si512(lo_a, _mm512_and_si512(ha, m3));
            U->u[8 + i] = _mm512_or_si512(lo_b, _mm512_and_si512(hb, m3));
        }
        break;
    }
    }
}

INLINE __m512i bcast(const int8_t *a) {
    int32_t v;
    memcpy(&v, a, 4);
    return _mm512_set1_epi32(v);
}

/* acc += dot of one unit with one token's two-level activations (chunk c; qblocks.h).
 * The float steps (cvt, * s * d2, + o * gsum per scale group) are the same, in the same
 * order, as in micro(): decode and prefill give identical bits (batch invariance). */
INLINE __m512 unit_dot(uint32_t dt, const unit *U, const int8_t *aq, const int8_t *aq2,
                       const float *dl, const float *gs, __m512 acc) {
    const int G = per32(dt) ? 2 : 4, J = 16 / G;
#pragma GCC unroll 4
    for (int q = 0; q < G; q++) {
        __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
        __m512i b0 = _mm512_setzero_si512(), b1 = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 0; j < J; j += 2) {
            const int e = 4 * (q * J + j);
            a0 = _mm512_dpbusd_epi32(a0, U->u[q * J + j], bcast(aq + e));
            a1 = _mm512_dpbusd_epi32(a1, U->u[q * J + j + 1], bcast(aq + e + 4));
            b0 = _mm512_dpbusd_epi32(b0, U->u[q * J + j], bcast(aq2 + e));
            b1 = _mm512_dpbusd_epi32(b1, U->u[q * J + j + 1], bcast(aq2 + e + 4));
        }
        __m512i d = _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(a0, a1), 8),
                                     _mm512_add_epi32(b0, b1));
        const int sq = per32(dt) ? 2 * q : q;
        float gsum = per32(dt) ? gs[2 * q] + gs[2 * q + 1] : gs[q];
        __m512 sc = _mm512_mul_ps(U->s[sq], _mm512_set1_ps(dl[8 * (sq >> 1)]));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, acc);
        acc = _mm512_fmadd_ps(U->o[sq], _mm512_set1_ps(gsum), acc);
    }
    return acc;
}

INLINE __mmask16 row_mask(int64_t rows) {
    return rows >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rows) - 1);
}

INLINE void store_rows(float *y, int64_t rows, __m512 v, const float *bias) {
    __mmask16 m = row_mask(rows);
    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias));
    _mm512_mask_storeu_ps(y, m, v);
}

/* ---- decode ---- */

/* Software prefetch distance for the decode stream, bytes ahead of the unit being read;
 * 0 disables it. Measured (bench on 64 MB of tinyllama-shaped weights, 2 threads,
 * prefetch 0 / 2 KiB alternating, 5 runs): 2 KiB ahead won 12 of 15 pairs, +5-15 % for
 * q4_0; 4-8 KiB were no better (docs/CPU.md). */
#ifndef KILN_R16_PF
#define KILN_R16_PF 2048
#endif

INLINE void gemv_group(uint32_t dt, const kiln_cpu_mm *p, int64_t g, size_t pf) {
    const int64_t k = p->k, kc = kiln_q8act_chunks(k);
    const bool odd = (k % 64) != 0;
    const size_t gb = kiln_r16_gbytes(dt, k);
    const uint8_t *gp = p->w + (size_t)g * gb;
    const int8_t *aq = kiln_q8act_qs(p->act, k), *aq2 = kiln_q8act_qs2(p->act, k);
    const float *dl = kiln_q8act_dl(p->act, k), *gs = kiln_q8act_gs(p->act, k);
    __m512 acc = _mm512_setzero_ps();
    const uint8_t *pfc = gp + pf; /* next line to prefetch */
    for (int64_t c = 0; c < kc; c++) {
        unit U;
        if (pf) {
            const uint8_t *end = gp + (c + 1 < kc ? kiln_r16_unit_off(dt, c + 1) : gb) + pf;
            for (; pfc < end; pfc += 64) _mm_prefetch((const char *)pfc, _MM_HINT_T0);
        }
        unpack(dt, gp, c, !(odd && c == kc - 1), &U);
        acc = unit_dot(dt, &U, aq + 64 * c, aq2 + 64 * c, dl + 16 * c, gs + 4 * c, acc);
    }
    store_rows(p->y + 16 * g, p->n - 16 * g, acc, p->bias ? p->bias + 16 * g : NULL);
}

/* ---- prefill ---- */

INLINE void unpack_panel(uint32_t dt, const uint8_t *gp, int64_t k, uint8_t *panel) {
    const int64_t kc = kiln_q8act_chunks(k);
    const bool odd = (k % 64) != 0;
    for (int64_t c = 0; c < kc; c++) {
        unit U;
        unpack(dt, gp, c, !(odd && c == kc - 1), &U);
        __m512i *o = (__m512i *)(panel + (size_t)c * 24 * 64);
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) _mm512_store_si512(o + j, U.u[j]);
#pragma GCC unroll 16
        for (int q = 0; q < 4; q++) {
            _mm512_store_ps((float *)(o + 16 + q), U.s[q]);
            _mm512_store_ps((float *)(o + 20 + q), U.o[q]);
        }
    }
}

/* T tokens (<= 8) against an unpacked panel of 16 rows (same float steps as unit_dot). */
INLINE void micro(uint32_t dt, int T, const uint8_t *panel, int64_t k, const uint8_t *act,
                  size_t astride, __m512 *out) {
    const int64_t kc = kiln_q8act_chunks(k);
    __m512 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < kc; c++) {
        const __m512i *pu = (const __m512i *)(panel + (size_t)c * 24 * 64);
        const float *ps = (const float *)(pu + 16), *po = (const float *)(pu + 20);
        const int G = per32(dt) ? 2 : 4, J = 16 / G; /* scale groups per unit, 4-groups each */
#pragma GCC unroll 4
        for (int q = 0; q < G; q++) {
            __m512i d1[8], d2[8];
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) d1[t] = d2[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int j = 0; j < J; j++) {
                __m512i u = _mm512_load_si512(pu + q * J + j);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const uint8_t *a = act + t * astride;
                    const int8_t *a1 = kiln_q8act_qs(a, k) + 64 * c,
                                 *a2 = kiln_q8act_qs2(a, k) + 64 * c;
                    d1[t] = _mm512_dpbusd_epi32(d1[t], u, bcast(a1 + 4 * (q * J + j)));
                    d2[t] = _mm512_dpbusd_epi32(d2[t], u, bcast(a2 + 4 * (q * J + j)));
                }
            }
            const int sq = per32(dt) ? 2 * q : q; /* index into s[4] / o[4] */
            __m512 s = _mm512_load_ps(ps + 16 * sq), o = _mm512_load_ps(po + 16 * sq);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const uint8_t *a = act + t * astride;
                const float *dl = kiln_q8act_dl(a, k) + 16 * c;
                const float *gs = kiln_q8act_gs(a, k) + 4 * c;
                float gsum = per32(dt) ? gs[2 * q] + gs[2 * q + 1] : gs[q];
                __m512i d = _mm512_add_epi32(_mm512_slli_epi32(d1[t], 8), d2[t]);
                __m512 sc = _mm512_mul_ps(s, _mm512_set1_ps(dl[8 * (sq >> 1)]));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, acc[t]);
                acc[t] = _mm512_fmadd_ps(o, _mm512_set1_ps(gsum), acc[t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) out[t] = acc[t];
}

INLINE void gemm_group(uint32_t dt, const kiln_cpu_mm *p, int64_t g, uint8_t *panel) {
    unpack_panel(dt, p->w + (size_t)g * kiln_r16_gbytes(dt, p->k), p->k, panel);
    __m512 out[8];
    for (int t = 0; t < 8; t++) out[t] = _mm512_setzero_ps(); /* -Wmaybe-uninitialized */
    const int64_t rows = p->n - 16 * g;
    const float *bias = p->bias ? p->bias + 16 * g : NULL;
    for (int64_t t0 = 0; t0 < p->t; t0 += 8) {
        const int T = p->t - t0 >= 8 ? 8 : (int)(p->t - t0);
        const uint8_t *a = p->act + t0 * p->act_stride;
        switch (T) {
        case 8:
            micro(dt, 8, panel, p->k, a, p->act_stride, out);
            break;
        case 7:
            micro(dt, 7, panel, p->k, a, p->act_stride, out);
            break;
        case 6:
            micro(dt, 6, panel, p->k, a, p->act_stride, out);
            break;
        case 5:
            micro(dt, 5, panel, p->k, a, p->act_stride, out);
            break;
        case 4:
            micro(dt, 4, panel, p->k, a, p->act_stride, out);
            break;
        case 3:
            micro(dt, 3, panel, p->k, a, p->act_stride, out);
            break;
        case 2:
            micro(dt, 2, panel, p->k, a, p->act_stride, out);
            break;
        default:
            micro(dt, 1, panel, p->k, a, p->act_stride, out);
            break;
        }
#pragma GCC unroll 16
        for (int t = 0; t < T; t++)
            store_rows(p->y + (t0 + t) * p->y_stride + 16 * g, rows, out[t], bias);
    }
}

#define R16_CASE(DT)                                                                               \
    case DT:                                                                                       \
        for (int64_t g = g0; g < g1; g++) {                                                        \
            if (p->t == 1)                                                                         \
                gemv_group(DT, p, g, pf);                                                          \
            else                                                                                   \
                gemm_group(DT, p, g, panel);                                                       \
        }                                                                                          \
        break

void kiln_cpu_mmr16_avx512(const kiln_cpu_mm *pp, int64_t r0, int64_t r1, uint8_t *panel) {
    const kiln_cpu_mm m = *pp, *p = &m; /* private copy: see matmul_q_avx512.c */
    const int64_t g0 = r0 / 16, g1 = (r1 + 15) / 16;
    const size_t pf = KILN_R16_PF;
    switch (p->dtype) {
        R16_CASE(KILN_DTYPE_Q4_0);
        R16_CASE(KILN_DTYPE_Q4_1);
        R16_CASE(KILN_DTYPE_Q5_0);
        R16_CASE(KILN_DTYPE_Q5_1);
        R16_CASE(KILN_DTYPE_Q8_0);
        R16_CASE(KILN_DTYPE_Q4_K);
        R16_CASE(KILN_DTYPE_Q5_K);
        R16_CASE(KILN_DTYPE_Q6_K);
    default:
        break;
    }
}
