/* report.c — the load report as text and JSON (load.h; fields in docs/LOADER.md). */
#include "base/mem.h"
#include "format/dtype.h"
#include "load/load_impl.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>

static double gbps(uint64_t bytes, double s) {
    return s > 0 ? (double)bytes / s * 1e-9 : 0.0;
}

static void fmt_shape(const kiln_load_item *it, char *buf, size_t n) {
    int o = snprintf(buf, n, "[");
    int rank = it->rank > 0 ? it->rank : 1;
    for (int d = 0; d < rank && o < (int)n; d++)
        o += snprintf(buf + o, n - (size_t)o, "%s%lld", d ? ", " : "", (long long)it->shape[d]);
    if (o < (int)n) snprintf(buf + o, n - (size_t)o, "]");
}

void kiln_load_report_print(const kiln_load_plan *p, FILE *f, bool verbose) {
    const kiln_load_report *r = &p->rep;
    const kiln_load_env *e = &r->env;
    size_t shards = p->mf ? kiln_model_file_shard_count(p->mf) : 0;
    fprintf(f, "load report: %s (%s, %zu shard%s)\n", kiln_load_plan_path(p),
            p->mf ? kiln_model_source_name(kiln_model_file_source(p->mf)) : "tensors in memory",
            shards, shards == 1 ? "" : "s");
    fprintf(f,
            "  environment: %.1f MiB in files, %.1f%% in page cache; %.1f GiB available, budget "
            "%.1f GiB, plan owns %.1f MiB; %d cores, %d threads; io_uring %s; CUDA %s (%d "
            "devices)\n",
            (double)e->file_bytes / (1 << 20),
            e->file_bytes ? 100.0 * (double)e->resident_bytes / (double)e->file_bytes : 100.0,
            (double)e->mem_available / (1 << 30), (double)e->budget / (1 << 30),
            (double)e->owned_bytes / (1 << 20), e->cores, e->threads,
            e->uring_ok ? "usable" : "unavailable", e->cuda_built ? "built" : "not built",
            e->cuda_devices);
    fprintf(f, "  executor: %s reader; alias %s; owned memory %s\n", kiln_io_name(e->io),
            p->req.populate ? "populated" : "lazy (pages fault in on use)",
            !r->executed    ? (p->req.huge_pages ? "huge pages asked" : "4 KiB pages")
            : e->huge_pages ? "huge pages (MADV_HUGEPAGE)"
                            : "4 KiB pages");
    fprintf(f, "  %-10s %8s %12s %12s %10s %9s\n", "lane", "tensors", "out MiB", "read MiB", "ms",
            "GB/s");
    for (int l = 0; l < KILN_LANE_COUNT; l++) {
        const kiln_lane_stats *s = &r->lane[l];
        fprintf(f, "  %-10s %8u %12.2f %12.2f %10.2f %9.2f\n", kiln_lane_name((kiln_lane)l),
                s->tensors, (double)s->bytes / (1 << 20), (double)s->src_bytes / (1 << 20),
                s->seconds * 1e3, gbps(s->src_bytes, s->seconds));
    }
    if (r->lane[KILN_LANE_UPLOAD].tensors)
        fprintf(f,
                "  upload setup (pinned staging, device arena) %.2f ms, not in the lane's GB/s; "
                "host side %s, %.2f MiB direct from the page cache (registering %.2f ms); "
                "filling staging %.2f ms, waiting for the copy engine %.2f ms, teardown %.2f ms\n",
                r->upload_setup_seconds * 1e3, r->upload_mode ? r->upload_mode : "-",
                (double)r->upload_direct_bytes / (1 << 20), r->upload_register_seconds * 1e3,
                r->upload_fill_seconds * 1e3, r->upload_wait_seconds * 1e3,
                r->upload_teardown_seconds * 1e3);
    fprintf(f, "  plan %.2f ms, execute %.2f ms, ready in %.2f ms%s\n", r->plan_seconds * 1e3,
            r->exec_seconds * 1e3, r->total_seconds * 1e3, r->executed ? "" : " (not executed)");
    if (r->lane[KILN_LANE_RESIDUAL].tensors) {
        fprintf(f, "  residual: %.2f MiB in %u tensors:\n",
                (double)r->lane[KILN_LANE_RESIDUAL].bytes / (1 << 20),
                r->lane[KILN_LANE_RESIDUAL].tensors);
        for (size_t i = 0; i < p->n; i++)
            if (p->items[i].lane == KILN_LANE_RESIDUAL)
                fprintf(f, "    %-40s %12" PRIu64 " bytes  %s\n", p->items[i].src->name,
                        p->items[i].nbytes, p->items[i].why);
    }
    if (!verbose) return;
    fprintf(f, "  %-40s %-9s %-9s %-9s %-20s %12s  %s\n", "tensor", "lane", "layout", "dtype",
            "shape", "bytes", "why");
    for (size_t i = 0; i < p->n; i++) {
        const kiln_load_item *it = &p->items[i];
        char sh[64];
        fmt_shape(it, sh, sizeof sh);
        fprintf(f, "  %-40s %-9s %-9s %-9s %-20s %12" PRIu64 "  %s\n", it->src->name,
                kiln_lane_name(it->lane), it->layout->name, kiln_dtype_name(it->dtype), sh,
                it->nbytes, it->why);
    }
}

static json_t *lane_json(const kiln_lane_stats *s) {
    return json_pack("{s:I, s:I, s:I, s:f, s:f}", "tensors", (json_int_t)s->tensors, "bytes",
                     (json_int_t)s->bytes, "read_bytes", (json_int_t)s->src_bytes, "seconds",
                     s->seconds, "gb_per_s", gbps(s->src_bytes, s->seconds));
}

char *kiln_load_report_json(const kiln_load_plan *p, bool verbose) {
    const kiln_load_report *r = &p->rep;
    const kiln_load_env *e = &r->env;
    json_t *root = json_object(), *lanes = json_object(), *residual = json_array();
    json_t *env =
        json_pack("{s:I, s:I, s:I, s:I, s:I, s:i, s:i, s:b, s:b, s:i, s:s, s:b}", "file_bytes",
                  (json_int_t)e->file_bytes, "resident_bytes", (json_int_t)e->resident_bytes,
                  "mem_available", (json_int_t)e->mem_available, "budget", (json_int_t)e->budget,
                  "owned_bytes", (json_int_t)e->owned_bytes, "cores", e->cores, "threads",
                  e->threads, "io_uring", e->uring_ok, "cuda_built", e->cuda_built, "cuda_devices",
                  e->cuda_devices, "reader", kiln_io_name(e->io), "populate", p->req.populate);
    if (env) json_object_set_new(env, "huge_pages", json_boolean(e->huge_pages));
    if (!root || !lanes || !residual || !env) {
        json_decref(root), json_decref(lanes), json_decref(residual), json_decref(env);
        return NULL;
    }
    for (int l = 0; l < KILN_LANE_COUNT; l++)
        json_object_set_new(lanes, kiln_lane_name((kiln_lane)l), lane_json(&r->lane[l]));
    for (size_t i = 0; i < p->n; i++)
        if (p->items[i].lane == KILN_LANE_RESIDUAL)
            json_array_append_new(
                residual, json_pack("{s:s, s:I, s:s}", "tensor", p->items[i].src->name, "bytes",
                                    (json_int_t)p->items[i].nbytes, "why", p->items[i].why));
    json_object_set_new(root, "model", json_string(kiln_load_plan_path(p)));
    json_object_set_new(
        root, "source",
        json_string(p->mf ? kiln_model_source_name(kiln_model_file_source(p->mf)) : "memory"));
    json_object_set_new(root, "environment", env);
    json_object_set_new(root, "lanes", lanes);
    json_object_set_new(root, "residual", residual);
    json_object_set_new(root, "plan_seconds", json_real(r->plan_seconds));
    json_object_set_new(root, "execute_seconds", json_real(r->exec_seconds));
    json_object_set_new(root, "upload_setup_seconds", json_real(r->upload_setup_seconds));
    if (r->upload_mode) {
        json_object_set_new(root, "upload_mode", json_string(r->upload_mode));
        json_object_set_new(root, "upload_direct_bytes",
                            json_integer((json_int_t)r->upload_direct_bytes));
        json_object_set_new(root, "upload_register_seconds", json_real(r->upload_register_seconds));
        json_object_set_new(root, "upload_fill_seconds", json_real(r->upload_fill_seconds));
        json_object_set_new(root, "upload_wait_seconds", json_real(r->upload_wait_seconds));
        json_object_set_new(root, "upload_teardown_seconds", json_real(r->upload_teardown_seconds));
    }
    json_object_set_new(root, "ready_seconds", json_real(r->total_seconds));
    json_object_set_new(root, "executed", json_boolean(r->executed));
    if (verbose) {
        json_t *ts = json_array();
        for (size_t i = 0; ts && i < p->n; i++) {
            const kiln_load_item *it = &p->items[i];
            json_t *shape = json_array();
            for (int d = 0; d < (it->rank > 0 ? it->rank : 1); d++)
                json_array_append_new(shape, json_integer(it->shape[d]));
            json_array_append_new(ts, json_pack("{s:s, s:s, s:s, s:s, s:o, s:I, s:s}", "name",
                                                it->src->name, "lane", kiln_lane_name(it->lane),
                                                "dtype", kiln_dtype_name(it->dtype), "layout",
                                                it->layout->name, "shape", shape, "bytes",
                                                (json_int_t)it->nbytes, "why", it->why));
        }
        json_object_set_new(root, "tensors", ts);
    }
    char *s = kiln_adopt(json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER));
    json_decref(root);
    return s;
}
