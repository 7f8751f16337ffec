/* SPDX-License-Identifier: MIT */
/* The I/O thread (DESIGN.md §4 steps 1–3 and 6): one io_uring carries the listening
 * socket (multishot accept), every client's socket reads and writes, every client's
 * doorbell eventfd, the engine loop's notify eventfd and a signalfd. It authenticates and
 * welcomes clients, admits their submissions into the engine loop, and moves the engine's
 * events into each client's completion ring or socket. It never waits on a client and
 * keeps nothing it relies on in shared memory. */
#pragma once

#include <stdint.h>
#include <sys/types.h>

#include "engine.h"
#include "engine_loop.h"
#include "error.h"

#define SERVER_IDS_MAX 64u

struct HttpConfig;

typedef struct ServerOptions {
        const char *socket_path;
        mode_t socket_mode; /* of the socket file; the allow-list is the policy */
        /* A peer is allowed when its uid is in allow_uids or its primary or a
         * supplementary gid is in allow_gids. */
        uid_t allow_uids[SERVER_IDS_MAX];
        size_t n_allow_uids;
        gid_t allow_gids[SERVER_IDS_MAX];
        size_t n_allow_gids;
        uint32_t max_clients;     /* connections at once */
        uint32_t max_requests;    /* in flight per client */
        uint32_t max_pending;     /* undelivered event records per client: past it the
                                   * client's requests are paused */
        uint32_t slow_timeout_ms; /* paused this long: they fail as too slow */
        uint32_t sub_slots;       /* per segment, powers of two */
        uint32_t cpl_slots;
        uint32_t data_size;            /* data area bytes; also bounds socket-mode frames */
        uint32_t max_queue;            /* the engine's queue bound, for the welcome */
        const struct HttpConfig *http; /* NULL or listen "": no HTTP listener */
} ServerOptions;

/* Fills o with the defaults: socket /run/dsd/dsd.sock mode 0666; root and the group
 * "dsd" when it exists, else our own uid; 256 clients, 64 requests each, 4096 pending
 * records, 5 s; the wire.h default segment. */
void server_options_init(ServerOptions *o);

typedef struct Server Server;

/* Binds the socket (removing a stale socket file) and sets up the ring. The engine loop
 * runs already and adds to notify_fd when it has events; neither is owned. */
int server_new(Engine *e, EngineLoop *loop, int notify_fd, const ServerOptions *o, Server **ret,
        DsError *err);

/* Serves until SIGTERM or SIGINT (blocked by the caller in every thread), then stops
 * accepting, cancels the work in flight, delivers a final event for each request and
 * returns 0; or a negative code when the ring itself failed. */
int server_run(Server *s);

/* Closes every connection and removes the socket file. Accepts NULL. */
Server *server_free(Server *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(Server *, server_free);
