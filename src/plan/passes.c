/*
 * passes.c — liveness and register allocation.
 *
 * Registers are SSA (written once), so each register's live range is the interval
 * [def, last_read]. Allocation walks the instructions in order: an instruction's
 * outputs take physical buffers from the free list (buffers of the same row kind,
 * widest-fit first, so one buffer may host registers of several widths and is sized to
 * the widest), and only then do the registers whose last read is this instruction go
 * back to the free list. An output therefore never shares a buffer with an input of the
 * same instruction, which lets kernels assume no aliasing between their inputs and
 * outputs. A register never read dies right after its instruction.
 */
#include "plan/plan.h"

#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

kiln_status kiln_plan_compile(kiln_plan *p, kiln_err *err) {
    if (p->compiled) return KILN_OK;
    int32_t nr = p->n_regs, ni = p->n_insns;
    int32_t *last = kiln_malloc(sizeof(int32_t) * (size_t)(nr + 1));
    int32_t *def = kiln_malloc(sizeof(int32_t) * (size_t)(nr + 1));
    int32_t *kstart = kiln_calloc((size_t)ni + 2, sizeof(int32_t));
    uint16_t *kill = kiln_malloc(sizeof(uint16_t) * (size_t)(nr + 1));
    int32_t *phys = kiln_malloc(sizeof(int32_t) * (size_t)(nr + 1));
    uint32_t *pw = kiln_calloc((size_t)nr + 1, sizeof(uint32_t));
    uint8_t *prow = kiln_calloc((size_t)nr + 1, 1);
    int32_t *freelist = kiln_malloc(sizeof(int32_t) * (size_t)(nr + 1));
    int32_t *dead_at = kiln_malloc(sizeof(int32_t) * (size_t)(nr + 1));
    if (!last || !def || !kstart || !kill || !phys || !pw || !prow || !freelist || !dead_at) {
        kiln_free(last), kiln_free(def), kiln_free(kstart), kiln_free(kill), kiln_free(phys),
            kiln_free(pw), kiln_free(prow);
        kiln_free(freelist), kiln_free(dead_at);
        return kiln_err_set(err, KILN_ERR_NOMEM, "plan compile: out of memory");
    }
    for (int32_t r = 0; r < nr; r++) last[r] = def[r] = phys[r] = -1;
    /* liveness */
    for (int32_t i = 0; i < ni; i++) {
        const kiln_insn *in = &p->insns[i];
        for (int k = 0; k < in->n_in; k++) last[in->in[k]] = i;
        for (int k = 0; k < in->n_out; k++) def[in->out[k]] = i;
    }
    /* kill sets: register r dies after max(def, last_read) */
    for (int32_t r = 0; r < nr; r++) {
        int32_t d = last[r] > def[r] ? last[r] : def[r];
        dead_at[r] = d;
        if (d >= 0) kstart[d + 1]++;
    }
    for (int32_t i = 0; i < ni; i++) kstart[i + 1] += kstart[i];
    {
        int32_t *fill = kiln_calloc((size_t)ni + 1, sizeof(int32_t));
        if (!fill) {
            kiln_free(last), kiln_free(def), kiln_free(kstart), kiln_free(kill), kiln_free(phys),
                kiln_free(pw), kiln_free(prow);
            kiln_free(freelist), kiln_free(dead_at);
            return kiln_err_set(err, KILN_ERR_NOMEM, "plan compile: out of memory");
        }
        for (int32_t r = 0; r < nr; r++)
            if (dead_at[r] >= 0) kill[kstart[dead_at[r]] + fill[dead_at[r]]++] = (uint16_t)r;
        kiln_free(fill);
    }
    /* allocation */
    int32_t n_phys = 0, n_free = 0;
    for (int32_t i = 0; i < ni; i++) {
        const kiln_insn *in = &p->insns[i];
        for (int k = 0; k < in->n_out; k++) {
            const kiln_reg_desc *rd = &p->regs[in->out[k]];
            int best = -1;
            for (int f = 0; f < n_free; f++) {
                int32_t b = freelist[f];
                if (prow[b] != rd->rows) continue;
                /* prefer a buffer already wide enough, the narrowest such; else the widest */
                if (best < 0)
                    best = f;
                else {
                    int32_t cb = freelist[best];
                    bool fits = pw[b] >= rd->width, cfits = pw[cb] >= rd->width;
                    if ((fits && !cfits) || (fits && cfits && pw[b] < pw[cb]) ||
                        (!fits && !cfits && pw[b] > pw[cb]))
                        best = f;
                }
            }
            int32_t b;
            if (best >= 0) {
                b = freelist[best];
                freelist[best] = freelist[--n_free];
            } else {
                b = n_phys++;
                prow[b] = rd->rows;
                pw[b] = 0;
            }
            if (pw[b] < rd->width) pw[b] = rd->width;
            phys[in->out[k]] = b;
        }
        for (int32_t k = kstart[i]; k < kstart[i + 1]; k++) {
            int32_t r = kill[k];
            if (phys[r] >= 0) freelist[n_free++] = phys[r];
        }
    }
    kiln_free(freelist);
    kiln_free(dead_at);
    kiln_free(p->last_read), kiln_free(p->def), kiln_free(p->kill_start), kiln_free(p->kill),
        kiln_free(p->phys);
    kiln_free(p->phys_width), kiln_free(p->phys_rows);
    p->last_read = last;
    p->def = def;
    p->kill_start = kstart;
    p->kill = kill;
    p->phys = phys;
    p->phys_width = pw;
    p->phys_rows = prow;
    p->n_phys = n_phys;
    p->compiled = true;
    return KILN_OK;
}

kiln_status kiln_plan_buffer_bytes(const kiln_plan *p, int64_t tokens, int64_t logit_rows,
                                   size_t *bytes_per_phys, size_t *total, kiln_err *err) {
    if (!p->compiled) return kiln_err_set(err, KILN_ERR_STATE, "plan not compiled");
    size_t sum = 0;
    for (int32_t b = 0; b < p->n_phys; b++) {
        int64_t rows = p->phys_rows[b] == KILN_ROWS_LOGITS ? logit_rows : tokens;
        size_t n, a;
        KILN_TRY(
            kiln_size_mul_err((size_t)rows, (size_t)p->phys_width[b], &n, "register buffer", err));
        KILN_TRY(kiln_size_mul_err(n, sizeof(float), &n, "register buffer", err));
        if (!kiln_size_align_up(n, KILN_ALIGN, &a))
            return kiln_err_set(err, KILN_ERR_OVERFLOW, "register buffer size overflow");
        if (bytes_per_phys) bytes_per_phys[b] = a;
        KILN_TRY(kiln_size_add_err(sum, a, &sum, "register buffers", err));
    }
    if (total) *total = sum;
    return KILN_OK;
}

kiln_status kiln_plan_check_alloc(const kiln_plan *p, kiln_err *err) {
    if (!p->compiled) return kiln_err_set(err, KILN_ERR_STATE, "plan not compiled");
    for (int32_t a = 0; a < p->n_regs; a++) {
        if (p->def[a] < 0) continue;
        int32_t ea = p->last_read[a] > p->def[a] ? p->last_read[a] : p->def[a];
        if (p->phys[a] < 0 || p->phys[a] >= p->n_phys)
            return kiln_err_set(err, KILN_ERR_INTERNAL, "r%d has no physical buffer", (int)a);
        if (p->phys_width[p->phys[a]] < p->regs[a].width)
            return kiln_err_set(err, KILN_ERR_INTERNAL, "r%d wider than its buffer", (int)a);
        for (int32_t b = a + 1; b < p->n_regs; b++) {
            if (p->def[b] < 0 || p->phys[b] != p->phys[a]) continue;
            int32_t eb = p->last_read[b] > p->def[b] ? p->last_read[b] : p->def[b];
            /* live ranges [def, end]; sharing is allowed only when one ends strictly
             * before the other is defined */
            bool disjoint = ea < p->def[b] || eb < p->def[a];
            if (!disjoint)
                return kiln_err_set(err, KILN_ERR_INTERNAL,
                                    "r%d [%d, %d] and r%d [%d, %d] overlap but share buffer %d",
                                    (int)a, (int)p->def[a], (int)ea, (int)b, (int)p->def[b],
                                    (int)eb, (int)p->phys[a]);
        }
    }
    return KILN_OK;
}
