/*
 * kiln.h — the public C API of kiln.
 *
 * Conventions (hold for every function declared here and in src/):
 *  - Every fallible function returns a kiln_status. KILN_OK is 0; anything else is
 *    an error whose human-readable message is written to the kiln_err the caller
 *    passed (which may be NULL when the caller does not want the message).
 *  - Objects are opaque handles created by kiln_<class>_create / _open and released
 *    by kiln_<class>_free / _close, which accept NULL.
 *  - Sizes are size_t or int64_t; counts from files are checked before use.
 *  - Library code never calls exit() or abort() on data from a file, a client or a
 *    user: such data yields a status and a message naming what is wrong and where.
 */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION_MAJOR  0
#define KILN_VERSION_MINOR  1
#define KILN_VERSION_PATCH  0
#define KILN_VERSION_STRING "0.1.0"

/* The one status enum of kiln. Keep kiln_status_name() in src/base/status.c in sync
 * (a static_assert there checks the count). */
typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_INVALID_ARG, /* a caller passed a bad argument (API misuse)         */
    KILN_ERR_NOMEM,       /* an allocation failed                                */
    KILN_ERR_OVERFLOW,    /* a size computation overflowed                       */
    KILN_ERR_IO,          /* a system call on a file or socket failed            */
    KILN_ERR_NOT_FOUND,   /* a file, key, tensor or name does not exist          */
    KILN_ERR_FORMAT,      /* malformed data in a file (bad magic, bad bounds...) */
    KILN_ERR_UNSUPPORTED, /* well-formed, but kiln does not implement it         */
    KILN_ERR_TYPE,        /* a value has the wrong type (metadata, dtype...)     */
    KILN_ERR_RANGE,       /* a value is outside its allowed range                */
    KILN_ERR_STATE,       /* an object is in the wrong state for the call        */
    KILN_ERR_CAPACITY,    /* a budget or pool is exhausted (KV blocks, slots)    */
    KILN_ERR_DEVICE,      /* a GPU / driver call failed                          */
    KILN_ERR_PLAN,        /* an execution plan failed validation                 */
    KILN_ERR_CANCELLED,   /* the operation was cancelled                         */
    KILN_ERR_INTERNAL,    /* a bug in kiln                                       */
    KILN_STATUS_COUNT
} kiln_status;

/* Returns a static, stable name such as "KILN_ERR_FORMAT". Never NULL. */
const char *kiln_status_name(kiln_status s);

/* Version string of the library ("0.1.0"). */
const char *kiln_version(void);

/* ---- errors ---- */
/* Error context (message buffer) filled by fallible calls; defined in base/status.h.
 * Embedders may allocate one with kiln_err_new / kiln_err_free and read its message
 * with kiln_err_message. */
typedef struct kiln_err kiln_err;
kiln_err *kiln_err_new(void);
void kiln_err_free(kiln_err *err);
const char *kiln_err_message(const kiln_err *err);

/* ---- models ---- */
typedef struct kiln_model kiln_model;

/* Opens a model file (GGUF, or a safetensors directory / file with config.json),
 * reads its metadata into the family's config and maps its tensors. */
kiln_status kiln_model_load(const char *path, kiln_model **out, kiln_err *err);
void kiln_model_free(kiln_model *m);
int32_t kiln_model_n_vocab(const kiln_model *m);
int32_t kiln_model_n_ctx_train(const kiln_model *m);
const char *kiln_model_arch(const kiln_model *m);

/* ---- engine: one forward pass over a batch of tokens from many sequences ---- */
typedef struct kiln_engine kiln_engine;

/* the engine's largest step when kiln_engine_opts.max_step_tokens is 0 */
#define KILN_DEFAULT_STEP_TOKENS 512

typedef struct kiln_engine_opts {
    const char *backend;     /* "ref" (default), "cpu", "cuda" or "auto" (cuda when a
                                usable GPU is present, else cpu)                    */
    int32_t n_threads;       /* 0: every online CPU                                 */
    int64_t n_ctx;           /* KV budget in tokens over all sequences (0: 4096)    */
    int32_t max_step_tokens; /* largest batch of one step (0: KILN_DEFAULT_STEP_TOKENS) */
    int32_t max_seqs;        /* sequences alive at once (0: 64)                     */
    int32_t kv_f16;          /* store the KV cache as f16 (default 0: f32)          */
    int32_t counters;        /* count dispatches per opcode (default 0: off)        */
    const char *numerics;    /* "exact" (default, NULL) or "ggml": llama.cpp's CPU
                                arithmetic — 8-bit activations in quantized matmuls,
                                f16 in attention and GELU — in reference kernels (for
                                comparisons with llama.cpp; slow; docs/PLAN.md)    */
    int32_t tp;              /* tensor-parallel ranks (0, 1: off). The engine is then a
                                group of tp ranks driven as one: host backends run each
                                rank on its own thread with an in-process communicator;
                                a GPU backend uses NCCL over devices 0..tp-1. n_threads
                                is shared out among the ranks (docs/TP.md)          */
} kiln_engine_opts;

void kiln_engine_opts_default(kiln_engine_opts *o);
/* The engine borrows the model: free the engine first. */
kiln_status kiln_engine_create(const kiln_model *m, const kiln_engine_opts *o, kiln_engine **out,
                               kiln_err *err);
void kiln_engine_free(kiln_engine *e);

/* Sequences: ids are small integers, reused after kiln_seq_free. */
kiln_status kiln_seq_create(kiln_engine *e, int32_t *seq, kiln_err *err);
void kiln_seq_free(kiln_engine *e, int32_t seq);
/* Number of positions cached for the sequence (-1 for an unknown id). */
int32_t kiln_seq_len(const kiln_engine *e, int32_t seq);
/* Keeps the first n_pos positions (multi-turn reuse of the sequence's own history;
 * 0 resets). */
kiln_status kiln_seq_truncate(kiln_engine *e, int32_t seq, int32_t n_pos, kiln_err *err);
/* A new sequence that shares the parent's cached positions. */
kiln_status kiln_seq_fork(kiln_engine *e, int32_t parent, int32_t *child, kiln_err *err);

typedef struct kiln_batch_entry {
    int32_t seq, token, pos;
    int32_t want_logits; /* nonzero: this entry gets a row of logits */
} kiln_batch_entry;

/* ---- capacity (what a scheduler admits and preempts with; never fails) ----
 * KV memory is handed out in blocks of kiln_engine_kv_block_size positions; every
 * sequence holds ceil(len / block_size) blocks (a fork shares its parent's full ones). */
int32_t kiln_engine_kv_block_size(const kiln_engine *e);
int32_t kiln_engine_kv_blocks_total(const kiln_engine *e);
int32_t kiln_engine_kv_blocks_free(const kiln_engine *e);
int32_t kiln_engine_max_step_tokens(const kiln_engine *e);
int32_t kiln_engine_max_seqs(const kiln_engine *e);
int32_t kiln_engine_seqs_free(const kiln_engine *e);
/* Blocks the sequence must take from the free pool to grow by n_new positions (0 when
 * its last block has room; -1 for an unknown sequence or n_new < 0). */
int32_t kiln_seq_blocks_needed(const kiln_engine *e, int32_t seq, int32_t n_new);
/* Blocks a step over these entries would take (the sum of kiln_seq_blocks_needed over
 * the entries' sequences; -1 when an entry names an unknown sequence). A step whose
 * need is <= kiln_engine_kv_blocks_free never fails with KILN_ERR_CAPACITY. */
int32_t kiln_engine_blocks_needed(const kiln_engine *e, const kiln_batch_entry *entries, int32_t n);

/* ---- a step in two parts: prepare, then run ----
 * kiln_engine_prepare validates the entries, reserves their KV blocks (all or nothing)
 * and builds the step's packed inputs (token ids, positions, the block table) in the
 * engine's buffers; kiln_engine_run runs it. Between the two nothing of the engine
 * changes, so a device backend can prepare step N+1 while step N runs (prepare never
 * waits for a running step). At most one step is prepared at a time (a second prepare
 * before run: KILN_ERR_STATE); kiln_engine_cancel drops it and returns its blocks.
 * Entries: each sequence's entries in order of position, the first at the sequence's
 * length plus what an earlier prepared-and-run step adds, without gaps. Results for a
 * sequence do not depend on the other sequences in the batch: bitwise on the ref
 * backend (every kernel batch-invariant); on cpu, attention is bitwise batch-invariant
 * per row, while a matmul row may differ in its last bits with its position in the
 * step and the step's size (rows are computed in groups of four), never with the other
 * rows' values.
 * Errors of prepare: KILN_ERR_INVALID_ARG (bad entry: unknown sequence, token out of
 * range, position out of order; too many entries), KILN_ERR_CAPACITY (KV budget
 * exhausted: nothing reserved, sequences unchanged), KILN_ERR_STATE. Errors of run: from
 * kernels (KILN_ERR_DEVICE with the device's message, ...); after a failed run the
 * sequences of the step keep their lengths from before it. */
typedef struct kiln_step_opts {
    /* 0: every entry with want_logits gets a row of logits (kiln_engine_logits);
     * 1: greedy, it gets a token id instead (kiln_engine_token): the lowest id <
     * n_vocab_limit with the largest logit after the model's final softcap (NaN / -inf
     * never chosen; -1 when none is left), what a temperature-0 sampler without
     * penalties picks; the backend may fuse the pick into the LM head. */
    int32_t greedy;
    int32_t n_vocab_limit; /* greedy: <= 0 means the whole vocabulary */
    /* internal (runtime/engine.h): a sampled step, the sampling chain run on the backend;
     * NULL for callers of this API */
    const struct kiln_sample_step *sample;
} kiln_step_opts;

kiln_status kiln_engine_prepare(kiln_engine *e, const kiln_batch_entry *entries, int32_t n,
                                const kiln_step_opts *opts, kiln_err *err);
kiln_status kiln_engine_run(kiln_engine *e, kiln_err *err);
void kiln_engine_cancel(kiln_engine *e);

/* ---- outputs of the last run, owned by the engine (valid until the next run) ----
 * One output row per entry that wanted logits, in entry order. */
int32_t kiln_engine_n_outputs(const kiln_engine *e);
int32_t kiln_engine_n_vocab(const kiln_engine *e);
/* Row i's n_vocab logits (NULL when i is out of range or the step was greedy). */
const float *kiln_engine_logits(const kiln_engine *e, int32_t i);
/* Row i's token id of a greedy step (-1 when out of range / none / not greedy). */
int32_t kiln_engine_token(const kiln_engine *e, int32_t i);

/* One step, prepare + run, with the logits copied to a caller buffer: logits gets one
 * row of n_vocab floats per entry with want_logits, in entry order (may be NULL when
 * none asks). Errors as prepare and run. */
kiln_status kiln_engine_step(kiln_engine *e, const kiln_batch_entry *entries, int32_t n,
                             float *logits, kiln_err *err);
/* The same for greedy decoding (kiln_step_opts.greedy): every entry with want_logits
 * gets one token id in ids (entry order). n_vocab_limit <= 0 means the whole
 * vocabulary. */
kiln_status kiln_engine_step_greedy(kiln_engine *e, const kiln_batch_entry *entries, int32_t n,
                                    int32_t n_vocab_limit, int32_t *ids, kiln_err *err);
/* Dispatch counts per opcode since creation (NULL when counters are off). */
const uint64_t *kiln_engine_counters(const kiln_engine *e);

/* ---- text and generation ----
 * The model's tokenizer must be loaded first (kiln_model_load_tokenizer). Text is
 * exact: the generated text is what the whole token sequence detokenizes to minus the
 * prompt's text (so prompt + generated text is the sequence's text; UTF-8 characters
 * split across tokens come out whole). */

/* Loads the tokenizer of the model's file (GGUF metadata or tokenizer.json). Idempotent. */
kiln_status kiln_model_load_tokenizer(kiln_model *m, kiln_err *err);
/* Text -> token ids. add_special: BOS/EOS as the vocabulary asks; parse_special: text
 * like "<start_of_turn>" becomes that control token. Writes at most cap ids; *n_out is
 * the number of ids the text has (KILN_ERR_RANGE when it exceeds cap). */
kiln_status kiln_model_tokenize(const kiln_model *m, const char *text, size_t len, int add_special,
                                int parse_special, int32_t *ids, int32_t cap, int32_t *n_out,
                                kiln_err *err);
/* Token ids -> the text of the sequence (a leading BOS and the SPM space prefix removed;
 * control tokens give no text). Writes at most cap bytes plus a NUL when it fits;
 * *len_out is the text's length (KILN_ERR_RANGE when len_out >= cap). */
kiln_status kiln_model_detokenize(const kiln_model *m, const int32_t *ids, int32_t n, char *buf,
                                  size_t cap, size_t *len_out, kiln_err *err);

typedef struct kiln_gen_params {
    int32_t n_predict;       /* tokens to generate at most (default 128)            */
    float temperature;       /* default 0.8; <= 0: greedy                           */
    int32_t top_k;           /* default 40; <= 0: off                               */
    float top_p;             /* default 0.95; 1: off                                */
    float min_p;             /* default 0.05; 0: off                                */
    float repeat_penalty;    /* default 1 (off)                                     */
    int32_t repeat_last_n;   /* default 64 (-1: all, 0: off)                        */
    float frequency_penalty; /* default 0                                           */
    float presence_penalty;  /* default 0                                           */
    uint64_t seed;           /* default 0                                           */
    const char *const *stop; /* stop strings (NULL: none); the text stops before one */
    int32_t n_stop;
    int32_t ignore_eos; /* nonzero: do not stop at end-of-generation tokens         */
} kiln_gen_params;

void kiln_gen_params_default(kiln_gen_params *p);

/* Called for each generated token with the text it completes (may be empty: part of a
 * UTF-8 character or of a possible stop string is held back), then once with token -1
 * for held text at the end (only when there is some). Return nonzero to stop. */
typedef int (*kiln_token_cb)(void *user, int32_t token, const char *text, size_t len);

/* Generates from prompt (tokenized with BOS as the model asks, special tokens not
 * parsed) on a new sequence of e, which is freed at the end. The engine must have been
 * created for m. Errors: KILN_ERR_INVALID_ARG (no tokenizer loaded, empty prompt, bad
 * parameters), KILN_ERR_RANGE (prompt longer than the context), engine errors. */
kiln_status kiln_generate(kiln_engine *e, const kiln_model *m, const char *prompt,
                          const kiln_gen_params *p, kiln_token_cb cb, void *user, kiln_err *err);

#ifdef __cplusplus
}
#endif
#endif /* KILN_KILN_H */
