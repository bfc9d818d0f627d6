/*
 * qwen3.c — Qwen3 (dense): no q/k/v biases, per-head RMS norm of q and k before rope,
 * NEOX rope, SwiGLU, head_dim from attention.key_length (128, not n_embd / n_head).
 */
#include "model/model.h"

#include "kernels/kernel.h"

#include <math.h>

static kiln_status qwen3_configure(kiln_model *m, kiln_model_config *c, kiln_err *err) {
    KILN_TRY(kiln_meta_common(m, c, err));
    c->rope_mode = KILN_ROPE_NEOX;
    c->act = KILN_GLU_SWIGLU;
    c->qk_norm = true;
    c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
    c->tied_embeddings = kiln_model_tensor(m, "output.weight") == NULL;
    return KILN_OK;
}

const kiln_family kiln_family_qwen3 = {"qwen3", qwen3_configure, kiln_decoder_compile};
