/*
 * load.c — opening a model: the format layer's model file -> tensor descriptions +
 * metadata -> the family's config. No tensor byte is touched here: a file tensor's
 * kiln_tensor has data == NULL (name, dtype, shape as stored; fixups such as HF Gemma's
 * w + 1 are the loader's). The engine's binding chooses kernels, derives the load
 * request and runs the load plan (src/load/, runtime/bind.c): the one path by which
 * weights reach a kernel.
 */
#include "model/model.h"
#include "base/mapguard.h"
#include "base/mem.h"

#include "format/dtype.h"
#include "format/model_file.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const kiln_meta *meta_of(const kiln_model *m) {
    return m->file ? kiln_model_file_meta((const kiln_model_file *)m->file) : NULL;
}

static void expand_key(const kiln_model *m, const char *key, char *out, size_t n) {
    if (strstr(key, "%s")) {
        /* keys are literals from the families: exactly one "%s" */
        const char *p = strstr(key, "%s");
        snprintf(out, n, "%.*s%s%s", (int)(p - key), key, m->cfg.arch, p + 2);
    } else {
        snprintf(out, n, "%s", key);
    }
}

static kiln_status meta_missing(const kiln_model *m, const char *key, kiln_err *err) {
    return kiln_err_set(err, KILN_ERR_NOT_FOUND, "%s: metadata key '%s' missing", m->path, key);
}

kiln_status kiln_meta_i32(const kiln_model *m, const char *key, int32_t *out, kiln_err *err) {
    char k[256];
    expand_key(m, key, k, sizeof(k));
    const kiln_meta *mt = meta_of(m);
    if (!mt || !kiln_meta_has(mt, k)) return meta_missing(m, k, err);
    kiln_status st = kiln_meta_get_i32(mt, k, out, err);
    return st ? kiln_err_wrap(err, st, "%s", m->path) : KILN_OK;
}

kiln_status kiln_meta_f32(const kiln_model *m, const char *key, float *out, kiln_err *err) {
    char k[256];
    expand_key(m, key, k, sizeof(k));
    const kiln_meta *mt = meta_of(m);
    if (!mt || !kiln_meta_has(mt, k)) return meta_missing(m, k, err);
    kiln_status st = kiln_meta_get_f32(mt, k, out, err);
    return st ? kiln_err_wrap(err, st, "%s", m->path) : KILN_OK;
}

kiln_status kiln_meta_i32_opt(const kiln_model *m, const char *key, int32_t *out, kiln_err *err) {
    char k[256];
    expand_key(m, key, k, sizeof(k));
    const kiln_meta *mt = meta_of(m);
    if (!mt || !kiln_meta_has(mt, k)) return KILN_OK;
    return kiln_meta_i32(m, key, out, err);
}

kiln_status kiln_meta_f32_opt(const kiln_model *m, const char *key, float *out, kiln_err *err) {
    char k[256];
    expand_key(m, key, k, sizeof(k));
    const kiln_meta *mt = meta_of(m);
    if (!mt || !kiln_meta_has(mt, k)) return KILN_OK;
    return kiln_meta_f32(m, key, out, err);
}

kiln_status kiln_meta_bool_opt(const kiln_model *m, const char *key, bool *out, kiln_err *err) {
    char k[256];
    expand_key(m, key, k, sizeof(k));
    const kiln_meta *mt = meta_of(m);
    if (!mt || !kiln_meta_has(mt, k)) return KILN_OK;
    kiln_status st = kiln_meta_get_bool(mt, k, out, err);
    return st ? kiln_err_wrap(err, st, "%s", m->path) : KILN_OK;
}

bool kiln_model_is_safetensors(const kiln_model *m) {
    return m->file &&
           kiln_model_file_source((const kiln_model_file *)m->file) == KILN_SOURCE_SAFETENSORS;
}

static kiln_status positive(const kiln_model *m, const char *what, int32_t v, kiln_err *err) {
    if (v > 0) return KILN_OK;
    return kiln_err_set(err, KILN_ERR_RANGE, "%s: %s is %d, must be > 0", m->path, what, (int)v);
}

kiln_status kiln_meta_common(kiln_model *m, kiln_model_config *c, kiln_err *err) {
    KILN_TRY(kiln_meta_i32(m, "%s.embedding_length", &c->n_embd, err));
    KILN_TRY(kiln_meta_i32(m, "%s.block_count", &c->n_layer, err));
    KILN_TRY(kiln_meta_i32(m, "%s.feed_forward_length", &c->n_ff, err));
    KILN_TRY(kiln_meta_i32(m, "%s.attention.head_count", &c->n_head, err));
    KILN_TRY(positive(m, "embedding_length", c->n_embd, err));
    KILN_TRY(positive(m, "block_count", c->n_layer, err));
    KILN_TRY(positive(m, "feed_forward_length", c->n_ff, err));
    KILN_TRY(positive(m, "attention.head_count", c->n_head, err));
    if (c->n_layer > KILN_MAX_LAYERS)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "%s: %d layers (kiln supports up to %d)",
                            m->path, (int)c->n_layer, KILN_MAX_LAYERS);
    c->n_kv_head = c->n_head;
    KILN_TRY(kiln_meta_i32_opt(m, "%s.attention.head_count_kv", &c->n_kv_head, err));
    KILN_TRY(positive(m, "attention.head_count_kv", c->n_kv_head, err));
    if (c->n_head % c->n_kv_head)
        return kiln_err_set(err, KILN_ERR_RANGE,
                            "%s: head_count %d is not a multiple of head_count_kv %d", m->path,
                            (int)c->n_head, (int)c->n_kv_head);
    c->head_dim = c->n_embd / c->n_head;
    KILN_TRY(kiln_meta_i32_opt(m, "%s.attention.key_length", &c->head_dim, err));
    int32_t vlen = c->head_dim;
    KILN_TRY(kiln_meta_i32_opt(m, "%s.attention.value_length", &vlen, err));
    KILN_TRY(positive(m, "attention.key_length", c->head_dim, err));
    if (vlen != c->head_dim)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "%s: key_length %d != value_length %d",
                            m->path, (int)c->head_dim, (int)vlen);
    c->n_rot = c->head_dim;
    KILN_TRY(kiln_meta_i32_opt(m, "%s.rope.dimension_count", &c->n_rot, err));
    if (c->n_rot < 0 || c->n_rot > c->head_dim || c->n_rot % 2)
        return kiln_err_set(err, KILN_ERR_RANGE, "%s: rope.dimension_count %d (head dim %d)",
                            m->path, (int)c->n_rot, (int)c->head_dim);
    KILN_TRY(kiln_meta_f32(m, "%s.attention.layer_norm_rms_epsilon", &c->norm_eps, err));
    if (!(c->norm_eps > 0) || !isfinite(c->norm_eps))
        return kiln_err_set(err, KILN_ERR_RANGE, "%s: layer_norm_rms_epsilon %g", m->path,
                            (double)c->norm_eps);
    c->n_ctx_train = 4096;
    KILN_TRY(kiln_meta_i32_opt(m, "%s.context_length", &c->n_ctx_train, err));
    KILN_TRY(kiln_meta_f32_opt(m, "%s.rope.freq_base", &c->rope_base, err));
    float factor = 0;
    KILN_TRY(kiln_meta_f32_opt(m, "%s.rope.scaling.factor", &factor, err));
    if (factor == 0) KILN_TRY(kiln_meta_f32_opt(m, "%s.rope.scale_linear", &factor, err));
    c->rope_freq_scale = factor > 0 ? 1.0f / factor : 1.0f;
    c->n_ctx_orig = c->n_ctx_train;
    KILN_TRY(kiln_meta_i32_opt(m, "%s.rope.scaling.original_context_length", &c->n_ctx_orig, err));
    KILN_TRY(kiln_meta_f32_opt(m, "%s.rope.scaling.attn_factor", &c->attn_factor, err));
    {
        const kiln_meta *mt = meta_of(m);
        char k[256];
        expand_key(m, "%s.rope.scaling.type", k, sizeof(k));
        kiln_str ty;
        if (mt && kiln_meta_has(mt, k) && kiln_meta_get_str(mt, k, &ty, NULL) == KILN_OK) {
            if (kiln_str_eq(ty, "yarn")) {
                c->ext_factor = 1.0f;
            } else if (kiln_str_eq(ty, "llama3")) {
                /* per-dim factors (rope_freqs.weight), no global frequency scale */
                c->llama3_factor = factor > 0 ? factor : 8.0f;
                c->rope_freq_scale = 1.0f;
            } else if (!kiln_str_eq(ty, "linear") && !kiln_str_eq(ty, "none"))
                return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "%s: rope scaling type '%.*s'",
                                    m->path, (int)ty.len, ty.ptr);
        }
    }
    for (int l = 0; l < c->n_layer; l++) {
        c->layer_rope_base[l] = c->rope_base;
        c->layer_rope_scale[l] = c->rope_freq_scale;
    }
    KILN_TRY(kiln_meta_i32_opt(m, "tokenizer.ggml.bos_token_id", &c->bos_id, err));
    KILN_TRY(kiln_meta_i32_opt(m, "tokenizer.ggml.eos_token_id", &c->eos_id, err));
    KILN_TRY(kiln_meta_i32_opt(m, "tokenizer.ggml.eot_token_id", &c->eot_id, err));
    c->add_bos = c->bos_id >= 0;
    KILN_TRY(kiln_meta_bool_opt(m, "tokenizer.ggml.add_bos_token", &c->add_bos, err));
    const kiln_tensor *emb = kiln_model_tensor(m, "token_embd.weight");
    if (!emb)
        return kiln_err_set(err, KILN_ERR_NOT_FOUND, "%s: tensor 'token_embd.weight' missing",
                            m->path);
    if (emb->rank != 2 || emb->shape[1] <= 0 || emb->shape[1] > INT32_MAX)
        return kiln_err_set(err, KILN_ERR_FORMAT, "%s: token_embd.weight is not [n_embd, n_vocab]",
                            m->path);
    c->n_vocab = (int32_t)emb->shape[1];
    return KILN_OK;
}

kiln_status kiln_model_add_tensor(kiln_model *m, const kiln_tensor *t, kiln_err *err) {
    kiln_tensor *q = kiln_realloc(m->tensors, sizeof(kiln_tensor) * (size_t)(m->n_tensors + 1));
    if (!q) return kiln_err_set(err, KILN_ERR_NOMEM, "%s: out of memory", m->path);
    m->tensors = q;
    m->tensors[m->n_tensors] = *t;
    char *name = kiln_arena_strndup(&m->arena, t->name, strlen(t->name));
    if (!name) return kiln_err_set(err, KILN_ERR_NOMEM, "%s: out of memory", m->path);
    m->tensors[m->n_tensors++].name = name;
    return KILN_OK;
}

static void close_file(void *f) {
    kiln_model_file_close(f);
}

kiln_status kiln_model_load(const char *path, kiln_model **out, kiln_err *err) {
    kiln_model_file *mf;
    KILN_TRY(kiln_model_file_open(path, 0, &mf, err));
    kiln_model *m = kiln_calloc(1, sizeof(*m));
    if (!m) {
        kiln_model_file_close(mf);
        return kiln_err_set(err, KILN_ERR_NOMEM, "%s: out of memory", path);
    }
    kiln_arena_init(&m->arena, 0);
    m->file = mf;
    m->file_close = close_file;
    snprintf(m->path, sizeof(m->path), "%s", path);
    kiln_status st = KILN_OK;
    size_t n = kiln_model_file_tensor_count(mf);
    m->tensors = kiln_calloc(n ? n : 1, sizeof(kiln_tensor));
    if (!m->tensors) st = kiln_err_set(err, KILN_ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < n && !st; i++) {
        const kiln_tensor_info *ti = kiln_model_file_tensor(mf, i);
        kiln_tensor *t = &m->tensors[m->n_tensors++];
        t->name = ti->name;
        t->dtype = ti->dtype;
        t->rank = ti->rank;
        for (int d = 0; d < 4; d++) t->shape[d] = d < ti->rank ? ti->shape[d] : 1;
        t->nbytes = (size_t)ti->nbytes;
        t->data = NULL; /* bytes reach kernels only through the load plan (runtime/bind.c) */
    }
    if (!st) {
        const char *arch = kiln_model_file_arch(mf);
        kiln_model_config_defaults(&m->cfg);
        snprintf(m->cfg.arch, sizeof(m->cfg.arch), "%s", arch);
        m->family = kiln_family_find(arch);
        if (!m->family)
            st = kiln_err_set(
                err, KILN_ERR_UNSUPPORTED,
                "%s: architecture '%s' is not supported (llama, qwen2, qwen3, gemma3)", path, arch);
        else
            st = m->family->configure(m, &m->cfg, err);
    }
    if (!st) {
        const kiln_meta *mt = kiln_model_file_meta(mf);
        kiln_str tpl;
        if (kiln_meta_has(mt, "tokenizer.chat_template") &&
            kiln_meta_get_str(mt, "tokenizer.chat_template", &tpl, NULL) == KILN_OK) {
            char *c = kiln_arena_strndup(&m->arena, tpl.ptr, tpl.len);
            if (!c) st = kiln_err_set(err, KILN_ERR_NOMEM, "%s: out of memory", path);
            m->chat_template = c;
        }
        const char *tj = kiln_model_file_tokenizer_json(mf);
        if (!st && tj) {
            m->tokenizer_json = kiln_arena_strndup(&m->arena, tj, strlen(tj));
            if (!m->tokenizer_json)
                st = kiln_err_set(err, KILN_ERR_NOMEM, "%s: out of memory", path);
        }
    }
    if (!st) st = kiln_mapguard_check(err); /* a page faulted while reading it */
    if (st) {
        kiln_model_free(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}

void kiln_model_free(kiln_model *m) {
    if (!m) return;
    if (m->file && m->file_close) m->file_close(m->file);
    kiln_model_free_vocab(m);
    kiln_free(m->tensors);
    kiln_arena_free(&m->arena);
    kiln_free(m);
}

int32_t kiln_model_n_vocab(const kiln_model *m) {
    return m->cfg.n_vocab;
}
int32_t kiln_model_n_ctx_train(const kiln_model *m) {
    return m->cfg.n_ctx_train;
}
const char *kiln_model_arch(const kiln_model *m) {
    return m->cfg.arch;
}
