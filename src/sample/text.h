/*
 * text.h — generated tokens to the exact text a user sees: the streaming detokenizer
 * (complete UTF-8 only) primed with the prompt, followed by the stop-string filter.
 *
 * Contract (docs/TOKENIZER.md, "Exact text"): with no stop string hit, the
 * concatenation of every text this stream hands out is exactly
 *   detokenize(prompt + generated, KILN_DETOK_SEQUENCE) minus detokenize(prompt, same)
 * (complete UTF-8; bytes that can never form a character become U+FFFD) — so the
 * prompt's text plus the generated text is the text of the whole sequence, and the
 * first generated token keeps its leading space. `kiln run`, `kiln chat`, the C API's
 * kiln_generate and the server all stream through this.
 *
 * Ownership: the stream borrows the vocabulary; one stream per sequence; not
 * thread-safe. Text pointers returned are valid until the next call on the stream.
 */
#ifndef KILN_SAMPLE_TEXT_H
#define KILN_SAMPLE_TEXT_H

#include "sample/sample.h"
#include "tok/tok.h"

typedef struct kiln_text_stream {
    kiln_detok_stream *ds;
    kiln_stopper stop;
    bool stopped;
} kiln_text_stream;

/* prompt: the ids already in the sequence (chat template included), used only to know
 * where the text starts. stops: n_stops stop strings (copied; empty ones ignored). */
kiln_status kiln_text_stream_init(kiln_text_stream *ts, const kiln_vocab *v,
                                  const kiln_token *prompt, size_t n_prompt,
                                  const char *const *stops, int n_stops, kiln_err *err);
void kiln_text_stream_free(kiln_text_stream *ts);
/* Feeds one generated token (not an end-of-generation token the caller stops on).
 * *text / *len: text now safe to show (may be empty). *stopped: a stop string completed
 * (text holds what came before it; feed nothing more). */
kiln_status kiln_text_stream_push(kiln_text_stream *ts, kiln_token t, const char **text,
                                  size_t *len, bool *stopped, kiln_err *err);
/* At the end of generation: the text still held (an unfinished character as U+FFFD, the
 * start of a stop string that never completed). */
kiln_status kiln_text_stream_finish(kiln_text_stream *ts, char **text, size_t *len, kiln_err *err);

#endif /* KILN_SAMPLE_TEXT_H */
