/* oai.c — OpenAI request validation, error bodies and tool-call parsing (oai.h). */
#include "serve/oai.h"
#include "base/mem.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool kiln_oai_fail(kiln_oai_error *e, int http, const char *type, const char *param,
                   const char *code, const char *fmt, ...) {
    e->http = http;
    e->type = type;
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    return false;
}

/* Length of the valid UTF-8 sequence at s[0..n) (n >= 1), 0 when invalid (jansson's
 * rules, src/utf.c: no overlong forms, no surrogates, nothing past U+10FFFF). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t k;
    uint32_t cp;
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) {
        k = 2;
        cp = c & 0x1F;
    } else if (c < 0xF0) {
        k = 3;
        cp = c & 0x0F;
    } else if (c < 0xF5) {
        k = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (k > n) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((k == 3 && cp < 0x800) || (k == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return k;
}

size_t kiln_oai_json_quote(const char *s, size_t n, char *dst) {
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *u = (const unsigned char *)s;
    char *d = dst;
    *d++ = '"';
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        if (c >= 0x80) {
            size_t k = utf8_seq(u + i, n - i);
            if (!k) return 0;
            memcpy(d, u + i, k);
            d += k;
            i += k;
            continue;
        }
        i++;
        if (c >= 0x20 && c != '"' && c != '\\') {
            *d++ = (char)c;
            continue;
        }
        *d++ = '\\';
        switch (c) {
        case '"':
            *d++ = '"';
            break;
        case '\\':
            *d++ = '\\';
            break;
        case '\b':
            *d++ = 'b';
            break;
        case '\f':
            *d++ = 'f';
            break;
        case '\n':
            *d++ = 'n';
            break;
        case '\r':
            *d++ = 'r';
            break;
        case '\t':
            *d++ = 't';
            break;
        default:
            memcpy(d, "u00", 3);
            d[3] = hex[c >> 4];
            d[4] = hex[c & 15];
            d += 5;
        }
    }
    *d++ = '"';
    return (size_t)(d - dst);
}

char *kiln_oai_error_body(const kiln_oai_error *e) {
    json_t *err = json_object();
    json_t *root = json_object();
    if (!err || !root) {
        json_decref(err);
        json_decref(root);
        return NULL;
    }
    json_object_set_new(err, "message", json_string(e->message));
    json_object_set_new(err, "type", json_string(e->type ? e->type : "invalid_request_error"));
    json_object_set_new(err, "param", e->param[0] ? json_string(e->param) : json_null());
    json_object_set_new(err, "code", e->code ? json_string(e->code) : json_null());
    json_object_set_new(root, "error", err);
    char *s = kiln_adopt(json_dumps(root, JSON_COMPACT));
    json_decref(root);
    return s;
}

#define BAD(param, ...)                                                                            \
    kiln_oai_fail(e, 400, "invalid_request_error", param, "invalid_value", __VA_ARGS__)
#define BADTYPE(param, what)                                                                       \
    kiln_oai_fail(e, 400, "invalid_request_error", param, "invalid_type", "'%s' must be %s",       \
                  param, what)

/* A number field in [lo, hi]; absent or null keeps *out. */
static bool get_num(const json_t *o, const char *k, double lo, double hi, double *out,
                    kiln_oai_error *e) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) return BADTYPE(k, "a number");
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi)
        return BAD(k, "'%s' is %g; it must be between %g and %g", k, x, lo, hi);
    *out = x;
    return true;
}

static bool get_int(const json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out,
                    kiln_oai_error *e) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v)) return BADTYPE(k, "an integer");
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return BAD(k, "'%s' is %lld; it must be between %lld and %lld", k, (long long)x,
                   (long long)lo, (long long)hi);
    *out = x;
    return true;
}

static bool get_bool(const json_t *o, const char *k, bool *out, kiln_oai_error *e) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) return BADTYPE(k, "a boolean");
    *out = json_is_true(v);
    return true;
}

/* Content: a string or an array of {"type":"text","text":...} parts, joined. Returns a
 * new JSON string, or json_null() for null (allowed only where null_ok). */
static json_t *norm_content(const json_t *c, const char *param, bool null_ok, kiln_oai_error *e) {
    if (json_is_string(c)) return json_incref((json_t *)c);
    if (!c || json_is_null(c)) {
        if (null_ok) return json_null();
        kiln_oai_fail(e, 400, "invalid_request_error", param, "invalid_value",
                      "'%s' is required for this message", param);
        return NULL;
    }
    if (!json_is_array(c)) {
        kiln_oai_fail(e, 400, "invalid_request_error", param, "invalid_type",
                      "'%s' must be a string or an array of content parts", param);
        return NULL;
    }
    size_t total = 0, i;
    json_t *p;
    json_array_foreach(c, i, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        json_t *t = json_object_get(p, "text");
        if (!json_is_object(p) || !type || strcmp(type, "text") != 0 || !json_is_string(t)) {
            char pp[160];
            snprintf(pp, sizeof(pp), "%.100s[%zu]", param, i);
            kiln_oai_fail(e, 400, "invalid_request_error", pp, "invalid_value",
                          "'%s' must be a text part {\"type\": \"text\", \"text\": ...}; "
                          "kiln's models read text only (type: %s)",
                          pp, type ? type : "missing");
            return NULL;
        }
        total += json_string_length(t);
    }
    char *buf = kiln_malloc(total + 1);
    if (!buf) {
        kiln_oai_fail(e, 500, "server_error", param, NULL, "out of memory");
        return NULL;
    }
    size_t off = 0;
    json_array_foreach(c, i, p) {
        json_t *t = json_object_get(p, "text");
        memcpy(buf + off, json_string_value(t), json_string_length(t));
        off += json_string_length(t);
    }
    json_t *s = json_stringn_nocheck(buf, off);
    kiln_free(buf);
    if (!s) kiln_oai_fail(e, 500, "server_error", param, NULL, "out of memory");
    return s;
}

static bool parse_messages(const json_t *root, kiln_oai_req *r, kiln_oai_error *e) {
    json_t *ms = json_object_get(root, "messages");
    if (!ms) return BAD("messages", "'messages' is required");
    if (!json_is_array(ms)) return BADTYPE("messages", "an array of message objects");
    if (json_array_size(ms) == 0) return BAD("messages", "'messages' must not be empty");
    r->messages = json_array();
    if (!r->messages) return kiln_oai_fail(e, 500, "server_error", "", NULL, "out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m) {
        char pp[160];
        snprintf(pp, sizeof(pp), "messages[%zu]", i);
        if (!json_is_object(m)) return BADTYPE(pp, "an object");
        const char *role = json_string_value(json_object_get(m, "role"));
        snprintf(pp, sizeof(pp), "messages[%zu].role", i);
        if (!role) return BAD(pp, "'%s' is required (a string)", pp);
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool") && strcmp(role, "developer"))
            return BAD(pp,
                       "'%s' is '%.32s'; it must be one of system, developer, user, assistant, "
                       "tool",
                       pp, role);
        json_t *nm = json_deep_copy(m);
        if (!nm || json_array_append_new(r->messages, nm))
            return kiln_oai_fail(e, 500, "server_error", "", NULL, "out of memory");
        /* "developer" is the newer name of "system" */
        if (!strcmp(role, "developer")) json_object_set_new(nm, "role", json_string("system"));
        json_t *tc = json_object_get(m, "tool_calls");
        bool assistant = !strcmp(role, "assistant");
        snprintf(pp, sizeof(pp), "messages[%zu].content", i);
        json_t *c = norm_content(json_object_get(m, "content"), pp, assistant && tc, e);
        if (!c) return false;
        json_object_set_new(nm, "content", c);
        if (tc && !json_is_null(tc)) {
            snprintf(pp, sizeof(pp), "messages[%zu].tool_calls", i);
            if (!assistant) return BAD(pp, "'%s' is allowed on assistant messages only", pp);
            if (!json_is_array(tc)) return BADTYPE(pp, "an array");
            size_t j;
            json_t *call;
            json_t *ncalls = json_object_get(nm, "tool_calls");
            json_array_foreach(ncalls, j, call) {
                snprintf(pp, sizeof(pp), "messages[%zu].tool_calls[%zu].function", i, j);
                json_t *fn = json_object_get(call, "function");
                if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
                    return BAD(pp, "'%s' must be an object with a string 'name'", pp);
                /* arguments arrive as a JSON string; templates expect the object (as vLLM
                 * and llama.cpp hand them) */
                json_t *args = json_object_get(fn, "arguments");
                if (json_is_string(args)) {
                    json_t *obj = json_loadb(json_string_value(args), json_string_length(args),
                                             JSON_DECODE_ANY, NULL);
                    if (!obj) {
                        snprintf(pp, sizeof(pp), "messages[%zu].tool_calls[%zu].function.arguments",
                                 i, j);
                        return BAD(pp, "'%s' must be a JSON-encoded string", pp);
                    }
                    json_object_set_new(fn, "arguments", obj);
                }
            }
        }
        if (!strcmp(role, "tool") && json_object_get(m, "tool_call_id") &&
            !json_is_string(json_object_get(m, "tool_call_id"))) {
            snprintf(pp, sizeof(pp), "messages[%zu].tool_call_id", i);
            return BADTYPE(pp, "a string");
        }
    }
    return true;
}

static bool parse_tools(const json_t *root, kiln_oai_req *r, kiln_oai_error *e) {
    json_t *tools = json_object_get(root, "tools");
    json_t *choice = json_object_get(root, "tool_choice");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return BADTYPE("tools", "an array of tool objects");
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            char pp[160];
            snprintf(pp, sizeof(pp), "tools[%zu]", i);
            const char *type = json_string_value(json_object_get(t, "type"));
            json_t *fn = json_object_get(t, "function");
            if (!json_is_object(t) || !type || strcmp(type, "function") || !json_is_object(fn) ||
                !json_is_string(json_object_get(fn, "name")))
                return BAD(pp,
                           "'%s' must be {\"type\": \"function\", \"function\": {\"name\": ..., "
                           "\"parameters\": ...}}",
                           pp);
        }
    } else {
        tools = NULL;
    }
    bool use = tools && json_array_size(tools) > 0;
    if (choice && !json_is_null(choice)) {
        const char *s = json_string_value(choice);
        if (s && !strcmp(s, "none"))
            use = false;
        else if (s && !strcmp(s, "auto"))
            ;
        else if ((s && !strcmp(s, "required")) || json_is_object(choice))
            return kiln_oai_fail(e, 400, "invalid_request_error", "tool_choice",
                                 "unsupported_value",
                                 "'tool_choice' %s needs constrained decoding, which kiln does "
                                 "not have yet; use \"auto\" or \"none\"",
                                 s ? "\"required\"" : "naming a function");
        else
            return BAD("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                      "{\"type\": \"function\", ...}");
        if (!tools && s && strcmp(s, "none"))
            return BAD("tool_choice", "'tool_choice' is given without 'tools'");
    }
    if (use) {
        r->tools = json_incref(tools);
        r->has_tools = true;
    }
    return true;
}

static bool parse_prompt(const json_t *root, kiln_oai_req *r, int32_t n_vocab, kiln_oai_error *e) {
    json_t *p = json_object_get(root, "prompt");
    if (!p) return BAD("prompt", "'prompt' is required");
    /* a batch of one prompt is accepted as that prompt */
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        r->prompt = kiln_strndup(json_string_value(p), json_string_length(p));
        if (!r->prompt) return kiln_oai_fail(e, 500, "server_error", "", NULL, "out of memory");
        return true;
    }
    if (!json_is_array(p))
        return BADTYPE("prompt", "a string or an array of token ids (one prompt per request)");
    size_t n = json_array_size(p);
    if (n == 0) return BAD("prompt", "'prompt' must not be empty");
    r->prompt_ids = kiln_malloc(n * sizeof(int32_t));
    if (!r->prompt_ids) return kiln_oai_fail(e, 500, "server_error", "", NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(p, i);
        char pp[160];
        snprintf(pp, sizeof(pp), "prompt[%zu]", i);
        if (!json_is_integer(v))
            return BAD(pp,
                       "'%s' must be a token id (an integer); several prompts in one request "
                       "are not supported, send one request per prompt",
                       pp);
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= n_vocab)
            return BAD(pp, "'%s' is %lld; token ids are 0..%d", pp, (long long)id, n_vocab - 1);
        r->prompt_ids[i] = (int32_t)id;
    }
    r->n_prompt_ids = n;
    return true;
}

static bool parse_stop(const json_t *root, kiln_oai_req *r, kiln_oai_error *e) {
    json_t *s = json_object_get(root, "stop");
    if (!s || json_is_null(s)) return true;
    if (json_is_string(s)) {
        if (json_string_length(s) == 0) return BAD("stop", "'stop' must not be empty");
        if (!(r->stop[0] = kiln_strdup(json_string_value(s))))
            return kiln_oai_fail(e, 500, "server_error", "", NULL, "out of memory");
        r->n_stop = 1;
        return true;
    }
    if (!json_is_array(s)) return BADTYPE("stop", "a string or an array of up to 4 strings");
    if (json_array_size(s) > KILN_OAI_MAX_STOP)
        return BAD("stop", "'stop' has %zu strings; at most %d", json_array_size(s),
                   KILN_OAI_MAX_STOP);
    size_t i;
    json_t *v;
    json_array_foreach(s, i, v) {
        char pp[160];
        snprintf(pp, sizeof(pp), "stop[%zu]", i);
        if (!json_is_string(v) || json_string_length(v) == 0)
            return BAD(pp, "'%s' must be a non-empty string", pp);
        if (strlen(json_string_value(v)) != json_string_length(v))
            return BAD(pp, "'%s' must not contain NUL", pp);
        if (!(r->stop[r->n_stop] = kiln_strdup(json_string_value(v))))
            return kiln_oai_fail(e, 500, "server_error", "", NULL, "out of memory");
        r->n_stop++;
    }
    return true;
}

static bool parse_bias(const json_t *root, kiln_oai_req *r, int32_t n_vocab, kiln_oai_error *e) {
    json_t *b = json_object_get(root, "logit_bias");
    if (!b || json_is_null(b)) return true;
    if (!json_is_object(b)) return BADTYPE("logit_bias", "an object mapping token ids to biases");
    if (json_object_size(b) > KILN_OAI_MAX_BIAS)
        return BAD("logit_bias", "'logit_bias' has %zu entries; at most %d", json_object_size(b),
                   KILN_OAI_MAX_BIAS);
    const char *k;
    json_t *v;
    json_object_foreach(b, k, v) {
        char pp[160];
        snprintf(pp, sizeof(pp), "logit_bias.%.40s", k);
        char *end;
        long id = strtol(k, &end, 10);
        if (!*k || *end || id < 0 || id >= n_vocab)
            return BAD(pp, "'logit_bias' key '%.40s' is not a token id (0..%d)", k, n_vocab - 1);
        if (!json_is_number(v)) return BADTYPE(pp, "a number");
        double x = json_number_value(v);
        if (x < -100 || x > 100) return BAD(pp, "'%s' is %g; biases are -100..100", pp, x);
        r->bias_id[r->n_bias] = (int32_t)id;
        r->bias_val[r->n_bias] = (float)x;
        r->n_bias++;
    }
    return true;
}

bool kiln_oai_parse(kiln_oai_kind kind, const char *body, size_t len, int32_t n_vocab,
                    kiln_oai_req *r, kiln_oai_error *e) {
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    r->temperature = 1.0;
    r->top_p = 1.0;
    r->repetition_penalty = 1.0;
    r->n = 1;
    r->max_tokens = kind == KILN_OAI_COMPLETION ? 16 : -1;
    json_error_t je;
    r->root = json_loadb(body, len, 0, &je);
    if (!r->root)
        return kiln_oai_fail(e, 400, "invalid_request_error", "", "invalid_json",
                             "the body is not valid JSON: %s (line %d, column %d)", je.text,
                             je.line, je.column);
    const json_t *o = r->root;
    if (!json_is_object(o))
        return kiln_oai_fail(e, 400, "invalid_request_error", "", "invalid_json",
                             "the body must be a JSON object");
    json_t *model = json_object_get(o, "model");
    if (!model) return BAD("model", "'model' is required");
    if (!json_is_string(model)) return BADTYPE("model", "a string");
    snprintf(r->model, sizeof(r->model), "%s", json_string_value(model));
    if (kind == KILN_OAI_CHAT) {
        if (!parse_messages(o, r, e) || !parse_tools(o, r, e)) return false;
    } else if (!parse_prompt(o, r, n_vocab, e)) {
        return false;
    }
    json_t *rf = json_object_get(o, "response_format");
    if (rf && !json_is_null(rf)) {
        const char *t = json_string_value(json_object_get(rf, "type"));
        if (!json_is_object(rf) || !t)
            return BAD("response_format", "'response_format' must be "
                                          "{\"type\": ...}");
        if (strcmp(t, "text") != 0)
            return kiln_oai_fail(e, 400, "invalid_request_error", "response_format",
                                 "unsupported_value",
                                 "'response_format' type '%.32s' needs constrained decoding, "
                                 "which kiln does not have yet; only {\"type\": \"text\"} is "
                                 "accepted",
                                 t);
    }
    int64_t mt = r->max_tokens, n = 1, tk = 0, tl = 0, seed;
    const char *mt_key =
        json_object_get(o, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (!get_int(o, mt_key, 1, INT32_MAX, &mt, e)) return false;
    r->max_tokens = mt;
    if (!get_int(o, "n", 1, KILN_OAI_MAX_N, &n, e)) return false;
    r->n = (int32_t)n;
    if (!get_num(o, "temperature", 0, 2, &r->temperature, e) ||
        !get_num(o, "top_p", 0, 1, &r->top_p, e) || !get_num(o, "min_p", 0, 1, &r->min_p, e) ||
        !get_num(o, "presence_penalty", -2, 2, &r->presence_penalty, e) ||
        !get_num(o, "frequency_penalty", -2, 2, &r->frequency_penalty, e) ||
        !get_num(o, "repetition_penalty", 0.01, 10, &r->repetition_penalty, e))
        return false;
    if (json_object_get(o, "top_p") && !json_is_null(json_object_get(o, "top_p")) && r->top_p <= 0)
        return BAD("top_p", "'top_p' must be greater than 0");
    if (!get_int(o, "top_k", -1, INT32_MAX, &tk, e)) return false;
    r->top_k = tk < 0 ? 0 : (int32_t)tk;
    json_t *sv = json_object_get(o, "seed");
    if (sv && !json_is_null(sv)) {
        if (!get_int(o, "seed", INT64_MIN, INT64_MAX, &seed, e)) return false;
        r->has_seed = true;
        r->seed = (uint64_t)seed;
    }
    if (!parse_stop(o, r, e) || !parse_bias(o, r, n_vocab, e)) return false;
    /* logprobs: a boolean with top_logprobs (chat), an integer 0..5 (completions) */
    json_t *lp = json_object_get(o, "logprobs");
    if (kind == KILN_OAI_CHAT) {
        if (!get_bool(o, "logprobs", &r->logprobs, e)) return false;
        if (!get_int(o, "top_logprobs", 0, KILN_OAI_MAX_TOP_LOGPROBS, &tl, e)) return false;
        json_t *tlv = json_object_get(o, "top_logprobs");
        if (tlv && !json_is_null(tlv) && !r->logprobs)
            return BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
        r->top_logprobs = (int32_t)tl;
    } else if (lp && !json_is_null(lp)) {
        if (!get_int(o, "logprobs", 0, 5, &tl, e)) return false;
        r->logprobs = true;
        r->top_logprobs = (int32_t)tl;
    }
    if (!get_bool(o, "stream", &r->stream, e)) return false;
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return BADTYPE("stream_options", "an object");
        if (!r->stream)
            return BAD("stream_options", "'stream_options' is allowed only with 'stream': true");
        if (!get_bool(so, "include_usage", &r->include_usage, e)) {
            snprintf(e->param, sizeof(e->param), "stream_options.include_usage");
            return false;
        }
    }
    json_t *user = json_object_get(o, "user");
    if (user && !json_is_null(user)) {
        if (!json_is_string(user)) return BADTYPE("user", "a string");
        snprintf(r->user, sizeof(r->user), "%s", json_string_value(user));
    }
    if (!get_bool(o, "return_token_ids", &r->echo_ids, e)) return false;
    json_t *echo = json_object_get(o, "echo");
    if (kind == KILN_OAI_COMPLETION && json_is_true(echo))
        return kiln_oai_fail(e, 400, "invalid_request_error", "echo", "unsupported_value",
                             "'echo' is not supported");
    json_t *bo = json_object_get(o, "best_of");
    if (bo && !json_is_null(bo) && !(json_is_integer(bo) && json_integer_value(bo) == r->n))
        return kiln_oai_fail(e, 400, "invalid_request_error", "best_of", "unsupported_value",
                             "'best_of' other than n is not supported");
    json_t *suf = json_object_get(o, "suffix");
    if (suf && !json_is_null(suf))
        return kiln_oai_fail(e, 400, "invalid_request_error", "suffix", "unsupported_value",
                             "'suffix' is not supported");
    return true;
}

void kiln_oai_req_free(kiln_oai_req *r) {
    json_decref(r->root);
    json_decref(r->messages);
    json_decref(r->tools);
    kiln_free(r->prompt);
    kiln_free(r->prompt_ids);
    for (int i = 0; i < r->n_stop; i++) kiln_free(r->stop[i]);
    memset(r, 0, sizeof(*r));
}

/* ---- tool calls ---------------------------------------------------------------------- */

static void append(char **buf, size_t *len, const char *s, size_t n) {
    char *q = kiln_realloc(*buf, *len + n + 1);
    if (!q) return;
    memcpy(q + *len, s, n);
    *len += n;
    q[*len] = 0;
    *buf = q;
}

static char *trimmed(const char *s, size_t n) {
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    return n ? kiln_strndup(s, n) : NULL;
}

bool kiln_oai_parse_tool_calls(const char *text, size_t len, uint64_t id_seed, json_t **calls,
                               char **content) {
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    const size_t no = sizeof(open) - 1, nc = sizeof(close) - 1;
    json_t *arr = json_array();
    char *rest = NULL;
    size_t rest_len = 0, pos = 0;
    if (!arr) return false;
    while (pos < len) {
        const char *a = memmem(text + pos, len - pos, open, no);
        if (!a) {
            append(&rest, &rest_len, text + pos, len - pos);
            break;
        }
        append(&rest, &rest_len, text + pos, (size_t)(a - (text + pos)));
        const char *body = a + no;
        const char *b = memmem(body, (size_t)(text + len - body), close, nc);
        size_t blen = b ? (size_t)(b - body) : (size_t)(text + len - body);
        json_t *j = json_loadb(body, blen, JSON_DECODE_ANY, NULL);
        json_t *name = json_object_get(j, "name");
        json_t *args = json_object_get(j, "arguments");
        if (!args) args = json_object_get(j, "parameters");
        if (!json_is_object(j) || !json_is_string(name) || !(json_is_object(args) || !args)) {
            json_decref(j);
            goto fail;
        }
        char *astr = args ? kiln_adopt(json_dumps(args, JSON_COMPACT)) : kiln_strdup("{}");
        char id[32];
        snprintf(id, sizeof(id), "call_%016llx%02zx", (unsigned long long)id_seed,
                 json_array_size(arr));
        json_t *call = json_pack("{s:s, s:s, s:{s:O, s:s}}", "id", id, "type", "function",
                                 "function", "name", name, "arguments", astr ? astr : "{}");
        kiln_free(astr);
        json_decref(j);
        if (!call || json_array_append_new(arr, call)) goto fail;
        pos = b ? (size_t)(b - text) + nc : len;
    }
    if (json_array_size(arr) == 0) goto fail;
    *calls = arr;
    *content = rest ? trimmed(rest, rest_len) : NULL;
    kiln_free(rest);
    return true;
fail:
    json_decref(arr);
    kiln_free(rest);
    return false;
}
