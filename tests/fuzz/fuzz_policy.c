/* fuzz_policy.c — libFuzzer target for kiln.yaml (the kernel policy): the input is
 * parsed as YAML text with kiln_policy_parse; on success the parsed rules are matched
 * against every kernel of the built-in providers (kiln_policy_name_matches). Parse
 * errors are expected; crashes, leaks, hangs and sanitizer reports are bugs. Tenants in
 * kiln.yaml belong to the scheduler's parser (a separate target once it exists). */
#include "kernels/policy.h"
#include "kernels/registry.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 256 * 1024) return 0;
    kiln_policy p;
    kiln_policy_init(&p);
    kiln_err err;
    if (kiln_policy_parse(&p, (const char *)data, size, "kiln.yaml", &err) != KILN_OK) return 0;
    static const kiln_provider *const provs[] = {&kiln_provider_ref, &kiln_provider_cpu};
    volatile int hits = 0;
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < provs[i]->n_specs; k++) {
            const kiln_kernel_spec *s = &provs[i]->specs[k];
            for (int j = 0; j < p.prefer.n; j++)
                hits += kiln_policy_name_matches(p.prefer.name[j], s);
            for (int j = 0; j < p.avoid.n; j++)
                hits += kiln_policy_name_matches(p.avoid.name[j], s);
            for (int o = 0; o < KILN_KOP_COUNT; o++)
                if (p.locks[o][0]) hits += kiln_policy_name_matches(p.locks[o], s);
            for (int r = 0; r < p.n_rules; r++) {
                const kiln_policy_rule *ru = &p.rules[r];
                if (ru->lock[0]) hits += kiln_policy_name_matches(ru->lock, s);
                for (int j = 0; j < ru->prefer.n; j++)
                    hits += kiln_policy_name_matches(ru->prefer.name[j], s);
            }
        }
    (void)hits;
    kiln_policy_rehash(&p);
    return 0;
}
