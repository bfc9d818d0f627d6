/*
 * bench_cpu_matmul.c — microbenchmarks of the CPU backend's matmul kernels against the
 * machine's measured limits.
 *
 *   bench_cpu_matmul [-t THREADS] [-r REPS] [-i avx512|avx2] [-d DTYPE,...|none] [-m MB] [-H 0|1]
 *                    [-b 0|1] [-D 0|1] [-P 0|1] [-c CALLS] [-T TOKENS]
 *
 * 1. Memory read bandwidth: THREADS threads sum disjoint halves of a 1 GiB buffer
 *    (AVX2 loads, 8 accumulators); best and median of REPS passes, with 4 KiB pages and
 *    with 2 MiB pages (madvise(MADV_HUGEPAGE); the machine's THP setting decides).
 *    -H 1 (default) puts the weights in huge pages too, as the binding does for the
 *    R16 repack (runtime/bind.c); "of bw" is against the huge-page bandwidth then.
 *    -d none measures only this (scripts/bench-vs-llama.sh does, in the same run);
 *    -b 0 skips it (for valgrind --tool=callgrind instruction counts of the kernels).
 * 2. Decode (GEMV, t = 1): tinyllama-1.1b shaped matrices (2048x2048, 256x2048 k/v,
 *    5632x2048, 2048x5632) repeated until the set is MB megabytes (default 256, far
 *    above the 32 MiB L3), one pass = one matmul per matrix: weight GB/s and its
 *    fraction of the measured bandwidth.
 *    -c N: instead, one 256x2048 matrix (L2 resident for every quantized type) called N
 *    times per pass: the kernel's compute-bound decode rate, without the memory system.
 *    -T N: N tokens per call (a decode step of N sequences; default 1): the time is a
 *    step's, the weight rate the step's weight bytes over it.
 * 3. Prefill (GEMM, t = 128) on 2048x2048 (L3 resident weights): GFLOP/s; -P 0 skips it,
 *    -P 2 runs it over decode's MB-sized set instead (weights streamed from DRAM once per
 *    pass, as in a model's prefill step),
 *    -D 0 skips the decode test.
 * Numbers go to docs/PERF.md (CPU backend section) with the command and commit.
 */
#include "base/mem.h"
#include "base/pool.h"
#include "base/timer.h"
#include "format/dtype.h"
#include "kernels/cpu/cpu_kernels.h"

#include <immintrin.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef kiln_status (*mm_fn)(const kiln_kctx *, const kiln_matmul_args *);

/* ---- memory bandwidth ---- */
typedef struct bw_job {
    const uint8_t *buf;
    size_t size;
    double sums[64];
} bw_job;

__attribute__((target("avx2"))) static double read_sum(const uint8_t *p, size_t n) {
    __m256i a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_si256();
    for (size_t i = 0; i + 256 <= n; i += 256)
        for (int j = 0; j < 8; j++)
            a[j] = _mm256_add_epi64(a[j], _mm256_load_si256((const __m256i *)(p + i + 32 * j)));
    for (int j = 1; j < 8; j++) a[0] = _mm256_add_epi64(a[0], a[j]);
    uint64_t v[4];
    memcpy(v, &a[0], 32);
    return (double)(v[0] + v[1] + v[2] + v[3]);
}

static void bw_range(void *ctx, int64_t b, int64_t e, int ith) {
    bw_job *j = ctx;
    j->sums[ith] += read_sum(j->buf + b * 4096, (size_t)(e - b) * 4096);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Buffers: 64-byte aligned heap memory, or (huge) a 2 MiB aligned mapping advised
 * MADV_HUGEPAGE before first touch. The mapping's size is kept in front of the data. */
#define HUGE ((size_t)2 << 20)
static void *buf_alloc(size_t size, bool huge) {
    if (!huge) return kiln_alloc_aligned(size);
    size_t n = (size + HUGE - 1) / HUGE * HUGE + HUGE;
    uint8_t *m = mmap(NULL, n + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)m + 2 * HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    madvise(p, n - HUGE, MADV_HUGEPAGE);
    memcpy(p - 64, &m, sizeof m);
    memcpy(p - 64 + sizeof m, &n, sizeof n);
    return p;
}
static void buf_free(void *p, bool huge) {
    if (!p) return;
    if (!huge) {
        kiln_free_aligned(p);
        return;
    }
    uint8_t *m;
    size_t n;
    memcpy(&m, (uint8_t *)p - 64, sizeof m);
    memcpy(&n, (uint8_t *)p - 64 + sizeof m, sizeof n);
    munmap(m, n + HUGE);
}

static double measure_bw(kiln_pool *pool, int reps, bool huge) {
    const size_t size = (size_t)1 << 30;
    uint8_t *buf = buf_alloc(size, huge);
    if (!buf) return 0;
    for (size_t i = 0; i < size; i += 64) buf[i] = (uint8_t)i;
    bw_job j = {.buf = buf, .size = size};
    double g[64];
    for (int r = 0; r < reps && r < 64; r++) {
        uint64_t t0 = kiln_now_ns();
        kiln_pool_for(pool, (int64_t)(size / 4096), 1024, bw_range, &j); /* 4 MiB chunks */
        g[r] = (double)size / (double)(kiln_now_ns() - t0);
    }
    qsort(g, (size_t)reps, sizeof g[0], cmp_d);
    printf(
        "memory read bandwidth (%d threads, 1 GiB, %s pages): best %.1f GB/s, median %.1f GB/s\n",
        kiln_pool_size(pool), huge ? "2 MiB" : "4 KiB", g[reps - 1], g[reps / 2]);
    buf_free(buf, huge);
    return g[reps - 1];
}

/* ---- matrices ---- */
static void fill(uint32_t dt, uint8_t *w, size_t bytes, int64_t rows, size_t row_bytes) {
    uint64_t s = 0x9E3779B97F4A7C15ull ^ bytes;
    for (size_t i = 0; i < bytes; i += 8) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        memcpy(w + i, &s, bytes - i < 8 ? bytes - i : 8);
    }
    const kiln_dtype_info *in = kiln_dtype_get(dt);
    uint16_t h = kiln_f32_to_fp16(0.01f);
    if (dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_BF16) {
        for (size_t i = 0; i + 2 <= bytes; i += 2) memcpy(w + i, &h, 2);
        return;
    }
    if (dt == KILN_DTYPE_F32) {
        float f = 0.01f;
        for (size_t i = 0; i + 4 <= bytes; i += 4) memcpy(w + i, &f, 4);
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        for (size_t b = 0; b < row_bytes / in->block_bytes; b++) {
            uint8_t *blk = w + r * row_bytes + b * in->block_bytes;
            if (dt == KILN_DTYPE_Q6_K)
                memcpy(blk + 208, &h, 2);
            else {
                memcpy(blk, &h, 2);
                if (dt != KILN_DTYPE_Q4_0 && dt != KILN_DTYPE_Q5_0 && dt != KILN_DTYPE_Q8_0)
                    memcpy(blk + 2, &h, 2);
            }
        }
}

typedef struct mat {
    int64_t n, k;
    size_t row_bytes;
    uint8_t *w;
} mat;

static bool do_decode = true, do_prefill = true;
static bool prefill_stream = false; /* -P 2: prefill over the whole set */
static int cache_calls = 0; /* -c: decode of one L2-resident matrix, called this many times */
static int64_t dec_t = 1;   /* -T: tokens per decode call (a small batch: 2-8 sequences) */

/* CPU seconds of the process (all threads): with -t 1 the kernels' compute rate, which a
 * loaded machine's descheduling does not inflate. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bench_dtype(mm_fn fn, kiln_pool *pool, uint32_t dt, double bw, int reps, size_t mb,
                        uint32_t layout, bool huge) {
    static const int64_t shapes[][2] = {{2048, 2048}, {256, 2048},  {256, 2048}, {2048, 2048},
                                        {5632, 2048}, {5632, 2048}, {2048, 5632}};
    const int nshape = (int)(sizeof shapes / sizeof shapes[0]);
    mat m[512];
    int nm = 0;
    size_t total = 0;
    while ((cache_calls ? nm < 1 : total < mb * 1000000) && nm < 512) {
        mat *x = &m[nm];
        x->n = shapes[nm % nshape][0], x->k = shapes[nm % nshape][1];
        if (cache_calls) x->n = 256;
        if (kiln_dtype_row_bytes(dt, x->k, &x->row_bytes, NULL)) return;
        const bool r16 = layout == KILN_CPU_WLAYOUT_R16;
        x->w = buf_alloc(x->row_bytes * (size_t)x->n, huge && !r16);
        if (!x->w) break;
        fill(dt, x->w, x->row_bytes * (size_t)x->n, x->n, x->row_bytes);
        total += x->row_bytes * (size_t)x->n;
        if (r16) {
            size_t sz;
            if (kiln_cpu_r16_size(dt, x->n, x->k, &sz, NULL)) return;
            uint8_t *r = buf_alloc(sz, huge);
            if (!r || kiln_cpu_r16_repack(dt, x->w, x->row_bytes, x->n, x->k, r, NULL)) return;
            buf_free(x->w, false);
            x->w = r;
        }
        nm++;
    }
    const int64_t T = 128, K = 5632;
    float *x = kiln_alloc_aligned(sizeof(float) * (size_t)(T * K));
    float *y = kiln_alloc_aligned(sizeof(float) * (size_t)(T * 5632));
    for (int64_t i = 0; i < T * K; i++) x[i] = (float)((i * 7919) % 2001 - 1000) * 1e-3f;
    size_t ws = 0;
    for (int i = 0; i < nm; i++) {
        size_t s = kiln_cpu_matmul_workspace(dt, m[i].n, m[i].k, T, kiln_pool_size(pool));
        if (s > ws) ws = s;
    }
    void *scratch = kiln_alloc_aligned(ws);
    kiln_kctx ctx = {.pool = pool, .scratch = scratch, .scratch_size = ws};
    /* decode */
    double best = 1e30;
    for (int r = 0; r < reps + 1 && do_decode; r++) {
        uint64_t t0 = kiln_now_ns();
        for (int i = 0; i < (cache_calls ? cache_calls : nm); i++) {
            kiln_matmul_args a = {.w = m[i % nm].w,
                                  .w_dtype = dt,
                                  .w_layout = layout,
                                  .w_row_bytes = m[i % nm].row_bytes,
                                  .n = m[i % nm].n,
                                  .k = m[i % nm].k,
                                  .x = x,
                                  .x_stride = m[i % nm].k,
                                  .y = y,
                                  .y_stride = m[i % nm].n,
                                  .t = dec_t};
            fn(&ctx, &a);
        }
        double s = (double)(kiln_now_ns() - t0) * 1e-9;
        if (r > 0 && s < best) best = s;
    }
    double gbs = (double)total * (cache_calls ? cache_calls : 1) / best * 1e-9;
    /* prefill: 2048 x 2048, t = 128 */
    double pbest = 1e30, pcpu = 1e30;
    const int np = prefill_stream ? nm : 1;
    double pflop = 0;
    for (int i = 0; i < np; i++) pflop += 2.0 * (double)m[i].n * (double)m[i].k * (double)T;
    for (int r = 0; r < reps + 1 && do_prefill; r++) {
        double c0 = cpu_s();
        uint64_t t0 = kiln_now_ns();
        for (int i = 0; i < np; i++) {
            kiln_matmul_args a = {.w = m[i].w,
                                  .w_dtype = dt,
                                  .w_layout = layout,
                                  .w_row_bytes = m[i].row_bytes,
                                  .n = m[i].n,
                                  .k = m[i].k,
                                  .x = x,
                                  .x_stride = m[i].k,
                                  .y = y,
                                  .y_stride = m[i].n,
                                  .t = T};
            fn(&ctx, &a);
        }
        double s = (double)(kiln_now_ns() - t0) * 1e-9;
        if (r > 0 && s < pbest) pbest = s;
        double cs = cpu_s() - c0;
        if (r > 0 && cs < pcpu) pcpu = cs;
    }
    double gflops = pflop / pbest * 1e-9;
    double gcpu = pflop / pcpu * 1e-9;
    if (!do_decode) best = gbs = 0; /* printed as 0, not as the 1e30 s placeholder */
    if (!do_prefill) gflops = gcpu = 0;
    printf("| %-5s%s | %7.1f MB | %6.2f ms | %6.1f GB/s | %5.1f %% | %7.1f | %7.1f |\n",
           kiln_dtype_name(dt), layout ? " R16" : "    ", (double)total * 1e-6, best * 1e3, gbs,
           bw > 0 ? 100.0 * gbs / bw : 0.0, gflops, gcpu);
    for (int i = 0; i < nm; i++) buf_free(m[i].w, huge);
    kiln_free_aligned(x), kiln_free_aligned(y), kiln_free_aligned(scratch);
}

int main(int argc, char **argv) {
    int threads = 2, reps = 5;
    bool huge = true, do_bw = true;
    size_t mb = 256;
    const char *isa = kiln_cpu_avx512_ok() ? "avx512" : "avx2";
    const char *dts = "f16,bf16,q8_0,q4_0,q4_1,q5_0,q5_1,q4_K,q5_K,q6_K";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-t"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-i"))
            isa = argv[i + 1];
        else if (!strcmp(argv[i], "-d"))
            dts = argv[i + 1];
        else if (!strcmp(argv[i], "-m"))
            mb = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "-H"))
            huge = atoi(argv[i + 1]) != 0;
        else if (!strcmp(argv[i], "-b"))
            do_bw = atoi(argv[i + 1]) != 0;
        else if (!strcmp(argv[i], "-P")) {
            do_prefill = atoi(argv[i + 1]) != 0;
            prefill_stream = atoi(argv[i + 1]) == 2;
        } else if (!strcmp(argv[i], "-D"))
            do_decode = atoi(argv[i + 1]) != 0;
        else if (!strcmp(argv[i], "-T"))
            dec_t = atoi(argv[i + 1]) > 0 && atoi(argv[i + 1]) <= 128 ? atoi(argv[i + 1]) : 1;
        else if (!strcmp(argv[i], "-c"))
            cache_calls = atoi(argv[i + 1]);
    }
    if (reps < 1) reps = 1;
    mm_fn fn = !strcmp(isa, "avx2") ? kiln_cpu_matmul_avx2 : kiln_cpu_matmul_avx512;
    if ((fn == kiln_cpu_matmul_avx512 && !kiln_cpu_avx512_ok()) || !kiln_cpu_avx2_ok()) {
        fprintf(stderr, "bench_cpu_matmul: this CPU lacks %s\n", isa);
        return 1;
    }
    kiln_pool *pool = NULL;
    if (kiln_pool_create(threads, &pool, NULL)) return 1;
    double bw4k = do_bw ? measure_bw(pool, reps, false) : 0,
           bw2m = do_bw ? measure_bw(pool, reps, true) : 0;
    double bw = huge ? bw2m : bw4k;
    if (!strcmp(dts, "none")) {
        kiln_pool_free(pool);
        return 0;
    }
    printf(
        "isa %s, %d threads; decode = t 1 over tinyllama-shaped matrices, prefill = %s t 128\n\n",
        isa, threads, prefill_stream ? "the same matrices" : "2048x2048");
    printf("| dtype     | weights    | decode     | weight rate | of bw   | prefill GFLOP/s | per "
           "CPU-s |\n");
    printf("|-----------|------------|------------|-------------|---------|-----------------|------"
           "-----|\n");
    char buf[256];
    snprintf(buf, sizeof buf, "%s", dts);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        kiln_dtype dt;
        if (!kiln_dtype_from_name(tok, &dt) || !kiln_cpu_matmul_dtype_ok(dt)) {
            fprintf(stderr, "bench_cpu_matmul: unknown dtype '%s'\n", tok);
            continue;
        }
        bench_dtype(fn, pool, dt, bw, reps, mb, 0, huge);
        if (kiln_cpu_r16_supports(dt))
            bench_dtype(fn, pool, dt, bw, reps, mb, KILN_CPU_WLAYOUT_R16, huge);
    }
    kiln_pool_free(pool);
    return 0;
}
