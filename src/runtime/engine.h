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

#include "plan/tp.h"
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
    kiln_buf sstaging, sdev; /* a sampled step's parameters (kiln_sample_step, packed) */
} kiln_step_slot;

/* A sampled step (kiln_step_opts.sample): every entry that wants logits gets a token id
 * (kiln_engine_token) from the backend's KILN_KOP_SAMPLE kernel (kernels/kernel.h) over
 * its logits row [0, n_vocab_limit), which then stays on the device: rows[i] is the i-th
 * such entry's parameters and draw (entry order); its overrides are
 * [rows[i].ov_off, + rows[i].n_ov) of ov_id / ov_bias / ov_count (n_ov in all). The
 * engine copies all of it at prepare. kiln_sampler_device_row (sample/sample.h) fills a
 * row from a sequence's sampler. */
typedef struct kiln_sample_step {
    const struct kiln_sample_row_params *rows;
    const int32_t *ov_id;
    const float *ov_bias;
    const int32_t *ov_count;
    int32_t n_ov;
} kiln_sample_step;

/* Whether sampled steps run on this engine's device: a device backend (cuda) with a
 * sample kernel, one rank (tensor-parallel engines sample on the host), and
 * KILN_HOST_SAMPLING=1 not in the environment (the A/B switch, read on every call).
 * Callers sample on the host otherwise. */
bool kiln_engine_device_sampling(kiln_engine *e);

/* The prepared step (between kiln_engine_prepare and kiln_engine_run). */
typedef struct kiln_prepared {
    bool ready;
    int slot;
    int32_t t, n_seqs, n_decode, n_logits, stride;
    bool greedy;
    bool sampled; /* kiln_step_opts.sample: packed in slot's sdev */
    int32_t greedy_limit;
    int32_t sample_n_ov;
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
    bool out_greedy; /* token ids (greedy or sampled steps) */
    /* the sample kernel (sampled steps): selected at the first one as call site
     * KILN_SAMPLE_SITE; -1 none (the host samples), 0 not yet (or again after the breaker
     * marked it) */
    int sample_state;
    kiln_sample_fn sample_fn;
    kiln_workspace_fn sample_ws_fn; /* its spec's workspace (NULL: none)         */
    kiln_backend_id sample_backend; /* the backend it was found for              */
    kiln_buf sample_ws;             /* that workspace, grown to the step's rows  */
    float sample_softcap;           /* the LM head's final softcap (set with sample_fn)      */
    bool out_caller;                /* the last run wrote into caller memory (no accessor output) */
    /* step scratch (host) */
    int32_t *seq_slot, *row_of_entry;
    uint64_t *counters;
    /* KILN_OP_PROFILE=1: per tokens bucket, per opcode wall ns and calls ([KILN_BUCKETS][2 *
     * KILN_OP_LIMIT], exec.h), and the engine steps' wall ns and count; printed to stderr
     * when the engine is freed */
    uint64_t *op_prof, prof_step_ns[KILN_BUCKETS], prof_steps[KILN_BUCKETS];
    /* replayable decode-step graphs (runtime/graph.h; device backends with graph hooks:
     * buckets 0-1, and pure-decode steps up to graph_bucket; KILN_GRAPHS=0 turns them off) */
    kiln_graph_cache graphs;
    bool graphs_on;
    int graph_bucket; /* the largest tokens bucket whose pure-decode steps replay graphs */
    /* tensor parallelism (engine_tp.c, docs/TP.md). Every rank is an engine with its own
     * device, bound plan (its shard: plan/tp.h), buffers and KV memory. Rank 0, the
     * leader, is the engine callers see: it owns the group (tp), keeps the sequences and
     * block tables, prepares each step, and runs it on its thread while each follower runs
     * the same step on its own thread; the ranks meet in the plan's collectives. */
    struct kiln_tp_group *tp; /* leader only; NULL: one device */
    int tp_rank, tp_ranks;    /* 0, 1 without tensor parallelism */
    struct kiln_comm *comm;   /* borrowed from the group */
    kiln_tp_layout tp_layout;
    kiln_buf tp_shard, tp_full, tp_tmp; /* logits: this rank's shard, full rows, gather tmp */
    kiln_exec tp_x;                     /* a follower's step (set by the leader)           */
    kiln_status tp_st;
    kiln_err tp_err;
};

/* Ranks of the engine's tensor-parallel group (1 without one), and the executed load plan
 * of rank r's weights (its shard; NULL for a rank out of range). */
int kiln_engine_tp_size(const kiln_engine *e);
const struct kiln_load_plan *kiln_engine_rank_load_plan(const kiln_engine *e, int rank);

/* ---- engine_tp.c (internal) ---- */
/* Creates one rank of an n-rank group (n = 1: a plain engine; comm NULL then). */
kiln_status kiln_engine_create_rank(const kiln_model *m, const kiln_engine_opts *o, int rank,
                                    int n_ranks, struct kiln_comm *comm, kiln_engine **out,
                                    kiln_err *err);
/* The group behind kiln_engine_create when o->tp > 1. */
kiln_status kiln_tp_engine_create(const kiln_model *m, const kiln_engine_opts *o, kiln_engine **out,
                                  kiln_err *err);
void kiln_tp_group_free(kiln_engine *leader);
/* prepare: the packed inputs of slot to every follower's device (non-host backends). */
kiln_status kiln_tp_prepare(kiln_engine *leader, int slot, const int32_t *in, size_t bytes,
                            kiln_err *err);
/* run: x0 is the leader's step (kiln_engine_exec_setup); logits_full receives the full
 * logits rows of the step (leader's memory). Runs every rank, waits for all. */
kiln_status kiln_tp_run(kiln_engine *leader, kiln_exec *x0, float *logits_full, kiln_err *err);
/* Fills x for engine e and the prepared step pp whose packed inputs are at in (e's device
 * memory), with the buffers of mode; grows e's kernel scratch. Outputs are not set. */
kiln_status kiln_engine_exec_setup(kiln_engine *e, const kiln_prepared *pp, const int32_t *in,
                                   int mode, kiln_exec *x, kiln_err *err);
/* Grows the device buffer b of e (space) to at least bytes (contents not kept). */
kiln_status kiln_engine_grow_buf(kiln_engine *e, kiln_buf *b, kiln_mem_space space, size_t bytes,
                                 kiln_err *err);

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
