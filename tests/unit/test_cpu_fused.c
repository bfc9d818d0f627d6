/*
 * test_cpu_fused.c — the fused kernels (kernel.h: matmul_group, rope_kv, matmul_argmax)
 * of the CPU backend (AVX-512 and AVX2 flavours) and of the reference.
 *
 * What "correct" means for a fused kernel is "the same as the calls it replaces", so:
 *  - matmul_group: bitwise equal to calling each member's kernel (fn[m]) and then the
 *    glu kernel, over random weights of every dtype (members of different dtypes and
 *    layouts in one group, R16-repacked members, members bound to another kernel that
 *    must not be fused), odd n, k not a multiple of 64, t = 1..33, bias, 1 and 2
 *    threads, guard values after every output; and against the reference group
 *    (kiln_ref_matmul per member) within the worst-case error of the int8 activations:
 *    |y - ref| <= sum_i |w_i| d_b(i) / 2 + 1e-5 sum_i |w_i x_i| + 1e-6, d_b = amax of
 *    x's 32-block / 127 / 256 (0 for float weights).
 *  - matmul_argmax: the same id and value as the unfused path: the kernel's own matmul
 *    (fn) into logits, the softcap as the LM head adapter applies it, then the greedy
 *    sampler's scan (skip NaN / -inf, strict >, lowest id wins), written out here
 *    independently. Duplicate weight rows and a tiny softcap (tanh saturates) make ties.
 *  - rope_kv: bitwise equal to the cpu rope (q, k) + cpu kv_write; within
 *    2e-6 + 1.5e-7 pos (f32 angles, as test_cpu_ops' rope) of the reference rope_kv for
 *    f32 caches, plus one f16 rounding (2^-10 relative) for f16 caches.
 */
#include "testutil.h"

#include "base/mem.h"
#include "base/pool.h"
#include "format/dtype.h"
#include "kernels/cpu/cpu_fused.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ref/ref.h"
#include "kernels/ref/ref_fused.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kiln_pool *g_pool;

typedef struct isa {
    const char *name;
    bool (*ok)(void);
    kiln_matmul_fn mm;
    kiln_glu_fn glu;
    kiln_matmul_group_fn group;
    kiln_matmul_argmax_fn argmax;
    bool r16;
} isa;

static const isa isas[] = {
    {"avx512", kiln_cpu_avx512_ok, kiln_cpu_matmul_avx512, kiln_cpu_glu_avx512,
     kiln_cpu_matmul_group_avx512, kiln_cpu_matmul_argmax_avx512, true},
    {"avx2", kiln_cpu_avx2_ok, kiln_cpu_matmul_avx2, kiln_cpu_glu_avx2, kiln_cpu_matmul_group_avx2,
     kiln_cpu_matmul_argmax_avx2, true},
};

/* ---- weights (kt_fill_weights: random bytes, sane block scales) ---- */

/* One weight matrix: plain rows, and optionally its R16 repack. */
typedef struct wmat {
    uint32_t dt, layout;
    int64_t n, k;
    size_t row_bytes;
    uint8_t *plain, *r16;
    float *deq; /* [n][k] dequantized (for the error bound) */
    float *bias;
} wmat;

static void wmat_make(kt_rng *r, wmat *m, uint32_t dt, int64_t n, int64_t k, bool r16, bool bias) {
    memset(m, 0, sizeof *m);
    m->dt = dt;
    m->n = n;
    m->k = k;
    assert_int_equal(kiln_dtype_row_bytes(dt, k, &m->row_bytes, NULL), KILN_OK);
    m->plain = malloc(m->row_bytes * (size_t)n);
    kt_fill_weights(r, dt, m->plain, n, k, m->row_bytes);
    m->deq = malloc(sizeof(float) * (size_t)(n * k));
    for (int64_t i = 0; i < n; i++)
        assert_int_equal(
            kiln_dequantize_row(dt, m->plain + i * m->row_bytes, m->deq + i * k, k, NULL), KILN_OK);
    if (r16 && kiln_cpu_r16_supports(dt)) {
        size_t bytes;
        assert_int_equal(kiln_cpu_r16_size(dt, n, k, &bytes, NULL), KILN_OK);
        m->r16 = kiln_alloc_aligned(bytes);
        assert_int_equal(kiln_cpu_r16_repack(dt, m->plain, m->row_bytes, n, k, m->r16, NULL),
                         KILN_OK);
        m->layout = KILN_CPU_WLAYOUT_R16;
    }
    if (bias) {
        m->bias = malloc(sizeof(float) * (size_t)n);
        kt_fill_normal(r, m->bias, (size_t)n, 0.5f);
    }
}

static void wmat_free(wmat *m) {
    free(m->plain);
    kiln_free_aligned(m->r16);
    free(m->deq);
    free(m->bias);
}

static kiln_matmul_args wmat_args(const wmat *m, const float *x, int64_t t, float *y,
                                  int64_t y_stride) {
    return (kiln_matmul_args){.w = m->r16 ? (const void *)m->r16 : m->plain,
                              .w_dtype = m->dt,
                              .w_layout = m->layout,
                              .w_row_bytes = m->row_bytes,
                              .n = m->n,
                              .k = m->k,
                              .x = x,
                              .x_stride = m->k + 3,
                              .y = y,
                              .y_stride = y_stride,
                              .t = t,
                              .bias = m->bias};
}

static bool is_quant(uint32_t dt) {
    return dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_F16 && dt != KILN_DTYPE_BF16;
}

/* worst-case bound of the int8-activation error plus f32 summation, per output */
static double bound(const wmat *m, const float *x, int64_t row) {
    double b = 1e-6, s = 0;
    for (int64_t c0 = 0; c0 < m->k; c0 += 32) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[c0 + i]));
        double d = is_quant(m->dt) ? amax / 127.0 / 256.0 : 0;
        for (int i = 0; i < 32; i++) {
            double w = m->deq[row * m->k + c0 + i];
            b += fabs(w) * d / 2;
            s += fabs(w * x[c0 + i]);
        }
    }
    return b + 1e-5 * s;
}

/* ---- matmul_group ---- */

typedef struct gcase {
    uint32_t dt[3];
    int64_t n[3];
    int64_t k;
    int nm;
    bool r16, bias, glu, ref_member; /* ref_member: member 1 bound to kiln_ref_matmul */
} gcase;

#define GUARD 7.25f

static int group_case(const isa *is, kt_rng *r, const gcase *gc, int64_t t, kiln_pool *pool) {
    int bad = 0;
    wmat w[3];
    float *y[3], *ye[3], *yr[3];
    const int64_t k = gc->k;
    float *x = malloc(sizeof(float) * (size_t)(t * (k + 3)));
    kt_fill_normal(r, x, (size_t)(t * (k + 3)), 1.0f);
    kiln_matmul_group_args g = {.n = gc->nm}, ge, gr;
    for (int m = 0; m < gc->nm; m++) {
        wmat_make(r, &w[m], gc->dt[m], gc->n[m], k,
                  gc->r16 && is->r16 && !(gc->ref_member && m == 1), gc->bias);
        const int64_t ys = gc->n[m] + 5, cnt = t * ys + 16;
        y[m] = malloc(sizeof(float) * (size_t)cnt);
        ye[m] = malloc(sizeof(float) * (size_t)cnt);
        yr[m] = malloc(sizeof(float) * (size_t)cnt);
        for (int64_t i = 0; i < cnt; i++) y[m][i] = ye[m][i] = yr[m][i] = GUARD;
        g.m[m] = wmat_args(&w[m], x, t, y[m], ys);
        g.fn[m] = gc->ref_member && m == 1 ? kiln_ref_matmul : is->mm;
    }
    ge = g;
    gr = g;
    for (int m = 0; m < gc->nm; m++) {
        ge.m[m].y = ye[m];
        gr.m[m].y = yr[m];
        gr.m[m].w = w[m].plain; /* the reference reads plain rows */
        gr.m[m].w_layout = 0;
        gr.fn[m] = kiln_ref_matmul;
    }
    if (gc->glu) {
        g.glu_fn = is->glu;
        g.act = (kiln_glu_act)(kt_rng_u64(r) % 3);
        g.glu_y = y[1];
        g.glu_y_stride = g.m[1].y_stride;
        ge.glu_fn = g.glu_fn;
        ge.act = g.act;
        ge.glu_y = ye[1];
        ge.glu_y_stride = g.glu_y_stride;
        gr.glu_fn = kiln_ref_glu;
        gr.act = g.act;
        gr.glu_y = yr[1];
        gr.glu_y_stride = g.glu_y_stride;
    }
    kiln_kctx c = {.pool = pool};
    assert_int_equal(is->group(&c, &g), KILN_OK);
    /* expected: the separate calls */
    for (int m = 0; m < gc->nm; m++) assert_int_equal(ge.fn[m](&c, &ge.m[m]), KILN_OK);
    if (gc->glu) {
        kiln_glu_args ga = {.gate = ye[0],
                            .up = ye[1],
                            .y = ye[1],
                            .t = t,
                            .n = gc->n[1],
                            .gate_stride = ge.m[0].y_stride,
                            .up_stride = ge.m[1].y_stride,
                            .y_stride = ge.m[1].y_stride,
                            .act = ge.act};
        assert_int_equal(is->glu(&c, &ga), KILN_OK);
    }
    assert_int_equal(kiln_ref_matmul_group(&c, &gr), KILN_OK);
    for (int m = 0; m < gc->nm; m++) {
        const int64_t ys = gc->n[m] + 5, cnt = t * ys + 16;
        if (memcmp(y[m], ye[m], sizeof(float) * (size_t)cnt) != 0) {
            int64_t i = 0;
            while (y[m][i] == ye[m][i]) i++;
            print_error("%s group: member %d (%s, n %lld, k %lld, t %lld, glu %d): not the "
                        "separate call's result at %lld: %g vs %g\n",
                        is->name, m, kiln_dtype_name(gc->dt[m]), (long long)gc->n[m], (long long)k,
                        (long long)t, gc->glu, (long long)i, y[m][i], ye[m][i]);
            bad++;
        }
        if (gc->glu && m == 1) continue; /* the activation's error is test_cpu_ops' */
        for (int64_t tt = 0; tt < t && !bad; tt++)
            for (int64_t i = 0; i < gc->n[m]; i++) {
                double got = y[m][tt * ys + i], want = yr[m][tt * ys + i];
                double tol = bound(&w[m], x + tt * (k + 3), i);
                if (!(fabs(got - want) <= tol)) {
                    print_error("%s group: member %d (%s) t %lld row %lld: %.7g vs ref %.7g "
                                "(tol %.3g)\n",
                                is->name, m, kiln_dtype_name(gc->dt[m]), (long long)tt,
                                (long long)i, got, want, tol);
                    bad++;
                    break;
                }
            }
    }
    for (int m = 0; m < gc->nm; m++) {
        wmat_free(&w[m]);
        free(y[m]), free(ye[m]), free(yr[m]);
    }
    free(x);
    return bad;
}

static void test_group(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 11);
    const gcase cases[] = {
        /* q/k/v shaped, same dtype, R16 where it exists */
        {{KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_0},
         {100, 37, 37},
         96,
         3,
         true,
         false,
         false,
         false},
        {{KILN_DTYPE_Q8_0, KILN_DTYPE_Q8_0, KILN_DTYPE_Q8_0},
         {256, 64, 64},
         160,
         3,
         true,
         true,
         false,
         false},
        /* mixed dtypes and layouts in one group (Gemma's q5_0 / q8_0 / q4_K mix) */
        {{KILN_DTYPE_Q5_0, KILN_DTYPE_Q4_K, KILN_DTYPE_Q6_K},
         {33, 70, 17},
         512,
         3,
         true,
         false,
         false,
         false},
        {{KILN_DTYPE_F16, KILN_DTYPE_Q4_1, KILN_DTYPE_BF16},
         {40, 7, 19},
         96,
         3,
         false,
         true,
         false,
         false},
        {{KILN_DTYPE_F32, KILN_DTYPE_Q5_1, KILN_DTYPE_Q5_K},
         {16, 1, 515},
         256,
         3,
         false,
         false,
         false,
         false},
        /* a member bound to another kernel: called separately, the rest fused */
        {{KILN_DTYPE_Q4_0, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_0},
         {48, 48, 16},
         64,
         3,
         true,
         false,
         false,
         true},
        /* gate/up + glu */
        {{KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_0}, {515, 515}, 96, 2, true, false, true, false},
        {{KILN_DTYPE_Q4_K, KILN_DTYPE_Q6_K}, {300, 300}, 256, 2, true, false, true, false},
        {{KILN_DTYPE_F16, KILN_DTYPE_F16}, {77, 77}, 64, 2, false, false, true, false},
        {{KILN_DTYPE_Q8_0, KILN_DTYPE_Q8_0}, {64, 64}, 64, 2, true, false, true, true},
    };
    const int64_t ts[] = {1, 2, 3, 7, 33};
    int bad = 0, ran = 0;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (!isas[i].ok()) {
            print_message("skipping %s: the CPU lacks it\n", isas[i].name);
            continue;
        }
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++)
                for (int th = 0; th < 2; th++) {
                    bad += group_case(&isas[i], &r, &cases[c], ts[ti], th ? g_pool : NULL);
                    ran++;
                }
    }
    print_message("%d group cases\n", ran);
    assert_int_equal(bad, 0);
}

static void test_group_errors(void **state) {
    (void)state;
    kiln_matmul_group_args g = {.n = KILN_MATMUL_GROUP_MAX + 1};
    assert_int_equal(kiln_ref_matmul_group(NULL, &g), KILN_ERR_INVALID_ARG);
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++)
        if (isas[i].ok()) assert_int_equal(isas[i].group(NULL, &g), KILN_ERR_INVALID_ARG);
}

/* ---- matmul_argmax ---- */

/* the unfused path: logits, softcap as the LM head adapter, the greedy sampler's scan */
static int32_t unfused_pick(float *logits, int64_t n_limit, float cap, float *val) {
    if (cap > 0)
        for (int64_t i = 0; i < n_limit; i++) logits[i] = cap * tanhf(logits[i] / cap);
    int32_t best = -1;
    for (int64_t i = 0; i < n_limit; i++) {
        float l = logits[i];
        if (isnan(l) || l == -INFINITY) continue;
        if (best < 0 || l > logits[best]) best = (int32_t)i;
    }
    *val = best >= 0 ? logits[best] : NAN;
    return best;
}

static int argmax_case(const isa *is, kt_rng *r, uint32_t dt, bool r16, int64_t n, int64_t n_limit,
                       int64_t t, float cap, bool own, kiln_pool *pool) {
    const int64_t k = dt == KILN_DTYPE_Q6_K || dt == KILN_DTYPE_Q4_K ? 256 : 96;
    wmat w;
    wmat_make(r, &w, dt, n, k, false, false);
    /* duplicate rows: exact ties, the lowest id must win */
    for (int64_t i = 0; i + 40 < n; i += 97)
        memcpy(w.plain + (i + 40) * w.row_bytes, w.plain + i * w.row_bytes, w.row_bytes);
    if (r16 && is->r16 && kiln_cpu_r16_supports(dt)) {
        size_t bytes;
        assert_int_equal(kiln_cpu_r16_size(dt, n, k, &bytes, NULL), KILN_OK);
        w.r16 = kiln_alloc_aligned(bytes);
        assert_int_equal(kiln_cpu_r16_repack(dt, w.plain, w.row_bytes, n, k, w.r16, NULL), KILN_OK);
        w.layout = KILN_CPU_WLAYOUT_R16;
    }
    float *x = malloc(sizeof(float) * (size_t)(t * (k + 3)));
    kt_fill_normal(r, x, (size_t)(t * (k + 3)), 1.0f);
    float *logits = malloc(sizeof(float) * (size_t)(t * n));
    int32_t ids[8];
    float vals[8];
    kiln_kctx c = {.pool = pool};
    kiln_matmul_fn fn = own ? is->mm : kiln_ref_matmul;
    kiln_matmul_args mm = wmat_args(&w, x, t, logits, n);
    if (!own) { /* the reference reads plain rows */
        mm.w = w.plain;
        mm.w_layout = 0;
    }
    kiln_matmul_argmax_args a = {
        .mm = mm, .fn = fn, .n_limit = n_limit, .softcap = cap, .ids = ids, .vals = vals};
    a.mm.y = NULL;
    assert_int_equal(is->argmax(&c, &a), KILN_OK);
    assert_int_equal(fn(&c, &mm), KILN_OK);
    int bad = 0;
    for (int64_t tt = 0; tt < t; tt++) {
        float want_v;
        int32_t want = unfused_pick(logits + tt * n, n_limit, cap, &want_v);
        if (ids[tt] != want || !(vals[tt] == want_v || (isnan(vals[tt]) && isnan(want_v)))) {
            print_error("%s argmax %s%s n %lld limit %lld t %lld cap %g own %d: row %lld got "
                        "%d (%g), want %d (%g)\n",
                        is->name, kiln_dtype_name(dt), w.r16 ? " r16" : "", (long long)n,
                        (long long)n_limit, (long long)t, cap, own, (long long)tt, ids[tt],
                        vals[tt], want, want_v);
            bad++;
        }
    }
    /* the reference argmax over the same logits (its fn is fn) */
    int32_t rids[8];
    a.ids = rids;
    a.vals = NULL;
    assert_int_equal(kiln_ref_matmul_argmax(&c, &a), KILN_OK);
    for (int64_t tt = 0; tt < t; tt++)
        if (rids[tt] != ids[tt]) {
            print_error("ref argmax disagrees: %d vs %d\n", rids[tt], ids[tt]);
            bad++;
        }
    wmat_free(&w);
    free(x);
    free(logits);
    return bad;
}

static void test_argmax(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 13);
    const uint32_t dts[] = {KILN_DTYPE_Q4_0, KILN_DTYPE_Q8_0, KILN_DTYPE_Q6_K,
                            KILN_DTYPE_Q4_K, KILN_DTYPE_F16,  KILN_DTYPE_F32};
    const int64_t ns[] = {1, 17, 300, 1000, 4099};
    const float caps[] = {0.0f, 30.0f, 0.01f}; /* 0.01: tanh saturates, many ties */
    int bad = 0, ran = 0;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (!isas[i].ok()) continue;
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                for (int v = 0; v < 4; v++) {
                    int64_t n = ns[ni], t = v == 0 ? 1 : v == 1 ? 2 : v == 2 ? 5 : 1;
                    int64_t lim = v == 3 && n > 9 ? n - 9 : n;
                    float cap = caps[(ni + (size_t)v) % 3];
                    bool r16 = (v & 1) == 0, own = !(v == 2 && ni == 2);
                    bad += argmax_case(&isas[i], &r, dts[d], r16, n, lim, t, cap, own,
                                       (ni + d) % 2 ? g_pool : NULL);
                    ran++;
                }
    }
    /* many chunks, so both threads find saturated (tied) maxima: the merge must keep the
     * lowest id */
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++)
        for (int rep = 0; isas[i].ok() && rep < 4; rep++, ran++)
            bad += argmax_case(&isas[i], &r, KILN_DTYPE_Q8_0, rep & 1, 40000, 40000, 1 + rep / 2,
                               0.01f, true, g_pool);
    print_message("%d argmax cases\n", ran);
    assert_int_equal(bad, 0);
}

static void test_argmax_row(void **state) {
    (void)state;
    float v;
    const float a[] = {NAN, -INFINITY, 1.0f, 3.0f, 3.0f, NAN, 2.0f};
    assert_int_equal(kiln_argmax_row(a, 7, 0, &v), 3);
    assert_true(v == 3.0f);
    const float b[] = {NAN, -INFINITY, NAN};
    assert_int_equal(kiln_argmax_row(b, 3, 0, &v), -1);
    assert_true(isnan(v));
    /* with a softcap, -inf maps to -cap and can be chosen */
    assert_int_equal(kiln_argmax_row(b, 3, 2.0f, &v), 1);
    assert_true(v == -2.0f);
    /* saturation: 50 and 60 both map to cap: the lower id wins */
    const float c[] = {1.0f, 50.0f, 60.0f};
    assert_int_equal(kiln_argmax_row(c, 3, 0.5f, &v), 1);
    const float d[] = {INFINITY, INFINITY};
    assert_int_equal(kiln_argmax_row(d, 2, 0, &v), 0);
}

/* ---- rope_kv ---- */

static int rope_kv_case(kt_rng *r, uint32_t kvdt, int mode, int variant, int n_head, int nkv,
                        int hd, int64_t t, kiln_pool *pool) {
    const int n_rot = variant == 1 ? hd / 2 : hd;
    const int64_t qs = (int64_t)n_head * hd + 3, ks = (int64_t)nkv * hd + 5;
    const size_t elt = kvdt == KILN_DTYPE_F16 ? 2 : 4;
    const int n_seq = 3, nblk = 24;
    kiln_kv_layer kv = {.dtype = kvdt,
                        .n_kv_head = nkv,
                        .head_dim = hd,
                        .block_bytes = (size_t)KILN_KV_BLOCK * (size_t)(nkv * hd) * elt};
    size_t cache = kv.block_bytes * nblk;
    uint8_t *kc[3], *vc[3];
    for (int i = 0; i < 3; i++) {
        kc[i] = calloc(1, cache);
        vc[i] = calloc(1, cache);
    }
    /* block tables: a shuffle of the physical blocks, 8 per sequence */
    int32_t perm[24], *tab[3];
    for (int i = 0; i < nblk; i++) perm[i] = i;
    for (int i = nblk - 1; i > 0; i--) {
        int j = (int)(kt_rng_u64(r) % (uint64_t)(i + 1)), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    static const int32_t full[3] = {8 * KILN_KV_BLOCK, 8 * KILN_KV_BLOCK, 8 * KILN_KV_BLOCK};
    for (int s = 0; s < n_seq; s++) tab[s] = perm + 8 * s;
    kiln_kv_blocks seqs = {.table = perm, .seq_len = full, .n_seqs = n_seq, .stride = 8};
    int32_t *tok_seq = malloc(sizeof(int32_t) * (size_t)t),
            *pos = malloc(sizeof(int32_t) * (size_t)t);
    int32_t next[3] = {0, 17, 100};
    for (int64_t i = 0; i < t; i++) {
        tok_seq[i] = (int32_t)(kt_rng_u64(r) % 3);
        pos[i] = next[tok_seq[i]]++;
    }
    float *q0 = malloc(sizeof(float) * (size_t)(t * qs)),
          *k0 = malloc(sizeof(float) * (size_t)(t * ks));
    float *v0 = malloc(sizeof(float) * (size_t)(t * ks));
    kt_fill_normal(r, q0, (size_t)(t * qs), 1.0f);
    kt_fill_normal(r, k0, (size_t)(t * ks), 1.0f);
    kt_fill_normal(r, v0, (size_t)(t * ks), 1.0f);
    float *q[3], *k[3];
    for (int i = 0; i < 3; i++) {
        q[i] = malloc(sizeof(float) * (size_t)(t * qs));
        k[i] = malloc(sizeof(float) * (size_t)(t * ks));
        memcpy(q[i], q0, sizeof(float) * (size_t)(t * qs));
        memcpy(k[i], k0, sizeof(float) * (size_t)(t * ks));
    }
    float ff[512];
    for (int i = 0; i < n_rot / 2; i++) ff[i] = 1.0f + (float)i * 0.25f;
    kiln_rope_kv_args a = {.rope = {.rows = t,
                                    .x_stride = qs,
                                    .n_head = n_head,
                                    .head_dim = hd,
                                    .n_rot = n_rot,
                                    .pos = pos,
                                    .mode = (kiln_rope_mode)mode,
                                    .base = 10000.0f,
                                    .freq_scale = variant == 2 ? 0.25f : 1.0f,
                                    .freq_factors = variant == 1 ? ff : NULL,
                                    .ext_factor = variant == 2 ? 1.0f : 0.0f,
                                    .attn_factor = 1.0f,
                                    .beta_fast = 32.0f,
                                    .beta_slow = 1.0f,
                                    .n_ctx_orig = 4096},
                           .kv = {.k_stride = ks,
                                  .v_stride = ks,
                                  .t = t,
                                  .tok_seq = tok_seq,
                                  .tok_pos = pos,
                                  .blocks = seqs,
                                  .v = v0}};
    kiln_kctx c = {.pool = pool};
    /* 0: cpu fused, 1: cpu unfused, 2: reference fused */
    for (int i = 0; i < 3; i++) {
        kiln_rope_kv_args b = a;
        b.rope.x = q[i];
        b.kv.k = k[i];
        b.kv.kv = kv;
        b.kv.kv.k = kc[i];
        b.kv.kv.v = vc[i];
        if (i == 0) assert_int_equal(kiln_cpu_rope_kv(&c, &b), KILN_OK);
        if (i == 2) assert_int_equal(kiln_ref_rope_kv(&c, &b), KILN_OK);
        if (i == 1) {
            kiln_rope_args rk = b.rope;
            assert_int_equal(kiln_cpu_rope(&c, &b.rope), KILN_OK);
            rk.x = k[i];
            rk.x_stride = ks;
            rk.n_head = nkv;
            assert_int_equal(kiln_cpu_rope(&c, &rk), KILN_OK);
            assert_int_equal(kiln_cpu_kv_write(&c, &b.kv), KILN_OK);
        }
    }
    int bad = 0;
    if (memcmp(q[0], q[1], sizeof(float) * (size_t)(t * qs)) || memcmp(kc[0], kc[1], cache) ||
        memcmp(vc[0], vc[1], cache)) {
        print_error("rope_kv (%s, mode %d, variant %d, t %lld) differs from rope + kv_write\n",
                    kiln_dtype_name(kvdt), mode, variant, (long long)t);
        bad++;
    }
    /* against the reference: q, and every written K / V element */
    for (int64_t i = 0; i < t && !bad; i++) {
        const double tol = 2e-6 + 1.5e-7 * pos[i];
        for (int64_t d = 0; d < (int64_t)n_head * hd; d++) {
            double g = q[0][i * qs + d], w = q[2][i * qs + d];
            if (!(fabs(g - w) <= tol * (1 + fabs(w)))) {
                print_error("rope_kv q: token %lld dim %lld: %g vs ref %g\n", (long long)i,
                            (long long)d, g, w);
                bad++;
                break;
            }
        }
        const int32_t p = pos[i];
        const size_t off = (size_t)tab[tok_seq[i]][p / KILN_KV_BLOCK] * kv.block_bytes +
                           (size_t)(p % KILN_KV_BLOCK) * (size_t)(nkv * hd) * elt;
        for (int64_t d = 0; d < (int64_t)nkv * hd && !bad; d++)
            for (int which = 0; which < 2; which++) {
                const uint8_t *g8 = (which ? vc[0] : kc[0]) + off,
                              *w8 = (which ? vc[2] : kc[2]) + off;
                double g, w;
                if (kvdt == KILN_DTYPE_F16) {
                    uint16_t hg, hw;
                    memcpy(&hg, g8 + 2 * d, 2);
                    memcpy(&hw, w8 + 2 * d, 2);
                    g = kiln_fp16_to_f32(hg);
                    w = kiln_fp16_to_f32(hw);
                } else {
                    float fg, fw;
                    memcpy(&fg, g8 + 4 * d, 4);
                    memcpy(&fw, w8 + 4 * d, 4);
                    g = fg;
                    w = fw;
                }
                double tl = tol * (1 + fabs(w)) + (kvdt == KILN_DTYPE_F16 ? fabs(w) / 1024 : 0);
                if (!(fabs(g - w) <= tl) || (which && g != w)) {
                    print_error("rope_kv %s: token %lld dim %lld: %g vs ref %g\n",
                                which ? "v" : "k", (long long)i, (long long)d, g, w);
                    bad++;
                    break;
                }
            }
    }
    for (int i = 0; i < 3; i++) {
        free(kc[i]), free(vc[i]), free(q[i]), free(k[i]);
    }
    free(tok_seq), free(pos), free(q0), free(k0), free(v0);
    return bad;
}

static void test_rope_kv(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 17);
    int bad = 0, ran = 0;
    const int64_t ts[] = {1, 5, 20};
    for (int dt = 0; dt < 2; dt++)
        for (int mode = 0; mode < 2; mode++)
            for (int variant = 0; variant < 3; variant++)
                for (size_t ti = 0; ti < 3; ti++) {
                    int hd = variant == 0 ? 64 : variant == 1 ? 72 : 256;
                    int nh = 4 + variant * 2, nkv = variant == 2 ? 1 : 2;
                    bad += rope_kv_case(&r, dt ? KILN_DTYPE_F16 : KILN_DTYPE_F32, mode, variant, nh,
                                        nkv, hd, ts[ti], ti == 2 ? g_pool : NULL);
                    ran++;
                }
    print_message("%d rope_kv cases\n", ran);
    assert_int_equal(bad, 0);
    /* shapes it cannot run are refused, not mis-run */
    kiln_rope_kv_args a = {.rope = {.rows = 1, .n_rot = 3, .head_dim = 8},
                           .kv = {.t = 1, .kv = {.dtype = KILN_DTYPE_F32, .head_dim = 8}}};
    assert_int_equal(kiln_cpu_rope_kv(NULL, &a), KILN_ERR_UNSUPPORTED);
}

static int setup(void **state) {
    (void)state;
    return kiln_pool_create(2, &g_pool, NULL) == KILN_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    kiln_pool_free(g_pool);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group),   cmocka_unit_test(test_group_errors),
        cmocka_unit_test(test_argmax),  cmocka_unit_test(test_argmax_row),
        cmocka_unit_test(test_rope_kv),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
