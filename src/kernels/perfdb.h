/*
 * perfdb.h — measured kernel timings: a SQLite database and the in-memory table that
 * selection reads.
 *
 * The database ($XDG_CACHE_HOME/kiln/perfdb.sqlite, else ~/.cache/kiln/perfdb.sqlite)
 * runs in WAL mode with a busy timeout, so several processes can tune and read at once;
 * every write is one transaction (an UPSERT per record). Key: kernel id, op, device id,
 * dtype, shape (the call site's exact dims, e.g. "n=1024,k=640"), token bucket, sequence
 * bucket. Value: median and p95 (µs), samples, variance
 * (µs²), warm-up cost (ms), kiln version, descriptor hash, time of measurement.
 *
 * Selection never touches SQLite: kiln_perfdb_load_table reads the records of one device
 * into a kiln_perf_table (an immutable hash table, owned by the caller, freed with
 * kiln_perf_table_free) that a selector borrows. The table's hash enters the selector's
 * state, so new timings invalidate cached choices.
 */
#ifndef KILN_KERNELS_PERFDB_H
#define KILN_KERNELS_PERFDB_H

#include "base/status.h"
#include "kernels/select.h"

#include <stdint.h>

typedef struct kiln_perf_rec {
    char kernel_id[96];
    int32_t op;     /* kiln_kop */
    uint32_t dtype; /* weight dtype, else KV dtype, else activation dtype */
    int32_t tok_bucket, seq_bucket;
    char shape[48]; /* kiln_perf_ctx_shape: "n=1024,k=640", "hd=256,h=4/1", ... */
    double median_us, p95_us, variance_us2;
    int64_t samples;
    double warmup_ms;
    uint64_t descriptor_hash;
} kiln_perf_rec;

typedef struct kiln_perfdb kiln_perfdb;

/* Default path: $XDG_CACHE_HOME/kiln/perfdb.sqlite (directories created). */
kiln_status kiln_perfdb_default_path(char *out, size_t n, kiln_err *err);
/* Opens (creating the schema when new) in WAL mode. A table of another schema (an older
 * or foreign writer: no primary key) opens and reads; puts to it fail (KILN_ERR_IO). */
kiln_status kiln_perfdb_open(const char *path, kiln_perfdb **out, kiln_err *err);
void kiln_perfdb_close(kiln_perfdb *db);
/* Inserts or replaces the record for its key on `device` (the statement is prepared on the
 * first put: a reader never pays for it). */
kiln_status kiln_perfdb_put(kiln_perfdb *db, const char *device, const kiln_perf_rec *rec,
                            kiln_err *err);
/* Number of records (tests). */
kiln_status kiln_perfdb_count(kiln_perfdb *db, int64_t *out, kiln_err *err);

/* This machine's device id for host kernels: "<cpu model>|isa=<hex>". */
void kiln_perfdb_host_device(char *out, size_t n);

/* ---- in-memory table ---- */
kiln_status kiln_perfdb_load_table(kiln_perfdb *db, const char *device, kiln_perf_table **out,
                                   kiln_err *err);
/* An empty table to fill by hand (tests, bench). */
kiln_status kiln_perf_table_new(kiln_perf_table **out, kiln_err *err);
kiln_status kiln_perf_table_add(kiln_perf_table *t, const kiln_perf_rec *rec, kiln_err *err);
void kiln_perf_table_free(kiln_perf_table *t);
int kiln_perf_table_size(const kiln_perf_table *t);
uint64_t kiln_perf_table_hash(const kiln_perf_table *t);
const kiln_perf_rec *kiln_perf_table_find(const kiln_perf_table *t, uint64_t id_hash, int op,
                                          uint32_t dtype, const char *shape, int tok_bucket,
                                          int seq_bucket);

/* The shape part of a context's key ("n=1024,k=640" for matmul, ...). */
void kiln_perf_ctx_shape(const kiln_sel_ctx *c, char *buf, size_t n);

/* The dtype a context's records are keyed by. */
static inline uint32_t kiln_perf_ctx_dtype(const kiln_sel_ctx *c) {
    return c->w_dtype != KILN_DTYPE_NONE    ? c->w_dtype
           : c->kv_dtype != KILN_DTYPE_NONE ? c->kv_dtype
                                            : c->act_dtype;
}

#endif /* KILN_KERNELS_PERFDB_H */
