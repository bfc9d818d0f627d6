/*
 * tune.h — measuring one kernel on one call-site context (what `kiln tune` records in the
 * PerfDB).
 *
 * kiln_tune_kernel builds inputs of the context's real shape (random activations; the
 * caller's real weights when given, else random weights quantized to the context's
 * dtype), runs the kernel `warmup` times (the first call's time is the warm-up cost),
 * then `reps` timed calls, and reports median, p95 and variance per call. The token
 * count per call is the bucket's representative: 1, 8, 64, 512, 1024 (capped by the
 * context's tokens_max); attention attends to min(context bucket max, 4096) positions.
 * Random weights are quantized to the context's dtype, then put in the layout the kernel
 * asks for (spec.w_layout: R16, T16 or f32 rows), as the loader would.
 *
 * Device kernels (spec.platform other than host, e.g. CUDA) need o->device: the inputs are
 * copied into device allocations, and each timed sample enqueues the kernel
 * KILN_TUNE_DEVICE_BATCH times on the stream and waits once (the time per call is the
 * sample over the batch: a step graph replays kernels back to back, so the launch and the
 * wait are not the kernel's cost); the warm-up is one call and its wait.
 */
#define KILN_TUNE_DEVICE_BATCH 8
#ifndef KILN_KERNELS_TUNE_H
#define KILN_KERNELS_TUNE_H

#include "base/pool.h"
#include "kernels/perfdb.h"
#include "kernels/registry.h"
#include "kernels/select.h"

/* The device memory a non-host kernel runs on (the caller wraps its backend's buffer
 * interface: runtime/backend.h): inputs are built on the host, then copied into device
 * allocations before the kernel is timed. Every function returns a status with err set. */
typedef struct kiln_tune_device {
    void *ctx;    /* the caller's device (passed back to the functions)            */
    void *stream; /* kiln_kctx.stream for the kernels                              */
    void *impl;   /* kiln_kctx.dev for the kernels                                 */
    kiln_status (*alloc)(void *ctx, size_t bytes, void **ptr, kiln_err *err);
    void (*free)(void *ctx, void *ptr);
    kiln_status (*upload)(void *ctx, void *dst, const void *src, size_t bytes, kiln_err *err);
    kiln_status (*sync)(void *ctx, kiln_err *err); /* waits for the stream's work   */
} kiln_tune_device;

typedef struct kiln_tune_opts {
    int warmup;                     /* untimed calls before measuring (>= 1)            */
    int reps;                       /* timed calls (>= 3)                               */
    double max_seconds;             /* stop measuring a kernel after this long (>= reps 3) */
    kiln_pool *pool;                /* threads for the kernels (NULL: inline)           */
    const void *weights;            /* real weights for matmul/embed (NULL: random), in the
                                       kernel's layout and memory (a device pointer for a
                                       device kernel)                                     */
    size_t w_row_bytes;             /* their row stride                                 */
    const kiln_tune_device *device; /* required for kernels of a device platform */
} kiln_tune_opts;

/* Tokens per call used to measure a bucket. */
int64_t kiln_tune_tokens(const kiln_sel_ctx *c);

/* Fills rec (kernel id, op, dtype, buckets, timings). */
kiln_status kiln_tune_kernel(const kiln_reg_kernel *k, const kiln_sel_ctx *c,
                             const kiln_tune_opts *o, kiln_perf_rec *rec, kiln_err *err);

#endif /* KILN_KERNELS_TUNE_H */
