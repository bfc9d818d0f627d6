/* fuzz_safetensors.c — libFuzzer target for the safetensors reader (and, on the same
 * input as text, the HF config.json mapping): parse, then touch every tensor's first and
 * last byte and every metadata entry so ASan sees any out-of-bounds pointer. */
#include "format/hf_map.h"
#include "format/safetensors.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_safetensors *st = NULL;
    kiln_err e;
    if (kiln_st_open_buffer(data, size, "fuzz", 0, &st, &e) == KILN_OK) {
        for (size_t i = 0; i < kiln_st_tensor_count(st); i++) {
            const kiln_tensor_info *t = kiln_st_tensor(st, i);
            if (kiln_st_find_tensor(st, t->name) != t) __builtin_trap();
            if (t->nbytes) {
                const uint8_t *p = t->data;
                sink ^= p[0] ^ p[t->nbytes - 1];
            }
            char out[128];
            uint32_t fixup;
            kiln_hf_tensor_name("gemma3", t->name, out, sizeof out, &fixup);
        }
        const kiln_meta *m = kiln_st_meta(st);
        for (size_t i = 0; i < kiln_meta_count(m); i++) {
            const kiln_meta_entry *en = kiln_meta_at(m, i);
            if (en->value.v.s.len) sink ^= (uint8_t)en->value.v.s.ptr[en->value.v.s.len - 1];
        }
        kiln_st_close(st);
    }
    /* the same bytes as a config.json */
    kiln_meta meta;
    kiln_meta_init(&meta);
    if (kiln_hf_config_to_meta((const char *)data, size, "config.json", &meta, &e) == KILN_OK) {
        for (size_t i = 0; i < kiln_meta_count(&meta); i++) {
            char buf[96];
            kiln_meta_value_fmt(&kiln_meta_at(&meta, i)->value, buf, sizeof buf, 32);
        }
    }
    kiln_meta_free(&meta);
    return 0;
}
