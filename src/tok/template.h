/*
 * template.h — chat templates: render a model's `tokenizer.chat_template` (or a named
 * variant `tokenizer.chat_template.<name>`) for a conversation, exactly as Hugging
 * Face's tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=...,
 * tokenize=False) does with Python jinja2. The engine is jinja.h.
 *
 * The context a template sees: messages (the JSON array as given), tools (the JSON
 * array, or None when absent), documents (None), add_generation_prompt, bos_token and
 * eos_token (undefined when not given), any extra variables (e.g. enable_thinking), and
 * the globals raise_exception, strftime_now, range, namespace, dict.
 *
 * Ownership: the template copies the source; renders return malloc'd text the caller
 * frees. A template may be rendered concurrently. Nothing here aborts on bad input: a
 * syntax error, an unsupported feature or a raise_exception() in the template comes back
 * as a status with a message naming the line and column.
 */
#ifndef KILN_TOK_TEMPLATE_H
#define KILN_TOK_TEMPLATE_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>

struct json_t;

typedef struct kiln_chat_template kiln_chat_template;

typedef struct kiln_chat_inputs {
    const struct json_t *messages; /* JSON array of message objects (required) */
    const struct json_t *tools;    /* JSON array of tool definitions, or NULL (None) */
    const struct json_t *extra;    /* JSON object of extra context variables, or NULL */
    bool add_generation_prompt;
    const char *bos_token; /* NULL: undefined in the template */
    const char *eos_token;
    const char *now_iso; /* strftime_now time; NULL: $KILN_TEMPLATE_NOW, else local time */
} kiln_chat_inputs;

/* Parses a template; name (may be NULL) is used in error messages. */
kiln_status kiln_chat_template_parse(const char *src, size_t len, const char *name,
                                     kiln_chat_template **out, kiln_err *err);
void kiln_chat_template_free(kiln_chat_template *t);

kiln_status kiln_chat_template_render(const kiln_chat_template *t, const kiln_chat_inputs *in,
                                      char **out, size_t *out_len, kiln_err *err);

struct kiln_meta;

/* The model's template text from its metadata: GGUF `tokenizer.chat_template`, or
 * `tokenizer.chat_template.<name>` when name is given. *out is a malloc'd NUL-terminated
 * copy. KILN_ERR_NOT_FOUND names the key and lists the named templates the model has. */
kiln_status kiln_chat_template_from_meta(const struct kiln_meta *m, const char *name, char **out,
                                         size_t *out_len, kiln_err *err);

/* The same from a Hugging Face model directory: chat_template.jinja (default template
 * only), else tokenizer_config.json's "chat_template" (a string, or a list of
 * {"name", "template"}). */
kiln_status kiln_chat_template_from_hf_dir(const char *dir, const char *name, char **out,
                                           size_t *out_len, kiln_err *err);

/* The text of the BOS/EOS tokens named by tokenizer.ggml.bos_token_id / eos_token_id in
 * tokenizer.ggml.tokens (malloc'd; NULL when the model has none). */
kiln_status kiln_chat_template_special_tokens(const struct kiln_meta *m, char **bos, char **eos,
                                              kiln_err *err);

/* The metadata key of a template: "tokenizer.chat_template" for name NULL or "",
 * else "tokenizer.chat_template.<name>". Returns false when out is too small. */
bool kiln_chat_template_key(const char *name, char *out, size_t out_size);

#endif /* KILN_TOK_TEMPLATE_H */
