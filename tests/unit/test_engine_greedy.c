/* test_engine_greedy.c — kiln_engine_step_greedy (the LM head fused with the greedy
 * pick) on synthetic models of the gemma3 and llama shapes, on the ref and cpu
 * backends, 1 and 2 threads: over several decode steps of several sequences at once,
 * the ids it returns equal the greedy sampler's choice on the logits kiln_engine_step
 * returns for the same entries (kiln_sampler, temperature 0), with and without a
 * final softcap and a vocabulary limit; errors for a missing ids buffer. And the fused
 * residual add + RMS norm (runtime/adapters.c): the same logits, bitwise, with it on and
 * off, and it does run (2 pairs per layer but the last). */
#include "testutil.h"

#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/exec.h"
#include "sample/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct synth {
    kiln_model *m;
    float **bufs;
    kiln_tensor *ts;
    int n;
} synth;

#define V 301 /* vocabulary: more than one 256-row chunk of the fused LM head */

static void synth_make(synth *s, const char *arch, float softcap, uint64_t seed) {
    kiln_model_config c;
    kiln_model_config_defaults(&c);
    strcpy(c.arch, arch);
    c.n_vocab = V, c.n_embd = 64, c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2, c.head_dim = 16;
    c.n_ff = 96, c.n_rot = 16, c.attn_scale = 0.25f, c.n_ctx_train = 256, c.norm_eps = 1e-6f;
    for (int l = 0; l < c.n_layer; l++) c.layer_rope_base[l] = 10000, c.layer_rope_scale[l] = 1;
    if (strcmp(arch, "gemma3") == 0) {
        c.rope_mode = 1;
        c.qk_norm = c.post_norms = true;
        c.act = 1;
        c.embed_scale = 8;
        c.tied_embeddings = true;
    }
    c.final_softcap = softcap;
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

static kiln_engine *engine(const kiln_model *m, const char *backend, int threads) {
    kiln_engine_opts o;
    kiln_engine_opts_default(&o);
    o.backend = backend;
    o.n_threads = threads;
    o.n_ctx = 512;
    o.max_step_tokens = 64;
    o.max_seqs = 4;
    kiln_engine *e;
    kiln_err err;
    if (kiln_engine_create(m, &o, &e, &err)) fail_msg("engine: %s", err.msg);
    return e;
}

/* 3 sequences: a prefill step, then 12 decode steps fed with the greedy tokens; entry 1
 * of each decode step asks for nothing. Engine A: logits + sampler; engine B: greedy. */
static void run(const char *arch, const char *backend, int threads, float softcap, int limit) {
    synth s;
    synth_make(&s, arch, softcap, 5);
    kiln_engine *a = engine(s.m, backend, threads), *b = engine(s.m, backend, threads);
    kiln_sampler_params sp;
    kiln_sampler_params_default(&sp);
    sp.temperature = 0;
    kiln_sampler *smp;
    assert_int_equal(kiln_sampler_create(&sp, V, &smp, NULL), KILN_OK);
    int32_t sa[3], sb[3], next[3], pos[3];
    kiln_batch_entry en[64];
    float *lg = malloc(sizeof(float) * 64 * V);
    int32_t ids[64];
    int n = 0;
    for (int q = 0; q < 3; q++) {
        assert_int_equal(kiln_seq_create(a, &sa[q], NULL), 0);
        assert_int_equal(kiln_seq_create(b, &sb[q], NULL), 0);
        for (int j = 0; j <= 4 * q; j++)
            en[n++] = (kiln_batch_entry){q, (int32_t)((q * 37 + j * 11) % V), j, j == 4 * q};
        pos[q] = 4 * q + 1;
    }
    for (int step = 0; step < 13; step++) {
        kiln_batch_entry eb[64];
        memcpy(eb, en, sizeof(kiln_batch_entry) * (size_t)n);
        for (int i = 0; i < n; i++) {
            en[i].seq = sa[en[i].seq];
            eb[i].seq = sb[eb[i].seq];
        }
        kiln_err err;
        if (kiln_engine_step(a, en, n, lg, &err)) fail_msg("step: %s", err.msg);
        for (int i = 0; i < 64; i++) ids[i] = -7;
        if (kiln_engine_step_greedy(b, eb, n, limit, ids, &err)) fail_msg("greedy: %s", err.msg);
        int row = 0;
        for (int i = 0; i < n; i++) {
            if (!en[i].want_logits) continue;
            int32_t want = kiln_sampler_sample(smp, lg + (size_t)row * V, limit > 0 ? limit : V);
            if (ids[row] != want)
                fail_msg("%s %s t%d cap %g limit %d: step %d row %d: greedy %d, sampler %d", arch,
                         backend, threads, softcap, limit, step, row, ids[row], want);
            row++;
        }
        assert_int_equal(ids[row], -7); /* nothing written past the rows that asked */
        /* next decode step: each sequence's greedy token; sequence 1 wants no logits */
        int r2 = 0, k = 0;
        for (int q = 0; q < 3; q++) next[q] = -1;
        for (int i = 0; i < n; i++)
            if (en[i].want_logits) {
                int q = en[i].seq == sa[0] ? 0 : en[i].seq == sa[1] ? 1 : 2;
                next[q] = ids[r2++];
            }
        for (int q = 0; q < 3; q++) {
            int32_t t = next[q] >= 0 ? next[q] : (int32_t)((q + step) % V);
            en[k++] = (kiln_batch_entry){q, t, pos[q]++, q != 1 || step % 2};
        }
        n = k;
    }
    kiln_sampler_free(smp);
    free(lg);
    kiln_engine_free(a);
    kiln_engine_free(b);
    synth_free(&s);
}

static void test_greedy_ref(void **state) {
    (void)state;
    run("llama", "ref", 1, 0, 0);
    run("gemma3", "ref", 2, 0, 0);
    run("gemma3", "ref", 2, 0.5f, 200);
}

static void test_greedy_cpu(void **state) {
    (void)state;
    run("llama", "cpu", 2, 0, 0);
    run("llama", "cpu", 1, 0, 257);
    run("gemma3", "cpu", 2, 0, 0);
    run("gemma3", "cpu", 2, 30.0f, 0);
    run("gemma3", "cpu", 2, 0.05f, 300); /* saturated softcap: ties resolved to the lowest id */
}

/* prefill of 2 sequences, then 6 decode steps; logits of every step into lg[step] */
static void add_norm_steps(const kiln_model *m, const char *backend, float *lg) {
    kiln_engine *e = engine(m, backend, 2);
    int32_t sq[2];
    kiln_batch_entry en[16];
    int n = 0;
    for (int q = 0; q < 2; q++) {
        assert_int_equal(kiln_seq_create(e, &sq[q], NULL), 0);
        for (int j = 0; j < 5 + q; j++)
            en[n++] = (kiln_batch_entry){sq[q], (int32_t)((q * 53 + j * 7) % V), j, j == 4 + q};
    }
    for (int step = 0; step < 7; step++) {
        kiln_err err;
        if (kiln_engine_step(e, en, n, lg + (size_t)step * 2 * V, &err))
            fail_msg("step: %s", err.msg);
        n = 0;
        for (int q = 0; q < 2; q++)
            en[n++] = (kiln_batch_entry){sq[q], (int32_t)((step * 31 + q) % V), 5 + q + step, 1};
    }
    kiln_engine_free(e);
}

static void test_add_norm_fusion(void **state) {
    (void)state;
    static const char *const archs[] = {"llama", "gemma3"}, *const bes[] = {"ref", "cpu"};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            synth s;
            synth_make(&s, archs[a], 0, 11);
            float *on = malloc(sizeof(float) * 14 * V), *off = malloc(sizeof(float) * 14 * V);
            const uint64_t c0 = kiln_adapter_add_norm_count();
            kiln_adapter_add_norm_enable(1);
            add_norm_steps(s.m, bes[b], on);
            const uint64_t c1 = kiln_adapter_add_norm_count();
            kiln_adapter_add_norm_enable(0);
            add_norm_steps(s.m, bes[b], off);
            const uint64_t c2 = kiln_adapter_add_norm_count();
            kiln_adapter_add_norm_enable(1);
            /* 2 layers: attention add -> ffn norm, ffn add -> next layer's norm (the last
             * layer's to the output norm): 4 pairs per step, 7 steps */
            if (c1 - c0 < 7 * 3)
                fail_msg("%s %s: %llu pairs fused", archs[a], bes[b],
                         (unsigned long long)(c1 - c0));
            assert_true(c2 == c1);
            if (memcmp(on, off, sizeof(float) * 14 * V) != 0)
                fail_msg("%s %s: logits differ with the add + norm fusion", archs[a], bes[b]);
            free(on), free(off);
            synth_free(&s);
        }
}

static void test_greedy_errors(void **state) {
    (void)state;
    synth s;
    synth_make(&s, "llama", 0, 3);
    kiln_engine *e = engine(s.m, "cpu", 1);
    int32_t q;
    assert_int_equal(kiln_seq_create(e, &q, NULL), 0);
    kiln_batch_entry b = {q, 5, 0, 1};
    kiln_err err;
    assert_int_equal(kiln_engine_step_greedy(e, &b, 1, 0, NULL, &err), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "ids"));
    assert_int_equal(kiln_seq_len(e, q), 0); /* nothing ran */
    b.want_logits = 0;
    assert_int_equal(kiln_engine_step_greedy(e, &b, 1, 0, NULL, &err), KILN_OK);
    assert_int_equal(kiln_seq_len(e, q), 1);
    kiln_engine_free(e);
    synth_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_ref),
        cmocka_unit_test(test_greedy_cpu),
        cmocka_unit_test(test_greedy_errors),
        cmocka_unit_test(test_add_norm_fusion),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
