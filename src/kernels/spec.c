/* spec.c — names of the enums of spec.h (backends, platforms, features, properties). */
#include "kernels/spec.h"

#include <strings.h>

static const char *const backend_names[KILN_BACKEND_COUNT] = {"ref", "cpu", "cuda"};
static const char *const platform_names[KILN_PLATFORM_COUNT] = {"host", "cuda"};
static const char *const feat_names[KILN_KFEAT_COUNT] = {
    "gqa",      "sliding_window", "softcap",   "paged_kv",   "causal",      "bias",
    "residual", "rope_neox",      "rope_yarn", "rope_freqs", "partial_rot", "geglu",
};
static const char *const prop_names[KILN_KPROP_COUNT] = {"deterministic", "batch_invariant",
                                                         "graph_safe"};

const char *kiln_backend_name(kiln_backend_id b) {
    return (unsigned)b < KILN_BACKEND_COUNT ? backend_names[b] : "unknown";
}

bool kiln_backend_from_name(const char *name, kiln_backend_id *out) {
    for (int i = 0; i < KILN_BACKEND_COUNT; i++)
        if (name && strcasecmp(name, backend_names[i]) == 0) {
            *out = (kiln_backend_id)i;
            return true;
        }
    return false;
}

kiln_platform kiln_backend_platform(kiln_backend_id b) {
    return b == KILN_BACKEND_CUDA ? KILN_PLATFORM_CUDA : KILN_PLATFORM_HOST;
}

const char *kiln_platform_name(kiln_platform p) {
    return (unsigned)p < KILN_PLATFORM_COUNT ? platform_names[p] : "unknown";
}

bool kiln_kop_from_name(const char *name, kiln_kop *out) {
    for (int i = 0; i < KILN_KOP_COUNT; i++)
        if (name && strcasecmp(name, kiln_kop_name((kiln_kop)i)) == 0) {
            *out = (kiln_kop)i;
            return true;
        }
    return false;
}

static int bit_index(uint32_t bit) {
    if (bit == 0 || (bit & (bit - 1))) return -1;
    return __builtin_ctz(bit);
}

const char *kiln_kfeat_name(uint32_t bit) {
    int i = bit_index(bit);
    return i >= 0 && i < KILN_KFEAT_COUNT ? feat_names[i] : NULL;
}

bool kiln_kfeat_from_name(const char *name, uint32_t *bit) {
    for (int i = 0; i < KILN_KFEAT_COUNT; i++)
        if (name && strcasecmp(name, feat_names[i]) == 0) {
            *bit = 1u << i;
            return true;
        }
    return false;
}

const char *kiln_kprop_name(uint32_t bit) {
    int i = bit_index(bit);
    return i >= 0 && i < KILN_KPROP_COUNT ? prop_names[i] : NULL;
}

bool kiln_kprop_from_name(const char *name, uint32_t *bit) {
    for (int i = 0; i < KILN_KPROP_COUNT; i++)
        if (name && strcasecmp(name, prop_names[i]) == 0) {
            *bit = 1u << i;
            return true;
        }
    return false;
}
