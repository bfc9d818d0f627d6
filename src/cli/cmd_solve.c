/*
 * cmd_solve.c — `kiln solve -m MODEL -o table.json [--backend B] [--policy FILE]
 * [--perfdb PATH]`: binds MODEL's plan exactly as an engine binds it (kernel_sites.h) and
 * writes the bound plan's dispatch table — the kernel of every call site and token
 * bucket — with the hardware signature, registry and descriptor hashes and the policy
 * hash (kernels/dispatch.h has the format). `kiln run --dispatch FILE` binds from it, or
 * selects at run time with a warning when this machine or setup differs.
 */
#include "cli/args.h"
#include "base/mem.h"
#include "cli/commands.h"
#include "cli/kernel_sites.h"
#include "runtime/kselect.h"

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
    if (kiln_bound_plan_save_dispatch(&env.bp, opts[1].value, &err)) {
        status = kiln_cli_fail("solve", &err);
        goto out;
    }
    /* summary: how often each kernel was chosen (per site and token bucket) */
    const kiln_registry *reg = kiln_selector_registry(env.sel);
    int *count = kiln_calloc((size_t)reg->n_kernels + 1, sizeof *count);
    if (!count) {
        kiln_err_set(&err, KILN_ERR_NOMEM, "solve summary: out of memory");
        status = kiln_cli_fail("solve", &err);
        goto out;
    }
    int n_sites = 0;
    for (int32_t i = 0; i < env.bp.plan.n_insns; i++)
        for (int s = 0; s < env.bp.bi[i].n_sites; s++, n_sites++)
            for (int b = 0; b < KILN_BUCKETS; b++) {
                const kiln_reg_kernel *k = env.bp.bi[i].site[s].kernel[b];
                if (k && k->index >= 0 && k->index < reg->n_kernels) count[k->index]++;
            }
    printf("%s: %d call sites x %d token buckets\n", opts[1].value, n_sites, KILN_BUCKETS);
    for (int k = 0; k < reg->n_kernels; k++)
        if (count[k]) printf("  %-34s %6d entries\n", reg->kernels[k].spec.id, count[k]);
    kiln_free(count);
out:
    kiln_kernel_env_close(&env);
    return status;
}
