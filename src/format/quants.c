/*
 * quants.c — reference conversions for the plain float types and the 32-element block
 * types (q4_0, q4_1, q5_0, q5_1, q8_0, q8_1), the activation quantizers, and the
 * kiln_dequantize_row / kiln_quantize_row entry points of dtype.h. K-quants live in
 * quants_k.c. Layout and bit-exactness notes: quants.h.
 */
#include "format/quants.h"

#include "base/mem.h"
#include "format/dtype.h"

#include <float.h>
#include <math.h>

static inline float half(uint16_t h) {
    return kiln_fp16_to_f32(h);
}

/* ---- f16 / bf16 ---- */

void kiln_dequant_f16(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        y[i] = kiln_fp16_to_f32(h);
    }
}

void kiln_dequant_bf16(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        y[i] = kiln_bf16_to_f32(h);
    }
}

void kiln_quant_f16(const float *x, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = kiln_f32_to_fp16(x[i]);
        memcpy(p + 2 * i, &h, 2);
    }
}

void kiln_quant_bf16(const float *x, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = kiln_f32_to_bf16(x[i]);
        memcpy(p + 2 * i, &h, 2);
    }
}

/* ---- 32-element block types ----
 * Each loop copies one block into a local struct (no alignment or aliasing assumptions
 * on the caller's buffer), converts, and copies out. */

void kiln_dequant_q4_0(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / KILN_QK4_0; b++, y += KILN_QK4_0) {
        kiln_block_q4_0 blk;
        memcpy(&blk, p + b * sizeof blk, sizeof blk);
        const float d = half(blk.d);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((blk.qs[j] & 0xF) - 8) * d;
            y[j + 16] = (float)((blk.qs[j] >> 4) - 8) * d;
        }
    }
}

void kiln_dequant_q4_1(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / KILN_QK4_1; b++, y += KILN_QK4_1) {
        kiln_block_q4_1 blk;
        memcpy(&blk, p + b * sizeof blk, sizeof blk);
        const float d = half(blk.d), m = half(blk.m);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(blk.qs[j] & 0xF) * d + m;
            y[j + 16] = (float)(blk.qs[j] >> 4) * d + m;
        }
    }
}

static inline uint32_t load_qh(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

void kiln_dequant_q5_0(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / KILN_QK5_0; b++, y += KILN_QK5_0) {
        kiln_block_q5_0 blk;
        memcpy(&blk, p + b * sizeof blk, sizeof blk);
        const float d = half(blk.d);
        const uint32_t qh = load_qh(blk.qh);
        for (int j = 0; j < 16; j++) {
            int lo = (int)((blk.qs[j] & 0xF) | ((qh >> j) & 1) << 4);
            int hi = (int)((blk.qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
            y[j] = (float)(lo - 16) * d;
            y[j + 16] = (float)(hi - 16) * d;
        }
    }
}

void kiln_dequant_q5_1(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / KILN_QK5_1; b++, y += KILN_QK5_1) {
        kiln_block_q5_1 blk;
        memcpy(&blk, p + b * sizeof blk, sizeof blk);
        const float d = half(blk.d), m = half(blk.m);
        const uint32_t qh = load_qh(blk.qh);
        for (int j = 0; j < 16; j++) {
            int lo = (int)((blk.qs[j] & 0xF) | ((qh >> j) & 1) << 4);
            int hi = (int)((blk.qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
            y[j] = (float)lo * d + m;
            y[j + 16] = (float)hi * d + m;
        }
    }
}

void kiln_dequant_q8_0(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / KILN_QK8_0; b++, y += KILN_QK8_0) {
        kiln_block_q8_0 blk;
        memcpy(&blk, p + b * sizeof blk, sizeof blk);
        const float d = half(blk.d);
        for (int j = 0; j < 32; j++) y[j] = (float)blk.qs[j] * d;
    }
}

/* Value of largest magnitude (first one wins ties), as ggml's symmetric quantizers. */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static void min_max(const float *x, int n, float *mn, float *mx) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

/* (int8_t) truncation of a float, as ggml's quantizers: saturating at the int8 range
 * instead of being undefined for NaN / huge values (identical for in-range values). */
static inline int trunc_i8(float v) {
    if (!(v > -129.0f)) return v != v ? 0 : -128;
    if (v >= 128.0f) return 127;
    return (int8_t)v;
}

void kiln_quant_q4_0(const float *x, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t b = 0; b < n / KILN_QK4_0; b++, x += KILN_QK4_0) {
        kiln_block_q4_0 blk;
        const float d = signed_absmax(x, 32) / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = kiln_f32_to_fp16(d);
        for (int j = 0; j < 16; j++) {
            int q0 = trunc_i8(x[j] * id + 8.5f), q1 = trunc_i8(x[j + 16] * id + 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            blk.qs[j] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
        }
        memcpy(p + b * sizeof blk, &blk, sizeof blk);
    }
}

void kiln_quant_q4_1(const float *x, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t b = 0; b < n / KILN_QK4_1; b++, x += KILN_QK4_1) {
        kiln_block_q4_1 blk;
        float mn, mx;
        min_max(x, 32, &mn, &mx);
        const float d = (mx - mn) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = kiln_f32_to_fp16(d);
        blk.m = kiln_f32_to_fp16(mn);
        for (int j = 0; j < 16; j++) {
            int q0 = trunc_i8((x[j] - mn) * id + 0.5f), q1 = trunc_i8((x[j + 16] - mn) * id + 0.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            blk.qs[j] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
        }
        memcpy(p + b * sizeof blk, &blk, sizeof blk);
    }
}

static void store_qh(uint8_t out[4], uint32_t qh) {
    for (int i = 0; i < 4; i++) out[i] = (uint8_t)(qh >> (8 * i));
}

void kiln_quant_q5_0(const float *x, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t b = 0; b < n / KILN_QK5_0; b++, x += KILN_QK5_0) {
        kiln_block_q5_0 blk;
        const float d = signed_absmax(x, 32) / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = kiln_f32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = trunc_i8(x[j] * id + 16.5f), q1 = trunc_i8(x[j + 16] * id + 16.5f);
            q0 = (q0 < 31 ? q0 : 31) & 0xFF;
            q1 = (q1 < 31 ? q1 : 31) & 0xFF;
            blk.qs[j] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
            qh |= (uint32_t)((q0 >> 4) & 1) << j;
            qh |= (uint32_t)((q1 >> 4) & 1) << (j + 16);
        }
        store_qh(blk.qh, qh);
        memcpy(p + b * sizeof blk, &blk, sizeof blk);
    }
}

void kiln_quant_q5_1(const float *x, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t b = 0; b < n / KILN_QK5_1; b++, x += KILN_QK5_1) {
        kiln_block_q5_1 blk;
        float mn, mx;
        min_max(x, 32, &mn, &mx);
        const float d = (mx - mn) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = kiln_f32_to_fp16(d);
        blk.m = kiln_f32_to_fp16(mn);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            /* ggml truncates to uint8 without a clamp; in range the result is 0..31 */
            int q0 = trunc_i8((x[j] - mn) * id + 0.5f) & 0xFF;
            int q1 = trunc_i8((x[j + 16] - mn) * id + 0.5f) & 0xFF;
            blk.qs[j] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
            qh |= (uint32_t)((q0 >> 4) & 1) << j;
            qh |= (uint32_t)((q1 >> 4) & 1) << (j + 16);
        }
        store_qh(blk.qh, qh);
        memcpy(p + b * sizeof blk, &blk, sizeof blk);
    }
}

/* Shared by q8_0 weights and q8_0 / q8_1 activations: d = amax / 127, q = roundf(x / d).
 * Stores the f16 scale, returns the f32 scale and the sum of the quants. */
static float quant_block_q8(const float *x, uint16_t *d_out, int8_t *qs, int *sum_out) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *d_out = kiln_f32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        float r = roundf(x[j] * id);
        qs[j] = (int8_t)(r > 127.0f ? 127 : r < -128.0f ? -128 : r == r ? (int)r : 0);
        sum += qs[j];
    }
    *sum_out = sum;
    return d;
}

void kiln_quant_q8_0(const float *x, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t b = 0; b < n / KILN_QK8_0; b++, x += KILN_QK8_0) {
        kiln_block_q8_0 blk;
        int sum;
        quant_block_q8(x, &blk.d, blk.qs, &sum);
        memcpy(p + b * sizeof blk, &blk, sizeof blk);
    }
}

void kiln_quantize_act_q8_0(const float *x, kiln_block_q8_0 *y, int64_t n) {
    kiln_quant_q8_0(x, y, n);
}

void kiln_quantize_act_q8_1(const float *x, kiln_block_q8_1 *y, int64_t n) {
    for (int64_t b = 0; b < n / KILN_QK8_1; b++, x += KILN_QK8_1) {
        kiln_block_q8_1 blk;
        int sum;
        const float d = quant_block_q8(x, &blk.d, blk.qs, &sum);
        blk.s = kiln_f32_to_fp16((float)sum * d); /* ggml: the f32 d, not the f16 one */
        memcpy(&y[b], &blk, sizeof blk);
    }
}

/* ---- dispatch ---- */

typedef void (*dequant_fn)(const void *src, float *y, int64_t n);
typedef void (*quant_fn)(const float *x, void *dst, int64_t n);

static void dequant_f32(const void *src, float *y, int64_t n) {
    memcpy(y, src, (size_t)n * sizeof(float));
}
static void quant_f32(const float *x, void *dst, int64_t n) {
    memcpy(dst, x, (size_t)n * sizeof(float));
}

static bool conv_fns(uint32_t id, dequant_fn *dq, quant_fn *q) {
    switch (id) {
    case KILN_DTYPE_F32:
        *dq = dequant_f32, *q = quant_f32;
        return true;
    case KILN_DTYPE_F16:
        *dq = kiln_dequant_f16, *q = kiln_quant_f16;
        return true;
    case KILN_DTYPE_BF16:
        *dq = kiln_dequant_bf16, *q = kiln_quant_bf16;
        return true;
    case KILN_DTYPE_Q4_0:
        *dq = kiln_dequant_q4_0, *q = kiln_quant_q4_0;
        return true;
    case KILN_DTYPE_Q4_1:
        *dq = kiln_dequant_q4_1, *q = kiln_quant_q4_1;
        return true;
    case KILN_DTYPE_Q5_0:
        *dq = kiln_dequant_q5_0, *q = kiln_quant_q5_0;
        return true;
    case KILN_DTYPE_Q5_1:
        *dq = kiln_dequant_q5_1, *q = kiln_quant_q5_1;
        return true;
    case KILN_DTYPE_Q8_0:
        *dq = kiln_dequant_q8_0, *q = kiln_quant_q8_0;
        return true;
    case KILN_DTYPE_Q2_K:
        *dq = kiln_dequant_q2_K, *q = kiln_quant_q2_K;
        return true;
    case KILN_DTYPE_Q3_K:
        *dq = kiln_dequant_q3_K, *q = kiln_quant_q3_K;
        return true;
    case KILN_DTYPE_Q4_K:
        *dq = kiln_dequant_q4_K, *q = kiln_quant_q4_K;
        return true;
    case KILN_DTYPE_Q5_K:
        *dq = kiln_dequant_q5_K, *q = kiln_quant_q5_K;
        return true;
    case KILN_DTYPE_Q6_K:
        *dq = kiln_dequant_q6_K, *q = kiln_quant_q6_K;
        return true;
    case KILN_DTYPE_Q8_K:
        *dq = kiln_dequant_q8_K, *q = kiln_quant_q8_K;
        return true;
    default:
        return false;
    }
}

static kiln_status check_args(uint32_t id, const void *a, const void *b, int64_t n, dequant_fn *dq,
                              quant_fn *q, kiln_err *err) {
    KILN_TRY(kiln_dtype_check(id, err));
    if (!conv_fns(id, dq, q))
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "no conversion for tensor type %s",
                            kiln_dtype_name(id));
    size_t bytes;
    KILN_TRY(kiln_dtype_row_bytes(id, n, &bytes, err));
    if (n > 0 && (!a || !b))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "NULL buffer for a %s row of %lld",
                            kiln_dtype_name(id), (long long)n);
    size_t fbytes;
    return kiln_size_mul_err((size_t)n, sizeof(float), &fbytes, "f32 row bytes", err);
}

kiln_status kiln_dequantize_row(uint32_t id, const void *src, float *dst, int64_t n,
                                kiln_err *err) {
    dequant_fn dq = NULL;
    quant_fn q = NULL;
    KILN_TRY(check_args(id, src, dst, n, &dq, &q, err));
    if (n > 0) dq(src, dst, n);
    return KILN_OK;
}

kiln_status kiln_quantize_row(uint32_t id, const float *src, void *dst, int64_t n, kiln_err *err) {
    dequant_fn dq = NULL;
    quant_fn q = NULL;
    KILN_TRY(check_args(id, src, dst, n, &dq, &q, err));
    if (n > 0) q(src, dst, n);
    return KILN_OK;
}
