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
#include <unistd.h>

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
#define UP_NBUF    4
#define UP_STAGE   ((size_t)32 << 20)
#define UP_GRANULE ((size_t)1 << 20)
/* Direct: page-aligned windows of the file's mapping registered with the driver, UP_NREG
 * in flight (registering window k+1 overlaps the copy of window k). */
#define UP_NREG   4
#define UP_WINDOW ((size_t)64 << 20)

/* How host bytes reach the copy engine (KILN_UPLOAD=pread|stream|direct; docs/LOADER.md):
 * pread into pinned staging; streaming-store copies from the file's mapping into pinned
 * staging; or the mapping's pages (the page cache) registered and copied from, no host
 * copy. stream and direct apply to tensors read in place from a cached file (the mmap
 * reader, native layout, contiguous rows); the others are staged with pread. */
typedef enum { UP_PREAD, UP_STREAM, UP_DIRECT } up_mode;
static const char *const up_mode_name[] = {"pread", "stream", "direct"};

static up_mode upload_mode(void) {
    const char *m = getenv("KILN_UPLOAD");
    if (m && strcmp(m, "pread") == 0) return UP_PREAD;
    if (m && strcmp(m, "stream") == 0) return UP_STREAM;
    if (m && strcmp(m, "direct") == 0) return UP_DIRECT;
    if (m && *m) KILN_WARN("KILN_UPLOAD=%s: not pread, stream or direct; using stream", m);
    return UP_STREAM;
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
    bool stream; /* copy from the mapping with streaming stores instead of pread */
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
    uint8_t *dst = f->dst + (size_t)(ra - f->r0) * f->it->out_row_bytes;
    if (f->stream) {
        const uint8_t *src = kiln_load_src(f->p, f->it) + (uint64_t)ra * f->it->src_stride;
        size_t n = (size_t)((uint64_t)(rb - ra) * f->it->src_row_bytes);
        /* map the pages first, one read per 64 KiB (the kernel's fault-around maps the
         * rest), so the copy loop runs without faults */
        const volatile uint8_t *v = src;
        for (size_t o = 0; o < n; o += 65536) (void)v[o];
        kiln_memcpy_stream(dst, src, n);
        return;
    }
    kiln_err e2;
    kiln_status st =
        kiln_load_produce(f->p, f->it, ra, rb, dst, f->scratch[ith], &f->rds[ith], &e2);
    if (st) {
        pthread_mutex_lock(&f->mu);
        if (!f->st) {
            f->st = st;
            f->err = e2;
        }
        pthread_mutex_unlock(&f->mu);
    }
}

static int cmp_src(const void *a, const void *b) {
    const kiln_load_item *x = *(kiln_load_item *const *)a, *y = *(kiln_load_item *const *)b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->src_offset < y->src_offset ? -1 : x->src_offset > y->src_offset;
}

/* Direct: copies the from-mapping items of `device` straight from the page cache. The
 * file is cut into page-aligned windows of at most UP_WINDOW bytes over those items'
 * bytes; each window is registered with the driver (read-only), its parts are copied on
 * `stream`, and it is unregistered once its copies are done. Sets it->done on the items it
 * copied whole. When the driver refuses a registration (a kernel or driver without
 * read-only registration of file pages), the items from there on are left to staging
 * (logged at debug level): the same lane, another way to fill it. */
static kiln_status upload_direct(kiln_load_plan *p, kiln_load_item **items, size_t n, int device,
                                 cudaStream_t stream, kiln_err *err) {
    kiln_status st = KILN_OK;
    int ro = 0;
    if (cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, device) !=
            cudaSuccess ||
        !ro) {
        (void)cudaGetLastError();
        KILN_DEBUG("upload: device %d cannot read read-only registered memory; staging", device);
        return KILN_OK;
    }
    size_t m = 0;
    kiln_load_item **el = kiln_calloc(n ? n : 1, sizeof *el);
    if (!el) return kiln_err_set(err, KILN_ERR_NOMEM, "upload lane: direct list");
    for (size_t i = 0; i < n; i++)
        if (items[i]->target.device == device && from_mapping(p, items[i])) el[m++] = items[i];
    qsort(el, m, sizeof *el, cmp_src);
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    void *reg[UP_NREG] = {NULL};
    cudaEvent_t ev[UP_NREG] = {NULL};
    for (int b = 0; b < UP_NREG; b++)
        CU(cudaEventCreateWithFlags(&ev[b], cudaEventDisableTiming), "cudaEventCreate");
    size_t j = 0;    /* first item not yet copied whole */
    uint64_t jd = 0; /* bytes of el[j] already copied */
    for (int k = 0; j < m; k++) {
        const uint32_t file = el[j]->file;
        uintptr_t ws = ((uintptr_t)kiln_load_src(p, el[j]) + jd) & ~(pg - 1);
        uintptr_t we = ws + UP_WINDOW, last = ws;
        for (size_t q = j; q < m && el[q]->file == file; q++) {
            uintptr_t a = (uintptr_t)kiln_load_src(p, el[q]), z = a + el[q]->nbytes;
            if (a >= we) break;
            last = z < we ? z : we;
        }
        we = (last + pg - 1) & ~(pg - 1);
        const int b = k % UP_NREG;
        if (reg[b]) {
            CU(cudaEventSynchronize(ev[b]), "cudaEventSynchronize");
            CU(cudaHostUnregister(reg[b]), "cudaHostUnregister");
            reg[b] = NULL;
        }
        uint64_t t0 = kiln_now_ns();
        cudaError_t e = cudaHostRegister((void *)ws, (size_t)(we - ws),
                                         cudaHostRegisterPortable | cudaHostRegisterReadOnly);
        p->rep.upload_register_seconds += (double)(kiln_now_ns() - t0) * 1e-9;
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            KILN_DEBUG("upload: cudaHostRegister of the mapping refused (%s); staging the "
                       "remaining %zu tensors",
                       cudaGetErrorString(e), m - j);
            break;
        }
        reg[b] = (void *)ws;
        while (j < m && el[j]->file == file) {
            uintptr_t a = (uintptr_t)kiln_load_src(p, el[j]) + jd;
            uintptr_t z = (uintptr_t)kiln_load_src(p, el[j]) + el[j]->nbytes;
            if (a >= we) break;
            uintptr_t c = z < we ? z : we;
            CU(cudaMemcpyAsync((uint8_t *)el[j]->device_ptr + jd, (const void *)a, (size_t)(c - a),
                               cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync");
            p->rep.upload_direct_bytes += (uint64_t)(c - a);
            if (c < z) {
                jd += (uint64_t)(c - a);
                break;
            }
            el[j]->done = true;
            j++;
            jd = 0;
        }
        CU(cudaEventRecord(ev[b], stream), "cudaEventRecord");
    }
    /* a partly copied item goes to staging whole (its direct bytes are overwritten) */
    CU(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
done:
    if (st) cudaStreamSynchronize(stream);
    for (int b = 0; b < UP_NREG; b++) {
        if (reg[b]) cudaHostUnregister(reg[b]);
        if (ev[b]) cudaEventDestroy(ev[b]);
    }
    kiln_free(el);
    return st;
}

/* Uploads the items placed on `device`. */
static kiln_status upload_device(kiln_load_plan *p, kiln_load_item **items, size_t n, int device,
                                 kiln_reader *rd, kiln_err *err) {
    kiln_status st = KILN_OK;
    void *pin[UP_NBUF] = {NULL};
    cudaEvent_t ev[UP_NBUF] = {NULL};
    bool used[UP_NBUF] = {false};
    cudaStream_t stream = NULL;
    kiln_pool *pool = NULL;
    void **scratch = NULL;
    kiln_reader *rds = NULL;
    int nth = 0;
    const up_mode mode = upload_mode();
    up_fill f = {.p = p, .mu = PTHREAD_MUTEX_INITIALIZER};
    p->rep.upload_mode = up_mode_name[mode];

    bool any = false;
    for (size_t i = 0; i < n; i++) any |= items[i]->target.device == device;
    if (!any) return KILN_OK;

    const uint64_t t_setup = kiln_now_ns();
    CU(cudaSetDevice(device), "cudaSetDevice");
    CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
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
    }
    p->rep.upload_setup_seconds += (double)(kiln_now_ns() - t_setup) * 1e-9;

    if (mode == UP_DIRECT && (st = upload_direct(p, items, n, device, stream, err))) goto done;

    /* staging for what is left: the largest slab (whole granules, at most UP_STAGE) */
    size_t stage = 0;
    for (size_t i = 0; i < n; i++) {
        kiln_load_item *it = items[i];
        if (it->target.device != device || it->done) continue;
        if (it->n_rows == 0) {
            it->done = true;
            continue;
        }
        int64_t g = granule_rows(it);
        uint64_t gb = (uint64_t)g * it->out_row_bytes;
        uint64_t slab = gb >= UP_STAGE ? gb : (UP_STAGE / gb) * gb;
        uint64_t all = (uint64_t)kiln_load_out_end(it, it->n_rows) * it->out_row_bytes;
        if (slab > all) slab = all;
        if (slab > stage) stage = (size_t)slab;
    }
    if (stage == 0) goto finish;
    const uint64_t t_stage = kiln_now_ns();
    for (int b = 0; b < UP_NBUF; b++) {
        CU(cudaHostAlloc(&pin[b], stage, cudaHostAllocPortable), "cudaHostAlloc (pinned staging)");
        CU(cudaEventCreateWithFlags(&ev[b], cudaEventDisableTiming), "cudaEventCreate");
    }
    nth = p->rep.env.threads > 0 ? p->rep.env.threads : p->rep.env.cores;
    if (nth < 1) nth = 1;
    if ((st = kiln_pool_create(nth, &pool, err))) goto done;
    nth = kiln_pool_size(pool);
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
    p->rep.upload_setup_seconds += (double)(kiln_now_ns() - t_stage) * 1e-9;

    int k = 0;
    for (size_t i = 0; i < n; i++) {
        kiln_load_item *it = items[i];
        if (it->target.device != device || it->done) continue;
        int64_t g = granule_rows(it);
        int64_t per = (int64_t)(stage / it->out_row_bytes) / g * g;
        if (per < g) per = g;
        f.stream = mode != UP_PREAD && from_mapping(p, it);
        for (int64_t r = 0; r < it->n_rows; r += per, k++) {
            int64_t r1 = r + per < it->n_rows ? r + per : it->n_rows;
            int b = k % UP_NBUF;
            uint64_t tw = kiln_now_ns();
            if (used[b]) CU(cudaEventSynchronize(ev[b]), "cudaEventSynchronize");
            uint64_t tf = kiln_now_ns();
            p->rep.upload_wait_seconds += (double)(tf - tw) * 1e-9;
            f.it = it;
            f.r0 = r;
            f.r1 = r1;
            f.granule = g;
            f.dst = pin[b];
            kiln_pool_for(pool, (r1 - r + g - 1) / g, 1, fill_range, &f);
            p->rep.upload_fill_seconds += (double)(kiln_now_ns() - tf) * 1e-9;
            if (f.st) {
                st = f.st;
                if (err) *err = f.err;
                kiln_err_wrap(err, st, "lane upload: tensor '%s'", it->src->name);
                goto done;
            }
            size_t bytes = (size_t)((uint64_t)(kiln_load_out_end(it, r1) - r) * it->out_row_bytes);
            CU(cudaMemcpyAsync((uint8_t *)it->device_ptr + (size_t)r * it->out_row_bytes, pin[b],
                               bytes, cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync");
            CU(cudaEventRecord(ev[b], stream), "cudaEventRecord");
            used[b] = true;
        }
        it->done = true;
    }
finish:
    CU(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
done:
    if (stream) cudaStreamSynchronize(stream);
    for (int b = 0; b < UP_NBUF; b++) {
        if (ev[b]) cudaEventDestroy(ev[b]);
        if (pin[b]) cudaFreeHost(pin[b]);
    }
    if (stream) cudaStreamDestroy(stream);
    for (int t = 0; t < nth && rds; t++) kiln_reader_free(&rds[t]);
    for (int t = 0; t < nth && scratch; t++) kiln_free(scratch[t]);
    kiln_free(rds);
    kiln_free(scratch);
    kiln_pool_free(pool);
    return st;
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

kiln_status kiln_upload_lane(kiln_load_plan *p, kiln_load_item **items, size_t n, kiln_reader *rd,
                             kiln_err *err) {
    (void)p, (void)items, (void)n, (void)rd;
    return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "upload lane: kiln was built without CUDA");
}

#endif
