/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "auth.h"

int http_auth_load(HttpAuth *a, const char *path, DsError *err)
{
        _cleanup_close_ int fd = -EBADF;
        char buf[AUTH_TOKEN_MAX + 2];
        size_t n = 0;

        if (!path || !*path) {
                http_auth_clear(a);
                return 0;
        }
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return ds_error(err, -errno, "cannot open token file '%s': %m", path);
        /* One byte past the limit tells a file that is too long from one that fits. */
        while (n < sizeof(buf) - 1) {
                ssize_t k = read(fd, buf + n, sizeof(buf) - 1 - n);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return ds_error(err, -errno, "cannot read token file '%s': %m", path);
                if (k == 0)
                        break;
                n += (size_t) k;
        }
        buf[n] = 0;
        const char *s = buf;
        while (n > 0 && strchr(" \t\r\n", buf[n - 1]))
                buf[--n] = 0;
        while (*s && strchr(" \t\r\n", *s))
                s++, n--;
        if (n == 0)
                return ds_error(err, -EINVAL, "token file '%s' is empty", path);
        if (n > AUTH_TOKEN_MAX)
                return ds_error(err, -EINVAL, "token file '%s' is longer than %u bytes", path,
                        AUTH_TOKEN_MAX);
        for (size_t i = 0; i < n; i++)
                if ((unsigned char) s[i] <= 0x20 || (unsigned char) s[i] >= 0x7f)
                        return ds_error(err, -EINVAL,
                                "token file '%s' holds a byte that is "
                                "not printable ASCII (offset %zu)",
                                path, i);
        char *t = strndup(s, n);
        explicit_bzero(buf, sizeof(buf));
        if (!t)
                return ds_error(err, -ENOMEM, "out of memory");
        http_auth_clear(a);
        a->token = t;
        a->len = n;
        return 0;
}

void http_auth_clear(HttpAuth *a)
{
        if (a->token)
                explicit_bzero(a->token, a->len);
        free(a->token);
        *a = (HttpAuth){};
}

bool http_auth_check(const HttpAuth *a, const char *authorization)
{
        if (!a->token)
                return true;
        if (!authorization || strncasecmp(authorization, "Bearer ", 7) != 0)
                return false;
        const char *given = authorization + 7;
        while (*given == ' ')
                given++;
        size_t n = strlen(given);

        /* Every byte of the expected token is compared whatever the given one holds; the
         * length difference joins the result instead of ending early. */
        unsigned diff = n != a->len;
        for (size_t i = 0; i < a->len; i++)
                diff |= (unsigned char) a->token[i] ^ (unsigned char) (i < n ? given[i] : 0);
        return diff == 0;
}
