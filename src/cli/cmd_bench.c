/*
 * cmd_bench.c — `kiln bench`: prompt-processing and decode speed, in the spirit of
 * llama-bench, so the two can be compared side by side (scripts/bench-vs-llama.sh).
 *
 *   kiln bench -m MODEL[,MODEL...] [-t N] [-p N] [-n N] [-d N] [-r REPS] [-o md|json]
 *              [--backend cpu|ref] [--kv-f32] [--logits]
 *
 * Tests, as llama-bench defines them:
 *  - ppN: one step with N prompt tokens (pseudo-random valid ids) into an empty
 *    sequence, logits for the last one; t/s = N / time of the step.
 *  - tgN: N steps of one token each from an empty sequence (positions 0..N-1), each
 *    fed the previous step's greedy token; t/s = N / total time. The greedy token comes
 *    from kiln_engine_step_greedy (the LM head fused with the argmax, as `kiln run
 *    --temp 0` decodes), or with --logits from kiln_engine_step's full logits row and an
 *    argmax here (what llama-bench's tg measures: logits produced every step).
 * With -d N (llama-bench's depth) every run first fills its fresh sequence with N tokens
 * (untimed steps of up to the step size), so the test attends to N more positions
 * ("pp512 @ d4096", "tg128 @ d4096"; JSON "n_depth").
 * Each test runs once as a warm-up, then REPS times (default 5) with a fresh sequence;
 * the table shows the mean and standard deviation of t/s over the repetitions. The KV
 * cache is f16 by default (llama.cpp's default cache type). `-o json` prints a JSON array
 * with one object per (model, test): "model", "backend", "threads", "n_prompt", "n_gen",
 * "test", "avg_ts", "stddev_ts", "samples_ts", "lm_head" ("greedy": the fused greedy
 * LM head, or "logits"), "kiln_commit".
 */
#include "base/pool.h"
#include "base/mem.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "kiln/kiln.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REPS 100

typedef struct bench_result {
    char model[256];
    char test[32];
    int64_t n_prompt, n_gen, n_depth;
    double ts[MAX_REPS];
    int n;
} bench_result;

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* One run of a test: returns the seconds it took, < 0 on error (message in err). */
static double run_once(kiln_engine *e, int32_t n_vocab, int64_t n_prompt, int64_t n_gen,
                       int64_t depth, int64_t chunk, bool want_logits, kiln_batch_entry *entries,
                       float *logits, kiln_err *err) {
    int32_t seq;
    if (kiln_seq_create(e, &seq, err)) return -1;
    uint32_t lcg = 12345;
    double t = 0;
    for (int64_t d0 = 0; d0 < depth; d0 += chunk) { /* the depth: untimed */
        const int64_t nd = depth - d0 < chunk ? depth - d0 : chunk;
        for (int64_t i = 0; i < nd; i++) {
            lcg = lcg * 1664525u + 1013904223u;
            entries[i] = (kiln_batch_entry){.seq = seq,
                                            .token = (int32_t)((lcg >> 8) % (uint32_t)n_vocab),
                                            .pos = (int32_t)(d0 + i),
                                            .want_logits = i == nd - 1};
        }
        if (kiln_engine_step(e, entries, (int32_t)nd, logits, err)) {
            kiln_seq_free(e, seq);
            return -1;
        }
    }
    if (n_prompt > 0) {
        for (int64_t i = 0; i < n_prompt; i++) {
            lcg = lcg * 1664525u + 1013904223u;
            entries[i] = (kiln_batch_entry){.seq = seq,
                                            .token = (int32_t)((lcg >> 8) % (uint32_t)n_vocab),
                                            .pos = (int32_t)(depth + i),
                                            .want_logits = i == n_prompt - 1};
        }
        uint64_t t0 = kiln_now_ns();
        kiln_status st = kiln_engine_step(e, entries, (int32_t)n_prompt, logits, err);
        t = (double)(kiln_now_ns() - t0) * 1e-9;
        if (st) {
            kiln_seq_free(e, seq);
            return -1;
        }
    } else {
        int32_t tok = 1;
        uint64_t t0 = kiln_now_ns();
        for (int64_t i = 0; i < n_gen; i++) {
            kiln_batch_entry b = {
                .seq = seq, .token = tok, .pos = (int32_t)(depth + i), .want_logits = 1};
            int32_t best = 0;
            kiln_status st = want_logits ? kiln_engine_step(e, &b, 1, logits, err)
                                         : kiln_engine_step_greedy(e, &b, 1, 0, &best, err);
            if (st) {
                kiln_seq_free(e, seq);
                return -1;
            }
            /* next token: greedy, so the run resembles generation */
            if (want_logits)
                for (int32_t v = 1; v < n_vocab; v++)
                    if (logits[v] > logits[best]) best = v;
            tok = best >= 0 ? best : 1;
        }
        t = (double)(kiln_now_ns() - t0) * 1e-9;
    }
    kiln_seq_free(e, seq);
    return t;
}

static int bench_model(const char *path, const char *backend, int threads, int tp, int64_t n_prompt,
                       int64_t n_gen, int64_t depth, int reps, bool kv_f16, bool want_logits,
                       bool load_report, bench_result *out, int *n_out) {
    kiln_err err;
    kiln_err_clear(&err);
    kiln_model *m = NULL;
    kiln_engine *e = NULL;
    int rc = 1;
    kiln_batch_entry *entries = NULL;
    float *logits = NULL;
    if (kiln_model_load(path, &m, &err)) goto fail;
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.backend = backend;
    o.n_threads = threads;
    o.n_ctx = depth + (n_prompt > n_gen ? n_prompt : n_gen) + 64;
    o.max_step_tokens = (int32_t)(n_prompt > 512 ? n_prompt : 512);
    const int64_t chunk = o.max_step_tokens;
    o.max_seqs = 4;
    o.kv_f16 = kv_f16;
    o.tp = tp;
    if (kiln_engine_create(m, &o, &e, &err)) goto fail;
    if (load_report) kiln_cli_print_load_report(e);
    const int32_t n_vocab = kiln_model_n_vocab(m);
    entries = kiln_calloc((size_t)chunk, sizeof *entries);
    logits = kiln_malloc(sizeof(float) * (size_t)n_vocab);
    if (!entries || !logits) {
        fprintf(stderr, "kiln bench: out of memory\n");
        goto done;
    }
    for (int test = 0; test < 2; test++) {
        int64_t p = test == 0 ? n_prompt : 0, g = test == 1 ? n_gen : 0;
        if (p == 0 && g == 0) continue;
        bench_result *r = &out[(*n_out)++];
        memset(r, 0, sizeof *r);
        snprintf(r->model, sizeof r->model, "%s", base_name(path));
        if (depth > 0)
            snprintf(r->test, sizeof r->test, "%s%lld @ d%lld", p ? "pp" : "tg",
                     (long long)(p ? p : g), (long long)depth);
        else
            snprintf(r->test, sizeof r->test, "%s%lld", p ? "pp" : "tg", (long long)(p ? p : g));
        r->n_prompt = p;
        r->n_gen = g;
        r->n_depth = depth;
        if (run_once(e, n_vocab, p, g, depth, chunk, want_logits, entries, logits, &err) < 0)
            goto fail; /* warm-up */
        for (int i = 0; i < reps; i++) {
            double s = run_once(e, n_vocab, p, g, depth, chunk, want_logits, entries, logits, &err);
            if (s < 0) goto fail;
            r->ts[r->n++] = (double)(p ? p : g) / s;
        }
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kiln bench: %s: %s\n", path, err.msg);
done:
    kiln_free(entries);
    kiln_free(logits);
    kiln_engine_free(e);
    kiln_model_free(m);
    return rc;
}

static void stats(const bench_result *r, double *avg, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < r->n; i++) s += r->ts[i];
    *avg = r->n ? s / r->n : 0;
    for (int i = 0; i < r->n; i++) q += (r->ts[i] - *avg) * (r->ts[i] - *avg);
    *sd = r->n > 1 ? sqrt(q / (r->n - 1)) : 0;
}

int kiln_cmd_bench(int argc, char **argv) {
    static const kiln_cmd_usage u = {
        "kiln bench -m MODEL[,MODEL...] [options]",
        "Measures prompt processing (ppN: one step of N tokens) and decode (tgN: N steps of one "
        "token) in tokens per second, like llama-bench: a warm-up run, then REPS runs; prints "
        "mean and standard deviation."};
    kiln_opt opts[] = {
        {"model", 'm', true, "MODEL", "model file(s), comma-separated", false, NULL},
        {"threads", 't', true, "N", "threads (default: all cores)", false, NULL},
        {"n-prompt", 'p', true, "N", "prompt tokens of the pp test (default 512; 0 = skip)", false,
         NULL},
        {"n-gen", 'n', true, "N", "generated tokens of the tg test (default 128; 0 = skip)", false,
         NULL},
        {"repetitions", 'r', true, "N", "repetitions of each test (default 5)", false, NULL},
        {"depth", 'd', true, "N",
         "tokens already in the sequence before each test (default 0; llama-bench's -d)", false,
         NULL},
        {"output", 'o', true, "FMT", "md (default) or json", false, NULL},
        {"backend", 0, true, "NAME", KILN_BACKEND_HELP, false, NULL},
        {"kv-f32", 0, false, NULL, "store the KV cache as f32 (default f16)", false, NULL},
        {"tp", 0, true, "N",
         "tensor parallel: split the model over N ranks (default 1; cpu: N threads groups, "
         "docs/TP.md)",
         false, NULL},
        {"logits", 0, false, NULL,
         "tg: materialize every step's logits and pick the token here (default: the engine's "
         "fused greedy LM head)",
         false, NULL},
        KILN_OPT_LOAD_REPORT,
    };
    const char *pos[4];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, opts, KILN_NOPTS(opts), pos, 4, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;
    kiln_opt *o_m = kiln_opt_find(opts, KILN_NOPTS(opts), "model");
    if (!o_m->seen) {
        fprintf(stderr, "kiln bench: -m MODEL is required\n");
        kiln_args_usage(&u, opts, KILN_NOPTS(opts), true);
        return 2;
    }
    int64_t threads = 0, n_prompt = 512, n_gen = 128, reps = 5, tp = 1, depth = 0;
    if (!kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "threads"), 0, 1024, &threads) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "tp"), 1, 64, &tp) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "n-prompt"), 0, 1 << 20, &n_prompt) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "n-gen"), 0, 1 << 20, &n_gen) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "depth"), 0, 1 << 20, &depth) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "repetitions"), 1, MAX_REPS, &reps))
        return 2;
    const char *fmt = kiln_opt_find(opts, KILN_NOPTS(opts), "output")->value;
    if (fmt && strcmp(fmt, "md") && strcmp(fmt, "json")) {
        fprintf(stderr, "kiln bench: -o: expected md or json, got '%s'\n", fmt);
        return 2;
    }
    const bool json = fmt && !strcmp(fmt, "json");
    const char *backend = kiln_opt_find(opts, KILN_NOPTS(opts), "backend")->value;
    backend = kiln_cli_backend(backend);
    const bool kv_f16 = !kiln_opt_find(opts, KILN_NOPTS(opts), "kv-f32")->seen;
    const bool want_logits = kiln_opt_find(opts, KILN_NOPTS(opts), "logits")->seen;
    if (threads == 0) threads = kiln_cpu_count();

    char models[4096];
    snprintf(models, sizeof models, "%s", o_m->value);
    bench_result *res = kiln_calloc(64, sizeof *res);
    if (!res) return 1;
    int n_res = 0, rc = 0;
    char *save = NULL;
    for (char *p = strtok_r(models, ",", &save); p && n_res + 2 <= 64;
         p = strtok_r(NULL, ",", &save)) {
        if (bench_model(p, backend, (int)threads, (int)tp, n_prompt, n_gen, depth, (int)reps,
                        kv_f16, want_logits,
                        kiln_opt_find(opts, KILN_NOPTS(opts), "load-report")->seen, res, &n_res))
            rc = 1;
    }
    if (json) {
        printf("[\n");
        for (int i = 0; i < n_res; i++) {
            double avg, sd;
            stats(&res[i], &avg, &sd);
            printf("  {\"model\": \"%s\", \"backend\": \"%s\", \"threads\": %lld, \"tp\": %lld, "
                   "\"n_prompt\": %lld, \"n_gen\": %lld, \"n_depth\": %lld, \"test\": \"%s\", "
                   "\"avg_ts\": %.6f, \"stddev_ts\": %.6f, \"samples_ts\": [",
                   res[i].model, backend, (long long)threads, (long long)tp,
                   (long long)res[i].n_prompt, (long long)res[i].n_gen, (long long)res[i].n_depth,
                   res[i].test, avg, sd);
            for (int j = 0; j < res[i].n; j++) printf("%s%.6f", j ? ", " : "", res[i].ts[j]);
            printf("], \"lm_head\": \"%s\", \"kiln_commit\": \"%s\"}%s\n",
                   want_logits ? "logits" : "greedy", KILN_GIT_COMMIT, i + 1 < n_res ? "," : "");
        }
        printf("]\n");
    } else {
        printf("| model | backend | threads | test | t/s |\n");
        printf("| --- | --- | ---: | ---: | ---: |\n");
        for (int i = 0; i < n_res; i++) {
            double avg, sd;
            stats(&res[i], &avg, &sd);
            /* a TP group shows in the backend cell ("cpu tp2"): the columns stay */
            char be[64];
            if (tp > 1)
                snprintf(be, sizeof be, "%s tp%lld", backend, (long long)tp);
            else
                snprintf(be, sizeof be, "%s", backend);
            printf("| %s | %s | %lld | %s | %.2f ± %.2f |\n", res[i].model, be, (long long)threads,
                   res[i].test, avg, sd);
        }
        printf("\nkiln %s\n", KILN_GIT_COMMIT);
    }
    kiln_free(res);
    return rc;
}
