/*
 * kselect.h — the bridge between the runtime's call sites (backend.h: kiln_callsite) and
 * the kernel selection engine (kernels/select.h). kiln_bind_callsite calls
 * kiln_select_callsite for every call site and bucket when a plan is bound.
 *
 * The runtime selector is a process-wide, lazily built singleton (runtime_selector in
 * kselect.c): the default kernel registry, the policy (kiln_policy_resolve: --policy /
 * KILN_POLICY / the config dir, then KILN_* variables), this machine's PerfDB timings,
 * and optionally a baked dispatch table. kiln_runtime_selector_configure sets those paths
 * (a CLI calls it once, before the first engine is created); without it the defaults are
 * used. Configuring again replaces the selector (engines bound earlier keep their
 * function pointers; the kernels themselves are immutable). Thread-safe.
 *
 * Mapping a call site to a selection context (kiln_callsite_ctx): backend and ISA of this
 * host; weight dtype for matmul / embed (f32 for rms_norm); KV dtype for kv_write /
 * attention; the KILN_CS_* features. Features the call-site description does not carry
 * are required conservatively so no kernel is chosen that might lack them: rope needs
 * NEOX pairing and partial rotation, glu GeGLU, rms_norm the fused residual. The token
 * bucket is the call site's; attention is validated for an unbounded context (the
 * largest context bucket), since the description does not carry the context length.
 */
#ifndef KILN_RUNTIME_KSELECT_H
#define KILN_RUNTIME_KSELECT_H

#include "kernels/select.h"
#include "runtime/backend.h"

kiln_status kiln_runtime_selector_configure(const char *policy_path, const char *perfdb_path,
                                            const char *dispatch_path, kiln_err *err);
/* The runtime selector (built with the defaults on first use). */
kiln_status kiln_runtime_selector(kiln_selector **out, kiln_err *err);

/* The selection context of call site cs (bucket cs->bucket) on backend be. */
void kiln_callsite_ctx(const kiln_backend *be, const kiln_callsite *cs, kiln_sel_ctx *c);
/* The dispatch-table bucket index the binding uses for a token bucket and op. */
int kiln_callsite_bucket_index(const kiln_callsite *cs);

/* Chooses the kernel of cs: the baked table's entry when one is configured, usable and
 * valid for cs, else kiln_select. Warns once per call site on a fallback to the ref
 * kernel; KILN_ERR_UNSUPPORTED (with every candidate's reasons) when nothing can run. */
kiln_status kiln_select_callsite(const kiln_backend *be, const kiln_callsite *cs,
                                 kiln_kernel_fn *out, uint32_t *layout, kiln_err *err);

/* Scratch bytes the kernel fn (bound to cs at cs->bucket) asks for: its spec's workspace
 * function on cs's selection context; 0 when fn is no registered kernel or its spec has
 * no workspace function (such kernels allocate what they need themselves). */
size_t kiln_callsite_workspace(const kiln_backend *be, const kiln_callsite *cs, kiln_kernel_fn fn);

/* ---- circuit breaker ----
 * A kernel that failed at run time (it returned an error status): kiln_kernel_failed
 * marks the registry kernel with that entry point unhealthy in the runtime selector
 * (BACKEND_UNHEALTHY from then on; cached choices are dropped), and kiln_rebind_site
 * re-selects every bucket of a call site, so the next step runs the next candidate.
 * The step that failed is not retried here: an adapter may have updated state in place
 * (residual adds, KV writes) before the failing call. Returns KILN_ERR_NOT_FOUND when fn
 * is no registered kernel. */
kiln_status kiln_kernel_failed(kiln_kernel_fn fn, const kiln_err *failure, kiln_err *err);
kiln_status kiln_rebind_site(const kiln_backend *be, kiln_site *site, kiln_err *err);

struct kiln_bound_plan;
/* The executor's side: instruction `insn` failed with `failure` while calling call site
 * `site` in token bucket `bucket`. Marks that kernel unhealthy and rebinds every call
 * site of the plan that used it. KILN_OK when something was rebound (the next step runs
 * another kernel); an error when the failed kernel cannot be replaced (e.g. it is the
 * reference kernel: the failure is the input's, not the kernel's). */
kiln_status kiln_plan_kernel_failed(struct kiln_bound_plan *bp, int32_t insn, int site, int bucket,
                                    const kiln_err *failure, kiln_err *err);

#endif /* KILN_RUNTIME_KSELECT_H */
