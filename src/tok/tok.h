/*
 * tok.h — kiln's tokenizers: vocabularies, text -> token ids, token ids -> text, and a
 * streaming detokenizer. Token ids match llama.cpp's (commit 3f545bec) exactly for
 * every vocabulary family supported here; docs/TOKENIZER.md explains how.
 *
 * Families (tokenizer.ggml.model):
 *   "llama"  SPM: score-ordered merges over UTF-8 characters, spaces as U+2581,
 *            byte fallback <0xXX> (llama, mistral, gemma 1-3)
 *   "gpt2"   byte-level BPE: pre-tokenizer regexes (PCRE2 + JIT, chosen by
 *            tokenizer.ggml.pre), GPT-2 byte map, merge ranks
 *   "gemma4" BPE without byte map, spaces as U+2581, <0xXX> byte fallback
 * Anything else (bert, t5, rwkv, plamo2, an unknown pre-tokenizer...) is rejected at
 * creation with KILN_ERR_UNSUPPORTED and a message naming it; kiln never guesses.
 *
 * Ownership and threads: a kiln_vocab is immutable after creation and may be used from
 * any number of threads at once; kiln_vocab_free releases it (NULL is fine). Every
 * function that allocates returns memory the caller owns unless stated otherwise.
 * Errors: fallible functions return a kiln_status and fill the kiln_err (may be NULL).
 *
 * Usage:
 *   kiln_vocab *v;  kiln_err e;
 *   if (kiln_vocab_load_gguf("model.gguf", &v, &e)) { puts(e.msg); ... }
 *   kiln_tokens t = {0};
 *   kiln_tokenize(v, text, len, KILN_TOK_ADD_SPECIAL, &t, &e);   // appends to t
 *   char *s; size_t n;
 *   kiln_detokenize(v, t.ids, t.n, 0, &s, &n, &e);  ... free(s);
 *   kiln_tokens_free(&t);  kiln_vocab_free(v);
 *
 * Streaming generated tokens to a user (kiln run, SSE):
 *   kiln_detok_stream *ds;  kiln_detok_stream_create(v, false, &ds, &e);
 *   for each sampled id:  if (kiln_vocab_is_eog(v, id)) break;
 *                         kiln_detok_stream_push(ds, id, &txt, &len, &e); emit(txt, len);
 *   kiln_detok_stream_flush(ds, &txt, &len); emit(txt, len);  kiln_detok_stream_free(ds);
 */
#ifndef KILN_TOK_TOK_H
#define KILN_TOK_TOK_H

#include "base/status.h"
#include "format/meta.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef int32_t kiln_token;
#define KILN_TOKEN_NULL (-1)

typedef struct kiln_vocab kiln_vocab;

typedef enum kiln_vocab_type {
    KILN_VOCAB_SPM = 1, /* "llama" */
    KILN_VOCAB_BPE = 2, /* "gpt2", "gemma4" */
} kiln_vocab_type;

/* Token attributes (bit set), as llama.cpp derives them from tokenizer.ggml.token_type
 * (0 undefined, 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte) and
 * from well-known token texts (end-of-generation tokens become control). */
enum {
    KILN_TOKEN_ATTR_UNDEFINED = 0,
    KILN_TOKEN_ATTR_UNKNOWN = 1 << 0,
    KILN_TOKEN_ATTR_UNUSED = 1 << 1,
    KILN_TOKEN_ATTR_NORMAL = 1 << 2,
    KILN_TOKEN_ATTR_CONTROL = 1 << 3,
    KILN_TOKEN_ATTR_USER_DEFINED = 1 << 4,
    KILN_TOKEN_ATTR_BYTE = 1 << 5,
    KILN_TOKEN_ATTR_LSTRIP = 1 << 7,
    KILN_TOKEN_ATTR_RSTRIP = 1 << 8,
};

/* kiln_str (a byte string, not necessarily NUL-terminated) comes from format/meta.h. */

/* Everything a vocabulary is made of, as found in GGUF metadata (tokenizer.ggml.*) or
 * tokenizer.json. Arrays are borrowed: kiln_vocab_create copies what it keeps. */
typedef struct kiln_vocab_desc {
    const char *model;  /* tokenizer.ggml.model: "llama", "gpt2", "gemma4" */
    const char *pre;    /* tokenizer.ggml.pre (BPE); NULL or "" means "default" */
    const char *source; /* for error messages, e.g. the file name (may be NULL) */
    size_t n_tokens;    /* >= 1 */
    const kiln_str *tokens;
    const float *scores;       /* n_tokens or NULL (all 0) */
    const int32_t *token_type; /* n_tokens or NULL (all normal) */
    size_t n_merges;           /* BPE: "left right" strings, rank = index */
    const kiln_str *merges;
    /* special ids: KILN_TOKEN_NULL = absent (set by kiln_vocab_desc_init); out-of-range
     * ids are ignored with a warning, as llama.cpp does */
    int64_t bos, eos, eot, eom, unk, sep, pad, mask;
    /* -1 = not given (the family's default applies), 0 = false, 1 = true */
    int add_bos, add_eos, add_sep, add_space_prefix;
} kiln_vocab_desc;

/* Sets every field to "absent" (ids KILN_TOKEN_NULL, flags -1, pointers NULL). */
void kiln_vocab_desc_init(kiln_vocab_desc *d);

/* Builds a vocabulary. Errors: KILN_ERR_UNSUPPORTED (model or pre-tokenizer kiln does
 * not implement, named in the message), KILN_ERR_FORMAT (no tokens, a merge without a
 * separating space...), KILN_ERR_NOMEM. */
kiln_status kiln_vocab_create(const kiln_vocab_desc *d, kiln_vocab **out, kiln_err *err);

/* Reads the vocabulary from a GGUF file's metadata (a vocab-only GGUF is fine). */
kiln_status kiln_vocab_load_gguf(const char *path, kiln_vocab **out, kiln_err *err);

/* The same from a metadata view (format/meta.h) already open; source names it in
 * messages (may be NULL). The vocabulary copies what it keeps: m may be closed after. */
kiln_status kiln_vocab_from_meta(const kiln_meta *m, const char *source, kiln_vocab **out,
                                 kiln_err *err);

/* Any model path kiln_model_file_open accepts (GGUF, vocab-only GGUF, safetensors file
 * or directory with tokenizer.json). */
kiln_status kiln_vocab_load(const char *path, kiln_vocab **out, kiln_err *err);

/* From an open model file: its GGUF metadata, or for safetensors its tokenizer.json. */
struct kiln_model_file;
kiln_status kiln_vocab_from_model_file(const struct kiln_model_file *mf, kiln_vocab **out,
                                       kiln_err *err);

/* Reads a Hugging Face tokenizer.json (BPE models: byte-level with merges, or SPM-like
 * with U+2581 and byte fallback). pre_override names the pre-tokenizer (GGUF names:
 * "llama3", "qwen2", ...) when the file's regex is not recognized; NULL to detect. */
kiln_status kiln_vocab_load_hf(const char *tokenizer_json, const char *pre_override,
                               kiln_vocab **out, kiln_err *err);

void kiln_vocab_free(kiln_vocab *v);

/* --- queries (ids outside [0, n_tokens) are answered as absent / empty) ------------ */
size_t kiln_vocab_n_tokens(const kiln_vocab *v);
kiln_vocab_type kiln_vocab_get_type(const kiln_vocab *v);
const char *kiln_vocab_model_name(const kiln_vocab *v); /* "llama", "gpt2", ... */
const char *kiln_vocab_pre_name(const kiln_vocab *v);   /* "default", "llama3", ... */
kiln_token kiln_vocab_bos(const kiln_vocab *v);
kiln_token kiln_vocab_eos(const kiln_vocab *v);
kiln_token kiln_vocab_eot(const kiln_vocab *v);
kiln_token kiln_vocab_pad(const kiln_vocab *v);
kiln_token kiln_vocab_unk(const kiln_vocab *v);
bool kiln_vocab_add_bos(const kiln_vocab *v);
bool kiln_vocab_add_eos(const kiln_vocab *v);
/* True for tokens that end generation (eos, eot, eom and the well-known end tokens). */
bool kiln_vocab_is_eog(const kiln_vocab *v, kiln_token t);
uint32_t kiln_vocab_attr(const kiln_vocab *v, kiln_token t);
/* The raw token text as stored in the vocabulary (e.g. "Ġthe", "▁the", "<0x0A>"); the
 * pointer lives as long as v. */
kiln_str kiln_vocab_text(const kiln_vocab *v, kiln_token t);
/* Exact text -> id lookup; KILN_TOKEN_NULL when absent. */
kiln_token kiln_vocab_find(const kiln_vocab *v, const char *text, size_t len);

/* --- tokenize ----------------------------------------------------------------------- */

/* A growable id array; zero-initialize, release with kiln_tokens_free. */
typedef struct kiln_tokens {
    kiln_token *ids;
    size_t n, cap;
} kiln_tokens;
void kiln_tokens_free(kiln_tokens *t);

enum {
    KILN_TOK_ADD_SPECIAL = 1 << 0,   /* add BOS/EOS as the vocabulary asks (add_bos...) */
    KILN_TOK_PARSE_SPECIAL = 1 << 1, /* text like "<start_of_turn>" becomes the control
                                        token; otherwise only user-defined tokens are
                                        matched and control text is tokenized as text */
};

/* Appends the ids of text[0..len) (any bytes; invalid UTF-8 is handled like llama.cpp)
 * to out. On error out->n is unchanged. Errors: KILN_ERR_NOMEM, KILN_ERR_OVERFLOW,
 * KILN_ERR_INTERNAL (a regex engine failure, with PCRE2's message). */
kiln_status kiln_tokenize(const kiln_vocab *v, const char *text, size_t len, unsigned flags,
                          kiln_tokens *out, kiln_err *err);

/* --- detokenize --------------------------------------------------------------------- */

/* The text of one token. With special=false, control and unknown tokens give "".
 * lstrip removes up to that many leading spaces. Points into v (no allocation). */
kiln_str kiln_token_piece(const kiln_vocab *v, kiln_token t, bool special, int lstrip);

enum {
    KILN_DETOK_REMOVE_SPECIAL = 1 << 0,  /* drop a leading BOS / trailing EOS that the
                                            vocabulary adds */
    KILN_DETOK_UNPARSE_SPECIAL = 1 << 1, /* render control tokens as their text */
    /* The text of a whole sequence as generation streams it (docs/TOKENIZER.md, "Exact
     * text"): a leading BOS is dropped and the space prefix the tokenizer added (SPM
     * add_space_prefix) removed from the token after it, and no clean-up of spaces
     * (llama.cpp's clean-up loses text: " ." becomes "."). tokenize(text) then
     * detokenize(SEQUENCE) gives the text back, and the streaming detokenizer's output
     * after kiln_detok_stream_prime(prompt) is exactly SEQUENCE(prompt + generated)
     * minus SEQUENCE(prompt). */
    KILN_DETOK_SEQUENCE = 1 << 2
};

/* The text of ids[0..n) as llama.cpp's llama_detokenize gives it (SPM leading space
 * removed, clean-up of spaces before punctuation for vocabularies that ask for it).
 * *out is malloc'ed and NUL-terminated (free it); *out_len excludes the NUL. Ids out
 * of range: KILN_ERR_RANGE naming the position. */
kiln_status kiln_detokenize(const kiln_vocab *v, const kiln_token *ids, size_t n, unsigned flags,
                            char **out, size_t *out_len, kiln_err *err);

/* --- streaming detokenizer ------------------------------------------------------------
 * Turns tokens one at a time into text that is always complete UTF-8: bytes of a
 * character split across tokens are held until the character completes; bytes that
 * can never form a valid character are replaced by U+FFFD (one per maximal invalid
 * sequence), never passed through. The concatenated output equals kiln_detokenize
 * with KILN_DETOK_SEQUENCE made valid UTF-8 (a leading BOS does not count as the first
 * token). One stream per sequence; not thread-safe; it borrows v. */
typedef struct kiln_detok_stream kiln_detok_stream;

kiln_status kiln_detok_stream_create(const kiln_vocab *v, bool special, kiln_detok_stream **out,
                                     kiln_err *err);
/* Feeds one token; text and len receive the newly completed text (possibly empty),
 * valid until the next call on s. Errors: KILN_ERR_RANGE (bad id), KILN_ERR_NOMEM. */
kiln_status kiln_detok_stream_push(kiln_detok_stream *s, kiln_token t, const char **text,
                                   size_t *len, kiln_err *err);
/* Tells the stream that the tokens it will get follow prompt[0..n) (the whole prompt,
 * chat template included): the space prefix is then not removed from the first pushed
 * token unless the prompt is empty or only a BOS. Call before the first push. */
void kiln_detok_stream_prime(kiln_detok_stream *s, const kiln_token *prompt, size_t n);
/* Ends the sequence: held bytes of an unfinished character come out as U+FFFD. The
 * stream can then be reused for a new sequence. */
void kiln_detok_stream_flush(kiln_detok_stream *s, const char **text, size_t *len);
void kiln_detok_stream_free(kiln_detok_stream *s);

#endif /* KILN_TOK_TOK_H */
