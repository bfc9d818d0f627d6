/*
 * dispatch.h — baked dispatch tables: the file format, its writer and its reader.
 *
 * There is one dispatch table: a bound plan's per-site table (runtime/backend.h,
 * kiln_site.fn[bucket], filled by the binding through the device's selector). `kiln
 * solve` binds the plan exactly as an engine does and writes that table
 * (kiln_bound_plan_save_dispatch, runtime/kselect.h, which calls kiln_baked_save);
 * `kiln run --dispatch FILE` binds with the file: the binding takes each site's kernel
 * from it (kiln_baked_open / kiln_baked_kernel) instead of selecting.
 *
 * File format (schema "kiln.dispatch", version 1):
 *   { "schema": "kiln.dispatch", "schema_version": 1,
 *     "signature": { "backend": "cpu", "device": "<cpu model>|isa=<hex>", "isa": "avx2 ...",
 *                    "sm": 0, "registry": "<hex>", "policy": "<hex>",
 *                    "descriptors": { "<provider>": "<hex>" }, "kiln_version": "0.1.0" },
 *     "sites": [ { "name": "blk.0.attn.q", "op": "matmul", "instr": 3,
 *                  "kernels": [ "<kernel id per bucket>" x 20 ] } ] }
 * Buckets are in kiln_bucket_index order (token bucket major, context bucket minor).
 * The runtime binds one kernel per token bucket (attention for the largest context), so
 * a table it writes repeats a token bucket's kernel in its four context buckets.
 *
 * Loading is sound: a table is used only when its signature equals this process's
 * (device, backend, registry incl. provider availability and descriptor hashes, policy,
 * kiln version), and a site's entry only when it names a kernel of the site's op that
 * passes the filter for the site (the binding checks: runtime/kselect.c). Otherwise the
 * binding warns saying why and selects at run time — never an error for a stale table;
 * errors are for unreadable or malformed files only.
 */
#ifndef KILN_KERNELS_DISPATCH_H
#define KILN_KERNELS_DISPATCH_H

#include "kernels/select.h"

#define KILN_DISPATCH_SCHEMA  "kiln.dispatch"
#define KILN_DISPATCH_VERSION 1

/* One call site of a table to write: name (unique in the table), op, plan instruction
 * (-1: none) and the kernel of every bucket (kiln_bucket_index order; none may be NULL).
 * Everything is borrowed for the call. */
typedef struct kiln_baked_site {
    const char *name;
    kiln_kop op;
    int instr;
    const kiln_reg_kernel *k[KILN_SEL_BUCKETS];
} kiln_baked_site;

/* Writes the table of sites[0..n_sites) to path (replacing it; written to "path.tmp"
 * first and renamed, so a reader never sees half a table). The signature is this
 * process's for selector s and device context `device` (backend, ISA, SM: the context
 * of the plan's call sites). KILN_ERR_INVALID_ARG for a NULL kernel or name (naming the
 * site and bucket), KILN_ERR_NOMEM, KILN_ERR_IO naming the path. */
kiln_status kiln_baked_save(const char *path, const kiln_selector *s, const kiln_sel_ctx *device,
                            const kiln_baked_site *sites, int n_sites, kiln_err *err);

/* ---- reading: a baked table as a lookup, for the binding that selects site by site ----
 * kiln_baked_open reads the file and compares its signature with this process's
 * (device = the backend / ISA / SM context the binding will use). *usable says whether
 * it may be used; when false, *why says why (the caller warns and selects at run time).
 * Only unreadable or malformed files are errors (KILN_ERR_FORMAT naming the path and,
 * for a bad site, its index). On success *out owns the parsed file until
 * kiln_baked_free (NULL-safe); why must hold why_size bytes. */
typedef struct kiln_baked kiln_baked;
kiln_status kiln_baked_open(const char *path, const kiln_selector *s, const kiln_sel_ctx *device,
                            kiln_baked **out, bool *usable, char *why, size_t why_size,
                            kiln_err *err);
/* The kernel id baked for (site name, bucket index), or NULL when the table lacks it. */
const char *kiln_baked_kernel(const kiln_baked *b, const char *site, int bucket);
const char *kiln_baked_path(const kiln_baked *b);
void kiln_baked_free(kiln_baked *b);

#endif /* KILN_KERNELS_DISPATCH_H */
