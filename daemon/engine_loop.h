/* SPDX-License-Identifier: MIT */
/* The engine thread: it owns the Engine and the scheduler and runs sched_step() while
 * there is work. The I/O thread talks to it through two bounded queues:
 *
 *   I/O thread ── engine_loop_submit/cancel/pause ──► inbox ──► engine thread
 *   I/O thread ◄── engine_loop_take_events ◄── outbox ◄── engine thread ── eventfd write
 *
 * Every call below except engine_loop_start/stop/free may be made from the I/O thread
 * while the engine runs, and none of them blocks on the engine's compute: they take one
 * mutex held only for short copies. The engine thread never blocks on a client; the only
 * thing it ever waits for, besides work, is room in the outbox, which the I/O thread frees
 * whenever it drains it (per-client bounds are the I/O thread's job). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "error.h"
#include "scheduler.h"

typedef struct EngineLoopStats {
        uint32_t active; /* admitted requests: running, prefilling or preempted */
        uint32_t queued; /* requests waiting for admission (inbox included) */
        uint32_t paused_clients;
        uint32_t kv_blocks_total;
        uint32_t kv_blocks_free;
        double tokens_per_s;    /* generated tokens per second over the last second or so */
        uint64_t submitted;     /* requests accepted by engine_loop_submit() */
        uint64_t rejected_busy; /* submits answered -EBUSY */
        uint64_t steps;
        uint64_t prompt_tokens; /* prefill tokens computed, recomputation included */
        uint64_t generated_tokens;
        uint64_t preemptions;
        uint64_t finished; /* FINAL events, cancelled included */
        uint64_t cancelled;
        uint64_t failed;         /* ERROR events */
        uint64_t events_dropped; /* events lost because the loop was stopped with a full
                                  * outbox; 0 in normal operation */
} EngineLoopStats;

typedef struct EngineLoop EngineLoop;

/* Starts the engine thread serving e (which it uses alone until engine_loop_free(); e
 * must outlive the loop). lim is copied after sched_limits_check() fills its defaults.
 * notify_fd is an eventfd the I/O thread polls: the engine thread adds 1 to it after
 * pushing events; it is not closed here. 0, or a negative code with a message. */
int engine_loop_start(
        Engine *e, const SchedLimits *lim, int notify_fd, EngineLoop **ret, DsError *err);

/* Pings from the engine thread itself, at most interval_usec apart, also while idle: a
 * step that hangs stops them, which is what systemd's watchdog (WatchdogSec=) detects.
 * ping NULL turns it off. Test-only fault injection: with DSD_TEST_STALL_ENGINE_SEC=S in
 * the environment, the engine thread stops working and pinging S seconds after this call,
 * until the loop is stopped (tests/service/test-notify.py). */
typedef void (*EngineLoopPing)(void);
void engine_loop_set_watchdog(EngineLoop *l, uint64_t interval_usec, EngineLoopPing ping);

/* Hands a request to the engine; never blocks. On success takes ownership of *req and
 * sets it to NULL. Otherwise leaves *req with the caller and returns, with a message in
 * err (naming the limits):
 *   -EBUSY                when max_queued requests are already waiting;
 *   -DS_ERR_CONTEXT_FULL  when the prompt plus one generated token pass the context limit;
 *   -EINVAL               when a field is out of range (sched_request_check());
 *   -ESHUTDOWN            after engine_loop_stop() began. */
int engine_loop_submit(EngineLoop *l, SchedRequest **req, DsError *err);

/* Cancel one request, or every request of a client (it disconnected or died): the next
 * step frees their KV blocks and emits a FINAL with finish cancelled for each. Requests
 * that finished meanwhile are not affected. 0, or -ENOMEM. */
int engine_loop_cancel(EngineLoop *l, uint64_t request_id);
int engine_loop_cancel_client(EngineLoop *l, uint32_t client);
/* A slow reader: stop scheduling the client's sequences (they keep their KV blocks, its
 * queued requests wait) until resumed. 0, or -ENOMEM. */
int engine_loop_pause_client(EngineLoop *l, uint32_t client);
int engine_loop_resume_client(EngineLoop *l, uint32_t client);

/* Moves up to max events, oldest first, from the outbox into ret; returns how many.
 * Drain it until it returns less than max after each eventfd wakeup: the eventfd counts
 * pushes, not events left. */
size_t engine_loop_take_events(EngineLoop *l, SchedEvent *ret, size_t max);

void engine_loop_stats(EngineLoop *l, EngineLoopStats *ret);

/* Stops the engine thread and joins it. drain: finish every submitted request first;
 * otherwise cancel them all (cancelled FINALs). Events stay in the outbox for
 * engine_loop_take_events(). Submits fail with -ESHUTDOWN from now on. Idempotent.
 * Requests still running keep the outbox's bound while they drain, so a caller that takes
 * the events itself drains only a loop whose requests have all finished. */
void engine_loop_stop(EngineLoop *l, bool drain);

/* Stops without drain if still running, then frees everything, pending events included.
 * Accepts NULL. */
EngineLoop *engine_loop_free(EngineLoop *l);
DEFINE_TRIVIAL_CLEANUP_FUNC(EngineLoop *, engine_loop_free);
