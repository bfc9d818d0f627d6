/*
 * quants.h — ggml-compatible quantized block layouts and reference (scalar) per-type
 * conversions. kiln_dequantize_row / kiln_quantize_row (format/dtype.h) dispatch here;
 * kernels include this header for the block structs and the small per-block helpers.
 *
 * Layouts (bytes, in order) are exactly ggml's (ggml-common.h). Every struct has natural
 * alignment without padding (checked by _Static_assert), so an array of blocks is the
 * on-disk byte stream. fp16 fields are raw IEEE half bits (kiln_fp16_to_f32 in dtype.h).
 *
 *   type   elems bytes  layout
 *   q4_0    32    18    d(f16) qs[16]           x = d * (q - 8)
 *   q4_1    32    20    d m qs[16]              x = d * q + m
 *   q5_0    32    22    d qh[4] qs[16]          x = d * (q - 16), q = 4 low bits | bit j of qh
 *   q5_1    32    24    d m qh[4] qs[16]        x = d * q + m
 *   q8_0    32    34    d qs[32] (int8)         x = d * q
 *   q8_1    32    36    d s qs[32]              s = d * sum(q) (activations only)
 *   q2_K   256    84    scales[16] qs[64] d dmin
 *   q3_K   256   110    hmask[32] qs[64] scales[12] d
 *   q4_K   256   144    d dmin scales[12] qs[128]
 *   q5_K   256   176    d dmin scales[12] qh[32] qs[128]
 *   q6_K   256   210    ql[128] qh[64] scales[16] (int8) d
 *   q8_K   256   292    d(f32) qs[256] (int8) bsums[16] (int16) (activations, q*_K dots)
 *
 * In the 32-element types, byte j of qs holds element j in its low nibble and element
 * j + 16 in its high nibble. In q4_K / q5_K, each 64-element chunk c uses qs[32c .. 32c+31]:
 * low nibbles are elements 64c + l, high nibbles 64c + 32 + l, with sub-block scales
 * 2c and 2c + 1 (kiln_get_scale_min_k4).
 *
 * The per-type functions below take `n`, a multiple of the block size (unchecked here:
 * kiln_dequantize_row / kiln_quantize_row validate). They read and write blocks through
 * memcpy, so src / dst need no alignment. Any byte pattern is a valid block: dequantize
 * never faults on garbage (it may produce inf / NaN from garbage scales).
 *
 * Quantizers reproduce ggml's quantize_row_*_ref bit for bit (the path llama-quantize
 * takes without an importance matrix), given the same f32 input and no FMA contraction
 * (kiln builds C11 with -ffp-contract=off, the ISO default).
 */
#ifndef KILN_FORMAT_QUANTS_H
#define KILN_FORMAT_QUANTS_H

#include <stdint.h>
#include <string.h>

#define KILN_QK4_0        32
#define KILN_QK4_1        32
#define KILN_QK5_0        32
#define KILN_QK5_1        32
#define KILN_QK8_0        32
#define KILN_QK8_1        32
#define KILN_QK_K         256
#define KILN_K_SCALE_SIZE 12

typedef struct kiln_block_q4_0 {
    uint16_t d;
    uint8_t qs[KILN_QK4_0 / 2];
} kiln_block_q4_0;

typedef struct kiln_block_q4_1 {
    uint16_t d, m;
    uint8_t qs[KILN_QK4_1 / 2];
} kiln_block_q4_1;

typedef struct kiln_block_q5_0 {
    uint16_t d;
    uint8_t qh[4]; /* bit j: 5th bit of element j (little-endian uint32) */
    uint8_t qs[KILN_QK5_0 / 2];
} kiln_block_q5_0;

typedef struct kiln_block_q5_1 {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[KILN_QK5_1 / 2];
} kiln_block_q5_1;

typedef struct kiln_block_q8_0 {
    uint16_t d;
    int8_t qs[KILN_QK8_0];
} kiln_block_q8_0;

typedef struct kiln_block_q8_1 {
    uint16_t d, s; /* s = d * sum(qs), as f16 */
    int8_t qs[KILN_QK8_1];
} kiln_block_q8_1;

typedef struct kiln_block_q2_K {
    uint8_t scales[KILN_QK_K / 16]; /* low nibble: scale, high nibble: min (of 16 elems) */
    uint8_t qs[KILN_QK_K / 4];      /* 2-bit quants */
    uint16_t d, dmin;
} kiln_block_q2_K;

typedef struct kiln_block_q3_K {
    uint8_t hmask[KILN_QK_K / 8]; /* high bit; set means "no -4 offset" */
    uint8_t qs[KILN_QK_K / 4];    /* low 2 bits */
    uint8_t scales[12];           /* 16 6-bit scales (kiln_q3_K_scales) */
    uint16_t d;
} kiln_block_q3_K;

typedef struct kiln_block_q4_K {
    uint16_t d, dmin;
    uint8_t scales[KILN_K_SCALE_SIZE]; /* 8 6-bit scales + 8 6-bit mins */
    uint8_t qs[KILN_QK_K / 2];
} kiln_block_q4_K;

typedef struct kiln_block_q5_K {
    uint16_t d, dmin;
    uint8_t scales[KILN_K_SCALE_SIZE];
    uint8_t qh[KILN_QK_K / 8];
    uint8_t qs[KILN_QK_K / 2];
} kiln_block_q5_K;

typedef struct kiln_block_q6_K {
    uint8_t ql[KILN_QK_K / 2];
    uint8_t qh[KILN_QK_K / 4];
    int8_t scales[KILN_QK_K / 16];
    uint16_t d;
} kiln_block_q6_K;

typedef struct kiln_block_q8_K {
    float d;
    int8_t qs[KILN_QK_K];
    int16_t bsums[KILN_QK_K / 16]; /* sum of each 16 quants */
} kiln_block_q8_K;

_Static_assert(sizeof(kiln_block_q4_0) == 18, "q4_0 block size");
_Static_assert(sizeof(kiln_block_q4_1) == 20, "q4_1 block size");
_Static_assert(sizeof(kiln_block_q5_0) == 22, "q5_0 block size");
_Static_assert(sizeof(kiln_block_q5_1) == 24, "q5_1 block size");
_Static_assert(sizeof(kiln_block_q8_0) == 34, "q8_0 block size");
_Static_assert(sizeof(kiln_block_q8_1) == 36, "q8_1 block size");
_Static_assert(sizeof(kiln_block_q2_K) == 84, "q2_K block size");
_Static_assert(sizeof(kiln_block_q3_K) == 110, "q3_K block size");
_Static_assert(sizeof(kiln_block_q4_K) == 144, "q4_K block size");
_Static_assert(sizeof(kiln_block_q5_K) == 176, "q5_K block size");
_Static_assert(sizeof(kiln_block_q6_K) == 210, "q6_K block size");
_Static_assert(sizeof(kiln_block_q8_K) == 292, "q8_K block size");

/* ---- per-block helpers ---- */

/* Scale and min (6 bits each) of sub-block j in [0, 8) of a q4_K / q5_K block. */
static inline void kiln_get_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The 16 signed scales (6-bit value - 32, in [-32, 31]) of a q3_K block. Scale i covers
 * elements [16 i, 16 i + 16): low 4 bits from scales[i % 8] (nibble i / 8), high 2 bits
 * from scales[8 + i % 4] (bit pair i / 4). */
static inline void kiln_q3_K_scales(const uint8_t packed[12], int8_t out[16]) {
    for (int i = 0; i < 16; i++) {
        int lo = (packed[i % 8] >> (4 * (i / 8))) & 0xF;
        int hi = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        out[i] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

/* Round to nearest (ties to even) for |x| < 2^22, as ggml's nearest_int; never traps
 * (out-of-range inputs give some int in [-2^22, 2^22)). */
static inline int kiln_nearest_int(float x) {
    float v = x + 12582912.0f;
    uint32_t u;
    memcpy(&u, &v, 4);
    return (int)(u & 0x007fffffu) - 0x00400000;
}

/* ---- reference row conversions (n a multiple of the block size) ---- */

void kiln_dequant_f16(const void *src, float *y, int64_t n);
void kiln_dequant_bf16(const void *src, float *y, int64_t n);
void kiln_dequant_q4_0(const void *src, float *y, int64_t n);
void kiln_dequant_q4_1(const void *src, float *y, int64_t n);
void kiln_dequant_q5_0(const void *src, float *y, int64_t n);
void kiln_dequant_q5_1(const void *src, float *y, int64_t n);
void kiln_dequant_q8_0(const void *src, float *y, int64_t n);
void kiln_dequant_q2_K(const void *src, float *y, int64_t n);
void kiln_dequant_q3_K(const void *src, float *y, int64_t n);
void kiln_dequant_q4_K(const void *src, float *y, int64_t n);
void kiln_dequant_q5_K(const void *src, float *y, int64_t n);
void kiln_dequant_q6_K(const void *src, float *y, int64_t n);
void kiln_dequant_q8_K(const void *src, float *y, int64_t n);

void kiln_quant_f16(const float *x, void *dst, int64_t n);
void kiln_quant_bf16(const float *x, void *dst, int64_t n);
void kiln_quant_q4_0(const float *x, void *dst, int64_t n);
void kiln_quant_q4_1(const float *x, void *dst, int64_t n);
void kiln_quant_q5_0(const float *x, void *dst, int64_t n);
void kiln_quant_q5_1(const float *x, void *dst, int64_t n);
void kiln_quant_q8_0(const float *x, void *dst, int64_t n);
void kiln_quant_q2_K(const float *x, void *dst, int64_t n);
void kiln_quant_q3_K(const float *x, void *dst, int64_t n);
void kiln_quant_q4_K(const float *x, void *dst, int64_t n);
void kiln_quant_q5_K(const float *x, void *dst, int64_t n);
void kiln_quant_q6_K(const float *x, void *dst, int64_t n);
void kiln_quant_q8_K(const float *x, void *dst, int64_t n);

/* ---- activation quantizers for integer dot products ----
 * q8_0: same bits as kiln_quant_q8_0 (ggml's quantize_row_q8_0_ref: d = amax / 127,
 *       q = roundf(x / d)); the partner of q4_0 / q5_0 / q8_0 weights.
 * q8_1: q8_0 plus s = d * sum(q) (ggml's quantize_row_q8_1_ref); the partner of q4_1 / q5_1
 *       weights (the s term folds in their min).
 * q8_K: ggml's quantize_row_q8_K_ref (d = max / -127 with the sign of the largest-|x|
 *       element, f32 d, bsums); the partner of every q*_K weight type.
 * ggml's SIMD activation quantizers may round half-way cases differently (to even); a
 * dot product against either is within the same error bound. */
void kiln_quantize_act_q8_0(const float *x, kiln_block_q8_0 *y, int64_t n);
void kiln_quantize_act_q8_1(const float *x, kiln_block_q8_1 *y, int64_t n);
void kiln_quantize_act_q8_K(const float *x, kiln_block_q8_K *y, int64_t n);

#endif /* KILN_FORMAT_QUANTS_H */
