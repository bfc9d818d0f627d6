/* server.c — HTTP routing, limits, auth, SSE and responses of `kiln serve` (serve.h):
 * libmicrohttpd's one epoll thread with suspended connections, the prompt workers, the
 * lifecycle (conn.h; docs/SERVE.md "Threads"). */
#include "serve/serve.h"
#include "base/mem.h"

#include "base/log.h"
#include "base/timer.h"
#include "serve/conn.h"
#include "serve/loop.h"
#include "serve/oai.h"
#include "serve/tenants.h"
#include "tok/template.h"
#include "tok/tok.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

extern const unsigned char kiln_web_index[];
extern const size_t kiln_web_index_len;

typedef kiln_http_server server;
typedef kiln_http_conn conn;

/* how long a request stays parked before its connection looks at the client (ms) */
#define KILN_IDLE_LOOK_MS 200

/* ---- responses ----------------------------------------------------------------------- */

static enum MHD_Result send_oom(struct MHD_Connection *c);

/* Sends buf (kiln's: freed here; NULL: an empty body). libmicrohttpd copies it: what it
 * frees itself it frees with free(), which would skip kiln's count. */
static enum MHD_Result send_buf(struct MHD_Connection *c, int status, const char *type, char *buf,
                                size_t len, int retry_after) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        len, buf ? buf : (void *)"", buf ? MHD_RESPMEM_MUST_COPY : MHD_RESPMEM_PERSISTENT);
    kiln_free(buf);
    if (!resp) return send_oom(c);
    MHD_add_response_header(resp, "Content-Type", type);
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof(ra), "%d", retry_after);
        MHD_add_response_header(resp, "Retry-After", ra);
    }
    enum MHD_Result r = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return r;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, json_t *j) {
    char *s = kiln_adopt(json_dumps(j, JSON_COMPACT));
    json_decref(j);
    if (!s) return send_oom(c);
    return send_buf(c, status, "application/json", s, strlen(s), 0);
}

/* The answer when kiln cannot allocate what a request needs (its connection state, its
 * body buffer, its error body): a static 500, so that the client gets a status rather
 * than a closed connection (test_alloc_fault_serve walks every allocation of a request). */
static const char k_oom_body[] = "{\"error\":{\"message\":\"the server is out of memory\","
                                 "\"type\":\"server_error\",\"param\":null,\"code\":"
                                 "\"out_of_memory\"}}";
static const char k_oom_sse[] = "data: {\"error\":{\"message\":\"the server is out of memory\","
                                "\"type\":\"server_error\",\"param\":null,\"code\":"
                                "\"out_of_memory\"}}\n\ndata: [DONE]\n\n";
static const char k_oom_conn = 0; /* its address marks a request refused before it had a conn */

static enum MHD_Result send_oom(struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(
        sizeof(k_oom_body) - 1, (void *)k_oom_body, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, 500, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_error(server *s, conn *cx, struct MHD_Connection *c,
                                  const kiln_oai_error *e, int retry_after) {
    char *b = kiln_oai_error_body(e);
    kiln_srv_count_status(&s->tenants, cx ? cx->tenant : NULL, e->http);
    if (!b) return send_oom(c);
    return send_buf(c, e->http, "application/json", b, strlen(b), retry_after);
}

static enum MHD_Result fail(server *s, conn *cx, struct MHD_Connection *c, int http,
                            const char *type, const char *param, const char *code, int retry_after,
                            const char *msg) {
    kiln_oai_error e;
    kiln_oai_fail(&e, http, type, param, code, "%s", msg);
    return send_error(s, cx, c, &e, retry_after);
}

/* ---- prompt building ----------------------------------------------------------------- */

static bool build_prompt(server *s, conn *cx, kiln_tokens *toks, kiln_oai_error *e) {
    const kiln_vocab *v = s->model->vocab;
    kiln_err err;
    kiln_err_clear(&err);
    if (cx->kind == KILN_OAI_CHAT) {
        if (!s->tpl)
            return kiln_oai_fail(e, 400, "invalid_request_error", "messages", "no_chat_template",
                                 "the model has no chat template; use /v1/completions or start "
                                 "the server with --chat-template FILE");
        kiln_chat_inputs in = {.messages = cx->p.messages,
                               .tools = cx->p.has_tools ? cx->p.tools : NULL,
                               .add_generation_prompt = true,
                               .bos_token = s->bos,
                               .eos_token = s->eos};
        char *text = NULL;
        size_t len = 0;
        if (kiln_chat_template_render(s->tpl, &in, &text, &len, &err))
            return kiln_oai_fail(e, 400, "invalid_request_error", "messages", "template_error",
                                 "the chat template rejected the messages: %s", err.msg);
        kiln_str bos = kiln_vocab_text(v, kiln_vocab_bos(v));
        bool has_bos = bos.len > 0 && len >= bos.len && memcmp(text, bos.ptr, bos.len) == 0;
        unsigned fl = KILN_TOK_PARSE_SPECIAL | (has_bos ? 0 : KILN_TOK_ADD_SPECIAL);
        kiln_status st = kiln_tokenize(v, text, len, fl, toks, &err);
        kiln_free(text);
        if (st) return kiln_oai_fail(e, 500, "server_error", "", NULL, "tokenizer: %s", err.msg);
    } else if (cx->p.prompt) {
        if (kiln_tokenize(v, cx->p.prompt, strlen(cx->p.prompt),
                          KILN_TOK_ADD_SPECIAL | KILN_TOK_PARSE_SPECIAL, toks, &err))
            return kiln_oai_fail(e, 500, "server_error", "", NULL, "tokenizer: %s", err.msg);
        if (toks->n == 0)
            return kiln_oai_fail(e, 400, "invalid_request_error", "prompt", "invalid_value",
                                 "'prompt' has no tokens");
    } else {
        toks->ids = kiln_malloc(cx->p.n_prompt_ids * sizeof(kiln_token));
        if (!toks->ids) return kiln_oai_fail(e, 500, "server_error", "", NULL, "out of memory");
        memcpy(toks->ids, cx->p.prompt_ids, cx->p.n_prompt_ids * sizeof(kiln_token));
        toks->n = toks->cap = cx->p.n_prompt_ids;
    }
    return true;
}

/* ---- HTTP-thread time ---------------------------------------------------------------- */

static uint64_t sub0(uint64_t a, uint64_t b) {
    return a > b ? a - b : 0;
}

/* This thread's CPU time (0 when the clock is unavailable). */
static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* This thread's time running or waiting for a core (/proc/thread-self/schedstat: ns on
 * the CPU, ns runnable in the run queue); 0 when unreadable. */
static uint64_t thread_awake_ns(void) {
    int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char b[128];
    ssize_t n = read(fd, b, sizeof(b) - 1);
    close(fd);
    if (n <= 0) return 0;
    b[n] = 0;
    unsigned long long run = 0, wait = 0;
    if (sscanf(b, "%llu %llu", &run, &wait) != 2) return 0;
    return (uint64_t)(run + wait);
}

/* True on libmicrohttpd's thread (the first caller of on_request; on_completed also
 * runs on the thread of MHD_stop_daemon at shutdown). */
static bool on_http_thread(server *s) {
    if (!s->http_thread_known) {
        s->http_thread = pthread_self();
        s->http_thread_known = true;
    }
    return pthread_equal(s->http_thread, pthread_self()) != 0;
}

/* A stream opens / closes a window of HTTP-thread time (server.stream_*: while at least
 * one stream is open, all of the thread's time counts). */
static void stream_open(server *s, conn *cx) {
    if (cx->stream_open || !on_http_thread(s)) return;
    cx->stream_open = true;
    if (s->streams_open++ == 0) {
        s->win_cpu0 = thread_cpu_ns();
        s->win_awake0 = thread_awake_ns();
    }
}

static void stream_close(server *s, conn *cx) {
    if (!cx->stream_open) return;
    cx->stream_open = false;
    if (--s->streams_open == 0 && on_http_thread(s)) {
        s->stream_cpu_ns += sub0(thread_cpu_ns(), s->win_cpu0);
        s->stream_awake_ns += sub0(thread_awake_ns(), s->win_awake0);
    }
}

/* The loop's wake function (loop.h): resumes parked connections, a step's at once (one
 * wakeup of the HTTP thread). Runs on the scheduler thread (its sink), the main thread
 * (idle tick) or at shutdown; its CPU time is counted as HTTP time (a mutex and an
 * eventfd write in libmicrohttpd per connection). */
static void conns_wake(void *const *users, int n) {
    if (n <= 0) return;
    server *s = ((conn *)users[0])->s; /* (a resumed cx may be gone at once) */
    uint64_t c0 = thread_cpu_ns();
    for (int i = 0; i < n; i++) MHD_resume_connection(((conn *)users[i])->c);
    atomic_fetch_add(&s->wake_ns, sub0(thread_cpu_ns(), c0));
    atomic_fetch_add(&s->wakes, (uint64_t)n);
    atomic_fetch_add(&s->wake_batches, 1);
}

static bool peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

/* ---- streaming ----------------------------------------------------------------------- */

/* Called under the loop lock. When the idle tick (not news) woke r: unlocks, checks that
 * the client is still there and returns 0 (look again), or 1 when it is gone (r cancelled).
 * Otherwise returns -1, still locked. */
static int idle_check(server *s, conn *cx, kiln_srv_req *r) {
    if (!r->idle_woken) return -1;
    r->idle_woken = false;
    kiln_srv_unlock(s->loop);
    if (!peer_gone(cx->fd)) return 0;
    kiln_srv_cancel(s->loop, r);
    return 1;
}

/* libmicrohttpd's content reader of a stream, on its one thread: hands out what is
 * formatted, formats what is new, and otherwise parks the request and suspends the
 * connection (returning 0 bytes) until the sink resumes it: it never waits. */
static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    conn *cx = cls;
    server *s = cx->s;
    for (;;) {
        if (cx->out_off < cx->out_len) {
            size_t n = cx->out_len - cx->out_off;
            if (n > max) n = max;
            memcpy(buf, cx->out + cx->out_off, n);
            cx->out_off += n;
            if (cx->out_off == cx->out_len) cx->out_off = cx->out_len = 0;
            return (ssize_t)n;
        }
        if (cx->done_sent) return MHD_CONTENT_READER_END_OF_STREAM;
        if (cx->out_oom) { /* an event could not be buffered: a static error event ends it */
            if (cx->oom_off == 0) kiln_srv_cancel(s->loop, cx->r);
            size_t left = sizeof(k_oom_sse) - 1 - cx->oom_off, n = left < max ? left : max;
            memcpy(buf, k_oom_sse + cx->oom_off, n);
            cx->oom_off += n;
            if (cx->oom_off == sizeof(k_oom_sse) - 1) cx->done_sent = true;
            return (ssize_t)n;
        }
        uint64_t t0 = kiln_now_ns();
        kiln_srv_lock(s->loop);
        kiln_srv_req *r = cx->r;
        if (r->version != cx->seen) {
            cx->seen = r->version;
            int64_t before = cx->tokens_seen;
            kiln_http_stream_collect(s, cx);
            kiln_srv_unlock(s->loop);
            s->stream_tokens += (uint64_t)(cx->tokens_seen - before);
            s->stream_collect_ns += kiln_now_ns() - t0;
            continue;
        }
        const int ic = idle_check(s, cx, r);
        if (ic > 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (ic == 0) continue;
        /* parked and suspended under the lock: the sink's wake comes after the suspend */
        if (!kiln_srv_park(s->loop, r, false)) {
            kiln_srv_unlock(s->loop); /* shutting down past the drain */
            kiln_srv_cancel(s->loop, r);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        MHD_suspend_connection(cx->c);
        kiln_srv_unlock(s->loop);
        return 0;
    }
}

/* ---- request life -------------------------------------------------------------------- */

static void conn_free(server *s, conn *cx) {
    if (!cx) return;
    stream_close(s, cx);
    if (cx->r) {
        kiln_srv_lock(s->loop);
        (void)kiln_srv_unpark(s->loop, cx->r); /* (a suspended connection does not end) */
        bool done = cx->r->state == 3 && cx->r->err_code != KILN_ERR_CANCELLED;
        bool cancelled = cx->r->state != 3 || cx->r->err_code == KILN_ERR_CANCELLED;
        int64_t in = (int64_t)cx->r->n_prompt, out = kiln_http_completion_tokens(cx->r);
        uint64_t ts = cx->r->t_submit, tf = cx->r->t_first, td = cx->r->t_done;
        kiln_srv_unlock(s->loop);
        if (cancelled && !cx->rejected) {
            kiln_srv_cancel(s->loop, cx->r);
            kiln_srv_count_cancel(&s->tenants, cx->tenant);
        }
        kiln_srv_count_tokens(&s->tenants, cx->tenant, in, out);
        if (done && tf) {
            kiln_srv_observe(&s->tenants, cx->tenant, KILN_HIST_TTFT, (double)(tf - ts) * 1e-9);
            kiln_srv_observe(&s->tenants, cx->tenant, KILN_HIST_E2E, (double)(td - ts) * 1e-9);
        }
        kiln_srv_req_release(s->loop, cx->r);
    }
    if (cx->admitted) kiln_srv_release(&s->tenants, cx->tenant);
    if (cx->parsed) kiln_oai_req_free(&cx->p);
    kiln_free(cx->body);
    kiln_free(cx->out);
    kiln_free(cx->chunk_head);
    kiln_free(cx->chunk_tail);
    kiln_free(cx);
}

static void stream_free_cb(void *cls) {
    (void)cls; /* freed in request_completed */
}

/* An error answer of the prompt worker (sent by the HTTP thread). */
static bool prep_fail(conn *cx, const kiln_oai_error *e, int retry_after) {
    cx->prep_err = *e;
    cx->prep_http = e->http ? e->http : 500;
    cx->prep_retry = retry_after;
    return false;
}

/* Parse, render the template, tokenize, admit and submit; on a prompt worker (or the
 * HTTP thread when there is none). Touches no libmicrohttpd state. */
static bool prepare(server *s, conn *cx) {
    kiln_oai_error e;
    if (!kiln_oai_parse(cx->kind, cx->body ? cx->body : "", cx->len, s->n_vocab, &cx->p, &e)) {
        cx->parsed = true;
        return prep_fail(cx, &e, 0);
    }
    cx->parsed = true;
    if (strcmp(cx->p.model, s->model_id) != 0) {
        kiln_oai_fail(&e, 404, "invalid_request_error", "model", "model_not_found",
                      "The model '%.100s' does not exist; this server serves '%s'", cx->p.model,
                      s->model_id);
        return prep_fail(cx, &e, 0);
    }
    kiln_tokens toks = {0};
    if (!build_prompt(s, cx, &toks, &e)) {
        kiln_tokens_free(&toks);
        return prep_fail(cx, &e, 0);
    }
    int64_t n_ctx = s->o.n_ctx;
    int64_t max_tokens = cx->p.max_tokens;
    if ((int64_t)toks.n >= n_ctx || (max_tokens > 0 && (int64_t)toks.n + max_tokens > n_ctx)) {
        kiln_oai_fail(&e, 400, "invalid_request_error",
                      cx->kind == KILN_OAI_CHAT ? "messages" : "prompt", "context_length_exceeded",
                      "This model's maximum context length is %lld tokens. However, you "
                      "requested %lld tokens (%zu in the %s, %lld in the completion). Please "
                      "reduce the length of the %s or the completion.",
                      (long long)n_ctx,
                      (long long)((int64_t)toks.n + (max_tokens > 0 ? max_tokens : 0)), toks.n,
                      cx->kind == KILN_OAI_CHAT ? "messages" : "prompt",
                      (long long)(max_tokens > 0 ? max_tokens : 0),
                      cx->kind == KILN_OAI_CHAT ? "messages" : "prompt");
        kiln_tokens_free(&toks);
        return prep_fail(cx, &e, 0);
    }
    if (max_tokens < 0) max_tokens = n_ctx - (int64_t)toks.n;
    const char *why = NULL;
    int retry = kiln_srv_admit(&s->tenants, cx->tenant, (int64_t)toks.n, &why);
    if (retry > 0) {
        kiln_tokens_free(&toks);
        kiln_oai_fail(&e, 429, "rate_limit_exceeded", "", "rate_limit_exceeded",
                      "tenant '%s' is over its %s quota; retry after %d s", cx->tenant->id, why,
                      retry);
        return prep_fail(cx, &e, retry);
    }
    cx->admitted = true;
    uint64_t seed =
        cx->p.has_seed
            ? cx->p.seed
            : kiln_now_ns() ^ (atomic_fetch_add(&s->req_counter, 1) * 0x9E3779B97F4A7C15ull);
    kiln_err err;
    kiln_err_clear(&err);
    kiln_status st = kiln_srv_req_create(&cx->p, toks.ids, toks.n, max_tokens, seed, &cx->r, &err);
    kiln_tokens_free(&toks);
    if (st) {
        kiln_oai_fail(&e, 500, "server_error", "", NULL, "out of memory");
        return prep_fail(cx, &e, 0);
    }
    snprintf(cx->id, sizeof(cx->id), "%s-%llx%08llx",
             cx->kind == KILN_OAI_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)time(NULL),
             (unsigned long long)atomic_fetch_add(&s->req_counter, 1));
    snprintf(cx->r->tenant, sizeof(cx->r->tenant), "%s", cx->tenant->id);
    cx->r->user = cx;
    int http = 0, retry_after = 0;
    if ((st = kiln_srv_submit(s->loop, cx->r, &http, &retry_after, &err))) {
        cx->rejected = true;
        const char *type = http == 429   ? "rate_limit_exceeded"
                           : http >= 500 ? "server_error"
                                         : "invalid_request_error";
        const char *code = http == 503   ? (st == KILN_ERR_STATE ? "shutting_down" : "queue_full")
                           : http == 429 ? "rate_limit_exceeded"
                                         : NULL;
        kiln_oai_fail(&e, http ? http : 500, type, "", code, "%s", err.msg);
        return prep_fail(cx, &e, http == 503 && retry_after < 1 ? 1 : retry_after);
    }
    return true;
}

/* prepare() with its CPU time counted (kiln_http_prepare_cpu_seconds_total). */
static void prepare_counted(server *s, conn *cx) {
    uint64_t c0 = thread_cpu_ns();
    (void)prepare(s, cx);
    cx->prep_done = true;
    atomic_fetch_add(&s->prep_cpu_ns, sub0(thread_cpu_ns(), c0));
    atomic_fetch_add(&s->preps, 1);
}

static void *prep_worker(void *arg) {
    server *s = arg;
    pthread_mutex_lock(&s->job_mu);
    for (;;) {
        while (!s->job_head && !s->job_quit) pthread_cond_wait(&s->job_cv, &s->job_mu);
        conn *cx = s->job_head;
        if (!cx) break; /* quitting, and nothing left */
        s->job_head = cx->job_next;
        if (!s->job_head) s->job_tail = NULL;
        pthread_mutex_unlock(&s->job_mu);
        prepare_counted(s, cx);
        /* the connection was suspended before it was queued; its handler runs next */
        MHD_resume_connection(cx->c);
        pthread_mutex_lock(&s->job_mu);
    }
    pthread_mutex_unlock(&s->job_mu);
    return NULL;
}

/* A non-streamed answer: park (suspended) until the request is done, looking at the
 * client when the idle tick wakes it; then the body. On the HTTP thread. */
static enum MHD_Result await_final(server *s, conn *cx, struct MHD_Connection *c) {
    kiln_srv_req *r = cx->r;
    for (;;) {
        kiln_srv_lock(s->loop);
        if (r->state == 3) break;
        const int ic = idle_check(s, cx, r);
        if (ic > 0) return MHD_NO;
        if (ic == 0) continue;
        if (!kiln_srv_park(s->loop, r, true)) {
            kiln_srv_unlock(s->loop);
            kiln_srv_cancel(s->loop, r);
            return fail(s, cx, c, 503, "server_error", "", "shutting_down", 5,
                        "the server is shutting down");
        }
        MHD_suspend_connection(c);
        kiln_srv_unlock(s->loop);
        return MHD_YES;
    }
    json_t *body = NULL;
    kiln_status ec = r->err_code;
    char msg[256];
    snprintf(msg, sizeof(msg), "%s", r->err_msg);
    if (!ec) body = kiln_http_final_json(s, cx);
    kiln_srv_unlock(s->loop);
    if (ec) return fail(s, cx, c, 500, "server_error", "", NULL, 0, msg);
    if (!body) return fail(s, cx, c, 500, "server_error", "", NULL, 0, "out of memory");
    kiln_srv_count_status(&s->tenants, cx->tenant, 200);
    return send_json(c, 200, body);
}

/* After prepare: its error, the stream's response, or the wait for the whole answer. */
static enum MHD_Result respond(server *s, conn *cx, struct MHD_Connection *c) {
    if (cx->prep_http) {
        cx->prep_http = 0;
        return send_error(s, cx, c, &cx->prep_err, cx->prep_retry);
    }
    if (!cx->r) return MHD_NO;
    if (!cx->p.stream) return await_final(s, cx, c);
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_cb, cx, stream_free_cb);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    kiln_srv_count_status(&s->tenants, cx->tenant, 200);
    if (ret == MHD_YES) stream_open(s, cx);
    return ret;
}

/* The body is in: hand the request to a prompt worker (the connection suspended until
 * it is done), or prepare it here when there is no worker (or they have stopped). */
static enum MHD_Result start_generation(server *s, conn *cx, struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    cx->fd = ci ? ci->connect_fd : -1;
    pthread_mutex_lock(&s->job_mu);
    if (s->n_workers == 0 || s->job_quit) {
        pthread_mutex_unlock(&s->job_mu);
        prepare_counted(s, cx);
        return respond(s, cx, c);
    }
    /* suspended before it is queued, so the worker's resume follows the suspend */
    MHD_suspend_connection(c);
    cx->job_next = NULL;
    if (s->job_tail)
        s->job_tail->job_next = cx;
    else
        s->job_head = cx;
    s->job_tail = cx;
    pthread_cond_signal(&s->job_cv);
    pthread_mutex_unlock(&s->job_mu);
    return MHD_YES;
}

static enum MHD_Result handle_get(server *s, conn *cx, struct MHD_Connection *c, const char *url) {
    if (!strcmp(url, "/") || !strcmp(url, "/index.html")) {
        kiln_srv_count_status(&s->tenants, NULL, 200);
        struct MHD_Response *resp = MHD_create_response_from_buffer(
            kiln_web_index_len, (void *)kiln_web_index, MHD_RESPMEM_PERSISTENT);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, "Content-Type", "text/html; charset=utf-8");
        enum MHD_Result r = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return r;
    }
    if (!strcmp(url, "/health")) {
        bool dr = atomic_load(&s->draining);
        kiln_srv_count_status(&s->tenants, NULL, dr ? 503 : 200);
        return send_json(c, dr ? 503 : 200, json_pack("{s:s}", "status", dr ? "draining" : "ok"));
    }
    if (!strcmp(url, "/metrics")) {
        char *extra = kiln_srv_loop_metrics(s->loop);
        char *tail = NULL;
        /* the HTTP thread's time over the windows with a stream open (this one's so far
         * included) plus the loop's resumes (docs/SERVE.md) */
        uint64_t cpu = s->stream_cpu_ns, awake = s->stream_awake_ns;
        if (s->streams_open > 0 && on_http_thread(s)) {
            cpu += sub0(thread_cpu_ns(), s->win_cpu0);
            awake += sub0(thread_awake_ns(), s->win_awake0);
        }
        uint64_t wake = atomic_load(&s->wake_ns);
        if (asprintf(&tail,
                     "%s# TYPE kiln_http_stream_seconds_total counter\n"
                     "kiln_http_stream_seconds_total %.6f\n"
                     "# TYPE kiln_http_stream_cpu_seconds_total counter\n"
                     "kiln_http_stream_cpu_seconds_total %.6f\n"
                     "# TYPE kiln_http_stream_collect_seconds_total counter\n"
                     "kiln_http_stream_collect_seconds_total %.6f\n"
                     "# TYPE kiln_http_stream_tokens_total counter\n"
                     "kiln_http_stream_tokens_total %llu\n"
                     "# TYPE kiln_http_resume_seconds_total counter\n"
                     "kiln_http_resume_seconds_total %.6f\n"
                     "# TYPE kiln_http_resumes_total counter\n"
                     "kiln_http_resumes_total %llu\n"
                     "# TYPE kiln_http_resume_batches_total counter\n"
                     "kiln_http_resume_batches_total %llu\n"
                     "# TYPE kiln_http_prepare_cpu_seconds_total counter\n"
                     "kiln_http_prepare_cpu_seconds_total %.6f\n"
                     "# TYPE kiln_http_prepared_total counter\n"
                     "kiln_http_prepared_total %llu\n",
                     extra ? extra : "", (double)(awake + wake) * 1e-9, (double)(cpu + wake) * 1e-9,
                     (double)s->stream_collect_ns * 1e-9, (unsigned long long)s->stream_tokens,
                     (double)wake * 1e-9, (unsigned long long)atomic_load(&s->wakes),
                     (unsigned long long)atomic_load(&s->wake_batches),
                     (double)atomic_load(&s->prep_cpu_ns) * 1e-9,
                     (unsigned long long)atomic_load(&s->preps)) < 0)
            tail = NULL;
        kiln_adopt(tail);
        kiln_free(extra);
        kiln_srv_count_status(&s->tenants, NULL, 200);
        char *m = kiln_srv_metrics_text(&s->tenants, tail);
        kiln_free(tail);
        if (!m) return send_oom(c);
        return send_buf(c, 200, "text/plain; version=0.0.4", m, strlen(m), 0);
    }
    /* the /v1 routes need a key on a keyed server */
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    cx->tenant = kiln_srv_auth(&s->tenants, auth);
    if (!cx->tenant && !strncmp(url, "/v1/", 4))
        return fail(s, cx, c, 401, "invalid_request_error", "", "invalid_api_key", 0,
                    auth ? "Incorrect API key provided"
                         : "Missing API key (Authorization: Bearer KEY)");
    if (!strcmp(url, "/v1/models")) {
        kiln_srv_count_status(&s->tenants, cx->tenant, 200);
        return send_json(c, 200,
                         json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:I}]}", "object", "list", "data",
                                   "id", s->model_id, "object", "model", "created",
                                   (json_int_t)s->created, "owned_by", "kiln", "max_model_len",
                                   (json_int_t)s->o.n_ctx));
    }
    const char *pre = "/v1/tenants/";
    size_t pl = strlen(pre);
    if (!strncmp(url, pre, pl)) {
        const char *id = url + pl;
        const char *slash = strchr(id, '/');
        if (slash && !strcmp(slash, "/usage")) {
            size_t n = (size_t)(slash - id);
            if (n != strlen(cx->tenant->id) || strncmp(id, cx->tenant->id, n) != 0)
                return fail(s, cx, c, 403, "permission_error", "", "forbidden", 0,
                            "an API key can read only its own tenant's usage");
            char *u = kiln_srv_usage_json(&s->tenants, cx->tenant);
            if (!u) return send_oom(c);
            kiln_srv_count_status(&s->tenants, cx->tenant, 200);
            return send_buf(c, 200, "application/json", u, strlen(u), 0);
        }
    }
    return fail(s, cx, c, 404, "invalid_request_error", "", "not_found", 0, "no such route");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    (void)version;
    server *s = cls;
    conn *cx = *con_cls;
    if (cx == (const conn *)(const void *)&k_oom_conn) { /* answered 500 already: the upload is
                                                            discarded */
        *upload_size = 0;
        return MHD_YES;
    }
    if (!cx) {
        /* the request's headers are in: from now on only long silences close it (the
         * daemon-wide timeout is the short header timeout, against half-open clients) */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)600);
        cx = kiln_calloc(1, sizeof(*cx));
        if (!cx) {
            *con_cls = (void *)(uintptr_t)&k_oom_conn;
            return send_oom(c);
        }
        cx->s = s;
        cx->c = c;
        cx->fd = -1;
        *con_cls = cx;
        if (!strcmp(method, "POST")) {
            if (!strcmp(url, "/v1/chat/completions"))
                cx->kind = KILN_OAI_CHAT;
            else if (!strcmp(url, "/v1/completions"))
                cx->kind = KILN_OAI_COMPLETION;
            else
                return fail(s, cx, c, 404, "invalid_request_error", "", "not_found", 0,
                            "no such route");
            const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
            cx->tenant = kiln_srv_auth(&s->tenants, auth);
            if (!cx->tenant)
                return fail(s, cx, c, 401, "invalid_request_error", "", "invalid_api_key", 0,
                            auth ? "Incorrect API key provided"
                                 : "Missing API key (Authorization: Bearer KEY)");
            const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
            if (cl && strtoll(cl, NULL, 10) > s->o.max_body) {
                char m[128];
                snprintf(m, sizeof(m), "the body is larger than the limit of %lld bytes",
                         (long long)s->o.max_body);
                return fail(s, cx, c, 413, "invalid_request_error", "", "body_too_large", 0, m);
            }
            if (atomic_load(&s->draining))
                return fail(s, cx, c, 503, "server_error", "", "shutting_down", 5,
                            "the server is shutting down");
            return MHD_YES;
        }
        if (strcmp(method, "GET") && strcmp(method, "HEAD"))
            return fail(s, cx, c, 405, "invalid_request_error", "", "method_not_allowed", 0,
                        "method not allowed");
        return handle_get(s, cx, c, url);
    }
    if (*upload_size) {
        if (!cx->too_big) {
            if (cx->len + *upload_size > (size_t)s->o.max_body) {
                cx->too_big = true;
            } else {
                if (cx->len + *upload_size + 1 > cx->cap) {
                    size_t nc = (cx->len + *upload_size + 1) * 2;
                    if (nc > (size_t)s->o.max_body + 1) nc = (size_t)s->o.max_body + 1;
                    char *q = cx->oom ? NULL : kiln_realloc(cx->body, nc);
                    if (q) {
                        cx->body = q;
                        cx->cap = nc;
                    } else {
                        cx->oom = true; /* the rest is read and dropped; 500 at the end */
                    }
                }
                if (!cx->oom) {
                    memcpy(cx->body + cx->len, upload, *upload_size);
                    cx->len += *upload_size;
                }
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cx->started) /* resumed: the prompt worker is done, or the answer moved */
        return cx->prep_done ? respond(s, cx, c) : MHD_YES;
    cx->started = true;
    if (cx->oom) return send_oom(c);
    if (cx->too_big) {
        char m[128];
        snprintf(m, sizeof(m), "the body is larger than the limit of %lld bytes",
                 (long long)s->o.max_body);
        return fail(s, cx, c, 413, "invalid_request_error", "", "body_too_large", 0, m);
    }
    return start_generation(s, cx, c);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)c;
    server *s = cls;
    conn *cx = *con_cls;
    if (!cx || cx == (const conn *)(const void *)&k_oom_conn) {
        *con_cls = NULL;
        return;
    }
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && cx->r) kiln_srv_cancel(s->loop, cx->r);
    conn_free(s, cx);
    *con_cls = NULL;
}

/* ---- lifecycle ----------------------------------------------------------------------- */

void kiln_serve_opts_default(kiln_serve_opts *o) {
    memset(o, 0, sizeof(*o));
    o->host = "127.0.0.1";
    o->port = 8080;
    o->slots = 8;
    o->max_queue = 64;
    o->max_step = 512;
    o->n_ctx = 4096;
    o->max_body = 8 << 20;
    o->max_connections = 4096;
    o->header_timeout_s = 15;
    o->drain_seconds = 120;
    o->deterministic = true;
}

static void workers_stop(server *s) {
    pthread_mutex_lock(&s->job_mu);
    s->job_quit = true;
    pthread_cond_broadcast(&s->job_cv);
    pthread_mutex_unlock(&s->job_mu);
    for (int i = 0; i < s->n_workers; i++) pthread_join(s->workers[i], NULL);
    s->n_workers = 0; /* (job_quit stays: the HTTP thread prepares inline from now on) */
}

/* Waits up to ms for SIGINT/SIGTERM (the signal, or 0); SIGPIPE is swallowed. */
static int wait_signal(const sigset_t *sigs, int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    int sig = sigtimedwait(sigs, NULL, &ts);
    return sig == SIGINT || sig == SIGTERM ? sig : 0;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char b[512];
    vsnprintf(b, sizeof(b), fmt, ap);
    size_t n = strlen(b);
    while (n && b[n - 1] == '\n') b[--n] = 0;
    KILN_DEBUG("libmicrohttpd: %s", b);
}

kiln_status kiln_serve_run(const kiln_serve_opts *o, const kiln_model *m, kiln_engine *e,
                           kiln_err *err) {
    server *s = kiln_calloc(1, sizeof(*s));
    if (!s) return kiln_err_set(err, KILN_ERR_NOMEM, "server");
    kiln_status st = KILN_OK;
    struct MHD_Daemon *d = NULL;
    s->o = *o;
    s->model = m;
    s->n_vocab = (int32_t)kiln_vocab_n_tokens(m->vocab);
    if (s->n_vocab > m->cfg.n_vocab) s->n_vocab = m->cfg.n_vocab;
    s->created = (int64_t)time(NULL);
    if (o->model_id) {
        snprintf(s->model_id, sizeof(s->model_id), "%s", o->model_id);
    } else {
        const char *b = strrchr(m->path, '/');
        snprintf(s->model_id, sizeof(s->model_id), "%.255s", b ? b + 1 : m->path);
        size_t n = strlen(s->model_id);
        if (n > 5 && !strcmp(s->model_id + n - 5, ".gguf")) s->model_id[n - 5] = 0;
    }
    if (pthread_mutex_init(&s->job_mu, NULL)) {
        kiln_free(s);
        return kiln_err_set(err, KILN_ERR_NOMEM, "server");
    }
    if (pthread_cond_init(&s->job_cv, NULL)) {
        pthread_mutex_destroy(&s->job_mu);
        kiln_free(s);
        return kiln_err_set(err, KILN_ERR_NOMEM, "server");
    }
    if ((st = kiln_srv_tenants_load(o->tenants, &s->tenants, err))) {
        pthread_cond_destroy(&s->job_cv);
        pthread_mutex_destroy(&s->job_mu);
        kiln_free(s);
        return st;
    }
    const char *src = o->chat_template ? o->chat_template : m->chat_template;
    if (src &&
        (st = kiln_chat_template_parse(
             src, strlen(src), o->chat_template ? "--chat-template" : "tokenizer.chat_template",
             &s->tpl, err)))
        goto done;
    if (!src) KILN_WARN("serve: the model has no chat template; /v1/chat/completions answers 400");
    if (m->cfg.bos_id >= 0) {
        kiln_str t = kiln_vocab_text(m->vocab, m->cfg.bos_id);
        snprintf(s->bos, sizeof(s->bos), "%.*s", (int)t.len, t.ptr);
    }
    if (m->cfg.eos_id >= 0) {
        kiln_str t = kiln_vocab_text(m->vocab, m->cfg.eos_id);
        snprintf(s->eos, sizeof(s->eos), "%.*s", (int)t.len, t.ptr);
    }
    /* SIGINT/SIGTERM are taken with sigwait below: block them (and SIGPIPE) before any
     * thread starts, so every thread inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    kiln_srv_loop_opts lo = {o->slots, o->max_queue, o->max_step, o->n_ctx, o->deterministic};
    if ((st = kiln_srv_loop_create(m, e, &lo, &s->tenants, &s->loop, err))) goto done;
    kiln_srv_loop_set_wake(s->loop, conns_wake);
    /* prompt workers: a long prompt's parse, template and tokenizer would otherwise hold
     * the one HTTP thread (and every stream) for its whole time; none started: the HTTP
     * thread prepares requests itself */
    for (int i = 0; i < 2 && i < KILN_HTTP_MAX_WORKERS; i++) {
        if (pthread_create(&s->workers[i], NULL, prep_worker, s)) {
            KILN_WARN("serve: cannot start a prompt worker (%d running)", s->n_workers);
            break;
        }
        s->n_workers++;
    }
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)o->port);
    if (inet_pton(AF_INET, o->host, &addr.sin_addr) != 1) {
        st = kiln_err_set(err, KILN_ERR_INVALID_ARG, "--host %s is not an IPv4 address", o->host);
        goto done;
    }
    /* one descriptor per connection (epoll: no FD_SETSIZE limit; plus the model, logs,
     * the listening socket, epoll and its eventfd): raise the soft open-file limit to
     * fit, else serve fewer connections */
    unsigned max_conn = o->max_connections > 0 ? (unsigned)o->max_connections : 4096u;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)max_conn + 128) {
        rlim_t want = (rlim_t)max_conn + 128;
        if (rl.rlim_max != RLIM_INFINITY && want > rl.rlim_max) want = rl.rlim_max;
        rl.rlim_cur = want;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || getrlimit(RLIMIT_NOFILE, &rl) != 0)
            rl.rlim_cur = 1024;
        if (rl.rlim_cur < (rlim_t)max_conn + 128) {
            unsigned fit = rl.rlim_cur > 256 ? (unsigned)(rl.rlim_cur - 128) : 128u;
            KILN_WARN("serve: the open-file limit (%llu) allows %u connections, not %u",
                      (unsigned long long)rl.rlim_cur, fit, max_conn);
            max_conn = fit;
        }
    }
    const unsigned hdr_to = o->header_timeout_s > 0 ? (unsigned)o->header_timeout_s : 15u;
    /* one thread, epoll; a connection with nothing to send is suspended (never a
     * blocking callback) and resumed by the loop (conn.h) */
    d = MHD_start_daemon(MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME |
                             MHD_USE_ERROR_LOG,
                         (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &addr,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT,
                         max_conn, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
                         MHD_OPTION_CONNECTION_TIMEOUT, hdr_to, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                         NULL, MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
    if (!d) {
        st = kiln_err_set(err, KILN_ERR_IO, "cannot listen on %s:%d (in use, or not allowed)",
                          o->host, o->port);
        goto done;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : o->port;
    fprintf(stderr, "kiln serve: %s on http://%s:%d (%d slots, context %lld, %s)\n", s->model_id,
            o->host, port, o->slots, (long long)o->n_ctx,
            s->tenants.open ? "open: no API keys" : "API keys required");
    if (o->ready_file) {
        char tmp[1100];
        snprintf(tmp, sizeof(tmp), "%s.tmp", o->ready_file);
        FILE *f = fopen(tmp, "w");
        if (f) {
            fprintf(f, "%s %d\n", o->host, port);
            if (fclose(f) == 0) rename(tmp, o->ready_file);
        }
    }
    /* the main thread's tick: requests parked (queued, prefilling, not streamed) for
     * KILN_IDLE_LOOK_MS are woken so that their connections look at the client */
    int sig = 0;
    while (!(sig = wait_signal(&sigs, KILN_IDLE_LOOK_MS / 2)))
        kiln_srv_wake_idle(s->loop, KILN_IDLE_LOOK_MS * 1000000ull);
    fprintf(stderr, "kiln serve: %s: draining %d requests\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
            kiln_srv_loop_busy(s->loop));
    atomic_store(&s->draining, true);
    kiln_srv_loop_drain(s->loop);
    MHD_quiesce_daemon(d);
    uint64_t t0 = kiln_now_ns();
    while (kiln_now_ns() - t0 < (uint64_t)o->drain_seconds * 1000000000ull) {
        const union MHD_DaemonInfo *ci =
            MHD_get_daemon_info(d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
        if (kiln_srv_loop_busy(s->loop) == 0 && (!ci || ci->num_connections == 0)) break;
        (void)wait_signal(&sigs, 20);
        kiln_srv_wake_idle(s->loop, KILN_IDLE_LOOK_MS * 1000000ull);
    }
    fprintf(stderr, "kiln serve: stopped\n");
done:
    /* libmicrohttpd must not be stopped with a suspended connection: the workers resume
     * theirs, then every parked one is woken and none parks again */
    workers_stop(s);
    if (s->loop) kiln_srv_stop_parking(s->loop);
    if (d) MHD_stop_daemon(d);
    kiln_srv_loop_free(s->loop);
    kiln_chat_template_free(s->tpl);
    kiln_srv_tenants_free(&s->tenants);
    pthread_cond_destroy(&s->job_cv);
    pthread_mutex_destroy(&s->job_mu);
    kiln_free(s);
    return st;
}
