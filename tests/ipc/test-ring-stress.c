/* SPDX-License-Identifier: MIT */
/* Two threads, one ring, 10^6 records: the consumer sees every record in order with the
 * content the producer wrote, across many wraps of a small ring, with both sides
 * sleeping on a futex when they must (the Dekker flags must not lose a wake-up: a lost
 * one shows as a hang, which the test's timeout catches). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"
#include "test_util.h"

#define N       16
#define RECORDS 1000000u

static _Alignas(64) uint8_t seg[4096 + N * DS_WIRE_SLOT_SIZE];
static Ring prod, cons;

static void fill(union ds_wire_slot *s, uint64_t i)
{
        memset(s, 0, sizeof(*s));
        s->hdr.type = DS_WIRE_TOKEN;
        s->hdr.request_id = i + 1;
        s->token.token_id = (int32_t) (i * 2654435761u & 0x7fffffff);
        s->token.text_len = s->token.inline_len = (uint16_t) (i % DS_WIRE_TOKEN_INLINE);
        memset(s->token.text, (int) (i % 251), s->token.inline_len);
}

static void *producer(void *arg)
{
        union ds_wire_slot s;

        for (uint64_t i = 0; i < RECORDS; i++) {
                fill(&s, i);
                for (;;) {
                        int r = ring_push(&prod, &s);
                        if (r == 0)
                                break;
                        if (r != -EAGAIN)
                                abort();
                        /* Full: sleep on the head until the consumer frees a slot. */
                        if (ring_producer_prepare_sleep(&prod) == 0)
                                ring_futex_wait(&prod.ctl->head, prod.local - N, NULL);
                        ring_producer_end_sleep(&prod);
                }
                if (ring_consumer_needs_wake(&prod))
                        ring_futex_wake(&prod.ctl->tail);
        }
        return NULL;
}

int main(void)
{
        pthread_t t;
        union ds_wire_slot got, want;

        ring_init(&prod, seg, 0, 256, N);
        ring_init(&cons, seg, 0, 256, N);
        CHECK(pthread_create(&t, NULL, producer, NULL) == 0, "thread");

        for (uint64_t i = 0; i < RECORDS; i++) {
                for (;;) {
                        int r = ring_pop(&cons, &got);
                        uint32_t tail;
                        if (r == 0)
                                break;
                        CHECK(r == -EAGAIN, "pop %d", r);
                        if (ring_consumer_prepare_sleep(&cons, DS_WIRE_WAKE_FUTEX, &tail) == 0)
                                ring_futex_wait(&cons.ctl->tail, tail, NULL);
                        ring_consumer_end_sleep(&cons);
                }
                if (ring_producer_needs_wake(&cons))
                        ring_futex_wake(&cons.ctl->head);
                fill(&want, i);
                CHECK(memcmp(&got, &want, sizeof(got)) == 0, "record %llu differs",
                        (unsigned long long) i);
        }
        pthread_join(t, NULL);
        CHECK(ring_available(&cons) == 0, "nothing left");
        return 0;
}
