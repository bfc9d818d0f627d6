/* vocab.c — the model's tokenizer (kept apart from load.c: tok.h and the format
 * layer's meta.h each define a kiln_str). */
#include "model/model.h"

#include "tok/tok.h"

kiln_status kiln_model_load_vocab(kiln_model *m, kiln_err *err) {
    if (m->vocab) return KILN_OK;
    kiln_vocab *v = NULL;
    kiln_status st;
    if (m->tokenizer_json)
        st = kiln_vocab_load_hf(m->tokenizer_json, NULL, &v, err);
    else if (!m->file)
        return kiln_err_set(err, KILN_ERR_NOT_FOUND, "%s: no tokenizer", m->path);
    else
        st = kiln_vocab_load_gguf(m->path, &v, err);
    if (st) return kiln_err_wrap(err, st, "%s: tokenizer", m->path);
    if (kiln_vocab_n_tokens(v) > (size_t)m->cfg.n_vocab) {
        size_t n = kiln_vocab_n_tokens(v);
        kiln_vocab_free(v);
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "%s: tokenizer has %zu tokens, the output matrix %d rows", m->path, n,
                            (int)m->cfg.n_vocab);
    }
    m->vocab = v;
    return KILN_OK;
}

void kiln_model_free_vocab(kiln_model *m) {
    kiln_vocab_free(m->vocab);
    m->vocab = NULL;
}
