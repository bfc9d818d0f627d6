/*
 * cpu_kernels.h — kiln's own SIMD + threaded CPU kernels (the `cpu` backend's kernels),
 * implementing the ABI of kernels/kernel.h. Every function here exists in an AVX-512
 * flavour (F/BW/VL/DQ + VNNI; needs kiln_cpu_avx512_ok()) and an AVX2 flavour (AVX2 +
 * FMA + F16C; needs kiln_cpu_avx2_ok()); calling one on a CPU without its ISA is a
 * programming error (the registry checks the spec's ISA bits first).
 *
 * Threading: kernels split their work over kctx->pool (both cores busy on every op;
 * output rows are split on 16-float boundaries so no two threads write one cache line).
 * Scratch: kernels use kctx->scratch when it is at least the size the matching
 * *_workspace() function reports, and otherwise allocate (and free) their own; an
 * allocation failure returns KILN_ERR_NOMEM.
 *
 * matmul: w_dtype f32, f16, bf16 (f32 activations, exact widening) or q4_0, q4_1,
 * q5_0, q5_1, q8_0, q4_K, q5_K, q6_K (activations quantized per 32 to int8 on the fly,
 * integer dot products; see qblocks.h). w_layout must be 0 (plain ggml rows).
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

#endif /* KILN_KERNELS_CPU_CPU_KERNELS_H */
