/*
 * kernel_sites.h — what `kiln explain`, `kiln tune` and `kiln solve` share: the model,
 * its plan bound to a backend exactly as the engine binds it (so every call site and its
 * choice are the ones `kiln run` gets), the call sites as selection contexts, and a
 * device selector (runtime/kselect.h) built with the policy and PerfDB given.
 *
 * kiln_kernel_env_close frees everything it opened. The selector is the env's device's
 * (kiln_device.ks), as an engine's is.
 */
#ifndef KILN_CLI_KERNEL_SITES_H
#define KILN_CLI_KERNEL_SITES_H

#include "kernels/perfdb.h"
#include "kernels/select.h"
#include "runtime/exec.h"

typedef struct kiln_model_site {
    kiln_sel_site site;              /* name, plan instruction, context (bucket 0)       */
    const kiln_callsite *cs;         /* the runtime's description                        */
    const kiln_bound_weight *weight; /* matmul / embed: the bound weight, else NULL     */
    int layer;                       /* -1 outside the blocks                            */
    const char *opcode;              /* the plan instruction's opcode name               */
} kiln_model_site;

typedef struct kiln_kernel_env {
    kiln_model *model;
    const kiln_backend *be;
    kiln_device dev; /* opened on be: owns the selector */
    bool dev_open;
    kiln_bound_plan bp;
    bool bound;
    kiln_model_site *sites;
    int n_sites;
    kiln_selector *sel;      /* dev's selector (borrowed) */
    kiln_callsite sample_cs; /* a device backend's sampled step (KILN_SAMPLE_SITE): the
                                last site, not a plan instruction's (instr -1) */
    char perf_path[512];
} kiln_kernel_env;

/* backend: "ref" or "cpu". policy_path / perfdb_path: NULL for the defaults. */
kiln_status kiln_kernel_env_open(kiln_kernel_env *env, const char *model_arg, const char *backend,
                                 const char *policy_path, const char *perfdb_path, kiln_err *err);
void kiln_kernel_env_close(kiln_kernel_env *env);
/* The site's context for a step of `tokens` tokens, as the binding builds it. */
void kiln_kernel_env_ctx(const kiln_kernel_env *env, const kiln_model_site *s, int64_t tokens,
                         kiln_sel_ctx *out);

#endif /* KILN_CLI_KERNEL_SITES_H */
