/* test_tp.c — tensor parallelism on the host backends (issue 15, docs/TP.md):
 *   - the host communicator: all_reduce (in rank order, bitwise equal on every rank, in
 *     place too), all_gather, broadcast, barrier, abort and reset, over 1-4 threads;
 *   - the sharding rewrite (plan/tp.c): heads, KV heads split and replicated, FFN,
 *     vocabulary, the collectives it inserts, and the shapes it refuses;
 *   - the engine as a TP group (kiln_engine_opts.tp) against TP = 1, teacher forcing:
 *     two sequences prefilled together (every row's logits), then decode steps of both,
 *     a fork (the KV block copy mirrored on every rank) and greedy steps; on synthetic
 *     f32 models of every family's shape (in memory) and on kiln-gen GGUF files of every
 *     family (q8_0 and f16) and HF safetensors (llama, gemma3; bf16), TP = 2 and 4,
 *     including GQA with fewer KV heads than ranks and a vocabulary the ranks do not
 *     divide (embedding and LM head replicated);
 *   - the scheduler over a TP group: greedy requests with shared prefixes, same tokens.
 * Tolerance: |tp - ref| <= TOL_ABS + TOL_REL * max|ref| per logits row (f32 sums in
 * another order; measured 2e-6 .. 4e-4 with q8_0 weights: docs/TP.md). */
#include "synth.h"
#include "testutil.h"

#include "format/dtype.h"
#include "load/load.h"
#include "plan/tp.h"
#include "runtime/comm.h"
#include "runtime/engine.h"
#include "sched/sched.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOL_ABS 1e-4f
#define TOL_REL 1e-4f

/* ---- the host communicator ---- */

typedef struct comm_job {
    kiln_comm *c;
    int rank, n;
    size_t count;
    int failures;
    bool abort_me; /* this rank aborts instead of joining the second reduce */
    kiln_status second;
} comm_job;

static float val(int rank, size_t i) {
    return (float)((rank + 1) * 0.37) + (float)i * 1e-3f + (rank == 2 ? 1e7f : 0.0f);
}

static void *comm_worker(void *arg) {
    comm_job *j = arg;
    const int n = j->n;
    float *in = malloc(j->count * sizeof(float)), *out = malloc(j->count * sizeof(float));
    float *g = malloc((size_t)n * 8 * sizeof(float));
    if (!in || !out || !g) {
        j->failures++;
        free(in);
        free(out);
        free(g);
        return NULL;
    }
    for (size_t i = 0; i < j->count; i++) in[i] = val(j->rank, i);
    kiln_err err;
    if (kiln_comm_all_reduce_sum_f32(j->c, j->rank, in, out, j->count, NULL, &err)) j->failures++;
    for (size_t i = 0; i < j->count; i++) {
        float s = val(0, i);
        for (int r = 1; r < n; r++) s += val(r, i); /* rank order: bitwise the same */
        if (out[i] != s) j->failures++;
    }
    /* in place */
    if (kiln_comm_all_reduce_sum_f32(j->c, j->rank, in, in, j->count, NULL, &err)) j->failures++;
    if (memcmp(in, out, j->count * sizeof(float))) j->failures++;
    /* gather: each rank 8 floats, rank r's own part in place */
    for (int i = 0; i < 8; i++) g[j->rank * 8 + i] = (float)(j->rank * 100 + i);
    if (kiln_comm_all_gather(j->c, j->rank, g + j->rank * 8, g, 8 * sizeof(float), NULL, &err))
        j->failures++;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < 8; i++)
            if (g[r * 8 + i] != (float)(r * 100 + i)) j->failures++;
    float b[3] = {(float)j->rank, 0, 0};
    if (kiln_comm_broadcast(j->c, j->rank, n - 1, b, sizeof b, NULL, &err)) j->failures++;
    if (b[0] != (float)(n - 1)) j->failures++;
    if (kiln_comm_barrier(j->c, j->rank, NULL, &err)) j->failures++;
    /* a failing rank: it aborts; the others' collective returns instead of waiting */
    if (j->abort_me)
        kiln_comm_abort(j->c);
    else
        j->second = kiln_comm_all_reduce_sum_f32(j->c, j->rank, in, out, j->count, NULL, &err);
    free(in);
    free(out);
    free(g);
    return NULL;
}

static void comm_run(int n, size_t count, bool with_abort) {
    kiln_comm *c;
    kiln_err err;
    assert_int_equal(kiln_comm_host_create(n, &c, &err), KILN_OK);
    assert_int_equal(kiln_comm_size(c), n);
    assert_string_equal(kiln_comm_kind(c), "host");
    pthread_t th[4];
    comm_job j[4];
    for (int r = 0; r < n; r++) {
        j[r] = (comm_job){.c = c, .rank = r, .n = n, .count = count};
        j[r].abort_me = with_abort && r == n - 1;
        assert_int_equal(pthread_create(&th[r], NULL, comm_worker, &j[r]), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) {
        assert_int_equal(j[r].failures, 0);
        if (with_abort && r != n - 1) assert_int_equal(j[r].second, KILN_ERR_STATE);
    }
    if (with_abort) {
        /* after a reset the group works again */
        assert_int_equal(kiln_comm_reset(c, &err), KILN_OK);
        for (int r = 0; r < n; r++) {
            j[r] = (comm_job){.c = c, .rank = r, .n = n, .count = count};
            assert_int_equal(pthread_create(&th[r], NULL, comm_worker, &j[r]), 0);
        }
        for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
        for (int r = 0; r < n; r++) assert_int_equal(j[r].failures, 0);
    }
    kiln_comm_free(c);
}

static void test_comm_host(void **state) {
    (void)state;
    for (int n = 1; n <= 4; n++) {
        comm_run(n, 1, false);
        comm_run(n, 1000, false);
        comm_run(n, 3, false); /* fewer elements than ranks: some parts are empty */
    }
    comm_run(2, 100, true);
    comm_run(4, 5000, true);
    kiln_comm *c;
    kiln_err err;
    assert_int_equal(kiln_comm_host_create(0, &c, &err), KILN_ERR_INVALID_ARG);
    assert_int_equal(kiln_comm_host_create(2, &c, &err), KILN_OK);
    float x = 1;
    assert_int_equal(kiln_comm_all_reduce_sum_f32(c, 2, &x, &x, 1, NULL, &err),
                     KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "rank 2"));
    assert_int_equal(kiln_comm_broadcast(c, 0, 5, &x, 4, NULL, &err), KILN_ERR_INVALID_ARG);
    kiln_comm_free(c);
    if (!kiln_comm_nccl_built()) {
        assert_int_equal(kiln_comm_nccl_create(2, NULL, &c, &err), KILN_ERR_UNSUPPORTED);
        assert_null(c);
    }
}

/* ---- per-want shards of the load plan (kiln_load_want.shard) ----
 * A 6 x 8 f32 matrix in memory: every row shard, column shard (native: the residual lane;
 * "f32" layout: transform) and element shard of a vector equals the slice of the
 * original, and a shard that does not divide is refused naming the tensor. */
static void test_load_want_shard(void **state) {
    (void)state;
    float mat[6 * 8], vec[12];
    for (int i = 0; i < 48; i++) mat[i] = (float)i;
    for (int i = 0; i < 12; i++) vec[i] = 100.0f + (float)i;
    kiln_tensor_info tm = {.name = "m",
                           .name_len = 1,
                           .dtype = KILN_DTYPE_F32,
                           .supported = true,
                           .rank = 2,
                           .shape = {8, 6, 1, 1},
                           .file = KILN_LOAD_MEMORY,
                           .nbytes = sizeof mat,
                           .data = mat};
    kiln_tensor_info tv = {.name = "v",
                           .name_len = 1,
                           .dtype = KILN_DTYPE_F32,
                           .supported = true,
                           .rank = 1,
                           .shape = {12, 1, 1, 1},
                           .file = KILN_LOAD_MEMORY,
                           .nbytes = sizeof vec,
                           .data = vec};
    for (int mode = KILN_SHARD_ROWS; mode <= KILN_SHARD_COLS; mode++)
        for (int count = 1; count <= 2; count++)
            for (int idx = 0; idx < count; idx++)
                for (int lay = 0; lay < 2; lay++) {
                    kiln_load_want w[2] = {{&tm,
                                            {KILN_PLACE_HOST, 0, lay ? "f32" : "native", false},
                                            mode,
                                            idx,
                                            count},
                                           {&tv,
                                            {KILN_PLACE_HOST, 0, lay ? "f32" : "native", false},
                                            KILN_SHARD_ROWS,
                                            idx,
                                            count}};
                    kiln_load_request req;
                    kiln_load_request_init(&req);
                    req.wants = w;
                    req.n_wants = 2;
                    req.threads = 1;
                    kiln_load_plan *p;
                    kiln_err err;
                    if (kiln_load_plan_build(NULL, &req, &p, &err))
                        fail_msg("plan mode %d %d/%d: %s", mode, idx, count, err.msg);
                    if (kiln_load_execute(p, &err)) fail_msg("execute: %s", err.msg);
                    const kiln_load_item *im = kiln_load_plan_item(p, 0);
                    const kiln_load_item *iv = kiln_load_plan_item(p, 1);
                    const int rows = mode == KILN_SHARD_ROWS ? 6 / count : 6;
                    const int cols = mode == KILN_SHARD_COLS ? 8 / count : 8;
                    assert_int_equal(im->shape[0], cols);
                    assert_int_equal(im->shape[1], rows);
                    float got[48], gv[12];
                    assert_int_equal(kiln_load_item_read(im, got, &err), KILN_OK);
                    for (int r = 0; r < rows; r++)
                        for (int c = 0; c < cols; c++) {
                            int sr = mode == KILN_SHARD_ROWS ? idx * rows + r : r;
                            int sc = mode == KILN_SHARD_COLS ? idx * cols + c : c;
                            assert_true(got[r * cols + c] == mat[sr * 8 + sc]);
                        }
                    if (count > 1 && mode == KILN_SHARD_COLS && !lay)
                        assert_int_equal(im->lane, KILN_LANE_RESIDUAL);
                    if (count > 1 && mode == KILN_SHARD_ROWS && !lay)
                        assert_int_equal(im->lane, KILN_LANE_ALIAS);
                    assert_int_equal(iv->shape[0], 12 / count);
                    assert_int_equal(kiln_load_item_read(iv, gv, &err), KILN_OK);
                    for (int i = 0; i < 12 / count; i++)
                        assert_true(gv[i] == vec[idx * (12 / count) + i]);
                    kiln_load_plan_free(p);
                }
    kiln_load_want bad = {&tm, {KILN_PLACE_HOST, 0, "native", false}, KILN_SHARD_ROWS, 0, 4};
    kiln_load_request req;
    kiln_load_request_init(&req);
    req.wants = &bad;
    req.n_wants = 1;
    kiln_load_plan *p = NULL;
    kiln_err err;
    assert_int_equal(kiln_load_plan_build(NULL, &req, &p, &err), KILN_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "'m'"));
    assert_non_null(strstr(err.msg, "not divisible"));
    bad.shard_index = 4;
    assert_int_equal(kiln_load_plan_build(NULL, &req, &p, &err), KILN_ERR_INVALID_ARG);
}

/* ---- the sharding rewrite ---- */

static void cfg_family(kiln_model_config *c, const char *fam, int n_vocab, int n_head,
                       int n_kv_head) {
    kt_synth_config(c, strcmp(fam, "gemma3") == 0 ? "gemma3" : "llama");
    strcpy(c->arch, fam);
    c->n_vocab = n_vocab;
    c->n_head = n_head;
    c->n_kv_head = n_kv_head;
    c->head_dim = 8;
    c->n_rot = 8;
    c->n_embd = 32;
    c->n_ff = 64;
    c->attn_scale = 1.0f / sqrtf(8.0f);
    c->qkv_bias = strcmp(fam, "qwen2") == 0;
    if (strcmp(fam, "qwen3") == 0) c->qk_norm = true;
    if (strcmp(fam, "gemma3") == 0) c->final_softcap = 30.0f; /* exercises the host softcap */
}

static int count_op(const kiln_plan *p, int op) {
    int k = 0;
    for (int32_t i = 0; i < p->n_insns; i++) k += p->insns[i].opcode == op;
    return k;
}

static const kiln_weight_ref *wref(const kiln_plan *p, const char *name) {
    for (int32_t i = 0; i < p->n_weights; i++)
        if (strcmp(p->weights[i].name, name) == 0) return &p->weights[i];
    return NULL;
}

static void test_plan_shard(void **state) {
    (void)state;
    kiln_model_config c;
    cfg_family(&c, "qwen2", 96, 8, 2);
    kiln_plan p, s;
    kiln_err err;
    kiln_tp_layout lay;
    kiln_plan_init(&p);
    assert_int_equal(kiln_decoder_compile(&c, KILN_MODE_PREFILL, &p, &err), KILN_OK);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(kiln_plan_tp_shard(&p, r, 4, &s, &lay, &err), KILN_OK);
        assert_true(lay.vocab_split);
        assert_int_equal(lay.n_vocab_local, 24);
        /* embed + attention and FFN of every layer */
        assert_int_equal(count_op(&s, KILN_OP_ALL_REDUCE), 1 + 2 * c.n_layer);
        assert_int_equal(lay.n_all_reduce, 1 + 2 * c.n_layer);
        assert_int_equal(count_op(&s, KILN_OP_GATHER_LOGITS), 1);
        assert_int_equal(kiln_plan_validate(&s, NULL, NULL, &err), KILN_OK);
        const kiln_weight_ref *q = wref(&s, "blk.0.attn_q.weight");
        const kiln_weight_ref *k = wref(&s, "blk.0.attn_k.weight");
        const kiln_weight_ref *bk = wref(&s, "blk.0.attn_k.bias");
        const kiln_weight_ref *o = wref(&s, "blk.0.attn_output.weight");
        const kiln_weight_ref *d = wref(&s, "blk.1.ffn_down.weight");
        assert_int_equal(q->shape[1], 2 * 8);
        assert_int_equal(q->shard, KILN_WSHARD_ROWS);
        assert_int_equal(q->shard_index, r);
        /* 2 KV heads over 4 ranks: each rank one KV head, ranks 0,1 head 0; 2,3 head 1 */
        assert_int_equal(k->shape[1], 8);
        assert_int_equal(k->shard_index, r / 2);
        assert_int_equal(k->shard_count, 2);
        assert_int_equal(bk->shape[0], 8);
        assert_int_equal(bk->shard_index, r / 2);
        assert_int_equal(o->shard, KILN_WSHARD_COLS);
        assert_int_equal(o->shape[0], 16);
        assert_int_equal(d->shard, KILN_WSHARD_COLS);
        assert_int_equal(d->shape[0], 16);
        assert_int_equal(wref(&s, "token_embd.weight")->shape[1], 24);
        for (int32_t i = 0; i < s.n_states; i++) assert_int_equal(s.states[i].n_kv_head, 1);
        kiln_plan_free(&s);
    }
    /* a vocabulary 4 does not divide: embed and LM head replicated, no gather */
    kiln_plan_free(&p);
    cfg_family(&c, "llama", 97, 8, 8);
    kiln_plan_init(&p);
    assert_int_equal(kiln_decoder_compile(&c, KILN_MODE_PREFILL, &p, &err), KILN_OK);
    assert_int_equal(kiln_plan_tp_shard(&p, 1, 4, &s, &lay, &err), KILN_OK);
    assert_false(lay.vocab_split);
    assert_int_equal(count_op(&s, KILN_OP_GATHER_LOGITS), 0);
    assert_int_equal(count_op(&s, KILN_OP_ALL_REDUCE), 2 * c.n_layer);
    assert_int_equal(wref(&s, "blk.0.attn_k.weight")->shape[1], 2 * 8);
    assert_int_equal(wref(&s, "token_embd.weight")->shard, KILN_WSHARD_NONE);
    kiln_plan_free(&s);
    /* shapes that do not split */
    assert_int_equal(kiln_plan_tp_shard(&p, 0, 3, &s, &lay, &err), KILN_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "heads"));
    kiln_plan_free(&s);
    assert_int_equal(kiln_plan_tp_shard(&p, 4, 4, &s, &lay, &err), KILN_ERR_INVALID_ARG);
    kiln_plan_free(&s);
    kiln_plan_free(&p);
    cfg_family(&c, "llama", 96, 6, 3);
    kiln_plan_init(&p);
    assert_int_equal(kiln_decoder_compile(&c, KILN_MODE_PREFILL, &p, &err), KILN_OK);
    assert_int_equal(kiln_plan_tp_shard(&p, 0, 2, &s, &lay, &err), KILN_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "KV heads"));
    kiln_plan_free(&s);
    kiln_plan_free(&p);
}

/* ---- the engine as a TP group against TP = 1 ---- */

typedef struct run_out {
    float *logits; /* every logits row of the run, in order */
    size_t n, cap;
    int32_t *greedy;
    int n_greedy;
} run_out;

static void push(run_out *o, const float *l, size_t n) {
    if (o->n + n > o->cap) {
        o->cap = (o->n + n) * 2;
        o->logits = realloc(o->logits, o->cap * sizeof(float));
        assert_non_null(o->logits);
    }
    memcpy(o->logits + o->n, l, n * sizeof(float));
    o->n += n;
}

/* Teacher forcing over fixed token streams: two sequences prefilled in one step (15
 * and 20 tokens, every row wants logits), 6 decode steps of both, then a fork of the
 * second (its partial last block is copied: kv.h) and 4 decode steps of the parent and
 * the child with different tokens, then 3 greedy steps. */
static void drive(const kiln_model *m, const char *backend, int tp, int threads, run_out *o) {
    kiln_engine_opts eo;
    kiln_engine_opts_default(&eo);
    eo.backend = backend;
    eo.n_threads = threads;
    eo.n_ctx = 512;
    eo.max_seqs = 8;
    eo.max_step_tokens = 64;
    eo.tp = tp;
    kiln_engine *e;
    kiln_err err;
    if (kiln_engine_create(m, &eo, &e, &err)) fail_msg("engine tp=%d: %s", tp, err.msg);
    const int32_t V = kiln_engine_n_vocab(e);
    assert_int_equal(V, m->cfg.n_vocab);
    int32_t s[3];
    assert_int_equal(kiln_seq_create(e, &s[0], &err), KILN_OK);
    assert_int_equal(kiln_seq_create(e, &s[1], &err), KILN_OK);
    kiln_batch_entry b[64];
    int nb = 0;
    for (int i = 0; i < 15; i++) b[nb++] = (kiln_batch_entry){s[0], (i * 7 + 3) % V, i, 1};
    for (int i = 0; i < 20; i++) b[nb++] = (kiln_batch_entry){s[1], (i * 11 + 5) % V, i, 1};
    float *l = malloc((size_t)64 * (size_t)V * sizeof(float));
    assert_non_null(l);
    if (kiln_engine_step(e, b, nb, l, &err)) fail_msg("prefill tp=%d: %s", tp, err.msg);
    push(o, l, (size_t)nb * (size_t)V);
    int32_t pos[3] = {15, 20, 0};
    for (int st = 0; st < 6; st++) {
        b[0] = (kiln_batch_entry){s[0], (st * 5 + 1) % V, pos[0]++, 1};
        b[1] = (kiln_batch_entry){s[1], (st * 3 + 2) % V, pos[1]++, 1};
        if (kiln_engine_step(e, b, 2, l, &err)) fail_msg("decode tp=%d: %s", tp, err.msg);
        push(o, l, 2 * (size_t)V);
    }
    assert_int_equal(kiln_seq_fork(e, s[1], &s[2], &err), KILN_OK);
    pos[2] = pos[1];
    for (int st = 0; st < 4; st++) {
        b[0] = (kiln_batch_entry){s[1], (st * 13 + 1) % V, pos[1]++, 1};
        b[1] = (kiln_batch_entry){s[2], (st * 17 + 4) % V, pos[2]++, 1};
        if (kiln_engine_step(e, b, 2, l, &err)) fail_msg("fork decode tp=%d: %s", tp, err.msg);
        push(o, l, 2 * (size_t)V);
    }
    o->greedy = calloc(8, sizeof(int32_t));
    int32_t ids[3];
    for (int st = 0; st < 3; st++) {
        b[0] = (kiln_batch_entry){s[0], st == 0 ? 1 : ids[0], pos[0]++, 1};
        b[1] = (kiln_batch_entry){s[2], st == 0 ? 2 : ids[1], pos[2]++, 1};
        if (kiln_engine_step_greedy(e, b, 2, 0, ids, &err))
            fail_msg("greedy tp=%d: %s", tp, err.msg);
        o->greedy[o->n_greedy++] = ids[0];
        o->greedy[o->n_greedy++] = ids[1];
    }
    /* one more through prepare/run and the accessors (the scheduler's path) */
    b[0] = (kiln_batch_entry){s[0], ids[0], pos[0]++, 1};
    kiln_step_opts so = {.greedy = 1};
    assert_int_equal(kiln_engine_prepare(e, b, 1, &so, &err), KILN_OK);
    if (kiln_engine_run(e, &err)) fail_msg("greedy run tp=%d: %s", tp, err.msg);
    assert_int_equal(kiln_engine_n_outputs(e), 1);
    o->greedy[o->n_greedy++] = kiln_engine_token(e, 0);
    assert_true(o->greedy[o->n_greedy - 1] >= 0);
    free(l);
    kiln_engine_free(e);
}

static void compare(const run_out *ref, const run_out *tp, int32_t V, const char *what) {
    assert_int_equal(ref->n, tp->n);
    double worst = 0;
    for (size_t r = 0; r < ref->n / (size_t)V; r++) {
        const float *a = ref->logits + r * (size_t)V, *b = tp->logits + r * (size_t)V;
        float amax = 0;
        for (int32_t i = 0; i < V; i++) amax = fmaxf(amax, fabsf(a[i]));
        for (int32_t i = 0; i < V; i++) {
            float d = fabsf(a[i] - b[i]);
            if (!(d <= TOL_ABS + TOL_REL * amax))
                fail_msg("%s: row %zu id %d: tp %g, tp=1 %g", what, r, (int)i, (double)b[i],
                         (double)a[i]);
            if (d > worst) worst = d;
        }
    }
    /* greedy steps: the same ids unless two logits tie within the tolerance (the test
     * models are random, so a tie is unlikely; a differing id is reported) */
    for (int i = 0; i < ref->n_greedy; i++)
        if (ref->greedy[i] != tp->greedy[i])
            fail_msg("%s: greedy step %d: tp id %d, tp=1 id %d", what, i / 2, (int)tp->greedy[i],
                     (int)ref->greedy[i]);
    print_message("  %-34s rows %4zu  max |diff| %.2e\n", what, ref->n / (size_t)V, worst);
}

static void run_free(run_out *o) {
    free(o->logits);
    free(o->greedy);
    memset(o, 0, sizeof(*o));
}

static void check_model(const kiln_model *m, const char *backend, const char *name, int max_tp) {
    run_out ref = {0};
    drive(m, backend, 1, 1, &ref);
    for (int tp = 2; tp <= max_tp; tp *= 2) {
        run_out o = {0};
        drive(m, backend, tp, 1, &o);
        char what[96];
        snprintf(what, sizeof what, "%s %s tp=%d", name, backend, tp);
        compare(&ref, &o, m->cfg.n_vocab, what);
        run_free(&o);
    }
    /* threads shared out among ranks (2 each) */
    run_out o = {0};
    drive(m, backend, 2, 4, &o);
    char what[96];
    snprintf(what, sizeof what, "%s %s tp=2 4 threads", name, backend);
    compare(&ref, &o, m->cfg.n_vocab, what);
    run_free(&o);
    run_free(&ref);
}

static void test_engine_synth(void **state) {
    (void)state;
    static const char *fams[] = {"llama", "qwen2", "qwen3", "gemma3"};
    /* (vocab, heads, KV heads): GQA with fewer KV heads than 4 ranks, MHA, a vocabulary
     * 4 does not divide, one KV head */
    static const int shapes[][3] = {{96, 8, 2}, {96, 4, 4}, {98, 8, 8}, {96, 4, 1}};
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++)
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            kiln_model_config c;
            cfg_family(&c, fams[f], shapes[k][0], shapes[k][1], shapes[k][2]);
            kt_synth s;
            kt_synth_make(&s, &c, 1000 + f * 10 + k);
            char name[64];
            snprintf(name, sizeof name, "%s V%d h%d/%d", fams[f], shapes[k][0], shapes[k][1],
                     shapes[k][2]);
            check_model(s.m, "cpu", name, 4);
            if (k == 0) check_model(s.m, "ref", name, 2);
            kt_synth_free(&s);
        }
}

/* kiln-gen GGUF files of every family (the families' own configure from metadata) */
static void test_engine_gguf(void **state) {
    (void)state;
    const char *bin = getenv("KILN_BINARY_DIR");
    if (!bin) bin = ".";
    char gen[1024];
    snprintf(gen, sizeof gen, "%s/kiln-gen", bin);
    if (access(gen, X_OK) != 0) fail_msg("kiln-gen not found at %s (build target kiln-gen)", gen);
    char dir[] = "/tmp/kiln_tp_XXXXXX";
    assert_non_null(mkdtemp(dir));
    static const char *fams[] = {"llama", "qwen2", "qwen3", "gemma3"};
    static const char *types[] = {"q8_0", "f16"};
    for (size_t f = 0; f < 4; f++)
        for (size_t t = 0; t < 2; t++) {
            char path[1200], cmd[2600];
            snprintf(path, sizeof path, "%s/%s-%s.gguf", dir, fams[f], types[t]);
            snprintf(cmd, sizeof cmd, "'%s' -q -f %s -t %s --layers 2 -o '%s'", gen, fams[f],
                     types[t], path);
            if (system(cmd) != 0) fail_msg("%s failed", cmd);
            kiln_model *m;
            kiln_err err;
            if (kiln_model_load(path, &m, &err)) fail_msg("load %s: %s", path, err.msg);
            char name[64];
            snprintf(name, sizeof name, "gguf %s %s", fams[f], types[t]);
            check_model(m, "cpu", name, t == 0 ? 4 : 2);
            kiln_model_free(m);
            unlink(path);
        }
    /* safetensors + config.json (HF layout: NEOX rope, Gemma norms stored as w - 1) */
    for (size_t f = 0; f < 4; f += 3) {
        char path[1200], cmd[2600];
        snprintf(path, sizeof path, "%s/hf-%s", dir, fams[f]);
        snprintf(cmd, sizeof cmd, "'%s' -q -f %s -t bf16 --layers 2 --format hf -o '%s'", gen,
                 fams[f], path);
        if (system(cmd) != 0) fail_msg("%s failed", cmd);
        kiln_model *m;
        kiln_err err;
        if (kiln_model_load(path, &m, &err)) fail_msg("load %s: %s", path, err.msg);
        char name[64];
        snprintf(name, sizeof name, "hf %s bf16", fams[f]);
        check_model(m, "cpu", name, 2);
        kiln_model_free(m);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
        if (system(cmd) != 0) fail_msg("%s failed", cmd);
    }
    rmdir(dir);
}

/* ---- the scheduler over a TP group: one engine to it ----
 * 24 greedy requests (a third share a 40-token prefix, so the prefix cache attaches
 * shared blocks; prompts cross KV blocks), arriving over the first steps, chunked
 * prefill mixed with decode: every request's tokens under TP = 2 and 4 equal TP = 1's,
 * and every KV block is back at the end. */
typedef struct rec {
    int32_t tok[64];
    int32_t n, finals;
} rec;

static kiln_sink_result rec_sink(void *user, const kiln_token_event *ev) {
    rec *o = user;
    if (ev->token >= 0 && o->n < 64) o->tok[o->n++] = ev->token;
    if (ev->finish) o->finals++;
    return KILN_SINK_OK;
}

static void sched_run(const kiln_model *m, int tp, rec *out, int n_req) {
    kiln_engine_opts eo;
    kiln_engine_opts_default(&eo);
    eo.backend = "cpu";
    eo.n_threads = 1;
    eo.n_ctx = 4096;
    eo.max_step_tokens = 64;
    eo.max_seqs = 16;
    eo.tp = tp;
    kiln_engine *e;
    kiln_err err;
    if (kiln_engine_create(m, &eo, &e, &err)) fail_msg("engine tp=%d: %s", tp, err.msg);
    kiln_sched_opts so;
    kiln_sched_opts_default(&so);
    so.step_tokens = 48;
    kiln_sched *s;
    if (kiln_sched_create(e, NULL, &so, &s, &err)) fail_msg("sched: %s", err.msg);
    kt_rng r;
    kt_rng_seed(&r, 99);
    static int32_t prompts[64][90];
    int32_t plen[64];
    for (int k = 0; k < n_req; k++) {
        plen[k] = 10 + (int32_t)(kt_rng_u64(&r) % 70);
        for (int i = 0; i < plen[k]; i++)
            prompts[k][i] = k % 3 == 0 && i < 40
                                ? (i * 5 + 1) % m->cfg.n_vocab
                                : (int32_t)(kt_rng_u64(&r) % (uint64_t)m->cfg.n_vocab);
    }
    int submitted = 0;
    for (int step = 0; step < 100000; step++) {
        for (; submitted < n_req && submitted <= step * 2; submitted++) {
            kiln_request_params rp;
            kiln_request_params_default(&rp);
            rp.prompt = prompts[submitted];
            rp.n_prompt = plen[submitted];
            rp.max_tokens = 6 + submitted % 9;
            rp.sampling.temperature = 0;
            rp.sink = rec_sink;
            rp.user = &out[submitted];
            uint64_t id;
            kiln_rejection rej;
            if (kiln_sched_submit(s, &rp, &id, &rej, &err)) fail_msg("submit: %s", err.msg);
        }
        bool w = false;
        if (kiln_sched_step(s, &w, &err)) fail_msg("step tp=%d: %s", tp, err.msg);
        if (!w && submitted == n_req) break;
    }
    for (int k = 0; k < n_req; k++) assert_int_equal(out[k].finals, 1);
    kiln_sched_stats st;
    kiln_sched_stats_get(s, &st);
    assert_true(st.prefix_hit_tokens > 0); /* shared blocks were attached (mirrored KV) */
    print_message("  scheduler tp=%d: %llu steps, prefix hits %llu tokens\n", tp,
                  (unsigned long long)st.steps, (unsigned long long)st.prefix_hit_tokens);
    kiln_sched_free(s);
    assert_int_equal(kiln_kv_pool_used(&e->kv), 0);
    kiln_engine_free(e);
}

static void test_sched_tp(void **state) {
    (void)state;
    kiln_model_config c;
    cfg_family(&c, "gemma3", 96, 8, 2);
    kt_synth s;
    kt_synth_make(&s, &c, 5);
    enum { N = 24 };
    static rec ref[N], got[N];
    memset(ref, 0, sizeof ref);
    sched_run(s.m, 1, ref, N);
    for (int tp = 2; tp <= 4; tp *= 2) {
        memset(got, 0, sizeof got);
        sched_run(s.m, tp, got, N);
        for (int k = 0; k < N; k++) {
            assert_int_equal(got[k].n, ref[k].n);
            for (int i = 0; i < ref[k].n; i++)
                if (got[k].tok[i] != ref[k].tok[i])
                    fail_msg("sched tp=%d request %d token %d: %d, tp=1 %d", tp, k, i,
                             got[k].tok[i], ref[k].tok[i]);
        }
        print_message("  scheduler tp=%d: %d requests, tokens equal tp=1\n", tp, N);
    }
    kt_synth_free(&s);
}

/* errors: a group larger than the heads split into; an unknown backend */
static void test_engine_errors(void **state) {
    (void)state;
    kiln_model_config c;
    cfg_family(&c, "llama", 96, 4, 2);
    kt_synth s;
    kt_synth_make(&s, &c, 7);
    kiln_engine_opts eo;
    kiln_engine_opts_default(&eo);
    eo.backend = "cpu";
    eo.n_threads = 1;
    eo.n_ctx = 128;
    eo.tp = 8;
    kiln_engine *e = NULL;
    kiln_err err;
    assert_int_equal(kiln_engine_create(s.m, &eo, &e, &err), KILN_ERR_UNSUPPORTED);
    assert_null(e);
    assert_non_null(strstr(err.msg, "heads"));
    eo.tp = -1;
    assert_int_equal(kiln_engine_create(s.m, &eo, &e, &err), KILN_ERR_INVALID_ARG);
    eo.tp = 2;
    eo.backend = "nope";
    assert_int_not_equal(kiln_engine_create(s.m, &eo, &e, &err), KILN_OK);
    kt_synth_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_comm_host),     cmocka_unit_test(test_load_want_shard),
        cmocka_unit_test(test_plan_shard),    cmocka_unit_test(test_engine_synth),
        cmocka_unit_test(test_engine_gguf),   cmocka_unit_test(test_sched_tp),
        cmocka_unit_test(test_engine_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
