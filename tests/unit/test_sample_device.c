/*
 * test_sample_device.c — the sampling chain as a kernel (KILN_KOP_SAMPLE): ref.sample,
 * fed by kiln_sampler_device_row, gives kiln_sample_batch's token at every step, for
 * every configuration kiln_sampler_device_ok accepts (k 1 / 40 / 1000 / 4000, greedy and
 * three temperatures, top-p, min-p, penalties with a growing window and logit bias, logits
 * with ties, NaN and -inf), on vocabularies of 7 to 32,000; the configurations it refuses
 * are the ones the CPU runs on its O(n) paths. (tests/gpu/test_cuda_sample.c checks
 * cuda.sample against both.)
 */
#include "testutil.h"

#include "kernels/ref/ref_fused.h"
#include "sample/sample.h"
#include "sample_cases.h"

#include <stdlib.h>
#include <string.h>

#define STEPS 4
#define OVCAP 1024

/* Runs a case for STEPS tokens; returns the steps checked on the kernel. */
static int run_case(const kt_scase *c, uint64_t seed) {
    kiln_logit_bias bias[16];
    kiln_sampler_params p;
    kt_sparams(c, seed, bias, &p);
    kiln_sampler *a, *b;
    assert_int_equal(kiln_sampler_create(&p, c->n, &a, NULL), KILN_OK);
    assert_int_equal(kiln_sampler_create(&p, c->n, &b, NULL), KILN_OK);
    uint64_t x = seed * 7919 + 1;
    /* a history with repeats (some tokens several times) */
    for (int i = 0; i < 40; i++) {
        int32_t t = (int32_t)(kt_srng(&x) % (uint64_t)(i % 3 ? 12 : c->n));
        kiln_sampler_accept(a, t);
        kiln_sampler_accept(b, t);
    }
    float *lg = malloc((size_t)c->n * sizeof(float));
    int32_t ov_id[OVCAP], ov_count[OVCAP];
    float ov_bias[OVCAP];
    assert_non_null(lg);
    int checked = 0;
    for (int st = 0; st < STEPS; st++) {
        kt_slogits(lg, c->n, c->kind, &x);
        kiln_sample_row row = {a, lg};
        kiln_sample_out o;
        assert_int_equal(kiln_sample_batch(&row, 1, c->n, &o, NULL), KILN_OK);
        int32_t tb;
        if (kiln_sampler_device_ok(b, c->n)) {
            kiln_sample_row_params rp;
            rp.ov_off = 0;
            assert_int_equal(
                kiln_sampler_device_row(b, c->n, &rp, ov_id, ov_bias, ov_count, OVCAP, NULL),
                KILN_OK);
            kiln_sample_args sa = {.logits = lg,
                                   .ld = c->n,
                                   .t = 1,
                                   .n = c->n,
                                   .rows = &rp,
                                   .ov_id = ov_id,
                                   .ov_bias = ov_bias,
                                   .ov_count = ov_count,
                                   .ids = &tb};
            assert_int_equal(kiln_ref_sample(NULL, &sa), KILN_OK);
            if (tb != o.token)
                fail_msg("n %d k %d t %g p %g m %g pen %g/%g/%g bias %d kind %d step %d: cpu %d "
                         "kernel %d",
                         (int)c->n, (int)c->k, c->temp, c->top_p, c->min_p, c->rep, c->freq,
                         c->pres, (int)c->n_bias, c->kind, st, (int)o.token, (int)tb);
            checked++;
        } else {
            tb = kiln_sampler_sample(b, lg, c->n); /* keeps the two RNG streams in step */
            assert_int_equal(tb, o.token);
        }
        if (o.token >= 0) {
            kiln_sampler_accept(a, o.token);
            kiln_sampler_accept(b, o.token);
        }
    }
    free(lg);
    kiln_sampler_free(a);
    kiln_sampler_free(b);
    return checked;
}

static void test_ref_kernel_equals_cpu_chain(void **state) {
    (void)state;
    static const int32_t ns[] = {7, 50, 1000, 5003, 32000};
    kt_scase cs[512];
    int total = 0, on = 0;
    for (size_t v = 0; v < sizeof ns / sizeof ns[0]; v++) {
        int m = kt_scases(ns[v], cs, 512);
        for (int i = 0; i < m; i++) {
            if (ns[v] >= 32000 && i % 5) continue; /* the ref sorts every row */
            on += run_case(&cs[i], 1000 * (uint64_t)v + (uint64_t)i);
            total += STEPS;
        }
    }
    print_message("%d of %d steps on the kernel path\n", on, total);
    assert_true(on > total / 2);
}

static void test_device_ok(void **state) {
    (void)state;
    kiln_sampler_params p;
    kiln_sampler *s;
    kiln_sampler_params_default(&p);
    assert_int_equal(kiln_sampler_create(&p, 262144, &s, NULL), KILN_OK);
    assert_true(kiln_sampler_device_ok(s, 262144)); /* the default chain */
    kiln_sampler_free(s);
    p.top_k = 0; /* top-k off on a large vocabulary: the CPU's O(n) path */
    assert_int_equal(kiln_sampler_create(&p, 262144, &s, NULL), KILN_OK);
    assert_false(kiln_sampler_device_ok(s, 262144));
    assert_true(kiln_sampler_device_ok(s, 1000)); /* small: the sorted path */
    kiln_sampler_free(s);
    p.top_p = 1;
    p.min_p = 0; /* every filter off: the two-pass draw */
    assert_int_equal(kiln_sampler_create(&p, 1000, &s, NULL), KILN_OK);
    assert_false(kiln_sampler_device_ok(s, 1000));
    kiln_sampler_free(s);
    kiln_sampler_params_default(&p);
    p.n_logprobs = 0;
    assert_int_equal(kiln_sampler_create(&p, 1000, &s, NULL), KILN_OK);
    assert_false(kiln_sampler_device_ok(s, 1000));
    kiln_sampler_free(s);
    kiln_sampler_params_default(&p);
    p.temperature = 0;
    p.repeat_penalty = 1.2f;
    p.repeat_last_n = -1;
    assert_int_equal(kiln_sampler_create(&p, 100000, &s, NULL), KILN_OK);
    for (int i = 0; i < 20000 && kiln_sampler_device_max_overrides(s) <= 2047; i++) {
        assert_true(kiln_sampler_device_ok(s, 100000)); /* 1 + 2 x overrides <= 4096 */
        kiln_sampler_accept(s, i);
    }
    assert_true(kiln_sampler_device_max_overrides(s) > 2047);
    assert_false(kiln_sampler_device_ok(s, 100000));
    kiln_sampler_free(s);
}

/* Overrides: sorted, distinct, bias summed, counts over the window, ids >= n dropped. */
static void test_device_row(void **state) {
    (void)state;
    kiln_logit_bias bias[] = {{9, 1.5f}, {3, -INFINITY}, {9, 0.5f}, {99, 2.0f}};
    kiln_sampler_params p;
    kiln_sampler_params_default(&p);
    p.repeat_penalty = 1.1f;
    p.repeat_last_n = 4;
    p.logit_bias = bias;
    p.n_logit_bias = 4;
    p.seed = 5;
    kiln_sampler *s;
    assert_int_equal(kiln_sampler_create(&p, 100, &s, NULL), KILN_OK);
    const int32_t hist[] = {1, 7, 7, 9, 3, 7}; /* window: 7 9 3 7 */
    for (int i = 0; i < 6; i++) kiln_sampler_accept(s, hist[i]);
    kiln_sample_row_params rp;
    int32_t id[8], cnt[8];
    float b[8];
    rp.ov_off = 3;
    assert_int_equal(kiln_sampler_device_row(s, 50, &rp, id, b, cnt, 8, NULL), KILN_OK);
    assert_int_equal(rp.ov_off, 3);
    assert_int_equal(rp.n_ov, 3);
    assert_int_equal(id[0], 3);
    assert_true(b[0] == -INFINITY);
    assert_int_equal(cnt[0], 1);
    assert_int_equal(id[1], 7);
    assert_true(b[1] == 0.0f);
    assert_int_equal(cnt[1], 2);
    assert_int_equal(id[2], 9);
    assert_true(b[2] == 2.0f);
    assert_int_equal(cnt[2], 1);
    assert_true(rp.log_min_p == logf(0.05f));
    kiln_rng r;
    kiln_rng_seed(&r, 5);
    assert_true(rp.u == kiln_rng_uniform(&r)); /* the sampler's first draw */
    assert_int_equal(kiln_sampler_device_row(s, 50, &rp, id, b, cnt, 2, NULL), KILN_ERR_RANGE);
    kiln_sampler_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_ok),
        cmocka_unit_test(test_device_row),
        cmocka_unit_test(test_ref_kernel_equals_cpu_chain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
