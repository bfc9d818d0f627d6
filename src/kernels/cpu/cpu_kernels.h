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
 * KILN_CPU_WLAYOUT_R16 (every quantized type, both ISAs; see below).
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
/* As kiln_cpu_matmul_avx512, but f16 / bf16 weights with t > 1 go through AVX512-BF16
 * vdpbf16ps (activations and weights rounded to bf16: 2x the f32 FMA rate, 2^-7
 * relative error per product; needs KILN_ISA_AVX512BF16 as well). Not the default:
 * on llama-110m F16 it moves the logits by a mean KL of 2e-4 from the f32 reference,
 * above the backend's 1e-4 bar; a policy can prefer it (KILN_PREFER=cpu.avx512bf16.*). */
kiln_status kiln_cpu_matmul_avx512_bf16(const kiln_kctx *c, const kiln_matmul_args *a);

/* ---- the R16 weight layout (w_layout = KILN_CPU_WLAYOUT_R16; AVX-512 and AVX2) ----
 * Rows are taken in groups of 16 (the last group zero-padded); a group is one stream of
 * 64-byte aligned pieces (every vector load of the kernels is a whole cache line): for
 * the 32-block types one "unit" per 64 elements (blocks 2c and 2c + 1; when k % 64 == 32
 * the last unit is a half unit with block 2c only), for the 256-block types one
 * super-block per 256 elements. The quants are interleaved 4 bytes per row: a 64-byte
 * vector holds 4 consecutive elements of the 16 rows (byte 4r + e = row r, element e).
 * Scales of the 16 rows are stored side by side. Why: a GEMV reads 16 rows with one
 * broadcast activation per 4 elements (vpdpbusd), ~8x fewer instructions per weight
 * byte than unpacking row by row, which makes decode memory-bound instead of
 * compute-bound; a GEMM reuses each unpacked 16-row panel across 8 tokens.
 * Units of the 32-block types (offsets in bytes; h = block 0 / 1 of the unit):
 *   header: f16 d[2][16] (one 64-byte line; d[1] zero in a half unit)
 *           q4_1 / q5_1: then f16 m[2][16] (a second line)
 *   block h at header + h * B:
 *     q4_0, q4_1 (B 256): qs 4 x 64 (vector i, byte 4r+e = qs_r[4i+e]: low nibble =
 *                         element 4i+e, high nibble = element 16+4i+e)
 *     q5_0, q5_1 (B 320): qh 8 x u64 (mask j bit 4r+e = qh_r bit 4j+e) | qs as q4_0
 *     q8_0       (B 512): qs 8 x 64 (vector j, byte 4r+e = qs_r[4j+e])
 *   unit bytes: q4_0 576, q4_1 640, q5_0 704, q5_1 768, q8_0 1088 (= the plain rows)
 * Super-blocks of the 256-block types (unit c = elements [64c, 64c + 64) of it):
 *   q4_K (2368): f16 d[16] | f16 dmin[16] | u8 sc[8][16] | u8 m[8][16] |
 *                qs: 32 x 64 (vector 8c+i, byte 4r+e = qs_r[32c+4i+e])
 *   q5_K (2880): as q4_K up to m | qh: per unit c 16 x u64 at 320 + 128c (mask i < 8:
 *                bit 4r+e = bit 2c of qh_r[4i+e]; mask 8+i: bit 2c+1) | qs at 832 as q4_K
 *   q6_K (3392): f32 d[16] | i8 sc[16][16] | lo: 32 x 64 (vector 8c+i, byte 4r+e = low
 *                nibbles of elements 64c+4i+e and 64c+32+4i+e) | hi: 16 x 64 at 2368
 *                (vector 4c+i, byte 4r+e = 2-bit highs of elements 64c+16q+4i+e at bits 2q)
 * Sizes: as the plain layout except q4_K / q5_K (+4 bytes per row and 256: 6-bit scales
 * and mins stored as bytes), q6_K (+2: d as f32) and the half unit's zero line.
 * Group g's stream starts at g * kiln_cpu_r16_group_bytes(dtype, k). */
#define KILN_CPU_WLAYOUT_R16 2u /* = KILN_WLAYOUT_CPU_R16 of kernels/spec.h */

bool kiln_cpu_r16_supports(uint32_t dtype);
/* Bytes of an n x k tensor in the R16 layout; errors name a bad shape or overflow. */
kiln_status kiln_cpu_r16_size(uint32_t dtype, int64_t n, int64_t k, size_t *out, kiln_err *err);
size_t kiln_cpu_r16_group_bytes(uint32_t dtype, int64_t k);
/* Repacks n plain rows (src_row_bytes apart) into dst (kiln_cpu_r16_size bytes). */
kiln_status kiln_cpu_r16_repack(uint32_t dtype, const void *src, size_t src_row_bytes, int64_t n,
                                int64_t k, void *dst, kiln_err *err);
/* The same bytes by the plain scalar code (the reference the fast path is tested against). */
kiln_status kiln_cpu_r16_repack_ref(uint32_t dtype, const void *src, size_t src_row_bytes,
                                    int64_t n, int64_t k, void *dst, kiln_err *err);

#endif /* KILN_KERNELS_CPU_CPU_KERNELS_H */
