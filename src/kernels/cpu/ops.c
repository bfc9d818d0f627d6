/*
 * ops.c — the CPU backend's scalar ops (embed, rope, kv_write): baseline x86-64 code,
 * each far below 1 % of a step's time, threaded over tokens when a call is large.
 */
#include "base/mem.h"
#include "format/dtype.h"
#include "kernels/cpu/cpu_ops.h"

#include <math.h>
#include <string.h>

/* ---- embed ---- */

static void embed_range(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    const kiln_embed_args *a = ctx;
    for (int64_t t = b; t < e; t++) {
        float *y = a->y + t * a->y_stride;
        const uint8_t *row = (const uint8_t *)a->w + (size_t)a->ids[t] * a->w_row_bytes;
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

static void rope_range(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    const rope_job *j = ctx;
    const kiln_rope_args *a = j->a;
    const int half = a->n_rot / 2;
    float cs[512], sn[512]; /* n_rot <= 1024, checked by kiln_cpu_rope */
    const float theta_scale = powf(a->base, -2.0f / (float)a->n_rot);
    for (int64_t r = b; r < e; r++) {
        float theta = (float)a->pos[r];
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
        for (int h = 0; h < a->n_head; h++) {
            float *x = a->x + r * a->x_stride + (int64_t)h * a->head_dim;
            if (a->mode == KILN_ROPE_NEOX) {
                for (int i = 0; i < half; i++) {
                    float x0 = x[i], x1 = x[i + half];
                    x[i] = x0 * cs[i] - x1 * sn[i];
                    x[i + half] = x0 * sn[i] + x1 * cs[i];
                }
            } else {
                for (int i = 0; i < half; i++) {
                    float x0 = x[2 * i], x1 = x[2 * i + 1];
                    x[2 * i] = x0 * cs[i] - x1 * sn[i];
                    x[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
                }
            }
        }
    }
}

kiln_status kiln_cpu_rope(const kiln_kctx *c, const kiln_rope_args *a) {
    if (a->rows <= 0) return KILN_OK;
    if (a->n_rot <= 0 || a->n_rot > 1024 || a->n_rot % 2 || a->n_rot > a->head_dim)
        return KILN_ERR_UNSUPPORTED;
    rope_job j = {.a = a};
    if (a->ext_factor != 0.0f) {
        float lo = floorf(yarn_corr_dim(a->n_rot, a->n_ctx_orig, a->beta_fast, a->base));
        float hi = ceilf(yarn_corr_dim(a->n_rot, a->n_ctx_orig, a->beta_slow, a->base));
        j.corr[0] = fmaxf(0.0f, lo);
        j.corr[1] = fminf((float)(a->n_rot - 1), hi);
    }
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
        const kiln_kv_seq *s = &a->seqs[a->tok_seq[t]];
        const int32_t p = a->tok_pos[t];
        const size_t off = (size_t)s->block_table[p / KILN_KV_BLOCK] * kv->block_bytes;
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
