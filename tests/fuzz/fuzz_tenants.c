/* fuzz_tenants.c — libFuzzer target for the `tenants:` section of kiln.yaml (the
 * scheduler's parser, kiln_tenants_parse_yaml): accepted lists are walked; rejections
 * are expected. Crashes, leaks, hangs and sanitizer reports are bugs. The kernel policy
 * part of kiln.yaml is fuzz_policy. */
#include "sched/sched.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 256 * 1024) return 0;
    kiln_tenant_list l;
    memset(&l, 0, sizeof l);
    kiln_err err;
    if (kiln_tenants_parse_yaml((const char *)data, size, "kiln.yaml", &l, &err) == KILN_OK)
        kiln_tenant_list_free(&l);
    return 0;
}
