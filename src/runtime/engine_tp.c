/*
 * engine_tp.c — a tensor-parallel group driven as one engine (engine.h, docs/TP.md).
 *
 * kiln_tp_engine_create makes n engines, one per rank, each binding its shard of the plan
 * (plan/tp.h) and loading its weights through its own load plan; rank 0 (the leader) is
 * returned. The followers' KV pools mirror the leader's (kv.h): same block ids, their own
 * KV heads. Each follower has a thread that waits for a step, runs the follower's bound
 * plan on the leader's prepared step, and reports; the leader runs its own part on the
 * caller's thread. The ranks meet in the plan's collectives (runtime/comm.h); a rank that
 * fails aborts the communicator so the others return instead of waiting.
 */
#include "runtime/comm.h"
#include "runtime/engine.h"

#include "base/log.h"
#include "base/mem.h"

#include <pthread.h>
#include <string.h>

typedef struct kiln_tp_group {
    int n;
    kiln_comm *comm;
    kiln_engine **rank; /* [n]; rank[0] is the leader (not owned here) */
    kiln_kv_pool **mirror;
    pthread_t *thread;
    int n_threads; /* started */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t gen; /* steps started */
    int n_done;   /* followers finished with the current step */
    bool quit;
} kiln_tp_group;

static void *follower_main(void *arg) {
    kiln_engine *f = arg;
    kiln_tp_group *g = f->tp; /* set (borrowed) before the thread started */
    uint64_t seen = 0;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (g->gen == seen && !g->quit) pthread_cond_wait(&g->cv, &g->mu);
        if (g->quit) break;
        seen = g->gen;
        pthread_mutex_unlock(&g->mu);
        kiln_err_clear(&f->tp_err);
        f->tp_x.kctx.err = &f->tp_err;
        kiln_status st = kiln_device_bind_thread(&f->dev, &f->tp_err);
        if (!st) st = kiln_exec_run(&f->bp, &f->tp_x, &f->tp_err);
        if (!st) st = kiln_device_sync(&f->dev, &f->tp_err);
        if (st) kiln_comm_abort(g->comm); /* the others must not wait for this rank */
        f->tp_st = st;
        pthread_mutex_lock(&g->mu);
        g->n_done++;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

int kiln_engine_tp_size(const kiln_engine *e) {
    return e && e->tp ? e->tp->n : 1;
}

const struct kiln_load_plan *kiln_engine_rank_load_plan(const kiln_engine *e, int rank) {
    if (!e || rank < 0 || rank >= kiln_engine_tp_size(e)) return NULL;
    return kiln_engine_load_plan(e->tp ? e->tp->rank[rank] : e);
}

void kiln_tp_group_free(kiln_engine *e) {
    kiln_tp_group *g = e ? e->tp : NULL;
    if (!g || e->tp_rank != 0) return;
    pthread_mutex_lock(&g->mu);
    g->quit = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < g->n_threads; i++) pthread_join(g->thread[i], NULL);
    e->kv.mirror = NULL;
    e->kv.n_mirror = 0;
    for (int r = 1; r < g->n; r++)
        if (g->rank[r]) {
            g->rank[r]->tp = NULL;
            kiln_engine_free(g->rank[r]);
        }
    kiln_comm_free(g->comm);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    kiln_free(g->rank);
    kiln_free(g->mirror);
    kiln_free(g->thread);
    kiln_free(g);
    e->tp = NULL;
    e->comm = NULL;
}

kiln_status kiln_tp_engine_create(const kiln_model *m, const kiln_engine_opts *o, kiln_engine **out,
                                  kiln_err *err) {
    *out = NULL;
    const int n = o->tp;
    const kiln_backend *be = kiln_backend_find(o->backend ? o->backend : "ref");
    kiln_comm *comm = NULL;
    if (be && be->host_memory)
        KILN_TRY(kiln_comm_host_create(n, &comm, err));
    else if (be)
        KILN_TRY(kiln_comm_nccl_create(n, NULL, &comm, err));
    /* (an unknown backend: kiln_engine_create_rank says so) */
    kiln_tp_group *g = kiln_calloc(1, sizeof(*g));
    if (g) {
        g->rank = kiln_calloc((size_t)n, sizeof(*g->rank));
        g->mirror = kiln_calloc((size_t)n, sizeof(*g->mirror));
        g->thread = kiln_calloc((size_t)n, sizeof(*g->thread));
    }
    if (!g || !g->rank || !g->mirror || !g->thread) {
        if (g) {
            kiln_free(g->rank);
            kiln_free(g->mirror);
            kiln_free(g->thread);
        }
        kiln_free(g);
        kiln_comm_free(comm);
        return kiln_err_set(err, KILN_ERR_NOMEM, "tensor-parallel group of %d ranks", n);
    }
    g->n = n;
    g->comm = comm;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    kiln_status st = KILN_OK;
    for (int r = 0; r < n && !st; r++) {
        st = kiln_engine_create_rank(m, o, r, n, comm, &g->rank[r], err);
        if (st) kiln_err_wrap(err, st, "tensor parallel over %d ranks", n);
    }
    kiln_engine *lead = g->rank[0];
    if (!st) {
        lead->tp = g;
        for (int r = 1; r < n; r++) {
            g->rank[r]->tp = g; /* borrowed: followers find the group here */
            g->mirror[r - 1] = &g->rank[r]->kv;
            if (g->rank[r]->kv.max_blocks != lead->kv.max_blocks)
                st = kiln_err_set(err, KILN_ERR_INTERNAL,
                                  "tensor parallel: rank %d has %d KV blocks, rank 0 %d", r,
                                  (int)g->rank[r]->kv.max_blocks, (int)lead->kv.max_blocks);
        }
        lead->kv.mirror = g->mirror;
        lead->kv.n_mirror = n - 1;
    }
    if (!st) st = kiln_device_bind_thread(&lead->dev, err); /* the caller drives rank 0 */
    for (int r = 1; r < n && !st; r++) {
        if (pthread_create(&g->thread[r - 1], NULL, follower_main, g->rank[r]) != 0)
            st = kiln_err_set(err, KILN_ERR_NOMEM, "tensor parallel: thread of rank %d", r);
        else
            g->n_threads++;
    }
    if (st) {
        if (lead && lead->tp == g) {
            kiln_engine_free(lead); /* frees the group */
        } else {
            for (int r = 0; r < n; r++)
                if (g->rank[r]) {
                    g->rank[r]->tp = NULL;
                    kiln_engine_free(g->rank[r]);
                }
            kiln_comm_free(comm);
            pthread_mutex_destroy(&g->mu);
            pthread_cond_destroy(&g->cv);
            kiln_free(g->rank);
            kiln_free(g->mirror);
            kiln_free(g->thread);
            kiln_free(g);
        }
        return st;
    }
    KILN_INFO("tensor parallel: %d ranks (%s communicator), vocabulary %s, %d all-reduces per "
              "step",
              n, kiln_comm_kind(comm), lead->tp_layout.vocab_split ? "split" : "replicated",
              (int)lead->tp_layout.n_all_reduce);
    *out = lead;
    return KILN_OK;
}

kiln_status kiln_tp_prepare(kiln_engine *e, int slot, const int32_t *in, size_t bytes,
                            kiln_err *err) {
    kiln_tp_group *g = e->tp;
    if (!g || e->dev.be->host_memory) return KILN_OK; /* followers read the leader's copy */
    kiln_status st = KILN_OK;
    for (int r = 1; r < g->n && !st; r++) {
        kiln_engine *f = g->rank[r];
        st = kiln_device_bind_thread(&f->dev, err);
        if (!st) st = kiln_engine_grow_buf(f, &f->slot[slot].dev, KILN_MEM_DEVICE, bytes, err);
        if (!st) st = kiln_buf_h2d(&f->dev, &f->slot[slot].dev, 0, in, bytes, err);
    }
    kiln_status b = kiln_device_bind_thread(&e->dev, st ? NULL : err); /* the caller's again */
    return st ? st : b;
}

/* A rank's logits buffers for this step: the shard it computes and, with a vocabulary
 * split, where gather_logits assembles the full rows. */
static kiln_status rank_outputs(kiln_engine *f, kiln_exec *x, float *full, int32_t n_logits,
                                kiln_err *err) {
    if (n_logits == 0) return KILN_OK;
    const kiln_tp_layout *l = &f->tp_layout;
    const size_t rows = (size_t)n_logits;
    if (!full) {
        KILN_TRY(kiln_engine_grow_buf(f, &f->tp_full, KILN_MEM_DEVICE,
                                      rows * (size_t)l->n_vocab * sizeof(float), err));
        full = f->tp_full.ptr;
    }
    if (!l->vocab_split) {
        x->logits = full; /* every rank computes the whole (replicated) LM head */
        return KILN_OK;
    }
    KILN_TRY(kiln_engine_grow_buf(f, &f->tp_shard, KILN_MEM_DEVICE,
                                  rows * (size_t)l->n_vocab_local * sizeof(float), err));
    KILN_TRY(kiln_engine_grow_buf(f, &f->tp_tmp, KILN_MEM_DEVICE,
                                  rows * (size_t)l->n_vocab * sizeof(float), err));
    x->logits = f->tp_shard.ptr;
    x->logits_full = full;
    x->logits_tmp = f->tp_tmp.ptr;
    return KILN_OK;
}

kiln_status kiln_tp_run(kiln_engine *e, kiln_exec *x0, float *logits_full, kiln_err *err) {
    kiln_tp_group *g = e->tp;
    const kiln_prepared *pp = &e->prep;
    /* the mode kiln_engine_run_into chose for the leader (the same rule) */
    const int mode =
        pp->t <= e->mode[KILN_MODE_DECODE].tokens ? KILN_MODE_DECODE : KILN_MODE_PREFILL;
    KILN_TRY(rank_outputs(e, x0, logits_full, pp->n_logits, err));
    for (int r = 1; r < g->n; r++) {
        kiln_engine *f = g->rank[r];
        const int32_t *in =
            e->dev.be->host_memory ? e->slot[pp->slot].dev.ptr : f->slot[pp->slot].dev.ptr;
        kiln_err_clear(&f->tp_err);
        kiln_status st = kiln_engine_exec_setup(f, pp, in, mode, &f->tp_x, &f->tp_err);
        if (!st) st = rank_outputs(f, &f->tp_x, NULL, pp->n_logits, &f->tp_err);
        if (st) {
            kiln_err_set(err, st, "tensor-parallel rank %d: %s", r, f->tp_err.msg);
            return st;
        }
    }
    pthread_mutex_lock(&g->mu);
    g->n_done = 0;
    g->gen++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    kiln_status st = kiln_device_bind_thread(&e->dev, err);
    if (!st) st = kiln_exec_run(&e->bp, x0, err);
    if (!st) st = kiln_device_sync(&e->dev, err);
    if (st) kiln_comm_abort(g->comm);
    pthread_mutex_lock(&g->mu);
    while (g->n_done < g->n - 1) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    /* the first failure that is not another rank's abort is the cause */
    int bad = st && st != KILN_ERR_STATE ? 0 : -1;
    for (int r = 1; r < g->n && bad < 0; r++)
        if (g->rank[r]->tp_st && g->rank[r]->tp_st != KILN_ERR_STATE) bad = r;
    for (int r = 1; r < g->n && bad < 0 && !st; r++)
        if (g->rank[r]->tp_st) bad = r;
    if (bad < 0 && st) bad = 0;
    if (bad < 0) return KILN_OK;
    kiln_err reset_err;
    kiln_status rs = kiln_comm_reset(g->comm, &reset_err);
    if (bad > 0) {
        kiln_engine *f = g->rank[bad];
        st = kiln_err_set(err, f->tp_st, "tensor-parallel rank %d: %s", bad, f->tp_err.msg);
        x0->failed_insn = -1; /* the leader's kernels did not fault */
    } else {
        kiln_err_wrap(err, st, "tensor-parallel rank 0");
    }
    if (rs) KILN_WARN("tensor parallel: %s", reset_err.msg);
    return st;
}
