/* test_serve_lifetime.c — regression test for a use-after-free in kiln serve found by the
 * abuse soak (tests/slow/serve_abuse.py, 256 concurrent streams with client
 * disconnects): a kiln_srv_req borrowed the connection's kiln_oai_req, which the server
 * frees when the client goes away while the loop still runs the request (SIGSEGV in
 * sample_one reading p->n_bias). The request now copies what the loop reads. Here the
 * submitter's request is submitted, then freed and overwritten at once (what a
 * disconnect does), and the request must still finish with the right length, its stop
 * string and its logit bias applied (the bias forces one token). */
#include "testutil.h"

#include "kiln/kiln.h"
#include "model/model.h"
#include "serve/loop.h"
#include "serve/oai.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_submitter_frees_first(void **s) {
    (void)s;
    char dir[] = "/tmp/kiln-serve-life-XXXXXX", path[64], cmd[256];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    const char *b = getenv("KILN_BINARY_DIR");
    snprintf(cmd, sizeof cmd, "'%s/kiln-gen' -q -p tiny -f llama -t q8_0 -s 7 --layers 1 -o '%s'",
             b ? b : ".", path);
    assert_int_equal(system(cmd), 0);
    kiln_err err;
    kiln_model *m;
    if (kiln_model_load(path, &m, &err) != KILN_OK) fail_msg("load: %s", err.msg);
    assert_int_equal(kiln_model_load_vocab(m, &err), KILN_OK);
    kiln_engine_opts eo;
    kiln_engine_opts_default(&eo);
    eo.n_threads = 1;
    eo.n_ctx = 256;
    kiln_engine *e;
    if (kiln_engine_create(m, &eo, &e, &err) != KILN_OK) fail_msg("engine: %s", err.msg);
    kiln_srv_loop_opts lo = {.slots = 2, .max_queue = 4, .max_step = 64, .n_ctx = 128};
    kiln_srv_loop *l;
    if (kiln_srv_loop_create(m, e, &lo, NULL, &l, &err) != KILN_OK) fail_msg("loop: %s", err.msg);

    const char *body = "{\"model\":\"m\",\"prompt\":[1,2,3],\"max_tokens\":6,\"temperature\":0,"
                       "\"stop\":[\"zzzz-never\"],\"logit_bias\":{\"7\":100}}";
    kiln_oai_req *p = calloc(1, sizeof *p);
    kiln_oai_error oe;
    if (!kiln_oai_parse(KILN_OAI_COMPLETION, body, strlen(body), kiln_model_n_vocab(m), p, &oe))
        fail_msg("parse: %s", oe.message);
    int32_t prompt[3] = {1, 2, 3};
    kiln_srv_req *r;
    assert_int_equal(kiln_srv_req_create(p, prompt, 3, 6, 1, &r, &err), KILN_OK);
    int http = 0, retry = 0;
    assert_int_equal(kiln_srv_submit(l, r, &http, &retry, &err), KILN_OK);
    /* the client is gone: its request is freed and the memory reused */
    kiln_oai_req_free(p);
    memset(p, 0x7f, sizeof *p);
    free(p);
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
    kiln_srv_lock(l);
    assert_int_equal(r->state, 3);
    assert_int_equal(r->err_code, KILN_OK);
    /* (the loop hands the scheduler copies of the stop strings and the logit bias at
     * submit; r->p is the submitter's and is not read after kiln_srv_submit) */
    assert_int_equal(r->ch[0].n_ids, 6);
    for (size_t i = 0; i < r->ch[0].n_ids; i++) assert_int_equal(r->ch[0].ids[i], 7);
    kiln_srv_unlock(l);
    kiln_srv_req_release(l, r);
    kiln_srv_loop_free(l);
    kiln_engine_free(e);
    kiln_model_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_submitter_frees_first)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
