/* cmd_perplexity.c — `kiln perplexity`: not built yet; tracked in issue #5. */
#include "cli/args.h"
#include "cli/commands.h"

#include <stdio.h>

int kiln_cmd_perplexity(int argc, char **argv) {
    static const kiln_cmd_usage u = {"kiln perplexity [options]", "Not implemented yet."};
    const char *pos[64];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, NULL, 0, pos, 64, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;
    fprintf(stderr, "kiln perplexity: not implemented yet (tracked in issue #5)\n");
    return 1;
}
