/*
 * prov_onednn.c — the "onednn" provider: prefill matmul through oneDNN's C API (dnnl.h,
 * Debian libdnnl-dev 2.6, OpenMP runtime). docs/KERNELS.md has the rule, docs/CPU.md
 * the measurements.
 *
 * Three kernels, each y = x W^T (+ bias) with f32 activations in and f32 out:
 *  - onednn.f32.matmul: f32 weights in place; f16 / bf16 weights widened exactly to f32,
 *    a chunk of rows at a time into the thread's workspace. Exact inputs, f32 sums:
 *    the same accuracy class as the cpu kernels.
 *  - onednn.bf16.matmul: activations and weights rounded to bf16 (round to nearest
 *    even), f32 accumulation and output. Approximate (2^-9 relative per input), so it
 *    is opt-in (priority 40, like cpu.avx512bf16.matmul.f16): a policy must prefer it.
 *  - onednn.s8.matmul.q8_0: int8 GEMM. Activations are quantized per token (one
 *    symmetric s8 scale per row of x), q8_0 weights are re-quantized once per tensor to
 *    s8 with one scale per output row (q8_0's per-32 block scales cannot be expressed
 *    in oneDNN 2.6, whose scales are per tensor or per output channel). Both steps lose
 *    precision (docs/CPU.md gives the measured error), so it is opt-in too (priority 30).
 *
 * Threads: kiln's pool does the threading. Output rows are cut into chunks (about four
 * per thread, 64 to MAX_CHUNK rows, a multiple of 64: chunk_rows())
 * handed out dynamically (kiln_pool_for); each pool thread runs a single-threaded oneDNN
 * primitive on its chunk (omp_set_num_threads(1) on that thread before every call), so
 * oneDNN never starts an OpenMP team and kiln never has more busy threads than its pool.
 *
 * Primitives: created once per (kind, t, rows, k, strides) on the calling thread and
 * kept in this file's cache for the life of the process (creation costs 0.5-30 ms; the
 * shapes of a model are few: a prefill step's t, the chunk and tail row counts, per
 * distinct k). When the cache is full, a call creates and destroys its own primitives.
 * Scratchpads are user-managed (dnnl_scratchpad_mode_user) and live in the workspace.
 *
 * Weight cache (s8 only): the re-quantized s8 rows and scales of a q8_0 tensor, keyed by
 * (address, row bytes, n, k) and a fingerprint of sampled bytes of the tensor, built on
 * first use; bounded by $KILN_ONEDNN_CACHE_MB (default 2048). Over the bound a call
 * re-quantizes each chunk into its workspace instead (correct, slower).
 *
 * onednn_state is this file's singleton: engine, resolved omp_set_num_threads, both
 * caches (under one mutex; entries are never freed while the process runs, so pointers
 * handed out stay valid).
 *
 * Built only with KILN_HAVE_ONEDNN (CMake option KILN_ONEDNN, library found) and the
 * header present; otherwise the provider has no kernels and says why.
 */
#include "base/cpu.h"
#include "base/hash.h"
#include "base/mem.h"
#include "format/dtype.h"
#include "kernels/registry.h"
#include "kernels/select.h"

#include <stdio.h>

#if defined(KILN_HAVE_ONEDNN) && defined(__has_include)
#if __has_include(<oneapi/dnnl/dnnl.h>)
#define ONEDNN_BUILT 1
#endif
#endif
#ifndef ONEDNN_BUILT
#define ONEDNN_BUILT 0
#endif

#if ONEDNN_BUILT

#include <oneapi/dnnl/dnnl.h>

#include <dlfcn.h>
#include <immintrin.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define ISA_AVX2 (KILN_ISA_AVX2 | KILN_ISA_FMA | KILN_ISA_F16C)
/* s8: oneDNN's u8 x s8 kernels without VNNI sum pairs of products in saturating 16-bit
 * lanes (vpmaddubsw), so on a plain AVX2 CPU the result is not the integer sum
 * (test_onednn caught y = -1.80 vs -1.50 on an AVX2-only Zen 3): require AVX-512 VNNI. */
#define ISA_S8 (ISA_AVX2 | KILN_ISA_AVX512VNNI)

enum { KIND_F32 = 0, KIND_BF16 = 1, KIND_S8 = 2 };
enum { MAX_CHUNK = 512, PRIM_CACHE = 256, WCACHE = 1024 };

/* Rows per chunk: about 4 chunks per thread (dynamic hand-out keeps both cores busy when
 * one is slowed by another process), a multiple of 64, 64..MAX_CHUNK. A oneDNN call on
 * 64 rows runs at the same rate per row as one on 1024 (measured: docs/CPU.md). */
static int64_t chunk_rows(int64_t n, int nth) {
    int64_t c = (n + 4 * nth - 1) / (4 * nth);
    c = (c + 63) / 64 * 64;
    return c < 64 ? 64 : c > MAX_CHUNK ? MAX_CHUNK : c;
}

typedef struct prim_key {
    int64_t kind, m, n, k, lda, ldb, ldc;
} prim_key;

typedef struct prim {
    prim_key key;
    dnnl_primitive_t p;
    dnnl_memory_desc_t src, wei, dst, scratch;
    size_t scratch_bytes;
} prim;

typedef struct wentry {
    const void *w;
    size_t row_bytes;
    int64_t n, k;
    uint64_t fingerprint;
    int8_t *q;    /* [n][k] */
    float *scale; /* [n] */
} wentry;

static struct {
    pthread_once_t once;
    bool ok;
    char why[200];
    dnnl_engine_t engine;
    void (*set_threads)(int); /* omp_set_num_threads from the runtime oneDNN uses */
    pthread_mutex_t mu;
    prim prims[PRIM_CACHE];
    int n_prims;
    wentry w[WCACHE];
    int n_w;
    size_t w_bytes, w_cap;
} onednn_state = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER};

static void onednn_open(void) {
    const dnnl_version_t *v = dnnl_version();
    if (!v || v->cpu_runtime != DNNL_RUNTIME_OMP) {
        /* the threading model below (one OpenMP thread per pool thread) needs OMP */
        snprintf(onednn_state.why, sizeof onednn_state.why,
                 "oneDNN %d.%d: CPU runtime %u is not OpenMP", v ? v->major : 0, v ? v->minor : 0,
                 v ? v->cpu_runtime : 0);
        return;
    }
    void *sym = dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    if (!sym) {
        snprintf(onednn_state.why, sizeof onednn_state.why,
                 "omp_set_num_threads not found (oneDNN's OpenMP runtime not loaded)");
        return;
    }
    memcpy(&onednn_state.set_threads, &sym, sizeof sym);
    if (dnnl_engine_create(&onednn_state.engine, dnnl_cpu, 0) != dnnl_success) {
        snprintf(onednn_state.why, sizeof onednn_state.why, "dnnl_engine_create(cpu) failed");
        return;
    }
    const char *cap = getenv("KILN_ONEDNN_CACHE_MB");
    double mb = cap && *cap ? strtod(cap, NULL) : 2048;
    onednn_state.w_cap = mb > 0 && mb < 1e9 ? (size_t)(mb * 1048576.0) : 0;
    onednn_state.ok = true;
}

static bool onednn_probe(char *why, size_t why_size) {
    pthread_once(&onednn_state.once, onednn_open);
    if (onednn_state.ok) return true;
    snprintf(why, why_size, "%s", onednn_state.why);
    return false;
}

static kiln_status dnnl_status_to_kiln(dnnl_status_t s) {
    switch (s) {
    case dnnl_success:
        return KILN_OK;
    case dnnl_out_of_memory:
        return KILN_ERR_NOMEM;
    case dnnl_unimplemented:
        return KILN_ERR_UNSUPPORTED;
    case dnnl_invalid_arguments:
        return KILN_ERR_INVALID_ARG;
    default:
        return KILN_ERR_INTERNAL;
    }
}

/* ---- primitives ---- */

static void prim_destroy(prim *p) {
    if (p && p->p) dnnl_primitive_destroy(p->p);
    if (p) p->p = NULL;
}

static kiln_status prim_create(const prim_key *key, prim *out) {
    static const dnnl_data_type_t src_dt[] = {dnnl_f32, dnnl_bf16, dnnl_s8};
    memset(out, 0, sizeof *out);
    out->key = *key;
    dnnl_dims_t sd = {key->m, key->k}, ss = {key->lda, 1};
    dnnl_dims_t wd = {key->k, key->n}, ws = {1, key->ldb}; /* W[n][k] seen as B[k][n] */
    dnnl_dims_t dd = {key->m, key->n}, ds = {key->ldc, 1};
    dnnl_data_type_t dt = src_dt[key->kind];
    dnnl_status_t s = dnnl_memory_desc_init_by_strides(&out->src, 2, sd, dt, ss);
    if (!s) s = dnnl_memory_desc_init_by_strides(&out->wei, 2, wd, dt, ws);
    if (!s) s = dnnl_memory_desc_init_by_strides(&out->dst, 2, dd, dnnl_f32, ds);
    dnnl_matmul_desc_t md;
    if (!s) s = dnnl_matmul_desc_init(&md, &out->src, &out->wei, NULL, &out->dst);
    dnnl_primitive_attr_t attr = NULL;
    if (!s) s = dnnl_primitive_attr_create(&attr);
    if (!s) s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    dnnl_primitive_desc_t pd = NULL;
    /* the primitive's thread count is fixed when it is created: one */
    onednn_state.set_threads(1);
    if (!s) s = dnnl_primitive_desc_create(&pd, &md, attr, onednn_state.engine, NULL);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!s) {
        const dnnl_memory_desc_t *sp =
            dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        if (sp) out->scratch = *sp;
        out->scratch_bytes = sp ? dnnl_memory_desc_get_size(sp) : 0;
        s = dnnl_primitive_create(&out->p, pd);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    return dnnl_status_to_kiln(s);
}

/* The cached primitive for key, or a new one in *own (the caller destroys it) when the
 * cache is full. */
static kiln_status prim_get(const prim_key *key, prim *own, const prim **out) {
    pthread_mutex_lock(&onednn_state.mu);
    for (int i = 0; i < onednn_state.n_prims; i++)
        if (memcmp(&onednn_state.prims[i].key, key, sizeof *key) == 0) {
            *out = &onednn_state.prims[i];
            pthread_mutex_unlock(&onednn_state.mu);
            return KILN_OK;
        }
    pthread_mutex_unlock(&onednn_state.mu);
    /* create outside the lock (milliseconds); a racing creator of the same key loses */
    kiln_status st = prim_create(key, own);
    if (st) return st;
    pthread_mutex_lock(&onednn_state.mu);
    for (int i = 0; i < onednn_state.n_prims; i++)
        if (memcmp(&onednn_state.prims[i].key, key, sizeof *key) == 0) {
            *out = &onednn_state.prims[i];
            pthread_mutex_unlock(&onednn_state.mu);
            prim_destroy(own);
            return KILN_OK;
        }
    if (onednn_state.n_prims < PRIM_CACHE) {
        onednn_state.prims[onednn_state.n_prims] = *own;
        *out = &onednn_state.prims[onednn_state.n_prims++];
        own->p = NULL;
    } else {
        *out = own;
    }
    pthread_mutex_unlock(&onednn_state.mu);
    return KILN_OK;
}

static kiln_status prim_run(const prim *p, const void *src, const void *wei, float *dst,
                            void *scratch) {
    onednn_state.set_threads(1);
    dnnl_engine_t eng = onednn_state.engine;
    dnnl_stream_t stream = NULL;
    dnnl_memory_t m[4] = {0};
    dnnl_status_t s = dnnl_stream_create(&stream, eng, dnnl_stream_default_flags);
    if (!s) s = dnnl_memory_create(&m[0], &p->src, eng, (void *)src);
    if (!s) s = dnnl_memory_create(&m[1], &p->wei, eng, (void *)wei);
    if (!s) s = dnnl_memory_create(&m[2], &p->dst, eng, dst);
    int nargs = 3;
    if (!s && p->scratch_bytes) {
        s = dnnl_memory_create(&m[3], &p->scratch, eng, scratch);
        nargs = 4;
    }
    if (!s) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, m[0]},
                                   {DNNL_ARG_WEIGHTS, m[1]},
                                   {DNNL_ARG_DST, m[2]},
                                   {DNNL_ARG_SCRATCHPAD, m[3]}};
        s = dnnl_primitive_execute(p->p, stream, nargs, args);
        if (!s) s = dnnl_stream_wait(stream);
    }
    for (int i = 0; i < 4; i++)
        if (m[i]) dnnl_memory_destroy(m[i]);
    if (stream) dnnl_stream_destroy(stream);
    return dnnl_status_to_kiln(s);
}

/* ---- conversions (the kernels' specs require the ISA each one uses) ---- */

__attribute__((target("avx2,fma,f16c"))) static void f16_to_f32(const uint16_t *s, float *d,
                                                                int64_t k) {
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < k; i++) d[i] = kiln_fp16_to_f32(s[i]);
}

static void bf16_to_f32(const uint16_t *s, float *d, int64_t k) {
    for (int64_t i = 0; i < k; i++) d[i] = kiln_bf16_to_f32(s[i]);
}

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c")))

BF16_TARGET static void f32_to_bf16(const float *s, uint16_t *d, int64_t k) {
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(s + i));
        _mm256_storeu_si256((__m256i *)(d + i), (__m256i)v);
    }
    for (; i < k; i++) d[i] = kiln_f32_to_bf16(s[i]);
}

BF16_TARGET static void f16_to_bf16(const uint16_t *s, uint16_t *d, int64_t k) {
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i)));
        _mm256_storeu_si256((__m256i *)(d + i), (__m256i)_mm512_cvtneps_pbh(f));
    }
    for (; i < k; i++) d[i] = kiln_f32_to_bf16(kiln_fp16_to_f32(s[i]));
}

/* Per-token symmetric s8: q = round(x / s), s = max|x| / 127. Returns s. */
__attribute__((target("avx2,fma"))) static float quant_s8(const float *x, int8_t *q, int64_t k) {
    __m256 vmax = _mm256_setzero_ps();
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        vmax = _mm256_max_ps(vmax, _mm256_and_ps(abs, _mm256_loadu_ps(x + i)));
    float m[8], amax = 0;
    _mm256_storeu_ps(m, vmax);
    for (int j = 0; j < 8; j++) amax = m[j] > amax ? m[j] : amax;
    for (; i < k; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float s = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
    const __m256 vinv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= k; i += 8) {
        __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
        __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storel_epi64((__m128i *)(q + i), _mm_packs_epi16(w, w));
    }
    for (; i < k; i++) q[i] = (int8_t)lrintf(x[i] * inv);
    return s;
}

/* One q8_0 row (k / 32 blocks of {f16 d, int8 q[32]}) -> s8 with one scale: the scale is
 * max |d_b q| / 127, each value re-rounded to it. Returns the scale. */
static float requant_q8_0(const uint8_t *row, int8_t *q, int64_t k) {
    int64_t nb = k / 32;
    float amax = 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * 34;
        uint16_t dh;
        memcpy(&dh, blk, 2);
        float d = fabsf(kiln_fp16_to_f32(dh));
        int m = 0;
        for (int i = 0; i < 32; i++) {
            int v = (int8_t)blk[2 + i];
            v = v < 0 ? -v : v;
            m = v > m ? v : m;
        }
        if (d * (float)m > amax) amax = d * (float)m;
    }
    float s = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * 34;
        uint16_t dh;
        memcpy(&dh, blk, 2);
        float f = kiln_fp16_to_f32(dh) * inv;
        for (int i = 0; i < 32; i++) {
            long v = lrintf((float)(int8_t)blk[2 + i] * f);
            q[b * 32 + i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
    }
    return s;
}

/* ---- the weight cache (s8) ---- */

static uint64_t fingerprint(const void *w, size_t row_bytes, int64_t n) {
    /* 64 bytes of 64 rows spread over the tensor, first and last included */
    uint8_t buf[64 * 64];
    size_t take = row_bytes < 64 ? row_bytes : 64, used = 0;
    for (int i = 0; i < 64; i++) {
        int64_t r = n > 1 ? (int64_t)i * (n - 1) / 63 : 0;
        memcpy(buf + used, (const uint8_t *)w + (size_t)r * row_bytes, take);
        used += take;
    }
    return kiln_hash64(buf, used, (uint64_t)n * 1315423911u + row_bytes);
}

typedef struct rq_job {
    const uint8_t *w;
    size_t row_bytes;
    int64_t k;
    int8_t *q;
    float *scale;
} rq_job;

static void rq_rows(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    rq_job *j = ctx;
    for (int64_t r = b; r < e; r++)
        j->scale[r] = requant_q8_0(j->w + (size_t)r * j->row_bytes, j->q + r * j->k, j->k);
}

/* The cached s8 form of a q8_0 tensor, built on first use; NULL when it does not fit the
 * cache (the caller re-quantizes per chunk). */
static const wentry *wcache_get(const kiln_kctx *c, const kiln_matmul_args *a) {
    uint64_t fp = fingerprint(a->w, a->w_row_bytes, a->n);
    pthread_mutex_lock(&onednn_state.mu);
    for (int i = 0; i < onednn_state.n_w; i++) {
        const wentry *e = &onednn_state.w[i];
        if (e->w == a->w && e->row_bytes == a->w_row_bytes && e->n == a->n && e->k == a->k &&
            e->fingerprint == fp) {
            pthread_mutex_unlock(&onednn_state.mu);
            return e;
        }
    }
    size_t bytes = (size_t)a->n * (size_t)a->k + (size_t)a->n * sizeof(float);
    bool room = onednn_state.n_w < WCACHE && onednn_state.w_bytes + bytes <= onednn_state.w_cap;
    if (room) onednn_state.w_bytes += bytes; /* reserved while converting */
    pthread_mutex_unlock(&onednn_state.mu);
    if (!room) return NULL;
    wentry e = {.w = a->w, .row_bytes = a->w_row_bytes, .n = a->n, .k = a->k, .fingerprint = fp};
    e.q = kiln_alloc_aligned((size_t)a->n * (size_t)a->k);
    e.scale = kiln_alloc_aligned((size_t)a->n * sizeof(float));
    const wentry *out = NULL;
    if (e.q && e.scale) {
        rq_job j = {.w = a->w, .row_bytes = a->w_row_bytes, .k = a->k, .q = e.q, .scale = e.scale};
        kiln_pool_for(c ? c->pool : NULL, a->n, 16, rq_rows, &j);
    }
    bool mine = false;
    pthread_mutex_lock(&onednn_state.mu);
    for (int i = 0; i < onednn_state.n_w && !out; i++) { /* a racing caller was first */
        const wentry *o = &onednn_state.w[i];
        if (o->w == e.w && o->row_bytes == e.row_bytes && o->n == e.n && o->k == e.k &&
            o->fingerprint == fp)
            out = o;
    }
    if (!out && e.q && e.scale && onednn_state.n_w < WCACHE) {
        onednn_state.w[onednn_state.n_w] = e;
        out = &onednn_state.w[onednn_state.n_w++];
        mine = true;
    } else {
        onednn_state.w_bytes -= bytes;
    }
    pthread_mutex_unlock(&onednn_state.mu);
    if (!mine) {
        kiln_free_aligned(e.q);
        kiln_free_aligned(e.scale);
    }
    return out;
}

/* ---- the kernels ---- */

static size_t align64(size_t v) {
    return (v + 63) & ~(size_t)63;
}

/* Bytes of one chunk of converted weights for a kind and weight dtype (0: used in place). */
static size_t chunk_elt(int kind, uint32_t w_dtype) {
    if (kind == KIND_F32) return w_dtype == KILN_DTYPE_F32 ? 0 : 4;
    if (kind == KIND_BF16) return w_dtype == KILN_DTYPE_BF16 ? 0 : 2;
    return 1;
}

/* Converted activations: bf16 rows, or s8 rows + scales. */
static size_t act_bytes(int kind, int64_t t, int64_t k) {
    if (kind == KIND_F32) return 0;
    if (kind == KIND_BF16) return align64((size_t)t * (size_t)k * 2);
    return align64((size_t)t * (size_t)k) + align64((size_t)t * sizeof(float));
}

typedef struct mm_job {
    const kiln_matmul_args *a;
    int kind;
    const prim *full, *tail;
    int64_t chunk;        /* rows per chunk (full's n) */
    const void *src;      /* activations as the primitive reads them */
    const float *x_scale; /* s8: per token */
    const wentry *wc;     /* s8: cached weights, or NULL */
    uint8_t *thr;         /* per thread: converted chunk, then the scratchpad */
    size_t thr_stride, conv_bytes;
    _Atomic int st;
} mm_job;

typedef struct act_job {
    const kiln_matmul_args *a;
    int kind;
    void *dst;
    float *scale;
} act_job;

static void act_rows(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    act_job *j = ctx;
    const kiln_matmul_args *a = j->a;
    for (int64_t t = b; t < e; t++) {
        const float *x = a->x + t * a->x_stride;
        if (j->kind == KIND_BF16)
            f32_to_bf16(x, (uint16_t *)j->dst + t * a->k, a->k);
        else
            j->scale[t] = quant_s8(x, (int8_t *)j->dst + t * a->k, a->k);
    }
}

static kiln_status chunk_run(mm_job *j, int64_t r0, int64_t rows, uint8_t *thr) {
    const kiln_matmul_args *a = j->a;
    const prim *p = rows == j->chunk ? j->full : j->tail;
    const uint8_t *w = (const uint8_t *)a->w + (size_t)r0 * a->w_row_bytes;
    const void *wei = w;
    const float *wscale = NULL;
    if (j->kind == KIND_S8 && j->wc) {
        wei = j->wc->q + r0 * a->k;
        wscale = j->wc->scale + r0;
    } else if (j->conv_bytes) {
        /* s8: the chunk's row scales follow its rows */
        float *sc = (float *)(thr + align64((size_t)j->chunk * (size_t)a->k));
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *src = w + (size_t)r * a->w_row_bytes;
            if (j->kind == KIND_F32 && a->w_dtype == KILN_DTYPE_F16)
                f16_to_f32((const uint16_t *)src, (float *)thr + r * a->k, a->k);
            else if (j->kind == KIND_F32)
                bf16_to_f32((const uint16_t *)src, (float *)thr + r * a->k, a->k);
            else if (j->kind == KIND_BF16 && a->w_dtype == KILN_DTYPE_F16)
                f16_to_bf16((const uint16_t *)src, (uint16_t *)thr + r * a->k, a->k);
            else if (j->kind == KIND_BF16)
                f32_to_bf16((const float *)src, (uint16_t *)thr + r * a->k, a->k);
            else
                sc[r] = requant_q8_0(src, (int8_t *)thr + r * a->k, a->k);
        }
        wei = thr;
        wscale = sc;
    }
    float *y = a->y + r0;
    KILN_TRY(prim_run(p, j->src, wei, y, thr + j->conv_bytes));
    if (j->kind == KIND_S8)
        for (int64_t t = 0; t < a->t; t++) {
            float *yt = y + t * a->y_stride, xs = j->x_scale[t];
            for (int64_t i = 0; i < rows; i++) yt[i] *= xs * wscale[i];
        }
    if (a->bias)
        for (int64_t t = 0; t < a->t; t++) {
            float *yt = y + t * a->y_stride;
            for (int64_t i = 0; i < rows; i++) yt[i] += a->bias[r0 + i];
        }
    return KILN_OK;
}

static void chunk_range(void *ctx, int64_t b, int64_t e, int ith) {
    mm_job *j = ctx;
    uint8_t *thr = j->thr + (size_t)ith * j->thr_stride;
    for (int64_t c = b; c < e && !atomic_load(&j->st); c++) {
        int64_t r0 = c * j->chunk, rows = j->a->n - r0 < j->chunk ? j->a->n - r0 : j->chunk;
        kiln_status st = chunk_run(j, r0, rows, thr);
        if (st) atomic_store(&j->st, (int)st);
    }
}

static bool fits_dim(int64_t v) {
    return v >= 0 && v <= INT_MAX;
}

static kiln_status onednn_matmul(const kiln_kctx *c, const kiln_matmul_args *a, int kind) {
    if (!onednn_state.ok) return KILN_ERR_STATE;
    /* the conversions use AVX2 / F16C (the specs require them; this guards direct calls) */
    if ((kiln_cpu_info()->isa & ISA_AVX2) != ISA_AVX2) return KILN_ERR_UNSUPPORTED;
    if (a->w_layout != KILN_WLAYOUT_PLAIN) return KILN_ERR_UNSUPPORTED;
    if (a->t == 0 || a->n == 0) return KILN_OK;
    if (!fits_dim(a->n) || !fits_dim(a->k) || !fits_dim(a->t) || !fits_dim(a->x_stride) ||
        !fits_dim(a->y_stride) || a->k == 0)
        return KILN_ERR_RANGE;
    uint32_t dt = a->w_dtype;
    bool ok = kind == KIND_S8
                  ? dt == KILN_DTYPE_Q8_0 && a->k % 32 == 0
                  : dt == KILN_DTYPE_F32 || dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_BF16;
    if (!ok) return KILN_ERR_TYPE;
    if (kind == KIND_S8 && (kiln_cpu_info()->isa & ISA_S8) != ISA_S8) return KILN_ERR_UNSUPPORTED;
    int nth = kiln_pool_size(c ? c->pool : NULL);
    const wentry *wc = kind == KIND_S8 ? wcache_get(c, a) : NULL;

    /* the weight rows as the primitive sees them: converted per chunk (row stride k),
     * cached (s8, stride k), or in place (stride from the row bytes) */
    size_t elt = wc ? 0 : chunk_elt(kind, dt);
    int64_t ldb = a->k;
    if (!elt && kind != KIND_S8) {
        size_t in_elt = dt == KILN_DTYPE_F32 ? 4 : 2;
        if (a->w_row_bytes % in_elt || !fits_dim((int64_t)(a->w_row_bytes / in_elt)))
            return KILN_ERR_RANGE;
        ldb = (int64_t)(a->w_row_bytes / in_elt);
    }
    int64_t lda = kind == KIND_F32 ? a->x_stride : a->k;
    /* no size below can overflow: every factor is < 2^31 (checked above), chunk <= 512 */
    int64_t chunk = chunk_rows(a->n, nth), tail = a->n % chunk;
    prim_key kf = {kind, a->t, chunk, a->k, lda, ldb, a->y_stride}, kt = kf;
    kt.n = tail;
    prim own_f = {0}, own_t = {0};
    const prim *pf = NULL, *pt = NULL;
    kiln_status st = KILN_OK;
    if (a->n >= chunk) st = prim_get(&kf, &own_f, &pf);
    if (!st && tail) st = prim_get(&kt, &own_t, &pt);

    size_t conv = elt ? align64((size_t)chunk * (size_t)a->k * elt) +
                            (kind == KIND_S8 ? align64((size_t)chunk * sizeof(float)) : 0)
                      : 0;
    size_t sp = 0;
    if (pf && pf->scratch_bytes > sp) sp = pf->scratch_bytes;
    if (pt && pt->scratch_bytes > sp) sp = pt->scratch_bytes;
    size_t thr_stride = conv + align64(sp), abytes = act_bytes(kind, a->t, a->k);
    size_t need = abytes + (size_t)nth * thr_stride + 64;
    uint8_t *ws = NULL, *own = NULL;
    if (!st) {
        if (c && c->scratch && c->scratch_size >= need) {
            ws = c->scratch;
        } else if (!(ws = own = kiln_alloc_aligned(need))) {
            st = KILN_ERR_NOMEM;
        }
    }
    if (!st) {
        ws = (uint8_t *)align64((size_t)(uintptr_t)ws);
        mm_job j = {.a = a,
                    .kind = kind,
                    .full = pf,
                    .chunk = chunk,
                    .tail = pt,
                    .src = a->x,
                    .wc = wc,
                    .thr = ws + abytes,
                    .thr_stride = thr_stride,
                    .conv_bytes = conv};
        atomic_init(&j.st, 0);
        if (kind != KIND_F32) {
            act_job aj = {.a = a, .kind = kind, .dst = ws};
            if (kind == KIND_S8) aj.scale = (float *)(ws + align64((size_t)a->t * (size_t)a->k));
            kiln_pool_for(c ? c->pool : NULL, a->t, 4, act_rows, &aj);
            j.src = ws;
            j.x_scale = aj.scale;
        }
        kiln_pool_for(c ? c->pool : NULL, (a->n + chunk - 1) / chunk, 1, chunk_range, &j);
        st = (kiln_status)atomic_load(&j.st);
    }
    kiln_free_aligned(own);
    prim_destroy(&own_f);
    prim_destroy(&own_t);
    return st;
}

static kiln_status onednn_f32(const kiln_kctx *c, const kiln_matmul_args *a) {
    return onednn_matmul(c, a, KIND_F32);
}
static kiln_status onednn_bf16(const kiln_kctx *c, const kiln_matmul_args *a) {
    if ((kiln_cpu_info()->isa & KILN_ISA_AVX512BF16) == 0) return KILN_ERR_UNSUPPORTED;
    return onednn_matmul(c, a, KIND_BF16);
}
static kiln_status onednn_s8(const kiln_kctx *c, const kiln_matmul_args *a) {
    return onednn_matmul(c, a, KIND_S8);
}

/* Workspace for the bucket's largest token count (capped: tune measures >512 at 1024),
 * one thread per online CPU (the pool kiln makes by default), and an upper estimate of
 * oneDNN's scratchpad (its copies of A and B panels: 100-260 KiB measured for k = 2048,
 * t = 128, against (MAX_CHUNK + 64) k 4 bytes here). The
 * kernel checks the real need and allocates its own when the scratch is smaller. */
static size_t ws_for(const kiln_sel_ctx *c, int kind) {
    int64_t t = c->tokens_max < 1 ? 1 : c->tokens_max > 4096 ? 4096 : c->tokens_max;
    int64_t k = c->k > 0 ? c->k : 1;
    if (k > ((int64_t)1 << 30)) return SIZE_MAX;
    int nth = kiln_cpu_info()->logical_cores;
    if (nth < 1) nth = 1;
    size_t elt = chunk_elt(kind, c->w_dtype);
    size_t conv =
        elt ? align64((size_t)MAX_CHUNK * (size_t)k * elt) + align64(MAX_CHUNK * sizeof(float)) : 0;
    size_t sp = align64((size_t)(MAX_CHUNK + 64) * (size_t)k * 4 + (64u << 10));
    return act_bytes(kind, t, k) + (size_t)nth * (conv + sp) + 64;
}
static size_t ws_f32(const kiln_sel_ctx *c) {
    return ws_for(c, KIND_F32);
}
static size_t ws_bf16(const kiln_sel_ctx *c) {
    return ws_for(c, KIND_BF16);
}
static size_t ws_s8(const kiln_sel_ctx *c) {
    return ws_for(c, KIND_S8);
}

#define ISA_BF16                                                                                   \
    (ISA_AVX2 | KILN_ISA_AVX512F | KILN_ISA_AVX512BW | KILN_ISA_AVX512VL | KILN_ISA_AVX512BF16)
/* Prefill only: below this many tokens per call the score drops by 40 (select.h). */
#define PREFILL_TOKENS 64

static const kiln_kernel_spec onednn_specs[] = {
    {.id = "onednn.f32.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "onednn",
     .platform = KILN_PLATFORM_HOST,
     .isa = ISA_AVX2,
     .w_dtypes = KILN_DT_FLOATS,
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .features = KILN_KFEAT_BIAS,
     .props = KILN_KPROP_DETERMINISTIC,
     .good_tokens = PREFILL_TOKENS,
     .workspace = ws_f32,
     /* 79: below cpu.avx2.matmul (80), whose float prefill beat it end to end once its
      * micro-kernel stopped stepping 6 pointers per element (session 9, docs/PERF.md);
      * on AVX-512 CPUs cpu.avx512.matmul (90) was ahead already */
     .priority = 79,
     .fn.matmul = onednn_f32,
     .summary = "oneDNN f32 matmul (f16/bf16 weights widened exactly, per chunk of rows)"},
    {.id = "onednn.bf16.matmul",
     .op = KILN_KOP_MATMUL,
     .provider = "onednn",
     .platform = KILN_PLATFORM_HOST,
     .isa = ISA_BF16,
     .w_dtypes = KILN_DT_FLOATS,
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .features = KILN_KFEAT_BIAS,
     .props = KILN_KPROP_DETERMINISTIC,
     .good_tokens = PREFILL_TOKENS,
     .workspace = ws_bf16,
     .priority = 40,
     .fn.matmul = onednn_bf16,
     .summary = "oneDNN bf16 x bf16 -> f32 matmul (inputs rounded to bf16: opt-in)"},
    {.id = "onednn.s8.matmul.q8_0",
     .op = KILN_KOP_MATMUL,
     .provider = "onednn",
     .platform = KILN_PLATFORM_HOST,
     .isa = ISA_S8,
     .w_dtypes = KILN_DT(KILN_DTYPE_Q8_0),
     .act_dtypes = KILN_DT(KILN_DTYPE_F32),
     .k_multiple = 32,
     .features = KILN_KFEAT_BIAS,
     .props = KILN_KPROP_DETERMINISTIC,
     .good_tokens = PREFILL_TOKENS,
     .workspace = ws_s8,
     .priority = 30,
     .fn.matmul = onednn_s8,
     .summary = "oneDNN s8 matmul: per-token s8 activations, q8_0 re-quantized per row "
                "(approximate: opt-in)"},
};

const kiln_provider kiln_provider_onednn = {
    .name = "onednn",
    .summary = "oneDNN matmul (libdnnl, OpenMP runtime, one OpenMP thread per pool thread)",
    .specs = onednn_specs,
    .n_specs = (int)(sizeof onednn_specs / sizeof onednn_specs[0]),
    .probe = onednn_probe,
};

#else /* !ONEDNN_BUILT */

static bool onednn_probe(char *why, size_t why_size) {
    snprintf(why, why_size, "built without oneDNN (KILN_ONEDNN=OFF or dnnl.h not found)");
    return false;
}

const kiln_provider kiln_provider_onednn = {
    .name = "onednn",
    .summary = "oneDNN matmul (not built)",
    .specs = NULL,
    .n_specs = 0,
    .probe = onednn_probe,
};

#endif
