/* test_io_fault.c — I/O faults on model files.
 *  - short reads: pread (wrapped at link time, -Wl,--wrap=pread) returns at most 1000
 *    bytes per call; the load plan's pread reader (transform and residual lanes) must
 *    still produce every tensor byte for byte equal to the file.
 *  - EIO: the N-th pread fails with EIO, for every N up to the number of reads of a
 *    load: the load ends in KILN_ERR_IO naming the file, nothing leaks (base/mem.h's
 *    live count), nothing crashes.
 *  - a file truncated while mapped: the model is loaded and bound (ref backend, which
 *    reads weights from the mapping on every step), then the file is cut to one page.
 *    The next step would raise SIGBUS; base/mapguard.h turns it into KILN_ERR_IO naming
 *    the file, the sequences are unchanged, and the process lives on (freeing the engine
 *    and the model works). A fresh load of the cut file is a format error. */
#include "testutil.h"

#include "base/mapguard.h"
#include "base/mem.h"
#include "format/model_file.h"
#include "kiln/kiln.h"
#include "load/load.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the pread shim ---- */
static int g_mode; /* 0 pass through, 1 short reads, 2 EIO at call g_fail_at */
static long g_calls, g_fail_at;
ssize_t __real_pread(int fd, void *buf, size_t n, off_t off);
ssize_t __wrap_pread(int fd, void *buf, size_t n, off_t off) {
    g_calls++;
    if (g_mode == 1 && n > 1000) n = 1000;
    if (g_mode == 2 && g_calls == g_fail_at) {
        errno = EIO;
        return -1;
    }
    return __real_pread(fd, buf, n, off);
}

static char dir[256], model[300];

static void gen(const char *path) {
    const char *b = getenv("KILN_BINARY_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s/kiln-gen' -q -p tiny -f llama -t q8_0 --layers 1 --n-vocab 300 -o '%s'",
             b ? b : ".", path);
    if (system(cmd) != 0) fail_msg("failed: %s", cmd);
}

static kiln_status load_plan(kiln_load_plan **out, kiln_model_file **mf, kiln_err *e) {
    KILN_TRY(kiln_model_file_open(model, 0, mf, e));
    kiln_load_request req;
    kiln_load_request_init(&req);
    req.io = KILN_IO_PREAD;
    req.threads = 1;
    req.target.writable = true; /* private copies: every byte goes through pread */
    kiln_status st = kiln_load_plan_build(*mf, &req, out, e);
    if (!st) st = kiln_load_execute(*out, e);
    return st;
}

static void test_short_reads(void **s) {
    (void)s;
    kiln_err e;
    kiln_model_file *mf;
    kiln_load_plan *p;
    g_mode = 1;
    g_calls = 0;
    if (load_plan(&p, &mf, &e) != KILN_OK) fail_msg("load with short reads: %s", e.msg);
    g_mode = 0;
    assert_true(g_calls > 0);
    /* every tensor copied unchanged equals the file's bytes (the mapping) */
    int same = 0;
    for (size_t i = 0; i < kiln_load_plan_count(p); i++) {
        const kiln_load_item *it = kiln_load_plan_item(p, i);
        if (!it->data || it->nbytes != it->src->nbytes || it->dtype != it->src->dtype) continue;
        if (memcmp(it->data, it->src->data, (size_t)it->nbytes) != 0)
            fail_msg("tensor %s differs from the file after short reads", it->src->name);
        same++;
    }
    assert_true(same > 0);
    printf("short reads: %ld pread calls, %d tensors equal to the file\n", g_calls, same);
    kiln_load_plan_free(p);
    kiln_model_file_close(mf);
}

static void test_eio(void **s) {
    (void)s;
    kiln_err e;
    kiln_model_file *mf;
    kiln_load_plan *p = NULL;
    g_mode = 0;
    g_calls = 0;
    if (load_plan(&p, &mf, &e) != KILN_OK) fail_msg("load: %s", e.msg);
    const long total = g_calls;
    kiln_load_plan_free(p);
    kiln_model_file_close(mf);
    assert_true(total > 0);
    int64_t live = kiln_alloc_live();
    for (long n = 1; n <= total; n++) {
        g_mode = 2;
        g_calls = 0;
        g_fail_at = n;
        p = NULL;
        mf = NULL;
        memset(&e, 0, sizeof e);
        kiln_status st = load_plan(&p, &mf, &e);
        g_mode = 0;
        if (st == KILN_OK) fail_msg("EIO at read %ld of %ld: load succeeded", n, total);
        assert_int_equal(st, KILN_ERR_IO);
        if (!strstr(e.msg, model) || !strstr(e.msg, "Input/output error"))
            fail_msg("EIO at read %ld: message does not name the file and error: %s", n, e.msg);
        kiln_load_plan_free(p);
        kiln_model_file_close(mf);
        if (kiln_alloc_live() != live)
            fail_msg("EIO at read %ld: %lld blocks leaked", n,
                     (long long)(kiln_alloc_live() - live));
    }
    printf("EIO: every one of %ld reads failed in turn: KILN_ERR_IO each time\n", total);
}

static void test_truncated_while_mapped(void **s) {
    (void)s;
    char cut[320];
    snprintf(cut, sizeof cut, "%s/cut.gguf", dir);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", model, cut);
    assert_int_equal(system(cmd), 0);
    kiln_err e;
    kiln_model *m;
    if (kiln_model_load(cut, &m, &e) != KILN_OK) fail_msg("load: %s", e.msg);
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.backend = "ref";
    o.n_threads = 1;
    o.n_ctx = 64;
    kiln_engine *en;
    if (kiln_engine_create(m, &o, &en, &e) != KILN_OK) fail_msg("engine: %s", e.msg);
    int32_t seq;
    assert_int_equal(kiln_seq_create(en, &seq, &e), KILN_OK);
    kiln_batch_entry b[2] = {{seq, 1, 0, 0}, {seq, 2, 1, 1}};
    int32_t id;
    if (kiln_engine_step_greedy(en, b, 2, 0, &id, &e) != KILN_OK) fail_msg("step: %s", e.msg);
    assert_int_equal(kiln_seq_len(en, seq), 2);
    /* cut the file to one page under the mapping */
    int fd = open(cut, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 4096), 0);
    close(fd);
    unsigned long before = kiln_mapguard_faults();
    kiln_batch_entry b2[1] = {{seq, 3, 2, 1}};
    kiln_status st = kiln_engine_step_greedy(en, b2, 1, 0, &id, &e);
    printf("step on a truncated file: %s (%s), %lu SIGBUS handled\n", kiln_status_name(st), e.msg,
           kiln_mapguard_faults() - before);
    assert_int_equal(st, KILN_ERR_IO);
    assert_non_null(strstr(e.msg, cut));
    assert_true(kiln_mapguard_faults() > before);
    assert_int_equal(kiln_seq_len(en, seq), 2); /* the failed step changed nothing */
    kiln_engine_free(en);
    kiln_model_free(m);
    /* a fresh load of the cut file: a clear format error */
    assert_int_not_equal(kiln_model_load(cut, &m, &e), KILN_OK);
    assert_non_null(strstr(e.msg, cut));
    assert_int_equal(kiln_mapguard_check(&e), KILN_OK); /* nothing left pending */
}

static int setup(void **s) {
    (void)s;
    snprintf(dir, sizeof dir, "%s/kiln-io-fault-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) return -1;
    snprintf(model, sizeof model, "%s/m.gguf", dir);
    gen(model);
    return 0;
}

static int teardown(void **s) {
    (void)s;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_short_reads),
        cmocka_unit_test(test_eio),
        cmocka_unit_test(test_truncated_while_mapped),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
