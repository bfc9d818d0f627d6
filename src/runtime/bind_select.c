/*
 * bind_select.c — kernel choice for the `cpu` backend: a binding call site
 * (kiln_callsite) becomes a selection context (kernels/select.h) and the selection
 * engine picks among the registry's host kernels (cpu SIMD, OpenBLAS, ref fallbacks),
 * honouring the policy chain (kiln.yaml, KILN_LOCK_<OP>, KILN_PREFER, ...).
 *
 * kiln_cpu_bind_selector is this file's singleton: a selector over the default registry
 * with the resolved policy, built once (pthread_once), never freed; its cache is
 * thread-safe. A policy error is reported once and the defaults are used.
 */
#include "runtime/exec.h"

#include "base/log.h"
#include "kernels/policy.h"
#include "kernels/registry.h"
#include "kernels/select.h"

#include <pthread.h>

static struct {
    pthread_once_t once;
    kiln_policy policy;
    kiln_selector *sel;
    kiln_err err;
} kiln_cpu_bind_selector = {.once = PTHREAD_ONCE_INIT};

static void selector_init(void) {
    kiln_err e;
    kiln_err_clear(&e);
    if (kiln_policy_resolve(&kiln_cpu_bind_selector.policy, NULL, &e)) {
        KILN_WARN("kernel policy: %s (using defaults)", e.msg);
        kiln_policy_init(&kiln_cpu_bind_selector.policy);
    }
    kiln_err_clear(&kiln_cpu_bind_selector.err);
    kiln_selector_new(kiln_registry_default(), &kiln_cpu_bind_selector.policy, NULL,
                      &kiln_cpu_bind_selector.sel, &kiln_cpu_bind_selector.err);
}

/* The kernel features a call site needs. The binding describes the attention's
 * geometry on all its sites (q_norm, rope, ...); only the op that uses a feature asks
 * for it. */
static uint32_t features_of(const kiln_callsite *cs) {
    static const struct {
        uint32_t cs, kf;
        kiln_kop op;
    } map[] = {
        {KILN_CS_BIAS, KILN_KFEAT_BIAS, KILN_KOP_MATMUL},
        {KILN_CS_GQA, KILN_KFEAT_GQA, KILN_KOP_ATTENTION},
        {KILN_CS_WINDOW, KILN_KFEAT_SLIDING_WINDOW, KILN_KOP_ATTENTION},
        {KILN_CS_SOFTCAP, KILN_KFEAT_SOFTCAP, KILN_KOP_ATTENTION},
        {KILN_CS_PAGED, KILN_KFEAT_PAGED_KV, KILN_KOP_ATTENTION},
        {KILN_CS_PAGED, KILN_KFEAT_PAGED_KV, KILN_KOP_KV_WRITE},
        {KILN_CS_CAUSAL, KILN_KFEAT_CAUSAL, KILN_KOP_ATTENTION},
        {KILN_CS_YARN, KILN_KFEAT_ROPE_YARN, KILN_KOP_ROPE},
        {KILN_CS_FREQ_FAC, KILN_KFEAT_ROPE_FREQS, KILN_KOP_ROPE},
    };
    uint32_t f = 0;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if ((cs->features & map[i].cs) && cs->op == map[i].op) f |= map[i].kf;
    return f;
}

kiln_status kiln_bind_select_cpu(const kiln_callsite *cs, kiln_kernel_fn *out, uint32_t *layout,
                                 kiln_err *err) {
    pthread_once(&kiln_cpu_bind_selector.once, selector_init);
    if (!kiln_cpu_bind_selector.sel)
        return kiln_err_set(err, KILN_ERR_STATE, "%s: kernel selector: %s", cs->name,
                            kiln_cpu_bind_selector.err.msg);
    kiln_sel_ctx c;
    kiln_sel_ctx_init(&c, cs->op, KILN_BACKEND_CPU);
    kiln_sel_ctx_set_bucket(&c, cs->bucket, 0, kiln_bucket_max(cs->bucket), 0);
    if (cs->op == KILN_KOP_MATMUL || cs->op == KILN_KOP_EMBED || cs->op == KILN_KOP_RMS_NORM)
        c.w_dtype = cs->w_dtype;
    if (cs->op == KILN_KOP_KV_WRITE || cs->op == KILN_KOP_ATTENTION) c.kv_dtype = cs->kv_dtype;
    c.n = cs->n;
    c.k = cs->k;
    c.head_dim = cs->head_dim;
    c.n_head = cs->n_head;
    c.n_kv_head = cs->n_kv_head;
    c.features = features_of(cs);
    kiln_sel_result r;
    kiln_status st = kiln_select(kiln_cpu_bind_selector.sel, &c, 0, &r, err);
    if (st) return kiln_err_wrap(err, st, "%s", cs->name);
    *out = r.chosen->spec.fn;
    *layout = r.chosen->spec.w_layout;
    if (!out->any)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "%s: kernel %s is not built", cs->name,
                            r.chosen->spec.id);
    return KILN_OK;
}
