/* layout.c — the layout registry and the built-in transforms (see layout.h). */
#include "load/layout.h"

#include "format/dtype.h"
#include "format/tensor.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static bool is_float(uint32_t t) {
    return t == KILN_DTYPE_F32 || t == KILN_DTYPE_F16 || t == KILN_DTYPE_BF16;
}

static kiln_status fixup_ok(uint32_t src, uint32_t fixup, kiln_err *err) {
    if (fixup != KILN_FIXUP_NONE && !is_float(src))
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "fixup %u needs a float tensor, not %s",
                            fixup, kiln_dtype_name(src));
    return KILN_OK;
}

/* Row of n elements of a float type -> f32, with the fixup. */
static void row_to_f32(uint32_t src, const void *in, float *out, int64_t n, uint32_t fixup) {
    if (src == KILN_DTYPE_F32) {
        memcpy(out, in, (size_t)n * 4);
    } else if (src == KILN_DTYPE_F16) {
        const uint8_t *p = in;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = kiln_fp16_to_f32(h);
        }
    } else {
        const uint8_t *p = in;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = kiln_bf16_to_f32(h);
        }
    }
    if (fixup == KILN_FIXUP_ADD_ONE)
        for (int64_t i = 0; i < n; i++) out[i] += 1.0f;
}

/* ---- native ----------------------------------------------------------------------------- */

static kiln_status native_plan(uint32_t src, int64_t ne0, int64_t n_rows, uint32_t fixup,
                               uint32_t *out_dtype, uint64_t *out_row_bytes, kiln_err *err) {
    KILN_TRY(fixup_ok(src, fixup, err));
    size_t rb;
    KILN_TRY(kiln_dtype_row_bytes(src, ne0, &rb, err));
    *out_dtype = src;
    *out_row_bytes = rb;
    return KILN_OK;
}

static kiln_status native_run(uint32_t src, int64_t ne0, uint32_t fixup, const void *in,
                              int64_t n_rows, void *dst, kiln_err *err) {
    size_t rb;
    KILN_TRY(kiln_dtype_row_bytes(src, ne0, &rb, err));
    if (fixup == KILN_FIXUP_NONE) {
        memcpy(dst, in, rb * (size_t)n_rows);
        return KILN_OK;
    }
    /* float + fixup: convert each element to f32, fix, and store back in the same type */
    float tmp[256];
    const uint8_t *s = in;
    uint8_t *d = dst;
    size_t es = rb / (size_t)(ne0 ? ne0 : 1);
    for (int64_t r = 0; r < n_rows; r++) {
        for (int64_t i0 = 0; i0 < ne0; i0 += 256) {
            int64_t n = ne0 - i0 < 256 ? ne0 - i0 : 256;
            const uint8_t *sp = s + (size_t)r * rb + (size_t)i0 * es;
            uint8_t *dp = d + (size_t)r * rb + (size_t)i0 * es;
            row_to_f32(src, sp, tmp, n, fixup);
            for (int64_t i = 0; i < n; i++) {
                if (src == KILN_DTYPE_F32) {
                    memcpy(dp + 4 * i, &tmp[i], 4);
                } else {
                    uint16_t h =
                        src == KILN_DTYPE_F16 ? kiln_f32_to_fp16(tmp[i]) : kiln_f32_to_bf16(tmp[i]);
                    memcpy(dp + 2 * i, &h, 2);
                }
            }
        }
    }
    return KILN_OK;
}

/* ---- f32 ------------------------------------------------------------------------------- */

static kiln_status f32_plan(uint32_t src, int64_t ne0, int64_t n_rows, uint32_t fixup,
                            uint32_t *out_dtype, uint64_t *out_row_bytes, kiln_err *err) {
    KILN_TRY(fixup_ok(src, fixup, err));
    const kiln_dtype_info *di = kiln_dtype_get(src);
    if (!di || !di->supported)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "cannot convert %s", kiln_dtype_name(src));
    if (!is_float(src)) {
        if (!di->quantized)
            return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "cannot convert %s",
                                kiln_dtype_name(src));
        if (ne0 % di->block_size)
            return kiln_err_set(err, KILN_ERR_FORMAT, "row of %lld not a multiple of %u",
                                (long long)ne0, di->block_size);
    }
    *out_dtype = KILN_DTYPE_F32;
    *out_row_bytes = (uint64_t)ne0 * 4;
    return KILN_OK;
}

static kiln_status f32_run(uint32_t src, int64_t ne0, uint32_t fixup, const void *in,
                           int64_t n_rows, void *dst, kiln_err *err) {
    size_t rb;
    KILN_TRY(kiln_dtype_row_bytes(src, ne0, &rb, err));
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *s = (const uint8_t *)in + (size_t)r * rb;
        float *d = (float *)((uint8_t *)dst + (size_t)r * (size_t)ne0 * 4);
        if (is_float(src)) {
            row_to_f32(src, s, d, ne0, fixup);
        } else {
            KILN_TRY(kiln_dequantize_row(src, s, d, ne0, err));
        }
    }
    return KILN_OK;
}

/* ---- f16 / bf16 -------------------------------------------------------------------------- */

static kiln_status half_plan(const char *nm, uint32_t to, uint32_t src, int64_t ne0, uint32_t fixup,
                             uint32_t *out_dtype, uint64_t *out_row_bytes, kiln_err *err) {
    KILN_TRY(fixup_ok(src, fixup, err));
    if (!is_float(src))
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "converts f32/f16/bf16 only, not %s",
                            kiln_dtype_name(src));
    *out_dtype = to;
    *out_row_bytes = (uint64_t)ne0 * 2;
    return KILN_OK;
}
static kiln_status f16_plan(uint32_t src, int64_t ne0, int64_t n_rows, uint32_t fixup,
                            uint32_t *out_dtype, uint64_t *out_row_bytes, kiln_err *err) {
    return half_plan("f16", KILN_DTYPE_F16, src, ne0, fixup, out_dtype, out_row_bytes, err);
}
static kiln_status bf16_plan(uint32_t src, int64_t ne0, int64_t n_rows, uint32_t fixup,
                             uint32_t *out_dtype, uint64_t *out_row_bytes, kiln_err *err) {
    return half_plan("bf16", KILN_DTYPE_BF16, src, ne0, fixup, out_dtype, out_row_bytes, err);
}

static kiln_status half_run(bool bf, uint32_t src, int64_t ne0, uint32_t fixup, const void *in,
                            int64_t n_rows, void *dst) {
    const size_t es = src == KILN_DTYPE_F32 ? 4 : 2;
    float tmp[256];
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *s = (const uint8_t *)in + (size_t)r * (size_t)ne0 * es;
        uint8_t *d = (uint8_t *)dst + (size_t)r * (size_t)ne0 * 2;
        for (int64_t i0 = 0; i0 < ne0; i0 += 256) {
            int64_t n = ne0 - i0 < 256 ? ne0 - i0 : 256;
            row_to_f32(src, s + (size_t)i0 * es, tmp, n, fixup);
            for (int64_t i = 0; i < n; i++) {
                uint16_t h = bf ? kiln_f32_to_bf16(tmp[i]) : kiln_f32_to_fp16(tmp[i]);
                memcpy(d + 2 * (size_t)(i0 + i), &h, 2);
            }
        }
    }
    return KILN_OK;
}
static kiln_status f16_run(uint32_t src, int64_t ne0, uint32_t fixup, const void *in,
                           int64_t n_rows, void *dst, kiln_err *err) {
    return half_run(false, src, ne0, fixup, in, n_rows, dst);
}
static kiln_status bf16_run(uint32_t src, int64_t ne0, uint32_t fixup, const void *in,
                            int64_t n_rows, void *dst, kiln_err *err) {
    return half_run(true, src, ne0, fixup, in, n_rows, dst);
}

/* ---- blocks_x4 ------------------------------------------------------------------------- */

static kiln_status x4_plan(uint32_t src, int64_t ne0, int64_t n_rows, uint32_t fixup,
                           uint32_t *out_dtype, uint64_t *out_row_bytes, kiln_err *err) {
    KILN_TRY(fixup_ok(src, fixup, err));
    const kiln_dtype_info *di = kiln_dtype_get(src);
    if (!di || !di->quantized)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "%s is not block-quantized",
                            kiln_dtype_name(src));
    if (n_rows % 4)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "%lld rows, not a multiple of 4",
                            (long long)n_rows);
    size_t rb;
    KILN_TRY(kiln_dtype_row_bytes(src, ne0, &rb, err));
    *out_dtype = src;
    *out_row_bytes = rb;
    return KILN_OK;
}

static kiln_status x4_run(uint32_t src, int64_t ne0, uint32_t fixup, const void *in, int64_t n_rows,
                          void *dst, kiln_err *err) {
    const kiln_dtype_info *di = kiln_dtype_get(src);
    size_t rb;
    KILN_TRY(kiln_dtype_row_bytes(src, ne0, &rb, err));
    const size_t bb = di->block_bytes, nb = rb / bb;
    for (int64_t g = 0; g < n_rows; g += 4) {
        const uint8_t *s = (const uint8_t *)in + (size_t)g * rb;
        uint8_t *d = (uint8_t *)dst + (size_t)g * rb;
        for (size_t b = 0; b < nb; b++)
            for (size_t r = 0; r < 4; r++) memcpy(d + (b * 4 + r) * bb, s + r * rb + b * bb, bb);
    }
    return KILN_OK;
}

/* ---- registry ---------------------------------------------------------------------------- */

static const kiln_layout builtins[] = {
    {"native", "bytes as stored", 1, native_plan, native_run, false},
    {"f32", "convert or dequantize to f32", 1, f32_plan, f32_run, false},
    {"f16", "convert f32/f16/bf16 to f16", 1, f16_plan, f16_run, false},
    {"bf16", "convert f32/f16/bf16 to bf16", 1, bf16_plan, bf16_run, false},
    {"blocks_x4", "quantized blocks of 4 rows interleaved", 4, x4_plan, x4_run, false},
};
#define N_BUILTIN   (sizeof builtins / sizeof builtins[0])
#define MAX_LAYOUTS 64

/* The process-wide layout registry: built-ins, then registered layouts (append-only;
 * `count` is published with release order after the slot is written). */
static struct {
    pthread_mutex_t lock;
    const kiln_layout *extra[MAX_LAYOUTS];
    atomic_size_t count;
} kiln_layout_registry = {PTHREAD_MUTEX_INITIALIZER, {0}, 0};

size_t kiln_layout_count(void) {
    return N_BUILTIN + atomic_load_explicit(&kiln_layout_registry.count, memory_order_acquire);
}

const kiln_layout *kiln_layout_at(size_t i) {
    if (i < N_BUILTIN) return &builtins[i];
    i -= N_BUILTIN;
    if (i < atomic_load_explicit(&kiln_layout_registry.count, memory_order_acquire))
        return kiln_layout_registry.extra[i];
    return NULL;
}

const kiln_layout *kiln_layout_find(const char *name) {
    if (!name || !*name) name = "native";
    size_t n = kiln_layout_count();
    for (size_t i = 0; i < n; i++) {
        const kiln_layout *l = kiln_layout_at(i);
        if (strcmp(l->name, name) == 0) return l;
    }
    return NULL;
}

kiln_status kiln_layout_register(const kiln_layout *l, kiln_err *err) {
    if (!l || !l->name || !l->plan || !l->run || l->row_group == 0)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "layout: name, plan, run and row_group needed");
    pthread_mutex_lock(&kiln_layout_registry.lock);
    kiln_status st = KILN_OK;
    size_t n = atomic_load_explicit(&kiln_layout_registry.count, memory_order_relaxed);
    if (kiln_layout_find(l->name)) {
        st = kiln_err_set(err, KILN_ERR_STATE, "layout '%s' is already registered", l->name);
    } else if (n >= MAX_LAYOUTS) {
        st = kiln_err_set(err, KILN_ERR_CAPACITY, "layout table full (%d)", MAX_LAYOUTS);
    } else {
        kiln_layout_registry.extra[n] = l;
        atomic_store_explicit(&kiln_layout_registry.count, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&kiln_layout_registry.lock);
    return st;
}
