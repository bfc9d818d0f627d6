/*
 * upload.c — the upload lane: tensors to CUDA device memory through pinned,
 * double-buffered staging on a stream, overlapping the read (and transform) of chunk k+1
 * with the host-to-device copy of chunk k.
 *
 * Uses the CUDA runtime API only, under KILN_HAVE_CUDA (set when CMake builds the CUDA
 * backend); without it the functions below are stubs that planning never reaches (a CUDA
 * target fails planning with "built without CUDA"). Compiled by the C compiler either way.
 */
#include "load/load_impl.h"

#include "base/log.h"
#include "base/mem.h"
#include "base/pool.h"
#include "base/timer.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>

static kiln_status cuda_err(cudaError_t e, const char *what, kiln_err *err) {
    return kiln_err_set(err, KILN_ERR_DEVICE, "%s: %s (%s)", what, cudaGetErrorString(e),
                        cudaGetErrorName(e));
}
#define CU(call, what)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            st = cuda_err(e_, what, err);                                                          \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

kiln_status kiln_load_item_read(const kiln_load_item *it, void *dst, kiln_err *err) {
    if (!it->done)
        return kiln_err_set(err, KILN_ERR_STATE, "tensor '%s' is not loaded", it->src->name);
    if (it->device_ptr) {
        cudaError_t e = cudaMemcpy(dst, it->device_ptr, it->nbytes, cudaMemcpyDeviceToHost);
        return e == cudaSuccess ? KILN_OK : cuda_err(e, "cudaMemcpy (device to host)", err);
    }
    memcpy(dst, it->data, it->nbytes);
    return KILN_OK;
}

int kiln_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

void kiln_upload_free(void *device_ptr) {
    if (device_ptr) cudaFree(device_ptr);
}

/* Staging: UP_NBUF pinned buffers of up to UP_STAGE bytes. Slab k is filled by every
 * thread of a local pool (each with its own reader and scratch) while the copy engine
 * moves slab k-1..k-UP_NBUF+1 to the device, so the host side (page cache -> pinned) and
 * the PCIe side run at the same time, and the host side is not one memcpy thread. A slab
 * is cut into granules of about UP_GRANULE bytes (whole row groups) so that every thread
 * works on every slab: with the loader's 8 MiB chunks a 32 MiB slab kept 4 of 16 threads
 * busy and the lane ran at 0.21 of pinned H2D (docs/PERF.md). */
#define UP_NBUF    4 /* = the plan's stage_pin slots */
#define UP_STAGE   ((size_t)32 << 20)
#define UP_GRANULE ((size_t)1 << 20)

/* How host bytes reach the copy engine (KILN_UPLOAD; docs/LOADER.md "Upload lane"):
 *   pread   every tensor read with pread into pinned staging (the generic way);
 *   stream  tensors that lie in a cached file as the device wants them (the mmap reader,
 *           native layout, contiguous rows) are cut into page-aligned windows of the file's
 *           mapping, copied into pinned staging by every thread (plain stores; streaming
 *           stores with KILN_UPLOAD_STORES=stream: 0.78-0.89 vs 0.82-0.95 of pinned H2D in
 *           the same runs, session 7 runs 4-5, docs/PERF_GPU.md);
 *   direct  those windows registered with the driver (cudaHostRegister, read-only) and
 *           copied from the page cache itself by KILN_UPLOAD_THREADS threads (default 2),
 *           no host copy;
 *   hybrid  both at once on one queue of windows: staging takes windows from the front,
 *           the direct threads from the back, until they meet.
 * (A fifth way, every thread with its own small pinned ring and stream, no fork-join per
 * window, ran at 0.60-0.74 of pinned H2D against 0.71-0.85 for stream in the same runs:
 * many small copies on 16 streams keep the copy engine waiting; removed, session 7.)
 * Other tensors (a transform on the way, a strided shard) always go through pread staging. */
typedef enum { UP_PREAD, UP_STREAM, UP_DIRECT, UP_HYBRID } up_mode;
static const char *const up_mode_name[] = {"pread", "stream", "direct", "hybrid"};

static up_mode upload_mode(void) {
    const char *m = getenv("KILN_UPLOAD");
    for (int i = 0; m && i < 4; i++)
        if (strcmp(m, up_mode_name[i]) == 0) return (up_mode)i;
    if (m && *m) KILN_WARN("KILN_UPLOAD=%s: not pread, stream, direct or hybrid; using stream", m);
    return UP_STREAM;
}

/* Window path knobs (benchmarks; docs/LOADER.md): window bytes (= a staging buffer),
 * fill granule bytes, and how a granule's pages are mapped before the copy (0: one read
 * per 64 KiB with the kernel's fault-around, 1: MADV_POPULATE_READ, 2: not at all). */
typedef struct up_knobs {
    size_t window, granule;
    int populate;
    bool temporal; /* plain stores (default) instead of streaming stores */
} up_knobs;

static up_knobs upload_knobs(void) {
    up_knobs k = {UP_STAGE, UP_GRANULE, 0, true};
    const char *w = getenv("KILN_UPLOAD_WINDOW_MB"), *g = getenv("KILN_UPLOAD_GRANULE_KB"),
               *m = getenv("KILN_UPLOAD_POPULATE"), *so = getenv("KILN_UPLOAD_STORES");
    if (w && atoi(w) >= 1 && atoi(w) <= 1024) k.window = (size_t)atoi(w) << 20;
    if (so && strcmp(so, "stream") == 0) k.temporal = false; /* streaming stores (A/B) */
    if (g && atoi(g) >= 64 && atoi(g) <= 65536) k.granule = (size_t)atoi(g) << 10;
    if (m && strcmp(m, "madvise") == 0) k.populate = 1;
    if (m && strcmp(m, "none") == 0) k.populate = 2;
    return k;
}

static int upload_threads(void) {
    const char *t = getenv("KILN_UPLOAD_THREADS");
    int n = t ? atoi(t) : 2;
    return n < 1 ? 1 : n > 16 ? 16 : n;
}

/* The item's source bytes can be copied as they lie in the mapping. */
static bool from_mapping(const kiln_load_plan *p, const kiln_load_item *it) {
    return p->rep.env.io == KILN_IO_MMAP && it->src->file != KILN_LOAD_MEMORY &&
           strcmp(it->layout->name, "native") == 0 && it->src->fixup == KILN_FIXUP_NONE &&
           it->src_stride == it->src_row_bytes && it->out_row_bytes == it->src_row_bytes &&
           !it->layout->pad_last_group && it->n_rows > 0;
}

/* Rows of one fill granule of an item: about UP_GRANULE source bytes, whole row groups. */
static int64_t granule_rows(const kiln_load_item *it) {
    const int64_t g = it->layout->row_group;
    int64_t rows = (int64_t)(UP_GRANULE / (it->src_row_bytes ? it->src_row_bytes : 1));
    rows = rows / g * g;
    return rows < g ? g : rows;
}

kiln_status kiln_cuda_device_init(int device, kiln_err *err) {
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaFree(0); /* creates the context now, not in the lane */
    return e == cudaSuccess ? KILN_OK : cuda_err(e, "creating the CUDA context", err);
}

typedef struct up_fill {
    kiln_load_plan *p;
    kiln_load_item *it;
    int64_t r0, r1, granule; /* rows of this slab, in granules of the item's chunk rows */
    uint8_t *dst;
    void **scratch;
    kiln_reader *rds;
    pthread_mutex_t mu;
    kiln_status st;
    kiln_err err;
} up_fill;

static void fill_range(void *ctx, int64_t b, int64_t e, int ith) {
    up_fill *f = ctx;
    int64_t ra = f->r0 + b * f->granule, rb = f->r0 + e * f->granule;
    if (rb > f->r1) rb = f->r1;
    kiln_err e2;
    kiln_status st =
        kiln_load_produce(f->p, f->it, ra, rb, f->dst + (size_t)(ra - f->r0) * f->it->out_row_bytes,
                          f->scratch[ith], &f->rds[ith], &e2);
    if (st) {
        pthread_mutex_lock(&f->mu);
        if (!f->st) {
            f->st = st;
            f->err = e2;
        }
        pthread_mutex_unlock(&f->mu);
    }
}

/* ---- windows of the mapping: stream, direct, hybrid ---- */

typedef struct up_part {
    kiln_load_item *it;
    uint64_t off, len; /* bytes [off, off + len) of the tensor */
    uintptr_t src;     /* their address in the mapping */
} up_part;

enum { WIN_TODO, WIN_REFUSED };
typedef struct up_win {
    uintptr_t ws, we; /* page-aligned, at most knobs.window bytes */
    size_t p0, np;    /* its parts */
    int state;
} up_win;

typedef struct up_q {
    kiln_load_plan *p;
    int device;
    up_win *w;
    size_t nw;
    up_part *parts;
    size_t np;
    pthread_mutex_t mu;
    size_t head, tail; /* windows [head, tail) not taken */
    bool stop;         /* a direct thread failed: the others stop */
    kiln_status st;
    kiln_err err;
    uint64_t direct_bytes;
    double reg_seconds;
    up_knobs kn;
} up_q;

static int cmp_src(const void *a, const void *b) {
    const kiln_load_item *x = *(kiln_load_item *const *)a, *y = *(kiln_load_item *const *)b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->src_offset < y->src_offset ? -1 : x->src_offset > y->src_offset;
}

/* Cuts the from-mapping items of `device` into windows. */
static kiln_status build_windows(up_q *q, kiln_load_item **items, size_t n, kiln_err *err) {
    kiln_load_plan *p = q->p;
    size_t m = 0;
    kiln_load_item **el = kiln_calloc(n ? n : 1, sizeof *el);
    if (!el) return kiln_err_set(err, KILN_ERR_NOMEM, "upload lane: window list");
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        if (items[i]->target.device == q->device && !items[i]->done && from_mapping(p, items[i])) {
            el[m++] = items[i];
            bytes += items[i]->nbytes;
        }
    qsort(el, m, sizeof *el, cmp_src);
    /* at most one window per window bytes plus one per item, parts one per item+window */
    const size_t W = q->kn.window;
    size_t cap_w = (size_t)(bytes / W) + 2 * m + 1, cap_p = 2 * cap_w + m;
    q->w = kiln_calloc(cap_w, sizeof *q->w);
    q->parts = kiln_calloc(cap_p, sizeof *q->parts);
    if (!q->w || !q->parts) {
        kiln_free(el);
        return kiln_err_set(err, KILN_ERR_NOMEM, "upload lane: %zu windows", cap_w);
    }
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    size_t j = 0;    /* first item not yet covered whole */
    uint64_t jd = 0; /* bytes of el[j] covered */
    while (j < m && q->nw < cap_w) {
        const uint32_t file = el[j]->file;
        uintptr_t ws = ((uintptr_t)kiln_load_src(p, el[j]) + jd) & ~(pg - 1);
        uintptr_t we = ws + W, last = ws;
        for (size_t t = j; t < m && el[t]->file == file; t++) {
            uintptr_t a = (uintptr_t)kiln_load_src(p, el[t]), z = a + el[t]->nbytes;
            if (a >= we) break;
            last = z < we ? z : we;
        }
        we = (last + pg - 1) & ~(pg - 1);
        if (we > ws + W) we = ws + W;
        up_win *w = &q->w[q->nw++];
        *w = (up_win){.ws = ws, .we = we, .p0 = q->np};
        while (j < m && el[j]->file == file && q->np < cap_p) {
            uintptr_t a = (uintptr_t)kiln_load_src(p, el[j]) + jd;
            uintptr_t z = (uintptr_t)kiln_load_src(p, el[j]) + el[j]->nbytes;
            if (a >= we) break;
            uintptr_t c = z < we ? z : we;
            q->parts[q->np++] = (up_part){el[j], jd, (uint64_t)(c - a), a};
            w->np++;
            if (c < z) {
                jd += (uint64_t)(c - a);
                break;
            }
            j++;
            jd = 0;
        }
    }
    kiln_free(el);
    if (j < m) return kiln_err_set(err, KILN_ERR_INTERNAL, "upload lane: windows overflow");
    q->tail = q->nw;
    return KILN_OK;
}

static bool q_take(up_q *q, bool front, size_t *wi) {
    pthread_mutex_lock(&q->mu);
    bool ok = !q->stop && q->head < q->tail;
    if (ok) *wi = front ? q->head++ : --q->tail;
    pthread_mutex_unlock(&q->mu);
    return ok;
}

static void q_fail(up_q *q, cudaError_t e, const char *what) {
    pthread_mutex_lock(&q->mu);
    if (!q->st) q->st = cuda_err(e, what, &q->err);
    q->stop = true;
    pthread_mutex_unlock(&q->mu);
}

/* A direct thread: windows from the back of the queue, registered, copied on its own
 * stream, unregistered once copied. A refused registration hands the window back to
 * staging (WIN_REFUSED) and ends this thread's direct copies. */
static void *direct_worker(void *arg) {
    up_q *q = arg;
    cudaStream_t s = NULL;
    cudaError_t e = cudaSetDevice(q->device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        q_fail(q, e, "upload lane: direct copy stream");
        return NULL;
    }
    size_t wi;
    while (q_take(q, false, &wi)) {
        up_win *w = &q->w[wi];
        uint64_t t0 = kiln_now_ns();
        e = cudaHostRegister((void *)w->ws, (size_t)(w->we - w->ws),
                             cudaHostRegisterPortable | cudaHostRegisterReadOnly);
        double dt = (double)(kiln_now_ns() - t0) * 1e-9;
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            KILN_DEBUG("upload: cudaHostRegister of the mapping refused (%s); staging instead",
                       cudaGetErrorString(e));
            pthread_mutex_lock(&q->mu);
            w->state = WIN_REFUSED;
            q->reg_seconds += dt;
            pthread_mutex_unlock(&q->mu);
            break;
        }
        uint64_t bytes = 0;
        for (size_t i = w->p0; i < w->p0 + w->np && e == cudaSuccess; i++) {
            const up_part *pt = &q->parts[i];
            e = cudaMemcpyAsync((uint8_t *)pt->it->device_ptr + pt->off, (const void *)pt->src,
                                (size_t)pt->len, cudaMemcpyHostToDevice, s);
            bytes += pt->len;
        }
        cudaError_t e2 = cudaStreamSynchronize(s);
        (void)cudaHostUnregister((void *)w->ws);
        if (e == cudaSuccess) e = e2;
        if (e != cudaSuccess) {
            q_fail(q, e, "upload lane: direct copy");
            break;
        }
        pthread_mutex_lock(&q->mu);
        q->direct_bytes += bytes;
        q->reg_seconds += dt;
        pthread_mutex_unlock(&q->mu);
    }
    cudaStreamDestroy(s);
    return NULL;
}

typedef struct win_fill {
    const uint8_t *src;
    uint8_t *dst;
    size_t n, granule;
    int populate;
    bool temporal; /* plain memcpy instead of streaming stores */
} win_fill;

/* Granules [b, e) of a window into staging: map the pages first (one read per 64 KiB, the
 * kernel's fault-around maps the rest), then copy with streaming stores. */
static void win_fill_range(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    const win_fill *f = ctx;
    size_t o = (size_t)b * f->granule, z = (size_t)e * f->granule;
    if (z > f->n) z = f->n;
    if (f->populate == 0) {
        const volatile uint8_t *v = f->src + o;
        for (size_t i = 0; i < z - o; i += 65536) (void)v[i];
    } else if (f->populate == 1) {
        const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
        uintptr_t a = (uintptr_t)(f->src + o) & ~(pg - 1);
        (void)madvise((void *)a, (size_t)((uintptr_t)(f->src + z) - a), MADV_POPULATE_READ);
    }
    if (f->temporal)
        memcpy(f->dst + o, f->src + o, z - o);
    else
        kiln_memcpy_stream(f->dst + o, f->src + o, z - o);
}

/* ---- one device ---- */

typedef struct up_stage {
    void *pin[UP_NBUF];
    cudaEvent_t ev[UP_NBUF];
    bool used[UP_NBUF];
    int k; /* slabs so far */
    cudaStream_t stream;
    kiln_pool *pool;
} up_stage;

/* Waits until staging buffer k % UP_NBUF is free; returns it. */
static kiln_status stage_next(kiln_load_plan *p, up_stage *sg, int *b, kiln_err *err) {
    *b = sg->k % UP_NBUF;
    uint64_t tw = kiln_now_ns();
    if (sg->used[*b]) {
        cudaError_t e = cudaEventSynchronize(sg->ev[*b]);
        if (e != cudaSuccess) return cuda_err(e, "cudaEventSynchronize", err);
    }
    p->rep.upload_wait_seconds += (double)(kiln_now_ns() - tw) * 1e-9;
    return KILN_OK;
}

static kiln_status stage_sent(up_stage *sg, int b, kiln_err *err) {
    cudaError_t e = cudaEventRecord(sg->ev[b], sg->stream);
    if (e != cudaSuccess) return cuda_err(e, "cudaEventRecord", err);
    sg->used[b] = true;
    sg->k++;
    return KILN_OK;
}

/* One window through staging. */
static kiln_status stage_window(kiln_load_plan *p, up_stage *sg, const up_q *q, const up_win *w,
                                kiln_err *err) {
    int b;
    KILN_TRY(stage_next(p, sg, &b, err));
    uint64_t tf = kiln_now_ns();
    win_fill f = {(const uint8_t *)w->ws, sg->pin[b],     (size_t)(w->we - w->ws),
                  q->kn.granule,          q->kn.populate, q->kn.temporal};
    kiln_pool_for(sg->pool, (int64_t)((f.n + f.granule - 1) / f.granule), 1, win_fill_range, &f);
    p->rep.upload_fill_seconds += (double)(kiln_now_ns() - tf) * 1e-9;
    for (size_t i = w->p0; i < w->p0 + w->np; i++) {
        const up_part *pt = &q->parts[i];
        cudaError_t e = cudaMemcpyAsync((uint8_t *)pt->it->device_ptr + pt->off,
                                        (uint8_t *)sg->pin[b] + (pt->src - w->ws), (size_t)pt->len,
                                        cudaMemcpyHostToDevice, sg->stream);
        if (e != cudaSuccess) return cuda_err(e, "cudaMemcpyAsync", err);
    }
    return stage_sent(sg, b, err);
}

/* Uploads the items placed on `device`. */
static kiln_status upload_device(kiln_load_plan *p, kiln_load_item **items, size_t n, int device,
                                 kiln_reader *rd, kiln_err *err) {
    kiln_status st = KILN_OK;
    up_stage sg = {0};
    void **scratch = NULL;
    kiln_reader *rds = NULL;
    int nth = 0, n_direct = 0;
    pthread_t th[16];
    const up_mode mode = upload_mode();
    up_fill f = {.p = p, .mu = PTHREAD_MUTEX_INITIALIZER};
    up_q q = {.p = p, .device = device, .mu = PTHREAD_MUTEX_INITIALIZER, .kn = upload_knobs()};
    p->rep.upload_mode = up_mode_name[mode];

    bool any = false;
    for (size_t i = 0; i < n; i++) any |= items[i]->target.device == device;
    if (!any) return KILN_OK;

    const uint64_t t_setup = kiln_now_ns();
    CU(cudaSetDevice(device), "cudaSetDevice");
    CU(cudaStreamCreateWithFlags(&sg.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    /* One device allocation for every tensor of this device, 256-byte aligned slices:
     * hundreds of cudaMalloc calls cost more than the copies of small models, and
     * cudaMalloc may synchronize, so it never runs between copies. */
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        kiln_load_item *it = items[i];
        if (it->target.device != device) continue;
        uint64_t sz = (it->nbytes + 255) & ~(uint64_t)255;
        if (!kiln_u64_add(total, sz ? sz : 256, &total)) {
            st = kiln_err_set(err, KILN_ERR_OVERFLOW, "upload lane: device bytes overflow");
            goto done;
        }
    }
    void *base = NULL;
    CU(cudaMalloc(&base, (size_t)total), "cudaMalloc (device weights)");
    bool owner = true;
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        kiln_load_item *it = items[i];
        if (it->target.device != device) continue;
        it->device_ptr = (uint8_t *)base + off;
        it->device_alloc = owner ? base : NULL;
        owner = false;
        uint64_t sz = (it->nbytes + 255) & ~(uint64_t)255;
        off += sz ? sz : 256;
        if (it->n_rows == 0) it->done = true;
    }
    if (mode != UP_PREAD && (st = build_windows(&q, items, n, err))) goto done;

    /* staging: windows and the largest slab of the other tensors */
    size_t stage = q.nw ? q.kn.window : 0;
    for (size_t i = 0; i < n; i++) {
        kiln_load_item *it = items[i];
        if (it->target.device != device || it->done || (q.nw && from_mapping(p, it))) continue;
        int64_t g = granule_rows(it);
        uint64_t gb = (uint64_t)g * it->out_row_bytes;
        uint64_t slab = gb >= UP_STAGE ? gb : (UP_STAGE / gb) * gb;
        uint64_t all = (uint64_t)kiln_load_out_end(it, it->n_rows) * it->out_row_bytes;
        if (slab > all) slab = all;
        if (slab > stage) stage = (size_t)slab;
    }
    if (stage > p->stage_bytes) kiln_upload_staging_free(p); /* too small: made again */
    for (int b = 0; b < UP_NBUF && stage; b++) {
        if (!p->stage_pin[b])
            CU(cudaHostAlloc(&p->stage_pin[b], stage, cudaHostAllocPortable),
               "cudaHostAlloc (pinned staging)");
        sg.pin[b] = p->stage_pin[b];
        CU(cudaEventCreateWithFlags(&sg.ev[b], cudaEventDisableTiming), "cudaEventCreate");
    }
    if (stage > p->stage_bytes) p->stage_bytes = stage;
    nth = p->rep.env.threads > 0 ? p->rep.env.threads : p->rep.env.cores;
    if (nth < 1) nth = 1;
    if ((st = kiln_pool_create(nth, &sg.pool, err))) goto done;
    nth = kiln_pool_size(sg.pool);
    scratch = kiln_calloc((size_t)nth, sizeof *scratch);
    rds = kiln_calloc((size_t)nth, sizeof *rds);
    if (!scratch || !rds) {
        st = kiln_err_set(err, KILN_ERR_NOMEM, "upload lane: per-thread state");
        goto done;
    }
    for (int t = 0; t < nth; t++) {
        if (p->max_chunk_src && !(scratch[t] = kiln_malloc(p->max_chunk_src))) {
            st = kiln_err_set(err, KILN_ERR_NOMEM, "upload lane: staging of %zu bytes",
                              p->max_chunk_src);
            goto done;
        }
        if ((st = kiln_reader_init(&rds[t], p, rd->io, err))) goto done;
    }
    f.scratch = scratch;
    f.rds = rds;
    /* the lane's bandwidth counts from here: staging, device arena and threads are set up */
    p->rep.upload_setup_seconds += (double)(kiln_now_ns() - t_setup) * 1e-9;

    /* windows: direct threads from the back, staging from the front */
    if (q.nw && (mode == UP_DIRECT || mode == UP_HYBRID)) {
        int want = upload_threads();
        for (; n_direct < want; n_direct++)
            if (pthread_create(&th[n_direct], NULL, direct_worker, &q) != 0) break;
        if (n_direct == 0) {
            st = kiln_err_set(err, KILN_ERR_IO, "upload lane: cannot start a direct copy thread");
            goto done;
        }
    }
    size_t wi;
    while (mode != UP_DIRECT && q_take(&q, true, &wi))
        if ((st = stage_window(p, &sg, &q, &q.w[wi], err))) break;
    for (int t = 0; t < n_direct; t++) pthread_join(th[t], NULL);
    n_direct = 0;
    if (!st && q.st) {
        st = q.st;
        if (err) *err = q.err;
    }
    /* windows the direct threads could not take (refused registration, or left when every
     * direct thread stopped) */
    for (size_t i = 0; !st && i < q.nw; i++)
        if (q.w[i].state == WIN_REFUSED) st = stage_window(p, &sg, &q, &q.w[i], err);
    while (!st && q_take(&q, true, &wi)) st = stage_window(p, &sg, &q, &q.w[wi], err);
    if (st) goto done;
    p->rep.upload_direct_bytes += q.direct_bytes;
    p->rep.upload_register_seconds += q.reg_seconds;
    for (size_t i = 0; i < q.np; i++) q.parts[i].it->done = true;

    /* the other tensors: rows through pread staging */
    for (size_t i = 0; i < n; i++) {
        kiln_load_item *it = items[i];
        if (it->target.device != device || it->done) continue;
        int64_t g = granule_rows(it);
        int64_t per = (int64_t)(stage / it->out_row_bytes) / g * g;
        if (per < g) per = g;
        for (int64_t r = 0; r < it->n_rows; r += per) {
            int64_t r1 = r + per < it->n_rows ? r + per : it->n_rows;
            int b;
            if ((st = stage_next(p, &sg, &b, err))) goto done;
            uint64_t tf = kiln_now_ns();
            f.it = it;
            f.r0 = r;
            f.r1 = r1;
            f.granule = g;
            f.dst = sg.pin[b];
            kiln_pool_for(sg.pool, (r1 - r + g - 1) / g, 1, fill_range, &f);
            p->rep.upload_fill_seconds += (double)(kiln_now_ns() - tf) * 1e-9;
            if (f.st) {
                st = f.st;
                if (err) *err = f.err;
                kiln_err_wrap(err, st, "lane upload: tensor '%s'", it->src->name);
                goto done;
            }
            size_t bytes = (size_t)((uint64_t)(kiln_load_out_end(it, r1) - r) * it->out_row_bytes);
            CU(cudaMemcpyAsync((uint8_t *)it->device_ptr + (size_t)r * it->out_row_bytes, sg.pin[b],
                               bytes, cudaMemcpyHostToDevice, sg.stream),
               "cudaMemcpyAsync");
            if ((st = stage_sent(&sg, b, err))) goto done;
        }
        it->done = true;
    }
    CU(cudaStreamSynchronize(sg.stream), "cudaStreamSynchronize");
done:;
    const uint64_t t_down = kiln_now_ns();
    if (n_direct) { /* failed before the join: stop the direct threads, wait for them */
        pthread_mutex_lock(&q.mu);
        q.stop = true;
        pthread_mutex_unlock(&q.mu);
        for (int t = 0; t < n_direct; t++) pthread_join(th[t], NULL);
    }
    if (sg.stream) cudaStreamSynchronize(sg.stream);
    for (int b = 0; b < UP_NBUF; b++) /* the pinned buffers stay with the plan */
        if (sg.ev[b]) cudaEventDestroy(sg.ev[b]);
    if (sg.stream) cudaStreamDestroy(sg.stream);
    for (int t = 0; t < nth && rds; t++) kiln_reader_free(&rds[t]);
    for (int t = 0; t < nth && scratch; t++) kiln_free(scratch[t]);
    kiln_free(rds);
    kiln_free(scratch);
    kiln_pool_free(sg.pool);
    kiln_free(q.w);
    kiln_free(q.parts);
    p->rep.upload_teardown_seconds += (double)(kiln_now_ns() - t_down) * 1e-9;
    return st;
}

void kiln_upload_staging_free(kiln_load_plan *p) {
    for (int b = 0; b < UP_NBUF; b++) {
        if (p->stage_pin[b]) cudaFreeHost(p->stage_pin[b]);
        p->stage_pin[b] = NULL;
    }
    p->stage_bytes = 0;
}

kiln_status kiln_upload_lane(kiln_load_plan *p, kiln_load_item **items, size_t n, kiln_reader *rd,
                             kiln_err *err) {
    int max_dev = -1;
    for (size_t i = 0; i < n; i++)
        if (items[i]->target.device > max_dev) max_dev = items[i]->target.device;
    for (int d = 0; d <= max_dev; d++) KILN_TRY(upload_device(p, items, n, d, rd, err));
    return KILN_OK;
}

#else /* !KILN_HAVE_CUDA */

kiln_status kiln_load_item_read(const kiln_load_item *it, void *dst, kiln_err *err) {
    if (!it->done)
        return kiln_err_set(err, KILN_ERR_STATE, "tensor '%s' is not loaded", it->src->name);
    memcpy(dst, it->data, it->nbytes);
    return KILN_OK;
}

int kiln_cuda_device_count(void) {
    return 0;
}

kiln_status kiln_cuda_device_init(int device, kiln_err *err) {
    (void)device;
    return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "kiln was built without CUDA");
}

void kiln_upload_free(void *device_ptr) {
    (void)device_ptr;
}

void kiln_upload_staging_free(kiln_load_plan *p) {
    (void)p;
}

kiln_status kiln_upload_lane(kiln_load_plan *p, kiln_load_item **items, size_t n, kiln_reader *rd,
                             kiln_err *err) {
    (void)p, (void)items, (void)n, (void)rd;
    return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "upload lane: kiln was built without CUDA");
}

#endif
