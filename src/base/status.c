#include "base/status.h"
#include "base/mem.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const status_names[] = {
    [KILN_OK] = "KILN_OK",
    [KILN_ERR_INVALID_ARG] = "KILN_ERR_INVALID_ARG",
    [KILN_ERR_NOMEM] = "KILN_ERR_NOMEM",
    [KILN_ERR_OVERFLOW] = "KILN_ERR_OVERFLOW",
    [KILN_ERR_IO] = "KILN_ERR_IO",
    [KILN_ERR_NOT_FOUND] = "KILN_ERR_NOT_FOUND",
    [KILN_ERR_FORMAT] = "KILN_ERR_FORMAT",
    [KILN_ERR_UNSUPPORTED] = "KILN_ERR_UNSUPPORTED",
    [KILN_ERR_TYPE] = "KILN_ERR_TYPE",
    [KILN_ERR_RANGE] = "KILN_ERR_RANGE",
    [KILN_ERR_STATE] = "KILN_ERR_STATE",
    [KILN_ERR_CAPACITY] = "KILN_ERR_CAPACITY",
    [KILN_ERR_DEVICE] = "KILN_ERR_DEVICE",
    [KILN_ERR_PLAN] = "KILN_ERR_PLAN",
    [KILN_ERR_CANCELLED] = "KILN_ERR_CANCELLED",
    [KILN_ERR_INTERNAL] = "KILN_ERR_INTERNAL",
};
static_assert(sizeof(status_names) / sizeof(status_names[0]) == KILN_STATUS_COUNT,
              "status_names must list every kiln_status");

const char *kiln_status_name(kiln_status s) {
    if ((unsigned)s >= KILN_STATUS_COUNT) return "KILN_STATUS_UNKNOWN";
    return status_names[s];
}

const char *kiln_version(void) {
    return KILN_VERSION_STRING;
}

void kiln_err_clear(kiln_err *err) {
    if (!err) return;
    err->code = KILN_OK;
    err->msg[0] = '\0';
}

kiln_status kiln_err_vset(kiln_err *err, kiln_status code, const char *fmt, va_list ap) {
    if (!err) return code;
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return code;
}

kiln_status kiln_err_set(kiln_err *err, kiln_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kiln_err_vset(err, code, fmt, ap);
    va_end(ap);
    return code;
}

kiln_status kiln_err_wrap(kiln_err *err, kiln_status code, const char *fmt, ...) {
    if (!err) return code;
    char prefix[KILN_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    int plen = vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (plen < 0) plen = 0;
    size_t p = (size_t)plen < sizeof prefix ? (size_t)plen : sizeof prefix - 1;
    size_t old = strnlen(err->msg, sizeof err->msg - 1);
    const size_t cap = sizeof err->msg - 1; /* room for characters, not the NUL */
    if (old == 0) {
        memcpy(err->msg, prefix, p);
        err->msg[p] = '\0';
    } else {
        /* new message: prefix + ": " + old, truncated to cap */
        size_t head = p + 2 < cap ? p + 2 : cap;
        size_t keep = old < cap - head ? old : cap - head;
        memmove(err->msg + head, err->msg, keep);
        memcpy(err->msg, prefix, head < p ? head : p);
        if (head > p) memcpy(err->msg + p, ": ", head - p);
        err->msg[head + keep] = '\0';
    }
    err->code = code;
    return code;
}

kiln_status kiln_err_errno(kiln_err *err, int errno_value, const char *fmt, ...) {
    if (!err) return KILN_ERR_IO;
    char m[KILN_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    kiln_status code = errno_value == ENOENT   ? KILN_ERR_NOT_FOUND
                       : errno_value == ENOMEM ? KILN_ERR_NOMEM
                                               : KILN_ERR_IO;
    return kiln_err_set(err, code, "%s: %s", m, strerror(errno_value));
}

/* The public API's error object (kiln.h): heap-allocated for callers that do not see
 * the struct's size. */
kiln_err *kiln_err_new(void) {
    return kiln_calloc(1, sizeof(kiln_err));
}
void kiln_err_free(kiln_err *err) {
    kiln_free(err);
}
const char *kiln_err_message(const kiln_err *err) {
    return err ? err->msg : "";
}
