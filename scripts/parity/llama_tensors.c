/*
 * llama_tensors.c — dumps llama.cpp's intermediate tensors (f32, through the graph's
 * eval callback) so kiln's arithmetic can be compared with llama.cpp's op by op
 * (docs/PLAN.md, "Numerics"). Compiled against llama.cpp's libllama
 * like llama_dump.c (this file only *uses* the library; see make_goldens.sh for the
 * compile line):
 *
 *   cc -O2 -o /tmp/llama_tensors scripts/parity/llama_tensors.c -I$L/include \
 *      -I$L/ggml/include -L$L/build/bin -lllama -lggml -lggml-base -lm -Wl,-rpath,$L/build/bin
 *   llama_tensors MODEL OUTDIR N_PROMPT N_DECODE TEXTFILE [NAME...]
 *
 * Tokenizes TEXTFILE (BOS added as the model says), decodes its first N_PROMPT tokens as
 * one batch, then N_DECODE more tokens one at a time (teacher forced: the next tokens of
 * the text), with flash attention off and 2 threads. Every f32 tensor the graph computes
 * whose name is in the NAME list (every named tensor when the list is empty) is written
 * to OUTDIR/<step>.<name>.f32, and every matmul with a named weight as
 * OUTDIR/<step>.mm_in.<weight>.f32 (its f32 input) and .mm_out.<weight>.f32 (its result),
 * which scripts/parity/compare_mm.c reads: a 16-byte header of four int32 ne[0..3] (ggml order:
 * ne[0] is the row length), then the values, row-major over ne[0]. step is 0 for the
 * batch and 1.. for the single-token decodes. Non-contiguous tensors are skipped.
 */
#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct dump_ctx {
    const char *dir;
    char **names;
    int n_names;
    int step;
} dump_ctx;

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)level, (void)text, (void)user;
}

static int wanted(const dump_ctx *d, const char *name) {
    if (!name[0]) return 0;
    if (d->n_names == 0) return 1;
    for (int i = 0; i < d->n_names; i++)
        if (strcmp(d->names[i], name) == 0) return 1;
    return 0;
}

static void write_tensor(const dump_ctx *d, const struct ggml_tensor *t, const char *name) {
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return;
    char path[4096], safe[2 * GGML_MAX_NAME + 8];
    snprintf(safe, sizeof safe, "%s", name);
    for (char *c = safe; *c; c++)
        if (*c == '/' || *c == ' ' || *c == '(' || *c == ')') *c = '_';
    snprintf(path, sizeof path, "%s/%d.%s.f32", d->dir, d->step, safe);
    size_t n = (size_t)ggml_nelements(t);
    float *buf = malloc(n * sizeof(float));
    if (!buf) return;
    ggml_backend_tensor_get(t, buf, 0, n * sizeof(float));
    FILE *f = fopen(path, "wb");
    if (f) {
        int32_t ne[4] = {(int32_t)t->ne[0], (int32_t)t->ne[1], (int32_t)t->ne[2],
                         (int32_t)t->ne[3]};
        fwrite(ne, sizeof ne, 1, f);
        fwrite(buf, sizeof(float), n, f);
        fclose(f);
    }
    free(buf);
}

/* Matmuls are written as "mm_in.<weight>" (the f32 activations, src[1]) and
 * "mm_out.<weight>" (the result); other tensors under their graph name (a name the graph
 * uses twice, like Qcur before and after RoPE, keeps the later one). */
static bool on_tensor(struct ggml_tensor *t, bool ask, void *ud) {
    dump_ctx *d = ud;
    bool mm = t->op == GGML_OP_MUL_MAT && t->src[0] && t->src[0]->name[0] &&
              strstr(t->src[0]->name, ".weight");
    if (!mm && (t->type != GGML_TYPE_F32 || !wanted(d, t->name))) return ask ? false : true;
    if (ask) return true;
    if (mm) {
        char name[2 * GGML_MAX_NAME + 8];
        snprintf(name, sizeof name, "mm_in.%s", t->src[0]->name);
        write_tensor(d, t->src[1], name);
        snprintf(name, sizeof name, "mm_out.%s", t->src[0]->name);
        write_tensor(d, t, name);
    } else {
        write_tensor(d, t, t->name);
    }
    return true;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: llama_tensors MODEL OUTDIR N_PROMPT N_DECODE TEXTFILE [NAME...]\n");
        return 2;
    }
    dump_ctx d = {argv[2], argv + 6, argc - 6, 0};
    int n_prompt = atoi(argv[3]), n_dec = atoi(argv[4]);
    llama_backend_init();
    llama_log_set(quiet, NULL);
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    const struct llama_vocab *v = llama_model_get_vocab(m);
    FILE *f = fopen(argv[5], "rb");
    if (!f) return 1;
    static char text[1 << 20];
    size_t sz = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[sz] = 0;
    static llama_token ids[1 << 18];
    int nt = llama_tokenize(v, text, (int32_t)sz, ids, 1 << 18, true, false);
    if (nt < n_prompt + n_dec) {
        fprintf(stderr, "text has %d tokens, need %d\n", nt, n_prompt + n_dec);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n_prompt + n_dec + 16);
    cp.n_batch = cp.n_ubatch = cp.n_ctx;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;
    cp.cb_eval = on_tensor;
    cp.cb_eval_user_data = &d;
    struct llama_context *c = llama_init_from_model(m, cp);
    if (!c) return 1;
    printf("T");
    for (int i = 0; i < n_prompt + n_dec; i++) printf(" %d", ids[i]);
    printf("\n");
    struct llama_batch b = llama_batch_get_one(ids, n_prompt);
    if (llama_decode(c, b)) return 1;
    for (int s = 0; s < n_dec; s++) {
        d.step = s + 1;
        b = llama_batch_get_one(&ids[n_prompt + s], 1);
        if (llama_decode(c, b)) return 1;
    }
    llama_free(c);
    llama_model_free(m);
    return 0;
}
