/*
 * commands.h — the `kiln` subcommands. Each lives in cmd_<name>.c and returns the
 * process exit status: 0 success, 1 failure (message on stderr), 2 usage error.
 * argv[0] is the command name.
 */
#ifndef KILN_CLI_COMMANDS_H
#define KILN_CLI_COMMANDS_H

#include "base/status.h"

#include <stddef.h>

#define KILN_CMD_LIST(X)                                                                           \
    X(run, "generate text from a prompt")                                                          \
    X(chat, "multi-turn chat in the terminal")                                                     \
    X(serve, "OpenAI-compatible HTTP server")                                                      \
    X(bench, "prompt and decode throughput (like llama-bench)")                                    \
    X(perplexity, "perplexity of a text file (like llama-perplexity)")                             \
    X(inspect, "model metadata, tensors and load report")                                          \
    X(explain, "kernel choices for every call site of a model's plan")                             \
    X(kernels, "the kernel registry and availability")                                             \
    X(tune, "measure kernel candidates into the PerfDB")                                           \
    X(solve, "bake the dispatch table of a model")                                                 \
    X(doctor, "hardware, GPUs, providers and library versions")                                    \
    X(tokenize, "text to token ids")                                                               \
    X(detokenize, "token ids to text")                                                             \
    X(template, "render a chat template")                                                          \
    X(version, "print the version")

#define KILN_CMD_DECL(name, summary) int kiln_cmd_##name(int argc, char **argv);
KILN_CMD_LIST(KILN_CMD_DECL)
#undef KILN_CMD_DECL

/* Print "kiln <cmd>: <msg>" for a failed status and return 1. */
int kiln_cli_fail(const char *cmd, const kiln_err *err);

/* --load-report (run, bench, perplexity, chat, serve): after the engine loaded the model, its
 * load report (lanes, tensors, bytes, time, GB/s, residual bytes and why, time to ready)
 * goes to stderr. */
#define KILN_OPT_LOAD_REPORT                                                                       \
    {                                                                                              \
        "load-report", 0, false, NULL, "print the load report (lanes, bytes, GB/s) to stderr",     \
            false, NULL                                                                            \
    }
struct kiln_engine;
void kiln_cli_print_load_report(const struct kiln_engine *e);

/* Resolves -m MODEL: an existing path is used as is; a short name (e.g. "gemma3-270m")
 * maps to the model cache ($XDG_CACHE_HOME/kiln/models, default ~/.cache/kiln/models)
 * filled by scripts/fetch-model.sh. Errors name the cache path and the fetch command. */
/* --backend: the help text of every command, and the name a command runs on: opt, or
 * what "auto" resolves to (cuda when a usable GPU is present, else cpu). */
#define KILN_BACKEND_HELP                                                                          \
    "auto (default: cuda when a usable GPU is present, else cpu), cpu, cuda or ref (the scalar "   \
    "oracle)"
const char *kiln_cli_backend(const char *opt);

kiln_status kiln_resolve_model(const char *arg, char *out, size_t out_size, kiln_err *err);

#endif /* KILN_CLI_COMMANDS_H */
