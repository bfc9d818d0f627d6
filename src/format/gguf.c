/* gguf.c — GGUF v2/v3 parsing and validation (the format is described in gguf.h). */
#include "format/gguf.h"
#include "base/mapguard.h"
#include "base/mem.h"

#include "base/utf8.h"
#include "format/dtype.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_KEY_LEN  65535u /* the GGUF spec's limit */
#define MAX_NAME_LEN 4096u

struct kiln_gguf {
    char *path;
    int fd;
    bool mapped;
    const uint8_t *base;
    uint64_t size;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;
    kiln_meta meta;
    kiln_tensor_info *tensors;
    kiln_str *tensor_names;
    size_t n_tensors;
    size_t n_unsupported;
    kiln_strmap tensor_index;
};

/* A bounds-checked read cursor over the file image. */
typedef struct cursor {
    const uint8_t *base;
    uint64_t size, pos;
    kiln_arena *arena;
} cursor;

static uint64_t remaining(const cursor *c) {
    return c->size - c->pos;
}

static kiln_status rd_bytes(cursor *c, void *dst, uint64_t n, const char *what, kiln_err *err) {
    if (n > remaining(c)) {
        memset(dst, 0, (size_t)(n < 8 ? n : 8)); /* callers read at most 8 bytes */
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "truncated: %s needs %" PRIu64 " bytes at offset %" PRIu64
                            ", file has %" PRIu64,
                            what, n, c->pos, c->size);
    }
    memcpy(dst, c->base + c->pos, (size_t)n);
    c->pos += n;
    return KILN_OK;
}
static kiln_status rd_u32(cursor *c, uint32_t *v, const char *what, kiln_err *err) {
    return rd_bytes(c, v, 4, what, err);
}
static kiln_status rd_u64(cursor *c, uint64_t *v, const char *what, kiln_err *err) {
    return rd_bytes(c, v, 8, what, err);
}

/* A string: u64 length + bytes. The result points into the image. */
static kiln_status rd_str(cursor *c, kiln_str *s, const char *what, kiln_err *err) {
    uint64_t len = 0;
    KILN_TRY(rd_u64(c, &len, what, err));
    if (len > remaining(c))
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "absurd %s length %" PRIu64 " at offset %" PRIu64 " (only %" PRIu64
                            " bytes left: truncated or corrupt)",
                            what, len, c->pos - 8, remaining(c));
    s->ptr = (const char *)c->base + c->pos;
    s->len = (size_t)len;
    c->pos += len;
    return KILN_OK;
}

/* Smallest encoded size of one element of a type (to bound counts by the file size). */
static uint64_t min_encoded(uint32_t t) {
    if (t == KILN_META_STRING) return 8;
    if (t == KILN_META_ARRAY) return 12;
    return kiln_meta_type_size(t);
}

static kiln_status parse_value(cursor *c, uint32_t type, int depth, kiln_meta_value *out,
                               kiln_err *err);

static kiln_status parse_array(cursor *c, int depth, kiln_meta_value *out, kiln_err *err) {
    uint32_t et = 0;
    uint64_t n = 0;
    KILN_TRY(rd_u32(c, &et, "array element type", err));
    KILN_TRY(rd_u64(c, &n, "array length", err));
    if (et >= KILN_META_TYPE_COUNT)
        return kiln_err_set(err, KILN_ERR_FORMAT, "unknown array element type %u", et);
    if (et == KILN_META_ARRAY && depth + 1 >= KILN_GGUF_MAX_ARRAY_DEPTH)
        return kiln_err_set(err, KILN_ERR_FORMAT, "arrays nested deeper than %d",
                            KILN_GGUF_MAX_ARRAY_DEPTH);
    uint64_t min = min_encoded(et);
    if (n > remaining(c) / min)
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "absurd array length %" PRIu64 " of %s at offset %" PRIu64
                            " (only %" PRIu64 " bytes left: truncated or corrupt)",
                            n, kiln_meta_type_name(et), c->pos - 8, remaining(c));
    out->type = KILN_META_ARRAY;
    out->elem_type = (kiln_meta_type)et;
    out->count = n;
    if (et == KILN_META_STRING) {
        kiln_str *strs = kiln_arena_alloc(c->arena, n ? (size_t)n * sizeof *strs : 1);
        if (!strs) return kiln_err_set(err, KILN_ERR_NOMEM, "string array of %" PRIu64, n);
        for (uint64_t i = 0; i < n; i++) {
            kiln_status st = rd_str(c, &strs[i], "string", err);
            if (st) return kiln_err_wrap(err, st, "element %" PRIu64, i);
        }
        out->v.strs = strs;
    } else if (et == KILN_META_ARRAY) {
        kiln_meta_value *items = kiln_arena_calloc(c->arena, n ? (size_t)n : 1, sizeof *items);
        if (!items) return kiln_err_set(err, KILN_ERR_NOMEM, "nested array of %" PRIu64, n);
        for (uint64_t i = 0; i < n; i++) {
            kiln_status st = parse_value(c, KILN_META_ARRAY, depth + 1, &items[i], err);
            if (st) return kiln_err_wrap(err, st, "element %" PRIu64, i);
        }
        out->v.items = items;
    } else {
        uint64_t bytes = n * min; /* cannot overflow: n <= remaining / min */
        const uint8_t *p = c->base + c->pos;
        if (et == KILN_META_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (p[i] > 1)
                    return kiln_err_set(err, KILN_ERR_FORMAT, "element %" PRIu64 ": bool byte %u",
                                        i, p[i]);
        out->v.raw = p;
        c->pos += bytes;
    }
    return KILN_OK;
}

static kiln_status parse_value(cursor *c, uint32_t type, int depth, kiln_meta_value *out,
                               kiln_err *err) {
    memset(out, 0, sizeof *out);
    out->type = (kiln_meta_type)type;
    uint8_t b[8] = {0};
    switch (type) {
    case KILN_META_U8:
        KILN_TRY(rd_bytes(c, b, 1, "u8 value", err));
        out->v.u = b[0];
        return KILN_OK;
    case KILN_META_I8:
        KILN_TRY(rd_bytes(c, b, 1, "i8 value", err));
        out->v.i = (int8_t)b[0];
        return KILN_OK;
    case KILN_META_BOOL:
        KILN_TRY(rd_bytes(c, b, 1, "bool value", err));
        if (b[0] > 1) return kiln_err_set(err, KILN_ERR_FORMAT, "bool byte %u (not 0 or 1)", b[0]);
        out->v.b = b[0] != 0;
        return KILN_OK;
    case KILN_META_U16: {
        uint16_t x = 0;
        KILN_TRY(rd_bytes(c, &x, 2, "u16 value", err));
        out->v.u = x;
        return KILN_OK;
    }
    case KILN_META_I16: {
        int16_t x = 0;
        KILN_TRY(rd_bytes(c, &x, 2, "i16 value", err));
        out->v.i = x;
        return KILN_OK;
    }
    case KILN_META_U32: {
        uint32_t x = 0;
        KILN_TRY(rd_bytes(c, &x, 4, "u32 value", err));
        out->v.u = x;
        return KILN_OK;
    }
    case KILN_META_I32: {
        int32_t x = 0;
        KILN_TRY(rd_bytes(c, &x, 4, "i32 value", err));
        out->v.i = x;
        return KILN_OK;
    }
    case KILN_META_F32: {
        float x = 0;
        KILN_TRY(rd_bytes(c, &x, 4, "f32 value", err));
        out->v.f = x;
        return KILN_OK;
    }
    case KILN_META_U64:
        KILN_TRY(rd_bytes(c, &out->v.u, 8, "u64 value", err));
        return KILN_OK;
    case KILN_META_I64:
        KILN_TRY(rd_bytes(c, &out->v.i, 8, "i64 value", err));
        return KILN_OK;
    case KILN_META_F64:
        KILN_TRY(rd_bytes(c, &out->v.f, 8, "f64 value", err));
        return KILN_OK;
    case KILN_META_STRING:
        return rd_str(c, &out->v.s, "string value", err);
    case KILN_META_ARRAY:
        return parse_array(c, depth, out, err);
    default:
        return kiln_err_set(err, KILN_ERR_FORMAT, "unknown value type %u", type);
    }
}

/* Keys and tensor names: non-empty, bounded, valid UTF-8. */
static kiln_status check_name(kiln_str s, uint32_t max, const char *what, kiln_err *err) {
    if (s.len == 0) return kiln_err_set(err, KILN_ERR_FORMAT, "empty %s", what);
    if (s.len > max)
        return kiln_err_set(err, KILN_ERR_FORMAT, "%s of %zu bytes (limit %u)", what, s.len, max);
    const char *nul = memchr(s.ptr, 0, s.len);
    if (nul)
        return kiln_err_set(err, KILN_ERR_FORMAT, "%s contains a NUL byte at position %zu", what,
                            (size_t)(nul - s.ptr));
    size_t bad;
    if (!kiln_utf8_valid(s.ptr, s.len, &bad)) {
        size_t shown = bad < 64 ? bad : 64;
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "%s is not valid UTF-8 (byte 0x%02x at position %zu, after '%.*s')",
                            what, (unsigned)(uint8_t)s.ptr[bad], bad, (int)shown, s.ptr);
    }
    return KILN_OK;
}

static kiln_status parse_kv(kiln_gguf *g, cursor *c, uint64_t n_kv, kiln_err *err) {
    for (uint64_t i = 0; i < n_kv; i++) {
        kiln_str key;
        uint64_t at = c->pos;
        kiln_status st = rd_str(c, &key, "key", err);
        if (!st) st = check_name(key, MAX_KEY_LEN, "key", err);
        if (st)
            return kiln_err_wrap(err, st, "metadata entry %" PRIu64 " (offset %" PRIu64 ")", i, at);
        uint32_t type = 0;
        kiln_meta_value v;
        st = rd_u32(c, &type, "value type", err);
        if (!st && type >= KILN_META_TYPE_COUNT)
            st = kiln_err_set(err, KILN_ERR_FORMAT, "unknown value type %u", type);
        if (!st) st = parse_value(c, type, 0, &v, err);
        if (!st) st = kiln_meta_add(&g->meta, key, &v, err);
        if (st) return kiln_err_wrap(err, st, "key '%.*s'", (int)key.len, key.ptr);
    }
    return KILN_OK;
}

static kiln_status read_alignment(kiln_gguf *g, kiln_err *err) {
    g->alignment = KILN_GGUF_DEFAULT_ALIGNMENT;
    const kiln_meta_value *v = kiln_meta_find(&g->meta, "general.alignment");
    if (!v) return KILN_OK;
    if (v->type != KILN_META_U32)
        return kiln_err_set(err, KILN_ERR_FORMAT, "key 'general.alignment': type %s, expected u32",
                            kiln_meta_type_name(v->type));
    if (v->v.u == 0 || (v->v.u & (v->v.u - 1)) != 0)
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "key 'general.alignment': %" PRIu64 " is not a power of two", v->v.u);
    g->alignment = (uint32_t)v->v.u;
    return KILN_OK;
}

static kiln_status parse_tensor_info(kiln_gguf *g, cursor *c, size_t i, kiln_err *err) {
    kiln_tensor_info *t = &g->tensors[i];
    kiln_str name;
    KILN_TRY(rd_str(c, &name, "tensor name", err));
    KILN_TRY(check_name(name, MAX_NAME_LEN, "tensor name", err));
    char *nm = kiln_arena_strndup(&g->meta.arena, name.ptr, name.len);
    if (!nm) return kiln_err_set(err, KILN_ERR_NOMEM, "tensor name");
    t->name = nm;
    t->name_len = name.len;
    g->tensor_names[i].ptr = nm;
    g->tensor_names[i].len = name.len;
    kiln_status st;
    uint32_t n_dims = 0;
    if ((st = rd_u32(c, &n_dims, "n_dims", err))) goto fail;
    if (n_dims > KILN_MAX_DIMS) {
        st =
            kiln_err_set(err, KILN_ERR_FORMAT, "%u dimensions (at most %d)", n_dims, KILN_MAX_DIMS);
        goto fail;
    }
    t->rank = (int)n_dims;
    for (int d = 0; d < KILN_MAX_DIMS; d++) t->shape[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t x = 0;
        if ((st = rd_u64(c, &x, "dimension", err))) goto fail;
        if (x > (uint64_t)INT64_MAX) {
            st = kiln_err_set(err, KILN_ERR_FORMAT, "dimension %u is negative (%" PRId64 ")", d,
                              (int64_t)x);
            goto fail;
        }
        t->shape[d] = (int64_t)x;
    }
    /* element count must fit in int64 */
    uint64_t ne = 1;
    for (int d = 0; d < KILN_MAX_DIMS; d++)
        if (!kiln_u64_mul(ne, (uint64_t)t->shape[d], &ne) || ne > (uint64_t)INT64_MAX) {
            st = kiln_err_set(err, KILN_ERR_OVERFLOW, "element count overflows");
            goto fail;
        }
    uint32_t type = 0;
    if ((st = rd_u32(c, &type, "tensor type", err))) goto fail;
    const kiln_dtype_info *dt = kiln_dtype_get(type);
    if (!dt) {
        st = kiln_err_set(err, KILN_ERR_FORMAT, "unknown tensor type id %u", type);
        goto fail;
    }
    t->dtype = type;
    t->supported = dt->supported;
    if (!dt->supported) g->n_unsupported++;
    size_t nbytes;
    if ((st = kiln_dtype_nbytes(type, t->shape, KILN_MAX_DIMS, &nbytes, err))) goto fail;
    t->nbytes = nbytes;
    if ((st = rd_u64(c, &t->offset, "tensor offset", err))) goto fail;
    return KILN_OK;
fail:
    return kiln_err_wrap(err, st, "tensor '%s'", nm);
}

static int cmp_by_offset(const void *a, const void *b) {
    const kiln_tensor_info *x = *(const kiln_tensor_info *const *)a;
    const kiln_tensor_info *y = *(const kiln_tensor_info *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Places every tensor in the data section; rejects misalignment, ranges outside the
 * file and overlaps. */
static kiln_status place_tensors(kiln_gguf *g, uint32_t flags, kiln_err *err) {
    uint64_t data_size = g->size > g->data_offset ? g->size - g->data_offset : 0;
    for (size_t i = 0; i < g->n_tensors; i++) {
        kiln_tensor_info *t = &g->tensors[i];
        if (t->offset % g->alignment != 0)
            return kiln_err_set(err, KILN_ERR_FORMAT,
                                "tensor '%s': offset %" PRIu64
                                " is not a multiple of the alignment %u",
                                t->name, t->offset, g->alignment);
        uint64_t end;
        if (!kiln_u64_add(t->offset, t->nbytes, &end) || end > data_size)
            return kiln_err_set(err, KILN_ERR_FORMAT,
                                "tensor '%s': bytes [%" PRIu64 ", +%" PRIu64
                                ") lie outside the data section (%" PRIu64
                                " bytes at offset %" PRIu64 "; file truncated?)",
                                t->name, t->offset, t->nbytes, data_size, g->data_offset);
        if ((flags & KILN_FILE_REQUIRE_SUPPORTED) && !t->supported)
            return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                                "tensor '%s': type %s is not supported by kiln", t->name,
                                kiln_dtype_name(t->dtype));
    }
    /* overlap: sort by offset and compare neighbours (empty tensors overlap nothing) */
    if (g->n_tensors > 1) {
        const kiln_tensor_info **order = kiln_malloc(g->n_tensors * sizeof *order);
        if (!order) return kiln_err_set(err, KILN_ERR_NOMEM, "tensor order");
        size_t n = 0;
        for (size_t i = 0; i < g->n_tensors; i++)
            if (g->tensors[i].nbytes) order[n++] = &g->tensors[i];
        qsort(order, n, sizeof *order, cmp_by_offset);
        for (size_t i = 1; i < n; i++) {
            if (order[i - 1]->offset + order[i - 1]->nbytes > order[i]->offset) {
                kiln_status st =
                    kiln_err_set(err, KILN_ERR_FORMAT,
                                 "tensor '%s' [%" PRIu64 ", +%" PRIu64
                                 ") overlaps tensor '%s' [%" PRIu64 ", +%" PRIu64 ")",
                                 order[i]->name, order[i]->offset, order[i]->nbytes,
                                 order[i - 1]->name, order[i - 1]->offset, order[i - 1]->nbytes);
                kiln_free(order);
                return st;
            }
        }
        kiln_free(order);
    }
    for (size_t i = 0; i < g->n_tensors; i++) {
        kiln_tensor_info *t = &g->tensors[i];
        t->offset += g->data_offset; /* absolute from here on */
        t->data = g->base + t->offset;
        t->file = 0;
    }
    return KILN_OK;
}

static kiln_status parse(kiln_gguf *g, uint32_t flags, kiln_err *err) {
    cursor c = {g->base, g->size, 0, &g->meta.arena};
    uint32_t magic = 0;
    if (g->size < 4)
        return kiln_err_set(err, KILN_ERR_FORMAT, "truncated: %" PRIu64 " bytes, not a GGUF file",
                            g->size);
    KILN_TRY(rd_u32(&c, &magic, "magic", err));
    if (magic != KILN_GGUF_MAGIC)
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "bad magic %02x %02x %02x %02x (expected \"GGUF\"): not a GGUF file",
                            g->base[0], g->base[1], g->base[2], g->base[3]);
    KILN_TRY(rd_u32(&c, &g->version, "version", err));
    if (g->version == 1)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "GGUF version 1 is not supported (only 2 and 3)");
    if ((g->version & 0xffff) == 0 && g->version != 0)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "big-endian GGUF (version field 0x%08x) is not supported", g->version);
    if (g->version != 2 && g->version != 3)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "GGUF version %u is not supported (only 2 and 3)", g->version);
    uint64_t n_tensors = 0, n_kv = 0;
    KILN_TRY(rd_u64(&c, &n_tensors, "tensor count", err));
    KILN_TRY(rd_u64(&c, &n_kv, "metadata count", err));
    /* a key/value pair takes at least 13 bytes, a tensor info at least 24 */
    if (n_kv > remaining(&c) / 13)
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "absurd metadata count %" PRIu64 " for a file of %" PRIu64 " bytes",
                            n_kv, g->size);
    if (n_tensors > remaining(&c) / 24)
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "absurd tensor count %" PRIu64 " for a file of %" PRIu64 " bytes",
                            n_tensors, g->size);
    KILN_TRY(parse_kv(g, &c, n_kv, err));
    KILN_TRY(read_alignment(g, err));

    g->n_tensors = (size_t)n_tensors;
    g->tensors = kiln_calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    g->tensor_names = kiln_calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensor_names);
    if (!g->tensors || !g->tensor_names)
        return kiln_err_set(err, KILN_ERR_NOMEM, "tensor table of %zu entries", g->n_tensors);
    for (size_t i = 0; i < g->n_tensors; i++) {
        kiln_status st = parse_tensor_info(g, &c, i, err);
        if (st) return kiln_err_wrap(err, st, "tensor info %zu", i);
    }
    size_t dup = 0;
    kiln_status st = kiln_strmap_build(&g->tensor_index, g->tensor_names, g->n_tensors, &dup, err);
    if (st == KILN_ERR_FORMAT)
        return kiln_err_set(err, KILN_ERR_FORMAT, "duplicate tensor name '%s' (tensor info %zu)",
                            g->tensors[dup].name, dup);
    if (st) return st;
    size_t data_off;
    if (!kiln_size_align_up((size_t)c.pos, g->alignment, &data_off))
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "data section offset overflows");
    g->data_offset = data_off;
    return place_tensors(g, flags, err);
}

static kiln_status finish_open(kiln_gguf *g, uint32_t flags, kiln_gguf **out, kiln_err *err) {
    kiln_status st = parse(g, flags, err);
    if (st) {
        kiln_err_wrap(err, st, "%s", g->path);
        kiln_gguf_close(g);
        return st;
    }
    *out = g;
    return KILN_OK;
}

static kiln_gguf *gguf_new(const char *name) {
    kiln_gguf *g = kiln_calloc(1, sizeof *g);
    if (!g) return NULL;
    g->fd = -1;
    kiln_meta_init(&g->meta);
    g->path = kiln_strdup(name);
    if (!g->path) {
        kiln_meta_free(&g->meta);
        kiln_free(g);
        return NULL;
    }
    return g;
}

kiln_status kiln_gguf_open_buffer(const void *data, size_t size, const char *name, uint32_t flags,
                                  kiln_gguf **out, kiln_err *err) {
    *out = NULL;
    if (!data && size) return kiln_err_set(err, KILN_ERR_INVALID_ARG, "NULL buffer");
    kiln_gguf *g = gguf_new(name ? name : "<buffer>");
    if (!g) return kiln_err_set(err, KILN_ERR_NOMEM, "gguf: out of memory");
    static const uint8_t empty[1];
    g->base = data ? data : empty;
    g->size = size;
    return finish_open(g, flags, out, err);
}

kiln_status kiln_gguf_open(const char *path, uint32_t flags, kiln_gguf **out, kiln_err *err) {
    *out = NULL;
    kiln_gguf *g = gguf_new(path);
    if (!g) return kiln_err_set(err, KILN_ERR_NOMEM, "gguf: out of memory");
    g->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (g->fd < 0) {
        kiln_status st = kiln_err_errno(err, errno, "opening %s", path);
        kiln_gguf_close(g);
        return st;
    }
    struct stat sb;
    if (fstat(g->fd, &sb) != 0) {
        kiln_status st = kiln_err_errno(err, errno, "stat %s", path);
        kiln_gguf_close(g);
        return st;
    }
    if (!S_ISREG(sb.st_mode)) {
        kiln_gguf_close(g);
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "%s: not a regular file", path);
    }
    g->size = (uint64_t)sb.st_size;
    static const uint8_t empty[1];
    g->base = empty;
    if (g->size > 0) {
        void *p = mmap(NULL, (size_t)g->size, PROT_READ, MAP_SHARED, g->fd, 0);
        if (p == MAP_FAILED) {
            kiln_status st =
                kiln_err_errno(err, errno, "mmap %s (%" PRIu64 " bytes)", path, g->size);
            kiln_gguf_close(g);
            return st;
        }
        g->base = p;
        g->mapped = true;
        kiln_mapguard_add(p, (size_t)g->size, g->path); /* SIGBUS -> status (mapguard.h) */
    }
    return finish_open(g, flags, out, err);
}

void kiln_gguf_close(kiln_gguf *g) {
    if (!g) return;
    if (g->mapped) {
        kiln_mapguard_remove(g->base);
        munmap((void *)g->base, (size_t)g->size);
    }
    if (g->fd >= 0) close(g->fd);
    kiln_strmap_free(&g->tensor_index);
    kiln_free(g->tensors);
    kiln_free(g->tensor_names);
    kiln_meta_free(&g->meta);
    kiln_free(g->path);
    kiln_free(g);
}

const char *kiln_gguf_path(const kiln_gguf *g) {
    return g->path;
}
uint32_t kiln_gguf_version(const kiln_gguf *g) {
    return g->version;
}
uint32_t kiln_gguf_alignment(const kiln_gguf *g) {
    return g->alignment;
}
uint64_t kiln_gguf_data_offset(const kiln_gguf *g) {
    return g->data_offset;
}
uint64_t kiln_gguf_file_size(const kiln_gguf *g) {
    return g->size;
}
const void *kiln_gguf_base(const kiln_gguf *g) {
    return g->base;
}
int kiln_gguf_fd(const kiln_gguf *g) {
    return g->fd;
}
const kiln_meta *kiln_gguf_meta(const kiln_gguf *g) {
    return &g->meta;
}
size_t kiln_gguf_tensor_count(const kiln_gguf *g) {
    return g->n_tensors;
}
const kiln_tensor_info *kiln_gguf_tensor(const kiln_gguf *g, size_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}
const kiln_tensor_info *kiln_gguf_find_tensor(const kiln_gguf *g, const char *name) {
    int64_t i = kiln_strmap_find(&g->tensor_index, g->tensor_names, kiln_str_c(name));
    return i < 0 ? NULL : &g->tensors[i];
}
size_t kiln_gguf_unsupported_count(const kiln_gguf *g) {
    return g->n_unsupported;
}
