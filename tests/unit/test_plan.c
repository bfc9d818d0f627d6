/* test_plan.c — the plan contract: param blocks, liveness, register allocation,
 * validator errors (one test per typed error), and a real family plan. */
#include "testutil.h"

#include "kernels/kernel.h"
#include "model/model.h"
#include "plan/opmap.h"
#include "plan/plan.h"

#include <stdio.h>
#include <string.h>

static kiln_param_block norm_pb(void) {
    kiln_params p = {.norm = {.eps = 1e-6f, .w_offset = 0}};
    kiln_param_block pb;
    assert_int_equal(kiln_param_encode(KILN_OP_RMS_NORM, &p, &pb, NULL), KILN_OK);
    return pb;
}

/* A small valid plan: embed -> norm -> add -> lm_head */
static void small_plan(kiln_plan *p) {
    kiln_plan_init(p);
    uint16_t x, h, y;
    uint32_t we, wn;
    int64_t es[2] = {8, 32}, ns[1] = {8};
    assert_int_equal(kiln_plan_weight(p, "token_embd.weight", KILN_WCLASS_MATRIX, 2, es, &we, NULL),
                     0);
    assert_int_equal(
        kiln_plan_weight(p, "output_norm.weight", KILN_WCLASS_VECTOR, 1, ns, &wn, NULL), 0);
    kiln_insn in = kiln_insn_make(KILN_OP_EMBED);
    kiln_params ep = {.embed = {.scale = 1}};
    kiln_param_block pb;
    assert_int_equal(kiln_param_encode(KILN_OP_EMBED, &ep, &pb, NULL), 0);
    assert_int_equal(kiln_plan_param(p, &pb, &in.param, NULL), 0);
    assert_int_equal(kiln_plan_reg(p, 8, KILN_ROWS_TOKENS, &x, NULL), 0);
    in.w[0] = we;
    in.n_out = 1;
    in.out[0] = x;
    assert_int_equal(kiln_plan_emit(p, &in, NULL), 0);
    in = kiln_insn_make(KILN_OP_RMS_NORM);
    pb = norm_pb();
    assert_int_equal(kiln_plan_param(p, &pb, &in.param, NULL), 0);
    assert_int_equal(kiln_plan_reg(p, 8, KILN_ROWS_TOKENS, &h, NULL), 0);
    in.w[0] = wn;
    in.n_in = 1;
    in.in[0] = x;
    in.n_out = 1;
    in.out[0] = h;
    assert_int_equal(kiln_plan_emit(p, &in, NULL), 0);
    in = kiln_insn_make(KILN_OP_RESIDUAL_ADD);
    assert_int_equal(kiln_plan_reg(p, 8, KILN_ROWS_TOKENS, &y, NULL), 0);
    in.n_in = 2;
    in.in[0] = x;
    in.in[1] = h;
    in.n_out = 1;
    in.out[0] = y;
    assert_int_equal(kiln_plan_emit(p, &in, NULL), 0);
    in = kiln_insn_make(KILN_OP_LM_HEAD);
    kiln_params lp = {.lm_head = {.softcap = 0}};
    assert_int_equal(kiln_param_encode(KILN_OP_LM_HEAD, &lp, &pb, NULL), 0);
    assert_int_equal(kiln_plan_param(p, &pb, &in.param, NULL), 0);
    in.w[0] = we;
    in.n_in = 1;
    in.in[0] = y;
    assert_int_equal(kiln_plan_emit(p, &in, NULL), 0);
}

static void expect_error(const kiln_plan *p, const bool *supported, kiln_plan_error code) {
    kiln_plan_check chk;
    kiln_err e;
    assert_int_equal(kiln_plan_validate(p, supported, &chk, &e), KILN_ERR_PLAN);
    if (chk.code != code)
        fail_msg("expected %s, got %s: %s", kiln_plan_error_name(code),
                 kiln_plan_error_name(chk.code), e.msg);
    assert_non_null(strstr(e.msg, kiln_plan_error_name(code)));
}

static void test_valid(void **state) {
    (void)state;
    kiln_plan p;
    small_plan(&p);
    kiln_plan_check chk;
    kiln_err e;
    assert_int_equal(kiln_plan_validate(&p, NULL, &chk, &e), KILN_OK);
    assert_int_equal(chk.code, KILN_PLAN_OK);
    kiln_plan_free(&p);
}

static void test_err_unsupported_opcode(void **state) {
    (void)state;
    kiln_plan p;
    small_plan(&p);
    bool sup[KILN_OP_LIMIT];
    for (int i = 0; i < KILN_OP_LIMIT; i++) sup[i] = true;
    sup[KILN_OP_RMS_NORM] = false;
    expect_error(&p, sup, KILN_PLAN_EUNSUPPORTED_OPCODE);
    p.insns[1].opcode = 0x55; /* reserved range, unassigned */
    expect_error(&p, NULL, KILN_PLAN_EUNSUPPORTED_OPCODE);
    kiln_plan_free(&p);
}

static void test_err_read_before_write(void **state) {
    (void)state;
    kiln_plan p;
    small_plan(&p);
    uint16_t r;
    assert_int_equal(kiln_plan_reg(&p, 8, KILN_ROWS_TOKENS, &r, NULL), 0);
    p.insns[2].in[1] = r; /* never written */
    expect_error(&p, NULL, KILN_PLAN_EREG_UNDEFINED);
    p.insns[2].in[1] = 999;
    expect_error(&p, NULL, KILN_PLAN_EREG_RANGE);
    kiln_plan_free(&p);
}

static void test_err_weight_missing(void **state) {
    (void)state;
    kiln_plan p;
    small_plan(&p);
    p.insns[0].w[0] = KILN_PLAN_NO_WEIGHT;
    expect_error(&p, NULL, KILN_PLAN_EWEIGHT_MISSING);
    kiln_plan_free(&p);
}

static void test_err_weight_shape(void **state) {
    (void)state;
    kiln_plan p;
    small_plan(&p);
    p.weights[1].shape[0] = 9; /* norm weight of 9 for rows of 8 */
    expect_error(&p, NULL, KILN_PLAN_EWEIGHT_SHAPE);
    kiln_plan_free(&p);
}

static void test_err_param_abi(void **state) {
    (void)state;
    kiln_plan p;
    small_plan(&p);
    kiln_param_block *pb = &p.params[p.insns[1].param];
    pb->bytes[2] = 9; /* version */
    expect_error(&p, NULL, KILN_PLAN_EPARAM_ABI);
    pb->bytes[2] = KILN_PARAM_VERSION;
    pb->bytes[0] = KILN_OP_EMBED; /* block of another opcode */
    expect_error(&p, NULL, KILN_PLAN_EPARAM_ABI);
    pb->bytes[0] = KILN_OP_RMS_NORM;
    pb->size = 12; /* truncated */
    expect_error(&p, NULL, KILN_PLAN_EPARAM_ABI);
    *pb = norm_pb();
    float bad = -1;
    memcpy(pb->bytes + 8, &bad, 4); /* eps < 0 */
    expect_error(&p, NULL, KILN_PLAN_EPARAM_ABI);
    p.insns[1].param = -1;
    expect_error(&p, NULL, KILN_PLAN_EPARAM_ABI);
    kiln_plan_free(&p);
}

static void test_err_rank(void **state) {
    (void)state;
    kiln_plan p;
    small_plan(&p);
    p.weights[0].rank = 5;
    expect_error(&p, NULL, KILN_PLAN_ERANK);
    kiln_plan_free(&p);
}

/* An FFN without a gate weight is rejected (no adapter computes a non-gated MLP; before
 * the validator required the gate, the adapter ran up -> down with no activation). */
static void test_err_ffn_no_gate(void **state) {
    (void)state;
    kiln_model_config c;
    kiln_model_config_defaults(&c);
    c.n_vocab = 32, c.n_embd = 16, c.n_layer = 2, c.n_head = 2, c.n_kv_head = 1, c.head_dim = 8;
    c.n_ff = 32, c.n_rot = 8, c.attn_scale = 0.35f;
    kiln_plan p;
    kiln_plan_init(&p);
    assert_int_equal(kiln_decoder_compile(&c, KILN_MODE_PREFILL, &p, NULL), 0);
    assert_int_equal(kiln_plan_validate(&p, NULL, NULL, NULL), KILN_OK);
    int32_t ffn = -1;
    for (int i = 0; i < p.n_insns && ffn < 0; i++)
        if (p.insns[i].opcode == KILN_OP_FFN) ffn = i;
    assert_true(ffn >= 0);
    p.insns[ffn].w[KILN_W_FFN_GATE] = KILN_PLAN_NO_WEIGHT;
    expect_error(&p, NULL, KILN_PLAN_EWEIGHT_MISSING);
    kiln_plan_check chk;
    kiln_err e;
    assert_int_equal(kiln_plan_validate(&p, NULL, &chk, &e), KILN_ERR_PLAN);
    assert_int_equal(chk.insn, ffn);
    assert_non_null(strstr(e.msg, "no gate weight"));
    kiln_plan_free(&p);
}

static void test_err_state_missing(void **state) {
    (void)state;
    kiln_model_config c;
    kiln_model_config_defaults(&c);
    c.n_vocab = 32, c.n_embd = 16, c.n_layer = 2, c.n_head = 2, c.n_kv_head = 1, c.head_dim = 8;
    c.n_ff = 32, c.n_rot = 8, c.attn_scale = 0.35f;
    kiln_plan p;
    kiln_plan_init(&p);
    assert_int_equal(kiln_decoder_compile(&c, KILN_MODE_PREFILL, &p, NULL), 0);
    assert_int_equal(kiln_plan_validate(&p, NULL, NULL, NULL), KILN_OK);
    for (int i = 0; i < p.n_insns; i++)
        if (p.insns[i].opcode == KILN_OP_ATTENTION) {
            p.insns[i].state = -1;
            break;
        }
    expect_error(&p, NULL, KILN_PLAN_ESTATE_MISSING);
    kiln_plan_free(&p);
}

static void test_param_roundtrip(void **state) {
    (void)state;
    kiln_params a;
    memset(&a, 0, sizeof(a));
    a.attn = (kiln_attn_params){.n_head = 8,
                                .n_kv_head = 2,
                                .head_dim = 64,
                                .n_rot = 64,
                                .rope_mode = KILN_ROPE_NEOX,
                                .rope_base = 1e6f,
                                .rope_freq_scale = 0.25f,
                                .attn_factor = 1,
                                .beta_fast = 32,
                                .beta_slow = 1,
                                .n_ctx_orig = 8192,
                                .scale = 0.125f,
                                .softcap = 50,
                                .window = 512,
                                .qk_norm_eps = 1e-6f};
    kiln_param_block pb;
    assert_int_equal(kiln_param_encode(KILN_OP_ATTENTION, &a, &pb, NULL), 0);
    assert_true(pb.size <= KILN_PARAM_MAX);
    /* little-endian header: opcode 0x10, version 1, size */
    assert_int_equal(pb.bytes[0], 0x10);
    assert_int_equal(pb.bytes[1], 0);
    assert_int_equal(pb.bytes[2], KILN_PARAM_VERSION);
    assert_int_equal(pb.bytes[4] | pb.bytes[5] << 8, pb.size);
    /* first field n_head = 8, LE */
    assert_int_equal(pb.bytes[8], 8);
    kiln_params b;
    assert_int_equal(kiln_param_decode(KILN_OP_ATTENTION, &pb, &b, NULL), 0);
    assert_memory_equal(&a.attn, &b.attn, sizeof(a.attn));
    /* invalid head split */
    a.attn.n_kv_head = 3;
    assert_int_equal(kiln_param_encode(KILN_OP_ATTENTION, &a, &pb, NULL), 0);
    assert_int_equal(kiln_param_decode(KILN_OP_ATTENTION, &pb, &b, NULL), KILN_ERR_PLAN);
    /* heads x head size past int32 (a fuzzed model: n_head 2^31 - 1, head_dim 16 overflowed
     * the plan check's int product, a UBSan report) */
    a.attn.n_head = INT32_MAX, a.attn.n_kv_head = 1, a.attn.head_dim = 16;
    assert_int_equal(kiln_param_encode(KILN_OP_ATTENTION, &a, &pb, NULL), 0);
    kiln_err e;
    assert_int_equal(kiln_param_decode(KILN_OP_ATTENTION, &pb, &b, &e), KILN_ERR_PLAN);
    assert_non_null(strstr(e.msg, "n_head * head_dim"));
    a.attn.n_head = 1 << 27; /* 2^27 x 16 = 2^31: one past */
    assert_int_equal(kiln_param_encode(KILN_OP_ATTENTION, &a, &pb, NULL), 0);
    assert_int_equal(kiln_param_decode(KILN_OP_ATTENTION, &pb, &b, NULL), KILN_ERR_PLAN);
    a.attn.head_dim = 8; /* 2^30: allowed by the decoder (the weights' shapes decide) */
    a.attn.n_rot = 8;
    assert_int_equal(kiln_param_encode(KILN_OP_ATTENTION, &a, &pb, NULL), 0);
    assert_int_equal(kiln_param_decode(KILN_OP_ATTENTION, &pb, &b, NULL), 0);
}

/* Liveness and allocation on a real decoder plan: buffers are reused, no two
 * overlapping live ranges share a buffer. */
static void test_alloc_decoder(void **state) {
    (void)state;
    kiln_model_config c;
    kiln_model_config_defaults(&c);
    c.n_vocab = 100, c.n_embd = 64, c.n_layer = 6, c.n_head = 4, c.n_kv_head = 2, c.head_dim = 16;
    c.n_ff = 128, c.n_rot = 16, c.attn_scale = 0.25f, c.post_norms = true, c.qk_norm = true;
    kiln_plan p;
    kiln_plan_init(&p);
    assert_int_equal(kiln_decoder_compile(&c, KILN_MODE_DECODE, &p, NULL), 0);
    assert_int_equal(kiln_plan_validate(&p, NULL, NULL, NULL), 0);
    assert_int_equal(kiln_plan_compile(&p, NULL), 0);
    assert_int_equal(kiln_plan_check_alloc(&p, NULL), 0);
    assert_true(p.n_phys < p.n_regs);
    assert_true(p.n_phys <= 4);
    /* every register except the final one fed to lm_head dies somewhere */
    int killed = p.kill_start[p.n_insns];
    assert_int_equal(killed, p.n_regs);
    size_t dec, pre;
    assert_int_equal(kiln_plan_buffer_bytes(&p, 1, 1, NULL, &dec, NULL), 0);
    assert_int_equal(kiln_plan_buffer_bytes(&p, 512, 512, NULL, &pre, NULL), 0);
    assert_true(dec < pre);
    kiln_plan_free(&p);
}

/* Adversarial: long-lived values crossing many short ones, fan-out reads and dead
 * outputs, in random orders; the checker must always pass, and a corrupted
 * allocation must be caught. */
static void test_alloc_adversarial(void **state) {
    (void)state;
    kt_rng r;
    kt_rng_seed(&r, 7);
    for (int round = 0; round < 50; round++) {
        kiln_plan p;
        kiln_plan_init(&p);
        uint16_t live[64];
        int n_live = 0;
        kiln_insn in = kiln_insn_make(KILN_OP_EMBED);
        uint16_t x;
        assert_int_equal(kiln_plan_reg(&p, 8, KILN_ROWS_TOKENS, &x, NULL), 0);
        in.n_out = 1;
        in.out[0] = x;
        assert_int_equal(kiln_plan_emit(&p, &in, NULL), 0);
        live[n_live++] = x;
        int n_ins = 20 + (int)(kt_rng_u64(&r) % 60);
        for (int i = 0; i < n_ins; i++) {
            in = kiln_insn_make(KILN_OP_RESIDUAL_ADD);
            uint16_t y;
            uint32_t width = 8 + 8 * (uint32_t)(kt_rng_u64(&r) % 4);
            assert_int_equal(kiln_plan_reg(&p, width, KILN_ROWS_TOKENS, &y, NULL), 0);
            in.n_in = 2;
            in.in[0] = live[kt_rng_u64(&r) % (uint64_t)n_live];
            in.in[1] = live[kt_rng_u64(&r) % (uint64_t)n_live];
            in.n_out = 1;
            in.out[0] = y;
            assert_int_equal(kiln_plan_emit(&p, &in, NULL), 0);
            if (n_live < 64 && kt_rng_u64(&r) % 3)
                live[n_live++] = y;
            else
                live[kt_rng_u64(&r) % (uint64_t)n_live] = y;
        }
        assert_int_equal(kiln_plan_compile(&p, NULL), 0);
        assert_int_equal(kiln_plan_check_alloc(&p, NULL), 0);
        /* simulate: write a tag per register into its buffer, check every read sees its tag */
        int32_t owner[256];
        for (int b = 0; b < 256; b++) owner[b] = -1;
        for (int i = 0; i < p.n_insns; i++) {
            for (int k = 0; k < p.insns[i].n_in; k++)
                assert_int_equal(owner[p.phys[p.insns[i].in[k]]], p.insns[i].in[k]);
            for (int k = 0; k < p.insns[i].n_out; k++)
                owner[p.phys[p.insns[i].out[k]]] = p.insns[i].out[k];
        }
        /* corrupt: give a live register's buffer to an overlapping one */
        if (p.n_phys >= 2) {
            int32_t a = p.insns[1].out[0], b = -1;
            for (int i = 2; i < p.n_insns && b < 0; i++)
                if (i > p.def[a] && i <= p.last_read[a] && p.phys[p.insns[i].out[0]] != p.phys[a])
                    b = p.insns[i].out[0];
            if (b >= 0) {
                p.phys[b] = p.phys[a];
                assert_int_equal(kiln_plan_check_alloc(&p, NULL), KILN_ERR_INTERNAL);
            }
        }
        kiln_plan_free(&p);
    }
}

static void test_opmap(void **state) {
    (void)state;
    for (int i = 0; i < KILN_MOP_COUNT; i++) {
        assert_int_not_equal(kiln_opmap((kiln_model_op)i), KILN_OP_NONE);
        assert_non_null(kiln_opcode_name(kiln_opmap((kiln_model_op)i)));
    }
    assert_int_equal(kiln_opmap(KILN_MOP_COUNT), KILN_OP_NONE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_err_unsupported_opcode),
        cmocka_unit_test(test_err_read_before_write),
        cmocka_unit_test(test_err_weight_missing),
        cmocka_unit_test(test_err_weight_shape),
        cmocka_unit_test(test_err_param_abi),
        cmocka_unit_test(test_err_rank),
        cmocka_unit_test(test_err_state_missing),
        cmocka_unit_test(test_err_ffn_no_gate),
        cmocka_unit_test(test_param_roundtrip),
        cmocka_unit_test(test_alloc_decoder),
        cmocka_unit_test(test_alloc_adversarial),
        cmocka_unit_test(test_opmap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
