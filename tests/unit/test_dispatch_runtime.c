/* test_dispatch_runtime.c — the runtime's binding function through the selection engine:
 * a call site bound with no table gets the engine's choice; the bound table saved
 * (kiln solve's path) and bound again from the file gives the same kernels; with a
 * baked table it gets the table's kernel; a table with another signature, or one
 * whose kernel cannot run the site, falls back to runtime selection. Selectors belong
 * to devices: a configuration applies to devices opened after it, and the circuit
 * breaker's marks stay on the device that tripped it. */
#include "kernels/cpu/cpu_kernels.h"
#include "base/log.h"
#include "runtime/exec.h"
#include "runtime/kselect.h"
#include "testutil.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static kiln_callsite mm_site(void) {
    kiln_callsite cs;
    memset(&cs, 0, sizeof cs);
    cs.op = KILN_KOP_MATMUL;
    snprintf(cs.name, sizeof cs.name, "blk.0.ffn.down");
    cs.w_dtype = KILN_DTYPE_Q4_K;
    cs.n = 640;
    cs.k = 2048;
    return cs;
}

/* a device of backend `name` opened with the current configuration */
static kiln_device dev_open(const char *name) {
    kiln_device d;
    kiln_err e;
    assert_int_equal(kiln_device_open(kiln_backend_find(name), 0, &d, &e), KILN_OK);
    return d;
}

/* a one-instruction bound plan on device d whose call sites are the given descriptions,
 * bound by the plan binding's own function */
typedef struct fake_plan {
    kiln_bound_plan bp;
    kiln_bound_insn bi;
} fake_plan;

static void fake_bind(fake_plan *f, kiln_device *d, const kiln_callsite *cs, int n) {
    memset(f, 0, sizeof *f);
    f->bp.be = d->be;
    f->bp.dev = d;
    f->bp.bi = &f->bi;
    f->bp.plan.n_insns = 1;
    f->bi.n_sites = n;
    kiln_err e;
    for (int i = 0; i < n; i++) {
        f->bi.site[i].desc = cs[i];
        f->bi.site[i].widx = -1;
        assert_int_equal(kiln_bind_site(d, &f->bi.site[i], &e), KILN_OK);
    }
}

/* kiln solve's path: the bound plan's table, written with kiln_bound_plan_save_dispatch;
 * force_kernel (may be NULL) then replaces every entry */
static void bake(const kiln_backend *be, const char *path, const char *force_kernel) {
    kiln_device dv = dev_open(be->name);
    kiln_err e;
    kiln_callsite cs = mm_site();
    fake_plan f;
    fake_bind(&f, &dv, &cs, 1);
    assert_int_equal(kiln_bound_plan_save_dispatch(&f.bp, path, &e), KILN_OK);
    if (force_kernel) {
        json_error_t je;
        json_t *root = json_load_file(path, 0, &je);
        json_t *ks = json_object_get(json_array_get(json_object_get(root, "sites"), 0), "kernels");
        for (size_t b = 0; b < json_array_size(ks); b++)
            json_array_set_new(ks, b, json_string(force_kernel));
        json_dump_file(root, path, 0);
        json_decref(root);
    }
    kiln_device_close(&dv);
}

static int not_used_warnings;
static void warn_sink(kiln_log_level l, const char *line, void *u) {
    (void)l, (void)u;
    if (strstr(line, "dispatch table")) not_used_warnings++;
}

/* one dispatch table: what a bound plan saves is what a binding with that file gets,
 * site by site and bucket by bucket, silently; the file holds the runtime's choice of
 * every token bucket in each of its context buckets */
static void test_bake_roundtrip(void **state) {
    (void)state;
    kiln_err e;
    char path[512];
    snprintf(path, sizeof path, "%s", kt_write_temp("", 0, ".json"));
    assert_int_equal(kiln_runtime_selector_configure(NULL, "/nonexistent/perf.sqlite", NULL, &e),
                     KILN_OK);
    kiln_callsite cs[4];
    cs[0] = mm_site();
    cs[1] = mm_site();
    snprintf(cs[1].name, sizeof cs[1].name, "blk.0.attn.q");
    cs[1].w_dtype = KILN_DTYPE_Q8_0;
    cs[1].n = cs[1].k = 256;
    memset(&cs[2], 0, sizeof cs[2]);
    cs[2].op = KILN_KOP_ATTENTION;
    snprintf(cs[2].name, sizeof cs[2].name, "blk.0.attn.core");
    cs[2].kv_dtype = KILN_DTYPE_F16;
    cs[2].head_dim = 64;
    cs[2].n = 64;
    cs[2].n_head = 4;
    cs[2].n_kv_head = 1;
    cs[2].features = KILN_CS_GQA | KILN_CS_PAGED | KILN_CS_CAUSAL;
    memset(&cs[3], 0, sizeof cs[3]);
    cs[3].op = KILN_KOP_RMS_NORM;
    snprintf(cs[3].name, sizeof cs[3].name, "blk.0.norm");
    cs[3].w_dtype = KILN_DTYPE_F32;
    cs[3].n = 640;
    for (int i = 0; i < 4; i++) cs[i].max_tokens = 2048;
    kiln_device a = dev_open("cpu");
    fake_plan fa;
    fake_bind(&fa, &a, cs, 4);
    assert_int_equal(kiln_bound_plan_save_dispatch(&fa.bp, path, &e), KILN_OK);
    /* the file: every site, 20 buckets, a token bucket's kernel in all its context buckets */
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    assert_non_null(root);
    json_t *sites = json_object_get(root, "sites");
    assert_int_equal(json_array_size(sites), 4);
    for (int i = 0; i < 4; i++) {
        json_t *o = json_array_get(sites, (size_t)i);
        assert_string_equal(json_string_value(json_object_get(o, "name")), cs[i].name);
        json_t *ks = json_object_get(o, "kernels");
        assert_int_equal(json_array_size(ks), KILN_SEL_BUCKETS);
        for (int b = 0; b < KILN_SEL_BUCKETS; b++)
            assert_string_equal(json_string_value(json_array_get(ks, (size_t)b)),
                                fa.bi.site[i].kernel[b / KILN_SEQ_BUCKETS]->spec.id);
    }
    json_decref(root);
    /* a device bound with the file gets exactly the saved table, with no warning */
    assert_int_equal(kiln_runtime_selector_configure(NULL, "/nonexistent/perf.sqlite", path, &e),
                     KILN_OK);
    kiln_device b = dev_open("cpu");
    kiln_log_set_sink(warn_sink, NULL);
    kiln_log_set_level(KILN_LOG_WARN);
    not_used_warnings = 0;
    fake_plan fb;
    fake_bind(&fb, &b, cs, 4);
    kiln_log_set_sink(NULL, NULL);
    assert_int_equal(not_used_warnings, 0);
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < KILN_BUCKETS; t++) {
            assert_ptr_equal(fb.bi.site[i].kernel[t], fa.bi.site[i].kernel[t]);
            assert_true(fb.bi.site[i].fn[t].any == fa.bi.site[i].fn[t].any);
            assert_int_equal(fb.bi.site[i].layout[t], fa.bi.site[i].layout[t]);
            assert_true(fb.bi.site[i].fn[t].any == fb.bi.site[i].kernel[t]->spec.fn.any);
        }
    /* a plan with no call sites has no table to write */
    kiln_bound_plan empty;
    memset(&empty, 0, sizeof empty);
    empty.dev = &b;
    assert_int_equal(kiln_bound_plan_save_dispatch(&empty, path, &e), KILN_ERR_STATE);
    /* an unwritable path is an I/O error naming it */
    assert_int_not_equal(kiln_bound_plan_save_dispatch(&fa.bp, "/nonexistent/dir/t.json", &e),
                         KILN_OK);
    assert_non_null(strstr(e.msg, "/nonexistent/dir/t.json"));
    kiln_device_close(&b);
    kiln_device_close(&a);
    assert_int_equal(kiln_runtime_selector_configure(NULL, NULL, NULL, &e), KILN_OK);
    remove(path);
}

static void test_binding(void **state) {
    (void)state;
    const kiln_backend *cpu = kiln_backend_find("cpu");
    assert_non_null(cpu);
    if (!kiln_cpu_avx2_ok()) skip(); /* the forced kernel needs AVX2 */
    kiln_err e;
    char path[512];
    snprintf(path, sizeof path, "%s", kt_write_temp("", 0, ".json"));
    /* no table: the engine's choice */
    assert_int_equal(kiln_runtime_selector_configure(NULL, "/nonexistent/perf.sqlite", NULL, &e),
                     KILN_OK);
    kiln_callsite cs = mm_site();
    kiln_kernel_fn fn;
    kiln_device d = dev_open("cpu");
    assert_int_equal(kiln_bind_callsite(&d, &cs, &fn, NULL, &e), KILN_OK);
    kiln_device_close(&d);
    kiln_kernel_fn engine_choice = fn;
    assert_true(fn.matmul != kiln_cpu_matmul_avx2 || !kiln_cpu_avx512_ok());
    /* a table that forces the AVX2 kernel */
    bake(cpu, path, "cpu.avx2.matmul");
    assert_int_equal(kiln_runtime_selector_configure(NULL, "/nonexistent/perf.sqlite", path, &e),
                     KILN_OK);
    d = dev_open("cpu");
    for (int b = 0; b < KILN_TOK_BUCKETS; b++) {
        cs.bucket = b;
        assert_int_equal(kiln_bind_callsite(&d, &cs, &fn, NULL, &e), KILN_OK);
        assert_true(fn.matmul == kiln_cpu_matmul_avx2);
    }
    kiln_device_close(&d);
    /* another signature: runtime selection again */
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    json_object_set_new(json_object_get(root, "signature"), "device", json_string("elsewhere"));
    json_dump_file(root, path, 0);
    json_decref(root);
    assert_int_equal(kiln_runtime_selector_configure(NULL, "/nonexistent/perf.sqlite", path, &e),
                     KILN_OK);
    cs.bucket = 0;
    d = dev_open("cpu");
    assert_int_equal(kiln_bind_callsite(&d, &cs, &fn, NULL, &e), KILN_OK);
    kiln_device_close(&d);
    assert_true(fn.any == engine_choice.any);
    /* a kernel that cannot run the site (q4_K weights on the f32 sgemm): runtime selection */
    bake(cpu, path, "openblas.sgemm.matmul.f32");
    assert_int_equal(kiln_runtime_selector_configure(NULL, "/nonexistent/perf.sqlite", path, &e),
                     KILN_OK);
    d = dev_open("cpu");
    assert_int_equal(kiln_bind_callsite(&d, &cs, &fn, NULL, &e), KILN_OK);
    kiln_device_close(&d);
    assert_true(fn.any == engine_choice.any);
    /* the ref backend binds reference kernels only */
    assert_int_equal(kiln_runtime_selector_configure(NULL, "/nonexistent/perf.sqlite", NULL, &e),
                     KILN_OK);
    d = dev_open("ref");
    assert_int_equal(kiln_bind_callsite(&d, &cs, &fn, NULL, &e), KILN_OK);
    kiln_device_close(&d);
    const kiln_reg_kernel *rm = kiln_registry_find(kiln_registry_default(), "ref.matmul");
    assert_true(fn.any == rm->spec.fn.any);
    /* an unreadable table is an error */
    assert_int_not_equal(kiln_runtime_selector_configure(NULL, NULL, "/nonexistent/table.json", &e),
                         KILN_OK);
    assert_non_null(strstr(e.msg, "/nonexistent/table.json"));
    remove(path);
}

/* circuit breaker at the runtime level: the failed kernel is never chosen again on
 * that device and the site is rebound to the next candidate; the reference kernel is
 * never broken; another device keeps its kernels */
static void test_breaker(void **state) {
    (void)state;
    kiln_err e;
    assert_int_equal(kiln_runtime_selector_configure(NULL, "/nonexistent/perf.sqlite", NULL, &e),
                     KILN_OK);
    kiln_device d = dev_open("cpu"), other = dev_open("cpu");
    kiln_site site;
    memset(&site, 0, sizeof site);
    site.desc = mm_site();
    site.widx = -1;
    assert_int_equal(kiln_bind_site(&d, &site, &e), KILN_OK);
    kiln_kernel_fn first = site.fn[0];
    const kiln_reg_kernel *rm = kiln_registry_find(kiln_registry_default(), "ref.matmul");
    if (first.any == rm->spec.fn.any) skip(); /* no SIMD kernel on this CPU */
    kiln_err fail;
    kiln_err_set(&fail, KILN_ERR_DEVICE, "simulated failure");
    assert_int_equal(kiln_kernel_failed(&d, first, &fail, &e), KILN_OK);
    assert_int_equal(kiln_bind_site(&d, &site, &e), KILN_OK);
    for (int b = 0; b < KILN_BUCKETS; b++) assert_true(site.fn[b].any != first.any);
    /* the other device still chooses the kernel */
    kiln_site site2 = site;
    assert_int_equal(kiln_bind_site(&other, &site2, &e), KILN_OK);
    assert_true(site2.fn[0].any == first.any);
    /* break everything but the reference kernel: the site ends on ref.matmul */
    for (int i = 0; i < 8 && site.fn[0].any != rm->spec.fn.any; i++) {
        assert_int_equal(kiln_kernel_failed(&d, site.fn[0], &fail, &e), KILN_OK);
        assert_int_equal(kiln_bind_site(&d, &site, &e), KILN_OK);
    }
    assert_true(site.fn[0].any == rm->spec.fn.any);
    assert_int_equal(kiln_kernel_failed(&d, site.fn[0], &fail, &e), KILN_ERR_NOT_FOUND);
    /* a fresh device starts healthy */
    kiln_device_close(&d);
    d = dev_open("cpu");
    assert_int_equal(kiln_bind_site(&d, &site, &e), KILN_OK);
    assert_true(site.fn[0].any == first.any);
    kiln_device_close(&d);
    kiln_device_close(&other);
}

/* the executor's hook: a failed call site of a bound plan is traced to its kernel, which
 * is replaced in every site that used it */
static void test_plan_breaker(void **state) {
    (void)state;
    kiln_err e;
    assert_int_equal(kiln_runtime_selector_configure(NULL, "/nonexistent/perf.sqlite", NULL, &e),
                     KILN_OK);
    kiln_bound_plan bp;
    memset(&bp, 0, sizeof bp);
    kiln_bound_insn bi[2];
    memset(bi, 0, sizeof bi);
    kiln_device d = dev_open("cpu");
    bp.be = d.be;
    bp.dev = &d;
    bp.bi = bi;
    bp.plan.n_insns = 2;
    for (int i = 0; i < 2; i++) {
        bi[i].n_sites = 1;
        bi[i].site[0].desc = mm_site();
        bi[i].site[0].widx = -1;
        assert_int_equal(kiln_bind_site(bp.dev, &bi[i].site[0], &e), KILN_OK);
    }
    kiln_kernel_fn first = bi[0].site[0].fn[0];
    const kiln_reg_kernel *rm = kiln_registry_find(kiln_registry_default(), "ref.matmul");
    if (first.any == rm->spec.fn.any) skip();
    kiln_err fail;
    kiln_err_set(&fail, KILN_ERR_DEVICE, "simulated");
    assert_int_equal(kiln_plan_kernel_failed(&bp, 0, 0, 0, &fail, &e), KILN_OK);
    for (int i = 0; i < 2; i++) assert_true(bi[i].site[0].fn[0].any != first.any);
    assert_int_not_equal(kiln_plan_kernel_failed(&bp, 5, 0, 0, &fail, &e), KILN_OK);
    /* a weight already repacked for its kernel: no plain-row kernel may replace it */
    kiln_device_close(&d);
    d = dev_open("cpu");
    uint8_t dummy[16];
    bi[0].w[0] = (kiln_bound_weight){.data = dummy, .dtype = KILN_DTYPE_Q4_K, .layout = 7};
    bi[0].site[0].widx = 0;
    assert_int_equal(kiln_bind_site(bp.dev, &bi[0].site[0], &e), KILN_OK);
    kiln_kernel_fn kept = bi[0].site[0].fn[0];
    assert_int_equal(kiln_plan_kernel_failed(&bp, 0, 0, 0, &fail, &e), KILN_ERR_UNSUPPORTED);
    assert_true(bi[0].site[0].fn[0].any == kept.any);
    assert_non_null(strstr(e.msg, "repacked"));
    kiln_device_close(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_binding), cmocka_unit_test(test_bake_roundtrip),
        cmocka_unit_test(test_breaker), cmocka_unit_test(test_plan_breaker)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
