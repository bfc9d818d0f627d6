/* test_sample.c — samplers (greedy, temperature, top-k, top-p, min-p, penalties,
 * seeds) and stop strings across token boundaries. */
#include "testutil.h"

#include "sample/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static kiln_sampler *mk(float temp, int top_k, float top_p, float min_p, uint64_t seed) {
    kiln_sampler_params p;
    kiln_sampler_params_default(&p);
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = seed;
    kiln_sampler *s;
    assert_int_equal(kiln_sampler_create(&p, 8, &s, NULL), KILN_OK);
    return s;
}

static const float L[8] = {1.0f, 3.0f, 2.5f, -1.0f, 3.0f, 0.0f, -INFINITY, NAN};

static void test_greedy(void **state) {
    (void)state;
    kiln_sampler *s = mk(0, 0, 1, 0, 1);
    /* tie between 1 and 4: lowest id */
    assert_int_equal(kiln_sampler_sample(s, L, 8), 1);
    /* restricting the candidates to the first n */
    assert_int_equal(kiln_sampler_sample(s, L, 1), 0);
    float all_bad[2] = {-INFINITY, NAN};
    assert_int_equal(kiln_sampler_sample(s, all_bad, 2), -1);
    kiln_sampler_free(s);
}

/* Draws many samples and compares frequencies with the expected distribution. */
static void histogram(kiln_sampler *s, const float *l, int n, int draws, double *freq) {
    memset(freq, 0, sizeof(double) * (size_t)n);
    for (int i = 0; i < draws; i++) {
        int id = kiln_sampler_sample(s, l, n);
        assert_true(id >= 0 && id < n);
        freq[id] += 1.0 / draws;
    }
}

static void test_temperature_distribution(void **state) {
    (void)state;
    const float l[4] = {0.0f, 1.0f, 2.0f, 0.5f};
    for (int ti = 0; ti < 2; ti++) {
        float t = ti ? 2.0f : 0.7f;
        kiln_sampler *s = mk(t, 0, 1, 0, 42);
        double f[4], z = 0, p[4];
        histogram(s, l, 4, 40000, f);
        for (int i = 0; i < 4; i++) z += exp(l[i] / t);
        for (int i = 0; i < 4; i++) {
            p[i] = exp(l[i] / t) / z;
            /* 40000 draws: standard error < 0.0025; allow 4 sigma */
            assert_true(fabs(f[i] - p[i]) < 0.01);
        }
        kiln_sampler_free(s);
    }
}

static void test_top_k_top_p_min_p(void **state) {
    (void)state;
    const float l[6] = {5.0f, 4.0f, 3.0f, 2.0f, 1.0f, 0.0f};
    double f[6];
    kiln_sampler *s = mk(1.0f, 2, 1, 0, 7);
    histogram(s, l, 6, 5000, f);
    assert_true(f[0] > 0 && f[1] > 0);
    for (int i = 2; i < 6; i++) assert_true(f[i] == 0);
    kiln_sampler_free(s);
    /* top-p 0.7: softmax of 5,4,3.. = .636 .234 .086 ..: keeps 2 tokens */
    s = mk(1.0f, 0, 0.7f, 0, 7);
    histogram(s, l, 6, 5000, f);
    assert_true(f[0] > 0 && f[1] > 0);
    for (int i = 2; i < 6; i++) assert_true(f[i] == 0);
    kiln_sampler_free(s);
    /* min-p 0.1: keeps p >= 0.0636: tokens 0, 1, 2 */
    s = mk(1.0f, 0, 1, 0.1f, 7);
    histogram(s, l, 6, 5000, f);
    assert_true(f[2] > 0);
    for (int i = 3; i < 6; i++) assert_true(f[i] == 0);
    kiln_sampler_free(s);
}

static void test_seed_reproducible(void **state) {
    (void)state;
    const float l[5] = {1, 1, 1, 1, 1};
    kiln_sampler *a = mk(1, 0, 1, 0, 123), *b = mk(1, 0, 1, 0, 123), *c = mk(1, 0, 1, 0, 124);
    int same_ab = 0, same_ac = 0;
    for (int i = 0; i < 200; i++) {
        int x = kiln_sampler_sample(a, l, 5), y = kiln_sampler_sample(b, l, 5),
            z = kiln_sampler_sample(c, l, 5);
        same_ab += x == y;
        same_ac += x == z;
    }
    assert_int_equal(same_ab, 200);
    assert_true(same_ac < 150);
    /* reset replays the stream */
    kiln_sampler_reset(a, 123);
    kiln_sampler_reset(b, 123);
    for (int i = 0; i < 50; i++)
        assert_int_equal(kiln_sampler_sample(a, l, 5), kiln_sampler_sample(b, l, 5));
    kiln_sampler_free(a), kiln_sampler_free(b), kiln_sampler_free(c);
}

static void test_penalties(void **state) {
    (void)state;
    kiln_sampler_params p;
    kiln_sampler_params_default(&p);
    p.temperature = 0;
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 2;
    kiln_sampler *s;
    assert_int_equal(kiln_sampler_create(&p, 4, &s, NULL), KILN_OK);
    const float l[4] = {3.0f, 2.0f, -1.0f, -1.5f};
    assert_int_equal(kiln_sampler_sample(s, l, 4), 0);
    kiln_sampler_accept(s, 0); /* 3 -> 1.5 < 2 */
    assert_int_equal(kiln_sampler_sample(s, l, 4), 1);
    kiln_sampler_accept(s, 1);
    kiln_sampler_accept(s, 2); /* window 2: token 0 leaves the window */
    assert_int_equal(kiln_sampler_sample(s, l, 4), 0);
    kiln_sampler_free(s);
    /* negative logits are multiplied: -1 * 2 = -2 < -1.5 */
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 64;
    assert_int_equal(kiln_sampler_create(&p, 4, &s, NULL), KILN_OK);
    const float m[2] = {-1.0f, -1.5f};
    kiln_sampler_accept(s, 0);
    assert_int_equal(kiln_sampler_sample(s, m, 2), 1);
    kiln_sampler_free(s);
    /* frequency and presence */
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = 0.6f;
    p.presence_penalty = 0.5f;
    assert_int_equal(kiln_sampler_create(&p, 4, &s, NULL), KILN_OK);
    const float q[2] = {2.0f, 1.0f};
    kiln_sampler_accept(s, 0); /* 2 - 0.6 - 0.5 = 0.9 < 1 */
    assert_int_equal(kiln_sampler_sample(s, q, 2), 1);
    kiln_sampler_free(s);
    p.frequency_penalty = 0.3f;
    p.presence_penalty = 0.0f;
    assert_int_equal(kiln_sampler_create(&p, 4, &s, NULL), KILN_OK);
    kiln_sampler_accept(s, 0); /* 2 - 0.3 = 1.7 > 1 */
    assert_int_equal(kiln_sampler_sample(s, q, 2), 0);
    kiln_sampler_accept(s, 0);
    kiln_sampler_accept(s, 0);
    kiln_sampler_accept(s, 0); /* 2 - 1.2 = 0.8 < 1 */
    assert_int_equal(kiln_sampler_sample(s, q, 2), 1);
    kiln_sampler_free(s);
    /* the whole history (repeat_last_n -1) keeps every token as it grows: after tokens
     * 0..2099 (distinct) each is penalized, so greedy over equal logits picks 2100 (the
     * grown ring once overwrote its oldest entries: 0 came back) */
    {
        enum { NV = 3000, NH = 2100 };
        p.frequency_penalty = 0.0f;
        p.presence_penalty = 1.0f;
        p.repeat_last_n = -1;
        assert_int_equal(kiln_sampler_create(&p, NV, &s, NULL), KILN_OK);
        float *z = calloc(NV, sizeof(float));
        assert_non_null(z);
        for (int i = 0; i < NH; i++) kiln_sampler_accept(s, i);
        assert_int_equal(kiln_sampler_sample(s, z, NV), NH);
        free(z);
        kiln_sampler_free(s);
    }
    /* bad parameters */
    p.top_p = 0;
    assert_int_equal(kiln_sampler_create(&p, 4, &s, NULL), KILN_ERR_INVALID_ARG);
}

/* Feeds pieces and returns the concatenated emitted text. */
static char *run_stop(const char *const *stops, int n_stops, const char *const *pieces, int n,
                      bool *stopped) {
    kiln_stopper st;
    assert_int_equal(kiln_stopper_init(&st, stops, n_stops, NULL, 0, NULL), KILN_OK);
    static char out[1024];
    size_t len = 0;
    *stopped = false;
    for (int i = 0; i < n && !*stopped; i++) {
        const char *e;
        size_t el;
        assert_int_equal(
            kiln_stopper_feed(&st, pieces[i], strlen(pieces[i]), &e, &el, stopped, NULL), KILN_OK);
        memcpy(out + len, e, el);
        len += el;
        /* never emit part of a stop string: the emitted text so far contains none */
        out[len] = 0;
        for (int k = 0; k < n_stops; k++) assert_null(strstr(out, stops[k]));
    }
    if (!*stopped) {
        const char *e;
        size_t el;
        kiln_stopper_flush(&st, &e, &el);
        memcpy(out + len, e, el);
        len += el;
    }
    out[len] = 0;
    kiln_stopper_free(&st);
    return out;
}

static void test_stop_strings(void **state) {
    (void)state;
    bool stopped;
    const char *stops[] = {"</end>", "STOP"};
    const char *p1[] = {"Hello wor", "ld </e", "nd> more"};
    assert_string_equal(run_stop(stops, 2, p1, 3, &stopped), "Hello world ");
    assert_true(stopped);
    const char *p2[] = {"a <", "/e", "x", "tra"};
    assert_string_equal(run_stop(stops, 2, p2, 4, &stopped), "a </extra");
    assert_false(stopped);
    const char *p3[] = {"S", "T", "O", "P"};
    assert_string_equal(run_stop(stops, 2, p3, 4, &stopped), "");
    assert_true(stopped);
    const char *p4[] = {"xSTOPy</end>"};
    assert_string_equal(run_stop(stops, 2, p4, 1, &stopped), "x");
    const char *p5[] = {"ST", "ST", "OP"};
    assert_string_equal(run_stop(stops, 2, p5, 3, &stopped), "ST");
    assert_true(stopped);
    /* no stop strings: text passes straight through */
    const char *p6[] = {"ab", "cd"};
    assert_string_equal(run_stop(NULL, 0, p6, 2, &stopped), "abcd");
    kiln_stopper st;
    const int32_t toks[2] = {1, 106};
    assert_int_equal(kiln_stopper_init(&st, NULL, 0, toks, 2, NULL), KILN_OK);
    assert_true(kiln_stopper_is_stop_token(&st, 106));
    assert_false(kiln_stopper_is_stop_token(&st, 2));
    kiln_stopper_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_temperature_distribution),
        cmocka_unit_test(test_top_k_top_p_min_p),
        cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_stop_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
