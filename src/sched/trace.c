/*
 * trace.c — `--trace FILE`: a Chrome trace (chrome://tracing, Perfetto) of the
 * scheduler: one complete event per step (tokens, decode/prefill split, engine and
 * scheduler time), instant events for admissions, preemptions and finishes. The file
 * is a JSON array written as events happen and closed with "]" at kiln_sched_free
 * (viewers also accept an unclosed array after a crash).
 */
#include "sched/sched_impl.h"

#include "base/timer.h"

#include <errno.h>

kiln_status ks_trace_open(ks_trace *t, const char *path, kiln_err *err) {
    t->f = fopen(path, "w");
    if (!t->f) return kiln_err_errno(err, errno, "--trace %s", path);
    t->t0 = kiln_now_ns();
    t->first = true;
    fputs("[\n", t->f);
    return KILN_OK;
}

void ks_trace_close(ks_trace *t) {
    if (!t->f) return;
    fputs("\n]\n", t->f);
    fclose(t->f);
    t->f = NULL;
}

void ks_trace_event(ks_trace *t, const char *name, char ph, uint64_t ts_ns, uint64_t dur_ns,
                    const char *args_json) {
    if (!t->f) return;
    double ts = (double)(ts_ns - t->t0) * 1e-3;
    fprintf(t->f, "%s{\"name\":\"%s\",\"cat\":\"sched\",\"ph\":\"%c\",\"ts\":%.3f,",
            t->first ? "" : ",\n", name, ph, ts);
    if (ph == 'X') fprintf(t->f, "\"dur\":%.3f,", (double)dur_ns * 1e-3);
    if (ph == 'i') fputs("\"s\":\"p\",", t->f);
    fprintf(t->f, "\"pid\":1,\"tid\":%d,\"args\":%s}", ph == 'X' ? 1 : 2,
            args_json ? args_json : "{}");
    t->first = false;
}
