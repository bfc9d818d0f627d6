/*
 * matmul_group.c — the fused matmul drivers of the CPU backend (cpu_fused.h):
 * matmul_group (q/k/v, gate/up [+ glu] in one pool dispatch) and matmul_argmax (the LM
 * head reduced to the greedy token per row chunk). Baseline x86-64 code like matmul.c:
 * it reaches the per-ISA row loops only through the cpu_impl.h entry points, and uses
 * them exactly as matmul.c does (same activation format, same loops per layout, row
 * chunks on multiples of 16), so a fused member's rows are bitwise those of the
 * separate call.
 */
#include "base/mem.h"
#include "format/dtype.h"
#include "kernels/cpu/cpu_fused.h"
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ref/ref_fused.h"

#include <math.h>
#include <string.h>
#include <xmmintrin.h>

typedef struct isa_impl {
    void (*q8act)(const float *x, int64_t k, uint8_t *dst);
    void (*mmq)(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel);
    void (*mmf)(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel);
    void (*mmr16)(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel); /* or NULL */
    kiln_matmul_fn own;                                                          /* matmul.c */
    kiln_glu_fn glu;
} isa_impl;

static const isa_impl impl_avx512 = {kiln_cpu_q8act_avx512,  kiln_cpu_mmq_avx512,
                                     kiln_cpu_mmf_avx512,    kiln_cpu_mmr16_avx512,
                                     kiln_cpu_matmul_avx512, kiln_cpu_glu_avx512};
static const isa_impl impl_avx2 = {kiln_cpu_q8act_avx2, kiln_cpu_mmq_avx2,    kiln_cpu_mmf_avx2,
                                   kiln_cpu_mmr16_avx2, kiln_cpu_matmul_avx2, kiln_cpu_glu_avx2};

static bool is_float_type(uint32_t dt) {
    return dt == KILN_DTYPE_F32 || dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_BF16;
}

/* Can this ISA's loops compute the call exactly as its matmul entry point (fn) would? */
static bool fusable(const isa_impl *isa, kiln_matmul_fn fn, const kiln_matmul_args *a) {
    if (fn != isa->own || a->n <= 0 || a->t <= 0) return false;
    const bool quant = kiln_cpu_mmq_supports(a->w_dtype);
    if (!quant && !is_float_type(a->w_dtype)) return false;
    if (quant && a->k % 32) return false;
    if (a->w_layout == 0) return true;
    return a->w_layout == KILN_CPU_WLAYOUT_R16 && isa->mmr16 && kiln_cpu_r16_supports(a->w_dtype);
}

static kiln_cpu_mm make_mm(const kiln_matmul_args *a, const uint8_t *act, size_t act_stride) {
    const bool quant = kiln_cpu_mmq_supports(a->w_dtype);
    return (kiln_cpu_mm){.dtype = a->w_dtype,
                         .w = a->w,
                         .w_row_bytes = a->w_row_bytes,
                         .n = a->n,
                         .k = a->k,
                         .act = quant ? act : NULL,
                         .act_stride = quant ? act_stride : 0,
                         .x = a->x,
                         .x_stride = a->x_stride,
                         .t = a->t,
                         .y = a->y,
                         .y_stride = a->y_stride,
                         .bias = a->bias,
                         .bf16 = false};
}

static void run_rows(const isa_impl *isa, const kiln_cpu_mm *mm, uint32_t layout, int64_t r0,
                     int64_t r1, uint8_t *panel) {
    if (layout == KILN_CPU_WLAYOUT_R16)
        isa->mmr16(mm, r0, r1, panel);
    else if (kiln_cpu_mmq_supports(mm->dtype))
        isa->mmq(mm, r0, r1, panel);
    else
        isa->mmf(mm, r0, r1, panel);
}

/* Scratch: [q8 activations][per-thread areas]; own allocation when kctx's is small. */
typedef struct scratch {
    uint8_t *ws, *own;
} scratch;

static kiln_status scratch_get(const kiln_kctx *c, size_t need, scratch *s) {
    s->own = NULL;
    if (c && c->scratch && c->scratch_size >= need && ((uintptr_t)c->scratch & 63) == 0) {
        s->ws = c->scratch;
        return KILN_OK;
    }
    s->ws = s->own = kiln_alloc_aligned(need);
    return s->ws ? KILN_OK : KILN_ERR_NOMEM;
}

typedef struct qjob {
    const isa_impl *isa;
    const float *x;
    int64_t x_stride, k;
    uint8_t *act;
    size_t act_stride;
} qjob;

static void quant_range(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    const qjob *q = ctx;
    for (int64_t t = b; t < e; t++)
        q->isa->q8act(q->x + t * q->x_stride, q->k, q->act + (size_t)t * q->act_stride);
}

/* Quantizes the t activation rows once (split over tokens when t > 2, as matmul.c). */
static void quantize(const isa_impl *isa, kiln_pool *pool, const float *x, int64_t x_stride,
                     int64_t k, int64_t t, uint8_t *act) {
    qjob q = {isa, x, x_stride, k, act, kiln_q8act_row_bytes(k)};
    if (t <= 2)
        quant_range(&q, 0, t, 0);
    else
        kiln_pool_for(pool, t, 1, quant_range, &q);
}

/* ---- matmul_group ---- */

/* Aligned and padded so that no worker reads a cache line the caller's stack writes. */
typedef struct gjob {
    _Alignas(64) const isa_impl *isa;
    int nm;
    kiln_cpu_mm mm[KILN_MATMUL_GROUP_MAX];
    uint32_t layout[KILN_MATMUL_GROUP_MAX];
    int64_t first[KILN_MATMUL_GROUP_MAX + 1]; /* first work item of each member */
    int64_t grain;
    uint8_t *panels;
    size_t panel_stride;
    bool glu;
    kiln_glu_act act;
    float *glu_y;
    int64_t glu_y_stride;
    char pad[64];
} gjob;

static void group_items(void *ctx, int64_t b, int64_t e, int ith) {
    const gjob *j = ctx;
    uint8_t *panel = j->panels + (size_t)ith * j->panel_stride;
    for (int64_t it = b; it < e; it++) {
        if (j->glu) {
            const kiln_cpu_mm *g = &j->mm[0], *u = &j->mm[1];
            int64_t r0 = it * j->grain, r1 = r0 + j->grain < g->n ? r0 + j->grain : g->n;
            run_rows(j->isa, g, j->layout[0], r0, r1, panel);
            run_rows(j->isa, u, j->layout[1], r0, r1, panel);
            /* the chunk's activation while it is in L1: the glu kernel's own vector code on
             * columns [r0, r1) (r0 a multiple of 16, so the same lanes as a whole-row call) */
            kiln_glu_args ga = {.gate = g->y + r0,
                                .up = u->y + r0,
                                .y = j->glu_y + r0,
                                .t = g->t,
                                .n = r1 - r0,
                                .gate_stride = g->y_stride,
                                .up_stride = u->y_stride,
                                .y_stride = j->glu_y_stride,
                                .act = j->act};
            kiln_kctx inl = {0};          /* no pool: runs on this thread */
            (void)j->isa->glu(&inl, &ga); /* cannot fail for valid args (checked) */
            continue;
        }
        int m = 0;
        while (it >= j->first[m + 1]) m++;
        const kiln_cpu_mm *mm = &j->mm[m];
        int64_t r0 = (it - j->first[m]) * j->grain;
        int64_t r1 = r0 + j->grain < mm->n ? r0 + j->grain : mm->n;
        run_rows(j->isa, mm, j->layout[m], r0, r1, panel);
    }
}

static kiln_status matmul_group(const isa_impl *isa, const kiln_kctx *c,
                                const kiln_matmul_group_args *a) {
    if (a->n < 1 || a->n > KILN_MATMUL_GROUP_MAX) return KILN_ERR_INVALID_ARG;
    kiln_pool *pool = c ? c->pool : NULL;
    const int nth = kiln_pool_size(pool);
    /* the fused members: this ISA's kernel, and the same x, t, k as the first of them */
    bool fuse[KILN_MATMUL_GROUP_MAX] = {false};
    int nf = 0, lead = -1;
    for (int m = 0; m < a->n; m++) {
        const kiln_matmul_args *mm = &a->m[m];
        if (!fusable(isa, a->fn[m], mm)) continue;
        if (lead >= 0) {
            const kiln_matmul_args *l = &a->m[lead];
            if (mm->x != l->x || mm->x_stride != l->x_stride || mm->t != l->t || mm->k != l->k)
                continue;
        } else {
            lead = m;
        }
        fuse[m] = true;
        nf++;
    }
    const bool glu = a->glu_fn && a->n == 2 && nf == 2 && a->glu_fn == isa->glu &&
                     a->m[0].n == a->m[1].n && a->m[0].t == a->m[1].t;
    if (a->glu_fn && (a->n != 2 || a->m[0].n != a->m[1].n)) return KILN_ERR_INVALID_ARG;
    /* members that do not fuse: their own kernel */
    for (int m = 0; m < a->n; m++)
        if (!fuse[m]) {
            kiln_matmul_fn fn = a->fn[m] ? a->fn[m] : isa->own;
            KILN_TRY(fn(c, &a->m[m]));
        }
    if (nf > 0) {
        const kiln_matmul_args *l = &a->m[lead];
        const int64_t t = l->t, k = l->k;
        bool any_quant = false, any_float = false;
        size_t pb = 0;
        for (int m = 0; m < a->n; m++)
            if (fuse[m]) {
                any_quant |= kiln_cpu_mmq_supports(a->m[m].w_dtype);
                any_float |= !kiln_cpu_mmq_supports(a->m[m].w_dtype);
                size_t b = kiln_cpu_panel_bytes(a->m[m].w_dtype, k, t);
                if (b > pb) pb = b;
            }
        const size_t act_stride = kiln_q8act_row_bytes(k);
        const size_t act_bytes = any_quant ? (((size_t)t * act_stride + 63) & ~(size_t)63) : 0;
        const size_t per_thread = t > 1 ? pb : 0;
        /* float members, t > 1: the transposed activations, as matmul.c (AVX-512 only) */
        const bool xt = any_float && t > 1 && isa == &impl_avx512;
        const size_t xt_bytes = xt ? kiln_cpu_xt_bytes(k, t) : 0;
        scratch s;
        KILN_TRY(scratch_get(c, act_bytes + xt_bytes + (size_t)nth * per_thread + 64, &s));
        if (any_quant) quantize(isa, pool, l->x, l->x_stride, k, t, s.ws);
        if (xt) kiln_cpu_xt_fill(pool, l->x, l->x_stride, k, t, (float *)(s.ws + act_bytes));
        gjob j;
        memset(&j, 0, sizeof j);
        j.isa = isa;
        j.panels = s.ws + act_bytes + xt_bytes;
        j.panel_stride = per_thread;
        int64_t rows = 0;
        for (int m = 0; m < a->n; m++)
            if (fuse[m]) {
                j.mm[j.nm] = make_mm(&a->m[m], s.ws, act_stride);
                if (xt && !kiln_cpu_mmq_supports(a->m[m].w_dtype)) {
                    j.mm[j.nm].xt = (const float *)(s.ws + act_bytes);
                    j.mm[j.nm].xt_stride = kiln_cpu_xt_stride(t);
                }
                j.layout[j.nm] = a->m[m].w_layout;
                rows += a->m[m].n;
                j.nm++;
            }
        int64_t items;
        if (glu) {
            j.glu = true;
            j.act = a->act;
            j.glu_y = a->glu_y;
            j.glu_y_stride = a->glu_y_stride;
            j.grain = kiln_cpu_row_grain(j.mm[0].n, nth, any_quant ? 16 : 48);
            items = (j.mm[0].n + j.grain - 1) / j.grain;
        } else {
            j.grain = kiln_cpu_row_grain(rows, nth, any_quant ? 16 : 48);
            items = 0;
            for (int m = 0; m < j.nm; m++) {
                j.first[m] = items;
                items += (j.mm[m].n + j.grain - 1) / j.grain;
            }
            for (int m = j.nm; m <= KILN_MATMUL_GROUP_MAX; m++) j.first[m] = items;
        }
        kiln_pool_for(pool, items, 1, group_items, &j);
        kiln_free_aligned(s.own);
    }
    if (a->glu_fn && !glu) {
        kiln_glu_args ga = {.gate = a->m[0].y,
                            .up = a->m[1].y,
                            .y = a->glu_y,
                            .t = a->m[1].t,
                            .n = a->m[1].n,
                            .gate_stride = a->m[0].y_stride,
                            .up_stride = a->m[1].y_stride,
                            .y_stride = a->glu_y_stride,
                            .act = a->act};
        KILN_TRY(a->glu_fn(c, &ga));
    }
    return KILN_OK;
}

kiln_status kiln_cpu_matmul_group_avx512(const kiln_kctx *c, const kiln_matmul_group_args *a) {
    return matmul_group(&impl_avx512, c, a);
}

kiln_status kiln_cpu_matmul_group_avx2(const kiln_kctx *c, const kiln_matmul_group_args *a) {
    return matmul_group(&impl_avx2, c, a);
}

/* ---- matmul_argmax ---- */

#define ARGMAX_ROWS 256 /* rows per work item (a multiple of 16) */

typedef struct best {
    float key, raw;
    int32_t id;
} best;

/* The largest non-NaN value of v[0..n) (-inf if none): maxps returns its second operand
 * when the first is NaN. SSE2, the baseline ISA of this file. */
static float chunk_max(const float *v, int64_t n) {
    __m128 m = _mm_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) m = _mm_max_ps(_mm_loadu_ps(v + i), m);
    m = _mm_max_ps(_mm_movehl_ps(m, m), m);
    m = _mm_max_ss(_mm_shuffle_ps(m, m, 1), m);
    float r = _mm_cvtss_f32(m);
    for (; i < n; i++)
        if (v[i] > r) r = v[i];
    return r;
}

/* The scan of kiln_argmax_row, continued over consecutive chunks (ids rising). Once a
 * best exists only x > raw can replace it, so a chunk whose largest value is not above
 * raw is skipped after a vector max (most of an LM head's chunks). */
static void argmax_update(best *b, const float *v, int64_t n, int64_t base, float softcap) {
    if (b->id >= 0 && !(chunk_max(v, n) > b->raw)) return;
    for (int64_t i = 0; i < n; i++) {
        float x = v[i];
        if (isnan(x) || (b->id >= 0 && !(x > b->raw))) continue;
        float key = softcap > 0 ? softcap * tanhf(x / softcap) : x;
        if (isnan(key) || key == -INFINITY) continue;
        if (b->id < 0 || key > b->key) {
            b->id = (int32_t)(base + i);
            b->key = key;
            b->raw = x;
        }
    }
}

typedef struct ajob {
    _Alignas(64) const isa_impl *isa;
    kiln_cpu_mm mm;
    uint32_t layout;
    size_t group_bytes; /* R16: bytes per 16 rows */
    int64_t n_limit;
    float softcap;
    uint8_t *area; /* per thread: [panel][t x ARGMAX_ROWS floats][t bests] */
    size_t area_stride, panel;
    char pad[64];
} ajob;

static void argmax_items(void *ctx, int64_t b, int64_t e, int ith) {
    const ajob *j = ctx;
    uint8_t *area = j->area + (size_t)ith * j->area_stride;
    float *ybuf = (float *)(void *)(area + j->panel);
    best *bs = (best *)(void *)(ybuf + j->mm.t * ARGMAX_ROWS);
    for (int64_t it = b; it < e; it++) {
        int64_t r0 = it * ARGMAX_ROWS,
                r1 = r0 + ARGMAX_ROWS < j->n_limit ? r0 + ARGMAX_ROWS : j->n_limit;
        kiln_cpu_mm mm = j->mm;
        mm.w = j->mm.w + (j->layout == KILN_CPU_WLAYOUT_R16 ? (size_t)(r0 / 16) * j->group_bytes
                                                            : (size_t)r0 * j->mm.w_row_bytes);
        mm.n = r1 - r0;
        mm.y = ybuf;
        mm.y_stride = ARGMAX_ROWS;
        mm.bias = j->mm.bias ? j->mm.bias + r0 : NULL;
        run_rows(j->isa, &mm, j->layout, 0, r1 - r0, area);
        for (int64_t t = 0; t < j->mm.t; t++)
            argmax_update(&bs[t], ybuf + t * ARGMAX_ROWS, r1 - r0, r0, j->softcap);
    }
}

static kiln_status matmul_argmax(const isa_impl *isa, const kiln_kctx *c,
                                 const kiln_matmul_argmax_args *a) {
    const kiln_matmul_args *m = &a->mm;
    if (m->t <= 0) return KILN_OK;
    if (a->n_limit < 0 || a->n_limit > m->n) return KILN_ERR_INVALID_ARG;
    kiln_matmul_fn fn = a->fn ? a->fn : isa->own;
    kiln_matmul_args lim = *m;
    lim.n = a->n_limit;
    if (a->n_limit == 0 || !fusable(isa, fn, &lim)) {
        kiln_matmul_argmax_args b = *a;
        b.fn = fn;
        return kiln_ref_matmul_argmax(c, &b); /* fn into a temporary, then the scan */
    }
    kiln_pool *pool = c ? c->pool : NULL;
    const int nth = kiln_pool_size(pool);
    const int64_t t = m->t;
    const bool quant = kiln_cpu_mmq_supports(m->w_dtype);
    const size_t act_stride = kiln_q8act_row_bytes(m->k);
    const size_t act_bytes = quant ? (((size_t)t * act_stride + 63) & ~(size_t)63) : 0;
    const size_t panel = t > 1 ? kiln_cpu_panel_bytes(m->w_dtype, m->k, t) : 0;
    size_t area = panel + (size_t)t * ARGMAX_ROWS * sizeof(float) + (size_t)t * sizeof(best);
    area = (area + 63) & ~(size_t)63;
    scratch s;
    /* float weights, t > 1: the transposed activations, as matmul.c (AVX-512 only) */
    const bool xt = !quant && t > 1 && isa == &impl_avx512;
    const size_t xt_bytes = xt ? kiln_cpu_xt_bytes(m->k, t) : 0;
    KILN_TRY(scratch_get(c, act_bytes + xt_bytes + (size_t)nth * area + 64, &s));
    if (quant) quantize(isa, pool, m->x, m->x_stride, m->k, t, s.ws);
    if (xt) kiln_cpu_xt_fill(pool, m->x, m->x_stride, m->k, t, (float *)(s.ws + act_bytes));
    ajob j;
    memset(&j, 0, sizeof j);
    j.isa = isa;
    j.mm = make_mm(m, s.ws, act_stride);
    if (xt) {
        j.mm.xt = (const float *)(s.ws + act_bytes);
        j.mm.xt_stride = kiln_cpu_xt_stride(t);
    }
    j.layout = m->w_layout;
    j.group_bytes =
        m->w_layout == KILN_CPU_WLAYOUT_R16 ? kiln_cpu_r16_group_bytes(m->w_dtype, m->k) : 0;
    j.n_limit = a->n_limit;
    j.softcap = a->softcap;
    j.area = s.ws + act_bytes + xt_bytes;
    j.area_stride = area;
    j.panel = panel;
    for (int th = 0; th < nth; th++) {
        best *bs = (best *)(void *)(j.area + (size_t)th * area + panel +
                                    (size_t)t * ARGMAX_ROWS * sizeof(float));
        for (int64_t i = 0; i < t; i++) bs[i] = (best){-INFINITY, -INFINITY, -1};
    }
    kiln_pool_for(pool, (a->n_limit + ARGMAX_ROWS - 1) / ARGMAX_ROWS, 1, argmax_items, &j);
    /* merge: the largest key, the lowest id among equal keys */
    for (int64_t i = 0; i < t; i++) {
        best w = {-INFINITY, -INFINITY, -1};
        for (int th = 0; th < nth; th++) {
            const best *bs = (const best *)(const void *)(j.area + (size_t)th * area + panel +
                                                          (size_t)t * ARGMAX_ROWS * sizeof(float));
            const best *b = &bs[i];
            if (b->id < 0) continue;
            if (w.id < 0 || b->key > w.key || (b->key == w.key && b->id < w.id)) w = *b;
        }
        a->ids[i] = w.id;
        if (a->vals) a->vals[i] = w.id >= 0 ? w.key : NAN;
    }
    kiln_free_aligned(s.own);
    return KILN_OK;
}

kiln_status kiln_cpu_matmul_argmax_avx512(const kiln_kctx *c, const kiln_matmul_argmax_args *a) {
    return matmul_argmax(&impl_avx512, c, a);
}

kiln_status kiln_cpu_matmul_argmax_avx2(const kiln_kctx *c, const kiln_matmul_argmax_args *a) {
    return matmul_argmax(&impl_avx2, c, a);
}
