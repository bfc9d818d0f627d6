/*
 * cmd_doctor.c — `kiln doctor`: what this machine offers kiln.
 *
 * CPU (model, cores, ISA features as the OS enables them), memory, CUDA (libcuda is
 * loaded with dlopen so the binary runs on machines without a GPU), GPUs with their
 * compute capability and memory, and the versions of the linked libraries.
 */
#include "base/cpu.h"
#include "cli/args.h"
#include "cli/commands.h"

#include <dlfcn.h>
#include <jansson.h>
#include <liburing.h>
#include <microhttpd.h>
#include <pcre2.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <utf8proc.h>
#include <xxhash.h>
#include <yaml.h>
#ifdef KILN_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef KILN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

/* True when the kernel lets this process create an io_uring (seccomp or old kernels may not). */
static int io_uring_probe_kernel(void) {
    struct io_uring ring;
    if (io_uring_queue_init(2, &ring, 0) != 0) return 0;
    io_uring_queue_exit(&ring);
    return 1;
}

typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_int_fn)(int *);
typedef int (*cu_dev_get_fn)(int *, int);
typedef int (*cu_name_fn)(char *, int, int);
typedef int (*cu_attr_fn)(int *, int, int);
typedef int (*cu_mem_fn)(size_t *, int);
typedef int (*cu_err_fn)(int, const char **);

static void report_cuda(void) {
    printf("\ncuda:\n");
#ifdef KILN_HAVE_CUDA
    printf("  built with CUDA support: yes\n");
#else
    printf("  built with CUDA support: no (configure with -DKILN_CUDA=ON)\n");
#endif
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("  driver: not available (%s)\n  usable: no\n", dlerror());
        return;
    }
    cu_init_fn cu_init = (cu_init_fn)dlsym(h, "cuInit");
    cu_int_fn drv_ver = (cu_int_fn)dlsym(h, "cuDriverGetVersion");
    cu_int_fn dev_count = (cu_int_fn)dlsym(h, "cuDeviceGetCount");
    cu_dev_get_fn dev_get = (cu_dev_get_fn)dlsym(h, "cuDeviceGet");
    cu_name_fn dev_name = (cu_name_fn)dlsym(h, "cuDeviceGetName");
    cu_attr_fn dev_attr = (cu_attr_fn)dlsym(h, "cuDeviceGetAttribute");
    cu_mem_fn dev_mem = (cu_mem_fn)dlsym(h, "cuDeviceTotalMem_v2");
    cu_err_fn err_str = (cu_err_fn)dlsym(h, "cuGetErrorString");
    if (!cu_init || !drv_ver || !dev_count || !dev_get || !dev_name || !dev_attr || !dev_mem) {
        printf("  driver: libcuda.so.1 found but lacks expected symbols\n  usable: no\n");
        dlclose(h);
        return;
    }
    int ver = 0;
    drv_ver(&ver);
    printf("  driver: libcuda.so.1, CUDA %d.%d\n", ver / 1000, (ver % 1000) / 10);
    int rc = cu_init(0);
    if (rc != 0) {
        const char *s = NULL;
        if (err_str) err_str(rc, &s);
        printf("  cuInit failed: %s (%d)\n  usable: no\n", s ? s : "unknown error", rc);
        dlclose(h);
        return;
    }
    int n = 0;
    dev_count(&n);
    printf("  devices: %d\n", n);
    for (int i = 0; i < n; i++) {
        int dev = 0, major = 0, minor = 0, sms = 0;
        char name[256] = "?";
        size_t mem = 0;
        dev_get(&dev, i);
        dev_name(name, sizeof name, dev);
        dev_attr(&major, 75, dev); /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
        dev_attr(&minor, 76, dev); /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR */
        dev_attr(&sms, 16, dev);   /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
        dev_mem(&mem, dev);
        printf("  gpu %d: %s, compute capability %d.%d, %d SMs, %.1f GiB\n", i, name, major, minor,
               sms, (double)mem / (1024.0 * 1024.0 * 1024.0));
    }
    printf("  usable: %s\n", n > 0 ? "yes" : "no (no devices)");
    dlclose(h);
}

int kiln_cmd_doctor(int argc, char **argv) {
    static const kiln_cmd_usage u = {
        "kiln doctor", "Report the CPU, memory, GPUs and libraries kiln can use on this machine."};
    const char *pos[1];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, NULL, 0, pos, 0, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;

    const kiln_cpu *c = kiln_cpu_info();
    char isa[512];
    kiln_isa_names(c->isa, isa, sizeof isa);
    printf("kiln %s (commit %s)\n\ncpu:\n", kiln_version(), KILN_GIT_COMMIT);
    printf("  model: %s\n  logical cores: %d\n  isa: %s\n", c->model, c->logical_cores, isa);
    const char *yn[] = {"no", "yes"};
    printf("  avx2: %s  fma: %s  f16c: %s\n", yn[!!(c->isa & KILN_ISA_AVX2)],
           yn[!!(c->isa & KILN_ISA_FMA)], yn[!!(c->isa & KILN_ISA_F16C)]);
    printf("  avx512 f/bw/vl/vnni/bf16: %s/%s/%s/%s/%s  amx: %s\n",
           yn[!!(c->isa & KILN_ISA_AVX512F)], yn[!!(c->isa & KILN_ISA_AVX512BW)],
           yn[!!(c->isa & KILN_ISA_AVX512VL)], yn[!!(c->isa & KILN_ISA_AVX512VNNI)],
           yn[!!(c->isa & KILN_ISA_AVX512BF16)], yn[!!(c->isa & KILN_ISA_AMX_TILE)]);
    printf("\nmemory:\n  total: %.1f GiB\n  available: %.1f GiB\n",
           (double)c->mem_total / (1u << 30), (double)c->mem_available / (1u << 30));
    report_cuda();

    printf("\nlibraries:\n");
    printf("  jansson %s\n", jansson_version_str());
    printf("  sqlite %s\n", sqlite3_libversion());
    char pcre[64] = "?";
    pcre2_config(PCRE2_CONFIG_VERSION, pcre);
    uint32_t jit = 0;
    pcre2_config(PCRE2_CONFIG_JIT, &jit);
    printf("  pcre2 %s (jit: %s)\n", pcre, jit ? "yes" : "no");
    printf("  utf8proc %s\n", utf8proc_version());
    printf("  libyaml %s\n", yaml_get_version_string());
    printf("  libmicrohttpd %s\n", MHD_get_version());
    unsigned xv = XXH_versionNumber();
    printf("  xxhash %u.%u.%u\n", xv / 10000, (xv / 100) % 100, xv % 100);
    printf("  liburing: linked (io_uring %s)\n", io_uring_probe_kernel() ? "usable" : "not usable");
#ifdef KILN_HAVE_OPENBLAS
    printf("  openblas: %s\n", openblas_get_config());
#else
    printf("  openblas: not built in\n");
#endif
#ifdef KILN_HAVE_ONEDNN
    const dnnl_version_t *dv = dnnl_version();
    printf("  onednn %d.%d.%d (%s)\n", dv->major, dv->minor, dv->patch,
           dv->cpu_runtime == 2 ? "omp" : "cpu");
#else
    printf("  onednn: not built in\n");
#endif
#ifdef KILN_HAVE_CUDA
    printf("  cuda toolkit (build): %d.%d\n", KILN_CUDA_VERSION_MAJOR, KILN_CUDA_VERSION_MINOR);
#endif
    return 0;
}
