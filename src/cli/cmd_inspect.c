/*
 * cmd_inspect.c — `kiln inspect [--load] [--json] -m MODEL` (or MODEL as an argument):
 * the model's source, metadata and tensor table. With --load, the load plan the engine
 * would execute for --backend (built by the engine's own functions: kiln_bind_select then
 * kiln_bind_load_plan, runtime/exec.h), printed as a report (lanes, tensors, bytes, why;
 * environment facts); --execute runs it and adds the measurements. --layout, --cuda or
 * --copy instead plan the whole file with one target (a probe of the loader's lanes, not
 * what the engine loads).
 */
#include "base/utf8.h"
#include "base/mem.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "format/dtype.h"
#include "format/model_file.h"
#include "load/load.h"
#include "model/model.h"
#include "runtime/exec.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void shape_str(const kiln_tensor_info *t, char *buf, size_t n) {
    int o = snprintf(buf, n, "[");
    int rank = t->rank > 0 ? t->rank : 1;
    for (int d = 0; d < rank && o < (int)n; d++)
        o += snprintf(buf + o, n - (size_t)o, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (o < (int)n) snprintf(buf + o, n - (size_t)o, "]");
}

static void print_text(const kiln_model_file *mf, bool all_meta) {
    const kiln_meta *m = kiln_model_file_meta(mf);
    printf("model: %s\n", kiln_model_file_path(mf));
    printf("source: %s", kiln_model_source_name(kiln_model_file_source(mf)));
    size_t ns = kiln_model_file_shard_count(mf);
    printf(" (%zu file%s", ns, ns == 1 ? "" : "s");
    if (ns) {
        const kiln_model_shard *s0 = kiln_model_file_shard(mf, 0);
        printf(", data at offset %llu, alignment %u", (unsigned long long)s0->data_offset,
               s0->alignment);
    }
    printf(")\narchitecture: %s\n", kiln_model_file_arch(mf)[0] ? kiln_model_file_arch(mf) : "?");
    if (kiln_model_file_tokenizer_json(mf))
        printf("tokenizer.json: %s\n", kiln_model_file_tokenizer_json(mf));
    printf("\nmetadata (%zu keys):\n", kiln_meta_count(m));
    for (size_t i = 0; i < kiln_meta_count(m); i++) {
        const kiln_meta_entry *e = kiln_meta_at(m, i);
        char val[512];
        kiln_meta_value_fmt(&e->value, val, sizeof val, all_meta ? 400 : 60);
        const char *type =
            e->value.type == KILN_META_ARRAY ? "array" : kiln_meta_type_name(e->value.type);
        printf("  %-48.*s %-7s %s", (int)e->key.len, e->key.ptr, type, val);
        /* the first elements of short numeric/string arrays */
        if (e->value.type == KILN_META_ARRAY && e->value.count &&
            e->value.elem_type != KILN_META_ARRAY) {
            uint64_t show = e->value.count < 4 ? e->value.count : 4;
            printf(" = [");
            for (uint64_t k = 0; k < show; k++) {
                kiln_str s;
                double d;
                if (kiln_meta_arr_str(&e->value, k, &s)) {
                    kiln_meta_value sv = {.type = KILN_META_STRING};
                    sv.v.s = s;
                    char b[64];
                    kiln_meta_value_fmt(&sv, b, sizeof b, 20);
                    printf("%s%s", k ? ", " : "", b);
                } else if (kiln_meta_arr_f64(&e->value, k, &d)) {
                    printf("%s%.6g", k ? ", " : "", d);
                } else {
                    bool b;
                    if (kiln_meta_arr_bool(&e->value, k, &b))
                        printf("%s%s", k ? ", " : "", b ? "true" : "false");
                }
            }
            printf("%s]", show < e->value.count ? ", ..." : "");
        }
        printf("\n");
    }
    size_t nt = kiln_model_file_tensor_count(mf);
    printf("\ntensors (%zu, %.2f MiB):\n", nt,
           (double)kiln_model_file_tensor_bytes(mf) / (1 << 20));
    printf("  %-40s %-8s %-24s %5s %14s %12s\n", "name", "dtype", "shape", "file", "offset",
           "bytes");
    for (size_t i = 0; i < nt; i++) {
        const kiln_tensor_info *t = kiln_model_file_tensor(mf, i);
        char sh[96];
        shape_str(t, sh, sizeof sh);
        printf("  %-40s %-8s %-24s %5u %14llu %12llu%s%s\n", t->name, kiln_dtype_name(t->dtype), sh,
               t->file, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
               t->supported ? "" : "  (unsupported type)",
               t->fixup == KILN_FIXUP_ADD_ONE ? "  (+1 on load)" : "");
    }
}

/* A JSON string; bytes that are not valid UTF-8 become U+FFFD (JSON text must be UTF-8). */
static json_t *str_json(const char *p, size_t n) {
    json_t *j = json_stringn(p, n);
    if (j) return j;
    char *buf = kiln_malloc(n * 3 + 1);
    if (!buf) return json_null();
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = kiln_utf8_decode((const uint8_t *)p + i, n - i, &cp);
        o += (size_t)kiln_utf8_encode(cp, buf + o);
        i += (size_t)(k > 0 ? k : -k);
    }
    j = json_stringn(buf, o);
    kiln_free(buf);
    return j ? j : json_null();
}

static json_t *meta_json_value(const kiln_meta_value *v, int depth) {
    switch (v->type) {
    case KILN_META_STRING:
        return str_json(v->v.s.ptr, v->v.s.len);
    case KILN_META_BOOL:
        return json_boolean(v->v.b);
    case KILN_META_F32:
    case KILN_META_F64:
        return json_real(v->v.f);
    case KILN_META_ARRAY: {
        /* long arrays (vocabularies) are summarized */
        if (v->count > 64 || depth > 4)
            return json_pack("{s:s, s:I}", "array_of", kiln_meta_type_name(v->elem_type), "count",
                             (json_int_t)v->count);
        json_t *a = json_array();
        for (uint64_t i = 0; a && i < v->count; i++) {
            kiln_str s;
            int64_t x;
            double d;
            bool b;
            if (kiln_meta_arr_str(v, i, &s))
                json_array_append_new(a, str_json(s.ptr, s.len));
            else if (kiln_meta_arr_item(v, i))
                json_array_append_new(a, meta_json_value(kiln_meta_arr_item(v, i), depth + 1));
            else if (kiln_meta_arr_bool(v, i, &b))
                json_array_append_new(a, json_boolean(b));
            else if (v->elem_type != KILN_META_F32 && v->elem_type != KILN_META_F64 &&
                     kiln_meta_arr_i64(v, i, &x))
                json_array_append_new(a, json_integer(x));
            else if (kiln_meta_arr_f64(v, i, &d))
                json_array_append_new(a, json_real(d));
            else
                json_array_append_new(a, json_null());
        }
        return a;
    }
    default: {
        int64_t x;
        uint64_t u;
        if (kiln_meta_value_i64(v, &x, "", NULL) == KILN_OK) return json_integer(x);
        if (kiln_meta_value_u64(v, &u, "", NULL) == KILN_OK) return json_real((double)u);
        return json_null();
    }
    }
}

static json_t *model_json(const kiln_model_file *mf) {
    json_t *root = json_object(), *meta = json_object(), *tensors = json_array();
    if (!root || !meta || !tensors) return NULL;
    json_object_set_new(root, "model", json_string(kiln_model_file_path(mf)));
    json_object_set_new(root, "source",
                        json_string(kiln_model_source_name(kiln_model_file_source(mf))));
    json_object_set_new(root, "architecture", json_string(kiln_model_file_arch(mf)));
    json_object_set_new(root, "files", json_integer((json_int_t)kiln_model_file_shard_count(mf)));
    const char *tj = kiln_model_file_tokenizer_json(mf);
    json_object_set_new(root, "tokenizer_json", tj ? json_string(tj) : json_null());
    const kiln_meta *m = kiln_model_file_meta(mf);
    for (size_t i = 0; i < kiln_meta_count(m); i++) {
        const kiln_meta_entry *e = kiln_meta_at(m, i);
        char key[1024];
        snprintf(key, sizeof key, "%.*s", (int)e->key.len, e->key.ptr);
        json_object_set_new(meta, key, meta_json_value(&e->value, 0));
    }
    json_object_set_new(root, "metadata", meta);
    for (size_t i = 0; i < kiln_model_file_tensor_count(mf); i++) {
        const kiln_tensor_info *t = kiln_model_file_tensor(mf, i);
        json_t *shape = json_array();
        for (int d = 0; d < (t->rank > 0 ? t->rank : 1); d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        json_array_append_new(tensors,
                              json_pack("{s:s, s:s, s:s, s:o, s:i, s:I, s:I, s:b}", "name", t->name,
                                        "stored_name", kiln_model_file_tensor_src_name(mf, i),
                                        "dtype", kiln_dtype_name(t->dtype), "shape", shape, "file",
                                        (int)t->file, "offset", (json_int_t)t->offset, "bytes",
                                        (json_int_t)t->nbytes, "supported", t->supported));
    }
    json_object_set_new(root, "tensors", tensors);
    return root;
}

int kiln_cmd_inspect(int argc, char **argv) {
    static const kiln_cmd_usage u = {
        "kiln inspect [options] -m MODEL   (or: kiln inspect [options] MODEL)",
        "Print a model's source, metadata and tensor table (GGUF file, .safetensors file, or a "
        "safetensors directory). With --load, print the load plan the engine would execute for "
        "--backend (lanes, tensors, bytes, reasons); --execute also runs it and reports times and "
        "GB/s. --layout, --cuda or --copy plan the whole file with one target instead."};
    kiln_opt opts[] = {
        {"model", 'm', true, "MODEL", "model path or short name (gemma3-270m)", false, NULL},
        {"load", 0, false, NULL, "load the model and print the load report", false, NULL},
        {"json", 0, false, NULL, "JSON output", false, NULL},
        {"verbose", 'v', false, NULL, "with --load: every tensor's lane and reason", false, NULL},
        {"layout", 0, true, "L",
         "with --load: target layout for every tensor (native, f32, f16, "
         "bf16, blocks_x4)",
         false, NULL},
        {"io", 0, true, "IO", "with --load: reader auto|mmap|pread|io_uring", false, NULL},
        {"threads", 't', true, "N", "with --load: threads (default: all cores)", false, NULL},
        {"cuda", 0, true, "DEV", "with --load: upload every tensor to CUDA device DEV", false,
         NULL},
        {"no-populate", 0, false, NULL, "with --load: leave aliased pages to fault in on use",
         false, NULL},
        {"all", 0, false, NULL, "print long metadata strings in full (up to 400 bytes)", false,
         NULL},
        {"copy", 0, false, NULL, "with --load: copy into owned memory instead of aliasing", false,
         NULL},
        {"backend", 0, true, "B", "with --load: the engine's plan for backend B (default auto)",
         false, NULL},
        {"execute", 0, false, NULL, "with --load: run the plan and report what it did", false,
         NULL},
        {"no-huge-pages", 0, false, NULL, "with --load: owned memory in 4 KiB pages", false, NULL},
    };
    const char *pos[2];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, opts, KILN_NOPTS(opts), pos, 1, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;
    const char *model = opts[0].seen ? opts[0].value : n_pos ? pos[0] : NULL;
    if (!model || (opts[0].seen && n_pos)) {
        fprintf(stderr, "kiln inspect: give the model once, as -m MODEL or as an argument\n");
        kiln_args_usage(&u, opts, KILN_NOPTS(opts), true);
        return 2;
    }
    kiln_err err;
    kiln_err_clear(&err);
    char path[PATH_MAX];
    if (kiln_resolve_model(model, path, sizeof path, &err)) return kiln_cli_fail("inspect", &err);

    kiln_load_request req;
    kiln_load_request_init(&req);
    if (opts[4].seen) req.target.layout = opts[4].value;
    if (opts[5].seen) {
        static const char *ios[] = {"auto", "mmap", "pread", "io_uring"};
        int k = -1;
        for (int i = 0; i < 4; i++)
            if (strcmp(opts[5].value, ios[i]) == 0) k = i;
        if (k < 0) {
            fprintf(stderr, "kiln: --io: expected auto, mmap, pread or io_uring\n");
            return 2;
        }
        req.io = (kiln_io)k;
    }
    int64_t v = 0;
    if (!kiln_opt_int(&opts[6], 1, 4096, &v)) return 2;
    req.threads = (int)v;
    if (opts[7].seen) {
        int64_t dev = 0;
        if (!kiln_opt_int(&opts[7], 0, 64, &dev)) return 2;
        req.target.place = KILN_PLACE_CUDA;
        req.target.device = (int)dev;
    }
    if (opts[8].seen) req.populate = false;
    if (opts[10].seen) req.target.writable = true;
    if (opts[13].seen) req.huge_pages = false;
    const bool load = opts[1].seen, json = opts[2].seen, verbose = opts[3].seen;

    /* the whole file with one target (a loader probe), or the engine's plan */
    const bool probe = opts[4].seen || opts[7].seen || opts[10].seen;
    const bool execute = opts[12].seen || probe;
    if (opts[11].seen && probe) {
        fprintf(stderr, "kiln inspect: --backend plans what the engine loads; --layout, --cuda "
                        "and --copy plan the whole file instead: give one or the other\n");
        return 2;
    }
    kiln_model_file *mf = NULL;
    if (kiln_model_file_open(path, 0, &mf, &err)) return kiln_cli_fail("inspect", &err);
    int rc = 0;
    kiln_load_plan *plan = NULL;
    kiln_model *km = NULL;
    kiln_bound_plan bp;
    bool have_bp = false, have_dev = false;
    kiln_device dev;
    if (load && probe) {
        if (kiln_load_plan_build(mf, &req, &plan, &err) || kiln_load_execute(plan, &err)) {
            rc = kiln_cli_fail("inspect", &err);
            goto out;
        }
    } else if (load) {
        /* exactly what kiln_engine_create does up to executing the plan */
        const char *bname = kiln_cli_backend(opts[11].seen ? opts[11].value : NULL);
        const kiln_backend *be = kiln_backend_find(bname);
        kiln_plan cp;
        kiln_plan_init(&cp);
        kiln_status st = KILN_OK;
        if (!be)
            st = kiln_err_set(&err, KILN_ERR_UNSUPPORTED, "backend '%s' is not built in", bname);
        if (!st) st = kiln_model_load(path, &km, &err);
        if (!st) st = km->family->compile(&km->cfg, KILN_MODE_PREFILL, &cp, &err);
        if (!st) {
            st = kiln_device_open(be, 0, &dev, &err);
            have_dev = !st;
        }
        if (!st) {
            kiln_bind_opts bo; /* the engine's for the CLI defaults (max step 512) */
            kiln_bind_opts_default(&bo);
            bo.max_tokens = 512;
            st = kiln_bind_select(&dev, km, &cp, &bo, &bp, NULL, &err);
            have_bp = !st;
        }
        kiln_plan_free(&cp);
        req.progress = execute;
        if (!st) st = kiln_bind_load_plan(&bp, km, &req, &plan, &err);
        if (!st && execute) {
            st = kiln_bind_execute_load(&bp, km, plan, &err); /* bp owns it now */
            if (st) plan = NULL;
        }
        if (st) {
            rc = kiln_cli_fail("inspect", &err);
            goto out;
        }
    }
    if (json) {
        json_t *root = model_json(mf);
        if (root && plan) {
            char *rep = kiln_load_report_json(plan, verbose);
            json_t *rj = rep ? json_loads(rep, 0, NULL) : NULL;
            kiln_free(rep);
            json_object_set_new(root, "load", rj ? rj : json_null());
        }
        char *s = root ? kiln_adopt(json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER)) : NULL;
        if (!s) {
            kiln_err_set(&err, KILN_ERR_NOMEM, "JSON output");
            rc = kiln_cli_fail("inspect", &err);
        } else {
            printf("%s\n", s);
        }
        kiln_free(s);
        json_decref(root);
    } else {
        print_text(mf, opts[9].seen);
        if (plan) {
            printf("\n");
            kiln_load_report_print(plan, stdout, verbose);
        }
    }
out:
    if (have_bp && bp.load == plan) plan = NULL; /* owned by the bound plan */
    kiln_load_plan_free(plan);
    if (have_bp) kiln_bound_plan_free(&bp);
    if (have_dev) kiln_device_close(&dev);
    kiln_model_free(km);
    kiln_model_file_close(mf);
    return rc;
}
