/*
 * bench_step.c — where the time of a decode step goes: the matmul kernels, attention,
 * the other kernels (norms, adds, rope + KV write, embedding), and the host time outside
 * every kernel (the executor, the adapters, the engine's step bookkeeping).
 *
 *   bench_step -m MODEL [-t THREADS] [-n TOKENS] [-r ROUNDS]
 *
 * Creates a cpu engine (f16 KV cache, as kiln bench) and decodes TOKENS greedy steps of
 * one sequence through kiln_engine_step_greedy (what kiln bench tg and kiln run --temp 0
 * run), ROUNDS times. Every kernel the adapters call directly is replaced by a timing
 * shim (one per call site, generated below) that reads the clock before and after the
 * real kernel on the calling thread; the members of a fused group (q/k/v, gate/up, the
 * LM head under matmul_argmax) are left untouched, so fusion still happens and the
 * group's time counts as matmul. Step time = the wall time of kiln_engine_step_greedy.
 * "host" = step - all kernels. Prints per-token microseconds, the median round.
 *
 * The shims add two clock reads per kernel call (~40 ns each on this VM): the "plain"
 * column is a run without shims, so the instrumentation's own cost is visible.
 */
#include "base/timer.h"
#include "model/model.h"
#include "runtime/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CAT_MATMUL, CAT_ATTN, CAT_OTHER, CAT_COUNT };
static const char *const cat_name[CAT_COUNT] = {"matmul", "attention", "other kernels"};

#define MAX_SHIMS 1024
typedef kiln_status (*any_fn)(const kiln_kctx *c, const void *a);
static any_fn orig[MAX_SHIMS];
static int cat_of[MAX_SHIMS];
static uint64_t cat_ns[CAT_COUNT];
static uint64_t cat_calls[CAT_COUNT];

#define SHIM(id, i)                                                                                \
    static kiln_status shim_##id(const kiln_kctx *c, const void *a) {                              \
        uint64_t t0 = kiln_now_ns();                                                               \
        kiln_status st = orig[i](c, a);                                                            \
        cat_ns[cat_of[i]] += kiln_now_ns() - t0;                                                   \
        cat_calls[cat_of[i]]++;                                                                    \
        return st;                                                                                 \
    }
#define SHIM4(id, v)                                                                               \
    SHIM(id##0, (v)*4) SHIM(id##1, (v)*4 + 1) SHIM(id##2, (v)*4 + 2) SHIM(id##3, (v)*4 + 3)
#define SHIM16(id, v)                                                                              \
    SHIM4(id##0, (v)*4) SHIM4(id##1, (v)*4 + 1) SHIM4(id##2, (v)*4 + 2) SHIM4(id##3, (v)*4 + 3)
#define SHIM64(id, v)                                                                              \
    SHIM16(id##0, (v)*4) SHIM16(id##1, (v)*4 + 1) SHIM16(id##2, (v)*4 + 2) SHIM16(id##3, (v)*4 + 3)
#define SHIM256(id, v)                                                                             \
    SHIM64(id##0, (v)*4) SHIM64(id##1, (v)*4 + 1) SHIM64(id##2, (v)*4 + 2) SHIM64(id##3, (v)*4 + 3)
SHIM256(0, 0)
SHIM256(1, 1)
SHIM256(2, 2)
SHIM256(3, 3)
#define REF(id)    shim_##id,
#define REF4(id)   REF(id##0) REF(id##1) REF(id##2) REF(id##3)
#define REF16(id)  REF4(id##0) REF4(id##1) REF4(id##2) REF4(id##3)
#define REF64(id)  REF16(id##0) REF16(id##1) REF16(id##2) REF16(id##3)
#define REF256(id) REF64(id##0) REF64(id##1) REF64(id##2) REF64(id##3)
static any_fn const shims[MAX_SHIMS] = {REF256(0) REF256(1) REF256(2) REF256(3)};

/* Sites the adapters call directly. The members of a group (sites 0-2 of an instruction
 * with a matmul_group site: q/k/v or gate/up/glu) and the LM head matmul under
 * matmul_argmax (site 0) are passed to the fused kernel as fn[m]: they stay as bound. */
static int instrument(kiln_engine *e) {
    int n = 0;
    for (int32_t i = 0; i < e->bp.plan.n_insns; i++) {
        kiln_bound_insn *bi = &e->bp.bi[i];
        int skip_below = 0;
        for (int s = 0; s < bi->n_sites; s++) {
            if (bi->site[s].desc.op == KILN_KOP_MATMUL_GROUP && skip_below < 3) skip_below = 3;
            if (bi->site[s].desc.op == KILN_KOP_MATMUL_ARGMAX && skip_below < 1) skip_below = 1;
        }
        for (int s = skip_below; s < bi->n_sites; s++) {
            kiln_kop op = bi->site[s].desc.op;
            int cat =
                op == KILN_KOP_MATMUL || op == KILN_KOP_MATMUL_GROUP || op == KILN_KOP_MATMUL_ARGMAX
                    ? CAT_MATMUL
                : op == KILN_KOP_ATTENTION ? CAT_ATTN
                                           : CAT_OTHER;
            { /* the decode bucket only: the other buckets' kernels are not called */
                const int b = kiln_bucket_of(1);
                if (!bi->site[s].fn[b].any) continue;
                if (n >= MAX_SHIMS) return -1;
                orig[n] = (any_fn)(void (*)(void))bi->site[s].fn[b].any;
                cat_of[n] = cat;
                bi->site[s].fn[b].any = (void (*)(void))shims[n];
                n++;
            }
        }
    }
    return n;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One round: n greedy steps of a new sequence; returns us per step, or < 0. */
static double round_us(kiln_engine *e, int n, kiln_err *err) {
    int32_t seq, tok = 1;
    if (kiln_seq_create(e, &seq, err)) return -1;
    uint64_t t0 = kiln_now_ns();
    for (int i = 0; i < n; i++) {
        kiln_batch_entry b = {seq, tok, i, 1};
        if (kiln_engine_step_greedy(e, &b, 1, 0, &tok, err)) return -1;
        if (tok < 0) tok = 1;
    }
    double us = (double)(kiln_now_ns() - t0) / 1e3 / n;
    kiln_seq_free(e, seq);
    return us;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    int threads = 2, n = 32, rounds = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m"))
            path = argv[i + 1];
        else if (!strcmp(argv[i], "-t"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-n"))
            n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r"))
            rounds = atoi(argv[i + 1]);
    }
    if (!path || n < 1 || rounds < 1 || rounds > 64 || threads < 1) {
        fprintf(stderr, "usage: bench_step -m MODEL [-t THREADS] [-n TOKENS] [-r ROUNDS]\n");
        return 2;
    }
    kiln_err err;
    kiln_model *m;
    if (kiln_model_load(path, &m, &err)) {
        fprintf(stderr, "bench_step: %s\n", err.msg);
        return 1;
    }
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.backend = "cpu";
    o.n_threads = threads;
    o.n_ctx = n + 16;
    o.max_seqs = 2;
    o.kv_f16 = true;
    kiln_engine *e;
    if (kiln_engine_create(m, &o, &e, &err)) {
        fprintf(stderr, "bench_step: %s\n", err.msg);
        kiln_model_free(m);
        return 1;
    }
    int rc = 0;
    double plain[64], step[64], part[64][CAT_COUNT];
    if (round_us(e, n, &err) < 0) rc = 1; /* warm-up */
    for (int r = 0; r < rounds && !rc; r++)
        if ((plain[r] = round_us(e, n, &err)) < 0) rc = 1;
    int ns = rc ? 0 : instrument(e);
    if (ns < 0) {
        fprintf(stderr, "bench_step: more than %d call sites\n", MAX_SHIMS);
        kiln_engine_free(e);
        kiln_model_free(m);
        return 1;
    }
    for (int r = 0; r < rounds && !rc; r++) {
        memset(cat_ns, 0, sizeof cat_ns);
        if ((step[r] = round_us(e, n, &err)) < 0) rc = 1;
        for (int c = 0; c < CAT_COUNT; c++) part[r][c] = (double)cat_ns[c] / 1e3 / n;
    }
    if (rc) {
        fprintf(stderr, "bench_step: %s\n", err.msg);
    } else {
        /* the median round by instrumented step time, its parts as measured together */
        int idx[64];
        for (int r = 0; r < rounds; r++) idx[r] = r;
        for (int a = 1; a < rounds; a++)
            for (int b = a; b > 0 && step[idx[b]] < step[idx[b - 1]]; b--) {
                int t = idx[b];
                idx[b] = idx[b - 1], idx[b - 1] = t;
            }
        int med = idx[rounds / 2];
        qsort(plain, (size_t)rounds, sizeof plain[0], cmp_d);
        double kern = 0;
        for (int c = 0; c < CAT_COUNT; c++) kern += part[med][c];
        printf("%s: %d threads, %d tokens x %d rounds, %d call sites timed, %.1f kernel calls "
               "per token\n",
               path, threads, n, rounds, ns,
               (double)(cat_calls[0] + cat_calls[1] + cat_calls[2]) / n / rounds);
        printf("| step plain (min-max) | step timed | matmul | attention | other kernels | host "
               "outside kernels | outside matmul+attention |\n");
        printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        printf("| %.0f us (%.0f-%.0f) | %.0f us | %.0f us | %.0f us | %.0f us | %.0f us (%.1f %%) "
               "| %.0f us (%.1f %%) |\n",
               plain[rounds / 2], plain[0], plain[rounds - 1], step[med], part[med][CAT_MATMUL],
               part[med][CAT_ATTN], part[med][CAT_OTHER], step[med] - kern,
               100.0 * (step[med] - kern) / step[med],
               step[med] - part[med][CAT_MATMUL] - part[med][CAT_ATTN],
               100.0 * (step[med] - part[med][CAT_MATMUL] - part[med][CAT_ATTN]) / step[med]);
        (void)cat_name;
    }
    kiln_engine_free(e);
    kiln_model_free(m);
    return rc;
}
