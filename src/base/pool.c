
#include "base/pool.h"
#include "base/mem.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/*
 * Dispatch protocol. A job is published as (fn, ctx, kind) and a new job number in
 * `state`, then `gen` (the futex word sleeping workers wait on) is bumped. `state` is
 * [job number: 32 | closed: 1 | active: 31]; a worker that saw the new gen *enters* the
 * job with a CAS that increments `active` only while the job number is its own and the
 * job is not closed, and only then reads fn / ctx; it leaves by decrementing `active`.
 *  - kiln_pool_run (every thread must run fn once): the caller waits until all n - 1
 *    workers have finished (`finished`).
 *  - kiln_pool_for (dynamic chunks, any thread may do any chunk): the caller takes
 *    chunks too and, when none is left, *closes* the job and waits only for the workers
 *    inside it. A worker that had not entered yet (descheduled by the OS or the
 *    hypervisor: on a shared 2-vCPU VM a wake-up can take milliseconds) no longer
 *    enters; it never touches the finished job's ctx. So a late worker costs the step
 *    nothing instead of a stall; one that holds a chunk is still waited for.
 * Waiting (workers for a job, the caller for workers) spins 10 us, then yields the CPU
 * in a loop up to a time budget, then sleeps on a futex. The budget is
 * KILN_POOL_SPIN_US (default 1000 us; decode steps dispatch every few to few hundred
 * microseconds, so workers stay hot within a step); KILN_POOL_CALLER_US (default: the
 * same) is the caller's budget when it waits for workers; KILN_POOL_YIELD=0 spins without
 * yielding, KILN_POOL_PAUSE=0 without the PAUSE instruction (under KVM a PAUSE loop can
 * trigger pause-loop exits).
 */
#define JOB_SHIFT   32
#define CLOSED      (1ull << 31)
#define ACTIVE_MASK (CLOSED - 1)

struct kiln_pool {
    int n;
    pthread_t *threads;
    struct worker_arg *args;
    _Atomic uint32_t gen;      /* bumped per job; futex word for sleeping workers */
    _Atomic uint64_t state;    /* job | closed | active (see above) */
    _Atomic uint32_t finished; /* workers done with the current kiln_pool_run job */
    _Atomic uint32_t wake_seq; /* futex word for the caller */
    _Atomic int sleepers;      /* workers blocked in futex_wait on gen */
    _Atomic int caller_sleeping;
    _Atomic int stop;
    bool all; /* the job needs every thread (kiln_pool_run) */
    kiln_pool_task fn;
    void *ctx;
    uint64_t spin_ns, caller_ns;
    bool pause, yield;
    uint64_t dispatches;
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
static inline void cpu_relax(bool pause) {
#if defined(__x86_64__) || defined(__i386__)
    if (pause) {
        __builtin_ia32_pause();
        return;
    }
#endif
    (void)pause;
    atomic_signal_fence(memory_order_seq_cst);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A wait budget: true while waiting should go on without sleeping. The first
 * HOT_NS (10 us) spin (PAUSE); then each call yields the CPU (sched_yield), so that when
 * both threads of a job share one CPU — the other vCPU busy with other processes —
 * the spinner hands the CPU to the thread it waits for instead of burning its slice;
 * after spin_ns in all the caller sleeps on a futex. The clock is read every 64 spins. */
#define HOT_NS 10000u

typedef struct spin {
    uint64_t start;
    unsigned count;
    bool yielding;
    uint64_t budget; /* 0: pool->spin_ns */
} spin;

static bool spin_more(const kiln_pool *pool, spin *s) {
    if (!s->yielding && (++s->count & 63) != 0) {
        cpu_relax(pool->pause);
        return true;
    }
    uint64_t t = now_ns();
    if (s->start == 0) s->start = t;
    if (t - s->start >= (s->budget ? s->budget : pool->spin_ns)) return false;
    if (pool->yield && t - s->start >= HOT_NS) {
        s->yielding = true;
        sched_yield();
    }
    return true;
}

int kiln_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

static void caller_wake(kiln_pool *pool) {
    if (atomic_load(&pool->caller_sleeping)) {
        atomic_fetch_add(&pool->wake_seq, 1);
        futex_wake_all(&pool->wake_seq);
    }
}

static void *worker_main(void *p) {
    struct worker_arg *a = p;
    kiln_pool *pool = a->pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        spin sp = {0, 0, false, 0};
        while ((g = atomic_load_explicit(&pool->gen, memory_order_acquire)) == seen) {
            if (spin_more(pool, &sp)) continue;
            atomic_fetch_add(&pool->sleepers, 1);
            futex_wait(&pool->gen, seen);
            atomic_fetch_sub(&pool->sleepers, 1);
            sp = (spin){0, 0, false, 0};
        }
        seen = g;
        if (atomic_load_explicit(&pool->stop, memory_order_acquire)) break;
        /* enter job g unless it is closed (or already over) */
        uint64_t s = atomic_load(&pool->state);
        bool entered = false;
        while ((uint32_t)(s >> JOB_SHIFT) == g && !(s & CLOSED))
            if (atomic_compare_exchange_weak(&pool->state, &s, s + 1)) {
                entered = true;
                break;
            }
        if (!entered) continue;
        const bool all = pool->all;
        pool->fn(pool->ctx, a->ith, pool->n);
        if (all) atomic_fetch_add(&pool->finished, 1);
        atomic_fetch_sub(&pool->state, 1);
        caller_wake(pool);
    }
    return NULL;
}

kiln_status kiln_pool_create(int n_threads, kiln_pool **out, kiln_err *err) {
    *out = NULL;
    if (n_threads <= 0) n_threads = kiln_cpu_count();
    if (n_threads > 1024)
        return kiln_err_set(err, KILN_ERR_RANGE, "thread pool: %d threads is too many (max 1024)",
                            n_threads);
    kiln_pool *pool = kiln_calloc(1, sizeof *pool);
    if (!pool) return kiln_err_set(err, KILN_ERR_NOMEM, "thread pool: out of memory");
    pool->n = n_threads;
    const char *us = getenv("KILN_POOL_SPIN_US"), *pz = getenv("KILN_POOL_PAUSE");
    long v = us && *us ? strtol(us, NULL, 10) : 1000;
    pool->spin_ns = (uint64_t)(v < 0 ? 0 : v > 1000000 ? 1000000 : v) * 1000u;
    const char *cu = getenv("KILN_POOL_CALLER_US");
    long c = cu && *cu ? strtol(cu, NULL, 10) : v;
    pool->caller_ns = (uint64_t)(c < 1 ? 1 : c > 1000000 ? 1000000 : c) * 1000u;
    if (pool->caller_ns > pool->spin_ns && pool->spin_ns > 0) pool->caller_ns = pool->spin_ns;
    pool->pause = !(pz && strcmp(pz, "0") == 0);
    const char *yz = getenv("KILN_POOL_YIELD");
    pool->yield = !(yz && strcmp(yz, "0") == 0);
    pool->threads = kiln_calloc((size_t)n_threads, sizeof *pool->threads);
    pool->args = kiln_calloc((size_t)n_threads, sizeof *pool->args);
    if (!pool->threads || !pool->args) {
        kiln_free(pool->threads);
        kiln_free(pool->args);
        kiln_free(pool);
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

void kiln_pool_free(kiln_pool *pool) {
    if (!pool) return;
    if (pool->n > 1) {
        atomic_store(&pool->stop, 1);
        atomic_fetch_add(&pool->gen, 1);
        futex_wake_all(&pool->gen);
        for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    }
    kiln_free(pool->threads);
    kiln_free(pool->args);
    kiln_free(pool);
}

int kiln_pool_size(const kiln_pool *pool) {
    return pool ? pool->n : 1;
}

uint64_t kiln_pool_dispatches(const kiln_pool *pool) {
    return pool ? pool->dispatches : 0;
}

/* Publishes a job, runs fn on the caller, then waits as the job kind says. */
static void dispatch(kiln_pool *pool, kiln_pool_task fn, void *ctx, bool all) {
    pool->dispatches++;
    pool->fn = fn;
    pool->ctx = ctx;
    pool->all = all;
    atomic_store(&pool->finished, 0);
    const uint32_t g = atomic_load(&pool->gen) + 1;
    atomic_store(&pool->state, (uint64_t)g << JOB_SHIFT);
    atomic_store(&pool->gen, g); /* seq_cst: publishes fn/ctx/all/state */
    if (atomic_load(&pool->sleepers) > 0) futex_wake_all(&pool->gen);
    fn(ctx, 0, pool->n);
    if (!all) atomic_fetch_or(&pool->state, CLOSED); /* late workers stay out */
    spin sp = {0, 0, false, pool->caller_ns};
    for (;;) {
        bool done = all ? atomic_load(&pool->finished) == (uint32_t)(pool->n - 1)
                        : (atomic_load(&pool->state) & ACTIVE_MASK) == 0;
        if (done) break;
        if (spin_more(pool, &sp)) continue;
        atomic_store(&pool->caller_sleeping, 1);
        uint32_t w = atomic_load(&pool->wake_seq);
        done = all ? atomic_load(&pool->finished) == (uint32_t)(pool->n - 1)
                   : (atomic_load(&pool->state) & ACTIVE_MASK) == 0;
        if (!done) futex_wait(&pool->wake_seq, w);
        atomic_store(&pool->caller_sleeping, 0);
        sp = (spin){0, 0, false, pool->caller_ns};
    }
    /* kiln_pool_run: every worker has left (finished counts after fn; `active` drops
     * right after) — close so the state cannot be entered again */
    if (all) {
        atomic_fetch_or(&pool->state, CLOSED);
        while ((atomic_load(&pool->state) & ACTIVE_MASK) != 0) cpu_relax(pool->pause);
    }
}

void kiln_pool_run(kiln_pool *pool, kiln_pool_task fn, void *ctx) {
    if (!pool || pool->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    dispatch(pool, fn, ctx, true);
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
    dispatch(pool, for_task, &f, false);
}
