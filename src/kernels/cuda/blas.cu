/*
 * blas.cu — the prefill matmul through cuBLAS on the tensor cores, at f32 accuracy
 * ("split f16", as kiln's exact numerics ask: docs/CUDA.md). Every f32 value v is held
 * as two f16 halves, hi = f16(v) and lo = f16((v - hi) * 2^11) (22 significant bits
 * together), so that
 *     y = W x = Wh xh + 2^-11 (Wh xl + Wl xh)      (the Wl xl term is below f32 rounding)
 * is three cublasGemmEx calls with f16 inputs and f32 accumulation (f16 x f16 products
 * are exact in f32). Quantized weights are dequantized into hi and lo halves in the
 * scratch; f16 weights are their own hi (lo = 0: two products); the activations are
 * split in chunks of KILN_CUDA_BLAS_CHUNK rows. f32 weights go through cublasSgemm,
 * bf16 weights are widened to f32 and go the same way (bf16 -> f16 could overflow). A
 * bias is added by a small kernel after each chunk. (Rounding the activations to one f16
 * was 3x cheaper in products but put the backend 1e-6 in KL and 0.2-0.8 % in top-1 away
 * from the ref backend on synthetic models: device run 10.)
 *
 * The cuBLAS handle is one per device and host thread (kc_blas_handle: a thread-local
 * singleton, created on first use, never freed before exit); its stream is set per call.
 * cuBLAS may pick a non-deterministic algorithm across builds and GPUs, and its tiling
 * depends on t: not batch invariant (the spec says so).
 */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda_t16.h"
#include "kernels/select.h"
#include "kernels/spec.h"

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

#define KC_SPLIT_SCALE 2048.0f /* 2^11: lo halves are stored scaled up (no subnormals) */

/* the hi and (scaled) lo f16 halves of two floats */
static __device__ __forceinline__ void kc_split2(float a, float b, __half2 *hi, __half2 *lo) {
    *hi = __floats2half2_rn(a, b);
    const float2 h = __half22float2(*hi);
    *lo = __floats2half2_rn((a - h.x) * KC_SPLIT_SCALE, (b - h.y) * KC_SPLIT_SCALE);
}

/* w (n x k of DT, plain rows) -> out (n x k of f32), or with f16 OUT the hi halves in
 * out[0, n*k) and the lo halves in out[n*k, 2*n*k) */
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
    if constexpr (sizeof(OUT) == 2) {
        /* 16-byte stores, 8 halves each (with scalar 2-byte stores a quantized 8B-shaped
         * t=16 step took 104 ms: device run 3, docs/CUDA.md) */
        uint4 *o4 = (uint4 *)o, *l4 = (uint4 *)(o + n * k);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2 h[4], l[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                kc_split2(w[8 * i + 2 * j], w[8 * i + 2 * j + 1], &h[j], &l[j]);
            o4[i] = *(const uint4 *)h;
            l4[i] = *(const uint4 *)l;
        }
    } else {
        float4 *o4 = (float4 *)o;
#pragma unroll
        for (int i = 0; i < 8; i++)
            o4[i] = make_float4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
    }
}

/* x (rows x k, stride xs) -> hi halves in out[0, rows*k), scaled lo in out[rows*k, ..) */
__global__ void split_f16_kernel(const float *__restrict__ x, int64_t xs, int64_t rows, int64_t k,
                                 __half *__restrict__ out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * k) return;
    const int64_t r = i / k, c = i % k;
    const float v = x[r * xs + c];
    const __half h = __float2half_rn(v);
    out[i] = h;
    out[rows * k + i] = __float2half_rn((v - __half2float(h)) * KC_SPLIT_SCALE);
}

/* the same, 4 columns per thread (k % 4 == 0, xs % 4 == 0, x 16-byte aligned): one float4
 * load, two 8-byte stores; the same values (kc_split2 per pair) */
__global__ void split_f16x4_kernel(const float *__restrict__ x, int64_t xs, int64_t rows, int64_t k,
                                   __half *__restrict__ out) {
    const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= rows * k) return;
    const int64_t r = i / k, c = i % k;
    const float4 v = *(const float4 *)(x + r * xs + c);
    __half2 h[2], l[2];
    kc_split2(v.x, v.y, &h[0], &l[0]);
    kc_split2(v.z, v.w, &h[1], &l[1]);
    *(uint2 *)(out + i) = *(const uint2 *)h;
    *(uint2 *)(out + rows * k + i) = *(const uint2 *)l;
}

__global__ void bias_kernel(float *y, int64_t ys, int64_t rows, int64_t n,
                            const float *__restrict__ b) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * n) return;
    const int64_t r = i / n, c = i % n;
    y[r * ys + c] += b[c];
}

/* f32 weights are used in place; bf16 -> f32; f16 in place (its own hi half); everything
 * else -> hi and lo f16 halves */
static size_t wbytes(uint32_t dt, int64_t n, int64_t k) {
    if (dt == KILN_DTYPE_F32 || dt == KILN_DTYPE_F16) return 0;
    return (size_t)n * (size_t)k * 4;
}

extern "C" size_t kiln_cuda_matmul_cublas_bytes(uint32_t w_dtype, int64_t n, int64_t k) {
    size_t xb = (w_dtype == KILN_DTYPE_F32 || w_dtype == KILN_DTYPE_BF16)
                    ? 0
                    : (size_t)KILN_CUDA_BLAS_CHUNK * (size_t)k * 4;
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

/* The matmul with its weight dequantized at the scratch's start and x's halves at xoff;
 * x_ready: the halves are there already (a group's later members; one chunk only). */
static kiln_status cublas_run(const kiln_kctx *c, const kiln_matmul_args *a, size_t xoff,
                              bool x_ready) {
    if (a->t <= 0 || a->n <= 0) return KILN_OK;
    const int be = kc_block_elems(a->w_dtype);
    const bool t16 = a->w_layout == KILN_WLAYOUT_CUDA_T16;
    if (!be || a->k % be || (a->w_layout != 0 && !t16)) return KILN_ERR_INVALID_ARG;
    if (t16 && (!kiln_cuda_t16_supports(a->w_dtype) || a->k % kiln_cuda_t16_k(a->w_dtype)))
        return KILN_ERR_INVALID_ARG;
    if (a->n > INT32_MAX || a->k > INT32_MAX || a->y_stride > INT32_MAX || a->x_stride > INT32_MAX)
        return KILN_ERR_INVALID_ARG;
    if (x_ready && a->t > KILN_CUDA_BLAS_CHUNK) return KILN_ERR_INVALID_ARG;
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
    if (dt == KILN_DTYPE_BF16) {
        float *o = (float *)scr;
        DQ_CASE(KILN_DTYPE_BF16, s, a, o);
        Wd = o;
    } else if (t16) { /* the T16 layout (kernels/cuda_t16.h): gemv_t16.cu reads it */
        KILN_TRY(kiln_cuda_t16_dequant_f16(s, a->w, dt, a->n, a->k, scr));
        Wd = scr;
    } else if (dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_F16) {
        __half *o = (__half *)scr;
        KC_DTYPE_SWITCH(dt, DQ_CASE, s, a, o);
        Wd = o;
    }
    KILN_TRY(kc_launched());
    const float one = 1.0f, zero = 0.0f, inv = 1.0f / KC_SPLIT_SCALE;
    __half *xh = (__half *)(scr + xoff);
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
            const float *xr = a->x + t0 * a->x_stride;
            if (x_ready) {
                /* a group's earlier member split this x */
            } else if (kiln_cuda_t16_dequant_coalesced() && a->k % 4 == 0 && a->x_stride % 4 == 0 &&
                       ((uintptr_t)xr & 15) == 0)
                split_f16x4_kernel<<<(unsigned)((tot / 4 + 255) / 256), 256, 0, s>>>(
                    xr, a->x_stride, rows, a->k, xh);
            else
                split_f16_kernel<<<(unsigned)((tot + 255) / 256), 256, 0, s>>>(xr, a->x_stride,
                                                                               rows, a->k, xh);
            KILN_TRY(kc_launched());
            const __half *xl = xh + tot;
            const __half *Wl = dt == KILN_DTYPE_F16 ? NULL : (const __half *)Wd + a->n * a->k;
            /* y = Wh xh, then += 2^-11 Wh xl, then += 2^-11 Wl xh (quantized weights) */
            const struct {
                const void *w, *x;
                const float *alpha, *beta;
            } terms[3] = {{Wd, xh, &one, &zero}, {Wd, xl, &inv, &one}, {Wl, xh, &inv, &one}};
            for (int m = 0; m < 3; m++) {
                if (!terms[m].w) continue;
                KILN_TRY(blas_err(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)a->n, (int)rows,
                                               (int)a->k, terms[m].alpha, terms[m].w, CUDA_R_16F,
                                               (int)a->k, terms[m].x, CUDA_R_16F, (int)a->k,
                                               terms[m].beta, y, CUDA_R_32F, (int)a->y_stride,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)));
            }
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

extern "C" kiln_status kiln_cuda_matmul_cublas(const kiln_kctx *c, const kiln_matmul_args *a) {
    const size_t wpad = (wbytes(a->w_dtype, a->n, a->k) + 255) & ~(size_t)255;
    return cublas_run(c, a, wpad, false);
}

/* A matmul group's members (matmul.cu's kiln_cuda_matmul_group) when every one is this
 * entry's, of one x (pointer, stride, k, t <= one chunk) with split-f16 weights: x split
 * once, at the largest member's weight bytes, each member's weight dequantized in turn
 * before it (q / k / v: one split instead of three; gate / up: one instead of two). The
 * same operands, so the same bits as the members one by one. KILN_ERR_UNSUPPORTED: not such
 * a group (or the old path, KILN_CUDA_OLD_DQ=1); the caller runs the members itself. */
extern "C" kiln_status kiln_cuda_matmul_cublas_group(const kiln_kctx *c, const kiln_matmul_args *m,
                                                     int nm) {
    if (nm < 2 || !kiln_cuda_t16_dequant_coalesced()) return KILN_ERR_UNSUPPORTED;
    size_t wmax = 0;
    for (int i = 0; i < nm; i++) {
        const uint32_t dt = m[i].w_dtype;
        if (dt == KILN_DTYPE_F32 || dt == KILN_DTYPE_BF16 || m[i].x != m[0].x ||
            m[i].x_stride != m[0].x_stride || m[i].k != m[0].k || m[i].t != m[0].t || m[i].t <= 0 ||
            m[i].t > KILN_CUDA_BLAS_CHUNK || m[i].n <= 0)
            return KILN_ERR_UNSUPPORTED;
        const size_t w = (wbytes(dt, m[i].n, m[i].k) + 255) & ~(size_t)255;
        if (w > wmax) wmax = w;
    }
    const size_t xb = (size_t)KILN_CUDA_BLAS_CHUNK * (size_t)m[0].k * 4;
    if (!c || !c->scratch || c->scratch_size < wmax + xb) return KILN_ERR_UNSUPPORTED;
    for (int i = 0; i < nm; i++) KILN_TRY(cublas_run(c, &m[i], wmax, i > 0));
    return KILN_OK;
}
