/*
 * testutil.h — helpers shared by kiln's cmocka tests: deterministic random data,
 * paths to test data, temporary files.
 */
#ifndef KILN_TESTS_TESTUTIL_H
#define KILN_TESTS_TESTUTIL_H

#include <setjmp.h> /* cmocka needs these before cmocka.h */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

/* xorshift64* generator; never returns the same stream for different seeds. */
typedef struct kt_rng {
    uint64_t s;
} kt_rng;
void kt_rng_seed(kt_rng *r, uint64_t seed);
uint64_t kt_rng_u64(kt_rng *r);
/* Uniform in [lo, hi). */
float kt_rng_uniform(kt_rng *r, float lo, float hi);
/* Random weights of dtype dt, n rows of k (row_bytes each): random bytes (every quant bit
 * pattern) with sane block scales (f16 d in [0.002, 0.02], mins in [-0.1, 0.1], k-quant
 * super-scales 20x smaller); float types get N(0, 0.1). */
void kt_fill_weights(kt_rng *r, uint32_t dt, uint8_t *w, int64_t n, int64_t k, size_t row_bytes);
/* Approximately normal (sum of 4 uniforms), mean 0, std ~1. */
float kt_rng_normal(kt_rng *r);
void kt_fill_normal(kt_rng *r, float *x, size_t n, float scale);

/* $KILN_SOURCE_DIR / $KILN_SHARED_DIR (set by CTest), with fallbacks. */
const char *kt_source_dir(void);
const char *kt_shared_dir(void);
/* Writes len bytes to a fresh temp file; returns its path (static buffer per call slot). */
const char *kt_write_temp(const void *data, size_t len, const char *suffix);
/* A fresh directory $TMPDIR/PREFIX-XXXXXX (TMPDIR unset: /tmp) into dir[n]; 0, or -1.
 * kt_tmpdir_remove deletes it with everything in it (cmocka group setup / teardown). */
int kt_tmpdir(char *dir, size_t n, const char *prefix);
int kt_tmpdir_remove(const char *dir);
/* Runs $KILN_BINARY_DIR/kiln-gen -q ARGS -o PATH; fails the test when it fails. */
void kt_kiln_gen(const char *args, const char *path);

#endif /* KILN_TESTS_TESTUTIL_H */
