/*
 * kiln_tf.c — kiln's side of a teacher-forced comparison, in llama_dump's "tf" format, so
 * two kiln variants (numerics, kernels, a patched summation order) can be compared with
 * each other as well as with llama.cpp's golden (scripts/parity/tf_compare.py).
 *
 *   cc -O2 -o /tmp/kiln_tf scripts/parity/kiln_tf.c -Iinclude -Isrc build/libkiln.a \
 *      $(pkg-config --libs jansson yaml-0.1 sqlite3 libpcre2-8 libutf8proc liburing \
 *      libmicrohttpd libxxhash) -lpthread -ldl -lm
 *   kiln_tf MODEL exact|ggml GOLDEN_TF > OUT     (the tokens are GOLDEN_TF's "T" line)
 *
 * One step over all tokens on the ref backend (f32 KV), top-20 log-probs per position.
 */
#include "model/model.h"
#include "runtime/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: kiln_tf MODEL exact|ggml GOLDEN_TF\n");
        return 2;
    }
    kiln_model *m;
    kiln_err err;
    if (kiln_model_load(argv[1], &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    FILE *f = fopen(argv[3], "r");
    static char line[1 << 20];
    if (!f || !fgets(line, sizeof line, f) || line[0] != 'T') return 1;
    fclose(f);
    int32_t toks[4096];
    int n = 0;
    for (char *tk = strtok(line + 1, " \n"); tk && n < 4096; tk = strtok(NULL, " \n"))
        toks[n++] = atoi(tk);
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.numerics = argv[2];
    o.n_ctx = 4096;
    o.max_step_tokens = n;
    o.max_seqs = 2;
    kiln_engine *e;
    if (kiln_engine_create(m, &o, &e, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int V = m->cfg.n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)n);
    kiln_batch_entry *b = malloc(sizeof(*b) * (size_t)n);
    int32_t seq;
    if (!lg || !b || kiln_seq_create(e, &seq, &err)) return 1;
    for (int i = 0; i < n; i++) b[i] = (kiln_batch_entry){seq, toks[i], i, 1};
    if (kiln_engine_step(e, b, n, lg, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("T");
    for (int i = 0; i < n; i++) printf(" %d", toks[i]);
    printf("\n");
    for (int i = 0; i < n - 1; i++) {
        const float *l = lg + (size_t)i * V;
        float mx = l[0];
        for (int j = 1; j < V; j++) mx = l[j] > mx ? l[j] : mx;
        double s = 0;
        for (int j = 0; j < V; j++) s += exp((double)l[j] - mx);
        const double lse = mx + log(s);
        int top[20], nk = 0; /* sorted by logit, descending; ties: lower id first */
        for (int j = 0; j < V; j++) {
            if (nk == 20 && l[j] <= l[top[19]]) continue;
            int p = nk < 20 ? nk++ : 19;
            while (p > 0 && l[top[p - 1]] < l[j]) {
                top[p] = top[p - 1];
                p--;
            }
            top[p] = j;
        }
        printf("%d", i);
        for (int t = 0; t < 20; t++) printf(" %d:%.6f", top[t], l[top[t]] - lse);
        printf("\n");
    }
    free(lg);
    free(b);
    kiln_engine_free(e);
    kiln_model_free(m);
    return 0;
}
