/* fuzz_gguf.c — libFuzzer target for the GGUF reader: parse the input as a GGUF image,
 * then walk everything a consumer would touch (every metadata value and array element,
 * lookups, every tensor's first and last byte) so ASan sees any out-of-bounds pointer. */
#include "format/gguf.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static volatile uint8_t sink;

static void walk_value(const kiln_meta_value *v, int depth) {
    char buf[128];
    kiln_meta_value_fmt(v, buf, sizeof buf, 32);
    if (v->type == KILN_META_STRING && v->v.s.len) sink ^= (uint8_t)v->v.s.ptr[v->v.s.len - 1];
    if (v->type != KILN_META_ARRAY || depth > 10) return;
    for (uint64_t i = 0; i < v->count; i++) {
        int64_t x;
        double d;
        bool b;
        kiln_str s;
        if (kiln_meta_arr_i64(v, i, &x)) sink ^= (uint8_t)x;
        if (kiln_meta_arr_f64(v, i, &d)) sink ^= (uint8_t)(d != d);
        if (kiln_meta_arr_bool(v, i, &b)) sink ^= (uint8_t)b;
        if (kiln_meta_arr_str(v, i, &s) && s.len) sink ^= (uint8_t)s.ptr[s.len - 1];
        const kiln_meta_value *it = kiln_meta_arr_item(v, i);
        if (it) walk_value(it, depth + 1);
        if (i > 4096) break; /* vocabularies: the first elements are enough */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_gguf *g = NULL;
    kiln_err e;
    if (kiln_gguf_open_buffer(data, size, "fuzz", 0, &g, &e) != KILN_OK) return 0;
    const kiln_meta *m = kiln_gguf_meta(g);
    for (size_t i = 0; i < kiln_meta_count(m); i++) {
        const kiln_meta_entry *en = kiln_meta_at(m, i);
        walk_value(&en->value, 0);
        if (kiln_meta_find_str(m, en->key) == NULL) __builtin_trap();
    }
    uint32_t u;
    float f;
    kiln_str s;
    kiln_meta_opt_u32(m, "llama.block_count", 0, &u, &e);
    kiln_meta_opt_f32(m, "llama.rope.freq_base", 0, &f, &e);
    kiln_meta_opt_str(m, "general.architecture", "", &s, &e);
    for (size_t i = 0; i < kiln_gguf_tensor_count(g); i++) {
        const kiln_tensor_info *t = kiln_gguf_tensor(g, i);
        if (kiln_gguf_find_tensor(g, t->name) != t) __builtin_trap();
        if (t->nbytes) {
            const uint8_t *p = t->data;
            sink ^= p[0] ^ p[t->nbytes - 1];
        }
    }
    kiln_gguf_close(g);
    return 0;
}
