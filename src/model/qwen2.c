/*
 * qwen2.c — Qwen2 / Qwen2.5: the llama layout with biases on q, k and v, NEOX rope
 * (in GGUF and safetensors alike), SwiGLU.
 */
#include "model/model.h"

#include "kernels/kernel.h"

#include <math.h>

static kiln_status qwen2_configure(kiln_model *m, kiln_model_config *c, kiln_err *err) {
    KILN_TRY(kiln_meta_common(m, c, err));
    c->rope_mode = KILN_ROPE_NEOX;
    c->act = KILN_GLU_SWIGLU;
    c->qkv_bias = true;
    c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
    c->tied_embeddings = kiln_model_tensor(m, "output.weight") == NULL;
    return KILN_OK;
}

const kiln_family kiln_family_qwen2 = {"qwen2", qwen2_configure, kiln_decoder_compile};
