/*
 * cmd_chat.c — `kiln chat`: a multi-turn conversation in the terminal.
 *
 * Each turn renders the whole conversation with the model's chat template, tokenizes
 * it, and reuses the sequence's cached prefix: the KV cache is truncated to the
 * longest common prefix of the new tokens and the tokens already fed, so only the new
 * user turn is prefilled (multi-turn reuse of the sequence's own history); each turn
 * prints how many prompt tokens it prefilled and how many it reused. Line editing and
 * history come from libedit. Commands: /reset, /system TEXT, /save FILE (the conversation
 * as JSON, written atomically), /load FILE, /help, /quit. Ctrl-C stops the reply being
 * generated (the partial reply stays in the conversation); Ctrl-D leaves.
 */
#include "cli/args.h"
#include "base/mem.h"
#include "cli/commands.h"
#include "cli/gen.h"

#include "base/timer.h"

#include <editline/readline.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct chat_state {
    kiln_gen_ctx g;
    int32_t seq;
    kiln_tokens fed; /* tokens whose KV is cached, in order */
    kiln_sampler *smp;
    json_t *msgs;
    int64_t n_predict;
    const char *tpl; /* --chat-template text, or NULL for the model's */
    bool quit;
} chat_state;

/* Set by SIGINT while a reply is generated: the turn stops at the next token. */
static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static kiln_status append_fed(kiln_tokens *t, int32_t id, kiln_err *err) {
    if (t->n == t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 256;
        kiln_token *q = kiln_realloc(t->ids, nc * sizeof(kiln_token));
        if (!q) return kiln_err_set(err, KILN_ERR_NOMEM, "chat history");
        t->ids = q;
        t->cap = nc;
    }
    t->ids[t->n++] = id;
    return KILN_OK;
}

/* One turn: returns the assistant's reply (malloc'ed) after streaming it. */
static kiln_status turn(chat_state *c, char **reply, kiln_err *err) {
    char *text = NULL;
    kiln_tokens toks = {0};
    float *logits = NULL;
    kiln_detok_stream *ds = NULL;
    char *out = NULL;
    size_t out_len = 0, out_cap = 0;
    kiln_status st = kiln_gen_render_chat(c->g.model, c->tpl, c->msgs, &text, err);
    if (!st) st = kiln_gen_tokenize_chat(c->g.model, text, &toks, err);
    if (st) goto done;
    if ((int64_t)toks.n + 1 >= c->g.n_ctx) {
        st = kiln_err_set(err, KILN_ERR_RANGE,
                          "the conversation (%zu tokens) no longer fits the context (%lld); /reset",
                          toks.n, (long long)c->g.n_ctx);
        goto done;
    }
    /* reuse the common prefix (keep at least one token to recompute logits) */
    size_t common = 0;
    while (common < toks.n && common < c->fed.n && toks.ids[common] == c->fed.ids[common]) common++;
    if (common == toks.n) common--;
    if ((st = kiln_seq_truncate(c->g.engine, c->seq, (int32_t)common, err))) goto done;
    c->fed.n = common;
    logits = kiln_malloc(sizeof(float) * (size_t)c->g.n_vocab);
    if (!logits) {
        st = kiln_err_set(err, KILN_ERR_NOMEM, "logits");
        goto done;
    }
    uint64_t t0 = kiln_now_ns();
    if ((st = kiln_gen_prefill(&c->g, c->seq, toks.ids + common, toks.n - common, logits, err)))
        goto done;
    for (size_t i = common; i < toks.n; i++)
        if ((st = append_fed(&c->fed, toks.ids[i], err))) goto done;
    double prompt_ms = kiln_elapsed_ms(t0);
    const kiln_vocab *v = c->g.model->vocab;
    if ((st = kiln_detok_stream_create(v, false, &ds, err))) goto done;
    uint64_t t1 = kiln_now_ns();
    int64_t n = 0;
    while (n < c->n_predict && (int64_t)c->fed.n < c->g.n_ctx && !g_interrupted) {
        int32_t id = kiln_sampler_sample(c->smp, logits, c->g.n_vocab_tok);
        if (id < 0 || kiln_vocab_is_eog(v, id)) break;
        kiln_sampler_accept(c->smp, id);
        n++;
        const char *piece;
        size_t len;
        if ((st = kiln_detok_stream_push(ds, id, &piece, &len, err))) goto done;
        fwrite(piece, 1, len, stdout);
        fflush(stdout);
        if (out_len + len + 1 > out_cap) {
            out_cap = (out_len + len + 1) * 2;
            char *q = kiln_realloc(out, out_cap);
            if (!q) {
                st = kiln_err_set(err, KILN_ERR_NOMEM, "reply");
                goto done;
            }
            out = q;
        }
        memcpy(out + out_len, piece, len);
        out_len += len;
        kiln_batch_entry b = {c->seq, id, (int32_t)c->fed.n, 1};
        if ((st = kiln_engine_step(c->g.engine, &b, 1, logits, err))) goto done;
        if ((st = append_fed(&c->fed, id, err))) goto done;
    }
    double gen_ms = kiln_elapsed_ms(t1);
    if (g_interrupted) printf(" [stopped]");
    printf("\n");
    fprintf(stderr, "[%zu new prompt tokens (%zu reused) %.1f tok/s; %lld generated %.1f tok/s]\n",
            toks.n - common, common,
            prompt_ms > 0 ? (double)(toks.n - common) * 1000 / prompt_ms : 0.0, (long long)n,
            gen_ms > 0 ? (double)n * 1000 / gen_ms : 0.0);
    if (!out)
        out = kiln_calloc(1, 1);
    else
        out[out_len] = 0;
    *reply = out;
    out = NULL;
done:
    kiln_free(out);
    kiln_detok_stream_free(ds);
    kiln_free(logits);
    kiln_tokens_free(&toks);
    kiln_free(text);
    return st;
}

static void reset_conversation(chat_state *c, const char *sys) {
    json_array_clear(c->msgs);
    if (sys)
        json_array_append_new(c->msgs, json_pack("{s:s, s:s}", "role", "system", "content", sys));
    kiln_seq_truncate(c->g.engine, c->seq, 0, NULL);
    c->fed.n = 0;
}

/* Writes the conversation to path atomically: a temporary file in the same directory,
 * fsync'ed, then renamed over path. */
static kiln_status save_conversation(const chat_state *c, const char *path, kiln_err *err) {
    char tmp[4200];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof(tmp))
        return kiln_err_set(err, KILN_ERR_RANGE, "/save: path too long");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return kiln_err_errno(err, errno, "/save: creating %s", tmp);
    if (json_dumpfd(c->msgs, fd, JSON_INDENT(2)) != 0 || write(fd, "\n", 1) != 1 ||
        fsync(fd) != 0) {
        kiln_status st = kiln_err_errno(err, errno, "/save: writing %s", tmp);
        close(fd);
        unlink(tmp);
        return st;
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        kiln_status st = kiln_err_errno(err, errno, "/save: writing %s", path);
        unlink(tmp);
        return st;
    }
    return KILN_OK;
}

/* Reads a conversation saved by /save (a JSON array of {role, content} strings). */
static kiln_status load_conversation(chat_state *c, const char *path, char **sys, kiln_err *err) {
    json_error_t je;
    json_t *a = json_load_file(path, 0, &je);
    if (!a) return kiln_err_set(err, KILN_ERR_FORMAT, "/load: %s:%d: %s", path, je.line, je.text);
    size_t i;
    json_t *m;
    if (!json_is_array(a)) {
        json_decref(a);
        return kiln_err_set(err, KILN_ERR_FORMAT, "/load: %s: not a JSON array of messages", path);
    }
    json_array_foreach(a, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || !json_is_string(json_object_get(m, "content")) ||
            (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant"))) {
            json_decref(a);
            return kiln_err_set(err, KILN_ERR_FORMAT,
                                "/load: %s: message %zu needs a role (system, user, assistant) "
                                "and a string content",
                                path, i);
        }
    }
    json_decref(c->msgs);
    c->msgs = a;
    kiln_free(*sys);
    *sys = NULL;
    json_t *first = json_array_get(a, 0);
    if (first && !strcmp(json_string_value(json_object_get(first, "role")), "system"))
        *sys = kiln_strdup(json_string_value(json_object_get(first, "content")));
    /* the KV cache keeps whatever prefix the loaded conversation shares with it */
    return KILN_OK;
}

/* Handles a /command; returns false when line is not one (sent as a message). */
static bool command(chat_state *c, const char *line, char **sys) {
    kiln_err err;
    kiln_err_clear(&err);
    const char *arg = strchr(line, ' ');
    size_t n = arg ? (size_t)(arg - line) : strlen(line);
    while (arg && *arg == ' ') arg++;
    if (arg && !*arg) arg = NULL;
#define IS(name) (n == strlen(name) && !strncmp(line, name, n))
    if (IS("/quit") || IS("/exit")) {
        c->quit = true;
    } else if (IS("/help")) {
        printf("/reset        forget the conversation (keeps the system prompt)\n"
               "/system TEXT  set the system prompt and start over (/system alone clears it)\n"
               "/save FILE    write the conversation as JSON\n"
               "/load FILE    continue a saved conversation\n"
               "/quit         leave (or Ctrl-D); Ctrl-C stops a reply\n");
    } else if (IS("/reset")) {
        reset_conversation(c, *sys);
        printf("[conversation reset]\n");
    } else if (IS("/system")) {
        kiln_free(*sys);
        *sys = arg ? kiln_strdup(arg) : NULL;
        reset_conversation(c, *sys);
        printf(arg ? "[system prompt set; conversation reset]\n"
                   : "[system prompt cleared; conversation reset]\n");
    } else if (IS("/save")) {
        if (!arg)
            printf("usage: /save FILE\n");
        else if (save_conversation(c, arg, &err))
            kiln_cli_fail("chat", &err);
        else
            printf("[saved %zu messages to %s]\n", json_array_size(c->msgs), arg);
    } else if (IS("/load")) {
        if (!arg)
            printf("usage: /load FILE\n");
        else if (load_conversation(c, arg, sys, &err))
            kiln_cli_fail("chat", &err);
        else
            printf("[loaded %zu messages from %s]\n", json_array_size(c->msgs), arg);
    } else {
        return false;
    }
#undef IS
    fflush(stdout);
    return true;
}

int kiln_cmd_chat(int argc, char **argv) {
    static const kiln_cmd_usage u = {
        "kiln chat -m MODEL [options]",
        "Multi-turn chat in the terminal with the model's chat template. Commands: /reset, "
        "/system TEXT, /save FILE, /load FILE, /help, /quit (or Ctrl-D). Ctrl-C stops a reply."};
    kiln_opt opts[] = {
        {"model", 'm', true, "MODEL", "model file or short name (gemma3-270m)", false, NULL},
        {"system", 0, true, "TEXT", "system prompt", false, NULL},
        {"chat-template", 0, true, "FILE", "Jinja chat template to use instead of the model's",
         false, NULL},
        {"n-predict", 'n', true, "N", "max tokens per reply (default 512)", false, NULL},
        {"temp", 0, true, "T", "temperature (default 0.8; 0 = greedy)", false, NULL},
        {"top-k", 0, true, "K", "top-k (default 40)", false, NULL},
        {"top-p", 0, true, "P", "top-p (default 0.95)", false, NULL},
        {"min-p", 0, true, "P", "min-p (default 0.05)", false, NULL},
        {"seed", 's', true, "S", "RNG seed (default 0)", false, NULL},
        {"ctx-size", 'c', true, "N", "context size (default min(4096, trained))", false, NULL},
        {"threads", 't', true, "N", "threads (default: all cores)", false, NULL},
        {"backend", 0, true, "NAME", KILN_BACKEND_HELP, false, NULL},
        {"tp", 0, true, "N",
         "tensor parallel: split the model over N ranks (default 1; docs/TP.md)", false, NULL},
        KILN_OPT_LOAD_REPORT,
    };
    const char *pos[4];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, opts, KILN_NOPTS(opts), pos, 4, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;
    kiln_opt *o_m = kiln_opt_find(opts, KILN_NOPTS(opts), "model");
    if (!o_m->seen) {
        fprintf(stderr, "kiln chat: -m MODEL is required\n");
        return 2;
    }
    int64_t n_predict = 512, top_k = 40, seed = 0, n_ctx = 0, threads = 0, tp = 1;
    double temp = 0.8, top_p = 0.95, min_p = 0.05;
    if (!kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "n-predict"), 1, 1 << 24, &n_predict) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "top-k"), 0, 1 << 30, &top_k) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "seed"), 0, INT64_MAX, &seed) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "ctx-size"), 0, 1 << 24, &n_ctx) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "threads"), 0, 1024, &threads) ||
        !kiln_opt_int(kiln_opt_find(opts, KILN_NOPTS(opts), "tp"), 1, 64, &tp) ||
        !kiln_opt_float(kiln_opt_find(opts, KILN_NOPTS(opts), "temp"), 0, 100, &temp) ||
        !kiln_opt_float(kiln_opt_find(opts, KILN_NOPTS(opts), "top-p"), 1e-6, 1, &top_p) ||
        !kiln_opt_float(kiln_opt_find(opts, KILN_NOPTS(opts), "min-p"), 0, 1, &min_p))
        return 2;
    chat_state c;
    memset(&c, 0, sizeof(c));
    c.n_predict = n_predict;
    kiln_err err;
    kiln_err_clear(&err);
    kiln_gen_opts go = {.model = o_m->value,
                        .backend = kiln_opt_find(opts, KILN_NOPTS(opts), "backend")->value,
                        .n_threads = (int32_t)threads,
                        .n_ctx = n_ctx,
                        .max_seqs = 1,
                        .load_report = kiln_opt_find(opts, KILN_NOPTS(opts), "load-report")->seen,
                        .tp = (int32_t)tp};
    kiln_opt *o_tpl = kiln_opt_find(opts, KILN_NOPTS(opts), "chat-template");
    char *tpl = NULL;
    if (o_tpl->seen) {
        size_t tl;
        if (kiln_gen_read_file(o_tpl->value, &tpl, &tl, &err)) return kiln_cli_fail("chat", &err);
    }
    if (kiln_gen_open(&go, &c.g, &err)) {
        kiln_free(tpl);
        return kiln_cli_fail("chat", &err);
    }
    c.tpl = tpl;
    int rc = 1;
    kiln_sampler_params sp;
    kiln_sampler_params_default(&sp);
    sp.temperature = (float)temp;
    sp.top_k = (int32_t)top_k;
    sp.top_p = (float)top_p;
    sp.min_p = (float)min_p;
    sp.seed = (uint64_t)seed;
    if (kiln_sampler_create(&sp, c.g.n_vocab, &c.smp, &err)) goto done;
    if (kiln_seq_create(c.g.engine, &c.seq, &err)) goto done;
    const char *sys0 = kiln_opt_find(opts, KILN_NOPTS(opts), "system")->value;
    char *sys = sys0 ? kiln_strdup(sys0) : NULL;
    c.msgs = json_array();
    if (!c.msgs) goto done;
    if (sys)
        json_array_append_new(c.msgs, json_pack("{s:s, s:s}", "role", "system", "content", sys));
    bool tty = isatty(0);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    if (tty)
        fprintf(stderr,
                "kiln chat: %s (%s backend). /help for commands, Ctrl-C stops a reply, "
                "Ctrl-D leaves\n",
                c.g.model->path, kiln_cli_backend(go.backend));
    for (;;) {
        g_interrupted = 0;
        char *line = readline(tty ? "> " : "");
        if (!line) {
            if (g_interrupted) continue; /* Ctrl-C at the prompt: a new line */
            break;
        }
        if (!*line) {
            kiln_free(line);
            continue;
        }
        if (tty) add_history(line);
        if (line[0] == '/' && command(&c, line, &sys)) {
            bool quit = c.quit;
            kiln_free(line);
            if (quit) break;
            continue;
        }
        json_array_append_new(c.msgs, json_pack("{s:s, s:s}", "role", "user", "content", line));
        kiln_free(line);
        char *reply = NULL;
        if (turn(&c, &reply, &err)) {
            kiln_cli_fail("chat", &err);
            json_array_remove(c.msgs, json_array_size(c.msgs) - 1);
            kiln_err_clear(&err);
            continue;
        }
        json_array_append_new(c.msgs,
                              json_pack("{s:s, s:s}", "role", "assistant", "content", reply));
        kiln_free(reply);
    }
    kiln_free(sys);
    rc = 0;
done:
    if (rc) kiln_cli_fail("chat", &err);
    json_decref(c.msgs);
    kiln_tokens_free(&c.fed);
    kiln_sampler_free(c.smp);
    kiln_gen_close(&c.g);
    kiln_free(tpl);
    return rc;
}
