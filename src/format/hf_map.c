/* hf_map.c — HF config.json and tensor names -> GGUF keys and names (see hf_map.h). */
#include "format/hf_map.h"
#include "base/mem.h"

#include "format/tensor.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- architecture detection ---------------------------------------------------------- */

static const struct {
    const char *hf; /* model_type or architectures[0] */
    const char *arch;
    bool text_config; /* the text model's hparams are in "text_config" */
} arch_table[] = {
    {"llama", "llama", false},
    {"mistral", "llama", false},
    {"LlamaForCausalLM", "llama", false},
    {"MistralForCausalLM", "llama", false},
    {"qwen2", "qwen2", false},
    {"Qwen2ForCausalLM", "qwen2", false},
    {"qwen3", "qwen3", false},
    {"Qwen3ForCausalLM", "qwen3", false},
    {"gemma3_text", "gemma3", false},
    {"Gemma3ForCausalLM", "gemma3", false},
    {"gemma3", "gemma3", true},
    {"Gemma3ForConditionalGeneration", "gemma3", true},
};

static int find_arch(const char *s) {
    if (!s) return -1;
    for (size_t i = 0; i < sizeof arch_table / sizeof arch_table[0]; i++)
        if (strcmp(arch_table[i].hf, s) == 0) return (int)i;
    return -1;
}

/* ---- typed field readers (errors name the field) ------------------------------------- */

typedef struct ctx {
    kiln_meta *m;
    json_t *hp;   /* the object holding the hparams */
    json_t *root; /* config.json's top level */
    const char *arch;
    const char *path;
    kiln_err *err;
} ctx;

static kiln_status key_of(const ctx *c, const char *suffix, char *buf, size_t n) {
    if (snprintf(buf, n, "%s.%s", c->arch, suffix) >= (int)n)
        return kiln_err_set(c->err, KILN_ERR_INTERNAL, "key too long");
    return KILN_OK;
}

/* u32 field: absent -> def (or skipped when def < 0, or an error when required). */
static kiln_status map_u32(ctx *c, const char *hf, const char *suffix, int64_t def, bool required) {
    json_t *v = json_object_get(c->hp, hf);
    char key[160];
    KILN_TRY(key_of(c, suffix, key, sizeof key));
    if (!v || json_is_null(v)) {
        if (required)
            return kiln_err_set(c->err, KILN_ERR_NOT_FOUND, "required field \"%s\" is missing", hf);
        if (def < 0) return KILN_OK;
        return kiln_meta_set_u32(c->m, key, (uint32_t)def, c->err);
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX)
        return kiln_err_set(c->err, KILN_ERR_TYPE, "field \"%s\" is not an integer in [0, 2^32)",
                            hf);
    return kiln_meta_set_u32(c->m, key, (uint32_t)json_integer_value(v), c->err);
}

static bool json_num(const json_t *v, double *out) {
    if (!json_is_number(v)) return false;
    *out = json_number_value(v);
    return true;
}

/* f32 field from v (may be NULL): absent -> def (skipped when def is NaN). */
static kiln_status map_f32_val(ctx *c, json_t *v, const char *hf, const char *suffix, double def) {
    char key[160];
    KILN_TRY(key_of(c, suffix, key, sizeof key));
    double x;
    if (!v || json_is_null(v)) {
        if (def != def) return KILN_OK;
        return kiln_meta_set_f32(c->m, key, (float)def, c->err);
    }
    if (!json_num(v, &x))
        return kiln_err_set(c->err, KILN_ERR_TYPE, "field \"%s\" is not a number", hf);
    return kiln_meta_set_f32(c->m, key, (float)x, c->err);
}

static kiln_status map_f32(ctx *c, const char *hf, const char *suffix, double def) {
    return map_f32_val(c, json_object_get(c->hp, hf), hf, suffix, def);
}

/* ---- rope ------------------------------------------------------------------------------ */

/* rope_theta lives at the top (older configs) or in rope_parameters (newer transformers),
 * possibly per attention kind ("full_attention" / "sliding_attention"). */
static json_t *rope_param(json_t *hp, const char *kind, const char *name) {
    json_t *rp = json_object_get(hp, "rope_parameters");
    if (json_is_object(rp)) {
        json_t *k = kind ? json_object_get(rp, kind) : NULL;
        if (json_is_object(k) && json_object_get(k, name)) return json_object_get(k, name);
        if (json_object_get(rp, name)) return json_object_get(rp, name);
    }
    return NULL;
}

static kiln_status map_rope_scaling(ctx *c) {
    json_t *rs = json_object_get(c->hp, "rope_scaling");
    if (!json_is_object(rs)) {
        json_t *rp = json_object_get(c->hp, "rope_parameters");
        if (json_is_object(rp) && json_is_object(json_object_get(rp, "full_attention")))
            rp = json_object_get(rp, "full_attention");
        rs = rp;
    }
    if (!json_is_object(rs)) return KILN_OK;
    json_t *t = json_object_get(rs, "rope_type");
    if (!t) t = json_object_get(rs, "type");
    if (!json_is_string(t)) return KILN_OK;
    const char *type = json_string_value(t);
    if (strcmp(type, "default") == 0) return KILN_OK;
    char key[160];
    if (strcmp(type, "linear") != 0 && strcmp(type, "yarn") != 0 && strcmp(type, "llama3") != 0)
        return kiln_err_set(c->err, KILN_ERR_UNSUPPORTED, "rope scaling type \"%s\"", type);
    KILN_TRY(key_of(c, "rope.scaling.type", key, sizeof key));
    KILN_TRY(kiln_meta_set_str(c->m, key, kiln_str_c(type), c->err));
    KILN_TRY(map_f32_val(c, json_object_get(rs, "factor"), "rope_scaling.factor",
                         "rope.scaling.factor", 1.0));
    json_t *oc = json_object_get(rs, "original_max_position_embeddings");
    if (json_is_integer(oc) && json_integer_value(oc) >= 0 &&
        json_integer_value(oc) <= UINT32_MAX) {
        KILN_TRY(key_of(c, "rope.scaling.original_context_length", key, sizeof key));
        KILN_TRY(kiln_meta_set_u32(c->m, key, (uint32_t)json_integer_value(oc), c->err));
    }
    if (strcmp(type, "llama3") == 0) {
        KILN_TRY(map_f32_val(c, json_object_get(rs, "low_freq_factor"),
                             "rope_scaling.low_freq_factor", "rope.scaling.low_freq_factor", 1.0));
        KILN_TRY(map_f32_val(c, json_object_get(rs, "high_freq_factor"),
                             "rope_scaling.high_freq_factor", "rope.scaling.high_freq_factor",
                             4.0));
    }
    return KILN_OK;
}

/* ---- raw copies: hf.config.<key> -------------------------------------------------------- */

static kiln_status raw_array(ctx *c, const char *key, json_t *a) {
    size_t n = json_array_size(a), i;
    json_t *v;
    bool all_int = true, all_num = true, all_str = true, all_bool = true;
    json_array_foreach(a, i, v) {
        all_int &= json_is_integer(v);
        all_num &= json_is_number(v);
        all_str &= json_is_string(v);
        all_bool &= json_is_boolean(v);
    }
    if (n == 0 || all_int) {
        int64_t *x = kiln_malloc((n ? n : 1) * sizeof *x);
        if (!x) return kiln_err_set(c->err, KILN_ERR_NOMEM, "config array");
        json_array_foreach(a, i, v) x[i] = json_integer_value(v);
        kiln_status st = kiln_meta_set_arr(c->m, key, KILN_META_I64, x, n, c->err);
        kiln_free(x);
        return st;
    }
    if (all_num) {
        double *x = kiln_malloc(n * sizeof *x);
        if (!x) return kiln_err_set(c->err, KILN_ERR_NOMEM, "config array");
        json_array_foreach(a, i, v) x[i] = json_number_value(v);
        kiln_status st = kiln_meta_set_arr(c->m, key, KILN_META_F64, x, n, c->err);
        kiln_free(x);
        return st;
    }
    if (all_bool) {
        uint8_t *x = kiln_malloc(n);
        if (!x) return kiln_err_set(c->err, KILN_ERR_NOMEM, "config array");
        json_array_foreach(a, i, v) x[i] = json_is_true(v);
        kiln_status st = kiln_meta_set_arr(c->m, key, KILN_META_BOOL, x, n, c->err);
        kiln_free(x);
        return st;
    }
    if (!all_str) return KILN_OK; /* mixed arrays are not kept */
    kiln_arena *ar = kiln_meta_arena(c->m);
    kiln_str *strs = kiln_arena_alloc(ar, n * sizeof *strs);
    char *k = kiln_arena_strndup(ar, key, strlen(key));
    if (!strs || !k) return kiln_err_set(c->err, KILN_ERR_NOMEM, "config array");
    json_array_foreach(a, i, v) {
        size_t len = json_string_length(v);
        char *s = kiln_arena_strndup(ar, json_string_value(v), len);
        if (!s) return kiln_err_set(c->err, KILN_ERR_NOMEM, "config array");
        strs[i].ptr = s;
        strs[i].len = len;
    }
    kiln_meta_value mv = {.type = KILN_META_ARRAY, .elem_type = KILN_META_STRING, .count = n};
    mv.v.strs = strs;
    return kiln_meta_add(c->m, kiln_str_c(k), &mv, c->err);
}

static kiln_status raw_copy(ctx *c) {
    const char *k;
    json_t *v;
    json_object_foreach(c->hp, k, v) {
        char key[256];
        if (snprintf(key, sizeof key, "hf.config.%s", k) >= (int)sizeof key) continue;
        kiln_status st = KILN_OK;
        if (json_is_integer(v)) {
            kiln_meta_value mv = {.type = KILN_META_I64};
            mv.v.i = json_integer_value(v);
            char *kk = kiln_arena_strndup(kiln_meta_arena(c->m), key, strlen(key));
            if (!kk) return kiln_err_set(c->err, KILN_ERR_NOMEM, "config");
            st = kiln_meta_add(c->m, kiln_str_c(kk), &mv, c->err);
        } else if (json_is_real(v)) {
            kiln_meta_value mv = {.type = KILN_META_F64};
            mv.v.f = json_real_value(v);
            char *kk = kiln_arena_strndup(kiln_meta_arena(c->m), key, strlen(key));
            if (!kk) return kiln_err_set(c->err, KILN_ERR_NOMEM, "config");
            st = kiln_meta_add(c->m, kiln_str_c(kk), &mv, c->err);
        } else if (json_is_boolean(v)) {
            st = kiln_meta_set_bool(c->m, key, json_is_true(v), c->err);
        } else if (json_is_string(v)) {
            kiln_str s = {json_string_value(v), json_string_length(v)};
            st = kiln_meta_set_str(c->m, key, s, c->err);
        } else if (json_is_array(v)) {
            st = raw_array(c, key, v);
        }
        if (st) return st;
    }
    return KILN_OK;
}

/* ---- the mapping -------------------------------------------------------------------- */

static kiln_status token_id(ctx *c, const char *hf, const char *key) {
    json_t *v = json_object_get(c->hp, hf);
    if (!v) v = json_object_get(c->root, hf);       /* multimodal configs keep them at the top */
    if (json_is_array(v)) v = json_array_get(v, 0); /* eos may be a list: the first is primary */
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX)
        return KILN_OK;
    return kiln_meta_set_u32(c->m, key, (uint32_t)json_integer_value(v), c->err);
}

static kiln_status map_all(ctx *c, json_t *root) {
    const bool gemma = strcmp(c->arch, "gemma3") == 0;
    const bool llama = strcmp(c->arch, "llama") == 0;
    KILN_TRY(kiln_meta_set_str(c->m, "general.architecture", kiln_str_c(c->arch), c->err));
    json_t *nm = json_object_get(root, "_name_or_path");
    if (json_is_string(nm))
        KILN_TRY(
            kiln_meta_set_str(c->m, "general.name", kiln_str_c(json_string_value(nm)), c->err));
    KILN_TRY(map_u32(c, "num_hidden_layers", "block_count", -1, true));
    KILN_TRY(map_u32(c, "hidden_size", "embedding_length", -1, true));
    KILN_TRY(map_u32(c, "num_attention_heads", "attention.head_count", -1, true));
    KILN_TRY(map_u32(c, "max_position_embeddings", "context_length", gemma ? 131072 : -1, false));
    KILN_TRY(map_u32(c, "intermediate_size", "feed_forward_length", -1, false));
    json_t *heads = json_object_get(c->hp, "num_attention_heads");
    KILN_TRY(map_u32(c, "num_key_value_heads", "attention.head_count_kv",
                     gemma ? 4 : (int64_t)json_integer_value(heads), false));
    KILN_TRY(map_f32(c, "rms_norm_eps", "attention.layer_norm_rms_epsilon", gemma ? 1e-6 : NAN));
    json_t *hd = json_object_get(c->hp, "head_dim");
    int64_t head_dim = -1;
    if (hd && !json_is_null(hd)) {
        KILN_TRY(map_u32(c, "head_dim", "attention.key_length", -1, false));
        KILN_TRY(map_u32(c, "head_dim", "attention.value_length", -1, false));
        head_dim = json_integer_value(hd);
    } else if (gemma) {
        KILN_TRY(map_u32(c, "head_dim", "attention.key_length", 256, false));
        KILN_TRY(map_u32(c, "head_dim", "attention.value_length", 256, false));
    }
    json_t *theta = json_object_get(c->hp, "rope_theta");
    if (!theta) theta = rope_param(c->hp, "full_attention", "rope_theta");
    KILN_TRY(map_f32_val(c, theta, "rope_theta", "rope.freq_base", gemma ? 1000000.0 : NAN));
    KILN_TRY(map_rope_scaling(c));
    if (gemma) {
        json_t *local = json_object_get(c->hp, "rope_local_base_freq");
        if (!local) local = rope_param(c->hp, "sliding_attention", "rope_theta");
        KILN_TRY(map_f32_val(c, local, "rope_local_base_freq", "rope.freq_base_swa", NAN));
        KILN_TRY(map_u32(c, "sliding_window", "attention.sliding_window", -1, false));
        KILN_TRY(map_f32(c, "final_logit_softcapping", "final_logit_softcapping", NAN));
    }
    if (llama) {
        KILN_TRY(map_u32(c, "vocab_size", "vocab_size", -1, false));
        if (head_dim < 0) {
            json_t *hs = json_object_get(c->hp, "hidden_size");
            int64_t h = json_integer_value(heads);
            if (h > 0) head_dim = json_integer_value(hs) / h;
        }
        if (head_dim > 0) {
            char key[64];
            KILN_TRY(key_of(c, "rope.dimension_count", key, sizeof key));
            KILN_TRY(kiln_meta_set_u32(c->m, key, (uint32_t)head_dim, c->err));
        }
    }
    KILN_TRY(token_id(c, "bos_token_id", "tokenizer.ggml.bos_token_id"));
    KILN_TRY(token_id(c, "eos_token_id", "tokenizer.ggml.eos_token_id"));
    return raw_copy(c);
}

kiln_status kiln_hf_config_to_meta(const char *text, size_t len, const char *path, kiln_meta *m,
                                   kiln_err *err) {
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return kiln_err_set(err, KILN_ERR_FORMAT, "%s: %s (line %d, column %d)", path, je.text,
                            je.line, je.column);
    kiln_status st = KILN_OK;
    if (!json_is_object(root)) {
        st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: not a JSON object", path);
        goto done;
    }
    json_t *mt = json_object_get(root, "model_type");
    int a = find_arch(json_string_value(mt));
    json_t *archs = json_object_get(root, "architectures");
    if (a < 0 && json_is_array(archs)) a = find_arch(json_string_value(json_array_get(archs, 0)));
    if (a < 0) {
        st = kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                          "%s: model_type \"%s\" / architectures[0] \"%s\" is not a family kiln "
                          "maps (llama, mistral, qwen2, qwen3, gemma3)",
                          path, json_is_string(mt) ? json_string_value(mt) : "",
                          json_is_string(json_array_get(archs, 0))
                              ? json_string_value(json_array_get(archs, 0))
                              : "");
        goto done;
    }
    ctx c = {m, root, root, arch_table[a].arch, path, err};
    if (arch_table[a].text_config) {
        c.hp = json_object_get(root, "text_config");
        if (!json_is_object(c.hp)) {
            st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: \"text_config\" missing or not an object",
                              path);
            goto done;
        }
    }
    st = map_all(&c, root);
    if (st) kiln_err_wrap(err, st, "%s", path);
done:
    json_decref(root);
    return st;
}

/* ---- tensor names ---------------------------------------------------------------------- */

/* Per-layer suffixes: HF (after "model.layers.N.") -> GGUF (after "blk.N."). */
static const struct {
    const char *hf, *gguf;
    bool gemma_only, not_gemma;
} layer_names[] = {
    {"self_attn.q_proj.weight", "attn_q.weight", false, false},
    {"self_attn.q_proj.bias", "attn_q.bias", false, false},
    {"self_attn.k_proj.weight", "attn_k.weight", false, false},
    {"self_attn.k_proj.bias", "attn_k.bias", false, false},
    {"self_attn.v_proj.weight", "attn_v.weight", false, false},
    {"self_attn.v_proj.bias", "attn_v.bias", false, false},
    {"self_attn.o_proj.weight", "attn_output.weight", false, false},
    {"self_attn.o_proj.bias", "attn_output.bias", false, false},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", false, false},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", false, false},
    {"mlp.gate_proj.weight", "ffn_gate.weight", false, false},
    {"mlp.up_proj.weight", "ffn_up.weight", false, false},
    {"mlp.down_proj.weight", "ffn_down.weight", false, false},
    {"input_layernorm.weight", "attn_norm.weight", false, false},
    {"post_attention_layernorm.weight", "ffn_norm.weight", false, true},
    {"post_attention_layernorm.weight", "post_attention_norm.weight", true, false},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight", true, false},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight", true, false},
};

static const struct {
    const char *hf, *gguf;
} global_names[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

/* Multimodal checkpoints nest the text model: strip to the plain layout. */
static const struct {
    const char *from, *to;
} prefixes[] = {
    {"model.language_model.", "model."},
    {"language_model.model.", "model."},
    {"language_model.lm_head.", "lm_head."},
};

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

bool kiln_hf_tensor_name(const char *arch, const char *hf_name, char *out, size_t n,
                         uint32_t *fixup) {
    *fixup = KILN_FIXUP_NONE;
    if (n) snprintf(out, n, "%s", hf_name);
    const bool gemma = strcmp(arch, "gemma3") == 0;
    char name[512];
    if (snprintf(name, sizeof name, "%s", hf_name) >= (int)sizeof name) return false;
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        size_t pl = strlen(prefixes[i].from);
        if (strncmp(name, prefixes[i].from, pl) == 0) {
            char tmp[512];
            snprintf(tmp, sizeof tmp, "%s%s", prefixes[i].to, name + pl);
            memcpy(name, tmp, sizeof name);
            break;
        }
    }
    const char *mapped = NULL;
    char buf[512];
    for (size_t i = 0; i < sizeof global_names / sizeof global_names[0]; i++)
        if (strcmp(name, global_names[i].hf) == 0) mapped = global_names[i].gguf;
    static const char layers[] = "model.layers.";
    if (!mapped && strncmp(name, layers, sizeof layers - 1) == 0) {
        const char *p = name + sizeof layers - 1;
        char *end;
        unsigned long blk = strtoul(p, &end, 10);
        if (end != p && *end == '.' && (*p != '0' || end == p + 1) && blk < 100000) {
            for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++) {
                if (layer_names[i].gemma_only && !gemma) continue;
                if (layer_names[i].not_gemma && gemma) continue;
                if (strcmp(end + 1, layer_names[i].hf) == 0) {
                    snprintf(buf, sizeof buf, "blk.%lu.%s", blk, layer_names[i].gguf);
                    mapped = buf;
                    break;
                }
            }
        }
    }
    if (!mapped) return false;
    if (gemma && ends_with(name, "norm.weight")) *fixup = KILN_FIXUP_ADD_ONE;
    if (n) snprintf(out, n, "%s", mapped);
    return true;
}
