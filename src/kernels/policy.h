/*
 * policy.h — operator control over kernel selection: kiln.yaml + environment.
 *
 * File (YAML, parsed with libyaml; every key optional):
 *
 *   version: 1
 *   strict: false              # no valid kernel -> error instead of the ref fallback
 *   deterministic: false       # only kernels marked deterministic (+ batch-invariant)
 *   reference_only: false      # only the ref (fallback) kernels
 *   memory_headroom_mb: 512    # reject kernels whose workspace exceeds this
 *   locks:                     # op -> kernel id (bypasses scoring; must still be valid)
 *     matmul: cpu.avx512.matmul.q4_k
 *   prefer: [cpu, openblas]    # providers or kernel ids ("cpu.avx512.*"), best first
 *   avoid: [onednn]            # rejected with POLICY_AVOIDED
 *   rules:                     # first matching rule's lock wins; prefer/avoid accumulate
 *     - match: {op: matmul, dtype: q4_k, backend: cpu, tokens: ">512", isa: avx512f}
 *       prefer: [openblas]
 *     - match: {op: attention, sm: ">=90"}
 *       lock: cuda.flash.attention.f16
 *
 * Precedence, highest first (docs/KERNELS.md; tested in test_policy.c):
 *   1. reference_only (KILN_REFERENCE_ONLY=1 or the file): only fallback kernels.
 *   2. locks: KILN_LOCK_<OP> > the first matching rule's lock > `locks:` in the file.
 *   3. avoid: KILN_AVOID (replaces the file's list) + matching rules' avoid; an
 *      avoided provider is avoided even when also preferred.
 *   4. prefer: matching rules' prefer (first) + KILN_PREFER (replaces the file's list).
 *   5. scalars: KILN_DETERMINISTIC=0|1 and KILN_STRICT=0|1 override the file.
 * The file itself: --policy PATH > KILN_POLICY > $XDG_CONFIG_HOME/kiln/kiln.yaml (or
 * ~/.config/kiln/kiln.yaml); a missing default file is not an error, a missing named
 * file is.
 *
 * Bad files are rejected with "<path>:<line>: <what>" (unknown keys, wrong types, unknown
 * ops/dtypes/backends, malformed YAML). A kiln_policy is a plain value (no heap): copy
 * it freely. Selectors borrow it for their lifetime.
 */
#ifndef KILN_KERNELS_POLICY_H
#define KILN_KERNELS_POLICY_H

#include "base/status.h"
#include "kernels/spec.h"

#include <stdbool.h>
#include <stdint.h>

#define KILN_POLICY_MAX_NAMES 16
#define KILN_POLICY_NAME_MAX  96
#define KILN_POLICY_MAX_RULES 32

typedef enum kiln_policy_src {
    KILN_POLICY_SRC_NONE = 0,
    KILN_POLICY_SRC_FILE,
    KILN_POLICY_SRC_RULE,
    KILN_POLICY_SRC_ENV,
} kiln_policy_src;

typedef struct kiln_name_list {
    char name[KILN_POLICY_MAX_NAMES][KILN_POLICY_NAME_MAX];
    int n;
} kiln_name_list;

typedef struct kiln_policy_rule {
    int line; /* line in the file (messages, explain) */
    /* match; "any" values: op -1, backend -1, 0 masks, sm bounds 0 */
    int op;
    uint64_t w_dtypes;    /* KILN_DT mask */
    int backend;          /* kiln_backend_id */
    uint32_t tok_buckets; /* 1 << kiln_tok_bucket */
    uint32_t isa;         /* all these ISA bits present */
    int32_t sm_min, sm_max;
    /* actions */
    kiln_name_list prefer, avoid;
    char lock[KILN_POLICY_NAME_MAX];
} kiln_policy_rule;

typedef struct kiln_policy {
    char locks[KILN_KOP_COUNT][KILN_POLICY_NAME_MAX]; /* "" = none */
    uint8_t lock_src[KILN_KOP_COUNT];                 /* kiln_policy_src */
    kiln_name_list prefer, avoid;
    kiln_policy_rule rules[KILN_POLICY_MAX_RULES];
    int n_rules;
    bool strict, deterministic, reference_only;
    uint64_t headroom_bytes; /* 0 = unlimited */
    char path[256];          /* file it came from, "" = none */
    uint64_t hash;           /* of everything above that affects selection */
} kiln_policy;

/* Defaults: nothing locked, preferred or avoided; not strict; unlimited headroom. */
void kiln_policy_init(kiln_policy *p);

/* Parses YAML text (path is used in messages). On error p is unchanged. */
kiln_status kiln_policy_parse(kiln_policy *p, const char *yaml, size_t len, const char *path,
                              kiln_err *err);
kiln_status kiln_policy_load_file(kiln_policy *p, const char *path, kiln_err *err);

/* Applies KILN_LOCK_<OP>, KILN_PREFER, KILN_AVOID, KILN_DETERMINISTIC, KILN_STRICT,
 * KILN_REFERENCE_ONLY from the environment (getenv). Bad values are errors naming the
 * variable. */
kiln_status kiln_policy_apply_env(kiln_policy *p, kiln_err *err);
/* Same with an explicit lookup (tests): get(name) returns the value or NULL. */
kiln_status kiln_policy_apply_env_with(kiln_policy *p, const char *(*get)(const char *name),
                                       kiln_err *err);

/* The whole chain: defaults, the file chosen by precedence (cli_path may be NULL), then
 * the environment. */
kiln_status kiln_policy_resolve(kiln_policy *p, const char *cli_path, kiln_err *err);

/* Recomputes p->hash (done by every function above; call it after editing fields). */
void kiln_policy_rehash(kiln_policy *p);

/* Does `pattern` (a provider name, a kernel id, or a prefix glob "cpu.avx512.*") name
 * this kernel? */
bool kiln_policy_name_matches(const char *pattern, const kiln_kernel_spec *s);

#endif /* KILN_KERNELS_POLICY_H */
