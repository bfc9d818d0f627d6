/*
 * synth.h — synthetic models for engine tests: random f32 weights with the shapes of a
 * family's plan (gemma3 or llama), built in memory (no file). kt_synth_free releases
 * the model and its weights.
 */
#ifndef KILN_TESTS_SYNTH_H
#define KILN_TESTS_SYNTH_H

#include "model/model.h"

typedef struct kt_synth {
    kiln_model *m;
    float **bufs;
    kiln_tensor *ts;
    int n;
} kt_synth;

/* A small config of arch ("gemma3": qk-norm, post-norms, GeGLU, tied embeddings, a
 * sliding-window layer; else llama-like with qkv bias): vocab 97, 3 layers, 4 heads,
 * 2 KV heads of 16. */
void kt_synth_config(kiln_model_config *c, const char *arch);
void kt_synth_make(kt_synth *s, const kiln_model_config *c, uint64_t seed);
void kt_synth_free(kt_synth *s);

#endif /* KILN_TESTS_SYNTH_H */
