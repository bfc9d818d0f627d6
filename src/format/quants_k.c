/*
 * quants_k.c — reference conversions for the 256-element "K" super-block types (q2_K,
 * q3_K, q4_K, q5_K, q6_K, q8_K).
 *
 * Dequantization is a direct reading of the layouts in quants.h. Quantization follows
 * the searches of ggml's quantize_row_*_ref so that kiln writes the same bytes as
 * llama-quantize without an importance matrix:
 *  - q2_K, q4_K, q5_K (affine, x ~ d*q - m): per sub-block, a weighted least-squares fit
 *    of scale and min over a small grid of candidate inverse scales (fit_affine), then
 *    the sub-block scales and mins are themselves quantized to 4 or 6 bits against a
 *    super-block f16 scale, and the quants are recomputed with the rounded scales.
 *  - q3_K (symmetric): an iterative refinement of the per-element levels (fit_sym3).
 *  - q6_K (symmetric): a search over 18 perturbed scales weighted by x^2 (fit_sym).
 * The arithmetic order matters for bit-exactness: expressions are written in the same
 * association as ggml's (left to right), and there is no FMA contraction (ISO C11).
 */
#include "format/dtype.h"
#include "format/quants.h"

#include <math.h>
#include <stdbool.h>

#define MAXI(a, b) ((a) > (b) ? (a) : (b))
#define MINI(a, b) ((a) < (b) ? (a) : (b))
#define GROUP_EPS  1e-15f

static inline float half(uint16_t h) {
    return kiln_fp16_to_f32(h);
}

/* ====================================================================== dequantize */

void kiln_dequant_q2_K(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / KILN_QK_K; b++) {
        kiln_block_q2_K blk;
        memcpy(&blk, p + b * sizeof blk, sizeof blk);
        const float d = half(blk.d), dmin = half(blk.dmin);
        /* 128-element halves h; inside, 4 bit-pair planes s, each 2 groups of 16 */
        for (int h = 0; h < 2; h++) {
            const uint8_t *q = blk.qs + 32 * h;
            for (int s = 0; s < 4; s++) {
                for (int g = 0; g < 2; g++) {
                    const uint8_t sc = blk.scales[8 * h + 2 * s + g];
                    const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
                    for (int l = 0; l < 16; l++)
                        *y++ = dl * (float)((q[16 * g + l] >> (2 * s)) & 3) - ml;
                }
            }
        }
    }
}

void kiln_dequant_q3_K(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / KILN_QK_K; b++) {
        kiln_block_q3_K blk;
        memcpy(&blk, p + b * sizeof blk, sizeof blk);
        const float d = half(blk.d);
        int8_t sc[16];
        kiln_q3_K_scales(blk.scales, sc);
        int is = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *q = blk.qs + 32 * h;
            for (int s = 0; s < 4; s++) {
                const uint8_t mask = (uint8_t)(1u << (4 * h + s));
                for (int g = 0; g < 2; g++) {
                    const float dl = d * (float)sc[is++];
                    for (int l = 0; l < 16; l++) {
                        int lo = (q[16 * g + l] >> (2 * s)) & 3;
                        int v = lo - ((blk.hmask[16 * g + l] & mask) ? 0 : 4);
                        *y++ = dl * (float)v;
                    }
                }
            }
        }
    }
}

void kiln_dequant_q4_K(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / KILN_QK_K; b++) {
        kiln_block_q4_K blk;
        memcpy(&blk, p + b * sizeof blk, sizeof blk);
        const float d = half(blk.d), dmin = half(blk.dmin);
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = blk.qs + 32 * c;
            uint8_t sc, m;
            kiln_get_scale_min_k4(2 * c, blk.scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            kiln_get_scale_min_k4(2 * c + 1, blk.scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

void kiln_dequant_q5_K(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / KILN_QK_K; b++) {
        kiln_block_q5_K blk;
        memcpy(&blk, p + b * sizeof blk, sizeof blk);
        const float d = half(blk.d), dmin = half(blk.dmin);
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = blk.qs + 32 * c;
            const uint8_t u1 = (uint8_t)(1u << (2 * c)), u2 = (uint8_t)(2u << (2 * c));
            uint8_t sc, m;
            kiln_get_scale_min_k4(2 * c, blk.scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            kiln_get_scale_min_k4(2 * c + 1, blk.scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((q[l] & 0xF) + ((blk.qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((q[l] >> 4) + ((blk.qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

void kiln_dequant_q6_K(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / KILN_QK_K; b++) {
        kiln_block_q6_K blk;
        memcpy(&blk, p + b * sizeof blk, sizeof blk);
        const float d = half(blk.d);
        for (int h = 0; h < 2; h++, y += 128) {
            const uint8_t *ql = blk.ql + 64 * h, *qh = blk.qh + 32 * h;
            const int8_t *sc = blk.scales + 8 * h;
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32;
                const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

void kiln_dequant_q8_K(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / KILN_QK_K; b++, y += KILN_QK_K) {
        kiln_block_q8_K blk;
        memcpy(&blk, p + b * sizeof blk, sizeof blk);
        for (int j = 0; j < KILN_QK_K; j++) y[j] = blk.d * (float)blk.qs[j];
    }
}

/* ====================================================================== fitting */

/* Affine fit x ~ scale * L + min (min <= 0) of n values to levels L in [0, nmax],
 * minimizing sum w * err (|err| when use_mad, else err^2). Starts from the min/max
 * grid, then tries inverse scales (rmin + rdelta * i + nmax) / (max - min) for
 * i in [0, nstep] with a closed-form weighted least-squares scale and min for each
 * level assignment. Returns the scale; *neg_min gets -min (>= 0). */
static float fit_affine(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min,
                        uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad) {
    float lo = x[0], hi = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *neg_min = -lo;
        return 0.0f;
    }
    float iscale = (float)nmax / (hi - lo);
    float scale = 1 / iscale;
    float best = 0;
    for (int i = 0; i < n; i++) {
        int l = kiln_nearest_int(iscale * (x[i] - lo));
        L[i] = (uint8_t)MAXI(0, MINI(nmax, l));
        float diff = scale * (float)L[i] + lo - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best += w[i] * diff;
    }
    if (nstep < 1) {
        *neg_min = -lo;
        return scale;
    }
    for (int step = 0; step <= nstep; step++) {
        iscale = (rmin + rdelta * (float)step + (float)nmax) / (hi - lo);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = kiln_nearest_int(iscale * (x[i] - lo));
            l = MAXI(0, MINI(nmax, l));
            Laux[i] = (uint8_t)l;
            const float fl = (float)l;
            sum_l += w[i] * fl;
            sum_l2 += w[i] * fl * fl;
            sum_xl += w[i] * fl * x[i];
        }
        const float det = sum_w * sum_l2 - sum_l * sum_l;
        if (det > 0) {
            float s = (sum_w * sum_xl - sum_x * sum_l) / det;
            float m = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if (m > 0) {
                m = 0;
                s = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                float diff = s * (float)Laux[i] + m - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                err += w[i] * diff;
            }
            if (err < best) {
                memcpy(L, Laux, (size_t)n);
                best = err;
                scale = s;
                lo = m;
            }
        }
    }
    *neg_min = -lo;
    return scale;
}

/* Symmetric fit for q6_K: levels in [-nmax, nmax) stored as L + nmax, weights x^2.
 * Tries the max-based inverse scale and 18 perturbations (nmax + 0.1 i) / max, keeping
 * the one with the best weighted least-squares objective. Returns the scale. */
static float fit_sym(int n, int nmax, const float *x, int8_t *L) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    if (amax < GROUP_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.0f;
    }
    float iscale = (float)(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = kiln_nearest_int(iscale * x[i]);
        l = MAXI(-nmax, MINI(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i], fl = (float)l;
        sumlx += w * x[i] * fl;
        suml2 += w * fl * fl;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = kiln_nearest_int(iscale * x[i]);
            l = MAXI(-nmax, MINI(nmax - 1, l));
            const float w = x[i] * x[i], fl = (float)l;
            sumlx += w * x[i] * fl;
            suml2 += w * fl * fl;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = kiln_nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + MAXI(-nmax, MINI(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Symmetric fit for q3_K: start from the max-based levels, then up to 5 passes that move
 * single elements to their best level given the others (weights x^2). L gets l + nmax. */
static float fit_sym3(int n, int nmax, const float *x, int8_t *L) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    if (amax < GROUP_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.0f;
    }
    const float iscale = (float)(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = kiln_nearest_int(iscale * x[i]);
        l = MAXI(-nmax, MINI(nmax - 1, l));
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * (float)L[i] * (float)L[i];
                int nl = kiln_nearest_int(x[i] * sl2 / slx);
                nl = MAXI(-nmax, MINI(nmax - 1, nl));
                if (nl != L[i]) {
                    slx += w * x[i] * (float)nl;
                    sl2 += w * (float)nl * (float)nl;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)nl;
                        sumlx = slx;
                        suml2 = sl2;
                        changed++;
                    }
                }
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* ====================================================================== quantize */

/* Packs 256 2-bit levels: byte l of 32-byte chunk c holds levels 128c + l + 32 s in bits
 * 2s..2s+1 (q2_K and q3_K low bits). */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int c = 0; c < 2; c++) {
        for (int l = 0; l < 32; l++) {
            const uint8_t *g = L + 128 * c + l;
            qs[32 * c + l] = (uint8_t)(g[0] | g[32] << 2 | g[64] << 4 | g[96] << 6);
        }
    }
}

void kiln_quant_q2_K(const float *x, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t b = 0; b < n / KILN_QK_K; b++, x += KILN_QK_K) {
        kiln_block_q2_K blk;
        uint8_t L[KILN_QK_K], Laux[16];
        float w[16], scales[16], mins[16];
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
            scales[j] =
                fit_affine(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = 15.0f / max_scale;
            for (int j = 0; j < 16; j++)
                blk.scales[j] = (uint8_t)kiln_nearest_int(iscale * scales[j]);
            blk.d = kiln_f32_to_fp16(max_scale / 15.0f);
        } else {
            for (int j = 0; j < 16; j++) blk.scales[j] = 0;
            blk.d = kiln_f32_to_fp16(0.0f);
        }
        if (max_min > 0) {
            const float iscale = 15.0f / max_min;
            for (int j = 0; j < 16; j++) {
                int l = kiln_nearest_int(iscale * mins[j]);
                /* unsigned: l < 0 when 15 / max_min overflowed to inf (max_min < 1e-38) */
                blk.scales[j] = (uint8_t)(blk.scales[j] | (unsigned)l << 4);
            }
            blk.dmin = kiln_f32_to_fp16(max_min / 15.0f);
        } else {
            blk.dmin = kiln_f32_to_fp16(0.0f);
        }
        for (int j = 0; j < 16; j++) {
            const float d = half(blk.d) * (float)(blk.scales[j] & 0xF);
            if (d == 0) continue;
            const float dm = half(blk.dmin) * (float)(blk.scales[j] >> 4);
            for (int i = 0; i < 16; i++) {
                int l = kiln_nearest_int((x[16 * j + i] + dm) / d);
                L[16 * j + i] = (uint8_t)MAXI(0, MINI(3, l));
            }
        }
        pack_2bit(L, blk.qs);
        memcpy(p + b * sizeof blk, &blk, sizeof blk);
    }
}

void kiln_quant_q3_K(const float *x, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t b = 0; b < n / KILN_QK_K; b++, x += KILN_QK_K) {
        kiln_block_q3_K blk;
        int8_t L[KILN_QK_K];
        float scales[16];
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_sym3(16, 4, x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > amax) {
                amax = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        memset(blk.scales, 0, sizeof blk.scales);
        if (max_scale != 0) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < 16; j++) {
                int8_t l = (int8_t)kiln_nearest_int(iscale * scales[j]);
                l = (int8_t)(MAXI(-32, MINI(31, l)) + 32);
                if (j < 8)
                    blk.scales[j] = (uint8_t)(l & 0xF);
                else
                    blk.scales[j - 8] = (uint8_t)(blk.scales[j - 8] | (l & 0xF) << 4);
                blk.scales[8 + j % 4] =
                    (uint8_t)(blk.scales[8 + j % 4] | (l >> 4) << (2 * (j / 4)));
            }
            blk.d = kiln_f32_to_fp16(1 / iscale);
        } else {
            blk.d = kiln_f32_to_fp16(0.0f);
        }
        int8_t sc[16];
        kiln_q3_K_scales(blk.scales, sc);
        for (int j = 0; j < 16; j++) {
            const float d = half(blk.d) * (float)sc[j];
            if (d == 0) continue;
            for (int i = 0; i < 16; i++) {
                int l = kiln_nearest_int(x[16 * j + i] / d);
                L[16 * j + i] = (int8_t)(MAXI(-4, MINI(3, l)) + 4);
            }
        }
        /* high bit of level j goes to hmask[j % 32], bit j / 32 */
        uint8_t low[KILN_QK_K];
        memset(blk.hmask, 0, sizeof blk.hmask);
        for (int j = 0; j < KILN_QK_K; j++) {
            int l = L[j];
            if (l > 3) {
                blk.hmask[j % 32] = (uint8_t)(blk.hmask[j % 32] | 1u << (j / 32));
                l -= 4;
            }
            low[j] = (uint8_t)l;
        }
        pack_2bit(low, blk.qs);
        memcpy(p + b * sizeof blk, &blk, sizeof blk);
    }
}

/* q4_K / q5_K share everything but the level count and the search grid. */
static void quant_k_affine(const float *x, int nmax, float rmin, int nstep, uint16_t *d_out,
                           uint16_t *dmin_out, uint8_t scales_out[12], uint8_t L[KILN_QK_K]) {
    uint8_t Laux[32];
    float w[32], scales[8], mins[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xs[l]);
        scales[j] =
            fit_affine(32, nmax, xs, w, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t *s = scales_out;
    for (int j = 0; j < 8; j++) {
        uint8_t ls = (uint8_t)kiln_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)kiln_nearest_int(inv_min * mins[j]);
        ls = MINI(63, ls);
        lm = MINI(63, lm);
        if (j < 4) {
            s[j] = ls;
            s[j + 4] = lm;
        } else {
            s[j + 4] = (uint8_t)((ls & 0xF) | (lm & 0xF) << 4);
            s[j - 4] = (uint8_t)(s[j - 4] | (ls >> 4) << 6);
            s[j] = (uint8_t)(s[j] | (lm >> 4) << 6);
        }
    }
    *d_out = kiln_f32_to_fp16(max_scale / 63.0f);
    *dmin_out = kiln_f32_to_fp16(max_min / 63.0f);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        kiln_get_scale_min_k4(j, s, &sc, &m);
        const float d = half(*d_out) * (float)sc;
        if (d == 0) continue;
        const float dm = half(*dmin_out) * (float)m;
        for (int i = 0; i < 32; i++) {
            int l = kiln_nearest_int((x[32 * j + i] + dm) / d);
            L[32 * j + i] = (uint8_t)MAXI(0, MINI(nmax, l));
        }
    }
}

void kiln_quant_q4_K(const float *x, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t b = 0; b < n / KILN_QK_K; b++, x += KILN_QK_K) {
        kiln_block_q4_K blk;
        uint8_t L[KILN_QK_K];
        memset(blk.scales, 0, sizeof blk.scales);
        quant_k_affine(x, 15, -1.0f, 20, &blk.d, &blk.dmin, blk.scales, L);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                blk.qs[32 * c + l] = (uint8_t)(L[64 * c + l] | L[64 * c + 32 + l] << 4);
        memcpy(p + b * sizeof blk, &blk, sizeof blk);
    }
}

void kiln_quant_q5_K(const float *x, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t b = 0; b < n / KILN_QK_K; b++, x += KILN_QK_K) {
        kiln_block_q5_K blk;
        uint8_t L[KILN_QK_K];
        memset(blk.scales, 0, sizeof blk.scales);
        quant_k_affine(x, 31, -0.5f, 15, &blk.d, &blk.dmin, blk.scales, L);
        memset(blk.qh, 0, sizeof blk.qh);
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                int l1 = L[64 * c + l], l2 = L[64 * c + 32 + l];
                if (l1 > 15) {
                    l1 -= 16;
                    blk.qh[l] = (uint8_t)(blk.qh[l] | 1u << (2 * c));
                }
                if (l2 > 15) {
                    l2 -= 16;
                    blk.qh[l] = (uint8_t)(blk.qh[l] | 2u << (2 * c));
                }
                blk.qs[32 * c + l] = (uint8_t)(l1 | l2 << 4);
            }
        }
        memcpy(p + b * sizeof blk, &blk, sizeof blk);
    }
}

void kiln_quant_q6_K(const float *x, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t b = 0; b < n / KILN_QK_K; b++, x += KILN_QK_K) {
        kiln_block_q6_K blk;
        int8_t L[KILN_QK_K];
        float scales[16];
        float max_scale = 0, max_abs = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_sym(16, 32, x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > max_abs) {
                max_abs = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        if (max_abs < GROUP_EPS) {
            memset(&blk, 0, sizeof blk);
            memcpy(p + b * sizeof blk, &blk, sizeof blk);
            continue;
        }
        const float iscale = -128.0f / max_scale;
        blk.d = kiln_f32_to_fp16(1 / iscale);
        for (int j = 0; j < 16; j++)
            blk.scales[j] = (int8_t)MINI(127, kiln_nearest_int(iscale * scales[j]));
        for (int j = 0; j < 16; j++) {
            const float d = half(blk.d) * (float)blk.scales[j];
            if (d == 0) continue;
            for (int i = 0; i < 16; i++) {
                int l = kiln_nearest_int(x[16 * j + i] / d);
                L[16 * j + i] = (int8_t)(MAXI(-32, MINI(31, l)) + 32);
            }
        }
        /* chunk h of 128: ql[64h + l] = low nibbles of levels l | l+64, ql[64h + 32 + l] of
         * l+32 | l+96; qh[32h + l] = high 2 bits of l, l+32, l+64, l+96 */
        for (int h = 0; h < 2; h++) {
            const int8_t *g = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                const uint8_t a = (uint8_t)g[l], c = (uint8_t)g[l + 32];
                const uint8_t e = (uint8_t)g[l + 64], f = (uint8_t)g[l + 96];
                blk.ql[64 * h + l] = (uint8_t)((a & 0xF) | (e & 0xF) << 4);
                blk.ql[64 * h + 32 + l] = (uint8_t)((c & 0xF) | (f & 0xF) << 4);
                blk.qh[32 * h + l] =
                    (uint8_t)((a >> 4) | (c >> 4) << 2 | (e >> 4) << 4 | (f >> 4) << 6);
            }
        }
        memcpy(p + b * sizeof blk, &blk, sizeof blk);
    }
}

void kiln_quant_q8_K(const float *x, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t b = 0; b < n / KILN_QK_K; b++, x += KILN_QK_K) {
        kiln_block_q8_K blk;
        float max = 0, amax = 0;
        for (int j = 0; j < KILN_QK_K; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        if (amax == 0) {
            memset(&blk, 0, sizeof blk);
        } else {
            const float iscale = -127.0f / max;
            for (int j = 0; j < KILN_QK_K; j++)
                blk.qs[j] = (int8_t)MINI(127, kiln_nearest_int(iscale * x[j]));
            for (int j = 0; j < 16; j++) {
                int sum = 0;
                for (int i = 0; i < 16; i++) sum += blk.qs[16 * j + i];
                blk.bsums[j] = (int16_t)sum;
            }
            blk.d = 1 / iscale;
        }
        memcpy(p + b * sizeof blk, &blk, sizeof blk);
    }
}

void kiln_quantize_act_q8_K(const float *x, kiln_block_q8_K *y, int64_t n) {
    kiln_quant_q8_K(x, y, n);
}
