/*
 * engine.c — the engine API of kiln.h: sequences, KV blocks, capacity queries, and one
 * forward pass over a batch of (seq, token, pos, want_logits) entries from many
 * sequences, in two parts (prepare, run; engine.h describes both).
 */
#include "runtime/engine.h"
#include "runtime/kselect.h"

#include "base/log.h"
#include "base/timer.h"
#include "base/mapguard.h"
#include "base/mem.h"
#include "format/dtype.h"
#include "kernels/registry.h"
#include "load/load.h"
#include "runtime/comm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void kiln_engine_opts_default(kiln_engine_opts *o) {
    memset(o, 0, sizeof(*o));
    o->backend = "ref";
}

static kiln_status alloc_mode(kiln_engine *e, int mode, int64_t tokens, kiln_err *err) {
    const kiln_plan *p = &e->bp.plan;
    kiln_mode_bufs *mb = &e->mode[mode];
    size_t np = (size_t)(p->n_phys > 0 ? p->n_phys : 1);
    mb->tokens = tokens;
    mb->bufs = kiln_calloc(np, sizeof(float *));
    mb->bytes = kiln_calloc(np, sizeof(size_t));
    if (!mb->bufs || !mb->bytes) return kiln_err_set(err, KILN_ERR_NOMEM, "engine: out of memory");
    size_t total;
    KILN_TRY(kiln_plan_buffer_bytes(p, tokens, tokens, mb->bytes, &total, err));
    KILN_TRY(kiln_buf_alloc(&e->dev, KILN_MEM_DEVICE, total, &mb->arena, err));
    size_t off = 0;
    for (int32_t b = 0; b < p->n_phys; b++) {
        mb->bufs[b] = (float *)(void *)((uint8_t *)mb->arena.ptr + off);
        off += mb->bytes[b];
    }
    return KILN_OK;
}

static kiln_status create_kv(kiln_engine *e, int64_t n_ctx, uint32_t dtype, kiln_err *err) {
    const kiln_plan *p = &e->bp.plan;
    int32_t nl = 0;
    for (int32_t i = 0; i < p->n_states; i++)
        if (p->states[i].layer + 1 > nl) nl = p->states[i].layer + 1;
    if (nl == 0) return KILN_OK;
    int32_t *nkv = kiln_calloc((size_t)nl, sizeof(int32_t));
    int32_t *hd = kiln_calloc((size_t)nl, sizeof(int32_t));
    kiln_status st = KILN_OK;
    if (!nkv || !hd) st = kiln_err_set(err, KILN_ERR_NOMEM, "engine: out of memory");
    for (int32_t i = 0; !st && i < p->n_states; i++) {
        nkv[p->states[i].layer] = p->states[i].n_kv_head;
        hd[p->states[i].layer] = p->states[i].head_dim;
    }
    int64_t blocks = (n_ctx + KILN_KV_BLOCK - 1) / KILN_KV_BLOCK + e->max_seqs;
    if (!st && blocks > INT32_MAX)
        st = kiln_err_set(err, KILN_ERR_RANGE, "engine: context %lld too large", (long long)n_ctx);
    if (!st) st = kiln_kv_pool_init(&e->kv, &e->dev, nl, nkv, hd, dtype, (int32_t)blocks, err);
    kiln_free(nkv);
    kiln_free(hd);
    return st;
}

kiln_status kiln_engine_create(const kiln_model *m, const kiln_engine_opts *o, kiln_engine **out,
                               kiln_err *err) {
    kiln_engine_opts d;
    if (!o) {
        kiln_engine_opts_default(&d);
        o = &d;
    }
    if (o->tp < 0 || o->tp > KILN_COMM_MAX_RANKS)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "tensor parallel: %d ranks (1..%d)",
                            (int)o->tp, KILN_COMM_MAX_RANKS);
    if (o->tp > 1) return kiln_tp_engine_create(m, o, out, err);
    return kiln_engine_create_rank(m, o, 0, 1, NULL, out, err);
}

kiln_status kiln_engine_create_rank(const kiln_model *m, const kiln_engine_opts *o, int rank,
                                    int n_ranks, kiln_comm *comm, kiln_engine **out,
                                    kiln_err *err) {
    const kiln_backend *be = kiln_backend_find(o->backend ? o->backend : "ref");
    if (!be)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "backend '%s' is not built in (%s)",
                            o->backend, kiln_backend_names());
    if (!m->family)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "%s: no model family for architecture '%s'",
                            m->path, m->cfg.arch);
    bool ggml_numerics = o->numerics && strcmp(o->numerics, "ggml") == 0;
    if (o->numerics && !ggml_numerics && strcmp(o->numerics, "exact") != 0)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "numerics '%s' is not 'exact' or 'ggml'",
                            o->numerics);
    kiln_engine *e = kiln_calloc(1, sizeof(*e));
    if (!e) return kiln_err_set(err, KILN_ERR_NOMEM, "engine: out of memory");
    e->model = m;
    e->tp_rank = rank;
    e->tp_ranks = n_ranks;
    e->comm = comm;
    e->max_step = o->max_step_tokens > 0 ? o->max_step_tokens : KILN_DEFAULT_STEP_TOKENS;
    e->max_seqs = o->max_seqs > 0 ? o->max_seqs : 64;
    {
        const char *g = getenv("KILN_GRAPHS"); /* step graphs: on unless "0" (A/B runs) */
        /* dispatch counters are host-side: a replayed graph would not count */
        const char *prof = getenv("KILN_OP_PROFILE");
        const bool profile = prof && prof[0] && strcmp(prof, "0") != 0;
        e->graphs_on = !(g && strcmp(g, "0") == 0) && !o->counters && n_ranks == 1 && !profile;
        if (profile) {
            e->op_prof = kiln_calloc((size_t)KILN_BUCKETS * 2 * KILN_OP_LIMIT, sizeof(uint64_t));
            if (!e->op_prof) {
                kiln_free(e);
                return kiln_err_set(err, KILN_ERR_NOMEM, "engine: out of memory");
            }
        }
        /* graphs for pure-decode steps of up to this bucket (KILN_GRAPH_BUCKET, default 2:
         * up to 64 tokens; 1: 1-8, session 18's rule; steps above 64 tokens may call
         * cuBLAS and are never graphed) */
        const char *gb = getenv("KILN_GRAPH_BUCKET");
        e->graph_bucket = gb && gb[0] == '1' && !gb[1] ? 1 : 2;
    }
    for (int b = 0; b < KILN_BUCKETS; b++) e->scratch_need[b] = SIZE_MAX;
    int64_t n_ctx = o->n_ctx > 0 ? o->n_ctx : 4096;
    const uint32_t kv_dtype = o->kv_f16 ? KILN_DTYPE_F16 : KILN_DTYPE_F32;
    /* a host backend's ranks share the host; a device backend's rank r is device r */
    kiln_status st = kiln_device_open(be, be->host_memory ? 0 : rank, &e->dev, err);
    if (st) {
        kiln_free(e);
        return st;
    }
    kiln_plan plan;
    kiln_plan_init(&plan);
    st = m->family->compile(&m->cfg, KILN_MODE_PREFILL, &plan, err);
    if (st) {
        kiln_plan_free(&plan);
        kiln_device_close(&e->dev);
        kiln_free(e);
        return kiln_err_wrap(err, st, "compiling the %s plan", m->cfg.arch);
    }
    if (n_ranks > 1) {
        /* this rank's shard of the plan (plan/tp.h: the sharding rules) */
        kiln_plan sh;
        st = kiln_plan_tp_shard(&plan, rank, n_ranks, &sh, &e->tp_layout, err);
        kiln_plan_free(&plan);
        plan = sh;
        if (st) {
            kiln_plan_free(&plan);
            kiln_device_close(&e->dev);
            kiln_free(e);
            return kiln_err_wrap(err, st, "%s: rank %d", m->path, rank);
        }
    }
    kiln_bind_opts bo;
    kiln_bind_opts_default(&bo);
    bo.ggml_numerics = ggml_numerics;
    bo.kv_dtype = kv_dtype;
    bo.max_tokens = e->max_step;
    /* weights: selection, then the load plan the chosen kernels ask for (runtime/bind.c) */
    kiln_load_request lr;
    kiln_load_request_init(&lr);
    lr.progress = rank == 0;
    lr.threads = o->n_threads > 0 ? o->n_threads : 0;
    /* ranks share the cores: each rank's thread pool gets its part */
    int32_t threads = o->n_threads;
    if (n_ranks > 1 && threads != 1) {
        long cores = threads > 0 ? threads : sysconf(_SC_NPROCESSORS_ONLN);
        threads = (int32_t)(cores / n_ranks > 1 ? cores / n_ranks : 1);
        lr.threads = threads;
    }
    st = kiln_bind_plan_load(&e->dev, m, &plan, &bo, &lr, &e->bp, NULL, err);
    if (st) {
        kiln_device_close(&e->dev);
        kiln_free(e);
        return n_ranks > 1 ? kiln_err_wrap(err, st, "rank %d", rank) : st;
    }
    if (n_ranks > 1) e->bp.n_vocab = e->tp_layout.n_vocab; /* the full row, after gathering */
    /* decode buffers for up to 64 tokens, prefill buffers for max_step */
    int64_t dec = e->max_step < 64 ? e->max_step : 64;
    st = alloc_mode(e, KILN_MODE_DECODE, dec, err);
    if (!st) st = alloc_mode(e, KILN_MODE_PREFILL, e->max_step, err);
    if (!st) {
        size_t wf;
        if (!kiln_size_mul(e->bp.work_per_token, (size_t)e->max_step, &wf) ||
            wf > SIZE_MAX / sizeof(float))
            st = kiln_err_set(err, KILN_ERR_OVERFLOW, "engine workspace");
        else {
            e->work_floats = wf;
            st = kiln_buf_alloc(&e->dev, KILN_MEM_DEVICE, (wf ? wf : 1) * sizeof(float), &e->work,
                                err);
        }
    }
    if (!st) st = create_kv(e, n_ctx, kv_dtype, err);
    if (!st) {
        size_t ms = (size_t)e->max_step, mq = (size_t)e->max_seqs;
        e->seqs = kiln_calloc(mq, sizeof(kiln_seq_state));
        e->prep.logit_rows = kiln_calloc(ms, sizeof(int32_t));
        e->prep.step_seq = kiln_calloc(mq, sizeof(int32_t));
        e->prep.step_count = kiln_calloc(mq, sizeof(int32_t));
        e->prep.old_blocks = kiln_calloc(mq, sizeof(int32_t));
        e->seq_slot = kiln_calloc(mq, sizeof(int32_t));
        e->row_of_entry = kiln_calloc(ms, sizeof(int32_t));
        if (!e->seqs || !e->prep.logit_rows || !e->prep.step_seq || !e->prep.step_count ||
            !e->prep.old_blocks || !e->seq_slot || !e->row_of_entry)
            st = kiln_err_set(err, KILN_ERR_NOMEM, "engine: out of memory");
    }
    if (!st && o->counters) {
        e->counters = kiln_calloc(KILN_OP_LIMIT, sizeof(uint64_t));
        if (!e->counters) st = kiln_err_set(err, KILN_ERR_NOMEM, "engine: out of memory");
    }
    /* CPU threads for host kernels (a device backend's kernels run on its queue) */
    if (!st && threads != 1 && be->host_memory) st = kiln_pool_create(threads, &e->pool, err);
    if (!st) st = kiln_mapguard_check(err); /* a model page faulted while binding */
    if (st) {
        kiln_engine_free(e);
        return st;
    }
    *out = e;
    return KILN_OK;
}

/* KILN_OP_PROFILE's table: per opcode the calls and wall time (device synced around each
 * instruction), and what the engine's steps spent outside the plan (inputs, sampling,
 * outputs to the host) */
static void print_op_profile(const kiln_engine *e) {
    static const char *const bucket_name[KILN_BUCKETS] = {"1", "2-8", "9-64", "65-512", ">512"};
    fprintf(stderr, "op profile (KILN_OP_PROFILE; the device synced around each instruction)\n");
    for (int b = 0; b < KILN_BUCKETS; b++) {
        const uint64_t *p = e->op_prof + (size_t)b * 2 * KILN_OP_LIMIT, steps = e->prof_steps[b];
        if (!steps) continue;
        fprintf(stderr, " steps of %s tokens: %llu steps, %.3f ms/step\n", bucket_name[b],
                (unsigned long long)steps, e->prof_step_ns[b] / 1e6 / (double)steps);
        uint64_t in_plan = 0;
        for (int op = 0; op < KILN_OP_LIMIT; op++) {
            const uint64_t ns = p[op], calls = p[KILN_OP_LIMIT + op];
            if (!calls) continue;
            in_plan += ns;
            fprintf(stderr, "  %-14s %8llu calls %8.2f us/call %8.3f ms/step\n",
                    kiln_opcode_name((uint32_t)op), (unsigned long long)calls,
                    ns / 1e3 / (double)calls, ns / 1e6 / (double)steps);
        }
        const uint64_t rest = e->prof_step_ns[b] > in_plan ? e->prof_step_ns[b] - in_plan : 0;
        fprintf(stderr, "  %-14s %37.3f ms/step\n", "outside plan", rest / 1e6 / (double)steps);
    }
}

void kiln_engine_free(kiln_engine *e) {
    if (!e) return;
    kiln_device *dev = &e->dev;
    if (e->prep.ready) kiln_engine_cancel(e);
    kiln_tp_group_free(e); /* the followers first (their KV pools mirror this one's) */
    if (e->seqs)
        for (int32_t i = 0; i < e->max_seqs; i++)
            if (e->seqs[i].used) {
                kiln_kv_release(&e->kv, &e->seqs[i].kv);
                kiln_free(e->seqs[i].kv.blocks);
            }
    if (dev->be) {
        kiln_graph_cache_clear(&e->graphs, dev);
        kiln_kv_pool_free(&e->kv);
        for (int m = 0; m < 2; m++) kiln_buf_free(dev, &e->mode[m].arena);
        kiln_buf_free(dev, &e->work);
        kiln_buf_free(dev, &e->scratch);
        kiln_buf_free(dev, &e->sample_ws);
        for (int s = 0; s < 2; s++) {
            kiln_buf_free(dev, &e->slot[s].staging);
            kiln_buf_free(dev, &e->slot[s].dev);
            kiln_buf_free(dev, &e->slot[s].sstaging);
            kiln_buf_free(dev, &e->slot[s].sdev);
        }
        kiln_buf_free(dev, &e->out_logits);
        kiln_buf_free(dev, &e->out_ids);
        kiln_buf_free(dev, &e->out_logits_host);
        kiln_buf_free(dev, &e->out_ids_host);
        kiln_buf_free(dev, &e->tp_shard);
        kiln_buf_free(dev, &e->tp_full);
        kiln_buf_free(dev, &e->tp_tmp);
    }
    for (int m = 0; m < 2; m++) {
        kiln_free(e->mode[m].bufs);
        kiln_free(e->mode[m].bytes);
    }
    kiln_bound_plan_free(&e->bp);
    kiln_device_close(dev);
    kiln_pool_free(e->pool);
    kiln_free(e->seqs);
    kiln_free(e->prep.logit_rows);
    kiln_free(e->prep.step_seq);
    kiln_free(e->prep.step_count);
    kiln_free(e->prep.old_blocks);
    kiln_free(e->seq_slot);
    kiln_free(e->row_of_entry);
    kiln_free(e->counters);
    if (e->op_prof) print_op_profile(e);
    kiln_free(e->op_prof);
    kiln_free(e);
}

const struct kiln_load_plan *kiln_engine_load_plan(const kiln_engine *e) {
    return e->bp.load;
}

const uint64_t *kiln_engine_counters(const kiln_engine *e) {
    return e->counters;
}

/* ---- sequences ---- */

kiln_status kiln_seq_create(kiln_engine *e, int32_t *seq, kiln_err *err) {
    for (int32_t i = 0; i < e->max_seqs; i++)
        if (!e->seqs[i].used) {
            e->seqs[i].used = true;
            kiln_kv_table_init(&e->seqs[i].kv);
            *seq = i;
            return KILN_OK;
        }
    return kiln_err_set(err, KILN_ERR_CAPACITY, "engine: all %d sequences in use",
                        (int)e->max_seqs);
}

static kiln_seq_state *seq_get(const kiln_engine *e, int32_t seq) {
    if (seq < 0 || seq >= e->max_seqs || !e->seqs[seq].used) return NULL;
    return &e->seqs[seq];
}

/* a sequence of the prepared step must not change before it runs */
static bool seq_in_prepared(const kiln_engine *e, int32_t seq) {
    if (!e->prep.ready) return false;
    for (int32_t i = 0; i < e->prep.n_seqs; i++)
        if (e->prep.step_seq[i] == seq) return true;
    return false;
}

void kiln_seq_free(kiln_engine *e, int32_t seq) {
    kiln_seq_state *s = seq_get(e, seq);
    if (!s) return;
    if (seq_in_prepared(e, seq)) kiln_engine_cancel(e);
    kiln_kv_release(&e->kv, &s->kv);
    kiln_free(s->kv.blocks);
    memset(s, 0, sizeof(*s));
}

int32_t kiln_seq_len(const kiln_engine *e, int32_t seq) {
    const kiln_seq_state *s = seq_get(e, seq);
    return s ? s->kv.len : -1;
}

kiln_status kiln_seq_truncate(kiln_engine *e, int32_t seq, int32_t n_pos, kiln_err *err) {
    kiln_seq_state *s = seq_get(e, seq);
    if (!s) return kiln_err_set(err, KILN_ERR_INVALID_ARG, "sequence %d does not exist", (int)seq);
    if (seq_in_prepared(e, seq))
        return kiln_err_set(err, KILN_ERR_STATE, "sequence %d is in the prepared step", (int)seq);
    return kiln_kv_truncate(&e->kv, &s->kv, n_pos, err);
}

kiln_status kiln_seq_fork(kiln_engine *e, int32_t parent, int32_t *child, kiln_err *err) {
    kiln_seq_state *p = seq_get(e, parent);
    if (!p)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "sequence %d does not exist", (int)parent);
    KILN_TRY(kiln_seq_create(e, child, err));
    kiln_status st = kiln_kv_fork(&e->kv, &p->kv, &e->seqs[*child].kv, err);
    if (st) kiln_seq_free(e, *child);
    return st;
}

kiln_status kiln_seq_attach(kiln_engine *e, int32_t seq, const int32_t *blocks, int32_t n,
                            kiln_err *err) {
    kiln_seq_state *s = seq_get(e, seq);
    if (!s) return kiln_err_set(err, KILN_ERR_INVALID_ARG, "sequence %d does not exist", (int)seq);
    if (seq_in_prepared(e, seq))
        return kiln_err_set(err, KILN_ERR_STATE, "sequence %d is in the prepared step", (int)seq);
    return kiln_kv_attach(&e->kv, &s->kv, blocks, n, err);
}

void kiln_seq_blocks(const kiln_engine *e, int32_t seq, const int32_t **blocks, int32_t *n) {
    const kiln_seq_state *s = seq_get(e, seq);
    *blocks = s ? s->kv.blocks : NULL;
    *n = s ? s->kv.n_blocks : 0;
}

kiln_status kiln_engine_block_ref(kiln_engine *e, int32_t block, kiln_err *err) {
    return kiln_kv_block_ref(&e->kv, block, err);
}
void kiln_engine_block_unref(kiln_engine *e, int32_t block) {
    kiln_kv_block_unref(&e->kv, block);
}
int32_t kiln_engine_block_refcount(const kiln_engine *e, int32_t block) {
    return kiln_kv_block_refcount(&e->kv, block);
}

/* ---- capacity ---- */

int32_t kiln_engine_kv_block_size(const kiln_engine *e) {
    (void)e;
    return KILN_KV_BLOCK;
}
int32_t kiln_engine_kv_blocks_total(const kiln_engine *e) {
    return e->kv.max_blocks;
}
int32_t kiln_engine_kv_blocks_free(const kiln_engine *e) {
    return e->kv.max_blocks > 0 ? kiln_kv_pool_free_blocks(&e->kv) : 0;
}
int32_t kiln_engine_max_step_tokens(const kiln_engine *e) {
    return e->max_step;
}
int32_t kiln_engine_max_seqs(const kiln_engine *e) {
    return e->max_seqs;
}
int32_t kiln_engine_seqs_free(const kiln_engine *e) {
    int32_t n = 0;
    for (int32_t i = 0; i < e->max_seqs; i++) n += !e->seqs[i].used;
    return n;
}

/* blocks a sequence holding `have` blocks must add to cover len + n_new positions */
static int32_t blocks_to_add(int32_t have, int64_t len, int64_t n_new) {
    int64_t need = (len + n_new + KILN_KV_BLOCK - 1) / KILN_KV_BLOCK;
    return need > have ? (int32_t)(need - have) : 0;
}

int32_t kiln_seq_blocks_needed(const kiln_engine *e, int32_t seq, int32_t n_new) {
    const kiln_seq_state *s = seq_get(e, seq);
    if (!s || n_new < 0) return -1;
    return blocks_to_add(s->kv.n_blocks, s->kv.len, n_new);
}

int32_t kiln_engine_blocks_needed(const kiln_engine *e, const kiln_batch_entry *en, int32_t n) {
    /* count entries per sequence without touching engine state (O(n^2) only in the
     * number of distinct sequences of the batch) */
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        const kiln_seq_state *s = seq_get(e, en[i].seq);
        if (!s) return -1;
        bool first = true;
        for (int32_t j = 0; j < i && first; j++) first = en[j].seq != en[i].seq;
        if (!first) continue;
        int64_t cnt = 0;
        for (int32_t j = i; j < n; j++) cnt += en[j].seq == en[i].seq;
        total += blocks_to_add(s->kv.n_blocks, s->kv.len, cnt);
    }
    return total > INT32_MAX ? INT32_MAX : (int32_t)total;
}

/* ---- prepare ---- */

kiln_status kiln_engine_grow_buf(kiln_engine *e, kiln_buf *b, kiln_mem_space space, size_t bytes,
                                 kiln_err *err) {
    if (b->ptr && b->size >= bytes) return KILN_OK;
    kiln_buf nb;
    KILN_TRY(kiln_buf_alloc(&e->dev, space, bytes, &nb, err));
    kiln_buf_free(&e->dev, b);
    *b = nb;
    return KILN_OK;
}

static kiln_status drop_step(kiln_engine *e, kiln_status st);

void kiln_engine_cancel(kiln_engine *e) {
    if (!e->prep.ready) return;
    e->prep.ready = false;
    drop_step(e, KILN_OK);
}

/* ---- sampled steps ---- */

bool kiln_engine_device_sampling(kiln_engine *e) {
    const char *hs = getenv("KILN_HOST_SAMPLING"); /* A/B: read per call, not cached */
    if (hs && hs[0] == '1') return false;
    if (e->sample_state == 0) {
        e->sample_state = -1;
        /* the final softcap: the device's logits are before it (adapters.c) */
        for (int32_t i = 0; i < e->bp.plan.n_insns; i++)
            if (e->bp.bi[i].insn->opcode == KILN_OP_LM_HEAD)
                e->sample_softcap = e->bp.bi[i].prm.lm_head.softcap;
        kiln_backend_id b;
        if (!e->tp && !e->dev.be->host_memory && kiln_backend_from_name(e->dev.be->name, &b)) {
            /* chosen like any call site ("output.sample": policy, PerfDB, the breaker's
             * marks); a host kernel (the reference, when the device's are avoided or
             * unhealthy) means the host samples */
            kiln_callsite cs = {.op = KILN_KOP_SAMPLE, .w_dtype = KILN_DTYPE_F32};
            snprintf(cs.name, sizeof cs.name, "%s", KILN_SAMPLE_SITE);
            kiln_kernel_fn fn;
            const kiln_reg_kernel *k = NULL;
            kiln_err se;
            kiln_err_clear(&se);
            if (!kiln_select_callsite(&e->dev, &cs, &fn, NULL, &k, &se) && k &&
                k->spec.platform == kiln_backend_platform(b) && fn.sample) {
                e->sample_fn = fn.sample;
                e->sample_ws_fn = k->spec.workspace;
                e->sample_backend = b;
                e->sample_state = 1;
            }
        }
    }
    return e->sample_state > 0;
}

/* Checks a sampled step's parameters and packs them into the slot (rows | ov_id | ov_bias
 * | ov_count), copied to the device. */
static kiln_status pack_sample(kiln_engine *e, kiln_step_slot *sl, const kiln_sample_step *ss,
                               int32_t n_rows, int32_t n_vocab, kiln_err *err) {
    if (!kiln_engine_device_sampling(e))
        return kiln_err_set(
            err, KILN_ERR_UNSUPPORTED,
            "sampled step: the %s backend has no sample kernel (sample on the host)",
            e->dev.be->name);
    if (n_rows > 0 && !ss->rows)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "sampled step: no row parameters");
    if (ss->n_ov < 0 || (ss->n_ov > 0 && (!ss->ov_id || !ss->ov_bias || !ss->ov_count)))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "sampled step: %d overrides", (int)ss->n_ov);
    for (int32_t i = 0; i < n_rows; i++) {
        const kiln_sample_row_params *r = &ss->rows[i];
        const int64_t k = !(r->temperature > 0)                ? 1
                          : r->top_k > 0 && r->top_k < n_vocab ? r->top_k
                                                               : n_vocab;
        if (r->ov_off < 0 || r->n_ov < 0 || (int64_t)r->ov_off + r->n_ov > ss->n_ov || k <= 0 ||
            k + 2 * (int64_t)r->n_ov > KILN_SAMPLE_MAX_CAND)
            return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                "sampled step: row %d (top-k %d, %d overrides at %d of %d): the "
                                "kernel takes k + 2 x overrides <= %d",
                                (int)i, (int)r->top_k, (int)r->n_ov, (int)r->ov_off, (int)ss->n_ov,
                                KILN_SAMPLE_MAX_CAND);
        for (int32_t j = 0; j < r->n_ov; j++) {
            const int32_t id = ss->ov_id[r->ov_off + j];
            if (id < 0 || id >= n_vocab || (j > 0 && id <= ss->ov_id[r->ov_off + j - 1]))
                return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                    "sampled step: row %d: override ids must be sorted, "
                                    "distinct and < %d",
                                    (int)i, (int)n_vocab);
        }
    }
    const size_t rb = (size_t)n_rows * sizeof(kiln_sample_row_params);
    const size_t ob = (size_t)ss->n_ov * sizeof(int32_t);
    const size_t bytes = rb + 3 * ob + 16;
    KILN_TRY(kiln_engine_grow_buf(e, &sl->sstaging, KILN_MEM_STAGING, bytes, err));
    KILN_TRY(kiln_engine_grow_buf(e, &sl->sdev, KILN_MEM_DEVICE, bytes, err));
    uint8_t *b = sl->sstaging.ptr;
    if (rb) memcpy(b, ss->rows, rb);
    if (ob) {
        memcpy(b + rb, ss->ov_id, ob);
        memcpy(b + rb + ob, ss->ov_bias, ob);
        memcpy(b + rb + 2 * ob, ss->ov_count, ob);
    }
    return kiln_buf_h2d(&e->dev, &sl->sdev, 0, b, bytes, err);
}

/* Launches the sample kernel over the step's logits rows (device memory) into ids. */
static kiln_status run_sample(kiln_engine *e, const kiln_prepared *pp, const kiln_exec *x,
                              const float *logits, int32_t *ids, int32_t n_vocab, kiln_err *err) {
    const uint8_t *b = e->slot[pp->slot].sdev.ptr;
    const size_t rb = (size_t)pp->n_logits * sizeof(kiln_sample_row_params);
    const size_t ob = (size_t)pp->sample_n_ov * sizeof(int32_t);
    const int32_t lim =
        pp->greedy_limit > 0 && pp->greedy_limit < n_vocab ? pp->greedy_limit : n_vocab;
    kiln_sample_args a = {.logits = logits,
                          .ld = n_vocab,
                          .t = pp->n_logits,
                          .n = lim,
                          .softcap = e->dev.be->host_memory ? 0.0f : e->sample_softcap,
                          .rows = (const kiln_sample_row_params *)(const void *)b,
                          .ov_id = (const int32_t *)(const void *)(b + rb),
                          .ov_bias = (const float *)(const void *)(b + rb + ob),
                          .ov_count = (const int32_t *)(const void *)(b + rb + 2 * ob),
                          .ids = ids};
    kiln_kctx kc = x->kctx;
    kc.err = err;
    kc.scratch = NULL;
    kc.scratch_size = 0;
    if (e->sample_ws_fn) { /* its own buffer: the step graphs hold e->scratch's address */
        kiln_sel_ctx sc;
        kiln_sel_ctx_init(&sc, KILN_KOP_SAMPLE, e->sample_backend);
        sc.tokens_max = pp->n_logits;
        sc.n = lim;
        const size_t need = e->sample_ws_fn(&sc);
        if (need) {
            KILN_TRY(kiln_engine_grow_buf(e, &e->sample_ws, KILN_MEM_DEVICE, need, err));
            kc.scratch = e->sample_ws.ptr;
            kc.scratch_size = e->sample_ws.size;
        }
    }
    kiln_status st = e->sample_fn(&kc, &a);
    if (st && kiln_status_is_fault(st)) {
        /* the circuit breaker: the kernel is marked unhealthy on this device and the next
         * sampled step selects again (another device kernel, or the host samples) */
        kiln_kernel_fn fn = {.sample = e->sample_fn};
        kiln_err be;
        kiln_err_clear(&be);
        if (!kiln_kernel_failed(&e->dev, fn, err, &be)) e->sample_state = 0;
    }
    return st ? kiln_err_wrap(err, st, "sampled step") : KILN_OK;
}

kiln_status kiln_engine_prepare(kiln_engine *e, const kiln_batch_entry *en, int32_t n,
                                const kiln_step_opts *opts, kiln_err *err) {
    kiln_prepared *pp = &e->prep;
    if (pp->ready)
        return kiln_err_set(err, KILN_ERR_STATE,
                            "a step is already prepared (run or cancel it first)");
    if (n < 0 || (n > 0 && !en))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "step of %d entries", (int)n);
    if (n > e->max_step)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "step of %d tokens: the engine takes at most %d", (int)n,
                            (int)e->max_step);
    const int32_t n_vocab = e->model->cfg.n_vocab;
    /* group entries by sequence; check order and positions */
    int32_t n_seqs = 0, n_logits = 0;
    for (int32_t i = 0; i < e->max_seqs; i++) e->seq_slot[i] = -1;
    for (int32_t i = 0; i < n; i++) {
        const kiln_batch_entry *b = &en[i];
        kiln_seq_state *s = seq_get(e, b->seq);
        if (!s)
            return kiln_err_set(err, KILN_ERR_INVALID_ARG, "entry %d: sequence %d does not exist",
                                (int)i, (int)b->seq);
        if (b->token < 0 || b->token >= n_vocab)
            return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                "entry %d: token %d outside the vocabulary (%d)", (int)i,
                                (int)b->token, (int)n_vocab);
        int32_t si = e->seq_slot[b->seq];
        if (si < 0) {
            si = e->seq_slot[b->seq] = n_seqs++;
            pp->step_seq[si] = b->seq;
            pp->step_count[si] = 0;
        }
        int32_t want = s->kv.len + pp->step_count[si];
        if (b->pos != want)
            return kiln_err_set(
                err, KILN_ERR_INVALID_ARG,
                "entry %d: sequence %d position %d, expected %d (positions continue the sequence)",
                (int)i, (int)b->seq, (int)b->pos, (int)want);
        if (b->pos >= INT32_MAX - 1)
            return kiln_err_set(err, KILN_ERR_RANGE, "entry %d: position too large", (int)i);
        pp->step_count[si]++;
        if (b->want_logits) n_logits++;
    }
    /* reserve KV: all or nothing */
    int64_t needed = 0;
    for (int32_t si = 0; si < n_seqs; si++) {
        const kiln_seq_state *s = &e->seqs[pp->step_seq[si]];
        needed += blocks_to_add(s->kv.n_blocks, s->kv.len, pp->step_count[si]);
    }
    const int32_t avail = kiln_engine_kv_blocks_free(e);
    if (needed > avail)
        return kiln_err_set(err, KILN_ERR_CAPACITY,
                            "KV cache full: step needs %lld blocks, %d free of %d",
                            (long long)needed, (int)avail, (int)e->kv.max_blocks);
    /* rows: decode rows (a sequence's single token after cached context) first, then
     * prefill rows in entry order; stride = the most blocks a sequence will hold */
    int32_t n_decode = 0, stride = 1;
    for (int32_t si = 0; si < n_seqs; si++) {
        const kiln_seq_state *s = &e->seqs[pp->step_seq[si]];
        if (pp->step_count[si] == 1 && s->kv.len > 0) n_decode++;
        int32_t nb = (s->kv.len + pp->step_count[si] + KILN_KV_BLOCK - 1) / KILN_KV_BLOCK;
        if (nb > stride) stride = nb;
    }
    /* the packed inputs: ids | tok_seq | tok_pos | seq_len | table */
    size_t ints = (size_t)3 * (size_t)n + (size_t)n_seqs + (size_t)n_seqs * (size_t)stride;
    const int slot = e->next_slot;
    kiln_step_slot *sl = &e->slot[slot];
    const bool host = e->dev.be->host_memory;
    if (host) {
        KILN_TRY(kiln_engine_grow_buf(e, &sl->dev, KILN_MEM_DEVICE, ints * sizeof(int32_t), err));
    } else {
        KILN_TRY(
            kiln_engine_grow_buf(e, &sl->staging, KILN_MEM_STAGING, ints * sizeof(int32_t), err));
        KILN_TRY(kiln_engine_grow_buf(e, &sl->dev, KILN_MEM_DEVICE, ints * sizeof(int32_t), err));
    }
    for (int32_t si = 0; si < n_seqs; si++)
        pp->old_blocks[si] = e->seqs[pp->step_seq[si]].kv.n_blocks;
    for (int32_t si = 0; si < n_seqs; si++) {
        kiln_seq_state *s = &e->seqs[pp->step_seq[si]];
        kiln_status st = kiln_kv_reserve(&e->kv, &s->kv, s->kv.len + pp->step_count[si], err);
        if (st) {
            for (int32_t j = 0; j <= si; j++) {
                kiln_seq_state *sj = &e->seqs[pp->step_seq[j]];
                kiln_kv_truncate(&e->kv, &sj->kv, sj->kv.len, NULL);
            }
            return st;
        }
    }
    int32_t *in = host ? sl->dev.ptr : sl->staging.ptr;
    int32_t *ids = in, *tseq = in + n, *tpos = in + 2 * n, *slen = in + 3 * n;
    int32_t *table = slen + n_seqs;
    int32_t next_dec = 0, next_pre = n_decode;
    for (int32_t i = 0; i < n; i++) {
        const kiln_batch_entry *b = &en[i];
        int32_t si = e->seq_slot[b->seq];
        bool dec = pp->step_count[si] == 1 && e->seqs[b->seq].kv.len > 0;
        int32_t r = dec ? next_dec++ : next_pre++;
        e->row_of_entry[i] = r;
        ids[r] = b->token;
        tseq[r] = si;
        tpos[r] = b->pos;
    }
    n_logits = 0;
    for (int32_t i = 0; i < n; i++)
        if (en[i].want_logits) pp->logit_rows[n_logits++] = e->row_of_entry[i];
    for (int32_t si = 0; si < n_seqs; si++) {
        const kiln_kv_table *kt = &e->seqs[pp->step_seq[si]].kv;
        slen[si] = kt->len + pp->step_count[si];
        int32_t *row = table + (size_t)si * (size_t)stride;
        memcpy(row, kt->blocks, (size_t)kt->n_blocks * sizeof(int32_t));
        for (int32_t j = kt->n_blocks; j < stride; j++) row[j] = -1;
    }
    if (!host) KILN_TRY(kiln_buf_h2d(&e->dev, &sl->dev, 0, in, ints * sizeof(int32_t), err));
    if (e->tp) {
        kiln_status st = kiln_tp_prepare(e, slot, in, ints * sizeof(int32_t), err);
        if (st) { /* the blocks reserved above go back (lengths never moved) */
            for (int32_t si = 0; si < n_seqs; si++) {
                kiln_seq_state *sj = &e->seqs[pp->step_seq[si]];
                kiln_kv_truncate(&e->kv, &sj->kv, sj->kv.len, NULL);
            }
            return st;
        }
    }
    pp->sampled = false;
    if (opts && opts->sample) {
        kiln_status sst = opts->greedy ? kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                                      "a step is greedy or sampled, not both")
                                       : pack_sample(e, sl, opts->sample, n_logits, n_vocab, err);
        if (sst) {
            for (int32_t si = 0; si < n_seqs; si++) {
                kiln_seq_state *sj = &e->seqs[pp->step_seq[si]];
                kiln_kv_truncate(&e->kv, &sj->kv, sj->kv.len, NULL);
            }
            return sst;
        }
        pp->sampled = true;
        pp->sample_n_ov = opts->sample->n_ov;
    }
    pp->slot = slot;
    e->next_slot = slot ^ 1;
    pp->t = n;
    pp->n_seqs = n_seqs;
    pp->n_decode = n_decode;
    pp->n_logits = n_logits;
    pp->stride = stride;
    pp->greedy = opts && opts->greedy;
    pp->greedy_limit = opts ? opts->n_vocab_limit : 0;
    pp->ready = true;
    return KILN_OK;
}

/* ---- run ---- */

/* Grows e->scratch to the largest workspace any bound kernel of bucket b asks for (its
 * spec's workspace function; computed once per bucket), so kernels do not allocate their
 * scratch on every call. Attention runs its decode and prefill rows with the kernels of
 * smaller buckets too, and the LM head the kernels of its rows' bucket, so their sites
 * count every bucket up to b. */
static kiln_status fit_scratch(kiln_engine *e, int b, kiln_err *err) {
    if (b < 0 || b >= KILN_BUCKETS) return KILN_OK;
    if (e->scratch_need[b] == SIZE_MAX) {
        size_t need = 0;
        for (int32_t i = 0; i < e->bp.plan.n_insns; i++) {
            const kiln_bound_insn *bi = &e->bp.bi[i];
            for (int si = 0; si < bi->n_sites; si++) {
                kiln_callsite cs = bi->site[si].desc;
                /* attention and the LM head (its rows' bucket) run smaller buckets' kernels */
                int b0 = cs.op == KILN_KOP_ATTENTION || si == KILN_SITE_LM_HEAD ||
                                 si == KILN_SITE_LM_ARGMAX
                             ? 0
                             : b;
                for (int bb = b0; bb <= b; bb++) {
                    cs.bucket = bb;
                    size_t w = kiln_callsite_workspace(&e->dev, &cs, bi->site[si].kernel[bb]);
                    if (w > need) need = w;
                }
            }
        }
        e->scratch_need[b] = need;
    }
    const size_t need = e->scratch_need[b];
    if (need == 0 || need <= e->scratch.size) return KILN_OK;
    kiln_status st = kiln_engine_grow_buf(e, &e->scratch, KILN_MEM_DEVICE, need, err);
    return st ? kiln_err_wrap(err, st, "engine: kernel scratch") : KILN_OK;
}

/* A step that did not complete: the blocks prepare reserved go back (lengths never
 * moved), then st is returned. */
static kiln_status drop_step(kiln_engine *e, kiln_status st) {
    const kiln_prepared *pp = &e->prep;
    for (int32_t si = 0; si < pp->n_seqs; si++) {
        kiln_seq_state *s = &e->seqs[pp->step_seq[si]];
        if (s->used) kiln_kv_truncate(&e->kv, &s->kv, s->kv.len, NULL);
    }
    return st;
}

kiln_status kiln_engine_exec_setup(kiln_engine *e, const kiln_prepared *pp, const int32_t *in,
                                   int mode, kiln_exec *x, kiln_err *err) {
    const int32_t n = pp->t;
    memset(x, 0, sizeof(*x));
    x->t = n;
    x->bucket = kiln_bucket_of(n);
    KILN_TRY(fit_scratch(e, x->bucket, err));
    x->dev = &e->dev;
    x->kctx.pool = e->pool;
    x->kctx.scratch = e->scratch.ptr;
    x->kctx.scratch_size = e->scratch.size;
    x->kctx.stream = e->dev.queue;
    x->kctx.dev = e->dev.impl;
    x->kctx.err = err; /* kernels' messages (a device's error string) reach the caller */
    x->ids = in;
    x->tok_seq = in + n;
    x->tok_pos = in + 2 * n;
    x->blocks.seq_len = in + 3 * n;
    x->blocks.table = in + 3 * n + pp->n_seqs;
    x->blocks.n_seqs = pp->n_seqs;
    x->blocks.stride = pp->stride;
    x->n_decode = pp->n_decode;
    x->logit_rows = pp->logit_rows;
    x->n_logits = pp->n_logits;
    x->greedy_limit = pp->greedy_limit;
    x->bufs = e->mode[mode].bufs;
    x->buf_bytes = e->mode[mode].bytes;
    x->work = e->work.ptr;
    x->work_floats = e->work_floats;
    x->kv = &e->kv;
    x->counters = e->counters;
    x->op_ns = e->op_prof ? e->op_prof + (size_t)x->bucket * 2 * KILN_OP_LIMIT : NULL;
    x->comm = e->comm;
    x->comm_rank = e->tp_rank;
    return KILN_OK;
}

/* The greedy pick of a tensor-parallel step, on the host copy of the full logits rows:
 * the first largest logit among ids [0, limit) (the final softcap is monotonic). */
static void argmax_rows(const float *l, int32_t rows, int32_t n_vocab, int32_t limit,
                        int32_t *ids) {
    const int32_t nl = limit > 0 && limit < n_vocab ? limit : n_vocab;
    for (int32_t i = 0; i < rows; i++) {
        const float *r = l + (size_t)i * (size_t)n_vocab;
        int32_t best = 0;
        for (int32_t j = 1; j < nl; j++)
            if (r[j] > r[best]) best = j;
        ids[i] = best;
    }
}

kiln_status kiln_engine_run_into(kiln_engine *e, float *logits, int32_t *ids, kiln_err *err) {
    kiln_prepared *pp = &e->prep;
    if (!pp->ready) return kiln_err_set(err, KILN_ERR_STATE, "no step is prepared");
    pp->ready = false; /* from here the step either runs or is dropped */
    const uint64_t prof_t0 = e->op_prof ? kiln_now_ns() : 0;
    e->n_out = 0;
    const int32_t n = pp->t;
    if (n == 0) return KILN_OK;
    const int32_t n_vocab = e->bp.n_vocab > 0 ? e->bp.n_vocab : e->model->cfg.n_vocab;
    const bool host = e->dev.be->host_memory;
    /* a tensor-parallel greedy step computes the full logits rows (engine memory) and
     * picks on the host copy: the ranks' fused argmax kernels see only their shards */
    const bool tp_greedy = e->tp && pp->greedy;
    kiln_status st = KILN_OK;
    /* outputs: the caller's memory (host backends), else the engine's device buffers */
    float *out_logits = NULL;
    int32_t *out_ids = NULL;
    if (pp->n_logits > 0 && pp->sampled) {
        st = kiln_engine_grow_buf(e, &e->out_ids, KILN_MEM_DEVICE,
                                  (size_t)pp->n_logits * sizeof(int32_t), err);
        out_ids = e->out_ids.ptr;
        if (!st)
            st = kiln_engine_grow_buf(e, &e->out_logits, KILN_MEM_DEVICE,
                                      (size_t)pp->n_logits * (size_t)n_vocab * sizeof(float), err);
        out_logits = e->out_logits.ptr;
    } else if (pp->n_logits > 0) {
        if (pp->greedy && !tp_greedy) {
            if (ids && host)
                out_ids = ids;
            else {
                st = kiln_engine_grow_buf(e, &e->out_ids, KILN_MEM_DEVICE,
                                          (size_t)pp->n_logits * sizeof(int32_t), err);
                out_ids = e->out_ids.ptr;
            }
        } else {
            size_t bytes = (size_t)pp->n_logits * (size_t)n_vocab * sizeof(float);
            if (logits && host && !tp_greedy)
                out_logits = logits;
            else {
                st = kiln_engine_grow_buf(e, &e->out_logits, KILN_MEM_DEVICE, bytes, err);
                out_logits = e->out_logits.ptr;
            }
        }
    }
    int mode = n <= e->mode[KILN_MODE_DECODE].tokens ? KILN_MODE_DECODE : KILN_MODE_PREFILL;
    kiln_exec x;
    if (!st) st = kiln_engine_exec_setup(e, pp, e->slot[pp->slot].dev.ptr, mode, &x, err);
    if (st) return drop_step(e, st);
    x.logits = out_logits;
    x.greedy_ids = pp->greedy && !tp_greedy ? out_ids : NULL;
    if (e->tp) {
        /* every rank runs and syncs its part (engine_tp.c); no step graphs: a rank's graph
         * would have to capture its collectives too */
        st = kiln_tp_run(e, &x, out_logits, err);
    } else {
        /* decode buckets (gemv kernels, no cuBLAS), and pure-decode steps of up to 64
         * tokens (their GEMMs: no cuBLAS; KILN_GRAPH_BUCKET=1 leaves them ungraphed) */
        if (e->graphs_on && (x.bucket <= 1 || (x.bucket <= e->graph_bucket && x.n_decode == n))) {
            kiln_graph_key gk;
            kiln_graph_key_of(&x, mode, &gk);
            st = kiln_graph_run(&e->graphs, &e->dev, &gk, &e->bp, &x, err);
        } else {
            st = kiln_exec_run(&e->bp, &x, err);
        }
        if (!st && pp->sampled && pp->n_logits > 0)
            st = run_sample(e, pp, &x, out_logits, out_ids, n_vocab, err);
        if (!st) st = kiln_device_sync(&e->dev, err);
    }
    /* a model page faulted (file truncated while mapped): not the model's output */
    if (!st && (st = kiln_mapguard_check(err)) != KILN_OK) return drop_step(e, st);
    if (st) {
        /* circuit breaker: a kernel that faulted (device error, invalid result) is
         * marked unhealthy on this device and its call sites are rebound, so the next
         * step runs the next candidate (this step still fails); other failures (a
         * transient out-of-memory, bad input) leave the kernels alone */
        if (x.failed_insn >= 0 && kiln_status_is_fault(st)) {
            kiln_plan_kernel_failed(&e->bp, x.failed_insn, x.cur_site, x.cur_bucket, err, NULL);
            kiln_graph_cache_clear(&e->graphs, &e->dev); /* their kernels changed */
            for (int b = 0; b < KILN_BUCKETS; b++) e->scratch_need[b] = SIZE_MAX;
        }
        return drop_step(e, st);
    }
    /* outputs to host memory */
    const bool greedy_out = (pp->greedy && !tp_greedy) || pp->sampled;
    if (pp->n_logits > 0 && !host) {
        if (greedy_out) {
            size_t bytes = (size_t)pp->n_logits * sizeof(int32_t);
            st = kiln_engine_grow_buf(e, &e->out_ids_host, KILN_MEM_STAGING, bytes, err);
            if (!st) st = kiln_buf_d2h(&e->dev, e->out_ids_host.ptr, &e->out_ids, 0, bytes, err);
        } else {
            size_t bytes = (size_t)pp->n_logits * (size_t)n_vocab * sizeof(float);
            st = kiln_engine_grow_buf(e, &e->out_logits_host, KILN_MEM_STAGING, bytes, err);
            if (!st)
                st = kiln_buf_d2h(&e->dev, e->out_logits_host.ptr, &e->out_logits, 0, bytes, err);
        }
        if (!st) st = kiln_device_sync(&e->dev, err);
        if (st) return drop_step(e, st);
        if (!greedy_out) {
            /* the model's final softcap (adapters.c applies it only on host memory) */
            float cap = 0;
            for (int32_t i = 0; i < e->bp.plan.n_insns; i++)
                if (e->bp.bi[i].insn->opcode == KILN_OP_LM_HEAD)
                    cap = e->bp.bi[i].prm.lm_head.softcap;
            float *l = e->out_logits_host.ptr;
            size_t cnt = (size_t)pp->n_logits * (size_t)n_vocab;
            if (cap > 0)
                for (size_t i = 0; i < cnt; i++) l[i] = cap * tanhf(l[i] / cap);
            if (logits && !tp_greedy) memcpy(logits, l, cnt * sizeof(float));
        } else if (ids) {
            memcpy(ids, e->out_ids_host.ptr, (size_t)pp->n_logits * sizeof(int32_t));
        }
    }
    if (tp_greedy && pp->n_logits > 0) {
        /* the pick on the host copy, into the caller's ids or the engine's id output */
        const float *l = host ? e->out_logits.ptr : e->out_logits_host.ptr;
        kiln_buf *ob = host ? &e->out_ids : &e->out_ids_host;
        st = kiln_engine_grow_buf(e, ob, host ? KILN_MEM_DEVICE : KILN_MEM_STAGING,
                                  (size_t)pp->n_logits * sizeof(int32_t), err);
        if (st) return drop_step(e, st);
        argmax_rows(l, pp->n_logits, n_vocab, pp->greedy_limit, ob->ptr);
        if (ids) memcpy(ids, ob->ptr, (size_t)pp->n_logits * sizeof(int32_t));
    }
    for (int32_t si = 0; si < pp->n_seqs; si++)
        e->seqs[pp->step_seq[si]].kv.len += pp->step_count[si];
    e->n_out = pp->n_logits;
    e->out_greedy = pp->greedy || pp->sampled;
    /* what the accessors read: the engine's own buffers, or nothing when the caller's
     * memory took the outputs (kiln_engine_step wrappers, which do not use accessors) */
    e->out_caller =
        (pp->greedy ? ids != NULL : logits != NULL) && host && !tp_greedy && !pp->sampled;
    if (e->op_prof) e->prof_step_ns[x.bucket] += kiln_now_ns() - prof_t0, e->prof_steps[x.bucket]++;
    return KILN_OK;
}

kiln_status kiln_engine_run(kiln_engine *e, kiln_err *err) {
    return kiln_engine_run_into(e, NULL, NULL, err);
}

/* ---- outputs ---- */

int32_t kiln_engine_n_outputs(const kiln_engine *e) {
    return e->n_out;
}

int32_t kiln_engine_n_vocab(const kiln_engine *e) {
    return e->bp.n_vocab > 0 ? e->bp.n_vocab : e->model->cfg.n_vocab;
}

const float *kiln_engine_logits(const kiln_engine *e, int32_t i) {
    if (i < 0 || i >= e->n_out || e->out_greedy || e->out_caller) return NULL;
    const float *base = e->dev.be->host_memory ? e->out_logits.ptr : e->out_logits_host.ptr;
    return base ? base + (size_t)i * (size_t)kiln_engine_n_vocab(e) : NULL;
}

int32_t kiln_engine_token(const kiln_engine *e, int32_t i) {
    if (i < 0 || i >= e->n_out || !e->out_greedy || e->out_caller) return -1;
    const int32_t *base = e->dev.be->host_memory ? e->out_ids.ptr : e->out_ids_host.ptr;
    return base ? base[i] : -1;
}

/* ---- one step (prepare + run) ---- */

kiln_status kiln_engine_step(kiln_engine *e, const kiln_batch_entry *en, int32_t n, float *logits,
                             kiln_err *err) {
    if (n <= 0) return KILN_OK;
    if (!logits) {
        for (int32_t i = 0; i < n; i++)
            if (en[i].want_logits)
                return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                    "entries want logits but no buffer was given");
    }
    KILN_TRY(kiln_engine_prepare(e, en, n, NULL, err));
    return kiln_engine_run_into(e, logits, NULL, err);
}

kiln_status kiln_engine_step_greedy(kiln_engine *e, const kiln_batch_entry *en, int32_t n,
                                    int32_t n_vocab_limit, int32_t *ids, kiln_err *err) {
    if (n <= 0) return KILN_OK;
    if (!ids) {
        for (int32_t i = 0; i < n; i++)
            if (en[i].want_logits)
                return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                    "entry %d wants a token but no ids buffer was given", (int)i);
    }
    kiln_step_opts o = {.greedy = 1, .n_vocab_limit = n_vocab_limit};
    KILN_TRY(kiln_engine_prepare(e, en, n, &o, err));
    return kiln_engine_run_into(e, NULL, ids, err);
}
