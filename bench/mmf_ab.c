/*
 * mmf_ab.c — in-process A/B of two builds of the AVX2 float-weight kernel
 * (kiln_cpu_mmf_avx2), for a shared, noisy machine: both run in one process on one thread,
 * alternating pass by pass over the same weights and activations; each side keeps its best
 * pass. Built by scripts/mmf-ab.sh, which compiles matmul_f_avx2.c twice (a git revision's
 * or the working tree's, each with its own -D flags) as old_mmf / new_mmf.
 *
 *   mmf_ab DTYPE N K T MB REPS   a pass = one call per matrix of a set of N x K matrices
 *                                 filling MB megabytes (above the L3: weights from DRAM, as
 *                                 in a model's prefill step); T tokens
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

void old_mmf(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel);
void new_mmf(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: mmf_ab DTYPE N K T MB REPS\n");
        return 2;
    }
    const char *dn = argv[1];
    const int64_t n = atoll(argv[2]), k = atoll(argv[3]), T = atoll(argv[4]), mb = atoll(argv[5]);
    const int reps = atoi(argv[6]);
    uint32_t dt = KILN_DTYPE_COUNT;
    for (uint32_t d = 0; d < KILN_DTYPE_COUNT; d++) {
        const char *s = kiln_dtype_name(d);
        if (s && !strcmp(s, dn)) dt = d;
    }
    size_t rb;
    if ((dt != KILN_DTYPE_F16 && dt != KILN_DTYPE_BF16 && dt != KILN_DTYPE_F32) || n < 1 || k < 1 ||
        T < 2 || mb < 1 || reps < 1 || kiln_dtype_row_bytes(dt, k, &rb, NULL)) {
        fprintf(stderr, "mmf_ab: bad arguments\n");
        return 2;
    }
    const size_t msz = rb * (size_t)n;
    const int64_t nm = ((int64_t)mb << 20) / (int64_t)msz + 1;
    uint8_t *w = kiln_alloc_aligned(msz * (size_t)nm);
    float *x = kiln_alloc_aligned(sizeof(float) * (size_t)(k * T));
    float *y0 = kiln_alloc_aligned(sizeof(float) * (size_t)(n * T));
    float *y1 = kiln_alloc_aligned(sizeof(float) * (size_t)(n * T));
    uint8_t *panel = kiln_alloc_aligned(kiln_cpu_mmf_panel_bytes(k, T));
    if (!w || !x || !y0 || !y1 || !panel) {
        fprintf(stderr, "mmf_ab: out of memory\n");
        return 1;
    }
    srand(1);
    for (size_t i = 0; i < msz * (size_t)nm; i += 2) { /* f16 / bf16 in [-1, 1), no inf / NaN */
        const uint16_t h = (uint16_t)((rand() & 0x3bff) | (rand() & 1 ? 0x8000 : 0));
        memcpy(w + i, &h, 2);
    }
    if (dt == KILN_DTYPE_F32)
        for (size_t i = 0; i < msz * (size_t)nm; i += 4) {
            const float f = (float)(rand() % 2001 - 1000) * 1e-3f;
            memcpy(w + i, &f, 4);
        }
    for (int64_t i = 0; i < k * T; i++) x[i] = (float)(rand() % 2001 - 1000) * 1e-3f;
    kiln_cpu_mm m = {.dtype = dt,
                     .w = w,
                     .w_row_bytes = rb,
                     .n = n,
                     .k = k,
                     .x = x,
                     .x_stride = k,
                     .t = T,
                     .y = y0,
                     .y_stride = n};
    double bo = 1e30, bn = 1e30;
    for (int r = 0; r < reps; r++) {
        for (int side = 0; side < 2; side++) {
            const bool first_old = r % 2 == 0, old = side == 0 ? first_old : !first_old;
            m.y = old ? y0 : y1;
            const double t0 = now();
            for (int64_t j = 0; j < nm; j++) {
                m.w = w + (size_t)j * msz;
                (old ? old_mmf : new_mmf)(&m, 0, n, panel);
            }
            const double dtm = now() - t0;
            double *b = old ? &bo : &bn;
            if (dtm < *b) *b = dtm;
        }
    }
    const bool same = memcmp(y0, y1, sizeof(float) * (size_t)(n * T)) == 0;
    const double fl = 2.0 * (double)n * (double)k * (double)T * (double)nm;
    printf(
        "%s prefill n %lld k %lld t %lld x %lld matrices: old %.1f new %.1f GFLOP/s (x%.3f) %s\n",
        dn, (long long)n, (long long)k, (long long)T, (long long)nm, fl / bo * 1e-9, fl / bn * 1e-9,
        bo / bn, same ? "bitwise equal" : "DIFFER");
    kiln_free_aligned(w), kiln_free_aligned(x), kiln_free_aligned(y0), kiln_free_aligned(y1);
    kiln_free_aligned(panel);
    return same ? 0 : 1;
}
