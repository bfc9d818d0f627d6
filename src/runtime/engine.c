/*
 * engine.c — the engine step API of kiln.h: sequences, KV blocks, and one forward
 * pass over a batch of (seq, token, pos, want_logits) entries from many sequences.
 *
 * A step: validate entries -> reserve KV blocks for every sequence (all or nothing:
 * on KILN_ERR_CAPACITY nothing changed) -> build the step's token rows (ids,
 * sequence index, position) and the per-sequence block tables -> pick the mode
 * (decode buffers when the step is small, prefill buffers otherwise) -> run the bound
 * plan -> advance sequence lengths.
 */
#include "runtime/engine.h"
#include "runtime/kselect.h"

#include "base/log.h"
#include "base/mapguard.h"
#include "base/mem.h"
#include "format/dtype.h"

#include <stdlib.h>
#include <string.h>

void kiln_engine_opts_default(kiln_engine_opts *o) {
    memset(o, 0, sizeof(*o));
    o->backend = "ref";
}

static kiln_status alloc_mode(kiln_engine *e, int mode, int64_t tokens, kiln_err *err) {
    const kiln_plan *p = &e->bp.plan;
    kiln_mode_bufs *mb = &e->mode[mode];
    mb->tokens = tokens;
    mb->bufs = kiln_calloc((size_t)(p->n_phys > 0 ? p->n_phys : 1), sizeof(float *));
    size_t *sizes = kiln_calloc((size_t)(p->n_phys > 0 ? p->n_phys : 1), sizeof(size_t));
    if (!mb->bufs || !sizes) {
        kiln_free(sizes);
        return kiln_err_set(err, KILN_ERR_NOMEM, "engine: out of memory");
    }
    size_t total;
    kiln_status st = kiln_plan_buffer_bytes(p, tokens, tokens, sizes, &total, err);
    if (!st) {
        mb->arena = kiln_alloc_aligned(total ? total : KILN_ALIGN);
        if (!mb->arena)
            st = kiln_err_set(err, KILN_ERR_NOMEM, "engine: %zu bytes of register buffers", total);
    }
    if (!st) {
        size_t off = 0;
        for (int32_t b = 0; b < p->n_phys; b++) {
            mb->bufs[b] = (float *)(void *)(mb->arena + off);
            off += sizes[b];
        }
        mb->bytes = total;
    }
    kiln_free(sizes);
    return st;
}

kiln_status kiln_engine_create(const kiln_model *m, const kiln_engine_opts *o, kiln_engine **out,
                               kiln_err *err) {
    kiln_engine_opts d;
    if (!o) {
        kiln_engine_opts_default(&d);
        o = &d;
    }
    const kiln_backend *be = kiln_backend_find(o->backend ? o->backend : "ref");
    if (!be)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "backend '%s' is not built in (ref, cpu)",
                            o->backend);
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
    e->max_step = o->max_step_tokens > 0 ? o->max_step_tokens : 512;
    e->max_seqs = o->max_seqs > 0 ? o->max_seqs : 64;
    int64_t n_ctx = o->n_ctx > 0 ? o->n_ctx : 4096;
    kiln_status st = KILN_OK;
    kiln_plan plan;
    kiln_plan_init(&plan);
    st = m->family->compile(&m->cfg, KILN_MODE_PREFILL, &plan, err);
    if (st) {
        kiln_plan_free(&plan);
        kiln_free(e);
        return kiln_err_wrap(err, st, "compiling the %s plan", m->cfg.arch);
    }
    st = kiln_bind_plan_numerics(be, m, &plan, ggml_numerics, &e->bp, NULL, err);
    if (st) {
        kiln_free(e);
        return st;
    }
    /* decode buffers for up to 64 tokens, prefill buffers for max_step */
    int64_t dec = e->max_step < 64 ? e->max_step : 64;
    st = alloc_mode(e, KILN_MODE_DECODE, dec, err);
    if (!st) st = alloc_mode(e, KILN_MODE_PREFILL, e->max_step, err);
    if (!st) {
        size_t wf;
        if (!kiln_size_mul(e->bp.work_per_token, (size_t)e->max_step, &wf))
            st = kiln_err_set(err, KILN_ERR_OVERFLOW, "engine workspace");
        else {
            e->work = kiln_alloc_aligned((wf ? wf : 1) * sizeof(float));
            e->work_floats = wf;
            for (int b = 0; b < KILN_BUCKETS; b++) e->scratch_need[b] = SIZE_MAX;
            if (!e->work)
                st = kiln_err_set(err, KILN_ERR_NOMEM, "engine: %zu floats of workspace", wf);
        }
    }
    if (!st) {
        const kiln_plan *p = &e->bp.plan;
        int32_t nl = 0;
        for (int32_t i = 0; i < p->n_states; i++)
            if (p->states[i].layer + 1 > nl) nl = p->states[i].layer + 1;
        int32_t *nkv = kiln_calloc((size_t)(nl > 0 ? nl : 1), sizeof(int32_t));
        int32_t *hd = kiln_calloc((size_t)(nl > 0 ? nl : 1), sizeof(int32_t));
        if (!nkv || !hd) st = kiln_err_set(err, KILN_ERR_NOMEM, "engine: out of memory");
        for (int32_t i = 0; !st && i < p->n_states; i++) {
            nkv[p->states[i].layer] = p->states[i].n_kv_head;
            hd[p->states[i].layer] = p->states[i].head_dim;
        }
        int64_t blocks = (n_ctx + KILN_KV_BLOCK - 1) / KILN_KV_BLOCK + e->max_seqs;
        if (!st && blocks > INT32_MAX)
            st = kiln_err_set(err, KILN_ERR_RANGE, "engine: context %lld too large",
                              (long long)n_ctx);
        if (!st && nl > 0)
            st = kiln_kv_pool_init(&e->kv, nl, nkv, hd, o->kv_f16 ? KILN_DTYPE_F16 : KILN_DTYPE_F32,
                                   (int32_t)blocks, err);
        kiln_free(nkv);
        kiln_free(hd);
    }
    if (!st) {
        e->seqs = kiln_calloc((size_t)e->max_seqs, sizeof(kiln_seq_state));
        size_t ms = (size_t)e->max_step;
        e->ids = kiln_calloc(ms, sizeof(int32_t));
        e->tok_seq = kiln_calloc(ms, sizeof(int32_t));
        e->tok_pos = kiln_calloc(ms, sizeof(int32_t));
        e->logit_rows = kiln_calloc(ms, sizeof(int32_t));
        e->step_seq = kiln_calloc((size_t)e->max_seqs, sizeof(int32_t));
        e->step_kv = kiln_calloc((size_t)e->max_seqs, sizeof(kiln_kv_seq));
        e->step_count = kiln_calloc((size_t)e->max_seqs, sizeof(int32_t));
        e->seq_slot = kiln_calloc((size_t)e->max_seqs, sizeof(int32_t));
        if (!e->seqs || !e->ids || !e->tok_seq || !e->tok_pos || !e->logit_rows || !e->step_seq ||
            !e->step_kv || !e->step_count || !e->seq_slot)
            st = kiln_err_set(err, KILN_ERR_NOMEM, "engine: out of memory");
    }
    if (!st && o->counters) {
        e->counters = kiln_calloc(KILN_OP_LIMIT, sizeof(uint64_t));
        if (!e->counters) st = kiln_err_set(err, KILN_ERR_NOMEM, "engine: out of memory");
    }
    if (!st && o->n_threads != 1) st = kiln_pool_create(o->n_threads, &e->pool, err);
    if (!st) st = kiln_mapguard_check(err); /* a model page faulted while binding */
    if (st) {
        kiln_engine_free(e);
        return st;
    }
    *out = e;
    return KILN_OK;
}

void kiln_engine_free(kiln_engine *e) {
    if (!e) return;
    if (e->seqs)
        for (int32_t i = 0; i < e->max_seqs; i++)
            if (e->seqs[i].used) {
                kiln_kv_release(&e->kv, &e->seqs[i].kv);
                kiln_free(e->seqs[i].kv.blocks);
            }
    kiln_kv_pool_free(&e->kv);
    for (int m = 0; m < 2; m++) {
        kiln_free(e->mode[m].bufs);
        kiln_free_aligned(e->mode[m].arena);
    }
    kiln_free_aligned(e->work);
    kiln_free_aligned(e->scratch);
    kiln_bound_plan_free(&e->bp);
    kiln_pool_free(e->pool);
    kiln_free(e->seqs);
    kiln_free(e->ids);
    kiln_free(e->tok_seq);
    kiln_free(e->tok_pos);
    kiln_free(e->logit_rows);
    kiln_free(e->step_seq);
    kiln_free(e->step_kv);
    kiln_free(e->step_count);
    kiln_free(e->seq_slot);
    kiln_free(e->counters);
    kiln_free(e);
}

const uint64_t *kiln_engine_counters(const kiln_engine *e) {
    return e->counters;
}

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

void kiln_seq_free(kiln_engine *e, int32_t seq) {
    kiln_seq_state *s = seq_get(e, seq);
    if (!s) return;
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

/* Grows e->scratch to the largest workspace any bound kernel of bucket b asks for (its
 * spec's workspace function; computed once per bucket), so kernels do not allocate their
 * scratch on every call. */
static kiln_status fit_scratch(kiln_engine *e, int b, kiln_err *err) {
    if (b < 0 || b >= KILN_BUCKETS) return KILN_OK;
    if (e->scratch_need[b] == SIZE_MAX) {
        size_t need = 0;
        for (int32_t i = 0; i < e->bp.plan.n_insns; i++) {
            const kiln_bound_insn *bi = &e->bp.bi[i];
            for (int si = 0; si < bi->n_sites; si++) {
                kiln_callsite cs = bi->site[si].desc;
                cs.bucket = b;
                size_t w = kiln_callsite_workspace(e->bp.be, &cs, bi->site[si].fn[b]);
                if (w > need) need = w;
            }
        }
        e->scratch_need[b] = need;
    }
    const size_t need = e->scratch_need[b];
    if (need <= e->scratch_size) return KILN_OK;
    void *p = kiln_alloc_aligned(need);
    if (!p) return kiln_err_set(err, KILN_ERR_NOMEM, "engine: %zu bytes of kernel scratch", need);
    kiln_free_aligned(e->scratch);
    e->scratch = p;
    e->scratch_size = need;
    return KILN_OK;
}

static kiln_status step(kiln_engine *e, const kiln_batch_entry *en, int32_t n, float *logits,
                        int32_t *greedy_ids, int32_t greedy_limit, kiln_err *err) {
    if (n <= 0) return KILN_OK;
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
            e->step_seq[si] = b->seq;
            e->step_count[si] = 0;
        }
        int32_t want = s->kv.len + e->step_count[si];
        if (b->pos != want)
            return kiln_err_set(
                err, KILN_ERR_INVALID_ARG,
                "entry %d: sequence %d position %d, expected %d (positions continue the sequence)",
                (int)i, (int)b->seq, (int)b->pos, (int)want);
        if (b->pos >= INT32_MAX - 1)
            return kiln_err_set(err, KILN_ERR_RANGE, "entry %d: position too large", (int)i);
        e->step_count[si]++;
        e->ids[i] = b->token;
        e->tok_seq[i] = si;
        e->tok_pos[i] = b->pos;
        if (b->want_logits) e->logit_rows[n_logits++] = i;
    }
    if (n_logits > 0 && !logits && !greedy_ids)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "%d entries want logits but no buffer was given", (int)n_logits);
    /* reserve KV: all or nothing */
    int32_t needed = 0;
    for (int32_t si = 0; si < n_seqs; si++) {
        kiln_seq_state *s = &e->seqs[e->step_seq[si]];
        int32_t have = s->kv.n_blocks;
        int32_t need = (s->kv.len + e->step_count[si] + KILN_KV_BLOCK - 1) / KILN_KV_BLOCK;
        if (need > have) needed += need - have;
    }
    int32_t avail = e->kv.max_blocks - kiln_kv_pool_used(&e->kv);
    if (needed > avail)
        return kiln_err_set(err, KILN_ERR_CAPACITY,
                            "KV cache full: step needs %d blocks, %d free of %d", (int)needed,
                            (int)avail, (int)e->kv.max_blocks);
    for (int32_t si = 0; si < n_seqs; si++) {
        kiln_seq_state *s = &e->seqs[e->step_seq[si]];
        KILN_TRY(kiln_kv_reserve(&e->kv, &s->kv, s->kv.len + e->step_count[si], err));
        e->step_kv[si].block_table = s->kv.blocks;
        e->step_kv[si].n_blocks = s->kv.n_blocks;
    }
    int mode = n <= e->mode[KILN_MODE_DECODE].tokens ? KILN_MODE_DECODE : KILN_MODE_PREFILL;
    kiln_exec x;
    memset(&x, 0, sizeof(x));
    x.kctx.pool = e->pool;
    x.t = n;
    x.bucket = kiln_bucket_of(n);
    KILN_TRY(fit_scratch(e, x.bucket, err));
    x.kctx.scratch = e->scratch;
    x.kctx.scratch_size = e->scratch_size;
    x.ids = e->ids;
    x.tok_seq = e->tok_seq;
    x.tok_pos = e->tok_pos;
    x.seqs = e->step_kv;
    x.n_seqs = n_seqs;
    x.logit_rows = e->logit_rows;
    x.n_logits = n_logits;
    x.logits = logits;
    x.greedy_ids = greedy_ids;
    x.greedy_limit = greedy_limit;
    x.bufs = e->mode[mode].bufs;
    x.work = e->work;
    x.work_floats = e->work_floats;
    x.kv = &e->kv;
    x.counters = e->counters;
    kiln_status st = kiln_exec_run(&e->bp, &x, err);
    /* a model page faulted (file truncated while mapped): not the model's output */
    if (!st && (st = kiln_mapguard_check(err)) != KILN_OK) return st;
    if (st) {
        /* circuit breaker: the failing kernel is marked unhealthy and its call sites are
         * rebound, so the next step runs the next candidate (this step still fails) */
        if (x.failed_insn >= 0) {
            kiln_plan_kernel_failed(&e->bp, x.failed_insn, x.cur_site, x.bucket, err, NULL);
            for (int b = 0; b < KILN_BUCKETS; b++) e->scratch_need[b] = SIZE_MAX;
        }
        return st;
    }
    for (int32_t si = 0; si < n_seqs; si++) e->seqs[e->step_seq[si]].kv.len += e->step_count[si];
    return KILN_OK;
}

kiln_status kiln_engine_step(kiln_engine *e, const kiln_batch_entry *en, int32_t n, float *logits,
                             kiln_err *err) {
    return step(e, en, n, logits, NULL, 0, err);
}

kiln_status kiln_engine_step_greedy(kiln_engine *e, const kiln_batch_entry *en, int32_t n,
                                    int32_t n_vocab_limit, int32_t *ids, kiln_err *err) {
    if (!ids) {
        for (int32_t i = 0; i < n; i++)
            if (en[i].want_logits)
                return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                    "entry %d wants a token but no ids buffer was given", (int)i);
    }
    return step(e, en, n, NULL, ids, n_vocab_limit, err);
}
