/*
 * engine.h — the engine's internals (the public API is in include/kiln/kiln.h).
 * Exposed for tests and for the scheduler, which drives kiln_engine_prepare / _run.
 *
 * Memory: everything a kernel touches lives in buffers of the engine's device
 * (kiln_device, runtime/backend.h): register arenas, adapter workspace, kernel
 * scratch, the KV pool, the step's packed inputs and the outputs. The host keeps only
 * bookkeeping: sequences and their block tables (kiln_kv_table), the prepared step's
 * row mapping, and staging copies of inputs and outputs.
 *
 * A step: kiln_engine_prepare validates entries, reserves KV blocks (all or nothing),
 * orders rows decode-first, and writes the packed inputs
 *   ids[t] | tok_seq[t] | tok_pos[t] | seq_len[n_seqs] | table[n_seqs][stride]
 * (int32; stride = the most blocks a sequence of the step holds) into a staging slot,
 * then enqueues one copy to that slot's device buffer. Two slots alternate, so the
 * next step is prepared while the last one's copy may still be in flight.
 * kiln_engine_run picks the mode (decode buffers when the step is small, prefill
 * buffers otherwise), runs the bound plan, copies the outputs to staging (a no-op on
 * host backends) and advances sequence lengths.
 *
 * Not thread-safe: one thread drives an engine (the scheduler's step thread).
 */
#ifndef KILN_RUNTIME_ENGINE_H
#define KILN_RUNTIME_ENGINE_H

#include "runtime/exec.h"
#include "runtime/graph.h"

typedef struct kiln_seq_state {
    bool used;
    kiln_kv_table kv;
} kiln_seq_state;

typedef struct kiln_mode_bufs {
    int64_t tokens; /* rows the buffers hold */
    float **bufs;   /* [n_phys] pointers into arena */
    size_t *bytes;  /* [n_phys] */
    kiln_buf arena;
} kiln_mode_bufs;

/* A slot of packed step inputs (see above). */
typedef struct kiln_step_slot {
    kiln_buf staging, dev;
} kiln_step_slot;

/* The prepared step (between kiln_engine_prepare and kiln_engine_run). */
typedef struct kiln_prepared {
    bool ready;
    int slot;
    int32_t t, n_seqs, n_decode, n_logits, stride;
    bool greedy;
    int32_t greedy_limit;
    /* host arrays (capacity max_step / max_seqs) */
    int32_t *logit_rows; /* [n_logits] row of each entry that wants logits, entry order */
    int32_t *step_seq;   /* [n_seqs] engine sequence id of each block-table row        */
    int32_t *step_count; /* [n_seqs] tokens each adds                                    */
    int32_t *old_blocks; /* [n_seqs] blocks it held before prepare (cancel)              */
} kiln_prepared;

struct kiln_engine {
    const kiln_model *model;
    kiln_device dev;
    kiln_bound_plan bp;
    kiln_mode_bufs mode[2]; /* indexed by kiln_plan_mode */
    kiln_buf work;          /* adapter workspace, work_floats floats */
    size_t work_floats;
    /* kernel scratch (kiln_kctx.scratch): grown to the largest workspace the bound
     * kernels of a step's bucket ask for; scratch_need[b] caches that per bucket
     * (SIZE_MAX: not computed; reset when the circuit breaker rebinds) */
    kiln_buf scratch;
    size_t scratch_need[KILN_BUCKETS];
    kiln_kv_pool kv;
    kiln_pool *pool;
    int32_t max_step, max_seqs;
    kiln_seq_state *seqs;
    kiln_step_slot slot[2];
    int next_slot;
    kiln_prepared prep;
    /* outputs of the last run: DEVICE buffers, and their host view (the same memory on
     * host backends, a STAGING copy otherwise) */
    kiln_buf out_logits, out_ids, out_logits_host, out_ids_host;
    int32_t n_out;
    bool out_greedy;
    bool out_caller; /* the last run wrote into caller memory (no accessor output) */
    /* step scratch (host) */
    int32_t *seq_slot, *row_of_entry;
    uint64_t *counters;
    /* replayable decode-step graphs (runtime/graph.h; device backends with graph hooks,
     * buckets 0-1 only; KILN_GRAPHS=0 turns them off) */
    kiln_graph_cache graphs;
    bool graphs_on;
};

/* The executed load plan of the engine's weights (its report: load/load.h). */
const struct kiln_load_plan *kiln_engine_load_plan(const kiln_engine *e);

/* Runs the prepared step with the outputs written to caller memory instead of the
 * engine's (logits / ids: host memory on host backends; NULL = the engine's own). The
 * public wrappers kiln_engine_step / _greedy use this to skip a copy. */
kiln_status kiln_engine_run_into(kiln_engine *e, float *logits, int32_t *ids, kiln_err *err);

/* ---- for the scheduler's prefix cache (kv.h has the semantics) ----
 * kiln_seq_attach: an empty sequence takes one reference on each of n full blocks (its
 * length becomes n * KILN_KV_BLOCK). kiln_seq_blocks: a sequence's block table
 * (valid until the sequence changes; *n = 0 for an unknown sequence). */
kiln_status kiln_seq_attach(kiln_engine *e, int32_t seq, const int32_t *blocks, int32_t n,
                            kiln_err *err);
void kiln_seq_blocks(const kiln_engine *e, int32_t seq, const int32_t **blocks, int32_t *n);
kiln_status kiln_engine_block_ref(kiln_engine *e, int32_t block, kiln_err *err);
void kiln_engine_block_unref(kiln_engine *e, int32_t block);
int32_t kiln_engine_block_refcount(const kiln_engine *e, int32_t block);

#endif /* KILN_RUNTIME_ENGINE_H */
