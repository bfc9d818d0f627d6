/*
 * vocab_gguf.c — a vocabulary from GGUF metadata (tokenizer.ggml.*), read through the
 * format layer's metadata view (format/meta.h); also from any kiln_model_file.
 */
#include "format/gguf.h"
#include "base/mem.h"
#include "format/model_file.h"
#include "tok/tok_impl.h"

#include <stdlib.h>
#include <string.h>

static kiln_status opt_id(const kiln_meta *m, const char *key, int64_t *out, kiln_err *err) {
    return kiln_meta_opt_i64(m, key, KILN_TOKEN_NULL, out, err);
}

static kiln_status opt_flag(const kiln_meta *m, const char *key, int *out, kiln_err *err) {
    if (!kiln_meta_has(m, key)) return KILN_OK;
    bool b;
    KILN_TRY(kiln_meta_get_bool(m, key, &b, err));
    *out = b;
    return KILN_OK;
}

kiln_status kiln_vocab_from_meta(const kiln_meta *m, const char *source, kiln_vocab **out,
                                 kiln_err *err) {
    *out = NULL;
    kiln_vocab_desc d;
    kiln_vocab_desc_init(&d);
    d.source = source;
    char *model = NULL, *pre = NULL;
    kiln_str *tokens = NULL, *merges = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    kiln_status st = kiln_meta_dup_str(m, "tokenizer.ggml.model", &model, err);
    if (st) goto done;
    if (kiln_meta_has(m, "tokenizer.ggml.pre")) {
        st = kiln_meta_dup_str(m, "tokenizer.ggml.pre", &pre, err);
        if (st) goto done;
    }
    d.model = model;
    d.pre = pre;

    const kiln_meta_value *tv;
    st = kiln_meta_get_arr(m, "tokenizer.ggml.tokens", KILN_META_STRING, &tv, err);
    if (st) goto done;
    size_t n = (size_t)tv->count;
    d.n_tokens = n;
    if (n == 0) {
        st = kiln_err_set(err, KILN_ERR_FORMAT, "tokenizer.ggml.tokens is empty");
        goto done;
    }
    tokens = tv->v.strs ? (kiln_str *)tv->v.strs : NULL;
    d.tokens = tv->v.strs;
    tokens = NULL; /* borrowed from the metadata */

    if (kiln_meta_has(m, "tokenizer.ggml.scores")) {
        const kiln_meta_value *sv;
        st = kiln_meta_get_arr(m, "tokenizer.ggml.scores", -1, &sv, err);
        if (st) goto done;
        if (sv->count < n) {
            st = kiln_err_set(err, KILN_ERR_FORMAT,
                              "tokenizer.ggml.scores has %llu entries for %zu tokens",
                              (unsigned long long)sv->count, n);
            goto done;
        }
        if ((st = kiln_xmalloc(sizeof(float) * sv->count, (void **)&scores, "token scores", err)))
            goto done;
        st = kiln_meta_arr_copy_f32(sv, scores, sv->count, "tokenizer.ggml.scores", err);
        if (st) goto done;
        d.scores = scores;
    }
    if (kiln_meta_has(m, "tokenizer.ggml.token_type")) {
        const kiln_meta_value *yv;
        st = kiln_meta_get_arr(m, "tokenizer.ggml.token_type", -1, &yv, err);
        if (st) goto done;
        if (yv->count < n) {
            st = kiln_err_set(err, KILN_ERR_FORMAT,
                              "tokenizer.ggml.token_type has %llu entries for %zu tokens",
                              (unsigned long long)yv->count, n);
            goto done;
        }
        if ((st = kiln_xmalloc(sizeof(int32_t) * yv->count, (void **)&types, "token types", err)))
            goto done;
        st = kiln_meta_arr_copy_i32(yv, types, yv->count, "tokenizer.ggml.token_type", err);
        if (st) goto done;
        d.token_type = types;
    }
    if (kiln_meta_has(m, "tokenizer.ggml.merges")) {
        const kiln_meta_value *mv;
        st = kiln_meta_get_arr(m, "tokenizer.ggml.merges", KILN_META_STRING, &mv, err);
        if (st) goto done;
        d.n_merges = (size_t)mv->count;
        d.merges = mv->v.strs;
    }
    static const struct {
        const char *key;
        size_t off;
    } ids[] = {
        {"tokenizer.ggml.bos_token_id", offsetof(kiln_vocab_desc, bos)},
        {"tokenizer.ggml.eos_token_id", offsetof(kiln_vocab_desc, eos)},
        {"tokenizer.ggml.eot_token_id", offsetof(kiln_vocab_desc, eot)},
        {"tokenizer.ggml.eom_token_id", offsetof(kiln_vocab_desc, eom)},
        {"tokenizer.ggml.unknown_token_id", offsetof(kiln_vocab_desc, unk)},
        {"tokenizer.ggml.seperator_token_id", offsetof(kiln_vocab_desc, sep)},
        {"tokenizer.ggml.padding_token_id", offsetof(kiln_vocab_desc, pad)},
        {"tokenizer.ggml.mask_token_id", offsetof(kiln_vocab_desc, mask)},
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        st = opt_id(m, ids[i].key, (int64_t *)((char *)&d + ids[i].off), err);
        if (st) goto done;
    }
    if ((st = opt_flag(m, "tokenizer.ggml.add_bos_token", &d.add_bos, err)) ||
        (st = opt_flag(m, "tokenizer.ggml.add_eos_token", &d.add_eos, err)) ||
        (st = opt_flag(m, "tokenizer.ggml.add_sep_token", &d.add_sep, err)) ||
        (st = opt_flag(m, "tokenizer.ggml.add_space_prefix", &d.add_space_prefix, err)))
        goto done;
    st = kiln_vocab_create(&d, out, err);
    source = NULL; /* kiln_vocab_create already named the source */
done:
    if (st && source) kiln_err_wrap(err, st, "%s", source);
    kiln_free(model);
    kiln_free(pre);
    kiln_free(tokens);
    kiln_free(merges);
    kiln_free(scores);
    kiln_free(types);
    return st;
}

kiln_status kiln_vocab_load_gguf(const char *path, kiln_vocab **out, kiln_err *err) {
    *out = NULL;
    kiln_gguf *g;
    KILN_TRY(kiln_gguf_open(path, 0, &g, err));
    kiln_status st = kiln_vocab_from_meta(kiln_gguf_meta(g), path, out, err);
    kiln_gguf_close(g);
    return st;
}

kiln_status kiln_vocab_from_model_file(const kiln_model_file *mf, kiln_vocab **out, kiln_err *err) {
    const char *tj = kiln_model_file_tokenizer_json(mf);
    const kiln_meta *m = kiln_model_file_meta(mf);
    if (tj && !kiln_meta_has(m, "tokenizer.ggml.tokens"))
        return kiln_vocab_load_hf(tj, NULL, out, err);
    return kiln_vocab_from_meta(m, kiln_model_file_path(mf), out, err);
}

kiln_status kiln_vocab_load(const char *path, kiln_vocab **out, kiln_err *err) {
    *out = NULL;
    kiln_model_file *mf;
    KILN_TRY(kiln_model_file_open(path, 0, &mf, err));
    kiln_status st = kiln_vocab_from_model_file(mf, out, err);
    kiln_model_file_close(mf);
    return st;
}
