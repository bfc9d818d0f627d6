/*
 * args.h — a small option parser shared by every `kiln` subcommand.
 *
 * A command declares a table of kiln_opt (long name, optional short letter, whether it
 * takes a value, help text) and calls kiln_args_parse. Unknown flags and missing values
 * print an error plus the command's usage to stderr and make the parse fail, after which
 * the command exits 2. `--help`/`-h` print the usage to stdout and exit 0 (the parse
 * returns KILN_ARGS_HELP). `--` ends options. Values are pointers into argv.
 */
#ifndef KILN_CLI_ARGS_H
#define KILN_CLI_ARGS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kiln_opt {
    const char *name; /* long name without "--" */
    char short_name;  /* 0 for none */
    bool has_value;
    const char *metavar; /* e.g. "N", shown in the usage */
    const char *help;
    /* filled by the parser */
    bool seen;
    const char *value;
} kiln_opt;

typedef struct kiln_cmd_usage {
    const char *synopsis; /* "kiln run -m MODEL -p PROMPT [options]" */
    const char *summary;  /* one paragraph */
} kiln_cmd_usage;

enum { KILN_ARGS_OK = 0, KILN_ARGS_HELP = 1, KILN_ARGS_ERROR = 2 };

/* Parses argv[1..argc) (argv[0] is the command name). Positional arguments are stored in
 * pos (up to max_pos; more is an error). */
int kiln_args_parse(int argc, char **argv, const kiln_cmd_usage *u, kiln_opt *opts, int n_opts,
                    const char **pos, int max_pos, int *n_pos);
void kiln_args_usage(const kiln_cmd_usage *u, const kiln_opt *opts, int n_opts, bool to_stderr);

/* Typed getters for a parsed option: print "kiln: --name: expected ..." and return false
 * when the value does not parse or is out of [lo, hi]. Unseen options keep *out. */
bool kiln_opt_int(const kiln_opt *o, int64_t lo, int64_t hi, int64_t *out);
bool kiln_opt_float(const kiln_opt *o, double lo, double hi, double *out);
kiln_opt *kiln_opt_find(kiln_opt *opts, int n_opts, const char *name);

#define KILN_NOPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))

#endif /* KILN_CLI_ARGS_H */
