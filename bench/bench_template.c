/* bench_template.c — chat template parse and render times.
 *
 * usage: bench_template [TEMPLATES_DIR [CONVERSATIONS_JSON [CONVERSATION]]]
 * defaults: $KILN_SHARED_DIR/testdata/templates (else ../shared/testdata/templates),
 * tests/data/templates/conversations.json, "tool_call". For every *.jinja it prints the
 * median parse time and the median render time (add_generation_prompt on) over many
 * repetitions, then the totals. Templates that fail for the conversation are listed as
 * such (some templates refuse tool calls). */
#include "tok/template.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    while (p) {
        n += fread(p + n, 1, cap - n, f);
        if (n < cap) break;
        char *np = realloc(p, cap * 2);
        if (!np) free(p);
        p = np;
        cap *= 2;
    }
    fclose(f);
    if (p) *len = n;
    return p;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

#define REPS 101

int main(int argc, char **argv) {
    char dir[4096], conv_path[4096];
    const char *shared = getenv("KILN_SHARED_DIR");
    snprintf(dir, sizeof dir, "%s", argc > 1 ? argv[1] : "");
    if (!dir[0]) snprintf(dir, sizeof dir, "%s/testdata/templates", shared ? shared : "../shared");
    snprintf(conv_path, sizeof conv_path, "%s",
             argc > 2 ? argv[2] : "tests/data/templates/conversations.json");
    const char *conv_name = argc > 3 ? argv[3] : "tool_call";
    json_error_t je;
    json_t *meta = json_load_file(conv_path, 0, &je);
    if (!meta) {
        fprintf(stderr, "bench_template: %s: %s\n", conv_path, je.text);
        return 1;
    }
    json_t *conv = json_object_get(json_object_get(meta, "conversations"), conv_name);
    if (!conv) {
        fprintf(stderr, "bench_template: no conversation '%s' in %s\n", conv_name, conv_path);
        return 1;
    }
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "bench_template: cannot open %s\n", dir);
        return 1;
    }
    char *names[1024];
    int nn = 0;
    struct dirent *e;
    while ((e = readdir(d)) && nn < 1024) {
        size_t l = strlen(e->d_name);
        if (l > 6 && !strcmp(e->d_name + l - 6, ".jinja")) names[nn++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)nn, sizeof names[0], by_name);
    kiln_chat_inputs in = {
        .messages = json_object_get(conv, "messages"),
        .tools = json_object_get(conv, "tools"),
        .extra = json_object_get(conv, "vars"),
        .add_generation_prompt = true,
        .bos_token = "<s>",
        .eos_token = "</s>",
        .now_iso = "2026-01-15T10:30:00",
    };
    double tot_parse = 0, tot_render = 0, tot_bytes = 0;
    int n_ok = 0;
    printf("%-52s %8s %10s %10s %8s\n", "template", "bytes", "parse_us", "render_us", "out_B");
    for (int i = 0; i < nn; i++) {
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        size_t len = 0;
        char *src = slurp(path, &len);
        if (!src) continue;
        double tp[REPS], tr[REPS];
        kiln_err err;
        kiln_chat_template *t = NULL;
        bool ok = true;
        size_t out_n = 0;
        for (int r = 0; r < REPS && ok; r++) {
            double t0 = now_s();
            ok = kiln_chat_template_parse(src, len, names[i], &t, &err) == KILN_OK;
            tp[r] = now_s() - t0;
            if (ok && r < REPS - 1) kiln_chat_template_free(t);
        }
        for (int r = 0; r < REPS && ok; r++) {
            char *out = NULL;
            double t0 = now_s();
            ok = kiln_chat_template_render(t, &in, &out, &out_n, &err) == KILN_OK;
            tr[r] = now_s() - t0;
            free(out);
        }
        kiln_chat_template_free(t);
        if (!ok) {
            printf("%-52s %8zu %10s %10s   (%s fails: template refuses it)\n", names[i], len, "-",
                   "-", conv_name);
        } else {
            qsort(tp, REPS, sizeof(double), cmp_d);
            qsort(tr, REPS, sizeof(double), cmp_d);
            printf("%-52s %8zu %10.1f %10.1f %8zu\n", names[i], len, tp[REPS / 2] * 1e6,
                   tr[REPS / 2] * 1e6, out_n);
            tot_parse += tp[REPS / 2];
            tot_render += tr[REPS / 2];
            tot_bytes += (double)len;
            n_ok++;
        }
        free(src);
        free(names[i]);
    }
    if (n_ok)
        printf("%d templates: mean parse %.1f us (%.1f MB/s of template), mean render %.1f us\n",
               n_ok, tot_parse / n_ok * 1e6, tot_bytes / tot_parse / 1e6, tot_render / n_ok * 1e6);
    json_decref(meta);
    return 0;
}
