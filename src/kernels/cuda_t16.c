/*
 * cuda_t16.c — the host side of the CUDA T16 weight layout (cuda_t16.h): the repack the
 * loader runs on the way to the device (the upload lane's transform), and the layout's
 * loader registration. Plain C, built in every configuration (the layout's tests run
 * without a GPU).
 */
#include "kernels/cuda_t16.h"

#include "format/dtype.h"
#include "format/quants.h"
#include "load/layout.h"

#include <string.h>

bool kiln_cuda_t16_supports(uint32_t dtype) {
    return dtype == KILN_DTYPE_Q4_0 || dtype == KILN_DTYPE_Q8_0 || dtype == KILN_DTYPE_Q4_K ||
           dtype == KILN_DTYPE_Q6_K;
}

int64_t kiln_cuda_t16_k(uint32_t dtype) {
    return dtype == KILN_DTYPE_Q4_0 || dtype == KILN_DTYPE_Q8_0   ? KILN_CUDA_T16_K
           : dtype == KILN_DTYPE_Q4_K || dtype == KILN_DTYPE_Q6_K ? 256
                                                                  : 0;
}

size_t kiln_cuda_t16_chunk_bytes(uint32_t dtype) {
    switch (dtype) {
    case KILN_DTYPE_Q4_0:
        return 1152;
    case KILN_DTYPE_Q8_0:
        return 2176;
    case KILN_DTYPE_Q4_K:
        return 2304;
    case KILN_DTYPE_Q6_K:
        return 3360;
    default:
        return 0;
    }
}

/* bytes per block of the plain rows (32 columns; 256 for the K-quants) */
static size_t blk_bytes(uint32_t dtype) {
    switch (dtype) {
    case KILN_DTYPE_Q4_0:
        return 18;
    case KILN_DTYPE_Q8_0:
        return 34;
    case KILN_DTYPE_Q4_K:
        return 144;
    default:
        return 210;
    }
}

static size_t tile_base(uint32_t dtype, int64_t k, int64_t r) {
    return (size_t)(r / 16) * (size_t)(k / kiln_cuda_t16_k(dtype)) *
           kiln_cuda_t16_chunk_bytes(dtype);
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* One q4_K block (row ri = g + 8 h of the tile) into superchunk c (cuda_t16.h). */
static void repack_q4_K(const uint8_t *blk, int g, int h, uint8_t *c) {
    kiln_block_q4_K b;
    memcpy(&b, blk, sizeof b);
    for (int j = 0; j < 4; j++)
        for (int tig = 0; tig < 4; tig++)
            for (int s = 0; s < 2; s++)
                memcpy(c + 512 * j + 16 * (4 * g + tig) + 4 * (2 * h + s),
                       b.qs + 32 * j + 16 * s + 4 * tig, 4);
    uint32_t S = 0, M = 0, H = 0;
    for (int i = 0; i < 8; i++) {
        uint8_t sc, m;
        kiln_get_scale_min_k4(i, b.scales, &sc, &m);
        S |= (uint32_t)(sc & 15) << (4 * i);
        M |= (uint32_t)(m & 15) << (4 * i);
        H |= (uint32_t)(sc >> 4) << (2 * i) | (uint32_t)(m >> 4) << (16 + 2 * i);
    }
    uint8_t *o = c + 2048 + 16 * (2 * g + h);
    memcpy(o, blk, 4); /* d, dmin */
    put32(o + 4, S), put32(o + 8, M), put32(o + 12, H);
}

/* One q6_K block (row ri = g + 8 h of the tile) into superchunk c, which starts zeroed (the
 * high-bit words hold both rows g and g + 8: or-ed in). 32-block bb of the plain block is
 * half bb / 4, quarter bb % 4 of ggml's layout: element l (0..31) has its low nibble in
 * ql[64 half + 32 (quarter & 1) + l] (the high nibble of that byte for quarters 2, 3) and
 * its high 2 bits at bit 2 quarter of qh[32 half + l]; a lane's elements l = 4 tig + e and
 * 16 + 4 tig + e are 4 consecutive bytes each, so the words are built 4 elements at a time. */
static void repack_q6_K(const uint8_t *blk, int g, int h, uint8_t *c) {
    kiln_block_q6_K b;
    memcpy(&b, blk, sizeof b);
    const uint32_t m4 = 0x0F0F0F0Fu, m2 = 0x03030303u;
    for (int bb = 0; bb < 8; bb++) {
        const int half = bb / 4, quarter = bb % 4;
        const uint8_t *ql = b.ql + 64 * half + 32 * (quarter & 1), *qh = b.qh + 32 * half;
        const int ls = quarter >= 2 ? 4 : 0, hs = 2 * quarter;
        for (int tig = 0; tig < 4; tig++) {
            const int lane = 4 * g + tig;
            const uint32_t la = (get32(ql + 4 * tig) >> ls) & m4,
                           lb = (get32(ql + 16 + 4 * tig) >> ls) & m4;
            const uint32_t ha = (get32(qh + 4 * tig) >> hs) & m2,
                           hb = (get32(qh + 16 + 4 * tig) >> hs) & m2;
            put32(c + 512 * (bb / 2) + 16 * lane + 4 * (2 * (bb % 2) + h), la | lb << 4);
            uint8_t *hw = c + 2048 + 512 * (bb / 4) + 16 * lane + 4 * (bb % 4);
            put32(hw, get32(hw) | (h ? ha | hb << 2 : ha << 4 | hb << 6));
        }
    }
    memcpy(c + 3072 + 16 * (2 * g + h), b.scales, 16);
    memcpy(c + 3328 + 2 * (2 * g + h), &b.d, 2);
}

size_t kiln_cuda_t16_qs_offset(uint32_t dtype, int64_t k, int64_t r, int64_t b, int m) {
    const int ri = (int)(r % 16), g = ri % 8, h = ri / 8, bb = (int)(b % 4);
    const size_t base = tile_base(dtype, k, r) + (size_t)(b / 4) * kiln_cuda_t16_chunk_bytes(dtype);
    if (dtype == KILN_DTYPE_Q4_0) { /* m < 16 */
        const int tig = m / 4, lane = 4 * g + tig, word = 2 * (bb % 2) + h;
        return base + (size_t)(bb / 2) * 512 + (size_t)lane * 16 + (size_t)word * 4 +
               (size_t)(m % 4);
    }
    const int j = m / 16, mm = m % 16, tig = mm / 4, lane = 4 * g + tig, word = 2 * h + j;
    return base + (size_t)bb * 512 + (size_t)lane * 16 + (size_t)word * 4 + (size_t)(mm % 4);
}

size_t kiln_cuda_t16_d_offset(uint32_t dtype, int64_t k, int64_t r, int64_t b) {
    const int ri = (int)(r % 16), g = ri % 8, h = ri / 8, bb = (int)(b % 4);
    const size_t cb = kiln_cuda_t16_chunk_bytes(dtype);
    return tile_base(dtype, k, r) + (size_t)(b / 4) * cb + (cb - 128) + (size_t)g * 16 +
           (size_t)(2 * bb + h) * 2;
}

kiln_status kiln_cuda_t16_repack(uint32_t dtype, const void *src, size_t src_row_bytes,
                                 int64_t n_rows, int64_t k, void *dst, kiln_err *err) {
    if (!kiln_cuda_t16_supports(dtype))
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "cuda_t16 layout: dtype %u", dtype);
    const int64_t kk = kiln_cuda_t16_k(dtype);
    if (k <= 0 || k % kk || n_rows < 0)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "cuda_t16 layout: k = %lld is not a multiple of %lld", (long long)k,
                            (long long)kk);
    const size_t bb = blk_bytes(dtype), cb = kiln_cuda_t16_chunk_bytes(dtype);
    const int64_t nsc = k / kk, tiles = (n_rows + 15) / 16;
    const bool q4 = dtype == KILN_DTYPE_Q4_0;
    const bool kq = dtype == KILN_DTYPE_Q4_K || dtype == KILN_DTYPE_Q6_K;
    uint8_t *out = dst;
    for (int64_t t = 0; t < tiles; t++) {
        uint8_t *tb = out + (size_t)t * (size_t)nsc * cb;
        /* the padded rows; q6_K or-s its high bits into zeroed words */
        if ((t + 1) * 16 > n_rows || dtype == KILN_DTYPE_Q6_K) memset(tb, 0, (size_t)nsc * cb);
        const int64_t rows = n_rows - t * 16 < 16 ? n_rows - t * 16 : 16;
        for (int ri = 0; ri < rows; ri++) {
            const uint8_t *row = (const uint8_t *)src + (size_t)(t * 16 + ri) * src_row_bytes;
            const int g = ri % 8, h = ri / 8;
            if (kq) {
                for (int64_t sc = 0; sc < nsc; sc++) {
                    uint8_t *c = tb + (size_t)sc * cb;
                    if (dtype == KILN_DTYPE_Q4_K)
                        repack_q4_K(row + (size_t)sc * bb, g, h, c);
                    else
                        repack_q6_K(row + (size_t)sc * bb, g, h, c);
                }
                continue;
            }
            for (int64_t sc = 0; sc < nsc; sc++) {
                uint8_t *c = tb + (size_t)sc * cb;
                for (int q = 0; q < 4; q++) {
                    const uint8_t *blk = row + (size_t)(4 * sc + q) * bb;
                    memcpy(c + (cb - 128) + (size_t)g * 16 + (size_t)(2 * q + h) * 2, blk, 2);
                    for (int tig = 0; tig < 4; tig++) {
                        uint8_t *lane = c + (size_t)(4 * g + tig) * 16;
                        if (q4) {
                            memcpy(lane + (size_t)(q / 2) * 512 + (size_t)(2 * (q % 2) + h) * 4,
                                   blk + 2 + 4 * tig, 4);
                        } else {
                            uint8_t *l8 = lane + (size_t)q * 512 + (size_t)(2 * h) * 4;
                            memcpy(l8, blk + 2 + 4 * tig, 4);
                            memcpy(l8 + 4, blk + 18 + 4 * tig, 4);
                        }
                    }
                }
            }
        }
    }
    return KILN_OK;
}

void kiln_cuda_t16_dequant_row(uint32_t dtype, const void *t16, int64_t k, int64_t r, float *out) {
    const uint8_t *W = t16;
    const size_t cb = kiln_cuda_t16_chunk_bytes(dtype);
    const int64_t nsc = k / kiln_cuda_t16_k(dtype);
    const int ri = (int)(r % 16), g = ri % 8, h = ri / 8;
    for (int64_t sc = 0; sc < nsc; sc++) {
        const uint8_t *c = W + tile_base(dtype, k, r) + (size_t)sc * cb;
        if (dtype == KILN_DTYPE_Q4_0 || dtype == KILN_DTYPE_Q8_0) {
            for (int bb = 0; bb < 4; bb++) {
                const int64_t b = 4 * sc + bb;
                uint16_t dh;
                memcpy(&dh, W + kiln_cuda_t16_d_offset(dtype, k, r, b), 2);
                const float d = kiln_fp16_to_f32(dh);
                for (int m = 0; m < (dtype == KILN_DTYPE_Q4_0 ? 16 : 32); m++) {
                    const uint8_t q = W[kiln_cuda_t16_qs_offset(dtype, k, r, b, m)];
                    if (dtype == KILN_DTYPE_Q4_0) {
                        out[32 * b + m] = (float)((q & 15) - 8) * d;
                        out[32 * b + 16 + m] = (float)((q >> 4) - 8) * d;
                    } else {
                        out[32 * b + m] = (float)(int8_t)q * d;
                    }
                }
            }
            continue;
        }
        float *o = out + 256 * sc;
        for (int bb = 0; bb < 8; bb++)
            for (int tig = 0; tig < 4; tig++) {
                const int lane = 4 * g + tig;
                for (int e = 0; e < 4; e++) {
                    const int ea = 32 * bb + 4 * tig + e, eb = ea + 16;
                    if (dtype == KILN_DTYPE_Q4_K) {
                        const uint8_t *s = c + 2048 + 16 * (2 * g + h);
                        uint16_t dd[2];
                        memcpy(dd, s, 4);
                        const uint32_t S = get32(s + 4), M = get32(s + 8), H = get32(s + 12);
                        const int scv = (int)(((S >> (4 * bb)) & 15) | ((H >> (2 * bb)) & 3) << 4);
                        const int mv =
                            (int)(((M >> (4 * bb)) & 15) | ((H >> (16 + 2 * bb)) & 3) << 4);
                        const float d1 = kiln_fp16_to_f32(dd[0]) * (float)scv,
                                    m1 = kiln_fp16_to_f32(dd[1]) * (float)mv;
                        const int j = bb / 2, sh = 4 * (bb % 2);
                        const uint8_t qa = c[512 * j + 16 * lane + 4 * (2 * h + 0) + e],
                                      qb = c[512 * j + 16 * lane + 4 * (2 * h + 1) + e];
                        o[ea] = d1 * (float)((qa >> sh) & 15) - m1;
                        o[eb] = d1 * (float)((qb >> sh) & 15) - m1;
                    } else {
                        const uint8_t lw =
                            c[512 * (bb / 2) + 16 * lane + 4 * (2 * (bb % 2) + h) + e];
                        const uint8_t hw = c[2048 + 512 * (bb / 4) + 16 * lane + 4 * (bb % 4) + e];
                        const int qa = (lw & 15) | (h ? hw & 3 : (hw >> 4) & 3) << 4;
                        const int qb = (lw >> 4) | (h ? (hw >> 2) & 3 : (hw >> 6) & 3) << 4;
                        const int8_t *scs = (const int8_t *)(c + 3072 + 16 * (2 * g + h));
                        uint16_t dh;
                        memcpy(&dh, c + 3328 + 2 * (2 * g + h), 2);
                        const float d = kiln_fp16_to_f32(dh);
                        o[ea] = d * (float)scs[ea / 16] * (float)(qa - 32);
                        o[eb] = d * (float)scs[eb / 16] * (float)(qb - 32);
                    }
                }
            }
    }
}

static kiln_status t16_plan(uint32_t src, int64_t ne0, int64_t n_rows, uint32_t fixup,
                            uint32_t *out_dtype, uint64_t *out_row_bytes, kiln_err *err) {
    (void)n_rows;
    if (fixup != 0)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "cuda_t16 layout: no fixups (%u)", fixup);
    if (!kiln_cuda_t16_supports(src))
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "cuda_t16 layout: dtype %u (q4_0, q8_0, q4_K, q6_K)", src);
    if (ne0 <= 0 || ne0 % kiln_cuda_t16_k(src))
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "cuda_t16 layout: rows of %lld (a multiple of %lld)", (long long)ne0,
                            (long long)kiln_cuda_t16_k(src));
    size_t rb;
    KILN_TRY(kiln_dtype_row_bytes(src, ne0, &rb, err));
    *out_dtype = src;
    *out_row_bytes = rb; /* a tile is 16 plain rows' bytes */
    return KILN_OK;
}

static kiln_status t16_run(uint32_t src, int64_t ne0, uint32_t fixup, const void *in,
                           int64_t n_rows, void *dst, kiln_err *err) {
    (void)fixup;
    size_t rb;
    KILN_TRY(kiln_dtype_row_bytes(src, ne0, &rb, err));
    return kiln_cuda_t16_repack(src, in, rb, n_rows, ne0, dst, err);
}

static const kiln_layout t16_layout = {
    "cuda_t16", "cuda gemv: 16-row tiles in mma fragment order", 16, t16_plan, t16_run, true};

const struct kiln_layout *kiln_cuda_t16_layout(void) {
    return &t16_layout;
}
