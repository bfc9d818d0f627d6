/*
 * mapguard.h — survive a model file that changes under its mapping.
 *
 * kiln maps model files (MAP_SHARED, read-only). When such a file is truncated while
 * mapped (another process rewrites it, a network file system drops it) or the disk
 * returns an I/O error for a page, touching the page raises SIGBUS and, unhandled, kills
 * the process — every user of a server with it. Readers register their mappings here;
 * a SIGBUS inside a registered range maps a zero page over the faulting page (so the
 * access completes), counts the fault, and execution goes on. Whoever computes from the
 * mapping then calls kiln_mapguard_check, which turns any fault since the last check
 * into KILN_ERR_IO naming the file, so results computed from zero pages are discarded.
 * A SIGBUS outside every registered range goes to the previous handler (or kills the
 * process as before).
 *
 * A process-wide singleton (signals are process-wide): a fixed table of ranges,
 * lock-free, so that the signal handler can read it. Thread-safe.
 */
#ifndef KILN_BASE_MAPGUARD_H
#define KILN_BASE_MAPGUARD_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>

/* Registers [addr, addr + len) mapped from path (the string must outlive the
 * registration). Installs the SIGBUS handler on first use. Returns false when the table
 * is full (the mapping is then unguarded, as before). */
bool kiln_mapguard_add(const void *addr, size_t len, const char *path);
/* Unregisters a range (before munmap). */
void kiln_mapguard_remove(const void *addr);
/* KILN_ERR_IO "<path> changed while mapped ..." when a guarded page faulted since the
 * last check (then resets), else KILN_OK. */
kiln_status kiln_mapguard_check(kiln_err *err);
/* Faults handled since the process started (tests). */
unsigned long kiln_mapguard_faults(void);

#endif /* KILN_BASE_MAPGUARD_H */
