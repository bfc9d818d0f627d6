/*
 * graph.h — replayable step graphs for device backends (CUDA graphs on cuda).
 *
 * A decode step is hundreds of small kernel launches; on a GPU the host's launch rate,
 * not the kernels, sets the step time. A device backend that implements the graph hooks
 * of kiln_backend records the work of a step once (kiln_exec_run inside a capture) and
 * replays it with one launch when a step with the same key comes again. The key is
 * everything a kernel argument or a copy of the step depends on that can change between
 * steps: the buffers that may move (packed inputs, scratch, outputs), the step's shape
 * (tokens, sequences, table stride, decode rows, logit rows and their positions, greedy
 * limit) and the mode. Weights, registers, workspace and the KV pool do not move while
 * an engine lives. Steps whose kernels may allocate or synchronize inside (cuBLAS: token
 * buckets above 2-8) are never captured: the engine asks only for buckets 0 and 1.
 *
 * Ownership: the cache owns its graphs (freed by kiln_graph_cache_clear through the
 * device's backend). Errors: a step that fails inside a capture returns its status (the
 * capture is ended and dropped; the caller's circuit breaker sees the same failure as
 * without graphs); a capture the device refuses disables the cache for good (logged once)
 * and the step runs directly. Not thread-safe (one per engine).
 */
#ifndef KILN_RUNTIME_GRAPH_H
#define KILN_RUNTIME_GRAPH_H

#include "runtime/exec.h"

#define KILN_GRAPH_SLOTS 8

typedef struct kiln_graph_key {
    const void *in, *scratch, *logits, *ids;
    int64_t t, n_decode;
    int32_t n_seqs, stride, n_logits, greedy_limit, mode, bucket;
    uint64_t rows_hash; /* the logit rows' positions */
} kiln_graph_key;

typedef struct kiln_graph_cache {
    struct {
        kiln_graph_key key;
        void *graph; /* NULL: empty */
        uint64_t used;
    } e[KILN_GRAPH_SLOTS];
    uint64_t tick;
    bool disabled;              /* the device refused a capture: no graphs */
    bool disabled_gemm;         /* refused a step of 9+ tokens: none for those */
    uint64_t captures, replays; /* counts (bench, tests) */
} kiln_graph_cache;

/* The key of a step (every field of x the captured work depends on). */
void kiln_graph_key_of(const kiln_exec *x, int mode, kiln_graph_key *k);
/* Runs the step: replays the graph of its key, else captures kiln_exec_run(bp, x) into a
 * new graph (evicting the least recently used) and launches it; without graph hooks or
 * once disabled, runs kiln_exec_run directly. */
kiln_status kiln_graph_run(kiln_graph_cache *gc, kiln_device *dev, const kiln_graph_key *k,
                           const kiln_bound_plan *bp, kiln_exec *x, kiln_err *err);
void kiln_graph_cache_clear(kiln_graph_cache *gc, kiln_device *dev);

#endif /* KILN_RUNTIME_GRAPH_H */
