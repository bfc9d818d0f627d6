/* test_perfdb_crash.c — crash safety of the PerfDB (kernels/perfdb.c, SQLite in WAL mode):
 *  - kill -9 mid-write: a child writes records k0, k1, ... one transaction each as fast
 *    as it can; the parent SIGKILLs it after a random few milliseconds, 12 times in a
 *    row on the same file. After every kill the database opens, passes SQLite's
 *    integrity_check, and holds exactly the records k0..k(c-1) for some c (no torn or
 *    partial record, no gap), each with its own values.
 *  - a full disk: a SQLite VFS wrapping the default one makes every write fail with
 *    SQLITE_FULL (what the unix VFS reports for ENOSPC). kiln_perfdb_put must return an
 *    error status naming the PerfDB, not crash; once space is back the database is
 *    intact (integrity_check, the earlier records) and writable again. */
#include "testutil.h"

#include "base/hash.h"
#include "kernels/perfdb.h"

#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char dir[256], path[300];

static void rec(kiln_perf_rec *r, int64_t i) {
    memset(r, 0, sizeof *r);
    snprintf(r->kernel_id, sizeof r->kernel_id, "k%lld", (long long)i);
    r->op = KILN_KOP_MATMUL;
    r->dtype = KILN_DTYPE_F32;
    snprintf(r->shape, sizeof r->shape, "n=%lld,k=64", (long long)i);
    r->median_us = (double)i;
    r->p95_us = (double)i + 0.5;
    r->samples = i + 1;
}

/* integrity_check == "ok" and the records are exactly k0..k(c-1); returns c. */
static int64_t check_db(void) {
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(s, 0), "ok");
    sqlite3_finalize(s);
    sqlite3_close(db);
    kiln_perfdb *p;
    kiln_err e;
    if (kiln_perfdb_open(path, &p, &e) != KILN_OK) fail_msg("reopen: %s", e.msg);
    int64_t c = -1;
    assert_int_equal(kiln_perfdb_count(p, &c, &e), KILN_OK);
    kiln_perf_table *t;
    if (kiln_perfdb_load_table(p, "dev", &t, &e) != KILN_OK) fail_msg("load: %s", e.msg);
    assert_int_equal(kiln_perf_table_size(t), (int)c);
    for (int64_t i = 0; i < c; i++) {
        kiln_perf_rec want;
        rec(&want, i);
        const kiln_perf_rec *r =
            kiln_perf_table_find(t, kiln_hash64(want.kernel_id, strlen(want.kernel_id), 0), want.op,
                                 want.dtype, want.shape, 0, 0);
        int found = r != NULL;
        if (!found) fail_msg("record k%lld missing of %lld", (long long)i, (long long)c);
        assert_true(r->median_us == want.median_us && r->samples == want.samples);
    }
    kiln_perf_table_free(t);
    kiln_perfdb_close(p);
    return c;
}

static void test_kill9(void **s) {
    (void)s;
    snprintf(path, sizeof path, "%s/kill9.sqlite", dir);
    int64_t have = 0;
    srand(12345);
    for (int round = 0; round < 12; round++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            kiln_perfdb *p;
            kiln_err e;
            if (kiln_perfdb_open(path, &p, &e) != KILN_OK) _exit(3);
            for (int64_t i = have;; i++) {
                kiln_perf_rec r;
                rec(&r, i);
                if (kiln_perfdb_put(p, "dev", &r, &e) != KILN_OK) _exit(4);
            }
        }
        struct timespec ts = {0, (long)(5 + rand() % 40) * 1000 * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (!WIFSIGNALED(status)) fail_msg("writer exited early (status %d)", status);
        int64_t c = check_db();
        assert_true(c >= have);
        have = c;
    }
    printf("kill -9: 12 kills, %lld records intact\n", (long long)have);
    assert_true(have > 0);
}

/* ---- a VFS that can run out of space ---- */
static sqlite3_vfs *g_real;
static int g_full;
typedef struct ffile {
    sqlite3_file base;
    sqlite3_file *real;
} ffile;
#define R(f) (((ffile *)(f))->real)
static int f_close(sqlite3_file *f) {
    int rc = R(f)->pMethods ? R(f)->pMethods->xClose(R(f)) : SQLITE_OK;
    sqlite3_free(R(f));
    return rc;
}
static int f_read(sqlite3_file *f, void *b, int n, sqlite3_int64 o) {
    return R(f)->pMethods->xRead(R(f), b, n, o);
}
static int f_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 o) {
    if (g_full) return SQLITE_FULL;
    return R(f)->pMethods->xWrite(R(f), b, n, o);
}
static int f_truncate(sqlite3_file *f, sqlite3_int64 n) {
    return R(f)->pMethods->xTruncate(R(f), n);
}
static int f_sync(sqlite3_file *f, int fl) {
    return R(f)->pMethods->xSync(R(f), fl);
}
static int f_size(sqlite3_file *f, sqlite3_int64 *n) {
    return R(f)->pMethods->xFileSize(R(f), n);
}
static int f_lock(sqlite3_file *f, int l) {
    return R(f)->pMethods->xLock(R(f), l);
}
static int f_unlock(sqlite3_file *f, int l) {
    return R(f)->pMethods->xUnlock(R(f), l);
}
static int f_reserved(sqlite3_file *f, int *o) {
    return R(f)->pMethods->xCheckReservedLock(R(f), o);
}
static int f_fctl(sqlite3_file *f, int op, void *a) {
    return R(f)->pMethods->xFileControl(R(f), op, a);
}
static int f_sector(sqlite3_file *f) {
    return R(f)->pMethods->xSectorSize(R(f));
}
static int f_dev(sqlite3_file *f) {
    return R(f)->pMethods->xDeviceCharacteristics(R(f));
}
static int f_shmmap(sqlite3_file *f, int i, int sz, int ext, void volatile **pp) {
    return R(f)->pMethods->xShmMap(R(f), i, sz, ext, pp);
}
static int f_shmlock(sqlite3_file *f, int o, int n, int fl) {
    return R(f)->pMethods->xShmLock(R(f), o, n, fl);
}
static void f_shmbarrier(sqlite3_file *f) {
    R(f)->pMethods->xShmBarrier(R(f));
}
static int f_shmunmap(sqlite3_file *f, int del) {
    return R(f)->pMethods->xShmUnmap(R(f), del);
}
static const sqlite3_io_methods f_methods = {
    2,         f_close,      f_read,     f_write, f_truncate, f_sync, f_size,
    f_lock,    f_unlock,     f_reserved, f_fctl,  f_sector,   f_dev,  f_shmmap,
    f_shmlock, f_shmbarrier, f_shmunmap, NULL,    NULL};
static int v_open(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out) {
    (void)v;
    ffile *ff = (ffile *)f;
    ff->base.pMethods = NULL;
    ff->real = sqlite3_malloc(g_real->szOsFile);
    if (!ff->real) return SQLITE_NOMEM;
    memset(ff->real, 0, (size_t)g_real->szOsFile);
    int rc = g_real->xOpen(g_real, name, ff->real, flags, out);
    if (rc != SQLITE_OK) {
        sqlite3_free(ff->real);
        return rc;
    }
    ff->base.pMethods = &f_methods;
    return SQLITE_OK;
}
static sqlite3_vfs full_vfs;

static void test_enospc(void **s) {
    (void)s;
    snprintf(path, sizeof path, "%s/full.sqlite", dir);
    g_real = sqlite3_vfs_find(NULL);
    full_vfs = *g_real;
    full_vfs.zName = "kiln-full";
    full_vfs.szOsFile = (int)sizeof(ffile);
    full_vfs.xOpen = v_open;
    full_vfs.pNext = NULL;
    assert_int_equal(sqlite3_vfs_register(&full_vfs, 1), SQLITE_OK);
    kiln_perfdb *p;
    kiln_err e;
    if (kiln_perfdb_open(path, &p, &e) != KILN_OK) fail_msg("open: %s", e.msg);
    kiln_perf_rec r;
    for (int i = 0; i < 10; i++) {
        rec(&r, i);
        assert_int_equal(kiln_perfdb_put(p, "dev", &r, &e), KILN_OK);
    }
    g_full = 1;
    int failed = 0;
    for (int i = 10; i < 200; i++) { /* enough to overflow the WAL's written pages */
        rec(&r, i);
        kiln_status st = kiln_perfdb_put(p, "dev", &r, &e);
        if (st != KILN_OK) {
            failed++;
            assert_non_null(strstr(e.msg, "perfdb"));
            break;
        }
    }
    assert_true(failed > 0);
    printf("full disk: put failed with \"%s\"\n", e.msg);
    /* a full disk at open time: an error too */
    kiln_perfdb *q;
    char other[320];
    snprintf(other, sizeof other, "%s/new.sqlite", dir);
    assert_int_not_equal(kiln_perfdb_open(other, &q, &e), KILN_OK);
    g_full = 0;
    kiln_perfdb_close(p);
    sqlite3_vfs_unregister(&full_vfs);
    int64_t c = check_db();
    assert_true(c >= 10); /* the earlier records survived */
    assert_int_equal(kiln_perfdb_open(path, &p, &e), KILN_OK);
    rec(&r, c);
    assert_int_equal(kiln_perfdb_put(p, "dev", &r, &e), KILN_OK);
    kiln_perfdb_close(p);
    assert_int_equal(check_db(), c + 1);
}

static int setup(void **s) {
    (void)s;
    snprintf(dir, sizeof dir, "%s/kiln-perfdb-crash-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **s) {
    (void)s;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill9),
        cmocka_unit_test(test_enospc),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
