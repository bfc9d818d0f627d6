/* tenants.c — tenants from kiln.yaml, key lookup, quotas, ledger, Prometheus text. */
#include "serve/tenants.h"
#include "base/mem.h"
#include "base/utf8.h"

#include "base/timer.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* bucket upper bounds in seconds (shared by TTFT, inter-token and end-to-end) */
static const double bounds[KILN_SRV_HIST_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
static const char *const hist_name[KILN_HIST_N] = {
    "kiln_time_to_first_token_seconds", "kiln_inter_token_seconds", "kiln_request_seconds"};

static double now_s(void) {
    return (double)kiln_now_ns() * 1e-9;
}

static void tenant_free(kiln_srv_tenant *t) {
    for (int i = 0; i < t->n_keys; i++) {
        if (t->keys[i]) memset(t->keys[i], 0, t->key_len[i]);
        kiln_free(t->keys[i]);
    }
    kiln_free(t->keys);
    kiln_free(t->key_len);
}

/* Keys and ids are kiln_ascii_visible: 1 or more visible ASCII characters (0x21-0x7e), none
 * of them in a reject set. An API key as a
 * client sends it (`Authorization: Bearer KEY` skips the spaces after "Bearer" and a header
 * value cannot carry control bytes; an empty key let `Bearer ` with nothing after it in:
 * found by fuzz_serve_tenants), and a tenant id, which is a path segment
 * (`/v1/tenants/{id}/usage`) and a Prometheus label value printed as is (a newline or a
 * backslash broke the metrics text). */

static kiln_status add_key(kiln_srv_tenant *t, const char *k, size_t n, kiln_err *err) {
    char **nk = kiln_realloc(t->keys, (size_t)(t->n_keys + 1) * sizeof(char *));
    if (!nk) return kiln_err_set(err, KILN_ERR_NOMEM, "tenant keys");
    t->keys = nk;
    size_t *nl = kiln_realloc(t->key_len, (size_t)(t->n_keys + 1) * sizeof(size_t));
    if (!nl) return kiln_err_set(err, KILN_ERR_NOMEM, "tenant keys");
    t->key_len = nl;
    t->keys[t->n_keys] = kiln_strndup(k, n);
    if (!t->keys[t->n_keys]) return kiln_err_set(err, KILN_ERR_NOMEM, "tenant keys");
    t->key_len[t->n_keys++] = n;
    return KILN_OK;
}

static kiln_status yerr(kiln_err *err, const char *path, yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A key node of an entry: a non-empty scalar a client can send (the error names the file
 * and line, never the key). */
static kiln_status take_key(const char *path, yaml_node_t *n, kiln_srv_tenant *t, kiln_err *err) {
    if (n->type != YAML_SCALAR_NODE) return yerr(err, path, n, "tenants: keys must be strings");
    if (!kiln_ascii_visible((const char *)n->data.scalar.value, n->data.scalar.length, ""))
        return yerr(err, path, n,
                    "tenants: a key must be 1 or more visible ASCII characters (no spaces or "
                    "control bytes)");
    return add_key(t, (const char *)n->data.scalar.value, n->data.scalar.length, err);
}

static const char *scalar(yaml_document_t *d, yaml_node_t *n) {
    (void)d;
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static kiln_status yerr(kiln_err *err, const char *path, yaml_node_t *n, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return kiln_err_set(err, KILN_ERR_FORMAT, "%s:%zu: %s", path,
                        n ? (size_t)n->start_mark.line + 1 : (size_t)0, msg);
}

static kiln_status parse_int(const char *path, yaml_node_t *n, const char *key, int64_t *out,
                             kiln_err *err) {
    const char *s = scalar(NULL, n);
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < 0)
        return yerr(err, path, n, "tenants: '%s' must be a non-negative integer", key);
    *out = v;
    return KILN_OK;
}

/* A non-negative integer at most max. */
static kiln_status parse_int_max(const char *path, yaml_node_t *n, const char *key, int64_t max,
                                 int64_t *out, kiln_err *err) {
    KILN_TRY(parse_int(path, n, key, out, err));
    if (*out > max)
        return yerr(err, path, n, "tenants: '%s' must be at most %lld", key, (long long)max);
    return KILN_OK;
}

/* A finite non-negative number (tokens per second). */
static kiln_status parse_rate(const char *path, yaml_node_t *n, const char *key, double *out,
                              kiln_err *err) {
    const char *s = scalar(NULL, n);
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || errno || !(v >= 0) || v > 1e15)
        return yerr(err, path, n, "tenants: '%s' must be a non-negative number", key);
    *out = v;
    return KILN_OK;
}

static kiln_status parse_tenant(const char *path, yaml_document_t *d, yaml_node_t *tn,
                                kiln_srv_tenant *t, kiln_err *err) {
    if (tn->type != YAML_MAPPING_NODE)
        return yerr(err, path, tn, "tenants: each entry must be a mapping (id, keys, ...)");
    snprintf(t->qos, sizeof(t->qos), "standard");
    for (yaml_node_pair_t *p = tn->data.mapping.pairs.start; p < tn->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(d, p->key);
        yaml_node_t *vn = yaml_document_get_node(d, p->value);
        const char *k = scalar(d, kn);
        if (!k) return yerr(err, path, kn, "tenants: keys of an entry must be scalars");
        if (!strcmp(k, "id")) {
            const char *v = scalar(d, vn);
            if (!v || vn->data.scalar.length >= sizeof(t->id) ||
                !kiln_ascii_visible(v, vn->data.scalar.length, "/\"\\"))
                return yerr(err, path, vn,
                            "tenants: 'id' must be 1..63 visible ASCII characters other than "
                            "'/', '\"' and '\\'");
            snprintf(t->id, sizeof(t->id), "%s", v);
        } else if (!strcmp(k, "key") || !strcmp(k, "keys") || !strcmp(k, "api_keys")) {
            if (vn->type == YAML_SCALAR_NODE) {
                KILN_TRY(take_key(path, vn, t, err));
            } else if (vn->type == YAML_SEQUENCE_NODE) {
                for (yaml_node_item_t *it = vn->data.sequence.items.start;
                     it < vn->data.sequence.items.top; it++) {
                    yaml_node_t *s = yaml_document_get_node(d, *it);
                    KILN_TRY(take_key(path, s ? s : vn, t, err));
                }
            } else {
                return yerr(err, path, vn, "tenants: 'keys' must be a string or a list");
            }
        } else if (!strcmp(k, "qos")) {
            const char *v = scalar(d, vn);
            if (!v || (strcmp(v, "interactive") && strcmp(v, "standard") && strcmp(v, "batch")))
                return yerr(err, path, vn, "tenants: 'qos' must be interactive, standard or batch");
            snprintf(t->qos, sizeof(t->qos), "%s", v);
        } else if (!strcmp(k, "max_concurrent")) {
            KILN_TRY(parse_int(path, vn, k, &t->max_concurrent, err));
        } else if (!strcmp(k, "tokens_per_minute")) {
            KILN_TRY(parse_int(path, vn, k, &t->tokens_per_minute, err));
        } else if (!strcmp(k, "max_slots")) {
            KILN_TRY(parse_int_max(path, vn, k, INT32_MAX, &t->max_slots, err));
        } else if (!strcmp(k, "max_kv_blocks")) {
            KILN_TRY(parse_int(path, vn, k, &t->max_kv_blocks, err));
        } else if (!strcmp(k, "max_context")) {
            KILN_TRY(parse_int_max(path, vn, k, INT32_MAX, &t->max_context, err));
        } else if (!strcmp(k, "max_queued")) {
            KILN_TRY(parse_int_max(path, vn, k, INT32_MAX, &t->max_queued, err));
        } else if (!strcmp(k, "decode_tokens_per_s")) {
            KILN_TRY(parse_rate(path, vn, k, &t->decode_tokens_per_s, err));
        } else if (!strcmp(k, "prefill_tokens_per_s")) {
            KILN_TRY(parse_rate(path, vn, k, &t->prefill_tokens_per_s, err));
        } else if (!strcmp(k, "isolation_group")) {
            const char *v = scalar(d, vn);
            if (!v || !*v || strlen(v) >= sizeof(t->isolation_group))
                return yerr(err, path, vn,
                            "tenants: 'isolation_group' must be a string of 1..63 characters");
            snprintf(t->isolation_group, sizeof(t->isolation_group), "%s", v);
        } else {
            return yerr(err, path, kn,
                        "tenants: unknown key '%s' (id, keys / api_keys, qos, max_concurrent, "
                        "tokens_per_minute, max_slots, max_kv_blocks, decode_tokens_per_s, "
                        "prefill_tokens_per_s, max_context, max_queued, isolation_group)",
                        k);
        }
    }
    if (!t->id[0]) return yerr(err, path, tn, "tenants: an entry has no 'id'");
    if (t->n_keys == 0) return yerr(err, path, tn, "tenants: tenant '%s' has no keys", t->id);
    return KILN_OK;
}

static kiln_status add_default(kiln_srv_tenants *ts, kiln_err *err) {
    ts->t = kiln_calloc(1, sizeof(kiln_srv_tenant));
    if (!ts->t) return kiln_err_set(err, KILN_ERR_NOMEM, "tenants");
    ts->n = 1;
    ts->open = true;
    snprintf(ts->t[0].id, sizeof(ts->t[0].id), "default");
    snprintf(ts->t[0].qos, sizeof(ts->t[0].qos), "standard");
    return KILN_OK;
}

/* The document of p (input set by the caller) -> ts; ts->mu is initialized by the caller
 * and destroyed here on failure (kiln_srv_tenants_free). */
static kiln_status load_doc(yaml_parser_t *p, const char *path, kiln_srv_tenants *ts,
                            kiln_err *err) {
    yaml_document_t d;
    kiln_status st = KILN_OK;
    if (!yaml_parser_load(p, &d)) {
        st = kiln_err_set(err, KILN_ERR_FORMAT, "%s:%zu: %s", path, p->problem_mark.line + 1,
                          p->problem ? p->problem : "YAML error");
        kiln_srv_tenants_free(ts);
        return st;
    }
    yaml_node_t *root = yaml_document_get_root_node(&d);
    yaml_node_t *list = NULL;
    if (root && root->type == YAML_MAPPING_NODE) {
        for (yaml_node_pair_t *pr = root->data.mapping.pairs.start;
             pr < root->data.mapping.pairs.top; pr++) {
            const char *k = scalar(&d, yaml_document_get_node(&d, pr->key));
            if (k && !strcmp(k, "tenants")) list = yaml_document_get_node(&d, pr->value);
        }
    } else if (root) {
        st = yerr(err, path, root, "the top level must be a mapping");
    }
    if (!st && list && list->type != YAML_SEQUENCE_NODE)
        st = yerr(err, path, list, "'tenants' must be a list of {id, keys, ...}");
    size_t n =
        !st && list ? (size_t)(list->data.sequence.items.top - list->data.sequence.items.start) : 0;
    if (n) { /* `tenants: []` is the open default below (allocated there) */
        ts->t = kiln_calloc(n, sizeof(kiln_srv_tenant));
        if (!ts->t) st = kiln_err_set(err, KILN_ERR_NOMEM, "tenants");
        for (size_t i = 0; !st && i < n; i++) {
            yaml_node_t *tn = yaml_document_get_node(&d, list->data.sequence.items.start[i]);
            ts->n++;
            st = parse_tenant(path, &d, tn, &ts->t[i], err);
            for (size_t j = 0; !st && j < i; j++)
                if (!strcmp(ts->t[j].id, ts->t[i].id))
                    st = yerr(err, path, tn, "tenants: duplicate id '%s'", ts->t[i].id);
        }
    }
    /* a key configured twice (for two tenants, or twice for one) would authenticate as
     * whichever tenant kiln_srv_auth meets last: refused, as kiln_sched_add_tenant refuses
     * it (the message names the tenants, never the key) */
    for (int i = 0; !st && i < ts->n; i++)
        for (int k = 0; !st && k < ts->t[i].n_keys; k++)
            for (int j = i; !st && j < ts->n; j++)
                for (int q = j == i ? k + 1 : 0; !st && q < ts->t[j].n_keys; q++)
                    if (ts->t[i].key_len[k] == ts->t[j].key_len[q] &&
                        !memcmp(ts->t[i].keys[k], ts->t[j].keys[q], ts->t[i].key_len[k]))
                        st = kiln_err_set(err, KILN_ERR_FORMAT,
                                          "%s: tenants: a key of tenant '%s' is configured again "
                                          "for tenant '%s'",
                                          path, ts->t[i].id, ts->t[j].id);
    yaml_document_delete(&d);
    if (!st && ts->n == 0) st = add_default(ts, err);
    if (st) kiln_srv_tenants_free(ts);
    return st;
}

kiln_status kiln_srv_tenants_load(const char *path, kiln_srv_tenants *ts, kiln_err *err) {
    memset(ts, 0, sizeof(*ts));
    if (pthread_mutex_init(&ts->mu, NULL)) return kiln_err_set(err, KILN_ERR_INTERNAL, "mutex");
    if (!path) return add_default(ts, err);
    FILE *f = fopen(path, "rb");
    if (!f) {
        kiln_status st = kiln_err_errno(err, errno, "opening %s", path);
        pthread_mutex_destroy(&ts->mu);
        return st;
    }
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        fclose(f);
        pthread_mutex_destroy(&ts->mu);
        return kiln_err_set(err, KILN_ERR_NOMEM, "yaml parser");
    }
    yaml_parser_set_input_file(&p, f);
    kiln_status st = load_doc(&p, path, ts, err);
    yaml_parser_delete(&p);
    fclose(f);
    return st;
}

kiln_status kiln_srv_tenants_parse(const char *data, size_t n, const char *name,
                                   kiln_srv_tenants *ts, kiln_err *err) {
    memset(ts, 0, sizeof(*ts));
    if (!data && n) return kiln_err_set(err, KILN_ERR_INVALID_ARG, "tenants: no text");
    if (pthread_mutex_init(&ts->mu, NULL)) return kiln_err_set(err, KILN_ERR_INTERNAL, "mutex");
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        pthread_mutex_destroy(&ts->mu);
        return kiln_err_set(err, KILN_ERR_NOMEM, "yaml parser");
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)(data ? data : ""), n);
    kiln_status st = load_doc(&p, name ? name : "kiln.yaml", ts, err);
    yaml_parser_delete(&p);
    return st;
}

void kiln_srv_tenants_free(kiln_srv_tenants *ts) {
    for (int i = 0; i < ts->n; i++) tenant_free(&ts->t[i]);
    kiln_free(ts->t);
    pthread_mutex_destroy(&ts->mu);
    memset(ts, 0, sizeof(*ts));
}

/* Constant time in the key's content: every byte of every configured key is compared
 * (up to the longer of the two lengths), no early exit. */
static int ct_equal(const char *a, size_t na, const char *b, size_t nb) {
    size_t n = na > nb ? na : nb;
    unsigned diff = (unsigned)(na ^ nb);
    for (size_t i = 0; i < n; i++) {
        unsigned char x = i < na ? (unsigned char)a[i] : 0;
        unsigned char y = i < nb ? (unsigned char)b[i] : 0;
        diff |= (unsigned)(x ^ y);
    }
    return diff == 0;
}

kiln_srv_tenant *kiln_srv_auth(kiln_srv_tenants *ts, const char *auth) {
    if (ts->open) return &ts->t[0];
    if (!auth || strncasecmp(auth, "Bearer ", 7) != 0) return NULL;
    const char *key = auth + 7;
    while (*key == ' ') key++;
    size_t n = strlen(key);
    kiln_srv_tenant *found = NULL;
    for (int i = 0; i < ts->n; i++)
        for (int k = 0; k < ts->t[i].n_keys; k++) {
            int eq = ct_equal(key, n, ts->t[i].keys[k], ts->t[i].key_len[k]);
            /* no branch on the result inside the comparison; the assignment is cheap */
            if (eq) found = &ts->t[i];
        }
    return found;
}

int kiln_srv_admit(kiln_srv_tenants *ts, kiln_srv_tenant *t, int64_t prompt_tokens,
                   const char **why) {
    int retry = 0;
    pthread_mutex_lock(&ts->mu);
    double now = now_s();
    if (now - t->window_start >= 60) {
        t->window_start = now;
        t->window_tokens = 0;
    }
    if (t->max_concurrent > 0 && t->active >= t->max_concurrent) {
        retry = 1;
        *why = "max_concurrent";
    } else if (t->tokens_per_minute > 0 &&
               t->window_tokens + prompt_tokens > t->tokens_per_minute) {
        retry = (int)ceil(60 - (now - t->window_start));
        if (retry < 1) retry = 1;
        *why = "tokens_per_minute";
    } else {
        t->active++;
        t->window_tokens += prompt_tokens;
    }
    pthread_mutex_unlock(&ts->mu);
    return retry;
}

void kiln_srv_release(kiln_srv_tenants *ts, kiln_srv_tenant *t) {
    pthread_mutex_lock(&ts->mu);
    if (t->active > 0) t->active--;
    pthread_mutex_unlock(&ts->mu);
}

void kiln_srv_count_status(kiln_srv_tenants *ts, kiln_srv_tenant *t, int http) {
    pthread_mutex_lock(&ts->mu);
    if (http >= 100 && http < 600) ts->by_status[http - 100]++;
    kiln_srv_ledger *ls[2] = {&ts->total, t ? &t->led : NULL};
    for (int i = 0; i < 2; i++) {
        if (!ls[i]) continue;
        ls[i]->requests++;
        if (http == 429) ls[i]->rejected_quota++;
        if (http == 503) ls[i]->rejected_busy++;
        if (http >= 400 && http != 429 && http != 503) ls[i]->errors++;
    }
    pthread_mutex_unlock(&ts->mu);
}

void kiln_srv_count_tokens(kiln_srv_tenants *ts, kiln_srv_tenant *t, int64_t in, int64_t out) {
    pthread_mutex_lock(&ts->mu);
    ts->total.tokens_in += (uint64_t)in;
    ts->total.tokens_out += (uint64_t)out;
    if (t) {
        t->led.tokens_in += (uint64_t)in;
        t->led.tokens_out += (uint64_t)out;
        t->window_tokens += out;
    }
    pthread_mutex_unlock(&ts->mu);
}

void kiln_srv_count_cancel(kiln_srv_tenants *ts, kiln_srv_tenant *t) {
    pthread_mutex_lock(&ts->mu);
    ts->total.cancelled++;
    if (t) t->led.cancelled++;
    pthread_mutex_unlock(&ts->mu);
}

static void hist_add(kiln_srv_hist *h, double s) {
    int b = 0;
    while (b < KILN_SRV_HIST_BUCKETS && s > bounds[b]) b++;
    h->count[b]++;
    h->sum += s;
    h->n++;
}

void kiln_srv_observe(kiln_srv_tenants *ts, kiln_srv_tenant *t, kiln_hist_id h, double seconds) {
    pthread_mutex_lock(&ts->mu);
    hist_add(&ts->total.hist[h], seconds);
    if (t) hist_add(&t->led.hist[h], seconds);
    pthread_mutex_unlock(&ts->mu);
}

/* A percentile estimated from the buckets (upper bound of the bucket holding it). */
static double hist_pct(const kiln_srv_hist *h, double q) {
    if (!h->n) return 0;
    uint64_t want = (uint64_t)ceil(q * (double)h->n), acc = 0;
    for (int b = 0; b < KILN_SRV_HIST_BUCKETS; b++) {
        acc += h->count[b];
        if (acc >= want) return bounds[b];
    }
    return INFINITY;
}

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = (b->cap + (size_t)k + 1) * 2;
        char *q = kiln_realloc(b->p, nc);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
}

static void hist_text(sbuf *b, const char *name, const char *label, const kiln_srv_hist *h) {
    uint64_t acc = 0;
    for (int i = 0; i < KILN_SRV_HIST_BUCKETS; i++) {
        acc += h->count[i];
        sb_printf(b, "%s_bucket{%sle=\"%g\"} %llu\n", name, label, bounds[i],
                  (unsigned long long)acc);
    }
    acc += h->count[KILN_SRV_HIST_BUCKETS];
    sb_printf(b, "%s_bucket{%sle=\"+Inf\"} %llu\n", name, label, (unsigned long long)acc);
    char l2[160];
    snprintf(l2, sizeof(l2), "%.*s", label[0] ? (int)strlen(label) - 1 : 0, label);
    sb_printf(b, "%s_sum{%s} %.6f\n%s_count{%s} %llu\n", name, l2, h->sum, name, l2,
              (unsigned long long)h->n);
}

char *kiln_srv_metrics_text(kiln_srv_tenants *ts, const char *extra) {
    sbuf b = {0};
    pthread_mutex_lock(&ts->mu);
    sb_printf(&b, "# HELP kiln_http_requests_total HTTP requests answered, by status.\n"
                  "# TYPE kiln_http_requests_total counter\n");
    for (int s = 0; s < 500; s++)
        if (ts->by_status[s])
            sb_printf(&b, "kiln_http_requests_total{status=\"%d\"} %llu\n", s + 100,
                      (unsigned long long)ts->by_status[s]);
    static const char *const cn[] = {"requests",       "prompt_tokens", "completion_tokens",
                                     "rejected_quota", "rejected_busy", "cancelled"};
    for (int c = 0; c < 6; c++) {
        sb_printf(&b, "# TYPE kiln_tenant_%s_total counter\n", cn[c]);
        for (int i = 0; i < ts->n; i++) {
            const kiln_srv_ledger *l = &ts->t[i].led;
            uint64_t v[] = {l->requests,       l->tokens_in,     l->tokens_out,
                            l->rejected_quota, l->rejected_busy, l->cancelled};
            sb_printf(&b, "kiln_tenant_%s_total{tenant=\"%s\"} %llu\n", cn[c], ts->t[i].id,
                      (unsigned long long)v[c]);
        }
    }
    sb_printf(&b,
              "# TYPE kiln_prompt_tokens_total counter\nkiln_prompt_tokens_total %llu\n"
              "# TYPE kiln_completion_tokens_total counter\nkiln_completion_tokens_total "
              "%llu\n",
              (unsigned long long)ts->total.tokens_in, (unsigned long long)ts->total.tokens_out);
    sb_printf(&b, "# TYPE kiln_tenant_active_requests gauge\n");
    for (int i = 0; i < ts->n; i++)
        sb_printf(&b, "kiln_tenant_active_requests{tenant=\"%s\"} %lld\n", ts->t[i].id,
                  (long long)ts->t[i].active);
    for (int h = 0; h < KILN_HIST_N; h++) {
        sb_printf(&b, "# TYPE %s histogram\n", hist_name[h]);
        hist_text(&b, hist_name[h], "", &ts->total.hist[h]);
        for (int i = 0; i < ts->n; i++) {
            char label[96];
            snprintf(label, sizeof(label), "tenant=\"%s\",", ts->t[i].id);
            hist_text(&b, hist_name[h], label, &ts->t[i].led.hist[h]);
        }
    }
    pthread_mutex_unlock(&ts->mu);
    if (extra) sb_printf(&b, "%s", extra);
    if (b.oom) {
        kiln_free(b.p);
        return NULL;
    }
    return b.p;
}

char *kiln_srv_usage_json(kiln_srv_tenants *ts, const kiln_srv_tenant *t) {
    pthread_mutex_lock(&ts->mu);
    const kiln_srv_ledger *l = &t->led;
    json_t *o = json_pack(
        "{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:{s:f, s:f}, s:{s:f, s:f}}",
        "object", "tenant.usage", "id", t->id, "qos", t->qos, "requests", (json_int_t)l->requests,
        "prompt_tokens", (json_int_t)l->tokens_in, "completion_tokens", (json_int_t)l->tokens_out,
        "rejected_quota", (json_int_t)l->rejected_quota, "rejected_busy",
        (json_int_t)l->rejected_busy, "errors", (json_int_t)l->errors, "cancelled",
        (json_int_t)l->cancelled, "active", (json_int_t)t->active, "ttft_seconds", "p50",
        hist_pct(&l->hist[KILN_HIST_TTFT], 0.5), "p99", hist_pct(&l->hist[KILN_HIST_TTFT], 0.99),
        "inter_token_seconds", "p50", hist_pct(&l->hist[KILN_HIST_ITL], 0.5), "p99",
        hist_pct(&l->hist[KILN_HIST_ITL], 0.99));
    pthread_mutex_unlock(&ts->mu);
    char *s = o ? kiln_adopt(json_dumps(o, JSON_COMPACT)) : NULL;
    json_decref(o);
    return s;
}
