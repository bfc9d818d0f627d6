/*
 * gemma3.c — Gemma 3 (text): embeddings scaled by sqrt(n_embd), RMS norms before and
 * after attention and FFN, per-head RMS norm of q and k, GeGLU (tanh GELU),
 * interleaved sliding-window and global layers (every sliding_window_pattern-th layer
 * is global; sliding layers use rope.freq_base_swa, default 10000), NEOX rope, tied
 * embeddings. Norm weights are 1 + w (GGUF stores them so; the format layer adds the
 * one to HF safetensors weights), so no offset. Attention scale as in llama.cpp: 1/sqrt(head
 * dim), except the 62-layer (27B) model, 1/sqrt(n_embd / n_head); a
 * "%s.attention.query_pre_attn_scalar" key (from config.json) overrides it.
 */
#include "model/model.h"

#include "kernels/kernel.h"

#include <math.h>

static kiln_status gemma3_configure(kiln_model *m, kiln_model_config *c, kiln_err *err) {
    KILN_TRY(kiln_meta_common(m, c, err));
    c->rope_mode = KILN_ROPE_NEOX;
    c->embed_scale = sqrtf((float)c->n_embd);
    c->act = KILN_GLU_GEGLU_TANH;
    c->post_norms = true;
    c->qk_norm = true;
    c->norm_w_offset = 0.0f; /* the model file presents HF norms as 1 + w too */
    c->tied_embeddings = kiln_model_tensor(m, "output.weight") == NULL;
    c->attn_scale = c->n_layer == 62 ? 1.0f / sqrtf((float)c->n_embd / (float)c->n_head)
                                     : 1.0f / sqrtf((float)c->head_dim);
    float qpas = 0;
    KILN_TRY(kiln_meta_f32_opt(m, "%s.attention.query_pre_attn_scalar", &qpas, err));
    if (qpas > 0) c->attn_scale = 1.0f / sqrtf(qpas);
    KILN_TRY(kiln_meta_f32_opt(m, "%s.final_logit_softcapping", &c->final_softcap, err));
    KILN_TRY(kiln_meta_f32_opt(m, "%s.attn_logit_softcapping", &c->attn_softcap, err));
    int32_t window = 0, pattern = 6;
    float base_swa = 10000.0f;
    KILN_TRY(kiln_meta_i32_opt(m, "%s.attention.sliding_window", &window, err));
    KILN_TRY(kiln_meta_i32_opt(m, "%s.attention.sliding_window_pattern", &pattern, err));
    KILN_TRY(kiln_meta_f32_opt(m, "%s.rope.freq_base_swa", &base_swa, err));
    if (window < 0 || pattern < 0)
        return kiln_err_set(err, KILN_ERR_RANGE, "%s: sliding window %d / pattern %d", m->path,
                            (int)window, (int)pattern);
    for (int l = 0; l < c->n_layer; l++) {
        bool swa = window > 0 && (pattern == 0 || l % pattern < pattern - 1);
        c->layer_window[l] = swa ? window : 0;
        c->layer_rope_base[l] = swa ? base_swa : c->rope_base;
        c->layer_rope_scale[l] = swa ? 1.0f : c->rope_freq_scale;
    }
    return KILN_OK;
}

const kiln_family kiln_family_gemma3 = {"gemma3", gemma3_configure, kiln_decoder_compile};
