/* families.c — the registry of model families: add a family here (one line). */
#include "model/model.h"

#include <string.h>

extern const kiln_family kiln_family_llama, kiln_family_qwen2, kiln_family_qwen3,
    kiln_family_gemma3;

static const kiln_family *const families[] = {
    &kiln_family_llama, &kiln_family_qwen2, &kiln_family_qwen3, &kiln_family_gemma3, NULL,
};

const kiln_family *const *kiln_families(void) {
    return families;
}

const kiln_family *kiln_family_find(const char *arch) {
    for (int i = 0; families[i]; i++)
        if (strcmp(families[i]->arch, arch) == 0) return families[i];
    return NULL;
}
