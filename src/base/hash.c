#include "base/hash.h"

#include <xxhash.h>

uint64_t kiln_hash64(const void *data, size_t len, uint64_t seed) {
    return XXH3_64bits_withSeed(data, len, seed);
}

kiln_hash128 kiln_hash128_of(const void *data, size_t len, uint64_t seed) {
    XXH128_hash_t h = XXH3_128bits_withSeed(data, len, seed);
    return (kiln_hash128){h.low64, h.high64};
}

uint64_t kiln_hash_combine(uint64_t a, uint64_t b) {
    uint64_t v[2] = {a, b};
    return XXH3_64bits(v, sizeof v);
}

struct kiln_hash_stream {
    XXH3_state_t *st;
};

kiln_hash_stream *kiln_hash_stream_new(uint64_t seed) {
    XXH3_state_t *st = XXH3_createState();
    if (!st) return NULL;
    XXH3_64bits_reset_withSeed(st, seed);
    return (kiln_hash_stream *)st;
}
void kiln_hash_stream_update(kiln_hash_stream *s, const void *data, size_t len) {
    XXH3_64bits_update((XXH3_state_t *)s, data, len);
}
uint64_t kiln_hash_stream_digest(const kiln_hash_stream *s) {
    return XXH3_64bits_digest((const XXH3_state_t *)s);
}
void kiln_hash_stream_free(kiln_hash_stream *s) {
    XXH3_freeState((XXH3_state_t *)s);
}
