/*
 * compare_mm.c — op-by-op check of kiln's matmul arithmetic against llama.cpp's, on the
 * tensors llama_tensors.c dumped (docs/PLAN.md, "Numerics").
 *
 * For every "<step>.mm_in.<weight>.f32" / "<step>.mm_out.<weight>.f32" pair in DIR it
 * takes llama.cpp's own input x of that matmul, computes y = W x with kiln's reference
 * kernels in both numerics (exact: f32 activations; ggml: kiln_ref_matmul_ggml) on the
 * model's weight W, and prints the error of each against llama.cpp's y, relative to the
 * RMS of y: max and RMS over the whole output, and (ggml) the share of outputs that are
 * bit-identical to llama.cpp's. Because both sides start from the same x,
 * an error here is the matmul's own arithmetic, not something propagated.
 *
 *   cc -O2 -o /tmp/compare_mm scripts/parity/compare_mm.c -Iinclude -Isrc build/libkiln.a \
 *      $(pkg-config --libs jansson yaml-0.1 sqlite3 libpcre2-8 libutf8proc liburing \
 *      libmicrohttpd libxxhash) -lpthread -ldl -lm
 *   compare_mm MODEL DIR
 */
#include "format/dtype.h"
#include "kernels/ref/ref.h"
#include "model/model.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *load(const char *path, int32_t ne[4]) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    float *v = NULL;
    if (fread(ne, sizeof(int32_t), 4, f) == 4) {
        size_t n = (size_t)ne[0] * ne[1] * ne[2] * ne[3];
        v = malloc(n * sizeof(float));
        if (v && fread(v, sizeof(float), n, f) != n) {
            free(v);
            v = NULL;
        }
    }
    fclose(f);
    return v;
}

static void stats(const float *a, const float *ref, size_t n, double *max_rel, double *rms_rel,
                  double *same) {
    double ss = 0, se = 0, mx = 0, eq = 0;
    for (size_t i = 0; i < n; i++) {
        eq += a[i] == ref[i];
        ss += (double)ref[i] * ref[i];
        double e = fabs((double)a[i] - ref[i]);
        se += e * e;
        if (e > mx) mx = e;
    }
    double rms = sqrt(ss / (double)n);
    *max_rel = mx / rms;
    *rms_rel = sqrt(se / (double)n) / rms;
    *same = eq / (double)n;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: compare_mm MODEL DIR\n");
        return 2;
    }
    kiln_model *m;
    kiln_err err;
    if (kiln_model_load(argv[1], &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    DIR *d = opendir(argv[2]);
    if (!d) return 1;
    char *names[4096];
    int nn = 0;
    struct dirent *de;
    while ((de = readdir(d)) && nn < 4096)
        if (strstr(de->d_name, ".mm_in.")) names[nn++] = strdup(de->d_name);
    closedir(d);
    qsort(names, (size_t)nn, sizeof names[0], cmp_names);
    printf("%-6s %-28s %-5s %5s  %-21s %-21s\n", "step", "weight", "dtype", "rows",
           "exact: max / rms", "ggml: max / rms / bitwise equal");
    for (int i = 0; i < nn; i++) {
        char wname[512], pin[4096], pout[4096];
        int step;
        if (sscanf(names[i], "%d.mm_in.%511s", &step, wname) != 2) continue;
        wname[strlen(wname) - 4] = 0; /* ".f32" */
        snprintf(pin, sizeof pin, "%s/%s", argv[2], names[i]);
        snprintf(pout, sizeof pout, "%s/%d.mm_out.%s.f32", argv[2], step, wname);
        int32_t nei[4], neo[4];
        float *x = load(pin, nei), *yl = load(pout, neo);
        const kiln_tensor *t = kiln_model_tensor(m, wname);
        if (!x || !yl || !t) {
            printf("%d %s: missing (%s)\n", step, wname, !t ? "tensor" : "dump");
            continue;
        }
        const int64_t k = nei[0], rows = (int64_t)nei[1] * nei[2] * nei[3], n = neo[0];
        size_t rb;
        if (kiln_dtype_row_bytes(t->dtype, k, &rb, &err)) continue;
        float *y0 = malloc(sizeof(float) * (size_t)(n * rows)),
              *y1 = malloc(sizeof(float) * (size_t)(n * rows));
        kiln_matmul_args a = {.w = t->data,
                              .w_dtype = t->dtype,
                              .w_row_bytes = rb,
                              .n = n,
                              .k = k,
                              .x = x,
                              .x_stride = k,
                              .y = y0,
                              .y_stride = n,
                              .t = rows};
        kiln_status s0 = kiln_ref_matmul(NULL, &a);
        a.y = y1;
        kiln_status s1 = kiln_ref_matmul_ggml(NULL, &a);
        double m0, r0, e0, m1 = 0, r1 = 0, e1 = 0;
        stats(y0, yl, (size_t)(n * rows), &m0, &r0, &e0);
        if (!s1) stats(y1, yl, (size_t)(n * rows), &m1, &r1, &e1);
        printf("%-6d %-28s %-5s %5lld  %9.2e %9.2e   %9.2e %9.2e %5.1f%%%s\n", step, wname,
               kiln_dtype_name(t->dtype), (long long)rows, m0, r0, m1, r1, 100 * e1,
               s0   ? " (exact failed)"
               : s1 ? " (ggml: not emulated)"
                    : "");
        free(x);
        free(yl);
        free(y0);
        free(y1);
    }
    kiln_model_free(m);
    return 0;
}
