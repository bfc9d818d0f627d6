/* cmd_version.c — `kiln version`: version, commit and build configuration. */
#include "cli/args.h"
#include "cli/commands.h"

#include <stdio.h>

int kiln_cmd_version(int argc, char **argv) {
    static const kiln_cmd_usage u = {"kiln version", "Print kiln's version, commit and build."};
    const char *pos[1];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, NULL, 0, pos, 0, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;
    printf("kiln %s (commit %s)\n", kiln_version(), KILN_GIT_COMMIT);
    printf("build: C11");
#ifdef KILN_HAVE_CUDA
    printf(" +cuda");
#endif
#ifdef KILN_HAVE_OPENBLAS
    printf(" +openblas");
#endif
#ifdef KILN_HAVE_ONEDNN
    printf(" +onednn");
#endif
#if defined(__SANITIZE_ADDRESS__)
    printf(" +asan");
#endif
    printf("\n");
    return 0;
}
