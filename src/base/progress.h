/*
 * progress.h — a one-line progress bar on stderr, drawn only when stderr is a TTY
 * (and KILN_NO_PROGRESS is unset). Redraws at most every 50 ms. Not thread-safe:
 * update it from one thread.
 */
#ifndef KILN_BASE_PROGRESS_H
#define KILN_BASE_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kiln_progress {
    bool enabled;
    char label[48];
    uint64_t total, done;
    uint64_t last_draw_ns, start_ns;
} kiln_progress;

void kiln_progress_begin(kiln_progress *p, const char *label, uint64_t total);
void kiln_progress_update(kiln_progress *p, uint64_t done);
/* Draws the final state and a newline (when enabled). */
void kiln_progress_end(kiln_progress *p);

#endif /* KILN_BASE_PROGRESS_H */
