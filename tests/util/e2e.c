/*
 * e2e.c — whole-model comparisons of a backend against an oracle backend (e2e.h).
 */
#include "e2e.h"

#include "base/timer.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "tok/tok.h"
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define STEP 64

kiln_engine *kt_e2e_engine(const kiln_model *m, const char *backend, int threads, int64_t n_ctx,
                           int max_step, int max_seqs, bool kv_f16) {
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.backend = backend;
    o.n_threads = threads;
    o.n_ctx = n_ctx;
    o.max_step_tokens = max_step;
    o.max_seqs = max_seqs;
    o.kv_f16 = kv_f16;
    kiln_engine *e;
    kiln_err err;
    if (kiln_engine_create(m, &o, &e, &err)) {
        fprintf(stderr, "engine %s: %s\n", backend, err.msg);
        return NULL;
    }
    return e;
}

static kiln_engine *make_engine(const kt_e2e *c, kiln_model *m, const char *backend) {
    return kt_e2e_engine(m, backend, c->threads > 0 ? c->threads : 2, 1024, STEP, 2, c->kv_f16);
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0) s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

static int argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

/* KL(p || q) of softmax(a), softmax(b); NaN anywhere gives +inf. */
static double kl(const float *a, const float *b, int n) {
    double ma = a[0], mb = b[0];
    for (int i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        if (a[i] > ma) ma = a[i];
        if (b[i] > mb) mb = b[i];
    }
    double za = 0, zb = 0;
    for (int i = 0; i < n; i++) {
        za += exp(a[i] - ma);
        zb += exp(b[i] - mb);
    }
    double lza = log(za) + ma, lzb = log(zb) + mb, k = 0;
    for (int i = 0; i < n; i++) {
        double la = a[i] - lza, lb = b[i] - lzb;
        k += exp(la) * (la - lb);
    }
    return k;
}

static int teacher_forced(const kt_e2e *c, kiln_model *m, const char *name, const int32_t *ids,
                          int n) {
    kiln_engine *er = make_engine(c, m, c->oracle), *ec = make_engine(c, m, c->backend);
    const int nv = m->cfg.n_vocab;
    float *lr = malloc(sizeof(float) * (size_t)nv * STEP);
    float *lc = malloc(sizeof(float) * (size_t)nv * STEP);
    int fails = 0;
    if (!er || !ec || !lr || !lc) {
        fails++;
        goto out;
    }
    kiln_batch_entry be[STEP];
    int32_t sr, sc;
    kiln_err err;
    if (kiln_seq_create(er, &sr, &err) || kiln_seq_create(ec, &sc, &err)) {
        fprintf(stderr, "%s: seq_create: %s\n", name, err.msg);
        fails++;
        goto out;
    }
    int agree = 0, ties = 0, total = 0;
    double klsum = 0, klmax = 0, tr = 0, tc = 0;
    for (int p = 0; p < n; p += STEP) {
        int cnt = n - p < STEP ? n - p : STEP;
        for (int i = 0; i < cnt; i++) be[i] = (kiln_batch_entry){sr, ids[p + i], p + i, 1};
        uint64_t t0 = kiln_now_ns();
        if (kiln_engine_step(er, be, cnt, lr, &err)) {
            fprintf(stderr, "%s %s step: %s\n", name, c->oracle, err.msg);
            fails++;
            break;
        }
        tr += kiln_elapsed_ms(t0);
        for (int i = 0; i < cnt; i++) be[i].seq = sc;
        for (size_t i = 0; i < (size_t)nv * (size_t)cnt; i++) lc[i] = NAN; /* poisoned */
        t0 = kiln_now_ns();
        if (kiln_engine_step(ec, be, cnt, lc, &err)) {
            fprintf(stderr, "%s %s step: %s\n", name, c->backend, err.msg);
            fails++;
            break;
        }
        tc += kiln_elapsed_ms(t0);
        for (int i = 0; i < cnt; i++) {
            const float *a = lr + (size_t)i * nv, *b = lc + (size_t)i * nv;
            const int ia = argmax(a, nv), ib = argmax(b, nv);
            if (ia == ib) {
                agree++;
            } else {
                /* a tie: the oracle's two candidates are closer than twice the largest
                 * difference between the backends' logits of this row (rounding order can
                 * pick either), and the rows themselves agree to 1e-3 of the top logit (a
                 * backend that is far off gets no ties: its flips count as misses) */
                double dmax = 0;
                for (int j = 0; j < nv; j++) {
                    double d = fabs((double)a[j] - b[j]);
                    if (d > dmax) dmax = d;
                }
                const double scale = fabs((double)a[ia]) > 1 ? fabs((double)a[ia]) : 1;
                if ((double)a[ia] - a[ib] <= 2 * dmax && dmax <= 1e-3 * scale) ties++;
            }
            double k = kl(a, b, nv);
            klsum += k;
            if (k > klmax) klmax = k;
            total++;
        }
    }
    /* top-1 over the positions that are not ties (the goal is >= 99.9 %) */
    const int decided = total - ties;
    double top1 = total ? (double)agree / total : 0, mkl = total ? klsum / total : 1;
    double top1d = decided ? (double)agree / decided : 0;
    /* ties are rare where the rows agree: more than 1 % of positions is not rounding */
    bool ok = !fails && total == n && top1d >= 0.999 && mkl < 1e-4 && ties * 100 <= total;
    printf("%s: %s vs %s, teacher-forced %d tokens: top-1 agreement %.2f %% (%.2f %% of %d "
           "outside %d ties), mean KL %.3g, max KL %.3g (%s %.0f ms, %s %.0f ms) %s\n",
           name, c->backend, c->oracle, total, 100 * top1, 100 * top1d, decided, ties, mkl, klmax,
           c->oracle, tr, c->backend, tc, ok ? "ok" : "FAIL");
    if (!ok && !fails) fails++;
out:
    free(lr), free(lc);
    kiln_engine_free(er), kiln_engine_free(ec);
    return fails;
}

static int greedy(kiln_engine *e, const int32_t *prompt, int np, int ngen, int32_t *out,
                  float *logits) {
    int32_t s;
    kiln_err err;
    if (kiln_seq_create(e, &s, &err)) return -1;
    kiln_batch_entry be[STEP];
    for (int i = 0; i < np; i++) be[i] = (kiln_batch_entry){s, prompt[i], i, i == np - 1};
    int rc = kiln_engine_step(e, be, np, logits, &err) ? -1 : 0;
    for (int g = 0; g < ngen && !rc; g++) {
        out[g] = argmax(logits, kiln_engine_n_vocab(e));
        kiln_batch_entry b = {s, out[g], np + g, 1};
        if (g + 1 < ngen && kiln_engine_step(e, &b, 1, logits, &err)) rc = -1;
    }
    if (rc) fprintf(stderr, "greedy: %s\n", err.msg);
    kiln_seq_free(e, s);
    return rc;
}

static int greedy_prompts(const kt_e2e *c, kiln_model *m, const char *name) {
    char *txt = read_text(c->greedy_file);
    if (!txt) {
        printf("%s: greedy: %s absent, skipped\n", name, c->greedy_file);
        return 0;
    }
    const int ng = c->greedy_tokens > 0 && c->greedy_tokens <= 64 ? c->greedy_tokens : 16;
    kiln_engine *er = make_engine(c, m, c->oracle), *ec = make_engine(c, m, c->backend);
    float *logits = malloc(sizeof(float) * (size_t)m->cfg.n_vocab);
    int same = 0, n = 0, fails = 0;
    char *save = NULL;
    for (char *line = strtok_r(txt, "\n", &save); line && er && ec && logits;
         line = strtok_r(NULL, "\n", &save)) {
        if (line[0] != 'P') continue;
        int32_t prompt[STEP];
        int np = 0;
        char *q = line + 1;
        while (np < STEP) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q) break;
            prompt[np++] = (int32_t)v;
            q = end;
        }
        int32_t a[64], b[64];
        if (greedy(er, prompt, np, ng, a, logits) || greedy(ec, prompt, np, ng, b, logits)) {
            fails++;
            break;
        }
        n++;
        if (!memcmp(a, b, sizeof(int32_t) * (size_t)ng)) {
            same++;
        } else {
            int d = 0;
            while (a[d] == b[d]) d++;
            printf("%s: greedy prompt %d diverges at token %d (%s %d, %s %d)\n", name, n, d,
                   c->oracle, a[d], c->backend, b[d]);
        }
    }
    const int need = c->greedy_min_same >= 0 ? c->greedy_min_same : n;
    const bool ok = !fails && n > 0 && same >= need;
    printf("%s: greedy %s vs %s: %d / %d prompts identical for %d tokens (need %d) %s\n", name,
           c->backend, c->oracle, same, n, ng, need, ok ? "ok" : "FAIL");
    if (!ok && !fails) fails++;
    if (!er || !ec || !logits) fails++;
    free(logits), free(txt);
    kiln_engine_free(er), kiln_engine_free(ec);
    return fails;
}

kiln_model *kt_e2e_load(const char *path, const char *what, int *status) {
    struct stat st;
    *status = 0;
    if (stat(path, &st)) {
        printf("%s%s: absent, skipped\n", what, path);
        return NULL;
    }
    kiln_model *m;
    kiln_err err;
    if (kiln_model_load(path, &m, &err)) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        *status = 1;
        return NULL;
    }
    return m;
}

int kt_e2e_model(const kt_e2e *c, const char *path) {
    int status;
    kiln_model *m = kt_e2e_load(path, "", &status);
    if (!m) return status;
    kiln_err err;
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    int n = c->tokens > 0 && c->tokens <= 512 ? c->tokens : 512, fails = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    kiln_tokens toks = {0};
    char tp[1024];
    snprintf(tp, sizeof tp, "%s/tests/data/parity/text.txt", kt_source_dir());
    char *text = read_text(tp);
    bool have = false;
    if (ids && text && !kiln_model_load_vocab(m, &err) &&
        !kiln_tokenize(m->vocab, text, strlen(text), KILN_TOK_ADD_SPECIAL, &toks, &err) &&
        (int)toks.n >= n) {
        memcpy(ids, toks.ids, sizeof(int32_t) * (size_t)n);
        have = true;
    }
    if (ids && !have) { /* no vocabulary that tokenizes the text: pseudo-random ids */
        uint64_t s = 0x9e3779b97f4a7c15ull;
        for (int i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)((s >> 33) % (uint64_t)m->cfg.n_vocab);
        }
    }
    if (!ids)
        fails++;
    else
        fails += teacher_forced(c, m, name, ids, n);
    if (c->greedy_file) fails += greedy_prompts(c, m, name);
    kiln_tokens_free(&toks);
    free(text);
    free(ids);
    kiln_model_free(m);
    return fails;
}
