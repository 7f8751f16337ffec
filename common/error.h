/* SPDX-License-Identifier: MIT */
/* Errors are values: functions return 0 (or a count) on success and a negative code on
 * failure. Code that knows the context (the file, the tensor, the field) also fills a
 * DsError so the edge that logs can print one complete line. */
#pragma once

#include <errno.h>

#include "macro.h"

/* Project codes live above every errno value. */
enum {
        DS_ERR_BASE = 4096,
        DS_ERR_FORMAT,       /* a file or record is malformed */
        DS_ERR_UNSUPPORTED,  /* well-formed, but a feature dsd does not implement */
        DS_ERR_CONTEXT_FULL, /* a sequence would pass the context limit */
        DS_ERR_MODEL_NOT_LOADED,
        DS_ERR_WIRE_VERSION,
        _DS_ERR_MAX,
};

typedef struct DsError {
        int code;       /* the negative code last returned through ds_error() */
        char msg[1024]; /* one line, no trailing newline */
} DsError;

/* Formats the message into e (which may be NULL) and returns code, so that callers can
 * write `return ds_error(err, -EINVAL, "...")`. code must be negative. */
int ds_error(DsError *e, int code, const char *fmt, ...) _printf_(3, 4);

/* Prefixes an existing message with more context: "context: old message". */
int ds_error_prefix(DsError *e, const char *fmt, ...) _printf_(2, 3);

/* A static string for a negative errno or project code. */
const char *ds_strerror_internal(int code);
