/*
 * bench_tokenize.c — tokenizer throughput (MB/s) for SPM and byte-level BPE on a 1 MB
 * mixed text, next to llama.cpp's tokenizer on the same text and vocabulary, measured in
 * the same run.
 *
 *   LLAMA_TOKENIZE=/path/to/llama-tokenize build/bench/bench_tokenize [SPM.gguf BPE.gguf]
 *
 * Defaults: SPM = Gemma 3 270M (262k-token SentencePiece vocabulary, from the model
 * cache), BPE = ../shared/testdata/tokenizer/ggml-vocab-gpt-2.gguf.
 * Text: the files of the tests/data/tok/gemma3 texts (English, code, CJK, emoji, white space,
 * mixed) cycled up to 1 MiB, written to a temporary file.
 *
 * kiln: kiln_tokenize (no BOS, special tokens not parsed), best and median of 7 runs
 * after a warm-up; the vocabulary is loaded once, outside the timing.
 * llama.cpp: cannot be linked into kiln, so `llama-tokenize -m VOCAB -f FILE --ids
 * --no-bos --no-escape --no-parse-special --log-disable` is run as a process; its time on
 * the 1 MiB file minus its time on an empty file (model load, process start) is its
 * tokenize time (printing the ids is included, a small cost in its disfavour). Medians
 * of 5 runs each. The ids it prints are compared with kiln's, so both did the same work.
 */
#include "tok/tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define TEXT_BYTES (1u << 20)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

static char *build_text(const char *src_dir, size_t *len) {
    static const char *names[] = {"english", "code", "cjk", "emoji", "spaces", "mixed"};
    char *t = malloc(TEXT_BYTES);
    size_t n = 0;
    while (t && n < TEXT_BYTES) {
        for (size_t i = 0; i < 6 && n < TEXT_BYTES; i++) {
            char p[1024];
            snprintf(p, sizeof p, "%s/tests/data/tok/gemma3/%s.txt", src_dir, names[i]);
            FILE *f = fopen(p, "rb");
            if (!f) {
                fprintf(stderr, "bench_tokenize: cannot open %s\n", p);
                free(t);
                return NULL;
            }
            n += fread(t + n, 1, TEXT_BYTES - n, f);
            fclose(f);
        }
    }
    *len = n;
    return t;
}

/* Runs llama-tokenize on file; returns wall seconds and (*cpu) its user+system CPU
 * seconds, and the ids when ids != NULL. */
static double run_llama(const char *exe, const char *model, const char *file, kiln_tokens *ids,
                        double *cpu) {
    char out[] = "/tmp/kiln-bench-tok-XXXXXX";
    int fd = mkstemp(out);
    if (fd < 0) return -1;
    double t0 = now_s();
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 1);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 2);
        execl(exe, exe, "-m", model, "-f", file, "--ids", "--no-bos", "--no-escape",
              "--no-parse-special", "--log-disable", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    wait4(pid, &status, 0, &ru);
    double dt = now_s() - t0;
    *cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
    close(fd);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) dt = -1;
    if (ids && dt > 0) {
        FILE *f = fopen(out, "r");
        int c;
        long v = 0;
        bool in = false;
        while (f && (c = fgetc(f)) != EOF) {
            if (c >= '0' && c <= '9') {
                v = v * 10 + (c - '0');
                in = true;
            } else if (in) {
                if (ids->n == ids->cap) {
                    ids->cap = ids->cap ? ids->cap * 2 : 1024;
                    ids->ids = realloc(ids->ids, ids->cap * sizeof *ids->ids);
                }
                ids->ids[ids->n++] = (kiln_token)v;
                v = 0;
                in = false;
            }
        }
        if (f) fclose(f);
    }
    unlink(out);
    return dt;
}

static void bench(const char *label, const char *model, const char *text, size_t len,
                  const char *file, const char *empty, const char *llama) {
    kiln_vocab *v;
    kiln_err e;
    if (kiln_vocab_load(model, &v, &e)) {
        fprintf(stderr, "bench_tokenize: %s\n", e.msg);
        return;
    }
    kiln_tokens t = {0};
    double times[7], cpus[7];
    for (int r = -1; r < 7; r++) {
        t.n = 0;
        double t0 = now_s(), c0 = cpu_s();
        if (kiln_tokenize(v, text, len, 0, &t, &e)) {
            fprintf(stderr, "bench_tokenize: %s\n", e.msg);
            return;
        }
        if (r >= 0) times[r] = now_s() - t0, cpus[r] = cpu_s() - c0;
    }
    double med = median(times, 7), cmed = median(cpus, 7);
    double mb = (double)len / 1e6;
    printf("%-4s %s\n", label, model);
    printf("     kiln       wall %8.2f MB/s (median %.1f ms)   cpu %8.2f MB/s (median %.1f ms)  "
           "%zu tokens\n",
           mb / med, med * 1e3, mb / cmed, cmed * 1e3, t.n);
    if (llama) {
        double full[5], base[5], cfull[5], cbase[5];
        kiln_tokens ref = {0};
        for (int r = 0; r < 5; r++) {
            full[r] = run_llama(llama, model, file, r == 0 ? &ref : NULL, &cfull[r]);
            base[r] = run_llama(llama, model, empty, NULL, &cbase[r]);
        }
        double tf = median(full, 5), tb = median(base, 5), tok = tf - tb;
        double cf = median(cfull, 5), cb = median(cbase, 5), ctok = cf - cb;
        bool same = ref.n == t.n && memcmp(ref.ids, t.ids, t.n * sizeof *t.ids) == 0;
        printf("     llama.cpp  wall %8.2f MB/s (%.1f - %.1f ms load)   cpu %8.2f MB/s (%.1f - "
               "%.1f ms load)  %zu tokens, ids %s\n",
               mb / tok, tf * 1e3, tb * 1e3, mb / ctok, cf * 1e3, cb * 1e3, ref.n,
               same ? "identical to kiln's" : "DIFFER FROM KILN'S");
        printf("     speed-up kiln / llama.cpp: wall %.2fx, cpu %.2fx\n", tok / med, ctok / cmed);
        free(ref.ids);
    }
    kiln_tokens_free(&t);
    kiln_vocab_free(v);
}

int main(int argc, char **argv) {
    const char *src = getenv("KILN_SOURCE_DIR") ? getenv("KILN_SOURCE_DIR") : ".";
    char spm[1024], bpe[1024];
    const char *home = getenv("HOME");
    snprintf(spm, sizeof spm, "%s", argc > 1 ? argv[1] : "");
    if (argc <= 1)
        snprintf(spm, sizeof spm, "%s/.cache/kiln/models/gemma-3-270m-q4_k_m.gguf",
                 home ? home : "");
    snprintf(bpe, sizeof bpe, "%s",
             argc > 2 ? argv[2] : "../shared/testdata/tokenizer/ggml-vocab-gpt-2.gguf");
    size_t len;
    char *text = NULL;
    const char *tf = getenv("KILN_BENCH_TEXT"); /* another text instead of the mix */
    if (tf) {
        FILE *f = fopen(tf, "rb");
        text = f ? malloc(TEXT_BYTES) : NULL;
        len = text ? fread(text, 1, TEXT_BYTES, f) : 0;
        if (f) fclose(f);
    } else {
        text = build_text(src, &len);
    }
    if (!text) return 1;
    char file[] = "/tmp/kiln-bench-text-XXXXXX", empty[] = "/tmp/kiln-bench-empty-XXXXXX";
    int fd = mkstemp(file), fe = mkstemp(empty);
    if (fd < 0 || fe < 0 || write(fd, text, len) != (ssize_t)len) return 1;
    close(fd);
    close(fe);
    const char *llama = getenv("LLAMA_TOKENIZE");
    printf("text: %zu bytes (%s)%s\n", len, tf ? tf : "tests/data/tok/gemma3 texts cycled",
           llama ? "" : "; set LLAMA_TOKENIZE to compare with llama.cpp");
    bench("SPM", spm, text, len, file, empty, llama);
    bench("BPE", bpe, text, len, file, empty, llama);
    unlink(file);
    unlink(empty);
    free(text);
    return 0;
}
