/* test_dispatch_runtime.c — the runtime's binding function through the selection engine:
 * a call site bound with no table gets the engine's choice; with a baked table (kiln
 * solve's format) it gets the table's kernel; a table with another signature, or one
 * whose kernel cannot run the site, falls back to runtime selection. Selectors belong
 * to devices: a configuration applies to devices opened after it, and the circuit
 * breaker's marks stay on the device that tripped it. */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"
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

static void bake(const kiln_backend *be, const char *path, const char *force_kernel) {
    kiln_device dv = dev_open(be->name);
    kiln_selector *s = kiln_kselect_selector(dv.ks);
    kiln_err e;
    kiln_callsite cs = mm_site();
    kiln_sel_site site;
    memset(&site, 0, sizeof site);
    snprintf(site.name, sizeof site.name, "%s", cs.name);
    kiln_callsite_ctx(be, &cs, &site.ctx);
    site.ctx.tokens_max = 0;
    kiln_dispatch *d;
    assert_int_equal(kiln_dispatch_build(s, &site, 1, &d, &e), KILN_OK);
    assert_int_equal(kiln_dispatch_save(d, s, path, &e), KILN_OK);
    kiln_dispatch_free(d);
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
    assert_int_equal(kiln_rebind_site(&d, &site, &e), KILN_OK);
    kiln_kernel_fn first = site.fn[0];
    const kiln_reg_kernel *rm = kiln_registry_find(kiln_registry_default(), "ref.matmul");
    if (first.any == rm->spec.fn.any) skip(); /* no SIMD kernel on this CPU */
    kiln_err fail;
    kiln_err_set(&fail, KILN_ERR_DEVICE, "simulated failure");
    assert_int_equal(kiln_kernel_failed(&d, first, &fail, &e), KILN_OK);
    assert_int_equal(kiln_rebind_site(&d, &site, &e), KILN_OK);
    for (int b = 0; b < KILN_BUCKETS; b++) assert_true(site.fn[b].any != first.any);
    /* the other device still chooses the kernel */
    kiln_site site2 = site;
    assert_int_equal(kiln_rebind_site(&other, &site2, &e), KILN_OK);
    assert_true(site2.fn[0].any == first.any);
    /* break everything but the reference kernel: the site ends on ref.matmul */
    for (int i = 0; i < 8 && site.fn[0].any != rm->spec.fn.any; i++) {
        assert_int_equal(kiln_kernel_failed(&d, site.fn[0], &fail, &e), KILN_OK);
        assert_int_equal(kiln_rebind_site(&d, &site, &e), KILN_OK);
    }
    assert_true(site.fn[0].any == rm->spec.fn.any);
    assert_int_equal(kiln_kernel_failed(&d, site.fn[0], &fail, &e), KILN_ERR_NOT_FOUND);
    /* a fresh device starts healthy */
    kiln_device_close(&d);
    d = dev_open("cpu");
    assert_int_equal(kiln_rebind_site(&d, &site, &e), KILN_OK);
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
        assert_int_equal(kiln_rebind_site(bp.dev, &bi[i].site[0], &e), KILN_OK);
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
    assert_int_equal(kiln_rebind_site(bp.dev, &bi[0].site[0], &e), KILN_OK);
    kiln_kernel_fn kept = bi[0].site[0].fn[0];
    assert_int_equal(kiln_plan_kernel_failed(&bp, 0, 0, 0, &fail, &e), KILN_ERR_UNSUPPORTED);
    assert_true(bi[0].site[0].fn[0].any == kept.any);
    assert_non_null(strstr(e.msg, "repacked"));
    kiln_device_close(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_binding),
                                       cmocka_unit_test(test_breaker),
                                       cmocka_unit_test(test_plan_breaker)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
