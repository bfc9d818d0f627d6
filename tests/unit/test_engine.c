/* test_engine.c — the engine step API on synthetic models (random weights, the
 * shapes of the gemma3 and llama families): batch invariance (bitwise on ref),
 * prefill == token-by-token decode, KV lifecycle (truncate/reuse, fork, free and
 * recycle, capacity), entry validation, dispatch counters, the op profile
 * (KILN_OP_PROFILE). */
#include "testutil.h"

#include "model/model.h"
#include "runtime/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct synth {
    kiln_model *m;
    float **bufs;
    kiln_tensor *ts;
    int n;
} synth;

static void synth_config(kiln_model_config *c, const char *arch) {
    kiln_model_config_defaults(c);
    strcpy(c->arch, arch);
    c->n_vocab = 97, c->n_embd = 32, c->n_layer = 3, c->n_head = 4, c->n_kv_head = 2,
    c->head_dim = 16;
    c->n_ff = 48, c->n_rot = 16, c->attn_scale = 0.25f, c->n_ctx_train = 256;
    c->norm_eps = 1e-6f;
    for (int l = 0; l < c->n_layer; l++) c->layer_rope_base[l] = 10000, c->layer_rope_scale[l] = 1;
    if (strcmp(arch, "gemma3") == 0) {
        c->rope_mode = 1;
        c->qk_norm = c->post_norms = true;
        c->act = 1;
        c->embed_scale = sqrtf(32);
        c->tied_embeddings = true;
        c->layer_window[0] = c->layer_window[1] = 5; /* sliding, then global */
        c->layer_rope_base[2] = 1e6f;
    } else {
        c->qkv_bias = true;
    }
}

static void synth_make(synth *s, const char *arch, uint64_t seed) {
    kiln_model_config c;
    synth_config(&c, arch);
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
    assert_non_null(s->m->family);
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

static kiln_engine *engine(const kiln_model *m, int threads, int max_step) {
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.n_threads = threads;
    o.n_ctx = 1024;
    o.max_step_tokens = max_step;
    o.max_seqs = 16;
    o.counters = 1;
    kiln_engine *e;
    kiln_err err;
    if (kiln_engine_create(m, &o, &e, &err)) fail_msg("engine: %s", err.msg);
    return e;
}

static int32_t tok(int s, int i) {
    return (int32_t)((s * 31 + i * 7 + 3) % 97);
}

/* 8 sequences of different lengths: prefilled together, then 4 decode steps together;
 * versus each sequence alone in its own engine. Logits must be bitwise equal. */
static void batch_invariance(const char *arch) {
    synth s;
    synth_make(&s, arch, 11);
    const int V = 97, NS = 8;
    const int lens[8] = {1, 3, 17, 5, 16, 33, 2, 9};
    float *together = calloc((size_t)(NS * 5 * V), sizeof(float));
    float *alone = calloc((size_t)(5 * V), sizeof(float));
    kiln_engine *e = engine(s.m, 2, 128);
    int32_t seq[8];
    kiln_batch_entry b[128];
    int n = 0;
    for (int i = 0; i < NS; i++) assert_int_equal(kiln_seq_create(e, &seq[i], NULL), 0);
    /* interleaved prefill: the entries of a sequence stay in order */
    for (int j = 0; j < 33; j++)
        for (int i = 0; i < NS; i++)
            if (j < lens[i]) b[n++] = (kiln_batch_entry){seq[i], tok(i, j), j, j == lens[i] - 1};
    float *lg = calloc((size_t)(NS * V), sizeof(float));
    kiln_err err;
    if (kiln_engine_step(e, b, n, lg, &err)) fail_msg("step: %s", err.msg);
    /* logits come in entry order: map to sequences */
    int k = 0;
    for (int j = 0; j < 33; j++)
        for (int i = 0; i < NS; i++)
            if (j == lens[i] - 1)
                memcpy(together + (size_t)(i * 5) * V, lg + (size_t)(k++) * V, sizeof(float) * V);
    for (int d = 1; d < 5; d++) {
        n = 0;
        for (int i = NS - 1; i >= 0; i--) /* reversed order on purpose */
            b[n++] = (kiln_batch_entry){seq[i], tok(i, 100 + d), lens[i] + d - 1, 1};
        assert_int_equal(kiln_engine_step(e, b, n, lg, NULL), 0);
        for (int i = 0; i < NS; i++)
            memcpy(together + (size_t)(i * 5 + d) * V, lg + (size_t)(NS - 1 - i) * V,
                   sizeof(float) * V);
    }
    const uint64_t *cnt = kiln_engine_counters(e);
    assert_int_equal(cnt[KILN_OP_ATTENTION], 5 * 3);
    assert_int_equal(cnt[KILN_OP_LM_HEAD], 5);
    kiln_engine_free(e);
    for (int i = 0; i < NS; i++) {
        kiln_engine *e1 = engine(s.m, 1, 64);
        int32_t q;
        assert_int_equal(kiln_seq_create(e1, &q, NULL), 0);
        n = 0;
        for (int j = 0; j < lens[i]; j++)
            b[n++] = (kiln_batch_entry){q, tok(i, j), j, j == lens[i] - 1};
        assert_int_equal(kiln_engine_step(e1, b, n, alone, NULL), 0);
        for (int d = 1; d < 5; d++) {
            b[0] = (kiln_batch_entry){q, tok(i, 100 + d), lens[i] + d - 1, 1};
            assert_int_equal(kiln_engine_step(e1, b, 1, alone + (size_t)d * V, NULL), 0);
        }
        for (int d = 0; d < 5; d++)
            if (memcmp(alone + (size_t)d * V, together + (size_t)(i * 5 + d) * V,
                       sizeof(float) * V) != 0)
                fail_msg("%s: sequence %d step %d differs alone vs batched", arch, i, d);
        for (int x = 0; x < 5 * V; x++) assert_true(isfinite(alone[x]));
        kiln_engine_free(e1);
    }
    free(together), free(alone), free(lg);
    synth_free(&s);
}

static void test_batch_invariance_gemma3(void **state) {
    (void)state;
    batch_invariance("gemma3");
}
static void test_batch_invariance_llama(void **state) {
    (void)state;
    batch_invariance("llama");
}

/* A prompt prefilled in one step gives the same last logits as fed one token at a time,
 * and truncate + re-feed (multi-turn reuse) reproduces them; fork continues identically. */
static void test_prefill_decode_lifecycle(void **state) {
    (void)state;
    synth s;
    synth_make(&s, "gemma3", 12);
    const int V = 97, L = 21;
    kiln_engine *e = engine(s.m, 2, 64);
    int32_t a, b2;
    assert_int_equal(kiln_seq_create(e, &a, NULL), 0);
    assert_int_equal(kiln_seq_create(e, &b2, NULL), 0);
    kiln_batch_entry en[64];
    float la[97], lb[97], lc[97];
    for (int j = 0; j < L; j++) en[j] = (kiln_batch_entry){a, tok(1, j), j, j == L - 1};
    assert_int_equal(kiln_engine_step(e, en, L, la, NULL), 0);
    for (int j = 0; j < L; j++) {
        en[0] = (kiln_batch_entry){b2, tok(1, j), j, j == L - 1};
        assert_int_equal(kiln_engine_step(e, en, 1, lb, NULL), 0);
    }
    assert_memory_equal(la, lb, sizeof(la));
    assert_int_equal(kiln_seq_len(e, a), L);
    /* reuse: keep 10 positions, re-feed the rest */
    assert_int_equal(kiln_seq_truncate(e, a, 10, NULL), 0);
    assert_int_equal(kiln_seq_len(e, a), 10);
    for (int j = 10; j < L; j++) en[j - 10] = (kiln_batch_entry){a, tok(1, j), j, j == L - 1};
    assert_int_equal(kiln_engine_step(e, en, L - 10, lc, NULL), 0);
    assert_memory_equal(la, lc, sizeof(la));
    /* fork: the child continues exactly like the parent */
    int32_t c;
    int used_before = kiln_kv_pool_used(&e->kv);
    assert_int_equal(kiln_seq_fork(e, a, &c, NULL), 0);
    assert_int_equal(kiln_kv_pool_used(&e->kv),
                     used_before + 1); /* shares 1 full block, copies the partial */
    en[0] = (kiln_batch_entry){a, 5, L, 1};
    en[1] = (kiln_batch_entry){c, 5, L, 1};
    float two[2 * 97];
    assert_int_equal(kiln_engine_step(e, en, 2, two, NULL), 0);
    assert_memory_equal(two, two + V, sizeof(float) * V);
    /* truncating the child into the shared block un-shares it; the parent is untouched */
    assert_int_equal(kiln_seq_truncate(e, c, 8, NULL), 0);
    for (int j = 8; j < L; j++) en[j - 8] = (kiln_batch_entry){c, 1, j, 0};
    assert_int_equal(kiln_engine_step(e, en, L - 8, NULL, NULL), 0);
    en[0] = (kiln_batch_entry){a, 6, L + 1, 1};
    assert_int_equal(kiln_engine_step(e, en, 1, la, NULL), 0);
    kiln_seq_free(e, c);
    kiln_seq_free(e, b2);
    /* recycling: a new sequence in a freed slot computes from scratch */
    int32_t d;
    assert_int_equal(kiln_seq_create(e, &d, NULL), 0);
    for (int j = 0; j < L; j++) en[j] = (kiln_batch_entry){d, tok(1, j), j, j == L - 1};
    assert_int_equal(kiln_engine_step(e, en, L, lc, NULL), 0);
    assert_memory_equal(lb, lc, sizeof(lb));
    kiln_seq_free(e, a);
    kiln_seq_free(e, d);
    assert_int_equal(kiln_kv_pool_used(&e->kv), 0);
    kiln_engine_free(e);
    synth_free(&s);
}

static void test_errors_capacity(void **state) {
    (void)state;
    synth s;
    synth_make(&s, "llama", 13);
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.n_threads = 1;
    o.n_ctx = 32; /* 2 blocks + 2 slack (max_seqs) */
    o.max_seqs = 2;
    o.max_step_tokens = 64;
    kiln_engine *e;
    assert_int_equal(kiln_engine_create(s.m, &o, &e, NULL), 0);
    int32_t a, b;
    kiln_err err;
    assert_int_equal(kiln_seq_create(e, &a, NULL), 0);
    assert_int_equal(kiln_seq_create(e, &b, NULL), 0);
    int32_t c;
    assert_int_equal(kiln_seq_create(e, &c, &err), KILN_ERR_CAPACITY);
    kiln_batch_entry en[64];
    en[0] = (kiln_batch_entry){a, 200, 0, 0};
    assert_int_equal(kiln_engine_step(e, en, 1, NULL, &err), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "vocabulary"));
    en[0] = (kiln_batch_entry){a, 1, 1, 0};
    assert_int_equal(kiln_engine_step(e, en, 1, NULL, &err), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "expected 0"));
    en[0] = (kiln_batch_entry){5, 1, 0, 0};
    assert_int_equal(kiln_engine_step(e, en, 1, NULL, &err), KILN_ERR_INVALID_ARG);
    en[0] = (kiln_batch_entry){a, 1, 0, 1};
    assert_int_equal(kiln_engine_step(e, en, 1, NULL, &err), KILN_ERR_INVALID_ARG);
    /* 4 blocks in all: 60 tokens need 4 for a, then b cannot get one */
    for (int j = 0; j < 60; j++) en[j] = (kiln_batch_entry){a, 1, j, 0};
    assert_int_equal(kiln_engine_step(e, en, 60, NULL, &err), 0);
    en[0] = (kiln_batch_entry){b, 1, 0, 0};
    assert_int_equal(kiln_engine_step(e, en, 1, NULL, &err), KILN_ERR_CAPACITY);
    assert_int_equal(kiln_seq_len(e, b), 0);
    kiln_seq_free(e, a);
    assert_int_equal(kiln_engine_step(e, en, 1, NULL, &err), 0);
    kiln_engine_free(e);
    synth_free(&s);
}

/* Binding errors are typed: a missing tensor and a wrongly shaped one. */
static void test_bind_errors(void **state) {
    (void)state;
    synth s;
    synth_make(&s, "llama", 14);
    kiln_plan p;
    kiln_plan_init(&p);
    assert_int_equal(kiln_decoder_compile(&s.m->cfg, KILN_MODE_DECODE, &p, NULL), 0);
    kiln_bound_plan bp;
    kiln_plan_check chk;
    kiln_err err;
    kiln_device dev;
    assert_int_equal(kiln_device_open(kiln_backend_find("ref"), 0, &dev, &err), KILN_OK);
    const char *saved = s.m->tensors[3].name;
    s.m->tensors[3].name = "renamed";
    assert_int_equal(kiln_bind_plan(&dev, s.m, &p, &bp, &chk, &err), KILN_ERR_PLAN);
    assert_int_equal(chk.code, KILN_PLAN_EWEIGHT_MISSING);
    assert_non_null(strstr(err.msg, saved));
    s.m->tensors[3].name = saved;
    kiln_plan_init(&p);
    assert_int_equal(kiln_decoder_compile(&s.m->cfg, KILN_MODE_DECODE, &p, NULL), 0);
    s.m->tensors[3].shape[0]++;
    assert_int_equal(kiln_bind_plan(&dev, s.m, &p, &bp, &chk, &err), KILN_ERR_PLAN);
    assert_int_equal(chk.code, KILN_PLAN_EWEIGHT_SHAPE);
    s.m->tensors[3].shape[0]--;
    kiln_plan_init(&p);
    assert_int_equal(kiln_decoder_compile(&s.m->cfg, KILN_MODE_DECODE, &p, NULL), 0);
    uint32_t saved_dt = s.m->tensors[3].dtype;
    s.m->tensors[3].dtype = 16; /* IQ2_XXS: known, not computable */
    assert_int_equal(kiln_bind_plan(&dev, s.m, &p, &bp, &chk, &err), KILN_ERR_PLAN);
    assert_true(chk.code == KILN_PLAN_EWEIGHT_DTYPE || chk.code == KILN_PLAN_EWEIGHT_SHAPE);
    s.m->tensors[3].dtype = saved_dt;
    assert_null(kiln_backend_find("nope"));
    kiln_device_close(&dev);
    synth_free(&s);
}

/* KILN_OP_PROFILE=1: per tokens bucket the steps, per opcode the calls (those of the
 * dispatch counters; a residual add fused into the norm after it counts as the norm's) and
 * their time; the logits unchanged (bitwise the same steps without the profile) */
static void test_op_profile(void **state) {
    (void)state;
    synth s;
    synth_make(&s, "llama", 5);
    const int V = 97;
    float *lg[2];
    uint64_t calls[KILN_OP_LIMIT] = {0};
    for (int prof = 1; prof >= 0; prof--) {
        if (prof) setenv("KILN_OP_PROFILE", "1", 1);
        kiln_engine *e = engine(s.m, 1, 64);
        unsetenv("KILN_OP_PROFILE");
        assert_true((e->op_prof != NULL) == (prof == 1));
        lg[prof] = calloc((size_t)(2 * 4 * V), sizeof(float));
        assert_non_null(lg[prof]);
        int32_t q[2];
        for (int i = 0; i < 2; i++) assert_int_equal(kiln_seq_create(e, &q[i], NULL), 0);
        kiln_batch_entry b[32];
        int n = 0;
        for (int j = 0; j < 17; j++) /* 20 tokens: the 9-64 bucket; rows 4 and 19 want logits */
            for (int i = 0; i < 2; i++)
                if (j < (i ? 17 : 3))
                    b[n++] = (kiln_batch_entry){q[i], tok(i, j), j, j == (i ? 16 : 2)};
        assert_int_equal(kiln_engine_step(e, b, n, lg[prof], NULL), 0);
        for (int d = 1; d < 4; d++) { /* 2 tokens: the 2-8 bucket */
            for (int i = 0; i < 2; i++)
                b[i] = (kiln_batch_entry){q[i], tok(i, 50 + d), (i ? 17 : 3) + d - 1, 1};
            assert_int_equal(kiln_engine_step(e, b, 2, lg[prof] + (size_t)d * 2 * V, NULL), 0);
        }
        if (prof) {
            assert_int_equal(e->prof_steps[2], 1);
            assert_int_equal(e->prof_steps[1], 3);
            assert_true(e->prof_step_ns[2] > 0 && e->prof_step_ns[1] > 0);
            for (int b2 = 0; b2 < KILN_BUCKETS; b2++)
                for (int op = 0; op < KILN_OP_LIMIT; op++)
                    calls[op] += e->op_prof[(size_t)b2 * 2 * KILN_OP_LIMIT + KILN_OP_LIMIT + op];
            const uint64_t *cnt = kiln_engine_counters(e);
            for (int op = 0; op < KILN_OP_LIMIT; op++)
                if (op != KILN_OP_RESIDUAL_ADD && calls[op] != cnt[op])
                    fail_msg("%s: profiled %llu calls, dispatched %llu",
                             kiln_opcode_name((uint32_t)op), (unsigned long long)calls[op],
                             (unsigned long long)cnt[op]);
            assert_int_equal(calls[KILN_OP_ATTENTION], 4 * 3);
            assert_true(e->op_prof[2 * 2 * KILN_OP_LIMIT + KILN_OP_ATTENTION] > 0);
        }
        kiln_engine_free(e);
    }
    if (memcmp(lg[0], lg[1], sizeof(float) * (size_t)(2 * 4 * V)) != 0)
        fail_msg("the profiled steps' logits differ");
    free(lg[0]), free(lg[1]);
    synth_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_profile),
        cmocka_unit_test(test_batch_invariance_gemma3),
        cmocka_unit_test(test_batch_invariance_llama),
        cmocka_unit_test(test_prefill_decode_lifecycle),
        cmocka_unit_test(test_errors_capacity),
        cmocka_unit_test(test_bind_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
