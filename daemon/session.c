/* SPDX-License-Identifier: MIT */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>

#include "session.h"

#define SESSION_IN_INITIAL   4096u
#define SESSION_PEND_INITIAL 64u
/* Frames one socket-mode write carries at most. */
#define SESSION_OUT_FRAMES 64u
#define SESSION_FRAME      (DS_WIRE_FRAME_HDR + DS_WIRE_SLOT_SIZE)

int session_new(int fd, uint32_t key, const SessionLimits *lim, Session **ret)
{
        Session *s = calloc(1, sizeof(*s));

        if (!s) {
                close(fd);
                return -ENOMEM;
        }
        s->n_ref = 1;
        s->state = SESSION_HELLO;
        s->key = key;
        s->fd = fd;
        s->doorbell_fd = -EBADF;
        s->notify_fd = -EBADF;
        s->lim = *lim;
        s->in_cap = SESSION_IN_INITIAL;
        s->in_max = DS_WIRE_FRAME_HDR + sizeof(struct ds_wire_hello);
        s->in = malloc(s->in_cap);
        if (!s->in) {
                session_unref(s);
                return -ENOMEM;
        }
        s->op_read = (IoOp){.kind = IO_READ, .session = s};
        s->op_write = (IoOp){.kind = IO_WRITE, .session = s};
        s->op_doorbell = (IoOp){.kind = IO_DOORBELL, .session = s};
        *ret = s;
        return 0;
}

Session *session_ref(Session *s)
{
        s->n_ref++;
        return s;
}

Session *session_unref(Session *s)
{
        if (!s || --s->n_ref > 0)
                return NULL;
        if (s->seg)
                munmap(s->seg, s->seg_size);
        if (s->fd >= 0)
                close(s->fd);
        if (s->doorbell_fd >= 0)
                close(s->doorbell_fd);
        if (s->notify_fd >= 0)
                close(s->notify_fd);
        free(s->in);
        free(s->out);
        free(s->pend);
        free(s);
        return NULL;
}

int session_setup_ring(Session *s, const struct ds_wire_layout *l, int *ret_memfd)
{
        _cleanup_close_ int memfd = -EBADF, efd = -EBADF, nfd = -EBADF;
        void *seg;

        memfd = memfd_create("dsd-client", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (memfd < 0)
                return -errno;
        if (ftruncate(memfd, (off_t) l->segment_size) < 0)
                return -errno;
        /* Sealed before the client sees it: it can never shrink the segment under our
         * mapping (a SIGBUS in the daemon) nor grow it, nor lift the seals. */
        if (fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
                return -errno;
        efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (efd < 0)
                return -errno;
        nfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (nfd < 0)
                return -errno;
        seg = mmap(NULL, l->segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
        if (seg == MAP_FAILED)
                return -errno;

        /* A fresh memfd reads as zeros: cursors and flags start at 0. */
        struct ds_wire_seg_header *h = seg;
        h->magic = DS_WIRE_SEG_MAGIC;
        h->version = DS_WIRE_VERSION;
        h->slot_size = DS_WIRE_SLOT_SIZE;
        h->layout = *l;

        s->seg = seg;
        s->seg_size = l->segment_size;
        s->layout = *l;
        ring_init(&s->sub, seg, l->sub_ctl, l->sub_slots, l->sub_n);
        ring_init(&s->cpl, seg, l->cpl_ctl, l->cpl_slots, l->cpl_n);
        s->doorbell_fd = TAKE_FD(efd);
        s->notify_fd = TAKE_FD(nfd);
        *ret_memfd = TAKE_FD(memfd);
        return 0;
}

/* The hard bound: twice the pause mark, so that events already in the engine's outbox
 * when the pause takes effect still fit, plus one error record per request. */
static uint32_t pend_bound(const Session *s)
{
        return 2 * s->lim.max_pending + s->lim.max_requests + 1;
}

static int pend_grow(Session *s, uint32_t need)
{
        uint32_t cap = s->pend_cap ? s->pend_cap : SESSION_PEND_INITIAL;
        union ds_wire_slot *p;

        while (cap < need)
                cap *= 2;
        if (cap == s->pend_cap)
                return 0;
        p = malloc((size_t) cap * sizeof(*p));
        if (!p)
                return -ENOMEM;
        /* Unwrap into the new array: index i of the queue goes to slot i. */
        for (uint32_t i = 0, n = session_pending(s); i < n; i++)
                p[i] = s->pend[(s->pend_head + i) & (s->pend_cap - 1)];
        s->pend_tail = session_pending(s);
        s->pend_head = 0;
        free(s->pend);
        s->pend = p;
        s->pend_cap = cap;
        return 0;
}

int session_queue(Session *s, const union ds_wire_slot *recs, uint32_t n)
{
        uint32_t used = session_pending(s);
        int r;

        if (used + n > pend_bound(s))
                return -ENOBUFS;
        if (used + n > s->pend_cap) {
                r = pend_grow(s, used + n);
                if (r < 0)
                        return r;
        }
        for (uint32_t i = 0; i < n; i++)
                s->pend[(s->pend_tail + i) & (s->pend_cap - 1)] = recs[i];
        s->pend_tail += n;
        return 0;
}

static const union ds_wire_slot *pend_at(const Session *s, uint32_t i)
{
        return &s->pend[(s->pend_head + i) & (s->pend_cap - 1)];
}

int session_flush_ring(Session *s)
{
        uint32_t n = session_pending(s), moved = 0;
        int64_t space;

        if (n == 0)
                return 0;
        space = ring_space(&s->cpl);
        if (space < 0)
                return (int) space;
        /* Whole groups: a token and its n_follow records are published by one store. */
        while (moved < n) {
                uint32_t group = 1 + pend_at(s, moved)->hdr.n_follow;
                if (moved + group > space)
                        break;
                for (uint32_t i = 0; i < group; i++)
                        ring_write(&s->cpl, moved + i, pend_at(s, moved + i));
                moved += group;
        }
        if (moved == 0)
                return 0;
        ring_publish(&s->cpl, moved);
        s->pend_head += moved;
        /* The client sleeps on the completion tail with FUTEX_WAIT, or polls the notify
         * eventfd; its flag says which (ring.h has the fence). A hostile value only costs
         * that client a wake-up it did not need. */
        uint32_t how = ring_consumer_needs_wake(&s->cpl);
        if (how & ~(uint32_t) DS_WIRE_WAKE_FD)
                ring_futex_wake(&s->cpl.ctl->tail);
        if (how & ~(uint32_t) DS_WIRE_WAKE_FUTEX) {
                uint64_t one = 1;
                /* Non-blocking: a counter at its maximum is already readable. */
                (void) !write(s->notify_fd, &one, sizeof(one));
        }
        return (int) moved;
}

size_t session_flush_socket(Session *s)
{
        size_t added = 0;

        if (!s->out) {
                s->out_cap = SESSION_OUT_FRAMES * SESSION_FRAME;
                s->out = malloc(s->out_cap);
                if (!s->out)
                        return 0; /* tried again at the next flush */
        }
        if (s->out_off == s->out_len)
                s->out_off = s->out_len = 0;
        while (session_pending(s) > 0 && s->out_cap - s->out_len >= SESSION_FRAME) {
                uint32_t len = DS_WIRE_SLOT_SIZE;
                memcpy(s->out + s->out_len, &len, sizeof(len));
                memcpy(s->out + s->out_len + DS_WIRE_FRAME_HDR, pend_at(s, 0), DS_WIRE_SLOT_SIZE);
                s->out_len += SESSION_FRAME;
                s->pend_head++;
                added += SESSION_FRAME;
        }
        return added;
}

int request_new(Session *s, uint64_t client_id, uint64_t id, Request **ret)
{
        Request *r = calloc(1, sizeof(*r));

        if (!r)
                return -ENOMEM;
        r->session = session_ref(s);
        r->client_id = client_id;
        r->id = id;
        r->next = s->requests;
        if (s->requests)
                s->requests->prev = r;
        s->requests = r;
        s->n_requests++;
        *ret = r;
        return 0;
}

Request *request_find(Session *s, uint64_t client_id)
{
        for (Request *r = s->requests; r; r = r->next)
                if (!r->answered && r->client_id == client_id)
                        return r;
        return NULL;
}

void request_free(Request *r)
{
        Session *s = r->session;

        if (r->prev)
                r->prev->next = r->next;
        else
                s->requests = r->next;
        if (r->next)
                r->next->prev = r->prev;
        if (!r->answered)
                s->n_requests--;
        free(r);
        session_unref(s);
}
