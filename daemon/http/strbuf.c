/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strbuf.h"

int strbuf_reserve(StrBuf *b, size_t extra)
{
        if (extra >= SIZE_MAX / 2 - b->len)
                return -ENOMEM;
        size_t need = b->len + extra + 1;
        if (need <= b->cap)
                return 0;
        size_t cap = MAX(b->cap * 2, MAX(need, (size_t) 256));
        char *d = realloc(b->data, cap);
        if (!d)
                return -ENOMEM;
        b->data = d;
        b->cap = cap;
        return 0;
}

int strbuf_append(StrBuf *b, const void *p, size_t n)
{
        int r = strbuf_reserve(b, n);
        if (r < 0)
                return r;
        if (n > 0)
                memcpy(b->data + b->len, p, n);
        b->len += n;
        b->data[b->len] = 0;
        return 0;
}

int strbuf_puts(StrBuf *b, const char *s)
{
        return strbuf_append(b, s, strlen(s));
}

int strbuf_printf(StrBuf *b, const char *fmt, ...)
{
        va_list ap;
        int n, r;

        va_start(ap, fmt);
        n = vsnprintf(NULL, 0, fmt, ap);
        va_end(ap);
        if (n < 0)
                return -EINVAL;
        r = strbuf_reserve(b, (size_t) n);
        if (r < 0)
                return r;
        va_start(ap, fmt);
        vsnprintf(b->data + b->len, (size_t) n + 1, fmt, ap);
        va_end(ap);
        b->len += (size_t) n;
        return 0;
}

size_t utf8_valid_len(const uint8_t *s, size_t n)
{
        if (n == 0)
                return 0;
        uint8_t c = s[0];
        if (c < 0x80)
                return 1;
        size_t len;
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf)
                len = 2, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef)
                len = 3, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4)
                len = 4, cp = c & 0x07;
        else
                return 0;
        if (n < len)
                return 0;
        for (size_t i = 1; i < len; i++) {
                if ((s[i] & 0xc0) != 0x80)
                        return 0;
                cp = (cp << 6) | (s[i] & 0x3f);
        }
        /* Overlong forms, surrogates and values past U+10FFFF. */
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
                (cp >= 0xd800 && cp <= 0xdfff))
                return 0;
        return len;
}

int strbuf_json_string(StrBuf *b, const char *s, size_t n)
{
        const uint8_t *u = (const uint8_t *) s;
        int r;

        /* Worst case: every byte becomes \u00XX or U+FFFD (6 bytes), plus the quotes. */
        if (n > (SIZE_MAX - 2) / 6)
                return -ENOMEM;
        r = strbuf_reserve(b, n * 6 + 2);
        if (r < 0)
                return r;
        b->data[b->len++] = '"';
        for (size_t i = 0; i < n;) {
                uint8_t c = u[i];
                if (c >= 0x80) {
                        size_t k = utf8_valid_len(u + i, n - i);
                        if (k == 0) {
                                memcpy(b->data + b->len, "\xef\xbf\xbd", 3);
                                b->len += 3;
                                i++;
                        } else {
                                memcpy(b->data + b->len, u + i, k);
                                b->len += k;
                                i += k;
                        }
                        continue;
                }
                i++;
                switch (c) {
                case '"':
                        memcpy(b->data + b->len, "\\\"", 2), b->len += 2;
                        break;
                case '\\':
                        memcpy(b->data + b->len, "\\\\", 2), b->len += 2;
                        break;
                case '\n':
                        memcpy(b->data + b->len, "\\n", 2), b->len += 2;
                        break;
                case '\r':
                        memcpy(b->data + b->len, "\\r", 2), b->len += 2;
                        break;
                case '\t':
                        memcpy(b->data + b->len, "\\t", 2), b->len += 2;
                        break;
                default:
                        if (c < 0x20 || c == 0x7f) {
                                snprintf(b->data + b->len, 7, "\\u%04x", c);
                                b->len += 6;
                        } else
                                b->data[b->len++] = (char) c;
                }
        }
        b->data[b->len++] = '"';
        b->data[b->len] = 0;
        return 0;
}

void strbuf_clear(StrBuf *b)
{
        b->len = 0;
        if (b->data)
                b->data[0] = 0;
}

void strbuf_free(StrBuf *b)
{
        free(b->data);
        *b = (StrBuf){};
}
