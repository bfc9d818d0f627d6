/* strtab.c — the string table and integer map behind vocabularies (see tok_impl.h). */
#include "base/hash.h"
#include "base/mem.h"
#include "tok/tok_impl.h"

#include <stdlib.h>
#include <string.h>

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

kiln_status kiln_strtab_init(kiln_strtab *t, uint32_t expect, kiln_err *err) {
    memset(t, 0, sizeof *t);
    t->cap = expect < 16 ? 16 : expect;
    size_t nslots = pow2_at_least((size_t)t->cap * 2);
    t->off_len = kiln_malloc(sizeof(uint64_t) * t->cap);
    t->slots = kiln_calloc(nslots, sizeof(uint64_t));
    t->blob_cap = (size_t)t->cap * 8;
    t->blob = kiln_malloc(t->blob_cap);
    if (!t->off_len || !t->slots || !t->blob) {
        kiln_strtab_free(t);
        return kiln_err_set(err, KILN_ERR_NOMEM, "string table for %u strings: out of memory",
                            expect);
    }
    t->slot_mask = (uint32_t)(nslots - 1);
    return KILN_OK;
}

void kiln_strtab_free(kiln_strtab *t) {
    kiln_free(t->blob);
    kiln_free(t->off_len);
    kiln_free(t->slots);
    memset(t, 0, sizeof *t);
}

static inline uint32_t str_hash(const char *s, size_t n) {
    return (uint32_t)kiln_hash64(s, n, 0x6b696c6e);
}

int32_t kiln_strtab_find(const kiln_strtab *t, const char *s, size_t n) {
    uint32_t h = str_hash(s, n);
    for (uint32_t i = h & t->slot_mask;; i = (i + 1) & t->slot_mask) {
        uint64_t e = t->slots[i];
        if (!e) return -1;
        if ((uint32_t)(e >> 32) != h) continue;
        int32_t id = (int32_t)(uint32_t)e - 1;
        uint64_t ol = t->off_len[id];
        if ((ol & 0xFFFFFF) == n && memcmp(t->blob + (ol >> 24), s, n) == 0) return id;
    }
}

static bool grow_slots(kiln_strtab *t) {
    size_t nslots = ((size_t)t->slot_mask + 1) * 2;
    uint64_t *ns = kiln_calloc(nslots, sizeof(uint64_t));
    if (!ns) return false;
    for (size_t i = 0; i <= t->slot_mask; i++) {
        uint64_t e = t->slots[i];
        if (!e) continue;
        uint32_t h = (uint32_t)(e >> 32);
        size_t j = h & (nslots - 1);
        while (ns[j]) j = (j + 1) & (nslots - 1);
        ns[j] = e;
    }
    kiln_free(t->slots);
    t->slots = ns;
    t->slot_mask = (uint32_t)(nslots - 1);
    return true;
}

int32_t kiln_strtab_add(kiln_strtab *t, const char *s, size_t n) {
    if (n >= (1u << 24) || t->n >= INT32_MAX - 1) return -1;
    if (t->n == t->cap) {
        uint64_t *nol = kiln_realloc(t->off_len, sizeof(uint64_t) * (size_t)t->cap * 2);
        if (!nol) return -1;
        t->off_len = nol;
        t->cap *= 2;
    }
    if ((size_t)(t->n + 1) * 2 > (size_t)t->slot_mask + 1 && !grow_slots(t)) return -1;
    if (t->blob_len + n > t->blob_cap) {
        size_t nc = t->blob_cap * 2;
        while (nc < t->blob_len + n) nc *= 2;
        if (nc >= ((size_t)1 << 40)) return -1;
        char *nb = kiln_realloc(t->blob, nc);
        if (!nb) return -1;
        t->blob = nb;
        t->blob_cap = nc;
    }
    memcpy(t->blob + t->blob_len, s, n);
    uint32_t id = t->n++;
    t->off_len[id] = (uint64_t)t->blob_len << 24 | n;
    t->blob_len += n;
    uint32_t h = str_hash(s, n);
    /* a text added again replaces the older id in the index (last one wins) */
    for (uint32_t i = h & t->slot_mask;; i = (i + 1) & t->slot_mask) {
        uint64_t e = t->slots[i];
        if (!e) {
            t->slots[i] = (uint64_t)h << 32 | (id + 1);
            break;
        }
        if ((uint32_t)(e >> 32) == h) {
            uint32_t old = (uint32_t)e - 1;
            uint64_t ol = t->off_len[old];
            if ((ol & 0xFFFFFF) == n && memcmp(t->blob + (ol >> 24), s, n) == 0) {
                t->slots[i] = (uint64_t)h << 32 | (id + 1);
                break;
            }
        }
    }
    return (int32_t)id;
}

int32_t kiln_strtab_intern(kiln_strtab *t, const char *s, size_t n) {
    int32_t id = kiln_strtab_find(t, s, n);
    return id >= 0 ? id : kiln_strtab_add(t, s, n);
}

/* ---- u64 map ---- */

kiln_status kiln_u64map_init(kiln_u64map *m, size_t expect, kiln_err *err) {
    size_t n = pow2_at_least(expect * 2 + 1);
    m->slots = kiln_calloc(n, sizeof *m->slots);
    m->mask = n - 1;
    m->n = 0;
    if (!m->slots)
        return kiln_err_set(err, KILN_ERR_NOMEM, "hash map for %zu entries: out of memory", expect);
    return KILN_OK;
}

void kiln_u64map_free(kiln_u64map *m) {
    kiln_free(m->slots);
    memset(m, 0, sizeof *m);
}

static bool u64map_grow(kiln_u64map *m) {
    size_t n = (m->mask + 1) * 2;
    kiln_u64slot *ns = kiln_calloc(n, sizeof *ns);
    if (!ns) return false;
    for (size_t i = 0; i <= m->mask; i++) {
        if (!m->slots[i].key) continue;
        size_t j = kiln_u64map_mix(m->slots[i].key) & (n - 1);
        while (ns[j].key) j = (j + 1) & (n - 1);
        ns[j] = m->slots[i];
    }
    kiln_free(m->slots);
    m->slots = ns;
    m->mask = n - 1;
    return true;
}

bool kiln_u64map_put_first(kiln_u64map *m, uint64_t key, uint64_t val) {
    if ((m->n + 1) * 2 > m->mask + 1 && !u64map_grow(m)) return false;
    for (size_t i = kiln_u64map_mix(key) & m->mask;; i = (i + 1) & m->mask) {
        if (m->slots[i].key == key) return true;
        if (!m->slots[i].key) {
            m->slots[i].key = key;
            m->slots[i].val = val;
            m->n++;
            return true;
        }
    }
}
