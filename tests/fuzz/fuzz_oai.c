/* fuzz_oai.c — libFuzzer target for OpenAI request bodies (serve/oai.c): the input is
 * parsed and validated as a /v1/chat/completions body and as a /v1/completions body
 * (n_vocab 300 bounds token ids and logit_bias keys); an accepted request must satisfy
 * the limits the server relies on (n >= 1, stop strings within KILN_OAI_MAX_STOP, token
 * ids in range); a rejected one must carry an HTTP status and a message, and its error
 * body must be valid JSON. The same bytes then go through the model-output tool-call
 * parser (kiln_oai_parse_tool_calls). Crashes, leaks, hangs and sanitizer reports are
 * bugs. HTTP framing, headers and paths are libmicrohttpd's (not fuzzed here). */
#include "serve/oai.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 20) return 0;
    for (int k = 0; k < 2; k++) {
        kiln_oai_req req;
        kiln_oai_error e;
        memset(&req, 0, sizeof req);
        memset(&e, 0, sizeof e);
        if (kiln_oai_parse(k ? KILN_OAI_COMPLETION : KILN_OAI_CHAT, (const char *)data, size, 300,
                           &req, &e)) {
            if (req.n < 1 || req.n_stop < 0 || req.n_stop > KILN_OAI_MAX_STOP) __builtin_trap();
            if (req.n_bias < 0 || req.n_bias > KILN_OAI_MAX_BIAS) __builtin_trap();
            for (int i = 0; i < req.n_bias; i++)
                if (req.bias_id[i] < 0 || req.bias_id[i] >= 300) __builtin_trap();
            for (size_t i = 0; i < req.n_prompt_ids; i++)
                if (req.prompt_ids[i] < 0 || req.prompt_ids[i] >= 300) __builtin_trap();
            for (int i = 0; i < req.n_stop; i++)
                if (!req.stop[i]) __builtin_trap();
        } else {
            if (e.http < 400 || e.http > 599 || !e.message[0]) __builtin_trap();
            char *body = kiln_oai_error_body(&e);
            if (body) {
                json_t *j = json_loads(body, 0, NULL);
                if (!j) __builtin_trap(); /* the error body must be JSON */
                json_decref(j);
                free(body);
            }
        }
        kiln_oai_req_free(&req);
    }
    json_t *calls = NULL;
    char *content = NULL;
    if (kiln_oai_parse_tool_calls((const char *)data, size, 42, &calls, &content)) {
        if (!json_is_array(calls)) __builtin_trap();
        json_decref(calls);
        free(content);
    }
    return 0;
}
