#include "kernels/kernel.h"

#include <assert.h>
#include <stdarg.h>

static const char *const kop_names[] = {
    [KILN_KOP_MATMUL] = "matmul",
    [KILN_KOP_EMBED] = "embed",
    [KILN_KOP_RMS_NORM] = "rms_norm",
    [KILN_KOP_ROPE] = "rope",
    [KILN_KOP_KV_WRITE] = "kv_write",
    [KILN_KOP_ATTENTION] = "attention",
    [KILN_KOP_GLU] = "glu",
    [KILN_KOP_ADD] = "add",
    [KILN_KOP_MATMUL_GROUP] = "matmul_group",
    [KILN_KOP_ROPE_KV] = "rope_kv",
    [KILN_KOP_MATMUL_ARGMAX] = "matmul_argmax",
    [KILN_KOP_SAMPLE] = "sample",
};
static_assert(sizeof(kop_names) / sizeof(kop_names[0]) == KILN_KOP_COUNT,
              "kop_names must name every kiln_kop");

const char *kiln_kop_name(kiln_kop op) {
    return (unsigned)op < KILN_KOP_COUNT ? kop_names[op] : "unknown";
}

kiln_status kiln_kerr(const kiln_kctx *c, kiln_status code, const char *fmt, ...) {
    if (!c || !c->err) return code;
    va_list ap;
    va_start(ap, fmt);
    kiln_err_vset(c->err, code, fmt, ap);
    va_end(ap);
    return code;
}
