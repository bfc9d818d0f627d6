/* prefix.c — the prefix-cache index (see prefix.h). */
#include "sched/prefix.h"
#include "base/mem.h"

#include "base/hash.h"

#include <stdlib.h>
#include <string.h>

kiln_status kiln_prefix_init(kiln_prefix_cache *pc, const kiln_sched_engine *eng, int32_t cap,
                             kiln_err *err) {
    memset(pc, 0, sizeof(*pc));
    if (cap < 1) cap = 1;
    uint32_t nb = 16;
    while (nb < (uint32_t)cap * 2u && nb < (1u << 30)) nb <<= 1;
    pc->e = kiln_calloc((size_t)cap, sizeof(kiln_prefix_entry));
    pc->buckets = kiln_malloc((size_t)nb * sizeof(int32_t));
    if (!pc->e || !pc->buckets) {
        kiln_free(pc->e);
        kiln_free(pc->buckets);
        memset(pc, 0, sizeof(*pc));
        return kiln_err_set(err, KILN_ERR_NOMEM, "prefix cache: %d entries", (int)cap);
    }
    for (uint32_t i = 0; i < nb; i++) pc->buckets[i] = -1;
    pc->mask = nb - 1;
    pc->cap = cap;
    for (int32_t i = 0; i < cap; i++) pc->e[i].hnext = i + 1 < cap ? i + 1 : -1;
    pc->free_head = 0;
    pc->lru_head = pc->lru_tail = -1;
    pc->eng = eng;
    const char *id = eng && eng->model_id ? eng->model_id : "";
    pc->model_seed = kiln_hash64(id, strlen(id), 0x6b696c6e70726566ull);
    return KILN_OK;
}

static void lru_unlink(kiln_prefix_cache *pc, int32_t i) {
    kiln_prefix_entry *x = &pc->e[i];
    if (x->prev >= 0)
        pc->e[x->prev].next = x->next;
    else
        pc->lru_head = x->next;
    if (x->next >= 0)
        pc->e[x->next].prev = x->prev;
    else
        pc->lru_tail = x->prev;
    x->prev = x->next = -1;
    pc->n_evictable--;
}

static void lru_push_head(kiln_prefix_cache *pc, int32_t i) {
    kiln_prefix_entry *x = &pc->e[i];
    x->prev = -1;
    x->next = pc->lru_head;
    if (pc->lru_head >= 0) pc->e[pc->lru_head].prev = i;
    pc->lru_head = i;
    if (pc->lru_tail < 0) pc->lru_tail = i;
    pc->n_evictable++;
}

static void remove_entry(kiln_prefix_cache *pc, int32_t i) {
    kiln_prefix_entry *x = &pc->e[i];
    int32_t *pp = &pc->buckets[x->key & pc->mask];
    while (*pp != i) pp = &pc->e[*pp].hnext;
    *pp = x->hnext;
    pc->eng->block_unref(pc->eng->impl, x->block);
    x->live = false;
    x->hnext = pc->free_head;
    pc->free_head = i;
    pc->n_live--;
    pc->evictions++;
}

void kiln_prefix_free(kiln_prefix_cache *pc) {
    if (!pc || !pc->e) return;
    for (int32_t i = 0; i < pc->cap; i++)
        if (pc->e[i].live) {
            pc->eng->block_unref(pc->eng->impl, pc->e[i].block);
            pc->e[i].live = false;
        }
    kiln_free(pc->e);
    kiln_free(pc->buckets);
    memset(pc, 0, sizeof(*pc));
}

uint64_t kiln_prefix_scope(const char *name) {
    return kiln_hash64(name, strlen(name), 0x73636f7065ull);
}

uint64_t kiln_prefix_key(const kiln_prefix_cache *pc, uint64_t scope, uint64_t parent,
                         const int32_t *tokens) {
    uint64_t h = kiln_hash64(tokens, KILN_SCHED_BLOCK * sizeof(int32_t), pc->model_seed);
    h = kiln_hash_combine(h, parent);
    h = kiln_hash_combine(h, scope);
    return h ? h : 1; /* 0 means "no parent" */
}

int32_t kiln_prefix_find(const kiln_prefix_cache *pc, uint64_t scope, uint64_t parent, uint64_t key,
                         const int32_t *tokens) {
    for (int32_t i = pc->buckets[key & pc->mask]; i >= 0; i = pc->e[i].hnext) {
        const kiln_prefix_entry *x = &pc->e[i];
        if (x->key == key && x->scope == scope && x->parent == parent &&
            memcmp(x->tokens, tokens, sizeof(x->tokens)) == 0)
            return i;
    }
    return -1;
}

int32_t kiln_prefix_insert(kiln_prefix_cache *pc, uint64_t scope, uint64_t parent, uint64_t key,
                           const int32_t *tokens, int32_t block) {
    if (pc->free_head < 0) {
        if (pc->lru_tail < 0) return -1;
        int32_t v = pc->lru_tail;
        lru_unlink(pc, v);
        remove_entry(pc, v);
    }
    int32_t i = pc->free_head;
    kiln_prefix_entry *x = &pc->e[i];
    pc->free_head = x->hnext;
    x->key = key;
    x->parent = parent;
    x->scope = scope;
    memcpy(x->tokens, tokens, sizeof(x->tokens));
    x->block = block;
    x->users = 1;
    x->prev = x->next = -1;
    x->live = true;
    x->hnext = pc->buckets[key & pc->mask];
    pc->buckets[key & pc->mask] = i;
    pc->n_live++;
    pc->eng->block_ref(pc->eng->impl, block);
    return i;
}

void kiln_prefix_use(kiln_prefix_cache *pc, int32_t i) {
    if (pc->e[i].users++ == 0) lru_unlink(pc, i);
}

void kiln_prefix_release(kiln_prefix_cache *pc, int32_t i) {
    if (--pc->e[i].users == 0) lru_push_head(pc, i);
}

int32_t kiln_prefix_evict(kiln_prefix_cache *pc, int32_t n) {
    int32_t done = 0;
    while (done < n && pc->lru_tail >= 0) {
        int32_t v = pc->lru_tail;
        lru_unlink(pc, v);
        remove_entry(pc, v);
        done++;
    }
    return done;
}
