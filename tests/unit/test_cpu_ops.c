/*
 * test_cpu_ops.c — the CPU backend's non-matmul kernels (AVX-512 and AVX2 flavours of
 * rms_norm, add, glu, attention; scalar embed, rope, kv_write) against straightforward
 * double-precision implementations written here, on random data with odd sizes.
 *
 * Tolerances (|got - want| <= abs + rel * |want|):
 *  - rms_norm, add: abs 1e-6, rel 1e-5 (f32 sums in another order)
 *  - glu: abs 1e-6, rel 2e-5 (vector exp: 2e-7 relative; erf: 1.5e-7 absolute)
 *  - rope: abs 1e-5 (f32 sin/cos of angles up to ~1e3 rad, accumulated theta scale)
 *  - attention, f32 KV: abs 1e-5, rel 1e-4; f16 KV: the reference reads the same f16
 *    values, same tolerance (the kernel widens f16 exactly)
 *  - embed, kv_write: exact
 */
#include "testutil.h"

#include "base/mem.h"
#include "base/pool.h"
#include "format/dtype.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kiln_pool *g_pool;

static int close_enough(const char *what, const float *got, const double *want, int64_t n,
                        double abs_tol, double rel_tol) {
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 5; i++) {
        if (!(fabs(got[i] - want[i]) <= abs_tol + rel_tol * fabs(want[i]))) {
            print_error("%s: [%lld] got %.8g want %.8g\n", what, (long long)i, got[i], want[i]);
            bad++;
        }
    }
    return bad;
}

typedef struct isa_ops {
    const char *name;
    bool (*ok)(void);
    kiln_rms_norm_fn rms;
    kiln_add_fn add;
    kiln_glu_fn glu;
    kiln_attention_fn att;
} isa_ops;

static const isa_ops isas[] = {
    {"avx512", kiln_cpu_avx512_ok, kiln_cpu_rms_norm_avx512, kiln_cpu_add_avx512,
     kiln_cpu_glu_avx512, kiln_cpu_attention_avx512},
    {"avx2", kiln_cpu_avx2_ok, kiln_cpu_rms_norm_avx2, kiln_cpu_add_avx2, kiln_cpu_glu_avx2,
     kiln_cpu_attention_avx2},
};

/* ---- rms_norm / add / glu ---- */

static void test_rms_add_glu(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 7);
    int bad = 0;
    for (size_t is = 0; is < sizeof isas / sizeof isas[0]; is++) {
        if (!isas[is].ok()) continue;
        static const int64_t ns[] = {1, 7, 17, 640, 1000, 2051};
        static const int64_t rowss[] = {1, 3, 40};
        for (size_t ni = 0; ni < 6; ni++)
            for (size_t ri = 0; ri < 3; ri++) {
                const int64_t n = ns[ni], rows = rowss[ri], st = n + 3;
                float *x = malloc(sizeof(float) * rows * st),
                      *x0 = malloc(sizeof(float) * rows * st);
                float *res = malloc(sizeof(float) * rows * st),
                      *y = malloc(sizeof(float) * rows * st);
                float *w = malloc(sizeof(float) * n), *sum = malloc(sizeof(float) * rows * st);
                float *w2 = malloc(sizeof(float) * n);
                double *want = malloc(sizeof(double) * rows * st);
                kt_fill_normal(&r, x0, (size_t)(rows * st), 2.0f);
                kt_fill_normal(&r, res, (size_t)(rows * st), 1.0f);
                kt_fill_normal(&r, w, (size_t)n, 0.5f);
                kt_fill_normal(&r, w2, (size_t)n, 0.5f);
                /* 0: plain, 1: residual + offset (the sum into x), 2: the sum into s,
                 * 3: plain with w2 from the middle row on (the q + k norms in one call) */
                for (int mode = 0; mode < 4; mode++) {
                    memcpy(x, x0, sizeof(float) * rows * st);
                    kiln_rms_norm_args a = {.x = x,
                                            .r = mode == 1 || mode == 2 ? res : NULL,
                                            .s = mode == 2 ? sum : NULL,
                                            .w2 = mode == 3 ? w2 : NULL,
                                            .w2_row = rows / 2,
                                            .s_stride = st,
                                            .y = y,
                                            .w = w,
                                            .w_offset = mode == 1 || mode == 2 ? 1.0f : 0.0f,
                                            .rows = rows,
                                            .n = n,
                                            .x_stride = st,
                                            .r_stride = st,
                                            .y_stride = st,
                                            .eps = 1e-6f};
                    kiln_kctx c = {.pool = g_pool};
                    assert_int_equal(isas[is].rms(&c, &a), KILN_OK);
                    for (int64_t i = 0; i < rows; i++) {
                        double ss = 0, xs[2100];
                        for (int64_t j = 0; j < n; j++) {
                            xs[j] = (double)x0[i * st + j] +
                                    (mode == 1 || mode == 2 ? res[i * st + j] : 0.0);
                            ss += xs[j] * xs[j];
                        }
                        double sc = 1.0 / sqrt(ss / n + 1e-6);
                        for (int64_t j = 0; j < n; j++)
                            want[i * n + j] = xs[j] * sc *
                                              ((mode == 3 && i >= rows / 2 ? w2 : w)[j] +
                                               (mode == 1 || mode == 2 ? 1.0 : 0.0));
                        float got[2100];
                        memcpy(got, y + i * st, sizeof(float) * n);
                        bad += close_enough("rms_norm", got, want + i * n, n, 1e-6, 1e-5);
                        if (mode == 1 || mode == 2) { /* x (mode 1) or s (mode 2): the sum */
                            memcpy(got, (mode == 2 ? sum : x) + i * st, sizeof(float) * n);
                            bad += close_enough("rms_norm residual", got, xs, n, 1e-6, 1e-6);
                        }
                        if (mode == 2 && memcmp(x + i * st, x0 + i * st, sizeof(float) * n)) {
                            fprintf(stderr, "rms_norm with s: x changed (row %lld)\n",
                                    (long long)i);
                            bad++;
                        }
                    }
                }
                /* add */
                {
                    kiln_add_args a = {.a = x0,
                                       .b = res,
                                       .y = y,
                                       .t = rows,
                                       .n = n,
                                       .a_stride = st,
                                       .b_stride = st,
                                       .y_stride = st};
                    kiln_kctx c = {.pool = g_pool};
                    assert_int_equal(isas[is].add(&c, &a), KILN_OK);
                    for (int64_t i = 0; i < rows; i++) {
                        for (int64_t j = 0; j < n; j++)
                            want[j] = (double)x0[i * st + j] + res[i * st + j];
                        bad += close_enough("add", y + i * st, want, n, 1e-6, 1e-6);
                    }
                }
                /* glu */
                for (int act = 0; act < 3; act++) {
                    kiln_glu_args a = {.gate = x0,
                                       .up = res,
                                       .y = y,
                                       .t = rows,
                                       .n = n,
                                       .gate_stride = st,
                                       .up_stride = st,
                                       .y_stride = st,
                                       .act = (kiln_glu_act)act};
                    kiln_kctx c = {.pool = g_pool};
                    assert_int_equal(isas[is].glu(&c, &a), KILN_OK);
                    for (int64_t i = 0; i < rows; i++) {
                        for (int64_t j = 0; j < n; j++) {
                            double g = x0[i * st + j], u = res[i * st + j], v;
                            if (act == 0)
                                v = g / (1 + exp(-g));
                            else if (act == 1)
                                v = 0.5 * g *
                                    (1 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
                            else
                                v = 0.5 * g * (1 + erf(g / sqrt(2.0)));
                            want[j] = v * u;
                        }
                        char what[64];
                        snprintf(what, sizeof what, "%s glu act %d n %lld", isas[is].name, act,
                                 (long long)n);
                        bad += close_enough(what, y + i * st, want, n, 1e-6, 2e-5);
                    }
                }
                free(x), free(x0), free(res), free(y), free(w), free(w2), free(sum), free(want);
            }
    }
    assert_int_equal(bad, 0);
}

/* glu on extreme inputs stays finite and saturates correctly */
static void test_glu_extremes(void **state) {
    (void)state;
    float g[8] = {-1000, -90, -20, 0, 20, 90, 1000, -0.0f}, u[8] = {1, 1, 1, 1, 1, 1, 1, 1}, y[8];
    for (size_t is = 0; is < sizeof isas / sizeof isas[0]; is++) {
        if (!isas[is].ok()) continue;
        for (int act = 0; act < 3; act++) {
            kiln_glu_args a = {
                .gate = g, .up = u, .y = y, .t = 1, .n = 8, .act = (kiln_glu_act)act};
            assert_int_equal(isas[is].glu(NULL, &a), KILN_OK);
            for (int i = 0; i < 8; i++) {
                assert_true(isfinite(y[i]));
                if (g[i] >= 20) assert_true(fabsf(y[i] - g[i]) <= 1e-4f * g[i]);
                if (g[i] <= -20) assert_true(fabsf(y[i]) < 1e-6f);
            }
        }
    }
}

/* ---- attention ---- */

typedef struct kvcache {
    kiln_kv_layer kv;
    int32_t tables[4][64];
    int32_t seq_len[4];
    kiln_kv_blocks seqs;
} kvcache;

static double kv_get(const kvcache *c, const void *base, int s, int p, int h, int d) {
    const kiln_kv_layer *kv = &c->kv;
    size_t es = kv->dtype == KILN_DTYPE_F16 ? 2 : 4;
    const uint8_t *e = (const uint8_t *)base + (size_t)c->tables[s][p / 16] * kv->block_bytes +
                       (((size_t)(p % 16) * kv->n_kv_head + h) * kv->head_dim + d) * es;
    if (kv->dtype == KILN_DTYPE_F16) {
        uint16_t v;
        memcpy(&v, e, 2);
        return kiln_fp16_to_f32(v);
    }
    float f;
    memcpy(&f, e, 4);
    return f;
}

static int att_case(const isa_ops *is, kt_rng *r, uint32_t dtype, int n_head, int n_kv, int hd,
                    int window, float softcap, int nseq, const int *ctx_len, const int *ntok) {
    kvcache c = {0};
    c.kv.dtype = dtype;
    c.kv.n_kv_head = n_kv;
    c.kv.head_dim = hd;
    c.kv.block_bytes = (size_t)16 * n_kv * hd * (dtype == KILN_DTYPE_F16 ? 2 : 4);
    /* physical blocks: a shuffled permutation shared out to the sequences */
    int total_blocks = 0;
    for (int s = 0; s < nseq; s++) total_blocks += (ctx_len[s] + 15) / 16;
    int32_t *perm = malloc(sizeof(int32_t) * total_blocks);
    for (int i = 0; i < total_blocks; i++) perm[i] = i;
    for (int i = total_blocks - 1; i > 0; i--) {
        int j = (int)(kt_rng_u64(r) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int used = 0;
    for (int s = 0; s < nseq; s++) {
        c.seq_len[s] = ctx_len[s];
        for (int b = 0; b < (ctx_len[s] + 15) / 16; b++) c.tables[s][b] = perm[used++];
    }
    c.seqs = (kiln_kv_blocks){
        .table = &c.tables[0][0], .seq_len = c.seq_len, .n_seqs = nseq, .stride = 64};
    size_t bytes = c.kv.block_bytes * total_blocks;
    c.kv.k = malloc(bytes);
    c.kv.v = malloc(bytes);
    if (dtype == KILN_DTYPE_F16) {
        for (size_t i = 0; i < bytes / 2; i++) {
            ((uint16_t *)c.kv.k)[i] = kiln_f32_to_fp16(kt_rng_normal(r));
            ((uint16_t *)c.kv.v)[i] = kiln_f32_to_fp16(kt_rng_normal(r));
        }
    } else {
        kt_fill_normal(r, c.kv.k, bytes / 4, 1.0f);
        kt_fill_normal(r, c.kv.v, bytes / 4, 1.0f);
    }
    /* tokens: the last ntok[s] positions of each sequence */
    int t = 0;
    for (int s = 0; s < nseq; s++) t += ntok[s];
    int32_t *tseq = malloc(sizeof(int32_t) * t), *tpos = malloc(sizeof(int32_t) * t);
    int i = 0;
    for (int s = 0; s < nseq; s++)
        for (int k = 0; k < ntok[s]; k++, i++) {
            tseq[i] = s;
            tpos[i] = ctx_len[s] - ntok[s] + k;
        }
    const int64_t qs = (int64_t)n_head * hd + 5;
    float *q = malloc(sizeof(float) * t * qs), *out = malloc(sizeof(float) * t * qs);
    kt_fill_normal(r, q, (size_t)(t * qs), 1.0f);
    const float scale = 1.0f / sqrtf((float)hd);
    kiln_attention_args a = {.kv = c.kv,
                             .q = q,
                             .q_stride = qs,
                             .out = out,
                             .out_stride = qs,
                             .t = t,
                             .n_head = n_head,
                             .tok_seq = tseq,
                             .tok_pos = tpos,
                             .blocks = c.seqs,
                             .scale = scale,
                             .softcap = softcap,
                             .window = window};
    kiln_kctx kc = {.pool = g_pool};
    assert_int_equal(is->att(&kc, &a), KILN_OK);
    int bad = 0;
    /* batch invariance, bitwise: each token alone (a tile of one token, its own items and
     * code path) gives the bits it got in the tiles of the whole call */
    float *one = malloc(sizeof(float) * (size_t)qs);
    for (i = 0; i < t && bad < 5; i++) {
        kiln_attention_args a1 = a;
        a1.q = q + (size_t)i * qs;
        a1.out = one;
        a1.t = 1;
        a1.tok_seq = tseq + i;
        a1.tok_pos = tpos + i;
        assert_int_equal(is->att(&kc, &a1), KILN_OK);
        if (memcmp(one, out + (size_t)i * qs, sizeof(float) * (size_t)n_head * hd)) {
            fprintf(stderr, "%s attention %s heads %d/%d hd %d: token %d alone != in its tile\n",
                    is->name, kiln_dtype_name(dtype), n_head, n_kv, hd, i);
            bad++;
        }
    }
    free(one);
    double *want = malloc(sizeof(double) * hd), *sc = malloc(sizeof(double) * 1024);
    for (i = 0; i < t && bad < 5; i++)
        for (int h = 0; h < n_head && bad < 5; h++) {
            const int kh = h / (n_head / n_kv), pos = tpos[i], s = tseq[i];
            int lo = window > 0 ? pos - window + 1 : 0;
            if (lo < 0) lo = 0;
            double mx = -1e300, sum = 0;
            for (int p = lo; p <= pos; p++) {
                double d = 0;
                for (int e = 0; e < hd; e++)
                    d += (double)q[i * qs + h * hd + e] * kv_get(&c, c.kv.k, s, p, kh, e);
                d *= scale;
                if (softcap > 0) d = softcap * tanh(d / softcap);
                sc[p - lo] = d;
                if (d > mx) mx = d;
            }
            for (int e = 0; e < hd; e++) want[e] = 0;
            for (int p = lo; p <= pos; p++) {
                double w = exp(sc[p - lo] - mx);
                sum += w;
                for (int e = 0; e < hd; e++) want[e] += w * kv_get(&c, c.kv.v, s, p, kh, e);
            }
            for (int e = 0; e < hd; e++) want[e] /= sum;
            char what[160];
            snprintf(what, sizeof what,
                     "%s attention %s heads %d/%d hd %d window %d softcap %g token %d head %d",
                     is->name, kiln_dtype_name(dtype), n_head, n_kv, hd, window, softcap, i, h);
            bad += close_enough(what, out + i * qs + h * hd, want, hd, 1e-5, 1e-4);
        }
    free(want), free(sc), free(q), free(out), free(tseq), free(tpos), free(perm);
    free(c.kv.k), free(c.kv.v);
    return bad;
}

static void test_attention(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 11);
    int bad = 0;
    for (size_t is = 0; is < sizeof isas / sizeof isas[0]; is++) {
        if (!isas[is].ok()) continue;
        const isa_ops *o = &isas[is];
        for (int dt = 0; dt < 2; dt++) {
            uint32_t dtype = dt ? KILN_DTYPE_F16 : KILN_DTYPE_F32;
            /* prefill: one sequence, 37 tokens from position 0 */
            int L1[] = {37}, T1[] = {37};
            bad += att_case(o, &r, dtype, 4, 4, 64, 0, 0, 1, L1, T1);
            bad += att_case(o, &r, dtype, 8, 2, 72, 0, 0, 1, L1, T1);     /* GQA 4, hd % 16 != 0 */
            bad += att_case(o, &r, dtype, 4, 1, 256, 5, 0, 1, L1, T1);    /* window, gemma dims */
            bad += att_case(o, &r, dtype, 6, 3, 64, 0, 30.0f, 1, L1, T1); /* softcap */
            /* chunked prefill after a cached prefix, two sequences mixed */
            int L2[] = {100, 45}, T2[] = {20, 7};
            bad += att_case(o, &r, dtype, 8, 4, 64, 0, 0, 2, L2, T2);
            bad += att_case(o, &r, dtype, 8, 4, 64, 33, 0, 2, L2, T2);
            /* decode: one token per sequence, long contexts (split-K) */
            int L3[] = {300}, T3[] = {1};
            bad += att_case(o, &r, dtype, 4, 1, 256, 0, 0, 1, L3, T3);
            bad += att_case(o, &r, dtype, 32, 4, 64, 0, 0, 1, L3, T3);
            bad += att_case(o, &r, dtype, 32, 4, 64, 50, 0, 1, L3, T3);
            int L4[] = {300, 17, 1, 64}, T4[] = {1, 1, 1, 1};
            bad += att_case(o, &r, dtype, 4, 2, 64, 0, 0, 4, L4, T4);
            /* several KV heads an item, uneven head groups, long splits */
            int L5[] = {1000}, T5[] = {1};
            bad += att_case(o, &r, dtype, 12, 12, 64, 0, 0, 1, L5, T5);
            int L6[] = {700, 5}, T6[] = {1, 1};
            bad += att_case(o, &r, dtype, 20, 5, 64, 0, 0, 2, L6, T6);
            bad += att_case(o, &r, dtype, 10, 5, 48, 0, 0, 1, L1, T1);
            int L7[] = {260, 40}, T7[] = {3, 40};
            bad += att_case(o, &r, dtype, 7, 7, 32, 100, 0, 2, L7, T7);
            /* head size 128 (the batched AVX2 path, like 64): prefill over a cached
             * prefix, a softcap, decode with splits */
            int L8[] = {75, 300}, T8[] = {23, 1};
            bad += att_case(o, &r, dtype, 8, 2, 128, 0, 0, 2, L8, T8);
            bad += att_case(o, &r, dtype, 4, 4, 128, 0, 50.0f, 1, L1, T1);
            bad += att_case(o, &r, dtype, 4, 2, 128, 40, 0, 2, L8, T8);
        }
    }
    assert_int_equal(bad, 0);
}

/* ---- rope ---- */

static void test_rope(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 5);
    int bad = 0;
    for (int mode = 0; mode < 2; mode++)
        for (int variant = 0; variant < 3; variant++) { /* plain, freq factors + partial, yarn */
            const int n_head = 3, hd = 64, n_rot = variant == 1 ? 32 : 64, rows = 9;
            const int64_t xs = n_head * hd + 1;
            float *x = malloc(sizeof(float) * rows * xs), *x0 = malloc(sizeof(float) * rows * xs);
            kt_fill_normal(&r, x0, (size_t)(rows * xs), 1.0f);
            memcpy(x, x0, sizeof(float) * rows * xs);
            int32_t pos[9] = {0, 1, 2, 7, 100, 511, 1000, 4095, 3};
            float ff[32];
            for (int i = 0; i < 32; i++) ff[i] = 1.0f + (float)i * 0.25f;
            kiln_rope_args a = {.x = x,
                                .rows = rows,
                                .x_stride = xs,
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
                                .n_ctx_orig = 4096};
            kiln_kctx c = {.pool = g_pool};
            assert_int_equal(kiln_cpu_rope(&c, &a), KILN_OK);
            double corr0 = 0, corr1 = 0;
            if (variant == 2) {
                double d0 = n_rot * log(4096.0 / (32.0 * 2 * M_PI)) / (2 * log(10000.0));
                double d1 = n_rot * log(4096.0 / (1.0 * 2 * M_PI)) / (2 * log(10000.0));
                corr0 = fmax(0, floor(d0));
                corr1 = fmin(n_rot - 1, ceil(d1));
            }
            for (int i = 0; i < rows; i++)
                for (int h = 0; h < n_head; h++) {
                    double want[64];
                    const float *in = x0 + i * xs + h * hd;
                    for (int d = 0; d < hd; d++) want[d] = in[d];
                    for (int k = 0; k < n_rot / 2; k++) {
                        double te = pos[i] * pow(10000.0, -2.0 * k / n_rot);
                        if (variant == 1) te /= ff[k];
                        double th = a.freq_scale * te, ms = 1.0;
                        if (variant == 2) {
                            double y = (k - corr0) / fmax(0.001, corr1 - corr0);
                            double ramp = 1.0 - fmin(1.0, fmax(0.0, y));
                            th = th * (1 - ramp) + te * ramp;
                            ms *= 1.0 + 0.1 * log(1.0 / a.freq_scale);
                        }
                        int i0 = mode ? k : 2 * k, i1 = mode ? k + n_rot / 2 : 2 * k + 1;
                        want[i0] = (in[i0] * cos(th) - in[i1] * sin(th)) * ms;
                        want[i1] = (in[i0] * sin(th) + in[i1] * cos(th)) * ms;
                    }
                    /* f32 angles at position 4095: ~4e-4 rad absolute; scale with pos */
                    bad += close_enough("rope", x + i * xs + h * hd, want, hd,
                                        2e-6 + 1.5e-7 * pos[i], 0);
                }
            free(x), free(x0);
        }
    assert_int_equal(bad, 0);
}

/* ---- kv_write + embed ---- */

static void test_kv_write_embed(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 9);
    for (int dt = 0; dt < 2; dt++) {
        const int nkv = 2, hd = 24, t = 20;
        kiln_kv_layer kv = {
            .dtype = dt ? KILN_DTYPE_F16 : KILN_DTYPE_F32, .n_kv_head = nkv, .head_dim = hd};
        kv.block_bytes = (size_t)16 * nkv * hd * (dt ? 2 : 4);
        kv.k = calloc(4, kv.block_bytes);
        kv.v = calloc(4, kv.block_bytes);
        int32_t table[2] = {3, 1};
        const int32_t seq_len = 32;
        kiln_kv_blocks seq = {.table = table, .seq_len = &seq_len, .n_seqs = 1, .stride = 2};
        float k[20 * 48], v[20 * 48];
        kt_fill_normal(&r, k, 20 * 48, 1.0f);
        kt_fill_normal(&r, v, 20 * 48, 1.0f);
        int32_t ts[20], tp[20];
        for (int i = 0; i < t; i++) ts[i] = 0, tp[i] = 5 + i;
        kiln_kv_write_args a = {.kv = kv,
                                .k = k,
                                .v = v,
                                .k_stride = 48,
                                .v_stride = 48,
                                .t = t,
                                .tok_seq = ts,
                                .tok_pos = tp,
                                .blocks = seq};
        kiln_kctx c = {.pool = g_pool};
        assert_int_equal(kiln_cpu_kv_write(&c, &a), KILN_OK);
        for (int i = 0; i < t; i++)
            for (int e = 0; e < 48; e++) {
                int p = tp[i];
                size_t off = (size_t)table[p / 16] * kv.block_bytes;
                size_t idx = (size_t)(p % 16) * 48 + e;
                float gk, gv;
                if (dt) {
                    gk = kiln_fp16_to_f32(((uint16_t *)((uint8_t *)kv.k + off))[idx]);
                    gv = kiln_fp16_to_f32(((uint16_t *)((uint8_t *)kv.v + off))[idx]);
                    assert_true(gk == kiln_fp16_to_f32(kiln_f32_to_fp16(k[i * 48 + e])));
                    assert_true(gv == kiln_fp16_to_f32(kiln_f32_to_fp16(v[i * 48 + e])));
                } else {
                    gk = ((float *)((uint8_t *)kv.k + off))[idx];
                    gv = ((float *)((uint8_t *)kv.v + off))[idx];
                    assert_true(gk == k[i * 48 + e] && gv == v[i * 48 + e]);
                }
            }
        free(kv.k), free(kv.v);
    }
    /* embed from q8_0, f16 and f32 tables */
    static const uint32_t dts[] = {KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K, KILN_DTYPE_F16,
                                   KILN_DTYPE_F32};
    for (size_t d = 0; d < 4; d++) {
        const int64_t vocab = 50, dim = 256;
        size_t rb;
        assert_int_equal(kiln_dtype_row_bytes(dts[d], dim, &rb, NULL), KILN_OK);
        float *src = malloc(sizeof(float) * vocab * dim);
        uint8_t *w = malloc(rb * vocab);
        kt_fill_normal(&r, src, (size_t)(vocab * dim), 1.0f);
        for (int64_t i = 0; i < vocab; i++)
            assert_int_equal(kiln_quantize_row(dts[d], src + i * dim, w + i * rb, dim, NULL),
                             KILN_OK);
        int32_t ids[11] = {0, 49, 3, 3, 17, 1, 2, 48, 10, 20, 30};
        float y[11 * 260], row[256];
        kiln_embed_args a = {.w = w,
                             .w_dtype = dts[d],
                             .w_row_bytes = rb,
                             .n_vocab = vocab,
                             .dim = dim,
                             .ids = ids,
                             .t = 11,
                             .y = y,
                             .y_stride = 260,
                             .scale = 16.0f};
        kiln_kctx c = {.pool = g_pool};
        assert_int_equal(kiln_cpu_embed(&c, &a), KILN_OK);
        for (int i = 0; i < 11; i++) {
            assert_int_equal(kiln_dequantize_row(dts[d], w + ids[i] * rb, row, dim, NULL), KILN_OK);
            for (int e = 0; e < dim; e++) assert_true(y[i * 260 + e] == row[e] * 16.0f);
        }
        free(src), free(w);
    }
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
        cmocka_unit_test(test_rms_add_glu),    cmocka_unit_test(test_glu_extremes),
        cmocka_unit_test(test_attention),      cmocka_unit_test(test_rope),
        cmocka_unit_test(test_kv_write_embed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
