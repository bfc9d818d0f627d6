/*
 * test_gguf_builder.h — builds GGUF images byte by byte for the format and loader tests,
 * including deliberately malformed ones. Header-only (static functions); the buffer is
 * malloc'ed and grows; allocation failure aborts the test (test code only).
 */
#ifndef KILN_TESTS_GGUF_BUILDER_H
#define KILN_TESTS_GGUF_BUILDER_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GB_UNUSED __attribute__((unused))

typedef struct gb_buf {
    uint8_t *p;
    size_t n, cap;
} gb_buf;

GB_UNUSED static void gb_put(gb_buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            fprintf(stderr, "gb_put: out of memory\n");
            abort();
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}
GB_UNUSED static void gb_u8(gb_buf *b, uint8_t v) {
    gb_put(b, &v, 1);
}
GB_UNUSED static void gb_u32(gb_buf *b, uint32_t v) {
    gb_put(b, &v, 4);
}
GB_UNUSED static void gb_u64(gb_buf *b, uint64_t v) {
    gb_put(b, &v, 8);
}
GB_UNUSED static void gb_f32(gb_buf *b, float v) {
    gb_put(b, &v, 4);
}
GB_UNUSED static void gb_strn(gb_buf *b, const char *s, size_t n) {
    gb_u64(b, n);
    gb_put(b, s, n);
}
GB_UNUSED static void gb_str(gb_buf *b, const char *s) {
    gb_strn(b, s, strlen(s));
}
GB_UNUSED static void gb_pad(gb_buf *b, size_t align) {
    while (b->n % align) gb_u8(b, 0);
}
GB_UNUSED static void gb_free(gb_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* GGUF value type ids */
enum {
    GT_U8,
    GT_I8,
    GT_U16,
    GT_I16,
    GT_U32,
    GT_I32,
    GT_F32,
    GT_BOOL,
    GT_STR,
    GT_ARR,
    GT_U64,
    GT_I64,
    GT_F64
};

GB_UNUSED static void gb_header(gb_buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    gb_put(b, "GGUF", 4);
    gb_u32(b, version);
    gb_u64(b, n_tensors);
    gb_u64(b, n_kv);
}
GB_UNUSED static void gb_kv_u32(gb_buf *b, const char *k, uint32_t v) {
    gb_str(b, k);
    gb_u32(b, GT_U32);
    gb_u32(b, v);
}
GB_UNUSED static void gb_kv_f32(gb_buf *b, const char *k, float v) {
    gb_str(b, k);
    gb_u32(b, GT_F32);
    gb_f32(b, v);
}
GB_UNUSED static void gb_kv_str(gb_buf *b, const char *k, const char *v) {
    gb_str(b, k);
    gb_u32(b, GT_STR);
    gb_str(b, v);
}
GB_UNUSED static void gb_tensor_info(gb_buf *b, const char *name, uint32_t n_dims,
                                     const uint64_t *dims, uint32_t type, uint64_t offset) {
    gb_str(b, name);
    gb_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) gb_u64(b, dims[i]);
    gb_u32(b, type);
    gb_u64(b, offset);
}

/* ---- a whole model: tensors laid out with correct offsets --------------------------- */

typedef struct gb_tensor {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t dims[4];
    const void *data; /* nbytes bytes, or NULL for a deterministic pattern */
    size_t nbytes;
} gb_tensor;

/* Appends tensor infos, padding and data for ts[0..n) (call after the header and the
 * key/value pairs; the header's tensor count must be n). */
GB_UNUSED static void gb_tensors(gb_buf *b, const gb_tensor *ts, size_t n, size_t align) {
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        gb_tensor_info(b, ts[i].name, ts[i].n_dims, ts[i].dims, ts[i].type, off);
        off += ts[i].nbytes;
        off = (off + align - 1) / align * align;
    }
    gb_pad(b, align);
    for (size_t i = 0; i < n; i++) {
        if (ts[i].data) {
            gb_put(b, ts[i].data, ts[i].nbytes);
        } else {
            for (size_t j = 0; j < ts[i].nbytes; j++) gb_u8(b, (uint8_t)(j * 31 + i * 7 + 1));
        }
        gb_pad(b, align);
    }
}

#endif /* KILN_TESTS_GGUF_BUILDER_H */
