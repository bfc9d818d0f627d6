/*
 * graph.c — replayable step graphs (graph.h).
 */
#include "runtime/graph.h"

#include "base/log.h"

#include <string.h>

void kiln_graph_key_of(const kiln_exec *x, int mode, kiln_graph_key *k) {
    memset(k, 0, sizeof(*k)); /* padding too: keys are compared with memcmp */
    k->in = x->ids;
    k->scratch = x->kctx.scratch;
    k->logits = x->logits;
    k->ids = x->greedy_ids;
    k->t = x->t;
    k->n_decode = x->n_decode;
    k->n_seqs = x->blocks.n_seqs;
    k->stride = x->blocks.stride;
    k->n_logits = x->n_logits;
    k->greedy_limit = x->greedy_limit;
    k->mode = mode;
    k->bucket = x->bucket;
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the logit rows */
    for (int32_t i = 0; i < x->n_logits; i++) {
        h ^= (uint64_t)(uint32_t)x->logit_rows[i];
        h *= 1099511628211ull;
    }
    k->rows_hash = h;
}

void kiln_graph_cache_clear(kiln_graph_cache *gc, kiln_device *dev) {
    for (int i = 0; i < KILN_GRAPH_SLOTS; i++) {
        if (gc->e[i].graph && dev && dev->be->graph_free) dev->be->graph_free(dev, gc->e[i].graph);
        gc->e[i].graph = NULL;
    }
}

kiln_status kiln_graph_run(kiln_graph_cache *gc, kiln_device *dev, const kiln_graph_key *k,
                           const kiln_bound_plan *bp, kiln_exec *x, kiln_err *err) {
    const kiln_backend *be = dev->be;
    /* a replayed graph that fails cannot say which of its kernels failed: no instruction
     * is blamed (the circuit breaker must not mark the step's first kernel) */
    x->failed_insn = -1;
    if (gc->disabled || (k->bucket >= 2 && gc->disabled_gemm) || !be->graph_begin ||
        !be->graph_end || !be->graph_launch)
        return kiln_exec_run(bp, x, err);
    gc->tick++;
    for (int i = 0; i < KILN_GRAPH_SLOTS; i++)
        if (gc->e[i].graph && memcmp(&gc->e[i].key, k, sizeof(*k)) == 0) {
            gc->e[i].used = gc->tick;
            gc->replays++;
            return be->graph_launch(dev, dev->queue, gc->e[i].graph, err);
        }
    kiln_err e2;
    if (be->graph_begin(dev, dev->queue, &e2)) {
        KILN_WARN("step graphs off: %s", e2.msg);
        gc->disabled = true;
        return kiln_exec_run(bp, x, err);
    }
    kiln_status st = kiln_exec_run(bp, x, err);
    void *g = NULL;
    kiln_status st2 = be->graph_end(dev, dev->queue, &g, &e2);
    if (st2 || !g) {
        /* the device refused the capture (a call inside it that cannot be captured: the
         * step may have failed because of that): nothing ran, run it without graphs */
        /* a step of 9+ tokens (GEMM kernels, maybe a library's) turns off only those
         * steps' graphs */
        KILN_WARN("step graphs off%s: %s", k->bucket >= 2 ? " for steps of 9+ tokens" : "",
                  st2 ? e2.msg : "no graph");
        if (k->bucket >= 2)
            gc->disabled_gemm = true;
        else
            gc->disabled = true;
        return kiln_exec_run(bp, x, err);
    }
    if (st) { /* the step's own failure (captured work is not executed: nothing ran) */
        be->graph_free(dev, g);
        return st;
    }
    int slot = 0;
    for (int i = 0; i < KILN_GRAPH_SLOTS; i++) {
        if (!gc->e[i].graph) {
            slot = i;
            break;
        }
        if (gc->e[i].used < gc->e[slot].used) slot = i;
    }
    if (gc->e[slot].graph) be->graph_free(dev, gc->e[slot].graph);
    gc->e[slot].key = *k;
    gc->e[slot].graph = g;
    gc->e[slot].used = gc->tick;
    gc->captures++;
    return be->graph_launch(dev, dev->queue, g, err);
}
