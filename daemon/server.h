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
#include "session.h"

#define SERVER_IDS_MAX 64u
/* Client ids in ListClients()/Cancel() carry this bit, request ids never reach it. */
#define SERVER_CLIENT_ID_BIT (UINT64_C(1) << 48)
/* SIGTERM's drain deadline when the configuration gives none: below the unit's
 * TimeoutStopSec=90s, so systemd never has to kill a draining daemon. */
#define SERVER_STOP_DRAIN_USEC_DEFAULT (60u * 1000000u)

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
        int listen_fd;                 /* inherited from systemd (sd_listen_fds), or -1: bind */
        uint64_t stop_drain_usec;      /* SIGTERM: requests get this long to finish */
} ServerOptions;

/* What the daemon around the server does on the I/O thread. Every hook is optional. */
typedef struct ServerHooks {
        void *userdata;
        /* SIGHUP arrived. */
        void (*reload)(void *userdata);
        /* SIGTERM or SIGINT arrived and the drain begins. */
        void (*stopping)(void *userdata);
        /* Runs on every pass of the loop, after the completions (a watched fd may be
         * ready); returns the CLOCK_MONOTONIC usec by which it must run again, or
         * UINT64_MAX. */
        uint64_t (*service)(void *userdata);
} ServerHooks;

#define SERVER_WATCH_MAX 2u

/* Fills o with the defaults: no inherited socket, a 60 s drain on SIGTERM; socket
 * /run/dsd/dsd.sock mode 0666; root and the group
 * "dsd" when it exists, else our own uid; 256 clients, 64 requests each, 4096 pending
 * records, 5 s; the wire.h default segment. */
void server_options_init(ServerOptions *o);

typedef struct Server Server;

/* Binds the socket (removing a stale socket file) or takes o->listen_fd, and sets up the
 * ring. It serves no model until server_set_engine(): submissions are refused with
 * DS_WIRE_ERR_NO_MODEL. Every engine loop given later adds to notify_fd (not owned) when
 * it has events. */
int server_new(int notify_fd, const ServerOptions *o, const ServerHooks *hooks, Server **ret,
        DsError *err);

/* New requests go to e and loop from now on; the server owns both. The previous engine,
 * if any, retires: its requests finish on it, then its loop is stopped and both are freed
 * (on the I/O thread, at the first pass that finds it idle). -EBUSY (nothing changes)
 * while an earlier one still retires. Another failure (the HTTP listener could not be set
 * up for it) leaves e serving the native clients and fills err. */
/* Device memory of the current model's backend (0 and 0 without a model or on the CPU). */
void server_memory(Server *s, uint64_t *ret_used, uint64_t *ret_total);

int server_set_engine(Server *s, Engine *e, EngineLoop *loop, const char *model_dir, DsError *err);
/* Starts accepting connections without a model (state no-model); the first
 * server_set_engine() does it otherwise. Until then clients wait in the listen backlog, so
 * they connect while the model loads and are welcomed once it serves. */
void server_accept(Server *s);

/* The engine new requests go to, NULL for none; its context length (0 for none). */
Engine *server_engine(Server *s);
uint32_t server_context_length(Server *s);
/* An engine still finishing the requests it started before a reload. */
bool server_retiring(const Server *s);
/* No request in flight on any engine. */
bool server_idle(Server *s);
/* Stops and frees the current engine (its requests are cancelled), for a reload that
 * cannot hold two models: the caller drains first. */
void server_drop_engine(Server *s);

/* dsctl drain / resume: new requests get DS_WIRE_ERR_DRAINING (HTTP 503) while set. */
void server_set_draining(Server *s, bool draining);

/* Watches fd for events (POLLIN/POLLOUT) on the ring, slot idx < SERVER_WATCH_MAX; the
 * hooks' service() runs after it is ready. A watch already armed is left as it is;
 * fd -1 leaves the slot unused. */
void server_watch(Server *s, unsigned idx, int fd, int events);

/* The engine loops' counters summed, current and retiring; clients connected. */
void server_stats(Server *s, EngineLoopStats *ret, uint32_t *ret_clients);
/* Recent time to first token and between tokens, microseconds, at 50/90/99 %: a ring of
 * the last SERVER_LATENCY_SAMPLES samples of native clients; 0 without samples. */
#define SERVER_LATENCY_SAMPLES 4096u
void server_latencies(Server *s, uint64_t ttft[3], uint64_t itl[3]);
/* Calls fn for each connected, welcomed client; stops at fn's first negative return. */
int server_foreach_client(Server *s, int (*fn)(void *ctx, const Session *c), void *ctx);
/* Cancels the request with this daemon-wide id, or every request of the client whose
 * key is id & ~SERVER_CLIENT_ID_BIT; -ESRCH when none, -ENOMEM. */
int server_cancel(Server *s, uint64_t id);

/* Serves until SIGTERM or SIGINT (blocked by the caller in every thread), then stops
 * accepting and refuses new requests, lets the requests in flight finish until
 * o->stop_drain_usec, cancels what is left, delivers a final event for each request and
 * returns 0; or a negative code when the ring itself failed. */
int server_run(Server *s);

/* Closes every connection, removes the socket file (unless inherited), stops and frees
 * the engines. Accepts NULL. */
Server *server_free(Server *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(Server *, server_free);
