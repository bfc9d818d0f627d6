#include "format/dtype.h"

#include "base/mem.h"

#include <strings.h>

#define T(id, nm, bs, bb, q, sup) [id] = {nm, bs, bb, q, sup}

static const kiln_dtype_info dtype_table[KILN_DTYPE_COUNT] = {
    T(KILN_DTYPE_F32, "f32", 1, 4, false, true),
    T(KILN_DTYPE_F16, "f16", 1, 2, false, true),
    T(KILN_DTYPE_BF16, "bf16", 1, 2, false, true),
    T(KILN_DTYPE_Q4_0, "q4_0", 32, 18, true, true),
    T(KILN_DTYPE_Q4_1, "q4_1", 32, 20, true, true),
    T(KILN_DTYPE_Q5_0, "q5_0", 32, 22, true, true),
    T(KILN_DTYPE_Q5_1, "q5_1", 32, 24, true, true),
    T(KILN_DTYPE_Q8_0, "q8_0", 32, 34, true, true),
    T(KILN_DTYPE_Q8_1, "q8_1", 32, 36, true, false),
    T(KILN_DTYPE_Q2_K, "q2_K", 256, 84, true, true),
    T(KILN_DTYPE_Q3_K, "q3_K", 256, 110, true, true),
    T(KILN_DTYPE_Q4_K, "q4_K", 256, 144, true, true),
    T(KILN_DTYPE_Q5_K, "q5_K", 256, 176, true, true),
    T(KILN_DTYPE_Q6_K, "q6_K", 256, 210, true, true),
    T(KILN_DTYPE_Q8_K, "q8_K", 256, 292, true, true),
    T(KILN_DTYPE_IQ2_XXS, "iq2_xxs", 256, 66, true, false),
    T(KILN_DTYPE_IQ2_XS, "iq2_xs", 256, 74, true, false),
    T(KILN_DTYPE_IQ3_XXS, "iq3_xxs", 256, 98, true, false),
    T(KILN_DTYPE_IQ1_S, "iq1_s", 256, 50, true, false),
    T(KILN_DTYPE_IQ4_NL, "iq4_nl", 32, 18, true, false),
    T(KILN_DTYPE_IQ3_S, "iq3_s", 256, 110, true, false),
    T(KILN_DTYPE_IQ2_S, "iq2_s", 256, 82, true, false),
    T(KILN_DTYPE_IQ4_XS, "iq4_xs", 256, 136, true, false),
    T(KILN_DTYPE_I8, "i8", 1, 1, false, false),
    T(KILN_DTYPE_I16, "i16", 1, 2, false, false),
    T(KILN_DTYPE_I32, "i32", 1, 4, false, false),
    T(KILN_DTYPE_I64, "i64", 1, 8, false, false),
    T(KILN_DTYPE_F64, "f64", 1, 8, false, false),
    T(KILN_DTYPE_IQ1_M, "iq1_m", 256, 56, true, false),
    T(KILN_DTYPE_TQ1_0, "tq1_0", 256, 54, true, false),
    T(KILN_DTYPE_TQ2_0, "tq2_0", 256, 66, true, false),
    T(KILN_DTYPE_MXFP4, "mxfp4", 32, 17, true, false),
};

const kiln_dtype_info *kiln_dtype_get(uint32_t id) {
    if (id >= KILN_DTYPE_COUNT || !dtype_table[id].name) return NULL;
    return &dtype_table[id];
}

const char *kiln_dtype_name(uint32_t id) {
    const kiln_dtype_info *t = kiln_dtype_get(id);
    return t ? t->name : "unknown";
}

bool kiln_dtype_from_name(const char *name, kiln_dtype *out) {
    for (uint32_t i = 0; i < KILN_DTYPE_COUNT; i++) {
        if (dtype_table[i].name && strcasecmp(dtype_table[i].name, name) == 0) {
            *out = (kiln_dtype)i;
            return true;
        }
    }
    return false;
}

kiln_status kiln_dtype_check(uint32_t id, kiln_err *err) {
    const kiln_dtype_info *t = kiln_dtype_get(id);
    if (!t) return kiln_err_set(err, KILN_ERR_FORMAT, "unknown tensor type id %u", id);
    if (!t->supported)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "tensor type %s (id %u) is not supported by kiln", t->name, id);
    return KILN_OK;
}

kiln_status kiln_dtype_row_bytes(uint32_t id, int64_t n, size_t *out, kiln_err *err) {
    const kiln_dtype_info *t = kiln_dtype_get(id);
    if (!t) return kiln_err_set(err, KILN_ERR_FORMAT, "unknown tensor type id %u", id);
    if (n < 0)
        return kiln_err_set(err, KILN_ERR_RANGE, "negative element count %lld", (long long)n);
    if ((uint64_t)n % t->block_size != 0)
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "row of %lld elements is not a multiple of the %s block size %u",
                            (long long)n, t->name, t->block_size);
    return kiln_size_mul_err((size_t)((uint64_t)n / t->block_size), t->block_bytes, out,
                             "row bytes", err);
}

kiln_status kiln_dtype_nbytes(uint32_t id, const int64_t *shape, int rank, size_t *out,
                              kiln_err *err) {
    if (rank < 0 || rank > 8)
        return kiln_err_set(err, KILN_ERR_RANGE, "rank %d outside 0..8", rank);
    size_t rows = 1;
    for (int i = 1; i < rank; i++) {
        if (shape[i] < 0)
            return kiln_err_set(err, KILN_ERR_RANGE, "negative dimension %lld",
                                (long long)shape[i]);
        KILN_TRY(kiln_size_mul_err(rows, (size_t)shape[i], &rows, "tensor rows", err));
    }
    size_t row;
    KILN_TRY(kiln_dtype_row_bytes(id, rank > 0 ? shape[0] : 1, &row, err));
    return kiln_size_mul_err(rows, row, out, "tensor bytes", err);
}
