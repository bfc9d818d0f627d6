/*
 * decoder.c — the shared plan builder for decoder-only transformers (llama, qwen2,
 * qwen3, gemma3 and anything shaped like them), plus the family registry helpers.
 *
 * The builder emits, per layer:
 *   h = rms_norm(x, attn_norm); a = attention(h); [a = rms_norm(a, post_attention_norm)]
 *   x = x + a; h = rms_norm(x, ffn_norm); f = ffn(h); [f = rms_norm(f, post_ffw_norm)]
 *   x = x + f
 * between an embed and a final rms_norm + lm_head. Model-level pieces map to opcodes
 * through kiln_opmap (plan/opmap.h), the one place that ties them together.
 */
#include "model/model.h"
#include "base/mem.h"

#include "kernels/kernel.h"
#include "plan/opmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kiln_model_config_defaults(kiln_model_config *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->norm_eps = 1e-5f;
    cfg->rope_mode = KILN_ROPE_NORM;
    cfg->rope_base = 10000.0f;
    cfg->rope_freq_scale = 1.0f;
    cfg->attn_factor = 1.0f;
    cfg->beta_fast = 32.0f;
    cfg->beta_slow = 1.0f;
    cfg->embed_scale = 1.0f;
    cfg->act = KILN_GLU_SWIGLU;
    cfg->bos_id = cfg->eos_id = cfg->eot_id = -1;
}

typedef struct builder {
    kiln_plan *p;
    const kiln_model_config *c;
    kiln_err *err;
} builder;

static kiln_status weight(builder *b, const char *name, kiln_wclass wc, int rank, int64_t d0,
                          int64_t d1, uint32_t *out) {
    int64_t shape[4] = {d0, d1, 1, 1};
    return kiln_plan_weight(b->p, name, wc, rank, shape, out, b->err);
}

static kiln_status layer_weight(builder *b, int l, const char *what, kiln_wclass wc, int rank,
                                int64_t d0, int64_t d1, uint32_t *out) {
    char name[KILN_WEIGHT_NAME_MAX];
    snprintf(name, sizeof(name), "blk.%d.%s", l, what);
    return weight(b, name, wc, rank, d0, d1, out);
}

static kiln_status norm(builder *b, uint16_t x, int l, const char *wname, uint32_t width,
                        uint16_t *out) {
    kiln_insn in = kiln_insn_make(kiln_opmap(KILN_MOP_NORM));
    uint32_t w;
    if (l >= 0)
        KILN_TRY(layer_weight(b, l, wname, KILN_WCLASS_VECTOR, 1, width, 0, &w));
    else
        KILN_TRY(weight(b, wname, KILN_WCLASS_VECTOR, 1, width, 0, &w));
    kiln_params prm = {.norm = {.eps = b->c->norm_eps, .w_offset = b->c->norm_w_offset}};
    kiln_param_block pb;
    KILN_TRY(kiln_param_encode(KILN_OP_RMS_NORM, &prm, &pb, b->err));
    KILN_TRY(kiln_plan_param(b->p, &pb, &in.param, b->err));
    KILN_TRY(kiln_plan_reg(b->p, width, KILN_ROWS_TOKENS, out, b->err));
    in.w[KILN_W_NORM] = w;
    in.n_in = 1;
    in.in[0] = x;
    in.n_out = 1;
    in.out[0] = *out;
    in.layer = l;
    return kiln_plan_emit(b->p, &in, b->err);
}

static kiln_status residual(builder *b, uint16_t x, uint16_t y, int l, uint16_t *out) {
    kiln_insn in = kiln_insn_make(kiln_opmap(KILN_MOP_RESIDUAL));
    KILN_TRY(kiln_plan_reg(b->p, (uint32_t)b->c->n_embd, KILN_ROWS_TOKENS, out, b->err));
    in.n_in = 2;
    in.in[0] = x;
    in.in[1] = y;
    in.n_out = 1;
    in.out[0] = *out;
    in.layer = l;
    return kiln_plan_emit(b->p, &in, b->err);
}

static kiln_status attention(builder *b, uint16_t x, int l, uint16_t *out) {
    const kiln_model_config *c = b->c;
    kiln_insn in = kiln_insn_make(kiln_opmap(KILN_MOP_SELF_ATTENTION));
    const int64_t E = c->n_embd, qd = (int64_t)c->n_head * c->head_dim,
                  kvd = (int64_t)c->n_kv_head * c->head_dim;
    KILN_TRY(
        layer_weight(b, l, "attn_q.weight", KILN_WCLASS_MATRIX, 2, E, qd, &in.w[KILN_W_ATT_Q]));
    KILN_TRY(
        layer_weight(b, l, "attn_k.weight", KILN_WCLASS_MATRIX, 2, E, kvd, &in.w[KILN_W_ATT_K]));
    KILN_TRY(
        layer_weight(b, l, "attn_v.weight", KILN_WCLASS_MATRIX, 2, E, kvd, &in.w[KILN_W_ATT_V]));
    KILN_TRY(layer_weight(b, l, "attn_output.weight", KILN_WCLASS_MATRIX, 2, qd, E,
                          &in.w[KILN_W_ATT_O]));
    if (c->qkv_bias) {
        KILN_TRY(
            layer_weight(b, l, "attn_q.bias", KILN_WCLASS_VECTOR, 1, qd, 0, &in.w[KILN_W_ATT_BQ]));
        KILN_TRY(
            layer_weight(b, l, "attn_k.bias", KILN_WCLASS_VECTOR, 1, kvd, 0, &in.w[KILN_W_ATT_BK]));
        KILN_TRY(
            layer_weight(b, l, "attn_v.bias", KILN_WCLASS_VECTOR, 1, kvd, 0, &in.w[KILN_W_ATT_BV]));
    }
    if (c->qk_norm) {
        KILN_TRY(layer_weight(b, l, "attn_q_norm.weight", KILN_WCLASS_VECTOR, 1, c->head_dim, 0,
                              &in.w[KILN_W_ATT_Q_NORM]));
        KILN_TRY(layer_weight(b, l, "attn_k_norm.weight", KILN_WCLASS_VECTOR, 1, c->head_dim, 0,
                              &in.w[KILN_W_ATT_K_NORM]));
    }
    if (c->rope_freqs)
        KILN_TRY(weight(b, "rope_freqs.weight", KILN_WCLASS_VECTOR, 1, c->n_rot / 2, 0,
                        &in.w[KILN_W_ATT_ROPE_FREQS]));
    kiln_params prm;
    memset(&prm, 0, sizeof(prm));
    kiln_attn_params *a = &prm.attn;
    a->n_head = c->n_head;
    a->n_kv_head = c->n_kv_head;
    a->head_dim = c->head_dim;
    a->n_rot = c->n_rot;
    a->rope_mode = c->rope_mode;
    a->rope_base = c->layer_rope_base[l] > 0 ? c->layer_rope_base[l] : c->rope_base;
    a->rope_freq_scale = c->layer_rope_scale[l] > 0 ? c->layer_rope_scale[l] : c->rope_freq_scale;
    a->ext_factor = c->ext_factor;
    a->attn_factor = c->attn_factor;
    a->beta_fast = c->beta_fast;
    a->beta_slow = c->beta_slow;
    a->n_ctx_orig = c->n_ctx_orig ? c->n_ctx_orig : c->n_ctx_train;
    a->scale = c->attn_scale;
    a->softcap = c->attn_softcap;
    a->window = c->layer_window[l];
    a->qk_norm_eps = c->norm_eps;
    a->qk_norm_offset = c->norm_w_offset;
    kiln_param_block pb;
    KILN_TRY(kiln_param_encode(KILN_OP_ATTENTION, &prm, &pb, b->err));
    KILN_TRY(kiln_plan_param(b->p, &pb, &in.param, b->err));
    kiln_state_desc sd = {.kind = KILN_STATE_KV,
                          .lifecycle = KILN_LIFE_ALL,
                          .n_kv_head = c->n_kv_head,
                          .head_dim = c->head_dim,
                          .layer = l};
    KILN_TRY(kiln_plan_state(b->p, &sd, &in.state, b->err));
    KILN_TRY(kiln_plan_reg(b->p, (uint32_t)E, KILN_ROWS_TOKENS, out, b->err));
    in.n_in = 1;
    in.in[0] = x;
    in.n_out = 1;
    in.out[0] = *out;
    in.layer = l;
    return kiln_plan_emit(b->p, &in, b->err);
}

static kiln_status ffn(builder *b, uint16_t x, int l, uint16_t *out) {
    const kiln_model_config *c = b->c;
    kiln_insn in = kiln_insn_make(kiln_opmap(KILN_MOP_GATED_FFN));
    KILN_TRY(layer_weight(b, l, "ffn_gate.weight", KILN_WCLASS_MATRIX, 2, c->n_embd, c->n_ff,
                          &in.w[KILN_W_FFN_GATE]));
    KILN_TRY(layer_weight(b, l, "ffn_up.weight", KILN_WCLASS_MATRIX, 2, c->n_embd, c->n_ff,
                          &in.w[KILN_W_FFN_UP]));
    KILN_TRY(layer_weight(b, l, "ffn_down.weight", KILN_WCLASS_MATRIX, 2, c->n_ff, c->n_embd,
                          &in.w[KILN_W_FFN_DOWN]));
    kiln_params prm = {.ffn = {.act = c->act}};
    kiln_param_block pb;
    KILN_TRY(kiln_param_encode(KILN_OP_FFN, &prm, &pb, b->err));
    KILN_TRY(kiln_plan_param(b->p, &pb, &in.param, b->err));
    KILN_TRY(kiln_plan_reg(b->p, (uint32_t)c->n_embd, KILN_ROWS_TOKENS, out, b->err));
    in.n_in = 1;
    in.in[0] = x;
    in.n_out = 1;
    in.out[0] = *out;
    in.layer = l;
    return kiln_plan_emit(b->p, &in, b->err);
}

kiln_status kiln_decoder_compile(const kiln_model_config *c, kiln_plan_mode mode, kiln_plan *p,
                                 kiln_err *err) {
    (void)mode; /* decoder-only: the same instructions; buffers are sized per mode */
    builder b = {p, c, err};
    const uint32_t E = (uint32_t)c->n_embd;
    uint16_t x, h, y;
    if (c->n_layer <= 0 || c->n_layer > KILN_MAX_LAYERS)
        return kiln_err_set(err, KILN_ERR_RANGE, "model: %d layers (1..%d supported)",
                            (int)c->n_layer, KILN_MAX_LAYERS);
    {
        kiln_insn in = kiln_insn_make(kiln_opmap(KILN_MOP_TOKEN_EMBED));
        KILN_TRY(weight(&b, "token_embd.weight", KILN_WCLASS_MATRIX, 2, E, c->n_vocab,
                        &in.w[KILN_W_EMBED_TABLE]));
        kiln_params prm = {.embed = {.scale = c->embed_scale}};
        kiln_param_block pb;
        KILN_TRY(kiln_param_encode(KILN_OP_EMBED, &prm, &pb, err));
        KILN_TRY(kiln_plan_param(p, &pb, &in.param, err));
        KILN_TRY(kiln_plan_reg(p, E, KILN_ROWS_TOKENS, &x, err));
        in.n_out = 1;
        in.out[0] = x;
        KILN_TRY(kiln_plan_emit(p, &in, err));
    }
    for (int l = 0; l < c->n_layer; l++) {
        KILN_TRY(norm(&b, x, l, "attn_norm.weight", E, &h));
        KILN_TRY(attention(&b, h, l, &y));
        if (c->post_norms) KILN_TRY(norm(&b, y, l, "post_attention_norm.weight", E, &y));
        KILN_TRY(residual(&b, x, y, l, &x));
        KILN_TRY(norm(&b, x, l, "ffn_norm.weight", E, &h));
        KILN_TRY(ffn(&b, h, l, &y));
        if (c->post_norms) KILN_TRY(norm(&b, y, l, "post_ffw_norm.weight", E, &y));
        KILN_TRY(residual(&b, x, y, l, &x));
    }
    KILN_TRY(norm(&b, x, -1, "output_norm.weight", E, &h));
    {
        kiln_insn in = kiln_insn_make(kiln_opmap(KILN_MOP_OUTPUT));
        KILN_TRY(weight(&b, c->tied_embeddings ? "token_embd.weight" : "output.weight",
                        KILN_WCLASS_MATRIX, 2, E, c->n_vocab, &in.w[KILN_W_LM_HEAD]));
        kiln_params prm = {.lm_head = {.softcap = c->final_softcap}};
        kiln_param_block pb;
        KILN_TRY(kiln_param_encode(KILN_OP_LM_HEAD, &prm, &pb, err));
        KILN_TRY(kiln_plan_param(p, &pb, &in.param, err));
        in.n_in = 1;
        in.in[0] = h;
        KILN_TRY(kiln_plan_emit(p, &in, err));
    }
    return KILN_OK;
}

const kiln_tensor *kiln_model_tensor(const kiln_model *m, const char *name) {
    for (int32_t i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

kiln_status kiln_model_from_tensors(const kiln_model_config *cfg, const kiln_tensor *tensors,
                                    int32_t n, kiln_model **out, kiln_err *err) {
    kiln_model *m = kiln_calloc(1, sizeof(*m));
    if (!m) return kiln_err_set(err, KILN_ERR_NOMEM, "model: out of memory");
    kiln_arena_init(&m->arena, 0);
    m->cfg = *cfg;
    m->family = kiln_family_find(cfg->arch);
    m->tensors = kiln_calloc((size_t)(n > 0 ? n : 1), sizeof(kiln_tensor));
    if (!m->tensors) {
        kiln_free(m);
        return kiln_err_set(err, KILN_ERR_NOMEM, "model: out of memory");
    }
    memcpy(m->tensors, tensors, (size_t)n * sizeof(kiln_tensor));
    m->n_tensors = n;
    snprintf(m->path, sizeof(m->path), "<memory>");
    *out = m;
    return KILN_OK;
}
