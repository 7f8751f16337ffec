/* SPDX-License-Identifier: MIT */
/* The OpenAI-compatible HTTP listener (docs/http.md). It lives on the server's io_uring
 * I/O thread: the server hands it its ring, routes the completions of IO_HTTP operations
 * and the engine events of HTTP requests to it, and it submits its own accepts, receives,
 * sends and one periodic timeout on that ring. No thread or event loop of its own.
 *
 * Each connection serves one request at a time (pipelined requests wait in its input
 * buffer); a completion request goes to the engine loop like a native one, under the
 * connection's own client key, and a connection that closes mid-answer cancels it. */
#pragma once

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "engine_loop.h"
#include "error.h"
#include "http_parser.h"
#include "metrics.h"

struct io_uring;
typedef struct IoOp IoOp;

/* HTTP requests and connections use ids and client keys with the top bit set; native
 * ones never reach it. */
#define HTTP_CLIENT_KEY_BIT 0x80000000u
#define HTTP_REQUEST_ID_BIT (UINT64_C(1) << 63)

typedef struct HttpConfig {
        char listen[PATH_MAX]; /* "" off; "/path" or "unix:/path"; "host:port", "[v6]:port",
                                * ":port" or "port" (host 127.0.0.1) */
        char auth_token_file[PATH_MAX]; /* "" no authentication */
        HttpLimits limits;
        uint32_t max_connections;
        uint32_t request_timeout_ms; /* a request's head and body must arrive within this */
        uint32_t idle_timeout_ms;    /* a keep-alive connection with no request is closed */
        uint64_t max_output_bytes;   /* answer bytes a slow reader may leave unsent */
} HttpConfig;

/* Off; 64 connections, 10 s per request, 60 s idle, 4 MiB unsent; http_limits_init(). */
void http_config_init(HttpConfig *c);

/* The "http" object of dsd.json: listen, auth_token_file, max_connections,
 * request_timeout_ms, idle_timeout_ms, max_header_bytes, max_body_bytes. Absent or null
 * fields keep their value; any other field is refused. 0, or -EINVAL with a message
 * naming the field ("http.x"). */
int http_config_parse(const cJSON *obj, HttpConfig *c, DsError *err);

typedef struct HttpListener HttpListener;

/* Binds the listening socket and queues its first operations on ring (not owned, must
 * outlive the listener). model names the model in answers and metrics. e and loop are
 * NULL (and model "") while the first model loads: /health then answers 503 "loading"
 * and every endpoint but /metrics 503, until http_listener_set_engine(). The listener
 * creates the metrics; the server feeds native requests' events in with
 * http_listener_account(). */
int http_listener_new(struct io_uring *ring, Engine *e, EngineLoop *loop, const HttpConfig *c,
        const char *model, HttpListener **ret, DsError *err);

/* The completion of an operation of kind IO_HTTP. */
void http_listener_cqe(HttpListener *h, IoOp *op, int res, unsigned flags);

static inline bool http_listener_owns(const SchedEvent *ev)
{
        return (ev->client & HTTP_CLIENT_KEY_BIT) != 0;
}
/* An engine event of one of our requests. */
void http_listener_deliver(HttpListener *h, const SchedEvent *ev);
/* Metrics for a native request's event; last_token_ns is that request's (0 at first). */
void http_listener_account(HttpListener *h, const SchedEvent *ev, uint64_t *last_token_ns);
Metrics *http_listener_metrics(HttpListener *h);

/* After a reload: new requests go to e and loop, answered under the name model. Requests
 * in flight on the previous loop keep their events flowing through
 * http_listener_deliver(); a disconnect then cancels on the new loop only, so such a
 * request runs to its end. 0 or -ENOMEM. */
int http_listener_set_engine(HttpListener *h, Engine *e, EngineLoop *loop, const char *model);
/* dsctl drain: completions answer 503 while set; connections stay. Accepts NULL. */
void http_listener_set_draining(HttpListener *h, bool draining);

/* Draining: /health answers 503, completions 503; no new connections. */
void http_listener_stop(HttpListener *h);
/* Operations in flight: the server waits for their completions before freeing the ring. */
unsigned http_listener_armed(const HttpListener *h);
/* Closes every connection (cancelling their requests) and cancels the operations; call
 * it, then reap completions until http_listener_armed() is 0, then free. */
void http_listener_close_all(HttpListener *h);
/* Requests may still hold a pointer to their generation state until their last event; the
 * caller frees the listener after the engine loop is stopped and drained. Accepts NULL. */
HttpListener *http_listener_free(HttpListener *h);
DEFINE_TRIVIAL_CLEANUP_FUNC(HttpListener *, http_listener_free);
