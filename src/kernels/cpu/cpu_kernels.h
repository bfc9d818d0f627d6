/*
 * cpu_kernels.h — kiln's own SIMD + threaded CPU kernels (the `cpu` backend's kernels),
 * implementing the ABI of kernels/kernel.h. Every function here exists in an AVX-512
 * flavour (F/BW/VL/DQ + VNNI; needs kiln_cpu_avx512_ok()) and an AVX2 flavour (AVX2 +
 * FMA + F16C; needs kiln_cpu_avx2_ok()); calling one on a CPU without its ISA is a
 * programming error (the registry checks the spec's ISA bits first).
 *
 * Threading: kernels split their work over kctx->pool (both cores busy on every op;
 * output rows are split on 16-float boundaries so no two threads write one cache line).
 * Scratch: kernels use kctx->scratch when it is 64-byte aligned and at least the size the matching
 * *_workspace() function reports, and otherwise allocate (and free) their own; an
 * allocation failure returns KILN_ERR_NOMEM.
 *
 * matmul: w_dtype f32, f16, bf16 (f32 activations, exact widening) or q4_0, q4_1,
 * q5_0, q5_1, q8_0, q4_K, q5_K, q6_K (activations quantized per 32 to int8 on the fly,
 * integer dot products; see qblocks.h). w_layout 0 (plain ggml rows), or
 * KILN_CPU_WLAYOUT_R16 (AVX-512 only; q4_0, q5_0, q8_0, q4_K, q6_K; see below).
 */
#ifndef KILN_KERNELS_CPU_CPU_KERNELS_H
#define KILN_KERNELS_CPU_CPU_KERNELS_H

#include "kernels/kernel.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ISA checks against kiln_cpu_info() (KILN_CPU_ISA_MASK applies). */
bool kiln_cpu_avx512_ok(void);
bool kiln_cpu_avx2_ok(void);

/* True when the matmul kernels handle weights of this dtype. */
bool kiln_cpu_matmul_dtype_ok(uint32_t w_dtype);
/* Scratch bytes a matmul call of this shape wants with nth threads. */
size_t kiln_cpu_matmul_workspace(uint32_t w_dtype, int64_t n, int64_t k, int64_t t, int nth);

kiln_status kiln_cpu_matmul_avx512(const kiln_kctx *c, const kiln_matmul_args *a);
kiln_status kiln_cpu_matmul_avx2(const kiln_kctx *c, const kiln_matmul_args *a);

/* ---- the R16 weight layout (w_layout = KILN_CPU_WLAYOUT_R16, AVX-512 kernels) ----
 * Rows are taken in groups of 16 (the last group zero-padded); for each group, each
 * block of the row (32 or 256 elements) becomes one "group-block" of 16 x block bytes
 * in which the quants are interleaved 4 bytes per row: 64-byte vector i holds bytes
 * [4i, 4i + 4) of the 16 rows. Scales of the 16 rows are stored side by side (f16).
 * Same size as the plain layout except q4_K (148 bytes per 256 instead of 144: its
 * 6-bit scales and mins are stored as bytes). Why: a GEMV reads 16 rows with one
 * broadcast activation per 4 elements (vpdpbusd), ~8x fewer instructions per weight
 * byte than unpacking row by row, which makes decode memory-bound instead of
 * compute-bound; a GEMM reuses each unpacked 16-row panel across 8 tokens.
 * Group-block layouts (offsets in bytes, r = row in group, e = 0..3):
 *   q4_0 (288): f16 d[16] | qs: 4 x 64 (vector i, byte 4r+e = qs_r[4i+e])
 *   q5_0 (352): f16 d[16] | qh: 8 x u64 (mask j bit 4r+e = qh_r bit 4j+e) | qs as q4_0
 *   q8_0 (544): f16 d[16] | qs: 8 x 64 (vector j, byte 4r+e = qs_r[4j+e])
 *   q4_K (2368): f16 d[16] | f16 dmin[16] | u8 sc[8][16] | u8 m[8][16] |
 *                qs: 32 x 64 (vector 8c+i, byte 4r+e = qs_r[32c+4i+e])
 *   q6_K (3360): f16 d[16] | i8 sc[16][16] | lo: 32 x 64 (vector 8c+i, byte 4r+e = low
 *                nibbles of elements 64c+4i+e and 64c+32+4i+e) | hi: 16 x 64 (vector
 *                4c+i, byte 4r+e = 2-bit highs of elements 64c+16q+4i+e at bits 2q)
 * A group-block's rows are consecutive groups of the tensor: group g's blocks start at
 * g * kiln_cpu_r16_group_bytes(dtype, k). */
#define KILN_CPU_WLAYOUT_R16 2u /* = KILN_WLAYOUT_CPU_R16 of kernels/spec.h */

bool kiln_cpu_r16_supports(uint32_t dtype);
/* Bytes of an n x k tensor in the R16 layout; errors name a bad shape or overflow. */
kiln_status kiln_cpu_r16_size(uint32_t dtype, int64_t n, int64_t k, size_t *out, kiln_err *err);
size_t kiln_cpu_r16_group_bytes(uint32_t dtype, int64_t k);
/* Repacks n plain rows (src_row_bytes apart) into dst (kiln_cpu_r16_size bytes). */
kiln_status kiln_cpu_r16_repack(uint32_t dtype, const void *src, size_t src_row_bytes, int64_t n,
                                int64_t k, void *dst, kiln_err *err);

#endif /* KILN_KERNELS_CPU_CPU_KERNELS_H */
