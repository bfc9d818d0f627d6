/*
 * blas.cu — the prefill matmul through cuBLAS: the weight is dequantized (f16 weights:
 * used in place) into f16 in the scratch, the activations are rounded to f16 in chunks
 * of KILN_CUDA_BLAS_CHUNK rows, and cublasGemmEx multiplies them with f32 accumulation
 * into the f32 output; f32 weights go through cublasSgemm (f32 activations), bf16 weights
 * are widened to f32 and go the same way (bf16 -> f16 could overflow). A bias is added
 * by a small kernel after each chunk.
 *
 * The cuBLAS handle is one per device and host thread (kc_blas_handle: a thread-local
 * singleton, created on first use, never freed before exit); its stream is set per call.
 * cuBLAS may pick a non-deterministic algorithm across builds and GPUs, and its tiling
 * depends on t: not batch invariant (the spec says so).
 */
#include "kernels/cuda/common.cuh"
#include "kernels/select.h"

#include <cublas_v2.h>

static __thread cublasHandle_t kc_blas;
static __thread int kc_blas_dev = -1;

/* The calling thread's handle for the current device (created once). */
static cublasHandle_t kc_blas_handle(void) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return NULL;
    if (kc_blas && kc_blas_dev == dev) return kc_blas;
    cublasHandle_t h = NULL;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return NULL;
    kc_blas = h; /* a handle of another device is kept: cuBLAS handles are cheap */
    kc_blas_dev = dev;
    return h;
}

/* w (n x k of DT, plain rows) -> out (n x k of f16 or f32) */
template <int DT, typename OUT>
__global__ void dequant_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n,
                               int64_t k, OUT *__restrict__ out) {
    const int64_t groups = k / 32;
    const int64_t gi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (gi >= n * groups) return;
    const int64_t r = gi / groups, g = gi % groups;
    float w[32];
    kc_dq32<DT>(W + (size_t)r * row_bytes, g, w);
    OUT *o = out + r * k + g * 32;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        if constexpr (sizeof(OUT) == 2)
            o[i] = __float2half_rn(w[i]);
        else
            o[i] = w[i];
    }
}

__global__ void to_f16_kernel(const float *__restrict__ x, int64_t xs, int64_t rows, int64_t k,
                              __half *__restrict__ out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * k) return;
    const int64_t r = i / k, c = i % k;
    out[i] = __float2half_rn(x[r * xs + c]);
}

__global__ void bias_kernel(float *y, int64_t ys, int64_t rows, int64_t n,
                            const float *__restrict__ b) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * n) return;
    const int64_t r = i / n, c = i % n;
    y[r * ys + c] += b[c];
}

/* f32 weights are used in place; bf16 -> f32; everything else -> f16 (f16: in place) */
static size_t wbytes(uint32_t dt, int64_t n, int64_t k) {
    if (dt == KILN_DTYPE_F32 || dt == KILN_DTYPE_F16) return 0;
    return (size_t)n * (size_t)k * (dt == KILN_DTYPE_BF16 ? 4 : 2);
}

extern "C" size_t kiln_cuda_matmul_cublas_bytes(uint32_t w_dtype, int64_t n, int64_t k) {
    size_t xb = (w_dtype == KILN_DTYPE_F32 || w_dtype == KILN_DTYPE_BF16)
                    ? 0
                    : (size_t)KILN_CUDA_BLAS_CHUNK * (size_t)k * 2;
    return ((wbytes(w_dtype, n, k) + 255) & ~(size_t)255) + xb;
}

extern "C" size_t kiln_cuda_matmul_cublas_workspace(const struct kiln_sel_ctx *ctx) {
    return kiln_cuda_matmul_cublas_bytes(ctx->w_dtype, ctx->n, ctx->k);
}

#define DQ_CASE(DT, s, a, out)                                                                     \
    do {                                                                                           \
        int64_t tot_ = (a)->n * ((a)->k / 32);                                                     \
        dequant_kernel<DT><<<(unsigned)((tot_ + 255) / 256), 256, 0, s>>>(                         \
            (const uint8_t *)(a)->w, (a)->w_row_bytes, (a)->n, (a)->k, out);                       \
    } while (0)

static kiln_status blas_err(cublasStatus_t b) {
    return b == CUBLAS_STATUS_SUCCESS ? KILN_OK : KILN_ERR_DEVICE;
}

extern "C" kiln_status kiln_cuda_matmul_cublas(const kiln_kctx *c, const kiln_matmul_args *a) {
    if (a->t <= 0 || a->n <= 0) return KILN_OK;
    const int be = kc_block_elems(a->w_dtype);
    if (!be || a->k % be || a->w_layout != 0) return KILN_ERR_INVALID_ARG;
    if (a->n > INT32_MAX || a->k > INT32_MAX || a->y_stride > INT32_MAX || a->x_stride > INT32_MAX)
        return KILN_ERR_INVALID_ARG;
    const size_t need = kiln_cuda_matmul_cublas_bytes(a->w_dtype, a->n, a->k);
    if (need && (!c || !c->scratch || c->scratch_size < need)) return KILN_ERR_NOMEM;
    cudaStream_t s = KC_STREAM(c);
    cublasHandle_t h = kc_blas_handle();
    if (!h) return KILN_ERR_DEVICE;
    KILN_TRY(blas_err(cublasSetStream(h, s)));
    const uint32_t dt = a->w_dtype;
    const bool f32 = dt == KILN_DTYPE_F32 || dt == KILN_DTYPE_BF16;
    const void *Wd = a->w;
    uint8_t *scr = (uint8_t *)(c ? c->scratch : NULL);
    size_t wpad = (wbytes(dt, a->n, a->k) + 255) & ~(size_t)255;
    if (dt == KILN_DTYPE_BF16) {
        float *o = (float *)scr;
        DQ_CASE(KILN_DTYPE_BF16, s, a, o);
        Wd = o;
    } else if (dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_F16) {
        __half *o = (__half *)scr;
        KC_DTYPE_SWITCH(dt, DQ_CASE, s, a, o);
        Wd = o;
    }
    KILN_TRY(kc_launched());
    const float one = 1.0f, zero = 0.0f;
    __half *xh = (__half *)(scr + wpad);
    for (int64_t t0 = 0; t0 < a->t; t0 += KILN_CUDA_BLAS_CHUNK) {
        const int64_t rows = a->t - t0 < KILN_CUDA_BLAS_CHUNK ? a->t - t0 : KILN_CUDA_BLAS_CHUNK;
        float *y = a->y + t0 * a->y_stride;
        if (f32) {
            /* y^T (n x rows, col-major, ld ys) = W^T... as col-major: op(A) = W (n x k) */
            KILN_TRY(
                blas_err(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)a->n, (int)rows, (int)a->k,
                                     &one, (const float *)Wd, (int)a->k, a->x + t0 * a->x_stride,
                                     (int)a->x_stride, &zero, y, (int)a->y_stride)));
        } else {
            const int64_t tot = rows * a->k;
            to_f16_kernel<<<(unsigned)((tot + 255) / 256), 256, 0, s>>>(
                a->x + t0 * a->x_stride, a->x_stride, rows, a->k, xh);
            KILN_TRY(kc_launched());
            KILN_TRY(blas_err(
                cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)a->n, (int)rows, (int)a->k, &one, Wd,
                             CUDA_R_16F, (int)a->k, xh, CUDA_R_16F, (int)a->k, &zero, y, CUDA_R_32F,
                             (int)a->y_stride, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)));
        }
        if (a->bias) {
            const int64_t tot = rows * a->n;
            bias_kernel<<<(unsigned)((tot + 255) / 256), 256, 0, s>>>(y, a->y_stride, rows, a->n,
                                                                      a->bias);
            KILN_TRY(kc_launched());
        }
    }
    return KILN_OK;
}
