
#include "base/pool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SPIN_ITERS 20000

struct kiln_pool {
    int n;
    pthread_t *threads;
    struct worker_arg *args;
    _Atomic uint32_t gen;     /* bumped per job; futex word for sleeping workers */
    _Atomic uint32_t pending; /* workers still running the job; futex word for the caller */
    _Atomic int sleepers;     /* workers blocked in futex_wait on gen */
    _Atomic int caller_sleeping;
    _Atomic int stop;
    kiln_pool_task fn;
    void *ctx;
};

struct worker_arg {
    kiln_pool *pool;
    int ith;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}
static void futex_wake_all(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    atomic_signal_fence(memory_order_seq_cst);
#endif
}

int kiln_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

static void *worker_main(void *p) {
    struct worker_arg *a = p;
    kiln_pool *pool = a->pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool->gen, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            atomic_fetch_add(&pool->sleepers, 1);
            futex_wait(&pool->gen, seen);
            atomic_fetch_sub(&pool->sleepers, 1);
            spins = 0;
        }
        seen = g;
        if (atomic_load_explicit(&pool->stop, memory_order_acquire)) break;
        pool->fn(pool->ctx, a->ith, pool->n);
        if (atomic_fetch_sub(&pool->pending, 1) == 1 && atomic_load(&pool->caller_sleeping))
            futex_wake_all(&pool->pending);
    }
    return NULL;
}

kiln_status kiln_pool_create(int n_threads, kiln_pool **out, kiln_err *err) {
    *out = NULL;
    if (n_threads <= 0) n_threads = kiln_cpu_count();
    if (n_threads > 1024)
        return kiln_err_set(err, KILN_ERR_RANGE, "thread pool: %d threads is too many (max 1024)",
                            n_threads);
    kiln_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return kiln_err_set(err, KILN_ERR_NOMEM, "thread pool: out of memory");
    pool->n = n_threads;
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    pool->args = calloc((size_t)n_threads, sizeof *pool->args);
    if (!pool->threads || !pool->args) {
        free(pool->threads);
        free(pool->args);
        free(pool);
        return kiln_err_set(err, KILN_ERR_NOMEM, "thread pool: out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        pool->args[i].pool = pool;
        pool->args[i].ith = i;
        int rc = pthread_create(&pool->threads[i], NULL, worker_main, &pool->args[i]);
        if (rc != 0) {
            pool->n = i; /* join the ones that started */
            kiln_pool_free(pool);
            return kiln_err_errno(err, rc, "thread pool: creating thread %d of %d", i, n_threads);
        }
    }
    *out = pool;
    return KILN_OK;
}

static void noop_task(void *ctx, int ith, int nth) {
    (void)ctx, (void)ith, (void)nth;
}

void kiln_pool_free(kiln_pool *pool) {
    if (!pool) return;
    if (pool->n > 1) {
        pool->fn = noop_task;
        atomic_store(&pool->stop, 1);
        atomic_fetch_add(&pool->gen, 1);
        futex_wake_all(&pool->gen);
        for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    }
    free(pool->threads);
    free(pool->args);
    free(pool);
}

int kiln_pool_size(const kiln_pool *pool) {
    return pool ? pool->n : 1;
}

void kiln_pool_run(kiln_pool *pool, kiln_pool_task fn, void *ctx) {
    if (!pool || pool->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store(&pool->pending, (uint32_t)(pool->n - 1));
    atomic_fetch_add(&pool->gen, 1); /* seq_cst: publishes fn/ctx/pending */
    if (atomic_load(&pool->sleepers) > 0) futex_wake_all(&pool->gen);
    fn(ctx, 0, pool->n);
    int spins = 0;
    uint32_t p;
    while ((p = atomic_load_explicit(&pool->pending, memory_order_acquire)) != 0) {
        if (++spins < SPIN_ITERS) {
            cpu_relax();
            continue;
        }
        atomic_store(&pool->caller_sleeping, 1);
        futex_wait(&pool->pending, p);
        atomic_store(&pool->caller_sleeping, 0);
        spins = 0;
    }
}

struct for_ctx {
    _Atomic int64_t next;
    int64_t n, grain;
    kiln_pool_range fn;
    void *ctx;
};

static void for_task(void *p, int ith, int nth) {
    (void)nth;
    struct for_ctx *f = p;
    for (;;) {
        int64_t b = atomic_fetch_add_explicit(&f->next, f->grain, memory_order_relaxed);
        if (b >= f->n) break;
        int64_t e = b + f->grain < f->n ? b + f->grain : f->n;
        f->fn(f->ctx, b, e, ith);
    }
}

void kiln_pool_for(kiln_pool *pool, int64_t n, int64_t grain, kiln_pool_range fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (!pool || pool->n == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    struct for_ctx f = {.n = n, .grain = grain, .fn = fn, .ctx = ctx};
    atomic_init(&f.next, 0);
    kiln_pool_run(pool, for_task, &f);
}
