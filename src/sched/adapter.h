/*
 * adapter.h — the scheduler's view of an engine: the few calls it makes, as a table of
 * functions, so that (a) the one file that reaches into the runtime (adapter.c) is the
 * only one to change when the runtime contract (issue #18) lands, and (b) the
 * randomized simulation test drives the scheduler with a fake engine.
 *
 * Block refcounts: a KV block is held by every sequence whose table lists it and by the
 * prefix cache (one ref per cache entry). block_ref/unref take and drop the cache's ref;
 * an unref to zero returns the block to the free list.
 *
 * Not thread-safe: called only from the scheduler thread.
 */
#ifndef KILN_SCHED_ADAPTER_H
#define KILN_SCHED_ADAPTER_H

#include "base/status.h"

#include <stdbool.h>
#include <stdint.h>

#define KILN_SCHED_BLOCK 16 /* KV block size in tokens (KILN_KV_BLOCK) */

typedef struct kiln_sched_engine {
    void *impl;
    int32_t n_vocab;      /* logits per row */
    int32_t max_step;     /* largest step */
    int32_t max_seqs;     /* sequences alive at once */
    int32_t total_blocks; /* KV pool capacity in blocks */
    int64_t n_ctx;        /* KV budget in tokens */
    bool batch_invariant; /* the backend's kernels give per-sequence results
                             independent of the batch */
    const char *model_id; /* identity for prefix-cache keys */
    const char *backend;  /* "ref", "cpu", ... ("fake" in tests) */

    kiln_status (*seq_create)(void *impl, int32_t *seq, kiln_err *err);
    void (*seq_free)(void *impl, int32_t seq);
    /* the block table of seq (valid until the next call that changes it) */
    void (*seq_blocks)(void *impl, int32_t seq, const int32_t **blocks, int32_t *n);
    /* an empty seq takes a ref on each of n full blocks; its length becomes n*16 */
    kiln_status (*seq_attach)(void *impl, int32_t seq, const int32_t *blocks, int32_t n,
                              kiln_err *err);
    void (*block_ref)(void *impl, int32_t b);
    void (*block_unref)(void *impl, int32_t b);
    int32_t (*block_refcount)(void *impl, int32_t b);
    int32_t (*blocks_free)(void *impl); /* blocks a step could take now */
    /* one forward pass; logits rows for entries with want_logits (entry order), or,
     * when logits is NULL, greedy ids into ids (lowest id < limit with the max logit) */
    kiln_status (*step)(void *impl, const kiln_batch_entry *en, int32_t n, float *logits,
                        int32_t *ids, int32_t limit, kiln_err *err);
    /* a sampled step (runtime/engine.h, kiln_sample_step): the engine's device samples
     * each row and ids gets the tokens (entry order); NULL when the engine cannot (host
     * backends, tensor parallelism, fakes): the scheduler samples the logits then */
    kiln_status (*step_sampled)(void *impl, const kiln_batch_entry *en, int32_t n,
                                const struct kiln_sample_step *ss, int32_t *ids, int32_t limit,
                                kiln_err *err);
} kiln_sched_engine;

typedef struct kiln_engine kiln_engine;

/* Fills *out for a real engine (borrowed). */
kiln_status kiln_sched_engine_wrap(kiln_engine *e, kiln_sched_engine *out, kiln_err *err);
void kiln_sched_engine_unwrap(kiln_sched_engine *se);

#endif /* KILN_SCHED_ADAPTER_H */
