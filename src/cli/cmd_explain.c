/*
 * cmd_explain.c — `kiln explain -m MODEL [--backend B] [--tokens N] [--context L]
 * [--policy FILE] [--site PATTERN] [--all] [--json]`: for every kernel call site of the
 * model, the kernel chosen for a step of N tokens, its score, and every other candidate
 * with its score or the reasons it was rejected. Sites whose contexts are identical
 * (e.g. the same projection in every layer) are shown once, with the list of sites.
 */
#include "cli/args.h"
#include "base/mem.h"
#include "cli/commands.h"
#include "cli/kernel_sites.h"

#include <fnmatch.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void describe_ctx(const kiln_sel_ctx *c, char *buf, size_t n) {
    switch (c->op) {
    case KILN_KOP_MATMUL:
        snprintf(buf, n, "%s, n=%lld k=%lld", kiln_dtype_name(c->w_dtype), (long long)c->n,
                 (long long)c->k);
        break;
    case KILN_KOP_EMBED:
        snprintf(buf, n, "%s, dim=%lld vocab=%lld", kiln_dtype_name(c->w_dtype), (long long)c->n,
                 (long long)c->k);
        break;
    case KILN_KOP_ATTENTION:
    case KILN_KOP_KV_WRITE:
    case KILN_KOP_ROPE:
        snprintf(buf, n, "heads %d/%d x %d%s%s", c->n_head, c->n_kv_head, c->head_dim,
                 c->kv_dtype != KILN_DTYPE_NONE ? ", KV " : "",
                 c->kv_dtype != KILN_DTYPE_NONE ? kiln_dtype_name(c->kv_dtype) : "");
        break;
    default:
        snprintf(buf, n, "n=%lld", (long long)c->n);
        break;
    }
}

static bool same_ctx(const kiln_sel_ctx *a, const kiln_sel_ctx *b) {
    return memcmp(a, b, sizeof *a) == 0;
}

int kiln_cmd_explain(int argc, char **argv) {
    static const kiln_cmd_usage u = {
        "kiln explain -m MODEL [--backend B] [--tokens N] [options]",
        "Binds MODEL's plan to backend B (default cpu) as `kiln run` does and shows, for every "
        "kernel call site of every plan instruction, which kernel is chosen for a step of N "
        "tokens (default 1: decode), its score, and why every other candidate lost or was "
        "rejected. Reads the policy (--policy, KILN_POLICY, ~/.config/kiln/kiln.yaml, KILN_* "
        "variables) and this machine's PerfDB timings."};
    kiln_opt opts[] = {
        {"model", 'm', true, "MODEL", "model file or short name", false, NULL},
        {"backend", 'b', true, "B", KILN_BACKEND_HELP, false, NULL},
        {"tokens", 'n', true, "N", "tokens in the step (default 1)", false, NULL},
        {"policy", 0, true, "FILE", "policy file (kiln.yaml)", false, NULL},
        {"site", 's', true, "PATTERN", "only call sites matching this glob", false, NULL},
        {"all", 'a', false, NULL, "every site separately (no grouping)", false, NULL},
        {"json", 0, false, NULL, "machine-readable output", false, NULL},
        {"perfdb", 0, true, "PATH", "PerfDB file (default in the cache dir)", false, NULL},
    };
    const char *pos[4];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, opts, KILN_NOPTS(opts), pos, 4, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;
    if (!opts[0].seen) {
        fprintf(stderr, "kiln explain: -m MODEL is required\n");
        return 2;
    }
    int64_t tokens = 1;
    if (!kiln_opt_int(&opts[2], 1, 1 << 20, &tokens)) return 2;
    kiln_kernel_env env;
    kiln_err err;
    kiln_err_clear(&err);
    if (kiln_kernel_env_open(&env, opts[0].value, opts[1].value, opts[3].value, opts[7].value,
                             &err))
        return kiln_cli_fail("explain", &err);
    const kiln_policy *pol = kiln_selector_policy(env.sel);
    const kiln_perf_table *perf = kiln_selector_perf(env.sel);
    bool json = opts[6].seen;
    json_t *jsites = json ? json_array() : NULL;
    int tb = kiln_tok_bucket(tokens);
    if (!json) {
        printf("model %s — backend %s, step of %lld token%s (bucket %s)\n", env.model->path,
               env.be->name, (long long)tokens, tokens == 1 ? "" : "s", kiln_tok_bucket_name(tb));
        printf("policy: %s%s; PerfDB: %s (%d timings)\n", pol->path[0] ? pol->path : "defaults",
               pol->reference_only ? " (reference only)" : "", perf ? env.perf_path : "none",
               perf ? kiln_perf_table_size(perf) : 0);
    }
    bool *shown = kiln_calloc((size_t)env.n_sites + 1, sizeof *shown);
    int status = 0, groups = 0;
    for (int i = 0; i < env.n_sites && shown; i++) {
        if (shown[i]) continue;
        const kiln_sel_site *site = &env.sites[i].site;
        if (opts[4].seen && fnmatch(opts[4].value, site->name, 0) != 0) continue;
        kiln_sel_ctx c;
        kiln_kernel_env_ctx(&env, &env.sites[i], tokens, &c);
        /* the group: later sites with an identical context */
        char names[4096];
        int nn = 0, members = 0;
        names[0] = 0;
        for (int j = i; j < env.n_sites; j++) {
            if (shown[j] || !same_ctx(&env.sites[j].site.ctx, &site->ctx)) continue;
            if (opts[4].seen && fnmatch(opts[4].value, env.sites[j].site.name, 0) != 0) continue;
            if (j != i && opts[5].seen) continue;
            shown[j] = true;
            members++;
            if (members <= 3 && nn < (int)sizeof names - 80)
                nn += snprintf(names + nn, sizeof names - (size_t)nn, "%s%s",
                               members > 1 ? ", " : "", env.sites[j].site.name);
        }
        if (members > 3 && nn < (int)sizeof names - 40)
            snprintf(names + nn, sizeof names - (size_t)nn, " ... (%d sites)", members);
        kiln_sel_result res;
        kiln_err e2;
        kiln_err_clear(&e2);
        kiln_status st = kiln_select(env.sel, &c, KILN_SEL_NO_CACHE, &res, &e2);
        char what[200];
        describe_ctx(&c, what, sizeof what);
        groups++;
        if (json) {
            json_t *o = json_object();
            json_object_set_new(o, "sites", json_string(names));
            json_object_set_new(o, "instruction", json_integer(site->instr));
            json_object_set_new(o, "opcode", json_string(env.sites[i].opcode));
            json_object_set_new(o, "op", json_string(kiln_kop_name(c.op)));
            json_object_set_new(o, "shape", json_string(what));
            json_object_set_new(o, "chosen", st ? json_null() : json_string(res.chosen->spec.id));
            json_object_set_new(o, "score", json_real(res.score));
            json_object_set_new(o, "fallback", json_boolean(res.fallback));
            json_object_set_new(o, "locked", json_boolean(res.locked));
            if (st) json_object_set_new(o, "error", json_string(e2.msg));
            json_t *cands = json_array();
            for (int k = 0; k < res.n_cands; k++) {
                const kiln_sel_cand *cd = &res.cands[k];
                json_t *co = json_object();
                json_object_set_new(co, "kernel", json_string(cd->k->spec.id));
                if (!cd->reasons) {
                    json_object_set_new(co, "score", json_real(cd->score));
                    if (cd->perf_us > 0)
                        json_object_set_new(co, "median_us", json_real(cd->perf_us));
                } else {
                    json_t *rs = json_array();
                    for (int q = 0; q < KILN_REASON_COUNT; q++) {
                        if (!(cd->reasons & KILN_REASON_BIT(q))) continue;
                        char m[300];
                        kiln_reason_message((kiln_reason)q, env.sel, cd->k, &c, m, sizeof m);
                        json_t *ro = json_object();
                        json_object_set_new(ro, "code",
                                            json_string(kiln_reason_name((kiln_reason)q)));
                        json_object_set_new(ro, "message", json_string(m));
                        json_array_append_new(rs, ro);
                    }
                    json_object_set_new(co, "reasons", rs);
                }
                json_array_append_new(cands, co);
            }
            json_object_set_new(o, "candidates", cands);
            json_array_append_new(jsites, o);
            continue;
        }
        if (site->instr < 0) /* not a plan instruction's: the engine's sampled step */
            printf("\n%s [%s; %s] (sampled steps: the device samples)\n", names,
                   kiln_kop_name(c.op), what);
        else
            printf("\n%s [%s; %s] (plan insn %d: %s)\n", names, kiln_kop_name(c.op), what,
                   site->instr, env.sites[i].opcode);
        if (st) {
            printf("  ERROR: %s\n", e2.msg);
            status = 1;
            continue;
        }
        printf("  -> %-34s score %6.1f%s%s%s\n", res.chosen->spec.id, res.score,
               res.locked ? "  (policy lock)" : "",
               res.fallback ? "  (fallback: nothing else valid)" : "", res.note[0] ? "" : "");
        if (res.note[0]) printf("     note: %s\n", res.note);
        for (int k = 0; k < res.n_cands; k++) {
            const kiln_sel_cand *cd = &res.cands[k];
            if (cd->k == res.chosen) continue;
            if (!cd->reasons) {
                printf("     %-34s score %6.1f", cd->k->spec.id, cd->score);
                if (cd->perf_us > 0)
                    printf("  (measured %.1f us, adj %+.1f)", cd->perf_us, cd->perf_adj);
                printf("  lost\n");
            } else {
                char m[1024];
                kiln_reasons_format(cd->reasons, env.sel, cd->k, &c, m, sizeof m);
                printf("     %-34s rejected: %s\n", cd->k->spec.id, m);
            }
        }
        if (res.chosen && res.cands[0].perf_us > 0)
            printf("     (chosen measured %.1f us, adj %+.1f)\n", res.cands[0].perf_us,
                   res.cands[0].perf_adj);
    }
    if (json) {
        char *txt = kiln_adopt(json_dumps(jsites, JSON_INDENT(1)));
        if (txt) puts(txt);
        kiln_free(txt);
        json_decref(jsites);
    } else {
        printf("\n%d call sites in the plan; %d groups shown\n", env.n_sites, groups);
    }
    kiln_free(shown);
    kiln_kernel_env_close(&env);
    return status;
}
