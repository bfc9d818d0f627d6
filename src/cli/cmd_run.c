/*
 * cmd_run.c — `kiln run`: generate text from one prompt.
 *
 * Steps, one function each: parse the options (run_parse), read the prompt and the
 * chat template (run_inputs), open the model and engine (kiln_gen_open), tokenize the
 * prompt (BOS as the model's metadata says; with --chat the model's chat template wraps
 * it first: run_tokens), then generate (kiln_generate_seq, src/runtime/generate.h):
 * prefill in steps of up to 512 tokens, sample one token at a time and stream the exact
 * text to stdout (never a partial UTF-8 character; the first generated token keeps its
 * leading space, so prompt + output is the text of the whole sequence). The prompt is
 * not echoed. Prompt and generation speed go to stderr at the end. Every resource is
 * owned by one run_state and released in one place (run_free), whatever step failed.
 */
#include "base/timer.h"
#include "base/mem.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/gen.h"
#include "runtime/generate.h"
#include "runtime/kselect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct run_opts {
    const char *model, *prompt, *file, *chat_template, *stop, *backend, *numerics;
    const char *policy, *dispatch;
    int64_t n_predict, n_ctx, threads, tp;
    bool chat, ignore_eos, print_ids, kv_f16, load_report;
    kiln_sampler_params sp;
} run_opts;

typedef struct run_state {
    char *prompt_buf; /* -f FILE */
    char *tpl;        /* --chat-template FILE */
    char *chat_text;
    kiln_gen_ctx g;
    bool g_open;
    kiln_tokens toks;
    int32_t seq;
} run_state;

static void run_free(run_state *s) {
    if (s->g_open && s->seq >= 0) kiln_seq_free(s->g.engine, s->seq);
    if (s->g_open) kiln_gen_close(&s->g);
    kiln_tokens_free(&s->toks);
    kiln_free(s->chat_text);
    kiln_free(s->tpl);
    kiln_free(s->prompt_buf);
    memset(s, 0, sizeof(*s));
}

/* 0: parsed; else the exit code (help: 0 is returned through *done). */
static int run_parse(int argc, char **argv, run_opts *o, bool *done) {
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
        {"backend", 0, true, "NAME", KILN_BACKEND_HELP, false, NULL},
        {"chat", 0, false, NULL, "wrap the prompt with the model's chat template", false, NULL},
        {"chat-template", 0, true, "FILE", "Jinja chat template to use instead of the model's",
         false, NULL},
        {"ignore-eos", 0, false, NULL, "do not stop at end-of-generation tokens", false, NULL},
        {"ids", 0, false, NULL, "print token ids instead of text", false, NULL},
        {"stop", 0, true, "TEXT", "stop when this text is generated", false, NULL},
        {"kv-f16", 0, false, NULL, "store the KV cache as f16", false, NULL},
        {"tp", 0, true, "N",
         "tensor parallel: split the model over N ranks (default 1; docs/TP.md)", false, NULL},
        KILN_OPT_LOAD_REPORT,
        {"numerics", 0, true, "MODE",
         "exact (default) or ggml: quantized matmuls with llama.cpp's 8-bit activations", false,
         NULL},
        {"policy", 0, true, "FILE", "kernel policy (kiln.yaml; docs/KERNELS.md)", false, NULL},
        {"dispatch", 0, true, "FILE", "baked dispatch table from kiln solve", false, NULL},
    };
    const size_t no = KILN_NOPTS(opts);
    const char *pos[4];
    int n_pos;
    *done = false;
    int r = kiln_args_parse(argc, argv, &u, opts, no, pos, 4, &n_pos);
    if (r == KILN_ARGS_HELP) {
        *done = true;
        return 0;
    }
    if (r == KILN_ARGS_ERROR) return 2;
#define OPT(name) kiln_opt_find(opts, no, name)
    if (!OPT("model")->seen || (!OPT("prompt")->seen && !OPT("file")->seen)) {
        fprintf(stderr, "kiln run: -m MODEL and -p PROMPT (or -f FILE) are required\n");
        kiln_args_usage(&u, opts, no, true);
        return 2;
    }
    int64_t top_k = 40, seed = 0, last_n = 64;
    double temp = 0.8, top_p = 0.95, min_p = 0.05, rep = 1.0, freq = 0, pres = 0;
    o->n_predict = 128;
    o->tp = 1;
    if (!kiln_opt_int(OPT("n-predict"), 0, 1 << 24, &o->n_predict) ||
        !kiln_opt_int(OPT("top-k"), 0, 1 << 30, &top_k) ||
        !kiln_opt_int(OPT("seed"), 0, INT64_MAX, &seed) ||
        !kiln_opt_int(OPT("ctx-size"), 0, 1 << 24, &o->n_ctx) ||
        !kiln_opt_int(OPT("threads"), 0, 1024, &o->threads) ||
        !kiln_opt_int(OPT("tp"), 1, 64, &o->tp) ||
        !kiln_opt_int(OPT("repeat-last-n"), -1, 1 << 20, &last_n) ||
        !kiln_opt_float(OPT("temp"), 0, 100, &temp) ||
        !kiln_opt_float(OPT("top-p"), 1e-6, 1, &top_p) ||
        !kiln_opt_float(OPT("min-p"), 0, 1, &min_p) ||
        !kiln_opt_float(OPT("repeat-penalty"), 1e-3, 100, &rep) ||
        !kiln_opt_float(OPT("frequency-penalty"), -100, 100, &freq) ||
        !kiln_opt_float(OPT("presence-penalty"), -100, 100, &pres))
        return 2;
    o->model = OPT("model")->value;
    o->prompt = OPT("prompt")->value;
    o->file = OPT("file")->seen ? OPT("file")->value : NULL;
    o->chat_template = OPT("chat-template")->seen ? OPT("chat-template")->value : NULL;
    o->stop = OPT("stop")->seen ? OPT("stop")->value : NULL;
    o->backend = OPT("backend")->value;
    o->numerics = OPT("numerics")->value;
    o->policy = OPT("policy")->value;
    o->dispatch = OPT("dispatch")->value;
    o->chat = OPT("chat")->seen || o->chat_template;
    o->ignore_eos = OPT("ignore-eos")->seen;
    o->print_ids = OPT("ids")->seen;
    o->kv_f16 = OPT("kv-f16")->seen;
    o->load_report = OPT("load-report")->seen;
    const bool tuned = OPT("policy")->seen || OPT("dispatch")->seen;
    if (!tuned) o->policy = o->dispatch = NULL;
#undef OPT
    kiln_sampler_params_default(&o->sp);
    o->sp.temperature = (float)temp;
    o->sp.top_k = (int32_t)top_k;
    o->sp.top_p = (float)top_p;
    o->sp.min_p = (float)min_p;
    o->sp.repeat_penalty = (float)rep;
    o->sp.repeat_last_n = (int32_t)last_n;
    o->sp.frequency_penalty = (float)freq;
    o->sp.presence_penalty = (float)pres;
    o->sp.seed = (uint64_t)seed;
    return 0;
}

/* Reads -f FILE and --chat-template FILE (the shared reader of gen.h). */
static kiln_status run_inputs(const run_opts *o, run_state *s, kiln_err *err) {
    size_t len;
    if (o->file) KILN_TRY(kiln_gen_read_file(o->file, &s->prompt_buf, &len, err));
    if (o->chat_template) KILN_TRY(kiln_gen_read_file(o->chat_template, &s->tpl, &len, err));
    return KILN_OK;
}

/* The prompt's tokens (chat template applied with --chat) into s->toks. */
static kiln_status run_tokens(const run_opts *o, run_state *s, kiln_err *err) {
    const char *prompt = s->prompt_buf ? s->prompt_buf : o->prompt;
    if (o->chat) {
        KILN_TRY(kiln_gen_chat_prompt(s->g.model, s->tpl, prompt, &s->chat_text, err));
        KILN_TRY(kiln_gen_tokenize_chat(s->g.model, s->chat_text, &s->toks, err));
    } else {
        KILN_TRY(kiln_tokenize(s->g.model->vocab, prompt, strlen(prompt), KILN_TOK_ADD_SPECIAL,
                               &s->toks, err));
    }
    if (s->toks.n == 0) return kiln_err_set(err, KILN_ERR_INVALID_ARG, "the prompt has no tokens");
    if ((int64_t)s->toks.n >= s->g.n_ctx)
        return kiln_err_set(err, KILN_ERR_RANGE,
                            "prompt of %zu tokens does not fit the context (%lld)", s->toks.n,
                            (long long)s->g.n_ctx);
    return KILN_OK;
}

static int print_text(void *user, int32_t token, const char *text, size_t len) {
    (void)user;
    (void)token;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static int print_id(void *user, int32_t token, const char *text, size_t len) {
    (void)user;
    (void)text;
    (void)len;
    if (token >= 0) printf("%d ", token);
    fflush(stdout);
    return 0;
}

int kiln_cmd_run(int argc, char **argv) {
    run_opts o;
    memset(&o, 0, sizeof(o));
    bool done;
    int rc = run_parse(argc, argv, &o, &done);
    if (rc || done) return rc;
    kiln_err err;
    kiln_err_clear(&err);
    run_state s;
    memset(&s, 0, sizeof(s));
    s.seq = -1;
    rc = 1;
    if (run_inputs(&o, &s, &err)) goto done;
    if ((o.policy || o.dispatch) &&
        kiln_runtime_selector_configure(o.policy, NULL, o.dispatch, &err))
        goto done;
    kiln_gen_opts go = {.model = o.model,
                        .backend = o.backend,
                        .n_threads = (int32_t)o.threads,
                        .n_ctx = o.n_ctx,
                        .max_seqs = 1,
                        .kv_f16 = o.kv_f16,
                        .numerics = o.numerics,
                        .load_report = o.load_report,
                        .tp = (int32_t)o.tp};
    uint64_t t_load = kiln_now_ns();
    if (kiln_gen_open(&go, &s.g, &err)) goto done;
    s.g_open = true;
    double load_ms = kiln_elapsed_ms(t_load);
    if (run_tokens(&o, &s, &err)) goto done;
    if (kiln_seq_create(s.g.engine, &s.seq, &err)) goto done;
    const char *stops[1] = {o.stop};
    kiln_gen_run r = {.seq = s.seq,
                      .prompt = s.toks.ids,
                      .n_prompt = s.toks.n,
                      .sampling = &o.sp,
                      .n_predict = o.n_predict < s.g.n_ctx - (int64_t)s.toks.n
                                       ? o.n_predict
                                       : s.g.n_ctx - (int64_t)s.toks.n,
                      .stops = stops,
                      .n_stops = o.stop ? 1 : 0,
                      .ignore_eos = o.ignore_eos,
                      .no_text = o.print_ids};
    kiln_gen_stats gs;
    if (kiln_generate_seq(s.g.engine, s.g.model->vocab, &r, o.print_ids ? print_id : print_text,
                          NULL, &gs, &err))
        goto done;
    printf("\n");
    fflush(stdout);
    fprintf(stderr,
            "kiln run: load %.0f ms; prompt %lld tokens in %.0f ms (%.2f tok/s); generated %lld "
            "tokens in %.0f ms (%.2f tok/s)\n",
            load_ms, (long long)gs.n_prompt, gs.prompt_ms,
            gs.prompt_ms > 0 ? (double)gs.n_prompt * 1000.0 / gs.prompt_ms : 0.0,
            (long long)gs.n_gen, gs.gen_ms,
            gs.gen_ms > 0 ? (double)gs.n_gen * 1000.0 / gs.gen_ms : 0.0);
    rc = 0;
done:
    if (rc) kiln_cli_fail("run", &err);
    run_free(&s);
    return rc;
}
