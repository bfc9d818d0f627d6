/* kernel_sites.c — call sites of a model from its tensors and metadata (kernel_sites.h). */
#include "cli/kernel_sites.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct site_list {
    kiln_model_site *v;
    int n, cap;
} site_list;

static kiln_model_site *push(site_list *l, kiln_err *err) {
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 64;
        kiln_model_site *nv = realloc(l->v, sizeof *nv * (size_t)nc);
        if (!nv) {
            kiln_err_set(err, KILN_ERR_NOMEM, "call sites: out of memory");
            return NULL;
        }
        l->v = nv, l->cap = nc;
    }
    kiln_model_site *s = &l->v[l->n++];
    memset(s, 0, sizeof *s);
    s->layer = -1;
    return s;
}

static void base_ctx(kiln_sel_ctx *c, kiln_kop op, kiln_backend_id b, int64_t max_tokens) {
    kiln_sel_ctx_init(c, op, b);
    c->tokens_max = max_tokens;
}

static uint32_t meta_u32(const kiln_meta *m, const char *arch, const char *key, uint32_t def) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    uint32_t v = def;
    if (kiln_meta_opt_u32(m, k, def, &v, NULL)) return def;
    return v;
}

static float meta_f32(const kiln_meta *m, const char *arch, const char *key) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    float v = 0;
    if (!kiln_meta_has(m, k) || kiln_meta_get_f32(m, k, &v, NULL)) return 0;
    return v;
}

kiln_status kiln_model_sites(const kiln_model_file *mf, kiln_backend_id backend, int64_t max_tokens,
                             int64_t max_ctx, kiln_model_site **out, int *n_out, kiln_err *err) {
    *out = NULL;
    *n_out = 0;
    const kiln_meta *m = kiln_model_file_meta(mf);
    const char *arch = kiln_model_file_arch(mf);
    if (!arch[0])
        return kiln_err_set(err, KILN_ERR_FORMAT, "%s: no general.architecture",
                            kiln_model_file_path(mf));
    uint32_t n_layer = meta_u32(m, arch, "block_count", 0);
    uint32_t dim = meta_u32(m, arch, "embedding_length", 0);
    uint32_t ffn = meta_u32(m, arch, "feed_forward_length", 0);
    uint32_t n_head = meta_u32(m, arch, "attention.head_count", 0);
    uint32_t n_kv = meta_u32(m, arch, "attention.head_count_kv", n_head);
    uint32_t hd = meta_u32(m, arch, "attention.key_length", n_head ? dim / n_head : 0);
    uint32_t window = meta_u32(m, arch, "attention.sliding_window", 0);
    float softcap = meta_f32(m, arch, "attn_logit_softcapping");
    if (max_ctx <= 0) max_ctx = meta_u32(m, arch, "context_length", 4096);
    if (!n_layer || !dim || !n_head || !hd)
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "%s: metadata lacks %s.block_count / embedding_length / "
                            "attention.head_count",
                            kiln_model_file_path(mf), arch);
    bool gelu = !strncmp(arch, "gemma", 5);
    site_list l = {0};
    kiln_model_site *s;
    /* weights: one matmul site per 2-D weight, the embedding */
    size_t nt = kiln_model_file_tensor_count(mf);
    bool has_output = kiln_model_file_find_tensor(mf, "output.weight") != NULL;
    for (size_t i = 0; i < nt; i++) {
        const kiln_tensor_info *t = kiln_model_file_tensor(mf, i);
        if (t->rank != 2) continue;
        size_t nl = strlen(t->name);
        if (nl < 7 || strcmp(t->name + nl - 7, ".weight")) continue;
        bool embd = !strcmp(t->name, "token_embd.weight");
        for (int pass = 0; pass < (embd && !has_output ? 2 : 1); pass++) {
            if (!(s = push(&l, err))) goto fail;
            s->weight = t;
            bool lookup = embd && pass == 0;
            base_ctx(&s->site.ctx, lookup ? KILN_KOP_EMBED : KILN_KOP_MATMUL, backend, max_tokens);
            s->site.ctx.w_dtype = t->dtype;
            s->site.ctx.n = lookup ? t->shape[0] : t->shape[1];
            s->site.ctx.k = lookup ? t->shape[1] : t->shape[0];
            snprintf(s->site.name, sizeof s->site.name, "%.*s%s", (int)(nl - 7), t->name,
                     lookup ? ".lookup" : (embd ? ".lm_head" : ""));
            int layer;
            if (sscanf(t->name, "blk.%d.", &layer) == 1) s->layer = layer;
            s->site.instr = -1;
        }
    }
    /* per-layer activation sites */
    for (uint32_t b = 0; b < n_layer; b++) {
        static const struct {
            const char *name;
            kiln_kop op;
        } per_layer[] = {{"attn_norm", KILN_KOP_RMS_NORM}, {"rope", KILN_KOP_ROPE},
                         {"kv_write", KILN_KOP_KV_WRITE},  {"attention", KILN_KOP_ATTENTION},
                         {"ffn_norm", KILN_KOP_RMS_NORM},  {"glu", KILN_KOP_GLU},
                         {"residual", KILN_KOP_ADD}};
        for (size_t j = 0; j < sizeof per_layer / sizeof per_layer[0]; j++) {
            if (!(s = push(&l, err))) goto fail;
            s->layer = (int)b;
            s->site.instr = -1;
            kiln_sel_ctx *c = &s->site.ctx;
            base_ctx(c, per_layer[j].op, backend, max_tokens);
            snprintf(s->site.name, sizeof s->site.name, "blk.%u.%s", b, per_layer[j].name);
            switch (per_layer[j].op) {
            case KILN_KOP_RMS_NORM:
                c->w_dtype = KILN_DTYPE_F32;
                c->n = dim;
                c->features = KILN_KFEAT_RESIDUAL;
                break;
            case KILN_KOP_GLU:
                c->n = ffn;
                if (gelu) c->features = KILN_KFEAT_GEGLU;
                break;
            case KILN_KOP_ADD:
                c->n = dim;
                break;
            case KILN_KOP_ROPE:
                c->head_dim = (int32_t)hd;
                c->n_head = (int32_t)n_head;
                c->n_kv_head = (int32_t)n_kv;
                if (strcmp(arch, "llama") != 0) c->features = KILN_KFEAT_ROPE_NEOX;
                break;
            default: /* kv_write, attention */
                c->kv_dtype = KILN_DTYPE_F16;
                c->head_dim = (int32_t)hd;
                c->n_head = (int32_t)n_head;
                c->n_kv_head = (int32_t)n_kv;
                c->features = KILN_KFEAT_PAGED_KV;
                if (per_layer[j].op == KILN_KOP_ATTENTION) {
                    c->seq_max = max_ctx;
                    c->features |= KILN_KFEAT_CAUSAL;
                    if (n_kv != n_head) c->features |= KILN_KFEAT_GQA;
                    if (window) c->features |= KILN_KFEAT_SLIDING_WINDOW;
                    if (softcap > 0) c->features |= KILN_KFEAT_SOFTCAP;
                }
                break;
            }
        }
    }
    if (!(s = push(&l, err))) goto fail;
    base_ctx(&s->site.ctx, KILN_KOP_RMS_NORM, backend, max_tokens);
    s->site.ctx.w_dtype = KILN_DTYPE_F32;
    s->site.ctx.n = dim;
    s->site.instr = -1;
    snprintf(s->site.name, sizeof s->site.name, "output_norm");
    *out = l.v;
    *n_out = l.n;
    return KILN_OK;
fail:
    free(l.v);
    return err ? err->code : KILN_ERR_NOMEM;
}

#include "cli/commands.h"
#include "kernels/perfdb.h"

#include <sys/stat.h>

bool kiln_cli_backend_arg(const char *cmd, const char *value, kiln_backend_id *out) {
    *out = KILN_BACKEND_CPU;
    if (!value) return true;
    if (kiln_backend_from_name(value, out)) return true;
    fprintf(stderr, "kiln %s: unknown backend '%s' (ref, cpu, cuda)\n", cmd, value);
    return false;
}

kiln_status kiln_kernel_env_open(kiln_kernel_env *env, const char *model_arg,
                                 kiln_backend_id backend, const char *policy_path,
                                 const char *perfdb_path, int64_t max_tokens, int64_t max_ctx,
                                 kiln_err *err) {
    memset(env, 0, sizeof *env);
    char path[1024];
    KILN_TRY(kiln_resolve_model(model_arg, path, sizeof path, err));
    KILN_TRY(kiln_model_file_open(path, 0, &env->mf, err));
    kiln_status st =
        kiln_model_sites(env->mf, backend, max_tokens, max_ctx, &env->sites, &env->n_sites, err);
    if (!st) st = kiln_policy_resolve(&env->policy, policy_path, err);
    if (st) goto fail;
    const kiln_registry *reg = kiln_registry_default();
    if (kiln_registry_default_error()[0]) {
        st = kiln_err_set(err, KILN_ERR_INTERNAL, "kernel registry: %s",
                          kiln_registry_default_error());
        goto fail;
    }
    /* timings of this machine, when a PerfDB exists (never created here) */
    struct stat sb;
    bool have_path = false;
    if (perfdb_path) {
        snprintf(env->perf_path, sizeof env->perf_path, "%s", perfdb_path);
        have_path = true;
    } else {
        have_path = !kiln_perfdb_default_path(env->perf_path, sizeof env->perf_path, NULL);
    }
    if (have_path && stat(env->perf_path, &sb) == 0) {
        kiln_perfdb *db;
        kiln_err e2;
        if (!kiln_perfdb_open(env->perf_path, &db, &e2)) {
            char dev[300];
            kiln_perfdb_host_device(dev, sizeof dev);
            if (kiln_perfdb_load_table(db, dev, &env->perf, &e2))
                fprintf(stderr, "warning: %s\n", e2.msg);
            kiln_perfdb_close(db);
        } else {
            fprintf(stderr, "warning: %s (continuing without timings)\n", e2.msg);
        }
    }
    st = kiln_selector_new(reg, &env->policy, env->perf, &env->sel, err);
    if (st) goto fail;
    return KILN_OK;
fail:
    kiln_kernel_env_close(env);
    return st;
}

void kiln_kernel_env_close(kiln_kernel_env *env) {
    kiln_selector_free(env->sel);
    kiln_perf_table_free(env->perf);
    free(env->sites);
    kiln_model_file_close(env->mf);
    memset(env, 0, sizeof *env);
}
