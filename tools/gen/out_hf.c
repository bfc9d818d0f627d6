/*
 * out_hf.c — writes a gen_model in the Hugging Face layout.
 */
#include "gen.h"

kiln_status gen_write_hf(gen_model *m, const gen_vocab *v, const char *dir, uint64_t shard_bytes,
                         int threads, kiln_err *err) {
    (void)m, (void)v, (void)shard_bytes, (void)threads;
    return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "%s: hf output not written yet", dir);
}
