/*
 * prov_cpu.c — the "cpu" provider: kiln's own SIMD matmul kernels (src/kernels/cpu/).
 *
 * Written by the orchestration side against cpu_kernels.h so that selection sees the fast
 * CPU kernels as soon as they exist; the cpu kernels' owner extends it (more ops,
 * repacked layouts). Quantized types quantize the activations per 32 to int8 on the fly
 * (cpu_kernels.h), float types widen exactly. Both are deterministic for a given thread
 * count; batch invariance is not claimed (decode and prefill take different paths).
 */
#include "base/cpu.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/registry.h"
#include "kernels/select.h"

#define CPU_DTYPES                                                                                 \
    (KILN_DT_FLOATS | KILN_DT(KILN_DTYPE_Q4_0) | KILN_DT(KILN_DTYPE_Q4_1) |                        \
     KILN_DT(KILN_DTYPE_Q5_0) | KILN_DT(KILN_DTYPE_Q5_1) | KILN_DT(KILN_DTYPE_Q8_0) |              \
     KILN_DT(KILN_DTYPE_Q4_K) | KILN_DT(KILN_DTYPE_Q5_K) | KILN_DT(KILN_DTYPE_Q6_K))
#define ISA_AVX2 (KILN_ISA_AVX2 | KILN_ISA_FMA | KILN_ISA_F16C)
#define ISA_AVX512                                                                                 \
    (ISA_AVX2 | KILN_ISA_AVX512F | KILN_ISA_AVX512BW | KILN_ISA_AVX512VL | KILN_ISA_AVX512DQ |     \
     KILN_ISA_AVX512VNNI)

/* The kernels' scratch grows with the thread count; the context does not carry it, so
 * this assumes the largest pool kiln makes by default (one thread per online CPU). */
static size_t cpu_matmul_ws(const kiln_sel_ctx *c) {
    int nth = kiln_cpu_info()->logical_cores;
    return kiln_cpu_matmul_workspace(c->w_dtype, c->n, c->k, c->tokens_max, nth > 0 ? nth : 1);
}

static const kiln_kernel_spec cpu_specs[] = {
    {.id = "cpu.avx512.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "cpu",
     .platform = KILN_PLATFORM_HOST,
     .isa = ISA_AVX512,
     .w_dtypes = CPU_DTYPES,
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .k_multiple = 32,
     .features = KILN_KFEAT_BIAS,
     .props = KILN_KPROP_DETERMINISTIC,
     .workspace = cpu_matmul_ws,
     .priority = 90,
     .fn.matmul = kiln_cpu_matmul_avx512,
     .summary = "AVX-512 VNNI: int8 activations x quant blocks, threaded over rows"},
    {.id = "cpu.avx2.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "cpu",
     .platform = KILN_PLATFORM_HOST,
     .isa = ISA_AVX2,
     .w_dtypes = CPU_DTYPES,
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .k_multiple = 32,
     .features = KILN_KFEAT_BIAS,
     .props = KILN_KPROP_DETERMINISTIC,
     .workspace = cpu_matmul_ws,
     .priority = 80,
     .fn.matmul = kiln_cpu_matmul_avx2,
     .summary = "AVX2 + FMA: int8 activations x quant blocks, threaded over rows"},
};

const kiln_provider kiln_provider_cpu = {
    .name = "cpu",
    .summary = "kiln's own SIMD + threaded CPU kernels",
    .specs = cpu_specs,
    .n_specs = (int)(sizeof cpu_specs / sizeof cpu_specs[0]),
};
