/*
 * r16_ab.c — in-process A/B of two builds of the AVX2 R16 kernel (kiln_cpu_mmr16_avx2),
 * for a shared, noisy machine: both run in one process, alternating call by call on the
 * same weights and activations, one thread, and each side keeps its best time. Built by
 * scripts/r16-ab.sh, which compiles matmul_r16_avx2.c of a git revision as old_mmr16 and
 * the working tree's as new_mmr16 and links both against a build's libkiln.a.
 *
 *   r16_ab DTYPE N K T REPS    T > 1: prefill GFLOP/s; T = 1: decode GB/s (50 calls per timing)
 *
 * Also checks that the two give bitwise the same y.
 */
#include "base/mem.h"
#include "format/dtype.h"
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void old_mmr16(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel);
void new_mmr16(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: r16_ab DTYPE N K T REPS\n");
        return 2;
    }
    const char *dn = argv[1];
    const int64_t n = atoll(argv[2]), k = atoll(argv[3]), T = atoll(argv[4]);
    const int reps = atoi(argv[5]);
    uint32_t dt = KILN_DTYPE_COUNT;
    for (uint32_t d = 0; d < KILN_DTYPE_COUNT; d++) {
        const char *s = kiln_dtype_name(d);
        if (s && !strcmp(s, dn)) dt = d;
    }
    size_t rb, sz;
    if (dt == KILN_DTYPE_COUNT || !kiln_cpu_r16_supports(dt) || n < 1 || T < 1 || reps < 1 ||
        kiln_dtype_row_bytes(dt, k, &rb, NULL) || kiln_cpu_r16_size(dt, n, k, &sz, NULL)) {
        fprintf(stderr, "r16_ab: bad arguments\n");
        return 2;
    }
    uint8_t *w = malloc(rb * (size_t)n);
    uint8_t *wr = kiln_alloc_aligned(sz);
    const size_t as = kiln_q8act_row_bytes(k);
    uint8_t *act = kiln_alloc_aligned(as * (size_t)T);
    float *x = malloc(sizeof(float) * (size_t)k);
    float *y0 = kiln_alloc_aligned(sizeof(float) * (size_t)(n * T));
    float *y1 = kiln_alloc_aligned(sizeof(float) * (size_t)(n * T));
    uint8_t *panel = kiln_alloc_aligned(kiln_cpu_r16_panel_bytes(k));
    if (!w || !wr || !act || !x || !y0 || !y1 || !panel) {
        fprintf(stderr, "r16_ab: out of memory\n");
        return 1;
    }
    srand(1);
    for (size_t i = 0; i < rb * (size_t)n; i++) w[i] = (uint8_t)rand();
    for (size_t i = 0; i + 1 < rb * (size_t)n; i += 2) /* no f16 inf / NaN in scale fields */
        if ((w[i + 1] & 0x7c) == 0x7c) w[i + 1] &= (uint8_t)~0x40;
    if (kiln_cpu_r16_repack(dt, w, rb, n, k, wr, NULL)) {
        fprintf(stderr, "r16_ab: repack failed\n");
        return 1;
    }
    for (int64_t t = 0; t < T; t++) {
        for (int64_t i = 0; i < k; i++) x[i] = (float)(rand() % 2001 - 1000) * 1e-3f;
        kiln_cpu_q8act_avx2(x, k, act + (size_t)t * as);
    }
    kiln_cpu_mm m = {.dtype = dt,
                     .w = wr,
                     .n = n,
                     .k = k,
                     .act = act,
                     .act_stride = as,
                     .t = T,
                     .y = y0,
                     .y_stride = n};
    const int calls = T == 1 ? 50 : 1;
    double bo = 1e30, bn = 1e30;
    for (int r = 0; r < reps; r++) {
        m.y = y0;
        double t0 = now();
        for (int i = 0; i < calls; i++) old_mmr16(&m, 0, n, panel);
        double t1 = now();
        if (t1 - t0 < bo) bo = t1 - t0;
        m.y = y1;
        t0 = now();
        for (int i = 0; i < calls; i++) new_mmr16(&m, 0, n, panel);
        t1 = now();
        if (t1 - t0 < bn) bn = t1 - t0;
    }
    const bool same = memcmp(y0, y1, sizeof(float) * (size_t)(n * T)) == 0;
    if (T == 1)
        printf("%s decode n %lld k %lld: old %.2f new %.2f GB/s (x%.3f) %s\n", dn, (long long)n,
               (long long)k, (double)sz * calls / bo * 1e-9, (double)sz * calls / bn * 1e-9,
               bo / bn, same ? "bitwise equal" : "DIFFER");
    else {
        const double fl = 2.0 * (double)n * (double)k * (double)T;
        printf("%s prefill n %lld k %lld t %lld: old %.1f new %.1f GFLOP/s (x%.3f) %s\n", dn,
               (long long)n, (long long)k, (long long)T, fl / bo * 1e-9, fl / bn * 1e-9, bo / bn,
               same ? "bitwise equal" : "DIFFER");
    }
    free(w), free(x);
    kiln_free_aligned(wr), kiln_free_aligned(act), kiln_free_aligned(y0), kiln_free_aligned(y1);
    kiln_free_aligned(panel);
    return same ? 0 : 1;
}
