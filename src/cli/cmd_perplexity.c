/*
 * cmd_perplexity.c — `kiln perplexity`: perplexity of a text file, computed the way
 * llama-perplexity computes it, so the two numbers compare directly:
 *   - the whole text is tokenized with the model's special tokens (BOS per metadata);
 *   - it is cut into non-overlapping chunks of CTX tokens (the tail is dropped; at
 *     least 2 chunks are needed); each chunk starts from an empty cache, with its first
 *     token replaced by BOS when the model adds one;
 *   - the chunk is fed in batches of BATCH tokens; the second half of the chunk is
 *     scored: positions CTX/2 .. CTX-2 predict the next token (CTX - CTX/2 - 1 per chunk);
 *   - PPL = exp(mean negative log-likelihood), printed as the last line "PPL = <value>",
 *     with running values per chunk like llama-perplexity's "[i]ppl," list.
 */
#include "base/timer.h"
#include "base/mem.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/gen.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kiln_cmd_perplexity(int argc, char **argv) {
    static const kiln_cmd_usage u = {
        "kiln perplexity -m MODEL -f TEXT [-c CTX] [-b BATCH]",
        "Perplexity of a text file, computed like llama-perplexity (chunks of CTX tokens, BOS "
        "first, the second half of each chunk scored). The last line is \"PPL = <value>\"."};
    kiln_opt opts[] = {
        {"model", 'm', true, "MODEL", "model file or short name", false, NULL},
        {"file", 'f', true, "TEXT", "text file", false, NULL},
        {"ctx-size", 'c', true, "N", "chunk size in tokens (default 512)", false, NULL},
        {"batch-size", 'b', true, "N", "tokens per step (default: CTX)", false, NULL},
        {"chunks", 0, true, "N", "score at most N chunks (default all)", false, NULL},
        {"threads", 't', true, "N", "threads (default: all cores)", false, NULL},
        {"backend", 0, true, "NAME", KILN_BACKEND_HELP, false, NULL},
        {"kv-f16", 0, false, NULL, "store the KV cache as f16", false, NULL},
        {"tp", 0, true, "N",
         "tensor parallel: split the model over N ranks (default 1; docs/TP.md)", false, NULL},
        KILN_OPT_LOAD_REPORT,
        {"numerics", 0, true, "MODE",
         "exact (default) or ggml: quantized matmuls with llama.cpp's 8-bit activations", false,
         NULL},
    };
    const char *pos[4];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, opts, KILN_NOPTS(opts), pos, 4, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;
    kiln_opt *o_m = kiln_opt_find(opts, KILN_NOPTS(opts), "model");
    kiln_opt *o_f = kiln_opt_find(opts, KILN_NOPTS(opts), "file");
    if (!o_m->seen || !o_f->seen) {
        fprintf(stderr, "kiln perplexity: -m MODEL and -f TEXT are required\n");
        kiln_args_usage(&u, opts, KILN_NOPTS(opts), true);
        return 2;
    }
    int64_t n_ctx = 512, n_batch = 0, max_chunks = -1, threads = 0, tp = 1;
    if (!kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "ctx-size"), 8, 1 << 20, &n_ctx) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "batch-size"), 1, 1 << 20, &n_batch) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "chunks"), 1, 1 << 30, &max_chunks) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "threads"), 0, 1024, &threads) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "tp"), 1, 64, &tp))
        return 2;
    if (n_batch == 0 || n_batch > n_ctx) n_batch = n_ctx;
    kiln_err err;
    kiln_err_clear(&err);
    char *text = NULL;
    size_t text_len = 0;
    if (kiln_gen_read_file(o_f->value, &text, &text_len, &err))
        return kiln_cli_fail("perplexity", &err);
    kiln_gen_opts go = {.model = o_m->value,
                        .backend = kiln_opt_find(opts, KILN_NOPTS(opts), "backend")->value,
                        .n_threads = (int32_t)threads,
                        .n_ctx = n_ctx,
                        .max_step = (int32_t)n_batch,
                        .max_seqs = 1,
                        .kv_f16 = kiln_opt_find(opts, KILN_NOPTS(opts), "kv-f16")->seen,
                        .numerics = kiln_opt_find(opts, KILN_NOPTS(opts), "numerics")->value,
                        .load_report = kiln_opt_find(opts, KILN_NOPTS(opts), "load-report")->seen,
                        .tp = (int32_t)tp};
    kiln_gen_ctx g;
    if (kiln_gen_open(&go, &g, &err)) {
        kiln_free(text);
        return kiln_cli_fail("perplexity", &err);
    }
    int rc = 1;
    kiln_tokens toks = {0};
    kiln_batch_entry *b = NULL;
    float *logits = NULL;
    const kiln_vocab *v = g.model->vocab;
    if (kiln_tokenize(v, text, text_len, KILN_TOK_ADD_SPECIAL, &toks, &err)) goto done;
    if ((int64_t)toks.n < 2 * n_ctx) {
        kiln_err_set(&err, KILN_ERR_RANGE,
                     "%s has %zu tokens; a context of %lld needs at least %lld", o_f->value, toks.n,
                     (long long)n_ctx, (long long)(2 * n_ctx));
        goto done;
    }
    int64_t n_chunk = (int64_t)toks.n / n_ctx;
    if (max_chunks > 0 && max_chunks < n_chunk) n_chunk = max_chunks;
    const int64_t first = n_ctx / 2;
    const int32_t V = g.n_vocab;
    b = kiln_malloc(sizeof(*b) * (size_t)n_batch);
    logits = kiln_malloc(sizeof(float) * (size_t)V * (size_t)(n_ctx - first));
    if (!b || !logits) {
        kiln_err_set(&err, KILN_ERR_NOMEM, "perplexity buffers");
        goto done;
    }
    fprintf(stderr,
            "kiln perplexity: %zu tokens, %lld chunks of %lld, batch %lld, scoring %lld tokens per "
            "chunk\n",
            toks.n, (long long)n_chunk, (long long)n_ctx, (long long)n_batch,
            (long long)(n_ctx - first - 1));
    double nll = 0, nll2 = 0;
    int64_t count = 0;
    uint64_t t0 = kiln_now_ns();
    for (int64_t c = 0; c < n_chunk; c++) {
        const int32_t *ct = toks.ids + c * n_ctx;
        int32_t seq;
        if (kiln_seq_create(g.engine, &seq, &err)) goto done;
        int64_t n_out = 0;
        for (int64_t j = 0; j < n_ctx; j += n_batch) {
            int64_t m = n_ctx - j < n_batch ? n_ctx - j : n_batch;
            int32_t nl = 0;
            for (int64_t k = 0; k < m; k++) {
                int64_t p = j + k;
                int32_t id = ct[p];
                if (p == 0 && kiln_vocab_add_bos(v)) id = kiln_vocab_bos(v);
                b[k] = (kiln_batch_entry){seq, id, (int32_t)p, p >= first};
                nl += p >= first;
            }
            if (kiln_engine_step(g.engine, b, (int32_t)m, logits + (size_t)n_out * V, &err)) {
                kiln_seq_free(g.engine, seq);
                goto done;
            }
            n_out += nl;
        }
        kiln_seq_free(g.engine, seq);
        for (int64_t p = first; p < n_ctx - 1; p++) {
            const float *l = logits + (size_t)(p - first) * V;
            float mx = l[0];
            for (int32_t i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
            double s = 0;
            for (int32_t i = 0; i < V; i++) s += exp((double)l[i] - mx);
            double x = mx + log(s) - l[ct[p + 1]];
            nll += x;
            nll2 += x * x;
            count++;
        }
        printf("[%lld]%.4f,", (long long)(c + 1), exp(nll / (double)count));
        fflush(stdout);
    }
    double secs = (double)(kiln_now_ns() - t0) * 1e-9;
    printf("\n");
    double mean = nll / (double)count, var = nll2 / (double)count - mean * mean;
    double ppl = exp(mean);
    fprintf(stderr, "kiln perplexity: %lld tokens evaluated in %.1f s (%.1f tok/s)\n",
            (long long)(n_chunk * n_ctx), secs, (double)(n_chunk * n_ctx) / secs);
    if (var > 0 && count > 1)
        fprintf(stderr, "kiln perplexity: estimate %.4f +/- %.5f over %lld tokens\n", ppl,
                sqrt(var / (double)(count - 1)) * ppl, (long long)count);
    printf("PPL = %.4f\n", ppl);
    rc = 0;
done:
    if (rc) kiln_cli_fail("perplexity", &err);
    kiln_free(b);
    kiln_free(logits);
    kiln_tokens_free(&toks);
    kiln_free(text);
    kiln_gen_close(&g);
    return rc;
}
