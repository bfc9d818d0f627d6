#include "base/log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* The logging singleton: threshold (-1 = not yet read from the environment) and sink. */
static struct {
    _Atomic int level;
    kiln_log_sink sink;
    void *user;
} kiln_log_state = {.level = -1};

kiln_status kiln_log_parse_level(const char *s, kiln_log_level *out) {
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++) {
        if (s && strcasecmp(s, names[i]) == 0) {
            *out = (kiln_log_level)i;
            return KILN_OK;
        }
    }
    if (s && strcasecmp(s, "warning") == 0) {
        *out = KILN_LOG_WARN;
        return KILN_OK;
    }
    return KILN_ERR_INVALID_ARG;
}

kiln_log_level kiln_log_level_get(void) {
    int l = atomic_load_explicit(&kiln_log_state.level, memory_order_relaxed);
    if (l >= 0) return (kiln_log_level)l;
    kiln_log_level lv = KILN_LOG_WARN;
    const char *env = getenv("KILN_LOG");
    if (env && *env && kiln_log_parse_level(env, &lv) != KILN_OK) {
        fprintf(stderr,
                "kiln: warning: KILN_LOG='%s' is not one of debug|info|warn|error|off; "
                "using warn\n",
                env);
        lv = KILN_LOG_WARN;
    }
    atomic_store_explicit(&kiln_log_state.level, (int)lv, memory_order_relaxed);
    return lv;
}

void kiln_log_set_level(kiln_log_level level) {
    atomic_store_explicit(&kiln_log_state.level, (int)level, memory_order_relaxed);
}

void kiln_log_set_sink(kiln_log_sink sink, void *user) {
    kiln_log_state.sink = sink;
    kiln_log_state.user = user;
}

void kiln_log_write(kiln_log_level level, const char *file, int line, const char *fmt, ...) {
    static const char *tags[] = {"debug", "info", "warn", "error", "off"};
    char body[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (kiln_log_state.sink) {
        kiln_log_state.sink(level, body, kiln_log_state.user);
        return;
    }
    if (level == KILN_LOG_DEBUG)
        fprintf(stderr, "kiln %s %s:%d: %s\n", tags[level], base, line, body);
    else
        fprintf(stderr, "kiln %s: %s\n", tags[level], body);
}
