/* test_base.c — status/error chaining, logging levels, arenas, checked sizes, thread
 * pool, UTF-8, hashing. */
#include "base/hash.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/pool.h"
#include "base/timer.h"
#include "base/utf8.h"
#include "testutil.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static void test_err_chain(void **state) {
    (void)state;
    kiln_err e;
    kiln_err_clear(&e);
    assert_int_equal(
        kiln_err_set(&e, KILN_ERR_FORMAT, "offset %d past end of file (size %d)", 123, 100),
        KILN_ERR_FORMAT);
    kiln_err_wrap(&e, KILN_ERR_FORMAT, "tensor '%s'", "blk.3.attn_q.weight");
    kiln_err_wrap(&e, KILN_ERR_FORMAT, "loading %s", "X");
    assert_string_equal(
        e.msg, "loading X: tensor 'blk.3.attn_q.weight': offset 123 past end of file (size 100)");
    assert_int_equal(e.code, KILN_ERR_FORMAT);
    assert_int_equal(kiln_err_set(NULL, KILN_ERR_IO, "x"), KILN_ERR_IO);
    assert_string_equal(kiln_status_name(KILN_ERR_NOMEM), "KILN_ERR_NOMEM");
    assert_string_equal(kiln_status_name((kiln_status)999), "KILN_STATUS_UNKNOWN");
    /* long messages truncate, never overflow */
    char big[4000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    kiln_err_set(&e, KILN_ERR_FORMAT, "%s", big);
    assert_int_equal(strlen(e.msg), KILN_ERR_MSG_MAX - 1);
    kiln_err_errno(&e, 2, "opening %s", "/nope");
    assert_int_equal(e.code, KILN_ERR_NOT_FOUND);
    assert_non_null(strstr(e.msg, "opening /nope: "));
}

static int sink_calls;
static void sink(kiln_log_level l, const char *line, void *u) {
    (void)l, (void)u;
    if (strstr(line, "hello 42")) sink_calls++;
}

static void test_log(void **state) {
    (void)state;
    kiln_log_level lv;
    assert_int_equal(kiln_log_parse_level("debug", &lv), KILN_OK);
    assert_int_equal(lv, KILN_LOG_DEBUG);
    assert_int_equal(kiln_log_parse_level("ERROR", &lv), KILN_OK);
    assert_int_equal(lv, KILN_LOG_ERROR);
    assert_int_not_equal(kiln_log_parse_level("loud", &lv), KILN_OK);
    kiln_log_set_sink(sink, NULL);
    kiln_log_set_level(KILN_LOG_WARN);
    KILN_INFO("hello %d", 42); /* below threshold: not delivered */
    assert_int_equal(sink_calls, 0);
    KILN_WARN("hello %d", 42);
    assert_int_equal(sink_calls, 1);
    kiln_log_set_sink(NULL, NULL);
}

static void test_sizes_and_arena(void **state) {
    (void)state;
    size_t r;
    assert_true(kiln_size_mul(1u << 20, 1u << 20, &r));
    assert_false(kiln_size_mul(SIZE_MAX / 2, 3, &r));
    assert_false(kiln_size_add(SIZE_MAX, 1, &r));
    assert_true(kiln_size_align_up(65, 64, &r));
    assert_int_equal(r, 128);
    assert_false(kiln_size_align_up(SIZE_MAX - 3, 64, &r));
    kiln_err e;
    assert_int_equal(kiln_size_mul_err(SIZE_MAX, 2, &r, "tensor bytes", &e), KILN_ERR_OVERFLOW);
    assert_non_null(strstr(e.msg, "tensor bytes"));

    void *p = kiln_alloc_aligned(100);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    kiln_free_aligned(p);
    kiln_free_aligned(NULL);

    kiln_arena a;
    kiln_arena_init(&a, 4096);
    for (int i = 0; i < 1000; i++) {
        char *q = kiln_arena_alloc(&a, (size_t)(i % 300) + 1);
        assert_non_null(q);
        assert_int_equal((uintptr_t)q % 64, 0);
        memset(q, 0xAB, (size_t)(i % 300) + 1);
    }
    void *huge = kiln_arena_alloc(&a, 1 << 20); /* larger than a chunk */
    assert_non_null(huge);
    assert_null(kiln_arena_alloc(&a, SIZE_MAX - 10));
    assert_null(kiln_arena_calloc(&a, SIZE_MAX / 2, 4));
    char *s = kiln_arena_strndup(&a, "hello world", 5);
    assert_string_equal(s, "hello");
    kiln_arena_reset(&a);
    assert_int_equal(a.bytes_used, 0);
    assert_non_null(kiln_arena_alloc(&a, 10));
    kiln_arena_free(&a);
}

typedef struct {
    _Atomic int64_t sum;
    int8_t *hits;
} pool_ctx;

static void range_fn(void *p, int64_t b, int64_t e, int ith) {
    (void)ith;
    pool_ctx *c = p;
    int64_t s = 0;
    for (int64_t i = b; i < e; i++) {
        s += i;
        c->hits[i]++;
    }
    atomic_fetch_add(&c->sum, s);
}

static void each_fn(void *p, int ith, int nth) {
    _Atomic int *mask = p;
    atomic_fetch_or(mask, 1 << ith);
    (void)nth;
}

/* kiln_memcpy_stream equals memcpy at every size around its thresholds and every
 * source / destination misalignment, and leaves the bytes around the copy alone. */
static void test_memcpy_stream(void **state) {
    (void)state;
    enum { N = 4096 + 64 };
    uint8_t *src = malloc(N), *dst = malloc(N + 64), *ref = malloc(N + 64);
    assert_non_null(src);
    assert_non_null(dst);
    assert_non_null(ref);
    for (size_t i = 0; i < N; i++) src[i] = (uint8_t)(i * 131u + 7u);
    static const size_t sizes[] = {0, 1, 15, 255, 256, 257, 319, 320, 1000, 4096};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (size_t so = 0; so < 16; so += 5)
            for (size_t d = 0; d < 17; d++) {
                memset(dst, 0xA5, N + 64);
                memset(ref, 0xA5, N + 64);
                kiln_memcpy_stream(dst + d, src + so, sizes[si]);
                memcpy(ref + d, src + so, sizes[si]);
                assert_memory_equal(dst, ref, N + 64);
            }
    free(src);
    free(dst);
    free(ref);
}

static void test_pool(void **state) {
    (void)state;
    kiln_err e;
    for (int nt = 1; nt <= 4; nt++) {
        kiln_pool *pool;
        assert_int_equal(kiln_pool_create(nt, &pool, &e), KILN_OK);
        assert_int_equal(kiln_pool_size(pool), nt);
        for (int rep = 0; rep < 200; rep++) {
            int64_t n = 1 + rep * 37;
            pool_ctx c = {.hits = calloc((size_t)n, 1)};
            atomic_init(&c.sum, 0);
            kiln_pool_for(pool, n, 1 + rep % 13, range_fn, &c);
            assert_int_equal(atomic_load(&c.sum), n * (n - 1) / 2);
            for (int64_t i = 0; i < n; i++) assert_int_equal(c.hits[i], 1);
            free(c.hits);
            _Atomic int mask = 0;
            kiln_pool_run(pool, each_fn, &mask);
            assert_int_equal(atomic_load(&mask), (1 << nt) - 1);
        }
        kiln_pool_free(pool);
    }
    int64_t b, en, total = 0;
    for (int i = 0; i < 3; i++) {
        kiln_split_range(10, i, 3, &b, &en);
        total += en - b;
    }
    assert_int_equal(total, 10);
}

static void test_utf8(void **state) {
    (void)state;
    const char *ok = "a\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80";
    assert_true(kiln_utf8_valid(ok, strlen(ok), NULL));
    size_t bad;
    assert_false(kiln_utf8_valid("ab\xc0\xaf", 4, &bad)); /* overlong */
    assert_int_equal(bad, 2);
    assert_false(kiln_utf8_valid("\xed\xa0\x80", 3, NULL));     /* surrogate */
    assert_false(kiln_utf8_valid("\xf4\x90\x80\x80", 4, NULL)); /* > U+10FFFF */
    uint32_t cp;
    assert_int_equal(kiln_utf8_decode((const uint8_t *)"\xf0\x9f\x98\x80", 4, &cp), 4);
    assert_int_equal(cp, 0x1F600);
    assert_true(kiln_utf8_decode((const uint8_t *)"\xe4\xb8", 2, &cp) < 0);
    assert_int_equal(cp, KILN_UTF8_REPLACEMENT);
    char buf[4];
    assert_int_equal(kiln_utf8_encode(0x4E2D, buf), 3);
    assert_memory_equal(buf, "\xe4\xb8\xad", 3);
    assert_int_equal(kiln_utf8_encode(0xD800, buf), 0);
    /* complete prefix holds back a partial character at every split */
    const uint8_t *u = (const uint8_t *)ok;
    size_t n = strlen(ok);
    for (size_t k = 0; k <= n; k++) {
        size_t p = kiln_utf8_complete_prefix(u, k);
        assert_true(kiln_utf8_valid(u, p, NULL));
        assert_true(k - p < 4);
    }
    assert_int_equal(kiln_utf8_complete_prefix(u, 2), 1);
    assert_int_equal(kiln_utf8_complete_prefix(u, 3), 3);
}

static void test_hash(void **state) {
    (void)state;
    uint64_t a = kiln_hash64("abc", 3, 0), b = kiln_hash64("abd", 3, 0);
    assert_true(a != b);
    assert_true(a == kiln_hash64("abc", 3, 0));
    assert_true(kiln_hash64("abc", 3, 1) != a);
    kiln_hash_stream *s = kiln_hash_stream_new(0);
    assert_non_null(s);
    kiln_hash_stream_update(s, "ab", 2);
    kiln_hash_stream_update(s, "c", 1);
    assert_true(kiln_hash_stream_digest(s) == a);
    kiln_hash_stream_free(s);
    kiln_hash128 h = kiln_hash128_of("abc", 3, 0);
    assert_true(h.lo != 0 || h.hi != 0);
    assert_true(kiln_hash_combine(a, b) != kiln_hash_combine(b, a));
    uint64_t t0 = kiln_now_ns();
    assert_true(kiln_now_ns() >= t0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_chain),
        cmocka_unit_test(test_log),
        cmocka_unit_test(test_sizes_and_arena),
        cmocka_unit_test(test_memcpy_stream),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
