/* SPDX-License-Identifier: MIT */
#include "log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

static int max_level = LOG_LVL_INFO;

void log_set_max_level(int level)
{
        max_level = level;
}

static bool to_journal(void)
{
        static int cached = -1;

        if (cached < 0)
                cached = getenv("JOURNAL_STREAM") != NULL;
        return cached;
}

int log_full_errno(int level, int error, const char *fmt, ...)
{
        static const char *const tags[] = {
                [LOG_LVL_ERR] = "error: ",
                [LOG_LVL_WARNING] = "warning: ",
                [LOG_LVL_NOTICE] = "",
                [LOG_LVL_INFO] = "",
                [LOG_LVL_DEBUG] = "debug: ",
        };
        char line[2048];
        va_list ap;
        int saved = errno;

        if (error > 0)
                error = -error;
        if (level > max_level)
                return error;

        va_start(ap, fmt);
        vsnprintf(line, sizeof(line), fmt, ap);
        va_end(ap);
        if (to_journal())
                fprintf(stderr, "<%d>%s\n", level, line);
        else
                fprintf(stderr, "%s%s\n", tags[level], line);
        errno = saved;
        return error;
}
