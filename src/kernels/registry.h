/*
 * registry.h — every kernel kiln knows, grouped by provider, with availability.
 *
 * A provider ("ref", "cpu", "openblas", "cuda", ...) is a static table of specs plus an
 * optional probe. The probe runs once when a registry is built; a provider whose library
 * cannot be loaded (dlopen fails, symbol missing, no GPU) is *unavailable* — its kernels
 * stay listed (`kiln kernels`, `kiln explain`) and are rejected with
 * PROVIDER_UNAVAILABLE, never a fatal error.
 *
 * Capabilities descriptors: a provider may ship a JSON file "<provider>.json" in the
 * descriptor directory ($KILN_DESCRIPTOR_DIR, else none). When present it narrows the
 * provider's specs (docs/KERNELS.md has the schema). It is checked strictly and fails
 * closed: wrong schema name or version, unknown fields, unknown kernel ids, bad values ->
 * the whole provider is unavailable, with the reason; a field the descriptor leaves out
 * means "unsupported" (empty dtype set, no features, ...). The hash of each descriptor's
 * bytes enters the registry hash, which enters every selection cache key and every
 * baked dispatch table.
 *
 * Ownership: kiln_registry_default() returns the process-wide registry (a lazily built,
 * immutable singleton; thread-safe; never freed). kiln_registry_new builds a private one
 * (tests, tools) that the caller frees with kiln_registry_free after every selector that
 * uses it.
 */
#ifndef KILN_KERNELS_REGISTRY_H
#define KILN_KERNELS_REGISTRY_H

#include "base/status.h"
#include "kernels/spec.h"

#include <stdbool.h>
#include <stdint.h>

/* Returns true when the provider can run here; otherwise writes why into `why`. */
typedef bool (*kiln_provider_probe)(char *why, size_t why_size);

typedef struct kiln_provider {
    const char *name;    /* "openblas" */
    const char *summary; /* one line */
    const kiln_kernel_spec *specs;
    int n_specs;
    kiln_provider_probe probe; /* NULL: always available */
    bool fallback;             /* its kernels are the fallbacks (the ref provider)  */
} kiln_provider;

/* Built-in providers (src/kernels/prov_*.c; the cpu provider's table is in
 * src/kernels/cpu/). */
extern const kiln_provider kiln_provider_ref;
extern const kiln_provider kiln_provider_openblas;
extern const kiln_provider kiln_provider_cpu;
extern const kiln_provider kiln_provider_onednn; /* no kernels when built without oneDNN */
#ifdef KILN_HAVE_CUDA
extern const kiln_provider kiln_provider_cuda; /* src/kernels/cuda/prov_cuda.c */
#endif

#define KILN_REG_MAX_PROVIDERS 16
#define KILN_REG_MAX_KERNELS   512
#define KILN_REG_MAX_PER_OP    64

typedef struct kiln_reg_provider {
    const kiln_provider *p;
    bool available;
    char why[512];            /* why unavailable (empty when available) */
    bool has_descriptor;      /* a descriptor narrowed its specs        */
    uint64_t descriptor_hash; /* hash of the descriptor bytes, 0 = none */
    char descriptor_path[256];
} kiln_reg_provider;

typedef struct kiln_reg_kernel {
    kiln_kernel_spec spec; /* effective spec (after the descriptor)           */
    int provider;          /* index into providers                            */
    int index;             /* index in kernels[] (stable for this registry)   */
    bool undeclared;       /* its provider's descriptor does not list it      */
    uint64_t id_hash;      /* hash of spec.id (PerfDB lookups)                */
} kiln_reg_kernel;

typedef struct kiln_registry {
    kiln_reg_provider providers[KILN_REG_MAX_PROVIDERS];
    int n_providers;
    kiln_reg_kernel *kernels; /* n_kernels, owned */
    int n_kernels;
    /* per op: kernel indices, best static priority first */
    int by_op[KILN_KOP_COUNT][KILN_REG_MAX_PER_OP];
    int n_by_op[KILN_KOP_COUNT];
    int fallback[KILN_KOP_COUNT]; /* index of the fallback kernel per op, -1 = none */
    uint64_t hash; /* kernel ids, availability, descriptor hashes: enters cache keys */
} kiln_registry;

/* The built-in providers, probed, with descriptors from $KILN_DESCRIPTOR_DIR. Never
 * NULL: a registry that cannot be built (out of memory) has no kernels and says why
 * through kiln_registry_default_error(). */
const kiln_registry *kiln_registry_default(void);
const char *kiln_registry_default_error(void);

/* Builds a registry from the given providers (duplicates ids are an error), reading
 * descriptors "<dir>/<provider>.json" when descriptor_dir is not NULL. A rejected
 * descriptor makes its provider unavailable (not an error of this call). */
kiln_status kiln_registry_new(const kiln_provider *const *providers, int n_providers,
                              const char *descriptor_dir, kiln_registry **out, kiln_err *err);
void kiln_registry_free(kiln_registry *r);

/* Lookups: NULL / -1 when absent. */
const kiln_reg_kernel *kiln_registry_find(const kiln_registry *r, const char *kernel_id);
int kiln_registry_provider_index(const kiln_registry *r, const char *provider_name);
static inline bool kiln_registry_kernel_available(const kiln_registry *r,
                                                  const kiln_reg_kernel *k) {
    return r->providers[k->provider].available && k->spec.fn.any != NULL && !k->undeclared;
}

/* ---- capabilities descriptors (descriptor.c) ---- */

#define KILN_DESCRIPTOR_SCHEMA  "kiln.kernel-descriptor"
#define KILN_DESCRIPTOR_VERSION 1

/* Applies a descriptor (JSON text of `len` bytes, named `path` in messages) to the
 * specs of one provider: specs[i] is narrowed in place and declared[i] says whether the
 * descriptor lists it (an undeclared kernel is unavailable). Fails with KILN_ERR_FORMAT
 * and a message naming the field when the descriptor is invalid; specs are then
 * unchanged. Out: the descriptor's hash. */
kiln_status kiln_descriptor_apply(const char *json, size_t len, const char *path,
                                  const char *provider, kiln_kernel_spec *specs, bool *declared,
                                  int n_specs, uint64_t *hash_out, kiln_err *err);

#endif /* KILN_KERNELS_REGISTRY_H */
