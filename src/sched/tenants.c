/*
 * tenants.c — tenant configs: defaults, validation, and the `tenants:` key of kiln.yaml
 * (libyaml document API, so every error names its line). The kernel-policy keys of the
 * same file are read by src/kernels/policy.c and ignored here.
 */
#include "sched/sched.h"
#include "base/mem.h"
#include "base/utf8.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

int kiln_qos_parse(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "interactive")) return KILN_QOS_INTERACTIVE;
    if (!strcmp(s, "standard")) return KILN_QOS_STANDARD;
    if (!strcmp(s, "batch")) return KILN_QOS_BATCH;
    return -1;
}

const char *kiln_qos_name(kiln_qos q) {
    switch (q) {
    case KILN_QOS_INTERACTIVE:
        return "interactive";
    case KILN_QOS_STANDARD:
        return "standard";
    case KILN_QOS_BATCH:
        return "batch";
    default:
        return "?";
    }
}

void kiln_tenant_config_default(kiln_tenant_config *c) {
    memset(c, 0, sizeof(*c));
    c->qos = KILN_QOS_STANDARD;
}

/* ---- string arena of a kiln_tenant_list ---- */
typedef struct arena {
    char **p;
    int32_t n, cap;
} arena;

static char *arena_dup(arena *a, const char *s) {
    if (a->n == a->cap) {
        int32_t nc = a->cap ? a->cap * 2 : 32;
        char **q = kiln_realloc(a->p, (size_t)nc * sizeof(char *));
        if (!q) return NULL;
        a->p = q;
        a->cap = nc;
    }
    char *d = kiln_strdup(s);
    if (d) a->p[a->n++] = d;
    return d;
}

static void *arena_keep(arena *a, void *blk) {
    if (!blk) return NULL;
    if (a->n == a->cap) {
        int32_t nc = a->cap ? a->cap * 2 : 32;
        char **q = kiln_realloc(a->p, (size_t)nc * sizeof(char *));
        if (!q) {
            kiln_free(blk);
            return NULL;
        }
        a->p = q;
        a->cap = nc;
    }
    a->p[a->n++] = blk;
    return blk;
}

void kiln_tenant_list_free(kiln_tenant_list *l) {
    if (!l) return;
    arena *a = l->arena_;
    if (a) {
        for (int32_t i = 0; i < a->n; i++) kiln_free(a->p[i]);
        kiln_free(a->p);
        kiln_free(a);
    }
    kiln_free(l->items);
    memset(l, 0, sizeof(*l));
}

/* ---- YAML ---- */
typedef struct yctx {
    yaml_document_t *doc;
    const char *name;
    kiln_err *err;
    arena *a;
} yctx;

static int line_of(const yaml_node_t *n) {
    return n ? (int)n->start_mark.line + 1 : 0;
}

static const char *scalar(const yaml_node_t *n) {
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static kiln_status num(yctx *x, const yaml_node_t *n, const char *tid, const char *key, double max,
                       double *out) {
    const char *v = scalar(n);
    char *end = NULL;
    errno = 0;
    double d = v ? strtod(v, &end) : 0;
    if (!v || !*v || errno || *end || !isfinite(d))
        return kiln_err_set(x->err, KILN_ERR_FORMAT, "%s:%d: tenant '%s': '%s' must be a number",
                            x->name, line_of(n), tid, key);
    if (d < 0 || d > max)
        return kiln_err_set(x->err, KILN_ERR_RANGE,
                            "%s:%d: tenant '%s': '%s' is %s (allowed: 0 to %.0f)", x->name,
                            line_of(n), tid, key, v, max);
    *out = d;
    return KILN_OK;
}

static kiln_status parse_tenant(yctx *x, yaml_node_t *tn, kiln_tenant_config *c) {
    kiln_tenant_config_default(c);
    if (tn->type != YAML_MAPPING_NODE)
        return kiln_err_set(x->err, KILN_ERR_FORMAT, "%s:%d: each tenant must be a mapping",
                            x->name, line_of(tn));
    /* id first, for messages */
    const char *tid = "?";
    for (yaml_node_pair_t *pr = tn->data.mapping.pairs.start; pr < tn->data.mapping.pairs.top;
         pr++) {
        const char *k = scalar(yaml_document_get_node(x->doc, pr->key));
        if (k && !strcmp(k, "id")) {
            const char *v = scalar(yaml_document_get_node(x->doc, pr->value));
            if (!v || !*v)
                return kiln_err_set(x->err, KILN_ERR_FORMAT, "%s:%d: tenant 'id' must be a string",
                                    x->name, line_of(tn));
            tid = c->id = arena_dup(x->a, v);
            if (!c->id) return kiln_err_set(x->err, KILN_ERR_NOMEM, "tenants: out of memory");
        }
    }
    if (!c->id)
        return kiln_err_set(x->err, KILN_ERR_FORMAT, "%s:%d: a tenant without 'id'", x->name,
                            line_of(tn));
    for (yaml_node_pair_t *pr = tn->data.mapping.pairs.start; pr < tn->data.mapping.pairs.top;
         pr++) {
        yaml_node_t *kn = yaml_document_get_node(x->doc, pr->key);
        yaml_node_t *vn = yaml_document_get_node(x->doc, pr->value);
        const char *k = scalar(kn);
        if (!k)
            return kiln_err_set(x->err, KILN_ERR_FORMAT, "%s:%d: tenant '%s': keys must be strings",
                                x->name, line_of(kn), tid);
        for (yaml_node_pair_t *q = tn->data.mapping.pairs.start; q < pr; q++) {
            const char *k2 = scalar(yaml_document_get_node(x->doc, q->key));
            if (k2 && !strcmp(k2, k))
                return kiln_err_set(x->err, KILN_ERR_FORMAT,
                                    "%s:%d: tenant '%s': duplicate key '%s'", x->name, line_of(kn),
                                    tid, k);
        }
        double d = 0;
        if (!strcmp(k, "id")) continue;
        if (!strcmp(k, "api_keys")) {
            if (vn->type != YAML_SEQUENCE_NODE)
                return kiln_err_set(x->err, KILN_ERR_FORMAT,
                                    "%s:%d: tenant '%s': 'api_keys' must be a list of strings",
                                    x->name, line_of(vn), tid);
            int32_t n = (int32_t)(vn->data.sequence.items.top - vn->data.sequence.items.start);
            const char **keys =
                arena_keep(x->a, kiln_calloc((size_t)(n > 0 ? n : 1), sizeof(char *)));
            if (!keys) return kiln_err_set(x->err, KILN_ERR_NOMEM, "tenants: out of memory");
            for (int32_t i = 0; i < n; i++) {
                yaml_node_t *en = yaml_document_get_node(x->doc, vn->data.sequence.items.start[i]);
                const char *v = scalar(en);
                if (!v || !*v)
                    return kiln_err_set(x->err, KILN_ERR_FORMAT,
                                        "%s:%d: tenant '%s': api_keys[%d] must be a string",
                                        x->name, line_of(en), tid, (int)i);
                if (!kiln_ascii_visible(v, en->data.scalar.length, ""))
                    return kiln_err_set(x->err, KILN_ERR_FORMAT,
                                        "%s:%d: tenant '%s': api_keys[%d] must be visible ASCII "
                                        "(no spaces or control bytes)",
                                        x->name, line_of(en), tid, (int)i);
                keys[i] = arena_dup(x->a, v);
                if (!keys[i]) return kiln_err_set(x->err, KILN_ERR_NOMEM, "tenants: out of memory");
            }
            c->api_keys = keys;
            c->n_api_keys = n;
        } else if (!strcmp(k, "qos")) {
            int q = kiln_qos_parse(scalar(vn));
            if (q < 0)
                return kiln_err_set(x->err, KILN_ERR_FORMAT,
                                    "%s:%d: tenant '%s': qos '%s' is not interactive, standard or "
                                    "batch",
                                    x->name, line_of(vn), tid, scalar(vn) ? scalar(vn) : "");
            c->qos = (kiln_qos)q;
        } else if (!strcmp(k, "isolation_group")) {
            const char *v = scalar(vn);
            if (!v || !*v)
                return kiln_err_set(x->err, KILN_ERR_FORMAT,
                                    "%s:%d: tenant '%s': 'isolation_group' must be a string",
                                    x->name, line_of(vn), tid);
            c->isolation_group = arena_dup(x->a, v);
            if (!c->isolation_group)
                return kiln_err_set(x->err, KILN_ERR_NOMEM, "tenants: out of memory");
        } else if (!strcmp(k, "max_slots")) {
            KILN_TRY(num(x, vn, tid, k, 1e6, &d));
            c->max_slots = (int32_t)d;
        } else if (!strcmp(k, "max_kv_blocks")) {
            KILN_TRY(num(x, vn, tid, k, 1e12, &d));
            c->max_kv_blocks = (int64_t)d;
        } else if (!strcmp(k, "decode_tokens_per_s")) {
            KILN_TRY(num(x, vn, tid, k, 1e12, &c->decode_tokens_per_s));
        } else if (!strcmp(k, "prefill_tokens_per_s")) {
            KILN_TRY(num(x, vn, tid, k, 1e12, &c->prefill_tokens_per_s));
        } else if (!strcmp(k, "max_context")) {
            KILN_TRY(num(x, vn, tid, k, 1e9, &d));
            c->max_context = (int32_t)d;
        } else if (!strcmp(k, "max_queued")) {
            KILN_TRY(num(x, vn, tid, k, 1e9, &d));
            c->max_queued = (int32_t)d;
        } else {
            return kiln_err_set(x->err, KILN_ERR_FORMAT,
                                "%s:%d: tenant '%s': unknown key '%s' (known: id, api_keys, qos, "
                                "max_slots, max_kv_blocks, decode_tokens_per_s, "
                                "prefill_tokens_per_s, max_context, max_queued, isolation_group)",
                                x->name, line_of(kn), tid, k);
        }
    }
    return KILN_OK;
}

kiln_status kiln_tenants_parse_yaml(const char *text, size_t len, const char *name,
                                    kiln_tenant_list *out, kiln_err *err) {
    memset(out, 0, sizeof(*out));
    if (!name) name = "kiln.yaml";
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser))
        return kiln_err_set(err, KILN_ERR_NOMEM, "%s: yaml parser init failed", name);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        kiln_status st = kiln_err_set(err, KILN_ERR_FORMAT, "%s:%d: YAML syntax error: %s", name,
                                      (int)parser.problem_mark.line + 1,
                                      parser.problem ? parser.problem : "malformed");
        yaml_parser_delete(&parser);
        return st;
    }
    kiln_status st = KILN_OK;
    arena *a = kiln_calloc(1, sizeof(*a));
    out->arena_ = a;
    if (!a) st = kiln_err_set(err, KILN_ERR_NOMEM, "%s: out of memory", name);
    yctx x = {.doc = &doc, .name = name, .err = err, .a = a};
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    yaml_node_t *tl = NULL;
    if (!st && root && root->type != YAML_MAPPING_NODE)
        st = kiln_err_set(err, KILN_ERR_FORMAT, "%s:%d: the file must be a mapping of keys", name,
                          line_of(root));
    if (!st && root)
        for (yaml_node_pair_t *pr = root->data.mapping.pairs.start;
             pr < root->data.mapping.pairs.top; pr++) {
            const char *k = scalar(yaml_document_get_node(&doc, pr->key));
            if (k && !strcmp(k, "tenants")) tl = yaml_document_get_node(&doc, pr->value);
        }
    if (!st && tl) {
        if (tl->type == YAML_SCALAR_NODE && !*scalar(tl)) {
            /* `tenants:` with nothing: an empty list */
        } else if (tl->type != YAML_SEQUENCE_NODE) {
            st = kiln_err_set(err, KILN_ERR_FORMAT, "%s:%d: 'tenants' must be a list", name,
                              line_of(tl));
        } else {
            int32_t n = (int32_t)(tl->data.sequence.items.top - tl->data.sequence.items.start);
            out->items = kiln_calloc((size_t)(n > 0 ? n : 1), sizeof(kiln_tenant_config));
            if (!out->items) st = kiln_err_set(err, KILN_ERR_NOMEM, "%s: out of memory", name);
            for (int32_t i = 0; !st && i < n; i++) {
                yaml_node_t *tn = yaml_document_get_node(&doc, tl->data.sequence.items.start[i]);
                st = parse_tenant(&x, tn, &out->items[i]);
                for (int32_t j = 0; !st && j < i; j++)
                    if (!strcmp(out->items[j].id, out->items[i].id))
                        st = kiln_err_set(err, KILN_ERR_FORMAT, "%s:%d: duplicate tenant id '%s'",
                                          name, line_of(tn), out->items[i].id);
                out->n = i + 1;
            }
        }
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    if (st) kiln_tenant_list_free(out);
    return st;
}

kiln_status kiln_tenants_load_yaml(const char *path, kiln_tenant_list *out, kiln_err *err) {
    memset(out, 0, sizeof(*out));
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_err_errno(err, errno, "opening %s", path);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    kiln_status st = KILN_OK;
    for (;;) {
        if (len == cap) {
            if (cap > (64u << 20)) {
                st = kiln_err_set(err, KILN_ERR_RANGE, "%s: larger than 64 MiB", path);
                break;
            }
            size_t nc = cap ? cap * 2 : 4096;
            char *q = kiln_realloc(buf, nc);
            if (!q) {
                st = kiln_err_set(err, KILN_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            buf = q;
            cap = nc;
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (r == 0) {
            if (ferror(f)) st = kiln_err_errno(err, errno, "reading %s", path);
            break;
        }
    }
    fclose(f);
    if (!st) st = kiln_tenants_parse_yaml(buf ? buf : "", len, path, out, err);
    kiln_free(buf);
    return st;
}
