/*
 * bind.c — backends, the call-site binding function, plan binding and the executor
 * loop.
 */
#include "runtime/exec.h"
#include "base/mem.h"
#include "runtime/kselect.h"

#include "base/log.h"
#include "format/dtype.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ref/ref.h"
#include "kernels/spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

kiln_status kiln_bind_callsite(kiln_device *dev, const kiln_callsite *cs, kiln_kernel_fn *out,
                               uint32_t *layout, kiln_err *err) {
    /* The one place kernels are chosen: the device's selector (runtime/kselect.h). */
    return kiln_select_callsite(dev, cs, out, layout, err);
}

/* ---- plan binding ---- */

static kiln_status bind_fail(kiln_plan_check *chk, kiln_plan_error code, int32_t insn,
                             kiln_err *err, const char *fmt, ...) KILN_PRINTF(5, 6);
static kiln_status bind_fail(kiln_plan_check *chk, kiln_plan_error code, int32_t insn,
                             kiln_err *err, const char *fmt, ...) {
    if (chk) {
        chk->code = code;
        chk->insn = insn;
    }
    va_list ap;
    va_start(ap, fmt);
    kiln_err_vset(err, KILN_ERR_PLAN, fmt, ap);
    va_end(ap);
    return kiln_err_wrap(err, KILN_ERR_PLAN, "binding plan (%s)", kiln_plan_error_name(code));
}

static kiln_status bind_weight(kiln_bound_plan *bp, const kiln_model *m, const kiln_weight_ref *ref,
                               int32_t insn, kiln_bound_weight *out, kiln_plan_check *chk,
                               kiln_err *err) {
    const kiln_tensor *t = kiln_model_tensor(m, ref->name);
    if (!t)
        return bind_fail(chk, KILN_PLAN_EWEIGHT_MISSING, insn, err, "tensor '%s' not in %s",
                         ref->name, m->path);
    if (t->rank < 1 || t->rank > 4)
        return bind_fail(chk, KILN_PLAN_ERANK, insn, err, "tensor '%s' has rank %d (1..4)",
                         ref->name, (int)t->rank);
    for (int d = 0; d < 4; d++) {
        int64_t want = d < ref->rank ? ref->shape[d] : 1, have = d < t->rank ? t->shape[d] : 1;
        if (want != have)
            return bind_fail(
                chk, KILN_PLAN_EWEIGHT_SHAPE, insn, err,
                "tensor '%s' has shape [%lld, %lld, %lld, %lld], the model needs [%lld, %lld]",
                ref->name, (long long)(t->rank > 0 ? t->shape[0] : 1),
                (long long)(t->rank > 1 ? t->shape[1] : 1),
                (long long)(t->rank > 2 ? t->shape[2] : 1),
                (long long)(t->rank > 3 ? t->shape[3] : 1), (long long)ref->shape[0],
                (long long)(ref->rank > 1 ? ref->shape[1] : 1));
    }
    int64_t k = t->shape[0], n = t->rank > 1 ? t->shape[1] : 1;
    memset(out, 0, sizeof(*out));
    if (ref->wclass == KILN_WCLASS_VECTOR) {
        if (t->dtype == KILN_DTYPE_F32) {
            out->data = t->data;
        } else if (t->dtype == KILN_DTYPE_F16 || t->dtype == KILN_DTYPE_BF16) {
            float *f = kiln_arena_alloc(&bp->arena, (size_t)k * sizeof(float));
            if (!f)
                return kiln_err_set(err, KILN_ERR_NOMEM, "binding '%s': out of memory", ref->name);
            kiln_ref_row_to_f32(t->dtype, t->data, f, k);
            out->data = f;
        } else {
            return bind_fail(chk, KILN_PLAN_EWEIGHT_DTYPE, insn, err,
                             "tensor '%s' is %s; vectors must be f32/f16/bf16", ref->name,
                             kiln_dtype_name(t->dtype));
        }
        out->dtype = KILN_DTYPE_F32;
        out->row_bytes = (size_t)k * sizeof(float);
        out->n = 1;
        out->k = k;
        return KILN_OK;
    }
    if (!bp->be->weight_dtype_ok(t->dtype))
        return bind_fail(chk, KILN_PLAN_EWEIGHT_DTYPE, insn, err,
                         "tensor '%s' is %s: backend %s cannot compute with it", ref->name,
                         kiln_dtype_name(t->dtype), bp->be->name);
    kiln_err e2;
    if (kiln_dtype_row_bytes(t->dtype, k, &out->row_bytes, &e2))
        return bind_fail(chk, KILN_PLAN_EWEIGHT_SHAPE, insn, err, "tensor '%s': %s", ref->name,
                         e2.msg);
    out->data = t->data;
    out->dtype = t->dtype;
    out->n = n;
    out->k = k;
    return KILN_OK;
}

static void site(kiln_bound_insn *bi, int idx, kiln_kop op, const char *what, int layer) {
    kiln_callsite *cs = &bi->site[idx].desc;
    memset(cs, 0, sizeof(*cs));
    bi->site[idx].widx = -1;
    cs->op = op;
    if (layer >= 0)
        snprintf(cs->name, sizeof(cs->name), "blk.%d.%s", layer, what);
    else
        snprintf(cs->name, sizeof(cs->name), "%s", what);
    cs->w_dtype = KILN_DTYPE_F32;
    if (idx + 1 > bi->n_sites) bi->n_sites = idx + 1;
}

static void site_mm(kiln_bound_insn *bi, int idx, const char *what, int layer,
                    const kiln_bound_weight *w, const kiln_bound_weight *bias) {
    site(bi, idx, KILN_KOP_MATMUL, what, layer);
    bi->site[idx].widx = (int8_t)(w - bi->w);
    kiln_callsite *cs = &bi->site[idx].desc;
    cs->w_dtype = w->dtype;
    cs->n = w->n;
    cs->k = w->k;
    if (bias && bias->data) cs->features |= KILN_CS_BIAS;
}

/* Describes the call sites of one bound instruction; returns workspace floats/token. */
static size_t describe_sites(kiln_bound_insn *bi, const kiln_plan *p, uint32_t kv_dtype) {
    const kiln_insn *in = bi->insn;
    int l = in->layer;
    bi->n_sites = 0;
    switch (in->opcode) {
    case KILN_OP_EMBED:
        site(bi, KILN_SITE_EMBED, KILN_KOP_EMBED, "token_embd", -1);
        bi->site[0].desc.w_dtype = bi->w[0].dtype;
        bi->site[0].desc.n = bi->w[0].n;
        bi->site[0].desc.k = bi->w[0].k;
        return 0;
    case KILN_OP_RMS_NORM:
        site(bi, KILN_SITE_NORM, KILN_KOP_RMS_NORM, "norm", l);
        bi->site[0].desc.n = p->regs[in->out[0]].width;
        return 0;
    case KILN_OP_RESIDUAL_ADD:
        site(bi, KILN_SITE_ADD, KILN_KOP_ADD, "residual", l);
        bi->site[0].desc.n = p->regs[in->out[0]].width;
        return 0;
    case KILN_OP_LM_HEAD:
        site_mm(bi, KILN_SITE_LM_HEAD, "output", -1, &bi->w[KILN_W_LM_HEAD], NULL);
        site(bi, KILN_SITE_LM_ARGMAX, KILN_KOP_MATMUL_ARGMAX, "output.argmax", -1);
        bi->site[KILN_SITE_LM_ARGMAX].desc.w_dtype = bi->w[KILN_W_LM_HEAD].dtype;
        bi->site[KILN_SITE_LM_ARGMAX].desc.n = bi->w[KILN_W_LM_HEAD].n;
        bi->site[KILN_SITE_LM_ARGMAX].desc.k = bi->w[KILN_W_LM_HEAD].k;
        return (size_t)bi->w[KILN_W_LM_HEAD].k;
    case KILN_OP_ATTENTION: {
        const kiln_attn_params *a = &bi->prm.attn;
        site_mm(bi, KILN_SITE_Q, "attn.q", l, &bi->w[KILN_W_ATT_Q], &bi->w[KILN_W_ATT_BQ]);
        site_mm(bi, KILN_SITE_K, "attn.k", l, &bi->w[KILN_W_ATT_K], &bi->w[KILN_W_ATT_BK]);
        site_mm(bi, KILN_SITE_V, "attn.v", l, &bi->w[KILN_W_ATT_V], &bi->w[KILN_W_ATT_BV]);
        site(bi, KILN_SITE_Q_NORM, KILN_KOP_RMS_NORM, "attn.q_norm", l);
        site(bi, KILN_SITE_K_NORM, KILN_KOP_RMS_NORM, "attn.k_norm", l);
        site(bi, KILN_SITE_ROPE, KILN_KOP_ROPE, "attn.rope", l);
        site(bi, KILN_SITE_KV_WRITE, KILN_KOP_KV_WRITE, "attn.kv_write", l);
        site(bi, KILN_SITE_ATTN, KILN_KOP_ATTENTION, "attn.core", l);
        site_mm(bi, KILN_SITE_O, "attn.o", l, &bi->w[KILN_W_ATT_O], &bi->w[KILN_W_ATT_BO]);
        /* fused sites (kernel.h): the q/k/v group and rope + kv_write */
        site(bi, KILN_SITE_QKV, KILN_KOP_MATMUL_GROUP, "attn.qkv", l);
        bi->site[KILN_SITE_QKV].desc.n =
            bi->w[KILN_W_ATT_Q].n + bi->w[KILN_W_ATT_K].n + bi->w[KILN_W_ATT_V].n;
        bi->site[KILN_SITE_QKV].desc.k = bi->w[KILN_W_ATT_Q].k;
        site(bi, KILN_SITE_ROPE_KV, KILN_KOP_ROPE_KV, "attn.rope_kv", l);
        for (int s = KILN_SITE_Q_NORM; s <= KILN_SITE_ROPE_KV; s++) {
            if (s == KILN_SITE_O || s == KILN_SITE_QKV) continue;
            kiln_callsite *cs = &bi->site[s].desc;
            cs->head_dim = a->head_dim;
            cs->n_head = a->n_head;
            cs->n_kv_head = a->n_kv_head;
            cs->kv_dtype = kv_dtype;
            cs->window = a->window;
            cs->n = a->head_dim;
            if (a->n_head != a->n_kv_head) cs->features |= KILN_CS_GQA;
        }
        bi->site[KILN_SITE_ROPE].desc.features |=
            (a->ext_factor != 0 ? KILN_CS_YARN : 0) |
            (bi->w[KILN_W_ATT_ROPE_FREQS].data ? KILN_CS_FREQ_FAC : 0);
        bi->site[KILN_SITE_ROPE_KV].desc.features |= bi->site[KILN_SITE_ROPE].desc.features;
        bi->site[KILN_SITE_KV_WRITE].desc.features |= KILN_CS_PAGED;
        bi->site[KILN_SITE_ROPE_KV].desc.features |= KILN_CS_PAGED;
        bi->site[KILN_SITE_ATTN].desc.features |= KILN_CS_PAGED | KILN_CS_CAUSAL |
                                                  (a->window > 0 ? KILN_CS_WINDOW : 0) |
                                                  (a->softcap > 0 ? KILN_CS_SOFTCAP : 0);
        size_t qd = (size_t)a->n_head * (size_t)a->head_dim,
               kvd = (size_t)a->n_kv_head * (size_t)a->head_dim;
        return 2 * qd + 2 * kvd;
    }
    case KILN_OP_FFN:
        site_mm(bi, KILN_SITE_GATE, "ffn.gate", l, &bi->w[KILN_W_FFN_GATE], NULL);
        site_mm(bi, KILN_SITE_UP, "ffn.up", l, &bi->w[KILN_W_FFN_UP], NULL);
        site(bi, KILN_SITE_GLU, KILN_KOP_GLU, "ffn.act", l);
        site_mm(bi, KILN_SITE_DOWN, "ffn.down", l, &bi->w[KILN_W_FFN_DOWN], NULL);
        site(bi, KILN_SITE_GATE_UP, KILN_KOP_MATMUL_GROUP, "ffn.gate_up", l);
        bi->site[KILN_SITE_GATE_UP].desc.n = 2 * bi->w[KILN_W_FFN_UP].n;
        bi->site[KILN_SITE_GATE_UP].desc.k = bi->w[KILN_W_FFN_UP].k;
        bi->site[KILN_SITE_GLU].desc.n = bi->w[KILN_W_FFN_UP].n;
        return 2 * (size_t)bi->w[KILN_W_FFN_UP].n;
    default:
        return 0;
    }
}

/* A matmul site whose kernels (every bucket) ask for the cpu R16 layout gets its weight
 * repacked into the plan's arena (kernels/cpu/cpu_kernels.h). Kernels that accept R16
 * also accept plain rows, so when the buckets disagree the weight stays as stored. */
static bool wants_r16(const kiln_bound_insn *bi, int s) {
    const kiln_site *site = &bi->site[s];
    if (site->widx < 0 || site->desc.op != KILN_KOP_MATMUL) return false;
    for (int b = 0; b < KILN_BUCKETS; b++)
        if (site->layout[b] != KILN_WLAYOUT_CPU_R16) return false;
    const kiln_bound_weight *w = &bi->w[site->widx];
    return w->layout != KILN_WLAYOUT_CPU_R16 && kiln_cpu_r16_supports(w->dtype);
}

/* Every R16 weight of the plan is repacked into one arena block whose interior is
 * 2 MiB aligned and advised MADV_HUGEPAGE before it is first touched: decode streams
 * the weights once per token, and with 4 KiB pages every page is a TLB miss and a point
 * where the hardware prefetcher stops (measured, bench on 64 MB of tinyllama-shaped
 * R16 weights, 2 threads: q4_0 34-36 GB/s with huge pages against 22-25 with 4 KiB
 * pages; docs/CPU.md). Without THP (or with it off) madvise fails harmlessly. */
#define HUGE_ALIGN ((size_t)2 << 20)

static kiln_status relayout_weights(kiln_bound_plan *bp, kiln_err *err) {
    const kiln_plan *p = &bp->plan;
    size_t total = 0;
    for (int32_t i = 0; i < p->n_insns; i++)
        for (int s = 0; s < bp->bi[i].n_sites; s++) {
            if (!wants_r16(&bp->bi[i], s)) continue;
            const kiln_bound_weight *w = &bp->bi[i].w[bp->bi[i].site[s].widx];
            size_t bytes;
            KILN_TRY(kiln_cpu_r16_size(w->dtype, w->n, w->k, &bytes, err));
            if (!kiln_size_add(total, (bytes + 63) & ~(size_t)63, &total))
                return kiln_err_set(err, KILN_ERR_OVERFLOW, "repacking weights: size overflow");
        }
    if (total == 0) return KILN_OK;
    size_t alloc;
    if (!kiln_size_add(total, HUGE_ALIGN, &alloc))
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "repacking weights: size overflow");
    uint8_t *block = kiln_arena_alloc(&bp->arena, alloc);
    if (!block)
        return kiln_err_set(err, KILN_ERR_NOMEM, "repacking weights: %zu bytes: out of memory",
                            alloc);
    uint8_t *dst = (uint8_t *)(((uintptr_t)block + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1));
    size_t huge = total & ~(HUGE_ALIGN - 1);
    if (huge && madvise(dst, huge, MADV_HUGEPAGE) != 0)
        KILN_DEBUG("madvise(MADV_HUGEPAGE) on %zu bytes of repacked weights failed", huge);
    for (int32_t i = 0; i < p->n_insns; i++)
        for (int s = 0; s < bp->bi[i].n_sites; s++) {
            if (!wants_r16(&bp->bi[i], s)) continue;
            kiln_bound_weight *w = &bp->bi[i].w[bp->bi[i].site[s].widx];
            size_t bytes;
            KILN_TRY(kiln_cpu_r16_size(w->dtype, w->n, w->k, &bytes, err));
            KILN_TRY(kiln_cpu_r16_repack(w->dtype, w->data, w->row_bytes, w->n, w->k, dst, err));
            w->data = dst;
            w->layout = KILN_WLAYOUT_CPU_R16;
            dst += (bytes + 63) & ~(size_t)63;
        }
    return KILN_OK;
}

void kiln_bind_opts_default(kiln_bind_opts *o) {
    memset(o, 0, sizeof(*o));
    o->kv_dtype = KILN_DTYPE_F32;
}

kiln_status kiln_bind_plan(kiln_device *dev, const kiln_model *m, kiln_plan *plan,
                           kiln_bound_plan *out, kiln_plan_check *chk, kiln_err *err) {
    return kiln_bind_plan_opts(dev, m, plan, NULL, out, chk, err);
}

kiln_status kiln_bind_plan_opts(kiln_device *dev, const kiln_model *m, kiln_plan *plan,
                                const kiln_bind_opts *o, kiln_bound_plan *out, kiln_plan_check *chk,
                                kiln_err *err) {
    kiln_bind_opts d;
    if (!o) {
        kiln_bind_opts_default(&d);
        o = &d;
    }
    const kiln_backend *be = dev->be;
    const bool ggml_numerics = o->ggml_numerics;
    memset(out, 0, sizeof(*out));
    out->ggml_numerics = ggml_numerics;
    out->plan = *plan;
    memset(plan, 0, sizeof(*plan));
    out->be = be;
    out->dev = dev;
    out->kv_dtype = o->kv_dtype;
    out->max_tokens = o->max_tokens;
    if (o->kv_dtype != KILN_DTYPE_F32 && o->kv_dtype != KILN_DTYPE_F16) {
        kiln_plan_free(&out->plan);
        memset(out, 0, sizeof(*out));
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "binding plan: KV dtype %s (f32 or f16)",
                            kiln_dtype_name(o->kv_dtype));
    }
    kiln_arena_init(&out->arena, 64 * 1024);
    kiln_plan *p = &out->plan;
    bool supported[KILN_OP_LIMIT];
    for (int i = 0; i < KILN_OP_LIMIT; i++) supported[i] = be->adapters[i] != NULL;
    kiln_status st = kiln_plan_validate(p, supported, chk, err);
    if (!st) st = kiln_plan_compile(p, err);
    if (!st) {
        out->bi = kiln_calloc((size_t)(p->n_insns > 0 ? p->n_insns : 1), sizeof(kiln_bound_insn));
        if (!out->bi) st = kiln_err_set(err, KILN_ERR_NOMEM, "binding plan: out of memory");
    }
    for (int32_t i = 0; i < p->n_insns && !st; i++) {
        kiln_bound_insn *bi = &out->bi[i];
        const kiln_insn *in = &p->insns[i];
        bi->insn = in;
        bi->kv_layer = in->state >= 0 ? p->states[in->state].layer : -1;
        if (in->param >= 0)
            st = kiln_param_decode(in->opcode, &p->params[in->param], &bi->prm, err);
        for (int k = 0; k < KILN_PLAN_MAX_WEIGHTS && !st; k++)
            if (in->w[k] != KILN_PLAN_NO_WEIGHT)
                st = bind_weight(out, m, &p->weights[in->w[k]], i, &bi->w[k], chk, err);
        for (int k = 0; k < in->n_in; k++) {
            bi->phys_in[k] = p->phys[in->in[k]];
            bi->width_in[k] = p->regs[in->in[k]].width;
        }
        for (int k = 0; k < in->n_out; k++) {
            bi->phys_out[k] = p->phys[in->out[k]];
            bi->width_out[k] = p->regs[in->out[k]].width;
        }
        if (st) break;
        if (in->opcode == KILN_OP_LM_HEAD) out->n_vocab = (int32_t)bi->w[KILN_W_LM_HEAD].n;
        size_t wpt = describe_sites(bi, p, o->kv_dtype);
        for (int s = 0; s < bi->n_sites; s++) bi->site[s].desc.max_tokens = o->max_tokens;
        if (wpt > out->work_per_token) out->work_per_token = wpt;
        /* ggml numerics: the call sites ask for the activation types llama.cpp computes
         * with (kernels/ref/ref.h): q8 for quantized matmuls, f16 in attention and GeGLU */
        for (int s = 0; s < bi->n_sites && ggml_numerics; s++) {
            kiln_callsite *cs = &bi->site[s].desc;
            if (cs->op == KILN_KOP_MATMUL)
                cs->act_dtype = kiln_ggml_vec_dot_type(cs->w_dtype);
            else if (cs->op == KILN_KOP_ATTENTION || cs->op == KILN_KOP_GLU)
                cs->act_dtype = KILN_DTYPE_F16;
        }
        for (int s = 0; s < bi->n_sites && !st; s++)
            for (int b = 0; b < KILN_BUCKETS && !st; b++) {
                bi->site[s].desc.bucket = b;
                bi->site[s].layout[b] = KILN_WLAYOUT_PLAIN;
                st = kiln_bind_callsite(dev, &bi->site[s].desc, &bi->site[s].fn[b],
                                        &bi->site[s].layout[b], err);
            }
    }
    if (!st) st = relayout_weights(out, err);
    if (st) {
        kiln_bound_plan_free(out);
        return st;
    }
    return KILN_OK;
}

void kiln_bound_plan_free(kiln_bound_plan *bp) {
    if (!bp) return;
    kiln_free(bp->bi);
    kiln_plan_free(&bp->plan);
    kiln_arena_free(&bp->arena);
    memset(bp, 0, sizeof(*bp));
}

kiln_status kiln_exec_run(const kiln_bound_plan *bp, kiln_exec *x, kiln_err *err) {
    const kiln_adapter_fn *ad = bp->be->adapters;
    x->failed_insn = -1;
    for (int32_t i = 0; i < bp->plan.n_insns; i++) {
        const kiln_bound_insn *bi = &bp->bi[i];
        if (x->counters) x->counters[bi->insn->opcode]++;
        x->cur_site = -1;
        kiln_status st = ad[bi->insn->opcode](x, bi);
        if (st) {
            x->failed_insn = x->cur_site >= 0 ? i : -1;
            if (bi->insn->layer >= 0)
                return kiln_err_wrap(err, st, "%s (layer %d)", kiln_opcode_name(bi->insn->opcode),
                                     (int)bi->insn->layer);
            return kiln_err_wrap(err, st, "%s", kiln_opcode_name(bi->insn->opcode));
        }
    }
    return KILN_OK;
}
