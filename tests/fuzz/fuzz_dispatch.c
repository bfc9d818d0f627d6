/* fuzz_dispatch.c — libFuzzer target for baked dispatch tables as read back (kiln solve
 * writes them with kiln_baked_save; the binding reads them with kiln_baked_open): the
 * input is written to a memfd, opened with a selector over the ref and cpu providers and
 * queried for three call sites (two q4_K matmuls, one f16 attention) and every bucket;
 * every id found is looked up and checked against the site as the binding does
 * (runtime/kselect.c). A table whose signature differs is opened unusable (not an
 * error); malformed files are errors. Crashes, leaks, hangs and sanitizer reports are
 * bugs. KILN_FUZZ_WRITE_SEED=FILE: write this process's own table (the seed). */
#include "kernels/dispatch.h"
#include "kernels/registry.h"
#include "kernels/select.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static kiln_registry *reg;
static kiln_selector *sel;
static kiln_sel_site sites[3];
static int fd = -1;
static char path[64];

static void init(void) {
    static const kiln_provider *const provs[] = {&kiln_provider_ref, &kiln_provider_cpu};
    kiln_err e;
    if (kiln_registry_new(provs, 2, NULL, &reg, &e) != KILN_OK) abort(); /* harness */
    if (kiln_selector_new(reg, NULL, NULL, &sel, &e) != KILN_OK) abort();
    for (int i = 0; i < 2; i++) {
        snprintf(sites[i].name, sizeof sites[i].name, "blk.%d.ffn.down", i);
        sites[i].instr = 5 + i;
        kiln_sel_ctx_init(&sites[i].ctx, KILN_KOP_MATMUL, KILN_BACKEND_CPU);
        sites[i].ctx.w_dtype = KILN_DTYPE_Q4_K;
        sites[i].ctx.n = 640, sites[i].ctx.k = 2048;
        sites[i].ctx.tokens_max = 2048;
    }
    snprintf(sites[2].name, sizeof sites[2].name, "blk.0.attn.core");
    kiln_sel_ctx_init(&sites[2].ctx, KILN_KOP_ATTENTION, KILN_BACKEND_CPU);
    sites[2].ctx.kv_dtype = KILN_DTYPE_F16;
    sites[2].ctx.head_dim = 256;
    sites[2].ctx.features = KILN_KFEAT_CAUSAL | KILN_KFEAT_PAGED_KV;
    sites[2].ctx.tokens_max = 2048;
    sites[2].ctx.seq_max = 32768;
    const char *seed = getenv("KILN_FUZZ_WRITE_SEED");
    if (seed) {
        kiln_baked_site rows[3];
        for (int i = 0; i < 3; i++) {
            rows[i].name = sites[i].name;
            rows[i].op = sites[i].ctx.op;
            rows[i].instr = sites[i].instr;
            for (int b = 0; b < KILN_SEL_BUCKETS; b++) {
                kiln_sel_ctx c = sites[i].ctx;
                kiln_sel_ctx_set_bucket(&c, b / KILN_SEQ_BUCKETS, b % KILN_SEQ_BUCKETS,
                                        sites[i].ctx.tokens_max, sites[i].ctx.seq_max);
                kiln_sel_result r;
                if (kiln_select(sel, &c, 0, &r, &e) != KILN_OK) abort(); /* harness */
                rows[i].k[b] = r.chosen;
            }
        }
        if (kiln_baked_save(seed, sel, &sites[0].ctx, rows, 3, &e) != KILN_OK) abort();
    }
    fd = memfd_create("dispatch.json", 0);
    if (fd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (fd < 0) init();
    if (size > 1 << 20) return 0;
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) abort();
    char why[256];
    kiln_err e;
    kiln_baked *b = NULL;
    bool usable = false;
    if (kiln_baked_open(path, sel, &sites[0].ctx, &b, &usable, why, sizeof why, &e) == KILN_OK) {
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < KILN_SEL_BUCKETS; k++) {
                const char *id = kiln_baked_kernel(b, sites[i].name, k);
                const kiln_reg_kernel *rk = id ? kiln_registry_find(reg, id) : NULL;
                if (rk && rk->spec.op == sites[i].ctx.op) {
                    kiln_sel_ctx c = sites[i].ctx;
                    kiln_sel_ctx_set_bucket(&c, k / KILN_SEQ_BUCKETS, k % KILN_SEQ_BUCKETS,
                                            c.tokens_max, c.seq_max);
                    (void)kiln_select_check(sel, rk, &c);
                }
            }
        kiln_baked_free(b);
    }
    return 0;
}
