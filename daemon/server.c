/* SPDX-License-Identifier: MIT */
#include <fcntl.h>
#include <grp.h>
#include <liburing.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "admit.h"
#include "listener.h"
#include "log.h"
#include "server.h"
#include "session.h"

#define SERVER_RING_ENTRIES 512u
#define SERVER_EVENT_BATCH  32u
/* While a client is paused or the daemon stops, the loop wakes at least this often. */
#define SERVER_TICK_USEC 10000u
/* How long a stop waits for socket-mode clients to take their final events. */
#define SERVER_STOP_FLUSH_USEC 1000000u
/* The records one engine event becomes at most: a token, its text and its logprobs. */
#define SERVER_EVENT_RECORDS                                                                       \
        (2 + (SCHED_TEXT_MAX - DS_WIRE_TOKEN_INLINE + DS_WIRE_TEXT_INLINE - 1) /                   \
                        DS_WIRE_TEXT_INLINE)

struct Server {
        struct io_uring ring;
        Engine *engine;     /* the current model, NULL for none; owned */
        EngineLoop *loop;   /* its loop: new requests go here; owned */
        Engine *old_engine; /* retiring after a reload: finishes its requests; owned */
        EngineLoop *old_loop;
        ServerOptions opt;
        ServerHooks hooks;
        IoOp op_watch[SERVER_WATCH_MAX];
        bool draining;                   /* dsctl drain */
        struct ds_wire_layout layout;    /* every ring-mode segment's */
        struct ds_wire_server_info info; /* every welcome's */

        int listen_fd;
        int signal_fd;
        int notify_fd; /* the engine loop's; not owned */
        IoOp op_accept, op_signal, op_notify, op_cancel;
        struct signalfd_siginfo siginfo; /* the signalfd read's target */
        uint64_t notify_val;             /* the notify eventfd read's target */
        unsigned n_armed;                /* operations in flight, all kinds */

        Session *sessions;   /* connected; the list holds a reference on each */
        uint32_t n_sessions; /* of them */
        uint32_t n_welcomed; /* of them, past the handshake */
        uint32_t next_key;
        uint64_t next_request_id;
        uint64_t violations; /* clients disconnected for breaking the protocol */

        bool ring_ready;       /* io_uring_queue_init() succeeded */
        bool listen_inherited; /* systemd's socket: never unlinked by us */
        bool stopping;         /* no new connections or requests; nothing is re-armed */
        bool stop_drain;       /* stopping, and requests in flight may still finish */
        uint64_t stop_usec;
        /* Recent latencies (GetStats), rings of SERVER_LATENCY_SAMPLES. */
        uint64_t ttft_usec[SERVER_LATENCY_SAMPLES];
        uint64_t itl_usec[SERVER_LATENCY_SAMPLES];
        uint64_t n_ttft, n_itl;
        bool events_ready;
        SchedEvent events[SERVER_EVENT_BATCH];
        HttpListener *http; /* NULL when off; its operations share our ring */
};

/* ---- options ---- */

void server_options_init(ServerOptions *o)
{
        struct group grp, *g = NULL;
        char buf[4096];

        *o = (ServerOptions){
                .socket_path = "/run/dsd/dsd.sock",
                .socket_mode = 0666,
                .max_clients = 256,
                .max_requests = 64,
                .max_pending = 4096,
                .slow_timeout_ms = 5000,
                .sub_slots = DS_WIRE_DEFAULT_SUB_SLOTS,
                .cpl_slots = DS_WIRE_DEFAULT_CPL_SLOTS,
                .data_size = DS_WIRE_DEFAULT_DATA,
                .listen_fd = -1,
                .stop_drain_usec = SERVER_STOP_DRAIN_USEC_DEFAULT,
        };
        o->allow_uids[o->n_allow_uids++] = 0;
        if (getgrnam_r("dsd", &grp, buf, sizeof(buf), &g) == 0 && g)
                o->allow_gids[o->n_allow_gids++] = g->gr_gid;
        else if (geteuid() != 0)
                o->allow_uids[o->n_allow_uids++] = geteuid();
}

/* ---- io_uring plumbing ---- */

static struct io_uring_sqe *get_sqe(Server *s)
{
        struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);

        if (!sqe) {
                /* The submission queue is full: hand it to the kernel and take a fresh one. */
                io_uring_submit(&s->ring);
                sqe = io_uring_get_sqe(&s->ring);
        }
        return sqe;
}

/* Submits op, which holds a reference on its session until its last completion. */
static int arm(Server *s, IoOp *op, struct io_uring_sqe *sqe)
{
        io_uring_sqe_set_data(sqe, op);
        op->armed = true;
        s->n_armed++;
        if (op->session)
                session_ref(op->session);
        return 0;
}

static int arm_accept(Server *s)
{
        struct io_uring_sqe *sqe = get_sqe(s);

        if (!sqe)
                return -EBUSY;
        io_uring_prep_multishot_accept(sqe, s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        return arm(s, &s->op_accept, sqe);
}

static int arm_signal(Server *s)
{
        struct io_uring_sqe *sqe = get_sqe(s);

        if (!sqe)
                return -EBUSY;
        io_uring_prep_read(sqe, s->signal_fd, &s->siginfo, sizeof(s->siginfo), 0);
        return arm(s, &s->op_signal, sqe);
}

static int arm_notify(Server *s)
{
        struct io_uring_sqe *sqe = get_sqe(s);

        if (!sqe)
                return -EBUSY;
        io_uring_prep_read(sqe, s->notify_fd, &s->notify_val, sizeof(s->notify_val), 0);
        return arm(s, &s->op_notify, sqe);
}

static int arm_read(Server *s, Session *c)
{
        struct io_uring_sqe *sqe = get_sqe(s);

        if (!sqe)
                return -EBUSY;
        io_uring_prep_recv(sqe, c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
        return arm(s, &c->op_read, sqe);
}

static int arm_write(Server *s, Session *c)
{
        struct io_uring_sqe *sqe = get_sqe(s);

        if (!sqe)
                return -EBUSY;
        io_uring_prep_send(sqe, c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        return arm(s, &c->op_write, sqe);
}

static int arm_doorbell(Server *s, Session *c)
{
        struct io_uring_sqe *sqe = get_sqe(s);

        if (!sqe)
                return -EBUSY;
        io_uring_prep_read(sqe, c->doorbell_fd, &c->doorbell_val, sizeof(c->doorbell_val), 0);
        return arm(s, &c->op_doorbell, sqe);
}

/* Asks the kernel to end op early; its completion (-ECANCELED) still arrives. */
static void cancel_op(Server *s, IoOp *op)
{
        struct io_uring_sqe *sqe;

        if (!op->armed)
                return;
        sqe = get_sqe(s);
        if (!sqe)
                return; /* the fd is shut down too, so the operation ends anyway */
        io_uring_prep_cancel(sqe, op, 0);
        io_uring_sqe_set_data(sqe, &s->op_cancel);
        s->n_armed++;
}

/* ---- engine loops: the current one and one retiring after a reload ---- */

static void loops_cancel_client(Server *s, uint32_t key)
{
        EngineLoop *loops[] = {s->loop, s->old_loop};

        for (size_t i = 0; i < ELEMENTSOF(loops); i++)
                if (loops[i] && engine_loop_cancel_client(loops[i], key) < 0)
                        log_error("Failed to cancel the requests of client %u: out of memory", key);
}

static void loops_resume_client(Server *s, uint32_t key)
{
        EngineLoop *loops[] = {s->loop, s->old_loop};

        for (size_t i = 0; i < ELEMENTSOF(loops); i++)
                if (loops[i])
                        (void) engine_loop_resume_client(loops[i], key);
}

static int loops_pause_client(Server *s, uint32_t key)
{
        EngineLoop *loops[] = {s->loop, s->old_loop};

        for (size_t i = 0; i < ELEMENTSOF(loops); i++)
                if (loops[i] && engine_loop_pause_client(loops[i], key) < 0)
                        return -ENOMEM;
        return 0;
}

/* Every request the loop accepted has had its last event. */
static bool loop_idle(EngineLoop *l)
{
        EngineLoopStats st;

        if (!l)
                return true;
        engine_loop_stats(l, &st);
        return st.submitted == st.finished + st.failed;
}

/* ---- clients: lifecycle ---- */

static const char *state_mode(const Session *c)
{
        return c->state == SESSION_RING ? "ring" : "socket";
}

/* Disconnects c: cancels its requests in the engine (their KV blocks are freed at the
 * next step) and its io_uring operations. The memory goes with the last reference. */
static void client_close(Server *s, Session *c, int level, const char *why)
{
        bool welcomed = c->state == SESSION_RING || c->state == SESSION_SOCKET;

        if (c->state == SESSION_CLOSED)
                return;
        if (welcomed) {
                log_full_errno(level, 0,
                        "Client %u (pid %d, uid %u) disconnected: %s; %u requests in flight "
                        "cancelled",
                        c->key, (int) c->cred.pid, (unsigned) c->cred.uid, why, c->n_requests);
                loops_cancel_client(s, c->key);
                if (c->paused)
                        loops_resume_client(s, c->key);
                s->n_welcomed--;
        } else
                log_full_errno(level, 0, "Connection from pid %d uid %u closed: %s",
                        (int) c->cred.pid, (unsigned) c->cred.uid, why);
        c->state = SESSION_CLOSED;
        /* No more reads or writes: pending operations end now, the fd closes with the
         * last reference. */
        shutdown(c->fd, SHUT_RDWR);
        cancel_op(s, &c->op_read);
        cancel_op(s, &c->op_write);
        cancel_op(s, &c->op_doorbell);

        if (c->prev)
                c->prev->next = c->next;
        else
                s->sessions = c->next;
        if (c->next)
                c->next->prev = c->prev;
        c->prev = c->next = NULL;
        s->n_sessions--;
        session_unref(c);
}

/* A broken protocol: the client goes, nothing else is disturbed. */
static void client_violation(Server *s, Session *c, const char *what, int r)
{
        char why[256];

        s->violations++;
        if (s->http)
                metrics_add(http_listener_metrics(s->http), METRIC_CLIENT_VIOLATIONS, 1);
        snprintf(why, sizeof(why), "protocol violation: %s (%s); %llu violations so far", what,
                strerror(r < 0 ? -r : EPROTO), (unsigned long long) s->violations);
        client_close(s, c, LOG_LVL_WARNING, why);
}

static void record_error(
        union ds_wire_slot *rec, uint64_t client_id, uint32_t code, const char *msg)
{
        size_t len = strnlen(msg, DS_WIRE_MESSAGE);

        *rec = (union ds_wire_slot){};
        rec->error.hdr.type = DS_WIRE_ERROR;
        rec->error.hdr.request_id = client_id;
        rec->error.code = code;
        rec->error.len = (uint32_t) len;
        memcpy(rec->error.message, msg, len);
}

static void client_fail_slow(Server *s, Session *c, uint64_t now);

/* Queues n records for c; a client whose queue is at its hard bound fails as too slow. */
static void client_queue(Server *s, Session *c, const union ds_wire_slot *recs, uint32_t n)
{
        int r = session_queue(c, recs, n);

        if (r == -ENOBUFS) {
                client_fail_slow(s, c, now_usec());
                return;
        }
        if (r < 0)
                client_close(s, c, LOG_LVL_ERR, "out of memory for its events");
}

static void client_error(Server *s, Session *c, uint64_t client_id, uint32_t code, const char *msg)
{
        union ds_wire_slot rec;

        record_error(&rec, client_id, code, msg);
        client_queue(s, c, &rec, 1);
}

/* Fails every request of c in flight: the client gets a "client too slow" error for each
 * and the engine's later events for them are dropped. */
static void client_fail_slow(Server *s, Session *c, uint64_t now)
{
        union ds_wire_slot rec;
        char msg[DS_WIRE_MESSAGE];
        uint32_t n = 0;

        snprintf(msg, sizeof(msg),
                "client too slow: %u event records not read (the bound is %u), paused for "
                "%llu ms (the limit is %llu ms)",
                session_pending(c), c->lim.max_pending,
                (unsigned long long) (c->paused ? (now - c->paused_usec) / 1000 : 0),
                (unsigned long long) (c->lim.slow_usec / 1000));
        for (Request *q = c->requests; q; q = q->next) {
                if (q->answered)
                        continue;
                q->answered = true;
                c->n_requests--;
                (void) engine_loop_cancel(q->loop, q->id);
                record_error(&rec, q->client_id, DS_WIRE_ERR_CLIENT_TOO_SLOW, msg);
                /* The hard bound keeps one record per request for exactly this. */
                if (session_queue(c, &rec, 1) < 0) {
                        client_close(s, c, LOG_LVL_WARNING, "too slow, its event queue is full");
                        return;
                }
                n++;
        }
        if (c->paused) {
                loops_resume_client(s, c->key);
                c->paused = false;
        }
        log_warning("Client %u (pid %d): too slow, %u requests failed, %u event records "
                    "undelivered",
                c->key, (int) c->cred.pid, n, session_pending(c));
}

/* Pauses a client whose undelivered events reach the bound, resumes it when it catches
 * up, and fails its requests when it stays paused too long. */
static void client_check_slow(Server *s, Session *c, uint64_t now)
{
        uint32_t p = session_pending(c);

        if (!c->paused) {
                if (p < c->lim.max_pending || c->n_requests == 0)
                        return;
                if (loops_pause_client(s, c->key) < 0)
                        return; /* no memory for the pause: tried again at the next pass */
                c->paused = true;
                c->paused_usec = now;
                log_notice("Client %u (pid %d): %u event records not read, pausing its "
                           "requests",
                        c->key, (int) c->cred.pid, p);
        } else if (p <= c->lim.max_pending / 2) {
                loops_resume_client(s, c->key);
                c->paused = false;
                log_info("Client %u (pid %d) caught up, resuming its requests", c->key,
                        (int) c->cred.pid);
        } else if (now - c->paused_usec >= c->lim.slow_usec)
                client_fail_slow(s, c, now);
}

/* ---- clients: requests ---- */

static uint32_t wire_code_of_submit(int r)
{
        switch (r) {
        case -EBUSY:
                return DS_WIRE_ERR_BUSY;
        case -DS_ERR_CONTEXT_FULL:
                return DS_WIRE_ERR_PROMPT_TOO_LONG;
        case -EINVAL:
                return DS_WIRE_ERR_BAD_REQUEST;
        case -ESHUTDOWN:
                return DS_WIRE_ERR_SHUTTING_DOWN;
        default:
                return DS_WIRE_ERR_INTERNAL;
        }
}

static void client_submit(Server *s, Session *c, const struct ds_wire_submit *rec,
        const uint8_t *data, uint32_t data_size)
{
        _cleanup_(sched_request_freep) SchedRequest *req = NULL;
        uint64_t client_id = rec->hdr.request_id;
        DsError err = {};
        uint32_t code;
        Request *q;
        int r;

        if (s->stopping)
                return client_error(
                        s, c, client_id, DS_WIRE_ERR_SHUTTING_DOWN, "the daemon is stopping");
        if (s->draining)
                return client_error(s, c, client_id, DS_WIRE_ERR_DRAINING,
                        "draining: the daemon admits no new requests until 'dsctl resume'");
        if (!s->loop)
                return client_error(s, c, client_id, DS_WIRE_ERR_NO_MODEL,
                        "no model is loaded: see 'dsctl status', load one with 'dsctl reload'");
        if (request_find(c, client_id)) {
                snprintf(err.msg, sizeof(err.msg), "request id %llu is already in flight",
                        (unsigned long long) client_id);
                return client_error(s, c, client_id, DS_WIRE_ERR_DUPLICATE_ID, err.msg);
        }
        if (c->n_requests >= c->lim.max_requests) {
                snprintf(err.msg, sizeof(err.msg),
                        "too many requests: %u in flight, the limit per client is %u",
                        c->n_requests, c->lim.max_requests);
                return client_error(s, c, client_id, DS_WIRE_ERR_TOO_MANY, err.msg);
        }

        r = admit_submit(s->engine, rec, data, data_size, &req, &code, &err);
        if (r < 0 && code == 0)
                return client_violation(s, c, err.msg, r);
        if (r < 0)
                return client_error(s, c, client_id, code, err.msg);

        r = request_new(c, client_id, ++s->next_request_id, &q);
        if (r < 0)
                return client_error(s, c, client_id, DS_WIRE_ERR_INTERNAL, "out of memory");
        req->id = q->id;
        req->client = c->key;
        req->enqueue_usec = now_usec();
        req->userdata = q;
        q->loop = s->loop;
        r = engine_loop_submit(s->loop, &req, &err);
        if (r < 0) {
                request_free(q);
                return client_error(s, c, client_id, wire_code_of_submit(r), err.msg);
        }
        c->requests_total++;
}

static void client_info(Server *s, Session *c, uint64_t client_id)
{
        EngineLoopStats st;
        union ds_wire_slot rec = {};

        server_stats(s, &st, NULL);
        rec.info.hdr.type = DS_WIRE_INFO;
        rec.info.hdr.request_id = client_id;
        rec.info.active = st.active;
        rec.info.queued = st.queued;
        rec.info.clients = s->n_welcomed;
        rec.info.kv_blocks_total = st.kv_blocks_total;
        rec.info.kv_blocks_free = st.kv_blocks_free;
        client_queue(s, c, &rec, 1);
}

/* One c2d record, already copied out of the ring or the frame. */
static void client_record(Server *s, Session *c, const union ds_wire_slot *rec, const uint8_t *data,
        uint32_t data_size)
{
        Request *q;
        int r;

        r = wire_c2d_validate(rec, data_size);
        if (r < 0)
                return client_violation(s, c, "malformed record", r);
        switch (rec->hdr.type) {
        case DS_WIRE_SUBMIT:
                return client_submit(s, c, &rec->submit, data, data_size);
        case DS_WIRE_CANCEL:
                q = request_find(c, rec->hdr.request_id);
                if (q && engine_loop_cancel(q->loop, q->id) < 0)
                        client_error(s, c, q->client_id, DS_WIRE_ERR_INTERNAL,
                                "out of memory for the cancellation");
                return;
        default: /* DS_WIRE_INFO_REQ */
                return client_info(s, c, rec->hdr.request_id);
        }
}

/* ---- clients: handshake ---- */

static bool peer_allowed(const Server *s, int fd, const struct ucred *cr)
{
        gid_t groups[SERVER_IDS_MAX];
        socklen_t len = sizeof(groups);

        for (size_t i = 0; i < s->opt.n_allow_uids; i++)
                if (s->opt.allow_uids[i] == cr->uid)
                        return true;
        for (size_t i = 0; i < s->opt.n_allow_gids; i++)
                if (s->opt.allow_gids[i] == cr->gid)
                        return true;
        if (s->opt.n_allow_gids == 0 || getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
                return false;
        for (size_t j = 0; j < len / sizeof(gid_t); j++)
                for (size_t i = 0; i < s->opt.n_allow_gids; i++)
                        if (s->opt.allow_gids[i] == groups[j])
                                return true;
        return false;
}

/* Sends the welcome frame, with the fds in ring mode. The socket is non-blocking and
 * nothing was written to it before, so the frame goes whole or the peer is broken. */
static int send_welcome(Session *c, const struct ds_wire_welcome *w, const int *fds, unsigned n_fds)
{
        uint32_t len = sizeof(*w);
        struct iovec iov[2] = {
                {.iov_base = &len, .iov_len = sizeof(len)},
                {.iov_base = (void *) w, .iov_len = sizeof(*w)},
        };
        union {
                struct cmsghdr hdr;
                char buf[CMSG_SPACE(sizeof(int) * DS_WIRE_RING_FDS)];
        } control = {};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
        ssize_t n;

        if (n_fds > 0) {
                mh.msg_control = control.buf;
                mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
                struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
                cm->cmsg_level = SOL_SOCKET;
                cm->cmsg_type = SCM_RIGHTS;
                cm->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
                memcpy(CMSG_DATA(cm), fds, sizeof(int) * n_fds);
        }
        n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0)
                return -errno;
        return (size_t) n == sizeof(len) + sizeof(*w) ? 0 : -EAGAIN;
}

static void welcome_init(
        const Server *s, struct ds_wire_welcome *w, uint32_t status, const char *msg)
{
        *w = (struct ds_wire_welcome){
                .magic = DS_WIRE_MAGIC,
                .version = DS_WIRE_VERSION,
                .status = status,
                .info = s->info,
        };
        snprintf(w->message, sizeof(w->message), "%s", msg);
}

/* Refuses the client with a reason it can read, logs it and closes. */
static void client_refuse(Server *s, Session *c, uint32_t status, const char *msg)
{
        struct ds_wire_welcome w;

        welcome_init(s, &w, status, msg);
        (void) send_welcome(c, &w, NULL, 0);
        client_close(s, c, LOG_LVL_WARNING, msg);
}

static void client_hello(Server *s, Session *c, const uint8_t *frame)
{
        _cleanup_close_ int memfd = -EBADF;
        struct ds_wire_hello h;
        struct ds_wire_welcome w;
        char msg[DS_WIRE_MESSAGE];
        int r;

        memcpy(&h, frame, sizeof(h));
        r = wire_hello_validate(&h);
        if (r == -EPROTONOSUPPORT) {
                snprintf(msg, sizeof(msg),
                        "refused: protocol version %u is not supported, this daemon speaks "
                        "version %u",
                        h.version, DS_WIRE_VERSION);
                return client_refuse(s, c, DS_WIRE_ERR_VERSION, msg);
        }
        if (r < 0)
                return client_violation(s, c, "malformed hello", r);
        if (!c->allowed) {
                snprintf(msg, sizeof(msg),
                        "refused: uid %u gid %u is not allowed to use this daemon",
                        (unsigned) c->cred.uid, (unsigned) c->cred.gid);
                return client_refuse(s, c, DS_WIRE_ERR_DENIED, msg);
        }
        if (s->stopping)
                return client_refuse(s, c, DS_WIRE_ERR_SHUTTING_DOWN, "refused: stopping");
        /* The welcome describes the model; without one the client learns why it cannot
         * be served instead. */
        if (!s->engine)
                return client_refuse(s, c, DS_WIRE_ERR_NO_MODEL,
                        "refused: no model is loaded; 'dsctl reload MODEL' loads one");
        memcpy(c->name, h.name, sizeof(c->name));
        c->name[sizeof(c->name) - 1] = 0;

        welcome_init(s, &w, DS_WIRE_OK, "");
        w.mode = h.mode;
        if (h.mode == DS_WIRE_MODE_RING) {
                r = session_setup_ring(c, &s->layout, &memfd);
                if (r < 0) {
                        log_error_errno(r, "Failed to create the segment of client pid %d: %m",
                                (int) c->cred.pid);
                        return client_refuse(s, c, DS_WIRE_ERR_INTERNAL,
                                "refused: the daemon could not create a segment");
                }
                w.n_fds = DS_WIRE_RING_FDS;
                w.layout = s->layout;
                int fds[DS_WIRE_RING_FDS] = {memfd, c->doorbell_fd, c->notify_fd};
                r = send_welcome(c, &w, fds, DS_WIRE_RING_FDS);
                c->state = SESSION_RING;
                c->in_max = 0; /* nothing but EOF may follow on the socket */
        } else {
                r = send_welcome(c, &w, NULL, 0);
                c->state = SESSION_SOCKET;
                c->in_max = DS_WIRE_FRAME_HDR + DS_WIRE_SLOT_SIZE + (size_t) s->layout.data_size;
        }
        s->n_welcomed++;
        if (r < 0)
                return client_close(s, c, LOG_LVL_WARNING, "the welcome could not be sent");
        log_info("Client %u connected: pid %d, uid %u, gid %u, name '%s', %s mode", c->key,
                (int) c->cred.pid, (unsigned) c->cred.uid, (unsigned) c->cred.gid, c->name,
                state_mode(c));
        if (c->state == SESSION_RING && arm_doorbell(s, c) < 0)
                client_close(s, c, LOG_LVL_ERR, "its doorbell could not be watched");
}

/* Frames assembled from the socket: the hello, or socket-mode records. */
static void client_input(Server *s, Session *c)
{
        while (c->state != SESSION_CLOSED && c->in_len > 0) {
                uint32_t len, data_size;
                size_t total;
                union ds_wire_slot rec;

                if (c->state == SESSION_RING)
                        return client_violation(
                                s, c, "bytes on the socket after the welcome", -EPROTO);
                if (c->in_len < DS_WIRE_FRAME_HDR)
                        return;
                memcpy(&len, c->in, sizeof(len));
                if (c->state == SESSION_HELLO) {
                        if (len != sizeof(struct ds_wire_hello))
                                return client_violation(
                                        s, c, "hello frame of a wrong length", -EBADMSG);
                } else if (wire_frame_len_validate(len, true) < 0 ||
                           (size_t) len + DS_WIRE_FRAME_HDR > c->in_max)
                        return client_violation(s, c, "frame of a wrong length", -EBADMSG);
                total = DS_WIRE_FRAME_HDR + (size_t) len;
                if (c->in_len < total) {
                        if (c->in_cap < total) {
                                uint8_t *in = realloc(c->in, total);
                                if (!in)
                                        return client_close(
                                                s, c, LOG_LVL_ERR, "out of memory for its input");
                                c->in = in;
                                c->in_cap = total;
                        }
                        return;
                }
                if (c->state == SESSION_HELLO)
                        client_hello(s, c, c->in + DS_WIRE_FRAME_HDR);
                else {
                        memcpy(&rec, c->in + DS_WIRE_FRAME_HDR, sizeof(rec));
                        data_size = len - DS_WIRE_SLOT_SIZE;
                        client_record(s, c, &rec, c->in + DS_WIRE_FRAME_HDR + DS_WIRE_SLOT_SIZE,
                                data_size);
                }
                if (c->state == SESSION_CLOSED)
                        return;
                memmove(c->in, c->in + total, c->in_len - total);
                c->in_len -= total;
        }
}

/* The peer's process name; "" when it is gone already or hidden from us. */
static void read_comm(pid_t pid, char *ret, size_t size)
{
        char path[64];
        _cleanup_close_ int fd = -EBADF;
        ssize_t n;

        ret[0] = 0;
        snprintf(path, sizeof(path), "/proc/%d/comm", (int) pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return;
        n = read(fd, ret, size - 1);
        if (n <= 0)
                n = 0;
        ret[n] = 0;
        ret[strcspn(ret, "\n")] = 0;
}

static void client_accept(Server *s, int fd)
{
        struct ucred cred = {};
        socklen_t len = sizeof(cred);
        SessionLimits lim = {
                .max_requests = s->opt.max_requests,
                .max_pending = s->opt.max_pending,
                .slow_usec = (uint64_t) s->opt.slow_timeout_ms * 1000,
        };
        Session *c;
        int r;

        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
                log_warning_errno(errno, "Failed to read the credentials of a new connection, "
                                         "closing it: %m");
                close(fd);
                return;
        }
        if (s->stopping || s->n_sessions >= s->opt.max_clients) {
                log_warning("Connection from pid %d uid %u refused: %s", (int) cred.pid,
                        (unsigned) cred.uid,
                        s->stopping ? "stopping" : "the client limit is reached");
                close(fd);
                return;
        }
        r = session_new(fd, ++s->next_key, &lim, &c);
        if (r < 0) {
                log_error_errno(r, "Failed to set up a connection: %m");
                return;
        }
        c->cred = cred;
        c->allowed = peer_allowed(s, fd, &cred);
        read_comm(cred.pid, c->comm, sizeof(c->comm));
        c->next = s->sessions;
        if (s->sessions)
                s->sessions->prev = c;
        s->sessions = c;
        s->n_sessions++;
        if (arm_read(s, c) < 0)
                client_close(s, c, LOG_LVL_ERR, "its socket could not be watched");
}

/* ---- engine events ---- */

static uint32_t wire_finish(FinishReason f)
{
        switch (f) {
        case FINISH_EOS:
                return DS_WIRE_FINISH_EOS;
        case FINISH_STOP:
                return DS_WIRE_FINISH_STOP;
        case FINISH_CANCELLED:
                return DS_WIRE_FINISH_CANCELLED;
        default:
                return DS_WIRE_FINISH_LENGTH;
        }
}

static uint32_t wire_code_of_event(int error)
{
        switch (error) {
        case -DS_ERR_CONTEXT_FULL:
                return DS_WIRE_ERR_PROMPT_TOO_LONG;
        case -EINVAL:
                return DS_WIRE_ERR_BAD_REQUEST;
        default:
                return DS_WIRE_ERR_INTERNAL;
        }
}

/* A token record and the records that follow it: its text past the inline part and its
 * logprobs. Returns the count. */
static uint32_t token_records(const SchedEvent *ev, uint64_t client_id, int32_t token_id,
        union ds_wire_slot recs[static SERVER_EVENT_RECORDS])
{
        struct ds_wire_token *t = &recs[0].token;
        uint32_t n = 1, at;

        recs[0] = (union ds_wire_slot){};
        t->hdr.type = DS_WIRE_TOKEN;
        t->hdr.request_id = client_id;
        t->token_id = token_id;
        t->publish_ns = ev->publish_ns;
        t->text_len = ev->text_len;
        t->inline_len = (uint16_t) MIN(ev->text_len, DS_WIRE_TOKEN_INLINE);
        memcpy(t->text, ev->text, t->inline_len);
        for (at = t->inline_len; at < ev->text_len; n++) {
                struct ds_wire_text *x = &recs[n].text;
                recs[n] = (union ds_wire_slot){};
                x->hdr.type = DS_WIRE_TEXT;
                x->hdr.request_id = client_id;
                x->len = MIN(ev->text_len - at, DS_WIRE_TEXT_INLINE);
                memcpy(x->text, ev->text + at, x->len);
                at += x->len;
        }
        if (token_id != DS_WIRE_TOKEN_NONE && ev->n_top > 0) {
                struct ds_wire_logprobs *l = &recs[n].logprobs;
                recs[n] = (union ds_wire_slot){};
                l->hdr.type = DS_WIRE_LOGPROBS;
                l->hdr.request_id = client_id;
                l->n = MIN(ev->n_top, DS_WIRE_MAX_TOP_LOGPROBS);
                for (uint32_t i = 0; i < l->n; i++)
                        l->top[i] = (struct ds_wire_top){ev->top[i].id, ev->top[i].logprob};
                t->logprob = ev->sampled.logprob;
                n++;
        }
        t->hdr.n_follow = n - 1;
        return n;
}

static void deliver(Server *s, const SchedEvent *ev)
{
        union ds_wire_slot recs[SERVER_EVENT_RECORDS];
        Request *q = ev->userdata;
        Session *c = q->session;
        bool last = ev->type != SCHED_EV_TOKEN;
        uint32_t n;

        if (http_listener_owns(ev))
                return http_listener_deliver(s->http, ev);
        if (s->http)
                http_listener_account(s->http, ev, &q->last_token_ns);
        if (ev->type == SCHED_EV_TOKEN) {
                if (q->prev_token_ns)
                        s->itl_usec[s->n_itl++ % SERVER_LATENCY_SAMPLES] =
                                (ev->publish_ns - q->prev_token_ns) / 1000;
                q->prev_token_ns = ev->publish_ns;
        } else if (ev->type == SCHED_EV_FINAL) {
                if (ev->usage.generated_tokens > 0)
                        s->ttft_usec[s->n_ttft++ % SERVER_LATENCY_SAMPLES] = ev->usage.ttft_usec;
                c->tokens_total += (uint64_t) ev->usage.prompt_tokens + ev->usage.generated_tokens;
        }
        if (c->state != SESSION_CLOSED && !q->answered) {
                switch (ev->type) {
                case SCHED_EV_TOKEN:
                        n = token_records(ev, q->client_id, ev->token, recs);
                        client_queue(s, c, recs, n);
                        break;
                case SCHED_EV_FINAL:
                        if (ev->text_len > 0) {
                                n = token_records(ev, q->client_id, DS_WIRE_TOKEN_NONE, recs);
                                client_queue(s, c, recs, n);
                        }
                        recs[0] = (union ds_wire_slot){};
                        recs[0].final = (struct ds_wire_final){
                                .hdr = {.type = DS_WIRE_FINAL, .request_id = q->client_id},
                                .finish = wire_finish(ev->finish),
                                .prompt_tokens = ev->usage.prompt_tokens,
                                .generated_tokens = ev->usage.generated_tokens,
                                .queue_us = ev->usage.queue_usec,
                                .ttft_us = ev->usage.ttft_usec,
                                .total_us = ev->usage.total_usec,
                                .publish_ns = ev->publish_ns,
                        };
                        client_queue(s, c, recs, 1);
                        break;
                default: { /* SCHED_EV_ERROR */
                        char msg[DS_WIRE_MESSAGE + 1];
                        size_t len = MIN((size_t) ev->text_len, (size_t) DS_WIRE_MESSAGE);
                        memcpy(msg, ev->text, len);
                        msg[len] = 0;
                        client_error(s, c, q->client_id, wire_code_of_event(ev->error), msg);
                        break;
                }
                }
        }
        if (last) {
                if (!q->answered)
                        q->answered = true, c->n_requests--;
                request_free(q); /* may free a closed session with its last reference */
        }
}

static void drain_loop(Server *s, EngineLoop *l)
{
        size_t n;

        if (!l)
                return;
        do {
                n = engine_loop_take_events(l, s->events, SERVER_EVENT_BATCH);
                for (size_t i = 0; i < n; i++)
                        deliver(s, &s->events[i]);
        } while (n == SERVER_EVENT_BATCH);
}

static void drain_events(Server *s)
{
        drain_loop(s, s->old_loop);
        drain_loop(s, s->loop);
}

/* The retiring engine of a reload goes once its last request had its last event. */
static void retire_check(Server *s)
{
        if (!s->old_loop || !loop_idle(s->old_loop))
                return;
        engine_loop_stop(s->old_loop, true);
        drain_loop(s, s->old_loop);
        s->old_loop = engine_loop_free(s->old_loop);
        s->old_engine = engine_free(s->old_engine);
        log_info("The previous model finished its last request and is freed");
}

/* ---- the loop ---- */

/* Moves what a client has pending towards it and takes its new submissions. */
static void client_service(Server *s, Session *c, uint64_t now)
{
        int64_t n;
        int r;

        if (c->state == SESSION_RING) {
                union ds_wire_slot rec;

                /* We are awake: the client need not ring the doorbell until we sleep. */
                ring_consumer_end_sleep(&c->sub);
                n = ring_available(&c->sub);
                if (n < 0)
                        return client_violation(s, c, "submission tail out of range", (int) n);
                for (int64_t i = 0; i < n; i++) {
                        ring_peek(&c->sub, (uint32_t) i, &rec);
                        client_record(s, c, &rec, (const uint8_t *) c->seg + c->layout.data,
                                c->layout.data_size);
                        if (c->state == SESSION_CLOSED)
                                return;
                }
                if (n > 0) {
                        /* Every record and the data it references is copied by now. */
                        ring_consume(&c->sub, (uint32_t) n);
                        if (ring_producer_needs_wake(&c->sub))
                                ring_futex_wake(&c->sub.ctl->head);
                }
                ring_producer_end_sleep(&c->cpl);
                r = session_flush_ring(c);
                if (r < 0)
                        return client_violation(s, c, "completion head out of range", r);
        } else if (c->state == SESSION_SOCKET) {
                session_flush_socket(c);
                if (!c->op_write.armed && c->out_off < c->out_len && arm_write(s, c) < 0)
                        return client_close(s, c, LOG_LVL_ERR, "its socket could not be written");
        }
        if (c->state != SESSION_CLOSED)
                client_check_slow(s, c, now);
}

/* Before sleeping: tells each ring client to ring the doorbell when it submits or frees
 * completion slots. Returns true when one already did either, so we must not sleep. */
static bool prepare_sleep(Server *s)
{
        uint32_t tail;
        bool busy = false;

        for (Session *c = s->sessions; c; c = c->next) {
                if (c->state != SESSION_RING)
                        continue;
                if (ring_consumer_prepare_sleep(&c->sub, 1, &tail) != 0)
                        busy = true;
                if (session_pending(c) > 0) {
                        int64_t space = ring_producer_prepare_sleep(&c->cpl);
                        if (space < 0 ||
                                space >= 1 + c->pend[c->pend_head & (c->pend_cap - 1)].hdr.n_follow)
                                busy = true;
                }
        }
        return busy;
}

static bool needs_tick(const Server *s)
{
        if (s->stopping || s->old_loop)
                return true;
        for (const Session *c = s->sessions; c; c = c->next)
                if (c->paused)
                        return true;
        return false;
}

static void begin_stop(Server *s, const char *why)
{
        EngineLoopStats st;

        server_stats(s, &st, NULL);
        log_notice("Received %s: stopping; %u clients connected, %u requests active and %u "
                   "queued get %llu s to finish",
                why, s->n_welcomed, st.active, st.queued,
                (unsigned long long) (s->opt.stop_drain_usec / 1000000));
        s->stopping = true;
        s->stop_drain = true;
        s->stop_usec = now_usec();
        cancel_op(s, &s->op_accept);
        http_listener_stop(s->http);
        if (!s->listen_inherited && unlink(s->opt.socket_path) < 0 && errno != ENOENT)
                log_warning_errno(errno, "Failed to remove '%s', ignoring: %m", s->opt.socket_path);
        if (s->hooks.stopping)
                s->hooks.stopping(s->hooks.userdata);
}

/* The drain of a stop ends when every engine is idle or at the deadline; what is left
 * then is cancelled, so every request still gets a final event. */
static void stop_drain_check(Server *s, uint64_t now)
{
        EngineLoopStats st;

        if (loop_idle(s->loop) && loop_idle(s->old_loop))
                log_info("Every request finished");
        else if (now - s->stop_usec >= s->opt.stop_drain_usec) {
                server_stats(s, &st, NULL);
                log_warning("The stop's drain deadline passed: cancelling %u active and %u "
                            "queued requests",
                        st.active, st.queued);
        } else
                return;
        /* Joins the engine threads; a cancelled FINAL for each request left waits in the
         * outbox. */
        if (s->loop)
                engine_loop_stop(s->loop, false);
        if (s->old_loop)
                engine_loop_stop(s->old_loop, false);
        drain_events(s);
        s->stop_drain = false;
        s->stop_usec = now;
}

/* Stopped and every client has taken its final events (into its ring or off the socket),
 * or the deadline passed. */
static bool stop_done(const Server *s, uint64_t now)
{
        if (s->stop_drain)
                return false;
        if (now - s->stop_usec >= SERVER_STOP_FLUSH_USEC)
                return true;
        for (const Session *c = s->sessions; c; c = c->next)
                if (session_pending(c) > 0 || (c->state == SESSION_SOCKET && c->op_write.armed))
                        return false;
        return true;
}

static void handle_cqe(Server *s, IoOp *op, int res, unsigned flags)
{
        Session *c = op->session;

        if (op->kind == IO_CANCEL) {
                s->n_armed--;
                return;
        }
        if (op->kind == IO_HTTP)
                return http_listener_cqe(s->http, op, res, flags);
        /* A multishot accept stays armed while the kernel says more will come. */
        if (!(op->kind == IO_ACCEPT && (flags & IORING_CQE_F_MORE))) {
                op->armed = false;
                s->n_armed--;
        }

        switch (op->kind) {
        case IO_ACCEPT:
                if (res >= 0)
                        client_accept(s, res);
                else if (res != -ECANCELED)
                        log_warning_errno(res, "Failed to accept a connection: %m");
                if (!op->armed && !s->stopping && arm_accept(s) < 0)
                        log_error("Failed to re-arm accept: no submission entry");
                return;
        case IO_SIGNAL:
                if (res == (int) sizeof(s->siginfo) && !s->stopping) {
                        if (s->siginfo.ssi_signo == SIGHUP) {
                                if (s->hooks.reload)
                                        s->hooks.reload(s->hooks.userdata);
                        } else
                                begin_stop(
                                        s, s->siginfo.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
                }
                if (res != -ECANCELED && !s->stopping && arm_signal(s) < 0)
                        log_error("Failed to re-arm the signalfd: no submission entry");
                return;
        case IO_NOTIFY:
                s->events_ready = true;
                /* A stop's drain still delivers the engine's events. */
                if (res != -ECANCELED && (!s->stopping || s->stop_drain) && arm_notify(s) < 0)
                        log_error("Failed to re-arm the engine notification: no submission "
                                  "entry");
                return;
        case IO_READ:
                if (c->state != SESSION_CLOSED) {
                        if (res == 0)
                                client_close(s, c, LOG_LVL_INFO, "end of stream");
                        else if (res < 0)
                                client_close(s, c, LOG_LVL_INFO, strerror(-res));
                        else {
                                c->in_len += (size_t) res;
                                client_input(s, c);
                                if (c->state != SESSION_CLOSED && arm_read(s, c) < 0)
                                        client_close(s, c, LOG_LVL_ERR,
                                                "its socket could not be watched");
                        }
                }
                break;
        case IO_WRITE:
                if (c->state != SESSION_CLOSED) {
                        if (res < 0)
                                client_close(s, c, LOG_LVL_INFO, strerror(-res));
                        else
                                c->out_off += (size_t) res;
                }
                break;
        case IO_WATCH:
                return; /* the hooks' service() runs on this pass */
        case IO_DOORBELL:
                /* The ring is drained by the next pass of the loop. */
                if (c->state != SESSION_CLOSED && (res < 0 || arm_doorbell(s, c) < 0))
                        client_close(s, c, LOG_LVL_ERR, "its doorbell failed");
                break;
        default:
                break;
        }
        session_unref(c);
}

int server_run(Server *s)
{
        struct io_uring_cqe *cqe;
        unsigned head, seen;
        int r;

        for (;;) {
                uint64_t now = now_usec(), wake = UINT64_MAX;

                if (s->events_ready) {
                        s->events_ready = false;
                        drain_events(s);
                }
                retire_check(s);
                for (Session *c = s->sessions, *next; c; c = next) {
                        next = c->next;
                        /* The list's reference keeps c alive through its own service. */
                        client_service(s, c, now);
                }
                if (s->stopping && s->stop_drain)
                        stop_drain_check(s, now);
                if (s->stopping && stop_done(s, now))
                        return 0;
                if (s->hooks.service)
                        wake = s->hooks.service(s->hooks.userdata);
                if (needs_tick(s))
                        wake = MIN(wake, now + SERVER_TICK_USEC);

                if (prepare_sleep(s))
                        r = io_uring_submit(&s->ring);
                else if (wake != UINT64_MAX) {
                        uint64_t d = wake > now ? wake - now : 0;
                        struct __kernel_timespec ts = {.tv_sec = (long long) (d / 1000000),
                                .tv_nsec = (long long) (d % 1000000) * 1000};
                        r = io_uring_submit_and_wait_timeout(&s->ring, &cqe, 1, &ts, NULL);
                        if (r == -ETIME)
                                r = 0;
                } else
                        r = io_uring_submit_and_wait(&s->ring, 1);
                if (r < 0 && r != -EINTR)
                        return log_error_errno(r, "Failed to wait on the io_uring: %m");

                seen = 0;
                io_uring_for_each_cqe(&s->ring, head, cqe)
                {
                        handle_cqe(s, io_uring_cqe_get_data(cqe), cqe->res, cqe->flags);
                        seen++;
                }
                io_uring_cq_advance(&s->ring, seen);
        }
}

/* ---- setup and teardown ---- */

static int listen_socket(const ServerOptions *o, DsError *err)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        struct stat st;
        _cleanup_close_ int fd = -EBADF;
        mode_t old;
        int r;

        if (strlen(o->socket_path) >= sizeof(sa.sun_path))
                return ds_error(err, -ENAMETOOLONG, "socket path '%s' is longer than %zu bytes",
                        o->socket_path, sizeof(sa.sun_path) - 1);
        strcpy(sa.sun_path, o->socket_path);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return ds_error(err, -errno, "cannot create a Unix socket: %m");
        /* A socket file left by a daemon that died; anything else there is not ours. */
        if (lstat(o->socket_path, &st) == 0) {
                if (!S_ISSOCK(st.st_mode))
                        return ds_error(
                                err, -EEXIST, "'%s' exists and is not a socket", o->socket_path);
                if (unlink(o->socket_path) < 0)
                        return ds_error(err, -errno, "cannot remove the stale socket '%s': %m",
                                o->socket_path);
        }
        /* The file is created with the mode we want, never briefly more open. */
        old = umask(~o->socket_mode & 0777);
        r = bind(fd, (struct sockaddr *) &sa, sizeof(sa));
        umask(old);
        if (r < 0)
                return ds_error(err, -errno, "cannot bind '%s': %m", o->socket_path);
        if (listen(fd, SOMAXCONN) < 0)
                return ds_error(err, -errno, "cannot listen on '%s': %m", o->socket_path);
        return TAKE_FD(fd);
}

/* The welcome's description of the model now served. */
static void info_update(Server *s, const char *model_dir)
{
        const char *base = "";

        s->info = (struct ds_wire_server_info){
                .max_requests = s->opt.max_requests,
                .max_queue = s->opt.max_queue,
        };
        if (!s->engine)
                return;
        const BkConfig *cfg = &s->engine->model->bk.cfg;
        base = strrchr(model_dir, '/');
        base = base && base[1] ? base + 1 : model_dir;
        snprintf(s->info.model, sizeof(s->info.model), "%s", base);
        s->info.context_length = (uint32_t) MIN((uint64_t) cfg->max_positions,
                (uint64_t) s->engine->kv.n_total * s->engine->block_tokens);
        s->info.vocab_size = tokenizer_n_vocab(s->engine->tok);
        s->info.kv_bytes_per_token = s->engine->ops->kv_bytes_per_token(s->engine->be);
        s->info.kv_block_tokens = s->engine->block_tokens;
}

int server_new(
        int notify_fd, const ServerOptions *o, const ServerHooks *hooks, Server **ret, DsError *err)
{
        _cleanup_(server_freep) Server *s = NULL;
        sigset_t mask;
        int r;

        s = calloc(1, sizeof(*s));
        if (!s)
                return ds_error(err, -ENOMEM, "out of memory");
        s->listen_fd = s->signal_fd = -EBADF;
        s->notify_fd = notify_fd;
        s->opt = *o;
        if (hooks)
                s->hooks = *hooks;
        s->op_accept = (IoOp){.kind = IO_ACCEPT};
        s->op_signal = (IoOp){.kind = IO_SIGNAL};
        s->op_notify = (IoOp){.kind = IO_NOTIFY};
        s->op_cancel = (IoOp){.kind = IO_CANCEL};
        for (unsigned i = 0; i < SERVER_WATCH_MAX; i++)
                s->op_watch[i] = (IoOp){.kind = IO_WATCH};

        r = wire_layout_init(o->sub_slots, o->cpl_slots, o->data_size, &s->layout);
        if (r < 0)
                return ds_error(err, r,
                        "segment of %u submission and %u completion slots and %u data bytes "
                        "is outside the wire limits",
                        o->sub_slots, o->cpl_slots, o->data_size);
        info_update(s, "");

        /* The caller blocked these in every thread; they arrive here instead. */
        sigemptyset(&mask);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGINT);
        sigaddset(&mask, SIGHUP);
        s->signal_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
        if (s->signal_fd < 0)
                return ds_error(err, -errno, "cannot create a signalfd: %m");

        r = io_uring_queue_init(SERVER_RING_ENTRIES, &s->ring, 0);
        if (r < 0)
                return ds_error(err, r, "cannot set up an io_uring: %s", strerror(-r));
        s->ring_ready = true;

        if (o->listen_fd >= 0) {
                s->listen_fd = o->listen_fd;
                s->listen_inherited = true;
        } else {
                r = listen_socket(o, err);
                if (r < 0)
                        return r;
                s->listen_fd = r;
        }

        /* Accepting waits for a model (server_set_engine()) or server_accept(): until then
         * connections wait in the listen backlog for their welcome. */
        r = arm_signal(s);
        if (r >= 0)
                r = arm_notify(s);
        if (r < 0)
                return ds_error(err, r, "cannot queue the first io_uring operations");
        /* The HTTP listener opens now, so that health checks see "loading" rather than a
         * refused connection while the first model loads. */
        if (s->opt.http && s->opt.http->listen[0]) {
                r = http_listener_new(&s->ring, NULL, NULL, s->opt.http, "", &s->http, err);
                if (r < 0)
                        return r;
        }
        *ret = TAKE_PTR(s);
        return 0;
}

int server_set_engine(Server *s, Engine *e, EngineLoop *loop, const char *model_dir, DsError *err)
{
        int r;

        if (s->old_loop)
                return ds_error(err, -EBUSY, "the previous model still finishes its requests");
        s->old_engine = s->engine;
        s->old_loop = s->loop;
        s->engine = e;
        s->loop = loop;
        info_update(s, model_dir);
        if (s->http)
                r = http_listener_set_engine(s->http, e, loop, s->info.model);
        else if (s->opt.http && s->opt.http->listen[0])
                r = http_listener_new(&s->ring, e, loop, s->opt.http, s->info.model, &s->http, err);
        else
                r = 0;
        if (r < 0) {
                /* The new model serves natively all the same; the caller reports this. */
                if (!err->msg[0])
                        ds_error(err, r, "out of memory");
                return r;
        }
        http_listener_set_draining(s->http, s->draining);
        server_accept(s);
        return 0;
}

void server_accept(Server *s)
{
        if (!s->op_accept.armed && !s->stopping && arm_accept(s) < 0)
                log_error("Failed to arm accept: no submission entry");
}

Engine *server_engine(Server *s)
{
        return s->engine;
}

uint32_t server_context_length(Server *s)
{
        return s->info.context_length;
}

bool server_retiring(const Server *s)
{
        return s->old_loop != NULL;
}

bool server_idle(Server *s)
{
        return loop_idle(s->loop) && loop_idle(s->old_loop);
}

void server_drop_engine(Server *s)
{
        if (!s->loop)
                return;
        engine_loop_stop(s->loop, false);
        drain_loop(s, s->loop);
        s->loop = engine_loop_free(s->loop);
        s->engine = engine_free(s->engine);
        info_update(s, "");
}

void server_set_draining(Server *s, bool draining)
{
        s->draining = draining;
        http_listener_set_draining(s->http, draining);
}

void server_watch(Server *s, unsigned idx, int fd, int events)
{
        struct io_uring_sqe *sqe;
        IoOp *op = &s->op_watch[idx];

        if (fd < 0 || op->armed)
                return;
        sqe = get_sqe(s);
        if (!sqe)
                return; /* tried again at the next pass */
        io_uring_prep_poll_add(sqe, fd, (unsigned) events);
        arm(s, op, sqe);
}

static void stats_add(EngineLoopStats *a, const EngineLoopStats *b)
{
        a->active += b->active;
        a->queued += b->queued;
        a->paused_clients += b->paused_clients;
        a->kv_blocks_total += b->kv_blocks_total;
        a->kv_blocks_free += b->kv_blocks_free;
        a->tokens_per_s += b->tokens_per_s;
        a->submitted += b->submitted;
        a->rejected_busy += b->rejected_busy;
        a->steps += b->steps;
        a->prompt_tokens += b->prompt_tokens;
        a->generated_tokens += b->generated_tokens;
        a->preemptions += b->preemptions;
        a->finished += b->finished;
        a->cancelled += b->cancelled;
        a->failed += b->failed;
        a->events_dropped += b->events_dropped;
}

void server_memory(Server *s, uint64_t *ret_used, uint64_t *ret_total)
{
        engine_memory(s->engine, ret_used, ret_total);
}

void server_stats(Server *s, EngineLoopStats *ret, uint32_t *ret_clients)
{
        EngineLoopStats st;

        *ret = (EngineLoopStats){};
        if (s->loop) {
                engine_loop_stats(s->loop, &st);
                stats_add(ret, &st);
        }
        if (s->old_loop) {
                engine_loop_stats(s->old_loop, &st);
                stats_add(ret, &st);
        }
        if (ret_clients)
                *ret_clients = s->n_welcomed;
}

static int cmp_u64(const void *a, const void *b)
{
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

        return x < y ? -1 : x > y;
}

static void percentiles(const uint64_t *ring, uint64_t n, uint64_t ret[3])
{
        static const unsigned pct[3] = {50, 90, 99};
        uint64_t sorted[SERVER_LATENCY_SAMPLES];
        size_t m = (size_t) MIN(n, (uint64_t) SERVER_LATENCY_SAMPLES);

        ret[0] = ret[1] = ret[2] = 0;
        if (m == 0)
                return;
        memcpy(sorted, ring, m * sizeof(*sorted));
        qsort(sorted, m, sizeof(*sorted), cmp_u64);
        for (size_t i = 0; i < 3; i++)
                ret[i] = sorted[MIN(m - 1, (m * pct[i] + 99) / 100 - 1)];
}

void server_latencies(Server *s, uint64_t ttft[3], uint64_t itl[3])
{
        percentiles(s->ttft_usec, s->n_ttft, ttft);
        percentiles(s->itl_usec, s->n_itl, itl);
}

int server_foreach_client(Server *s, int (*fn)(void *ctx, const Session *c), void *ctx)
{
        for (Session *c = s->sessions; c; c = c->next) {
                if (c->state != SESSION_RING && c->state != SESSION_SOCKET)
                        continue;
                int r = fn(ctx, c);
                if (r < 0)
                        return r;
        }
        return 0;
}

int server_cancel(Server *s, uint64_t id)
{
        for (Session *c = s->sessions; c; c = c->next) {
                if (c->state != SESSION_RING && c->state != SESSION_SOCKET)
                        continue;
                if (id & SERVER_CLIENT_ID_BIT) {
                        if (c->key != (id & ~SERVER_CLIENT_ID_BIT))
                                continue;
                        loops_cancel_client(s, c->key);
                        return 0;
                }
                for (Request *q = c->requests; q; q = q->next)
                        if (q->id == id && !q->answered)
                                return engine_loop_cancel(q->loop, q->id);
        }
        return -ESRCH;
}

Server *server_free(Server *s)
{
        struct io_uring_cqe *cqe;

        if (!s)
                return NULL;
        bool remove_socket = !s->stopping && !s->listen_inherited;

        /* From here on nothing is re-armed. The engines stop first: the events they
         * still hold free their requests. */
        s->stopping = true;
        s->stop_drain = false;
        if (s->loop)
                engine_loop_stop(s->loop, false);
        if (s->old_loop)
                engine_loop_stop(s->old_loop, false);
        drain_events(s);
        if (s->ring_ready) {
                while (s->sessions)
                        client_close(s, s->sessions, LOG_LVL_INFO, "the daemon stops");
                cancel_op(s, &s->op_accept);
                cancel_op(s, &s->op_signal);
                cancel_op(s, &s->op_notify);
                for (unsigned i = 0; i < SERVER_WATCH_MAX; i++)
                        cancel_op(s, &s->op_watch[i]);
                http_listener_close_all(s->http);
                /* Every operation holds a session reference until its completion. */
                while ((s->n_armed > 0 || http_listener_armed(s->http) > 0) &&
                        io_uring_submit_and_wait(&s->ring, 1) >= 0) {
                        unsigned head, seen = 0;
                        io_uring_for_each_cqe(&s->ring, head, cqe)
                        {
                                handle_cqe(s, io_uring_cqe_get_data(cqe), cqe->res, cqe->flags);
                                seen++;
                        }
                        io_uring_cq_advance(&s->ring, seen);
                }
                io_uring_queue_exit(&s->ring);
        }
        http_listener_free(s->http);
        if (s->listen_fd >= 0) {
                close(s->listen_fd);
                if (remove_socket)
                        (void) unlink(s->opt.socket_path);
        }
        if (s->signal_fd >= 0)
                close(s->signal_fd);
        engine_loop_free(s->loop);
        engine_loop_free(s->old_loop);
        engine_free(s->engine);
        engine_free(s->old_engine);
        free(s);
        return NULL;
}
