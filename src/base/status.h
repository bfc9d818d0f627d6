/*
 * status.h — error context carried next to kiln_status.
 *
 * A fallible function takes a `kiln_err *err` (may be NULL) as its last argument and
 * returns a kiln_status. On failure it fills err with a formatted message; callers
 * that add context wrap it, so messages read outermost first:
 *   "loading m.gguf: tensor 'blk.3.attn_q.weight': offset 123 past end of file (size 100)"
 *
 * Usage:
 *   if (off > size)
 *       return kiln_err_set(err, KILN_ERR_FORMAT, "offset %llu past end of file (size %llu)", ...);
 *   kiln_status st = parse_tensor(..., err);
 *   if (st) return kiln_err_wrap(err, st, "tensor '%s'", name);
 *
 * The message buffer is fixed-size and truncates safely; nothing here allocates.
 */
#ifndef KILN_BASE_STATUS_H
#define KILN_BASE_STATUS_H

#include "kiln/kiln.h"

#include <stdarg.h>

#define KILN_ERR_MSG_MAX 1024

typedef struct kiln_err {
    kiln_status code;
    char msg[KILN_ERR_MSG_MAX];
} kiln_err;

#if defined(__GNUC__)
#define KILN_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KILN_PRINTF(a, b)
#endif

/* Clears err (code KILN_OK, empty message). err may be NULL. */
void kiln_err_clear(kiln_err *err);

/* Sets code and message (replacing any previous one); returns code. err may be NULL. */
kiln_status kiln_err_set(kiln_err *err, kiln_status code, const char *fmt, ...) KILN_PRINTF(3, 4);
kiln_status kiln_err_vset(kiln_err *err, kiln_status code, const char *fmt, va_list ap);

/* Prefixes the current message with "<context>: " and sets code; returns code.
 * When err holds no message yet, the context becomes the message. */
kiln_status kiln_err_wrap(kiln_err *err, kiln_status code, const char *fmt, ...) KILN_PRINTF(3, 4);

/* Sets an I/O error with strerror(errno_value) appended: "<msg>: <strerror>". */
kiln_status kiln_err_errno(kiln_err *err, int errno_value, const char *fmt, ...) KILN_PRINTF(3, 4);

/* Propagate a status: `KILN_TRY(call(..., err));` returns from the caller on error. */
#define KILN_TRY(expr)                                                                             \
    do {                                                                                           \
        kiln_status kiln_try_st_ = (expr);                                                         \
        if (kiln_try_st_ != KILN_OK) return kiln_try_st_;                                          \
    } while (0)

#endif /* KILN_BASE_STATUS_H */
