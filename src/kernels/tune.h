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
 */
#ifndef KILN_KERNELS_TUNE_H
#define KILN_KERNELS_TUNE_H

#include "base/pool.h"
#include "kernels/perfdb.h"
#include "kernels/registry.h"
#include "kernels/select.h"

typedef struct kiln_tune_opts {
    int warmup;          /* untimed calls before measuring (>= 1)            */
    int reps;            /* timed calls (>= 3)                               */
    double max_seconds;  /* stop measuring a kernel after this long (>= reps 3) */
    kiln_pool *pool;     /* threads for the kernels (NULL: inline)           */
    const void *weights; /* real weights for matmul/embed (NULL: random)     */
    size_t w_row_bytes;  /* their row stride                                 */
} kiln_tune_opts;

/* Tokens per call used to measure a bucket. */
int64_t kiln_tune_tokens(const kiln_sel_ctx *c);

/* Fills rec (kernel id, op, dtype, buckets, timings). */
kiln_status kiln_tune_kernel(const kiln_reg_kernel *k, const kiln_sel_ctx *c,
                             const kiln_tune_opts *o, kiln_perf_rec *rec, kiln_err *err);

#endif /* KILN_KERNELS_TUNE_H */
