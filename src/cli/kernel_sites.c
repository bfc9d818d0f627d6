/* kernel_sites.c — the bound plan's call sites for the kernel tools (kernel_sites.h). */
#include "cli/kernel_sites.h"
#include "base/mem.h"

#include "cli/commands.h"
#include "runtime/kselect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the bound weight a matmul / embed call site reads (same dtype and shape) */
static const kiln_bound_weight *site_weight(const kiln_bound_insn *bi, const kiln_callsite *cs) {
    if (cs->op != KILN_KOP_MATMUL && cs->op != KILN_KOP_EMBED) return NULL;
    for (int k = 0; k < KILN_PLAN_MAX_WEIGHTS; k++) {
        const kiln_bound_weight *w = &bi->w[k];
        if (!w->data || w->dtype != cs->w_dtype) continue;
        bool match = cs->op == KILN_KOP_MATMUL ? (w->n == cs->n && w->k == cs->k) : (w->k == cs->n);
        if (match) return w;
    }
    return NULL;
}

kiln_status kiln_kernel_env_open(kiln_kernel_env *env, const char *model_arg, const char *backend,
                                 const char *policy_path, const char *perfdb_path, kiln_err *err) {
    memset(env, 0, sizeof *env);
    const char *bname = kiln_cli_backend(backend);
    env->be = kiln_backend_find(bname);
    if (!env->be)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "backend '%s' is not built in (%s)", bname,
                            kiln_backend_names());
    if (perfdb_path)
        snprintf(env->perf_path, sizeof env->perf_path, "%s", perfdb_path);
    else if (kiln_perfdb_default_path(env->perf_path, sizeof env->perf_path, NULL))
        env->perf_path[0] = 0;
    KILN_TRY(kiln_runtime_selector_configure(policy_path, perfdb_path, NULL, err));
    KILN_TRY(kiln_device_open(env->be, 0, &env->dev, err));
    env->dev_open = true;
    env->sel = kiln_kselect_selector(env->dev.ks);
    char path[1024];
    kiln_status st = kiln_resolve_model(model_arg, path, sizeof path, err);
    if (!st) st = kiln_model_load(path, &env->model, err);
    if (st) goto fail;
    if (!env->model->family) {
        st = kiln_err_set(err, KILN_ERR_UNSUPPORTED, "%s: no model family for '%s'", path,
                          env->model->cfg.arch);
        goto fail;
    }
    kiln_plan plan;
    kiln_plan_init(&plan);
    st = env->model->family->compile(&env->model->cfg, KILN_MODE_PREFILL, &plan, err);
    if (st) {
        kiln_plan_free(&plan);
        goto fail;
    }
    /* bound as the engine binds by default: steps of up to KILN_DEFAULT_STEP_TOKENS tokens
     * (a device kernel may cap its tokens, e.g. cuda.embed) */
    kiln_bind_opts bo;
    kiln_bind_opts_default(&bo);
    bo.max_tokens = KILN_DEFAULT_STEP_TOKENS;
    st = kiln_bind_plan_opts(&env->dev, env->model, &plan, &bo, &env->bp, NULL, err);
    if (st) goto fail;
    env->bound = true;
    int n = 0;
    for (int32_t i = 0; i < env->bp.plan.n_insns; i++) n += env->bp.bi[i].n_sites;
    env->sites = kiln_calloc((size_t)n + 1, sizeof *env->sites);
    if (!env->sites) {
        st = kiln_err_set(err, KILN_ERR_NOMEM, "call sites: out of memory");
        goto fail;
    }
    for (int32_t i = 0; i < env->bp.plan.n_insns; i++) {
        const kiln_bound_insn *bi = &env->bp.bi[i];
        for (int s = 0; s < bi->n_sites; s++) {
            kiln_model_site *ms = &env->sites[env->n_sites++];
            kiln_callsite cs = bi->site[s].desc;
            ms->cs = &bi->site[s].desc;
            ms->weight = site_weight(bi, ms->cs);
            ms->layer = bi->insn->layer;
            ms->opcode = kiln_opcode_name(bi->insn->opcode);
            snprintf(ms->site.name, sizeof ms->site.name, "%s", cs.name);
            ms->site.instr = i;
            cs.bucket = 0;
            kiln_callsite_ctx(env->be, &cs, &ms->site.ctx);
            /* plan limits: the engine's default step size, unbounded context */
            ms->site.ctx.tokens_max = KILN_DEFAULT_STEP_TOKENS;
            ms->site.ctx.seq_max = 0;
        }
    }
    if (!env->be->host_memory) { /* the engine samples on the device (engine.c) */
        kiln_callsite *cs = &env->sample_cs;
        *cs = (kiln_callsite){.op = KILN_KOP_SAMPLE, .w_dtype = KILN_DTYPE_F32};
        snprintf(cs->name, sizeof cs->name, "%s", KILN_SAMPLE_SITE);
        kiln_model_site *ms = &env->sites[env->n_sites++];
        ms->cs = cs;
        ms->layer = -1;
        ms->opcode = "sample";
        snprintf(ms->site.name, sizeof ms->site.name, "%s", cs->name);
        ms->site.instr = -1;
        kiln_callsite_ctx(env->be, cs, &ms->site.ctx);
    }
    return KILN_OK;
fail:
    kiln_kernel_env_close(env);
    return st;
}

void kiln_kernel_env_ctx(const kiln_kernel_env *env, const kiln_model_site *s, int64_t tokens,
                         kiln_sel_ctx *out) {
    kiln_callsite cs = *s->cs;
    cs.bucket = kiln_tok_bucket(tokens);
    kiln_callsite_ctx(env->be, &cs, out);
}

void kiln_kernel_env_close(kiln_kernel_env *env) {
    kiln_free(env->sites);
    if (env->bound) kiln_bound_plan_free(&env->bp);
    kiln_model_free(env->model);
    if (env->dev_open) kiln_device_close(&env->dev);
    memset(env, 0, sizeof *env);
}
