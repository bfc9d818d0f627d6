/* test_registry.c — registries: providers, availability, priority order, fallbacks, and
 * capabilities descriptors (schema checked, unknown fields rejected, missing fields =
 * unsupported, descriptor hash in the registry hash and so in every cache key). */
#include "kernels/select.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static kiln_status mm(const kiln_kctx *c, const kiln_matmul_args *a) {
    (void)c, (void)a;
    return KILN_OK;
}

static const kiln_kernel_spec ref_specs[] = {
    {.id = "ref.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "ref",
     .w_dtypes = KILN_DT_FLOATS | KILN_DT_QUANTS,
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .features = KILN_KFEAT_BIAS,
     .props = 3,
     .priority = 10,
     .fn.matmul = mm},
};
static const kiln_provider pref = {
    .name = "ref", .specs = ref_specs, .n_specs = 1, .fallback = true};
static const kiln_kernel_spec lib_specs[] = {
    {.id = "lib.a.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "lib",
     .w_dtypes = KILN_DT(KILN_DTYPE_F32) | KILN_DT(KILN_DTYPE_F16),
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .features = KILN_KFEAT_BIAS,
     .props = 3,
     .priority = 50,
     .fn.matmul = mm},
    {.id = "lib.b.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "lib",
     .w_dtypes = KILN_DT(KILN_DTYPE_F32),
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .props = 3,
     .priority = 60,
     .fn.matmul = mm},
    {.id = "lib.c.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "lib",
     .w_dtypes = KILN_DT(KILN_DTYPE_F32),
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .props = 3,
     .priority = 70,
     .fn.matmul = NULL /* not built */},
};
static const kiln_provider plib = {.name = "lib", .specs = lib_specs, .n_specs = 3};

static char dir[256];

static void write_desc(const char *text) {
    char p[320];
    snprintf(p, sizeof p, "%s/lib.json", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static kiln_registry *build(void) {
    const kiln_provider *ps[] = {&pref, &plib};
    kiln_registry *r = NULL;
    kiln_err e;
    assert_int_equal(kiln_registry_new(ps, 2, dir, &r, &e), KILN_OK);
    return r;
}

static void test_basic(void **state) {
    (void)state;
    kiln_registry *r = build(); /* no lib.json yet */
    assert_int_equal(r->n_kernels, 4);
    assert_int_equal(r->n_by_op[KILN_KOP_MATMUL], 4);
    /* best static priority first */
    assert_string_equal(r->kernels[r->by_op[KILN_KOP_MATMUL][0]].spec.id, "lib.c.matmul");
    assert_string_equal(r->kernels[r->fallback[KILN_KOP_MATMUL]].spec.id, "ref.matmul");
    assert_int_equal(r->fallback[KILN_KOP_ROPE], -1);
    const kiln_reg_kernel *c = kiln_registry_find(r, "lib.c.matmul");
    assert_non_null(c);
    assert_false(kiln_registry_kernel_available(r, c)); /* fn NULL */
    assert_true(kiln_registry_kernel_available(r, kiln_registry_find(r, "lib.a.matmul")));
    assert_null(kiln_registry_find(r, "nope"));
    /* duplicate ids and duplicate providers are errors */
    const kiln_provider *dup[] = {&pref, &pref};
    kiln_registry *x;
    kiln_err e;
    assert_int_not_equal(kiln_registry_new(dup, 2, NULL, &x, &e), KILN_OK);
    assert_non_null(strstr(e.msg, "twice"));
    kiln_registry_free(r);
}

static void test_default_registry(void **state) {
    (void)state;
    const kiln_registry *r = kiln_registry_default();
    assert_string_equal(kiln_registry_default_error(), "");
    assert_true(kiln_registry_provider_index(r, "ref") >= 0);
    int ob = kiln_registry_provider_index(r, "openblas");
    assert_true(ob >= 0);
    /* available or not, never fatal; when unavailable it says why */
    if (!r->providers[ob].available) assert_true(strlen(r->providers[ob].why) > 0);
    for (int op = 0; op < KILN_KOP_COUNT; op++) assert_true(r->fallback[op] >= 0);
    assert_non_null(kiln_registry_find(r, "openblas.sgemm.matmul.f32"));
}

static void test_descriptor_narrows(void **state) {
    (void)state;
    kiln_registry *r0 = build();
    write_desc("{\"schema\": \"kiln.kernel-descriptor\", \"schema_version\": 1,"
               " \"provider\": \"lib\", \"version\": \"1.2\", \"kernels\": {"
               "  \"lib.a.matmul\": {\"w_dtypes\": [\"f32\", \"q4_K\"], \"act_dtypes\": [\"f32\"],"
               "     \"properties\": [\"deterministic\"], \"isa\": [\"avx2\"], \"max_tokens\": 64,"
               "     \"priority\": 55}}}");
    kiln_registry *r = build();
    assert_true(r->providers[1].available);
    assert_true(r->providers[1].has_descriptor);
    assert_int_not_equal(r->providers[1].descriptor_hash, 0);
    assert_int_not_equal(r->hash, r0->hash); /* enters cache keys through the state hash */
    const kiln_reg_kernel *a = kiln_registry_find(r, "lib.a.matmul");
    /* intersected: f16 dropped, q4_K not added */
    assert_int_equal(a->spec.w_dtypes, KILN_DT(KILN_DTYPE_F32));
    assert_int_equal(a->spec.features, 0);                     /* missing = unsupported */
    assert_int_equal(a->spec.props, KILN_KPROP_DETERMINISTIC); /* narrowed */
    assert_int_equal(a->spec.isa, KILN_ISA_AVX2);
    assert_int_equal(a->spec.max_tokens, 64);
    assert_int_equal(a->spec.priority, 55);
    /* not in the descriptor: undeclared -> unavailable */
    const kiln_reg_kernel *b = kiln_registry_find(r, "lib.b.matmul");
    assert_true(b->undeclared);
    assert_false(kiln_registry_kernel_available(r, b));
    /* selection sees it: bias is now unsupported, b unavailable */
    kiln_selector *s;
    kiln_err e;
    assert_int_equal(kiln_selector_new(r, NULL, NULL, &s, &e), KILN_OK);
    kiln_sel_ctx c;
    kiln_sel_ctx_init(&c, KILN_KOP_MATMUL, KILN_BACKEND_CPU);
    c.isa = KILN_ISA_AVX2;
    c.w_dtype = KILN_DTYPE_F32;
    c.features = KILN_KFEAT_BIAS;
    kiln_sel_result res;
    assert_int_equal(kiln_select(s, &c, 0, &res, &e), KILN_OK);
    for (int i = 0; i < res.n_cands; i++) {
        const char *id = res.cands[i].k->spec.id;
        if (!strcmp(id, "lib.a.matmul"))
            assert_true(res.cands[i].reasons & KILN_REASON_BIT(KILN_REASON_FEATURE_UNSUPPORTED));
        if (!strcmp(id, "lib.b.matmul")) {
            assert_true(res.cands[i].reasons & KILN_REASON_BIT(KILN_REASON_PROVIDER_UNAVAILABLE));
            char m[256];
            kiln_reason_message(KILN_REASON_PROVIDER_UNAVAILABLE, s, res.cands[i].k, &c, m,
                                sizeof m);
            assert_non_null(strstr(m, "not declared"));
        }
    }
    kiln_selector_free(s);
    kiln_registry_free(r);
    kiln_registry_free(r0);
}

static void expect_rejected(const char *json, const char *msg_part) {
    write_desc(json);
    kiln_registry *r = build();
    if (r->providers[1].available) fail_msg("descriptor accepted: %s", json);
    if (!strstr(r->providers[1].why, msg_part))
        fail_msg("why = '%s', expected '%s'", r->providers[1].why, msg_part);
    /* the ref provider is unaffected */
    assert_true(r->providers[0].available);
    kiln_registry_free(r);
}

static void test_descriptor_rejected(void **state) {
    (void)state;
    const char *head = "{\"schema\": \"kiln.kernel-descriptor\", \"schema_version\": 1, "
                       "\"provider\": \"lib\", ";
    char buf[1024];
    expect_rejected("{\"schema\": \"kiln.kernel-descriptor\", \"schema_version\": 2, "
                    "\"provider\": \"lib\", \"kernels\": {}}",
                    "schema_version");
    expect_rejected("{\"schema\": \"other\", \"schema_version\": 1, \"provider\": \"lib\", "
                    "\"kernels\": {}}",
                    "'schema'");
    snprintf(buf, sizeof buf, "%s\"kernels\": {}, \"color\": \"red\"}", head);
    expect_rejected(buf, "unknown field 'color'");
    snprintf(buf, sizeof buf, "%s\"kernels\": {\"lib.a.matmul\": {\"speed\": 1}}}", head);
    expect_rejected(buf, "unknown field 'speed'");
    snprintf(buf, sizeof buf, "%s\"kernels\": {\"lib.z.matmul\": {}}}", head);
    expect_rejected(buf, "unknown kernel 'lib.z.matmul'");
    snprintf(buf, sizeof buf, "%s\"kernels\": {\"lib.a.matmul\": {\"w_dtypes\": [\"q9\"]}}}", head);
    expect_rejected(buf, "unknown name 'q9'");
    snprintf(buf, sizeof buf, "%s\"kernels\": {\"lib.a.matmul\": {\"max_tokens\": \"many\"}}}",
             head);
    expect_rejected(buf, "must be an integer");
    snprintf(buf, sizeof buf,
             "{\"schema\": \"kiln.kernel-descriptor\", \"schema_version\": 1, "
             "\"provider\": \"other\", \"kernels\": {}}");
    expect_rejected(buf, "'provider'");
    expect_rejected("{\"schema\": ", "descriptor rejected");
    expect_rejected("{\"schema\": \"kiln.kernel-descriptor\", \"schema\": \"x\"}", "duplicate");
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/kiln-test-registry-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    char p[320];
    snprintf(p, sizeof p, "%s/lib.json", dir);
    unlink(p);
    rmdir(dir);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),
        cmocka_unit_test(test_default_registry),
        cmocka_unit_test(test_descriptor_narrows),
        cmocka_unit_test(test_descriptor_rejected),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
