/* test_sched_sim.c — randomized simulation of the scheduler over a fake engine
 * (test_sched_fake.h): thousands of steps with random arrivals from five tenants (QoS
 * classes, slot / KV / context / token-rate quotas, a shared isolation group, shared
 * prompt prefixes), random cancels, sinks that block (backpressure) or disconnect, and
 * a KV pool small enough to force prefix-cache eviction and preemption. After every
 * step: kiln_sched_check (slots, blocks, refcounts, entry users, quotas) and "nothing
 * admittable is left waiting". Every request must end exactly once, with a reason, and
 * its tokens must be exactly the greedy chain of its prompt (nothing lost or duplicated
 * across preemption, no foreign prefix block). At the end every block is free. */
#include "testutil.h"

#include "base/timer.h"
#include "sched/sched_impl.h"
#include "test_sched_fake.h"

#include <time.h>

#define NV     64
#define MAXREQ 20000

typedef struct rec {
    uint64_t id;
    int32_t tenant;
    int32_t prompt[128];
    int32_t n_prompt, max_tokens, stop_tok;
    int32_t got[256];
    int32_t n_got;
    int finals;
    kiln_finish fin;
    bool parked, test_cancel;
    int32_t park_steps;
    int32_t n_cached;
} rec;

static rec *R;
static int32_t n_rec;
static kt_rng rng;
static uint64_t gen_by_tenant[8];

static kiln_sink_result sink(void *user, const kiln_token_event *ev) {
    rec *r = user;
    assert_int_equal(r->finals, 0); /* nothing after the final event */
    assert_int_equal(ev->request_id, r->id);
    if (ev->token >= 0) {
        assert_true(r->n_got < 256);
        r->got[r->n_got++] = ev->token;
        gen_by_tenant[r->tenant]++;
    }
    r->n_cached = ev->n_cached;
    if (ev->finish != KILN_FINISH_NONE) {
        r->finals++;
        r->fin = ev->finish;
        return KILN_SINK_OK;
    }
    uint64_t x = kt_rng_u64(&rng) % 1000;
    if (x < 20) {
        r->parked = true;
        r->park_steps = 1 + (int32_t)(kt_rng_u64(&rng) % 6);
        return KILN_SINK_WOULD_BLOCK;
    }
    if (x < 22) return KILN_SINK_CLOSED;
    return KILN_SINK_OK;
}

static void check_tokens(const rec *r) {
    int32_t exp[256];
    fake_expect(r->prompt, r->n_prompt, r->max_tokens, NV, exp);
    for (int32_t i = 0; i < r->n_got; i++) {
        if (r->got[i] != exp[i])
            fail_msg("request %llu (tenant %d): token %d is %d, expected %d (got %d tokens, "
                     "reason %s)",
                     (unsigned long long)r->id, r->tenant, i, r->got[i], exp[i], r->n_got,
                     kiln_finish_name(r->fin));
        if (r->got[i] == r->stop_tok && i + 1 < r->n_got)
            fail_msg("request %llu: tokens after its stop token", (unsigned long long)r->id);
    }
    switch (r->fin) {
    case KILN_FINISH_LENGTH:
        assert_int_equal(r->n_got, r->max_tokens);
        break;
    case KILN_FINISH_STOP:
        assert_true(r->n_got >= 1);
        assert_int_equal(r->got[r->n_got - 1], r->stop_tok);
        break;
    case KILN_FINISH_CANCELLED:
        assert_true(r->test_cancel);
        break;
    case KILN_FINISH_DISCONNECTED:
        break;
    default:
        fail_msg("request %llu ended with '%s'", (unsigned long long)r->id,
                 kiln_finish_name(r->fin));
    }
}

static void run_sim(uint64_t seed, int32_t blocks, bool want_recompute) {
    R = calloc(MAXREQ, sizeof(rec));
    n_rec = 0;
    kt_rng_seed(&rng, seed);
    memset(gen_by_tenant, 0, sizeof(gen_by_tenant));
    fake_engine fe;
    kiln_sched_engine se;
    fake_init(&fe, &se, NV, 16, 64, blocks);
    kiln_sched_opts o;
    kiln_sched_opts_default(&o);
    o.max_slots = 12;
    o.step_tokens = 64;
    o.latency_step_tokens = 32;
    o.max_queued = 300;
    o.park_max_ms = 600000;
    kiln_sched *s = NULL;
    kiln_err err;
    assert_int_equal(kiln_sched_create_with(&se, NULL, &o, &s, &err), KILN_OK);
    const char *ids[5] = {"ia", "ib", "std", "bat", "rate"};
    kiln_tenant_config tc[5];
    for (int i = 0; i < 5; i++) {
        kiln_tenant_config_default(&tc[i]);
        tc[i].id = ids[i];
    }
    tc[0].qos = tc[1].qos = KILN_QOS_INTERACTIVE;
    tc[0].max_slots = 4;
    tc[0].isolation_group = tc[1].isolation_group = "g1";
    tc[1].max_kv_blocks = 40;
    tc[2].max_slots = 6;
    tc[2].max_kv_blocks = 60;
    tc[2].max_context = 150;
    tc[3].qos = KILN_QOS_BATCH;
    tc[4].decode_tokens_per_s = 3000;
    tc[4].prefill_tokens_per_s = 20000;
    tc[4].max_queued = 20;
    for (int i = 0; i < 5; i++) assert_int_equal(kiln_sched_add_tenant(s, &tc[i], &err), KILN_OK);
    /* shared prefixes: one set for group g1, one per other tenant */
    int32_t pre[5][48];
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 48; j++) pre[i][j] = (int32_t)(kt_rng_u64(&rng) % NV);
    memcpy(pre[1], pre[0], sizeof(pre[0]));
    memcpy(pre[2], pre[0], sizeof(pre[0])); /* same tokens, other scope: must not be shared */
    const uint64_t t_start = kiln_now_ns();
    long rejected = 0, preempt_seen = 0, steps = 0;
    char msg[512];
    for (int step = 0; step < 400000; step++) {
        bool arrivals = step < 4000;
        int na = arrivals && kt_rng_u64(&rng) % 10 < 4 ? 1 + (int)(kt_rng_u64(&rng) % 3) : 0;
        for (int a = 0; a < na && n_rec < MAXREQ; a++) {
            rec *r = &R[n_rec];
            memset(r, 0, sizeof(*r));
            r->tenant = (int32_t)(kt_rng_u64(&rng) % 5);
            int32_t np = (int32_t)(kt_rng_u64(&rng) % 3);
            int32_t npre = np == 0 ? 0 : np == 1 ? 16 : 40;
            int32_t nsuf = 1 + (int32_t)(kt_rng_u64(&rng) % 40);
            memcpy(r->prompt, pre[r->tenant], (size_t)npre * sizeof(int32_t));
            for (int32_t j = 0; j < nsuf; j++)
                r->prompt[npre + j] = (int32_t)(kt_rng_u64(&rng) % NV);
            r->n_prompt = npre + nsuf;
            r->max_tokens = 1 + (int32_t)(kt_rng_u64(&rng) % 60);
            r->stop_tok = kt_rng_u64(&rng) % 4 == 0 ? (int32_t)(kt_rng_u64(&rng) % NV) : -1;
            kiln_request_params p;
            kiln_request_params_default(&p);
            p.tenant = ids[r->tenant];
            p.prompt = r->prompt;
            p.n_prompt = r->n_prompt;
            p.max_tokens = r->max_tokens;
            p.sampling.temperature = kt_rng_u64(&rng) % 3 == 0 ? 0.0f : -1.0f; /* both greedy */
            p.sampling.top_k = 0;
            if (kt_rng_u64(&rng) % 5 == 0) p.sampling.temperature = 0; /* logits path below */
            p.logprobs = kt_rng_u64(&rng) % 7 == 0;
            p.stop_tokens = &r->stop_tok;
            p.n_stop_tokens = r->stop_tok >= 0;
            p.sink = sink;
            p.user = r;
            kiln_rejection rej;
            kiln_status st = kiln_sched_submit(s, &p, &r->id, &rej, &err);
            if (st) {
                rejected++;
                assert_true(rej.http_status == 400 || rej.http_status == 429 ||
                            rej.http_status == 503);
                if (rej.http_status != 400) assert_true(rej.retry_after_s > 0);
                assert_true(rej.message[0] != 0);
                continue;
            }
            n_rec++;
        }
        /* random cancels of live requests */
        if (n_rec && kt_rng_u64(&rng) % 50 == 0) {
            rec *r = &R[kt_rng_u64(&rng) % (uint64_t)n_rec];
            if (!r->finals) {
                r->test_cancel = true;
                kiln_sched_cancel(s, r->id);
            }
        }
        /* blocked sinks resume after a few steps */
        for (int32_t i = 0; i < n_rec; i++)
            if (R[i].parked && !R[i].finals && --R[i].park_steps <= 0) {
                R[i].parked = false;
                kiln_sched_resume(s, R[i].id);
            }
        bool worked;
        assert_int_equal(kiln_sched_step(s, &worked, &err), KILN_OK);
        if (!worked && !arrivals) {
            struct timespec ts = {0, 200000}; /* rate quotas: let time pass */
            nanosleep(&ts, NULL);
        }
        steps++;
        if (!kiln_sched_check(s, msg, sizeof(msg))) fail_msg("step %d: %s", step, msg);
        if (kiln_sched_admittable(s, msg, sizeof(msg))) fail_msg("step %d: %s", step, msg);
        if (fe.shared_writes) fail_msg("step %d: %s", step, fe.last_error);
        bool all_done = !arrivals;
        for (int32_t i = 0; i < n_rec && all_done; i++) all_done = R[i].finals > 0;
        if (all_done) break;
    }
    kiln_sched_stats stt;
    kiln_sched_stats_get(s, &stt);
    preempt_seen = (long)(stt.preempt_kept + stt.preempt_recompute);
    /* quotas over the run: token rates */
    double el = (double)(kiln_now_ns() - t_start) * 1e-9;
    if ((double)gen_by_tenant[4] > 3000 * el + 3000 + 1)
        fail_msg("tenant 'rate': %llu tokens in %.3f s at 3000/s",
                 (unsigned long long)gen_by_tenant[4], el);
    long done = 0, hits = 0;
    for (int32_t i = 0; i < n_rec; i++) {
        if (R[i].finals != 1) {
            for (int32_t q = 0; q < s->max_slots; q++)
                if (s->slots[q])
                    print_message("slot %d: id %llu tenant %d n_kv %d n_tok %d parked %d\n", q,
                                  (unsigned long long)s->slots[q]->id, s->slots[q]->ti,
                                  s->slots[q]->n_kv, s->slots[q]->n_tok, s->slots[q]->parked);
            for (int32_t q = 0; q < s->n_t; q++)
                print_message("tenant %d: wait %d slots %d kv %lld\n", q, s->t[q].n_wait,
                              s->t[q].slots_used, (long long)s->t[q].kv_reserved);
            print_message("rec tenant %d parked %d n_got %d\n", R[i].tenant, R[i].parked,
                          R[i].n_got);
        }
        if (R[i].finals != 1)
            fail_msg("request %llu ended %d times", (unsigned long long)R[i].id, R[i].finals);
        check_tokens(&R[i]);
        done++;
        hits += R[i].n_cached > 0;
    }
    print_message("sim: %ld steps, %ld requests, %ld rejected, %ld preemptions (%llu kept), "
                  "%ld prefix hits, %ld engine steps, %.2f s\n",
                  steps, done, rejected, preempt_seen, (unsigned long long)stt.preempt_kept, hits,
                  fe.steps, el);
    assert_true(done > 1000);
    assert_true(preempt_seen > 0);
    if (want_recompute) assert_true(stt.preempt_recompute > 0);
    assert_true(hits > 0);
    kiln_sched_free(s);
    assert_int_equal(fake_used(&fe), 0);
    for (int32_t i = 0; i < fe.max_seqs; i++) assert_int_equal(fe.seqs[i].used, 0);
    fake_free(&fe);
    free(R);
}

/* a roomy pool: preempted requests keep their blocks */
static void sim_roomy(void **state) {
    (void)state;
    run_sim(1234, 160, false);
}

/* a tight pool: prefix eviction, dropped pins, recompute after preemption */
static void sim_tight(void **state) {
    (void)state;
    run_sim(99, 56, true);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(sim_roomy), cmocka_unit_test(sim_tight)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
