/*
 * dtype.h — every tensor element type kiln knows, and the reference (scalar)
 * conversions between them and f32.
 *
 * kiln_dtype values are the GGUF type ids, so a GGUF tensor's type field maps 1:1.
 * The table (kiln_dtype_get) gives block size (elements per block), bytes per block
 * and name. Types marked unsupported (IQ*, TQ*, MXFP4, Q8_1) are known so that a file
 * using them gets a clear "unsupported" error instead of "unknown".
 *
 * Quantized layouts are bit-compatible with ggml: dequantizing a tensor written by
 * llama.cpp gives the same floats as ggml's dequantize_row_*; kiln_quantize_row
 * follows ggml's *_ref quantizers (round-trip bounds are tested per type).
 */
#ifndef KILN_FORMAT_DTYPE_H
#define KILN_FORMAT_DTYPE_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum kiln_dtype {
    KILN_DTYPE_F32 = 0,
    KILN_DTYPE_F16 = 1,
    KILN_DTYPE_Q4_0 = 2,
    KILN_DTYPE_Q4_1 = 3,
    KILN_DTYPE_Q5_0 = 6,
    KILN_DTYPE_Q5_1 = 7,
    KILN_DTYPE_Q8_0 = 8,
    KILN_DTYPE_Q8_1 = 9,
    KILN_DTYPE_Q2_K = 10,
    KILN_DTYPE_Q3_K = 11,
    KILN_DTYPE_Q4_K = 12,
    KILN_DTYPE_Q5_K = 13,
    KILN_DTYPE_Q6_K = 14,
    KILN_DTYPE_Q8_K = 15,
    KILN_DTYPE_IQ2_XXS = 16,
    KILN_DTYPE_IQ2_XS = 17,
    KILN_DTYPE_IQ3_XXS = 18,
    KILN_DTYPE_IQ1_S = 19,
    KILN_DTYPE_IQ4_NL = 20,
    KILN_DTYPE_IQ3_S = 21,
    KILN_DTYPE_IQ2_S = 22,
    KILN_DTYPE_IQ4_XS = 23,
    KILN_DTYPE_I8 = 24,
    KILN_DTYPE_I16 = 25,
    KILN_DTYPE_I32 = 26,
    KILN_DTYPE_I64 = 27,
    KILN_DTYPE_F64 = 28,
    KILN_DTYPE_IQ1_M = 29,
    KILN_DTYPE_BF16 = 30,
    KILN_DTYPE_TQ1_0 = 34,
    KILN_DTYPE_TQ2_0 = 35,
    KILN_DTYPE_MXFP4 = 39,
    KILN_DTYPE_COUNT = 40, /* one past the largest id; ids in between are unknown */
} kiln_dtype;

typedef struct kiln_dtype_info {
    const char *name;     /* "q4_K", as llama.cpp prints it; NULL for unknown ids */
    uint32_t block_size;  /* elements per block (1 for plain types) */
    uint32_t block_bytes; /* bytes per block */
    bool quantized;       /* block-quantized (not plain int/float) */
    bool supported;       /* kiln can compute with it (dequantize / quantize) */
} kiln_dtype_info;

/* Table entry for a type id, or NULL when the id is unknown. */
const kiln_dtype_info *kiln_dtype_get(uint32_t id);
/* Name, or "unknown". */
const char *kiln_dtype_name(uint32_t id);
/* Looks a type up by name (case-insensitive: "q4_k", "Q4_K", "f16", "bf16"). */
bool kiln_dtype_from_name(const char *name, kiln_dtype *out);

/* KILN_ERR_FORMAT for an unknown id, KILN_ERR_UNSUPPORTED (naming it) for a known type
 * kiln does not compute with. */
kiln_status kiln_dtype_check(uint32_t id, kiln_err *err);

/* Bytes of a row of n elements. Fails when n is not a multiple of the block size or
 * the size overflows. */
kiln_status kiln_dtype_row_bytes(uint32_t id, int64_t n, size_t *out, kiln_err *err);
/* Bytes of a tensor: shape[0] is the contiguous (row) dimension, as in GGUF. Fails for
 * negative dims, a row not a multiple of the block size, or overflow. */
kiln_status kiln_dtype_nbytes(uint32_t id, const int64_t *shape, int rank, size_t *out,
                              kiln_err *err);

/* ---- reference conversions (src/format/quants*.c) ---- */

/* Dequantizes n elements (a multiple of the block size) of type id into dst. */
kiln_status kiln_dequantize_row(uint32_t id, const void *src, float *dst, int64_t n, kiln_err *err);
/* Quantizes n elements (a multiple of the block size) into dst (row_bytes(n) bytes). */
kiln_status kiln_quantize_row(uint32_t id, const float *src, void *dst, int64_t n, kiln_err *err);

/* ---- half-precision scalars (bit-exact, round to nearest even) ---- */

static inline float kiln_f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t kiln_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float kiln_fp16_to_f32(uint16_t h) {
    /* exact: works for normals, subnormals, inf and NaN (ggml's method) */
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = 0xE0u << 23;
    const float exp_scale = 0x1.0p-112f;
    const float normalized = kiln_f32_from_bits((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = 126u << 23;
    const float magic_bias = 0.5f;
    const float denormalized = kiln_f32_from_bits((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denormalized_cutoff = 1u << 27;
    const uint32_t result = sign | (two_w < denormalized_cutoff ? kiln_f32_bits(denormalized)
                                                                : kiln_f32_bits(normalized));
    return kiln_f32_from_bits(result);
}

static inline uint16_t kiln_f32_to_fp16(float f) {
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (__builtin_fabsf(f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = kiln_f32_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = kiln_f32_from_bits((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = kiln_f32_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static inline float kiln_bf16_to_f32(uint16_t h) {
    return kiln_f32_from_bits((uint32_t)h << 16);
}

static inline uint16_t kiln_f32_to_bf16(float f) {
    uint32_t u = kiln_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64); /* quiet NaN */
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

#endif /* KILN_FORMAT_DTYPE_H */
