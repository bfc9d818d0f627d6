/*
 * plan.h — the execution plan contract: what a model family compiles into and what
 * a backend executes. No backend code lives here (see src/runtime/).
 *
 * A plan is a list of instructions over logical registers:
 *   { opcode, inputs[], outputs[], weight slots[], param block, state block }
 * - Opcodes are macro-ops (embed, rms_norm, attention, ffn, residual_add, lm_head) in
 *   numbered ranges, with room reserved for later families of ops (see kiln_opcode).
 * - Registers are f32 activation matrices: one row per token of the step (or one row
 *   per logits row), `width` floats wide. Every register is written exactly once
 *   (SSA), so liveness is a single interval per register.
 * - Weights are named references (GGUF tensor names) with the shape the family
 *   expects; they are bound to tensors of a model file at load time.
 * - Param blocks are small versioned little-endian byte blocks (<= 256 bytes), one
 *   format per opcode, decoded and validated once at bind time (kiln_param_decode).
 * - State descriptors declare per-sequence state an instruction needs (the KV cache
 *   of one attention layer), with a lifecycle implemented by the runtime.
 *
 * Passes: kiln_plan_compile runs liveness (last read of every register, kill sets per
 * instruction) and register allocation onto physical buffers, then sizes the buffers
 * for a mode (prefill: many tokens per step; decode: few). The validator
 * (kiln_plan_validate) rejects malformed plans with typed errors.
 *
 * Ownership: a kiln_plan owns all its arrays (kiln_plan_free). Builders append with
 * bounds checks and report allocation failures through kiln_err.
 */
#ifndef KILN_PLAN_PLAN_H
#define KILN_PLAN_PLAN_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- opcodes ----
 * Ranges (an opcode's high nibble says its family; new ops go in their range):
 *   0x00-0x0f  embeddings and normalisation      0x10-0x1f  token mixing (attention)
 *   0x20-0x2f  channel mixing (FFN, MoE)          0x30-0x3f  elementwise
 *   0x40-0x4f  output heads                       0x50-0x5f  reserved: recurrent state
 *                                                            mixers (mamba, shortconv)
 *   0x60-0x6f  collectives (tensor parallelism: plan/tp.h inserts them; a plan for
 *              one device never has them)
 *   0x70-0x7f  reserved: experimental / fused ops
 * Values are stable (they appear in param block headers). */
typedef enum kiln_opcode {
    KILN_OP_NONE = 0x00,
    KILN_OP_EMBED = 0x01,      /* token ids of the step -> hidden                */
    KILN_OP_RMS_NORM = 0x02,   /* in -> rms_norm(in) * w                          */
    KILN_OP_LAYER_NORM = 0x03, /* reserved (no adapter yet)                       */
    KILN_OP_ATTENTION = 0x10,  /* q/k/v proj, qk norm, rope, kv write, attn, o    */
    KILN_OP_MLA = 0x11,        /* reserved: multi-head latent attention           */
    KILN_OP_FFN = 0x20,        /* gated (swiglu/geglu) or plain feed-forward      */
    KILN_OP_MOE = 0x21,        /* reserved: mixture of experts                    */
    KILN_OP_RESIDUAL_ADD = 0x30,
    KILN_OP_LM_HEAD = 0x40, /* rows that want logits -> the step's logits      */
    /* collectives over the ranks of a tensor-parallel group (runtime/comm.h) */
    KILN_OP_ALL_REDUCE = 0x60,    /* in -> sum of in over ranks (same width)        */
    KILN_OP_GATHER_LOGITS = 0x61, /* the ranks' vocabulary shards of the step's
                                     logits -> the full logits of every rank        */
    KILN_OP_LIMIT = 0x80,         /* one past the largest opcode                     */
} kiln_opcode;

/* "attention", or NULL for an unassigned value. */
const char *kiln_opcode_name(uint32_t op);

#define KILN_PLAN_MAX_IO      4
#define KILN_PLAN_MAX_WEIGHTS 12
#define KILN_PARAM_MAX        256
#define KILN_PLAN_NO_WEIGHT   UINT32_MAX
#define KILN_WEIGHT_NAME_MAX  96

/* Weight slots of each opcode (index into kiln_insn.w). */
enum {
    KILN_W_EMBED_TABLE = 0,
    KILN_W_NORM = 0,
    KILN_W_ATT_Q = 0,
    KILN_W_ATT_K,
    KILN_W_ATT_V,
    KILN_W_ATT_O,
    KILN_W_ATT_BQ,
    KILN_W_ATT_BK,
    KILN_W_ATT_BV,
    KILN_W_ATT_BO,
    KILN_W_ATT_Q_NORM,
    KILN_W_ATT_K_NORM,
    KILN_W_ATT_ROPE_FREQS,
    KILN_W_ATT_COUNT,
    KILN_W_FFN_GATE = 0,
    KILN_W_FFN_UP,
    KILN_W_FFN_DOWN,
    KILN_W_FFN_COUNT,
    KILN_W_LM_HEAD = 0,
};

/* Which rows a register has: one per token of the step, or one per logits row. */
typedef enum kiln_rows { KILN_ROWS_TOKENS = 0, KILN_ROWS_LOGITS = 1 } kiln_rows;

typedef struct kiln_reg_desc {
    uint32_t width; /* floats per row */
    uint8_t rows;   /* kiln_rows */
} kiln_reg_desc;

/* What kind of tensor a weight slot takes. */
typedef enum kiln_wclass {
    KILN_WCLASS_MATRIX = 0, /* [n][k] rows in any dtype the backend computes with */
    KILN_WCLASS_VECTOR = 1, /* [n] f32 (norm weights, biases, rope factors)      */
} kiln_wclass;

/* How a weight reference selects from its tensor (tensor parallelism, plan/tp.h): the
 * whole tensor, or part shard_index of shard_count equal parts of its rows (shape[1];
 * for a rank-1 tensor its elements) or of its columns (shape[0]). shape[] is the shard's
 * shape; the binder checks the tensor against it and the load plan selects the shard. */
typedef enum kiln_wshard {
    KILN_WSHARD_NONE = 0,
    KILN_WSHARD_ROWS = 1,
    KILN_WSHARD_COLS = 2,
} kiln_wshard;

typedef struct kiln_weight_ref {
    char name[KILN_WEIGHT_NAME_MAX]; /* GGUF tensor name, "blk.3.attn_q.weight" */
    int32_t rank;                    /* 1..4                                    */
    int64_t shape[4];                /* GGUF order: shape[0] is contiguous (k)  */
    uint8_t wclass;                  /* kiln_wclass                             */
    uint8_t shard;                   /* kiln_wshard                             */
    int16_t shard_index, shard_count;
} kiln_weight_ref;

/* ---- state descriptors ----
 * The runtime owns state memory; a descriptor says what one sequence needs and how
 * the state behaves over the sequence's life:
 *   alloc  — blocks are taken on demand as positions are written;
 *   reset  — the sequence restarts at position 0 (blocks returned);
 *   reuse  — the first n positions are kept (multi-turn prefix), the rest dropped;
 *   evict  — all blocks are returned, the sequence stays valid (re-prefill later);
 *   fork   — a new sequence shares the full blocks of its parent (refcounted) and
 *            copies the partial last block;
 *   free   — the sequence ends, its blocks return to the pool. */
typedef enum kiln_state_kind { KILN_STATE_KV = 1 } kiln_state_kind;

enum {
    KILN_LIFE_ALLOC = 1u << 0,
    KILN_LIFE_RESET = 1u << 1,
    KILN_LIFE_REUSE = 1u << 2,
    KILN_LIFE_EVICT = 1u << 3,
    KILN_LIFE_FORK = 1u << 4,
    KILN_LIFE_FREE = 1u << 5,
    KILN_LIFE_ALL = 0x3f,
};

typedef struct kiln_state_desc {
    uint8_t kind; /* kiln_state_kind                        */
    uint32_t lifecycle;
    int32_t n_kv_head, head_dim; /* KV: per-token shape of K and of V */
    int32_t layer;               /* KV: index of the cache layer      */
} kiln_state_desc;

typedef struct kiln_insn {
    uint16_t opcode;
    uint8_t n_in, n_out;
    uint16_t in[KILN_PLAN_MAX_IO], out[KILN_PLAN_MAX_IO];
    uint32_t w[KILN_PLAN_MAX_WEIGHTS]; /* weight index per slot or KILN_PLAN_NO_WEIGHT */
    int32_t param;                     /* param block index, -1: none                  */
    int32_t state;                     /* state descriptor index, -1: none             */
    int32_t layer;                     /* model layer (for names and traces), -1      */
} kiln_insn;

typedef struct kiln_param_block {
    uint16_t size;
    uint8_t bytes[KILN_PARAM_MAX];
} kiln_param_block;

typedef enum kiln_plan_mode { KILN_MODE_PREFILL = 0, KILN_MODE_DECODE = 1 } kiln_plan_mode;

typedef struct kiln_plan {
    kiln_insn *insns;
    int32_t n_insns, cap_insns;
    kiln_reg_desc *regs;
    int32_t n_regs, cap_regs;
    kiln_weight_ref *weights;
    int32_t n_weights, cap_weights;
    uint32_t *wmap;   /* weights by name (open addressing): index + 1, 0 = empty slot   */
    int32_t wmap_cap; /* slots: a power of two, at least twice n_weights              */
    kiln_param_block *params;
    int32_t n_params, cap_params;
    kiln_state_desc *states;
    int32_t n_states, cap_states;
    /* filled by kiln_plan_compile */
    int32_t *last_read;   /* [n_regs] instruction index of the last read, -1: never read */
    int32_t *def;         /* [n_regs] instruction that writes it                       */
    int32_t *kill_start;  /* [n_insns + 1] CSR offsets into kill                       */
    uint16_t *kill;       /* registers dead after instruction i                        */
    int32_t *phys;        /* [n_regs] physical buffer of each register                 */
    int32_t n_phys;       /* physical buffers (peak registers)                        */
    uint32_t *phys_width; /* [n_phys] floats per row                                   */
    uint8_t *phys_rows;   /* [n_phys] kiln_rows                                        */
    bool compiled;
} kiln_plan;

/* ---- building ---- */
void kiln_plan_init(kiln_plan *p);
void kiln_plan_free(kiln_plan *p);
/* New register; *out gets its id. Fails past 65535 registers. */
kiln_status kiln_plan_reg(kiln_plan *p, uint32_t width, kiln_rows rows, uint16_t *out,
                          kiln_err *err);
/* Adds (or finds, by name) a weight reference; *out gets its index. A second reference
 * to the same name must agree on shape and class. (Shard fields start as NONE.) */
kiln_status kiln_plan_weight(kiln_plan *p, const char *name, kiln_wclass wclass, int rank,
                             const int64_t *shape, uint32_t *out, kiln_err *err);
kiln_status kiln_plan_param(kiln_plan *p, const kiln_param_block *pb, int32_t *out, kiln_err *err);
kiln_status kiln_plan_state(kiln_plan *p, const kiln_state_desc *sd, int32_t *out, kiln_err *err);
/* Appends a copy of the instruction. */
kiln_status kiln_plan_emit(kiln_plan *p, const kiln_insn *in, kiln_err *err);
/* An instruction with no inputs, outputs or weights (param/state/layer -1). */
kiln_insn kiln_insn_make(kiln_opcode op);

/* ---- param blocks ----
 * Layout (little-endian): u16 opcode, u8 version, u8 reserved (0), u16 total size,
 * u16 reserved (0), then the opcode's fields. kiln_param_encode writes the current
 * version; kiln_param_decode checks opcode, version, size and each field's range. */
#define KILN_PARAM_VERSION 1

typedef struct kiln_embed_params {
    float scale;
    /* a vocabulary shard (tensor parallelism): the table holds ids [vocab_base,
     * vocab_base + rows); other ids give zero rows (an all-reduce follows) */
    int32_t vocab_shard; /* 0 or 1 */
    int32_t vocab_base;
} kiln_embed_params;

typedef struct kiln_norm_params {
    float eps;
    float w_offset; /* 0, or 1 when the checkpoint stores w - 1 (HF Gemma) */
} kiln_norm_params;

typedef struct kiln_attn_params {
    int32_t n_head, n_kv_head, head_dim;
    int32_t n_rot;     /* rotated dims per head (<= head_dim, even) */
    int32_t rope_mode; /* kiln_rope_mode (kernels/kernel.h)         */
    float rope_base, rope_freq_scale;
    float ext_factor, attn_factor, beta_fast, beta_slow;
    int32_t n_ctx_orig;
    float scale;   /* attention score scale                       */
    float softcap; /* 0: off                                      */
    int32_t window;
    float qk_norm_eps; /* used when q/k norm weights are bound       */
    float qk_norm_offset;
} kiln_attn_params;

typedef struct kiln_ffn_params {
    int32_t act; /* kiln_glu_act (kernels/kernel.h), applied to the gate when bound */
} kiln_ffn_params;

typedef struct kiln_lm_head_params {
    float softcap; /* final logit softcap, 0: off */
} kiln_lm_head_params;

typedef struct kiln_gather_params {
    int32_t n_vocab; /* full logits row; each of the n_ranks ranks holds n_vocab / n_ranks */
    int32_t n_ranks;
} kiln_gather_params;

typedef union kiln_params {
    kiln_embed_params embed;
    kiln_norm_params norm;
    kiln_attn_params attn;
    kiln_ffn_params ffn;
    kiln_lm_head_params lm_head;
    kiln_gather_params gather;
} kiln_params;

kiln_status kiln_param_encode(kiln_opcode op, const kiln_params *in, kiln_param_block *out,
                              kiln_err *err);
kiln_status kiln_param_decode(kiln_opcode op, const kiln_param_block *in, kiln_params *out,
                              kiln_err *err);

/* ---- passes ---- */
/* Liveness, kill sets and register allocation. Requires a structurally valid plan
 * (kiln_plan_validate). Idempotent. */
kiln_status kiln_plan_compile(kiln_plan *p, kiln_err *err);
/* Bytes of every physical buffer for `tokens` token rows and `logit_rows` logits rows. */
kiln_status kiln_plan_buffer_bytes(const kiln_plan *p, int64_t tokens, int64_t logit_rows,
                                   size_t *bytes_per_phys, size_t *total, kiln_err *err);
/* Checks the allocation: two registers whose live ranges overlap never share a
 * physical buffer. Used by tests and by debug builds of the engine. */
kiln_status kiln_plan_check_alloc(const kiln_plan *p, kiln_err *err);

/* ---- validation ---- */
typedef enum kiln_plan_error {
    KILN_PLAN_OK = 0,
    KILN_PLAN_EUNSUPPORTED_OPCODE, /* opcode unknown, or no adapter in the backend */
    KILN_PLAN_EREG_RANGE,          /* register id >= register count               */
    KILN_PLAN_EREG_UNDEFINED,      /* register read before any instruction wrote it */
    KILN_PLAN_EREG_REDEFINED,      /* register written twice                       */
    KILN_PLAN_EARITY,              /* wrong number of inputs/outputs for the opcode */
    KILN_PLAN_EWEIGHT_MISSING,     /* required weight slot empty, or tensor absent */
    KILN_PLAN_EWEIGHT_SHAPE,       /* tensor shape differs from the reference      */
    KILN_PLAN_EWEIGHT_DTYPE,       /* tensor dtype not computable by the backend   */
    KILN_PLAN_EPARAM_ABI,          /* param block missing, wrong opcode/version/size/values */
    KILN_PLAN_ERANK,               /* weight rank outside 1..4                     */
    KILN_PLAN_ESTATE_MISSING,      /* op needs a state block and has none (or bad) */
    KILN_PLAN_EWIDTH,              /* register widths disagree with the op         */
} kiln_plan_error;

const char *kiln_plan_error_name(kiln_plan_error e);

/* Result of a validation: the first error, where it is, and (in err) a message. */
typedef struct kiln_plan_check {
    kiln_plan_error code;
    int32_t insn; /* instruction index or -1 */
} kiln_plan_check;

/* Checks opcodes (against `supported`, a table of KILN_OP_LIMIT flags, or any
 * assigned opcode when NULL), register ids, define-before-use, arity, weight refs
 * (rank, required slots), param blocks (decoded) and state references. Returns
 * KILN_ERR_PLAN with *chk filled on the first error. */
kiln_status kiln_plan_validate(const kiln_plan *p, const bool *supported, kiln_plan_check *chk,
                               kiln_err *err);

#endif /* KILN_PLAN_PLAN_H */
