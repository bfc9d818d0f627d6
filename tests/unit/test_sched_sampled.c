/* test_sched_sampled.c — the scheduler's sampled steps (kiln_sched_engine.step_sampled:
 * the engine's device samples each row; on cuda, cuda.sample) over the fake engine, whose
 * step_sampled here runs ref.sample (test_sample_device: == the CPU chain) on its logits:
 * 12 requests with different sampling configurations (default chain, penalties, bias,
 * top-k above the vocabulary, top-k off with min-p, greedy with penalties, one asking for
 * logprobs, so some steps mix and fall back to host sampling) generate the same tokens as
 * the same requests sampled on the host, and most steps go through step_sampled. */
#include "testutil.h"

#include "kernels/ref/ref_fused.h"
#include "sched/sched_impl.h"
#include "test_sched_fake.h"

#include <math.h>
#include <string.h>

#define NV   300
#define NREQ 12
#define MAXT 40

typedef struct out {
    int32_t tok[256];
    int32_t n, finals;
} out;

static kiln_sink_result sink(void *user, const kiln_token_event *ev) {
    out *o = user;
    if (ev->token >= 0 && o->n < 256) o->tok[o->n++] = ev->token;
    if (ev->finish) o->finals++;
    return KILN_SINK_OK;
}

static fake_engine fe;
static long n_sampled_steps;

static uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

/* The fake's step with logits that depend on the sequence (its next token nx and the
 * position): N(0, 2^2)-like values, nx lifted by 3, so sampling has real choices. */
static kiln_status noisy_step(void *impl, const kiln_batch_entry *en, int32_t n, float *logits,
                              int32_t *ids, int32_t limit, kiln_err *err) {
    static float buf[64 * NV];
    int32_t nx[64];
    KILN_TRY(f_step(impl, en, n, NULL, nx, limit, err));
    int32_t row = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!en[i].want_logits) continue;
        float *lr = buf + (size_t)row * NV;
        for (int32_t v = 0; v < NV; v++) {
            uint64_t h = mix(((uint64_t)en[i].pos << 40) ^ ((uint64_t)nx[row] << 20) ^ (uint64_t)v);
            lr[v] = (float)((double)(h >> 11) * 0x1.0p-53 * 8.0 - 4.0);
        }
        lr[nx[row]] += 3.0f;
        if (logits) {
            memcpy(logits + (size_t)row * NV, lr, NV * sizeof(float));
        } else {
            int32_t best = 0, lim = limit > 0 && limit < NV ? limit : NV;
            for (int32_t v = 1; v < lim; v++)
                if (lr[v] > lr[best]) best = v;
            ids[row] = best;
        }
        row++;
    }
    return KILN_OK;
}

static kiln_status sampled_step(void *impl, const kiln_batch_entry *en, int32_t n,
                                const kiln_sample_step *ss, int32_t *ids, int32_t limit,
                                kiln_err *err) {
    static float lg[64 * NV];
    KILN_TRY(noisy_step(impl, en, n, lg, NULL, limit, err));
    int32_t rows = 0;
    for (int32_t i = 0; i < n; i++) rows += en[i].want_logits != 0;
    kiln_sample_args a = {.logits = lg,
                          .ld = NV,
                          .t = rows,
                          .n = limit > 0 && limit < NV ? limit : NV,
                          .rows = ss->rows,
                          .ov_id = ss->ov_id,
                          .ov_bias = ss->ov_bias,
                          .ov_count = ss->ov_count,
                          .ids = ids};
    n_sampled_steps++;
    return kiln_ref_sample(NULL, &a);
}

static void run(bool device, out *o) {
    kiln_sched_engine se;
    fake_init(&fe, &se, NV, 16, 64, 512);
    se.step = noisy_step;
    se.step_sampled = device ? sampled_step : NULL;
    kiln_sched_opts so;
    kiln_sched_opts_default(&so);
    so.max_slots = 8;
    kiln_sched *s = NULL;
    kiln_err err;
    if (kiln_sched_create_with(&se, NULL, &so, &s, &err)) fail_msg("create: %s", err.msg);
    static kiln_logit_bias bias[] = {{5, 2.0f}, {17, -INFINITY}, {40, 1.0f}};
    for (int r = 0; r < NREQ; r++) {
        int32_t prompt[20];
        for (int i = 0; i < 20; i++) prompt[i] = (int32_t)((r * 31 + i * 7) % NV);
        kiln_request_params rp;
        kiln_request_params_default(&rp);
        rp.prompt = prompt;
        rp.n_prompt = 10 + r % 10;
        rp.max_tokens = MAXT;
        rp.ignore_eos = true;
        rp.sampling.seed = 100 + (uint64_t)r;
        switch (r % 6) {
        case 1:
            rp.sampling.repeat_penalty = 1.3f, rp.sampling.frequency_penalty = 0.2f;
            break;
        case 2:
            rp.sampling.logit_bias = bias, rp.sampling.n_logit_bias = 3;
            break;
        case 3:
            rp.sampling.top_k = 1000;
            break; /* above the vocabulary: k = n */
        case 4:
            rp.sampling.top_k = 0, rp.sampling.min_p = 0.1f;
            break;
        case 5:
            rp.sampling.temperature = 0, rp.sampling.repeat_penalty = 1.5f;
            break;
        default:
            break;
        }
        if (r == 7) rp.logprobs = true; /* host sampling for the steps it is in */
        rp.sink = sink;
        rp.user = &o[r];
        uint64_t id;
        kiln_rejection rej;
        if (kiln_sched_submit(s, &rp, &id, &rej, &err)) fail_msg("submit %d: %s", r, err.msg);
    }
    for (int it = 0; it < 10000; it++) {
        int fin = 0;
        for (int r = 0; r < NREQ; r++) fin += o[r].finals;
        if (fin == NREQ) break;
        bool w;
        if (kiln_sched_step(s, &w, &err)) fail_msg("step: %s", err.msg);
    }
    kiln_sched_free(s);
    fake_free(&fe);
}

static void test_sampled_steps_equal_host(void **st) {
    (void)st;
    static out host[NREQ], dev[NREQ];
    memset(host, 0, sizeof host);
    memset(dev, 0, sizeof dev);
    n_sampled_steps = 0;
    run(false, host);
    assert_int_equal(n_sampled_steps, 0);
    run(true, dev);
    for (int r = 0; r < NREQ; r++) {
        assert_int_equal(host[r].finals, 1);
        assert_int_equal(host[r].n, MAXT);
        assert_int_equal(dev[r].n, MAXT);
        for (int i = 0; i < MAXT; i++)
            if (host[r].tok[i] != dev[r].tok[i])
                fail_msg("request %d token %d: host %d, sampled step %d", r, i, (int)host[r].tok[i],
                         (int)dev[r].tok[i]);
    }
    /* tokens vary (the logits give real choices) */
    int distinct = 0;
    for (int i = 1; i < MAXT; i++) distinct += host[0].tok[i] != host[0].tok[i - 1];
    assert_true(distinct > 5);
    print_message("%ld sampled steps\n", n_sampled_steps);
    assert_true(n_sampled_steps > 10);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sampled_steps_equal_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
