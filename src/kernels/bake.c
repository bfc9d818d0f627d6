/*
 * bake.c — writing and reading baked dispatch tables (JSON; dispatch.h has the format).
 */
#include "kernels/dispatch.h"
#include "base/mem.h"

#include "base/cpu.h"
#include "base/log.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex64(uint64_t v, char out[17]) {
    snprintf(out, 17, "%016llx", (unsigned long long)v);
}

static void device_string(const kiln_sel_ctx *c, char *buf, size_t n) {
    if (kiln_backend_platform(c->backend) == KILN_PLATFORM_CUDA)
        snprintf(buf, n, "cuda|sm=%d", c->sm);
    else
        snprintf(buf, n, "%s|isa=%x", kiln_cpu_info()->model, c->isa);
}

static json_t *signature_json(const kiln_selector *s, const kiln_sel_ctx *c) {
    const kiln_registry *r = kiln_selector_registry(s);
    char dev[256], isa[256], h[17];
    device_string(c, dev, sizeof dev);
    kiln_isa_names(c->isa, isa, sizeof isa);
    json_t *sig = json_object();
    json_object_set_new(sig, "backend", json_string(kiln_backend_name(c->backend)));
    json_object_set_new(sig, "device", json_string(dev));
    json_object_set_new(sig, "isa", json_string(isa));
    json_object_set_new(sig, "sm", json_integer(c->sm));
    hex64(r->hash, h);
    json_object_set_new(sig, "registry", json_string(h));
    hex64(kiln_selector_policy(s)->hash, h);
    json_object_set_new(sig, "policy", json_string(h));
    json_t *desc = json_object();
    for (int i = 0; i < r->n_providers; i++) {
        hex64(r->providers[i].descriptor_hash, h);
        json_object_set_new(desc, r->providers[i].p->name, json_string(h));
    }
    json_object_set_new(sig, "descriptors", desc);
    json_object_set_new(sig, "kiln_version", json_string(KILN_VERSION_STRING));
    return sig;
}

kiln_status kiln_baked_save(const char *path, const kiln_selector *s, const kiln_sel_ctx *device,
                            const kiln_baked_site *sites, int n_sites, kiln_err *err) {
    if (!path || !s || !device || n_sites < 0 || (n_sites > 0 && !sites))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "dispatch table: bad arguments");
    for (int i = 0; i < n_sites; i++) {
        if (!sites[i].name)
            return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                "dispatch table %s: call site %d has "
                                "no name",
                                path, i);
        for (int b = 0; b < KILN_SEL_BUCKETS; b++)
            if (!sites[i].k[b])
                return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                    "dispatch table %s: call site '%s' has no kernel in bucket %d",
                                    path, sites[i].name, b);
    }
    char tmp[1024];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "dispatch table path too long: %s", path);
    json_t *root = json_object(), *jsites = json_array(), *sig = signature_json(s, device);
    bool ok = root && jsites && sig;
    ok = ok && !json_object_set_new(root, "schema", json_string(KILN_DISPATCH_SCHEMA));
    ok = ok && !json_object_set_new(root, "schema_version", json_integer(KILN_DISPATCH_VERSION));
    for (int i = 0; i < n_sites && ok; i++) {
        json_t *o = json_object(), *ks = json_array();
        ok = o && ks;
        ok = ok && !json_object_set_new(o, "name", json_string(sites[i].name));
        ok = ok && !json_object_set_new(o, "op", json_string(kiln_kop_name(sites[i].op)));
        ok = ok && !json_object_set_new(o, "instr", json_integer(sites[i].instr));
        for (int b = 0; b < KILN_SEL_BUCKETS && ok; b++)
            ok = !json_array_append_new(ks, json_string(sites[i].k[b]->spec.id));
        if (ok) {
            ok = !json_object_set_new(o, "kernels", ks);
            ks = NULL;
        }
        if (ok) {
            ok = !json_array_append_new(jsites, o);
            o = NULL;
        }
        json_decref(ks);
        json_decref(o);
    }
    if (ok) {
        ok = !json_object_set_new(root, "signature", sig);
        sig = NULL;
    }
    if (ok) {
        ok = !json_object_set_new(root, "sites", jsites);
        jsites = NULL;
    }
    json_decref(sig);
    json_decref(jsites);
    if (!ok) {
        json_decref(root);
        return kiln_err_set(err, KILN_ERR_NOMEM, "dispatch table %s: out of memory (%d sites)",
                            path, n_sites);
    }
    int rc = json_dump_file(root, tmp, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(root);
    if (rc) {
        remove(tmp);
        return kiln_err_set(err, KILN_ERR_IO, "writing dispatch table %s failed", tmp);
    }
    if (rename(tmp, path)) {
        kiln_status st = kiln_err_errno(err, errno, "dispatch table: renaming %s to %s", tmp, path);
        remove(tmp);
        return st;
    }
    return KILN_OK;
}

/* ---- lookup ---- */

struct kiln_baked {
    json_t *root;
    json_t *by_name; /* site name -> kernels array (borrowed from root) */
    char path[512];
};

kiln_status kiln_baked_open(const char *path, const kiln_selector *s, const kiln_sel_ctx *device,
                            kiln_baked **out, bool *usable, char *why, size_t why_size,
                            kiln_err *err) {
    *out = NULL;
    *usable = false;
    why[0] = 0;
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return kiln_err_set(err, KILN_ERR_FORMAT, "dispatch table %s:%d: %s", path, je.line,
                            je.text);
    const char *schema = json_string_value(json_object_get(root, "schema"));
    json_t *ver = json_object_get(root, "schema_version");
    json_t *sig = json_object_get(root, "signature");
    json_t *jsites = json_object_get(root, "sites");
    if (!schema || strcmp(schema, KILN_DISPATCH_SCHEMA) || !json_is_integer(ver) ||
        json_integer_value(ver) != KILN_DISPATCH_VERSION || !json_is_object(sig) ||
        !json_is_array(jsites)) {
        json_decref(root);
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "%s: not a kiln dispatch table (schema \"%s\" version %d)", path,
                            KILN_DISPATCH_SCHEMA, KILN_DISPATCH_VERSION);
    }
    kiln_baked *b = kiln_calloc(1, sizeof *b);
    json_t *by = json_object();
    if (!b || !by) {
        kiln_free(b);
        json_decref(by);
        json_decref(root);
        return kiln_err_set(err, KILN_ERR_NOMEM, "dispatch table: out of memory");
    }
    snprintf(b->path, sizeof b->path, "%s", path);
    b->root = root;
    b->by_name = by;
    size_t i;
    json_t *o;
    json_array_foreach(jsites, i, o) {
        const char *name = json_string_value(json_object_get(o, "name"));
        json_t *ks = json_object_get(o, "kernels");
        if (!name || !json_is_array(ks) || json_array_size(ks) != KILN_SEL_BUCKETS) {
            kiln_baked_free(b);
            return kiln_err_set(err, KILN_ERR_FORMAT, "%s: call site %zu is malformed", path, i);
        }
        json_object_set(by, name, ks);
    }
    json_t *mine = signature_json(s, device);
    if (json_equal(mine, sig)) {
        *usable = true;
    } else {
        const char *key;
        json_t *v;
        json_object_foreach(mine, key, v) {
            if (!json_equal(v, json_object_get(sig, key))) {
                char *x = kiln_adopt(
                    json_dumps(json_object_get(sig, key), JSON_ENCODE_ANY | JSON_COMPACT));
                char *y = kiln_adopt(json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT));
                snprintf(why, why_size, "signature differs: %s is %s in the table, %s here", key,
                         x ? x : "missing", y ? y : "?");
                kiln_free(x);
                kiln_free(y);
                break;
            }
        }
        if (!why[0]) snprintf(why, why_size, "signature differs");
    }
    json_decref(mine);
    *out = b;
    return KILN_OK;
}

const char *kiln_baked_kernel(const kiln_baked *b, const char *site, int bucket) {
    json_t *ks = json_object_get(b->by_name, site);
    return ks ? json_string_value(json_array_get(ks, (size_t)bucket)) : NULL;
}

const char *kiln_baked_path(const kiln_baked *b) {
    return b->path;
}

void kiln_baked_free(kiln_baked *b) {
    if (!b) return;
    json_decref(b->by_name);
    json_decref(b->root);
    kiln_free(b);
}
