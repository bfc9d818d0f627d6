/*
 * engine.h — the engine's internals (the public API is in include/kiln/kiln.h).
 * Exposed for tests and for the scheduler, which drives kiln_engine_step.
 */
#ifndef KILN_RUNTIME_ENGINE_H
#define KILN_RUNTIME_ENGINE_H

#include "runtime/exec.h"

typedef struct kiln_seq_state {
    bool used;
    kiln_kv_table kv;
} kiln_seq_state;

typedef struct kiln_mode_bufs {
    int64_t tokens; /* rows the buffers hold */
    float **bufs;   /* [n_phys] */
    uint8_t *arena;
    size_t bytes;
} kiln_mode_bufs;

struct kiln_engine {
    const kiln_model *model;
    kiln_bound_plan bp;
    kiln_mode_bufs mode[2]; /* indexed by kiln_plan_mode */
    float *work;
    size_t work_floats;
    /* kernel scratch (kiln_kctx.scratch): grown to the largest workspace the bound
     * kernels of a step's bucket ask for; scratch_need[b] caches that per bucket
     * (SIZE_MAX: not computed; reset when the circuit breaker rebinds) */
    void *scratch;
    size_t scratch_size;
    size_t scratch_need[KILN_BUCKETS];
    kiln_kv_pool kv;
    kiln_pool *pool;
    int32_t max_step, max_seqs;
    kiln_seq_state *seqs;
    /* step scratch */
    int32_t *ids, *tok_seq, *tok_pos, *logit_rows;
    int32_t *step_seq, *step_count, *seq_slot;
    kiln_kv_seq *step_kv;
    uint64_t *counters;
};

/* The executed load plan of the engine's weights (its report: load/load.h). */
const struct kiln_load_plan *kiln_engine_load_plan(const kiln_engine *e);

#endif /* KILN_RUNTIME_ENGINE_H */
