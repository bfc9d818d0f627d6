/*
 * adapter.c — kiln_sched_engine over the engine (include/kiln/kiln.h: capacity queries,
 * kiln_engine_step(_greedy); src/runtime/engine.h). The prefix-cache hooks (attach
 * blocks to a sequence, ref/unref a block, read a block table) are not in the engine
 * API yet (asked of `rt` in
 * notes/sched-to-rt.md); until they are, this file implements them on the engine's
 * KV pool fields with the pool's own rules (refcount, free list). This is the only
 * file of src/sched/ that includes runtime internals.
 */
#include "sched/adapter.h"
#include "base/mem.h"

#include "model/model.h"
#include "runtime/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct wrap {
    kiln_engine *e;
    char model_id[1200];
} wrap;

static kiln_seq_state *seq_of(kiln_engine *e, int32_t seq) {
    if (seq < 0 || seq >= e->max_seqs || !e->seqs[seq].used) return NULL;
    return &e->seqs[seq];
}

static kiln_status a_seq_create(void *impl, int32_t *seq, kiln_err *err) {
    return kiln_seq_create(((wrap *)impl)->e, seq, err);
}
static void a_seq_free(void *impl, int32_t seq) {
    kiln_seq_free(((wrap *)impl)->e, seq);
}
static void a_seq_blocks(void *impl, int32_t seq, const int32_t **blocks, int32_t *n) {
    kiln_seq_state *s = seq_of(((wrap *)impl)->e, seq);
    *blocks = s ? s->kv.blocks : NULL;
    *n = s ? s->kv.n_blocks : 0;
}
static kiln_status a_seq_attach(void *impl, int32_t seq, const int32_t *blocks, int32_t n,
                                kiln_err *err) {
    kiln_engine *e = ((wrap *)impl)->e;
    kiln_seq_state *s = seq_of(e, seq);
    if (!s || s->kv.n_blocks != 0 || s->kv.len != 0)
        return kiln_err_set(err, KILN_ERR_STATE, "attach: sequence %d is not empty", (int)seq);
    if (n <= 0) return KILN_OK;
    if (s->kv.cap < n) {
        int32_t *q = kiln_realloc(s->kv.blocks, (size_t)n * sizeof(int32_t));
        if (!q) return kiln_err_set(err, KILN_ERR_NOMEM, "attach: out of memory");
        s->kv.blocks = q;
        s->kv.cap = n;
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t b = blocks[i];
        if (b < 0 || b >= e->kv.n_grown || e->kv.refcount[b] <= 0)
            return kiln_err_set(err, KILN_ERR_INTERNAL, "attach: block %d is not live", (int)b);
    }
    for (int32_t i = 0; i < n; i++) {
        s->kv.blocks[i] = blocks[i];
        e->kv.refcount[blocks[i]]++;
    }
    s->kv.n_blocks = n;
    s->kv.len = n * KILN_KV_BLOCK;
    return KILN_OK;
}
static void a_block_ref(void *impl, int32_t b) {
    ((wrap *)impl)->e->kv.refcount[b]++;
}
static void a_block_unref(void *impl, int32_t b) {
    kiln_kv_pool *p = &((wrap *)impl)->e->kv;
    if (--p->refcount[b] == 0) p->free_list[p->n_free++] = b;
}
static int32_t a_block_refcount(void *impl, int32_t b) {
    kiln_kv_pool *p = &((wrap *)impl)->e->kv;
    return b >= 0 && b < p->n_grown ? p->refcount[b] : 0;
}
static int32_t a_blocks_free(void *impl) {
    return kiln_engine_kv_blocks_free(((wrap *)impl)->e);
}
static kiln_status a_step(void *impl, const kiln_batch_entry *en, int32_t n, float *logits,
                          int32_t *ids, int32_t limit, kiln_err *err) {
    kiln_engine *e = ((wrap *)impl)->e;
    if (logits || !ids) return kiln_engine_step(e, en, n, logits, err);
    return kiln_engine_step_greedy(e, en, n, limit, ids, err);
}

static kiln_status a_step_sampled(void *impl, const kiln_batch_entry *en, int32_t n,
                                  const kiln_sample_step *ss, int32_t *ids, int32_t limit,
                                  kiln_err *err) {
    kiln_engine *e = ((wrap *)impl)->e;
    if (n <= 0) return KILN_OK;
    kiln_step_opts o = {.n_vocab_limit = limit, .sample = ss};
    KILN_TRY(kiln_engine_prepare(e, en, n, &o, err));
    KILN_TRY(kiln_engine_run(e, err));
    for (int32_t i = 0; i < kiln_engine_n_outputs(e); i++) ids[i] = kiln_engine_token(e, i);
    return KILN_OK;
}

kiln_status kiln_sched_engine_wrap(kiln_engine *e, kiln_sched_engine *out, kiln_err *err) {
    memset(out, 0, sizeof(*out));
    if (!e) return kiln_err_set(err, KILN_ERR_INVALID_ARG, "scheduler: no engine");
    if (kiln_engine_kv_block_size(e) != KILN_SCHED_BLOCK)
        return kiln_err_set(err, KILN_ERR_INTERNAL, "scheduler: KV block size %d, expected %d",
                            KILN_KV_BLOCK, KILN_SCHED_BLOCK);
    wrap *w = kiln_calloc(1, sizeof(*w));
    if (!w) return kiln_err_set(err, KILN_ERR_NOMEM, "scheduler: out of memory");
    w->e = e;
    snprintf(w->model_id, sizeof(w->model_id), "%s|%s|%d|%d", e->model->cfg.arch, e->model->path,
             (int)e->model->cfg.n_vocab, (int)e->model->cfg.n_layer);
    out->impl = w;
    out->n_vocab = e->model->cfg.n_vocab;
    out->max_step = kiln_engine_max_step_tokens(e);
    out->max_seqs = kiln_engine_max_seqs(e);
    out->total_blocks = kiln_engine_kv_blocks_total(e);
    out->n_ctx = (int64_t)(out->total_blocks - out->max_seqs) * KILN_KV_BLOCK;
    out->batch_invariant = true; /* ref and cpu (kiln.h); cuda to say per kernel */
    out->model_id = w->model_id;
    out->backend = e->bp.be && e->bp.be->name ? e->bp.be->name : "?";
    out->seq_create = a_seq_create;
    out->seq_free = a_seq_free;
    out->seq_blocks = a_seq_blocks;
    out->seq_attach = a_seq_attach;
    out->block_ref = a_block_ref;
    out->block_unref = a_block_unref;
    out->block_refcount = a_block_refcount;
    out->blocks_free = a_blocks_free;
    out->step = a_step;
    out->step_sampled = kiln_engine_device_sampling(e) ? a_step_sampled : NULL;
    return KILN_OK;
}

void kiln_sched_engine_unwrap(kiln_sched_engine *se) {
    if (!se) return;
    kiln_free(se->impl);
    memset(se, 0, sizeof(*se));
}
