/*
 * prov_openblas.c — the "openblas" provider: matmul through cblas_sgemm.
 *
 * The library is opened with dlopen at run time (libopenblas.so.0), so a machine without
 * it simply lists the provider as unavailable (PROVIDER_UNAVAILABLE), never fails.
 *
 * The rule for when sgemm fits (docs/KERNELS.md):
 *  - openblas.sgemm.f32: f32 weights, plain layout: one sgemm y = x W^T on the weights
 *    in place. Any token count.
 *  - openblas.sgemm.dq: f16, bf16 and quantized weights. The weights are dequantized
 *    chunk by chunk (64 rows at a time, into the kernel's workspace) and each chunk goes
 *    through sgemm. Dequantizing costs the same as one pass of the reference kernel, so
 *    it only pays when a call carries many tokens: its spec says good_tokens = 16, which
 *    makes scoring penalize it for smaller buckets unless measured timings say otherwise.
 * Neither is batch-invariant (sgemm blocks differently for different M); both are
 * deterministic for a fixed OpenBLAS thread count.
 *
 * openblas_lib is this file's singleton: the dlopen handle and symbols, resolved once
 * (pthread_once) and immutable afterwards.
 */
#include "base/mem.h"
#include "format/dtype.h"
#include "kernels/registry.h"
#include "kernels/select.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* kiln_dequantize_row lives in src/format/; weak so this provider links without it. */
#pragma weak kiln_dequantize_row

enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };
typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);

static struct {
    pthread_once_t once;
    void *handle;
    sgemm_fn sgemm;
    char why[160];
} openblas_lib = {.once = PTHREAD_ONCE_INIT};

static void openblas_open(void) {
    static const char *const names[] = {"libopenblas.so.0", "libopenblas.so",
                                        "libopenblasp-r0.3.so"};
    const char *last = "not found";
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char *e = dlerror();
            if (e) last = e;
            continue;
        }
        void *sym = dlsym(h, "cblas_sgemm");
        if (!sym) {
            snprintf(openblas_lib.why, sizeof openblas_lib.why, "%s has no cblas_sgemm", names[i]);
            dlclose(h);
            return;
        }
        openblas_lib.handle = h;
        memcpy(&openblas_lib.sgemm, &sym, sizeof sym);
        return;
    }
    snprintf(openblas_lib.why, sizeof openblas_lib.why, "dlopen libopenblas.so.0 failed: %s", last);
}

static bool openblas_probe(char *why, size_t why_size) {
    pthread_once(&openblas_lib.once, openblas_open);
    if (openblas_lib.sgemm) return true;
    snprintf(why, why_size, "%s", openblas_lib.why);
    return false;
}

static bool fits_int(int64_t v) {
    return v >= 0 && v <= INT_MAX;
}

static void add_bias(const kiln_matmul_args *a) {
    if (!a->bias) return;
    for (int64_t t = 0; t < a->t; t++) {
        float *y = a->y + t * a->y_stride;
        for (int64_t i = 0; i < a->n; i++) y[i] += a->bias[i];
    }
}

static kiln_status check_args(const kiln_matmul_args *a, kiln_err *err) {
    if (!openblas_lib.sgemm)
        return kiln_err_set(err, KILN_ERR_STATE, "openblas: library not loaded");
    if (!fits_int(a->n) || !fits_int(a->k) || !fits_int(a->t) || !fits_int(a->x_stride) ||
        !fits_int(a->y_stride))
        return kiln_err_set(err, KILN_ERR_RANGE, "openblas: matmul dims exceed 32-bit blasint");
    return KILN_OK;
}

static kiln_status openblas_sgemm_f32(const kiln_kctx *c, const kiln_matmul_args *a) {
    (void)c;
    KILN_TRY(check_args(a, NULL));
    if (a->w_dtype != KILN_DTYPE_F32 || a->w_row_bytes % 4 || !fits_int(a->w_row_bytes / 4))
        return KILN_ERR_TYPE;
    if (a->t == 0 || a->n == 0) return KILN_OK;
    openblas_lib.sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS, (int)a->t, (int)a->n,
                       (int)a->k, 1.0f, a->x, (int)a->x_stride, (const float *)a->w,
                       (int)(a->w_row_bytes / 4), 0.0f, a->y, (int)a->y_stride);
    add_bias(a);
    return KILN_OK;
}

enum { DQ_ROWS = 64 };

static kiln_status dequant_row(uint32_t dtype, const void *src, float *dst, int64_t k) {
    if (dtype == KILN_DTYPE_F16) {
        const uint16_t *h = src;
        for (int64_t i = 0; i < k; i++) dst[i] = kiln_fp16_to_f32(h[i]);
        return KILN_OK;
    }
    if (dtype == KILN_DTYPE_BF16) {
        const uint16_t *h = src;
        for (int64_t i = 0; i < k; i++) dst[i] = kiln_bf16_to_f32(h[i]);
        return KILN_OK;
    }
    if (!kiln_dequantize_row) return KILN_ERR_UNSUPPORTED;
    return kiln_dequantize_row(dtype, src, dst, k, NULL);
}

typedef struct dq_job {
    const kiln_matmul_args *a;
    float *buf;
    int64_t r0, rows;
    kiln_status st;
} dq_job;

static void dq_rows(void *ctx, int64_t begin, int64_t end, int ith) {
    (void)ith;
    dq_job *j = ctx;
    const kiln_matmul_args *a = j->a;
    for (int64_t r = begin; r < end; r++) {
        const uint8_t *src = (const uint8_t *)a->w + (size_t)(j->r0 + r) * a->w_row_bytes;
        kiln_status st = dequant_row(a->w_dtype, src, j->buf + r * a->k, a->k);
        if (st) j->st = st; /* any failure wins; same value from every thread */
    }
}

static kiln_status openblas_sgemm_dq(const kiln_kctx *c, const kiln_matmul_args *a) {
    KILN_TRY(check_args(a, NULL));
    size_t need = (size_t)DQ_ROWS * (size_t)a->k * sizeof(float);
    if (a->t == 0 || a->n == 0) return KILN_OK;
    /* the workspace the spec declares; without it (an executor that gives no scratch)
     * the kernel allocates its own, like the cpu kernels do */
    float *own = NULL, *buf;
    if (c && c->scratch && c->scratch_size >= need) {
        buf = c->scratch;
    } else {
        own = kiln_alloc_aligned(need);
        if (!own) return KILN_ERR_NOMEM;
        buf = own;
    }
    kiln_status st = KILN_OK;
    for (int64_t r0 = 0; r0 < a->n && !st; r0 += DQ_ROWS) {
        int64_t rows = a->n - r0 < DQ_ROWS ? a->n - r0 : DQ_ROWS;
        dq_job j = {.a = a, .buf = buf, .r0 = r0, .rows = rows, .st = KILN_OK};
        kiln_pool_for(c ? c->pool : NULL, rows, 4, dq_rows, &j);
        st = j.st;
        if (!st)
            openblas_lib.sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS, (int)a->t, (int)rows,
                               (int)a->k, 1.0f, a->x, (int)a->x_stride, buf, (int)a->k, 0.0f,
                               a->y + r0, (int)a->y_stride);
    }
    kiln_free_aligned(own);
    if (st) return st;
    add_bias(a);
    return KILN_OK;
}

static size_t dq_workspace(const kiln_sel_ctx *ctx) {
    size_t out;
    if (ctx->k <= 0 || !kiln_size_mul((size_t)DQ_ROWS * sizeof(float), (size_t)ctx->k, &out))
        return SIZE_MAX;
    return out;
}

static const kiln_kernel_spec openblas_specs[] = {
    {.id = "openblas.sgemm.matmul.f32",
     .op = KILN_KOP_MATMUL,
     .provider = "openblas",
     .platform = KILN_PLATFORM_HOST,
     .w_dtypes = KILN_DT(KILN_DTYPE_F32),
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .features = KILN_KFEAT_BIAS,
     .props = KILN_KPROP_DETERMINISTIC,
     .priority = 50,
     .fn.matmul = openblas_sgemm_f32,
     .summary = "cblas_sgemm on f32 weights in place"},
    {.id = "openblas.sgemm.matmul.dq",
     .op = KILN_KOP_MATMUL,
     .provider = "openblas",
     .platform = KILN_PLATFORM_HOST,
     .w_dtypes = (KILN_DT_FLOATS & ~KILN_DT(KILN_DTYPE_F32)) | KILN_DT_QUANTS,
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .features = KILN_KFEAT_BIAS,
     .props = KILN_KPROP_DETERMINISTIC,
     .good_tokens = 16,
     .workspace = dq_workspace,
     .priority = 40,
     .fn.matmul = openblas_sgemm_dq,
     .summary = "dequantize 64-row chunks to f32, then cblas_sgemm"},
};

const kiln_provider kiln_provider_openblas = {
    .name = "openblas",
    .summary = "OpenBLAS cblas_sgemm (dlopen libopenblas.so.0)",
    .specs = openblas_specs,
    .n_specs = (int)(sizeof openblas_specs / sizeof openblas_specs[0]),
    .probe = openblas_probe,
};
