#include "base/progress.h"

#include "base/timer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void draw(kiln_progress *p) {
    const int width = 30;
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    if (frac > 1.0) frac = 1.0;
    int fill = (int)(frac * width);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    double secs = (double)(kiln_now_ns() - p->start_ns) * 1e-9;
    fprintf(stderr, "\r%s [%s] %5.1f%% %.1fs", p->label, bar, frac * 100.0, secs);
    fflush(stderr);
}

void kiln_progress_begin(kiln_progress *p, const char *label, uint64_t total) {
    memset(p, 0, sizeof *p);
    p->enabled = isatty(STDERR_FILENO) && !getenv("KILN_NO_PROGRESS");
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
    p->total = total;
    p->start_ns = kiln_now_ns();
}

void kiln_progress_update(kiln_progress *p, uint64_t done) {
    p->done = done;
    if (!p->enabled) return;
    uint64_t now = kiln_now_ns();
    if (now - p->last_draw_ns < 50000000ull) return;
    p->last_draw_ns = now;
    draw(p);
}

void kiln_progress_end(kiln_progress *p) {
    if (!p->enabled) return;
    p->done = p->total;
    draw(p);
    fputc('\n', stderr);
}
