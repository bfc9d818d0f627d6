/* test_serve_oai.c — the server's request validation (every field, errors naming it),
 * error bodies, tool-call parsing, tenants from kiln.yaml, constant-time key lookup,
 * quotas and the Prometheus text; the streamed chunks' string quoting == jansson's. */
#include "testutil.h"

#include "serve/oai.h"
#include "serve/tenants.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool parse(kiln_oai_kind k, const char *body, kiln_oai_req *r, kiln_oai_error *e) {
    return kiln_oai_parse(k, body, strlen(body), 1000, r, e);
}

/* body must fail with HTTP 400 naming param */
static void bad(kiln_oai_kind k, const char *body, const char *param) {
    kiln_oai_req r;
    kiln_oai_error e;
    bool ok = parse(k, body, &r, &e);
    if (ok || e.http != 400 || strcmp(e.param, param) != 0) {
        fprintf(stderr, "body %s: ok=%d http=%d param='%s' (want '%s') msg=%s\n", body, ok,
                ok ? 0 : e.http, ok ? "" : e.param, param, ok ? "" : e.message);
        fail();
    }
    char *b = kiln_oai_error_body(&e);
    json_t *j = json_loads(b, 0, NULL);
    assert_non_null(j);
    json_t *err = json_object_get(j, "error");
    assert_non_null(json_string_value(json_object_get(err, "message")));
    assert_non_null(json_string_value(json_object_get(err, "type")));
    if (param[0])
        assert_string_equal(json_string_value(json_object_get(err, "param")), param);
    else
        assert_true(json_is_null(json_object_get(err, "param")));
    json_decref(j);
    free(b);
    kiln_oai_req_free(&r);
}

static void test_chat_ok(void **state) {
    (void)state;
    kiln_oai_req r;
    kiln_oai_error e;
    const char *b =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
        "\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
        "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}],"
        "\"max_tokens\":7,\"temperature\":0,\"top_p\":0.5,\"n\":3,\"stop\":[\"x\",\"yy\"],"
        "\"seed\":-5,\"presence_penalty\":1,\"frequency_penalty\":-1,\"logit_bias\":{\"5\":-100},"
        "\"logprobs\":true,\"top_logprobs\":3,\"stream\":true,\"stream_options\":{"
        "\"include_usage\":true},\"user\":\"u\",\"top_k\":4,\"min_p\":0.1,"
        "\"repetition_penalty\":1.1,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
        "\"f\"}}],\"tool_choice\":\"auto\",\"response_format\":{\"type\":\"text\"}}";
    assert_true(parse(KILN_OAI_CHAT, b, &r, &e));
    assert_int_equal(r.max_tokens, 7);
    assert_int_equal(r.n, 3);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "yy");
    assert_true(r.has_seed);
    assert_int_equal((int64_t)r.seed, -5);
    assert_int_equal(r.n_bias, 1);
    assert_int_equal(r.bias_id[0], 5);
    assert_true(r.logprobs && r.top_logprobs == 3 && r.stream && r.include_usage);
    assert_true(r.has_tools);
    assert_int_equal(r.top_k, 4);
    /* content parts joined; tool-call arguments parsed into an object for the template */
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(r.messages, 1), "content")), "ab");
    json_t *args = json_object_get(
        json_object_get(
            json_array_get(json_object_get(json_array_get(r.messages, 2), "tool_calls"), 0),
            "function"),
        "arguments");
    assert_true(json_is_object(args));
    kiln_oai_req_free(&r);
    /* defaults */
    assert_true(parse(KILN_OAI_CHAT,
                      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r,
                      &e));
    assert_int_equal(r.max_tokens, -1);
    assert_true(r.temperature == 1.0 && r.top_p == 1.0 && r.n == 1 && !r.stream);
    kiln_oai_req_free(&r);
    /* max_completion_tokens wins */
    assert_true(parse(KILN_OAI_CHAT,
                      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                      "\"max_completion_tokens\":9}",
                      &r, &e));
    assert_int_equal(r.max_tokens, 9);
    kiln_oai_req_free(&r);
}

#define M "\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static void test_chat_errors(void **state) {
    (void)state;
    bad(KILN_OAI_CHAT, "{", "");
    bad(KILN_OAI_CHAT, "[1]", "");
    bad(KILN_OAI_CHAT, "{\"messages\":[]}", "model");
    bad(KILN_OAI_CHAT, "{\"model\":3}", "model");
    bad(KILN_OAI_CHAT, "{\"model\":\"m\"}", "messages");
    bad(KILN_OAI_CHAT, "{\"model\":\"m\",\"messages\":[]}", "messages");
    bad(KILN_OAI_CHAT, "{\"model\":\"m\",\"messages\":{}}", "messages");
    bad(KILN_OAI_CHAT, "{\"model\":\"m\",\"messages\":[1]}", "messages[0]");
    bad(KILN_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}", "messages[0].role");
    bad(KILN_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"king\",\"content\":\"x\"}]}",
        "messages[0].role");
    bad(KILN_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}",
        "messages[0].content");
    bad(KILN_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}",
        "messages[0].content");
    bad(KILN_OAI_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]"
        "}",
        "messages[0].content[0]");
    bad(KILN_OAI_CHAT, "{" M ",\"max_tokens\":0}", "max_tokens");
    bad(KILN_OAI_CHAT, "{" M ",\"max_tokens\":\"5\"}", "max_tokens");
    bad(KILN_OAI_CHAT, "{" M ",\"max_completion_tokens\":-1}", "max_completion_tokens");
    bad(KILN_OAI_CHAT, "{" M ",\"temperature\":3}", "temperature");
    bad(KILN_OAI_CHAT, "{" M ",\"temperature\":\"hot\"}", "temperature");
    bad(KILN_OAI_CHAT, "{" M ",\"top_p\":0}", "top_p");
    bad(KILN_OAI_CHAT, "{" M ",\"top_p\":1.5}", "top_p");
    bad(KILN_OAI_CHAT, "{" M ",\"n\":0}", "n");
    bad(KILN_OAI_CHAT, "{" M ",\"n\":1.5}", "n");
    bad(KILN_OAI_CHAT, "{" M ",\"n\":17}", "n");
    bad(KILN_OAI_CHAT, "{" M ",\"stop\":5}", "stop");
    bad(KILN_OAI_CHAT, "{" M ",\"stop\":\"\"}", "stop");
    bad(KILN_OAI_CHAT, "{" M ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop");
    bad(KILN_OAI_CHAT, "{" M ",\"stop\":[\"a\",3]}", "stop[1]");
    bad(KILN_OAI_CHAT, "{" M ",\"seed\":\"x\"}", "seed");
    bad(KILN_OAI_CHAT, "{" M ",\"presence_penalty\":3}", "presence_penalty");
    bad(KILN_OAI_CHAT, "{" M ",\"frequency_penalty\":-2.5}", "frequency_penalty");
    bad(KILN_OAI_CHAT, "{" M ",\"logit_bias\":[]}", "logit_bias");
    bad(KILN_OAI_CHAT, "{" M ",\"logit_bias\":{\"abc\":1}}", "logit_bias.abc");
    bad(KILN_OAI_CHAT, "{" M ",\"logit_bias\":{\"1000\":1}}", "logit_bias.1000");
    bad(KILN_OAI_CHAT, "{" M ",\"logit_bias\":{\"3\":101}}", "logit_bias.3");
    bad(KILN_OAI_CHAT, "{" M ",\"logprobs\":1}", "logprobs");
    bad(KILN_OAI_CHAT, "{" M ",\"top_logprobs\":2}", "top_logprobs");
    bad(KILN_OAI_CHAT, "{" M ",\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs");
    bad(KILN_OAI_CHAT, "{" M ",\"stream\":\"yes\"}", "stream");
    bad(KILN_OAI_CHAT, "{" M ",\"stream_options\":{\"include_usage\":true}}", "stream_options");
    bad(KILN_OAI_CHAT, "{" M ",\"stream\":true,\"stream_options\":{\"include_usage\":1}}",
        "stream_options.include_usage");
    bad(KILN_OAI_CHAT, "{" M ",\"user\":5}", "user");
    bad(KILN_OAI_CHAT, "{" M ",\"top_k\":-2}", "top_k");
    bad(KILN_OAI_CHAT, "{" M ",\"min_p\":2}", "min_p");
    bad(KILN_OAI_CHAT, "{" M ",\"repetition_penalty\":0}", "repetition_penalty");
    bad(KILN_OAI_CHAT, "{" M ",\"response_format\":{\"type\":\"json_object\"}}", "response_format");
    bad(KILN_OAI_CHAT, "{" M ",\"response_format\":{\"type\":\"json_schema\"}}", "response_format");
    bad(KILN_OAI_CHAT, "{" M ",\"tools\":{}}", "tools");
    bad(KILN_OAI_CHAT, "{" M ",\"tools\":[{\"type\":\"function\"}]}", "tools[0]");
    bad(KILN_OAI_CHAT,
        "{" M ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
        "\"tool_choice\":\"required\"}",
        "tool_choice");
    bad(KILN_OAI_CHAT, "{" M ",\"tool_choice\":\"sometimes\"}", "tool_choice");
    bad(KILN_OAI_CHAT, "{" M ",\"tool_choice\":\"auto\"}", "tool_choice");
}

static void test_completion(void **state) {
    (void)state;
    kiln_oai_req r;
    kiln_oai_error e;
    assert_true(parse(KILN_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"Once\"}", &r, &e));
    assert_string_equal(r.prompt, "Once");
    assert_int_equal(r.max_tokens, 16);
    kiln_oai_req_free(&r);
    assert_true(parse(KILN_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,2,999],\"logprobs\":2}",
                      &r, &e));
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 999);
    assert_true(r.logprobs && r.top_logprobs == 2);
    kiln_oai_req_free(&r);
    assert_true(parse(KILN_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[\"one\"]}", &r, &e));
    assert_string_equal(r.prompt, "one");
    kiln_oai_req_free(&r);
    bad(KILN_OAI_COMPLETION, "{\"model\":\"m\"}", "prompt");
    bad(KILN_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":5}", "prompt");
    bad(KILN_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[]}", "prompt");
    bad(KILN_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,1000]}", "prompt[1]");
    bad(KILN_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,-1]}", "prompt[1]");
    bad(KILN_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", "prompt[0]");
    bad(KILN_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"a\",\"logprobs\":6}", "logprobs");
    bad(KILN_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"a\",\"logprobs\":true}", "logprobs");
    bad(KILN_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"a\",\"echo\":true}", "echo");
    bad(KILN_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"a\",\"best_of\":3}", "best_of");
    bad(KILN_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"a\",\"suffix\":\"z\"}", "suffix");
    /* deep nesting and huge numbers are errors, not crashes */
    char deep[5000];
    size_t n = 0;
    n += (size_t)snprintf(deep, sizeof(deep), "{\"model\":\"m\",\"prompt\":");
    for (int i = 0; i < 2100; i++) deep[n++] = '[';
    deep[n] = 0;
    assert_false(parse(KILN_OAI_COMPLETION, deep, &r, &e));
    assert_int_equal(e.http, 400);
    kiln_oai_req_free(&r);
    bad(KILN_OAI_COMPLETION,
        "{\"model\":\"m\",\"prompt\":\"a\",\"max_tokens\":99999999999999999999}", "");
}

static void test_tool_calls(void **state) {
    (void)state;
    json_t *calls;
    char *content;
    const char *t =
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\":\"now\"}</tool_call>";
    assert_true(kiln_oai_parse_tool_calls(t, strlen(t), 7, &calls, &content));
    assert_int_equal(json_array_size(calls), 2);
    json_t *f = json_object_get(json_array_get(calls, 0), "function");
    assert_string_equal(json_string_value(json_object_get(f, "name")), "get_weather");
    assert_string_equal(json_string_value(json_object_get(f, "arguments")), "{\"city\":\"Paris\"}");
    assert_string_equal(json_string_value(json_object_get(json_array_get(calls, 0), "type")),
                        "function");
    assert_string_not_equal(json_string_value(json_object_get(json_array_get(calls, 0), "id")),
                            json_string_value(json_object_get(json_array_get(calls, 1), "id")));
    assert_string_equal(content, "Let me check.");
    free(content);
    json_decref(calls);
    /* unterminated final block at the end of the text */
    const char *u = "<tool_call>{\"name\":\"f\",\"arguments\":{}}";
    assert_true(kiln_oai_parse_tool_calls(u, strlen(u), 1, &calls, &content));
    assert_null(content);
    json_decref(calls);
    /* not calls: plain text, broken JSON, missing name */
    const char *no[] = {"just text", "<tool_call>{\"name\":</tool_call>",
                        "<tool_call>{\"arguments\":{}}</tool_call>", "<tool_call>[1]</tool_call>"};
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        assert_false(kiln_oai_parse_tool_calls(no[i], strlen(no[i]), 1, &calls, &content));
}

static const char *write_yaml(const char *text) {
    return kt_write_temp(text, strlen(text), ".yaml");
}

static void test_tenants(void **state) {
    (void)state;
    kiln_srv_tenants ts;
    kiln_err err;
    /* open server */
    assert_int_equal(kiln_srv_tenants_load(NULL, &ts, &err), KILN_OK);
    assert_true(ts.open);
    assert_string_equal(kiln_srv_auth(&ts, NULL)->id, "default");
    kiln_srv_tenants_free(&ts);
    const char *p = write_yaml("policy:\n  deterministic: false\ntenants:\n"
                               "  - id: alice\n    keys: [sk-a1, sk-a2]\n    qos: interactive\n"
                               "    max_concurrent: 1\n"
                               "  - id: bob\n    key: sk-b\n    tokens_per_minute: 100\n");
    assert_int_equal(kiln_srv_tenants_load(p, &ts, &err), KILN_OK);
    assert_false(ts.open);
    assert_int_equal(ts.n, 2);
    assert_null(kiln_srv_auth(&ts, NULL));
    assert_null(kiln_srv_auth(&ts, "Bearer sk-a"));
    assert_null(kiln_srv_auth(&ts, "Bearer sk-a1x"));
    assert_null(kiln_srv_auth(&ts, "Basic sk-a1"));
    assert_string_equal(kiln_srv_auth(&ts, "Bearer sk-a2")->id, "alice");
    kiln_srv_tenant *bob = kiln_srv_auth(&ts, "Bearer sk-b");
    assert_string_equal(bob->id, "bob");
    kiln_srv_tenant *alice = &ts.t[0];
    const char *why;
    assert_int_equal(kiln_srv_admit(&ts, alice, 10, &why), 0);
    assert_int_equal(kiln_srv_admit(&ts, alice, 10, &why), 1);
    assert_string_equal(why, "max_concurrent");
    kiln_srv_release(&ts, alice);
    assert_int_equal(kiln_srv_admit(&ts, alice, 10, &why), 0);
    assert_int_equal(kiln_srv_admit(&ts, bob, 60, &why), 0);
    assert_true(kiln_srv_admit(&ts, bob, 60, &why) > 0);
    assert_string_equal(why, "tokens_per_minute");
    kiln_srv_count_status(&ts, bob, 200);
    kiln_srv_count_status(&ts, bob, 429);
    kiln_srv_count_tokens(&ts, bob, 60, 5);
    kiln_srv_observe(&ts, bob, KILN_HIST_TTFT, 0.03);
    char *m = kiln_srv_metrics_text(&ts, "kiln_extra 1\n");
    assert_non_null(strstr(m, "kiln_http_requests_total{status=\"429\"} 1"));
    assert_non_null(strstr(m, "kiln_tenant_prompt_tokens_total{tenant=\"bob\"} 60"));
    assert_non_null(
        strstr(m, "kiln_time_to_first_token_seconds_bucket{tenant=\"bob\",le=\"0.05\"} 1"));
    assert_non_null(strstr(m, "kiln_time_to_first_token_seconds_count{tenant=\"bob\"} 1"));
    assert_non_null(strstr(m, "kiln_extra 1"));
    assert_null(strstr(m, "sk-"));
    free(m);
    char *u = kiln_srv_usage_json(&ts, bob);
    json_t *j = json_loads(u, 0, NULL);
    assert_int_equal(json_integer_value(json_object_get(j, "completion_tokens")), 5);
    assert_int_equal(json_integer_value(json_object_get(j, "rejected_quota")), 1);
    json_decref(j);
    free(u);
    kiln_srv_tenants_free(&ts);
    /* issue #12's shape (docs/SCHED.md): api_keys and the scheduler's quotas, kept for
     * kiln_sched_add_tenant (loop.c) */
    p = write_yaml(
        "tenants:\n  - id: alice\n    api_keys: [sk-alice-1]\n    qos: interactive\n"
        "    max_slots: 4\n    max_kv_blocks: 4096\n    decode_tokens_per_s: 1000\n"
        "    prefill_tokens_per_s: 100000.5\n    max_context: 8192\n    max_queued: 100\n"
        "    isolation_group: team-a\n  - id: bob\n    api_keys: [sk-bob]\n"
        "    qos: batch\n");
    kiln_err_clear(&err);
    assert_int_equal(kiln_srv_tenants_load(p, &ts, &err), KILN_OK);
    assert_string_equal(kiln_srv_auth(&ts, "Bearer sk-alice-1")->id, "alice");
    assert_string_equal(kiln_srv_auth(&ts, "Bearer sk-bob")->id, "bob");
    assert_int_equal(ts.t[0].max_slots, 4);
    assert_int_equal(ts.t[0].max_kv_blocks, 4096);
    assert_int_equal(ts.t[0].max_context, 8192);
    assert_int_equal(ts.t[0].max_queued, 100);
    assert_true(ts.t[0].decode_tokens_per_s == 1000.0);
    assert_true(ts.t[0].prefill_tokens_per_s == 100000.5);
    assert_string_equal(ts.t[0].isolation_group, "team-a");
    assert_int_equal(ts.t[1].max_slots, 0);
    assert_string_equal(ts.t[1].isolation_group, "");
    kiln_srv_tenants_free(&ts);
    /* errors name the file and line */
    /* each rejected for its own reason (the message's fragment) */
    static const struct {
        const char *yaml, *why;
    } bads[] = {
        {"tenants:\n  - id: x\n", "has no keys"},
        {"tenants:\n  - keys: [k]\n", "has no 'id'"},
        {"tenants:\n  - id: x\n    key: k\n    qos: fast\n", "'qos'"},
        {"tenants:\n  - id: x\n    key: k\n    colour: red\n", "unknown key 'colour'"},
        {"tenants:\n  - id: x\n    key: k\n  - id: x\n    key: j\n", "duplicate id"},
        {"tenants: 5\n", "must be a list"},
        {"tenants:\n  - id: x\n    key: k\n    max_concurrent: -1\n", "max_concurrent"},
        {"tenants:\n  - id: x\n    key: k\n    max_slots: 4294967296\n", "max_slots"},
        {"tenants:\n  - id: x\n    key: k\n    decode_tokens_per_s: nan\n", "decode_tokens"},
        {"tenants:\n  - id: x\n    key: k\n    prefill_tokens_per_s: -1\n", "prefill_tokens"},
        {"tenants:\n  - id: x\n    api_keys: k\n    isolation_group: [a]\n", "isolation_group"},
        {"tenants: [\n", ":"},
        /* keys a client cannot send: empty (would match `Bearer ` with no key:
         * fuzz_serve_tenants), spaces, control bytes */
        {"tenants:\n  - id: x\n    key:\n", "visible ASCII"},
        {"tenants:\n  - id: x\n    key: ''\n", "visible ASCII"},
        {"tenants:\n  - id: x\n    keys: [ok, '']\n", "visible ASCII"},
        {"tenants:\n  - id: x\n    api_keys: ['sk-secret x']\n", "visible ASCII"},
        {"tenants:\n  - id: x\n    key: \"sk-secret\\ty\"\n", "visible ASCII"},
        {"tenants:\n  - id: x\n    keys: [[a]]\n", "keys must be strings"},
        /* ids: path segments and Prometheus labels */
        {"tenants:\n  - id: \"a\\nb\"\n    key: k\n", "'id' must be"},
        {"tenants:\n  - id: 'a\\b'\n    key: k\n", "'id' must be"},
        {"tenants:\n  - id: 'a b'\n    key: k\n", "'id' must be"},
        /* a key for two tenants (or twice for one): who would it be? */
        {"tenants:\n  - id: a\n    key: sk-secret-1\n  - id: b\n    keys: [k2, sk-secret-1]\n",
         "tenant 'a' is configured again for tenant 'b'"},
        {"tenants:\n  - id: a\n    keys: [sk-secret-2, sk-secret-2]\n", "configured again"}};
    for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
        const char *q = write_yaml(bads[i].yaml);
        kiln_err_clear(&err);
        assert_int_not_equal(kiln_srv_tenants_load(q, &ts, &err), KILN_OK);
        assert_non_null(strstr(err.msg, q));
        if (!strstr(err.msg, bads[i].why)) fail_msg("case %zu: %s", i, err.msg);
        assert_null(strstr(err.msg, "sk-secret")); /* keys never in messages */
        /* the same text from memory (kiln_srv_tenants_parse, what fuzz_serve_tenants
         * drives): rejected too, the error naming the given name and the line */
        kiln_err_clear(&err);
        assert_int_not_equal(
            kiln_srv_tenants_parse(bads[i].yaml, strlen(bads[i].yaml), "mem.yaml", &ts, &err),
            KILN_OK);
        assert_non_null(strstr(err.msg, "mem.yaml:"));
        assert_null(ts.t);
    }
    /* from memory, not NUL-terminated: the bytes given, no more */
    const char txt[] = "tenants:\n  - id: carol\n    key: sk-c\n    max_context: 16\nXXXX";
    kiln_err_clear(&err);
    assert_int_equal(kiln_srv_tenants_parse(txt, sizeof txt - 5, NULL, &ts, &err), KILN_OK);
    assert_int_equal(ts.n, 1);
    assert_string_equal(kiln_srv_auth(&ts, "Bearer sk-c")->id, "carol");
    assert_int_equal(ts.t[0].max_context, 16);
    kiln_srv_tenants_free(&ts);
    /* an empty list: the open default, and nothing allocated for the list leaks (found by
     * fuzz_serve_tenants on its first seed; LSan in the ASan pass holds it) */
    assert_int_equal(kiln_srv_tenants_parse("tenants: []\n", 12, NULL, &ts, &err), KILN_OK);
    assert_true(ts.open);
    assert_int_equal(ts.n, 1);
    kiln_srv_tenants_free(&ts);
    /* empty text: the open default, as a file without `tenants:` */
    assert_int_equal(kiln_srv_tenants_parse("", 0, NULL, &ts, &err), KILN_OK);
    assert_true(ts.open);
    kiln_srv_tenants_free(&ts);
}

/* kiln_oai_json_quote(s) must be byte for byte json_dumps(json_stringn(s)), and refuse
 * (0) exactly what json_stringn refuses */
static void quote_check(const char *s, size_t n) {
    char buf[6 * 16 + 2];
    assert_true(n <= 16);
    size_t k = kiln_oai_json_quote(s, n, buf);
    json_t *j = json_stringn(s, n);
    if (!j) {
        assert_int_equal(k, 0);
        return;
    }
    char *d = json_dumps(j, JSON_ENCODE_ANY);
    json_decref(j);
    assert_non_null(d);
    if (k != strlen(d) || memcmp(buf, d, k) != 0) {
        fprintf(stderr, "quote of %zu bytes:", n);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %02x", (unsigned char)s[i]);
        fprintf(stderr, ": kiln '%.*s' jansson '%s'\n", (int)k, buf, d);
        fail();
    }
    free(d);
}

static size_t utf8_put(uint32_t cp, char *o) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 63));
        o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63));
    o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static void test_json_quote(void **state) {
    (void)state;
    char s[16];
    for (unsigned a = 0; a < 256; a++) {
        s[0] = (char)a;
        quote_check(s, 1);
        for (unsigned b = 0; b < 256; b++) { /* every 2-byte string */
            s[1] = (char)b;
            quote_check(s, 2);
        }
    }
    /* every code point (surrogates too, encoded as if valid), alone and between text */
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp += cp < 0x10000 ? 1 : 61) {
        size_t k = utf8_put(cp, s + 1);
        quote_check(s + 1, k);
        s[0] = 'a';
        s[k + 1] = '"';
        quote_check(s, k + 2);
    }
    /* overlong and truncated forms, bytes past U+10FFFF */
    const char *odd[] = {"\xe0\x80\x80", "\xf0\x80\x80\x80",  "\xf4\x90\x80\x80",
                         "\xed\xa0\x80", "\xe2\x82",          "\xf0\x9f\x98",
                         "\xc3",         "x\xf0\x9f\x98\x80y"};
    for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) quote_check(odd[i], strlen(odd[i]));
    /* random strings of bytes biased to the interesting ones */
    uint64_t x = 88172645463325252ull;
    const unsigned char pick[] = {0,    1,    8,    9,    10,   12,   13,   0x1f, 0x20, '"',  '\\',
                                  '/',  'a',  0x7f, 0x80, 0xbf, 0xc2, 0xc3, 0xdf, 0xe0, 0xe2, 0xed,
                                  0xef, 0xf0, 0xf4, 0xf5, 0xff, 0x9f, 0x98, 0x82, 0xac};
    for (int it = 0; it < 200000; it++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t n = (size_t)(x % 16) + 1;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            s[i] = (char)pick[x % sizeof(pick)];
        }
        quote_check(s, n);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_quote),  cmocka_unit_test(test_chat_ok),
        cmocka_unit_test(test_chat_errors), cmocka_unit_test(test_completion),
        cmocka_unit_test(test_tool_calls),  cmocka_unit_test(test_tenants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
