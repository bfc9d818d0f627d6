/*
 * out_gguf.c — writes a gen_model as GGUF with the metadata keys llama.cpp's
 * convert_hf_to_gguf.py writes for each architecture.
 */
#include "gen.h"
#include "base/mem.h"

#include "base/pool.h"
#include "format/dtype.h"
#include "format/gguf.h"
#include "format/meta.h"
#include "format/gguf_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rows of a tensor: generate f32 (GGUF layout), convert to the tensor's dtype. */
static kiln_status fill_rows(const kiln_gguf_wtensor *wt, int64_t row0, int64_t n, void *dst,
                             int ith, kiln_err *err) {
    (void)ith;
    const gen_tensor *t = wt->user;
    float *tmp = kiln_malloc((size_t)t->ne[0] * sizeof(float));
    if (!tmp) return kiln_err_set(err, KILN_ERR_NOMEM, "row buffer");
    kiln_status st = KILN_OK;
    for (int64_t r = 0; r < n && !st; r++) {
        gen_row_gguf(t, row0 + r, tmp);
        st = kiln_quantize_row(wt->dtype, tmp, (uint8_t *)dst + (size_t)r * wt->row_bytes, t->ne[0],
                               err);
    }
    kiln_free(tmp);
    return st;
}

#define TRY(x)                                                                                     \
    do {                                                                                           \
        kiln_status st_ = (x);                                                                     \
        if (st_) return st_;                                                                       \
    } while (0)

static kiln_status put_hparams(kiln_gguf_writer *w, const gen_config *c, kiln_err *err) {
    const char *arch = gen_family_name(c->family);
    char k[128];
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", arch, suffix), k)
    TRY(kiln_gguf_writer_set_str(w, "general.architecture", arch, err));
    TRY(kiln_gguf_writer_set_str(w, "general.type", "model", err));
    TRY(kiln_gguf_writer_set_str(w, "general.name", c->name, err));
    TRY(kiln_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)c->n_layer, err));
    TRY(kiln_gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)c->n_ctx, err));
    TRY(kiln_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)c->n_embd, err));
    TRY(kiln_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)c->n_ff, err));
    TRY(kiln_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)c->n_head, err));
    TRY(kiln_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->n_head_kv, err));
    TRY(kiln_gguf_writer_set_f32(w, KEY("rope.freq_base"), c->rope_theta, err));
    TRY(kiln_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->norm_eps, err));
    /* HF configs carry head_dim for qwen3 and gemma3 (the converter then writes key/value
     * length); llama and qwen2 derive it from hidden / heads unless it differs */
    const bool explicit_hd =
        c->family == GEN_QWEN3 || c->family == GEN_GEMMA3 || c->head_dim * c->n_head != c->n_embd;
    if (explicit_hd) {
        TRY(kiln_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)c->head_dim, err));
        TRY(kiln_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)c->head_dim, err));
    }
    if (c->family == GEN_LLAMA) {
        TRY(kiln_gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)c->n_vocab, err));
        TRY(kiln_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)c->head_dim, err));
    }
    if (c->family == GEN_GEMMA3) {
        TRY(kiln_gguf_writer_set_u32(w, KEY("attention.sliding_window"),
                                     (uint32_t)c->sliding_window, err));
        TRY(kiln_gguf_writer_set_f32(w, KEY("rope.freq_base_swa"), c->rope_theta_swa, err));
        /* not written by the converter (llama.cpp then assumes 6); written here so that
         * shapes other than the real ones (tiny: 2) stay explicit */
        TRY(kiln_gguf_writer_set_u32(w, KEY("attention.sliding_window_pattern"),
                                     (uint32_t)c->swa_pattern, err));
    }
    TRY(kiln_gguf_writer_set_u32(w, "general.file_type", gen_file_type(c), err));
    /* the converter writes it for every file, quantized or not */
    TRY(kiln_gguf_writer_set_u32(w, "general.quantization_version", 2, err));
#undef KEY
    return KILN_OK;
}

static kiln_status put_builtin_vocab(kiln_gguf_writer *w, const gen_vocab *v, kiln_err *err) {
    TRY(kiln_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama", err));
    TRY(kiln_gguf_writer_set_str(w, "tokenizer.ggml.pre", "default", err));
    TRY(kiln_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens,
                                     v->lens, v->n, err));
    TRY(kiln_gguf_writer_set_arr(w, "tokenizer.ggml.scores", KILN_GGUF_F32, v->scores, v->n, err));
    TRY(kiln_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", KILN_GGUF_I32, v->types, v->n,
                                 err));
    TRY(kiln_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos_id, err));
    TRY(kiln_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos_id, err));
    TRY(kiln_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)v->unk_id, err));
    TRY(kiln_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true, err));
    TRY(kiln_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false, err));
    return KILN_OK;
}

kiln_status gen_write_gguf(gen_model *m, const gen_vocab *v, const char *path,
                           const gen_gguf_opts *o, kiln_err *err) {
    kiln_gguf_writer *w = NULL;
    kiln_pool *pool = NULL;
    kiln_status st = kiln_gguf_writer_create(32, &w, err);
    if (!st) st = put_hparams(w, &m->cfg, err);
    if (!st) {
        if (v->src) {
            /* every tokenizer.* key as stored (tokens, scores, types, merges, special ids,
             * add_bos, chat template, ...) */
            const kiln_meta *meta = kiln_gguf_meta(v->src);
            for (size_t i = 0; i < kiln_meta_count(meta) && !st; i++) {
                const kiln_meta_entry *e = kiln_meta_at(meta, i);
                if (e->key.len < 10 || memcmp(e->key.ptr, "tokenizer.", 10) != 0) continue;
                char key[256];
                snprintf(key, sizeof key, "%.*s", (int)e->key.len, e->key.ptr);
                st = kiln_gguf_writer_set_value(w, key, &e->value, err);
            }
        } else {
            st = put_builtin_vocab(w, v, err);
        }
    }
    for (size_t i = 0; i < m->n_t && !st; i++) {
        const gen_tensor *t = &m->t[i];
        st = kiln_gguf_writer_add_tensor_fill(w, t->gguf_name, t->gguf_type, t->rank, t->ne,
                                              fill_rows, (void *)t, err);
    }
    if (!st) st = kiln_pool_create(o->threads, &pool, err);
    kiln_gguf_write_stats stats;
    if (!st) st = kiln_gguf_writer_write(w, path, pool, o->progress, &stats, err);
    if (!st && o->progress)
        fprintf(stderr,
                "kiln-gen: wrote %s: %.1f MiB in %.2f s (%.1f MiB/s; %d threads; fill %.2f s, "
                "disk %.2f s)\n",
                path, (double)stats.file_bytes / (1 << 20), stats.seconds,
                (double)stats.file_bytes / (1 << 20) / (stats.seconds > 0 ? stats.seconds : 1),
                kiln_pool_size(pool), stats.fill_seconds, stats.io_seconds);
    kiln_pool_free(pool);
    kiln_gguf_writer_free(w);
    return st;
}
