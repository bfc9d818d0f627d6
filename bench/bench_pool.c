/*
 * bench_pool.c — the cost of one thread-pool dispatch (src/base/pool.c), the overhead a
 * decode step pays per threaded kernel call.
 *
 *   bench_pool [-t THREADS] [-n DISPATCHES] [-g GAP_US,...] [-f 1]
 *   bench_pool -m MODEL [-t THREADS] [-n TOKENS] [--logits 1]
 *
 * For each gap: the caller busy-works GAP microseconds (as the serial code between two
 * kernels of a decode step does), then dispatches a task whose every thread only
 * records when it started; the dispatch costs (a) the wake-up: last thread's start
 * minus the call, and (b) the round trip: the call's return minus the call, for an
 * empty task. -f 1 dispatches through kiln_pool_for (2 chunks of nothing; a worker
 * that comes late is left out, so "wake-up" is then the caller's own start when the
 * worker took no chunk) instead of kiln_pool_run (every thread must run). Prints min / median / p90
 * / p99 / max in microseconds and the mean.
 */
#include "base/pool.h"
#include "base/timer.h"
#include "model/model.h"
#include "runtime/engine.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct probe {
    _Atomic uint64_t last_start;
} probe;

static void task(void *ctx, int ith, int nth) {
    (void)ith, (void)nth;
    probe *p = ctx;
    uint64_t now = kiln_now_ns(), prev = atomic_load(&p->last_start);
    while (now > prev && !atomic_compare_exchange_weak(&p->last_start, &prev, now)) {
    }
}

static void range_task(void *ctx, int64_t b, int64_t e, int ith) {
    (void)b, (void)e;
    task(ctx, ith, 0);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void spin_us(double us) {
    uint64_t end = kiln_now_ns() + (uint64_t)(us * 1000.0);
    volatile double acc = 1.0;
    while (kiln_now_ns() < end) acc = acc * 1.0000001 + 1e-9;
}

static void report(const char *what, double gap, uint64_t *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    double mean = 0;
    for (int i = 0; i < n; i++) mean += (double)v[i];
    mean /= n;
    printf("| %7.0f | %-9s | %8.2f | %8.2f | %8.2f | %8.2f | %9.2f | %8.2f |\n", gap, what,
           v[0] / 1e3, v[n / 2] / 1e3, v[n * 9 / 10] / 1e3, v[n * 99 / 100] / 1e3, v[n - 1] / 1e3,
           mean / 1e3);
}

static int decode(const char *path, int threads, int n, bool logits) {
    kiln_err err;
    kiln_model *m;
    if (kiln_model_load(path, &m, &err)) {
        fprintf(stderr, "bench_pool: %s\n", err.msg);
        return 1;
    }
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.backend = "cpu";
    o.n_threads = threads;
    o.n_ctx = n + 16;
    o.max_seqs = 1;
    o.kv_f16 = true;
    kiln_engine *e;
    if (kiln_engine_create(m, &o, &e, &err)) {
        fprintf(stderr, "bench_pool: %s\n", err.msg);
        kiln_model_free(m);
        return 1;
    }
    float *lg = malloc(sizeof(float) * (size_t)m->cfg.n_vocab);
    int32_t seq, tok = 1;
    kiln_seq_create(e, &seq, &err);
    uint64_t d0 = kiln_pool_dispatches(e->pool), t0 = kiln_now_ns();
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        kiln_batch_entry b = {seq, tok, i, 1};
        rc = logits ? kiln_engine_step(e, &b, 1, lg, &err)
                    : kiln_engine_step_greedy(e, &b, 1, 0, &tok, &err);
        if (tok < 0) tok = 1;
    }
    double ms = (double)(kiln_now_ns() - t0) / 1e6;
    if (rc)
        fprintf(stderr, "bench_pool: %s\n", err.msg);
    else
        printf("%s: %d tokens, %.1f pool dispatches per token, %.2f ms per token\n", path, n,
               (double)(kiln_pool_dispatches(e->pool) - d0) / n, ms / n);
    free(lg);
    kiln_engine_free(e);
    kiln_model_free(m);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    int threads = 2, n = 2000, use_for = 0, logits = 0;
    const char *model = NULL;
    char gaps_s[256] = "0,2,10,50,200,1000";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-t"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-n"))
            n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-g"))
            snprintf(gaps_s, sizeof gaps_s, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "-f"))
            use_for = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-m"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--logits"))
            logits = atoi(argv[i + 1]);
        else {
            fprintf(stderr,
                    "usage: bench_pool [-t THREADS] [-n DISPATCHES] [-g GAP_US,...] [-f 1]\n");
            return 2;
        }
    }
    if (model) return decode(model, threads, n < 2000 ? n : 64, logits != 0);
    if (n < 10) n = 10;
    kiln_pool *pool;
    kiln_err err;
    if (kiln_pool_create(threads, &pool, &err)) {
        fprintf(stderr, "bench_pool: %s\n", err.msg);
        return 1;
    }
    uint64_t *wake = malloc(sizeof(uint64_t) * (size_t)n),
             *rt = malloc(sizeof(uint64_t) * (size_t)n);
    if (!wake || !rt) return 1;
    printf("pool of %d threads, %d dispatches per gap (times in us)\n\n", kiln_pool_size(pool), n);
    printf("| gap us | what | min | median | p90 | p99 | max | mean |\n");
    printf("|---:|---|---:|---:|---:|---:|---:|---:|\n");
    char *save = NULL;
    for (char *g = strtok_r(gaps_s, ",", &save); g; g = strtok_r(NULL, ",", &save)) {
        double gap = atof(g);
        for (int i = 0; i < n; i++) {
            spin_us(gap);
            probe p;
            atomic_init(&p.last_start, 0);
            uint64_t t0 = kiln_now_ns();
            if (use_for)
                kiln_pool_for(pool, 2, 1, range_task, &p);
            else
                kiln_pool_run(pool, task, &p);
            uint64_t t1 = kiln_now_ns();
            wake[i] = atomic_load(&p.last_start) - t0;
            rt[i] = t1 - t0;
        }
        report("wake-up", gap, wake, n);
        report("round trip", gap, rt, n);
    }
    kiln_pool_free(pool);
    free(wake);
    free(rt);
    return 0;
}
