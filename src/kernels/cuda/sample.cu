/*
 * sample.cu — the sampling chain on the device (kernel.h, KILN_KOP_SAMPLE): one block of
 * 1024 threads per logits row hands back the row's token id, so a sampled decode step
 * copies ids, not logits, to the host.
 *
 * Per row (the CPU chain's sorted-candidate path, src/sample/sample.c, step for step):
 *  1. K = k + n_ov raw candidates (k = top_k, or 1 when greedy; n_ov the tokens whose
 *     logit the bias / penalties change): the K best of f(logits) (f = the final softcap)
 *     by a threshold search on 32-bit order keys (float bits made monotone, larger logit
 *     first, ties to the lower id): every pass counts, per thread in registers, the keys
 *     at or above 16 thresholds splitting the current interval [lo, hi) (count(>= lo) >=
 *     K > count(>= hi)); a pass narrows it 16-fold, and the search stops once count(>=
 *     lo) fits the 4096-entry shared buffer (typically 3-4 passes of the row) or the
 *     interval is one key (ties: the lowest ids of that key are taken in id order). No
 *     sort of the row, no atomics per element.
 *  2. the survivors (and the overridden tokens with their new logits, dropping their raw
 *     copies, exactly as the CPU heap path) sorted in shared memory (bitonic, 64-bit keys
 *     logit|~id) and cut to k;
 *  3. top-p, min-p and the draw by warp 0 in double, with the CPU's sums in the CPU's
 *     order (lanes compute the exps, the running sum walks them one by one), using the
 *     row's uniform draw u from the host's per-sequence RNG.
 * Float steps use explicit _rn intrinsics (no FMA contraction) so the penalties and the
 * softcap round as the C code does; exp / tanhf are CUDA's (within 1 ulp of glibc's):
 * docs/SAMPLING.md lists the boundary cases that can differ.
 */
#include "kernels/cuda/common.cuh"
#include "kernels/select.h"

#include <math.h>

#define SNT  1024 /* threads per row */
#define SCAP KILN_SAMPLE_MAX_CAND
#define NTHR 16 /* thresholds per counting pass */

/* Order key of an effective logit: 0 for NaN / -inf (never a candidate), else the float's
 * bits made monotone (-0 counted as +0, so equal logits have equal keys). */
__device__ __forceinline__ uint32_t s_key(float v) {
    if (isnan(v) || v == -INFINITY) return 0u;
    uint32_t u = __float_as_uint(v);
    if ((u << 1) == 0) u = 0; /* -0 -> +0 */
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float s_val(uint32_t k) {
    return (k & 0x80000000u) ? __uint_as_float(k & 0x7fffffffu) : __uint_as_float(~k);
}

/* Sort key: key high, then 0xffffffff - id (descending order = best first, ties to the
 * lower id). 0 never denotes a candidate. */
__device__ __forceinline__ uint64_t s_comp(uint32_t key, int32_t id) {
    return ((uint64_t)key << 32) | (uint64_t)(0xffffffffu - (uint32_t)id);
}
__device__ __forceinline__ int32_t s_comp_id(uint64_t c) {
    return (int32_t)(0xffffffffu - (uint32_t)c);
}

__device__ __forceinline__ float s_cap(float v, float cap) {
    return cap > 0.0f ? __fmul_rn(cap, tanhf(__fdiv_rn(v, cap))) : v;
}

__device__ __forceinline__ float s_override(float l, float bias, int32_t count,
                                            const kiln_sample_row_params &p) {
    l = __fadd_rn(l, bias);
    if (count > 0) {
        l = l <= 0.0f ? __fmul_rn(l, p.repeat_penalty) : __fdiv_rn(l, p.repeat_penalty);
        l = __fsub_rn(l,
                      __fadd_rn(__fmul_rn((float)count, p.frequency_penalty), p.presence_penalty));
    }
    return l;
}

/* Calls f(key, id) for every logit of the row, float4 loads (4 in flight) when aligned.
 * Every thread of the block runs the same number of iterations (f may use warp
 * collectives): positions past the row come as key 0 (never a candidate). */
template <typename F>
__device__ __forceinline__ void s_for_row(const float *__restrict__ row, int64_t n, bool vec,
                                          float cap, F f) {
    int64_t i0 = 0;
    if (vec) {
        const int64_t n4 = n / 4;
#pragma unroll 4
        for (int64_t b = 0; b < n4; b += SNT) {
            const int64_t i = b + threadIdx.x;
            const bool in = i < n4;
            const float4 v = in ? ((const float4 *)row)[i] : make_float4(0, 0, 0, 0);
            f(in ? s_key(s_cap(v.x, cap)) : 0u, (int32_t)(4 * i));
            f(in ? s_key(s_cap(v.y, cap)) : 0u, (int32_t)(4 * i + 1));
            f(in ? s_key(s_cap(v.z, cap)) : 0u, (int32_t)(4 * i + 2));
            f(in ? s_key(s_cap(v.w, cap)) : 0u, (int32_t)(4 * i + 3));
        }
        i0 = 4 * n4;
    }
    for (int64_t b = i0; b < n; b += SNT) {
        const int64_t i = b + threadIdx.x;
        f(i < n ? s_key(s_cap(row[i], cap)) : 0u, (int32_t)i);
    }
}

/* Descending bitonic sort of buf[0..m) (padded with zeros to a power of two). */
__device__ void s_sort(uint64_t *buf, int m) {
    int p = 1;
    while (p < m) p <<= 1;
    for (int i = m + threadIdx.x; i < p; i += SNT) buf[i] = 0;
    __syncthreads();
    for (int k = 2; k <= p; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < p; i += SNT) {
                const int ixj = i ^ j;
                if (ixj > i) {
                    const uint64_t a = buf[i], b = buf[ixj];
                    if ((i & k) == 0 ? a < b : a > b) buf[i] = b, buf[ixj] = a;
                }
            }
            __syncthreads();
        }
    }
}

/* Slot for a thread whose pred holds: one shared atomic per warp. */
__device__ __forceinline__ int s_slot(bool pred, int *counter) {
    const unsigned m = __ballot_sync(0xffffffffu, pred);
    if (!m) return -1;
    const int lane = threadIdx.x & 31, leader = __ffs(m) - 1;
    int base = 0;
    if (lane == leader) base = atomicAdd(counter, __popc(m));
    base = __shfl_sync(0xffffffffu, base, leader);
    return pred ? base + __popc(m & ((1u << lane) - 1)) : -1;
}

/* Exclusive prefix (in id order) of a per-thread flag over the block; *total gets the sum. */
__device__ __forceinline__ int s_block_rank(bool flag, int *warp_sums, int *total) {
    const unsigned m = __ballot_sync(0xffffffffu, flag);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) warp_sums[w] = __popc(m);
    __syncthreads();
    int before = 0, all = 0;
    for (int i = 0; i < SNT / 32; i++) {
        const int s = warp_sums[i];
        before += i < w ? s : 0;
        all += s;
    }
    __syncthreads();
    *total = all;
    return before + __popc(m & ((1u << lane) - 1));
}

/* Sum in candidate order of e(i) for i < m, by warp 0 (every lane gets the same value);
 * with stop_at >= 0 it returns the first i whose running sum satisfies the test (cum >=
 * target when ge, else cum > target) in *hit, -1 when none. */
template <typename E>
__device__ __forceinline__ double s_walk(int m, E e, double target, bool ge, int *hit) {
    const int lane = threadIdx.x & 31;
    double cum = 0;
    if (hit) *hit = -1;
    for (int c0 = 0; c0 < m; c0 += 32) {
        const double v = c0 + lane < m ? e(c0 + lane) : 0.0;
        const int len = m - c0 < 32 ? m - c0 : 32;
        for (int j = 0; j < len; j++) {
            cum += __shfl_sync(0xffffffffu, v, j);
            if (hit && (ge ? cum >= target : target < cum)) {
                *hit = c0 + j;
                return cum;
            }
        }
    }
    return cum;
}

/* One counting pass of the block: thr[j] = lo + (hi - lo) j / NTHR, cnt[j] = count(key >=
 * thr[j]) over every key src gives (16 compares a key, in registers; one shared atomic per
 * warp and threshold). Starts and ends with a barrier (cnt is the block's). */
template <typename SRC>
__device__ __forceinline__ void s_pass(uint32_t lo, uint64_t hi, uint32_t thr[NTHR], uint32_t *cnt,
                                       SRC src) {
    uint32_t c[NTHR];
#pragma unroll
    for (int j = 0; j < NTHR; j++) {
        thr[j] = (uint32_t)(lo + (hi - lo) * (uint64_t)j / NTHR);
        c[j] = 0;
    }
    __syncthreads(); /* the previous pass's readers of cnt are done */
    if (threadIdx.x < NTHR) cnt[threadIdx.x] = 0;
    __syncthreads();
    src([&](uint32_t key, int32_t) {
        if (key < lo) return;
#pragma unroll
        for (int j = 0; j < NTHR; j++) c[j] += key >= thr[j];
    });
#pragma unroll
    for (int j = 0; j < NTHR; j++) {
        const uint32_t sum = __reduce_add_sync(0xffffffffu, c[j]);
        if ((threadIdx.x & 31) == 0 && sum) atomicAdd(&cnt[j], sum);
    }
    __syncthreads();
}

/* The highest threshold of a pass that keeps count >= K. */
__device__ __forceinline__ int s_pick(const uint32_t *cnt, uint32_t K) {
    int j = 0;
    while (j + 1 < NTHR && cnt[j + 1] >= K) j++;
    return j;
}

/* The block's smallest and largest of kmin / kmax (every thread gets them; s_lo, s_hi:
 * shared scratch). */
__device__ __forceinline__ void s_minmax(uint32_t *kmin, uint32_t *kmax, uint32_t *s_lo,
                                         uint32_t *s_hi) {
    if (threadIdx.x == 0) *s_lo = 0xffffffffu, *s_hi = 0;
    __syncthreads();
    const uint32_t a = __reduce_min_sync(0xffffffffu, *kmin);
    const uint32_t b = __reduce_max_sync(0xffffffffu, *kmax);
    if ((threadIdx.x & 31) == 0) atomicMin(s_lo, a), atomicMax(s_hi, b);
    __syncthreads();
    *kmin = *s_lo, *kmax = *s_hi;
}

/* The chain for row r of one block of SNT threads. src(f) calls f(key, id) for every
 * candidate the search may consider (the whole row, or a list holding every key >= the
 * row's K-th best), every thread the same number of times; stop: the search ends once
 * count(key >= lo) <= stop (<= SCAP). The boundary-tie path scans the row itself. */
struct s_smem {
    uint64_t buf[SCAP];
    uint32_t cnt[NTHR];
    int warp_sums[SNT / 32];
    int s_n;
};

template <typename SRC>
__device__ __forceinline__ void
s_chain(const float *__restrict__ row, int64_t n, bool vec, float cap,
        const kiln_sample_row_params &p, const int32_t *__restrict__ ov_id,
        const float *__restrict__ ov_bias, const int32_t *__restrict__ ov_count,
        int32_t *__restrict__ ids, int64_t r, SRC src, uint32_t stop, uint32_t lo0, uint64_t hi0,
        s_smem &sm) {
    uint64_t *buf = sm.buf;
    uint32_t *cnt = sm.cnt;
    int *warp_sums = sm.warp_sums;
    int &s_n = sm.s_n;
    const bool greedy = !(p.temperature > 0.0f);
    const int64_t k = greedy ? 1 : (p.top_k > 0 && p.top_k < n ? p.top_k : n);
    const int n_ov = p.n_ov;
    const int32_t *oid = ov_id + p.ov_off;
    if (n_ov < 0 || k + 2 * (int64_t)n_ov > SCAP) {
        if (threadIdx.x == 0) ids[r] = -2; /* the caller checks this before the launch */
        return;
    }
    const uint32_t K = (uint32_t)(k + n_ov);

    /* 1. threshold search: count(key >= lo) >= K > count(key >= hi) */
    uint32_t lo = lo0, cnt_lo = 0; /* [lo0, hi0) holds every live key of the source */
    uint64_t hi = hi0;
    for (bool first = true;; first = false) {
        if (!first && (cnt_lo <= stop || hi - lo <= 1)) break;
        uint32_t thr[NTHR];
        s_pass(lo, hi, thr, cnt, src);
        if (first && cnt[0] <= K) { /* every alive logit is a candidate */
            cnt_lo = cnt[0];
            break;
        }
        const int j = s_pick(cnt, K);
        cnt_lo = cnt[j];
        if (j + 1 < NTHR) hi = thr[j + 1];
        lo = thr[j];
    }
    __syncthreads(); /* cnt's last readers */

    /* gather the K best raw candidates into buf */
    if (threadIdx.x == 0) s_n = 0;
    __syncthreads();
    int m;
    if (cnt_lo <= SCAP) {
        src([&](uint32_t key, int32_t id) {
            const int slot = s_slot(key >= lo, &s_n);
            if (slot >= 0 && slot < SCAP) buf[slot] = s_comp(key, id);
        });
        __syncthreads();
        m = s_n < SCAP ? s_n : SCAP;
        __syncthreads();
        s_sort(buf, m);
        if (m > (int)K) m = (int)K;
    } else { /* the boundary is one key shared by more than SCAP logits: lowest ids */
        const uint32_t T = lo;
        src([&](uint32_t key, int32_t id) {
            const int slot = s_slot(key > T, &s_n);
            if (slot >= 0 && slot < SCAP) buf[slot] = s_comp(key, id);
        });
        __syncthreads();
        const int above = s_n < SCAP ? s_n : SCAP;
        const int need = (int)K - above;
        int taken = 0;
        for (int64_t base = 0; base < n && taken < need; base += SNT) {
            const int64_t i = base + threadIdx.x;
            const bool f = i < n && s_key(s_cap(row[i], cap)) == T;
            int total;
            const int rk = s_block_rank(f, warp_sums, &total);
            if (f && taken + rk < need) buf[above + taken + rk] = s_comp(T, (int32_t)i);
            taken += total;
        }
        m = above + (taken < need ? taken : need);
        __syncthreads();
        s_sort(buf, m);
    }

    /* 2. overrides: drop the raw copies of overridden ids, add their new logits */
    if (n_ov > 0) {
        uint64_t keep[SCAP / SNT];
        int nk = 0;
        for (int i = threadIdx.x; i < m; i += SNT) {
            const uint64_t cc = buf[i];
            const int32_t id = s_comp_id(cc);
            int a = 0, b = n_ov;
            while (a < b) {
                const int mid = (a + b) / 2;
                if (oid[mid] < id)
                    a = mid + 1;
                else
                    b = mid;
            }
            if (!(a < n_ov && oid[a] == id)) keep[nk++] = cc;
        }
        if (threadIdx.x == 0) s_n = 0;
        __syncthreads();
        for (int q = 0; q < SCAP / SNT; q++) {
            const int slot = s_slot(q < nk, &s_n);
            if (slot >= 0) buf[slot] = keep[q];
        }
        for (int j0 = 0; j0 < n_ov; j0 += SNT) {
            const int j = j0 + threadIdx.x;
            uint32_t key = 0;
            int32_t id = 0;
            if (j < n_ov) {
                id = oid[j];
                if (id >= 0 && id < n)
                    key = s_key(s_override(s_cap(row[id], cap), ov_bias[p.ov_off + j],
                                           ov_count[p.ov_off + j], p));
            }
            const int slot = s_slot(key != 0, &s_n);
            if (slot >= 0) buf[slot] = s_comp(key, id);
        }
        __syncthreads();
        m = s_n;
        __syncthreads();
        s_sort(buf, m);
    }
    if (m > (int)k) m = (int)k;

    /* 3. top-p, min-p, draw (warp 0, double, the CPU's order) */
    if (threadIdx.x >= 32) return;
    if (m <= 0) {
        if (threadIdx.x == 0) ids[r] = -1;
        return;
    }
    if (greedy) {
        if (threadIdx.x == 0) ids[r] = s_comp_id(buf[0]);
        return;
    }
    const float mx = s_val((uint32_t)(buf[0] >> 32));
    auto lg = [&](int i) { return s_val((uint32_t)(buf[i] >> 32)); };
    if (p.top_p < 1.0f && m > 1) {
        auto e = [&](int i) {
            const float l = lg(i);
            return l == mx ? 1.0 : exp((double)l - (double)mx);
        };
        const double z = s_walk(m, e, 0.0, true, NULL);
        int hit;
        s_walk(m, e, (double)p.top_p * z, true, &hit);
        if (hit >= 0) m = hit + 1;
    }
    if (p.min_p > 0.0f && m > 1) {
        const float thr = __fadd_rn(mx, p.log_min_p);
        if (!(mx >= thr)) {
            m = 1;
        } else {
            int w = 0;
            for (int c0 = 0; c0 < m; c0 += 32) {
                const bool ok = c0 + (int)threadIdx.x < m && lg(c0 + threadIdx.x) >= thr;
                w += __popc(__ballot_sync(0xffffffffu, ok));
            }
            m = w;
        }
    }
    const double t = (double)p.temperature;
    auto wgt = [&](int i) {
        const float l = lg(i);
        return l == mx ? 1.0 : exp(((double)l - (double)mx) / t);
    };
    const double sum = s_walk(m, wgt, 0.0, true, NULL);
    int hit;
    s_walk(m, wgt, p.u * sum, false, &hit);
    if (threadIdx.x == 0) ids[r] = s_comp_id(buf[hit >= 0 ? hit : m - 1]);
}

/* The whole row as the source (one block per row: the path without workspace). */
__global__ void __launch_bounds__(SNT)
    sample_kernel(const float *__restrict__ logits, int64_t ld, int64_t n, bool vec, float cap,
                  const kiln_sample_row_params *__restrict__ rows,
                  const int32_t *__restrict__ ov_id, const float *__restrict__ ov_bias,
                  const int32_t *__restrict__ ov_count, int32_t *__restrict__ ids) {
    __shared__ s_smem sm;
    const int64_t r = blockIdx.x;
    const float *row = logits + r * ld;
    s_chain(
        row, n, vec, cap, rows[r], ov_id, ov_bias, ov_count, ids, r,
        [&](auto f) { s_for_row(row, n, vec, cap, f); }, SCAP, 1u, 1ull << 32, sm);
}

/* ---- the split path: many blocks per row find a bound, gather, then one block finishes ----
 *
 * A. bound_kernel, grid (chunks, rows): each block holds a chunk of CH logits' keys in
 *    registers and narrows [lo, hi) with the same 16-threshold passes until count(key >= lo)
 *    <= 2K (or the interval is one key); a chunk whose K-th best key is >= lo has
 *    count >= K, so the row's K-th best key T >= lo too: L = max over chunks of lo <= T.
 *    A chunk with fewer than K live keys bounds nothing (lo = 1). The search starts at
 *    the chunk's [min, max] live key. When K x chunks > LCAP / 2 (a large top-k) the list
 *    could overflow: the row is flagged (bound 0) and finish_kernel takes the whole row.
 * B. gather_kernel, same grid: every key >= L (so every candidate of the row's top K, ties
 *    at T included) appended to the row's list (a counter per row; past LCAP only counted).
 * C. finish_kernel, a block per row: the chain of s_chain over the list (count <= LCAP),
 *    else over the whole row as sample_kernel does. Both give the same ids: the K best
 *    keys (ties to the lower id) are the same set wherever they are searched. */
#define CH_T 512           /* threads of a chunk block                              */
#define CH_E 16            /* keys per thread                                       */
#define CH   (CH_T * CH_E) /* logits per chunk                                      */
#define LCAP (4 * SCAP)    /* list entries per row                                  */

/* Workspace layout per row: [LCAP] uint64 list | count (u32) | pad | [chunks] u32 bounds. */
static inline size_t s_row_ws(int64_t n) {
    const int64_t nc = (n + CH - 1) / CH;
    return (size_t)LCAP * 8 + 16 + (((size_t)nc * 4 + 15) & ~(size_t)15);
}

__device__ __forceinline__ bool s_row_ok(const kiln_sample_row_params &p, int64_t n, uint32_t *K) {
    const bool greedy = !(p.temperature > 0.0f);
    const int64_t k = greedy ? 1 : (p.top_k > 0 && p.top_k < n ? p.top_k : n);
    if (p.n_ov < 0 || k + 2 * (int64_t)p.n_ov > SCAP) return false;
    *K = (uint32_t)(k + p.n_ov);
    return true;
}

__global__ void __launch_bounds__(CH_T)
    bound_kernel(const float *__restrict__ logits, int64_t ld, int64_t n, float cap,
                 const kiln_sample_row_params *__restrict__ rows, uint8_t *__restrict__ ws,
                 size_t row_ws) {
    __shared__ uint32_t cnt[NTHR], s_lo, s_hi;
    const int64_t r = blockIdx.y, c0 = (int64_t)blockIdx.x * CH;
    const float *row = logits + r * ld;
    uint8_t *w = ws + (size_t)r * row_ws;
    uint32_t *bound = (uint32_t *)(w + (size_t)LCAP * 8 + 16);
    if (blockIdx.x == 0 && threadIdx.x == 0) *(uint32_t *)(w + (size_t)LCAP * 8) = 0;
    uint32_t K;
    if (!s_row_ok(rows[r], n, &K)) { /* finish_kernel reports the row */
        if (threadIdx.x == 0) bound[blockIdx.x] = 1;
        return;
    }
    if ((uint64_t)K * gridDim.x > LCAP / 2) { /* the list could overflow: the row's own path */
        if (threadIdx.x == 0) bound[blockIdx.x] = 0;
        return;
    }
    uint32_t key[CH_E];
#pragma unroll
    for (int e = 0; e < CH_E; e++) {
        const int64_t i = c0 + e * CH_T + threadIdx.x;
        key[e] = i < n ? s_key(s_cap(row[i], cap)) : 0u;
    }
    /* the interval starts at the chunk's live keys: [min, max] */
    uint32_t kmin = 0xffffffffu, kmax = 0;
#pragma unroll
    for (int e = 0; e < CH_E; e++) {
        kmin = key[e] ? min(kmin, key[e]) : kmin;
        kmax = max(kmax, key[e]);
    }
    s_minmax(&kmin, &kmax, &s_lo, &s_hi);
    if (kmax == 0) { /* no live key in the chunk */
        if (threadIdx.x == 0) bound[blockIdx.x] = 1;
        return;
    }
    uint32_t lo = kmin;
    uint64_t hi = (uint64_t)kmax + 1;
    for (int pass = 0; pass < 9; pass++) {
        uint32_t thr[NTHR];
        s_pass(lo, hi, thr, cnt, [&](auto f) {
#pragma unroll
            for (int e = 0; e < CH_E; e++) f(key[e], 0);
        });
        if (pass == 0 && cnt[0] < K) { /* fewer than K live keys: no bound */
            lo = 1;
            break;
        }
        const int j = s_pick(cnt, K);
        const uint32_t cl = cnt[j];
        lo = thr[j];
        if (j + 1 < NTHR) hi = thr[j + 1];
        if (cl <= 2 * K || hi - lo <= 1) break;
    }
    if (threadIdx.x == 0) bound[blockIdx.x] = lo;
}

__global__ void __launch_bounds__(CH_T)
    gather_kernel(const float *__restrict__ logits, int64_t ld, int64_t n, float cap,
                  int64_t n_chunks, uint8_t *__restrict__ ws, size_t row_ws) {
    __shared__ uint32_t s_L;
    const int64_t r = blockIdx.y, c0 = (int64_t)blockIdx.x * CH;
    const float *row = logits + r * ld;
    uint8_t *w = ws + (size_t)r * row_ws;
    uint64_t *list = (uint64_t *)w;
    uint32_t *count = (uint32_t *)(w + (size_t)LCAP * 8);
    const uint32_t *bound = (const uint32_t *)(w + (size_t)LCAP * 8 + 16);
    if (threadIdx.x < 32) {
        uint32_t L = 1;
        for (int64_t b = threadIdx.x; b < n_chunks; b += 32) L = max(L, bound[b]);
        L = __reduce_max_sync(0xffffffffu, L);
        if (threadIdx.x == 0) s_L = L;
    }
    __syncthreads();
    const uint32_t L = s_L;
    if (bound[0] == 0) { /* bound_kernel's flag: finish_kernel takes the whole row */
        if (blockIdx.x == 0 && threadIdx.x == 0) *count = LCAP + 1;
        return;
    }
#pragma unroll 4
    for (int e = 0; e < CH_E; e++) {
        const int64_t i = c0 + e * CH_T + threadIdx.x;
        const uint32_t key = i < n ? s_key(s_cap(row[i], cap)) : 0u;
        const bool take = key >= L;
        const unsigned m = __ballot_sync(0xffffffffu, take);
        if (!m) continue;
        const int lane = threadIdx.x & 31, leader = __ffs(m) - 1;
        uint32_t base = 0;
        if (lane == leader) base = atomicAdd(count, (uint32_t)__popc(m));
        base = __shfl_sync(0xffffffffu, base, leader);
        const uint32_t slot = base + __popc(m & ((1u << lane) - 1));
        if (take && slot < LCAP) list[slot] = s_comp(key, (int32_t)i);
    }
}

__global__ void __launch_bounds__(SNT)
    finish_kernel(const float *__restrict__ logits, int64_t ld, int64_t n, bool vec, float cap,
                  const kiln_sample_row_params *__restrict__ rows,
                  const int32_t *__restrict__ ov_id, const float *__restrict__ ov_bias,
                  const int32_t *__restrict__ ov_count, int32_t *__restrict__ ids,
                  const uint8_t *__restrict__ ws, size_t row_ws) {
    __shared__ s_smem sm;
    const int64_t r = blockIdx.x;
    const float *row = logits + r * ld;
    const uint8_t *w = ws + (size_t)r * row_ws;
    const uint64_t *list = (const uint64_t *)w;
    const uint32_t m = *(const uint32_t *)(w + (size_t)LCAP * 8);
    if (m <= LCAP) {
        /* the list: narrow to <= 512 before the sort (a pass costs m / SNT keys a thread),
         * from the interval of its keys */
        __shared__ uint32_t s_lo, s_hi;
        uint32_t kmin = 0xffffffffu, kmax = 0;
        for (uint32_t i = threadIdx.x; i < m; i += SNT) {
            const uint32_t key = (uint32_t)(list[i] >> 32);
            kmin = min(kmin, key);
            kmax = max(kmax, key);
        }
        s_minmax(&kmin, &kmax, &s_lo, &s_hi);
        const uint32_t lo0 = kmax ? kmin : 1u;
        const uint64_t hi0 = kmax ? (uint64_t)kmax + 1 : 1ull << 32;
        s_chain(
            row, n, vec, cap, rows[r], ov_id, ov_bias, ov_count, ids, r,
            [&](auto f) {
                for (uint32_t b = 0; b < m; b += SNT) {
                    const uint32_t i = b + threadIdx.x;
                    const uint64_t c = i < m ? list[i] : 0;
                    f((uint32_t)(c >> 32), s_comp_id(c));
                }
            },
            512u, lo0, hi0, sm);
    } else {
        s_chain(
            row, n, vec, cap, rows[r], ov_id, ov_bias, ov_count, ids, r,
            [&](auto f) { s_for_row(row, n, vec, cap, f); }, SCAP, 1u, 1ull << 32, sm);
    }
}

static int s_split_on(void) {
    static int on = -1; /* process-wide A/B switch, read once */
    if (on < 0) {
        const char *e = getenv("KILN_CUDA_OLD_SAMPLE");
        on = !(e && e[0] == '1');
    }
    return on;
}

extern "C" size_t kiln_cuda_sample_ws_bytes(int64_t rows, int64_t n) {
    if (rows <= 0 || n <= 0 || n > INT32_MAX) return 0;
    const size_t rw = s_row_ws(n);
    if ((size_t)rows > SIZE_MAX / rw) return 0;
    return (size_t)rows * rw;
}

extern "C" size_t kiln_cuda_sample_workspace(const struct kiln_sel_ctx *ctx) {
    return kiln_cuda_sample_ws_bytes(ctx->tokens_max < 1 ? 1 : ctx->tokens_max, ctx->n);
}

extern "C" kiln_status kiln_cuda_sample(const kiln_kctx *c, const kiln_sample_args *a) {
    if (a->t == 0) return KILN_OK;
    if (a->t < 0 || a->t > INT32_MAX || a->n <= 0 || a->n > a->ld || a->n > INT32_MAX ||
        !a->logits || !a->rows || !a->ids)
        return KILN_ERR_INVALID_ARG; /* kernels.h: argument shapes are the caller's to check */
    const bool vec = a->ld % 4 == 0 && ((uintptr_t)a->logits & 15) == 0;
    const size_t need = kiln_cuda_sample_ws_bytes(a->t, a->n);
    const int64_t n_chunks = (a->n + CH - 1) / CH;
    /* the split path when the workspace holds it and the grid fits (rows <= 65535) */
    if (s_split_on() && need && c->scratch && c->scratch_size >= need && a->t <= 65535 &&
        n_chunks <= INT32_MAX) {
        const size_t rw = s_row_ws(a->n);
        uint8_t *ws = (uint8_t *)c->scratch;
        const dim3 g((unsigned)n_chunks, (unsigned)a->t);
        bound_kernel<<<g, CH_T, 0, KC_STREAM(c)>>>(a->logits, a->ld, a->n, a->softcap, a->rows, ws,
                                                   rw);
        gather_kernel<<<g, CH_T, 0, KC_STREAM(c)>>>(a->logits, a->ld, a->n, a->softcap, n_chunks,
                                                    ws, rw);
        finish_kernel<<<(unsigned)a->t, SNT, 0, KC_STREAM(c)>>>(
            a->logits, a->ld, a->n, vec, a->softcap, a->rows, a->ov_id, a->ov_bias, a->ov_count,
            a->ids, ws, rw);
        return kc_launched();
    }
    sample_kernel<<<(unsigned)a->t, SNT, 0, KC_STREAM(c)>>>(a->logits, a->ld, a->n, vec, a->softcap,
                                                            a->rows, a->ov_id, a->ov_bias,
                                                            a->ov_count, a->ids);
    return kc_launched();
}
