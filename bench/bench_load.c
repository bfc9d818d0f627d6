/*
 * bench_load.c — loader speed against the physical limits, measured in one run.
 *
 *   bench_load [--file PATH | PATH] [--size-gib N] [--threads N] [--keep]
 *              [--cuda DEV | --device DEV] [--reps N]
 *
 * Writes a synthetic GGUF of about N GiB (default 1.1; f16 embeddings, q8_0 / q4_K / f16
 * matrices, f32 norms, random bytes with finite scales) unless PATH exists, then measures:
 *   seq read      evict the file's pages (posix_fadvise DONTNEED), read it front to back
 *                 with 1 MiB read() calls (`cat FILE > /dev/null`)
 *   cold alias    evict, open + plan + execute with every tensor aliased and populated
 *                 (MADV_POPULATE_READ): load-to-ready; target <= 1.1 x seq read
 *   cold copy     evict, load every tensor into owned memory (writable: transform lane,
 *                 identity) through io_uring and through pread
 *   warm alias    file cached: open + plan + execute, populated and lazy; target
 *                 <= 50 ms per GiB
 *   memcpy        multi-threaded memcpy of 512 MiB (same threads as the loader), into
 *                 touched memory and into freshly mapped memory (the transform lane's
 *                 owned buffers are fresh: first-touch faults and zeroing included)
 *   transform     warm file: identity copy, f16->f32 conversion of f16 tensors, blocks_x4
 *                 repack of quantized ones; GB/s of bytes read; target >= 70 % of memcpy
 *   upload        (--cuda DEV, CUDA builds) pinned cudaMemcpy host->device bandwidth, and
 *                 the upload lane; target >= 80 %
 *
 *   bench_load --model PATH [--backend B] [--reps N] [--threads N]
 *                 the engine's own load path on a real model: kiln_model_load + plan
 *                 compile + kernel selection + the load plan the kernels ask for, executed
 *                 (kiln_bind_plan_load, as kiln_engine_create): cold (pages evicted with
 *                 posix_fadvise DONTNEED) and warm to ready against a sequential read of the
 *                 file, the transform lane's GB/s against memcpy of the same byte count
 *                 (into touched memory, fresh 4 KiB pages and fresh huge pages), and the
 *                 peak resident memory of the process while loading (VmHWM)
 * Results go to docs/PERF.md (Loader section) with the command and commit.
 */
#include "base/mem.h"
#include "base/pool.h"
#include "base/timer.h"
#include "format/dtype.h"
#include "format/model_file.h"
#include "load/load.h"
#include "model/model.h"
#include "runtime/exec.h"

#include <sys/resource.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static void die(const char *what) {
    fprintf(stderr, "bench_load: %s\n", what);
    exit(1);
}

/* ---- a synthetic GGUF ------------------------------------------------------------------ */

typedef struct wbuf {
    FILE *f;
    uint64_t pos;
} wbuf;

static void w_put(wbuf *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->f) != n) die("write failed");
    w->pos += n;
}
static void w_u32(wbuf *w, uint32_t v) {
    w_put(w, &v, 4);
}
static void w_u64(wbuf *w, uint64_t v) {
    w_put(w, &v, 8);
}
static void w_str(wbuf *w, const char *s) {
    w_u64(w, strlen(s));
    w_put(w, s, strlen(s));
}
static void w_pad(wbuf *w) {
    static const uint8_t z[32];
    w_put(w, z, (32 - w->pos % 32) % 32);
}

typedef struct spec {
    char name[64];
    uint32_t type;
    int64_t ne0, ne1;
    uint64_t bytes, off;
} spec;

static size_t make_specs(spec *s, int layers, int d, int ff, int vocab) {
    size_t n = 0;
    snprintf(s[n].name, 64, "token_embd.weight"), s[n].type = KILN_DTYPE_F16, s[n].ne0 = d,
                                                  s[n++].ne1 = vocab;
    snprintf(s[n].name, 64, "output_norm.weight"), s[n].type = KILN_DTYPE_F32, s[n].ne0 = d,
                                                   s[n++].ne1 = 1;
    for (int l = 0; l < layers; l++) {
        static const char *mats[] = {"attn_q", "attn_k", "attn_v", "attn_output"};
        for (int m = 0; m < 4; m++) {
            snprintf(s[n].name, 64, "blk.%d.%s.weight", l, mats[m]);
            s[n].type = m == 3 ? KILN_DTYPE_F16 : KILN_DTYPE_Q8_0;
            s[n].ne0 = d, s[n++].ne1 = d;
        }
        snprintf(s[n].name, 64, "blk.%d.ffn_gate.weight", l), s[n].type = KILN_DTYPE_Q4_K,
                                                              s[n].ne0 = d, s[n++].ne1 = ff;
        snprintf(s[n].name, 64, "blk.%d.ffn_up.weight", l), s[n].type = KILN_DTYPE_Q4_K,
                                                            s[n].ne0 = d, s[n++].ne1 = ff;
        snprintf(s[n].name, 64, "blk.%d.ffn_down.weight", l), s[n].type = KILN_DTYPE_Q8_0,
                                                              s[n].ne0 = ff, s[n++].ne1 = d;
        snprintf(s[n].name, 64, "blk.%d.attn_norm.weight", l), s[n].type = KILN_DTYPE_F32,
                                                               s[n].ne0 = d, s[n++].ne1 = 1;
        snprintf(s[n].name, 64, "blk.%d.ffn_norm.weight", l), s[n].type = KILN_DTYPE_F32,
                                                              s[n].ne0 = d, s[n++].ne1 = 1;
    }
    return n;
}

static void fill(uint8_t *p, size_t n, uint32_t type, uint64_t *seed) {
    uint64_t x = *seed;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
    *seed = x;
    const kiln_dtype_info *di = kiln_dtype_get(type);
    if (type == KILN_DTYPE_F16)
        for (size_t i = 0; i + 2 <= n; i += 2) p[i + 1] = (uint8_t)((p[i + 1] & 0x83) | 0x30);
    if (type == KILN_DTYPE_F32)
        for (size_t i = 0; i + 4 <= n; i += 4) p[i + 3] = (uint8_t)((p[i + 3] & 0x80) | 0x3e);
    if (di->quantized) /* a finite fp16 scale at the start of each block */
        for (size_t b = 0; b + di->block_bytes <= n; b += di->block_bytes) p[b + 1] = 0x20;
}

static void make_gguf(const char *path, double gib) {
    /* d=2048, ff=5632 gives ~41 MiB per layer */
    const int d = 2048, ff = 5632, vocab = 32000;
    int layers = (int)(gib * 1024.0 / 41.5);
    if (layers < 1) layers = 1;
    spec *s = calloc((size_t)layers * 9 + 2, sizeof *s);
    if (!s) die("out of memory");
    size_t n = make_specs(s, layers, d, ff, vocab);
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t shape[2] = {s[i].ne0, s[i].ne1};
        size_t b;
        if (kiln_dtype_nbytes(s[i].type, shape, 2, &b, NULL)) die("bad spec");
        s[i].bytes = b;
        s[i].off = off;
        off = (off + b + 31) / 32 * 32;
    }
    wbuf w = {fopen(path, "wb"), 0};
    if (!w.f) die("cannot create the model file");
    w_put(&w, "GGUF", 4);
    w_u32(&w, 3);
    w_u64(&w, n);
    w_u64(&w, 2);
    w_str(&w, "general.architecture"), w_u32(&w, 8), w_str(&w, "llama");
    w_str(&w, "llama.block_count"), w_u32(&w, 4), w_u32(&w, (uint32_t)layers);
    for (size_t i = 0; i < n; i++) {
        w_str(&w, s[i].name);
        w_u32(&w, s[i].ne1 > 1 ? 2 : 1);
        w_u64(&w, (uint64_t)s[i].ne0);
        if (s[i].ne1 > 1) w_u64(&w, (uint64_t)s[i].ne1);
        w_u32(&w, s[i].type);
        w_u64(&w, s[i].off);
    }
    w_pad(&w);
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    uint8_t *buf = malloc(64 << 20);
    if (!buf) die("out of memory");
    for (size_t i = 0; i < n; i++) {
        for (uint64_t done = 0; done < s[i].bytes;) {
            size_t k = s[i].bytes - done < (64u << 20) ? (size_t)(s[i].bytes - done) : (64u << 20);
            k -= k % kiln_dtype_get(s[i].type)->block_bytes
                     ? k % kiln_dtype_get(s[i].type)->block_bytes
                     : 0;
            fill(buf, k, s[i].type, &seed);
            w_put(&w, buf, k);
            done += k;
        }
        w_pad(&w);
    }
    free(buf);
    free(s);
    if (fclose(w.f) != 0) die("closing the model file");
    printf("wrote %s: %.2f GiB, %d layers, %zu tensors\n", path, (double)w.pos / (1 << 30), layers,
           n);
}

/* ---- measurements ------------------------------------------------------------------------ */

static double resident_fraction(const char *path) {
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) die("stat");
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
    long pg = sysconf(_SC_PAGESIZE);
    size_t pages = ((size_t)sb.st_size + (size_t)pg - 1) / (size_t)pg, res = 0;
    unsigned char *vec = malloc(pages);
    if (p != MAP_FAILED && vec && mincore(p, (size_t)sb.st_size, vec) == 0)
        for (size_t i = 0; i < pages; i++) res += vec[i] & 1;
    free(vec);
    if (p != MAP_FAILED) munmap(p, (size_t)sb.st_size);
    close(fd);
    return (double)res / (double)pages;
}

static void evict(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) die("open for eviction");
    fdatasync(fd); /* dirty pages (a freshly written file) cannot be dropped */
    if (posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0) die("posix_fadvise");
    close(fd);
}

static double seq_read(const char *path, uint64_t *bytes) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) die("open");
    char *buf = malloc(1 << 20);
    uint64_t t0 = kiln_now_ns(), total = 0;
    ssize_t r;
    while ((r = read(fd, buf, 1 << 20)) > 0) total += (uint64_t)r;
    double s = (double)(kiln_now_ns() - t0) * 1e-9;
    free(buf);
    close(fd);
    *bytes = total;
    return s;
}

typedef struct load_result {
    double seconds, lane_gbps, plan_seconds, setup_seconds, reg_seconds, fill_seconds, wait_seconds,
        teardown_seconds;
    uint64_t bytes, direct_bytes;
} load_result;

static kiln_load_target bench_target(void *user, const kiln_tensor_info *t) {
    const char *mode = user;
    kiln_load_target tg = {KILN_PLACE_HOST, 0, NULL, false};
    if (strcmp(mode, "f32") == 0 && t->dtype == KILN_DTYPE_F16)
        tg.layout = "f32";
    else if (strcmp(mode, "x4") == 0 && kiln_dtype_get(t->dtype)->quantized)
        tg.layout = "blocks_x4";
    else
        tg.writable = true;
    return tg;
}

/* open + plan + execute; "lane" is the lane whose throughput is reported. */
static load_result run_load(const char *path, kiln_load_request *req, kiln_lane lane) {
    uint64_t t0 = kiln_now_ns();
    kiln_model_file *mf;
    kiln_load_plan *p;
    kiln_err e;
    if (kiln_model_file_open(path, 0, &mf, &e) || kiln_load_plan_build(mf, req, &p, &e) ||
        kiln_load_execute(p, &e)) {
        fprintf(stderr, "bench_load: %s\n", e.msg);
        exit(1);
    }
    load_result r;
    r.seconds = (double)(kiln_now_ns() - t0) * 1e-9;
    const kiln_load_report *rep = kiln_load_plan_report(p);
    r.bytes = rep->lane[lane].src_bytes;
    r.lane_gbps =
        rep->lane[lane].seconds > 0 ? (double)r.bytes / rep->lane[lane].seconds * 1e-9 : 0;
    r.plan_seconds = rep->plan_seconds;
    r.setup_seconds = rep->upload_setup_seconds;
    r.reg_seconds = rep->upload_register_seconds;
    r.fill_seconds = rep->upload_fill_seconds;
    r.wait_seconds = rep->upload_wait_seconds;
    r.teardown_seconds = rep->upload_teardown_seconds;
    r.direct_bytes = rep->upload_direct_bytes;
    kiln_load_plan_free(p);
    kiln_model_file_close(mf);
    return r;
}

typedef struct mc {
    uint8_t *dst;
    const uint8_t *src;
    size_t n;
} mc;
static void memcpy_task(void *ctx, int ith, int nth) {
    mc *m = ctx;
    int64_t b, e;
    kiln_split_range((int64_t)(m->n / 4096), ith, nth, &b, &e);
    memcpy(m->dst + b * 4096, m->src + b * 4096, (size_t)(e - b) * 4096);
}

/* memcpy bandwidth; fresh: into newly mapped memory (first-touch faults and zeroing
 * included, as the transform lane's owned buffers pay them), else into touched memory. */
static double memcpy_gbps_n(int threads, bool fresh, size_t n) {
    uint8_t *a = kiln_alloc_aligned(n), *b = kiln_alloc_aligned(n);
    if (!a || !b) die("out of memory");
    memset(a, 1, n);
    memset(b, 2, n);
    kiln_pool *pool;
    if (kiln_pool_create(threads, &pool, NULL)) die("pool");
    mc m = {b, a, n};
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        uint64_t t0 = kiln_now_ns();
        uint8_t *dst = b;
        if (fresh) {
            dst = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (dst == MAP_FAILED) die("mmap");
        }
        m.dst = dst;
        kiln_pool_run(pool, memcpy_task, &m);
        double s = (double)(kiln_now_ns() - t0) * 1e-9;
        if (fresh) munmap(dst, n);
        if ((double)n / s * 1e-9 > best) best = (double)n / s * 1e-9;
    }
    kiln_pool_free(pool);
    kiln_free_aligned(a);
    kiln_free_aligned(b);
    return best;
}

static double memcpy_gbps(int threads, bool fresh) {
    return memcpy_gbps_n(threads, fresh, (size_t)512 << 20);
}

/* memcpy of n bytes into fresh memory with MADV_HUGEPAGE (the loader's owned arena) */
static double memcpy_huge_gbps(int threads, size_t n) {
    uint8_t *a = kiln_alloc_aligned(n);
    if (!a) die("out of memory");
    memset(a, 1, n);
    kiln_pool *pool;
    if (kiln_pool_create(threads, &pool, NULL)) die("pool");
    double best = 0;
    const size_t H = (size_t)2 << 20;
    for (int rep = 0; rep < 3; rep++) {
        uint64_t t0 = kiln_now_ns();
        uint8_t *m = mmap(NULL, n + H, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) die("mmap");
        uint8_t *dst = (uint8_t *)(((uintptr_t)m + H - 1) & ~(uintptr_t)(H - 1));
        (void)madvise(dst, n & ~(H - 1), MADV_HUGEPAGE);
        mc c = {dst, a, n};
        kiln_pool_run(pool, memcpy_task, &c);
        double s = (double)(kiln_now_ns() - t0) * 1e-9;
        munmap(m, n + H);
        if ((double)n / s * 1e-9 > best) best = (double)n / s * 1e-9;
    }
    kiln_pool_free(pool);
    kiln_free_aligned(a);
    return best;
}

/* memcpy of n bytes of a file's cached pages, read through a fresh read-only mapping of
 * the file (as the transform lane reads its sources: the mapping's page faults included),
 * into fresh memory with MADV_HUGEPAGE. */
static double memcpy_file_huge_gbps(const char *path, int threads, size_t n) {
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) die("open");
    if ((size_t)st.st_size < n) n = (size_t)st.st_size & ~(size_t)4095;
    kiln_pool *pool;
    if (kiln_pool_create(threads, &pool, NULL)) die("pool");
    double best = 0;
    const size_t H = (size_t)2 << 20;
    for (int rep = 0; rep < 3; rep++) {
        uint8_t *src = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
        uint8_t *m = mmap(NULL, n + H, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (src == MAP_FAILED || m == MAP_FAILED) die("mmap");
        uint8_t *dst = (uint8_t *)(((uintptr_t)m + H - 1) & ~(uintptr_t)(H - 1));
        (void)madvise(dst, n & ~(H - 1), MADV_HUGEPAGE);
        mc c = {dst, src, n};
        uint64_t t0 = kiln_now_ns();
        kiln_pool_run(pool, memcpy_task, &c);
        double s = (double)(kiln_now_ns() - t0) * 1e-9;
        munmap(m, n + H);
        munmap(src, n);
        if ((double)n / s * 1e-9 > best) best = (double)n / s * 1e-9;
    }
    kiln_pool_free(pool);
    close(fd);
    return best;
}

#ifdef KILN_HAVE_CUDA
/* The upload lane's two halves apart (docs/LOADER.md "Upload lane"): filling a ring of
 * UP_NBUF = 4 pinned 32 MiB buffers from the file's mapping (fresh each time, as the lane
 * maps it) or from touched anonymous memory, with every thread and no DMA; and the DMA
 * alone (the ring copied to the device over and over). GB/s of the file's bytes. */
typedef struct anat {
    const uint8_t *src;
    uint8_t *dst;
    size_t n;
    bool stream;
} anat;
static void anat_range(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    const anat *a = ctx;
    size_t o = (size_t)b << 20, z = (size_t)e << 20;
    if (z > a->n) z = a->n;
    if (a->stream)
        kiln_memcpy_stream(a->dst + o, a->src + o, z - o);
    else
        memcpy(a->dst + o, a->src + o, z - o);
}
static double fill_gbps(kiln_pool *pool, const uint8_t *src, size_t n, void *const *pin,
                        bool stream) {
    const size_t W = (size_t)32 << 20;
    uint64_t t0 = kiln_now_ns();
    for (size_t o = 0, k = 0; o < n; o += W, k++) {
        anat a = {src + o, pin[k % 4], n - o < W ? n - o : W, stream};
        kiln_pool_for(pool, (int64_t)((a.n + (1 << 20) - 1) >> 20), 1, anat_range, &a);
    }
    return (double)n / ((double)(kiln_now_ns() - t0) * 1e-9) * 1e-9;
}
static void upload_anatomy(const char *path, int threads, int dev, int reps) {
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) die("open");
    size_t n = (size_t)sb.st_size;
    kiln_pool *pool;
    if (kiln_pool_create(threads, &pool, NULL)) die("pool");
    void *pin[4], *d;
    for (int b = 0; b < 4; b++)
        if (cudaHostAlloc(&pin[b], (size_t)32 << 20, cudaHostAllocPortable) != cudaSuccess)
            die("cudaHostAlloc");
    if (cudaSetDevice(dev) != cudaSuccess || cudaMalloc(&d, n) != cudaSuccess) die("cudaMalloc");
    uint8_t *anon = kiln_alloc_aligned(n);
    if (!anon) die("alloc");
    memset(anon, 1, n);
    double best[4] = {0, 0, 0, 0};
    for (int r = 0; r < reps; r++) {
        for (int m = 0; m < 2; m++) { /* a fresh mapping each time, as the lane has */
            void *map = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
            if (map == MAP_FAILED) die("mmap");
            double g = fill_gbps(pool, map, n, pin, m == 0);
            if (g > best[m]) best[m] = g;
            munmap(map, n);
        }
        double g = fill_gbps(pool, anon, n, pin, true);
        if (g > best[2]) best[2] = g;
        cudaStream_t st;
        if (cudaStreamCreate(&st) != cudaSuccess) die("stream");
        uint64_t t0 = kiln_now_ns();
        for (size_t o = 0, k = 0; o < n; o += (size_t)32 << 20, k++) {
            size_t len = n - o < ((size_t)32 << 20) ? n - o : ((size_t)32 << 20);
            cudaMemcpyAsync((uint8_t *)d + o, pin[k % 4], len, cudaMemcpyHostToDevice, st);
        }
        cudaStreamSynchronize(st);
        cudaStreamDestroy(st);
        g = (double)n / ((double)(kiln_now_ns() - t0) * 1e-9) * 1e-9;
        if (g > best[3]) best[3] = g;
    }
    printf("%-34s %10s %10.2f\n", "fill only, mapping, stream stores", "", best[0]);
    printf("%-34s %10s %10.2f\n", "fill only, mapping, memcpy", "", best[1]);
    printf("%-34s %10s %10.2f\n", "fill only, touched anon, stream", "", best[2]);
    printf("%-34s %10s %10.2f\n", "DMA only, 4 x 32 MiB pinned ring", "", best[3]);
    kiln_free_aligned(anon);
    cudaFree(d);
    for (int b = 0; b < 4; b++) cudaFreeHost(pin[b]);
    kiln_pool_free(pool);
    close(fd);
}
#endif

static uint64_t vm_hwm_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

typedef struct engine_load {
    double seconds; /* open + select + plan + execute */
    kiln_load_report rep;
} engine_load;

static engine_load run_engine_load(const char *path, const char *backend, int threads, bool huge) {
    uint64_t t0 = kiln_now_ns();
    kiln_model *m;
    kiln_err e;
    kiln_plan plan;
    kiln_plan_init(&plan);
    kiln_bound_plan bp;
    kiln_load_request rq;
    kiln_load_request_init(&rq);
    rq.threads = threads;
    rq.huge_pages = huge;
    kiln_device dev;
    const kiln_backend *be = kiln_backend_find(backend);
    if (!be) die("unknown backend");
    kiln_bind_opts bo;
    kiln_bind_opts_default(&bo);
    bo.max_tokens = 512; /* the CLI's default step */
    if (kiln_model_load(path, &m, &e) || kiln_device_open(be, 0, &dev, &e) ||
        m->family->compile(&m->cfg, KILN_MODE_PREFILL, &plan, &e) ||
        kiln_bind_plan_load(&dev, m, &plan, &bo, &rq, &bp, NULL, &e)) {
        fprintf(stderr, "bench_load: %s\n", e.msg);
        exit(1);
    }
    engine_load r;
    r.seconds = (double)(kiln_now_ns() - t0) * 1e-9;
    r.rep = *kiln_load_plan_report(bp.load);
    kiln_bound_plan_free(&bp);
    kiln_device_close(&dev);
    kiln_model_free(m);
    return r;
}

static int engine_main(const char *path, const char *backend, int threads, int reps) {
    struct stat sb;
    if (stat(path, &sb) != 0) die("model not found");
    printf("engine load path: %s (%.3f GiB), backend %s, %d threads, best of %d\n\n", path,
           (double)sb.st_size / (1 << 30), backend, threads, reps);
    double seq = 1e30, cold = 1e30, warm = 1e30, tr = 0;
    engine_load last = {0};
    uint64_t hwm0 = vm_hwm_kb();
    for (int r = 0; r < reps; r++) {
        uint64_t bytes;
        evict(path);
        double s = seq_read(path, &bytes);
        if (s < seq) seq = s;
        evict(path);
        engine_load c = run_engine_load(path, backend, threads, true);
        if (c.seconds < cold) cold = c.seconds;
    }
    uint64_t hwm_cold = vm_hwm_kb();
    double tr4k = 0, warm4k = 1e30;
    for (int r = 0; r < reps; r++) {
        engine_load w4 = run_engine_load(path, backend, threads, false);
        const kiln_lane_stats *t4 = &w4.rep.lane[KILN_LANE_TRANSFORM];
        double g4 = t4->seconds > 0 ? (double)t4->src_bytes / t4->seconds * 1e-9 : 0;
        if (g4 > tr4k) tr4k = g4;
        if (w4.seconds < warm4k) warm4k = w4.seconds;
        engine_load w = run_engine_load(path, backend, threads, true);
        if (w.seconds < warm) warm = w.seconds;
        const kiln_lane_stats *t = &w.rep.lane[KILN_LANE_TRANSFORM];
        double g = t->seconds > 0 ? (double)t->src_bytes / t->seconds * 1e-9 : 0;
        if (g > tr) tr = g;
        last = w;
    }
    const kiln_lane_stats *ls = last.rep.lane;
    for (int l = 0; l < KILN_LANE_COUNT; l++)
        printf("  lane %-9s %4u tensors %9.2f MiB read %9.2f MiB out\n",
               kiln_lane_name((kiln_lane)l), ls[l].tensors, (double)ls[l].src_bytes / (1 << 20),
               (double)ls[l].bytes / (1 << 20));
    size_t n = (size_t)ls[KILN_LANE_TRANSFORM].bytes;
    if (n < ((size_t)64 << 20)) n = (size_t)64 << 20;
    n = (n + 4095) & ~(size_t)4095;
    double mc_t = 0, mc_f = 0, mc_h = 0, mc_m = 0, tr2 = 0;
    for (int r = 0; r < reps; r++) { /* lane and memcpy alternating, best of each */
        double a = memcpy_gbps_n(threads, false, n), b = memcpy_gbps_n(threads, true, n),
               c = memcpy_huge_gbps(threads, n), d = memcpy_file_huge_gbps(path, threads, n);
        mc_t = a > mc_t ? a : mc_t, mc_f = b > mc_f ? b : mc_f, mc_h = c > mc_h ? c : mc_h;
        mc_m = d > mc_m ? d : mc_m;
        engine_load w = run_engine_load(path, backend, threads, true);
        const kiln_lane_stats *t = &w.rep.lane[KILN_LANE_TRANSFORM];
        double g = t->seconds > 0 ? (double)t->src_bytes / t->seconds * 1e-9 : 0;
        if (g > tr2) tr2 = g;
    }
    if (tr2 > tr) tr = tr2;
    printf("\n%-44s %10.1f ms\n", "sequential read (cold, read() 1 MiB)", seq * 1e3);
    printf("%-44s %10.1f ms\n", "engine load to ready (cold)", cold * 1e3);
    printf("%-44s %10.1f ms\n", "engine load to ready (warm)", warm * 1e3);
    printf("%-44s %10.1f ms (plan %.1f, execute %.1f: alias %.1f, transform %.1f)\n",
           "  of which the load plan (last warm run)", last.rep.total_seconds * 1e3,
           last.rep.plan_seconds * 1e3, last.rep.exec_seconds * 1e3,
           last.rep.lane[KILN_LANE_ALIAS].seconds * 1e3,
           last.rep.lane[KILN_LANE_TRANSFORM].seconds * 1e3);
    printf("%-44s %10.2f GB/s\n", "transform lane (warm, huge-page arena)", tr);
    printf("%-44s %10.2f GB/s (to ready %.1f ms)\n", "transform lane (warm, 4 KiB pages)", tr4k,
           warm4k * 1e3);
    printf("%-44s %10.2f GB/s\n", "memcpy, same bytes, touched memory", mc_t);
    printf("%-44s %10.2f GB/s\n", "memcpy, same bytes, fresh 4 KiB pages", mc_f);
    printf("%-44s %10.2f GB/s\n", "memcpy, same bytes, fresh huge pages", mc_h);
    printf("%-44s %10.2f GB/s\n", "memcpy, file's mapping -> fresh huge pages", mc_m);
    printf("%-44s %10.1f MiB (before %.1f)\n", "peak RSS of the process (VmHWM) after cold",
           (double)hwm_cold / 1024, (double)hwm0 / 1024);
    printf("\nratios:\n");
    printf("  cold to ready / sequential read        %.3f   (target <= 1.1)\n", cold / seq);
    printf("  warm to ready, ms per GiB              %.1f\n",
           warm * 1e3 / ((double)sb.st_size / (1 << 30)));
    printf("  transform / memcpy (touched)           %.3f   (target >= 0.8)\n", tr / mc_t);
    printf("  transform / memcpy (fresh 4 KiB)       %.3f\n", tr / mc_f);
    printf("  transform / memcpy (fresh huge pages)  %.3f\n", tr / mc_h);
    printf("  transform / memcpy (mapping -> huge)   %.3f\n", tr / mc_m);
    printf("  transform 4 KiB / memcpy (fresh 4 KiB) %.3f\n", tr4k / mc_f);
    printf("  peak RSS / (file + owned) bytes        %.3f\n",
           (double)hwm_cold * 1024 / ((double)sb.st_size + (double)last.rep.env.owned_bytes));
    return 0;
}

int main(int argc, char **argv) {
    const char *path = "/tmp/kiln-bench-load.gguf";
    double gib = 1.1;
    int threads = 0, cuda_dev = -1, reps = 3;
    bool keep = false, upload_only = false; /* --upload-only: pinned H2D and the stream rows */
    const char *model = NULL, *backend = "cpu";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--file") && i + 1 < argc)
            path = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            backend = argv[++i];
        else if (!strcmp(argv[i], "--size-gib") && i + 1 < argc)
            gib = atof(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cuda") && i + 1 < argc)
            cuda_dev = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--upload-only"))
            upload_only = true;
        else if (!strcmp(argv[i], "--keep"))
            keep = true;
        else {
            fprintf(stderr, "usage: bench_load [--file PATH] [--size-gib N] [--threads N] [--keep] "
                            "[--cuda DEV] [--reps N]\n"
                            "       bench_load --model PATH [--backend B] [--threads N] "
                            "[--reps N]\n");
            return 2;
        }
    }
    if (threads <= 0) threads = kiln_cpu_count();
    if (model) return engine_main(model, backend, threads, reps);
    struct stat sb;
    bool made = false;
    if (stat(path, &sb) != 0) {
        make_gguf(path, gib);
        made = true;
    }
    if (stat(path, &sb) != 0) die("stat");
    const double file_gib = (double)sb.st_size / (1 << 30);
    printf("file %s, %.3f GiB, %d threads, best of %d\n\n", path, file_gib, threads, reps);
    printf("%-34s %10s %10s %12s\n", "measurement", "ms", "GB/s", "cache before");

    double seq = 1e30, cold = 1e30, cold_ur = 1e30, cold_pr = 1e30;
    for (int r = 0; r < reps && !upload_only; r++) {
        uint64_t bytes;
        evict(path);
        double res = resident_fraction(path);
        double s = seq_read(path, &bytes);
        if (s < seq) seq = s;
        if (r == 0)
            printf("%-34s %10.1f %10.2f %11.1f%%\n", "seq read (cold)", s * 1e3,
                   (double)bytes / s * 1e-9, res * 100);

        kiln_load_request req;
        kiln_load_request_init(&req);
        req.threads = threads;
        evict(path);
        res = resident_fraction(path);
        load_result lr = run_load(path, &req, KILN_LANE_ALIAS);
        if (lr.seconds < cold) cold = lr.seconds;
        if (r == 0)
            printf("%-34s %10.1f %10.2f %11.1f%%\n", "cold alias+populate to ready",
                   lr.seconds * 1e3, (double)sb.st_size / lr.seconds * 1e-9, res * 100);

        kiln_load_request_init(&req);
        req.threads = threads;
        req.target_user = "copy";
        req.target_for = bench_target;
        req.io = KILN_IO_URING;
        evict(path);
        res = resident_fraction(path);
        lr = run_load(path, &req, KILN_LANE_TRANSFORM);
        if (lr.seconds < cold_ur) cold_ur = lr.seconds;
        if (r == 0)
            printf("%-34s %10.1f %10.2f %11.1f%%\n", "cold copy via io_uring", lr.seconds * 1e3,
                   (double)sb.st_size / lr.seconds * 1e-9, res * 100);
        req.io = KILN_IO_PREAD;
        evict(path);
        lr = run_load(path, &req, KILN_LANE_TRANSFORM);
        if (lr.seconds < cold_pr) cold_pr = lr.seconds;
        if (r == 0)
            printf("%-34s %10.1f %10.2f %11.1f%%\n", "cold copy via pread", lr.seconds * 1e3,
                   (double)sb.st_size / lr.seconds * 1e-9, res * 100);
    }
    /* warm */
    uint64_t bytes;
    seq_read(path, &bytes);
    double warm = 1e30, warm_lazy = 1e30;
    for (int r = 0; r < reps && !upload_only; r++) {
        kiln_load_request req;
        kiln_load_request_init(&req);
        req.threads = threads;
        load_result lr = run_load(path, &req, KILN_LANE_ALIAS);
        if (lr.seconds < warm) warm = lr.seconds;
        req.populate = false;
        lr = run_load(path, &req, KILN_LANE_ALIAS);
        if (lr.seconds < warm_lazy) warm_lazy = lr.seconds;
    }
    printf("%-34s %10.1f %10s %11.1f%%\n", "warm alias+populate to ready", warm * 1e3, "",
           resident_fraction(path) * 100);
    printf("%-34s %10.1f %10s %11.1f%%\n", "warm alias lazy to ready", warm_lazy * 1e3, "",
           resident_fraction(path) * 100);

    double mc_gbps = memcpy_gbps(threads, false), mc_fresh = memcpy_gbps(threads, true);
    printf("%-34s %10s %10.2f\n", "memcpy (512 MiB)", "", mc_gbps);
    printf("%-34s %10s %10.2f\n", "memcpy into fresh memory (512 MiB)", "", mc_fresh);
    static const char *modes[] = {"copy", "f32", "x4"};
    static const char *labels[] = {"transform identity copy (warm)", "transform f16->f32 (warm)",
                                   "transform blocks_x4 (warm)"};
    double tr[3] = {0, 0, 0};
    for (int m = 0; m < 3; m++) {
        for (int r = 0; r < reps && !upload_only; r++) {
            kiln_load_request req;
            kiln_load_request_init(&req);
            req.threads = threads;
            req.io = KILN_IO_MMAP;
            req.target_user = (void *)modes[m];
            req.target_for = bench_target;
            load_result lr = run_load(path, &req, KILN_LANE_TRANSFORM);
            if (lr.lane_gbps > tr[m]) tr[m] = lr.lane_gbps;
        }
        printf("%-34s %10s %10.2f\n", labels[m], "", tr[m]);
    }
    double up_ratio = -1;
#ifdef KILN_HAVE_CUDA
    if (cuda_dev >= 0) {
        size_t n = (size_t)256 << 20;
        void *h, *d;
        if (cudaSetDevice(cuda_dev) != cudaSuccess || cudaHostAlloc(&h, n, 0) != cudaSuccess ||
            cudaMalloc(&d, n) != cudaSuccess)
            die("CUDA setup failed");
        memset(h, 1, n);
        double best = 0;
        for (int r = 0; r < 5; r++) {
            uint64_t t0 = kiln_now_ns();
            cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
            double s = (double)(kiln_now_ns() - t0) * 1e-9;
            if ((double)n / s * 1e-9 > best) best = (double)n / s * 1e-9;
        }
        cudaFreeHost(h);
        cudaFree(d);
        printf("%-34s %10s %10.2f\n", "pinned H2D cudaMemcpy (256 MiB)", "", best);
        /* the three ways the upload lane's host side can work (KILN_UPLOAD, upload.c) */
        if (!upload_only) upload_anatomy(path, threads, cuda_dev, reps);
        /* the ways the upload lane's host side can work (KILN_UPLOAD*, upload.c) */
        static const struct {
            const char *label, *mode, *threads, *window, *granule, *populate, *stores;
            bool quick; /* run with --upload-only too */
        } up_modes[] = {
            {"pread", "pread", NULL, NULL, NULL, NULL, NULL, false},
            {"stream", "stream", NULL, NULL, NULL, NULL, NULL, true},
            {"stream nt", "stream", NULL, NULL, NULL, NULL, "stream", true},
            {"stream w8 g256", "stream", NULL, "8", "256", NULL, NULL, false},
            {"stream w64", "stream", NULL, "64", NULL, NULL, NULL, false},
            {"stream g256", "stream", NULL, NULL, "256", NULL, NULL, false},
            {"stream w16 g256", "stream", NULL, "16", "256", NULL, NULL, false},
            {"stream madvise", "stream", NULL, NULL, NULL, "madvise", NULL, false},
            {"stream no-populate", "stream", NULL, NULL, NULL, "none", NULL, false},
            {"direct:1", "direct", "1", NULL, NULL, NULL, NULL, false},
        };
        static const char *const up_env[] = {"KILN_UPLOAD",           "KILN_UPLOAD_THREADS",
                                             "KILN_UPLOAD_WINDOW_MB", "KILN_UPLOAD_GRANULE_KB",
                                             "KILN_UPLOAD_POPULATE",  "KILN_UPLOAD_STORES"};
        for (int mo = 0; mo < (int)(sizeof up_modes / sizeof up_modes[0]); mo++) {
            if (upload_only && !up_modes[mo].quick) continue;
            const char *vals[6] = {up_modes[mo].mode,     up_modes[mo].threads,
                                   up_modes[mo].window,   up_modes[mo].granule,
                                   up_modes[mo].populate, up_modes[mo].stores};
            for (int v = 0; v < 6; v++) {
                if (vals[v])
                    setenv(up_env[v], vals[v], 1);
                else
                    unsetenv(up_env[v]);
            }
            double up = 0, up_wall = 1e30, up_plan = 0, up_setup = 0, up_reg = 0, up_fill = 0,
                   up_wait = 0, up_down = 0;
            uint64_t up_direct = 0;
            for (int r = 0; r < reps; r++) {
                kiln_load_request req;
                kiln_load_request_init(&req);
                req.threads = threads;
                req.io = KILN_IO_MMAP;
                req.target.place = KILN_PLACE_CUDA;
                req.target.device = cuda_dev;
                load_result lr = run_load(path, &req, KILN_LANE_UPLOAD);
                if (lr.lane_gbps > up) {
                    up = lr.lane_gbps;
                    up_reg = lr.reg_seconds;
                    up_fill = lr.fill_seconds;
                    up_wait = lr.wait_seconds;
                    up_down = lr.teardown_seconds;
                    up_direct = lr.direct_bytes;
                }
                if (lr.seconds < up_wall) {
                    up_wall = lr.seconds;
                    up_plan = lr.plan_seconds;
                    up_setup = lr.setup_seconds;
                }
            }
            char label[64];
            snprintf(label, sizeof label, "upload lane (warm, %s)", up_modes[mo].label);
            printf("%-34s %10s %10.2f", label, "", up);
            printf("   (%.0f MiB direct, registering %.1f ms; filling %.1f ms, waiting for "
                   "copies %.1f ms, teardown %.1f ms)",
                   (double)up_direct / (1 << 20), up_reg * 1e3, up_fill * 1e3, up_wait * 1e3,
                   up_down * 1e3);
            printf("\n");
            snprintf(label, sizeof label, "upload to ready (%s)", up_modes[mo].label);
            printf("%-34s %10.1f %10.2f   (plan incl. CUDA context %.1f ms, setup %.1f ms)\n",
                   label, up_wall * 1e3, (double)sb.st_size / up_wall * 1e-9, up_plan * 1e3,
                   up_setup * 1e3);
            printf("  upload lane (%s) / pinned H2D %.3f\n", up_modes[mo].label, up / best);
            if (up / best > up_ratio) up_ratio = up / best;
        }
        for (int v = 0; v < 6; v++) unsetenv(up_env[v]);
    }
#else
    if (cuda_dev >= 0) printf("(--cuda ignored: built without CUDA)\n");
#endif
    if (upload_only) {
        if (made && !keep) unlink(path);
        return 0;
    }
    printf("\nratios (targets from issue #3):\n");
    printf("  cold alias to ready / seq read   %.3f   (target <= 1.1)\n", cold / seq);
    printf("  cold io_uring copy / seq read    %.3f\n", cold_ur / seq);
    printf("  cold pread copy / seq read       %.3f\n", cold_pr / seq);
    printf("  warm alias+populate, ms per GiB  %.1f   (target <= 50)\n", warm * 1e3 / file_gib);
    printf("  warm alias lazy, ms per GiB      %.1f\n", warm_lazy * 1e3 / file_gib);
    printf("  transform copy / memcpy          %.3f   (target >= 0.7)\n", tr[0] / mc_gbps);
    printf("  transform copy / fresh memcpy    %.3f\n", tr[0] / mc_fresh);
    printf("  transform f16->f32 / memcpy      %.3f\n", tr[1] / mc_gbps);
    printf("  transform blocks_x4 / memcpy     %.3f\n", tr[2] / mc_gbps);
    if (up_ratio >= 0)
        printf("  upload lane (best way) / pinned H2D %.3f   (target >= 0.8)\n", up_ratio);
    if (made && !keep) unlink(path);
    return 0;
}
