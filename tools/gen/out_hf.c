/*
 * out_hf.c — writes a gen_model in the Hugging Face layout: config.json,
 * generation_config.json, tokenizer.json, tokenizer_config.json and safetensors weights
 * (model.safetensors, or model-0000i-of-0000N.safetensors shards with
 * model.safetensors.index.json above the shard size).
 *
 * Weights are the HF-layout values of gen_row_hf (no q/k permutation, Gemma norms as w),
 * so a kiln-gen GGUF and safetensors pair of one seed are the same model.
 */
#include "gen.h"

#include "base/mem.h"
#include "base/pool.h"
#include "format/dtype.h"

#include <errno.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- config.json ---- */

/* A float hyperparameter as the short decimal people write (1e-06, not 9.99999997e-07). */
static json_t *jfloat(float x) {
    char buf[32];
    snprintf(buf, sizeof buf, "%g", (double)x);
    return json_real(strtod(buf, NULL));
}

static json_t *config_json(const gen_model *m) {
    const gen_config *c = &m->cfg;
    json_t *j = json_object();
    static const char *const ARCH[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                       "Gemma3ForCausalLM"};
    static const char *const TYPE[] = {"llama", "qwen2", "qwen3", "gemma3_text"};
    const char *dt = c->type == KILN_DTYPE_F32   ? "float32"
                     : c->type == KILN_DTYPE_F16 ? "float16"
                                                 : "bfloat16";
    json_object_set_new(j, "architectures", json_pack("[s]", ARCH[c->family]));
    json_object_set_new(j, "model_type", json_string(TYPE[c->family]));
    json_object_set_new(j, "_name_or_path", json_string(c->name));
    json_object_set_new(j, "hidden_size", json_integer(c->n_embd));
    json_object_set_new(j, "intermediate_size", json_integer(c->n_ff));
    json_object_set_new(j, "num_hidden_layers", json_integer(c->n_layer));
    json_object_set_new(j, "num_attention_heads", json_integer(c->n_head));
    json_object_set_new(j, "num_key_value_heads", json_integer(c->n_head_kv));
    /* as the public configs: qwen3 and gemma3 state head_dim, llama and qwen2 derive it */
    if (c->family == GEN_QWEN3 || c->family == GEN_GEMMA3 || c->head_dim * c->n_head != c->n_embd)
        json_object_set_new(j, "head_dim", json_integer(c->head_dim));
    json_object_set_new(j, "max_position_embeddings", json_integer(c->n_ctx));
    json_object_set_new(j, "rms_norm_eps", jfloat(c->norm_eps));
    json_object_set_new(j, "rope_theta", jfloat(c->rope_theta));
    json_object_set_new(j, "vocab_size", json_integer(c->n_vocab));
    json_object_set_new(j, "tie_word_embeddings", json_boolean(c->tied));
    json_object_set_new(j, "torch_dtype", json_string(dt));
    json_object_set_new(j, "attention_dropout", json_real(0.0));
    json_object_set_new(j, "initializer_range", json_real(0.02));
    json_object_set_new(j, "use_cache", json_true());
    if (c->bos_id >= 0) json_object_set_new(j, "bos_token_id", json_integer(c->bos_id));
    if (c->eos_id >= 0) json_object_set_new(j, "eos_token_id", json_integer(c->eos_id));
    switch (c->family) {
    case GEN_LLAMA:
        json_object_set_new(j, "hidden_act", json_string("silu"));
        json_object_set_new(j, "attention_bias", json_false());
        json_object_set_new(j, "mlp_bias", json_false());
        json_object_set_new(j, "rope_scaling", json_null());
        break;
    case GEN_QWEN2:
    case GEN_QWEN3:
        json_object_set_new(j, "hidden_act", json_string("silu"));
        json_object_set_new(j, "use_sliding_window", json_false());
        json_object_set_new(j, "sliding_window", json_integer(c->n_ctx));
        json_object_set_new(j, "max_window_layers", json_integer(c->n_layer));
        json_object_set_new(j, "rope_scaling", json_null());
        if (c->family == GEN_QWEN3) json_object_set_new(j, "attention_bias", json_false());
        break;
    case GEN_GEMMA3: {
        json_object_set_new(j, "hidden_activation", json_string("gelu_pytorch_tanh"));
        json_object_set_new(j, "query_pre_attn_scalar", json_integer(c->head_dim));
        json_object_set_new(j, "sliding_window", json_integer(c->sliding_window));
        json_object_set_new(j, "sliding_window_pattern", json_integer(c->swa_pattern));
        json_object_set_new(j, "rope_local_base_freq", jfloat(c->rope_theta_swa));
        json_object_set_new(j, "rope_scaling", json_null());
        json_object_set_new(j, "attn_logit_softcapping", json_null());
        json_object_set_new(j, "final_logit_softcapping", json_null());
        json_object_set_new(j, "attention_bias", json_false());
        json_t *lt = json_array();
        for (int64_t l = 0; l < c->n_layer; l++)
            json_array_append_new(
                lt, json_string((l + 1) % c->swa_pattern ? "sliding_attention" : "full_attention"));
        json_object_set_new(j, "layer_types", lt);
        break;
    }
    }
    return j;
}

/* ---- tokenizer.json ---- */

typedef struct tok_index {
    uint32_t *slots; /* token id + 1 */
    size_t cap;
    const gen_vocab *v;
} tok_index;

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h;
}

static int64_t idx_find(const tok_index *x, const char *s, size_t n) {
    size_t i = (size_t)fnv(s, n) & (x->cap - 1);
    while (x->slots[i]) {
        const size_t t = x->slots[i] - 1;
        if (x->v->lens[t] == n && memcmp(x->v->tokens[t], s, n) == 0) return (int64_t)t;
        i = (i + 1) & (x->cap - 1);
    }
    return -1;
}

static bool idx_build(tok_index *x, const gen_vocab *v) {
    x->v = v;
    x->cap = 16;
    while (x->cap < 2 * v->n) x->cap *= 2;
    x->slots = kiln_calloc(x->cap, sizeof *x->slots);
    if (!x->slots) return false;
    for (size_t t = 0; t < v->n; t++) {
        if (idx_find(x, v->tokens[t], v->lens[t]) >= 0) continue; /* first wins */
        size_t i = (size_t)fnv(v->tokens[t], v->lens[t]) & (x->cap - 1);
        while (x->slots[i]) i = (i + 1) & (x->cap - 1);
        x->slots[i] = (uint32_t)(t + 1);
    }
    return true;
}

typedef struct merge {
    float score;
    uint32_t piece, left, right;
    uint32_t split; /* byte offset of the split in the piece */
} merge;

static int merge_cmp(const void *a, const void *b) {
    const merge *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->piece != y->piece) return x->piece < y->piece ? -1 : 1;
    if (x->left != y->left) return x->left < y->left ? -1 : 1;
    return x->right < y->right ? -1 : x->right > y->right;
}

/* SentencePiece -> BPE merges the way HF's converter derives them: every split of a
 * piece into two vocabulary pieces, ordered by the piece's score (desc), then by the
 * ids of the parts. */
static kiln_status spm_merges(const gen_vocab *v, json_t *out, kiln_err *err) {
    tok_index x;
    if (!idx_build(&x, v)) return kiln_err_set(err, KILN_ERR_NOMEM, "token index");
    size_t cap = v->n * 2 + 16, n = 0;
    merge *ms = kiln_malloc(cap * sizeof *ms);
    if (!ms) {
        kiln_free(x.slots);
        return kiln_err_set(err, KILN_ERR_NOMEM, "merges");
    }
    for (size_t t = 0; t < v->n; t++) {
        if (v->types[t] != 1 && v->types[t] != 4) continue;
        const char *s = v->tokens[t];
        for (size_t k = 1; k < v->lens[t]; k++) {
            if (((uint8_t)s[k] & 0xC0) == 0x80) continue; /* inside a UTF-8 character */
            const int64_t l = idx_find(&x, s, k), r = idx_find(&x, s + k, v->lens[t] - k);
            if (l < 0 || r < 0) continue;
            if (n == cap) {
                merge *p = kiln_realloc(ms, 2 * cap * sizeof *ms);
                if (!p) {
                    kiln_free(ms), kiln_free(x.slots);
                    return kiln_err_set(err, KILN_ERR_NOMEM, "merges");
                }
                ms = p, cap *= 2;
            }
            ms[n++] = (merge){v->scores[t], (uint32_t)t, (uint32_t)l, (uint32_t)r, (uint32_t)k};
        }
    }
    qsort(ms, n, sizeof *ms, merge_cmp);
    for (size_t i = 0; i < n; i++) {
        const char *s = v->tokens[ms[i].piece];
        json_array_append_new(out, json_pack("[s#s#]", s, (int)ms[i].split, s + ms[i].split,
                                             (int)(v->lens[ms[i].piece] - ms[i].split)));
    }
    kiln_free(ms);
    kiln_free(x.slots);
    return KILN_OK;
}

static const char LLAMA3_RE[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_RE[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                               "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static json_t *tokenizer_json(const gen_vocab *v, bool add_bos, bool space_prefix, kiln_err *err,
                              kiln_status *st) {
    const bool bpe = strcmp(v->model, "gpt2") == 0;
    *st = KILN_OK;
    if (!bpe && strcmp(v->model, "llama") != 0) {
        *st = kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                           "tokenizer.json for tokenizer model '%s' (only llama/SPM and gpt2/BPE)",
                           v->model);
        return NULL;
    }
    json_t *root = json_object();
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_t *added = json_array();
    for (size_t t = 0; t < v->n; t++) {
        const int32_t ty = v->types[t];
        if (ty != 2 && ty != 3 && ty != 4) continue;
        json_array_append_new(
            added, json_pack("{s:I, s:s#, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)t, "content",
                             v->tokens[t], (int)v->lens[t], "single_word", 0, "lstrip", 0, "rstrip",
                             0, "normalized", ty == 4, "special", ty != 4));
    }
    json_object_set_new(root, "added_tokens", added);
    const char *bos = v->bos_id >= 0 && (size_t)v->bos_id < v->n ? v->tokens[v->bos_id] : NULL;
    if (bpe) {
        json_object_set_new(root, "normalizer", json_null());
        const char *re = strstr(v->pre, "llama")        ? LLAMA3_RE
                         : strcmp(v->pre, "qwen2") == 0 ? QWEN2_RE
                                                        : NULL;
        if (re)
            json_object_set_new(
                root, "pre_tokenizer",
                json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type",
                          "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex", re,
                          "behavior", "Isolated", "invert", 0, "type", "ByteLevel",
                          "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0));
        else
            json_object_set_new(root, "pre_tokenizer",
                                json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel",
                                          "add_prefix_space", 0, "trim_offsets", 1, "use_regex",
                                          1));
        json_object_set_new(root, "decoder",
                            json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel",
                                      "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1));
    } else {
        json_t *norms = json_array();
        if (space_prefix)
            json_array_append_new(norms,
                                  json_pack("{s:s, s:s}", "type", "Prepend", "prepend", "\u2581"));
        json_array_append_new(norms, json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern",
                                               "String", " ", "content", "\u2581"));
        json_object_set_new(root, "normalizer",
                            json_pack("{s:s, s:o}", "type", "Sequence", "normalizers", norms));
        json_object_set_new(root, "pre_tokenizer", json_null());
        json_t *decs = json_array();
        json_array_append_new(decs, json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern",
                                              "String", "\u2581", "content", " "));
        json_array_append_new(decs, json_pack("{s:s}", "type", "ByteFallback"));
        json_array_append_new(decs, json_pack("{s:s}", "type", "Fuse"));
        if (space_prefix)
            json_array_append_new(decs, json_pack("{s:s, s:s, s:i, s:i}", "type", "Strip",
                                                  "content", " ", "start", 1, "stop", 0));
        json_object_set_new(root, "decoder",
                            json_pack("{s:s, s:o}", "type", "Sequence", "decoders", decs));
    }
    if (add_bos && bos) {
        json_t *single = json_pack("[{s:{s:s, s:i}}, {s:{s:s, s:i}}]", "SpecialToken", "id", bos,
                                   "type_id", 0, "Sequence", "id", "A", "type_id", 0);
        json_t *pair =
            json_pack("[{s:{s:s, s:i}}, {s:{s:s, s:i}}, {s:{s:s, s:i}}, {s:{s:s, s:i}}]",
                      "SpecialToken", "id", bos, "type_id", 0, "Sequence", "id", "A", "type_id", 0,
                      "SpecialToken", "id", bos, "type_id", 1, "Sequence", "id", "B", "type_id", 1);
        json_t *special = json_object();
        json_object_set_new(special, bos,
                            json_pack("{s:s, s:[I], s:[s]}", "id", bos, "ids",
                                      (json_int_t)v->bos_id, "tokens", bos));
        json_object_set_new(root, "post_processor",
                            json_pack("{s:s, s:o, s:o, s:o}", "type", "TemplateProcessing",
                                      "single", single, "pair", pair, "special_tokens", special));
    } else {
        json_object_set_new(root, "post_processor", json_null());
    }
    json_t *model = json_object();
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "dropout", json_null());
    json_object_set_new(model, "unk_token",
                        !bpe && v->unk_id >= 0 && (size_t)v->unk_id < v->n
                            ? json_stringn(v->tokens[v->unk_id], v->lens[v->unk_id])
                            : json_null());
    json_object_set_new(model, "continuing_subword_prefix", json_null());
    json_object_set_new(model, "end_of_word_suffix", json_null());
    json_object_set_new(model, "fuse_unk", json_boolean(!bpe));
    json_object_set_new(model, "byte_fallback", json_boolean(!bpe));
    json_object_set_new(model, "ignore_merges", json_false());
    json_t *vocab = json_object();
    for (size_t t = 0; t < v->n; t++) {
        /* jansson keys are NUL-terminated: a token with an embedded NUL cannot be a key */
        if (memchr(v->tokens[t], 0, v->lens[t])) continue;
        if (!json_object_get(vocab, v->tokens[t]))
            json_object_set_new(vocab, v->tokens[t], json_integer((json_int_t)t));
    }
    json_object_set_new(model, "vocab", vocab);
    json_t *merges = json_array();
    if (bpe) {
        for (size_t i = 0; i < v->n_merges; i++) {
            const char *sp = memchr(v->merges[i], ' ', v->merge_lens[i]);
            if (!sp) continue;
            const int l = (int)(sp - v->merges[i]);
            json_array_append_new(merges, json_pack("[s#s#]", v->merges[i], l, sp + 1,
                                                    (int)v->merge_lens[i] - l - 1));
        }
    } else {
        *st = spm_merges(v, merges, err);
    }
    json_object_set_new(model, "merges", merges);
    json_object_set_new(root, "model", model);
    if (*st) {
        json_decref(root);
        return NULL;
    }
    return root;
}

/* ---- safetensors ---- */

typedef struct conv_job {
    const gen_tensor *t;
    int64_t row0;
    uint8_t *dst;
    size_t row_bytes;
    uint32_t dtype;
    float **tmp; /* per-thread row buffers */
} conv_job;

static void conv_rows(void *ctx, int64_t b, int64_t e, int ith) {
    const conv_job *j = ctx;
    float *tmp = j->tmp[ith];
    for (int64_t r = b; r < e; r++) {
        gen_row_hf(j->t, j->row0 + r, tmp);
        uint8_t *d = j->dst + (size_t)r * j->row_bytes;
        if (j->dtype == KILN_DTYPE_F32)
            memcpy(d, tmp, j->row_bytes);
        else
            kiln_quantize_row(j->dtype, tmp, d, j->t->ne[0], NULL); /* f16/bf16: no error */
    }
}

static uint32_t st_dtype(const gen_tensor *t, uint32_t want) {
    (void)t;
    return want; /* norms and biases are stored in the model dtype, as HF checkpoints do */
}

static const char *st_dtype_name(uint32_t d) {
    return d == KILN_DTYPE_F32 ? "F32" : d == KILN_DTYPE_F16 ? "F16" : "BF16";
}

static size_t tensor_bytes(const gen_tensor *t, uint32_t dtype) {
    return (size_t)(t->ne[0] * t->ne[1]) * (dtype == KILN_DTYPE_F32 ? 4 : 2);
}

static kiln_status write_all(FILE *f, const void *p, size_t n, const char *path, kiln_err *err) {
    if (fwrite(p, 1, n, f) != n) return kiln_err_errno(err, errno, "writing %s", path);
    return KILN_OK;
}

static kiln_status write_shard(const gen_model *m, size_t first, size_t last, const char *path,
                               kiln_pool *pool, float **tmp, uint8_t *buf, size_t buf_cap,
                               kiln_err *err) {
    const uint32_t dt = m->cfg.type;
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    size_t off = 0;
    for (size_t i = first; i < last; i++) {
        const gen_tensor *t = &m->t[i];
        const size_t nb = tensor_bytes(t, st_dtype(t, dt));
        json_t *shape = t->rank == 1
                            ? json_pack("[I]", (json_int_t)t->ne[0])
                            : json_pack("[I,I]", (json_int_t)t->ne[1], (json_int_t)t->ne[0]);
        json_object_set_new(h, t->hf_name,
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype",
                                      st_dtype_name(st_dtype(t, dt)), "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + nb)));
        off += nb;
    }
    char *hs = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!hs) return kiln_err_set(err, KILN_ERR_NOMEM, "safetensors header");
    size_t hl = strlen(hs);
    const size_t padded = (hl + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    if (!f) {
        kiln_free(hs);
        return kiln_err_errno(err, errno, "creating %s", path);
    }
    kiln_status st = KILN_OK;
    uint64_t hl64 = padded;
    st = write_all(f, &hl64, 8, path, err);
    if (!st) st = write_all(f, hs, hl, path, err);
    for (size_t k = hl; k < padded && !st; k++) st = write_all(f, " ", 1, path, err);
    kiln_free(hs);
    for (size_t i = first; i < last && !st; i++) {
        const gen_tensor *t = &m->t[i];
        const uint32_t tdt = st_dtype(t, dt);
        const size_t row_bytes = (size_t)t->ne[0] * (tdt == KILN_DTYPE_F32 ? 4 : 2);
        int64_t rows_per = (int64_t)(buf_cap / row_bytes);
        if (rows_per < 1) rows_per = 1;
        for (int64_t r = 0; r < t->ne[1] && !st; r += rows_per) {
            const int64_t n = t->ne[1] - r < rows_per ? t->ne[1] - r : rows_per;
            conv_job j = {t, r, buf, row_bytes, tdt, tmp};
            kiln_pool_for(pool, n, 64, conv_rows, &j);
            st = write_all(f, buf, (size_t)n * row_bytes, path, err);
        }
    }
    if (fclose(f) != 0 && !st) st = kiln_err_errno(err, errno, "closing %s", path);
    return st;
}

static kiln_status write_text(const char *dir, const char *name, json_t *j, kiln_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!j) return kiln_err_set(err, KILN_ERR_NOMEM, "building %s", path);
    int rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (rc != 0) return kiln_err_errno(err, errno, "writing %s", path);
    return KILN_OK;
}

kiln_status gen_write_hf(gen_model *m, const gen_vocab *v, const char *dir, uint64_t shard_bytes,
                         int threads, kiln_err *err) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return kiln_err_errno(err, errno, "creating directory %s", dir);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "%s is not a directory", dir);
    const gen_config *c = &m->cfg;

    KILN_TRY(write_text(dir, "config.json", config_json(m), err));
    json_t *gc = json_object();
    if (c->bos_id >= 0) json_object_set_new(gc, "bos_token_id", json_integer(c->bos_id));
    if (c->eos_id >= 0) json_object_set_new(gc, "eos_token_id", json_integer(c->eos_id));
    KILN_TRY(write_text(dir, "generation_config.json", gc, err));

    /* add_bos / add_space_prefix as the vocabulary's GGUF says (builtin: SPM defaults) */
    const bool add_bos = v->add_bos, space_prefix = v->add_space_prefix;
    kiln_status st;
    json_t *tj = tokenizer_json(v, add_bos, space_prefix, err, &st);
    if (st) return st;
    KILN_TRY(write_text(dir, "tokenizer.json", tj, err));
    json_t *tc = json_object();
    json_object_set_new(tc, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
    json_object_set_new(tc, "add_bos_token", json_boolean(add_bos));
    json_object_set_new(tc, "add_eos_token", json_false());
    if (v->bos_id >= 0 && (size_t)v->bos_id < v->n)
        json_object_set_new(tc, "bos_token", json_string(v->tokens[v->bos_id]));
    if (v->eos_id >= 0 && (size_t)v->eos_id < v->n)
        json_object_set_new(tc, "eos_token", json_string(v->tokens[v->eos_id]));
    if (v->unk_id >= 0 && (size_t)v->unk_id < v->n)
        json_object_set_new(tc, "unk_token", json_string(v->tokens[v->unk_id]));
    json_object_set_new(tc, "model_max_length", json_integer(c->n_ctx));
    KILN_TRY(write_text(dir, "tokenizer_config.json", tc, err));

    /* shards: consecutive tensors, a new shard when the next tensor would pass the size */
    size_t n_shards = 0, *ends = kiln_calloc(m->n_t + 1, sizeof *ends);
    if (!ends) return kiln_err_set(err, KILN_ERR_NOMEM, "shard table");
    uint64_t cur = 0, total = 0;
    for (size_t i = 0; i < m->n_t; i++) {
        const uint64_t nb = tensor_bytes(&m->t[i], st_dtype(&m->t[i], c->type));
        if (cur > 0 && cur + nb > shard_bytes) ends[n_shards++] = i, cur = 0;
        cur += nb;
        total += nb;
    }
    ends[n_shards++] = m->n_t;

    kiln_pool *pool = NULL;
    st = kiln_pool_create(threads, &pool, err);
    const size_t buf_cap = (size_t)64 << 20;
    uint8_t *buf = st ? NULL : kiln_alloc_aligned(buf_cap);
    const int nth = st ? 0 : kiln_pool_size(pool);
    float **tmp = kiln_calloc((size_t)nth + 1, sizeof *tmp);
    int64_t max_row = 1;
    for (size_t i = 0; i < m->n_t; i++)
        if (m->t[i].ne[0] > max_row) max_row = m->t[i].ne[0];
    bool ok = buf && tmp;
    for (int i = 0; i < nth && ok; i++) ok = (tmp[i] = kiln_malloc((size_t)max_row * 4)) != NULL;
    if (!st && !ok) st = kiln_err_set(err, KILN_ERR_NOMEM, "write buffers");
    json_t *wm = json_object();
    size_t first = 0;
    for (size_t s = 0; s < n_shards && !st; s++) {
        char name[64], path[4096];
        if (n_shards == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        st = write_shard(m, first, ends[s], path, pool, tmp, buf, buf_cap, err);
        for (size_t i = first; i < ends[s]; i++)
            json_object_set_new(wm, m->t[i].hf_name, json_string(name));
        first = ends[s];
    }
    if (!st && n_shards > 1) {
        json_t *idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                                "weight_map", wm);
        wm = NULL;
        st = write_text(dir, "model.safetensors.index.json", idx, err);
    }
    json_decref(wm);
    for (int i = 0; tmp && i < nth; i++) kiln_free(tmp[i]);
    kiln_free(tmp);
    kiln_free_aligned(buf);
    kiln_pool_free(pool);
    kiln_free(ends);
    return st;
}
