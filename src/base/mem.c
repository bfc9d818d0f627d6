#include "base/mem.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h>
#define KILN_HAVE_SSE2_STREAM 1
#endif

/* The allocation fault injector: a process-wide singleton (tests only). */
static struct {
    _Atomic uint64_t count;   /* allocations since the last set/reset */
    _Atomic uint64_t fail_at; /* 0: off */
    _Atomic uint64_t hits;    /* allocations failed on purpose */
    _Atomic bool persistent;
    _Atomic int64_t live; /* blocks allocated through the hook and not yet freed */
} g_alloc_fault;

int64_t kiln_alloc_live(void) {
    return atomic_load(&g_alloc_fault.live);
}

static inline void *live_add(void *p) {
    if (p) atomic_fetch_add_explicit(&g_alloc_fault.live, 1, memory_order_relaxed);
    return p;
}

void kiln_alloc_fault_set(uint64_t n, bool persistent) {
    atomic_store(&g_alloc_fault.fail_at, 0);
    atomic_store(&g_alloc_fault.count, 0);
    atomic_store(&g_alloc_fault.hits, 0);
    atomic_store(&g_alloc_fault.persistent, persistent);
    atomic_store(&g_alloc_fault.fail_at, n);
}

void kiln_alloc_fault_reset(void) {
    kiln_alloc_fault_set(0, false);
}

uint64_t kiln_alloc_count(void) {
    return atomic_load(&g_alloc_fault.count);
}

uint64_t kiln_alloc_fault_hits(void) {
    return atomic_load(&g_alloc_fault.hits);
}

/* Counts one allocation; true when the injector says this one fails. */
static inline bool alloc_should_fail(void) {
    uint64_t c = atomic_fetch_add_explicit(&g_alloc_fault.count, 1, memory_order_relaxed) + 1;
    uint64_t f = atomic_load_explicit(&g_alloc_fault.fail_at, memory_order_relaxed);
    if (f == 0 || c < f) return false;
    if (c != f && !atomic_load_explicit(&g_alloc_fault.persistent, memory_order_relaxed))
        return false;
    atomic_fetch_add_explicit(&g_alloc_fault.hits, 1, memory_order_relaxed);
    return true;
}

void *kiln_malloc(size_t size) {
    return alloc_should_fail() ? NULL : live_add(malloc(size));
}

void *kiln_calloc(size_t n, size_t elem) {
    return alloc_should_fail() ? NULL : live_add(calloc(n, elem));
}

void *kiln_realloc(void *p, size_t size) {
    if (alloc_should_fail()) return NULL;
    void *q = realloc(p, size);
    if (!p) return live_add(q);
    if (!q && size == 0) /* glibc: realloc(p, 0) frees p */
        atomic_fetch_sub_explicit(&g_alloc_fault.live, 1, memory_order_relaxed);
    return q;
}

void *kiln_adopt(void *p) {
    return live_add(p);
}

char *kiln_strdup(const char *s) {
    return alloc_should_fail() ? NULL : live_add(strdup(s));
}

char *kiln_strndup(const char *s, size_t n) {
    return alloc_should_fail() ? NULL : live_add(strndup(s, n));
}

void kiln_free(void *p) {
    if (p) atomic_fetch_sub_explicit(&g_alloc_fault.live, 1, memory_order_relaxed);
    free(p);
}

void *kiln_alloc_aligned(size_t size) {
    size_t rounded;
    if (size == 0) size = KILN_ALIGN;
    if (!kiln_size_align_up(size, KILN_ALIGN, &rounded)) return NULL;
    if (alloc_should_fail()) return NULL;
    return live_add(aligned_alloc(KILN_ALIGN, rounded));
}

void *kiln_calloc_aligned(size_t size) {
    void *p = kiln_alloc_aligned(size);
    if (p) memset(p, 0, size ? size : KILN_ALIGN);
    return p;
}

void kiln_free_aligned(void *p) {
    kiln_free(p);
}

kiln_status kiln_size_mul_err(size_t a, size_t b, size_t *out, const char *what, kiln_err *err) {
    if (!kiln_size_mul(a, b, out))
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "%s: size overflow (%zu x %zu)", what, a, b);
    return KILN_OK;
}

kiln_status kiln_size_add_err(size_t a, size_t b, size_t *out, const char *what, kiln_err *err) {
    if (!kiln_size_add(a, b, out))
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "%s: size overflow (%zu + %zu)", what, a, b);
    return KILN_OK;
}

kiln_status kiln_xmalloc(size_t size, void **out, const char *what, kiln_err *err) {
    *out = kiln_malloc(size ? size : 1);
    if (!*out)
        return kiln_err_set(err, KILN_ERR_NOMEM, "out of memory allocating %zu bytes for %s", size,
                            what);
    return KILN_OK;
}

kiln_status kiln_xcalloc(size_t n, size_t elem, void **out, const char *what, kiln_err *err) {
    size_t total;
    KILN_TRY(kiln_size_mul_err(n, elem, &total, what, err));
    *out = kiln_calloc(total ? n : 1, total ? elem : 1);
    if (!*out)
        return kiln_err_set(err, KILN_ERR_NOMEM, "out of memory allocating %zu bytes for %s", total,
                            what);
    return KILN_OK;
}

struct kiln_arena_chunk {
    kiln_arena_chunk *next;
    size_t cap;
    size_t used;
    /* data follows, 64-byte aligned (the header is padded to KILN_ALIGN) */
};

#define CHUNK_HDR KILN_ALIGN
_Static_assert(sizeof(kiln_arena_chunk) <= CHUNK_HDR, "arena chunk header too large");

void kiln_arena_init(kiln_arena *a, size_t chunk_size) {
    memset(a, 0, sizeof *a);
    a->chunk_size = chunk_size ? chunk_size : (size_t)1 << 20;
}

static kiln_arena_chunk *chunk_new(size_t cap) {
    size_t total;
    if (!kiln_size_add(cap, CHUNK_HDR, &total)) return NULL;
    kiln_arena_chunk *c = kiln_alloc_aligned(total);
    if (!c) return NULL;
    c->next = NULL;
    c->cap = cap;
    c->used = 0;
    return c;
}

void *kiln_arena_alloc(kiln_arena *a, size_t size) {
    size_t need;
    if (!kiln_size_align_up(size ? size : 1, KILN_ALIGN, &need)) return NULL;
    kiln_arena_chunk *c = a->head;
    if (!c || c->cap - c->used < need) {
        size_t cap = need > a->chunk_size ? need : a->chunk_size;
        kiln_arena_chunk *n = chunk_new(cap);
        if (!n) return NULL;
        n->next = c;
        a->head = n;
        a->bytes_reserved += cap;
        c = n;
    }
    void *p = (char *)c + CHUNK_HDR + c->used;
    c->used += need;
    a->bytes_used += need;
    return p;
}

void *kiln_arena_calloc(kiln_arena *a, size_t n, size_t elem) {
    size_t total;
    if (!kiln_size_mul(n, elem, &total)) return NULL;
    void *p = kiln_arena_alloc(a, total);
    if (p) memset(p, 0, total);
    return p;
}

char *kiln_arena_strndup(kiln_arena *a, const char *s, size_t n) {
    size_t total;
    if (!kiln_size_add(n, 1, &total)) return NULL;
    char *p = kiln_arena_alloc(a, total);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void kiln_arena_reset(kiln_arena *a) {
    /* keep the largest chunk, free the others */
    kiln_arena_chunk *keep = NULL;
    for (kiln_arena_chunk *c = a->head; c; c = c->next)
        if (!keep || c->cap > keep->cap) keep = c;
    kiln_arena_chunk *c = a->head;
    while (c) {
        kiln_arena_chunk *next = c->next;
        if (c != keep) kiln_free_aligned(c);
        c = next;
    }
    a->head = keep;
    a->bytes_used = 0;
    a->bytes_reserved = keep ? keep->cap : 0;
    if (keep) {
        keep->next = NULL;
        keep->used = 0;
    }
}

void kiln_arena_free(kiln_arena *a) {
    kiln_arena_chunk *c = a->head;
    while (c) {
        kiln_arena_chunk *next = c->next;
        kiln_free_aligned(c);
        c = next;
    }
    a->head = NULL;
    a->bytes_used = a->bytes_reserved = 0;
}

void kiln_memcpy_stream(void *dst, const void *src, size_t n) {
#ifdef KILN_HAVE_SSE2_STREAM
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (n < 256) { /* not worth the fence */
        memcpy(d, s, n);
        return;
    }
    const size_t head = (size_t)(-(uintptr_t)d & 15); /* to a 16-byte aligned destination */
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    _mm_sfence();
    memcpy(d + i, s + i, n - i);
#else
    memcpy(dst, src, n);
#endif
}
