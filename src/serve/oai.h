/*
 * oai.h — the OpenAI request and response shapes of `kiln serve`: parsing and
 * validating /v1/chat/completions and /v1/completions bodies (jansson), OpenAI-shaped
 * error bodies that name the offending field, and the tool-call parser for model
 * output (Qwen/Hermes `<tool_call>{json}</tool_call>`).
 *
 * Ownership: kiln_oai_parse fills a kiln_oai_req that owns everything it points to;
 * release it with kiln_oai_req_free. Nothing here touches the file system or aborts on
 * client data; every error is a kiln_oai_error (HTTP status, type, param, message).
 * Thread-safe: no shared state.
 */
#ifndef KILN_SERVE_OAI_H
#define KILN_SERVE_OAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KILN_OAI_MAX_STOP         4
#define KILN_OAI_MAX_N            16
#define KILN_OAI_MAX_TOP_LOGPROBS 20
#define KILN_OAI_MAX_BIAS         1024

typedef enum kiln_oai_kind { KILN_OAI_CHAT = 0, KILN_OAI_COMPLETION = 1 } kiln_oai_kind;

/* An error answer: HTTP status, OpenAI error type ("invalid_request_error", ...), the
 * request field it is about (or "" for none), an optional code and the message. */
typedef struct kiln_oai_error {
    int http;
    const char *type;
    char param[160];
    const char *code; /* NULL: null in the body */
    char message[512];
} kiln_oai_error;

/* Sets e and returns false (for `return kiln_oai_fail(...)` in validators). */
bool kiln_oai_fail(kiln_oai_error *e, int http, const char *type, const char *param,
                   const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error": {"message", "type", "param", "code"}} as a malloc'ed string. */
char *kiln_oai_error_body(const kiln_oai_error *e);

typedef struct kiln_oai_req {
    kiln_oai_kind kind;
    json_t *root;     /* the parsed body (owned) */
    char model[256];  /* the model the client named */
    json_t *messages; /* chat: normalized messages (content parts joined; tool-call
                         arguments parsed to objects for the template) (owned) */
    json_t *tools;    /* chat: tools for the template, NULL when absent or "none" */
    bool has_tools;   /* tools given and tool_choice is not "none" */
    char *prompt;     /* completions: prompt text (owned), or NULL with prompt_ids */
    int32_t *prompt_ids;
    size_t n_prompt_ids;
    int64_t max_tokens; /* -1: until the context ends */
    double temperature, top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty;
    int32_t top_k;
    int32_t n;
    char *stop[KILN_OAI_MAX_STOP];
    int n_stop;
    bool has_seed;
    uint64_t seed;
    int32_t bias_id[KILN_OAI_MAX_BIAS];
    float bias_val[KILN_OAI_MAX_BIAS];
    int n_bias;
    bool logprobs;
    int32_t top_logprobs;
    bool stream, include_usage;
    bool echo_ids; /* extension "return_token_ids": ids of prompt and output in the body */
    char user[256];
} kiln_oai_req;

/* Parses and validates a request body. n_vocab bounds token ids (prompt arrays,
 * logit_bias keys). Returns false with e set (400 for malformed JSON or fields, naming
 * the field). */
bool kiln_oai_parse(kiln_oai_kind kind, const char *body, size_t len, int32_t n_vocab,
                    kiln_oai_req *req, kiln_oai_error *e);
void kiln_oai_req_free(kiln_oai_req *req);

/* Tool calls in model output. Finds `<tool_call>JSON</tool_call>` blocks (a final block
 * may lack its closing tag at the end of the text); each JSON must be an object with a
 * string "name" and an "arguments" (or "parameters") object. On success *calls is a
 * JSON array of OpenAI tool_calls ({id, type:"function", function:{name, arguments
 * (a JSON string)}}) and *content the remaining text (malloc'ed, trimmed; NULL when
 * empty). Returns false (outputs untouched) when the text has no well-formed call: the
 * caller then answers with the text as content. id_seed makes the call ids unique. */
bool kiln_oai_parse_tool_calls(const char *text, size_t len, uint64_t id_seed, json_t **calls,
                               char **content);

/* Writes s[0..n) as a JSON string literal, quotes included, into dst and returns its
 * length: byte for byte what jansson's json_dumps writes for json_stringn(s, n) without
 * flags (escapes \" \\ \b \f \n \r \t, other bytes < 0x20 as \u00XX, the rest as is).
 * dst must hold 6 * n + 2 bytes. Returns 0 (dst undefined) when s is not valid UTF-8
 * (overlong forms, surrogates and code points past U+10FFFF included), which
 * json_stringn refuses. For the streamed chunks, without building JSON objects. */
size_t kiln_oai_json_quote(const char *s, size_t n, char *dst);

#endif /* KILN_SERVE_OAI_H */
