/* test_ref.c — every reference kernel against a straightforward f64 implementation
 * written here, on random inputs of several shapes. Tolerances (stated per test) are
 * relative to the magnitude of the sum being computed: the ref kernels accumulate in
 * f32, the checks in f64. */
#include "testutil.h"

#include "base/pool.h"
#include "format/dtype.h"
#include "kernels/ref/ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void fill(kt_rng *r, float *x, size_t n, float scale) {
    kt_fill_normal(r, x, n, scale);
}

/* ---- matmul ---- */

static void check_matmul(uint32_t dtype, int64_t n, int64_t k, int64_t t, kiln_pool *pool) {
    kt_rng r;
    kt_rng_seed(&r, (uint64_t)(n * 131 + k * 7 + t + dtype));
    float *wf = malloc(sizeof(float) * (size_t)(n * k));
    float *x = malloc(sizeof(float) * (size_t)(t * k));
    float *bias = malloc(sizeof(float) * (size_t)n);
    float *y = malloc(sizeof(float) * (size_t)(t * n));
    float *y1 = malloc(sizeof(float) * (size_t)(t * n));
    float *deq = malloc(sizeof(float) * (size_t)k);
    fill(&r, wf, (size_t)(n * k), 0.5f);
    fill(&r, x, (size_t)(t * k), 1.0f);
    fill(&r, bias, (size_t)n, 0.1f);
    size_t rb;
    assert_int_equal(kiln_dtype_row_bytes(dtype, k, &rb, NULL), KILN_OK);
    uint8_t *w = malloc(rb * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        if (dtype == KILN_DTYPE_F32)
            memcpy(w + i * rb, wf + i * k, rb);
        else if (dtype == KILN_DTYPE_F16)
            for (int64_t j = 0; j < k; j++)
                ((uint16_t *)(void *)(w + i * rb))[j] = kiln_f32_to_fp16(wf[i * k + j]);
        else if (dtype == KILN_DTYPE_BF16)
            for (int64_t j = 0; j < k; j++)
                ((uint16_t *)(void *)(w + i * rb))[j] = kiln_f32_to_bf16(wf[i * k + j]);
        else
            assert_int_equal(kiln_quantize_row(dtype, wf + i * k, w + i * rb, k, NULL), KILN_OK);
    }
    kiln_matmul_args a = {.w = w,
                          .w_dtype = dtype,
                          .w_row_bytes = rb,
                          .n = n,
                          .k = k,
                          .x = x,
                          .x_stride = k,
                          .y = y,
                          .y_stride = n,
                          .t = t,
                          .bias = bias};
    kiln_kctx c = {.pool = pool};
    assert_int_equal(kiln_ref_matmul(&c, &a), KILN_OK);
    /* f64 reference on the dequantized weights; tolerance 1e-5 relative to sum |x w| */
    for (int64_t i = 0; i < n; i++) {
        assert_int_equal(kiln_ref_row_to_f32(dtype, w + i * rb, deq, k), KILN_OK);
        for (int64_t s = 0; s < t; s++) {
            double ref = bias[i], mag = fabs(bias[i]);
            for (int64_t j = 0; j < k; j++) {
                ref += (double)x[s * k + j] * deq[j];
                mag += fabs((double)x[s * k + j] * deq[j]);
            }
            double got = y[s * n + i];
            if (fabs(got - ref) > 1e-5 * mag + 1e-6)
                fail_msg("matmul %s n=%lld k=%lld t=%lld: y[%lld][%lld] = %.9g, f64 %.9g",
                         kiln_dtype_name(dtype), (long long)n, (long long)k, (long long)t,
                         (long long)s, (long long)i, got, ref);
        }
    }
    /* dequantized weights are close to the originals (format sanity, loose) */
    /* determinism: single-threaded result is bitwise identical */
    a.y = y1;
    assert_int_equal(kiln_ref_matmul(NULL, &a), KILN_OK);
    assert_memory_equal(y, y1, sizeof(float) * (size_t)(t * n));
    /* batch invariance: each row alone gives the same bits */
    for (int64_t s = 0; s < t; s++) {
        a.x = x + s * k;
        a.y = y1;
        a.t = 1;
        assert_int_equal(kiln_ref_matmul(&c, &a), KILN_OK);
        assert_memory_equal(y + s * n, y1, sizeof(float) * (size_t)n);
    }
    free(w), free(wf), free(x), free(bias), free(y), free(y1), free(deq);
}

static void test_matmul(void **state) {
    (void)state;
    kiln_pool *pool;
    assert_int_equal(kiln_pool_create(3, &pool, NULL), KILN_OK);
    static const uint32_t plain[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};
    static const int64_t shapes[][3] = {
        {1, 1, 1}, {7, 13, 3}, {64, 96, 5}, {33, 256, 2}, {130, 512, 4}};
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
            check_matmul(plain[d], shapes[s][0], shapes[s][1], shapes[s][2], pool);
    /* quantized: k a multiple of 256 covers every block size */
    static const uint32_t quant[] = {
        KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_1, KILN_DTYPE_Q5_0, KILN_DTYPE_Q5_1, KILN_DTYPE_Q8_0,
        KILN_DTYPE_Q2_K, KILN_DTYPE_Q3_K, KILN_DTYPE_Q4_K, KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K};
    for (size_t d = 0; d < sizeof(quant) / sizeof(quant[0]); d++) {
        check_matmul(quant[d], 17, 256, 3, pool);
        check_matmul(quant[d], 40, 512, 1, pool);
        assert_true(kiln_ref_weight_dtype_ok(quant[d]));
    }
    kiln_pool_free(pool);
}

static void test_embed(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 3);
    const int64_t V = 50, D = 32;
    float w[50 * 32], y[4 * 32];
    fill(&r, w, (size_t)(V * D), 1);
    int32_t ids[4] = {0, 49, 7, 7};
    kiln_embed_args a = {.w = w,
                         .w_dtype = KILN_DTYPE_F32,
                         .w_row_bytes = D * 4,
                         .n_vocab = V,
                         .dim = D,
                         .ids = ids,
                         .t = 4,
                         .y = y,
                         .y_stride = D,
                         .scale = 2.5f};
    assert_int_equal(kiln_ref_embed(NULL, &a), KILN_OK);
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < D; i++)
            assert_float_equal(y[t * D + i], w[ids[t] * D + i] * 2.5f, 1e-6);
    ids[1] = 50;
    assert_int_equal(kiln_ref_embed(NULL, &a), KILN_ERR_RANGE);
}

static void test_rms_norm(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 4);
    for (int64_t n = 1; n <= 1000; n = n * 3 + 1) {
        const int64_t rows = 3;
        float *x = malloc(sizeof(float) * (size_t)(rows * n)),
              *x0 = malloc(sizeof(float) * (size_t)(rows * n));
        float *res = malloc(sizeof(float) * (size_t)(rows * n)),
              *y = malloc(sizeof(float) * (size_t)(rows * n));
        float *w = malloc(sizeof(float) * (size_t)n);
        fill(&r, x, (size_t)(rows * n), 3);
        fill(&r, res, (size_t)(rows * n), 1);
        fill(&r, w, (size_t)n, 1);
        memcpy(x0, x, sizeof(float) * (size_t)(rows * n));
        kiln_rms_norm_args a = {.x = x,
                                .r = res,
                                .y = y,
                                .w = w,
                                .w_offset = 1.0f,
                                .rows = rows,
                                .n = n,
                                .x_stride = n,
                                .r_stride = n,
                                .y_stride = n,
                                .eps = 1e-6f};
        assert_int_equal(kiln_ref_rms_norm(NULL, &a), KILN_OK);
        for (int64_t s = 0; s < rows; s++) {
            double ss = 0;
            for (int64_t i = 0; i < n; i++) {
                double v = (double)x0[s * n + i] + res[s * n + i];
                ss += v * v;
            }
            double sc = 1.0 / sqrt(ss / (double)n + 1e-6);
            for (int64_t i = 0; i < n; i++) {
                double v = (double)x0[s * n + i] + res[s * n + i];
                assert_float_equal(x[s * n + i], v, 1e-5);
                double want = v * sc * (w[i] + 1.0);
                if (fabs(y[s * n + i] - want) > 1e-5 * (1 + fabs(want)))
                    fail_msg("rms_norm n=%lld: %g vs %g", (long long)n, (double)y[s * n + i], want);
            }
        }
        free(x), free(x0), free(res), free(y), free(w);
    }
}

/* RoPE against the closed form theta_i = pos * base^(-2i/n_rot) / ff_i * freq_scale.
 * The kernel follows ggml's recurrence for the angle in f32, so the tolerance grows
 * with the position: 2e-6 * pos + 1e-5 (absolute, on unit-scale inputs). */
static void test_rope(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 5);
    const int H = 3, hd = 16;
    for (int mode = 0; mode < 2; mode++)
        for (int n_rot = 8; n_rot <= hd; n_rot += 8) {
            int32_t pos[4] = {0, 1, 17, 300};
            float x[4 * 3 * 16], x0[4 * 3 * 16], ff[8];
            fill(&r, x, sizeof(x) / 4, 1);
            for (int i = 0; i < 8; i++) ff[i] = 1.0f + (float)i * 0.5f;
            memcpy(x0, x, sizeof(x));
            kiln_rope_args a = {.x = x,
                                .rows = 4,
                                .x_stride = H * hd,
                                .n_head = H,
                                .head_dim = hd,
                                .n_rot = n_rot,
                                .pos = pos,
                                .mode = (kiln_rope_mode)mode,
                                .base = 10000,
                                .freq_scale = 0.5f,
                                .freq_factors = n_rot == 16 ? ff : NULL,
                                .attn_factor = 1};
            assert_int_equal(kiln_ref_rope(NULL, &a), KILN_OK);
            for (int t = 0; t < 4; t++)
                for (int h = 0; h < H; h++) {
                    const float *src = x0 + t * H * hd + h * hd;
                    const float *got = x + t * H * hd + h * hd;
                    for (int i = 0; i < n_rot / 2; i++) {
                        double f = a.freq_factors ? ff[i] : 1.0;
                        double th = pos[t] * pow(10000.0, -2.0 * i / n_rot) / f * 0.5;
                        int i0 = mode ? i : 2 * i, i1 = mode ? i + n_rot / 2 : 2 * i + 1;
                        double w0 = src[i0] * cos(th) - src[i1] * sin(th);
                        double w1 = src[i0] * sin(th) + src[i1] * cos(th);
                        double tol = 2e-6 * pos[t] + 1e-5;
                        if (fabs(got[i0] - w0) > tol || fabs(got[i1] - w1) > tol)
                            fail_msg("rope mode %d pos %d pair %d: (%g %g) vs (%g %g)", mode,
                                     pos[t], i, (double)got[i0], (double)got[i1], w0, w1);
                    }
                    for (int i = n_rot; i < hd; i++) assert_true(got[i] == src[i]);
                }
        }
}

/* Attention over a paged cache with scattered blocks, several sequences, GQA,
 * windows and softcap, f32 and f16 KV; against dense f64 attention. Tolerance 2e-5
 * (f32 KV) or 2e-3 (f16 KV storage rounding) absolute on unit-scale values. */
static void check_attention(uint32_t kv_dtype, int window, float softcap, kiln_pool *pool) {
    kt_rng r;
    kt_rng_seed(&r, (uint64_t)(window * 3 + kv_dtype) + (softcap > 0));
    const int n_head = 4, n_kv = 2, hd = 8, n_seq = 3, n_blocks = 12;
    const int lens[3] = {1, 20, 37};
    size_t elt = kv_dtype == KILN_DTYPE_F16 ? 2 : 4;
    size_t bb = (size_t)KILN_KV_BLOCK * n_kv * hd * elt;
    uint8_t *kmem = calloc(n_blocks, bb), *vmem = calloc(n_blocks, bb);
    kiln_kv_layer kv = {.k = kmem,
                        .v = vmem,
                        .dtype = kv_dtype,
                        .n_kv_head = n_kv,
                        .head_dim = hd,
                        .block_bytes = bb};
    /* block tables: a permutation of the physical blocks */
    int32_t tables[3][4] = {{11, 0, 0, 0}, {3, 7, 0, 0}, {9, 1, 5, 2}};
    kiln_kv_blocks seqs = {.table = &tables[0][0], .seq_len = lens, .n_seqs = n_seq, .stride = 4};
    int T = lens[0] + lens[1] + lens[2];
    float *q = malloc(sizeof(float) * (size_t)(T * n_head * hd));
    float *k = malloc(sizeof(float) * (size_t)(T * n_kv * hd)),
          *v = malloc(sizeof(float) * (size_t)(T * n_kv * hd));
    float *out = malloc(sizeof(float) * (size_t)(T * n_head * hd));
    int32_t tok_seq[64], tok_pos[64];
    /* interleave sequences' tokens to exercise tok_seq */
    int t = 0, done[3] = {0, 0, 0};
    while (t < T)
        for (int s = 0; s < n_seq; s++)
            if (done[s] < lens[s]) {
                tok_seq[t] = s;
                tok_pos[t] = done[s]++;
                t++;
            }
    fill(&r, q, (size_t)(T * n_head * hd), 1);
    fill(&r, k, (size_t)(T * n_kv * hd), 1);
    fill(&r, v, (size_t)(T * n_kv * hd), 1);
    kiln_kctx c = {.pool = pool};
    kiln_kv_write_args w = {.kv = kv,
                            .k = k,
                            .v = v,
                            .k_stride = n_kv * hd,
                            .v_stride = n_kv * hd,
                            .t = T,
                            .tok_seq = tok_seq,
                            .tok_pos = tok_pos,
                            .blocks = seqs};
    assert_int_equal(kiln_ref_kv_write(&c, &w), KILN_OK);
    kiln_attention_args a = {.kv = kv,
                             .q = q,
                             .q_stride = n_head * hd,
                             .out = out,
                             .out_stride = n_head * hd,
                             .t = T,
                             .n_head = n_head,
                             .tok_seq = tok_seq,
                             .tok_pos = tok_pos,
                             .blocks = seqs,
                             .scale = 0.35f,
                             .softcap = softcap,
                             .window = window};
    assert_int_equal(kiln_ref_attention(&c, &a), KILN_OK);
    double tol = kv_dtype == KILN_DTYPE_F16 ? 2e-3 : 2e-5;
    for (int i = 0; i < T; i++) {
        int s = tok_seq[i], p = tok_pos[i];
        for (int h = 0; h < n_head; h++) {
            int kh = h / (n_head / n_kv);
            double sc[64], mx = -1e300, sum = 0;
            int n = 0;
            for (int j = 0; j < T; j++) {
                if (tok_seq[j] != s || tok_pos[j] > p) continue;
                if (window > 0 && tok_pos[j] <= p - window) continue;
                double d = 0;
                for (int e = 0; e < hd; e++)
                    d += (double)q[i * n_head * hd + h * hd + e] * k[j * n_kv * hd + kh * hd + e];
                d *= 0.35;
                if (softcap > 0) d = softcap * tanh(d / softcap);
                sc[j] = d;
                if (d > mx) mx = d;
                n++;
            }
            assert_true(n > 0);
            for (int j = 0; j < T; j++)
                if (tok_seq[j] == s && tok_pos[j] <= p && !(window > 0 && tok_pos[j] <= p - window))
                    sum += exp(sc[j] - mx);
            for (int e = 0; e < hd; e++) {
                double o = 0;
                for (int j = 0; j < T; j++)
                    if (tok_seq[j] == s && tok_pos[j] <= p &&
                        !(window > 0 && tok_pos[j] <= p - window))
                        o += exp(sc[j] - mx) / sum * v[j * n_kv * hd + kh * hd + e];
                double got = out[i * n_head * hd + h * hd + e];
                if (fabs(got - o) > tol)
                    fail_msg("attention kv=%s window=%d softcap=%g tok %d head %d dim %d: %g vs %g",
                             kiln_dtype_name(kv_dtype), window, (double)softcap, i, h, e, got, o);
            }
        }
    }
    free(kmem), free(vmem), free(q), free(k), free(v), free(out);
}

static void test_attention(void **state) {
    (void)state;
    kiln_pool *pool;
    assert_int_equal(kiln_pool_create(2, &pool, NULL), KILN_OK);
    check_attention(KILN_DTYPE_F32, 0, 0, pool);
    check_attention(KILN_DTYPE_F32, 5, 0, NULL);
    check_attention(KILN_DTYPE_F32, 0, 3.0f, pool);
    check_attention(KILN_DTYPE_F16, 16, 0, pool);
    check_attention(KILN_DTYPE_F16, 0, 0, NULL);
    kiln_pool_free(pool);
}

static void test_glu_add(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 6);
    float g[3 * 40], u[3 * 40], y[3 * 40];
    fill(&r, g, 120, 3);
    fill(&r, u, 120, 1);
    for (int act = 0; act < 3; act++) {
        kiln_glu_args a = {.gate = g,
                           .up = u,
                           .y = y,
                           .t = 3,
                           .n = 40,
                           .gate_stride = 40,
                           .up_stride = 40,
                           .y_stride = 40,
                           .act = (kiln_glu_act)act};
        assert_int_equal(kiln_ref_glu(NULL, &a), KILN_OK);
        for (int i = 0; i < 120; i++) {
            double x = g[i], f;
            if (act == KILN_GLU_SWIGLU)
                f = x / (1 + exp(-x));
            else if (act == KILN_GLU_GEGLU_TANH)
                f = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
            else
                f = 0.5 * x * (1 + erf(x / sqrt(2)));
            double want = f * u[i];
            if (fabs(y[i] - want) > 1e-5 * (1 + fabs(want)))
                fail_msg("glu act %d: %g vs %g", act, (double)y[i], want);
        }
    }
    kiln_add_args a = {
        .a = g, .b = u, .y = y, .t = 3, .n = 40, .a_stride = 40, .b_stride = 40, .y_stride = 40};
    assert_int_equal(kiln_ref_add(NULL, &a), KILN_OK);
    for (int i = 0; i < 120; i++) assert_true(y[i] == g[i] + u[i]);
}

static void test_kernel_table(void **state) {
    (void)state;
    for (int op = 0; op < KILN_KOP_COUNT; op++) assert_non_null(kiln_ref_kernel((kiln_kop)op).any);
    assert_null(kiln_ref_kernel(KILN_KOP_COUNT).any);
    assert_false(kiln_ref_weight_dtype_ok(KILN_DTYPE_IQ2_XXS));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),       cmocka_unit_test(test_embed),
        cmocka_unit_test(test_rms_norm),     cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention),    cmocka_unit_test(test_glu_add),
        cmocka_unit_test(test_kernel_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
