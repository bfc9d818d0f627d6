/*
 * perfdb.c — the PerfDB (SQLite, WAL) and the in-memory timing table selection reads.
 */
#include "kernels/perfdb.h"
#include "base/mem.h"

#include "base/cpu.h"
#include "base/hash.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

struct kiln_perfdb {
    sqlite3 *db;
    sqlite3_stmt *put;
};

static const char *const schema_sql =
    "CREATE TABLE IF NOT EXISTS perf_records ("
    " kernel_id TEXT NOT NULL, op TEXT NOT NULL, device_id TEXT NOT NULL,"
    " dtype TEXT NOT NULL, shape TEXT NOT NULL,"
    " tok_bucket INTEGER NOT NULL, seq_bucket INTEGER NOT NULL,"
    " median_us REAL NOT NULL, p95_us REAL NOT NULL, samples INTEGER NOT NULL,"
    " variance_us2 REAL NOT NULL, warmup_ms REAL NOT NULL,"
    " kiln_version TEXT NOT NULL, descriptor_hash TEXT NOT NULL, measured_at INTEGER NOT NULL,"
    " PRIMARY KEY (kernel_id, op, device_id, dtype, shape, tok_bucket, seq_bucket));"
    "CREATE INDEX IF NOT EXISTS perf_by_device ON perf_records(device_id);";

/* The error of the last call on db, naming the database file (what: the step). */
static kiln_status sql_err(sqlite3 *db, const char *what, kiln_err *err) {
    const char *f = db ? sqlite3_db_filename(db, "main") : NULL;
    return kiln_err_set(err, KILN_ERR_IO, "perfdb%s%s: %s: %s", f && *f ? " " : "", f ? f : "",
                        what, db ? sqlite3_errmsg(db) : "cannot allocate");
}

static kiln_status mkdirs(char *path, kiln_err *err) {
    for (char *s = path + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            kiln_status st = kiln_err_errno(err, errno, "creating %s", path);
            *s = '/';
            return st;
        }
        *s = '/';
    }
    return KILN_OK;
}

kiln_status kiln_perfdb_default_path(char *out, size_t n, kiln_err *err) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int w = xdg && *xdg ? snprintf(out, n, "%s/kiln/perfdb.sqlite", xdg)
                        : snprintf(out, n, "%s/.cache/kiln/perfdb.sqlite", home ? home : ".");
    if (w < 0 || (size_t)w >= n) return kiln_err_set(err, KILN_ERR_RANGE, "perfdb path too long");
    return mkdirs(out, err);
}

/* The upsert of kiln_perfdb_put, prepared on first use. */
static kiln_status prepare_put(kiln_perfdb *p, kiln_err *err) {
    if (sqlite3_prepare_v2(
            p->db,
            "INSERT INTO perf_records VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
            "ON CONFLICT(kernel_id, op, device_id, dtype, shape, tok_bucket, seq_bucket) "
            "DO UPDATE SET "
            "median_us=excluded.median_us, p95_us=excluded.p95_us, samples=excluded.samples, "
            "variance_us2=excluded.variance_us2, warmup_ms=excluded.warmup_ms, "
            "kiln_version=excluded.kiln_version, descriptor_hash=excluded.descriptor_hash, "
            "measured_at=excluded.measured_at",
            -1, &p->put, NULL) != SQLITE_OK)
        return sql_err(p->db, "preparing insert", err);
    return KILN_OK;
}

kiln_status kiln_perfdb_open(const char *path, kiln_perfdb **out, kiln_err *err) {
    *out = NULL;
    kiln_perfdb *p = kiln_calloc(1, sizeof *p);
    if (!p) return kiln_err_set(err, KILN_ERR_NOMEM, "perfdb: out of memory");
    kiln_status st = KILN_OK;
    if (sqlite3_open_v2(path, &p->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK) {
        st = kiln_err_set(err, KILN_ERR_IO, "perfdb: %s: %s", path,
                          p->db ? sqlite3_errmsg(p->db) : "cannot allocate");
        goto fail;
    }
    sqlite3_busy_timeout(p->db, 10000);
    char *msg = NULL;
    /* journal_mode=WAL itself may meet a lock while another process creates the file */
    for (int attempt = 0;; attempt++) {
        int rc = sqlite3_exec(p->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", NULL,
                              NULL, &msg);
        if (rc == SQLITE_OK) break;
        sqlite3_free(msg);
        msg = NULL;
        if ((rc != SQLITE_BUSY && rc != SQLITE_LOCKED) || attempt > 100) {
            st = sql_err(p->db, "enabling WAL", err);
            goto fail;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (sqlite3_exec(p->db, schema_sql, NULL, NULL, &msg) != SQLITE_OK) {
        sqlite3_free(msg);
        st = sql_err(p->db, "creating the schema", err);
        goto fail;
    }
    *out = p;
    return KILN_OK;
fail:
    kiln_perfdb_close(p);
    return kiln_err_wrap(err, st, "opening PerfDB %s", path);
}

void kiln_perfdb_close(kiln_perfdb *p) {
    if (!p) return;
    sqlite3_finalize(p->put);
    sqlite3_close(p->db);
    kiln_free(p);
}

kiln_status kiln_perfdb_put(kiln_perfdb *p, const char *device, const kiln_perf_rec *r,
                            kiln_err *err) {
    if (!p->put) {
        /* prepared on the first put: readers (every kiln start) never need it */
        kiln_status st = prepare_put(p, err);
        if (st) return st;
    }
    sqlite3_stmt *s = p->put;
    char hash[32];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)r->descriptor_hash);
    sqlite3_reset(s);
    sqlite3_bind_text(s, 1, r->kernel_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, kiln_kop_name((kiln_kop)r->op), -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, device, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 4, kiln_dtype_name(r->dtype), -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 5, r->shape, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(s, 6, r->tok_bucket);
    sqlite3_bind_int(s, 7, r->seq_bucket);
    sqlite3_bind_double(s, 8, r->median_us);
    sqlite3_bind_double(s, 9, r->p95_us);
    sqlite3_bind_int64(s, 10, r->samples);
    sqlite3_bind_double(s, 11, r->variance_us2);
    sqlite3_bind_double(s, 12, r->warmup_ms);
    sqlite3_bind_text(s, 13, KILN_VERSION_STRING, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 14, hash, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(s, 15, (sqlite3_int64)time(NULL));
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) return sql_err(p->db, "writing a record", err);
    return KILN_OK;
}

kiln_status kiln_perfdb_count(kiln_perfdb *p, int64_t *out, kiln_err *err) {
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(p->db, "SELECT COUNT(*) FROM perf_records", -1, &s, NULL) != SQLITE_OK)
        return sql_err(p->db, "count", err);
    int rc = sqlite3_step(s);
    *out = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
    sqlite3_finalize(s);
    return rc == SQLITE_ROW ? KILN_OK : sql_err(p->db, "count", err);
}

void kiln_perfdb_host_device(char *out, size_t n) {
    const kiln_cpu *c = kiln_cpu_info();
    snprintf(out, n, "%s|isa=%x", c->model, c->isa);
}

/* ---- table ---- */

struct kiln_perf_table {
    kiln_perf_rec *recs;
    uint64_t *keys; /* hash per slot, 0 = empty */
    int *slot_rec;
    int n, cap, slots;
    uint64_t hash;
};

static uint64_t rec_key(uint64_t id_hash, int op, uint32_t dtype, const char *shape, int tb,
                        int sb) {
    uint64_t k =
        kiln_hash_combine(id_hash, ((uint64_t)(uint32_t)op << 40) | ((uint64_t)dtype << 16) |
                                       ((uint64_t)tb << 8) | (uint64_t)sb);
    k = kiln_hash_combine(k, kiln_hash64(shape, strlen(shape), 0));
    return k ? k : 1;
}

void kiln_perf_ctx_shape(const kiln_sel_ctx *c, char *buf, size_t n) {
    switch (c->op) {
    case KILN_KOP_MATMUL:
    case KILN_KOP_EMBED:
        snprintf(buf, n, "n=%lld,k=%lld", (long long)c->n, (long long)c->k);
        break;
    case KILN_KOP_ROPE:
    case KILN_KOP_KV_WRITE:
    case KILN_KOP_ATTENTION:
        snprintf(buf, n, "hd=%d,h=%d/%d", c->head_dim, c->n_head, c->n_kv_head);
        break;
    default:
        snprintf(buf, n, "n=%lld", (long long)c->n);
        break;
    }
}

kiln_status kiln_perf_table_new(kiln_perf_table **out, kiln_err *err) {
    kiln_perf_table *t = kiln_calloc(1, sizeof *t);
    if (!t) return kiln_err_set(err, KILN_ERR_NOMEM, "perf table: out of memory");
    t->hash = 0x7065726674626cull;
    *out = t;
    return KILN_OK;
}

void kiln_perf_table_free(kiln_perf_table *t) {
    if (!t) return;
    kiln_free(t->recs);
    kiln_free(t->keys);
    kiln_free(t->slot_rec);
    kiln_free(t);
}

static kiln_status rehash_slots(kiln_perf_table *t, int slots, kiln_err *err) {
    uint64_t *keys = kiln_calloc((size_t)slots, sizeof *keys);
    int *sr = kiln_calloc((size_t)slots, sizeof *sr);
    if (!keys || !sr) {
        kiln_free(keys);
        kiln_free(sr);
        return kiln_err_set(err, KILN_ERR_NOMEM, "perf table: out of memory");
    }
    kiln_free(t->keys);
    kiln_free(t->slot_rec);
    t->keys = keys, t->slot_rec = sr, t->slots = slots;
    for (int i = 0; i < t->n; i++) {
        const kiln_perf_rec *r = &t->recs[i];
        uint64_t k = rec_key(kiln_hash64(r->kernel_id, strlen(r->kernel_id), 0), r->op, r->dtype,
                             r->shape, r->tok_bucket, r->seq_bucket);
        uint32_t j = (uint32_t)(k % (uint64_t)slots);
        while (keys[j]) j = (j + 1) % (uint32_t)slots;
        keys[j] = k;
        sr[j] = i;
    }
    return KILN_OK;
}

kiln_status kiln_perf_table_add(kiln_perf_table *t, const kiln_perf_rec *rec, kiln_err *err) {
    uint64_t ih = kiln_hash64(rec->kernel_id, strlen(rec->kernel_id), 0);
    kiln_perf_rec *existing = (kiln_perf_rec *)kiln_perf_table_find(
        t, ih, rec->op, rec->dtype, rec->shape, rec->tok_bucket, rec->seq_bucket);
    if (existing) {
        *existing = *rec;
    } else {
        if (t->n == t->cap) {
            int nc = t->cap ? t->cap * 2 : 64;
            kiln_perf_rec *nr = kiln_realloc(t->recs, sizeof *nr * (size_t)nc);
            if (!nr) return kiln_err_set(err, KILN_ERR_NOMEM, "perf table: out of memory");
            t->recs = nr, t->cap = nc;
        }
        t->recs[t->n++] = *rec;
        if (t->n * 2 > t->slots) {
            KILN_TRY(rehash_slots(t, t->slots ? t->slots * 2 : 256, err));
        } else {
            uint64_t k =
                rec_key(ih, rec->op, rec->dtype, rec->shape, rec->tok_bucket, rec->seq_bucket);
            uint32_t j = (uint32_t)(k % (uint64_t)t->slots);
            while (t->keys[j]) j = (j + 1) % (uint32_t)t->slots;
            t->keys[j] = k;
            t->slot_rec[j] = t->n - 1;
        }
    }
    t->hash = kiln_hash_combine(t->hash, kiln_hash64(rec, sizeof *rec, ih));
    return KILN_OK;
}

int kiln_perf_table_size(const kiln_perf_table *t) {
    return t->n;
}

uint64_t kiln_perf_table_hash(const kiln_perf_table *t) {
    return t->hash;
}

const kiln_perf_rec *kiln_perf_table_find(const kiln_perf_table *t, uint64_t id_hash, int op,
                                          uint32_t dtype, const char *shape, int tb, int sb) {
    if (!t->slots) return NULL;
    uint64_t k = rec_key(id_hash, op, dtype, shape, tb, sb);
    for (uint32_t j = (uint32_t)(k % (uint64_t)t->slots), i = 0; i < (uint32_t)t->slots;
         i++, j = (j + 1) % (uint32_t)t->slots) {
        if (!t->keys[j]) return NULL;
        if (t->keys[j] != k) continue;
        const kiln_perf_rec *r = &t->recs[t->slot_rec[j]];
        if (r->op == op && r->dtype == dtype && r->tok_bucket == tb && r->seq_bucket == sb &&
            !strcmp(r->shape, shape) &&
            kiln_hash64(r->kernel_id, strlen(r->kernel_id), 0) == id_hash)
            return r;
    }
    return NULL;
}

kiln_status kiln_perfdb_load_table(kiln_perfdb *p, const char *device, kiln_perf_table **out,
                                   kiln_err *err) {
    *out = NULL;
    kiln_perf_table *t = NULL;
    KILN_TRY(kiln_perf_table_new(&t, err));
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(p->db,
                           "SELECT kernel_id, op, dtype, tok_bucket, seq_bucket, median_us, "
                           "p95_us, samples, variance_us2, warmup_ms, descriptor_hash, shape "
                           "FROM perf_records WHERE device_id = ? ORDER BY kernel_id, op, dtype, "
                           "shape, tok_bucket, seq_bucket",
                           -1, &s, NULL) != SQLITE_OK) {
        kiln_perf_table_free(t);
        return sql_err(p->db, "reading records", err);
    }
    sqlite3_bind_text(s, 1, device, -1, SQLITE_TRANSIENT);
    kiln_status st = KILN_OK;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        kiln_perf_rec r;
        memset(&r, 0, sizeof r);
        const char *id = (const char *)sqlite3_column_text(s, 0);
        const char *op = (const char *)sqlite3_column_text(s, 1);
        const char *dt = (const char *)sqlite3_column_text(s, 2);
        kiln_kop kop;
        kiln_dtype kdt;
        if (!id || !op || !dt || strlen(id) >= sizeof r.kernel_id ||
            !kiln_kop_from_name(op, &kop) || !kiln_dtype_from_name(dt, &kdt))
            continue; /* a record from another kiln version: ignore it */
        snprintf(r.kernel_id, sizeof r.kernel_id, "%s", id);
        r.op = (int32_t)kop;
        r.dtype = (uint32_t)kdt;
        r.tok_bucket = sqlite3_column_int(s, 3);
        r.seq_bucket = sqlite3_column_int(s, 4);
        r.median_us = sqlite3_column_double(s, 5);
        r.p95_us = sqlite3_column_double(s, 6);
        r.samples = sqlite3_column_int64(s, 7);
        r.variance_us2 = sqlite3_column_double(s, 8);
        r.warmup_ms = sqlite3_column_double(s, 9);
        const char *h = (const char *)sqlite3_column_text(s, 10);
        r.descriptor_hash = h ? strtoull(h, NULL, 16) : 0;
        const char *sh = (const char *)sqlite3_column_text(s, 11);
        if (!sh || strlen(sh) >= sizeof r.shape) continue;
        snprintf(r.shape, sizeof r.shape, "%s", sh);
        if (r.tok_bucket < 0 || r.tok_bucket >= KILN_TOK_BUCKETS || r.seq_bucket < 0 ||
            r.seq_bucket >= KILN_SEQ_BUCKETS)
            continue;
        if ((st = kiln_perf_table_add(t, &r, err))) break;
    }
    if (!st && rc != SQLITE_DONE) st = sql_err(p->db, "reading records", err);
    sqlite3_finalize(s);
    if (st) {
        kiln_perf_table_free(t);
        return st;
    }
    *out = t;
    return KILN_OK;
}
