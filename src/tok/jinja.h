/*
 * jinja.h — kiln's Jinja-subset template engine (the part of Jinja2 that chat templates
 * use), rendering byte-identically to Python jinja2 in the environment Hugging Face's
 * apply_chat_template builds: ImmutableSandboxedEnvironment, trim_blocks=True,
 * lstrip_blocks=True, the loopcontrols extension (break/continue), `{% generation %}`
 * blocks, and the globals raise_exception and strftime_now, with transformers' `tojson`
 * (json.dumps with ensure_ascii=False). docs/TEMPLATES.md lists what is supported.
 *
 * Usage:
 *   jinja_template *t;
 *   if (jinja_parse(src, len, &t, err)) ...   // syntax errors name line and column
 *   jinja_vars v = {0};
 *   jinja_vars_json(&v, "messages", messages_json);
 *   jinja_vars_bool(&v, "add_generation_prompt", true);
 *   char *text; size_t n;
 *   if (jinja_render(t, &v, &text, &n, err)) ...  // runtime errors name line and column
 *   free(text);
 *   jinja_free(t);
 *
 * Ownership: jinja_parse copies what it needs from src; the template is immutable after
 * parsing and may be rendered from several threads at once (each render has its own
 * arena). jinja_render returns a malloc'd NUL-terminated string the caller frees.
 * Errors never abort: every failure returns a status with a message in err, including
 * raise_exception() calls from the template (the message is the template's).
 */
#ifndef KILN_TOK_JINJA_H
#define KILN_TOK_JINJA_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>

struct json_t;

typedef struct jinja_template jinja_template;

#define JINJA_MAX_VARS 32

/* Variables of the render context. Each entry is a JSON value (borrowed; must outlive
 * the render call), a string (borrowed) or a boolean. */
typedef struct jinja_vars {
    size_t n;
    const char *names[JINJA_MAX_VARS];
    const struct json_t *json[JINJA_MAX_VARS];
    const char *str[JINJA_MAX_VARS];
    bool boolean[JINJA_MAX_VARS];
    /* time for strftime_now as ISO 8601 "YYYY-MM-DDTHH:MM:SS"; NULL: local time */
    const char *now_iso;
    /* limit on bytes a render may allocate for values and output (0: 1 GiB) */
    size_t max_bytes;
    /* limit on evaluation steps (expressions + statements; 0: 100 million), so that a
     * hostile template cannot loop for hours */
    uint64_t max_steps;
} jinja_vars;

/* Adders return false when JINJA_MAX_VARS is reached. A later entry with the same name
 * replaces an earlier one. */
bool jinja_vars_json(jinja_vars *v, const char *name, const struct json_t *value);
bool jinja_vars_str(jinja_vars *v, const char *name, const char *value);
bool jinja_vars_bool(jinja_vars *v, const char *name, bool value);

kiln_status jinja_parse(const char *src, size_t len, jinja_template **out, kiln_err *err);
void jinja_free(jinja_template *t);

kiln_status jinja_render(const jinja_template *t, const jinja_vars *vars, char **out,
                         size_t *out_len, kiln_err *err);

#endif /* KILN_TOK_JINJA_H */
