/*
 * model.c — presets, the tensor list of each family, and deterministic weight values.
 */
#include "gen.h"
#include "base/mem.h"

#include "format/dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- families and presets ---- */

static const char *const FAMILY_NAMES[] = {"llama", "qwen2", "qwen3", "gemma3"};

const char *gen_family_name(gen_family f) {
    return FAMILY_NAMES[f];
}

bool gen_family_parse(const char *s, gen_family *out) {
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, FAMILY_NAMES[i]) == 0) {
            *out = (gen_family)i;
            return true;
        }
    }
    return false;
}

typedef struct preset {
    const char *name;
    gen_family family;
    const char *desc;
    int64_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx;
    float rope_theta, rope_theta_swa, norm_eps;
    bool tied;
    int64_t sliding_window, swa_pattern;
} preset;

/* Shapes of the public models (their config.json), see docs/GENERATOR.md. */
static const preset PRESETS[] = {
    {"llama-110m", GEN_LLAMA, "llama2.c stories110M", 768, 12, 12, 12, 64, 2048, 32000, 1024,
     10000.0f, 0, 1e-5f, true, 0, 0},
    {"tinyllama-1.1b", GEN_LLAMA, "TinyLlama-1.1B", 2048, 22, 32, 4, 64, 5632, 32000, 2048,
     10000.0f, 0, 1e-5f, false, 0, 0},
    {"llama3-8b", GEN_LLAMA, "Meta-Llama-3-8B", 4096, 32, 32, 8, 128, 14336, 128256, 8192,
     500000.0f, 0, 1e-5f, false, 0, 0},
    {"llama3-70b", GEN_LLAMA, "Meta-Llama-3-70B", 8192, 80, 64, 8, 128, 28672, 128256, 8192,
     500000.0f, 0, 1e-5f, false, 0, 0},
    {"qwen2.5-0.5b", GEN_QWEN2, "Qwen2.5-0.5B", 896, 24, 14, 2, 64, 4864, 151936, 32768, 1000000.0f,
     0, 1e-6f, true, 0, 0},
    {"qwen3-0.6b", GEN_QWEN3, "Qwen3-0.6B", 1024, 28, 16, 8, 128, 3072, 151936, 40960, 1000000.0f,
     0, 1e-6f, true, 0, 0},
    {"smollm2-135m", GEN_LLAMA, "SmolLM2-135M", 576, 30, 9, 3, 64, 1536, 49152, 8192, 100000.0f, 0,
     1e-5f, true, 0, 0},
    {"gemma3-270m", GEN_GEMMA3, "gemma-3-270m", 640, 18, 4, 1, 256, 2048, 262144, 32768, 1000000.0f,
     10000.0f, 1e-6f, true, 512, 6},
};
#define N_PRESETS (sizeof PRESETS / sizeof PRESETS[0])

void gen_list_presets(void) {
    printf("  %-15s %-7s %s\n", "tiny", "any", "2 layers, 256 hidden, 512 vocab (a few MB)");
    for (size_t i = 0; i < N_PRESETS; i++)
        printf("  %-15s %-7s %s: %lld layers, %lld hidden, %lld/%lld heads, ffn %lld, vocab %lld\n",
               PRESETS[i].name, FAMILY_NAMES[PRESETS[i].family], PRESETS[i].desc,
               (long long)PRESETS[i].n_layer, (long long)PRESETS[i].n_embd,
               (long long)PRESETS[i].n_head, (long long)PRESETS[i].n_head_kv,
               (long long)PRESETS[i].n_ff, (long long)PRESETS[i].n_vocab);
}

static void apply(gen_config *c, const preset *p) {
    c->family = p->family;
    c->n_embd = p->n_embd, c->n_layer = p->n_layer, c->n_head = p->n_head;
    c->n_head_kv = p->n_head_kv, c->head_dim = p->head_dim, c->n_ff = p->n_ff;
    c->n_vocab = p->n_vocab, c->n_ctx = p->n_ctx;
    c->rope_theta = p->rope_theta, c->rope_theta_swa = p->rope_theta_swa;
    c->norm_eps = p->norm_eps, c->tied = p->tied;
    c->sliding_window = p->sliding_window, c->swa_pattern = p->swa_pattern;
}

kiln_status gen_preset(const char *name, gen_family family, bool family_set, gen_config *cfg,
                       kiln_err *err) {
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->preset, sizeof cfg->preset, "%s", name);
    if (strcmp(name, "tiny") == 0) {
        const preset tiny = {"tiny",
                             family,
                             "",
                             256,
                             2,
                             4,
                             2,
                             64,
                             512,
                             512,
                             2048,
                             family == GEN_LLAMA ? 10000.0f : 1000000.0f,
                             family == GEN_GEMMA3 ? 10000.0f : 0,
                             family == GEN_LLAMA ? 1e-5f : 1e-6f,
                             family != GEN_LLAMA,
                             family == GEN_GEMMA3 ? 64 : 0,
                             family == GEN_GEMMA3 ? 2 : 0};
        apply(cfg, &tiny);
    } else {
        size_t i = 0;
        while (i < N_PRESETS && strcmp(PRESETS[i].name, name) != 0) i++;
        if (i == N_PRESETS)
            return kiln_err_set(err, KILN_ERR_NOT_FOUND,
                                "unknown preset '%s' (kiln-gen --list-presets)", name);
        apply(cfg, &PRESETS[i]);
        if (family_set && family != cfg->family)
            return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                "preset '%s' is a %s model; --family %s does not apply", name,
                                FAMILY_NAMES[cfg->family], FAMILY_NAMES[family]);
    }
    cfg->seed = 1;
    cfg->type = KILN_DTYPE_F16;
    cfg->bos_id = 1, cfg->eos_id = 2;
    return KILN_OK;
}

kiln_status gen_config_check(const gen_config *c, kiln_err *err) {
    const struct {
        const char *what;
        int64_t v;
    } pos[] = {{"hidden size", c->n_embd}, {"layers", c->n_layer},    {"heads", c->n_head},
               {"kv heads", c->n_head_kv}, {"head dim", c->head_dim}, {"ffn size", c->n_ff},
               {"vocab size", c->n_vocab}, {"context", c->n_ctx}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0 || pos[i].v > ((int64_t)1 << 24))
            return kiln_err_set(err, KILN_ERR_RANGE, "%s %lld is outside 1..2^24", pos[i].what,
                                (long long)pos[i].v);
    if (c->n_head % c->n_head_kv)
        return kiln_err_set(err, KILN_ERR_RANGE, "heads %lld not a multiple of kv heads %lld",
                            (long long)c->n_head, (long long)c->n_head_kv);
    if (c->head_dim % 2)
        return kiln_err_set(err, KILN_ERR_RANGE, "head dim %lld is odd", (long long)c->head_dim);
    if (c->family == GEN_GEMMA3 && c->swa_pattern < 1)
        return kiln_err_set(err, KILN_ERR_RANGE, "sliding window pattern must be >= 1");
    const kiln_dtype_info *ti = kiln_dtype_get(c->type);
    if (!ti || !ti->supported || c->type == KILN_DTYPE_Q8_K)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "weight type %s cannot be generated",
                            kiln_dtype_name(c->type));
    return KILN_OK;
}

/* ---- tensor list ---- */

/* llama.cpp's type for a matrix whose rows are not a multiple of the block size
 * (llama_tensor_get_type's fallback; q2_K / q3_K fall back to q4_0 here because kiln does
 * not support iq4_nl); then f16 when even that does not fit. */
static uint32_t matrix_type(uint32_t want, int64_t row) {
    uint32_t t = want;
    if (row % (int64_t)kiln_dtype_get(t)->block_size) {
        switch (want) {
        case KILN_DTYPE_Q2_K:
        case KILN_DTYPE_Q3_K:
            t = KILN_DTYPE_Q4_0;
            break;
        case KILN_DTYPE_Q4_K:
            t = KILN_DTYPE_Q5_0;
            break;
        case KILN_DTYPE_Q5_K:
            t = KILN_DTYPE_Q5_1;
            break;
        case KILN_DTYPE_Q6_K:
            t = KILN_DTYPE_Q8_0;
            break;
        default:
            t = KILN_DTYPE_F16;
            break;
        }
        if (row % (int64_t)kiln_dtype_get(t)->block_size) t = KILN_DTYPE_F16;
    }
    return t;
}

static uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

typedef struct builder {
    gen_model *m;
    size_t cap;
    bool oom;
} builder;

static gen_tensor *add(builder *b, const char *hf, const char *gg, int64_t in, int64_t out,
                       gen_init init, float std) {
    gen_model *m = b->m;
    if (m->n_t == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        gen_tensor *p = kiln_realloc(m->t, cap * sizeof *p);
        if (!p) {
            b->oom = true;
            return NULL;
        }
        m->t = p, b->cap = cap;
    }
    gen_tensor *t = &m->t[m->n_t++];
    memset(t, 0, sizeof *t);
    snprintf(t->hf_name, sizeof t->hf_name, "%s", hf);
    snprintf(t->gguf_name, sizeof t->gguf_name, "%s", gg);
    t->rank = out > 0 ? 2 : 1;
    t->ne[0] = in;
    t->ne[1] = out > 0 ? out : 1;
    t->init = init;
    t->std = std;
    t->gemma_norm = init == GEN_INIT_NORM && m->cfg.family == GEN_GEMMA3;
    t->mean = init == GEN_INIT_NORM && !t->gemma_norm ? 1.0f : 0.0f;
    t->gguf_type = t->rank == 1 ? KILN_DTYPE_F32 : matrix_type(m->cfg.type, in);
    t->seed = mix64(m->cfg.seed ^ name_hash(hf));
    return t;
}

static float matrix_std(int64_t fan_in) {
    return 0.02f * (fan_in < 512 ? sqrtf(512.0f / (float)fan_in) : 1.0f);
}

/* llama-quantize's use_more_bits: the first and last eighth of the layers and every
 * third layer in between */
static bool more_bits(int64_t i, int64_t n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* The Q4_K_M / Q5_K_M recipe of llama-quantize (llama_tensor_get_type, no imatrix,
 * dense models): lm_head (or the tied embedding) q6_K, attn_v and ffn_down q6_K in the
 * more_bits layers, the rest the base type; then the usual fallback for rows that are not
 * a multiple of 256 (q6_K -> q8_0, q4_K -> q5_0, q5_K -> q5_1). On gemma3-270m this gives
 * exactly the type layout of the published Q4_K_M file. */
static void apply_mix_m(gen_model *m) {
    const gen_config *c = &m->cfg;
    for (size_t i = 0; i < m->n_t; i++) {
        gen_tensor *t = &m->t[i];
        if (t->rank != 2) continue;
        uint32_t want = c->type;
        long long layer;
        char what[48];
        if (strcmp(t->gguf_name, "output.weight") == 0 ||
            (c->tied && strcmp(t->gguf_name, "token_embd.weight") == 0)) {
            want = KILN_DTYPE_Q6_K;
        } else if (sscanf(t->gguf_name, "blk.%lld.%47[a-z_]", &layer, what) == 2 &&
                   (strcmp(what, "attn_v") == 0 || strcmp(what, "ffn_down") == 0) &&
                   more_bits(layer, c->n_layer)) {
            want = KILN_DTYPE_Q6_K;
        }
        t->gguf_type = matrix_type(want, t->ne[0]);
    }
}

kiln_status gen_model_build(gen_model *m, kiln_err *err) {
    const gen_config *c = &m->cfg;
    builder b = {m, 0, false};
    m->t = NULL, m->n_t = 0;
    const int64_t d = c->n_embd, q = c->n_head * c->head_dim, kv = c->n_head_kv * c->head_dim;
    /* Scales (docs/GENERATOR.md): with random weights, and above all with tied
     * embeddings, a model repeats its input token when h_final ~ E[token] (the self-logit
     * is ~ d * std_E^2). The self-logit advantage over the spread of the other logits is
     * about sigma / rms(h), where sigma = std_E * sqrt(d) is the logits' standard
     * deviation, so the layers must grow the residual stream to rms(h) ~ sigma:
     *  - q/k/v/gate/up: normal(0, matrix_std(d)), giving outputs of rms a = std * sqrt(d);
     *  - o_proj and down_proj are scaled so each sublayer adds rms r = 2 / sqrt(2 L);
     *  - Gemma normalizes each sublayer's output (post norms), so there the post-norm
     *    weights gamma carry the scale: rms(h) ~ gamma * sqrt(2 L) ~ sigma * sqrt(d).
     * Logits then have sigma ~ 1.5 (tied) or 2 (lm_head). */
    const float norm_std = 0.05f;
    const float emb_std = 1.5f / sqrtf((float)d);
    const float head_std = 2.0f / sqrtf((float)d);
    const float a_in = matrix_std(d) * sqrtf((float)d);
    const float r = 2.0f / sqrtf(2.0f * (float)c->n_layer);
    const float o_std = r / (a_in * sqrtf((float)q));
    const float act = a_in * a_in / sqrtf(3.0f) + 1e-3f;
    const float down_std = r / (act * sqrtf((float)c->n_ff));
    const float gamma = 1.5f * sqrtf((float)d) / sqrtf(2.0f * (float)c->n_layer);
    char hf[96], gg[64];

    add(&b, "model.embed_tokens.weight", "token_embd.weight", d, c->n_vocab, GEN_INIT_EMBED,
        emb_std);
    for (int64_t l = 0; l < c->n_layer; l++) {
#define L(h, g, in, out, init, std)                                                                \
    do {                                                                                           \
        snprintf(hf, sizeof hf, "model.layers.%lld.%s", (long long)l, h);                          \
        snprintf(gg, sizeof gg, "blk.%lld.%s", (long long)l, g);                                   \
        last = add(&b, hf, gg, in, out, init, std);                                                \
    } while (0)
        gen_tensor *last;
        L("input_layernorm.weight", "attn_norm.weight", d, 0, GEN_INIT_NORM, norm_std);
        L("self_attn.q_proj.weight", "attn_q.weight", d, q, GEN_INIT_MATRIX, matrix_std(d));
        if (last && c->family == GEN_LLAMA) last->perm_heads = c->n_head;
        L("self_attn.k_proj.weight", "attn_k.weight", d, kv, GEN_INIT_MATRIX, matrix_std(d));
        if (last && c->family == GEN_LLAMA) last->perm_heads = c->n_head_kv;
        L("self_attn.v_proj.weight", "attn_v.weight", d, kv, GEN_INIT_MATRIX, matrix_std(d));
        if (c->family == GEN_QWEN2) {
            L("self_attn.q_proj.bias", "attn_q.bias", q, 0, GEN_INIT_BIAS, 0.02f);
            L("self_attn.k_proj.bias", "attn_k.bias", kv, 0, GEN_INIT_BIAS, 0.02f);
            L("self_attn.v_proj.bias", "attn_v.bias", kv, 0, GEN_INIT_BIAS, 0.02f);
        }
        if (c->family == GEN_QWEN3 || c->family == GEN_GEMMA3) {
            L("self_attn.q_norm.weight", "attn_q_norm.weight", c->head_dim, 0, GEN_INIT_NORM,
              norm_std);
            L("self_attn.k_norm.weight", "attn_k_norm.weight", c->head_dim, 0, GEN_INIT_NORM,
              norm_std);
        }
        L("self_attn.o_proj.weight", "attn_output.weight", q, d, GEN_INIT_MATRIX, o_std);
        if (c->family == GEN_GEMMA3) {
            L("post_attention_layernorm.weight", "post_attention_norm.weight", d, 0, GEN_INIT_NORM,
              norm_std);
            if (last) last->mean = gamma - 1.0f;
            L("pre_feedforward_layernorm.weight", "ffn_norm.weight", d, 0, GEN_INIT_NORM, norm_std);
        } else {
            L("post_attention_layernorm.weight", "ffn_norm.weight", d, 0, GEN_INIT_NORM, norm_std);
        }
        L("mlp.gate_proj.weight", "ffn_gate.weight", d, c->n_ff, GEN_INIT_MATRIX, matrix_std(d));
        L("mlp.up_proj.weight", "ffn_up.weight", d, c->n_ff, GEN_INIT_MATRIX, matrix_std(d));
        L("mlp.down_proj.weight", "ffn_down.weight", c->n_ff, d, GEN_INIT_MATRIX, down_std);
        if (c->family == GEN_GEMMA3) {
            L("post_feedforward_layernorm.weight", "post_ffw_norm.weight", d, 0, GEN_INIT_NORM,
              norm_std);
            if (last) last->mean = gamma - 1.0f;
        }
#undef L
    }
    add(&b, "model.norm.weight", "output_norm.weight", d, 0, GEN_INIT_NORM, norm_std);
    if (!c->tied)
        add(&b, "lm_head.weight", "output.weight", d, c->n_vocab, GEN_INIT_EMBED, head_std);
    if (b.oom) {
        gen_model_free(m);
        return kiln_err_set(err, KILN_ERR_NOMEM, "building the tensor list");
    }
    if (c->mix_m) apply_mix_m(m);
    return KILN_OK;
}

void gen_model_free(gen_model *m) {
    kiln_free(m->t);
    m->t = NULL;
    m->n_t = 0;
}

/* ---- values ---- */

/* Approximately normal (sum of four 16-bit uniforms; exact mean 0, std 1, |x| < 3.47). */
static inline float normal_from(uint64_t r) {
    const uint64_t s = (r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48);
    return (float)((double)s - 131070.0) * (float)(1.0 / 37837.23);
}

/* bf16 grid (round to nearest even), so norm values are identical in f32 / f16 / bf16 */
static float to_bf16_grid(float x) {
    return kiln_bf16_to_f32(kiln_f32_to_bf16(x));
}

void gen_row_hf(const gen_tensor *t, int64_t row, float *out) {
    uint64_t s = mix64(t->seed + (uint64_t)row * 0xD1B54A32D192ED03ull);
    const int64_t n = t->ne[0];
    const float std = t->std;
    switch (t->init) {
    case GEN_INIT_NORM:
        for (int64_t i = 0; i < n; i++) {
            s += 0x9E3779B97F4A7C15ull;
            /* HF value: mean + noise (mean 1, or for Gemma, which stores w for 1 + w, 0) */
            out[i] = to_bf16_grid(t->mean + normal_from(mix64(s)) * std);
        }
        break;
    default:
        for (int64_t i = 0; i < n; i++) {
            s += 0x9E3779B97F4A7C15ull;
            out[i] = normal_from(mix64(s)) * std;
        }
        break;
    }
}

void gen_row_gguf(const gen_tensor *t, int64_t row, float *out) {
    int64_t hf_row = row;
    if (t->perm_heads > 0) {
        /* llama.cpp's LlamaModel.permute: within a head of hd rows, GGUF row 2j + k is HF
         * row k * hd/2 + j (interleaved rope pairs instead of halves) */
        const int64_t hd = t->ne[1] / t->perm_heads;
        const int64_t h = row / hd, r = row % hd, j = r / 2, k = r % 2;
        hf_row = h * hd + k * (hd / 2) + j;
    }
    gen_row_hf(t, hf_row, out);
    if (t->gemma_norm)
        for (int64_t i = 0; i < t->ne[0]; i++) out[i] = 1.0f + out[i];
}

uint32_t gen_file_type(const gen_config *c) {
    if (c->mix_m) return c->type == KILN_DTYPE_Q4_K ? 15 : 17; /* Q4_K_M, Q5_K_M */
    switch (c->type) {
    case KILN_DTYPE_F32:
        return 0;
    case KILN_DTYPE_F16:
        return 1;
    case KILN_DTYPE_Q4_0:
        return 2;
    case KILN_DTYPE_Q4_1:
        return 3;
    case KILN_DTYPE_Q8_0:
        return 7;
    case KILN_DTYPE_Q5_0:
        return 8;
    case KILN_DTYPE_Q5_1:
        return 9;
    case KILN_DTYPE_Q2_K:
        return 10;
    case KILN_DTYPE_Q3_K:
        return 11; /* Q3_K_S */
    case KILN_DTYPE_Q4_K:
        return 14; /* Q4_K_S */
    case KILN_DTYPE_Q5_K:
        return 16; /* Q5_K_S */
    case KILN_DTYPE_Q6_K:
        return 18;
    case KILN_DTYPE_BF16:
        return 32;
    default:
        return 0;
    }
}

uint64_t gen_param_count(const gen_model *m) {
    uint64_t n = 0;
    for (size_t i = 0; i < m->n_t; i++) n += (uint64_t)(m->t[i].ne[0] * m->t[i].ne[1]);
    return n;
}
