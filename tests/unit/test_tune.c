/* test_tune.c — kiln_tune_kernel: host kernels on random weights in the layout they ask for
 * (plain and R16), and a device kernel measured through kiln_tune_device: every input
 * copied into a device allocation first, the kernel handed only device addresses, the
 * stream and device state, every allocation freed; a device kernel without a device is
 * refused with a message. The "device" here is host memory behind the interface, so the
 * test runs everywhere; the CUDA kernels themselves are tuned on a GPU by
 * scripts/gpu-round.sh's `tune` step. */
#include "base/cpu.h"
#include "kernels/registry.h"
#include "kernels/tune.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a fake device: host allocations it records ---- */
#define FD_MAX 32
typedef struct fake_dev {
    void *p[FD_MAX];
    size_t sz[FD_MAX];
    int n_alloc, n_free, n_upload, n_sync;
} fake_dev;

static fake_dev fd; /* the test's device (one test at a time) */
static int stream_tag, impl_tag;

static kiln_status fd_alloc(void *ctx, size_t bytes, void **ptr, kiln_err *err) {
    fake_dev *d = ctx;
    if (d->n_alloc >= FD_MAX) return kiln_err_set(err, KILN_ERR_CAPACITY, "fake: full");
    void *p = malloc(bytes);
    if (!p) return kiln_err_set(err, KILN_ERR_NOMEM, "fake: malloc");
    memset(p, 0xA5, bytes); /* never the host's contents until uploaded */
    d->p[d->n_alloc] = p;
    d->sz[d->n_alloc++] = bytes;
    *ptr = p;
    return KILN_OK;
}

static void fd_free(void *ctx, void *ptr) {
    fake_dev *d = ctx;
    for (int i = 0; i < d->n_alloc; i++)
        if (d->p[i] == ptr) {
            free(ptr);
            d->p[i] = NULL;
            d->n_free++;
        }
}

static bool in_device(const void *p, size_t bytes) {
    for (int i = 0; i < fd.n_alloc; i++) {
        const char *b = fd.p[i];
        if (b && (const char *)p >= b && (const char *)p + bytes <= b + fd.sz[i]) return true;
    }
    return false;
}

static kiln_status fd_upload(void *ctx, void *dst, const void *src, size_t bytes, kiln_err *err) {
    fake_dev *d = ctx;
    if (!in_device(dst, bytes)) return kiln_err_set(err, KILN_ERR_RANGE, "fake: upload outside");
    memcpy(dst, src, bytes);
    d->n_upload++;
    return KILN_OK;
}

static kiln_status fd_sync(void *ctx, kiln_err *err) {
    (void)err;
    ((fake_dev *)ctx)->n_sync++;
    return KILN_OK;
}

static int dev_calls;

/* a "device" matmul: checks it gets device addresses, the stream and state, then runs
 * the ref kernel on them (host memory behind the fake interface) */
static kiln_status dev_mm(const kiln_kctx *c, const kiln_matmul_args *a) {
    if (c->stream != &stream_tag || c->dev != &impl_tag) return KILN_ERR_INTERNAL;
    size_t rb = a->w_row_bytes;
    if (!in_device(a->w, rb * (size_t)a->n) ||
        !in_device(a->x, sizeof(float) * (size_t)(a->t * a->k)) ||
        !in_device(a->y, sizeof(float) * (size_t)(a->t * a->n)))
        return KILN_ERR_RANGE;
    dev_calls++;
    for (int64_t i = 0; i < a->t * a->k; i++) /* uploaded: random in [-1, 1], not 0xA5.. */
        if (!(a->x[i] >= -1.0f && a->x[i] <= 1.0f)) return KILN_ERR_FORMAT;
    return KILN_OK;
}

static const kiln_reg_kernel *find(const kiln_registry *r, const char *id) {
    for (int i = 0; i < r->n_kernels; i++)
        if (!strcmp(r->kernels[i].spec.id, id)) return &r->kernels[i];
    return NULL;
}

static kiln_sel_ctx mm_ctx(kiln_backend_id be, uint32_t dtype, int64_t n, int64_t k, int tb) {
    kiln_sel_ctx c;
    kiln_sel_ctx_init(&c, KILN_KOP_MATMUL, be);
    c.w_dtype = dtype;
    c.act_dtype = KILN_DTYPE_F32;
    c.n = n;
    c.k = k;
    kiln_sel_ctx_set_bucket(&c, tb, 0, 0, 0);
    return c;
}

static void test_host_layouts(void **state) {
    (void)state;
    const kiln_registry *r = kiln_registry_default();
    const char *ids[] = {"ref.matmul", "cpu.avx2.matmul.r16", "cpu.avx512.matmul.r16"};
    int measured = 0;
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        const kiln_reg_kernel *k = find(r, ids[i]);
        if (!k || !k->spec.fn.any || !r->providers[k->provider].available) continue;
        if ((k->spec.isa & kiln_cpu_info()->isa) != k->spec.isa) continue; /* not this CPU */
        for (int tb = 0; tb < 3; tb++) {
            /* 40 rows: R16's last group padded; k 512: two q4_K superblocks */
            kiln_sel_ctx c = mm_ctx(KILN_BACKEND_CPU, KILN_DTYPE_Q4_K, 40, 512, tb);
            kiln_tune_opts o = {.warmup = 1, .reps = 3, .max_seconds = 5};
            kiln_perf_rec rec;
            kiln_err e;
            kiln_err_clear(&e);
            kiln_status st = kiln_tune_kernel(k, &c, &o, &rec, &e);
            if (st) fprintf(stderr, "%s: %s\n", ids[i], e.msg);
            assert_int_equal(st, KILN_OK);
            assert_true(rec.samples >= 3);
            assert_true(rec.median_us > 0 && rec.p95_us >= rec.median_us);
            assert_string_equal(rec.kernel_id, ids[i]);
            measured++;
        }
    }
    assert_true(measured >= 3); /* ref at least */
}

static void test_device_kernel(void **state) {
    (void)state;
    kiln_reg_kernel k;
    memset(&k, 0, sizeof k);
    k.spec.id = "fake.dev.matmul";
    k.spec.op = KILN_KOP_MATMUL;
    k.spec.platform = KILN_PLATFORM_CUDA;
    k.spec.fn.matmul = dev_mm;
    kiln_sel_ctx c = mm_ctx(KILN_BACKEND_CUDA, KILN_DTYPE_Q8_0, 48, 256, 2);
    kiln_perf_rec rec;
    kiln_err e;
    kiln_err_clear(&e);
    /* no device: refused, saying why */
    kiln_tune_opts o = {.warmup = 1, .reps = 3, .max_seconds = 5};
    assert_int_equal(kiln_tune_kernel(&k, &c, &o, &rec, &e), KILN_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "no device"));
    /* through the device interface */
    memset(&fd, 0, sizeof fd);
    dev_calls = 0;
    const kiln_tune_device dv = {&fd,     &stream_tag, &impl_tag, fd_alloc,
                                 fd_free, fd_upload,   fd_sync};
    o.device = &dv;
    kiln_err_clear(&e);
    kiln_status st = kiln_tune_kernel(&k, &c, &o, &rec, &e);
    if (st) fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(st, KILN_OK);
    assert_true(fd.n_alloc >= 3 && fd.n_upload == fd.n_alloc);
    assert_int_equal(fd.n_free, fd.n_alloc); /* nothing left on the device */
    assert_int_equal(rec.samples, 3);
    /* warm-up: one call; each sample a batch of calls and one wait */
    assert_int_equal(dev_calls, 1 + 3 * KILN_TUNE_DEVICE_BATCH);
    assert_int_equal(fd.n_sync, 1 /* mirror */ + 1 + 3);
    /* a failing device call: its status and the kernel named, all freed */
    memset(&fd, 0, sizeof fd);
    impl_tag = 0;
    const kiln_tune_device bad = {&fd, &stream_tag, NULL, fd_alloc, fd_free, fd_upload, fd_sync};
    o.device = &bad;
    kiln_err_clear(&e);
    assert_int_equal(kiln_tune_kernel(&k, &c, &o, &rec, &e), KILN_ERR_INTERNAL);
    assert_non_null(strstr(e.msg, "fake.dev.matmul"));
    assert_int_equal(fd.n_free, fd.n_alloc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_layouts),
        cmocka_unit_test(test_device_kernel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
