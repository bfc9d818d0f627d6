/*
 * kiln.h — the public C API of kiln.
 *
 * Conventions (hold for every function declared here and in src/):
 *  - Every fallible function returns a kiln_status. KILN_OK is 0; anything else is
 *    an error whose human-readable message is written to the kiln_err the caller
 *    passed (which may be NULL when the caller does not want the message).
 *  - Objects are opaque handles created by kiln_<class>_create / _open and released
 *    by kiln_<class>_free / _close, which accept NULL.
 *  - Sizes are size_t or int64_t; counts from files are checked before use.
 *  - Library code never calls exit() or abort() on data from a file, a client or a
 *    user: such data yields a status and a message naming what is wrong and where.
 */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION_MAJOR  0
#define KILN_VERSION_MINOR  1
#define KILN_VERSION_PATCH  0
#define KILN_VERSION_STRING "0.1.0"

/* The one status enum of kiln. Keep kiln_status_name() in src/base/status.c in sync
 * (a static_assert there checks the count). */
typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_INVALID_ARG, /* a caller passed a bad argument (API misuse)         */
    KILN_ERR_NOMEM,       /* an allocation failed                                */
    KILN_ERR_OVERFLOW,    /* a size computation overflowed                       */
    KILN_ERR_IO,          /* a system call on a file or socket failed            */
    KILN_ERR_NOT_FOUND,   /* a file, key, tensor or name does not exist          */
    KILN_ERR_FORMAT,      /* malformed data in a file (bad magic, bad bounds...) */
    KILN_ERR_UNSUPPORTED, /* well-formed, but kiln does not implement it         */
    KILN_ERR_TYPE,        /* a value has the wrong type (metadata, dtype...)     */
    KILN_ERR_RANGE,       /* a value is outside its allowed range                */
    KILN_ERR_STATE,       /* an object is in the wrong state for the call        */
    KILN_ERR_CAPACITY,    /* a budget or pool is exhausted (KV blocks, slots)    */
    KILN_ERR_DEVICE,      /* a GPU / driver call failed                          */
    KILN_ERR_PLAN,        /* an execution plan failed validation                 */
    KILN_ERR_CANCELLED,   /* the operation was cancelled                         */
    KILN_ERR_INTERNAL,    /* a bug in kiln                                       */
    KILN_STATUS_COUNT
} kiln_status;

/* Returns a static, stable name such as "KILN_ERR_FORMAT". Never NULL. */
const char *kiln_status_name(kiln_status s);

/* Version string of the library ("0.1.0"). */
const char *kiln_version(void);

#ifdef __cplusplus
}
#endif
#endif /* KILN_KILN_H */
