/* SPDX-License-Identifier: MIT */
/* One connected client as the I/O thread sees it: its credentials, its connection, its
 * segment and rings (ring mode) or its framed socket stream (socket mode), the events it
 * has not taken yet and its requests in flight.
 *
 * Sessions are reference-counted (DESIGN.md, style "daemon/"). The server's list holds
 * one reference while the client is connected; every io_uring operation in flight and
 * every Request whose engine events may still arrive holds one more. session_close()
 * only marks and cancels; the memory, the mapping and the fds go when the last
 * reference does, so a completion or an engine event never finds freed state.
 *
 * Nothing here reads shared memory twice or relies on it: the layout, the cursors we own
 * and every count live in this struct. Only server.c calls these functions, on the I/O
 * thread. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "macro.h"
#include "ring.h"
#include "wire.h"

typedef struct Session Session;
typedef struct Request Request;
struct EngineLoop;

typedef enum SessionState {
        SESSION_HELLO,  /* accepted; waiting for the hello frame */
        SESSION_RING,   /* welcomed in ring mode: records travel through the segment */
        SESSION_SOCKET, /* welcomed in socket mode: records are framed on the socket */
        SESSION_CLOSED, /* disconnected; freed with its last reference */
        _SESSION_STATE_MAX,
        _SESSION_STATE_INVALID = -EINVAL,
} SessionState;

/* What an io_uring completion is about: its user_data points at one of these. */
typedef enum IoKind {
        IO_ACCEPT,
        IO_SIGNAL,
        IO_NOTIFY,   /* the engine loop's eventfd */
        IO_READ,     /* a session's socket */
        IO_WRITE,    /* a session's socket, socket mode */
        IO_DOORBELL, /* a session's eventfd, ring mode */
        IO_CANCEL,   /* an async cancel; its own result is ignored */
        IO_HTTP,     /* the HTTP listener's own operations (daemon/http/listener.c) */
        IO_WATCH,    /* a poll on an fd of the daemon around the server (D-Bus, loader) */
        _IO_KIND_MAX,
        _IO_KIND_INVALID = -EINVAL,
} IoKind;

typedef struct IoOp {
        IoKind kind;
        Session *session; /* NULL for the server's own operations */
        bool armed;       /* submitted and its final completion not seen yet */
} IoOp;

/* A request as the I/O thread tracks it: created when its submission is admitted, freed
 * when the engine's last event for it (FINAL or ERROR) arrives. It is the engine
 * request's userdata and holds a reference on its session. */
struct Request {
        Session *session;
        uint64_t client_id;      /* the client's hdr.request_id */
        uint64_t id;             /* daemon-wide, SchedRequest.id */
        uint64_t last_token_ns;  /* the previous token's publish time, for the metrics */
        uint64_t prev_token_ns;  /* the same, for the inter-token latency ring (GetStats) */
        struct EngineLoop *loop; /* the engine loop it runs on: the model it started on */
        bool answered;           /* the client got its last event already (failed as too slow):
                                  * the engine's remaining events for it are dropped */
        Request *prev, *next;    /* the session's list */
};

/* Per-client bounds, copied from the server's options. */
typedef struct SessionLimits {
        uint32_t max_requests; /* in flight */
        uint32_t max_pending;  /* undelivered records before the client is paused */
        uint64_t slow_usec;    /* paused this long: its requests fail as too slow */
} SessionLimits;

struct Session {
        unsigned n_ref;
        SessionState state;
        uint32_t key;            /* SchedRequest.client: unique for the daemon's life */
        int fd;                  /* the connection, non-blocking */
        int doorbell_fd;         /* ring mode: the eventfd the client writes, else -EBADF */
        int notify_fd;           /* ring mode: the eventfd we write for a client that polls */
        struct ucred cred;       /* SO_PEERCRED at accept */
        char name[32];           /* from the hello, for logs */
        char comm[16];           /* /proc/PID/comm at accept, for ListClients() */
        uint64_t requests_total; /* admitted */
        uint64_t tokens_total;   /* prompt plus generated, of finished requests */
        bool allowed;            /* the credential check passed at accept */
        SessionLimits lim;

        /* Ring mode. The layout is our copy; the segment's header is never read back. */
        void *seg;
        size_t seg_size;
        struct ds_wire_layout layout;
        Ring sub; /* we consume */
        Ring cpl; /* we produce */

        /* Socket input: frames being assembled. */
        uint8_t *in; /* (in_cap) */
        size_t in_len;
        size_t in_cap;
        size_t in_max; /* the largest frame plus its length word we accept */

        /* Socket output (socket mode): frames being sent. */
        uint8_t *out;   /* (out_cap) */
        size_t out_len; /* bytes filled */
        size_t out_off; /* bytes sent */
        size_t out_cap;

        /* Records the client has not taken yet, oldest first: a ring of pend_cap slots
         * (a power of two, grown on demand up to the hard bound). */
        union ds_wire_slot *pend;
        uint32_t pend_head, pend_tail, pend_cap;
        bool paused;          /* its requests are paused in the engine */
        uint64_t paused_usec; /* when */

        Request *requests;   /* in flight, not yet finished by the engine */
        uint32_t n_requests; /* of them, those not answered */

        uint64_t doorbell_val; /* the eventfd read's target */
        IoOp op_read, op_write, op_doorbell;
        Session *prev, *next; /* the server's list */
};

/* A new session for an accepted connection (fd is taken over; closed on failure too). */
int session_new(int fd, uint32_t key, const SessionLimits *lim, Session **ret);
Session *session_ref(Session *s);
/* Drops a reference; the last one frees everything (unmaps, closes). Returns NULL. */
Session *session_unref(Session *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(Session *, session_unref);

/* Creates the sealed memfd segment for layout l, maps it, writes its header, and the
 * doorbell and notify eventfds. *ret_memfd is the segment's fd for passing to the client
 * (the caller closes it after sending). */
int session_setup_ring(Session *s, const struct ds_wire_layout *l, int *ret_memfd);

/* Undelivered records. */
static inline uint32_t session_pending(const Session *s)
{
        return s->pend_tail - s->pend_head;
}
/* Appends n records that must reach the client together (a token and its follow-ups).
 * Bounded at twice lim.max_pending plus one error per request: -ENOBUFS past it. */
int session_queue(Session *s, const union ds_wire_slot *recs, uint32_t n);

/* Moves pending records into the completion ring, whole groups only, in one publish, and
 * wakes the client when it sleeps. Returns the records moved, or -EBADMSG when the
 * client broke the ring's cursors. */
int session_flush_ring(Session *s);
/* Moves pending records into the output buffer as frames. Returns the bytes added. */
size_t session_flush_socket(Session *s);

/* Records a request; the session holds it until request_free(). */
int request_new(Session *s, uint64_t client_id, uint64_t id, Request **ret);
Request *request_find(Session *s, uint64_t client_id); /* unanswered ones only */
void request_free(Request *r);
