/* exec.c — executing a load plan: readers (mmap, pread, io_uring), the alias, transform
 * and residual lanes, and the per-lane timing of the report (load.h). */
#include "base/mapguard.h"
#include "base/mem.h"
#include "base/pool.h"
#include "base/timer.h"
#include "load/load_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

#define URING_QD    16
#define URING_PIECE ((size_t)1 << 20)

/* ---- readers ----------------------------------------------------------------------------- */

kiln_status kiln_reader_init(kiln_reader *r, const kiln_load_plan *p, kiln_io io, kiln_err *err) {
    memset(r, 0, sizeof *r);
    r->plan = p;
    r->io = io;
    if (io == KILN_IO_URING) {
        struct io_uring *ring = kiln_calloc(1, sizeof *ring);
        if (!ring) return kiln_err_set(err, KILN_ERR_NOMEM, "io_uring");
        int rc = io_uring_queue_init(URING_QD, ring, 0);
        if (rc < 0) {
            kiln_free(ring);
            return kiln_err_errno(err, -rc, "io_uring_queue_init");
        }
        r->ring = ring;
    }
    return KILN_OK;
}

void kiln_reader_free(kiln_reader *r) {
    if (r->ring) {
        io_uring_queue_exit(r->ring);
        kiln_free(r->ring);
        r->ring = NULL;
    }
}

static kiln_status pread_all(int fd, void *dst, size_t n, uint64_t off, const char *path,
                             kiln_err *err) {
    uint8_t *d = dst;
    while (n) {
        ssize_t got = pread(fd, d, n, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return kiln_err_errno(err, errno, "pread %s at %" PRIu64, path, off);
        if (got == 0)
            return kiln_err_set(err, KILN_ERR_IO, "pread %s at %" PRIu64 ": unexpected end of file",
                                path, off);
        d += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return KILN_OK;
}

/* Reads n_ranges ranges (dst[i] <- file[off[i] .. + len]) through io_uring, URING_QD in flight. */
static kiln_status uring_read(kiln_reader *r, const kiln_model_shard *sh, uint8_t *dst,
                              uint64_t off, size_t n, kiln_err *err) {
    struct io_uring *ring = r->ring;
    size_t submitted = 0, completed = 0, n_pieces = (n + URING_PIECE - 1) / URING_PIECE;
    size_t inflight = 0;
    while (completed < n_pieces) {
        while (submitted < n_pieces && inflight < URING_QD) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
            if (!sqe) break;
            size_t o = submitted * URING_PIECE, len = n - o < URING_PIECE ? n - o : URING_PIECE;
            io_uring_prep_read(sqe, sh->fd, dst + o, (unsigned)len, off + o);
            io_uring_sqe_set_data64(sqe, submitted);
            submitted++;
            inflight++;
        }
        int rc = io_uring_submit_and_wait(ring, 1);
        if (rc < 0 && rc != -EINTR) return kiln_err_errno(err, -rc, "io_uring_submit %s", sh->path);
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        kiln_status st = KILN_OK;
        io_uring_for_each_cqe(ring, head, cqe) {
            size_t k = (size_t)io_uring_cqe_get_data64(cqe);
            size_t o = k * URING_PIECE, len = n - o < URING_PIECE ? n - o : URING_PIECE;
            if (!st && cqe->res < 0)
                st = kiln_err_errno(err, -cqe->res, "io_uring read %s at %" PRIu64, sh->path,
                                    off + o);
            else if (!st && (size_t)cqe->res < len) /* short read: finish it synchronously */
                st = pread_all(sh->fd, dst + o + cqe->res, len - (size_t)cqe->res,
                               off + o + (uint64_t)cqe->res, sh->path, err);
            seen++;
        }
        io_uring_cq_advance(ring, seen);
        completed += seen;
        inflight -= seen;
        if (st) {
            /* drain what is still in flight before the buffers go away */
            while (inflight) {
                if (io_uring_wait_cqe(ring, &cqe) < 0) break;
                io_uring_cqe_seen(ring, cqe);
                inflight--;
            }
            return st;
        }
    }
    return KILN_OK;
}

/* Reads n bytes of item it's tensor at offset off (in its file, or for a tensor in memory
 * relative to its data as tensor offsets are). */
static kiln_status read_range(kiln_reader *r, const kiln_load_item *it, uint64_t off, void *dst,
                              size_t n, kiln_err *err) {
    if (it->src->file == KILN_LOAD_MEMORY) {
        memcpy(dst, (const uint8_t *)it->src->data + (off - it->src->offset), n);
        return KILN_OK;
    }
    const kiln_model_shard *sh = kiln_model_file_shard(r->plan->mf, it->file);
    if (off > sh->size || n > sh->size - off)
        return kiln_err_set(err, KILN_ERR_INTERNAL, "read past end of %s", sh->path);
    switch (r->io) {
    case KILN_IO_MMAP:
        memcpy(dst, sh->base + off, n);
        return KILN_OK;
    case KILN_IO_URING:
        return uring_read(r, sh, dst, off, n, err);
    default:
        return pread_all(sh->fd, dst, n, off, sh->path, err);
    }
}

/* ---- producing output rows -------------------------------------------------------------- */

kiln_status kiln_load_produce(const kiln_load_plan *p, const kiln_load_item *it, int64_t r0,
                              int64_t r1, void *dst, void *scratch, kiln_reader *rd,
                              kiln_err *err) {
    const int64_t rows = r1 - r0;
    const bool contiguous = it->src_stride == it->src_row_bytes;
    const bool identity =
        strcmp(it->layout->name, "native") == 0 && it->src->fixup == KILN_FIXUP_NONE;
    const size_t src_bytes = (size_t)(it->src_row_bytes * (uint64_t)rows);
    const uint64_t off = it->src_offset + (uint64_t)r0 * it->src_stride;
    const uint8_t *src;
    if (identity) {
        /* read straight into the destination. With the mmap reader, copies still use
         * pread: the kernel copies from the page cache, while memcpy from a fresh mapping
         * pays a page fault per 64 KiB (measured 1.3-4x slower here) */
        kiln_reader prd = *rd;
        if (prd.io == KILN_IO_MMAP) {
            prd.io = KILN_IO_PREAD;
            rd = &prd;
        }
        if (contiguous) return read_range(rd, it, off, dst, src_bytes, err);
        for (int64_t r = 0; r < rows; r++)
            KILN_TRY(read_range(rd, it, off + (uint64_t)r * it->src_stride,
                                (uint8_t *)dst + (size_t)r * it->src_row_bytes, it->src_row_bytes,
                                err));
        return KILN_OK;
    }
    if ((rd->io == KILN_IO_MMAP || it->src->file == KILN_LOAD_MEMORY) && contiguous) {
        /* transform straight from the mapping (or the tensor in memory) */
        src = kiln_load_src(p, it) + (uint64_t)r0 * it->src_stride;
    } else {
        if (!scratch) return kiln_err_set(err, KILN_ERR_INTERNAL, "no staging buffer");
        if (contiguous) {
            KILN_TRY(read_range(rd, it, off, scratch, src_bytes, err));
        } else {
            for (int64_t r = 0; r < rows; r++)
                KILN_TRY(read_range(rd, it, off + (uint64_t)r * it->src_stride,
                                    (uint8_t *)scratch + (size_t)r * it->src_row_bytes,
                                    it->src_row_bytes, err));
        }
        src = scratch;
    }
    return it->layout->run(it->src->dtype, it->shape[0], it->src->fixup, src, rows, dst, err);
}

/* ---- parallel work: a list of chunks run on the pool ------------------------------------ */

typedef struct chunk {
    uint32_t item;
    int64_t r0, r1;
} chunk;

typedef struct work {
    kiln_load_plan *p;
    chunk *chunks;
    int64_t n_chunks;
    kiln_lane lane; /* alias (populate) or transform */
    bool cold;      /* the files were not (fully) in the page cache at planning time */
    int64_t nth;    /* threads (look-ahead distance of the prefetch) */
    kiln_reader *readers;
    void **scratch;
    atomic_int failed;
    pthread_mutex_t lock;
    kiln_err err;
    atomic_uint_fast64_t done_bytes;
    atomic_int *left; /* per item: chunks still to run (the tensor commits at 0) */
    bool *drop;       /* per item: unmap its source pages once transformed (no alias shares
                         them): the transformed copy is the only one resident */
} work;

/* Progress of the whole load (src bytes): the bar appears once loading has run ~1 s. */
static void progress(kiln_load_plan *p, uint64_t lane_done) {
    if (!p->req.progress) return;
    uint64_t now = kiln_now_ns();
    if (!p->bar_on) {
        if (now - p->bar_t0 < 1000000000ull) return;
        uint64_t total = 0;
        for (int l = 0; l < KILN_LANE_COUNT; l++) total += p->rep.lane[l].src_bytes;
        kiln_progress_begin(&p->bar, p->req.label ? p->req.label : "loading", total);
        p->bar.start_ns = p->bar_t0;
        p->bar_on = true;
    }
    kiln_progress_update(&p->bar, p->bar_base + lane_done);
}

static void fail_work(work *w, const kiln_err *e, const kiln_load_item *it) {
    pthread_mutex_lock(&w->lock);
    if (!atomic_load(&w->failed)) {
        w->err = *e;
        kiln_err_wrap(&w->err, e->code, "lane %s: tensor '%s'", kiln_lane_name(w->lane),
                      it->src->name);
        atomic_store(&w->failed, 1);
    }
    pthread_mutex_unlock(&w->lock);
}

/* ---- owned host memory: large buffers are private anonymous mappings, returned to the
 * system at free. No MADV_HUGEPAGE: with THP "defrag=madvise" a huge-page fault may
 * compact memory synchronously; measured 4x slower first touch than 4 KiB pages here. */
#define MAP_MIN ((size_t)2 << 20)

void *kiln_load_owned_alloc(size_t n) {
    if (n < MAP_MIN) return kiln_alloc_aligned(n ? n : 1);
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void kiln_load_owned_free(void *p, size_t n) {
    if (!p) return;
    if (n < MAP_MIN)
        kiln_free_aligned(p);
    else
        munmap(p, n);
}

/* Maps the pages of [a, a + n) into the page tables, so the first use of an aliased tensor
 * does not fault. Warm file: one read per 64 KiB, each fault maps its neighbours too
 * (the kernel's fault-around, 64 KiB by default): measured 1.5-3x faster than
 * MADV_POPULATE_READ here. Cold file: MADV_POPULATE_READ after the caller started
 * asynchronous readahead of the range. */
static void populate_range(const uint8_t *a, size_t n, bool cold) {
    long pg = sysconf(_SC_PAGESIZE);
    const volatile uint8_t *va = a; /* volatile reads: the compiler must perform them */
    if (!cold) {
        for (size_t o = 0; o < n; o += 65536) (void)va[o];
        if (n) (void)va[n - 1];
        return;
    }
    uintptr_t start = (uintptr_t)a & ~(uintptr_t)(pg - 1);
    size_t len = (size_t)((uintptr_t)a + n - start);
    if (madvise((void *)start, len, MADV_POPULATE_READ) == 0) return;
    /* kernels before 5.14: touch one byte per page (same lane, same result: resident) */
    for (size_t o = 0; o < n; o += (size_t)pg) (void)va[o];
    if (n) (void)va[n - 1];
}

/* Unmaps the whole pages of a transformed chunk's source rows from this process (the
 * page cache keeps them; a later access refaults): peak resident memory stays the
 * aliased bytes plus the owned copies, not a second mapped copy of every transformed
 * tensor. Only for tensors no alias item uses and contiguous rows read via the mapping. */
static void drop_source(const kiln_load_plan *p, const kiln_load_item *it, int64_t r0, int64_t r1) {
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)(kiln_load_src(p, it) + (uint64_t)r0 * it->src_stride);
    uintptr_t b = a + (uintptr_t)((uint64_t)(r1 - r0) * it->src_stride);
    a = (a + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1); /* whole pages inside the range */
    b &= ~(uintptr_t)(pg - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Cold files: asks the kernel to start reading chunk c (large asynchronous readahead)
 * instead of the small synchronous windows that page faults or a read would start. */
static void prefetch_chunk(const work *w, int64_t c) {
    if (c >= w->n_chunks) return;
    const chunk *ch = &w->chunks[c];
    const kiln_load_item *it = &w->p->items[ch->item];
    if (it->src->file == KILN_LOAD_MEMORY) return;
    const kiln_model_shard *sh = kiln_model_file_shard(w->p->mf, it->file);
    uint64_t off = it->src_offset + (uint64_t)ch->r0 * it->src_stride;
    uint64_t span = (uint64_t)(ch->r1 - ch->r0 - 1) * it->src_stride + it->src_row_bytes;
    posix_fadvise(sh->fd, (off_t)off, (off_t)span, POSIX_FADV_WILLNEED);
}

static void run_chunks(void *ctx, int64_t begin, int64_t end, int ith) {
    work *w = ctx;
    const bool prefetch =
        w->cold && (w->lane == KILN_LANE_ALIAS || w->p->rep.env.io != KILN_IO_MMAP);
    for (int64_t c = begin; c < end; c++) {
        if (atomic_load_explicit(&w->failed, memory_order_relaxed)) return;
        const chunk *ch = &w->chunks[c];
        kiln_load_item *it = &w->p->items[ch->item];
        uint64_t bytes = it->src_row_bytes * (uint64_t)(ch->r1 - ch->r0);
        if (prefetch) {
            /* this chunk, and the one this thread will likely take next, so the device
             * always has queued reads while this thread copies */
            if (c == begin) prefetch_chunk(w, c);
            prefetch_chunk(w, c + w->nth);
        }
        if (w->lane == KILN_LANE_ALIAS) {
            if (it->src->file != KILN_LOAD_MEMORY)
                populate_range(kiln_load_src(w->p, it) + (uint64_t)ch->r0 * it->src_row_bytes,
                               (size_t)bytes, w->cold);
        } else {
            kiln_err e;
            kiln_err_clear(&e);
            uint8_t *dst = (uint8_t *)w->p->owned[ch->item] + (size_t)ch->r0 * it->out_row_bytes;
            kiln_status st = kiln_load_produce(w->p, it, ch->r0, ch->r1, dst, w->scratch[ith],
                                               &w->readers[ith], &e);
            if (st) {
                fail_work(w, &e, it);
                return;
            }
            if (w->drop && w->drop[ch->item]) drop_source(w->p, it, ch->r0, ch->r1);
        }
        uint64_t done =
            atomic_fetch_add_explicit(&w->done_bytes, bytes, memory_order_relaxed) + bytes;
        if (ith == 0) progress(w->p, done);
        /* the last chunk of a tensor commits it: done tensors stay valid even when a later
         * tensor fails */
        if (atomic_fetch_sub_explicit(&w->left[ch->item], 1, memory_order_acq_rel) == 1)
            it->done = true;
    }
}

/* Splits every item of `lane` into chunks and runs them on the pool. */
static kiln_status run_parallel(kiln_load_plan *p, kiln_pool *pool, kiln_lane lane, kiln_err *err) {
    int64_t n_chunks = 0;
    for (size_t i = 0; i < p->n; i++) {
        const kiln_load_item *it = &p->items[i];
        if (it->lane != lane || it->n_rows == 0) continue;
        int64_t cr = kiln_load_chunk_rows(it);
        n_chunks += (it->n_rows + cr - 1) / cr;
    }
    if (n_chunks == 0) return KILN_OK;
    work w = {.p = p, .n_chunks = n_chunks, .lane = lane};
    w.cold = p->rep.env.resident_bytes < p->rep.env.file_bytes;
    pthread_mutex_init(&w.lock, NULL);
    int nth = kiln_pool_size(pool);
    w.nth = nth;
    w.chunks = kiln_calloc((size_t)n_chunks, sizeof *w.chunks);
    w.left = kiln_calloc(p->n ? p->n : 1, sizeof *w.left);
    w.readers = kiln_calloc((size_t)nth, sizeof *w.readers);
    w.scratch = kiln_calloc((size_t)nth, sizeof *w.scratch);
    kiln_status st = KILN_OK;
    if (!w.chunks || !w.left || !w.readers || !w.scratch)
        st = kiln_err_set(err, KILN_ERR_NOMEM, "load chunks");
    const char *kd = getenv("KILN_LOAD_DROP"); /* 0: keep the sources mapped (A/B) */
    if (!st && lane == KILN_LANE_TRANSFORM && p->rep.env.io == KILN_IO_MMAP &&
        !(kd && strcmp(kd, "0") == 0)) {
        w.drop = kiln_calloc(p->n ? p->n : 1, sizeof *w.drop);
        if (!w.drop) st = kiln_err_set(err, KILN_ERR_NOMEM, "load chunks");
        for (size_t i = 0; !st && i < p->n; i++) {
            const kiln_load_item *it = &p->items[i];
            bool identity =
                strcmp(it->layout->name, "native") == 0 && it->src->fixup == KILN_FIXUP_NONE;
            w.drop[i] = it->lane == KILN_LANE_TRANSFORM && !identity &&
                        it->src->file != KILN_LOAD_MEMORY && it->src_stride == it->src_row_bytes;
            for (size_t j = 0; w.drop[i] && j < p->n; j++) /* an alias keeps its pages */
                if (p->items[j].src == it->src && p->items[j].lane == KILN_LANE_ALIAS)
                    w.drop[i] = false;
        }
    }
    int64_t k = 0;
    for (size_t i = 0; !st && i < p->n; i++) {
        const kiln_load_item *it = &p->items[i];
        if (it->lane != lane || it->n_rows == 0) continue;
        int64_t cr = kiln_load_chunk_rows(it);
        for (int64_t r = 0; r < it->n_rows; r += cr) {
            w.chunks[k++] = (chunk){(uint32_t)i, r, r + cr < it->n_rows ? r + cr : it->n_rows};
            atomic_fetch_add_explicit(&w.left[i], 1, memory_order_relaxed);
        }
    }
    /* staging is needed by transforms that do not read straight into the destination
     * and cannot transform straight from the mapping */
    bool need_scratch = false;
    for (size_t i = 0; i < p->n && lane == KILN_LANE_TRANSFORM; i++) {
        const kiln_load_item *it = &p->items[i];
        bool identity =
            strcmp(it->layout->name, "native") == 0 && it->src->fixup == KILN_FIXUP_NONE;
        bool contiguous = it->src_stride == it->src_row_bytes;
        if (it->lane == lane && !identity && (p->rep.env.io != KILN_IO_MMAP || !contiguous))
            need_scratch = true;
    }
    for (int t = 0; !st && t < nth && lane == KILN_LANE_TRANSFORM; t++) {
        st = kiln_reader_init(&w.readers[t], p, p->rep.env.io, err);
        if (!st && need_scratch && p->max_chunk_src) {
            w.scratch[t] = kiln_alloc_aligned(p->max_chunk_src);
            if (!w.scratch[t]) st = kiln_err_set(err, KILN_ERR_NOMEM, "staging buffer");
        }
    }
    if (!st) {
        kiln_pool_for(pool, n_chunks, 1, run_chunks, &w);
        if (atomic_load(&w.failed)) {
            if (err) *err = w.err;
            st = w.err.code;
        }
    }
    for (int t = 0; w.readers && t < nth; t++) kiln_reader_free(&w.readers[t]);
    for (int t = 0; w.scratch && t < nth; t++) kiln_free_aligned(w.scratch[t]);
    kiln_free(w.chunks);
    kiln_free(w.drop);
    kiln_free(w.left);
    kiln_free(w.readers);
    kiln_free(w.scratch);
    pthread_mutex_destroy(&w.lock);
    return st;
}

/* ---- lanes ---------------------------------------------------------------------------- */

/* The owned host memory of the transform and residual lanes: one arena, each tensor at a
 * 64-byte aligned offset. Its interior is 2 MiB aligned and, with req.huge_pages, advised
 * MADV_HUGEPAGE before the first touch: kernels stream these weights every token, and
 * with 4 KiB pages each page is a TLB miss and a prefetcher stop (docs/CPU.md: q4_0 R16
 * decode 34-36 GB/s with huge pages, 22-25 without). */
#define HUGE_ALIGN ((size_t)2 << 20)

static kiln_status allocate_arena(kiln_load_plan *p, kiln_err *err) {
    size_t total = 0;
    for (size_t i = 0; i < p->n; i++) {
        const kiln_load_item *it = &p->items[i];
        if (it->lane != KILN_LANE_TRANSFORM && it->lane != KILN_LANE_RESIDUAL) continue;
        size_t sz = ((size_t)it->nbytes + 63) & ~(size_t)63;
        if (it->nbytes > SIZE_MAX - 64 || !kiln_size_add(total, sz ? sz : 64, &total))
            return kiln_err_set(err, KILN_ERR_OVERFLOW, "owned host memory: size overflow");
    }
    if (total == 0) return KILN_OK;
    const bool big = total >= HUGE_ALIGN;
    size_t bytes = total;
    if (big && !kiln_size_add(total, HUGE_ALIGN, &bytes))
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "owned host memory: size overflow");
    p->arena = kiln_load_owned_alloc(bytes);
    if (!p->arena)
        return kiln_err_set(err, KILN_ERR_NOMEM,
                            "owned host memory: %zu bytes for %s: out of memory", bytes,
                            "the transform and residual lanes");
    p->arena_bytes = bytes;
    uint8_t *dst = p->arena;
    if (big) {
        dst = (uint8_t *)(((uintptr_t)p->arena + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1));
        size_t huge = total & ~(HUGE_ALIGN - 1);
        if (p->req.huge_pages && huge && madvise(dst, huge, MADV_HUGEPAGE) != 0)
            p->rep.env.huge_pages = false;
        else
            p->rep.env.huge_pages = p->req.huge_pages && huge;
    }
    for (size_t i = 0; i < p->n; i++) {
        kiln_load_item *it = &p->items[i];
        if (it->lane != KILN_LANE_TRANSFORM && it->lane != KILN_LANE_RESIDUAL) continue;
        p->owned[i] = dst;
        it->data = dst;
        size_t sz = ((size_t)it->nbytes + 63) & ~(size_t)63;
        dst += sz ? sz : 64;
    }
    return KILN_OK;
}

/* Residual: generic byte ranges, read with pread one range at a time into owned memory,
 * then the tensor's transform (the reference the other lanes must match). */
static kiln_status residual_lane(kiln_load_plan *p, kiln_err *err) {
    kiln_reader rd;
    KILN_TRY(kiln_reader_init(&rd, p, KILN_IO_PREAD, err));
    void *scratch = p->max_chunk_src ? kiln_alloc_aligned(p->max_chunk_src) : NULL;
    if (p->max_chunk_src && !scratch) return kiln_err_set(err, KILN_ERR_NOMEM, "residual staging");
    kiln_status st = KILN_OK;
    uint64_t done = 0;
    for (size_t i = 0; i < p->n && !st; i++) {
        kiln_load_item *it = &p->items[i];
        if (it->lane != KILN_LANE_RESIDUAL) continue;
        int64_t cr = kiln_load_chunk_rows(it);
        for (int64_t r = 0; r < it->n_rows && !st; r += cr) {
            int64_t r1 = r + cr < it->n_rows ? r + cr : it->n_rows;
            st = kiln_load_produce(p, it, r, r1,
                                   (uint8_t *)p->owned[i] + (size_t)r * it->out_row_bytes, scratch,
                                   &rd, err);
            done += it->src_row_bytes * (uint64_t)(r1 - r);
            progress(p, done);
        }
        if (st) kiln_err_wrap(err, st, "lane residual: tensor '%s'", it->src->name);
        it->done = !st;
    }
    kiln_free_aligned(scratch);
    kiln_reader_free(&rd);
    return st;
}

kiln_status kiln_load_execute(kiln_load_plan *p, kiln_err *err) {
    if (p->rep.executed)
        return kiln_err_set(err, KILN_ERR_STATE, "the load plan was already executed");
    p->rep.executed = true;
    uint64_t t0 = kiln_now_ns();
    p->bar_t0 = t0;
    kiln_pool *pool = NULL;
    KILN_TRY(kiln_pool_create(p->rep.env.threads, &pool, err));
    kiln_status st = KILN_OK;

    /* alias: views into the mapping, faulted in when asked */
    uint64_t ts = kiln_now_ns();
    for (size_t i = 0; i < p->n; i++) {
        kiln_load_item *it = &p->items[i];
        if (it->lane != KILN_LANE_ALIAS) continue;
        it->data = kiln_load_src(p, it);
        it->done = true;
    }
    if (p->req.populate) st = run_parallel(p, pool, KILN_LANE_ALIAS, err);
    p->rep.lane[KILN_LANE_ALIAS].seconds = (double)(kiln_now_ns() - ts) * 1e-9;
    p->bar_base += p->rep.lane[KILN_LANE_ALIAS].src_bytes;

    /* transform: parallel over row chunks of every tensor */
    if (!st) {
        ts = kiln_now_ns();
        st = allocate_arena(p, err);
        if (!st) st = run_parallel(p, pool, KILN_LANE_TRANSFORM, err);
        for (size_t i = 0; !st && i < p->n; i++) /* empty tensors have no chunks */
            if (p->items[i].lane == KILN_LANE_TRANSFORM && p->items[i].n_rows == 0)
                p->items[i].done = true;
        p->rep.lane[KILN_LANE_TRANSFORM].seconds = (double)(kiln_now_ns() - ts) * 1e-9;
        p->bar_base += p->rep.lane[KILN_LANE_TRANSFORM].src_bytes;
    }
    /* residual */
    if (!st) {
        ts = kiln_now_ns();
        st = residual_lane(p, err);
        p->rep.lane[KILN_LANE_RESIDUAL].seconds = (double)(kiln_now_ns() - ts) * 1e-9;
    }
    /* upload */
    if (!st && p->rep.lane[KILN_LANE_UPLOAD].tensors) {
        ts = kiln_now_ns();
        kiln_load_item **ups = kiln_calloc(p->rep.lane[KILN_LANE_UPLOAD].tensors, sizeof *ups);
        if (!ups) {
            st = kiln_err_set(err, KILN_ERR_NOMEM, "upload list");
        } else {
            size_t k = 0;
            for (size_t i = 0; i < p->n; i++)
                if (p->items[i].lane == KILN_LANE_UPLOAD) ups[k++] = &p->items[i];
            kiln_reader rd;
            st = kiln_reader_init(&rd, p, p->rep.env.io, err);
            if (!st) {
                st = kiln_upload_lane(p, ups, k, &rd, err);
                kiln_reader_free(&rd);
            }
            kiln_free(ups);
        }
        p->rep.lane[KILN_LANE_UPLOAD].seconds =
            (double)(kiln_now_ns() - ts) * 1e-9 - p->rep.upload_setup_seconds;
    }
    kiln_pool_free(pool);
    /* a page of the mapping that faulted while the lanes read it (file truncated under
     * us): the bytes read are zeros, not the model */
    if (!st) st = kiln_mapguard_check(err);
    if (p->bar_on) kiln_progress_end(&p->bar);
    p->rep.exec_seconds = (double)(kiln_now_ns() - t0) * 1e-9;
    p->rep.total_seconds = p->rep.plan_seconds + p->rep.exec_seconds;
    if (st) kiln_err_wrap(err, st, "loading %s", kiln_model_file_path(p->mf));
    return st;
}
