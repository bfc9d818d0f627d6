/*
 * ref.h — the reference kernels: plain C, one per kernel op of kernels/kernel.h, for
 * every weight dtype kiln computes with. They are the oracle every faster kernel is
 * compared against, so they favour clarity and determinism over speed:
 *  - weights are dequantized one row at a time (kiln_dequantize_row) and dotted with
 *    the activations in f32, in a fixed order (8 interleaved partial sums combined
 *    pairwise), independent of the thread count;
 *  - the thread pool (kctx->pool) only splits independent output rows (matmul output
 *    features, attention (token, head) pairs), so results are bitwise identical for
 *    any number of threads and any batch composition (batch invariant);
 *  - RoPE follows ggml's angle recurrence (theta_{i+1} = theta_i * base^(-2/n_rot)) so
 *    the oracle matches llama.cpp's rotation to the last bit where it can.
 * Kernels allocate their own per-call temporaries (heap) and return KILN_ERR_NOMEM if
 * that fails; they never abort.
 */
#ifndef KILN_KERNELS_REF_REF_H
#define KILN_KERNELS_REF_REF_H

#include "kernels/kernel.h"

kiln_status kiln_ref_matmul(const kiln_kctx *c, const kiln_matmul_args *a);
kiln_status kiln_ref_embed(const kiln_kctx *c, const kiln_embed_args *a);
kiln_status kiln_ref_rms_norm(const kiln_kctx *c, const kiln_rms_norm_args *a);
kiln_status kiln_ref_rope(const kiln_kctx *c, const kiln_rope_args *a);
kiln_status kiln_ref_kv_write(const kiln_kctx *c, const kiln_kv_write_args *a);
kiln_status kiln_ref_attention(const kiln_kctx *c, const kiln_attention_args *a);
kiln_status kiln_ref_glu(const kiln_kctx *c, const kiln_glu_args *a);
kiln_status kiln_ref_add(const kiln_kctx *c, const kiln_add_args *a);

/* The reference kernel of a kernel op ({.any = NULL} for an unknown op). */
kiln_kernel_fn kiln_ref_kernel(kiln_kop op);

/* True when the ref kernels compute with weights of this dtype (matmul / embed). */
bool kiln_ref_weight_dtype_ok(uint32_t dtype);

/* Dot product of n floats in the reference order (8 partial sums). */
float kiln_ref_dot(const float *x, const float *y, int64_t n);

/* Converts one weight row of k elements to f32 (F32 is copied). */
kiln_status kiln_ref_row_to_f32(uint32_t dtype, const void *row, float *out, int64_t k);

#endif /* KILN_KERNELS_REF_REF_H */
