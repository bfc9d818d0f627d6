/* test_sample_chain.c — the sampling chain against an independent reference written
 * here (naive: full sort, double-precision softmax, penalties by counting over the
 * whole window): candidate set and probabilities after each stage; chi-square of
 * 120,000 draws; seeds across samplers, batches and threads; logit bias; logprobs. */
#include "testutil.h"

#include "sample/sample.h"
#include "base/cpu.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct ref_cand {
    int32_t id;
    double logit;
    double p;
} ref_cand;

static int ref_cmp(const void *a, const void *b) {
    const ref_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static void ref_softmax(ref_cand *c, int n, double t) {
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < n; i++) mx = c[i].logit > mx ? c[i].logit : mx;
    for (int i = 0; i < n; i++) z += exp((c[i].logit - mx) / t);
    for (int i = 0; i < n; i++) c[i].p = exp((c[i].logit - mx) / t) / z;
}

/* The chain as llama.cpp documents it, naively. Returns the set size after `stage`. */
static int ref_chain(const kiln_sampler_params *p, const float *lg, int n, const int32_t *hist,
                     int n_hist, kiln_sample_stage stage, ref_cand *c) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        float l = lg[i];
        for (int b = 0; b < p->n_logit_bias; b++)
            if (p->logit_bias[b].token == i) l += p->logit_bias[b].bias;
        int count = 0;
        int from =
            p->repeat_last_n < 0 || n_hist < p->repeat_last_n ? 0 : n_hist - p->repeat_last_n;
        for (int h = from; h < n_hist && p->repeat_last_n != 0; h++) count += hist[h] == i;
        if (count > 0) {
            l = l <= 0 ? l * p->repeat_penalty : l / p->repeat_penalty;
            l -= (float)count * p->frequency_penalty + p->presence_penalty;
        }
        if (isnan(l) || l == -INFINITY) continue;
        c[m++] = (ref_cand){i, l, 0};
    }
    qsort(c, (size_t)m, sizeof(ref_cand), ref_cmp);
    ref_softmax(c, m, 1);
    if (stage == KILN_SAMPLE_STAGE_PENALTIES) return m;
    if (p->top_k > 0 && p->top_k < m) m = p->top_k;
    ref_softmax(c, m, 1);
    if (stage == KILN_SAMPLE_STAGE_TOP_K) return m;
    if (p->top_p < 1) {
        double cum = 0;
        for (int i = 0; i < m; i++) {
            cum += c[i].p;
            if (cum >= p->top_p) {
                m = i + 1;
                break;
            }
        }
    }
    ref_softmax(c, m, 1);
    if (stage == KILN_SAMPLE_STAGE_TOP_P) return m;
    if (p->min_p > 0) {
        int k = 1;
        while (k < m && c[k].p >= p->min_p * c[0].p) k++;
        m = k;
    }
    ref_softmax(c, m, 1);
    if (stage == KILN_SAMPLE_STAGE_MIN_P) return m;
    for (int i = 0; i < m; i++) c[i].logit /= p->temperature;
    ref_softmax(c, m, 1);
    return m;
}

static float *random_logits(int n, uint64_t seed, float scale) {
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    float *l = malloc((size_t)n * sizeof(float));
    assert_non_null(l);
    for (int i = 0; i < n; i++) {
        double u = kiln_rng_uniform(&r), v = kiln_rng_uniform(&r);
        l[i] = (float)(scale * sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v));
    }
    l[n / 3] = NAN;
    l[n / 2] = -INFINITY;
    return l;
}

static void check_stages(const kiln_sampler_params *p, const float *lg, int n, const int32_t *hist,
                         int n_hist) {
    kiln_sampler *s;
    assert_int_equal(kiln_sampler_create(p, n, &s, NULL), KILN_OK);
    for (int i = 0; i < n_hist; i++) kiln_sampler_accept(s, hist[i]);
    ref_cand *rc = malloc((size_t)n * sizeof(ref_cand));
    kiln_sample_cand *kc = malloc((size_t)n * sizeof(kiln_sample_cand));
    assert_non_null(rc);
    assert_non_null(kc);
    for (int st = KILN_SAMPLE_STAGE_PENALTIES; st <= KILN_SAMPLE_STAGE_TEMPERATURE; st++) {
        int m = ref_chain(p, lg, n, hist, n_hist, (kiln_sample_stage)st, rc);
        int32_t km = -1;
        assert_int_equal(kiln_sampler_stage(s, lg, n, (kiln_sample_stage)st, kc, &km, NULL),
                         KILN_OK);
        if (km != m)
            fail_msg("stage %d (k %d p %g m %g t %g): kiln keeps %d candidates, reference %d", st,
                     p->top_k, p->top_p, p->min_p, p->temperature, km, m);
        for (int i = 0; i < m; i++) {
            if (kc[i].id != rc[i].id)
                fail_msg("stage %d: candidate %d is %d, want %d", st, i, kc[i].id, rc[i].id);
            if (fabs(kc[i].p - rc[i].p) > 1e-5 + 1e-4 * rc[i].p)
                fail_msg("stage %d: p[%d] = %g, want %g", st, kc[i].id, kc[i].p, rc[i].p);
        }
    }
    free(rc);
    free(kc);
    kiln_sampler_free(s);
}

static void test_stages(void **state) {
    (void)state;
    const int n = 20000;
    float *lg = random_logits(n, 11, 2.0f);
    int32_t hist[100];
    for (int i = 0; i < 100; i++) hist[i] = (i * 7919) % n;
    hist[5] = hist[9] = hist[20]; /* repeats: counts > 1 */
    for (int i = 0; i < 50; i++) hist[50 + i] = (int32_t)(lg[i] > 3 ? i : hist[50 + i]);
    kiln_logit_bias bias[4] = {{3, 2.5f}, {17, -INFINITY}, {3, 0.5f}, {n - 1, 4.0f}};
    const struct {
        int k;
        float p, m, t;
    } cfg[] = {
        {40, 0.95f, 0.05f, 0.8f}, /* llama.cpp's defaults: heap path */
        {40, 1.0f, 0.0f, 1.5f},      {3, 0.5f, 0.0f, 0.7f},  {200, 0.9f, 0.02f, 1.0f},
        {0, 0.95f, 0.05f, 0.8f}, /* top-k off: unsorted O(n) path */
        {0, 0.9f, 0.0f, 1.0f},       {0, 1.0f, 0.01f, 1.0f}, {0, 0.3f, 0.001f, 2.0f},
        {6000, 0.8f, 0.0f, 1.0f}, /* top-k above the heap: quickselect path */
        {6000, 0.99f, 0.003f, 1.0f},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        for (int pen = 0; pen < 2; pen++) {
            kiln_sampler_params p;
            kiln_sampler_params_default(&p);
            p.top_k = cfg[c].k;
            p.top_p = cfg[c].p;
            p.min_p = cfg[c].m;
            p.temperature = cfg[c].t;
            if (pen) {
                p.repeat_penalty = 1.3f;
                p.repeat_last_n = 64;
                p.frequency_penalty = 0.2f;
                p.presence_penalty = -0.4f; /* raises: must be found outside the raw top-k */
                p.logit_bias = bias;
                p.n_logit_bias = 4;
            }
            check_stages(&p, lg, n, hist, pen ? 100 : 0);
        }
    }
    /* a peaked row: a few tokens far above the rest */
    for (int i = 0; i < 5; i++) lg[i * 1000 + 7] = 12.0f - (float)i;
    kiln_sampler_params p;
    kiln_sampler_params_default(&p);
    check_stages(&p, lg, n, NULL, 0);
    p.top_k = 0;
    check_stages(&p, lg, n, NULL, 0);
    free(lg);
}

/* Chi-square of `draws` tokens against the reference distribution after the chain. */
static void chi_square(const kiln_sampler_params *p, const float *lg, int n, int draws) {
    ref_cand *rc = malloc((size_t)n * sizeof(ref_cand));
    double *expect = calloc((size_t)n, sizeof(double));
    long *seen = calloc((size_t)n, sizeof(long));
    assert_true(rc && expect && seen);
    int m =
        p->temperature > 0 ? ref_chain(p, lg, n, NULL, 0, KILN_SAMPLE_STAGE_TEMPERATURE, rc) : 0;
    for (int i = 0; i < m; i++) expect[rc[i].id] = rc[i].p * draws;
    kiln_sampler *s;
    assert_int_equal(kiln_sampler_create(p, n, &s, NULL), KILN_OK);
    for (int d = 0; d < draws; d++) {
        int32_t t = kiln_sampler_sample(s, lg, n);
        assert_true(t >= 0 && t < n);
        seen[t]++;
    }
    double chi = 0;
    int df = -1;
    double pooled_e = 0, pooled_o = 0; /* cells expecting < 5 draws pooled into one */
    for (int i = 0; i < n; i++) {
        if (expect[i] == 0) {
            if (seen[i])
                fail_msg("token %d drawn %ld times but outside the chain's set", i, seen[i]);
            continue;
        }
        if (expect[i] < 5) {
            pooled_e += expect[i];
            pooled_o += (double)seen[i];
            continue;
        }
        chi += ((double)seen[i] - expect[i]) * ((double)seen[i] - expect[i]) / expect[i];
        df++;
    }
    if (pooled_e > 0) {
        chi += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
        df++;
    }
    /* critical value at significance 1e-4 (Wilson-Hilferty approximation) */
    double z = 3.719, k = df > 0 ? df : 1;
    double crit = k * pow(1 - 2 / (9 * k) + z * sqrt(2 / (9 * k)), 3);
    if (chi > crit)
        fail_msg("chi-square %.1f > %.1f (df %d, k %d p %g m %g t %g)", chi, crit, df, p->top_k,
                 p->top_p, p->min_p, p->temperature);
    kiln_sampler_free(s);
    free(rc);
    free(expect);
    free(seen);
}

static void test_chi_square(void **state) {
    (void)state;
    const int n = 400;
    float *lg = random_logits(n, 5, 1.5f);
    kiln_sampler_params p;
    kiln_sampler_params_default(&p);
    p.seed = 99;
    chi_square(&p, lg, n, 120000); /* default chain (heap path) */
    p.top_k = 0;
    p.min_p = 0.02f;
    chi_square(&p, lg, n, 120000); /* unsorted path */
    p.top_p = 1;
    p.min_p = 0;
    p.temperature = 1.3f;
    chi_square(&p, lg, n, 120000); /* every filter off: block draw */
    free(lg);
}

/* Two samplers of the same parameters, the second created with env=1 (a switch the sampler
 * reads at create: KILN_SAMPLER_GENERAL, KILN_SAMPLER_NO_AVX2) */
static void sampler_pair(const kiln_sampler_params *p, int32_t n, const char *env, kiln_sampler **a,
                         kiln_sampler **b) {
    assert_int_equal(kiln_sampler_create(p, n, a, NULL), KILN_OK);
    setenv(env, "1", 1);
    assert_int_equal(kiln_sampler_create(p, n, b, NULL), KILN_OK);
    unsetenv(env);
}

/* Session 18: with top-k off over a large vocabulary the chain takes topk_off_first (the
 * maximum, then one pass of p, z and min-p's survivors) instead of materializing every
 * candidate for head() and filter_unsorted(); draw keeps its terms. Both must give the same
 * tokens for the same seed, bit for bit: min-p off / on / 1, top-p from 0.5 to 1, several
 * temperatures, penalties and biases (a banned token), NaN / -inf logits, ties, two vocab
 * sizes on either side of the heap limit. KILN_SAMPLER_GENERAL=1 at create turns the fast
 * path off. */
static void test_topk_off_paths_agree(void **state) {
    (void)state;
    const int32_t vocabs[2] = {4100, 40000};
    const float mps[4] = {0.0f, 0.05f, 0.3f, 1.0f}, tps[4] = {0.5f, 0.9f, 0.95f, 1.0f},
                temps[2] = {0.4f, 1.3f};
    kt_rng r;
    kt_rng_seed(&r, 77);
    long draws = 0;
    for (int vi = 0; vi < 2; vi++) {
        const int32_t n = vocabs[vi];
        float *lg = malloc(sizeof(float) * (size_t)n);
        assert_non_null(lg);
        for (int c = 0; c < 4 * 4 * 2 * 2; c++) {
            const int mi = c % 4, ti = (c / 4) % 4, te = (c / 16) % 2, pen = c / 32;
            kiln_sampler_params p;
            kiln_sampler_params_default(&p);
            p.top_k = c % 3 == 0 ? -1 : 0;
            p.min_p = mps[mi], p.top_p = tps[ti], p.temperature = temps[te];
            p.seed = 99 + (uint64_t)c;
            const kiln_logit_bias lb[3] = {{7, 3.5f}, {11, -INFINITY}, {n - 1, 2.0f}};
            if (pen) {
                p.repeat_penalty = 1.3f, p.presence_penalty = 0.4f;
                p.logit_bias = lb, p.n_logit_bias = 3;
            }
            kiln_sampler *fast = NULL, *gen = NULL;
            sampler_pair(&p, n, "KILN_SAMPLER_GENERAL", &fast, &gen);
            for (int step = 0; step < 6; step++) {
                const float amp = (step + te) % 2 ? 1.0f : 4.0f; /* flat or peaked */
                kt_fill_normal(&r, lg, (size_t)n, amp);
                for (int j = 0; j < 10; j++) lg[kt_rng_u64(&r) % (uint64_t)n] = 6.0f + (float)j;
                if (step % 3 == 1) {
                    lg[kt_rng_u64(&r) % (uint64_t)n] = NAN;
                    lg[kt_rng_u64(&r) % (uint64_t)n] = -INFINITY;
                }
                if (step == 4)
                    for (int32_t i = 0; i < n; i += 2) lg[i] = lg[1]; /* many ties */
                const int32_t a = kiln_sampler_sample(fast, lg, n),
                              b = kiln_sampler_sample(gen, lg, n);
                if (a != b)
                    fail_msg(
                        "vocab %d case %d step %d (min_p %g top_p %g temp %g pen %d): fast %d, "
                        "general %d",
                        (int)n, c, step, (double)p.min_p, (double)p.top_p, (double)p.temperature,
                        pen, (int)a, (int)b);
                kiln_sampler_accept(fast, a < 0 ? 0 : a);
                kiln_sampler_accept(gen, b < 0 ? 0 : b);
                draws++;
            }
            kiln_sampler_free(fast);
            kiln_sampler_free(gen);
        }
        free(lg);
    }
    assert_int_equal(draws, 2 * 64 * 6);
}

/* Session 18: the row's exps 8 at a time (AVX2, where the CPU has it) give the same bits as
 * 4 at a time: logprobs (which use the row's sum) and temperature-only draws (block sums)
 * equal with KILN_SAMPLER_NO_AVX2=1 at create. Skipped, saying so, without AVX2. */
static void test_avx2_sums_agree(void **state) {
    (void)state;
    if (!(kiln_cpu_info()->isa & KILN_ISA_AVX2)) {
        print_message("test_avx2_sums_agree: skipped: this CPU has no AVX2\n");
        return;
    }
    const int32_t n = 70001; /* not a multiple of 8: the 4-wide and scalar tails too */
    float *lg = malloc(sizeof(float) * (size_t)n);
    assert_non_null(lg);
    kt_rng r;
    kt_rng_seed(&r, 5);
    for (int c = 0; c < 2; c++) {
        kiln_sampler_params p;
        kiln_sampler_params_default(&p);
        p.n_logprobs = 5;
        if (c == 1) p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f, p.temperature = 0.9f;
        kiln_sampler *a = NULL, *b = NULL;
        sampler_pair(&p, n, "KILN_SAMPLER_NO_AVX2", &a, &b);
        for (int step = 0; step < 20; step++) {
            kt_fill_normal(&r, lg, (size_t)n, step % 2 ? 1.0f : 5.0f);
            lg[kt_rng_u64(&r) % (uint64_t)n] = NAN;
            lg[kt_rng_u64(&r) % (uint64_t)n] = -INFINITY;
            kiln_sample_out oa, ob;
            const kiln_sample_row ra = {a, lg}, rb = {b, lg};
            assert_int_equal(kiln_sample_batch(&ra, 1, n, &oa, NULL), KILN_OK);
            assert_int_equal(kiln_sample_batch(&rb, 1, n, &ob, NULL), KILN_OK);
            assert_int_equal(oa.token, ob.token);
            assert_memory_equal(&oa.logprob, &ob.logprob, sizeof(float));
            assert_int_equal(oa.n_top, ob.n_top);
            assert_memory_equal(oa.top_logprob, ob.top_logprob, sizeof(float) * (size_t)oa.n_top);
        }
        kiln_sampler_free(a);
        kiln_sampler_free(b);
    }
    free(lg);
}

static void test_seed_batch_threads(void **state);

static void test_logit_bias_and_logprobs(void **state) {
    (void)state;
    const int n = 3000;
    float *lg = random_logits(n, 8, 2.0f);
    int top = 0;
    for (int i = 1; i < n; i++)
        if (lg[i] > lg[top]) top = i;
    kiln_logit_bias ban = {top, -INFINITY};
    kiln_sampler_params p;
    kiln_sampler_params_default(&p);
    p.temperature = 0;
    p.logit_bias = &ban;
    p.n_logit_bias = 1;
    p.n_logprobs = 5;
    kiln_sampler *s;
    assert_int_equal(kiln_sampler_create(&p, n, &s, NULL), KILN_OK);
    kiln_sample_row row = {s, lg};
    kiln_sample_out o;
    assert_int_equal(kiln_sample_batch(&row, 1, n, &o, NULL), KILN_OK);
    assert_int_not_equal(o.token, top);
    /* reference: log-softmax of the biased logits over the whole vocabulary */
    ref_cand *rc = malloc((size_t)n * sizeof(ref_cand));
    int m = ref_chain(&p, lg, n, NULL, 0, KILN_SAMPLE_STAGE_PENALTIES, rc);
    assert_int_equal(o.token, rc[0].id);
    assert_true(fabs(o.logprob - log(rc[0].p)) < 1e-4);
    assert_int_equal(o.n_top, 5);
    for (int i = 0; i < 5 && i < m; i++) {
        assert_int_equal(o.top_token[i], rc[i].id);
        assert_true(fabs(o.top_logprob[i] - log(rc[i].p)) < 1e-4);
    }
    kiln_sampler_free(s);
    /* a large bias makes a token win; an out-of-range token is refused at creation */
    kiln_logit_bias boost = {7, 1000.0f};
    p.logit_bias = &boost;
    p.temperature = 0.8f;
    assert_int_equal(kiln_sampler_create(&p, n, &s, NULL), KILN_OK);
    for (int i = 0; i < 20; i++) assert_int_equal(kiln_sampler_sample(s, lg, n), 7);
    kiln_sampler_free(s);
    boost.token = n;
    assert_int_equal(kiln_sampler_create(&p, n, &s, NULL), KILN_ERR_INVALID_ARG);
    p.n_logit_bias = 0;
    p.n_logprobs = 21;
    assert_int_equal(kiln_sampler_create(&p, n, &s, NULL), KILN_ERR_INVALID_ARG);
    free(rc);
    free(lg);
}

typedef struct thr_arg {
    kiln_sample_row *rows;
    int n_rows;
    int n_vocab;
    int steps;
    int32_t *out; /* [steps][n_rows] */
} thr_arg;

static void *thr_main(void *a) {
    thr_arg *t = a;
    for (int s = 0; s < t->steps; s++) {
        kiln_sample_out o[8];
        if (kiln_sample_batch(t->rows, t->n_rows, t->n_vocab, o, NULL)) return NULL;
        for (int r = 0; r < t->n_rows; r++) {
            t->out[s * t->n_rows + r] = o[r].token;
            kiln_sampler_accept(t->rows[r].sampler, o[r].token);
        }
    }
    return NULL;
}

/* The same seeds give the same tokens: one batch of 6 sequences on 1 thread, the same
 * sequences split over 2 and 3 threads, and each sequence alone. */
static void test_seed_batch_threads(void **state) {
    (void)state;
    const int n = 50000, rows = 6, steps = 40;
    float *lg[6];
    for (int r = 0; r < rows; r++) lg[r] = random_logits(n, 100 + (uint64_t)r, 2.0f);
    int32_t ref[40 * 6], got[40 * 6];
    for (int split = 1; split <= 3; split++) {
        kiln_sample_row rw[6];
        for (int r = 0; r < rows; r++) {
            kiln_sampler_params p;
            kiln_sampler_params_default(&p);
            p.seed = 1000 + (uint64_t)r;
            p.top_k = r % 2 ? 0 : 40; /* both paths */
            p.repeat_penalty = 1.1f;
            rw[r].logits = lg[r];
            assert_int_equal(kiln_sampler_create(&p, n, &rw[r].sampler, NULL), KILN_OK);
        }
        pthread_t th[3];
        thr_arg ta[3];
        int per = rows / split;
        int32_t part[3][40 * 6];
        for (int t = 0; t < split; t++) {
            ta[t] = (thr_arg){rw + t * per, per, n, steps, part[t]};
            assert_int_equal(pthread_create(&th[t], NULL, thr_main, &ta[t]), 0);
        }
        for (int t = 0; t < split; t++) pthread_join(th[t], NULL);
        for (int s = 0; s < steps; s++)
            for (int t = 0; t < split; t++)
                for (int r = 0; r < per; r++) got[s * rows + t * per + r] = part[t][s * per + r];
        if (split == 1)
            memcpy(ref, got, sizeof ref);
        else
            assert_memory_equal(ref, got, sizeof ref);
        for (int r = 0; r < rows; r++) kiln_sampler_free(rw[r].sampler);
    }
    /* alone, through the one-row call */
    for (int r = 0; r < rows; r++) {
        kiln_sampler_params p;
        kiln_sampler_params_default(&p);
        p.seed = 1000 + (uint64_t)r;
        p.top_k = r % 2 ? 0 : 40;
        p.repeat_penalty = 1.1f;
        kiln_sampler *s;
        assert_int_equal(kiln_sampler_create(&p, n, &s, NULL), KILN_OK);
        for (int st = 0; st < steps; st++) {
            int32_t t = kiln_sampler_sample(s, lg[r], n);
            assert_int_equal(t, ref[st * rows + r]);
            kiln_sampler_accept(s, t);
        }
        kiln_sampler_free(s);
    }
    for (int r = 0; r < rows; r++) free(lg[r]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stages),
        cmocka_unit_test(test_chi_square),
        cmocka_unit_test(test_logit_bias_and_logprobs),
        cmocka_unit_test(test_seed_batch_threads),
        cmocka_unit_test(test_topk_off_paths_agree),
        cmocka_unit_test(test_avx2_sums_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
