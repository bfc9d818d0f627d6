/* test_ref_ggml.c — the "ggml numerics" reference kernels (kernels/ref/ref_ggml.c and the
 * ggml variants in ref.c) against straightforward implementations written here:
 *  - the activation quantizers: the rules of ggml's x86 quantizers checked element by
 *    element (|x * 127/amax - q| <= 1/2 with ties to even, fp16 d, q8_1's s, q8_K's sign
 *    convention, f32 d and bsums), plus hand-made blocks with known bytes;
 *  - the block dot products, for every weight type with a vec_dot type, against
 *    sum_j w_j a_j in f64 with w from kiln_dequantize_row (the format layer's code) and a
 *    from the quantized activations (a_j = d_a q_j); q4_1 / q5_1 use ggml's s term for
 *    their min. Tolerance 2e-6 * sum |w_j a_j| (f32 block sums vs f64);
 *  - the matmul against those dots (bitwise), with bias, strides and 1 or 2 threads;
 *  - attention against an f64 softmax over f16-rounded q, k, v with f16-rounded
 *    probabilities (tolerance 1e-5 of sum |p v| plus one f16 step of a probability,
 *    since a probability on an f16 rounding boundary may round either way);
 *  - GeGLU against gelu(f16(x)) rounded to f16, within one f16 step (the f32 and f64
 *    GELU may straddle a rounding boundary, and f32's 1 + tanh cancels for x << 0);
 *    SwiGLU and GeGLU (erf) bitwise as exact;
 *  - the selection: a matmul call site that asks for q8 activations gets the ggml
 *    kernel on both host backends, an f32 one never does;
 *  - an engine (synthetic gemma3, q8_0 weights): numerics "ggml" binds the ggml kernels
 *    at every matmul, attention and glu site and "exact" at none; the logits differ by
 *    less than 10 % RMS (the activation quantization) but do differ; a bad mode fails. */
#include "testutil.h"

#include "base/pool.h"
#include "format/dtype.h"
#include "format/quants.h"
#include "kernels/ref/ref.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/kselect.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float f16r(float v) {
    return kiln_fp16_to_f32(kiln_f32_to_fp16(v));
}

/* ties-to-even rounding written independently of rintf */
static double round_even(double v) {
    double f = floor(v), diff = v - f;
    if (diff > 0.5) return f + 1;
    if (diff < 0.5) return f;
    return fmod(f, 2.0) == 0 ? f : f + 1;
}

/* ---- quantizers ---- */

static void check_q8_block(const float *x, int n, const int8_t *q, double id) {
    for (int j = 0; j < n; j++) {
        double want = round_even((double)(float)(x[j] * (float)id));
        if (want > 127) want = 127;
        if (q[j] != (int)want) fail_msg("q[%d] = %d, want %g (x %g)", j, q[j], want, (double)x[j]);
        assert_true(fabs((double)x[j] * id - q[j]) <= 0.5 + 1e-4);
    }
}

static void test_quantize(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 11);
    enum { K = 1024 };
    float x[K];
    kt_fill_normal(&r, x, K, 2.0f);
    x[5] = 0; /* a zero element and a zero block */
    for (int j = 64; j < 96; j++) x[j] = 0;
    kiln_block_q8_0 b0[K / 32];
    kiln_block_q8_1 b1[K / 32];
    kiln_block_q8_K bk[K / 256];
    kiln_ggml_quantize_q8_0(x, b0, K);
    kiln_ggml_quantize_q8_1(x, b1, K);
    kiln_ggml_quantize_q8_K(x, bk, K);
    for (int b = 0; b < K / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * b + j]));
        assert_int_equal(b0[b].d, kiln_f32_to_fp16(amax / 127.0f));
        check_q8_block(x + 32 * b, 32, b0[b].qs, amax ? 127.0f / amax : 0);
        assert_memory_equal(b0[b].qs, b1[b].qs, 32);
        assert_int_equal(b1[b].d, b0[b].d);
        int s = 0;
        for (int j = 0; j < 32; j++) s += b1[b].qs[j];
        assert_int_equal(b1[b].s, kiln_f32_to_fp16(amax / 127.0f * (float)s));
    }
    for (int b = 0; b < K / 256; b++) {
        const float *xb = x + 256 * b;
        int imax = 0;
        for (int j = 1; j < 256; j++)
            if (fabsf(xb[j]) > fabsf(xb[imax])) imax = j;
        const float iscale = -127.0f / xb[imax];
        assert_true(bk[b].d == 1.0f / iscale);
        assert_int_equal(bk[b].qs[imax], -127);
        check_q8_block(xb, 256, bk[b].qs, iscale);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += bk[b].qs[16 * g + j];
            assert_int_equal(bk[b].bsums[g], s);
        }
    }
    /* known block: amax 127 makes the multiplier exactly 1, so x = k + 1/2 shows the
     * tie rule (to even, where roundf would go away from zero) */
    float t[32] = {0};
    t[0] = 127, t[1] = 2.5f, t[2] = 3.5f, t[3] = -2.5f, t[4] = -0.5f, t[5] = 0.5f, t[6] = -127;
    kiln_block_q8_0 tb;
    kiln_ggml_quantize_q8_0(t, &tb, 32);
    const int8_t want[7] = {127, 2, 4, -2, 0, 0, -127};
    assert_memory_equal(tb.qs, want, 7);
    assert_int_equal(tb.d, kiln_f32_to_fp16(1.0f));
    /* q8_K: the element of largest magnitude maps to -127 whatever its sign; an equal
     * magnitude of the other sign is clamped to +127 */
    float tk[256] = {0};
    tk[3] = -4.0f, tk[9] = 4.0f, tk[10] = 1.0f;
    kiln_block_q8_K kb;
    kiln_ggml_quantize_q8_K(tk, &kb, 256);
    assert_int_equal(kb.qs[3], -127);
    assert_int_equal(kb.qs[9], 127);
    assert_int_equal(kb.qs[10], 32); /* 1 * 127/4 = 31.75 */
    assert_true(kb.d == 1.0f / (-127.0f / -4.0f));
    /* errors */
    assert_int_equal(kiln_ggml_quantize_row(KILN_DTYPE_Q8_0, x, b0, 48), KILN_ERR_INVALID_ARG);
    assert_int_equal(kiln_ggml_quantize_row(KILN_DTYPE_Q8_K, x, bk, 512 + 32),
                     KILN_ERR_INVALID_ARG);
    assert_int_equal(kiln_ggml_quantize_row(KILN_DTYPE_F16, x, b0, 32), KILN_ERR_UNSUPPORTED);
}

/* ---- dot products and matmul ---- */

static const uint32_t qtypes[] = {
    KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_1, KILN_DTYPE_Q5_0, KILN_DTYPE_Q5_1, KILN_DTYPE_Q8_0,
    KILN_DTYPE_Q2_K, KILN_DTYPE_Q3_K, KILN_DTYPE_Q4_K, KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K};

/* sum_j w_j a_j in f64, from dequantized weights and activations; *mag = sum |w_j a_j| */
static double ref_dot(uint32_t wt, const uint8_t *wrow, const void *act, int64_t k, double *mag) {
    float *w = malloc(sizeof(float) * (size_t)k);
    assert_int_equal(kiln_dequantize_row(wt, wrow, w, k, NULL), KILN_OK);
    const uint32_t at = kiln_ggml_vec_dot_type(wt);
    double s = 0, m = 0;
    for (int64_t j = 0; j < k; j++) {
        double a;
        if (at == KILN_DTYPE_Q8_0) {
            const kiln_block_q8_0 *b = (const kiln_block_q8_0 *)act + j / 32;
            a = (double)kiln_fp16_to_f32(b->d) * b->qs[j % 32];
        } else if (at == KILN_DTYPE_Q8_1) {
            const kiln_block_q8_1 *b = (const kiln_block_q8_1 *)act + j / 32;
            a = (double)kiln_fp16_to_f32(b->d) * b->qs[j % 32];
        } else {
            const kiln_block_q8_K *b = (const kiln_block_q8_K *)act + j / 256;
            a = (double)b->d * b->qs[j % 256];
        }
        s += (double)w[j] * a;
        m += fabs((double)w[j] * a);
    }
    if (at == KILN_DTYPE_Q8_1) {
        /* ggml's min term is m_w * s_a with s_a = fp16(d_a * sum q_a): replace the
         * m_w * d_a * sum(q_a) part of the sum above by it */
        const size_t bb = wt == KILN_DTYPE_Q4_1 ? sizeof(kiln_block_q4_1) : sizeof(kiln_block_q5_1);
        for (int64_t b = 0; b < k / 32; b++) {
            uint16_t dm[2];
            memcpy(dm, wrow + b * bb, sizeof dm); /* d, m lead both block types */
            const kiln_block_q8_1 *ab = (const kiln_block_q8_1 *)act + b;
            double mw = kiln_fp16_to_f32(dm[1]), sq = 0;
            for (int j = 0; j < 32; j++) sq += ab->qs[j];
            s += mw * ((double)kiln_fp16_to_f32(ab->s) - (double)kiln_fp16_to_f32(ab->d) * sq);
        }
    }
    free(w);
    *mag = m;
    return s;
}

static void check_dtype(uint32_t wt, int64_t n, int64_t k, int64_t t, kiln_pool *pool) {
    kt_rng r;
    kt_rng_seed(&r, (uint64_t)(wt * 1000 + n * 7 + k + t));
    size_t rb, ab;
    const uint32_t at = kiln_ggml_vec_dot_type(wt);
    assert_int_equal(kiln_dtype_row_bytes(wt, k, &rb, NULL), KILN_OK);
    assert_int_equal(kiln_dtype_row_bytes(at, k, &ab, NULL), KILN_OK);
    float *wf = malloc(sizeof(float) * (size_t)k);
    const int64_t xs = k + 5, ys = n + 3; /* strided rows */
    float *x = malloc(sizeof(float) * (size_t)(t * xs)), *bias = malloc(sizeof(float) * (size_t)n);
    float *y = malloc(sizeof(float) * (size_t)(t * ys));
    uint8_t *w = malloc(rb * (size_t)n), *xq = malloc(ab * (size_t)t);
    for (int64_t i = 0; i < n; i++) {
        kt_fill_normal(&r, wf, (size_t)k, 0.5f);
        wf[i % k] += 2.0f; /* an outlier in some block */
        assert_int_equal(kiln_quantize_row(wt, wf, w + i * rb, k, NULL), KILN_OK);
    }
    kt_fill_normal(&r, x, (size_t)(t * xs), 1.0f);
    kt_fill_normal(&r, bias, (size_t)n, 0.1f);
    for (int64_t s = 0; s < t; s++)
        assert_int_equal(kiln_ggml_quantize_row(at, x + s * xs, xq + s * ab, k), KILN_OK);
    for (int64_t s = 0; s < t; s++)
        for (int64_t i = 0; i < n; i++) {
            float got;
            double mag;
            assert_int_equal(kiln_ggml_vec_dot(wt, w + i * rb, xq + s * ab, k, &got), KILN_OK);
            double want = ref_dot(wt, w + i * rb, xq + s * ab, k, &mag);
            if (fabs(got - want) > 2e-6 * mag + 1e-30)
                fail_msg("%s k=%lld row %lld: %.9g vs %.9g (mag %g)", kiln_dtype_name(wt),
                         (long long)k, (long long)i, (double)got, want, mag);
        }
    for (int64_t i = 0; i < t * ys; i++) y[i] = 12345.0f; /* guard values between rows */
    kiln_matmul_args a = {.w = w,
                          .w_dtype = wt,
                          .w_row_bytes = rb,
                          .n = n,
                          .k = k,
                          .x = x,
                          .x_stride = xs,
                          .y = y,
                          .y_stride = ys,
                          .t = t,
                          .bias = bias};
    kiln_kctx c = {.pool = pool};
    assert_int_equal(kiln_ref_matmul_ggml(&c, &a), KILN_OK);
    for (int64_t s = 0; s < t; s++) {
        for (int64_t i = 0; i < n; i++) {
            float d;
            kiln_ggml_vec_dot(wt, w + i * rb, xq + s * ab, k, &d);
            if (y[s * ys + i] != d + bias[i])
                fail_msg("%s matmul [%lld,%lld]: %g vs %g", kiln_dtype_name(wt), (long long)s,
                         (long long)i, (double)y[s * ys + i], (double)(d + bias[i]));
        }
        for (int64_t i = n; i < ys; i++) assert_true(y[s * ys + i] == 12345.0f);
    }
    free(wf), free(x), free(bias), free(y), free(w), free(xq);
}

static void test_dot_matmul(void **state) {
    (void)state;
    kiln_pool *pool;
    assert_int_equal(kiln_pool_create(2, &pool, NULL), KILN_OK);
    for (size_t i = 0; i < sizeof qtypes / sizeof qtypes[0]; i++) {
        const bool kq = kiln_ggml_vec_dot_type(qtypes[i]) == KILN_DTYPE_Q8_K;
        check_dtype(qtypes[i], 1, kq ? 256 : 32, 1, NULL);
        check_dtype(qtypes[i], 37, kq ? 768 : 96, 3, pool);
        check_dtype(qtypes[i], 20, 2048, 7, pool);
    }
    kiln_pool_free(pool);
}

static void test_matmul_errors(void **state) {
    (void)state;
    float x[64] = {0}, y[4];
    uint8_t w[256] = {0};
    kiln_matmul_args a = {.w = w,
                          .w_dtype = KILN_DTYPE_F32,
                          .w_row_bytes = 256,
                          .n = 1,
                          .k = 64,
                          .x = x,
                          .x_stride = 64,
                          .y = y,
                          .y_stride = 1,
                          .t = 1};
    assert_int_equal(kiln_ref_matmul_ggml(NULL, &a), KILN_ERR_UNSUPPORTED); /* float weights */
    a.w_dtype = KILN_DTYPE_Q4_K; /* k = 64 is no multiple of 256 */
    assert_int_equal(kiln_ref_matmul_ggml(NULL, &a), KILN_ERR_INVALID_ARG);
    a.w_dtype = KILN_DTYPE_Q8_0;
    a.w_layout = KILN_WLAYOUT_CPU_R16;
    assert_int_equal(kiln_ref_matmul_ggml(NULL, &a), KILN_ERR_UNSUPPORTED);
    assert_int_equal(kiln_ggml_vec_dot_type(KILN_DTYPE_F16), KILN_DTYPE_F32);
    assert_int_equal(kiln_ggml_vec_dot_type(KILN_DTYPE_Q5_1), KILN_DTYPE_Q8_1);
    assert_int_equal(kiln_ggml_vec_dot_type(KILN_DTYPE_Q6_K), KILN_DTYPE_Q8_K);
}

/* ---- attention and glu ---- */

static void test_attention_ggml(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 21);
    enum { HD = 32, NKV = 2, NH = 4, T = 40, NB = 3 };
    for (int kvdt = 0; kvdt < 2; kvdt++) {
        const uint32_t dt = kvdt ? KILN_DTYPE_F16 : KILN_DTYPE_F32;
        const size_t elt = kvdt ? 2 : 4, bb = 16 * NKV * HD * elt;
        uint8_t *kb = malloc(bb * NB), *vb = malloc(bb * NB);
        float kf[T][NKV][HD], vf[T][NKV][HD], q[T * NH * HD], out[T * NH * HD];
        kt_fill_normal(&r, &kf[0][0][0], T * NKV * HD, 1.0f);
        kt_fill_normal(&r, &vf[0][0][0], T * NKV * HD, 1.0f);
        kt_fill_normal(&r, q, T * NH * HD, 1.0f);
        for (int p = 0; p < T; p++)
            for (int h = 0; h < NKV; h++)
                for (int d = 0; d < HD; d++) {
                    size_t off = (size_t)(p / 16) * bb + ((size_t)(p % 16) * NKV + h) * HD * elt +
                                 (size_t)d * elt;
                    if (kvdt) {
                        uint16_t kh = kiln_f32_to_fp16(kf[p][h][d]),
                                 vh = kiln_f32_to_fp16(vf[p][h][d]);
                        memcpy(kb + off, &kh, 2);
                        memcpy(vb + off, &vh, 2);
                    } else {
                        memcpy(kb + off, &kf[p][h][d], 4);
                        memcpy(vb + off, &vf[p][h][d], 4);
                    }
                }
        const int32_t table[NB] = {0, 1, 2};
        const int32_t seq_len = T;
        kiln_kv_blocks seq = {.table = table, .seq_len = &seq_len, .n_seqs = 1, .stride = NB};
        int32_t tok_seq[T], tok_pos[T];
        for (int i = 0; i < T; i++) tok_seq[i] = 0, tok_pos[i] = i;
        const int window = kvdt ? 9 : 0;
        kiln_attention_args a = {.kv = {kb, vb, dt, NKV, HD, bb},
                                 .q = q,
                                 .q_stride = NH * HD,
                                 .out = out,
                                 .out_stride = NH * HD,
                                 .t = T,
                                 .n_head = NH,
                                 .tok_seq = tok_seq,
                                 .tok_pos = tok_pos,
                                 .blocks = seq,
                                 .scale = 0.125f,
                                 .window = window};
        assert_int_equal(kiln_ref_attention_ggml(NULL, &a), KILN_OK);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const int kvh = h / (NH / NKV),
                          p0 = window && t - window + 1 > 0 ? t - window + 1 : 0;
                double sc[T], mx = -INFINITY, sum = 0;
                for (int p = p0; p <= t; p++) {
                    double s = 0;
                    for (int d = 0; d < HD; d++)
                        s += (double)f16r(q[(t * NH + h) * HD + d]) * f16r(kf[p][kvh][d]);
                    sc[p] = s * 0.125;
                    mx = fmax(mx, sc[p]);
                }
                for (int p = p0; p <= t; p++) sum += exp(sc[p] - mx);
                for (int d = 0; d < HD; d++) {
                    double o = 0, mag = 0, step = 0;
                    for (int p = p0; p <= t; p++) {
                        double pr = exp(sc[p] - mx) / sum, v = f16r(vf[p][kvh][d]);
                        o += (double)f16r((float)pr) * v;
                        mag += fabs(pr * v);
                        step += pr * fabs(v) * (1.0 / 1024); /* one f16 step of pr */
                    }
                    double got = out[(t * NH + h) * HD + d];
                    if (fabs(got - o) > 1e-5 * mag + step)
                        fail_msg("attention t %d h %d d %d: %g vs %g", t, h, d, got, o);
                }
            }
        free(kb), free(vb);
    }
}

static void test_glu_ggml(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 31);
    enum { N = 4000 };
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N),
          *y = malloc(sizeof(float) * N), *y0 = malloc(sizeof(float) * N);
    kt_fill_normal(&r, g, N, 4.0f);
    kt_fill_normal(&r, u, N, 1.0f);
    g[0] = -10.0f, g[1] = 10.0f, g[2] = 12.5f, g[3] = -11.0f, g[4] = 9.99f;
    for (int act = 0; act < 3; act++) {
        kiln_glu_args a = {.gate = g,
                           .up = u,
                           .y = y,
                           .t = 2,
                           .n = N / 2,
                           .gate_stride = N / 2,
                           .up_stride = N / 2,
                           .y_stride = N / 2,
                           .act = (kiln_glu_act)act};
        assert_int_equal(kiln_ref_glu_ggml(NULL, &a), KILN_OK);
        a.y = y0;
        assert_int_equal(kiln_ref_glu(NULL, &a), KILN_OK);
        for (int i = 0; i < N; i++) {
            if (act != KILN_GLU_GEGLU_TANH) {
                assert_true(y[i] == y0[i]);
                continue;
            }
            double x = g[i], want;
            if (x <= -10)
                want = 0;
            else if (x >= 10)
                want = x * u[i];
            else {
                double xh = f16r((float)x);
                double ge = 0.5 * xh * (1 + tanh(sqrt(2 / M_PI) * (xh + 0.044715 * xh * xh * xh)));
                want = (double)f16r((float)ge) * u[i];
                /* one f16 step of the GELU value (a boundary straddled; 2^-24 below the
                 * normal range), plus the f32 cancellation in 1 + tanh for x << 0 */
                double step = (fabs(ge) / 1024 + 0x1p-24 + fabs(xh) * 0x1p-24) * fabs(u[i]);
                if (fabs(y[i] - want) > step) fail_msg("geglu x %g: %g vs %g", x, y[i], want);
                /* and the GELU factor is an f16 value */
                if (u[i] != 0)
                    assert_true(fabsf(y[i] / u[i] - f16r(y[i] / u[i])) <=
                                1e-6f * fabsf(y[i] / u[i]) + 1e-30f);
                continue;
            }
            assert_true(fabs(y[i] - want) <= 1e-6 * fabs(want));
        }
    }
    free(g), free(u), free(y), free(y0);
}

/* ---- selection ---- */

static void test_selection(void **state) {
    (void)state;
    const char *backends[] = {"ref", "cpu"};
    for (int b = 0; b < 2; b++) {
        const kiln_backend *bk = kiln_backend_find(backends[b]);
        assert_non_null(bk);
        kiln_device dev, *be = &dev;
        assert_int_equal(kiln_device_open(bk, 0, &dev, NULL), KILN_OK);
        kiln_callsite cs = {.op = KILN_KOP_MATMUL,
                            .name = "test.mm",
                            .w_dtype = KILN_DTYPE_Q4_K,
                            .n = 64,
                            .k = 256};
        kiln_kernel_fn fn;
        kiln_err err;
        assert_int_equal(kiln_select_callsite(be, &cs, &fn, NULL, NULL, &err), KILN_OK);
        assert_true(fn.matmul != kiln_ref_matmul_ggml); /* exact: never the ggml kernel */
        cs.act_dtype = kiln_ggml_vec_dot_type(cs.w_dtype);
        assert_int_equal(kiln_select_callsite(be, &cs, &fn, NULL, NULL, &err), KILN_OK);
        assert_true(fn.matmul == kiln_ref_matmul_ggml);
        kiln_callsite at = {.op = KILN_KOP_ATTENTION,
                            .name = "test.attn",
                            .kv_dtype = KILN_DTYPE_F16,
                            .head_dim = 64,
                            .n_head = 4,
                            .n_kv_head = 2,
                            .n = 64,
                            .features = KILN_CS_PAGED | KILN_CS_CAUSAL | KILN_CS_GQA,
                            .act_dtype = KILN_DTYPE_F16};
        assert_int_equal(kiln_select_callsite(be, &at, &fn, NULL, NULL, &err), KILN_OK);
        assert_true(fn.attention == kiln_ref_attention_ggml);
        at.act_dtype = KILN_DTYPE_F32;
        assert_int_equal(kiln_select_callsite(be, &at, &fn, NULL, NULL, &err), KILN_OK);
        assert_true(fn.attention != kiln_ref_attention_ggml);
        kiln_callsite gl = {
            .op = KILN_KOP_GLU, .name = "test.glu", .n = 64, .act_dtype = KILN_DTYPE_F16};
        assert_int_equal(kiln_select_callsite(be, &gl, &fn, NULL, NULL, &err), KILN_OK);
        assert_true(fn.glu == kiln_ref_glu_ggml);
        kiln_device_close(&dev);
    }
}

/* ---- an engine in ggml numerics: every matmul, attention and glu call site is bound
 * to the ggml kernel (and none in exact numerics), and the logits differ from exact
 * numerics by the activation quantization only (a synthetic gemma3 with q8_0 weights) */

static void test_engine_binding(void **state) {
    (void)state;
    kiln_model_config c;
    kiln_model_config_defaults(&c);
    strcpy(c.arch, "gemma3");
    c.n_vocab = 97, c.n_embd = 64, c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2;
    c.head_dim = 16, c.n_ff = 64, c.n_rot = 16, c.attn_scale = 0.25f, c.n_ctx_train = 256;
    c.norm_eps = 1e-6f, c.rope_mode = 1, c.qk_norm = c.post_norms = true, c.act = 1;
    c.embed_scale = 8.0f, c.tied_embeddings = true;
    for (int l = 0; l < c.n_layer; l++) c.layer_rope_base[l] = 10000, c.layer_rope_scale[l] = 1;
    kiln_plan p;
    kiln_plan_init(&p);
    assert_int_equal(kiln_decoder_compile(&c, KILN_MODE_PREFILL, &p, NULL), KILN_OK);
    kiln_tensor *ts = calloc((size_t)p.n_weights, sizeof *ts);
    void **bufs = calloc((size_t)p.n_weights, sizeof *bufs);
    kt_rng r;
    kt_rng_seed(&r, 41);
    for (int i = 0; i < p.n_weights; i++) {
        const kiln_weight_ref *w = &p.weights[i];
        size_t ne = 1;
        for (int d = 0; d < w->rank; d++) ne *= (size_t)w->shape[d];
        float *f = malloc(ne * sizeof(float));
        kt_fill_normal(&r, f, ne, w->wclass == KILN_WCLASS_VECTOR ? 0.2f : 0.3f);
        if (w->wclass == KILN_WCLASS_VECTOR && strstr(w->name, "norm"))
            for (size_t j = 0; j < ne; j++) f[j] += 1.0f;
        ts[i].name = strdup(w->name);
        ts[i].rank = w->rank;
        for (int d = 0; d < 4; d++) ts[i].shape[d] = d < w->rank ? w->shape[d] : 1;
        if (w->wclass == KILN_WCLASS_VECTOR) {
            bufs[i] = f;
            ts[i].dtype = KILN_DTYPE_F32;
            ts[i].nbytes = ne * 4;
        } else { /* matrices (and the tied embedding) in q8_0 */
            size_t rb;
            const int64_t k = w->shape[0], rows = (int64_t)(ne / (size_t)k);
            assert_int_equal(kiln_dtype_row_bytes(KILN_DTYPE_Q8_0, k, &rb, NULL), KILN_OK);
            uint8_t *q = malloc(rb * (size_t)rows);
            for (int64_t row = 0; row < rows; row++)
                assert_int_equal(
                    kiln_quantize_row(KILN_DTYPE_Q8_0, f + row * k, q + row * rb, k, NULL),
                    KILN_OK);
            free(f);
            bufs[i] = q;
            ts[i].dtype = KILN_DTYPE_Q8_0;
            ts[i].nbytes = rb * (size_t)rows;
        }
        ts[i].data = bufs[i];
    }
    const int n_weights = p.n_weights;
    kiln_plan_free(&p);
    kiln_model *m;
    assert_int_equal(kiln_model_from_tensors(&c, ts, n_weights, &m, NULL), KILN_OK);
    float logits[2][5 * 97];
    for (int mode = 0; mode < 2; mode++) {
        kiln_engine_opts o;
        kiln_engine_opts_default(&o);
        o.numerics = mode ? "ggml" : "exact";
        o.n_ctx = 256, o.max_step_tokens = 8, o.max_seqs = 2;
        kiln_engine *e;
        kiln_err err;
        if (kiln_engine_create(m, &o, &e, &err)) fail_msg("engine: %s", err.msg);
        int n_mm = 0;
        for (int32_t i = 0; i < e->bp.plan.n_insns; i++)
            for (int s = 0; s < e->bp.bi[i].n_sites; s++) {
                const kiln_site *site = &e->bp.bi[i].site[s];
                for (int b = 0; b < KILN_BUCKETS; b++) {
                    if (site->desc.op == KILN_KOP_MATMUL) {
                        n_mm++;
                        assert_true((site->fn[b].matmul == kiln_ref_matmul_ggml) == (mode == 1));
                    } else if (site->desc.op == KILN_KOP_ATTENTION) {
                        assert_true((site->fn[b].attention == kiln_ref_attention_ggml) ==
                                    (mode == 1));
                    } else if (site->desc.op == KILN_KOP_GLU) {
                        assert_true((site->fn[b].glu == kiln_ref_glu_ggml) == (mode == 1));
                    }
                }
            }
        assert_true(n_mm > 0);
        int32_t seq;
        assert_int_equal(kiln_seq_create(e, &seq, NULL), KILN_OK);
        kiln_batch_entry bt[5];
        for (int i = 0; i < 5; i++) bt[i] = (kiln_batch_entry){seq, (i * 31 + 7) % 97, i, 1};
        if (kiln_engine_step(e, bt, 5, logits[mode], &err)) fail_msg("step: %s", err.msg);
        kiln_engine_free(e);
    }
    double d2 = 0, s2 = 0;
    for (int i = 0; i < 5 * 97; i++) {
        d2 += (double)(logits[1][i] - logits[0][i]) * (logits[1][i] - logits[0][i]);
        s2 += (double)logits[0][i] * logits[0][i];
    }
    /* the 8-bit activations move the logits, by about their quantization noise */
    assert_true(d2 > 0);
    assert_true(sqrt(d2 / s2) < 0.1);
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.numerics = "fast";
    kiln_engine *e;
    assert_int_equal(kiln_engine_create(m, &o, &e, NULL), KILN_ERR_INVALID_ARG);
    kiln_model_free(m);
    for (int i = 0; i < n_weights; i++) {
        free(bufs[i]);
        free((void *)ts[i].name);
    }
    free(bufs);
    free(ts);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize),       cmocka_unit_test(test_dot_matmul),
        cmocka_unit_test(test_matmul_errors),  cmocka_unit_test(test_attention_ggml),
        cmocka_unit_test(test_glu_ggml),       cmocka_unit_test(test_selection),
        cmocka_unit_test(test_engine_binding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
