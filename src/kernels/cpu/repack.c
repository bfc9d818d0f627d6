/*
 * repack.c — the R16 weight layout (KILN_CPU_WLAYOUT_R16): rows interleaved in groups of
 * 16 so that one 64-byte register holds 4 consecutive elements of 16 rows, which is
 * what vpdpbusd with a broadcast activation wants. See cpu_kernels.h for the contract
 * and the byte layout of each type; the kernels are in matmul_r16_avx512.c.
 *
 * Scalar code: it runs once per tensor when a model is bound (or by the loader's
 * transform lane), reading each source byte once.
 */
#include "base/mem.h"
#include "format/dtype.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/qblocks.h"

#include <string.h>

bool kiln_cpu_r16_supports(uint32_t dtype) {
    switch (dtype) {
    case KILN_DTYPE_Q4_0:
    case KILN_DTYPE_Q5_0:
    case KILN_DTYPE_Q8_0:
    case KILN_DTYPE_Q4_K:
    case KILN_DTYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

/* Bytes per row per block in the R16 layout (q4_K stores its scales and mins as
 * bytes: 148 instead of 144). */
static size_t r16_block_bytes(uint32_t dtype) {
    switch (dtype) {
    case KILN_DTYPE_Q4_K:
        return 148;
    default:
        return kiln_dtype_get(dtype)->block_bytes;
    }
}

kiln_status kiln_cpu_r16_size(uint32_t dtype, int64_t n, int64_t k, size_t *out, kiln_err *err) {
    if (!kiln_cpu_r16_supports(dtype))
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "R16 layout: dtype %s not supported",
                            kiln_dtype_name(dtype));
    const kiln_dtype_info *in = kiln_dtype_get(dtype);
    if (n <= 0 || k <= 0 || k % in->block_size)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "R16 layout: bad shape n=%lld k=%lld for %s (k must be a multiple "
                            "of %u)",
                            (long long)n, (long long)k, in->name, in->block_size);
    size_t groups = (size_t)((n + 15) / 16), blocks = (size_t)(k / in->block_size), s;
    if (!kiln_size_mul(groups, blocks, &s) || !kiln_size_mul(s, 16 * r16_block_bytes(dtype), &s))
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "R16 layout: size overflow");
    *out = s;
    return KILN_OK;
}

size_t kiln_cpu_r16_group_bytes(uint32_t dtype, int64_t k) {
    return (size_t)(k / kiln_dtype_get(dtype)->block_size) * 16 * r16_block_bytes(dtype);
}

/* One group-block: the block b of 16 source rows (rows >= nrows are zero). */
static void pack_block(uint32_t dt, const uint8_t *const rows[16], int nrows, int64_t b,
                       uint8_t *o) {
    const size_t bb = kiln_dtype_get(dt)->block_bytes;
    static const uint8_t zero[256];
    const uint8_t *blk[16];
    for (int r = 0; r < 16; r++) blk[r] = r < nrows ? rows[r] + b * bb : zero;
    switch (dt) {
    case KILN_DTYPE_Q4_0:
        for (int r = 0; r < 16; r++) {
            memcpy(o + 2 * r, blk[r], 2);
            for (int i = 0; i < 4; i++) memcpy(o + 32 + 64 * i + 4 * r, blk[r] + 2 + 4 * i, 4);
        }
        break;
    case KILN_DTYPE_Q5_0: {
        uint64_t masks[8] = {0};
        for (int r = 0; r < 16; r++) {
            memcpy(o + 2 * r, blk[r], 2);
            uint32_t qh;
            memcpy(&qh, blk[r] + 2, 4);
            for (int j = 0; j < 8; j++) masks[j] |= (uint64_t)((qh >> (4 * j)) & 0xF) << (4 * r);
            for (int i = 0; i < 4; i++) memcpy(o + 96 + 64 * i + 4 * r, blk[r] + 6 + 4 * i, 4);
        }
        memcpy(o + 32, masks, 64);
        break;
    }
    case KILN_DTYPE_Q8_0:
        for (int r = 0; r < 16; r++) {
            memcpy(o + 2 * r, blk[r], 2);
            for (int j = 0; j < 8; j++) memcpy(o + 32 + 64 * j + 4 * r, blk[r] + 2 + 4 * j, 4);
        }
        break;
    case KILN_DTYPE_Q4_K:
        for (int r = 0; r < 16; r++) {
            memcpy(o + 2 * r, blk[r], 2);
            memcpy(o + 32 + 2 * r, blk[r] + 2, 2);
            for (int j = 0; j < 8; j++)
                kq_scale_min_k4(j, blk[r] + 4, o + 64 + 16 * j + r, o + 192 + 16 * j + r);
            for (int c = 0; c < 4; c++)
                for (int i = 0; i < 8; i++)
                    memcpy(o + 320 + 64 * (8 * c + i) + 4 * r, blk[r] + 16 + 32 * c + 4 * i, 4);
        }
        break;
    case KILN_DTYPE_Q6_K:
        for (int r = 0; r < 16; r++) {
            const uint8_t *x = blk[r];
            memcpy(o + 2 * r, x + 208, 2);
            for (int s = 0; s < 16; s++) o[32 + 16 * s + r] = x[192 + s];
            /* the 256 6-bit values of the row's block, ggml order */
            uint8_t q[256];
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = x + 64 * h, *qh = x + 128 + 32 * h;
                for (int l = 0; l < 32; l++) {
                    q[128 * h + l] = (uint8_t)((ql[l] & 0xF) | ((qh[l] & 3) << 4));
                    q[128 * h + l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
                    q[128 * h + l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                    q[128 * h + l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
                }
            }
            for (int c = 0; c < 4; c++) {
                for (int i = 0; i < 8; i++)
                    for (int e = 0; e < 4; e++) {
                        int e1 = 64 * c + 4 * i + e, e2 = e1 + 32;
                        o[288 + 64 * (8 * c + i) + 4 * r + e] =
                            (uint8_t)((q[e1] & 0xF) | ((q[e2] & 0xF) << 4));
                    }
                for (int i = 0; i < 4; i++)
                    for (int e = 0; e < 4; e++) {
                        uint8_t v = 0;
                        for (int qq = 0; qq < 4; qq++)
                            v |= (uint8_t)((q[64 * c + 16 * qq + 4 * i + e] >> 4) << (2 * qq));
                        o[2336 + 64 * (4 * c + i) + 4 * r + e] = v;
                    }
            }
        }
        break;
    default:
        break;
    }
}

kiln_status kiln_cpu_r16_repack(uint32_t dtype, const void *src, size_t src_row_bytes, int64_t n,
                                int64_t k, void *dst, kiln_err *err) {
    size_t total;
    KILN_TRY(kiln_cpu_r16_size(dtype, n, k, &total, err));
    const kiln_dtype_info *in = kiln_dtype_get(dtype);
    const int64_t nb = k / in->block_size;
    const size_t gbb = 16 * r16_block_bytes(dtype);
    uint8_t *o = dst;
    for (int64_t g = 0; g < (n + 15) / 16; g++) {
        const uint8_t *rows[16];
        int nrows = (int)(n - 16 * g < 16 ? n - 16 * g : 16);
        for (int r = 0; r < nrows; r++)
            rows[r] = (const uint8_t *)src + (size_t)(16 * g + r) * src_row_bytes;
        for (int64_t b = 0; b < nb; b++, o += gbb) pack_block(dtype, rows, nrows, b, o);
    }
    return KILN_OK;
}
