/* fuzz_hf_tokenizer.c — libFuzzer target for a Hugging Face tokenizer.json (the file a
 * safetensors model directory carries): the input is written to a memfd and read with
 * kiln_vocab_load_hf (BPE byte-level with merges, SPM-like with byte fallback, added
 * tokens, pre-tokenizer detection); a vocabulary that loads then tokenizes and
 * detokenizes a fixed text. Rejections are expected; crashes, leaks, hangs and sanitizer
 * reports are bugs. config.json is fuzzed by fuzz_safetensors (same input as JSON). */
#include "tok/tok.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char TEXT[] = "Hello, world! 123 \xc3\xa9t\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac <s> ok";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("tokenizer.json", 0);
        if (fd < 0) abort(); /* the harness itself */
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (size > 1 << 20) return 0;
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) abort();
    kiln_vocab *v = NULL;
    kiln_err err;
    if (kiln_vocab_load_hf(path, NULL, &v, &err) != KILN_OK) return 0;
    kiln_tokens t = {0};
    if (kiln_tokenize(v, TEXT, sizeof TEXT - 1, KILN_TOK_ADD_SPECIAL | KILN_TOK_PARSE_SPECIAL, &t,
                      &err) == KILN_OK) {
        size_t nv = kiln_vocab_n_tokens(v);
        for (size_t i = 0; i < t.n; i++)
            if (t.ids[i] < 0 || (size_t)t.ids[i] >= nv) __builtin_trap();
        char *s = NULL;
        size_t n = 0;
        if (kiln_detokenize(v, t.ids, t.n, 0, &s, &n, &err) == KILN_OK) free(s);
    }
    kiln_tokens_free(&t);
    kiln_vocab_free(v);
    return 0;
}
