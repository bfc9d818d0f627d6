/*
 * registry.c — builds registries from provider tables: probes availability, applies
 * capabilities descriptors, indexes kernels per op (best static priority first), picks
 * the fallback per op and hashes the whole state.
 *
 * default_registry is this file's singleton: built once (pthread_once) from the
 * built-in providers below, immutable afterwards, never freed.
 */
#include "kernels/registry.h"

#include "base/hash.h"
#include "base/log.h"
#include "base/mem.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Built-in providers. A new provider (cpu SIMD, cuda, cublas, onednn) adds its
 * kiln_provider here; the order only breaks priority ties. */
static const kiln_provider *const builtin_providers[] = {
    &kiln_provider_ref,  &kiln_provider_cpu, &kiln_provider_openblas, &kiln_provider_onednn,
#ifdef KILN_HAVE_CUDA
    &kiln_provider_cuda,
#endif
};

static int cmp_priority(const kiln_registry *r, int a, int b) {
    const kiln_kernel_spec *sa = &r->kernels[a].spec, *sb = &r->kernels[b].spec;
    if (sa->priority != sb->priority) return sb->priority - sa->priority;
    return a - b;
}

static kiln_status read_file(const char *path, char **out, size_t *len, kiln_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_err_errno(err, errno, "opening %s", path);
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            size_t nc = cap ? cap * 2 : 8192;
            if (nc > (16u << 20)) {
                kiln_free(buf);
                fclose(f);
                return kiln_err_set(err, KILN_ERR_RANGE, "%s: larger than 16 MiB", path);
            }
            char *nb = kiln_realloc(buf, nc);
            if (!nb) {
                kiln_free(buf);
                fclose(f);
                return kiln_err_set(err, KILN_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb, cap = nc;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        kiln_free(buf);
        return kiln_err_set(err, KILN_ERR_IO, "reading %s failed", path);
    }
    buf[n] = 0;
    *out = buf, *len = n;
    return KILN_OK;
}

static void apply_descriptor(kiln_registry *r, int pi, int first, int count, const char *dir) {
    kiln_reg_provider *rp = &r->providers[pi];
    snprintf(rp->descriptor_path, sizeof rp->descriptor_path, "%s/%s.json", dir, rp->p->name);
    FILE *probe = fopen(rp->descriptor_path, "rb");
    if (!probe) {
        rp->descriptor_path[0] = 0;
        return; /* no descriptor: the static specs stand */
    }
    fclose(probe);
    kiln_err e;
    kiln_err_clear(&e);
    char *text = NULL;
    size_t len = 0;
    kiln_kernel_spec specs[KILN_REG_MAX_PER_OP * 2];
    bool declared[KILN_REG_MAX_PER_OP * 2];
    if (count > (int)(sizeof specs / sizeof specs[0])) {
        snprintf(rp->why, sizeof rp->why, "too many kernels for a descriptor");
        rp->available = false;
        return;
    }
    for (int i = 0; i < count; i++) specs[i] = r->kernels[first + i].spec;
    kiln_status st = read_file(rp->descriptor_path, &text, &len, &e);
    if (!st)
        st = kiln_descriptor_apply(text, len, rp->descriptor_path, rp->p->name, specs, declared,
                                   count, &rp->descriptor_hash, &e);
    kiln_free(text);
    if (st) {
        rp->available = false;
        snprintf(rp->why, sizeof rp->why, "descriptor rejected: %.480s", e.msg);
        KILN_WARN("kernel provider %s unavailable: descriptor rejected: %s", rp->p->name, e.msg);
        return;
    }
    rp->has_descriptor = true;
    for (int i = 0; i < count; i++) {
        r->kernels[first + i].spec = specs[i];
        r->kernels[first + i].undeclared = !declared[i];
    }
}

kiln_status kiln_registry_new(const kiln_provider *const *providers, int n_providers,
                              const char *descriptor_dir, kiln_registry **out, kiln_err *err) {
    *out = NULL;
    if (n_providers < 0 || n_providers > KILN_REG_MAX_PROVIDERS)
        return kiln_err_set(err, KILN_ERR_RANGE, "registry: %d providers (max %d)", n_providers,
                            KILN_REG_MAX_PROVIDERS);
    int total = 0;
    for (int i = 0; i < n_providers; i++) {
        if (!providers[i] || !providers[i]->name || providers[i]->n_specs < 0)
            return kiln_err_set(err, KILN_ERR_INVALID_ARG, "registry: provider %d is malformed", i);
        total += providers[i]->n_specs;
    }
    if (total > KILN_REG_MAX_KERNELS)
        return kiln_err_set(err, KILN_ERR_RANGE, "registry: %d kernels (max %d)", total,
                            KILN_REG_MAX_KERNELS);
    kiln_registry *r = kiln_calloc(1, sizeof *r);
    if (!r) return kiln_err_set(err, KILN_ERR_NOMEM, "registry: out of memory");
    r->kernels = kiln_calloc(total ? (size_t)total : 1, sizeof *r->kernels);
    if (!r->kernels) {
        kiln_free(r);
        return kiln_err_set(err, KILN_ERR_NOMEM, "registry: out of memory");
    }
    for (int op = 0; op < KILN_KOP_COUNT; op++) r->fallback[op] = -1;

    kiln_hash_stream *hs = kiln_hash_stream_new(0x6b696c6eu);
    if (!hs) {
        kiln_registry_free(r);
        return kiln_err_set(err, KILN_ERR_NOMEM, "registry: out of memory");
    }
    kiln_status st = KILN_OK;
    for (int pi = 0; pi < n_providers && !st; pi++) {
        const kiln_provider *p = providers[pi];
        for (int j = 0; j < pi; j++)
            if (strcmp(r->providers[j].p->name, p->name) == 0)
                st = kiln_err_set(err, KILN_ERR_INVALID_ARG, "registry: provider '%s' twice",
                                  p->name);
        if (st) break;
        kiln_reg_provider *rp = &r->providers[r->n_providers++];
        rp->p = p;
        rp->available = p->probe ? p->probe(rp->why, sizeof rp->why) : true;
        int first = r->n_kernels;
        for (int i = 0; i < p->n_specs && !st; i++) {
            const kiln_kernel_spec *s = &p->specs[i];
            if (!s->id || (unsigned)s->op >= KILN_KOP_COUNT || !s->provider ||
                strcmp(s->provider, p->name) != 0) {
                st = kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                  "registry: provider '%s' spec %d is malformed (id, op or "
                                  "provider name)",
                                  p->name, i);
                break;
            }
            if (kiln_registry_find(r, s->id)) {
                st = kiln_err_set(err, KILN_ERR_INVALID_ARG, "registry: kernel id '%s' twice",
                                  s->id);
                break;
            }
            kiln_reg_kernel *k = &r->kernels[r->n_kernels];
            k->spec = *s;
            k->provider = pi;
            k->index = r->n_kernels++;
            k->id_hash = kiln_hash64(s->id, strlen(s->id), 0);
        }
        if (st) break;
        if (descriptor_dir && rp->available)
            apply_descriptor(r, pi, first, r->n_kernels - first, descriptor_dir);
        kiln_hash_stream_update(hs, p->name, strlen(p->name) + 1);
        uint8_t av = rp->available;
        kiln_hash_stream_update(hs, &av, 1);
        kiln_hash_stream_update(hs, &rp->descriptor_hash, sizeof rp->descriptor_hash);
    }
    if (st) {
        kiln_hash_stream_free(hs);
        kiln_registry_free(r);
        return st;
    }
    for (int i = 0; i < r->n_kernels; i++) {
        kiln_reg_kernel *k = &r->kernels[i];
        kiln_kop op = k->spec.op;
        kiln_hash_stream_update(hs, k->spec.id, strlen(k->spec.id) + 1);
        uint8_t built = k->spec.fn.any != NULL && !k->undeclared;
        kiln_hash_stream_update(hs, &built, 1);
        if (r->n_by_op[op] >= KILN_REG_MAX_PER_OP) {
            kiln_hash_stream_free(hs);
            kiln_registry_free(r);
            return kiln_err_set(err, KILN_ERR_RANGE, "registry: more than %d kernels for op %s",
                                KILN_REG_MAX_PER_OP, kiln_kop_name(op));
        }
        /* insertion sort by priority */
        int pos = r->n_by_op[op]++;
        while (pos > 0 && cmp_priority(r, r->by_op[op][pos - 1], i) > 0) {
            r->by_op[op][pos] = r->by_op[op][pos - 1];
            pos--;
        }
        r->by_op[op][pos] = i;
        if (r->providers[k->provider].p->fallback && r->fallback[op] < 0) r->fallback[op] = i;
    }
    r->hash = kiln_hash_stream_digest(hs);
    kiln_hash_stream_free(hs);
    *out = r;
    return KILN_OK;
}

void kiln_registry_free(kiln_registry *r) {
    if (!r) return;
    kiln_free(r->kernels);
    kiln_free(r);
}

const kiln_reg_kernel *kiln_registry_find(const kiln_registry *r, const char *kernel_id) {
    if (!kernel_id) return NULL;
    for (int i = 0; i < r->n_kernels; i++)
        if (strcmp(r->kernels[i].spec.id, kernel_id) == 0) return &r->kernels[i];
    return NULL;
}

int kiln_registry_provider_index(const kiln_registry *r, const char *name) {
    for (int i = 0; i < r->n_providers; i++)
        if (name && strcmp(r->providers[i].p->name, name) == 0) return i;
    return -1;
}

static struct {
    pthread_once_t once;
    kiln_registry *reg;
    kiln_registry empty;
    char error[KILN_ERR_MSG_MAX];
} default_registry = {.once = PTHREAD_ONCE_INIT};

static void build_default(void) {
    kiln_err e;
    kiln_err_clear(&e);
    const char *dir = getenv("KILN_DESCRIPTOR_DIR");
    if (dir && !*dir) dir = NULL;
    int n = (int)(sizeof builtin_providers / sizeof builtin_providers[0]);
    if (kiln_registry_new(builtin_providers, n, dir, &default_registry.reg, &e)) {
        snprintf(default_registry.error, sizeof default_registry.error, "%s", e.msg);
        KILN_ERROR("kernel registry: %s", e.msg);
        for (int op = 0; op < KILN_KOP_COUNT; op++) default_registry.empty.fallback[op] = -1;
    }
}

const kiln_registry *kiln_registry_default(void) {
    pthread_once(&default_registry.once, build_default);
    return default_registry.reg ? default_registry.reg : &default_registry.empty;
}

const char *kiln_registry_default_error(void) {
    pthread_once(&default_registry.once, build_default);
    return default_registry.error;
}
