/* meta.c — the metadata table, typed accessors and the name hash map. */
#include "format/meta.h"
#include "base/mem.h"

#include "base/hash.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

bool kiln_str_eq(kiln_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

static const char *const type_names[KILN_META_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};
static const uint8_t type_sizes[KILN_META_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *kiln_meta_type_name(uint32_t t) {
    return t < KILN_META_TYPE_COUNT ? type_names[t] : "invalid";
}
size_t kiln_meta_type_size(uint32_t t) {
    return t < KILN_META_TYPE_COUNT ? type_sizes[t] : 0;
}

static bool is_int_type(kiln_meta_type t) {
    return t == KILN_META_U8 || t == KILN_META_I8 || t == KILN_META_U16 || t == KILN_META_I16 ||
           t == KILN_META_U32 || t == KILN_META_I32 || t == KILN_META_U64 || t == KILN_META_I64;
}
static bool is_unsigned_type(kiln_meta_type t) {
    return t == KILN_META_U8 || t == KILN_META_U16 || t == KILN_META_U32 || t == KILN_META_U64;
}
static bool is_float_type(kiln_meta_type t) {
    return t == KILN_META_F32 || t == KILN_META_F64;
}

/* ---- hashing ---------------------------------------------------------------------- */

static uint64_t hash_str(kiln_str s) {
    return kiln_hash64(s.ptr, s.len, 0x6b696c6eu);
}
static bool str_same(kiln_str a, kiln_str b) {
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

static kiln_status meta_rehash(kiln_meta *m, size_t cap, kiln_err *err) {
    uint32_t *slots = kiln_calloc(cap, sizeof *slots);
    if (!slots) return kiln_err_set(err, KILN_ERR_NOMEM, "metadata index: out of memory");
    for (size_t i = 0; i < m->count; i++) {
        size_t h = (size_t)hash_str(m->entries[i].key) & (cap - 1);
        while (slots[h]) h = (h + 1) & (cap - 1);
        slots[h] = (uint32_t)(i + 1);
    }
    kiln_free(m->index);
    m->index = slots;
    m->index_cap = cap;
    return KILN_OK;
}

void kiln_meta_init(kiln_meta *m) {
    memset(m, 0, sizeof *m);
    kiln_arena_init(&m->arena, 64 * 1024);
}

void kiln_meta_free(kiln_meta *m) {
    if (!m) return;
    kiln_free(m->entries);
    kiln_free(m->index);
    kiln_arena_free(&m->arena);
    memset(m, 0, sizeof *m);
}

kiln_arena *kiln_meta_arena(kiln_meta *m) {
    return &m->arena;
}

const kiln_meta_value *kiln_meta_find_str(const kiln_meta *m, kiln_str key) {
    if (!m || !m->index_cap) return NULL;
    size_t h = (size_t)hash_str(key) & (m->index_cap - 1);
    while (m->index[h]) {
        const kiln_meta_entry *e = &m->entries[m->index[h] - 1];
        if (str_same(e->key, key)) return &e->value;
        h = (h + 1) & (m->index_cap - 1);
    }
    return NULL;
}

const kiln_meta_value *kiln_meta_find(const kiln_meta *m, const char *key) {
    return kiln_meta_find_str(m, kiln_str_c(key));
}

bool kiln_meta_has(const kiln_meta *m, const char *key) {
    return kiln_meta_find(m, key) != NULL;
}

kiln_status kiln_meta_add(kiln_meta *m, kiln_str key, const kiln_meta_value *value, kiln_err *err) {
    if (kiln_meta_find_str(m, key))
        return kiln_err_set(err, KILN_ERR_FORMAT, "duplicate key '%.*s'", (int)key.len, key.ptr);
    if (m->count >= UINT32_MAX - 1)
        return kiln_err_set(err, KILN_ERR_RANGE, "too many metadata keys");
    if (m->count == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 32;
        kiln_meta_entry *e = kiln_realloc(m->entries, cap * sizeof *e);
        if (!e) return kiln_err_set(err, KILN_ERR_NOMEM, "metadata table: out of memory");
        m->entries = e;
        m->cap = cap;
    }
    m->entries[m->count].key = key;
    m->entries[m->count].value = *value;
    m->count++;
    if (m->count * 2 > m->index_cap) {
        size_t cap = m->index_cap ? m->index_cap : 64;
        while (m->count * 2 > cap) cap *= 2;
        kiln_status st = meta_rehash(m, cap, err);
        if (st) {
            m->count--;
            return st;
        }
    } else {
        size_t h = (size_t)hash_str(key) & (m->index_cap - 1);
        while (m->index[h]) h = (h + 1) & (m->index_cap - 1);
        m->index[h] = (uint32_t)m->count;
    }
    return KILN_OK;
}

static kiln_status add_copy(kiln_meta *m, const char *key, kiln_meta_value *v, kiln_err *err) {
    size_t n = strlen(key);
    char *k = kiln_arena_strndup(&m->arena, key, n);
    if (!k) return kiln_err_set(err, KILN_ERR_NOMEM, "metadata key '%s': out of memory", key);
    kiln_str ks = {k, n};
    return kiln_meta_add(m, ks, v, err);
}

kiln_status kiln_meta_set_str(kiln_meta *m, const char *key, kiln_str s, kiln_err *err) {
    char *c = kiln_arena_strndup(&m->arena, s.ptr ? s.ptr : "", s.len);
    if (!c) return kiln_err_set(err, KILN_ERR_NOMEM, "metadata '%s': out of memory", key);
    kiln_meta_value v = {.type = KILN_META_STRING};
    v.v.s.ptr = c;
    v.v.s.len = s.len;
    return add_copy(m, key, &v, err);
}
kiln_status kiln_meta_set_u32(kiln_meta *m, const char *key, uint32_t x, kiln_err *err) {
    kiln_meta_value v = {.type = KILN_META_U32};
    v.v.u = x;
    return add_copy(m, key, &v, err);
}
kiln_status kiln_meta_set_u64(kiln_meta *m, const char *key, uint64_t x, kiln_err *err) {
    kiln_meta_value v = {.type = KILN_META_U64};
    v.v.u = x;
    return add_copy(m, key, &v, err);
}
kiln_status kiln_meta_set_i32(kiln_meta *m, const char *key, int32_t x, kiln_err *err) {
    kiln_meta_value v = {.type = KILN_META_I32};
    v.v.i = x;
    return add_copy(m, key, &v, err);
}
kiln_status kiln_meta_set_f32(kiln_meta *m, const char *key, float x, kiln_err *err) {
    kiln_meta_value v = {.type = KILN_META_F32};
    v.v.f = x;
    return add_copy(m, key, &v, err);
}
kiln_status kiln_meta_set_bool(kiln_meta *m, const char *key, bool x, kiln_err *err) {
    kiln_meta_value v = {.type = KILN_META_BOOL};
    v.v.b = x;
    return add_copy(m, key, &v, err);
}
kiln_status kiln_meta_set_arr(kiln_meta *m, const char *key, kiln_meta_type t, const void *elems,
                              uint64_t n, kiln_err *err) {
    size_t es = kiln_meta_type_size(t), bytes;
    if (!es)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "metadata '%s': not a numeric type", key);
    if (!kiln_size_mul((size_t)n, es, &bytes))
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "metadata '%s': array too large", key);
    void *p = kiln_arena_alloc(&m->arena, bytes ? bytes : 1);
    if (!p) return kiln_err_set(err, KILN_ERR_NOMEM, "metadata '%s': out of memory", key);
    if (bytes) memcpy(p, elems, bytes);
    kiln_meta_value v = {.type = KILN_META_ARRAY, .elem_type = t, .count = n};
    v.v.raw = p;
    return add_copy(m, key, &v, err);
}

size_t kiln_meta_count(const kiln_meta *m) {
    return m ? m->count : 0;
}
const kiln_meta_entry *kiln_meta_at(const kiln_meta *m, size_t i) {
    return m && i < m->count ? &m->entries[i] : NULL;
}

/* ---- value conversion ---------------------------------------------------------------- */

static kiln_status type_err(const kiln_meta_value *v, const char *what, const char *want,
                            kiln_err *err) {
    char buf[96];
    kiln_meta_value_fmt(v, buf, sizeof buf, 40);
    return kiln_err_set(err, KILN_ERR_TYPE, "'%s': expected %s, found %s %s", what, want,
                        kiln_meta_type_name(v->type), buf);
}

kiln_status kiln_meta_value_i64(const kiln_meta_value *v, int64_t *out, const char *what,
                                kiln_err *err) {
    if (!is_int_type(v->type)) return type_err(v, what, "an integer", err);
    if (is_unsigned_type(v->type)) {
        if (v->v.u > (uint64_t)INT64_MAX) return type_err(v, what, "an integer <= 2^63-1", err);
        *out = (int64_t)v->v.u;
    } else {
        *out = v->v.i;
    }
    return KILN_OK;
}

kiln_status kiln_meta_value_u64(const kiln_meta_value *v, uint64_t *out, const char *what,
                                kiln_err *err) {
    if (!is_int_type(v->type)) return type_err(v, what, "an unsigned integer", err);
    if (is_unsigned_type(v->type)) {
        *out = v->v.u;
    } else {
        if (v->v.i < 0) return type_err(v, what, "a non-negative integer", err);
        *out = (uint64_t)v->v.i;
    }
    return KILN_OK;
}

kiln_status kiln_meta_value_f64(const kiln_meta_value *v, double *out, const char *what,
                                kiln_err *err) {
    if (is_float_type(v->type)) {
        *out = v->v.f;
        return KILN_OK;
    }
    if (is_int_type(v->type)) {
        const uint64_t lim = (uint64_t)1 << 53;
        if (is_unsigned_type(v->type) ? v->v.u > lim
                                      : (v->v.i > (int64_t)lim || v->v.i < -(int64_t)lim))
            return type_err(v, what, "a number exactly representable as f64", err);
        *out = is_unsigned_type(v->type) ? (double)v->v.u : (double)v->v.i;
        return KILN_OK;
    }
    return type_err(v, what, "a number", err);
}

static const kiln_meta_value *need(const kiln_meta *m, const char *key, kiln_err *err) {
    const kiln_meta_value *v = kiln_meta_find(m, key);
    if (!v) kiln_err_set(err, KILN_ERR_NOT_FOUND, "metadata key '%s' not found", key);
    return v;
}

static kiln_status conv_i64_range(const kiln_meta_value *v, const char *key, int64_t lo, int64_t hi,
                                  const char *want, int64_t *out, kiln_err *err) {
    int64_t x = 0;
    KILN_TRY(kiln_meta_value_i64(v, &x, key, err));
    if (x < lo || x > hi) return type_err(v, key, want, err);
    *out = x;
    return KILN_OK;
}

static kiln_status conv_u32(const kiln_meta_value *v, const char *key, uint32_t *out,
                            kiln_err *err) {
    uint64_t x = 0;
    KILN_TRY(kiln_meta_value_u64(v, &x, key, err));
    if (x > UINT32_MAX) return type_err(v, key, "a u32", err);
    *out = (uint32_t)x;
    return KILN_OK;
}
static kiln_status conv_i32(const kiln_meta_value *v, const char *key, int32_t *out,
                            kiln_err *err) {
    int64_t x = 0;
    KILN_TRY(conv_i64_range(v, key, INT32_MIN, INT32_MAX, "an i32", &x, err));
    *out = (int32_t)x;
    return KILN_OK;
}
static kiln_status conv_f32(const kiln_meta_value *v, const char *key, float *out, kiln_err *err) {
    if (is_int_type(v->type)) {
        int64_t x = 0;
        KILN_TRY(conv_i64_range(v, key, -(1 << 24), 1 << 24,
                                "a number exactly representable as f32", &x, err));
        *out = (float)x;
        return KILN_OK;
    }
    if (!is_float_type(v->type)) return type_err(v, key, "a number", err);
    *out = (float)v->v.f;
    return KILN_OK;
}
static kiln_status conv_bool(const kiln_meta_value *v, const char *key, bool *out, kiln_err *err) {
    if (v->type != KILN_META_BOOL) return type_err(v, key, "a bool", err);
    *out = v->v.b;
    return KILN_OK;
}
static kiln_status conv_str(const kiln_meta_value *v, const char *key, kiln_str *out,
                            kiln_err *err) {
    if (v->type != KILN_META_STRING) return type_err(v, key, "a string", err);
    *out = v->v.s;
    return KILN_OK;
}

#define GETTERS(T, ctype, conv)                                                                    \
    kiln_status kiln_meta_get_##T(const kiln_meta *m, const char *key, ctype *out,                 \
                                  kiln_err *err) {                                                 \
        const kiln_meta_value *v = need(m, key, err);                                              \
        if (!v) return KILN_ERR_NOT_FOUND;                                                         \
        return conv(v, key, out, err);                                                             \
    }                                                                                              \
    kiln_status kiln_meta_opt_##T(const kiln_meta *m, const char *key, ctype def, ctype *out,      \
                                  kiln_err *err) {                                                 \
        const kiln_meta_value *v = kiln_meta_find(m, key);                                         \
        if (!v) {                                                                                  \
            *out = def;                                                                            \
            return KILN_OK;                                                                        \
        }                                                                                          \
        return conv(v, key, out, err);                                                             \
    }

static kiln_status conv_u64(const kiln_meta_value *v, const char *key, uint64_t *out,
                            kiln_err *err) {
    return kiln_meta_value_u64(v, out, key, err);
}
static kiln_status conv_i64(const kiln_meta_value *v, const char *key, int64_t *out,
                            kiln_err *err) {
    return kiln_meta_value_i64(v, out, key, err);
}
static kiln_status conv_f64(const kiln_meta_value *v, const char *key, double *out, kiln_err *err) {
    return kiln_meta_value_f64(v, out, key, err);
}

GETTERS(u32, uint32_t, conv_u32)
GETTERS(i32, int32_t, conv_i32)
GETTERS(u64, uint64_t, conv_u64)
GETTERS(i64, int64_t, conv_i64)
GETTERS(f32, float, conv_f32)
GETTERS(f64, double, conv_f64)
GETTERS(bool, bool, conv_bool)

kiln_status kiln_meta_get_str(const kiln_meta *m, const char *key, kiln_str *out, kiln_err *err) {
    const kiln_meta_value *v = need(m, key, err);
    if (!v) return KILN_ERR_NOT_FOUND;
    return conv_str(v, key, out, err);
}

kiln_status kiln_meta_opt_str(const kiln_meta *m, const char *key, const char *def, kiln_str *out,
                              kiln_err *err) {
    const kiln_meta_value *v = kiln_meta_find(m, key);
    if (!v) {
        *out = kiln_str_c(def);
        return KILN_OK;
    }
    return conv_str(v, key, out, err);
}

kiln_status kiln_meta_dup_str(const kiln_meta *m, const char *key, char **out, kiln_err *err) {
    kiln_str s = {0};
    KILN_TRY(kiln_meta_get_str(m, key, &s, err));
    char *c = kiln_malloc(s.len + 1);
    if (!c) return kiln_err_set(err, KILN_ERR_NOMEM, "'%s': out of memory", key);
    if (s.len) memcpy(c, s.ptr, s.len);
    c[s.len] = 0;
    *out = c;
    return KILN_OK;
}

/* ---- arrays ---------------------------------------------------------------------------- */

kiln_status kiln_meta_get_arr(const kiln_meta *m, const char *key, int elem_type,
                              const kiln_meta_value **out, kiln_err *err) {
    const kiln_meta_value *v = need(m, key, err);
    if (!v) return KILN_ERR_NOT_FOUND;
    if (v->type != KILN_META_ARRAY) return type_err(v, key, "an array", err);
    if (elem_type >= 0 && (int)v->elem_type != elem_type)
        return kiln_err_set(
            err, KILN_ERR_TYPE, "'%s': expected an array of %s, found an array of %s", key,
            kiln_meta_type_name((uint32_t)elem_type), kiln_meta_type_name(v->elem_type));
    *out = v;
    return KILN_OK;
}

/* Reads element i of a numeric array into a scalar value. */
static bool arr_scalar(const kiln_meta_value *a, uint64_t i, kiln_meta_value *out) {
    if (!a || a->type != KILN_META_ARRAY || i >= a->count) return false;
    size_t es = kiln_meta_type_size(a->elem_type);
    if (!es || a->elem_type == KILN_META_STRING || a->elem_type == KILN_META_ARRAY) return false;
    const uint8_t *p = (const uint8_t *)a->v.raw + i * es;
    memset(out, 0, sizeof *out);
    out->type = a->elem_type;
    switch (a->elem_type) {
    case KILN_META_U8:
        out->v.u = p[0];
        break;
    case KILN_META_I8:
        out->v.i = (int8_t)p[0];
        break;
    case KILN_META_BOOL:
        out->v.b = p[0] != 0;
        break;
    case KILN_META_U16: {
        uint16_t x;
        memcpy(&x, p, 2);
        out->v.u = x;
    } break;
    case KILN_META_I16: {
        int16_t x;
        memcpy(&x, p, 2);
        out->v.i = x;
    } break;
    case KILN_META_U32: {
        uint32_t x;
        memcpy(&x, p, 4);
        out->v.u = x;
    } break;
    case KILN_META_I32: {
        int32_t x;
        memcpy(&x, p, 4);
        out->v.i = x;
    } break;
    case KILN_META_U64: {
        uint64_t x;
        memcpy(&x, p, 8);
        out->v.u = x;
    } break;
    case KILN_META_I64: {
        int64_t x;
        memcpy(&x, p, 8);
        out->v.i = x;
    } break;
    case KILN_META_F32: {
        float x;
        memcpy(&x, p, 4);
        out->v.f = x;
    } break;
    case KILN_META_F64: {
        double x;
        memcpy(&x, p, 8);
        out->v.f = x;
    } break;
    default:
        return false;
    }
    return true;
}

bool kiln_meta_arr_i64(const kiln_meta_value *arr, uint64_t i, int64_t *out) {
    kiln_meta_value v;
    return arr_scalar(arr, i, &v) && kiln_meta_value_i64(&v, out, "", NULL) == KILN_OK;
}
bool kiln_meta_arr_u64(const kiln_meta_value *arr, uint64_t i, uint64_t *out) {
    kiln_meta_value v;
    return arr_scalar(arr, i, &v) && kiln_meta_value_u64(&v, out, "", NULL) == KILN_OK;
}
bool kiln_meta_arr_f64(const kiln_meta_value *arr, uint64_t i, double *out) {
    kiln_meta_value v;
    return arr_scalar(arr, i, &v) && kiln_meta_value_f64(&v, out, "", NULL) == KILN_OK;
}
bool kiln_meta_arr_f32(const kiln_meta_value *arr, uint64_t i, float *out) {
    kiln_meta_value v;
    return arr_scalar(arr, i, &v) && conv_f32(&v, "", out, NULL) == KILN_OK;
}
bool kiln_meta_arr_bool(const kiln_meta_value *arr, uint64_t i, bool *out) {
    kiln_meta_value v;
    if (!arr_scalar(arr, i, &v) || v.type != KILN_META_BOOL) return false;
    *out = v.v.b;
    return true;
}
bool kiln_meta_arr_str(const kiln_meta_value *arr, uint64_t i, kiln_str *out) {
    if (!arr || arr->type != KILN_META_ARRAY || arr->elem_type != KILN_META_STRING ||
        i >= arr->count)
        return false;
    *out = arr->v.strs[i];
    return true;
}
const kiln_meta_value *kiln_meta_arr_item(const kiln_meta_value *arr, uint64_t i) {
    if (!arr || arr->type != KILN_META_ARRAY || arr->elem_type != KILN_META_ARRAY ||
        i >= arr->count)
        return NULL;
    return &arr->v.items[i];
}

kiln_status kiln_meta_arr_copy_f32(const kiln_meta_value *arr, float *dst, uint64_t n,
                                   const char *what, kiln_err *err) {
    if (!arr || arr->type != KILN_META_ARRAY || arr->count != n)
        return kiln_err_set(err, KILN_ERR_TYPE, "'%s': expected an array of %" PRIu64 " numbers",
                            what, n);
    if (arr->elem_type == KILN_META_F32) {
        if (n) memcpy(dst, arr->v.raw, (size_t)n * 4);
        return KILN_OK;
    }
    for (uint64_t i = 0; i < n; i++)
        if (!kiln_meta_arr_f32(arr, i, &dst[i]))
            return kiln_err_set(err, KILN_ERR_TYPE, "'%s': element %" PRIu64 " (%s) is not an f32",
                                what, i, kiln_meta_type_name(arr->elem_type));
    return KILN_OK;
}

kiln_status kiln_meta_arr_copy_i32(const kiln_meta_value *arr, int32_t *dst, uint64_t n,
                                   const char *what, kiln_err *err) {
    if (!arr || arr->type != KILN_META_ARRAY || arr->count != n)
        return kiln_err_set(err, KILN_ERR_TYPE, "'%s': expected an array of %" PRIu64 " integers",
                            what, n);
    if (arr->elem_type == KILN_META_I32) {
        if (n) memcpy(dst, arr->v.raw, (size_t)n * 4);
        return KILN_OK;
    }
    for (uint64_t i = 0; i < n; i++) {
        int64_t x = 0;
        if (!kiln_meta_arr_i64(arr, i, &x) || x < INT32_MIN || x > INT32_MAX)
            return kiln_err_set(err, KILN_ERR_TYPE, "'%s': element %" PRIu64 " (%s) is not an i32",
                                what, i, kiln_meta_type_name(arr->elem_type));
        dst[i] = (int32_t)x;
    }
    return KILN_OK;
}

void kiln_meta_value_fmt(const kiln_meta_value *v, char *buf, size_t n, size_t max_str) {
    if (!n) return;
    switch (v->type) {
    case KILN_META_U8:
    case KILN_META_U16:
    case KILN_META_U32:
    case KILN_META_U64:
        snprintf(buf, n, "%" PRIu64, v->v.u);
        break;
    case KILN_META_I8:
    case KILN_META_I16:
    case KILN_META_I32:
    case KILN_META_I64:
        snprintf(buf, n, "%" PRId64, v->v.i);
        break;
    case KILN_META_F32:
        snprintf(buf, n, "%.9g", v->v.f);
        break;
    case KILN_META_F64:
        snprintf(buf, n, "%.17g", v->v.f);
        break;
    case KILN_META_BOOL:
        snprintf(buf, n, "%s", v->v.b ? "true" : "false");
        break;
    case KILN_META_STRING: {
        size_t len = v->v.s.len, shown = len > max_str ? max_str : len;
        /* escape control bytes so a string can never break the output line */
        size_t o = 0;
        if (o + 1 < n) buf[o++] = '"';
        for (size_t i = 0; i < shown && o + 5 < n; i++) {
            unsigned char c = (unsigned char)v->v.s.ptr[i];
            if (c == '\n') {
                buf[o++] = '\\';
                buf[o++] = 'n';
            } else if (c < 0x20 || c == 0x7f) {
                o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
            } else {
                buf[o++] = (char)c;
            }
        }
        if (shown < len && o + 4 < n) {
            memcpy(buf + o, "...", 3);
            o += 3;
        }
        if (o + 1 < n) buf[o++] = '"';
        buf[o < n ? o : n - 1] = 0;
        break;
    }
    case KILN_META_ARRAY:
        snprintf(buf, n, "[array of %" PRIu64 " %s]", v->count, kiln_meta_type_name(v->elem_type));
        break;
    default:
        snprintf(buf, n, "<invalid type %u>", (unsigned)v->type);
        break;
    }
}

/* ---- string map ---------------------------------------------------------------------- */

kiln_status kiln_strmap_build(kiln_strmap *map, const kiln_str *names, size_t n, size_t *dup,
                              kiln_err *err) {
    map->slots = NULL;
    map->cap = 0;
    if (n >= UINT32_MAX / 4) return kiln_err_set(err, KILN_ERR_RANGE, "too many names (%zu)", n);
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    map->slots = kiln_calloc(cap, sizeof *map->slots);
    if (!map->slots) return kiln_err_set(err, KILN_ERR_NOMEM, "name index: out of memory");
    map->cap = cap;
    for (size_t i = 0; i < n; i++) {
        size_t h = (size_t)hash_str(names[i]) & (cap - 1);
        while (map->slots[h]) {
            if (str_same(names[map->slots[h] - 1], names[i])) {
                if (dup) *dup = i;
                return KILN_ERR_FORMAT;
            }
            h = (h + 1) & (cap - 1);
        }
        map->slots[h] = (uint32_t)(i + 1);
    }
    return KILN_OK;
}

int64_t kiln_strmap_find(const kiln_strmap *map, const kiln_str *names, kiln_str key) {
    if (!map->cap) return -1;
    size_t h = (size_t)hash_str(key) & (map->cap - 1);
    while (map->slots[h]) {
        uint32_t i = map->slots[h] - 1;
        if (str_same(names[i], key)) return i;
        h = (h + 1) & (map->cap - 1);
    }
    return -1;
}

void kiln_strmap_free(kiln_strmap *map) {
    if (!map) return;
    kiln_free(map->slots);
    map->slots = NULL;
    map->cap = 0;
}
