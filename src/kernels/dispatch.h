/*
 * dispatch.h — baked dispatch tables: `kiln solve` writes the table of a bound plan as
 * JSON; `kiln run --dispatch FILE` loads it instead of selecting.
 *
 * File format (schema "kiln.dispatch", version 1):
 *   { "schema": "kiln.dispatch", "schema_version": 1, "kiln_version": "0.1.0",
 *     "signature": { "backend": "cpu", "device": "<cpu model>|isa=<hex>", "isa": "avx2 ...",
 *                    "sm": 0, "registry": "<hex>", "policy": "<hex>",
 *                    "descriptors": { "<provider>": "<hex>" } },
 *     "sites": [ { "name": "blk.0.attn.q", "op": "matmul", "instr": 3,
 *                  "kernels": [ "<kernel id per bucket>" x 20 ] } ] }
 * Buckets are in kiln_bucket_index order (token bucket major, context bucket minor).
 *
 * Loading is sound: the table is used only when the signature equals this process's
 * (device, backend, registry incl. provider availability and descriptor hashes, policy,
 * kiln version), the call sites match by name and op, and every named kernel exists and
 * passes the filter for its (site, bucket). Otherwise kiln_dispatch_load logs a warning
 * saying why and selects at run time (kiln_dispatch_build) — never an error for a stale
 * table; errors are for unreadable or malformed files only.
 */
#ifndef KILN_KERNELS_DISPATCH_H
#define KILN_KERNELS_DISPATCH_H

#include "kernels/select.h"

#define KILN_DISPATCH_SCHEMA  "kiln.dispatch"
#define KILN_DISPATCH_VERSION 1

/* The signature string of this process for a backend (e.g. for messages / tests). */
void kiln_dispatch_signature(const kiln_selector *s, const kiln_sel_ctx *device, char *buf,
                             size_t n);

kiln_status kiln_dispatch_save(const kiln_dispatch *d, const kiln_selector *s, const char *path,
                               kiln_err *err);

/* *baked tells whether the file's table was used (false: runtime selection, *why says
 * why; may be NULL). */
kiln_status kiln_dispatch_load(kiln_selector *s, const kiln_sel_site *sites, int n_sites,
                               const char *path, kiln_dispatch **out, bool *baked, char *why,
                               size_t why_size, kiln_err *err);

/* ---- a baked table as a lookup, for bindings that select site by site ----
 * kiln_baked_open reads the file and compares its signature with this process's
 * (device = the backend / ISA / SM context the binding will use). *usable says whether
 * it may be used; when false, *why says why (the caller warns and selects at run time).
 * Only unreadable or malformed files are errors. */
typedef struct kiln_baked kiln_baked;
kiln_status kiln_baked_open(const char *path, const kiln_selector *s, const kiln_sel_ctx *device,
                            kiln_baked **out, bool *usable, char *why, size_t why_size,
                            kiln_err *err);
/* The kernel id baked for (site name, bucket index), or NULL when the table lacks it. */
const char *kiln_baked_kernel(const kiln_baked *b, const char *site, int bucket);
const char *kiln_baked_path(const kiln_baked *b);
void kiln_baked_free(kiln_baked *b);

#endif /* KILN_KERNELS_DISPATCH_H */
