/* SPDX-License-Identifier: MIT */
/* One line per event on stderr. When stderr is connected to the journal (systemd sets
 * JOURNAL_STREAM) each line carries a "<N>" syslog priority prefix instead of a tag, the
 * form sd-daemon(3) describes, so journald records the right level. */
#pragma once

#include "macro.h"

enum {
        LOG_LVL_ERR = 3,
        LOG_LVL_WARNING = 4,
        LOG_LVL_NOTICE = 5,
        LOG_LVL_INFO = 6,
        LOG_LVL_DEBUG = 7
};

void log_set_max_level(int level);

/* Logs and returns -abs(error) (or 0 when error is 0), for `return log_error_errno(r, ...)`. */
int log_full_errno(int level, int error, const char *fmt, ...) _printf_(3, 4);

#define log_error(...)            log_full_errno(LOG_LVL_ERR, 0, __VA_ARGS__)
#define log_warning(...)          log_full_errno(LOG_LVL_WARNING, 0, __VA_ARGS__)
#define log_notice(...)           log_full_errno(LOG_LVL_NOTICE, 0, __VA_ARGS__)
#define log_info(...)             log_full_errno(LOG_LVL_INFO, 0, __VA_ARGS__)
#define log_debug(...)            log_full_errno(LOG_LVL_DEBUG, 0, __VA_ARGS__)
#define log_error_errno(e, ...)   log_full_errno(LOG_LVL_ERR, (e), __VA_ARGS__)
#define log_warning_errno(e, ...) log_full_errno(LOG_LVL_WARNING, (e), __VA_ARGS__)
