/* SPDX-License-Identifier: MIT */
/* dsctl's management verbs, spoken over D-Bus to io.dsd.Daemon1: status, reload [MODEL],
 * drain, resume, clients, stats, cancel ID. */
#pragma once

#include <stdbool.h>

/* Exit codes of every dsctl verb. */
enum {
        DSCTL_EXIT_OK = 0,
        DSCTL_EXIT_DAEMON = 1,      /* the daemon refused or failed; its message is printed */
        DSCTL_EXIT_USAGE = 2,       /* bad arguments; the bad one is named */
        DSCTL_EXIT_NOT_RUNNING = 3, /* no dsd on the chosen bus */
};

/* Whether verb is one of the bus verbs above. */
bool dsctl_bus_handles(const char *verb);

/* Runs one bus verb. argv holds the verb, its arguments and the options --json (status,
 * clients, stats), --system (the default) and --user, in any order: dsctl's main passes
 * argv + 1 both for "dsctl status --json" and for "dsctl --user status".
 * The environment variable DSD_BUS (system or session; another non-empty value is a usage
 * error) picks the bus when neither option is given. Returns a DSCTL_EXIT_* code for
 * main() to return. */
int dsctl_bus_main(int argc, char **argv);
