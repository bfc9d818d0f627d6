/* test_sched.c — the scheduler's API over the fake engine (test_sched_fake.h):
 * kiln.yaml tenants (and that the kernel-policy parser ignores them), rejections with
 * their HTTP status / retry-after, quotas holding with 1000 queued requests, cancel
 * freeing a slot within one step, backpressure (park, resume, timeout), disconnects,
 * interactive preemption resuming without loss, stop strings and EOS through the
 * streaming detokenizer (gpt-2 vocabulary), the thread mode with concurrent submitters,
 * and the Chrome trace. */
#include "testutil.h"

#include "kernels/policy.h"
#include "sched/sched_impl.h"
#include "test_sched_fake.h"
#include "tok/tok.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#define NV 64

typedef struct out {
    int32_t tok[512];
    int32_t n, finals, n_cached;
    kiln_finish fin;
    char text[4096];
    size_t tlen;
    kiln_sink_result answer; /* what to return for non-final events */
    int32_t events;
    char error[256];
} out;

static kiln_sink_result rec_sink(void *user, const kiln_token_event *ev) {
    out *o = user;
    assert_int_equal(o->finals, 0);
    o->events++;
    if (ev->token >= 0 && o->n < 512) o->tok[o->n++] = ev->token;
    assert_non_null(ev->text);
    if (ev->text_len && o->tlen + ev->text_len < sizeof(o->text)) {
        memcpy(o->text + o->tlen, ev->text, ev->text_len);
        o->tlen += ev->text_len;
        o->text[o->tlen] = 0;
    }
    o->n_cached = ev->n_cached;
    if (ev->finish) {
        o->finals++;
        o->fin = ev->finish;
        if (ev->error) snprintf(o->error, sizeof(o->error), "%s", ev->error);
        return KILN_SINK_OK;
    }
    return o->answer;
}

static kiln_status sub(kiln_sched *s, const char *tenant, const int32_t *p, int32_t n, int32_t max,
                       out *o, uint64_t *id, kiln_rejection *rej) {
    kiln_request_params rp;
    kiln_request_params_default(&rp);
    rp.tenant = tenant;
    rp.prompt = p;
    rp.n_prompt = n;
    rp.max_tokens = max;
    rp.sampling.temperature = 0;
    rp.sink = rec_sink;
    rp.user = o;
    kiln_err err;
    return kiln_sched_submit(s, &rp, id, rej, &err);
}

static kiln_sched *mk(fake_engine *fe, kiln_sched_engine *se, int32_t slots, int32_t blocks,
                      const kiln_vocab *v, kiln_sched_opts *o_in) {
    fake_init(fe, se, v ? (int32_t)kiln_vocab_n_tokens(v) : NV, 16, 64, blocks);
    kiln_sched_opts o;
    if (o_in)
        o = *o_in;
    else
        kiln_sched_opts_default(&o);
    o.max_slots = slots;
    kiln_sched *s = NULL;
    kiln_err err;
    if (kiln_sched_create_with(se, v, &o, &s, &err)) fail_msg("create: %s", err.msg);
    return s;
}

static void step(kiln_sched *s) {
    kiln_err err;
    char msg[512];
    bool w;
    if (kiln_sched_step(s, &w, &err)) fail_msg("step: %s", err.msg);
    if (!kiln_sched_check(s, msg, sizeof(msg))) fail_msg("%s", msg);
}

static void done(kiln_sched *s, fake_engine *fe) {
    kiln_sched_free(s);
    assert_int_equal(fake_used(fe), 0);
    fake_free(fe);
}

/* ---- kiln.yaml ---- */

static void yaml_tenants(void **st) {
    (void)st;
    const char *y = "version: 1\n"
                    "strict: false\n"
                    "tenants:\n"
                    "  - id: alice\n"
                    "    api_keys: [sk-alice-1, sk-alice-2]\n"
                    "    qos: interactive\n"
                    "    max_slots: 4\n"
                    "    max_kv_blocks: 4096\n"
                    "    decode_tokens_per_s: 1000\n"
                    "    prefill_tokens_per_s: 100000\n"
                    "    max_context: 8192\n"
                    "    isolation_group: team-a\n"
                    "  - id: bob\n"
                    "    qos: batch\n";
    kiln_tenant_list l;
    kiln_err err;
    assert_int_equal(kiln_tenants_parse_yaml(y, strlen(y), "k.yaml", &l, &err), KILN_OK);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.items[0].id, "alice");
    assert_int_equal(l.items[0].n_api_keys, 2);
    assert_string_equal(l.items[0].api_keys[1], "sk-alice-2");
    assert_int_equal(l.items[0].qos, KILN_QOS_INTERACTIVE);
    assert_int_equal(l.items[0].max_slots, 4);
    assert_int_equal(l.items[0].max_kv_blocks, 4096);
    assert_true(l.items[0].decode_tokens_per_s == 1000);
    assert_true(l.items[0].prefill_tokens_per_s == 100000);
    assert_int_equal(l.items[0].max_context, 8192);
    assert_string_equal(l.items[0].isolation_group, "team-a");
    assert_int_equal(l.items[1].qos, KILN_QOS_BATCH);
    assert_int_equal(l.items[1].max_slots, 0);
    /* the scheduler takes them; keys map to tenants */
    fake_engine fe;
    kiln_sched_engine se;
    kiln_sched *s = mk(&fe, &se, 4, 64, NULL, NULL);
    assert_int_equal(kiln_sched_add_tenants(s, &l, &err), KILN_OK);
    char id[65];
    assert_true(kiln_sched_tenant_by_key(s, "sk-alice-2", id, sizeof(id)));
    assert_string_equal(id, "alice");
    assert_false(kiln_sched_tenant_by_key(s, "sk-nobody", id, sizeof(id)));
    assert_int_equal(kiln_sched_add_tenants(s, &l, &err), KILN_ERR_INVALID_ARG); /* duplicate */
    kiln_tenant_list_free(&l);
    /* through the C API too: a key a client cannot send is refused, naming the tenant */
    {
        kiln_tenant_config c;
        kiln_tenant_config_default(&c);
        const char *keys[2] = {"sk-carol", "sk carol"};
        c.id = "carol";
        c.api_keys = keys;
        c.n_api_keys = 2;
        kiln_err_clear(&err);
        assert_int_equal(kiln_sched_add_tenant(s, &c, &err), KILN_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "tenant 'carol': API key 1"));
        assert_false(kiln_sched_tenant_by_key(s, "sk-carol", id, sizeof(id)));
        c.n_api_keys = 1;
        assert_int_equal(kiln_sched_add_tenant(s, &c, &err), KILN_OK);
        assert_true(kiln_sched_tenant_by_key(s, "sk-carol", id, sizeof(id)));
        assert_string_equal(id, "carol");
    }
    /* the kernel-policy parser accepts (ignores) the tenants key */
    kiln_policy p;
    kiln_policy_init(&p);
    assert_int_equal(kiln_policy_parse(&p, y, strlen(y), "k.yaml", &err), KILN_OK);
    done(s, &fe);

    struct {
        const char *text, *want;
    } bad[] = {
        {"tenants:\n  - id: a\n    qos: urgent\n", "k.yaml:3: tenant 'a': qos 'urgent'"},
        {"tenants:\n  - id: a\n    max_slots: -1\n", "k.yaml:3: tenant 'a': 'max_slots' is -1"},
        {"tenants:\n  - id: a\n    colour: red\n", "k.yaml:3: tenant 'a': unknown key 'colour'"},
        {"tenants:\n  - id: a\n  - id: a\n", "duplicate tenant id 'a'"},
        {"tenants:\n  - qos: batch\n", "a tenant without 'id'"},
        {"tenants: 5\n", "'tenants' must be a list"},
        {"tenants:\n  - id: a\n    max_slots: many\n", "'max_slots' must be a number"},
        {"tenants: [\n", "YAML syntax error"},
        /* keys as a client can send them (the server's rule, session 18) */
        {"tenants:\n  - id: a\n    api_keys: [\"sk a\"]\n",
         "k.yaml:3: tenant 'a': api_keys[0] must be visible ASCII"},
        {"tenants:\n  - id: a\n    api_keys: [ok, \"sk\\tb\"]\n",
         "k.yaml:3: tenant 'a': api_keys[1] must be visible ASCII"},
        {"tenants:\n  - id: a\n    api_keys: [\"sk\\0c\"]\n", "api_keys[0] must be visible ASCII"},
        {"tenants:\n  - id: a\n    api_keys: [\"clé\"]\n", "api_keys[0] must be visible ASCII"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kiln_err_clear(&err);
        assert_int_not_equal(
            kiln_tenants_parse_yaml(bad[i].text, strlen(bad[i].text), "k.yaml", &l, &err), KILN_OK);
        if (!strstr(err.msg, bad[i].want))
            fail_msg("case %zu: message '%s' lacks '%s'", i, err.msg, bad[i].want);
    }
    /* no tenants key: empty list */
    assert_int_equal(kiln_tenants_parse_yaml("strict: true\n", 13, "k.yaml", &l, &err), KILN_OK);
    assert_int_equal(l.n, 0);
    kiln_tenant_list_free(&l);
    assert_int_not_equal(kiln_tenants_load_yaml("/nonexistent/kiln.yaml", &l, &err), KILN_OK);
    assert_non_null(strstr(err.msg, "/nonexistent/kiln.yaml"));
}

/* ---- rejections ---- */

static void rejections(void **st) {
    (void)st;
    fake_engine fe;
    kiln_sched_engine se;
    kiln_sched_opts o;
    kiln_sched_opts_default(&o);
    o.max_queued = 5;
    kiln_sched *s = mk(&fe, &se, 2, 64, NULL, &o);
    kiln_tenant_config c;
    kiln_tenant_config_default(&c);
    c.id = "t";
    c.max_context = 100;
    c.max_kv_blocks = 4;
    c.max_queued = 3;
    kiln_err err;
    assert_int_equal(kiln_sched_add_tenant(s, &c, &err), KILN_OK);
    c.id = "u";
    c.max_context = 0;
    c.max_kv_blocks = 0;
    c.max_queued = 0;
    assert_int_equal(kiln_sched_add_tenant(s, &c, &err), KILN_OK);
    int32_t p[200] = {0};
    out o1 = {0};
    kiln_rejection rej;
    uint64_t id;
    /* context: 400 */
    assert_int_equal(sub(s, "t", p, 90, 20, &o1, &id, &rej), KILN_ERR_RANGE);
    assert_int_equal(rej.reason, KILN_REJECT_CONTEXT);
    assert_int_equal(rej.http_status, 400);
    assert_non_null(strstr(rej.message, "100"));
    /* engine context: 400 for any tenant */
    assert_int_equal(sub(s, "u", p, 200, 1000000, &o1, &id, &rej), KILN_ERR_RANGE);
    assert_int_equal(rej.http_status, 400);
    /* KV quota: 5 blocks worst case > 4 */
    assert_int_equal(sub(s, "t", p, 60, 20, &o1, &id, &rej), KILN_ERR_RANGE);
    assert_int_equal(rej.reason, KILN_REJECT_KV_QUOTA);
    /* unknown tenant: 404 */
    assert_int_equal(sub(s, "zed", p, 10, 5, &o1, &id, &rej), KILN_ERR_NOT_FOUND);
    assert_int_equal(rej.http_status, 404);
    /* bad token: 400 */
    int32_t badp[2] = {1, NV};
    assert_int_equal(sub(s, "t", badp, 2, 5, &o1, &id, &rej), KILN_ERR_INVALID_ARG);
    assert_int_equal(rej.http_status, 400);
    /* tenant queue (3) past the 2 free slots it may take (no step yet admitted anything):
     * 429 with retry-after */
    static out q[10];
    for (int i = 0; i < 5; i++) assert_int_equal(sub(s, "t", p, 10, 5, &q[i], &id, NULL), KILN_OK);
    assert_int_equal(sub(s, "t", p, 10, 5, &o1, &id, &rej), KILN_ERR_CAPACITY);
    assert_int_equal(rej.reason, KILN_REJECT_QUOTA);
    assert_int_equal(rej.http_status, 429);
    assert_true(rej.retry_after_s >= 1);
    /* scheduler queue (5) beyond the 2 free slots: 503 with retry-after */
    for (int i = 5; i < 7; i++) assert_int_equal(sub(s, "u", p, 10, 5, &q[i], &id, NULL), KILN_OK);
    assert_int_equal(sub(s, "u", p, 10, 5, &o1, &id, &rej), KILN_ERR_CAPACITY);
    assert_int_equal(rej.reason, KILN_REJECT_OVERLOADED);
    assert_int_equal(rej.http_status, 503);
    assert_true(rej.retry_after_s >= 1);
    kiln_tenant_usage u;
    assert_int_equal(kiln_sched_usage(s, "t", &u, &err), KILN_OK);
    assert_int_equal(u.requests_rejected, 4); /* context, KV quota, bad token, queue */
    assert_int_equal(o1.events, 0);           /* a rejected request never reaches its sink */
    for (int i = 0; i < 100; i++) step(s);
    for (int i = 0; i < 7; i++) assert_int_equal(q[i].finals, 1);
    done(s, &fe);
}

/* requests arriving together before any step: the free slots take them first, then
 * the queue (max_queued) fills, then 503 (the default tenant has no queue limit of its
 * own; it once fell back to max_queued without counting the free slots) */
static void queue_counts_free_slots(void **st) {
    (void)st;
    fake_engine fe;
    kiln_sched_engine se;
    kiln_sched_opts o;
    kiln_sched_opts_default(&o);
    o.max_queued = 2;
    kiln_sched *s = mk(&fe, &se, 4, 64, NULL, &o);
    int32_t p[4] = {0};
    static out q[7];
    uint64_t id;
    kiln_rejection rej;
    for (int i = 0; i < 6; i++) assert_int_equal(sub(s, NULL, p, 4, 5, &q[i], &id, &rej), KILN_OK);
    assert_int_equal(sub(s, NULL, p, 4, 5, &q[6], &id, &rej), KILN_ERR_CAPACITY);
    assert_int_equal(rej.http_status, 503);
    for (int i = 0; i < 100; i++) step(s);
    for (int i = 0; i < 6; i++) assert_int_equal(q[i].finals, 1);
    assert_int_equal(q[6].events, 0);
    done(s, &fe);
}

/* The same for a tenant with a queue limit of its own: it counts past the free slots the
 * tenant may take (its slot quota, where it has one). kiln serve gives every tenant one
 * (--queue + 1), and a burst on an idle server got 429 with slots free (test_serve_http:
 * six streams to 4 slots and a queue of 2, the 4th refused). */
static void tenant_queue_counts_free_slots(void **st) {
    (void)st;
    fake_engine fe;
    kiln_sched_engine se;
    kiln_sched_opts o;
    kiln_sched_opts_default(&o);
    kiln_sched *s = mk(&fe, &se, 4, 64, NULL, &o);
    kiln_tenant_config c;
    kiln_tenant_config_default(&c);
    c.id = "t";
    c.max_queued = 1;
    c.max_slots = 2; /* of the 4 free slots it may take 2 */
    kiln_err err;
    assert_int_equal(kiln_sched_add_tenant(s, &c, &err), KILN_OK);
    int32_t p[4] = {0};
    static out q[4];
    uint64_t id;
    kiln_rejection rej;
    for (int i = 0; i < 3; i++) assert_int_equal(sub(s, "t", p, 4, 5, &q[i], &id, &rej), KILN_OK);
    assert_int_equal(sub(s, "t", p, 4, 5, &q[3], &id, &rej), KILN_ERR_CAPACITY);
    assert_int_equal(rej.http_status, 429);
    for (int i = 0; i < 100; i++) step(s);
    for (int i = 0; i < 3; i++) assert_int_equal(q[i].finals, 1);
    assert_int_equal(q[3].events, 0);
    done(s, &fe);
}

/* ---- quotas with 1000 queued ---- */

static void quotas_1000(void **st) {
    (void)st;
    fake_engine fe;
    kiln_sched_engine se;
    kiln_sched_opts o;
    kiln_sched_opts_default(&o);
    o.max_queued = 2000;
    kiln_sched *s = mk(&fe, &se, 8, 400, NULL, &o);
    kiln_tenant_config c;
    kiln_tenant_config_default(&c);
    c.id = "small";
    c.max_slots = 3;
    c.max_kv_blocks = 10;
    kiln_err err;
    assert_int_equal(kiln_sched_add_tenant(s, &c, &err), KILN_OK);
    c.id = "big";
    c.max_slots = 0;
    c.max_kv_blocks = 0;
    assert_int_equal(kiln_sched_add_tenant(s, &c, &err), KILN_OK);
    static out outs[1100];
    static int32_t prompts[1100][20];
    for (int i = 0; i < 1100; i++) {
        for (int j = 0; j < 20; j++) prompts[i][j] = (i * 13 + j * 7) % NV;
        assert_int_equal(
            sub(s, i < 1000 ? "small" : "big", prompts[i], 20, 8, &outs[i], NULL, NULL), KILN_OK);
    }
    int steps = 0;
    for (; steps < 100000; steps++) {
        step(s);
        kiln_tenant_usage u;
        assert_int_equal(kiln_sched_usage(s, "small", &u, &err), KILN_OK);
        assert_true(u.slots_active <= 3);
        assert_true(s->t[0].kv_reserved <= 10); /* two requests' worst case: 2 x 2 blocks */
        if (u.requests_finished == 1000) break;
    }
    kiln_tenant_usage u, b;
    assert_int_equal(kiln_sched_usage(s, "small", &u, &err), KILN_OK);
    assert_int_equal(kiln_sched_usage(s, "big", &b, &err), KILN_OK);
    assert_int_equal(u.requests_finished, 1000);
    assert_int_equal(u.slots_peak, 3);
    assert_int_equal(u.tokens_generated, 8000);
    assert_int_equal(b.requests_finished, 100);
    assert_true(b.slots_peak >= 4); /* the other tenant used the rest of the slots */
    for (int i = 0; i < 1100; i++) {
        assert_int_equal(outs[i].finals, 1);
        assert_int_equal(outs[i].fin, KILN_FINISH_LENGTH);
        int32_t exp[8];
        fake_expect(prompts[i], 20, 8, NV, exp);
        assert_memory_equal(outs[i].tok, exp, sizeof(exp));
    }
    done(s, &fe);
}

/* ---- cancel, backpressure, disconnect ---- */

/* on_step_end: called once per step that did work, after that step's sink calls (the
 * server batches its stream wakes on it), not for an idle step, and once after the
 * shutdown's final events. */
typedef struct hook_rec {
    int calls;
    int32_t tokens_at_call, finals_at_call;
    const out *o;
} hook_rec;

static void step_end_rec(void *user) {
    hook_rec *h = user;
    h->calls++;
    h->tokens_at_call = h->o->n;
    h->finals_at_call = h->o->finals;
}

static void step_end_hook(void **st) {
    (void)st;
    fake_engine fe;
    kiln_sched_engine se;
    out a = {0}, b = {0};
    hook_rec h = {.o = &a};
    kiln_sched_opts o;
    kiln_sched_opts_default(&o);
    o.on_step_end = step_end_rec;
    o.step_end_user = &h;
    kiln_sched *s = mk(&fe, &se, 2, 64, NULL, &o);
    step(s); /* nothing to do */
    assert_int_equal(h.calls, 0);
    int32_t p[4] = {1, 2, 3, 4};
    assert_int_equal(sub(s, NULL, p, 4, 100, &a, NULL, NULL), KILN_OK);
    assert_int_equal(sub(s, NULL, p, 4, 100, &b, NULL, NULL), KILN_OK);
    for (int i = 0; i < 6; i++) {
        const int32_t before = a.n;
        step(s);
        assert_int_equal(h.calls, i + 1);
        assert_true(a.n > before);               /* the step fed a */
        assert_int_equal(h.tokens_at_call, a.n); /* ... before the hook ran */
    }
    assert_int_equal(a.finals, 0);
    const int calls = h.calls;
    done(s, &fe); /* shutdown: both end, then one more call */
    assert_int_equal(a.finals, 1);
    assert_int_equal(b.finals, 1);
    assert_int_equal(a.fin, KILN_FINISH_SHUTDOWN);
    assert_int_equal(h.calls, calls + 1);
    assert_int_equal(h.finals_at_call, 1);
}

static void cancel_one_step(void **st) {
    (void)st;
    fake_engine fe;
    kiln_sched_engine se;
    kiln_sched *s = mk(&fe, &se, 2, 64, NULL, NULL);
    int32_t p[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    out a = {0}, b = {0}, c = {0};
    uint64_t ida, idb, idc;
    assert_int_equal(sub(s, NULL, p, 10, 200, &a, &ida, NULL), KILN_OK);
    assert_int_equal(sub(s, NULL, p, 10, 200, &b, &idb, NULL), KILN_OK);
    assert_int_equal(sub(s, NULL, p, 10, 200, &c, &idc, NULL), KILN_OK);
    step(s);
    step(s);
    kiln_sched_stats stt;
    kiln_sched_stats_get(s, &stt);
    assert_int_equal(stt.slots_active, 2);
    assert_int_equal(stt.requests_queued, 1);
    assert_int_equal(c.n, 0);
    assert_true(kiln_sched_cancel(s, ida));
    step(s); /* one step: a ends, c takes its slot and gets its first token */
    assert_int_equal(a.finals, 1);
    assert_int_equal(a.fin, KILN_FINISH_CANCELLED);
    kiln_sched_stats_get(s, &stt);
    assert_int_equal(stt.slots_active, 2);
    assert_int_equal(stt.requests_queued, 0);
    assert_false(kiln_sched_cancel(s, ida)); /* finished: no-op */
    step(s);
    assert_true(c.n >= 1);
    /* disconnect: the sink says CLOSED */
    b.answer = KILN_SINK_CLOSED;
    step(s);
    assert_int_equal(b.finals, 1);
    assert_int_equal(b.fin, KILN_FINISH_DISCONNECTED);
    kiln_tenant_usage u;
    kiln_err err;
    assert_int_equal(kiln_sched_usage(s, NULL, &u, &err), KILN_OK);
    assert_int_equal(u.requests_cancelled, 2);
    /* cancel while queued */
    out d = {0}, e = {0};
    uint64_t idd, ide;
    assert_int_equal(sub(s, NULL, p, 10, 200, &d, &idd, NULL), KILN_OK);
    assert_int_equal(sub(s, NULL, p, 10, 200, &e, &ide, NULL), KILN_OK);
    step(s);
    assert_true(kiln_sched_cancel(s, ide));
    step(s);
    assert_int_equal(e.finals, 1);
    assert_int_equal(e.n, 0);
    assert_int_equal(e.fin, KILN_FINISH_CANCELLED);
    done(s, &fe);
    assert_int_equal(c.finals, 1);
    assert_int_equal(c.fin, KILN_FINISH_SHUTDOWN);
    assert_int_equal(d.fin, KILN_FINISH_SHUTDOWN);
}

static void backpressure(void **st) {
    (void)st;
    fake_engine fe;
    kiln_sched_engine se;
    kiln_sched_opts o;
    kiln_sched_opts_default(&o);
    o.park_max_ms = 30;
    kiln_sched *s = mk(&fe, &se, 2, 64, NULL, &o);
    int32_t p[5] = {1, 2, 3, 4, 5};
    out a = {0}, b = {0};
    uint64_t ida, idb;
    assert_int_equal(sub(s, NULL, p, 5, 100, &a, &ida, NULL), KILN_OK);
    assert_int_equal(sub(s, NULL, p, 5, 100, &b, &idb, NULL), KILN_OK);
    a.answer = KILN_SINK_WOULD_BLOCK;
    step(s);
    assert_int_equal(a.n, 1);
    for (int i = 0; i < 5; i++) step(s);
    assert_int_equal(a.n, 1); /* parked: no tokens */
    assert_int_equal(b.n, 6); /* the other keeps going */
    a.answer = KILN_SINK_OK;
    kiln_sched_resume(s, ida);
    step(s);
    step(s);
    assert_int_equal(a.n, 3);
    int32_t exp[3];
    fake_expect(p, 5, 3, NV, exp);
    assert_memory_equal(a.tok, exp, sizeof(exp));
    /* parked past park_max_ms: error */
    a.answer = KILN_SINK_WOULD_BLOCK;
    step(s);
    usleep(40000);
    step(s);
    assert_int_equal(a.finals, 1);
    assert_int_equal(a.fin, KILN_FINISH_ERROR);
    assert_non_null(strstr(a.error, "backpressure"));
    done(s, &fe);
}

/* ---- preemption ---- */

static void preemption(void **st) {
    (void)st;
    fake_engine fe;
    kiln_sched_engine se;
    kiln_sched *s = mk(&fe, &se, 2, 64, NULL, NULL);
    kiln_tenant_config c;
    kiln_err err;
    const char *ids[3] = {"batchy", "std", "inter"};
    kiln_qos q[3] = {KILN_QOS_BATCH, KILN_QOS_STANDARD, KILN_QOS_INTERACTIVE};
    for (int i = 0; i < 3; i++) {
        kiln_tenant_config_default(&c);
        c.id = ids[i];
        c.qos = q[i];
        assert_int_equal(kiln_sched_add_tenant(s, &c, &err), KILN_OK);
    }
    int32_t p[40];
    for (int i = 0; i < 40; i++) p[i] = (i * 5 + 1) % NV;
    out b = {0}, sd = {0}, in1 = {0}, in2 = {0};
    assert_int_equal(sub(s, "batchy", p, 40, 30, &b, NULL, NULL), KILN_OK);
    assert_int_equal(sub(s, "std", p + 1, 39, 30, &sd, NULL, NULL), KILN_OK);
    for (int i = 0; i < 5; i++) step(s);
    assert_true(b.n > 0 && sd.n > 0);
    assert_int_equal(sub(s, "inter", p + 2, 38, 5, &in1, NULL, NULL), KILN_OK);
    step(s);
    kiln_tenant_usage u;
    assert_int_equal(kiln_sched_usage(s, "batchy", &u, &err), KILN_OK);
    assert_int_equal(u.requests_preempted, 1); /* batch goes first */
    assert_int_equal(kiln_sched_usage(s, "std", &u, &err), KILN_OK);
    assert_int_equal(u.requests_preempted, 0);
    assert_int_equal(sub(s, "inter", p + 3, 37, 5, &in2, NULL, NULL), KILN_OK);
    step(s);
    assert_int_equal(kiln_sched_usage(s, "std", &u, &err), KILN_OK);
    assert_int_equal(u.requests_preempted, 1); /* then standard */
    for (int i = 0; i < 200; i++) step(s);
    out *all[4] = {&b, &sd, &in1, &in2};
    int32_t off[4] = {0, 1, 2, 3}, mx[4] = {30, 30, 5, 5};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(all[k]->finals, 1);
        assert_int_equal(all[k]->fin, KILN_FINISH_LENGTH);
        int32_t exp[30];
        fake_expect(p + off[k], 40 - off[k], mx[k], NV, exp);
        assert_int_equal(all[k]->n, mx[k]);
        assert_memory_equal(all[k]->tok, exp, (size_t)mx[k] * sizeof(int32_t));
    }
    kiln_sched_stats stt;
    kiln_sched_stats_get(s, &stt);
    assert_int_equal(stt.preempt_kept + stt.preempt_recompute, 2);
    done(s, &fe);
}

/* ---- text: stop strings and EOS through the detokenizer ---- */

static void text_stops(void **st) {
    (void)st;
    char path[1024];
    snprintf(path, sizeof(path), "%s/testdata/tokenizer/ggml-vocab-gpt-2.gguf", kt_shared_dir());
    kiln_vocab *v = NULL;
    kiln_err err;
    if (kiln_vocab_load_gguf(path, &v, &err)) fail_msg("%s", err.msg);
    const char *txt = "Hello world, this is a test. STOP here and more text";
    kiln_tokens t = {0};
    assert_int_equal(kiln_tokenize(v, txt, strlen(txt), 0, &t, &err), KILN_OK);
    int32_t script[64];
    int32_t n = (int32_t)t.n;
    memcpy(script, t.ids, (size_t)n * sizeof(int32_t));
    fake_engine fe;
    kiln_sched_engine se;
    kiln_sched *s = mk(&fe, &se, 2, 64, v, NULL);
    fe.script = script;
    fe.n_script = n;
    kiln_request_params rp;
    kiln_request_params_default(&rp);
    rp.prompt = script;
    rp.n_prompt = 2;
    rp.max_tokens = 40;
    rp.sampling.temperature = 0;
    const char *stops[1] = {"STOP"};
    rp.stop = stops;
    rp.n_stop = 1;
    rp.sink = rec_sink;
    out a = {0};
    rp.user = &a;
    assert_int_equal(kiln_sched_submit(s, &rp, NULL, NULL, &err), KILN_OK);
    for (int i = 0; i < 50; i++) step(s);
    assert_int_equal(a.finals, 1);
    assert_int_equal(a.fin, KILN_FINISH_STOP);
    assert_string_equal(a.text, ", this is a test. ");
    /* EOS ends it (gpt-2: 50256), not shown as text; max_tokens otherwise */
    script[n] = 50256;
    fe.n_script = n + 1;
    out b = {0};
    rp.n_stop = 0;
    rp.user = &b;
    rp.max_tokens = 100;
    assert_int_equal(kiln_sched_submit(s, &rp, NULL, NULL, &err), KILN_OK);
    for (int i = 0; i < 50; i++) step(s);
    assert_int_equal(b.fin, KILN_FINISH_STOP);
    assert_string_equal(b.text, ", this is a test. STOP here and more text");
    out c = {0};
    rp.user = &c;
    rp.max_tokens = 3;
    rp.logprobs = true;
    rp.top_logprobs = 2;
    assert_int_equal(kiln_sched_submit(s, &rp, NULL, NULL, &err), KILN_OK);
    for (int i = 0; i < 10; i++) step(s);
    assert_int_equal(c.fin, KILN_FINISH_LENGTH);
    assert_int_equal(c.n, 3);
    done(s, &fe);
    kiln_tokens_free(&t);
    kiln_vocab_free(v);
}

/* ---- the thread mode ---- */

typedef struct tctx {
    kiln_sched *s;
    int base;
} tctx;

static out T_out[400];
static atomic_int T_finals;

static kiln_sink_result thr_sink(void *user, const kiln_token_event *ev) {
    out *o = user;
    if (ev->token >= 0 && o->n < 512) o->tok[o->n++] = ev->token;
    if (ev->finish) {
        o->fin = ev->finish;
        o->finals++;
        atomic_fetch_add(&T_finals, 1);
    }
    return KILN_SINK_OK;
}

static void *submitter(void *arg) {
    tctx *c = arg;
    static const int32_t p[12] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
    for (int i = 0; i < 100; i++) {
        kiln_request_params rp;
        kiln_request_params_default(&rp);
        rp.prompt = p;
        rp.n_prompt = 12;
        rp.max_tokens = 1 + i % 7;
        rp.sampling.temperature = 0;
        rp.sink = thr_sink;
        rp.user = &T_out[c->base + i];
        uint64_t id = 0;
        kiln_err err;
        if (kiln_sched_submit(c->s, &rp, &id, NULL, &err) == KILN_OK && i % 10 == 0)
            kiln_sched_cancel(c->s, id);
    }
    return NULL;
}

static void thread_mode(void **st) {
    (void)st;
    fake_engine fe;
    kiln_sched_engine se;
    kiln_sched *s = mk(&fe, &se, 8, 128, NULL, NULL);
    memset(T_out, 0, sizeof(T_out));
    atomic_store(&T_finals, 0);
    kiln_err err;
    assert_int_equal(kiln_sched_start(s, &err), KILN_OK);
    assert_int_equal(kiln_sched_start(s, &err), KILN_ERR_STATE);
    bool w;
    assert_int_equal(kiln_sched_step(s, &w, &err), KILN_ERR_STATE);
    pthread_t th[4];
    tctx c[4];
    for (int i = 0; i < 4; i++) {
        c[i] = (tctx){s, i * 100};
        pthread_create(&th[i], NULL, submitter, &c[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 30000 && atomic_load(&T_finals) < 400; i++) usleep(1000);
    assert_int_equal(atomic_load(&T_finals), 400);
    kiln_sched_stop(s);
    static const int32_t p[12] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
    int32_t exp[8];
    fake_expect(p, 12, 7, NV, exp);
    int cancelled = 0;
    for (int i = 0; i < 400; i++) {
        assert_int_equal(T_out[i].finals, 1);
        if (T_out[i].fin == KILN_FINISH_CANCELLED) {
            cancelled++;
            continue;
        }
        assert_int_equal(T_out[i].fin, KILN_FINISH_LENGTH);
        assert_int_equal(T_out[i].n, 1 + (i % 100) % 7);
        assert_memory_equal(T_out[i].tok, exp, (size_t)T_out[i].n * sizeof(int32_t));
    }
    assert_true(cancelled <= 40);
    done(s, &fe);
}

/* ---- trace ---- */

static void trace_file(void **st) {
    (void)st;
    char path[] = "/tmp/kiln_sched_traceXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    fake_engine fe;
    kiln_sched_engine se;
    kiln_sched_opts o;
    kiln_sched_opts_default(&o);
    o.trace_path = path;
    kiln_sched *s = mk(&fe, &se, 1, 64, NULL, &o);
    kiln_tenant_config c;
    kiln_err err;
    kiln_tenant_config_default(&c);
    c.id = "b";
    c.qos = KILN_QOS_BATCH;
    assert_int_equal(kiln_sched_add_tenant(s, &c, &err), KILN_OK);
    c.id = "i";
    c.qos = KILN_QOS_INTERACTIVE;
    assert_int_equal(kiln_sched_add_tenant(s, &c, &err), KILN_OK);
    int32_t p[20] = {0};
    out a = {0}, b = {0};
    assert_int_equal(sub(s, "b", p, 20, 10, &a, NULL, NULL), KILN_OK);
    step(s);
    step(s);
    assert_int_equal(sub(s, "i", p, 20, 3, &b, NULL, NULL), KILN_OK);
    for (int i = 0; i < 30; i++) step(s);
    done(s, &fe);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) fail_msg("trace is not JSON: %s line %d", je.text, je.line);
    assert_true(json_is_array(j));
    int steps = 0, admits = 0, preempts = 0, finishes = 0;
    for (size_t i = 0; i < json_array_size(j); i++) {
        json_t *e = json_array_get(j, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        assert_non_null(name);
        assert_non_null(json_object_get(e, "ts"));
        steps += !strcmp(name, "step");
        admits += !strcmp(name, "admit");
        preempts += !strcmp(name, "preempt");
        finishes += !strcmp(name, "finish");
        if (!strcmp(name, "step")) {
            json_t *args = json_object_get(e, "args");
            assert_true(json_integer_value(json_object_get(args, "tokens")) >= 1);
            assert_non_null(json_object_get(args, "prefill"));
            assert_non_null(json_object_get(e, "dur"));
        }
    }
    assert_true(steps >= 12);
    assert_int_equal(admits, 3); /* b, i, b again after its preemption */
    assert_int_equal(preempts, 1);
    assert_int_equal(finishes, 2);
    json_decref(j);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(yaml_tenants),
        cmocka_unit_test(rejections),
        cmocka_unit_test(queue_counts_free_slots),
        cmocka_unit_test(tenant_queue_counts_free_slots),
        cmocka_unit_test(quotas_1000),
        cmocka_unit_test(cancel_one_step),
        cmocka_unit_test(backpressure),
        cmocka_unit_test(preemption),
        cmocka_unit_test(text_stops),
        cmocka_unit_test(thread_mode),
        cmocka_unit_test(trace_file),
        cmocka_unit_test(step_end_hook),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
