/*
 * prov_ref.c — the "ref" provider: the scalar reference kernels of src/kernels/ref/
 * (one per op, every dtype). They are the registry's fallbacks: when no other kernel is
 * valid for a call site, selection uses these (docs/KERNELS.md).
 *
 * Weights: every dtype kiln_ref_weight_dtype_ok accepts (floats and the supported
 * quants). The kernels are deterministic and batch-invariant for any thread count
 * (ref.h).
 */
#include "kernels/ref/ref.h"
#include "kernels/registry.h"

#define REF_PROPS (KILN_KPROP_DETERMINISTIC | KILN_KPROP_BATCH_INVARIANT)
#define F32       KILN_DT(KILN_DTYPE_F32)
#define KV_DT     (KILN_DT(KILN_DTYPE_F32) | KILN_DT(KILN_DTYPE_F16))
#define ALL_ATTN_FEATS                                                                             \
    (KILN_KFEAT_GQA | KILN_KFEAT_SLIDING_WINDOW | KILN_KFEAT_SOFTCAP | KILN_KFEAT_PAGED_KV |       \
     KILN_KFEAT_CAUSAL)

static const kiln_kernel_spec ref_specs[] = {
    {.id = "ref.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "ref",
     .platform = KILN_PLATFORM_HOST,
     .w_dtypes = KILN_DT_FLOATS | KILN_DT_QUANTS,
     .act_dtypes = F32,
     .features = KILN_KFEAT_BIAS,
     .props = REF_PROPS,
     .priority = 10,
     .fn.matmul = kiln_ref_matmul,
     .summary = "scalar: dequantize a row, dot in f32"},
    /* "ggml numerics" (engine option numerics = "ggml"): valid only where the call site's
     * activation dtype is a q8 vec_dot type, which kselect.c sets in that mode alone */
    {.id = "ref.matmul_ggml",
     .op = KILN_KOP_MATMUL,
     .provider = "ref",
     .platform = KILN_PLATFORM_HOST,
     .w_dtypes = KILN_DT(KILN_DTYPE_Q4_0) | KILN_DT(KILN_DTYPE_Q4_1) | KILN_DT(KILN_DTYPE_Q5_0) |
                 KILN_DT(KILN_DTYPE_Q5_1) | KILN_DT(KILN_DTYPE_Q8_0) | KILN_DT(KILN_DTYPE_Q2_K) |
                 KILN_DT(KILN_DTYPE_Q3_K) | KILN_DT(KILN_DTYPE_Q4_K) | KILN_DT(KILN_DTYPE_Q5_K) |
                 KILN_DT(KILN_DTYPE_Q6_K),
     .act_dtypes = KILN_DT(KILN_DTYPE_Q8_0) | KILN_DT(KILN_DTYPE_Q8_1) | KILN_DT(KILN_DTYPE_Q8_K),
     .features = KILN_KFEAT_BIAS,
     .props = REF_PROPS,
     .priority = 10,
     .fn.matmul = kiln_ref_matmul_ggml,
     .summary = "llama.cpp's arithmetic: q8 activations, integer block dots"},
    {.id = "ref.embed",
     .op = KILN_KOP_EMBED,
     .provider = "ref",
     .platform = KILN_PLATFORM_HOST,
     .w_dtypes = KILN_DT_FLOATS | KILN_DT_QUANTS,
     .act_dtypes = F32,
     .props = REF_PROPS,
     .priority = 10,
     .fn.embed = kiln_ref_embed,
     .summary = "scalar row dequantize"},
    {.id = "ref.rms_norm",
     .op = KILN_KOP_RMS_NORM,
     .provider = "ref",
     .platform = KILN_PLATFORM_HOST,
     .w_dtypes = F32,
     .act_dtypes = F32,
     .features = KILN_KFEAT_RESIDUAL,
     .props = REF_PROPS,
     .priority = 10,
     .fn.rms_norm = kiln_ref_rms_norm,
     .summary = "scalar, f64 accumulation"},
    {.id = "ref.rope",
     .op = KILN_KOP_ROPE,
     .provider = "ref",
     .platform = KILN_PLATFORM_HOST,
     .act_dtypes = F32,
     .features = KILN_KFEAT_ROPE_NEOX | KILN_KFEAT_ROPE_YARN | KILN_KFEAT_ROPE_FREQS |
                 KILN_KFEAT_PARTIAL_ROT,
     .props = REF_PROPS,
     .priority = 10,
     .fn.rope = kiln_ref_rope,
     .summary = "scalar, both pairings, YaRN"},
    {.id = "ref.kv_write",
     .op = KILN_KOP_KV_WRITE,
     .provider = "ref",
     .platform = KILN_PLATFORM_HOST,
     .act_dtypes = F32,
     .kv_dtypes = KV_DT,
     .features = KILN_KFEAT_PAGED_KV,
     .props = REF_PROPS,
     .priority = 10,
     .fn.kv_write = kiln_ref_kv_write,
     .summary = "scalar copy into paged blocks"},
    {.id = "ref.attention",
     .op = KILN_KOP_ATTENTION,
     .provider = "ref",
     .platform = KILN_PLATFORM_HOST,
     .act_dtypes = F32,
     .kv_dtypes = KV_DT,
     .features = ALL_ATTN_FEATS,
     .props = REF_PROPS,
     .priority = 10,
     .fn.attention = kiln_ref_attention,
     .summary = "scalar two-pass softmax over the paged cache"},
    {.id = "ref.attention_ggml", /* numerics "ggml": act f16 at the call site */
     .op = KILN_KOP_ATTENTION,
     .provider = "ref",
     .platform = KILN_PLATFORM_HOST,
     .act_dtypes = KILN_DT(KILN_DTYPE_F16),
     .kv_dtypes = KV_DT,
     .features = ALL_ATTN_FEATS,
     .props = REF_PROPS,
     .priority = 10,
     .fn.attention = kiln_ref_attention_ggml,
     .summary = "llama.cpp's arithmetic: f16 q, k, v and probabilities"},
    {.id = "ref.glu",
     .op = KILN_KOP_GLU,
     .provider = "ref",
     .platform = KILN_PLATFORM_HOST,
     .act_dtypes = F32,
     .features = KILN_KFEAT_GEGLU,
     .props = REF_PROPS,
     .priority = 10,
     .fn.glu = kiln_ref_glu,
     .summary = "scalar SwiGLU / GeGLU"},
    {.id = "ref.glu_ggml", /* numerics "ggml": act f16 at the call site */
     .op = KILN_KOP_GLU,
     .provider = "ref",
     .platform = KILN_PLATFORM_HOST,
     .act_dtypes = KILN_DT(KILN_DTYPE_F16),
     .features = KILN_KFEAT_GEGLU,
     .props = REF_PROPS,
     .priority = 10,
     .fn.glu = kiln_ref_glu_ggml,
     .summary = "llama.cpp's arithmetic: GELU from its f16 table"},
    {.id = "ref.add",
     .op = KILN_KOP_ADD,
     .provider = "ref",
     .platform = KILN_PLATFORM_HOST,
     .act_dtypes = F32,
     .props = REF_PROPS,
     .priority = 10,
     .fn.add = kiln_ref_add,
     .summary = "scalar"},
};

const kiln_provider kiln_provider_ref = {
    .name = "ref",
    .summary = "scalar reference kernels (the oracle and the fallbacks)",
    .specs = ref_specs,
    .n_specs = (int)(sizeof ref_specs / sizeof ref_specs[0]),
    .probe = NULL,
    .fallback = true,
};
