/* cmd_tune.c — `kiln tune`: not built yet; tracked in issue #6. */
#include "cli/args.h"
#include "cli/commands.h"

#include <stdio.h>

int kiln_cmd_tune(int argc, char **argv) {
    static const kiln_cmd_usage u = {"kiln tune [options]", "Not implemented yet."};
    const char *pos[64];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, NULL, 0, pos, 64, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;
    fprintf(stderr, "kiln tune: not implemented yet (tracked in issue #6)\n");
    return 1;
}
