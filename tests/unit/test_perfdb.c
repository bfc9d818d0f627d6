/* test_perfdb.c — the PerfDB: schema, upsert, per-device tables, WAL mode, and two
 * processes writing at once without corruption or lost records. */
#include "base/hash.h"
#include "kernels/perfdb.h"
#include "testutil.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256], path[320];

static kiln_perf_rec mkrec(const char *id, int tb, double med) {
    kiln_perf_rec r;
    memset(&r, 0, sizeof r);
    snprintf(r.kernel_id, sizeof r.kernel_id, "%s", id);
    r.op = KILN_KOP_MATMUL;
    r.dtype = KILN_DTYPE_Q4_K;
    r.tok_bucket = tb;
    snprintf(r.shape, sizeof r.shape, "n=640,k=2048");
    r.median_us = med;
    r.p95_us = med * 1.1;
    r.samples = 20;
    r.variance_us2 = med * 0.01;
    r.warmup_ms = 0.5;
    return r;
}

static void test_roundtrip(void **state) {
    (void)state;
    kiln_perfdb *db;
    kiln_err e;
    assert_int_equal(kiln_perfdb_open(path, &db, &e), KILN_OK);
    kiln_perf_rec r = mkrec("cpu.avx512.matmul", 2, 100);
    assert_int_equal(kiln_perfdb_put(db, "devA", &r, &e), KILN_OK);
    r.median_us = 80; /* same key: replaced */
    assert_int_equal(kiln_perfdb_put(db, "devA", &r, &e), KILN_OK);
    r = mkrec("ref.matmul", 2, 900);
    assert_int_equal(kiln_perfdb_put(db, "devA", &r, &e), KILN_OK);
    r = mkrec("ref.matmul", 2, 5);
    assert_int_equal(kiln_perfdb_put(db, "devB", &r, &e), KILN_OK);
    int64_t n;
    assert_int_equal(kiln_perfdb_count(db, &n, &e), KILN_OK);
    assert_int_equal(n, 3);
    kiln_perf_table *t;
    assert_int_equal(kiln_perfdb_load_table(db, "devA", &t, &e), KILN_OK);
    assert_int_equal(kiln_perf_table_size(t), 2);
    const char *id = "cpu.avx512.matmul";
    const kiln_perf_rec *got = kiln_perf_table_find(
        t, kiln_hash64(id, strlen(id), 0), KILN_KOP_MATMUL, KILN_DTYPE_Q4_K, "n=640,k=2048", 2, 0);
    assert_non_null(got);
    assert_true(got->median_us == 80);
    assert_int_equal(got->samples, 20);
    assert_null(kiln_perf_table_find(t, kiln_hash64(id, strlen(id), 0), KILN_KOP_MATMUL,
                                     KILN_DTYPE_Q4_K, "n=640,k=2048", 3, 0));
    /* another shape of the same dtype is another key */
    assert_null(kiln_perf_table_find(t, kiln_hash64(id, strlen(id), 0), KILN_KOP_MATMUL,
                                     KILN_DTYPE_Q4_K, "n=1024,k=640", 2, 0));
    kiln_perf_table_free(t);
    kiln_perfdb_close(db);
    /* WAL mode persisted in the file */
    sqlite3 *raw;
    assert_int_equal(sqlite3_open(path, &raw), SQLITE_OK);
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(raw, "PRAGMA journal_mode", -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(s, 0), "wal");
    sqlite3_finalize(s);
    sqlite3_close(raw);
}

enum { PER_CHILD = 300 };

static int child(int which) {
    kiln_perfdb *db;
    kiln_err e;
    if (kiln_perfdb_open(path, &db, &e)) {
        fprintf(stderr, "child %d: %s\n", which, e.msg);
        return 1;
    }
    for (int i = 0; i < PER_CHILD; i++) {
        char id[64];
        /* half the keys are shared between the children, half are their own */
        snprintf(id, sizeof id, "k%d.%d", (i % 2) ? which : 9, i / 2);
        kiln_perf_rec r = mkrec(id, i % KILN_TOK_BUCKETS, 10 + which);
        if (kiln_perfdb_put(db, "dev", &r, &e)) {
            fprintf(stderr, "child %d: %s\n", which, e.msg);
            kiln_perfdb_close(db);
            return 1;
        }
        if (i % 50 == 0) { /* read while the other writes */
            kiln_perf_table *t;
            if (kiln_perfdb_load_table(db, "dev", &t, &e)) {
                fprintf(stderr, "child %d read: %s\n", which, e.msg);
                return 1;
            }
            kiln_perf_table_free(t);
        }
    }
    kiln_perfdb_close(db);
    return 0;
}

static void test_two_processes(void **state) {
    (void)state;
    char p2[320];
    snprintf(p2, sizeof p2, "%s/two.sqlite", dir);
    snprintf(path, sizeof path, "%s", p2);
    pid_t pids[2];
    for (int w = 0; w < 2; w++) {
        pids[w] = fork();
        assert_true(pids[w] >= 0);
        if (pids[w] == 0) _exit(child(w + 1));
    }
    for (int w = 0; w < 2; w++) {
        int st;
        assert_int_equal(waitpid(pids[w], &st, 0), pids[w]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    kiln_perfdb *db;
    kiln_err e;
    assert_int_equal(kiln_perfdb_open(path, &db, &e), KILN_OK);
    int64_t n;
    assert_int_equal(kiln_perfdb_count(db, &n, &e), KILN_OK);
    /* shared keys: PER_CHILD/2 (both wrote them), own keys: PER_CHILD/2 each */
    assert_int_equal(n, PER_CHILD / 2 + PER_CHILD);
    kiln_perf_table *t;
    assert_int_equal(kiln_perfdb_load_table(db, "dev", &t, &e), KILN_OK);
    assert_int_equal(kiln_perf_table_size(t), PER_CHILD / 2 + PER_CHILD);
    kiln_perf_table_free(t);
    kiln_perfdb_close(db);
    sqlite3 *raw;
    assert_int_equal(sqlite3_open(path, &raw), SQLITE_OK);
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(raw, "PRAGMA integrity_check", -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(s, 0), "ok");
    sqlite3_finalize(s);
    sqlite3_close(raw);
}

static void test_default_path(void **state) {
    (void)state;
    char p[512];
    kiln_err e;
    char xdg[300];
    snprintf(xdg, sizeof xdg, "%s/xdg", dir);
    setenv("XDG_CACHE_HOME", xdg, 1);
    assert_int_equal(kiln_perfdb_default_path(p, sizeof p, &e), KILN_OK);
    char want[512];
    snprintf(want, sizeof want, "%s/kiln/perfdb.sqlite", xdg);
    assert_string_equal(p, want);
    kiln_perfdb *db;
    assert_int_equal(kiln_perfdb_open(p, &db, &e), KILN_OK); /* directories were created */
    kiln_perfdb_close(db);
    char dev[256];
    kiln_perfdb_host_device(dev, sizeof dev);
    assert_non_null(strstr(dev, "|isa="));
}

/* A perf_records table written by an older or foreign writer (no key): kiln opens and
 * reads it (the upsert is prepared on the first put, not at open), and a put fails with an
 * error instead of writing. */
static void test_foreign_table(void **state) {
    (void)state;
    char p2[320];
    snprintf(p2, sizeof p2, "%s/foreign.sqlite", dir);
    sqlite3 *raw;
    assert_int_equal(sqlite3_open(p2, &raw), SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(raw,
                     "CREATE TABLE perf_records (kernel_id, op, device_id, dtype, shape, "
                     "tok_bucket, seq_bucket, median_us, p95_us, samples, variance_us2, "
                     "warmup_ms, kiln_version, descriptor_hash, measured_at);"
                     "INSERT INTO perf_records VALUES ('ref.matmul', 'matmul', 'dev', 'q4_K', "
                     "'n=640,k=2048', 2, 0, 7.5, 8, 20, 0.1, 0.5, 'x', '0', 0)",
                     NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(raw);
    kiln_perfdb *db;
    kiln_err e;
    assert_int_equal(kiln_perfdb_open(p2, &db, &e), KILN_OK);
    kiln_perf_table *t;
    assert_int_equal(kiln_perfdb_load_table(db, "dev", &t, &e), KILN_OK);
    assert_int_equal(kiln_perf_table_size(t), 1);
    kiln_perf_table_free(t);
    kiln_perf_rec r = mkrec("ref.matmul", 2, 5);
    assert_int_equal(kiln_perfdb_put(db, "dev", &r, &e), KILN_ERR_IO);
    assert_non_null(strstr(e.msg, "preparing insert"));
    assert_non_null(strstr(e.msg, p2)); /* the error names the database file */
    assert_int_equal(kiln_perfdb_put(db, "dev", &r, &e), KILN_ERR_IO); /* and again */
    kiln_perfdb_close(db);
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/kiln-test-perfdb-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof path, "%s/perf.sqlite", dir);
    return 0;
}
static int teardown(void **state) {
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_two_processes),
        cmocka_unit_test(test_default_path),
        cmocka_unit_test(test_foreign_table),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
