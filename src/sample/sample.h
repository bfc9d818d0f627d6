/*
 * sample.h — turning logits into the next token, one sampler per sequence.
 *
 * A kiln_sampler owns its parameters, its RNG (seeded per sequence, so a sequence's draws
 * do not depend on other sequences, on the batch it is sampled in or on thread counts),
 * its recent-token history (for penalties) and scratch that grows on first use. The
 * chain is llama.cpp's default one, in its order (docs/SAMPLING.md says where kiln
 * differs and why):
 *   logit bias -> penalties (repetition / frequency / presence over the last
 *   `repeat_last_n` accepted tokens) -> top-k -> top-p -> min-p -> temperature -> draw.
 * temperature <= 0 is greedy (argmax after bias and penalties; ties go to the lowest id).
 *
 * Cost: no stage sorts the vocabulary. top-k keeps a heap of k (+ the few tokens whose
 * logits bias/penalties changed) over one scan that skips 64-logit blocks below the heap;
 * softmax runs over the survivors only; penalties touch only the window's tokens. With
 * top-k off, top-p/min-p select partially (quickselect of a growing prefix) and with
 * every filter off the draw is two passes over the logits.
 *
 * A kiln_stopper finds stop strings in detokenized text across token boundaries: text
 * that could still be the start of a stop string is held back until it cannot, so the
 * caller never prints part of a stop string. Stop tokens are a set checked per token.
 *
 * Threads: a sampler is used by one thread at a time; different samplers are
 * independent, so a batch may be split across threads by the caller. Errors: creation
 * validates the parameters (KILN_ERR_INVALID_ARG naming the field); sampling fails only
 * for lack of memory (scratch grown on first use) or bad arguments.
 */
#ifndef KILN_SAMPLE_SAMPLE_H
#define KILN_SAMPLE_SAMPLE_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One OpenAI-style logit bias entry: bias is added to token's logit (-INFINITY bans it). */
typedef struct kiln_logit_bias {
    int32_t token;
    float bias;
} kiln_logit_bias;

#define KILN_SAMPLE_MAX_LOGPROBS 20

typedef struct kiln_sampler_params {
    float temperature;       /* <= 0: greedy                                  */
    int32_t top_k;           /* <= 0: off                                     */
    float top_p;             /* >= 1: off; must be > 0                        */
    float min_p;             /* <= 0: off                                     */
    float repeat_penalty;    /* 1: off; > 1 penalises repeats                 */
    int32_t repeat_last_n;   /* window of the penalties (0: off, -1: all)     */
    float frequency_penalty; /* 0: off                                        */
    float presence_penalty;  /* 0: off                                        */
    uint64_t seed;
    /* logit bias: n_logit_bias entries, copied by kiln_sampler_create (tokens must be in
     * [0, n_vocab); a token given twice gets the sum) */
    const kiln_logit_bias *logit_bias;
    int32_t n_logit_bias;
    /* -1: no log-probabilities (default); 0: the chosen token's; 1..20: also that many
     * most likely tokens. Computed from the log-softmax over the whole vocabulary of the
     * logits after logit bias and penalties, before temperature and truncation. */
    int32_t n_logprobs;
} kiln_sampler_params;

/* temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, no penalties, window 64, seed 0,
 * no bias, no logprobs */
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
 * Does not accept it. Returns -1 when every logit is NaN / -inf (or on out of memory). */
int32_t kiln_sampler_sample(kiln_sampler *s, const float *logits, int32_t n_vocab);

/* ---- batch: one row per sequence, each with its own sampler ---- */
typedef struct kiln_sample_row {
    kiln_sampler *sampler;
    const float *logits; /* n_vocab floats (not modified) */
} kiln_sample_row;

typedef struct kiln_sample_out {
    int32_t token; /* -1: every logit NaN / -inf                      */
    float logprob; /* n_logprobs >= 0: log p(token), see the params   */
    int32_t n_top; /* entries in top_*: min(n_logprobs, finite ones)  */
    int32_t top_token[KILN_SAMPLE_MAX_LOGPROBS]; /* most likely first  */
    float top_logprob[KILN_SAMPLE_MAX_LOGPROBS];
} kiln_sample_out;

/* Samples every row (rows[i] -> out[i]); rows are independent and must use different
 * samplers. Does not accept the tokens (call kiln_sampler_accept after the caller's
 * stop checks). Errors: KILN_ERR_INVALID_ARG (NULL sampler/logits, n_vocab <= 0),
 * KILN_ERR_NOMEM (scratch). */
kiln_status kiln_sample_batch(const kiln_sample_row *rows, int32_t n_rows, int32_t n_vocab,
                              kiln_sample_out *out, kiln_err *err);

/* ---- the chain on a device: a KILN_KOP_SAMPLE kernel (kernels/kernel.h) ----
 * The kernel runs the CPU chain's sorted-candidate path (what kiln_sample_batch runs for
 * greedy and for 0 < top_k with top_k + overrides <= 4096), so for the same logits and
 * the same draw it gives the same token (docs/SAMPLING.md: the boundary cases that can
 * differ). kiln_sampler_device_ok: whether this sampler's rows of n_vocab logits can be
 * sampled there: no logprobs, and greedy, or k + 2 x overrides <= 4096 with k = top_k
 * (n_vocab when off or larger) and not every filter off (top-k off on a large vocabulary,
 * or every filter off, takes the CPU's O(n) paths, which a kernel does not mirror).
 * kiln_sampler_device_max_overrides: an upper bound of the overrides of a row (bias
 * entries + the window), for sizing.
 * kiln_sampler_device_row: the row's parameters (row->ov_off is the caller's) and its
 * overrides (ids sorted, distinct, < n_vocab; the bias, 0 for window-only tokens; the
 * count in the penalty window, 0 for bias-only ones) into ov_*[0, *n_ov), at most ov_cap,
 * and the row's draw from the sampler's RNG: one uniform when temperature > 0, as
 * kiln_sample_batch takes. Errors: KILN_ERR_RANGE when more than ov_cap overrides. */
struct kiln_sample_row_params;
bool kiln_sampler_device_ok(const kiln_sampler *s, int32_t n_vocab);
int32_t kiln_sampler_device_max_overrides(const kiln_sampler *s);
kiln_status kiln_sampler_device_row(kiln_sampler *s, int32_t n_vocab,
                                    struct kiln_sample_row_params *row, int32_t *ov_id,
                                    float *ov_bias, int32_t *ov_count, int32_t ov_cap,
                                    kiln_err *err);

/* ---- inspection (tests, docs): the candidate set after a stage of the chain ---- */
typedef enum kiln_sample_stage {
    KILN_SAMPLE_STAGE_PENALTIES = 0, /* bias + penalties: every finite logit   */
    KILN_SAMPLE_STAGE_TOP_K,
    KILN_SAMPLE_STAGE_TOP_P,
    KILN_SAMPLE_STAGE_MIN_P,
    KILN_SAMPLE_STAGE_TEMPERATURE, /* logits divided by the temperature      */
} kiln_sample_stage;

typedef struct kiln_sample_cand {
    int32_t id;
    float logit; /* after the stage */
    float p;     /* softmax over the set */
} kiln_sample_cand;

/* Runs the chain on logits[n_vocab] up to `stage` (temperature must be > 0) and writes
 * the surviving candidates, most likely first (ties: lowest id), to out[n_vocab];
 * *n_out gets their number. Consumes no randomness. */
kiln_status kiln_sampler_stage(kiln_sampler *s, const float *logits, int32_t n_vocab,
                               kiln_sample_stage stage, kiln_sample_cand *out, int32_t *n_out,
                               kiln_err *err);

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
