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

#include <inttypes.h>
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

/* Uploads the items placed on `device`. */
static kiln_status upload_device(kiln_load_plan *p, kiln_load_item **items, size_t n, int device,
                                 kiln_reader *rd, kiln_err *err) {
    kiln_status st = KILN_OK;
    void *pin[2] = {NULL, NULL};
    void *scratch = NULL;
    cudaStream_t stream = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    bool used[2] = {false, false};
    size_t stage = 0;
    for (size_t i = 0; i < n; i++) {
        if (items[i]->target.device != device) continue;
        uint64_t c = (uint64_t)kiln_load_chunk_rows(items[i]) * items[i]->out_row_bytes;
        if (c > items[i]->nbytes) c = items[i]->nbytes;
        if (c > stage) stage = (size_t)c;
    }
    if (stage == 0) return KILN_OK;
    CU(cudaSetDevice(device), "cudaSetDevice");
    CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    for (int b = 0; b < 2; b++) {
        CU(cudaHostAlloc(&pin[b], stage, cudaHostAllocPortable), "cudaHostAlloc (pinned staging)");
        CU(cudaEventCreateWithFlags(&ev[b], cudaEventDisableTiming), "cudaEventCreate");
    }
    if (p->max_chunk_src && !(scratch = malloc(p->max_chunk_src))) {
        st = kiln_err_set(err, KILN_ERR_NOMEM, "upload staging");
        goto done;
    }
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        kiln_load_item *it = items[i];
        if (it->target.device != device) continue;
        void *dptr = NULL;
        CU(cudaMalloc(&dptr, it->nbytes ? it->nbytes : 1), it->src->name);
        it->device_ptr = dptr;
        int64_t cr = kiln_load_chunk_rows(it);
        for (int64_t r = 0; r < it->n_rows; r += cr, k++) {
            int64_t r1 = r + cr < it->n_rows ? r + cr : it->n_rows;
            int b = k & 1;
            if (used[b]) CU(cudaEventSynchronize(ev[b]), "cudaEventSynchronize");
            st = kiln_load_produce(p, it, r, r1, pin[b], scratch, rd, err);
            if (st) {
                kiln_err_wrap(err, st, "lane upload: tensor '%s'", it->src->name);
                goto done;
            }
            size_t bytes = (size_t)((uint64_t)(r1 - r) * it->out_row_bytes);
            CU(cudaMemcpyAsync((uint8_t *)dptr + (size_t)r * it->out_row_bytes, pin[b], bytes,
                               cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync");
            CU(cudaEventRecord(ev[b], stream), "cudaEventRecord");
            used[b] = true;
        }
        it->done = true;
    }
    CU(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
done:
    if (stream) cudaStreamSynchronize(stream);
    for (int b = 0; b < 2; b++) {
        if (ev[b]) cudaEventDestroy(ev[b]);
        if (pin[b]) cudaFreeHost(pin[b]);
    }
    if (stream) cudaStreamDestroy(stream);
    free(scratch);
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
