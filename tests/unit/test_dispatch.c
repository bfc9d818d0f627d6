/* test_dispatch.c — the baked dispatch table's file format (kernels/dispatch.h): what
 * kiln_baked_save writes, kiln_baked_open reads back entry by entry; a table whose
 * signature (device, registry, policy) differs is opened but marked unusable with the
 * reason; malformed files and bad tables to write are errors naming the file. The
 * runtime side (a bound plan's table saved and bound again) is test_dispatch_runtime.c. */
#include "kernels/dispatch.h"
#include "testutil.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static kiln_status mm(const kiln_kctx *c, const kiln_matmul_args *a) {
    (void)c, (void)a;
    return KILN_OK;
}
static kiln_status at(const kiln_kctx *c, const kiln_attention_args *a) {
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
    {.id = "ref.attention",
     .op = KILN_KOP_ATTENTION,
     .provider = "ref",
     .act_dtypes = F32,
     .kv_dtypes = KILN_DT(KILN_DTYPE_F16),
     .features = 0x1f,
     .props = 3,
     .priority = 10,
     .fn.attention = at},
};
static const kiln_provider pref = {
    .name = "ref", .specs = ref_specs, .n_specs = 2, .fallback = true};
static const kiln_kernel_spec f_specs[] = {
    {.id = "f.decode.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "f",
     .w_dtypes = KILN_DT(KILN_DTYPE_Q4_K),
     .act_dtypes = F32,
     .max_tokens = 8,
     .props = 3,
     .priority = 80,
     .fn.matmul = mm},
    {.id = "f.prefill.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "f",
     .w_dtypes = KILN_DT(KILN_DTYPE_Q4_K),
     .act_dtypes = F32,
     .props = 3,
     .priority = 60,
     .fn.matmul = mm},
    {.id = "f.attention",
     .op = KILN_KOP_ATTENTION,
     .provider = "f",
     .act_dtypes = F32,
     .kv_dtypes = KILN_DT(KILN_DTYPE_F16),
     .features = 0x1f,
     .max_seq = 4096,
     .props = 3,
     .priority = 80,
     .fn.attention = at},
};
static const kiln_provider pf = {.name = "f", .specs = f_specs, .n_specs = 3};

static kiln_registry *reg;
static kiln_baked_site sites[3];
static kiln_sel_ctx device;
static char path[300];

static const kiln_reg_kernel *K(const char *id) {
    const kiln_reg_kernel *k = kiln_registry_find(reg, id);
    assert_non_null(k);
    return k;
}

/* a table as the runtime writes it: decode / prefill matmuls per token bucket, fast
 * attention for every bucket but the largest context */
static void make_sites(void) {
    memset(sites, 0, sizeof sites);
    static const char *names[3] = {"blk.0.ffn.down", "blk.1.ffn.down", "blk.0.attn.core"};
    for (int i = 0; i < 3; i++) {
        sites[i].name = names[i];
        sites[i].op = i < 2 ? KILN_KOP_MATMUL : KILN_KOP_ATTENTION;
        sites[i].instr = 5 + i;
        for (int b = 0; b < KILN_SEL_BUCKETS; b++) {
            int tb = b / KILN_SEQ_BUCKETS, sb = b % KILN_SEQ_BUCKETS;
            if (i < 2)
                sites[i].k[b] = K(tb <= 1 ? "f.decode.matmul" : "f.prefill.matmul");
            else
                sites[i].k[b] = K(sb < 2 ? "f.attention" : "ref.attention");
        }
    }
    kiln_sel_ctx_init(&device, KILN_KOP_MATMUL, KILN_BACKEND_CPU);
}

static void same_table(const kiln_baked *b) {
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < KILN_SEL_BUCKETS; k++) {
            const char *id = kiln_baked_kernel(b, sites[i].name, k);
            assert_non_null(id);
            assert_string_equal(id, sites[i].k[k]->spec.id);
        }
}

static void test_roundtrip(void **state) {
    (void)state;
    kiln_selector *s;
    kiln_err e;
    assert_int_equal(kiln_selector_new(reg, NULL, NULL, &s, &e), KILN_OK);
    assert_int_equal(kiln_baked_save(path, s, &device, sites, 3, &e), KILN_OK);
    char tmp[320];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_not_equal(access(tmp, F_OK), 0); /* written aside and renamed */
    kiln_baked *b;
    bool usable;
    char why[512];
    assert_int_equal(kiln_baked_open(path, s, &device, &b, &usable, why, sizeof why, &e), KILN_OK);
    if (!usable) fail_msg("not usable: %s", why);
    same_table(b);
    assert_null(kiln_baked_kernel(b, "blk.9.ffn.down", 0)); /* not in the table */
    assert_null(kiln_baked_kernel(b, sites[0].name, KILN_SEL_BUCKETS));
    assert_null(kiln_baked_kernel(b, sites[0].name, -1));
    assert_string_equal(kiln_baked_path(b), path);
    kiln_baked_free(b);
    /* a fresh selector in the same state accepts it too, without selecting anything */
    kiln_selector *s2;
    assert_int_equal(kiln_selector_new(reg, NULL, NULL, &s2, &e), KILN_OK);
    assert_int_equal(kiln_baked_open(path, s2, &device, &b, &usable, why, sizeof why, &e), KILN_OK);
    assert_true(usable);
    uint64_t hits, misses;
    kiln_selector_cache_stats(s2, &hits, &misses);
    assert_int_equal(misses, 0);
    kiln_baked_free(b);
    kiln_baked_free(NULL);
    kiln_selector_free(s2);
    /* the file names each site's op and instruction */
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    json_t *o = json_array_get(json_object_get(root, "sites"), 2);
    assert_string_equal(json_string_value(json_object_get(o, "op")), "attention");
    assert_int_equal(json_integer_value(json_object_get(o, "instr")), 7);
    assert_string_equal(json_string_value(json_object_get(root, "schema")), KILN_DISPATCH_SCHEMA);
    json_decref(root);
    kiln_selector_free(s);
}

static void edit_file(const char *key, json_t *value) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    assert_non_null(root);
    json_object_set_new(json_object_get(root, "signature"), key, value);
    assert_int_equal(json_dump_file(root, path, 0), 0);
    json_decref(root);
}

static void write_file(const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_signature(void **state) {
    (void)state;
    kiln_selector *s;
    kiln_err e;
    assert_int_equal(kiln_selector_new(reg, NULL, NULL, &s, &e), KILN_OK);
    kiln_baked *b;
    bool usable;
    char why[512];
    /* other device */
    assert_int_equal(kiln_baked_save(path, s, &device, sites, 3, &e), KILN_OK);
    edit_file("device", json_string("Some Other CPU|isa=7"));
    assert_int_equal(kiln_baked_open(path, s, &device, &b, &usable, why, sizeof why, &e), KILN_OK);
    assert_false(usable);
    assert_non_null(strstr(why, "signature differs: device"));
    kiln_baked_free(b);
    /* other backend (the binding's device context) */
    assert_int_equal(kiln_baked_save(path, s, &device, sites, 3, &e), KILN_OK);
    kiln_sel_ctx refdev;
    kiln_sel_ctx_init(&refdev, KILN_KOP_MATMUL, KILN_BACKEND_REF);
    assert_int_equal(kiln_baked_open(path, s, &refdev, &b, &usable, why, sizeof why, &e), KILN_OK);
    assert_false(usable);
    assert_non_null(strstr(why, "signature differs: backend"));
    kiln_baked_free(b);
    /* other registry (descriptor / availability change) */
    edit_file("registry", json_string("0123456789abcdef"));
    assert_int_equal(kiln_baked_open(path, s, &device, &b, &usable, why, sizeof why, &e), KILN_OK);
    assert_false(usable);
    assert_non_null(strstr(why, "registry"));
    kiln_baked_free(b);
    /* other policy: the file was solved without a lock; now ref is locked */
    assert_int_equal(kiln_baked_save(path, s, &device, sites, 3, &e), KILN_OK);
    kiln_policy pol;
    kiln_policy_init(&pol);
    snprintf(pol.locks[KILN_KOP_MATMUL], sizeof pol.locks[0], "ref.matmul");
    pol.lock_src[KILN_KOP_MATMUL] = KILN_POLICY_SRC_FILE;
    kiln_policy_rehash(&pol);
    kiln_selector_set_policy(s, &pol);
    assert_int_equal(kiln_baked_open(path, s, &device, &b, &usable, why, sizeof why, &e), KILN_OK);
    assert_false(usable);
    assert_non_null(strstr(why, "policy"));
    kiln_baked_free(b);
    kiln_selector_set_policy(s, NULL);
    kiln_selector_free(s);
}

static void test_errors(void **state) {
    (void)state;
    kiln_selector *s;
    kiln_err e;
    assert_int_equal(kiln_selector_new(reg, NULL, NULL, &s, &e), KILN_OK);
    kiln_baked *b = NULL;
    bool usable;
    char why[512];
    /* a table with a hole is not written */
    kiln_baked_site bad = sites[1];
    bad.k[7] = NULL;
    assert_int_equal(kiln_baked_save(path, s, &device, &bad, 1, &e), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(e.msg, "blk.1.ffn.down"));
    assert_non_null(strstr(e.msg, "bucket 7"));
    assert_int_equal(kiln_baked_save(path, s, &device, NULL, 2, &e), KILN_ERR_INVALID_ARG);
    /* nor into a directory that does not exist */
    assert_int_equal(kiln_baked_save("/nonexistent/dir/t.json", s, &device, sites, 3, &e),
                     KILN_ERR_IO);
    assert_non_null(strstr(e.msg, "/nonexistent/dir/t.json"));
    /* malformed files are errors naming the file */
    write_file("{\"schema\": \"kiln.dispatch\", \"schema_version\": 9}");
    assert_int_equal(kiln_baked_open(path, s, &device, &b, &usable, why, sizeof why, &e),
                     KILN_ERR_FORMAT);
    assert_null(b);
    write_file("{\"schema\": ");
    assert_int_equal(kiln_baked_open(path, s, &device, &b, &usable, why, sizeof why, &e),
                     KILN_ERR_FORMAT);
    assert_non_null(strstr(e.msg, path));
    /* a site with the wrong number of buckets */
    assert_int_equal(kiln_baked_save(path, s, &device, sites, 3, &e), KILN_OK);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    json_t *ks = json_object_get(json_array_get(json_object_get(root, "sites"), 1), "kernels");
    json_array_remove(ks, 0);
    json_dump_file(root, path, 0);
    json_decref(root);
    assert_int_equal(kiln_baked_open(path, s, &device, &b, &usable, why, sizeof why, &e),
                     KILN_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "call site 1"));
    assert_null(b);
    /* an unreadable file */
    assert_int_equal(
        kiln_baked_open("/nonexistent/t.json", s, &device, &b, &usable, why, sizeof why, &e),
        KILN_ERR_FORMAT);
    kiln_selector_free(s);
}

static int setup(void **state) {
    (void)state;
    const kiln_provider *ps[] = {&pref, &pf};
    kiln_err e;
    snprintf(path, sizeof path, "%s", kt_write_temp("", 0, ".json"));
    if (kiln_registry_new(ps, 2, NULL, &reg, &e) != KILN_OK) return -1;
    make_sites();
    return 0;
}
static int teardown(void **state) {
    (void)state;
    remove(path);
    kiln_registry_free(reg);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_signature),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
