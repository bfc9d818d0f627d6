/*
 * matmul_q_avx2.c — quantized-weight matmul inner loops for AVX2 + FMA + F16C (CPUs
 * without AVX-512; also reachable here with KILN_CPU_ISA_MASK). Same structure as
 * matmul_q_avx512.c (read that first); a 64-element chunk is two ymm registers and the
 * u8 x s8 dot is vpmaddubsw + vpmaddwd (16-bit intermediate sums).
 *
 * vpmaddubsw saturates pairs above 32767, so unsigned weights must stay <= 63 (true for
 * 4-, 5- and 6-bit types). q8_0 weights are signed: its chunks keep the raw int8 values
 * (offset 0) and the dot uses the sign trick |w| * sign(a, w) (|w| <= 128, safe).
 */
#include "format/dtype.h"
#include "kernels/cpu/cpu_impl.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

typedef struct wchunk {
    __m256i u0, u1; /* elements 0..31, 32..63                    */
    __m256 s0, s1;  /* scale per 4-element lane                   */
    __m128 o;       /* offset per 16 elements                     */
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

/* 16 nibble bytes -> the 32 elements of a 32-block, natural order. */
INLINE __m256i nib32(__m128i q) {
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* 32 bits -> 32 bytes, 0x10 where the bit is set. */
INLINE __m256i bits_to_0x10(uint32_t bits) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* 0x10 where (byte & bit) != 0 */
INLINE __m256i bytebit_to_0x10(__m256i v, uint8_t bit) {
    const __m256i b = _mm256_set1_epi8((char)bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, b), b), _mm256_set1_epi8(0x10));
}

INLINE wchunk unpack(uint32_t dt, const uint8_t *row, int64_t c, bool two) {
    wchunk r;
    switch (dt) {
    case KILN_DTYPE_Q4_0: {
        const uint8_t *b0 = row + 2 * c * KQ_Q4_0_BYTES, *b1 = b0 + KQ_Q4_0_BYTES;
        float d0 = h2f(b0), d1 = two ? h2f(b1) : 0.0f;
        r.u0 = nib32(_mm_loadu_si128((const __m128i *)(b0 + 2)));
        r.u1 = two ? nib32(_mm_loadu_si128((const __m128i *)(b1 + 2))) : _mm256_setzero_si256();
        r.s0 = _mm256_set1_ps(d0);
        r.s1 = _mm256_set1_ps(d1);
        r.o = _mm_setr_ps(-8 * d0, -8 * d0, -8 * d1, -8 * d1);
        break;
    }
    case KILN_DTYPE_Q4_1: {
        const uint8_t *b0 = row + 2 * c * KQ_Q4_1_BYTES, *b1 = b0 + KQ_Q4_1_BYTES;
        float d0 = h2f(b0), m0 = h2f(b0 + 2);
        float d1 = two ? h2f(b1) : 0.0f, m1 = two ? h2f(b1 + 2) : 0.0f;
        r.u0 = nib32(_mm_loadu_si128((const __m128i *)(b0 + 4)));
        r.u1 = two ? nib32(_mm_loadu_si128((const __m128i *)(b1 + 4))) : _mm256_setzero_si256();
        r.s0 = _mm256_set1_ps(d0);
        r.s1 = _mm256_set1_ps(d1);
        r.o = _mm_setr_ps(m0, m0, m1, m1);
        break;
    }
    case KILN_DTYPE_Q5_0: {
        const uint8_t *b0 = row + 2 * c * KQ_Q5_0_BYTES, *b1 = b0 + KQ_Q5_0_BYTES;
        float d0 = h2f(b0), d1 = two ? h2f(b1) : 0.0f;
        r.u0 = _mm256_or_si256(nib32(_mm_loadu_si128((const __m128i *)(b0 + 6))),
                               bits_to_0x10(rd32(b0 + 2)));
        r.u1 = two ? _mm256_or_si256(nib32(_mm_loadu_si128((const __m128i *)(b1 + 6))),
                                     bits_to_0x10(rd32(b1 + 2)))
                   : _mm256_setzero_si256();
        r.s0 = _mm256_set1_ps(d0);
        r.s1 = _mm256_set1_ps(d1);
        r.o = _mm_setr_ps(-16 * d0, -16 * d0, -16 * d1, -16 * d1);
        break;
    }
    case KILN_DTYPE_Q5_1: {
        const uint8_t *b0 = row + 2 * c * KQ_Q5_1_BYTES, *b1 = b0 + KQ_Q5_1_BYTES;
        float d0 = h2f(b0), m0 = h2f(b0 + 2);
        float d1 = two ? h2f(b1) : 0.0f, m1 = two ? h2f(b1 + 2) : 0.0f;
        r.u0 = _mm256_or_si256(nib32(_mm_loadu_si128((const __m128i *)(b0 + 8))),
                               bits_to_0x10(rd32(b0 + 4)));
        r.u1 = two ? _mm256_or_si256(nib32(_mm_loadu_si128((const __m128i *)(b1 + 8))),
                                     bits_to_0x10(rd32(b1 + 4)))
                   : _mm256_setzero_si256();
        r.s0 = _mm256_set1_ps(d0);
        r.s1 = _mm256_set1_ps(d1);
        r.o = _mm_setr_ps(m0, m0, m1, m1);
        break;
    }
    case KILN_DTYPE_Q8_0: { /* signed raw values; see the file comment */
        const uint8_t *b0 = row + 2 * c * KQ_Q8_0_BYTES, *b1 = b0 + KQ_Q8_0_BYTES;
        float d0 = h2f(b0), d1 = two ? h2f(b1) : 0.0f;
        r.u0 = _mm256_loadu_si256((const __m256i *)(b0 + 2));
        r.u1 = two ? _mm256_loadu_si256((const __m256i *)(b1 + 2)) : _mm256_setzero_si256();
        r.s0 = _mm256_set1_ps(d0);
        r.s1 = _mm256_set1_ps(d1);
        r.o = _mm_setzero_ps();
        break;
    }
    case KILN_DTYPE_Q4_K: {
        const uint8_t *b = row + (c >> 2) * KQ_Q4_K_BYTES;
        int j = (int)(c & 3);
        float d = h2f(b), dmin = h2f(b + 2);
        uint8_t s0, m0, s1, m1;
        kq_scale_min_k4(2 * j, b + 4, &s0, &m0);
        kq_scale_min_k4(2 * j + 1, b + 4, &s1, &m1);
        __m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * j));
        r.u0 = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
        r.u1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
        r.s0 = _mm256_set1_ps(d * s0);
        r.s1 = _mm256_set1_ps(d * s1);
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
        __m256i v = _mm256_loadu_si256((const __m256i *)(b + 48 + 32 * j));
        r.u0 = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi8(0x0F)),
                               bytebit_to_0x10(qh, (uint8_t)(1u << (2 * j))));
        r.u1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)),
                               bytebit_to_0x10(qh, (uint8_t)(1u << (2 * j + 1))));
        r.s0 = _mm256_set1_ps(d * s0);
        r.s1 = _mm256_set1_ps(d * s1);
        r.o = _mm_setr_ps(-dmin * m0, -dmin * m0, -dmin * m1, -dmin * m1);
        break;
    }
    case KILN_DTYPE_Q6_K:
    default: {
        const uint8_t *b = row + (c >> 2) * KQ_Q6_K_BYTES;
        int cc = (int)(c & 3), h = cc >> 1;
        float d = h2f(b + 208);
        __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
        __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        __m256i h0, h1;
        if ((cc & 1) == 0) {
            h0 = qh;
            h1 = _mm256_srli_epi16(qh, 2);
        } else {
            ql0 = _mm256_srli_epi16(ql0, 4);
            ql1 = _mm256_srli_epi16(ql1, 4);
            h0 = _mm256_srli_epi16(qh, 4);
            h1 = _mm256_srli_epi16(qh, 6);
        }
        const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
        r.u0 = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                               _mm256_slli_epi16(_mm256_and_si256(h0, m2), 4));
        r.u1 = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                               _mm256_slli_epi16(_mm256_and_si256(h1, m2), 4));
        int32_t sc4;
        memcpy(&sc4, b + 192 + 4 * cc, 4);
        __m128 f =
            _mm_mul_ps(_mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(sc4))), _mm_set1_ps(d));
        __m256 f8 = _mm256_castps128_ps256(f);
        r.s0 = _mm256_permutevar8x32_ps(f8, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
        r.s1 = _mm256_permutevar8x32_ps(f8, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3));
        r.o = _mm_mul_ps(f, _mm_set1_ps(-32.0f));
        break;
    }
    }
    return r;
}

/* ---- activation quantization ---- */

INLINE float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

INLINE int32_t hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 values -> q1, q2 (int32) with the two-level scheme of qblocks.h. */
INLINE void quant8(__m256 v, float d1, float id1, float id2, __m256i *q1, __m256i *q2) {
    *q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v, _mm256_set1_ps(id1)));
    __m256 r = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(*q1), _mm256_set1_ps(d1), v);
    __m256i t = _mm256_cvtps_epi32(_mm256_mul_ps(r, _mm256_set1_ps(id2)));
    *q2 = _mm256_max_epi32(_mm256_min_epi32(t, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
}

/* 4 x 8 int32 -> 32 int8 in order. */
INLINE void pack32(const __m256i q[4], int8_t *out) {
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)out, p);
}

void kiln_cpu_q8act_avx2(const float *x, int64_t k, uint8_t *dst) {
    const int64_t kc = kiln_q8act_chunks(k), nb = k / 32;
    int8_t *qs = (int8_t *)dst, *qs2 = (int8_t *)(dst + kc * 64);
    float *dl = (float *)(dst + kc * 128), *gs = (float *)(dst + kc * 192);
    int16_t *a16 = (int16_t *)(dst + kc * 208);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < nb; b++) {
        __m256 v[4];
        __m256 a = _mm256_setzero_ps();
#pragma GCC unroll 16
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
            a = _mm256_max_ps(a, _mm256_and_ps(v[i], absmask));
        }
        float amax = hmax8(a);
        float d1 = amax / 127.0f, id1 = amax > 0 ? 127.0f / amax : 0.0f;
        float d2 = d1 * (1.0f / 256), id2 = id1 * 256.0f;
        __m256i q1[4], q2[4];
#pragma GCC unroll 16
        for (int i = 0; i < 4; i++) quant8(v[i], d1, id1, id2, &q1[i], &q2[i]);
        for (int h = 0; h < 2; h++)
            gs[2 * b + h] = d1 * (float)hsum8i(_mm256_add_epi32(q1[2 * h], q1[2 * h + 1])) +
                            d2 * (float)hsum8i(_mm256_add_epi32(q2[2 * h], q2[2 * h + 1]));
        pack32(q1, qs + 32 * b);
        pack32(q2, qs2 + 32 * b);
        _mm256_storeu_ps(dl + 8 * b, _mm256_set1_ps(d2));
        for (int h = 0; h < 2; h++) { /* 256 q1 + q2 fits int16: packs does not saturate */
            __m256i lo = _mm256_add_epi32(_mm256_slli_epi32(q1[2 * h], 8), q2[2 * h]);
            __m256i hi = _mm256_add_epi32(_mm256_slli_epi32(q1[2 * h + 1], 8), q2[2 * h + 1]);
            __m256i pk = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
            _mm256_storeu_si256((__m256i *)(a16 + 32 * b + 16 * h), pk);
        }
    }
    if (nb & 1) {
        memset(a16 + 32 * nb, 0, 64);
        memset(qs + 32 * nb, 0, 32);
        memset(qs2 + 32 * nb, 0, 32);
        _mm256_storeu_ps(dl + 8 * nb, _mm256_setzero_ps());
        gs[2 * nb] = gs[2 * nb + 1] = 0;
    }
}

/* ---- dot of one chunk ---- */

INLINE __m256i dot4(uint32_t dt, __m256i u, __m256i a) {
    __m256i p;
    if (dt == KILN_DTYPE_Q8_0)
        p = _mm256_maddubs_epi16(_mm256_sign_epi8(u, u), _mm256_sign_epi8(a, u));
    else
        p = _mm256_maddubs_epi16(u, a);
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* 256 * dot(u, q1) + dot(u, q2) (qblocks.h), exact in int32. */
INLINE __m256i dot2(uint32_t dt, __m256i u, __m256i a1, __m256i a2) {
    return _mm256_add_epi32(_mm256_slli_epi32(dot4(dt, u, a1), 8), dot4(dt, u, a2));
}

INLINE __m256 chunk_dot(uint32_t dt, __m256i u0, __m256i u1, __m256 s0, __m256 s1, const int8_t *aq,
                        const int8_t *aq2, const float *adl, __m256 acc) {
    __m256i d0 = dot2(dt, u0, _mm256_loadu_si256((const __m256i *)aq),
                      _mm256_loadu_si256((const __m256i *)aq2));
    __m256i d1 = dot2(dt, u1, _mm256_loadu_si256((const __m256i *)(aq + 32)),
                      _mm256_loadu_si256((const __m256i *)(aq2 + 32)));
    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(d0), _mm256_loadu_ps(adl)), s0, acc);
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(d1), _mm256_loadu_ps(adl + 8)), s1,
                           acc);
}

INLINE float gemv_row(uint32_t dt, const uint8_t *row, int64_t k, const uint8_t *act) {
    const int64_t kc = kiln_q8act_chunks(k);
    const bool odd = (k % 64) != 0;
    const int8_t *aq = kiln_q8act_qs(act, k), *aq2 = kiln_q8act_qs2(act, k);
    const float *adl = kiln_q8act_dl(act, k), *ags = kiln_q8act_gs(act, k);
    __m256 acc = _mm256_setzero_ps();
    __m128 acco = _mm_setzero_ps();
    for (int64_t c = 0; c < kc; c++) {
        wchunk w = unpack(dt, row, c, !(odd && c == kc - 1));
        acc = chunk_dot(dt, w.u0, w.u1, w.s0, w.s1, aq + 64 * c, aq2 + 64 * c, adl + 16 * c, acc);
        acco = _mm_fmadd_ps(w.o, _mm_loadu_ps(ags + 4 * c), acco);
    }
    acco = _mm_add_ps(acco, _mm_movehl_ps(acco, acco));
    acco = _mm_add_ss(acco, _mm_movehdup_ps(acco));
    return hsum8(acc) + _mm_cvtss_f32(acco);
}

/* ---- GEMM ---- */

INLINE void unpack_row(uint32_t dt, const uint8_t *row, int64_t k, uint8_t *p) {
    const int64_t kc = kiln_q8act_chunks(k);
    const bool odd = (k % 64) != 0;
    float *ps = (float *)(p + kc * 64), *po = (float *)(p + kc * 128);
    for (int64_t c = 0; c < kc; c++) {
        wchunk w = unpack(dt, row, c, !(odd && c == kc - 1));
        _mm256_store_si256((__m256i *)(p + 64 * c), w.u0);
        _mm256_store_si256((__m256i *)(p + 64 * c + 32), w.u1);
        _mm256_store_ps(ps + 16 * c, w.s0);
        _mm256_store_ps(ps + 16 * c + 8, w.s1);
        _mm_store_ps(po + 4 * c, w.o);
    }
}

INLINE float dot_o(const float *wo, const float *gs, int64_t n4) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n4; i += 8)
        acc = _mm256_fmadd_ps(_mm256_load_ps(wo + i), _mm256_loadu_ps(gs + i), acc);
    float s = hsum8(acc);
    for (; i < n4; i++) s += wo[i] * gs[i];
    return s;
}

/* R rows x T tokens (R <= 2, T <= 4: 16 ymm accumulators would leave no room). */
INLINE void micro(uint32_t dt, int R, int T, const uint8_t *panel, size_t pstride, int64_t k,
                  const uint8_t *act, size_t astride, float *out) {
    const int64_t kc = kiln_q8act_chunks(k);
    __m256 acc[2][4];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t c = 0; c < kc; c++) {
#pragma GCC unroll 16
        for (int h = 0; h < 2; h++) {
            __m256i u[2];
            __m256 s[2];
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) {
                u[r] = _mm256_load_si256((const __m256i *)(panel + r * pstride + 64 * c + 32 * h));
                s[r] =
                    _mm256_load_ps((const float *)(panel + r * pstride + kc * 64) + 16 * c + 8 * h);
            }
#pragma GCC unroll 16
            for (int t = 0; t < T; t++) {
                const uint8_t *a = act + t * astride;
                __m256i aq = _mm256_load_si256((const __m256i *)(a + 64 * c + 32 * h));
                __m256i aq2 = _mm256_load_si256((const __m256i *)(a + kc * 64 + 64 * c + 32 * h));
                __m256 dl = _mm256_load_ps((const float *)(a + kc * 128) + 16 * c + 8 * h);
#pragma GCC unroll 16
                for (int r = 0; r < R; r++) {
                    __m256i d = dot2(dt, u[r], aq, aq2);
                    acc[r][t] =
                        _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(d), dl), s[r], acc[r][t]);
                }
            }
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int t = 0; t < T; t++)
            out[r * 4 + t] =
                hsum8(acc[r][t]) + dot_o((const float *)(panel + r * pstride + kc * 128),
                                         (const float *)(act + t * astride + kc * 192), kc * 4);
}

INLINE void micro_t(uint32_t dt, int R, int T, const uint8_t *panel, size_t pstride, int64_t k,
                    const uint8_t *act, size_t astride, float *out) {
    if (R == 2) {
        switch (T) {
        case 4:
            micro(dt, 2, 4, panel, pstride, k, act, astride, out);
            return;
        case 3:
            micro(dt, 2, 3, panel, pstride, k, act, astride, out);
            return;
        case 2:
            micro(dt, 2, 2, panel, pstride, k, act, astride, out);
            return;
        default:
            micro(dt, 2, 1, panel, pstride, k, act, astride, out);
            return;
        }
    }
    switch (T) {
    case 4:
        micro(dt, 1, 4, panel, pstride, k, act, astride, out);
        return;
    case 3:
        micro(dt, 1, 3, panel, pstride, k, act, astride, out);
        return;
    case 2:
        micro(dt, 1, 2, panel, pstride, k, act, astride, out);
        return;
    default:
        micro(dt, 1, 1, panel, pstride, k, act, astride, out);
        return;
    }
}

/* The q8_0 dot differs (sign trick), every other type shares one micro-kernel. */
static void micro_dispatch(uint32_t dt, int R, int T, const uint8_t *panel, size_t pstride,
                           int64_t k, const uint8_t *act, size_t astride, float *out) {
    if (dt == KILN_DTYPE_Q8_0)
        micro_t(KILN_DTYPE_Q8_0, R, T, panel, pstride, k, act, astride, out);
    else
        micro_t(KILN_DTYPE_Q4_0, R, T, panel, pstride, k, act, astride, out);
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
        int R = r1 - r >= 2 ? 2 : 1;
        for (int i = 0; i < R; i++)
            unpack_row_dispatch(p->dtype, p->w + (r + i) * p->w_row_bytes, p->k,
                                panel + i * pstride);
        for (int64_t t = 0; t < p->t; t += 4) {
            int T = p->t - t >= 4 ? 4 : (int)(p->t - t);
            micro_dispatch(p->dtype, R, T, panel, pstride, p->k, p->act + t * p->act_stride,
                           p->act_stride, out);
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
            p->y[r] = gemv_row(DT, p->w + r * p->w_row_bytes, p->k, p->act) +                      \
                      (p->bias ? p->bias[r] : 0.0f);                                               \
        break

void kiln_cpu_mmq_avx2(const kiln_cpu_mm *pp, int64_t r0, int64_t r1, uint8_t *panel) {
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
