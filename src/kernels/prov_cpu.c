/*
 * prov_cpu.c — the "cpu" provider: kiln's own SIMD + threaded kernels (src/kernels/cpu/,
 * docs/CPU.md), one spec per ISA flavour, so a CPU without AVX-512 gets the AVX2 kernels
 * (the AVX-512 ones are rejected with ISA_MISSING, which `kiln explain` prints).
 *
 * matmul: quantized types quantize the activations per 32 to int8 on the fly
 * (cpu_kernels.h), float types widen exactly; deterministic for a given thread count.
 * The plain-layout kernels are not batch-invariant (decode and prefill sum in different
 * orders); the R16 kernels are (a token's row is computed the same way for any t).
 * cpu.avx512.matmul.r16 and cpu.avx2.matmul.r16 ask for the R16 layout
 * (KILN_WLAYOUT_CPU_R16; every quantized type): their entry points also accept plain rows
 * (w_layout 0), so a binding that cannot repack yet still runs.
 */
#include "base/cpu.h"
#include "kernels/cpu/cpu_fused.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_ops.h"
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
/* (kiln_cpu_matmul_workspace clamps an unbounded bucket, tokens_max INT64_MAX, to
 * INT32_MAX tokens: no step is larger, and the sizes stay in range) */

#define R16_DTYPES (CPU_DTYPES & ~KILN_DT_FLOATS) /* every quantized type of the cpu kernels */
/* AVX2 R16 for every quantized type. Until session 3 its decode unpacked each unit into an
 * L1 buffer first and q8_0 / q6_K stayed on plain rows by default (cpu.avx2.matmul.r16.opt,
 * priority 75); decode now runs register resident (matmul_r16_avx2.c) and measured faster
 * than or equal to the plain rows for both (bench_cpu_matmul -t 1 -m 6: q8_0 23.1 vs 12.5
 * GB/s, q6_K 10.2 vs 10.3), with faster prefill (docs/CPU.md). */
#define R16_DTYPES_AVX2 R16_DTYPES
#define F32             KILN_DT(KILN_DTYPE_F32)
#define KV_DT           (KILN_DT(KILN_DTYPE_F32) | KILN_DT(KILN_DTYPE_F16))
#define PROPS           (KILN_KPROP_DETERMINISTIC | KILN_KPROP_BATCH_INVARIANT)
#define ATTN_FEATS                                                                                 \
    (KILN_KFEAT_GQA | KILN_KFEAT_SLIDING_WINDOW | KILN_KFEAT_SOFTCAP | KILN_KFEAT_PAGED_KV |       \
     KILN_KFEAT_CAUSAL)

/* One spec per (op, ISA) for the element-wise and attention kernels. */
#define OP_SPEC(ID, OP, ISA, FIELD, FN, PRIO, FEATS, SUMMARY)                                      \
    {                                                                                              \
        .id = ID, .op = OP, .provider = "cpu", .platform = KILN_PLATFORM_HOST, .isa = ISA,         \
        .w_dtypes = F32, .act_dtypes = F32, .kv_dtypes = KV_DT, .features = FEATS, .props = PROPS, \
        .priority = PRIO, .fn.FIELD = FN, .summary = SUMMARY                                       \
    }

static const kiln_kernel_spec cpu_specs[] = {
    {.id = "cpu.avx512.matmul.r16",
     .op = KILN_KOP_MATMUL,
     .provider = "cpu",
     .platform = KILN_PLATFORM_HOST,
     .isa = ISA_AVX512,
     .w_dtypes = R16_DTYPES,
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .k_multiple = 32,
     .features = KILN_KFEAT_BIAS,
     .props = PROPS,
     .workspace = cpu_matmul_ws,
     .priority = 95,
     .w_layout = KILN_WLAYOUT_CPU_R16,
     .fn.matmul = kiln_cpu_matmul_avx512,
     .summary = "AVX-512 VNNI on 16-row interleaved blocks (R16 repack): 16 rows per vpdpbusd"},
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
    {.id = "cpu.avx512bf16.matmul.f16",
     .op = KILN_KOP_MATMUL,
     .provider = "cpu",
     .platform = KILN_PLATFORM_HOST,
     .isa = ISA_AVX512 | KILN_ISA_AVX512BF16,
     .w_dtypes = KILN_DT(KILN_DTYPE_F16) | KILN_DT(KILN_DTYPE_BF16),
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .k_multiple = 32,
     .features = KILN_KFEAT_BIAS,
     .props = KILN_KPROP_DETERMINISTIC,
     .workspace = cpu_matmul_ws,
     .priority = 40,
     .fn.matmul = kiln_cpu_matmul_avx512_bf16,
     .summary = "AVX512-BF16 vdpbf16ps prefill for f16/bf16 weights (bf16-rounded: opt-in)"},
    {.id = "cpu.avx2.matmul.r16",
     .op = KILN_KOP_MATMUL,
     .provider = "cpu",
     .platform = KILN_PLATFORM_HOST,
     .isa = ISA_AVX2,
     .w_dtypes = R16_DTYPES_AVX2,
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .k_multiple = 32,
     .features = KILN_KFEAT_BIAS,
     .props = PROPS,
     .workspace = cpu_matmul_ws,
     .priority = 85,
     .w_layout = KILN_WLAYOUT_CPU_R16,
     .fn.matmul = kiln_cpu_matmul_avx2,
     .summary = "AVX2 maddubs on 16-row interleaved blocks (R16 repack): 8 rows per vpmaddubsw"},
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
    {.id = "cpu.embed",
     .op = KILN_KOP_EMBED,
     .provider = "cpu",
     .platform = KILN_PLATFORM_HOST,
     .w_dtypes = CPU_DTYPES,
     .act_dtypes = F32,
     .props = PROPS,
     .priority = 50,
     .fn.embed = kiln_cpu_embed,
     .summary = "row dequantize, threaded over tokens"},
    {.id = "cpu.rope",
     .op = KILN_KOP_ROPE,
     .provider = "cpu",
     .platform = KILN_PLATFORM_HOST,
     .act_dtypes = F32,
     .features = KILN_KFEAT_ROPE_NEOX | KILN_KFEAT_ROPE_YARN | KILN_KFEAT_ROPE_FREQS |
                 KILN_KFEAT_PARTIAL_ROT,
     .props = PROPS,
     .priority = 50,
     .fn.rope = kiln_cpu_rope,
     .summary = "sin/cos once per token for all heads, threaded over tokens"},
    {.id = "cpu.kv_write",
     .op = KILN_KOP_KV_WRITE,
     .provider = "cpu",
     .platform = KILN_PLATFORM_HOST,
     .act_dtypes = F32,
     .kv_dtypes = KV_DT,
     .features = KILN_KFEAT_PAGED_KV,
     .props = PROPS,
     .priority = 50,
     .fn.kv_write = kiln_cpu_kv_write,
     .summary = "copy / f16 convert into paged blocks, threaded over tokens"},
    OP_SPEC("cpu.avx512.rms_norm", KILN_KOP_RMS_NORM, ISA_AVX512, rms_norm,
            kiln_cpu_rms_norm_avx512, 90, KILN_KFEAT_RESIDUAL, "AVX-512, fused residual add"),
    OP_SPEC("cpu.avx2.rms_norm", KILN_KOP_RMS_NORM, ISA_AVX2, rms_norm, kiln_cpu_rms_norm_avx2, 80,
            KILN_KFEAT_RESIDUAL, "AVX2, fused residual add"),
    OP_SPEC("cpu.avx512.add", KILN_KOP_ADD, ISA_AVX512, add, kiln_cpu_add_avx512, 90, 0, "AVX-512"),
    OP_SPEC("cpu.avx2.add", KILN_KOP_ADD, ISA_AVX2, add, kiln_cpu_add_avx2, 80, 0, "AVX2"),
    OP_SPEC("cpu.avx512.glu", KILN_KOP_GLU, ISA_AVX512, glu, kiln_cpu_glu_avx512, 90,
            KILN_KFEAT_GEGLU, "AVX-512 SwiGLU / GeGLU (vector exp, tanh, erf)"),
    OP_SPEC("cpu.avx2.glu", KILN_KOP_GLU, ISA_AVX2, glu, kiln_cpu_glu_avx2, 80, KILN_KFEAT_GEGLU,
            "AVX2 SwiGLU / GeGLU (vector exp, tanh, erf)"),
    OP_SPEC("cpu.avx512.attention", KILN_KOP_ATTENTION, ISA_AVX512, attention,
            kiln_cpu_attention_avx512, 90, ATTN_FEATS,
            "AVX-512 flash-style over paged KV: token tiles x KV head, online softmax, split-K "
            "decode"),
    OP_SPEC("cpu.avx2.attention", KILN_KOP_ATTENTION, ISA_AVX2, attention, kiln_cpu_attention_avx2,
            80, ATTN_FEATS,
            "AVX2 flash-style over paged KV: token tiles x KV head, online softmax, split-K "
            "decode"),
    /* fused kernels (cpu_fused.h): members / the LM head this ISA's matmul would run are
     * computed in one pass; anything else goes through the member's own kernel */
    {.id = "cpu.avx512.matmul_group",
     .op = KILN_KOP_MATMUL_GROUP,
     .provider = "cpu",
     .platform = KILN_PLATFORM_HOST,
     .isa = ISA_AVX512,
     .w_dtypes = KILN_DT_FLOATS | KILN_DT_QUANTS,
     .act_dtypes = F32,
     .features = KILN_KFEAT_BIAS | KILN_KFEAT_GEGLU,
     .props = KILN_KPROP_DETERMINISTIC,
     .priority = 90,
     .fn.matmul_group = kiln_cpu_matmul_group_avx512,
     .summary = "q/k/v or gate/up (+ glu) in one pool dispatch, activations quantized once"},
    {.id = "cpu.avx2.matmul_group",
     .op = KILN_KOP_MATMUL_GROUP,
     .provider = "cpu",
     .platform = KILN_PLATFORM_HOST,
     .isa = ISA_AVX2,
     .w_dtypes = KILN_DT_FLOATS | KILN_DT_QUANTS,
     .act_dtypes = F32,
     .features = KILN_KFEAT_BIAS | KILN_KFEAT_GEGLU,
     .props = KILN_KPROP_DETERMINISTIC,
     .priority = 80,
     .fn.matmul_group = kiln_cpu_matmul_group_avx2,
     .summary = "q/k/v or gate/up (+ glu) in one pool dispatch, activations quantized once"},
    {.id = "cpu.avx512.matmul_argmax",
     .op = KILN_KOP_MATMUL_ARGMAX,
     .provider = "cpu",
     .platform = KILN_PLATFORM_HOST,
     .isa = ISA_AVX512,
     .w_dtypes = KILN_DT_FLOATS | KILN_DT_QUANTS,
     .act_dtypes = F32,
     .props = KILN_KPROP_DETERMINISTIC,
     .priority = 90,
     .fn.matmul_argmax = kiln_cpu_matmul_argmax_avx512,
     .summary = "LM head reduced to the greedy token per 256-row chunk (no logits stored)"},
    {.id = "cpu.avx2.matmul_argmax",
     .op = KILN_KOP_MATMUL_ARGMAX,
     .provider = "cpu",
     .platform = KILN_PLATFORM_HOST,
     .isa = ISA_AVX2,
     .w_dtypes = KILN_DT_FLOATS | KILN_DT_QUANTS,
     .act_dtypes = F32,
     .props = KILN_KPROP_DETERMINISTIC,
     .priority = 80,
     .fn.matmul_argmax = kiln_cpu_matmul_argmax_avx2,
     .summary = "LM head reduced to the greedy token per 256-row chunk (no logits stored)"},
    {.id = "cpu.rope_kv",
     .op = KILN_KOP_ROPE_KV,
     .provider = "cpu",
     .platform = KILN_PLATFORM_HOST,
     .act_dtypes = F32,
     .kv_dtypes = KV_DT,
     .features = KILN_KFEAT_ROPE_NEOX | KILN_KFEAT_ROPE_YARN | KILN_KFEAT_ROPE_FREQS |
                 KILN_KFEAT_PARTIAL_ROT | KILN_KFEAT_PAGED_KV,
     .props = PROPS,
     .priority = 50,
     .fn.rope_kv = kiln_cpu_rope_kv,
     .summary = "rope of q and k with the k/v write into the paged cache in one pass"},
};

const kiln_provider kiln_provider_cpu = {
    .name = "cpu",
    .summary = "kiln's own SIMD + threaded CPU kernels",
    .specs = cpu_specs,
    .n_specs = (int)(sizeof cpu_specs / sizeof cpu_specs[0]),
};
