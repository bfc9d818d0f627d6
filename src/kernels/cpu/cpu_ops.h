/*
 * cpu_ops.h — the CPU backend's non-matmul kernels (kernel.h ABI). Threading and
 * scratch as in cpu_kernels.h; none allocates except attention (its split-K partials
 * and tile list, freed before returning; KILN_ERR_NOMEM on failure).
 *
 *  rms_norm, add, glu     SIMD, rows (or column chunks of 512 for one-row glu) split
 *                         over the pool when there is enough work.
 *  attention              paged KV (F16 or F32), causal, GQA, sliding window, softcap.
 *                         Work items are (tile of <= 4 consecutive tokens of one
 *                         sequence, KV head): the K/V rows a tile reads stay in L1 for
 *                         every query head of the group and every token of the tile
 *                         (flash-style, online softmax, no score matrix). With fewer
 *                         items than threads (decode) the KV range is split (split-K)
 *                         and the partial (max, sum, acc) merged by log-sum-exp.
 *                         Returns KILN_ERR_UNSUPPORTED when n_head / n_kv_head > 64 or
 *                         the group's head dims exceed 8192 floats.
 *  embed, rope, kv_write  scalar (baseline x86-64; cheap next to the matmuls): embed
 *                         dequantizes rows with kiln_dequantize_row; rope computes
 *                         each token's sin/cos once for all heads.
 */
#ifndef KILN_KERNELS_CPU_CPU_OPS_H
#define KILN_KERNELS_CPU_CPU_OPS_H

#include "kernels/kernel.h"

kiln_status kiln_cpu_rms_norm_avx512(const kiln_kctx *c, const kiln_rms_norm_args *a);
kiln_status kiln_cpu_rms_norm_avx2(const kiln_kctx *c, const kiln_rms_norm_args *a);
kiln_status kiln_cpu_add_avx512(const kiln_kctx *c, const kiln_add_args *a);
kiln_status kiln_cpu_add_avx2(const kiln_kctx *c, const kiln_add_args *a);
kiln_status kiln_cpu_glu_avx512(const kiln_kctx *c, const kiln_glu_args *a);
kiln_status kiln_cpu_glu_avx2(const kiln_kctx *c, const kiln_glu_args *a);
kiln_status kiln_cpu_attention_avx512(const kiln_kctx *c, const kiln_attention_args *a);
kiln_status kiln_cpu_attention_avx2(const kiln_kctx *c, const kiln_attention_args *a);

kiln_status kiln_cpu_embed(const kiln_kctx *c, const kiln_embed_args *a);
kiln_status kiln_cpu_rope(const kiln_kctx *c, const kiln_rope_args *a);
kiln_status kiln_cpu_kv_write(const kiln_kctx *c, const kiln_kv_write_args *a);

#endif /* KILN_KERNELS_CPU_CPU_OPS_H */
