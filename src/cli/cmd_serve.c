/* cmd_serve.c — `kiln serve`: the OpenAI-compatible HTTP server (src/serve, docs/SERVE.md). */
#include "cli/args.h"
#include "base/mem.h"
#include "cli/commands.h"
#include "cli/gen.h"
#include "serve/serve.h"

#include <stdio.h>
#include <stdlib.h>

int kiln_cmd_serve(int argc, char **argv) {
    static const kiln_cmd_usage u = {
        "kiln serve -m MODEL [options]",
        "Serves the model over HTTP: OpenAI-compatible /v1/chat/completions and /v1/completions "
        "(streamed with SSE and not), /v1/models, /health, /metrics, /v1/tenants/ID/usage, and a "
        "web chat page at /. SIGINT/SIGTERM finish the requests in flight, then exit 0."};
    kiln_opt opts[] = {
        {"model", 'm', true, "MODEL", "model file or short name (smollm2-135m)", false, NULL},
        {"host", 0, true, "ADDR", "IPv4 address to listen on (default 127.0.0.1)", false, NULL},
        {"port", 0, true, "N", "port (default 8080; 0 = any free port)", false, NULL},
        {"backend", 0, true, "NAME", KILN_BACKEND_HELP, false, NULL},
        {"threads", 't', true, "N", "threads (default: all cores)", false, NULL},
        {"ctx-size", 'c', true, "N", "context per sequence (default min(4096, trained))", false,
         NULL},
        {"slots", 0, true, "N", "sequences decoding at once (default 8)", false, NULL},
        {"queue", 0, true, "N", "requests waiting for a slot before 503 (default 64)", false, NULL},
        {"config", 0, true, "FILE", "kiln.yaml with `tenants:` (API keys, quotas)", false, NULL},
        {"chat-template", 0, true, "FILE", "Jinja chat template to use instead of the model's",
         false, NULL},
        {"alias", 0, true, "NAME", "model id clients use (default: the file name)", false, NULL},
        {"max-body", 0, true, "BYTES", "request body limit (default 8388608)", false, NULL},
        {"kv-f16", 0, false, NULL, "store the KV cache as f16", false, NULL},
        {"tp", 0, true, "N",
         "tensor parallel: split the model over N ranks (default 1; docs/TP.md)", false, NULL},
        {"fast", 0, false, NULL,
         "allow batch-dependent kernels (greedy output may then depend on the batch)", false, NULL},
        {"ready-file", 0, true, "FILE", "write 'HOST PORT' there once listening (for scripts)",
         false, NULL},
        KILN_OPT_LOAD_REPORT,
    };
    const char *pos[4];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, opts, KILN_NOPTS(opts), pos, 4, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;
#define OPT(name) kiln_opt_find(opts, KILN_NOPTS(opts), name)
    if (!OPT("model")->seen) {
        fprintf(stderr, "kiln serve: -m MODEL is required\n");
        return 2;
    }
    kiln_serve_opts so;
    kiln_serve_opts_default(&so);
    int64_t tp = 1;
    int64_t port = so.port, threads = 0, n_ctx = 0, slots = so.slots, queue = so.max_queue,
            max_body = so.max_body;
    if (!kiln_opt_int(OPT("port"), 0, 65535, &port) ||
        !kiln_opt_int(OPT("threads"), 0, 1024, &threads) || !kiln_opt_int(OPT("tp"), 1, 64, &tp) ||
        !kiln_opt_int(OPT("ctx-size"), 0, 1 << 24, &n_ctx) ||
        !kiln_opt_int(OPT("slots"), 1, 256, &slots) ||
        !kiln_opt_int(OPT("queue"), 1, 1 << 20, &queue) ||
        !kiln_opt_int(OPT("max-body"), 1024, (int64_t)1 << 32, &max_body))
        return 2;
    if (OPT("host")->seen) so.host = OPT("host")->value;
    so.port = (int)port;
    so.slots = (int32_t)slots;
    so.max_queue = (int32_t)queue;
    so.max_body = max_body;
    so.tenants = OPT("config")->value;
    so.model_id = OPT("alias")->value;
    so.ready_file = OPT("ready-file")->value;
    so.deterministic = !OPT("fast")->seen;
    kiln_err err;
    kiln_err_clear(&err);
    char *tpl = NULL;
    if (OPT("chat-template")->seen) {
        size_t tl;
        if (kiln_gen_read_file(OPT("chat-template")->value, &tpl, &tl, &err))
            return kiln_cli_fail("serve", &err);
        so.chat_template = tpl;
    }
    kiln_gen_opts go = {.model = OPT("model")->value,
                        .backend = OPT("backend")->value,
                        .n_threads = (int32_t)threads,
                        .n_ctx = n_ctx,
                        .max_step = so.max_step,
                        .max_seqs = so.slots,
                        .kv_f16 = OPT("kv-f16")->seen,
                        .load_report = OPT("load-report")->seen,
                        .tp = (int32_t)tp};
#undef OPT
    kiln_gen_ctx g;
    if (kiln_gen_open(&go, &g, &err)) {
        kiln_free(tpl);
        return kiln_cli_fail("serve", &err);
    }
    so.n_ctx = g.n_ctx;
    kiln_status st = kiln_serve_run(&so, g.model, g.engine, &err);
    kiln_gen_close(&g);
    kiln_free(tpl);
    return st ? kiln_cli_fail("serve", &err) : 0;
}
