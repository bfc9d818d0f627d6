/*
 * load_impl.h — internals shared by the loader's files (plan.c, exec.c, report.c,
 * upload.c). Not for use outside src/load/.
 */
#ifndef KILN_LOAD_IMPL_H
#define KILN_LOAD_IMPL_H

#include "base/progress.h"
#include "format/meta.h"
#include "load/load.h"

#include <stddef.h>
#include <stdint.h>

#define KILN_LOAD_CHUNK_BYTES ((size_t)8 << 20) /* unit of parallel work and of staging */

struct kiln_load_plan {
    const kiln_model_file *mf;
    kiln_load_request req;
    kiln_load_item *items;
    void **owned; /* per item: host buffer owned by the plan (or NULL) */
    size_t n;
    kiln_str *names;   /* one per tensor (its first item) */
    size_t *name_item; /* names[i] -> item index */
    kiln_strmap index;
    /* owned host memory of the transform and residual lanes: one arena (item buffers at
     * 64-byte aligned offsets; interior 2 MiB aligned, MADV_HUGEPAGE with req.huge_pages) */
    uint8_t *arena;
    size_t arena_bytes;
    /* progress bar (drawn by one thread at a time: a pool's thread 0, or the caller) */
    kiln_progress bar;
    bool bar_on;
    uint64_t bar_base, bar_t0; /* bytes of lanes already finished; start time */
    size_t max_chunk_src;      /* largest source bytes of one chunk (staging size) */
    /* the upload lane's pinned staging (portable: every device's upload reuses it), kept
     * until the plan is freed with the weights: freeing 128 MiB of pinned memory costs
     * 13-17 ms on the H100 host, time the user would wait for before the first token */
    void *stage_pin[4];
    size_t stage_bytes;
    kiln_load_report rep;
};

/* The source bytes of item it at its src_offset (memory tensors: their data). */
static inline const uint8_t *kiln_load_src(const kiln_load_plan *p, const kiln_load_item *it) {
    if (it->src->file == KILN_LOAD_MEMORY)
        return (const uint8_t *)it->src->data + (it->src_offset - it->src->offset);
    return kiln_model_file_shard(p->mf, it->file)->base + it->src_offset;
}

/* Output rows for source rows [.., r1): r1, or at the end of a tensor whose layout pads
 * its last group, r1 rounded up to the group. */
static inline int64_t kiln_load_out_end(const kiln_load_item *it, int64_t r1) {
    const int64_t g = it->layout->row_group;
    return r1 == it->n_rows && it->layout->pad_last_group ? (r1 + g - 1) / g * g : r1;
}

/* A byte reader bound to one executor (one per thread). */
typedef struct kiln_reader {
    const kiln_load_plan *plan;
    kiln_io io;
    void *ring; /* struct io_uring * when io == KILN_IO_URING */
} kiln_reader;

kiln_status kiln_reader_init(kiln_reader *r, const kiln_load_plan *p, kiln_io io, kiln_err *err);
void kiln_reader_free(kiln_reader *r);

/* Produces output rows [r0, r1) of item it into dst (at the rows' output position
 * relative to dst, i.e. dst holds exactly those rows), reading source bytes through rd
 * and staging through scratch (at least max_chunk_src bytes, or NULL when unneeded). */
kiln_status kiln_load_produce(const kiln_load_plan *p, const kiln_load_item *it, int64_t r0,
                              int64_t r1, void *dst, void *scratch, kiln_reader *rd, kiln_err *err);
/* Rows per chunk for an item (a multiple of the layout's row group). */
int64_t kiln_load_chunk_rows(const kiln_load_item *it);

/* Owned host buffers (anonymous mappings when large); free with the same size. */
void *kiln_load_owned_alloc(size_t n);
void kiln_load_owned_free(void *p, size_t n);

/* ---- CUDA upload lane (upload.c; stubs without KILN_HAVE_CUDA) ---- */
/* Number of usable devices (0 without CUDA or a device). */
int kiln_cuda_device_count(void);
/* Selects the device and creates its context (at planning: the first CUDA call of a
 * process costs 0.1-0.5 s, which is no part of any lane's bandwidth; the report's plan
 * time includes it). */
kiln_status kiln_cuda_device_init(int device, kiln_err *err);
/* Uploads the items (all placed on CUDA) with pinned double buffers; fills device_ptr. */
kiln_status kiln_upload_lane(kiln_load_plan *p, kiln_load_item **items, size_t n, kiln_reader *rd,
                             kiln_err *err);
void kiln_upload_free(void *device_ptr);
/* Frees the plan's pinned upload staging (kiln_load_plan_free calls it). */
void kiln_upload_staging_free(kiln_load_plan *p);

#endif /* KILN_LOAD_IMPL_H */
