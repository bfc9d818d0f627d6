/* synth.c — synthetic models for engine tests (synth.h). */
#include "synth.h"

#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void kt_synth_config(kiln_model_config *c, const char *arch) {
    kiln_model_config_defaults(c);
    strcpy(c->arch, arch);
    c->n_vocab = 97, c->n_embd = 32, c->n_layer = 3, c->n_head = 4, c->n_kv_head = 2,
    c->head_dim = 16;
    c->n_ff = 48, c->n_rot = 16, c->attn_scale = 0.25f, c->n_ctx_train = 4096;
    c->norm_eps = 1e-6f;
    for (int l = 0; l < c->n_layer; l++) c->layer_rope_base[l] = 10000, c->layer_rope_scale[l] = 1;
    if (strcmp(arch, "gemma3") == 0) {
        c->rope_mode = 1;
        c->qk_norm = c->post_norms = true;
        c->act = 1;
        c->embed_scale = sqrtf(32);
        c->tied_embeddings = true;
        c->layer_window[0] = c->layer_window[1] = 5; /* sliding, then global */
        c->layer_rope_base[2] = 1e6f;
    } else {
        c->qkv_bias = true;
    }
}

void kt_synth_make(kt_synth *s, const kiln_model_config *c, uint64_t seed) {
    kiln_plan p;
    kiln_plan_init(&p);
    assert_int_equal(kiln_decoder_compile(c, KILN_MODE_PREFILL, &p, NULL), KILN_OK);
    s->n = p.n_weights;
    s->ts = calloc((size_t)s->n, sizeof(kiln_tensor));
    s->bufs = calloc((size_t)s->n, sizeof(float *));
    assert_non_null(s->ts);
    assert_non_null(s->bufs);
    kt_rng r;
    kt_rng_seed(&r, seed);
    for (int i = 0; i < p.n_weights; i++) {
        const kiln_weight_ref *w = &p.weights[i];
        size_t ne = 1;
        for (int d = 0; d < w->rank; d++) ne *= (size_t)w->shape[d];
        s->bufs[i] = malloc(ne * sizeof(float));
        assert_non_null(s->bufs[i]);
        kt_fill_normal(&r, s->bufs[i], ne, w->wclass == KILN_WCLASS_VECTOR ? 0.2f : 0.3f);
        if (w->wclass == KILN_WCLASS_VECTOR && strstr(w->name, "norm"))
            for (size_t j = 0; j < ne; j++) s->bufs[i][j] += 1.0f;
        s->ts[i].name = strdup(w->name);
        s->ts[i].data = s->bufs[i];
        s->ts[i].dtype = 0;
        s->ts[i].rank = w->rank;
        for (int d = 0; d < 4; d++) s->ts[i].shape[d] = d < w->rank ? w->shape[d] : 1;
        s->ts[i].nbytes = ne * 4;
    }
    kiln_plan_free(&p);
    assert_int_equal(kiln_model_from_tensors(c, s->ts, s->n, &s->m, NULL), KILN_OK);
    assert_non_null(s->m->family);
}

void kt_synth_free(kt_synth *s) {
    kiln_model_free(s->m);
    for (int i = 0; i < s->n; i++) {
        free(s->bufs[i]);
        free((void *)s->ts[i].name);
    }
    free(s->bufs);
    free(s->ts);
}
