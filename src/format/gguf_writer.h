/*
 * gguf_writer.h — writes GGUF v3 files (the layout is described in format/gguf.h).
 *
 * Usage: create a writer, set metadata, declare tensors (with their bytes, or with a fill
 * callback that produces rows on demand), then kiln_gguf_writer_write(). Nothing touches
 * the disk before write; write() lays the file out (every tensor offset a multiple of the
 * alignment, `general.alignment` stored), writes the header, then streams the tensor data
 * in large sequential writes. Fill callbacks run in parallel on a thread pool, slab by
 * slab (about 64 MiB of output each), so a model of any size is written with bounded
 * memory and all cores generating / quantizing.
 *
 *   kiln_gguf_writer *w;
 *   kiln_gguf_writer_create(32, &w, err);
 *   kiln_gguf_writer_set_str(w, "general.architecture", "llama", err);
 *   kiln_gguf_writer_set_u32(w, "llama.block_count", 2, err);
 *   int64_t shape[2] = {256, 512}; // ggml order: row length first
 *   kiln_gguf_writer_add_tensor_fill(w, "token_embd.weight", KILN_DTYPE_Q4_0, 2, shape,
 *                                    my_fill, my_ctx, err);
 *   kiln_gguf_writer_write(w, "out.gguf", pool, err);
 *   kiln_gguf_writer_free(w);
 *
 * Metadata: setting an existing key replaces its value (keys keep their first position).
 * Keys and strings are copied. Tensor names are copied, must be unique and at most 63
 * bytes (ggml's GGML_MAX_NAME - 1). Tensor data given by pointer is borrowed and must
 * stay valid until write() returns.
 *
 * Errors: every function returns a kiln_status with a message naming the key, tensor or
 * file. write() writes to "<path>.tmp" and renames it over path only when complete, so a
 * failed write never leaves a truncated file under the final name.
 * A writer is not thread-safe; fill callbacks are called concurrently for disjoint row
 * ranges and must be thread-safe.
 */
#ifndef KILN_FORMAT_GGUF_WRITER_H
#define KILN_FORMAT_GGUF_WRITER_H

#include "base/pool.h"
#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* GGUF metadata value type ids. */
enum {
    KILN_GGUF_U8 = 0,
    KILN_GGUF_I8 = 1,
    KILN_GGUF_U16 = 2,
    KILN_GGUF_I16 = 3,
    KILN_GGUF_U32 = 4,
    KILN_GGUF_I32 = 5,
    KILN_GGUF_F32 = 6,
    KILN_GGUF_BOOL = 7,
    KILN_GGUF_STRING = 8,
    KILN_GGUF_ARRAY = 9,
    KILN_GGUF_U64 = 10,
    KILN_GGUF_I64 = 11,
    KILN_GGUF_F64 = 12,
};

#define KILN_GGUF_MAX_NAME 63

typedef struct kiln_gguf_writer kiln_gguf_writer;

/* A declared tensor, as handed to fill callbacks. */
typedef struct kiln_gguf_wtensor {
    const char *name;
    uint32_t dtype;
    int rank;
    int64_t shape[4]; /* ggml order; unused dims are 1 */
    int64_t n_rows;   /* product of shape[1..] */
    size_t row_bytes; /* bytes of one row of shape[0] elements */
    size_t nbytes;    /* n_rows * row_bytes */
    uint64_t offset;  /* from the start of the data section (set by write) */
    void *user;       /* the ctx given with the fill callback */
} kiln_gguf_wtensor;

/* Produces rows [row0, row0 + n) of t into dst (n * t->row_bytes bytes). Called from pool
 * thread `ith` concurrently with other ranges. Returns KILN_OK or an error (the write
 * fails with it). */
typedef kiln_status (*kiln_gguf_fill_fn)(const kiln_gguf_wtensor *t, int64_t row0, int64_t n,
                                         void *dst, int ith, kiln_err *err);

/* alignment: a power of two >= 8 (0: 32, the GGUF default). */
kiln_status kiln_gguf_writer_create(uint32_t alignment, kiln_gguf_writer **out, kiln_err *err);
/* NULL-safe. */
void kiln_gguf_writer_free(kiln_gguf_writer *w);

kiln_status kiln_gguf_writer_set_str(kiln_gguf_writer *w, const char *key, const char *s,
                                     kiln_err *err);
kiln_status kiln_gguf_writer_set_u32(kiln_gguf_writer *w, const char *key, uint32_t v,
                                     kiln_err *err);
kiln_status kiln_gguf_writer_set_i32(kiln_gguf_writer *w, const char *key, int32_t v,
                                     kiln_err *err);
kiln_status kiln_gguf_writer_set_u64(kiln_gguf_writer *w, const char *key, uint64_t v,
                                     kiln_err *err);
kiln_status kiln_gguf_writer_set_f32(kiln_gguf_writer *w, const char *key, float v, kiln_err *err);
kiln_status kiln_gguf_writer_set_bool(kiln_gguf_writer *w, const char *key, bool v, kiln_err *err);
/* Array of n numeric / bool elements of type elem (KILN_GGUF_U8 .. F64, not STRING or
 * ARRAY), given in host (little-endian) layout. */
kiln_status kiln_gguf_writer_set_arr(kiln_gguf_writer *w, const char *key, uint32_t elem,
                                     const void *elems, uint64_t n, kiln_err *err);
/* Array of n strings; lens may be NULL (NUL-terminated strings) or give byte lengths
 * (strings may then hold any bytes, including NUL). */
kiln_status kiln_gguf_writer_set_arr_str(kiln_gguf_writer *w, const char *key,
                                         const char *const *strs, const size_t *lens, uint64_t n,
                                         kiln_err *err);
/* A value already in GGUF encoding (type u32 followed by the payload), e.g. copied from
 * another file. The bytes are checked to be exactly one well-formed value. */
kiln_status kiln_gguf_writer_set_raw(kiln_gguf_writer *w, const char *key, const void *value,
                                     size_t len, kiln_err *err);
/* A metadata value as read by the GGUF reader (format/meta.h), copied with its type
 * (arrays of arrays included): used to copy keys from one file to another. */
struct kiln_meta_value;
kiln_status kiln_gguf_writer_set_value(kiln_gguf_writer *w, const char *key,
                                       const struct kiln_meta_value *v, kiln_err *err);
bool kiln_gguf_writer_has(const kiln_gguf_writer *w, const char *key);
/* Removes key if present. */
void kiln_gguf_writer_remove(kiln_gguf_writer *w, const char *key);

/* Declares a tensor whose bytes (kiln_dtype_nbytes(shape) of them) are at data. */
kiln_status kiln_gguf_writer_add_tensor(kiln_gguf_writer *w, const char *name, uint32_t dtype,
                                        int rank, const int64_t *shape, const void *data,
                                        kiln_err *err);
/* Declares a tensor produced by fill (ctx is passed as t->user). */
kiln_status kiln_gguf_writer_add_tensor_fill(kiln_gguf_writer *w, const char *name, uint32_t dtype,
                                             int rank, const int64_t *shape, kiln_gguf_fill_fn fill,
                                             void *ctx, kiln_err *err);

size_t kiln_gguf_writer_tensor_count(const kiln_gguf_writer *w);
size_t kiln_gguf_writer_kv_count(const kiln_gguf_writer *w);

typedef struct kiln_gguf_write_stats {
    uint64_t file_bytes;  /* size of the file written */
    uint64_t data_offset; /* start of the data section */
    double seconds;       /* wall time of write() */
    double fill_seconds;  /* time spent in fill callbacks (wall, all threads together) */
    double io_seconds;    /* time spent in write(2) */
} kiln_gguf_write_stats;

/* Writes the file. pool may be NULL (fill on the calling thread). stats may be NULL.
 * show_progress draws a progress bar on a TTY. */
kiln_status kiln_gguf_writer_write(kiln_gguf_writer *w, const char *path, kiln_pool *pool,
                                   bool show_progress, kiln_gguf_write_stats *stats, kiln_err *err);

#endif /* KILN_FORMAT_GGUF_WRITER_H */
