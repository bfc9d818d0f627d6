/*
 * qblocks.h — byte layouts of the ggml quantized blocks the CPU kernels read, and the
 * "q8 activation" format that the integer matmul kernels quantize activations into.
 * Internal to src/kernels/cpu/.
 *
 * Weight blocks (ggml layout, little-endian, bytes):
 *   q4_0 (18)  : f16 d | qs[16]          w = d * (nibble - 8)
 *   q4_1 (20)  : f16 d, f16 m | qs[16]   w = d * nibble + m
 *   q5_0 (22)  : f16 d | qh[4] | qs[16]  w = d * (nibble | bit << 4) - 16 d
 *   q5_1 (24)  : f16 d, f16 m | qh[4] | qs[16]
 *   q8_0 (34)  : f16 d | int8 qs[32]
 *   q4_K (144) : f16 d, f16 dmin | scales[12] (6-bit scale/min pairs) | qs[128]
 *   q5_K (176) : f16 d, f16 dmin | scales[12] | qh[32] | qs[128]
 *   q6_K (210) : ql[128] | qh[64] | int8 scales[16] | f16 d
 * In a 32-block, element j < 16 is the low nibble of qs[j], element j + 16 the high one.
 *
 * Every weight type is seen by the kernels as 64-element chunks of unsigned bytes u
 * with one float scale per 4-element lane and one float offset per 16 elements:
 *   w[e] = scale[e / 4] * u[e] + offset[e / 16]
 * (q4_0: u = nibble, offset = -8 d; q8_0: u = q + 128, offset = -128 d; q4_K: scale =
 * d * sc, offset = -dmin * m; ...). Then for an activation quantized per 32 elements
 * (a[e] ~= da * qa[e], qa int8):
 *   dot(w, a) = sum_lanes scale * da * dot4(u, qa) + sum_groups offset * gsum
 * with gsum = the sum of the (dequantized) activations of the 16 elements. dot4 is one
 * VNNI vpdpbusd lane (u8 x s8), or maddubs + madd on AVX2 (u <= 63 there, see the AVX2
 * file for q8_0).
 *
 * Activations are quantized in two levels ("int8 x 2"): per 32 elements d1 = amax / 127,
 * q1 = round(a / d1), then the remainder r = a - d1 q1 (|r| <= d1 / 2) is quantized with
 * d2 = d1 / 256: q2 = round(r / d2) (clamped to +-127). So a = d2 (256 q1 + q2) to within
 * d2 / 2 = amax / 65024 (16 bits), and
 *   dot(u, a) = d2 * (256 * dot4(u, q1) + dot4(u, q2))
 * with both integer dots exact in int32. Why: with one level (what llama.cpp's q8_0 /
 * q8_K activations do) the logits of Gemma 3 270M differ from the f32 reference by a
 * mean KL of 2e-3 and greedy output changes; with two, the CPU backend matches the
 * reference (KL < 1e-4, tests/slow/test_cpu_e2e.c) for one more vpdpbusd per weight
 * vector, which decode (memory-bound) does not notice.
 *
 * q8 activation row (one per token), for k inputs, kc = ceil(k / 64) chunks:
 *   qs    int8 [kc * 64]     q1, zero padded
 *   qs2   int8 [kc * 64]     q2, zero padded
 *   dl    float[kc * 16]     d2 of each 4-element lane (repeated 8 times per 32)
 *   gs    float[kc * 4]      sum of d1 q1 + d2 q2 over each 16 elements
 *   a16   int16[kc * 64]     256 q1 + q2 (|.| <= 32639), zero padded; written by the
 *                            AVX2 quantizer only (the AVX2 R16 GEMM's int16 dot products)
 * kiln_q8act_row_bytes(k) bytes per token (rounded up to a multiple of 64, so rows and
 * their arrays stay 64-byte aligned in a 64-byte aligned buffer).
 */
#ifndef KILN_KERNELS_CPU_QBLOCKS_H
#define KILN_KERNELS_CPU_QBLOCKS_H

#include <stddef.h>
#include <stdint.h>

#define KQ_Q4_0_BYTES 18
#define KQ_Q4_1_BYTES 20
#define KQ_Q5_0_BYTES 22
#define KQ_Q5_1_BYTES 24
#define KQ_Q8_0_BYTES 34
#define KQ_Q4_K_BYTES 144
#define KQ_Q5_K_BYTES 176
#define KQ_Q6_K_BYTES 210

/* Chunks of 64 elements in a row of k (k a multiple of 32). */
static inline int64_t kiln_q8act_chunks(int64_t k) {
    return (k + 63) / 64;
}
static inline size_t kiln_q8act_row_bytes(int64_t k) {
    return ((size_t)kiln_q8act_chunks(k) * (64 + 64 + 64 + 16 + 128) + 63) & ~(size_t)63;
}
static inline const int8_t *kiln_q8act_qs(const uint8_t *row, int64_t k) {
    (void)k;
    return (const int8_t *)row;
}
static inline const int8_t *kiln_q8act_qs2(const uint8_t *row, int64_t k) {
    return (const int8_t *)(row + kiln_q8act_chunks(k) * 64);
}
static inline const float *kiln_q8act_dl(const uint8_t *row, int64_t k) {
    return (const float *)(row + kiln_q8act_chunks(k) * 128);
}
static inline const float *kiln_q8act_gs(const uint8_t *row, int64_t k) {
    return (const float *)(row + kiln_q8act_chunks(k) * 192);
}

static inline const int16_t *kiln_q8act_a16(const uint8_t *row, int64_t k) {
    return (const int16_t *)(row + kiln_q8act_chunks(k) * 208);
}

/* Unpacked weight panel rows (GEMM, plain layout): u[kc * 64] | s[kc * 16] | o[kc * 4]. */
static inline size_t kiln_wpanel_row_bytes(int64_t k) {
    return ((size_t)kiln_q8act_chunks(k) * (64 + 64 + 16) + 63) & ~(size_t)63;
}

/* get_scale_min_k4: the j-th (0..7) 6-bit scale and min of a q4_K / q5_K block. */
static inline void kq_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

#endif /* KILN_KERNELS_CPU_QBLOCKS_H */
