/*
 * loop.h — what the HTTP side of `kiln serve` needs from generation: submit a request
 * (n choices), watch its text / token ids / logprobs grow, cancel it. Implemented over
 * the scheduler (src/sched/sched.h, issue #12): each choice is one scheduler request
 * (n > 1 fans out with seeds seed, seed+1, ...; the prefix cache shares the prompt),
 * whose sink appends to the choice under the loop's mutex and wakes the connection.
 *
 * Ownership and threads: kiln_srv_loop borrows the model and engine (the caller frees
 * them after kiln_srv_loop_free) and owns the scheduler and its thread. A request is
 * created by the server, submitted once, read under kiln_srv_wait / kiln_srv_lock, and
 * released by both sides (refcount; the loop's reference goes with the last choice's
 * final event). Everything the server reads (text, ids, logprobs, finish) is guarded by
 * the loop's mutex.
 *
 * Parking (the server's one HTTP thread never waits): a connection with nothing to send
 * parks its request (kiln_srv_park, under the lock, while it suspends itself) and
 * returns; the sink unparks it when the request changes (or only at its end:
 * final_only) and the server's wake function gets r->user after the unlock. A parked
 * request is unparked exactly once, by the sink, kiln_srv_wake_idle or
 * kiln_srv_stop_parking, so a wake always follows its park.
 *
 * Step batching: the sink runs once per token of every choice; the wakes of one
 * scheduler step are held and given to the wake function together (one wakeup of the
 * HTTP thread per step, not one per stream) when the step ends (the scheduler's
 * on_step_end hook), at a final event, and at kiln_srv_wake_idle.
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
    uint64_t id;         /* the scheduler's request id (0: not submitted) */
    int32_t n_generated; /* tokens generated (usage; a final end token included) */
    /* guarded by the loop mutex */
    char *text;
    size_t len, cap;
    int32_t *ids;
    size_t n_ids, ids_cap;
    json_t *lp; /* array of {token, logprob, bytes, top_logprobs} per generated token */
    kiln_srv_finish finish;
} kiln_srv_choice;

typedef struct kiln_srv_loop kiln_srv_loop;
struct kiln_srv_tenants;

typedef struct kiln_srv_req {
    const kiln_oai_req *p; /* borrowed from the submitter (valid for kiln_srv_submit and
                              the submitter's reads; the sink never touches it) */
    int32_t *prompt;       /* owned */
    size_t n_prompt;
    int32_t n_choices;
    bool want_logprobs; /* copied: the sink may run after the submitter freed p */
    uint64_t seed;
    char tenant[64]; /* the scheduler tenant */
    int32_t n_final; /* choices whose final event came */
    struct kiln_srv_sink_ctx {
        struct kiln_srv_loop *l;
        struct kiln_srv_req *r;
        int ch;
    } sink[KILN_OAI_MAX_N];
    int64_t max_tokens; /* resolved: never past the context */
    /* guarded by the loop mutex */
    int state; /* 0 new, 1 queued, 2 running, 3 done */
    bool cancel;
    kiln_srv_choice ch[KILN_OAI_MAX_N];
    uint64_t t_submit, t_first, t_done; /* ns */
    uint64_t version;                   /* bumped on every change */
    kiln_status err_code;
    char err_msg[256];
    int refs;
    pthread_cond_t cv;
    void *user; /* the submitter's (given to the wake function) */
    /* parking, guarded by the loop mutex */
    bool parked, park_final_only;
    bool idle_woken; /* unparked by kiln_srv_wake_idle (not by news); the server clears it */
    uint64_t t_parked;
    struct kiln_srv_req *park_prev, *park_next;
} kiln_srv_req;

typedef struct kiln_srv_loop_opts {
    int32_t slots;      /* sequences decoding at once */
    int32_t max_queue;  /* requests waiting beyond the slots; more -> busy */
    int32_t max_step;   /* tokens per engine step */
    int64_t n_ctx;      /* per sequence */
    bool deterministic; /* greedy output independent of the batch (batch-invariant kernels) */
} kiln_srv_loop_opts;

/* The tenants' ids and QoS classes become scheduler tenants (their keys and quotas stay
 * with the server's tenants.c). */
kiln_status kiln_srv_loop_create(const kiln_model *m, kiln_engine *e, const kiln_srv_loop_opts *o,
                                 const struct kiln_srv_tenants *tenants, kiln_srv_loop **out,
                                 kiln_err *err);
/* Stops the thread after the queue and the running requests are done (drain). */
void kiln_srv_loop_free(kiln_srv_loop *l);

/* A new request (refs 1) for prompt ids (copied). */
kiln_status kiln_srv_req_create(const kiln_oai_req *p, const int32_t *prompt, size_t n,
                                int64_t max_tokens, uint64_t seed, kiln_srv_req **out,
                                kiln_err *err);
/* Queues r (takes a reference). Rejected: *http (400/404/429/503) and *retry_after
 * (seconds, for 429/503) say how to answer, err the message. */
kiln_status kiln_srv_submit(kiln_srv_loop *l, kiln_srv_req *r, int *http, int *retry_after,
                            kiln_err *err);
/* Asks the loop to drop r at its next step. */
void kiln_srv_cancel(kiln_srv_loop *l, kiln_srv_req *r);
void kiln_srv_req_release(kiln_srv_loop *l, kiln_srv_req *r);

/* Locks the loop mutex; waits (up to timeout_ms) until r->version != seen. The caller
 * reads r and then calls kiln_srv_unlock. Returns false on timeout. */
bool kiln_srv_wait(kiln_srv_loop *l, kiln_srv_req *r, uint64_t seen, int timeout_ms);
void kiln_srv_lock(kiln_srv_loop *l);
void kiln_srv_unlock(kiln_srv_loop *l);

/* The function that wakes parked requests' connections (server.c: resumes them), n >= 1
 * distinct users at a time; set once before the first submit. Called on the scheduler
 * thread (from the sink) or the caller of kiln_srv_wake_idle / kiln_srv_stop_parking,
 * never under the loop mutex. */
void kiln_srv_loop_set_wake(kiln_srv_loop *l, void (*wake)(void *const *users, int n));
/* Under kiln_srv_lock: parks r until its next change (final_only: until its end), a
 * kiln_srv_wake_idle or kiln_srv_stop_parking. False (not parked) after
 * kiln_srv_stop_parking: the caller must not wait. */
bool kiln_srv_park(kiln_srv_loop *l, kiln_srv_req *r, bool final_only);
/* Under kiln_srv_lock: takes r off the parked list without waking it (its connection
 * is going away); false when it was not parked. */
bool kiln_srv_unpark(kiln_srv_loop *l, kiln_srv_req *r);
/* Wakes what a step left held, and the requests parked for at least min_age_ns
 * (idle_woken set: their connections look at the client). Returns how many. */
int kiln_srv_wake_idle(kiln_srv_loop *l, uint64_t min_age_ns);
/* No parking from now on; wakes every parked request (shutdown). */
void kiln_srv_stop_parking(kiln_srv_loop *l);

/* Gauges for /metrics (Prometheus text, malloc'ed). */
char *kiln_srv_loop_metrics(kiln_srv_loop *l);
/* Requests queued + running. */
int kiln_srv_loop_busy(kiln_srv_loop *l);
/* Stop accepting; kiln_srv_loop_busy falls to 0 once everything admitted is done. */
void kiln_srv_loop_drain(kiln_srv_loop *l);

#endif /* KILN_SERVE_LOOP_H */
