/* SPDX-License-Identifier: MIT */
/* One single-producer/single-consumer ring of union ds_wire_slot records in a shared
 * segment (the layout is in wire.h). Each side keeps a Ring view in its own memory; the
 * only shared words are the ring's struct ds_wire_ring_ctl.
 *
 * Cursors are free-running u32 counters, masked on use: empty is tail == head, full is
 * tail - head == n_slots, and anything above n_slots can only be a broken or hostile
 * peer's write (-EBADMSG). A side never re-reads its own cursor from shared memory: it
 * keeps it in Ring.local, so a peer scribbling on it changes nothing.
 *
 * Ordering (each atomic below names its pair):
 *   publish: the producer writes slots, then stores tail with release; the consumer loads
 *            tail with acquire and only then reads the slots.
 *   release: the consumer copies slots out, then stores head with release; the producer
 *            loads head with acquire and only then overwrites those slots.
 *   sleep/wake (Dekker): the sleeper stores its waiting flag, issues a seq_cst fence and
 *            re-reads the cursor it waits on; the waker stores the cursor, issues a
 *            seq_cst fence and reads the flag. With both fences, at least one side sees
 *            the other's store: either the sleeper sees the new cursor and does not
 *            sleep, or the waker sees the flag and wakes it. No wake-up is lost and no
 *            syscall is made while the peer is running.
 *
 * Nothing here validates record contents: callers copy a record out with ring_pop() or
 * ring_peek() and validate the copy (wire_c2d_validate / wire_d2c_validate). */
#pragma once

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "wire.h"

typedef struct Ring {
        struct ds_wire_ring_ctl *ctl; /* shared */
        union ds_wire_slot *slots;    /* shared, [n_slots] */
        uint32_t n_slots;             /* a power of two */
        uint32_t mask;                /* n_slots - 1 */
        uint32_t local;               /* ours: the producer's tail or the consumer's head */
} Ring;

/* Views a ring of a mapped segment whose layout was validated (wire_layout_validate) and
 * whose cursors are still zero: rings are used from the start of a connection only. */
static inline void ring_init(
        Ring *r, void *segment, uint32_t ctl_off, uint32_t slots_off, uint32_t n_slots)
{
        r->ctl = (struct ds_wire_ring_ctl *) ((uint8_t *) segment + ctl_off);
        r->slots = (union ds_wire_slot *) ((uint8_t *) segment + slots_off);
        r->n_slots = n_slots;
        r->mask = n_slots - 1;
        r->local = 0;
}

/* ---- producer ---- */

/* Free slots (0 when full), or -EBADMSG if the consumer's head is impossible. */
static inline int64_t ring_space(const Ring *r)
{
        /* Acquire: pairs with the release of head in ring_pop()/ring_consume(); the
         * consumer's copies of those slots are complete before we overwrite them. */
        uint32_t head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
        uint32_t used = r->local - head;

        if (used > r->n_slots) /* only a broken peer gets here */
                return -EBADMSG;
        return (int64_t) (r->n_slots - used);
}

/* Writes a record i places after the last published one, without publishing it. The
 * caller made sure with ring_space() that i < space. */
static inline void ring_write(Ring *r, uint32_t i, const union ds_wire_slot *rec)
{
        memcpy(&r->slots[(r->local + i) & r->mask], rec, sizeof(*rec));
}

/* Publishes the n records written with ring_write() in one store, so the consumer sees
 * all of them or none (a token and its follow-up records travel this way). */
static inline void ring_publish(Ring *r, uint32_t n)
{
        r->local += n;
        /* Release: pairs with the acquire of tail in ring_available(); the slot writes
         * above become visible no later than the new tail. */
        atomic_store_explicit(&r->ctl->tail, r->local, memory_order_release);
}

/* Pushes one record: 0, -EAGAIN when full, -EBADMSG if the peer broke the ring. */
static inline int ring_push(Ring *r, const union ds_wire_slot *rec)
{
        int64_t space = ring_space(r);

        if (space < 0)
                return (int) space;
        if (space == 0)
                return -EAGAIN;
        ring_write(r, 0, rec);
        ring_publish(r, 1);
        return 0;
}

/* After ring_publish(): how does the consumer sleep (DS_WIRE_WAKE_* bits; 0: it runs and
 * needs no wake-up)? */
static inline uint32_t ring_consumer_needs_wake(const Ring *r)
{
        /* Full fence: pairs with the fence in ring_consumer_prepare_sleep(). Orders our
         * tail store before the flag load (Dekker), which release/acquire alone won't. */
        atomic_thread_fence(memory_order_seq_cst);
        /* Relaxed: ordered by the fence above. */
        return atomic_load_explicit(&r->ctl->consumer_waiting, memory_order_relaxed);
}

/* Before sleeping on free slots: raises producer_waiting and returns the space seen after
 * the fence (sleep only if it is 0), or -EBADMSG. */
static inline int64_t ring_producer_prepare_sleep(Ring *r)
{
        /* Relaxed store, ordered by the fence below. */
        atomic_store_explicit(&r->ctl->producer_waiting, 1, memory_order_relaxed);
        /* Full fence: pairs with the fence in ring_producer_needs_wake(). */
        atomic_thread_fence(memory_order_seq_cst);
        return ring_space(r);
}

static inline void ring_producer_end_sleep(Ring *r)
{
        /* Relaxed: a stale 1 only costs the peer one needless wake-up. */
        atomic_store_explicit(&r->ctl->producer_waiting, 0, memory_order_relaxed);
}

/* ---- consumer ---- */

/* Published records not yet consumed, or -EBADMSG if the producer's tail is impossible. */
static inline int64_t ring_available(const Ring *r)
{
        /* Acquire: pairs with the release of tail in ring_publish(); the slots up to the
         * tail we read are fully written. */
        uint32_t tail = atomic_load_explicit(&r->ctl->tail, memory_order_acquire);
        uint32_t n = tail - r->local;

        if (n > r->n_slots) /* only a broken peer gets here */
                return -EBADMSG;
        return (int64_t) n;
}

/* Copies the record i places after the head without consuming it; the caller checked
 * i < ring_available(). Copy first, validate the copy: the producer may be rewriting the
 * slot (if it is hostile), so nothing is ever read from it twice. */
static inline void ring_peek(const Ring *r, uint32_t i, union ds_wire_slot *ret)
{
        memcpy(ret, &r->slots[(r->local + i) & r->mask], sizeof(*ret));
        /* Compiler barrier: the caller's reads of *ret must come from the copy, not be
         * rematerialized from shared memory. No hardware ordering is needed here. */
        atomic_signal_fence(memory_order_seq_cst);
}

/* Gives n peeked records back to the producer. */
static inline void ring_consume(Ring *r, uint32_t n)
{
        r->local += n;
        /* Release: pairs with the acquire of head in ring_space(); our copies of the
         * slots are complete before the producer may reuse them. */
        atomic_store_explicit(&r->ctl->head, r->local, memory_order_release);
}

/* Pops one record into *ret: 0, -EAGAIN when empty, -EBADMSG if the peer broke the ring. */
static inline int ring_pop(Ring *r, union ds_wire_slot *ret)
{
        int64_t n = ring_available(r);

        if (n < 0)
                return (int) n;
        if (n == 0)
                return -EAGAIN;
        ring_peek(r, 0, ret);
        ring_consume(r, 1);
        return 0;
}

/* After ring_consume(): does the producer sleep on free slots and need a wake-up? */
static inline bool ring_producer_needs_wake(const Ring *r)
{
        /* Full fence: pairs with the fence in ring_producer_prepare_sleep(). */
        atomic_thread_fence(memory_order_seq_cst);
        /* Relaxed: ordered by the fence above. */
        return atomic_load_explicit(&r->ctl->producer_waiting, memory_order_relaxed) != 0;
}

/* Before sleeping on new records: sets consumer_waiting to how = DS_WIRE_WAKE_* bits (the
 * daemon always uses 1) and returns what is available after the fence (sleep only if it
 * is 0), or -EBADMSG. *ret_tail gets the tail value to pass to a futex wait. */
static inline int64_t ring_consumer_prepare_sleep(Ring *r, uint32_t how, uint32_t *ret_tail)
{
        /* Relaxed store, ordered by the fence below. */
        atomic_store_explicit(&r->ctl->consumer_waiting, how, memory_order_relaxed);
        /* Full fence: pairs with the fence in ring_consumer_needs_wake(). */
        atomic_thread_fence(memory_order_seq_cst);
        int64_t n = ring_available(r);
        *ret_tail = r->local + (uint32_t) (n > 0 ? n : 0);
        return n;
}

static inline void ring_consumer_end_sleep(Ring *r)
{
        /* Relaxed: a stale 1 only costs the peer one needless wake-up. */
        atomic_store_explicit(&r->ctl->consumer_waiting, 0, memory_order_relaxed);
}

/* ---- futex on a shared cursor (never FUTEX_PRIVATE_FLAG: two processes map it) ---- */

/* Sleeps while *word == expected, at most timeout (NULL: no limit). 0 on a wake-up or a
 * changed word, -ETIMEDOUT, -EINTR. */
static inline int ring_futex_wait(
        _Atomic uint32_t *word, uint32_t expected, const struct timespec *timeout)
{
        if (syscall(SYS_futex, word, FUTEX_WAIT, expected, timeout, NULL, 0) < 0)
                return errno == EAGAIN ? 0 : -errno;
        return 0;
}

static inline void ring_futex_wake(_Atomic uint32_t *word)
{
        syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
