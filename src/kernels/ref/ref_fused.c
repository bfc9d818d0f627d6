/*
 * ref_fused.c — the reference fused kernels (ref_fused.h): each the sequence of calls
 * it replaces, so "fused == unfused" is the test of every faster implementation.
 */
#include "kernels/ref/ref_fused.h"

#include "base/mem.h"
#include "kernels/ref/ref.h"

#include <math.h>
#include <stdlib.h>

kiln_status kiln_ref_matmul_group(const kiln_kctx *c, const kiln_matmul_group_args *a) {
    if (a->n < 0 || a->n > KILN_MATMUL_GROUP_MAX) return KILN_ERR_INVALID_ARG;
    for (int m = 0; m < a->n; m++) {
        kiln_matmul_fn fn = a->fn[m] ? a->fn[m] : kiln_ref_matmul;
        KILN_TRY(fn(c, &a->m[m]));
    }
    if (a->glu_fn) {
        if (a->n != 2 || a->m[0].n != a->m[1].n) return KILN_ERR_INVALID_ARG;
        kiln_glu_args g = {.gate = a->m[0].y,
                           .up = a->m[1].y,
                           .y = a->glu_y,
                           .t = a->m[1].t,
                           .n = a->m[1].n,
                           .gate_stride = a->m[0].y_stride,
                           .up_stride = a->m[1].y_stride,
                           .y_stride = a->glu_y_stride,
                           .act = a->act};
        KILN_TRY(a->glu_fn(c, &g));
    }
    return KILN_OK;
}

kiln_status kiln_ref_rope_kv(const kiln_kctx *c, const kiln_rope_kv_args *a) {
    kiln_rope_args r = a->rope;
    KILN_TRY(kiln_ref_rope(c, &r));
    r.x = (float *)a->kv.k;
    r.x_stride = a->kv.k_stride;
    r.n_head = a->kv.kv.n_kv_head;
    KILN_TRY(kiln_ref_rope(c, &r));
    return kiln_ref_kv_write(c, &a->kv);
}

int32_t kiln_argmax_row(const float *v, int64_t n, float softcap, float *val) {
    /* f is monotone, so only a value above the best raw value can beat the best key
     * (and f is evaluated only on the running maxima) */
    int32_t best = -1;
    float braw = -INFINITY, bkey = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        float x = v[i];
        if (isnan(x) || (best >= 0 && !(x > braw))) continue;
        float key = softcap > 0 ? softcap * tanhf(x / softcap) : x;
        if (isnan(key) || key == -INFINITY) continue;
        if (best < 0 || key > bkey) {
            best = (int32_t)i;
            bkey = key;
            braw = x;
        }
    }
    if (val) *val = best >= 0 ? bkey : NAN;
    return best;
}

kiln_status kiln_ref_matmul_argmax(const kiln_kctx *c, const kiln_matmul_argmax_args *a) {
    const int64_t t = a->mm.t, n = a->n_limit;
    if (t <= 0) return KILN_OK;
    if (n < 0 || n > a->mm.n) return KILN_ERR_INVALID_ARG;
    size_t cnt;
    if (!kiln_size_mul((size_t)t, (size_t)(n > 0 ? n : 1), &cnt)) return KILN_ERR_OVERFLOW;
    float *y = kiln_malloc(cnt * sizeof(float));
    if (!y) return KILN_ERR_NOMEM;
    kiln_matmul_args mm = a->mm;
    mm.n = n;
    mm.y = y;
    mm.y_stride = n;
    kiln_status st = n > 0 ? (a->fn ? a->fn : kiln_ref_matmul)(c, &mm) : KILN_OK;
    for (int64_t r = 0; !st && r < t; r++)
        a->ids[r] = kiln_argmax_row(y + r * n, n, a->softcap, a->vals ? &a->vals[r] : NULL);
    kiln_free(y);
    return st;
}
