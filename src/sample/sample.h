/*
 * sample.h — turning logits into the next token, one sampler per sequence.
 *
 * A kiln_sampler owns its RNG (seeded per sequence, so a sequence's draws do not
 * depend on other sequences), its recent-token history (for penalties) and a candidate
 * buffer of n_vocab entries. The chain, in llama.cpp's order:
 *   penalties (repetition over the last `repeat_last_n` tokens, frequency, presence)
 *   -> top-k -> top-p -> min-p -> temperature -> draw.
 * temperature <= 0 is greedy (argmax after penalties; ties go to the lowest id).
 *
 * A kiln_stopper finds stop strings in detokenized text across token boundaries: text
 * that could still be the start of a stop string is held back until it cannot, so the
 * caller never prints part of a stop string. Stop tokens are a set checked per token.
 *
 * Nothing here is thread-safe; one sampler and one stopper per sequence.
 */
#ifndef KILN_SAMPLE_SAMPLE_H
#define KILN_SAMPLE_SAMPLE_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kiln_sampler_params {
    float temperature;       /* <= 0: greedy                                  */
    int32_t top_k;           /* <= 0: off                                     */
    float top_p;             /* >= 1: off                                     */
    float min_p;             /* <= 0: off                                     */
    float repeat_penalty;    /* 1: off; > 1 penalises repeats                 */
    int32_t repeat_last_n;   /* window of the penalties (0: off, -1: all)     */
    float frequency_penalty; /* 0: off                                        */
    float presence_penalty;  /* 0: off                                        */
    uint64_t seed;
} kiln_sampler_params;

/* temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, no penalties, window 64, seed 0 */
void kiln_sampler_params_default(kiln_sampler_params *p);

typedef struct kiln_sampler kiln_sampler;

kiln_status kiln_sampler_create(const kiln_sampler_params *p, int32_t n_vocab, kiln_sampler **out,
                                kiln_err *err);
void kiln_sampler_free(kiln_sampler *s);
/* Records a token of the sequence (prompt or generated) for the penalties. */
void kiln_sampler_accept(kiln_sampler *s, int32_t token);
/* Forgets the history and reseeds the RNG. */
void kiln_sampler_reset(kiln_sampler *s, uint64_t seed);
/* Picks a token from logits[n_vocab] (n_vocab <= the sampler's; only the first n are
 * candidates — e.g. the tokenizer's vocabulary when the output matrix is padded).
 * Does not accept it. Returns -1 only when every logit is NaN / -inf. */
int32_t kiln_sampler_sample(kiln_sampler *s, const float *logits, int32_t n_vocab);

/* Uniform double in [0, 1) from a 64-bit state (splitmix64 + xoshiro256**). */
typedef struct kiln_rng {
    uint64_t s[4];
} kiln_rng;
void kiln_rng_seed(kiln_rng *r, uint64_t seed);
uint64_t kiln_rng_next(kiln_rng *r);
double kiln_rng_uniform(kiln_rng *r);

/* ---- stop strings and tokens ---- */
typedef struct kiln_stopper {
    char **stops;
    size_t *stop_len;
    int n_stops;
    int32_t *stop_tokens;
    int n_stop_tokens;
    char *buf; /* held text */
    size_t len, cap;
    char *out; /* text handed out by the last feed */
    size_t out_cap;
    size_t max_stop;
    bool stopped;
} kiln_stopper;

kiln_status kiln_stopper_init(kiln_stopper *st, const char *const *stops, int n_stops,
                              const int32_t *stop_tokens, int n_stop_tokens, kiln_err *err);
void kiln_stopper_free(kiln_stopper *st);
bool kiln_stopper_is_stop_token(const kiln_stopper *st, int32_t token);
/* Appends detokenized text. *emit / *emit_len: text now safe to print (valid until the
 * next call). When a stop string completes, *stopped becomes true and emit holds the
 * text before it; the stop string and anything after are dropped. */
kiln_status kiln_stopper_feed(kiln_stopper *st, const char *text, size_t n, const char **emit,
                              size_t *emit_len, bool *stopped, kiln_err *err);
/* At the end of generation: the held text (no stop string completed). */
void kiln_stopper_flush(kiln_stopper *st, const char **emit, size_t *emit_len);

#endif /* KILN_SAMPLE_SAMPLE_H */
