/*
 * cpu_fused.h — the CPU backend's fused kernels (kernel.h ABI: matmul_group, rope_kv,
 * matmul_argmax). Why they exist: a decode step is ~10 kernel calls per layer and each
 * threaded call is one pool dispatch (wake the workers, wait for the slowest); fusing
 * calls that read the same input removes dispatches and passes (docs/CPU.md, "Fused
 * kernels").
 *
 *  matmul_group   members whose kernel (fn[m]) is this ISA's own matmul entry point
 *                 (kiln_cpu_matmul_avx512 / _avx2, any weight layout those read) are
 *                 computed with the same row loops as that kernel, so bitwise the same
 *                 result: activations quantized once for all of them, the rows of all
 *                 of them handed out in one pool dispatch. Other members (another
 *                 kernel, another x) are called through fn[m]. With glu, when both
 *                 members fuse and glu_fn is this ISA's glu kernel, each row chunk of
 *                 gate and up gets its activation right after it is computed (same
 *                 vector code as the glu kernel, so again bitwise equal); otherwise
 *                 glu_fn runs after the matmuls.
 *  matmul_argmax  when fn is this ISA's matmul entry point: row chunks of 256 (a
 *                 multiple of 16) computed into a per-thread buffer and reduced to
 *                 (key, raw, id) per token at once; threads merged by (key, lowest id).
 *                 Same logits as fn, so the same pick as fn + softcap + the greedy
 *                 sampler. Otherwise fn into a temporary and a scan.
 *  rope_kv        scalar: per token the sin/cos once, q rotated in place, k rotated
 *                 and written (f16 or f32) straight into the cache with v.
 * Scratch: allocated per call (freed before returning; KILN_ERR_NOMEM on failure)
 * unless kctx->scratch is big enough. The rope_kv kernel never allocates.
 */
#ifndef KILN_KERNELS_CPU_CPU_FUSED_H
#define KILN_KERNELS_CPU_CPU_FUSED_H

#include "kernels/kernel.h"

kiln_status kiln_cpu_matmul_group_avx512(const kiln_kctx *c, const kiln_matmul_group_args *a);
kiln_status kiln_cpu_matmul_group_avx2(const kiln_kctx *c, const kiln_matmul_group_args *a);
kiln_status kiln_cpu_matmul_argmax_avx512(const kiln_kctx *c, const kiln_matmul_argmax_args *a);
kiln_status kiln_cpu_matmul_argmax_avx2(const kiln_kctx *c, const kiln_matmul_argmax_args *a);
kiln_status kiln_cpu_rope_kv(const kiln_kctx *c, const kiln_rope_kv_args *a);

#endif /* KILN_KERNELS_CPU_CPU_FUSED_H */
