/*
 * ref_fused.h — reference kernels of the fused ops (kernel.h: matmul_group, rope_kv,
 * matmul_argmax), written as the composition of the kernels they replace so that a
 * fused kernel can be tested against exactly the arithmetic of the unfused path:
 *  - matmul_group calls each member's own kernel (fn[m]) and then glu_fn;
 *  - rope_kv is kiln_ref_rope on q and k, then kiln_ref_kv_write;
 *  - matmul_argmax is fn (kiln_ref_matmul when NULL) into a temporary [t][n_limit]
 *    buffer (heap, KILN_ERR_NOMEM on failure), then kiln_argmax_row per row.
 * Deterministic and batch-invariant whenever the member kernels are.
 */
#ifndef KILN_KERNELS_REF_REF_FUSED_H
#define KILN_KERNELS_REF_REF_FUSED_H

#include "kernels/kernel.h"

kiln_status kiln_ref_matmul_group(const kiln_kctx *c, const kiln_matmul_group_args *a);
kiln_status kiln_ref_rope_kv(const kiln_kctx *c, const kiln_rope_kv_args *a);
kiln_status kiln_ref_matmul_argmax(const kiln_kctx *c, const kiln_matmul_argmax_args *a);

/* The greedy pick over one row of logits as matmul_argmax defines it (f = softcap or
 * identity): the lowest index of the largest f(v), skipping NaN and -inf; -1 if none.
 * *val (may be NULL) gets f of the winner. */
int32_t kiln_argmax_row(const float *v, int64_t n, float softcap, float *val);

/* ref_sample.c: the sampling chain (kernel.h, kiln_sample_args) over every alive logit
 * sorted; and its pieces, shared with tests: the final softcap, a row's override of one
 * logit, and the chain after top-k on candidates sorted best first (l, id: m of them). */
kiln_status kiln_ref_sample(const kiln_kctx *c, const kiln_sample_args *a);
float kiln_ref_sample_softcap(float v, float softcap);
float kiln_ref_sample_override(float l, float bias, int32_t count, const kiln_sample_row_params *p);
int32_t kiln_ref_sample_tail(const float *l, const int32_t *id, int32_t m,
                             const kiln_sample_row_params *p);

#endif /* KILN_KERNELS_REF_REF_FUSED_H */
