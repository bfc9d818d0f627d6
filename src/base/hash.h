/*
 * hash.h — non-cryptographic hashing (xxHash XXH3 from Debian's libxxhash).
 * Used for prefix-cache block keys, selection-cache keys and file checksums.
 * Deterministic across runs and machines (seeded only by the caller).
 */
#ifndef KILN_BASE_HASH_H
#define KILN_BASE_HASH_H

#include <stddef.h>
#include <stdint.h>

typedef struct kiln_hash128 {
    uint64_t lo, hi;
} kiln_hash128;

uint64_t kiln_hash64(const void *data, size_t len, uint64_t seed);
kiln_hash128 kiln_hash128_of(const void *data, size_t len, uint64_t seed);
/* Mixes two 64-bit hashes (for chaining, e.g. prefix blocks). */
uint64_t kiln_hash_combine(uint64_t a, uint64_t b);

/* Streaming 64-bit hash over many buffers. */
typedef struct kiln_hash_stream kiln_hash_stream;
kiln_hash_stream *kiln_hash_stream_new(uint64_t seed); /* NULL when out of memory */
void kiln_hash_stream_update(kiln_hash_stream *s, const void *data, size_t len);
uint64_t kiln_hash_stream_digest(const kiln_hash_stream *s);
void kiln_hash_stream_free(kiln_hash_stream *s);

#endif /* KILN_BASE_HASH_H */
