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

#include "format/quants.h"
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

/* ---- "ggml numerics" (ref_ggml.c; docs/PLAN.md "Numerics") ----
 * llama.cpp's CPU backend quantizes each activation row to the weight type's vec_dot
 * type before a quantized matmul and computes integer block dot products. These
 * functions reproduce that arithmetic (ggml's x86 quantizers, its per-block formulas) so
 * the ref backend can be compared with llama.cpp at rounding-noise level. The engine
 * option numerics = "ggml" makes the selection engine bind kiln_ref_matmul_ggml to every
 * matmul whose weight is quantized (runtime/kselect.c: the call site's activation dtype
 * becomes the vec_dot type, which only this kernel accepts). Never the default: exact
 * f32 activations are the oracle. */

/* The activation block type ggml pairs with weight dtype w_dtype: KILN_DTYPE_Q8_0 (q4_0,
 * q5_0, q8_0), KILN_DTYPE_Q8_1 (q4_1, q5_1), KILN_DTYPE_Q8_K (q2_K..q6_K), else
 * KILN_DTYPE_F32 (float weights and types ggml has no such pairing for: not emulated). */
uint32_t kiln_ggml_vec_dot_type(uint32_t w_dtype);
/* Quantizes k floats (a multiple of the block size) as ggml does on x86 (AVX2/AVX-512
 * builds): q8_0 / q8_1 with d = amax/127 (fp16), q = rint(x * 127/amax), ties to even;
 * q8_K with iscale = -127/max, q = min(127, rint(iscale x)), f32 d = 1/iscale, bsums. */
void kiln_ggml_quantize_q8_0(const float *x, kiln_block_q8_0 *y, int64_t k);
void kiln_ggml_quantize_q8_1(const float *x, kiln_block_q8_1 *y, int64_t k);
void kiln_ggml_quantize_q8_K(const float *x, kiln_block_q8_K *y, int64_t k);
/* Dispatches on act_dtype (Q8_0 / Q8_1 / Q8_K); KILN_ERR_INVALID_ARG when k is not a
 * multiple of its block, KILN_ERR_UNSUPPORTED for another dtype. */
kiln_status kiln_ggml_quantize_row(uint32_t act_dtype, const float *x, void *dst, int64_t k);
/* One dot product of a weight row (k elements of w_dtype, plain layout) with an
 * activation row quantized to kiln_ggml_vec_dot_type(w_dtype) (an array of those blocks,
 * aligned as their struct); *out gets the f32 result.
 * KILN_ERR_UNSUPPORTED for a dtype without a vec_dot type, INVALID_ARG for a bad k. */
kiln_status kiln_ggml_vec_dot(uint32_t w_dtype, const void *w_row, const void *act_row, int64_t k,
                              float *out);
/* The matmul of kernel.h in ggml numerics: quantizes every row of x (once per call),
 * then y[t][n] = vec_dot(W[n], xq[t]) + bias[n]; rows of W split over the pool, so the
 * result is deterministic and batch invariant. Quantized weights in the plain layout
 * only (UNSUPPORTED otherwise); allocates the quantized rows (NOMEM). */
kiln_status kiln_ref_matmul_ggml(const kiln_kctx *c, const kiln_matmul_args *a);
/* Attention as llama.cpp computes it without flash attention: q, K and V rounded to f16
 * (ggml's KV cache type and the f16 vec_dot type of its K x Q and V x P products) and
 * the softmax probabilities rounded to f16 before P x V; scores, softmax and sums in f32
 * as kiln_ref_attention. Both KV dtypes (an f32 cache is rounded on load). */
kiln_status kiln_ref_attention_ggml(const kiln_kctx *c, const kiln_attention_args *a);
/* GLU with ggml's GELU: GeGLU (tanh) looks the gate up in ggml's f16 table (the gate
 * rounded to f16, the GELU rounded to f16; exact outside (-10, 10)); SwiGLU and GeGLU
 * (erf) as kiln_ref_glu. */
kiln_status kiln_ref_glu_ggml(const kiln_kctx *c, const kiln_glu_args *a);

#endif /* KILN_KERNELS_REF_REF_H */
