/*
 * ops.cu — the row-wise ops on the device: embedding lookup (every weight dtype of
 * common.cuh), RMS norm (+ fused residual add; squares summed in f64 as the ref),
 * RoPE (ggml semantics: the angle recurrence theta_{i+1} = theta_i * base^(-2/n_rot)
 * in f32, YaRN, frequency factors, both pairings, partial rotation), the paged KV write
 * (f16 or f32 cache), RoPE + KV write, gated activations and the add.
 */
#include "kernels/cuda/common.cuh"

#include <math.h>

/* ---- embedding ---- */

template <int DT>
__global__ void embed_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n_vocab,
                             int64_t dim, const int32_t *__restrict__ ids, float *y, int64_t ys,
                             float scale, bool shard, int64_t id_base) {
    const int64_t t = blockIdx.y;
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= dim / 32) return;
    const int64_t id = (int64_t)ids[t] - (shard ? id_base : 0);
    if (id < 0 || id >= n_vocab) {
        if (shard) { /* a vocabulary shard: another rank's id gives a zero row */
            float *o = y + t * ys + g * 32;
#pragma unroll
            for (int i = 0; i < 32; i++) o[i] = 0.0f;
        }
        return;
    }
    float w[32];
    kc_dq32<DT>(W + (size_t)id * row_bytes, g, w);
    float *o = y + t * ys + g * 32;
#pragma unroll
    for (int i = 0; i < 32; i++) o[i] = scale != 1.0f ? w[i] * scale : w[i];
}

#define EMBED_CASE(DT, s, a)                                                                       \
    embed_kernel<DT><<<dim3((unsigned)((a->dim / 32 + 127) / 128), (unsigned)a->t), 128, 0, s>>>(  \
        (const uint8_t *)a->w, a->w_row_bytes, a->n_vocab, a->dim, a->ids, a->y, a->y_stride,      \
        a->scale, a->shard, a->id_base)

extern "C" kiln_status kiln_cuda_embed(const kiln_kctx *c, const kiln_embed_args *a) {
    if (a->t <= 0) return KILN_OK;
    const int be = kc_block_elems(a->w_dtype);
    if (!be || a->dim % be || a->t > 65535) return KILN_ERR_INVALID_ARG;
    cudaStream_t s = KC_STREAM(c);
    KC_DTYPE_SWITCH(a->w_dtype, EMBED_CASE, s, a);
    return kc_launched();
}

/* ---- RMS norm ---- */

/* 1 / sqrt(mean of squares + eps) of a row from the threads' f64 partial sums: warps by
 * shuffles, warp 0 over the warps (the same order in every RMS norm kernel). Every thread
 * of the block calls it and gets the scale. */
__device__ __forceinline__ float rms_block_scale(double sum, int64_t n, float eps) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    __shared__ double part[32];
    __shared__ float scale_s;
    const int wi = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) part[wi] = sum;
    __syncthreads();
    if (wi == 0) {
        const int nw = blockDim.x >> 5;
        double v = lane < nw ? part[lane] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) {
            const float mean = (float)(v / (double)n);
            scale_s = 1.0f / sqrtf(mean + eps);
        }
    }
    __syncthreads();
    return scale_s;
}

/* s: where x + r goes (kiln_rms_norm_args), or NULL: into x in place */
__global__ void rms_norm_kernel(float *x, const float *__restrict__ r, float *s, float *y,
                                const float *__restrict__ w, const float *__restrict__ w2,
                                int64_t w2_row, float w_offset, int64_t n, int64_t xs, int64_t rs,
                                int64_t ss, int64_t ys, float eps) {
    kc_pdl_trigger(); /* the next kernel (a T16 gemv) may start: kc_pdl_wait */
    const int64_t row = blockIdx.x;
    if (w2 && row >= w2_row) w = w2; /* k's rows after q's (kiln_rms_norm_args) */
    const float *x0 = x + row * xs;
    float *xr = r && s ? s + row * ss : x + row * xs;
    float *yr = y + row * ys;
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x0[i];
        if (r) {
            v += r[row * rs + i];
            xr[i] = v;
        }
        sum += (double)v * (double)v;
    }
    const float scale = rms_block_scale(sum, n, eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i] * scale;
        yr[i] = w ? v * (w[i] + w_offset) : v;
    }
}

/* The same arithmetic in the same order (thread i sums elements i, i + threads, ... in f64,
 * then the warp and block trees of rms_norm_kernel), with the row's NV values per thread
 * loaded at once and kept in registers: one round trip to memory instead of a dependent
 * load per element (5.8 us per decode-step norm at n = 4096 in session 9's profile). */
template <int NV>
__global__ void __launch_bounds__(512)
    rms_norm_reg_kernel(float *x, const float *__restrict__ r, float *s, float *y,
                        const float *__restrict__ w, const float *__restrict__ w2, int64_t w2_row,
                        float w_offset, int64_t n, int64_t xs, int64_t rs, int64_t ss, int64_t ys,
                        float eps) {
    kc_pdl_trigger(); /* the next kernel (a T16 gemv) may start: kc_pdl_wait */
    const int64_t row = blockIdx.x;
    if (w2 && row >= w2_row) w = w2; /* k's rows after q's (kiln_rms_norm_args) */
    const float *x0 = x + row * xs;
    float *xr = r && s ? s + row * ss : x + row * xs; /* where the sum goes */
    float *yr = y + row * ys;
    const int nt = blockDim.x;
    float v[NV], wv[NV]; /* the weights too: no second round trip after the reduction */
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * nt;
        v[j] = i < n ? x0[i] : 0.0f;
        wv[j] = w && i < n ? w[i] : 0.0f;
    }
    if (r) {
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int64_t i = threadIdx.x + (int64_t)j * nt;
            if (i < n) {
                v[j] += r[row * rs + i];
                xr[i] = v[j];
            }
        }
    }
    double sum = 0.0;
#pragma unroll
    for (int j = 0; j < NV; j++)
        if (threadIdx.x + (int64_t)j * nt < n) sum += (double)v[j] * (double)v[j];
    const float scale = rms_block_scale(sum, n, eps);
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * nt;
        if (i < n) {
            const float u = v[j] * scale;
            yr[i] = w ? u * (wv[j] + w_offset) : u;
        }
    }
}

extern "C" kiln_status kiln_cuda_rms_norm(const kiln_kctx *c, const kiln_rms_norm_args *a) {
    if (a->rows <= 0) return KILN_OK;
    if (a->rows > INT32_MAX) return KILN_ERR_INVALID_ARG;
    const int threads = a->n >= 1024 ? 512 : (a->n >= 256 ? 256 : 64);
    const int64_t nv = (a->n + threads - 1) / threads;
    cudaStream_t s = KC_STREAM(c);
#define KC_NORM_REG(NV)                                                                            \
    rms_norm_reg_kernel<NV><<<(unsigned)a->rows, threads, 0, s>>>(                                 \
        a->x, a->r, a->s, a->y, a->w, a->w2, a->w2_row, a->w_offset, a->n, a->x_stride,            \
        a->r_stride, a->s_stride, a->y_stride, a->eps)
    if (kiln_cuda_decode_fused() && nv <= 16) {
        if (nv <= 4)
            KC_NORM_REG(4);
        else if (nv <= 8)
            KC_NORM_REG(8);
        else
            KC_NORM_REG(16);
    } else
        rms_norm_kernel<<<(unsigned)a->rows, threads, 0, s>>>(
            a->x, a->r, a->s, a->y, a->w, a->w2, a->w2_row, a->w_offset, a->n, a->x_stride,
            a->r_stride, a->s_stride, a->y_stride, a->eps);
#undef KC_NORM_REG
    return kc_launched();
}

/* ---- RoPE ---- */

typedef struct rope_p {
    int32_t n_head, head_dim, n_rot;
    int mode;
    float theta_scale, freq_scale, ext_factor, attn_factor, corr0, corr1, mscale_ext;
} rope_p;

__device__ __forceinline__ void rope_cs(const rope_p &p, const float *__restrict__ ff, int32_t pos,
                                        int i0, float *ct, float *st) {
    float theta = (float)pos;
    for (int i = 0; i < i0; i += 2) theta *= p.theta_scale; /* the ref's recurrence */
    const float f = ff ? ff[i0 / 2] : 1.0f;
    const float extrap = theta / f;
    float interp = p.freq_scale * extrap, th = interp, mscale = p.attn_factor;
    if (p.ext_factor != 0.0f) {
        const float yv = (float)(i0 / 2 - p.corr0) / fmaxf(0.001f, p.corr1 - p.corr0);
        const float ramp = 1 - fminf(1, fmaxf(0, yv));
        const float mix = ramp * p.ext_factor;
        th = interp * (1 - mix) + extrap * mix;
        mscale *= p.mscale_ext;
    }
    *ct = cosf(th) * mscale;
    *st = sinf(th) * mscale;
}

/* the dims of pair pi: (i0, i0 + 1) or (pi, pi + n_rot / 2) */
__device__ __forceinline__ void rope_ij(const rope_p &p, int pi, int *i, int *j) {
    if (p.mode == KILN_ROPE_NEOX) {
        *i = pi;
        *j = pi + p.n_rot / 2;
    } else {
        *i = 2 * pi;
        *j = 2 * pi + 1;
    }
}
__device__ __forceinline__ void rope_rot(float x0, float x1, float ct, float st, float *y0,
                                         float *y1) {
    const float a = x0 * ct - x1 * st, b = x0 * st + x1 * ct;
    *y0 = a, *y1 = b;
}

/* grid (rows), threads over (head, pair) */
__global__ void rope_kernel(float *x, int64_t xs, const int32_t *__restrict__ pos, rope_p p,
                            const float *__restrict__ ff) {
    const int64_t r = blockIdx.x;
    const int pairs = p.n_rot / 2;
    const int32_t ps = pos[r];
    for (int idx = threadIdx.x; idx < p.n_head * pairs; idx += blockDim.x) {
        const int h = idx / pairs, pi = idx % pairs, i0 = 2 * pi;
        float ct, st;
        rope_cs(p, ff, ps, i0, &ct, &st);
        float *v = x + r * xs + (int64_t)h * p.head_dim;
        int i, j;
        rope_ij(p, pi, &i, &j);
        rope_rot(v[i], v[j], ct, st, &v[i], &v[j]);
    }
}

static float corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

static rope_p rope_params(const kiln_rope_args *a, int32_t n_head) {
    rope_p p;
    p.n_head = n_head;
    p.head_dim = a->head_dim;
    p.n_rot = a->n_rot;
    p.mode = (int)a->mode;
    p.theta_scale = powf(a->base, -2.0f / (float)a->n_rot);
    p.freq_scale = a->freq_scale;
    p.ext_factor = a->ext_factor;
    p.attn_factor = a->attn_factor;
    p.corr0 = p.corr1 = 0;
    p.mscale_ext = 1.0f;
    if (a->ext_factor != 0.0f) {
        const int nd = a->n_rot;
        float start = floorf(corr_dim(nd, a->n_ctx_orig, a->beta_fast, a->base));
        float end = ceilf(corr_dim(nd, a->n_ctx_orig, a->beta_slow, a->base));
        p.corr0 = fmaxf(0, start);
        p.corr1 = fminf((float)(nd - 1), end);
        p.mscale_ext = 1.0f + 0.1f * logf(1.0f / a->freq_scale);
    }
    return p;
}

static kiln_status rope_launch(cudaStream_t s, const kiln_rope_args *a, float *x, int64_t xs,
                               int32_t n_head) {
    if (a->rows <= 0 || a->n_rot <= 0) return KILN_OK;
    if (a->n_rot > a->head_dim || (a->n_rot & 1) || a->rows > INT32_MAX)
        return KILN_ERR_INVALID_ARG;
    rope_p p = rope_params(a, n_head);
    int work = n_head * (a->n_rot / 2);
    int threads = work >= 256 ? 256 : ((work + 31) / 32) * 32;
    rope_kernel<<<(unsigned)a->rows, threads, 0, s>>>(x, xs, a->pos, p, a->freq_factors);
    return kc_launched();
}

extern "C" kiln_status kiln_cuda_rope(const kiln_kctx *c, const kiln_rope_args *a) {
    return rope_launch(KC_STREAM(c), a, a->x, a->x_stride, a->n_head);
}

/* ---- paged KV write ---- */

template <bool F16>
__global__ void kv_write_kernel(kiln_kv_layer kv, const float *__restrict__ k,
                                const float *__restrict__ v, int64_t ks, int64_t vs,
                                const int32_t *__restrict__ tok_seq,
                                const int32_t *__restrict__ tok_pos, kiln_kv_blocks bl) {
    const int64_t t = blockIdx.x;
    const int32_t row = tok_seq[t], pos = tok_pos[t];
    if (row < 0 || row >= bl.n_seqs) return; /* validated by the engine; never a fault */
    const int32_t lb = pos / KILN_KV_BLOCK, slot = pos % KILN_KV_BLOCK;
    if (pos < 0 || pos >= bl.seq_len[row] || lb >= bl.stride) return;
    const int32_t b = bl.table[(int64_t)row * bl.stride + lb];
    if (b < 0) return;
    const int width = kv.n_kv_head * kv.head_dim;
    const size_t base = (size_t)b * kv.block_bytes;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        const size_t e = (size_t)slot * (size_t)width + (size_t)i;
        if (F16) {
            ((__half *)((uint8_t *)kv.k + base))[e] = __float2half_rn(k[t * ks + i]);
            ((__half *)((uint8_t *)kv.v + base))[e] = __float2half_rn(v[t * vs + i]);
        } else {
            ((float *)((uint8_t *)kv.k + base))[e] = k[t * ks + i];
            ((float *)((uint8_t *)kv.v + base))[e] = v[t * vs + i];
        }
    }
}

extern "C" kiln_status kiln_cuda_kv_write(const kiln_kctx *c, const kiln_kv_write_args *a) {
    if (a->t <= 0) return KILN_OK;
    if (a->t > INT32_MAX) return KILN_ERR_INVALID_ARG;
    const int width = a->kv.n_kv_head * a->kv.head_dim;
    const int threads = width >= 256 ? 256 : ((width + 31) / 32) * 32;
    cudaStream_t s = KC_STREAM(c);
    if (a->kv.dtype == KILN_DTYPE_F16)
        kv_write_kernel<true><<<(unsigned)a->t, threads, 0, s>>>(
            a->kv, a->k, a->v, a->k_stride, a->v_stride, a->tok_seq, a->tok_pos, a->blocks);
    else if (a->kv.dtype == KILN_DTYPE_F32)
        kv_write_kernel<false><<<(unsigned)a->t, threads, 0, s>>>(
            a->kv, a->k, a->v, a->k_stride, a->v_stride, a->tok_seq, a->tok_pos, a->blocks);
    else
        return KILN_ERR_UNSUPPORTED;
    return kc_launched();
}

/* rope(q) in place, rope(k) and the write of k and v in one launch: grid (items / 256,
 * rows); per row the items are q's (head, pair)s, then k's (rotated straight into the
 * cache), k's unrotated dims [n_rot, head_dim) of each head, and v's elements. The values
 * are rope_kernel's and kv_write_kernel's (the same helpers); k is left as it was. */
template <bool F16>
__global__ void rope_kv_kernel(float *q, int64_t qs, rope_p p, int32_t n_kv_head,
                               const float *__restrict__ ff, kiln_kv_layer kv,
                               const float *__restrict__ k, const float *__restrict__ v, int64_t ks,
                               int64_t vs, const int32_t *__restrict__ tok_seq,
                               const int32_t *__restrict__ tok_pos, kiln_kv_blocks bl) {
    kc_pdl_trigger(); /* the next kernel (a T16 gemv) may start: kc_pdl_wait */
    const int64_t t = blockIdx.y;
    const int pairs = p.n_rot / 2;
    const int qp = p.n_head * pairs, kp = n_kv_head * pairs,
              kc = n_kv_head * (p.head_dim - p.n_rot), width = n_kv_head * p.head_dim;
    int idx = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const int32_t pos = tok_pos[t];
    if (idx < qp) {
        const int h = idx / pairs, pi = idx % pairs;
        float ct, st;
        rope_cs(p, ff, pos, 2 * pi, &ct, &st);
        float *x = q + t * qs + (int64_t)h * p.head_dim;
        int i, j;
        rope_ij(p, pi, &i, &j);
        rope_rot(x[i], x[j], ct, st, &x[i], &x[j]);
        return;
    }
    idx -= qp;
    if (idx >= kp + kc + width) return;
    /* the cache slot (kv_write_kernel's checks) */
    const int32_t row = tok_seq[t];
    if (row < 0 || row >= bl.n_seqs) return;
    const int32_t lb = pos / KILN_KV_BLOCK, slot = pos % KILN_KV_BLOCK;
    if (pos < 0 || pos >= bl.seq_len[row] || lb >= bl.stride) return;
    const int32_t b = bl.table[(int64_t)row * bl.stride + lb];
    if (b < 0) return;
    const size_t base = (size_t)b * kv.block_bytes, e0 = (size_t)slot * (size_t)width;
    float *kf = (float *)((uint8_t *)kv.k + base) + e0;
    __half *kh = (__half *)((uint8_t *)kv.k + base) + e0;
    if (idx < kp) {
        const int h = idx / pairs, pi = idx % pairs;
        float ct, st;
        rope_cs(p, ff, pos, 2 * pi, &ct, &st);
        const float *x = k + t * ks + (int64_t)h * p.head_dim;
        int i, j;
        rope_ij(p, pi, &i, &j);
        float y0, y1;
        rope_rot(x[i], x[j], ct, st, &y0, &y1);
        const int64_t o = (int64_t)h * p.head_dim;
        if (F16)
            kh[o + i] = __float2half_rn(y0), kh[o + j] = __float2half_rn(y1);
        else
            kf[o + i] = y0, kf[o + j] = y1;
        return;
    }
    idx -= kp;
    if (idx < kc) {
        const int nr = p.head_dim - p.n_rot, h = idx / nr, d = p.n_rot + idx % nr;
        const int64_t o = (int64_t)h * p.head_dim + d;
        const float val = k[t * ks + o];
        if (F16)
            kh[o] = __float2half_rn(val);
        else
            kf[o] = val;
        return;
    }
    idx -= kc;
    const float val = v[t * vs + idx];
    if (F16)
        ((__half *)((uint8_t *)kv.v + base))[e0 + (size_t)idx] = __float2half_rn(val);
    else
        ((float *)((uint8_t *)kv.v + base))[e0 + (size_t)idx] = val;
}

/* rope(q) in place, rope(k), the write of k and v: rope_kv_kernel (one launch), or with
 * the decode fusion off the previous three (rope q, rope k in place, kv_write). */
extern "C" kiln_status kiln_cuda_rope_kv(const kiln_kctx *c, const kiln_rope_kv_args *a) {
    cudaStream_t s = KC_STREAM(c);
    const kiln_rope_args *ra = &a->rope;
    const kiln_kv_write_args *w = &a->kv;
    if (kiln_cuda_decode_fused() && ra->rows == w->t && ra->rows > 0 && ra->rows <= 65535 &&
        ra->n_rot > 0 && ra->n_rot <= ra->head_dim && !(ra->n_rot & 1) &&
        ra->head_dim == w->kv.head_dim &&
        (w->kv.dtype == KILN_DTYPE_F16 || w->kv.dtype == KILN_DTYPE_F32)) {
        const rope_p p = rope_params(ra, ra->n_head);
        const int64_t items = (int64_t)ra->n_head * (ra->n_rot / 2) +
                              (int64_t)w->kv.n_kv_head * (ra->n_rot / 2) +
                              (int64_t)w->kv.n_kv_head * (ra->head_dim - ra->n_rot) +
                              (int64_t)w->kv.n_kv_head * w->kv.head_dim;
        if (items <= INT32_MAX / 2) {
            const dim3 grid((unsigned)((items + 255) / 256), (unsigned)ra->rows);
            if (w->kv.dtype == KILN_DTYPE_F16)
                rope_kv_kernel<true><<<grid, 256, 0, s>>>(
                    ra->x, ra->x_stride, p, w->kv.n_kv_head, ra->freq_factors, w->kv, w->k, w->v,
                    w->k_stride, w->v_stride, w->tok_seq, ra->pos, w->blocks);
            else
                rope_kv_kernel<false><<<grid, 256, 0, s>>>(
                    ra->x, ra->x_stride, p, w->kv.n_kv_head, ra->freq_factors, w->kv, w->k, w->v,
                    w->k_stride, w->v_stride, w->tok_seq, ra->pos, w->blocks);
            return kc_launched();
        }
    }
    KILN_TRY(rope_launch(s, &a->rope, a->rope.x, a->rope.x_stride, a->rope.n_head));
    KILN_TRY(rope_launch(s, &a->rope, (float *)a->kv.k, a->kv.k_stride, a->kv.kv.n_kv_head));
    return kiln_cuda_kv_write(c, &a->kv);
}

/* ---- GLU, add ---- */

__global__ void glu_kernel(const float *__restrict__ g, const float *__restrict__ u, float *y,
                           int64_t n, int64_t gs, int64_t us, int64_t ys, int act) {
    kc_pdl_trigger(); /* the next kernel (a T16 gemv) may start: kc_pdl_wait */
    const int64_t t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = g[t * gs + i];
    float v;
    if (act == KILN_GLU_SWIGLU) {
        v = x / (1.0f + expf(-x));
    } else if (act == KILN_GLU_GEGLU_TANH) {
        const float k0 = 0.79788456080286535587989211986876f;
        v = 0.5f * x * (1.0f + tanhf(k0 * x * (1.0f + 0.044715f * x * x)));
    } else {
        v = 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
    }
    y[t * ys + i] = v * u[t * us + i];
}

extern "C" kiln_status kiln_cuda_glu(const kiln_kctx *c, const kiln_glu_args *a) {
    if (a->t <= 0 || a->n <= 0) return KILN_OK;
    if (a->act != KILN_GLU_SWIGLU && a->act != KILN_GLU_GEGLU_TANH && a->act != KILN_GLU_GEGLU_ERF)
        return KILN_ERR_INVALID_ARG;
    if (a->t > 65535) return KILN_ERR_INVALID_ARG;
    dim3 grid((unsigned)((a->n + 255) / 256), (unsigned)a->t);
    glu_kernel<<<grid, 256, 0, KC_STREAM(c)>>>(a->gate, a->up, a->y, a->n, a->gate_stride,
                                               a->up_stride, a->y_stride, (int)a->act);
    return kc_launched();
}

__global__ void add_kernel(const float *__restrict__ a, const float *__restrict__ b, float *y,
                           int64_t n, int64_t as, int64_t bs, int64_t ys) {
    kc_pdl_trigger(); /* the next kernel (a T16 gemv) may start: kc_pdl_wait */
    const int64_t t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    y[t * ys + i] = a[t * as + i] + b[t * bs + i];
}

extern "C" kiln_status kiln_cuda_add(const kiln_kctx *c, const kiln_add_args *a) {
    if (a->t <= 0 || a->n <= 0) return KILN_OK;
    if (a->t > 65535) return KILN_ERR_INVALID_ARG;
    dim3 grid((unsigned)((a->n + 255) / 256), (unsigned)a->t);
    add_kernel<<<grid, 256, 0, KC_STREAM(c)>>>(a->a, a->b, a->y, a->n, a->a_stride, a->b_stride,
                                               a->y_stride);
    return kc_launched();
}
