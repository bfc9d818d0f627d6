/*
 * backend_host.c — the host backends (ref, cpu), the list of backends (kiln_backend_find,
 * with cuda in CUDA builds) and the checked buffer interface (backend.h).
 *
 * Host memory: DEVICE and STAGING are both host memory. Allocations of 1 MiB and more
 * are anonymous mmaps (MAP_NORESERVE: pages are committed on first touch, so a KV pool
 * or register arena sized for the worst case costs only what is used); smaller ones are
 * 64-byte aligned heap blocks. Copies are memcpy, queues do not exist (everything runs
 * synchronously on the calling thread and its pool).
 */
#include "runtime/backend.h"
#include "runtime/exec.h"
#include "runtime/kselect.h"

#include "base/cpu.h"
#include "base/mem.h"
#include "kernels/ref/ref.h"

#ifdef KILN_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#include "runtime/backend_cuda.h"
#endif

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define HOST_MMAP_MIN ((size_t)1 << 20)
enum { HOST_HEAP = 1, HOST_MMAP = 2 };

static kiln_status host_open(kiln_device *dev, kiln_err *err) {
    (void)err;
    dev->impl = NULL;
    dev->queue = NULL;
    snprintf(dev->name, sizeof dev->name, "%s: host", dev->be->name);
    return KILN_OK;
}

static void host_close(kiln_device *dev) {
    (void)dev;
}

static kiln_status host_alloc(kiln_device *dev, kiln_mem_space space, size_t bytes, kiln_buf *out,
                              kiln_err *err) {
    (void)dev;
    memset(out, 0, sizeof(*out));
    size_t n = bytes ? bytes : KILN_ALIGN;
    if (n >= HOST_MMAP_MIN) {
        void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (p == MAP_FAILED)
            return kiln_err_errno(err, errno, "host memory: reserving %zu bytes", n);
        out->ptr = p;
        out->flags = HOST_MMAP;
    } else {
        out->ptr = kiln_alloc_aligned(n);
        if (!out->ptr)
            return kiln_err_set(err, KILN_ERR_NOMEM, "host memory: %zu bytes: out of memory", n);
        out->flags = HOST_HEAP;
    }
    out->size = bytes;
    out->space = space;
    return KILN_OK;
}

static void host_free(kiln_device *dev, kiln_buf *b) {
    (void)dev;
    if (b->flags == HOST_MMAP)
        munmap(b->ptr, b->size ? b->size : KILN_ALIGN);
    else if (b->flags == HOST_HEAP)
        kiln_free_aligned(b->ptr);
    memset(b, 0, sizeof(*b));
}

static kiln_status host_h2d(kiln_device *dev, kiln_queue q, const kiln_buf *dst, size_t off,
                            const void *src, size_t bytes, kiln_err *err) {
    (void)dev, (void)q, (void)err;
    memcpy((uint8_t *)dst->ptr + off, src, bytes);
    return KILN_OK;
}

static kiln_status host_d2h(kiln_device *dev, kiln_queue q, void *dst, const kiln_buf *src,
                            size_t off, size_t bytes, kiln_err *err) {
    (void)dev, (void)q, (void)err;
    memcpy(dst, (const uint8_t *)src->ptr + off, bytes);
    return KILN_OK;
}

static kiln_status host_d2d(kiln_device *dev, kiln_queue q, const kiln_buf *dst, size_t doff,
                            const kiln_buf *src, size_t soff, size_t bytes, kiln_err *err) {
    (void)dev, (void)q, (void)err;
    memmove((uint8_t *)dst->ptr + doff, (const uint8_t *)src->ptr + soff, bytes);
    return KILN_OK;
}

static kiln_status host_memset(kiln_device *dev, kiln_queue q, const kiln_buf *dst, size_t off,
                               int byte, size_t bytes, kiln_err *err) {
    (void)dev, (void)q, (void)err;
    memset((uint8_t *)dst->ptr + off, byte, bytes);
    return KILN_OK;
}

static kiln_status host_sync(kiln_device *dev, kiln_queue q, kiln_err *err) {
    (void)dev, (void)q, (void)err;
    return KILN_OK;
}

#define HOST_MEMORY                                                                                \
    .host_memory = true, .open = host_open, .close = host_close, .alloc = host_alloc,              \
    .free = host_free, .h2d = host_h2d, .d2h = host_d2h, .d2d = host_d2d, .memset = host_memset,   \
    .sync = host_sync

const kiln_backend kiln_backend_ref = {.name = "ref",
                                       .adapters = kiln_adapters,
                                       .weight_dtype_ok = kiln_ref_weight_dtype_ok,
                                       HOST_MEMORY};
/* cpu: the same memory; kernels chosen by the selection engine (runtime/kselect.h): SIMD
 * kernels where valid, ref as the fallback */
const kiln_backend kiln_backend_cpu = {.name = "cpu",
                                       .adapters = kiln_adapters,
                                       .weight_dtype_ok = kiln_ref_weight_dtype_ok,
                                       HOST_MEMORY};

static const kiln_backend *const all_backends[] = {&kiln_backend_ref, &kiln_backend_cpu,
#ifdef KILN_HAVE_CUDA
                                                   &kiln_backend_cuda
#endif
};

/* "auto": probed once per process (initializing CUDA takes a while) */
static const char *auto_name = "cpu";
static pthread_once_t auto_once = PTHREAD_ONCE_INIT;
static void probe_auto(void) {
#ifdef KILN_HAVE_CUDA
    if (kiln_cuda_probe(NULL, NULL, 0) > 0) auto_name = "cuda";
#endif
}

const char *kiln_backend_auto_name(void) {
    pthread_once(&auto_once, probe_auto);
    return auto_name;
}

const char *kiln_backend_names(void) {
#ifdef KILN_HAVE_CUDA
    return "ref, cpu, cuda, auto";
#else
    return "ref, cpu, auto";
#endif
}

const kiln_backend *kiln_backend_find(const char *name) {
    if (name && strcmp(name, "auto") == 0) name = kiln_backend_auto_name();
    for (size_t i = 0; i < sizeof(all_backends) / sizeof(all_backends[0]); i++)
        if (name && strcmp(all_backends[i]->name, name) == 0) return all_backends[i];
    return NULL;
}

/* ---- the checked interface ---- */

static kiln_status range_ok(const kiln_buf *b, size_t off, size_t bytes, const char *what,
                            kiln_err *err) {
    if (!b || !b->ptr || off > b->size || bytes > b->size - off)
        return kiln_err_set(err, KILN_ERR_RANGE, "%s: %zu bytes at offset %zu of a %zu-byte buffer",
                            what, bytes, off, b ? b->size : 0);
    return KILN_OK;
}

kiln_status kiln_device_open(const kiln_backend *be, int32_t ordinal, kiln_device *dev,
                             kiln_err *err) {
    memset(dev, 0, sizeof(*dev));
    dev->be = be;
    dev->ordinal = ordinal;
    KILN_TRY(be->open(dev, err));
    kiln_status st = kiln_kselect_new(&dev->ks, dev, err);
    if (st) {
        be->close(dev);
        memset(dev, 0, sizeof(*dev));
    }
    return st;
}

void kiln_device_close(kiln_device *dev) {
    if (!dev || !dev->be) return;
    kiln_kselect_free(dev->ks);
    dev->be->close(dev);
    memset(dev, 0, sizeof(*dev));
}

kiln_status kiln_buf_alloc(kiln_device *dev, kiln_mem_space space, size_t bytes, kiln_buf *out,
                           kiln_err *err) {
    if ((unsigned)space >= KILN_MEM_SPACES)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "memory space %d", (int)space);
    return dev->be->alloc(dev, space, bytes, out, err);
}

void kiln_buf_free(kiln_device *dev, kiln_buf *b) {
    if (!b || !b->ptr) return;
    dev->be->free(dev, b);
}

kiln_status kiln_buf_h2d(kiln_device *dev, const kiln_buf *dst, size_t dst_off, const void *src,
                         size_t bytes, kiln_err *err) {
    if (!bytes) return KILN_OK;
    KILN_TRY(range_ok(dst, dst_off, bytes, "copy to device", err));
    return dev->be->h2d(dev, dev->queue, dst, dst_off, src, bytes, err);
}

kiln_status kiln_buf_d2h(kiln_device *dev, void *dst, const kiln_buf *src, size_t src_off,
                         size_t bytes, kiln_err *err) {
    if (!bytes) return KILN_OK;
    KILN_TRY(range_ok(src, src_off, bytes, "copy to host", err));
    return dev->be->d2h(dev, dev->queue, dst, src, src_off, bytes, err);
}

kiln_status kiln_buf_d2d(kiln_device *dev, const kiln_buf *dst, size_t dst_off, const kiln_buf *src,
                         size_t src_off, size_t bytes, kiln_err *err) {
    if (!bytes) return KILN_OK;
    KILN_TRY(range_ok(dst, dst_off, bytes, "device copy (destination)", err));
    KILN_TRY(range_ok(src, src_off, bytes, "device copy (source)", err));
    return dev->be->d2d(dev, dev->queue, dst, dst_off, src, src_off, bytes, err);
}

kiln_status kiln_buf_memset(kiln_device *dev, const kiln_buf *dst, size_t off, int byte,
                            size_t bytes, kiln_err *err) {
    if (!bytes) return KILN_OK;
    KILN_TRY(range_ok(dst, off, bytes, "device memset", err));
    return dev->be->memset(dev, dev->queue, dst, off, byte, bytes, err);
}

kiln_status kiln_device_sync(kiln_device *dev, kiln_err *err) {
    return dev->be->sync(dev, dev->queue, err);
}

kiln_status kiln_device_bind_thread(kiln_device *dev, kiln_err *err) {
    return dev->be->bind_thread ? dev->be->bind_thread(dev, err) : KILN_OK;
}
