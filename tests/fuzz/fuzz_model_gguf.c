/* fuzz_model_gguf.c — libFuzzer target for the whole GGUF model path, with the
 * structure-aware mutator of gguf_mutator.h: the input is written to a memfd and opened
 * with kiln_model_load (model-file layer, family configuration, tensor shape checks),
 * then the vocabulary is read from its metadata, an engine is bound (ref backend, one
 * thread, small KV) and one two-token step runs. Every failure must be a status; any
 * crash, hang, leak or sanitizer report is a bug. Seeds: kiln-gen models of every family
 * at small shapes (tests/fuzz/corpus/fuzz_model_gguf, written by kiln-gen, tools/gen/). */
#include "gguf_mutator.h"

#include "base/status.h"
#include "kiln/kiln.h"
#include "model/model.h"

#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz.gguf", 0);
        if (fd < 0) abort(); /* the harness itself: not kiln */
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) abort();
    kiln_model *m = NULL;
    kiln_err err;
    if (kiln_model_load(path, &m, &err) != KILN_OK) return 0;
    if (kiln_model_load_vocab(m, &err) == KILN_OK) kiln_model_free_vocab(m);
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.n_threads = 1;
    o.n_ctx = 16;
    o.max_step_tokens = 4;
    o.max_seqs = 1;
    kiln_engine *e = NULL;
    if (kiln_engine_create(m, &o, &e, &err) == KILN_OK) {
        int32_t seq;
        if (kiln_seq_create(e, &seq, &err) == KILN_OK) {
            int32_t nv = kiln_model_n_vocab(m);
            kiln_batch_entry b[2] = {{seq, 0, 0, 0}, {seq, nv > 1 ? 1 : 0, 1, 1}};
            int32_t id;
            kiln_engine_step_greedy(e, b, 2, 0, &id, &err);
            kiln_seq_free(e, seq);
        }
        kiln_engine_free(e);
    }
    kiln_model_free(m);
    return 0;
}
