/* SPDX-License-Identifier: MIT */
/* A small stand-in for dsd that speaks the wire protocol (ipc/wire.h) in a child process,
 * so libdsclient can be tested without a model. It serves connections one after another:
 * each SUBMIT of text gets one TOKEN per prompt byte (token id = the byte, text = the
 * byte), then a FINAL (length). Prompts with special meanings:
 *   "long..."  one more token whose text is 1000 bytes of 'x' (TEXT continuation records)
 *              with top_logprobs alternatives;
 *   "hang"     no tokens: the request waits until cancelled (FINAL cancelled);
 *   "busy"     an ERROR DS_WIRE_ERR_BUSY with a message.
 * INFO_REQ gets an INFO (active 1, queued 2, clients 3, KV 100 total / 40 free). */
#pragma once

#include <sys/types.h>

enum {
        FAKE_SERVE,          /* accept ring or socket mode, as asked */
        FAKE_REFUSE_VERSION, /* answer every hello with status VERSION, version 99 */
};

/* Forks the fake daemon listening on path; returns its pid. */
pid_t fake_daemon_start(const char *path, int behaviour);
