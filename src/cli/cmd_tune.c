/*
 * cmd_tune.c — `kiln tune -m MODEL [--ops OPS] [--tokens LIST] [-t N] [--reps N]
 * [--perfdb PATH]`: measures every valid kernel candidate of every distinct call-site
 * context of the model (real shapes; the model's own weights for matmul) per token bucket,
 * and records median / p95 / variance / samples / warm-up in the PerfDB. Selection reads
 * those timings afterwards (kiln explain shows them).
 */
#include "base/pool.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/kernel_sites.h"
#include "kernels/tune.h"
#include "runtime/kselect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool parse_ops(const char *s, uint32_t *mask) {
    *mask = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        kiln_kop op;
        if (!kiln_kop_from_name(t, &op)) {
            fprintf(stderr, "kiln tune: unknown op '%s'\n", t);
            return false;
        }
        *mask |= 1u << op;
    }
    return true;
}

static bool parse_tokens(const char *s, uint32_t *buckets) {
    *buckets = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *end;
        long v = strtol(t, &end, 10);
        if (*end || v < 1 || v > (1 << 20)) {
            fprintf(stderr, "kiln tune: --tokens: bad count '%s'\n", t);
            return false;
        }
        *buckets |= 1u << kiln_tok_bucket(v);
    }
    return true;
}

/* kiln_tune_device over the env's device (runtime/backend.h's buffer interface). The
 * tuner's allocations of one kernel run are few (< 16) and freed before the next run. */
typedef struct tune_dev {
    kiln_device *dev;
    kiln_buf bufs[16];
} tune_dev;

static kiln_buf *td_find(tune_dev *t, const void *p) {
    for (int i = 0; i < 16; i++) {
        const char *base = t->bufs[i].ptr;
        if (base && (const char *)p >= base && (const char *)p < base + t->bufs[i].size)
            return &t->bufs[i];
    }
    return NULL;
}

static kiln_status td_alloc(void *ctx, size_t bytes, void **ptr, kiln_err *err) {
    tune_dev *t = ctx;
    for (int i = 0; i < 16; i++) {
        if (t->bufs[i].ptr) continue;
        KILN_TRY(kiln_buf_alloc(t->dev, KILN_MEM_DEVICE, bytes, &t->bufs[i], err));
        *ptr = t->bufs[i].ptr;
        return KILN_OK;
    }
    return kiln_err_set(err, KILN_ERR_CAPACITY, "tune: more than 16 device buffers");
}

static void td_free(void *ctx, void *ptr) {
    tune_dev *t = ctx;
    kiln_buf *b = td_find(t, ptr);
    if (b) kiln_buf_free(t->dev, b);
}

static kiln_status td_upload(void *ctx, void *dst, const void *src, size_t bytes, kiln_err *err) {
    tune_dev *t = ctx;
    kiln_buf *b = td_find(t, dst);
    if (!b) return kiln_err_set(err, KILN_ERR_INTERNAL, "tune: upload to an unknown buffer");
    return kiln_buf_h2d(t->dev, b, (size_t)((char *)dst - (char *)b->ptr), src, bytes, err);
}

static kiln_status td_sync(void *ctx, kiln_err *err) {
    return kiln_device_sync(((tune_dev *)ctx)->dev, err);
}

int kiln_cmd_tune(int argc, char **argv) {
    static const kiln_cmd_usage u = {
        "kiln tune -m MODEL [--ops OPS] [--tokens LIST] [options]",
        "Benchmarks the valid kernels of every distinct call site of MODEL on its real shapes "
        "(warm-up, repetitions, median, p95) for the token buckets of LIST (default 1,8,64,512) "
        "and records them in the PerfDB ($XDG_CACHE_HOME/kiln/perfdb.sqlite). Several "
        "processes may tune at once."};
    kiln_opt opts[] = {
        {"model", 'm', true, "MODEL", "model file or short name", false, NULL},
        {"ops", 0, true, "OPS", "comma-separated ops (default: all)", false, NULL},
        {"tokens", 0, true, "LIST", "token counts whose buckets to measure", false, NULL},
        {"threads", 't', true, "N", "threads (default: all CPUs)", false, NULL},
        {"reps", 'r', true, "N", "timed repetitions per kernel (default 10)", false, NULL},
        {"max-seconds", 0, true, "S", "time limit per kernel and bucket (default 2)", false, NULL},
        {"perfdb", 0, true, "PATH", "PerfDB file (default in the cache dir)", false, NULL},
        {"backend", 'b', true, "B", KILN_BACKEND_HELP, false, NULL},
        {"policy", 0, true, "FILE", "policy file", false, NULL},
    };
    const char *pos[4];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, opts, KILN_NOPTS(opts), pos, 4, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;
    if (!opts[0].seen) {
        fprintf(stderr, "kiln tune: -m MODEL is required\n");
        return 2;
    }
    /* default: every op with a standalone benchmark; the fused ops (matmul_group,
     * rope_kv, matmul_argmax) run their members' kernels, which are tuned as such; the
     * sample chain has no benchmark here (bench_cuda_sample measures it) */
    uint32_t ops = ~((1u << KILN_KOP_MATMUL_GROUP) | (1u << KILN_KOP_ROPE_KV) |
                     (1u << KILN_KOP_MATMUL_ARGMAX) | (1u << KILN_KOP_SAMPLE)),
             buckets = 0xf;
    if (opts[1].seen && !parse_ops(opts[1].value, &ops)) return 2;
    if (opts[2].seen && !parse_tokens(opts[2].value, &buckets)) return 2;
    int64_t threads = 0, reps = 10;
    double max_s = 2.0;
    if (!kiln_opt_int(&opts[3], 0, 1024, &threads) || !kiln_opt_int(&opts[4], 3, 100000, &reps) ||
        !kiln_opt_float(&opts[5], 0.01, 3600, &max_s))
        return 2;
    kiln_err err;
    kiln_err_clear(&err);
    kiln_kernel_env env;
    if (kiln_kernel_env_open(&env, opts[0].value, opts[7].value, opts[8].value, opts[6].value,
                             &err))
        return kiln_cli_fail("tune", &err);
    char dbpath[512];
    kiln_perfdb *db = NULL;
    kiln_pool *pool = NULL;
    int status = 0;
    if (opts[6].seen)
        snprintf(dbpath, sizeof dbpath, "%s", opts[6].value);
    else if (kiln_perfdb_default_path(dbpath, sizeof dbpath, &err))
        goto fail;
    if (kiln_perfdb_open(dbpath, &db, &err)) goto fail;
    if (kiln_pool_create((int)threads, &pool, &err)) goto fail;
    /* records are keyed as the device's selector reads them (a GPU: host + GPU model) */
    char dev[512];
    kiln_device_perf_key(&env.dev, dev, sizeof dev);
    tune_dev td = {.dev = &env.dev};
    const kiln_tune_device tdev = {&td,     env.dev.queue, env.dev.impl, td_alloc,
                                   td_free, td_upload,     td_sync};
    const bool on_device = !env.be->host_memory;
    printf("tuning %s on %s, %d threads -> %s\n", env.model->path, on_device ? env.dev.name : dev,
           kiln_pool_size(pool), dbpath);
    printf("%-28s %-9s %-7s %-30s %10s %10s %7s\n", "site", "op", "tokens", "kernel", "median us",
           "p95 us", "samples");
    const kiln_registry *reg = kiln_selector_registry(env.sel);
    int recorded = 0;
    for (int i = 0; i < env.n_sites; i++) {
        const kiln_model_site *ms = &env.sites[i];
        if (!(ops & (1u << ms->site.ctx.op))) continue;
        bool dup = false;
        for (int j = 0; j < i && !dup; j++)
            dup = !memcmp(&env.sites[j].site.ctx, &ms->site.ctx, sizeof ms->site.ctx);
        if (dup) continue;
        for (int tb = 0; tb < KILN_TOK_BUCKETS; tb++) {
            if (!(buckets & (1u << tb))) continue;
            kiln_sel_ctx c = ms->site.ctx;
            int sb =
                c.op == KILN_KOP_ATTENTION ? kiln_seq_bucket(c.seq_max > 0 ? c.seq_max : 4096) : 0;
            if (sb > 1) sb = 1; /* attention: measure <=4K contexts on the host */
            kiln_sel_ctx_set_bucket(&c, tb, sb, 0, c.seq_max);
            for (int ki = 0; ki < reg->n_by_op[c.op]; ki++) {
                const kiln_reg_kernel *k = &reg->kernels[reg->by_op[c.op][ki]];
                if (kiln_select_check(env.sel, k, &c) & KILN_REASONS_HARD) continue;
                kiln_tune_opts to = {.warmup = 2,
                                     .reps = (int)reps,
                                     .max_seconds = max_s,
                                     .pool = pool,
                                     .device = on_device ? &tdev : NULL};
                /* the loaded weight when it is in the layout this kernel reads (the
                 * engine's load plan); else the tuner's own random weights — never a
                 * read of the file behind the plan */
                if (ms->weight && k->spec.w_layout == ms->weight->layout) {
                    to.weights = ms->weight->data;
                    to.w_row_bytes = ms->weight->row_bytes;
                }
                kiln_perf_rec rec;
                kiln_err e2;
                kiln_err_clear(&e2);
                if (kiln_tune_kernel(k, &c, &to, &rec, &e2)) {
                    printf("%-28.28s %-9s %-7s %-30s  failed: %s\n", ms->site.name,
                           kiln_kop_name(c.op), kiln_tok_bucket_name(tb), k->spec.id, e2.msg);
                    continue;
                }
                rec.descriptor_hash = reg->providers[k->provider].descriptor_hash;
                if (kiln_perfdb_put(db, dev, &rec, &err)) goto fail;
                recorded++;
                printf("%-28.28s %-9s %-7s %-30s %10.1f %10.1f %7lld\n", ms->site.name,
                       kiln_kop_name(c.op), kiln_tok_bucket_name(tb), k->spec.id, rec.median_us,
                       rec.p95_us, (long long)rec.samples);
                fflush(stdout);
            }
        }
    }
    printf("%d timings recorded in %s\n", recorded, dbpath);
    goto out;
fail:
    status = kiln_cli_fail("tune", &err);
out:
    kiln_pool_free(pool);
    kiln_perfdb_close(db);
    kiln_kernel_env_close(&env);
    return status;
}
