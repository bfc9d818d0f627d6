/*
 * llama.c — Llama 2/3.x, TinyLlama, Mistral 7B, SmolLM: GQA, RoPE (llama3 per-dim
 * factors from "rope_freqs.weight", linear or YaRN scaling from metadata), SwiGLU,
 * RMSNorm, tied or untied output. llama.cpp's GGUF converter permutes the q/k rows
 * for interleaved-pair (NORM) rope; HF safetensors keep the halves layout (NEOX).
 */
#include "model/model.h"

#include "kernels/kernel.h"

#include <math.h>

static kiln_status llama_configure(kiln_model *m, kiln_model_config *c, kiln_err *err) {
    KILN_TRY(kiln_meta_common(m, c, err));
    c->rope_mode = kiln_model_is_safetensors(m) ? KILN_ROPE_NEOX : KILN_ROPE_NORM;
    c->act = KILN_GLU_SWIGLU;
    c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
    c->tied_embeddings = kiln_model_tensor(m, "output.weight") == NULL;
    c->rope_freqs = kiln_model_tensor(m, "rope_freqs.weight") != NULL;
    return KILN_OK;
}

const kiln_family kiln_family_llama = {"llama", llama_configure, kiln_decoder_compile};
