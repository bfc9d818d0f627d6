/*
 * opmap.h — the one module that maps model-level operations (what a family's plan
 * compiler thinks in) to plan opcodes (what backends implement). A family never names
 * an opcode directly; when a model op gets a dedicated macro-op (say a fused
 * sliding-window attention), only this table changes.
 */
#ifndef KILN_PLAN_OPMAP_H
#define KILN_PLAN_OPMAP_H

#include "plan/plan.h"

typedef enum kiln_model_op {
    KILN_MOP_TOKEN_EMBED = 0, /* token embedding lookup (scaled)            */
    KILN_MOP_NORM,            /* RMS norm, pre or post                       */
    KILN_MOP_SELF_ATTENTION,  /* causal self-attention, full or sliding      */
    KILN_MOP_GATED_FFN,       /* SwiGLU / GeGLU feed-forward                 */
    KILN_MOP_RESIDUAL,        /* residual stream add                         */
    KILN_MOP_OUTPUT,          /* final projection to the vocabulary          */
    KILN_MOP_COUNT
} kiln_model_op;

/* The opcode for a model op (KILN_OP_NONE for an unknown value). */
kiln_opcode kiln_opmap(kiln_model_op op);
const char *kiln_model_op_name(kiln_model_op op);

#endif /* KILN_PLAN_OPMAP_H */
