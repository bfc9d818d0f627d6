/*
 * bench_sample.c — cost of the sampling chain per token on a large vocabulary, 1 thread.
 *
 *   build/bench/bench_sample [N_VOCAB]        (default 262144, Gemma 3's vocabulary)
 *
 * Logits: 8 rows (8 MiB for 262k, so rows come from memory as after an LM head, not
 * from L1/L2), each N(0, 2^2) with a peaked head (10 tokens at +6..+15) like a language
 * model's; the "flat" rows have no head (the worst case for top-p/min-p: many survivors).
 * Each configuration samples 400 rows round-robin after 40 warm-up rows; the median and
 * best per-row time are printed in microseconds. The budget (issue #16) is the default
 * chain <= 300 us per token.
 */
#include "base/timer.h"
#include "sample/sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROWS  8
#define ITERS 400

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float gauss(kiln_rng *r) {
    double u = kiln_rng_uniform(r), v = kiln_rng_uniform(r);
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

static void run(const char *name, const kiln_sampler_params *p, float **rows, int32_t n,
                const int32_t *hist, int n_hist) {
    kiln_sampler *s;
    kiln_err err;
    if (kiln_sampler_create(p, n, &s, &err)) {
        fprintf(stderr, "%s: %s\n", name, err.msg);
        exit(1);
    }
    for (int i = 0; i < n_hist; i++) kiln_sampler_accept(s, hist[i]);
    double t[ITERS];
    long sink = 0;
    for (int i = -40; i < ITERS; i++) {
        uint64_t t0 = kiln_now_ns();
        sink += kiln_sampler_sample(s, rows[(i + 40) % ROWS], n);
        if (i >= 0) t[i] = (double)(kiln_now_ns() - t0) * 1e-3;
    }
    qsort(t, ITERS, sizeof(double), cmp_d);
    printf("%-44s median %8.1f us   best %8.1f us   (checksum %ld)\n", name, t[ITERS / 2], t[0],
           sink % 1000);
    kiln_sampler_free(s);
}

int main(int argc, char **argv) {
    int32_t n = argc > 1 ? atoi(argv[1]) : 262144;
    if (n < 64) {
        fprintf(stderr, "usage: bench_sample [N_VOCAB >= 64]\n");
        return 2;
    }
    kiln_rng r;
    kiln_rng_seed(&r, 1234);
    float *peaked[ROWS], *flat[ROWS];
    for (int k = 0; k < ROWS; k++) {
        peaked[k] = malloc((size_t)n * sizeof(float));
        flat[k] = malloc((size_t)n * sizeof(float));
        if (!peaked[k] || !flat[k]) return 1;
        for (int32_t i = 0; i < n; i++) flat[k][i] = peaked[k][i] = 2.0f * gauss(&r);
        for (int j = 0; j < 10; j++) peaked[k][kiln_rng_next(&r) % (uint64_t)n] = 6.0f + (float)j;
    }
    int32_t hist[64];
    for (int i = 0; i < 64; i++) hist[i] = (int32_t)(kiln_rng_next(&r) % (uint64_t)n);
    printf("bench_sample: n_vocab %d, 1 thread, %d rows round-robin\n", (int)n, ROWS);

    kiln_sampler_params p;
    kiln_sampler_params_default(&p);
    run("default chain (k40 p.95 m.05 t.8)", &p, peaked, n, NULL, 0);
    run("default chain, flat logits", &p, flat, n, NULL, 0);
    p.repeat_penalty = 1.1f;
    p.frequency_penalty = 0.1f;
    p.presence_penalty = 0.1f;
    run("default + penalties (64-token window)", &p, peaked, n, hist, 64);
    kiln_logit_bias bias[8];
    for (int i = 0; i < 8; i++) bias[i] = (kiln_logit_bias){hist[i], i % 2 ? 5.0f : -INFINITY};
    p.logit_bias = bias;
    p.n_logit_bias = 8;
    run("default + penalties + 8 logit biases", &p, peaked, n, hist, 64);
    kiln_sampler_params_default(&p);
    p.n_logprobs = 5;
    run("default + logprobs (top 5)", &p, peaked, n, NULL, 0);
    kiln_sampler_params_default(&p);
    p.temperature = 0;
    run("greedy (temp 0)", &p, peaked, n, NULL, 0);
    kiln_sampler_params_default(&p);
    p.top_k = 0;
    run("top-k off (p.95 m.05)", &p, peaked, n, NULL, 0);
    run("top-k off (p.95 m.05), flat", &p, flat, n, NULL, 0);
    p.min_p = 0;
    run("top-k off, min-p off (p.95)", &p, peaked, n, NULL, 0);
    run("top-k off, min-p off (p.95), flat", &p, flat, n, NULL, 0);
    p.top_p = 1;
    p.temperature = 1;
    run("every filter off (temp 1 only)", &p, flat, n, NULL, 0);
    for (int k = 0; k < ROWS; k++) free(peaked[k]), free(flat[k]);
    return 0;
}
