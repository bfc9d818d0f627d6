/*
 * test_cuda_t16.c — the CUDA T16 weight layout's host side (kernels/cuda_t16.h), CPU only:
 * the repack the loader runs on the way to the device against a reference written from
 * the mma fragment's point of view (what lane L of the warp must hold for tile j,
 * superchunk sc), the byte offsets against the repack, the values through those offsets
 * against the reference dequantization of the plain rows, and the loader layout
 * (chunks of 16 rows give the bytes of one call; ragged n; refused shapes).
 */
#include "testutil.h"

#include "base/mem.h"
#include "format/dtype.h"
#include "format/quants.h"
#include "kernels/cuda_t16.h"
#include "load/layout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static kt_rng rng;

static size_t row_bytes(uint32_t dt, int64_t k) {
    return (size_t)(k / 32) * (dt == KILN_DTYPE_Q4_0 ? 18 : 34);
}

/* The reference: for every tile, superchunk and lane, gather the 16 bytes the lane's
 * 16-byte loads must return (cuda_t16.h), and the scales. */
static uint8_t *reference(uint32_t dt, const uint8_t *w, int64_t n, int64_t k) {
    const size_t rb = row_bytes(dt, k), bb = dt == KILN_DTYPE_Q4_0 ? 18 : 34;
    const int64_t tiles = (n + 15) / 16, nsc = k / 128;
    const size_t cb = dt == KILN_DTYPE_Q4_0 ? 1152 : 2176;
    uint8_t *out = calloc((size_t)tiles * 16, rb);
    assert_non_null(out);
    for (int64_t j = 0; j < tiles; j++)
        for (int64_t sc = 0; sc < nsc; sc++) {
            uint8_t *c = out + ((size_t)j * (size_t)nsc + (size_t)sc) * cb;
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane / 4, tig = lane % 4;
                for (int word = 0; word < 4; word++) {
                    int h, blk, off; /* row g + 8 h, block 4 sc + blk, qs offset */
                    uint8_t *dst;
                    if (dt == KILN_DTYPE_Q4_0) {
                        for (int p = 0; p < 2; p++) {
                            h = word % 2, blk = 2 * p + word / 2, off = 4 * tig;
                            dst = c + p * 512 + lane * 16 + word * 4;
                            const int64_t r = j * 16 + g + 8 * h;
                            if (r < n)
                                memcpy(dst,
                                       w + (size_t)r * rb + (size_t)(4 * sc + blk) * bb + 2 + off,
                                       4);
                        }
                    } else {
                        for (blk = 0; blk < 4; blk++) {
                            h = word / 2, off = 16 * (word % 2) + 4 * tig;
                            dst = c + blk * 512 + lane * 16 + word * 4;
                            const int64_t r = j * 16 + g + 8 * h;
                            if (r < n)
                                memcpy(dst,
                                       w + (size_t)r * rb + (size_t)(4 * sc + blk) * bb + 2 + off,
                                       4);
                        }
                    }
                }
            }
            for (int g = 0; g < 8; g++)
                for (int blk = 0; blk < 4; blk++)
                    for (int h = 0; h < 2; h++) {
                        const int64_t r = j * 16 + g + 8 * h;
                        if (r < n)
                            memcpy(c + cb - 128 + g * 16 + (2 * blk + h) * 2,
                                   w + (size_t)r * rb + (size_t)(4 * sc + blk) * bb, 2);
                    }
        }
    return out;
}

static void one(uint32_t dt, int64_t n, int64_t k) {
    const size_t rb = row_bytes(dt, k);
    const int64_t tiles = (n + 15) / 16;
    const size_t tb = (size_t)tiles * 16 * rb;
    uint8_t *w = malloc((size_t)n * rb), *got = malloc(tb);
    assert_true(w && got);
    kt_fill_weights(&rng, dt, w, n, k, rb);
    memset(got, 0xA5, tb); /* the padded rows must come out zero */
    assert_int_equal(kiln_cuda_t16_repack(dt, w, rb, n, k, got, NULL), KILN_OK);
    uint8_t *want = reference(dt, w, n, k);
    if (memcmp(got, want, tb) != 0)
        fail_msg("cuda_t16 %s n=%lld k=%lld: repack differs from the reference",
                 dt == KILN_DTYPE_Q4_0 ? "q4_0" : "q8_0", (long long)n, (long long)k);
    /* the offsets (which the device dequantization mirrors) and the values through them */
    const int nq = dt == KILN_DTYPE_Q4_0 ? 16 : 32, bb = dt == KILN_DTYPE_Q4_0 ? 18 : 34;
    float *ref = malloc(sizeof(float) * (size_t)k);
    assert_non_null(ref);
    for (int64_t r = 0; r < n; r += (r % 7) + 1) {
        assert_int_equal(kiln_dequantize_row(dt, w + (size_t)r * rb, ref, k, NULL), KILN_OK);
        for (int64_t b = 0; b < k / 32; b++) {
            uint16_t dh;
            memcpy(&dh, got + kiln_cuda_t16_d_offset(dt, k, r, b), 2);
            assert_memory_equal(&dh, w + (size_t)r * rb + (size_t)b * bb, 2);
            float d;
            kiln_dequant_f16(&dh, &d, 1);
            for (int m = 0; m < nq; m++) {
                const uint8_t q = got[kiln_cuda_t16_qs_offset(dt, k, r, b, m)];
                assert_int_equal(q, w[(size_t)r * rb + (size_t)b * bb + 2 + m]);
                if (dt == KILN_DTYPE_Q4_0) {
                    assert_true((float)((q & 15) - 8) * d == ref[b * 32 + m]);
                    assert_true((float)((q >> 4) - 8) * d == ref[b * 32 + 16 + m]);
                } else {
                    assert_true((float)(int8_t)q * d == ref[b * 32 + m]);
                }
            }
        }
    }
    /* the loader layout: 16-row chunks give the bytes of one call */
    const kiln_layout *l = kiln_cuda_t16_layout();
    uint32_t od;
    uint64_t orb;
    assert_int_equal(l->plan(dt, k, n, 0, &od, &orb, NULL), KILN_OK);
    assert_int_equal(od, dt);
    assert_int_equal(orb, rb);
    assert_int_equal(l->row_group, 16);
    assert_true(l->pad_last_group);
    uint8_t *chunks = malloc(tb);
    assert_non_null(chunks);
    memset(chunks, 0x5A, tb);
    for (int64_t r0 = 0; r0 < n; r0 += 32) {
        const int64_t rows = n - r0 < 32 ? n - r0 : 32;
        assert_int_equal(
            l->run(dt, k, 0, w + (size_t)r0 * rb, rows, chunks + (size_t)r0 * orb, NULL), KILN_OK);
    }
    assert_memory_equal(chunks, want, tb);
    free(chunks), free(ref), free(want), free(w), free(got);
}

static void test_repack(void **state) {
    (void)state;
    static const int64_t ns[] = {1, 7, 16, 17, 33, 100, 256};
    static const int64_t ks[] = {128, 256, 384, 1280, 4096};
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
            for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++)
                one(d ? KILN_DTYPE_Q8_0 : KILN_DTYPE_Q4_0, ns[i], ks[j]);
}

static void test_refusals(void **state) {
    (void)state;
    const kiln_layout *l = kiln_cuda_t16_layout();
    uint32_t od;
    uint64_t orb;
    kiln_err e;
    assert_int_equal(l->plan(KILN_DTYPE_Q4_0, 96, 16, 0, &od, &orb, &e), KILN_ERR_UNSUPPORTED);
    assert_int_equal(l->plan(KILN_DTYPE_Q4_K, 256, 16, 0, &od, &orb, &e), KILN_ERR_UNSUPPORTED);
    assert_int_equal(l->plan(KILN_DTYPE_F16, 256, 16, 0, &od, &orb, &e), KILN_ERR_UNSUPPORTED);
    assert_int_equal(l->plan(KILN_DTYPE_Q8_0, 256, 16, 1, &od, &orb, &e), KILN_ERR_UNSUPPORTED);
    uint8_t src[34 * 4], dst[16 * 34 * 4];
    memset(src, 0, sizeof src);
    assert_int_equal(kiln_cuda_t16_repack(KILN_DTYPE_Q8_0, src, 34 * 3, 1, 96, dst, &e),
                     KILN_ERR_UNSUPPORTED);
    assert_false(kiln_cuda_t16_supports(KILN_DTYPE_Q4_1));
    assert_true(kiln_cuda_t16_supports(KILN_DTYPE_Q8_0));
}

int main(void) {
    kt_rng_seed(&rng, 0x7431366c61796f75ull);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repack),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
