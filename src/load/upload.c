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

#include "base/mem.h"
#include "base/pool.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

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
 * the PCIe side run at the same time, and the host side is not one memcpy thread. */
#define UP_NBUF  4
#define UP_STAGE ((size_t)32 << 20)

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
    up_fill f = {.p = p, .mu = PTHREAD_MUTEX_INITIALIZER};

    /* staging size: the largest slab (whole granules, at most UP_STAGE, at least one) */
    size_t stage = 0;
    for (size_t i = 0; i < n; i++) {
        kiln_load_item *it = items[i];
        if (it->target.device != device || it->n_rows == 0) continue;
        int64_t g = kiln_load_chunk_rows(it);
        uint64_t gb = (uint64_t)g * it->out_row_bytes;
        uint64_t slab = gb >= UP_STAGE ? gb : (UP_STAGE / gb) * gb;
        uint64_t all = (uint64_t)it->n_rows * it->out_row_bytes;
        if (slab > all) slab = all;
        if (slab > stage) stage = (size_t)slab;
    }
    if (stage == 0) return KILN_OK;

    CU(cudaSetDevice(device), "cudaSetDevice");
    CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    for (int b = 0; b < UP_NBUF; b++) {
        CU(cudaHostAlloc(&pin[b], stage, cudaHostAllocPortable), "cudaHostAlloc (pinned staging)");
        CU(cudaEventCreateWithFlags(&ev[b], cudaEventDisableTiming), "cudaEventCreate");
    }
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

    int k = 0;
    for (size_t i = 0; i < n; i++) {
        kiln_load_item *it = items[i];
        if (it->target.device != device) continue;
        int64_t g = kiln_load_chunk_rows(it);
        int64_t per = (int64_t)(stage / it->out_row_bytes) / g * g;
        if (per < g) per = g;
        for (int64_t r = 0; r < it->n_rows; r += per, k++) {
            int64_t r1 = r + per < it->n_rows ? r + per : it->n_rows;
            int b = k % UP_NBUF;
            if (used[b]) CU(cudaEventSynchronize(ev[b]), "cudaEventSynchronize");
            f.it = it;
            f.r0 = r;
            f.r1 = r1;
            f.granule = g;
            f.dst = pin[b];
            kiln_pool_for(pool, (r1 - r + g - 1) / g, 1, fill_range, &f);
            if (f.st) {
                st = f.st;
                if (err) *err = f.err;
                kiln_err_wrap(err, st, "lane upload: tensor '%s'", it->src->name);
                goto done;
            }
            size_t bytes = (size_t)((uint64_t)(r1 - r) * it->out_row_bytes);
            CU(cudaMemcpyAsync((uint8_t *)it->device_ptr + (size_t)r * it->out_row_bytes, pin[b],
                               bytes, cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync");
            CU(cudaEventRecord(ev[b], stream), "cudaEventRecord");
            used[b] = true;
        }
        it->done = true;
    }
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

void kiln_upload_free(void *device_ptr) {
    (void)device_ptr;
}

kiln_status kiln_upload_lane(kiln_load_plan *p, kiln_load_item **items, size_t n, kiln_reader *rd,
                             kiln_err *err) {
    (void)p, (void)items, (void)n, (void)rd;
    return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "upload lane: kiln was built without CUDA");
}

#endif
