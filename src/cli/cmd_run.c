/*
 * cmd_run.c — `kiln run`: generate text from one prompt.
 *
 * The prompt is tokenized (BOS added as the model's metadata says; with --chat the
 * model's chat template wraps it first), prefilled in steps of up to 512 tokens, then
 * tokens are sampled one at a time and streamed to stdout through the streaming
 * detokenizer (never a partial UTF-8 character). The prompt is not echoed. Prompt and
 * generation speed go to stderr at the end.
 */
#include "base/timer.h"
#include "base/mem.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/gen.h"
#include "runtime/kselect.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kiln_cmd_run(int argc, char **argv) {
    static const kiln_cmd_usage u = {
        "kiln run -m MODEL -p PROMPT [options]",
        "Generates text from a prompt and streams it to stdout; prompt and generation speed go "
        "to stderr. --temp 0 is greedy."};
    kiln_opt opts[] = {
        {"model", 'm', true, "MODEL", "model file or short name (gemma3-270m)", false, NULL},
        {"prompt", 'p', true, "TEXT", "the prompt", false, NULL},
        {"file", 'f', true, "FILE", "read the prompt from a file", false, NULL},
        {"n-predict", 'n', true, "N", "tokens to generate (default 128)", false, NULL},
        {"temp", 0, true, "T", "temperature (default 0.8; 0 = greedy)", false, NULL},
        {"top-k", 0, true, "K", "top-k (default 40; 0 = off)", false, NULL},
        {"top-p", 0, true, "P", "top-p (default 0.95; 1 = off)", false, NULL},
        {"min-p", 0, true, "P", "min-p (default 0.05; 0 = off)", false, NULL},
        {"repeat-penalty", 0, true, "X", "repetition penalty (default 1 = off)", false, NULL},
        {"repeat-last-n", 0, true, "N", "penalty window (default 64)", false, NULL},
        {"frequency-penalty", 0, true, "X", "frequency penalty (default 0)", false, NULL},
        {"presence-penalty", 0, true, "X", "presence penalty (default 0)", false, NULL},
        {"seed", 's', true, "S", "RNG seed (default 0)", false, NULL},
        {"ctx-size", 'c', true, "N", "context size (default min(4096, trained))", false, NULL},
        {"threads", 't', true, "N", "threads (default: all cores)", false, NULL},
        {"backend", 0, true, "NAME", "cpu or ref (default cpu; ref is the scalar oracle)", false,
         NULL},
        {"chat", 0, false, NULL, "wrap the prompt with the model's chat template", false, NULL},
        {"chat-template", 0, true, "FILE", "Jinja chat template to use instead of the model's",
         false, NULL},
        {"ignore-eos", 0, false, NULL, "do not stop at end-of-generation tokens", false, NULL},
        {"ids", 0, false, NULL, "print token ids instead of text", false, NULL},
        {"stop", 0, true, "TEXT", "stop when this text is generated", false, NULL},
        {"kv-f16", 0, false, NULL, "store the KV cache as f16", false, NULL},
        KILN_OPT_LOAD_REPORT,
        {"numerics", 0, true, "MODE",
         "exact (default) or ggml: quantized matmuls with llama.cpp's 8-bit activations", false,
         NULL},
        {"policy", 0, true, "FILE", "kernel policy (kiln.yaml; docs/KERNELS.md)", false, NULL},
        {"dispatch", 0, true, "FILE", "baked dispatch table from kiln solve", false, NULL},
    };
    const char *pos[4];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, opts, KILN_NOPTS(opts), pos, 4, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;
    kiln_opt *o_m = kiln_opt_find(opts, KILN_NOPTS(opts), "model");
    kiln_opt *o_p = kiln_opt_find(opts, KILN_NOPTS(opts), "prompt");
    kiln_opt *o_f = kiln_opt_find(opts, KILN_NOPTS(opts), "file");
    if (!o_m->seen || (!o_p->seen && !o_f->seen)) {
        fprintf(stderr, "kiln run: -m MODEL and -p PROMPT (or -f FILE) are required\n");
        kiln_args_usage(&u, opts, KILN_NOPTS(opts), true);
        return 2;
    }
    int64_t n_predict = 128, top_k = 40, seed = 0, n_ctx = 0, threads = 0, last_n = 64;
    double temp = 0.8, top_p = 0.95, min_p = 0.05, rep = 1.0, freq = 0, pres = 0;
    if (!kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "n-predict"), 0, 1 << 24, &n_predict) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "top-k"), 0, 1 << 30, &top_k) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "seed"), 0, INT64_MAX, &seed) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "ctx-size"), 0, 1 << 24, &n_ctx) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "threads"), 0, 1024, &threads) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "repeat-last-n"), -1, 1 << 20,
                      &last_n) ||
        !kiln_opt_float(kiln_opt_find(opts, KILN_NOPTS(opts), "temp"), 0, 100, &temp) ||
        !kiln_opt_float(kiln_opt_find(opts, KILN_NOPTS(opts), "top-p"), 1e-6, 1, &top_p) ||
        !kiln_opt_float(kiln_opt_find(opts, KILN_NOPTS(opts), "min-p"), 0, 1, &min_p) ||
        !kiln_opt_float(kiln_opt_find(opts, KILN_NOPTS(opts), "repeat-penalty"), 1e-3, 100, &rep) ||
        !kiln_opt_float(kiln_opt_find(opts, KILN_NOPTS(opts), "frequency-penalty"), -100, 100,
                        &freq) ||
        !kiln_opt_float(kiln_opt_find(opts, KILN_NOPTS(opts), "presence-penalty"), -100, 100,
                        &pres))
        return 2;
    bool chat = kiln_opt_find(opts, KILN_NOPTS(opts), "chat")->seen;
    bool ignore_eos = kiln_opt_find(opts, KILN_NOPTS(opts), "ignore-eos")->seen;
    bool print_ids = kiln_opt_find(opts, KILN_NOPTS(opts), "ids")->seen;
    kiln_opt *o_stop = kiln_opt_find(opts, KILN_NOPTS(opts), "stop");

    kiln_err err;
    kiln_err_clear(&err);
    char *prompt_buf = NULL;
    const char *prompt = o_p->value;
    if (o_f->seen) {
        FILE *f = fopen(o_f->value, "rb");
        if (!f) {
            kiln_err_errno(&err, errno, "opening %s", o_f->value);
            return kiln_cli_fail("run", &err);
        }
        size_t cap = 1 << 16, len = 0, k;
        prompt_buf = kiln_malloc(cap + 1);
        while (prompt_buf && (k = fread(prompt_buf + len, 1, cap - len, f)) > 0) {
            len += k;
            if (len == cap) {
                char *q = kiln_realloc(prompt_buf, cap * 2 + 1);
                if (!q) {
                    kiln_free(prompt_buf);
                    prompt_buf = NULL;
                    break;
                }
                prompt_buf = q;
                cap *= 2;
            }
        }
        fclose(f);
        if (!prompt_buf) {
            kiln_err_set(&err, KILN_ERR_NOMEM, "reading %s", o_f->value);
            return kiln_cli_fail("run", &err);
        }
        prompt_buf[len] = 0;
        prompt = prompt_buf;
    }
    kiln_gen_opts go = {.model = o_m->value,
                        .backend = kiln_opt_find(opts, KILN_NOPTS(opts), "backend")->value,
                        .n_threads = (int32_t)threads,
                        .n_ctx = n_ctx,
                        .max_seqs = 1,
                        .kv_f16 = kiln_opt_find(opts, KILN_NOPTS(opts), "kv-f16")->seen,
                        .numerics = kiln_opt_find(opts, KILN_NOPTS(opts), "numerics")->value,
                        .load_report = kiln_opt_find(opts, KILN_NOPTS(opts), "load-report")->seen};
    kiln_opt *o_tpl = kiln_opt_find(opts, KILN_NOPTS(opts), "chat-template");
    char *tpl = NULL;
    if (o_tpl->seen) {
        size_t tl;
        if (kiln_gen_read_file(o_tpl->value, &tpl, &tl, &err)) {
            kiln_free(prompt_buf);
            return kiln_cli_fail("run", &err);
        }
        chat = true;
    }
    kiln_opt *o_pol = kiln_opt_find(opts, KILN_NOPTS(opts), "policy");
    kiln_opt *o_dis = kiln_opt_find(opts, KILN_NOPTS(opts), "dispatch");
    if ((o_pol->seen || o_dis->seen) &&
        kiln_runtime_selector_configure(o_pol->value, NULL, o_dis->value, &err)) {
        kiln_free(prompt_buf);
        kiln_free(tpl);
        return kiln_cli_fail("run", &err);
    }
    kiln_gen_ctx g;
    uint64_t t_load = kiln_now_ns();
    if (kiln_gen_open(&go, &g, &err)) {
        kiln_free(prompt_buf);
        return kiln_cli_fail("run", &err);
    }
    double load_ms = kiln_elapsed_ms(t_load);
    const kiln_vocab *v = g.model->vocab;
    int rc = 1;
    char *chat_text = NULL;
    kiln_tokens toks = {0};
    kiln_sampler *smp = NULL;
    kiln_detok_stream *ds = NULL;
    kiln_stopper stop;
    memset(&stop, 0, sizeof(stop));
    float *logits = kiln_malloc((size_t)g.n_vocab * sizeof(float));
    if (!logits) {
        kiln_err_set(&err, KILN_ERR_NOMEM, "logits");
        goto done;
    }
    if (chat) {
        if (kiln_gen_chat_prompt(g.model, tpl, prompt, &chat_text, &err)) goto done;
        if (kiln_gen_tokenize_chat(g.model, chat_text, &toks, &err)) goto done;
    } else {
        if (kiln_tokenize(v, prompt, strlen(prompt), KILN_TOK_ADD_SPECIAL, &toks, &err)) goto done;
    }
    if (toks.n == 0) {
        kiln_err_set(&err, KILN_ERR_INVALID_ARG, "the prompt has no tokens");
        goto done;
    }
    if ((int64_t)toks.n + n_predict > g.n_ctx) {
        if ((int64_t)toks.n >= g.n_ctx) {
            kiln_err_set(&err, KILN_ERR_RANGE,
                         "prompt of %zu tokens does not fit the context (%lld)", toks.n,
                         (long long)g.n_ctx);
            goto done;
        }
        n_predict = g.n_ctx - (int64_t)toks.n;
    }
    kiln_sampler_params sp;
    kiln_sampler_params_default(&sp);
    sp.temperature = (float)temp;
    sp.top_k = (int32_t)top_k;
    sp.top_p = (float)top_p;
    sp.min_p = (float)min_p;
    sp.repeat_penalty = (float)rep;
    sp.repeat_last_n = (int32_t)last_n;
    sp.frequency_penalty = (float)freq;
    sp.presence_penalty = (float)pres;
    sp.seed = (uint64_t)seed;
    if (kiln_sampler_create(&sp, g.n_vocab, &smp, &err)) goto done;
    for (size_t i = 0; i < toks.n; i++) kiln_sampler_accept(smp, toks.ids[i]);
    const char *stops[1] = {o_stop->seen ? o_stop->value : ""};
    if (kiln_stopper_init(&stop, stops, o_stop->seen ? 1 : 0, NULL, 0, &err)) goto done;
    if (kiln_detok_stream_create(v, false, &ds, &err)) goto done;
    int32_t seq;
    if (kiln_seq_create(g.engine, &seq, &err)) goto done;
    uint64_t t0 = kiln_now_ns();
    if (kiln_gen_prefill(&g, seq, toks.ids, toks.n, logits, &err)) goto done;
    double prompt_ms = kiln_elapsed_ms(t0);
    uint64_t t1 = kiln_now_ns();
    int64_t n_gen = 0;
    bool stopped = false;
    /* greedy without penalties: the engine picks the token inside the LM head (no logits
     * are materialized; the same token the sampler would pick from them) */
    const bool fused_greedy = temp <= 0 && rep == 1.0 && freq == 0 && pres == 0;
    int32_t fused_id = -2; /* -2: none yet (the first token comes from the prefill logits) */
    while (n_gen < n_predict && !stopped) {
        int32_t id = fused_id != -2 ? fused_id : kiln_sampler_sample(smp, logits, g.n_vocab_tok);
        if (id < 0) {
            kiln_err_set(&err, KILN_ERR_INTERNAL,
                         "no token could be sampled (all logits NaN or -inf)");
            goto done;
        }
        n_gen++;
        if (!ignore_eos && kiln_vocab_is_eog(v, id)) break;
        kiln_sampler_accept(smp, id);
        if (print_ids) {
            printf("%d ", id);
        } else {
            const char *txt, *emit;
            size_t len, elen;
            if (kiln_detok_stream_push(ds, id, &txt, &len, &err)) goto done;
            if (kiln_stopper_feed(&stop, txt, len, &emit, &elen, &stopped, &err)) goto done;
            fwrite(emit, 1, elen, stdout);
        }
        fflush(stdout);
        if (n_gen == n_predict || stopped) break;
        kiln_batch_entry b = {seq, id, kiln_seq_len(g.engine, seq), 1};
        if (fused_greedy) {
            if (kiln_engine_step_greedy(g.engine, &b, 1, g.n_vocab_tok, &fused_id, &err)) goto done;
        } else if (kiln_engine_step(g.engine, &b, 1, logits, &err)) {
            goto done;
        }
    }
    if (!print_ids && !stopped) {
        const char *txt, *emit;
        size_t len, elen;
        kiln_detok_stream_flush(ds, &txt, &len);
        if (kiln_stopper_feed(&stop, txt, len, &emit, &elen, &stopped, &err)) goto done;
        fwrite(emit, 1, elen, stdout);
        if (!stopped) {
            kiln_stopper_flush(&stop, &emit, &elen);
            fwrite(emit, 1, elen, stdout);
        }
    }
    printf("\n");
    fflush(stdout);
    double gen_ms = kiln_elapsed_ms(t1);
    fprintf(stderr,
            "kiln run: load %.0f ms; prompt %zu tokens in %.0f ms (%.2f tok/s); generated %lld "
            "tokens in %.0f ms (%.2f tok/s)\n",
            load_ms, toks.n, prompt_ms, prompt_ms > 0 ? (double)toks.n * 1000.0 / prompt_ms : 0.0,
            (long long)n_gen, gen_ms, gen_ms > 0 ? (double)n_gen * 1000.0 / gen_ms : 0.0);
    rc = 0;
done:
    if (rc) kiln_cli_fail("run", &err);
    kiln_detok_stream_free(ds);
    kiln_stopper_free(&stop);
    kiln_sampler_free(smp);
    kiln_tokens_free(&toks);
    kiln_free(chat_text);
    kiln_free(logits);
    kiln_free(prompt_buf);
    kiln_free(tpl);
    kiln_gen_close(&g);
    return rc;
}
