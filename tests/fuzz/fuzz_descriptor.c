/* fuzz_descriptor.c — libFuzzer target for capabilities descriptors (the JSON files that
 * narrow a provider's kernel specs, kernels/descriptor.c): the input is applied to the
 * specs of the cpu provider and of the ref provider. Rejections are expected; a crash,
 * leak, hang or sanitizer report is a bug, and so is an accepted descriptor that widens
 * a spec (priority aside, a descriptor may only narrow) — checked on the dtype masks. */
#include "kernels/registry.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAXS 512

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 256 * 1024) return 0;
    static const kiln_provider *const provs[] = {&kiln_provider_cpu, &kiln_provider_ref};
    static kiln_kernel_spec specs[MAXS];
    static bool declared[MAXS];
    for (int i = 0; i < 2; i++) {
        const kiln_provider *pv = provs[i];
        int n = pv->n_specs < MAXS ? pv->n_specs : MAXS;
        memcpy(specs, pv->specs, (size_t)n * sizeof specs[0]);
        uint64_t hash;
        kiln_err err;
        if (kiln_descriptor_apply((const char *)data, size, "fuzz.json", pv->name, specs, declared,
                                  n, &hash, &err) != KILN_OK)
            continue;
        for (int k = 0; k < n; k++) {
            if (specs[k].w_dtypes & ~pv->specs[k].w_dtypes) __builtin_trap();
            if (specs[k].act_dtypes & ~pv->specs[k].act_dtypes) __builtin_trap();
            if (specs[k].kv_dtypes & ~pv->specs[k].kv_dtypes) __builtin_trap();
        }
    }
    return 0;
}
