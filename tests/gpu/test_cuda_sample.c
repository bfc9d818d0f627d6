/*
 * test_cuda_sample.c — sampling on the GPU (cuda.sample, issue #17), label gpu.
 *
 * 1. cuda.sample against ref.sample (tests/unit/test_sample_device.c checks ref.sample
 *    against the CPU chain) on random logits: vocabularies 7 .. 262,144 (ragged ones
 *    included), every configuration of sample_cases.h that kiln_sampler_device_ok accepts
 *    (k 1 / 40 / 1000 / 4000, greedy and three temperatures, top-p 1 / .95 / .5, min-p 0 /
 *    .05 / .3, penalties over a window that grows, logit bias with bans, logits with ties,
 *    NaN, -inf), batches of 1 .. 64 rows. Half of each batch repeats row 0 with draws u on
 *    a grid: the same token for every u means the same candidate set and cumulative
 *    probabilities to within the grid step. Every token must be equal (no softcap: the
 *    kernel rounds as the C code does; exp in double can differ from glibc's in the last
 *    bit, which only matters for a draw or a top-p target within ~1e-16 of a boundary).
 *    With a final softcap, tanhf on the device may differ by an ulp: mismatches are
 *    counted and must stay below 0.5 %.
 * 2. kiln_sample_batch (the CPU chain with its RNG) and the device path (the same seed,
 *    kiln_sampler_device_row, cuda.sample) give the same tokens step after step.
 * 3. The same seeds give the same tokens run to run (and a batch's row equals the row
 *    alone).
 * 4. End to end on a tiny synthetic llama: kiln_generate with the default sampling chain
 *    and a fixed seed on cuda (the device samples) equals cuda with KILN_HOST_SAMPLING=1
 *    (same logits, the host chain) for 4 seeds x 64 tokens; how many equal the cpu
 *    backend's run is printed (its logits differ in the last bits, so a sampled run may
 *    part from it where a draw falls between them).
 * Exits 77 (skipped), saying why, without a usable GPU or in a build without CUDA.
 */
#include "testutil.h"

#include "kernels/ref/ref_fused.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "sample/sample.h"
#include "sample_cases.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KILN_HAVE_CUDA
int main(void) {
    printf("SKIP: this build has no CUDA (KILN_CUDA=OFF)\n");
    return 77;
}
#else
#include "kernels/cuda/cuda_kernels.h"

#include <cuda_runtime.h>

#define MAXR  64
#define OVCAP 4096

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) fail_msg("%s: %s", #x, cudaGetErrorString(e_));                     \
    } while (0)

/* A batch on the host and its device copy. */
typedef struct batch {
    int32_t n, rows;
    float *lg; /* [rows][n] */
    kiln_sample_row_params rp[MAXR];
    int32_t ov_id[OVCAP], ov_count[OVCAP];
    float ov_bias[OVCAP];
    int32_t n_ov;
    float softcap;
    int32_t gpu[MAXR], gpu1[MAXR], ref[MAXR]; /* split path (workspace), one block a row, ref */
} batch;

static float *d_lg;
static size_t d_lg_cap;
static void *d_par;
static int32_t *d_ids;
static void *d_ws; /* the split path's workspace */
static size_t d_ws_cap;

/* cuda.sample and ref.sample on the batch. */
static void run_both(batch *b) {
    const size_t lb = (size_t)b->rows * (size_t)b->n * sizeof(float);
    if (lb > d_lg_cap) {
        if (d_lg) CK(cudaFree(d_lg));
        CK(cudaMalloc((void **)&d_lg, lb));
        d_lg_cap = lb;
    }
    CK(cudaMemcpy(d_lg, b->lg, lb, cudaMemcpyHostToDevice));
    uint8_t *p = d_par;
    const size_t rb = sizeof b->rp, ob = sizeof b->ov_id;
    CK(cudaMemcpy(p, b->rp, rb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p + rb, b->ov_id, ob, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p + rb + ob, b->ov_bias, ob, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p + rb + 2 * ob, b->ov_count, ob, cudaMemcpyHostToDevice));
    CK(cudaMemset(d_ids, 0x7f, MAXR * sizeof(int32_t))); /* poisoned */
    kiln_sample_args a = {.logits = d_lg,
                          .ld = b->n,
                          .t = b->rows,
                          .n = b->n,
                          .softcap = b->softcap,
                          .rows = (const kiln_sample_row_params *)(const void *)p,
                          .ov_id = (const int32_t *)(const void *)(p + rb),
                          .ov_bias = (const float *)(const void *)(p + rb + ob),
                          .ov_count = (const int32_t *)(const void *)(p + rb + 2 * ob),
                          .ids = d_ids};
    kiln_kctx c;
    memset(&c, 0, sizeof c);
    /* without workspace: one block per row */
    assert_int_equal(kiln_cuda_sample(&c, &a), KILN_OK);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(b->gpu1, d_ids, (size_t)b->rows * sizeof(int32_t), cudaMemcpyDeviceToHost));
    /* with it: the split path (bound, gather, finish), its workspace poisoned */
    const size_t ws = kiln_cuda_sample_ws_bytes(b->rows, b->n);
    assert_true(ws > 0);
    if (ws > d_ws_cap) {
        if (d_ws) CK(cudaFree(d_ws));
        CK(cudaMalloc(&d_ws, ws));
        d_ws_cap = ws;
    }
    CK(cudaMemset(d_ws, 0x5a, ws));
    CK(cudaMemset(d_ids, 0x7f, MAXR * sizeof(int32_t)));
    c.scratch = d_ws;
    c.scratch_size = ws;
    assert_int_equal(kiln_cuda_sample(&c, &a), KILN_OK);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(b->gpu, d_ids, (size_t)b->rows * sizeof(int32_t), cudaMemcpyDeviceToHost));
    kiln_sample_args h = a;
    h.logits = b->lg;
    h.rows = b->rp;
    h.ov_id = b->ov_id;
    h.ov_bias = b->ov_bias;
    h.ov_count = b->ov_count;
    h.ids = b->ref;
    assert_int_equal(kiln_ref_sample(NULL, &h), KILN_OK);
}

/* Builds a batch of `rows` rows for case c (seeded), runs both; returns the mismatches. */
static batch cb; /* case_batch's (its ids stay until the next call) */

static int case_batch(const kt_scase *c, int rows, uint64_t seed, float softcap, int *checked) {
    cb.n = c->n;
    cb.rows = rows;
    cb.softcap = softcap;
    cb.n_ov = 0;
    cb.lg = malloc((size_t)rows * (size_t)c->n * sizeof(float));
    assert_non_null(cb.lg);
    uint64_t x = seed * 104729 + 3;
    int used = 0;
    for (int r = 0; r < rows; r++) {
        kiln_logit_bias bias[16];
        kiln_sampler_params p;
        kt_sparams(c, seed + (uint64_t)r, bias, &p);
        kiln_sampler *s;
        assert_int_equal(kiln_sampler_create(&p, c->n, &s, NULL), KILN_OK);
        for (int i = 0; i < 40; i++)
            kiln_sampler_accept(s, (int32_t)(kt_srng(&x) % (uint64_t)(i % 3 ? 12 : c->n)));
        float *row = cb.lg + (size_t)r * (size_t)c->n;
        const bool grid = r > 0 && r >= rows / 2; /* row 0 again, u on a grid */
        if (grid)
            memcpy(row, cb.lg, (size_t)c->n * sizeof(float));
        else
            kt_slogits(row, c->n, c->kind, &x);
        if (!kiln_sampler_device_ok(s, c->n)) {
            kiln_sampler_free(s);
            free(cb.lg);
            return -1;
        }
        if (grid) {
            cb.rp[r] = cb.rp[0];
        } else {
            cb.rp[r].ov_off = cb.n_ov;
            assert_int_equal(kiln_sampler_device_row(s, c->n, &cb.rp[r], cb.ov_id + cb.n_ov,
                                                     cb.ov_bias + cb.n_ov, cb.ov_count + cb.n_ov,
                                                     OVCAP - cb.n_ov, NULL),
                             KILN_OK);
            cb.n_ov += cb.rp[r].n_ov;
        }
        if (grid) cb.rp[r].u = ((r - rows / 2) + 0.5) / (double)(rows - rows / 2);
        kiln_sampler_free(s);
        used++;
    }
    run_both(&cb);
    int bad = 0;
    for (int r = 0; r < rows; r++)
        if (cb.gpu[r] != cb.ref[r] || cb.gpu1[r] != cb.ref[r]) {
            if (bad < 3)
                print_message("  mismatch: n %d k %d t %g p %g m %g pen %g bias %d kind %d cap %g "
                              "row %d u %.17g: gpu %d (one block a row %d) ref %d\n",
                              (int)c->n, (int)c->k, c->temp, c->top_p, c->min_p, c->rep,
                              (int)c->n_bias, c->kind, softcap, r, cb.rp[r].u, (int)cb.gpu[r],
                              (int)cb.gpu1[r], (int)cb.ref[r]);
            bad++;
        }
    *checked += used;
    free(cb.lg);
    return bad;
}

static int gpu_ok(void) {
    char why[256];
    if (kiln_cuda_probe(NULL, why, sizeof why) <= 0) {
        printf("SKIP: %s\n", why);
        return 0;
    }
    return 1;
}

static int setup(void **state) {
    (void)state;
    if (!d_par) {
        if (cudaMalloc(&d_par, sizeof(kiln_sample_row_params) * MAXR + 3 * 4 * OVCAP) !=
                cudaSuccess ||
            cudaMalloc((void **)&d_ids, MAXR * sizeof(int32_t)) != cudaSuccess)
            return -1;
    }
    return 0;
}

static void test_kernel_vs_ref(void **state) {
    (void)state;
    static const int32_t ns[] = {7, 50, 1000, 5003, 32000, 50257, 128256, 151936, 262144};
    static const int bs[] = {1, 16, 64, 5, 33};
    kt_scase cs[512];
    int checked = 0, bad = 0, skipped = 0, cases = 0;
    for (size_t v = 0; v < sizeof ns / sizeof ns[0]; v++) {
        const int m = kt_scases(ns[v], cs, 512);
        /* the ref sorts every row: fewer cases and rows on large vocabularies */
        const int every = ns[v] >= 100000 ? 23 : ns[v] >= 30000 ? 7 : 1;
        for (int i = 0; i < m; i++) {
            if (i % every) continue;
            int rows = bs[(i / every) % 5];
            if (ns[v] >= 100000 && rows > 16) rows = 16;
            int r = case_batch(&cs[i], rows, 7000 * (uint64_t)v + (uint64_t)i, 0.0f, &checked);
            if (r < 0)
                skipped++;
            else
                bad += r, cases++;
        }
    }
    print_message("cuda.sample vs ref.sample: %d rows in %d cases, %d mismatches (%d cases "
                  "outside the device path)\n",
                  checked, cases, bad, skipped);
    assert_int_equal(bad, 0);
    assert_true(cases > 200);
}

static void test_softcap(void **state) {
    (void)state;
    kt_scase cs[512];
    int checked = 0, bad = 0;
    const int m = kt_scases(32000, cs, 512);
    for (int i = 0; i < m; i += 3) {
        int r = case_batch(&cs[i], 16, 91000 + (uint64_t)i, 30.0f, &checked);
        if (r > 0) bad += r;
    }
    print_message("softcap 30: %d rows, %d mismatches (tanhf on the device vs glibc)\n", checked,
                  bad);
    assert_true(bad * 200 <= checked);
}

/* The CPU chain (kiln_sample_batch, its RNG) vs the device path with the same seeds. */
static void test_cpu_chain_direct(void **state) {
    (void)state;
    const int32_t n = 128256;
    const int rows = 16, steps = 12;
    kiln_sampler *a[16], *b[16];
    kiln_logit_bias bias[16];
    static batch bt;
    bt.lg = malloc((size_t)rows * (size_t)n * sizeof(float));
    assert_non_null(bt.lg);
    for (int r = 0; r < rows; r++) {
        kt_scase c = {.n = n,
                      .k = r % 4 == 3 ? 1000 : 40,
                      .temp = r % 5 == 4 ? 0.0f : 0.8f,
                      .top_p = 0.95f,
                      .min_p = 0.05f,
                      .rep = r % 2 ? 1.1f : 1.0f,
                      .freq = r % 4 == 1 ? 0.2f : 0.0f,
                      .pres = 0,
                      .last_n = 64,
                      .n_bias = r % 3 == 0 ? 4 : 0,
                      .kind = r % 4};
        kiln_sampler_params p;
        kt_sparams(&c, 500 + (uint64_t)r, bias, &p);
        assert_int_equal(kiln_sampler_create(&p, n, &a[r], NULL), KILN_OK);
        assert_int_equal(kiln_sampler_create(&p, n, &b[r], NULL), KILN_OK);
    }
    uint64_t x = 42;
    int same = 0;
    for (int st = 0; st < steps; st++) {
        bt.n = n;
        bt.rows = rows;
        bt.softcap = 0;
        bt.n_ov = 0;
        kiln_sample_row sr[16];
        kiln_sample_out so[16];
        for (int r = 0; r < rows; r++) {
            float *row = bt.lg + (size_t)r * (size_t)n;
            kt_slogits(row, n, r % 4, &x);
            sr[r] = (kiln_sample_row){a[r], row};
            assert_true(kiln_sampler_device_ok(b[r], n));
            bt.rp[r].ov_off = bt.n_ov;
            assert_int_equal(kiln_sampler_device_row(b[r], n, &bt.rp[r], bt.ov_id + bt.n_ov,
                                                     bt.ov_bias + bt.n_ov, bt.ov_count + bt.n_ov,
                                                     OVCAP - bt.n_ov, NULL),
                             KILN_OK);
            bt.n_ov += bt.rp[r].n_ov;
        }
        assert_int_equal(kiln_sample_batch(sr, rows, n, so, NULL), KILN_OK);
        run_both(&bt);
        for (int r = 0; r < rows; r++) {
            if (bt.gpu[r] != so[r].token)
                fail_msg("step %d row %d: cpu chain %d, gpu %d", st, r, (int)so[r].token,
                         (int)bt.gpu[r]);
            same++;
            kiln_sampler_accept(a[r], so[r].token);
            kiln_sampler_accept(b[r], so[r].token);
        }
    }
    print_message("cpu chain vs gpu: %d tokens equal\n", same);
    for (int r = 0; r < rows; r++) {
        kiln_sampler_free(a[r]);
        kiln_sampler_free(b[r]);
    }
    free(bt.lg);
}

/* Run to run, and a row alone equals the same row inside a batch of 64. */
static void test_repeatable(void **state) {
    (void)state;
    kt_scase c = {.n = 262144,
                  .k = 40,
                  .temp = 0.8f,
                  .top_p = 0.95f,
                  .min_p = 0.05f,
                  .rep = 1.1f,
                  .freq = 0,
                  .pres = 0,
                  .last_n = 64,
                  .n_bias = 0,
                  .kind = 0};
    int checked = 0;
    int32_t first[MAXR];
    for (int rep = 0; rep < 3; rep++) {
        assert_int_equal(case_batch(&c, 64, 77, 0.0f, &checked), 0);
        if (rep == 0)
            memcpy(first, cb.gpu, sizeof first);
        else
            assert_memory_equal(first, cb.gpu, sizeof first);
    }
    assert_int_equal(case_batch(&c, 1, 77, 0.0f, &checked), 0);
    assert_int_equal(cb.gpu[0], first[0]);
    print_message("repeatable: %d rows\n", checked);
}

/* ---- end to end ---- */

typedef struct collect {
    int32_t ids[256];
    int n;
} collect;

static int on_token(void *user, int32_t token, const char *text, size_t len) {
    (void)text;
    (void)len;
    collect *c = user;
    if (token >= 0 && c->n < 256) c->ids[c->n++] = token;
    return 0;
}

static void gen_run(kiln_model *m, const char *backend, bool host, uint64_t seed, collect *c) {
    kiln_engine_opts eo;
    kiln_engine_opts_default(&eo);
    eo.backend = backend;
    eo.n_threads = 2;
    eo.n_ctx = 512;
    eo.max_step_tokens = 64;
    eo.max_seqs = 2;
    kiln_engine *e = NULL;
    kiln_err *err = kiln_err_new();
    if (kiln_engine_create(m, &eo, &e, err)) fail_msg("%s", kiln_err_message(err));
    if (host)
        setenv("KILN_HOST_SAMPLING", "1", 1);
    else
        unsetenv("KILN_HOST_SAMPLING");
    kiln_gen_params p;
    kiln_gen_params_default(&p); /* t 0.8, k 40, p .95, min-p .05 */
    p.n_predict = 64;
    p.seed = seed;
    p.ignore_eos = 1;
    memset(c, 0, sizeof *c);
    if (kiln_generate(e, m, "The capital of France is", &p, on_token, c, err))
        fail_msg("%s", kiln_err_message(err));
    unsetenv("KILN_HOST_SAMPLING");
    kiln_engine_free(e);
    kiln_err_free(err);
}

static void test_generate_e2e(void **state) {
    (void)state;
    char vocab[1024], model[1024], cmd[4096];
    if (!getenv("KILN_BINARY_DIR"))
        fail_msg("KILN_BINARY_DIR is not set: run this test through ctest, or set it to the build "
                 "directory holding kiln-gen");
    snprintf(vocab, sizeof vocab, "%s/testdata/tokenizer/ggml-vocab-llama-spm.gguf",
             kt_shared_dir());
    snprintf(model, sizeof model, "%s", kt_write_temp("", 0, ".gguf"));
    snprintf(cmd, sizeof cmd, "'%s/kiln-gen' -q -p tiny -f llama -t q8_0 -s 7 --vocab '%s' -o '%s'",
             getenv("KILN_BINARY_DIR"), vocab, model);
    assert_int_equal(system(cmd), 0);
    kiln_model *m = NULL;
    kiln_err *err = kiln_err_new();
    if (kiln_model_load(model, &m, err) || kiln_model_load_tokenizer(m, err))
        fail_msg("%s", kiln_err_message(err));
    int eq_cpu = 0, runs = 0;
    for (uint64_t seed = 1; seed <= 4; seed++) {
        collect dev, host, cpu;
        gen_run(m, "cuda", false, seed, &dev);
        gen_run(m, "cuda", true, seed, &host);
        gen_run(m, "cpu", true, seed, &cpu);
        assert_int_equal(dev.n, 64);
        assert_int_equal(host.n, 64);
        for (int i = 0; i < 64; i++)
            if (dev.ids[i] != host.ids[i])
                fail_msg("seed %d token %d: device sampling %d, host sampling %d", (int)seed, i,
                         (int)dev.ids[i], (int)host.ids[i]);
        int same = cpu.n == dev.n && memcmp(cpu.ids, dev.ids, sizeof(int32_t) * 64) == 0;
        if (!same) {
            int i = 0;
            while (i < 64 && cpu.ids[i] == dev.ids[i]) i++;
            print_message("seed %d: cuda and cpu backends part at token %d\n", (int)seed, i);
        }
        eq_cpu += same;
        runs++;
    }
    /* the cpu backend's logits differ from cuda's in the last bits (test_cuda_e2e bounds
     * them: top-1 >= 99.9 %, KL < 1e-4); a sampled continuation parts where a draw or a
     * top-p / min-p boundary falls between the two (session 10: 3 of 4 seeds equal over 64
     * tokens, seed 2 parted at token 29 while device == host sampling held on every seed):
     * reported, not asserted */
    print_message("generate: cuda (device sampling) == cuda (host sampling) on %d seeds; == cpu "
                  "backend on %d of %d\n",
                  runs, eq_cpu, runs);
    kiln_model_free(m);
    kiln_err_free(err);
    remove(model);
}

int main(void) {
    if (!gpu_ok()) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_kernel_vs_ref, setup),
        cmocka_unit_test_setup(test_softcap, setup),
        cmocka_unit_test_setup(test_cpu_chain_direct, setup),
        cmocka_unit_test_setup(test_repeatable, setup),
        cmocka_unit_test(test_generate_e2e),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
