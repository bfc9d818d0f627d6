/*
 * cmd_solve.c — `kiln solve -m MODEL -o table.json [--backend B] [--tokens MAX]
 * [--context L] [--policy FILE] [--perfdb PATH]`: selects a kernel for every call site of
 * MODEL and every shape bucket it can reach, and writes the baked dispatch table with the
 * hardware signature and descriptor hashes (dispatch.h). `kiln run --dispatch FILE` uses
 * it, or selects at run time with a warning when this machine or setup differs.
 */
#include "cli/args.h"
#include "base/mem.h"
#include "cli/commands.h"
#include "cli/kernel_sites.h"
#include "kernels/dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kiln_cmd_solve(int argc, char **argv) {
    static const kiln_cmd_usage u = {
        "kiln solve -m MODEL -o FILE [options]",
        "Bakes the dispatch table of MODEL (one kernel per call site and shape bucket) into "
        "FILE, with the hardware signature, registry and descriptor hashes and the policy "
        "hash it was solved under."};
    kiln_opt opts[] = {
        {"model", 'm', true, "MODEL", "model file or short name", false, NULL},
        {"output", 'o', true, "FILE", "where to write the table (JSON)", false, NULL},
        {"backend", 'b', true, "B", KILN_BACKEND_HELP, false, NULL},
        {"policy", 0, true, "FILE", "policy file", false, NULL},
        {"perfdb", 0, true, "PATH", "PerfDB file (default in the cache dir)", false, NULL},
    };
    const char *pos[4];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, opts, KILN_NOPTS(opts), pos, 4, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;
    if (!opts[0].seen || !opts[1].seen) {
        fprintf(stderr, "kiln solve: -m MODEL and -o FILE are required\n");
        return 2;
    }
    kiln_err err;
    kiln_err_clear(&err);
    kiln_kernel_env env;
    if (kiln_kernel_env_open(&env, opts[0].value, opts[2].value, opts[3].value, opts[4].value,
                             &err))
        return kiln_cli_fail("solve", &err);
    int status = 0;
    kiln_sel_site *sites = kiln_calloc((size_t)env.n_sites + 1, sizeof *sites);
    kiln_dispatch *d = NULL;
    if (!sites) {
        kiln_err_set(&err, KILN_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < env.n_sites; i++) sites[i] = env.sites[i].site;
    if (kiln_dispatch_build(env.sel, sites, env.n_sites, &d, &err)) goto fail;
    if (kiln_dispatch_save(d, env.sel, opts[1].value, &err)) goto fail;
    /* summary: how often each kernel was chosen */
    const kiln_registry *reg = kiln_selector_registry(env.sel);
    int *count = kiln_calloc((size_t)reg->n_kernels + 1, sizeof *count);
    if (count) {
        for (int i = 0; i < d->n_sites; i++)
            for (int b = 0; b < KILN_SEL_BUCKETS; b++)
                count[kiln_dispatch_get(d, i, b)->k->index]++;
        printf("%s: %d call sites x %d buckets, scratch %zu bytes\n", opts[1].value, d->n_sites,
               KILN_SEL_BUCKETS, d->max_workspace);
        for (int k = 0; k < reg->n_kernels; k++)
            if (count[k]) printf("  %-34s %6d entries\n", reg->kernels[k].spec.id, count[k]);
        kiln_free(count);
    }
    goto out;
fail:
    status = kiln_cli_fail("solve", &err);
out:
    kiln_dispatch_free(d);
    kiln_free(sites);
    kiln_kernel_env_close(&env);
    return status;
}
