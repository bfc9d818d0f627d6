/*
 * test_cuda_e2e.c — the cuda backend on whole models (issue #17), label gpu.
 *
 *   test_cuda_e2e [MODEL.gguf ...]
 * Without arguments, the models in $KILN_E2E_DIR (default /tmp/kiln-e2e; each skipped,
 * with a message, when absent), as scripts/gpu-check.sh generates them with kiln-gen:
 *   tiny-<family>-<type>.gguf for the families llama, qwen2, qwen3, gemma3 and every
 *     weight type the cuda kernels take: against the ref backend (the oracle);
 *   llama-110m-<type>.gguf and gemma3-270m-q4_K.gguf: against the cpu backend (itself
 *     checked against ref by test_cpu_e2e: top-1 100 %, KL <= 3.4e-8), since the scalar
 *     ref backend takes minutes on them;
 * and the real models of the cache (~/.cache/kiln/models: Gemma 3 270M Q4_K_M with the
 * 12 greedy prompts of tests/data/parity/gemma3-270m-q4km/greedy.txt, 64 tokens each, at
 * least 11 identical to the cpu backend's; SmolLM2-135M-Instruct) when present.
 * Checks: teacher forcing over 512 tokens, top-1 >= 99.9 %, mean KL < 1e-4 (e2e.h);
 * batch invariance: under the deterministic policy (batch-invariant kernels only) a
 * sequence's logits alone equal, bitwise, its logits inside a batch of 64 sequences;
 * step graphs: decode steps replayed from captured graphs equal, bitwise, the same steps
 * run kernel by kernel.
 * Exits 77 (skipped), saying why, without a usable GPU or in a build without CUDA.
 */
#include "e2e.h"
#include "testutil.h"

#include "model/model.h"
#include "runtime/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef KILN_HAVE_CUDA
int main(void) {
    printf("SKIP: this build has no CUDA (KILN_CUDA=OFF)\n");
    return 77;
}
#else
#include "kernels/cuda/cuda_kernels.h"

#define NB     64 /* sequences in the batch */
#define PROMPT 20
#define DECODE 6

static kiln_engine *engine(const kiln_model *m, int max_seqs) {
    return kt_e2e_engine(m, "cuda", 0, 64 * NB, 512, max_seqs, false);
}

static int32_t tok(int s, int i, int nv) {
    return (int32_t)(((uint32_t)s * 2654435761u + (uint32_t)i * 40503u + 7u) % (uint32_t)nv);
}

/* Logits of sequence 0 (prompt, then DECODE teacher-forced tokens) stepped with nseq - 1
 * other sequences in every step; out: (1 + DECODE) rows of n_vocab. */
static int run_batch(const kiln_model *m, int nseq, float *out) {
    kiln_engine *e = engine(m, nseq);
    if (!e) return -1;
    const int nv = kiln_engine_n_vocab(e);
    int32_t seq[NB];
    kiln_err err;
    kiln_batch_entry *en = malloc(sizeof(*en) * (size_t)nseq * PROMPT);
    int rc = en ? 0 : -1;
    for (int s = 0; s < nseq && !rc; s++)
        if (kiln_seq_create(e, &seq[s], &err)) rc = -1;
    /* prefill: the prompts of up to 25 sequences per step (<= 500 tokens), sequence 0's
     * in the first step with its logits at its end */
    for (int s0 = 0; s0 < nseq && !rc; s0 += 25) {
        int n = 0;
        for (int s = s0; s < nseq && s < s0 + 25; s++)
            for (int i = 0; i < PROMPT; i++)
                en[n++] = (kiln_batch_entry){seq[s], tok(s, i, nv), i, s == 0 && i == PROMPT - 1};
        if (kiln_engine_prepare(e, en, n, NULL, &err) || kiln_engine_run(e, &err)) rc = -1;
        if (!rc && s0 == 0) memcpy(out, kiln_engine_logits(e, 0), sizeof(float) * (size_t)nv);
    }
    for (int d = 0; d < DECODE && !rc; d++) {
        for (int s = 0; s < nseq; s++)
            en[s] = (kiln_batch_entry){seq[s], tok(s, PROMPT + d, nv), PROMPT + d, s == 0};
        if (kiln_engine_prepare(e, en, nseq, NULL, &err) || kiln_engine_run(e, &err)) rc = -1;
        if (!rc)
            memcpy(out + (size_t)(d + 1) * nv, kiln_engine_logits(e, 0),
                   sizeof(float) * (size_t)nv);
    }
    if (rc) fprintf(stderr, "batch of %d: %s\n", nseq, err.msg);
    free(en);
    kiln_engine_free(e);
    return rc;
}

static int batch_invariance(const char *path) {
    int status;
    kiln_model *m = kt_e2e_load(path, "batch invariance: ", &status);
    if (!m) return status;
    const size_t nv = (size_t)m->cfg.n_vocab, rows = 1 + DECODE;
    float *alone = malloc(sizeof(float) * nv * rows), *mixed = malloc(sizeof(float) * nv * rows);
    int fails = 0;
    for (int det = 1; det >= 0 && alone && mixed; det--) {
        if (det) setenv("KILN_DETERMINISTIC", "1", 1);
        if (run_batch(m, 1, alone) || run_batch(m, NB, mixed)) {
            fails++;
        } else {
            size_t diff = 0;
            double maxd = 0;
            for (size_t i = 0; i < nv * rows; i++)
                if (memcmp(&alone[i], &mixed[i], sizeof(float))) {
                    diff++;
                    double d = fabs((double)alone[i] - mixed[i]);
                    if (d > maxd || isnan(d)) maxd = d;
                }
            const bool ok = !det || diff == 0;
            printf("batch invariance (%s policy), %s: alone vs in a batch of %d: %zu of %zu "
                   "logits differ (max |diff| %.3g) %s\n",
                   det ? "deterministic" : "default", path, NB, diff, nv * rows, maxd,
                   det ? (ok ? "ok" : "FAIL") : "(not required)");
            if (!ok) fails++;
        }
        unsetenv("KILN_DETERMINISTIC");
    }
    if (!alone || !mixed) fails++;
    free(alone), free(mixed);
    kiln_model_free(m);
    return fails;
}

/* Step graphs (runtime/graph.h): decode steps replayed from captured graphs give the
 * same logits, bitwise, as the same steps run kernel by kernel (KILN_GRAPHS=0); nseq
 * sequences stepped together (16: pure-decode steps of the 9-64 bucket, graphed by default
 * since session 19). out: n steps x nseq rows of n_vocab. */
static int decode_logits(const kiln_model *m, bool graphs, int nseq, int n, float *out,
                         uint64_t *replays) {
    if (!graphs) setenv("KILN_GRAPHS", "0", 1);
    kiln_engine *e = engine(m, nseq > 2 ? nseq : 2);
    unsetenv("KILN_GRAPHS");
    if (!e) return -1;
    const int nv = kiln_engine_n_vocab(e);
    int32_t s[16];
    kiln_err err;
    int rc = 0;
    kiln_batch_entry en[16 * PROMPT];
    for (int q = 0; q < nseq && !rc; q++) {
        rc = kiln_seq_create(e, &s[q], &err) ? -1 : 0;
        for (int i = 0; i < PROMPT; i++)
            en[q * PROMPT + i] = (kiln_batch_entry){s[q], tok(1 + q, i, nv), i, 0};
    }
    if (!rc && kiln_engine_step(e, en, nseq * PROMPT, NULL, &err)) rc = -1;
    for (int d = 0; d < n && !rc; d++) {
        for (int q = 0; q < nseq; q++)
            en[q] = (kiln_batch_entry){s[q], tok(100 + q, d, nv), PROMPT + d, 1};
        if (kiln_engine_step(e, en, nseq, out + (size_t)d * nseq * nv, &err)) rc = -1;
    }
    if (rc) fprintf(stderr, "decode (graphs %s): %s\n", graphs ? "on" : "off", err.msg);
    *replays = e->graphs.replays;
    kiln_engine_free(e);
    return rc;
}

static int graph_equivalence(const char *path, int nseq) {
    int status;
    kiln_model *m = kt_e2e_load(path, "graphs: ", &status);
    if (!m) return status;
    const int n = 40; /* crosses two KV block boundaries: new table strides, new graphs */
    const size_t cnt = (size_t)n * (size_t)nseq * (size_t)m->cfg.n_vocab;
    float *a = malloc(sizeof(float) * cnt), *b = malloc(sizeof(float) * cnt);
    uint64_t ra = 0, rb = 0;
    int fails = 0;
    if (!a || !b || decode_logits(m, true, nseq, n, a, &ra) ||
        decode_logits(m, false, nseq, n, b, &rb)) {
        fails++;
    } else {
        size_t diff = 0;
        for (size_t i = 0; i < cnt; i++) diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
        const bool ok = diff == 0 && ra > 0 && rb == 0;
        printf("graphs, %s, %d sequences: %d decode steps, %llu replayed; %zu of %zu logits "
               "differ from the steps run without graphs %s\n",
               path, nseq, n, (unsigned long long)ra, diff, cnt, ok ? "ok" : "FAIL");
        if (!ok) fails++;
    }
    free(a), free(b);
    kiln_model_free(m);
    return fails;
}

int main(int argc, char **argv) {
    char why[256] = "";
    if (kiln_cuda_probe(NULL, why, sizeof why) <= 0) {
        printf("SKIP: %s\n", why);
        return 77;
    }
    kt_e2e c = {.oracle = "ref",
                .backend = "cuda",
                .tokens = getenv("KILN_E2E_TOKENS") ? atoi(getenv("KILN_E2E_TOKENS")) : 512,
                .threads = 16};
    int failures = 0;
    char p[1024], greedy[1024];
    snprintf(greedy, sizeof greedy, "%s/tests/data/parity/gemma3-270m-q4km/greedy.txt",
             kt_source_dir());
    if (argc > 1) {
        c.oracle = "cpu";
        for (int i = 1; i < argc; i++) failures += kt_e2e_model(&c, argv[i]);
    } else {
        const char *dir = getenv("KILN_E2E_DIR") ? getenv("KILN_E2E_DIR") : "/tmp/kiln-e2e";
        static const char *const fam[] = {"llama", "qwen2", "qwen3", "gemma3"};
        static const char *const types[] = {"f32",  "f16",  "bf16", "q8_0", "q4_0", "q4_1",
                                            "q5_0", "q5_1", "q4_K", "q5_K", "q6_K"};
        for (size_t f = 0; f < 4; f++)
            for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
                snprintf(p, sizeof p, "%s/tiny-%s-%s.gguf", dir, fam[f], types[t]);
                failures += kt_e2e_model(&c, p);
            }
        c.oracle = "cpu";
        static const char *const big[] = {"llama-110m-f16", "llama-110m-q8_0", "llama-110m-q4_0",
                                          "llama-110m-q4_K", "gemma3-270m-q4_K"};
        for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
            snprintf(p, sizeof p, "%s/%s.gguf", dir, big[i]);
            failures += kt_e2e_model(&c, p);
        }
        const char *home = getenv("HOME") ? getenv("HOME") : "";
        snprintf(p, sizeof p, "%s/.cache/kiln/models/gemma-3-270m-q4_k_m.gguf", home);
        c.greedy_file = greedy;
        c.greedy_tokens = 64;
        c.greedy_min_same = 11;
        failures += kt_e2e_model(&c, p);
        c.greedy_file = NULL;
        snprintf(p, sizeof p, "%s/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf", home);
        failures += kt_e2e_model(&c, p);
        snprintf(p, sizeof p, "%s/tiny-qwen3-q4_K.gguf", dir);
        failures += batch_invariance(p);
        snprintf(p, sizeof p, "%s/llama-110m-q4_0.gguf", dir);
        failures += batch_invariance(p);
        failures += graph_equivalence(p, 1);
        failures += graph_equivalence(p, 16);
        snprintf(p, sizeof p, "%s/tiny-gemma3-q4_K.gguf", dir);
        failures += graph_equivalence(p, 1);
        failures += graph_equivalence(p, 16);
    }
    printf("%s\n", failures ? "FAILED" : "PASSED");
    return failures ? 1 : 0;
}
#endif /* KILN_HAVE_CUDA */
