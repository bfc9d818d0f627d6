#include "cli/commands.h"
#include "load/load.h"
#include "runtime/backend.h"
#include "runtime/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int kiln_cli_fail(const char *cmd, const kiln_err *err) {
    fprintf(stderr, "kiln %s: error: %s\n", cmd,
            err->msg[0] ? err->msg : kiln_status_name(err->code));
    return 1;
}

const char *kiln_cli_backend(const char *opt) {
    if (opt && strcmp(opt, "auto") != 0) return opt;
    return kiln_backend_auto_name();
}

void kiln_cli_print_load_report(const struct kiln_engine *e) {
    const int n = kiln_engine_tp_size(e);
    for (int r = 0; r < n; r++) {
        const kiln_load_plan *p = kiln_engine_rank_load_plan(e, r);
        if (n > 1)
            fprintf(stderr, "tensor-parallel rank %d of %d (its shard of the weights):\n", r, n);
        if (p) kiln_load_report_print(p, stderr, false);
    }
}

/* Short names of models that scripts/fetch-model.sh knows. Keep the two in sync. */
static const struct {
    const char *name, *file;
} known_models[] = {
    {"gemma3-270m", "gemma-3-270m-q4_k_m.gguf"},
    {"smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"},
};

kiln_status kiln_resolve_model(const char *arg, char *out, size_t out_size, kiln_err *err) {
    struct stat st;
    if (!arg || !*arg) return kiln_err_set(err, KILN_ERR_INVALID_ARG, "no model given (-m MODEL)");
    if (stat(arg, &st) == 0) {
        if (snprintf(out, out_size, "%s", arg) >= (int)out_size)
            return kiln_err_set(err, KILN_ERR_RANGE, "model path too long");
        return KILN_OK;
    }
    for (size_t i = 0; i < sizeof known_models / sizeof known_models[0]; i++) {
        if (strcmp(arg, known_models[i].name) != 0) continue;
        const char *xdg = getenv("XDG_CACHE_HOME");
        const char *home = getenv("HOME");
        int w;
        if (xdg && *xdg)
            w = snprintf(out, out_size, "%s/kiln/models/%s", xdg, known_models[i].file);
        else
            w = snprintf(out, out_size, "%s/.cache/kiln/models/%s", home ? home : ".",
                         known_models[i].file);
        if (w < 0 || (size_t)w >= out_size)
            return kiln_err_set(err, KILN_ERR_RANGE, "model path too long");
        if (stat(out, &st) != 0)
            return kiln_err_set(err, KILN_ERR_NOT_FOUND,
                                "model '%s' is not in the cache (%s); fetch it with "
                                "scripts/fetch-model.sh %s",
                                arg, out, arg);
        return KILN_OK;
    }
    return kiln_err_set(err, KILN_ERR_NOT_FOUND,
                        "model '%s': no such file, and not a known short name (known: gemma3-270m, "
                        "smollm2-135m)",
                        arg);
}
