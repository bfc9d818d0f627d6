/*
 * matmul_f_avx2.c — float-weight matmul (f32, f16, bf16 weights; f32 activations) for
 * AVX2 + FMA + F16C. Weights are widened to f32 exactly; decode is one row at a time
 * (two accumulators); prefill is a 24-row x 4-token micro-kernel on a transposed panel
 * of widened weights (below), which needs no transposed activations (kiln_cpu_mm.xt is
 * ignored here).
 */
#include "format/dtype.h"
#include "kernels/cpu/cpu_impl.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

INLINE __m256 wload8(uint32_t dt, const uint8_t *row, int64_t i) {
    switch (dt) {
    case KILN_DTYPE_F32:
        return _mm256_loadu_ps((const float *)row + i);
    case KILN_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    default:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i))),
            16));
    }
}

INLINE float wload1(uint32_t dt, const uint8_t *row, int64_t i) {
    uint16_t h;
    switch (dt) {
    case KILN_DTYPE_F32:
        return ((const float *)row)[i];
    case KILN_DTYPE_F16:
        memcpy(&h, row + 2 * i, 2);
        return _cvtsh_ss(h);
    default: {
        memcpy(&h, row + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    }
}

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Decode: one row at a time, two accumulators. Steps of up to MMF_GEMV_T tokens (a decode
 * step of a few sequences) run the same loop with each row's weights loaded and widened
 * once for all the tokens, each token with its own two accumulators in the same order, so
 * its row is bitwise its one-token result. The prefill tile
 * keeps only NV T FMA chains at small T (latency-bound) and widens a panel first.
 * bench_cpu_matmul -d f16 -T N (tinyllama shapes, 2 threads, session 13), ms a step, panel
 * -> this, alternating binaries, two rounds: T=2 35.0 / 38.5 -> 15.3 / 21.3, T=3 36.2 / 34.6
 * -> 19.9 / 20.2, T=4 39.0 / 39.7 -> 32.1 / 25.4 (T=1 14.8-18.5). */
#define MMF_GEMV_T 4
/* Software prefetch distance of the rows' stream (bytes ahead; -DKILN_MMF_GEMV_PF=0: off, the
 * A/B build): float weights are read in place from the model's mapping (4 KiB pages), where
 * the hardware prefetchers stop at every page boundary (docs/CPU.md "Decode streaming"; the
 * R16 kernels' KILN_R16_PF is the same idea). */
#ifndef KILN_MMF_GEMV_PF
#define KILN_MMF_GEMV_PF 2048
#endif
INLINE void gemv_rows_t(uint32_t dt, int T, const kiln_cpu_mm *p, int64_t r0, int64_t r1) {
    const int64_t k = p->k;
    const float *x[MMF_GEMV_T];
    for (int t = 0; t < T; t++) x[t] = p->x + t * p->x_stride;
    const int64_t es = dt == KILN_DTYPE_F32 ? 4 : 2;
    /* one prefetch per 64-byte line: every iteration (16 elements) for f32, every second
     * for 2-byte types */
    const int64_t pf_mask = es == 4 ? 0 : 16;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = p->w + r * p->w_row_bytes;
        __m256 a0[MMF_GEMV_T], a1[MMF_GEMV_T];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a0[t] = a1[t] = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= k; i += 16) {
            if (KILN_MMF_GEMV_PF > 0 && !(i & pf_mask))
                _mm_prefetch((const char *)row + i * es + KILN_MMF_GEMV_PF, _MM_HINT_T0);
            const __m256 w0 = wload8(dt, row, i), w1 = wload8(dt, row, i + 8);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + i), a0[t]);
                a1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[t] + i + 8), a1[t]);
            }
        }
        if (i + 8 <= k) {
            const __m256 w0 = wload8(dt, row, i);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + i), a0[t]);
            i += 8;
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float s = hsum8(_mm256_add_ps(a0[t], a1[t]));
            for (int64_t j = i; j < k; j++) s += wload1(dt, row, j) * x[t][j];
            p->y[t * p->y_stride + r] = s + (p->bias ? p->bias[r] : 0);
        }
    }
}
INLINE void gemv_small(uint32_t dt, const kiln_cpu_mm *p, int64_t r0, int64_t r1) {
    switch (p->t) {
    case 1:
        gemv_rows_t(dt, 1, p, r0, r1);
        break;
    case 2:
        gemv_rows_t(dt, 2, p, r0, r1);
        break;
    case 3:
        gemv_rows_t(dt, 3, p, r0, r1);
        break;
    default:
        gemv_rows_t(dt, 4, p, r0, r1);
        break;
    }
}

/* ---- prefill, row-vectorized (the default for t > 1 since session 4) ----
 * 24 weight rows are widened FKB elements at a time into a transposed panel (for each
 * element, the 24 rows' f32 weights side by side: three ymm; f16 weights stay f16 there,
 * FKBH elements at a time, and the micro-kernel converts as it loads: widen_h), and a 24-row x
 * 4-token micro-kernel broadcasts each token's activation x[t][i] (no transposed activations) over
 * the three weight vectors: 12 accumulators, per element 3 vector loads, 4 broadcasts, 12 FMAs
 * (k24x4, inline asm: in C, GCC spilled the accumulators). The accumulators are 8 consecutive rows
 * of one token, so they live in y between k blocks (contiguous loads and stores), and the result
 * needs no scatter. Each (row, token) sum is the FMA chain over k in order, the same bits as
 * micro_xt() and as the 16-row x 6-token tile this replaced in session 15 (2 loads + 6 broadcasts
 * per 12 FMAs): `taskset -c 1 bench_cpu_matmul -t 1 -r 5 -b 0 -D 0 -i avx2 -d f16`,
 * alternating, 69.3 -> 72.6 GFLOP/s (medians of 5); tinyllama f16 pp128 2 threads +3.6 %
 * (median of 6 pairs, docs/CPU.md).
 * Loop order: k block, then the item's row groups, then token tiles: the block's
 * activations of all tokens (t x FKB floats) stay in L2 across the groups, the group's
 * panel (42 KB at FKB 448) in L1 / L2 across the tokens. Work items are multiples of 48
 * rows (matmul.c). FKB: each tile loads and stores its 12 accumulators from y once per k
 * block (4 token rows a y_stride apart, L2 and beyond): at FKB 256 (a 24 KB panel that fit
 * L1) those loads were ~12 % of the kernel's samples; 320-768 all ran ~10 % faster than
 * 256 (`taskset -c 1 bench_cpu_matmul -t 1 -r 3 -b 0 -D 0 -P 2 -i avx2 -d f16,bf16`, three
 * rounds, session 17: f16 66 -> 71-73 GFLOP/s), the panel's loads from L2 cost less than
 * the accumulators' round trips. At two threads on this VM no difference showed (bench -t 2
 * ~119 GFLOP/s both; tinyllama f16 pp128 within the spread, 4 pairs). */
#define FKB KILN_CPU_MMF_AVX2_FKB
#define FTT 4 /* tokens per tile (at most) */

/* 8 rows x 8 floats (v[r] = row r) -> v[e] = element e of the 8 rows. */
INLINE void tr8(__m256 v[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
        v[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
    }
}

/* Rows [r, r + nr) (nr <= 8 NV), elements [k0, k0 + kb), widened into wp[i][8 NV]; rows
 * past nr are zero. */
INLINE void widen_t(int NV, uint32_t dt, const kiln_cpu_mm *p, int64_t r, int nr, int64_t k0,
                    int64_t kb, float *wp) {
    const int RW = 8 * NV;
    int64_t i = 0;
    if (nr == RW)
        for (; i + 8 <= kb; i += 8)
            for (int h = 0; h < NV; h++) {
                __m256 v[8];
                for (int j = 0; j < 8; j++)
                    v[j] = wload8(dt, p->w + (r + 8 * h + j) * p->w_row_bytes, k0 + i);
                tr8(v);
                for (int e = 0; e < 8; e++) _mm256_store_ps(wp + (i + e) * RW + 8 * h, v[e]);
            }
    for (; i < kb; i++)
        for (int j = 0; j < RW; j++)
            wp[i * RW + j] = j < nr ? wload1(dt, p->w + (r + j) * p->w_row_bytes, k0 + i) : 0.0f;
}

/* f16 weights keep f16 in the panel (KILN_MMF_PANEL_H; the micro-kernel converts with
 * vcvtph2ps from memory, which issued beside the 12 FMAs per element at the same rate as
 * vmovaps in a microbenchmark on Zen 3: 92.8-94.1 vs 91.6-94.4 GFLOP/s one core): half the
 * panel's bytes per element (so a longer k block, FKBH 768 in 36 KB, and fewer round trips of
 * the tile's sums through y), half the stores and half the shuffles of the f32 transpose, the same
 * f32 values in the same FMA chains (vcvtph2ps is exact): the same bits. Rows [r, r + nr), elements
 * [k0, k0 + kb) into wh[i][8 NV]; rows past nr are zero. 16 elements of 8 rows per step: one 8 x 8
 * transpose of 16-bit lanes in each 128-bit half (24 unpacks for two), the low halves are elements
 * i..i+7, the high halves i+8..i+15. */
#ifndef KILN_MMF_PANEL_H
#define KILN_MMF_PANEL_H 1 /* -DKILN_MMF_PANEL_H=0: f16 widened to an f32 panel, the A/B build */
#endif
/* The f16 panel's k block: 768 (36 KB) ran faster than 448 / 640 in 6 of 6 in-process pairs
 * each (scripts/mmf-ab.sh, tinyllama's three matmul shapes, one core), 896 the same as 768 */
#ifndef KILN_CPU_MMF_AVX2_FKBH
#define KILN_CPU_MMF_AVX2_FKBH 768
#endif
#define FKBH KILN_CPU_MMF_AVX2_FKBH
_Static_assert(FKBH <= 2 * FKB, "the f16 panel must fit the f32 panel's scratch");
INLINE void widen_h(int NV, const kiln_cpu_mm *p, int64_t r, int nr, int64_t k0, int64_t kb,
                    uint16_t *wh) {
    const int RW = 8 * NV;
    int64_t i = 0;
    if (nr == RW)
        for (; i + 16 <= kb; i += 16)
            for (int h = 0; h < NV; h++) {
                __m256i a[8], b[8];
                for (int j = 0; j < 8; j++)
                    a[j] = _mm256_loadu_si256(
                        (const __m256i *)((const uint16_t *)(p->w +
                                                             (r + 8 * h + j) * p->w_row_bytes) +
                                          k0 + i));
                for (int j = 0; j < 4; j++) { /* pairs of rows: 16-bit interleave */
                    b[2 * j] = _mm256_unpacklo_epi16(a[2 * j], a[2 * j + 1]);
                    b[2 * j + 1] = _mm256_unpackhi_epi16(a[2 * j], a[2 * j + 1]);
                }
                for (int j = 0; j < 2; j++) { /* quads of rows: 32-bit interleave */
                    a[4 * j + 0] = _mm256_unpacklo_epi32(b[4 * j], b[4 * j + 2]);
                    a[4 * j + 1] = _mm256_unpackhi_epi32(b[4 * j], b[4 * j + 2]);
                    a[4 * j + 2] = _mm256_unpacklo_epi32(b[4 * j + 1], b[4 * j + 3]);
                    a[4 * j + 3] = _mm256_unpackhi_epi32(b[4 * j + 1], b[4 * j + 3]);
                }
                for (int j = 0; j < 4; j++) { /* all 8 rows: 64-bit interleave */
                    b[2 * j] = _mm256_unpacklo_epi64(a[j], a[4 + j]);
                    b[2 * j + 1] = _mm256_unpackhi_epi64(a[j], a[4 + j]);
                }
                /* b[e]: element e (low half) and e + 8 (high half) of the 8 rows */
                for (int j = 0; j < 8; j++) {
                    uint16_t *d = wh + (i + j) * RW + 8 * h;
                    _mm_storeu_si128((__m128i *)d, _mm256_castsi256_si128(b[j]));
                    _mm_storeu_si128((__m128i *)(d + 8 * RW), _mm256_extracti128_si256(b[j], 1));
                }
            }
    for (; i < kb; i++)
        for (int j = 0; j < RW; j++) {
            uint16_t v = 0;
            if (j < nr) memcpy(&v, p->w + (r + j) * p->w_row_bytes + 2 * (k0 + i), 2);
            wh[i * RW + j] = v;
        }
}

/* The 24-row x 4-token tile's loop over 16-element chunks (n of them), in inline asm: per
 * element 3 panel loads, 4 broadcasts and 12 FMAs, the 12 accumulators in registers (as C,
 * GCC spilled them beside the 3 weights and the broadcast). Each accumulator is the same FMA
 * chain in k order as the C loop (vfmadd231ps: acc = w * x + acc, one rounding). */
#define K24_EL(X, A, B, C)                                                                         \
    "vbroadcastss \\j*4" X ", %%ymm15\n\t"                                                         \
    "vfmadd231ps %%ymm12, %%ymm15, %%ymm" A "\n\t"                                                 \
    "vfmadd231ps %%ymm13, %%ymm15, %%ymm" B "\n\t"                                                 \
    "vfmadd231ps %%ymm14, %%ymm15, %%ymm" C "\n\t"
#define K24_ACC(OP)                                                                                \
    OP "0*32(%[acc]), %%ymm0\n\t" OP "1*32(%[acc]), %%ymm1\n\t" OP "2*32(%[acc]), %%ymm2\n\t" OP   \
       "3*32(%[acc]), %%ymm3\n\t" OP "4*32(%[acc]), %%ymm4\n\t" OP "5*32(%[acc]), %%ymm5\n\t" OP   \
       "6*32(%[acc]), %%ymm6\n\t" OP "7*32(%[acc]), %%ymm7\n\t" OP "8*32(%[acc]), %%ymm8\n\t" OP   \
       "9*32(%[acc]), %%ymm9\n\t" OP "10*32(%[acc]), %%ymm10\n\t" OP "11*32(%[acc]), %%ymm11\n\t"
#define K24_ST                                                                                     \
    "vmovups %%ymm0, 0*32(%[acc])\n\t vmovups %%ymm1, 1*32(%[acc])\n\t"                            \
    "vmovups %%ymm2, 2*32(%[acc])\n\t vmovups %%ymm3, 3*32(%[acc])\n\t"                            \
    "vmovups %%ymm4, 4*32(%[acc])\n\t vmovups %%ymm5, 5*32(%[acc])\n\t"                            \
    "vmovups %%ymm6, 6*32(%[acc])\n\t vmovups %%ymm7, 7*32(%[acc])\n\t"                            \
    "vmovups %%ymm8, 8*32(%[acc])\n\t vmovups %%ymm9, 9*32(%[acc])\n\t"                            \
    "vmovups %%ymm10, 10*32(%[acc])\n\t vmovups %%ymm11, 11*32(%[acc])\n\t"
/* acc[v][t] (v < 3, t < 4: the array is [3][FTT = 4]) lives in ymm(4 v + t). LD loads one
 * 8-row weight vector (vmovaps of the f32 panel, vcvtph2ps of the f16 one), ES is the
 * panel's bytes per element (96 or 48), O1 / O2 the second and third vectors' offsets. */
#define K24_LOOP(LD, ES, O1, O2, STEP)                                                             \
    K24_ACC("vmovups ")                                                                            \
    "1:\n\t"                                                                                       \
    "prefetcht0 128(%[x0])\n\t"                                                                    \
    "prefetcht0 128(%[x0],%[rs],1)\n\t"                                                            \
    "prefetcht0 128(%[x0],%[rs],2)\n\t"                                                            \
    "prefetcht0 128(%[x0],%[r3],1)\n\t"                                                            \
    ".irp j,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n\t" LD " \\j*" ES "(%[w]), %%ymm12\n\t" LD      \
    " \\j*" ES "+" O1 "(%[w]), %%ymm13\n\t" LD " \\j*" ES "+" O2                                   \
    "(%[w]), %%ymm14\n\t" K24_EL("(%[x0])", "0", "4", "8")                                         \
        K24_EL("(%[x0],%[rs],1)", "1", "5", "9") K24_EL("(%[x0],%[rs],2)", "2", "6", "10")         \
            K24_EL("(%[x0],%[r3],1)", "3", "7", "11") ".endr\n\t"                                  \
                                                      "add $" STEP ", %[w]\n\t"                    \
                                                      "add $64, %[x0]\n\t"                         \
                                                      "dec %[n]\n\t"                               \
                                                      "jnz 1b\n\t" K24_ST
#define K24_OPS                                                                                    \
    : [w] "+r"(w), [x0] "+r"(x0), [n] "+r"(n)                                                      \
    : [acc] "r"(&acc[0][0]), [rs] "r"(rs), [r3] "r"(r3)                                            \
    : "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", "ymm9", "ymm10",     \
      "ymm11", "ymm12", "ymm13", "ymm14", "ymm15", "cc", "memory"
INLINE void k24x4(int PH, __m256 acc[3][FTT], const void *w, const float *const x[FTT], int64_t n) {
    const float *x0 = x[0];
    const int64_t rs = (const char *)x[1] - (const char *)x[0], r3 = 3 * rs;
    if (PH)
        __asm__ volatile(K24_LOOP("vcvtph2ps", "48", "16", "32", "768") K24_OPS);
    else
        __asm__ volatile(K24_LOOP("vmovaps", "96", "32", "64", "1536") K24_OPS);
}
#undef K24_LOOP
#undef K24_OPS
#undef K24_ACC
#undef K24_ST
#undef K24_EL

/* One 8-row weight vector at element offset off of the panel (f32, or f16 when PH) */
INLINE __m256 pload(int PH, const void *wp, int64_t off) {
    return PH ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)wp + off)))
              : _mm256_load_ps((const float *)wp + off);
}

/* Tokens [t0, t0 + T) x 8 NV rows at column r of y over elements [k0, k0 + kb); nr valid
 * rows (masked loads and stores below 8 NV). PH: the panel holds f16. */
INLINE void micro_rv(int NV, int T, int PH, const kiln_cpu_mm *p, const void *wp, int64_t k0,
                     int64_t kb, int64_t t0, int64_t r, int nr, bool first, bool last) {
    const int RW = 8 * NV;
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 acc[3][FTT];
    const float *x[FTT];
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) {
        x[t] = p->x + (t0 + t) * p->x_stride + k0;
        float *y = p->y + (t0 + t) * p->y_stride + r;
#pragma GCC unroll 3
        for (int v = 0; v < NV; v++)
            acc[v][t] =
                first ? _mm256_setzero_ps()
                : nr == RW
                    ? _mm256_loadu_ps(y + 8 * v)
                    : _mm256_maskload_ps(y + 8 * v,
                                         _mm256_cmpgt_epi32(_mm256_set1_epi32(nr - 8 * v), iota));
    }
    int64_t i = 0;
    if (NV == 3 && T == 4 && kb >= 16) {
        k24x4(PH, acc, wp, x, kb / 16);
        i = kb / 16 * 16;
    }
    /* 16 elements per iteration with constant offsets: one index step and one branch per
     * 16 elements (the per-element loop spent ~10 scalar uops on pointer steps, the
     * prefetch test and two branches beside its FMAs); the same FMA chain in k order */
    for (; i + 16 <= kb; i += 16) {
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) /* the T activation rows come from L2: the next line */
            _mm_prefetch((const char *)(x[t] + i + 32), _MM_HINT_T0);
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) {
            __m256 w[3];
#pragma GCC unroll 3
            for (int v = 0; v < NV; v++) w[v] = pload(PH, wp, RW * (i + j) + 8 * v);
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) {
                const __m256 xv = _mm256_broadcast_ss(x[t] + i + j);
#pragma GCC unroll 3
                for (int v = 0; v < NV; v++) acc[v][t] = _mm256_fmadd_ps(w[v], xv, acc[v][t]);
            }
        }
    }
    for (; i < kb; i++) {
        __m256 w[3];
#pragma GCC unroll 3
        for (int v = 0; v < NV; v++) w[v] = pload(PH, wp, RW * i + 8 * v);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            const __m256 xv = _mm256_broadcast_ss(x[t] + i);
#pragma GCC unroll 3
            for (int v = 0; v < NV; v++) acc[v][t] = _mm256_fmadd_ps(w[v], xv, acc[v][t]);
        }
    }
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) {
        float *y = p->y + (t0 + t) * p->y_stride + r;
#pragma GCC unroll 3
        for (int v = 0; v < NV; v++) {
            const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr - 8 * v), iota);
            if (last && p->bias)
                acc[v][t] = _mm256_add_ps(acc[v][t], _mm256_maskload_ps(p->bias + r + 8 * v, m));
            if (nr == RW)
                _mm256_storeu_ps(y + 8 * v, acc[v][t]);
            else
                _mm256_maskstore_ps(y + 8 * v, m, acc[v][t]);
        }
    }
}

/* One tile of T (1-4) tokens, with T a compile-time constant in each micro_rv. */
#define TILE_CASE(N)                                                                               \
    case N:                                                                                        \
        micro_rv(NV, N, PH, p, wp, k0, kb, t0, r, nr, first, last);                                \
        break
INLINE void tile_rv(int NV, int T, int PH, const kiln_cpu_mm *p, const void *wp, int64_t k0,
                    int64_t kb, int64_t t0, int64_t r, int nr, bool first, bool last) {
    switch (T) {
        TILE_CASE(4);
        TILE_CASE(3);
        TILE_CASE(2);
        TILE_CASE(1);
    default:
        break;
    }
}
#undef TILE_CASE

/* The next panel's weights (rows [r, r + nr), elements [k0, k0 + kb)), asked for a few
 * lines per token tile while the current panel's tiles run. Without it the widening waited
 * on DRAM (the weights of a prefill step stream from memory once, 24 rows at a time: 192
 * cache lines per f16 panel, more streams than the hardware prefetchers follow): 23 % of
 * the kernel's samples in `perf annotate` on tinyllama f16 pp128, against the ~6 % its
 * instructions cost. */
#ifndef KILN_MMF_PANEL_PF
#define KILN_MMF_PANEL_PF 1 /* -DKILN_MMF_PANEL_PF=0: off, the A/B build */
#endif
typedef struct pf_panel {
    const char *row; /* the row being asked for */
    size_t rs;
    int64_t lpr, b, n; /* lines per row, next line in the row, lines left */
} pf_panel;
INLINE void pf_init(pf_panel *q, uint32_t dt, const kiln_cpu_mm *p, int64_t r, int nr, int64_t k0,
                    int64_t kb) {
    const int64_t es = dt == KILN_DTYPE_F32 ? 4 : 2;
    q->row = (const char *)p->w + (size_t)r * p->w_row_bytes + k0 * es;
    q->rs = p->w_row_bytes;
    q->lpr = (kb * es + 63) / 64;
    q->b = 0;
    q->n = nr > 0 ? q->lpr * nr : 0;
}
INLINE void pf_some(pf_panel *q, int64_t m) {
    for (m = m < q->n ? m : q->n, q->n -= m; m > 0; m--) {
        _mm_prefetch(q->row + 64 * q->b, _MM_HINT_T1);
        if (++q->b == q->lpr) q->b = 0, q->row += q->rs;
    }
}

/* The next tile's accumulators (4 token rows of y, 24 floats each at column r), asked for
 * while the current tile runs: they are loaded (stored, in the first k block) at the
 * tile's start from 4 rows a y_stride apart, which left L1 since the last k block. */
#ifndef KILN_MMF_Y_PF
#define KILN_MMF_Y_PF 1 /* -DKILN_MMF_Y_PF=0: off, the A/B build */
#endif
INLINE void pf_tile_y(const kiln_cpu_mm *p, int64_t t0, int64_t r) {
    const int64_t te = t0 + FTT < p->t ? t0 + FTT : p->t;
    for (int64_t t = t0; t < te; t++) {
        const char *y = (const char *)(p->y + t * p->y_stride + r);
        _mm_prefetch(y, _MM_HINT_T0);
        _mm_prefetch(y + 64, _MM_HINT_T0);
        _mm_prefetch(y + 95, _MM_HINT_T0);
    }
}

/* NV 3: 24 rows x 4 tokens (3 panel loads and 4 broadcasts per 12 FMAs). NV 2 (16 rows)
 * would need tiles of 6 tokens to keep 12 FMA chains. */
INLINE void gemm_rv(int NV, uint32_t dt, const kiln_cpu_mm *p, int64_t r0, int64_t r1, float *wp) {
    const int RW = 8 * NV, FT = FTT;
    const int PH = KILN_MMF_PANEL_H && dt == KILN_DTYPE_F16;
    const int64_t KB = PH ? FKBH : FKB;
    for (int64_t k0 = 0; k0 < p->k; k0 += KB) {
        const int64_t kb = p->k - k0 < KB ? p->k - k0 : KB;
        const bool first = k0 == 0, last = k0 + kb == p->k;
        for (int64_t r = r0; r < r1; r += RW) {
            const int nr = r1 - r < RW ? (int)(r1 - r) : RW;
            if (PH)
                widen_h(NV, p, r, nr, k0, kb, (uint16_t *)wp);
            else
                widen_t(NV, dt, p, r, nr, k0, kb, wp);
            pf_panel q = {0};
            if (r + RW < r1) /* the next row group, same elements */
                pf_init(&q, dt, p, r + RW, r1 - r - RW < RW ? (int)(r1 - r - RW) : RW, k0, kb);
            else if (k0 + kb < p->k) /* the first row group of the next block */
                pf_init(&q, dt, p, r0, r1 - r0 < RW ? (int)(r1 - r0) : RW, k0 + kb,
                        p->k - k0 - kb < KB ? p->k - k0 - kb : KB);
            else
                q.n = 0;
            if (!KILN_MMF_PANEL_PF) q.n = 0;
            const int64_t ntile = (p->t + FT - 1) / FT, per = (q.n + ntile - 1) / ntile;
            /* full tiles, then the rest: a tile of T tokens keeps NV T FMA chains, and the
             * two FMA pipes need 8 to hide the latency, so a short tail shares the last full
             * tile (FT + rest as two tiles) */
            const int64_t rt = p->t % FT, tfull = p->t >= FT ? p->t - rt - (rt ? FT : 0) : 0;
            int64_t t0 = 0;
            for (; t0 < tfull; t0 += FT) {
                if (KILN_MMF_Y_PF) pf_tile_y(p, t0 + FT, r);
                tile_rv(NV, FT, PH, p, wp, k0, kb, t0, r, nr, first, last);
                pf_some(&q, per);
            }
            pf_some(&q, q.n);
            if (p->t - t0 > FT) { /* two tiles */
                const int a = (int)((p->t - t0 + 1) / 2);
                tile_rv(NV, a, PH, p, wp, k0, kb, t0, r, nr, first, last);
                t0 += a;
            }
            tile_rv(NV, (int)(p->t - t0), PH, p, wp, k0, kb, t0, r, nr, first, last);
        }
    }
}

INLINE void mmf_rows(uint32_t dt, const kiln_cpu_mm *p, int64_t r0, int64_t r1, float *wp) {
    if (p->t <= MMF_GEMV_T)
        gemv_small(dt, p, r0, r1);
    else
        gemm_rv(3, dt, p, r0, r1, wp);
}

void kiln_cpu_mmf_avx2(const kiln_cpu_mm *pp, int64_t r0, int64_t r1, uint8_t *panel) {
    /* a private copy: the caller's struct shares cache lines with its stack, and y
     * stores would otherwise force reloads of it (false sharing between threads) */
    const kiln_cpu_mm m = *pp, *p = &m;
    switch (p->dtype) {
    case KILN_DTYPE_F32:
        mmf_rows(KILN_DTYPE_F32, p, r0, r1, (float *)panel);
        break;
    case KILN_DTYPE_F16:
        mmf_rows(KILN_DTYPE_F16, p, r0, r1, (float *)panel);
        break;
    default:
        mmf_rows(KILN_DTYPE_BF16, p, r0, r1, (float *)panel);
        break;
    }
}
