/*
 * load.h — the planned loader: a request -> a load plan (every tensor's lane decided
 * before any byte moves) -> execution -> a load report.
 *
 * Planning has four inputs, kept apart:
 *   1. the semantic plan: which tensors (selection: name glob, layer range, a row or
 *      column tensor-parallel shard), and per tensor the target (host or CUDA device) and
 *      the target layout (layout.h: "native", "f32", "f16", "bf16", "blocks_x4", or one
 *      the kernel layer registered) — what bytes must end where, in what representation;
 *   2. the source binding: per shard file a read-only mmap, a file descriptor for pread,
 *      and io_uring (liburing) when the kernel allows it, with what each can do;
 *   3. environment facts: how much of each file is in the page cache (mincore), the host
 *      memory budget (MemAvailable or the request's), CUDA built / devices present, cores;
 *   4. the lanes:
 *      alias      zero-copy view into the mapping: host target, native layout, no fixup,
 *                 contiguous (unsharded or row-sharded), aligned to req.alias_align. With
 *                 req.populate the pages are faulted in during execution
 *                 (MADV_POPULATE_READ in parallel chunks), so "ready" means resident.
 *      transform  read straight into the final host buffer: identity copies (writable or
 *                 misaligned tensors), dtype conversion, dequantization, repacks, column
 *                 shards with a layout, fixups; parallel over row chunks of all tensors.
 *      upload     to a CUDA device: read (+ transform) into pinned, double-buffered staging
 *                 and copy host-to-device on a stream, overlapped with reading.
 *      residual   generic byte ranges (pread of each range into owned memory, then the
 *                 same transform code, single-threaded): native column shards (strided
 *                 ranges), and anything forced there. The report lists its bytes and why.
 *   Planning fails (naming the tensor) when a lane cannot serve a tensor: unsupported
 *   dtype, a layout that refuses it, a CUDA target without CUDA, a shard that does not
 *   divide, a budget exceeded. Execution runs the plan exactly: a lane that fails fails
 *   the load; it never widens silently to another lane.
 *
 * Byte-exactness: for one request, every lane produces the same bytes as the residual
 * lane (req.force_lane = KILN_LANE_RESIDUAL), which tests check.
 *
 * Ownership: the plan borrows the model file (which must outlive it: aliased tensors
 * point into its mappings) and owns every buffer it allocated (host and device); all are
 * released by kiln_load_plan_free. A plan executes once; it is not thread-safe.
 */
#ifndef KILN_LOAD_LOAD_H
#define KILN_LOAD_LOAD_H

#include "base/status.h"
#include "format/model_file.h"
#include "load/layout.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum kiln_lane {
    KILN_LANE_ALIAS = 0,
    KILN_LANE_TRANSFORM = 1,
    KILN_LANE_UPLOAD = 2,
    KILN_LANE_RESIDUAL = 3,
    KILN_LANE_COUNT = 4,
} kiln_lane;
const char *kiln_lane_name(kiln_lane l); /* "alias", "transform", "upload", "residual" */

/* How bytes are read for the transform, upload and residual lanes. */
typedef enum kiln_io {
    KILN_IO_AUTO =
        0, /* mmap when the file is (>= 90%) in the page cache, else io_uring, else pread */
    KILN_IO_MMAP = 1, /* memcpy from the mapping (page faults) */
    KILN_IO_PREAD = 2,
    KILN_IO_URING = 3,
} kiln_io;
const char *kiln_io_name(kiln_io io);

typedef enum kiln_place {
    KILN_PLACE_HOST = 0,
    KILN_PLACE_CUDA = 1,
} kiln_place;

typedef struct kiln_load_target {
    kiln_place place;
    int device;         /* CUDA device ordinal */
    const char *layout; /* NULL / "native": as stored; else a layout name (layout.h) */
    bool writable;      /* host: private writable memory (never an alias) */
} kiln_load_target;

/* kiln_tensor_info.file of a tensor whose bytes are in memory at .data (a tensor a model
 * family computed, or a model built from tensors in memory): read with memcpy, aliased by
 * pointer; never populated or prefetched. */
#define KILN_LOAD_MEMORY UINT32_MAX

typedef enum kiln_shard_mode {
    KILN_SHARD_NONE = 0,
    KILN_SHARD_ROWS = 1, /* split shape[1] (output rows): contiguous, aliasable */
    KILN_SHARD_COLS = 2, /* split shape[0] (the row): strided ranges */
} kiln_shard_mode;

/* One (tensor, target) pair of an explicit load request: what the engine's binding asks
 * for after it chose every call site's kernel. A tensor may be wanted in several targets
 * (e.g. the tied embedding: native rows for the lookup, repacked for the LM head). */
typedef struct kiln_load_want {
    const kiln_tensor_info *src; /* a tensor of the model file, or KILN_LOAD_MEMORY bytes */
    kiln_load_target target;
    /* this want's own shard (tensor parallelism: each weight of a rank has its own rule,
     * plan/tp.h); KILN_SHARD_NONE (0): the request's shard settings apply. ROWS of a
     * rank-1 tensor splits its elements (contiguous). */
    int shard; /* kiln_shard_mode */
    int shard_index, shard_count;
} kiln_load_want;

/* Per-tensor target override (e.g. norms in f32, matrices repacked). */
typedef kiln_load_target (*kiln_target_fn)(void *user, const kiln_tensor_info *t);

typedef struct kiln_load_request {
    /* explicit selection: exactly these (tensor, target) pairs, in this order (pattern,
     * layers, target and target_for are then ignored; sharding still applies). The
     * array and the tensor infos it points to must outlive the plan. */
    const kiln_load_want *wants;
    size_t n_wants;
    /* selection over the file's tensors (when wants is NULL) */
    const char *pattern; /* fnmatch(3) glob over tensor names; NULL = all */
    int layer_begin;     /* with layer_end > layer_begin: only blk.N for N in [begin, end) */
    int layer_end;       /*   ... plus the non-layer tensors unless skip_globals */
    bool skip_globals;
    kiln_shard_mode shard;     /* applies to 2-D tensors matching shard_pattern; others replicate */
    const char *shard_pattern; /* NULL = every 2-D tensor */
    int shard_index, shard_count;
    /* targets */
    kiln_load_target target; /* default for every tensor */
    kiln_target_fn target_for;
    void *target_user;
    /* execution */
    kiln_io io;
    int threads;            /* 0: all cores */
    bool populate;          /* alias lane: fault pages in now (default true) */
    int force_lane;         /* -1 (default): plan; else every tensor must go to this lane */
    uint64_t memory_budget; /* host bytes the plan may allocate; 0: MemAvailable */
    uint32_t alias_align;   /* alias needs data % alias_align == 0; 0 (default): the type's
                               natural alignment (f32 4, f16 2, q8_0 2, q4_K 8) */
    bool huge_pages;        /* owned host memory (transform + residual lanes) is one arena whose
                               interior is 2 MiB aligned and advised MADV_HUGEPAGE (default true:
                               kernels stream weights; 4 KiB pages cost them ~30 %, docs/CPU.md) */
    bool progress;          /* draw a progress bar on stderr (a TTY) once loading passes ~1 s */
    const char *label;      /* progress label (default "loading") */
} kiln_load_request;

/* Defaults: everything, host, native, KILN_IO_AUTO, populate, no forced lane, huge pages,
 * no progress bar. */
void kiln_load_request_init(kiln_load_request *r);

/* One planned tensor and, after execution, where it is. */
typedef struct kiln_load_item {
    const kiln_tensor_info *src;
    kiln_lane lane;
    char why[96]; /* the reason for the lane */
    kiln_load_target target;
    const kiln_layout *layout; /* the layout (native included) */
    uint32_t dtype;            /* output dtype */
    int rank;
    int64_t shape[4]; /* output shape (after sharding), ggml order */
    uint64_t nbytes;  /* output bytes */
    /* source ranges: n_rows rows of row_bytes, the first at src_offset, every src_stride */
    uint32_t file;
    uint64_t src_offset, src_row_bytes, src_stride;
    int64_t n_rows;
    uint64_t out_row_bytes;
    /* results */
    const void *data;   /* host bytes (alias or owned); NULL for device-only tensors */
    void *device_ptr;   /* CUDA device pointer (upload lane) */
    void *device_alloc; /* the allocation to free: one per device, held by its first item */
    bool done;
} kiln_load_item;

typedef struct kiln_load_env {
    uint64_t file_bytes;     /* all shards */
    uint64_t resident_bytes; /* in the page cache at planning time (mincore) */
    uint64_t mem_available;
    uint64_t budget;
    uint64_t owned_bytes; /* host bytes the plan allocates */
    int cores, threads;
    bool uring_ok;
    bool cuda_built;
    int cuda_devices;
    kiln_io io;      /* the reader chosen */
    bool huge_pages; /* the owned arena was advised MADV_HUGEPAGE (after execution) */
} kiln_load_env;

typedef struct kiln_lane_stats {
    uint32_t tensors;
    uint64_t bytes;     /* output bytes */
    uint64_t src_bytes; /* bytes read from files */
    double seconds;     /* wall time of the lane */
} kiln_lane_stats;

typedef struct kiln_load_report {
    kiln_lane_stats lane[KILN_LANE_COUNT];
    kiln_load_env env;
    double plan_seconds, exec_seconds;
    double total_seconds; /* plan + execute: time to ready */
    /* upload lane: setting up pinned staging, the device arena and threads; excluded from
     * lane[UPLOAD].seconds (its bandwidth), included in exec and total time */
    double upload_setup_seconds;
    /* upload lane: how host bytes reached the copy engine ("pread": read into pinned
     * staging; "stream": copied from the file's mapping into pinned staging with
     * streaming stores; "direct": the page cache itself registered with the driver and
     * copied from, no host copy), the bytes that went direct, and the time spent
     * registering (cudaHostRegister, inside the lane's time) */
    const char *upload_mode;
    uint64_t upload_direct_bytes;
    double upload_register_seconds;
    /* upload lane, staged: time the lane's thread spent filling slabs (all threads at
     * work) and waiting for a staging buffer's copy to finish (the copy engine behind) */
    double upload_fill_seconds, upload_wait_seconds;
    /* upload lane: freeing staging, streams and threads at its end (inside the lane's time) */
    double upload_teardown_seconds;
    bool executed;
} kiln_load_report;

typedef struct kiln_load_plan kiln_load_plan;

/* Builds the plan (no tensor bytes are read). */
kiln_status kiln_load_plan_build(const kiln_model_file *mf, const kiln_load_request *req,
                                 kiln_load_plan **out, kiln_err *err);
/* The request the plan was built from (its wants pointer is only valid while planning) and
 * the model file it reads (NULL for a plan of tensors in memory). */
const kiln_load_request *kiln_load_plan_request(const kiln_load_plan *p);
const kiln_model_file *kiln_load_plan_file(const kiln_load_plan *p);
/* The path named in messages (the model file's, or "memory"). */
const char *kiln_load_plan_path(const kiln_load_plan *p);
/* Runs the plan (once). On failure the message names the tensor and lane. */
kiln_status kiln_load_execute(kiln_load_plan *p, kiln_err *err);
/* NULL-safe; frees owned host and device memory. */
void kiln_load_plan_free(kiln_load_plan *p);

size_t kiln_load_plan_count(const kiln_load_plan *p);
const kiln_load_item *kiln_load_plan_item(const kiln_load_plan *p, size_t i);
const kiln_load_item *kiln_load_plan_find(const kiln_load_plan *p, const char *name);
/* The item of tensor `src` (pointer identity) in layout `layout` (NULL = native). */
const kiln_load_item *kiln_load_plan_find_want(const kiln_load_plan *p, const kiln_tensor_info *src,
                                               const char *layout);
const kiln_load_report *kiln_load_plan_report(const kiln_load_plan *p);
/* Copies a loaded tensor's nbytes output bytes to dst, from host memory or the device. */
kiln_status kiln_load_item_read(const kiln_load_item *it, void *dst, kiln_err *err);

/* The report as text (per lane: tensors, bytes, time, GB/s; residual tensors and why;
 * environment facts) or JSON (an object, see docs/LOADER.md). verbose: every tensor. */
void kiln_load_report_print(const kiln_load_plan *p, FILE *f, bool verbose);
/* malloc'ed JSON text; NULL when out of memory. */
char *kiln_load_report_json(const kiln_load_plan *p, bool verbose);

#endif /* KILN_LOAD_LOAD_H */
