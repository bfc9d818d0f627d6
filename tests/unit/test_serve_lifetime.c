/* test_serve_lifetime.c — the serve loop (src/serve/loop.c) without HTTP.
 *
 * test_submitter_frees_first: regression test for a use-after-free in kiln serve found by the
 * abuse soak (tests/slow/serve_abuse.py, 256 concurrent streams with client
 * disconnects): a kiln_srv_req borrowed the connection's kiln_oai_req, which the server
 * frees when the client goes away while the loop still runs the request (SIGSEGV in
 * sample_one reading p->n_bias). The request now copies what the loop reads. Here the
 * submitter's request is submitted, then freed and overwritten at once (what a
 * disconnect does), and the request must still finish with the right length, its stop
 * string and its logit bias applied (the bias forces one token).
 *
 * test_step_batching: the wakes of parked streams are given to the server per scheduler
 * step (the scheduler's on_step_end hook), so one wakeup of the HTTP thread serves every
 * stream a step fed, and no stream's token waits past the end of its step. */
#include "testutil.h"

#include "kiln/kiln.h"
#include "model/model.h"
#include "serve/loop.h"
#include "serve/oai.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct fixture {
    char dir[32], path[64];
    kiln_model *m;
    kiln_engine *e;
    kiln_srv_loop *l;
} fixture;

/* A 1-layer tiny llama, a cpu engine and a loop of `slots` slots. */
static void fixture_open(fixture *f, int slots) {
    char cmd[256];
    snprintf(f->dir, sizeof f->dir, "/tmp/kiln-serve-life-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof f->path, "%s/m.gguf", f->dir);
    const char *b = getenv("KILN_BINARY_DIR");
    snprintf(cmd, sizeof cmd, "'%s/kiln-gen' -q -p tiny -f llama -t q8_0 -s 7 --layers 1 -o '%s'",
             b ? b : ".", f->path);
    assert_int_equal(system(cmd), 0);
    kiln_err err;
    if (kiln_model_load(f->path, &f->m, &err) != KILN_OK) fail_msg("load: %s", err.msg);
    assert_int_equal(kiln_model_load_vocab(f->m, &err), KILN_OK);
    kiln_engine_opts eo;
    kiln_engine_opts_default(&eo);
    eo.n_threads = 1;
    eo.n_ctx = 256;
    if (kiln_engine_create(f->m, &eo, &f->e, &err) != KILN_OK) fail_msg("engine: %s", err.msg);
    kiln_srv_loop_opts lo = {.slots = slots, .max_queue = 4, .max_step = 64, .n_ctx = 128};
    if (kiln_srv_loop_create(f->m, f->e, &lo, NULL, &f->l, &err) != KILN_OK)
        fail_msg("loop: %s", err.msg);
}

static void fixture_close(fixture *f) {
    char cmd[128];
    kiln_srv_loop_free(f->l);
    kiln_engine_free(f->e);
    kiln_model_free(f->m);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    assert_int_equal(system(cmd), 0);
}

/* A greedy completion request of prompt [1, 2, 3] and max_tokens n (the parsed request
 * in *pp, freed by the caller). */
static kiln_srv_req *make_req(fixture *f, const char *body, int64_t n, kiln_oai_req **pp) {
    kiln_err err;
    kiln_oai_req *p = calloc(1, sizeof *p);
    assert_non_null(p);
    kiln_oai_error oe;
    if (!kiln_oai_parse(KILN_OAI_COMPLETION, body, strlen(body), kiln_model_n_vocab(f->m), p, &oe))
        fail_msg("parse: %s", oe.message);
    int32_t prompt[3] = {1, 2, 3};
    kiln_srv_req *r;
    assert_int_equal(kiln_srv_req_create(p, prompt, 3, n, 1, &r, &err), KILN_OK);
    *pp = p;
    return r;
}

/* Waits (up to 100 s) until r has all its final events. */
static void wait_done(kiln_srv_loop *l, kiln_srv_req *r) {
    uint64_t seen = 0;
    for (int i = 0; i < 2000; i++) {
        kiln_srv_lock(l);
        int state = r->state;
        seen = r->version;
        kiln_srv_unlock(l);
        if (state == 3) break;
        kiln_srv_wait(l, r, seen, 50);
        kiln_srv_unlock(l);
    }
}

static void test_submitter_frees_first(void **s) {
    (void)s;
    fixture fx, *f = &fx;
    fixture_open(f, 2);
    kiln_err err;
    kiln_srv_loop *l = f->l;
    const char *body = "{\"model\":\"m\",\"prompt\":[1,2,3],\"max_tokens\":6,\"temperature\":0,"
                       "\"stop\":[\"zzzz-never\"],\"logit_bias\":{\"7\":100}}";
    kiln_oai_req *p;
    kiln_srv_req *r = make_req(f, body, 6, &p);
    int http = 0, retry = 0;
    assert_int_equal(kiln_srv_submit(l, r, &http, &retry, &err), KILN_OK);
    /* the client is gone: its request is freed and the memory reused */
    kiln_oai_req_free(p);
    memset(p, 0x7f, sizeof *p);
    free(p);
    wait_done(l, r);
    kiln_srv_lock(l);
    assert_int_equal(r->state, 3);
    assert_int_equal(r->err_code, KILN_OK);
    /* (the loop hands the scheduler copies of the stop strings and the logit bias at
     * submit; r->p is the submitter's and is not read after kiln_srv_submit) */
    assert_int_equal(r->ch[0].n_ids, 6);
    for (size_t i = 0; i < r->ch[0].n_ids; i++) assert_int_equal(r->ch[0].ids[i], 7);
    kiln_srv_unlock(l);
    kiln_srv_req_release(l, r);
    fixture_close(f);
}

/* ---- step batching ---- */

#define NB_REQ 3
static struct {
    kiln_srv_loop *l;
    kiln_srv_req *r[NB_REQ];
    size_t seen[NB_REQ]; /* tokens of request i at its last wake */
    bool done[NB_REQ];   /* woken after its final event (the server may free it then) */
    int calls, full_calls, users, late;
} wb;

/* The server's wake function, played here: records the batch; each woken stream takes
 * what it has and parks again (as the HTTP thread does after sending). */
static void wake_record(void *const *users, int n) {
    wb.calls++;
    wb.users += n;
    if (n == NB_REQ) wb.full_calls++;
    kiln_srv_lock(wb.l);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < NB_REQ; i++) {
            if (users[k] != wb.r[i]) continue;
            kiln_srv_req *r = wb.r[i];
            /* a stream woken with more than one new token had one held past a step */
            if (r->ch[0].n_ids > wb.seen[i] + 1) wb.late++;
            wb.seen[i] = r->ch[0].n_ids;
            if (r->state != 3)
                assert_true(kiln_srv_park(wb.l, r, false));
            else
                wb.done[i] = true;
        }
    kiln_srv_unlock(wb.l);
}

static void test_step_batching(void **s) {
    (void)s;
    fixture fx, *f = &fx;
    fixture_open(f, NB_REQ);
    memset(&wb, 0, sizeof wb);
    wb.l = f->l;
    kiln_srv_loop_set_wake(f->l, wake_record);
    static const int64_t n_tok[NB_REQ] = {64, 64, 40};
    kiln_oai_req *p[NB_REQ];
    kiln_err err;
    for (int i = 0; i < NB_REQ; i++) {
        char body[160];
        snprintf(body, sizeof body,
                 "{\"model\":\"m\",\"prompt\":[1,2,3],\"max_tokens\":%d,\"temperature\":0,"
                 "\"stream\":true}",
                 (int)n_tok[i]);
        wb.r[i] = make_req(f, body, n_tok[i], &p[i]);
        wb.r[i]->user = wb.r[i];
    }
    /* all parked before any is submitted: every token of every stream goes through a wake */
    kiln_srv_lock(f->l);
    for (int i = 0; i < NB_REQ; i++) assert_true(kiln_srv_park(f->l, wb.r[i], false));
    kiln_srv_unlock(f->l);
    for (int i = 0; i < NB_REQ; i++) {
        int http = 0, retry = 0;
        assert_int_equal(kiln_srv_submit(f->l, wb.r[i], &http, &retry, &err), KILN_OK);
    }
    for (int i = 0; i < NB_REQ; i++) wait_done(f->l, wb.r[i]);
    /* a parked request belongs to its waker until its wake (as a suspended connection):
     * released only after the wake that follows its final event */
    for (int t = 0, all = 0; !all && t < 10000; t++) {
        kiln_srv_lock(f->l);
        all = 1;
        for (int i = 0; i < NB_REQ; i++) all &= wb.done[i];
        kiln_srv_unlock(f->l);
        if (!all) usleep(1000);
    }
    kiln_srv_lock(f->l);
    for (int i = 0; i < NB_REQ; i++) assert_true(wb.done[i]);
    for (int i = 0; i < NB_REQ; i++) {
        assert_int_equal(wb.r[i]->state, 3);
        assert_int_equal((int64_t)wb.r[i]->ch[0].n_ids, n_tok[i]);
    }
    kiln_srv_unlock(f->l);
    /* no token waited past its step; the steps that fed all three woke them together: the
     * three decode in lockstep for the shortest's 40 tokens minus the steps the scheduler
     * ran before the last submit arrived (a loaded machine may preempt this thread between
     * submits: the margin is 30 steps) and its final one (which wakes at once) */
    assert_int_equal(wb.late, 0);
    if (wb.full_calls < 8)
        fail_msg("%d of %d wake calls carried all %d streams (%d users)", wb.full_calls, wb.calls,
                 NB_REQ, wb.users);
    for (int i = 0; i < NB_REQ; i++) {
        kiln_srv_req_release(f->l, wb.r[i]);
        kiln_oai_req_free(p[i]);
        free(p[i]);
    }
    fixture_close(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_submitter_frees_first),
                                       cmocka_unit_test(test_step_batching)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
