/* test_alloc_fault.c — out-of-memory injection (base/mem.h's counting hook): the model
 * load, the bind (engine create), sequence creation and a step are each run with every
 * N from 1 to the number of allocations they make, failing the N-th (once, and "from
 * the N-th on"). Each must end in a status (never a crash), leave nothing allocated
 * (base/mem.h's live-block count; LSan in the sanitizer build) and, where the failure was in a
 * request (sequence, step), leave the engine usable: the same step afterwards gives
 * the same logits, bit for bit, as a run that never failed.
 * The model is a kiln-gen GGUF (llama and gemma3 shapes, f32 and q8_0), 1 layer. */
#include "testutil.h"

#include "base/mem.h"
#include "base/status.h"
#include "kiln/kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];

static void gen(const char *path, const char *family, const char *type) {
    char args[128];
    snprintf(args, sizeof args, "-p tiny -f %s -t %s --layers 1 --n-vocab 300", family, type);
    kt_kiln_gen(args, path);
}

/* Blocks kiln holds (base/mem.h's count: every kiln allocation goes through the hook).
 * glibc's mallinfo2 cannot serve: it counts chunks in the tcache as in use. LSan (the
 * sanitizer build) checks at exit as well, with stacks. */
#define SLACK 0
static int64_t heap_bytes(void) {
    return kiln_alloc_live();
}

#define N_PROMPT 5
static const int32_t prompt[N_PROMPT] = {1, 17, 42, 99, 250};

static kiln_engine *engine(const kiln_model *m) {
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.n_threads = 1;
    o.n_ctx = 64;
    o.max_step_tokens = 16;
    o.max_seqs = 4;
    kiln_engine *e = NULL;
    kiln_err err;
    if (kiln_engine_create(m, &o, &e, &err) != KILN_OK) fail_msg("engine: %s", err.msg);
    return e;
}

/* One prefill of the prompt on a new sequence; the last row's logits into out. */
static kiln_status request(kiln_engine *e, float *out, kiln_err *err) {
    int32_t seq;
    KILN_TRY(kiln_seq_create(e, &seq, err));
    kiln_batch_entry b[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++)
        b[i] = (kiln_batch_entry){.seq = seq, .token = prompt[i], .pos = i, .want_logits = i == 4};
    kiln_status st = kiln_engine_step(e, b, N_PROMPT, out, err);
    kiln_seq_free(e, seq);
    return st;
}

/* A failed call must say what failed. */
static void check_failure(kiln_status st, const kiln_err *err, const char *what, uint64_t n) {
    if (st == KILN_OK) return;
    if (!err->msg[0])
        fail_msg("%s: allocation %llu failed: status %s without a message", what,
                 (unsigned long long)n, kiln_status_name(st));
}

static void walk(const char *path) {
    kiln_err err;
    /* reference run, and the allocation counts of each phase */
    kiln_model *m = NULL;
    kiln_alloc_fault_set(0, false);
    if (kiln_model_load(path, &m, &err) != KILN_OK) fail_msg("load: %s", err.msg);
    const uint64_t n_load = kiln_alloc_count();
    kiln_alloc_fault_set(0, false);
    kiln_engine *e = engine(m);
    const uint64_t n_bind = kiln_alloc_count();
    const int32_t nv = kiln_model_n_vocab(m);
    float *ref = calloc((size_t)nv, sizeof(float)), *got = calloc((size_t)nv, sizeof(float));
    assert_non_null(ref);
    assert_non_null(got);
    kiln_alloc_fault_set(0, false);
    if (request(e, ref, &err) != KILN_OK) fail_msg("request: %s", err.msg);
    const uint64_t n_req = kiln_alloc_count();
    kiln_alloc_fault_reset();
    printf("%s: allocations: load %llu, bind %llu, request %llu\n", path,
           (unsigned long long)n_load, (unsigned long long)n_bind, (unsigned long long)n_req);
    assert_true(n_load > 0);
    assert_true(n_bind > 0);

    /* warm-up done above: process-wide caches (selector, stdio) now exist */
    kiln_engine_free(e);
    kiln_model_free(m);
    int64_t base = heap_bytes();
    int failed[3] = {0, 0, 0};
    for (int persistent = 0; persistent < 2; persistent++) {
        for (uint64_t n = 1; n <= n_load + 1; n++) {
            m = NULL;
            memset(&err, 0, sizeof err);
            kiln_alloc_fault_set(n, persistent);
            kiln_status st = kiln_model_load(path, &m, &err);
            kiln_alloc_fault_reset();
            check_failure(st, &err, "load", n);
            if (st != KILN_OK) {
                failed[0]++;
                assert_null(m);
            } else {
                kiln_model_free(m);
            }
            int64_t now = heap_bytes();
            if (now > base + SLACK)
                fail_msg("load, allocation %llu failed%s: %lld blocks leaked (%s)",
                         (unsigned long long)n, persistent ? " on" : "", (long long)(now - base),
                         st == KILN_OK ? "ok" : err.msg);
        }
    }

    if (kiln_model_load(path, &m, &err) != KILN_OK) fail_msg("load: %s", err.msg);
    base = heap_bytes();
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.n_threads = 1;
    o.n_ctx = 64;
    o.max_step_tokens = 16;
    o.max_seqs = 4;
    for (int persistent = 0; persistent < 2; persistent++) {
        for (uint64_t n = 1; n <= n_bind + 1; n++) {
            e = NULL;
            memset(&err, 0, sizeof err);
            kiln_alloc_fault_set(n, persistent);
            kiln_status st = kiln_engine_create(m, &o, &e, &err);
            kiln_alloc_fault_reset();
            check_failure(st, &err, "bind", n);
            if (st != KILN_OK) {
                failed[1]++;
                assert_null(e);
            } else {
                kiln_engine_free(e);
            }
            int64_t now = heap_bytes();
            if (now > base + SLACK)
                fail_msg("bind, allocation %llu failed%s: %lld blocks leaked (%s)",
                         (unsigned long long)n, persistent ? " on" : "", (long long)(now - base),
                         st == KILN_OK ? "ok" : err.msg);
        }
    }

    /* requests: the engine lives across failures and must still give the same logits */
    e = engine(m);
    /* warm up: the engine grows per-step buffers lazily, one per step slot (double
     * buffering), so a few requests first; after them a request allocates nothing new */
    for (int i = 0; i < 4; i++)
        if (request(e, got, &err) != KILN_OK) fail_msg("request: %s", err.msg);
    base = heap_bytes();
    for (int persistent = 0; persistent < 2; persistent++) {
        for (uint64_t n = 1; n <= n_req + 1; n++) {
            memset(&err, 0, sizeof err);
            kiln_alloc_fault_set(n, persistent);
            kiln_status st = request(e, got, &err);
            kiln_alloc_fault_reset();
            check_failure(st, &err, "request", n);
            if (st != KILN_OK) failed[2]++;
            memset(got, 0, (size_t)nv * sizeof(float));
            if (request(e, got, &err) != KILN_OK)
                fail_msg("request after allocation %llu failed: %s", (unsigned long long)n,
                         err.msg);
            if (memcmp(got, ref, (size_t)nv * sizeof(float)) != 0)
                fail_msg("request after allocation %llu failed%s: logits differ",
                         (unsigned long long)n, persistent ? " on" : "");
            int64_t now = heap_bytes();
            if (now > base + SLACK)
                fail_msg("request, allocation %llu failed%s: %lld blocks leaked",
                         (unsigned long long)n, persistent ? " on" : "", (long long)(now - base));
        }
    }
    printf("%s: failed calls: load %d, bind %d, request %d (of 2 x (count + 1) each)\n", path,
           failed[0], failed[1], failed[2]);
    /* every one-off failure of load and bind must surface (no allocation is optional
     * there), so at least count of the 2 x (count + 1) runs fail */
    assert_true((uint64_t)failed[0] >= n_load);
    assert_true((uint64_t)failed[1] >= n_bind);
    kiln_engine_free(e);
    kiln_model_free(m);
    free(ref);
    free(got);
}

/* The hook itself: counting, the n-th failing (once or from then on), the live count. */
static void test_hook(void **s) {
    (void)s;
    int64_t live = kiln_alloc_live();
    kiln_alloc_fault_set(2, false);
    void *a = kiln_malloc(8), *b = kiln_malloc(8), *c = kiln_calloc(2, 8);
    assert_non_null(a);
    assert_null(b);
    assert_non_null(c);
    assert_int_equal(kiln_alloc_count(), 3);
    assert_int_equal(kiln_alloc_fault_hits(), 1);
    assert_int_equal(kiln_alloc_live(), live + 2);
    kiln_alloc_fault_set(1, true);
    assert_null(kiln_strdup("x"));
    assert_null(kiln_realloc(NULL, 4));
    assert_null(kiln_alloc_aligned(64));
    assert_int_equal(kiln_alloc_fault_hits(), 3);
    kiln_alloc_fault_reset();
    a = kiln_realloc(a, 100);
    assert_non_null(a);
    assert_int_equal(kiln_alloc_live(), live + 2);
    kiln_free(a);
    kiln_free(c);
    kiln_free(NULL);
    assert_int_equal(kiln_alloc_live(), live);
}

static void test_llama_f32(void **s) {
    (void)s;
    char p[512];
    snprintf(p, sizeof p, "%s/llama-f32.gguf", dir);
    gen(p, "llama", "f32");
    walk(p);
}

static void test_gemma3_q8(void **s) {
    (void)s;
    char p[512];
    snprintf(p, sizeof p, "%s/gemma3-q8_0.gguf", dir);
    gen(p, "gemma3", "q8_0");
    walk(p);
}

static int setup(void **s) {
    (void)s;
    return kt_tmpdir(dir, sizeof dir, "kiln-alloc-fault");
}

static int teardown(void **s) {
    (void)s;
    return kt_tmpdir_remove(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hook),
        cmocka_unit_test(test_llama_f32),
        cmocka_unit_test(test_gemma3_q8),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
