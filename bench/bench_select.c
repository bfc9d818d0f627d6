/*
 * bench_select.c — the cost of kernel selection and dispatch.
 *
 *   cold selection   kiln_select with KILN_SEL_NO_CACHE: filter + score every candidate
 *                    of the op (what binding a call site costs on a cache miss)
 *   cache hit        kiln_select of a context seen before (sharded cache lookup)
 *   dispatch         per-op overhead in the executor: bucket entry load + indirect call
 *                    through the table, minus a direct call of the same empty kernel
 *
 * Two registries: the built-in one (as shipped in this binary) and a synthetic one with
 * 24 matmul candidates (so the cost per candidate shows). Usage: bench_select [iters]
 *
 * Times are thread CPU time (CLOCK_THREAD_CPUTIME_ID) per operation, so a loaded shared
 * machine inflates them less than wall time would; the dispatch loop reports both.
 */
#include "base/timer.h"
#include "kernels/select.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile int sink;

static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) static kiln_status empty_kernel(const kiln_kctx *c,
                                                          const kiln_add_args *a) {
    (void)c;
    sink += (int)a->n;
    return KILN_OK;
}
static kiln_status mm(const kiln_kctx *c, const kiln_matmul_args *a) {
    (void)c, (void)a;
    return KILN_OK;
}

enum { N_SYN = 24 };
static kiln_kernel_spec syn_specs[N_SYN];
static char syn_ids[N_SYN][48];
static const kiln_kernel_spec syn_ref[] = {
    {.id = "ref.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "ref",
     .w_dtypes = KILN_DT_FLOATS | KILN_DT_QUANTS,
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .props = 3,
     .priority = 10,
     .fn.matmul = mm},
    {.id = "ref.add",
     .op = KILN_KOP_ADD,
     .provider = "ref",
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .props = 3,
     .priority = 10,
     .fn.add = empty_kernel},
};

static double bench_cold(kiln_selector *s, const kiln_sel_ctx *c, int iters) {
    kiln_sel_result r;
    kiln_err e;
    kiln_sel_ctx x = *c;
    uint64_t t0 = cpu_ns();
    for (int i = 0; i < iters; i++) {
        x.n = 640 + (i & 63) * 64; /* vary a validity field: every call is a new context */
        if (kiln_select(s, &x, KILN_SEL_NO_CACHE, &r, &e)) {
            fprintf(stderr, "select failed: %s\n", e.msg);
            exit(1);
        }
        sink += r.n_cands;
    }
    return (double)(cpu_ns() - t0) / iters;
}

static double bench_hit(kiln_selector *s, const kiln_sel_ctx *c, int iters) {
    kiln_sel_result r;
    kiln_err e;
    kiln_select(s, c, 0, &r, &e);
    uint64_t t0 = cpu_ns();
    for (int i = 0; i < iters; i++) {
        kiln_select(s, c, 0, &r, &e);
        sink += r.cached;
    }
    return (double)(cpu_ns() - t0) / iters;
}

static void run_registry(const char *name, const kiln_registry *reg, int iters) {
    kiln_selector *s;
    kiln_err e;
    if (kiln_selector_new(reg, NULL, NULL, &s, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        exit(1);
    }
    kiln_sel_ctx c;
    kiln_sel_ctx_init(&c, KILN_KOP_MATMUL, KILN_BACKEND_CPU);
    c.w_dtype = KILN_DTYPE_Q4_K;
    c.n = 640;
    c.k = 2048;
    c.headroom_bytes = 1u << 30;
    kiln_sel_ctx_set_bucket(&c, 2, 0, 0, 0);
    double cold = bench_cold(s, &c, iters / 10);
    double hit = bench_hit(s, &c, iters);
    printf("%-22s %6d  %12.0f  %10.1f\n", name, reg->n_by_op[KILN_KOP_MATMUL], cold, hit);
    kiln_selector_free(s);
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 2000000;
    if (iters < 1000) iters = 1000;
    printf("selection (matmul call site, q4_K, 9-64 tokens)\n");
    printf("%-22s %6s  %12s  %10s   (thread CPU time per call)\n", "registry", "cands", "cold ns",
           "hit ns");
    run_registry("built-in", kiln_registry_default(), iters);

    for (int i = 0; i < N_SYN; i++) {
        snprintf(syn_ids[i], sizeof syn_ids[i], "syn.k%02d.matmul", i);
        syn_specs[i] = (kiln_kernel_spec){.id = syn_ids[i],
                                          .op = KILN_KOP_MATMUL,
                                          .provider = "syn",
                                          .isa = (i % 3 == 0) ? KILN_ISA_AMX_INT8 : 0,
                                          .w_dtypes = (i % 2) ? KILN_DT(KILN_DTYPE_Q4_K)
                                                              : KILN_DT(KILN_DTYPE_Q8_0),
                                          .act_dtypes = KILN_DT(KILN_DTYPE_F32),
                                          .k_multiple = (i % 5 == 0) ? 256 : 0,
                                          .props = 3,
                                          .priority = 20 + i,
                                          .fn.matmul = mm};
    }
    kiln_provider ref = {.name = "ref", .specs = syn_ref, .n_specs = 2, .fallback = true};
    kiln_provider syn = {.name = "syn", .specs = syn_specs, .n_specs = N_SYN};
    const kiln_provider *ps[] = {&ref, &syn};
    kiln_registry *reg;
    kiln_err e;
    if (kiln_registry_new(ps, 2, NULL, &reg, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    run_registry("synthetic", reg, iters);

    /* dispatch: an executor-like loop over 64 call sites of one step, through a table
     * shaped like the runtime's (runtime/backend.h kiln_site.fn[token bucket]) */
    kiln_selector *s;
    if (kiln_selector_new(reg, NULL, NULL, &s, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    enum { SITES = 64 };
    static kiln_kernel_fn table_fn[SITES][KILN_TOK_BUCKETS];
    uint64_t t0 = kiln_now_ns();
    for (int i = 0; i < SITES; i++)
        for (int b = 0; b < KILN_TOK_BUCKETS; b++) {
            kiln_sel_ctx c;
            kiln_sel_ctx_init(&c, KILN_KOP_ADD, KILN_BACKEND_CPU);
            c.n = 640;
            kiln_sel_ctx_set_bucket(&c, b, 0, 4096, 0);
            kiln_sel_result r;
            if (kiln_select(s, &c, 0, &r, &e)) {
                fprintf(stderr, "%s\n", e.msg);
                return 1;
            }
            table_fn[i][b] = r.chosen->spec.fn;
        }
    double build_us = (double)(kiln_now_ns() - t0) / 1e3;
    kiln_add_args a = {.n = 1};
    kiln_kctx kc = {0};
    long steps = iters / SITES;
    volatile int64_t step_tokens = 1;
    int64_t calls = steps * SITES;
    /* direct calls */
    t0 = cpu_ns();
    for (long st = 0; st < steps; st++)
        for (int i = 0; i < SITES; i++) empty_kernel(&kc, &a);
    double direct = (double)(cpu_ns() - t0) / (double)calls;
    /* through the table: bucket once per step, entry per call */
    t0 = cpu_ns();
    for (long st = 0; st < steps; st++) {
        int b = kiln_tok_bucket(step_tokens);
        for (int i = 0; i < SITES; i++) {
            kiln_status r = table_fn[i][b].add(&kc, &a);
            if (r) return 1;
        }
    }
    double table = (double)(cpu_ns() - t0) / (double)calls;
    printf("\ndispatch (64 call sites per step, empty kernel)\n");
    printf("  table build (64 sites x 5 token buckets): %.1f us\n", build_us);
    printf("  direct call:        %.2f ns/op\n", direct);
    printf("  through the table:  %.2f ns/op\n", table);
    printf("  overhead:           %.2f ns/op\n", table - direct);
    kiln_selector_free(s);
    kiln_registry_free(reg);
    return sink == 42 ? 2 : 0;
}
