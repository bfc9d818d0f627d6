/* test_select.c — the selection pipeline on a fake registry: every reason code, scoring
 * (priority, prefer, small-batch hint, PerfDB), locks, fallback, strict mode, cache
 * soundness and thread safety, dispatch tables and the circuit breaker. */
#include "base/log.h"
#include "kernels/perfdb.h"
#include "kernels/select.h"
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static int calls_ok, calls_bad;
static kiln_status mm_ok(const kiln_kctx *c, const kiln_matmul_args *a) {
    (void)c, (void)a;
    calls_ok++;
    return KILN_OK;
}
static kiln_status mm_bad(const kiln_kctx *c, const kiln_matmul_args *a) {
    (void)c, (void)a;
    calls_bad++;
    return KILN_ERR_DEVICE;
}
static kiln_status at_ok(const kiln_kctx *c, const kiln_attention_args *a) {
    (void)c, (void)a;
    return KILN_OK;
}
static bool probe_no(char *why, size_t n) {
    snprintf(why, n, "libfake.so.1: cannot open shared object file");
    return false;
}
static size_t ws_big(const kiln_sel_ctx *c) {
    return (size_t)c->k * 1024 * 1024;
}

#define F32 KILN_DT(KILN_DTYPE_F32)
#define DP  (KILN_KPROP_DETERMINISTIC | KILN_KPROP_BATCH_INVARIANT)

static const kiln_kernel_spec fref_specs[] = {
    {.id = "ref.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "ref",
     .w_dtypes = KILN_DT_FLOATS | KILN_DT_QUANTS,
     .act_dtypes = F32,
     .features = KILN_KFEAT_BIAS,
     .props = DP,
     .priority = 10,
     .fn.matmul = mm_ok},
    {.id = "ref.attention",
     .op = KILN_KOP_ATTENTION,
     .provider = "ref",
     .act_dtypes = F32,
     .kv_dtypes = F32 | KILN_DT(KILN_DTYPE_F16),
     .features = 0x1f,
     .props = DP,
     .priority = 10,
     .fn.attention = at_ok},
};
static const kiln_provider fref = {
    .name = "ref", .specs = fref_specs, .n_specs = 2, .fallback = true};

static const kiln_kernel_spec fast_specs[] = {
    /* 0: wants avx512 + q4_K, k % 256 */
    {.id = "fast.avx512.matmul.q4_k",
     .op = KILN_KOP_MATMUL,
     .provider = "fast",
     .isa = KILN_ISA_AVX512F,
     .w_dtypes = KILN_DT(KILN_DTYPE_Q4_K),
     .act_dtypes = F32,
     .k_multiple = 256,
     .props = DP,
     .priority = 80,
     .fn.matmul = mm_ok},
    /* 1: avx2, q4_K, decode only, nondeterministic */
    {.id = "fast.avx2.matmul.q4_k",
     .op = KILN_KOP_MATMUL,
     .provider = "fast",
     .isa = KILN_ISA_AVX2,
     .w_dtypes = KILN_DT(KILN_DTYPE_Q4_K),
     .act_dtypes = F32,
     .max_tokens = 1,
     .props = 0,
     .priority = 70,
     .fn.matmul = mm_ok},
    /* 2: huge workspace */
    {.id = "fast.ws.matmul.q4_k",
     .op = KILN_KOP_MATMUL,
     .provider = "fast",
     .w_dtypes = KILN_DT(KILN_DTYPE_Q4_K),
     .act_dtypes = F32,
     .props = DP,
     .workspace = ws_big,
     .priority = 60,
     .fn.matmul = mm_ok},
    /* 3: attention with limits */
    {.id = "fast.attention",
     .op = KILN_KOP_ATTENTION,
     .provider = "fast",
     .act_dtypes = F32,
     .kv_dtypes = KILN_DT(KILN_DTYPE_F16),
     .head_dim_min = 64,
     .head_dim_max = 256,
     .head_dim_multiple = 64,
     .max_seq = 4096,
     .features = KILN_KFEAT_CAUSAL | KILN_KFEAT_PAGED_KV,
     .props = DP,
     .priority = 80,
     .fn.attention = at_ok},
    /* 4: another q4_K kernel that fails at run time */
    {.id = "fast.flaky.matmul.q4_k",
     .op = KILN_KOP_MATMUL,
     .provider = "fast",
     .w_dtypes = KILN_DT(KILN_DTYPE_Q4_K),
     .act_dtypes = F32,
     .props = DP,
     .priority = 90,
     .fn.matmul = mm_bad},
};
static const kiln_provider fast = {.name = "fast", .specs = fast_specs, .n_specs = 5};

static const kiln_kernel_spec gpu_specs[] = {
    {.id = "gpu.attention",
     .op = KILN_KOP_ATTENTION,
     .provider = "gpu",
     .platform = KILN_PLATFORM_CUDA,
     .sm_min = 80,
     .sm_max = 89,
     .act_dtypes = F32,
     .kv_dtypes = KILN_DT(KILN_DTYPE_F16),
     .features = 0x1f,
     .props = KILN_KPROP_GRAPH_SAFE,
     .priority = 90,
     .fn.attention = at_ok},
    {.id = "gpu.ref.attention",
     .op = KILN_KOP_ATTENTION,
     .provider = "gpu",
     .platform = KILN_PLATFORM_CUDA,
     .act_dtypes = F32,
     .kv_dtypes = KILN_DT(KILN_DTYPE_F16),
     .features = 0x1f,
     .props = DP,
     .priority = 5,
     .fn.attention = at_ok},
};
static const kiln_provider gpu = {.name = "gpu", .specs = gpu_specs, .n_specs = 2};

static const kiln_kernel_spec gone_specs[] = {
    {.id = "gone.matmul.q4_k",
     .op = KILN_KOP_MATMUL,
     .provider = "gone",
     .w_dtypes = KILN_DT(KILN_DTYPE_Q4_K),
     .act_dtypes = F32,
     .props = DP,
     .priority = 99,
     .fn.matmul = mm_ok},
};
static const kiln_provider gone = {
    .name = "gone", .specs = gone_specs, .n_specs = 1, .probe = probe_no};

static kiln_registry *reg;

static int setup(void **state) {
    (void)state;
    const kiln_provider *ps[] = {&fref, &fast, &gpu, &gone};
    kiln_err e;
    return kiln_registry_new(ps, 4, NULL, &reg, &e) == KILN_OK ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    kiln_registry_free(reg);
    return 0;
}

static void mm_ctx(kiln_sel_ctx *c, uint32_t isa) {
    kiln_sel_ctx_init(c, KILN_KOP_MATMUL, KILN_BACKEND_CPU);
    c->isa = isa;
    c->w_dtype = KILN_DTYPE_Q4_K;
    c->n = 640;
    c->k = 2048;
    kiln_sel_ctx_set_bucket(c, 0, 0, 0, 0);
}

static const kiln_sel_cand *cand(const kiln_sel_result *r, const char *id) {
    for (int i = 0; i < r->n_cands; i++)
        if (!strcmp(r->cands[i].k->spec.id, id)) return &r->cands[i];
    fail_msg("candidate %s missing", id);
    return NULL;
}
#define HAS(r, id, code) (cand(r, id)->reasons & KILN_REASON_BIT(KILN_REASON_##code))

static void test_reasons_matmul(void **state) {
    (void)state;
    kiln_policy pol;
    kiln_policy_init(&pol);
    kiln_selector *s;
    kiln_err e;
    assert_int_equal(kiln_selector_new(reg, &pol, NULL, &s, &e), KILN_OK);
    kiln_sel_ctx c;
    kiln_sel_result r;
    /* avx2-only machine, 64 tokens, k = 2000 (not a multiple of 256) */
    mm_ctx(&c, KILN_ISA_AVX2 | KILN_ISA_FMA);
    c.k = 2000;
    c.deterministic = true;
    c.headroom_bytes = 100u << 20;
    kiln_sel_ctx_set_bucket(&c, 2, 0, 0, 0);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_true(HAS(&r, "fast.avx512.matmul.q4_k", ISA_MISSING));
    assert_true(HAS(&r, "fast.avx512.matmul.q4_k", SHAPE_ALIGNMENT));
    assert_true(HAS(&r, "fast.avx2.matmul.q4_k", TOO_MANY_TOKENS));
    assert_true(HAS(&r, "fast.avx2.matmul.q4_k", NON_DETERMINISTIC));
    assert_true(HAS(&r, "fast.ws.matmul.q4_k", WORKSPACE_EXCEEDS_HEADROOM));
    assert_true(HAS(&r, "gone.matmul.q4_k", PROVIDER_UNAVAILABLE));
    /* the flaky kernel is valid and has the best priority */
    assert_string_equal(r.chosen->spec.id, "fast.flaky.matmul.q4_k");
    assert_int_equal(r.cands[0].k, r.chosen);
    char msg[512];
    kiln_reasons_format(cand(&r, "fast.avx512.matmul.q4_k")->reasons, s,
                        cand(&r, "fast.avx512.matmul.q4_k")->k, &c, msg, sizeof msg);
    assert_non_null(strstr(msg, "ISA_MISSING (needs avx512f)"));
    assert_non_null(strstr(msg, "SHAPE_ALIGNMENT"));
    kiln_reasons_format(cand(&r, "gone.matmul.q4_k")->reasons, s, cand(&r, "gone.matmul.q4_k")->k,
                        &c, msg, sizeof msg);
    assert_non_null(strstr(msg, "libfake.so.1"));
    /* batch invariance: avx2 kernel lacks it */
    c.deterministic = false;
    c.batch_invariant = true;
    kiln_sel_ctx_set_bucket(&c, 0, 0, 0, 0);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_true(HAS(&r, "fast.avx2.matmul.q4_k", NOT_BATCH_INVARIANT));
    assert_false(HAS(&r, "fast.avx2.matmul.q4_k", TOO_MANY_TOKENS));
    /* dtype */
    c.w_dtype = KILN_DTYPE_Q8_0;
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_true(HAS(&r, "fast.avx512.matmul.q4_k", DTYPE_UNSUPPORTED));
    assert_string_equal(r.chosen->spec.id, "ref.matmul");
    assert_false(r.fallback); /* ref was simply the only valid one */
    /* feature: bias */
    c.w_dtype = KILN_DTYPE_Q4_K;
    c.features = KILN_KFEAT_BIAS;
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_true(HAS(&r, "fast.flaky.matmul.q4_k", FEATURE_UNSUPPORTED));
    /* platform: a CUDA call site rejects host kernels */
    mm_ctx(&c, 0);
    c.backend = KILN_BACKEND_CUDA;
    assert_int_not_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK); /* not even the fallback */
    assert_true(HAS(&r, "ref.matmul", PLATFORM_MISMATCH));
    assert_non_null(strstr(e.msg, "no kernel for matmul on cuda"));
    kiln_selector_free(s);
}

static void test_reasons_attention(void **state) {
    (void)state;
    kiln_selector *s;
    kiln_err e;
    assert_int_equal(kiln_selector_new(reg, NULL, NULL, &s, &e), KILN_OK);
    kiln_sel_ctx c;
    kiln_sel_result r;
    kiln_sel_ctx_init(&c, KILN_KOP_ATTENTION, KILN_BACKEND_CPU);
    c.kv_dtype = KILN_DTYPE_F16;
    c.head_dim = 96; /* in range, not a multiple of 64 */
    c.n_head = 8, c.n_kv_head = 2;
    c.features = KILN_KFEAT_GQA | KILN_KFEAT_CAUSAL | KILN_KFEAT_PAGED_KV | KILN_KFEAT_SOFTCAP;
    kiln_sel_ctx_set_bucket(&c, 0, 2, 0, 32768);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_true(HAS(&r, "fast.attention", HEAD_DIM_ALIGNMENT));
    assert_true(HAS(&r, "fast.attention", SEQ_TOO_LONG));
    assert_true(HAS(&r, "fast.attention", GQA_UNSUPPORTED));
    assert_true(HAS(&r, "fast.attention", FEATURE_UNSUPPORTED));
    assert_true(HAS(&r, "gpu.attention", PLATFORM_MISMATCH));
    assert_string_equal(r.chosen->spec.id, "ref.attention");
    c.head_dim = 512;
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_true(HAS(&r, "fast.attention", HEAD_DIM_INVALID));
    /* CUDA: SM range and graph safety */
    kiln_sel_ctx_init(&c, KILN_KOP_ATTENTION, KILN_BACKEND_CUDA);
    c.kv_dtype = KILN_DTYPE_F16;
    c.head_dim = 128;
    c.sm = 75;
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_true(HAS(&r, "gpu.attention", SM_TOO_OLD));
    assert_string_equal(r.chosen->spec.id, "gpu.ref.attention");
    c.sm = 90;
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_true(HAS(&r, "gpu.attention", SM_TOO_NEW));
    c.sm = 86;
    c.graph_capture = true;
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_string_equal(r.chosen->spec.id, "gpu.attention");
    assert_true(HAS(&r, "gpu.ref.attention", GRAPH_UNSAFE));
    kiln_selector_free(s);
}

static void test_policy_reasons(void **state) {
    (void)state;
    kiln_policy pol;
    kiln_policy_init(&pol);
    snprintf(pol.avoid.name[0], KILN_POLICY_NAME_MAX, "fast");
    pol.avoid.n = 1;
    kiln_policy_rehash(&pol);
    kiln_selector *s;
    kiln_err e;
    assert_int_equal(kiln_selector_new(reg, &pol, NULL, &s, &e), KILN_OK);
    kiln_sel_ctx c;
    kiln_sel_result r;
    mm_ctx(&c, 0xffff);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_true(HAS(&r, "fast.flaky.matmul.q4_k", POLICY_AVOIDED));
    assert_false(HAS(&r, "ref.matmul", POLICY_AVOIDED)); /* fallbacks are never avoided */
    assert_string_equal(r.chosen->spec.id, "ref.matmul");
    /* lock: wins over avoid; others get POLICY_LOCKED */
    snprintf(pol.locks[KILN_KOP_MATMUL], KILN_POLICY_NAME_MAX, "fast.avx512.matmul.q4_k");
    pol.lock_src[KILN_KOP_MATMUL] = KILN_POLICY_SRC_FILE;
    kiln_policy_rehash(&pol);
    kiln_selector_set_policy(s, &pol);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_string_equal(r.chosen->spec.id, "fast.avx512.matmul.q4_k");
    assert_true(r.locked);
    assert_true(HAS(&r, "ref.matmul", POLICY_LOCKED));
    /* a lock that cannot run is ignored (note), or an error in strict mode */
    mm_ctx(&c, KILN_ISA_AVX2);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_false(r.locked);
    assert_non_null(strstr(r.note, "ignored"));
    pol.strict = true;
    kiln_policy_rehash(&pol);
    kiln_selector_set_policy(s, &pol);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_ERR_UNSUPPORTED);
    /* reference_only */
    kiln_policy_init(&pol);
    pol.reference_only = true;
    kiln_policy_rehash(&pol);
    kiln_selector_set_policy(s, &pol);
    mm_ctx(&c, 0xffff);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_string_equal(r.chosen->spec.id, "ref.matmul");
    assert_true(HAS(&r, "fast.avx512.matmul.q4_k", POLICY_AVOIDED));
    /* prefer: +50 lifts avx512 (80) above flaky (90) */
    kiln_policy_init(&pol);
    snprintf(pol.prefer.name[0], KILN_POLICY_NAME_MAX, "fast.avx512.*");
    pol.prefer.n = 1;
    kiln_policy_rehash(&pol);
    kiln_selector_set_policy(s, &pol);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_string_equal(r.chosen->spec.id, "fast.avx512.matmul.q4_k");
    assert_true(r.score > 129.9 && r.score < 130.1);
    kiln_selector_free(s);
}

static void test_fallback_and_strict(void **state) {
    (void)state;
    kiln_policy pol;
    kiln_policy_init(&pol);
    kiln_selector *s;
    kiln_err e;
    assert_int_equal(kiln_selector_new(reg, &pol, NULL, &s, &e), KILN_OK);
    kiln_sel_ctx c;
    kiln_sel_result r;
    mm_ctx(&c, 0xffff);
    c.graph_capture = true; /* no host kernel is graph safe: only the fallback remains */
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_true(r.fallback);
    assert_string_equal(r.chosen->spec.id, "ref.matmul");
    assert_true(HAS(&r, "ref.matmul", GRAPH_UNSAFE));
    pol.strict = true;
    kiln_policy_rehash(&pol);
    kiln_selector_set_policy(s, &pol);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "strict"));
    assert_non_null(strstr(e.msg, "GRAPH_UNSAFE"));
    kiln_selector_free(s);
}

static void test_perf_scores(void **state) {
    (void)state;
    kiln_perf_table *t;
    kiln_err e;
    assert_int_equal(kiln_perf_table_new(&t, &e), KILN_OK);
    kiln_selector *s;
    assert_int_equal(kiln_selector_new(reg, NULL, t, &s, &e), KILN_OK);
    kiln_sel_ctx c;
    kiln_sel_result r;
    mm_ctx(&c, 0xffff);
    kiln_sel_ctx_set_bucket(&c, 3, 0, 0, 0);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_string_equal(r.chosen->spec.id, "fast.flaky.matmul.q4_k");
    uint64_t before = kiln_selector_state_hash(s);
    /* measured: flaky is 3x slower than avx512 with many samples */
    kiln_perf_rec rec = {.op = KILN_KOP_MATMUL,
                         .dtype = KILN_DTYPE_Q4_K,
                         .tok_bucket = 3,
                         .median_us = 300,
                         .p95_us = 320,
                         .samples = 100,
                         .variance_us2 = 25};
    kiln_perf_ctx_shape(&c, rec.shape, sizeof rec.shape);
    snprintf(rec.kernel_id, sizeof rec.kernel_id, "fast.flaky.matmul.q4_k");
    assert_int_equal(kiln_perf_table_add(t, &rec, &e), KILN_OK);
    snprintf(rec.kernel_id, sizeof rec.kernel_id, "fast.avx512.matmul.q4_k");
    rec.median_us = 100;
    assert_int_equal(kiln_perf_table_add(t, &rec, &e), KILN_OK);
    kiln_selector_set_perf(s, t);
    assert_int_not_equal(kiln_selector_state_hash(s), before);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_string_equal(r.chosen->spec.id, "fast.avx512.matmul.q4_k");
    const kiln_sel_cand *fl = cand(&r, "fast.flaky.matmul.q4_k");
    assert_true(fl->perf_adj < -35 && fl->perf_adj >= -KILN_SCORE_PERF_MAX_MALUS);
    assert_true(r.cands[0].perf_adj > 9 && r.cands[0].perf_adj <= KILN_SCORE_PERF_MAX_BONUS);
    /* low confidence (2 samples, huge variance) moves scores much less */
    rec.samples = 2;
    rec.variance_us2 = 1e4;
    assert_int_equal(kiln_perf_table_add(t, &rec, &e), KILN_OK);
    snprintf(rec.kernel_id, sizeof rec.kernel_id, "fast.flaky.matmul.q4_k");
    rec.median_us = 300;
    rec.variance_us2 = 9e4;
    assert_int_equal(kiln_perf_table_add(t, &rec, &e), KILN_OK);
    kiln_selector_set_perf(s, t);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_string_equal(r.chosen->spec.id, "fast.flaky.matmul.q4_k");
    kiln_selector_free(s);
    kiln_perf_table_free(t);
}

/* Cache soundness: every validity field changed alone gives a miss, and the result is
 * the same as an uncached selection of that context. */
static void test_cache_soundness(void **state) {
    (void)state;
    kiln_selector *s;
    kiln_err e;
    assert_int_equal(kiln_selector_new(reg, NULL, NULL, &s, &e), KILN_OK);
    kiln_sel_ctx base;
    mm_ctx(&base, 0xffff);
    kiln_sel_result r, r2;
    assert_int_equal(kiln_select(s, &base, 0, &r, &e), KILN_OK);
    assert_false(r.cached);
    assert_int_equal(kiln_select(s, &base, 0, &r, &e), KILN_OK);
    assert_true(r.cached);
    kiln_sel_ctx v[20];
    int n = 0;
#define VARY(stmt)                                                                                 \
    do {                                                                                           \
        v[n] = base;                                                                               \
        kiln_sel_ctx *x = &v[n++];                                                                 \
        stmt;                                                                                      \
    } while (0)
    VARY(x->backend = KILN_BACKEND_REF);
    VARY(x->isa = KILN_ISA_AVX2);
    VARY(x->sm = 80);
    VARY(x->w_dtype = KILN_DTYPE_Q8_0);
    VARY(x->act_dtype = KILN_DTYPE_F16);
    VARY(x->kv_dtype = KILN_DTYPE_F16);
    VARY(x->tokens_max = 2);
    VARY(x->seq_max = 100);
    VARY(x->n = 641);
    VARY(x->k = 2304);
    VARY(x->head_dim = 64);
    VARY(x->n_head = 4);
    VARY(x->n_kv_head = 1);
    VARY(x->features = KILN_KFEAT_BIAS);
    VARY(x->deterministic = true);
    VARY(x->batch_invariant = true);
    VARY(x->graph_capture = true);
    VARY(x->headroom_bytes = 1);
    VARY(x->tok_bucket = 1);
    VARY(x->seq_bucket = 1);
    uint64_t want_hits = 1;
    for (int i = 0; i < n; i++) {
        kiln_status a = kiln_select(s, &v[i], 0, &r, &e);
        assert_false(r.cached);
        kiln_status b = kiln_select(s, &v[i], KILN_SEL_NO_CACHE, &r2, &e);
        assert_int_equal(a, b);
        if (!a) assert_ptr_equal(r.chosen, r2.chosen);
        kiln_select(s, &v[i], 0, &r, &e);
        if (!a) assert_true(r.cached);
        if (!a) want_hits++;
    }
    /* the original still hits; a health change invalidates */
    assert_int_equal(kiln_select(s, &base, 0, &r, &e), KILN_OK);
    assert_true(r.cached);
    const kiln_reg_kernel *k = r.chosen;
    kiln_selector_mark_unhealthy(s, k->index);
    assert_int_equal(kiln_select(s, &base, 0, &r, &e), KILN_OK);
    assert_false(r.cached);
    assert_ptr_not_equal(r.chosen, k);
    assert_true(HAS(&r, k->spec.id, BACKEND_UNHEALTHY));
    uint64_t hits, misses;
    kiln_selector_cache_stats(s, &hits, &misses);
    assert_int_equal(hits, want_hits + 1);
    assert_true(want_hits > 10);
    kiln_selector_free(s);
}

typedef struct thr {
    kiln_selector *s;
    int bad;
} thr;
static void *hammer(void *arg) {
    thr *t = arg;
    kiln_err e;
    for (int i = 0; i < 4000; i++) {
        kiln_sel_ctx c;
        mm_ctx(&c, (i & 1) ? 0xffff : KILN_ISA_AVX2);
        c.n = 64 + (i % 37);
        kiln_sel_ctx_set_bucket(&c, i % KILN_TOK_BUCKETS, 0, 0, 0);
        kiln_sel_result r;
        if (kiln_select(t->s, &c, 0, &r, &e)) t->bad++;
        const char *want = (i & 1) ? "fast.flaky.matmul.q4_k" : "fast.flaky.matmul.q4_k";
        if (strcmp(r.chosen->spec.id, want)) t->bad++;
    }
    return NULL;
}

static void test_cache_threads(void **state) {
    (void)state;
    kiln_selector *s;
    kiln_err e;
    assert_int_equal(kiln_selector_new(reg, NULL, NULL, &s, &e), KILN_OK);
    pthread_t th[4];
    thr t[4];
    for (int i = 0; i < 4; i++) {
        t[i] = (thr){s, 0};
        pthread_create(&th[i], NULL, hammer, &t[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(t[i].bad, 0);
    }
    kiln_selector_free(s);
}

/* per bucket: matmul and attention choices as the binding asks for them (attention by
 * context); the circuit breaker's mark moves a bucket to the next candidate */
static void test_buckets_and_breaker(void **state) {
    (void)state;
    kiln_selector *s;
    kiln_err e;
    assert_int_equal(kiln_selector_new(reg, NULL, NULL, &s, &e), KILN_OK);
    kiln_sel_ctx mm, at;
    mm_ctx(&mm, KILN_ISA_AVX2);
    kiln_sel_ctx_init(&at, KILN_KOP_ATTENTION, KILN_BACKEND_CPU);
    at.kv_dtype = KILN_DTYPE_F16;
    at.head_dim = 128;
    at.n_head = at.n_kv_head = 4;
    at.features = KILN_KFEAT_CAUSAL | KILN_KFEAT_PAGED_KV;
    kiln_sel_result r;
    /* matmul: every token bucket -> flaky (prio 90) */
    for (int tb = 0; tb < KILN_TOK_BUCKETS; tb++) {
        kiln_sel_ctx c = mm;
        kiln_sel_ctx_set_bucket(&c, tb, 0, 100, 0);
        assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
        assert_string_equal(r.chosen->spec.id, "fast.flaky.matmul.q4_k");
    }
    /* attention: fast up to 4K context, ref beyond */
    static const struct {
        int64_t seq;
        const char *id;
    } want[] = {{100, "fast.attention"},
                {4000, "fast.attention"},
                {5000, "ref.attention"},
                {50000, "ref.attention"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        kiln_sel_ctx c = at;
        kiln_sel_ctx_set_bucket(&c, 0, kiln_seq_bucket(want[i].seq), 0, 8192);
        assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
        assert_string_equal(r.chosen->spec.id, want[i].id);
    }
    /* run: the flaky kernel fails; marked unhealthy, the next candidate takes over */
    kiln_sel_ctx c = mm;
    kiln_sel_ctx_set_bucket(&c, 0, 0, 100, 0);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    kiln_matmul_args a;
    memset(&a, 0, sizeof a);
    calls_ok = calls_bad = 0;
    assert_int_not_equal(r.chosen->spec.fn.matmul(NULL, &a), KILN_OK);
    kiln_selector_mark_unhealthy(s, r.chosen->index);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_string_equal(r.chosen->spec.id, "fast.avx2.matmul.q4_k");
    kiln_sel_ctx_set_bucket(&c, kiln_tok_bucket(8), 0, 100, 0);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_string_equal(r.chosen->spec.id, "fast.ws.matmul.q4_k");
    kiln_sel_ctx_set_bucket(&c, 0, 0, 100, 0);
    assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
    assert_int_equal(r.chosen->spec.fn.matmul(NULL, &a), KILN_OK);
    assert_int_equal(calls_ok, 1);
    assert_int_equal(calls_bad, 1);
    kiln_selector_free(s);
}

/* nothing but the fallback can run: it is chosen and flagged, every bucket */
static void test_fallback_flagged(void **state) {
    (void)state;
    kiln_selector *s;
    kiln_err e;
    assert_int_equal(kiln_selector_new(reg, NULL, NULL, &s, &e), KILN_OK);
    kiln_sel_ctx c;
    mm_ctx(&c, 0xffff);
    c.graph_capture = true; /* nothing but the fallback */
    for (int tb = 0; tb < KILN_TOK_BUCKETS; tb++) {
        kiln_sel_ctx_set_bucket(&c, tb, 0, 0, 0);
        kiln_sel_result r;
        assert_int_equal(kiln_select(s, &c, 0, &r, &e), KILN_OK);
        assert_string_equal(r.chosen->spec.id, "ref.matmul");
        assert_true(r.fallback);
    }
    kiln_selector_free(s);
}

static void test_buckets(void **state) {
    (void)state;
    assert_int_equal(kiln_tok_bucket(1), 0);
    assert_int_equal(kiln_tok_bucket(2), 1);
    assert_int_equal(kiln_tok_bucket(8), 1);
    assert_int_equal(kiln_tok_bucket(9), 2);
    assert_int_equal(kiln_tok_bucket(64), 2);
    assert_int_equal(kiln_tok_bucket(65), 3);
    assert_int_equal(kiln_tok_bucket(512), 3);
    assert_int_equal(kiln_tok_bucket(513), 4);
    assert_int_equal(kiln_seq_bucket(512), 0);
    assert_int_equal(kiln_seq_bucket(513), 1);
    assert_int_equal(kiln_seq_bucket(40000), 3);
    /* one bucket function: the bounds and names tables agree with kiln_tok_bucket /
     * kiln_seq_bucket at every edge */
    for (int b = 0; b < KILN_TOK_BUCKETS; b++) {
        assert_int_equal(kiln_tok_bucket(kiln_tok_bucket_max(b)), b);
        if (b + 1 < KILN_TOK_BUCKETS)
            assert_int_equal(kiln_tok_bucket(kiln_tok_bucket_max(b) + 1), b + 1);
        int from_name = -1;
        assert_true(kiln_tok_bucket_from_name(kiln_tok_bucket_name(b), &from_name));
        assert_int_equal(from_name, b);
    }
    for (int b = 0; b < KILN_SEQ_BUCKETS; b++) {
        assert_int_equal(kiln_seq_bucket(kiln_seq_bucket_max(b)), b);
        if (b + 1 < KILN_SEQ_BUCKETS)
            assert_int_equal(kiln_seq_bucket(kiln_seq_bucket_max(b) + 1), b + 1);
    }
    for (int r = 0; r < KILN_REASON_COUNT; r++)
        assert_string_not_equal(kiln_reason_name((kiln_reason)r), "UNKNOWN");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets),
        cmocka_unit_test(test_reasons_matmul),
        cmocka_unit_test(test_reasons_attention),
        cmocka_unit_test(test_policy_reasons),
        cmocka_unit_test(test_fallback_and_strict),
        cmocka_unit_test(test_perf_scores),
        cmocka_unit_test(test_cache_soundness),
        cmocka_unit_test(test_cache_threads),
        cmocka_unit_test(test_buckets_and_breaker),
        cmocka_unit_test(test_fallback_flagged),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
