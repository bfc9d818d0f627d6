/*
 * matmul_r16_avx2.c — quantized matmul on the R16 layout (cpu_kernels.h) for AVX2 + FMA
 * + F16C, so CPUs without AVX-512 get the interleaved fast path too. Same layout and the
 * same arithmetic as matmul_r16_avx512.c (read that first); what differs:
 *
 *  - A 64-byte vector of the layout (4 elements x 16 rows) is two ymm halves, rows 0-7
 *    and 8-15; the kernels run the halves one after the other (16 ymm registers do not
 *    hold a unpacked unit).
 *  - The u8 x s8 dot is vpmaddubsw (pairs -> saturating s16) + vpmaddwd (-> s32). The s16
 *    pair sums of L element groups are added in 16 bits before one vpmaddwd, with L
 *    chosen so they cannot overflow: u <= 15 (4-bit types): pair <= 2 * 15 * 127 = 3810,
 *    L = 8; u <= 31 (5-bit): L = 4; u <= 63 (q6_K): L = 2.
 *  - q8_0 keeps its signed quants (u = q, offset 0) and uses the sign trick
 *    maddubs(|q|, sign(a, q)) (|q| <= 128: pair <= 32512, L = 1): q + 128 would saturate.
 *  - Prefill unpacks every unit into the kiln_r16 panel format (16 x 64 bytes u, 4 x 16
 *    floats s and o) once per group and streams the tokens over it. Decode computes
 *    straight from the layout in registers (unit_dots_* + unit_fsteps): the same integer
 *    sums and the same float steps in the same order as the panel's unit_dot, so a
 *    token's row is bitwise the same in both (batch invariant like the AVX-512 kernel;
 *    tests/unit/test_cpu_matmul.c checks it).
 */
#include "format/dtype.h"
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu_kernels.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
/* An empty asm that takes x in a register and gives it back: GCC may not reassociate a
 * chain of adds across it. Without it GCC turns the accumulation chains of the decode
 * loops into trees of all the unit's products at once, which spill to the stack. */
#define KEEP(x) __asm__("" : "+x"(x))
/* The same for a general-purpose register value: a pointer whose loads GCC must not reuse
 * from an earlier pass (see unit_dots_k). */
#define OPAQUE(x) __asm__("" : "+r"(x))

/* Unpacked unit: u[16][64] | s[4][16] floats | o[4][16] floats (1536 bytes). */
#define UNIT_BYTES (24 * 64)

INLINE bool per32(uint32_t dt) {
    return dt != KILN_DTYPE_Q6_K;
}

INLINE __m256i ld(const uint8_t *p) {
    return _mm256_loadu_si256((const __m256i *)p);
}

/* 8 f16 -> 8 floats */
INLINE __m256 ld_h8(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
INLINE __m256 ld_u8x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
INLINE __m256 ld_i8x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* 0x10 in byte i where bit i of the 32-bit word is set. */
INLINE __m256i bits_to_0x10(uint32_t bits) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* Half hh (rows 8hh..8hh+7) of the q5 high bits of a 64-bit mask at p. */
INLINE __m256i hibits(const uint8_t *p, int hh) {
    uint32_t m;
    memcpy(&m, p + 4 * hh, 4);
    return bits_to_0x10(m);
}

/* hibits() for the decode loops, in inline asm with its three constants as memory
 * operands: one register instead of four. With the constants in registers the q5_K
 * decode (unit_dots_k) had 14 of the 16 ymm registers taken by constants, accumulators and
 * broadcasts and spilled ~70 values per unit to the stack. Same bytes as hibits(). */
static const uint8_t hib_c[3][32] __attribute__((aligned(32))) = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
     2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128,
     1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128},
    {16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16,
     16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16}};
INLINE __m256i hibits_m(const uint8_t *p, int hh) {
    __m256i v;
    __asm__("vpbroadcastd %[m], %[v]\n\t"
            "vpshufb %[shuf], %[v], %[v]\n\t"
            "vpand %[sel], %[v], %[v]\n\t"
            "vpcmpeqb %[sel], %[v], %[v]\n\t"
            "vpand %[x10], %[v], %[v]"
            : [v] "=&x"(v)
            : [m] "m"(*(const uint32_t *)(p + 4 * hh)), [shuf] "m"(hib_c[0]), [sel] "m"(hib_c[1]),
              [x10] "m"(hib_c[2]));
    return v;
}

/* madd(s1, 256) + madd(s2, 1) (k_group's level combination) with the two constants as
 * memory operands, for q5_K's decode (see hibits_m). */
static const int16_t madd_c[2][16] __attribute__((aligned(32))) = {
    {256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256, 256},
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}};
INLINE __m256i madd_levels_m(__m256i s1, __m256i s2) {
    __asm__("vpmaddwd %[c256], %[s1], %[s1]\n\t"
            "vpmaddwd %[ones], %[s2], %[s2]\n\t"
            "vpaddd %[s2], %[s1], %[s1]"
            : [s1] "+x"(s1), [s2] "+x"(s2)
            : [c256] "m"(madd_c[0]), [ones] "m"(madd_c[1]));
    return s1;
}

/* The 4-bit element groups i (lo nibbles) and 4 + i (hi nibbles) of the 32-block types'
 * 32-byte vector v (half hh), with q5's fifth bits from the block at q. */
INLINE void split4(__m256i v, bool five, const uint8_t *q, int i, int hh, __m256i *lo,
                   __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    *lo = _mm256_and_si256(v, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (five) {
        *lo = _mm256_or_si256(*lo, hibits(q + 8 * i, hh));
        *hi = _mm256_or_si256(*hi, hibits(q + 32 + 8 * i, hh));
    }
}

INLINE void st_u(uint8_t *dst, int j, int hh, __m256i v) {
    _mm256_store_si256((__m256i *)(dst + 64 * j + 32 * hh), v);
}
INLINE void st_f(uint8_t *dst, int which, int q, int hh, __m256 v) { /* which: 0 s, 1 o */
    _mm256_store_ps((float *)(dst + 1024 + 256 * which + 64 * q) + 8 * hh, v);
}

/* Unit c of the group stream g, unpacked into dst (64-byte aligned, UNIT_BYTES). */
INLINE void unpack(uint32_t dt, const uint8_t *g, int64_t c, bool two, uint8_t *dst) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
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
        const float off = dt == KILN_DTYPE_Q4_0 ? -8.0f : dt == KILN_DTYPE_Q5_0 ? -16.0f : 0.0f;
        for (int h = 0; h < 2; h++) {
            if (h == 1 && !two) {
                memset(dst + 8 * 64, 0, 8 * 64);
                for (int w = 0; w < 2; w++)
                    for (int hh = 0; hh < 2; hh++)
                        for (int q = 2; q < 4; q++) st_f(dst, w, q, hh, _mm256_setzero_ps());
                break;
            }
            const uint8_t *q = b + hdr + (size_t)h * bl;
            for (int hh = 0; hh < 2; hh++) {
                if (dt == KILN_DTYPE_Q8_0) { /* signed quants, see the file comment */
#pragma GCC unroll 8
                    for (int j = 0; j < 8; j++) st_u(dst, 8 * h + j, hh, ld(q + 64 * j + 32 * hh));
                } else {
                    const uint8_t *qs = five ? q + 64 : q;
#pragma GCC unroll 4
                    for (int i = 0; i < 4; i++) {
                        __m256i lo, hi;
                        split4(ld(qs + 64 * i + 32 * hh), five, q, i, hh, &lo, &hi);
                        st_u(dst, 8 * h + i, hh, lo);
                        st_u(dst, 8 * h + 4 + i, hh, hi);
                    }
                }
                __m256 d = ld_h8(b + 32 * h + 16 * hh);
                __m256 o =
                    min ? ld_h8(b + 64 + 32 * h + 16 * hh) : _mm256_mul_ps(d, _mm256_set1_ps(off));
                for (int q2 = 2 * h; q2 < 2 * h + 2; q2++) {
                    st_f(dst, 0, q2, hh, d);
                    st_f(dst, 1, q2, hh, o);
                }
            }
        }
        break;
    }
    case KILN_DTYPE_Q4_K:
    case KILN_DTYPE_Q5_K: {
        const int cc = (int)(c & 3);
        const bool five = dt == KILN_DTYPE_Q5_K;
        const uint8_t *qs = b + (five ? 832 : 320) + 512 * cc, *qh = b + 320 + 128 * cc;
        for (int hh = 0; hh < 2; hh++) {
            __m256 d = ld_h8(b + 16 * hh), dmin = ld_h8(b + 32 + 16 * hh);
            for (int h = 0; h < 2; h++) {
                __m256 s = _mm256_mul_ps(ld_u8x8(b + 64 + 16 * (2 * cc + h) + 8 * hh), d);
                __m256 o = _mm256_mul_ps(ld_u8x8(b + 192 + 16 * (2 * cc + h) + 8 * hh), dmin);
                o = _mm256_sub_ps(_mm256_setzero_ps(), o);
                st_f(dst, 0, 2 * h, hh, s), st_f(dst, 0, 2 * h + 1, hh, s);
                st_f(dst, 1, 2 * h, hh, o), st_f(dst, 1, 2 * h + 1, hh, o);
            }
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                __m256i v = ld(qs + 64 * i + 32 * hh);
                __m256i lo = _mm256_and_si256(v, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (five) {
                    lo = _mm256_or_si256(lo, hibits(qh + 8 * i, hh));
                    hi = _mm256_or_si256(hi, hibits(qh + 64 + 8 * i, hh));
                }
                st_u(dst, i, hh, lo);
                st_u(dst, 8 + i, hh, hi);
            }
        }
        break;
    }
    default: { /* q6_K */
        const int cc = (int)(c & 3);
        const __m256i m3 = _mm256_set1_epi8(0x30);
        for (int hh = 0; hh < 2; hh++) {
            __m256 d = _mm256_loadu_ps((const float *)b + 8 * hh);
            for (int q = 0; q < 4; q++) {
                __m256 s = _mm256_mul_ps(ld_i8x8(b + 64 + 16 * (4 * cc + q) + 8 * hh), d);
                st_f(dst, 0, q, hh, s);
                st_f(dst, 1, q, hh, _mm256_mul_ps(s, _mm256_set1_ps(-32.0f)));
            }
            __m256i hi[4];
            for (int i = 0; i < 4; i++) hi[i] = ld(b + 2368 + 64 * (4 * cc + i) + 32 * hh);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                __m256i v = ld(b + 320 + 64 * (8 * cc + i) + 32 * hh);
                __m256i lo_a = _mm256_and_si256(v, m4);
                __m256i lo_b = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                const int i4 = i & 3, qa = i >> 2, qb = 2 + (i >> 2);
                __m256i ha = qa == 0 ? _mm256_slli_epi16(hi[i4], 4) : _mm256_slli_epi16(hi[i4], 2);
                __m256i hb = qb == 2 ? hi[i4] : _mm256_srli_epi16(hi[i4], 2);
                st_u(dst, i, hh, _mm256_or_si256(lo_a, _mm256_and_si256(ha, m3)));
                st_u(dst, 8 + i, hh, _mm256_or_si256(lo_b, _mm256_and_si256(hb, m3)));
            }
        }
        break;
    }
    }
}

/* Element groups whose s16 pair sums may be added before vpmaddwd (file comment). */
INLINE int lanes16(uint32_t dt) {
    switch (dt) {
    case KILN_DTYPE_Q8_0:
        return 1;
    case KILN_DTYPE_Q6_K:
        return 2;
    case KILN_DTYPE_Q5_0:
    case KILN_DTYPE_Q5_1:
    case KILN_DTYPE_Q5_K:
        return 4;
    default:
        return 8;
    }
}

INLINE __m256i bcast(const int8_t *a) {
    int32_t v;
    memcpy(&v, a, 4);
    return _mm256_set1_epi32(v);
}

INLINE __m256i mul8(uint32_t dt, __m256i u, __m256i a) {
    if (dt == KILN_DTYPE_Q8_0)
        return _mm256_maddubs_epi16(_mm256_sign_epi8(u, u), _mm256_sign_epi8(a, u));
    return _mm256_maddubs_epi16(u, a);
}

/* acc (rows 8hh..8hh+7) += one unpacked unit x one token's activations (chunk c). */
INLINE __m256 unit_dot(uint32_t dt, const uint8_t *U, int hh, const int8_t *aq, const int8_t *aq2,
                       const float *dl, const float *gs, __m256 acc) {
    const int G = per32(dt) ? 2 : 4, J = 16 / G, L = lanes16(dt);
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int q = 0; q < G; q++) {
        __m256i p1 = _mm256_setzero_si256(), p2 = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j0 = 0; j0 < J; j0 += L) {
            __m256i s1 = _mm256_setzero_si256(), s2 = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int l = 0; l < L; l++) {
                const int j = q * J + j0 + l;
                __m256i u = _mm256_load_si256((const __m256i *)(U + 64 * j + 32 * hh));
                s1 = _mm256_add_epi16(s1, mul8(dt, u, bcast(aq + 4 * j)));
                s2 = _mm256_add_epi16(s2, mul8(dt, u, bcast(aq2 + 4 * j)));
            }
            p1 = _mm256_add_epi32(p1, _mm256_madd_epi16(s1, ones));
            p2 = _mm256_add_epi32(p2, _mm256_madd_epi16(s2, ones));
        }
        __m256i d = _mm256_add_epi32(_mm256_slli_epi32(p1, 8), p2);
        const int sq = per32(dt) ? 2 * q : q;
        float gsum = per32(dt) ? gs[2 * q] + gs[2 * q + 1] : gs[q];
        const float *s = (const float *)(U + 1024 + 64 * sq) + 8 * hh;
        const float *o = (const float *)(U + 1280 + 64 * sq) + 8 * hh;
        __m256 sc = _mm256_mul_ps(_mm256_load_ps(s), _mm256_set1_ps(dl[8 * (sq >> 1)]));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sc, acc);
        acc = _mm256_fmadd_ps(_mm256_load_ps(o), _mm256_set1_ps(gsum), acc);
    }
    return acc;
}

/* y[rows of group g] (+ bias) for one token; rows: valid rows of the group (<= 16). */
INLINE void store_rows(float *y, int64_t rows, __m256 lo, __m256 hi, const float *bias) {
    float v[16];
    _mm256_storeu_ps(v, lo);
    _mm256_storeu_ps(v + 8, hi);
    if (rows >= 16) {
        if (bias) {
            lo = _mm256_add_ps(lo, _mm256_loadu_ps(bias));
            hi = _mm256_add_ps(hi, _mm256_loadu_ps(bias + 8));
        }
        _mm256_storeu_ps(y, lo);
        _mm256_storeu_ps(y + 8, hi);
        return;
    }
    for (int64_t r = 0; r < rows; r++) y[r] = v[r] + (bias ? bias[r] : 0.0f);
}

/* Software prefetch distance of the decode stream (as matmul_r16_avx512.c). */
#define PF 2048

/* ---- decode, register resident ----
 * The int32 dots of a unit's halves (rows 8hh..8hh+7) with the two activation levels, per
 * scale group q: d[q] = 256 * dot(u, a1) + dot(u, a2), computed straight from the layout
 * without the L1 round trip of unpack() (which costs a store and a reload of every
 * unpacked vector, and register spills). Integer sums are exact, so d[q] is the value
 * unit_dot() computes from the unpacked unit; the float steps after it (unit_fsteps) are
 * unit_dot's, in its order: decode stays bitwise equal to prefill (batch invariance). */

/* s16 accumulators of 2 scale groups x 2 levels, flushed to s32 every L vectors. */
typedef struct acc16 {
    __m256i s1[2], s2[2], p1[2], p2[2];
    int n[2];
} acc16;

INLINE void acc_init(acc16 *A) {
    for (int q = 0; q < 2; q++) {
        A->s1[q] = A->s2[q] = A->p1[q] = A->p2[q] = _mm256_setzero_si256();
        A->n[q] = 0;
    }
}

INLINE void acc_flush(acc16 *A, int q) {
    const __m256i ones = _mm256_set1_epi16(1);
    A->p1[q] = _mm256_add_epi32(A->p1[q], _mm256_madd_epi16(A->s1[q], ones));
    A->p2[q] = _mm256_add_epi32(A->p2[q], _mm256_madd_epi16(A->s2[q], ones));
    A->s1[q] = A->s2[q] = _mm256_setzero_si256();
    A->n[q] = 0;
}

/* u (element group j of the unit, 8 rows) into scale group slot q (0 or 1), with the
 * activations' two levels already broadcast (b1, b2). */
INLINE void acc_add_b(uint32_t dt, acc16 *A, int q, __m256i u, __m256i b1, __m256i b2) {
    A->s1[q] = _mm256_add_epi16(A->s1[q], mul8(dt, u, b1));
    A->s2[q] = _mm256_add_epi16(A->s2[q], mul8(dt, u, b2));
    if (++A->n[q] == lanes16(dt)) acc_flush(A, q);
}

INLINE __m256i acc_dot(acc16 *A, int q) {
    if (A->n[q]) acc_flush(A, q);
    return _mm256_add_epi32(_mm256_slli_epi32(A->p1[q], 8), A->p2[q]);
}

/* The int32 dots of a unit for both halves at once, 32-block types (d[hh][h]): one broadcast of
 * each activation group serves rows 0-7 and 8-15 (the halves one after the other
 * broadcast it twice: ~1/8 of decode's vector instructions). The same integer sums. */
INLINE void unit_dots_both(uint32_t dt, const uint8_t *g, int64_t c, const int8_t *a1,
                           const int8_t *a2, __m256i d[2][2]) {
    const uint8_t *b = g + kiln_r16_unit_off(dt, c);
    const size_t hdr = kiln_r16_hdr(dt), bl = kiln_r16_blk(dt);
    const bool five = dt == KILN_DTYPE_Q5_0 || dt == KILN_DTYPE_Q5_1;
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const uint8_t *q = b + hdr + (size_t)h * bl;
        acc16 A[2];
        acc_init(&A[0]);
        acc_init(&A[1]);
        if (dt == KILN_DTYPE_Q8_0) {
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const __m256i b1 = bcast(a1 + 4 * (8 * h + j)), b2 = bcast(a2 + 4 * (8 * h + j));
#pragma GCC unroll 2
                for (int hh = 0; hh < 2; hh++)
                    acc_add_b(dt, &A[hh], 0, ld(q + 64 * j + 32 * hh), b1, b2);
            }
        } else {
            const uint8_t *qs = five ? q + 64 : q;
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const __m256i bl1 = bcast(a1 + 4 * (8 * h + i)), bl2 = bcast(a2 + 4 * (8 * h + i));
                const __m256i bh1 = bcast(a1 + 4 * (8 * h + 4 + i));
                const __m256i bh2 = bcast(a2 + 4 * (8 * h + 4 + i));
#pragma GCC unroll 2
                for (int hh = 0; hh < 2; hh++) {
                    __m256i lo, hi;
                    split4(ld(qs + 64 * i + 32 * hh), five, q, i, hh, &lo, &hi);
                    acc_add_b(dt, &A[hh], 0, lo, bl1, bl2);
                    acc_add_b(dt, &A[hh], 0, hi, bh1, bh2);
                }
            }
        }
        d[0][h] = acc_dot(&A[0], 0);
        d[1][h] = acc_dot(&A[1], 0);
    }
}

/* Element group i of scale group q of a K-quant unit, rows 8hh..8hh+7, as u8 (the values
 * unpack() stores): q4_K / q5_K (q 0, 1): the low or high nibbles of quant vector i of lo,
 * q5_K with the fifth bits of the masks at hv; q6_K (q 0..3): the low or high nibbles of
 * lo vector 4 (q & 1) + i with the 2-bit highs of hv vector i (bits 2q). */
INLINE __m256i k_u(uint32_t dt, int q, const uint8_t *lo, const uint8_t *hv, int i, int hh) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (dt == KILN_DTYPE_Q6_K) {
        const __m256i m3 = _mm256_set1_epi8(0x30);
        __m256i v = ld(lo + 64 * (4 * (q & 1) + i) + 32 * hh), h = ld(hv + 64 * i + 32 * hh);
        __m256i l = _mm256_and_si256(q >= 2 ? _mm256_srli_epi16(v, 4) : v, m4);
        h = q == 0   ? _mm256_slli_epi16(h, 4)
            : q == 1 ? _mm256_slli_epi16(h, 2)
            : q == 3 ? _mm256_srli_epi16(h, 2)
                     : h;
        return _mm256_or_si256(l, _mm256_and_si256(h, m3));
    }
    __m256i v = ld(lo + 64 * i + 32 * hh);
    __m256i u = _mm256_and_si256(q ? _mm256_srli_epi16(v, 4) : v, m4);
    if (dt == KILN_DTYPE_Q5_K) u = _mm256_or_si256(u, hibits_m(hv + 64 * q + 8 * i, hh));
    return u;
}

/* The integer dots of scale group q of a K-quant unit for both halves (d[hh]): each
 * activation broadcast serves rows 0-7 and 8-15, and only 4 s16 accumulators are live. */
INLINE void k_group(uint32_t dt, int q, const uint8_t *lo, const uint8_t *hv, const int8_t *a1,
                    const int8_t *a2, __m256i d[2]) {
    const __m256i ones = _mm256_set1_epi16(1), c256 = _mm256_set1_epi16(256);
    const int n = dt == KILN_DTYPE_Q6_K ? 4 : 8, L = lanes16(dt);
    __m256i s1[2], s2[2], p[2];
#pragma GCC unroll 2
    for (int hh = 0; hh < 2; hh++) s1[hh] = s2[hh] = p[hh] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int i = 0; i < n; i++) {
        const __m256i b1 = bcast(a1 + 4 * i), b2 = bcast(a2 + 4 * i);
#pragma GCC unroll 2
        for (int hh = 0; hh < 2; hh++) {
            const __m256i u = k_u(dt, q, lo, hv, i, hh);
            s1[hh] = _mm256_add_epi16(s1[hh], _mm256_maddubs_epi16(u, b1));
            s2[hh] = _mm256_add_epi16(s2[hh], _mm256_maddubs_epi16(u, b2));
            KEEP(s1[hh]);
            KEEP(s2[hh]);
            if ((i + 1) % L == 0) {
                p[hh] = _mm256_add_epi32(p[hh],
                                         dt == KILN_DTYPE_Q5_K
                                             ? madd_levels_m(s1[hh], s2[hh])
                                             : _mm256_add_epi32(_mm256_madd_epi16(s1[hh], c256),
                                                                _mm256_madd_epi16(s2[hh], ones)));
                KEEP(p[hh]);
                s1[hh] = s2[hh] = _mm256_setzero_si256();
            }
        }
    }
#pragma GCC unroll 2
    for (int hh = 0; hh < 2; hh++) d[hh] = p[hh];
}

/* The int32 dots of a unit for both halves at once, K-quants (d[hh][q]), one scale group after
 * the other. Why: the per-half code broadcast every activation word twice, and GCC, seeing
 * both halves' code in one block, merged them and spilled every maddubs result (both
 * groups of both halves at once are 8 s16 accumulators plus the broadcasts: more than the
 * 16 ymm registers). A quant vector is loaded again for each scale group that reads it (an
 * L1 load is cheaper than the broadcasts it saves). The level sums are combined by
 * vpmaddwd with 256 and 1 (= 256 madd(s, 1) exactly: no overflow), so d is the integer
 * unit_dot() computes: the float steps see the same values. */
INLINE void unit_dots_k(uint32_t dt, const uint8_t *g, int64_t c, const int8_t *a1,
                        const int8_t *a2, __m256i d[2][4]) {
    const uint8_t *b = g + kiln_r16_unit_off(dt, c);
    const int cc = (int)(c & 3);
    const uint8_t *lo, *hv;
    if (dt == KILN_DTYPE_Q6_K)
        lo = b + 320 + 512 * cc, hv = b + 2368 + 256 * cc;
    else
        lo = b + (dt == KILN_DTYPE_Q5_K ? 832 : 320) + 512 * cc, hv = b + 320 + 128 * cc;
    const int G = dt == KILN_DTYPE_Q6_K ? 4 : 2;
#pragma GCC unroll 4
    for (int q = 0; q < G; q++) {
        const int j0 = dt == KILN_DTYPE_Q6_K ? 8 * (q >> 1) + 4 * (q & 1) : 8 * q;
        __m256i dq[2];
        k_group(dt, q, lo, hv, a1 + 4 * j0, a2 + 4 * j0, dq);
        d[0][q] = dq[0], d[1][q] = dq[1];
        /* the next group reads the same vectors: without this GCC keeps them from this
         * pass (16 live ymm: spilled) instead of loading them again */
        OPAQUE(lo);
        OPAQUE(hv);
    }
}

/* The float steps of unit_dot() for one unit-half, from the unit's raw scales, in
 * unit_dot's order. The offset step is unit_dot's fma(o, gsum, acc) with o = f * o' (f =
 * -1, -8, -16, -32 or 0: o' is what unpack() scales by f) computed as fma(o', f * gsum,
 * acc): the products are the same real number (scaling by a power of two, zero or -1 is
 * exact barring an overflow of |gsum| > 2^122), so the result is bitwise unit_dot's, one
 * vector mul or sub cheaper. */
INLINE __m256 unit_fsteps(uint32_t dt, const uint8_t *g, int64_t c, int hh, const __m256i *d,
                          const float *dl, const float *gs, __m256 acc) {
    const uint8_t *b = g + kiln_r16_unit_off(dt, c);
    const int G = per32(dt) ? 2 : 4;
#pragma GCC unroll 4
    for (int q = 0; q < G; q++) {
        __m256 s, o;
        float f = 1.0f;
        switch (dt) {
        case KILN_DTYPE_Q4_0:
        case KILN_DTYPE_Q4_1:
        case KILN_DTYPE_Q5_0:
        case KILN_DTYPE_Q5_1:
        case KILN_DTYPE_Q8_0: {
            const bool min = dt == KILN_DTYPE_Q4_1 || dt == KILN_DTYPE_Q5_1;
            s = ld_h8(b + 32 * q + 16 * hh);
            o = min ? ld_h8(b + 64 + 32 * q + 16 * hh) : s;
            f = min ? 1.0f : dt == KILN_DTYPE_Q4_0 ? -8.0f : dt == KILN_DTYPE_Q5_0 ? -16.0f : 0.0f;
            break;
        }
        case KILN_DTYPE_Q4_K:
        case KILN_DTYPE_Q5_K: {
            const int cc = (int)(c & 3);
            __m256 dd = ld_h8(b + 16 * hh), dmin = ld_h8(b + 32 + 16 * hh);
            s = _mm256_mul_ps(ld_u8x8(b + 64 + 16 * (2 * cc + q) + 8 * hh), dd);
            o = _mm256_mul_ps(ld_u8x8(b + 192 + 16 * (2 * cc + q) + 8 * hh), dmin);
            f = -1.0f;
            break;
        }
        default: { /* q6_K */
            const int cc = (int)(c & 3);
            __m256 dd = _mm256_loadu_ps((const float *)b + 8 * hh);
            s = _mm256_mul_ps(ld_i8x8(b + 64 + 16 * (4 * cc + q) + 8 * hh), dd);
            o = s;
            f = -32.0f;
            break;
        }
        }
        const int sq = per32(dt) ? 2 * q : q;
        float gsum = per32(dt) ? gs[2 * q] + gs[2 * q + 1] : gs[q];
        __m256 sc = _mm256_mul_ps(s, _mm256_set1_ps(dl[8 * (sq >> 1)]));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[q]), sc, acc);
        acc = _mm256_fmadd_ps(o, _mm256_set1_ps(f * gsum), acc);
    }
    return acc;
}

INLINE void gemv_group(uint32_t dt, const kiln_cpu_mm *p, int64_t g, uint8_t *buf) {
    const int64_t k = p->k, kc = kiln_q8act_chunks(k);
    const bool odd = (k % 64) != 0;
    const size_t gb = kiln_r16_gbytes(dt, k);
    const uint8_t *gp = p->w + (size_t)g * gb;
    const int8_t *aq = kiln_q8act_qs(p->act, k), *aq2 = kiln_q8act_qs2(p->act, k);
    const float *dl = kiln_q8act_dl(p->act, k), *gs = kiln_q8act_gs(p->act, k);
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    /* a compile-time count of prefetches per unit (as matmul_r16_avx512.c) */
    const bool k256 = kiln_r16_is256(dt);
    const size_t ub = k256 ? kiln_r16_sb(dt) / 4 : kiln_r16_unit_off(dt, 1),
                 span = k256 ? ub + 63 : ub;
    const int64_t full = odd ? kc - 1 : kc; /* whole units */
    for (int64_t c = 0; c < full; c++) {
        const char *pa =
            (const char *)gp + kiln_r16_unit_off(dt, c) + (k256 ? (size_t)(c & 3) * ub : 0) + PF;
        for (size_t o = 0; o < span; o += 64) _mm_prefetch(pa + o, _MM_HINT_T0);
        if (dt == KILN_DTYPE_Q4_0 || dt == KILN_DTYPE_Q4_1 || dt == KILN_DTYPE_Q5_0 ||
            dt == KILN_DTYPE_Q5_1 || dt == KILN_DTYPE_Q8_0) {
            __m256i d2[2][2];
            unit_dots_both(dt, gp, c, aq + 64 * c, aq2 + 64 * c, d2);
            lo = unit_fsteps(dt, gp, c, 0, d2[0], dl + 16 * c, gs + 4 * c, lo);
            hi = unit_fsteps(dt, gp, c, 1, d2[1], dl + 16 * c, gs + 4 * c, hi);
            continue;
        }
        __m256i d[2][4]; /* the K-quants */
        unit_dots_k(dt, gp, c, aq + 64 * c, aq2 + 64 * c, d);
        lo = unit_fsteps(dt, gp, c, 0, d[0], dl + 16 * c, gs + 4 * c, lo);
        hi = unit_fsteps(dt, gp, c, 1, d[1], dl + 16 * c, gs + 4 * c, hi);
    }
    if (odd) { /* the last half unit (32-block types, k % 64 == 32): unpacked as before */
        const int64_t c = kc - 1;
        unpack(dt, gp, c, false, buf);
        lo = unit_dot(dt, buf, 0, aq + 64 * c, aq2 + 64 * c, dl + 16 * c, gs + 4 * c, lo);
        hi = unit_dot(dt, buf, 1, aq + 64 * c, aq2 + 64 * c, dl + 16 * c, gs + 4 * c, hi);
    }
    store_rows(p->y + 16 * g, p->n - 16 * g, lo, hi, p->bias ? p->bias + 16 * g : NULL);
}

/* Prefill: the group's units unpacked once into the panel, then for each token the same
 * unit_dot as decode (the panel stays in L1/L2 while the tokens stream over it). */
INLINE void gemm_group(uint32_t dt, const kiln_cpu_mm *p, int64_t g, uint8_t *panel) {
    const int64_t k = p->k, kc = kiln_q8act_chunks(k);
    const bool odd = (k % 64) != 0;
    const uint8_t *gp = p->w + (size_t)g * kiln_r16_gbytes(dt, k);
    for (int64_t c = 0; c < kc; c++)
        unpack(dt, gp, c, !(odd && c == kc - 1), panel + (size_t)c * UNIT_BYTES);
    const int64_t rows = p->n - 16 * g;
    const float *bias = p->bias ? p->bias + 16 * g : NULL;
    for (int64_t t = 0; t < p->t; t++) {
        const uint8_t *a = p->act + t * p->act_stride;
        const int8_t *aq = kiln_q8act_qs(a, k), *aq2 = kiln_q8act_qs2(a, k);
        const float *dl = kiln_q8act_dl(a, k), *gs = kiln_q8act_gs(a, k);
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
        for (int64_t c = 0; c < kc; c++) {
            const uint8_t *U = panel + (size_t)c * UNIT_BYTES;
            lo = unit_dot(dt, U, 0, aq + 64 * c, aq2 + 64 * c, dl + 16 * c, gs + 4 * c, lo);
            hi = unit_dot(dt, U, 1, aq + 64 * c, aq2 + 64 * c, dl + 16 * c, gs + 4 * c, hi);
        }
        store_rows(p->y + t * p->y_stride + 16 * g, rows, lo, hi, bias);
    }
}

/* ---- prefill: int16 register-blocked GEMM ----
 * A group's units are unpacked (unpack() above) and widened to int16 ("w16" units: for
 * each pair of elements p and half hh, 8 rows x 2 weights at 32 (2p + hh), then the
 * unit's s and o floats as in the u8 panel), and the activations are the q8 row's a16 =
 * 256 q1 + q2 (qblocks.h). One vpmaddwd then does 16 multiply-adds of both levels at
 * once: u * (256 q1 + q2) summed in int32 is exactly 256 dot(u, q1) + dot(u, q2), the
 * integer unit_dot() and unit_dots_*() compute (|u| <= 255, 32 elements: < 2^28), and the
 * float steps are unit_dot()'s in its order, so rows stay bitwise equal to decode.
 * Why int16 and not vpmaddubsw: a maddubs does 32 products of one level and needs its
 * own 16-bit add (plus the flushes, and q8_0's sign trick at L = 1), a maddwd 16 of both
 * levels: the same multiplies per useful product for the 4-bit types, half for q8_0, and
 * no overflow groups. Two micro-kernels: pairs of full row groups run the 32 x 2 tile
 * below (tile2: 32 rows x 2 tokens, its integer sums in inline asm, float sums in y), an
 * odd full group this 16 x T tile: per pair of elements 2 weight loads and T activation
 * broadcasts feed 2T maddwd into 2T int32 accumulators, with 2T float accumulators (T = 3:
 * 15 ymm registers).
 * Loop order (per work item): k in blocks of KB units, then the item's groups, then
 * token tiles; the float accumulators live in y between k blocks (loaded and stored in
 * the same order, so the sums are unchanged), the block's w16 panel stays in L1 and the
 * block's activations of every token in L2 across the item's groups. */

#define W16_BYTES (2048 + 512) /* int16 weights of a unit, then s[4][16], o[4][16] */
#define KB        8            /* units per k block */
#define TT        3            /* tokens per tile */

/* The u8 unit U (unpack()) widened into the w16 unit W. */
INLINE void widen16(uint32_t dt, const uint8_t *U, uint8_t *W) {
    const __m256i shuf = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0,
                                          1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++)
        for (int hh = 0; hh < 2; hh++) {
            /* 8 rows x 4 elements -> [rows 0-3 pair 0 | rows 4-7 pair 0 | ... pair 1] */
            __m256i v = _mm256_load_si256((const __m256i *)(U + 64 * j + 32 * hh));
            v = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, shuf), 0xD8);
            __m128i a = _mm256_castsi256_si128(v), b = _mm256_extracti128_si256(v, 1);
            __m256i wa = dt == KILN_DTYPE_Q8_0 ? _mm256_cvtepi8_epi16(a) : _mm256_cvtepu8_epi16(a);
            __m256i wb = dt == KILN_DTYPE_Q8_0 ? _mm256_cvtepi8_epi16(b) : _mm256_cvtepu8_epi16(b);
            _mm256_store_si256((__m256i *)(W + 32 * (2 * (2 * j) + hh)), wa);
            _mm256_store_si256((__m256i *)(W + 32 * (2 * (2 * j + 1) + hh)), wb);
        }
    memcpy(W + 2048, U + 1024, 512);
}

typedef struct tok_act {
    const int16_t *a16;
    const float *dl, *gs;
} tok_act;

INLINE __m256i bcast16x2(const int16_t *a) {
    int32_t v;
    memcpy(&v, a, 4);
    return _mm256_set1_epi32(v);
}

/* acc[hh][t] (rows 8hh..8hh+7, token t) += w16 unit W x unit c of T tokens' activations. */
INLINE void tile_unit(uint32_t dt, int T, const uint8_t *W, const tok_act *A, int64_t c,
                      __m256 acc[2][TT]) {
    const int G = per32(dt) ? 2 : 4, PP = 32 / G;
#pragma GCC unroll 4
    for (int q = 0; q < G; q++) {
        __m256i d[2][TT];
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) d[0][t] = d[1][t] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int pp = 0; pp < PP; pp++) {
            const int pr = q * PP + pp;
            __m256i w0 = _mm256_load_si256((const __m256i *)(W + 32 * (2 * pr)));
            __m256i w1 = _mm256_load_si256((const __m256i *)(W + 32 * (2 * pr + 1)));
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) {
                __m256i a = bcast16x2(A[t].a16 + 64 * c + 2 * pr);
                d[0][t] = _mm256_add_epi32(d[0][t], _mm256_madd_epi16(w0, a));
                d[1][t] = _mm256_add_epi32(d[1][t], _mm256_madd_epi16(w1, a));
            }
        }
        const int sq = per32(dt) ? 2 * q : q;
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) {
            const float *dl = A[t].dl + 16 * c, *gs = A[t].gs + 4 * c;
            const float gsum = per32(dt) ? gs[2 * q] + gs[2 * q + 1] : gs[q];
            const __m256 dlv = _mm256_set1_ps(dl[8 * (sq >> 1)]), gv = _mm256_set1_ps(gsum);
#pragma GCC unroll 2
            for (int hh = 0; hh < 2; hh++) {
                const float *s = (const float *)(W + 2048 + 64 * sq) + 8 * hh;
                const float *o = (const float *)(W + 2304 + 64 * sq) + 8 * hh;
                __m256 sc = _mm256_mul_ps(_mm256_load_ps(s), dlv);
                acc[hh][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[hh][t]), sc, acc[hh][t]);
                acc[hh][t] = _mm256_fmadd_ps(_mm256_load_ps(o), gv, acc[hh][t]);
            }
        }
    }
}

/* Tokens [t0, t0 + T) of a full group (16 rows at y0) over the w16 units of k block
 * [c0, c1); first: the block starts the sums (else they continue from y); last: add
 * the bias and leave the result. */
INLINE void tile(uint32_t dt, int T, const kiln_cpu_mm *p, const uint8_t *Wp, int64_t c0,
                 int64_t c1, int64_t t0, float *y0, const float *bias, bool first, bool last) {
    const int64_t k = p->k;
    tok_act A[TT];
    __m256 acc[2][TT];
#pragma GCC unroll 3
    for (int t = 0; t < T; t++) {
        const uint8_t *a = p->act + (t0 + t) * p->act_stride;
        A[t] = (tok_act){kiln_q8act_a16(a, k), kiln_q8act_dl(a, k), kiln_q8act_gs(a, k)};
        float *y = y0 + (t0 + t) * p->y_stride;
        acc[0][t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y);
        acc[1][t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + 8);
    }
    for (int64_t c = c0; c < c1; c++)
        tile_unit(dt, T, Wp + (size_t)(c - c0) * W16_BYTES, A, c, acc);
#pragma GCC unroll 3
    for (int t = 0; t < T; t++) {
        float *y = y0 + (t0 + t) * p->y_stride;
        if (last && bias) {
            acc[0][t] = _mm256_add_ps(acc[0][t], _mm256_loadu_ps(bias));
            acc[1][t] = _mm256_add_ps(acc[1][t], _mm256_loadu_ps(bias + 8));
        }
        _mm256_storeu_ps(y, acc[0][t]);
        _mm256_storeu_ps(y + 8, acc[1][t]);
    }
}

/* ---- 32 rows x 2 tokens ----
 * Two groups (32 rows, four ymm halves) x 2 tokens: per pair of elements 4 weight loads
 * and 2 activation broadcasts feed 8 maddwd into 8 int32 accumulators. A broadcast serves
 * 4 maddwd (2 in the 16 x 3 tile above): on Zen 3 a broadcast is a vector op (FP pipes
 * 1 / 2) like the vpaddd each maddwd needs, so the vector ops per maddwd drop from ~2.75
 * to ~2.5 (the maddwd are half of the 4 pipes' slots either way). The 8 float sums do not
 * fit beside them: they live in y (loaded, updated and stored per scale group: L1
 * traffic, no vector op), with the same float steps in the same order as unit_dot(), so
 * every output is bitwise the 16 x 3 tile's and decode's. */

#define KB2 4 /* units per group and k block: 2 x 4 w16 units (20 KB) stay in L1 */

/* The int32 sums of one scale group of a 32 x 2 tile, NP pairs of elements: d[t][i] for
 * token t and ymm half i (rows 8i..8i+7 of the 32: group A's halves, then B's), from the
 * w16 pairs at wa / wb (64 bytes per pair) and the tokens' a16 pairs at a0 / a1. Inline
 * asm, fully unrolled: GCC's allocation of these 14 live registers copied accumulators
 * with vmovdqa in every iteration, spilled weights to memory operands (twice the loads)
 * and kept the pair loop's branches. Integer adds in the order of the C tile: exact. */
#define PAIRS32X2(NP)                                                                              \
    __asm__(".set .Lkw, 0\n\t"                                                                     \
            ".set .Lka, 0\n\t"                                                                     \
            "vpxor %[d00], %[d00], %[d00]\n\t"                                                     \
            "vpxor %[d01], %[d01], %[d01]\n\t"                                                     \
            "vpxor %[d02], %[d02], %[d02]\n\t"                                                     \
            "vpxor %[d03], %[d03], %[d03]\n\t"                                                     \
            "vpxor %[d10], %[d10], %[d10]\n\t"                                                     \
            "vpxor %[d11], %[d11], %[d11]\n\t"                                                     \
            "vpxor %[d12], %[d12], %[d12]\n\t"                                                     \
            "vpxor %[d13], %[d13], %[d13]\n\t"                                                     \
            ".rept " #NP "\n\t"                                                                    \
            "vmovdqa .Lkw(%[wa]), %[w0]\n\t"                                                       \
            "vmovdqa .Lkw+32(%[wa]), %[w1]\n\t"                                                    \
            "vmovdqa .Lkw(%[wb]), %[w2]\n\t"                                                       \
            "vmovdqa .Lkw+32(%[wb]), %[w3]\n\t"                                                    \
            "vpbroadcastd .Lka(%[a0]), %[b]\n\t"                                                   \
            "vpmaddwd %[b], %[w0], %[m]\n\t"                                                       \
            "vpaddd %[m], %[d00], %[d00]\n\t"                                                      \
            "vpmaddwd %[b], %[w1], %[m]\n\t"                                                       \
            "vpaddd %[m], %[d01], %[d01]\n\t"                                                      \
            "vpmaddwd %[b], %[w2], %[m]\n\t"                                                       \
            "vpaddd %[m], %[d02], %[d02]\n\t"                                                      \
            "vpmaddwd %[b], %[w3], %[m]\n\t"                                                       \
            "vpaddd %[m], %[d03], %[d03]\n\t"                                                      \
            "vpbroadcastd .Lka(%[a1]), %[b]\n\t"                                                   \
            "vpmaddwd %[b], %[w0], %[m]\n\t"                                                       \
            "vpaddd %[m], %[d10], %[d10]\n\t"                                                      \
            "vpmaddwd %[b], %[w1], %[m]\n\t"                                                       \
            "vpaddd %[m], %[d11], %[d11]\n\t"                                                      \
            "vpmaddwd %[b], %[w2], %[m]\n\t"                                                       \
            "vpaddd %[m], %[d12], %[d12]\n\t"                                                      \
            "vpmaddwd %[b], %[w3], %[m]\n\t"                                                       \
            "vpaddd %[m], %[d13], %[d13]\n\t"                                                      \
            ".set .Lkw, .Lkw + 64\n\t"                                                             \
            ".set .Lka, .Lka + 4\n\t"                                                              \
            ".endr"                                                                                \
            : [d00] "=&x"(d[0][0]), [d01] "=&x"(d[0][1]), [d02] "=&x"(d[0][2]),                    \
              [d03] "=&x"(d[0][3]), [d10] "=&x"(d[1][0]), [d11] "=&x"(d[1][1]),                    \
              [d12] "=&x"(d[1][2]), [d13] "=&x"(d[1][3]), [w0] "=&x"(w0), [w1] "=&x"(w1),          \
              [w2] "=&x"(w2), [w3] "=&x"(w3), [b] "=&x"(bb), [m] "=&x"(mm)                         \
            : [wa] "r"(wa), [wb] "r"(wb), [a0] "r"(a0), [a1] "r"(a1),                              \
              "m"(*(const char(*)[64 * NP]) wa), "m"(*(const char(*)[64 * NP]) wb),                \
              "m"(*(const char(*)[4 * NP]) a0), "m"(*(const char(*)[4 * NP]) a1))

INLINE void pairs32x2_16(const uint8_t *wa, const uint8_t *wb, const int16_t *a0, const int16_t *a1,
                         __m256i d[2][4]) {
    __m256i w0, w1, w2, w3, bb, mm;
    PAIRS32X2(16);
}
INLINE void pairs32x2_8(const uint8_t *wa, const uint8_t *wb, const int16_t *a0, const int16_t *a1,
                        __m256i d[2][4]) {
    __m256i w0, w1, w2, w3, bb, mm;
    PAIRS32X2(8);
}

/* y at the tokens' rows of group A (+ 16: group B) += w16 units WA, WB x unit c. */
INLINE void tile2_unit(uint32_t dt, int T, const uint8_t *WA, const uint8_t *WB, const tok_act *A,
                       int64_t c, float *const *yt) {
    const int G = per32(dt) ? 2 : 4, PP = 32 / G;
#pragma GCC unroll 4
    for (int q = 0; q < G; q++) {
        __m256i d[2][4];
        const int pr0 = q * PP;
        if (T == 2) {
            const int16_t *a0 = A[0].a16 + 64 * c + 2 * pr0, *a1 = A[1].a16 + 64 * c + 2 * pr0;
            if (PP == 16)
                pairs32x2_16(WA + 64 * pr0, WB + 64 * pr0, a0, a1, d);
            else
                pairs32x2_8(WA + 64 * pr0, WB + 64 * pr0, a0, a1, d);
        } else {
            for (int i = 0; i < 4; i++) d[0][i] = _mm256_setzero_si256();
            for (int pp = 0; pp < PP; pp++) {
                const int pr = pr0 + pp;
                const __m256i a = bcast16x2(A[0].a16 + 64 * c + 2 * pr);
                for (int i = 0; i < 4; i++) {
                    const uint8_t *W = (i < 2 ? WA : WB) + 32 * (2 * pr + (i & 1));
                    d[0][i] = _mm256_add_epi32(
                        d[0][i], _mm256_madd_epi16(_mm256_load_si256((const __m256i *)W), a));
                }
            }
        }
        const int sq = per32(dt) ? 2 * q : q;
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) {
            const float *dl = A[t].dl + 16 * c, *gs = A[t].gs + 4 * c;
            const float gsum = per32(dt) ? gs[2 * q] + gs[2 * q + 1] : gs[q];
            const __m256 dlv = _mm256_set1_ps(dl[8 * (sq >> 1)]), gv = _mm256_set1_ps(gsum);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const uint8_t *W = i < 2 ? WA : WB;
                const int hh = i & 1;
                const float *s = (const float *)(W + 2048 + 64 * sq) + 8 * hh;
                const float *o = (const float *)(W + 2304 + 64 * sq) + 8 * hh;
                float *y = yt[t] + 16 * (i >> 1) + 8 * hh;
                __m256 sc = _mm256_mul_ps(_mm256_load_ps(s), dlv);
                __m256 acc = _mm256_loadu_ps(y);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[t][i]), sc, acc);
                acc = _mm256_fmadd_ps(_mm256_load_ps(o), gv, acc);
                _mm256_storeu_ps(y, acc);
            }
        }
    }
}

/* Prefetch what token t reads and writes in a tile over k block [c0, c1) of the groups at
 * y0: its activations of the block (a16, dl, gs) and its 32 sums in y. */
INLINE void prefetch_tok(const kiln_cpu_mm *p, int64_t t, int64_t c0, int64_t c1, const float *y0) {
    const uint8_t *a = p->act + t * p->act_stride;
    const char *a16 = (const char *)kiln_q8act_a16(a, p->k);
    const char *dl = (const char *)kiln_q8act_dl(a, p->k);
    for (int64_t c = c0; c < c1; c++) {
        _mm_prefetch(a16 + 128 * c, _MM_HINT_T0);
        _mm_prefetch(a16 + 128 * c + 64, _MM_HINT_T0);
        _mm_prefetch(dl + 64 * c, _MM_HINT_T0);
    }
    _mm_prefetch((const char *)(kiln_q8act_gs(a, p->k) + 4 * c0), _MM_HINT_T0);
    const float *y = y0 + t * p->y_stride;
    _mm_prefetch((const char *)y, _MM_HINT_T0);
    _mm_prefetch((const char *)(y + 16), _MM_HINT_T0);
    _mm_prefetch((const char *)(y + 31), _MM_HINT_T0);
}

/* Tokens [t0, t0 + T) of the full groups g, g + 1 (32 rows at y0) over the w16 units of
 * k block [c0, c1) (group g's at WA, g + 1's at WB); first: the sums start at 0; last:
 * add the bias. */
INLINE void tile2(uint32_t dt, int T, const kiln_cpu_mm *p, const uint8_t *WA, const uint8_t *WB,
                  int64_t c0, int64_t c1, int64_t t0, float *y0, const float *bias, bool first,
                  bool last) {
    const int64_t k = p->k;
    tok_act A[2];
    float *yt[2];
#pragma GCC unroll 2
    for (int t = 0; t < T; t++) {
        const uint8_t *a = p->act + (t0 + t) * p->act_stride;
        A[t] = (tok_act){kiln_q8act_a16(a, k), kiln_q8act_dl(a, k), kiln_q8act_gs(a, k)};
        yt[t] = y0 + (t0 + t) * p->y_stride;
        if (first)
            for (int i = 0; i < 4; i++) _mm256_storeu_ps(yt[t] + 8 * i, _mm256_setzero_ps());
    }
    for (int64_t t = t0 + 2; t < t0 + 4 && t < p->t; t++) prefetch_tok(p, t, c0, c1, y0);
    for (int64_t c = c0; c < c1; c++)
        tile2_unit(dt, T, WA + (size_t)(c - c0) * W16_BYTES, WB + (size_t)(c - c0) * W16_BYTES, A,
                   c, yt);
    if (last && bias)
#pragma GCC unroll 2
        for (int t = 0; t < T; t++)
            for (int i = 0; i < 4; i++)
                _mm256_storeu_ps(yt[t] + 8 * i, _mm256_add_ps(_mm256_loadu_ps(yt[t] + 8 * i),
                                                              _mm256_loadu_ps(bias + 8 * i)));
}

/* Units [c0, c1) of group g, unpacked and widened into the w16 panel Wp. */
INLINE void widen_block(uint32_t dt, const kiln_cpu_mm *p, int64_t g, int64_t c0, int64_t c1,
                        uint8_t *Wp, uint8_t *U) {
    const int64_t kc = kiln_q8act_chunks(p->k);
    const bool odd = (p->k % 64) != 0;
    const uint8_t *gp = p->w + (size_t)g * kiln_r16_gbytes(dt, p->k);
    for (int64_t c = c0; c < c1; c++) {
        unpack(dt, gp, c, !(odd && c == kc - 1), U);
        widen16(dt, U, Wp + (size_t)(c - c0) * W16_BYTES);
    }
}

/* Prefill of rows [r0, r1): pairs of full groups by the 32 x 2 tiles, an odd full group by
 * the 16 x 3 tiles, a partial last group (n % 16 rows) by gemm_group(). */
INLINE void gemm_rows(uint32_t dt, const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel) {
    const int64_t kc = kiln_q8act_chunks(p->k);
    const int64_t g0 = r0 / 16, g1 = (r1 + 15) / 16, gf = g1 < p->n / 16 ? g1 : p->n / 16;
    const int64_t gpair = gf > g0 ? g0 + ((gf - g0) & ~(int64_t)1) : g0;
    uint8_t *Wp = panel, *U = panel + KB * W16_BYTES;
    for (int64_t c0 = 0; c0 < kc && gpair > g0; c0 += KB2) {
        const int64_t c1 = c0 + KB2 < kc ? c0 + KB2 : kc;
        const bool first = c0 == 0, last = c1 == kc;
        uint8_t *WB = Wp + KB2 * W16_BYTES;
        for (int64_t g = g0; g < gpair; g += 2) {
            widen_block(dt, p, g, c0, c1, Wp, U);
            widen_block(dt, p, g + 1, c0, c1, WB, U);
            float *y0 = p->y + 16 * g;
            const float *bias = p->bias ? p->bias + 16 * g : NULL;
            int64_t t0 = 0;
            for (; t0 + 2 <= p->t; t0 += 2)
                tile2(dt, 2, p, Wp, WB, c0, c1, t0, y0, bias, first, last);
            if (t0 < p->t) tile2(dt, 1, p, Wp, WB, c0, c1, t0, y0, bias, first, last);
        }
    }
    for (int64_t c0 = 0; c0 < kc && gf > gpair; c0 += KB) {
        const int64_t c1 = c0 + KB < kc ? c0 + KB : kc;
        const bool first = c0 == 0, last = c1 == kc;
        for (int64_t g = gpair; g < gf; g++) {
            widen_block(dt, p, g, c0, c1, Wp, U);
            float *y0 = p->y + 16 * g;
            const float *bias = p->bias ? p->bias + 16 * g : NULL;
            int64_t t0 = 0;
            for (; t0 + TT <= p->t; t0 += TT)
                tile(dt, TT, p, Wp, c0, c1, t0, y0, bias, first, last);
            for (; t0 < p->t; t0++) tile(dt, 1, p, Wp, c0, c1, t0, y0, bias, first, last);
        }
    }
    for (int64_t g = gf; g < g1; g++) gemm_group(dt, p, g, panel);
}

/* Steps of up to r16_gemv_t() tokens (a decode step of a few sequences) run the decode
 * kernel once per token, group by group (a group's bytes stay in L1 for the next token):
 * the prefill path unpacks and widens every unit into the panel first, which so few tokens
 * do not amortize. bench_cpu_matmul -T N (tinyllama shapes, 2 threads, session 13), ms a
 * step, prefill path -> this: q4_0 T=2 56.8 -> 21.9, T=4 56.4 -> 36.0; q4_K T=4 75.3 -> 44.2;
 * q8_0 T=4 44.5 -> 30.5; q6_K T=4 61.0 -> 40.1. Both paths give a token's row the same bits
 * (the top of this file), so the switch keeps batch invariance. Per type (-T 5 / 6 / 8,
 * two rounds each): q4_0 and q4_K still gain at 5-6
 * tokens (q4_0 T=6 79-83 -> 53-58 ms, q4_K 69-75 -> 55-59), q5_K / q6_K at 5 (q6_K 58-65 ->
 * 41-53) but not at 6 (q5_K 52-64 -> 92-101), q8_0 not past 4 (mixed at 5); at 8 the panel
 * wins or ties for all. */
INLINE int r16_gemv_t(uint32_t dt) {
    switch (dt) {
    case KILN_DTYPE_Q4_0:
    case KILN_DTYPE_Q4_K:
        return 6;
    case KILN_DTYPE_Q8_0:
        return 4;
    default:
        return 5;
    }
}
INLINE void gemv_tokens(uint32_t dt, const kiln_cpu_mm *p, int64_t g0, int64_t g1, uint8_t *buf) {
    kiln_cpu_mm q[6]; /* one-token views, made once (t <= r16_gemv_t() <= 6) */
    for (int64_t t = 0; t < p->t; t++) {
        q[t] = *p;
        q[t].act = p->act + (size_t)t * p->act_stride;
        q[t].y = p->y + t * p->y_stride;
        q[t].t = 1;
    }
    for (int64_t g = g0; g < g1; g++)
        for (int64_t t = 0; t < p->t; t++) gemv_group(dt, &q[t], g, buf);
}

#define R16_CASE(DT)                                                                               \
    case DT:                                                                                       \
        if (p->t <= r16_gemv_t(DT))                                                                \
            gemv_tokens(DT, p, g0, g1, buf);                                                       \
        else                                                                                       \
            gemm_rows(DT, p, r0, r1, panel);                                                       \
        break

void kiln_cpu_mmr16_avx2(const kiln_cpu_mm *pp, int64_t r0, int64_t r1, uint8_t *panel) {
    const kiln_cpu_mm m = *pp, *p = &m; /* private copy: see matmul_q_avx512.c */
    const int64_t g0 = r0 / 16, g1 = (r1 + 15) / 16;
    _Alignas(64) uint8_t buf[UNIT_BYTES];
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
