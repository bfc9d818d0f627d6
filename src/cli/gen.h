/*
 * gen.h — what `kiln run`, `kiln chat` and `kiln perplexity` share: loading a model
 * with its tokenizer and an engine from common flags, prefilling a sequence in
 * chunks, and generating with streaming output.
 */
#ifndef KILN_CLI_GEN_H
#define KILN_CLI_GEN_H

#include "base/status.h"
#include "model/model.h"
#include "sample/sample.h"
#include "tok/tok.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kiln_gen_ctx {
    kiln_model *model;
    kiln_engine *engine;
    int32_t n_vocab;     /* logits per row (output matrix rows)   */
    int32_t n_vocab_tok; /* tokenizer vocabulary (sampling range) */
    int64_t n_ctx;
    int32_t max_step;
    float *logits; /* [max_step][n_vocab] */
} kiln_gen_ctx;

typedef struct kiln_gen_opts {
    const char *model;
    const char *backend;
    int32_t n_threads;
    int64_t n_ctx;
    int32_t max_step;
    int32_t max_seqs;
    bool kv_f16;
    const char *numerics; /* kiln_engine_opts.numerics: NULL/"exact" or "ggml" */
    bool load_report;     /* --load-report: the engine's load report to stderr */
    int32_t tp;           /* tensor-parallel ranks (0, 1: off; docs/TP.md) */
} kiln_gen_opts;

kiln_status kiln_gen_open(const kiln_gen_opts *o, kiln_gen_ctx *g, kiln_err *err);
void kiln_gen_close(kiln_gen_ctx *g);

/* Feeds ids[0..n) to seq (from its current length) in steps of max_step tokens.
 * When last_logits is not NULL it receives the logits after the last token. */
kiln_status kiln_gen_prefill(kiln_gen_ctx *g, int32_t seq, const int32_t *ids, size_t n,
                             float *last_logits, kiln_err *err);

struct json_t;
/* Renders a conversation (JSON array of {role, content}) with the generation prompt,
 * using `tpl` (text of --chat-template) when not NULL, else the model's template, else
 * the built-in Gemma one for gemma models without a template. *out is malloc'ed. */
kiln_status kiln_gen_render_chat(const kiln_model *m, const char *tpl,
                                 const struct json_t *messages, char **out, kiln_err *err);
/* Tokenizes rendered chat text: special tokens parsed, BOS added unless the text
 * already starts with the BOS text. */
kiln_status kiln_gen_tokenize_chat(const kiln_model *m, const char *text, kiln_tokens *out,
                                   kiln_err *err);

/* Formats a chat prompt with the model's template: one user message, generation
 * prompt added. *out is malloc'ed. */
kiln_status kiln_gen_chat_prompt(const kiln_model *m, const char *tpl, const char *user, char **out,
                                 kiln_err *err);

/* Reads a whole file into a malloc'ed NUL-terminated buffer. */
kiln_status kiln_gen_read_file(const char *path, char **out, size_t *len, kiln_err *err);

#endif /* KILN_CLI_GEN_H */
