/*
 * gen.h — kiln-gen, the synthetic model generator (internal header of tools/gen).
 *
 * A model is a config (family + shapes, from a preset and overrides), a list of tensors
 * (HF name, GGUF name, shape, how to initialize) and a vocabulary. Weight values are a
 * pure function of (seed, HF tensor name, HF row), so every output format and any
 * thread count give the same numbers: the GGUF file and the safetensors files of one
 * seed describe the same model (up to the dtype each stores).
 *
 * Layout conventions: a tensor's HF shape is [out, in] (row-major, rows of `in`); the
 * ggml shape is {in, out} (ne[0] = row length). Llama's GGUF q/k rows are permuted the
 * way llama.cpp's converter does (LlamaModel.permute), Gemma's GGUF norm weights are
 * 1 + w (HF stores w and computes with 1 + w).
 */
#ifndef KILN_TOOLS_GEN_H
#define KILN_TOOLS_GEN_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum gen_family {
    GEN_LLAMA = 0,
    GEN_QWEN2,
    GEN_QWEN3,
    GEN_GEMMA3,
} gen_family;

typedef struct gen_config {
    gen_family family;
    char preset[32];
    char name[96]; /* general.name */
    int64_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx;
    float rope_theta, rope_theta_swa, norm_eps;
    bool tied;
    int64_t sliding_window; /* gemma3 */
    int64_t swa_pattern;    /* gemma3: every swa_pattern-th layer is global */
    int64_t bos_id, eos_id; /* from the vocabulary (-1: none) */
    bool vocab_from_file;
    uint64_t seed;
    uint32_t type; /* requested weight dtype (the base type of a mix) */
    bool mix_m;    /* llama-quantize's Q4_K_M / Q5_K_M layer mix (type is q4_K / q5_K) */
} gen_config;

typedef enum gen_init {
    GEN_INIT_MATRIX, /* normal(0, std) */
    GEN_INIT_EMBED,  /* normal(0, std), std chosen for non-degenerate logits */
    GEN_INIT_NORM,   /* 1 + normal(0, std) (Gemma HF: normal(0, std), GGUF adds 1) */
    GEN_INIT_BIAS,   /* normal(0, std) */
} gen_init;

typedef struct gen_tensor {
    char hf_name[96];
    char gguf_name[64];
    int rank;      /* 1 or 2 */
    int64_t ne[2]; /* ggml order: ne[0] = row length (in), ne[1] = rows (out) */
    gen_init init;
    float std;
    float mean;         /* norms: HF value = mean + normal(0, std) */
    bool gemma_norm;    /* HF stores w, GGUF stores 1 + w */
    int64_t perm_heads; /* llama q/k: heads for the GGUF row permutation (0: none) */
    uint32_t gguf_type;
    uint64_t seed;
} gen_tensor;

typedef struct gen_model {
    gen_config cfg;
    gen_tensor *t;
    size_t n_t;
} gen_model;

/* ---- model.c ---- */
const char *gen_family_name(gen_family f); /* GGUF architecture: "llama", ... */
bool gen_family_parse(const char *s, gen_family *out);
/* Fills cfg from a preset name ("tiny", "llama-110m", ...); family is used by "tiny"
 * (and overrides a preset's default family when family_set). */
kiln_status gen_preset(const char *name, gen_family family, bool family_set, gen_config *cfg,
                       kiln_err *err);
void gen_list_presets(void);
/* Checks shapes (divisibility, positive sizes). */
kiln_status gen_config_check(const gen_config *cfg, kiln_err *err);
/* Builds the tensor list for cfg (m->cfg must be filled). */
kiln_status gen_model_build(gen_model *m, kiln_err *err);
void gen_model_free(gen_model *m);
/* The HF-layout row `row` of t as f32 (ne[0] values), before any GGUF transform. */
void gen_row_hf(const gen_tensor *t, int64_t row, float *out);
/* The GGUF row `row` of t as f32 (q/k permutation and Gemma's +1 applied). */
void gen_row_gguf(const gen_tensor *t, int64_t row, float *out);
/* llama.cpp's general.file_type for a requested type. */
uint32_t gen_file_type(const gen_config *c);
uint64_t gen_param_count(const gen_model *m);

/* ---- vocab.c ---- */
typedef struct gen_vocab {
    char **tokens; /* n tokens (may hold any bytes) */
    size_t *lens;
    float *scores;
    int32_t *types; /* llama.cpp token types: 1 normal, 2 unknown, 3 control, 6 byte */
    size_t n;
    bool builtin;
    int64_t bos_id, eos_id, unk_id; /* -1 when absent */
    char model[32];                 /* tokenizer.ggml.model: "llama" (SPM), "gpt2" (BPE) */
    char pre[64];                   /* tokenizer.ggml.pre */
    bool add_bos, add_space_prefix; /* tokenizer.ggml.add_bos_token / add_space_prefix */
    char **merges;                  /* BPE merges "a b" (n_merges), or NULL */
    size_t *merge_lens, n_merges;
    struct kiln_gguf *src; /* the vocab file, kept open: its tokenizer.* keys are copied */
} gen_vocab;

/* A self-consistent SentencePiece-style vocabulary of n tokens (n >= 300): <unk>, <s>,
 * </s>, 256 byte tokens <0x00>..<0xFF>, then pieces each made of two earlier pieces. */
kiln_status gen_vocab_builtin(size_t n, gen_vocab *v, kiln_err *err);
/* Reads tokenizer.ggml.* of a GGUF file (kept open in v->src for copying). */
kiln_status gen_vocab_from_gguf(const char *path, gen_vocab *v, kiln_err *err);
void gen_vocab_free(gen_vocab *v);

/* ---- out_gguf.c ---- */
struct kiln_gguf_writer;
typedef struct gen_gguf_opts {
    const char *vocab_path; /* copy tokenizer.ggml.* from this GGUF, or NULL (builtin) */
    int threads;
    bool progress;
} gen_gguf_opts;
kiln_status gen_write_gguf(gen_model *m, const gen_vocab *v, const char *path,
                           const gen_gguf_opts *o, kiln_err *err);

/* ---- out_hf.c ---- */
kiln_status gen_write_hf(gen_model *m, const gen_vocab *v, const char *dir, uint64_t shard_bytes,
                         int threads, kiln_err *err);

#endif /* KILN_TOOLS_GEN_H */
