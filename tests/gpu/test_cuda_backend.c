/*
 * test_cuda_backend.c — the CUDA backend's buffer interface (runtime/backend_cuda.c)
 * through the checked wrappers of runtime/backend.h: device and pinned allocations, h2d,
 * memset, d2d, d2h round trips of random bytes at ragged offsets and sizes, a device
 * kernel (cuda.add) reading and writing those buffers on the device's queue, and the
 * errors: a missing ordinal is KILN_ERR_DEVICE, an impossible allocation KILN_ERR_NOMEM,
 * an out-of-range copy KILN_ERR_RANGE (never a fault). Exits 77 without a usable GPU.
 */
#include "testutil.h"

#include <stdio.h>

#ifndef KILN_HAVE_CUDA
int main(void) {
    printf("SKIP: kiln was built without CUDA (-DKILN_CUDA=OFF)\n");
    return 77;
}
#else
#include "kernels/cuda/cuda_kernels.h"
#include "runtime/backend_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_round_trip(void **state) {
    (void)state;
    kiln_device dev;
    kiln_err err = {0};
    assert_int_equal(kiln_device_open(&kiln_backend_cuda, 0, &dev, &err), KILN_OK);
    assert_non_null(dev.queue);
    kt_rng r;
    kt_rng_seed(&r, 17);
    const size_t sizes[] = {1, 15, 4096, 100003, (size_t)5 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        const size_t n = sizes[i];
        kiln_buf a, b, st;
        assert_int_equal(kiln_buf_alloc(&dev, KILN_MEM_DEVICE, n + 64, &a, &err), KILN_OK);
        assert_int_equal(kiln_buf_alloc(&dev, KILN_MEM_DEVICE, n + 64, &b, &err), KILN_OK);
        assert_int_equal(kiln_buf_alloc(&dev, KILN_MEM_STAGING, n + 64, &st, &err), KILN_OK);
        uint8_t *src = malloc(n), *want = malloc(n + 64);
        for (size_t j = 0; j < n; j++) src[j] = (uint8_t)kt_rng_u64(&r);
        /* a: 0xAB everywhere, src at offset 7; b: a[3 .. 3 + n + 10) at offset 1 */
        assert_int_equal(kiln_buf_memset(&dev, &a, 0, 0xAB, n + 64, &err), KILN_OK);
        assert_int_equal(kiln_buf_h2d(&dev, &a, 7, src, n, &err), KILN_OK);
        assert_int_equal(kiln_buf_memset(&dev, &b, 0, 0x11, n + 64, &err), KILN_OK);
        assert_int_equal(kiln_buf_d2d(&dev, &b, 1, &a, 3, n + 10, &err), KILN_OK);
        assert_int_equal(kiln_buf_d2h(&dev, st.ptr, &b, 0, n + 64, &err), KILN_OK);
        assert_int_equal(kiln_device_sync(&dev, &err), KILN_OK);
        memset(want, 0x11, n + 64);
        uint8_t *am = malloc(n + 64);
        memset(am, 0xAB, n + 64);
        memcpy(am + 7, src, n);
        memcpy(want + 1, am + 3, n + 10);
        assert_memory_equal(st.ptr, want, n + 64);
        free(am), free(src), free(want);
        kiln_buf_free(&dev, &a), kiln_buf_free(&dev, &b), kiln_buf_free(&dev, &st);
        assert_null(a.ptr);
    }
    /* a kernel on the device's queue over backend buffers */
    const int64_t n = 1000;
    kiln_buf x, y, st;
    assert_int_equal(kiln_buf_alloc(&dev, KILN_MEM_DEVICE, n * 4, &x, &err), KILN_OK);
    assert_int_equal(kiln_buf_alloc(&dev, KILN_MEM_DEVICE, n * 4, &y, &err), KILN_OK);
    assert_int_equal(kiln_buf_alloc(&dev, KILN_MEM_STAGING, n * 4, &st, &err), KILN_OK);
    float *h = st.ptr;
    for (int64_t i = 0; i < n; i++) h[i] = (float)i * 0.5f;
    assert_int_equal(kiln_buf_h2d(&dev, &x, 0, h, n * 4, &err), KILN_OK);
    assert_int_equal(kiln_device_sync(&dev, &err), KILN_OK);
    kiln_kctx kc = {.stream = dev.queue, .dev = dev.impl};
    kiln_add_args ad = {.a = x.ptr,
                        .b = x.ptr,
                        .y = y.ptr,
                        .t = 1,
                        .n = n,
                        .a_stride = n,
                        .b_stride = n,
                        .y_stride = n};
    assert_int_equal(kiln_cuda_add(&kc, &ad), KILN_OK);
    assert_int_equal(kiln_buf_d2h(&dev, st.ptr, &y, 0, n * 4, &err), KILN_OK);
    assert_int_equal(kiln_device_sync(&dev, &err), KILN_OK);
    for (int64_t i = 0; i < n; i++) assert_true(h[i] == (float)i);
    /* errors */
    assert_int_equal(kiln_buf_h2d(&dev, &x, n * 4 - 2, h, 4, &err), KILN_ERR_RANGE);
    kiln_buf huge;
    assert_int_equal(kiln_buf_alloc(&dev, KILN_MEM_DEVICE, (size_t)1 << 50, &huge, &err),
                     KILN_ERR_NOMEM);
    printf("alloc error: %s\n", err.msg);
    kiln_buf_free(&dev, &x), kiln_buf_free(&dev, &y), kiln_buf_free(&dev, &st);
    kiln_device_close(&dev);
    kiln_device bad;
    assert_int_equal(kiln_device_open(&kiln_backend_cuda, 99, &bad, &err), KILN_ERR_DEVICE);
    printf("open error: %s\n", err.msg);
}

int main(void) {
    char why[256] = "";
    if (kiln_cuda_probe(NULL, why, sizeof why) <= 0) {
        printf("SKIP: %s\n", why);
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_round_trip)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif /* KILN_HAVE_CUDA */
