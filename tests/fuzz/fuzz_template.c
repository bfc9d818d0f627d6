/* fuzz_template.c — libFuzzer target for the chat-template engine: the input is a
 * template; it is parsed and, when it parses, rendered with a fixed conversation (system,
 * user, assistant with a tool call, tool result; tools defined; generation prompt on),
 * under small memory and step limits. Any crash, sanitizer report or leak is a bug; parse
 * and render errors are expected. */
#include "tok/jinja.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

static const char MESSAGES[] =
    "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
    "{\"role\":\"user\",\"content\":\"Weather in Paris? \\u00e9\\u65e5 \\ud83c\\udf89\"},"
    "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"think\","
    "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
    "\"arguments\":{\"city\":\"Paris\",\"n\":1.5,\"ok\":true,\"x\":null}}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"21 C\"}]";
static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather.\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
    "\"required\":[\"city\"]}}}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *messages, *tools;
    if (!messages) {
        messages = json_loads(MESSAGES, 0, NULL);
        tools = json_loads(TOOLS, 0, NULL);
        if (!messages || !tools) abort(); /* the fixed context is a constant: a bug here */
    }
    if (size > 64 * 1024) return 0;
    jinja_template *t = NULL;
    kiln_err err;
    kiln_err_clear(&err);
    if (jinja_parse((const char *)data, size, &t, &err) != KILN_OK) return 0;
    jinja_vars v = {0};
    jinja_vars_json(&v, "messages", messages);
    jinja_vars_json(&v, "tools", tools);
    jinja_vars_bool(&v, "add_generation_prompt", true);
    jinja_vars_str(&v, "bos_token", "<s>");
    jinja_vars_str(&v, "eos_token", "</s>");
    v.now_iso = "2026-01-15T10:30:00";
    /* 256 KiB / 50k steps: an input that hits 16 MiB / 200k rendered for 0.5 s (ASan) and
     * held a long run at ~290 exec/s (session 7); at 1 MiB, 6% of a long run's corpus
     * (inputs that build big strings: loops over the repr of `tools` through |escape,
     * ...) still took 74% of its replay time, up to 1.5 s an input (session 10). The
     * real templates render the fixed conversation in a few KiB; the limits themselves
     * are unit-tested. */
    v.max_bytes = 256u << 10;
    v.max_steps = 50000;
    char *out = NULL;
    size_t n = 0;
    if (jinja_render(t, &v, &out, &n, &err) == KILN_OK) free(out);
    jinja_free(t);
    return 0;
}
