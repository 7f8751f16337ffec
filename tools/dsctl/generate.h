/* SPDX-License-Identifier: MIT */
/* dsctl generate: one request through libdsclient, streamed to stdout. */
#pragma once

/* Runs `dsctl generate ...`; argv[0] is "generate". Returns the process exit code:
 * 0 done, 1 the daemon refused or failed (its message is printed), 2 bad arguments,
 * 3 no daemon at the socket. */
int dsctl_generate_main(int argc, char **argv);
