/*
 * generate.c — the smallest program that generates text with kiln through its public
 * C API only (include/kiln/kiln.h): open a model, create an engine, stream a
 * continuation of a prompt to stdout.
 *
 * Build against an installed kiln (cmake --install build --prefix PREFIX):
 *   export PKG_CONFIG_PATH=PREFIX/lib/pkgconfig
 *   cc generate.c $(pkg-config --cflags --libs kiln) -o generate
 * Run:
 *   ./generate MODEL.gguf "The capital of France is" 32
 */
#include <kiln/kiln.h>

#include <stdio.h>
#include <stdlib.h>

/* Called once per generated token with the text that token completed (possibly empty
 * while a multi-byte character is incomplete). Returning nonzero would stop early. */
static int on_token(void *user, int32_t token, const char *text, size_t len) {
    int *count = user;
    if (token >= 0) (*count)++; /* token -1: text held back until the end */
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL PROMPT [N_TOKENS]\n", argv[0]);
        return 2;
    }
    kiln_err *err = kiln_err_new();
    kiln_model *model = NULL;
    kiln_engine *engine = NULL;
    int rc = 1, count = 0;
    if (!err) return 1;
    if (kiln_model_load(argv[1], &model, err) != KILN_OK) goto fail;
    if (kiln_model_load_tokenizer(model, err) != KILN_OK) goto fail;

    kiln_engine_opts eo;
    kiln_engine_opts_default(&eo);
    eo.backend = "cpu";
    if (kiln_engine_create(model, &eo, &engine, err) != KILN_OK) goto fail;

    kiln_gen_params gp;
    kiln_gen_params_default(&gp);
    gp.n_predict = argc > 3 ? atoi(argv[3]) : 32;
    gp.temperature = 0; /* greedy: the same text on every run */
    fputs(argv[2], stdout);
    if (kiln_generate(engine, model, argv[2], &gp, on_token, &count, err) != KILN_OK) goto fail;
    printf("\n");
    fprintf(stderr, "generated %d tokens\n", count);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "error: %s\n", kiln_err_message(err));
done:
    kiln_engine_free(engine);
    kiln_model_free(model);
    kiln_err_free(err);
    return rc;
}
