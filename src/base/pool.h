/*
 * pool.h — a persistent thread pool for kernels.
 *
 * n_threads - 1 worker threads are created once; the calling thread is thread 0 of
 * every job, so a pool of 1 runs everything inline. Dispatch is a generation counter:
 * workers spin on it for a time budget (KILN_POOL_SPIN_US, default 1000 us: low latency
 * between the back-to-back ops of a decode step), then sleep on a futex; the caller
 * wakes sleepers only when there are any. In kiln_pool_for a worker that has not joined
 * by the time the caller has handed out every chunk is left out of that job (the caller
 * never waits for a thread that is descheduled before it started: pool.c explains).
 *
 * Jobs must not call back into the same pool (no nesting). One job at a time per
 * pool: the pool belongs to one executor thread. A NULL pool means "run inline".
 */
#ifndef KILN_BASE_POOL_H
#define KILN_BASE_POOL_H

#include "base/status.h"

#include <stdint.h>

typedef struct kiln_pool kiln_pool;

/* Called once on every thread: ith in [0, nth). */
typedef void (*kiln_pool_task)(void *ctx, int ith, int nth);
/* Called for consecutive sub-ranges [begin, end) of a parallel-for; ith is the thread. */
typedef void (*kiln_pool_range)(void *ctx, int64_t begin, int64_t end, int ith);

/* n_threads <= 0 means the number of online CPUs. */
kiln_status kiln_pool_create(int n_threads, kiln_pool **out, kiln_err *err);
/* Joins the workers. NULL-safe. */
void kiln_pool_free(kiln_pool *pool);
/* Number of threads including the caller (1 for NULL). */
int kiln_pool_size(const kiln_pool *pool);

/* Runs fn on every thread and returns when all are done. */
void kiln_pool_run(kiln_pool *pool, kiln_pool_task fn, void *ctx);

/* Splits [0, n) into chunks of `grain` (>= 1) handed out dynamically; any subset of
 * the threads may take part (fn must not assume every ith runs). */
void kiln_pool_for(kiln_pool *pool, int64_t n, int64_t grain, kiln_pool_range fn, void *ctx);

/* Static split helper: the [begin, end) share of thread ith out of nth over n items. */
static inline void kiln_split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    int64_t per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
}

/* Threaded dispatches (kiln_pool_run / kiln_pool_for calls that woke the workers) since
 * creation; read by the thread that dispatches. */
uint64_t kiln_pool_dispatches(const kiln_pool *pool);

/* Number of online CPUs (>= 1). */
int kiln_cpu_count(void);

#endif /* KILN_BASE_POOL_H */
