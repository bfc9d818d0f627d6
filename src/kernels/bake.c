/*
 * bake.c — saving and loading dispatch tables as JSON (dispatch.h).
 */
#include "kernels/dispatch.h"
#include "base/mem.h"

#include "base/cpu.h"
#include "base/log.h"

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

static void default_device(kiln_sel_ctx *c) {
    kiln_sel_ctx_init(c, KILN_KOP_MATMUL, KILN_BACKEND_CPU);
}

void kiln_dispatch_signature(const kiln_selector *s, const kiln_sel_ctx *device, char *buf,
                             size_t n) {
    json_t *sig = signature_json(s, device);
    char *txt = json_dumps(sig, JSON_COMPACT | JSON_SORT_KEYS);
    snprintf(buf, n, "%s", txt ? txt : "");
    kiln_free(txt);
    json_decref(sig);
}

kiln_status kiln_dispatch_save(const kiln_dispatch *d, const kiln_selector *s, const char *path,
                               kiln_err *err) {
    kiln_sel_ctx dev;
    if (d->n_sites)
        dev = d->sites[0].ctx;
    else
        default_device(&dev);
    json_t *root = json_object();
    json_object_set_new(root, "schema", json_string(KILN_DISPATCH_SCHEMA));
    json_object_set_new(root, "schema_version", json_integer(KILN_DISPATCH_VERSION));
    json_object_set_new(root, "signature", signature_json(s, &dev));
    json_t *sites = json_array();
    for (int i = 0; i < d->n_sites; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(d->sites[i].name));
        json_object_set_new(o, "op", json_string(kiln_kop_name(d->sites[i].ctx.op)));
        json_object_set_new(o, "instr", json_integer(d->sites[i].instr));
        json_t *ks = json_array();
        for (int b = 0; b < KILN_SEL_BUCKETS; b++)
            json_array_append_new(ks, json_string(kiln_dispatch_get(d, i, b)->k->spec.id));
        json_object_set_new(o, "kernels", ks);
        json_array_append_new(sites, o);
    }
    json_object_set_new(root, "sites", sites);
    int rc = json_dump_file(root, path, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(root);
    if (rc) return kiln_err_set(err, KILN_ERR_IO, "writing dispatch table %s failed", path);
    return KILN_OK;
}

/* Fills d from the file's sites; returns false with why when it cannot be used. */
static bool adopt(kiln_selector *s, json_t *jsites, kiln_dispatch *d, char *why, size_t n) {
    const kiln_registry *r = kiln_selector_registry(s);
    if ((int)json_array_size(jsites) != d->n_sites) {
        snprintf(why, n, "the table has %zu call sites, the plan %d", json_array_size(jsites),
                 d->n_sites);
        return false;
    }
    for (int i = 0; i < d->n_sites; i++) {
        json_t *o = json_array_get(jsites, (size_t)i);
        const char *name = json_string_value(json_object_get(o, "name"));
        const char *op = json_string_value(json_object_get(o, "op"));
        json_t *ks = json_object_get(o, "kernels");
        const kiln_sel_site *site = &d->sites[i];
        if (!name || strcmp(name, site->name) || !op || strcmp(op, kiln_kop_name(site->ctx.op))) {
            snprintf(why, n, "call site %d is '%s' (%s) in the table, '%s' (%s) in the plan", i,
                     name ? name : "?", op ? op : "?", site->name, kiln_kop_name(site->ctx.op));
            return false;
        }
        if (json_array_size(ks) != KILN_SEL_BUCKETS) {
            snprintf(why, n, "call site '%s': %zu buckets, expected %d", name, json_array_size(ks),
                     KILN_SEL_BUCKETS);
            return false;
        }
        for (int b = 0; b < KILN_SEL_BUCKETS; b++) {
            const char *id = json_string_value(json_array_get(ks, (size_t)b));
            const kiln_reg_kernel *k = id ? kiln_registry_find(r, id) : NULL;
            if (!k || k->spec.op != site->ctx.op) {
                snprintf(why, n, "call site '%s': kernel '%s' is not a %s kernel here", name,
                         id ? id : "?", kiln_kop_name(site->ctx.op));
                return false;
            }
            kiln_sel_ctx c = site->ctx;
            kiln_sel_ctx_set_bucket(&c, b / KILN_SEQ_BUCKETS, b % KILN_SEQ_BUCKETS,
                                    site->ctx.tokens_max, site->ctx.seq_max);
            uint32_t bad = kiln_select_check(s, k, &c) &
                           ~KILN_REASON_BIT(KILN_REASON_POLICY_AVOIDED); /* a lock may avoid */
            if (bad & KILN_REASONS_HARD) {
                char m[300];
                kiln_reasons_format(bad & KILN_REASONS_HARD, s, k, &c, m, sizeof m);
                snprintf(why, n, "call site '%s': %s cannot run here: %s", name, id, m);
                return false;
            }
            kiln_dispatch_entry *e = &d->e[(size_t)i * KILN_SEL_BUCKETS + (size_t)b];
            e->k = k;
            e->fn = k->spec.fn;
            e->workspace = k->spec.workspace ? k->spec.workspace(&c) : 0;
            if (e->workspace > d->max_workspace) d->max_workspace = e->workspace;
        }
    }
    return true;
}

kiln_status kiln_dispatch_load(kiln_selector *s, const kiln_sel_site *sites, int n_sites,
                               const char *path, kiln_dispatch **out, bool *baked, char *why,
                               size_t why_size, kiln_err *err) {
    *out = NULL;
    *baked = false;
    char whybuf[512];
    if (!why) why = whybuf, why_size = sizeof whybuf;
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
    kiln_sel_ctx dev;
    if (n_sites)
        dev = sites[0].ctx;
    else
        default_device(&dev);
    json_t *mine = signature_json(s, &dev);
    bool same = json_equal(mine, sig);
    if (!same) {
        const char *key;
        json_t *v;
        json_object_foreach(mine, key, v) {
            if (!json_equal(v, json_object_get(sig, key))) {
                char *a = json_dumps(json_object_get(sig, key), JSON_ENCODE_ANY | JSON_COMPACT);
                char *b = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
                snprintf(why, why_size, "signature differs: %s is %s in the table, %s here", key,
                         a ? a : "missing", b ? b : "?");
                kiln_free(a);
                kiln_free(b);
                break;
            }
        }
        if (!why[0]) snprintf(why, why_size, "signature differs");
    }
    json_decref(mine);
    kiln_dispatch *d = NULL;
    if (same) {
        size_t n = n_sites ? (size_t)n_sites : 1;
        d = kiln_calloc(1, sizeof *d);
        if (d) d->sites = kiln_calloc(n, sizeof *d->sites);
        if (d && d->sites) d->e = kiln_calloc(n * KILN_SEL_BUCKETS, sizeof *d->e);
        if (!d || !d->sites || !d->e) {
            kiln_dispatch_free(d);
            json_decref(root);
            return kiln_err_set(err, KILN_ERR_NOMEM, "dispatch: out of memory");
        }
        d->n_sites = n_sites;
        if (n_sites) memcpy(d->sites, sites, sizeof *sites * (size_t)n_sites);
        if (adopt(s, jsites, d, why, why_size)) {
            d->state_hash = kiln_selector_state_hash(s);
            *baked = true;
            *out = d;
            json_decref(root);
            return KILN_OK;
        }
        kiln_dispatch_free(d);
    }
    json_decref(root);
    KILN_WARN("dispatch table %s not used (%s); selecting kernels at run time", path, why);
    return kiln_dispatch_build(s, sites, n_sites, out, err);
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
                char *x = json_dumps(json_object_get(sig, key), JSON_ENCODE_ANY | JSON_COMPACT);
                char *y = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
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
