/*
 * backend.h — the backend contract: what a backend implements (docs/DESIGN.md, "The
 * backend contract"), call sites and the dispatch table.
 *
 * A backend supplies memory (the buffer interface below: allocate in a memory space,
 * copy host<->device and device<->device, memset, synchronize, free, on a queue) and
 * kernels (registered with the selection engine, kernels/registry.h). It does not
 * supply compositions: the adapters (adapters.c, kiln_adapters) compose each macro-op
 * of the plan out of kernel calls once, for every backend. An adapter runs its op for
 * every token of the step — all sequences at once — by calling kernels through its
 * call sites.
 *
 * A call site is one kernel call inside one bound instruction (the attention of layer
 * 3 has call sites q, k, v, q_norm, k_norm, rope, kv_write, attn, o). When a plan is
 * bound, every call site is described by a kiln_callsite and kiln_bind_callsite()
 * picks a kernel for each tokens-in-step bucket through the device's selector
 * (runtime/kselect.h); the chosen function pointers form the dispatch table the adapter
 * reads in the hot loop (kiln_site.fn; the one dispatch table: `kiln solve` bakes it,
 * `kiln run --dispatch` binds from the baked file).
 *
 * Backends ref and cpu (backend_host.c) differ only in which kernels the selector
 * picks (cpu: SIMD kernels where valid); both use host memory. Backend cuda
 * (backend_cuda.c, CUDA builds) keeps everything in device memory and runs kernels on
 * the device's stream.
 */
#ifndef KILN_RUNTIME_BACKEND_H
#define KILN_RUNTIME_BACKEND_H

#include "kernels/kernel.h"
#include "kernels/select.h"
#include "plan/plan.h"

#include <stdbool.h>
#include <stdint.h>

/* Tokens-in-step buckets: the selection engine's (kernels/select.h: 1, 2-8, 9-64,
 * 65-512, > 512); one bucket function, kiln_tok_bucket. */
#define KILN_BUCKETS KILN_TOK_BUCKETS
static inline int kiln_bucket_of(int64_t tokens) {
    return kiln_tok_bucket(tokens);
}

/* Features of a call site (bit flags). */
enum {
    KILN_CS_BIAS = 1u << 0,    /* matmul adds a bias                      */
    KILN_CS_GQA = 1u << 1,     /* attention with n_head > n_kv_head        */
    KILN_CS_WINDOW = 1u << 2,  /* sliding-window attention                 */
    KILN_CS_SOFTCAP = 1u << 3, /* attention logit softcap                  */
    KILN_CS_PAGED = 1u << 4,   /* reads/writes the paged KV cache          */
    KILN_CS_CAUSAL = 1u << 5,
    KILN_CS_YARN = 1u << 6,     /* rope with YaRN extrapolation             */
    KILN_CS_FREQ_FAC = 1u << 7, /* rope with per-dim frequency factors      */
};

/* What the selection engine needs to know about one kernel call. */
typedef struct kiln_callsite {
    kiln_kop op;
    char name[64];      /* "blk.3.attention.q" (for explain and errors)         */
    uint32_t w_dtype;   /* weight dtype (matmul, embed); KILN_DTYPE_F32 else    */
    uint32_t kv_dtype;  /* KV cache dtype (kv_write, attention)                 */
    uint32_t act_dtype; /* KILN_DTYPE_F32 (0, exact); with numerics "ggml" the
                           type llama.cpp computes in: a quantized matmul's q8
                           vec_dot type, f16 for attention and glu (ref.h)        */
    int64_t n, k;       /* matmul/embed: outputs and inputs; norms: n = width   */
    int32_t head_dim, n_head, n_kv_head;
    int32_t window;
    uint32_t features;  /* KILN_CS_* */
    int32_t bucket;     /* tokens-in-step bucket being bound                    */
    int64_t max_tokens; /* most tokens one call of this site carries (the
                           engine's largest step; 0 = unbounded, tools only)    */
} kiln_callsite;

/* One call site's row of the dispatch table (the only one: `kiln solve` writes it to a
 * file, kernels/dispatch.h). fn is what the adapter calls; kernel is the registry entry
 * fn came from (explain, solve, the circuit breaker), owned by the default registry. */
typedef struct kiln_site {
    kiln_callsite desc;
    kiln_kernel_fn fn[KILN_BUCKETS];
    uint32_t layout[KILN_BUCKETS]; /* weight layout each bucket's kernel asks for (spec) */
    int8_t widx;                   /* matmul: index of its weight in kiln_bound_insn.w, else -1 */
    const kiln_reg_kernel *kernel[KILN_BUCKETS];
} kiln_site;

typedef struct kiln_bound_weight {
    const void *data; /* NULL: slot unused */
    uint32_t dtype;
    uint32_t layout; /* kiln_wlayout of data (0: the file's rows; see bind.c) */
    size_t row_bytes;
    int64_t n, k; /* rows, elements per row */
} kiln_bound_weight;

#define KILN_MAX_SITES 12

/* One instruction bound to weights, decoded params, buffers and kernels. */
typedef struct kiln_bound_insn {
    const kiln_insn *insn;
    kiln_params prm;
    kiln_bound_weight w[KILN_PLAN_MAX_WEIGHTS];
    int32_t phys_in[KILN_PLAN_MAX_IO], phys_out[KILN_PLAN_MAX_IO];
    uint32_t width_in[KILN_PLAN_MAX_IO], width_out[KILN_PLAN_MAX_IO];
    kiln_site site[KILN_MAX_SITES];
    int n_sites;
    int32_t kv_layer; /* attention: cache layer */
} kiln_bound_insn;

struct kiln_exec;
typedef kiln_status (*kiln_adapter_fn)(struct kiln_exec *x, const kiln_bound_insn *bi);

/* ---- device-neutral memory (the buffer interface every backend implements) ----
 *
 * Memory spaces: DEVICE is where kernels read and write (activations, workspace,
 * kernel scratch, KV blocks, weights, the step's packed inputs and outputs); STAGING is
 * host memory the device copies from and to fast (pinned on CUDA), where the engine
 * builds a step's inputs and reads its outputs. On host backends (ref, cpu) both are
 * plain host memory and the copies are memcpy.
 *
 * A queue is an ordered stream of device work (cudaStream_t on CUDA; NULL = the
 * device's default queue; host backends run everything synchronously). Copies and
 * memsets are enqueued: they may return before they finish (the host memory given to
 * h2d must stay valid and unchanged, and d2h's destination must not be read, until
 * kiln_backend.sync on that queue returns). Kernels run on kiln_kctx.stream.
 *
 * Errors: alloc fails with KILN_ERR_NOMEM (message names bytes and space), the others
 * with KILN_ERR_DEVICE carrying the driver's message; all take a kiln_err. */
typedef enum kiln_mem_space {
    KILN_MEM_DEVICE = 0, /* the backend's compute memory (host RAM on ref/cpu)         */
    KILN_MEM_STAGING,    /* host memory for fast copies (pinned on CUDA)               */
    KILN_MEM_SPACES
} kiln_mem_space;

/* One allocation. ptr is the address kernels of the backend use (a device pointer for
 * DEVICE on CUDA: never dereference it on the host); STAGING ptrs are host pointers. */
typedef struct kiln_buf {
    void *ptr;
    size_t size;
    kiln_mem_space space;
    uint32_t flags; /* backend-private (how it was allocated) */
} kiln_buf;

typedef void *kiln_queue;

/* One opened device of a backend (engines own one each; not shared between threads). */
typedef struct kiln_device {
    const struct kiln_backend *be;
    void *impl;       /* the backend's device state (kiln_kctx.dev)                 */
    kiln_queue queue; /* the queue steps run on (kiln_kctx.stream)                  */
    int32_t ordinal;  /* device number within the backend                           */
    /* the kernel selector of this device (runtime/kselect.h), built when the device
     * is opened from the process's selector configuration; the circuit breaker's
     * unhealthy marks are this device's alone */
    struct kiln_kselect *ks;
    char name[128]; /* "cpu: Intel Xeon ...", "cuda:0 NVIDIA H100 ..." (messages)  */
} kiln_device;

typedef struct kiln_backend {
    const char *name;
    /* the macro-op compositions (adapters.c; shared by every backend: a backend supplies
     * kernels and memory, never its own copy of a composition) */
    const kiln_adapter_fn *adapters; /* [KILN_OP_LIMIT] */
    bool (*weight_dtype_ok)(uint32_t dtype);
    /* DEVICE memory is host memory (ref, cpu): the engine reads outputs in place and
     * skips staging copies */
    bool host_memory;
    /* device: open fills dev->impl, queue, name (ordinal set by the caller) */
    kiln_status (*open)(kiln_device *dev, kiln_err *err);
    void (*close)(kiln_device *dev);
    /* memory (see above) */
    kiln_status (*alloc)(kiln_device *dev, kiln_mem_space space, size_t bytes, kiln_buf *out,
                         kiln_err *err);
    void (*free)(kiln_device *dev, kiln_buf *b); /* accepts an empty buf; clears it */
    kiln_status (*h2d)(kiln_device *dev, kiln_queue q, const kiln_buf *dst, size_t dst_off,
                       const void *src, size_t bytes, kiln_err *err);
    kiln_status (*d2h)(kiln_device *dev, kiln_queue q, void *dst, const kiln_buf *src,
                       size_t src_off, size_t bytes, kiln_err *err);
    kiln_status (*d2d)(kiln_device *dev, kiln_queue q, const kiln_buf *dst, size_t dst_off,
                       const kiln_buf *src, size_t src_off, size_t bytes, kiln_err *err);
    kiln_status (*memset)(kiln_device *dev, kiln_queue q, const kiln_buf *dst, size_t off, int byte,
                          size_t bytes, kiln_err *err);
    /* waits until everything enqueued on q has finished; reports a deferred device
     * error (KILN_ERR_DEVICE) */
    kiln_status (*sync)(kiln_device *dev, kiln_queue q, kiln_err *err);
    /* (optional) makes dev the calling thread's current device before it launches work
     * (CUDA: cudaSetDevice); a tensor-parallel group drives one device per thread.
     * NULL: nothing to do (host backends) */
    kiln_status (*bind_thread)(kiln_device *dev, kiln_err *err);
    /* the compute capability x10 the selector checks kernels' sm_min against (CUDA: the
     * first usable device's, probed once; NULL on host backends: 0) */
    int32_t (*compute_level)(void);
    /* step graphs (runtime/graph.h; NULL on backends without them): begin records the
     * work enqueued on q instead of running it, end stops recording and returns a
     * replayable graph (*graph NULL and an error when the device refused something
     * recorded), launch enqueues a graph on q, free releases it */
    kiln_status (*graph_begin)(kiln_device *dev, kiln_queue q, kiln_err *err);
    kiln_status (*graph_end)(kiln_device *dev, kiln_queue q, void **graph, kiln_err *err);
    kiln_status (*graph_launch)(kiln_device *dev, kiln_queue q, void *graph, kiln_err *err);
    void (*graph_free)(kiln_device *dev, void *graph);
} kiln_backend;

/* The buffer interface, checked: offsets and sizes are validated against the buffers
 * (KILN_ERR_RANGE naming the call) before the backend is called. */
kiln_status kiln_device_open(const kiln_backend *be, int32_t ordinal, kiln_device *dev,
                             kiln_err *err);
/* be->bind_thread when the backend has one (see there), else KILN_OK. */
kiln_status kiln_device_bind_thread(kiln_device *dev, kiln_err *err);
void kiln_device_close(kiln_device *dev);
kiln_status kiln_buf_alloc(kiln_device *dev, kiln_mem_space space, size_t bytes, kiln_buf *out,
                           kiln_err *err);
void kiln_buf_free(kiln_device *dev, kiln_buf *b);
kiln_status kiln_buf_h2d(kiln_device *dev, const kiln_buf *dst, size_t dst_off, const void *src,
                         size_t bytes, kiln_err *err);
kiln_status kiln_buf_d2h(kiln_device *dev, void *dst, const kiln_buf *src, size_t src_off,
                         size_t bytes, kiln_err *err);
kiln_status kiln_buf_d2d(kiln_device *dev, const kiln_buf *dst, size_t dst_off, const kiln_buf *src,
                         size_t src_off, size_t bytes, kiln_err *err);
kiln_status kiln_buf_memset(kiln_device *dev, const kiln_buf *dst, size_t off, int byte,
                            size_t bytes, kiln_err *err);
kiln_status kiln_device_sync(kiln_device *dev, kiln_err *err);

/* Host memory for ref/cpu (backend_host.c): DEVICE and STAGING are 64-byte aligned host
 * allocations (large ones mmap'd, committed on first touch), copies are memcpy. */
extern const kiln_backend kiln_backend_ref, kiln_backend_cpu;

/* "ref", "cpu" (host backends) or, in a CUDA build, "cuda"; "auto" is "cuda" when a CUDA
 * build finds a usable device (compute capability >= 8.0), else "cpu". NULL for an
 * unknown name. */
const kiln_backend *kiln_backend_find(const char *name);
/* The name "auto" resolves to (see kiln_backend_find); probes CUDA once per process. */
const char *kiln_backend_auto_name(void);
/* The backends built in, for messages: "ref, cpu" or "ref, cpu, cuda". */
const char *kiln_backend_names(void);

/* The binding function for one bucket: describes call site `cs` (bucket cs->bucket) to
 * the device's kernel chooser (runtime/kselect.h) and returns the kernel and, in *layout
 * (may be NULL), the weight layout that kernel asks for (kiln_wlayout). Fails with
 * KILN_ERR_UNSUPPORTED when no kernel of the backend can run it. A plan's binding fills
 * every bucket of a kiln_site at once with kiln_bind_site (kselect.h), the same path. */
kiln_status kiln_bind_callsite(kiln_device *dev, const kiln_callsite *cs, kiln_kernel_fn *out,
                               uint32_t *layout, kiln_err *err);

#endif /* KILN_RUNTIME_BACKEND_H */
