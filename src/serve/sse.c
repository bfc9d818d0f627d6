/* sse.c — the JSON bodies of `kiln serve`'s results and the SSE chunks of its streams
 * (conn.h): built under the loop lock from a request's choices. */
#include "serve/conn.h"

#include "base/mem.h"
#include "base/timer.h"

#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef kiln_http_server server;
typedef kiln_http_conn conn;

/* ---- JSON of results ----------------------------------------------------------------- */

const char *kiln_http_finish_name(kiln_srv_finish f) {
    return f == KILN_FIN_STOP ? "stop" : f == KILN_FIN_LENGTH ? "length" : NULL;
}

int64_t kiln_http_completion_tokens(const kiln_srv_req *r) {
    int64_t n = 0;
    for (int i = 0; i < r->n_choices; i++) n += r->ch[i].n_generated;
    return n;
}

static json_t *usage_json(const kiln_srv_req *r) {
    int64_t out = kiln_http_completion_tokens(r);
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

json_t *kiln_http_final_json(server *s, conn *cx) {
    kiln_srv_req *r = cx->r;
    bool chat = cx->kind == KILN_OAI_CHAT;
    json_t *choices = json_array();
    for (int i = 0; i < r->n_choices; i++) {
        kiln_srv_choice *c = &r->ch[i];
        const char *fin = kiln_http_finish_name(c->finish);
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

/* Out of memory here is sticky (cx->out_oom): the stream then ends with a static error
 * event (server.c's stream_cb), never with a hole in its text. */
static void out_append(conn *cx, const char *s, size_t n) {
    if (cx->out_oom || !out_reserve(cx, n)) {
        cx->out_oom = true;
        return;
    }
    memcpy(cx->out + cx->out_len, s, n);
    cx->out_len += n;
}

/* One event; a part that could not be buffered takes the whole event back. */
static void sse(conn *cx, json_t *j) {
    char *s = kiln_adopt(json_dumps(j, JSON_COMPACT));
    json_decref(j);
    if (!s) {
        cx->out_oom = true;
        return;
    }
    const size_t mark = cx->out_len;
    out_append(cx, "data: ", 6);
    out_append(cx, s, strlen(s));
    out_append(cx, "\n\n", 2);
    if (cx->out_oom) cx->out_len = mark;
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
    char *d = o ? kiln_adopt(json_dumps(o, JSON_COMPACT)) : NULL;
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

void kiln_http_stream_collect(server *s, conn *cx) {
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
        const size_t mark = cx->out_len;
        if (b) {
            out_append(cx, "data: ", 6);
            out_append(cx, b, strlen(b));
            out_append(cx, "\n\n", 2);
            kiln_free(b);
        } else {
            cx->out_oom = true;
        }
        if (cx->out_oom) { /* the static error event goes out instead */
            cx->out_len = mark;
            return;
        }
        out_append(cx, "data: [DONE]\n\n", 14);
        if (!cx->out_oom) cx->done_sent = true;
        return;
    }
    int64_t toks_now = 0;
    for (int i = 0; i < r->n_choices; i++) {
        kiln_srv_choice *c = &r->ch[i];
        toks_now += (int64_t)c->n_ids;
        if (cx->sent_finish[i]) continue;
        bool hold = chat && cx->p.has_tools && c->finish == KILN_FIN_NONE;
        size_t nlp = c->lp ? json_array_size(c->lp) : 0;
        const char *fin = kiln_http_finish_name(c->finish);
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
        if (!cx->out_oom) cx->done_sent = true;
    }
}
