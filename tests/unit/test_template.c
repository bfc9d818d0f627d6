/* test_template.c — chat templates against Python jinja2 goldens.
 *
 * tests/data/templates/goldens/<template>.json holds, for each real template of
 * ../shared/testdata/templates/ and each conversation of conversations.json (with and
 * without a generation prompt), what jinja2 rendered in transformers' environment, or
 * the error it raised (scripts/gen-template-goldens.py made them). kiln must produce the
 * same bytes, or fail as well; for raise_exception() the message must match too.
 * goldens/features.json does the same for small templates exercising one feature each.
 */
#include "format/meta.h"
#include "testutil.h"

#include "tok/jinja.h"
#include "tok/template.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    long n = ftell(f);
    rewind(f);
    char *p = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) {
        p[n] = 0;
        *len = (size_t)n;
    }
    return p;
}

static json_t *load(const char *path) {
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) fail_msg("%s:%d: %s", path, je.line, je.text);
    return j;
}

/* Prints the first differing position of two renderings. */
static void show_diff(const char *what, const char *want, size_t wn, const char *got, size_t gn) {
    size_t i = 0;
    while (i < wn && i < gn && want[i] == got[i]) i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr,
            "MISMATCH %s at byte %zu (want %zu bytes, got %zu)\n  want: ...%.*s\n  got:  ...%.*s\n",
            what, i, wn, gn, (int)((wn - from) < 140 ? wn - from : 140), want + from,
            (int)((gn - from) < 140 ? gn - from : 140), got + from);
}

/* Runs one golden case; returns 1 when it fails. */
static int run_case(const char *label, const kiln_chat_template *t, const char *parse_err,
                    json_t *conv, json_t *gold, json_t *meta) {
    bool agp = json_is_true(json_object_get(gold, "add_generation_prompt"));
    json_t *want = json_object_get(gold, "output");
    const char *want_err = json_string_value(json_object_get(gold, "error"));
    const char *err_type = json_string_value(json_object_get(gold, "error_type"));
    char what[512];
    snprintf(what, sizeof what, "%s [%s, add_generation_prompt=%d]", label,
             json_string_value(json_object_get(gold, "conversation")), agp);
    kiln_err err;
    kiln_err_clear(&err);
    char *out = NULL;
    size_t n = 0;
    kiln_status st = KILN_ERR_FORMAT;
    if (t) {
        kiln_chat_inputs in = {
            .messages = json_object_get(conv, "messages"),
            .tools = json_object_get(conv, "tools"),
            .extra = json_object_get(conv, "vars"),
            .add_generation_prompt = agp,
            .bos_token = json_string_value(json_object_get(meta, "bos_token")),
            .eos_token = json_string_value(json_object_get(meta, "eos_token")),
            .now_iso = json_string_value(json_object_get(meta, "now")),
        };
        st = kiln_chat_template_render(t, &in, &out, &n, &err);
    } else {
        snprintf(err.msg, sizeof err.msg, "%s", parse_err);
    }
    int bad = 0;
    if (want) {
        if (st) {
            fprintf(stderr, "FAIL %s: jinja2 rendered, kiln failed: %s\n", what, err.msg);
            bad = 1;
        } else if (n != json_string_length(want) || memcmp(out, json_string_value(want), n)) {
            show_diff(what, json_string_value(want), json_string_length(want), out, n);
            bad = 1;
        }
    } else {
        if (!st) {
            fprintf(stderr, "FAIL %s: jinja2 raised %s (%s), kiln rendered\n", what, err_type,
                    want_err);
            bad = 1;
        } else if (err_type && !strcmp(err_type, "TemplateError") && want_err &&
                   !strstr(err.msg, want_err)) {
            fprintf(stderr, "FAIL %s: raise_exception message differs:\n  want: %s\n  got:  %s\n",
                    what, want_err, err.msg);
            bad = 1;
        }
    }
    free(out);
    return bad;
}

static void test_real_templates(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/templates/conversations.json", kt_source_dir());
    json_t *meta = load(path);
    json_t *convs = json_object_get(meta, "conversations");
    snprintf(path, sizeof path, "%s/testdata/templates", kt_shared_dir());
    DIR *probe = opendir(path);
    if (!probe) {
        json_decref(meta);
        fprintf(stderr, "SKIP: templates folder %s is missing (KILN_SHARED_DIR)\n", path);
        skip();
        return;
    }
    closedir(probe);
    snprintf(path, sizeof path, "%s/tests/data/templates/goldens", kt_source_dir());
    DIR *d = opendir(path);
    assert_non_null(d);
    struct dirent *e;
    int n_templates = 0, n_cases = 0, n_bad = 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".json") || !strcmp(e->d_name, "features.json"))
            continue;
        char gpath[8192];
        snprintf(gpath, sizeof gpath, "%s/%s", path, e->d_name);
        json_t *g = load(gpath);
        const char *tname = json_string_value(json_object_get(g, "template"));
        char tpath[8192];
        snprintf(tpath, sizeof tpath, "%s/testdata/templates/%s", kt_shared_dir(), tname);
        size_t src_len = 0;
        char *src = slurp(tpath, &src_len);
        if (!src) fail_msg("cannot read %s", tpath);
        kiln_chat_template *t = NULL;
        kiln_err err;
        kiln_err_clear(&err);
        kiln_chat_template_parse(src, src_len, tname, &t, &err);
        json_t *cases = json_object_get(g, "cases");
        size_t i;
        json_t *c;
        json_array_foreach(cases, i, c) {
            json_t *conv =
                json_object_get(convs, json_string_value(json_object_get(c, "conversation")));
            assert_non_null(conv);
            n_bad += run_case(tname, t, err.msg, conv, c, meta);
            n_cases++;
        }
        n_templates++;
        kiln_chat_template_free(t);
        free(src);
        json_decref(g);
    }
    closedir(d);
    json_decref(meta);
    fprintf(stderr, "templates: %d, cases: %d, failures: %d\n", n_templates, n_cases, n_bad);
    assert_true(n_templates >= 50);
    assert_int_equal(n_bad, 0);
}

/* goldens/features.json: [{"name", "template", "context": {...}, "output" | "error"}] */
static void test_features(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/templates/goldens/features.json", kt_source_dir());
    json_t *all = load(path);
    size_t i;
    json_t *c;
    int n_bad = 0;
    json_array_foreach(all, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *src = json_string_value(json_object_get(c, "template"));
        json_t *ctx = json_object_get(c, "context");
        json_t *want = json_object_get(c, "output");
        kiln_err err;
        kiln_err_clear(&err);
        jinja_template *t = NULL;
        char *out = NULL;
        size_t n = 0;
        kiln_status st = jinja_parse(src, strlen(src), &t, &err);
        if (!st) {
            jinja_vars v = {0};
            const char *key;
            json_t *val;
            json_object_foreach(ctx, key, val) jinja_vars_json(&v, key, val);
            v.now_iso = "2026-01-15T10:30:00";
            st = jinja_render(t, &v, &out, &n, &err);
        }
        if (want && st) {
            fprintf(stderr, "FAIL feature %s: jinja2 rendered, kiln failed: %s\n", name, err.msg);
            n_bad++;
        } else if (want &&
                   (n != json_string_length(want) || memcmp(out, json_string_value(want), n))) {
            show_diff(name, json_string_value(want), json_string_length(want), out, n);
            n_bad++;
        } else if (!want && !st) {
            fprintf(stderr, "FAIL feature %s: jinja2 raised %s, kiln rendered '%s'\n", name,
                    json_string_value(json_object_get(c, "error")), out);
            n_bad++;
        }
        free(out);
        jinja_free(t);
    }
    fprintf(stderr, "features: %zu, failures: %d\n", json_array_size(all), n_bad);
    json_decref(all);
    assert_int_equal(n_bad, 0);
}

/* Errors carry line and column; nothing crashes on malformed templates. */
static void test_errors(void **state) {
    (void)state;
    static const struct {
        const char *src, *want;
    } cases[] = {
        {"{% if x %}", "line 1, column 11: unexpected end of template, expected 'elif'"},
        {"a\n  {{ x | nosuchfilter }}", "line 2, column 10: no filter named 'nosuchfilter'"},
        {"{% include 'x' %}", "line 1, column 4: kiln does not support the 'include' statement"},
        {"{{ 'abc }}", "line 1, column 4: unterminated string literal"},
        {"{% for x in y recursive %}{% endfor %}", "kiln does not support recursive for loops"},
        {"{{ x.y }}", "line 1, column 5: 'x' is undefined"},
        {"{{ raise_exception('bad role') }}", "line 1, column 19: bad role"},
        {"{% set l = [] %}{{ l.append(1) }}",
         "access to attribute 'append' of 'list' object is unsafe."},
        {"{{ 1 / 0 }}", "division by zero"},
        {"{# open comment", "missing end of comment tag"},
        {"{{ (((( }}", "unexpected"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_err err;
        kiln_err_clear(&err);
        jinja_template *t = NULL;
        char *out = NULL;
        kiln_status st = jinja_parse(cases[i].src, strlen(cases[i].src), &t, &err);
        if (!st) {
            jinja_vars v = {0};
            st = jinja_render(t, &v, &out, NULL, &err);
        }
        if (!st || !strstr(err.msg, cases[i].want))
            fail_msg("template %s: want error '%s', got %s '%s'", cases[i].src, cases[i].want,
                     st ? "error" : "success", st ? err.msg : out);
        free(out);
        jinja_free(t);
    }
}

/* The render limits (jinja_vars.max_steps / max_bytes, which the fuzz targets and the
 * server set) stop a runaway template with a status, not a hang or an unbounded buffer. */
static void test_limits(void **state) {
    (void)state;
    static const struct {
        const char *src, *want;
        size_t max_bytes;
        uint64_t max_steps;
    } cases[] = {
        {"{% for i in range(1000) %}{% for j in range(1000) %}{% set x = j %}{% endfor %}{% endfor "
         "%}",
         "step limit reached", 0, 5000},
        {"{% for i in range(1000) %}xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx{% endfor %}", "limit", 4096,
         0},
        {"{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set ns.x = ns.x + ns.x %}"
         "{% endfor %}{{ ns.x }}",
         "limit", 1u << 16, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_err err;
        kiln_err_clear(&err);
        jinja_template *t = NULL;
        char *out = NULL;
        assert_int_equal(jinja_parse(cases[i].src, strlen(cases[i].src), &t, &err), KILN_OK);
        jinja_vars v = {0};
        v.max_bytes = cases[i].max_bytes;
        v.max_steps = cases[i].max_steps;
        kiln_status st = jinja_render(t, &v, &out, NULL, &err);
        if (!st || !strstr(err.msg, cases[i].want))
            fail_msg("template %zu: want error '%s', got %s '%s'", i, cases[i].want,
                     st ? "error" : "success", st ? err.msg : "(output)");
        free(out);
        jinja_free(t);
    }
}

/* printf-style `%` formatting on strings from a model file (fuzz_template finding, session
 * 8): a NUL byte where the conversion character goes is an error (strchr matched the
 * terminator and the format reached snprintf as "%432ll"), widths over 9999 are refused
 * (one string of gigabytes otherwise), and wide fields are not cut at a buffer. */
static void test_percent_format(void **state) {
    (void)state;
    static const char nul_conv[] = "{{ (\"a%432\0\0s\") % 6 }}";
    static const struct {
        const char *src;
        size_t len;
        const char *want_err; /* NULL: success */
        size_t want_len;      /* output length on success */
    } cases[] = {
        {nul_conv, sizeof nul_conv - 1, "unsupported format character", 0},
        {"{{ '%999999999s' % 'x' }}", 0, "width or precision over 9999", 0},
        {"{{ '%.12345f' % 1.5 }}", 0, "width or precision over 9999", 0},
        {"{{ '%9999d' % 7 }}", 0, NULL, 9999},
        {"{{ '%300s|%-5s|%05.1f' % ('a', 'b', 2.25) }}", 0, NULL, 300 + 1 + 5 + 1 + 5},
        /* repetition (the other string operator): an empty sequence times 2^63 - 1 is
         * empty at once (it looped 2^63 times: fuzz_template, session 9) */
        {"{{ '' * 9223372036854775807 }}", 0, NULL, 0},
        {"{{ ([] * 9223372036854775807) | length }}", 0, NULL, 1},
        {"{{ 'ab' * 3 }}{{ [1, 2] * 2 }}", 0, NULL, 6 + 12},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_err err;
        kiln_err_clear(&err);
        jinja_template *t = NULL;
        char *out = NULL;
        size_t len = cases[i].len ? cases[i].len : strlen(cases[i].src);
        assert_int_equal(jinja_parse(cases[i].src, len, &t, &err), KILN_OK);
        jinja_vars v = {0};
        kiln_status st = jinja_render(t, &v, &out, NULL, &err);
        if (cases[i].want_err) {
            if (!st || !strstr(err.msg, cases[i].want_err))
                fail_msg("case %zu: want error '%s', got %s '%s'", i, cases[i].want_err,
                         st ? "error" : "success", st ? err.msg : "(output)");
        } else {
            if (st) fail_msg("case %zu: %s", i, err.msg);
            assert_int_equal(strlen(out), cases[i].want_len);
        }
        free(out);
        jinja_free(t);
    }
}

/* Templates and special tokens from model metadata (the GGUF keys). */
static void test_from_meta(void **state) {
    (void)state;
    kiln_meta m;
    kiln_meta_init(&m);
    kiln_err err;
    kiln_err_clear(&err);
    static const char tpl[] = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}"
                              "{{ eos_token }}{% endfor %}";
    static const char tool_tpl[] = "tools:{{ tools | length }}";
    assert_int_equal(
        kiln_meta_set_str(&m, "tokenizer.chat_template", (kiln_str){tpl, sizeof tpl - 1}, &err),
        KILN_OK);
    assert_int_equal(kiln_meta_set_str(&m, "tokenizer.chat_template.tool_use",
                                       (kiln_str){tool_tpl, sizeof tool_tpl - 1}, &err),
                     KILN_OK);
    static const kiln_str toks[] = {{"<pad>", 5}, {"<bos>", 5}, {"<eos>", 5}, {"hi", 2}};
    kiln_meta_value arr = {.type = KILN_META_ARRAY, .elem_type = KILN_META_STRING, .count = 4};
    arr.v.strs = toks;
    assert_int_equal(kiln_meta_add(&m, (kiln_str){"tokenizer.ggml.tokens", 21}, &arr, &err),
                     KILN_OK);
    assert_int_equal(kiln_meta_set_u32(&m, "tokenizer.ggml.bos_token_id", 1, &err), KILN_OK);
    assert_int_equal(kiln_meta_set_u32(&m, "tokenizer.ggml.eos_token_id", 2, &err), KILN_OK);

    char *src = NULL, *bos = NULL, *eos = NULL, *out = NULL;
    size_t n = 0;
    assert_int_equal(kiln_chat_template_from_meta(&m, NULL, &src, &n, &err), KILN_OK);
    assert_int_equal(n, sizeof tpl - 1);
    assert_int_equal(kiln_chat_template_special_tokens(&m, &bos, &eos, &err), KILN_OK);
    assert_string_equal(bos, "<bos>");
    assert_string_equal(eos, "<eos>");
    kiln_chat_template *t = NULL;
    assert_int_equal(kiln_chat_template_parse(src, n, "meta", &t, &err), KILN_OK);
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"hi\"}]", 0, NULL);
    kiln_chat_inputs in = {.messages = msgs, .bos_token = bos, .eos_token = eos};
    assert_int_equal(kiln_chat_template_render(t, &in, &out, &n, &err), KILN_OK);
    assert_string_equal(out, "<bos>[user]hi<eos>");
    free(out);
    kiln_chat_template_free(t);
    free(src);

    assert_int_equal(kiln_chat_template_from_meta(&m, "tool_use", &src, &n, &err), KILN_OK);
    assert_string_equal(src, tool_tpl);
    free(src);
    /* a missing variant names the key and lists the ones present */
    assert_int_equal(kiln_chat_template_from_meta(&m, "rag", &src, &n, &err), KILN_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "tokenizer.chat_template.rag"));
    assert_non_null(strstr(err.msg, "named templates: tool_use"));
    free(bos);
    free(eos);
    json_decref(msgs);
    kiln_meta_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_templates), cmocka_unit_test(test_features),
        cmocka_unit_test(test_errors),         cmocka_unit_test(test_limits),
        cmocka_unit_test(test_percent_format), cmocka_unit_test(test_from_meta),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
