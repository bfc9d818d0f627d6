/* kv.c — paged KV block pool (see kv.h). */
#include "runtime/kv.h"

#include "base/mem.h"
#include "format/dtype.h"

#include <stdlib.h>
#include <string.h>

kiln_status kiln_kv_pool_init(kiln_kv_pool *p, kiln_device *dev, int32_t n_layers,
                              const int32_t *n_kv_head, const int32_t *head_dim, uint32_t dtype,
                              int32_t max_blocks, kiln_err *err) {
    memset(p, 0, sizeof(*p));
    p->dev = dev;
    if (n_layers <= 0 || max_blocks <= 0)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "kv pool: %d layers, %d blocks",
                            (int)n_layers, (int)max_blocks);
    if (dtype != KILN_DTYPE_F32 && dtype != KILN_DTYPE_F16)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "kv pool: dtype %s (f32 or f16 only)",
                            kiln_dtype_name(dtype));
    size_t elt = dtype == KILN_DTYPE_F16 ? 2 : 4;
    p->dtype = dtype;
    p->n_layers = n_layers;
    p->layer_off = kiln_calloc((size_t)n_layers, sizeof(size_t));
    p->layer_kv_bytes = kiln_calloc((size_t)n_layers, sizeof(size_t));
    p->n_kv_head = kiln_calloc((size_t)n_layers, sizeof(int32_t));
    p->head_dim = kiln_calloc((size_t)n_layers, sizeof(int32_t));
    p->free_list = kiln_calloc((size_t)max_blocks, sizeof(int32_t));
    p->refcount = kiln_calloc((size_t)max_blocks, sizeof(int32_t));
    if (!p->layer_off || !p->layer_kv_bytes || !p->n_kv_head || !p->head_dim || !p->free_list ||
        !p->refcount) {
        kiln_kv_pool_free(p);
        return kiln_err_set(err, KILN_ERR_NOMEM, "kv pool: out of memory");
    }
    size_t off = 0;
    for (int32_t l = 0; l < n_layers; l++) {
        size_t b;
        if (n_kv_head[l] <= 0 || head_dim[l] <= 0) {
            kiln_kv_pool_free(p);
            return kiln_err_set(err, KILN_ERR_INVALID_ARG, "kv pool: layer %d shape", (int)l);
        }
        if (!kiln_size_mul((size_t)n_kv_head[l] * (size_t)head_dim[l], elt * KILN_KV_BLOCK, &b) ||
            !kiln_size_align_up(b, KILN_ALIGN, &b) || !kiln_size_add(off, 2 * b, &off)) {
            kiln_kv_pool_free(p);
            return kiln_err_set(err, KILN_ERR_OVERFLOW, "kv pool: block size overflows");
        }
        p->layer_off[l] = off - 2 * b;
        p->layer_kv_bytes[l] = b;
        p->n_kv_head[l] = n_kv_head[l];
        p->head_dim[l] = head_dim[l];
    }
    p->block_stride = off;
    size_t total;
    if (!kiln_size_mul(off, (size_t)max_blocks, &total)) {
        kiln_kv_pool_free(p);
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "kv pool: %d blocks of %zu bytes overflow",
                            (int)max_blocks, off);
    }
    kiln_status st = kiln_buf_alloc(dev, KILN_MEM_DEVICE, total, &p->mem, err);
    if (st) {
        kiln_kv_pool_free(p);
        return kiln_err_wrap(err, st, "kv pool of %d blocks", (int)max_blocks);
    }
    p->max_blocks = max_blocks;
    return KILN_OK;
}

void kiln_kv_pool_free(kiln_kv_pool *p) {
    if (!p) return;
    if (p->mem.ptr) kiln_buf_free(p->dev, &p->mem);
    kiln_free(p->layer_off);
    kiln_free(p->layer_kv_bytes);
    kiln_free(p->n_kv_head);
    kiln_free(p->head_dim);
    kiln_free(p->free_list);
    kiln_free(p->refcount);
    memset(p, 0, sizeof(*p));
}

kiln_kv_layer kiln_kv_pool_layer(const kiln_kv_pool *p, int32_t l) {
    kiln_kv_layer kv;
    kv.k = (uint8_t *)p->mem.ptr + p->layer_off[l];
    kv.v = (uint8_t *)kv.k + p->layer_kv_bytes[l];
    kv.dtype = p->dtype;
    kv.n_kv_head = p->n_kv_head[l];
    kv.head_dim = p->head_dim[l];
    kv.block_bytes = p->block_stride;
    return kv;
}

int32_t kiln_kv_pool_used(const kiln_kv_pool *p) {
    return p->n_grown - p->n_free;
}

int32_t kiln_kv_pool_free_blocks(const kiln_kv_pool *p) {
    return p->max_blocks - kiln_kv_pool_used(p);
}

static kiln_status block_take(kiln_kv_pool *p, int32_t *out, kiln_err *err) {
    int32_t b = -1;
    if (p->n_free > 0)
        b = p->free_list[--p->n_free];
    else if (p->n_grown < p->max_blocks)
        b = p->n_grown++;
    else
        return kiln_err_set(err, KILN_ERR_CAPACITY,
                            "KV cache full: all %d blocks of %d tokens in use", (int)p->max_blocks,
                            KILN_KV_BLOCK);
    p->refcount[b] = 1;
    *out = b;
    return KILN_OK;
}

static void block_put(kiln_kv_pool *p, int32_t b) {
    if (--p->refcount[b] == 0) p->free_list[p->n_free++] = b;
}

void kiln_kv_table_init(kiln_kv_table *t) {
    memset(t, 0, sizeof(*t));
}

static kiln_status table_push(kiln_kv_table *t, int32_t b, kiln_err *err) {
    if (t->n_blocks == t->cap) {
        int32_t nc = t->cap ? t->cap * 2 : 16;
        int32_t *q = kiln_realloc(t->blocks, (size_t)nc * sizeof(int32_t));
        if (!q) return kiln_err_set(err, KILN_ERR_NOMEM, "kv block table: out of memory");
        t->blocks = q;
        t->cap = nc;
    }
    t->blocks[t->n_blocks++] = b;
    return KILN_OK;
}

kiln_status kiln_kv_reserve(kiln_kv_pool *p, kiln_kv_table *t, int32_t n_pos, kiln_err *err) {
    int32_t need = (n_pos + KILN_KV_BLOCK - 1) / KILN_KV_BLOCK;
    while (t->n_blocks < need) {
        int32_t b = -1;
        KILN_TRY(block_take(p, &b, err));
        kiln_status st = table_push(t, b, err);
        if (st) {
            block_put(p, b);
            return st;
        }
    }
    return KILN_OK;
}

static kiln_status block_copy(kiln_kv_pool *p, int32_t src, int32_t *out, kiln_err *err) {
    KILN_TRY(block_take(p, out, err));
    kiln_status st = kiln_buf_d2d(p->dev, &p->mem, (size_t)*out * p->block_stride, &p->mem,
                                  (size_t)src * p->block_stride, p->block_stride, err);
    for (int32_t m = 0; m < p->n_mirror && !st; m++) {
        kiln_kv_pool *q = p->mirror[m];
        st = kiln_device_bind_thread(q->dev, err); /* the rank's device (CUDA) */
        if (!st)
            st = kiln_buf_d2d(q->dev, &q->mem, (size_t)*out * q->block_stride, &q->mem,
                              (size_t)src * q->block_stride, q->block_stride, err);
        if (st) kiln_err_wrap(err, st, "kv block copy on tensor-parallel rank %d", (int)m + 1);
    }
    if (p->n_mirror > 0) {
        kiln_status b = kiln_device_bind_thread(p->dev, st ? NULL : err);
        if (!st) st = b;
    }
    if (st) block_put(p, *out);
    return st;
}

kiln_status kiln_kv_truncate(kiln_kv_pool *p, kiln_kv_table *t, int32_t n_pos, kiln_err *err) {
    if (n_pos < 0 || n_pos > t->len)
        return kiln_err_set(err, KILN_ERR_RANGE, "kv truncate to %d: sequence has %d positions",
                            (int)n_pos, (int)t->len);
    int32_t keep = (n_pos + KILN_KV_BLOCK - 1) / KILN_KV_BLOCK;
    while (t->n_blocks > keep) block_put(p, t->blocks[--t->n_blocks]);
    t->len = n_pos;
    /* the next write lands in block n_pos / 16 when it is partial: make it private */
    if (n_pos % KILN_KV_BLOCK && t->n_blocks > 0) {
        int32_t last = t->blocks[t->n_blocks - 1];
        if (p->refcount[last] > 1) {
            int32_t nb = -1;
            KILN_TRY(block_copy(p, last, &nb, err));
            block_put(p, last);
            t->blocks[t->n_blocks - 1] = nb;
        }
    }
    return KILN_OK;
}

void kiln_kv_release(kiln_kv_pool *p, kiln_kv_table *t) {
    while (t->n_blocks > 0) block_put(p, t->blocks[--t->n_blocks]);
    t->len = 0;
}

kiln_status kiln_kv_fork(kiln_kv_pool *p, const kiln_kv_table *parent, kiln_kv_table *child,
                         kiln_err *err) {
    kiln_kv_release(p, child);
    int32_t full = parent->len / KILN_KV_BLOCK;
    for (int32_t i = 0; i < full; i++) {
        KILN_TRY(table_push(child, parent->blocks[i], err));
        p->refcount[parent->blocks[i]]++;
    }
    if (parent->len % KILN_KV_BLOCK) {
        int32_t nb = -1;
        KILN_TRY(block_copy(p, parent->blocks[full], &nb, err));
        kiln_status st = table_push(child, nb, err);
        if (st) {
            block_put(p, nb);
            return st;
        }
    }
    child->len = parent->len;
    return KILN_OK;
}

static bool block_live(const kiln_kv_pool *p, int32_t b) {
    return b >= 0 && b < p->n_grown && p->refcount[b] > 0;
}

kiln_status kiln_kv_block_ref(kiln_kv_pool *p, int32_t b, kiln_err *err) {
    if (!block_live(p, b))
        return kiln_err_set(err, KILN_ERR_RANGE, "kv block %d is not in use", (int)b);
    p->refcount[b]++;
    return KILN_OK;
}

void kiln_kv_block_unref(kiln_kv_pool *p, int32_t b) {
    if (block_live(p, b)) block_put(p, b);
}

int32_t kiln_kv_block_refcount(const kiln_kv_pool *p, int32_t b) {
    return b >= 0 && b < p->n_grown ? p->refcount[b] : 0;
}

kiln_status kiln_kv_attach(kiln_kv_pool *p, kiln_kv_table *t, const int32_t *blocks, int32_t n,
                           kiln_err *err) {
    if (t->n_blocks || t->len)
        return kiln_err_set(err, KILN_ERR_STATE, "kv attach: the sequence is not empty");
    if (n < 0 || n > INT32_MAX / KILN_KV_BLOCK)
        return kiln_err_set(err, KILN_ERR_RANGE, "kv attach: %d blocks", (int)n);
    for (int32_t i = 0; i < n; i++)
        if (!block_live(p, blocks[i]))
            return kiln_err_set(err, KILN_ERR_RANGE, "kv attach: block %d is not in use",
                                (int)blocks[i]);
    for (int32_t i = 0; i < n; i++) {
        kiln_status st = table_push(t, blocks[i], err);
        if (st) {
            kiln_kv_release(p, t);
            return st;
        }
        p->refcount[blocks[i]]++;
    }
    t->len = n * KILN_KV_BLOCK;
    return KILN_OK;
}
