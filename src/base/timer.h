/*
 * timer.h — monotonic clocks. kiln_now_ns() reads CLOCK_MONOTONIC; cheap (vDSO).
 */
#ifndef KILN_BASE_TIMER_H
#define KILN_BASE_TIMER_H

#include <stdint.h>
#include <time.h>

static inline uint64_t kiln_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static inline double kiln_now_s(void) {
    return (double)kiln_now_ns() * 1e-9;
}
static inline double kiln_elapsed_ms(uint64_t start_ns) {
    return (double)(kiln_now_ns() - start_ns) * 1e-6;
}

#endif /* KILN_BASE_TIMER_H */
