/*
 * mem.h — allocation and overflow-checked size arithmetic.
 *
 * - kiln_alloc_aligned / kiln_free_aligned: 64-byte aligned blocks (cache line and
 *   AVX-512 width). kiln_free_aligned(NULL) is a no-op.
 * - kiln_size_mul / kiln_size_add: return false on overflow; use them for every size
 *   that comes from a file or a client. The _err variants fill a message naming what
 *   was being computed.
 * - kiln_malloc / kiln_calloc / kiln_realloc / kiln_strdup / kiln_strndup / kiln_free: the
 *   ONE route of every kiln heap allocation (same contracts as the libc functions they wrap;
 *   kiln_free(NULL) is a no-op; memory from libc, e.g. asprintf, may be freed with kiln_free).
 *   Each allocation counts in the fault injector below. New code must use these, never
 *   plain malloc/calloc/realloc/strdup (docs/RELIABILITY.md).
 * - Fault injector (a process-wide singleton, for tests only): kiln_alloc_fault_set(n, p)
 *   makes the n-th allocation counted from that call fail (return NULL; p: that one and
 *   every later one). kiln_alloc_count() returns the allocations counted since the last
 *   kiln_alloc_fault_set / kiln_alloc_fault_reset; kiln_alloc_live() the blocks still
 *   allocated (leak checks). Thread-safe (atomics); off by default, costing two relaxed
 *   atomic adds per allocation and one per free.
 * - kiln_arena: a bump allocator made of chained 64-byte-aligned chunks. Use one per
 *   load (freed with the model) or per step (kiln_arena_reset between steps). Memory
 *   handed out lives until kiln_arena_reset / kiln_arena_free. Not thread-safe: one
 *   arena per owner thread.
 */
#ifndef KILN_BASE_MEM_H
#define KILN_BASE_MEM_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KILN_ALIGN 64

/* Counted wrappers of malloc, calloc, realloc, strdup, strndup and free (see above). */
void *kiln_malloc(size_t size);
void *kiln_calloc(size_t n, size_t elem);
void *kiln_realloc(void *p, size_t size);
char *kiln_strdup(const char *s);
char *kiln_strndup(const char *s, size_t n);
void kiln_free(void *p);
/* Takes a block that libc allocated outside these functions (json_dumps', asprintf's) into
 * kiln's count, so that kiln_free releases it like any other; returns p (NULL passes). */
void *kiln_adopt(void *p);

/* Fault injection (tests): fail the n-th allocation from now (n >= 1; 0 disables); with
 * persistent, every allocation from the n-th on fails. Resets the count. */
void kiln_alloc_fault_set(uint64_t n, bool persistent);
/* Disables injection and resets the count. */
void kiln_alloc_fault_reset(void);
/* Allocations counted since the last set/reset (failed ones included). */
uint64_t kiln_alloc_count(void);
/* Blocks allocated through these functions (and kiln_alloc_aligned, kiln_adopt) and not
 * yet freed through kiln_free / kiln_free_aligned: a leak check for tests (memory from libc
 * freed with kiln_free without kiln_adopt, or kiln's freed with free(), makes it drift). */
int64_t kiln_alloc_live(void);
/* Allocations that the injector has failed since the last set/reset. */
uint64_t kiln_alloc_fault_hits(void);

/* Returns NULL on failure (or when size overflows when rounded up to the alignment). */
/* memcpy with non-temporal stores (x86 SSE2 streaming stores, memcpy elsewhere): for
 * large copies into memory that the CPU will not read back soon (pinned staging that a
 * DMA engine reads): no read-for-ownership of the destination, no cache pollution.
 * Ordered before return (sfence). */
void kiln_memcpy_stream(void *dst, const void *src, size_t n);
void *kiln_alloc_aligned(size_t size);
/* Zero-filled variant of kiln_alloc_aligned. */
void *kiln_calloc_aligned(size_t size);
void kiln_free_aligned(void *p);

static inline bool kiln_size_mul(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool kiln_size_add(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}
static inline bool kiln_u64_mul(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool kiln_u64_add(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}
/* Round x up to a multiple of align (a power of two); false on overflow. */
static inline bool kiln_size_align_up(size_t x, size_t align, size_t *out) {
    size_t t;
    if (!kiln_size_add(x, align - 1, &t)) return false;
    *out = t & ~(align - 1);
    return true;
}

/* a*b with an error message "<what>: size overflow (a x b)" on failure. */
kiln_status kiln_size_mul_err(size_t a, size_t b, size_t *out, const char *what, kiln_err *err);
kiln_status kiln_size_add_err(size_t a, size_t b, size_t *out, const char *what, kiln_err *err);

/* malloc with a message naming what was allocated and how much, on failure. */
kiln_status kiln_xmalloc(size_t size, void **out, const char *what, kiln_err *err);
kiln_status kiln_xcalloc(size_t n, size_t elem, void **out, const char *what, kiln_err *err);

typedef struct kiln_arena_chunk kiln_arena_chunk;
typedef struct kiln_arena {
    kiln_arena_chunk *head; /* current chunk (newest) */
    size_t chunk_size;      /* default size of new chunks */
    size_t bytes_used;      /* sum of bytes handed out since the last reset */
    size_t bytes_reserved;  /* sum of chunk capacities */
} kiln_arena;

/* Initializes an empty arena whose chunks are at least chunk_size bytes (0: 1 MiB). */
void kiln_arena_init(kiln_arena *a, size_t chunk_size);
/* Returns 64-byte aligned memory or NULL when out of memory / size overflows. */
void *kiln_arena_alloc(kiln_arena *a, size_t size);
void *kiln_arena_calloc(kiln_arena *a, size_t n, size_t elem);
/* Copies a NUL-terminated string of n bytes (plus the NUL) into the arena. */
char *kiln_arena_strndup(kiln_arena *a, const char *s, size_t n);
/* Forgets every allocation but keeps the largest chunk for reuse. */
void kiln_arena_reset(kiln_arena *a);
/* Frees every chunk; the arena may be re-initialized. */
void kiln_arena_free(kiln_arena *a);

#endif /* KILN_BASE_MEM_H */
