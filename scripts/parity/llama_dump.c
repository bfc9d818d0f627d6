/*
 * llama_dump.c — produces kiln's parity goldens with llama.cpp's C API (libllama, built
 * beside kiln at /work/llama.cpp; this file only *uses* the library). Built and run by
 * scripts/parity/make_goldens.sh; its output is committed under tests/data/parity/.
 *
 *   llama_dump greedy MODEL PROMPTS N   one line per prompt (prompts file: one per line,
 *                                       "\n" escapes a newline):
 *                                       "P ids... | C ids... | G gaps..." — prompt ids
 *                                       (BOS per metadata), N greedy ids, top-2 logit gap
 *                                       at every step
 *   llama_dump tf MODEL TEXT N K        teacher forcing over the first N tokens of TEXT
 *                                       (BOS first): "T ids..." then per position i
 *                                       (predicting token i+1) "i id:logprob ..." top K
 * Greedy takes the lowest id among equal maxima. Threads: 2; flash attention off; f16 KV
 * (llama.cpp's default).
 */
#include "llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)level, (void)text, (void)user;
}

static struct llama_context *mkctx(struct llama_model *m, int n_ctx) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = (uint32_t)n_ctx;
    cp.n_ubatch = (uint32_t)n_ctx;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    /* flash attention off (the goldens); LLAMA_DUMP_FA=1 turns it on, to measure how far
     * llama.cpp moves from itself when only its attention kernel changes (docs/PLAN.md) */
    cp.flash_attn_type =
        getenv("LLAMA_DUMP_FA") ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;
    return llama_init_from_model(m, cp);
}

static int tokenize(const struct llama_vocab *v, const char *s, llama_token *out, int cap) {
    return llama_tokenize(v, s, (int32_t)strlen(s), out, cap, true, false);
}

static void argmax2(const float *l, int n, int *best, float *gap) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != b && l[i] > second) second = l[i];
    *best = b;
    *gap = l[b] - second;
}

static void unescape(char *s) {
    char *w = s;
    for (char *r = s; *r; r++) {
        if (r[0] == '\\' && r[1] == 'n') {
            *w++ = '\n';
            r++;
        } else if (*r != '\n') {
            *w++ = *r;
        }
    }
    *w = 0;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: llama_dump greedy MODEL PROMPTS N | tf MODEL TEXT N K\n");
        return 2;
    }
    llama_backend_init();
    llama_log_set(quiet, NULL);
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *m = llama_model_load_from_file(argv[2], mp);
    if (!m) return 1;
    const struct llama_vocab *v = llama_model_get_vocab(m);
    const int nv = llama_vocab_n_tokens(v);
    if (strcmp(argv[1], "greedy") == 0) {
        int n = atoi(argv[4]);
        FILE *f = fopen(argv[3], "r");
        if (!f) return 1;
        static char line[65536];
        while (fgets(line, sizeof line, f)) {
            unescape(line);
            if (!*line) continue;
            llama_token ids[4096];
            int np = tokenize(v, line, ids, 4096);
            if (np <= 0) return 1;
            struct llama_context *c = mkctx(m, np + n + 8);
            printf("P");
            for (int i = 0; i < np; i++) printf(" %d", ids[i]);
            int out[1024];
            float gaps[1024];
            struct llama_batch b = llama_batch_get_one(ids, np);
            for (int s = 0; s < n; s++) {
                if (llama_decode(c, b)) return 1;
                const float *lg = llama_get_logits_ith(c, -1);
                argmax2(lg, nv, &out[s], &gaps[s]);
                b = llama_batch_get_one(&out[s], 1);
            }
            printf(" | C");
            for (int s = 0; s < n; s++) printf(" %d", out[s]);
            printf(" | G");
            for (int s = 0; s < n; s++) printf(" %.6g", gaps[s]);
            printf("\n");
            llama_free(c);
        }
        fclose(f);
    } else if (strcmp(argv[1], "tf") == 0) {
        int n = atoi(argv[4]), k = atoi(argv[5]);
        FILE *f = fopen(argv[3], "rb");
        if (!f) return 1;
        fseek(f, 0, SEEK_END);
        long sz = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *text = malloc((size_t)sz + 1);
        if (fread(text, 1, (size_t)sz, f) != (size_t)sz) return 1;
        text[sz] = 0;
        fclose(f);
        llama_token *ids = malloc(sizeof(llama_token) * ((size_t)sz + 16));
        int nt = llama_tokenize(v, text, (int32_t)sz, ids, (int32_t)sz + 16, true, false);
        if (nt < n) {
            fprintf(stderr, "text has %d tokens, need %d\n", nt, n);
            return 1;
        }
        struct llama_context *c = mkctx(m, n);
        struct llama_batch b = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; i++) {
            b.token[i] = ids[i];
            b.pos[i] = i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
        }
        b.n_tokens = n;
        if (llama_decode(c, b)) return 1;
        printf("T");
        for (int i = 0; i < n; i++) printf(" %d", ids[i]);
        printf("\n");
        int *top = malloc(sizeof(int) * (size_t)k);
        for (int i = 0; i < n - 1; i++) {
            const float *lg = llama_get_logits_ith(c, i);
            float mx = lg[0];
            for (int j = 1; j < nv; j++)
                if (lg[j] > mx) mx = lg[j];
            double s = 0;
            for (int j = 0; j < nv; j++) s += exp((double)lg[j] - mx);
            double lse = mx + log(s);
            int nk = 0; /* top kept sorted by logit, descending; ties: lower id first */
            for (int j = 0; j < nv; j++) {
                if (nk == k && lg[j] <= lg[top[k - 1]]) continue;
                int p = nk < k ? nk++ : k - 1;
                while (p > 0 && lg[top[p - 1]] < lg[j]) {
                    top[p] = top[p - 1];
                    p--;
                }
                top[p] = j;
            }
            printf("%d", i);
            for (int t = 0; t < k; t++) printf(" %d:%.6f", top[t], lg[top[t]] - lse);
            printf("\n");
        }
        llama_batch_free(b);
        llama_free(c);
    }
    llama_model_free(m);
    return 0;
}
