/*
 * kernel_sites.h — kernel call sites of a model for `kiln explain`, `kiln tune` and
 * `kiln solve`, derived from the model file alone (tensors + metadata): one matmul site
 * per 2-D weight (named after the tensor), the embedding lookup, and per layer the norm,
 * rope, kv_write, attention, glu and residual-add sites with the model's dims and
 * features. This is the same description the runtime's plan binding produces; it lets
 * the kernel tools run without binding a plan.
 *
 * Owns nothing: *sites is malloc'ed, the caller frees it.
 */
#ifndef KILN_CLI_KERNEL_SITES_H
#define KILN_CLI_KERNEL_SITES_H

#include "format/model_file.h"
#include "kernels/perfdb.h"
#include "kernels/select.h"

typedef struct kiln_model_site {
    kiln_sel_site site;
    const kiln_tensor_info *weight; /* matmul / embed: the weight tensor, else NULL */
    int layer;                      /* -1 outside the blocks                       */
} kiln_model_site;

/* max_tokens: most tokens per step; max_ctx: context length (0: from the metadata). */
kiln_status kiln_model_sites(const kiln_model_file *mf, kiln_backend_id backend, int64_t max_tokens,
                             int64_t max_ctx, kiln_model_site **sites, int *n_sites, kiln_err *err);

/* Everything the kernel tools share: the model, its sites, the policy, the PerfDB timings
 * of this machine (perfdb_path, or the default path when NULL) and a selector.
 * kiln_kernel_env_close frees it all (NULL-safe parts). */
typedef struct kiln_kernel_env {
    kiln_model_file *mf;
    kiln_model_site *sites;
    int n_sites;
    kiln_policy policy;
    kiln_perf_table *perf; /* NULL when there is no PerfDB yet */
    char perf_path[512];
    kiln_selector *sel;
} kiln_kernel_env;

kiln_status kiln_kernel_env_open(kiln_kernel_env *env, const char *model_arg,
                                 kiln_backend_id backend, const char *policy_path,
                                 const char *perfdb_path, int64_t max_tokens, int64_t max_ctx,
                                 kiln_err *err);
void kiln_kernel_env_close(kiln_kernel_env *env);
/* Parses --backend (default cpu). Prints an error and returns false on a bad name. */
bool kiln_cli_backend_arg(const char *cmd, const char *value, kiln_backend_id *out);

#endif /* KILN_CLI_KERNEL_SITES_H */
