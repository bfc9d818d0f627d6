/* plan.c — building plans, param block encoding, and the validator. */
#include "plan/plan.h"
#include "base/hash.h"
#include "base/mem.h"

#include "kernels/kernel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *kiln_opcode_name(uint32_t op) {
    switch (op) {
    case KILN_OP_EMBED:
        return "embed";
    case KILN_OP_RMS_NORM:
        return "rms_norm";
    case KILN_OP_LAYER_NORM:
        return "layer_norm";
    case KILN_OP_ATTENTION:
        return "attention";
    case KILN_OP_MLA:
        return "mla";
    case KILN_OP_FFN:
        return "ffn";
    case KILN_OP_MOE:
        return "moe";
    case KILN_OP_RESIDUAL_ADD:
        return "residual_add";
    case KILN_OP_LM_HEAD:
        return "lm_head";
    case KILN_OP_ALL_REDUCE:
        return "all_reduce";
    case KILN_OP_GATHER_LOGITS:
        return "gather_logits";
    default:
        return NULL;
    }
}

const char *kiln_plan_error_name(kiln_plan_error e) {
    switch (e) {
    case KILN_PLAN_OK:
        return "OK";
    case KILN_PLAN_EUNSUPPORTED_OPCODE:
        return "UNSUPPORTED_OPCODE";
    case KILN_PLAN_EREG_RANGE:
        return "REG_RANGE";
    case KILN_PLAN_EREG_UNDEFINED:
        return "REG_UNDEFINED";
    case KILN_PLAN_EREG_REDEFINED:
        return "REG_REDEFINED";
    case KILN_PLAN_EARITY:
        return "ARITY";
    case KILN_PLAN_EWEIGHT_MISSING:
        return "WEIGHT_MISSING";
    case KILN_PLAN_EWEIGHT_SHAPE:
        return "WEIGHT_SHAPE";
    case KILN_PLAN_EWEIGHT_DTYPE:
        return "WEIGHT_DTYPE";
    case KILN_PLAN_EPARAM_ABI:
        return "PARAM_ABI";
    case KILN_PLAN_ERANK:
        return "RANK";
    case KILN_PLAN_ESTATE_MISSING:
        return "STATE_MISSING";
    case KILN_PLAN_EWIDTH:
        return "WIDTH";
    }
    return "UNKNOWN";
}

void kiln_plan_init(kiln_plan *p) {
    memset(p, 0, sizeof(*p));
}

static void plan_free_compiled(kiln_plan *p) {
    kiln_free(p->last_read);
    kiln_free(p->def);
    kiln_free(p->kill_start);
    kiln_free(p->kill);
    kiln_free(p->phys);
    kiln_free(p->phys_width);
    kiln_free(p->phys_rows);
    p->last_read = p->def = p->kill_start = p->phys = NULL;
    p->kill = NULL;
    p->phys_width = NULL;
    p->phys_rows = NULL;
    p->n_phys = 0;
    p->compiled = false;
}

void kiln_plan_free(kiln_plan *p) {
    if (!p) return;
    plan_free_compiled(p);
    kiln_free(p->insns);
    kiln_free(p->regs);
    kiln_free(p->weights);
    kiln_free(p->wmap);
    kiln_free(p->params);
    kiln_free(p->states);
    memset(p, 0, sizeof(*p));
}

/* Grows an array of elem-sized items so that one more fits. */
static kiln_status grow(void **arr, int32_t *cap, int32_t n, size_t elem, const char *what,
                        kiln_err *err) {
    if (n < *cap) return KILN_OK;
    if (*cap > INT32_MAX / 2)
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "plan: too many %s", what);
    int32_t nc = *cap ? *cap * 2 : 16;
    void *q = kiln_realloc(*arr, (size_t)nc * elem);
    if (!q) return kiln_err_set(err, KILN_ERR_NOMEM, "plan: out of memory growing %s", what);
    *arr = q;
    *cap = nc;
    return KILN_OK;
}

kiln_status kiln_plan_reg(kiln_plan *p, uint32_t width, kiln_rows rows, uint16_t *out,
                          kiln_err *err) {
    if (p->n_regs >= 65535)
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "plan: more than 65535 registers");
    KILN_TRY(grow((void **)&p->regs, &p->cap_regs, p->n_regs, sizeof(*p->regs), "registers", err));
    p->regs[p->n_regs] = (kiln_reg_desc){.width = width, .rows = (uint8_t)rows};
    *out = (uint16_t)p->n_regs++;
    p->compiled = false;
    return KILN_OK;
}

/* The slot of name in wmap: the one holding it, or the empty one where it goes. */
static uint32_t *wmap_slot(const kiln_plan *p, const char *name, size_t len) {
    uint32_t mask = (uint32_t)p->wmap_cap - 1;
    uint32_t i = (uint32_t)kiln_hash64(name, len, 0) & mask;
    while (p->wmap[i] && strcmp(p->weights[p->wmap[i] - 1].name, name) != 0) i = (i + 1) & mask;
    return &p->wmap[i];
}

/* Keeps wmap at most half full for one more weight. A linear scan over the names was
 * quadratic in the weights: a fuzzed 512-layer model spent most of its time there. */
static kiln_status wmap_reserve(kiln_plan *p, kiln_err *err) {
    if ((int64_t)p->wmap_cap >= 2 * ((int64_t)p->n_weights + 1)) return KILN_OK;
    if (p->wmap_cap > INT32_MAX / 4)
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "plan: too many weights");
    int32_t nc = p->wmap_cap ? p->wmap_cap * 2 : 64;
    uint32_t *m = kiln_calloc((size_t)nc, sizeof(*m));
    if (!m) return kiln_err_set(err, KILN_ERR_NOMEM, "plan: out of memory growing weights");
    kiln_free(p->wmap);
    p->wmap = m;
    p->wmap_cap = nc;
    for (int32_t i = 0; i < p->n_weights; i++) {
        const char *nm = p->weights[i].name;
        *wmap_slot(p, nm, strlen(nm)) = (uint32_t)i + 1;
    }
    return KILN_OK;
}

kiln_status kiln_plan_weight(kiln_plan *p, const char *name, kiln_wclass wclass, int rank,
                             const int64_t *shape, uint32_t *out, kiln_err *err) {
    size_t len = strlen(name);
    if (len == 0 || len >= KILN_WEIGHT_NAME_MAX)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "plan: weight name '%s' empty or too long",
                            name);
    KILN_TRY(wmap_reserve(p, err));
    uint32_t *slot = wmap_slot(p, name, len);
    if (*slot) {
        const kiln_weight_ref *w = &p->weights[*slot - 1];
        bool same = w->rank == rank && w->wclass == (uint8_t)wclass;
        for (int d = 0; same && d < rank && d < 4; d++) same = w->shape[d] == shape[d];
        if (!same)
            return kiln_err_set(err, KILN_ERR_PLAN, "plan: weight '%s' referenced with two shapes",
                                name);
        *out = *slot - 1;
        return KILN_OK;
    }
    KILN_TRY(grow((void **)&p->weights, &p->cap_weights, p->n_weights, sizeof(*p->weights),
                  "weights", err));
    kiln_weight_ref *w = &p->weights[p->n_weights];
    memset(w, 0, sizeof(*w));
    memcpy(w->name, name, len + 1);
    w->rank = rank;
    w->wclass = (uint8_t)wclass;
    for (int d = 0; d < rank && d < 4; d++) w->shape[d] = shape[d];
    *out = (uint32_t)p->n_weights++;
    *slot = (uint32_t)p->n_weights;
    return KILN_OK;
}

kiln_status kiln_plan_param(kiln_plan *p, const kiln_param_block *pb, int32_t *out, kiln_err *err) {
    KILN_TRY(grow((void **)&p->params, &p->cap_params, p->n_params, sizeof(*p->params),
                  "param blocks", err));
    p->params[p->n_params] = *pb;
    *out = p->n_params++;
    return KILN_OK;
}

kiln_status kiln_plan_state(kiln_plan *p, const kiln_state_desc *sd, int32_t *out, kiln_err *err) {
    KILN_TRY(grow((void **)&p->states, &p->cap_states, p->n_states, sizeof(*p->states),
                  "state descriptors", err));
    p->states[p->n_states] = *sd;
    *out = p->n_states++;
    return KILN_OK;
}

kiln_status kiln_plan_emit(kiln_plan *p, const kiln_insn *in, kiln_err *err) {
    KILN_TRY(grow((void **)&p->insns, &p->cap_insns, p->n_insns, sizeof(*p->insns), "instructions",
                  err));
    p->insns[p->n_insns++] = *in;
    p->compiled = false;
    return KILN_OK;
}

kiln_insn kiln_insn_make(kiln_opcode op) {
    kiln_insn in;
    memset(&in, 0, sizeof(in));
    in.opcode = (uint16_t)op;
    for (int i = 0; i < KILN_PLAN_MAX_WEIGHTS; i++) in.w[i] = KILN_PLAN_NO_WEIGHT;
    in.param = in.state = in.layer = -1;
    return in;
}

/* ---- param blocks ---- */

typedef struct pw {
    kiln_param_block *b;
    size_t off;
    bool overflow;
} pw;

static void put_u32(pw *w, uint32_t v) {
    if (w->off + 4 > KILN_PARAM_MAX) {
        w->overflow = true;
        return;
    }
    for (int i = 0; i < 4; i++) w->b->bytes[w->off + i] = (uint8_t)(v >> (8 * i));
    w->off += 4;
}
static void put_i32(pw *w, int32_t v) {
    put_u32(w, (uint32_t)v);
}
static void put_f32(pw *w, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    put_u32(w, u);
}

typedef struct pr {
    const kiln_param_block *b;
    size_t off;
    bool short_read;
} pr;

static uint32_t get_u32(pr *r) {
    if (r->off + 4 > r->b->size) {
        r->short_read = true;
        return 0;
    }
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)r->b->bytes[r->off + i] << (8 * i);
    r->off += 4;
    return v;
}
static int32_t get_i32(pr *r) {
    return (int32_t)get_u32(r);
}
static float get_f32(pr *r) {
    uint32_t u = get_u32(r);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define PARAM_HEADER 8

kiln_status kiln_param_encode(kiln_opcode op, const kiln_params *in, kiln_param_block *out,
                              kiln_err *err) {
    memset(out, 0, sizeof(*out));
    pw w = {out, PARAM_HEADER, false};
    switch (op) {
    case KILN_OP_EMBED:
        put_f32(&w, in->embed.scale);
        put_i32(&w, in->embed.vocab_shard);
        put_i32(&w, in->embed.vocab_base);
        break;
    case KILN_OP_RMS_NORM:
        put_f32(&w, in->norm.eps);
        put_f32(&w, in->norm.w_offset);
        break;
    case KILN_OP_ATTENTION: {
        const kiln_attn_params *a = &in->attn;
        put_i32(&w, a->n_head);
        put_i32(&w, a->n_kv_head);
        put_i32(&w, a->head_dim);
        put_i32(&w, a->n_rot);
        put_i32(&w, a->rope_mode);
        put_f32(&w, a->rope_base);
        put_f32(&w, a->rope_freq_scale);
        put_f32(&w, a->ext_factor);
        put_f32(&w, a->attn_factor);
        put_f32(&w, a->beta_fast);
        put_f32(&w, a->beta_slow);
        put_i32(&w, a->n_ctx_orig);
        put_f32(&w, a->scale);
        put_f32(&w, a->softcap);
        put_i32(&w, a->window);
        put_f32(&w, a->qk_norm_eps);
        put_f32(&w, a->qk_norm_offset);
        break;
    }
    case KILN_OP_FFN:
        put_i32(&w, in->ffn.act);
        break;
    case KILN_OP_LM_HEAD:
        put_f32(&w, in->lm_head.softcap);
        break;
    case KILN_OP_GATHER_LOGITS:
        put_i32(&w, in->gather.n_vocab);
        put_i32(&w, in->gather.n_ranks);
        break;
    default:
        return kiln_err_set(err, KILN_ERR_PLAN, "param block: opcode 0x%02x has no parameters",
                            (unsigned)op);
    }
    if (w.overflow) return kiln_err_set(err, KILN_ERR_INTERNAL, "param block over 256 bytes");
    out->size = (uint16_t)w.off;
    out->bytes[0] = (uint8_t)op;
    out->bytes[1] = (uint8_t)((unsigned)op >> 8);
    out->bytes[2] = KILN_PARAM_VERSION;
    out->bytes[4] = (uint8_t)w.off;
    out->bytes[5] = (uint8_t)(w.off >> 8);
    return KILN_OK;
}

static bool finite_pos(float x) {
    return isfinite(x) && x > 0;
}

kiln_status kiln_param_decode(kiln_opcode op, const kiln_param_block *in, kiln_params *out,
                              kiln_err *err) {
    memset(out, 0, sizeof(*out));
    if (in->size < PARAM_HEADER || in->size > KILN_PARAM_MAX)
        return kiln_err_set(err, KILN_ERR_PLAN, "param block: size %u outside [%d, %d]",
                            (unsigned)in->size, PARAM_HEADER, KILN_PARAM_MAX);
    unsigned bop = in->bytes[0] | (unsigned)in->bytes[1] << 8;
    unsigned ver = in->bytes[2];
    unsigned len = in->bytes[4] | (unsigned)in->bytes[5] << 8;
    if (bop != (unsigned)op)
        return kiln_err_set(err, KILN_ERR_PLAN,
                            "param block: written for opcode 0x%02x, used by 0x%02x", bop,
                            (unsigned)op);
    if (ver != KILN_PARAM_VERSION)
        return kiln_err_set(err, KILN_ERR_PLAN, "param block: version %u, this build reads %d", ver,
                            KILN_PARAM_VERSION);
    if (len != in->size)
        return kiln_err_set(err, KILN_ERR_PLAN, "param block: header says %u bytes, block has %u",
                            len, (unsigned)in->size);
    pr r = {in, PARAM_HEADER, false};
    const char *bad = NULL;
    switch (op) {
    case KILN_OP_EMBED:
        out->embed.scale = get_f32(&r);
        out->embed.vocab_shard = get_i32(&r);
        out->embed.vocab_base = get_i32(&r);
        if (!finite_pos(out->embed.scale))
            bad = "embed scale must be finite and > 0";
        else if (out->embed.vocab_shard != 0 && out->embed.vocab_shard != 1)
            bad = "embed vocab_shard must be 0 or 1";
        else if (out->embed.vocab_base < 0 || (!out->embed.vocab_shard && out->embed.vocab_base))
            bad = "embed vocab_base must be >= 0 (and 0 without a vocabulary shard)";
        break;
    case KILN_OP_RMS_NORM:
        out->norm.eps = get_f32(&r);
        out->norm.w_offset = get_f32(&r);
        if (!finite_pos(out->norm.eps))
            bad = "rms_norm eps must be finite and > 0";
        else if (!isfinite(out->norm.w_offset))
            bad = "rms_norm weight offset must be finite";
        break;
    case KILN_OP_ATTENTION: {
        kiln_attn_params *a = &out->attn;
        a->n_head = get_i32(&r);
        a->n_kv_head = get_i32(&r);
        a->head_dim = get_i32(&r);
        a->n_rot = get_i32(&r);
        a->rope_mode = get_i32(&r);
        a->rope_base = get_f32(&r);
        a->rope_freq_scale = get_f32(&r);
        a->ext_factor = get_f32(&r);
        a->attn_factor = get_f32(&r);
        a->beta_fast = get_f32(&r);
        a->beta_slow = get_f32(&r);
        a->n_ctx_orig = get_i32(&r);
        a->scale = get_f32(&r);
        a->softcap = get_f32(&r);
        a->window = get_i32(&r);
        a->qk_norm_eps = get_f32(&r);
        a->qk_norm_offset = get_f32(&r);
        if (a->n_head <= 0 || a->n_kv_head <= 0 || a->n_head % a->n_kv_head != 0)
            bad = "attention heads: n_head must be a positive multiple of n_kv_head";
        else if (a->head_dim <= 0 || a->head_dim > 1024)
            bad = "attention head_dim outside [1, 1024]";
        else if ((int64_t)a->n_head * a->head_dim > INT32_MAX)
            bad = "attention n_head * head_dim exceeds 2^31 - 1";
        else if (a->n_rot < 0 || a->n_rot > a->head_dim || a->n_rot % 2)
            bad = "attention n_rot must be even and <= head_dim";
        else if (a->rope_mode != KILN_ROPE_NORM && a->rope_mode != KILN_ROPE_NEOX)
            bad = "attention rope mode unknown";
        else if (a->n_rot > 0 && (!finite_pos(a->rope_base) || !finite_pos(a->rope_freq_scale)))
            bad = "attention rope base and freq scale must be finite and > 0";
        else if (!isfinite(a->ext_factor) || !isfinite(a->attn_factor) || !isfinite(a->beta_fast) ||
                 !isfinite(a->beta_slow))
            bad = "attention YaRN parameters must be finite";
        else if (!finite_pos(a->scale))
            bad = "attention scale must be finite and > 0";
        else if (!(a->softcap >= 0) || !isfinite(a->softcap))
            bad = "attention softcap must be >= 0";
        else if (a->window < 0)
            bad = "attention window must be >= 0";
        else if (!finite_pos(a->qk_norm_eps))
            bad = "attention qk norm eps must be > 0";
        break;
    }
    case KILN_OP_FFN:
        out->ffn.act = get_i32(&r);
        if (out->ffn.act < 0 || out->ffn.act > KILN_GLU_GEGLU_ERF) bad = "ffn activation unknown";
        break;
    case KILN_OP_LM_HEAD:
        out->lm_head.softcap = get_f32(&r);
        if (!(out->lm_head.softcap >= 0) || !isfinite(out->lm_head.softcap))
            bad = "lm_head softcap must be >= 0";
        break;
    case KILN_OP_GATHER_LOGITS:
        out->gather.n_vocab = get_i32(&r);
        out->gather.n_ranks = get_i32(&r);
        if (out->gather.n_ranks < 1 || out->gather.n_ranks > 64 || out->gather.n_vocab < 1 ||
            out->gather.n_vocab % out->gather.n_ranks)
            bad = "gather_logits: n_vocab must be a positive multiple of n_ranks (1..64)";
        break;
    default:
        return kiln_err_set(err, KILN_ERR_PLAN, "param block: opcode 0x%02x takes no parameters",
                            (unsigned)op);
    }
    if (r.short_read)
        return kiln_err_set(err, KILN_ERR_PLAN, "param block for %s: %u bytes, too short",
                            kiln_opcode_name(op), (unsigned)in->size);
    if (r.off != in->size)
        return kiln_err_set(err, KILN_ERR_PLAN, "param block for %s: %u bytes, expected %zu",
                            kiln_opcode_name(op), (unsigned)in->size, r.off);
    if (bad) return kiln_err_set(err, KILN_ERR_PLAN, "param block: %s", bad);
    return KILN_OK;
}

/* ---- validation ---- */

typedef struct op_shape {
    uint8_t n_in, n_out;
    bool needs_param, needs_state;
    uint8_t required_w[KILN_PLAN_MAX_WEIGHTS]; /* slots that must be bound */
    uint8_t n_required;
} op_shape;

static bool op_shape_of(uint32_t op, op_shape *s) {
    memset(s, 0, sizeof(*s));
    switch (op) {
    case KILN_OP_EMBED:
        *s = (op_shape){0, 1, true, false, {KILN_W_EMBED_TABLE}, 1};
        return true;
    case KILN_OP_RMS_NORM:
        *s = (op_shape){1, 1, true, false, {0}, 0};
        return true;
    case KILN_OP_ATTENTION:
        *s = (op_shape){1, 1, true, true, {KILN_W_ATT_Q, KILN_W_ATT_K, KILN_W_ATT_V, KILN_W_ATT_O},
                        4};
        return true;
    case KILN_OP_FFN:
        /* gated only: the adapter computes act(gate) * up; a non-gated MLP (up ->
         * act -> down) has no adapter yet, so a plan without a gate is rejected here
         * instead of running up -> down with no activation */
        *s = (op_shape){1, 1, true, false, {KILN_W_FFN_GATE, KILN_W_FFN_UP, KILN_W_FFN_DOWN}, 3};
        return true;
    case KILN_OP_RESIDUAL_ADD:
        *s = (op_shape){2, 1, false, false, {0}, 0};
        return true;
    case KILN_OP_LM_HEAD:
        *s = (op_shape){1, 0, true, false, {KILN_W_LM_HEAD}, 1};
        return true;
    case KILN_OP_ALL_REDUCE:
        *s = (op_shape){1, 1, false, false, {0}, 0};
        return true;
    case KILN_OP_GATHER_LOGITS:
        *s = (op_shape){0, 0, true, false, {0}, 0};
        return true;
    default:
        return false;
    }
}

static kiln_status fail(kiln_plan_check *chk, kiln_plan_error code, int32_t insn, kiln_err *err,
                        const char *fmt, ...) KILN_PRINTF(5, 6);
static kiln_status fail(kiln_plan_check *chk, kiln_plan_error code, int32_t insn, kiln_err *err,
                        const char *fmt, ...) {
    if (chk) {
        chk->code = code;
        chk->insn = insn;
    }
    va_list ap;
    va_start(ap, fmt);
    kiln_err_vset(err, KILN_ERR_PLAN, fmt, ap);
    va_end(ap);
    if (insn >= 0) kiln_err_wrap(err, KILN_ERR_PLAN, "plan instruction %d", (int)insn);
    return kiln_err_wrap(err, KILN_ERR_PLAN, "plan invalid (%s)", kiln_plan_error_name(code));
}

kiln_status kiln_plan_validate(const kiln_plan *p, const bool *supported, kiln_plan_check *chk,
                               kiln_err *err) {
    if (chk) *chk = (kiln_plan_check){KILN_PLAN_OK, -1};
    for (int32_t i = 0; i < p->n_weights; i++) {
        const kiln_weight_ref *w = &p->weights[i];
        if (w->rank < 1 || w->rank > 4)
            return fail(chk, KILN_PLAN_ERANK, -1, err,
                        "weight '%s' has rank %d (kiln supports 1..4)", w->name, (int)w->rank);
        for (int d = 0; d < w->rank; d++)
            if (w->shape[d] <= 0)
                return fail(chk, KILN_PLAN_EWEIGHT_SHAPE, -1, err, "weight '%s' dim %d is %lld",
                            w->name, d, (long long)w->shape[d]);
    }
    for (int32_t i = 0; i < p->n_states; i++)
        if (p->states[i].kind != KILN_STATE_KV || p->states[i].n_kv_head <= 0 ||
            p->states[i].head_dim <= 0 || p->states[i].layer < 0)
            return fail(chk, KILN_PLAN_ESTATE_MISSING, -1, err, "state descriptor %d is malformed",
                        (int)i);
    uint8_t *defined = kiln_calloc((size_t)p->n_regs + 1, 1);
    if (!defined) return kiln_err_set(err, KILN_ERR_NOMEM, "plan validate: out of memory");
    kiln_status st = KILN_OK;
    for (int32_t i = 0; i < p->n_insns && st == KILN_OK; i++) {
        const kiln_insn *in = &p->insns[i];
        op_shape s;
        const char *name = kiln_opcode_name(in->opcode);
        if (in->opcode >= KILN_OP_LIMIT || !op_shape_of(in->opcode, &s)) {
            st = fail(chk, KILN_PLAN_EUNSUPPORTED_OPCODE, i, err,
                      "opcode 0x%02x (%s) has no semantics in this build", (unsigned)in->opcode,
                      name ? name : "unassigned");
            break;
        }
        if (supported && !supported[in->opcode]) {
            st = fail(chk, KILN_PLAN_EUNSUPPORTED_OPCODE, i, err,
                      "opcode %s is not supported by the backend", name);
            break;
        }
        if (in->n_in != s.n_in || in->n_out != s.n_out) {
            st = fail(chk, KILN_PLAN_EARITY, i, err,
                      "%s takes %u inputs and %u outputs, has %u and %u", name, s.n_in, s.n_out,
                      in->n_in, in->n_out);
            break;
        }
        for (int k = 0; k < in->n_in && st == KILN_OK; k++) {
            if (in->in[k] >= p->n_regs)
                st = fail(chk, KILN_PLAN_EREG_RANGE, i, err, "%s input %d: register r%u of %d",
                          name, k, in->in[k], (int)p->n_regs);
            else if (!defined[in->in[k]])
                st = fail(chk, KILN_PLAN_EREG_UNDEFINED, i, err,
                          "%s reads r%u before any instruction writes it", name, in->in[k]);
        }
        for (int k = 0; k < in->n_out && st == KILN_OK; k++) {
            if (in->out[k] >= p->n_regs)
                st = fail(chk, KILN_PLAN_EREG_RANGE, i, err, "%s output %d: register r%u of %d",
                          name, k, in->out[k], (int)p->n_regs);
            else if (defined[in->out[k]])
                st = fail(chk, KILN_PLAN_EREG_REDEFINED, i, err, "%s writes r%u a second time",
                          name, in->out[k]);
            else
                defined[in->out[k]] = 1;
        }
        if (st) break;
        for (int k = 0; k < KILN_PLAN_MAX_WEIGHTS; k++)
            if (in->w[k] != KILN_PLAN_NO_WEIGHT && in->w[k] >= (uint32_t)p->n_weights) {
                st =
                    fail(chk, KILN_PLAN_EWEIGHT_MISSING, i, err,
                         "%s weight slot %d: index %u of %d", name, k, in->w[k], (int)p->n_weights);
                break;
            }
        for (int k = 0; k < s.n_required && st == KILN_OK; k++)
            if (in->w[s.required_w[k]] == KILN_PLAN_NO_WEIGHT) {
                if (in->opcode == KILN_OP_FFN && s.required_w[k] == KILN_W_FFN_GATE)
                    st = fail(chk, KILN_PLAN_EWEIGHT_MISSING, i, err,
                              "%s has no gate weight: only gated FFNs (act(gate) * up) are "
                              "supported, a non-gated MLP is not",
                              name);
                else
                    st = fail(chk, KILN_PLAN_EWEIGHT_MISSING, i, err,
                              "%s: required weight slot %u is empty", name, s.required_w[k]);
            }
        if (st) break;
        if (s.needs_param) {
            kiln_params prm;
            if (in->param < 0 || in->param >= p->n_params) {
                st = fail(chk, KILN_PLAN_EPARAM_ABI, i, err, "%s needs a param block, has %d", name,
                          (int)in->param);
                break;
            }
            kiln_err e2;
            if (kiln_param_decode(in->opcode, &p->params[in->param], &prm, &e2)) {
                st = fail(chk, KILN_PLAN_EPARAM_ABI, i, err, "%s", e2.msg);
                break;
            }
            if (in->opcode == KILN_OP_ATTENTION) {
                const kiln_attn_params *a = &prm.attn;
                int64_t qd = (int64_t)a->n_head * a->head_dim;
                const kiln_weight_ref *wq = &p->weights[in->w[KILN_W_ATT_Q]];
                if (wq->shape[1] != qd) {
                    st = fail(chk, KILN_PLAN_EWEIGHT_SHAPE, i, err,
                              "attention: '%s' has %lld rows, heads need %lld", wq->name,
                              (long long)wq->shape[1], (long long)qd);
                    break;
                }
            }
        } else if (in->param >= 0) {
            st = fail(chk, KILN_PLAN_EPARAM_ABI, i, err, "%s takes no param block", name);
            break;
        }
        if (s.needs_state) {
            if (in->state < 0 || in->state >= p->n_states) {
                st = fail(chk, KILN_PLAN_ESTATE_MISSING, i, err, "%s needs a state block, has %d",
                          name, (int)in->state);
                break;
            }
        }
        /* register widths: elementwise ops keep width; matrix ops read k = width */
        if (in->opcode == KILN_OP_RESIDUAL_ADD || in->opcode == KILN_OP_RMS_NORM ||
            in->opcode == KILN_OP_ALL_REDUCE) {
            uint32_t wdt = p->regs[in->out[0]].width;
            for (int k = 0; k < in->n_in; k++)
                if (p->regs[in->in[k]].width != wdt) {
                    st = fail(chk, KILN_PLAN_EWIDTH, i, err, "%s: input r%u is %u wide, output %u",
                              name, in->in[k], p->regs[in->in[k]].width, wdt);
                    break;
                }
            if (!st && in->opcode == KILN_OP_RMS_NORM &&
                in->w[KILN_W_NORM] != KILN_PLAN_NO_WEIGHT &&
                p->weights[in->w[KILN_W_NORM]].shape[0] != wdt)
                st = fail(chk, KILN_PLAN_EWEIGHT_SHAPE, i, err,
                          "rms_norm: weight '%s' has %lld elements, rows %u",
                          p->weights[in->w[KILN_W_NORM]].name,
                          (long long)p->weights[in->w[KILN_W_NORM]].shape[0], wdt);
        }
    }
    kiln_free(defined);
    return st;
}
