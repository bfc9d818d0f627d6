/*
 * cuda_test.h — what the GPU kernel tests (tests/gpu/test_cuda_*.c) share: the run's RNG and
 * kernel context (a device scratch), CUDA calls that fail the test with their error,
 * device copies (outputs poisoned: 0xFF bytes = NaN, so an unwritten element fails), the
 * relative L2 error, and main's body (skip with the reason without a usable GPU,
 * KILN_TEST_FILTER). Each test file is its own executable: the statics are its own.
 * Include after testutil.h, under KILN_HAVE_CUDA.
 */
#ifndef KILN_TESTS_GPU_CUDA_TEST_H
#define KILN_TESTS_GPU_CUDA_TEST_H

#include "kernels/cuda/cuda_kernels.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kt_rng rng;
static kiln_kctx kc; /* stream NULL, scratch: a device buffer */

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(e_));                  \
    } while (0)

static inline void *dup_dev(const void *h, size_t n) {
    void *d = NULL;
    CK(cudaMalloc(&d, n ? n : 16));
    if (n) CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}
static inline void *poisoned(size_t n) {
    void *d = NULL;
    CK(cudaMalloc(&d, n ? n : 16));
    CK(cudaMemset(d, 0xFF, n ? n : 16));
    return d;
}
static inline void get(void *h, const void *d, size_t n) {
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}

/* ||a - b|| / ||b|| over n floats with strides; NaN -> inf */
static inline double relerr(const float *a, const float *b, int64_t rows, int64_t n, int64_t as,
                            int64_t bs) {
    double num = 0, den = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) {
            double x = a[r * as + i], y = b[r * bs + i];
            if (isnan(x) || isinf(x)) return INFINITY;
            num += (x - y) * (x - y);
            den += y * y;
        }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#define CHECK_ERR(what, e, tol)                                                                    \
    do {                                                                                           \
        double e__ = (e);                                                                          \
        if (!(e__ <= (tol))) fail_msg("%s: rel err %.3g > %.3g", what, e__, (double)(tol));        \
    } while (0)

/* main's body: exit 77 with the reason when no usable GPU is present (or the scratch cannot
 * be had), else the tests (KILN_TEST_FILTER=pattern: those whose names match) with rng
 * seeded and kc.scratch of scratch_bytes. */
static inline int kt_cuda_main(const char *name, const struct CMUnitTest *tests, size_t n,
                               uint64_t seed, size_t scratch_bytes) {
    char why[256] = "";
    int sm = 0;
    if (kiln_cuda_probe(&sm, why, sizeof why) <= 0) {
        printf("SKIP: %s\n", why);
        return 77;
    }
    printf("device sm_%d\n", sm);
    kt_rng_seed(&rng, seed);
    if (cudaMalloc(&kc.scratch, scratch_bytes) != cudaSuccess) {
        printf("SKIP: cudaMalloc of the scratch (%zu bytes) failed\n", scratch_bytes);
        return 77;
    }
    kc.scratch_size = scratch_bytes;
    const char *filter = getenv("KILN_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    int r = _cmocka_run_group_tests(name, tests, n, NULL, NULL);
    cudaFree(kc.scratch);
    return r;
}

#endif /* KILN_TESTS_GPU_CUDA_TEST_H */
