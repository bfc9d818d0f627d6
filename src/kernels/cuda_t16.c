/*
 * cuda_t16.c — the host side of the CUDA T16 weight layout (cuda_t16.h): the repack the
 * loader runs on the way to the device (the upload lane's transform), and the layout's
 * loader registration. Plain C, built in every configuration (the layout's tests run
 * without a GPU).
 */
#include "kernels/cuda_t16.h"

#include "format/dtype.h"
#include "load/layout.h"

#include <string.h>

bool kiln_cuda_t16_supports(uint32_t dtype) {
    return dtype == KILN_DTYPE_Q4_0 || dtype == KILN_DTYPE_Q8_0;
}

size_t kiln_cuda_t16_chunk_bytes(uint32_t dtype) {
    return dtype == KILN_DTYPE_Q4_0 ? 1152 : dtype == KILN_DTYPE_Q8_0 ? 2176 : 0;
}

/* bytes per 32-block of the plain rows */
static size_t blk_bytes(uint32_t dtype) {
    return dtype == KILN_DTYPE_Q4_0 ? 18 : 34;
}

static size_t tile_base(uint32_t dtype, int64_t k, int64_t r) {
    return (size_t)(r / 16) * (size_t)(k / KILN_CUDA_T16_K) * kiln_cuda_t16_chunk_bytes(dtype);
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
    if (k <= 0 || k % KILN_CUDA_T16_K || n_rows < 0)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "cuda_t16 layout: k = %lld is not a multiple of %d", (long long)k,
                            KILN_CUDA_T16_K);
    const size_t bb = blk_bytes(dtype), cb = kiln_cuda_t16_chunk_bytes(dtype);
    const int64_t nsc = k / KILN_CUDA_T16_K, tiles = (n_rows + 15) / 16;
    const bool q4 = dtype == KILN_DTYPE_Q4_0;
    uint8_t *out = dst;
    for (int64_t t = 0; t < tiles; t++) {
        uint8_t *tb = out + (size_t)t * (size_t)nsc * cb;
        if ((t + 1) * 16 > n_rows) memset(tb, 0, (size_t)nsc * cb); /* the padded rows */
        const int64_t rows = n_rows - t * 16 < 16 ? n_rows - t * 16 : 16;
        for (int ri = 0; ri < rows; ri++) {
            const uint8_t *row = (const uint8_t *)src + (size_t)(t * 16 + ri) * src_row_bytes;
            const int g = ri % 8, h = ri / 8;
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

static kiln_status t16_plan(uint32_t src, int64_t ne0, int64_t n_rows, uint32_t fixup,
                            uint32_t *out_dtype, uint64_t *out_row_bytes, kiln_err *err) {
    (void)n_rows;
    if (fixup != 0)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "cuda_t16 layout: no fixups (%u)", fixup);
    if (!kiln_cuda_t16_supports(src))
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "cuda_t16 layout: dtype %u (q4_0, q8_0)",
                            src);
    if (ne0 <= 0 || ne0 % KILN_CUDA_T16_K)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "cuda_t16 layout: rows of %lld (a multiple of %d)", (long long)ne0,
                            KILN_CUDA_T16_K);
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
