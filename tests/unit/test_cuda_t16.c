/*
 * test_cuda_t16.c — the CUDA T16 weight layout's host side (kernels/cuda_t16.h), CPU only:
 * the repack the loader runs on the way to the device against a reference written from
 * the mma fragment's point of view (what lane L of the warp must hold for tile j,
 * superchunk sc), the byte offsets against the repack, the values through those offsets
 * against the reference dequantization of the plain rows, and the loader layout
 * (chunks of 16 rows give the bytes of one call; ragged n; refused shapes). q4_K / q6_K:
 * the reference places each element's integer quant (unpacked here as ggml's
 * dequantize_row_q4_K / q6_K index them) and the scales where the fragment of cuda_t16.h
 * wants them; the host dequantization through the layout must equal kiln_dequantize_row
 * of the plain rows bitwise (every dtype).
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
    if (dt == KILN_DTYPE_Q4_K) return (size_t)(k / 256) * 144;
    if (dt == KILN_DTYPE_Q6_K) return (size_t)(k / 256) * 210;
    return (size_t)(k / 32) * (dt == KILN_DTYPE_Q4_0 ? 18 : 34);
}

static const char *dt_name(uint32_t dt) {
    return dt == KILN_DTYPE_Q4_0   ? "q4_0"
           : dt == KILN_DTYPE_Q8_0 ? "q8_0"
           : dt == KILN_DTYPE_Q4_K ? "q4_K"
                                   : "q6_K";
}

/* One plain K-quant block unpacked: the unsigned quant of each element (q4_K 0..15, q6_K
 * 0..63, value q - 32), and the scales (q4_K: 6-bit sc, m of each 32-block; q6_K: the 16
 * int8 of each 16-block), d and dmin as stored. Written from ggml's dequantize loops. */
typedef struct kblock {
    uint8_t q[256];
    int sc[16], m[8];
    uint16_t d, dmin;
} kblock;

static void unpack_k(uint32_t dt, const uint8_t *blk, kblock *u) {
    memset(u, 0, sizeof *u);
    if (dt == KILN_DTYPE_Q4_K) {
        kiln_block_q4_K b;
        memcpy(&b, blk, sizeof b);
        u->d = b.d, u->dmin = b.dmin;
        int is = 0;
        for (int j = 0; j < 256; j += 64) { /* ggml: 64 elements per 32 bytes of qs */
            const uint8_t *q = b.qs + j / 2;
            for (int l = 0; l < 32; l++) u->q[j + l] = q[l] & 0xF;
            for (int l = 0; l < 32; l++) u->q[j + 32 + l] = q[l] >> 4;
            for (int t = 0; t < 2; t++, is++) {
                uint8_t sc, m;
                kiln_get_scale_min_k4(is, b.scales, &sc, &m);
                u->sc[is] = sc, u->m[is] = m;
            }
        }
    } else {
        kiln_block_q6_K b;
        memcpy(&b, blk, sizeof b);
        u->d = b.d;
        for (int i = 0; i < 16; i++) u->sc[i] = b.scales[i];
        const uint8_t *ql = b.ql, *qh = b.qh;
        for (int n = 0; n < 256; n += 128, ql += 64, qh += 32)
            for (int l = 0; l < 32; l++) {
                u->q[n + l] = (uint8_t)((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4);
                u->q[n + l + 32] = (uint8_t)((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4);
                u->q[n + l + 64] = (uint8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
                u->q[n + l + 96] = (uint8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
            }
    }
}

/* The reference for q4_K / q6_K: for every tile, superchunk (one 256-block), lane and load
 * of the lane, the bytes the mma fragments want (cuda_t16.h); then the scales. */
static uint8_t *reference_k(uint32_t dt, const uint8_t *w, int64_t n, int64_t k) {
    const size_t rb = row_bytes(dt, k), bb = dt == KILN_DTYPE_Q4_K ? 144 : 210;
    const int64_t tiles = (n + 15) / 16, nsc = k / 256;
    const size_t cb = 16 * bb;
    uint8_t *out = calloc((size_t)tiles * 16, rb);
    assert_non_null(out);
    for (int64_t j = 0; j < tiles; j++)
        for (int64_t sc = 0; sc < nsc; sc++) {
            uint8_t *c = out + ((size_t)j * (size_t)nsc + (size_t)sc) * cb;
            kblock u[16];
            bool have[16];
            for (int ri = 0; ri < 16; ri++) {
                const int64_t r = j * 16 + ri;
                have[ri] = r < n;
                if (have[ri])
                    unpack_k(dt, w + (size_t)r * rb + (size_t)sc * bb, &u[ri]);
                else
                    memset(&u[ri], 0, sizeof u[ri]);
            }
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane / 4, tig = lane % 4;
                /* element e of the A fragment word for 32-block blk, first (0..15) or second
                 * (16..31) half of the block: block element 16 half + 4 tig + e */
                for (int e = 0; e < 4; e++) {
                    if (dt == KILN_DTYPE_Q4_K) {
                        for (int p = 0; p < 4; p++) /* 32-blocks 2 p (low), 2 p + 1 (high) */
                            for (int word = 0; word < 4; word++) {
                                const int h = word / 2, half = word % 2;
                                const kblock *x = &u[g + 8 * h];
                                const int el = 16 * half + 4 * tig + e;
                                c[p * 512 + lane * 16 + word * 4 + e] =
                                    (uint8_t)(x->q[64 * p + el] | x->q[64 * p + 32 + el] << 4);
                            }
                    } else {
                        for (int blk = 0; blk < 8; blk++) {
                            const int ea = 32 * blk + 4 * tig + e, eb = ea + 16;
                            for (int h = 0; h < 2; h++) {
                                const kblock *x = &u[g + 8 * h];
                                c[(blk / 2) * 512 + lane * 16 + (2 * (blk % 2) + h) * 4 + e] =
                                    (uint8_t)((x->q[ea] & 15) | (x->q[eb] & 15) << 4);
                            }
                            const kblock *x0 = &u[g], *x1 = &u[g + 8];
                            c[2048 + (blk / 4) * 512 + lane * 16 + (blk % 4) * 4 + e] =
                                (uint8_t)((x0->q[ea] >> 4) << 4 | (x0->q[eb] >> 4) << 6 |
                                          (x1->q[ea] >> 4) | (x1->q[eb] >> 4) << 2);
                        }
                    }
                }
            }
            for (int ri = 0; ri < 16; ri++) {
                if (!have[ri]) continue;
                const int g = ri % 8, h = ri / 8;
                const kblock *x = &u[ri];
                if (dt == KILN_DTYPE_Q4_K) {
                    uint8_t *o = c + 2048 + 32 * g + 16 * h;
                    memcpy(o, &x->d, 2), memcpy(o + 2, &x->dmin, 2);
                    for (int i = 0; i < 8; i++) {
                        o[4 + i / 2] |= (uint8_t)((x->sc[i] & 15) << (4 * (i % 2)));
                        o[8 + i / 2] |= (uint8_t)((x->m[i] & 15) << (4 * (i % 2)));
                        o[12 + i / 4] |= (uint8_t)((x->sc[i] >> 4) << (2 * (i % 4)));
                        o[14 + i / 4] |= (uint8_t)((x->m[i] >> 4) << (2 * (i % 4)));
                    }
                } else {
                    for (int i = 0; i < 16; i++)
                        c[3072 + 32 * g + 16 * h + i] = (uint8_t)(int8_t)x->sc[i];
                    memcpy(c + 3328 + 4 * g + 2 * h, &x->d, 2);
                }
            }
        }
    return out;
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
    const bool kq = dt == KILN_DTYPE_Q4_K || dt == KILN_DTYPE_Q6_K;
    uint8_t *want = kq ? reference_k(dt, w, n, k) : reference(dt, w, n, k);
    if (memcmp(got, want, tb) != 0) {
        size_t at = 0;
        while (got[at] == want[at]) at++;
        fail_msg("cuda_t16 %s n=%lld k=%lld: repack differs from the reference at byte %zu "
                 "(got %02x, want %02x)",
                 dt_name(dt), (long long)n, (long long)k, at, got[at], want[at]);
    }
    /* the host dequantization through the layout (as the device one reads it) equals the
     * plain rows' bitwise */
    float *ref = malloc(sizeof(float) * (size_t)k), *via = malloc(sizeof(float) * (size_t)k);
    assert_true(ref && via);
    for (int64_t r = 0; r < n; r++) {
        assert_int_equal(kiln_dequantize_row(dt, w + (size_t)r * rb, ref, k, NULL), KILN_OK);
        kiln_cuda_t16_dequant_row(dt, got, k, r, via);
        for (int64_t i = 0; i < k; i++)
            if (memcmp(&ref[i], &via[i], sizeof(float)) != 0 && !(isnan(ref[i]) && isnan(via[i])))
                fail_msg("cuda_t16 %s n=%lld k=%lld: row %lld element %lld: %.9g via the layout, "
                         "%.9g plain",
                         dt_name(dt), (long long)n, (long long)k, (long long)r, (long long)i,
                         (double)via[i], (double)ref[i]);
    }
    free(via);
    if (!kq) {
        /* the offsets (which the device dequantization mirrors) and the values through them */
        const int nq = dt == KILN_DTYPE_Q4_0 ? 16 : 32, bb = dt == KILN_DTYPE_Q4_0 ? 18 : 34;
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

static void test_repack_k(void **state) {
    (void)state;
    static const int64_t ns[] = {1, 7, 16, 17, 33, 100};
    static const int64_t ks[] = {256, 512, 1280, 4096};
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
            for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++)
                one(d ? KILN_DTYPE_Q6_K : KILN_DTYPE_Q4_K, ns[i], ks[j]);
    /* the geometry the kernels hard-code (gemv_t16.cu t16k_geom) */
    assert_int_equal(kiln_cuda_t16_chunk_bytes(KILN_DTYPE_Q4_K), 2304);
    assert_int_equal(kiln_cuda_t16_chunk_bytes(KILN_DTYPE_Q6_K), 3360);
    assert_int_equal(kiln_cuda_t16_k(KILN_DTYPE_Q4_K), 256);
    assert_int_equal(kiln_cuda_t16_k(KILN_DTYPE_Q6_K), 256);
    assert_int_equal(kiln_cuda_t16_k(KILN_DTYPE_Q4_0), 128);
}

static void test_refusals(void **state) {
    (void)state;
    const kiln_layout *l = kiln_cuda_t16_layout();
    uint32_t od;
    uint64_t orb;
    kiln_err e;
    assert_int_equal(l->plan(KILN_DTYPE_Q4_0, 96, 16, 0, &od, &orb, &e), KILN_ERR_UNSUPPORTED);
    assert_int_equal(l->plan(KILN_DTYPE_Q5_K, 256, 16, 0, &od, &orb, &e), KILN_ERR_UNSUPPORTED);
    assert_int_equal(l->plan(KILN_DTYPE_Q4_K, 256, 16, 0, &od, &orb, &e), KILN_OK);
    assert_int_equal(l->plan(KILN_DTYPE_Q6_K, 128, 16, 0, &od, &orb, &e), KILN_ERR_UNSUPPORTED);
    assert_int_equal(l->plan(KILN_DTYPE_F16, 256, 16, 0, &od, &orb, &e), KILN_ERR_UNSUPPORTED);
    assert_int_equal(l->plan(KILN_DTYPE_Q8_0, 256, 16, 1, &od, &orb, &e), KILN_ERR_UNSUPPORTED);
    uint8_t src[34 * 4], dst[16 * 34 * 4];
    memset(src, 0, sizeof src);
    assert_int_equal(kiln_cuda_t16_repack(KILN_DTYPE_Q8_0, src, 34 * 3, 1, 96, dst, &e),
                     KILN_ERR_UNSUPPORTED);
    assert_false(kiln_cuda_t16_supports(KILN_DTYPE_Q4_1));
    assert_false(kiln_cuda_t16_supports(KILN_DTYPE_Q5_K));
    assert_true(kiln_cuda_t16_supports(KILN_DTYPE_Q8_0));
    assert_true(kiln_cuda_t16_supports(KILN_DTYPE_Q4_K));
    assert_true(kiln_cuda_t16_supports(KILN_DTYPE_Q6_K));
}

int main(void) {
    kt_rng_seed(&rng, 0x7431366c61796f75ull);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repack),
        cmocka_unit_test(test_repack_k),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
