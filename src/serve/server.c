/* server.c — HTTP routing, limits, auth, SSE and responses of `kiln serve` (serve.h). */
#include "serve/serve.h"
#include "base/mem.h"

#include "base/log.h"
#include "base/timer.h"
#include "serve/loop.h"
#include "serve/oai.h"
#include "serve/tenants.h"
#include "tok/template.h"
#include "tok/tok.h"

#include <errno.h>
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

typedef struct server {
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
    /* server time outside the scheduler per streamed token: for every finished stream,
     * its connection thread's CPU time from the response's first content callback to its
     * end (woken by a token, collecting and formatting chunks, libmicrohttpd's chunk
     * framing, poll() and send(), going back to sleep; not the time asleep), the wall
     * time of the same work (time awake: includes waiting for a core) and its tokens;
     * of the wall time, the part spent collecting and formatting under the loop lock */
    atomic_uint_fast64_t stream_ns, stream_cpu_ns, stream_tokens, stream_collect_ns;
} server;

/* per connection */
typedef struct conn {
    server *s;
    kiln_oai_kind kind;
    char *body;
    size_t len, cap;
    bool too_big, started;
    kiln_srv_tenant *tenant;
    bool admitted;
    kiln_oai_req p;
    bool parsed;
    kiln_srv_req *r;
    int fd;
    /* streaming */
    char id[48];
    uint64_t seen;
    size_t sent_text[KILN_OAI_MAX_N], sent_lp[KILN_OAI_MAX_N];
    bool sent_finish[KILN_OAI_MAX_N];
    bool role_sent, usage_sent, done_sent, end;
    bool rejected; /* the scheduler refused it (503/429): counted as such, not as a cancel */
    char *out;
    size_t out_len, out_off, out_cap;
    /* a content chunk's bytes around its choice, from jansson once per stream
     * ("data: {...,"choices":[" and "]...}\n\n"; chunk_head NULL: not built yet) */
    char *chunk_head, *chunk_tail;
    size_t chunk_head_len, chunk_tail_len;
    bool chunk_fast_off; /* building them failed: jansson for every chunk */
    uint64_t t_last_tok;
    int64_t tokens_seen;
    /* the stream's own time (server.stream_*): set at the first content callback */
    bool stream_timed, stream_counted;
    pthread_t stream_thread;
    uint64_t stream_cpu0; /* the thread's CPU clock at the first callback */
    uint64_t t_awake;     /* when the thread last stopped waiting for a token */
    uint64_t awake_ns;    /* wall time awake so far */
    uint64_t collect_ns;  /* of which in stream_collect (and the unlock after it) */
    int wait_ms;          /* the next wait for a token (backs off while none comes) */
} conn;

/* ---- responses ----------------------------------------------------------------------- */

static enum MHD_Result send_buf(struct MHD_Connection *c, int status, const char *type, char *buf,
                                size_t len, int retry_after) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        len, buf, buf ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        kiln_free(buf);
        return MHD_NO;
    }
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
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return MHD_NO;
    return send_buf(c, status, "application/json", s, strlen(s), 0);
}

static enum MHD_Result send_error(server *s, conn *cx, struct MHD_Connection *c,
                                  const kiln_oai_error *e, int retry_after) {
    char *b = kiln_oai_error_body(e);
    kiln_srv_count_status(&s->tenants, cx ? cx->tenant : NULL, e->http);
    if (!b) return MHD_NO;
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

/* ---- JSON of results ----------------------------------------------------------------- */

static const char *finish_name(kiln_srv_finish f) {
    return f == KILN_FIN_STOP ? "stop" : f == KILN_FIN_LENGTH ? "length" : NULL;
}

static int64_t completion_tokens(const kiln_srv_req *r) {
    int64_t n = 0;
    for (int i = 0; i < r->n_choices; i++) n += r->ch[i].n_generated;
    return n;
}

static json_t *usage_json(const kiln_srv_req *r) {
    int64_t out = completion_tokens(r);
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)r->n_prompt,
                     "completion_tokens", (json_int_t)out, "total_tokens",
                     (json_int_t)(r->n_prompt + (size_t)out));
}

/* completions-style logprobs {tokens, token_logprobs, top_logprobs, text_offset} from
 * chat-style entries [from, to) */
static json_t *legacy_logprobs(const json_t *lp, size_t from, size_t to, size_t text_base) {
    json_t *o = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                          "text_offset");
    if (!o) return NULL;
    size_t off = text_base;
    for (size_t i = from; i < to; i++) {
        json_t *e = json_array_get(lp, i);
        const char *tok = json_string_value(json_object_get(e, "token"));
        json_array_append(json_object_get(o, "tokens"), json_object_get(e, "token"));
        json_array_append(json_object_get(o, "token_logprobs"), json_object_get(e, "logprob"));
        json_t *tops = json_object();
        size_t k;
        json_t *t;
        json_array_foreach(json_object_get(e, "top_logprobs"), k, t) json_object_set(
            tops, json_string_value(json_object_get(t, "token")), json_object_get(t, "logprob"));
        json_array_append_new(json_object_get(o, "top_logprobs"), tops);
        json_array_append_new(json_object_get(o, "text_offset"), json_integer((json_int_t)off));
        off += tok ? strlen(tok) : 0;
    }
    return o;
}

static json_t *slice(const json_t *a, size_t from, size_t to) {
    json_t *o = json_array();
    for (size_t i = from; o && i < to; i++) json_array_append(o, json_array_get(a, i));
    return o;
}

/* the final (non-streamed) body; under the loop lock */
static json_t *final_json(server *s, conn *cx) {
    kiln_srv_req *r = cx->r;
    bool chat = cx->kind == KILN_OAI_CHAT;
    json_t *choices = json_array();
    for (int i = 0; i < r->n_choices; i++) {
        kiln_srv_choice *c = &r->ch[i];
        const char *fin = finish_name(c->finish);
        json_t *ch = json_object();
        json_object_set_new(ch, "index", json_integer(i));
        if (chat) {
            json_t *msg = json_object();
            json_t *calls = NULL;
            char *content = NULL;
            json_object_set_new(msg, "role", json_string("assistant"));
            if (cx->p.has_tools &&
                kiln_oai_parse_tool_calls(c->text ? c->text : "", c->len,
                                          atomic_fetch_add(&s->req_counter, 1), &calls, &content)) {
                json_object_set_new(msg, "content", content ? json_string(content) : json_null());
                json_object_set_new(msg, "tool_calls", calls);
                kiln_free(content);
                fin = "tool_calls";
            } else {
                json_object_set_new(msg, "content", json_stringn(c->text ? c->text : "", c->len));
            }
            json_object_set_new(ch, "message", msg);
            json_object_set_new(ch, "logprobs",
                                c->lp ? json_pack("{s:O}", "content", c->lp) : json_null());
        } else {
            json_object_set_new(ch, "text", json_stringn(c->text ? c->text : "", c->len));
            json_object_set_new(ch, "logprobs",
                                c->lp ? legacy_logprobs(c->lp, 0, json_array_size(c->lp), 0)
                                      : json_null());
        }
        json_object_set_new(ch, "finish_reason", fin ? json_string(fin) : json_null());
        if (cx->p.echo_ids) {
            json_t *ids = json_array();
            for (size_t k = 0; k < c->n_ids; k++)
                json_array_append_new(ids, json_integer(c->ids[k]));
            json_object_set_new(ch, "token_ids", ids);
        }
        json_array_append_new(choices, ch);
    }
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:o}", "id", cx->id, "object",
                          chat ? "chat.completion" : "text_completion", "created",
                          (json_int_t)time(NULL), "model", s->model_id, "system_fingerprint",
                          "kiln", "choices", choices, "usage", usage_json(r));
    if (o && cx->p.echo_ids) {
        json_t *ids = json_array();
        for (size_t k = 0; k < r->n_prompt; k++)
            json_array_append_new(ids, json_integer(r->prompt[k]));
        json_object_set_new(o, "prompt_token_ids", ids);
    }
    return o;
}

/* ---- streaming ----------------------------------------------------------------------- */

/* Room for n more bytes in cx->out. */
static bool out_reserve(conn *cx, size_t n) {
    if (cx->out_len + n <= cx->out_cap) return true;
    size_t nc = (cx->out_len + n) * 2 + 256;
    char *q = kiln_realloc(cx->out, nc);
    if (!q) return false;
    cx->out = q;
    cx->out_cap = nc;
    return true;
}

static void out_append(conn *cx, const char *s, size_t n) {
    if (!out_reserve(cx, n)) return;
    memcpy(cx->out + cx->out_len, s, n);
    cx->out_len += n;
}

static void sse(conn *cx, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return;
    out_append(cx, "data: ", 6);
    out_append(cx, s, strlen(s));
    out_append(cx, "\n\n", 2);
    kiln_free(s);
}

static json_t *chunk(server *s, conn *cx, json_t *choice) {
    bool chat = cx->kind == KILN_OAI_CHAT;
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:[o]}", "id", cx->id, "object",
                          chat ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)s->created, "model", s->model_id, "system_fingerprint",
                          "kiln", "choices", choice);
    if (o && cx->p.include_usage) json_object_set_new(o, "usage", json_null());
    return o;
}

/* The bytes of chunk(s, cx, choice) before and after its choice, from jansson (so the
 * id, model name and usage field are exactly as chunk() writes them). */
static bool chunk_frame(server *s, conn *cx) {
    if (cx->chunk_head) return true;
    if (cx->chunk_fast_off) return false;
    cx->chunk_fast_off = true;
    json_t *o = chunk(s, cx, json_integer(0));
    char *d = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!d) return false;
    static const char mark[] = ",\"choices\":[0]";
    /* a ," cannot occur inside a dumped string (its " is escaped): the first is the key */
    const char *m = strstr(d, mark);
    if (m) {
        /* head: up to and with the '['; tail: from the ']' after the placeholder 0 */
        const char *zero = m + sizeof(mark) - 3;
        size_t head = (size_t)(zero - d), tail = strlen(zero + 1);
        cx->chunk_head = kiln_malloc(6 + head);
        cx->chunk_tail = kiln_malloc(tail + 2);
        if (cx->chunk_head && cx->chunk_tail) {
            memcpy(cx->chunk_head, "data: ", 6);
            memcpy(cx->chunk_head + 6, d, head);
            cx->chunk_head_len = 6 + head;
            memcpy(cx->chunk_tail, zero + 1, tail);
            memcpy(cx->chunk_tail + tail, "\n\n", 2);
            cx->chunk_tail_len = tail + 2;
            cx->chunk_fast_off = false;
        } else {
            kiln_free(cx->chunk_head);
            kiln_free(cx->chunk_tail);
            cx->chunk_head = cx->chunk_tail = NULL;
        }
    }
    kiln_free(d);
    return !cx->chunk_fast_off;
}

/* Appends the content chunk of choice i (text[0..n), finish reason fin or null) to
 * cx->out as sse(cx, chunk(...)) of the jansson path writes it, without building JSON
 * objects (no logprobs, no tool calls). False, with nothing appended, when the text is
 * not valid UTF-8 or memory is short: the caller takes the jansson path. */
static bool chunk_fast(server *s, conn *cx, int i, const char *text, size_t n, const char *fin) {
    if (!chunk_frame(s, cx)) return false;
    bool chat = cx->kind == KILN_OAI_CHAT;
    /* head {"index":I,"delta":{"content":Q},"logprobs":null,"finish_reason":"length"} tail */
    size_t need = cx->chunk_head_len + 96 + 6 * n + cx->chunk_tail_len;
    if (!out_reserve(cx, need)) return false;
    char *d = cx->out + cx->out_len;
    memcpy(d, cx->chunk_head, cx->chunk_head_len);
    d += cx->chunk_head_len;
    /* (no snprintf: cold, its code costs more than the rest of the chunk) */
    static const char k_index[] = "{\"index\":";
    memcpy(d, k_index, sizeof(k_index) - 1);
    d += sizeof(k_index) - 1;
    char digits[12];
    int nd = 0;
    unsigned u = (unsigned)i;
    do {
        digits[nd++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    while (nd) *d++ = digits[--nd];
    *d++ = ',';
    static const char k_delta[] = "\"delta\":{\"content\":", k_text[] = "\"text\":";
    const char *key = chat ? k_delta : k_text;
    size_t key_len = chat ? sizeof(k_delta) - 1 : sizeof(k_text) - 1;
    memcpy(d, key, key_len);
    d += key_len;
    size_t q = kiln_oai_json_quote(text, n, d);
    if (!q) return false;
    d += q;
    if (chat) *d++ = '}';
    static const char lp[] = ",\"logprobs\":null,\"finish_reason\":";
    memcpy(d, lp, sizeof(lp) - 1);
    d += sizeof(lp) - 1;
    if (fin) {
        *d++ = '"';
        memcpy(d, fin, strlen(fin));
        d += strlen(fin);
        *d++ = '"';
    } else {
        memcpy(d, "null", 4);
        d += 4;
    }
    *d++ = '}';
    memcpy(d, cx->chunk_tail, cx->chunk_tail_len);
    d += cx->chunk_tail_len;
    cx->out_len = (size_t)(d - cx->out);
    return true;
}

/* Formats everything new in cx->r into cx->out; under the loop lock. */
static void stream_collect(server *s, conn *cx) {
    kiln_srv_req *r = cx->r;
    bool chat = cx->kind == KILN_OAI_CHAT;
    if (chat && !cx->role_sent) {
        for (int i = 0; i < r->n_choices; i++)
            sse(cx, chunk(s, cx,
                          json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", i, "delta", "role",
                                    "assistant", "content", "", "logprobs", "finish_reason")));
        cx->role_sent = true;
    }
    if (r->err_code && r->err_code != KILN_ERR_CANCELLED && !cx->done_sent) {
        kiln_oai_error e;
        kiln_oai_fail(&e, 500, "server_error", "", NULL, "generation failed: %s", r->err_msg);
        char *b = kiln_oai_error_body(&e);
        if (b) {
            out_append(cx, "data: ", 6);
            out_append(cx, b, strlen(b));
            out_append(cx, "\n\n", 2);
            kiln_free(b);
        }
        out_append(cx, "data: [DONE]\n\n", 14);
        cx->done_sent = true;
        return;
    }
    int64_t toks_now = 0;
    for (int i = 0; i < r->n_choices; i++) {
        kiln_srv_choice *c = &r->ch[i];
        toks_now += (int64_t)c->n_ids;
        if (cx->sent_finish[i]) continue;
        bool hold = chat && cx->p.has_tools && c->finish == KILN_FIN_NONE;
        size_t nlp = c->lp ? json_array_size(c->lp) : 0;
        const char *fin = finish_name(c->finish);
        if (!hold && !c->lp && !(chat && cx->p.has_tools) && c->len > cx->sent_text[i] &&
            chunk_fast(s, cx, i, c->text + cx->sent_text[i], c->len - cx->sent_text[i],
                       c->finish != KILN_FIN_NONE ? fin : NULL)) {
            /* the common chunk: new text, no logprobs, no tool calls */
            if (c->finish != KILN_FIN_NONE && fin) cx->sent_finish[i] = true;
            cx->sent_text[i] = c->len;
        } else if (!hold && (c->len > cx->sent_text[i] || nlp > cx->sent_lp[i])) {
            json_t *calls = NULL;
            char *content = NULL;
            bool tools =
                chat && cx->p.has_tools &&
                kiln_oai_parse_tool_calls(c->text, c->len, atomic_fetch_add(&s->req_counter, 1),
                                          &calls, &content);
            json_t *ch = json_object();
            json_object_set_new(ch, "index", json_integer(i));
            if (chat) {
                json_t *delta = json_object();
                if (tools) {
                    if (content) json_object_set_new(delta, "content", json_string(content));
                    size_t k;
                    json_t *call;
                    json_array_foreach(calls, k, call)
                        json_object_set_new(call, "index", json_integer((int)k));
                    json_object_set_new(delta, "tool_calls", calls);
                    kiln_free(content);
                    fin = "tool_calls";
                } else {
                    json_object_set_new(
                        delta, "content",
                        json_stringn(c->text + cx->sent_text[i], c->len - cx->sent_text[i]));
                }
                json_object_set_new(ch, "delta", delta);
                json_object_set_new(
                    ch, "logprobs",
                    c->lp ? json_pack("{s:o}", "content", slice(c->lp, cx->sent_lp[i], nlp))
                          : json_null());
            } else {
                json_object_set_new(
                    ch, "text",
                    json_stringn(c->text + cx->sent_text[i], c->len - cx->sent_text[i]));
                json_object_set_new(
                    ch, "logprobs",
                    c->lp ? legacy_logprobs(c->lp, cx->sent_lp[i], nlp, cx->sent_text[i])
                          : json_null());
            }
            /* the finish reason rides on the last content chunk when it is known */
            json_object_set_new(ch, "finish_reason",
                                fin && c->finish != KILN_FIN_NONE ? json_string(fin) : json_null());
            if (fin && c->finish != KILN_FIN_NONE) cx->sent_finish[i] = true;
            cx->sent_text[i] = c->len;
            cx->sent_lp[i] = nlp;
            sse(cx, chunk(s, cx, ch));
        }
        if (!cx->sent_finish[i] && fin) {
            json_t *ch = chat ? json_pack("{s:i, s:{}, s:n, s:s}", "index", i, "delta", "logprobs",
                                          "finish_reason", fin)
                              : json_pack("{s:i, s:s, s:n, s:s}", "index", i, "text", "",
                                          "logprobs", "finish_reason", fin);
            sse(cx, chunk(s, cx, ch));
            cx->sent_finish[i] = true;
        }
    }
    /* inter-token times: from the connection's view of new tokens */
    if (toks_now > cx->tokens_seen) {
        uint64_t now = kiln_now_ns();
        if (cx->t_last_tok)
            kiln_srv_observe(&s->tenants, cx->tenant, KILN_HIST_ITL,
                             (double)(now - cx->t_last_tok) * 1e-9 /
                                 (double)(toks_now - cx->tokens_seen));
        cx->t_last_tok = now;
        cx->tokens_seen = toks_now;
    }
    if (r->state == 3 && !cx->done_sent) {
        if (cx->p.include_usage) {
            json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:[], s:o}", "id", cx->id, "object",
                                  chat ? "chat.completion.chunk" : "text_completion", "created",
                                  (json_int_t)s->created, "model", s->model_id,
                                  "system_fingerprint", "kiln", "choices", "usage", usage_json(r));
            sse(cx, o);
        }
        out_append(cx, "data: [DONE]\n\n", 14);
        cx->done_sent = true;
    }
}

static bool peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

/* This thread's CPU time (0 when the clock is unavailable). */
static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Adds a stream's time and tokens to the server's counters, once, from its own thread
 * (the CPU clock is the calling thread's; from another thread the stream is left out). */
static void stream_count(server *s, conn *cx) {
    if (!cx->stream_timed || cx->stream_counted ||
        !pthread_equal(cx->stream_thread, pthread_self()))
        return;
    cx->stream_counted = true;
    uint64_t cpu = thread_cpu_ns();
    atomic_fetch_add(&s->stream_cpu_ns, cpu > cx->stream_cpu0 ? cpu - cx->stream_cpu0 : 0);
    atomic_fetch_add(&s->stream_ns, cx->awake_ns + (kiln_now_ns() - cx->t_awake));
    atomic_fetch_add(&s->stream_collect_ns, cx->collect_ns);
    atomic_fetch_add(&s->stream_tokens, (uint64_t)cx->tokens_seen);
}

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    conn *cx = cls;
    server *s = cx->s;
    if (!cx->stream_timed) {
        cx->stream_timed = true;
        cx->stream_thread = pthread_self();
        cx->stream_cpu0 = thread_cpu_ns();
        cx->t_awake = kiln_now_ns();
        cx->wait_ms = 50;
    }
    for (;;) {
        if (cx->out_off < cx->out_len) {
            size_t n = cx->out_len - cx->out_off;
            if (n > max) n = max;
            memcpy(buf, cx->out + cx->out_off, n);
            cx->out_off += n;
            if (cx->out_off == cx->out_len) cx->out_off = cx->out_len = 0;
            return (ssize_t)n;
        }
        if (cx->done_sent) {
            stream_count(s, cx);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        uint64_t t_sleep = kiln_now_ns();
        cx->awake_ns += t_sleep - cx->t_awake;
        /* a wait that times out checks the client: after 50 ms, then 100, then every
         * 200 ms, so that long waits (queued, prefilling, long steps) cost a few wakeups,
         * not one per 50 ms; once tokens flow, a gone client also fails the writes */
        bool changed = kiln_srv_wait(s->loop, cx->r, cx->seen, cx->wait_ms);
        /* kiln_srv_wait returns with the lock held */
        cx->t_awake = kiln_now_ns();
        if (changed) {
            cx->seen = cx->r->version;
            stream_collect(s, cx);
            kiln_srv_unlock(s->loop);
            cx->collect_ns += kiln_now_ns() - cx->t_awake;
            continue;
        }
        if (cx->wait_ms < 200) cx->wait_ms *= 2;
        kiln_srv_unlock(s->loop);
        if (peer_gone(cx->fd)) {
            kiln_srv_cancel(s->loop, cx->r);
            stream_count(s, cx);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

/* ---- request life -------------------------------------------------------------------- */

static void conn_free(server *s, conn *cx) {
    if (!cx) return;
    stream_count(s, cx); /* a stream that the client left mid-send */
    if (cx->r) {
        kiln_srv_lock(s->loop);
        bool done = cx->r->state == 3 && cx->r->err_code != KILN_ERR_CANCELLED;
        bool cancelled = cx->r->state != 3 || cx->r->err_code == KILN_ERR_CANCELLED;
        int64_t in = (int64_t)cx->r->n_prompt, out = completion_tokens(cx->r);
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

static enum MHD_Result start_generation(server *s, conn *cx, struct MHD_Connection *c) {
    kiln_oai_error e;
    if (!kiln_oai_parse(cx->kind, cx->body ? cx->body : "", cx->len, s->n_vocab, &cx->p, &e)) {
        cx->parsed = true;
        return send_error(s, cx, c, &e, 0);
    }
    cx->parsed = true;
    if (strcmp(cx->p.model, s->model_id) != 0) {
        kiln_oai_fail(&e, 404, "invalid_request_error", "model", "model_not_found",
                      "The model '%.100s' does not exist; this server serves '%s'", cx->p.model,
                      s->model_id);
        return send_error(s, cx, c, &e, 0);
    }
    kiln_tokens toks = {0};
    if (!build_prompt(s, cx, &toks, &e)) {
        kiln_tokens_free(&toks);
        return send_error(s, cx, c, &e, 0);
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
        return send_error(s, cx, c, &e, 0);
    }
    if (max_tokens < 0) max_tokens = n_ctx - (int64_t)toks.n;
    const char *why = NULL;
    int retry = kiln_srv_admit(&s->tenants, cx->tenant, (int64_t)toks.n, &why);
    if (retry > 0) {
        kiln_tokens_free(&toks);
        kiln_oai_fail(&e, 429, "rate_limit_exceeded", "", "rate_limit_exceeded",
                      "tenant '%s' is over its %s quota; retry after %d s", cx->tenant->id, why,
                      retry);
        return send_error(s, cx, c, &e, retry);
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
    if (st) return fail(s, cx, c, 500, "server_error", "", NULL, 0, "out of memory");
    snprintf(cx->id, sizeof(cx->id), "%s-%llx%08llx",
             cx->kind == KILN_OAI_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)time(NULL),
             (unsigned long long)atomic_fetch_add(&s->req_counter, 1));
    snprintf(cx->r->tenant, sizeof(cx->r->tenant), "%s", cx->tenant->id);
    int http = 0, retry_after = 0;
    if ((st = kiln_srv_submit(s->loop, cx->r, &http, &retry_after, &err))) {
        cx->rejected = true;
        const char *type = http == 429   ? "rate_limit_exceeded"
                           : http >= 500 ? "server_error"
                                         : "invalid_request_error";
        const char *code = http == 503   ? (st == KILN_ERR_STATE ? "shutting_down" : "queue_full")
                           : http == 429 ? "rate_limit_exceeded"
                                         : NULL;
        return fail(s, cx, c, http ? http : 500, type, "", code,
                    http == 503 && retry_after < 1 ? 1 : retry_after, err.msg);
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    cx->fd = ci ? ci->connect_fd : -1;
    if (cx->p.stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(
            MHD_SIZE_UNKNOWN, 16384, stream_cb, cx, stream_free_cb);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        enum MHD_Result r = MHD_queue_response(c, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        kiln_srv_count_status(&s->tenants, cx->tenant, 200);
        return r;
    }
    /* not streamed: wait here (this connection's own thread), watching for the client */
    for (;;) {
        kiln_srv_wait(s->loop, cx->r, cx->seen, 50);
        cx->seen = cx->r->version;
        bool done = cx->r->state == 3;
        kiln_srv_unlock(s->loop);
        if (done) break;
        if (peer_gone(cx->fd)) {
            kiln_srv_cancel(s->loop, cx->r);
            return MHD_NO;
        }
    }
    kiln_srv_lock(s->loop);
    json_t *body = NULL;
    kiln_status ec = cx->r->err_code;
    char msg[256];
    snprintf(msg, sizeof(msg), "%s", cx->r->err_msg);
    if (!ec) body = final_json(s, cx);
    kiln_srv_unlock(s->loop);
    if (ec) return fail(s, cx, c, 500, "server_error", "", NULL, 0, msg);
    if (!body) return fail(s, cx, c, 500, "server_error", "", NULL, 0, "out of memory");
    kiln_srv_count_status(&s->tenants, cx->tenant, 200);
    return send_json(c, 200, body);
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
        uint64_t ns = atomic_load(&s->stream_ns), nt = atomic_load(&s->stream_tokens);
        uint64_t cns = atomic_load(&s->stream_cpu_ns), kns = atomic_load(&s->stream_collect_ns);
        if (asprintf(&tail,
                     "%s# TYPE kiln_http_stream_seconds_total counter\n"
                     "kiln_http_stream_seconds_total %.6f\n"
                     "# TYPE kiln_http_stream_cpu_seconds_total counter\n"
                     "kiln_http_stream_cpu_seconds_total %.6f\n"
                     "# TYPE kiln_http_stream_collect_seconds_total counter\n"
                     "kiln_http_stream_collect_seconds_total %.6f\n"
                     "# TYPE kiln_http_stream_tokens_total counter\n"
                     "kiln_http_stream_tokens_total %llu\n",
                     extra ? extra : "", (double)ns * 1e-9, (double)cns * 1e-9, (double)kns * 1e-9,
                     (unsigned long long)nt) < 0)
            tail = NULL;
        kiln_free(extra);
        kiln_srv_count_status(&s->tenants, NULL, 200);
        char *m = kiln_srv_metrics_text(&s->tenants, tail);
        kiln_free(tail);
        if (!m) return MHD_NO;
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
            if (!u) return MHD_NO;
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
    if (!cx) {
        /* the request's headers are in: from now on only long silences close it (the
         * daemon-wide timeout is the short header timeout, against half-open clients) */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)600);
        cx = kiln_calloc(1, sizeof(*cx));
        if (!cx) return MHD_NO;
        cx->s = s;
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
                    char *q = kiln_realloc(cx->body, nc);
                    if (!q) return MHD_NO;
                    cx->body = q;
                    cx->cap = nc;
                }
                memcpy(cx->body + cx->len, upload, *upload_size);
                cx->len += *upload_size;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cx->started) return MHD_YES;
    cx->started = true;
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
    if (!cx) return;
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
    if ((st = kiln_srv_tenants_load(o->tenants, &s->tenants, err))) {
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
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)o->port);
    if (inet_pton(AF_INET, o->host, &addr.sin_addr) != 1) {
        st = kiln_err_set(err, KILN_ERR_INVALID_ARG, "--host %s is not an IPv4 address", o->host);
        goto done;
    }
    /* one descriptor per connection (poll(), not select(): descriptors past FD_SETSIZE =
     * 1024 are refused by select; plus the model, logs, the listening socket): raise
     * the soft open-file limit to fit, else serve fewer connections */
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
    d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                             MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG,
                         (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &addr,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT,
                         max_conn, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
                         MHD_OPTION_CONNECTION_TIMEOUT, hdr_to, MHD_OPTION_THREAD_STACK_SIZE,
                         (size_t)(1 << 20), MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                         MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
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
    int sig = 0;
    while (sigwait(&sigs, &sig) == 0 && sig == SIGPIPE) {
    }
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
        usleep(20000);
    }
    fprintf(stderr, "kiln serve: stopped\n");
done:
    if (d) MHD_stop_daemon(d);
    kiln_srv_loop_free(s->loop);
    kiln_chat_template_free(s->tpl);
    kiln_srv_tenants_free(&s->tenants);
    kiln_free(s);
    return st;
}
