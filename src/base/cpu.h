/*
 * cpu.h — facts about the host CPU, read once (cpuid, /proc/cpuinfo, sysinfo).
 * kiln_cpu_info() returns the process-wide, immutable description (a lazily
 * initialized singleton, safe to call from any thread).
 */
#ifndef KILN_BASE_CPU_H
#define KILN_BASE_CPU_H

#include <stdbool.h>
#include <stdint.h>

typedef enum kiln_isa {
    KILN_ISA_SSE42 = 1u << 0,
    KILN_ISA_AVX = 1u << 1,
    KILN_ISA_AVX2 = 1u << 2,
    KILN_ISA_FMA = 1u << 3,
    KILN_ISA_F16C = 1u << 4,
    KILN_ISA_AVX512F = 1u << 5,
    KILN_ISA_AVX512BW = 1u << 6,
    KILN_ISA_AVX512VL = 1u << 7,
    KILN_ISA_AVX512DQ = 1u << 8,
    KILN_ISA_AVX512VNNI = 1u << 9,
    KILN_ISA_AVX512BF16 = 1u << 10,
    KILN_ISA_AVXVNNI = 1u << 11,
    KILN_ISA_AMX_TILE = 1u << 12,
    KILN_ISA_AMX_INT8 = 1u << 13,
    KILN_ISA_AMX_BF16 = 1u << 14,
} kiln_isa;

typedef struct kiln_cpu {
    char model[128];
    int logical_cores;      /* online CPUs */
    uint32_t isa;           /* kiln_isa bits usable by this process (OS state checked) */
    uint64_t mem_total;     /* bytes */
    uint64_t mem_available; /* bytes, at the time of the first call */
} kiln_cpu;

const kiln_cpu *kiln_cpu_info(void);
/* Space-separated names of the bits in isa ("avx2 fma f16c ..."), into buf. */
void kiln_isa_names(uint32_t isa, char *buf, int n);
/* KILN_CPU_ISA_MASK (hex/decimal) may clear bits, e.g. to test the AVX2 paths on an
 * AVX-512 machine; it is applied in kiln_cpu_info(). */

#endif /* KILN_BASE_CPU_H */
