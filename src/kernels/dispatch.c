/*
 * dispatch.c — building dispatch tables (selection for every call site x bucket) and the
 * circuit breaker that rebinds entries whose kernel failed at run time.
 */
#include "base/log.h"
#include "base/mem.h"
#include "kernels/select.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int64_t tok_lo[KILN_TOK_BUCKETS] = {1, 2, 9, 65, 513};
static const int64_t seq_lo[KILN_SEQ_BUCKETS] = {0, 513, 4097, 32769};

/* Highest bucket the plan can reach (limit 0 = unbounded). */
static int top_tok_bucket(int64_t max_tokens) {
    int b = 0;
    for (int i = 0; i < KILN_TOK_BUCKETS; i++)
        if (max_tokens <= 0 || tok_lo[i] <= max_tokens) b = i;
    return b;
}
static int top_seq_bucket(const kiln_sel_ctx *c) {
    if (c->op != KILN_KOP_ATTENTION) return 0;
    int b = 0;
    for (int i = 0; i < KILN_SEQ_BUCKETS; i++)
        if (c->seq_max <= 0 || seq_lo[i] <= c->seq_max) b = i;
    return b;
}

static kiln_status select_entry(kiln_selector *s, const kiln_sel_site *site, int tb, int sb,
                                kiln_dispatch_entry *e, bool *fell_back, kiln_err *err) {
    kiln_sel_ctx c = site->ctx;
    kiln_sel_ctx_set_bucket(&c, tb, sb, site->ctx.tokens_max, site->ctx.seq_max);
    kiln_sel_result res;
    kiln_status st = kiln_select(s, &c, 0, &res, err);
    if (st)
        return kiln_err_wrap(err, st, "call site '%s', tokens %s%s%s", site->name,
                             kiln_tok_bucket_name(tb),
                             c.op == KILN_KOP_ATTENTION ? ", context " : "",
                             c.op == KILN_KOP_ATTENTION ? kiln_seq_bucket_name(sb) : "");
    e->k = res.chosen;
    e->fn = res.chosen->spec.fn;
    e->workspace = res.chosen->spec.workspace ? res.chosen->spec.workspace(&c) : 0;
    e->score = (float)res.score;
    e->fallback = res.fallback;
    e->locked = res.locked;
    if (res.fallback) *fell_back = true;
    return KILN_OK;
}

static kiln_status fill_site(kiln_selector *s, kiln_dispatch *d, int i, kiln_err *err) {
    const kiln_sel_site *site = &d->sites[i];
    int ttop = top_tok_bucket(site->ctx.tokens_max), stop = top_seq_bucket(&site->ctx);
    bool fell_back = false;
    for (int tb = 0; tb < KILN_TOK_BUCKETS; tb++)
        for (int sb = 0; sb < KILN_SEQ_BUCKETS; sb++) {
            kiln_dispatch_entry *e =
                &d->e[(size_t)i * KILN_SEL_BUCKETS + (size_t)(tb * KILN_SEQ_BUCKETS + sb)];
            if (tb > ttop || sb > stop) continue;
            KILN_TRY(select_entry(s, site, tb, sb, e, &fell_back, err));
        }
    /* unreachable buckets copy the largest reachable one */
    for (int tb = 0; tb < KILN_TOK_BUCKETS; tb++)
        for (int sb = 0; sb < KILN_SEQ_BUCKETS; sb++) {
            if (tb <= ttop && sb <= stop) continue;
            int stb = tb > ttop ? ttop : tb, ssb = sb > stop ? stop : sb;
            d->e[(size_t)i * KILN_SEL_BUCKETS + (size_t)(tb * KILN_SEQ_BUCKETS + sb)] =
                d->e[(size_t)i * KILN_SEL_BUCKETS + (size_t)(stb * KILN_SEQ_BUCKETS + ssb)];
        }
    for (int b = 0; b < KILN_SEL_BUCKETS; b++) {
        size_t w = d->e[(size_t)i * KILN_SEL_BUCKETS + (size_t)b].workspace;
        if (w > d->max_workspace) d->max_workspace = w;
    }
    if (fell_back)
        KILN_WARN("call site '%s' (%s): no valid kernel for some shapes; using the reference "
                  "kernel (kiln explain shows why)",
                  site->name, kiln_kop_name(site->ctx.op));
    return KILN_OK;
}

kiln_status kiln_dispatch_build(kiln_selector *s, const kiln_sel_site *sites, int n_sites,
                                kiln_dispatch **out, kiln_err *err) {
    *out = NULL;
    if (n_sites < 0 || (n_sites > 0 && !sites))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "dispatch: bad site list");
    kiln_dispatch *d = kiln_calloc(1, sizeof *d);
    if (!d) return kiln_err_set(err, KILN_ERR_NOMEM, "dispatch: out of memory");
    size_t n = n_sites ? (size_t)n_sites : 1;
    d->sites = kiln_calloc(n, sizeof *d->sites);
    d->e = kiln_calloc(n * KILN_SEL_BUCKETS, sizeof *d->e);
    if (!d->sites || !d->e) {
        kiln_dispatch_free(d);
        return kiln_err_set(err, KILN_ERR_NOMEM, "dispatch: out of memory (%d sites)", n_sites);
    }
    d->n_sites = n_sites;
    if (n_sites) memcpy(d->sites, sites, sizeof *sites * (size_t)n_sites);
    for (int i = 0; i < n_sites; i++) {
        kiln_status st = fill_site(s, d, i, err);
        if (st) {
            kiln_dispatch_free(d);
            return st;
        }
    }
    d->state_hash = kiln_selector_state_hash(s);
    *out = d;
    return KILN_OK;
}

void kiln_dispatch_free(kiln_dispatch *d) {
    if (!d) return;
    kiln_free(d->sites);
    kiln_free(d->e);
    kiln_free(d);
}

kiln_status kiln_dispatch_fail(kiln_dispatch *d, kiln_selector *s, int site, int bucket,
                               const kiln_err *failure, kiln_err *err) {
    if (site < 0 || site >= d->n_sites || bucket < 0 || bucket >= KILN_SEL_BUCKETS)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "dispatch: no entry (%d, %d)", site, bucket);
    const kiln_reg_kernel *bad = kiln_dispatch_get(d, site, bucket)->k;
    KILN_WARN("kernel %s failed at call site '%s': %s; marking it unhealthy and rebinding",
              bad->spec.id, d->sites[site].name,
              failure && failure->msg[0] ? failure->msg : "(no message)");
    kiln_selector_mark_unhealthy(s, bad->index);
    for (int i = 0; i < d->n_sites; i++) {
        bool uses = false;
        for (int b = 0; b < KILN_SEL_BUCKETS; b++)
            if (kiln_dispatch_get(d, i, b)->k == bad) uses = true;
        if (!uses) continue;
        kiln_status st = fill_site(s, d, i, err);
        if (st) return kiln_err_wrap(err, st, "rebinding after %s failed", bad->spec.id);
    }
    d->rebinds++;
    d->state_hash = kiln_selector_state_hash(s);
    return KILN_OK;
}
