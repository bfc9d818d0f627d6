/*
 * repack.c — the R16 weight layout (KILN_CPU_WLAYOUT_R16): rows interleaved in groups of
 * 16 so that one 64-byte register holds 4 consecutive elements of 16 rows, which is
 * what vpdpbusd with a broadcast activation wants. See cpu_kernels.h for the contract
 * and the byte layout of each type, cpu_impl.h for the geometry; the kernels are in
 * matmul_r16_{avx512,avx2}.c.
 *
 * It runs once per tensor when the loader's transform lane makes the layout, reading
 * each source byte once. Full 16-row groups take the fast path: the quants are 16 x W
 * matrices of 32-bit words transposed with SSE2 4 x 4 word transposes (tr16w), every
 * output byte written once (no clearing first). Partial groups (n % 16 rows), the half
 * unit at k % 64 take the scalar path, which is also the reference the fast
 * path is tested against (kiln_cpu_r16_repack_ref, test_cpu_matmul).
 */
#include "base/mem.h"
#include "format/dtype.h"
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/qblocks.h"

#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

bool kiln_cpu_r16_supports(uint32_t dtype) {
    switch (dtype) {
    case KILN_DTYPE_Q4_0:
    case KILN_DTYPE_Q4_1:
    case KILN_DTYPE_Q5_0:
    case KILN_DTYPE_Q5_1:
    case KILN_DTYPE_Q8_0:
    case KILN_DTYPE_Q4_K:
    case KILN_DTYPE_Q5_K:
    case KILN_DTYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

kiln_status kiln_cpu_r16_size(uint32_t dtype, int64_t n, int64_t k, size_t *out, kiln_err *err) {
    if (!kiln_cpu_r16_supports(dtype))
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "R16 layout: dtype %s not supported",
                            kiln_dtype_name(dtype));
    const kiln_dtype_info *in = kiln_dtype_get(dtype);
    if (n <= 0 || k <= 0 || k % in->block_size || k > ((int64_t)1 << 40))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "R16 layout: bad shape n=%lld k=%lld for %s (k must be a multiple "
                            "of %u)",
                            (long long)n, (long long)k, in->name, in->block_size);
    size_t s;
    if (!kiln_size_mul((size_t)((n + 15) / 16), kiln_r16_gbytes(dtype, k), &s))
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "R16 layout: size overflow");
    *out = s;
    return KILN_OK;
}

size_t kiln_cpu_r16_group_bytes(uint32_t dtype, int64_t k) {
    return kiln_r16_gbytes(dtype, k);
}

static inline void il4(uint8_t *vec, int r, const uint8_t *src) {
    memcpy(vec + 4 * r, src, 4);
}

/* q5 high bits: mask j (u64) bit 4r + e = bit (4j + e) of the 32-bit qh, for one row. */
static void put_qh32(uint8_t *masks, int r, uint32_t qh) {
    for (int j = 0; j < 8; j++) {
        uint64_t m;
        memcpy(&m, masks + 8 * j, 8);
        m |= (uint64_t)((qh >> (4 * j)) & 0xF) << (4 * r);
        memcpy(masks + 8 * j, &m, 8);
    }
}

/* Unit c of a 32-block type: blocks 2c and (when nblk == 2) 2c + 1 of 16 rows. */
static void pack_unit32(uint32_t dt, const uint8_t *const blk0[16], size_t bb, int nblk,
                        uint8_t *o) {
    const size_t hdr = kiln_r16_hdr(dt), bl = kiln_r16_blk(dt);
    memset(o, 0, hdr + (size_t)nblk * bl);
    for (int h = 0; h < nblk; h++) {
        uint8_t *q = o + hdr + (size_t)h * bl;
        for (int r = 0; r < 16; r++) {
            const uint8_t *x = blk0[r] ? blk0[r] + (size_t)h * bb : NULL;
            if (!x) continue; /* padding rows stay zero */
            memcpy(o + 32 * h + 2 * r, x, 2);
            uint32_t qh;
            switch (dt) {
            case KILN_DTYPE_Q4_0:
                for (int i = 0; i < 4; i++) il4(q + 64 * i, r, x + 2 + 4 * i);
                break;
            case KILN_DTYPE_Q4_1:
                memcpy(o + 64 + 32 * h + 2 * r, x + 2, 2);
                for (int i = 0; i < 4; i++) il4(q + 64 * i, r, x + 4 + 4 * i);
                break;
            case KILN_DTYPE_Q5_0:
                memcpy(&qh, x + 2, 4);
                put_qh32(q, r, qh);
                for (int i = 0; i < 4; i++) il4(q + 64 + 64 * i, r, x + 6 + 4 * i);
                break;
            case KILN_DTYPE_Q5_1:
                memcpy(o + 64 + 32 * h + 2 * r, x + 2, 2);
                memcpy(&qh, x + 4, 4);
                put_qh32(q, r, qh);
                for (int i = 0; i < 4; i++) il4(q + 64 + 64 * i, r, x + 8 + 4 * i);
                break;
            default: /* q8_0 */
                for (int j = 0; j < 8; j++) il4(q + 64 * j, r, x + 2 + 4 * j);
                break;
            }
        }
    }
}

/* The 256 6-bit values of a q6_K block, ggml element order. */
static void q6k_values(const uint8_t *x, uint8_t q[256]) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = x + 64 * h, *qh = x + 128 + 32 * h;
        for (int l = 0; l < 32; l++) {
            q[128 * h + l] = (uint8_t)((ql[l] & 0xF) | ((qh[l] & 3) << 4));
            q[128 * h + l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            q[128 * h + l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            q[128 * h + l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
}

/* One super-block of a 256-block type (16 rows; NULL rows are padding). */
static void pack_sb(uint32_t dt, const uint8_t *const blk[16], uint8_t *o) {
    memset(o, 0, kiln_r16_sb(dt));
    for (int r = 0; r < 16; r++) {
        const uint8_t *x = blk[r];
        if (!x) continue;
        if (dt == KILN_DTYPE_Q6_K) {
            float d = kiln_fp16_to_f32((uint16_t)(x[208] | x[209] << 8));
            memcpy(o + 4 * r, &d, 4);
            for (int s = 0; s < 16; s++) o[64 + 16 * s + r] = x[192 + s];
            uint8_t q[256];
            q6k_values(x, q);
            for (int c = 0; c < 4; c++) {
                for (int i = 0; i < 8; i++)
                    for (int e = 0; e < 4; e++) {
                        int e1 = 64 * c + 4 * i + e, e2 = e1 + 32;
                        o[320 + 64 * (8 * c + i) + 4 * r + e] =
                            (uint8_t)((q[e1] & 0xF) | ((q[e2] & 0xF) << 4));
                    }
                for (int i = 0; i < 4; i++)
                    for (int e = 0; e < 4; e++) {
                        uint8_t v = 0;
                        for (int qq = 0; qq < 4; qq++)
                            v |= (uint8_t)((q[64 * c + 16 * qq + 4 * i + e] >> 4) << (2 * qq));
                        o[2368 + 64 * (4 * c + i) + 4 * r + e] = v;
                    }
            }
            continue;
        }
        /* q4_K / q5_K */
        const bool five = dt == KILN_DTYPE_Q5_K;
        const uint8_t *qs = x + (five ? 48 : 16);
        const size_t qo = five ? 832 : 320;
        memcpy(o + 2 * r, x, 2);
        memcpy(o + 32 + 2 * r, x + 2, 2);
        for (int j = 0; j < 8; j++)
            kq_scale_min_k4(j, x + 4, o + 64 + 16 * j + r, o + 192 + 16 * j + r);
        for (int c = 0; c < 4; c++) {
            for (int i = 0; i < 8; i++) il4(o + qo + 64 * (8 * c + i), r, qs + 32 * c + 4 * i);
            if (!five) continue;
            for (int hb = 0; hb < 2; hb++) /* sub-block 2c + hb: bit 2c + hb of qh[l] */
                for (int i = 0; i < 8; i++) {
                    uint8_t *mp = o + 320 + 128 * c + 64 * hb + 8 * i;
                    uint64_t m;
                    memcpy(&m, mp, 8);
                    for (int e = 0; e < 4; e++)
                        m |= (uint64_t)((x[16 + 4 * i + e] >> (2 * c + hb)) & 1) << (4 * r + e);
                    memcpy(mp, &m, 8);
                }
        }
    }
}

/* out word 16 w + r = word w of src[r], for w < nw (a multiple of 4): 16 rows of nw
 * 32-bit words transposed, 4 x 4 at a time. Sources may be unaligned. */
#if defined(__SSE2__)
static inline void st16(uint8_t *p, __m128i v, bool nt) {
    if (nt)
        _mm_stream_si128((__m128i *)p, v); /* aligned: checked by tr16w */
    else
        _mm_storeu_si128((__m128i *)p, v);
}
#endif

static void tr16w(const uint8_t *const src[16], int nw, uint8_t *out, bool nt) {
#if defined(__SSE2__)
    nt = nt && ((uintptr_t)out & 15) == 0; /* streaming stores: no read of the destination */
    for (int w = 0; w < nw; w += 4) {
        uint8_t *o = out + (size_t)64 * w;
        for (int rb = 0; rb < 16; rb += 4) {
            __m128i a = _mm_loadu_si128((const __m128i *)(src[rb] + 4 * w));
            __m128i b = _mm_loadu_si128((const __m128i *)(src[rb + 1] + 4 * w));
            __m128i c = _mm_loadu_si128((const __m128i *)(src[rb + 2] + 4 * w));
            __m128i d = _mm_loadu_si128((const __m128i *)(src[rb + 3] + 4 * w));
            __m128i t0 = _mm_unpacklo_epi32(a, b), t1 = _mm_unpacklo_epi32(c, d);
            __m128i t2 = _mm_unpackhi_epi32(a, b), t3 = _mm_unpackhi_epi32(c, d);
            st16(o + 4 * rb, _mm_unpacklo_epi64(t0, t1), nt);
            st16(o + 64 + 4 * rb, _mm_unpackhi_epi64(t0, t1), nt);
            st16(o + 128 + 4 * rb, _mm_unpacklo_epi64(t2, t3), nt);
            st16(o + 192 + 4 * rb, _mm_unpackhi_epi64(t2, t3), nt);
        }
    }
#else
    (void)nt;
    for (int w = 0; w < nw; w++)
        for (int r = 0; r < 16; r++) memcpy(out + 64 * w + 4 * r, src[r] + 4 * w, 4);
#endif
}

/* Fast pack_unit32 for a whole unit (two blocks) of 16 real rows. */
static void pack_unit32_fast(uint32_t dt, const uint8_t *const blk0[16], size_t bb, uint8_t *o,
                             bool nt) {
    const size_t hdr = kiln_r16_hdr(dt), bl = kiln_r16_blk(dt);
    const bool has_m = dt == KILN_DTYPE_Q4_1 || dt == KILN_DTYPE_Q5_1;
    const bool five = dt == KILN_DTYPE_Q5_0 || dt == KILN_DTYPE_Q5_1;
    const size_t qoff = (has_m ? 4 : 2) + (five ? 4 : 0); /* quants within a block */
    const int nw = dt == KILN_DTYPE_Q8_0 ? 8 : 4;
    for (int h = 0; h < 2; h++) {
        uint8_t *q = o + hdr + (size_t)h * bl;
        const uint8_t *src[16];
        uint32_t qh[16];
        for (int r = 0; r < 16; r++) {
            const uint8_t *x = blk0[r] + (size_t)h * bb;
            memcpy(o + 32 * h + 2 * r, x, 2);
            if (has_m) memcpy(o + 64 + 32 * h + 2 * r, x + 2, 2);
            if (five) memcpy(&qh[r], x + (has_m ? 4 : 2), 4);
            src[r] = x + qoff;
        }
        for (int j = 0; five && j < 8; j++) { /* mask j: bit 4r + e = bit 4j + e of qh_r */
            uint64_t m = 0;
            for (int r = 0; r < 16; r++) m |= (uint64_t)((qh[r] >> (4 * j)) & 0xF) << (4 * r);
            memcpy(q + 8 * j, &m, 8);
        }
        tr16w(src, nw, q + (five ? 64 : 0), nt);
    }
}

#if !defined(__SSE2__)
/* Bit b of each of the 4 bytes of w, as a nibble (byte e -> bit e). */
static inline uint32_t bits4(uint32_t w, int b) {
    return ((((w >> b) & 0x01010101u) * 0x01020408u) >> 24) & 0xF;
}
#else
/* 16 x 16 bytes transposed in registers: v[b] byte r <- v[r] byte b (4 rounds of unpacks). */
static inline void tr16x16b(__m128i v[16]) {
    __m128i a[16], b[16], c[16];
    for (int i = 0; i < 8; i++) { /* a[8h + i]: rows 2i, 2i + 1, bytes 8h .. 8h + 7 */
        a[i] = _mm_unpacklo_epi8(v[2 * i], v[2 * i + 1]);
        a[8 + i] = _mm_unpackhi_epi8(v[2 * i], v[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) /* b[4q + j]: rows 4j .. 4j + 3, bytes 4q .. 4q + 3 */
        for (int j = 0; j < 4; j++) {
            b[8 * h + j] = _mm_unpacklo_epi16(a[8 * h + 2 * j], a[8 * h + 2 * j + 1]);
            b[8 * h + 4 + j] = _mm_unpackhi_epi16(a[8 * h + 2 * j], a[8 * h + 2 * j + 1]);
        }
    for (int q = 0; q < 4; q++) /* c[4q + 2j + s]: rows 8j .. 8j + 7, bytes 4q + 2s, + 1 */
        for (int j = 0; j < 2; j++) {
            c[4 * q + 2 * j] = _mm_unpacklo_epi32(b[4 * q + 2 * j], b[4 * q + 2 * j + 1]);
            c[4 * q + 2 * j + 1] = _mm_unpackhi_epi32(b[4 * q + 2 * j], b[4 * q + 2 * j + 1]);
        }
    for (int q = 0; q < 4; q++)
        for (int s = 0; s < 2; s++) {
            v[4 * q + 2 * s] = _mm_unpacklo_epi64(c[4 * q + s], c[4 * q + 2 + s]);
            v[4 * q + 2 * s + 1] = _mm_unpackhi_epi64(c[4 * q + s], c[4 * q + 2 + s]);
        }
}

/* The first 16 bytes of each row's block (d, dmin, the 12 packed 6-bit scales and mins)
 * -> the R16 header: d and dmin as 16 x 2 bytes, scales and mins as [8][16] bytes
 * (kq_scale_min_k4 on 16 rows at once). */
static void k4_header16(const uint8_t *const blk[16], uint8_t *o) {
    __m128i v[16];
    for (int r = 0; r < 16; r++) v[r] = _mm_loadu_si128((const __m128i *)blk[r]);
    tr16x16b(v);
    _mm_storeu_si128((__m128i *)o, _mm_unpacklo_epi8(v[0], v[1]));
    _mm_storeu_si128((__m128i *)(o + 16), _mm_unpackhi_epi8(v[0], v[1]));
    _mm_storeu_si128((__m128i *)(o + 32), _mm_unpacklo_epi8(v[2], v[3]));
    _mm_storeu_si128((__m128i *)(o + 48), _mm_unpackhi_epi8(v[2], v[3]));
    const __m128i *q = v + 4;
    const __m128i m63 = _mm_set1_epi8(63), m0f = _mm_set1_epi8(0x0F), m30 = _mm_set1_epi8(0x30);
    for (int j = 0; j < 4; j++) {
        _mm_storeu_si128((__m128i *)(o + 64 + 16 * j), _mm_and_si128(q[j], m63));
        _mm_storeu_si128((__m128i *)(o + 192 + 16 * j), _mm_and_si128(q[j + 4], m63));
    }
    for (int j = 4; j < 8; j++) { /* (x >> 6) << 4 of a byte = (x >> 2) & 0x30 */
        const __m128i sc = _mm_or_si128(_mm_and_si128(q[j + 4], m0f),
                                        _mm_and_si128(_mm_srli_epi16(q[j - 4], 2), m30));
        const __m128i mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(q[j + 4], 4), m0f),
                                        _mm_and_si128(_mm_srli_epi16(q[j], 2), m30));
        _mm_storeu_si128((__m128i *)(o + 64 + 16 * j), sc);
        _mm_storeu_si128((__m128i *)(o + 192 + 16 * j), mn);
    }
}
#endif

/* Fast pack_sb for q4_K / q5_K super-blocks of 16 real rows. */
static void pack_sb_fast(uint32_t dt, const uint8_t *const blk[16], uint8_t *o, bool nt) {
    const bool five = dt == KILN_DTYPE_Q5_K;
    const uint8_t *src[16];
#if defined(__SSE2__)
    k4_header16(blk, o);
    for (int r = 0; r < 16; r++) src[r] = blk[r] + (five ? 48 : 16);
    if (five) { /* mask (c, hb, i): bit 4r + e = bit 2c + hb of qh_r[4i + e] */
        _Alignas(16) uint8_t t[512];
        const uint8_t *qh[16];
        for (int r = 0; r < 16; r++) qh[r] = blk[r] + 16;
        tr16w(qh, 8, t, false); /* word 16i + r = qh_r[4i .. 4i + 3] */
        for (int i = 0; i < 8; i++) {
            __m128i w[4];
            for (int q = 0; q < 4; q++)
                w[q] = _mm_load_si128((const __m128i *)(t + 64 * i + 16 * q));
            for (int b = 0; b < 8; b++) { /* b = 2c + hb: bit b of each byte to its sign bit */
                uint64_t m = 0;
                for (int q = 0; q < 4; q++)
                    m |= (uint64_t)(uint16_t)_mm_movemask_epi8(
                             _mm_sll_epi16(w[q], _mm_cvtsi32_si128(7 - b)))
                         << (16 * q);
                memcpy(o + 320 + 128 * (b >> 1) + 64 * (b & 1) + 8 * i, &m, 8);
            }
        }
    }
#else
    for (int r = 0; r < 16; r++) {
        const uint8_t *x = blk[r];
        memcpy(o + 2 * r, x, 2);
        memcpy(o + 32 + 2 * r, x + 2, 2);
        for (int j = 0; j < 8; j++)
            kq_scale_min_k4(j, x + 4, o + 64 + 16 * j + r, o + 192 + 16 * j + r);
        src[r] = x + (five ? 48 : 16);
    }
    if (five) { /* mask (c, hb, i): bit 4r + e = bit 2c + hb of qh_r[4i + e] */
        for (int i = 0; i < 8; i++) {
            uint32_t w[16];
            for (int r = 0; r < 16; r++) memcpy(&w[r], blk[r] + 16 + 4 * i, 4);
            for (int b = 0; b < 8; b++) { /* b = 2c + hb */
                uint64_t m = 0;
                for (int r = 0; r < 16; r++) m |= (uint64_t)bits4(w[r], b) << (4 * r);
                memcpy(o + 320 + 128 * (b >> 1) + 64 * (b & 1) + 8 * i, &m, 8);
            }
        }
    }
#endif
    tr16w(src, 32, o + (five ? 832 : 320), nt);
}

/* Fast pack_sb for q6_K super-blocks of 16 real rows: each row's low-nibble pairs and
 * 2-bit highs are made as contiguous vectors (element order as in pack_sb), then
 * transposed by words. */
static void pack_sb_q6k_fast(const uint8_t *const blk[16], uint8_t *o, bool nt) {
    uint8_t lo[16][128], hi[16][64];
    const uint8_t *lp[16], *hp[16];
#if defined(__SSE2__)
    {
        __m128i v[16]; /* the 16 int8 sub-block scales of 16 rows -> [16][16] */
        for (int r = 0; r < 16; r++) v[r] = _mm_loadu_si128((const __m128i *)(blk[r] + 192));
        tr16x16b(v);
        for (int s = 0; s < 16; s++) _mm_storeu_si128((__m128i *)(o + 64 + 16 * s), v[s]);
    }
    const __m128i m0f = _mm_set1_epi8(0x0F), mf0 = _mm_set1_epi8((char)0xF0);
    const __m128i m3 = _mm_set1_epi8(3), mc = _mm_set1_epi8(0x0C);
#endif
    for (int r = 0; r < 16; r++) {
        const uint8_t *x = blk[r], *ql = x, *qh = x + 128;
        float d = kiln_fp16_to_f32((uint16_t)(x[208] | x[209] << 8));
        memcpy(o + 4 * r, &d, 4);
#if defined(__SSE2__)
        for (int h = 0; h < 2; h++) { /* units 2h (low nibbles) and 2h + 1 (high nibbles) */
            for (int f = 0; f < 2; f++) {
                const __m128i a = _mm_loadu_si128((const __m128i *)(ql + 64 * h + 16 * f));
                const __m128i b = _mm_loadu_si128((const __m128i *)(ql + 64 * h + 32 + 16 * f));
                const __m128i u0 =
                    _mm_or_si128(_mm_and_si128(a, m0f), _mm_and_si128(_mm_slli_epi16(b, 4), mf0));
                const __m128i u1 =
                    _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), m0f), _mm_and_si128(b, mf0));
                _mm_storeu_si128((__m128i *)(lo[r] + 64 * h + 16 * f), u0);
                _mm_storeu_si128((__m128i *)(lo[r] + 64 * h + 32 + 16 * f), u1);
            }
            const __m128i q0 = _mm_loadu_si128((const __m128i *)(qh + 32 * h));
            const __m128i q1 = _mm_loadu_si128((const __m128i *)(qh + 32 * h + 16));
            for (int sh = 0; sh < 2; sh++) { /* unit 2h + sh: bits 4sh and 4sh + 2 of qh */
                const __m128i p = sh ? _mm_srli_epi16(q0, 4) : q0;
                const __m128i t = sh ? _mm_srli_epi16(q1, 4) : q1;
                __m128i u =
                    _mm_or_si128(_mm_and_si128(p, m3), _mm_slli_epi16(_mm_and_si128(t, m3), 2));
                u = _mm_or_si128(u, _mm_slli_epi16(_mm_and_si128(p, mc), 2));
                u = _mm_or_si128(u, _mm_slli_epi16(_mm_and_si128(t, mc), 4));
                _mm_storeu_si128((__m128i *)(hi[r] + 16 * (2 * h + sh)), u);
            }
        }
#else
        for (int s = 0; s < 16; s++) o[64 + 16 * s + r] = x[192 + s];
        for (int h = 0; h < 2; h++) { /* units 2h (low nibbles) and 2h + 1 (high nibbles) */
            const uint8_t *a = ql + 64 * h, *b = ql + 64 * h + 32;
            uint8_t *u0 = lo[r] + 64 * h, *u1 = u0 + 32;
            for (int l = 0; l < 32; l++) {
                u0[l] = (uint8_t)((a[l] & 0xF) | (b[l] << 4));
                u1[l] = (uint8_t)((a[l] >> 4) | (b[l] & 0xF0));
            }
            const uint8_t *q = qh + 32 * h;
            for (int sh = 0; sh < 2; sh++) { /* unit 2h + sh: bits 4sh and 4sh + 2 of qh */
                uint8_t *u = hi[r] + 16 * (2 * h + sh);
                for (int j = 0; j < 16; j++) {
                    const unsigned p = q[j] >> (4 * sh), t = q[16 + j] >> (4 * sh);
                    u[j] = (uint8_t)((p & 3) | (t & 3) << 2 | ((p >> 2) & 3) << 4 |
                                     ((t >> 2) & 3) << 6);
                }
            }
        }
#endif
        lp[r] = lo[r];
        hp[r] = hi[r];
    }
    tr16w(lp, 32, o + 320, nt);
    tr16w(hp, 16, o + 2368, nt);
}

static kiln_status repack(uint32_t dtype, const void *src, size_t src_row_bytes, int64_t n,
                          int64_t k, void *dst, bool fast, kiln_err *err) {
    size_t total;
    KILN_TRY(kiln_cpu_r16_size(dtype, n, k, &total, err));
    /* KILN_R16_STORES=stream: streaming stores in the fast path (A/B; slower in the
     * transform lane on the H100 host, 25.0 vs 27.1 GB/s, session 7) */
    const char *so = getenv("KILN_R16_STORES");
    const bool nt = fast && so && strcmp(so, "stream") == 0;
    const kiln_dtype_info *in = kiln_dtype_get(dtype);
    const size_t bb = in->block_bytes, gb = kiln_r16_gbytes(dtype, k);
    for (int64_t g = 0; g < (n + 15) / 16; g++) {
        const uint8_t *rows[16];
        for (int r = 0; r < 16; r++)
            rows[r] =
                16 * g + r < n ? (const uint8_t *)src + (size_t)(16 * g + r) * src_row_bytes : NULL;
        uint8_t *o = (uint8_t *)dst + (size_t)g * gb;
        const uint8_t *blk[16];
        const bool full = fast && 16 * g + 16 <= n;
        if (kiln_r16_is256(dtype)) {
            for (int64_t s = 0; s < k / 256; s++) {
                for (int r = 0; r < 16; r++) blk[r] = rows[r] ? rows[r] + s * bb : NULL;
                uint8_t *os = o + (size_t)s * kiln_r16_sb(dtype);
#if defined(__SSE2__)
                if (full && s + 2 < k / 256) /* 16 row streams: ask for 2 blocks ahead */
                    for (int r = 0; r < 16; r++)
                        for (size_t l = 0; l < bb; l += 64)
                            _mm_prefetch((const char *)blk[r] + 2 * bb + l, _MM_HINT_T0);
#endif
                if (full && dtype == KILN_DTYPE_Q6_K)
                    pack_sb_q6k_fast(blk, os, nt);
                else if (full)
                    pack_sb_fast(dtype, blk, os, nt);
                else
                    pack_sb(dtype, blk, os);
            }
        } else {
            for (int64_t c = 0; c < (k + 63) / 64; c++) {
                for (int r = 0; r < 16; r++) blk[r] = rows[r] ? rows[r] + 2 * c * bb : NULL;
                const int nblk = 64 * c + 64 <= k ? 2 : 1;
                uint8_t *ou = o + kiln_r16_unit_off(dtype, c);
#if defined(__SSE2__)
                if (full && 64 * c + 1024 <= k)
                    for (int r = 0; r < 16; r++)
                        _mm_prefetch((const char *)blk[r] + 16 * bb, _MM_HINT_T0);
#endif
                if (full && nblk == 2)
                    pack_unit32_fast(dtype, blk, bb, ou, nt);
                else
                    pack_unit32(dtype, blk, bb, nblk, ou);
            }
        }
    }
#if defined(__SSE2__)
    if (nt) _mm_sfence(); /* streaming stores are weakly ordered: visible before we return */
#endif
    return KILN_OK;
}

kiln_status kiln_cpu_r16_repack(uint32_t dtype, const void *src, size_t src_row_bytes, int64_t n,
                                int64_t k, void *dst, kiln_err *err) {
    return repack(dtype, src, src_row_bytes, n, k, dst, true, err);
}

kiln_status kiln_cpu_r16_repack_ref(uint32_t dtype, const void *src, size_t src_row_bytes,
                                    int64_t n, int64_t k, void *dst, kiln_err *err) {
    return repack(dtype, src, src_row_bytes, n, k, dst, false, err);
}
