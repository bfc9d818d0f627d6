/* fuzz_quants.c — libFuzzer target for the reference conversions: the first byte picks a
 * type, the rest is used both as blocks to dequantize (any bit pattern is a valid block)
 * and as raw f32 input to quantize (NaN, inf, huge, subnormal values included). Neither
 * may crash or trip a sanitizer; quantize's output must dequantize too. */
#include "format/dtype.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const uint32_t TYPES[] = {
    KILN_DTYPE_F32,  KILN_DTYPE_F16,  KILN_DTYPE_BF16, KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_1,
    KILN_DTYPE_Q5_0, KILN_DTYPE_Q5_1, KILN_DTYPE_Q8_0, KILN_DTYPE_Q2_K, KILN_DTYPE_Q3_K,
    KILN_DTYPE_Q4_K, KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K, KILN_DTYPE_Q8_K,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint32_t t = TYPES[data[0] % (sizeof TYPES / sizeof TYPES[0])];
    const kiln_dtype_info *info = kiln_dtype_get(t);
    data++, size--;
    /* dequantize every whole block of the input */
    const int64_t nb = (int64_t)(size / info->block_bytes);
    if (nb > 0) {
        const int64_t n = nb * info->block_size;
        float *y = malloc((size_t)n * sizeof(float));
        if (!y) return 0;
        if (kiln_dequantize_row(t, data, y, n, NULL) != KILN_OK) abort();
        free(y);
    }
    /* quantize the input read as floats (whole blocks only), then dequantize that */
    const int64_t nf = (int64_t)(size / 4) / info->block_size * info->block_size;
    if (nf > 0) {
        float *x = malloc((size_t)nf * sizeof(float));
        float *y = malloc((size_t)nf * sizeof(float));
        size_t qb = 0;
        kiln_dtype_row_bytes(t, nf, &qb, NULL);
        uint8_t *q = malloc(qb ? qb : 1);
        if (x && y && q) {
            memcpy(x, data, (size_t)nf * sizeof(float));
            if (kiln_quantize_row(t, x, q, nf, NULL) != KILN_OK) abort();
            if (kiln_dequantize_row(t, q, y, nf, NULL) != KILN_OK) abort();
        }
        free(x), free(y), free(q);
    }
    /* a row length that is not a multiple of the block size is an error, not a crash */
    if (info->block_size > 1 && kiln_dequantize_row(t, data, NULL, 1, NULL) == KILN_OK) abort();
    return 0;
}
