/* tp.c — the tensor-parallel rewrite of a plan (the sharding rules: tp.h). */
#include "plan/tp.h"

#include <string.h>

/* Marks weight slot `slot` of instruction `in` as shard (mode, index of count) and shrinks
 * the reference's shape to the shard's. A weight referenced twice must be sharded the
 * same way both times (the tied embedding: the embed table and the LM head). */
static kiln_status shard_weight(kiln_plan *p, const kiln_insn *in, int slot, kiln_wshard mode,
                                int index, int count, kiln_err *err) {
    if (in->w[slot] == KILN_PLAN_NO_WEIGHT) return KILN_OK;
    kiln_weight_ref *w = &p->weights[in->w[slot]];
    if (count <= 1 || mode == KILN_WSHARD_NONE) {
        if (w->shard != KILN_WSHARD_NONE)
            return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                                "tensor parallel: weight '%s' is both sharded and replicated",
                                w->name);
        return KILN_OK;
    }
    if (w->shard != KILN_WSHARD_NONE) {
        if (w->shard == mode && w->shard_index == index && w->shard_count == count) return KILN_OK;
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "tensor parallel: weight '%s' needs two different shards", w->name);
    }
    /* rows: shape[1] of a matrix, the elements of a vector; columns: shape[0] */
    const int d = mode == KILN_WSHARD_ROWS && w->rank >= 2 ? 1 : 0;
    if (mode == KILN_WSHARD_COLS && w->rank != 2)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "tensor parallel: column shard of '%s' (rank %d)", w->name,
                            (int)w->rank);
    if (w->shape[d] % count)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "tensor parallel: '%s' dimension %d (%lld) does not split into %d",
                            w->name, d, (long long)w->shape[d], count);
    w->shape[d] /= count;
    w->shard = (uint8_t)mode;
    w->shard_index = (int16_t)index;
    w->shard_count = (int16_t)count;
    return KILN_OK;
}

static kiln_status reencode(kiln_plan *p, kiln_insn *in, const kiln_params *prm, kiln_err *err) {
    kiln_param_block pb;
    KILN_TRY(kiln_param_encode((kiln_opcode)in->opcode, prm, &pb, err));
    return kiln_plan_param(p, &pb, &in->param, err);
}

/* Emits `in` with its output renamed to a new register, then all_reduce(new) -> the old
 * output, so the instructions after it read the sum unchanged. */
static kiln_status emit_reduced(kiln_plan *p, kiln_insn in, kiln_tp_layout *lay, kiln_err *err) {
    const uint16_t y = in.out[0];
    uint16_t part;
    KILN_TRY(kiln_plan_reg(p, p->regs[y].width, (kiln_rows)p->regs[y].rows, &part, err));
    in.out[0] = part;
    KILN_TRY(kiln_plan_emit(p, &in, err));
    kiln_insn ar = kiln_insn_make(KILN_OP_ALL_REDUCE);
    ar.n_in = 1;
    ar.in[0] = part;
    ar.n_out = 1;
    ar.out[0] = y;
    ar.layer = in.layer;
    lay->n_all_reduce++;
    return kiln_plan_emit(p, &ar, err);
}

static kiln_status shard_attention(kiln_plan *p, kiln_insn *in, int r, int n, kiln_err *err) {
    kiln_params prm;
    if (in->param < 0 || in->param >= p->n_params)
        return kiln_err_set(err, KILN_ERR_PLAN, "attention without a param block");
    KILN_TRY(kiln_param_decode(KILN_OP_ATTENTION, &p->params[in->param], &prm, err));
    kiln_attn_params *a = &prm.attn;
    const int nh = a->n_head, nkv = a->n_kv_head;
    if (nh % n)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "%d attention heads do not split into %d",
                            nh, n);
    int kv_index, kv_count;
    if (nkv >= n) {
        if (nkv % n)
            return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "%d KV heads do not split into %d", nkv,
                                n);
        kv_index = r, kv_count = n;
        a->n_kv_head = nkv / n;
    } else {
        if (n % nkv)
            return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                                "%d KV heads cannot be replicated evenly over %d ranks", nkv, n);
        kv_index = r / (n / nkv), kv_count = nkv; /* the KV head this rank's q heads read */
        a->n_kv_head = 1;
    }
    a->n_head = nh / n;
    KILN_TRY(shard_weight(p, in, KILN_W_ATT_Q, KILN_WSHARD_ROWS, r, n, err));
    KILN_TRY(shard_weight(p, in, KILN_W_ATT_BQ, KILN_WSHARD_ROWS, r, n, err));
    KILN_TRY(shard_weight(p, in, KILN_W_ATT_K, KILN_WSHARD_ROWS, kv_index, kv_count, err));
    KILN_TRY(shard_weight(p, in, KILN_W_ATT_BK, KILN_WSHARD_ROWS, kv_index, kv_count, err));
    KILN_TRY(shard_weight(p, in, KILN_W_ATT_V, KILN_WSHARD_ROWS, kv_index, kv_count, err));
    KILN_TRY(shard_weight(p, in, KILN_W_ATT_BV, KILN_WSHARD_ROWS, kv_index, kv_count, err));
    KILN_TRY(shard_weight(p, in, KILN_W_ATT_O, KILN_WSHARD_COLS, r, n, err));
    if (r != 0) in->w[KILN_W_ATT_BO] = KILN_PLAN_NO_WEIGHT; /* added once, by rank 0 */
    if (in->state >= 0 && in->state < p->n_states) p->states[in->state].n_kv_head = a->n_kv_head;
    return reencode(p, in, &prm, err);
}

kiln_status kiln_plan_tp_shard(const kiln_plan *src, int rank, int n_ranks, kiln_plan *out,
                               kiln_tp_layout *lay, kiln_err *err) {
    kiln_plan_init(out);
    memset(lay, 0, sizeof(*lay));
    if (n_ranks < 1 || n_ranks > 64 || rank < 0 || rank >= n_ranks)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "tensor parallel: rank %d of %d", rank,
                            n_ranks);
    lay->n_ranks = n_ranks;
    /* the vocabulary: the LM head's rows */
    int32_t n_vocab = 0;
    for (int32_t i = 0; i < src->n_insns; i++)
        if (src->insns[i].opcode == KILN_OP_LM_HEAD &&
            src->insns[i].w[KILN_W_LM_HEAD] < (uint32_t)src->n_weights)
            n_vocab = (int32_t)src->weights[src->insns[i].w[KILN_W_LM_HEAD]].shape[1];
    lay->n_vocab = lay->n_vocab_local = n_vocab;
    lay->vocab_split = n_ranks > 1 && n_vocab > 0 && n_vocab % n_ranks == 0;
    if (lay->vocab_split) lay->n_vocab_local = n_vocab / n_ranks;
    /* copies with indices kept: registers, weights, params, states */
    for (int32_t i = 0; i < src->n_regs; i++) {
        uint16_t id;
        KILN_TRY(kiln_plan_reg(out, src->regs[i].width, (kiln_rows)src->regs[i].rows, &id, err));
    }
    for (int32_t i = 0; i < src->n_weights; i++) {
        const kiln_weight_ref *w = &src->weights[i];
        uint32_t id;
        KILN_TRY(
            kiln_plan_weight(out, w->name, (kiln_wclass)w->wclass, w->rank, w->shape, &id, err));
        if (id != (uint32_t)i || w->shard != KILN_WSHARD_NONE)
            return kiln_err_set(err, KILN_ERR_PLAN,
                                "tensor parallel: weight '%s' is listed twice or already sharded",
                                w->name);
    }
    for (int32_t i = 0; i < src->n_params; i++) {
        int32_t id;
        KILN_TRY(kiln_plan_param(out, &src->params[i], &id, err));
    }
    for (int32_t i = 0; i < src->n_states; i++) {
        int32_t id;
        KILN_TRY(kiln_plan_state(out, &src->states[i], &id, err));
    }
    if (n_ranks == 1) {
        for (int32_t i = 0; i < src->n_insns; i++)
            KILN_TRY(kiln_plan_emit(out, &src->insns[i], err));
        return KILN_OK;
    }
    const int r = rank, n = n_ranks;
    for (int32_t i = 0; i < src->n_insns; i++) {
        kiln_insn in = src->insns[i];
        kiln_status st = KILN_OK;
        switch (in.opcode) {
        case KILN_OP_RMS_NORM:
        case KILN_OP_RESIDUAL_ADD:
            st = kiln_plan_emit(out, &in, err); /* replicated */
            break;
        case KILN_OP_EMBED: {
            if (!lay->vocab_split) {
                st = shard_weight(out, &in, KILN_W_EMBED_TABLE, KILN_WSHARD_NONE, 0, 1, err);
                if (!st) st = kiln_plan_emit(out, &in, err);
                break;
            }
            kiln_params prm;
            st = in.param >= 0 && in.param < out->n_params
                     ? kiln_param_decode(KILN_OP_EMBED, &out->params[in.param], &prm, err)
                     : kiln_err_set(err, KILN_ERR_PLAN, "embed without a param block");
            if (st) break;
            const kiln_weight_ref *tw = in.w[KILN_W_EMBED_TABLE] < (uint32_t)out->n_weights
                                            ? &out->weights[in.w[KILN_W_EMBED_TABLE]]
                                            : NULL;
            if (!tw || tw->shape[1] != n_vocab) {
                /* a table of another size than the LM head: keep it whole */
                st = kiln_plan_emit(out, &in, err);
                break;
            }
            prm.embed.vocab_shard = 1;
            prm.embed.vocab_base = r * lay->n_vocab_local;
            st = shard_weight(out, &in, KILN_W_EMBED_TABLE, KILN_WSHARD_ROWS, r, n, err);
            if (!st) st = reencode(out, &in, &prm, err);
            if (!st) st = emit_reduced(out, in, lay, err);
            break;
        }
        case KILN_OP_ATTENTION:
            st = shard_attention(out, &in, r, n, err);
            if (!st) st = emit_reduced(out, in, lay, err);
            break;
        case KILN_OP_FFN:
            st = shard_weight(out, &in, KILN_W_FFN_GATE, KILN_WSHARD_ROWS, r, n, err);
            if (!st) st = shard_weight(out, &in, KILN_W_FFN_UP, KILN_WSHARD_ROWS, r, n, err);
            if (!st) st = shard_weight(out, &in, KILN_W_FFN_DOWN, KILN_WSHARD_COLS, r, n, err);
            if (!st) st = emit_reduced(out, in, lay, err);
            break;
        case KILN_OP_LM_HEAD: {
            if (!lay->vocab_split) {
                st = shard_weight(out, &in, KILN_W_LM_HEAD, KILN_WSHARD_NONE, 0, 1, err);
                if (!st) st = kiln_plan_emit(out, &in, err);
                break;
            }
            st = shard_weight(out, &in, KILN_W_LM_HEAD, KILN_WSHARD_ROWS, r, n, err);
            if (!st) st = kiln_plan_emit(out, &in, err);
            if (st) break;
            kiln_insn g = kiln_insn_make(KILN_OP_GATHER_LOGITS);
            kiln_params prm = {.gather = {.n_vocab = n_vocab, .n_ranks = n}};
            st = reencode(out, &g, &prm, err);
            if (!st) st = kiln_plan_emit(out, &g, err);
            break;
        }
        default: {
            const char *name = kiln_opcode_name(in.opcode);
            st = kiln_err_set(err, KILN_ERR_UNSUPPORTED, "opcode %s has no sharding rule",
                              name ? name : "(unassigned)");
        }
        }
        if (st) {
            if (in.layer >= 0)
                return kiln_err_wrap(err, st, "tensor parallel over %d ranks: layer %d", n,
                                     (int)in.layer);
            return kiln_err_wrap(err, st, "tensor parallel over %d ranks", n);
        }
    }
    return KILN_OK;
}
