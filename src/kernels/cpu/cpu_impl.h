/*
 * cpu_impl.h — the seam between the baseline-compiled drivers of src/kernels/cpu/
 * (threading, scratch, dispatch; built for plain x86-64) and the per-ISA inner loops
 * in *_avx2.c / *_avx512.c (built with those ISA flags, called only after
 * kiln_cpu_info() said the ISA is there). Internal to src/kernels/cpu/.
 */
#ifndef KILN_KERNELS_CPU_CPU_IMPL_H
#define KILN_KERNELS_CPU_CPU_IMPL_H

#include "format/dtype.h"
#include "kernels/cpu/qblocks.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One matmul call as the inner loops see it: rows [r0, r1) of y for every token. */
typedef struct kiln_cpu_mm {
    uint32_t dtype;
    const uint8_t *w;
    size_t w_row_bytes;
    int64_t n, k;
    /* quantized types: q8 activations, act_stride bytes per token */
    const uint8_t *act;
    size_t act_stride;
    /* float types: the f32 activations */
    const float *x;
    int64_t x_stride;
    int64_t t;
    float *y;
    int64_t y_stride;
    const float *bias;
    bool bf16; /* float weights, t > 1: AVX512-BF16 dot products (see matmul_f_avx512.c) */
    /* float weights, t > 1 (not bf16): the activations transposed, xt[i * xt_stride
     * + t] = x[t][i], tokens zero padded to xt_stride (a multiple of 16); else NULL */
    const float *xt;
    int64_t xt_stride;
} kiln_cpu_mm;

/* Rows per unpacked GEMM panel (the scratch a thread needs: kiln_cpu_mm_panel_bytes). */
#define KILN_CPU_MM_ROWS 4
static inline size_t kiln_cpu_mm_panel_bytes(int64_t k) {
    return KILN_CPU_MM_ROWS * kiln_wpanel_row_bytes(k) + 64;
}

/* Quantize one row of k floats (k a multiple of 32) into the q8 activation format. */
void kiln_cpu_q8act_avx512(const float *x, int64_t k, uint8_t *dst);
void kiln_cpu_q8act_avx2(const float *x, int64_t k, uint8_t *dst);

/* Quantized weights (q4_0 ... q6_K): rows [r0, r1) x all tokens. panel: scratch of
 * kiln_cpu_mm_panel_bytes(k) bytes, 64-byte aligned, used when t > 1. */
void kiln_cpu_mmq_avx512(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel);
void kiln_cpu_mmq_avx2(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel);
bool kiln_cpu_mmq_supports(uint32_t dtype);
/* Scratch bytes of one thread's panel (t > 1) for a matmul of dtype weights, k columns and
 * t tokens, rounded up to 64: the larger of the plain-row and R16 needs (matmul.c). */
size_t kiln_cpu_panel_bytes(uint32_t dtype, int64_t k, int64_t t);

/* Rows per work item of a matmul (matmul.c) or matmul group (matmul_group.c): a multiple of
 * m (16; 48 for float weights: the AVX2 float GEMM's 24-row groups, none partial inside an
 * item), about 8 items per thread, at least m; big outputs (an LM head: 262,144 rows) in
 * items of at most 1024 rows, so that the threads finish together (16 items of 16,384 rows
 * left one thread waiting). */
static inline int64_t kiln_cpu_row_grain(int64_t n, int nth, int64_t m) {
    int64_t g = n / ((int64_t)nth * 8);
    g = (g + m - 1) / m * m;
    if (g > 1024) g = 1024 / m * m;
    return g < m ? m : g;
}

/* The AVX2 float GEMM's k block and panel (matmul_f_avx2.c: 24 rows x FKB widened to f32) */
#ifndef KILN_CPU_MMF_AVX2_FKB
#define KILN_CPU_MMF_AVX2_FKB 448 /* -DKILN_CPU_MMF_AVX2_FKB=N: the A/B build */
#endif
#define KILN_CPU_MMF_AVX2_PANEL ((size_t)24 * KILN_CPU_MMF_AVX2_FKB * sizeof(float))

/* Float weights (f32, f16, bf16) with f32 activations. panel: scratch of
 * kiln_cpu_mmf_panel_bytes(k, t), used when t > 1: an f32 panel of 4 rows, or with
 * bf16 the t activation rows and 4 weight rows as bf16 (k padded to 32). */
#define KILN_CPU_MMF_ROWS 8 /* rows of the AVX-512 float GEMM panel (matmul_f_avx512.c) */
static inline size_t kiln_cpu_mmf_panel_bytes(int64_t k, int64_t t) {
    size_t f32 = (size_t)KILN_CPU_MMF_ROWS * (size_t)((k + 15) / 16 * 16) * sizeof(float);
    size_t b16 = (size_t)(t + KILN_CPU_MM_ROWS) * (size_t)((k + 31) / 32 * 32) * 2;
    size_t blk = KILN_CPU_MMF_AVX2_PANEL;
    if (blk > f32) f32 = blk;
    return (f32 > b16 ? f32 : b16) + 64;
}
void kiln_cpu_mmf_avx512(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel);
/* The transposed activations kiln_cpu_mm.xt (float GEMM, t > 1, both ISAs): bytes, token
 * stride, and the fill (split over pool; xt 64-byte aligned). Callers that leave xt NULL
 * get the slower dot-product GEMM (different summation order). matmul.c. */
int64_t kiln_cpu_xt_stride(int64_t t);
size_t kiln_cpu_xt_bytes(int64_t k, int64_t t);
struct kiln_pool;
void kiln_cpu_xt_fill(struct kiln_pool *pool, const float *x, int64_t x_stride, int64_t k,
                      int64_t t, float *xt);
void kiln_cpu_mmf_avx2(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel);

/* ---- R16 layout geometry (byte layouts: cpu_kernels.h) ----
 * A group of 16 rows is a stream of 64-byte aligned pieces: for 32-block types one
 * "unit" per 64 elements (a header of 64-byte lines with the 16 rows' f16 scales / mins
 * of its two blocks, then each block's bits), the last one a half unit when k % 64 ==
 * 32; for 256-block types one super-block per 256 elements (4 units). */
static inline bool kiln_r16_is256(uint32_t dt) {
    return dt == KILN_DTYPE_Q4_K || dt == KILN_DTYPE_Q5_K || dt == KILN_DTYPE_Q6_K;
}
/* 32-block types: header bytes of a unit (d line, plus an m line for q4_1 / q5_1). */
static inline size_t kiln_r16_hdr(uint32_t dt) {
    return dt == KILN_DTYPE_Q4_1 || dt == KILN_DTYPE_Q5_1 ? 128 : 64;
}
/* 32-block types: bytes of one block's bits in a unit (q5 high-bit masks, then quants). */
static inline size_t kiln_r16_blk(uint32_t dt) {
    switch (dt) {
    case KILN_DTYPE_Q5_0:
    case KILN_DTYPE_Q5_1:
        return 64 + 256;
    case KILN_DTYPE_Q8_0:
        return 512;
    default:
        return 256;
    }
}
/* 256-block types: bytes of one super-block of 16 rows. */
static inline size_t kiln_r16_sb(uint32_t dt) {
    switch (dt) {
    case KILN_DTYPE_Q4_K:
        return 2368;
    case KILN_DTYPE_Q5_K:
        return 2880;
    default: /* q6_K */
        return 3392;
    }
}
/* Offset of unit c (elements [64c, 64c + 64)) in a group's stream. */
static inline size_t kiln_r16_unit_off(uint32_t dt, int64_t c) {
    if (kiln_r16_is256(dt)) return (size_t)(c >> 2) * kiln_r16_sb(dt);
    return (size_t)c * (kiln_r16_hdr(dt) + 2 * kiln_r16_blk(dt));
}
/* Bytes of one group (16 rows x k). */
static inline size_t kiln_r16_gbytes(uint32_t dt, int64_t k) {
    if (kiln_r16_is256(dt)) return (size_t)(k / 256) * kiln_r16_sb(dt);
    return kiln_r16_unit_off(dt, k / 64) + (k % 64 ? kiln_r16_hdr(dt) + kiln_r16_blk(dt) : 0);
}

/* R16 layout (cpu_kernels.h): rows [r0, r1) (multiples of 16 except at n) x all tokens.
 * panel: kiln_cpu_r16_panel_bytes(k) of scratch, used when t > 1: the group's units
 * unpacked (kiln_r16 unit: 16 x 64 bytes u, 4 x 16 floats s, 4 x 16 floats o). */
static inline size_t kiln_cpu_r16_panel_bytes(int64_t k) {
    size_t unpacked = (size_t)((k + 63) / 64) * 24 * 64;
    size_t w16 = 8 * (2048 + 512) + 24 * 64; /* the AVX2 GEMM's k block (matmul_r16_avx2.c) */
    return (unpacked > w16 ? unpacked : w16) + 64;
}
void kiln_cpu_mmr16_avx512(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel);
void kiln_cpu_mmr16_avx2(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel);

#endif /* KILN_KERNELS_CPU_CPU_IMPL_H */
