
#include "base/cpu.h"

#include "base/pool.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

static kiln_cpu cpu_singleton;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void detect_isa(kiln_cpu *c) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, cx, d;
    if (!__get_cpuid(1, &a, &b, &cx, &d)) return;
    bool osxsave = cx & (1u << 27);
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    bool ymm = (xcr0 & 6) == 6, zmm = (xcr0 & 0xe6) == 0xe6;
    bool amx = (xcr0 & (3ull << 17)) == (3ull << 17);
    if (cx & (1u << 20)) c->isa |= KILN_ISA_SSE42;
    if ((cx & (1u << 28)) && ymm) c->isa |= KILN_ISA_AVX;
    if ((cx & (1u << 12)) && ymm) c->isa |= KILN_ISA_FMA;
    if ((cx & (1u << 29)) && ymm) c->isa |= KILN_ISA_F16C;
    if (__get_cpuid_count(7, 0, &a, &b, &cx, &d)) {
        if ((b & (1u << 5)) && ymm) c->isa |= KILN_ISA_AVX2;
        if (zmm) {
            if (b & (1u << 16)) c->isa |= KILN_ISA_AVX512F;
            if (b & (1u << 17)) c->isa |= KILN_ISA_AVX512DQ;
            if (b & (1u << 30)) c->isa |= KILN_ISA_AVX512BW;
            if (b & (1u << 31)) c->isa |= KILN_ISA_AVX512VL;
            if (cx & (1u << 11)) c->isa |= KILN_ISA_AVX512VNNI;
        }
        if (amx) {
            if (d & (1u << 24)) c->isa |= KILN_ISA_AMX_TILE;
            if (d & (1u << 25)) c->isa |= KILN_ISA_AMX_INT8;
            if (d & (1u << 22)) c->isa |= KILN_ISA_AMX_BF16;
        }
        unsigned a1, b1, c1, d1;
        if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) {
            if ((a1 & (1u << 5)) && zmm) c->isa |= KILN_ISA_AVX512BF16;
            if ((a1 & (1u << 4)) && ymm) c->isa |= KILN_ISA_AVXVNNI;
        }
    }
    unsigned regs[12];
    if (__get_cpuid(0x80000000, &a, &b, &cx, &d) && a >= 0x80000004) {
        for (unsigned i = 0; i < 3; i++)
            __get_cpuid(0x80000002 + i, &regs[i * 4], &regs[i * 4 + 1], &regs[i * 4 + 2],
                        &regs[i * 4 + 3]);
        memcpy(c->model, regs, 48);
        c->model[48] = '\0';
    }
#else
    (void)c;
#endif
}

static void cpu_init(void) {
    kiln_cpu *c = &cpu_singleton;
    snprintf(c->model, sizeof c->model, "unknown");
    detect_isa(c);
    /* trim leading spaces of the brand string */
    char *m = c->model;
    while (*m == ' ') m++;
    memmove(c->model, m, strlen(m) + 1);
    c->logical_cores = kiln_cpu_count();
    struct sysinfo si;
    if (sysinfo(&si) == 0) {
        c->mem_total = (uint64_t)si.totalram * si.mem_unit;
        c->mem_available = ((uint64_t)si.freeram + si.bufferram) * si.mem_unit;
    }
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) c->mem_available = kb * 1024ull;
        fclose(f);
    }
    const char *mask = getenv("KILN_CPU_ISA_MASK");
    if (mask && *mask) c->isa &= (uint32_t)strtoul(mask, NULL, 0);
}

const kiln_cpu *kiln_cpu_info(void) {
    pthread_once(&cpu_once, cpu_init);
    return &cpu_singleton;
}

void kiln_isa_names(uint32_t isa, char *buf, int n) {
    static const char *names[] = {"sse4.2",     "avx",      "avx2",     "fma",      "f16c",
                                  "avx512f",    "avx512bw", "avx512vl", "avx512dq", "avx512vnni",
                                  "avx512bf16", "avxvnni",  "amx-tile", "amx-int8", "amx-bf16"};
    int off = 0;
    buf[0] = '\0';
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!(isa & (1u << i))) continue;
        int w = snprintf(buf + off, (size_t)(n - off), "%s%s", off ? " " : "", names[i]);
        if (w < 0 || w >= n - off) break;
        off += w;
    }
}
