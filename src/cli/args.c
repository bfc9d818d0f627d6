#include "cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kiln_args_usage(const kiln_cmd_usage *u, const kiln_opt *opts, int n_opts, bool to_stderr) {
    FILE *f = to_stderr ? stderr : stdout;
    fprintf(f, "usage: %s\n", u->synopsis);
    if (u->summary && !to_stderr) fprintf(f, "\n%s\n", u->summary);
    if (n_opts) fprintf(f, "\noptions:\n");
    for (int i = 0; i < n_opts; i++) {
        char left[64];
        if (opts[i].short_name)
            snprintf(left, sizeof left, "-%c, --%s%s%s", opts[i].short_name, opts[i].name,
                     opts[i].has_value ? " " : "", opts[i].has_value ? opts[i].metavar : "");
        else
            snprintf(left, sizeof left, "    --%s%s%s", opts[i].name, opts[i].has_value ? " " : "",
                     opts[i].has_value ? opts[i].metavar : "");
        fprintf(f, "  %-28s %s\n", left, opts[i].help);
    }
    fprintf(f, "  %-28s %s\n", "-h, --help", "show this help");
}

static kiln_opt *find_long(kiln_opt *opts, int n, const char *name, size_t len) {
    for (int i = 0; i < n; i++)
        if (strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0) return &opts[i];
    return NULL;
}

kiln_opt *kiln_opt_find(kiln_opt *opts, int n_opts, const char *name) {
    return find_long(opts, n_opts, name, strlen(name));
}

static int fail(const char *cmd, const kiln_cmd_usage *u, const kiln_opt *opts, int n,
                const char *fmt, const char *what) {
    fprintf(stderr, "kiln %s: ", cmd);
    fprintf(stderr, fmt, what);
    fputc('\n', stderr);
    kiln_args_usage(u, opts, n, true);
    return KILN_ARGS_ERROR;
}

int kiln_args_parse(int argc, char **argv, const kiln_cmd_usage *u, kiln_opt *opts, int n_opts,
                    const char **pos, int max_pos, int *n_pos) {
    const char *cmd = argc > 0 ? argv[0] : "?";
    *n_pos = 0;
    bool only_pos = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!only_pos && strcmp(a, "--") == 0) {
            only_pos = true;
            continue;
        }
        if (!only_pos && (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)) {
            kiln_args_usage(u, opts, n_opts, false);
            return KILN_ARGS_HELP;
        }
        kiln_opt *o = NULL;
        const char *inline_val = NULL;
        if (!only_pos && a[0] == '-' && a[1] == '-' && a[2]) {
            const char *eq = strchr(a + 2, '=');
            size_t len = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
            o = find_long(opts, n_opts, a + 2, len);
            if (!o) return fail(cmd, u, opts, n_opts, "unknown option '%s'", a);
            if (eq) inline_val = eq + 1;
        } else if (!only_pos && a[0] == '-' && a[1] && a[1] != '-' &&
                   !(a[1] >= '0' && a[1] <= '9')) {
            for (int k = 0; k < n_opts; k++)
                if (opts[k].short_name == a[1]) o = &opts[k];
            if (!o) return fail(cmd, u, opts, n_opts, "unknown option '%s'", a);
            if (a[2]) {
                if (!o->has_value) return fail(cmd, u, opts, n_opts, "unknown option '%s'", a);
                inline_val = a + 2;
            }
        }
        if (!o) {
            if (*n_pos >= max_pos) return fail(cmd, u, opts, n_opts, "unexpected argument '%s'", a);
            pos[(*n_pos)++] = a;
            continue;
        }
        o->seen = true;
        if (o->has_value) {
            if (inline_val) {
                o->value = inline_val;
            } else {
                if (i + 1 >= argc)
                    return fail(cmd, u, opts, n_opts, "option '%s' needs a value", a);
                o->value = argv[++i];
            }
        } else if (inline_val) {
            return fail(cmd, u, opts, n_opts, "option '%s' takes no value", a);
        }
    }
    return KILN_ARGS_OK;
}

bool kiln_opt_int(const kiln_opt *o, int64_t lo, int64_t hi, int64_t *out) {
    if (!o->seen) return true;
    char *end;
    errno = 0;
    long long v = strtoll(o->value, &end, 10);
    if (errno || end == o->value || *end || v < lo || v > hi) {
        fprintf(stderr, "kiln: --%s: expected an integer in [%lld, %lld], got '%s'\n", o->name,
                (long long)lo, (long long)hi, o->value);
        return false;
    }
    *out = v;
    return true;
}

bool kiln_opt_float(const kiln_opt *o, double lo, double hi, double *out) {
    if (!o->seen) return true;
    char *end;
    errno = 0;
    double v = strtod(o->value, &end);
    if (errno || end == o->value || *end || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "kiln: --%s: expected a number in [%g, %g], got '%s'\n", o->name, lo, hi,
                o->value);
        return false;
    }
    *out = v;
    return true;
}
