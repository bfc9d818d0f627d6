/*
 * flash_attn.cu — tensor-core attention for prefill and mixed steps (session 11, issue 17):
 * the op of attention.cu (paged KV cache with block tables read in the kernel, one flat
 * list of query tokens from any number of sequences, causal, GQA, sliding window, softcap,
 * f16 or f32 cache) on mma.sync m16n8k16, at kiln's f32 exactness.
 *
 * Work: a warp owns 16 "rows", row R = (token R / G, query head kvh G + R % G) for the KV
 * head kvh = blockIdx.y (G query heads per KV head): the G heads of a token share every K /
 * V tile. The rows' tokens need not be of one sequence: the warp walks the sequences among
 * its rows one after another (a "segment": the positions [min p0, max pos] of that
 * sequence's rows), and a row outside the segment sees every key masked. Keys go in tiles
 * of 16 at absolute positions (multiples of 16), staged by the warp in shared memory (f16
 * cache: by cp.async, the next tile's copies in flight while the current one is computed;
 * f32 cache: loaded and split into hi / lo halves); per
 * tile S = Q K^T (two n8 tiles), an online softmax in f32 per row (rows g and g + 8 of a
 * lane's quad, the running sum kept per lane and summed over the quad at the end), O += P V.
 *
 * Numerics (docs/CUDA.md "Exact numerics on tensor cores: split f16"): each row of q is
 * scaled by a power of two (its largest |q| into [0.5, 1): exact) and split into f16 hi +
 * 2^11-scaled lo; f16 K and V are exact, f32 K / V are split the same way; P in [0, 1] is
 * split too. S = Qh K + 2^-11 (Ql K [+ Qh Kl]) and O = Ph V + 2^-11 (Pl V [+ Ph Vl]) with f32
 * accumulation: the 2^-11 terms go first into the accumulator held at 2^11 times its value
 * (power-of-two scalings, exact), then the hi term. f16 x f16 products are exact in f32, so
 * the result is f32 arithmetic's up to the dropped lo x lo term (~2^-22 relative): the
 * kernel test holds it to 2e-5 of the ref like every f32 path. f32 K / V values beyond
 * f16's range (65504) would overflow their hi half: the f32 cache is a test and debug
 * option, its values are the model's keys and values.
 *
 * Deterministic (fixed order everywhere); a row's result depends on its own keys only (tiles
 * at absolute positions, masked keys add exact zeros), but the entry switches to
 * attention.cu's kernel for steps of few tokens per sequence, so the spec does not claim
 * batch invariance.
 */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

#define FA_NW   4  /* warps per CTA */
#define FA_MINQ 16 /* query tokens per sequence (on average) from which the kernel runs */

/* halves per shared row (padded: the fragment reads hit 32 distinct banks) */
template <int HD, bool F16> struct fa_geom {
    static constexpr int LD = HD + 8;
    /* q hi / lo, then f16 cache: K, V of two tiles (the next one's copies in flight while
     * the current one is computed); f32 cache: K hi, V hi, K lo, V lo of one tile */
    static constexpr size_t WARP_BYTES = (size_t)6 * 16 * LD * 2;
};

__device__ __forceinline__ uint32_t fa_pack(__half a, __half b) {
    return (uint32_t)__half_as_ushort(a) | ((uint32_t)__half_as_ushort(b) << 16);
}

/* hi and 2^11-scaled lo halves of 4 floats into hi[0..3], lo[0..3] */
__device__ __forceinline__ void fa_split4(float4 v, __half *hi, __half *lo) {
    const float a[4] = {v.x, v.y, v.z, v.w};
    __half h[4], l[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        h[i] = __float2half_rn(a[i]);
        l[i] = __float2half_rn((a[i] - __half2float(h[i])) * 2048.0f);
    }
    *(uint2 *)hi = make_uint2(fa_pack(h[0], h[1]), fa_pack(h[2], h[3]));
    *(uint2 *)lo = make_uint2(fa_pack(l[0], l[1]), fa_pack(l[2], l[3]));
}

/* four 8 x 8 b16 matrices from shared memory (lane l gives row l % 8 of matrix l / 8);
 * TR: each transposed (the B fragments of V) */
template <bool TR> __device__ __forceinline__ void fa_ldsm4(uint32_t r[4], const __half *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    if constexpr (TR)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
}

template <int HD, bool F16, bool LDSM>
__global__ void __launch_bounds__(FA_NW * 32)
    flash_attn_kernel(kiln_kv_layer kv, const float *__restrict__ q, int64_t qs, float *out,
                      int64_t os, int n_head, int64_t t, const int32_t *__restrict__ tok_seq,
                      const int32_t *__restrict__ tok_pos, kiln_kv_blocks bl, float scale,
                      float softcap, int window) {
    kc_pdl_trigger();
    constexpr int LD = fa_geom<HD, F16>::LD, NT = HD / 8, KS = HD / 16;
    extern __shared__ uint4 fa_sm[];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    __half *sQh = (__half *)((uint8_t *)fa_sm + (size_t)wi * fa_geom<HD, F16>::WARP_BYTES);
    __half *sQl = sQh + 16 * LD, *sKh = sQl + 16 * LD, *sVh = sKh + 16 * LD;
    __half *sKl = sVh + 16 * LD, *sVl = sKl + 16 * LD; /* f32 cache only */
    const int G = n_head / kv.n_kv_head, kvh = blockIdx.y;
    /* the last tokens' rows (the longest causal ranges) first */
    const int64_t R0 = ((int64_t)(gridDim.x - 1 - blockIdx.x) * FA_NW + wi) * 16;
    const int64_t nrows = t * G;
    if (R0 >= nrows) return;

    /* lane l (and l + 16) describes row l % 16 */
    const int mr = lane & 15;
    const int64_t R = R0 + mr;
    int64_t tok = 0;
    int head = 0, seq = -1, pos = -1, p0 = 0;
    if (R < nrows) {
        tok = R / G, head = kvh * G + (int)(R % G);
        const int32_t s = tok_seq[tok], p = tok_pos[tok];
        if (s >= 0 && s < bl.n_seqs && p >= 0 && p < bl.seq_len[s] && p / KILN_KV_BLOCK < bl.stride)
            seq = s, pos = p, p0 = (window > 0 && p - window + 1 > 0) ? p - window + 1 : 0;
    }

    /* q rows -> power-of-two scaled, split halves in shared memory (invalid rows: 0) */
    float qsc = 1.0f; /* row mr's scale back */
    for (int r = 0; r < 16; r++) {
        const int64_t rt = __shfl_sync(0xffffffffu, tok, r);
        const int rh = __shfl_sync(0xffffffffu, head, r), rs = __shfl_sync(0xffffffffu, seq, r);
        float4 v[HD / 128 > 0 ? HD / 128 : 1];
        constexpr int NV = HD / 128 > 0 ? HD / 128 : 1;
        const bool lv = rs >= 0 && (HD >= 128 || lane < HD / 4);
        float mx = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            v[i] = lv ? *(const float4 *)(q + rt * qs + (int64_t)rh * HD + 4 * (lane + 32 * i))
                      : make_float4(0.f, 0.f, 0.f, 0.f);
            mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)),
                                 fmaxf(fabsf(v[i].z), fabsf(v[i].w))));
        }
#pragma unroll
        for (int x = 16; x > 0; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
        int e = 0;
        if (mx > 0.0f && isfinite(mx)) (void)frexpf(mx, &e); /* mx in [2^(e-1), 2^e) */
        const float down = ldexpf(1.0f, -e), up = ldexpf(1.0f, e);
        if (mr == r) qsc = up;
#pragma unroll
        for (int i = 0; i < NV; i++)
            if (HD >= 128 || lane < HD / 4) {
                const float4 w =
                    make_float4(v[i].x * down, v[i].y * down, v[i].z * down, v[i].w * down);
                fa_split4(w, sQh + r * LD + 4 * (lane + 32 * i),
                          sQl + r * LD + 4 * (lane + 32 * i));
            }
    }
    __syncwarp();

    const size_t elt = F16 ? 2 : 4;
    const size_t slot_bytes = (size_t)kv.n_kv_head * HD * elt, head_off = (size_t)kvh * HD * elt;
    /* rows g and g + 8 of this lane's quad */
    const float sc_a = __shfl_sync(0xffffffffu, qsc, g) * scale,
                sc_b = __shfl_sync(0xffffffffu, qsc, g + 8) * scale;
    float o[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
    bool done = seq < 0;
    for (;;) {
        const unsigned pend = __ballot_sync(0xffffffffu, !done) & 0xFFFFu;
        if (!pend) break;
        const int s = __shfl_sync(0xffffffffu, seq, __ffs(pend) - 1);
        const bool in = !done && seq == s;
        int lo = in ? p0 : INT_MAX, hi = in ? pos : -1;
#pragma unroll
        for (int x = 16; x > 0; x >>= 1) {
            lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, x));
            hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, x));
        }
        const bool in_a = __shfl_sync(0xffffffffu, in, g),
                   in_b = __shfl_sync(0xffffffffu, in, g + 8);
        const int lo_a = __shfl_sync(0xffffffffu, p0, g),
                  lo_b = __shfl_sync(0xffffffffu, p0, g + 8);
        const int hi_a = __shfl_sync(0xffffffffu, pos, g),
                  hi_b = __shfl_sync(0xffffffffu, pos, g + 8);
        const int32_t *table = bl.table + (int64_t)s * bl.stride;
        /* f16 cache: the tile at kb into buffer b (sKh / sVh or sKl / sVl) by cp.async, one
         * commit group per tile; keys outside [lo, hi]: zeros */
        auto issue = [&](int kb, int b) {
            __half *dk = b ? sKl : sKh, *dv = b ? sVl : sVh;
#pragma unroll
            for (int it = 0; it < HD / 16; it++) {
                const int idx = lane + 32 * it, key = idx / (HD / 8), c = idx % (HD / 8);
                const int p = kb + key;
                if (p >= lo && p <= hi) {
                    const size_t off = (size_t)table[p / KILN_KV_BLOCK] * kv.block_bytes +
                                       (size_t)(p % KILN_KV_BLOCK) * slot_bytes + head_off;
                    kc_cp16(dk + key * LD + 8 * c,
                            (const uint4 *)((const uint8_t *)kv.k + off) + c);
                    kc_cp16(dv + key * LD + 8 * c,
                            (const uint4 *)((const uint8_t *)kv.v + off) + c);
                } else {
                    *(uint4 *)(dk + key * LD + 8 * c) = make_uint4(0, 0, 0, 0);
                    *(uint4 *)(dv + key * LD + 8 * c) = make_uint4(0, 0, 0, 0);
                }
            }
            kc_cp_commit();
        };
        int buf = 0;
        if constexpr (F16) {
            __syncwarp(); /* the previous segment's last tile is read */
            issue(lo & ~15, 0);
        }
        for (int kb = lo & ~15; kb <= hi; kb += 16, buf ^= 1) {
            const __half *Kc = sKh, *Vc = sVh;
            if constexpr (F16) {
                if (kb + 16 <= hi) {
                    __syncwarp(); /* buffer buf ^ 1 was read by the previous tile */
                    issue(kb + 16, buf ^ 1);
                    kc_cp_wait<1>();
                } else {
                    kc_cp_wait<0>();
                }
                if (buf) Kc = sKl, Vc = sVl;
            } else {
                /* stage the tile's K and V rows as hi / lo halves (keys outside: zeros) */
                __syncwarp();
#pragma unroll 4
                for (int it = 0; it < HD / 8; it++) {
                    const int idx = lane + 32 * it, key = idx / (HD / 4), c = idx % (HD / 4);
                    const int p = kb + key;
                    float4 kf = make_float4(0.f, 0.f, 0.f, 0.f), vf = kf;
                    if (p >= lo && p <= hi) {
                        const size_t off = (size_t)table[p / KILN_KV_BLOCK] * kv.block_bytes +
                                           (size_t)(p % KILN_KV_BLOCK) * slot_bytes + head_off;
                        kf = *((const float4 *)((const uint8_t *)kv.k + off) + c);
                        vf = *((const float4 *)((const uint8_t *)kv.v + off) + c);
                    }
                    fa_split4(kf, sKh + key * LD + 4 * c, sKl + key * LD + 4 * c);
                    fa_split4(vf, sVh + key * LD + 4 * c, sVl + key * LD + 4 * c);
                }
            }
            __syncwarp();

            /* S = Q K^T: the 2^-11 terms (at 2^11 scale), then Qh Kh. LDSM: fragments by
             * ldmatrix, the 2^-11 terms in an accumulator of their own (each K fragment
             * loaded once); else 32-bit loads, the 2^-11 terms first in S, scaled, then Qh Kh
             * into the same accumulator */
            float sa[2][4];
#pragma unroll
            for (int nt = 0; nt < 2; nt++) sa[nt][0] = sa[nt][1] = sa[nt][2] = sa[nt][3] = 0.0f;
            if constexpr (LDSM) {
                float sl[2][4];
#pragma unroll
                for (int nt = 0; nt < 2; nt++) sl[nt][0] = sl[nt][1] = sl[nt][2] = sl[nt][3] = 0.0f;
                const int lm = lane >> 3, lr = lane & 7;
                const int qo = (lr + 8 * (lm & 1)) * LD + 8 * (lm >> 1);
                const int ko = (lr + 8 * (lm >> 1)) * LD + 8 * (lm & 1);
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    uint32_t ah[4], al[4], kf[4];
                    fa_ldsm4<false>(ah, sQh + qo + kk * 16);
                    fa_ldsm4<false>(al, sQl + qo + kk * 16);
                    fa_ldsm4<false>(kf, Kc + ko + kk * 16);
                    kc_mma16816(sl[0], al, kf[0], kf[1]);
                    kc_mma16816(sl[1], al, kf[2], kf[3]);
                    if constexpr (!F16) {
                        uint32_t kl[4];
                        fa_ldsm4<false>(kl, sKl + ko + kk * 16);
                        kc_mma16816(sl[0], ah, kl[0], kl[1]);
                        kc_mma16816(sl[1], ah, kl[2], kl[3]);
                    }
                    kc_mma16816(sa[0], ah, kf[0], kf[1]);
                    kc_mma16816(sa[1], ah, kf[2], kf[3]);
                }
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) sa[nt][i] += sl[nt][i] * (1.0f / 2048.0f);
            } else {
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    const int c0 = kk * 16 + 2 * tig;
                    uint32_t al[4];
                    al[0] = *(const uint32_t *)(sQl + g * LD + c0);
                    al[1] = *(const uint32_t *)(sQl + (g + 8) * LD + c0);
                    al[2] = *(const uint32_t *)(sQl + g * LD + c0 + 8);
                    al[3] = *(const uint32_t *)(sQl + (g + 8) * LD + c0 + 8);
#pragma unroll
                    for (int nt = 0; nt < 2; nt++) {
                        const __half *kr = Kc + (nt * 8 + g) * LD + c0;
                        kc_mma16816(sa[nt], al, *(const uint32_t *)kr, *(const uint32_t *)(kr + 8));
                    }
                    if constexpr (!F16) {
                        uint32_t ah[4];
                        ah[0] = *(const uint32_t *)(sQh + g * LD + c0);
                        ah[1] = *(const uint32_t *)(sQh + (g + 8) * LD + c0);
                        ah[2] = *(const uint32_t *)(sQh + g * LD + c0 + 8);
                        ah[3] = *(const uint32_t *)(sQh + (g + 8) * LD + c0 + 8);
#pragma unroll
                        for (int nt = 0; nt < 2; nt++) {
                            const __half *kr = sKl + (nt * 8 + g) * LD + c0;
                            kc_mma16816(sa[nt], ah, *(const uint32_t *)kr,
                                        *(const uint32_t *)(kr + 8));
                        }
                    }
                }
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) sa[nt][i] *= 1.0f / 2048.0f;
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    const int c0 = kk * 16 + 2 * tig;
                    uint32_t ah[4];
                    ah[0] = *(const uint32_t *)(sQh + g * LD + c0);
                    ah[1] = *(const uint32_t *)(sQh + (g + 8) * LD + c0);
                    ah[2] = *(const uint32_t *)(sQh + g * LD + c0 + 8);
                    ah[3] = *(const uint32_t *)(sQh + (g + 8) * LD + c0 + 8);
#pragma unroll
                    for (int nt = 0; nt < 2; nt++) {
                        const __half *kr = Kc + (nt * 8 + g) * LD + c0;
                        kc_mma16816(sa[nt], ah, *(const uint32_t *)kr, *(const uint32_t *)(kr + 8));
                    }
                }
            }
            /* scores, softcap, mask; online softmax per row (a: row g, b: row g + 8) */
            float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const bool rb = i >= 2;
                    const int key = kb + nt * 8 + 2 * tig + (i & 1);
                    float v = sa[nt][i] * (rb ? sc_b : sc_a);
                    if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
                    const bool ok = rb ? (in_b && key >= lo_b && key <= hi_b)
                                       : (in_a && key >= lo_a && key <= hi_a);
                    v = ok ? v : -INFINITY;
                    sa[nt][i] = v;
                    if (rb)
                        mx_b = fmaxf(mx_b, v);
                    else
                        mx_a = fmaxf(mx_a, v);
                }
#pragma unroll
            for (int x = 1; x <= 2; x <<= 1) {
                mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, x));
                mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, x));
            }
            const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
            const float cr_a = mn_a == -INFINITY ? 1.0f : expf(m_a - mn_a);
            const float cr_b = mn_b == -INFINITY ? 1.0f : expf(m_b - mn_b);
            m_a = mn_a, m_b = mn_b;
            uint32_t ph[4], pl[4];
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                float p[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float mn = i >= 2 ? mn_b : mn_a;
                    p[i] = (sa[nt][i] == -INFINITY) ? 0.0f : expf(sa[nt][i] - mn);
                }
                l_a = l_a * (nt == 0 ? cr_a : 1.0f) + p[0] + p[1];
                l_b = l_b * (nt == 0 ? cr_b : 1.0f) + p[2] + p[3];
                __half h[4], lw[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    h[i] = __float2half_rn(p[i]);
                    lw[i] = __float2half_rn((p[i] - __half2float(h[i])) * 2048.0f);
                }
                /* A fragment: a0 row g keys 2 tig.., a1 row g + 8, a2 / a3 the keys + 8 */
                ph[2 * nt] = fa_pack(h[0], h[1]), ph[2 * nt + 1] = fa_pack(h[2], h[3]);
                pl[2 * nt] = fa_pack(lw[0], lw[1]), pl[2 * nt + 1] = fa_pack(lw[2], lw[3]);
            }
            /* O = corr O + P V: at 2^11 scale, the lo terms; back; the hi term */
            const float u_a = cr_a * 2048.0f, u_b = cr_b * 2048.0f;
            if constexpr (LDSM) {
                const int lm = lane >> 3, lr = lane & 7;
                const int vo = (lr + 8 * (lm & 1)) * LD + 8 * (lm >> 1);
#pragma unroll
                for (int nd = 0; nd < NT; nd += 2) {
                    uint32_t vf[4], vl[4];
                    fa_ldsm4<true>(vf, Vc + vo + nd * 8);
                    if constexpr (!F16) fa_ldsm4<true>(vl, sVl + vo + nd * 8);
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        float *oo = o[nd + j];
                        oo[0] *= u_a, oo[1] *= u_a, oo[2] *= u_b, oo[3] *= u_b;
                        kc_mma16816(oo, pl, vf[2 * j], vf[2 * j + 1]);
                        if constexpr (!F16) kc_mma16816(oo, ph, vl[2 * j], vl[2 * j + 1]);
#pragma unroll
                        for (int i = 0; i < 4; i++) oo[i] *= 1.0f / 2048.0f;
                        kc_mma16816(oo, ph, vf[2 * j], vf[2 * j + 1]);
                    }
                }
            } else {
#pragma unroll
                for (int nd = 0; nd < NT; nd++) {
                    o[nd][0] *= u_a, o[nd][1] *= u_a, o[nd][2] *= u_b, o[nd][3] *= u_b;
                    const int col = nd * 8 + g;
                    const __half *v0 = Vc + (2 * tig) * LD + col;
                    const uint32_t b0 = fa_pack(v0[0], v0[LD]),
                                   b1 = fa_pack(v0[8 * LD], v0[9 * LD]);
                    kc_mma16816(o[nd], pl, b0, b1);
                    if constexpr (!F16) {
                        const __half *w0 = sVl + (2 * tig) * LD + col;
                        kc_mma16816(o[nd], ph, fa_pack(w0[0], w0[LD]),
                                    fa_pack(w0[8 * LD], w0[9 * LD]));
                    }
#pragma unroll
                    for (int i = 0; i < 4; i++) o[nd][i] *= 1.0f / 2048.0f;
                    kc_mma16816(o[nd], ph, b0, b1);
                }
            }
        }
        if (in) done = true;
    }

    /* the quad's sums, then O / l for the valid rows (invalid rows: 0, as attention.cu) */
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
        l_a += __shfl_xor_sync(0xffffffffu, l_a, x);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, x);
    }
    const float iv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f, iv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = g + 8 * half;
        const int64_t rr = R0 + r;
        if (rr >= nrows) continue;
        const int64_t rt = rr / G;
        const int rh = kvh * G + (int)(rr % G);
        const float iv = half ? iv_b : iv_a;
        float *op = out + rt * os + (int64_t)rh * HD + 2 * tig;
#pragma unroll
        for (int nd = 0; nd < NT; nd++)
            *(float2 *)(op + nd * 8) = make_float2(o[nd][2 * half] * iv, o[nd][2 * half + 1] * iv);
    }
}

/* -1: read KILN_CUDA_FLASH once (0: never the flash kernel); 1 on; 2 forced (every step
 * it can run, whatever its tokens per sequence: the kernel test) */
static int kc_flash = -1;
extern "C" void kiln_cuda_attention_flash_mode(int mode) {
    kc_flash = mode;
}
static int flash_mode(void) {
    if (kc_flash < 0) {
        const char *e = getenv("KILN_CUDA_FLASH");
        kc_flash = e && e[0] == '0' ? 0 : 1;
    }
    return kc_flash;
}

/* fragments by ldmatrix (1, default) or 32 / 16-bit shared loads (0: KILN_CUDA_FA_LDSM=0);
 * the two sum S's terms in another order (both within the contract, each deterministic) */
static int kc_fa_ldsm = -1;
extern "C" void kiln_cuda_attention_flash_ldsm(int on) {
    kc_fa_ldsm = on ? 1 : 0;
}
static bool fa_ldsm_on(void) {
    if (kc_fa_ldsm < 0) {
        const char *e = getenv("KILN_CUDA_FA_LDSM");
        kc_fa_ldsm = e && e[0] == '0' ? 0 : 1;
    }
    return kc_fa_ldsm == 1;
}

template <int HD, bool F16> static cudaError_t fa_attr(void) {
    const int b = (int)(FA_NW * fa_geom<HD, F16>::WARP_BYTES);
    cudaError_t e = cudaFuncSetAttribute(flash_attn_kernel<HD, F16, true>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, b);
    if (e != cudaSuccess) return e;
    return cudaFuncSetAttribute(flash_attn_kernel<HD, F16, false>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, b);
}

/* The kernels' shared-memory limits, set on the entry's first call (a prompt's prefill,
 * before any step is captured into a graph), whichever kernel that call runs. Per device:
 * one flag per device ordinal. */
#define FA_MAX_DEV 64
static int fa_attr_done[FA_MAX_DEV];
static kiln_status fa_init(void) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return KILN_ERR_DEVICE;
    if (dev >= 0 && dev < FA_MAX_DEV && __atomic_load_n(&fa_attr_done[dev], __ATOMIC_ACQUIRE))
        return KILN_OK;
    if (fa_attr<64, true>() != cudaSuccess || fa_attr<64, false>() != cudaSuccess ||
        fa_attr<128, true>() != cudaSuccess || fa_attr<128, false>() != cudaSuccess ||
        fa_attr<256, true>() != cudaSuccess || fa_attr<256, false>() != cudaSuccess)
        return KILN_ERR_DEVICE;
    if (dev >= 0 && dev < FA_MAX_DEV) __atomic_store_n(&fa_attr_done[dev], 1, __ATOMIC_RELEASE);
    return KILN_OK;
}

template <int HD, bool F16>
static kiln_status fa_launch(cudaStream_t s, const kiln_attention_args *a) {
    const size_t smem = FA_NW * fa_geom<HD, F16>::WARP_BYTES;
    const int G = a->n_head / a->kv.n_kv_head;
    const int64_t rows = a->t * G, per = 16 * FA_NW;
    const int64_t gx = (rows + per - 1) / per;
    if (gx > INT32_MAX) return KILN_ERR_INVALID_ARG;
    dim3 grid((unsigned)gx, (unsigned)a->kv.n_kv_head);
    if (fa_ldsm_on())
        flash_attn_kernel<HD, F16, true><<<grid, FA_NW * 32, smem, s>>>(
            a->kv, a->q, a->q_stride, a->out, a->out_stride, a->n_head, a->t, a->tok_seq,
            a->tok_pos, a->blocks, a->scale, a->softcap, a->window);
    else
        flash_attn_kernel<HD, F16, false><<<grid, FA_NW * 32, smem, s>>>(
            a->kv, a->q, a->q_stride, a->out, a->out_stride, a->n_head, a->t, a->tok_seq,
            a->tok_pos, a->blocks, a->scale, a->softcap, a->window);
    return kc_launched();
}

extern "C" int kiln_cuda_attention_flash_ok(const kiln_attention_args *a) {
    const int hd = a->kv.head_dim, mode = flash_mode();
    if (!mode || a->t <= 0 || (hd != 64 && hd != 128 && hd != 256)) return 0;
    if (a->kv.n_kv_head <= 0 || a->n_head % a->kv.n_kv_head || a->kv.n_kv_head > 65535) return 0;
    if (a->kv.dtype != KILN_DTYPE_F16 && a->kv.dtype != KILN_DTYPE_F32) return 0;
    if (((uintptr_t)a->q & 15) || (a->q_stride & 3) || ((uintptr_t)a->out & 7) ||
        (a->out_stride & 1) || (a->kv.block_bytes & 15) || ((uintptr_t)a->kv.k & 15) ||
        ((uintptr_t)a->kv.v & 15))
        return 0;
    if (mode == 2) return 1;
    return a->blocks.n_seqs > 0 && a->t >= (int64_t)FA_MINQ * a->blocks.n_seqs;
}

extern "C" kiln_status kiln_cuda_attention_flash(const kiln_kctx *c, const kiln_attention_args *a) {
    if (a->t <= 0) return KILN_OK;
    if (flash_mode()) KILN_TRY(fa_init());
    if (!kiln_cuda_attention_flash_ok(a)) return kiln_cuda_attention(c, a);
    cudaStream_t s = KC_STREAM(c);
    const bool f16 = a->kv.dtype == KILN_DTYPE_F16;
    switch (a->kv.head_dim) {
    case 64:
        return f16 ? fa_launch<64, true>(s, a) : fa_launch<64, false>(s, a);
    case 128:
        return f16 ? fa_launch<128, true>(s, a) : fa_launch<128, false>(s, a);
    default:
        return f16 ? fa_launch<256, true>(s, a) : fa_launch<256, false>(s, a);
    }
}
