/*
 * tune.c — benchmark one kernel on one context (tune.h).
 */
#include "kernels/tune.h"

#include "base/mem.h"
#include "base/timer.h"
#include "format/dtype.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda_t16.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t kiln_tune_tokens(const kiln_sel_ctx *c) {
    static const int64_t rep[KILN_TOK_BUCKETS] = {1, 8, 64, 512, 1024};
    int64_t t = rep[c->tok_bucket < 0 || c->tok_bucket >= KILN_TOK_BUCKETS ? 0 : c->tok_bucket];
    if (c->tokens_max > 0 && t > c->tokens_max) t = c->tokens_max;
    return t < 1 ? 1 : t;
}

#define TUNE_BUFS 12

/* everything one run needs; freed together (and its random stream). A device run mirrors
 * each host buffer into a device allocation (d[i], same size) before timing. */
typedef struct bufs {
    void *p[TUNE_BUFS], *d[TUNE_BUFS];
    size_t sz[TUNE_BUFS];
    int n;
    uint64_t rng;
} bufs;

static float frand_(bufs *b) {
    b->rng ^= b->rng << 13;
    b->rng ^= b->rng >> 7;
    b->rng ^= b->rng << 17;
    return (float)((b->rng >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}
#define frand() frand_(b)

static void *balloc(bufs *b, size_t bytes, kiln_err *err) {
    if (b->n >= TUNE_BUFS) {
        kiln_err_set(err, KILN_ERR_INTERNAL, "tune: more than %d buffers", TUNE_BUFS);
        return NULL;
    }
    if (!bytes) bytes = 64;
    void *p = kiln_calloc_aligned(bytes);
    if (!p) {
        kiln_err_set(err, KILN_ERR_NOMEM, "tune: cannot allocate %zu bytes", bytes);
        return NULL;
    }
    b->sz[b->n] = bytes;
    b->p[b->n++] = p;
    return p;
}

/* Copies every host buffer into a device allocation of the same size. */
static kiln_status mirror(bufs *b, const kiln_tune_device *d, kiln_err *err) {
    for (int i = 0; i < b->n; i++) {
        KILN_TRY(d->alloc(d->ctx, b->sz[i], &b->d[i], err));
        KILN_TRY(d->upload(d->ctx, b->d[i], b->p[i], b->sz[i], err));
    }
    return d->sync(d->ctx, err);
}

/* The device address of host address h inside one of b's buffers (h itself when it is in
 * none of them: a caller's device pointer, or NULL). */
static void *dev_addr(const bufs *b, const void *h) {
    const char *c = h;
    for (int i = 0; c && i < b->n; i++) {
        const char *base = b->p[i];
        if (c >= base && c < base + b->sz[i]) return (char *)b->d[i] + (c - base);
    }
    return (void *)h;
}
#define DEV(field) ((field) = dev_addr(b, (field)))

/* The pointers of the op's arguments -> their device mirrors. */
static void to_device(const bufs *b, kiln_kop op, void *args) {
    switch (op) {
    case KILN_KOP_MATMUL: {
        kiln_matmul_args *a = args;
        DEV(a->w), DEV(a->x), DEV(a->y), DEV(a->bias);
        break;
    }
    case KILN_KOP_RMS_NORM: {
        kiln_rms_norm_args *a = args;
        DEV(a->x), DEV(a->y), DEV(a->w), DEV(a->r);
        break;
    }
    case KILN_KOP_ADD: {
        kiln_add_args *a = args;
        DEV(a->a), DEV(a->b), DEV(a->y);
        break;
    }
    case KILN_KOP_GLU: {
        kiln_glu_args *a = args;
        DEV(a->gate), DEV(a->up), DEV(a->y);
        break;
    }
    case KILN_KOP_EMBED: {
        kiln_embed_args *a = args;
        DEV(a->w), DEV(a->ids), DEV(a->y);
        break;
    }
    case KILN_KOP_ROPE: {
        kiln_rope_args *a = args;
        DEV(a->x), DEV(a->pos);
        break;
    }
    case KILN_KOP_KV_WRITE: {
        kiln_kv_write_args *a = args;
        DEV(a->kv.k), DEV(a->kv.v), DEV(a->k), DEV(a->v), DEV(a->tok_seq), DEV(a->tok_pos);
        DEV(a->blocks.table), DEV(a->blocks.seq_len);
        break;
    }
    case KILN_KOP_ATTENTION: {
        kiln_attention_args *a = args;
        DEV(a->kv.k), DEV(a->kv.v), DEV(a->q), DEV(a->out), DEV(a->tok_seq), DEV(a->tok_pos);
        DEV(a->blocks.table), DEV(a->blocks.seq_len);
        break;
    }
    default:
        break;
    }
}
#undef DEV

static float *frandom(bufs *b, size_t n, kiln_err *err) {
    float *x = balloc(b, n * sizeof(float), err);
    if (x)
        for (size_t i = 0; i < n; i++) x[i] = frand();
    return x;
}

static const void *random_weights(bufs *b, uint32_t dtype, int64_t rows, int64_t cols,
                                  size_t *row_bytes, kiln_err *err) {
    size_t rb;
    if (kiln_dtype_row_bytes(dtype, cols, &rb, err)) return NULL;
    size_t total;
    if (!kiln_size_mul(rb, (size_t)rows, &total)) {
        kiln_err_set(err, KILN_ERR_OVERFLOW, "tune: weight size overflows");
        return NULL;
    }
    uint8_t *w = balloc(b, total, err);
    float *row = balloc(b, (size_t)cols * sizeof(float), err);
    if (!w || !row) return NULL;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < cols; i++) row[i] = frand() * 0.1f;
        if (kiln_quantize_row(dtype, row, w + (size_t)r * rb, cols, err)) return NULL;
    }
    *row_bytes = rb;
    return w;
}

/* Plain rows w (row_bytes apart) of an n x k weight -> the layout the kernel reads, as the
 * loader makes it (bind.c's layouts). */
static const void *in_layout(bufs *b, uint32_t layout, uint32_t dtype, const void *w, int64_t n,
                             int64_t k, size_t *row_bytes, kiln_err *err) {
    size_t total;
    void *out;
    switch (layout) {
    case KILN_WLAYOUT_PLAIN:
        return w;
    case KILN_WLAYOUT_CPU_R16:
        if (!kiln_cpu_r16_supports(dtype)) break;
        if (kiln_cpu_r16_size(dtype, n, k, &total, err) || !(out = balloc(b, total, err)) ||
            kiln_cpu_r16_repack(dtype, w, *row_bytes, n, k, out, err))
            return NULL;
        *row_bytes = kiln_cpu_r16_group_bytes(dtype, k) / 16;
        return out;
    case KILN_WLAYOUT_CUDA_T16: {
        if (!kiln_cuda_t16_supports(dtype) || k % kiln_cuda_t16_k(dtype)) break;
        size_t rows = (size_t)((n + 15) / 16 * 16); /* the last tile padded */
        if (!kiln_size_mul(rows, *row_bytes, &total)) {
            kiln_err_set(err, KILN_ERR_OVERFLOW, "tune: T16 weight size overflows");
            return NULL;
        }
        if (!(out = balloc(b, total, err)) ||
            kiln_cuda_t16_repack(dtype, w, *row_bytes, n, k, out, err))
            return NULL;
        return out; /* a tile holds 16 plain rows' bytes: the row stride is unchanged */
    }
    default:
        break;
    }
    kiln_err_set(err, KILN_ERR_UNSUPPORTED, "tune: cannot make weight layout %u for %s, k %lld",
                 layout, kiln_dtype_name(dtype), (long long)k);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One call of the kernel on the arguments of its op (a: the union in kiln_tune_kernel). */
static kiln_status run_once(const kiln_reg_kernel *k, kiln_kop op, kiln_kctx *kc, void *a) {
    switch (op) {
    case KILN_KOP_MATMUL:
        return k->spec.fn.matmul(kc, a);
    case KILN_KOP_RMS_NORM:
        return k->spec.fn.rms_norm(kc, a);
    case KILN_KOP_ADD:
        return k->spec.fn.add(kc, a);
    case KILN_KOP_GLU:
        return k->spec.fn.glu(kc, a);
    case KILN_KOP_EMBED:
        return k->spec.fn.embed(kc, a);
    case KILN_KOP_ROPE:
        return k->spec.fn.rope(kc, a);
    case KILN_KOP_KV_WRITE:
        return k->spec.fn.kv_write(kc, a);
    case KILN_KOP_ATTENTION:
        return k->spec.fn.attention(kc, a);
    default:
        return KILN_ERR_UNSUPPORTED;
    }
}

kiln_status kiln_tune_kernel(const kiln_reg_kernel *k, const kiln_sel_ctx *c,
                             const kiln_tune_opts *o, kiln_perf_rec *rec, kiln_err *err) {
    memset(rec, 0, sizeof *rec);
    snprintf(rec->kernel_id, sizeof rec->kernel_id, "%s", k->spec.id);
    rec->op = (int32_t)c->op;
    rec->dtype = kiln_perf_ctx_dtype(c);
    rec->tok_bucket = c->tok_bucket;
    rec->seq_bucket = c->seq_bucket;
    kiln_perf_ctx_shape(c, rec->shape, sizeof rec->shape);
    if (!k->spec.fn.any)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "%s: not built", k->spec.id);
    const kiln_tune_device *dv = k->spec.platform != KILN_PLATFORM_HOST ? o->device : NULL;
    if (k->spec.platform != KILN_PLATFORM_HOST && !dv)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "%s: a device kernel, and no device to measure it on", k->spec.id);
    int64_t t = kiln_tune_tokens(c);
    bufs bb_ = {.rng = 0x9e3779b97f4a7c15ull}, *b = &bb_;
    kiln_status st = KILN_OK;
    size_t ws = k->spec.workspace ? k->spec.workspace(c) : 0;
    kiln_kctx kc = {.pool = o->pool,
                    .scratch = NULL,
                    .scratch_size = ws,
                    .stream = dv ? dv->stream : NULL,
                    .dev = dv ? dv->impl : NULL,
                    .err = err};
    if (ws && !(kc.scratch = balloc(b, ws, err))) {
        st = err ? err->code : KILN_ERR_NOMEM;
        goto done;
    }
    union {
        kiln_matmul_args mm;
        kiln_rms_norm_args rn;
        kiln_add_args add;
        kiln_glu_args glu;
        kiln_embed_args emb;
        kiln_rope_args rope;
        kiln_kv_write_args kvw;
        kiln_attention_args at;
    } a;
    memset(&a, 0, sizeof a);
    int32_t *ints = NULL;
    kiln_kv_blocks seq = {0};
    int64_t n = c->n > 0 ? c->n : 1;
#define NEED(ptr)                                                                                  \
    do {                                                                                           \
        if (!(ptr)) {                                                                              \
            st = err && err->code ? err->code : KILN_ERR_NOMEM;                                    \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)
    switch (c->op) {
    case KILN_KOP_MATMUL: {
        a.mm.n = n;
        a.mm.k = c->k;
        a.mm.t = t;
        a.mm.w_dtype = c->w_dtype;
        a.mm.w_layout = k->spec.w_layout;
        if (o->weights) {
            a.mm.w = o->weights;
            a.mm.w_row_bytes = o->w_row_bytes;
        } else {
            a.mm.w = random_weights(b, c->w_dtype, n, c->k, &a.mm.w_row_bytes, err);
            NEED(a.mm.w);
            a.mm.w =
                in_layout(b, a.mm.w_layout, c->w_dtype, a.mm.w, n, c->k, &a.mm.w_row_bytes, err);
            NEED(a.mm.w);
        }
        float *x = frandom(b, (size_t)(t * c->k), err);
        NEED(x);
        a.mm.x = x;
        a.mm.x_stride = c->k;
        NEED(a.mm.y = balloc(b, (size_t)(t * n) * sizeof(float), err));
        a.mm.y_stride = n;
        break;
    }
    case KILN_KOP_RMS_NORM: {
        float *x = frandom(b, (size_t)(t * n), err), *w = frandom(b, (size_t)n, err);
        NEED(x);
        NEED(w);
        a.rn = (kiln_rms_norm_args){
            .x = x, .y = x, .w = w, .rows = t, .n = n, .x_stride = n, .y_stride = n, .eps = 1e-6f};
        if (c->features & KILN_KFEAT_RESIDUAL) {
            float *r = frandom(b, (size_t)(t * n), err);
            NEED(r);
            a.rn.r = r;
            a.rn.r_stride = n;
        }
        break;
    }
    case KILN_KOP_ADD:
    case KILN_KOP_GLU: {
        float *x = frandom(b, (size_t)(t * n), err), *y = frandom(b, (size_t)(t * n), err);
        float *z = balloc(b, (size_t)(t * n) * sizeof(float), err);
        NEED(x);
        NEED(y);
        NEED(z);
        if (c->op == KILN_KOP_ADD)
            a.add = (kiln_add_args){x, y, z, t, n, n, n, n};
        else
            a.glu = (kiln_glu_args){
                x, y, z,
                t, n, n,
                n, n, (c->features & KILN_KFEAT_GEGLU) ? KILN_GLU_GEGLU_TANH : KILN_GLU_SWIGLU};
        break;
    }
    case KILN_KOP_EMBED: {
        int64_t vocab = c->k > 0 ? c->k : 1000;
        size_t rb;
        const void *w = o->weights;
        if (w)
            rb = o->w_row_bytes;
        else
            NEED(w = random_weights(b, c->w_dtype, vocab, n, &rb, err));
        NEED(ints = balloc(b, (size_t)t * sizeof(int32_t), err));
        for (int64_t i = 0; i < t; i++) ints[i] = (int32_t)((i * 7919) % vocab);
        NEED(a.emb.y = balloc(b, (size_t)(t * n) * sizeof(float), err));
        a.emb.w = w;
        a.emb.w_dtype = c->w_dtype;
        a.emb.w_row_bytes = rb;
        a.emb.n_vocab = vocab;
        a.emb.dim = n;
        a.emb.ids = ints;
        a.emb.t = t;
        a.emb.y_stride = n;
        a.emb.scale = 1.0f;
        break;
    }
    case KILN_KOP_ROPE: {
        int32_t hd = c->head_dim > 0 ? c->head_dim : 64, nh = c->n_head > 0 ? c->n_head : 1;
        float *x = frandom(b, (size_t)(t * nh * hd), err);
        NEED(x);
        NEED(ints = balloc(b, (size_t)t * sizeof(int32_t), err));
        for (int64_t i = 0; i < t; i++) ints[i] = (int32_t)i;
        a.rope = (kiln_rope_args){.x = x,
                                  .rows = t,
                                  .x_stride = (int64_t)nh * hd,
                                  .n_head = nh,
                                  .head_dim = hd,
                                  .n_rot = hd,
                                  .pos = ints,
                                  .mode = (c->features & KILN_KFEAT_ROPE_NEOX) ? KILN_ROPE_NEOX
                                                                               : KILN_ROPE_NORM,
                                  .base = 10000.0f,
                                  .freq_scale = 1.0f,
                                  .attn_factor = 1.0f,
                                  .n_ctx_orig = 4096};
        break;
    }
    case KILN_KOP_KV_WRITE:
    case KILN_KOP_ATTENTION: {
        int32_t hd = c->head_dim > 0 ? c->head_dim : 64;
        int32_t nkv = c->n_kv_head > 0 ? c->n_kv_head : 1, nh = c->n_head > 0 ? c->n_head : nkv;
        uint32_t kvdt = c->kv_dtype == KILN_DTYPE_F32 ? KILN_DTYPE_F32 : KILN_DTYPE_F16;
        size_t elt = kvdt == KILN_DTYPE_F32 ? 4 : 2;
        int64_t ctxlen = c->op == KILN_KOP_ATTENTION ? kiln_seq_bucket_max(c->seq_bucket) : t;
        if (c->seq_max > 0 && ctxlen > c->seq_max) ctxlen = c->seq_max;
        if (ctxlen > 4096) ctxlen = 4096;
        if (ctxlen < t) ctxlen = t;
        int32_t nblk = (int32_t)((ctxlen + KILN_KV_BLOCK - 1) / KILN_KV_BLOCK);
        size_t bb = (size_t)KILN_KV_BLOCK * (size_t)nkv * (size_t)hd * elt;
        kiln_kv_layer kv = {.dtype = kvdt, .n_kv_head = nkv, .head_dim = hd, .block_bytes = bb};
        NEED(kv.k = balloc(b, bb * (size_t)nblk, err));
        NEED(kv.v = balloc(b, bb * (size_t)nblk, err));
        NEED(ints = balloc(b, (size_t)(nblk + 2 * t + 1) * sizeof(int32_t), err));
        for (int32_t i = 0; i < nblk; i++) ints[i] = i;
        int32_t *tok_seq = ints + nblk, *tok_pos = tok_seq + t, *seq_len = tok_pos + t;
        for (int64_t i = 0; i < t; i++) tok_seq[i] = 0, tok_pos[i] = (int32_t)(ctxlen - t + i);
        *seq_len = (int32_t)ctxlen;
        seq = (kiln_kv_blocks){.table = ints, .seq_len = seq_len, .n_seqs = 1, .stride = nblk};
        float *q = frandom(b, (size_t)(t * nh * hd), err);
        NEED(q);
        if (c->op == KILN_KOP_KV_WRITE) {
            float *kk = frandom(b, (size_t)(t * nkv * hd), err);
            NEED(kk);
            a.kvw = (kiln_kv_write_args){.kv = kv,
                                         .k = kk,
                                         .v = kk,
                                         .k_stride = (int64_t)nkv * hd,
                                         .v_stride = (int64_t)nkv * hd,
                                         .t = t,
                                         .tok_seq = tok_seq,
                                         .tok_pos = tok_pos,
                                         .blocks = seq};
        } else {
            float *out = balloc(b, (size_t)(t * nh * hd) * sizeof(float), err);
            NEED(out);
            a.at = (kiln_attention_args){.kv = kv,
                                         .q = q,
                                         .q_stride = (int64_t)nh * hd,
                                         .out = out,
                                         .out_stride = (int64_t)nh * hd,
                                         .t = t,
                                         .n_head = nh,
                                         .tok_seq = tok_seq,
                                         .tok_pos = tok_pos,
                                         .blocks = seq,
                                         .scale = 1.0f / sqrtf((float)hd)};
        }
        break;
    }
    default:
        st = kiln_err_set(err, KILN_ERR_UNSUPPORTED, "tune: no benchmark for op %s",
                          kiln_kop_name(c->op));
        goto done;
    }
#undef NEED
    if (dv) {
        st = mirror(b, dv, err);
        if (st) goto done;
        kc.scratch = dev_addr(b, kc.scratch);
        to_device(b, c->op, &a);
    }
    int warm = o->warmup < 1 ? 1 : o->warmup, reps = o->reps < 3 ? 3 : o->reps;
    double *times = kiln_calloc((size_t)reps, sizeof *times);
    if (!times) {
        st = kiln_err_set(err, KILN_ERR_NOMEM, "tune: out of memory");
        goto done;
    }
    int done_reps = 0;
    uint64_t start = kiln_now_ns();
    for (int i = 0; i < warm + reps; i++) {
        /* a device sample: a batch of calls back to back, then one wait */
        int calls = dv && i > 0 ? KILN_TUNE_DEVICE_BATCH : 1;
        uint64_t t0 = kiln_now_ns();
        for (int j = 0; j < calls && !st; j++) st = run_once(k, c->op, &kc, &a);
        if (!st && dv) st = dv->sync(dv->ctx, err);
        double us = (double)(kiln_now_ns() - t0) / 1e3 / calls;
        if (st) {
            char why[KILN_ERR_MSG_MAX] = "";
            if (err) memcpy(why, err->msg, sizeof why);
            why[sizeof why - 1] = 0;
            kiln_free(times);
            st = kiln_err_set(err, st, "%s failed while tuning (%s%s%s)", k->spec.id,
                              kiln_status_name(st), why[0] ? ": " : "", why);
            goto done;
        }
        if (i == 0) rec->warmup_ms = us / 1e3;
        if (i >= warm) times[done_reps++] = us;
        if (i >= warm + 2 && o->max_seconds > 0 &&
            (double)(kiln_now_ns() - start) / 1e9 > o->max_seconds)
            break;
    }
    qsort(times, (size_t)done_reps, sizeof *times, cmp_double);
    double mean = 0, var = 0;
    for (int i = 0; i < done_reps; i++) mean += times[i];
    mean /= done_reps;
    for (int i = 0; i < done_reps; i++) var += (times[i] - mean) * (times[i] - mean);
    rec->median_us = done_reps % 2 ? times[done_reps / 2]
                                   : 0.5 * (times[done_reps / 2 - 1] + times[done_reps / 2]);
    int p95 = (int)ceil(0.95 * done_reps) - 1;
    rec->p95_us = times[p95 < 0 ? 0 : p95];
    rec->variance_us2 = done_reps > 1 ? var / (done_reps - 1) : 0;
    rec->samples = done_reps;
    kiln_free(times);
done:
    for (int i = 0; i < b->n; i++) {
        if (b->d[i] && dv) dv->free(dv->ctx, b->d[i]);
        kiln_free_aligned(b->p[i]);
    }
    return st;
}
