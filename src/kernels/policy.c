/*
 * policy.c — kiln.yaml (libyaml document API: every node carries its line) and the
 * environment overrides. Precedence is documented in policy.h and docs/KERNELS.md.
 */
#include "kernels/policy.h"
#include "base/mem.h"

#include "base/hash.h"
#include "kernels/select.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <yaml.h>

bool kiln_isa_bit_from_name(const char *name, uint32_t *bit); /* descriptor.c */

void kiln_policy_init(kiln_policy *p) {
    memset(p, 0, sizeof *p);
    kiln_policy_rehash(p);
}

void kiln_policy_rehash(kiln_policy *p) {
    uint64_t saved = p->hash;
    char path[sizeof p->path];
    memcpy(path, p->path, sizeof path);
    p->hash = 0;
    memset(p->path, 0, sizeof p->path); /* where it came from does not change choices */
    /* unused bytes of the fixed arrays are kept zeroed by every writer, so hashing the
     * whole struct is stable */
    uint64_t h = kiln_hash64(p, sizeof *p, 0x706f6cu);
    memcpy(p->path, path, sizeof path);
    p->hash = h ? h : 1;
    (void)saved;
}

bool kiln_policy_name_matches(const char *pat, const kiln_kernel_spec *s) {
    if (!pat || !*pat) return false;
    size_t n = strlen(pat);
    if (pat[n - 1] == '*') return strncmp(s->id, pat, n - 1) == 0;
    return strcmp(pat, s->provider) == 0 || strcmp(pat, s->id) == 0;
}

/* ---- YAML ---- */

typedef struct pctx {
    yaml_document_t *doc;
    const char *path;
    kiln_err *err;
} pctx;

static int line_of(const yaml_node_t *n) {
    return (int)n->start_mark.line + 1;
}

static kiln_status perr(pctx *x, const yaml_node_t *n, const char *fmt, const char *a,
                        const char *b) {
    char m[512];
    snprintf(m, sizeof m, fmt, a ? a : "", b ? b : "");
    return kiln_err_set(x->err, KILN_ERR_FORMAT, "%s:%d: %s", x->path, n ? line_of(n) : 0, m);
}

static const char *scalar(const yaml_node_t *n) {
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static kiln_status get_bool(pctx *x, const yaml_node_t *n, const char *key, bool *out) {
    const char *v = scalar(n);
    if (v && (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on") || !strcmp(v, "1")))
        *out = true;
    else if (v && (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off") || !strcmp(v, "0")))
        *out = false;
    else
        return perr(x, n, "'%s' must be true or false", key, NULL);
    return KILN_OK;
}

static kiln_status get_name(pctx *x, const yaml_node_t *n, const char *key, char *out) {
    const char *v = scalar(n);
    if (!v || !*v) return perr(x, n, "'%s' must be a non-empty string", key, NULL);
    if (strlen(v) >= KILN_POLICY_NAME_MAX) return perr(x, n, "'%s': name too long", key, NULL);
    snprintf(out, KILN_POLICY_NAME_MAX, "%s", v);
    return KILN_OK;
}

static kiln_status get_list(pctx *x, const yaml_node_t *n, const char *key, kiln_name_list *l) {
    memset(l, 0, sizeof *l);
    if (n->type == YAML_SCALAR_NODE) { /* a single name */
        KILN_TRY(get_name(x, n, key, l->name[0]));
        l->n = 1;
        return KILN_OK;
    }
    if (n->type != YAML_SEQUENCE_NODE) return perr(x, n, "'%s' must be a list of names", key, NULL);
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        yaml_node_t *e = yaml_document_get_node(x->doc, *it);
        if (l->n >= KILN_POLICY_MAX_NAMES) return perr(x, e, "'%s': too many names", key, NULL);
        KILN_TRY(get_name(x, e, key, l->name[l->n]));
        l->n++;
    }
    return KILN_OK;
}

static kiln_status parse_cmp(pctx *x, const yaml_node_t *n, int32_t *lo, int32_t *hi) {
    const char *v = scalar(n);
    if (!v) return perr(x, n, "'sm' must be a string like \">=80\"", NULL, NULL);
    const char *num = v;
    int kind = 0; /* 0 ==, 1 >=, 2 <= */
    if (!strncmp(v, ">=", 2))
        kind = 1, num = v + 2;
    else if (!strncmp(v, "<=", 2))
        kind = 2, num = v + 2;
    char *end;
    errno = 0;
    long s = strtol(num, &end, 10);
    if (errno || end == num || *end || s <= 0 || s > 1000)
        return perr(x, n, "'sm': bad value '%s' (want N, >=N or <=N)", v, NULL);
    if (kind != 2) *lo = (int32_t)s;
    if (kind != 1) *hi = (int32_t)s;
    return KILN_OK;
}

static kiln_status parse_match(pctx *x, yaml_node_t *m, kiln_policy_rule *r) {
    if (m->type != YAML_MAPPING_NODE) return perr(x, m, "'match' must be a mapping", NULL, NULL);
    for (yaml_node_pair_t *pr = m->data.mapping.pairs.start; pr < m->data.mapping.pairs.top; pr++) {
        yaml_node_t *kn = yaml_document_get_node(x->doc, pr->key);
        yaml_node_t *vn = yaml_document_get_node(x->doc, pr->value);
        const char *k = scalar(kn), *v = scalar(vn);
        if (!k) return perr(x, kn, "match keys must be strings", NULL, NULL);
        if (!strcmp(k, "sm")) {
            KILN_TRY(parse_cmp(x, vn, &r->sm_min, &r->sm_max));
            continue;
        }
        if (!v) return perr(x, vn, "match '%s' must be a string", k, NULL);
        if (!strcmp(k, "op")) {
            kiln_kop op;
            if (!kiln_kop_from_name(v, &op)) return perr(x, vn, "unknown op '%s'", v, NULL);
            r->op = (int)op;
        } else if (!strcmp(k, "dtype")) {
            kiln_dtype dt;
            if (!kiln_dtype_from_name(v, &dt) || (unsigned)dt >= 64)
                return perr(x, vn, "unknown dtype '%s'", v, NULL);
            r->w_dtypes |= KILN_DT(dt);
        } else if (!strcmp(k, "backend")) {
            kiln_backend_id b;
            if (!kiln_backend_from_name(v, &b)) return perr(x, vn, "unknown backend '%s'", v, NULL);
            r->backend = (int)b;
        } else if (!strcmp(k, "tokens")) {
            int b;
            if (!kiln_tok_bucket_from_name(v, &b))
                return perr(x, vn, "unknown token bucket '%s' (1, 2-8, 9-64, 65-512, >512)", v,
                            NULL);
            r->tok_buckets |= 1u << b;
        } else if (!strcmp(k, "isa")) {
            uint32_t bit;
            if (!kiln_isa_bit_from_name(v, &bit)) return perr(x, vn, "unknown isa '%s'", v, NULL);
            r->isa |= bit;
        } else {
            return perr(x, kn, "unknown match key '%s'", k, NULL);
        }
    }
    return KILN_OK;
}

static kiln_status parse_rules(pctx *x, yaml_node_t *n, kiln_policy *p) {
    if (n->type != YAML_SEQUENCE_NODE) return perr(x, n, "'rules' must be a list", NULL, NULL);
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        yaml_node_t *rn = yaml_document_get_node(x->doc, *it);
        if (p->n_rules >= KILN_POLICY_MAX_RULES)
            return perr(x, rn, "too many rules (max 32)", NULL, NULL);
        if (rn->type != YAML_MAPPING_NODE)
            return perr(x, rn, "a rule must be a mapping", NULL, NULL);
        kiln_policy_rule *r = &p->rules[p->n_rules];
        memset(r, 0, sizeof *r);
        r->line = line_of(rn);
        r->op = -1;
        r->backend = -1;
        bool has_match = false, has_action = false;
        for (yaml_node_pair_t *pr = rn->data.mapping.pairs.start; pr < rn->data.mapping.pairs.top;
             pr++) {
            yaml_node_t *kn = yaml_document_get_node(x->doc, pr->key);
            yaml_node_t *vn = yaml_document_get_node(x->doc, pr->value);
            const char *k = scalar(kn);
            if (!k) return perr(x, kn, "rule keys must be strings", NULL, NULL);
            if (!strcmp(k, "match")) {
                KILN_TRY(parse_match(x, vn, r));
                has_match = true;
            } else if (!strcmp(k, "prefer")) {
                KILN_TRY(get_list(x, vn, k, &r->prefer));
                has_action = true;
            } else if (!strcmp(k, "avoid")) {
                KILN_TRY(get_list(x, vn, k, &r->avoid));
                has_action = true;
            } else if (!strcmp(k, "lock")) {
                KILN_TRY(get_name(x, vn, k, r->lock));
                has_action = true;
            } else {
                return perr(x, kn, "unknown rule key '%s' (match, prefer, avoid, lock)", k, NULL);
            }
        }
        if (!has_match) return perr(x, rn, "rule without 'match'", NULL, NULL);
        if (!has_action) return perr(x, rn, "rule without prefer, avoid or lock", NULL, NULL);
        p->n_rules++;
    }
    return KILN_OK;
}

static kiln_status parse_root(pctx *x, yaml_node_t *root, kiln_policy *p) {
    if (!root) return KILN_OK; /* empty file */
    if (root->type != YAML_MAPPING_NODE)
        return perr(x, root, "the policy must be a mapping of keys", NULL, NULL);
    for (yaml_node_pair_t *pr = root->data.mapping.pairs.start; pr < root->data.mapping.pairs.top;
         pr++) {
        yaml_node_t *kn = yaml_document_get_node(x->doc, pr->key);
        yaml_node_t *vn = yaml_document_get_node(x->doc, pr->value);
        const char *k = scalar(kn);
        if (!k) return perr(x, kn, "keys must be strings", NULL, NULL);
        for (yaml_node_pair_t *q = root->data.mapping.pairs.start; q < pr; q++)
            if (scalar(yaml_document_get_node(x->doc, q->key)) &&
                !strcmp(scalar(yaml_document_get_node(x->doc, q->key)), k))
                return perr(x, kn, "duplicate key '%s'", k, NULL);
        if (!strcmp(k, "version")) {
            const char *v = scalar(vn);
            if (!v || strcmp(v, "1") != 0)
                return perr(x, vn, "unsupported version '%s' (this kiln reads version 1)", v, NULL);
        } else if (!strcmp(k, "strict")) {
            KILN_TRY(get_bool(x, vn, k, &p->strict));
        } else if (!strcmp(k, "deterministic")) {
            KILN_TRY(get_bool(x, vn, k, &p->deterministic));
        } else if (!strcmp(k, "reference_only")) {
            KILN_TRY(get_bool(x, vn, k, &p->reference_only));
        } else if (!strcmp(k, "memory_headroom_mb")) {
            const char *v = scalar(vn);
            char *end;
            errno = 0;
            unsigned long long mb = v ? strtoull(v, &end, 10) : 0;
            if (!v || !*v || errno || *end || v[0] == '-' || mb > (1ull << 30))
                return perr(x, vn, "'memory_headroom_mb' must be a number of MiB", NULL, NULL);
            p->headroom_bytes = (uint64_t)mb << 20;
        } else if (!strcmp(k, "locks")) {
            if (vn->type != YAML_MAPPING_NODE)
                return perr(x, vn, "'locks' must map op names to kernel ids", NULL, NULL);
            for (yaml_node_pair_t *q = vn->data.mapping.pairs.start; q < vn->data.mapping.pairs.top;
                 q++) {
                yaml_node_t *on = yaml_document_get_node(x->doc, q->key);
                yaml_node_t *idn = yaml_document_get_node(x->doc, q->value);
                kiln_kop op;
                if (!scalar(on) || !kiln_kop_from_name(scalar(on), &op))
                    return perr(x, on, "locks: unknown op '%s'", scalar(on), NULL);
                KILN_TRY(get_name(x, idn, "locks", p->locks[op]));
                p->lock_src[op] = KILN_POLICY_SRC_FILE;
            }
        } else if (!strcmp(k, "prefer")) {
            KILN_TRY(get_list(x, vn, k, &p->prefer));
        } else if (!strcmp(k, "avoid")) {
            KILN_TRY(get_list(x, vn, k, &p->avoid));
        } else if (!strcmp(k, "rules")) {
            KILN_TRY(parse_rules(x, vn, p));
        } else if (!strcmp(k, "tenants")) {
            /* the scheduler's part of kiln.yaml: src/sched/tenants.c reads it */
        } else {
            return perr(x, kn, "unknown key '%s'", k, NULL);
        }
    }
    return KILN_OK;
}

kiln_status kiln_policy_parse(kiln_policy *out, const char *text, size_t len, const char *path,
                              kiln_err *err) {
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser))
        return kiln_err_set(err, KILN_ERR_NOMEM, "%s: yaml parser init failed", path);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        kiln_status st = kiln_err_set(err, KILN_ERR_FORMAT, "%s:%d: YAML syntax error: %s", path,
                                      (int)parser.problem_mark.line + 1,
                                      parser.problem ? parser.problem : "malformed");
        yaml_parser_delete(&parser);
        return st;
    }
    kiln_policy *p = kiln_malloc(sizeof *p);
    if (!p) {
        yaml_document_delete(&doc);
        yaml_parser_delete(&parser);
        return kiln_err_set(err, KILN_ERR_NOMEM, "%s: out of memory", path);
    }
    *p = *out;
    pctx x = {.doc = &doc, .path = path, .err = err};
    kiln_status st = parse_root(&x, yaml_document_get_root_node(&doc), p);
    if (!st) {
        snprintf(p->path, sizeof p->path, "%s", path);
        kiln_policy_rehash(p);
        *out = *p;
    }
    kiln_free(p);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return st;
}

kiln_status kiln_policy_load_file(kiln_policy *p, const char *path, kiln_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_err_errno(err, errno, "policy %s", path);
    char *buf = kiln_malloc(1 << 20);
    if (!buf) {
        fclose(f);
        return kiln_err_set(err, KILN_ERR_NOMEM, "policy %s: out of memory", path);
    }
    size_t n = fread(buf, 1, (1 << 20), f);
    bool big = n == (1 << 20), bad = ferror(f);
    fclose(f);
    kiln_status st;
    if (bad)
        st = kiln_err_set(err, KILN_ERR_IO, "policy %s: read failed", path);
    else if (big)
        st = kiln_err_set(err, KILN_ERR_RANGE, "policy %s: larger than 1 MiB", path);
    else
        st = kiln_policy_parse(p, buf, n, path, err);
    kiln_free(buf);
    return st;
}

/* ---- environment ---- */

static kiln_status env_bool(const char *name, const char *v, bool *out, kiln_err *err) {
    if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"))
        *out = true;
    else if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no"))
        *out = false;
    else
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "%s=%s: expected 0 or 1", name, v);
    return KILN_OK;
}

static kiln_status env_list(const char *name, const char *v, kiln_name_list *l, kiln_err *err) {
    memset(l, 0, sizeof *l);
    const char *s = v;
    while (*s) {
        const char *e = s + strcspn(s, ", ");
        size_t len = (size_t)(e - s);
        if (len) {
            if (l->n >= KILN_POLICY_MAX_NAMES || len >= KILN_POLICY_NAME_MAX)
                return kiln_err_set(err, KILN_ERR_INVALID_ARG, "%s: too many or too long names",
                                    name);
            memcpy(l->name[l->n], s, len);
            l->n++;
        }
        s = *e ? e + 1 : e;
    }
    return KILN_OK;
}

kiln_status kiln_policy_apply_env_with(kiln_policy *p, const char *(*get)(const char *),
                                       kiln_err *err) {
    kiln_policy q = *p;
    const char *v;
    for (int op = 0; op < KILN_KOP_COUNT; op++) {
        char name[64];
        snprintf(name, sizeof name, "KILN_LOCK_%s", kiln_kop_name((kiln_kop)op));
        for (char *c = name; *c; c++)
            if (*c >= 'a' && *c <= 'z') *c = (char)(*c - 'a' + 'A');
        if ((v = get(name)) && *v) {
            if (strlen(v) >= KILN_POLICY_NAME_MAX)
                return kiln_err_set(err, KILN_ERR_INVALID_ARG, "%s: name too long", name);
            memset(q.locks[op], 0, sizeof q.locks[op]);
            snprintf(q.locks[op], sizeof q.locks[op], "%s", v);
            q.lock_src[op] = KILN_POLICY_SRC_ENV;
        }
    }
    if ((v = get("KILN_PREFER"))) KILN_TRY(env_list("KILN_PREFER", v, &q.prefer, err));
    if ((v = get("KILN_AVOID"))) KILN_TRY(env_list("KILN_AVOID", v, &q.avoid, err));
    if ((v = get("KILN_DETERMINISTIC")) && *v)
        KILN_TRY(env_bool("KILN_DETERMINISTIC", v, &q.deterministic, err));
    if ((v = get("KILN_STRICT")) && *v) KILN_TRY(env_bool("KILN_STRICT", v, &q.strict, err));
    if ((v = get("KILN_REFERENCE_ONLY")) && *v)
        KILN_TRY(env_bool("KILN_REFERENCE_ONLY", v, &q.reference_only, err));
    kiln_policy_rehash(&q);
    *p = q;
    return KILN_OK;
}

static const char *real_getenv(const char *name) {
    return getenv(name);
}

kiln_status kiln_policy_apply_env(kiln_policy *p, kiln_err *err) {
    return kiln_policy_apply_env_with(p, real_getenv, err);
}

kiln_status kiln_policy_resolve(kiln_policy *p, const char *cli_path, kiln_err *err) {
    kiln_policy_init(p);
    const char *path = cli_path;
    if (!path || !*path) path = getenv("KILN_POLICY");
    if (path && *path) {
        KILN_TRY(kiln_policy_load_file(p, path, err));
    } else {
        char def[512];
        const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
        int w = xdg && *xdg
                    ? snprintf(def, sizeof def, "%s/kiln/kiln.yaml", xdg)
                    : snprintf(def, sizeof def, "%s/.config/kiln/kiln.yaml", home ? home : ".");
        struct stat st;
        if (w > 0 && (size_t)w < sizeof def && stat(def, &st) == 0)
            KILN_TRY(kiln_policy_load_file(p, def, err));
    }
    return kiln_policy_apply_env(p, err);
}
