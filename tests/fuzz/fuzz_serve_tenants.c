/* fuzz_serve_tenants.c — libFuzzer target for the server's reading of kiln.yaml's
 * `tenants:` list (serve/tenants.c, libyaml: ids, API keys, QoS, the server's and the
 * scheduler's quotas), which `kiln serve --config` runs on a user's file. fuzz_tenants
 * covers the scheduler's own parser (sched/tenants.c); this one the server's. An
 * accepted list is then used as the server uses it: every configured key must
 * authenticate (a `Bearer KEY` header) to a tenant that holds it, an unknown key to none;
 * the usage JSON of every tenant and the Prometheus text (ids in labels) are rendered.
 * Rejections are expected. Crashes, leaks, hangs, sanitizer reports and a broken key
 * lookup (abort) are bugs. */
#include "base/mem.h"
#include "base/status.h"
#include "serve/tenants.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* key held by tenant t? */
static int holds(const kiln_srv_tenant *t, const char *k, size_t n) {
    for (int i = 0; i < t->n_keys; i++)
        if (t->key_len[i] == n && memcmp(t->keys[i], k, n) == 0) return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 256 * 1024) return 0;
    kiln_srv_tenants ts;
    kiln_err err;
    if (kiln_srv_tenants_parse((const char *)data, size, "kiln.yaml", &ts, &err) != KILN_OK)
        return 0;
    char hdr[512];
    for (int i = 0; i < ts.n; i++) {
        const kiln_srv_tenant *t = &ts.t[i];
        for (int k = 0; k < t->n_keys; k++) {
            /* a header carries the key as a C string after "Bearer " and its spaces */
            const char *key = t->keys[k];
            size_t n = t->key_len[k];
            if (n == 0 || n + 8 > sizeof hdr || memchr(key, 0, n) || key[0] == ' ') continue;
            memcpy(hdr, "Bearer ", 7);
            memcpy(hdr + 7, key, n);
            hdr[7 + n] = 0;
            const kiln_srv_tenant *got = kiln_srv_auth(&ts, hdr);
            if (!got || !holds(got, key, n)) {
                fprintf(stderr, "fuzz_serve_tenants: tenant %d's key %d authenticates to %s\n", i,
                        k, got ? got->id : "nobody");
                abort();
            }
        }
        char *u = kiln_srv_usage_json(&ts, t);
        kiln_free(u);
    }
    /* a key no tenant holds (keys are non-empty: "" never matches) */
    if (!ts.open && kiln_srv_auth(&ts, "Bearer ") != NULL) {
        fprintf(stderr, "fuzz_serve_tenants: an empty key authenticates\n");
        abort();
    }
    char *m = kiln_srv_metrics_text(&ts, NULL);
    kiln_free(m);
    kiln_srv_tenants_free(&ts);
    return 0;
}
