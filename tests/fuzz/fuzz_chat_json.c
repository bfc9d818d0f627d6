/* fuzz_chat_json.c — libFuzzer target for the messages/tools JSON a client sends into a
 * chat template: the input is JSON text ({"messages": [...], "tools": [...]} or a bare
 * messages array), rendered with real templates (qwen3 and llama 3.1 from the template
 * corpus, tool calls included, found through $KILN_SOURCE_DIR or the working directory)
 * and a built-in ChatML one, under small memory and step limits. Render errors are
 * expected; crashes, leaks, hangs and sanitizer reports are bugs. */
#include "tok/jinja.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char CHATML[] =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% if m.tool_calls %}{% for t in m.tool_calls %}<tool_call>{{ t.function.name }}"
    "{{ t.function.arguments | tojson }}</tool_call>{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if tools %}{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

static jinja_template *g_t[3];
static int g_n;

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 20);
    *len = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    return buf;
}

static void add(const char *text, size_t len) {
    kiln_err err;
    if (jinja_parse(text, len, &g_t[g_n], &err) == KILN_OK) g_n++;
}

static void init(void) {
    static const char *names[] = {"qwen3.jinja", "llama31.jinja"};
    const char *src = getenv("KILN_SOURCE_DIR");
    for (int i = 0; i < 2; i++) {
        char p[1024];
        size_t len = 0;
        char *t = NULL;
        snprintf(p, sizeof p, "%s/tests/fuzz/corpus/fuzz_template/%s", src ? src : ".", names[i]);
        if (!(t = slurp(p, &len))) {
            snprintf(p, sizeof p, "../tests/fuzz/corpus/fuzz_template/%s", names[i]);
            t = slurp(p, &len);
        }
        if (t) add(t, len);
        free(t);
    }
    add(CHATML, sizeof CHATML - 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_n) init();
    if (size > 256 * 1024) return 0;
    json_error_t je;
    json_t *root = json_loadb((const char *)data, size, JSON_DECODE_ANY, &je);
    if (!root) return 0;
    json_t *messages = root, *tools = NULL;
    if (json_is_object(root)) {
        messages = json_object_get(root, "messages");
        tools = json_object_get(root, "tools");
    }
    /* messages reach a template as an array only (kiln_chat_template_render, the one
     * caller of jinja_render with messages, rejects anything else). Anything else still
     * renders (the templates' paths over a string, a number, ...), under 1000 steps and
     * 64 KiB: a bare string was iterated character by character by all three templates,
     * each character an undefined-attribute lookup and a `messages|length` (O(n) on a
     * string), 0.3-1 s per input under ASan, most of the time of a long run. */
    const bool array = json_is_array(messages);
    for (int i = 0; i < g_n && messages; i++) {
        jinja_vars v = {0};
        jinja_vars_json(&v, "messages", messages);
        if (tools) jinja_vars_json(&v, "tools", tools);
        jinja_vars_bool(&v, "add_generation_prompt", true);
        jinja_vars_str(&v, "bos_token", "<s>");
        jinja_vars_str(&v, "eos_token", "</s>");
        v.now_iso = "2026-01-15T10:30:00";
        v.max_bytes = array ? 4u << 20 : 64u << 10;
        v.max_steps = array ? 100000 : 1000;
        char *out = NULL;
        size_t n = 0;
        kiln_err err;
        if (jinja_render(g_t[i], &v, &out, &n, &err) == KILN_OK) free(out);
    }
    json_decref(root);
    return 0;
}
