/* SPDX-License-Identifier: MIT */
/* The sd_notify(3) protocol: how dsd tells systemd that it is loading, ready, reloading or
 * stopping, and that the engine loop is alive. Every call is a no-op returning 0 when
 * NOTIFY_SOCKET is unset (not started by systemd) or when dsd was built without libsystemd
 * (-Dsystemd=disabled). The calls return a negative errno when the message could not be
 * sent; callers log that once, ", ignoring", since the service keeps working without it. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "macro.h"

#include "error.h"

/* The listening socket systemd passed (dsd.socket, sd_listen_fds(3)), checked to be a
 * listening Unix stream socket bound to path: its fd; -ENOENT when none was passed (or
 * without libsystemd); another negative code with a message when what was passed is not
 * usable. */
int notify_listen_fd(const char *path, DsError *err);

/* READY=1 with a STATUS= line: weights are resident and requests are served. */
int notify_ready(const char *status);

/* STATUS=: a free-form line systemctl status shows ("loading 12/28 layers"). */
int notify_status(const char *fmt, ...) _printf_(1, 2);

/* RELOADING=1 with MONOTONIC_USEC=now, as systemd 253's Type=notify-reload expects; the
 * reload ends with notify_ready(). */
int notify_reloading(const char *status);

/* STOPPING=1 with a STATUS= line, when shutdown (draining) begins. */
int notify_stopping(const char *status);

/* WATCHDOG=1. Send it from the engine loop itself, so that a hung engine stops the pings
 * and systemd restarts the service. */
int notify_watchdog(void);

/* The watchdog period systemd expects (WatchdogSec=) in microseconds, or 0 when the
 * watchdog is off for this process. Ping at half of it. */
uint64_t notify_watchdog_usec(void);
