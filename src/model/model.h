/*
 * model.h — model families: metadata -> kiln_model_config -> execution plan.
 *
 * A family (one file each: gemma3.c, llama.c, qwen2.c, qwen3.c) is a kiln_family
 * descriptor listed in families.c: it reads metadata through the format layer's
 * view into a kiln_model_config, and compiles plans with the shared decoder builder
 * (decoder.c) or its own. Adding a family that uses existing ops touches only this
 * folder: a new file and one line in families.c.
 *
 * A kiln_model holds the config, the tensors (views into the model file, or into
 * buffers the model owns) and the tokenizer. Weights are addressed by GGUF tensor
 * names; safetensors checkpoints are presented under GGUF names by the format layer.
 */
#ifndef KILN_MODEL_MODEL_H
#define KILN_MODEL_MODEL_H

#include "base/mem.h"
#include "base/status.h"
#include "plan/plan.h"

#include <stdbool.h>
#include <stdint.h>

#define KILN_MAX_LAYERS 512

typedef struct kiln_model_config {
    char arch[32];
    int32_t n_vocab, n_embd, n_layer, n_head, n_kv_head, head_dim, n_ff, n_ctx_train;
    float norm_eps;
    float norm_w_offset; /* 1 when norm weights are stored as w - 1 (HF Gemma) */
    /* rope */
    int32_t rope_mode; /* kiln_rope_mode */
    int32_t n_rot;
    float rope_base, rope_freq_scale;
    float ext_factor, attn_factor, beta_fast, beta_slow;
    int32_t n_ctx_orig;
    bool rope_freqs;     /* llama3-style per-dim factors tensor "rope_freqs.weight" */
    float llama3_factor; /* rope.scaling.type "llama3" without the tensor (HF): factor */
    /* attention */
    float attn_scale, attn_softcap;
    int32_t layer_window[KILN_MAX_LAYERS];  /* 0 = full attention */
    float layer_rope_base[KILN_MAX_LAYERS]; /* per layer (sliding layers may differ) */
    float layer_rope_scale[KILN_MAX_LAYERS];
    bool qkv_bias, qk_norm, post_norms;
    /* ffn, head */
    int32_t act; /* kiln_glu_act */
    float embed_scale, final_softcap;
    bool tied_embeddings;
    /* tokens */
    int32_t bos_id, eos_id, eot_id;
    bool add_bos;
} kiln_model_config;

/* A tensor of the model: name, dtype, GGUF-order shape, data (host memory). */
typedef struct kiln_tensor {
    const char *name;
    const void *data;
    uint32_t dtype;
    int32_t rank;
    int64_t shape[4];
    size_t nbytes;
} kiln_tensor;

typedef struct kiln_family {
    const char *arch; /* general.architecture value */
    /* Fills cfg from the metadata of the model's file (m->file); tensors are listed. */
    kiln_status (*configure)(struct kiln_model *m, kiln_model_config *cfg, kiln_err *err);
    /* Emits the plan for one mode. */
    kiln_status (*compile)(const kiln_model_config *cfg, kiln_plan_mode mode, kiln_plan *plan,
                           kiln_err *err);
} kiln_family;

struct kiln_vocab;

struct kiln_model {
    kiln_model_config cfg;
    const kiln_family *family;
    kiln_tensor *tensors;
    int32_t n_tensors;
    void *file; /* the format layer's open model file, or NULL (synthetic) */
    void (*file_close)(void *file);
    struct kiln_vocab *vocab;   /* NULL until kiln_model_load_vocab */
    const char *chat_template;  /* tokenizer.chat_template, or NULL (in arena) */
    const char *tokenizer_json; /* safetensors: path of tokenizer.json, or NULL */
    kiln_arena arena;           /* owned copies (converted tensors, names) */
    char path[1024];
};
typedef struct kiln_model kiln_model;

/* ---- metadata access for families (implemented over the format layer's view) ----
 * Keys are GGUF names; "%s" in a key is replaced by the architecture ("%s.block_count").
 * Getters return KILN_ERR_NOT_FOUND (naming file and key) when absent, KILN_ERR_TYPE
 * when the value has another type; the _opt variants leave *out unchanged when absent. */
kiln_status kiln_meta_i32(const kiln_model *m, const char *key, int32_t *out, kiln_err *err);
kiln_status kiln_meta_f32(const kiln_model *m, const char *key, float *out, kiln_err *err);
kiln_status kiln_meta_i32_opt(const kiln_model *m, const char *key, int32_t *out, kiln_err *err);
kiln_status kiln_meta_f32_opt(const kiln_model *m, const char *key, float *out, kiln_err *err);
kiln_status kiln_meta_bool_opt(const kiln_model *m, const char *key, bool *out, kiln_err *err);
/* True when the model's file is a safetensors checkpoint (HF layouts: NEOX rope for
 * llama, Gemma norms stored as w - 1). */
bool kiln_model_is_safetensors(const kiln_model *m);
/* Reads the fields every decoder shares (dims, heads, eps, rope base, context, token
 * ids) for m->cfg.arch. */
kiln_status kiln_meta_common(kiln_model *m, kiln_model_config *cfg, kiln_err *err);

/* The family for an architecture name, or NULL. */
const kiln_family *kiln_family_find(const char *arch);
/* All families (NULL-terminated). */
const kiln_family *const *kiln_families(void);

const kiln_tensor *kiln_model_tensor(const kiln_model *m, const char *name);
/* Adds a tensor the model owns (name copied; data must live in m->arena). */
kiln_status kiln_model_add_tensor(kiln_model *m, const kiln_tensor *t, kiln_err *err);

/* The shared decoder-only plan builder (decoder.c): embed -> n_layer x (norm,
 * attention, [post norm], residual, norm, ffn, [post norm], residual) -> norm ->
 * lm_head, following cfg's flags. Families that fit it use it as their compile. */
kiln_status kiln_decoder_compile(const kiln_model_config *cfg, kiln_plan_mode mode, kiln_plan *plan,
                                 kiln_err *err);

/* Builds a model from a config and tensors the caller keeps alive (tests, kiln-gen
 * data in memory). The tensor array is copied; data is not. */
kiln_status kiln_model_from_tensors(const kiln_model_config *cfg, const kiln_tensor *tensors,
                                    int32_t n, kiln_model **out, kiln_err *err);

/* Loads the tokenizer of the model (GGUF metadata or tokenizer.json) into m->vocab
 * and checks it agrees with the model (vocabulary not larger than the output rows). */
kiln_status kiln_model_load_vocab(kiln_model *m, kiln_err *err);
void kiln_model_free_vocab(kiln_model *m);

/* Default values every family starts from (rope off flags, scales 1...). */
void kiln_model_config_defaults(kiln_model_config *cfg);

#endif /* KILN_MODEL_MODEL_H */
