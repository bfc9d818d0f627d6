/*
 * gguf_writer.c — GGUF v3 writer. See gguf_writer.h.
 *
 * Output goes through two slab buffers: the calling thread (with the pool) fills one
 * while an I/O thread writes the other with plain write(2) calls, so generation or
 * quantization overlaps the disk.
 */
#include "format/gguf_writer.h"

#include "base/mem.h"
#include "base/progress.h"
#include "base/timer.h"
#include "format/dtype.h"
#include "format/meta.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SLAB_BYTES ((size_t)64 << 20)

typedef struct kv_entry {
    char *key;
    uint8_t *val; /* type u32 + payload */
    size_t len;
} kv_entry;

typedef struct wtensor {
    kiln_gguf_wtensor pub;
    char *name;
    const void *data;
    kiln_gguf_fill_fn fill;
} wtensor;

struct kiln_gguf_writer {
    uint32_t alignment;
    kv_entry *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
};

/* ---- a growable byte buffer ---- */

typedef struct bytes {
    uint8_t *p;
    size_t len, cap;
    bool failed;
} bytes;

static void b_put(bytes *b, const void *src, size_t n) {
    if (b->failed) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        uint8_t *p = kiln_realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}
static void b_u32(bytes *b, uint32_t v) {
    b_put(b, &v, 4);
}
static void b_u64(bytes *b, uint64_t v) {
    b_put(b, &v, 8);
}
static void b_str(bytes *b, const char *s, size_t n) {
    b_u64(b, n);
    b_put(b, s, n);
}

/* ---- creation / metadata ---- */

kiln_status kiln_gguf_writer_create(uint32_t alignment, kiln_gguf_writer **out, kiln_err *err) {
    *out = NULL;
    if (alignment == 0) alignment = 32;
    if (alignment < 8 || (alignment & (alignment - 1)))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "GGUF alignment %u is not a power of two >= 8", alignment);
    kiln_gguf_writer *w = kiln_calloc(1, sizeof *w);
    if (!w) return kiln_err_set(err, KILN_ERR_NOMEM, "allocating a GGUF writer");
    w->alignment = alignment;
    *out = w;
    return kiln_gguf_writer_set_u32(w, "general.alignment", alignment, err);
}

void kiln_gguf_writer_free(kiln_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) kiln_free(w->kv[i].key), kiln_free(w->kv[i].val);
    for (size_t i = 0; i < w->n_t; i++) kiln_free(w->t[i].name);
    kiln_free(w->kv);
    kiln_free(w->t);
    kiln_free(w);
}

static kv_entry *kv_find(const kiln_gguf_writer *w, const char *key) {
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) return &w->kv[i];
    return NULL;
}

bool kiln_gguf_writer_has(const kiln_gguf_writer *w, const char *key) {
    return kv_find(w, key) != NULL;
}

void kiln_gguf_writer_remove(kiln_gguf_writer *w, const char *key) {
    kv_entry *e = kv_find(w, key);
    if (!e) return;
    kiln_free(e->key), kiln_free(e->val);
    size_t i = (size_t)(e - w->kv);
    memmove(&w->kv[i], &w->kv[i + 1], (w->n_kv - i - 1) * sizeof *e);
    w->n_kv--;
}

/* Takes ownership of b's buffer (also on failure). */
static kiln_status kv_set(kiln_gguf_writer *w, const char *key, bytes *b, kiln_err *err) {
    if (b->failed) {
        kiln_free(b->p);
        return kiln_err_set(err, KILN_ERR_NOMEM, "metadata '%s': out of memory", key);
    }
    if (!key || !*key) {
        kiln_free(b->p);
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "empty metadata key");
    }
    kv_entry *e = kv_find(w, key);
    if (e) {
        kiln_free(e->val);
        e->val = b->p, e->len = b->len;
        return KILN_OK;
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
        kv_entry *p = kiln_realloc(w->kv, cap * sizeof *p);
        if (!p) {
            kiln_free(b->p);
            return kiln_err_set(err, KILN_ERR_NOMEM, "metadata '%s': out of memory", key);
        }
        w->kv = p, w->cap_kv = cap;
    }
    char *k = kiln_strdup(key);
    if (!k) {
        kiln_free(b->p);
        return kiln_err_set(err, KILN_ERR_NOMEM, "metadata '%s': out of memory", key);
    }
    w->kv[w->n_kv++] = (kv_entry){k, b->p, b->len};
    return KILN_OK;
}

static kiln_status set_scalar(kiln_gguf_writer *w, const char *key, uint32_t type, const void *v,
                              size_t n, kiln_err *err) {
    bytes b = {0};
    b_u32(&b, type);
    b_put(&b, v, n);
    return kv_set(w, key, &b, err);
}

kiln_status kiln_gguf_writer_set_str(kiln_gguf_writer *w, const char *key, const char *s,
                                     kiln_err *err) {
    bytes b = {0};
    b_u32(&b, KILN_GGUF_STRING);
    b_str(&b, s, strlen(s));
    return kv_set(w, key, &b, err);
}
kiln_status kiln_gguf_writer_set_u32(kiln_gguf_writer *w, const char *key, uint32_t v,
                                     kiln_err *err) {
    return set_scalar(w, key, KILN_GGUF_U32, &v, 4, err);
}
kiln_status kiln_gguf_writer_set_i32(kiln_gguf_writer *w, const char *key, int32_t v,
                                     kiln_err *err) {
    return set_scalar(w, key, KILN_GGUF_I32, &v, 4, err);
}
kiln_status kiln_gguf_writer_set_u64(kiln_gguf_writer *w, const char *key, uint64_t v,
                                     kiln_err *err) {
    return set_scalar(w, key, KILN_GGUF_U64, &v, 8, err);
}
kiln_status kiln_gguf_writer_set_f32(kiln_gguf_writer *w, const char *key, float v, kiln_err *err) {
    return set_scalar(w, key, KILN_GGUF_F32, &v, 4, err);
}
kiln_status kiln_gguf_writer_set_bool(kiln_gguf_writer *w, const char *key, bool v, kiln_err *err) {
    uint8_t u = v ? 1 : 0;
    return set_scalar(w, key, KILN_GGUF_BOOL, &u, 1, err);
}

static size_t scalar_size(uint32_t t) {
    switch (t) {
    case KILN_GGUF_U8:
    case KILN_GGUF_I8:
    case KILN_GGUF_BOOL:
        return 1;
    case KILN_GGUF_U16:
    case KILN_GGUF_I16:
        return 2;
    case KILN_GGUF_U32:
    case KILN_GGUF_I32:
    case KILN_GGUF_F32:
        return 4;
    case KILN_GGUF_U64:
    case KILN_GGUF_I64:
    case KILN_GGUF_F64:
        return 8;
    default:
        return 0;
    }
}

kiln_status kiln_gguf_writer_set_arr(kiln_gguf_writer *w, const char *key, uint32_t elem,
                                     const void *elems, uint64_t n, kiln_err *err) {
    const size_t es = scalar_size(elem);
    if (!es)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "metadata '%s': array element type %u is not numeric", key, elem);
    size_t total;
    KILN_TRY(kiln_size_mul_err((size_t)n, es, &total, key, err));
    bytes b = {0};
    b_u32(&b, KILN_GGUF_ARRAY);
    b_u32(&b, elem);
    b_u64(&b, n);
    b_put(&b, elems, total);
    return kv_set(w, key, &b, err);
}

kiln_status kiln_gguf_writer_set_arr_str(kiln_gguf_writer *w, const char *key,
                                         const char *const *strs, const size_t *lens, uint64_t n,
                                         kiln_err *err) {
    bytes b = {0};
    b_u32(&b, KILN_GGUF_ARRAY);
    b_u32(&b, KILN_GGUF_STRING);
    b_u64(&b, n);
    for (uint64_t i = 0; i < n; i++) b_str(&b, strs[i], lens ? lens[i] : strlen(strs[i]));
    return kv_set(w, key, &b, err);
}

/* Length of one encoded value of type t at p (at most len bytes); 0 when malformed. */
static size_t value_len(uint32_t t, const uint8_t *p, size_t len, int depth) {
    size_t es = scalar_size(t);
    if (es) return es <= len ? es : 0;
    if (t == KILN_GGUF_STRING) {
        uint64_t n;
        if (len < 8) return 0;
        memcpy(&n, p, 8);
        return n <= len - 8 ? 8 + (size_t)n : 0;
    }
    if (t != KILN_GGUF_ARRAY || depth > 8 || len < 12) return 0;
    uint32_t et;
    uint64_t n;
    memcpy(&et, p, 4);
    memcpy(&n, p + 4, 8);
    size_t off = 12;
    if (scalar_size(et)) {
        if (n > (len - off) / scalar_size(et)) return 0;
        return off + (size_t)n * scalar_size(et);
    }
    for (uint64_t i = 0; i < n; i++) {
        size_t l = value_len(et, p + off, len - off, depth + 1);
        if (!l) return 0;
        off += l;
    }
    return off;
}

kiln_status kiln_gguf_writer_set_raw(kiln_gguf_writer *w, const char *key, const void *value,
                                     size_t len, kiln_err *err) {
    const uint8_t *p = value;
    uint32_t t;
    if (len < 4)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "metadata '%s': raw value too short", key);
    memcpy(&t, p, 4);
    if (value_len(t, p + 4, len - 4, 0) != len - 4)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "metadata '%s': raw value is not one well-formed GGUF value", key);
    bytes b = {0};
    b_put(&b, value, len);
    return kv_set(w, key, &b, err);
}

/* Payload of v (no type tag). Returns false on a malformed value. */
static bool enc_payload(bytes *b, const kiln_meta_value *v, int depth) {
    if (depth > 8) return false;
    switch (v->type) {
    case KILN_META_U8:
    case KILN_META_U16:
    case KILN_META_U32:
    case KILN_META_U64:
        b_put(b, &v->v.u, kiln_meta_type_size(v->type));
        return true;
    case KILN_META_I8:
    case KILN_META_I16:
    case KILN_META_I32:
    case KILN_META_I64:
        b_put(b, &v->v.i, kiln_meta_type_size(v->type));
        return true;
    case KILN_META_F32: {
        float f = (float)v->v.f;
        b_put(b, &f, 4);
        return true;
    }
    case KILN_META_F64:
        b_put(b, &v->v.f, 8);
        return true;
    case KILN_META_BOOL: {
        uint8_t u = v->v.b ? 1 : 0;
        b_put(b, &u, 1);
        return true;
    }
    case KILN_META_STRING:
        b_str(b, v->v.s.ptr, v->v.s.len);
        return true;
    case KILN_META_ARRAY: {
        b_u32(b, v->elem_type);
        b_u64(b, v->count);
        if (v->elem_type == KILN_META_STRING) {
            for (uint64_t i = 0; i < v->count; i++) b_str(b, v->v.strs[i].ptr, v->v.strs[i].len);
        } else if (v->elem_type == KILN_META_ARRAY) {
            for (uint64_t i = 0; i < v->count; i++)
                if (!enc_payload(b, &v->v.items[i], depth + 1)) return false;
        } else {
            const size_t es = kiln_meta_type_size(v->elem_type);
            if (!es || v->count > SIZE_MAX / es) return false;
            b_put(b, v->v.raw, (size_t)v->count * es); /* little-endian as stored */
        }
        return true;
    }
    default:
        return false;
    }
}

kiln_status kiln_gguf_writer_set_value(kiln_gguf_writer *w, const char *key,
                                       const kiln_meta_value *v, kiln_err *err) {
    bytes b = {0};
    b_u32(&b, (uint32_t)v->type);
    if (!enc_payload(&b, v, 0)) {
        kiln_free(b.p);
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "metadata '%s': malformed value", key);
    }
    return kv_set(w, key, &b, err);
}

/* ---- tensors ---- */

static kiln_status add_tensor(kiln_gguf_writer *w, const char *name, uint32_t dtype, int rank,
                              const int64_t *shape, const void *data, kiln_gguf_fill_fn fill,
                              void *ctx, kiln_err *err) {
    const size_t nl = name ? strlen(name) : 0;
    if (nl == 0 || nl > KILN_GGUF_MAX_NAME)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "tensor name '%s' must be 1..%d bytes",
                            name ? name : "", KILN_GGUF_MAX_NAME);
    if (rank < 1 || rank > 4)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "tensor '%s': rank %d outside 1..4", name,
                            rank);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return kiln_err_set(err, KILN_ERR_INVALID_ARG, "duplicate tensor name '%s'", name);
    wtensor t = {0};
    t.pub.dtype = dtype;
    t.pub.rank = rank;
    t.pub.n_rows = 1;
    for (int i = 0; i < 4; i++) {
        t.pub.shape[i] = i < rank ? shape[i] : 1;
        if (t.pub.shape[i] <= 0)
            return kiln_err_set(err, KILN_ERR_INVALID_ARG, "tensor '%s': dimension %d is %lld",
                                name, i, (long long)t.pub.shape[i]);
        if (i > 0 && __builtin_mul_overflow(t.pub.n_rows, t.pub.shape[i], &t.pub.n_rows))
            return kiln_err_set(err, KILN_ERR_OVERFLOW, "tensor '%s': too many rows", name);
    }
    kiln_status st = kiln_dtype_row_bytes(dtype, t.pub.shape[0], &t.pub.row_bytes, err);
    if (!st)
        st = kiln_size_mul_err(t.pub.row_bytes, (size_t)t.pub.n_rows, &t.pub.nbytes, "tensor bytes",
                               err);
    if (st) return kiln_err_wrap(err, st, "tensor '%s'", name);
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 64;
        wtensor *p = kiln_realloc(w->t, cap * sizeof *p);
        if (!p) return kiln_err_set(err, KILN_ERR_NOMEM, "tensor '%s': out of memory", name);
        w->t = p, w->cap_t = cap;
    }
    t.name = kiln_strdup(name);
    if (!t.name) return kiln_err_set(err, KILN_ERR_NOMEM, "tensor '%s': out of memory", name);
    t.data = data;
    t.fill = fill;
    t.pub.user = ctx;
    w->t[w->n_t++] = t;
    return KILN_OK;
}

kiln_status kiln_gguf_writer_add_tensor(kiln_gguf_writer *w, const char *name, uint32_t dtype,
                                        int rank, const int64_t *shape, const void *data,
                                        kiln_err *err) {
    if (!data)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "tensor '%s': NULL data", name ? name : "");
    return add_tensor(w, name, dtype, rank, shape, data, NULL, NULL, err);
}

kiln_status kiln_gguf_writer_add_tensor_fill(kiln_gguf_writer *w, const char *name, uint32_t dtype,
                                             int rank, const int64_t *shape, kiln_gguf_fill_fn fill,
                                             void *ctx, kiln_err *err) {
    if (!fill)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "tensor '%s': NULL fill", name ? name : "");
    return add_tensor(w, name, dtype, rank, shape, NULL, fill, ctx, err);
}

size_t kiln_gguf_writer_tensor_count(const kiln_gguf_writer *w) {
    return w->n_t;
}
size_t kiln_gguf_writer_kv_count(const kiln_gguf_writer *w) {
    return w->n_kv;
}

/* ---- the I/O thread ---- */

typedef struct io_thread {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int fd;
    const uint8_t *buf;
    size_t len;
    bool busy, quit;
    int err_no; /* first write error */
    double seconds;
} io_thread;

static void *io_main(void *arg) {
    io_thread *io = arg;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        while (!io->busy && !io->quit) pthread_cond_wait(&io->cv, &io->mu);
        if (!io->busy && io->quit) break;
        const uint8_t *p = io->buf;
        size_t n = io->len;
        int failed = io->err_no;
        pthread_mutex_unlock(&io->mu);
        uint64_t t0 = kiln_now_ns();
        while (n > 0 && !failed) {
            ssize_t k = write(io->fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) {
                failed = k < 0 ? errno : EIO;
                break;
            }
            p += k, n -= (size_t)k;
        }
        double dt = (double)(kiln_now_ns() - t0) * 1e-9;
        pthread_mutex_lock(&io->mu);
        io->seconds += dt;
        if (failed && !io->err_no) io->err_no = failed;
        io->busy = false;
        pthread_cond_broadcast(&io->cv);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

/* Waits until the I/O thread is idle; returns its first error (errno) or 0. */
static int io_wait(io_thread *io) {
    pthread_mutex_lock(&io->mu);
    while (io->busy) pthread_cond_wait(&io->cv, &io->mu);
    int e = io->err_no;
    pthread_mutex_unlock(&io->mu);
    return e;
}

static int io_submit(io_thread *io, const uint8_t *buf, size_t len) {
    int e = io_wait(io);
    if (e) return e;
    pthread_mutex_lock(&io->mu);
    io->buf = buf, io->len = len, io->busy = true;
    pthread_cond_broadcast(&io->cv);
    pthread_mutex_unlock(&io->mu);
    return 0;
}

/* ---- slab stream ---- */

typedef struct stream {
    io_thread *io;
    uint8_t *slab[2];
    int cur;
    size_t used, cap;
    uint64_t written; /* bytes handed to the I/O thread */
} stream;

static int s_flush(stream *s) {
    if (!s->used) return 0;
    int e = io_submit(s->io, s->slab[s->cur], s->used);
    s->written += s->used;
    s->cur ^= 1;
    s->used = 0;
    /* the next slab may still be in flight from two flushes ago: io_submit waited */
    return e;
}

static int s_put(stream *s, const void *src, size_t n) {
    const uint8_t *p = src;
    while (n > 0) {
        size_t k = s->cap - s->used < n ? s->cap - s->used : n;
        memcpy(s->slab[s->cur] + s->used, p, k);
        s->used += k, p += k, n -= k;
        if (s->used == s->cap) {
            int e = s_flush(s);
            if (e) return e;
        }
    }
    return 0;
}

static int s_zeros(stream *s, size_t n) {
    static const uint8_t z[64];
    while (n > 0) {
        size_t k = n < sizeof z ? n : sizeof z;
        int e = s_put(s, z, k);
        if (e) return e;
        n -= k;
    }
    return 0;
}

/* ---- parallel fill ---- */

typedef struct fill_job {
    const wtensor *t;
    int64_t row0;
    uint8_t *dst;
    atomic_int failed;
    pthread_mutex_t mu;
    kiln_err err;
    kiln_status st;
} fill_job;

static void fill_range(void *ctx, int64_t begin, int64_t end, int ith) {
    fill_job *j = ctx;
    if (atomic_load(&j->failed)) return;
    kiln_err e;
    kiln_err_clear(&e);
    kiln_status st = j->t->fill(&j->t->pub, j->row0 + begin, end - begin,
                                j->dst + (size_t)begin * j->t->pub.row_bytes, ith, &e);
    if (st) {
        pthread_mutex_lock(&j->mu);
        if (!atomic_load(&j->failed)) {
            j->st = st;
            j->err = e;
            atomic_store(&j->failed, 1);
        }
        pthread_mutex_unlock(&j->mu);
    }
}

/* ---- write ---- */

static kiln_status build_header(kiln_gguf_writer *w, bytes *h, uint64_t *data_size, kiln_err *err) {
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        w->t[i].pub.offset = off;
        w->t[i].pub.name = w->t[i].name;
        size_t padded;
        if (!kiln_size_align_up(w->t[i].pub.nbytes, w->alignment, &padded) ||
            !kiln_u64_add(off, padded, &off))
            return kiln_err_set(err, KILN_ERR_OVERFLOW, "tensor '%s': data size overflow",
                                w->t[i].name);
    }
    *data_size = off;
    b_put(h, "GGUF", 4);
    b_u32(h, 3);
    b_u64(h, w->n_t);
    b_u64(h, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        b_str(h, w->kv[i].key, strlen(w->kv[i].key));
        b_put(h, w->kv[i].val, w->kv[i].len);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const kiln_gguf_wtensor *t = &w->t[i].pub;
        b_str(h, w->t[i].name, strlen(w->t[i].name));
        b_u32(h, (uint32_t)t->rank);
        for (int d = 0; d < t->rank; d++) b_u64(h, (uint64_t)t->shape[d]);
        b_u32(h, t->dtype);
        b_u64(h, t->offset);
    }
    size_t pad = (w->alignment - h->len % w->alignment) % w->alignment;
    static const uint8_t z[64];
    while (pad > 0) {
        size_t k = pad < sizeof z ? pad : sizeof z;
        b_put(h, z, k);
        pad -= k;
    }
    if (h->failed) return kiln_err_set(err, KILN_ERR_NOMEM, "building the GGUF header");
    return KILN_OK;
}

static kiln_status write_data(kiln_gguf_writer *w, stream *s, kiln_pool *pool, bool progress,
                              uint64_t data_size, double *fill_s, kiln_err *err) {
    kiln_progress pr;
    if (progress) kiln_progress_begin(&pr, "writing", data_size);
    uint64_t done = 0;
    int e = 0;
    for (size_t i = 0; i < w->n_t && !e; i++) {
        const wtensor *t = &w->t[i];
        if (t->data) {
            e = s_put(s, t->data, t->pub.nbytes);
        } else {
            int64_t row = 0;
            while (row < t->pub.n_rows && !e) {
                size_t room = (s->cap - s->used) / t->pub.row_bytes;
                if (room == 0) {
                    e = s_flush(s);
                    continue;
                }
                int64_t n =
                    t->pub.n_rows - row < (int64_t)room ? t->pub.n_rows - row : (int64_t)room;
                fill_job j = {.t = t, .row0 = row, .dst = s->slab[s->cur] + s->used};
                atomic_init(&j.failed, 0);
                pthread_mutex_init(&j.mu, NULL);
                const int nth = kiln_pool_size(pool);
                int64_t grain = n / (nth * 8);
                const int64_t min_rows = (int64_t)(((size_t)256 << 10) / t->pub.row_bytes) + 1;
                if (grain < min_rows) grain = min_rows;
                uint64_t t0 = kiln_now_ns();
                kiln_pool_for(pool, n, grain, fill_range, &j);
                *fill_s += (double)(kiln_now_ns() - t0) * 1e-9;
                pthread_mutex_destroy(&j.mu);
                if (atomic_load(&j.failed)) {
                    if (err) *err = j.err;
                    if (progress) kiln_progress_end(&pr);
                    return kiln_err_wrap(err, j.st, "tensor '%s' rows %lld..%lld", t->name,
                                         (long long)row, (long long)(row + n));
                }
                s->used += (size_t)n * t->pub.row_bytes;
                row += n;
                if (s->used == s->cap) e = s_flush(s);
                if (progress) kiln_progress_update(&pr, done + (uint64_t)row * t->pub.row_bytes);
            }
        }
        if (!e) e = s_zeros(s, (w->alignment - t->pub.nbytes % w->alignment) % w->alignment);
        done += t->pub.nbytes;
        if (progress) kiln_progress_update(&pr, done);
    }
    if (!e) e = s_flush(s);
    if (!e) e = io_wait(s->io);
    if (progress) kiln_progress_end(&pr);
    if (e) return kiln_err_errno(err, e, "writing tensor data");
    return KILN_OK;
}

kiln_status kiln_gguf_writer_write(kiln_gguf_writer *w, const char *path, kiln_pool *pool,
                                   bool show_progress, kiln_gguf_write_stats *stats,
                                   kiln_err *err) {
    const uint64_t t_start = kiln_now_ns();
    bytes h = {0};
    uint64_t data_size = 0;
    kiln_status st = build_header(w, &h, &data_size, err);
    if (st) {
        kiln_free(h.p);
        return kiln_err_wrap(err, st, "writing %s", path);
    }
    size_t cap = SLAB_BYTES;
    for (size_t i = 0; i < w->n_t; i++)
        if (w->t[i].pub.row_bytes > cap) cap = w->t[i].pub.row_bytes;

    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        kiln_free(h.p);
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "path too long: %s", path);
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        kiln_free(h.p);
        return kiln_err_errno(err, errno, "creating %s", tmp);
    }
    io_thread io = {.fd = fd};
    stream s = {.io = &io, .cap = cap};
    s.slab[0] = kiln_alloc_aligned(cap);
    s.slab[1] = kiln_alloc_aligned(cap);
    pthread_mutex_init(&io.mu, NULL);
    pthread_cond_init(&io.cv, NULL);
    bool started = false;
    double fill_s = 0;
    if (!s.slab[0] || !s.slab[1]) {
        st = kiln_err_set(err, KILN_ERR_NOMEM, "allocating 2 x %zu bytes of write buffers", cap);
    } else if (pthread_create(&io.th, NULL, io_main, &io) != 0) {
        st = kiln_err_set(err, KILN_ERR_INTERNAL, "cannot start the writer thread");
    } else {
        started = true;
        int e = s_put(&s, h.p, h.len);
        if (e) st = kiln_err_errno(err, e, "writing the header");
        if (!st) st = write_data(w, &s, pool, show_progress, data_size, &fill_s, err);
    }
    if (started) {
        io_wait(&io);
        pthread_mutex_lock(&io.mu);
        io.quit = true;
        pthread_cond_broadcast(&io.cv);
        pthread_mutex_unlock(&io.mu);
        pthread_join(io.th, NULL);
    }
    pthread_mutex_destroy(&io.mu);
    pthread_cond_destroy(&io.cv);
    kiln_free_aligned(s.slab[0]);
    kiln_free_aligned(s.slab[1]);
    const uint64_t header_len = h.len;
    kiln_free(h.p);
    if (!st && close(fd) != 0)
        st = kiln_err_errno(err, errno, "closing %s", tmp);
    else if (st)
        close(fd);
    if (!st && rename(tmp, path) != 0) st = kiln_err_errno(err, errno, "renaming %s", tmp);
    if (st) {
        unlink(tmp);
        return kiln_err_wrap(err, st, "writing %s", path);
    }
    if (stats) {
        stats->file_bytes = header_len + data_size;
        stats->data_offset = header_len;
        stats->seconds = (double)(kiln_now_ns() - t_start) * 1e-9;
        stats->fill_seconds = fill_s;
        stats->io_seconds = io.seconds;
    }
    return KILN_OK;
}
