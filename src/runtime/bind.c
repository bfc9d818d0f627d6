/*
 * bind.c — backends, the call-site binding function, plan binding and the executor
 * loop.
 */
#include "runtime/exec.h"
#include "base/mem.h"
#include "runtime/kselect.h"

#include "base/log.h"
#include "base/timer.h"
#include "format/dtype.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda_t16.h"
#include "kernels/ref/ref.h"
#include "kernels/spec.h"
#include "load/load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

kiln_status kiln_bind_callsite(kiln_device *dev, const kiln_callsite *cs, kiln_kernel_fn *out,
                               uint32_t *layout, kiln_err *err) {
    /* The one place kernels are chosen: the device's selector (runtime/kselect.h). */
    return kiln_select_callsite(dev, cs, out, layout, NULL, err);
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
    /* the shape this reference reads: the tensor's, or its shard's (plan/tp.h) */
    int64_t shape[4];
    for (int d = 0; d < 4; d++) shape[d] = d < t->rank ? t->shape[d] : 1;
    if (ref->shard != KILN_WSHARD_NONE) {
        const int d = ref->shard == KILN_WSHARD_ROWS && t->rank >= 2 ? 1 : 0;
        if (ref->shard_count < 1 || ref->shard_index < 0 || ref->shard_index >= ref->shard_count ||
            shape[d] % ref->shard_count || t->rank > 2)
            return bind_fail(chk, KILN_PLAN_EWEIGHT_SHAPE, insn, err,
                             "tensor '%s' (rank %d, dimension %d of %lld) has no shard %d of %d",
                             ref->name, (int)t->rank, d, (long long)shape[d], (int)ref->shard_index,
                             (int)ref->shard_count);
        shape[d] /= ref->shard_count;
    }
    for (int d = 0; d < 4; d++) {
        int64_t want = d < ref->rank ? ref->shape[d] : 1, have = shape[d];
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
    int64_t k = shape[0], n = t->rank > 1 ? shape[1] : 1;
    memset(out, 0, sizeof(*out));
    /* selection first: the weight is described here (dtype, shape, the layout the loader
     * will produce); its bytes are bound after the load plan ran (bind_loaded_weights) */
    if (ref->wclass == KILN_WCLASS_VECTOR) {
        if (t->dtype != KILN_DTYPE_F32 && t->dtype != KILN_DTYPE_F16 && t->dtype != KILN_DTYPE_BF16)
            return bind_fail(chk, KILN_PLAN_EWEIGHT_DTYPE, insn, err,
                             "tensor '%s' is %s; vectors must be f32/f16/bf16", ref->name,
                             kiln_dtype_name(t->dtype));
        out->dtype = KILN_DTYPE_F32; /* the loader converts (layout "f32") */
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
    if (bias && bias->k > 0) cs->features |= KILN_CS_BIAS; /* bound (bytes come later) */
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
            (bi->w[KILN_W_ATT_ROPE_FREQS].k > 0 ? KILN_CS_FREQ_FAC : 0);
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

/* A matmul site whose kernels (every bucket) ask for one repacked layout (the cpu R16,
 * kernels/cpu/cpu_kernels.h, or the cuda T16, kernels/cuda_t16.h) gets its weight loaded in
 * it. Kernels that accept a repacked layout also accept plain rows, so when the buckets
 * disagree the weight stays as stored. Returns the layout, or KILN_WLAYOUT_PLAIN. */
static uint32_t wanted_layout(const kiln_bound_insn *bi, int s) {
    const kiln_site *site = &bi->site[s];
    if (site->widx < 0 || site->desc.op != KILN_KOP_MATMUL) return KILN_WLAYOUT_PLAIN;
    const uint32_t want = site->layout[0];
    for (int b = 1; b < KILN_BUCKETS; b++)
        if (site->layout[b] != want) return KILN_WLAYOUT_PLAIN;
    const kiln_bound_weight *w = &bi->w[site->widx];
    if (w->layout == want) return KILN_WLAYOUT_PLAIN; /* already */
    if (want == KILN_WLAYOUT_CPU_R16 && kiln_cpu_r16_supports(w->dtype)) return want;
    if (want == KILN_WLAYOUT_CUDA_T16 && kiln_cuda_t16_supports(w->dtype) &&
        w->k % kiln_cuda_t16_k(w->dtype) == 0)
        return want;
    return KILN_WLAYOUT_PLAIN;
}

/* ---- the load request: what the chosen kernels need, loaded by the load plan ----
 *
 * After selection every bound weight knows the layout its kernels read. That becomes
 * one (tensor, target) want per distinct pair; the loader (load/load.h) plans the lanes
 * and executes them, and nothing else maps, copies or repacks a weight. */

/* The cpu R16 layout (kernels/cpu/cpu_kernels.h) as a loader layout: groups of 16 rows,
 * the last one padded; the transform is the cpu kernels' own repack. */
#define LAYOUT_CPU_R16 "cpu_r16"

static kiln_status r16_plan(uint32_t src, int64_t ne0, int64_t n_rows, uint32_t fixup,
                            uint32_t *out_dtype, uint64_t *out_row_bytes, kiln_err *err) {
    if (fixup != 0)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "R16 layout: no fixups (%u)", fixup);
    size_t total;
    KILN_TRY(kiln_cpu_r16_size(src, n_rows > 0 ? n_rows : 16, ne0, &total, err));
    *out_dtype = src;
    *out_row_bytes = kiln_cpu_r16_group_bytes(src, ne0) / 16; /* every R16 group is 16 x */
    return KILN_OK;
}

static kiln_status r16_run(uint32_t src, int64_t ne0, uint32_t fixup, const void *in,
                           int64_t n_rows, void *dst, kiln_err *err) {
    (void)fixup;
    size_t rb;
    KILN_TRY(kiln_dtype_row_bytes(src, ne0, &rb, err));
    return kiln_cpu_r16_repack(src, in, rb, n_rows, ne0, dst, err);
}

static const kiln_layout r16_layout = {LAYOUT_CPU_R16,
                                       "cpu kernels: 16 rows interleaved per quant block",
                                       16,
                                       r16_plan,
                                       r16_run,
                                       true};
static kiln_status r16_registered; /* written once under register_once */
static pthread_once_t register_once = PTHREAD_ONCE_INIT;

static void register_layouts(void) {
    kiln_err e;
    r16_registered =
        kiln_layout_find(LAYOUT_CPU_R16) ? KILN_OK : kiln_layout_register(&r16_layout, &e);
    const kiln_layout *t16 = kiln_cuda_t16_layout();
    if (!r16_registered && !kiln_layout_find(t16->name))
        r16_registered = kiln_layout_register(t16, &e);
}

/* The loader layout name of a kiln_wlayout (NULL: none the loader knows). */
static const char *wlayout_name(uint32_t wl) {
    return wl == KILN_WLAYOUT_PLAIN      ? "native"
           : wl == KILN_WLAYOUT_CPU_R16  ? LAYOUT_CPU_R16
           : wl == KILN_WLAYOUT_CUDA_T16 ? kiln_cuda_t16_layout()->name
                                         : NULL;
}

/* Where the device's kernels read weights: host memory (ref, cpu) or the CUDA device. */
static kiln_load_target weight_target(const kiln_bound_plan *bp, const char *layout) {
    kiln_load_target t = {KILN_PLACE_HOST, 0, layout, false};
    if (bp->be && !bp->be->host_memory) {
        t.place = KILN_PLACE_CUDA;
        t.device = bp->dev ? bp->dev->ordinal : 0;
    }
    return t;
}

/* The loader layout of a bound weight. */
static const char *load_layout(const kiln_weight_ref *ref, const kiln_bound_weight *w,
                               const kiln_tensor_info *src) {
    if (ref->wclass == KILN_WCLASS_VECTOR)
        return src->dtype == KILN_DTYPE_F32 && src->fixup == KILN_FIXUP_NONE ? "native" : "f32";
    const char *n = wlayout_name(w->layout);
    return n ? n : "native";
}

/* The loader's description of model tensor `name`: the file's, or (a tensor the family
 * computed, a model built from tensors in memory) one in memory, kept in bp->mem. */
static const kiln_tensor_info *source_of(kiln_bound_plan *bp, const kiln_model *m, const char *name,
                                         kiln_err *err) {
    if (m->file) {
        const kiln_tensor_info *ti = kiln_model_file_find_tensor(m->file, name);
        if (ti) return ti;
    }
    for (size_t i = 0; i < bp->n_mem; i++)
        if (strcmp(bp->mem[i].name, name) == 0) return &bp->mem[i];
    const kiln_tensor *t = kiln_model_tensor(m, name);
    if (!t || !t->data) {
        kiln_err_set(err, KILN_ERR_NOT_FOUND, "tensor '%s': no bytes (not in %s)", name, m->path);
        return NULL;
    }
    kiln_tensor_info *ti = &bp->mem[bp->n_mem++];
    memset(ti, 0, sizeof(*ti));
    ti->name = t->name;
    ti->name_len = strlen(t->name);
    ti->dtype = t->dtype;
    const kiln_dtype_info *di = kiln_dtype_get(t->dtype);
    ti->supported = di && di->supported;
    ti->rank = t->rank;
    for (int d = 0; d < 4; d++) ti->shape[d] = d < t->rank ? t->shape[d] : 1;
    ti->file = KILN_LOAD_MEMORY;
    ti->nbytes = t->nbytes;
    ti->data = t->data;
    return ti;
}

kiln_status kiln_bind_load_plan(kiln_bound_plan *bp, const kiln_model *m,
                                const kiln_load_request *base, kiln_load_plan **out,
                                kiln_err *err) {
    *out = NULL;
    pthread_once(&register_once, register_layouts);
    if (r16_registered)
        return kiln_err_set(err, r16_registered, "registering the kernels' load layouts");
    const kiln_plan *p = &bp->plan;
    size_t cap = 0;
    for (int32_t i = 0; i < p->n_insns; i++)
        for (int k = 0; k < KILN_PLAN_MAX_WEIGHTS; k++)
            if (p->insns[i].w[k] != KILN_PLAN_NO_WEIGHT) cap++;
    kiln_free(bp->wants);
    kiln_free(bp->mem);
    bp->n_wants = bp->n_mem = 0;
    bp->wants = kiln_calloc(cap ? cap : 1, sizeof(*bp->wants));
    bp->mem = kiln_calloc(cap ? cap : 1, sizeof(*bp->mem));
    if (!bp->wants || !bp->mem)
        return kiln_err_set(err, KILN_ERR_NOMEM, "load request of %zu weights", cap);
    for (int32_t i = 0; i < p->n_insns; i++)
        for (int k = 0; k < KILN_PLAN_MAX_WEIGHTS; k++) {
            if (p->insns[i].w[k] == KILN_PLAN_NO_WEIGHT) continue;
            const kiln_weight_ref *ref = &p->weights[p->insns[i].w[k]];
            const kiln_tensor_info *src = source_of(bp, m, ref->name, err);
            if (!src) return KILN_ERR_NOT_FOUND;
            kiln_load_target tg = weight_target(bp, load_layout(ref, &bp->bi[i].w[k], src));
            bool seen = false;
            for (size_t j = 0; j < bp->n_wants && !seen; j++)
                seen =
                    bp->wants[j].src == src && strcmp(bp->wants[j].target.layout, tg.layout) == 0;
            /* a tensor-parallel shard (plan/tp.h) is selected by the load plan */
            const int mode = ref->shard == KILN_WSHARD_ROWS   ? KILN_SHARD_ROWS
                             : ref->shard == KILN_WSHARD_COLS ? KILN_SHARD_COLS
                                                              : KILN_SHARD_NONE;
            if (!seen)
                bp->wants[bp->n_wants++] =
                    (kiln_load_want){src, tg, mode, ref->shard_index, ref->shard_count};
        }
    kiln_load_request req;
    if (base)
        req = *base;
    else
        kiln_load_request_init(&req);
    req.wants = bp->wants;
    req.n_wants = bp->n_wants;
    return kiln_load_plan_build(m->file, &req, out, err);
}

/* Points every bound weight at the bytes the executed load plan produced. */
static kiln_status bind_loaded_weights(kiln_bound_plan *bp, const kiln_model *m, kiln_err *err) {
    const kiln_plan *p = &bp->plan;
    for (int32_t i = 0; i < p->n_insns; i++)
        for (int k = 0; k < KILN_PLAN_MAX_WEIGHTS; k++) {
            if (p->insns[i].w[k] == KILN_PLAN_NO_WEIGHT) continue;
            const kiln_weight_ref *ref = &p->weights[p->insns[i].w[k]];
            kiln_bound_weight *w = &bp->bi[i].w[k];
            const kiln_tensor_info *src = source_of(bp, m, ref->name, err);
            if (!src) return KILN_ERR_NOT_FOUND;
            const char *lay = load_layout(ref, w, src);
            const kiln_load_item *it = kiln_load_plan_find_want(bp->load, src, lay);
            const void *bytes = it ? (it->device_ptr ? it->device_ptr : it->data) : NULL;
            if (!it || !it->done || !bytes)
                return kiln_err_set(err, KILN_ERR_INTERNAL,
                                    "binding '%s': the load plan holds no %s bytes of it",
                                    ref->name, lay);
            w->data = bytes; /* host bytes, or the device pointer for a device backend */
        }
    return KILN_OK;
}

kiln_status kiln_bind_execute_load(kiln_bound_plan *bp, const kiln_model *m, kiln_load_plan *load,
                                   kiln_err *err) {
    kiln_load_plan_free(bp->load);
    bp->load = load;
    KILN_TRY(kiln_load_execute(load, err));
    return bind_loaded_weights(bp, m, err);
}

kiln_status kiln_bind_relayout_weight(kiln_bound_plan *bp, int32_t insn, int widx, uint32_t wlayout,
                                      kiln_err *err) {
    if (!bp->load) return kiln_err_set(err, KILN_ERR_STATE, "no load plan backs this bound plan");
    const kiln_plan *p = &bp->plan;
    if (insn < 0 || insn >= p->n_insns || widx < 0 || widx >= KILN_PLAN_MAX_WEIGHTS ||
        p->insns[insn].w[widx] == KILN_PLAN_NO_WEIGHT)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "relayout: no weight (%d, %d)", (int)insn,
                            widx);
    const kiln_weight_ref *ref = &p->weights[p->insns[insn].w[widx]];
    const char *lay = wlayout_name(wlayout);
    if (ref->wclass != KILN_WCLASS_MATRIX || !lay)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "relayout of '%s' to layout %u", ref->name,
                            wlayout);
    const kiln_tensor_info *src = NULL; /* the tensor the load request named */
    const kiln_load_want *wsrc = NULL;
    for (size_t j = 0; j < bp->n_wants && !src; j++)
        if (strcmp(bp->wants[j].src->name, ref->name) == 0) {
            src = bp->wants[j].src;
            wsrc = &bp->wants[j];
        }
    if (!src) return kiln_err_set(err, KILN_ERR_NOT_FOUND, "relayout: '%s' not loaded", ref->name);
    kiln_bound_weight *w = &bp->bi[insn].w[widx];
    /* reuse a loaded copy in that layout, else plan and load just that one */
    const kiln_load_item *it = kiln_load_plan_find_want(bp->load, src, lay);
    for (size_t j = 0; !it && j < bp->n_extra; j++)
        it = kiln_load_plan_find_want(bp->extra[j], src, lay);
    if (!it) {
        kiln_load_plan **x = kiln_realloc(bp->extra, (bp->n_extra + 1) * sizeof(*x));
        if (!x) return kiln_err_set(err, KILN_ERR_NOMEM, "relayout of '%s'", ref->name);
        bp->extra = x;
        const kiln_load_item *first = kiln_load_plan_item(bp->load, 0);
        kiln_load_want one = {src,
                              {first ? first->target.place : KILN_PLACE_HOST,
                               first ? first->target.device : 0, lay, false},
                              wsrc->shard,
                              wsrc->shard_index,
                              wsrc->shard_count};
        kiln_load_request req = *kiln_load_plan_request(bp->load);
        req.wants = &one; /* read while planning only */
        req.n_wants = 1;
        req.progress = false;
        kiln_load_plan *lp;
        kiln_status st = kiln_load_plan_build(kiln_load_plan_file(bp->load), &req, &lp, err);
        if (!st) st = kiln_load_execute(lp, err);
        if (st) {
            kiln_load_plan_free(lp);
            return kiln_err_wrap(err, st, "circuit breaker: loading '%s' in layout %s", ref->name,
                                 lay);
        }
        bp->extra[bp->n_extra++] = lp;
        it = kiln_load_plan_item(lp, 0);
    }
    w->data = it->device_ptr ? it->device_ptr : it->data;
    w->layout = wlayout;
    return KILN_OK;
}

/* After selection: a weight whose matmul kernels all read one repacked layout is loaded
 * in it. */
static void choose_layouts(kiln_bound_plan *bp) {
    const kiln_plan *p = &bp->plan;
    for (int32_t i = 0; i < p->n_insns; i++)
        for (int s = 0; s < bp->bi[i].n_sites; s++) {
            const uint32_t wl = wanted_layout(&bp->bi[i], s);
            if (wl != KILN_WLAYOUT_PLAIN) bp->bi[i].w[bp->bi[i].site[s].widx].layout = wl;
        }
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
    return kiln_bind_plan_load(dev, m, plan, o, NULL, out, chk, err);
}

kiln_status kiln_bind_plan_load(kiln_device *dev, const kiln_model *m, kiln_plan *plan,
                                const kiln_bind_opts *o, const kiln_load_request *load,
                                kiln_bound_plan *out, kiln_plan_check *chk, kiln_err *err) {
    KILN_TRY(kiln_bind_select(dev, m, plan, o, out, chk, err));
    kiln_load_plan *lp = NULL;
    kiln_status st = kiln_bind_load_plan(out, m, load, &lp, err);
    if (!st)
        st = kiln_bind_execute_load(out, m, lp, err);
    else
        kiln_load_plan_free(lp);
    if (st) kiln_bound_plan_free(out);
    return st;
}

kiln_status kiln_bind_select(kiln_device *dev, const kiln_model *m, kiln_plan *plan,
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
        for (int s = 0; s < bi->n_sites && !st; s++) st = kiln_bind_site(dev, &bi->site[s], err);
    }
    if (!st) choose_layouts(out);
    if (st) {
        kiln_bound_plan_free(out);
        return st;
    }
    return KILN_OK;
}

void kiln_bound_plan_free(kiln_bound_plan *bp) {
    if (!bp) return;
    kiln_free(bp->bi);
    kiln_load_plan_free(bp->load); /* the weights' bytes (after the kernels are gone) */
    for (size_t i = 0; i < bp->n_extra; i++) kiln_load_plan_free(bp->extra[i]);
    kiln_free(bp->extra);
    kiln_free(bp->wants);
    kiln_free(bp->mem);
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
        kiln_status st = KILN_ERR_UNSUPPORTED;
        uint64_t t0 = 0;
        if (x->op_ns) {
            if ((st = kiln_device_sync(x->dev, err)) != KILN_OK) return st;
            st = KILN_ERR_UNSUPPORTED;
            t0 = kiln_now_ns();
        }
        if (bi->insn->opcode == KILN_OP_RESIDUAL_ADD && i + 1 < bp->plan.n_insns &&
            ad == kiln_adapters) {
            st = kiln_adapter_add_norm(x, bi, &bp->bi[i + 1]);
            if (st != KILN_ERR_UNSUPPORTED) { /* ran (or failed) as the norm's call */
                i++, bi = &bp->bi[i];
                if (x->counters) x->counters[bi->insn->opcode]++;
            }
        }
        if (st == KILN_ERR_UNSUPPORTED) st = ad[bi->insn->opcode](x, bi);
        if (!st && x->op_ns) { /* the profile: this instruction's launch + run */
            st = kiln_device_sync(x->dev, err);
            const uint64_t now = kiln_now_ns();
            x->op_ns[bi->insn->opcode] += now - t0;
            x->op_ns[KILN_OP_LIMIT + bi->insn->opcode]++;
        }
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
