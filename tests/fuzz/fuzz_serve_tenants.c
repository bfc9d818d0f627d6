/* fuzz_serve_tenants.c — libFuzzer target for the server's reading of kiln.yaml's
 * `tenants:` list (serve/tenants.c, libyaml: ids, API keys, QoS, the server's and the
 * scheduler's quotas), which `kiln serve --config` runs on a user's file. fuzz_tenants
 * covers the scheduler's own parser (sched/tenants.c); this one the server's. An
 * accepted list is then used as the server uses it: every configured key must be visible
 * ASCII and authenticate (a `Bearer KEY` header) as its own tenant, an empty key as none;
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 256 * 1024) return 0;
    kiln_srv_tenants ts;
    kiln_err err;
    if (kiln_srv_tenants_parse((const char *)data, size, "kiln.yaml", &ts, &err) != KILN_OK)
        return 0;
    for (int i = 0; i < ts.n; i++) {
        const kiln_srv_tenant *t = &ts.t[i];
        /* an id prints as is into a URL path and a Prometheus label */
        for (const char *c = t->id; *c; c++)
            if (*c < 0x21 || *c > 0x7e || *c == '/' || *c == '"' || *c == '\\') abort();
        for (int k = 0; k < t->n_keys; k++) {
            /* an accepted key is 1+ visible ASCII characters, held by no other tenant, so
             * `Bearer KEY` must authenticate as exactly this tenant */
            const char *key = t->keys[k];
            size_t n = t->key_len[k];
            for (size_t c = 0; c < n; c++)
                if ((unsigned char)key[c] < 0x21 || (unsigned char)key[c] > 0x7e) abort();
            char *hdr = malloc(n + 8);
            if (!hdr || n == 0) abort();
            memcpy(hdr, "Bearer ", 7);
            memcpy(hdr + 7, key, n);
            hdr[7 + n] = 0;
            const kiln_srv_tenant *got = kiln_srv_auth(&ts, hdr);
            free(hdr);
            if (got != t) {
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
