/* opmap.c — model op -> opcode table (see opmap.h). */
#include "plan/opmap.h"

static const struct {
    const char *name;
    kiln_opcode op;
} opmap[KILN_MOP_COUNT] = {
    [KILN_MOP_TOKEN_EMBED] = {"token_embed", KILN_OP_EMBED},
    [KILN_MOP_NORM] = {"norm", KILN_OP_RMS_NORM},
    [KILN_MOP_SELF_ATTENTION] = {"self_attention", KILN_OP_ATTENTION},
    [KILN_MOP_GATED_FFN] = {"gated_ffn", KILN_OP_FFN},
    [KILN_MOP_RESIDUAL] = {"residual", KILN_OP_RESIDUAL_ADD},
    [KILN_MOP_OUTPUT] = {"output", KILN_OP_LM_HEAD},
};

kiln_opcode kiln_opmap(kiln_model_op op) {
    return (unsigned)op < KILN_MOP_COUNT ? opmap[op].op : KILN_OP_NONE;
}

const char *kiln_model_op_name(kiln_model_op op) {
    return (unsigned)op < KILN_MOP_COUNT ? opmap[op].name : "unknown";
}
