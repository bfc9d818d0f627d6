/*
 * test_cpu_matmul.c — the CPU backend's matmul kernels (AVX-512 and AVX2 flavours,
 * every weight dtype) against a scalar reference: each weight row dequantized to f32,
 * then an f64 dot product with the f32 activations.
 *
 * Weights are random bytes (every bit pattern of the quants is exercised) with the
 * block scales set to random positive halves; activations are random normals.
 * Shapes: odd n, k a multiple of the block size but not of the vector width (k % 64 ==
 * 32), t = 1, 2, 3, 7, 16, 33, 100; strided x and y, with and without bias; 1 and 2
 * threads; guard values around y catch out-of-bounds writes.
 *
 * Tolerances:
 *  - f32 / f16 / bf16 weights (exact widening, f32 FMA accumulation):
 *      |y - ref| <= 1e-5 * sum_i |w_i x_i| + 1e-6
 *    plus, for f16/bf16 prefill (t > 1) on AVX512-BF16 CPUs, where both factors are
 *    rounded to bf16 (uniform error, at most 2^-8 relative each) for vdpbf16ps:
 *      min(2^-7 * sum_i |w_i x_i|, 6 * sqrt(sum_i (w_i x_i)^2 * 2 * 2^-16 / 3))
 *    (worst case, or six standard deviations)
 *  - quantized weights (activations quantized per 32 in two int8 levels, final step
 *    d_b = amax_b / 127 / 256, rounding error uniform in +-d_b / 2, independent):
 *      |y - ref| <= 6 * sqrt(sum_i w_i^2 d_b(i)^2 / 12) + 1e-5 * sum_i |w_i x_i| + 1e-6
 *    i.e. six standard deviations of the error the int8 activations introduce, plus
 *    f32 summation error. A layout bug (wrong nibble, scale or offset) is orders of
 *    magnitude above this.
 */
#include "testutil.h"

#include "base/cpu.h"
#include "base/mem.h"
#include "base/pool.h"
#include "format/dtype.h"
#include "kernels/cpu/cpu_kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- scalar reference dequantization (ggml block layouts) ---- */

static float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return kiln_fp16_to_f32(h);
}

static void scale_min_k4(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void ref_dequant(uint32_t dt, const uint8_t *row, int64_t k, float *y) {
    switch (dt) {
    case KILN_DTYPE_F32:
        memcpy(y, row, (size_t)k * 4);
        return;
    case KILN_DTYPE_F16:
        for (int64_t i = 0; i < k; i++) y[i] = h2f(row + 2 * i);
        return;
    case KILN_DTYPE_BF16:
        for (int64_t i = 0; i < k; i++) {
            uint16_t h;
            memcpy(&h, row + 2 * i, 2);
            y[i] = kiln_bf16_to_f32(h);
        }
        return;
    default:
        break;
    }
    const kiln_dtype_info *info = kiln_dtype_get(dt);
    const int64_t nb = k / info->block_size;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *x = row + b * info->block_bytes;
        float *o = y + b * info->block_size;
        switch (dt) {
        case KILN_DTYPE_Q4_0:
            for (int j = 0; j < 16; j++) {
                o[j] = h2f(x) * ((x[2 + j] & 0xF) - 8);
                o[j + 16] = h2f(x) * ((x[2 + j] >> 4) - 8);
            }
            break;
        case KILN_DTYPE_Q4_1:
            for (int j = 0; j < 16; j++) {
                o[j] = h2f(x) * (x[4 + j] & 0xF) + h2f(x + 2);
                o[j + 16] = h2f(x) * (x[4 + j] >> 4) + h2f(x + 2);
            }
            break;
        case KILN_DTYPE_Q5_0:
        case KILN_DTYPE_Q5_1: {
            const bool one = dt == KILN_DTYPE_Q5_1;
            uint32_t qh;
            memcpy(&qh, x + (one ? 4 : 2), 4);
            const uint8_t *qs = x + (one ? 8 : 6);
            for (int j = 0; j < 16; j++) {
                int q0 = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
                int q1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
                if (one) {
                    o[j] = h2f(x) * q0 + h2f(x + 2);
                    o[j + 16] = h2f(x) * q1 + h2f(x + 2);
                } else {
                    o[j] = h2f(x) * (q0 - 16);
                    o[j + 16] = h2f(x) * (q1 - 16);
                }
            }
            break;
        }
        case KILN_DTYPE_Q8_0:
            for (int j = 0; j < 32; j++) o[j] = h2f(x) * (int8_t)x[2 + j];
            break;
        case KILN_DTYPE_Q4_K:
        case KILN_DTYPE_Q5_K: {
            const bool five = dt == KILN_DTYPE_Q5_K;
            const float d = h2f(x), dmin = h2f(x + 2);
            const uint8_t *sc = x + 4, *qh = x + 16, *ql = x + (five ? 48 : 16);
            for (int j = 0; j < 4; j++) {
                int s0, m0, s1, m1;
                scale_min_k4(2 * j, sc, &s0, &m0);
                scale_min_k4(2 * j + 1, sc, &s1, &m1);
                for (int l = 0; l < 32; l++) {
                    int q0 = ql[32 * j + l] & 0xF, q1 = ql[32 * j + l] >> 4;
                    if (five) {
                        q0 |= ((qh[l] >> (2 * j)) & 1) << 4;
                        q1 |= ((qh[l] >> (2 * j + 1)) & 1) << 4;
                    }
                    o[64 * j + l] = d * s0 * q0 - dmin * m0;
                    o[64 * j + 32 + l] = d * s1 * q1 - dmin * m1;
                }
            }
            break;
        }
        case KILN_DTYPE_Q6_K: {
            const float d = h2f(x + 208);
            const int8_t *sc = (const int8_t *)(x + 192);
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = x + 64 * h, *qh = x + 128 + 32 * h;
                for (int l = 0; l < 32; l++) {
                    int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    int e = 128 * h + l;
                    o[e] = d * sc[e / 16] * q1;
                    o[e + 32] = d * sc[(e + 32) / 16] * q2;
                    o[e + 64] = d * sc[(e + 64) / 16] * q3;
                    o[e + 96] = d * sc[(e + 96) / 16] * q4;
                }
            }
            break;
        }
        default:
            fail_msg("no reference for dtype %u", dt);
        }
    }
}

/* ---- weights (kt_fill_weights: random bytes, sane block scales) ---- */

/* ---- the comparison ---- */

typedef kiln_status (*mm_fn)(const kiln_kctx *, const kiln_matmul_args *);

static int check_one(mm_fn fn, kiln_pool *pool, uint32_t dt, int64_t n, int64_t k, int64_t t,
                     bool bias, uint64_t seed, uint32_t layout) {
    kt_rng r;
    kt_rng_seed(&r, seed);
    size_t row_bytes;
    assert_int_equal(kiln_dtype_row_bytes(dt, k, &row_bytes, NULL), KILN_OK);
    const int64_t xs = k + 5, ys = n + 3, guard = 16;
    uint8_t *w = malloc((size_t)n * row_bytes);
    float *x = malloc(sizeof(float) * (size_t)(t * xs));
    float *ybuf = malloc(sizeof(float) * (size_t)(t * ys + 2 * guard));
    float *b = malloc(sizeof(float) * (size_t)n);
    float *wd = malloc(sizeof(float) * (size_t)k);
    assert_non_null(w), assert_non_null(x), assert_non_null(ybuf), assert_non_null(b);
    assert_non_null(wd);
    kt_fill_weights(&r, dt, w, n, k, row_bytes);
    kt_fill_normal(&r, x, (size_t)(t * xs), 1.0f);
    for (int64_t i = 0; i < n; i++) b[i] = kt_rng_normal(&r);
    for (int64_t i = 0; i < t * ys + 2 * guard; i++) ybuf[i] = -12345.0f;
    float *y = ybuf + guard;

    void *wr = NULL;
    if (layout == KILN_CPU_WLAYOUT_R16) {
        size_t sz;
        assert_int_equal(kiln_cpu_r16_size(dt, n, k, &sz, NULL), KILN_OK);
        wr = kiln_alloc_aligned(sz);
        assert_non_null(wr);
        assert_int_equal(kiln_cpu_r16_repack(dt, w, row_bytes, n, k, wr, NULL), KILN_OK);
    }
    kiln_kctx ctx = {.pool = pool};
    kiln_matmul_args a = {.w = wr ? wr : w,
                          .w_layout = layout,
                          .w_dtype = dt,
                          .w_row_bytes = row_bytes,
                          .n = n,
                          .k = k,
                          .x = x,
                          .x_stride = xs,
                          .y = y,
                          .y_stride = ys,
                          .t = t,
                          .bias = bias ? b : NULL};
    assert_int_equal(fn(&ctx, &a), KILN_OK);

    const bool quant = kiln_dtype_get(dt)->quantized;
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 5; i++) {
        ref_dequant(dt, w + i * row_bytes, k, wd);
        for (int64_t j = 0; j < t && bad < 5; j++) {
            const float *xr = x + j * xs;
            double ref = bias ? b[i] : 0.0, mag = 0, var = 0, sq = 0;
            for (int64_t e = 0; e < k; e += 32) {
                double amax = 0;
                for (int q = 0; q < 32 && e + q < k; q++)
                    amax = fmax(amax, fabs((double)xr[e + q]));
                double step = amax / 127.0 / 256.0; /* two-level int8 (qblocks.h) */
                for (int q = 0; q < 32 && e + q < k; q++) {
                    double p = (double)wd[e + q] * xr[e + q];
                    ref += p;
                    mag += fabs(p);
                    sq += p * p;
                    var += (double)wd[e + q] * wd[e + q] * step * step / 12.0;
                }
            }
            double tol = 1e-5 * mag + 1e-6 + (quant ? 6.0 * sqrt(var) : 0.0);
            if (!quant && dt != KILN_DTYPE_F32 && t > 1 && fn == kiln_cpu_matmul_avx512_bf16 &&
                (kiln_cpu_info()->isa & KILN_ISA_AVX512BF16))
                tol += fmin(0x1p-7 * mag, 6.0 * sqrt(sq * 0x1p-15 / 3.0)); /* bf16: 2^-8 each */
            double got = y[j * ys + i];
            if (!(fabs(got - ref) <= tol)) {
                print_error(
                    "%s%s n=%lld k=%lld t=%lld: y[%lld][%lld] = %.7g, ref %.7g (tol %.3g)\n",
                    kiln_dtype_name(dt), layout ? " (R16)" : "", (long long)n, (long long)k,
                    (long long)t, (long long)j, (long long)i, got, ref, tol);
                bad++;
            }
        }
    }
    /* R16 kernels are batch invariant (docs/CPU.md): each token's row of a t-token call
     * is bitwise the row of a one-token call (decode and prefill run different loops);
     * float weights are at 2-4 tokens (the AVX2 small-step gemv; AVX-512 not claimed) */
    const bool small_f = !quant && t <= 4 && fn == kiln_cpu_matmul_avx2;
    if ((layout == KILN_CPU_WLAYOUT_R16 || small_f) && t > 1) {
        float *y1 = malloc(sizeof(float) * (size_t)n);
        assert_non_null(y1);
        for (int64_t j = 0; j < t && bad < 5; j++) {
            kiln_matmul_args a1 = a;
            a1.x = x + j * xs, a1.y = y1, a1.y_stride = n, a1.t = 1;
            assert_int_equal(fn(&ctx, &a1), KILN_OK);
            if (memcmp(y1, y + j * ys, sizeof(float) * (size_t)n) != 0) {
                print_error("%s (R16) n=%lld k=%lld t=%lld: token %lld differs from its "
                            "one-token call\n",
                            kiln_dtype_name(dt), (long long)n, (long long)k, (long long)t,
                            (long long)j);
                bad++;
            }
        }
        free(y1);
    }
    for (int64_t i = 0; i < guard; i++) {
        if (ybuf[i] != -12345.0f || ybuf[guard + t * ys + i] != -12345.0f) {
            print_error("%s: write outside y\n", kiln_dtype_name(dt));
            bad++;
            break;
        }
    }
    for (int64_t j = 0; j < t; j++)
        for (int64_t i = n; i < ys; i++)
            if (y[j * ys + i] != -12345.0f) {
                print_error("%s: write into y padding (t %lld, col %lld)\n", kiln_dtype_name(dt),
                            (long long)j, (long long)i);
                bad++;
                j = t;
                break;
            }
    free(w), free(x), free(ybuf), free(b), free(wd);
    kiln_free_aligned(wr);
    return bad;
}

static const uint32_t all_dtypes[] = {
    KILN_DTYPE_F32,  KILN_DTYPE_F16,  KILN_DTYPE_BF16, KILN_DTYPE_Q8_0,
    KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_1, KILN_DTYPE_Q5_0, KILN_DTYPE_Q5_1,
    KILN_DTYPE_Q4_K, KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K,
};

static void run_all(mm_fn fn, const char *isa, uint32_t layout) {
    kiln_pool *pool = NULL;
    assert_int_equal(kiln_pool_create(2, &pool, NULL), KILN_OK);
    static const int64_t ts[] = {1, 2, 3, 7, 16, 33, 100};
    static const int64_t ns[] = {1, 7, 37, 100};
    int bad = 0;
    uint64_t seed = 1;
    for (size_t d = 0; d < sizeof all_dtypes / sizeof all_dtypes[0]; d++) {
        uint32_t dt = all_dtypes[d];
        if (layout == KILN_CPU_WLAYOUT_R16 && !kiln_cpu_r16_supports(dt)) continue;
        const uint32_t bs = kiln_dtype_get(dt)->block_size;
        /* k: one block, an odd number of 32-blocks (k % 64 == 32), larger sizes */
        int64_t ks[4];
        if (bs == 256) {
            ks[0] = 256, ks[1] = 512, ks[2] = 768, ks[3] = 1280;
        } else if (bs == 32) {
            ks[0] = 32, ks[1] = 96, ks[2] = 160, ks[3] = 1056;
        } else {
            ks[0] = 1, ks[1] = 17, ks[2] = 100, ks[3] = 1029;
        }
        for (int ki = 0; ki < 4; ki++)
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++) {
                    /* keep it fast: the f64 reference costs n * t * k */
                    if (ks[ki] > 1000 && ts[ti] > 16) continue;
                    if (ns[ni] == 100 && ts[ti] == 100 && ks[ki] > 200) continue;
                    kiln_pool *p = (seed % 3 == 0) ? NULL : pool;
                    bad +=
                        check_one(fn, p, dt, ns[ni], ks[ki], ts[ti], seed % 2 == 0, seed, layout);
                    seed++;
                }
        /* a bigger one that splits over threads in several chunks */
        const int64_t kb = bs == 1 ? 200 : bs == 32 ? 224 : 512;
        bad += check_one(fn, pool, dt, 515, kb, 1, false, seed++, layout);
        bad += check_one(fn, pool, dt, 515, kb, 9, true, seed++, layout);
    }
    kiln_pool_free(pool);
    if (bad) fail_msg("%s: %d mismatches", isa, bad);
}

static void test_avx512(void **state) {
    (void)state;
    if (!kiln_cpu_avx512_ok()) skip(); /* CPU (or KILN_CPU_ISA_MASK) lacks AVX-512 VNNI */
    run_all(kiln_cpu_matmul_avx512, "avx512", 0);
}

static void test_avx512_bf16(void **state) {
    (void)state;
    if (!kiln_cpu_avx512_ok()) skip(); /* CPU (or KILN_CPU_ISA_MASK) lacks AVX-512 VNNI */
    run_all(kiln_cpu_matmul_avx512_bf16, "avx512 bf16", 0);
}

static void test_avx512_r16(void **state) {
    (void)state;
    if (!kiln_cpu_avx512_ok()) skip(); /* CPU (or KILN_CPU_ISA_MASK) lacks AVX-512 VNNI */
    run_all(kiln_cpu_matmul_avx512, "avx512 R16", KILN_CPU_WLAYOUT_R16);
}

/* The R16 layout is refused where it cannot run, and bad shapes are named. */
static void test_r16_errors(void **state) {
    (void)state;
    size_t sz;
    kiln_err err;
    assert_int_equal(kiln_cpu_r16_size(KILN_DTYPE_F16, 16, 64, &sz, &err), KILN_ERR_UNSUPPORTED);
    assert_int_equal(kiln_cpu_r16_size(KILN_DTYPE_Q2_K, 16, 256, &sz, &err), KILN_ERR_UNSUPPORTED);
    assert_int_equal(kiln_cpu_r16_size(KILN_DTYPE_Q4_K, 16, 300, &sz, &err), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "k=300"));
    assert_int_equal(kiln_cpu_r16_size(KILN_DTYPE_Q4_0, 17, 64, &sz, &err), KILN_OK);
    assert_int_equal(sz, 2 * 2 * 16 * 18); /* 2 groups (17 rows padded to 32) x 2 blocks */
    float x[64] = {0}, y[16];
    uint8_t w[64] = {0};
    kiln_matmul_args a = {.w = w,
                          .w_dtype = KILN_DTYPE_Q4_0,
                          .w_layout = KILN_CPU_WLAYOUT_R16,
                          .w_row_bytes = 36,
                          .n = 1,
                          .k = 64,
                          .x = x,
                          .x_stride = 64,
                          .y = y,
                          .y_stride = 1,
                          .t = 1};
    a.w_dtype = KILN_DTYPE_F16; /* no R16 layout for float weights */
    assert_int_equal(kiln_cpu_matmul_avx2(NULL, &a), KILN_ERR_UNSUPPORTED);
    a.w_dtype = KILN_DTYPE_Q4_0;
    a.w_layout = 7;
    assert_int_equal(kiln_cpu_matmul_avx2(NULL, &a), KILN_ERR_UNSUPPORTED);
}

/* The fast repack (SSE2 word transposes, full groups) writes exactly the bytes of the
 * scalar reference, for every R16 type, ragged n, k with a half unit, rows with padding
 * between them, and an output poisoned first. */
static void test_r16_fast_equals_ref(void **state) {
    (void)state;
    static const uint32_t dts[] = {KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_1, KILN_DTYPE_Q5_0,
                                   KILN_DTYPE_Q5_1, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K,
                                   KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K};
    static const int64_t ns[] = {16, 33, 64, 7};
    kt_rng r;
    kt_rng_seed(&r, 0x16a5);
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        const uint32_t dt = dts[d];
        const bool k256 = dt == KILN_DTYPE_Q4_K || dt == KILN_DTYPE_Q5_K || dt == KILN_DTYPE_Q6_K;
        const int64_t ks[] = {k256 ? 256 : 64, k256 ? 768 : 96, k256 ? 2048 : 352};
        for (size_t ni = 0; ni < 4; ni++)
            for (size_t ki = 0; ki < 3; ki++) {
                const int64_t n = ns[ni], k = ks[ki];
                size_t rb, sz;
                assert_int_equal(kiln_dtype_row_bytes(dt, k, &rb, NULL), KILN_OK);
                const size_t stride = rb + 7; /* rows not back to back */
                uint8_t *w = malloc((size_t)n * stride);
                assert_non_null(w);
                for (size_t i = 0; i < (size_t)n * stride; i++) w[i] = (uint8_t)kt_rng_u64(&r);
                assert_int_equal(kiln_cpu_r16_size(dt, n, k, &sz, NULL), KILN_OK);
                uint8_t *a = malloc(sz), *b = malloc(sz);
                assert_non_null(a), assert_non_null(b);
                memset(a, 0xA5, sz), memset(b, 0x5A, sz);
                assert_int_equal(kiln_cpu_r16_repack(dt, w, stride, n, k, a, NULL), KILN_OK);
                assert_int_equal(kiln_cpu_r16_repack_ref(dt, w, stride, n, k, b, NULL), KILN_OK);
                if (memcmp(a, b, sz)) {
                    size_t i = 0;
                    while (a[i] == b[i]) i++;
                    fail_msg("%s n=%lld k=%lld: byte %zu of %zu differs (%02x vs ref %02x)",
                             kiln_dtype_name(dt), (long long)n, (long long)k, i, sz, a[i], b[i]);
                }
                free(w), free(a), free(b);
            }
    }
}

static void test_avx2(void **state) {
    (void)state;
    if (!kiln_cpu_avx2_ok()) skip(); /* CPU lacks AVX2 + FMA + F16C */
    run_all(kiln_cpu_matmul_avx2, "avx2", 0);
}

static void test_avx2_r16(void **state) {
    (void)state;
    if (!kiln_cpu_avx2_ok()) skip(); /* CPU lacks AVX2 + FMA + F16C */
    run_all(kiln_cpu_matmul_avx2, "avx2 R16", KILN_CPU_WLAYOUT_R16);
}

/* The AVX2 R16 prefill's tiles (matmul_r16_avx2.c): pairs of full row groups by 32 x 2
 * tiles over k blocks of 4 units, an odd full group by 16 x 3 tiles over blocks of 8, a
 * partial group by the u8 panel; token tails of both tile shapes. Whole-range calls
 * (no pool: one work item holds every group) and 2 threads (items of 16-row multiples). */
static void test_avx2_r16_tiles(void **state) {
    (void)state;
    if (!kiln_cpu_avx2_ok()) skip();
    kiln_pool *pool = NULL;
    assert_int_equal(kiln_pool_create(2, &pool, NULL), KILN_OK);
    static const uint32_t dts[] = {KILN_DTYPE_Q4_0, KILN_DTYPE_Q5_1, KILN_DTYPE_Q8_0,
                                   KILN_DTYPE_Q4_K, KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K};
    static const int64_t ns[] = {32, 48, 83, 128};
    static const int64_t ts[] = {2, 3, 4, 5, 6, 7, 8};
    int bad = 0;
    uint64_t seed = 7001;
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        /* k: 5 and 17 units (32-block types: the second ends in a half unit) */
        const bool k256 = kiln_dtype_get(dts[d])->block_size == 256;
        const int64_t ks[2] = {k256 ? 512 : 320, k256 ? 1280 : 1056};
        for (int ki = 0; ki < 2; ki++)
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++) {
                    kiln_pool *p = (seed % 2 == 0) ? NULL : pool;
                    bad += check_one(kiln_cpu_matmul_avx2, p, dts[d], ns[ni], ks[ki], ts[ti],
                                     seed % 3 == 0, seed, KILN_CPU_WLAYOUT_R16);
                    seed++;
                }
    }
    kiln_pool_free(pool);
    if (bad) fail_msg("avx2 R16 tiles: %d mismatches", bad);
}

static void test_dtype_table(void **state) {
    (void)state;
    for (size_t d = 0; d < sizeof all_dtypes / sizeof all_dtypes[0]; d++)
        assert_true(kiln_cpu_matmul_dtype_ok(all_dtypes[d]));
    assert_false(kiln_cpu_matmul_dtype_ok(KILN_DTYPE_Q2_K));
    assert_false(kiln_cpu_matmul_dtype_ok(KILN_DTYPE_IQ4_NL));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_table),    cmocka_unit_test(test_avx512),
        cmocka_unit_test(test_avx512_r16),     cmocka_unit_test(test_avx512_bf16),
        cmocka_unit_test(test_r16_errors),     cmocka_unit_test(test_r16_fast_equals_ref),
        cmocka_unit_test(test_avx2),           cmocka_unit_test(test_avx2_r16),
        cmocka_unit_test(test_avx2_r16_tiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
