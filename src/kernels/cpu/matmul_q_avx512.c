/*
 * matmul_q_avx512.c — quantized-weight matmul inner loops for AVX-512 (F/BW/VL/DQ +
 * VNNI). Compiled with AVX-512 flags; called only when kiln_cpu_info() reports them.
 *
 * Each weight type is unpacked 64 elements at a time into unsigned bytes, a float scale
 * per 4-element lane and a float offset per 16 elements (qblocks.h), then multiplied
 * with the q8 activations by vpdpbusd (u8 x s8 -> s32 lanes), converted to float and
 * scaled by weight scale x activation scale; the offsets meet the activations' 16-sums.
 *
 *  - t == 1 (decode, GEMV): unpack and dot fused in registers, one row at a time, two
 *    chunks in flight. Memory-bound: the weight bytes are read exactly once.
 *  - t > 1 (prefill, GEMM): 4 rows are unpacked once into a panel (the thread's scratch,
 *    L1/L2 resident) and reused for every token; a 4-row x 4-token micro-kernel keeps
 *    16 accumulators in zmm registers.
 */
#include "format/dtype.h"
#include "kernels/cpu/cpu_impl.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

typedef struct wchunk {
    __m512i u; /* 64 unsigned weight bytes                 */
    __m512 s;  /* scale of each 4-element lane             */
    __m128 o;  /* offset of each 16 elements               */
} wchunk;

INLINE float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

INLINE uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* [a x 8 | b x 8] */
INLINE __m512 scale2(float a, float b) {
    return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}

/* Two 16-byte nibble arrays -> bytes [lo(q0) hi(q0) lo(q1) hi(q1)]: the natural element
 * order of two consecutive 32-blocks. */
INLINE __m512i nib2(__m128i q0, __m128i q1) {
    __m256i a = _mm256_set_m128i(_mm_srli_epi16(q0, 4), q0);
    __m256i b = _mm256_set_m128i(_mm_srli_epi16(q1, 4), q1);
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
}

/* 32 nibble bytes -> [lo | hi] (64 elements: the two 32-sub-blocks of a k-quant chunk). */
INLINE __m512i nib64(__m256i v) {
    __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
    return _mm512_and_si512(w, _mm512_set1_epi8(0x0F));
}

/* Chunk c (elements [64c, 64c + 64)) of a weight row. `two` is false when the row ends
 * after the first 32-block of the chunk (k % 64 == 32; 32-block types only). */
INLINE wchunk unpack(uint32_t dt, const uint8_t *row, int64_t c, bool two) {
    wchunk r;
    switch (dt) {
    case KILN_DTYPE_Q4_0: {
        const uint8_t *b0 = row + 2 * c * KQ_Q4_0_BYTES, *b1 = b0 + KQ_Q4_0_BYTES;
        float d0 = h2f(b0), d1 = two ? h2f(b1) : 0.0f;
        __m128i q1 = two ? _mm_loadu_si128((const __m128i *)(b1 + 2)) : _mm_setzero_si128();
        r.u = nib2(_mm_loadu_si128((const __m128i *)(b0 + 2)), q1);
        r.s = scale2(d0, d1);
        r.o = _mm_setr_ps(-8 * d0, -8 * d0, -8 * d1, -8 * d1);
        break;
    }
    case KILN_DTYPE_Q4_1: {
        const uint8_t *b0 = row + 2 * c * KQ_Q4_1_BYTES, *b1 = b0 + KQ_Q4_1_BYTES;
        float d0 = h2f(b0), m0 = h2f(b0 + 2);
        float d1 = two ? h2f(b1) : 0.0f, m1 = two ? h2f(b1 + 2) : 0.0f;
        __m128i q1 = two ? _mm_loadu_si128((const __m128i *)(b1 + 4)) : _mm_setzero_si128();
        r.u = nib2(_mm_loadu_si128((const __m128i *)(b0 + 4)), q1);
        r.s = scale2(d0, d1);
        r.o = _mm_setr_ps(m0, m0, m1, m1);
        break;
    }
    case KILN_DTYPE_Q5_0: {
        const uint8_t *b0 = row + 2 * c * KQ_Q5_0_BYTES, *b1 = b0 + KQ_Q5_0_BYTES;
        float d0 = h2f(b0), d1 = two ? h2f(b1) : 0.0f;
        __m128i q1 = two ? _mm_loadu_si128((const __m128i *)(b1 + 6)) : _mm_setzero_si128();
        uint64_t hm = rd32(b0 + 2) | (two ? (uint64_t)rd32(b1 + 2) << 32 : 0);
        r.u = _mm512_or_si512(nib2(_mm_loadu_si128((const __m128i *)(b0 + 6)), q1),
                              _mm512_maskz_set1_epi8(hm, 0x10));
        r.s = scale2(d0, d1);
        r.o = _mm_setr_ps(-16 * d0, -16 * d0, -16 * d1, -16 * d1);
        break;
    }
    case KILN_DTYPE_Q5_1: {
        const uint8_t *b0 = row + 2 * c * KQ_Q5_1_BYTES, *b1 = b0 + KQ_Q5_1_BYTES;
        float d0 = h2f(b0), m0 = h2f(b0 + 2);
        float d1 = two ? h2f(b1) : 0.0f, m1 = two ? h2f(b1 + 2) : 0.0f;
        __m128i q1 = two ? _mm_loadu_si128((const __m128i *)(b1 + 8)) : _mm_setzero_si128();
        uint64_t hm = rd32(b0 + 4) | (two ? (uint64_t)rd32(b1 + 4) << 32 : 0);
        r.u = _mm512_or_si512(nib2(_mm_loadu_si128((const __m128i *)(b0 + 8)), q1),
                              _mm512_maskz_set1_epi8(hm, 0x10));
        r.s = scale2(d0, d1);
        r.o = _mm_setr_ps(m0, m0, m1, m1);
        break;
    }
    case KILN_DTYPE_Q8_0: {
        const uint8_t *b0 = row + 2 * c * KQ_Q8_0_BYTES, *b1 = b0 + KQ_Q8_0_BYTES;
        float d0 = h2f(b0), d1 = two ? h2f(b1) : 0.0f;
        __m256i q1 = two ? _mm256_loadu_si256((const __m256i *)(b1 + 2)) : _mm256_set1_epi8(-128);
        __m512i v = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))), q1, 1);
        r.u = _mm512_xor_si512(v, _mm512_set1_epi8(-128)); /* q + 128 */
        r.s = scale2(d0, d1);
        r.o = _mm_setr_ps(-128 * d0, -128 * d0, -128 * d1, -128 * d1);
        break;
    }
    case KILN_DTYPE_Q4_K: {
        const uint8_t *b = row + (c >> 2) * KQ_Q4_K_BYTES;
        int j = (int)(c & 3);
        float d = h2f(b), dmin = h2f(b + 2);
        uint8_t s0, m0, s1, m1;
        kq_scale_min_k4(2 * j, b + 4, &s0, &m0);
        kq_scale_min_k4(2 * j + 1, b + 4, &s1, &m1);
        r.u = nib64(_mm256_loadu_si256((const __m256i *)(b + 16 + 32 * j)));
        r.s = scale2(d * s0, d * s1);
        r.o = _mm_setr_ps(-dmin * m0, -dmin * m0, -dmin * m1, -dmin * m1);
        break;
    }
    case KILN_DTYPE_Q5_K: {
        const uint8_t *b = row + (c >> 2) * KQ_Q5_K_BYTES;
        int j = (int)(c & 3);
        float d = h2f(b), dmin = h2f(b + 2);
        uint8_t s0, m0, s1, m1;
        kq_scale_min_k4(2 * j, b + 4, &s0, &m0);
        kq_scale_min_k4(2 * j + 1, b + 4, &s1, &m1);
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        uint64_t lo = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << (2 * j))));
        uint64_t hi = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << (2 * j + 1))));
        r.u = _mm512_or_si512(nib64(_mm256_loadu_si256((const __m256i *)(b + 48 + 32 * j))),
                              _mm512_maskz_set1_epi8(lo | hi << 32, 0x10));
        r.s = scale2(d * s0, d * s1);
        r.o = _mm_setr_ps(-dmin * m0, -dmin * m0, -dmin * m1, -dmin * m1);
        break;
    }
    case KILN_DTYPE_Q6_K:
    default: {
        const uint8_t *b = row + (c >> 2) * KQ_Q6_K_BYTES;
        int cc = (int)(c & 3), h = cc >> 1;
        float d = h2f(b + 208);
        __m512i ql = _mm512_loadu_si512((const void *)(b + 64 * h));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        __m512i lo, hb;
        if ((cc & 1) == 0) {
            lo = ql;
            hb = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
        } else {
            lo = _mm512_srli_epi16(ql, 4);
            hb = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_srli_epi16(qh, 4)),
                                    _mm256_srli_epi16(qh, 6), 1);
        }
        lo = _mm512_and_si512(lo, _mm512_set1_epi8(0x0F));
        hb = _mm512_slli_epi16(_mm512_and_si512(hb, _mm512_set1_epi8(0x03)), 4);
        r.u = _mm512_or_si512(lo, hb);
        int32_t sc4;
        memcpy(&sc4, b + 192 + 4 * cc, 4);
        __m128 f =
            _mm_mul_ps(_mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(sc4))), _mm_set1_ps(d));
        const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        r.s = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f));
        r.o = _mm_mul_ps(f, _mm_set1_ps(-32.0f));
        break;
    }
    }
    return r;
}

/* ---- activation quantization ---- */

/* 16 values: q1 = round(v / d1), q2 = round((v - d1 q1) / d2), clamped; returns the sum
 * of the dequantized values d1 q1 + d2 q2. */
static inline float quant16(__m512 v, float d1, float id1, float d2, float id2, int8_t *q1o,
                            int8_t *q2o) {
    __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(id1)));
    __m512 r = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(q1), _mm512_set1_ps(d1), v);
    __m512i q2 = _mm512_cvtps_epi32(_mm512_mul_ps(r, _mm512_set1_ps(id2)));
    q2 = _mm512_max_epi32(_mm512_min_epi32(q2, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
    _mm_storeu_si128((__m128i *)q1o, _mm512_cvtsepi32_epi8(q1));
    _mm_storeu_si128((__m128i *)q2o, _mm512_cvtsepi32_epi8(q2));
    return d1 * (float)_mm512_reduce_add_epi32(q1) + d2 * (float)_mm512_reduce_add_epi32(q2);
}

void kiln_cpu_q8act_avx512(const float *x, int64_t k, uint8_t *dst) {
    const int64_t kc = kiln_q8act_chunks(k), nb = k / 32;
    int8_t *qs = (int8_t *)dst, *qs2 = (int8_t *)(dst + kc * 64);
    float *dl = (float *)(dst + kc * 128), *gs = (float *)(dst + kc * 192);
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < nb; b++) {
        __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        __m512 a = _mm512_max_ps(_mm512_and_ps(v0, absmask), _mm512_and_ps(v1, absmask));
        float amax = _mm512_reduce_max_ps(a);
        float d1 = amax / 127.0f, id1 = amax > 0 ? 127.0f / amax : 0.0f;
        float d2 = d1 * (1.0f / 256), id2 = id1 * 256.0f;
        gs[2 * b] = quant16(v0, d1, id1, d2, id2, qs + 32 * b, qs2 + 32 * b);
        gs[2 * b + 1] = quant16(v1, d1, id1, d2, id2, qs + 32 * b + 16, qs2 + 32 * b + 16);
        _mm256_storeu_ps(dl + 8 * b, _mm256_set1_ps(d2));
    }
    if (nb & 1) { /* pad the last chunk's second half */
        memset(qs + 32 * nb, 0, 32);
        memset(qs2 + 32 * nb, 0, 32);
        _mm256_storeu_ps(dl + 8 * nb, _mm256_setzero_ps());
        gs[2 * nb] = gs[2 * nb + 1] = 0;
    }
}

/* ---- GEMV: t == 1 ---- */

/* 256 * dot(u, q1) + dot(u, q2): the two-level activation dot (qblocks.h), exact. */
INLINE __m512i dot2(__m512i u, __m512i a1, __m512i a2) {
    __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, a1);
    __m512i d2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, a2);
    return _mm512_add_epi32(_mm512_slli_epi32(d1, 8), d2);
}

INLINE __m512 chunk_dot(wchunk w, const int8_t *aq, const int8_t *aq2, const float *adl,
                        __m512 acc) {
    __m512i d = dot2(w.u, _mm512_loadu_si512(aq), _mm512_loadu_si512(aq2));
    __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(d), _mm512_loadu_ps(adl));
    return _mm512_fmadd_ps(p, w.s, acc);
}

INLINE float gemv_row(uint32_t dt, const uint8_t *row, int64_t k, const uint8_t *act) {
    const int64_t kc = kiln_q8act_chunks(k);
    const bool odd = (k % 64) != 0; /* last chunk holds one 32-block */
    const int64_t kfull = odd ? kc - 1 : kc;
    const int8_t *aq = kiln_q8act_qs(act, k), *aq2 = kiln_q8act_qs2(act, k);
    const float *adl = kiln_q8act_dl(act, k), *ags = kiln_q8act_gs(act, k);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    __m128 acco0 = _mm_setzero_ps(), acco1 = _mm_setzero_ps();
    int64_t c = 0;
    for (; c + 1 < kfull; c += 2) {
        wchunk w0 = unpack(dt, row, c, true);
        wchunk w1 = unpack(dt, row, c + 1, true);
        acc0 = chunk_dot(w0, aq + 64 * c, aq2 + 64 * c, adl + 16 * c, acc0);
        acc1 = chunk_dot(w1, aq + 64 * c + 64, aq2 + 64 * c + 64, adl + 16 * c + 16, acc1);
        acco0 = _mm_fmadd_ps(w0.o, _mm_loadu_ps(ags + 4 * c), acco0);
        acco1 = _mm_fmadd_ps(w1.o, _mm_loadu_ps(ags + 4 * c + 4), acco1);
    }
    for (; c < kc; c++) {
        wchunk w0 = unpack(dt, row, c, c < kfull);
        acc0 = chunk_dot(w0, aq + 64 * c, aq2 + 64 * c, adl + 16 * c, acc0);
        acco0 = _mm_fmadd_ps(w0.o, _mm_loadu_ps(ags + 4 * c), acco0);
    }
    __m128 o = _mm_add_ps(acco0, acco1);
    o = _mm_add_ps(o, _mm_movehl_ps(o, o));
    o = _mm_add_ss(o, _mm_movehdup_ps(o));
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + _mm_cvtss_f32(o);
}

/* ---- GEMM: t > 1 ---- */

/* Unpacks one row into the panel layout (u[kc*64] | s[kc*16] | o[kc*4]). */
INLINE void unpack_row(uint32_t dt, const uint8_t *row, int64_t k, uint8_t *p) {
    const int64_t kc = kiln_q8act_chunks(k);
    const bool odd = (k % 64) != 0;
    float *ps = (float *)(p + kc * 64), *po = (float *)(p + kc * 128);
    for (int64_t c = 0; c < kc; c++) {
        wchunk w = unpack(dt, row, c, !(odd && c == kc - 1));
        _mm512_store_si512((void *)(p + 64 * c), w.u);
        _mm512_store_ps(ps + 16 * c, w.s);
        _mm_store_ps(po + 4 * c, w.o);
    }
}

INLINE float dot_o(const float *wo, const float *gs, int64_t n4) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n4; i += 16)
        acc = _mm512_fmadd_ps(_mm512_load_ps(wo + i), _mm512_loadu_ps(gs + i), acc);
    if (i < n4) {
        __mmask16 m = (__mmask16)((1u << (n4 - i)) - 1);
        acc =
            _mm512_fmadd_ps(_mm512_maskz_load_ps(m, wo + i), _mm512_maskz_loadu_ps(m, gs + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* R panel rows x T tokens. out[r * 4 + t]. */
INLINE void micro(int R, int T, const uint8_t *panel, size_t pstride, int64_t k, const uint8_t *act,
                  size_t astride, float *out) {
    const int64_t kc = kiln_q8act_chunks(k);
    __m512 acc[4][4];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < kc; c++) {
        __m512i u[4];
        __m512 s[4];
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            u[r] = _mm512_load_si512((const void *)(panel + r * pstride + 64 * c));
            s[r] = _mm512_load_ps((const float *)(panel + r * pstride + kc * 64) + 16 * c);
        }
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            const uint8_t *a = act + t * astride;
            __m512i aq = _mm512_load_si512((const void *)(a + 64 * c));
            __m512i aq2 = _mm512_load_si512((const void *)(a + kc * 64 + 64 * c));
            __m512 dl = _mm512_load_ps((const float *)(a + kc * 128) + 16 * c);
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) {
                __m512i d = dot2(u[r], aq, aq2);
                acc[r][t] =
                    _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), dl), s[r], acc[r][t]);
            }
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int t = 0; t < T; t++)
            out[r * 4 + t] = _mm512_reduce_add_ps(acc[r][t]) +
                             dot_o((const float *)(panel + r * pstride + kc * 128),
                                   (const float *)(act + t * astride + kc * 192), kc * 4);
}

static void micro_dispatch(int R, int T, const uint8_t *panel, size_t pstride, int64_t k,
                           const uint8_t *act, size_t astride, float *out) {
    if (R == 4) {
        switch (T) {
        case 4:
            micro(4, 4, panel, pstride, k, act, astride, out);
            return;
        case 3:
            micro(4, 3, panel, pstride, k, act, astride, out);
            return;
        case 2:
            micro(4, 2, panel, pstride, k, act, astride, out);
            return;
        default:
            micro(4, 1, panel, pstride, k, act, astride, out);
            return;
        }
    }
    switch (T) {
    case 4:
        micro(1, 4, panel, pstride, k, act, astride, out);
        return;
    case 3:
        micro(1, 3, panel, pstride, k, act, astride, out);
        return;
    case 2:
        micro(1, 2, panel, pstride, k, act, astride, out);
        return;
    default:
        micro(1, 1, panel, pstride, k, act, astride, out);
        return;
    }
}

static void unpack_row_dispatch(uint32_t dt, const uint8_t *row, int64_t k, uint8_t *p) {
    switch (dt) {
    case KILN_DTYPE_Q4_0:
        unpack_row(KILN_DTYPE_Q4_0, row, k, p);
        break;
    case KILN_DTYPE_Q4_1:
        unpack_row(KILN_DTYPE_Q4_1, row, k, p);
        break;
    case KILN_DTYPE_Q5_0:
        unpack_row(KILN_DTYPE_Q5_0, row, k, p);
        break;
    case KILN_DTYPE_Q5_1:
        unpack_row(KILN_DTYPE_Q5_1, row, k, p);
        break;
    case KILN_DTYPE_Q8_0:
        unpack_row(KILN_DTYPE_Q8_0, row, k, p);
        break;
    case KILN_DTYPE_Q4_K:
        unpack_row(KILN_DTYPE_Q4_K, row, k, p);
        break;
    case KILN_DTYPE_Q5_K:
        unpack_row(KILN_DTYPE_Q5_K, row, k, p);
        break;
    default:
        unpack_row(KILN_DTYPE_Q6_K, row, k, p);
        break;
    }
}

static void gemm(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel) {
    const size_t pstride = kiln_wpanel_row_bytes(p->k);
    float out[16];
    for (int64_t r = r0; r < r1;) {
        int R = r1 - r >= KILN_CPU_MM_ROWS ? KILN_CPU_MM_ROWS : 1;
        for (int i = 0; i < R; i++)
            unpack_row_dispatch(p->dtype, p->w + (r + i) * p->w_row_bytes, p->k,
                                panel + i * pstride);
        for (int64_t t = 0; t < p->t; t += 4) {
            int T = p->t - t >= 4 ? 4 : (int)(p->t - t);
            micro_dispatch(R, T, panel, pstride, p->k, p->act + t * p->act_stride, p->act_stride,
                           out);
            for (int i = 0; i < R; i++)
                for (int j = 0; j < T; j++)
                    p->y[(t + j) * p->y_stride + r + i] =
                        out[i * 4 + j] + (p->bias ? p->bias[r + i] : 0.0f);
        }
        r += R; /* tail rows go one at a time */
    }
}

#define GEMV_CASE(DT)                                                                              \
    case DT:                                                                                       \
        for (int64_t r = r0; r < r1; r++)                                                          \
            p->y[r] = gemv_row(DT, p->w + r * p->w_row_bytes, p->k, p->act) +                      \
                      (p->bias ? p->bias[r] : 0.0f);                                               \
        break

void kiln_cpu_mmq_avx512(const kiln_cpu_mm *pp, int64_t r0, int64_t r1, uint8_t *panel) {
    /* a private copy: the caller's struct shares cache lines with its stack, and y
     * stores would otherwise force reloads of it (false sharing between threads) */
    const kiln_cpu_mm m = *pp, *p = &m;
    if (p->t > 1) {
        gemm(p, r0, r1, panel);
        return;
    }
    switch (p->dtype) {
        GEMV_CASE(KILN_DTYPE_Q4_0);
        GEMV_CASE(KILN_DTYPE_Q4_1);
        GEMV_CASE(KILN_DTYPE_Q5_0);
        GEMV_CASE(KILN_DTYPE_Q5_1);
        GEMV_CASE(KILN_DTYPE_Q8_0);
        GEMV_CASE(KILN_DTYPE_Q4_K);
        GEMV_CASE(KILN_DTYPE_Q5_K);
        GEMV_CASE(KILN_DTYPE_Q6_K);
    default:
        break;
    }
}
