/*
 * meta.h — the metadata view: a table of typed key/value pairs with GGUF key names.
 *
 * Every model file exposes its metadata through one kiln_meta, whatever its source:
 *   - a GGUF file's key/value section, as stored (values point into the mapping);
 *   - a safetensors model's HF config.json, mapped onto the GGUF key names
 *     (`general.architecture`, `llama.attention.head_count`, ...; see hf_map.h).
 * A model family or the tokenizer reads `llama.attention.head_count` the same way in
 * both cases.
 *
 * Value types are GGUF's (the enum values are GGUF's type ids). Arrays hold one
 * element type; arrays of arrays are allowed (GGUF nests them).
 *
 * Typed accessors:
 *   kiln_meta_get_<T>(m, key, &out, err)     required: KILN_ERR_NOT_FOUND when missing
 *   kiln_meta_opt_<T>(m, key, def, &out, err) optional: `def` when missing
 * Both fail with KILN_ERR_TYPE (message naming the key, the stored type and the value)
 * when the stored value has the wrong type or does not fit. Integer getters accept any
 * integer type whose value fits the target exactly (a u32 getter accepts u8, i64 5, ...;
 * never a float or bool). f64 accepts f32, f64 and integers of magnitude <= 2^53; f32
 * accepts f32, f64 (rounded to nearest f32: config.json has only doubles) and integers of
 * magnitude <= 2^24. bool accepts bool only. Strings are (pointer, length), not
 * necessarily NUL-terminated and not validated as UTF-8 (vocabularies may hold raw
 * bytes); kiln_meta_dup_str returns a NUL-terminated malloc'ed copy.
 *
 * Ownership: values point into memory owned by whoever filled the table (the GGUF
 * mapping, or the table's arena); they stay valid until the owning file is closed.
 * Multi-byte numeric array elements are little-endian and possibly unaligned: read them
 * with the kiln_meta_arr_* helpers, never by casting `raw`.
 *
 * Keys are unique (adding a duplicate fails); lookup is a hash probe. Not thread-safe
 * while being built; read-only use from many threads is fine.
 */
#ifndef KILN_FORMAT_META_H
#define KILN_FORMAT_META_H

#include "base/mem.h"
#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* A byte string that is not necessarily NUL-terminated. */
typedef struct kiln_str {
    const char *ptr;
    size_t len;
} kiln_str;

static inline kiln_str kiln_str_c(const char *s) {
    kiln_str r = {s, s ? strlen(s) : 0};
    return r;
}
/* True when s equals the NUL-terminated string c. */
bool kiln_str_eq(kiln_str s, const char *c);

/* GGUF metadata value types (the values are GGUF's type ids). */
typedef enum kiln_meta_type {
    KILN_META_U8 = 0,
    KILN_META_I8 = 1,
    KILN_META_U16 = 2,
    KILN_META_I16 = 3,
    KILN_META_U32 = 4,
    KILN_META_I32 = 5,
    KILN_META_F32 = 6,
    KILN_META_BOOL = 7,
    KILN_META_STRING = 8,
    KILN_META_ARRAY = 9,
    KILN_META_U64 = 10,
    KILN_META_I64 = 11,
    KILN_META_F64 = 12,
    KILN_META_TYPE_COUNT = 13,
} kiln_meta_type;

/* "u32", "string", "array", ...; "invalid" for an unknown id. */
const char *kiln_meta_type_name(uint32_t t);
/* Bytes of one element of a scalar type (0 for string and array). */
size_t kiln_meta_type_size(uint32_t t);

typedef struct kiln_meta_value {
    kiln_meta_type type;
    kiln_meta_type elem_type; /* arrays only */
    uint64_t count;           /* arrays only: number of elements */
    union {
        uint64_t u;                          /* U8, U16, U32, U64 (zero-extended) */
        int64_t i;                           /* I8, I16, I32, I64 (sign-extended) */
        double f;                            /* F32, F64 (an F32 is stored exactly as a double) */
        bool b;                              /* BOOL */
        kiln_str s;                          /* STRING */
        const void *raw;                     /* ARRAY of a numeric/bool type: LE elements */
        const kiln_str *strs;                /* ARRAY of STRING: count strings */
        const struct kiln_meta_value *items; /* ARRAY of ARRAY: count arrays */
    } v;
} kiln_meta_value;

typedef struct kiln_meta_entry {
    kiln_str key;
    kiln_meta_value value;
} kiln_meta_entry;

/* Fields are private: use the functions below. */
typedef struct kiln_meta {
    kiln_meta_entry *entries;
    size_t count, cap;
    uint32_t *index; /* open-addressing hash: entry index + 1, 0 = empty */
    size_t index_cap;
    kiln_arena arena; /* copies owned by the table (config.json mapping, string tables) */
} kiln_meta;

/* ---- building (used by the format parsers) ---- */
void kiln_meta_init(kiln_meta *m);
/* Frees everything the table owns (not the memory values point into). NULL-safe. */
void kiln_meta_free(kiln_meta *m);
/* Adds key -> value; the key and value memory must outlive the table (or live in its
 * arena). KILN_ERR_FORMAT "duplicate key '<key>'" when the key exists. */
kiln_status kiln_meta_add(kiln_meta *m, kiln_str key, const kiln_meta_value *value, kiln_err *err);
/* Convenience adders that copy key (and string) into the table's arena. */
kiln_status kiln_meta_set_str(kiln_meta *m, const char *key, kiln_str s, kiln_err *err);
kiln_status kiln_meta_set_u32(kiln_meta *m, const char *key, uint32_t v, kiln_err *err);
kiln_status kiln_meta_set_u64(kiln_meta *m, const char *key, uint64_t v, kiln_err *err);
kiln_status kiln_meta_set_i32(kiln_meta *m, const char *key, int32_t v, kiln_err *err);
kiln_status kiln_meta_set_f32(kiln_meta *m, const char *key, float v, kiln_err *err);
kiln_status kiln_meta_set_bool(kiln_meta *m, const char *key, bool v, kiln_err *err);
/* Array of n numeric elements of type t (copied, little-endian) into the arena. */
kiln_status kiln_meta_set_arr(kiln_meta *m, const char *key, kiln_meta_type t, const void *elems,
                              uint64_t n, kiln_err *err);
kiln_arena *kiln_meta_arena(kiln_meta *m);

/* ---- reading ---- */
size_t kiln_meta_count(const kiln_meta *m);
/* The i-th entry in file order (i < count), or NULL. */
const kiln_meta_entry *kiln_meta_at(const kiln_meta *m, size_t i);
/* The value of key, or NULL when absent. */
const kiln_meta_value *kiln_meta_find(const kiln_meta *m, const char *key);
const kiln_meta_value *kiln_meta_find_str(const kiln_meta *m, kiln_str key);
bool kiln_meta_has(const kiln_meta *m, const char *key);

kiln_status kiln_meta_get_u32(const kiln_meta *m, const char *key, uint32_t *out, kiln_err *err);
kiln_status kiln_meta_get_i32(const kiln_meta *m, const char *key, int32_t *out, kiln_err *err);
kiln_status kiln_meta_get_u64(const kiln_meta *m, const char *key, uint64_t *out, kiln_err *err);
kiln_status kiln_meta_get_i64(const kiln_meta *m, const char *key, int64_t *out, kiln_err *err);
kiln_status kiln_meta_get_f32(const kiln_meta *m, const char *key, float *out, kiln_err *err);
kiln_status kiln_meta_get_f64(const kiln_meta *m, const char *key, double *out, kiln_err *err);
kiln_status kiln_meta_get_bool(const kiln_meta *m, const char *key, bool *out, kiln_err *err);
kiln_status kiln_meta_get_str(const kiln_meta *m, const char *key, kiln_str *out, kiln_err *err);

kiln_status kiln_meta_opt_u32(const kiln_meta *m, const char *key, uint32_t def, uint32_t *out,
                              kiln_err *err);
kiln_status kiln_meta_opt_i32(const kiln_meta *m, const char *key, int32_t def, int32_t *out,
                              kiln_err *err);
kiln_status kiln_meta_opt_u64(const kiln_meta *m, const char *key, uint64_t def, uint64_t *out,
                              kiln_err *err);
kiln_status kiln_meta_opt_i64(const kiln_meta *m, const char *key, int64_t def, int64_t *out,
                              kiln_err *err);
kiln_status kiln_meta_opt_f32(const kiln_meta *m, const char *key, float def, float *out,
                              kiln_err *err);
kiln_status kiln_meta_opt_f64(const kiln_meta *m, const char *key, double def, double *out,
                              kiln_err *err);
kiln_status kiln_meta_opt_bool(const kiln_meta *m, const char *key, bool def, bool *out,
                               kiln_err *err);
/* def may be NULL: *out = {NULL, 0} when the key is missing. */
kiln_status kiln_meta_opt_str(const kiln_meta *m, const char *key, const char *def, kiln_str *out,
                              kiln_err *err);
/* malloc'ed NUL-terminated copy (free with free()); KILN_ERR_NOT_FOUND when missing. */
kiln_status kiln_meta_dup_str(const kiln_meta *m, const char *key, char **out, kiln_err *err);

/* Conversions of one value (the rules above); `what` names it in the error message. */
kiln_status kiln_meta_value_i64(const kiln_meta_value *v, int64_t *out, const char *what,
                                kiln_err *err);
kiln_status kiln_meta_value_u64(const kiln_meta_value *v, uint64_t *out, const char *what,
                                kiln_err *err);
kiln_status kiln_meta_value_f64(const kiln_meta_value *v, double *out, const char *what,
                                kiln_err *err);

/* ---- arrays ---- */
/* The array value of key. elem_type: the element type required, or -1 for any.
 * KILN_ERR_NOT_FOUND when missing, KILN_ERR_TYPE when not an array of elem_type. */
kiln_status kiln_meta_get_arr(const kiln_meta *m, const char *key, int elem_type,
                              const kiln_meta_value **out, kiln_err *err);
/* Element i of an array (i < count; out-of-range or wrong kind returns false). Integer
 * getters accept any integer element type whose value fits; f64/f32 accept floats and
 * integers; str needs a string array; item needs an array of arrays. */
bool kiln_meta_arr_i64(const kiln_meta_value *arr, uint64_t i, int64_t *out);
bool kiln_meta_arr_u64(const kiln_meta_value *arr, uint64_t i, uint64_t *out);
bool kiln_meta_arr_f64(const kiln_meta_value *arr, uint64_t i, double *out);
bool kiln_meta_arr_f32(const kiln_meta_value *arr, uint64_t i, float *out);
bool kiln_meta_arr_bool(const kiln_meta_value *arr, uint64_t i, bool *out);
bool kiln_meta_arr_str(const kiln_meta_value *arr, uint64_t i, kiln_str *out);
const kiln_meta_value *kiln_meta_arr_item(const kiln_meta_value *arr, uint64_t i);
/* Bulk copies of a whole numeric array into dst (n == arr->count elements), converting
 * (f32: floats and small integers; i32: integers that fit). KILN_ERR_TYPE otherwise. */
kiln_status kiln_meta_arr_copy_f32(const kiln_meta_value *arr, float *dst, uint64_t n,
                                   const char *what, kiln_err *err);
kiln_status kiln_meta_arr_copy_i32(const kiln_meta_value *arr, int32_t *dst, uint64_t n,
                                   const char *what, kiln_err *err);

/* Writes a short human-readable rendering of v into buf ("12", "\"llama\"",
 * "[array of 262144 string]", ...); strings longer than max_str are cut with "...". */
void kiln_meta_value_fmt(const kiln_meta_value *v, char *buf, size_t n, size_t max_str);

/* ---- a name -> index hash map (used for tensor tables too) ---- */
typedef struct kiln_strmap {
    uint32_t *slots; /* index + 1; 0 = empty */
    size_t cap;      /* power of two */
} kiln_strmap;
/* Builds a map over names[0..n); on a duplicate name sets *dup to its second index and
 * returns KILN_ERR_FORMAT (no message: the caller names it). */
kiln_status kiln_strmap_build(kiln_strmap *map, const kiln_str *names, size_t n, size_t *dup,
                              kiln_err *err);
/* Index of key in names, or -1. names must be the array the map was built over. */
int64_t kiln_strmap_find(const kiln_strmap *map, const kiln_str *names, kiln_str key);
void kiln_strmap_free(kiln_strmap *map);

#endif /* KILN_FORMAT_META_H */
