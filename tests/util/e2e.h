/*
 * e2e.h — whole-model comparisons of one backend against an oracle backend, shared by
 * tests/slow/test_cpu_e2e.c (cpu vs ref) and tests/gpu/test_cuda_e2e.c (cuda vs ref on
 * small synthetic models, vs cpu on larger ones and the real models).
 *
 * Checks of one model (kt_e2e_model):
 *  - teacher forcing: the same tokens through both backends in steps of 64, logits of
 *    every position: top-1 agreement >= 99.9 % over the positions that are not ties and
 *    mean KL(oracle || backend) < 1e-4 (full-vocabulary softmax in double). A tie: the
 *    backends pick different tokens whose oracle logits are closer than twice the largest
 *    difference between the two rows while the rows agree to 1e-3 of the top logit
 *    (either pick is within the rows' measured agreement; a backend far off gets no
 *    ties); at most 1 % of positions may be ties; raw agreement and the tie count are
 *    printed too. Tokens: the first `tokens` of
 *    tests/data/parity/text.txt when the model has a vocabulary that tokenizes it, else
 *    pseudo-random ids (synthetic models of small vocabularies);
 *  - greedy (when greedy_file is set): the prompts of that file ("P id id ..." lines),
 *    greedy_tokens generated tokens each, compared between the backends; at least
 *    greedy_min_same prompts must agree on every token (-1: all).
 * Failures print a line and count into the returned number; nothing aborts.
 */
#ifndef KILN_TESTS_E2E_H
#define KILN_TESTS_E2E_H

#include <stdbool.h>

typedef struct kt_e2e {
    const char *oracle;      /* "ref" or "cpu" */
    const char *backend;     /* the backend under test */
    int tokens;              /* teacher-forced tokens (<= 512) */
    const char *greedy_file; /* NULL: no greedy check */
    int greedy_tokens;       /* <= 64 */
    int greedy_min_same;     /* -1: every prompt */
    int threads;             /* host threads of the cpu backend */
    bool kv_f16;
} kt_e2e;

#include <stdint.h>

struct kiln_model;
struct kiln_engine;
/* An engine on `backend` with these limits (threads 0: every CPU), or NULL with the
 * error printed. */
struct kiln_engine *kt_e2e_engine(const struct kiln_model *m, const char *backend, int threads,
                                  int64_t n_ctx, int max_step, int max_seqs, bool kv_f16);
/* The model at path, or NULL: absent (a message prefixed by `what`, *status 0: skipped)
 * or failing to load (the error printed, *status 1). Free with kiln_model_free. */
struct kiln_model *kt_e2e_load(const char *path, const char *what, int *status);

/* Runs the checks on the model at path (absent: a message, skipped, 0). Returns the
 * number of failed checks. */
int kt_e2e_model(const kt_e2e *c, const char *path);

#endif /* KILN_TESTS_E2E_H */
