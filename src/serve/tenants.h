/*
 * tenants.h — API keys, tenants, quotas, the usage ledger and the server's metrics.
 *
 * kiln.yaml's `tenants:` list maps API keys (`Authorization: Bearer KEY`) to tenants:
 *
 *   tenants:
 *     - id: alice
 *       keys: [sk-alice-1, sk-alice-2]   # or key: sk-alice-1, or api_keys: [...]
 *       qos: interactive                 # interactive | standard (default) | batch
 *       max_concurrent: 8                # requests running or waiting (0: no limit)
 *       tokens_per_minute: 60000         # prompt + output tokens per minute (0: none)
 *       # the scheduler's quotas (issue #12's shape, docs/SCHED.md; 0: no limit), given
 *       # to kiln_sched_add_tenant as they are:
 *       max_slots: 4
 *       max_kv_blocks: 4096
 *       decode_tokens_per_s: 1000
 *       prefill_tokens_per_s: 100000
 *       max_context: 8192
 *       max_queued: 100                  # waiting requests (default: the server's --queue)
 *       isolation_group: team-a          # tenants of one group share prefix-cache blocks
 *
 * No tenants configured = an open server with one tenant "default" (no limits). Keys
 * are compared in constant time over every configured key (no early exit) and never
 * logged or copied into messages.
 *
 * Ownership: a kiln_srv_tenants owns its tenants; all counters are guarded by one
 * mutex inside it, so any thread may call anything here. Histograms (TTFT, inter-token,
 * end to end) are cumulative Prometheus buckets, kept per tenant and in total.
 */
#ifndef KILN_SERVE_TENANTS_H
#define KILN_SERVE_TENANTS_H

#include "base/status.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KILN_SRV_HIST_BUCKETS 16

typedef struct kiln_srv_hist {
    uint64_t count[KILN_SRV_HIST_BUCKETS + 1]; /* last: +Inf */
    double sum;
    uint64_t n;
} kiln_srv_hist;

typedef enum { KILN_HIST_TTFT = 0, KILN_HIST_ITL = 1, KILN_HIST_E2E = 2, KILN_HIST_N } kiln_hist_id;

typedef struct kiln_srv_ledger {
    uint64_t requests, tokens_in, tokens_out, rejected_quota, rejected_busy, errors, cancelled;
    kiln_srv_hist hist[KILN_HIST_N];
} kiln_srv_ledger;

typedef struct kiln_srv_tenant {
    char id[64];
    char **keys;
    size_t *key_len;
    int n_keys;
    char qos[16];
    int64_t max_concurrent, tokens_per_minute;
    /* the scheduler's quotas (kiln_tenant_config's fields; 0: no limit; "" no group) */
    int64_t max_slots, max_kv_blocks, max_context, max_queued;
    double decode_tokens_per_s, prefill_tokens_per_s;
    char isolation_group[64];
    /* guarded by the tenants' mutex */
    int64_t active;
    double window_start;
    int64_t window_tokens;
    kiln_srv_ledger led;
} kiln_srv_tenant;

typedef struct kiln_srv_tenants {
    kiln_srv_tenant *t;
    int n;
    bool open; /* no keys configured */
    pthread_mutex_t mu;
    /* requests by HTTP status (index: status - 100, 100..599) */
    uint64_t by_status[500];
    kiln_srv_ledger total;
} kiln_srv_tenants;

/* Loads `tenants:` from a kiln.yaml (path NULL: the open default). Errors name the
 * file, line and key. */
kiln_status kiln_srv_tenants_load(const char *path, kiln_srv_tenants *ts, kiln_err *err);
/* The same from n bytes of YAML text in memory (not NUL-terminated; name: what errors
 * call it). On failure ts is left empty (nothing to free). */
kiln_status kiln_srv_tenants_parse(const char *data, size_t n, const char *name,
                                   kiln_srv_tenants *ts, kiln_err *err);
void kiln_srv_tenants_free(kiln_srv_tenants *ts);

/* The tenant of an Authorization header value (may be NULL). Returns NULL for a
 * missing or unknown key on a keyed server; the default tenant on an open one. */
kiln_srv_tenant *kiln_srv_auth(kiln_srv_tenants *ts, const char *authorization);

/* Admission against the tenant's quotas: on success counts the request active and its
 * prompt tokens in the minute window. Returns 0, or the seconds a client should wait
 * (Retry-After) when over quota; *why names the limit. */
int kiln_srv_admit(kiln_srv_tenants *ts, kiln_srv_tenant *t, int64_t prompt_tokens,
                   const char **why);
/* A request of the tenant ended (admitted earlier). */
void kiln_srv_release(kiln_srv_tenants *ts, kiln_srv_tenant *t);

/* Ledger updates (t may be NULL: total only). */
void kiln_srv_count_status(kiln_srv_tenants *ts, kiln_srv_tenant *t, int http);
void kiln_srv_count_tokens(kiln_srv_tenants *ts, kiln_srv_tenant *t, int64_t in, int64_t out);
void kiln_srv_observe(kiln_srv_tenants *ts, kiln_srv_tenant *t, kiln_hist_id h, double seconds);
void kiln_srv_count_cancel(kiln_srv_tenants *ts, kiln_srv_tenant *t);

/* Appends Prometheus text for everything above to a malloc'ed buffer. `extra` (may be
 * NULL) is appended as is (gauges the caller owns: running, waiting, KV blocks...). */
char *kiln_srv_metrics_text(kiln_srv_tenants *ts, const char *extra);
/* The ledger of one tenant as a JSON text (malloc'ed). */
char *kiln_srv_usage_json(kiln_srv_tenants *ts, const kiln_srv_tenant *t);

#endif /* KILN_SERVE_TENANTS_H */
