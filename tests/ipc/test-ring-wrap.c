/* SPDX-License-Identifier: MIT */
/* The ring's cursor arithmetic across the 2^32 wrap of the free-running cursors, full and
 * empty detection, and a peer's impossible cursor. */
#include <stdlib.h>
#include <string.h>

#include "ring.h"
#include "test_util.h"

#define N 8

static _Alignas(64) uint8_t seg[4096 + N * DS_WIRE_SLOT_SIZE];

static void set_cursors(Ring *prod, Ring *cons, uint32_t v)
{
        prod->local = cons->local = v;
        atomic_store(&prod->ctl->head, v);
        atomic_store(&prod->ctl->tail, v);
}

static union ds_wire_slot rec(uint64_t id)
{
        union ds_wire_slot s;
        memset(&s, 0, sizeof(s));
        s.hdr.type = DS_WIRE_CANCEL;
        s.hdr.request_id = id;
        memset(s.bytes + 16, (int) (id & 0xff), sizeof(s) - 16);
        return s;
}

int main(void)
{
        Ring prod, cons;
        union ds_wire_slot s, got;

        ring_init(&prod, seg, 0, 256, N);
        ring_init(&cons, seg, 0, 256, N);

        /* Start just below the wrap, push and pop 3 * N records one at a time, and in
         * bursts that fill the ring completely. */
        uint32_t starts[] = {0, UINT32_MAX - 2, UINT32_MAX - N, UINT32_MAX, 0x80000000u - 1};
        for (size_t k = 0; k < sizeof(starts) / sizeof(starts[0]); k++) {
                uint64_t next_push = 1, next_pop = 1;

                set_cursors(&prod, &cons, starts[k]);
                CHECK(ring_pop(&cons, &got) == -EAGAIN, "empty at %u", starts[k]);
                CHECK(ring_space(&prod) == N, "all free");
                for (int round = 0; round < 3; round++) {
                        for (int i = 0; i < N; i++) {
                                s = rec(next_push++);
                                CHECK(ring_push(&prod, &s) == 0, "push");
                        }
                        s = rec(999);
                        CHECK(ring_push(&prod, &s) == -EAGAIN, "full at %u", prod.local);
                        CHECK(ring_space(&prod) == 0, "no space");
                        CHECK(ring_available(&cons) == N, "all available");
                        for (int i = 0; i < N; i++) {
                                CHECK(ring_pop(&cons, &got) == 0, "pop");
                                s = rec(next_pop++);
                                CHECK(memcmp(&got, &s, sizeof(s)) == 0, "content %d", i);
                        }
                        CHECK(ring_pop(&cons, &got) == -EAGAIN, "empty again");
                }
                CHECK(prod.local == starts[k] + 3 * N, "wrapped tail");
        }

        /* Batch publish: records written are invisible until published, then all are. */
        set_cursors(&prod, &cons, UINT32_MAX - 1);
        for (uint32_t i = 0; i < 3; i++) {
                s = rec(100 + i);
                ring_write(&prod, i, &s);
        }
        CHECK(ring_available(&cons) == 0, "unpublished");
        ring_publish(&prod, 3);
        CHECK(ring_available(&cons) == 3, "published together");
        ring_peek(&cons, 2, &got);
        CHECK(got.hdr.request_id == 102, "peek");
        ring_consume(&cons, 3);
        CHECK(ring_space(&prod) == N, "consumed");

        /* A hostile peer: a tail more than N ahead, a head behind the tail by more than N
         * or ahead of it. */
        set_cursors(&prod, &cons, 5);
        atomic_store(&cons.ctl->tail, 5 + N + 1);
        CHECK(ring_available(&cons) == -EBADMSG, "tail too far");
        CHECK(ring_pop(&cons, &got) == -EBADMSG, "pop refuses");
        atomic_store(&cons.ctl->tail, 4);
        CHECK(ring_available(&cons) == -EBADMSG, "tail behind head");
        atomic_store(&prod.ctl->head, 6);
        CHECK(ring_space(&prod) == -EBADMSG, "head beyond tail");
        atomic_store(&prod.ctl->head, 5 - N - 1);
        s = rec(1);
        CHECK(ring_push(&prod, &s) == -EBADMSG, "push refuses");

        /* Sleep flags: preparing to sleep reports records already there. */
        set_cursors(&prod, &cons, 0);
        uint32_t tail;
        CHECK(ring_consumer_prepare_sleep(&cons, DS_WIRE_WAKE_FUTEX, &tail) == 0 && tail == 0,
                "nothing to read");
        s = rec(7);
        CHECK(ring_push(&prod, &s) == 0, "push");
        CHECK(ring_consumer_needs_wake(&prod) == DS_WIRE_WAKE_FUTEX, "wake wanted");
        ring_consumer_end_sleep(&cons);
        CHECK(ring_consumer_needs_wake(&prod) == 0, "no wake");
        CHECK(ring_consumer_prepare_sleep(&cons, DS_WIRE_WAKE_FD, &tail) == 1 && tail == 1,
                "a record is there");
        return 0;
}
