/*
 * test_parity.c — kiln (ref backend) against llama.cpp goldens in tests/data/parity/.
 *
 * Each golden directory has a `manifest` (key value lines):
 *   model cache:FILE          a model in the kiln model cache (~/.cache/kiln/models)
 *   model path:FILE           a path relative to the build directory (kiln-gen output)
 *   gen ARGS...               how to make that file with kiln-gen when it is absent
 *                             (must come before the model line)
 *   greedy FILE               "P ids | C ids | G gaps" lines from llama_dump greedy
 *   tf FILE                   "T ids" then "i id:logprob..." lines from llama_dump tf
 *   ppl FILE                  llama-perplexity's PPL of tests/data/parity/text.txt at -c 256;
 *                             `kiln perplexity` must be within 0.5% of it
 *   numerics MODE             kiln's numerics for this model (kiln_engine_opts.numerics,
 *                             `kiln perplexity --numerics`): exact (default) or ggml — the
 *                             quantized manifests use ggml, llama.cpp's own 8-bit activation
 *                             arithmetic (docs/PLAN.md "Numerics"); must come before the
 *                             checks. The float manifests run in exact numerics.
 *   expect TOP1 KL GREEDY PPL thresholds when they differ from the (0.99 1e-3
 *                             0.9 0.005), with the reason in a comment line above
 * and the checks are those of issue #5:
 *   greedy: >= 90% of prompts give identical continuations, and every divergence is a
 *           near-tie (kiln's top-2 logit gap at the diverging step < 1e-3 * logit scale,
 *           the scale being max |logit| at that step) — reported either way;
 *   tf:     top-1 agreement >= 99%, mean KL(llama.cpp || kiln) < 1e-3 (KL over the
 *           golden top-K plus one tail bucket: a lower bound of the full KL).
 * Without arguments every directory is checked (a model that is absent is skipped with
 * a message); with a directory argument only that one.
 */
#include "base/timer.h"
#include "model/model.h"
#include "runtime/engine.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAXT 8192

static int failures = 0;
static double want_top1 = 0.99, want_kl = 1e-3, want_greedy = 0.9, want_ppl = 0.005;
static char model_path[4096];
static char numerics[16] = "exact";

static int parse_ids(char *s, int32_t *out, int cap) {
    int n = 0;
    char *tok = strtok(s, " \n");
    while (tok && n < cap) {
        out[n++] = atoi(tok);
        tok = strtok(NULL, " \n");
    }
    return n;
}

static kiln_engine *make_engine(kiln_model *m, int max_step) {
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.n_ctx = 4096;
    o.max_step_tokens = max_step;
    o.max_seqs = 2;
    o.kv_f16 = getenv("KILN_PARITY_KV_F16") != NULL;
    o.numerics = numerics;
    kiln_engine *e;
    kiln_err err;
    if (kiln_engine_create(m, &o, &e, &err)) {
        fprintf(stderr, "engine: %s\n", err.msg);
        return NULL;
    }
    return e;
}

static int argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

static void check_greedy(kiln_model *m, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("  greedy: cannot open %s\n", path);
        failures++;
        return;
    }
    kiln_engine *e = make_engine(m, 512);
    if (!e) {
        failures++;
        fclose(f);
        return;
    }
    const int V = m->cfg.n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)V);
    static char line[1 << 16];
    int n_prompts = 0, n_same = 0, n_tie = 0;
    double t0 = kiln_now_s();
    int total_tokens = 0;
    while (fgets(line, sizeof line, f)) {
        char *c = strstr(line, "| C"), *g = strstr(line, "| G");
        if (line[0] != 'P' || !c || !g) continue;
        *c = 0;
        *g = 0;
        int32_t p[MAXT], cont[1024];
        int np = parse_ids(line + 1, p, MAXT), nc = parse_ids(c + 3, cont, 1024);
        int32_t seq;
        kiln_seq_create(e, &seq, NULL);
        kiln_batch_entry *b = malloc(sizeof(*b) * (size_t)np);
        for (int i = 0; i < np; i++) b[i] = (kiln_batch_entry){seq, p[i], i, i == np - 1};
        kiln_err err;
        if (kiln_engine_step(e, b, np, lg, &err)) {
            printf("  step: %s\n", err.msg);
            failures++;
            free(b);
            break;
        }
        free(b);
        int diverge = -1;
        double gap_rel = 0;
        for (int s = 0; s < nc; s++) {
            int id = argmax(lg, V);
            total_tokens++;
            if (id != cont[s]) {
                float top = lg[id], second = -INFINITY, scale = 0;
                for (int i = 0; i < V; i++) {
                    if (i != id && lg[i] > second) second = lg[i];
                    if (fabsf(lg[i]) > scale) scale = fabsf(lg[i]);
                }
                diverge = s;
                gap_rel = (top - second) / scale;
                break;
            }
            kiln_batch_entry d = {seq, id, np + s, 1};
            if (kiln_engine_step(e, &d, 1, lg, &err)) {
                printf("  step: %s\n", err.msg);
                failures++;
                break;
            }
        }
        kiln_seq_free(e, seq);
        n_prompts++;
        if (diverge < 0)
            n_same++;
        else {
            bool tie = gap_rel < 1e-3;
            n_tie += tie;
            printf("  prompt %d diverges at step %d: kiln top-2 gap %.3g of the logit scale (%s)\n",
                   n_prompts - 1, diverge, gap_rel, tie ? "near-tie" : "NOT a near-tie");
        }
    }
    double dt = kiln_now_s() - t0;
    bool ok = n_prompts >= 1 && n_same >= want_greedy * n_prompts &&
              (want_greedy < 0.9 || n_same + n_tie == n_prompts);
    printf("  greedy: %d/%d prompts identical, %d near-tie divergences (%.1f tok/s incl. prefill) "
           "%s\n",
           n_same, n_prompts, n_tie, total_tokens / dt, ok ? "OK" : "FAIL");
    if (!ok) failures++;
    free(lg);
    kiln_engine_free(e);
    fclose(f);
}

static void check_tf(kiln_model *m, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("  tf: cannot open %s\n", path);
        failures++;
        return;
    }
    static char line[1 << 20];
    int32_t *toks = malloc(sizeof(int32_t) * MAXT);
    int n = 0;
    if (fgets(line, sizeof line, f) && line[0] == 'T') n = parse_ids(line + 1, toks, MAXT);
    if (n < 2) {
        printf("  tf: no tokens in %s\n", path);
        failures++;
        fclose(f);
        free(toks);
        return;
    }
    kiln_engine *e = make_engine(m, n);
    const int V = m->cfg.n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)n);
    kiln_batch_entry *b = malloc(sizeof(*b) * (size_t)n);
    int32_t seq;
    kiln_seq_create(e, &seq, NULL);
    for (int i = 0; i < n; i++) b[i] = (kiln_batch_entry){seq, toks[i], i, 1};
    kiln_err err;
    double t0 = kiln_now_s();
    if (kiln_engine_step(e, b, n, lg, &err)) {
        printf("  tf step: %s\n", err.msg);
        failures++;
        goto out;
    }
    double dt = kiln_now_s() - t0;
    int rows = 0, same = 0;
    double kl_sum = 0, kl_max = 0;
    while (fgets(line, sizeof line, f)) {
        char *sp = strtok(line, " \n");
        if (!sp) continue;
        int i = atoi(sp);
        if (i < 0 || i >= n - 1) continue;
        const float *l = lg + (size_t)i * V;
        /* kiln log-softmax */
        float mx = l[0];
        for (int j = 1; j < V; j++) mx = l[j] > mx ? l[j] : mx;
        double s = 0;
        for (int j = 0; j < V; j++) s += exp((double)l[j] - mx);
        double lse = mx + log(s);
        double kl = 0, pb_sum = 0, pk_sum = 0;
        int first = -1;
        char *tk;
        while ((tk = strtok(NULL, " \n"))) {
            int id = atoi(tk);
            char *colon = strchr(tk, ':');
            if (!colon || id < 0 || id >= V) continue;
            double lpb = atof(colon + 1), lpk = l[id] - lse, pb = exp(lpb);
            if (first < 0) first = id;
            kl += pb * (lpb - lpk);
            pb_sum += pb;
            pk_sum += exp(lpk);
        }
        double tb = 1 - pb_sum, tk2 = 1 - pk_sum;
        if (tb > 1e-12 && tk2 > 1e-12) kl += tb * log(tb / tk2);
        rows++;
        if (getenv("KILN_PARITY_VERBOSE"))
            printf("    pos %d kl %.3g top1 %d/%d\n", i, kl, argmax(l, V), first);
        same += argmax(l, V) == first;
        kl_sum += kl;
        if (kl > kl_max) kl_max = kl;
    }
    double top1 = rows ? (double)same / rows : 0, kl_mean = rows ? kl_sum / rows : 1;
    bool ok = rows > 0 && top1 >= want_top1 && kl_mean < want_kl;
    printf("  teacher-forced %d tokens: top-1 agreement %.2f%% (%d/%d), mean KL %.3g, max KL %.3g, "
           "prefill %.1f tok/s %s\n",
           n, 100 * top1, same, rows, kl_mean, kl_max, n / dt, ok ? "OK" : "FAIL");
    if (!ok) failures++;
out:
    free(b);
    free(lg);
    free(toks);
    kiln_engine_free(e);
    fclose(f);
}

static void check_ppl(const char *path) {
    FILE *f = fopen(path, "r");
    double want = 0;
    if (!f || fscanf(f, "%lf", &want) != 1 || !(want > 0)) {
        printf("  ppl: no value in %s\n", path);
        failures++;
        if (f) fclose(f);
        return;
    }
    fclose(f);
    const char *bd = getenv("KILN_BINARY_DIR"), *sd = getenv("KILN_SOURCE_DIR");
    char cmd[12288];
    snprintf(cmd, sizeof cmd,
             "%.4000s/kiln perplexity -m '%.4000s' -f %.3000s/tests/data/parity/text.txt -c 256 "
             "--numerics %s 2>/dev/null",
             bd ? bd : ".", model_path, sd ? sd : ".", numerics);
    FILE *p = popen(cmd, "r");
    char line[4096];
    double got = 0;
    while (p && fgets(line, sizeof line, p))
        if (strncmp(line, "PPL = ", 6) == 0) got = atof(line + 6);
    if (p) pclose(p);
    double rel = fabs(got - want) / want;
    bool ok = got > 0 && rel <= want_ppl;
    printf("  perplexity (text.txt, -c 256): kiln %.4f, llama.cpp %.4f, difference %.3f%% %s\n",
           got, want, 100 * rel, ok ? "OK" : "FAIL");
    if (!ok) failures++;
}

static void check_dir(const char *dir) {
    char path[4096], line[4096];
    snprintf(path, sizeof path, "%s/manifest", dir);
    FILE *f = fopen(path, "r");
    if (!f) return;
    printf("%s\n", dir);
    want_top1 = 0.99, want_kl = 1e-3, want_greedy = 0.9, want_ppl = 0.005;
    snprintf(numerics, sizeof numerics, "exact");
    kiln_model *m = NULL;
    char gen_args[2048] = "";
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "gen ", 4) == 0) {
            snprintf(gen_args, sizeof gen_args, "%.2000s", line + 4);
            gen_args[strcspn(gen_args, "\n")] = 0;
            continue;
        }
        char key[64], val[2048];
        if (sscanf(line, "%63s %2047s", key, val) != 2 || key[0] == '#') continue;
        if (strcmp(key, "numerics") == 0) {
            if (strcmp(val, "exact") != 0 && strcmp(val, "ggml") != 0) {
                printf("  bad numerics line: %s", line);
                failures++;
            }
            snprintf(numerics, sizeof numerics, "%.15s", val);
            printf("  numerics: %s%s\n", numerics,
                   strcmp(numerics, "ggml") == 0
                       ? " (quantized matmuls with llama.cpp's 8-bit activation arithmetic)"
                       : "");
            continue;
        }
        if (strcmp(key, "expect") == 0) {
            if (sscanf(line, "%*s %lf %lf %lf %lf", &want_top1, &want_kl, &want_greedy,
                       &want_ppl) != 4) {
                printf("  bad expect line: %s", line);
                failures++;
            }
            printf("  thresholds: top-1 >= %g, KL < %g, greedy identical >= %g, PPL within %g%%\n",
                   want_top1, want_kl, want_greedy, 100 * want_ppl);
            continue;
        }
        if (strcmp(key, "model") == 0) {
            char mp[4096];
            if (strncmp(val, "cache:", 6) == 0) {
                const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
                if (xdg && *xdg)
                    snprintf(mp, sizeof mp, "%s/kiln/models/%s", xdg, val + 6);
                else
                    snprintf(mp, sizeof mp, "%s/.cache/kiln/models/%s", home ? home : ".", val + 6);
            } else if (strncmp(val, "path:", 5) == 0) {
                const char *bd = getenv("KILN_BINARY_DIR");
                snprintf(mp, sizeof mp, "%s/%s", bd ? bd : ".", val + 5);
            } else {
                snprintf(mp, sizeof mp, "%s", val);
            }
            snprintf(model_path, sizeof model_path, "%s", mp);
            struct stat st;
            if (stat(mp, &st) != 0 && gen_args[0]) {
                const char *bd = getenv("KILN_BINARY_DIR");
                char cmd[8192], mdir[4096];
                snprintf(mdir, sizeof mdir, "%s", mp);
                char *slash = strrchr(mdir, '/');
                if (slash) *slash = 0;
                snprintf(cmd, sizeof cmd,
                         "mkdir -p '%.2000s' && '%.2000s/kiln-gen' -q %.2000s -o '%.2000s'", mdir,
                         bd ? bd : ".", gen_args, mp);
                if (system(cmd) != 0) printf("  kiln-gen failed: %s\n", cmd);
            }
            if (stat(mp, &st) != 0) {
                printf("  SKIP: model %s absent (fetch it with scripts/fetch-model.sh or build "
                       "kiln-gen)\n",
                       mp);
                break;
            }
            kiln_err err;
            if (kiln_model_load(mp, &m, &err)) {
                printf("  load: %s\n", err.msg);
                failures++;
                break;
            }
        } else if (getenv("KILN_PARITY_ONLY") && strcmp(getenv("KILN_PARITY_ONLY"), key) != 0) {
            continue; /* KILN_PARITY_ONLY=tf|greedy|ppl runs one kind of check */
        } else if (m && strcmp(key, "greedy") == 0) {
            snprintf(path, sizeof path, "%s/%s", dir, val);
            check_greedy(m, path);
        } else if (m && strcmp(key, "ppl") == 0) {
            snprintf(path, sizeof path, "%s/%s", dir, val);
            check_ppl(path);
        } else if (m && strcmp(key, "tf") == 0) {
            snprintf(path, sizeof path, "%s/%s", dir, val);
            check_tf(m, path);
        }
    }
    kiln_model_free(m);
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        for (int i = 1; i < argc; i++) check_dir(argv[i]);
    } else {
        const char *src = getenv("KILN_SOURCE_DIR");
        char root[4096];
        snprintf(root, sizeof root, "%s/tests/data/parity", src ? src : ".");
        DIR *d = opendir(root);
        if (!d) {
            printf("no parity data at %s\n", root);
            return 1;
        }
        struct dirent *de;
        char names[256][256];
        int n = 0;
        while ((de = readdir(d)) && n < 256)
            if (de->d_name[0] != '.') snprintf(names[n++], 256, "%s", de->d_name);
        closedir(d);
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++)
                if (strcmp(names[i], names[j]) > 0) {
                    char t[256];
                    memcpy(t, names[i], 256);
                    memcpy(names[i], names[j], 256);
                    memcpy(names[j], t, 256);
                }
        for (int i = 0; i < n; i++) {
            char p[8192];
            snprintf(p, sizeof p, "%.4000s/%.255s", root, names[i]);
            check_dir(p);
        }
    }
    printf("%s\n", failures ? "PARITY FAILED" : "parity OK");
    return failures ? 1 : 0;
}
