/*
 * test_cuda_prefill.c — the prefill path's preparation kernels (session 11): the coalesced
 * T16 dequantization before cuBLAS (gemv_t16.cu, dequant_t16c_kernel) must give the same
 * bits as the thread-per-32-block kernel it replaces and as the host's dequantization
 * (kiln_dequantize_row, then hi = f16(v), lo = f16((v - hi) 2^11), round to nearest even),
 * in each of its variants (kiln_cuda_t16_dequant_variant 1-4),
 * over ragged n (a padded last tile), k from one superchunk to 14336, q4_0, q8_0, q4_K and
 * q6_K (session 12: the K-quants' coalesced kernel; q4_K vs the host within 2^-21: fma); the
 * output is poisoned first and must be written everywhere. Then the whole cuBLAS matmul on
 * T16 weights with each variant (the dequantization and the split of x, blas.cu) gives the
 * same bits, and so does a matmul group with x split once (kiln_cuda_matmul_cublas_group).
 *
 * Skips (exit 77) when no usable GPU is present.
 */
#include "testutil.h"

#include <stdio.h>

#ifndef KILN_HAVE_CUDA
int main(void) {
    printf("SKIP: kiln was built without CUDA (-DKILN_CUDA=OFF)\n");
    return 77;
}
#else
#include "format/dtype.h"
#include "kernels/cuda_t16.h"
#include "kernels/kernel.h"
#include "kernels/spec.h"

#include "cuda_test.h"

#define SCRATCH_BYTES ((size_t)256 << 20)

typedef struct dq_case {
    int64_t n, k;
} dq_case;

static void test_t16_dequant_bits(void **state) {
    (void)state;
    static const dq_case cs[] = {{1, 128},    {15, 256},   {16, 128},   {17, 384},
                                 {33, 4096},  {300, 1280}, {1000, 512}, {4096, 4096},
                                 {1030, 640}, {17, 14336}, {257, 2816}};
    static const uint32_t dts[] = {KILN_DTYPE_Q4_0, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K,
                                   KILN_DTYPE_Q6_K};
    for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++)
        for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
            const uint32_t dt = dts[di];
            const int64_t n = cs[ci].n, k = cs[ci].k;
            if (k % kiln_cuda_t16_k(dt)) continue; /* the K-quants: 256-column superchunks */
            const kiln_dtype_info *info = kiln_dtype_get(dt);
            const size_t rb = (size_t)(k / info->block_size) * info->block_bytes;
            const size_t tb = (size_t)((n + 15) / 16) * 16 * rb;
            const size_t ob = (size_t)n * (size_t)k * 2 * sizeof(uint16_t);
            uint8_t *w = malloc((size_t)n * rb), *r = malloc(tb);
            uint16_t *h0 = malloc(ob), *h1 = malloc(ob);
            float *row = malloc(sizeof(float) * (size_t)k);
            assert_true(w && r && h0 && h1 && row);
            kt_fill_weights(&rng, dt, w, n, k, rb);
            assert_int_equal(kiln_cuda_t16_repack(dt, w, rb, n, k, r, NULL), KILN_OK);
            void *wd = NULL, *od = NULL;
            CK(cudaMalloc(&wd, tb));
            CK(cudaMalloc(&od, ob));
            CK(cudaMemcpy(wd, r, tb, cudaMemcpyHostToDevice));
            char what[96];
            snprintf(what, sizeof what, "t16 dequant %s n=%lld k=%lld", info->name, (long long)n,
                     (long long)k);
            /* variant 0 (the old kernel) into h0, then 4, 3, 2, 1 into h1, each vs h0 */
            for (int v = 0; v <= 4; v++) {
                const int vv = v ? 5 - v : 0;
                uint16_t *h = v ? h1 : h0;
                CK(cudaMemset(od, 0xFF, ob));
                kiln_cuda_t16_dequant_variant(vv);
                assert_int_equal(kiln_cuda_t16_dequant_f16(NULL, wd, dt, n, k, od), KILN_OK);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(h, od, ob, cudaMemcpyDeviceToHost));
                if (v && memcmp(h0, h1, ob) != 0) {
                    size_t i = 0;
                    while (h0[i] == h1[i]) i++;
                    fail_msg("%s: variant %d differs from the old kernel at half %zu (%s, row "
                             "%lld, column %lld): %04x vs %04x",
                             what, vv, i, i < (size_t)(n * k) ? "hi" : "lo",
                             (long long)((i % (size_t)(n * k)) / (size_t)k),
                             (long long)(i % (size_t)k), h1[i], h0[i]);
                }
            }
            kiln_cuda_t16_dequant_variant(1);
            /* q4_K: the device's d1 q - m1 is one fma (nvcc contracts it, in the old kernel
             * as in the new), the host's two roundings: the values agree to f32 rounding
             * (2^-22 of the block's largest term) and the bits mostly; every other type
             * bitwise */
            const bool fma_k = dt == KILN_DTYPE_Q4_K;
            size_t ndiff = 0;
            for (int64_t rr = 0; rr < n; rr++) {
                assert_int_equal(kiln_dequantize_row(dt, w + (size_t)rr * rb, row, k, NULL),
                                 KILN_OK);
                float amax = 0.0f;
                for (int64_t c = 0; c < k; c++) amax = fmaxf(amax, fabsf(row[c]));
                for (int64_t c = 0; c < k; c++) {
                    const uint16_t hi = kiln_f32_to_fp16(row[c]);
                    const uint16_t lo = kiln_f32_to_fp16((row[c] - kiln_fp16_to_f32(hi)) * 2048.0f);
                    const size_t i = (size_t)(rr * k + c);
                    const uint16_t dh = h1[i], dl = h1[(size_t)(n * k) + i];
                    if (dh == hi && dl == lo) continue;
                    const double vd =
                        (double)kiln_fp16_to_f32(dh) + (double)kiln_fp16_to_f32(dl) / 2048.0;
                    ndiff++;
                    if (!fma_k || !(fabs(vd - (double)row[c]) <= 0x1p-21 * (double)amax))
                        fail_msg("%s: row %lld column %lld: %04x / %04x, host %04x / %04x", what,
                                 (long long)rr, (long long)c, dh, dl, hi, lo);
                }
            }
            if (ndiff)
                printf("  %s: %zu of %lld values not bitwise the host's (fma), within 2^-21\n",
                       what, ndiff, (long long)(n * k));
            cudaFree(wd), cudaFree(od);
            free(w), free(r), free(h0), free(h1), free(row);
        }
}

/* kiln_cuda_matmul_cublas on T16 weights with each variant (the dequantization and the
 * split of x): the same bits (cuBLAS gets the same operands) */
static void test_cublas_t16_variants(void **state) {
    (void)state;
    static const struct {
        int64_t n, k, t;
    } cs[] = {{300, 512, 65}, {4096, 4096, 512}, {1030, 1280, 100}, {33, 384, 600}};
    static const uint32_t dts[] = {KILN_DTYPE_Q4_0, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_K,
                                   KILN_DTYPE_Q6_K};
    for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++)
        for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
            const uint32_t dt = dts[di];
            const int64_t n = cs[ci].n, k = cs[ci].k, t = cs[ci].t, xs = k + 4;
            if (k % kiln_cuda_t16_k(dt)) continue;
            const kiln_dtype_info *info = kiln_dtype_get(dt);
            const size_t rb = (size_t)(k / info->block_size) * info->block_bytes;
            const size_t tb = (size_t)((n + 15) / 16) * 16 * rb;
            uint8_t *w = malloc((size_t)n * rb), *r = malloc(tb);
            float *x = malloc(sizeof(float) * (size_t)(t * xs));
            float *y0 = malloc(sizeof(float) * (size_t)(t * n)),
                  *y1 = malloc(sizeof(float) * (size_t)(t * n));
            assert_true(w && r && x && y0 && y1);
            kt_fill_weights(&rng, dt, w, n, k, rb);
            kt_fill_normal(&rng, x, (size_t)(t * xs), 1.0f);
            assert_int_equal(kiln_cuda_t16_repack(dt, w, rb, n, k, r, NULL), KILN_OK);
            void *wd = NULL, *xd = NULL, *yd = NULL;
            CK(cudaMalloc(&wd, tb));
            CK(cudaMalloc(&xd, sizeof(float) * (size_t)(t * xs)));
            CK(cudaMalloc(&yd, sizeof(float) * (size_t)(t * n)));
            CK(cudaMemcpy(wd, r, tb, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(xd, x, sizeof(float) * (size_t)(t * xs), cudaMemcpyHostToDevice));
            assert_true(kiln_cuda_matmul_cublas_bytes(dt, n, k) <= kc.scratch_size);
            kiln_matmul_args a = {.w = wd,
                                  .w_dtype = dt,
                                  .w_row_bytes = rb,
                                  .w_layout = KILN_WLAYOUT_CUDA_T16,
                                  .n = n,
                                  .k = k,
                                  .x = xd,
                                  .x_stride = xs,
                                  .y = yd,
                                  .y_stride = n,
                                  .t = t};
            for (int v = 3; v >= 0; v -= 3) { /* the default, then the old kernels */
                CK(cudaMemset(yd, 0xFF, sizeof(float) * (size_t)(t * n)));
                kiln_cuda_t16_dequant_variant(v);
                assert_int_equal(kiln_cuda_matmul_cublas(&kc, &a), KILN_OK);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(v ? y1 : y0, yd, sizeof(float) * (size_t)(t * n),
                              cudaMemcpyDeviceToHost));
            }
            kiln_cuda_t16_dequant_variant(3);
            if (memcmp(y0, y1, sizeof(float) * (size_t)(t * n)) != 0)
                fail_msg("cublas t16 %s n=%lld k=%lld t=%lld: the variants' outputs differ",
                         info->name, (long long)n, (long long)k, (long long)t);
            cudaFree(wd), cudaFree(xd), cudaFree(yd);
            free(w), free(r), free(x), free(y0), free(y1);
        }
}

/* kiln_cuda_matmul_cublas_group (x split once for a group's members) gives each member's
 * output of kiln_cuda_matmul_cublas alone, bitwise: q / k / v-like and gate / up-like
 * groups of T16 q4_0 / q8_0 and plain f16 weights, with a bias; a group past one chunk of
 * tokens or of different x is refused (KILN_ERR_UNSUPPORTED). */
static void test_cublas_group(void **state) {
    (void)state;
    static const struct {
        int nm;
        int64_t n[3], k, t;
        uint32_t dt[3];
    } cs[] = {
        {3, {512, 128, 128}, 256, 100, {KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_0, KILN_DTYPE_Q8_0}},
        {2, {1000, 1000}, 384, 512, {KILN_DTYPE_Q8_0, KILN_DTYPE_Q8_0}},
        {3, {256, 64, 300}, 128, 65, {KILN_DTYPE_F16, KILN_DTYPE_Q4_0, KILN_DTYPE_F16}},
    };
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const int nm = cs[ci].nm;
        const int64_t k = cs[ci].k, t = cs[ci].t, xs = k + 4;
        float *x = malloc(sizeof(float) * (size_t)(t * xs));
        assert_non_null(x);
        kt_fill_normal(&rng, x, (size_t)(t * xs), 1.0f);
        void *xd = NULL;
        CK(cudaMalloc(&xd, sizeof(float) * (size_t)(t * xs)));
        CK(cudaMemcpy(xd, x, sizeof(float) * (size_t)(t * xs), cudaMemcpyHostToDevice));
        kiln_matmul_args m[3];
        void *wd[3] = {0}, *yd[3] = {0}, *bd = NULL;
        float *ya[3] = {0}, *yg[3] = {0};
        float *b = malloc(sizeof(float) * 1000);
        assert_non_null(b);
        kt_fill_normal(&rng, b, 1000, 0.5f);
        CK(cudaMalloc(&bd, sizeof(float) * 1000));
        CK(cudaMemcpy(bd, b, sizeof(float) * 1000, cudaMemcpyHostToDevice));
        for (int i = 0; i < nm; i++) {
            const uint32_t dt = cs[ci].dt[i];
            const int64_t n = cs[ci].n[i];
            const kiln_dtype_info *info = kiln_dtype_get(dt);
            const size_t rb = (size_t)(k / info->block_size) * info->block_bytes;
            const bool t16 = dt != KILN_DTYPE_F16;
            const size_t tb = t16 ? (size_t)((n + 15) / 16) * 16 * rb : (size_t)n * rb;
            uint8_t *w = malloc((size_t)n * rb), *r = malloc(tb);
            assert_true(w && r);
            kt_fill_weights(&rng, dt, w, n, k, rb);
            if (t16)
                assert_int_equal(kiln_cuda_t16_repack(dt, w, rb, n, k, r, NULL), KILN_OK);
            else
                memcpy(r, w, tb);
            CK(cudaMalloc(&wd[i], tb));
            CK(cudaMemcpy(wd[i], r, tb, cudaMemcpyHostToDevice));
            CK(cudaMalloc(&yd[i], sizeof(float) * (size_t)(t * n)));
            ya[i] = malloc(sizeof(float) * (size_t)(t * n));
            yg[i] = malloc(sizeof(float) * (size_t)(t * n));
            assert_true(ya[i] && yg[i]);
            m[i] = (kiln_matmul_args){.w = wd[i],
                                      .w_dtype = dt,
                                      .w_row_bytes = rb,
                                      .w_layout = t16 ? KILN_WLAYOUT_CUDA_T16 : 0,
                                      .n = n,
                                      .k = k,
                                      .x = xd,
                                      .x_stride = xs,
                                      .y = yd[i],
                                      .y_stride = n,
                                      .t = t,
                                      .bias = i == 1 ? bd : NULL};
            free(w), free(r);
        }
        for (int i = 0; i < nm; i++) { /* alone */
            CK(cudaMemset(yd[i], 0xFF, sizeof(float) * (size_t)(t * m[i].n)));
            assert_int_equal(kiln_cuda_matmul_cublas(&kc, &m[i]), KILN_OK);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(ya[i], yd[i], sizeof(float) * (size_t)(t * m[i].n),
                          cudaMemcpyDeviceToHost));
            CK(cudaMemset(yd[i], 0xFF, sizeof(float) * (size_t)(t * m[i].n)));
        }
        assert_int_equal(kiln_cuda_matmul_cublas_group(&kc, m, nm), KILN_OK);
        CK(cudaDeviceSynchronize());
        for (int i = 0; i < nm; i++) {
            CK(cudaMemcpy(yg[i], yd[i], sizeof(float) * (size_t)(t * m[i].n),
                          cudaMemcpyDeviceToHost));
            if (memcmp(ya[i], yg[i], sizeof(float) * (size_t)(t * m[i].n)) != 0)
                fail_msg("cublas group case %zu member %d: differs from the member alone", ci, i);
        }
        kiln_matmul_args bad[3];
        memcpy(bad, m, sizeof m);
        bad[nm - 1].x_stride = xs - 4; /* another x */
        assert_int_equal(kiln_cuda_matmul_cublas_group(&kc, bad, nm), KILN_ERR_UNSUPPORTED);
        memcpy(bad, m, sizeof m);
        for (int i = 0; i < nm; i++) bad[i].t = KILN_CUDA_BLAS_CHUNK + 1;
        assert_int_equal(kiln_cuda_matmul_cublas_group(&kc, bad, nm), KILN_ERR_UNSUPPORTED);
        for (int i = 0; i < nm; i++) cudaFree(wd[i]), cudaFree(yd[i]), free(ya[i]), free(yg[i]);
        cudaFree(xd), cudaFree(bd), free(x), free(b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_t16_dequant_bits),
        cmocka_unit_test(test_cublas_t16_variants),
        cmocka_unit_test(test_cublas_group),
    };
    return kt_cuda_main("test_cuda_prefill", tests, sizeof tests / sizeof tests[0],
                        0x707265666c6c31ull, SCRATCH_BYTES);
}

#endif /* KILN_HAVE_CUDA */
