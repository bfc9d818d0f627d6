/* fuzz_cli_args.c — libFuzzer target for CLI argument vectors: the input is split at NUL
 * bytes into argv (at most 64 arguments) and parsed by kiln_args_parse against the
 * option table of `kiln run` (short and long options, values, "--", positionals), then
 * every seen option goes through the typed getters (kiln_opt_int / kiln_opt_float with
 * the ranges the commands use). Usage and error text goes to stderr/stdout, which the
 * target sends to /dev/null. Crashes, leaks and sanitizer reports are bugs; parse errors are
 * expected. */
#include "cli/args.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kiln_opt table[] = {
    {"model", 'm', true, "MODEL", "model", false, NULL},
    {"prompt", 'p', true, "TEXT", "prompt", false, NULL},
    {"n-predict", 'n', true, "N", "tokens", false, NULL},
    {"temp", 0, true, "T", "temperature", false, NULL},
    {"top-k", 0, true, "K", "top-k", false, NULL},
    {"top-p", 0, true, "P", "top-p", false, NULL},
    {"seed", 's', true, "S", "seed", false, NULL},
    {"ctx-size", 'c', true, "N", "ctx", false, NULL},
    {"threads", 't', true, "N", "threads", false, NULL},
    {"verbose", 'v', false, NULL, "verbose", false, NULL},
    {"json", 0, false, NULL, "json", false, NULL},
};
#define N_OPTS ((int)(sizeof table / sizeof table[0]))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int quiet;
    if (!quiet) {
        quiet = 1;
        /* usage text on every bad vector would drown the run: point the stdio streams
         * the parser writes to at /dev/null. libFuzzer keeps its own copy of the
         * original stderr FILE* and ASan writes to fd 2, so reports still show. */
        if (!getenv("KILN_FUZZ_VERBOSE")) {
            FILE *null = fopen("/dev/null", "w");
            if (null) stdout = stderr = null;
        }
    }
    if (size > 64 * 1024) return 0;
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    char *argv[66];
    int argc = 0;
    argv[argc++] = "run";
    for (size_t i = 0; i <= size && argc < 65;) {
        argv[argc++] = buf + i;
        size_t l = strlen(buf + i);
        i += l + 1;
    }
    argv[argc] = NULL;
    kiln_opt opts[N_OPTS];
    memcpy(opts, table, sizeof opts);
    const char *pos[4];
    int n_pos = 0;
    int rc = kiln_args_parse(argc, argv, &(kiln_cmd_usage){"kiln run -m MODEL", "fuzz"}, opts,
                             N_OPTS, pos, 4, &n_pos);
    if (rc == KILN_ARGS_OK) {
        if (n_pos < 0 || n_pos > 4) __builtin_trap();
        int64_t i64;
        double d;
        for (int i = 0; i < N_OPTS; i++) {
            if (!opts[i].seen || !opts[i].has_value) continue;
            if (!opts[i].value) __builtin_trap();
            kiln_opt_int(&opts[i], -1, 1 << 30, &i64);
            kiln_opt_float(&opts[i], -1e9, 1e9, &d);
        }
        if (!kiln_opt_find(opts, N_OPTS, "model")) __builtin_trap();
    }
    free(buf);
    return 0;
}
