/*
 * test_cuda_kernels.c — every CUDA kernel (src/kernels/cuda/) against the ref kernel of
 * its op on random data over many shapes (the paged-KV kernels — kv_write, rope_kv,
 * attention, flash attention — are in test_cuda_attention.c): ragged n, k; t = 1..8 and prefill
 * sizes; every weight dtype; GQA ratios 1-8; head dims 32-256; windows; softcap; f16 and f32 KV;
 * sequences of several lengths in one flat token list with shuffled block tables. Device outputs
 * are poisoned (0xFF bytes = NaN) before every call, so an unwritten element fails the comparison.
 *
 * Metric: ||out - ref|| / ||ref|| (L2 over the whole output). Tolerances by path:
 *  - f32 arithmetic on the same inputs (gemv all dtypes, f32/bf16 weights through sgemm,
 *    norms, rope, glu, add, embed, attention): 2e-5 — only summation order and 1-ulp
 *    differences of expf/tanhf/sinf/cosf between the device and glibc differ;
 *  - the cuBLAS path for f16/quantized weights (split f16: each operand as hi + lo f16
 *    halves, 22 significant bits, three f16 products accumulated in f32): 2e-5 as well;
 *  - the KV cache after kv_write / rope_kv: f32 cache 2e-6, f16 cache 1e-3 (one f16
 *    rounding of the same f32 value, a 1-ulp rope difference can flip it).
 * Argmax: the ids equal the ref's except where the two candidates' ref logits are within
 * 1e-5 relative of each other (a near tie that summation order may break either way).
 *
 * Skips (exit 77, CTest SKIP_RETURN_CODE) with the reason when no usable GPU is present.
 */
#include "testutil.h"

#include <stdio.h>

#ifndef KILN_HAVE_CUDA
int main(void) {
    printf("SKIP: kiln was built without CUDA (-DKILN_CUDA=OFF)\n");
    return 77;
}
#else
#include "base/mem.h"
#include "format/dtype.h"
#include "format/quants.h"
#include "kernels/cuda_t16.h"
#include "kernels/spec.h"
#include "kernels/ref/ref.h"
#include "kernels/ref/ref_fused.h"

#include "cuda_test.h"

/* ---- matmul ---- */

static const uint32_t all_dt[] = {KILN_DTYPE_F32,  KILN_DTYPE_F16,  KILN_DTYPE_BF16,
                                  KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_1,
                                  KILN_DTYPE_Q5_0, KILN_DTYPE_Q5_1, KILN_DTYPE_Q4_K,
                                  KILN_DTYPE_Q5_K, KILN_DTYPE_Q6_K};
#define N_DT ((int)(sizeof all_dt / sizeof all_dt[0]))

typedef struct mm_case {
    int64_t n, k, t;
} mm_case;

static float x_sigma = 1.0f; /* activation scale (the tensor-core gemv scales rows by 2^e) */
static bool gemv_inv;        /* the batch-invariant gemv entry */
static bool w_t16;           /* weights in the T16 layout (kernels/cuda_t16.h) */

/* n rows of k columns (row stride rb) on the device for the T16 entry
 * (kiln_cuda_matmul_t16): the T16 repack (the loader's transform) for the T16 dtypes, the
 * plain rows for f16 (gemv_f16r_kernel reads them as stored); *layout says which. */
static void *t16_dev(uint32_t dt, const uint8_t *w, size_t rb, int64_t n, int64_t k,
                     uint32_t *layout) {
    if (dt == KILN_DTYPE_F16) {
        *layout = KILN_WLAYOUT_PLAIN;
        return dup_dev(w, (size_t)n * rb);
    }
    const size_t tb = (size_t)((n + 15) / 16) * 16 * rb;
    uint8_t *r = malloc(tb);
    assert_non_null(r);
    assert_int_equal(kiln_cuda_t16_repack(dt, w, rb, n, k, r, NULL), KILN_OK);
    void *d = dup_dev(r, tb);
    free(r);
    *layout = KILN_WLAYOUT_CUDA_T16;
    return d;
}

static void one_matmul(uint32_t dt, int64_t n, int64_t k, int64_t t, bool bias, bool blas) {
    const kiln_dtype_info *info = kiln_dtype_get(dt);
    const size_t rb = (size_t)(k / info->block_size) * info->block_bytes;
    uint8_t *w = malloc((size_t)n * rb);
    const int64_t xs = k + 4, ys = n + 3; /* strided rows (x stride keeps 16-byte alignment) */
    float *x = malloc(sizeof(float) * (size_t)(t * xs));
    float *y = malloc(sizeof(float) * (size_t)(t * ys)),
          *yr = malloc(sizeof(float) * (size_t)(t * ys));
    float *b = malloc(sizeof(float) * (size_t)n);
    assert_non_null(w);
    kt_fill_weights(&rng, dt, w, n, k, rb);
    kt_fill_normal(&rng, x, (size_t)(t * xs), x_sigma);
    kt_fill_normal(&rng, b, (size_t)n, 0.5f);
    kiln_matmul_args a = {.w = w,
                          .w_dtype = dt,
                          .w_row_bytes = rb,
                          .n = n,
                          .k = k,
                          .x = x,
                          .x_stride = xs,
                          .y = yr,
                          .y_stride = ys,
                          .t = t,
                          .bias = bias ? b : NULL};
    assert_int_equal(kiln_ref_matmul(NULL, &a), KILN_OK);
    if (w_t16) { /* the loader's transform (f16: none), then the T16 kernels */
        a.w = t16_dev(dt, w, rb, n, k, &a.w_layout);
    } else {
        a.w = dup_dev(w, (size_t)n * rb);
    }
    a.x = dup_dev(x, sizeof(float) * (size_t)(t * xs));
    a.y = poisoned(sizeof(float) * (size_t)(t * ys));
    a.bias = bias ? dup_dev(b, sizeof(float) * (size_t)n) : NULL;
    kiln_status st = blas       ? kiln_cuda_matmul_cublas(&kc, &a)
                     : w_t16    ? kiln_cuda_matmul_t16(&kc, &a)
                     : gemv_inv ? kiln_cuda_matmul_gemv_inv(&kc, &a)
                                : kiln_cuda_matmul_gemv(&kc, &a);
    const char *path = blas                            ? (w_t16 ? "cublas_t16" : "cublas")
                       : w_t16 && dt == KILN_DTYPE_F16 ? "gemv_f16"
                       : w_t16                         ? "gemv_t16"
                                                       : "gemv";
    if (st)
        fail_msg("%s %s n=%lld k=%lld t=%lld: status %d", path, info->name, (long long)n,
                 (long long)k, (long long)t, (int)st);
    get(y, a.y, sizeof(float) * (size_t)(t * ys));
    double tol = 2e-5; /* every path at f32 accuracy (the cuBLAS one: split f16, blas.cu) */
    char what[128];
    snprintf(what, sizeof what, "%s %s n=%lld k=%lld t=%lld%s", path, info->name, (long long)n,
             (long long)k, (long long)t, bias ? " bias" : "");
    CHECK_ERR(what, relerr(y, yr, t, n, ys, ys), tol);
    cudaFree((void *)a.w), cudaFree((void *)a.x), cudaFree(a.y), cudaFree((void *)a.bias);
    free(w), free(x), free(y), free(yr), free(b);
}

static void test_matmul_gemv(void **state) {
    (void)state;
    static const mm_case cs[] = {{1, 256, 1},   {37, 256, 1},  {300, 512, 2},  {129, 768, 3},
                                 {64, 1280, 4}, {33, 256, 5},  {257, 512, 7},  {1000, 1024, 8},
                                 {71, 512, 11}, {96, 2816, 1}, {4096, 256, 1}, {5, 4096, 8}};
    for (int kind = 0; kind < 5; kind++) {
        kiln_cuda_gemv_variant(kind);
        for (int d = 0; d < N_DT; d++)
            for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
                one_matmul(all_dt[d], cs[i].n, cs[i].k, cs[i].t, i % 2 == 1, false);
    }
    /* the tensor-core gemv (kind 3) scales each 32-block of a token row by a power of two
     * before its f16 split: activations far above the f16 range (|x| ~ 1e5) and far below
     * it (1e-6) */
    static const float sig[] = {3e4f, 1e-6f};
    static const uint32_t mma_dt[] = {KILN_DTYPE_F16, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_0};
    /* the batch-invariant entry: the tensor-core gemv at every t (the default one runs the
     * fma gemv for single f16 tokens), staged (3) and unstaged (4) */
    gemv_inv = true;
    for (int kind = 3; kind < 5; kind++) {
        kiln_cuda_gemv_variant(kind);
        for (int d = 0; d < N_DT; d++)
            for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
                one_matmul(all_dt[d], cs[i].n, cs[i].k, cs[i].t, i % 2 == 1, false);
    }
    kiln_cuda_gemv_variant(3);
    for (size_t si = 0; si < 2; si++) {
        x_sigma = sig[si];
        for (size_t d = 0; d < 3; d++)
            for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
                one_matmul(mma_dt[d], cs[i].n, cs[i].k, cs[i].t, i % 2 == 1, false);
    }
    x_sigma = 1.0f;
    gemv_inv = false;
    /* kind 5 (4 warps per CTA at every shape), on a data stream of its own so that the
     * draws of the other tests stay what they were */
    const kt_rng saved = rng;
    kiln_cuda_gemv_variant(5);
    for (int inv = 0; inv < 2; inv++) {
        gemv_inv = inv == 1;
        for (int d = 0; d < N_DT; d++)
            for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
                one_matmul(all_dt[d], cs[i].n, cs[i].k, cs[i].t, i % 2 == 1, false);
    }
    rng = saved;
    gemv_inv = false;
    kiln_cuda_gemv_variant(3);
}

static void test_matmul_cublas(void **state) {
    (void)state;
    static const mm_case cs[] = {{37, 256, 9}, {300, 512, 64}, {129, 768, 100}, {64, 256, 600}};
    for (int d = 0; d < N_DT; d++)
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
            one_matmul(all_dt[d], cs[i].n, cs[i].k, cs[i].t, i % 2 == 0, true);
}

/* Batch invariance of the T16 gemv: 8 tokens in one pass vs each alone, bitwise. */
static void t16_batch_inv(uint32_t dt, int64_t n, int64_t k) {
    const int64_t t = 8;
    const kiln_dtype_info *info = kiln_dtype_get(dt);
    const size_t rb = (size_t)(k / info->block_size) * info->block_bytes;
    uint8_t *w = malloc((size_t)n * rb);
    float *x = malloc(sizeof(float) * (size_t)(t * k)),
          *y8 = malloc(sizeof(float) * (size_t)(t * n)), *y1 = malloc(sizeof(float) * (size_t)n);
    assert_true(w && x && y8 && y1);
    kt_fill_weights(&rng, dt, w, n, k, rb);
    kt_fill_normal(&rng, x, (size_t)(t * k), 1.0f);
    uint32_t lay = 0;
    void *wd = t16_dev(dt, w, rb, n, k, &lay);
    kiln_matmul_args a = {.w = wd,
                          .w_dtype = dt,
                          .w_layout = lay,
                          .w_row_bytes = rb,
                          .n = n,
                          .k = k,
                          .x = dup_dev(x, sizeof(float) * (size_t)(t * k)),
                          .x_stride = k,
                          .y = poisoned(sizeof(float) * (size_t)(t * n)),
                          .y_stride = n,
                          .t = t};
    assert_int_equal(kiln_cuda_matmul_t16(&kc, &a), KILN_OK);
    get(y8, a.y, sizeof(float) * (size_t)(t * n));
    const float *x0 = a.x;
    float *yd = a.y;
    for (int64_t j = 0; j < t; j++) {
        a.x = x0 + j * k;
        a.y = yd;
        a.t = 1;
        CK(cudaMemset(yd, 0xFF, sizeof(float) * (size_t)n));
        assert_int_equal(kiln_cuda_matmul_t16(&kc, &a), KILN_OK);
        get(y1, yd, sizeof(float) * (size_t)n);
        if (memcmp(y1, y8 + j * n, sizeof(float) * (size_t)n) != 0)
            fail_msg("gemv_t16 %s: token %lld alone differs from its row in a pass of 8",
                     info->name, (long long)j);
    }
    cudaFree((void *)a.w), cudaFree((void *)x0), cudaFree(yd);
    free(w), free(x), free(y8), free(y1);
}

/* The T16 sweep of both T16 tests for two dtypes: every case; every warp split and
 * loads-in-flight setting on every third; activations of sigma 3e4 and 1e-6 on every
 * second; the cuBLAS path on T16 weights at t 9-600. */
static void t16_sweep(const uint32_t *dts, size_t nd, const mm_case *cs, size_t ncs) {
    w_t16 = true;
    for (size_t d = 0; d < nd; d++)
        for (size_t i = 0; i < ncs; i++)
            one_matmul(dts[d], cs[i].n, cs[i].k, cs[i].t, i % 2 == 1, false);
    static const int sws[] = {4, 8, 16, 32}, us[] = {1, 2, 4};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++) {
            kiln_cuda_t16_config(sws[a], us[b]);
            for (size_t d = 0; d < nd; d++)
                for (size_t i = 0; i < ncs; i += 3)
                    one_matmul(dts[d], cs[i].n, cs[i].k, cs[i].t, i % 2 == 0, false);
        }
    kiln_cuda_t16_config(0, 0);
    static const float sig[] = {3e4f, 1e-6f};
    for (size_t si = 0; si < 2; si++) {
        x_sigma = sig[si];
        for (size_t d = 0; d < nd; d++)
            for (size_t i = 0; i < ncs; i += 2)
                one_matmul(dts[d], cs[i].n, cs[i].k, cs[i].t, true, false);
    }
    x_sigma = 1.0f;
    static const mm_case bc[] = {{37, 256, 9}, {300, 512, 64}, {129, 768, 100}, {64, 256, 600}};
    for (size_t d = 0; d < nd; d++)
        for (size_t i = 0; i < sizeof bc / sizeof bc[0]; i++)
            one_matmul(dts[d], bc[i].n, bc[i].k, bc[i].t, i % 2 == 0, true);
    w_t16 = false;
}

/* The T16 gemv (gemv_t16.cu) and the cuBLAS path on T16 weights: q4_0 / q8_0, k % 128 == 0,
 * ragged n (a padded last tile), every warp split and loads-in-flight setting, activations
 * far outside the f16 range, and batch invariance (a token's row alone = bitwise its row
 * in a pass of 8). */
static void test_matmul_t16(void **state) {
    (void)state;
    static const mm_case cs[] = {{1, 256, 1},    {37, 256, 1},    {300, 512, 2},  {129, 768, 3},
                                 {64, 1280, 4},  {33, 128, 5},    {257, 512, 7},  {1000, 1024, 8},
                                 {71, 512, 11},  {96, 2816, 1},   {4096, 256, 1}, {5, 4096, 8},
                                 {17, 14336, 1}, {1030, 4096, 2}, {20, 384, 64},  {250, 1664, 9}};
    static const uint32_t dts[] = {KILN_DTYPE_Q4_0, KILN_DTYPE_Q8_0};
    const kt_rng saved = rng; /* a data stream of its own: the other tests' draws stay */
    t16_sweep(dts, 2, cs, sizeof cs / sizeof cs[0]);
    for (size_t d = 0; d < 2; d++) t16_batch_inv(dts[d], 333, 1536);
    rng = saved;
}

/* The T16 gemv and the cuBLAS path on T16 weights for the K-quants (q4_K, q6_K: 256-column
 * superchunks, cuda_t16.h): ragged n, t 1..64 (passes of 8), every warp split and
 * loads-in-flight setting (2 at most: 4 runs as 2), activations far outside the f16 range,
 * the cuBLAS path's dequantization, batch invariance. */
static void test_matmul_t16_k(void **state) {
    (void)state;
    static const mm_case cs[] = {{1, 256, 1},     {37, 256, 1},    {300, 512, 2},   {129, 768, 3},
                                 {64, 1280, 4},   {33, 256, 5},    {257, 512, 7},   {1000, 1024, 8},
                                 {71, 512, 11},   {96, 2816, 1},   {4096, 256, 1},  {5, 4096, 8},
                                 {17, 14336, 1},  {1030, 4096, 2}, {20, 3840, 64},  {250, 1792, 9},
                                 {513, 4096, 33}, {16, 256, 16},   {15, 11008, 24}, {2, 768, 57}};
    static const uint32_t dts[] = {KILN_DTYPE_Q4_K, KILN_DTYPE_Q6_K};
    const kt_rng saved = rng; /* a data stream of its own: the other tests' draws stay */
    t16_sweep(dts, 2, cs, sizeof cs / sizeof cs[0]);
    for (size_t d = 0; d < 2; d++) {
        t16_batch_inv(dts[d], 333, 1536);
        t16_batch_inv(dts[d], 1030, 4096);
    }
    rng = saved;
}

/* The f16 gemv on plain rows (gemv_f16r_kernel, cuda.gemv_f16.matmul, session 11) through
 * the T16 entry: ragged n (a partial last tile reads row n - 1, never stored), k 128-14336,
 * t 1..64 (passes of 8; one token: the split fused), every warp split and loads-in-flight
 * setting, activations far outside the f16 range, batch invariance (a token alone bitwise
 * its row in a pass of 8); f16 rows it cannot read (k % 128 != 0) go to the batch-invariant
 * tensor-core gemv. */
static void test_matmul_f16_rows(void **state) {
    (void)state;
    static const mm_case cs[] = {{1, 128, 1},     {37, 256, 1},    {300, 512, 2},  {129, 768, 3},
                                 {64, 1280, 4},   {33, 128, 5},    {257, 512, 7},  {1000, 1024, 8},
                                 {71, 512, 11},   {96, 2816, 1},   {4096, 256, 1}, {5, 4096, 8},
                                 {17, 14336, 1},  {1030, 4096, 2}, {20, 384, 64},  {250, 1664, 9},
                                 {513, 4096, 33}, {15, 640, 1},    {7, 320, 3},    {2, 96, 1}};
    static const uint32_t dts[] = {KILN_DTYPE_F16};
    const kt_rng saved = rng; /* a data stream of its own: the other tests' draws stay */
    t16_sweep(dts, 1, cs, sizeof cs / sizeof cs[0]);
    t16_batch_inv(KILN_DTYPE_F16, 333, 1536);
    t16_batch_inv(KILN_DTYPE_F16, 1030, 4096);
    rng = saved;
}

/* A matmul group's members in one launch per dtype (kiln_cuda_matmul_group -> the T16
 * group entry; the split of x fused into the gemv at one token per pass) vs each member
 * alone with the decode fusion off (a prep launch and a gemv per member): bitwise equal,
 * for t 1..17 (passes of 8 and a last pass of one), ragged n, mixed dtypes (q4_K_M's q4_K
 * q / k and q6_K v), more members than one launch takes, the GLU after gate / up. */
typedef struct grp_case {
    int nm;
    uint32_t dt[4];
    int64_t n[4], k;
    bool glu;
} grp_case;

/* gemm: every member through the T16 GEMM's entry (kiln_cuda_matmul_t16_gemm: one split
 * per chunk, a GEMM per member from 12 tokens; the gemv's group launch below) */
static void t16_group_sweep(bool gemm) {
    static const grp_case cs[] = {
        {3, {KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_0}, {300, 37, 37}, 512, false},
        {3, {KILN_DTYPE_Q4_K, KILN_DTYPE_Q4_K, KILN_DTYPE_Q6_K}, {257, 64, 33}, 768, false},
        {2, {KILN_DTYPE_Q8_0, KILN_DTYPE_Q8_0}, {1000, 1000}, 1024, true},
        {4,
         {KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_0},
         {16, 5, 129, 71},
         384,
         false},
        {3, {KILN_DTYPE_Q6_K, KILN_DTYPE_Q4_K, KILN_DTYPE_Q6_K}, {17, 1030, 2}, 4096, false},
        {2, {KILN_DTYPE_Q4_K, KILN_DTYPE_Q4_K}, {96, 96}, 2816, true},
        /* f16 rows (session 11): alone, with the GLU, beside q4_0 (two splits of x) */
        {3, {KILN_DTYPE_F16, KILN_DTYPE_F16, KILN_DTYPE_F16}, {300, 37, 37}, 512, false},
        {2, {KILN_DTYPE_F16, KILN_DTYPE_F16}, {1000, 1000}, 1024, true},
        {3, {KILN_DTYPE_F16, KILN_DTYPE_Q4_0, KILN_DTYPE_F16}, {129, 71, 16}, 384, false},
        /* session 18: the GLU after q4_0 and q6_K members, ragged n, the 8B gate / up
         * shape (a fused GLU was measured against this check, docs/CUDA.md) */
        {2, {KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_0}, {300, 300}, 512, true},
        {2, {KILN_DTYPE_Q6_K, KILN_DTYPE_Q6_K}, {33, 33}, 768, true},
        {2, {KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_0}, {14336, 14336}, 4096, true},
    };
    static const int64_t ts[] = {1, 3, 8, 9, 17}, tg[] = {1, 12, 17, 40, 100};
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++)
        for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++) {
            const grp_case *c = &cs[ci];
            const int64_t t = gemm ? tg[ti] : ts[ti], k = c->k, xs = k + 4;
            float *x = malloc(sizeof(float) * (size_t)(t * xs));
            kt_fill_normal(&rng, x, (size_t)(t * xs), ti % 2 ? 3e4f : 1.0f);
            float *xd = dup_dev(x, sizeof(float) * (size_t)(t * xs));
            kiln_matmul_group_args g = {.n = c->nm};
            float *yref[4], *ygrp[4];
            size_t ybytes[4];
            for (int i = 0; i < c->nm; i++) {
                const kiln_dtype_info *info = kiln_dtype_get(c->dt[i]);
                const int64_t n = c->n[i], ys = n + 3;
                const size_t rb = (size_t)(k / info->block_size) * info->block_bytes;
                uint8_t *w = malloc((size_t)n * rb);
                assert_true(w);
                kt_fill_weights(&rng, c->dt[i], w, n, k, rb);
                uint32_t lay = 0;
                void *wd = t16_dev(c->dt[i], w, rb, n, k, &lay);
                ybytes[i] = sizeof(float) * (size_t)(t * ys);
                g.m[i] = (kiln_matmul_args){.w = wd,
                                            .w_dtype = c->dt[i],
                                            .w_layout = lay,
                                            .w_row_bytes = rb,
                                            .n = n,
                                            .k = k,
                                            .x = xd,
                                            .x_stride = xs,
                                            .y = poisoned(ybytes[i]),
                                            .y_stride = ys,
                                            .t = t};
                g.fn[i] = gemm ? kiln_cuda_matmul_t16_gemm : kiln_cuda_matmul_t16;
                free(w);
            }
            float *glu_d = NULL, *glu_ref = NULL;
            if (c->glu) { /* every activation in turn */
                g.glu_fn = kiln_cuda_glu, g.act = (kiln_glu_act)((ci + ti) % 3);
                g.glu_y_stride = c->n[0];
                glu_d = poisoned(sizeof(float) * (size_t)(t * c->n[0]));
                g.glu_y = glu_d;
            }
            /* each member alone, fusion off: the reference (and the GLU on its outputs) */
            kiln_cuda_decode_fusion(0);
            for (int i = 0; i < c->nm; i++) {
                assert_int_equal(kiln_cuda_matmul_t16(&kc, &g.m[i]), KILN_OK);
                yref[i] = malloc(ybytes[i]);
                get(yref[i], g.m[i].y, ybytes[i]);
            }
            if (c->glu) {
                const kiln_glu_args ga = {.gate = g.m[0].y,
                                          .up = g.m[1].y,
                                          .y = glu_d,
                                          .t = t,
                                          .n = c->n[0],
                                          .gate_stride = g.m[0].y_stride,
                                          .up_stride = g.m[1].y_stride,
                                          .y_stride = c->n[0],
                                          .act = g.act};
                assert_int_equal(kiln_cuda_glu(&kc, &ga), KILN_OK);
                glu_ref = malloc(sizeof(float) * (size_t)(t * c->n[0]));
                get(glu_ref, glu_d, sizeof(float) * (size_t)(t * c->n[0]));
                CK(cudaMemset(glu_d, 0xFF, sizeof(float) * (size_t)(t * c->n[0])));
            }
            for (int i = 0; i < c->nm; i++) CK(cudaMemset(g.m[i].y, 0xFF, ybytes[i]));
            kiln_cuda_decode_fusion(1);
            assert_int_equal(kiln_cuda_matmul_group(&kc, &g), KILN_OK);
            for (int i = 0; i < c->nm; i++) {
                ygrp[i] = malloc(ybytes[i]);
                get(ygrp[i], g.m[i].y, ybytes[i]);
                const int64_t ys = c->n[i] + 3;
                for (int64_t r = 0; r < t; r++)
                    if (memcmp(ygrp[i] + r * ys, yref[i] + r * ys,
                               sizeof(float) * (size_t)c->n[i]) != 0)
                        fail_msg("t16 %sgroup case %zu t=%lld member %d (%s n=%lld) row %lld "
                                 "differs from the member alone",
                                 gemm ? "GEMM " : "", ci, (long long)t, i,
                                 kiln_dtype_get(c->dt[i])->name, (long long)c->n[i], (long long)r);
            }
            if (c->glu) { /* the group's GLU: bitwise kiln_cuda_glu on the members alone */
                float *gy = malloc(sizeof(float) * (size_t)(t * c->n[0]));
                get(gy, glu_d, sizeof(float) * (size_t)(t * c->n[0]));
                for (int64_t i = 0; i < t * c->n[0]; i++)
                    if (isnan(gy[i]) || memcmp(&gy[i], &glu_ref[i], sizeof(float)) != 0)
                        fail_msg("t16 %sgroup case %zu t=%lld glu (act %d): element %lld %s "
                                 "(%g, GLU of the members alone %g)",
                                 gemm ? "GEMM " : "", ci, (long long)t, (int)g.act, (long long)i,
                                 isnan(gy[i]) ? "unwritten" : "differs", (double)gy[i],
                                 (double)glu_ref[i]);
                free(gy), free(glu_ref);
                cudaFree(glu_d);
            }
            for (int i = 0; i < c->nm; i++) {
                cudaFree((void *)g.m[i].w), cudaFree(g.m[i].y);
                free(yref[i]), free(ygrp[i]);
            }
            cudaFree(xd);
            free(x);
        }
}

static void test_matmul_t16_group(void **state) {
    (void)state;
    const kt_rng saved = rng;
    t16_group_sweep(false);
    rng = saved;
}

/* The grouped tiled gemv (matmul.cu, session 11): a group whose members all run
 * cuda.gemv.matmul's tiled fma gemv at one token (q4_1, q5_0, q5_1, plain K-quants, f32,
 * bf16) in one launch per dtype, bitwise equal to each member alone; ragged n, bias, mixed
 * dtypes, 4 members (two launches of one dtype), the GLU; t = 2 and a member on the
 * tensor-core gemv (q8_0) keep the members' own launches (the same check). */
static void test_matmul_gemv_group(void **state) {
    (void)state;
    static const grp_case cs[] = {
        {3, {KILN_DTYPE_Q5_0, KILN_DTYPE_Q5_0, KILN_DTYPE_Q5_0}, {640, 1024, 256}, 640, false},
        {2, {KILN_DTYPE_Q4_1, KILN_DTYPE_Q4_1}, {1536, 1536}, 576, true},
        {3, {KILN_DTYPE_Q4_1, KILN_DTYPE_Q6_K, KILN_DTYPE_F32}, {37, 300, 5}, 512, false},
        {4,
         {KILN_DTYPE_Q5_1, KILN_DTYPE_Q5_1, KILN_DTYPE_Q5_1, KILN_DTYPE_Q5_1},
         {16, 7, 129, 71},
         256,
         false},
        {3, {KILN_DTYPE_BF16, KILN_DTYPE_Q4_K, KILN_DTYPE_Q5_K}, {33, 1000, 17}, 768, false},
        {3, {KILN_DTYPE_Q4_1, KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_1}, {64, 64, 9}, 576, false},
    };
    const kt_rng saved = rng;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++)
        for (int64_t t = 1; t <= 2; t++) {
            const grp_case *c = &cs[ci];
            const int64_t k = c->k, xs = k + 4;
            float *x = malloc(sizeof(float) * (size_t)(t * xs));
            kt_fill_normal(&rng, x, (size_t)(t * xs), 1.0f);
            float *xd = dup_dev(x, sizeof(float) * (size_t)(t * xs));
            kiln_matmul_group_args g = {.n = c->nm};
            float *yref[4];
            size_t ybytes[4];
            for (int i = 0; i < c->nm; i++) {
                const kiln_dtype_info *info = kiln_dtype_get(c->dt[i]);
                const int64_t n = c->n[i], ys = n + 3;
                const size_t rb = (size_t)(k / info->block_size) * info->block_bytes;
                uint8_t *w = malloc((size_t)n * rb);
                float *b = malloc(sizeof(float) * (size_t)n);
                assert_true(w && b);
                kt_fill_weights(&rng, c->dt[i], w, n, k, rb);
                kt_fill_normal(&rng, b, (size_t)n, 0.5f);
                ybytes[i] = sizeof(float) * (size_t)(t * ys);
                g.m[i] = (kiln_matmul_args){.w = dup_dev(w, (size_t)n * rb),
                                            .w_dtype = c->dt[i],
                                            .w_row_bytes = rb,
                                            .n = n,
                                            .k = k,
                                            .x = xd,
                                            .x_stride = xs,
                                            .y = poisoned(ybytes[i]),
                                            .y_stride = ys,
                                            .t = t,
                                            .bias = i == 1 ? dup_dev(b, sizeof(float) * (size_t)n)
                                                           : NULL};
                g.fn[i] = kiln_cuda_matmul_gemv;
                free(w), free(b);
            }
            float *glu_d = NULL;
            if (c->glu) {
                g.glu_fn = kiln_cuda_glu, g.act = KILN_GLU_SWIGLU;
                g.glu_y_stride = c->n[0];
                glu_d = poisoned(sizeof(float) * (size_t)(t * c->n[0]));
                g.glu_y = glu_d;
            }
            for (int i = 0; i < c->nm; i++) { /* each member alone: the reference */
                assert_int_equal(kiln_cuda_matmul_gemv(&kc, &g.m[i]), KILN_OK);
                yref[i] = malloc(ybytes[i]);
                get(yref[i], g.m[i].y, ybytes[i]);
                CK(cudaMemset(g.m[i].y, 0xFF, ybytes[i]));
            }
            assert_int_equal(kiln_cuda_matmul_group(&kc, &g), KILN_OK);
            for (int i = 0; i < c->nm; i++) {
                float *yg = malloc(ybytes[i]);
                get(yg, g.m[i].y, ybytes[i]);
                const int64_t ys = c->n[i] + 3;
                for (int64_t r = 0; r < t; r++)
                    if (memcmp(yg + r * ys, yref[i] + r * ys, sizeof(float) * (size_t)c->n[i]))
                        fail_msg("gemv group case %zu t=%lld member %d (%s n=%lld) row %lld "
                                 "differs from the member alone",
                                 ci, (long long)t, i, kiln_dtype_get(c->dt[i])->name,
                                 (long long)c->n[i], (long long)r);
                free(yg);
            }
            if (c->glu) {
                float *gy = malloc(sizeof(float) * (size_t)(t * c->n[0]));
                get(gy, glu_d, sizeof(float) * (size_t)(t * c->n[0]));
                for (int64_t i = 0; i < t * c->n[0]; i++)
                    if (isnan(gy[i]))
                        fail_msg("gemv group glu: element %lld unwritten", (long long)i);
                free(gy);
                cudaFree(glu_d);
            }
            for (int i = 0; i < c->nm; i++) {
                cudaFree((void *)g.m[i].w), cudaFree(g.m[i].y), cudaFree((void *)g.m[i].bias);
                free(yref[i]);
            }
            cudaFree(xd);
            free(x);
        }
    rng = saved;
}

/* One T16 GEMM case (gemm_t16.cu): vs ref (2e-5, as every f32-arithmetic path), output
 * poisoned, then bitwise vs the T16 gemv in passes of 8 (the GEMM's numerics are the
 * gemv's, so the two together are batch invariant). scratch: the scratch the GEMM gets
 * (0: the test's 64 MiB; less: several chunks of tokens). */
static void g16_case(uint32_t dt, int64_t n, int64_t k, int64_t t, bool bias, size_t scratch) {
    const kiln_dtype_info *info = kiln_dtype_get(dt);
    const size_t rb = (size_t)(k / info->block_size) * info->block_bytes;
    const size_t tb = (size_t)((n + 15) / 16) * 16 * rb;
    const int64_t xs = k + 4, ys = n + 3;
    const size_t yb = sizeof(float) * (size_t)(t * ys);
    uint8_t *w = malloc((size_t)n * rb), *r = malloc(tb);
    float *x = malloc(sizeof(float) * (size_t)(t * xs)), *y = malloc(yb), *yr = malloc(yb),
          *yg = malloc(yb), *b = malloc(sizeof(float) * (size_t)n);
    assert_true(w && r && x && y && yr && yg && b);
    kt_fill_weights(&rng, dt, w, n, k, rb);
    kt_fill_normal(&rng, x, (size_t)(t * xs), x_sigma);
    kt_fill_normal(&rng, b, (size_t)n, 0.5f);
    kiln_matmul_args a = {.w = w,
                          .w_dtype = dt,
                          .w_row_bytes = rb,
                          .n = n,
                          .k = k,
                          .x = x,
                          .x_stride = xs,
                          .y = yr,
                          .y_stride = ys,
                          .t = t,
                          .bias = bias ? b : NULL};
    assert_int_equal(kiln_ref_matmul(NULL, &a), KILN_OK);
    assert_int_equal(kiln_cuda_t16_repack(dt, w, rb, n, k, r, NULL), KILN_OK);
    a.w = dup_dev(r, tb);
    a.w_layout = KILN_WLAYOUT_CUDA_T16;
    a.x = dup_dev(x, sizeof(float) * (size_t)(t * xs));
    a.y = poisoned(yb);
    a.bias = bias ? dup_dev(b, sizeof(float) * (size_t)n) : NULL;
    kiln_kctx kg = kc;
    if (scratch) kg.scratch_size = scratch;
    kiln_cuda_gemm_t16_set(1);
    kiln_status st = kiln_cuda_matmul_t16_gemm(&kg, &a);
    char what[160];
    snprintf(what, sizeof what, "gemm_t16 %s n=%lld k=%lld t=%lld%s scratch %zu", info->name,
             (long long)n, (long long)k, (long long)t, bias ? " bias" : "", scratch);
    if (st) fail_msg("%s: status %d", what, (int)st);
    get(y, a.y, yb);
    CHECK_ERR(what, relerr(y, yr, t, n, ys, ys), 2e-5);
    CK(cudaMemset(a.y, 0xFF, yb));
    assert_int_equal(kiln_cuda_matmul_t16(&kc, &a), KILN_OK);
    get(yg, a.y, yb);
    for (int64_t j = 0; j < t; j++)
        if (memcmp(y + j * ys, yg + j * ys, sizeof(float) * (size_t)n) != 0)
            fail_msg("%s: token %lld differs from the T16 gemv's", what, (long long)j);
    cudaFree((void *)a.w), cudaFree((void *)a.x), cudaFree(a.y), cudaFree((void *)a.bias);
    free(w), free(r), free(x), free(y), free(yr), free(yg), free(b);
}

/* The T16 GEMM (cuda.gemm_t16.matmul): q4_0 / q8_0, ragged n (a padded last tile, an odd
 * tile count: half a CTA), ragged t (partial token tiles, 16- and 32-token CTAs, t below
 * 12: the gemv), k from one superchunk to 14336 (every warp count of the gemv's split),
 * bias, activations far outside the f16 range, chunks of tokens (a small scratch), each
 * vs ref and bitwise vs the T16 gemv; every warp-count override; then the matmul group
 * through the GEMM entry vs its members alone. */
static void test_matmul_gemm_t16(void **state) {
    (void)state;
    static const mm_case cs[] = {
        {1, 128, 12},   {37, 256, 13},     {300, 512, 16},   {129, 768, 17},
        {64, 1280, 31}, {33, 128, 33},     {257, 512, 64},   {1000, 1024, 65},
        {71, 512, 100}, {96, 2816, 24},    {5, 4096, 40},    {17, 14336, 20},
        {16, 384, 11},  {1030, 4096, 128}, {250, 1664, 257}, {48, 384, 600}};
    static const uint32_t dts[] = {KILN_DTYPE_Q4_0, KILN_DTYPE_Q8_0};
    const kt_rng saved = rng; /* a data stream of its own: the other tests' draws stay */
    const size_t ncs = sizeof cs / sizeof cs[0];
    /* version 1 (warps split k: the default), 2 (warps split rows, 4 or 8 warps by grid
     * size) */
    for (int v = 1; v <= 2; v++) {
        kiln_cuda_gemm_t16_variant(v);
        for (size_t d = 0; d < 2; d++)
            for (size_t i = 0; i < ncs; i++)
                g16_case(dts[d], cs[i].n, cs[i].k, cs[i].t, i % 2 == 1, 0);
        static const float sig[] = {3e4f, 1e-6f};
        for (size_t si = 0; si < 2; si++) {
            x_sigma = sig[si];
            for (size_t d = 0; d < 2; d++)
                for (size_t i = si; i < ncs; i += 3)
                    g16_case(dts[d], cs[i].n, cs[i].k, cs[i].t, true, 0);
        }
        x_sigma = 1.0f;
        static const int sws[] = {4, 8, 16, 32};
        for (int a = 0; a < 4; a++) {
            kiln_cuda_t16_config(sws[a], 0);
            for (size_t d = 0; d < 2; d++)
                for (size_t i = a % 2; i < ncs; i += 4)
                    g16_case(dts[d], cs[i].n, cs[i].k, cs[i].t, i % 2 == 0, 0);
        }
        kiln_cuda_t16_config(0, 0);
    }
    /* version 2 with 8-warp CTAs: rows and tokens enough for two waves of them */
    kiln_cuda_gemm_t16_variant(2);
    for (size_t d = 0; d < 2; d++) g16_case(dts[d], 14336 + 40, 256, 260, d == 1, 0);
    kiln_cuda_gemm_t16_variant(0);
    /* chunks: room for 24 / 16 / 8 tokens of split activations (k = 512: 2112 bytes a
     * token) */
    static const size_t sc[] = {24 * 2112 + 100, 16 * 2112, 8 * 2112 + 4};
    for (size_t d = 0; d < 2; d++)
        for (size_t i = 0; i < 3; i++)
            g16_case(dts[d], 300, 512, 100 - (int64_t)i * 30, i == 1, sc[i]);
    t16_group_sweep(true);
    rng = saved;
}

static void test_matmul_argmax(void **state) {
    (void)state;
    const uint32_t dts[] = {KILN_DTYPE_F16, KILN_DTYPE_Q8_0, KILN_DTYPE_Q6_K, KILN_DTYPE_Q4_K};
    for (int d = 0; d < 4; d++)
        for (int c = 0; c < 3; c++) {
            const int64_t n = 1000 + 333 * c, k = 512, t = 1 + 5 * c, lim = n - 7 * c;
            const float softcap = c == 1 ? 30.0f : 0.0f;
            const uint32_t dt = dts[d];
            const kiln_dtype_info *info = kiln_dtype_get(dt);
            const size_t rb = (size_t)(k / info->block_size) * info->block_bytes;
            uint8_t *w = malloc((size_t)n * rb);
            float *x = malloc(sizeof(float) * (size_t)(t * k));
            float *lg = malloc(sizeof(float) * (size_t)(t * n));
            kt_fill_weights(&rng, dt, w, n, k, rb);
            kt_fill_normal(&rng, x, (size_t)(t * k), 1.0f);
            kiln_matmul_args m = {.w = w,
                                  .w_dtype = dt,
                                  .w_row_bytes = rb,
                                  .n = n,
                                  .k = k,
                                  .x = x,
                                  .x_stride = k,
                                  .y = lg,
                                  .y_stride = n,
                                  .t = t};
            assert_int_equal(kiln_ref_matmul(NULL, &m), KILN_OK);
            m.w = dup_dev(w, (size_t)n * rb);
            m.x = dup_dev(x, sizeof(float) * (size_t)(t * k));
            int32_t *ids_d = poisoned(sizeof(int32_t) * (size_t)t);
            kiln_matmul_argmax_args a = {.mm = m,
                                         .fn = kiln_cuda_matmul_gemv,
                                         .n_limit = lim,
                                         .softcap = softcap,
                                         .ids = ids_d};
            /* the wide argmax (decode fusion off: the previous kernel) picks the same ids */
            int32_t ids[16], ids_old[16];
            kiln_cuda_decode_fusion(0);
            assert_int_equal(kiln_cuda_matmul_argmax(&kc, &a), KILN_OK);
            get(ids_old, ids_d, sizeof(int32_t) * (size_t)t);
            CK(cudaMemset(ids_d, 0xFF, sizeof(int32_t) * (size_t)t));
            kiln_cuda_decode_fusion(1);
            assert_int_equal(kiln_cuda_matmul_argmax(&kc, &a), KILN_OK);
            get(ids, ids_d, sizeof(int32_t) * (size_t)t);
            if (memcmp(ids, ids_old, sizeof(int32_t) * (size_t)t) != 0)
                fail_msg("argmax %s case %d: the wide kernel picks other ids", info->name, c);
            for (int64_t r = 0; r < t; r++) {
                const float *row = lg + r * n;
                int64_t best = 0;
                for (int64_t i = 1; i < lim; i++)
                    if (row[i] > row[best]) best = i;
                if (ids[r] != best) {
                    if (ids[r] < 0 || ids[r] >= lim)
                        fail_msg("argmax row %lld: id %d", (long long)r, ids[r]);
                    double gap = fabs((double)row[ids[r]] - row[best]);
                    if (gap > 1e-5 * fabs(row[best]))
                        fail_msg("argmax %s row %lld: %d vs ref %lld (gap %g)", info->name,
                                 (long long)r, ids[r], (long long)best, gap);
                }
            }
            cudaFree((void *)m.w), cudaFree((void *)m.x), cudaFree(ids_d);
            free(w), free(x), free(lg);
        }
}

/* ---- elementwise and row ops ---- */

static void test_rms_norm(void **state) {
    (void)state;
    const int64_t ns[] = {64, 256, 640, 2304, 4096, 33, 8192, 5120, 1023};
    for (int c = 0; c < 9; c++)
        for (int res = 0; res < 2; res++) {
            const int64_t n = ns[c], rows = 1 + 7 * c, st = n + 8;
            float *x = malloc(sizeof(float) * (size_t)(rows * st)),
                  *r = malloc(sizeof(float) * (size_t)(rows * st));
            float *w = malloc(sizeof(float) * (size_t)n),
                  *y = malloc(sizeof(float) * (size_t)(rows * st));
            float *xo = malloc(sizeof(float) * (size_t)(rows * st)),
                  *yo = malloc(sizeof(float) * (size_t)(rows * st));
            kt_fill_normal(&rng, x, (size_t)(rows * st), 2.0f);
            kt_fill_normal(&rng, r, (size_t)(rows * st), 1.0f);
            kt_fill_normal(&rng, w, (size_t)n, 0.3f);
            float *xd = dup_dev(x, sizeof(float) * (size_t)(rows * st));
            float *x0 = malloc(sizeof(float) * (size_t)(rows * st)); /* x before the residual */
            memcpy(x0, x, sizeof(float) * (size_t)(rows * st));
            kiln_rms_norm_args a = {.x = x,
                                    .r = res ? r : NULL,
                                    .y = y,
                                    .w = w,
                                    .w_offset = c % 2 ? 1.0f : 0.0f,
                                    .rows = rows,
                                    .n = n,
                                    .x_stride = st,
                                    .r_stride = st,
                                    .y_stride = st,
                                    .eps = 1e-6f};
            assert_int_equal(kiln_ref_rms_norm(NULL, &a), KILN_OK);
            a.x = xd;
            a.r = res ? dup_dev(r, sizeof(float) * (size_t)(rows * st)) : NULL;
            a.w = dup_dev(w, sizeof(float) * (size_t)n);
            a.y = poisoned(sizeof(float) * (size_t)(rows * st));
            assert_int_equal(kiln_cuda_rms_norm(&kc, &a), KILN_OK);
            get(yo, a.y, sizeof(float) * (size_t)(rows * st));
            get(xo, xd, sizeof(float) * (size_t)(rows * st));
            CHECK_ERR("rms_norm y", relerr(yo, y, rows, n, st, st), 2e-5);
            CHECK_ERR("rms_norm x (+residual)", relerr(xo, x, rows, n, st, st), 1e-7);
            /* the sum into a buffer of its own (the fused residual add + norm, s): the same
             * bits as in place (y and the sum), x untouched; both kernels */
            if (res)
                for (int fused = 1; fused >= 0; fused--) {
                    float *sd = poisoned(sizeof(float) * (size_t)(rows * st));
                    float *y3 = malloc(sizeof(float) * (size_t)(rows * st)),
                          *s3 = malloc(sizeof(float) * (size_t)(rows * st)),
                          *x3 = malloc(sizeof(float) * (size_t)(rows * st));
                    CK(cudaMemcpy(xd, x0, sizeof(float) * (size_t)(rows * st),
                                  cudaMemcpyHostToDevice));
                    CK(cudaMemset(a.y, 0xFF, sizeof(float) * (size_t)(rows * st)));
                    a.s = sd, a.s_stride = st;
                    kiln_cuda_decode_fusion(fused);
                    assert_int_equal(kiln_cuda_rms_norm(&kc, &a), KILN_OK);
                    kiln_cuda_decode_fusion(1);
                    a.s = NULL;
                    get(y3, a.y, sizeof(float) * (size_t)(rows * st));
                    get(s3, sd, sizeof(float) * (size_t)(rows * st));
                    get(x3, xd, sizeof(float) * (size_t)(rows * st));
                    for (int64_t ro = 0; ro < rows; ro++)
                        if (memcmp(y3 + ro * st, yo + ro * st, sizeof(float) * (size_t)n) ||
                            memcmp(s3 + ro * st, xo + ro * st, sizeof(float) * (size_t)n) ||
                            memcmp(x3 + ro * st, x0 + ro * st, sizeof(float) * (size_t)n))
                            fail_msg("rms_norm n=%lld row %lld (kernel %s): the sum into s differs "
                                     "from the sum in place, or x changed",
                                     (long long)n, (long long)ro, fused ? "register" : "loop");
                    cudaFree(sd), free(y3), free(s3), free(x3);
                }
            /* w2 from the middle row on (the q and k norms in one call): the same bits as
             * the two calls, both kernels */
            if (!res)
                for (int fused = 1; fused >= 0; fused--) {
                    float *w2 = malloc(sizeof(float) * (size_t)n);
                    kt_fill_normal(&rng, w2, (size_t)n, 0.3f);
                    float *w2d = dup_dev(w2, sizeof(float) * (size_t)n);
                    float *y4 = malloc(sizeof(float) * (size_t)(rows * st)),
                          *y5 = malloc(sizeof(float) * (size_t)(rows * st));
                    const int64_t half = rows / 2;
                    kiln_cuda_decode_fusion(fused);
                    CK(cudaMemset(a.y, 0xFF, sizeof(float) * (size_t)(rows * st)));
                    kiln_rms_norm_args b = a;
                    b.w2 = w2d, b.w2_row = half;
                    assert_int_equal(kiln_cuda_rms_norm(&kc, &b), KILN_OK);
                    get(y4, a.y, sizeof(float) * (size_t)(rows * st));
                    CK(cudaMemset(a.y, 0xFF, sizeof(float) * (size_t)(rows * st)));
                    b = a, b.rows = half;
                    if (half) assert_int_equal(kiln_cuda_rms_norm(&kc, &b), KILN_OK);
                    b.x += half * st, b.y += half * st, b.w = w2d, b.rows = rows - half;
                    assert_int_equal(kiln_cuda_rms_norm(&kc, &b), KILN_OK);
                    kiln_cuda_decode_fusion(1);
                    get(y5, a.y, sizeof(float) * (size_t)(rows * st));
                    for (int64_t ro = 0; ro < rows; ro++)
                        if (memcmp(y4 + ro * st, y5 + ro * st, sizeof(float) * (size_t)n))
                            fail_msg("rms_norm n=%lld row %lld (kernel %s): w2 in one call differs "
                                     "from two calls",
                                     (long long)n, (long long)ro, fused ? "register" : "loop");
                    cudaFree(w2d), free(w2), free(y4), free(y5);
                }
            /* the previous kernel (decode fusion off) on the same input: the same bits */
            {
                float *y2 = malloc(sizeof(float) * (size_t)(rows * st));
                CK(cudaMemcpy(xd, x0, sizeof(float) * (size_t)(rows * st), cudaMemcpyHostToDevice));
                CK(cudaMemset(a.y, 0xFF, sizeof(float) * (size_t)(rows * st)));
                kiln_cuda_decode_fusion(0);
                assert_int_equal(kiln_cuda_rms_norm(&kc, &a), KILN_OK);
                kiln_cuda_decode_fusion(1);
                get(y2, a.y, sizeof(float) * (size_t)(rows * st));
                for (int64_t ro = 0; ro < rows; ro++)
                    if (memcmp(y2 + ro * st, yo + ro * st, sizeof(float) * (size_t)n) != 0)
                        fail_msg("rms_norm n=%lld row %lld: register kernel differs from the "
                                 "previous one",
                                 (long long)n, (long long)ro);
                free(y2);
            }
            cudaFree(xd), cudaFree((void *)a.r), cudaFree((void *)a.w), cudaFree(a.y);
            free(x), free(x0), free(r), free(w), free(y), free(xo), free(yo);
        }
}

static void test_rope(void **state) {
    (void)state;
    for (int c = 0; c < 8; c++) {
        const int32_t hd = c % 2 ? 128 : 64, nh = 1 + c, nrot = c == 3 ? hd / 2 : hd;
        const int64_t rows = 5 + c, xs = (int64_t)nh * hd + 4;
        float *x = malloc(sizeof(float) * (size_t)(rows * xs)),
              *xo = malloc(sizeof(float) * (size_t)(rows * xs));
        int32_t pos[16];
        float ff[128];
        for (int64_t r = 0; r < rows; r++) pos[r] = (int32_t)(kt_rng_u64(&rng) % 5000);
        for (int i = 0; i < nrot / 2; i++) ff[i] = kt_rng_uniform(&rng, 1.0f, 8.0f);
        kt_fill_normal(&rng, x, (size_t)(rows * xs), 1.0f);
        float *xd = dup_dev(x, sizeof(float) * (size_t)(rows * xs));
        kiln_rope_args a = {.x = x,
                            .rows = rows,
                            .x_stride = xs,
                            .n_head = nh,
                            .head_dim = hd,
                            .n_rot = nrot,
                            .pos = pos,
                            .mode = c % 3 ? KILN_ROPE_NEOX : KILN_ROPE_NORM,
                            .base = c == 5 ? 1000000.0f : 10000.0f,
                            .freq_scale = c == 6 ? 0.25f : 1.0f,
                            .freq_factors = c == 4 ? ff : NULL,
                            .ext_factor = c == 6 ? 1.0f : 0.0f,
                            .attn_factor = 1.0f,
                            .beta_fast = 32.0f,
                            .beta_slow = 1.0f,
                            .n_ctx_orig = 4096};
        assert_int_equal(kiln_ref_rope(NULL, &a), KILN_OK);
        a.x = xd;
        a.pos = dup_dev(pos, sizeof(int32_t) * (size_t)rows);
        a.freq_factors = c == 4 ? dup_dev(ff, sizeof(float) * (size_t)(nrot / 2)) : NULL;
        assert_int_equal(kiln_cuda_rope(&kc, &a), KILN_OK);
        get(xo, xd, sizeof(float) * (size_t)(rows * xs));
        char what[64];
        snprintf(what, sizeof what, "rope case %d", c);
        CHECK_ERR(what, relerr(xo, x, rows, xs, xs, xs), 2e-5);
        cudaFree(xd), cudaFree((void *)a.pos), cudaFree((void *)a.freq_factors);
        free(x), free(xo);
    }
}

static void test_glu_add(void **state) {
    (void)state;
    for (int act = 0; act < 3; act++) {
        const int64_t t = 3 + act, n = 1000 + 37 * act, st = n + 5;
        float *g = malloc(sizeof(float) * (size_t)(t * st)),
              *u = malloc(sizeof(float) * (size_t)(t * st));
        float *y = malloc(sizeof(float) * (size_t)(t * st)),
              *yo = malloc(sizeof(float) * (size_t)(t * st));
        kt_fill_normal(&rng, g, (size_t)(t * st), 3.0f);
        kt_fill_normal(&rng, u, (size_t)(t * st), 1.0f);
        kiln_glu_args a = {.gate = g,
                           .up = u,
                           .y = y,
                           .t = t,
                           .n = n,
                           .gate_stride = st,
                           .up_stride = st,
                           .y_stride = st,
                           .act = (kiln_glu_act)act};
        assert_int_equal(kiln_ref_glu(NULL, &a), KILN_OK);
        a.gate = dup_dev(g, sizeof(float) * (size_t)(t * st));
        a.up = dup_dev(u, sizeof(float) * (size_t)(t * st));
        a.y = poisoned(sizeof(float) * (size_t)(t * st));
        assert_int_equal(kiln_cuda_glu(&kc, &a), KILN_OK);
        get(yo, a.y, sizeof(float) * (size_t)(t * st));
        CHECK_ERR("glu", relerr(yo, y, t, n, st, st), 2e-5);
        kiln_add_args b = {
            .a = g, .b = u, .y = y, .t = t, .n = n, .a_stride = st, .b_stride = st, .y_stride = st};
        assert_int_equal(kiln_ref_add(NULL, &b), KILN_OK);
        b.a = a.gate, b.b = a.up;
        CK(cudaMemset(a.y, 0xFF, sizeof(float) * (size_t)(t * st)));
        b.y = a.y;
        assert_int_equal(kiln_cuda_add(&kc, &b), KILN_OK);
        get(yo, a.y, sizeof(float) * (size_t)(t * st));
        CHECK_ERR("add", relerr(yo, y, t, n, st, st), 1e-7);
        cudaFree((void *)a.gate), cudaFree((void *)a.up), cudaFree(a.y);
        free(g), free(u), free(y), free(yo);
    }
}

static void test_embed(void **state) {
    (void)state;
    for (int d = 0; d < N_DT; d++) {
        const uint32_t dt = all_dt[d];
        const kiln_dtype_info *info = kiln_dtype_get(dt);
        const int64_t nv = 300, dim = 512, t = 9, ys = dim + 4;
        const size_t rb = (size_t)(dim / info->block_size) * info->block_bytes;
        uint8_t *w = malloc((size_t)nv * rb);
        float *y = malloc(sizeof(float) * (size_t)(t * ys)),
              *yo = malloc(sizeof(float) * (size_t)(t * ys));
        int32_t ids[9];
        kt_fill_weights(&rng, dt, w, nv, dim, rb);
        for (int i = 0; i < t; i++) ids[i] = (int32_t)(kt_rng_u64(&rng) % nv);
        kiln_embed_args a = {.w = w,
                             .w_dtype = dt,
                             .w_row_bytes = rb,
                             .n_vocab = nv,
                             .dim = dim,
                             .ids = ids,
                             .t = t,
                             .y = y,
                             .y_stride = ys,
                             .scale = d % 2 ? 22.6f : 1.0f};
        assert_int_equal(kiln_ref_embed(NULL, &a), KILN_OK);
        a.w = dup_dev(w, (size_t)nv * rb);
        a.ids = dup_dev(ids, sizeof ids);
        a.y = poisoned(sizeof(float) * (size_t)(t * ys));
        assert_int_equal(kiln_cuda_embed(&kc, &a), KILN_OK);
        get(yo, a.y, sizeof(float) * (size_t)(t * ys));
        CHECK_ERR(info->name, relerr(yo, y, t, dim, ys, ys), 1e-7);
        cudaFree((void *)a.w), cudaFree((void *)a.ids), cudaFree(a.y);
        free(w), free(y), free(yo);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_gemv),
        cmocka_unit_test(test_matmul_cublas),
        cmocka_unit_test(test_matmul_t16),
        cmocka_unit_test(test_matmul_t16_k),
        cmocka_unit_test(test_matmul_f16_rows),
        cmocka_unit_test(test_matmul_gemv_group),
        cmocka_unit_test(test_matmul_argmax),
        cmocka_unit_test(test_rms_norm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_glu_add),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_matmul_t16_group),
        cmocka_unit_test(test_matmul_gemm_t16),
    };
    return kt_cuda_main("test_cuda_kernels", tests, sizeof tests / sizeof tests[0],
                        0x6b696c6e63756461ull, (size_t)64 << 20);
}

#endif /* KILN_HAVE_CUDA */
