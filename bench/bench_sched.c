/*
 * bench_sched.c — the scheduler's speed (issue #12 "Speed"; results in docs/PERF.md).
 *
 *   bench_sched -m MODEL [-b cpu|ref|cuda] [-t THREADS] [--mode all|overhead|decode|ttft|starve]
 *               [--npl 1,4,16,64] [--pp 128] [--tg 128] [--step-tokens N] [--reps N]
 *               [--latency-tokens N] [--trace FILE] [--tp N]
 *
 * overhead  64 concurrent requests decoding: host time per step outside the engine step
 *           (admission, planning, sampling, detokenizing, streaming, ledger), per step:
 *           p50 / p99 / mean, greedy (fused pick) and sampled (temperature 0.8, top-k 40),
 *           over the real engine and over a fake engine (tests/unit/test_sched_fake.h,
 *           vocabulary 32000) whose step costs little, so the machine's other load and the
 *           engine's cache footprint blur the scheduler's own time less
 * decode    N concurrent requests of pp prompt tokens each generating tg tokens:
 *           aggregate decode tok/s = N * (tg - 1) / (time from the last first token to the
 *           last token) — the quantity llama-batched-bench reports as S_TG for npl = N
 * ttft      a pp-token prompt whose first pp - 16 tokens are in the prefix cache vs the
 *           same shape cold (a fresh prefix each rep), median over --reps, alternating
 * starve    16 slots: one interactive request decoding 256 tokens while a batch tenant
 *           keeps the other 15 slots busy with new requests (prompts of 64..191 tokens,
 *           32 tokens each); interactive inter-token p50 / p99 and their ratio
 */
#include "base/timer.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "sched/sched_impl.h"
#include "tok/tok.h"

#include "../tests/unit/test_sched_fake.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rq_out {
    int32_t n;
    int finals;
    uint64_t t_first, t_last;
} rq_out;

static kiln_sink_result sink(void *user, const kiln_token_event *ev) {
    rq_out *o = user;
    uint64_t now = kiln_now_ns();
    if (ev->token >= 0) {
        if (!o->n) o->t_first = now;
        o->n++;
        o->t_last = now;
    }
    if (ev->finish) o->finals++;
    return KILN_SINK_OK;
}

static kiln_model *M;
static const char *BACKEND = "cpu";
static int THREADS = 2, STEP_TOKENS = 0, REPS = 5, LATENCY_TOKENS = 0, TP = 1;
static const char *TRACE = NULL;
static uint64_t rng_s = 88172645463325252ull;

static uint32_t rnd(void) {
    rng_s ^= rng_s << 13, rng_s ^= rng_s >> 7, rng_s ^= rng_s << 17;
    return (uint32_t)rng_s;
}

static kiln_engine *mk_engine(int32_t max_seqs, int64_t n_ctx) {
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.backend = BACKEND;
    o.n_threads = THREADS;
    o.n_ctx = n_ctx;
    o.max_seqs = max_seqs;
    o.max_step_tokens = 512;
    o.tp = TP;
    kiln_engine *e = NULL;
    kiln_err err;
    if (kiln_engine_create(M, &o, &e, &err)) {
        fprintf(stderr, "engine: %s\n", err.msg);
        exit(1);
    }
    return e;
}

static kiln_sched *mk_sched(kiln_engine *e, int32_t slots, const kiln_tenant_config *t, int nt) {
    kiln_sched_opts o;
    kiln_sched_opts_default(&o);
    o.max_slots = slots;
    o.step_tokens = STEP_TOKENS;
    o.latency_step_tokens = LATENCY_TOKENS;
    o.trace_path = TRACE;
    o.max_queued = 100000;
    kiln_sched *s = NULL;
    kiln_err err;
    if (kiln_sched_create(e, M->vocab, &o, &s, &err)) {
        fprintf(stderr, "sched: %s\n", err.msg);
        exit(1);
    }
    for (int i = 0; i < nt; i++)
        if (kiln_sched_add_tenant(s, &t[i], &err)) {
            fprintf(stderr, "tenant: %s\n", err.msg);
            exit(1);
        }
    return s;
}

static void submit(kiln_sched *s, const char *tenant, const int32_t *p, int32_t n, int32_t max,
                   float temp, rq_out *o) {
    kiln_request_params rp;
    kiln_request_params_default(&rp);
    rp.tenant = tenant;
    rp.prompt = p;
    rp.n_prompt = n;
    rp.max_tokens = max;
    rp.ignore_eos = true;
    rp.sampling.temperature = temp;
    rp.sampling.top_k = 40;
    rp.sampling.seed = rnd();
    rp.sink = sink;
    rp.user = o;
    kiln_err err;
    if (kiln_sched_submit(s, &rp, NULL, NULL, &err)) {
        fprintf(stderr, "submit: %s\n", err.msg);
        exit(1);
    }
}

static void step(kiln_sched *s, bool *w) {
    kiln_err err;
    if (kiln_sched_step(s, w, &err)) {
        fprintf(stderr, "step: %s\n", err.msg);
        exit(1);
    }
}

static void rand_prompt(int32_t *p, int32_t n) {
    int32_t nv = M->cfg.n_vocab;
    if (M->vocab && (int32_t)kiln_vocab_n_tokens(M->vocab) < nv)
        nv = (int32_t)kiln_vocab_n_tokens(M->vocab);
    for (int32_t i = 0; i < n; i++) p[i] = 100 + (int32_t)(rnd() % (uint32_t)(nv - 200));
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double q) {
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return v[(int)((n - 1) * q + 0.5)];
}

/* ---- overhead ---- */
static void overhead(void) {
    printf("\n## scheduler overhead per step, 64 requests decoding (host time outside the "
           "engine step)\n\n");
    printf("| engine | sampling | steps | p50 us | p99 us | mean us | step ms |\n"
           "|---|---|---|---|---|---|---|\n");
    for (int mode = 0; mode < 4; mode++) {
        bool fake = mode >= 2;
        kiln_engine *e = NULL;
        kiln_sched *s = NULL;
        fake_engine fe;
        kiln_sched_engine se;
        if (fake) {
            fake_init(&fe, &se, 32000, 64, 512, 64 * 20 + 64);
            kiln_sched_opts o;
            kiln_sched_opts_default(&o);
            o.max_slots = 64;
            kiln_err err;
            if (kiln_sched_create_with(&se, M->vocab, &o, &s, &err)) {
                fprintf(stderr, "sched: %s\n", err.msg);
                exit(1);
            }
        } else {
            e = mk_engine(64, 64 * 300);
            s = mk_sched(e, 64, NULL, 0);
        }
        static rq_out o[64];
        static int32_t p[64][32];
        memset(o, 0, sizeof(o));
        for (int i = 0; i < 64; i++) {
            rand_prompt(p[i], 32);
            submit(s, NULL, p[i], 32, 200, mode & 1 ? 0.8f : 0.0f, &o[i]);
        }
        bool w = true;
        for (int i = 0; i < 10; i++) step(s, &w); /* prefill, then decode-only steps */
        double us[200];
        int n = 0;
        const int want = fake ? 150 : 40; /* the real engine's steps are slow */
        kiln_sched_stats a, b;
        uint64_t t0 = kiln_now_ns();
        while (n < want) {
            kiln_sched_stats_get(s, &a);
            step(s, &w);
            kiln_sched_stats_get(s, &b);
            if (b.decode_tokens - a.decode_tokens != 64 || b.prefill_tokens != a.prefill_tokens)
                continue;
            us[n++] = b.sched_us_last;
        }
        double step_ms = (double)(kiln_now_ns() - t0) * 1e-6 / n;
        double mean = 0;
        for (int i = 0; i < n; i++) mean += us[i];
        mean /= n;
        printf("| %s | %s | %d | %.1f | %.1f | %.1f | %.2f |\n", fake ? "fake" : BACKEND,
               mode & 1 ? "temp 0.8 top-k 40" : "greedy (fused)", n, pct(us, n, 0.5),
               pct(us, n, 0.99), mean, step_ms);
        fflush(stdout);
        kiln_sched_free(s);
        if (fake)
            fake_free(&fe);
        else
            kiln_engine_free(e);
    }
}

/* ---- aggregate decode ---- */
static void decode(const int *npl, int n_npl, int pp, int tg) {
    printf("\n## aggregate decode, %d-token prompts, %d generated each (S_TG as "
           "llama-batched-bench)\n\n",
           pp, tg);
    printf("| N | prefill s | decode s | decode tok/s | steps |\n|---|---|---|---|---|\n");
    for (int k = 0; k < n_npl; k++) {
        int N = npl[k];
        kiln_engine *e = mk_engine(N, (int64_t)N * (pp + tg + 32));
        kiln_sched *s = mk_sched(e, N, NULL, 0);
        rq_out *o = calloc((size_t)N, sizeof(rq_out));
        int32_t *p = malloc((size_t)N * (size_t)pp * sizeof(int32_t));
        for (int i = 0; i < N; i++) rand_prompt(p + (size_t)i * pp, pp);
        uint64_t t0 = kiln_now_ns();
        for (int i = 0; i < N; i++) submit(s, NULL, p + (size_t)i * pp, pp, tg, 0, &o[i]);
        bool w = true;
        while (w) step(s, &w);
        uint64_t first = 0, last = 0;
        for (int i = 0; i < N; i++) {
            if (o[i].t_first > first) first = o[i].t_first;
            if (o[i].t_last > last) last = o[i].t_last;
        }
        kiln_sched_stats st;
        kiln_sched_stats_get(s, &st);
        double dec_s = (double)(last - first) * 1e-9;
        printf("| %d | %.3f | %.3f | %.1f | %llu |\n", N, (double)(first - t0) * 1e-9, dec_s,
               (double)N * (tg - 1) / dec_s, (unsigned long long)st.steps);
        fflush(stdout);
        free(o);
        free(p);
        kiln_sched_free(s);
        kiln_engine_free(e);
    }
}

/* ---- TTFT with a cached prefix ---- */
static double one_ttft(kiln_sched *s, const int32_t *p, int32_t n, int32_t *cached) {
    rq_out o = {0};
    uint64_t t0 = kiln_now_ns();
    submit(s, NULL, p, n, 1, 0, &o);
    bool w = true;
    while (w) step(s, &w);
    kiln_tenant_usage u;
    kiln_sched_usage(s, NULL, &u, NULL);
    (void)cached;
    return (double)(o.t_first - t0) * 1e-6;
}

static void ttft(int pp) {
    kiln_engine *e = mk_engine(4, 8192);
    kiln_sched *s = mk_sched(e, 4, NULL, 0);
    double cold[32], warm[32];
    int reps = REPS > 32 ? 32 : REPS;
    int32_t *p = malloc((size_t)pp * sizeof(int32_t));
    for (int r = 0; r < reps; r++) {
        /* cold: a fresh prompt; then warm: same first pp-16 tokens, new last 16 */
        rand_prompt(p, pp);
        kiln_tenant_usage u0, u1;
        kiln_sched_usage(s, NULL, &u0, NULL);
        cold[r] = one_ttft(s, p, pp, NULL);
        rand_prompt(p + pp - 16, 16);
        warm[r] = one_ttft(s, p, pp, NULL);
        kiln_sched_usage(s, NULL, &u1, NULL);
        if (u1.prefix_hit_tokens - u0.prefix_hit_tokens != (uint64_t)(pp - 16)) {
            fprintf(stderr, "ttft: expected %d cached tokens, got %llu\n", pp - 16,
                    (unsigned long long)(u1.prefix_hit_tokens - u0.prefix_hit_tokens));
            exit(1);
        }
    }
    double c = pct(cold, reps, 0.5), w = pct(warm, reps, 0.5);
    printf("\n## TTFT, %d-token prompt, %d tokens cached vs cold (median of %d)\n\n", pp, pp - 16,
           reps);
    printf("| cold ms | cached ms | ratio |\n|---|---|---|\n| %.2f | %.2f | %.2f |\n", c, w, w / c);
    free(p);
    kiln_sched_free(s);
    kiln_engine_free(e);
}

/* ---- no starvation ---- */
static void starve(void) {
    kiln_tenant_config t[2];
    kiln_tenant_config_default(&t[0]);
    t[0].id = "inter";
    t[0].qos = KILN_QOS_INTERACTIVE;
    kiln_tenant_config_default(&t[1]);
    t[1].id = "bulk";
    t[1].qos = KILN_QOS_BATCH;
    kiln_engine *e = mk_engine(16, 16 * 600);
    kiln_sched *s = mk_sched(e, 16, t, 2);
    static rq_out bo[4096];
    static int32_t bp[4096][192];
    int nb = 0;
    rq_out io = {0};
    int32_t ip[64];
    rand_prompt(ip, 64);
    /* fill the batch slots first, then the interactive request arrives */
    for (; nb < 15; nb++) {
        int32_t n = 64 + (int32_t)(rnd() % 128);
        rand_prompt(bp[nb], n);
        submit(s, "bulk", bp[nb], n, 32, 0, &bo[nb]);
    }
    bool w = true;
    for (int i = 0; i < 8; i++) step(s, &w);
    submit(s, "inter", ip, 64, 256, 0, &io);
    while (!io.finals) {
        /* keep 15 batch requests in flight */
        int live = 0;
        for (int i = 0; i < nb; i++) live += !bo[i].finals;
        while (live < 15 && nb < 4096) {
            int32_t n = 64 + (int32_t)(rnd() % 128);
            rand_prompt(bp[nb], n);
            submit(s, "bulk", bp[nb], n, 32, 0, &bo[nb]);
            nb++;
            live++;
        }
        step(s, &w);
    }
    kiln_tenant_usage u, b;
    kiln_sched_usage(s, "inter", &u, NULL);
    kiln_sched_usage(s, "bulk", &b, NULL);
    printf("\n## no starvation: 16 slots, 1 interactive request (256 tokens) + batch saturating "
           "15 slots (%d batch requests, prompts 64..191, 32 tokens each)\n\n",
           nb);
    printf("| latency step tokens | inter ITL p50 ms | p99 ms | p99/p50 | inter TTFT ms | batch "
           "tokens | batch preempted |\n|---|---|---|---|---|---|---|\n");
    printf("| %d | %.2f | %.2f | %.2f | %.1f | %llu | %llu |\n", s->latency_tokens,
           u.inter_token_ms.p50, u.inter_token_ms.p99, u.inter_token_ms.p99 / u.inter_token_ms.p50,
           u.ttft_ms.p50, (unsigned long long)b.tokens_generated,
           (unsigned long long)b.requests_preempted);
    kiln_sched_free(s);
    kiln_engine_free(e);
}

int main(int argc, char **argv) {
    const char *model = NULL, *mode = "all", *npl_s = "1,4,16,64";
    int pp = 128, tg = 128;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "%s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "-m"))
            model = v;
        else if (!strcmp(a, "-b"))
            BACKEND = v;
        else if (!strcmp(a, "-t"))
            THREADS = atoi(v);
        else if (!strcmp(a, "--mode"))
            mode = v;
        else if (!strcmp(a, "--npl"))
            npl_s = v;
        else if (!strcmp(a, "--pp"))
            pp = atoi(v);
        else if (!strcmp(a, "--tg"))
            tg = atoi(v);
        else if (!strcmp(a, "--step-tokens"))
            STEP_TOKENS = atoi(v);
        else if (!strcmp(a, "--latency-tokens"))
            LATENCY_TOKENS = atoi(v);
        else if (!strcmp(a, "--reps"))
            REPS = atoi(v);
        else if (!strcmp(a, "--tp"))
            TP = atoi(v);
        else if (!strcmp(a, "--trace"))
            TRACE = v;
        else {
            fprintf(stderr, "unknown argument %s\n", a);
            return 2;
        }
        i++;
    }
    if (!model || pp < 32 || tg < 2 || REPS < 1 || TP < 1) {
        fprintf(stderr, "usage: bench_sched -m MODEL [-b cpu|ref|cuda] [-t THREADS] [--mode "
                        "all|overhead|decode|ttft|starve] [--npl 1,4,16,64] [--pp 128] [--tg 128] "
                        "[--step-tokens N] [--latency-tokens N] [--reps N] [--trace FILE] "
                        "[--tp N]\n");
        return 2;
    }
    kiln_err err;
    if (kiln_model_load(model, &M, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (kiln_model_load_vocab(M, &err)) fprintf(stderr, "no vocabulary (%s): no text\n", err.msg);
    printf("bench_sched: %s, backend %s, %d threads, step tokens %d\n", model, BACKEND, THREADS,
           STEP_TOKENS);
    bool all = !strcmp(mode, "all");
    if (all || !strcmp(mode, "overhead")) overhead();
    if (all || !strcmp(mode, "decode")) {
        int npl[16], n = 0;
        for (const char *c = npl_s; *c && n < 16;) {
            npl[n++] = atoi(c);
            const char *comma = strchr(c, ',');
            if (!comma) break;
            c = comma + 1;
        }
        decode(npl, n, pp, tg);
    }
    if (all || !strcmp(mode, "ttft")) ttft(pp);
    if (all || !strcmp(mode, "starve")) starve();
    kiln_model_free(M);
    return 0;
}
