/*
 * adapters.c — the adapters: each macro-op as a sequence of kernel calls through the
 * instruction's dispatch table, over every token of the step at once. One composition
 * for every backend: backends supply kernels and memory (backend.h), and nothing here
 * dereferences a buffer (registers, workspace, KV, packed inputs are in the device's
 * memory; copies go through the device). Registers are row-major [t][width]; the
 * workspace x->work holds the intermediates (q, k, v, attention output; gate, up).
 */
#include "runtime/exec.h"
#include "runtime/comm.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* the kernel of call site s for the step's bucket; remembers s and the bucket so a
 * failure can be traced to its kernel */
#define FN(bi, s, x)      FN_B(bi, s, x, (x)->bucket)
#define FN_B(bi, s, x, b) ((x)->cur_site = (s), (x)->cur_bucket = (b), (bi)->site[s].fn[b])

static kiln_status add_adapter(kiln_exec *x, const kiln_bound_insn *bi) {
    int64_t n = bi->width_out[0];
    kiln_add_args a = {.a = kiln_reg_in(x, bi, 0),
                       .b = kiln_reg_in(x, bi, 1),
                       .y = kiln_reg_out(x, bi, 0),
                       .t = x->t,
                       .n = n,
                       .a_stride = n,
                       .b_stride = n,
                       .y_stride = n};
    return FN(bi, KILN_SITE_ADD, x).add(&x->kctx, &a);
}

static kiln_status embed_adapter(kiln_exec *x, const kiln_bound_insn *bi) {
    const kiln_bound_weight *w = &bi->w[KILN_W_EMBED_TABLE];
    kiln_embed_args a = {.w = w->data,
                         .w_dtype = w->dtype,
                         .w_row_bytes = w->row_bytes,
                         .n_vocab = w->n,
                         .dim = w->k,
                         .ids = x->ids,
                         .t = x->t,
                         .y = kiln_reg_out(x, bi, 0),
                         .y_stride = bi->width_out[0],
                         .scale = bi->prm.embed.scale,
                         .shard = bi->prm.embed.vocab_shard != 0,
                         .id_base = bi->prm.embed.vocab_base};
    return FN(bi, KILN_SITE_EMBED, x).embed(&x->kctx, &a);
}

static kiln_status norm_adapter(kiln_exec *x, const kiln_bound_insn *bi) {
    int64_t n = bi->width_out[0];
    kiln_rms_norm_args a = {.x = kiln_reg_in(x, bi, 0),
                            .y = kiln_reg_out(x, bi, 0),
                            .w = bi->w[KILN_W_NORM].data,
                            .w_offset = bi->prm.norm.w_offset,
                            .rows = x->t,
                            .n = n,
                            .x_stride = n,
                            .y_stride = n,
                            .eps = bi->prm.norm.eps};
    return FN(bi, KILN_SITE_NORM, x).rms_norm(&x->kctx, &a);
}

/* A residual add and the RMS norm of its sum (the next instruction) as one call of the
 * norm kernel: x = the add's first input, r = its second, s = the add's output (the sum
 * keeps its own buffer: passes.c never lets an output share an input's), y = the norm's
 * output. The sum is the same f32 addition as the add kernel's, so every value is the two
 * calls' (test_cuda_kernels / test_cpu_ops check the kernels, the e2e tests the models).
 * One launch and one pass over the sum less per pair: 2 per layer (issue 17).
 * KILN_ERR_UNSUPPORTED: not such a pair (the caller runs the two adapters). */
static _Atomic int add_norm_on = -1;    /* KILN_ADD_NORM=0: two calls (A/B) */
static _Atomic uint64_t add_norm_pairs; /* pairs run fused since the process started */

void kiln_adapter_add_norm_enable(int on) {
    atomic_store_explicit(&add_norm_on, on ? 1 : 0, memory_order_relaxed);
}

uint64_t kiln_adapter_add_norm_count(void) {
    return atomic_load_explicit(&add_norm_pairs, memory_order_relaxed);
}

/* the norm fusions (this one and the joint q/k norm below) on? */
static int norm_fusion_on(void) {
    int on = atomic_load_explicit(&add_norm_on, memory_order_relaxed);
    if (on < 0) {
        const char *e = getenv("KILN_ADD_NORM");
        on = !(e && e[0] == '0');
        atomic_store_explicit(&add_norm_on, on, memory_order_relaxed);
    }
    return on;
}

kiln_status kiln_adapter_add_norm(kiln_exec *x, const kiln_bound_insn *add,
                                  const kiln_bound_insn *norm) {
    if (!norm_fusion_on() || add->insn->opcode != KILN_OP_RESIDUAL_ADD ||
        norm->insn->opcode != KILN_OP_RMS_NORM || add->insn->n_in != 2 ||
        norm->insn->in[0] != add->insn->out[0] || norm->width_out[0] != add->width_out[0])
        return KILN_ERR_UNSUPPORTED;
    const int64_t n = norm->width_out[0];
    kiln_rms_norm_args a = {.x = kiln_reg_in(x, add, 0),
                            .r = kiln_reg_in(x, add, 1),
                            .s = kiln_reg_out(x, add, 0),
                            .y = kiln_reg_out(x, norm, 0),
                            .w = norm->w[KILN_W_NORM].data,
                            .w_offset = norm->prm.norm.w_offset,
                            .rows = x->t,
                            .n = n,
                            .x_stride = n,
                            .r_stride = n,
                            .s_stride = n,
                            .y_stride = n,
                            .eps = norm->prm.norm.eps};
    atomic_fetch_add_explicit(&add_norm_pairs, 1, memory_order_relaxed);
    return FN(norm, KILN_SITE_NORM, x).rms_norm(&x->kctx, &a);
}

static kiln_matmul_args mm_args(const kiln_bound_weight *w, const kiln_bound_weight *bias,
                                const float *in, int64_t in_stride, float *out, int64_t out_stride,
                                int64_t t) {
    return (kiln_matmul_args){.w = w->data,
                              .w_dtype = w->dtype,
                              .w_layout = w->layout,
                              .w_row_bytes = w->row_bytes,
                              .n = w->n,
                              .k = w->k,
                              .x = in,
                              .x_stride = in_stride,
                              .y = out,
                              .y_stride = out_stride,
                              .t = t,
                              .bias = bias ? bias->data : NULL};
}

static kiln_status matmul(kiln_exec *x, const kiln_bound_insn *bi, int s,
                          const kiln_bound_weight *w, const kiln_bound_weight *bias,
                          const float *in, int64_t in_stride, float *out, int64_t out_stride,
                          int64_t t) {
    kiln_matmul_args a = mm_args(w, bias, in, in_stride, out, out_stride, t);
    return FN(bi, s, x).matmul(&x->kctx, &a);
}

/* the kernel bound to call site s, without making s the current site */
#define SITE_FN(bi, s, x) ((bi)->site[s].fn[(x)->bucket])

static kiln_status attention_adapter(kiln_exec *x, const kiln_bound_insn *bi) {
    const kiln_attn_params *p = &bi->prm.attn;
    const int64_t t = x->t, E = bi->width_in[0];
    const int64_t qd = (int64_t)p->n_head * p->head_dim, kvd = (int64_t)p->n_kv_head * p->head_dim;
    float *h = kiln_reg_in(x, bi, 0), *out = kiln_reg_out(x, bi, 0);
    float *q = x->work, *k = q + t * qd, *v = k + t * kvd, *o = v + t * kvd;
    /* q, k, v: one grouped call (the group kernel runs each member with the kernel bound
     * to that member's own site, fused where it can) */
    kiln_matmul_group_args g = {.n = 3};
    g.m[0] = mm_args(&bi->w[KILN_W_ATT_Q], &bi->w[KILN_W_ATT_BQ], h, E, q, qd, t);
    g.m[1] = mm_args(&bi->w[KILN_W_ATT_K], &bi->w[KILN_W_ATT_BK], h, E, k, kvd, t);
    g.m[2] = mm_args(&bi->w[KILN_W_ATT_V], &bi->w[KILN_W_ATT_BV], h, E, v, kvd, t);
    g.fn[0] = SITE_FN(bi, KILN_SITE_Q, x).matmul;
    g.fn[1] = SITE_FN(bi, KILN_SITE_K, x).matmul;
    g.fn[2] = SITE_FN(bi, KILN_SITE_V, x).matmul;
    KILN_TRY(FN(bi, KILN_SITE_QKV, x).matmul_group(&x->kctx, &g));
    if (bi->w[KILN_W_ATT_Q_NORM].data) {
        /* per-head RMS norm: rows are (token, head) vectors of head_dim */
        kiln_rms_norm_args a = {.x = q,
                                .y = q,
                                .w = bi->w[KILN_W_ATT_Q_NORM].data,
                                .w_offset = p->qk_norm_offset,
                                .rows = t * p->n_head,
                                .n = p->head_dim,
                                .x_stride = p->head_dim,
                                .y_stride = p->head_dim,
                                .eps = p->qk_norm_eps};
        if (norm_fusion_on() && SITE_FN(bi, KILN_SITE_Q_NORM, x).rms_norm ==
                                    SITE_FN(bi, KILN_SITE_K_NORM, x).rms_norm) {
            /* one call: k's head rows follow q's in the workspace (k = q + t qd), the rows
             * from t n_head on take k's weights (kiln_rms_norm_args w2); the values are the
             * two calls' (every row is normed alone) */
            a.w2 = bi->w[KILN_W_ATT_K_NORM].data;
            a.w2_row = t * p->n_head;
            a.rows = t * (p->n_head + p->n_kv_head);
            KILN_TRY(FN(bi, KILN_SITE_Q_NORM, x).rms_norm(&x->kctx, &a));
        } else {
            KILN_TRY(FN(bi, KILN_SITE_Q_NORM, x).rms_norm(&x->kctx, &a));
            a.x = a.y = k;
            a.w = bi->w[KILN_W_ATT_K_NORM].data;
            a.rows = t * p->n_kv_head;
            KILN_TRY(FN(bi, KILN_SITE_K_NORM, x).rms_norm(&x->kctx, &a));
        }
    }
    kiln_kv_layer kv = kiln_kv_pool_layer(x->kv, bi->kv_layer);
    kiln_kv_write_args w = {.kv = kv,
                            .k = k,
                            .v = v,
                            .k_stride = kvd,
                            .v_stride = kvd,
                            .t = t,
                            .tok_seq = x->tok_seq,
                            .tok_pos = x->tok_pos,
                            .blocks = x->blocks};
    if (p->n_rot > 0) {
        /* rope(q), rope(k) and the k/v write: one kernel */
        kiln_rope_kv_args r = {.rope = {.x = q,
                                        .rows = t,
                                        .x_stride = qd,
                                        .n_head = p->n_head,
                                        .head_dim = p->head_dim,
                                        .n_rot = p->n_rot,
                                        .pos = x->tok_pos,
                                        .mode = (kiln_rope_mode)p->rope_mode,
                                        .base = p->rope_base,
                                        .freq_scale = p->rope_freq_scale,
                                        .freq_factors = bi->w[KILN_W_ATT_ROPE_FREQS].data,
                                        .ext_factor = p->ext_factor,
                                        .attn_factor = p->attn_factor,
                                        .beta_fast = p->beta_fast,
                                        .beta_slow = p->beta_slow,
                                        .n_ctx_orig = p->n_ctx_orig},
                               .kv = w};
        KILN_TRY(FN(bi, KILN_SITE_ROPE_KV, x).rope_kv(&x->kctx, &r));
    } else {
        KILN_TRY(FN(bi, KILN_SITE_KV_WRITE, x).kv_write(&x->kctx, &w));
    }
    /* decode rows [0, n_decode) and prefill rows [n_decode, t): one call each, with the
     * kernel bound for that call's own row count (exec.h) */
    const int64_t nd = x->n_decode > 0 && x->n_decode <= t ? x->n_decode : 0;
    for (int part = 0; part < 2; part++) {
        const int64_t r0 = part ? nd : 0, rows = part ? t - nd : nd;
        if (rows <= 0) continue;
        kiln_attention_args at = {.kv = kv,
                                  .q = q + r0 * qd,
                                  .q_stride = qd,
                                  .out = o + r0 * qd,
                                  .out_stride = qd,
                                  .t = rows,
                                  .n_head = p->n_head,
                                  .tok_seq = x->tok_seq + r0,
                                  .tok_pos = x->tok_pos + r0,
                                  .blocks = x->blocks,
                                  .scale = p->scale,
                                  .softcap = p->softcap,
                                  .window = p->window};
        const int b = kiln_bucket_of(rows);
        KILN_TRY(FN_B(bi, KILN_SITE_ATTN, x, b).attention(&x->kctx, &at));
    }
    return matmul(x, bi, KILN_SITE_O, &bi->w[KILN_W_ATT_O], &bi->w[KILN_W_ATT_BO], o, qd, out,
                  bi->width_out[0], t);
}

static kiln_status ffn_adapter(kiln_exec *x, const kiln_bound_insn *bi) {
    const int64_t t = x->t, E = bi->width_in[0], ff = bi->w[KILN_W_FFN_UP].n;
    float *h = kiln_reg_in(x, bi, 0), *out = kiln_reg_out(x, bi, 0);
    float *g = x->work, *u = g + t * ff;
    /* gate and up (the binding requires both: kiln_plan_validate rejects an FFN without
     * a gate): one grouped call, the activation fused into it where it can be */
    kiln_matmul_group_args a = {.n = 2,
                                .glu_fn = SITE_FN(bi, KILN_SITE_GLU, x).glu,
                                .act = (kiln_glu_act)bi->prm.ffn.act,
                                .glu_y = u,
                                .glu_y_stride = ff};
    a.m[0] = mm_args(&bi->w[KILN_W_FFN_GATE], NULL, h, E, g, ff, t);
    a.m[1] = mm_args(&bi->w[KILN_W_FFN_UP], NULL, h, E, u, ff, t);
    a.fn[0] = SITE_FN(bi, KILN_SITE_GATE, x).matmul;
    a.fn[1] = SITE_FN(bi, KILN_SITE_UP, x).matmul;
    KILN_TRY(FN(bi, KILN_SITE_GATE_UP, x).matmul_group(&x->kctx, &a));
    return matmul(x, bi, KILN_SITE_DOWN, &bi->w[KILN_W_FFN_DOWN], NULL, u, ff, out,
                  bi->width_out[0], t);
}

static kiln_status lm_head_adapter(kiln_exec *x, const kiln_bound_insn *bi) {
    if (x->n_logits == 0) return KILN_OK;
    const kiln_bound_weight *w = &bi->w[KILN_W_LM_HEAD];
    const int64_t E = bi->width_in[0];
    const float *h = kiln_reg_in(x, bi, 0);
    /* gather the rows that want logits (contiguous in the workspace), on the device; rows
     * already contiguous in the step (a decode step: every token wants logits) are read in
     * place (rows of 16 floats' multiples keep the buffer's 64-byte alignment) */
    float *rows = x->work;
    const size_t rb = (size_t)E * sizeof(float);
    bool in_place = E % 16 == 0;
    for (int32_t i = 1; i < x->n_logits && in_place; i++)
        in_place = x->logit_rows[i] == x->logit_rows[0] + i;
    if (in_place) rows = (float *)h + (int64_t)x->logit_rows[0] * E;
    for (int32_t i = 0; i < x->n_logits && !in_place; i++) {
        kiln_buf dst = {.ptr = rows + (int64_t)i * E, .size = rb, .space = KILN_MEM_DEVICE};
        kiln_buf src = {.ptr = (void *)(h + (int64_t)x->logit_rows[i] * E),
                        .size = rb,
                        .space = KILN_MEM_DEVICE};
        KILN_TRY(kiln_buf_d2d(x->dev, &dst, 0, &src, 0, rb, x->kctx.err));
    }
    /* the LM head computes the rows that want logits only: its kernels are those of their
     * count's bucket (a 512-token prefill's one row runs the gemv, not cuBLAS) */
    const int lb = kiln_bucket_of(x->n_logits);
    if (x->greedy_ids) {
        /* greedy step: the argmax per row, fused into the LM head where the kernel can
         * (same logits as the matmul below, same pick as softcap + greedy sampling) */
        kiln_matmul_argmax_args a = {
            .mm = mm_args(w, NULL, rows, E, NULL, 0, x->n_logits),
            .fn = bi->site[KILN_SITE_LM_HEAD].fn[lb].matmul,
            .n_limit = x->greedy_limit > 0 && x->greedy_limit < w->n ? x->greedy_limit : w->n,
            .softcap = bi->prm.lm_head.softcap,
            .ids = x->greedy_ids};
        return FN_B(bi, KILN_SITE_LM_ARGMAX, x, lb).matmul_argmax(&x->kctx, &a);
    }
    kiln_matmul_args ma = mm_args(w, NULL, rows, E, x->logits, w->n, x->n_logits);
    KILN_TRY(FN_B(bi, KILN_SITE_LM_HEAD, x, lb).matmul(&x->kctx, &ma));
    /* the final softcap: here on host memory; a device backend's engine applies it to
     * the host copy of the logits (engine.c, kiln_engine_run) */
    const float cap = bi->prm.lm_head.softcap;
    if (cap > 0 && x->dev->be->host_memory) {
        size_t n = (size_t)x->n_logits * (size_t)w->n;
        for (size_t i = 0; i < n; i++) x->logits[i] = cap * tanhf(x->logits[i] / cap);
    }
    return KILN_OK;
}

/* ---- collectives (plan/tp.h inserts them; runtime/comm.h runs them) ---- */

static kiln_status all_reduce_adapter(kiln_exec *x, const kiln_bound_insn *bi) {
    if (!x->comm)
        return kiln_err_set(x->kctx.err, KILN_ERR_STATE,
                            "all_reduce in a plan run without a tensor-parallel group");
    size_t n = (size_t)x->t * (size_t)bi->width_out[0];
    return kiln_comm_all_reduce_sum_f32(x->comm, x->comm_rank, kiln_reg_in(x, bi, 0),
                                        kiln_reg_out(x, bi, 0), n, x->kctx.stream, x->kctx.err);
}

/* logits (this rank's vocabulary shard, [n_logits][n_vocab / ranks]) -> logits_full: an
 * all-gather into logits_tmp ([ranks][n_logits][shard]), then each shard row copied to
 * its place in the full row, on the device */
static kiln_status gather_logits_adapter(kiln_exec *x, const kiln_bound_insn *bi) {
    if (x->n_logits == 0) return KILN_OK; /* the same on every rank: no one gathers */
    if (!x->comm || !x->logits || !x->logits_full || !x->logits_tmp)
        return kiln_err_set(x->kctx.err, KILN_ERR_STATE,
                            "gather_logits without a tensor-parallel group or its buffers");
    const int32_t nr = bi->prm.gather.n_ranks, nv = bi->prm.gather.n_vocab, vl = nv / nr;
    if (nr != kiln_comm_size(x->comm))
        return kiln_err_set(x->kctx.err, KILN_ERR_STATE,
                            "gather_logits for %d ranks in a group of %d", (int)nr,
                            kiln_comm_size(x->comm));
    const size_t shard = (size_t)x->n_logits * (size_t)vl * sizeof(float);
    KILN_TRY(kiln_comm_all_gather(x->comm, x->comm_rank, x->logits, x->logits_tmp, shard,
                                  x->kctx.stream, x->kctx.err));
    const size_t rb = (size_t)vl * sizeof(float);
    for (int32_t r = 0; r < nr; r++)
        for (int32_t i = 0; i < x->n_logits; i++) {
            kiln_buf src = {.ptr = x->logits_tmp +
                                   ((size_t)r * (size_t)x->n_logits + (size_t)i) * (size_t)vl,
                            .size = rb,
                            .space = KILN_MEM_DEVICE};
            kiln_buf dst = {.ptr = x->logits_full + (size_t)i * (size_t)nv + (size_t)r * (size_t)vl,
                            .size = rb,
                            .space = KILN_MEM_DEVICE};
            KILN_TRY(kiln_buf_d2d(x->dev, &dst, 0, &src, 0, rb, x->kctx.err));
        }
    return KILN_OK;
}

const kiln_adapter_fn kiln_adapters[KILN_OP_LIMIT] = {
    [KILN_OP_EMBED] = embed_adapter,           [KILN_OP_RMS_NORM] = norm_adapter,
    [KILN_OP_ATTENTION] = attention_adapter,   [KILN_OP_FFN] = ffn_adapter,
    [KILN_OP_RESIDUAL_ADD] = add_adapter,      [KILN_OP_LM_HEAD] = lm_head_adapter,
    [KILN_OP_ALL_REDUCE] = all_reduce_adapter, [KILN_OP_GATHER_LOGITS] = gather_logits_adapter,
};
