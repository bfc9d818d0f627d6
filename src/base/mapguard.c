/* mapguard.c — see mapguard.h. */
#include "base/mapguard.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SLOTS 256

/* The process-wide guard (a singleton: signal handlers are per process). */
static struct {
    _Atomic uintptr_t base[SLOTS]; /* 0: free slot */
    _Atomic size_t len[SLOTS];
    const char *_Atomic path[SLOTS];
    _Atomic unsigned long faults; /* ever */
    _Atomic int pending_slot;     /* slot + 1 of a fault not yet checked, 0: none */
    struct sigaction previous;
} g_guard;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < SLOTS; i++) {
        uintptr_t b = atomic_load(&g_guard.base[i]);
        if (!b || a < b || a - b >= atomic_load(&g_guard.len[i])) continue;
        long ps = sysconf(_SC_PAGESIZE); /* async-signal-safe */
        uintptr_t page = a & ~(uintptr_t)(ps - 1);
        void *p = mmap((void *)page, (size_t)ps, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                       -1, 0);
        if (p == MAP_FAILED) break;
        atomic_fetch_add(&g_guard.faults, 1);
        atomic_store(&g_guard.pending_slot, i + 1);
        return; /* the access is retried and reads zeros */
    }
    /* not ours: the previous disposition */
    if (g_guard.previous.sa_flags & SA_SIGINFO) {
        if (g_guard.previous.sa_sigaction) {
            g_guard.previous.sa_sigaction(sig, si, uc);
            return;
        }
    } else if (g_guard.previous.sa_handler != SIG_DFL && g_guard.previous.sa_handler != SIG_IGN) {
        g_guard.previous.sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

/* (Re)installs the handler when SIGBUS is not ours (first use, or someone — a test
 * harness, a sanitizer — replaced it since): ours goes first, theirs is chained. */
static void install(void) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) == 0 &&
        !((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        g_guard.previous = cur;
        sigaction(SIGBUS, &sa, NULL);
    }
    pthread_mutex_unlock(&mu);
}

bool kiln_mapguard_add(const void *addr, size_t len, const char *path) {
    if (!addr || !len) return true;
    install();
    for (int i = 0; i < SLOTS; i++) {
        uintptr_t zero = 0;
        if (atomic_load(&g_guard.base[i]) != 0) continue;
        /* claim with a placeholder so the handler never sees base without len */
        if (!atomic_compare_exchange_strong(&g_guard.base[i], &zero, (uintptr_t)-1)) continue;
        atomic_store(&g_guard.len[i], len);
        atomic_store(&g_guard.path[i], path);
        atomic_store(&g_guard.base[i], (uintptr_t)addr);
        return true;
    }
    return false;
}

void kiln_mapguard_remove(const void *addr) {
    for (int i = 0; i < SLOTS; i++)
        if (addr && atomic_load(&g_guard.base[i]) == (uintptr_t)addr) {
            atomic_store(&g_guard.len[i], 0);
            atomic_store(&g_guard.base[i], 0);
            return;
        }
}

kiln_status kiln_mapguard_check(kiln_err *err) {
    int s = atomic_exchange(&g_guard.pending_slot, 0);
    if (!s) return KILN_OK;
    const char *path = atomic_load(&g_guard.path[s - 1]);
    return kiln_err_set(err, KILN_ERR_IO,
                        "%s changed while mapped (truncated, or a read error): the data read from "
                        "it is not the model's; reload the model",
                        path && atomic_load(&g_guard.base[s - 1]) ? path : "a model file");
}

unsigned long kiln_mapguard_faults(void) {
    return atomic_load(&g_guard.faults);
}
