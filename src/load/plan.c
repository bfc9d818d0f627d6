/* plan.c — load planning: selection, targets, environment facts, lane choice (load.h). */
#include "base/mem.h"
#include "base/pool.h"
#include "base/timer.h"
#include "format/dtype.h"
#include "load/load_impl.h"

#include <fnmatch.h>
#include <pthread.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

const char *kiln_lane_name(kiln_lane l) {
    static const char *const n[] = {"alias", "transform", "upload", "residual"};
    return (unsigned)l < KILN_LANE_COUNT ? n[l] : "invalid";
}

const char *kiln_io_name(kiln_io io) {
    static const char *const n[] = {"auto", "mmap", "pread", "io_uring"};
    return (unsigned)io <= KILN_IO_URING ? n[io] : "invalid";
}

void kiln_load_request_init(kiln_load_request *r) {
    memset(r, 0, sizeof *r);
    r->target.place = KILN_PLACE_HOST;
    r->io = KILN_IO_AUTO;
    r->populate = true;
    r->force_lane = -1;
    r->alias_align = 0; /* natural alignment of the element type */
    r->shard_count = 1;
    r->huge_pages = true;
}

/* ---- environment facts ---------------------------------------------------------------- */

static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* cachestat(2) (Linux 6.5): the page-cache state of a file range in one call. */
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif
struct kiln_cachestat_range {
    uint64_t off, len;
};
struct kiln_cachestat {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

/* Bytes of the file (mapped at base) resident in the page cache: cachestat when the
 * kernel has it (one call), else mincore over the mapping (one byte per page). */
static uint64_t resident_bytes(int fd, const uint8_t *base, uint64_t size) {
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0 || size == 0) return 0;
    struct kiln_cachestat_range range = {0, 0}; /* len 0: to the end of the file */
    struct kiln_cachestat cs;
    if (fd >= 0 && syscall(__NR_cachestat, fd, &range, &cs, 0) == 0) {
        uint64_t b = cs.nr_cache * (uint64_t)pg;
        return b > size ? size : b;
    }
    size_t pages = (size_t)((size + (uint64_t)pg - 1) / (uint64_t)pg);
    unsigned char *vec = kiln_malloc(pages);
    if (!vec) return 0;
    uint64_t res = 0;
    if (mincore((void *)base, (size_t)size, vec) == 0) {
        for (size_t i = 0; i < pages; i++) res += vec[i] & 1;
        res *= (uint64_t)pg;
        if (res > size) res = size;
    }
    kiln_free(vec);
    return res;
}

static bool uring_probe(void) {
    struct io_uring ring;
    if (io_uring_queue_init(4, &ring, 0) != 0) return false;
    io_uring_queue_exit(&ring);
    return true;
}

static void gather_env(kiln_load_plan *p) {
    kiln_load_env *e = &p->rep.env;
    for (size_t s = 0; p->mf && s < kiln_model_file_shard_count(p->mf); s++) {
        const kiln_model_shard *sh = kiln_model_file_shard(p->mf, s);
        e->file_bytes += sh->size;
        e->resident_bytes += resident_bytes(sh->fd, sh->base, sh->size);
    }
    e->mem_available = mem_available();
    e->budget = p->req.memory_budget ? p->req.memory_budget : e->mem_available;
    e->cores = kiln_cpu_count();
    e->threads = p->req.threads > 0 ? p->req.threads : e->cores;
    e->uring_ok = uring_probe();
#ifdef KILN_HAVE_CUDA
    e->cuda_built = true;
#endif
    e->cuda_devices = 0; /* asked only when a tensor targets CUDA (initializing CUDA is slow) */
}

/* ---- selection --------------------------------------------------------------------------- */

/* Layer number of "blk.N.*", or -1. */
static long layer_of(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    char *end;
    long n = strtol(name + 4, &end, 10);
    if (end == name + 4 || *end != '.' || n < 0) return -1;
    return n;
}

static bool selected(const kiln_load_request *r, const char *name) {
    if (r->pattern && fnmatch(r->pattern, name, 0) != 0) return false;
    if (r->layer_end > r->layer_begin) {
        long l = layer_of(name);
        if (l < 0) return !r->skip_globals;
        return l >= r->layer_begin && l < r->layer_end;
    }
    return true;
}

/* ---- per-tensor planning ------------------------------------------------------------------ */

static kiln_status plan_source(const kiln_load_request *r, const kiln_load_want *want,
                               const kiln_tensor_info *t, kiln_load_item *it, bool *col_shard,
                               kiln_err *err) {
    size_t row_bytes;
    KILN_TRY(kiln_dtype_row_bytes(t->dtype, t->shape[0], &row_bytes, err));
    const kiln_dtype_info *di = kiln_dtype_get(t->dtype);
    it->rank = t->rank;
    memcpy(it->shape, t->shape, sizeof it->shape);
    it->file = t->file;
    it->src_offset = t->offset;
    it->src_row_bytes = row_bytes;
    it->src_stride = row_bytes;
    it->n_rows = t->shape[1] * t->shape[2] * t->shape[3];
    *col_shard = false;
    int mode = r->shard;
    int64_t k = r->shard_count, i = r->shard_index;
    bool shard = r->shard != KILN_SHARD_NONE && r->shard_count > 1 && t->rank == 2 &&
                 (!r->shard_pattern || fnmatch(r->shard_pattern, t->name, 0) == 0);
    if (want && want->shard != KILN_SHARD_NONE) {
        /* the want's own shard (tensor parallelism) */
        mode = want->shard;
        k = want->shard_count, i = want->shard_index;
        if (k < 1 || i < 0 || i >= k || (mode != KILN_SHARD_ROWS && mode != KILN_SHARD_COLS))
            return kiln_err_set(err, KILN_ERR_INVALID_ARG, "shard %lld of %lld (mode %d)",
                                (long long)i, (long long)k, mode);
        if (t->rank > 2 || (t->rank == 1 && mode != KILN_SHARD_ROWS))
            return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "%s shard of a rank-%d tensor",
                                mode == KILN_SHARD_ROWS ? "row" : "column", (int)t->rank);
        shard = k > 1;
    }
    if (!shard) return KILN_OK;
    if (mode == KILN_SHARD_ROWS && t->rank > 1) {
        if (t->shape[1] % k)
            return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                                "row shard: %lld rows not divisible by %lld",
                                (long long)t->shape[1], (long long)k);
        it->shape[1] = t->shape[1] / k;
        it->n_rows = it->shape[1];
        it->src_offset += (uint64_t)(i * it->shape[1]) * row_bytes;
    } else {
        /* columns of a matrix, or the elements of a vector: k parts of whole blocks along
         * dimension 0 (a vector's part is one contiguous run) */
        if (t->shape[0] % (k * (int64_t)di->block_size))
            return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                                "%s shard: %s of %lld not divisible into %lld parts of whole "
                                "%s blocks",
                                t->rank == 1 ? "vector" : "column", t->rank == 1 ? "length" : "row",
                                (long long)t->shape[0], (long long)k, di->name);
        it->shape[0] = t->shape[0] / k;
        it->src_row_bytes = row_bytes / (uint64_t)k;
        it->src_offset += (uint64_t)i * it->src_row_bytes;
        if (t->rank == 1)
            it->src_stride = it->src_row_bytes;
        else
            *col_shard = true;
    }
    return KILN_OK;
}

static kiln_status plan_item(kiln_load_plan *p, const kiln_load_want *want,
                             const kiln_tensor_info *t, const kiln_load_target *target,
                             kiln_load_item *it, kiln_err *err) {
    const kiln_load_request *r = &p->req;
    it->src = t;
    it->target = *target;
    const bool mem = t->file == KILN_LOAD_MEMORY;
    if (mem && !t->data)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "a tensor in memory without data");
    if (!mem && (!p->mf || t->file >= kiln_model_file_shard_count(p->mf)))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "file %u is not a shard of the model",
                            t->file);
    if (!t->supported)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "type %s is not supported by kiln",
                            kiln_dtype_name(t->dtype));
    bool col;
    KILN_TRY(plan_source(r, want, t, it, &col, err));
    it->layout = kiln_layout_find(it->target.layout);
    if (!it->layout)
        return kiln_err_set(err, KILN_ERR_NOT_FOUND, "unknown target layout '%s'",
                            it->target.layout);
    kiln_status st = it->layout->plan(t->dtype, it->shape[0], it->n_rows, t->fixup, &it->dtype,
                                      &it->out_row_bytes, err);
    if (st) return kiln_err_wrap(err, st, "layout %s", it->layout->name);
    const int64_t g = it->layout->row_group;
    if (it->n_rows % g && !it->layout->pad_last_group)
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "layout %s needs rows in groups of %u",
                            it->layout->name, it->layout->row_group);
    const int64_t out_rows = (it->n_rows + g - 1) / g * g; /* padded last group */
    if (!kiln_u64_mul(it->out_row_bytes, (uint64_t)out_rows, &it->nbytes))
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "output size overflows");

    const bool native = strcmp(it->layout->name, "native") == 0 && t->fixup == KILN_FIXUP_NONE;
    const bool host = it->target.place == KILN_PLACE_HOST;
    /* natural alignment: the largest power of two dividing the block size, at most 8
     * (f32 4, f16/bf16 2, q8_0 2, q4_K 8): what a kernel's loads of the type need */
    uint64_t natural = kiln_dtype_get(t->dtype)->block_bytes;
    natural &= ~(natural - 1);
    if (natural > 8) natural = 8;
    const uint64_t align = r->alias_align ? r->alias_align : natural;
    const uint64_t addr = (uint64_t)(uintptr_t)kiln_load_src(p, it);
    char alias_no[80] = "";
    if (!host)
        snprintf(alias_no, sizeof alias_no, "target is cuda:%d", it->target.device);
    else if (!native)
        snprintf(alias_no, sizeof alias_no, "layout %s%s", it->layout->name,
                 t->fixup ? " + fixup" : "");
    else if (col)
        snprintf(alias_no, sizeof alias_no, "column shard (strided)");
    else if (it->target.writable)
        snprintf(alias_no, sizeof alias_no, "writable copy requested");
    else if (addr % align)
        snprintf(alias_no, sizeof alias_no,
                 "data misaligned (address %% %" PRIu64 " = %" PRIu64 ")", align, addr % align);

    if (!host) {
#ifndef KILN_HAVE_CUDA
        return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                            "target cuda:%d, but this kiln was built without CUDA (KILN_CUDA=OFF)",
                            it->target.device);
#else
        if (p->rep.env.cuda_devices == 0) p->rep.env.cuda_devices = kiln_cuda_device_count();
        if (it->target.device < 0 || it->target.device >= p->rep.env.cuda_devices)
            return kiln_err_set(err, KILN_ERR_DEVICE,
                                "target cuda:%d, but %d CUDA device(s) usable", it->target.device,
                                p->rep.env.cuda_devices);
#endif
    }
    if (r->force_lane >= 0) {
        it->lane = (kiln_lane)r->force_lane;
        snprintf(it->why, sizeof it->why, "forced by the request");
        switch (it->lane) {
        case KILN_LANE_ALIAS:
            if (alias_no[0])
                return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "lane alias cannot serve it: %s",
                                    alias_no);
            break;
        case KILN_LANE_UPLOAD:
            if (host)
                return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "lane upload needs a CUDA target");
            break;
        case KILN_LANE_TRANSFORM:
        case KILN_LANE_RESIDUAL:
            if (!host)
                return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "lane %s serves host targets only",
                                    kiln_lane_name(it->lane));
            break;
        default:
            return kiln_err_set(err, KILN_ERR_INVALID_ARG, "forced lane %d", r->force_lane);
        }
        return KILN_OK;
    }
    if (!host) {
        it->lane = KILN_LANE_UPLOAD;
        snprintf(it->why, sizeof it->why, "cuda:%d, layout %s", it->target.device,
                 it->layout->name);
    } else if (!alias_no[0]) {
        it->lane = KILN_LANE_ALIAS;
        snprintf(it->why, sizeof it->why, "%s",
                 mem ? "native bytes in memory" : "native bytes in the mapping");
    } else if (col && native) {
        it->lane = KILN_LANE_RESIDUAL;
        snprintf(it->why, sizeof it->why, "column shard: %lld strided byte ranges",
                 (long long)it->n_rows);
    } else {
        it->lane = KILN_LANE_TRANSFORM;
        snprintf(it->why, sizeof it->why, "%s", alias_no);
    }
    return KILN_OK;
}

int64_t kiln_load_chunk_rows(const kiln_load_item *it) {
    const int64_t g = it->layout->row_group;
    int64_t rows = (int64_t)(KILN_LOAD_CHUNK_BYTES / (it->src_row_bytes ? it->src_row_bytes : 1));
    rows = rows / g * g;
    if (rows < g) rows = g;
    return rows;
}

/* Sorts item indexes by (tensor, layout) to find repeated pairs and each tensor's first
 * item; the name index maps a name to that first item. */
static const kiln_load_plan *sort_plan; /* qsort has no context argument; planning holds
                                           sort_lock while it is set */
static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;

static int by_src(const void *a, const void *b) {
    const kiln_load_item *x = &sort_plan->items[*(const size_t *)a],
                         *y = &sort_plan->items[*(const size_t *)b];
    if (x->src != y->src) return (uintptr_t)x->src < (uintptr_t)y->src ? -1 : 1;
    int c = strcmp(x->layout->name, y->layout->name);
    if (c) return c;
    if (x->target.place != y->target.place) return x->target.place < y->target.place ? -1 : 1;
    if (x->target.device != y->target.device) return x->target.device < y->target.device ? -1 : 1;
    return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

static kiln_status index_names(kiln_load_plan *p, kiln_err *err) {
    size_t *ord = kiln_malloc((p->n ? p->n : 1) * sizeof *ord);
    if (!ord) return kiln_err_set(err, KILN_ERR_NOMEM, "load plan index");
    for (size_t i = 0; i < p->n; i++) ord[i] = i;
    pthread_mutex_lock(&sort_lock);
    sort_plan = p;
    qsort(ord, p->n, sizeof *ord, by_src);
    sort_plan = NULL;
    pthread_mutex_unlock(&sort_lock);
    kiln_status st = KILN_OK;
    size_t k = 0;
    for (size_t j = 0; j < p->n && !st; j++) {
        const kiln_load_item *it = &p->items[ord[j]];
        if (j > 0) {
            const kiln_load_item *prev = &p->items[ord[j - 1]];
            if (prev->src == it->src) {
                if (prev->layout == it->layout && prev->target.place == it->target.place &&
                    prev->target.device == it->target.device)
                    st = kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                      "planning the load of %s: tensor '%s' requested twice in "
                                      "layout %s",
                                      kiln_load_plan_path(p), it->src->name, it->layout->name);
                continue;
            }
        }
        p->names[k].ptr = it->src->name;
        p->names[k].len = it->src->name_len ? it->src->name_len : strlen(it->src->name);
        p->name_item[k++] = ord[j];
    }
    kiln_free(ord);
    if (st) return st;
    size_t dup = 0;
    st = kiln_strmap_build(&p->index, p->names, k, &dup, NULL);
    if (st)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "planning the load of %s: two tensors named '%s'",
                            kiln_load_plan_path(p), p->names[dup].ptr);
    return KILN_OK;
}

kiln_status kiln_load_plan_build(const kiln_model_file *mf, const kiln_load_request *req,
                                 kiln_load_plan **out, kiln_err *err) {
    *out = NULL;
    uint64_t t0 = kiln_now_ns();
    if (req->shard != KILN_SHARD_NONE &&
        (req->shard_count < 1 || req->shard_index < 0 || req->shard_index >= req->shard_count))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "shard %d of %d", req->shard_index,
                            req->shard_count);
    if (req->force_lane >= KILN_LANE_COUNT)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "forced lane %d", req->force_lane);
    if (!req->wants && !mf)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "load plan: no model file and no tensors");
    kiln_load_plan *p = kiln_calloc(1, sizeof *p);
    if (!p) return kiln_err_set(err, KILN_ERR_NOMEM, "load plan");
    p->mf = mf;
    p->req = *req;
    size_t n = req->wants ? req->n_wants : kiln_model_file_tensor_count(mf);
    p->items = kiln_calloc(n ? n : 1, sizeof *p->items);
    p->owned = kiln_calloc(n ? n : 1, sizeof *p->owned);
    p->names = kiln_calloc(n ? n : 1, sizeof *p->names);
    p->name_item = kiln_calloc(n ? n : 1, sizeof *p->name_item);
    if (!p->items || !p->owned || !p->names || !p->name_item) {
        kiln_load_plan_free(p);
        return kiln_err_set(err, KILN_ERR_NOMEM, "load plan of %zu tensors", n);
    }
    gather_env(p);
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < n && !st; i++) {
        const kiln_tensor_info *t;
        kiln_load_target target;
        if (req->wants) {
            t = req->wants[i].src;
            target = req->wants[i].target;
        } else {
            t = kiln_model_file_tensor(mf, i);
            if (!selected(req, t->name)) continue;
            target = req->target_for ? req->target_for(req->target_user, t) : req->target;
        }
        kiln_load_item *it = &p->items[p->n];
        st = plan_item(p, req->wants ? &req->wants[i] : NULL, t, &target, it, err);
        if (st) {
            kiln_err_wrap(err, st, "planning the load of %s: tensor '%s'", kiln_load_plan_path(p),
                          t->name);
            break;
        }
        kiln_lane_stats *ls = &p->rep.lane[it->lane];
        ls->tensors++;
        ls->bytes += it->nbytes;
        ls->src_bytes += it->src_row_bytes * (uint64_t)it->n_rows;
        if (it->lane == KILN_LANE_TRANSFORM || it->lane == KILN_LANE_RESIDUAL)
            p->rep.env.owned_bytes += it->nbytes;
        uint64_t chunk = (uint64_t)kiln_load_chunk_rows(it) * it->src_row_bytes;
        uint64_t all = it->src_row_bytes * (uint64_t)it->n_rows;
        if (chunk > all) chunk = all;
        if (chunk > p->max_chunk_src) p->max_chunk_src = (size_t)chunk;
        p->n++;
    }
    if (!st) st = index_names(p, err);
    if (!st && p->rep.lane[KILN_LANE_UPLOAD].tensors) {
        p->rep.env.owned_bytes += 2 * (uint64_t)p->max_chunk_src; /* pinned staging */
        /* contexts of the target devices, created now (see kiln_cuda_device_init) */
        uint64_t seen = 0;
        for (size_t i = 0; i < p->n && !st; i++) {
            const kiln_load_item *it = &p->items[i];
            if (it->lane != KILN_LANE_UPLOAD || it->target.device >= 64 ||
                (seen >> it->target.device & 1))
                continue;
            seen |= (uint64_t)1 << it->target.device;
            st = kiln_cuda_device_init(it->target.device, err);
            if (st)
                kiln_err_wrap(err, st, "planning the load of %s: cuda:%d", kiln_load_plan_path(p),
                              it->target.device);
        }
    }
    if (!st && p->rep.env.budget && p->rep.env.owned_bytes > p->rep.env.budget)
        st = kiln_err_set(err, KILN_ERR_CAPACITY,
                          "planning the load of %s: the plan needs %.2f GiB of host memory, the "
                          "budget is %.2f GiB",
                          kiln_load_plan_path(p), (double)p->rep.env.owned_bytes / (1 << 30),
                          (double)p->rep.env.budget / (1 << 30));
    /* the reader: page-cache facts decide between the mapping and real I/O */
    kiln_load_env *e = &p->rep.env;
    if (!st) {
        e->io = req->io;
        if (e->io == KILN_IO_AUTO) {
            bool cached =
                e->file_bytes == 0 || (double)e->resident_bytes >= 0.9 * (double)e->file_bytes;
            e->io = cached ? KILN_IO_MMAP : e->uring_ok ? KILN_IO_URING : KILN_IO_PREAD;
        } else if (e->io == KILN_IO_URING && !e->uring_ok) {
            st = kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                              "io_uring requested but the kernel refuses io_uring_setup here");
        }
    }
    if (st) {
        kiln_load_plan_free(p);
        return st;
    }
    p->rep.plan_seconds = (double)(kiln_now_ns() - t0) * 1e-9;
    *out = p;
    return KILN_OK;
}

void kiln_load_plan_free(kiln_load_plan *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n; i++)
        if (p->items[i].device_alloc) kiln_upload_free(p->items[i].device_alloc);
    kiln_load_owned_free(p->arena, p->arena_bytes);
    kiln_upload_staging_free(p);
    kiln_strmap_free(&p->index);
    kiln_free(p->items);
    kiln_free(p->owned);
    kiln_free(p->names);
    kiln_free(p->name_item);
    kiln_free(p);
}

size_t kiln_load_plan_count(const kiln_load_plan *p) {
    return p->n;
}
const kiln_load_item *kiln_load_plan_item(const kiln_load_plan *p, size_t i) {
    return i < p->n ? &p->items[i] : NULL;
}
const kiln_load_item *kiln_load_plan_find(const kiln_load_plan *p, const char *name) {
    int64_t i = kiln_strmap_find(&p->index, p->names, kiln_str_c(name));
    return i < 0 ? NULL : &p->items[p->name_item[i]];
}
const kiln_load_item *kiln_load_plan_find_want(const kiln_load_plan *p, const kiln_tensor_info *src,
                                               const char *layout) {
    const kiln_layout *l = kiln_layout_find(layout);
    for (size_t i = 0; l && i < p->n; i++)
        if (p->items[i].src == src && p->items[i].layout == l) return &p->items[i];
    return NULL;
}
const kiln_load_request *kiln_load_plan_request(const kiln_load_plan *p) {
    return &p->req;
}
const kiln_model_file *kiln_load_plan_file(const kiln_load_plan *p) {
    return p->mf;
}
const char *kiln_load_plan_path(const kiln_load_plan *p) {
    return p->mf ? kiln_model_file_path(p->mf) : "memory";
}
const kiln_load_report *kiln_load_plan_report(const kiln_load_plan *p) {
    return &p->rep;
}
