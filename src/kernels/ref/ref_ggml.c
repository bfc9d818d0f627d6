/*
 * ref_ggml.c — the reference matmul in "ggml numerics" (ref.h, docs/PLAN.md
 * "Numerics"): llama.cpp's CPU backend does not multiply quantized weights
 * with f32 activations; it first quantizes each activation row to the weight type's
 * "vec_dot type" and computes integer dot products per block, scaled in f32. This file
 * does the same arithmetic, in plain C, so that kiln can be compared with llama.cpp
 * on quantized models at the level of rounding noise instead of at the level of the
 * activation quantization error.
 *
 * The activation quantizers are those ggml runs on x86 with AVX/AVX2/AVX-512
 * (ggml-cpu/arch/x86/quants.c and repack.cpp at llama.cpp 3f545bec):
 *   q8_0  (partner of q4_0, q5_0, q8_0), per 32: amax = max |x|, d = amax / 127 stored as
 *         fp16 (round to nearest even), q = rint(x * (127 / amax)) — multiplied by the f32
 *         inverse, not divided by the fp16 d; rint rounds half-way cases to even.
 *   q8_1  (partner of q4_1, q5_1): q8_0 plus s = fp16(d * sum(q)) with the f32 d.
 *   q8_K  (partner of q2_K..q6_K), per 256: iscale = -127 / max (max: the element of largest
 *         magnitude, with its sign), q = min(127, rint(iscale * x)), f32 d = 1 / iscale,
 *         bsums = sum of each 16 q. The AVX2 4-row quantizer of the repacked q4_K kernels
 *         may pick the opposite sign when +amax and -amax both occur; that negates q and d
 *         together and gives the same products.
 * The dot products follow ggml's per-block formulas: an exact int32 sum of weight quant x
 * activation quant per block (or sub-block), times the block's f32 scales
 * (fp16(d_w) * d_a), accumulated in f32 in block order. ggml's SIMD kernels sum the same
 * terms in another order (lanes, pairs of blocks), so kiln and llama.cpp differ by f32
 * rounding only (~1e-7 relative), not by quantization.
 */
#include "base/mem.h"
#include "format/dtype.h"
#include "format/quants.h"
#include "kernels/ref/ref.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- activation quantizers ---- */

static float absmax(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = fmaxf(amax, fabsf(x[j]));
    return amax;
}

/* rint under the default rounding mode: nearest, ties to even (as _mm256_round_ps with
 * _MM_ROUND_NEAREST and ggml's nearest_int) */
static int8_t round_q8(float v) {
    float r = rintf(v);
    return (int8_t)(r > 127.0f ? 127 : r < -128.0f ? -128 : (int)r);
}

void kiln_ggml_quantize_q8_0(const float *x, kiln_block_q8_0 *y, int64_t k) {
    for (int64_t b = 0; b < k / KILN_QK8_0; b++, x += KILN_QK8_0) {
        const float amax = absmax(x, KILN_QK8_0);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[b].d = kiln_f32_to_fp16(d);
        for (int j = 0; j < KILN_QK8_0; j++) y[b].qs[j] = round_q8(x[j] * id);
    }
}

void kiln_ggml_quantize_q8_1(const float *x, kiln_block_q8_1 *y, int64_t k) {
    for (int64_t b = 0; b < k / KILN_QK8_1; b++, x += KILN_QK8_1) {
        const float amax = absmax(x, KILN_QK8_1);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < KILN_QK8_1; j++) {
            y[b].qs[j] = round_q8(x[j] * id);
            sum += y[b].qs[j];
        }
        y[b].d = kiln_f32_to_fp16(d);
        y[b].s = kiln_f32_to_fp16(d * (float)sum);
    }
}

void kiln_ggml_quantize_q8_K(const float *x, kiln_block_q8_K *y, int64_t k) {
    for (int64_t b = 0; b < k / KILN_QK_K; b++, x += KILN_QK_K) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < KILN_QK_K; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        memset(&y[b], 0, sizeof y[b]);
        if (amax == 0.0f) continue;
        const float iscale = -127.0f / max;
        for (int j = 0; j < KILN_QK_K; j++) {
            float r = rintf(iscale * x[j]);
            y[b].qs[j] = (int8_t)(r > 127.0f ? 127 : (int)r);
        }
        for (int g = 0; g < KILN_QK_K / 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += y[b].qs[16 * g + j];
            y[b].bsums[g] = (int16_t)s;
        }
        y[b].d = 1.0f / iscale;
    }
}

uint32_t kiln_ggml_vec_dot_type(uint32_t w_dtype) {
    switch (w_dtype) {
    case KILN_DTYPE_Q4_0:
    case KILN_DTYPE_Q5_0:
    case KILN_DTYPE_Q8_0:
        return KILN_DTYPE_Q8_0;
    case KILN_DTYPE_Q4_1:
    case KILN_DTYPE_Q5_1:
        return KILN_DTYPE_Q8_1;
    case KILN_DTYPE_Q2_K:
    case KILN_DTYPE_Q3_K:
    case KILN_DTYPE_Q4_K:
    case KILN_DTYPE_Q5_K:
    case KILN_DTYPE_Q6_K:
        return KILN_DTYPE_Q8_K;
    default:
        return KILN_DTYPE_F32; /* float weights: ggml computes in float (not emulated) */
    }
}

kiln_status kiln_ggml_quantize_row(uint32_t act_dtype, const float *x, void *dst, int64_t k) {
    switch (act_dtype) {
    case KILN_DTYPE_Q8_0:
        if (k % KILN_QK8_0) return KILN_ERR_INVALID_ARG;
        kiln_ggml_quantize_q8_0(x, dst, k);
        return KILN_OK;
    case KILN_DTYPE_Q8_1:
        if (k % KILN_QK8_1) return KILN_ERR_INVALID_ARG;
        kiln_ggml_quantize_q8_1(x, dst, k);
        return KILN_OK;
    case KILN_DTYPE_Q8_K:
        if (k % KILN_QK_K) return KILN_ERR_INVALID_ARG;
        kiln_ggml_quantize_q8_K(x, dst, k);
        return KILN_OK;
    default:
        return KILN_ERR_UNSUPPORTED;
    }
}

/* ---- weight blocks unpacked to integer quants (element order as dequantization) ----
 * A block of 32 (q4_0..q8_0) or 256 (K types) weights as ggml's dot products see it:
 *   32-element types:  w[j] = d * q[j] (+ dmin for q4_1 / q5_1, their min m)
 *   K types:           w[j] = d * sc[g] * q[j] - dmin * m[g]  for j in sub-block g
 * (q3_K and q6_K have no min: m = 0). */
typedef struct ublock {
    int8_t q[KILN_QK_K];
    int16_t sc[16], m[16];
    int sub; /* K types: elements per sub-block (16 or 32) */
    float d, dmin;
} ublock;

static uint32_t load_qh(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

static void unpack_q5(const uint8_t qs[16], const uint8_t qh4[4], int offset, int8_t q[32]) {
    const uint32_t qh = load_qh(qh4);
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)((int)((qs[j] & 0xF) | ((qh >> j) & 1) << 4) - offset);
        q[j + 16] = (int8_t)((int)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - offset);
    }
}

static void unpack_q2_K(const kiln_block_q2_K *b, ublock *u) {
    u->d = kiln_fp16_to_f32(b->d);
    u->dmin = kiln_fp16_to_f32(b->dmin);
    u->sub = 16;
    int e = 0;
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int g = 0; g < 2; g++) {
                const int gi = 8 * h + 2 * s + g;
                u->sc[gi] = b->scales[gi] & 0xF;
                u->m[gi] = b->scales[gi] >> 4;
                for (int l = 0; l < 16; l++)
                    u->q[e++] = (int8_t)((b->qs[32 * h + 16 * g + l] >> (2 * s)) & 3);
            }
}

static void unpack_q3_K(const kiln_block_q3_K *b, ublock *u) {
    int8_t sc[16];
    kiln_q3_K_scales(b->scales, sc);
    u->d = kiln_fp16_to_f32(b->d);
    u->dmin = 0.0f;
    u->sub = 16;
    int e = 0;
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++) {
            const uint8_t mask = (uint8_t)(1u << (4 * h + s));
            for (int g = 0; g < 2; g++) {
                const int gi = 8 * h + 2 * s + g;
                u->sc[gi] = sc[gi];
                u->m[gi] = 0;
                for (int l = 0; l < 16; l++) {
                    int lo = (b->qs[32 * h + 16 * g + l] >> (2 * s)) & 3;
                    u->q[e++] = (int8_t)(lo - ((b->hmask[16 * g + l] & mask) ? 0 : 4));
                }
            }
        }
}

static void unpack_q45_K(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, uint16_t d,
                         uint16_t dmin, ublock *u) {
    u->d = kiln_fp16_to_f32(d);
    u->dmin = kiln_fp16_to_f32(dmin);
    u->sub = 32;
    int e = 0;
    for (int c = 0; c < 4; c++) {
        const uint8_t *q = qs + 32 * c;
        for (int half = 0; half < 2; half++) {
            const int g = 2 * c + half;
            uint8_t sc, m;
            kiln_get_scale_min_k4(g, scales, &sc, &m);
            u->sc[g] = sc;
            u->m[g] = m;
            const uint8_t hbit = (uint8_t)(1u << g);
            for (int l = 0; l < 32; l++) {
                int v = half ? q[l] >> 4 : q[l] & 0xF;
                if (qh && (qh[l] & hbit)) v += 16;
                u->q[e++] = (int8_t)v;
            }
        }
    }
}

static void unpack_q6_K(const kiln_block_q6_K *b, ublock *u) {
    u->d = kiln_fp16_to_f32(b->d);
    u->dmin = 0.0f;
    u->sub = 16;
    for (int g = 0; g < 16; g++) {
        u->sc[g] = b->scales[g];
        u->m[g] = 0;
    }
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        int8_t *q = u->q + 128 * h;
        for (int l = 0; l < 32; l++) {
            q[l] = (int8_t)(((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32);
            q[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32);
            q[l + 64] = (int8_t)(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
            q[l + 96] = (int8_t)(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
        }
    }
}

/* Unpacks block i of a weight row of w_dtype (one with a vec_dot type). */
static void unpack_block(uint32_t w_dtype, const uint8_t *row, int64_t i, ublock *u) {
    switch (w_dtype) {
    case KILN_DTYPE_Q4_0: {
        kiln_block_q4_0 b;
        memcpy(&b, row + i * sizeof b, sizeof b);
        for (int j = 0; j < 16; j++) {
            u->q[j] = (int8_t)((b.qs[j] & 0xF) - 8);
            u->q[j + 16] = (int8_t)((b.qs[j] >> 4) - 8);
        }
        u->d = kiln_fp16_to_f32(b.d);
        u->dmin = 0.0f;
        break;
    }
    case KILN_DTYPE_Q4_1: {
        kiln_block_q4_1 b;
        memcpy(&b, row + i * sizeof b, sizeof b);
        for (int j = 0; j < 16; j++) {
            u->q[j] = (int8_t)(b.qs[j] & 0xF);
            u->q[j + 16] = (int8_t)(b.qs[j] >> 4);
        }
        u->d = kiln_fp16_to_f32(b.d);
        u->dmin = kiln_fp16_to_f32(b.m);
        break;
    }
    case KILN_DTYPE_Q5_0: {
        kiln_block_q5_0 b;
        memcpy(&b, row + i * sizeof b, sizeof b);
        unpack_q5(b.qs, b.qh, 16, u->q);
        u->d = kiln_fp16_to_f32(b.d);
        u->dmin = 0.0f;
        break;
    }
    case KILN_DTYPE_Q5_1: {
        kiln_block_q5_1 b;
        memcpy(&b, row + i * sizeof b, sizeof b);
        unpack_q5(b.qs, b.qh, 0, u->q);
        u->d = kiln_fp16_to_f32(b.d);
        u->dmin = kiln_fp16_to_f32(b.m);
        break;
    }
    case KILN_DTYPE_Q8_0: {
        kiln_block_q8_0 b;
        memcpy(&b, row + i * sizeof b, sizeof b);
        memcpy(u->q, b.qs, 32);
        u->d = kiln_fp16_to_f32(b.d);
        u->dmin = 0.0f;
        break;
    }
    case KILN_DTYPE_Q2_K: {
        kiln_block_q2_K b;
        memcpy(&b, row + i * sizeof b, sizeof b);
        unpack_q2_K(&b, u);
        break;
    }
    case KILN_DTYPE_Q3_K: {
        kiln_block_q3_K b;
        memcpy(&b, row + i * sizeof b, sizeof b);
        unpack_q3_K(&b, u);
        break;
    }
    case KILN_DTYPE_Q4_K: {
        kiln_block_q4_K b;
        memcpy(&b, row + i * sizeof b, sizeof b);
        unpack_q45_K(b.scales, b.qs, NULL, b.d, b.dmin, u);
        break;
    }
    case KILN_DTYPE_Q5_K: {
        kiln_block_q5_K b;
        memcpy(&b, row + i * sizeof b, sizeof b);
        unpack_q45_K(b.scales, b.qs, b.qh, b.d, b.dmin, u);
        break;
    }
    default: {
        kiln_block_q6_K b;
        memcpy(&b, row + i * sizeof b, sizeof b);
        unpack_q6_K(&b, u);
        break;
    }
    }
}

static int isum(const int8_t *q, const int8_t *a, int n) {
    int s = 0;
    for (int j = 0; j < n; j++) s += q[j] * a[j];
    return s;
}

/* One block's term of the dot product, as ggml's vec_dot_<w>_<act> computes it:
 *   q8_0: (d_w * d_a) * sum(q_w q_a)
 *   q8_1: (d_w * d_a) * sum(q_w q_a) + m_w * s_a        (s_a = d_a * sum(q_a), fp16)
 *   q8_K: (d_a * d_w) * sum_g sc[g] sum_g(q_w q_a) - (d_a * dmin_w) * sum_g m[g] bsum_g
 * The integer sums are exact; d_a is the fp16 scale as f32 (q8_0 / q8_1) or the f32
 * scale (q8_K). */
static float block_dot(uint32_t at, const ublock *u, const void *act, int64_t i) {
    if (at == KILN_DTYPE_Q8_0) {
        const kiln_block_q8_0 *a = (const kiln_block_q8_0 *)act + i;
        return (u->d * kiln_fp16_to_f32(a->d)) * (float)isum(u->q, a->qs, 32);
    }
    if (at == KILN_DTYPE_Q8_1) {
        const kiln_block_q8_1 *a = (const kiln_block_q8_1 *)act + i;
        return (u->d * kiln_fp16_to_f32(a->d)) * (float)isum(u->q, a->qs, 32) +
               u->dmin * kiln_fp16_to_f32(a->s);
    }
    const kiln_block_q8_K *a = (const kiln_block_q8_K *)act + i;
    int sum = 0, summs = 0;
    for (int g = 0; g < KILN_QK_K / u->sub; g++) {
        int bs = 0;
        for (int h = 0; h < u->sub / 16; h++) bs += a->bsums[g * u->sub / 16 + h];
        sum += u->sc[g] * isum(u->q + g * u->sub, a->qs + g * u->sub, u->sub);
        summs += u->m[g] * bs;
    }
    return (a->d * u->d) * (float)sum - (a->d * u->dmin) * (float)summs;
}

static int64_t block_elems(uint32_t at) {
    return at == KILN_DTYPE_Q8_K ? KILN_QK_K : 32;
}

kiln_status kiln_ggml_vec_dot(uint32_t w_dtype, const void *w_row, const void *act_row, int64_t k,
                              float *out) {
    const uint32_t at = kiln_ggml_vec_dot_type(w_dtype);
    if (at == KILN_DTYPE_F32) return KILN_ERR_UNSUPPORTED;
    if (k % block_elems(at)) return KILN_ERR_INVALID_ARG;
    float sumf = 0.0f;
    ublock u;
    for (int64_t i = 0; i < k / block_elems(at); i++) {
        unpack_block(w_dtype, w_row, i, &u);
        sumf += block_dot(at, &u, act_row, i);
    }
    *out = sumf;
    return KILN_OK;
}

/* ---- the matmul: quantize every activation row once, then rows of W in parallel ---- */

typedef struct gmm_job {
    const kiln_matmul_args *a;
    const uint8_t *xq; /* [t] quantized rows of xq_bytes */
    size_t xq_bytes;
    atomic_int failed;
} gmm_job;

static void gmm_range(void *ctx, int64_t n0, int64_t n1, int ith) {
    (void)ith;
    gmm_job *j = ctx;
    const kiln_matmul_args *a = j->a;
    const uint32_t at = kiln_ggml_vec_dot_type(a->w_dtype);
    const int64_t nb = a->k / block_elems(at);
    ublock *u = kiln_malloc((size_t)nb * sizeof *u); /* one unpacked weight row */
    if (!u) {
        atomic_store(&j->failed, KILN_ERR_NOMEM);
        return;
    }
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wr = (const uint8_t *)a->w + (size_t)n * a->w_row_bytes;
        for (int64_t i = 0; i < nb; i++) unpack_block(a->w_dtype, wr, i, &u[i]);
        const float b = a->bias ? a->bias[n] : 0.0f;
        for (int64_t t = 0; t < a->t; t++) {
            const uint8_t *xq = j->xq + (size_t)t * j->xq_bytes;
            float sumf = 0.0f;
            for (int64_t i = 0; i < nb; i++) sumf += block_dot(at, &u[i], xq, i);
            a->y[t * a->y_stride + n] = sumf + b;
        }
    }
    kiln_free(u);
}

kiln_status kiln_ref_matmul_ggml(const kiln_kctx *c, const kiln_matmul_args *a) {
    if (a->w_layout != 0) return KILN_ERR_UNSUPPORTED;
    const uint32_t at = kiln_ggml_vec_dot_type(a->w_dtype);
    if (at == KILN_DTYPE_F32) return KILN_ERR_UNSUPPORTED;
    if (a->t == 0 || a->n == 0) return KILN_OK;
    if (a->k % block_elems(at)) return KILN_ERR_INVALID_ARG;
    size_t rb, total;
    if (kiln_dtype_row_bytes(at, a->k, &rb, NULL)) return KILN_ERR_INVALID_ARG;
    if (!kiln_size_mul(rb, (size_t)a->t, &total)) return KILN_ERR_OVERFLOW;
    uint8_t *xq = kiln_malloc(total ? total : 1);
    if (!xq) return KILN_ERR_NOMEM;
    kiln_status st = KILN_OK;
    for (int64_t t = 0; t < a->t && !st; t++)
        st = kiln_ggml_quantize_row(at, a->x + t * a->x_stride, xq + (size_t)t * rb, a->k);
    if (!st) {
        gmm_job j = {a, xq, rb, 0};
        kiln_pool_for(c ? c->pool : NULL, a->n, 16, gmm_range, &j);
        st = (kiln_status)atomic_load(&j.failed);
    }
    kiln_free(xq);
    return st;
}
