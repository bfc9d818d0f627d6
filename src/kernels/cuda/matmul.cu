/*
 * matmul.cu — GEMV / small-batch matmul (1..8 tokens per pass over the weights), the
 * greedy LM head (matmul + argmax) and the grouped matmul, for every weight dtype of
 * common.cuh.
 *
 * GEMV: one warp per output row; lane l takes the row's 32-element groups l, l + 32,
 * ... (so a warp reads a contiguous stretch of the row per step: coalesced), dequantizes
 * each group into registers (common.cuh) and accumulates its dot with each of the T
 * token rows of x (read through the read-only cache; x is small and shared by every
 * warp); a butterfly reduction and one store per (token, row). Deterministic and batch
 * invariant: a row's sum never depends on the other tokens (each token has its own
 * accumulator and the same order). More than 8 tokens: passes of 8.
 */
#include "kernels/cuda/common.cuh"
#include "kernels/select.h"

#include <float.h>
#include <math.h>

#define GEMV_WARPS 4

template <int DT, int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n, int64_t k,
                const float *__restrict__ x, int64_t xs, float *__restrict__ y, int64_t ys,
                const float *__restrict__ bias) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (r >= n) return;
    const uint8_t *row = W + (size_t)r * row_bytes;
    const int64_t groups = k / 32;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (int64_t g = lane; g < groups; g += 32) {
        float w[32];
        kc_dq32<DT>(row, g, w);
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float4 *xp = (const float4 *)(x + t * xs + g * 32);
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 v = __ldg(xp + i);
                s = fmaf(w[4 * i], v.x, s);
                s = fmaf(w[4 * i + 1], v.y, s);
                s = fmaf(w[4 * i + 2], v.z, s);
                s = fmaf(w[4 * i + 3], v.w, s);
            }
            acc[t] += s;
        }
    }
#pragma unroll
    for (int t = 0; t < T; t++) {
        float v = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        acc[t] = v;
    }
    if (lane == 0) {
        const float b = bias ? bias[r] : 0.0f;
#pragma unroll
        for (int t = 0; t < T; t++) y[t * ys + r] = acc[t] + b;
    }
}

/* The tiled gemv (default): a block of TW warps computes TW rows (one per warp) and
 * shares the activations: x is staged in shared memory one tile of 2048 (T > 4: 1024)
 * columns at a time (T rows of it, loaded once per block with coalesced 16-byte loads, each
 * 32-element group padded by 16 bytes so that the lanes' 16-byte reads of 32 consecutive groups hit
 * distinct banks), then lane l dequantizes groups l (and l + 32) of the tile of its row (straight
 * from global memory) and dots it with the staged x. x is read from L2 once per TW rows instead of
 * once per row, which is what held the direct kernel back (measured: docs/CUDA.md). */
#define TW 8

/* groups per tile: 32 PER (PER = 2: two groups per lane, both loads in flight before
 * either is used; only while the staged x fits in 48 KB of static shared memory) */
template <int DT, int T, int PER>
__global__ void __launch_bounds__(TW * 32)
    gemv_tiled_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n, int64_t k,
                      const float *__restrict__ x, int64_t xs, float *__restrict__ y, int64_t ys,
                      const float *__restrict__ bias) {
    constexpr int G = 32 * PER;
    static_assert(T * G * 144 <= 48 * 1024, "staged x exceeds static shared memory");
    __shared__ float4 xsm[T][G][9];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int64_t r = (int64_t)blockIdx.x * TW + wi;
    const bool live = r < n;
    const uint8_t *row = W + (size_t)(live ? r : 0) * row_bytes;
    const int64_t groups = k / 32;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (int64_t g0 = 0; g0 < groups; g0 += G) {
        const int ng = groups - g0 < G ? (int)(groups - g0) : G;
        __syncthreads();
        for (int i = threadIdx.x; i < T * G * 8; i += TW * 32) {
            const int t = i / (G * 8), gi = (i / 8) % G, q = i % 8;
            if (gi < ng) xsm[t][gi][q] = __ldg((const float4 *)(x + t * xs + (g0 + gi) * 32) + q);
        }
        __syncthreads();
        if (!live) continue;
        float w[PER][32];
#pragma unroll
        for (int p = 0; p < PER; p++)
            if (lane + 32 * p < ng) kc_dq32<DT>(row, g0 + lane + 32 * p, w[p]);
#pragma unroll
        for (int p = 0; p < PER; p++) {
            const int gl = lane + 32 * p;
            if (gl >= ng) break;
#pragma unroll
            for (int t = 0; t < T; t++) {
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const float4 v = xsm[t][gl][i];
                    s = fmaf(w[p][4 * i], v.x, s);
                    s = fmaf(w[p][4 * i + 1], v.y, s);
                    s = fmaf(w[p][4 * i + 2], v.z, s);
                    s = fmaf(w[p][4 * i + 3], v.w, s);
                }
                acc[t] += s;
            }
        }
    }
    if (!live) return;
#pragma unroll
    for (int t = 0; t < T; t++) {
        float v = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        acc[t] = v;
    }
    if (lane == 0) {
        const float b = bias ? bias[r] : 0.0f;
#pragma unroll
        for (int t = 0; t < T; t++) y[t * ys + r] = acc[t] + b;
    }
}

/* Which gemv runs: the tiled one (default) or the direct one (A/B benchmarks and tests
 * select it with kiln_cuda_gemv_variant). */
static int kc_gemv_kind = 1;

extern "C" void kiln_cuda_gemv_variant(int kind) {
    kc_gemv_kind = kind >= 0 && kind <= 2 ? kind : 1;
}

template <int DT>
static void launch_gemv(cudaStream_t s, const kiln_matmul_args *a, int64_t t0, int T) {
    const int kind = kc_gemv_kind;
    const bool tiled = kind != 0;
    dim3 grid((unsigned)((a->n + (tiled ? TW : GEMV_WARPS) - 1) / (tiled ? TW : GEMV_WARPS)));
    dim3 block((tiled ? TW : GEMV_WARPS) * 32);
    const uint8_t *W = (const uint8_t *)a->w;
    const float *x = a->x + t0 * a->x_stride;
    float *y = a->y + t0 * a->y_stride;
#define GL(TT)                                                                                     \
    do {                                                                                           \
        if (kind == 2 && TT <= 4)                                                                  \
            gemv_tiled_kernel<DT, TT, (TT <= 4 ? 2 : 1)><<<grid, block, 0, s>>>(                   \
                W, a->w_row_bytes, a->n, a->k, x, a->x_stride, y, a->y_stride, a->bias);           \
        else if (tiled)                                                                            \
            gemv_tiled_kernel<DT, TT, 1><<<grid, block, 0, s>>>(                                   \
                W, a->w_row_bytes, a->n, a->k, x, a->x_stride, y, a->y_stride, a->bias);           \
        else                                                                                       \
            gemv_kernel<DT, TT><<<grid, block, 0, s>>>(W, a->w_row_bytes, a->n, a->k, x,           \
                                                       a->x_stride, y, a->y_stride, a->bias);      \
    } while (0)
    switch (T) {
    case 1:
        GL(1);
        break;
    case 2:
        GL(2);
        break;
    case 3:
        GL(3);
        break;
    case 4:
        GL(4);
        break;
    case 5:
        GL(5);
        break;
    case 6:
        GL(6);
        break;
    case 7:
        GL(7);
        break;
    default:
        GL(8);
        break;
    }
#undef GL
}

int kiln_cuda_weight_dtype_ok(uint32_t dtype) {
    return kc_block_elems(dtype) != 0;
}

#define GEMV_CASE(DT, s, a, t0, T) launch_gemv<DT>(s, a, t0, T)

extern "C" kiln_status kiln_cuda_matmul_gemv(const kiln_kctx *c, const kiln_matmul_args *a) {
    if (a->t <= 0 || a->n <= 0) return KILN_OK;
    const int be = kc_block_elems(a->w_dtype);
    if (!be || a->k % be || a->k % 32 || a->w_layout != 0) return KILN_ERR_INVALID_ARG;
    if (((uintptr_t)a->x & 15) || (a->x_stride & 3)) return KILN_ERR_INVALID_ARG;
    cudaStream_t s = KC_STREAM(c);
    for (int64_t t0 = 0; t0 < a->t; t0 += KILN_CUDA_GEMV_MAX_T) {
        int T = (int)(a->t - t0 < KILN_CUDA_GEMV_MAX_T ? a->t - t0 : KILN_CUDA_GEMV_MAX_T);
        KC_DTYPE_SWITCH(a->w_dtype, GEMV_CASE, s, a, t0, T);
    }
    return kc_launched();
}

/* ---- argmax over logits rows (lowest index among equal maxima; NaN, -inf skipped) ---- */

__device__ __forceinline__ void better(float v, int i, float *bv, int *bi) {
    if (i < 0) return;
    if (*bi < 0 || v > *bv || (v == *bv && i < *bi)) *bv = v, *bi = i;
}

__global__ void argmax_kernel(const float *__restrict__ logits, int64_t ls, int64_t n_limit,
                              float softcap, int32_t *ids, float *vals) {
    const int64_t t = blockIdx.x;
    const float *row = logits + t * ls;
    float bv = -INFINITY;
    int bi = -1;
    for (int64_t i = threadIdx.x; i < n_limit; i += blockDim.x) {
        float v = row[i];
        if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
        if (isnan(v) || v == -INFINITY) continue;
        better(v, (int)i, &bv, &bi);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        better(ov, oi, &bv, &bi);
    }
    __shared__ float sv[32];
    __shared__ int si[32];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sv[w] = bv, si[w] = bi;
    __syncthreads();
    if (w == 0) {
        const int nw = blockDim.x >> 5;
        bv = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : -1;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            better(ov, oi, &bv, &bi);
        }
        if (lane == 0) {
            ids[t] = bi;
            if (vals) vals[t] = bi >= 0 ? bv : -INFINITY;
        }
    }
}

extern "C" size_t kiln_cuda_matmul_argmax_workspace(const struct kiln_sel_ctx *ctx) {
    int64_t t = ctx->tokens_max < 64 ? ctx->tokens_max : 64;
    if (t < 1) t = 1;
    size_t logits = (size_t)t * (size_t)ctx->n * sizeof(float);
    /* the bound matmul may be the cuBLAS one, which needs its own scratch after ours */
    size_t blas = ctx->tokens_max > KILN_CUDA_GEMV_MAX_T
                      ? kiln_cuda_matmul_cublas_bytes(ctx->w_dtype, ctx->n, ctx->k)
                      : 0;
    return ((logits + 255) & ~(size_t)255) + blas;
}

/* Logits of up to 64 rows at a time into scratch, then the argmax of each row. */
extern "C" kiln_status kiln_cuda_matmul_argmax(const kiln_kctx *c,
                                               const kiln_matmul_argmax_args *a) {
    const kiln_matmul_args *m = &a->mm;
    if (m->t <= 0) return KILN_OK;
    if (a->n_limit > m->n || a->n_limit > INT32_MAX) return KILN_ERR_INVALID_ARG;
    int64_t chunk = 64;
    size_t lbytes = (size_t)chunk * (size_t)m->n * sizeof(float);
    size_t lpad = (lbytes + 255) & ~(size_t)255;
    if (!c || !c->scratch || c->scratch_size < lbytes) {
        chunk = 1;
        lbytes = (size_t)m->n * sizeof(float);
        lpad = (lbytes + 255) & ~(size_t)255;
        if (!c || !c->scratch || c->scratch_size < lbytes) return KILN_ERR_NOMEM;
    }
    kiln_kctx inner = *c;
    inner.scratch = (uint8_t *)c->scratch + lpad;
    inner.scratch_size = c->scratch_size > lpad ? c->scratch_size - lpad : 0;
    kiln_matmul_fn fn = a->fn ? a->fn : kiln_cuda_matmul_gemv;
    for (int64_t t0 = 0; t0 < m->t; t0 += chunk) {
        kiln_matmul_args mm = *m;
        mm.t = m->t - t0 < chunk ? m->t - t0 : chunk;
        mm.x = m->x + t0 * m->x_stride;
        mm.y = (float *)c->scratch;
        mm.y_stride = m->n;
        kiln_status st = fn(&inner, &mm);
        if (st) return st;
        argmax_kernel<<<(unsigned)mm.t, 256, 0, KC_STREAM(c)>>>((const float *)c->scratch, m->n,
                                                                a->n_limit, a->softcap, a->ids + t0,
                                                                a->vals ? a->vals + t0 : NULL);
        if ((st = kc_launched())) return st;
    }
    return KILN_OK;
}

extern "C" kiln_status kiln_cuda_matmul_group(const kiln_kctx *c, const kiln_matmul_group_args *a) {
    if (a->n < 1 || a->n > KILN_MATMUL_GROUP_MAX) return KILN_ERR_INVALID_ARG;
    for (int i = 0; i < a->n; i++) {
        kiln_matmul_fn fn = a->fn[i] ? a->fn[i] : kiln_cuda_matmul_gemv;
        kiln_status st = fn(c, &a->m[i]);
        if (st) return st;
    }
    if (a->glu_fn) {
        if (a->n != 2 || a->m[0].n != a->m[1].n) return KILN_ERR_INVALID_ARG;
        kiln_glu_args g;
        g.gate = a->m[0].y;
        g.up = a->m[1].y;
        g.y = a->glu_y;
        g.t = a->m[0].t;
        g.n = a->m[0].n;
        g.gate_stride = a->m[0].y_stride;
        g.up_stride = a->m[1].y_stride;
        g.y_stride = a->glu_y_stride;
        g.act = a->act;
        return a->glu_fn(c, &g);
    }
    return KILN_OK;
}
