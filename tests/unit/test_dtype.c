/* test_dtype.c — the dtype table: ids, block geometry, names, size arithmetic and the
 * errors for unknown / unsupported types; fp16 / bf16 scalar conversions. */
#include "format/dtype.h"
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static void test_table(void **state) {
    (void)state;
    struct {
        uint32_t id;
        const char *name;
        uint32_t bs, bb;
        bool supported;
    } want[] = {
        {0, "f32", 1, 4, true},          {1, "f16", 1, 2, true},
        {30, "bf16", 1, 2, true},        {8, "q8_0", 32, 34, true},
        {2, "q4_0", 32, 18, true},       {3, "q4_1", 32, 20, true},
        {6, "q5_0", 32, 22, true},       {7, "q5_1", 32, 24, true},
        {10, "q2_K", 256, 84, true},     {11, "q3_K", 256, 110, true},
        {12, "q4_K", 256, 144, true},    {13, "q5_K", 256, 176, true},
        {14, "q6_K", 256, 210, true},    {15, "q8_K", 256, 292, true},
        {16, "iq2_xxs", 256, 66, false}, {23, "iq4_xs", 256, 136, false},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kiln_dtype_info *t = kiln_dtype_get(want[i].id);
        assert_non_null(t);
        assert_string_equal(t->name, want[i].name);
        assert_int_equal(t->block_size, want[i].bs);
        assert_int_equal(t->block_bytes, want[i].bb);
        assert_int_equal(t->supported, want[i].supported);
        kiln_dtype d;
        assert_true(kiln_dtype_from_name(want[i].name, &d));
        assert_int_equal(d, want[i].id);
    }
    assert_null(kiln_dtype_get(4)); /* removed Q4_2 */
    assert_null(kiln_dtype_get(1000));
    assert_string_equal(kiln_dtype_name(1000), "unknown");
    kiln_dtype d;
    assert_true(kiln_dtype_from_name("Q4_K", &d));
    assert_false(kiln_dtype_from_name("q4_9", &d));
}

static void test_errors(void **state) {
    (void)state;
    kiln_err e;
    assert_int_equal(kiln_dtype_check(12, &e), KILN_OK);
    assert_int_equal(kiln_dtype_check(5, &e), KILN_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "unknown tensor type id 5"));
    assert_int_equal(kiln_dtype_check(KILN_DTYPE_IQ2_XXS, &e), KILN_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "iq2_xxs"));

    size_t n;
    assert_int_equal(kiln_dtype_row_bytes(KILN_DTYPE_Q4_K, 512, &n, &e), KILN_OK);
    assert_int_equal(n, 288);
    assert_int_equal(kiln_dtype_row_bytes(KILN_DTYPE_Q4_K, 100, &n, &e), KILN_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "block size 256"));
    int64_t shape[3] = {4096, 4096, 2};
    assert_int_equal(kiln_dtype_nbytes(KILN_DTYPE_Q8_0, shape, 3, &n, &e), KILN_OK);
    assert_int_equal(n, (size_t)4096 / 32 * 34 * 4096 * 2);
    int64_t huge[4] = {INT64_C(1) << 40, INT64_C(1) << 40, 1 << 20, 1};
    assert_int_equal(kiln_dtype_nbytes(KILN_DTYPE_F32, huge, 4, &n, &e), KILN_ERR_OVERFLOW);
    int64_t neg[2] = {32, -1};
    assert_int_equal(kiln_dtype_nbytes(KILN_DTYPE_F32, neg, 2, &n, &e), KILN_ERR_RANGE);
}

static void test_half(void **state) {
    (void)state;
    /* exhaustive: every f16 bit pattern round-trips through f32 (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kiln_fp16_to_f32((uint16_t)h);
        uint16_t back = kiln_f32_to_fp16(f);
        if (isnan(f))
            assert_true(isnan(kiln_fp16_to_f32(back)));
        else
            assert_int_equal(back, h);
    }
    assert_true(kiln_fp16_to_f32(0x3C00) == 1.0f);
    assert_true(kiln_fp16_to_f32(0xC000) == -2.0f);
    assert_int_equal(kiln_f32_to_fp16(65520.0f), 0x7C00);        /* rounds to inf */
    assert_int_equal(kiln_f32_to_fp16(1.0f + 0x1p-11f), 0x3C00); /* tie to even */
    assert_int_equal(kiln_f32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);
    assert_true(kiln_bf16_to_f32(0x3F80) == 1.0f);
    assert_int_equal(kiln_f32_to_bf16(1.0f), 0x3F80);
    assert_int_equal(kiln_f32_to_bf16(kiln_f32_from_bits(0x3F808000u)), 0x3F80); /* tie even */
    assert_int_equal(kiln_f32_to_bf16(kiln_f32_from_bits(0x3F818000u)), 0x3F82);
    assert_true(isnan(kiln_bf16_to_f32(kiln_f32_to_bf16(NAN))));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_half),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
