/* SPDX-License-Identifier: MIT */
#include "notify.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#if HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

/* sd_notify() returns 0 when NOTIFY_SOCKET is unset and > 0 when the message was sent;
 * callers only need to know about failures. */
static int notify_send(const char *msg)
{
#if HAVE_LIBSYSTEMD
        int r = sd_notify(0, msg);
        return r < 0 ? r : 0;
#else
        (void) msg;
        return 0;
#endif
}

int notify_listen_fd(const char *path, DsError *err)
{
#if HAVE_LIBSYSTEMD
        int n = sd_listen_fds(true);

        if (n < 0)
                return ds_error(err, n, "cannot read the sockets systemd passed: %s", strerror(-n));
        if (n == 0)
                return -ENOENT;
        if (n > 1)
                return ds_error(err, -EINVAL, "systemd passed %d sockets, dsd takes one", n);
        if (sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_STREAM, 1, path, 0) <= 0)
                return ds_error(err, -EINVAL,
                        "the socket systemd passed is not a listening Unix stream socket on "
                        "'%s' (socket.path and dsd.socket's ListenStream= must agree)",
                        path);
        return SD_LISTEN_FDS_START;
#else
        (void) path;
        (void) err;
        return -ENOENT;
#endif
}

static uint64_t monotonic_usec(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

/* Sends PREFIX, plus "\nSTATUS=status" when status is not NULL. A newline in status would
 * start a new assignment, so it becomes a space. */
static int notify_with_status(const char *prefix, const char *status)
{
        char line[512], buf[1024];

        if (!getenv("NOTIFY_SOCKET"))
                return 0;
        if (!status)
                return notify_send(prefix);
        snprintf(line, sizeof(line), "%s", status);
        for (char *p = line; *p; p++)
                if (*p == '\n')
                        *p = ' ';
        snprintf(buf, sizeof(buf), "%s%sSTATUS=%s", prefix, prefix[0] ? "\n" : "", line);
        return notify_send(buf);
}

int notify_ready(const char *status)
{
        return notify_with_status("READY=1", status);
}

int notify_status(const char *fmt, ...)
{
        char status[512];
        va_list ap;

        if (!getenv("NOTIFY_SOCKET"))
                return 0;
        va_start(ap, fmt);
        vsnprintf(status, sizeof(status), fmt, ap);
        va_end(ap);
        return notify_with_status("", status);
}

int notify_reloading(const char *status)
{
        char prefix[96];

        snprintf(prefix, sizeof(prefix), "RELOADING=1\nMONOTONIC_USEC=%llu",
                (unsigned long long) monotonic_usec());
        return notify_with_status(prefix, status);
}

int notify_stopping(const char *status)
{
        return notify_with_status("STOPPING=1", status);
}

int notify_watchdog(void)
{
        return notify_with_status("WATCHDOG=1", NULL);
}

uint64_t notify_watchdog_usec(void)
{
#if HAVE_LIBSYSTEMD
        uint64_t usec = 0;
        /* Checks WATCHDOG_PID too, so a child that inherited the variables stays quiet. */
        if (sd_watchdog_enabled(0, &usec) <= 0)
                return 0;
        return usec;
#else
        return 0;
#endif
}
