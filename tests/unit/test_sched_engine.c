/* test_sched_engine.c — the scheduler over the real engine (ref and cpu backends) on a
 * synthetic model (random weights, gemma3 shapes incl. a sliding-window layer):
 *  - batch invariance: a greedy request's tokens alone == its tokens inside a mix of 64
 *    others arriving at random steps (some sampling, some sharing its prefix), and ==
 *    the engine driven directly without the scheduler;
 *  - prefix cache: a hit skips prefill and gives the same tokens; a tenant of another
 *    isolation group never hits (n_cached 0); tenants of one group do;
 *  - sessions: the next turn reuses the previous turn's blocks, same tokens as cold;
 *  - cancel frees a slot within one step. */
#include "testutil.h"

#include "model/model.h"
#include "runtime/engine.h"
#include "sched/sched_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct synth {
    kiln_model *m;
    float **bufs;
    kiln_tensor *ts;
    int n;
} synth;

static void synth_make(synth *s, uint64_t seed) {
    kiln_model_config c;
    kiln_model_config_defaults(&c);
    strcpy(c.arch, "gemma3");
    c.n_vocab = 97, c.n_embd = 32, c.n_layer = 3, c.n_head = 4, c.n_kv_head = 2, c.head_dim = 16;
    c.n_ff = 48, c.n_rot = 16, c.attn_scale = 0.25f, c.n_ctx_train = 4096;
    c.norm_eps = 1e-6f;
    for (int l = 0; l < c.n_layer; l++) c.layer_rope_base[l] = 10000, c.layer_rope_scale[l] = 1;
    c.rope_mode = 1;
    c.qk_norm = c.post_norms = true;
    c.act = 1;
    c.embed_scale = sqrtf(32);
    c.tied_embeddings = true;
    c.layer_window[0] = c.layer_window[1] = 20; /* sliding, then global */
    c.layer_rope_base[2] = 1e6f;
    kiln_plan p;
    kiln_plan_init(&p);
    assert_int_equal(kiln_decoder_compile(&c, KILN_MODE_PREFILL, &p, NULL), KILN_OK);
    s->n = p.n_weights;
    s->ts = calloc((size_t)s->n, sizeof(kiln_tensor));
    s->bufs = calloc((size_t)s->n, sizeof(float *));
    kt_rng r;
    kt_rng_seed(&r, seed);
    for (int i = 0; i < p.n_weights; i++) {
        const kiln_weight_ref *w = &p.weights[i];
        size_t ne = 1;
        for (int d = 0; d < w->rank; d++) ne *= (size_t)w->shape[d];
        s->bufs[i] = malloc(ne * sizeof(float));
        kt_fill_normal(&r, s->bufs[i], ne, w->wclass == KILN_WCLASS_VECTOR ? 0.2f : 0.3f);
        if (w->wclass == KILN_WCLASS_VECTOR && strstr(w->name, "norm"))
            for (size_t j = 0; j < ne; j++) s->bufs[i][j] += 1.0f;
        s->ts[i].name = strdup(w->name);
        s->ts[i].data = s->bufs[i];
        s->ts[i].dtype = 0;
        s->ts[i].rank = w->rank;
        for (int d = 0; d < 4; d++) s->ts[i].shape[d] = d < w->rank ? w->shape[d] : 1;
        s->ts[i].nbytes = ne * 4;
    }
    kiln_plan_free(&p);
    assert_int_equal(kiln_model_from_tensors(&c, s->ts, s->n, &s->m, NULL), KILN_OK);
}

static void synth_free(synth *s) {
    kiln_model_free(s->m);
    for (int i = 0; i < s->n; i++) {
        free(s->bufs[i]);
        free((void *)s->ts[i].name);
    }
    free(s->bufs);
    free(s->ts);
}

static kiln_engine *mk_engine(const kiln_model *m, const char *backend) {
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.backend = backend;
    o.n_threads = 2;
    o.n_ctx = 8192;
    o.max_step_tokens = 256;
    o.max_seqs = 65;
    kiln_engine *e = NULL;
    kiln_err err;
    if (kiln_engine_create(m, &o, &e, &err)) fail_msg("engine: %s", err.msg);
    return e;
}

/* ---- a recording sink ---- */
typedef struct out {
    int32_t tok[256];
    int32_t n, finals, n_cached;
    kiln_finish fin;
} out;

static kiln_sink_result rec_sink(void *user, const kiln_token_event *ev) {
    out *o = user;
    if (ev->token >= 0 && o->n < 256) o->tok[o->n++] = ev->token;
    o->n_cached = ev->n_cached;
    if (ev->finish) {
        o->finals++;
        o->fin = ev->finish;
    }
    return KILN_SINK_OK;
}

static uint64_t submit(kiln_sched *s, const char *tenant, const int32_t *p, int32_t n, int32_t max,
                       float temp, uint64_t seed, out *o) {
    kiln_request_params rp;
    kiln_request_params_default(&rp);
    rp.tenant = tenant;
    rp.prompt = p;
    rp.n_prompt = n;
    rp.max_tokens = max;
    rp.sampling.temperature = temp;
    rp.sampling.seed = seed;
    rp.sink = rec_sink;
    rp.user = o;
    uint64_t id = 0;
    kiln_err err;
    kiln_rejection rej;
    if (kiln_sched_submit(s, &rp, &id, &rej, &err)) fail_msg("submit: %s", err.msg);
    return id;
}

static kiln_sched *mk_sched(kiln_engine *e, int32_t step_tokens) {
    kiln_sched_opts o;
    kiln_sched_opts_default(&o);
    o.step_tokens = step_tokens;
    kiln_sched *s = NULL;
    kiln_err err;
    if (kiln_sched_create(e, NULL, &o, &s, &err)) fail_msg("sched: %s", err.msg);
    return s;
}

static void drain(kiln_sched *s) {
    kiln_err err;
    char msg[512];
    for (int i = 0; i < 100000; i++) {
        bool w = false;
        if (kiln_sched_step(s, &w, &err)) fail_msg("step: %s", err.msg);
        if (!kiln_sched_check(s, msg, sizeof(msg))) fail_msg("%s", msg);
        if (!w) return;
    }
    fail_msg("drain did not finish");
}

/* greedy tokens of prompt straight from the engine (prefill, then one token a step) */
static void direct(kiln_engine *e, const int32_t *p, int32_t n, int32_t max, int32_t *outt) {
    int32_t seq;
    assert_int_equal(kiln_seq_create(e, &seq, NULL), KILN_OK);
    kiln_batch_entry en[256];
    for (int32_t i = 0; i < n; i++) en[i] = (kiln_batch_entry){seq, p[i], i, i == n - 1};
    int32_t id = -1;
    assert_int_equal(kiln_engine_step_greedy(e, en, n, 0, &id, NULL), KILN_OK);
    for (int32_t k = 0; k < max; k++) {
        outt[k] = id;
        en[0] = (kiln_batch_entry){seq, id, n + k, 1};
        assert_int_equal(kiln_engine_step_greedy(e, en, 1, 0, &id, NULL), KILN_OK);
    }
    kiln_seq_free(e, seq);
}

static void invariance(const char *backend) {
    synth sm;
    synth_make(&sm, 42);
    kiln_engine *e = mk_engine(sm.m, backend);
    kt_rng r;
    kt_rng_seed(&r, 7);
    int32_t target[37];
    for (int i = 0; i < 37; i++) target[i] = (int32_t)(kt_rng_u64(&r) % 97);
    const int32_t MAX = 24;
    int32_t ref[64];
    direct(e, target, 37, MAX, ref);
    /* alone, through the scheduler */
    kiln_sched *s = mk_sched(e, 64);
    out alone = {0};
    submit(s, NULL, target, 37, MAX, 0, 0, &alone);
    drain(s);
    kiln_sched_free(s);
    assert_int_equal(alone.finals, 1);
    assert_int_equal(alone.n, MAX);
    for (int i = 0; i < MAX; i++)
        if (alone.tok[i] != ref[i])
            fail_msg("%s: alone token %d: %d, engine direct %d", backend, i, alone.tok[i], ref[i]);
    /* inside mixes of 64 others */
    for (int round = 0; round < 3; round++) {
        s = mk_sched(e, round == 0 ? 256 : round == 1 ? 64 : 97);
        static out others[64];
        static int32_t prompts[64][80];
        int32_t plen[64], arrive[64], maxt[64];
        float temp[64];
        for (int k = 0; k < 64; k++) {
            memset(&others[k], 0, sizeof(out));
            plen[k] = 1 + (int32_t)(kt_rng_u64(&r) % 70);
            int share = kt_rng_u64(&r) % 4 == 0; /* starts like the target */
            for (int i = 0; i < plen[k]; i++)
                prompts[k][i] = share && i < 37 ? target[i] : (int32_t)(kt_rng_u64(&r) % 97);
            arrive[k] = (int32_t)(kt_rng_u64(&r) % 40);
            maxt[k] = 1 + (int32_t)(kt_rng_u64(&r) % 30);
            temp[k] = kt_rng_u64(&r) % 3 == 0 ? 0.8f : 0.0f;
        }
        int32_t t_arrive = (int32_t)(kt_rng_u64(&r) % 30);
        out mine = {0};
        kiln_err err;
        char msg[512];
        for (int step = 0; step < 20000; step++) {
            for (int k = 0; k < 64; k++)
                if (arrive[k] == step)
                    submit(s, NULL, prompts[k], plen[k], maxt[k], temp[k], (uint64_t)k, &others[k]);
            if (step == t_arrive) submit(s, NULL, target, 37, MAX, 0, 0, &mine);
            bool w = false;
            if (kiln_sched_step(s, &w, &err)) fail_msg("step: %s", err.msg);
            if (!kiln_sched_check(s, msg, sizeof(msg))) fail_msg("%s", msg);
            if (!w && step > 40) break;
        }
        kiln_sched_stats st;
        kiln_sched_stats_get(s, &st);
        assert_int_equal(mine.finals, 1);
        assert_int_equal(mine.n, MAX);
        for (int i = 0; i < MAX; i++)
            if (mine.tok[i] != alone.tok[i])
                fail_msg("%s round %d: token %d in the mix %d, alone %d (target cached %d)",
                         backend, round, i, mine.tok[i], alone.tok[i], mine.n_cached);
        for (int k = 0; k < 64; k++) assert_int_equal(others[k].finals, 1);
        print_message("%s round %d: %llu steps, %llu tokens, mean %.1f tokens/step, prefix hits "
                      "%llu tokens, target cached %d\n",
                      backend, round, (unsigned long long)st.steps,
                      (unsigned long long)st.step_tokens,
                      (double)st.step_tokens / (double)(st.steps ? st.steps : 1),
                      (unsigned long long)st.prefix_hit_tokens, mine.n_cached);
        kiln_sched_free(s);
    }
    assert_int_equal(kiln_kv_pool_used(&e->kv), 0);
    kiln_engine_free(e);
    synth_free(&sm);
}

static void invariance_ref(void **st) {
    (void)st;
    invariance("ref");
}
static void invariance_cpu(void **st) {
    (void)st;
    invariance("cpu");
}

static void prefix_isolation(void **st) {
    (void)st;
    synth sm;
    synth_make(&sm, 43);
    kiln_engine *e = mk_engine(sm.m, "cpu");
    kiln_sched *s = mk_sched(e, 64);
    kiln_tenant_config c[3];
    const char *ids[3] = {"a1", "a2", "b"};
    for (int i = 0; i < 3; i++) {
        kiln_tenant_config_default(&c[i]);
        c[i].id = ids[i];
    }
    c[0].isolation_group = c[1].isolation_group = "g";
    kiln_err err;
    for (int i = 0; i < 3; i++) assert_int_equal(kiln_sched_add_tenant(s, &c[i], &err), KILN_OK);
    int32_t p[50];
    for (int i = 0; i < 50; i++) p[i] = (i * 31 + 5) % 97;
    out o1 = {0}, o2 = {0}, o3 = {0}, o4 = {0};
    submit(s, "a1", p, 50, 12, 0, 0, &o1);
    drain(s);
    submit(s, "b", p, 50, 12, 0, 0, &o3); /* another scope: no hit */
    drain(s);
    submit(s, "a2", p, 50, 12, 0, 0, &o2); /* same group: hit */
    drain(s);
    submit(s, "a1", p, 50, 12, 0, 0, &o4); /* same tenant: hit */
    drain(s);
    assert_int_equal(o1.n_cached, 0);
    assert_int_equal(o3.n_cached, 0);
    assert_int_equal(o2.n_cached, 48);
    assert_int_equal(o4.n_cached, 48);
    for (int i = 0; i < 12; i++) {
        assert_int_equal(o2.tok[i], o1.tok[i]);
        assert_int_equal(o3.tok[i], o1.tok[i]);
        assert_int_equal(o4.tok[i], o1.tok[i]);
    }
    kiln_tenant_usage u;
    assert_int_equal(kiln_sched_usage(s, "a2", &u, &err), KILN_OK);
    assert_int_equal(u.prefix_hit_tokens, 48);
    assert_int_equal(u.tokens_prompted, 50);
    assert_int_equal(u.tokens_generated, 12);
    assert_int_equal(u.requests_admitted, 1);
    assert_true(u.ttft_ms.p50 > 0);
    assert_int_equal(kiln_sched_usage(s, "b", &u, &err), KILN_OK);
    assert_int_equal(u.prefix_hit_tokens, 0);
    kiln_sched_free(s);
    assert_int_equal(kiln_kv_pool_used(&e->kv), 0);
    kiln_engine_free(e);
    synth_free(&sm);
}

static void session_reuse(void **st) {
    (void)st;
    synth sm;
    synth_make(&sm, 44);
    kiln_engine *e = mk_engine(sm.m, "cpu");
    kiln_sched *s = mk_sched(e, 64);
    kiln_err err;
    uint64_t sess = 0;
    assert_int_equal(kiln_sched_session_open(s, NULL, &sess, &err), KILN_OK);
    int32_t conv[200];
    int32_t n = 0;
    for (int i = 0; i < 30; i++) conv[n++] = (i * 7 + 3) % 97;
    kiln_request_params rp;
    kiln_request_params_default(&rp);
    rp.sampling.temperature = 0;
    rp.sink = rec_sink;
    rp.session = sess;
    out t1 = {0};
    rp.prompt = conv;
    rp.n_prompt = n;
    rp.max_tokens = 20;
    rp.user = &t1;
    assert_int_equal(kiln_sched_submit(s, &rp, NULL, NULL, &err), KILN_OK);
    drain(s);
    assert_int_equal(t1.n, 20);
    for (int i = 0; i < 20; i++) conv[n++] = t1.tok[i];
    for (int i = 0; i < 15; i++) conv[n++] = (i * 11 + 1) % 97;
    /* turn 2: the whole conversation (65 tokens); turn 1 computed 49 positions */
    out t2 = {0};
    rp.n_prompt = n;
    rp.max_tokens = 10;
    rp.user = &t2;
    assert_int_equal(kiln_sched_submit(s, &rp, NULL, NULL, &err), KILN_OK);
    drain(s);
    assert_int_equal(t2.n_cached, 48);
    /* the same conversation cold (another tenant scope: no cache) */
    kiln_sched_free(s);
    s = mk_sched(e, 64);
    out cold = {0};
    submit(s, NULL, conv, n, 10, 0, 0, &cold);
    drain(s);
    assert_int_equal(cold.n_cached, 0);
    for (int i = 0; i < 10; i++) assert_int_equal(t2.tok[i], cold.tok[i]);
    kiln_sched_free(s);
    assert_int_equal(kiln_kv_pool_used(&e->kv), 0);
    kiln_engine_free(e);
    synth_free(&sm);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(invariance_ref),
        cmocka_unit_test(invariance_cpu),
        cmocka_unit_test(prefix_isolation),
        cmocka_unit_test(session_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
