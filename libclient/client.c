/* SPDX-License-Identifier: MIT */
/* libdsclient: the client side of the wire protocol (ipc/wire.h, docs/protocol.md).
 *
 * A handle holds the socket, and in ring mode the mapped segment with its two rings (we
 * produce submissions, we consume completions) and the eventfds. Events are read as
 * groups of records (a TOKEN and its follow-ups, or one record), validated, and turned
 * into a ds_event. The daemon is trusted to be the daemon, but not to be bug-free: every
 * record is validated and a broken one ends the connection with -EPROTO. Nothing here
 * logs: every failure is a return value. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "dsclient-debug.h"
#include "dsclient.h"
#include "ring.h"
#include "wire.h"

/* The public constants are the wire's. */
static_assert(DS_MAX_STOP == DS_WIRE_MAX_STOP, "stop");
static_assert(DS_MAX_STOP_LEN == DS_WIRE_MAX_STOP_LEN, "stop len");
static_assert(DS_MAX_MESSAGES == DS_WIRE_MAX_MESSAGES, "messages");
static_assert(DS_MAX_TOP_LOGPROBS == DS_WIRE_MAX_TOP_LOGPROBS, "logprobs");
static_assert(DS_MAX_PIECE == DS_WIRE_MAX_PIECE, "piece");
static_assert(DS_MAX_MESSAGE == DS_WIRE_MESSAGE, "message");
static_assert(DS_TOKEN_NONE == DS_WIRE_TOKEN_NONE, "text-only token");
static_assert(DS_ERR_UNSUPPORTED - DS_ERR_WIRE_BASE == DS_WIRE_ERR_UNSUPPORTED, "errors");
static_assert(DS_ERR_DRAINING - DS_ERR_WIRE_BASE == DS_WIRE_ERR_DRAINING, "errors");
static_assert(DS_ERR_NO_MODEL - DS_ERR_WIRE_BASE == DS_WIRE_ERR_NO_MODEL, "errors");
static_assert(_DS_WIRE_ERR_MAX == DS_WIRE_ERR_NO_MODEL + 1, "every wire error is public");
static_assert((int) DS_ROLE_ASSISTANT == (int) DS_WIRE_ROLE_ASSISTANT, "roles");
static_assert((int) DS_FINISH_CANCELLED == (int) DS_WIRE_FINISH_CANCELLED, "finish");
static_assert((int) DS_MODE_SOCKET == (int) DS_WIRE_MODE_SOCKET, "modes");
static_assert(sizeof(ds_sampling) == sizeof(struct ds_wire_sampling), "sampling");
static_assert(sizeof(((ds_info *) 0)->model) == DS_WIRE_MODEL_NAME, "model name");

#define DEFAULT_SOCKET     "/run/dsd/dsd.sock"
#define CONNECT_TIMEOUT_MS 30000
#define INFO_TIMEOUT_MS    5000
/* A sleeper wakes at least this often to look for a dead daemon (socket EOF), so that a
 * daemon killed with SIGKILL is noticed within 100 ms. */
#define SLICE_MS    10
#define STASH_MAX   16384u
#define RBUF_SIZE   (64u << 10)
#define MAX_WELCOME (64u << 10)
/* A token's records: itself, its TEXT records, one LOGPROBS. */
#define GROUP_MAX (2u + (DS_WIRE_MAX_PIECE + DS_WIRE_TEXT_INLINE - 1) / DS_WIRE_TEXT_INLINE)

struct ds_client {
        pthread_mutex_t lock;
        uint32_t mode; /* DS_WIRE_MODE_* */
        int sock;
        int epfd; /* ds_fd(): the socket, the notify eventfd and kick */
        int kick; /* our own eventfd: readable while the stash holds events */
        int dead; /* 0, or the error every later call returns */
        uint64_t next_id;
        struct ds_wire_server_info info;

        /* ring mode */
        void *seg;
        size_t seg_size;
        int doorbell; /* we write it to wake the daemon */
        int notify;   /* the daemon writes it when consumer_waiting has DS_WIRE_WAKE_FD */
        Ring sub;     /* we produce */
        Ring cpl;     /* we consume */
        uint8_t *data;
        uint32_t data_size;
        uint64_t data_w;          /* free-running: bytes allocated in the data area */
        uint64_t data_r;          /* free-running: bytes the daemon has copied out */
        uint64_t *data_end;       /* [sub_n]: data_w after the record at that position */
        uint32_t n_sleepers;      /* threads in FUTEX_WAIT on the completion tail */
        bool armed_fd;            /* consumer_waiting has DS_WIRE_WAKE_FD */
        uint64_t peer_checked_ms; /* when ds_next() last looked for the socket's EOF */

        /* socket mode: received bytes, [rpos, rlen) not yet taken */
        uint8_t *rbuf;
        size_t rpos, rlen;

        /* Complete groups taken off the wire while ds_server_info() waited for its answer;
         * ds_next() serves them first. A FIFO of [stash_n] records from stash_head. */
        union ds_wire_slot *stash;
        uint32_t stash_head, stash_n, stash_cap;
        bool kicked;
};

static _Thread_local char connect_message[DS_WIRE_MESSAGE + 1];

/* ---- small helpers ---- */

static uint64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

/* Milliseconds left before deadline (UINT64_MAX: none), capped at cap. */
static int wait_ms(uint64_t deadline, int cap)
{
        uint64_t now;

        if (deadline == UINT64_MAX)
                return cap;
        now = now_ms();
        if (now >= deadline)
                return 0;
        return deadline - now < (uint64_t) cap ? (int) (deadline - now) : cap;
}

static void eventfd_ring(int fd)
{
        uint64_t one = 1;
        /* Non-blocking (set at connect): a full counter already means "wake up". */
        (void) !write(fd, &one, sizeof(one));
}

static void eventfd_drain(int fd)
{
        uint64_t v;
        (void) !read(fd, &v, sizeof(v));
}

static void close_fd(int *fd)
{
        if (*fd >= 0)
                close(*fd);
        *fd = -1;
}

static int fail(ds_client *c, int r)
{
        if (!c->dead)
                c->dead = r;
        return c->dead;
}

/* The socket's peer is gone: EOF, hang-up or error. In ring mode the daemon sends nothing
 * after the welcome, so any readiness at all means that. */
static bool ring_peer_gone(ds_client *c)
{
        struct pollfd p = {.fd = c->sock, .events = POLLIN | POLLRDHUP};
        return poll(&p, 1, 0) > 0;
}

/* ---- record sources: the stash, then the ring or the socket buffer ---- */

/* Reads new bytes from the socket without blocking: 0, or -ECONNRESET at EOF. */
static int sock_fill(ds_client *c)
{
        ssize_t n;

        if (c->rpos > 0) {
                memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
                c->rlen -= c->rpos;
                c->rpos = 0;
        }
        if (c->rlen == RBUF_SIZE)
                return 0;
        n = recv(c->sock, c->rbuf + c->rlen, RBUF_SIZE - c->rlen, MSG_DONTWAIT);
        if (n == 0)
                return -ECONNRESET;
        if (n < 0)
                return errno == EAGAIN || errno == EINTR ? 0 : -ECONNRESET;
        c->rlen += (size_t) n;
        return 0;
}

/* Complete records available, or -EPROTO on a bad frame length. */
static int64_t raw_available(ds_client *c)
{
        if (c->mode == DS_WIRE_MODE_RING) {
                int64_t n = ring_available(&c->cpl);
                return n < 0 ? -EPROTO : n;
        }

        int64_t n = 0;
        for (size_t p = c->rpos; c->rlen - p >= DS_WIRE_FRAME_HDR; n++) {
                uint32_t len;
                memcpy(&len, c->rbuf + p, sizeof(len));
                if (wire_frame_len_validate(len, false) < 0)
                        return -EPROTO;
                if (c->rlen - p - DS_WIRE_FRAME_HDR < len)
                        break;
                p += DS_WIRE_FRAME_HDR + len;
        }
        return n;
}

static void raw_peek(ds_client *c, uint32_t i, union ds_wire_slot *ret)
{
        if (c->mode == DS_WIRE_MODE_RING)
                ring_peek(&c->cpl, i, ret);
        else
                memcpy(ret,
                        c->rbuf + c->rpos + (size_t) i * (DS_WIRE_FRAME_HDR + DS_WIRE_SLOT_SIZE) +
                                DS_WIRE_FRAME_HDR,
                        sizeof(*ret));
}

static void raw_consume(ds_client *c, uint32_t n)
{
        if (c->mode != DS_WIRE_MODE_RING) {
                c->rpos += (size_t) n * (DS_WIRE_FRAME_HDR + DS_WIRE_SLOT_SIZE);
                return;
        }
        ring_consume(&c->cpl, n);
        /* The daemon may be holding events back for want of space. */
        if (ring_producer_needs_wake(&c->cpl))
                eventfd_ring(c->doorbell);
}

/* Reads the next complete group (a record and its n_follow records) into group[].
 * Returns its record count, 0 if none is complete yet, or -EPROTO. */
static int read_group(ds_client *c, bool from_stash, union ds_wire_slot group[GROUP_MAX])
{
        int64_t avail;
        uint32_t need;
        int r;

        if (from_stash) {
                avail = c->stash_n;
                if (avail == 0)
                        return 0;
                group[0] = c->stash[c->stash_head];
        } else {
                avail = raw_available(c);
                if (avail <= 0)
                        return (int) avail;
                raw_peek(c, 0, &group[0]);
        }

        /* Copy first, validate the copy. */
        r = wire_d2c_validate(&group[0]);
        if (r < 0)
                return -EPROTO;
        need = 1 + group[0].hdr.n_follow;
        if (group[0].hdr.type == DS_WIRE_TEXT || group[0].hdr.type == DS_WIRE_LOGPROBS ||
                need > GROUP_MAX)
                return -EPROTO;
        if (avail < need) {
                /* A group is published with one tail store, so a ring (or the stash,
                 * which holds whole groups) never shows part of one; a socket may. */
                if (from_stash || c->mode == DS_WIRE_MODE_RING)
                        return -EPROTO;
                return 0;
        }
        for (uint32_t i = 1; i < need; i++) {
                if (from_stash)
                        group[i] = c->stash[(c->stash_head + i) % c->stash_cap];
                else
                        raw_peek(c, i, &group[i]);
                r = wire_d2c_validate(&group[i]);
                if (r < 0 || group[i].hdr.request_id != group[0].hdr.request_id)
                        return -EPROTO;
        }
        return (int) need;
}

static void consume_group(ds_client *c, bool from_stash, uint32_t n)
{
        if (from_stash) {
                c->stash_head = (c->stash_head + n) % c->stash_cap;
                c->stash_n -= n;
        } else
                raw_consume(c, n);
}

/* ---- events ---- */

static void event_clear(ds_event *ev)
{
        /* Not a memset of the whole struct: the text array alone is 4 KiB. */
        ev->type = 0;
        ev->_reserved0 = 0;
        ev->request_id = 0;
        ev->publish_ns = 0;
        ev->token_id = 0;
        ev->logprob = 0;
        ev->text_len = 0;
        ev->n_top = 0;
        ev->text[0] = 0;
        ev->finish = 0;
        ev->prompt_tokens = 0;
        ev->generated_tokens = 0;
        ev->_reserved1 = 0;
        ev->queue_us = 0;
        ev->ttft_us = 0;
        ev->total_us = 0;
        ev->error = 0;
        ev->message[0] = 0;
}

/* Turns a validated group into an event: 0, or -EPROTO if its parts disagree. */
static int group_to_event(const union ds_wire_slot *g, uint32_t n, ds_event *ev)
{
        event_clear(ev);
        ev->request_id = g[0].hdr.request_id;

        switch (g[0].hdr.type) {
        case DS_WIRE_TOKEN: {
                const struct ds_wire_token *t = &g[0].token;
                uint32_t len = t->inline_len, i = 1;

                ev->type = DS_EVENT_TOKEN;
                ev->token_id = t->token_id;
                ev->logprob = t->logprob;
                ev->publish_ns = t->publish_ns;
                memcpy(ev->text, t->text, len);
                for (; i < n && g[i].hdr.type == DS_WIRE_TEXT; i++) {
                        if (g[i].text.len > t->text_len - len)
                                return -EPROTO;
                        memcpy(ev->text + len, g[i].text.text, g[i].text.len);
                        len += g[i].text.len;
                }
                if (len != t->text_len)
                        return -EPROTO;
                if (i < n) {
                        if (g[i].hdr.type != DS_WIRE_LOGPROBS || i + 1 != n)
                                return -EPROTO;
                        ev->n_top = g[i].logprobs.n;
                        for (uint32_t k = 0; k < ev->n_top; k++) {
                                ev->top[k].token_id = g[i].logprobs.top[k].token_id;
                                ev->top[k].logprob = g[i].logprobs.top[k].logprob;
                        }
                }
                ev->text_len = len;
                ev->text[len] = 0;
                return 0;
        }
        case DS_WIRE_FINAL:
                ev->type = DS_EVENT_FINAL;
                ev->publish_ns = g[0].final.publish_ns;
                ev->finish = g[0].final.finish;
                ev->prompt_tokens = g[0].final.prompt_tokens;
                ev->generated_tokens = g[0].final.generated_tokens;
                ev->queue_us = g[0].final.queue_us;
                ev->ttft_us = g[0].final.ttft_us;
                ev->total_us = g[0].final.total_us;
                return 0;
        case DS_WIRE_ERROR:
                ev->type = DS_EVENT_ERROR;
                ev->error = -(int32_t) (DS_ERR_WIRE_BASE + g[0].error.code);
                memcpy(ev->message, g[0].error.message, g[0].error.len);
                ev->message[g[0].error.len] = 0;
                return 0;
        default:
                return -EPROTO;
        }
}

/* Takes one event: 1, 0 when none is complete, or a negative code (the handle is dead). */
static int take_event(ds_client *c, ds_event *ev)
{
        union ds_wire_slot group[GROUP_MAX];

        for (;;) {
                bool from_stash = c->stash_n > 0;
                int n = read_group(c, from_stash, group);

                if (n <= 0)
                        return n < 0 ? fail(c, n) : 0;
                consume_group(c, from_stash, (uint32_t) n);
                /* An INFO nobody waits for any more (its ds_server_info() timed out). */
                if (group[0].hdr.type == DS_WIRE_INFO)
                        continue;
                if (group_to_event(group, (uint32_t) n, ev) < 0)
                        return fail(c, -EPROTO);
                return 1;
        }
}

/* consumer_waiting says how we sleep: FUTEX while a thread is in FUTEX_WAIT, FD while
 * ds_fd() is armed. Raising it fences and returns the records available after the fence
 * (sleep only on 0); lowering needs no fence. */
static int64_t update_waiting(ds_client *c, uint32_t *ret_tail)
{
        uint32_t how =
                (c->n_sleepers ? DS_WIRE_WAKE_FUTEX : 0) | (c->armed_fd ? DS_WIRE_WAKE_FD : 0);
        uint32_t tail;

        if (how == 0) {
                ring_consumer_end_sleep(&c->cpl);
                return 0;
        }
        int64_t n = ring_consumer_prepare_sleep(&c->cpl, how, &tail);
        if (ret_tail)
                *ret_tail = tail;
        return n < 0 ? -EPROTO : n;
}

/* ---- connecting ---- */

static int send_all(int fd, const void *buf, size_t len)
{
        const uint8_t *p = buf;

        while (len > 0) {
                ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return errno == EPIPE || errno == ECONNRESET ? -ECONNRESET : -errno;
                }
                p += n;
                len -= (size_t) n;
        }
        return 0;
}

/* Receives exactly len bytes before deadline, collecting SCM_RIGHTS fds into fds[] (at
 * most max_fds; more is -EPROTO, after closing them all). */
static int recv_all(int fd, void *buf, size_t len, uint64_t deadline, int *fds, uint32_t *n_fds,
        uint32_t max_fds)
{
        uint8_t *p = buf;

        while (len > 0) {
                union {
                        struct cmsghdr align;
                        uint8_t buf[CMSG_SPACE(8 * sizeof(int))];
                } cbuf;
                struct iovec iov = {.iov_base = p, .iov_len = len};
                struct msghdr msg = {
                        .msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = cbuf.buf,
                        .msg_controllen = sizeof(cbuf.buf),
                };
                struct pollfd pfd = {.fd = fd, .events = POLLIN};
                int ms = wait_ms(deadline, INT32_MAX);
                ssize_t n;
                int r = 0;

                if (ms == 0)
                        return -ETIMEDOUT;
                if (poll(&pfd, 1, ms) < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
                if (n < 0) {
                        if (errno == EAGAIN || errno == EINTR)
                                continue;
                        return errno == ECONNRESET ? -ECONNRESET : -errno;
                }
                for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
                        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                                continue;
                        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                        for (size_t i = 0; i < k; i++) {
                                int got;
                                memcpy(&got, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                                if (*n_fds < max_fds)
                                        fds[(*n_fds)++] = got;
                                else {
                                        close(got);
                                        r = -EPROTO;
                                }
                        }
                }
                if (msg.msg_flags & MSG_CTRUNC)
                        r = -EPROTO;
                if (r < 0)
                        return r;
                if (n == 0)
                        return -ECONNRESET;
                p += n;
                len -= (size_t) n;
        }
        return 0;
}

static void set_message(const char *msg, size_t size)
{
        size_t n = strnlen(msg, size);
        memcpy(connect_message, msg, n);
        connect_message[n] = 0;
}

static int map_segment(ds_client *c, const struct ds_wire_welcome *w, int memfd)
{
        const struct ds_wire_layout *l = &w->layout;
        const struct ds_wire_seg_header *h;
        struct stat st;

        if (fstat(memfd, &st) < 0)
                return -errno;
        if (st.st_size < 0 || (uint64_t) st.st_size < l->segment_size)
                return -EPROTO;
        c->seg = mmap(NULL, l->segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
        if (c->seg == MAP_FAILED) {
                c->seg = NULL;
                return -errno;
        }
        c->seg_size = l->segment_size;
        h = c->seg;
        if (h->magic != DS_WIRE_SEG_MAGIC || h->version != DS_WIRE_VERSION ||
                h->slot_size != DS_WIRE_SLOT_SIZE)
                return -EPROTO;
        ring_init(&c->sub, c->seg, l->sub_ctl, l->sub_slots, l->sub_n);
        ring_init(&c->cpl, c->seg, l->cpl_ctl, l->cpl_slots, l->cpl_n);
        c->data = (uint8_t *) c->seg + l->data;
        c->data_size = l->data_size;
        c->data_end = calloc(l->sub_n, sizeof(*c->data_end));
        return c->data_end ? 0 : -ENOMEM;
}

static int epoll_add(int epfd, int fd, uint32_t events)
{
        struct epoll_event e = {.events = events, .data.fd = fd};
        return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &e) < 0 ? -errno : 0;
}

/* One connection attempt in the given mode. *ret_retry is set when a ring connection
 * failed for a reason the socket-only mode would not have (the daemon offers no rings,
 * or mapping failed). */
static int connect_mode(const char *path, uint32_t mode, ds_client **ret, bool *ret_retry)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        struct ds_wire_hello hello = {
                .magic = DS_WIRE_MAGIC,
                .version = DS_WIRE_VERSION,
                .mode = (uint16_t) mode,
                .pid = (uint32_t) getpid(),
        };
        struct ds_wire_welcome w = {};
        uint8_t frame[DS_WIRE_FRAME_HDR + sizeof(hello)];
        uint64_t deadline = now_ms() + CONNECT_TIMEOUT_MS;
        int fds[DS_WIRE_RING_FDS] = {-1, -1, -1};
        uint32_t n_fds = 0, len;
        ds_client *c;
        int r;

        *ret_retry = false;
        if (strlen(path) >= sizeof(sa.sun_path))
                return -EINVAL;
        strcpy(sa.sun_path, path);

        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->sock = c->epfd = c->kick = c->doorbell = c->notify = -1;
        c->next_id = 1;
        pthread_mutex_init(&c->lock, NULL);

        c->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (c->sock < 0) {
                r = -errno;
                goto fail;
        }
        if (connect(c->sock, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
                r = -errno;
                goto fail;
        }

        len = sizeof(hello);
        memcpy(frame, &len, sizeof(len));
        memcpy(frame + DS_WIRE_FRAME_HDR, &hello, sizeof(hello));
        r = send_all(c->sock, frame, sizeof(frame));
        if (r < 0)
                goto fail;

        r = recv_all(c->sock, &len, sizeof(len), deadline, fds, &n_fds, DS_WIRE_RING_FDS);
        if (r < 0)
                goto fail;
        if (len < DS_WIRE_WELCOME_STABLE || len > MAX_WELCOME) {
                r = -EPROTO;
                goto fail;
        }
        r = recv_all(c->sock, &w, len < sizeof(w) ? len : sizeof(w), deadline, fds, &n_fds,
                DS_WIRE_RING_FDS);
        if (r < 0)
                goto fail;

        /* The stable prefix first: it is readable whatever version the daemon speaks. */
        r = wire_welcome_check_version(&w);
        if (r == -EPROTONOSUPPORT) {
                if (w.status == DS_WIRE_ERR_VERSION && w.message[0])
                        set_message(w.message, sizeof(w.message));
                else
                        snprintf(connect_message, sizeof(connect_message),
                                "the daemon speaks protocol version %u, this library %u", w.version,
                                DS_WIRE_VERSION);
                r = -DS_ERR_VERSION;
                goto fail;
        }
        if (r < 0)
                goto fail;
        if (w.status != DS_WIRE_OK) {
                if (w.status >= _DS_WIRE_ERR_MAX) {
                        r = -EPROTO;
                        goto fail;
                }
                set_message(w.message, sizeof(w.message));
                r = -(int) (DS_ERR_WIRE_BASE + w.status);
                *ret_retry = mode == DS_WIRE_MODE_RING && w.status == DS_WIRE_ERR_UNSUPPORTED;
                goto fail;
        }
        if (len != sizeof(w) || wire_welcome_validate(&w) < 0 || n_fds != w.n_fds ||
                (mode == DS_WIRE_MODE_SOCKET && w.mode != DS_WIRE_MODE_SOCKET)) {
                r = -EPROTO;
                goto fail;
        }
        c->mode = w.mode;
        c->info = w.info;

        c->epfd = epoll_create1(EPOLL_CLOEXEC);
        c->kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (c->epfd < 0 || c->kick < 0) {
                r = -errno;
                goto fail;
        }
        r = epoll_add(c->epfd, c->sock, EPOLLIN | EPOLLRDHUP);
        if (r >= 0)
                r = epoll_add(c->epfd, c->kick, EPOLLIN);
        if (r < 0)
                goto fail;

        if (c->mode == DS_WIRE_MODE_RING) {
                c->doorbell = fds[1];
                c->notify = fds[2];
                fds[1] = fds[2] = -1;
                /* The daemon creates them EFD_NONBLOCK; make sure, since a blocking read
                 * of an empty eventfd would hang ds_next(). */
                if (fcntl(c->doorbell, F_SETFL, O_NONBLOCK) < 0 ||
                        fcntl(c->notify, F_SETFL, O_NONBLOCK) < 0) {
                        r = -errno;
                        goto fail;
                }
                r = epoll_add(c->epfd, c->notify, EPOLLIN);
                if (r < 0)
                        goto fail;
                r = map_segment(c, &w, fds[0]);
                if (r < 0) {
                        *ret_retry = r != -EPROTO;
                        goto fail;
                }
                close_fd(&fds[0]);
        } else {
                c->rbuf = malloc(RBUF_SIZE);
                if (!c->rbuf) {
                        r = -ENOMEM;
                        goto fail;
                }
        }

        *ret = c;
        return 0;

fail:
        for (uint32_t i = 0; i < n_fds; i++)
                close_fd(&fds[i]);
        ds_close(c);
        return r;
}

DS_PUBLIC int ds_connect(const char *path, uint32_t flags, ds_client **ret)
{
        bool retry;
        int r;

        if (!ret || (flags & ~(uint32_t) DS_CONNECT_SOCKET_ONLY))
                return -EINVAL;
        connect_message[0] = 0;
        if (!path) {
                path = getenv("DSD_SOCKET");
                if (!path || !*path)
                        path = DEFAULT_SOCKET;
        }
        if (!*path)
                return -EINVAL;

        if (flags & DS_CONNECT_SOCKET_ONLY)
                return connect_mode(path, DS_WIRE_MODE_SOCKET, ret, &retry);
        r = connect_mode(path, DS_WIRE_MODE_RING, ret, &retry);
        if (r < 0 && retry) {
                connect_message[0] = 0;
                r = connect_mode(path, DS_WIRE_MODE_SOCKET, ret, &retry);
        }
        return r;
}

DS_PUBLIC const char *ds_connect_message(void)
{
        return connect_message;
}

DS_PUBLIC ds_client *ds_close(ds_client *c)
{
        if (!c)
                return NULL;
        if (c->seg)
                munmap(c->seg, c->seg_size);
        close_fd(&c->sock);
        close_fd(&c->epfd);
        close_fd(&c->kick);
        close_fd(&c->doorbell);
        close_fd(&c->notify);
        free(c->data_end);
        free(c->rbuf);
        free(c->stash);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return NULL;
}

/* ---- submitting ---- */

DS_PUBLIC void ds_request_init(ds_request *req)
{
        if (!req)
                return;
        *req = (ds_request){
                .kind = DS_PROMPT_TEXT,
                .text = "",
                .sampling =
                        {
                                .temperature = 1.0f,
                                .top_p = 1.0f,
                                .repetition_penalty = 1.0f,
                        },
        };
}

/* Checks req and computes the byte sizes of its packed prompt and stop list. */
static int request_sizes(const ds_request *req, uint32_t *ret_prompt, uint32_t *ret_stop)
{
        uint64_t prompt = 0, stop = 0;
        struct ds_wire_sampling s;

        memcpy(&s, &req->sampling, sizeof(s));
        if (wire_sampling_validate(&s) < 0)
                return -EINVAL;
        if (req->n_stop > DS_MAX_STOP || (req->n_stop && !req->stop) ||
                req->top_logprobs > DS_MAX_TOP_LOGPROBS || req->_reserved0 != 0)
                return -EINVAL;
        for (size_t i = 0; i < req->n_stop; i++) {
                size_t n = req->stop[i] ? strlen(req->stop[i]) : 0;
                if (n == 0 || n > DS_MAX_STOP_LEN)
                        return -EINVAL;
                stop += 4 + n;
        }

        switch (req->kind) {
        case DS_PROMPT_TEXT:
                if (!req->text || req->text_len == 0)
                        return -EINVAL;
                prompt = req->text_len;
                break;
        case DS_PROMPT_IDS:
                if (!req->ids || req->n_ids == 0)
                        return -EINVAL;
                if (req->n_ids > UINT32_MAX / sizeof(int32_t))
                        return -EMSGSIZE;
                for (size_t i = 0; i < req->n_ids; i++)
                        if (req->ids[i] < 0)
                                return -EINVAL;
                prompt = req->n_ids * sizeof(int32_t);
                break;
        case DS_PROMPT_CHAT:
                if (!req->messages || req->n_messages == 0 || req->n_messages > DS_MAX_MESSAGES)
                        return -EINVAL;
                for (size_t i = 0; i < req->n_messages; i++) {
                        const ds_message *m = &req->messages[i];
                        if (m->role < DS_ROLE_SYSTEM || m->role > DS_ROLE_ASSISTANT ||
                                !m->content || m->_reserved != 0)
                                return -EINVAL;
                        prompt += 8 + strlen(m->content);
                        if (prompt > UINT32_MAX)
                                return -EMSGSIZE;
                }
                break;
        default:
                return -EINVAL;
        }
        if (prompt + stop > UINT32_MAX)
                return -EMSGSIZE;
        *ret_prompt = (uint32_t) prompt;
        *ret_stop = (uint32_t) stop;
        return 0;
}

static void put_u32(uint8_t *p, uint32_t v)
{
        memcpy(p, &v, sizeof(v));
}

/* Writes the packed prompt then the packed stop list at dst. */
static void put_payload(uint8_t *dst, const ds_request *req)
{
        switch (req->kind) {
        case DS_PROMPT_TEXT:
                memcpy(dst, req->text, req->text_len);
                dst += req->text_len;
                break;
        case DS_PROMPT_IDS:
                memcpy(dst, req->ids, req->n_ids * sizeof(int32_t));
                dst += req->n_ids * sizeof(int32_t);
                break;
        default:
                for (size_t i = 0; i < req->n_messages; i++) {
                        size_t n = strlen(req->messages[i].content);
                        put_u32(dst, req->messages[i].role);
                        put_u32(dst + 4, (uint32_t) n);
                        memcpy(dst + 8, req->messages[i].content, n);
                        dst += 8 + n;
                }
                break;
        }
        for (size_t i = 0; i < req->n_stop; i++) {
                size_t n = strlen(req->stop[i]);
                put_u32(dst, (uint32_t) n);
                memcpy(dst + 4, req->stop[i], n);
                dst += 4 + n;
        }
}

static void submit_record(const ds_request *req, uint64_t id, uint32_t base, uint32_t prompt,
        uint32_t stop, union ds_wire_slot *rec)
{
        static const uint16_t kinds[] = {
                [DS_PROMPT_TEXT] = DS_WIRE_SUBMIT_TEXT,
                [DS_PROMPT_IDS] = DS_WIRE_SUBMIT_IDS,
                [DS_PROMPT_CHAT] = DS_WIRE_SUBMIT_CHAT,
        };
        struct ds_wire_submit *s = &rec->submit;

        memset(rec, 0, sizeof(*rec));
        s->hdr.type = DS_WIRE_SUBMIT;
        s->hdr.flags = kinds[req->kind];
        s->hdr.request_id = id;
        memcpy(&s->sampling, &req->sampling, sizeof(s->sampling));
        s->max_tokens = req->max_tokens;
        s->top_logprobs = req->top_logprobs;
        s->prompt = (struct ds_wire_ref){base, prompt};
        s->stop = (struct ds_wire_ref){stop ? base + prompt : 0, stop};
        s->n_stop = (uint32_t) req->n_stop;
        s->n_messages = req->kind == DS_PROMPT_CHAT ? (uint32_t) req->n_messages : 0;
}

/* Frees the data of submissions the daemon has consumed, given the space the ring has
 * (>= 1, so the entry of position head - 1 has not been overwritten yet). */
static void data_reclaim(ds_client *c, uint32_t space)
{
        uint32_t head = c->sub.local - (c->sub.n_slots - space);

        if (head == c->sub.local)
                c->data_r = c->data_w; /* everything consumed */
        else if (head != 0)
                c->data_r = c->data_end[(head - 1) & c->sub.mask];
}

/* Allocates len contiguous bytes of the data area: 0 and the offset, or -EAGAIN. */
static int data_alloc(ds_client *c, uint32_t len, uint32_t *ret_off)
{
        uint32_t off = (uint32_t) (c->data_w % c->data_size);
        uint64_t skip = 0;

        if (len == 0) {
                *ret_off = 0;
                return 0;
        }
        if ((uint64_t) off + len > c->data_size)
                skip = c->data_size - off; /* wrap: the tail end stays unused */
        if (c->data_w + skip + len - c->data_r > c->data_size)
                return -EAGAIN;
        c->data_w += skip;
        *ret_off = (uint32_t) (c->data_w % c->data_size);
        c->data_w += len;
        return 0;
}

/* Sleeps until the daemon frees submission slots (it wakes us) or a slice passes. Called
 * and returns with the lock held. 0, or -ECONNRESET when the daemon is gone. */
static int wait_for_space(ds_client *c)
{
        int64_t space = ring_producer_prepare_sleep(&c->sub);
        if (space < 0)
                return -EPROTO;
        if (space == 0) {
                uint32_t head = c->sub.local - c->sub.n_slots;
                struct timespec ts = {0, SLICE_MS * 1000000L};

                pthread_mutex_unlock(&c->lock);
                ring_futex_wait(&c->sub.ctl->head, head, &ts);
                pthread_mutex_lock(&c->lock);
        } else {
                /* Slots are free but the data area is full: its bytes come back as the
                 * daemon consumes records, which it does without waiting on us. */
                struct timespec ts = {0, 1000000L};
                pthread_mutex_unlock(&c->lock);
                nanosleep(&ts, NULL);
                pthread_mutex_lock(&c->lock);
        }
        ring_producer_end_sleep(&c->sub);
        return ring_peer_gone(c) ? -ECONNRESET : 0;
}

static int submit_ring(
        ds_client *c, const ds_request *req, uint64_t id, uint32_t prompt, uint32_t stop)
{
        union ds_wire_slot rec;
        uint32_t off;
        int r;

        if ((uint64_t) prompt + stop > c->data_size)
                return -EMSGSIZE;
        for (;;) {
                int64_t space;

                if (c->dead)
                        return c->dead;
                space = ring_space(&c->sub);
                if (space < 0)
                        return fail(c, -EPROTO);
                if (space > 0) {
                        data_reclaim(c, (uint32_t) space);
                        if (data_alloc(c, prompt + stop, &off) == 0)
                                break;
                }
                r = wait_for_space(c);
                if (r < 0)
                        return fail(c, r);
        }

        put_payload(c->data + off, req);
        submit_record(req, id, off, prompt, stop, &rec);
        c->data_end[c->sub.local & c->sub.mask] = c->data_w;
        ring_write(&c->sub, 0, &rec);
        ring_publish(&c->sub, 1);
        if (ring_consumer_needs_wake(&c->sub))
                eventfd_ring(c->doorbell);
        return 0;
}

static int send_record(
        ds_client *c, const union ds_wire_slot *rec, const ds_request *req, uint32_t data_len)
{
        uint32_t len = DS_WIRE_SLOT_SIZE + data_len;
        uint8_t *frame;
        int r;

        if (len > DS_WIRE_MAX_FRAME || data_len > DS_WIRE_MAX_FRAME)
                return -EMSGSIZE;
        frame = malloc(DS_WIRE_FRAME_HDR + (size_t) len);
        if (!frame)
                return -ENOMEM;
        memcpy(frame, &len, sizeof(len));
        memcpy(frame + DS_WIRE_FRAME_HDR, rec, DS_WIRE_SLOT_SIZE);
        if (req)
                put_payload(frame + DS_WIRE_FRAME_HDR + DS_WIRE_SLOT_SIZE, req);
        r = send_all(c->sock, frame, DS_WIRE_FRAME_HDR + (size_t) len);
        free(frame);
        return r == -ECONNRESET ? fail(c, r) : r;
}

DS_PUBLIC int ds_submit(ds_client *c, const ds_request *req, uint64_t *ret_id)
{
        uint32_t prompt, stop;
        uint64_t id;
        int r;

        if (!c || !req || !ret_id)
                return -EINVAL;
        r = request_sizes(req, &prompt, &stop);
        if (r < 0)
                return r;

        pthread_mutex_lock(&c->lock);
        if (c->dead) {
                r = c->dead;
                goto out;
        }
        id = c->next_id;
        if (c->mode == DS_WIRE_MODE_RING)
                r = submit_ring(c, req, id, prompt, stop);
        else {
                union ds_wire_slot rec;
                submit_record(req, id, 0, prompt, stop, &rec);
                r = send_record(c, &rec, req, prompt + stop);
        }
        if (r >= 0) {
                c->next_id++;
                *ret_id = id;
        }
out:
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* Sends a header-only record (CANCEL, INFO_REQ). Called with the lock held. */
static int send_simple(ds_client *c, uint16_t type, uint64_t id)
{
        union ds_wire_slot rec = {.hdr = {.type = type, .request_id = id}};
        int r;

        if (c->dead)
                return c->dead;
        if (c->mode != DS_WIRE_MODE_RING)
                return send_record(c, &rec, NULL, 0);
        while ((r = ring_push(&c->sub, &rec)) == -EAGAIN) {
                r = wait_for_space(c);
                if (r < 0)
                        return fail(c, r);
        }
        if (r < 0)
                return fail(c, -EPROTO);
        /* No data: the position's data end is where the data stands now. */
        c->data_end[(c->sub.local - 1) & c->sub.mask] = c->data_w;
        if (ring_consumer_needs_wake(&c->sub))
                eventfd_ring(c->doorbell);
        return 0;
}

DS_PUBLIC int ds_cancel(ds_client *c, uint64_t id)
{
        int r;

        if (!c || id == 0)
                return -EINVAL;
        pthread_mutex_lock(&c->lock);
        r = send_simple(c, DS_WIRE_CANCEL, id);
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* ---- waiting for events ---- */

/* Waits for more input until deadline or one slice, with the lock released meanwhile.
 * Returns 0 (look again) or a negative code once the daemon is gone. */
static int wait_input(ds_client *c, uint64_t deadline)
{
        int ms = wait_ms(deadline, SLICE_MS);
        int r;

        if (c->mode != DS_WIRE_MODE_RING) {
                struct pollfd p = {.fd = c->sock, .events = POLLIN | POLLRDHUP};

                pthread_mutex_unlock(&c->lock);
                r = poll(&p, 1, ms);
                pthread_mutex_lock(&c->lock);
                return r > 0 ? sock_fill(c) : 0;
        }

        if (ring_peer_gone(c))
                return -ECONNRESET;
        uint32_t tail = 0;
        c->n_sleepers++;
        int64_t n = update_waiting(c, &tail);
        if (n == 0 && ms > 0) {
                struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

                pthread_mutex_unlock(&c->lock);
                ring_futex_wait(&c->cpl.ctl->tail, tail, &ts);
                pthread_mutex_lock(&c->lock);
        }
        c->n_sleepers--;
        update_waiting(c, NULL);
        return n < 0 ? (int) n : 0;
}

/* A client spinning on ds_next(c, 0) must not pay a poll() per call: the socket is looked
 * at once per slice (and always by a sleeper, in wait_input()). */
static bool peer_check_due(ds_client *c)
{
        uint64_t now = now_ms();

        if (now - c->peer_checked_ms < SLICE_MS)
                return false;
        c->peer_checked_ms = now;
        return true;
}

DS_PUBLIC int ds_next(ds_client *c, int timeout_ms, ds_event *ret)
{
        uint64_t deadline;
        int r;

        if (!c || !ret || timeout_ms < -1)
                return -EINVAL;
        deadline = timeout_ms < 0 ? UINT64_MAX : now_ms() + (uint64_t) timeout_ms;

        pthread_mutex_lock(&c->lock);
        if (c->kicked) {
                eventfd_drain(c->kick);
                c->kicked = false;
        }
        if (c->armed_fd) {
                eventfd_drain(c->notify);
                c->armed_fd = false;
                update_waiting(c, NULL);
        }
        for (;;) {
                if (c->mode != DS_WIRE_MODE_RING && !c->dead) {
                        /* At EOF what is buffered is still delivered: take_event()
                         * runs before the dead check. */
                        r = sock_fill(c);
                        if (r < 0)
                                fail(c, r);
                }
                r = take_event(c, ret);
                if (r != 0)
                        break;
                if (c->dead) {
                        r = c->dead;
                        break;
                }
                if (c->mode == DS_WIRE_MODE_RING && peer_check_due(c) && ring_peer_gone(c)) {
                        /* Records published before the daemon went are delivered
                         * first; take_event() just found none. */
                        r = fail(c, -ECONNRESET);
                        break;
                }
                if (wait_ms(deadline, SLICE_MS) == 0) {
                        /* Nothing: arm ds_fd() before returning 0, then look once more
                         * in case a record came before the flag was seen. */
                        if (c->mode == DS_WIRE_MODE_RING) {
                                c->armed_fd = true;
                                int64_t n = update_waiting(c, NULL);
                                if (n < 0) {
                                        r = fail(c, (int) n);
                                        break;
                                }
                                if (n > 0)
                                        continue;
                        }
                        r = 0;
                        break;
                }
                r = wait_input(c, deadline);
                if (r < 0) {
                        fail(c, r);
                        /* Loop: what arrived before the end is still delivered. */
                }
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

DS_PUBLIC int ds_fd(ds_client *c)
{
        if (!c)
                return -EINVAL;
        return c->epfd;
}

/* ---- server info ---- */

static int stash_group(ds_client *c, const union ds_wire_slot *g, uint32_t n)
{
        if (c->stash_n + n > STASH_MAX)
                return -ENOBUFS;
        if (c->stash_n + n > c->stash_cap) {
                uint32_t cap = c->stash_cap ? c->stash_cap : 64;
                union ds_wire_slot *s;

                while (cap < c->stash_n + n)
                        cap *= 2;
                s = malloc((size_t) cap * sizeof(*s));
                if (!s)
                        return -ENOMEM;
                for (uint32_t i = 0; i < c->stash_n; i++)
                        s[i] = c->stash[(c->stash_head + i) % c->stash_cap];
                free(c->stash);
                c->stash = s;
                c->stash_cap = cap;
                c->stash_head = 0;
        }
        for (uint32_t i = 0; i < n; i++)
                c->stash[(c->stash_head + c->stash_n + i) % c->stash_cap] = g[i];
        c->stash_n += n;
        return 0;
}

DS_PUBLIC int ds_server_info(ds_client *c, ds_info *ret)
{
        union ds_wire_slot group[GROUP_MAX];
        uint64_t deadline = now_ms() + INFO_TIMEOUT_MS, id;
        int r;

        if (!c || !ret)
                return -EINVAL;

        pthread_mutex_lock(&c->lock);
        id = c->next_id++;
        r = send_simple(c, DS_WIRE_INFO_REQ, id);
        while (r >= 0) {
                if (c->mode != DS_WIRE_MODE_RING) {
                        r = sock_fill(c);
                        if (r < 0)
                                break;
                }
                int n = read_group(c, false, group);
                if (n < 0) {
                        r = n;
                        break;
                }
                if (n > 0) {
                        consume_group(c, false, (uint32_t) n);
                        if (group[0].hdr.type == DS_WIRE_INFO && group[0].hdr.request_id == id) {
                                const struct ds_wire_info *in = &group[0].info;

                                memset(ret, 0, sizeof(*ret));
                                memcpy(ret->model, c->info.model, sizeof(ret->model));
                                ret->model[sizeof(ret->model) - 1] = 0;
                                ret->context_length = c->info.context_length;
                                ret->vocab_size = c->info.vocab_size;
                                ret->kv_bytes_per_token = c->info.kv_bytes_per_token;
                                ret->kv_block_tokens = c->info.kv_block_tokens;
                                ret->max_requests = c->info.max_requests;
                                ret->max_queue = c->info.max_queue;
                                ret->mode = c->mode;
                                ret->active = in->active;
                                ret->queued = in->queued;
                                ret->clients = in->clients;
                                ret->kv_blocks_total = in->kv_blocks_total;
                                ret->kv_blocks_free = in->kv_blocks_free;
                                break;
                        }
                        if (group[0].hdr.type != DS_WIRE_INFO) {
                                r = stash_group(c, group, (uint32_t) n);
                                if (r < 0)
                                        break;
                        }
                        continue;
                }
                if (wait_ms(deadline, SLICE_MS) == 0) {
                        r = -ETIMEDOUT;
                        break;
                }
                r = wait_input(c, deadline);
        }
        if (r < 0 && r != -ETIMEDOUT && r != -ENOBUFS && r != -ENOMEM)
                fail(c, r);
        /* Events set aside make ds_fd() readable, as they would have without us. */
        if (c->stash_n > 0 && !c->kicked) {
                eventfd_ring(c->kick);
                c->kicked = true;
        }
        pthread_mutex_unlock(&c->lock);
        return r < 0 ? r : 0;
}

/* ---- errors ---- */

DS_PUBLIC const char *ds_strerror(int code)
{
        static const char *const wire[] = {
                [DS_WIRE_ERR_BUSY] = "the daemon's queue is full",
                [DS_WIRE_ERR_PROMPT_TOO_LONG] = "the prompt is too long for the context",
                [DS_WIRE_ERR_BAD_REQUEST] = "the daemon rejected the request",
                [DS_WIRE_ERR_CLIENT_TOO_SLOW] = "events were not read in time",
                [DS_WIRE_ERR_INTERNAL] = "the daemon failed internally",
                [DS_WIRE_ERR_VERSION] = "the daemon speaks another protocol version",
                [DS_WIRE_ERR_DENIED] = "this user may not connect to the daemon",
                [DS_WIRE_ERR_TOO_MANY] = "too many requests in flight",
                [DS_WIRE_ERR_DUPLICATE_ID] = "request id already in flight",
                [DS_WIRE_ERR_SHUTTING_DOWN] = "the daemon is shutting down",
                [DS_WIRE_ERR_UNSUPPORTED] = "not supported by the daemon",
                [DS_WIRE_ERR_DRAINING] = "the daemon is draining",
                [DS_WIRE_ERR_NO_MODEL] = "the daemon has no model loaded",
        };
        int c = code < 0 ? -code : code;

        if (c > DS_ERR_WIRE_BASE && c < DS_ERR_WIRE_BASE + _DS_WIRE_ERR_MAX)
                return wire[c - DS_ERR_WIRE_BASE];
        switch (c) {
        case 0:
                return "success";
        case ECONNRESET:
                return "the daemon closed the connection";
        case EPROTO:
                return "protocol error (not a dsd daemon, or a broken one)";
        case EMSGSIZE:
                return "the request does not fit the transport";
        default:
                /* strerror() is not thread-safe in general; strerrordesc_np() returns a
                 * static string. */
                if (c < DS_ERR_WIRE_BASE) {
                        const char *s = strerrordesc_np(c);
                        if (s)
                                return s;
                }
                return "unknown error";
        }
}

/* ---- test support (libclient/dsclient-debug.h, not installed) ---- */

DS_PUBLIC int ds_debug_segment(ds_client *c, void **ret_addr, size_t *ret_size, int *ret_doorbell)
{
        if (!c || !ret_addr || !ret_size || !ret_doorbell)
                return -EINVAL;
        if (c->mode != DS_WIRE_MODE_RING)
                return -EOPNOTSUPP;
        *ret_addr = c->seg;
        *ret_size = c->seg_size;
        *ret_doorbell = c->doorbell;
        return 0;
}
