/* gguf_mutator.h — a structure-aware libFuzzer mutator for GGUF images (header only:
 * include it in one fuzz target, it defines LLVMFuzzerCustomMutator).
 *
 * Raw byte flips rarely get past GGUF's magic, counts and length prefixes, so this
 * mutator first walks the input as GGUF (v2/v3: header, key/value pairs, tensor infos),
 * recording where every header field, count, string length, value type, array count,
 * tensor rank, dimension, tensor type and data offset lives, then overwrites one or a
 * few of those fields with values chosen to break a reader: 0, 1, the value +-1, powers
 * of two near 2^31/2^32/2^63, UINT64_MAX, values whose products overflow, another
 * tensor's offset (overlap), misaligned offsets, types past the enum. Also: truncate at
 * a field boundary, swap two tensors' offsets, set general.alignment. One time in four,
 * or when the input is not GGUF, it falls back to libFuzzer's byte mutations. */
#ifndef KILN_FUZZ_GGUF_MUTATOR_H
#define KILN_FUZZ_GGUF_MUTATOR_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

enum gm_kind {
    GM_VERSION,
    GM_COUNT,  /* n_tensors, n_kv */
    GM_STRLEN, /* u64 length prefix of a key, name or string value */
    GM_VTYPE,  /* u32 value type of a kv or of an array's elements */
    GM_ARRLEN, /* u64 array count */
    GM_SCALAR, /* a kv's scalar value (u32/u64/i32...), 4 or 8 bytes */
    GM_NDIMS,  /* u32 tensor rank */
    GM_DIM,    /* u64 tensor dimension */
    GM_TTYPE,  /* u32 tensor type */
    GM_OFFSET, /* u64 tensor data offset */
    GM_ALIGN,  /* u32 value of general.alignment */
};

typedef struct gm_field {
    uint32_t off;
    uint8_t size; /* 4 or 8 */
    uint8_t kind;
} gm_field;

#define GM_MAX_FIELDS 4096

typedef struct gm_walk {
    const uint8_t *p;
    size_t n, pos;
    gm_field f[GM_MAX_FIELDS];
    int nf;
    int offsets[256]; /* indices into f of tensor offsets */
    int n_offsets;
    size_t data_start; /* end of tensor infos */
    int ok;
} gm_walk;

static void gm_add(gm_walk *w, size_t off, int size, int kind) {
    if (w->nf < GM_MAX_FIELDS)
        w->f[w->nf++] = (gm_field){(uint32_t)off, (uint8_t)size, (uint8_t)kind};
}

static int gm_u32(gm_walk *w, uint32_t *v, int kind) {
    if (w->n - w->pos < 4) return 0;
    memcpy(v, w->p + w->pos, 4);
    if (kind >= 0) gm_add(w, w->pos, 4, kind);
    w->pos += 4;
    return 1;
}

static int gm_u64(gm_walk *w, uint64_t *v, int kind) {
    if (w->n - w->pos < 8) return 0;
    memcpy(v, w->p + w->pos, 8);
    if (kind >= 0) gm_add(w, w->pos, 8, kind);
    w->pos += 8;
    return 1;
}

static int gm_str(gm_walk *w, const uint8_t **s, uint64_t *len) {
    if (!gm_u64(w, len, GM_STRLEN) || *len > w->n - w->pos) return 0;
    *s = w->p + w->pos;
    w->pos += (size_t)*len;
    return 1;
}

static int gm_value(gm_walk *w, uint32_t type, int depth, int is_align) {
    static const uint8_t sz[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type > 12) return 0;
    if (type == 8) {
        const uint8_t *s;
        uint64_t l;
        return gm_str(w, &s, &l);
    }
    if (type == 9) {
        uint32_t et;
        uint64_t cnt;
        if (depth > 2 || !gm_u32(w, &et, GM_VTYPE) || !gm_u64(w, &cnt, GM_ARRLEN)) return 0;
        for (uint64_t i = 0; i < cnt; i++) {
            if (w->nf >= GM_MAX_FIELDS - 8 && et != 8 && et != 9 && et <= 12) {
                /* long numeric arrays: skip without recording */
                if (sz[et] && (cnt - i) <= (w->n - w->pos) / sz[et]) {
                    w->pos += (size_t)(cnt - i) * sz[et];
                    return 1;
                }
                return 0;
            }
            if (!gm_value(w, et, depth + 1, 0)) return 0;
        }
        return 1;
    }
    if (w->n - w->pos < sz[type]) return 0;
    if (sz[type] >= 4) gm_add(w, w->pos, sz[type], is_align ? GM_ALIGN : GM_SCALAR);
    w->pos += sz[type];
    return 1;
}

/* Walks the GGUF image; w->ok when the header, every kv and every tensor info parsed. */
static void gm_parse(gm_walk *w, const uint8_t *p, size_t n) {
    memset(w, 0, sizeof *w);
    w->p = p;
    w->n = n;
    uint32_t magic, ver, vt;
    uint64_t nt, nkv;
    if (!gm_u32(w, &magic, -1) || memcmp(&magic, "GGUF", 4) != 0) return;
    if (!gm_u32(w, &ver, GM_VERSION) || !gm_u64(w, &nt, GM_COUNT) || !gm_u64(w, &nkv, GM_COUNT))
        return;
    for (uint64_t i = 0; i < nkv; i++) {
        const uint8_t *k;
        uint64_t kl;
        if (!gm_str(w, &k, &kl) || !gm_u32(w, &vt, GM_VTYPE)) return;
        int is_align = kl == 17 && memcmp(k, "general.alignment", 17) == 0 && vt == 4;
        if (!gm_value(w, vt, 0, is_align)) return;
    }
    for (uint64_t i = 0; i < nt; i++) {
        const uint8_t *s;
        uint64_t l, d, off;
        uint32_t nd, tt;
        if (!gm_str(w, &s, &l) || !gm_u32(w, &nd, GM_NDIMS) || nd > 8) return;
        for (uint32_t j = 0; j < nd; j++)
            if (!gm_u64(w, &d, GM_DIM)) return;
        if (!gm_u32(w, &tt, GM_TTYPE)) return;
        if (w->n_offsets < 256) w->offsets[w->n_offsets++] = w->nf;
        if (!gm_u64(w, &off, GM_OFFSET)) return;
    }
    w->data_start = w->pos;
    w->ok = 1;
}

static uint64_t gm_rand(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static uint64_t gm_interesting(uint64_t old, int kind, uint64_t *r, const gm_walk *w) {
    static const uint64_t any[] = {0,
                                   1,
                                   2,
                                   3,
                                   7,
                                   31,
                                   32,
                                   255,
                                   256,
                                   65535,
                                   65536,
                                   0x7fffffffu,
                                   0x80000000u,
                                   0xffffffffu,
                                   0x100000000ull,
                                   0x100000001ull,
                                   0x4000000000000000ull,
                                   0x7fffffffffffffffull,
                                   0x8000000000000000ull,
                                   0xffffffffffffffffull};
    uint64_t x = gm_rand(r);
    switch (x % 6) {
    case 0:
        return old + 1;
    case 1:
        return old - 1;
    case 2:
        return old * 2;
    case 3:
        if (kind == GM_VTYPE) return x % 16;
        if (kind == GM_TTYPE) return x % 48;
        if (kind == GM_VERSION) return 1 + x % 4;
        if (kind == GM_NDIMS) return x % 6;
        if (kind == GM_OFFSET && w->n_offsets) {
            const gm_field *o = &w->f[w->offsets[(x >> 8) % (uint64_t)w->n_offsets]];
            uint64_t v;
            memcpy(&v, w->p + o->off, 8);
            return v + ((x >> 20) & 1); /* overlap another tensor, maybe misaligned */
        }
        if (kind == GM_OFFSET) return w->n - w->data_start;
        if (kind == GM_DIM) return (x >> 8) % 2 ? 0x100000000ull : 0x20000000000ull;
        return x % 64;
    default:
        return any[(x >> 8) % (sizeof any / sizeof any[0])];
    }
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    static gm_walk w; /* large: keep it off the stack */
    uint64_t r = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
    gm_parse(&w, data, size);
    if (!w.ok || w.nf == 0 || gm_rand(&r) % 4 == 0) return LLVMFuzzerMutate(data, size, max_size);
    int n_mut = 1 + (int)(gm_rand(&r) % 3);
    for (int m = 0; m < n_mut; m++) {
        uint64_t op = gm_rand(&r) % 16;
        if (op == 0) { /* truncate at a field boundary */
            const gm_field *f = &w.f[gm_rand(&r) % (uint64_t)w.nf];
            return f->off + (gm_rand(&r) % 2 ? f->size : 0);
        }
        if (op == 1 && w.n_offsets >= 2) { /* swap two tensors' offsets */
            const gm_field *a = &w.f[w.offsets[gm_rand(&r) % (uint64_t)w.n_offsets]];
            const gm_field *b = &w.f[w.offsets[gm_rand(&r) % (uint64_t)w.n_offsets]];
            uint8_t t[8];
            memcpy(t, data + a->off, 8);
            memmove(data + a->off, data + b->off, 8);
            memcpy(data + b->off, t, 8);
            continue;
        }
        const gm_field *f = &w.f[gm_rand(&r) % (uint64_t)w.nf];
        uint64_t old = 0;
        memcpy(&old, data + f->off, f->size);
        uint64_t v = gm_interesting(old, f->kind, &r, &w);
        if (f->kind == GM_ALIGN && gm_rand(&r) % 2) v = (uint64_t)1 << (gm_rand(&r) % 33);
        if (f->size == 4) {
            uint32_t v32 = (uint32_t)v;
            memcpy(data + f->off, &v32, 4);
        } else {
            memcpy(data + f->off, &v, 8);
        }
    }
    return size;
}

#endif /* KILN_FUZZ_GGUF_MUTATOR_H */
