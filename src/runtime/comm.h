/*
 * comm.h — collectives over the ranks of one tensor-parallel group (issue 15, docs/TP.md).
 *
 * A communicator joins n ranks. Every rank calls each collective in the same order with
 * the same sizes (SPMD); a collective returns on a rank once that rank's part is done:
 *   all_reduce_sum_f32  out[i] = sum over ranks r = 0..n-1 of in_r[i] (count floats);
 *                       in and out may be the same buffer;
 *   all_gather          out = in_0 | in_1 | ... | in_{n-1} (bytes each, rank order);
 *                       in may be out + rank * bytes (in place), no other overlap;
 *   broadcast           buf of every rank = buf of root;
 *   barrier             every rank has reached it.
 * Buffers are in the rank's device memory (host memory for the host communicator; the
 * rank's CUDA device for NCCL), and the collective is ordered on `stream` (the rank's
 * device queue, kiln_device.queue; ignored by the host communicator, which is
 * synchronous).
 *
 * Two implementations:
 *   host  in-process, for the host backends (ref, cpu): each rank is driven by its own
 *         thread; a collective is a barrier-based exchange through shared memory. Sums
 *         are taken in rank order 0..n-1 for every element, so every rank gets bitwise
 *         the same result and the result does not depend on thread timing.
 *   nccl  one process, one thread and one CUDA stream per GPU (ncclCommInitAll over
 *         devices 0..n-1); built only when CMake finds CUDA and NCCL (KILN_HAVE_NCCL).
 *         NCCL_NVLS_ENABLE=0 (NVLink multicast off) is set in the process environment
 *         before init unless the caller set it. NCCL errors become KILN_ERR_DEVICE with
 *         ncclGetErrorString's text.
 *
 * Failure: a rank that fails before a collective must call kiln_comm_abort, or the other
 * ranks wait for it forever. On the host communicator abort wakes every waiting rank and
 * makes every collective fail with KILN_ERR_STATE until kiln_comm_reset (called by one
 * thread when no rank is inside a collective). NCCL: abort calls ncclCommAbort; the
 * communicator cannot be reset (a new one must be created).
 *
 * Ownership: kiln_comm_free releases everything (NULL-safe); nothing else owns memory
 * the caller passes. Thread-safety: each rank index is used by one thread at a time.
 */
#ifndef KILN_RUNTIME_COMM_H
#define KILN_RUNTIME_COMM_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>

#define KILN_COMM_MAX_RANKS 64

typedef struct kiln_comm kiln_comm;

/* The in-process host communicator of n ranks (1..KILN_COMM_MAX_RANKS). */
kiln_status kiln_comm_host_create(int n_ranks, kiln_comm **out, kiln_err *err);

/* NCCL over CUDA devices[0..n) (NULL: devices 0..n-1). KILN_ERR_UNSUPPORTED when this kiln
 * was built without NCCL; KILN_ERR_DEVICE when fewer devices exist or NCCL fails. */
kiln_status kiln_comm_nccl_create(int n_ranks, const int *devices, kiln_comm **out, kiln_err *err);
/* True when this kiln was built with NCCL. */
bool kiln_comm_nccl_built(void);

void kiln_comm_free(kiln_comm *c);
int kiln_comm_size(const kiln_comm *c);
const char *kiln_comm_kind(const kiln_comm *c); /* "host" or "nccl" */

kiln_status kiln_comm_all_reduce_sum_f32(kiln_comm *c, int rank, const float *in, float *out,
                                         size_t count, void *stream, kiln_err *err);
kiln_status kiln_comm_all_gather(kiln_comm *c, int rank, const void *in, void *out, size_t bytes,
                                 void *stream, kiln_err *err);
kiln_status kiln_comm_broadcast(kiln_comm *c, int rank, int root, void *buf, size_t bytes,
                                void *stream, kiln_err *err);
kiln_status kiln_comm_barrier(kiln_comm *c, int rank, void *stream, kiln_err *err);

/* See "Failure" above. */
void kiln_comm_abort(kiln_comm *c);
kiln_status kiln_comm_reset(kiln_comm *c, kiln_err *err);

/* ---- for implementations (comm.c, comm_nccl.c) ---- */
typedef struct kiln_comm_ops {
    const char *kind;
    kiln_status (*all_reduce)(kiln_comm *c, int rank, const float *in, float *out, size_t count,
                              void *stream, kiln_err *err);
    kiln_status (*all_gather)(kiln_comm *c, int rank, const void *in, void *out, size_t bytes,
                              void *stream, kiln_err *err);
    kiln_status (*broadcast)(kiln_comm *c, int rank, int root, void *buf, size_t bytes,
                             void *stream, kiln_err *err);
    kiln_status (*barrier)(kiln_comm *c, int rank, void *stream, kiln_err *err);
    void (*abort)(kiln_comm *c);
    kiln_status (*reset)(kiln_comm *c, kiln_err *err);
    void (*free)(kiln_comm *c);
} kiln_comm_ops;

struct kiln_comm {
    const kiln_comm_ops *ops;
    int n_ranks;
    void *impl;
};

#endif /* KILN_RUNTIME_COMM_H */
