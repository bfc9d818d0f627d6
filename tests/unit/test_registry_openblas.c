/* test_registry_openblas.c — the OpenBLAS provider's kernels against a scalar reference
 * (dequantize each weight row with kiln_dequantize_row, dot in double) on random data
 * of many shapes and every weight dtype the specs declare. Tolerance: |y - ref| <=
 * 1e-4 * sum_i |x_i w_i| + 1e-6 (f32 accumulation in sgemm vs double; the weights are
 * dequantized exactly, so no quantization error enters). Skipped when libopenblas.so.0
 * cannot be loaded (the provider is then unavailable, which test_registry covers). */
#include "base/mem.h"
#include "format/dtype.h"
#include "kernels/registry.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const kiln_reg_kernel *get(const char *id) {
    const kiln_registry *r = kiln_registry_default();
    const kiln_reg_kernel *k = kiln_registry_find(r, id);
    assert_non_null(k);
    return k;
}

static void check_one(const kiln_reg_kernel *k, uint32_t dtype, int64_t n, int64_t kk, int64_t t,
                      bool bias, bool scratch, kt_rng *rng) {
    size_t rb;
    kiln_err e;
    assert_int_equal(kiln_dtype_row_bytes(dtype, kk, &rb, &e), KILN_OK);
    uint8_t *w = malloc(rb * (size_t)n);
    float *wf = malloc(sizeof(float) * (size_t)(n * kk));
    float *x = malloc(sizeof(float) * (size_t)(t * (kk + 3)));
    float *y = malloc(sizeof(float) * (size_t)(t * (n + 5)));
    float *b = malloc(sizeof(float) * (size_t)n);
    assert_true(w && wf && x && y && b);
    float *row = malloc(sizeof(float) * (size_t)kk);
    for (int64_t r = 0; r < n; r++) {
        kt_fill_normal(rng, row, (size_t)kk, 0.5f);
        assert_int_equal(kiln_quantize_row(dtype, row, w + (size_t)r * rb, kk, &e), KILN_OK);
        assert_int_equal(kiln_dequantize_row(dtype, w + (size_t)r * rb, wf + r * kk, kk, &e),
                         KILN_OK);
    }
    free(row);
    kt_fill_normal(rng, x, (size_t)(t * (kk + 3)), 1.0f);
    kt_fill_normal(rng, b, (size_t)n, 1.0f);
    for (int64_t i = 0; i < t * (n + 5); i++) y[i] = NAN;
    kiln_matmul_args a = {.w = w,
                          .w_dtype = dtype,
                          .w_row_bytes = rb,
                          .n = n,
                          .k = kk,
                          .x = x,
                          .x_stride = kk + 3,
                          .y = y,
                          .y_stride = n + 5,
                          .t = t,
                          .bias = bias ? b : NULL};
    size_t ws = (size_t)64 * (size_t)kk * sizeof(float);
    void *sc = scratch ? kiln_alloc_aligned(ws) : NULL;
    kiln_kctx c = {.pool = NULL, .scratch = sc, .scratch_size = scratch ? ws : 0};
    assert_int_equal(k->spec.fn.matmul(&c, &a), KILN_OK);
    for (int64_t ti = 0; ti < t; ti++)
        for (int64_t ni = 0; ni < n; ni++) {
            double ref = bias ? b[ni] : 0, mag = bias ? fabs(b[ni]) : 0;
            for (int64_t i = 0; i < kk; i++) {
                double p = (double)x[ti * (kk + 3) + i] * wf[ni * kk + i];
                ref += p;
                mag += fabs(p);
            }
            double got = y[ti * (n + 5) + ni];
            if (!(fabs(got - ref) <= 1e-4 * mag + 1e-6))
                fail_msg("%s %s n=%lld k=%lld t=%lld: y[%lld][%lld] = %g, want %g", k->spec.id,
                         kiln_dtype_name(dtype), (long long)n, (long long)kk, (long long)t,
                         (long long)ti, (long long)ni, got, ref);
        }
    kiln_free_aligned(sc);
    free(w);
    free(wf);
    free(x);
    free(y);
    free(b);
}

static void test_sgemm(void **state) {
    (void)state;
    const kiln_registry *r = kiln_registry_default();
    int pi = kiln_registry_provider_index(r, "openblas");
    assert_true(pi >= 0);
    if (!r->providers[pi].available) {
        print_message("SKIP: openblas unavailable here (%s)\n", r->providers[pi].why);
        skip();
    }
    kt_rng rng;
    kt_rng_seed(&rng, 6);
    const kiln_reg_kernel *f32 = get("openblas.sgemm.matmul.f32");
    const kiln_reg_kernel *dq = get("openblas.sgemm.matmul.dq");
    static const int64_t shapes[][3] = {{1, 32, 1},    {7, 64, 3},    {65, 256, 17},
                                        {130, 512, 1}, {64, 256, 64}, {3, 768, 129}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t n = shapes[s][0], k = shapes[s][1], t = shapes[s][2];
        check_one(f32, KILN_DTYPE_F32, n, k, t, s % 2, false, &rng);
        static const uint32_t dts[] = {KILN_DTYPE_F16,  KILN_DTYPE_BF16, KILN_DTYPE_Q4_0,
                                       KILN_DTYPE_Q5_0, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K,
                                       KILN_DTYPE_Q6_K};
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
            uint32_t bs = kiln_dtype_get(dts[d])->block_size;
            if (k % bs) continue;
            check_one(dq, dts[d], n, k, t, (s + d) % 2, (s + d) % 3 != 0, &rng);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sgemm)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
