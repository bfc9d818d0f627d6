/* cmd_template.c — `kiln template`: render a chat template for a conversation, byte-exactly
 * as transformers' apply_chat_template(..., tokenize=False) with Python jinja2 would. */
#include "cli/args.h"
#include "base/mem.h"
#include "cli/commands.h"
#include "cli/gen.h"
#include "format/model_file.h"
#include "tok/template.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kiln_status load_json(const char *path, json_t **out, kiln_err *err) {
    json_error_t je;
    *out = json_load_file(path, JSON_DECODE_ANY, &je);
    if (!*out)
        return kiln_err_set(err, KILN_ERR_FORMAT, "%s:%d:%d: %s", path, je.line, je.column,
                            je.text);
    return KILN_OK;
}

/* The model's template (GGUF metadata, or a Hugging Face directory's files) and its
 * BOS/EOS token texts (malloc'd, may be NULL). */
static kiln_status template_from_model(const char *model, const char *name, char **out, size_t *len,
                                       char **bos, char **eos, kiln_err *err) {
    char path[4096];
    KILN_TRY(kiln_resolve_model(model, path, sizeof path, err));
    kiln_model_file *mf = NULL;
    KILN_TRY(kiln_model_file_open(path, 0, &mf, err));
    const kiln_meta *m = kiln_model_file_meta(mf);
    kiln_status st = kiln_chat_template_from_meta(m, name, out, len, err);
    if (st == KILN_ERR_NOT_FOUND && kiln_model_file_source(mf) != KILN_SOURCE_GGUF) {
        /* safetensors: the template lives next to tokenizer.json */
        const char *tj = kiln_model_file_tokenizer_json(mf);
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", tj ? tj : path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(dir, sizeof dir, ".");
        kiln_err_clear(err);
        st = kiln_chat_template_from_hf_dir(dir, name, out, len, err);
    }
    if (!st) st = kiln_chat_template_special_tokens(m, bos, eos, err);
    if (st) {
        kiln_free(*out);
        *out = NULL;
        kiln_err_wrap(err, st, "%s", path);
    }
    kiln_model_file_close(mf);
    return st;
}

int kiln_cmd_template(int argc, char **argv) {
    static const kiln_cmd_usage u = {
        "kiln template (--template FILE.jinja | -m MODEL) --messages FILE.json [options]",
        "Render a chat template for a conversation and print the text byte-exactly to stdout, "
        "as Hugging Face's apply_chat_template(tokenize=False) with Python jinja2 does. "
        "--messages is a JSON array of messages; --tools a JSON array of tool definitions; "
        "--vars a JSON object of extra template variables (e.g. {\"enable_thinking\": false}). "
        "strftime_now uses $KILN_TEMPLATE_NOW (ISO 8601) when set, else the local time."};
    kiln_opt opts[] = {
        {"template", 0, true, "FILE", "template file (Jinja)", false, NULL},
        {"model", 'm', true, "MODEL", "use the model's own template (GGUF metadata)", false, NULL},
        {"name", 0, true, "NAME", "named template variant (tokenizer.chat_template.NAME)", false,
         NULL},
        {"messages", 0, true, "FILE", "conversation: JSON array of messages", false, NULL},
        {"tools", 0, true, "FILE", "tool definitions: JSON array", false, NULL},
        {"vars", 0, true, "FILE", "extra template variables: JSON object", false, NULL},
        {"add-generation-prompt", 0, false, NULL, "end with the assistant turn's header", false,
         NULL},
        {"bos", 0, true, "TEXT", "bos_token (default: the model's, else undefined)", false, NULL},
        {"eos", 0, true, "TEXT", "eos_token (default: the model's, else undefined)", false, NULL},
    };
    const char *pos[1];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, opts, KILN_NOPTS(opts), pos, 0, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;
    kiln_opt *o_tpl = &opts[0], *o_model = &opts[1], *o_name = &opts[2], *o_msgs = &opts[3],
             *o_tools = &opts[4], *o_vars = &opts[5];
    if (o_tpl->seen == o_model->seen || !o_msgs->seen) {
        fprintf(stderr, "kiln template: give --messages and exactly one of --template or -m\n");
        kiln_args_usage(&u, opts, KILN_NOPTS(opts), true);
        return 2;
    }
    kiln_err err;
    kiln_err_clear(&err);
    char *src = NULL, *text = NULL, *model_bos = NULL, *model_eos = NULL;
    size_t src_len = 0, text_len = 0;
    json_t *msgs = NULL, *tools = NULL, *vars = NULL;
    kiln_chat_template *t = NULL;
    int rc = 1;
    kiln_status st;
    if (o_tpl->seen) {
        st = kiln_gen_read_file(o_tpl->value, &src, &src_len, &err);
    } else {
        st = template_from_model(o_model->value, o_name->seen ? o_name->value : NULL, &src,
                                 &src_len, &model_bos, &model_eos, &err);
    }
    if (st) goto fail;
    if ((st = load_json(o_msgs->value, &msgs, &err))) goto fail;
    if (o_tools->seen && (st = load_json(o_tools->value, &tools, &err))) goto fail;
    if (o_vars->seen && (st = load_json(o_vars->value, &vars, &err))) goto fail;
    if ((st = kiln_chat_template_parse(src, src_len, o_tpl->seen ? o_tpl->value : o_model->value,
                                       &t, &err)))
        goto fail;
    kiln_chat_inputs in = {
        .messages = msgs,
        .tools = tools,
        .extra = vars,
        .add_generation_prompt = opts[6].seen,
        .bos_token = opts[7].seen ? opts[7].value : model_bos,
        .eos_token = opts[8].seen ? opts[8].value : model_eos,
    };
    if ((st = kiln_chat_template_render(t, &in, &text, &text_len, &err))) goto fail;
    if (fwrite(text, 1, text_len, stdout) != text_len || fflush(stdout) != 0) {
        kiln_err_errno(&err, errno, "writing to stdout");
        goto fail;
    }
    rc = 0;
    goto done;
fail:
    rc = kiln_cli_fail("template", &err);
done:
    kiln_free(text);
    kiln_free(src);
    kiln_free(model_bos);
    kiln_free(model_eos);
    kiln_chat_template_free(t);
    json_decref(msgs);
    json_decref(tools);
    json_decref(vars);
    return rc;
}
