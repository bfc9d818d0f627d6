/*
 * serve.h — `kiln serve`: the OpenAI-compatible HTTP server (libmicrohttpd, one epoll
 * thread with suspended connections, prompt workers; jansson for JSON). Routes:
 *   POST /v1/chat/completions, POST /v1/completions (SSE streaming and not)
 *   GET  /v1/models, /health, /metrics (Prometheus text), /v1/tenants/{id}/usage, /
 *        (the embedded web chat page)
 * docs/SERVE.md describes fields, errors, limits and decisions.
 *
 * kiln_serve_run borrows the model (with its vocabulary loaded) and the engine, blocks
 * until SIGINT or SIGTERM, drains in-flight requests (new ones get 503) and returns
 * KILN_OK. Nothing a client sends reaches the file system; model paths come only from
 * the command line.
 */
#ifndef KILN_SERVE_SERVE_H
#define KILN_SERVE_SERVE_H

#include "base/status.h"
#include "model/model.h"

#include <stdint.h>

typedef struct kiln_serve_opts {
    const char *host;          /* default 127.0.0.1 */
    int port;                  /* 0: any free port (printed) */
    const char *model_id;      /* the id clients name; default: the file name sans .gguf */
    const char *tenants;       /* kiln.yaml with `tenants:`, or NULL (open server) */
    const char *chat_template; /* template text overriding the model's, or NULL */
    int32_t slots;             /* sequences decoding at once (default 8) */
    int32_t max_queue;         /* waiting requests before 503 (default 64) */
    int32_t max_step;          /* tokens per engine step (default 512) */
    int64_t n_ctx;             /* context per sequence */
    int64_t max_body;          /* request body limit in bytes (default 8 MiB) */
    int32_t max_connections;   /* open connections (default 4096; the open-file limit is
                                  raised to fit, or the count lowered to it, with a warning) */
    int32_t header_timeout_s;  /* a connection silent this long before its request is
                                  complete is closed (default 15: half-open "slowloris"
                                  clients); once a request is in, 600 s of silence */
    int32_t drain_seconds;     /* longest drain on SIGINT/SIGTERM (default 120) */
    const char *ready_file;    /* when set, "host port\n" is written there once listening */
    bool deterministic;        /* greedy output independent of the batch (default on) */
} kiln_serve_opts;

void kiln_serve_opts_default(kiln_serve_opts *o);

kiln_status kiln_serve_run(const kiln_serve_opts *o, const kiln_model *m, kiln_engine *e,
                           kiln_err *err);

#endif /* KILN_SERVE_SERVE_H */
