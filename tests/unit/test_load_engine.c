/* test_load_engine.c — the engine's one load path: for kiln-gen models of every family and
 * many weight types, the bytes every bound weight points at after engine binding (which
 * runs the load plan) equal the generic path computed here: a plain pread of the tensor
 * from the file, then the reference transform (f16/bf16 -> f32 with kiln_ref_row_to_f32,
 * the Gemma +1 fixup, the cpu R16 repack kiln_cpu_r16_repack). Every model with the
 * planned lanes (mmap reader) and the forced residual lane, three of them with every reader
 * (mmap, pread, io_uring; the loader's readers are also covered by test_load.c); the lanes are
 * checked to include alias, transform and residual. A sharded selection (row and column shards of
 * the engine's own request) is compared the same way, shard by shard. kiln-gen comes from
 * KILN_BINARY_DIR; the test skips (saying so) when it is absent. */
#include "format/dtype.h"
#include "format/model_file.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ref/ref.h"
#include "kernels/spec.h"
#include "load/load.h"
#include "model/model.h"
#include "runtime/exec.h"
#include "runtime/kselect.h"
#include "testutil.h"

#include <fnmatch.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char gen_path[1024], tmp_dir[256];
static kiln_device cpu;           /* the cpu backend's device, opened in setup */
static int n_r16, n_f32, n_fixup; /* layouts the checks met */

static int setup(void **state) {
    (void)state;
    const char *bd = getenv("KILN_BINARY_DIR");
    snprintf(gen_path, sizeof gen_path, "%s/kiln-gen", bd ? bd : ".");
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/kiln_test_load_engine_XXXXXX");
    if (!mkdtemp(tmp_dir)) return -1;
    kiln_err e;
    return kiln_device_open(kiln_backend_find("cpu"), 0, &cpu, &e) == KILN_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    kiln_device_close(&cpu);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static bool have_gen(void) {
    return access(gen_path, X_OK) == 0;
}

/* Generates a model; returns its path (static buffer). */
static const char *gen(const char *fam, const char *type, const char *extra, bool hf) {
    static char out[512];
    snprintf(out, sizeof out, "%s/%s-%s%s%s", tmp_dir, fam, type, hf ? "-hf" : ".gguf",
             extra[0] ? "x" : "");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' -q -f %s -t %s %s %s -o '%s'", gen_path, fam, type,
             hf ? "--format hf" : "", extra, out);
    if (system(cmd) != 0) fail_msg("kiln-gen failed: %s", cmd);
    return out;
}

/* The generic path: the stored rows [r0, r1) x bytes [c0, c0 + cb) of tensor t, read with
 * plain pread (or memcpy for a tensor in memory). */
static uint8_t *plain_read(const kiln_model *m, const kiln_tensor_info *t, int64_t r0, int64_t r1,
                           size_t c0, size_t cb) {
    size_t rb;
    assert_int_equal(kiln_dtype_row_bytes(t->dtype, t->shape[0], &rb, NULL), KILN_OK);
    uint8_t *buf = malloc((size_t)(r1 - r0) * cb + 1);
    assert_non_null(buf);
    for (int64_t r = r0; r < r1; r++) {
        uint8_t *d = buf + (size_t)(r - r0) * cb;
        if (t->file == KILN_LOAD_MEMORY) {
            memcpy(d, (const uint8_t *)t->data + (size_t)r * rb + c0, cb);
            continue;
        }
        const kiln_model_shard *sh = kiln_model_file_shard(m->file, t->file);
        ssize_t got = pread(sh->fd, d, cb, (off_t)(t->offset + (uint64_t)r * rb + c0));
        assert_int_equal((size_t)got, cb);
    }
    return buf;
}

/* The reference transform of n rows of k elements (plain bytes in) to layout `lay`. */
static uint8_t *reference(uint32_t dtype, uint32_t fixup, const char *lay, const uint8_t *plain,
                          int64_t n, int64_t k, size_t *out_bytes) {
    size_t rb;
    assert_int_equal(kiln_dtype_row_bytes(dtype, k, &rb, NULL), KILN_OK);
    if (strcmp(lay, "f32") == 0) {
        float *f = malloc((size_t)(n * k) * sizeof(float) + 1);
        assert_non_null(f);
        for (int64_t r = 0; r < n; r++) {
            assert_int_equal(kiln_ref_row_to_f32(dtype, plain + (size_t)r * rb, f + r * k, k),
                             KILN_OK);
            if (fixup == KILN_FIXUP_ADD_ONE)
                for (int64_t i = 0; i < k; i++) f[r * k + i] += 1.0f;
        }
        *out_bytes = (size_t)(n * k) * sizeof(float);
        return (uint8_t *)f;
    }
    if (strcmp(lay, "cpu_r16") == 0) {
        size_t sz;
        assert_int_equal(kiln_cpu_r16_size(dtype, n, k, &sz, NULL), KILN_OK);
        uint8_t *o = malloc(sz);
        assert_non_null(o);
        assert_int_equal(kiln_cpu_r16_repack(dtype, plain, rb, n, k, o, NULL), KILN_OK);
        *out_bytes = sz;
        return o;
    }
    assert_string_equal(lay, "native");
    uint8_t *o = malloc((size_t)n * rb + 1);
    assert_non_null(o);
    memcpy(o, plain, (size_t)n * rb);
    *out_bytes = (size_t)n * rb;
    return o;
}

/* Every planned item equals the generic path (sharded per the request). */
static void check_items(const kiln_model *m, const kiln_load_plan *lp, const kiln_load_request *rq,
                        int *lanes_seen) {
    for (size_t i = 0; i < kiln_load_plan_count(lp); i++) {
        const kiln_load_item *it = kiln_load_plan_item(lp, i);
        const kiln_tensor_info *t = it->src;
        lanes_seen[it->lane]++;
        n_r16 += strcmp(it->layout->name, "cpu_r16") == 0;
        n_f32 += strcmp(it->layout->name, "f32") == 0;
        n_fixup += t->fixup == KILN_FIXUP_ADD_ONE;
        assert_true(it->done);
        int64_t k = t->shape[0], n = t->rank > 1 ? t->shape[1] : 1;
        size_t rb;
        assert_int_equal(kiln_dtype_row_bytes(t->dtype, k, &rb, NULL), KILN_OK);
        int64_t r0 = 0, r1 = n * (t->rank > 2 ? t->shape[2] : 1) * (t->rank > 3 ? t->shape[3] : 1);
        size_t c0 = 0, cb = rb;
        if (rq->shard != KILN_SHARD_NONE && t->rank == 2 &&
            (!rq->shard_pattern || fnmatch(rq->shard_pattern, t->name, 0) == 0)) {
            if (rq->shard == KILN_SHARD_ROWS) {
                r0 = n / rq->shard_count * rq->shard_index;
                r1 = r0 + n / rq->shard_count;
            } else {
                cb = rb / (size_t)rq->shard_count;
                c0 = cb * (size_t)rq->shard_index;
                k /= rq->shard_count;
            }
        }
        uint8_t *plain = plain_read(m, t, r0, r1, c0, cb);
        size_t want_bytes;
        uint8_t *want =
            reference(t->dtype, t->fixup, it->layout->name, plain, r1 - r0, k, &want_bytes);
        assert_true(it->nbytes >= want_bytes);
        if (memcmp(it->data, want, want_bytes) != 0)
            fail_msg("tensor '%s' (lane %s, layout %s): bytes differ from the generic path",
                     t->name, kiln_lane_name(it->lane), it->layout->name);
        free(plain);
        free(want);
    }
}

/* Every bound weight's data is the planned item's (the kernels see those bytes). */
static void check_bound(const kiln_bound_plan *bp) {
    const kiln_plan *p = &bp->plan;
    int bound = 0;
    for (int32_t i = 0; i < p->n_insns; i++)
        for (int k = 0; k < KILN_PLAN_MAX_WEIGHTS; k++) {
            if (p->insns[i].w[k] == KILN_PLAN_NO_WEIGHT) continue;
            const kiln_bound_weight *w = &bp->bi[i].w[k];
            assert_non_null(w->data);
            bool found = false;
            for (size_t j = 0; j < kiln_load_plan_count(bp->load) && !found; j++)
                found = kiln_load_plan_item(bp->load, j)->data == w->data;
            if (!found)
                fail_msg("weight %s is not a load plan item", p->weights[p->insns[i].w[k]].name);
            bound++;
        }
    assert_true(bound > 0);
}

static bool uring_ok(void) {
    struct io_uring ring;
    if (io_uring_queue_init(4, &ring, 0) != 0) return false;
    io_uring_queue_exit(&ring);
    return true;
}

static void check_model(const char *path, bool all_readers, int *lanes_seen) {
    kiln_model *m;
    kiln_err e;
    if (kiln_model_load(path, &m, &e)) fail_msg("%s: %s", path, e.msg);
    const kiln_io ios[] = {KILN_IO_MMAP, KILN_IO_PREAD, KILN_IO_URING};
    for (int io = 0; io < 3; io++) {
        if (ios[io] == KILN_IO_URING && !uring_ok()) continue;
        if (!all_readers && ios[io] != KILN_IO_MMAP) continue; /* keep the test fast */
        for (int forced = -1; forced <= KILN_LANE_RESIDUAL; forced += 1 + KILN_LANE_RESIDUAL) {
            kiln_load_request rq;
            kiln_load_request_init(&rq);
            rq.io = ios[io];
            rq.force_lane = forced;
            rq.threads = 2;
            kiln_plan plan;
            kiln_plan_init(&plan);
            assert_int_equal(m->family->compile(&m->cfg, KILN_MODE_PREFILL, &plan, &e), KILN_OK);
            kiln_bound_plan bp;
            if (kiln_bind_plan_load(&cpu, m, &plan, NULL, &rq, &bp, NULL, &e))
                fail_msg("%s: bind (io %s, forced %d): %s", path, kiln_io_name(ios[io]), forced,
                         e.msg);
            check_items(m, bp.load, &rq, lanes_seen);
            check_bound(&bp);
            kiln_bound_plan_free(&bp);
        }
    }
    /* sharded selections of the engine's own request: rows and columns, both halves */
    for (int mode = KILN_SHARD_ROWS; mode <= KILN_SHARD_COLS; mode++)
        for (int idx = 0; idx < 2; idx++) {
            kiln_plan plan;
            kiln_plan_init(&plan);
            assert_int_equal(m->family->compile(&m->cfg, KILN_MODE_PREFILL, &plan, &e), KILN_OK);
            kiln_bound_plan bp;
            assert_int_equal(kiln_bind_select(&cpu, m, &plan, NULL, &bp, NULL, &e), KILN_OK);
            kiln_load_request rq;
            kiln_load_request_init(&rq);
            rq.shard = (kiln_shard_mode)mode;
            rq.shard_count = 2;
            rq.shard_index = idx;
            rq.threads = 2;
            kiln_load_plan *lp;
            kiln_status st = kiln_bind_load_plan(&bp, m, &rq, &lp, &e);
            if (st == KILN_ERR_UNSUPPORTED && mode == KILN_SHARD_COLS) {
                /* 256-element blocks: rows of the tiny preset's width do not split into
                 * whole blocks; shard the wider ffn_down rows only */
                rq.shard_pattern = "blk.*.ffn_down.weight";
                st = kiln_bind_load_plan(&bp, m, &rq, &lp, &e);
            }
            if (st) fail_msg("%s: shard plan: %s", path, e.msg);
            if (kiln_load_execute(lp, &e)) fail_msg("%s: shard load: %s", path, e.msg);
            check_items(m, lp, &rq, lanes_seen);
            kiln_load_plan_free(lp);
            kiln_bound_plan_free(&bp);
        }
    kiln_model_free(m);
}

static void test_engine_bytes(void **state) {
    (void)state;
    if (!have_gen()) {
        printf("skipping: %s not built (cmake --build build --target kiln-gen)\n", gen_path);
        skip();
    }
    int lanes[KILN_LANE_COUNT] = {0};
    static const char *types[] = {"f32",  "f16",  "bf16", "q8_0", "q4_0", "q4_1", "q5_0",
                                  "q5_1", "q4_K", "q5_K", "q6_K", "q2_K", "q3_K"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        check_model(gen("llama", types[i], "", false), strcmp(types[i], "q4_K") == 0, lanes);
    /* untied head with a vocabulary that is not a multiple of 16 (padded R16 group) */
    check_model(gen("qwen2", "q8_0", "--n-vocab 1000 --tied 0", false), true, lanes);
    check_model(gen("qwen3", "q4_K", "", false), false, lanes);
    check_model(gen("gemma3", "q4_0", "", false), false, lanes);
    /* HF: bf16 norms with the Gemma +1 fixup, sharded files */
    check_model(gen("gemma3", "bf16", "", true), true, lanes);
    check_model(gen("llama", "f16", "", true), false, lanes);
    assert_true(lanes[KILN_LANE_ALIAS] > 0);
    assert_true(lanes[KILN_LANE_TRANSFORM] > 0);
    assert_true(lanes[KILN_LANE_RESIDUAL] > 0);
    assert_true(n_r16 > 0 && n_f32 > 0 && n_fixup > 0);
}

/* The engine binds a model built from tensors in memory through the same plan (memory
 * tensors: alias by pointer, transform from memory). */
static void test_memory_model(void **state) {
    (void)state;
    if (!have_gen()) {
        printf("skipping: %s not built\n", gen_path);
        skip();
    }
    kiln_model *fm;
    kiln_err e;
    const char *path = gen("llama", "q8_0", "", false);
    assert_int_equal(kiln_model_load(path, &fm, &e), KILN_OK);
    kiln_model_file *mf = fm->file;
    /* the same tensors, as memory */
    kiln_tensor *ts = calloc((size_t)fm->n_tensors, sizeof *ts);
    assert_non_null(ts);
    for (int32_t i = 0; i < fm->n_tensors; i++) {
        ts[i] = fm->tensors[i];
        ts[i].data = kiln_model_file_find_tensor(mf, ts[i].name)->data;
    }
    kiln_model *mm;
    assert_int_equal(kiln_model_from_tensors(&fm->cfg, ts, fm->n_tensors, &mm, &e), KILN_OK);
    int lanes[KILN_LANE_COUNT] = {0};
    kiln_plan plan;
    kiln_plan_init(&plan);
    assert_int_equal(mm->family->compile(&mm->cfg, KILN_MODE_PREFILL, &plan, &e), KILN_OK);
    kiln_bound_plan bp;
    kiln_load_request rq;
    kiln_load_request_init(&rq);
    if (kiln_bind_plan_load(&cpu, mm, &plan, NULL, &rq, &bp, NULL, &e))
        fail_msg("memory model: %s", e.msg);
    check_items(mm, bp.load, &rq, lanes);
    check_bound(&bp);
    assert_true(lanes[KILN_LANE_ALIAS] > 0);
    kiln_bound_plan_free(&bp);
    kiln_model_free(mm);
    free(ts);
    kiln_model_free(fm);
}

/* The circuit breaker replaces a kernel that read an R16 weight with one that reads plain
 * rows: the missing layout is loaded through the loader (no read behind the plan), and
 * the weight's bytes are the file's rows. */
static void test_breaker_relayout(void **state) {
    (void)state;
    if (!have_gen()) {
        printf("skipping: %s not built\n", gen_path);
        skip();
    }
    kiln_err e;
    kiln_model *m;
    assert_int_equal(kiln_model_load(gen("llama", "q4_0", "", false), &m, &e), KILN_OK);
    kiln_plan plan;
    kiln_plan_init(&plan);
    assert_int_equal(m->family->compile(&m->cfg, KILN_MODE_PREFILL, &plan, &e), KILN_OK);
    kiln_bound_plan bp;
    assert_int_equal(kiln_bind_plan_load(&cpu, m, &plan, NULL, NULL, &bp, NULL, &e), KILN_OK);
    int32_t fi = -1;
    int fs = -1;
    for (int32_t i = 0; i < bp.plan.n_insns && fi < 0; i++)
        for (int s = 0; s < bp.bi[i].n_sites && fi < 0; s++) {
            const kiln_site *st = &bp.bi[i].site[s];
            if (st->widx >= 0 && st->desc.op == KILN_KOP_MATMUL &&
                bp.bi[i].w[st->widx].layout == KILN_WLAYOUT_CPU_R16)
                fi = i, fs = s;
        }
    if (fi < 0) {
        printf("skipping: the cpu backend chose no R16 kernel on this machine\n");
        kiln_bound_plan_free(&bp);
        kiln_model_free(m);
        skip();
    }
    kiln_err fail;
    kiln_err_set(&fail, KILN_ERR_DEVICE, "simulated");
    if (kiln_plan_kernel_failed(&bp, fi, fs, 0, &fail, &e)) fail_msg("breaker: %s", e.msg);
    const kiln_site *st = &bp.bi[fi].site[fs];
    const kiln_bound_weight *w = &bp.bi[fi].w[st->widx];
    for (int b = 0; b < KILN_BUCKETS; b++)
        assert_true(st->layout[b] == w->layout || w->layout == KILN_WLAYOUT_PLAIN);
    if (w->layout == KILN_WLAYOUT_PLAIN) {
        const char *name = bp.plan.weights[bp.plan.insns[fi].w[st->widx]].name;
        const kiln_tensor_info *t = kiln_model_file_find_tensor(m->file, name);
        uint8_t *plain =
            plain_read(m, t, 0, t->shape[1], 0, (size_t)t->nbytes / (size_t)t->shape[1]);
        assert_memory_equal(w->data, plain, (size_t)t->nbytes);
        free(plain);
        assert_true(bp.n_extra >= 1);
        printf("breaker: '%s' reloaded as plain rows through the loader\n", name);
    } else {
        printf("breaker: the replacement kernel reads R16 too (no reload needed)\n");
    }
    kiln_bound_plan_free(&bp);
    kiln_model_free(m);
    assert_int_equal(kiln_runtime_selector_configure(NULL, "/nonexistent/perf.sqlite", NULL, &e),
                     KILN_OK); /* health bits back for other tests */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_bytes),
        cmocka_unit_test(test_memory_model),
        cmocka_unit_test(test_breaker_relayout),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
