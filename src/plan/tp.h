/*
 * tp.h — tensor parallelism: the sharding rules, in one place (issue 15, docs/TP.md).
 *
 * kiln_plan_tp_shard rewrites a family's plan (any family: it reads opcodes and param
 * blocks, never the family) into the plan of one rank of an n-rank group:
 *   attention  heads split: q (and its bias) by output rows, head groups [r*nh/n,
 *              (r+1)*nh/n); k, v (and biases) by output rows, the KV heads those q heads
 *              read: nkv/n heads each when nkv >= n, else one KV head replicated on the
 *              n/nkv ranks whose q heads share it; the output projection by input
 *              columns; its bias on rank 0 only; q/k norms and rope factors replicated;
 *              then an all_reduce of the output. The KV state of the layer holds the
 *              rank's KV heads only.
 *   ffn        gate and up by output rows (n_ff / n each), down by input columns, then an
 *              all_reduce.
 *   embed      the table split by vocabulary rows (ids [r*V/n, (r+1)*V/n); other ids give
 *              zero rows), then an all_reduce.
 *   lm_head    split by vocabulary rows; a gather_logits after it assembles every rank's
 *              full logits rows.
 *   embed and lm_head are replicated instead (no collective) when n does not divide the
 *   vocabulary; norms and residual adds run replicated on every rank.
 * Shards are recorded in the weight references (kiln_weight_ref.shard, plan.h): the
 * binder checks the tensor against them and asks the load plan for exactly that shard
 * (load/load.h), so each rank's weights are a shard selection of the load plan.
 *
 * Requirements (else KILN_ERR_UNSUPPORTED naming the layer and what does not divide):
 * n_head % n == 0; n_kv_head % n == 0 or n % n_kv_head == 0; n_ff % n == 0; the column
 * shards must split quantized rows at whole blocks (checked by the loader). An opcode
 * without a rule here (MoE, MLA...) is refused.
 *
 * Ownership: *out is initialized here and owned by the caller (kiln_plan_free), also
 * after a failure. `in` is not changed.
 */
#ifndef KILN_PLAN_TP_H
#define KILN_PLAN_TP_H

#include "plan/plan.h"

/* What the rewrite decided (for reports and the engine). */
typedef struct kiln_tp_layout {
    int32_t n_ranks;
    bool vocab_split; /* embed and lm_head split by vocabulary (else replicated) */
    int32_t n_vocab;  /* full logits row */
    int32_t n_vocab_local;
    int32_t n_all_reduce; /* collectives per step */
} kiln_tp_layout;

kiln_status kiln_plan_tp_shard(const kiln_plan *in, int rank, int n_ranks, kiln_plan *out,
                               kiln_tp_layout *layout, kiln_err *err);

#endif /* KILN_PLAN_TP_H */
