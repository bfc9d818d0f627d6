/*
 * test_greedy_fused.c — greedy decoding through the fused LM head
 * (kiln_engine_step_greedy: matmul + argmax in one kernel, no logits stored) gives the
 * same tokens as the unfused path (kiln_engine_step's logits + the temperature-0
 * sampler), on real models, cpu backend, 2 threads.
 *
 *   test_greedy_fused [MODEL.gguf ...]
 * Without arguments: the real Gemma 3 270M Q4_K_M from the model cache and the
 * synthetic models in $KILN_BINARY_DIR/models/ and /work/models (each skipped, with a
 * message, when absent). Prompts: the token ids of tests/data/parity/gemma3-270m-q4km/
 * greedy.txt (taken modulo the vocabulary for other models); 32 tokens each.
 */
#include "model/model.h"
#include "runtime/engine.h"
#include "sample/sample.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int failures = 0;

static kiln_engine *make_engine(kiln_model *m) {
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.backend = "cpu";
    o.n_threads = 2;
    o.n_ctx = 1024;
    o.max_step_tokens = 64;
    o.max_seqs = 2;
    o.kv_f16 = true;
    kiln_engine *e;
    kiln_err err;
    if (kiln_engine_create(m, &o, &e, &err)) {
        fprintf(stderr, "engine: %s\n", err.msg);
        return NULL;
    }
    return e;
}

/* 32 greedy tokens after the prompt; fused: through kiln_engine_step_greedy */
static int generate(kiln_engine *e, kiln_sampler *smp, const int32_t *prompt, int np, bool fused,
                    int32_t *out, float *logits) {
    int32_t s;
    kiln_err err;
    if (kiln_seq_create(e, &s, &err)) return -1;
    kiln_batch_entry be[64];
    for (int i = 0; i < np; i++) be[i] = (kiln_batch_entry){s, prompt[i], i, i == np - 1};
    int32_t id;
    kiln_status st = fused ? kiln_engine_step_greedy(e, be, np, 0, &id, &err)
                           : kiln_engine_step(e, be, np, logits, &err);
    for (int g = 0; !st && g < 32; g++) {
        if (!fused) id = kiln_sampler_sample(smp, logits, e->model->cfg.n_vocab);
        out[g] = id;
        kiln_batch_entry b = {s, id, np + g, 1};
        if (g + 1 < 32)
            st = fused ? kiln_engine_step_greedy(e, &b, 1, 0, &id, &err)
                       : kiln_engine_step(e, &b, 1, logits, &err);
    }
    if (st) fprintf(stderr, "step: %s\n", err.msg);
    kiln_seq_free(e, s);
    return st ? -1 : 0;
}

static void check_model(const char *path, const char *prompts) {
    struct stat sb;
    if (stat(path, &sb)) {
        printf("%s: absent, skipped\n", path);
        return;
    }
    kiln_model *m;
    kiln_err err;
    if (kiln_model_load(path, &m, &err)) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        failures++;
        return;
    }
    const int nv = m->cfg.n_vocab;
    kiln_engine *e = make_engine(m);
    float *logits = malloc(sizeof(float) * (size_t)nv);
    kiln_sampler_params sp;
    kiln_sampler_params_default(&sp);
    sp.temperature = 0;
    kiln_sampler *smp = NULL;
    if (!e || !logits || kiln_sampler_create(&sp, nv, &smp, &err)) {
        failures++;
        goto done;
    }
    char *txt = strdup(prompts), *save = NULL;
    int same = 0, n = 0;
    for (char *line = strtok_r(txt, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] != 'P') continue;
        int32_t prompt[64];
        int np = 0;
        char *q = line + 1;
        while (np < 64) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q) break;
            prompt[np++] = (int32_t)(v % nv);
            q = end;
        }
        int32_t a[32], b[32];
        if (generate(e, smp, prompt, np, false, a, logits) ||
            generate(e, smp, prompt, np, true, b, logits)) {
            failures++;
            break;
        }
        n++;
        if (!memcmp(a, b, sizeof a)) {
            same++;
        } else {
            int d = 0;
            while (a[d] == b[d]) d++;
            printf("%s: prompt %d diverges at token %d (unfused %d, fused %d)\n", path, n, d, a[d],
                   b[d]);
        }
    }
    printf("%s: fused greedy LM head: %d / %d prompts identical to the unfused path for 32 "
           "tokens %s\n",
           path, same, n, same == n && n > 0 ? "ok" : "FAIL");
    if (same != n || n == 0) failures++;
    free(txt);
done:
    kiln_sampler_free(smp);
    free(logits);
    kiln_engine_free(e);
    kiln_model_free(m);
}

int main(int argc, char **argv) {
    const char *src = getenv("KILN_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/parity/gemma3-270m-q4km/greedy.txt",
             src ? src : ".");
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("%s absent: nothing to test\n", path);
        return 0;
    }
    static char prompts[1 << 20];
    size_t len = fread(prompts, 1, sizeof prompts - 1, f);
    prompts[len] = 0;
    fclose(f);
    if (argc > 1) {
        for (int i = 1; i < argc; i++) check_model(argv[i], prompts);
    } else {
        const char *home = getenv("HOME"), *bin = getenv("KILN_BINARY_DIR");
        snprintf(path, sizeof path, "%s/.cache/kiln/models/gemma-3-270m-q4_k_m.gguf",
                 home ? home : ".");
        check_model(path, prompts);
        static const char *const synth[] = {"llama-110m-q4_0", "llama-110m-q8_0", "llama-110m-q4_K",
                                            "llama-110m-f16"};
        for (size_t i = 0; i < sizeof synth / sizeof synth[0]; i++) {
            snprintf(path, sizeof path, "%s/models/%s.gguf", bin ? bin : ".", synth[i]);
            struct stat sb;
            if (stat(path, &sb)) snprintf(path, sizeof path, "/work/models/%s.gguf", synth[i]);
            check_model(path, prompts);
        }
    }
    printf("%s\n", failures ? "FAILED" : "passed");
    return failures ? 1 : 0;
}
