/*
 * attention.cu — attention over the paged KV cache, block tables read in the kernel (no
 * gather copy), for a flat list of query tokens from any number of sequences (varlen,
 * no padding): causal, GQA, sliding window, logit softcap; f16 or f32 cache.
 *
 * One thread block per (query head, token); its ATT_WARPS warps split the attended
 * positions (warp w takes p0 + w, p0 + w + ATT_WARPS, ...) and keep an online softmax
 * each (running max, sum and the head_dim accumulator spread over the lanes, E =
 * head_dim / 32 elements per lane); the warps' partial states are merged in shared
 * memory at the end. Every (token, head) is computed alone, in a fixed order:
 * deterministic and batch invariant. With G > 1 (session 10) a block computes the query
 * heads of one KV head (K / V loaded once for them).
 *
 * Split-K (session 11): a token attending to len > ATT_SPLIT_LEN positions is split into
 * att_splits(len) <= ATT_ZMAX ranges of att_chunk(len) positions, a block each (grid z);
 * each writes its merged (max, sum, unnormalized accumulator) to the workspace and
 * attn_combine merges the ranges in order. The split depends on the token's own attended
 * length only (never on the batch), and a token of one range is computed exactly as
 * before: deterministic and batch invariant as the unsplit kernel. Calls are cut into
 * launches of ATT_TCHUNK tokens when some token may split (the workspace holds that many).
 * KILN_CUDA_NO_SPLITK=1 turns it off (A/B; other bits for the split tokens).
 */
#include "kernels/cuda/common.cuh"
#include "kernels/select.h"

#include <math.h>
#include <stdlib.h>

#define ATT_WARPS     8
#define ATT_SPLIT_LEN 1024 /* a token attending to more positions is split */
#define ATT_ZMAX      16   /* at most this many ranges a token              */
#define ATT_TCHUNK    64   /* tokens a launch when some token may split     */

__host__ __device__ __forceinline__ int att_splits(int64_t len) {
    if (len <= ATT_SPLIT_LEN) return 1;
    if (len > (int64_t)ATT_ZMAX * ATT_SPLIT_LEN) return ATT_ZMAX;
    const int64_t ns = (len + ATT_SPLIT_LEN - 1) / ATT_SPLIT_LEN;
    return ns > ATT_ZMAX ? ATT_ZMAX : (int)ns;
}
/* positions of a range: a multiple of ATT_WARPS, ranges * chunk >= len */
__host__ __device__ __forceinline__ int32_t att_chunk(int32_t len, int ns) {
    const int32_t c = (len + ns - 1) / ns;
    return (c + ATT_WARPS - 1) / ATT_WARPS * ATT_WARPS;
}

template <int E, bool F16> __device__ __forceinline__ void load_row(const uint8_t *p, float v[E]) {
    if constexpr (F16) {
        const __half *h = (const __half *)p;
        if constexpr (E % 8 == 0) {
#pragma unroll
            for (int i = 0; i < E; i += 8) {
                uint4 u = *(const uint4 *)(h + i);
                const __half2 *h2 = (const __half2 *)&u;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float2 f = __half22float2(h2[j]);
                    v[i + 2 * j] = f.x, v[i + 2 * j + 1] = f.y;
                }
            }
        } else if constexpr (E % 2 == 0) {
#pragma unroll
            for (int i = 0; i < E; i += 2) {
                float2 f = __half22float2(*(const __half2 *)(h + i));
                v[i] = f.x, v[i + 1] = f.y;
            }
        } else {
#pragma unroll
            for (int i = 0; i < E; i++) v[i] = __half2float(h[i]);
        }
    } else {
        const float *f = (const float *)p;
        if constexpr (E % 4 == 0) {
#pragma unroll
            for (int i = 0; i < E; i += 4) {
                float4 u = *(const float4 *)(f + i);
                v[i] = u.x, v[i + 1] = u.y, v[i + 2] = u.z, v[i + 3] = u.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < E; i++) v[i] = f[i];
        }
    }
}

/* One block per (group of G query heads, token): G = 1, one query head (grid: n_head x
 * t); G = the heads per KV head (grid: n_kv_head x t, session 10), each warp then loads a
 * position's K and V rows once for the G heads (one head per block loads them G times: G
 * times the L2 traffic; 8B prefill, 512 tokens: 465 -> 322 us per layer, session 10 runs
 * 1-2). Every head's arithmetic is the same whatever G (the same positions per warp in the
 * same order, the same online softmax, the same merge), so the same bits: deterministic and
 * batch invariant. G > 1 where the blocks fill the GPU (att_gqa_group); KILN_CUDA_OLD_ATTN=1:
 * never. */
template <int E, bool F16, int G>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    attn_kernel(kiln_kv_layer kv, const float *__restrict__ q, int64_t qs, float *out, int64_t os,
                int n_head, const int32_t *__restrict__ tok_seq,
                const int32_t *__restrict__ tok_pos, kiln_kv_blocks bl, float scale, float softcap,
                int window, float *__restrict__ part, int64_t t0) {
    kc_pdl_trigger(); /* the next kernel (a T16 gemv) may start: kc_pdl_wait */
    constexpr int HD = 32 * E;
    const int h0 = blockIdx.x * G, kvh = h0 / (n_head / kv.n_kv_head);
    const int64_t t = t0 + blockIdx.y;
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int32_t pos = tok_pos[t], row = tok_seq[t];
    if (row < 0 || row >= bl.n_seqs || pos < 0 || pos >= bl.seq_len[row] ||
        pos / KILN_KV_BLOCK >= bl.stride) { /* validated by the engine */
        if (wi == 0 && blockIdx.z == 0)
#pragma unroll
            for (int g = 0; g < G; g++)
#pragma unroll
                for (int e = 0; e < E; e++)
                    out[t * os + (int64_t)(h0 + g) * HD + lane * E + e] = 0.0f;
        return;
    }
    const int32_t *table = bl.table + (int64_t)row * bl.stride;
    const int32_t p0 = (window > 0 && pos - window + 1 > 0) ? pos - window + 1 : 0;
    const int ns = part ? att_splits(pos + 1 - p0) : 1, sp = blockIdx.z; /* part NULL: no split */
    if (sp >= ns) return;
    int32_t pa = p0, pb = pos + 1; /* this block's positions [pa, pb) */
    if (ns > 1) {
        const int32_t ch = att_chunk(pos + 1 - p0, ns);
        pa = p0 + sp * ch;
        pb = min(pa + ch, pos + 1);
    }
    const size_t elt = F16 ? 2 : 4;
    const size_t head_off = ((size_t)kvh * HD + (size_t)lane * E) * elt;
    const size_t slot_bytes = (size_t)kv.n_kv_head * HD * elt;
    float qv[G][E], acc[G][E], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float *qp = q + t * qs + (int64_t)(h0 + g) * HD + lane * E;
#pragma unroll
        for (int e = 0; e < E; e++) qv[g][e] = qp[e], acc[g][e] = 0.0f;
        m[g] = -INFINITY, l[g] = 0.0f;
    }
    for (int32_t p = pa + wi; p < pb; p += ATT_WARPS) {
        const int32_t b = table[p / KILN_KV_BLOCK];
        const size_t off =
            (size_t)b * kv.block_bytes + (size_t)(p % KILN_KV_BLOCK) * slot_bytes + head_off;
        float kr[E], vr[E];
        load_row<E, F16>((const uint8_t *)kv.k + off, kr);
        load_row<E, F16>((const uint8_t *)kv.v + off, vr);
#pragma unroll
        for (int g = 0; g < G; g++) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++) d = fmaf(qv[g][e], kr[e], d);
#pragma unroll
            for (int x = 16; x > 0; x >>= 1) d += __shfl_xor_sync(0xffffffffu, d, x);
            float sc = d * scale;
            if (softcap > 0.0f) sc = softcap * tanhf(sc / softcap);
            const float mn = fmaxf(m[g], sc);
            const float corr = expf(m[g] - mn), pe = expf(sc - mn);
            l[g] = l[g] * corr + pe;
#pragma unroll
            for (int e = 0; e < E; e++) acc[g][e] = fmaf(acc[g][e], corr, pe * vr[e]);
            m[g] = mn;
        }
    }
    __shared__ float sm[G][ATT_WARPS], sl[G][ATT_WARPS];
    __shared__ float sacc[G][ATT_WARPS][HD];
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0) sm[g][wi] = m[g], sl[g][wi] = l[g];
#pragma unroll
        for (int e = 0; e < E; e++) sacc[g][wi][lane * E + e] = acc[g][e];
    }
    __syncthreads();
    if (wi < G) { /* warp g merges head g */
        const int g = wi;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[g][w]);
        float L = 0.0f, r[E];
#pragma unroll
        for (int e = 0; e < E; e++) r[e] = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) {
            const float f = sl[g][w] > 0.0f ? expf(sm[g][w] - M) : 0.0f;
            L += sl[g][w] * f;
#pragma unroll
            for (int e = 0; e < E; e++) r[e] = fmaf(sacc[g][w][lane * E + e], f, r[e]);
        }
        if (ns > 1) { /* this range's state for attn_combine */
            float *w = part + (((int64_t)blockIdx.y * n_head + h0 + g) * ATT_ZMAX + sp) * (HD + 2);
            if (lane == 0) w[0] = M, w[1] = L;
#pragma unroll
            for (int e = 0; e < E; e++) w[2 + lane * E + e] = r[e];
            return;
        }
        const float inv = 1.0f / L;
        float *o = out + t * os + (int64_t)(h0 + g) * HD + lane * E;
#pragma unroll
        for (int e = 0; e < E; e++) o[e] = r[e] * inv;
    }
}

/* The ranges of a split token merged in order (the warps' merge, over ranges): one warp
 * per (query head, token); tokens of one range were written by attn_kernel. */
template <int E>
__global__ void __launch_bounds__(32)
    attn_combine(float *out, int64_t os, int n_head, const int32_t *__restrict__ tok_seq,
                 const int32_t *__restrict__ tok_pos, kiln_kv_blocks bl, int window,
                 const float *__restrict__ part, int64_t t0) {
    constexpr int HD = 32 * E;
    const int h = blockIdx.x, lane = threadIdx.x;
    const int64_t t = t0 + blockIdx.y;
    const int32_t pos = tok_pos[t], row = tok_seq[t];
    if (row < 0 || row >= bl.n_seqs || pos < 0 || pos >= bl.seq_len[row] ||
        pos / KILN_KV_BLOCK >= bl.stride)
        return; /* attn_kernel wrote zeros */
    const int32_t p0 = (window > 0 && pos - window + 1 > 0) ? pos - window + 1 : 0;
    const int ns = att_splits(pos + 1 - p0);
    if (ns == 1) return;
    const float *w = part + ((int64_t)blockIdx.y * n_head + h) * ATT_ZMAX * (HD + 2);
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) M = fmaxf(M, w[s * (HD + 2)]);
    float L = 0.0f, r[E];
#pragma unroll
    for (int e = 0; e < E; e++) r[e] = 0.0f;
    for (int s = 0; s < ns; s++) {
        const float *ws = w + s * (HD + 2);
        const float f = ws[1] > 0.0f ? expf(ws[0] - M) : 0.0f;
        L += ws[1] * f;
#pragma unroll
        for (int e = 0; e < E; e++) r[e] = fmaf(ws[2 + lane * E + e], f, r[e]);
    }
    const float inv = 1.0f / L;
    float *o = out + t * os + (int64_t)h * HD + lane * E;
#pragma unroll
    for (int e = 0; e < E; e++) o[e] = r[e] * inv;
}

/* The GQA kernel for this call: head_dim 64 or 128, 2 / 4 / 8 query heads per KV head,
 * and (KV heads x tokens) blocks enough to fill the GPU twice (fewer: G = 1's G times as many
 * blocks are faster, e.g. one decode sequence). 0: G = 1. */
static int kc_old_attn = -1;
extern "C" void kiln_cuda_attention_gqa(int on) {
    kc_old_attn = on ? 0 : 1;
}
static int att_gqa_group(const kiln_attention_args *a) {
    if (kc_old_attn < 0) {
        const char *e = getenv("KILN_CUDA_OLD_ATTN");
        kc_old_attn = e && e[0] == '1' ? 1 : 0;
    }
    const int hd = a->kv.head_dim, g = a->n_head / a->kv.n_kv_head;
    if (kc_old_attn || (hd != 64 && hd != 128) || (g != 2 && g != 4 && g != 8)) return 0;
    return (int64_t)a->kv.n_kv_head * a->t >= 264 ? g : 0;
}

#define ATT_GQA(EE, GG)                                                                            \
    do {                                                                                           \
        dim3 gg((unsigned)a->kv.n_kv_head, (unsigned)tc, (unsigned)zmax);                          \
        if (f16)                                                                                   \
            attn_kernel<EE, true, GG><<<gg, ATT_WARPS * 32, 0, s>>>(                               \
                a->kv, a->q, a->q_stride, a->out, a->out_stride, a->n_head, a->tok_seq,            \
                a->tok_pos, a->blocks, a->scale, a->softcap, a->window, part, t0);                 \
        else                                                                                       \
            attn_kernel<EE, false, GG><<<gg, ATT_WARPS * 32, 0, s>>>(                              \
                a->kv, a->q, a->q_stride, a->out, a->out_stride, a->n_head, a->tok_seq,            \
                a->tok_pos, a->blocks, a->scale, a->softcap, a->window, part, t0);                 \
    } while (0)

#define ATT_COMBINE(EE)                                                                            \
    attn_combine<EE><<<dim3((unsigned)a->n_head, (unsigned)tc), 32, 0, s>>>(                       \
        a->out, a->out_stride, a->n_head, a->tok_seq, a->tok_pos, a->blocks, a->window, part, t0)

#define ATT_CASE(EE)                                                                               \
    case EE:                                                                                       \
        if (f16)                                                                                   \
            attn_kernel<EE, true, 1><<<grid, ATT_WARPS * 32, 0, s>>>(                              \
                a->kv, a->q, a->q_stride, a->out, a->out_stride, a->n_head, a->tok_seq,            \
                a->tok_pos, a->blocks, a->scale, a->softcap, a->window, part, t0);                 \
        else                                                                                       \
            attn_kernel<EE, false, 1><<<grid, ATT_WARPS * 32, 0, s>>>(                             \
                a->kv, a->q, a->q_stride, a->out, a->out_stride, a->n_head, a->tok_seq,            \
                a->tok_pos, a->blocks, a->scale, a->softcap, a->window, part, t0);                 \
        if (zmax > 1) ATT_COMBINE(EE);                                                             \
        break

/* One launch of tokens [t0, t0 + tc) (zmax ranges; the combine after it when zmax > 1). */
static kiln_status att_launch(const kiln_attention_args *a, bool f16, int gq, int zmax, float *part,
                              int64_t t0, int64_t tc, cudaStream_t s) {
    const int hd = a->kv.head_dim;
    dim3 grid((unsigned)a->n_head, (unsigned)tc, (unsigned)zmax);
    if (gq) {
        if (hd == 64) {
            if (gq == 2)
                ATT_GQA(2, 2);
            else if (gq == 4)
                ATT_GQA(2, 4);
            else
                ATT_GQA(2, 8);
            if (zmax > 1) ATT_COMBINE(2);
        } else {
            if (gq == 2)
                ATT_GQA(4, 2);
            else if (gq == 4)
                ATT_GQA(4, 4);
            else
                ATT_GQA(4, 8);
            if (zmax > 1) ATT_COMBINE(4);
        }
        return KILN_OK;
    }
    switch (hd / 32) {
        ATT_CASE(1);
        ATT_CASE(2);
        ATT_CASE(3);
        ATT_CASE(4);
        ATT_CASE(5);
        ATT_CASE(6);
        ATT_CASE(7);
        ATT_CASE(8);
    default:
        return KILN_ERR_INVALID_ARG;
    }
    return KILN_OK;
}

extern "C" size_t kiln_cuda_attention_ws_bytes(int64_t t, int32_t n_head, int32_t head_dim,
                                               int64_t max_len) {
    if (t <= 0 || n_head <= 0 || head_dim <= 0 || att_splits(max_len) == 1) return 0;
    const int64_t tc = t < ATT_TCHUNK ? t : ATT_TCHUNK;
    return (size_t)tc * (size_t)n_head * ATT_ZMAX * ((size_t)head_dim + 2) * sizeof(float);
}

extern "C" size_t kiln_cuda_attention_workspace(const struct kiln_sel_ctx *ctx) {
    /* seq_max 0: unknown, the longest */
    const int64_t len = ctx->seq_max > 0 ? ctx->seq_max : INT64_MAX;
    return kiln_cuda_attention_ws_bytes(ctx->tokens_max < 1 ? 1 : ctx->tokens_max, ctx->n_head,
                                        ctx->head_dim, len);
}

extern "C" kiln_status kiln_cuda_attention(const kiln_kctx *c, const kiln_attention_args *a) {
    if (a->t <= 0) return KILN_OK;
    const int hd = a->kv.head_dim;
    if (hd % 32 || hd < 32 || hd > 256 || a->kv.n_kv_head <= 0 || a->n_head % a->kv.n_kv_head ||
        a->t > 65535)
        return KILN_ERR_INVALID_ARG;
    if (a->kv.dtype != KILN_DTYPE_F16 && a->kv.dtype != KILN_DTYPE_F32) return KILN_ERR_UNSUPPORTED;
    const bool f16 = a->kv.dtype == KILN_DTYPE_F16;
    if (((uintptr_t)a->q & 15) || (a->q_stride & 3)) return KILN_ERR_INVALID_ARG;
    cudaStream_t s = KC_STREAM(c);
    const int gq = att_gqa_group(a);
    /* the longest attended length any token of the call can have: its table's capacity */
    int64_t maxlen = (int64_t)a->blocks.stride * KILN_KV_BLOCK;
    if (a->window > 0 && maxlen > a->window) maxlen = a->window;
    static int no_split = -1; /* KILN_CUDA_NO_SPLITK=1: never split (A/B), read once */
    if (no_split < 0) {
        const char *e = getenv("KILN_CUDA_NO_SPLITK");
        no_split = e && e[0] == '1';
    }
    const int zmax = no_split ? 1 : att_splits(maxlen);
    float *part = NULL;
    int64_t tstep = a->t;
    if (zmax > 1) {
        const size_t need = kiln_cuda_attention_ws_bytes(a->t, a->n_head, hd, maxlen);
        if (!c->scratch || c->scratch_size < need) return KILN_ERR_INVALID_ARG; /* spec'd */
        part = (float *)c->scratch;
        tstep = ATT_TCHUNK;
    }
    for (int64_t t0 = 0; t0 < a->t; t0 += tstep) {
        const int64_t tc = a->t - t0 < tstep ? a->t - t0 : tstep;
        const kiln_status st = att_launch(a, f16, gq, zmax, part, t0, tc, s);
        if (st) return st;
    }
    return kc_launched();
}
