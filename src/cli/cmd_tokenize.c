/* cmd_tokenize.c — `kiln tokenize`: text to token ids with a model's tokenizer. */
#include "cli/args.h"
#include "base/mem.h"
#include "cli/commands.h"
#include "tok/tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* All of stdin, byte-exactly. */
static kiln_status read_stdin(char **out, size_t *len, kiln_err *err) {
    size_t cap = 1 << 16, n = 0;
    char *p = kiln_malloc(cap);
    if (!p) return kiln_err_set(err, KILN_ERR_NOMEM, "reading stdin: out of memory");
    for (;;) {
        n += fread(p + n, 1, cap - n, stdin);
        if (n < cap) break;
        char *np = cap < SIZE_MAX / 2 ? kiln_realloc(p, cap * 2) : NULL;
        if (!np) {
            kiln_free(p);
            return kiln_err_set(err, KILN_ERR_NOMEM, "reading stdin: out of memory");
        }
        p = np;
        cap *= 2;
    }
    if (ferror(stdin)) {
        kiln_free(p);
        return kiln_err_set(err, KILN_ERR_IO, "reading stdin failed");
    }
    *out = p;
    *len = n;
    return KILN_OK;
}

int kiln_cmd_tokenize(int argc, char **argv) {
    static const kiln_cmd_usage u = {
        "kiln tokenize -m MODEL [--add-special] [--parse-special] [--ids] [TEXT]",
        "Tokenize TEXT, or all of standard input byte-exactly when TEXT is absent. With --ids, "
        "print the ids on one line separated by single spaces; otherwise one token per line as "
        "`id -> 'piece'`. Without --add-special no BOS/EOS is added; without --parse-special "
        "text such as \"<start_of_turn>\" is tokenized as plain text. MODEL may be a "
        "vocab-only GGUF."};
    kiln_opt opts[] = {
        {"model", 'm', true, "MODEL", "model file or cached model name", false, NULL},
        {"add-special", 0, false, NULL, "add BOS/EOS as the model asks", false, NULL},
        {"parse-special", 0, false, NULL, "turn special-token text into special tokens", false,
         NULL},
        {"ids", 0, false, NULL, "print only the ids, on one line", false, NULL},
    };
    const char *pos[1];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, opts, KILN_NOPTS(opts), pos, 1, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;
    if (!opts[0].seen) {
        fprintf(stderr, "kiln tokenize: -m MODEL is required\n");
        kiln_args_usage(&u, opts, KILN_NOPTS(opts), true);
        return 2;
    }
    kiln_err err;
    char path[4096];
    if (kiln_resolve_model(opts[0].value, path, sizeof path, &err))
        return kiln_cli_fail("tokenize", &err);
    kiln_vocab *v;
    if (kiln_vocab_load(path, &v, &err)) return kiln_cli_fail("tokenize", &err);
    char *text = NULL;
    size_t len = 0;
    if (n_pos == 1) {
        len = strlen(pos[0]);
    } else if (read_stdin(&text, &len, &err)) {
        kiln_vocab_free(v);
        return kiln_cli_fail("tokenize", &err);
    }
    unsigned flags =
        (opts[1].seen ? KILN_TOK_ADD_SPECIAL : 0) | (opts[2].seen ? KILN_TOK_PARSE_SPECIAL : 0);
    kiln_tokens t = {0};
    int rc = 0;
    if (kiln_tokenize(v, text ? text : pos[0], len, flags, &t, &err)) {
        rc = kiln_cli_fail("tokenize", &err);
    } else if (opts[3].seen) {
        for (size_t i = 0; i < t.n; i++) printf(i ? " %d" : "%d", t.ids[i]);
        printf("\n");
    } else {
        for (size_t i = 0; i < t.n; i++) {
            kiln_str p = kiln_token_piece(v, t.ids[i], true, 0);
            printf("%6d -> '%.*s'\n", t.ids[i], (int)p.len, p.ptr);
        }
    }
    if (fflush(stdout) != 0 && rc == 0) {
        fprintf(stderr, "kiln tokenize: writing the output failed\n");
        rc = 1;
    }
    kiln_tokens_free(&t);
    kiln_free(text);
    kiln_vocab_free(v);
    return rc;
}
