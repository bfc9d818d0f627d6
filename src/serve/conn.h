/*
 * conn.h — the state `kiln serve` keeps for the server and for each connection, shared
 * by server.c (libmicrohttpd callbacks, routes, limits, the prompt workers, lifecycle)
 * and sse.c (the JSON of results and the SSE chunks of streams). Internal to src/serve.
 *
 * Threads (docs/SERVE.md): one libmicrohttpd thread (epoll) runs every callback;
 * prompt workers render, tokenize and submit; the scheduler thread's sink wakes parked
 * connections (loop.h). A conn is owned by its libmicrohttpd connection (freed in the
 * completion callback); while a worker or the loop holds it, the connection is
 * suspended, so it cannot complete.
 */
#ifndef KILN_SERVE_CONN_H
#define KILN_SERVE_CONN_H

#include "serve/loop.h"
#include "serve/oai.h"
#include "serve/serve.h"
#include "serve/tenants.h"
#include "tok/template.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define KILN_HTTP_MAX_WORKERS 4

typedef struct kiln_http_conn kiln_http_conn;

typedef struct kiln_http_server {
    kiln_serve_opts o;
    const kiln_model *model;
    kiln_srv_loop *loop;
    kiln_srv_tenants tenants;
    kiln_chat_template *tpl;
    char model_id[256];
    char bos[256], eos[256];
    int32_t n_vocab;
    int64_t created;
    atomic_bool draining;
    atomic_uint_fast64_t req_counter;
    /* prompt workers: parse, render, tokenize, admit, submit (server.c) */
    pthread_mutex_t job_mu;
    pthread_cond_t job_cv;
    kiln_http_conn *job_head, *job_tail;
    bool job_quit;
    int n_workers;
    pthread_t workers[KILN_HTTP_MAX_WORKERS];
    /* Server time per streamed token (docs/SERVE.md). Read and written on the HTTP
     * thread only: the HTTP thread's CPU time (and time running or runnable) over the
     * windows with at least one stream open, the part of it in stream_collect, the
     * tokens of finished streams. */
    bool http_thread_known;
    pthread_t http_thread;
    int streams_open;
    uint64_t win_cpu0, win_awake0;
    uint64_t stream_cpu_ns, stream_awake_ns, stream_collect_ns, stream_tokens;
    /* any thread: the wall time of the loop's resumes (sink, idle tick, stop) and of
     * the prompt workers' CPU time */
    atomic_uint_fast64_t wake_ns, wakes, wake_batches, prep_cpu_ns, preps;
} kiln_http_server;

struct kiln_http_conn {
    kiln_http_server *s;
    struct MHD_Connection *c;
    kiln_oai_kind kind;
    char *body;
    size_t len, cap;
    bool too_big, started;
    bool oom; /* the body could not be buffered: answered 500 once the upload is in */
    kiln_srv_tenant *tenant;
    bool admitted;
    kiln_oai_req p;
    bool parsed;
    kiln_srv_req *r;
    int fd;
    /* the prompt worker's answer: prep_done once it has run; prep_http != 0: an error
     * to send (prep_err, retry after prep_retry s) instead of a response */
    kiln_http_conn *job_next;
    bool prep_done;
    int prep_http, prep_retry;
    kiln_oai_error prep_err;
    bool rejected; /* the scheduler refused it (503/429): counted as such, not as a cancel */
    /* streaming */
    bool stream_open; /* counted in s->streams_open */
    char id[48];
    uint64_t seen;
    size_t sent_text[KILN_OAI_MAX_N], sent_lp[KILN_OAI_MAX_N];
    bool sent_finish[KILN_OAI_MAX_N];
    bool role_sent, done_sent;
    char *out;
    size_t out_len, out_off, out_cap;
    bool out_oom;   /* an event could not be buffered: the stream ends with an error event */
    size_t oom_off; /* bytes of that static error event handed out */
    /* a content chunk's bytes around its choice, from jansson once per stream
     * ("data: {...,"choices":[" and "]...}\n\n"; chunk_head NULL: not built yet) */
    char *chunk_head, *chunk_tail;
    size_t chunk_head_len, chunk_tail_len;
    bool chunk_fast_off; /* building them failed: jansson for every chunk */
    uint64_t t_last_tok;
    int64_t tokens_seen;
};

/* sse.c */
const char *kiln_http_finish_name(kiln_srv_finish f);
int64_t kiln_http_completion_tokens(const kiln_srv_req *r);
/* The final (non-streamed) body; under the loop lock. */
json_t *kiln_http_final_json(kiln_http_server *s, kiln_http_conn *cx);
/* Formats everything new in cx->r into cx->out; under the loop lock. */
void kiln_http_stream_collect(kiln_http_server *s, kiln_http_conn *cx);

#endif /* KILN_SERVE_CONN_H */
