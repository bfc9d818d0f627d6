/*
 * test_cuda_gemm_i8.c — the int8 tensor-core GEMM on T16 weights (gemm_i8.cu,
 * cuda.gemm_i8.matmul; session 12) against the ref kernel on the plain rows: q4_0 and q8_0,
 * ragged n (a padded last tile, row groups of every size the launch picks), ragged t (partial
 * token tiles, 16- and 32-token CTAs, chunks of tokens from a small scratch), k from one
 * superchunk to 14336, bias, activations of sigma 3e4 and 1e-6, blocks of very different
 * magnitudes, blocks with one huge outlier; relative L2 error <= 2e-5 (the tolerance of
 * every f32-arithmetic path: docs/CUDA.md "Exact numerics"). Outputs are poisoned (NaN)
 * first and the padding between output rows must stay poisoned. Each case runs twice: the
 * same bits (deterministic). Then: 4 row tiles per warp above 64 tokens, the GEMM from 1
 * token (its small-t paths), the fallbacks with the GEMM off (KILN_CUDA_NO_I8's previous
 * selection, bitwise the T16 GEMM up to 64 tokens), and a matmul group (q / k / v, gate / up
 * + GLU, mixed dtypes; one dtype: one launch, at a forced k split) bitwise equal to its
 * members alone; the switch to cuBLAS above 192 tokens; the registry's choice per bucket and
 * policy.
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
#include "kernels/ref/ref.h"
#include "kernels/registry.h"
#include "kernels/select.h"
#include "kernels/spec.h"

#include "cuda_test.h"

#define SCRATCH_BYTES ((size_t)512 << 20)

typedef struct i8_case_t {
    int64_t n, k, t;
} i8_case_t;

/* activations: 0 normal(sigma), 1 each 32-block scaled by 2^u, u uniform in [-40, 40],
 * 2 normal with one element of a third of the blocks 1e4 x sigma */
static void fill_x(float *x, int64_t t, int64_t xs, int64_t k, float sigma, int kind) {
    kt_fill_normal(&rng, x, (size_t)(t * xs), sigma);
    if (kind == 0) return;
    for (int64_t r = 0; r < t; r++)
        for (int64_t b = 0; b < k / 32; b++) {
            float *p = x + r * xs + b * 32;
            if (kind == 1) {
                const float s = ldexpf(1.0f, (int)kt_rng_uniform(&rng, -40.0f, 40.0f));
                for (int i = 0; i < 32; i++) p[i] *= s;
            } else if (kt_rng_uniform(&rng, 0.0f, 3.0f) < 1.0f) {
                p[(int)kt_rng_uniform(&rng, 0.0f, 31.99f)] = 1e4f * sigma;
            }
        }
}

typedef struct dev_mm {
    kiln_matmul_args a; /* device pointers, T16 weights */
    float *yr, *y;      /* host: ref, result */
    size_t yb;
    int64_t ys;
} dev_mm;

static void mm_make(dev_mm *d, uint32_t dt, int64_t n, int64_t k, int64_t t, bool bias, float sigma,
                    int kind) {
    const kiln_dtype_info *info = kiln_dtype_get(dt);
    const size_t rb = (size_t)(k / info->block_size) * info->block_bytes;
    const size_t tb = (size_t)((n + 15) / 16) * 16 * rb;
    const int64_t xs = k + 4, ys = n + 3;
    const size_t yb = sizeof(float) * (size_t)(t * ys);
    uint8_t *w = malloc((size_t)n * rb), *r = malloc(tb);
    float *x = malloc(sizeof(float) * (size_t)(t * xs)), *b = malloc(sizeof(float) * (size_t)n);
    d->yr = malloc(yb), d->y = malloc(yb);
    assert_true(w && r && x && b && d->yr && d->y);
    kt_fill_weights(&rng, dt, w, n, k, rb);
    fill_x(x, t, xs, k, sigma, kind);
    kt_fill_normal(&rng, b, (size_t)n, 0.5f);
    kiln_matmul_args a = {.w = w,
                          .w_dtype = dt,
                          .w_row_bytes = rb,
                          .n = n,
                          .k = k,
                          .x = x,
                          .x_stride = xs,
                          .y = d->yr,
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
    d->a = a;
    d->yb = yb;
    d->ys = ys;
    free(w), free(r), free(x), free(b);
}

static void mm_free(dev_mm *d) {
    cudaFree((void *)d->a.w), cudaFree((void *)d->a.x), cudaFree(d->a.y);
    cudaFree((void *)d->a.bias);
    free(d->yr), free(d->y);
}

/* the padding floats between output rows (n .. n + 2 of each token) still poisoned */
static void check_pad(const dev_mm *d, const char *what) {
    for (int64_t j = 0; j < d->a.t; j++)
        for (int64_t i = d->a.n; i < d->ys; i++) {
            uint32_t u;
            memcpy(&u, &d->y[j * d->ys + i], 4);
            if (u != 0xFFFFFFFFu) fail_msg("%s: padding of token %lld written", what, (long long)j);
        }
}

/* One case: vs ref (2e-5), twice bitwise, padding untouched. scratch 0: the test's. */
static void i8_case(uint32_t dt, int64_t n, int64_t k, int64_t t, bool bias, size_t scratch,
                    float sigma, int kind) {
    dev_mm d;
    mm_make(&d, dt, n, k, t, bias, sigma, kind);
    kiln_kctx kg = kc;
    if (scratch) kg.scratch_size = scratch;
    char what[200];
    snprintf(what, sizeof what, "gemm_i8 %s n=%lld k=%lld t=%lld%s scratch %zu sigma %g x%d",
             kiln_dtype_get(dt)->name, (long long)n, (long long)k, (long long)t,
             bias ? " bias" : "", scratch, (double)sigma, kind);
    kiln_status st = kiln_cuda_matmul_i8(&kg, &d.a);
    if (st) fail_msg("%s: status %d", what, (int)st);
    get(d.y, d.a.y, d.yb);
    check_pad(&d, what);
    CHECK_ERR(what, relerr(d.y, d.yr, t, n, d.ys, d.ys), 2e-5);
    float *y2 = malloc(d.yb);
    assert_non_null(y2);
    memcpy(y2, d.y, d.yb);
    CK(cudaMemset(d.a.y, 0xFF, d.yb));
    assert_int_equal(kiln_cuda_matmul_i8(&kg, &d.a), KILN_OK);
    get(d.y, d.a.y, d.yb);
    if (memcmp(y2, d.y, d.yb) != 0) fail_msg("%s: a second call differs", what);
    free(y2);
    mm_free(&d);
}

static const i8_case_t cs[] = {
    {1, 128, 12},     {37, 256, 13},   {300, 512, 16},   {129, 768, 17},    {64, 1280, 31},
    {33, 128, 33},    {257, 512, 64},  {1000, 1024, 65}, {71, 512, 100},    {96, 2816, 24},
    {5, 4096, 40},    {17, 14336, 20}, {16, 384, 12},    {1030, 4096, 128}, {250, 1664, 257},
    {48, 384, 600},   {4100, 256, 70}, {2000, 640, 513}, {160, 14336, 72},  {520, 4096, 512},
    {8200, 128, 200},
};
#define NCS           (sizeof cs / sizeof cs[0])
static const uint32_t dts[] = {KILN_DTYPE_Q4_0, KILN_DTYPE_Q8_0};

static void test_gemm_i8_shapes(void **state) {
    (void)state;
    kiln_cuda_gemm_i8_set(1);
    kiln_cuda_gemm_i8_config(0, 0, 0);
    for (size_t d = 0; d < 2; d++)
        for (size_t i = 0; i < NCS; i++)
            i8_case(dts[d], cs[i].n, cs[i].k, cs[i].t, i % 2 == 1, 0, 1.0f, 0);
}

/* magnitudes: sigma 3e4 and 1e-6, blocks scaled by 2^-40 .. 2^40, one huge outlier in a
 * third of the blocks */
static void test_gemm_i8_magnitudes(void **state) {
    (void)state;
    kiln_cuda_gemm_i8_set(1);
    kiln_cuda_gemm_i8_config(0, 0, 0);
    static const float sig[] = {3e4f, 1e-6f, 1.0f, 1.0f};
    static const int kinds[] = {0, 0, 1, 2};
    for (int s = 0; s < 4; s++)
        for (size_t d = 0; d < 2; d++)
            for (size_t i = (size_t)s; i < NCS; i += 3)
                i8_case(dts[d], cs[i].n, cs[i].k, cs[i].t, true, 0, sig[s], kinds[s]);
}

/* version 1: 4 row tiles per warp above 64 tokens, the GEMM from 1 token (8-token CTAs,
 * t 1-11), one CTA per SM; both versions: the grid's k split forced; version 1 on every
 * shape; chunks from a small scratch (k = 512: 2048 bytes a token) */
static void test_gemm_i8_configs(void **state) {
    (void)state;
    kiln_cuda_gemm_i8_set(1);
    kiln_cuda_gemm_i8_variant(1); /* the row-tile, occupancy and min-t settings: version 1 */
    kiln_cuda_gemm_i8_config(4, 0, 0);
    for (size_t d = 0; d < 2; d++)
        for (size_t i = 0; i < NCS; i++)
            if (cs[i].t > 64) i8_case(dts[d], cs[i].n, cs[i].k, cs[i].t, i % 2 == 0, 0, 1.0f, 0);
    kiln_cuda_gemm_i8_config(0, 1, 0);
    static const i8_case_t sm[] = {{1, 128, 1},   {37, 256, 2},    {300, 512, 3},  {129, 768, 5},
                                   {64, 1280, 7}, {1000, 4096, 8}, {33, 14336, 9}, {17, 384, 11}};
    for (size_t d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof sm / sizeof sm[0]; i++)
            i8_case(dts[d], sm[i].n, sm[i].k, sm[i].t, i % 2 == 0, 0, 1.0f, 0);
    /* one CTA per SM (the next superchunk prefetched), from 1 token */
    kiln_cuda_gemm_i8_config(0, 1, 1);
    for (size_t d = 0; d < 2; d++)
        for (size_t i = d; i < NCS; i += 2)
            i8_case(dts[d], cs[i].n, cs[i].k, cs[i].t, i % 4 == 0, 0, 1.0f, 0);
    for (size_t d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof sm / sizeof sm[0]; i++)
            i8_case(dts[d], sm[i].n, sm[i].k, sm[i].t, i % 2 == 1, 0, 1.0f, 0);
    kiln_cuda_gemm_i8_config(0, 0, 0);
    /* the grid's k split forced: 3 and 16 ranges (fewer where k has fewer superchunks),
     * partial sums added in order: vs ref, twice the same bits; in both versions */
    static const int kss[] = {3, 16};
    for (int v = 2; v >= 1; v--) {
        kiln_cuda_gemm_i8_variant(v);
        for (int a = 0; a < 2; a++) {
            kiln_cuda_gemm_i8_ksplit(kss[a]);
            for (size_t d = 0; d < 2; d++)
                for (size_t i = (size_t)a; i < NCS; i += 2)
                    i8_case(dts[d], cs[i].n, cs[i].k, cs[i].t, i % 3 == 0, 0, 1.0f, 0);
        }
        kiln_cuda_gemm_i8_ksplit(0);
    }
    /* version 1's own configurations: every shape */
    for (size_t d = 0; d < 2; d++)
        for (size_t i = 0; i < NCS; i++)
            i8_case(dts[d], cs[i].n, cs[i].k, cs[i].t, i % 2 == 0, 0, 1.0f, 0);
    kiln_cuda_gemm_i8_variant(0);
    static const size_t sc[] = {24 * 2048 + 100, 16 * 2048, 8 * 2048 + 4};
    for (size_t d = 0; d < 2; d++)
        for (size_t i = 0; i < 3; i++)
            i8_case(dts[d], 300, 512, 100 - (int64_t)i * 30, i == 1, sc[i], 1.0f, 0);
}

/* off (the A/B switch): up to 64 tokens the T16 GEMM's entry, bitwise; above, cuBLAS (vs
 * ref at its tolerance, 2e-5 with split f16); below 12 tokens on: the same */
static void test_gemm_i8_fallback(void **state) {
    (void)state;
    kiln_cuda_gemm_i8_config(0, 0, 0);
    static const i8_case_t fc[] = {{300, 512, 5}, {129, 768, 11}, {257, 512, 64}, {71, 512, 100}};
    for (int on = 0; on < 2; on++)
        for (size_t d = 0; d < 2; d++)
            for (size_t i = 0; i < 4; i++) {
                if (on && fc[i].t >= 12) continue;
                dev_mm m;
                mm_make(&m, dts[d], fc[i].n, fc[i].k, fc[i].t, i % 2 == 0, 1.0f, 0);
                kiln_cuda_gemm_i8_set(on);
                assert_int_equal(kiln_cuda_matmul_i8(&kc, &m.a), KILN_OK);
                get(m.y, m.a.y, m.yb);
                CHECK_ERR("gemm_i8 fallback", relerr(m.y, m.yr, m.a.t, m.a.n, m.ys, m.ys), 2e-5);
                if (fc[i].t <= 64) {
                    float *y2 = malloc(m.yb);
                    assert_non_null(y2);
                    CK(cudaMemset(m.a.y, 0xFF, m.yb));
                    assert_int_equal(kiln_cuda_matmul_t16_gemm(&kc, &m.a), KILN_OK);
                    get(y2, m.a.y, m.yb);
                    if (memcmp(y2, m.y, m.yb) != 0)
                        fail_msg("gemm_i8 off, t=%lld: not the T16 GEMM's bits",
                                 (long long)fc[i].t);
                    free(y2);
                }
                mm_free(&m);
            }
    kiln_cuda_gemm_i8_set(1);
    /* the default limit: up to 192 tokens the GEMM, above cuBLAS on the T16 weights (bitwise
     * kiln_cuda_matmul_cublas) */
    kiln_cuda_gemm_i8_max_t(0);
    static const int64_t ts[] = {150, 192, 193, 300};
    for (size_t d = 0; d < 2; d++)
        for (size_t i = 0; i < 4; i++) {
            dev_mm m;
            mm_make(&m, dts[d], 257, 512, ts[i], i % 2 == 0, 1.0f, 0);
            assert_int_equal(kiln_cuda_matmul_i8(&kc, &m.a), KILN_OK);
            get(m.y, m.a.y, m.yb);
            CHECK_ERR("gemm_i8 limit", relerr(m.y, m.yr, m.a.t, m.a.n, m.ys, m.ys), 2e-5);
            float *y2 = malloc(m.yb);
            assert_non_null(y2);
            CK(cudaMemset(m.a.y, 0xFF, m.yb));
            assert_int_equal(kiln_cuda_matmul_cublas(&kc, &m.a), KILN_OK);
            get(y2, m.a.y, m.yb);
            const bool same = memcmp(y2, m.y, m.yb) == 0;
            if (same != (ts[i] > 192))
                fail_msg("gemm_i8 at t=%lld: %s cuBLAS's bits", (long long)ts[i],
                         same ? "has" : "does not have");
            free(y2);
            mm_free(&m);
        }
    kiln_cuda_gemm_i8_max_t(1 << 30);
}

/* a matmul group through kiln_cuda_matmul_group with every member on the i8 entry: one
 * prep of x, the same bits as each member alone; q4_0 and q8_0 mixed; gate / up + GLU */
static void test_gemm_i8_group(void **state) {
    (void)state;
    kiln_cuda_gemm_i8_set(1);
    kiln_cuda_gemm_i8_config(0, 0, 0);
    static const int64_t ts[] = {16, 64, 130};
    /* mixed dtypes: a launch per member (their own k splits); one dtype: one launch for the
     * group, whose k split follows the whole grid, so the members alone are
     * compared at the same forced split */
    for (int same = 0; same < 2; same++)
        for (int ti = 0; ti < 3; ti++)
            for (int glu = 0; glu < 2; glu++) {
                kiln_cuda_gemm_i8_ksplit(same ? 3 : 0);
                const int nm = glu ? 2 : 3;
                const int64_t k = 512, t = ts[ti], xs = k + 4;
                const int64_t ns[3] = {glu ? 300 : 256, glu ? 300 : 64, 64};
                float *x = malloc(sizeof(float) * (size_t)(t * xs));
                assert_non_null(x);
                kt_fill_normal(&rng, x, (size_t)(t * xs), 1.0f);
                float *xd = dup_dev(x, sizeof(float) * (size_t)(t * xs));
                kiln_matmul_group_args g = {.n = nm};
                void *wd[3];
                float *yd[3], *ya[3], *yg[3];
                for (int i = 0; i < nm; i++) {
                    const uint32_t dt = i == 1 && !same ? KILN_DTYPE_Q8_0 : KILN_DTYPE_Q4_0;
                    const kiln_dtype_info *info = kiln_dtype_get(dt);
                    const size_t rb = (size_t)(k / info->block_size) * info->block_bytes;
                    const size_t tb = (size_t)((ns[i] + 15) / 16) * 16 * rb;
                    uint8_t *w = malloc((size_t)ns[i] * rb), *r = malloc(tb);
                    assert_true(w && r);
                    kt_fill_weights(&rng, dt, w, ns[i], k, rb);
                    assert_int_equal(kiln_cuda_t16_repack(dt, w, rb, ns[i], k, r, NULL), KILN_OK);
                    wd[i] = dup_dev(r, tb);
                    const size_t yb = sizeof(float) * (size_t)(t * ns[i]);
                    yd[i] = poisoned(yb);
                    ya[i] = malloc(yb), yg[i] = malloc(yb);
                    assert_true(ya[i] && yg[i]);
                    g.m[i] = (kiln_matmul_args){.w = wd[i],
                                                .w_dtype = dt,
                                                .w_row_bytes = rb,
                                                .w_layout = KILN_WLAYOUT_CUDA_T16,
                                                .n = ns[i],
                                                .k = k,
                                                .x = xd,
                                                .x_stride = xs,
                                                .y = yd[i],
                                                .y_stride = ns[i],
                                                .t = t};
                    g.fn[i] = kiln_cuda_matmul_i8;
                    assert_int_equal(kiln_cuda_matmul_i8(&kc, &g.m[i]), KILN_OK);
                    get(ya[i], yd[i], yb);
                    CK(cudaMemset(yd[i], 0xFF, yb));
                    free(w), free(r);
                }
                float *gd = NULL, *gh = NULL, *gr = NULL;
                const size_t gb = sizeof(float) * (size_t)(t * ns[0]);
                if (glu) {
                    gd = poisoned(gb);
                    gh = malloc(gb), gr = malloc(gb);
                    assert_true(gh && gr);
                    g.glu_fn = kiln_cuda_glu;
                    g.act = KILN_GLU_SWIGLU;
                    g.glu_y = gd;
                    g.glu_y_stride = ns[0];
                }
                assert_int_equal(kiln_cuda_matmul_group(&kc, &g), KILN_OK);
                for (int i = 0; i < nm; i++) {
                    get(yg[i], yd[i], sizeof(float) * (size_t)(t * ns[i]));
                    if (memcmp(ya[i], yg[i], sizeof(float) * (size_t)(t * ns[i])) != 0)
                        fail_msg("i8 group t=%lld member %d (%s dtypes): differs from the member "
                                 "alone",
                                 (long long)t, i, same ? "one" : "mixed");
                }
                if (glu) {
                    /* the GLU of the members' own outputs, the same kernel */
                    kiln_glu_args ga = {.gate = yd[0],
                                        .up = yd[1],
                                        .y = gd,
                                        .t = t,
                                        .n = ns[0],
                                        .gate_stride = ns[0],
                                        .up_stride = ns[1],
                                        .y_stride = ns[0],
                                        .act = KILN_GLU_SWIGLU};
                    get(gh, gd, gb);
                    CK(cudaMemset(gd, 0xFF, gb));
                    assert_int_equal(kiln_cuda_glu(&kc, &ga), KILN_OK);
                    get(gr, gd, gb);
                    if (memcmp(gh, gr, gb) != 0)
                        fail_msg("i8 group t=%lld: GLU differs", (long long)t);
                    cudaFree(gd), free(gh), free(gr);
                }
                for (int i = 0; i < nm; i++)
                    cudaFree(wd[i]), cudaFree(yd[i]), free(ya[i]), free(yg[i]);
                cudaFree(xd), free(x);
            }
    kiln_cuda_gemm_i8_ksplit(0);
}

/* the registry's choice for an 8B-shaped q4_0 / q8_0 matmul on this device: the int8 GEMM
 * for 1, 9-64 tokens (below 12 its entry runs the T16 GEMM's), cuBLAS on T16 above 64; a
 * batch-invariant (deterministic) site keeps the T16 GEMM */
static void test_gemm_i8_selection(void **state) {
    (void)state;
    const kiln_registry *reg = kiln_registry_default();
    assert_non_null(reg);
    kiln_selector *s = NULL;
    kiln_err e;
    assert_int_equal(kiln_selector_new(reg, NULL, NULL, &s, &e), KILN_OK);
    int sm = 0;
    char why[256];
    assert_true(kiln_cuda_probe(&sm, why, sizeof why) > 0);
    static const struct {
        int bucket;
        bool inv;
        const char *id;
    } want[] = {{0, false, "cuda.gemm_i8.matmul"},
                {2, false, "cuda.gemm_i8.matmul"},
                {3, false, "cuda.gemm_i8.matmul"},
                {4, false, "cuda.cublas_t16.matmul"},
                {2, true, "cuda.gemm_t16.matmul"}};
    kiln_sel_result *r = malloc(sizeof *r);
    assert_non_null(r);
    for (size_t d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            kiln_sel_ctx c;
            kiln_sel_ctx_init(&c, KILN_KOP_MATMUL, KILN_BACKEND_CUDA);
            c.sm = sm;
            c.w_dtype = dts[d];
            c.act_dtype = KILN_DTYPE_F32;
            c.n = 4096;
            c.k = 4096;
            c.deterministic = c.batch_invariant = want[i].inv;
            kiln_sel_ctx_set_bucket(&c, want[i].bucket, 0, 0, 0);
            assert_int_equal(kiln_select(s, &c, KILN_SEL_NO_CACHE, r, &e), KILN_OK);
            if (strcmp(r->chosen->spec.id, want[i].id) != 0)
                fail_msg("%s, bucket %d%s: chose %s, expected %s", kiln_dtype_get(dts[d])->name,
                         want[i].bucket, want[i].inv ? " (batch invariant)" : "",
                         r->chosen->spec.id, want[i].id);
        }
    free(r);
    kiln_selector_free(s);
}

int main(void) {
    /* the GEMM at every size the cases ask for (by default it serves up to 192 tokens:
     * test_gemm_i8_fallback checks the switch) */
    kiln_cuda_gemm_i8_max_t(1 << 30);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_i8_shapes),  cmocka_unit_test(test_gemm_i8_magnitudes),
        cmocka_unit_test(test_gemm_i8_configs), cmocka_unit_test(test_gemm_i8_fallback),
        cmocka_unit_test(test_gemm_i8_group),   cmocka_unit_test(test_gemm_i8_selection),
    };
    return kt_cuda_main("test_cuda_gemm_i8", tests, sizeof tests / sizeof tests[0],
                        0x6b696c6e69386d6dull, SCRATCH_BYTES);
}

#endif /* KILN_HAVE_CUDA */
