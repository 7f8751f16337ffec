/* SPDX-License-Identifier: MIT */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int ds_error(DsError *e, int code, const char *fmt, ...)
{
        va_list ap;

        if (!e)
                return code;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
        va_end(ap);
        e->code = code;
        return code;
}

int ds_error_prefix(DsError *e, const char *fmt, ...)
{
        char prefix[512], old[sizeof(e->msg)];
        va_list ap;

        if (!e)
                return 0;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof(prefix), fmt, ap);
        va_end(ap);
        memcpy(old, e->msg, sizeof(old));
        snprintf(e->msg, sizeof(e->msg), "%s: %s", prefix, old);
        return e->code;
}

const char *ds_strerror_internal(int code)
{
        switch (code) {
        case -DS_ERR_FORMAT:
                return "malformed input";
        case -DS_ERR_UNSUPPORTED:
                return "not supported";
        case -DS_ERR_CONTEXT_FULL:
                return "context length exceeded";
        case -DS_ERR_MODEL_NOT_LOADED:
                return "no model loaded";
        case -DS_ERR_WIRE_VERSION:
                return "protocol version mismatch";
        default:
                return strerror(-code);
        }
}
