/* cmd_detokenize.c — `kiln detokenize`: token ids to text with a model's tokenizer. */
#include "cli/args.h"
#include "base/mem.h"
#include "cli/commands.h"
#include "tok/tok.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int kiln_cmd_detokenize(int argc, char **argv) {
    static const kiln_cmd_usage u = {
        "kiln detokenize -m MODEL [--no-special] ID...",
        "Print the text of the token ids, byte-exactly as llama.cpp's detokenizer gives it "
        "(special tokens rendered as their text unless --no-special; a newline is added only "
        "when stdout is a terminal). Ids may also be given as one argument with spaces."};
    kiln_opt opts[] = {
        {"model", 'm', true, "MODEL", "model file or cached model name", false, NULL},
        {"no-special", 0, false, NULL, "render control tokens (BOS, EOS...) as nothing", false,
         NULL},
    };
    enum { MAX_POS = 1 << 16 };
    const char **pos = kiln_malloc(sizeof(char *) * MAX_POS);
    if (!pos) return 1;
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, opts, KILN_NOPTS(opts), pos, MAX_POS, &n_pos);
    if (r != KILN_ARGS_OK) {
        kiln_free(pos);
        return r == KILN_ARGS_HELP ? 0 : 2;
    }
    if (!opts[0].seen) {
        fprintf(stderr, "kiln detokenize: -m MODEL is required\n");
        kiln_args_usage(&u, opts, KILN_NOPTS(opts), true);
        kiln_free(pos);
        return 2;
    }
    /* ids: every positional argument, each possibly holding several space-separated ids */
    size_t n = 0, cap = 256;
    kiln_token *ids = kiln_malloc(cap * sizeof *ids);
    for (int i = 0; i < n_pos && ids; i++) {
        const char *p = pos[i];
        for (;;) {
            while (*p == ' ' || *p == '\t' || *p == '\n' || *p == ',') p++;
            if (!*p) break;
            char *end;
            errno = 0;
            long long id = strtoll(p, &end, 10);
            if (end == p || errno || id < 0 || id > INT32_MAX ||
                (*end && *end != ' ' && *end != '\t' && *end != '\n' && *end != ',')) {
                fprintf(stderr, "kiln detokenize: '%s' is not a token id\n", pos[i]);
                kiln_free(ids);
                kiln_free(pos);
                return 2;
            }
            if (n == cap) {
                kiln_token *ni = kiln_realloc(ids, 2 * cap * sizeof *ids);
                if (!ni) break;
                ids = ni;
                cap *= 2;
            }
            ids[n++] = (kiln_token)id;
            p = end;
        }
    }
    kiln_free(pos);
    if (!ids) return 1;
    kiln_err err;
    char path[4096];
    kiln_vocab *v = NULL;
    int rc = 0;
    char *text = NULL;
    size_t len = 0;
    if (kiln_resolve_model(opts[0].value, path, sizeof path, &err) ||
        kiln_vocab_load(path, &v, &err) ||
        kiln_detokenize(v, ids, n, opts[1].seen ? 0 : KILN_DETOK_UNPARSE_SPECIAL, &text, &len,
                        &err)) {
        rc = kiln_cli_fail("detokenize", &err);
    } else {
        fwrite(text, 1, len, stdout);
        if (isatty(STDOUT_FILENO)) fputc('\n', stdout);
        if (fflush(stdout) != 0) {
            fprintf(stderr, "kiln detokenize: writing the output failed\n");
            rc = 1;
        }
    }
    kiln_free(text);
    kiln_free(ids);
    kiln_vocab_free(v);
    return rc;
}
