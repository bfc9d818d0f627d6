/*
 * kselect.c — call sites -> kernel selection (kselect.h).
 *
 * runtime_config is this file's one process-wide singleton: the three configuration
 * paths, guarded by a mutex and copied when a device's selector is built. Everything
 * else (policy, PerfDB table, selector, baked table, breaker marks) belongs to one
 * kiln_kselect, i.e. to one device, and is used by that device's thread only.
 */
#include "runtime/kselect.h"
#include "base/mem.h"

#include "base/cpu.h"
#include "base/log.h"
#include "kernels/dispatch.h"
#include "kernels/perfdb.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static struct {
    pthread_mutex_t mu;
    char policy_path[512], perfdb_path[512], dispatch_path[512];
} runtime_config = {.mu = PTHREAD_MUTEX_INITIALIZER};

struct kiln_kselect {
    char policy_path[512], perfdb_path[512], dispatch_path[512];
    char perf_key[512]; /* whose timings: kiln_device_perf_key */
    kiln_policy policy;
    kiln_perf_table *perf;
    kiln_selector *sel;
    kiln_baked *baked;
    bool baked_checked, baked_usable, baked_warned;
};

void kiln_kselect_free(kiln_kselect *ks) {
    if (!ks) return;
    kiln_selector_free(ks->sel);
    kiln_perf_table_free(ks->perf);
    kiln_baked_free(ks->baked);
    kiln_free(ks);
}

kiln_selector *kiln_kselect_selector(kiln_kselect *ks) {
    return ks->sel;
}

static kiln_status kselect_build(kiln_kselect *ks, kiln_err *err) {
    const kiln_registry *reg = kiln_registry_default();
    if (kiln_registry_default_error()[0])
        return kiln_err_set(err, KILN_ERR_INTERNAL, "kernel registry: %s",
                            kiln_registry_default_error());
    KILN_TRY(kiln_policy_resolve(&ks->policy, ks->policy_path[0] ? ks->policy_path : NULL, err));
    /* this machine's timings, when a PerfDB exists (binding never creates one) */
    char path[512];
    struct stat sb;
    if (ks->perfdb_path[0])
        snprintf(path, sizeof path, "%s", ks->perfdb_path);
    else if (kiln_perfdb_default_path(path, sizeof path, NULL))
        path[0] = 0;
    if (path[0] && stat(path, &sb) == 0) {
        kiln_perfdb *db;
        kiln_err e2;
        if (!kiln_perfdb_open(path, &db, &e2)) {
            if (kiln_perfdb_load_table(db, ks->perf_key, &ks->perf, &e2))
                KILN_WARN("PerfDB %s: %s (selecting without timings)", path, e2.msg);
            kiln_perfdb_close(db);
        } else {
            KILN_WARN("%s (selecting without timings)", e2.msg);
        }
    }
    return kiln_selector_new(reg, &ks->policy, ks->perf, &ks->sel, err);
}

void kiln_device_perf_key(const kiln_device *dev, char *out, size_t n) {
    char host[300];
    kiln_perfdb_host_device(host, sizeof host);
    if (!dev || !dev->be || dev->be->host_memory) {
        snprintf(out, n, "%s", host);
        return;
    }
    /* "cuda:1 NVIDIA H100 ..." -> "cuda:NVIDIA H100 ...": one key for every ordinal of
     * one model of GPU (a tensor-parallel group's devices share their timings) */
    const char *model = strchr(dev->name, ' ');
    snprintf(out, n, "%s|%s:%s", host, dev->be->name, model ? model + 1 : dev->name);
}

kiln_status kiln_kselect_new(kiln_kselect **out, const kiln_device *dev, kiln_err *err) {
    *out = NULL;
    kiln_kselect *ks = kiln_calloc(1, sizeof(*ks));
    if (!ks) return kiln_err_set(err, KILN_ERR_NOMEM, "kernel selector: out of memory");
    kiln_device_perf_key(dev, ks->perf_key, sizeof ks->perf_key);
    pthread_mutex_lock(&runtime_config.mu);
    memcpy(ks->policy_path, runtime_config.policy_path, sizeof ks->policy_path);
    memcpy(ks->perfdb_path, runtime_config.perfdb_path, sizeof ks->perfdb_path);
    memcpy(ks->dispatch_path, runtime_config.dispatch_path, sizeof ks->dispatch_path);
    pthread_mutex_unlock(&runtime_config.mu);
    kiln_status st = kselect_build(ks, err);
    if (st) {
        kiln_kselect_free(ks);
        return st;
    }
    *out = ks;
    return KILN_OK;
}

kiln_status kiln_runtime_selector_configure(const char *policy_path, const char *perfdb_path,
                                            const char *dispatch_path, kiln_err *err) {
    /* a named table must at least be readable: fail early, not at the first bind */
    if (dispatch_path && *dispatch_path) {
        FILE *f = fopen(dispatch_path, "rb");
        if (!f) return kiln_err_errno(err, errno, "dispatch table %s", dispatch_path);
        fclose(f);
    }
    pthread_mutex_lock(&runtime_config.mu);
    snprintf(runtime_config.policy_path, sizeof runtime_config.policy_path, "%s",
             policy_path ? policy_path : "");
    snprintf(runtime_config.perfdb_path, sizeof runtime_config.perfdb_path, "%s",
             perfdb_path ? perfdb_path : "");
    snprintf(runtime_config.dispatch_path, sizeof runtime_config.dispatch_path, "%s",
             dispatch_path ? dispatch_path : "");
    pthread_mutex_unlock(&runtime_config.mu);
    /* check the configuration by building a selector from it */
    kiln_kselect *ks;
    KILN_TRY(kiln_kselect_new(&ks, NULL, err));
    kiln_kselect_free(ks);
    return KILN_OK;
}

void kiln_callsite_ctx(const kiln_backend *be, const kiln_callsite *cs, kiln_sel_ctx *c) {
    kiln_backend_id b = KILN_BACKEND_REF;
    if (be && !kiln_backend_from_name(be->name, &b)) b = KILN_BACKEND_REF;
    kiln_sel_ctx_init(c, cs->op, b);
    if (be && be->compute_level) c->sm = be->compute_level();
    switch (cs->op) {
    case KILN_KOP_MATMUL:
        c->w_dtype = cs->w_dtype;
        c->act_dtype = cs->act_dtype; /* f32, or a q8 type under numerics "ggml" */
        break;
    case KILN_KOP_EMBED:
        c->w_dtype = cs->w_dtype;
        break;
    case KILN_KOP_RMS_NORM:
        c->w_dtype = KILN_DTYPE_F32;
        break;
    case KILN_KOP_KV_WRITE:
        c->kv_dtype = cs->kv_dtype;
        break;
    case KILN_KOP_ATTENTION:
        c->kv_dtype = cs->kv_dtype;
        c->act_dtype = cs->act_dtype; /* f16 under numerics "ggml" */
        break;
    case KILN_KOP_GLU:
        c->act_dtype = cs->act_dtype; /* f16 under numerics "ggml" */
        break;
    default:
        break;
    }
    c->n = cs->n;
    c->k = cs->k;
    c->head_dim = cs->head_dim;
    c->n_head = cs->n_head;
    c->n_kv_head = cs->n_kv_head;
    static const struct {
        uint32_t cs, feat;
    } fmap[] = {
        {KILN_CS_BIAS, KILN_KFEAT_BIAS},
        {KILN_CS_GQA, KILN_KFEAT_GQA},
        {KILN_CS_WINDOW, KILN_KFEAT_SLIDING_WINDOW},
        {KILN_CS_SOFTCAP, KILN_KFEAT_SOFTCAP},
        {KILN_CS_PAGED, KILN_KFEAT_PAGED_KV},
        {KILN_CS_CAUSAL, KILN_KFEAT_CAUSAL},
        {KILN_CS_YARN, KILN_KFEAT_ROPE_YARN},
        {KILN_CS_FREQ_FAC, KILN_KFEAT_ROPE_FREQS},
    };
    /* the features that concern each op (a description may carry its instruction's) */
    uint32_t relevant = 0;
    switch (cs->op) {
    case KILN_KOP_MATMUL:
        relevant = KILN_KFEAT_BIAS;
        break;
    case KILN_KOP_ATTENTION:
        relevant = KILN_KFEAT_GQA | KILN_KFEAT_SLIDING_WINDOW | KILN_KFEAT_SOFTCAP |
                   KILN_KFEAT_PAGED_KV | KILN_KFEAT_CAUSAL;
        break;
    case KILN_KOP_KV_WRITE:
        relevant = KILN_KFEAT_PAGED_KV;
        break;
    case KILN_KOP_ROPE:
        relevant = KILN_KFEAT_ROPE_YARN | KILN_KFEAT_ROPE_FREQS;
        break;
    default:
        break;
    }
    for (size_t i = 0; i < sizeof fmap / sizeof fmap[0]; i++)
        if (cs->features & fmap[i].cs) c->features |= fmap[i].feat & relevant;
    /* required conservatively (not in the call-site description) */
    if (cs->op == KILN_KOP_ROPE) c->features |= KILN_KFEAT_ROPE_NEOX | KILN_KFEAT_PARTIAL_ROT;
    if (cs->op == KILN_KOP_GLU) c->features |= KILN_KFEAT_GEGLU;
    if (cs->op == KILN_KOP_RMS_NORM) c->features |= KILN_KFEAT_RESIDUAL;
    int tb = cs->bucket < 0                   ? 0
             : cs->bucket >= KILN_TOK_BUCKETS ? KILN_TOK_BUCKETS - 1
                                              : cs->bucket;
    kiln_sel_ctx_set_bucket(c, tb, cs->op == KILN_KOP_ATTENTION ? KILN_SEQ_BUCKETS - 1 : 0,
                            cs->max_tokens > 0 ? cs->max_tokens : 0, 0);
}

int kiln_callsite_bucket_index(const kiln_callsite *cs) {
    kiln_sel_ctx c;
    kiln_callsite_ctx(NULL, cs, &c);
    return c.tok_bucket * KILN_SEQ_BUCKETS + c.seq_bucket;
}

kiln_status kiln_select_callsite(kiln_device *dev, const kiln_callsite *cs, kiln_kernel_fn *out,
                                 uint32_t *layout, const kiln_reg_kernel **kernel, kiln_err *err) {
    kiln_kselect *ks = dev->ks;
    kiln_selector *s = ks->sel;
    kiln_sel_ctx c;
    kiln_callsite_ctx(dev->be, cs, &c);
    /* the baked table is checked against the first bound call site's backend and device */
    if (ks->dispatch_path[0] && !ks->baked_checked) {
        char why[512];
        KILN_TRY(kiln_baked_open(ks->dispatch_path, s, &c, &ks->baked, &ks->baked_usable, why,
                                 sizeof why, err));
        ks->baked_checked = true;
        if (!ks->baked_usable)
            KILN_WARN("dispatch table %s not used (%s); selecting kernels at run time",
                      ks->dispatch_path, why);
    }
    /* a baked choice, when the table applies and the kernel can run this site */
    if (ks->baked && ks->baked_usable) {
        const char *id =
            kiln_baked_kernel(ks->baked, cs->name, c.tok_bucket * KILN_SEQ_BUCKETS + c.seq_bucket);
        const kiln_reg_kernel *k = id ? kiln_registry_find(kiln_selector_registry(s), id) : NULL;
        if (k && k->spec.op == c.op && !(kiln_select_check(s, k, &c) & KILN_REASONS_HARD)) {
            *out = k->spec.fn;
            if (layout) *layout = k->spec.w_layout;
            if (kernel) *kernel = k;
            return KILN_OK;
        }
        if (!ks->baked_warned)
            KILN_WARN("dispatch table %s: call site '%s' %s; selecting at run time where the "
                      "table does not apply",
                      kiln_baked_path(ks->baked), cs->name,
                      !id  ? "is not in the table"
                      : !k ? "names an unknown kernel"
                           : "names a kernel that cannot run it");
        ks->baked_warned = true;
    }
    kiln_sel_result res;
    kiln_status st = kiln_select(s, &c, 0, &res, err);
    if (st) return kiln_err_wrap(err, st, "call site '%s'", cs->name);
    if (res.fallback) {
        /* once per call site: only at the first bucket that falls back */
        bool earlier = false;
        for (int b = 0; b < c.tok_bucket && !earlier; b++) {
            kiln_callsite prev = *cs;
            prev.bucket = b;
            kiln_sel_ctx pc;
            kiln_callsite_ctx(dev->be, &prev, &pc);
            kiln_sel_result pr;
            if (!kiln_select(s, &pc, 0, &pr, NULL) && pr.fallback) earlier = true;
        }
        if (!earlier)
            KILN_WARN("call site '%s' (%s): no valid kernel; using the reference kernel (kiln "
                      "explain shows why)",
                      cs->name, kiln_kop_name(cs->op));
    }
    *out = res.chosen->spec.fn;
    if (layout) *layout = res.chosen->spec.w_layout;
    if (kernel) *kernel = res.chosen;
    return KILN_OK;
}

size_t kiln_callsite_workspace(kiln_device *dev, const kiln_callsite *cs,
                               const kiln_reg_kernel *k) {
    if (!k || !k->spec.workspace || (int)k->spec.op != (int)cs->op) return 0;
    kiln_sel_ctx c;
    kiln_callsite_ctx(dev->be, cs, &c);
    return k->spec.workspace(&c);
}

kiln_status kiln_kernel_failed(kiln_device *dev, kiln_kernel_fn fn, const kiln_err *failure,
                               kiln_err *err) {
    kiln_selector *s = dev->ks->sel;
    const kiln_registry *reg = kiln_selector_registry(s);
    int found = 0;
    for (int i = 0; i < reg->n_kernels; i++) {
        const kiln_reg_kernel *k = &reg->kernels[i];
        if (k->spec.fn.any != fn.any || !fn.any) continue;
        if (reg->providers[k->provider].p->fallback) continue; /* the oracle stays */
        KILN_WARN("%s: kernel %s failed at run time (%s); marking it unhealthy on this device",
                  dev->name, k->spec.id, failure && failure->msg[0] ? failure->msg : "no message");
        kiln_selector_mark_unhealthy(s, k->index);
        found++;
    }
    if (!found)
        return kiln_err_set(err, KILN_ERR_NOT_FOUND,
                            "circuit breaker: the failed entry point is no breakable kernel");
    return KILN_OK;
}

kiln_status kiln_bind_site(kiln_device *dev, kiln_site *site, kiln_err *err) {
    for (int b = 0; b < KILN_BUCKETS; b++) {
        site->desc.bucket = b;
        /* The weight stays in the layout it was bound with; adapters pass that layout
         * (w_layout) to every call and a kernel that cannot read it fails the call
         * (the reference matmul refuses any repacked layout) instead of misreading. */
        KILN_TRY(kiln_select_callsite(dev, &site->desc, &site->fn[b], &site->layout[b],
                                      &site->kernel[b], err));
    }
    return KILN_OK;
}

#include "runtime/exec.h"

kiln_status kiln_plan_kernel_failed(struct kiln_bound_plan *bp, int32_t insn, int site, int bucket,
                                    const kiln_err *failure, kiln_err *err) {
    if (insn < 0 || insn >= bp->plan.n_insns || site < 0 || site >= bp->bi[insn].n_sites ||
        bucket < 0 || bucket >= KILN_BUCKETS)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "circuit breaker: no call site (%d, %d)",
                            (int)insn, site);
    kiln_kernel_fn bad = bp->bi[insn].site[site].fn[bucket];
    KILN_TRY(kiln_kernel_failed(bp->dev, bad, failure, err));
    for (int32_t i = 0; i < bp->plan.n_insns; i++)
        for (int s = 0; s < bp->bi[i].n_sites; s++) {
            bool uses = false;
            for (int b = 0; b < KILN_BUCKETS; b++)
                if (bp->bi[i].site[s].fn[b].any == bad.any) uses = true;
            if (!uses) continue;
            kiln_site *ks = &bp->bi[i].site[s];
            kiln_site saved = *ks;
            kiln_status bs = kiln_bind_site(bp->dev, ks, err);
            if (bs) {
                *ks = saved;
                return bs;
            }
            /* the weight may already be repacked for the failed kernel (bind.c): a
             * replacement must read that layout (kernels of a repacked layout also read
             * plain rows, not the other way round) */
            uint32_t wl = ks->widx >= 0 ? bp->bi[i].w[ks->widx].layout : 0;
            bool other = false; /* a replacement kernel reads another layout */
            for (int b = 0; b < KILN_BUCKETS; b++) other |= wl != 0 && ks->layout[b] != wl;
            /* with a load plan, load the layout the replacement reads (plain rows serve
             * every kernel when the buckets disagree; load/ and bind.c) */
            if (other && bp->load) {
                uint32_t want = ks->layout[0];
                for (int b = 1; b < KILN_BUCKETS; b++)
                    if (ks->layout[b] != want) want = KILN_WLAYOUT_PLAIN;
                kiln_status rs = kiln_bind_relayout_weight(bp, i, ks->widx, want, err);
                if (rs) {
                    *ks = saved;
                    return rs;
                }
                other = false;
            }
            for (int b = 0; b < KILN_BUCKETS; b++)
                if (other && ks->layout[b] != wl) {
                    *ks = saved;
                    return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                                        "circuit breaker: call site '%s' keeps its kernel: its "
                                        "weight is repacked (layout %u) and no other kernel "
                                        "reads that layout",
                                        ks->desc.name, wl);
                }
        }
    return KILN_OK;
}

kiln_status kiln_bound_plan_save_dispatch(const kiln_bound_plan *bp, const char *path,
                                          kiln_err *err) {
    int n = 0;
    for (int32_t i = 0; i < bp->plan.n_insns; i++) n += bp->bi[i].n_sites;
    if (n == 0 || !bp->dev || !bp->dev->ks)
        return kiln_err_set(err, KILN_ERR_STATE,
                            "dispatch table %s: the plan has no bound call sites", path);
    kiln_baked_site *rows = kiln_calloc((size_t)n, sizeof *rows);
    if (!rows)
        return kiln_err_set(err, KILN_ERR_NOMEM, "dispatch table %s: %d call sites", path, n);
    int r = 0;
    kiln_status st = KILN_OK;
    const kiln_callsite *first = NULL;
    for (int32_t i = 0; i < bp->plan.n_insns && !st; i++)
        for (int s = 0; s < bp->bi[i].n_sites && !st; s++) {
            const kiln_site *site = &bp->bi[i].site[s];
            kiln_baked_site *row = &rows[r++];
            if (!first) first = &site->desc;
            row->name = site->desc.name;
            row->op = site->desc.op;
            row->instr = i;
            /* the binding's bucket for a token bucket is (tb, largest context) for
             * attention and (tb, 0) otherwise; one kernel serves every context bucket */
            for (int tb = 0; tb < KILN_BUCKETS; tb++) {
                if (!site->kernel[tb]) {
                    st = kiln_err_set(err, KILN_ERR_STATE,
                                      "dispatch table %s: call site '%s' has no kernel bound for "
                                      "tokens %s",
                                      path, site->desc.name, kiln_tok_bucket_name(tb));
                    break;
                }
                for (int sb = 0; sb < KILN_SEQ_BUCKETS; sb++)
                    row->k[tb * KILN_SEQ_BUCKETS + sb] = site->kernel[tb];
            }
        }
    if (!st) {
        /* the signature's device context, as the binding computes it when it opens a
         * table (kiln_select_callsite: the first call site bound) */
        kiln_sel_ctx dev;
        kiln_callsite_ctx(bp->dev->be, first, &dev);
        st = kiln_baked_save(path, bp->dev->ks->sel, &dev, rows, n, err);
    }
    kiln_free(rows);
    return st;
}
