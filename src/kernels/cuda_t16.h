/*
 * cuda_t16.h — the CUDA T16 weight layout (w_layout = KILN_WLAYOUT_CUDA_T16, loader layout
 * "cuda_t16"): q4_0 / q8_0 rows regrouped so that the tensor-core gemv
 * (src/kernels/cuda/gemv_t16.cu) reads each lane's mma.sync m16n8k16 A fragments with
 * 16-byte loads straight from global memory, no shared-memory staging.
 *
 * Rows are taken in tiles of 16 (the last tile zero-padded); a tile is k / 128
 * "superchunks" of 128 columns (4 blocks of 32), each of SCB bytes, the same bytes as the
 * plain rows (q4_0 1152 = 16 x 4 x 18, q8_0 2176 = 16 x 4 x 34). Inside a tile, row
 * ri = 8 h + g (g = 0..7, h = 0 / 1) is what mma lane L = 4 g + tig (tig = 0..3) holds as
 * "row g" (h = 0) or "row g + 8" (h = 1). Superchunk sc of the tile (blocks bb = 0..3,
 * global block 4 sc + bb), offsets from its start:
 *   q4_0: quants of blocks 2p, 2p + 1 at 512 p (p = 0, 1): lane L's 16 bytes at 16 L are 4
 *         words, word 2 (bb % 2) + h = qs bytes 4 tig .. 4 tig + 3 of row g (+ 8 h)
 *         (low nibbles: elements 4 tig + e, high nibbles 16 + 4 tig + e);
 *         scales at 1024.
 *   q8_0: quants of block bb at 512 bb: lane L's 16 bytes at 16 L are 4 words, word 2 h + j
 *         = qs bytes 16 j + 4 tig .. + 3 of row g (+ 8 h);
 *         scales at 2048.
 *   scales (128 bytes): at 16 g, 8 f16: half 2 bb + h = d of row g (+ 8 h), block bb.
 * Needs k % 128 == 0 (kiln_cuda_t16_supports / the spec rows' k_multiple; other shapes
 * keep the plain rows and the plain kernels, chosen at bind). Tile j starts at
 * j * 16 * row_bytes (row_bytes of the plain rows).
 *
 * K-quants (q4_K, q6_K): a superchunk is one 256-column block of the 16 rows (k % 256 == 0
 * always holds for them), again exactly the plain rows' bytes (q4_K 2304 = 16 x 144, q6_K
 * 3360 = 16 x 210). Lane L = 4 g + tig, row ri = g + 8 h as above; 32-block bb = 0..7 of
 * the superchunk (global 32-block 8 sc + bb); element e = 0..3 of a byte / word.
 *   q4_K: quants at 512 j (j = 0..3: the plain block's qs[32 j .. 32 j + 31], i.e. the
 *         32-blocks 2 j (low nibbles) and 2 j + 1 (high nibbles)): lane L's 16 bytes at
 *         16 L are 4 words, word 2 h + s = qs bytes 32 j + 16 s + 4 tig .. + 3 of row ri
 *         (low nibbles: 32-block 2 j, elements 16 s + 4 tig + e; high nibbles: 32-block
 *         2 j + 1, same elements);
 *         scales at 2048 + 16 (2 g + h), 16 bytes per row: d, dmin (f16, as stored), then
 *         three words S, M, H: S bits 4 i .. 4 i + 3 = sc_i & 15, M the same for m_i, H bits
 *         2 i .. 2 i + 1 = sc_i >> 4 and bits 16 + 2 i .. = m_i >> 4 (sc_i, m_i: the 6-bit
 *         scale and min of 32-block i, kiln_get_scale_min_k4). Value d sc_i q - dmin m_i.
 *   q6_K: q = the unsigned 6-bit quant (value q - 32, times d scale_{e / 16}).
 *         low nibbles at 512 p (p = 0..3: 32-blocks 2 p, 2 p + 1): lane L's 16 bytes at 16 L
 *         are 4 words, word 2 (bb % 2) + h (bb = 2 p + bb % 2), byte e = (q of element
 *         32 bb + 4 tig + e) & 15 | ((q of element 32 bb + 16 + 4 tig + e) & 15) << 4, of row
 *         ri; high bits at 2048 + 512 p (p = 0, 1: 32-blocks 4 p .. 4 p + 3): lane L's word
 *         bb % 4 at 16 L, byte e: bits 4-5 / 6-7 = q >> 4 of elements 32 bb + 4 tig + e /
 *         + 16 of row g, bits 0-1 / 2-3 the same of row g + 8;
 *         scales at 3072 + 16 (2 g + h): row ri's 16 int8 scales as stored;
 *         d at 3328 + 2 (2 g + h): row ri's d (f16).
 */
#ifndef KILN_KERNELS_CUDA_T16_H
#define KILN_KERNELS_CUDA_T16_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_CUDA_T16_K 128 /* columns per superchunk of q4_0 / q8_0: k must be a multiple */

/* q4_0, q8_0, q4_K and q6_K. */
bool kiln_cuda_t16_supports(uint32_t dtype);
/* Columns per superchunk: 128 (q4_0, q8_0), 256 (q4_K, q6_K); k must be a multiple. 0 for an
 * unsupported dtype. */
int64_t kiln_cuda_t16_k(uint32_t dtype);
/* Bytes of one superchunk of a tile (16 rows x kiln_cuda_t16_k columns), 0 for an
 * unsupported dtype. */
size_t kiln_cuda_t16_chunk_bytes(uint32_t dtype);
/* n_rows plain rows (row stride src_row_bytes) of k columns -> the T16 layout at dst
 * (ceil(n_rows / 16) tiles; the rows of a partial last tile past n_rows are zero). */
kiln_status kiln_cuda_t16_repack(uint32_t dtype, const void *src, size_t src_row_bytes,
                                 int64_t n_rows, int64_t k, void *dst, kiln_err *err);
/* The byte offsets of the layout for q4_0 / q8_0 (tests, the device dequantization mirrors
 * them): where qs byte m of row r, block b lies, and where its d lies, for k columns. */
size_t kiln_cuda_t16_qs_offset(uint32_t dtype, int64_t k, int64_t r, int64_t b, int m);
size_t kiln_cuda_t16_d_offset(uint32_t dtype, int64_t k, int64_t r, int64_t b);

/* Row r (< the tiles' rows) of T16 weights of k columns -> k floats, every dtype above: the
 * values the plain rows dequantize to (kiln_dequantize_row), read through the layout as the
 * device dequantization (gemv_t16.cu) reads it. */
void kiln_cuda_t16_dequant_row(uint32_t dtype, const void *t16, int64_t k, int64_t r, float *out);

struct kiln_layout;
/* The loader layout "cuda_t16" (row_group 16, last group padded); bind.c registers it. */
const struct kiln_layout *kiln_cuda_t16_layout(void);

#ifdef __cplusplus
}
#endif

#endif /* KILN_KERNELS_CUDA_T16_H */
