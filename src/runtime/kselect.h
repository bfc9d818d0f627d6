/*
 * kselect.h — the bridge between the runtime's call sites (backend.h: kiln_callsite) and
 * the kernel selection engine (kernels/select.h). When a plan is bound, kiln_bind_site
 * calls kiln_select_callsite for every call site and token bucket and fills the site's
 * row of the dispatch table (backend.h: kiln_site); kiln_bind_callsite is the same for
 * one bucket.
 *
 * Ownership: every device (kiln_device.ks, opened per engine) owns its kiln_kselect —
 * the default kernel registry, the policy (kiln_policy_resolve: --policy / KILN_POLICY /
 * the config dir, then KILN_* variables), this machine's PerfDB timings, optionally a
 * baked dispatch table, and the circuit breaker's unhealthy marks. Nothing of it is
 * shared between devices, so an engine's thread binds, selects and trips its breaker
 * without locks, and several engines run on several threads. The only process-wide
 * state is the configuration (three paths, kiln_runtime_selector_configure; a CLI calls
 * it once, before the first engine is created), copied under a mutex when a device
 * opens; devices opened earlier keep what they were built with.
 *
 * Mapping a call site to a selection context (kiln_callsite_ctx): backend and ISA of this
 * host; weight dtype for matmul / embed (f32 for rms_norm); KV dtype for kv_write /
 * attention; the KILN_CS_* features. Features the call-site description does not carry
 * are required conservatively so no kernel is chosen that might lack them: rope needs
 * NEOX pairing and partial rotation, glu GeGLU, rms_norm the fused residual. The token
 * bucket is the call site's, clamped to its max_tokens (the engine's largest step);
 * attention is validated for an unbounded context (the largest context bucket), since
 * the description does not carry the context length.
 */
#ifndef KILN_RUNTIME_KSELECT_H
#define KILN_RUNTIME_KSELECT_H

#include "kernels/select.h"
#include "runtime/backend.h"

/* Sets the process's selector configuration (NULL or "": the defaults) and checks it
 * by building a selector from it (a named dispatch table must be readable). */
kiln_status kiln_runtime_selector_configure(const char *policy_path, const char *perfdb_path,
                                            const char *dispatch_path, kiln_err *err);

/* A device's selector, built from the process configuration; dev (NULL: the host) names
 * whose PerfDB timings it reads (kiln_device_perf_key). */
typedef struct kiln_kselect kiln_kselect;
kiln_status kiln_kselect_new(kiln_kselect **out, const kiln_device *dev, kiln_err *err);
void kiln_kselect_free(kiln_kselect *ks);
/* The PerfDB device key of dev: the host's (kiln_perfdb_host_device) for host backends
 * and NULL; for a GPU the host's followed by "|cuda:" and the GPU's model name (not its
 * ordinal), so timings of one GPU model are never read for another. */
void kiln_device_perf_key(const kiln_device *dev, char *out, size_t n);
kiln_selector *kiln_kselect_selector(kiln_kselect *ks);

/* The sampled step's call site (the engine selects its sample kernel under this name;
 * `kiln explain` shows it for backends that sample on the device). */
#define KILN_SAMPLE_SITE "output.sample"

/* The selection context of call site cs (bucket cs->bucket) on backend be. */
void kiln_callsite_ctx(const kiln_backend *be, const kiln_callsite *cs, kiln_sel_ctx *c);
/* The dispatch-table bucket index the binding uses for a token bucket and op. */
int kiln_callsite_bucket_index(const kiln_callsite *cs);

/* Chooses the kernel of cs on device dev: the baked table's entry when one is
 * configured, usable and valid for cs, else kiln_select. *out gets its entry point,
 * *layout (may be NULL) the weight layout it reads, *kernel (may be NULL) its registry
 * entry. Warns once per call site on a fallback to the ref kernel;
 * KILN_ERR_UNSUPPORTED (with every candidate's reasons) when nothing can run. */
kiln_status kiln_select_callsite(kiln_device *dev, const kiln_callsite *cs, kiln_kernel_fn *out,
                                 uint32_t *layout, const kiln_reg_kernel **kernel, kiln_err *err);

/* Binds every bucket of one call site (fn, layout, kernel; site->desc.bucket is left at
 * the last bucket). The plan binding and the circuit breaker's rebind both use it. */
kiln_status kiln_bind_site(kiln_device *dev, kiln_site *site, kiln_err *err);

/* Scratch bytes kernel k (bound to cs at cs->bucket: kiln_site.kernel[bucket]) asks
 * for: its spec's workspace function on cs's selection context; 0 for NULL, a kernel of
 * another op, or a spec without a workspace function (such kernels allocate what they
 * need themselves). */
size_t kiln_callsite_workspace(kiln_device *dev, const kiln_callsite *cs, const kiln_reg_kernel *k);

/* ---- circuit breaker (per device) ----
 * A kernel that faulted at run time — it returned KILN_ERR_DEVICE or KILN_ERR_INTERNAL
 * (kiln_status_is_fault; kernel.h says what each status means) — is marked unhealthy in
 * its device's selector (BACKEND_UNHEALTHY from then on; cached choices are dropped) by
 * kiln_kernel_failed, and kiln_bind_site re-selects every bucket of a call site, so
 * the device's next step runs the next candidate. Other statuses (a transient
 * KILN_ERR_NOMEM, an input out of range) leave the kernel alone. The step that failed is
 * not retried here: an adapter may have updated state in place (residual adds, KV
 * writes) before the failing call. kiln_kernel_failed returns KILN_ERR_NOT_FOUND when fn
 * is no registered kernel (or the reference, which stays). */
static inline bool kiln_status_is_fault(kiln_status st) {
    return st == KILN_ERR_DEVICE || st == KILN_ERR_INTERNAL;
}
kiln_status kiln_kernel_failed(kiln_device *dev, kiln_kernel_fn fn, const kiln_err *failure,
                               kiln_err *err);

struct kiln_bound_plan;
/* The executor's side: instruction `insn` failed with `failure` while calling call site
 * `site` in token bucket `bucket`. Marks that kernel unhealthy and rebinds every call
 * site of the plan that used it. KILN_OK when something was rebound (the next step runs
 * another kernel); an error when the failed kernel cannot be replaced (e.g. it is the
 * reference kernel: the failure is the input's, not the kernel's). */
kiln_status kiln_plan_kernel_failed(struct kiln_bound_plan *bp, int32_t insn, int site, int bucket,
                                    const kiln_err *failure, kiln_err *err);

/* ---- baking: the bound plan's dispatch table to a file (`kiln solve`) ----
 * Writes every call site of bp (name, op, instruction, the kernel of each token bucket,
 * repeated over the context buckets) with this device's signature, in the format of
 * kernels/dispatch.h. A process that binds the same plan with `--dispatch path` on the
 * same machine and configuration gets the same kernels. Errors: KILN_ERR_STATE for a
 * plan with no call sites bound, else kiln_baked_save's. */
kiln_status kiln_bound_plan_save_dispatch(const struct kiln_bound_plan *bp, const char *path,
                                          kiln_err *err);

#endif /* KILN_RUNTIME_KSELECT_H */
