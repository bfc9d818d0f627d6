/* test_policy.c — kiln.yaml parsing (every key, bad files rejected with line numbers),
 * environment overrides, and the documented precedence, checked through selection. */
#include "kernels/select.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kiln_status mm(const kiln_kctx *c, const kiln_matmul_args *a) {
    (void)c, (void)a;
    return KILN_OK;
}
#define F32 KILN_DT(KILN_DTYPE_F32)
static const kiln_kernel_spec ref_specs[] = {
    {.id = "ref.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "ref",
     .w_dtypes = KILN_DT_FLOATS | KILN_DT_QUANTS,
     .act_dtypes = F32,
     .props = 3,
     .priority = 10,
     .fn.matmul = mm},
};
static const kiln_provider pref = {
    .name = "ref", .specs = ref_specs, .n_specs = 1, .fallback = true};
static const kiln_kernel_spec a_specs[] = {
    {.id = "alpha.big.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "alpha",
     .w_dtypes = KILN_DT_QUANTS,
     .act_dtypes = F32,
     .props = 3,
     .priority = 50,
     .fn.matmul = mm},
    {.id = "alpha.small.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "alpha",
     .w_dtypes = KILN_DT_QUANTS,
     .act_dtypes = F32,
     .props = 1,
     .priority = 45,
     .fn.matmul = mm},
};
static const kiln_provider palpha = {.name = "alpha", .specs = a_specs, .n_specs = 2};
static const kiln_kernel_spec b_specs[] = {
    {.id = "beta.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "beta",
     .w_dtypes = KILN_DT_QUANTS,
     .act_dtypes = F32,
     .props = 3,
     .priority = 40,
     .fn.matmul = mm},
};
static const kiln_provider pbeta = {.name = "beta", .specs = b_specs, .n_specs = 1};

static kiln_registry *reg;

static const char *choose(const kiln_policy *p, int tok_bucket, uint32_t dtype) {
    kiln_selector *s;
    kiln_err e;
    assert_int_equal(kiln_selector_new(reg, p, NULL, &s, &e), KILN_OK);
    kiln_sel_ctx c;
    kiln_sel_ctx_init(&c, KILN_KOP_MATMUL, KILN_BACKEND_CPU);
    c.w_dtype = dtype;
    kiln_sel_ctx_set_bucket(&c, tok_bucket, 0, 0, 0);
    kiln_sel_result r;
    static char out[96];
    if (kiln_select(s, &c, 0, &r, &e))
        snprintf(out, sizeof out, "error");
    else
        snprintf(out, sizeof out, "%s", r.chosen->spec.id);
    kiln_selector_free(s);
    return out;
}

static void parse_ok(kiln_policy *p, const char *y) {
    kiln_err e;
    kiln_policy_init(p);
    kiln_status st = kiln_policy_parse(p, y, strlen(y), "kiln.yaml", &e);
    if (st) fail_msg("parse failed: %s", e.msg);
}

static void expect_bad(const char *y, const char *want) {
    kiln_policy p;
    kiln_policy_init(&p);
    kiln_policy before = p;
    kiln_err e;
    kiln_err_clear(&e);
    assert_int_equal(kiln_policy_parse(&p, y, strlen(y), "kiln.yaml", &e), KILN_ERR_FORMAT);
    if (!strstr(e.msg, want)) fail_msg("message '%s' lacks '%s'", e.msg, want);
    assert_memory_equal(&p, &before, sizeof p); /* unchanged on error */
}

static void test_parse_all_keys(void **state) {
    (void)state;
    kiln_policy p;
    parse_ok(&p, "version: 1\n"
                 "strict: true\n"
                 "deterministic: yes\n"
                 "reference_only: false\n"
                 "memory_headroom_mb: 512\n"
                 "locks:\n"
                 "  matmul: alpha.big.matmul\n"
                 "  attention: ref.attention\n"
                 "prefer: [beta, alpha.small.*]\n"
                 "avoid: alpha\n"
                 "rules:\n"
                 "  - match: {op: matmul, dtype: q4_k, backend: cpu, tokens: \">512\", isa: avx2}\n"
                 "    prefer: [alpha]\n"
                 "  - match:\n"
                 "      sm: \">=90\"\n"
                 "    lock: gpu.x\n");
    assert_true(p.strict);
    assert_true(p.deterministic);
    assert_false(p.reference_only);
    assert_int_equal(p.headroom_bytes, 512ull << 20);
    assert_string_equal(p.locks[KILN_KOP_MATMUL], "alpha.big.matmul");
    assert_int_equal(p.lock_src[KILN_KOP_MATMUL], KILN_POLICY_SRC_FILE);
    assert_string_equal(p.locks[KILN_KOP_ATTENTION], "ref.attention");
    assert_int_equal(p.prefer.n, 2);
    assert_string_equal(p.prefer.name[1], "alpha.small.*");
    assert_int_equal(p.avoid.n, 1);
    assert_int_equal(p.n_rules, 2);
    assert_int_equal(p.rules[0].line, 12);
    assert_int_equal(p.rules[0].op, KILN_KOP_MATMUL);
    assert_int_equal(p.rules[0].w_dtypes, KILN_DT(KILN_DTYPE_Q4_K));
    assert_int_equal(p.rules[0].backend, KILN_BACKEND_CPU);
    assert_int_equal(p.rules[0].tok_buckets, 1u << 4);
    assert_int_equal(p.rules[0].isa, KILN_ISA_AVX2);
    assert_int_equal(p.rules[1].sm_min, 90);
    assert_int_equal(p.rules[1].sm_max, 0);
    assert_string_equal(p.rules[1].lock, "gpu.x");
    assert_string_equal(p.path, "kiln.yaml");
    /* an empty file is the defaults */
    kiln_policy q, d;
    parse_ok(&q, "");
    kiln_policy_init(&d);
    assert_int_equal(q.hash, d.hash);
    assert_int_not_equal(p.hash, d.hash);
}

static void test_bad_files(void **state) {
    (void)state;
    expect_bad("strict: true\ncolor: red\n", "kiln.yaml:2: unknown key 'color'");
    expect_bad("version: 2\n", "kiln.yaml:1: unsupported version");
    expect_bad("strict: maybe\n", "kiln.yaml:1: 'strict' must be true or false");
    expect_bad("\n\nlocks:\n  matmull: x\n", "kiln.yaml:4: locks: unknown op 'matmull'");
    expect_bad("locks: [a, b]\n", "kiln.yaml:1: 'locks' must map");
    expect_bad("memory_headroom_mb: -5\n", "kiln.yaml:1: 'memory_headroom_mb'");
    expect_bad("prefer: {a: b}\n", "kiln.yaml:1: 'prefer' must be a list");
    expect_bad("rules:\n  - prefer: [a]\n", "kiln.yaml:2: rule without 'match'");
    expect_bad("rules:\n  - match: {op: matmul}\n", "kiln.yaml:2: rule without prefer");
    expect_bad("rules:\n  - match: {op: matmul, dtype: q9_z}\n    avoid: a\n",
               "kiln.yaml:2: unknown dtype 'q9_z'");
    expect_bad("rules:\n  - match: {tokens: \"3-5\"}\n    avoid: a\n",
               "kiln.yaml:2: unknown token bucket '3-5'");
    expect_bad("rules:\n  - match: {sm: \"~90\"}\n    avoid: a\n", "kiln.yaml:2: 'sm': bad value");
    expect_bad("rules:\n  - match: {gpu: yes}\n    avoid: a\n",
               "kiln.yaml:2: unknown match key 'gpu'");
    expect_bad("rules:\n  - match: {op: rope}\n    lock: x\n    speed: 3\n",
               "kiln.yaml:4: unknown rule key 'speed'");
    expect_bad("strict: true\nstrict: false\n", "kiln.yaml:2: duplicate key 'strict'");
    expect_bad("prefer: [a\n", "kiln.yaml:2: YAML syntax error");
    expect_bad("- a\n- b\n", "kiln.yaml:1: the policy must be a mapping");
}

/* env lookup for tests */
static const char *env_keys[8], *env_vals[8];
static int n_env;
static const char *fake_get(const char *name) {
    for (int i = 0; i < n_env; i++)
        if (!strcmp(env_keys[i], name)) return env_vals[i];
    return NULL;
}
static void setenv_fake(const char *k, const char *v) {
    env_keys[n_env] = k;
    env_vals[n_env++] = v;
}

static void test_env(void **state) {
    (void)state;
    kiln_policy p;
    kiln_err e;
    kiln_policy_init(&p);
    n_env = 0;
    setenv_fake("KILN_LOCK_MATMUL", "beta.matmul");
    setenv_fake("KILN_PREFER", "alpha, beta");
    setenv_fake("KILN_AVOID", "gamma");
    setenv_fake("KILN_DETERMINISTIC", "1");
    assert_int_equal(kiln_policy_apply_env_with(&p, fake_get, &e), KILN_OK);
    assert_string_equal(p.locks[KILN_KOP_MATMUL], "beta.matmul");
    assert_int_equal(p.lock_src[KILN_KOP_MATMUL], KILN_POLICY_SRC_ENV);
    assert_int_equal(p.prefer.n, 2);
    assert_string_equal(p.prefer.name[1], "beta");
    assert_string_equal(p.avoid.name[0], "gamma");
    assert_true(p.deterministic);
    n_env = 0;
    setenv_fake("KILN_DETERMINISTIC", "sometimes");
    assert_int_equal(kiln_policy_apply_env_with(&p, fake_get, &e), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(e.msg, "KILN_DETERMINISTIC"));
    /* the real environment */
    setenv("KILN_LOCK_ROPE", "ref.rope", 1);
    kiln_policy_init(&p);
    assert_int_equal(kiln_policy_apply_env(&p, &e), KILN_OK);
    assert_string_equal(p.locks[KILN_KOP_ROPE], "ref.rope");
    unsetenv("KILN_LOCK_ROPE");
}

/* Precedence: each level beats the ones below it (policy.h, docs/KERNELS.md). */
static void test_precedence(void **state) {
    (void)state;
    kiln_policy p;
    kiln_err e;
    /* no policy: priority */
    kiln_policy_init(&p);
    assert_string_equal(choose(&p, 0, KILN_DTYPE_Q4_K), "alpha.big.matmul");
    /* file prefer beats priority */
    parse_ok(&p, "prefer: [beta]\n");
    assert_string_equal(choose(&p, 0, KILN_DTYPE_Q4_K), "beta.matmul");
    /* KILN_PREFER replaces the file's list */
    n_env = 0;
    setenv_fake("KILN_PREFER", "alpha.small.*");
    assert_int_equal(kiln_policy_apply_env_with(&p, fake_get, &e), KILN_OK);
    assert_string_equal(choose(&p, 0, KILN_DTYPE_Q4_K), "alpha.small.matmul");
    /* a matching rule's prefer ranks above the global list; only where it matches */
    parse_ok(&p, "prefer: [alpha.small.*]\n"
                 "rules:\n  - match: {tokens: \">512\"}\n    prefer: beta\n");
    assert_string_equal(choose(&p, 4, KILN_DTYPE_Q4_K), "beta.matmul");
    assert_string_equal(choose(&p, 0, KILN_DTYPE_Q4_K), "alpha.small.matmul");
    /* avoid beats prefer */
    parse_ok(&p, "prefer: [beta]\navoid: [beta]\n");
    assert_string_equal(choose(&p, 0, KILN_DTYPE_Q4_K), "alpha.big.matmul");
    /* rule avoid adds to the global avoid */
    parse_ok(&p, "avoid: [beta]\nrules:\n  - match: {dtype: q8_0}\n    avoid: alpha.big.*\n");
    assert_string_equal(choose(&p, 0, KILN_DTYPE_Q8_0), "alpha.small.matmul");
    assert_string_equal(choose(&p, 0, KILN_DTYPE_Q4_K), "alpha.big.matmul");
    /* KILN_AVOID replaces the file's avoid */
    n_env = 0;
    setenv_fake("KILN_AVOID", "alpha");
    assert_int_equal(kiln_policy_apply_env_with(&p, fake_get, &e), KILN_OK);
    assert_string_equal(choose(&p, 0, KILN_DTYPE_Q4_K), "beta.matmul");
    /* a file lock beats avoid and prefer */
    parse_ok(&p, "locks: {matmul: alpha.small.matmul}\navoid: [alpha]\nprefer: [beta]\n");
    assert_string_equal(choose(&p, 0, KILN_DTYPE_Q4_K), "alpha.small.matmul");
    /* a rule lock beats the file lock where it matches */
    parse_ok(&p, "locks: {matmul: alpha.small.matmul}\n"
                 "rules:\n  - match: {tokens: \"1\"}\n    lock: beta.matmul\n");
    assert_string_equal(choose(&p, 0, KILN_DTYPE_Q4_K), "beta.matmul");
    assert_string_equal(choose(&p, 1, KILN_DTYPE_Q4_K), "alpha.small.matmul");
    /* KILN_LOCK_<OP> beats the rule lock */
    n_env = 0;
    setenv_fake("KILN_LOCK_MATMUL", "alpha.big.matmul");
    assert_int_equal(kiln_policy_apply_env_with(&p, fake_get, &e), KILN_OK);
    assert_string_equal(choose(&p, 0, KILN_DTYPE_Q4_K), "alpha.big.matmul");
    /* reference_only beats every lock */
    n_env = 0;
    setenv_fake("KILN_REFERENCE_ONLY", "1");
    assert_int_equal(kiln_policy_apply_env_with(&p, fake_get, &e), KILN_OK);
    assert_string_equal(choose(&p, 0, KILN_DTYPE_Q4_K), "ref.matmul");
    /* deterministic: file says no, env says yes -> batch-variant alpha.small is out */
    parse_ok(&p, "deterministic: false\nprefer: [alpha.small.*]\n");
    assert_string_equal(choose(&p, 0, KILN_DTYPE_Q4_K), "alpha.small.matmul");
    n_env = 0;
    setenv_fake("KILN_DETERMINISTIC", "1");
    assert_int_equal(kiln_policy_apply_env_with(&p, fake_get, &e), KILN_OK);
    assert_string_equal(choose(&p, 0, KILN_DTYPE_Q4_K), "alpha.big.matmul");
    n_env = 0;
}

static void test_resolve_file_choice(void **state) {
    (void)state;
    kiln_policy p;
    kiln_err e;
    const char *a = kt_write_temp("prefer: [beta]\n", 15, ".yaml");
    char pa[512];
    snprintf(pa, sizeof pa, "%s", a);
    const char *b = kt_write_temp("prefer: [alpha.small.*]\n", 24, ".yaml");
    char pb[512];
    snprintf(pb, sizeof pb, "%s", b);
    /* --policy beats KILN_POLICY */
    setenv("KILN_POLICY", pb, 1);
    assert_int_equal(kiln_policy_resolve(&p, pa, &e), KILN_OK);
    assert_string_equal(p.path, pa);
    assert_int_equal(kiln_policy_resolve(&p, NULL, &e), KILN_OK);
    assert_string_equal(p.path, pb);
    /* a named file that does not exist is an error */
    setenv("KILN_POLICY", "/nonexistent/kiln.yaml", 1);
    assert_int_not_equal(kiln_policy_resolve(&p, NULL, &e), KILN_OK);
    assert_non_null(strstr(e.msg, "/nonexistent/kiln.yaml"));
    unsetenv("KILN_POLICY");
    /* the default file is optional */
    setenv("XDG_CONFIG_HOME", "/nonexistent", 1);
    assert_int_equal(kiln_policy_resolve(&p, NULL, &e), KILN_OK);
    assert_string_equal(p.path, "");
    unsetenv("XDG_CONFIG_HOME");
    remove(pa);
    remove(pb);
}

static int setup(void **state) {
    (void)state;
    const kiln_provider *ps[] = {&pref, &palpha, &pbeta};
    kiln_err e;
    unsetenv("KILN_PREFER");
    unsetenv("KILN_AVOID");
    unsetenv("KILN_DETERMINISTIC");
    unsetenv("KILN_REFERENCE_ONLY");
    unsetenv("KILN_STRICT");
    return kiln_registry_new(ps, 3, NULL, &reg, &e) == KILN_OK ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    kiln_registry_free(reg);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_all_keys),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_env),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_resolve_file_choice),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
