/* test_pool.c — the thread pool's dispatch protocol (src/base/pool.c) under stress:
 * many back-to-back kiln_pool_for / kiln_pool_run jobs with tiny or no work, so that
 * workers are often late (left out of a closed kiln_pool_for job), with and without
 * busy threads oversubscribing the CPUs. Checks: every chunk runs exactly once; no
 * worker touches a job's context after the dispatch returned (each context is poisoned
 * right after its call and every touch checks the poison); kiln_pool_run runs every
 * thread exactly once; the dispatch counter counts threaded dispatches. */
#include "testutil.h"

#include "base/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC 0x6b696c6eu

typedef struct job {
    _Atomic uint32_t magic;
    _Atomic int64_t sum;
    _Atomic int chunks;
} job;

static _Atomic int g_late_touch; /* a worker ran a job after its dispatch returned */

static void range_fn(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    job *j = ctx;
    if (atomic_load(&j->magic) != MAGIC) atomic_store(&g_late_touch, 1);
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&j->sum, i);
    atomic_fetch_add(&j->chunks, 1);
}

static void each_fn(void *ctx, int ith, int nth) {
    (void)nth;
    job *j = ctx;
    if (atomic_load(&j->magic) != MAGIC) atomic_store(&g_late_touch, 1);
    atomic_fetch_add(&j->sum, 1ll << (ith * 8));
}

static _Atomic int g_stop;

static void *hog(void *p) {
    (void)p;
    volatile uint64_t x = 0;
    while (!atomic_load(&g_stop)) x++;
    return NULL;
}

static void stress(int threads, int hogs) {
    pthread_t h[4];
    atomic_store(&g_stop, 0);
    for (int i = 0; i < hogs; i++) assert_int_equal(pthread_create(&h[i], NULL, hog, NULL), 0);
    kiln_pool *pool;
    assert_int_equal(kiln_pool_create(threads, &pool, NULL), KILN_OK);
    uint64_t expect_disp = 0;
    for (int rep = 0; rep < 20000; rep++) {
        job j;
        atomic_init(&j.magic, MAGIC);
        atomic_init(&j.sum, 0);
        atomic_init(&j.chunks, 0);
        if (rep % 7 == 3) {
            kiln_pool_run(pool, each_fn, &j);
            int64_t want = 0;
            for (int t = 0; t < threads; t++) want += 1ll << (t * 8);
            assert_int_equal(atomic_load(&j.sum), want);
            if (threads > 1) expect_disp++;
        } else {
            int64_t n = 1 + rep % 40, grain = 1 + rep % 3;
            kiln_pool_for(pool, n, grain, range_fn, &j);
            assert_int_equal(atomic_load(&j.sum), n * (n - 1) / 2);
            assert_int_equal(atomic_load(&j.chunks), (n + grain - 1) / grain);
            if (threads > 1 && n > grain) expect_disp++;
        }
        atomic_store(&j.magic, 0); /* poison: any later touch is a protocol bug */
    }
    assert_int_equal(kiln_pool_dispatches(pool), expect_disp);
    kiln_pool_free(pool);
    atomic_store(&g_stop, 1);
    for (int i = 0; i < hogs; i++) pthread_join(h[i], NULL);
    assert_int_equal(atomic_load(&g_late_touch), 0);
}

static void test_stress(void **state) {
    (void)state;
    stress(2, 0);
    stress(3, 0);
    stress(2, 2); /* oversubscribed: workers are descheduled and come late */
    stress(4, 1);
}

static void test_sleep_wake(void **state) {
    (void)state;
    /* gaps longer than the spin budget: workers go to sleep and must be woken */
    setenv("KILN_POOL_SPIN_US", "0", 1);
    kiln_pool *pool;
    assert_int_equal(kiln_pool_create(2, &pool, NULL), KILN_OK);
    unsetenv("KILN_POOL_SPIN_US");
    for (int rep = 0; rep < 200; rep++) {
        job j;
        atomic_init(&j.magic, MAGIC);
        atomic_init(&j.sum, 0);
        atomic_init(&j.chunks, 0);
        kiln_pool_run(pool, each_fn, &j);
        assert_int_equal(atomic_load(&j.sum), 1 + (1 << 8));
        atomic_store(&j.magic, 0);
    }
    kiln_pool_free(pool);
    assert_int_equal(atomic_load(&g_late_touch), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stress),
        cmocka_unit_test(test_sleep_wake),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
