/*
 * loop.h — the generation loop behind `kiln serve`: one thread that runs continuous
 * batching over a kiln_engine for every admitted request (every decoding sequence gets
 * its token each step; prompt chunks fill the rest of the step's token budget), samples
 * each sequence with its own sampler, detokenizes, applies stop strings and hands text
 * to the connection threads.
 *
 * This is serve's interim driver until the scheduler (src/sched, issue #12) lands: it
 * has a FIFO queue, a slot limit and cancellation, but no QoS, preemption or prefix
 * cache. The HTTP side only uses the calls below, so swapping in sched.h touches loop.c.
 *
 * Ownership and threads: kiln_srv_loop borrows the model and engine (the caller frees
 * them after kiln_srv_loop_free). A request is created by a connection thread, submitted
 * once, read under kiln_srv_req_wait, and released by both sides (refcount). Everything
 * a connection thread reads (text, ids, logprobs, finish) is guarded by the loop's mutex.
 */
#ifndef KILN_SERVE_LOOP_H
#define KILN_SERVE_LOOP_H

#include "base/status.h"
#include "model/model.h"
#include "sample/sample.h"
#include "serve/oai.h"
#include "tok/tok.h"

#include <pthread.h>

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum kiln_srv_finish {
    KILN_FIN_NONE = 0,
    KILN_FIN_STOP,   /* end-of-generation token or stop string */
    KILN_FIN_LENGTH, /* max_tokens or the context */
    KILN_FIN_CANCEL, /* client went away / server error */
} kiln_srv_finish;

typedef struct kiln_srv_choice {
    /* loop thread only */
    int32_t seq;
    kiln_sampler *smp;
    kiln_detok_stream *ds;
    kiln_stopper stop;
    int32_t last;
    bool eog; /* ended by an end-of-generation token (counted in usage) */
    /* guarded by the loop mutex */
    char *text;
    size_t len, cap;
    int32_t *ids;
    size_t n_ids, ids_cap;
    json_t *lp; /* array of {token, logprob, bytes, top_logprobs} per generated token */
    kiln_srv_finish finish;
} kiln_srv_choice;

typedef struct kiln_srv_loop kiln_srv_loop;

typedef struct kiln_srv_req {
    const kiln_oai_req *p; /* = &params */
    /* the sampling parameters and stop strings of the submitter's request, copied (stop
     * strings owned; body, messages and prompt pointers NULL): the loop may still run a
     * request whose submitter already released it (client disconnect) */
    kiln_oai_req params;
    int32_t *prompt; /* owned */
    size_t n_prompt;
    int32_t n_choices;
    uint64_t seed;
    int64_t max_tokens; /* resolved: never past the context */
    /* guarded by the loop mutex */
    int state; /* 0 new, 1 queued, 2 running, 3 done */
    bool cancel;
    size_t n_fed;
    kiln_srv_choice ch[KILN_OAI_MAX_N];
    uint64_t t_submit, t_first, t_done; /* ns */
    uint64_t version;                   /* bumped on every change */
    kiln_status err_code;
    char err_msg[256];
    int refs;
    pthread_cond_t cv;
    uint64_t http_ns; /* time the connection thread spent formatting/sending */
    void *user;       /* the submitter's */
} kiln_srv_req;

typedef struct kiln_srv_loop_opts {
    int32_t slots;     /* sequences decoding at once */
    int32_t max_queue; /* requests waiting beyond the slots; more -> busy */
    int32_t max_step;  /* tokens per engine step */
    int64_t n_ctx;     /* per sequence */
} kiln_srv_loop_opts;

kiln_status kiln_srv_loop_create(const kiln_model *m, kiln_engine *e, const kiln_srv_loop_opts *o,
                                 kiln_srv_loop **out, kiln_err *err);
/* Stops the thread after the queue and the running requests are done (drain). */
void kiln_srv_loop_free(kiln_srv_loop *l);

/* A new request (refs 1) for prompt ids (copied). */
kiln_status kiln_srv_req_create(const kiln_oai_req *p, const int32_t *prompt, size_t n,
                                int64_t max_tokens, uint64_t seed, kiln_srv_req **out,
                                kiln_err *err);
/* Queues r (takes a reference). KILN_ERR_CAPACITY: the queue is full (answer 503);
 * KILN_ERR_STATE: the loop is draining. */
kiln_status kiln_srv_submit(kiln_srv_loop *l, kiln_srv_req *r, kiln_err *err);
/* Asks the loop to drop r at its next step. */
void kiln_srv_cancel(kiln_srv_loop *l, kiln_srv_req *r);
void kiln_srv_req_release(kiln_srv_loop *l, kiln_srv_req *r);

/* Locks the loop mutex; waits (up to timeout_ms) until r->version != seen. The caller
 * reads r and then calls kiln_srv_unlock. Returns false on timeout. */
bool kiln_srv_wait(kiln_srv_loop *l, kiln_srv_req *r, uint64_t seen, int timeout_ms);
void kiln_srv_lock(kiln_srv_loop *l);
void kiln_srv_unlock(kiln_srv_loop *l);

/* Gauges for /metrics (Prometheus text, malloc'ed). */
char *kiln_srv_loop_metrics(kiln_srv_loop *l);
/* Requests queued + running. */
int kiln_srv_loop_busy(kiln_srv_loop *l);
/* Stop accepting; kiln_srv_loop_busy falls to 0 once everything admitted is done. */
void kiln_srv_loop_drain(kiln_srv_loop *l);

#endif /* KILN_SERVE_LOOP_H */
