/* test_onednn.c — the oneDNN provider's kernels against the ref matmul on random data over
 * many shapes (odd n and k, n across the 256-row chunk boundary, t = 1..128, strided x
 * and y, bias on and off, 1 and 2 threads, scratch given or not).
 *
 * Tolerances (per output y[t][n], with mag = sum_i |x_i w_i| in double):
 *  - onednn.f32.matmul (f32, f16, bf16 weights, widened exactly):
 *      |y - ref.matmul| <= 1e-5 mag + 1e-6   (two f32 sums in different orders)
 *  - onednn.bf16.matmul: against the same sum over bf16-rounded x and w in double:
 *      |y - emul| <= 1e-5 mag + 1e-6          (bf16 products are exact in f32; f32 sum)
 *    and against ref.matmul the rounding bound: each input moves by <= 2^-9 relative, so
 *      |y - ref| <= (2^-8 + 2^-18 + 1e-5) mag + 1e-6
 *  - onednn.s8.matmul.q8_0: against an emulation of the two quantizations (per-token s8
 *    activations, q8_0 re-quantized to one s8 scale per row, integer sums):
 *      |y - emul| <= 1e-5 mag_q + 1e-6        (the f32 rescale of an exact int32 sum)
 *    and against ref.matmul the quantization bound (half a step of each scale):
 *      |y - ref| <= sum_i (|x_i| sw/2 + |w_i| sx/2 + sx sw/4) + 1e-5 mag + 1e-6
 *    The measured error against ref.matmul (max over outputs of |y - ref| / mag, and the
 *    RMS of y - ref over the RMS of ref) is printed for docs/CPU.md.
 * The s8 weight cache is limited to 0.2 MiB here, so both its cached and its per-chunk
 * re-quantization paths are checked.
 * Skipped, with the reason, when the provider is unavailable (built without oneDNN). */
#include "base/cpu.h"
#include "base/mem.h"
#include "base/pool.h"
#include "format/dtype.h"
#include "kernels/registry.h"
#include "kernels/select.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const kiln_reg_kernel *get(const char *id) {
    const kiln_reg_kernel *k = kiln_registry_find(kiln_registry_default(), id);
    assert_non_null(k);
    return k;
}

static bool available(void) {
    const kiln_registry *r = kiln_registry_default();
    int pi = kiln_registry_provider_index(r, "onednn");
    assert_true(pi >= 0);
    if (r->providers[pi].available) return true;
    /* built without oneDNN: the provider must have no kernels at all */
    if (r->providers[pi].p->n_specs == 0) {
        print_message("SKIP: onednn provider unavailable (%s)\n", r->providers[pi].why);
        return false;
    }
    fail_msg("onednn has kernels but is unavailable: %s", r->providers[pi].why);
    return false;
}

/* the kernel's per-token quantization, step for step */
static float emul_quant_x(const float *x, float *xq, int64_t k) {
    float amax = 0;
    for (int64_t i = 0; i < k; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float s = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (int64_t i = 0; i < k; i++) xq[i] = (float)lrintf(x[i] * inv);
    return s;
}

/* the kernel's q8_0 row re-quantization, step for step */
static float emul_requant(const uint8_t *row, float *wq, int64_t k) {
    float amax = 0;
    for (int64_t b = 0; b < k / 32; b++) {
        uint16_t dh;
        memcpy(&dh, row + b * 34, 2);
        float d = fabsf(kiln_fp16_to_f32(dh));
        int m = 0;
        for (int i = 0; i < 32; i++) {
            int v = abs((int8_t)row[b * 34 + 2 + i]);
            m = v > m ? v : m;
        }
        if (d * (float)m > amax) amax = d * (float)m;
    }
    float s = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (int64_t b = 0; b < k / 32; b++) {
        uint16_t dh;
        memcpy(&dh, row + b * 34, 2);
        float f = kiln_fp16_to_f32(dh) * inv;
        for (int i = 0; i < 32; i++) {
            long v = lrintf((float)(int8_t)row[b * 34 + 2 + i] * f);
            wq[b * 32 + i] = (float)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
    }
    return s;
}

typedef struct errstat {
    double max_rel, se, sref;
} errstat;

static void check_one(const kiln_reg_kernel *k, uint32_t dtype, int64_t n, int64_t kk, int64_t t,
                      bool bias, bool scratch, kiln_pool *pool, kt_rng *rng, errstat *es) {
    size_t rb;
    kiln_err e;
    kiln_err_clear(&e);
    assert_int_equal(kiln_dtype_row_bytes(dtype, kk, &rb, &e), KILN_OK);
    int64_t xs = kk + 3, ys = n + 5;
    uint8_t *w = malloc(rb * (size_t)n);
    float *wf = malloc(sizeof(float) * (size_t)(n * kk));
    float *x = malloc(sizeof(float) * (size_t)(t * xs));
    float *y = malloc(sizeof(float) * (size_t)(t * ys));
    float *yr = malloc(sizeof(float) * (size_t)(t * ys));
    float *b = malloc(sizeof(float) * (size_t)n);
    float *row = malloc(sizeof(float) * (size_t)kk);
    float *wq = malloc(sizeof(float) * (size_t)(n * kk)), *wsc = malloc(sizeof(float) * (size_t)n);
    float *xq = malloc(sizeof(float) * (size_t)kk);
    assert_true(w && wf && x && y && yr && b && row && wq && wsc && xq);
    for (int64_t r = 0; r < n; r++) {
        /* blocks of different magnitude, as in real weights (q8_0 block scales differ) */
        kt_fill_normal(rng, row, (size_t)kk, 0.5f);
        for (int64_t i = 0; i < kk; i++) row[i] *= 0.25f + (float)((i / 32 + r) % 7) * 0.3f;
        assert_int_equal(kiln_quantize_row(dtype, row, w + (size_t)r * rb, kk, &e), KILN_OK);
        assert_int_equal(kiln_dequantize_row(dtype, w + (size_t)r * rb, wf + r * kk, kk, &e),
                         KILN_OK);
        if (dtype == KILN_DTYPE_Q8_0) wsc[r] = emul_requant(w + (size_t)r * rb, wq + r * kk, kk);
    }
    kt_fill_normal(rng, x, (size_t)(t * xs), 1.0f);
    if (t > 1) x[xs + kk / 2] = 6.0f; /* an outlier: per-token scales must cope */
    kt_fill_normal(rng, b, (size_t)n, 1.0f);
    for (int64_t i = 0; i < t * ys; i++) y[i] = yr[i] = NAN;
    kiln_matmul_args a = {.w = w,
                          .w_dtype = dtype,
                          .w_row_bytes = rb,
                          .n = n,
                          .k = kk,
                          .x = x,
                          .x_stride = xs,
                          .y = yr,
                          .y_stride = ys,
                          .t = t,
                          .bias = bias ? b : NULL};
    assert_int_equal(get("ref.matmul")->spec.fn.matmul(&(kiln_kctx){0}, &a), KILN_OK);
    kiln_sel_ctx sc;
    kiln_sel_ctx_init(&sc, KILN_KOP_MATMUL, KILN_BACKEND_CPU);
    sc.w_dtype = dtype;
    sc.n = n;
    sc.k = kk;
    sc.tokens_max = t;
    size_t ws = k->spec.workspace(&sc);
    void *scr = scratch ? kiln_alloc_aligned(ws) : NULL;
    kiln_kctx c = {.pool = pool, .scratch = scr, .scratch_size = scratch ? ws : 0};
    a.y = y;
    kiln_status st = k->spec.fn.matmul(&c, &a);
    if (st)
        fail_msg("%s %s n=%lld k=%lld t=%lld: %s", k->spec.id, kiln_dtype_name(dtype), (long long)n,
                 (long long)kk, (long long)t, kiln_status_name(st));
    bool is_bf16 = strstr(k->spec.id, "bf16") != NULL, is_s8 = strstr(k->spec.id, "s8") != NULL;
    for (int64_t ti = 0; ti < t; ti++) {
        const float *xt = x + ti * xs;
        float sx = is_s8 ? emul_quant_x(xt, xq, kk) : 0;
        for (int64_t ni = 0; ni < n; ni++) {
            double mag = bias ? fabs(b[ni]) : 0, emul = bias ? b[ni] : 0, qmag = mag, qb = 0;
            double acc = 0;
            for (int64_t i = 0; i < kk; i++) {
                float wv = wf[ni * kk + i], xv = xt[i];
                mag += fabs((double)xv * wv);
                if (is_bf16) {
                    acc += (double)kiln_bf16_to_f32(kiln_f32_to_bf16(xv)) *
                           kiln_bf16_to_f32(kiln_f32_to_bf16(wv));
                } else if (is_s8) {
                    double p = (double)xq[i] * wq[ni * kk + i];
                    acc += p;
                    qmag += fabs(p) * sx * wsc[ni];
                    qb += fabs(xv) * wsc[ni] / 2 + fabs(wv) * sx / 2 + (double)sx * wsc[ni] / 4;
                }
            }
            emul += is_s8 ? (double)(float)acc * sx * wsc[ni] : acc;
            double got = y[ti * ys + ni], ref = yr[ti * ys + ni];
            double bound = is_s8     ? qb + 1e-5 * mag
                           : is_bf16 ? (0x1p-8 + 0x1p-18 + 1e-5) * mag
                                     : 1e-5 * mag;
            if (!(fabs(got - ref) <= bound + 1e-6))
                fail_msg("%s %s n=%lld k=%lld t=%lld: y[%lld][%lld] = %.9g, ref.matmul %.9g "
                         "(bound %.3g)",
                         k->spec.id, kiln_dtype_name(dtype), (long long)n, (long long)kk,
                         (long long)t, (long long)ti, (long long)ni, got, ref, bound);
            if ((is_bf16 || is_s8) && !(fabs(got - emul) <= 1e-5 * (is_s8 ? qmag : mag) + 1e-6))
                fail_msg("%s %s n=%lld k=%lld t=%lld: y[%lld][%lld] = %.9g, emulation %.9g",
                         k->spec.id, kiln_dtype_name(dtype), (long long)n, (long long)kk,
                         (long long)t, (long long)ti, (long long)ni, got, emul);
            double rel = mag > 0 ? fabs(got - ref) / mag : 0;
            if (rel > es->max_rel) es->max_rel = rel;
            es->se += (got - ref) * (got - ref);
            es->sref += ref * ref;
        }
        /* the stride gap is never written */
        for (int64_t ni = n; ni < ys; ni++) assert_true(isnan(y[ti * ys + ni]));
    }
    kiln_free_aligned(scr);
    free(w), free(wf), free(x), free(y), free(yr), free(b), free(row), free(wq), free(wsc);
    free(xq);
}

static const int64_t shapes[][3] = {
    /* n, k, t */
    {1, 32, 1},     {7, 64, 3},    {37, 96, 17},   {256, 128, 64},  {300, 160, 65},
    {515, 64, 128}, {257, 256, 2}, {130, 512, 33}, {512, 224, 100}, {1, 768, 128},
};

static void run_kernel(const char *id, const uint32_t *dts, int n_dts, bool odd_k) {
    const kiln_reg_kernel *k = get(id);
    if (!kiln_registry_kernel_available(kiln_registry_default(), k) ||
        (k->spec.isa & kiln_cpu_info()->isa) != k->spec.isa) {
        print_message("SKIP: %s cannot run on this CPU\n", id);
        return;
    }
    kiln_pool *pool = NULL;
    assert_int_equal(kiln_pool_create(2, &pool, NULL), KILN_OK);
    kt_rng rng;
    kt_rng_seed(&rng, 7 + (uint64_t)strlen(id));
    for (int d = 0; d < n_dts; d++) {
        errstat es = {0};
        int runs = 0;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int64_t n = shapes[s][0], kk = shapes[s][1], t = shapes[s][2];
            if (odd_k && s % 3 == 1) kk += 7; /* k not a multiple of 8 or 16 */
            check_one(k, dts[d], n, kk, t, s % 2, s % 3 != 0, s % 2 ? pool : NULL, &rng, &es);
            runs++;
        }
        print_message("%s %s: %d shapes ok; error vs ref.matmul: max |y-ref|/sum|wx| %.3g, "
                      "rms(y-ref)/rms(ref) %.3g\n",
                      id, kiln_dtype_name(dts[d]), runs, es.max_rel,
                      es.sref > 0 ? sqrt(es.se / es.sref) : 0.0);
    }
    kiln_pool_free(pool);
}

static void test_f32(void **state) {
    (void)state;
    if (!available()) skip();
    static const uint32_t dts[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};
    run_kernel("onednn.f32.matmul", dts, 3, true);
}

static void test_bf16(void **state) {
    (void)state;
    if (!available()) skip();
    static const uint32_t dts[] = {KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_F32};
    run_kernel("onednn.bf16.matmul", dts, 3, true);
}

static void test_s8(void **state) {
    (void)state;
    if (!available()) skip();
    static const uint32_t dts[] = {KILN_DTYPE_Q8_0};
    run_kernel("onednn.s8.matmul.q8_0", dts, 1, false);
    const kiln_reg_kernel *k8 = get("onednn.s8.matmul.q8_0");
    if ((k8->spec.isa & kiln_cpu_info()->isa) != k8->spec.isa) return; /* said by run_kernel */
    /* the weight cache: the same tensor again (cached) gives the same bits */
    kt_rng rng;
    kt_rng_seed(&rng, 99);
    errstat es = {0};
    check_one(get("onednn.s8.matmul.q8_0"), KILN_DTYPE_Q8_0, 300, 128, 70, true, true, NULL, &rng,
              &es);
}

/* Wrong dtype or layout is refused, never computed. */
static void test_refuses(void **state) {
    (void)state;
    if (!available()) skip();
    float x[64] = {0}, y[4];
    uint8_t w[4 * 34 * 2] = {0};
    kiln_matmul_args a = {.w = w,
                          .w_dtype = KILN_DTYPE_Q4_0,
                          .w_row_bytes = 18,
                          .n = 4,
                          .k = 32,
                          .x = x,
                          .x_stride = 32,
                          .y = y,
                          .y_stride = 4,
                          .t = 1};
    kiln_kctx c = {0};
    assert_int_equal(get("onednn.f32.matmul")->spec.fn.matmul(&c, &a), KILN_ERR_TYPE);
    assert_int_equal(get("onednn.s8.matmul.q8_0")->spec.fn.matmul(&c, &a), KILN_ERR_TYPE);
    a.w_dtype = KILN_DTYPE_F16;
    a.w_row_bytes = 64;
    a.w_layout = KILN_WLAYOUT_CPU_R16;
    assert_int_equal(get("onednn.f32.matmul")->spec.fn.matmul(&c, &a), KILN_ERR_UNSUPPORTED);
}

int main(void) {
    /* a small s8 weight cache: the first tensors are cached, the later ones exceed it and
     * are re-quantized per chunk, so both paths run (read once, when the provider loads) */
    setenv("KILN_ONEDNN_CACHE_MB", "0.2", 1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_f32), cmocka_unit_test(test_bf16),
                                       cmocka_unit_test(test_s8), cmocka_unit_test(test_refuses)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
