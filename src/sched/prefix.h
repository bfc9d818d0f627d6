/*
 * prefix.h — the prefix-cache index: full KV blocks content-addressed by a hash chained
 * over their tokens, mixed with the model identity and a scope (a tenant, or an
 * isolation group of tenants). DESIGN.md "Engine, KV memory, prefix cache".
 *
 * An entry names one KV block and holds one ref on it in the engine's pool (taken at
 * insert, dropped at eviction), so the block outlives the sequence that computed it.
 * `users` counts the sequences and pins (preempted requests, sessions) that use the
 * entry; entries with users == 0 are on an LRU list and are the only ones evicted.
 * Lookups compare the scope, the parent key and all 16 tokens, so a hash collision can
 * never hand out another prefix's (or another scope's) block.
 *
 * Not thread-safe: the scheduler thread owns it. Allocation happens once, at init
 * (capacity = the pool's blocks: an entry per block at most).
 */
#ifndef KILN_SCHED_PREFIX_H
#define KILN_SCHED_PREFIX_H

#include "sched/adapter.h"

typedef struct kiln_prefix_entry {
    uint64_t key, parent, scope;
    int32_t tokens[KILN_SCHED_BLOCK];
    int32_t block;
    int32_t users;
    int32_t prev, next; /* LRU list (users == 0) */
    int32_t hnext;      /* hash chain / free list */
    bool live;
} kiln_prefix_entry;

typedef struct kiln_prefix_cache {
    kiln_prefix_entry *e;
    int32_t cap, n_live, n_evictable;
    int32_t *buckets;
    uint32_t mask;
    int32_t free_head;
    int32_t lru_head, lru_tail; /* head: most recently released */
    uint64_t model_seed;
    const kiln_sched_engine *eng;
    uint64_t evictions;
} kiln_prefix_cache;

kiln_status kiln_prefix_init(kiln_prefix_cache *pc, const kiln_sched_engine *eng, int32_t cap,
                             kiln_err *err);
/* Drops every entry's pool ref (users must be 0 everywhere) and frees the index. */
void kiln_prefix_free(kiln_prefix_cache *pc);

uint64_t kiln_prefix_scope(const char *name);
/* The key of the block with these 16 tokens after the block whose key is parent (0 for
 * the first block). */
uint64_t kiln_prefix_key(const kiln_prefix_cache *pc, uint64_t scope, uint64_t parent,
                         const int32_t *tokens);
/* The entry with exactly this scope/parent/tokens, or -1. */
int32_t kiln_prefix_find(const kiln_prefix_cache *pc, uint64_t scope, uint64_t parent, uint64_t key,
                         const int32_t *tokens);
/* Adds an entry for block (taking a pool ref; users starts at 1). -1 when no entry is
 * free even after evicting the least recently used one. Callers check find first. */
int32_t kiln_prefix_insert(kiln_prefix_cache *pc, uint64_t scope, uint64_t parent, uint64_t key,
                           const int32_t *tokens, int32_t block);
void kiln_prefix_use(kiln_prefix_cache *pc, int32_t i);
void kiln_prefix_release(kiln_prefix_cache *pc, int32_t i);
/* Evicts up to n least recently used free entries; returns how many. */
int32_t kiln_prefix_evict(kiln_prefix_cache *pc, int32_t n);

#endif /* KILN_SCHED_PREFIX_H */
