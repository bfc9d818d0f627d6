/*
 * test_safetensors_builder.h — safetensors images and HF model directories for tests.
 * Header-only; test code only (allocation failure aborts).
 */
#ifndef KILN_TESTS_SAFETENSORS_BUILDER_H
#define KILN_TESTS_SAFETENSORS_BUILDER_H

#include "test_gguf_builder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* header JSON (padded with spaces to a multiple of 8, as the reference writer does) +
 * data bytes (a deterministic pattern when data is NULL). */
GB_UNUSED static void sb_image(gb_buf *b, const char *json, const void *data, size_t nbytes) {
    size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    gb_u64(b, padded);
    gb_put(b, json, n);
    for (size_t i = n; i < padded; i++) gb_u8(b, ' ');
    if (data) {
        gb_put(b, data, nbytes);
    } else {
        for (size_t i = 0; i < nbytes; i++) gb_u8(b, (uint8_t)(i * 13 + 5));
    }
}

GB_UNUSED static void sb_write(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) {
        fprintf(stderr, "sb_write %s failed\n", path);
        abort();
    }
    fclose(f);
}

GB_UNUSED static void sb_write_str(const char *dir, const char *name, const char *text) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    sb_write(p, text, strlen(text));
}

/* A fresh temporary directory (static buffer per call slot). */
GB_UNUSED static const char *sb_tmpdir(void) {
    static char dirs[4][256];
    static int slot;
    char *d = dirs[slot++ % 4];
    const char *tmp = getenv("TMPDIR");
    snprintf(d, 256, "%s/kiln-st-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(d)) abort();
    return d;
}

/* Removes the files a test put into dir, then dir. */
GB_UNUSED static void sb_rmdir(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

#endif /* KILN_TESTS_SAFETENSORS_BUILDER_H */
