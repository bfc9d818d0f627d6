/* safetensors.c — safetensors parsing and validation (format in safetensors.h). */
#include "format/safetensors.h"
#include "base/mapguard.h"
#include "base/mem.h"

#include "format/dtype.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct kiln_safetensors {
    char *path;
    int fd;
    bool mapped;
    const uint8_t *base;
    uint64_t size;
    uint64_t data_offset;
    uint32_t alignment;
    kiln_meta meta; /* __metadata__; its arena also holds tensor names */
    kiln_tensor_info *tensors;
    kiln_str *names;
    size_t n_tensors;
    kiln_strmap index;
};

static const struct {
    const char *name;
    uint32_t dtype;
} st_dtypes[] = {
    {"F64", KILN_DTYPE_F64},   {"F32", KILN_DTYPE_F32}, {"F16", KILN_DTYPE_F16},
    {"BF16", KILN_DTYPE_BF16}, {"I64", KILN_DTYPE_I64}, {"I32", KILN_DTYPE_I32},
    {"I16", KILN_DTYPE_I16},   {"I8", KILN_DTYPE_I8},
};

bool kiln_st_dtype_from_name(const char *s, uint32_t *out) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = st_dtypes[i].dtype;
            return true;
        }
    return false;
}

/* A JSON integer >= 0 (json_int_t is long long). */
static bool json_nonneg(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x < 0) return false;
    *out = (uint64_t)x;
    return true;
}

static kiln_status parse_tensor(kiln_safetensors *st, size_t i, const char *name, size_t name_len,
                                json_t *obj, uint64_t data_size, kiln_err *err) {
    kiln_tensor_info *t = &st->tensors[i];
    char *nm = kiln_arena_strndup(&st->meta.arena, name, name_len);
    if (!nm) return kiln_err_set(err, KILN_ERR_NOMEM, "tensor name");
    t->name = nm;
    t->name_len = name_len;
    st->names[i].ptr = nm;
    st->names[i].len = name_len;
    if (!json_is_object(obj)) return kiln_err_set(err, KILN_ERR_FORMAT, "entry is not an object");
    json_t *dt = json_object_get(obj, "dtype"), *shape = json_object_get(obj, "shape"),
           *offs = json_object_get(obj, "data_offsets");
    if (!json_is_string(dt))
        return kiln_err_set(err, KILN_ERR_FORMAT, "missing or non-string \"dtype\"");
    if (!json_is_array(shape))
        return kiln_err_set(err, KILN_ERR_FORMAT, "missing or non-array \"shape\"");
    if (!json_is_array(offs) || json_array_size(offs) != 2)
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "\"data_offsets\" is not an array of two integers");
    if (!kiln_st_dtype_from_name(json_string_value(dt), &t->dtype))
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "dtype \"%s\" is not supported by kiln",
                            json_string_value(dt));
    const kiln_dtype_info *di = kiln_dtype_get(t->dtype);
    t->supported = di->supported;
    size_t rank = json_array_size(shape);
    if (rank > KILN_MAX_DIMS)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "rank %zu (kiln supports at most %d)", rank,
                            KILN_MAX_DIMS);
    t->rank = (int)rank;
    for (int d = 0; d < KILN_MAX_DIMS; d++) t->shape[d] = 1;
    uint64_t ne = 1;
    for (size_t d = 0; d < rank; d++) {
        uint64_t x;
        if (!json_nonneg(json_array_get(shape, d), &x))
            return kiln_err_set(err, KILN_ERR_FORMAT, "shape[%zu] is not a non-negative integer",
                                d);
        t->shape[rank - 1 - d] = (int64_t)x; /* row-major -> ggml order */
        if (!kiln_u64_mul(ne, x, &ne) || ne > (uint64_t)INT64_MAX)
            return kiln_err_set(err, KILN_ERR_OVERFLOW, "element count overflows");
    }
    uint64_t begin, end;
    if (!json_nonneg(json_array_get(offs, 0), &begin) ||
        !json_nonneg(json_array_get(offs, 1), &end))
        return kiln_err_set(err, KILN_ERR_FORMAT, "\"data_offsets\" are not non-negative integers");
    if (end < begin)
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "data_offsets [%" PRIu64 ", %" PRIu64 "] end before begin", begin, end);
    if (end > data_size)
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "data_offsets [%" PRIu64 ", %" PRIu64
                            "] outside the data section (%" PRIu64 " bytes; file truncated?)",
                            begin, end, data_size);
    uint64_t nbytes;
    if (!kiln_u64_mul(ne, di->block_bytes, &nbytes))
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "byte size overflows");
    if (nbytes != end - begin)
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "shape x dtype = %" PRIu64 " bytes but data_offsets span %" PRIu64,
                            nbytes, end - begin);
    t->nbytes = nbytes;
    t->offset = st->data_offset + begin;
    if (nbytes && t->offset % di->block_bytes != 0)
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "data at file offset %" PRIu64
                            " is not aligned to its %u-byte elements",
                            t->offset, di->block_bytes);
    t->data = st->base + t->offset;
    t->file = 0;
    return KILN_OK;
}

static int cmp_off(const void *a, const void *b) {
    const kiln_tensor_info *x = *(const kiln_tensor_info *const *)a;
    const kiln_tensor_info *y = *(const kiln_tensor_info *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* The data section must be covered exactly: no overlaps, holes or trailing bytes. */
static kiln_status check_coverage(kiln_safetensors *st, kiln_err *err) {
    const kiln_tensor_info **o = kiln_malloc((st->n_tensors ? st->n_tensors : 1) * sizeof *o);
    if (!o) return kiln_err_set(err, KILN_ERR_NOMEM, "tensor order");
    for (size_t i = 0; i < st->n_tensors; i++) o[i] = &st->tensors[i];
    qsort(o, st->n_tensors, sizeof *o, cmp_off);
    uint64_t pos = st->data_offset;
    kiln_status rc = KILN_OK;
    const kiln_tensor_info *prev = NULL;
    for (size_t i = 0; i < st->n_tensors && !rc; i++) {
        if (o[i]->offset < pos)
            rc = kiln_err_set(err, KILN_ERR_FORMAT,
                              "tensor '%s' [%" PRIu64 ", +%" PRIu64 ") overlaps tensor '%s'",
                              o[i]->name, o[i]->offset - st->data_offset, o[i]->nbytes,
                              prev ? prev->name : "?");
        else if (o[i]->offset > pos)
            rc = kiln_err_set(err, KILN_ERR_FORMAT,
                              "tensor '%s': %" PRIu64 " unindexed bytes (a hole) before it at data "
                              "offset %" PRIu64,
                              o[i]->name, o[i]->offset - pos, pos - st->data_offset);
        pos = o[i]->offset + o[i]->nbytes;
        prev = o[i];
    }
    if (!rc && pos != st->size)
        rc = kiln_err_set(err, KILN_ERR_FORMAT,
                          "%" PRIu64 " trailing bytes after the last tensor are not indexed",
                          st->size - pos);
    kiln_free(o);
    return rc;
}

static kiln_status parse(kiln_safetensors *st, uint32_t flags, kiln_err *err) {
    if (st->size < 8)
        return kiln_err_set(err, KILN_ERR_FORMAT, "truncated: %" PRIu64 " bytes, no header length",
                            st->size);
    uint64_t n;
    memcpy(&n, st->base, 8);
    if (n > KILN_ST_MAX_HEADER)
        return kiln_err_set(err, KILN_ERR_FORMAT, "absurd header length %" PRIu64 " (limit %u)", n,
                            KILN_ST_MAX_HEADER);
    if (n > st->size - 8)
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "truncated: header of %" PRIu64 " bytes, file has %" PRIu64, n,
                            st->size - 8);
    st->data_offset = 8 + n;
    uint64_t data_size = st->size - st->data_offset;
    json_error_t je;
    json_t *root = json_loadb((const char *)st->base + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return kiln_err_set(err, KILN_ERR_FORMAT, "header JSON: %s (line %d, column %d)", je.text,
                            je.line, je.column);
    kiln_status rc = KILN_OK;
    if (!json_is_object(root)) {
        rc = kiln_err_set(err, KILN_ERR_FORMAT, "header JSON is not an object");
        goto done;
    }
    size_t cap = json_object_size(root);
    st->tensors = kiln_calloc(cap ? cap : 1, sizeof *st->tensors);
    st->names = kiln_calloc(cap ? cap : 1, sizeof *st->names);
    if (!st->tensors || !st->names) {
        rc = kiln_err_set(err, KILN_ERR_NOMEM, "tensor table of %zu", cap);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        size_t klen = strlen(key);
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                rc = kiln_err_set(err, KILN_ERR_FORMAT, "__metadata__ is not an object");
                goto done;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    rc =
                        kiln_err_set(err, KILN_ERR_FORMAT, "__metadata__ '%s' is not a string", mk);
                    goto done;
                }
                kiln_str s = {json_string_value(mv), json_string_length(mv)};
                if ((rc = kiln_meta_set_str(&st->meta, mk, s, err))) goto done;
            }
            continue;
        }
        if (klen == 0) {
            rc = kiln_err_set(err, KILN_ERR_FORMAT, "empty tensor name");
            goto done;
        }
        size_t i = st->n_tensors++;
        rc = parse_tensor(st, i, key, klen, val, data_size, err);
        if (!rc && (flags & KILN_FILE_REQUIRE_SUPPORTED) && !st->tensors[i].supported)
            rc = kiln_err_set(err, KILN_ERR_UNSUPPORTED, "type %s is not supported by kiln",
                              kiln_dtype_name(st->tensors[i].dtype));
        if (rc) {
            kiln_err_wrap(err, rc, "tensor '%s'", key);
            goto done;
        }
    }
    if ((rc = check_coverage(st, err))) goto done;
    size_t dup;
    if ((rc = kiln_strmap_build(&st->index, st->names, st->n_tensors, &dup, err))) {
        if (rc == KILN_ERR_FORMAT)
            kiln_err_set(err, rc, "duplicate tensor name '%s'", st->tensors[dup].name);
        goto done;
    }
    st->alignment = 64;
    for (size_t i = 0; i < st->n_tensors; i++)
        while (st->tensors[i].nbytes && st->tensors[i].offset % st->alignment) st->alignment /= 2;
done:
    json_decref(root);
    return rc;
}

static kiln_safetensors *st_new(const char *name) {
    kiln_safetensors *st = kiln_calloc(1, sizeof *st);
    if (!st) return NULL;
    st->fd = -1;
    kiln_meta_init(&st->meta);
    st->path = kiln_strdup(name);
    if (!st->path) {
        kiln_meta_free(&st->meta);
        kiln_free(st);
        return NULL;
    }
    return st;
}

static kiln_status finish(kiln_safetensors *st, uint32_t flags, kiln_safetensors **out,
                          kiln_err *err) {
    kiln_status rc = parse(st, flags, err);
    if (rc) {
        kiln_err_wrap(err, rc, "%s", st->path);
        kiln_st_close(st);
        return rc;
    }
    *out = st;
    return KILN_OK;
}

kiln_status kiln_st_open_buffer(const void *data, size_t size, const char *name, uint32_t flags,
                                kiln_safetensors **out, kiln_err *err) {
    *out = NULL;
    if (!data && size) return kiln_err_set(err, KILN_ERR_INVALID_ARG, "NULL buffer");
    kiln_safetensors *st = st_new(name ? name : "<buffer>");
    if (!st) return kiln_err_set(err, KILN_ERR_NOMEM, "safetensors: out of memory");
    static const uint8_t empty[8];
    st->base = data ? data : empty;
    st->size = size;
    return finish(st, flags, out, err);
}

kiln_status kiln_st_open(const char *path, uint32_t flags, kiln_safetensors **out, kiln_err *err) {
    *out = NULL;
    kiln_safetensors *st = st_new(path);
    if (!st) return kiln_err_set(err, KILN_ERR_NOMEM, "safetensors: out of memory");
    kiln_status rc = KILN_OK;
    struct stat sb;
    st->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (st->fd < 0) {
        rc = kiln_err_errno(err, errno, "opening %s", path);
    } else if (fstat(st->fd, &sb) != 0) {
        rc = kiln_err_errno(err, errno, "stat %s", path);
    } else if (!S_ISREG(sb.st_mode)) {
        rc = kiln_err_set(err, KILN_ERR_INVALID_ARG, "%s: not a regular file", path);
    }
    if (rc) {
        kiln_st_close(st);
        return rc;
    }
    st->size = (uint64_t)sb.st_size;
    static const uint8_t empty[8];
    st->base = empty;
    if (st->size) {
        void *p = mmap(NULL, (size_t)st->size, PROT_READ, MAP_SHARED, st->fd, 0);
        if (p == MAP_FAILED) {
            rc = kiln_err_errno(err, errno, "mmap %s", path);
            kiln_st_close(st);
            return rc;
        }
        st->base = p;
        st->mapped = true;
        kiln_mapguard_add(p, (size_t)st->size, st->path); /* SIGBUS -> status (mapguard.h) */
    }
    return finish(st, flags, out, err);
}

void kiln_st_close(kiln_safetensors *st) {
    if (!st) return;
    if (st->mapped) {
        kiln_mapguard_remove(st->base);
        munmap((void *)st->base, (size_t)st->size);
    }
    if (st->fd >= 0) close(st->fd);
    kiln_strmap_free(&st->index);
    kiln_free(st->tensors);
    kiln_free(st->names);
    kiln_meta_free(&st->meta);
    kiln_free(st->path);
    kiln_free(st);
}

const char *kiln_st_path(const kiln_safetensors *st) {
    return st->path;
}
int kiln_st_fd(const kiln_safetensors *st) {
    return st->fd;
}
const void *kiln_st_base(const kiln_safetensors *st) {
    return st->base;
}
uint64_t kiln_st_file_size(const kiln_safetensors *st) {
    return st->size;
}
uint64_t kiln_st_data_offset(const kiln_safetensors *st) {
    return st->data_offset;
}
uint32_t kiln_st_alignment(const kiln_safetensors *st) {
    return st->alignment;
}
const kiln_meta *kiln_st_meta(const kiln_safetensors *st) {
    return &st->meta;
}
size_t kiln_st_tensor_count(const kiln_safetensors *st) {
    return st->n_tensors;
}
const kiln_tensor_info *kiln_st_tensor(const kiln_safetensors *st, size_t i) {
    return i < st->n_tensors ? &st->tensors[i] : NULL;
}
const kiln_tensor_info *kiln_st_find_tensor(const kiln_safetensors *st, const char *name) {
    int64_t i = kiln_strmap_find(&st->index, st->names, kiln_str_c(name));
    return i < 0 ? NULL : &st->tensors[i];
}
