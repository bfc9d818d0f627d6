/*
 * backend_cuda.c — the memory half of the CUDA backend: kiln_backend's buffer interface
 * (runtime/backend.h) on the CUDA runtime API. DEVICE memory is cudaMalloc, STAGING is
 * pinned host memory (cudaHostAlloc); the queue is one non-blocking stream per opened
 * device; copies and memsets are enqueued on the queue and complete at sync. Every CUDA
 * error becomes KILN_ERR_DEVICE with the driver's message (never exit/abort); a failed
 * allocation is KILN_ERR_NOMEM naming the bytes and the space.
 *
 * Listed by kiln_backend_find as "cuda" (and chosen by "auto" when a usable device is
 * present). Weights reach device memory through the load plan's upload lane (bind.c asks
 * for placement on this device); activations, workspace, scratch and the KV pool are
 * DEVICE buffers; a step's packed inputs are built in STAGING and copied once. Tested by
 * tests/gpu/test_cuda_backend.c (buffers) and tests/gpu/test_cuda_e2e.c (whole models).
 * Compiled only in CUDA builds (KILN_HAVE_CUDA).
 */
#include "runtime/backend_cuda.h"

#ifdef KILN_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#include "runtime/exec.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

enum { CB_DEVICE = 1, CB_PINNED = 2 };

static kiln_status cu_err(cudaError_t e, const char *what, kiln_err *err) {
    cudaGetLastError(); /* clear a sticky-free error so the next call reports its own */
    return kiln_err_set(err, KILN_ERR_DEVICE, "cuda: %s: %s (%s)", what, cudaGetErrorString(e),
                        cudaGetErrorName(e));
}
#define CU(call, what)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) return cu_err(e_, what, err);                                       \
    } while (0)

static kiln_status cb_open(kiln_device *dev, kiln_err *err) {
    int n = 0;
    CU(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    if (dev->ordinal < 0 || dev->ordinal >= n)
        return kiln_err_set(err, KILN_ERR_DEVICE, "cuda: no device %d (%d present)", dev->ordinal,
                            n);
    struct cudaDeviceProp p;
    CU(cudaGetDeviceProperties(&p, dev->ordinal), "cudaGetDeviceProperties");
    if (p.major < 8)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "cuda:%d %s: compute capability %d.%d, kiln needs 8.0 or newer",
                            dev->ordinal, p.name, p.major, p.minor);
    CU(cudaSetDevice(dev->ordinal), "cudaSetDevice");
    cudaStream_t s = NULL;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    dev->impl = NULL;
    dev->queue = s;
    snprintf(dev->name, sizeof dev->name, "cuda:%d %.100s", dev->ordinal, p.name);
    return KILN_OK;
}

static void cb_close(kiln_device *dev) {
    if (dev->queue) {
        cudaStreamSynchronize((cudaStream_t)dev->queue);
        cudaStreamDestroy((cudaStream_t)dev->queue);
        dev->queue = NULL;
    }
}

static kiln_status cb_alloc(kiln_device *dev, kiln_mem_space space, size_t bytes, kiln_buf *out,
                            kiln_err *err) {
    memset(out, 0, sizeof(*out));
    size_t n = bytes ? bytes : 256;
    cudaError_t e = cudaSetDevice(dev->ordinal);
    if (e != cudaSuccess) return cu_err(e, "cudaSetDevice", err);
    if (space == KILN_MEM_DEVICE) {
        e = cudaMalloc(&out->ptr, n);
        out->flags = CB_DEVICE;
    } else {
        e = cudaHostAlloc(&out->ptr, n, cudaHostAllocPortable);
        out->flags = CB_PINNED;
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        memset(out, 0, sizeof(*out));
        return kiln_err_set(err, KILN_ERR_NOMEM, "cuda:%d: %zu bytes of %s memory: %s",
                            dev->ordinal, n, space == KILN_MEM_DEVICE ? "device" : "pinned host",
                            cudaGetErrorString(e));
    }
    out->size = bytes;
    out->space = space;
    return KILN_OK;
}

static void cb_free(kiln_device *dev, kiln_buf *b) {
    (void)dev;
    if (b->flags == CB_DEVICE) cudaFree(b->ptr);
    if (b->flags == CB_PINNED) cudaFreeHost(b->ptr);
    memset(b, 0, sizeof(*b));
}

static kiln_status cb_h2d(kiln_device *dev, kiln_queue q, const kiln_buf *dst, size_t off,
                          const void *src, size_t bytes, kiln_err *err) {
    (void)dev;
    CU(cudaMemcpyAsync((uint8_t *)dst->ptr + off, src, bytes, cudaMemcpyHostToDevice,
                       (cudaStream_t)q),
       "cudaMemcpyAsync (host to device)");
    return KILN_OK;
}

static kiln_status cb_d2h(kiln_device *dev, kiln_queue q, void *dst, const kiln_buf *src,
                          size_t off, size_t bytes, kiln_err *err) {
    (void)dev;
    CU(cudaMemcpyAsync(dst, (const uint8_t *)src->ptr + off, bytes, cudaMemcpyDeviceToHost,
                       (cudaStream_t)q),
       "cudaMemcpyAsync (device to host)");
    return KILN_OK;
}

static kiln_status cb_d2d(kiln_device *dev, kiln_queue q, const kiln_buf *dst, size_t doff,
                          const kiln_buf *src, size_t soff, size_t bytes, kiln_err *err) {
    (void)dev;
    CU(cudaMemcpyAsync((uint8_t *)dst->ptr + doff, (const uint8_t *)src->ptr + soff, bytes,
                       cudaMemcpyDefault, (cudaStream_t)q),
       "cudaMemcpyAsync (device to device)");
    return KILN_OK;
}

static kiln_status cb_memset(kiln_device *dev, kiln_queue q, const kiln_buf *dst, size_t off,
                             int byte, size_t bytes, kiln_err *err) {
    (void)dev;
    if (dst->space == KILN_MEM_STAGING) {
        /* pinned host memory: ordered after the queue's earlier work */
        CU(cudaStreamSynchronize((cudaStream_t)q), "cudaStreamSynchronize");
        memset((uint8_t *)dst->ptr + off, byte, bytes);
        return KILN_OK;
    }
    CU(cudaMemsetAsync((uint8_t *)dst->ptr + off, byte, bytes, (cudaStream_t)q), "cudaMemsetAsync");
    return KILN_OK;
}

static kiln_status cb_sync(kiln_device *dev, kiln_queue q, kiln_err *err) {
    (void)dev;
    CU(cudaStreamSynchronize((cudaStream_t)q), "cudaStreamSynchronize");
    return KILN_OK;
}

static kiln_status cb_bind_thread(kiln_device *dev, kiln_err *err) {
    CU(cudaSetDevice(dev->ordinal), "cudaSetDevice");
    return KILN_OK;
}

static bool cb_dtype_ok(uint32_t dtype) {
    return kiln_cuda_weight_dtype_ok(dtype) != 0;
}

/* step graphs (runtime/graph.h): stream capture, thread-local (other threads' CUDA calls
 * are not affected) */
static kiln_status cb_graph_begin(kiln_device *dev, kiln_queue q, kiln_err *err) {
    (void)dev;
    CU(cudaStreamBeginCapture((cudaStream_t)q, cudaStreamCaptureModeThreadLocal),
       "cudaStreamBeginCapture");
    return KILN_OK;
}

static kiln_status cb_graph_end(kiln_device *dev, kiln_queue q, void **graph, kiln_err *err) {
    (void)dev;
    *graph = NULL;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture((cudaStream_t)q, &g);
    if (e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        return cu_err(e, "cudaStreamEndCapture", err);
    }
    cudaGraphExec_t ge = NULL;
    e = cudaGraphInstantiate(&ge, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) return cu_err(e, "cudaGraphInstantiate", err);
    *graph = ge;
    return KILN_OK;
}

static kiln_status cb_graph_launch(kiln_device *dev, kiln_queue q, void *graph, kiln_err *err) {
    (void)dev;
    CU(cudaGraphLaunch((cudaGraphExec_t)graph, (cudaStream_t)q), "cudaGraphLaunch");
    return KILN_OK;
}

static void cb_graph_free(kiln_device *dev, void *graph) {
    (void)dev;
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

/* the first usable device's compute capability x10, probed once */
static int32_t cb_sm;
static pthread_once_t cb_sm_once = PTHREAD_ONCE_INIT;
static void cb_probe_sm(void) {
    int sm = 0;
    if (kiln_cuda_probe(&sm, NULL, 0) > 0) cb_sm = sm;
}
static int32_t cb_compute_level(void) {
    pthread_once(&cb_sm_once, cb_probe_sm);
    return cb_sm;
}

const kiln_backend kiln_backend_cuda = {.name = "cuda",
                                        .adapters = kiln_adapters,
                                        .weight_dtype_ok = cb_dtype_ok,
                                        .host_memory = false,
                                        .open = cb_open,
                                        .close = cb_close,
                                        .alloc = cb_alloc,
                                        .free = cb_free,
                                        .h2d = cb_h2d,
                                        .d2h = cb_d2h,
                                        .d2d = cb_d2d,
                                        .memset = cb_memset,
                                        .sync = cb_sync,
                                        .bind_thread = cb_bind_thread,
                                        .compute_level = cb_compute_level,
                                        .graph_begin = cb_graph_begin,
                                        .graph_end = cb_graph_end,
                                        .graph_launch = cb_graph_launch,
                                        .graph_free = cb_graph_free};

#endif /* KILN_HAVE_CUDA */
