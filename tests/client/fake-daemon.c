/* SPDX-License-Identifier: MIT */
/* The fake daemon of fake-daemon.h. Simple on purpose: blocking socket I/O, one client
 * at a time, polling the doorbell with a short timeout. It does what the real daemon must
 * do at the wire level: seal the memfd, copy records before validating them, copy the
 * data a submission references before consuming it, and wake the client only when its
 * waiting flag says so. */
#include "fake-daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/memfd.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ring.h"
#include "wire.h"

typedef struct Conn {
        int sock;
        uint32_t mode;
        uint8_t *seg;
        struct ds_wire_layout l;
        int doorbell, notify;
        Ring sub, cpl;
        uint64_t hang_id; /* a "hang" request in flight, or 0 */
} Conn;

static void die(const char *what)
{
        fprintf(stderr, "fake-daemon: %s: %s\n", what, strerror(errno));
        _exit(2);
}

static bool read_all(int fd, void *buf, size_t len)
{
        uint8_t *p = buf;
        while (len > 0) {
                ssize_t n = read(fd, p, len);
                if (n <= 0)
                        return false;
                p += n;
                len -= (size_t) n;
        }
        return true;
}

static bool write_all(int fd, const void *buf, size_t len)
{
        const uint8_t *p = buf;
        while (len > 0) {
                ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
                if (n <= 0)
                        return false;
                p += n;
                len -= (size_t) n;
        }
        return true;
}

static uint64_t now_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

/* Publishes a group of records at once, waiting for space, then wakes the client the way
 * its flag asks. */
static bool emit(Conn *c, const union ds_wire_slot *g, uint32_t n)
{
        if (c->mode == DS_WIRE_MODE_SOCKET) {
                for (uint32_t i = 0; i < n; i++) {
                        uint32_t len = DS_WIRE_SLOT_SIZE;
                        if (!write_all(c->sock, &len, 4) || !write_all(c->sock, &g[i], len))
                                return false;
                }
                return true;
        }
        for (;;) {
                int64_t space = ring_space(&c->cpl);
                if (space < 0)
                        return false;
                if (space >= n)
                        break;
                usleep(200);
        }
        for (uint32_t i = 0; i < n; i++)
                ring_write(&c->cpl, i, &g[i]);
        ring_publish(&c->cpl, n);
        uint32_t how = ring_consumer_needs_wake(&c->cpl);
        if (how & DS_WIRE_WAKE_FUTEX)
                ring_futex_wake(&c->cpl.ctl->tail);
        if (how & DS_WIRE_WAKE_FD) {
                uint64_t one = 1;
                (void) !write(c->notify, &one, 8);
        }
        return true;
}

static bool emit_final(Conn *c, uint64_t id, uint32_t finish, uint32_t prompt, uint32_t gen)
{
        union ds_wire_slot s = {};
        s.hdr.type = DS_WIRE_FINAL;
        s.hdr.request_id = id;
        s.final.finish = finish;
        s.final.prompt_tokens = prompt;
        s.final.generated_tokens = gen;
        s.final.queue_us = 1;
        s.final.ttft_us = 2;
        s.final.total_us = 3;
        s.final.publish_ns = now_ns();
        return emit(c, &s, 1);
}

static bool handle(Conn *c, const union ds_wire_slot *rec, const uint8_t *data)
{
        const struct ds_wire_submit *sub = &rec->submit;
        union ds_wire_slot g[8];

        if (rec->hdr.type == DS_WIRE_INFO_REQ) {
                memset(g, 0, sizeof(g[0]));
                g[0].hdr.type = DS_WIRE_INFO;
                g[0].hdr.request_id = rec->hdr.request_id;
                g[0].info = (struct ds_wire_info){.hdr = g[0].hdr,
                        .active = 1,
                        .queued = 2,
                        .clients = 3,
                        .kv_blocks_total = 100,
                        .kv_blocks_free = 40};
                return emit(c, g, 1);
        }
        if (rec->hdr.type == DS_WIRE_CANCEL) {
                if (rec->hdr.request_id != c->hang_id)
                        return true;
                c->hang_id = 0;
                return emit_final(c, rec->hdr.request_id, DS_WIRE_FINISH_CANCELLED, 4, 0);
        }

        const uint8_t *p = data + sub->prompt.off;
        uint32_t len = sub->prompt.len;
        if (sub->hdr.flags != DS_WIRE_SUBMIT_TEXT)
                return emit_final(c, sub->hdr.request_id, DS_WIRE_FINISH_LENGTH, len, 0);
        if (len == 4 && !memcmp(p, "hang", 4)) {
                c->hang_id = sub->hdr.request_id;
                return true;
        }
        if (len == 4 && !memcmp(p, "busy", 4)) {
                memset(g, 0, sizeof(g[0]));
                g[0].hdr.type = DS_WIRE_ERROR;
                g[0].hdr.request_id = sub->hdr.request_id;
                g[0].error.code = DS_WIRE_ERR_BUSY;
                g[0].error.len = (uint32_t) strlen("queue full: 8 of 8 waiting");
                memcpy(g[0].error.message, "queue full: 8 of 8 waiting", g[0].error.len);
                return emit(c, g, 1);
        }
        for (uint32_t i = 0; i < len; i++) {
                memset(g, 0, sizeof(g[0]));
                g[0].hdr.type = DS_WIRE_TOKEN;
                g[0].hdr.request_id = sub->hdr.request_id;
                g[0].token.token_id = p[i];
                g[0].token.publish_ns = now_ns();
                g[0].token.text_len = g[0].token.inline_len = 1;
                g[0].token.text[0] = (char) p[i];
                if (!emit(c, g, 1))
                        return false;
        }
        uint32_t gen = len;
        if (len >= 4 && !memcmp(p, "long", 4)) {
                /* 1000 bytes: 216 inline + 232 + 232 + 232 + 88. */
                uint32_t n = 1, left = 1000 - DS_WIRE_TOKEN_INLINE;
                memset(g, 0, sizeof(g));
                g[0].hdr.type = DS_WIRE_TOKEN;
                g[0].hdr.request_id = sub->hdr.request_id;
                g[0].token.token_id = 7;
                g[0].token.logprob = -0.25f;
                g[0].token.text_len = 1000;
                g[0].token.inline_len = DS_WIRE_TOKEN_INLINE;
                memset(g[0].token.text, 'x', DS_WIRE_TOKEN_INLINE);
                for (; left > 0; n++) {
                        uint32_t k = left < DS_WIRE_TEXT_INLINE ? left : DS_WIRE_TEXT_INLINE;
                        g[n].hdr.type = DS_WIRE_TEXT;
                        g[n].hdr.request_id = sub->hdr.request_id;
                        g[n].text.len = k;
                        memset(g[n].text.text, 'x', k);
                        left -= k;
                }
                if (sub->top_logprobs) {
                        g[n].hdr.type = DS_WIRE_LOGPROBS;
                        g[n].hdr.request_id = sub->hdr.request_id;
                        g[n].logprobs.n = sub->top_logprobs;
                        for (uint32_t k = 0; k < sub->top_logprobs; k++)
                                g[n].logprobs.top[k] =
                                        (struct ds_wire_top){(int32_t) k, -(float) k};
                        n++;
                }
                g[0].hdr.n_follow = n - 1;
                if (!emit(c, g, n))
                        return false;
                gen++;
        }
        return emit_final(c, sub->hdr.request_id, DS_WIRE_FINISH_LENGTH, len, gen);
}

static bool serve_ring(Conn *c)
{
        static uint8_t data[DS_WIRE_DEFAULT_DATA];

        for (;;) {
                struct pollfd p[2] = {
                        {.fd = c->doorbell, .events = POLLIN}, {.fd = c->sock, .events = POLLIN}};
                uint32_t tail;

                /* Sleep only when the ring is empty after raising our flag. */
                int64_t n = ring_consumer_prepare_sleep(&c->sub, DS_WIRE_WAKE_FD, &tail);
                if (n < 0)
                        return false;
                if (n == 0 && poll(p, 2, 50) < 0)
                        return false;
                ring_consumer_end_sleep(&c->sub);
                if (p[1].revents)
                        return true; /* the client hung up */
                if (p[0].revents) {
                        uint64_t v;
                        (void) !read(c->doorbell, &v, 8);
                }
                n = ring_available(&c->sub);
                if (n < 0)
                        return false;
                for (int64_t i = 0; i < n; i++) {
                        union ds_wire_slot rec;
                        ring_peek(&c->sub, 0, &rec);
                        if (wire_c2d_validate(&rec, c->l.data_size) < 0)
                                return false;
                        if (rec.hdr.type == DS_WIRE_SUBMIT) {
                                const struct ds_wire_submit *s = &rec.submit;
                                memcpy(data + s->prompt.off, c->seg + c->l.data + s->prompt.off,
                                        s->prompt.len);
                                memcpy(data + s->stop.off, c->seg + c->l.data + s->stop.off,
                                        s->stop.len);
                                if (wire_stops_validate(
                                            data + s->stop.off, s->stop.len, s->n_stop) < 0)
                                        return false;
                        }
                        ring_consume(&c->sub, 1);
                        if (ring_producer_needs_wake(&c->sub))
                                ring_futex_wake(&c->sub.ctl->head);
                        if (!handle(c, &rec, data))
                                return false;
                }
        }
}

static bool serve_socket(Conn *c)
{
        static uint8_t frame[DS_WIRE_SLOT_SIZE + (1u << 20)];

        for (;;) {
                uint32_t len;
                union ds_wire_slot rec;

                if (!read_all(c->sock, &len, 4))
                        return true;
                if (wire_frame_len_validate(len, true) < 0 || len > sizeof(frame) ||
                        !read_all(c->sock, frame, len))
                        return false;
                memcpy(&rec, frame, sizeof(rec));
                if (wire_c2d_validate(&rec, len - DS_WIRE_SLOT_SIZE) < 0)
                        return false;
                if (!handle(c, &rec, frame + DS_WIRE_SLOT_SIZE))
                        return false;
        }
}

static void send_welcome(int sock, const struct ds_wire_welcome *w, const int *fds, int n_fds)
{
        uint8_t buf[4 + sizeof(*w)];
        union {
                struct cmsghdr align;
                uint8_t b[CMSG_SPACE(3 * sizeof(int))];
        } cbuf = {};
        uint32_t len = sizeof(*w);
        struct iovec iov = {buf, sizeof(buf)};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};

        memcpy(buf, &len, 4);
        memcpy(buf + 4, w, sizeof(*w));
        if (n_fds > 0) {
                msg.msg_control = cbuf.b;
                msg.msg_controllen = CMSG_SPACE((size_t) n_fds * sizeof(int));
                struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
                cm->cmsg_level = SOL_SOCKET;
                cm->cmsg_type = SCM_RIGHTS;
                cm->cmsg_len = CMSG_LEN((size_t) n_fds * sizeof(int));
                memcpy(CMSG_DATA(cm), fds, (size_t) n_fds * sizeof(int));
        }
        if (sendmsg(sock, &msg, MSG_NOSIGNAL) != (ssize_t) sizeof(buf))
                die("sendmsg");
}

static void serve_one(int sock, int behaviour)
{
        struct ds_wire_hello h;
        struct ds_wire_welcome w = {.magic = DS_WIRE_MAGIC, .version = DS_WIRE_VERSION};
        Conn c = {.sock = sock, .doorbell = -1, .notify = -1};
        uint32_t len;

        if (!read_all(sock, &len, 4) || len != sizeof(h) || !read_all(sock, &h, sizeof(h)))
                return;
        if (behaviour == FAKE_REFUSE_VERSION) {
                w.version = 99;
                w.status = DS_WIRE_ERR_VERSION;
                snprintf(w.message, sizeof(w.message),
                        "this daemon speaks protocol version 99, the client %u", h.version);
                send_welcome(sock, &w, NULL, 0);
                return;
        }
        if (wire_hello_validate(&h) < 0)
                return;
        w.mode = h.mode;
        c.mode = h.mode;
        snprintf(w.info.model, sizeof(w.info.model), "fake-model");
        w.info.context_length = 512;
        w.info.vocab_size = 256;
        w.info.kv_bytes_per_token = 640;
        w.info.kv_block_tokens = 16;
        w.info.max_requests = 64;
        w.info.max_queue = 8;

        if (h.mode == DS_WIRE_MODE_SOCKET) {
                send_welcome(sock, &w, NULL, 0);
                serve_socket(&c);
                return;
        }

        if (wire_layout_init(DS_WIRE_DEFAULT_SUB_SLOTS, 64, DS_WIRE_DEFAULT_DATA, &c.l) < 0)
                die("layout");
        int memfd = memfd_create("dsd-client", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (memfd < 0 || ftruncate(memfd, (off_t) c.l.segment_size) < 0 ||
                fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
                die("memfd");
        c.seg = mmap(NULL, c.l.segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
        if (c.seg == MAP_FAILED)
                die("mmap");
        struct ds_wire_seg_header *sh = (struct ds_wire_seg_header *) c.seg;
        sh->magic = DS_WIRE_SEG_MAGIC;
        sh->version = DS_WIRE_VERSION;
        sh->slot_size = DS_WIRE_SLOT_SIZE;
        sh->layout = c.l;
        ring_init(&c.sub, c.seg, c.l.sub_ctl, c.l.sub_slots, c.l.sub_n);
        ring_init(&c.cpl, c.seg, c.l.cpl_ctl, c.l.cpl_slots, c.l.cpl_n);
        c.doorbell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        c.notify = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (c.doorbell < 0 || c.notify < 0)
                die("eventfd");
        w.n_fds = DS_WIRE_RING_FDS;
        w.layout = c.l;
        int fds[3] = {memfd, c.doorbell, c.notify};
        send_welcome(sock, &w, fds, 3);
        close(memfd);
        serve_ring(&c);
        munmap(c.seg, c.l.segment_size);
        close(c.doorbell);
        close(c.notify);
}

pid_t fake_daemon_start(const char *path, int behaviour)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

        unlink(path);
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        if (fd < 0 || bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 || listen(fd, 16) < 0)
                die("listen");

        pid_t pid = fork();
        if (pid < 0)
                die("fork");
        if (pid > 0) {
                close(fd);
                return pid;
        }
        for (;;) {
                int s = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
                if (s < 0)
                        die("accept");
                serve_one(s, behaviour);
                close(s);
        }
}
