/*
 * ref_sample.c — the reference sampling kernel (kernel.h, KILN_KOP_SAMPLE): the chain
 * written plainly (every alive candidate sorted), the oracle of the CUDA one. Rows in
 * host memory.
 */
#include "kernels/ref/ref_fused.h"

#include "base/mem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct ref_cand {
    int32_t id;
    float l;
} ref_cand;

static int cmp_ref_cand(const void *a, const void *b) {
    const ref_cand *x = a, *y = b;
    if (x->l != y->l) return x->l > y->l ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

float kiln_ref_sample_softcap(float v, float softcap) {
    return softcap > 0 ? softcap * tanhf(v / softcap) : v;
}

float kiln_ref_sample_override(float l, float bias, int32_t count,
                               const kiln_sample_row_params *p) {
    l += bias;
    if (count > 0) {
        if (l <= 0)
            l *= p->repeat_penalty;
        else
            l /= p->repeat_penalty;
        l -= (float)count * p->frequency_penalty + p->presence_penalty;
    }
    return l;
}

/* The chain after top-k on c[0..m) (sorted best first): top-p, min-p, draw. */
int32_t kiln_ref_sample_tail(const float *l, const int32_t *id, int32_t m,
                             const kiln_sample_row_params *p) {
    if (m <= 0) return -1;
    if (!(p->temperature > 0)) return id[0];
    const float mx = l[0];
    if (p->top_p < 1.0f && m > 1) {
        double z = 0;
        for (int32_t i = 0; i < m; i++) z += l[i] == mx ? 1.0 : exp((double)l[i] - mx);
        const double target = (double)p->top_p * z;
        double cum = 0;
        for (int32_t i = 0; i < m; i++) {
            cum += l[i] == mx ? 1.0 : exp((double)l[i] - mx);
            if (cum >= target) {
                m = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f && m > 1) {
        const float thr = mx + p->log_min_p;
        if (!(mx >= thr)) {
            m = 1;
        } else {
            int32_t w = 0;
            while (w < m && l[w] >= thr) w++;
            m = w;
        }
    }
    const double t = p->temperature;
    double sum = 0;
    for (int32_t i = 0; i < m; i++) sum += l[i] == mx ? 1.0 : exp(((double)l[i] - mx) / t);
    const double u = p->u * sum;
    double acc = 0;
    for (int32_t i = 0; i < m; i++) {
        acc += l[i] == mx ? 1.0 : exp(((double)l[i] - mx) / t);
        if (u < acc) return id[i];
    }
    return id[m - 1];
}

kiln_status kiln_ref_sample(const kiln_kctx *c, const kiln_sample_args *a) {
    if (a->t < 0 || a->n <= 0 || a->n > a->ld || a->n > INT32_MAX || !a->rows || !a->ids ||
        (a->t > 0 && !a->logits))
        return kiln_kerr(c, KILN_ERR_INVALID_ARG, "ref.sample: %lld rows of %lld (stride %lld)",
                         (long long)a->t, (long long)a->n, (long long)a->ld);
    const int32_t n = (int32_t)a->n;
    ref_cand *cs = kiln_malloc((size_t)n * sizeof(ref_cand));
    float *lv = kiln_malloc((size_t)n * sizeof(float));
    int32_t *iv = kiln_malloc((size_t)n * sizeof(int32_t));
    float *eff = kiln_malloc((size_t)n * sizeof(float));
    kiln_status st = KILN_OK;
    if (!cs || !lv || !iv || !eff)
        st = kiln_kerr(c, KILN_ERR_NOMEM, "ref.sample: out of memory (%d logits)", (int)n);
    for (int64_t r = 0; !st && r < a->t; r++) {
        const kiln_sample_row_params *p = &a->rows[r];
        const float *row = a->logits + r * a->ld;
        for (int32_t i = 0; i < n; i++) eff[i] = kiln_ref_sample_softcap(row[i], a->softcap);
        for (int32_t j = 0; j < p->n_ov; j++) {
            int32_t id = a->ov_id[p->ov_off + j];
            if (id < 0 || id >= n) {
                st = kiln_kerr(c, KILN_ERR_INVALID_ARG, "ref.sample: row %lld override id %d",
                               (long long)r, (int)id);
                break;
            }
            eff[id] = kiln_ref_sample_override(eff[id], a->ov_bias[p->ov_off + j],
                                               a->ov_count[p->ov_off + j], p);
        }
        if (st) break;
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if (eff[i] == eff[i] && eff[i] != -INFINITY) cs[m++] = (ref_cand){i, eff[i]};
        qsort(cs, (size_t)m, sizeof(ref_cand), cmp_ref_cand);
        int32_t k = p->temperature > 0 ? (p->top_k > 0 && p->top_k < n ? p->top_k : n) : 1;
        if (m > k) m = k;
        for (int32_t i = 0; i < m; i++) {
            lv[i] = cs[i].l;
            iv[i] = cs[i].id;
        }
        a->ids[r] = kiln_ref_sample_tail(lv, iv, m, p);
    }
    kiln_free(cs);
    kiln_free(lv);
    kiln_free(iv);
    kiln_free(eff);
    return st;
}
