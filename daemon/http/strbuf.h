/* SPDX-License-Identifier: MIT */
/* A growable byte buffer for building HTTP responses and JSON text. Appends return 0 or
 * -ENOMEM (the buffer is unchanged then); data stays NUL-terminated when non-NULL. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "macro.h"

typedef struct StrBuf {
        char *data; /* (cap) */
        size_t len;
        size_t cap;
} StrBuf;

int strbuf_reserve(StrBuf *b, size_t extra);
int strbuf_append(StrBuf *b, const void *p, size_t n);
int strbuf_puts(StrBuf *b, const char *s);
int strbuf_printf(StrBuf *b, const char *fmt, ...) _printf_(2, 3);
/* Appends s as a JSON string literal, quotes included. Bytes that are not valid UTF-8
 * become U+FFFD, so the result is always valid JSON whatever s holds. */
int strbuf_json_string(StrBuf *b, const char *s, size_t n);
void strbuf_clear(StrBuf *b);
void strbuf_free(StrBuf *b);

/* The length of the valid UTF-8 sequence at s (1..4), or 0 when s[0..n) does not start
 * with one. */
size_t utf8_valid_len(const uint8_t *s, size_t n);
