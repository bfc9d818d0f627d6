/*
 * comm_nccl.c — the NCCL communicator (comm.h): one process, one thread and one CUDA
 * stream per GPU, communicators from ncclCommInitAll. Compiled only when CMake finds
 * CUDA and NCCL (KILN_HAVE_NCCL); comm.c has the stub otherwise.
 *
 * Each call sets the rank's device (a rank's thread may have been created before it
 * chose one) and enqueues the NCCL call on the rank's stream; nothing here
 * synchronizes except barrier. Errors: KILN_ERR_DEVICE with ncclGetErrorString's text
 * (and the asynchronous error when ncclCommGetAsyncError has one).
 */
#include "runtime/comm.h"

#include "base/mem.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <stdlib.h>

typedef struct nccl_comm {
    ncclComm_t comms[KILN_COMM_MAX_RANKS];
    int devices[KILN_COMM_MAX_RANKS];
    float *one[KILN_COMM_MAX_RANKS]; /* a float per device for barrier */
    bool aborted;
} nccl_comm;

bool kiln_comm_nccl_built(void) {
    return true;
}

static kiln_status nccl_fail(kiln_comm *c, int rank, ncclResult_t r, const char *what,
                             kiln_err *err) {
    nccl_comm *n = c->impl;
    ncclResult_t async = ncclSuccess;
    if (rank >= 0 && n->comms[rank]) ncclCommGetAsyncError(n->comms[rank], &async);
    if (async != ncclSuccess && async != ncclInProgress)
        return kiln_err_set(err, KILN_ERR_DEVICE, "NCCL %s on rank %d (cuda:%d): %s (async: %s)",
                            what, rank, rank >= 0 ? n->devices[rank] : -1, ncclGetErrorString(r),
                            ncclGetErrorString(async));
    return kiln_err_set(err, KILN_ERR_DEVICE, "NCCL %s on rank %d (cuda:%d): %s", what, rank,
                        rank >= 0 ? n->devices[rank] : -1, ncclGetErrorString(r));
}

static kiln_status set_device(kiln_comm *c, int rank, const char *what, kiln_err *err) {
    nccl_comm *n = c->impl;
    if (n->aborted)
        return kiln_err_set(err, KILN_ERR_STATE, "NCCL %s: the communicator was aborted", what);
    cudaError_t ce = cudaSetDevice(n->devices[rank]);
    if (ce != cudaSuccess)
        return kiln_err_set(err, KILN_ERR_DEVICE, "NCCL %s: cudaSetDevice(%d): %s", what,
                            n->devices[rank], cudaGetErrorString(ce));
    return KILN_OK;
}

static kiln_status nc_all_reduce(kiln_comm *c, int rank, const float *in, float *out, size_t count,
                                 void *stream, kiln_err *err) {
    nccl_comm *n = c->impl;
    KILN_TRY(set_device(c, rank, "all_reduce", err));
    if (!count) return KILN_OK;
    ncclResult_t r =
        ncclAllReduce(in, out, count, ncclFloat32, ncclSum, n->comms[rank], (cudaStream_t)stream);
    return r == ncclSuccess ? KILN_OK : nccl_fail(c, rank, r, "all_reduce", err);
}

static kiln_status nc_all_gather(kiln_comm *c, int rank, const void *in, void *out, size_t bytes,
                                 void *stream, kiln_err *err) {
    nccl_comm *n = c->impl;
    KILN_TRY(set_device(c, rank, "all_gather", err));
    if (!bytes) return KILN_OK;
    ncclResult_t r = ncclAllGather(in, out, bytes, ncclUint8, n->comms[rank], (cudaStream_t)stream);
    return r == ncclSuccess ? KILN_OK : nccl_fail(c, rank, r, "all_gather", err);
}

static kiln_status nc_broadcast(kiln_comm *c, int rank, int root, void *buf, size_t bytes,
                                void *stream, kiln_err *err) {
    nccl_comm *n = c->impl;
    KILN_TRY(set_device(c, rank, "broadcast", err));
    if (!bytes) return KILN_OK;
    ncclResult_t r =
        ncclBroadcast(buf, buf, bytes, ncclUint8, root, n->comms[rank], (cudaStream_t)stream);
    return r == ncclSuccess ? KILN_OK : nccl_fail(c, rank, r, "broadcast", err);
}

static kiln_status nc_barrier(kiln_comm *c, int rank, void *stream, kiln_err *err) {
    nccl_comm *n = c->impl;
    KILN_TRY(set_device(c, rank, "barrier", err));
    ncclResult_t r = ncclAllReduce(n->one[rank], n->one[rank], 1, ncclFloat32, ncclSum,
                                   n->comms[rank], (cudaStream_t)stream);
    if (r != ncclSuccess) return nccl_fail(c, rank, r, "barrier", err);
    cudaError_t ce = cudaStreamSynchronize((cudaStream_t)stream);
    if (ce != cudaSuccess)
        return kiln_err_set(err, KILN_ERR_DEVICE, "NCCL barrier on rank %d: %s", rank,
                            cudaGetErrorString(ce));
    return KILN_OK;
}

static void nc_abort(kiln_comm *c) {
    nccl_comm *n = c->impl;
    if (n->aborted) return;
    n->aborted = true;
    for (int r = 0; r < c->n_ranks; r++)
        if (n->comms[r]) {
            ncclCommAbort(n->comms[r]);
            n->comms[r] = NULL;
        }
}

static kiln_status nc_reset(kiln_comm *c, kiln_err *err) {
    nccl_comm *n = c->impl;
    if (!n->aborted) return KILN_OK;
    return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                        "NCCL communicator: aborted; create a new one (NCCL cannot reset)");
}

static void nc_free(kiln_comm *c) {
    nccl_comm *n = c->impl;
    if (n) {
        for (int r = 0; r < c->n_ranks; r++) {
            if (n->comms[r]) ncclCommDestroy(n->comms[r]);
            if (n->one[r]) {
                cudaSetDevice(n->devices[r]);
                cudaFree(n->one[r]);
            }
        }
        kiln_free(n);
    }
    kiln_free(c);
}

static const kiln_comm_ops nccl_ops = {
    .kind = "nccl",
    .all_reduce = nc_all_reduce,
    .all_gather = nc_all_gather,
    .broadcast = nc_broadcast,
    .barrier = nc_barrier,
    .abort = nc_abort,
    .reset = nc_reset,
    .free = nc_free,
};

kiln_status kiln_comm_nccl_create(int n_ranks, const int *devices, kiln_comm **out, kiln_err *err) {
    *out = NULL;
    if (n_ranks < 1 || n_ranks > KILN_COMM_MAX_RANKS)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "NCCL communicator: %d ranks (1..%d)",
                            n_ranks, KILN_COMM_MAX_RANKS);
    int have = 0;
    cudaError_t ce = cudaGetDeviceCount(&have);
    if (ce != cudaSuccess)
        return kiln_err_set(err, KILN_ERR_DEVICE, "NCCL communicator: cudaGetDeviceCount: %s",
                            cudaGetErrorString(ce));
    kiln_comm *c = kiln_calloc(1, sizeof(*c));
    nccl_comm *n = kiln_calloc(1, sizeof(*n));
    if (!c || !n) {
        kiln_free(c);
        kiln_free(n);
        return kiln_err_set(err, KILN_ERR_NOMEM, "NCCL communicator");
    }
    c->ops = &nccl_ops;
    c->n_ranks = n_ranks;
    c->impl = n;
    for (int r = 0; r < n_ranks; r++) {
        n->devices[r] = devices ? devices[r] : r;
        if (n->devices[r] < 0 || n->devices[r] >= have) {
            kiln_status st = kiln_err_set(err, KILN_ERR_DEVICE,
                                          "NCCL communicator: rank %d wants cuda:%d, %d device(s) "
                                          "present",
                                          r, n->devices[r], have);
            nc_free(c);
            return st;
        }
    }
    /* NVLink multicast (NVLS) off unless the caller chose: the device machines this was
     * built for require it (docs/TP.md); setenv before the first NCCL call reads it */
    if (!getenv("NCCL_NVLS_ENABLE")) setenv("NCCL_NVLS_ENABLE", "0", 0);
    ncclResult_t r = ncclCommInitAll(n->comms, n_ranks, n->devices);
    if (r != ncclSuccess) {
        kiln_status st = kiln_err_set(err, KILN_ERR_DEVICE, "ncclCommInitAll over %d GPUs: %s",
                                      n_ranks, ncclGetErrorString(r));
        for (int i = 0; i < n_ranks; i++) n->comms[i] = NULL;
        nc_free(c);
        return st;
    }
    for (int i = 0; i < n_ranks; i++) {
        ce = cudaSetDevice(n->devices[i]);
        if (ce == cudaSuccess) ce = cudaMalloc((void **)&n->one[i], sizeof(float));
        if (ce == cudaSuccess) ce = cudaMemset(n->one[i], 0, sizeof(float));
        if (ce != cudaSuccess) {
            kiln_status st = kiln_err_set(err, KILN_ERR_DEVICE,
                                          "NCCL communicator: barrier buffer on cuda:%d: %s",
                                          n->devices[i], cudaGetErrorString(ce));
            nc_free(c);
            return st;
        }
    }
    *out = c;
    return KILN_OK;
}
