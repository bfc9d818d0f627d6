/*
 * sample_cases.h — the sampling configurations and random logits rows the device-sampling
 * tests share (test_sample_device: ref.sample vs the CPU chain; test_cuda_sample:
 * cuda.sample vs both).
 */
#ifndef KILN_TESTS_SAMPLE_CASES_H
#define KILN_TESTS_SAMPLE_CASES_H

#include "sample/sample.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct kt_scase {
    int32_t n; /* vocabulary */
    int32_t k;
    float temp, top_p, min_p;
    float rep, freq, pres; /* penalties (1, 0, 0: off) */
    int32_t last_n;
    int32_t n_bias;
    int kind; /* logits: 0 normal x 3, 1 rounded to 1/4 (ties), 2 with NaN / -inf, 3 flat */
} kt_scase;

static inline uint64_t kt_srng(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline double kt_sunif(uint64_t *x) {
    return (double)(kt_srng(x) >> 11) * 0x1.0p-53;
}

/* A row of n logits of the case's kind (roughly what an LM head gives: a few large). */
static inline void kt_slogits(float *l, int32_t n, int kind, uint64_t *x) {
    for (int32_t i = 0; i < n; i++) {
        double u1 = kt_sunif(x) + 1e-12, u2 = kt_sunif(x);
        float v = (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
        if (kind == 3)
            v *= 0.05f;
        else
            v *= 3.0f;
        if (kind == 1) v = roundf(v * 4) / 4;
        if (kind == 2) {
            uint64_t r = kt_srng(x) % 64;
            if (r == 0) v = NAN;
            if (r == 1) v = -INFINITY;
        }
        l[i] = v;
    }
    /* a few peaked tokens, as trained models have */
    for (int j = 0; j < 4 && n > 0; j++) l[kt_srng(x) % (uint64_t)n] += 8.0f - (float)j;
}

/* The sampler parameters of a case; bias gets n_bias entries (the storage is the caller's). */
static inline void kt_sparams(const kt_scase *c, uint64_t seed, kiln_logit_bias *bias,
                              kiln_sampler_params *p) {
    kiln_sampler_params_default(p);
    p->temperature = c->temp;
    p->top_k = c->k;
    p->top_p = c->top_p;
    p->min_p = c->min_p;
    p->repeat_penalty = c->rep;
    p->frequency_penalty = c->freq;
    p->presence_penalty = c->pres;
    p->repeat_last_n = c->last_n;
    p->seed = seed;
    uint64_t x = seed ^ 0x5bd1e995u;
    for (int32_t i = 0; i < c->n_bias; i++) {
        bias[i].token = (int32_t)(kt_srng(&x) % (uint64_t)c->n);
        bias[i].bias = i % 5 == 0 ? -INFINITY : (float)(kt_sunif(&x) * 10 - 5);
    }
    p->logit_bias = c->n_bias ? bias : NULL;
    p->n_logit_bias = c->n_bias;
}

/* The cases: every k x temperature x filter x penalty combination over the given vocab. */
#define KT_SCASE_KS 4
static inline int kt_scases(int32_t n, kt_scase *out, int cap) {
    static const int32_t ks[KT_SCASE_KS] = {1, 40, 1000, 4000};
    static const float temps[] = {0.0f, 0.3f, 0.8f, 1.5f};
    static const float tps[] = {1.0f, 0.95f, 0.5f};
    static const float mps[] = {0.0f, 0.05f, 0.3f};
    int m = 0;
    for (int ki = 0; ki < KT_SCASE_KS; ki++)
        for (int ti = 0; ti < 4; ti++)
            for (int pi = 0; pi < 3; pi++)
                for (int mi = 0; mi < 3; mi++)
                    for (int pen = 0; pen < 3; pen++) {
                        if (m >= cap) return m;
                        kt_scase c = {.n = n,
                                      .k = ks[ki],
                                      .temp = temps[ti],
                                      .top_p = tps[pi],
                                      .min_p = mps[mi],
                                      .rep = pen ? 1.3f : 1.0f,
                                      .freq = pen == 2 ? 0.5f : 0.0f,
                                      .pres = pen == 2 ? -0.7f : 0.0f, /* lifts a token */
                                      .last_n = pen == 2 ? -1 : 64,
                                      .n_bias = pen == 2 ? 6 : 0,
                                      .kind = (ki + ti + pi + mi + pen) % 4};
                        if (c.temp == 0 && (pi || mi)) continue; /* greedy: filters moot */
                        out[m++] = c;
                    }
    return m;
}

#endif /* KILN_TESTS_SAMPLE_CASES_H */
