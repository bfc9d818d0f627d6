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
    if (!c->rope_freqs && c->llama3_factor > 0) {
        /* HF config "rope_type": "llama3": compute the factors llama.cpp's converter
         * stores as rope_freqs.weight */
        float lo = 1.0f, hi = 4.0f;
        int32_t old_ctx = 8192;
        KILN_TRY(kiln_meta_f32_opt(m, "%s.rope.scaling.low_freq_factor", &lo, err));
        KILN_TRY(kiln_meta_f32_opt(m, "%s.rope.scaling.high_freq_factor", &hi, err));
        KILN_TRY(kiln_meta_i32_opt(m, "%s.rope.scaling.original_context_length", &old_ctx, err));
        if (!(hi > lo) || old_ctx <= 0)
            return kiln_err_set(err, KILN_ERR_RANGE,
                                "%s: llama3 rope scaling: low %g high %g context %d", m->path,
                                (double)lo, (double)hi, (int)old_ctx);
        int n = c->n_rot / 2;
        float *f = kiln_arena_alloc(&m->arena, sizeof(float) * (size_t)(n > 0 ? n : 1));
        if (!f) return kiln_err_set(err, KILN_ERR_NOMEM, "%s: out of memory", m->path);
        const double lo_wl = old_ctx / lo, hi_wl = old_ctx / hi;
        for (int i = 0; i < n; i++) {
            double freq = 1.0 / pow(c->rope_base, (2.0 * i) / c->n_rot), wl = 2 * M_PI / freq;
            if (wl < hi_wl)
                f[i] = 1.0f;
            else if (wl > lo_wl)
                f[i] = c->llama3_factor;
            else {
                double smooth = (old_ctx / wl - lo) / (hi - lo);
                f[i] = (float)(1.0 / ((1 - smooth) / c->llama3_factor + smooth));
            }
        }
        kiln_tensor t = {.name = "rope_freqs.weight",
                         .data = f,
                         .dtype = 0,
                         .rank = 1,
                         .shape = {n, 1, 1, 1},
                         .nbytes = sizeof(float) * (size_t)n};
        KILN_TRY(kiln_model_add_tensor(m, &t, err));
        c->rope_freqs = true;
    }
    return KILN_OK;
}

const kiln_family kiln_family_llama = {"llama", llama_configure, kiln_decoder_compile};
