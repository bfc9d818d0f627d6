/*
 * main.c — `kiln <command> [options]`: dispatches to the subcommands of commands.h.
 */
#include "cli/commands.h"

#include <stdio.h>
#include <string.h>

typedef struct kiln_command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} kiln_command;

#define KILN_CMD_ENTRY(name, summary) {#name, kiln_cmd_##name, summary},
static const kiln_command commands[] = {KILN_CMD_LIST(KILN_CMD_ENTRY)};
#undef KILN_CMD_ENTRY

static void usage(FILE *f) {
    fprintf(f, "usage: kiln <command> [options]   (kiln <command> --help for details)\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) cmd = "version";
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, cmd) == 0) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kiln: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
