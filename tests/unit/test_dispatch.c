/* test_dispatch.c — baked dispatch tables: solve -> JSON -> load round trips; a table
 * whose signature, call sites or kernels do not match falls back to runtime selection
 * with a warning; malformed files are errors. */
#include "kernels/dispatch.h"
#include "testutil.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
static kiln_sel_site sites[3];
static char path[300];

static void make_sites(void) {
    memset(sites, 0, sizeof sites);
    for (int i = 0; i < 2; i++) {
        snprintf(sites[i].name, sizeof sites[i].name, "blk.%d.ffn.down", i);
        sites[i].instr = 5 + i;
        kiln_sel_ctx_init(&sites[i].ctx, KILN_KOP_MATMUL, KILN_BACKEND_CPU);
        sites[i].ctx.w_dtype = KILN_DTYPE_Q4_K;
        sites[i].ctx.n = 640, sites[i].ctx.k = 2048;
        sites[i].ctx.tokens_max = 2048;
    }
    snprintf(sites[2].name, sizeof sites[2].name, "blk.0.attn.core");
    kiln_sel_ctx_init(&sites[2].ctx, KILN_KOP_ATTENTION, KILN_BACKEND_CPU);
    sites[2].ctx.kv_dtype = KILN_DTYPE_F16;
    sites[2].ctx.head_dim = 256;
    sites[2].ctx.features = KILN_KFEAT_CAUSAL | KILN_KFEAT_PAGED_KV;
    sites[2].ctx.tokens_max = 2048;
    sites[2].ctx.seq_max = 32768;
}

static void same_entries(const kiln_dispatch *a, const kiln_dispatch *b) {
    assert_int_equal(a->n_sites, b->n_sites);
    for (int i = 0; i < a->n_sites; i++)
        for (int k = 0; k < KILN_SEL_BUCKETS; k++) {
            assert_ptr_equal(kiln_dispatch_get(a, i, k)->k, kiln_dispatch_get(b, i, k)->k);
            assert_true(kiln_dispatch_get(a, i, k)->fn.any == kiln_dispatch_get(b, i, k)->fn.any);
        }
}

static void test_roundtrip(void **state) {
    (void)state;
    kiln_selector *s;
    kiln_err e;
    assert_int_equal(kiln_selector_new(reg, NULL, NULL, &s, &e), KILN_OK);
    kiln_dispatch *d, *l;
    assert_int_equal(kiln_dispatch_build(s, sites, 3, &d, &e), KILN_OK);
    assert_string_equal(kiln_dispatch_get(d, 0, kiln_bucket_index(1, 0))->k->spec.id,
                        "f.decode.matmul");
    assert_string_equal(kiln_dispatch_get(d, 0, kiln_bucket_index(100, 0))->k->spec.id,
                        "f.prefill.matmul");
    assert_string_equal(kiln_dispatch_get(d, 2, kiln_bucket_index(1, 30000))->k->spec.id,
                        "ref.attention");
    assert_int_equal(kiln_dispatch_save(d, s, path, &e), KILN_OK);
    bool baked;
    char why[512];
    assert_int_equal(kiln_dispatch_load(s, sites, 3, path, &l, &baked, why, sizeof why, &e),
                     KILN_OK);
    if (!baked) fail_msg("not baked: %s", why);
    same_entries(d, l);
    /* a fresh selector in the same state accepts it too (no selection runs: 0 misses) */
    kiln_selector *s2;
    assert_int_equal(kiln_selector_new(reg, NULL, NULL, &s2, &e), KILN_OK);
    kiln_dispatch *l2;
    assert_int_equal(kiln_dispatch_load(s2, sites, 3, path, &l2, &baked, why, sizeof why, &e),
                     KILN_OK);
    assert_true(baked);
    uint64_t hits, misses;
    kiln_selector_cache_stats(s2, &hits, &misses);
    assert_int_equal(misses, 0);
    kiln_dispatch_free(l2);
    kiln_selector_free(s2);
    kiln_dispatch_free(l);
    kiln_dispatch_free(d);
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

static void test_fallbacks(void **state) {
    (void)state;
    kiln_selector *s;
    kiln_err e;
    assert_int_equal(kiln_selector_new(reg, NULL, NULL, &s, &e), KILN_OK);
    kiln_dispatch *d, *l;
    bool baked;
    char why[512];
    assert_int_equal(kiln_dispatch_build(s, sites, 3, &d, &e), KILN_OK);
    /* other device */
    assert_int_equal(kiln_dispatch_save(d, s, path, &e), KILN_OK);
    edit_file("device", json_string("Some Other CPU|isa=7"));
    assert_int_equal(kiln_dispatch_load(s, sites, 3, path, &l, &baked, why, sizeof why, &e),
                     KILN_OK);
    assert_false(baked);
    assert_non_null(strstr(why, "signature differs: device"));
    same_entries(d, l); /* runtime selection gives the same choices */
    kiln_dispatch_free(l);
    /* other registry (descriptor / availability change) */
    assert_int_equal(kiln_dispatch_save(d, s, path, &e), KILN_OK);
    edit_file("registry", json_string("0123456789abcdef"));
    assert_int_equal(kiln_dispatch_load(s, sites, 3, path, &l, &baked, why, sizeof why, &e),
                     KILN_OK);
    assert_false(baked);
    assert_non_null(strstr(why, "registry"));
    kiln_dispatch_free(l);
    /* other policy: the file was solved without a lock; now ref is locked */
    assert_int_equal(kiln_dispatch_save(d, s, path, &e), KILN_OK);
    kiln_policy pol;
    kiln_policy_init(&pol);
    snprintf(pol.locks[KILN_KOP_MATMUL], sizeof pol.locks[0], "ref.matmul");
    pol.lock_src[KILN_KOP_MATMUL] = KILN_POLICY_SRC_FILE;
    kiln_policy_rehash(&pol);
    kiln_selector_set_policy(s, &pol);
    assert_int_equal(kiln_dispatch_load(s, sites, 3, path, &l, &baked, why, sizeof why, &e),
                     KILN_OK);
    assert_false(baked);
    assert_non_null(strstr(why, "policy"));
    assert_string_equal(kiln_dispatch_get(l, 0, 0)->k->spec.id, "ref.matmul");
    kiln_dispatch_free(l);
    kiln_selector_set_policy(s, NULL);
    /* other call sites */
    kiln_sel_site other[3];
    memcpy(other, sites, sizeof other);
    snprintf(other[1].name, sizeof other[1].name, "blk.1.ffn.up");
    assert_int_equal(kiln_dispatch_load(s, other, 3, path, &l, &baked, why, sizeof why, &e),
                     KILN_OK);
    assert_false(baked);
    assert_non_null(strstr(why, "blk.1.ffn.up"));
    kiln_dispatch_free(l);
    assert_int_equal(kiln_dispatch_load(s, sites, 2, path, &l, &baked, why, sizeof why, &e),
                     KILN_OK);
    assert_false(baked);
    kiln_dispatch_free(l);
    /* a kernel that cannot run the bucket it is baked for */
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    json_t *ks = json_object_get(json_array_get(json_object_get(root, "sites"), 0), "kernels");
    json_array_set_new(ks, (size_t)kiln_bucket_index(600, 0), json_string("f.decode.matmul"));
    json_dump_file(root, path, 0);
    json_decref(root);
    assert_int_equal(kiln_dispatch_load(s, sites, 3, path, &l, &baked, why, sizeof why, &e),
                     KILN_OK);
    assert_false(baked);
    assert_non_null(strstr(why, "TOO_MANY_TOKENS"));
    same_entries(d, l);
    kiln_dispatch_free(l);
    /* malformed files are errors */
    FILE *f = fopen(path, "w");
    fputs("{\"schema\": \"kiln.dispatch\", \"schema_version\": 9}", f);
    fclose(f);
    assert_int_equal(kiln_dispatch_load(s, sites, 3, path, &l, &baked, why, sizeof why, &e),
                     KILN_ERR_FORMAT);
    assert_null(l);
    f = fopen(path, "w");
    fputs("{\"schema\": ", f);
    fclose(f);
    assert_int_equal(kiln_dispatch_load(s, sites, 3, path, &l, &baked, why, sizeof why, &e),
                     KILN_ERR_FORMAT);
    assert_non_null(strstr(e.msg, path));
    kiln_dispatch_free(d);
    kiln_selector_free(s);
}

static int setup(void **state) {
    (void)state;
    const kiln_provider *ps[] = {&pref, &pf};
    kiln_err e;
    make_sites();
    snprintf(path, sizeof path, "%s", kt_write_temp("", 0, ".json"));
    return kiln_registry_new(ps, 2, NULL, &reg, &e) == KILN_OK ? 0 : -1;
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
        cmocka_unit_test(test_fallbacks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
