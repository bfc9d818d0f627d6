/*
 * log.h — leveled logging to stderr.
 *
 * The level comes from KILN_LOG=debug|info|warn|error|off (default: warn), read once
 * on first use, or from kiln_log_set_level(). The level check is a relaxed load and a
 * compare, made in the macro before any formatting, so a disabled KILN_DEBUG on a hot
 * path costs one predictable branch and no call.
 *
 * The level and the optional sink are the process-wide logging singleton
 * (kiln_log_state in log.c); an embedder may redirect output with kiln_log_set_sink.
 */
#ifndef KILN_BASE_LOG_H
#define KILN_BASE_LOG_H

#include "base/status.h"

typedef enum kiln_log_level {
    KILN_LOG_DEBUG = 0,
    KILN_LOG_INFO = 1,
    KILN_LOG_WARN = 2,
    KILN_LOG_ERROR = 3,
    KILN_LOG_OFF = 4,
} kiln_log_level;

typedef void (*kiln_log_sink)(kiln_log_level level, const char *line, void *user);

/* Current threshold (initialized from KILN_LOG on first call). */
kiln_log_level kiln_log_level_get(void);
void kiln_log_set_level(kiln_log_level level);
/* Parses "debug", "info", "warn", "error", "off"; returns KILN_ERR_INVALID_ARG otherwise. */
kiln_status kiln_log_parse_level(const char *s, kiln_log_level *out);
/* Replace the stderr sink (NULL restores stderr). */
void kiln_log_set_sink(kiln_log_sink sink, void *user);

void kiln_log_write(kiln_log_level level, const char *file, int line, const char *fmt, ...)
    KILN_PRINTF(4, 5);

#define KILN_LOG_AT(lvl, ...)                                                                      \
    do {                                                                                           \
        if ((lvl) >= kiln_log_level_get()) kiln_log_write((lvl), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#define KILN_DEBUG(...) KILN_LOG_AT(KILN_LOG_DEBUG, __VA_ARGS__)
#define KILN_INFO(...)  KILN_LOG_AT(KILN_LOG_INFO, __VA_ARGS__)
#define KILN_WARN(...)  KILN_LOG_AT(KILN_LOG_WARN, __VA_ARGS__)
#define KILN_ERROR(...) KILN_LOG_AT(KILN_LOG_ERROR, __VA_ARGS__)

#endif /* KILN_BASE_LOG_H */
