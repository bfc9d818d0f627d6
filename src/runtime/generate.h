/*
 * generate.h — one sequence from prompt ids to streamed text: chunked prefill, the
 * sampling chain (src/sample), the exact-text stream (sample/text.h), stop strings and
 * end-of-generation tokens. The public kiln_generate (include/kiln/kiln.h) and
 * `kiln run` are both this loop; the scheduler runs its own over many sequences with
 * the same sampler and text-stream pieces.
 *
 * Greedy without penalties, bias or logprobs asks the engine for the token
 * (kiln_engine_step_greedy: the argmax fused into the LM head, no logits stored); the
 * first token comes from the prefill's logits through the sampler (the same argmax).
 *
 * Errors: from the engine (KILN_ERR_CAPACITY, ...), the tokenizer and the sampler; the
 * sequence keeps what was fed before the error. Not thread-safe per engine (as the
 * engine's step).
 */
#ifndef KILN_RUNTIME_GENERATE_H
#define KILN_RUNTIME_GENERATE_H

#include "kiln/kiln.h"
#include "sample/sample.h"
#include "tok/tok.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kiln_gen_run {
    int32_t seq;           /* the sequence to extend (from its current length)       */
    const int32_t *prompt; /* ids to prefill (the whole prompt, template included)   */
    size_t n_prompt;       /* >= 1                                                   */
    const kiln_sampler_params *sampling;
    int64_t n_predict;        /* tokens to generate at most                       */
    const char *const *stops; /* stop strings (may be NULL)                       */
    int n_stops;
    bool ignore_eos; /* do not stop at end-of-generation tokens          */
    bool no_text;    /* callback gets no text (ids only; no detokenizer) */
    /* sample on the host even where the engine's device could (decode steps on cuda sample
     * on the device by default; KILN_HOST_SAMPLING=1 in the environment does the same) */
    bool host_sampling;
} kiln_gen_run;

typedef struct kiln_gen_stats {
    int64_t n_prompt, n_gen;
    double prompt_ms, gen_ms;
    bool stopped; /* a stop string, an end-of-generation token or the callback */
} kiln_gen_stats;

/* cb (may be NULL) gets each generated token with its new text (maybe empty), then at
 * the end one call with token -1 carrying the held text when there is any. A nonzero
 * return ends the generation (not an error). */
kiln_status kiln_generate_seq(kiln_engine *e, const kiln_vocab *v, const kiln_gen_run *r,
                              kiln_token_cb cb, void *user, kiln_gen_stats *stats, kiln_err *err);

#endif /* KILN_RUNTIME_GENERATE_H */
