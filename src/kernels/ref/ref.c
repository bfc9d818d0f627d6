/* ref.c — reference kernels (see ref.h for the rules they follow). */
#include "kernels/ref/ref.h"
#include "base/mem.h"
#include "kernels/ref/ref_fused.h"

#include "format/dtype.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

bool kiln_ref_weight_dtype_ok(uint32_t dtype) {
    if (dtype == KILN_DTYPE_F32 || dtype == KILN_DTYPE_F16 || dtype == KILN_DTYPE_BF16) return true;
    const kiln_dtype_info *info = kiln_dtype_get(dtype);
    return info && info->supported && info->quantized;
}

float kiln_ref_dot(const float *x, const float *y, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += x[i + j] * y[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += x[i] * y[i];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

kiln_status kiln_ref_row_to_f32(uint32_t dtype, const void *row, float *out, int64_t k) {
    switch (dtype) {
    case KILN_DTYPE_F32:
        memcpy(out, row, (size_t)k * sizeof(float));
        return KILN_OK;
    case KILN_DTYPE_F16: {
        const uint16_t *h = row;
        for (int64_t i = 0; i < k; i++) out[i] = kiln_fp16_to_f32(h[i]);
        return KILN_OK;
    }
    case KILN_DTYPE_BF16: {
        const uint16_t *h = row;
        for (int64_t i = 0; i < k; i++) out[i] = kiln_bf16_to_f32(h[i]);
        return KILN_OK;
    }
    default:
        return kiln_dequantize_row(dtype, row, out, k, NULL);
    }
}

/* ---- matmul: parallel over output features; each y[t][n] is one sequential dot ---- */

typedef struct mm_job {
    const kiln_matmul_args *a;
    atomic_int failed;
} mm_job;

static void mm_range(void *ctx, int64_t n0, int64_t n1, int ith) {
    mm_job *j = ctx;
    const kiln_matmul_args *a = j->a;
    float *row = NULL;
    if (a->w_dtype != KILN_DTYPE_F32) {
        row = kiln_malloc((size_t)a->k * sizeof(float));
        if (!row) {
            atomic_store(&j->failed, KILN_ERR_NOMEM);
            return;
        }
    }
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wr = (const uint8_t *)a->w + (size_t)n * a->w_row_bytes;
        const float *w;
        if (row) {
            if (kiln_ref_row_to_f32(a->w_dtype, wr, row, a->k) != KILN_OK) {
                atomic_store(&j->failed, KILN_ERR_UNSUPPORTED);
                break;
            }
            w = row;
        } else {
            w = (const float *)(const void *)wr;
        }
        float b = a->bias ? a->bias[n] : 0.0f;
        for (int64_t t = 0; t < a->t; t++)
            a->y[t * a->y_stride + n] = kiln_ref_dot(a->x + t * a->x_stride, w, a->k) + b;
    }
    kiln_free(row);
}

kiln_status kiln_ref_matmul(const kiln_kctx *c, const kiln_matmul_args *a) {
    /* the reference reads only the file's row layout; a repacked weight (left by a SIMD
     * kernel that was then broken) is an error, never a silent misread */
    if (a->w_layout != 0) return KILN_ERR_UNSUPPORTED;
    if (a->t == 0 || a->n == 0) return KILN_OK;
    mm_job j = {a, 0};
    /* grain: enough rows to amortise the per-chunk row buffer */
    kiln_pool_for(c ? c->pool : NULL, a->n, 16, mm_range, &j);
    int f = atomic_load(&j.failed);
    return f ? (kiln_status)f : KILN_OK;
}

kiln_status kiln_ref_embed(const kiln_kctx *c, const kiln_embed_args *a) {
    (void)c;
    for (int64_t t = 0; t < a->t; t++) {
        int64_t id = a->ids[t];
        float *y = a->y + t * a->y_stride;
        if (a->shard) {
            id -= a->id_base;
            if (id < 0 || id >= a->n_vocab) {
                memset(y, 0, (size_t)a->dim * sizeof(float));
                continue;
            }
        }
        if (id < 0 || id >= a->n_vocab) return KILN_ERR_RANGE;
        kiln_status st = kiln_ref_row_to_f32(
            a->w_dtype, (const uint8_t *)a->w + (size_t)id * a->w_row_bytes, y, a->dim);
        if (st) return st;
        if (a->scale != 1.0f)
            for (int64_t i = 0; i < a->dim; i++) y[i] *= a->scale;
    }
    return KILN_OK;
}

kiln_status kiln_ref_rms_norm(const kiln_kctx *c, const kiln_rms_norm_args *a) {
    (void)c;
    for (int64_t r = 0; r < a->rows; r++) {
        float *x = a->x + r * a->x_stride;
        float *y = a->y + r * a->y_stride;
        if (a->r) {
            const float *rr = a->r + r * a->r_stride, *x0 = x;
            if (a->s) x = a->s + r * a->s_stride; /* the sum to its own buffer */
            for (int64_t i = 0; i < a->n; i++) x[i] = x0[i] + rr[i];
        }
        double sum = 0.0;
        for (int64_t i = 0; i < a->n; i++) sum += (double)x[i] * (double)x[i];
        const float mean = (float)(sum / (double)a->n);
        const float scale = 1.0f / sqrtf(mean + a->eps);
        const float *w = a->w2 && r >= a->w2_row ? a->w2 : a->w;
        for (int64_t i = 0; i < a->n; i++) {
            float v = x[i] * scale;
            y[i] = w ? v * (w[i] + a->w_offset) : v;
        }
    }
    return KILN_OK;
}

/* ---- RoPE (ggml semantics, including YaRN) ---- */

static float yarn_ramp(float low, float high, int i0) {
    const float y = (float)(i0 / 2 - low) / fmaxf(0.001f, high - low);
    return 1 - fminf(1, fmaxf(0, y));
}

static float corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

kiln_status kiln_ref_rope(const kiln_kctx *c, const kiln_rope_args *a) {
    (void)c;
    const int nd = a->n_rot;
    if (nd <= 0) return KILN_OK;
    float *cache = kiln_malloc((size_t)nd * sizeof(float));
    if (!cache) return KILN_ERR_NOMEM;
    float corr[2] = {0, 0};
    if (a->ext_factor != 0.0f) {
        float start = floorf(corr_dim(nd, a->n_ctx_orig, a->beta_fast, a->base));
        float end = ceilf(corr_dim(nd, a->n_ctx_orig, a->beta_slow, a->base));
        corr[0] = fmaxf(0, start);
        corr[1] = fminf((float)(nd - 1), end);
    }
    const float theta_scale = powf(a->base, -2.0f / (float)nd);
    for (int64_t r = 0; r < a->rows; r++) {
        float theta = (float)a->pos[r];
        for (int i0 = 0; i0 < nd; i0 += 2) {
            const float ff = a->freq_factors ? a->freq_factors[i0 / 2] : 1.0f;
            const float extrap = theta / ff;
            float interp = a->freq_scale * extrap, th = interp, mscale = a->attn_factor;
            if (a->ext_factor != 0.0f) {
                float mix = yarn_ramp(corr[0], corr[1], i0) * a->ext_factor;
                th = interp * (1 - mix) + extrap * mix;
                mscale *= 1.0f + 0.1f * logf(1.0f / a->freq_scale);
            }
            cache[i0] = cosf(th) * mscale;
            cache[i0 + 1] = sinf(th) * mscale;
            theta *= theta_scale;
        }
        for (int h = 0; h < a->n_head; h++) {
            float *x = a->x + r * a->x_stride + (int64_t)h * a->head_dim;
            for (int i0 = 0; i0 < nd; i0 += 2) {
                const float ct = cache[i0], st = cache[i0 + 1];
                int i, j;
                if (a->mode == KILN_ROPE_NEOX) {
                    i = i0 / 2;
                    j = i + nd / 2;
                } else {
                    i = i0;
                    j = i0 + 1;
                }
                const float x0 = x[i], x1 = x[j];
                x[i] = x0 * ct - x1 * st;
                x[j] = x0 * st + x1 * ct;
            }
        }
    }
    kiln_free(cache);
    return KILN_OK;
}

/* ---- paged KV ---- */

static inline size_t kv_off(const kiln_kv_layer *kv, int32_t block, int32_t slot, int32_t h) {
    size_t elt = kv->dtype == KILN_DTYPE_F16 ? 2 : 4;
    return (size_t)block * kv->block_bytes +
           ((size_t)slot * (size_t)kv->n_kv_head + (size_t)h) * (size_t)kv->head_dim * elt;
}

static void kv_store(const kiln_kv_layer *kv, void *base, size_t off, const float *src) {
    uint8_t *dst = (uint8_t *)base + off;
    if (kv->dtype == KILN_DTYPE_F16) {
        uint16_t *d = (uint16_t *)(void *)dst;
        for (int i = 0; i < kv->head_dim; i++) d[i] = kiln_f32_to_fp16(src[i]);
    } else {
        memcpy(dst, src, (size_t)kv->head_dim * sizeof(float));
    }
}

kiln_status kiln_ref_kv_write(const kiln_kctx *c, const kiln_kv_write_args *a) {
    (void)c;
    for (int64_t t = 0; t < a->t; t++) {
        const int32_t row = a->tok_seq[t];
        int32_t pos = a->tok_pos[t];
        int32_t lb = pos / KILN_KV_BLOCK, slot = pos % KILN_KV_BLOCK;
        if (row < 0 || row >= a->blocks.n_seqs || pos < 0 || pos >= a->blocks.seq_len[row] ||
            lb >= a->blocks.stride)
            return KILN_ERR_RANGE;
        int32_t b = a->blocks.table[(size_t)row * (size_t)a->blocks.stride + (size_t)lb];
        for (int32_t h = 0; h < a->kv.n_kv_head; h++) {
            size_t off = kv_off(&a->kv, b, slot, h);
            kv_store(&a->kv, a->kv.k, off, a->k + t * a->k_stride + (int64_t)h * a->kv.head_dim);
            kv_store(&a->kv, a->kv.v, off, a->v + t * a->v_stride + (int64_t)h * a->kv.head_dim);
        }
    }
    return KILN_OK;
}

typedef struct attn_job {
    const kiln_attention_args *a;
    bool ggml; /* ggml numerics: f16 q, k, v and probabilities (kiln_ref_attention_ggml) */
    atomic_int failed;
} attn_job;

static inline float f16_round(float v) {
    return kiln_fp16_to_f32(kiln_f32_to_fp16(v));
}

static void kv_load(const kiln_kv_layer *kv, const void *base, size_t off, float *dst) {
    const uint8_t *src = (const uint8_t *)base + off;
    if (kv->dtype == KILN_DTYPE_F16) {
        const uint16_t *s = (const uint16_t *)(const void *)src;
        for (int i = 0; i < kv->head_dim; i++) dst[i] = kiln_fp16_to_f32(s[i]);
    } else {
        memcpy(dst, src, (size_t)kv->head_dim * sizeof(float));
    }
}

static void attn_range(void *ctx, int64_t r0, int64_t r1, int ith) {
    attn_job *j = ctx;
    const kiln_attention_args *a = j->a;
    const int hd = a->kv.head_dim;
    const int group = a->n_head / a->kv.n_kv_head;
    float *tmp = kiln_malloc((size_t)hd * 3 * sizeof(float));
    float *scores = NULL;
    size_t scores_cap = 0;
    if (!tmp) {
        atomic_store(&j->failed, KILN_ERR_NOMEM);
        return;
    }
    float *kv = tmp, *acc = tmp + hd, *q16 = tmp + 2 * hd;
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = r / a->n_head;
        int h = (int)(r % a->n_head), kvh = h / group;
        const int32_t row = a->tok_seq[t];
        int32_t pos = a->tok_pos[t];
        int32_t p0 = 0;
        if (a->window > 0 && pos - a->window + 1 > 0) p0 = pos - a->window + 1;
        size_t n = (size_t)(pos - p0 + 1);
        if (row < 0 || row >= a->blocks.n_seqs || pos < 0 || pos >= a->blocks.seq_len[row] ||
            pos / KILN_KV_BLOCK >= a->blocks.stride) {
            atomic_store(&j->failed, KILN_ERR_RANGE);
            break;
        }
        if (n > scores_cap) {
            kiln_free(scores);
            scores = kiln_malloc(n * sizeof(float));
            scores_cap = n;
            if (!scores) {
                atomic_store(&j->failed, KILN_ERR_NOMEM);
                break;
            }
        }
        const float *q = a->q + t * a->q_stride + (int64_t)h * hd;
        if (j->ggml) { /* ggml converts q to K's f16 type before the dot */
            for (int d = 0; d < hd; d++) q16[d] = f16_round(q[d]);
            q = q16;
        }
        float mx = -INFINITY;
        const int32_t *tab = a->blocks.table + (size_t)row * (size_t)a->blocks.stride;
        for (int32_t p = p0; p <= pos; p++) {
            int32_t b = tab[p / KILN_KV_BLOCK];
            kv_load(&a->kv, a->kv.k, kv_off(&a->kv, b, p % KILN_KV_BLOCK, kvh), kv);
            if (j->ggml)
                for (int d = 0; d < hd; d++) kv[d] = f16_round(kv[d]);
            float sc = kiln_ref_dot(q, kv, hd) * a->scale;
            if (a->softcap > 0) sc = a->softcap * tanhf(sc / a->softcap);
            scores[p - p0] = sc;
            if (sc > mx) mx = sc;
        }
        double sum = 0.0;
        for (size_t i = 0; i < n; i++) {
            scores[i] = expf(scores[i] - mx);
            sum += scores[i];
        }
        const float inv = (float)(1.0 / sum);
        for (int d = 0; d < hd; d++) acc[d] = 0;
        for (int32_t p = p0; p <= pos; p++) {
            int32_t b = tab[p / KILN_KV_BLOCK];
            kv_load(&a->kv, a->kv.v, kv_off(&a->kv, b, p % KILN_KV_BLOCK, kvh), kv);
            float w = scores[p - p0] * inv;
            if (j->ggml) { /* the probabilities go to the f16 P x V product */
                w = f16_round(w);
                for (int d = 0; d < hd; d++) kv[d] = f16_round(kv[d]);
            }
            for (int d = 0; d < hd; d++) acc[d] += w * kv[d];
        }
        memcpy(a->out + t * a->out_stride + (int64_t)h * hd, acc, (size_t)hd * sizeof(float));
    }
    kiln_free(scores);
    kiln_free(tmp);
}

static kiln_status attention(const kiln_kctx *c, const kiln_attention_args *a, bool ggml) {
    if (a->t == 0) return KILN_OK;
    if (a->kv.n_kv_head <= 0 || a->n_head % a->kv.n_kv_head) return KILN_ERR_INVALID_ARG;
    attn_job j = {a, ggml, 0};
    kiln_pool_for(c ? c->pool : NULL, a->t * a->n_head, 1, attn_range, &j);
    int f = atomic_load(&j.failed);
    return f ? (kiln_status)f : KILN_OK;
}

kiln_status kiln_ref_attention(const kiln_kctx *c, const kiln_attention_args *a) {
    return attention(c, a, false);
}

kiln_status kiln_ref_attention_ggml(const kiln_kctx *c, const kiln_attention_args *a) {
    return attention(c, a, true);
}

/* GELU (tanh form) in ggml's association: 0.5f*x*(1 + tanh(s*x*(1 + a*x*x))) */
static float gelu_tanh(float x) {
    static const float sqrt_2_over_pi = 0.79788456080286535587989211986876f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * (1.0f + 0.044715f * x * x)));
}

/* ggml's GELU on x86 builds (GGML_GELU_FP16): a table over f16 inputs of f16 results,
 * exact outside (-10, 10) */
static float gelu_tanh_f16_table(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return f16_round(gelu_tanh(f16_round(x)));
}

static kiln_status glu(const kiln_kctx *c, const kiln_glu_args *a, bool ggml) {
    (void)c;
    for (int64_t t = 0; t < a->t; t++) {
        const float *g = a->gate + t * a->gate_stride, *u = a->up + t * a->up_stride;
        float *y = a->y + t * a->y_stride;
        for (int64_t i = 0; i < a->n; i++) {
            float x = g[i], v;
            switch (a->act) {
            case KILN_GLU_SWIGLU:
                v = x / (1.0f + expf(-x));
                break;
            case KILN_GLU_GEGLU_TANH:
                v = ggml ? gelu_tanh_f16_table(x) : gelu_tanh(x);
                break;
            case KILN_GLU_GEGLU_ERF:
                v = 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
                break;
            default:
                return KILN_ERR_INVALID_ARG;
            }
            y[i] = v * u[i];
        }
    }
    return KILN_OK;
}

kiln_status kiln_ref_glu(const kiln_kctx *c, const kiln_glu_args *a) {
    return glu(c, a, false);
}

kiln_status kiln_ref_glu_ggml(const kiln_kctx *c, const kiln_glu_args *a) {
    return glu(c, a, true);
}

kiln_status kiln_ref_add(const kiln_kctx *c, const kiln_add_args *a) {
    (void)c;
    for (int64_t t = 0; t < a->t; t++) {
        const float *x = a->a + t * a->a_stride, *y = a->b + t * a->b_stride;
        float *o = a->y + t * a->y_stride;
        for (int64_t i = 0; i < a->n; i++) o[i] = x[i] + y[i];
    }
    return KILN_OK;
}

kiln_kernel_fn kiln_ref_kernel(kiln_kop op) {
    kiln_kernel_fn f = {.any = NULL};
    switch (op) {
    case KILN_KOP_MATMUL:
        f.matmul = kiln_ref_matmul;
        break;
    case KILN_KOP_EMBED:
        f.embed = kiln_ref_embed;
        break;
    case KILN_KOP_RMS_NORM:
        f.rms_norm = kiln_ref_rms_norm;
        break;
    case KILN_KOP_ROPE:
        f.rope = kiln_ref_rope;
        break;
    case KILN_KOP_KV_WRITE:
        f.kv_write = kiln_ref_kv_write;
        break;
    case KILN_KOP_ATTENTION:
        f.attention = kiln_ref_attention;
        break;
    case KILN_KOP_GLU:
        f.glu = kiln_ref_glu;
        break;
    case KILN_KOP_ADD:
        f.add = kiln_ref_add;
        break;
    case KILN_KOP_MATMUL_GROUP:
        f.matmul_group = kiln_ref_matmul_group;
        break;
    case KILN_KOP_ROPE_KV:
        f.rope_kv = kiln_ref_rope_kv;
        break;
    case KILN_KOP_MATMUL_ARGMAX:
        f.matmul_argmax = kiln_ref_matmul_argmax;
        break;
    case KILN_KOP_SAMPLE:
        f.sample = kiln_ref_sample;
        break;
    default:
        break;
    }
    return f;
}
