/*
 * kv.h — the paged KV block pool and per-sequence block tables.
 *
 * Memory: one DEVICE buffer of the whole budget from the engine's device (backend.h;
 * on the host backends an mmap committed on first touch). A block holds every layer's
 * K and V for KILN_KV_BLOCK positions:
 *   block b, layer l:  K at mem + b * block_stride + layer_off[l]
 *                      V at K + layer_kv_bytes[l]
 * so kiln_kv_pool_layer for layer l is {k = mem + layer_off[l], v = k +
 * layer_kv_bytes[l], block_bytes = block_stride}: a base address in the device's memory
 * that kernels index with the step's packed block ids (kernel.h: kiln_kv_blocks); no
 * host pointer to a block reaches a kernel. Blocks are handed out from a free list, else
 * from the untouched tail, never past the budget (KILN_ERR_CAPACITY). A sequence's block
 * table (host bookkeeping) grows in place; no KV data moves when a sequence grows.
 *
 * Blocks are refcounted so a forked sequence can share its parent's full blocks; a
 * block is written only by a sequence that holds it alone (fork copies the partial
 * last block, truncate un-shares the block it writes into next; both copy on the
 * device, kiln_buf_d2d).
 *
 * Not thread-safe: the engine's step thread owns the pool.
 */
#ifndef KILN_RUNTIME_KV_H
#define KILN_RUNTIME_KV_H

#include "kernels/kernel.h"
#include "runtime/backend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kiln_kv_pool {
    kiln_device *dev; /* borrowed */
    kiln_buf mem;
    size_t block_stride;
    int32_t n_layers;
    size_t *layer_off, *layer_kv_bytes;
    int32_t *n_kv_head, *head_dim;
    uint32_t dtype; /* KILN_DTYPE_F32 or KILN_DTYPE_F16 */
    int32_t max_blocks, n_grown;
    int32_t *free_list, n_free;
    int32_t *refcount;
    /* tensor parallelism: the pools of the group's other ranks (borrowed; same block
     * count, their own KV heads). Their bookkeeping is unused: block ids come from this
     * pool, and every block copy here (fork, un-share) is repeated in each mirror. */
    struct kiln_kv_pool **mirror;
    int32_t n_mirror;
} kiln_kv_pool;

typedef struct kiln_kv_table {
    int32_t *blocks;
    int32_t n_blocks, cap;
    int32_t len; /* positions filled */
} kiln_kv_table;

/* Creates a pool for n_layers layers with the given per-layer KV head shapes and a
 * budget of max_blocks blocks, in dev's memory (the pool borrows dev). */
kiln_status kiln_kv_pool_init(kiln_kv_pool *p, kiln_device *dev, int32_t n_layers,
                              const int32_t *n_kv_head, const int32_t *head_dim, uint32_t dtype,
                              int32_t max_blocks, kiln_err *err);
void kiln_kv_pool_free(kiln_kv_pool *p);
/* The cache of one layer as kernels see it. */
kiln_kv_layer kiln_kv_pool_layer(const kiln_kv_pool *p, int32_t layer);
/* Blocks in use (refcount > 0), and free (max_blocks - used). */
int32_t kiln_kv_pool_used(const kiln_kv_pool *p);
int32_t kiln_kv_pool_free_blocks(const kiln_kv_pool *p);

/* ---- per-sequence lifecycle (see kiln_state_desc in plan/plan.h) ---- */
void kiln_kv_table_init(kiln_kv_table *t);
/* alloc: makes positions [0, n_pos) writable (takes blocks as needed). */
kiln_status kiln_kv_reserve(kiln_kv_pool *p, kiln_kv_table *t, int32_t n_pos, kiln_err *err);
/* reuse/reset: keeps positions [0, n_pos) (0 = reset), returns the other blocks, and
 * un-shares the block that the next write lands in. */
kiln_status kiln_kv_truncate(kiln_kv_pool *p, kiln_kv_table *t, int32_t n_pos, kiln_err *err);
/* evict/free: returns every block (the table stays usable, length 0). */
void kiln_kv_release(kiln_kv_pool *p, kiln_kv_table *t);
/* fork: child (empty) shares the parent's full blocks and gets a copy of its partial one. */
kiln_status kiln_kv_fork(kiln_kv_pool *p, const kiln_kv_table *parent, kiln_kv_table *child,
                         kiln_err *err);

/* ---- blocks held outside sequences (the scheduler's prefix cache) ----
 * ref/unref take and drop one reference of an in-use block (unref to zero returns it
 * to the free list); attach gives an empty table n full blocks (one reference each), so
 * its length becomes n * KILN_KV_BLOCK. Errors: KILN_ERR_RANGE for a block id that is
 * out of range or not in use, KILN_ERR_STATE for a non-empty table. */
kiln_status kiln_kv_block_ref(kiln_kv_pool *p, int32_t b, kiln_err *err);
void kiln_kv_block_unref(kiln_kv_pool *p, int32_t b);
int32_t kiln_kv_block_refcount(const kiln_kv_pool *p, int32_t b);
kiln_status kiln_kv_attach(kiln_kv_pool *p, kiln_kv_table *t, const int32_t *blocks, int32_t n,
                           kiln_err *err);

#endif /* KILN_RUNTIME_KV_H */
