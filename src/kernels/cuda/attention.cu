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
 *
 * Session 12 (attn_split_kernel, attn_combine2; the default when a token may split): ranges
 * of 256 positions (up to 64 a token), the KV head's query heads in one block, several
 * positions per warp step with one butterfly reduction of their dots. 8B q4_0 tg128 at
 * depth 8192: 197.8 -> 294.0 tok/s (session 12 run 2). KILN_CUDA_OLD_SPLITK=1: session 11's
 * ranges above (A/B).
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

/* Session 12's ranges (attn_split_kernel): per (default ATT2_POS; KILN_CUDA_ATT2_POS=N, a
 * multiple of 64 in [64, 4096], read once: A/B runs) positions a range, at most ATT2_ZMAX
 * ranges (then longer ones), a range a multiple of 64 positions; the number of non-empty
 * ranges, and their length in *chunk. 1: the token is not split (len <= ATT_SPLIT_LEN). */
#define ATT2_POS    256
#define ATT2_ZMAX   64
#define ATT2_TCHUNK 16 /* tokens a launch: ATT2_TCHUNK x ATT2_ZMAX = ATT_TCHUNK x ATT_ZMAX */
__host__ __device__ __forceinline__ int att2_ranges(int64_t len, int per, int32_t *chunk) {
    if (len <= ATT_SPLIT_LEN) {
        *chunk = (int32_t)len;
        return 1;
    }
    int64_t ns = (len + per - 1) / per;
    if (ns > ATT2_ZMAX) ns = ATT2_ZMAX;
    int64_t c = (len + ns - 1) / ns;
    c = (c + 63) / 64 * 64;
    *chunk = (int32_t)c;
    return (int)((len + c - 1) / c);
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
__device__ __forceinline__ void
attn_body(kiln_kv_layer kv, const float *__restrict__ q, int64_t qs, float *out, int64_t os,
          int n_head, const int32_t *__restrict__ tok_seq, const int32_t *__restrict__ tok_pos,
          kiln_kv_blocks bl, float scale, float softcap, int window, float *__restrict__ part,
          int64_t t0, float *smem, int h0, int sp, bool zw) {
    constexpr int HD = 32 * E;
    const int kvh = h0 / (n_head / kv.n_kv_head);
    const int64_t t = t0 + blockIdx.y;
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int32_t pos = tok_pos[t], row = tok_seq[t];
    if (row < 0 || row >= bl.n_seqs || pos < 0 || pos >= bl.seq_len[row] ||
        pos / KILN_KV_BLOCK >= bl.stride) { /* validated by the engine */
        if (wi == 0 && zw)
#pragma unroll
            for (int g = 0; g < G; g++)
#pragma unroll
                for (int e = 0; e < E; e++)
                    out[t * os + (int64_t)(h0 + g) * HD + lane * E + e] = 0.0f;
        return;
    }
    const int32_t *table = bl.table + (int64_t)row * bl.stride;
    const int32_t p0 = (window > 0 && pos - window + 1 > 0) ? pos - window + 1 : 0;
    const int ns = part ? att_splits(pos + 1 - p0) : 1; /* part NULL: no split */
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
    float(*sm)[ATT_WARPS] = (float(*)[ATT_WARPS])smem;
    float(*sl)[ATT_WARPS] = (float(*)[ATT_WARPS])(smem + G * ATT_WARPS);
    float(*sacc)[ATT_WARPS][HD] = (float(*)[ATT_WARPS][HD])(smem + 2 * G * ATT_WARPS);
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

template <int E, bool F16, int G>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    attn_kernel(kiln_kv_layer kv, const float *__restrict__ q, int64_t qs, float *out, int64_t os,
                int n_head, const int32_t *__restrict__ tok_seq,
                const int32_t *__restrict__ tok_pos, kiln_kv_blocks bl, float scale, float softcap,
                int window, float *__restrict__ part, int64_t t0) {
    kc_pdl_trigger(); /* the next kernel (a T16 gemv) may start: kc_pdl_wait */
    __shared__ __align__(16) float smem[G * ATT_WARPS * (32 * E + 2)];
    attn_body<E, F16, G>(kv, q, qs, out, os, n_head, tok_seq, tok_pos, bl, scale, softcap, window,
                         part, t0, smem, blockIdx.x * G, blockIdx.z, blockIdx.z == 0);
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

/* A lane's E columns of a K or V row as loaded: f16 with E even as E / 2 half2 words
 * (converted when used: registers for a second group in flight), else as floats. */
template <int E, bool F16> struct att_row {
    static constexpr bool PK = F16 && E % 2 == 0;
    uint32_t w[PK ? E / 2 : E];
    __device__ __forceinline__ void load(const uint8_t *p) {
        if constexpr (PK && E % 8 == 0) {
#pragma unroll
            for (int i = 0; i < E / 8; i++) {
                const uint4 u = ((const uint4 *)p)[i];
                w[4 * i] = u.x, w[4 * i + 1] = u.y, w[4 * i + 2] = u.z, w[4 * i + 3] = u.w;
            }
        } else if constexpr (PK && E % 4 == 0) {
#pragma unroll
            for (int i = 0; i < E / 4; i++) {
                const uint2 u = ((const uint2 *)p)[i];
                w[2 * i] = u.x, w[2 * i + 1] = u.y;
            }
        } else if constexpr (PK) {
#pragma unroll
            for (int i = 0; i < E / 2; i++) w[i] = ((const uint32_t *)p)[i];
        } else {
            float f[E];
            load_row<E, F16>(p, f);
#pragma unroll
            for (int e = 0; e < E; e++) w[e] = __float_as_uint(f[e]);
        }
    }
    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int i = 0; i < (PK ? E / 2 : E); i++) w[i] = 0u;
    }
    __device__ __forceinline__ float get(int e) const {
        if constexpr (PK) {
            const float2 f = __half22float2(*(const __half2 *)&w[e / 2]);
            return e % 2 ? f.y : f.x;
        } else {
            return __uint_as_float(w[e]);
        }
    }
};

/* One butterfly step of attn_split_kernel's reduction at distance D over the first N
 * values of a lane (N > 1: keep a half, add the partner's copy of it; N <= 1: add the
 * partner's value). The halves are chosen by masks, not by a select the compiler may turn
 * into an indexed (local-memory) load. */
template <int N, int D> __device__ __forceinline__ void att_bfly(float *v, int lane) {
    if constexpr (N > 1) {
        const int um = (lane & D) ? -1 : 0;
#pragma unroll
        for (int i = 0; i < N / 2; i++) {
            const int lo = __float_as_int(v[i]), hi = __float_as_int(v[i + N / 2]);
            const float keep = __int_as_float((lo & ~um) | (hi & um));
            const float send = __int_as_float((hi & ~um) | (lo & um));
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, D);
        }
    } else {
        v[0] += __shfl_xor_sync(0xffffffffu, v[0], D);
    }
}

/* Split ranges, session 12 (attn_split_kernel): a block per (G query heads, token, range)
 * of a token attending to len > ATT_SPLIT_LEN positions, att2_ranges(len) ranges of 256
 * positions (up to 64 ranges; longer ones past 16384), so one decode token of the 8B fills
 * the GPU (8 KV heads x 32 ranges at 8192) and K / V are read once per KV head (G = the
 * heads per KV head where attn_kernel's G may be: head_dim 64 / 128, 2 / 4 / 8; else 1).
 * A warp takes P positions at a time (8; 4 for head_dim > 128): it issues the loads of
 * their K and V rows at once (each lane its E columns), forms the G x P partial dots, and
 * reduces them with one butterfly (each shuffle step halves the values a lane keeps: G P -
 * 1 shuffles for G P <= 32 sums, instead of 5 a sum), so that lane L holds score
 * (L >> SH): head g = i / P, position j = i % P. The group's max per head (shuffles over
 * the lanes of a head), p = exp(s - m) once per score, the correction per head, both
 * through shared memory to every lane, which updates l and its E accumulator columns per
 * head in position order. A score's sum is the same tree whatever G (every lane's partial
 * over its E columns, added over lanes at distances 16, 8, 4, 2, 1; a + b = b + a), and
 * every head sees the same positions per warp in the same order: the same bits for any G
 * (test_attention: G > 1 vs G = 1). The warps merge in shared memory (attn_body's merge),
 * the range's state goes to the workspace, attn_combine2 merges the ranges in order. A
 * token that is not split runs attn_body here (the same bits as attn_kernel's). The split
 * depends on the token's own attended length only: batch invariant. PF (KILN_CUDA_ATT2_PF=1,
 * f16 cache): the next group's K / V loads issued before this group is computed (same
 * bits; at 128 registers with spills for the 8B's shape, slower there: 282.5 vs 294.0
 * tok/s at depth 8192, run 2). Ranges of 128 / 512 positions measured slower than 256 (run
 * 1: 235.9 / 242.5 vs 260.2, before the rows were kept as half2 words).
 * KILN_CUDA_OLD_SPLITK=1: session 11's ranges (attn_kernel, G = 1 for one token). */
template <int E, bool F16, int G, bool PF>
__global__ void __launch_bounds__(ATT_WARPS * 32, PF &&G *E <= 16 ? 2 : 1) /* PF: 2 blocks / SM */
    attn_split_kernel(kiln_kv_layer kv, const float *__restrict__ q, int64_t qs, float *out,
                      int64_t os, int n_head, const int32_t *__restrict__ tok_seq,
                      const int32_t *__restrict__ tok_pos, kiln_kv_blocks bl, float scale,
                      float softcap, int window, float *__restrict__ part, int64_t t0, int ug,
                      int per) {
    kc_pdl_trigger();
    constexpr int HD = 32 * E, P = E <= 4 ? 8 : 4, NV = G * P;
    constexpr int NL = NV > 32 ? 32 : NV, R = NV / NL; /* values a round, rounds */
    constexpr int LNL = NL == 32 ? 5 : NL == 16 ? 4 : NL == 8 ? 3 : NL == 4 ? 2 : 1;
    constexpr int SH = 5 - LNL, LP = P == 8 ? 3 : 2;
    static_assert(NL == (1 << LNL) && P == (1 << LP), "powers of two");
    constexpr int WPS = (NV + G + 3) / 4 * 4; /* a warp's p and corr, 16-byte aligned */
    __shared__ __align__(16) float smem[G * ATT_WARPS * (HD + 2) + ATT_WARPS * WPS];
    const int64_t t = t0 + blockIdx.y;
    const int32_t pos = tok_pos[t], row = tok_seq[t];
    int32_t ch = 0, ns = 1;
    const bool ok = !(row < 0 || row >= bl.n_seqs || pos < 0 || pos >= bl.seq_len[row] ||
                      pos / KILN_KV_BLOCK >= bl.stride);
    const int32_t p0 = (window > 0 && pos - window + 1 > 0) ? pos - window + 1 : 0;
    if (ok) ns = att2_ranges(pos + 1 - p0, per, &ch);
    if (ns == 1) { /* not split (or invalid: zeros): attn_kernel's arithmetic, one range */
        if (ug) {  /* many blocks: the G heads in block z = 0 */
            if (blockIdx.z == 0)
                attn_body<E, F16, G>(kv, q, qs, out, os, n_head, tok_seq, tok_pos, bl, scale,
                                     softcap, window, NULL, t0, smem, blockIdx.x * G, 0, true);
        } else if (blockIdx.z < G) { /* few (one decode token): a head per block, z < G */
            attn_body<E, F16, 1>(kv, q, qs, out, os, n_head, tok_seq, tok_pos, bl, scale, softcap,
                                 window, NULL, t0, smem, blockIdx.x * G + blockIdx.z, 0, true);
        }
        return;
    }
    const int sp = blockIdx.z;
    if (sp >= ns) return;
    const int h0 = blockIdx.x * G, kvh = h0 / (n_head / kv.n_kv_head);
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int32_t pa = p0 + sp * ch, pb = min(pa + ch, pos + 1); /* this block's [pa, pb) */
    const int32_t *table = bl.table + (int64_t)row * bl.stride;
    const size_t elt = F16 ? 2 : 4;
    const size_t head_off = ((size_t)kvh * HD + (size_t)lane * E) * elt;
    const size_t slot_bytes = (size_t)kv.n_kv_head * HD * elt;
    float *wp = smem + G * ATT_WARPS * (HD + 2) + wi * WPS; /* this warp's p, corr */
    float qv[G][E], acc[G][E], l[G], mo[R];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float *qp = q + t * qs + (int64_t)(h0 + g) * HD + lane * E;
#pragma unroll
        for (int e = 0; e < E; e++) qv[g][e] = qp[e], acc[g][e] = 0.0f;
        l[g] = 0.0f;
    }
#pragma unroll
    for (int r = 0; r < R; r++) mo[r] = -INFINITY;
    using RowT = att_row<E, F16>;
    constexpr int WP = ATT_WARPS * P; /* positions a pass of the warps */
    /* the K and V rows of positions [g0, g0 + P) (zeros past pb) */
    auto load = [&](RowT(&kr)[P], RowT(&vr)[P], int32_t g0) {
#pragma unroll
        for (int j = 0; j < P; j++) {
            const int32_t p = g0 + j;
            if (p < pb) {
                const int32_t b = table[p / KILN_KV_BLOCK];
                const size_t off = (size_t)b * kv.block_bytes +
                                   (size_t)(p % KILN_KV_BLOCK) * slot_bytes + head_off;
                kr[j].load((const uint8_t *)kv.k + off);
                vr[j].load((const uint8_t *)kv.v + off);
            } else {
                kr[j].zero(), vr[j].zero();
            }
        }
    };
    /* one group of P positions from gp: scores, softmax update, accumulators */
    auto step = [&](const RowT(&kr)[P], const RowT(&vr)[P], int32_t gp) {
        float sc[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v[NL];
#pragma unroll
            for (int i = 0; i < NL; i++) {
                const int gi = (32 * r + i) / P, j = (32 * r + i) % P;
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < E; e++) d = fmaf(qv[gi][e], kr[j].get(e), d);
                v[i] = d;
            }
            /* butterfly: at distance 16, 8, ... a lane keeps half its values (the upper half
             * where its distance bit is set) and adds its partner's copy of them */
            att_bfly<NL, 16>(v, lane);
            att_bfly<(NL >> 1), 8>(v, lane);
            att_bfly<(NL >> 2), 4>(v, lane);
            att_bfly<(NL >> 3), 2>(v, lane);
            att_bfly<(NL >> 4), 1>(v, lane);
            const int i = 32 * r + (lane >> SH), j = i % P;
            float s = v[0] * scale;
            if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
            sc[r] = gp + j < pb ? s : -INFINITY;
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            float mx = sc[r];
#pragma unroll
            for (int b = 0; b < LP; b++)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, (1 << SH) << b));
            const float mn = fmaxf(mo[r], mx); /* finite: position gp is in range */
            const float pe = expf(sc[r] - mn), corr = expf(mo[r] - mn);
            mo[r] = mn;
            const int i = 32 * r + (lane >> SH);
            if ((lane & ((1 << SH) - 1)) == 0) {
                wp[i] = pe;
                if (i % P == 0) wp[NV + i / P] = corr;
            }
        }
        __syncwarp();
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float c = wp[NV + g];
            float pj[P];
#pragma unroll
            for (int j = 0; j < P; j += 4) {
                const float4 f = *(const float4 *)(wp + g * P + j);
                pj[j] = f.x, pj[j + 1] = f.y, pj[j + 2] = f.z, pj[j + 3] = f.w;
            }
            l[g] *= c;
#pragma unroll
            for (int j = 0; j < P; j++) l[g] += pj[j];
#pragma unroll
            for (int e = 0; e < E; e++) {
                float a = acc[g][e] * c;
#pragma unroll
                for (int j = 0; j < P; j++) a = fmaf(pj[j], vr[j].get(e), a);
                acc[g][e] = a;
            }
        }
        __syncwarp();
    };
    RowT ka[P], va[P];
    int32_t gp = pa + wi * P;
    if constexpr (PF) { /* the next group's loads in flight while this one is computed */
        RowT kb[P], vb[P];
        if (gp < pb) load(ka, va, gp);
        while (gp < pb) {
            if (gp + WP < pb) load(kb, vb, gp + WP);
            step(ka, va, gp);
            gp += WP;
            if (gp >= pb) break;
            if (gp + WP < pb) load(ka, va, gp + WP);
            step(kb, vb, gp);
            gp += WP;
        }
    } else {
        for (; gp < pb; gp += WP) {
            load(ka, va, gp);
            step(ka, va, gp);
        }
    }
    /* the warps' states merged as attn_body merges them (m per head from its lanes) */
    float(*sm)[ATT_WARPS] = (float(*)[ATT_WARPS])smem;
    float(*sl)[ATT_WARPS] = (float(*)[ATT_WARPS])(smem + G * ATT_WARPS);
    float(*sacc)[ATT_WARPS][HD] = (float(*)[ATT_WARPS][HD])(smem + 2 * G * ATT_WARPS);
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float mg = __shfl_sync(0xffffffffu, mo[(g * P) / 32], ((g * P) % 32) << SH);
        if (lane == 0) sm[g][wi] = mg, sl[g][wi] = l[g];
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
        float *w = part + (((int64_t)blockIdx.y * n_head + h0 + g) * ATT2_ZMAX + sp) * (HD + 4);
        if (lane == 0) w[0] = M, w[1] = L;
#pragma unroll
        for (int e = 0; e < E; e++) w[4 + lane * E + e] = r[e];
    }
}

/* attn_split_kernel's ranges merged in order: a warp per (query head, token); lane s holds
 * ranges s and s + 32's max and sum (the max and the sum over lanes by xor shuffles), each
 * lane its E columns over the ranges in order. */
template <int E>
__global__ void __launch_bounds__(32)
    attn_combine2(float *out, int64_t os, int n_head, const int32_t *__restrict__ tok_seq,
                  const int32_t *__restrict__ tok_pos, kiln_kv_blocks bl, int window,
                  const float *__restrict__ part, int64_t t0, int per) {
    constexpr int HD = 32 * E, ST = HD + 4;
    const int h = blockIdx.x, lane = threadIdx.x;
    const int64_t t = t0 + blockIdx.y;
    const int32_t pos = tok_pos[t], row = tok_seq[t];
    if (row < 0 || row >= bl.n_seqs || pos < 0 || pos >= bl.seq_len[row] ||
        pos / KILN_KV_BLOCK >= bl.stride)
        return; /* attn_split_kernel wrote zeros */
    const int32_t p0 = (window > 0 && pos - window + 1 > 0) ? pos - window + 1 : 0;
    int32_t ch;
    const int ns = att2_ranges(pos + 1 - p0, per, &ch);
    if (ns == 1) return;
    const float *w = part + ((int64_t)blockIdx.y * n_head + h) * ATT2_ZMAX * ST;
    float ms[2], ls[2];
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int s = lane + 32 * k;
        ms[k] = s < ns ? w[(int64_t)s * ST] : -INFINITY;
        ls[k] = s < ns ? w[(int64_t)s * ST + 1] : 0.0f;
    }
    float M = fmaxf(ms[0], ms[1]);
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, x));
    float f[2], L = 0.0f;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        f[k] = ls[k] > 0.0f ? expf(ms[k] - M) : 0.0f;
        L = fmaf(ls[k], f[k], L);
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) L += __shfl_xor_sync(0xffffffffu, L, x);
    float r[E];
#pragma unroll
    for (int e = 0; e < E; e++) r[e] = 0.0f;
#pragma unroll 8
    for (int s = 0; s < ns; s++) {
        const float fs = __shfl_sync(0xffffffffu, s < 32 ? f[0] : f[1], s & 31);
        const float *ws = w + (int64_t)s * ST + 4 + lane * E;
#pragma unroll
        for (int e = 0; e < E; e++) r[e] = fmaf(ws[e], fs, r[e]);
    }
    const float inv = 1.0f / L;
    float *o = out + t * os + (int64_t)h * HD + lane * E;
#pragma unroll
    for (int e = 0; e < E; e++) o[e] = r[e] * inv;
}

/* The GQA kernel for this call: head_dim 64 or 128, 2 / 4 / 8 query heads per KV head,
 * and (KV heads x tokens) blocks enough to fill the GPU twice (fewer: G = 1's G times as many
 * blocks are faster, e.g. one decode sequence). 0: G = 1. */
static int kc_old_attn = -1, kc_old_splitk = -1, kc_att2_pos = -1, kc_att2_pf = -1;
extern "C" void kiln_cuda_attention_gqa(int on) {
    kc_old_attn = on ? 0 : 1;
}
extern "C" void kiln_cuda_attention_old_splitk(int on) {
    kc_old_splitk = on ? 1 : 0;
}
extern "C" void kiln_cuda_attention_split_prefetch(int on) {
    kc_att2_pf = on ? 1 : 0;
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

#define ATT2_SPLIT(EE, GG)                                                                         \
    do {                                                                                           \
        dim3 gg((unsigned)(a->n_head / GG), (unsigned)tc, (unsigned)(zmax > GG ? zmax : GG));      \
        if (f16 && pf)                                                                             \
            attn_split_kernel<EE, true, GG, true><<<gg, ATT_WARPS * 32, 0, s>>>(                   \
                a->kv, a->q, a->q_stride, a->out, a->out_stride, a->n_head, a->tok_seq,            \
                a->tok_pos, a->blocks, a->scale, a->softcap, a->window, part, t0, ug, per);        \
        else if (f16)                                                                              \
            attn_split_kernel<EE, true, GG, false><<<gg, ATT_WARPS * 32, 0, s>>>(                  \
                a->kv, a->q, a->q_stride, a->out, a->out_stride, a->n_head, a->tok_seq,            \
                a->tok_pos, a->blocks, a->scale, a->softcap, a->window, part, t0, ug, per);        \
        else /* f32 cache (tests, debugging): no second group (its rows spill) */                  \
            attn_split_kernel<EE, false, GG, false><<<gg, ATT_WARPS * 32, 0, s>>>(                 \
                a->kv, a->q, a->q_stride, a->out, a->out_stride, a->n_head, a->tok_seq,            \
                a->tok_pos, a->blocks, a->scale, a->softcap, a->window, part, t0, ug, per);        \
        attn_combine2<EE><<<dim3((unsigned)a->n_head, (unsigned)tc), 32, 0, s>>>(                  \
            a->out, a->out_stride, a->n_head, a->tok_seq, a->tok_pos, a->blocks, a->window, part,  \
            t0, per);                                                                              \
    } while (0)

#define ATT2_CASE(EE)                                                                              \
    case EE:                                                                                       \
        ATT2_SPLIT(EE, 1);                                                                         \
        break

/* One launch of session 12's split path over tokens [t0, t0 + tc): attn_split_kernel (up to
 * zmax ranges a token; tokens that are not split run attn_body there: with ug, as
 * attn_kernel's G > 1 would (a block for the G heads), else a head per block in z < G, as
 * its G = 1: the same bits) and attn_combine2. G: the query heads of a KV head where
 * attn_kernel may group them (batch-independent here: a single decode token needs the
 * grouping most), 1 with KILN_CUDA_OLD_ATTN=1. */
static kiln_status att2_launch(const kiln_attention_args *a, bool f16, int gq, int ug, int zmax,
                               float *part, int64_t t0, int64_t tc, int per, bool pf,
                               cudaStream_t s) {
    const int hd = a->kv.head_dim;
    if (gq && hd == 64) {
        if (gq == 2)
            ATT2_SPLIT(2, 2);
        else if (gq == 4)
            ATT2_SPLIT(2, 4);
        else
            ATT2_SPLIT(2, 8);
        return KILN_OK;
    }
    if (gq && hd == 128) {
        if (gq == 2)
            ATT2_SPLIT(4, 2);
        else if (gq == 4)
            ATT2_SPLIT(4, 4);
        else
            ATT2_SPLIT(4, 8);
        return KILN_OK;
    }
    switch (hd / 32) {
        ATT2_CASE(1);
        ATT2_CASE(2);
        ATT2_CASE(3);
        ATT2_CASE(4);
        ATT2_CASE(5);
        ATT2_CASE(6);
        ATT2_CASE(7);
        ATT2_CASE(8);
    default:
        return KILN_ERR_INVALID_ARG;
    }
    return KILN_OK;
}

/* the most ranges of any token attending to <= max_len positions (att2_ranges grows with
 * the length up to ATT2_ZMAX) */
static int att2_zmax(int64_t max_len, int per) {
    const int64_t z = (max_len + per - 1) / per;
    return z > ATT2_ZMAX ? ATT2_ZMAX : (int)z;
}

extern "C" size_t kiln_cuda_attention_ws_bytes(int64_t t, int32_t n_head, int32_t head_dim,
                                               int64_t max_len) {
    if (t <= 0 || n_head <= 0 || head_dim <= 0 || att_splits(max_len) == 1) return 0;
    /* session 11's ranges (KILN_CUDA_OLD_SPLITK) and session 12's: the larger */
    const int64_t tc = t < ATT_TCHUNK ? t : ATT_TCHUNK, tc2 = t < ATT2_TCHUNK ? t : ATT2_TCHUNK;
    const size_t b1 =
        (size_t)tc * (size_t)n_head * ATT_ZMAX * ((size_t)head_dim + 2) * sizeof(float);
    const size_t b2 =
        (size_t)tc2 * (size_t)n_head * ATT2_ZMAX * ((size_t)head_dim + 4) * sizeof(float);
    return b1 > b2 ? b1 : b2;
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
    if (kc_old_splitk < 0) { /* KILN_CUDA_OLD_SPLITK=1: session 11's ranges (A/B), read once */
        const char *e = getenv("KILN_CUDA_OLD_SPLITK");
        kc_old_splitk = e && e[0] == '1';
    }
    if (zmax > 1 && !kc_old_splitk) {
        const size_t need = kiln_cuda_attention_ws_bytes(a->t, a->n_head, hd, maxlen);
        if (!c->scratch || c->scratch_size < need) return KILN_ERR_INVALID_ARG; /* spec'd */
        const int g = a->n_head / a->kv.n_kv_head;
        if (kc_att2_pos < 0) {
            const char *e = getenv("KILN_CUDA_ATT2_POS");
            const long v = e ? strtol(e, NULL, 10) : 0;
            kc_att2_pos = v >= 64 && v <= 4096 && v % 64 == 0 ? (int)v : ATT2_POS;
        }
        const int per = kc_att2_pos;
        if (kc_att2_pf < 0) { /* KILN_CUDA_ATT2_PF=1: a second group in flight (A/B) */
            const char *e = getenv("KILN_CUDA_ATT2_PF");
            kc_att2_pf = e && e[0] == '1' ? 1 : 0;
        }
        const int g2 =
            !kc_old_attn && (hd == 64 || hd == 128) && (g == 2 || g == 4 || g == 8) ? g : 0;
        for (int64_t t0 = 0; t0 < a->t; t0 += ATT2_TCHUNK) {
            const int64_t tc = a->t - t0 < ATT2_TCHUNK ? a->t - t0 : ATT2_TCHUNK;
            const kiln_status st =
                att2_launch(a, f16, g2, gq != 0, att2_zmax(maxlen, per), (float *)c->scratch, t0,
                            tc, per, kc_att2_pf != 0, s);
            if (st) return st;
        }
        return kc_launched();
    }
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
