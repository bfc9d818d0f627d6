/*
 * ops.c — the CPU backend's scalar ops (embed, rope, kv_write, rope_kv): baseline x86-64 code,
 * each far below 1 % of a step's time, threaded over tokens when a call is large.
 */
#include "base/mem.h"
#include "format/dtype.h"
#include "kernels/cpu/cpu_fused.h"
#include "kernels/cpu/cpu_ops.h"

#include <math.h>
#include <string.h>

/* ---- embed ---- */

static void embed_range(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    const kiln_embed_args *a = ctx;
    for (int64_t t = b; t < e; t++) {
        float *y = a->y + t * a->y_stride;
        int64_t id = a->ids[t];
        if (a->shard) {
            id -= a->id_base; /* a vocabulary shard: other ids give zero rows */
            if (id < 0 || id >= a->n_vocab) {
                memset(y, 0, sizeof(float) * (size_t)a->dim);
                continue;
            }
        }
        const uint8_t *row = (const uint8_t *)a->w + (size_t)id * a->w_row_bytes;
        if (a->w_dtype == KILN_DTYPE_F32)
            memcpy(y, row, sizeof(float) * (size_t)a->dim);
        else
            kiln_dequantize_row(a->w_dtype, row, y, a->dim, NULL); /* dtype checked at bind */
        if (a->scale != 1.0f)
            for (int64_t i = 0; i < a->dim; i++) y[i] *= a->scale;
    }
}

kiln_status kiln_cpu_embed(const kiln_kctx *c, const kiln_embed_args *a) {
    if (a->t <= 0) return KILN_OK;
    const kiln_dtype_info *in = kiln_dtype_get(a->w_dtype);
    if (!in || !in->supported || a->dim % in->block_size) return KILN_ERR_UNSUPPORTED;
    if (a->t < 8 || !c)
        embed_range((void *)a, 0, a->t, 0);
    else
        kiln_pool_for(c->pool, a->t, 4, embed_range, (void *)a);
    return KILN_OK;
}

/* ---- rope (ggml semantics, including YaRN) ---- */

static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2.0f * (float)M_PI)) /
           (2.0f * logf(base));
}

typedef struct rope_job {
    const kiln_rope_args *a;
    float corr[2];
} rope_job;

/* cos and sin (times the magnitude scale) of the n_rot / 2 angles of one position */
static void rope_angles(const rope_job *j, int32_t pos, float *cs, float *sn) {
    const kiln_rope_args *a = j->a;
    const int half = a->n_rot / 2;
    const float theta_scale = powf(a->base, -2.0f / (float)a->n_rot);
    float theta = (float)pos;
    for (int i = 0; i < half; i++) {
        float ff = a->freq_factors ? a->freq_factors[i] : 1.0f;
        float te = theta / ff, ti = a->freq_scale * te, th = ti, ms = a->attn_factor;
        if (a->ext_factor != 0.0f) {
            float y = ((float)i - j->corr[0]) / fmaxf(0.001f, j->corr[1] - j->corr[0]);
            float ramp = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * a->ext_factor;
            th = ti * (1.0f - ramp) + te * ramp;
            ms *= 1.0f + 0.1f * logf(1.0f / a->freq_scale);
        }
        cs[i] = cosf(th) * ms;
        sn[i] = sinf(th) * ms;
        theta *= theta_scale;
    }
}

/* The rotated head x -> o (o may be x): pairs (i, i + n_rot/2) (NEOX) or (2i, 2i + 1);
 * dims >= n_rot are copied. */
static void rope_head(const kiln_rope_args *a, const float *cs, const float *sn, const float *x,
                      float *o) {
    const int half = a->n_rot / 2;
    if (a->mode == KILN_ROPE_NEOX) {
        for (int i = 0; i < half; i++) {
            float x0 = x[i], x1 = x[i + half];
            o[i] = x0 * cs[i] - x1 * sn[i];
            o[i + half] = x0 * sn[i] + x1 * cs[i];
        }
    } else {
        for (int i = 0; i < half; i++) {
            float x0 = x[2 * i], x1 = x[2 * i + 1];
            o[2 * i] = x0 * cs[i] - x1 * sn[i];
            o[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
        }
    }
    if (o != x)
        for (int i = a->n_rot; i < a->head_dim; i++) o[i] = x[i];
}

static void rope_range(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    const rope_job *j = ctx;
    const kiln_rope_args *a = j->a;
    float cs[512], sn[512]; /* n_rot <= 1024, checked by kiln_cpu_rope */
    for (int64_t r = b; r < e; r++) {
        rope_angles(j, a->pos[r], cs, sn);
        for (int h = 0; h < a->n_head; h++) {
            float *x = a->x + r * a->x_stride + (int64_t)h * a->head_dim;
            rope_head(a, cs, sn, x, x);
        }
    }
}

static bool rope_args_ok(const kiln_rope_args *a) {
    return a->n_rot > 0 && a->n_rot <= 1024 && a->n_rot % 2 == 0 && a->n_rot <= a->head_dim;
}

static void rope_corr(rope_job *j) {
    const kiln_rope_args *a = j->a;
    if (a->ext_factor != 0.0f) {
        float lo = floorf(yarn_corr_dim(a->n_rot, a->n_ctx_orig, a->beta_fast, a->base));
        float hi = ceilf(yarn_corr_dim(a->n_rot, a->n_ctx_orig, a->beta_slow, a->base));
        j->corr[0] = fmaxf(0.0f, lo);
        j->corr[1] = fminf((float)(a->n_rot - 1), hi);
    }
}

kiln_status kiln_cpu_rope(const kiln_kctx *c, const kiln_rope_args *a) {
    if (a->rows <= 0) return KILN_OK;
    if (!rope_args_ok(a)) return KILN_ERR_UNSUPPORTED;
    rope_job j = {.a = a};
    rope_corr(&j);
    if (a->rows < 8 || !c)
        rope_range(&j, 0, a->rows, 0);
    else
        kiln_pool_for(c->pool, a->rows, 4, rope_range, &j);
    return KILN_OK;
}

/* ---- kv_write ---- */

static void kvw_range(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    const kiln_kv_write_args *a = ctx;
    const kiln_kv_layer *kv = &a->kv;
    const int64_t w = (int64_t)kv->n_kv_head * kv->head_dim;
    for (int64_t t = b; t < e; t++) {
        const int32_t *tab = a->blocks.table + (size_t)a->tok_seq[t] * (size_t)a->blocks.stride;
        const int32_t p = a->tok_pos[t];
        const size_t off = (size_t)tab[p / KILN_KV_BLOCK] * kv->block_bytes;
        const size_t slot = (size_t)(p % KILN_KV_BLOCK) * (size_t)w;
        const float *ks = a->k + t * a->k_stride, *vs = a->v + t * a->v_stride;
        if (kv->dtype == KILN_DTYPE_F16) {
            uint16_t *kd = (uint16_t *)((uint8_t *)kv->k + off) + slot;
            uint16_t *vd = (uint16_t *)((uint8_t *)kv->v + off) + slot;
            for (int64_t i = 0; i < w; i++) {
                kd[i] = kiln_f32_to_fp16(ks[i]);
                vd[i] = kiln_f32_to_fp16(vs[i]);
            }
        } else {
            memcpy((float *)((uint8_t *)kv->k + off) + slot, ks, sizeof(float) * (size_t)w);
            memcpy((float *)((uint8_t *)kv->v + off) + slot, vs, sizeof(float) * (size_t)w);
        }
    }
}

kiln_status kiln_cpu_kv_write(const kiln_kctx *c, const kiln_kv_write_args *a) {
    if (a->t <= 0) return KILN_OK;
    if (a->kv.dtype != KILN_DTYPE_F16 && a->kv.dtype != KILN_DTYPE_F32) return KILN_ERR_UNSUPPORTED;
    if (a->t < 16 || !c)
        kvw_range((void *)a, 0, a->t, 0);
    else
        kiln_pool_for(c->pool, a->t, 8, kvw_range, (void *)a);
    return KILN_OK;
}

/* ---- rope + kv_write ---- */

typedef struct rope_kv_job {
    rope_job rj;
    const kiln_rope_kv_args *a;
} rope_kv_job;

static void store_row(uint32_t dtype, void *base, size_t off, size_t slot, const float *src,
                      int64_t w) {
    if (dtype == KILN_DTYPE_F16) {
        uint16_t *d = (uint16_t *)((uint8_t *)base + off) + slot;
        for (int64_t i = 0; i < w; i++) d[i] = kiln_f32_to_fp16(src[i]);
    } else {
        memcpy((float *)((uint8_t *)base + off) + slot, src, sizeof(float) * (size_t)w);
    }
}

static void rope_kv_range(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    const rope_kv_job *j = ctx;
    const kiln_rope_args *q = &j->a->rope;
    const kiln_kv_write_args *w = &j->a->kv;
    const kiln_kv_layer *kv = &w->kv;
    const int hd = kv->head_dim;
    const int64_t width = (int64_t)kv->n_kv_head * hd;
    float cs[512], sn[512], rot[1024];
    for (int64_t r = b; r < e; r++) {
        rope_angles(&j->rj, q->pos[r], cs, sn);
        for (int h = 0; h < q->n_head; h++) {
            float *x = q->x + r * q->x_stride + (int64_t)h * q->head_dim;
            rope_head(q, cs, sn, x, x);
        }
        const int32_t *tab = w->blocks.table + (size_t)w->tok_seq[r] * (size_t)w->blocks.stride;
        const int32_t p = w->tok_pos[r];
        const size_t off = (size_t)tab[p / KILN_KV_BLOCK] * kv->block_bytes;
        const size_t slot = (size_t)(p % KILN_KV_BLOCK) * (size_t)width;
        for (int h = 0; h < kv->n_kv_head; h++) {
            rope_head(q, cs, sn, w->k + r * w->k_stride + (int64_t)h * hd, rot);
            store_row(kv->dtype, kv->k, off, slot + (size_t)h * (size_t)hd, rot, hd);
        }
        store_row(kv->dtype, kv->v, off, slot, w->v + r * w->v_stride, width);
    }
}

kiln_status kiln_cpu_rope_kv(const kiln_kctx *c, const kiln_rope_kv_args *a) {
    const kiln_rope_args *q = &a->rope;
    const kiln_kv_write_args *w = &a->kv;
    if (w->t <= 0) return KILN_OK;
    if (!rope_args_ok(q) || q->rows != w->t || q->head_dim != w->kv.head_dim ||
        w->kv.head_dim > 1024 || (w->kv.dtype != KILN_DTYPE_F16 && w->kv.dtype != KILN_DTYPE_F32))
        return KILN_ERR_UNSUPPORTED;
    rope_kv_job j = {.rj = {.a = q}, .a = a};
    rope_corr(&j.rj);
    if (w->t < 8 || !c)
        rope_kv_range(&j, 0, w->t, 0);
    else
        kiln_pool_for(c->pool, w->t, 4, rope_kv_range, &j);
    return KILN_OK;
}
