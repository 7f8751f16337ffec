/* SPDX-License-Identifier: MIT */
/* Optional bearer-token authentication for the HTTP listener: the token is read once
 * from a file named in the config (at start and on reload) and compared in constant
 * time against "Authorization: Bearer <token>". Nothing here logs. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "error.h"
#include "macro.h"

#define AUTH_TOKEN_MAX 4096u /* bytes of a token file we read */

typedef struct HttpAuth {
        char *token; /* NULL: authentication is off */
        size_t len;
} HttpAuth;

/* Reads the token: the file's content without surrounding whitespace; it must be
 * non-empty, at most AUTH_TOKEN_MAX bytes, and printable ASCII without spaces (RFC 6750's
 * b64token is narrower; this refuses only what a header could not carry). path NULL or
 * "" turns authentication off. 0, or a negative code with a message naming the file. */
int http_auth_load(HttpAuth *a, const char *path, DsError *err);
void http_auth_clear(HttpAuth *a);

/* True when authentication is off, or when the Authorization header value (NULL when
 * absent) is "Bearer <token>" with the right token. Time does not depend on where the
 * token differs. */
bool http_auth_check(const HttpAuth *a, const char *authorization);
