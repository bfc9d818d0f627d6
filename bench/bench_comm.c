/*
 * bench_comm.c — the host communicator's collectives (src/runtime/comm.c): the time one
 * all_reduce (sum, f32) and one all_gather take over R ranks (threads), for a few sizes:
 * a decode step's all-reduce of one token (n_embd floats) up to a prefill chunk's.
 *
 *   bench_comm [-r RANKS,...] [-n ITERS]
 *
 * Per (ranks, floats): rank 0's median and p90 microseconds per collective over ITERS
 * calls after 20 warm-up calls, and the reduction's throughput (floats summed per
 * second over all ranks' inputs). Contended machines give noisy numbers: docs/TP.md.
 */
#include "base/timer.h"
#include "runtime/comm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct job {
    kiln_comm *c;
    int rank, iters;
    size_t count;
    bool gather;
    double *us; /* [iters] rank 0 only */
    int failed;
} job;

static void *worker(void *arg) {
    job *j = arg;
    const int n = kiln_comm_size(j->c);
    float *in = calloc(j->count, sizeof(float));
    float *out = calloc(j->count * (j->gather ? (size_t)n : 1), sizeof(float));
    if (!in || !out) {
        j->failed = 1;
        free(in);
        free(out);
        return NULL;
    }
    for (size_t i = 0; i < j->count; i++) in[i] = (float)(i % 7) * 0.5f + (float)j->rank;
    kiln_err err;
    for (int it = -20; it < j->iters && !j->failed; it++) {
        uint64_t t0 = kiln_now_ns();
        kiln_status st =
            j->gather
                ? kiln_comm_all_gather(j->c, j->rank, in, out, j->count * sizeof(float), NULL, &err)
                : kiln_comm_all_reduce_sum_f32(j->c, j->rank, in, out, j->count, NULL, &err);
        if (st) {
            fprintf(stderr, "bench_comm: %s\n", err.msg);
            j->failed = 1;
        }
        if (it >= 0 && j->us) j->us[it] = (double)(kiln_now_ns() - t0) * 1e-3;
    }
    free(in);
    free(out);
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    char ranks_s[64] = "2,4";
    int iters = 200;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-r"))
            snprintf(ranks_s, sizeof ranks_s, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "-n"))
            iters = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_comm [-r RANKS,...] [-n ITERS]\n");
            return 2;
        }
    }
    if (iters < 1 || iters > 100000) {
        fprintf(stderr, "bench_comm: -n %d (1..100000)\n", iters);
        return 2;
    }
    static const size_t sizes[] = {896, 4096, 8192, 64 * 4096, 512 * 4096};
    double *us = calloc((size_t)iters, sizeof(double));
    if (!us) return 1;
    printf("| collective | ranks | floats | median µs | p90 µs | Gfloat/s summed |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: |\n");
    char *save = NULL;
    for (char *p = strtok_r(ranks_s, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        const int n = atoi(p);
        kiln_comm *c;
        kiln_err err;
        if (kiln_comm_host_create(n, &c, &err)) {
            fprintf(stderr, "bench_comm: %s\n", err.msg);
            free(us);
            return 1;
        }
        for (int g = 0; g < 2; g++)
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
                pthread_t th[KILN_COMM_MAX_RANKS];
                job j[KILN_COMM_MAX_RANKS];
                for (int r = 0; r < n; r++) {
                    j[r] = (job){c, r, iters, sizes[s], g == 1, r == 0 ? us : NULL, 0};
                    if (pthread_create(&th[r], NULL, worker, &j[r]) != 0) {
                        fprintf(stderr, "bench_comm: thread %d\n", r);
                        return 1; /* a bench: the started threads end with the process */
                    }
                }
                int failed = 0;
                for (int r = 0; r < n; r++) {
                    pthread_join(th[r], NULL);
                    failed |= j[r].failed;
                }
                if (failed) {
                    kiln_comm_free(c);
                    free(us);
                    return 1;
                }
                qsort(us, (size_t)iters, sizeof(double), cmp);
                const double med = us[iters / 2], p90 = us[iters * 9 / 10];
                char thr[32] = "-";
                if (!g) snprintf(thr, sizeof thr, "%.2f", (double)sizes[s] * n / (med * 1e3));
                printf("| %s | %d | %zu | %.1f | %.1f | %s |\n", g ? "all_gather" : "all_reduce", n,
                       sizes[s], med, p90, thr);
            }
        kiln_comm_free(c);
    }
    free(us);
    return 0;
}
