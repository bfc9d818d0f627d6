/*
 * bench_cuda.c — CUDA kernel benchmarks on the GPU machine (not a test; numbers go to
 * docs/PERF.md with the command and commit).
 *
 *   bench_cuda [--dtypes f16,q8_0,q4_0,q4_k,q4_k_m] [--layers 32] [--reps 20] [--t16-only]
 *              [--gemm]
 *
 * 1. Device bandwidth: a device-to-device cudaMemcpy of 2 x 1 GiB (bytes read + written)
 *    and a read-only streaming kernel over 4 GiB (cudaMemcpy cannot show read bandwidth);
 *    the decode bound below uses the read kernel's figure.
 * 2. Decode matmuls of a Llama-3-8B-shaped model (dim 4096, ffn 14336, 8 KV heads of
 *    128, vocab 128256; `--layers` layers of q, k, v, o, gate, up, down + the LM head),
 *    weights of each dtype resident on the device (random bytes; Q4_K_M-like: q4_K with
 *    q6_K for v / down / LM head as llama.cpp's Q4_K_M mix), run through the kernels kiln
 *    binds for them (cuda.gemv.matmul for t <= 8, cuda.cublas.matmul above): time per
 *    step for t = 1, 4, 16, 64 tokens, the bytes read per token pass, and the share of
 *    the bound (bound = read bandwidth / weight bytes). Matmuls only: attention, norms
 *    and the rest of a step are not in these numbers (docs/CUDA.md says what ran end to
 *    end).
 * 3. Prefill matmuls: t = 512 through the cuBLAS path, tokens/s of the matmuls.
 * --gemm (alone): the T16 GEMM (gemm_t16.cu, version 1) and the int8 GEMM (gemm_i8.cu) at
 *    16-512 tokens, the engine's calls of a step in one graph, and the cuBLAS path at 128
 *    and 512.
 *    (The cuBLAS path on T16 weights expects a T16 weight's bytes: random bytes here.)
 * Timing: CUDA events around `--reps` repetitions after 3 warm-ups; median of 5 such
 * groups. The table is printed last.
 */
#include "format/dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KILN_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/spec.h"

#include <cuda_runtime_api.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* random bytes with sane f16 scales would need a kernel per type; the timing does not
 * depend on values, but never time zeros: fill from a host xorshift buffer */
static void fill_random(void *d, size_t n) {
    const size_t chunk = (size_t)64 << 20;
    uint8_t *h = malloc(chunk);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < chunk; i += 8) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        /* keep f16 halves finite: clear the exponent's top bit of every 16-bit word */
        uint64_t v = s & 0xbfffbfffbfffbfffull;
        memcpy(h + i, &v, 8);
    }
    for (size_t off = 0; off < n; off += chunk) {
        size_t len = n - off < chunk ? n - off : chunk;
        CK(cudaMemcpy((uint8_t *)d + off, h, len, cudaMemcpyHostToDevice));
    }
    free(h);
}

typedef struct mat {
    uint32_t dt;
    int64_t n, k;
    size_t row_bytes;
    void *w;
} mat;

static size_t row_bytes(uint32_t dt, int64_t k) {
    const kiln_dtype_info *i = kiln_dtype_get(dt);
    return (size_t)(k / i->block_size) * i->block_bytes;
}

static float time_ms(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

/* Median of 5 groups of reps steps (after a warm-up step): ms per step of the nm matmuls
 * through fn with t tokens and weights in layout wl. -1 on a kernel error. */
static double step_ms(kiln_kctx *kc, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, const mat *m,
                      int nm, kiln_matmul_fn fn, uint32_t wl, int64_t t, const float *x, float *y,
                      int reps) {
    float md[5];
    for (int g = 0; g < 5; g++) {
        for (int r = -1; r < reps; r++) {
            if (r == 0) CK(cudaEventRecord(e0, st));
            for (int i = 0; i < nm; i++) {
                kiln_matmul_args ma = {.w = m[i].w,
                                       .w_dtype = m[i].dt,
                                       .w_layout = wl,
                                       .w_row_bytes = m[i].row_bytes,
                                       .n = m[i].n,
                                       .k = m[i].k,
                                       .x = x,
                                       .x_stride = m[i].k,
                                       .y = y,
                                       .y_stride = m[i].n,
                                       .t = t};
                if (fn(kc, &ma)) return -1;
            }
        }
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        md[g] = time_ms(e0, e1) / (float)reps;
    }
    qsort(md, 5, sizeof(float), cmp_f);
    return md[2];
}

/* The matmul arguments of one T16 matrix of the step: t tokens of x (stride k) into y
 * (stride n). */
static kiln_matmul_args t16_args(const mat *m, const float *x, float *y, int64_t t) {
    return (kiln_matmul_args){.w = m->w,
                              .w_dtype = m->dt,
                              /* f16: its rows as stored (gemv_f16r_kernel) */
                              .w_layout = m->dt == KILN_DTYPE_F16 ? KILN_WLAYOUT_PLAIN
                                                                  : KILN_WLAYOUT_CUDA_T16,
                              .w_row_bytes = m->row_bytes,
                              .n = m->n,
                              .k = m->k,
                              .x = x,
                              .x_stride = m->k,
                              .y = y,
                              .y_stride = m->n,
                              .t = t};
}

/* The T16 entry group_step_ms runs: the gemv's (default) or the GEMM's (--gemm) */
static kiln_matmul_fn g_t16 = kiln_cuda_matmul_t16;

/* One decode step's matmuls as the engine calls them on T16 weights (m: layers x q, k, v,
 * o, gate, up, down + the LM head): per layer the q/k/v group, o, the gate/up group with
 * the GLU, down; t tokens. Through a CUDA graph of one step (as kiln's step graphs) when
 * graph, else launched directly. Median ms per step as step_ms; -1 on an error. */
static double group_step_ms(kiln_kctx *kc, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1,
                            const mat *m, int layers, int64_t t, const float *x, float *y,
                            float *y2, int reps, int graph, unsigned parts) {
    float md[5];
    cudaGraphExec_t ge = NULL;
    for (int pass = graph ? 0 : 1; pass < 2; pass++) {
        if (pass == 0) CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        /* pass 0: capture one step; pass 1: (no graph) nothing here */
        if (pass == 0) {
            for (int l = 0; l <= layers; l++) {
                if (l == layers) {
                    if (!(parts & 16)) break;
                    const mat *h = &m[layers * 7];
                    kiln_matmul_args a = t16_args(h, x, y, t);
                    if (g_t16(kc, &a)) return -1;
                    break;
                }
                const mat *L = &m[l * 7];
                kiln_matmul_group_args g = {.n = 3};
                float *yo = y;
                for (int i = 0; i < 3; i++) {
                    g.m[i] = t16_args(&L[i], x, yo, t);
                    g.fn[i] = g_t16;
                    yo += L[i].n * t;
                }
                if ((parts & 1) && kiln_cuda_matmul_group(kc, &g)) return -1;
                kiln_matmul_args o = t16_args(&L[3], x, y2, t);
                if ((parts & 2) && g_t16(kc, &o)) return -1;
                kiln_matmul_group_args f = {.n = 2,
                                            .glu_fn = kiln_cuda_glu,
                                            .act = KILN_GLU_SWIGLU,
                                            .glu_y = y2,
                                            .glu_y_stride = L[4].n};
                for (int i = 0; i < 2; i++) {
                    f.m[i] = t16_args(&L[4 + i], x, y + (int64_t)i * L[4].n * t, t);
                    f.fn[i] = g_t16;
                }
                if ((parts & 4) && kiln_cuda_matmul_group(kc, &f)) return -1;
                kiln_matmul_args d = t16_args(&L[6], y2, y, t);
                if ((parts & 8) && g_t16(kc, &d)) return -1;
            }
            cudaGraph_t gr = NULL;
            CK(cudaStreamEndCapture(st, &gr));
            CK(cudaGraphInstantiate(&ge, gr, 0));
            CK(cudaGraphDestroy(gr));
        }
    }
    for (int gi = 0; gi < 5; gi++) {
        for (int r = -1; r < reps; r++) {
            if (r == 0) CK(cudaEventRecord(e0, st));
            CK(cudaGraphLaunch(ge, st));
        }
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        md[gi] = time_ms(e0, e1) / (float)reps;
    }
    CK(cudaGraphExecDestroy(ge));
    qsort(md, 5, sizeof(float), cmp_f);
    return md[2];
}

static const char *dt_label(uint32_t dt, int kmix) {
    if (kmix) return "q4_k_m";
    return kiln_dtype_get(dt)->name;
}

int main(int argc, char **argv) {
    int layers = 32, reps = 20, t16_only = 0, gemm_only = 0;
    const char *dts = "f16,q8_0,q4_0,q4_k_m";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dtypes") && i + 1 < argc)
            dts = argv[++i];
        else if (!strcmp(argv[i], "--t16-only"))
            t16_only = 1;
        else if (!strcmp(argv[i], "--gemm"))
            gemm_only = 1;
        else {
            fprintf(stderr,
                    "usage: bench_cuda [--dtypes LIST] [--layers N] [--reps N] [--t16-only]\n");
            return 2;
        }
    }
    char why[256];
    int sm = 0;
    if (kiln_cuda_probe(&sm, why, sizeof why) <= 0) {
        printf("bench_cuda: no usable GPU: %s\n", why);
        return 0;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, sm_%d, %d SMs, %.1f GiB\n", prop.name, sm, prop.multiProcessorCount,
           (double)prop.totalGlobalMem / (1 << 30));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));

    /* 1. bandwidth */
    size_t bw_bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    CK(cudaMalloc(&a, bw_bytes));
    CK(cudaMalloc(&b, bw_bytes));
    fill_random(a, bw_bytes);
    float med[5];
    for (int g = 0; g < 5; g++) {
        CK(cudaMemcpyAsync(b, a, bw_bytes, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e0, st));
        for (int r = 0; r < 10; r++)
            CK(cudaMemcpyAsync(b, a, bw_bytes, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        med[g] = time_ms(e0, e1) / 10;
    }
    qsort(med, 5, sizeof(float), cmp_f);
    double copy_gbs = 2.0 * (double)bw_bytes / (med[2] * 1e-3) / 1e9;
    CK(cudaFree(b));
    size_t rd_bytes = (size_t)4 << 30;
    CK(cudaFree(a));
    CK(cudaMalloc(&a, rd_bytes));
    fill_random(a, rd_bytes);
    float *sink = NULL;
    CK(cudaMalloc((void **)&sink, 4096 * sizeof(float)));
    for (int g = 0; g < 5; g++) {
        kiln_cuda_read_bandwidth(st, a, rd_bytes, sink);
        CK(cudaEventRecord(e0, st));
        for (int r = 0; r < 5; r++) kiln_cuda_read_bandwidth(st, a, rd_bytes, sink);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        med[g] = time_ms(e0, e1) / 5;
    }
    qsort(med, 5, sizeof(float), cmp_f);
    double read_gbs = (double)rd_bytes / (med[2] * 1e-3) / 1e9;
    CK(cudaFree(a));
    printf("bandwidth: d2d copy %.0f GB/s (read+write), read kernel %.0f GB/s\n", copy_gbs,
           read_gbs);

    /* 2./3. Llama-3-8B-shaped decode and prefill matmuls */
    const int64_t E = 4096, FF = 14336, KV = 1024, V = 128256;
    const int64_t tmax = 512;
    float *x = NULL, *y = NULL;
    CK(cudaMalloc((void **)&x, sizeof(float) * (size_t)(tmax * FF)));
    CK(cudaMalloc((void **)&y, sizeof(float) * (size_t)(tmax * V)));
    fill_random(x,
                sizeof(float) * (size_t)(tmax * FF)); /* finite: f16 trick keeps f32 finite too */
    /* the largest cuBLAS workspace of any matmul below (the LM head's) */
    size_t scratch_size = 1u << 20;
    static const uint32_t sdt[] = {KILN_DTYPE_BF16, KILN_DTYPE_Q4_0, KILN_DTYPE_F16};
    for (int i = 0; i < 3; i++) {
        size_t b1 = kiln_cuda_matmul_cublas_bytes(sdt[i], V, E),
               b2 = kiln_cuda_matmul_cublas_bytes(sdt[i], FF, E),
               b3 = kiln_cuda_matmul_cublas_bytes(sdt[i], E, FF);
        if (b1 > scratch_size) scratch_size = b1;
        if (b2 > scratch_size) scratch_size = b2;
        if (b3 > scratch_size) scratch_size = b3;
    }
    void *scratch = NULL;
    CK(cudaMalloc(&scratch, scratch_size));
    kiln_kctx kc = {.stream = st, .scratch = scratch, .scratch_size = scratch_size};

    char out[4096], out16[4096];
    int out16n = snprintf(out16, sizeof out16,
                          "| type | T16 t=1 ms | %% of bound | plain mma t=1 ms (same call) | "
                          "T16 t=2 tok/s | t=4 tok/s | t=8 tok/s | t=16 tok/s |\n"
                          "|---|---|---|---|---|---|---|---|\n");
    int outn = snprintf(
        out, sizeof out,
        "| type | GB/token | t=1 ms | %% of bound | mma ms | mma unstaged ms | mma 4 warps ms | "
        "t=4 tok/s | t=16 tok/s | t=64 "
        "tok/s | pp512 tok/s |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    char list[256];
    snprintf(list, sizeof list, "%s", dts);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int kmix = !strcmp(tok, "q4_k_m");
        uint32_t dt = 0;
        if (kmix)
            dt = KILN_DTYPE_Q4_K;
        else {
            kiln_dtype d;
            if (!kiln_dtype_from_name(tok, &d)) {
                fprintf(stderr, "unknown dtype %s\n", tok);
                continue;
            }
            dt = (uint32_t)d;
        }
        const uint32_t dt6 = kmix ? KILN_DTYPE_Q6_K : dt;
        /* per layer: q, k, v, o, gate, up, down; then the LM head */
        const int64_t ns[7] = {E, KV, KV, E, FF, FF, E}, ks[7] = {E, E, E, E, E, E, FF};
        const uint32_t dl[7] = {dt, dt, dt6, dt, dt, dt, dt6};
        int nm = layers * 7 + 1;
        mat *m = calloc((size_t)nm, sizeof *m);
        size_t total = 0;
        for (int l = 0; l < layers; l++)
            for (int j = 0; j < 7; j++) {
                mat *mm = &m[l * 7 + j];
                mm->dt = dl[j], mm->n = ns[j], mm->k = ks[j];
                mm->row_bytes = row_bytes(mm->dt, mm->k);
                total += mm->row_bytes * (size_t)mm->n;
            }
        mat *lm = &m[nm - 1];
        lm->dt = dt6, lm->n = V, lm->k = E, lm->row_bytes = row_bytes(dt6, E);
        total += lm->row_bytes * (size_t)V;
        size_t fr = 0, tot_mem = 0;
        CK(cudaMemGetInfo(&fr, &tot_mem));
        if (total + ((size_t)1 << 30) > fr) {
            printf("%s: %.1f GB of weights do not fit (%.1f GB free); skipped\n", tok, total / 1e9,
                   fr / 1e9);
            free(m);
            continue;
        }
        uint8_t *base = NULL;
        CK(cudaMalloc((void **)&base, total));
        fill_random(base, total);
        size_t off = 0;
        for (int i = 0; i < nm; i++) {
            m[i].w = base + off;
            off += m[i].row_bytes * (size_t)m[i].n;
        }
        /* --gemm: the engine's matmul calls of a step (groups + GLU, one graph) at 16-512
         * tokens through the T16 GEMM (cuda.gemm_t16.matmul: version 2, version 1) and
         * through the T16 gemv in passes of 8 (KILN_CUDA_OLD_GEMM=1); the prefill's path
         * (cuBLAS on dequantized T16) at 512 */
        if (gemm_only) {
            if (dt == KILN_DTYPE_Q4_0 || dt == KILN_DTYPE_Q8_0) {
                /* session 12: the T16 GEMM (version 1), the int8 GEMM (versions 1 and 2),
                 * cuBLAS on dequantized T16 from 128 tokens */
                static const int64_t gt[5] = {16, 32, 64, 128, 512};
                for (int ti = 0; ti < 5; ti++)
                    for (int v = 0; v < 3; v++) {
                        g_t16 = v ? kiln_cuda_matmul_i8 : kiln_cuda_matmul_t16_gemm;
                        kiln_cuda_gemm_t16_set(1);
                        kiln_cuda_gemm_t16_variant(1);
                        kiln_cuda_gemm_i8_set(1);
                        kiln_cuda_gemm_i8_config(2, 0, 2);
                        kiln_cuda_gemm_i8_variant(v == 1 ? 1 : 2);
                        const double ms = group_step_ms(&kc, st, e0, e1, m, layers, gt[ti], x, y,
                                                        y + tmax * FF, reps, 1, 31);
                        printf("%s t=%lld (%s, engine's groups + glu, graph): %.3f ms per "
                               "step, %.0f tok/s\n",
                               tok, (long long)gt[ti],
                               v == 0   ? "T16 GEMM v1"
                               : v == 1 ? "int8 GEMM v1 (L1 loads)"
                                        : "int8 GEMM v2 (smem, cp.async)",
                               ms, (double)gt[ti] / (ms * 1e-3));
                        fflush(stdout);
                    }
                kiln_cuda_gemm_t16_variant(0);
                kiln_cuda_gemm_i8_set(-1);
                kiln_cuda_gemm_i8_config(0, 0, 0);
                kiln_cuda_gemm_i8_variant(0);
                g_t16 = kiln_cuda_matmul_t16;
                for (int ti = 3; ti < 5; ti++) {
                    const double v = step_ms(&kc, st, e0, e1, m, nm, kiln_cuda_matmul_cublas, 3,
                                             gt[ti], x, y, 3);
                    printf("%s t=%lld (cuBLAS on dequantized T16, each matmul alone): %.3f ms "
                           "per step, %.0f tok/s\n",
                           tok, (long long)gt[ti], v, (double)gt[ti] / (v * 1e-3));
                    fflush(stdout);
                }
            }
            CK(cudaFree(base));
            free(m);
            continue;
        }
        /* t = 1 with the default gemv, the tensor-core one and the tensor-core one without
         * shared-memory staging (A/B), then 4, 16, 64, 512 with the default */
        const int64_t tl[9] = {1, 1, 1, 4, 16, 64, 512, 1, 4};
        const int kinds[9] = {3, 3, 4, 3, 3, 3, 3, 5, 5};
        double ms_t[9];
        for (int ti = 0; ti < 9; ti++) {
            int64_t t = tl[ti];
            if (t16_only) { /* the plain-layout kernels skipped (--t16-only) */
                ms_t[ti] = 1e9;
                continue;
            }
            kiln_cuda_gemv_variant(kinds[ti]);
            kiln_matmul_fn fn = t > KILN_CUDA_GEMV_MAX_T ? kiln_cuda_matmul_cublas
                                : ti == 1 || ti == 2     ? kiln_cuda_matmul_gemv_inv
                                                         : kiln_cuda_matmul_gemv;
            int rp = t >= 64 ? (reps + 3) / 4 : reps;
            for (int g = 0; g < 5; g++) {
                for (int r = -1; r < rp; r++) {
                    if (r == 0) CK(cudaEventRecord(e0, st));
                    for (int i = 0; i < nm; i++) {
                        kiln_matmul_args ma = {.w = m[i].w,
                                               .w_dtype = m[i].dt,
                                               .w_row_bytes = m[i].row_bytes,
                                               .n = m[i].n,
                                               .k = m[i].k,
                                               .x = x,
                                               .x_stride = m[i].k,
                                               .y = y,
                                               .y_stride = m[i].n,
                                               .t = t};
                        kiln_status s2 = fn(&kc, &ma);
                        if (s2) {
                            fprintf(stderr, "%s t=%lld matmul %d: status %d\n", tok, (long long)t,
                                    i, (int)s2);
                            return 1;
                        }
                    }
                }
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                med[g] = time_ms(e0, e1) / (float)rp;
            }
            qsort(med, 5, sizeof(float), cmp_f);
            ms_t[ti] = med[2];
            printf("%s t=%lld%s: %.3f ms per step (%.0f GB/s of weights)\n", tok, (long long)t,
                   ti == 1   ? " (tensor cores)"
                   : ti == 2 ? " (tensor cores, unstaged)"
                   : ti >= 7 ? " (tensor cores, 4 warps per CTA)"
                             : "",
                   med[2], total / (med[2] * 1e-3) / 1e9);
            fflush(stdout);
        }
        const double bound_ms = total / (read_gbs * 1e9) * 1e3;
        outn += snprintf(
            out + outn, sizeof out - (size_t)outn,
            "| %s | %.2f | %.3f | %.0f %% | %.3f | %.3f | %.3f | %.0f (4 warps: %.0f) | %.0f | "
            "%.0f | %.0f |\n",
            dt_label(dt, kmix), total / 1e9, ms_t[0], 100.0 * bound_ms / ms_t[0], ms_t[1], ms_t[2],
            ms_t[7], 4 / (ms_t[3] * 1e-3), 4 / (ms_t[8] * 1e-3), 16 / (ms_t[4] * 1e-3),
            64 / (ms_t[5] * 1e-3), 512 / (ms_t[6] * 1e-3));
        /* the T16 layout (kernels/cuda_t16.h; same bytes per weight: random bytes stand in
         * for the repacked ones) through cuda.gemv_t16.matmul: the default split at t = 1,
         * 2, 4, 8, 16, and at t = 1 every warps-per-CTA x loads-in-flight setting (A/B) */
        if (dt == KILN_DTYPE_Q4_0 || dt == KILN_DTYPE_Q8_0 || dt == KILN_DTYPE_Q4_K ||
            dt == KILN_DTYPE_Q6_K || dt == KILN_DTYPE_F16) { /* q4_k_m: q4_K and q6_K both in
                                                              * T16; f16: its plain rows */
            kiln_cuda_gemv_variant(3);
            const uint32_t wl16 = dt == KILN_DTYPE_F16 ? KILN_WLAYOUT_PLAIN : KILN_WLAYOUT_CUDA_T16;
            const double plain1 =
                step_ms(&kc, st, e0, e1, m, nm, kiln_cuda_matmul_gemv_inv, 0, 1, x, y, reps);
            const int64_t tt[5] = {1, 2, 4, 8, 16};
            double ms16[5];
            for (int ti = 0; ti < 5; ti++) {
                ms16[ti] =
                    step_ms(&kc, st, e0, e1, m, nm, kiln_cuda_matmul_t16, wl16, tt[ti], x, y, reps);
                printf("%s t=%lld (T16): %.3f ms per step (%.0f GB/s of weights)\n", tok,
                       (long long)tt[ti], ms16[ti], total / (ms16[ti] * 1e-3) / 1e9);
            }
            static const int cf[][2] = {{8, 1},  {8, 2},  {8, 4},  {16, 1},
                                        {16, 2}, {16, 4}, {32, 1}, {32, 2}};
            for (int fu = 1; fu >= 0; fu--) {
                kiln_cuda_decode_fusion(fu);
                for (size_t c = 0; c < sizeof cf / sizeof cf[0]; c++) {
                    kiln_cuda_t16_config(cf[c][0], cf[c][1]);
                    const double v =
                        step_ms(&kc, st, e0, e1, m, nm, kiln_cuda_matmul_t16, wl16, 1, x, y, reps);
                    printf("%s t=1 (T16, %d warps, %d in flight%s): %.3f ms per step (%.0f GB/s)\n",
                           tok, cf[c][0], cf[c][1], fu ? ", fused split" : ", split launch", v,
                           total / (v * 1e-3) / 1e9);
                }
            }
            kiln_cuda_t16_config(0, 0);
            /* the engine's calls (groups, GLU) in a graph of one step: decode fusion on / off,
             * twice each alternating (session 9's A/B) */
            static const char *const mode[3] = {"off", "on, no PDL", "on + PDL"};
            for (int rep = 0; rep < 2; rep++)
                for (int fu = 2; fu >= 0; fu--) {
                    kiln_cuda_decode_fusion(fu > 0);
                    kiln_cuda_decode_pdl_set(fu == 2);
                    const double g = group_step_ms(&kc, st, e0, e1, m, layers, 1, x, y,
                                                   y + tmax * FF, reps, 1, 31);
                    printf("%s t=1 (T16, engine's groups + glu, one graph per step, decode fusion "
                           "%s): %.3f ms per step (%.0f GB/s, %.0f %% of the bound)\n",
                           tok, mode[fu], g, total / (g * 1e-3) / 1e9,
                           100.0 * (total / (read_gbs * 1e9) * 1e3) / g);
                    fflush(stdout);
                }
            kiln_cuda_decode_fusion(1);
            kiln_cuda_decode_pdl_set(0);
            if (dt == KILN_DTYPE_F16) { /* the previous f16 path (cuda.gemv.matmul: the fma
                                         * gemv at one token) in the same graph of calls */
                for (int rep = 0; rep < 2; rep++) {
                    g_t16 = kiln_cuda_matmul_gemv;
                    const double g0 = group_step_ms(&kc, st, e0, e1, m, layers, 1, x, y,
                                                    y + tmax * FF, reps, 1, 31);
                    g_t16 = kiln_cuda_matmul_t16;
                    kiln_cuda_decode_pdl_set(1);
                    const double g1 = group_step_ms(&kc, st, e0, e1, m, layers, 1, x, y,
                                                    y + tmax * FF, reps, 1, 31);
                    kiln_cuda_f16r_occupancy(2);
                    const double g2 = group_step_ms(&kc, st, e0, e1, m, layers, 1, x, y,
                                                    y + tmax * FF, reps, 1, 31);
                    kiln_cuda_f16r_occupancy(0);
                    kiln_cuda_decode_pdl_set(0);
                    const double bms = total / (read_gbs * 1e9) * 1e3;
                    printf("f16 t=1 (engine's groups + glu, graph): previous gemv %.3f ms (%.0f %% "
                           "of the bound), f16 rows + PDL %.3f ms (%.0f %%), the same at 2 CTAs "
                           "per SM %.3f ms (%.0f %%)\n",
                           g0, 100.0 * bms / g0, g1, 100.0 * bms / g1, g2, 100.0 * bms / g2);
                    fflush(stdout);
                }
            }
            /* where the step's matmul time goes: each part alone, 32 layers in one graph */
            {
                static const char *const pn[5] = {"q/k/v group", "o", "gate/up group + glu", "down",
                                                  "LM head"};
                for (int pi = 0; pi < 5; pi++) {
                    const double v = group_step_ms(&kc, st, e0, e1, m, layers, 1, x, y,
                                                   y + tmax * FF, reps, 1, 1u << pi);
                    /* bytes of the part (per layer x layers, or the head): by the dtypes */
                    size_t pbytes = 0;
                    for (int l = 0; l < (pi == 4 ? 1 : layers); l++) {
                        const int j0[5] = {0, 3, 4, 6, 0}, j1[5] = {3, 4, 6, 7, 1};
                        for (int j = j0[pi]; j < j1[pi]; j++) {
                            const mat *mm = pi == 4 ? &m[layers * 7] : &m[l * 7 + j];
                            pbytes += mm->row_bytes * (size_t)mm->n;
                        }
                    }
                    printf("%s t=1 part %-20s %7.1f us per step (%d x), %.2f GB, %.0f GB/s "
                           "(%.0f %% of the read bandwidth)\n",
                           tok, pn[pi], v * 1e3, pi == 4 ? 1 : layers, pbytes / 1e9,
                           pbytes / (v * 1e-3) / 1e9,
                           100.0 * pbytes / (v * 1e-3) / (read_gbs * 1e9));
                }
            }
            if (kmix || dt == KILN_DTYPE_Q4_K) { /* q4_K at 1 or 2 CTAs per SM */
                for (int mb = 2; mb >= 1; mb--) {
                    kiln_cuda_t16k_occupancy(mb);
                    const double v = group_step_ms(&kc, st, e0, e1, m, layers, 1, x, y,
                                                   y + tmax * FF, reps, 1, 31);
                    printf("%s t=1 (T16, engine's groups, graph, q4_K at %d CTA(s) per SM): %.3f "
                           "ms per step\n",
                           tok, mb, v);
                }
                kiln_cuda_t16k_occupancy(0);
            }
            for (int ti = 0; ti < 2; ti++) {
                const int64_t tg = ti ? 4 : 8;
                const double v =
                    group_step_ms(&kc, st, e0, e1, m, layers, tg, x, y, y + tmax * FF, reps, 1, 31);
                printf("%s t=%lld (T16, engine's groups + glu, graph): %.3f ms per step\n", tok,
                       (long long)tg, v);
            }
            const double bms = total / (read_gbs * 1e9) * 1e3;
            out16n += snprintf(out16 + out16n, sizeof out16 - (size_t)out16n,
                               "| %s | %.3f | %.0f %% | %.3f | %.0f | %.0f | %.0f | %.0f |\n",
                               dt_label(dt, kmix), ms16[0], 100.0 * bms / ms16[0], plain1,
                               2 / (ms16[1] * 1e-3), 4 / (ms16[2] * 1e-3), 8 / (ms16[3] * 1e-3),
                               16 / (ms16[4] * 1e-3));
            fflush(stdout);
        }
        CK(cudaFree(base));
        free(m);
    }
    if (!t16_only)
        printf("\nLlama-3-8B-shaped matmuls (%d layers + LM head), bound = weights / %.0f GB/s "
               "read\n%s",
               layers, read_gbs, out);
    if (out16n > 0 && strchr(out16 + strlen(out16) - 2, '\n') && strstr(out16, "|\n| "))
        printf("\nT16 layout (cuda.gemv_t16.matmul), same matmuls and bound\n%s", out16);
    return 0;
}
#else
int main(void) {
    printf("bench_cuda: kiln was built without CUDA\n");
    return 0;
}
#endif
