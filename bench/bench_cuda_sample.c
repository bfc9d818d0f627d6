/*
 * bench_cuda_sample.c — the sampling chain on the GPU (cuda.sample) per decode step.
 *
 *   build/bench/bench_cuda_sample [N_VOCAB ...]     (default 128256 262144)
 *
 * For 1, 16 and 64 rows of N_VOCAB logits (N(0, 3^2) with a peaked head, as an LM head
 * gives) and each configuration (the default chain k40 p.95 m.05 t.8; the same with
 * penalties over a 64-token window; k 1000; greedy with penalties), the median and best
 * time of one launch over 200 launches (CUDA events, after 20 warm-up launches), in
 * microseconds, for the split path (a workspace: bound, gather, finish) and for one block per
 * row (no workspace). Next to it, what the host path costs for the same rows: the copy of the
 * logits to the host (pinned) and kiln_sample_batch on one thread (medians of 20).
 */
#include <stdio.h>

#ifndef KILN_HAVE_CUDA
int main(void) {
    printf("bench_cuda_sample: kiln was built without CUDA\n");
    return 0;
}
#else
#include "base/timer.h"
#include "kernels/cuda/cuda_kernels.h"
#include "sample/sample.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ITERS 200
#define WARM  20
#define MAXR  64
#define OVCAP 8192

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static uint64_t rs = 12345;
static double unif(void) {
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rs >> 11) * 0x1.0p-53;
}

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef struct conf {
    const char *name;
    float temp;
    int32_t k;
    float rep;
} conf;

int main(int argc, char **argv) {
    char why[256];
    if (kiln_cuda_probe(NULL, why, sizeof why) <= 0) {
        printf("SKIP: %s\n", why);
        return 0;
    }
    int32_t vocabs[8] = {128256, 262144};
    int nv = 2;
    if (argc > 1) {
        nv = 0;
        for (int i = 1; i < argc && nv < 8; i++) vocabs[nv++] = atoi(argv[i]);
    }
    static const conf confs[] = {{"default k40 p.95 m.05 t.8", 0.8f, 40, 1.0f},
                                 {"default + penalties (64)", 0.8f, 40, 1.1f},
                                 {"k1000 p.95 m.05 t.8", 0.8f, 1000, 1.0f},
                                 {"greedy + penalties (64)", 0.0f, 40, 1.1f}};
    static const int rowsv[] = {1, 16, 64};
    printf("%-28s %8s %5s %10s %10s %10s %10s %12s %12s\n", "configuration", "vocab", "rows",
           "split med", "split best", "1blk med", "1blk best", "d2h med us", "cpu med us");
    for (int v = 0; v < nv; v++) {
        const int32_t n = vocabs[v];
        float *h_lg;
        CK(cudaMallocHost((void **)&h_lg, (size_t)MAXR * (size_t)n * sizeof(float)));
        for (size_t i = 0; i < (size_t)MAXR * (size_t)n; i++) {
            double u1 = unif() + 1e-12, u2 = unif();
            h_lg[i] = (float)(3.0 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
        }
        for (int r = 0; r < MAXR; r++)
            for (int j = 0; j < 10; j++) h_lg[(size_t)r * n + (size_t)(unif() * n)] += 6.0f + j;
        float *d_lg, *h_copy;
        void *d_par;
        int32_t *d_ids;
        CK(cudaMalloc((void **)&d_lg, (size_t)MAXR * (size_t)n * sizeof(float)));
        CK(cudaMallocHost((void **)&h_copy, (size_t)MAXR * (size_t)n * sizeof(float)));
        CK(cudaMemcpy(d_lg, h_lg, (size_t)MAXR * (size_t)n * sizeof(float),
                      cudaMemcpyHostToDevice));
        const size_t rb = MAXR * sizeof(kiln_sample_row_params), ob = OVCAP * sizeof(int32_t);
        CK(cudaMalloc(&d_par, rb + 3 * ob));
        CK(cudaMalloc((void **)&d_ids, MAXR * sizeof(int32_t)));
        const size_t ws = kiln_cuda_sample_ws_bytes(MAXR, n);
        void *d_ws;
        CK(cudaMalloc(&d_ws, ws));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        for (size_t c = 0; c < sizeof confs / sizeof confs[0]; c++) {
            for (size_t ri = 0; ri < sizeof rowsv / sizeof rowsv[0]; ri++) {
                const int rows = rowsv[ri];
                kiln_sampler *s[MAXR];
                static kiln_sample_row_params rp[MAXR];
                static int32_t ov_id[OVCAP], ov_count[OVCAP];
                static float ov_bias[OVCAP];
                int32_t off = 0;
                for (int r = 0; r < rows; r++) {
                    kiln_sampler_params p;
                    kiln_sampler_params_default(&p);
                    p.temperature = confs[c].temp;
                    p.top_k = confs[c].k;
                    p.repeat_penalty = confs[c].rep;
                    p.seed = (uint64_t)r;
                    if (kiln_sampler_create(&p, n, &s[r], NULL)) return 1;
                    for (int i = 0; i < 64; i++)
                        kiln_sampler_accept(s[r], (int32_t)(unif() * (i % 2 ? 64 : n)));
                    rp[r].ov_off = off;
                    if (kiln_sampler_device_row(s[r], n, &rp[r], ov_id + off, ov_bias + off,
                                                ov_count + off, OVCAP - off, NULL))
                        return 1;
                    off += rp[r].n_ov;
                }
                uint8_t *dp = d_par;
                CK(cudaMemcpy(dp, rp, rb, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(dp + rb, ov_id, ob, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(dp + rb + ob, ov_bias, ob, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(dp + rb + 2 * ob, ov_count, ob, cudaMemcpyHostToDevice));
                kiln_sample_args a = {.logits = d_lg,
                                      .ld = n,
                                      .t = rows,
                                      .n = n,
                                      .rows = (const kiln_sample_row_params *)(const void *)dp,
                                      .ov_id = (const int32_t *)(const void *)(dp + rb),
                                      .ov_bias = (const float *)(const void *)(dp + rb + ob),
                                      .ov_count = (const int32_t *)(const void *)(dp + rb + 2 * ob),
                                      .ids = d_ids};
                kiln_kctx kc;
                memset(&kc, 0, sizeof kc);
                /* pass 0: one block per row (no workspace); pass 1: the split path */
                float t[2][ITERS];
                for (int pass = 0; pass < 2; pass++) {
                    kc.scratch = pass ? d_ws : NULL;
                    kc.scratch_size = pass ? ws : 0;
                    for (int it = 0; it < WARM + ITERS; it++) {
                        CK(cudaEventRecord(e0, 0));
                        if (kiln_cuda_sample(&kc, &a)) return 1;
                        CK(cudaEventRecord(e1, 0));
                        CK(cudaEventSynchronize(e1));
                        float ms;
                        CK(cudaEventElapsedTime(&ms, e0, e1));
                        if (it >= WARM) t[pass][it - WARM] = ms * 1000.0f;
                    }
                    qsort(t[pass], ITERS, sizeof(float), cmp_f);
                }
                /* the host path: copy the rows, sample them on one thread */
                float td[20], tc[20];
                for (int it = 0; it < 20; it++) {
                    uint64_t t0 = kiln_now_ns();
                    CK(cudaMemcpy(h_copy, d_lg, (size_t)rows * (size_t)n * sizeof(float),
                                  cudaMemcpyDeviceToHost));
                    uint64_t t1 = kiln_now_ns();
                    kiln_sample_row sr[MAXR];
                    kiln_sample_out so[MAXR];
                    for (int r = 0; r < rows; r++)
                        sr[r] = (kiln_sample_row){s[r], h_copy + (size_t)r * (size_t)n};
                    if (kiln_sample_batch(sr, rows, n, so, NULL)) return 1;
                    uint64_t t2 = kiln_now_ns();
                    td[it] = (float)(t1 - t0) * 1e-3f;
                    tc[it] = (float)(t2 - t1) * 1e-3f;
                }
                qsort(td, 20, sizeof(float), cmp_f);
                qsort(tc, 20, sizeof(float), cmp_f);
                printf("%-28s %8d %5d %10.1f %10.1f %10.1f %10.1f %12.1f %12.1f\n", confs[c].name,
                       (int)n, rows, t[1][ITERS / 2], t[1][0], t[0][ITERS / 2], t[0][0], td[10],
                       tc[10]);
                for (int r = 0; r < rows; r++) kiln_sampler_free(s[r]);
            }
        }
        cudaFree(d_lg);
        cudaFree(d_par);
        cudaFree(d_ids);
        cudaFree(d_ws);
        cudaFreeHost(h_lg);
        cudaFreeHost(h_copy);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    return 0;
}
#endif /* KILN_HAVE_CUDA */
