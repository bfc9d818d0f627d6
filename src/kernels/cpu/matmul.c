/*
 * matmul.c — the matmul driver of the CPU backend: scratch, activation quantization,
 * and the split of output rows over the thread pool. The inner loops live in
 * matmul_{q,f}_{avx2,avx512}.c; this file is compiled for baseline x86-64 and only
 * calls an ISA's loops through the function pointers below.
 *
 * Work split: rows are handed out dynamically (kiln_pool_for) in chunks that are a
 * multiple of 16 rows, so each thread writes whole 64-byte lines of every output row,
 * and a thread slowed down by another process does not hold the other one back.
 * Decode (t == 1) and prefill (t > 1) both split rows: each weight byte is read once.
 */
#include "base/cpu.h"
#include "base/mem.h"
#include "format/dtype.h"
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu_kernels.h"

#include <string.h>

#define ISA_AVX2 (KILN_ISA_AVX2 | KILN_ISA_FMA | KILN_ISA_F16C)
#define ISA_AVX512                                                                                 \
    (ISA_AVX2 | KILN_ISA_AVX512F | KILN_ISA_AVX512BW | KILN_ISA_AVX512VL | KILN_ISA_AVX512DQ |     \
     KILN_ISA_AVX512VNNI)

bool kiln_cpu_avx512_ok(void) {
    return (kiln_cpu_info()->isa & ISA_AVX512) == ISA_AVX512;
}
bool kiln_cpu_avx2_ok(void) {
    return (kiln_cpu_info()->isa & ISA_AVX2) == ISA_AVX2;
}

bool kiln_cpu_mmq_supports(uint32_t dtype) {
    switch (dtype) {
    case KILN_DTYPE_Q4_0:
    case KILN_DTYPE_Q4_1:
    case KILN_DTYPE_Q5_0:
    case KILN_DTYPE_Q5_1:
    case KILN_DTYPE_Q8_0:
    case KILN_DTYPE_Q4_K:
    case KILN_DTYPE_Q5_K:
    case KILN_DTYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

static bool is_float_type(uint32_t dtype) {
    return dtype == KILN_DTYPE_F32 || dtype == KILN_DTYPE_F16 || dtype == KILN_DTYPE_BF16;
}

bool kiln_cpu_matmul_dtype_ok(uint32_t w_dtype) {
    return kiln_cpu_mmq_supports(w_dtype) || is_float_type(w_dtype);
}

typedef struct isa_impl {
    void (*q8act)(const float *x, int64_t k, uint8_t *dst);
    void (*mmq)(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel);
    void (*mmf)(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel);
    void (*mmr16)(const kiln_cpu_mm *p, int64_t r0, int64_t r1, uint8_t *panel); /* or NULL */
} isa_impl;

static const isa_impl impl_avx512 = {kiln_cpu_q8act_avx512, kiln_cpu_mmq_avx512,
                                     kiln_cpu_mmf_avx512, kiln_cpu_mmr16_avx512};
static const isa_impl impl_avx2 = {kiln_cpu_q8act_avx2, kiln_cpu_mmq_avx2, kiln_cpu_mmf_avx2,
                                   kiln_cpu_mmr16_avx2};

/* Scratch layout: [activations: t * act_stride][panels: nth * panel_bytes]. */
size_t kiln_cpu_panel_bytes(uint32_t dtype, int64_t k, int64_t t) {
    size_t b =
        kiln_cpu_mmq_supports(dtype) ? kiln_cpu_mm_panel_bytes(k) : kiln_cpu_mmf_panel_bytes(k, t);
    if (kiln_cpu_r16_supports(dtype) && kiln_cpu_r16_panel_bytes(k) > b)
        b = kiln_cpu_r16_panel_bytes(k);
    return (b + 63) & ~(size_t)63;
}

/* Float weights, t > 1: the transposed activations (kiln_cpu_mm.xt), 64-byte rows. */
int64_t kiln_cpu_xt_stride(int64_t t) {
    return (t + 15) / 16 * 16;
}
size_t kiln_cpu_xt_bytes(int64_t k, int64_t t) {
    return (size_t)k * (size_t)kiln_cpu_xt_stride(t) * sizeof(float);
}

size_t kiln_cpu_matmul_workspace(uint32_t w_dtype, int64_t n, int64_t k, int64_t t, int nth) {
    (void)n;
    if (nth < 1) nth = 1;
    /* an unbounded bucket (tokens_max INT64_MAX) must not overflow the size arithmetic
     * below: no step carries more than INT32_MAX tokens */
    if (t > INT32_MAX) t = INT32_MAX;
    size_t act = kiln_cpu_mmq_supports(w_dtype) ? (size_t)t * kiln_q8act_row_bytes(k)
                 : t > 1                        ? kiln_cpu_xt_bytes(k, t)
                                                : 0;
    size_t panels = t > 1 ? (size_t)nth * kiln_cpu_panel_bytes(w_dtype, k, t) : 0;
    return act + panels + 64;
}

typedef struct job {
    const isa_impl *isa;
    kiln_cpu_mm mm;
    uint8_t *panels;
    size_t panel_stride;
    const float *x;
    int64_t x_stride;
} job;

static void quant_range(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    job *j = ctx;
    for (int64_t t = b; t < e; t++)
        j->isa->q8act(j->x + t * j->x_stride, j->mm.k,
                      (uint8_t *)j->mm.act + (size_t)t * j->mm.act_stride);
}

typedef struct xt_job {
    const float *x;
    int64_t x_stride, t, ts;
    float *xt;
} xt_job;

/* Columns [b, e) of the activations into xt (tokens padded with zeros). */
static void transpose_range(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    const xt_job *j = ctx;
    for (int64_t i = b; i < e; i++) {
        float *o = j->xt + i * j->ts;
        for (int64_t tk = 0; tk < j->t; tk++) o[tk] = j->x[tk * j->x_stride + i];
        for (int64_t tk = j->t; tk < j->ts; tk++) o[tk] = 0.0f;
    }
}

void kiln_cpu_xt_fill(kiln_pool *pool, const float *x, int64_t x_stride, int64_t k, int64_t t,
                      float *xt) {
    xt_job j = {.x = x, .x_stride = x_stride, .t = t, .ts = kiln_cpu_xt_stride(t), .xt = xt};
    kiln_pool_for(pool, k, 64, transpose_range, &j);
}

static void rows_q(void *ctx, int64_t b, int64_t e, int ith) {
    job *j = ctx;
    j->isa->mmq(&j->mm, b, e, j->panels + (size_t)ith * j->panel_stride);
}

static void rows_r16(void *ctx, int64_t b, int64_t e, int ith) {
    job *j = ctx;
    j->isa->mmr16(&j->mm, b, e, j->panels + (size_t)ith * j->panel_stride);
}

static void rows_f(void *ctx, int64_t b, int64_t e, int ith) {
    job *j = ctx;
    j->isa->mmf(&j->mm, b, e, j->panels + (size_t)ith * j->panel_stride);
}

static kiln_status matmul(const isa_impl *isa, const kiln_kctx *c, const kiln_matmul_args *a,
                          bool bf16) {
    const bool r16 = a->w_layout == KILN_CPU_WLAYOUT_R16;
    if (a->w_layout != 0 && !(r16 && isa->mmr16 && kiln_cpu_r16_supports(a->w_dtype)))
        return KILN_ERR_UNSUPPORTED;
    const bool quant = kiln_cpu_mmq_supports(a->w_dtype);
    if (!quant && !is_float_type(a->w_dtype)) return KILN_ERR_UNSUPPORTED;
    if (a->t <= 0 || a->n <= 0) return KILN_OK;
    kiln_pool *pool = c ? c->pool : NULL;
    const int nth = kiln_pool_size(pool);
    size_t need = kiln_cpu_matmul_workspace(a->w_dtype, a->n, a->k, a->t, nth);
    uint8_t *ws = NULL, *own = NULL;
    if (c && c->scratch && c->scratch_size >= need && ((uintptr_t)c->scratch & 63) == 0)
        ws = c->scratch;
    if (!ws) {
        own = kiln_alloc_aligned(need);
        if (!own) return KILN_ERR_NOMEM;
        ws = own;
    }
    job j = {.isa = isa,
             .mm = {.dtype = a->w_dtype,
                    .w = a->w,
                    .w_row_bytes = a->w_row_bytes,
                    .n = a->n,
                    .k = a->k,
                    .x = a->x,
                    .x_stride = a->x_stride,
                    .t = a->t,
                    .y = a->y,
                    .y_stride = a->y_stride,
                    .bias = a->bias,
                    .bf16 = bf16 && isa == &impl_avx512 && a->w_dtype != KILN_DTYPE_F32 &&
                            (kiln_cpu_info()->isa & KILN_ISA_AVX512BF16)},
             .x = a->x,
             .x_stride = a->x_stride};
    size_t act_bytes = 0;
    if (quant) {
        j.mm.act = ws;
        j.mm.act_stride = kiln_q8act_row_bytes(a->k);
        act_bytes = (size_t)a->t * j.mm.act_stride;
        if (a->t <= 2)
            quant_range(&j, 0, a->t, 0);
        else
            kiln_pool_for(pool, a->t, 1, quant_range, &j);
    }
    /* the AVX2 float GEMM broadcasts x itself (matmul_f_avx2.c): no transposed copy */
    if (!quant && a->t > 1 && !j.mm.bf16 && isa == &impl_avx512) {
        j.mm.xt = (const float *)ws;
        j.mm.xt_stride = kiln_cpu_xt_stride(a->t);
        act_bytes = kiln_cpu_xt_bytes(a->k, a->t);
        kiln_cpu_xt_fill(pool, a->x, a->x_stride, a->k, a->t, (float *)ws);
    }
    j.panels = ws + act_bytes;
    j.panel_stride = kiln_cpu_panel_bytes(a->w_dtype, a->k, a->t);
    kiln_pool_for(pool, a->n, kiln_cpu_row_grain(a->n, nth, !r16 && !quant ? 48 : 16),
                  r16     ? rows_r16
                  : quant ? rows_q
                          : rows_f,
                  &j);
    kiln_free_aligned(own);
    return KILN_OK;
}

kiln_status kiln_cpu_matmul_avx512(const kiln_kctx *c, const kiln_matmul_args *a) {
    return matmul(&impl_avx512, c, a, false);
}

kiln_status kiln_cpu_matmul_avx512_bf16(const kiln_kctx *c, const kiln_matmul_args *a) {
    return matmul(&impl_avx512, c, a, true);
}

kiln_status kiln_cpu_matmul_avx2(const kiln_kctx *c, const kiln_matmul_args *a) {
    return matmul(&impl_avx2, c, a, false);
}
