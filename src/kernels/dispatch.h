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

#endif /* KILN_KERNELS_DISPATCH_H */
