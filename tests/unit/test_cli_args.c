/* test_cli_args.c — the shared option parser of the `kiln` subcommands. */
#include "cli/args.h"
#include "testutil.h"

#include <stdio.h>
#include <string.h>

static kiln_opt make_opts(kiln_opt *o) {
    kiln_opt t[] = {
        {.name = "model", .short_name = 'm', .has_value = true, .metavar = "MODEL", .help = "m"},
        {.name = "n-predict", .short_name = 'n', .has_value = true, .metavar = "N", .help = "n"},
        {.name = "temp", .has_value = true, .metavar = "T", .help = "t"},
        {.name = "ids", .help = "ids"},
    };
    memcpy(o, t, sizeof t);
    return o[0];
}

static const kiln_cmd_usage U = {"kiln test [options]", "test"};

static void test_parse_ok(void **state) {
    (void)state;
    kiln_opt o[4];
    make_opts(o);
    char *argv[] = {"test",  "-m",   "a.gguf", "--n-predict=12", "--temp", "0.5",
                    "--ids", "pos1", "--",     "-notaflag"};
    const char *pos[4];
    int np;
    assert_int_equal(kiln_args_parse(10, argv, &U, o, 4, pos, 4, &np), KILN_ARGS_OK);
    assert_string_equal(o[0].value, "a.gguf");
    assert_string_equal(o[1].value, "12");
    assert_true(o[3].seen);
    assert_int_equal(np, 2);
    assert_string_equal(pos[0], "pos1");
    assert_string_equal(pos[1], "-notaflag");
    int64_t n = 0;
    assert_true(kiln_opt_int(&o[1], 0, 100, &n));
    assert_int_equal(n, 12);
    double t = 0;
    assert_true(kiln_opt_float(&o[2], 0, 2, &t));
    assert_true(t == 0.5);
    assert_ptr_equal(kiln_opt_find(o, 4, "temp"), &o[2]);
}

static void test_short_attached_and_negative(void **state) {
    (void)state;
    kiln_opt o[4];
    make_opts(o);
    char *argv[] = {"test", "-n32", "-5"}; /* "-5" is a positional (a negative number) */
    const char *pos[2];
    int np;
    assert_int_equal(kiln_args_parse(3, argv, &U, o, 4, pos, 2, &np), KILN_ARGS_OK);
    assert_string_equal(o[1].value, "32");
    assert_int_equal(np, 1);
}

static void test_parse_errors(void **state) {
    (void)state;
    kiln_opt o[4];
    const char *pos[1];
    int np;
    FILE *saved = stderr;
    stderr = fopen("/dev/null", "w");
    make_opts(o);
    char *a1[] = {"test", "--bogus"};
    assert_int_equal(kiln_args_parse(2, a1, &U, o, 4, pos, 1, &np), KILN_ARGS_ERROR);
    make_opts(o);
    char *a2[] = {"test", "-m"};
    assert_int_equal(kiln_args_parse(2, a2, &U, o, 4, pos, 1, &np), KILN_ARGS_ERROR);
    make_opts(o);
    char *a3[] = {"test", "--ids=1"};
    assert_int_equal(kiln_args_parse(2, a3, &U, o, 4, pos, 1, &np), KILN_ARGS_ERROR);
    make_opts(o);
    char *a4[] = {"test", "x", "y"};
    assert_int_equal(kiln_args_parse(3, a4, &U, o, 4, pos, 1, &np), KILN_ARGS_ERROR);
    make_opts(o);
    char *a5[] = {"test", "-q"};
    assert_int_equal(kiln_args_parse(2, a5, &U, o, 4, pos, 1, &np), KILN_ARGS_ERROR);
    make_opts(o);
    char *a6[] = {"test", "-n", "abc", "--temp", "nan"};
    assert_int_equal(kiln_args_parse(5, a6, &U, o, 4, pos, 1, &np), KILN_ARGS_OK);
    int64_t n = 7;
    assert_false(kiln_opt_int(&o[1], 0, 10, &n));
    assert_int_equal(n, 7);
    double t = 1;
    assert_false(kiln_opt_float(&o[2], 0, 10, &t));
    fclose(stderr);
    stderr = saved;
    make_opts(o);
    FILE *so = stdout;
    stdout = fopen("/dev/null", "w");
    char *a7[] = {"test", "--help"};
    assert_int_equal(kiln_args_parse(2, a7, &U, o, 4, pos, 1, &np), KILN_ARGS_HELP);
    fclose(stdout);
    stdout = so;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_ok),
        cmocka_unit_test(test_short_attached_and_negative),
        cmocka_unit_test(test_parse_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
