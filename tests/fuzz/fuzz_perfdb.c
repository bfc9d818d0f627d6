/* fuzz_perfdb.c — libFuzzer target for the PerfDB as read back: the input describes rows
 * (each column a NULL, integer, real, text or blob of fuzzed bytes) written with SQLite
 * straight into perf_records of a fresh database — half the time with kiln's schema,
 * half the time with a table of the same name and no type constraints, as an older or
 * foreign writer could leave it — then kiln_perfdb_open (schema, WAL) and
 * kiln_perfdb_load_table read it, and a selector over the ref and cpu providers selects
 * kernels for a matmul and an attention context with those timings. Odd rows must be
 * skipped or rejected with a status; crashes, leaks, hangs and sanitizer reports are
 * bugs.
 * The database lives in memory: SQLite's memdb VFS is made the default VFS, so kiln's
 * own sqlite3_open_v2 of the path opens it too; a name starting with '/' is shared by the
 * connections of the process while one is open (the harness keeps one open for the
 * whole input). A database file on disk (even /dev/shm) cost ~5 ms an input in file
 * creation, WAL and -shm mmaps, locks and unlinks (kernel time: 44% of a profile) for
 * nothing the input controls: ~190 -> see docs/RELIABILITY.md for exec/s. memdb has no
 * WAL: kiln's `PRAGMA journal_mode=WAL` leaves the journal in memory and succeeds, as
 * it does on any file system without shared memory. KILN_FUZZ_PERFDB_DISK=1: the file
 * in $TMPDIR (or /dev/shm, /tmp) as before. */
#include "kernels/perfdb.h"
#include "kernels/registry.h"
#include "kernels/select.h"

#include <sqlite3.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const COLS[15] = {
    "kernel_id",    "op",         "device_id",    "dtype",           "shape",
    "tok_bucket",   "seq_bucket", "median_us",    "p95_us",          "samples",
    "variance_us2", "warmup_ms",  "kiln_version", "descriptor_hash", "measured_at"};
/* plausible texts for the key columns, so rows get past the name lookups */
static const char *const TEXTS[] = {
    "ref.matmul", "matmul", "attention",    "q4_K",
    "f32",        "f16",    "n=640,k=2048", "cpu.avx512.matmul.q4_K",
    "dev",        "0"};

typedef struct rd {
    const uint8_t *p;
    size_t n;
} rd;
static uint8_t byte(rd *r) {
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}

static kiln_registry *reg;
static char path[512];
static bool on_disk;

static void remove_db(void) {
    char aux[600];
    unlink(path);
    snprintf(aux, sizeof aux, "%s-wal", path);
    unlink(aux);
    snprintf(aux, sizeof aux, "%s-shm", path);
    unlink(aux);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_err e;
    if (!reg) {
        static const kiln_provider *const provs[] = {&kiln_provider_ref, &kiln_provider_cpu};
        if (kiln_registry_new(provs, 2, NULL, &reg, &e) != KILN_OK) abort(); /* harness */
        const char *disk = getenv("KILN_FUZZ_PERFDB_DISK");
        on_disk = disk && *disk == '1';
        if (on_disk) {
            const char *tmp = getenv("TMPDIR");
            snprintf(path, sizeof path, "%s/kiln-fuzz-perfdb-%d.sqlite",
                     tmp ? tmp : (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp"),
                     (int)getpid());
        } else {
            sqlite3_vfs *mem = sqlite3_vfs_find("memdb");
            if (!mem || sqlite3_vfs_register(mem, 1) != SQLITE_OK) abort(); /* harness */
            snprintf(path, sizeof path, "/kiln-fuzz-perfdb");
        }
    }
    if (size > 16 * 1024) return 0;
    /* memdb: the database lives while `keep` is open (the harness's writer connection);
     * closing it drops the database */
    sqlite3 *keep = NULL, *db;
    if (on_disk) remove_db();
    if (sqlite3_open(path, &db) != SQLITE_OK) abort();
    if (!on_disk) keep = db;
    rd r = {data, size};
    const char *loose = "CREATE TABLE perf_records (kernel_id, op, device_id, dtype, shape, "
                        "tok_bucket, seq_bucket, median_us, p95_us, samples, variance_us2, "
                        "warmup_ms, kiln_version, descriptor_hash, measured_at)";
    kiln_perfdb *p = NULL;
    if (byte(&r) & 1) {
        sqlite3_exec(db, loose, NULL, NULL, NULL);
    } else if (on_disk) {
        sqlite3_close(db);
        if (kiln_perfdb_open(path, &p, &e) != KILN_OK) abort();
        kiln_perfdb_close(p);
        if (sqlite3_open(path, &db) != SQLITE_OK) abort();
    } else { /* memdb: the writer stays open (a connection set-up costs ~1 ms on ASan) */
        if (kiln_perfdb_open(path, &p, &e) != KILN_OK) abort();
        kiln_perfdb_close(p);
    }
    sqlite3_stmt *ins;
    if (sqlite3_prepare_v2(db,
                           "INSERT OR REPLACE INTO perf_records VALUES "
                           "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                           -1, &ins, NULL) == SQLITE_OK) {
        int rows = 0;
        while (r.n && rows++ < 32) {
            sqlite3_reset(ins);
            for (int c = 0; c < 15; c++) {
                uint8_t t = byte(&r);
                switch (t % 6) {
                case 0:
                    sqlite3_bind_null(ins, c + 1);
                    break;
                case 1: {
                    uint64_t u = 0; /* unsigned: 8 bytes of input may not fit int64_t */
                    for (int i = 0; i < 1 + (t >> 5); i++) u = (u << 8) | byte(&r);
                    if (t & 8) u = 0 - u;
                    int64_t v;
                    memcpy(&v, &u, sizeof v);
                    sqlite3_bind_int64(ins, c + 1, v);
                    break;
                }
                case 2: {
                    double d;
                    uint64_t u = 0;
                    for (int i = 0; i < 8; i++) u = (u << 8) | byte(&r);
                    memcpy(&d, &u, 8);
                    sqlite3_bind_double(ins, c + 1, d);
                    break;
                }
                case 3: {
                    size_t l = byte(&r) % 128;
                    if (l > r.n) l = r.n;
                    if (c == 2)
                        sqlite3_bind_text(ins, c + 1, "dev", -1, SQLITE_STATIC);
                    else
                        sqlite3_bind_text(ins, c + 1, (const char *)r.p, (int)l, SQLITE_TRANSIENT);
                    r.p += l, r.n -= l;
                    break;
                }
                case 4: {
                    size_t l = byte(&r) % 64;
                    if (l > r.n) l = r.n;
                    sqlite3_bind_blob(ins, c + 1, r.p, (int)l, SQLITE_TRANSIENT);
                    r.p += l, r.n -= l;
                    break;
                }
                default:
                    sqlite3_bind_text(ins, c + 1,
                                      c == 2 ? "dev"
                                             : TEXTS[(t >> 3) % (sizeof TEXTS / sizeof *TEXTS)],
                                      -1, SQLITE_STATIC);
                }
            }
            sqlite3_step(ins);
        }
        sqlite3_finalize(ins);
    }
    (void)COLS;
    if (on_disk) sqlite3_close(db);

    if (kiln_perfdb_open(path, &p, &e) != KILN_OK) {
        sqlite3_close(keep);
        return 0;
    }
    kiln_perf_table *t = NULL;
    if (kiln_perfdb_load_table(p, "dev", &t, &e) == KILN_OK) {
        kiln_selector *s;
        if (kiln_selector_new(reg, NULL, t, &s, &e) == KILN_OK) {
            kiln_sel_ctx c;
            kiln_sel_result res;
            kiln_sel_ctx_init(&c, KILN_KOP_MATMUL, KILN_BACKEND_CPU);
            c.w_dtype = KILN_DTYPE_Q4_K, c.n = 640, c.k = 2048, c.tokens_max = 64;
            kiln_select(s, &c, 0, &res, &e);
            kiln_sel_ctx_init(&c, KILN_KOP_ATTENTION, KILN_BACKEND_CPU);
            c.kv_dtype = KILN_DTYPE_F16, c.head_dim = 256, c.tokens_max = 1, c.seq_max = 4096;
            c.features = KILN_KFEAT_CAUSAL | KILN_KFEAT_PAGED_KV;
            kiln_select(s, &c, 0, &res, &e);
            kiln_selector_free(s);
        }
        kiln_perf_table_free(t);
    }
    kiln_perfdb_close(p);
    sqlite3_close(keep);
    return 0;
}
