/* SPDX-License-Identifier: MIT */
/* The engine thread and its two queues. One mutex guards the inbox (requests and
 * commands), the outbox ring and the published stats; it is held only for copies, never
 * across a step. A round of the thread: wait for room in the outbox, take the inbox, apply
 * it to the scheduler, run one step, publish the stats, wake the I/O thread. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_loop.h"
#include "log.h"

/* tokens_per_s is measured over windows this long... */
#define RATE_WINDOW_USEC 1000000u
/* ...and reads 0 once no window closed for this long (the engine sat idle). */
#define RATE_STALE_USEC 5000000u

typedef enum CmdType {
        CMD_CANCEL,
        CMD_CANCEL_CLIENT,
        CMD_PAUSE_CLIENT,
        CMD_RESUME_CLIENT,
} CmdType;

typedef struct Cmd {
        CmdType type;
        uint32_t client;
        uint64_t request_id;
} Cmd;

struct EngineLoop {
        Engine *e;
        Sched *s; /* the engine thread's alone once started */
        SchedLimits lim;
        int notify_fd;       /* the I/O thread's eventfd, not ours; -1 for none */
        uint32_t max_events; /* room one round needs in the outbox */
        pthread_t thread;
        bool running; /* thread started and not joined yet */

        pthread_mutex_t lock; /* guards everything down to the engine thread's part */
        pthread_cond_t wake;  /* the engine thread waits here: input, outbox room, stop */
        SchedRequest **inbox; /* (max_queued) submitted, not taken by the engine thread */
        uint32_t n_inbox;
        uint32_t n_queued; /* inbox plus the scheduler's queued: what -EBUSY bounds */
        Cmd *cmds;         /* (cap_cmds) in submission order; grows in the I/O thread */
        uint32_t n_cmds, cap_cmds;
        SchedEvent *out; /* (out_cap) ring, out_head .. out_tail-1 pending */
        uint32_t out_cap;
        uint64_t out_head, out_tail;
        uint64_t round_end[2]; /* out_tail after the round before last and after the last */
        bool stopping, drain;
        uint64_t watchdog_usec; /* ping interval, 0 for none */
        EngineLoopPing watchdog_fn;
        uint64_t watchdog_last_usec; /* the engine thread's */
        uint64_t stall_at_usec;      /* test-only fault injection, 0 for none */
        EngineLoopStats stats;
        uint64_t rate_start_usec, rate_start_tokens;

        /* The engine thread's part, touched without the lock. */
        SchedRequest **taken; /* (max_queued) */
        Cmd *taken_cmds;      /* (cap_taken_cmds) */
        uint32_t cap_taken_cmds;
        uint32_t pushed; /* events pushed this round, to decide the eventfd write */
        DsError err;
};

static uint64_t now_nsec(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

static uint32_t out_room(const EngineLoop *l)
{
        return l->out_cap - (uint32_t) (l->out_tail - l->out_head);
}

/* SchedEmit: runs on the engine thread inside sched_*(). The round began with room for
 * max_events, which bounds what one round emits; only a stop without drain can find the
 * ring full (the I/O thread stopped draining), and then the event is dropped. */
static void loop_emit(void *userdata, const SchedEvent *ev)
{
        EngineLoop *l = userdata;

        pthread_mutex_lock(&l->lock);
        if (out_room(l) == 0)
                l->stats.events_dropped++;
        else {
                SchedEvent *slot = &l->out[l->out_tail % l->out_cap];
                /* Copy the header and only the text bytes in use. */
                memcpy(slot, ev, offsetof(SchedEvent, text));
                memcpy(slot->text, ev->text, ev->text_len);
                memcpy(&slot->sampled, &ev->sampled,
                        sizeof(SchedEvent) - offsetof(SchedEvent, sampled));
                slot->publish_ns = now_nsec();
                l->out_tail++;
                l->pushed++;
        }
        pthread_mutex_unlock(&l->lock);
}

static void loop_notify(EngineLoop *l)
{
        uint64_t one = 1;

        if (l->notify_fd < 0)
                return;
        /* An eventfd write fails only when the counter would overflow, i.e. when the I/O
         * thread has not read it for 2^64 wakeups: it is awake then, nothing is lost. */
        (void) !write(l->notify_fd, &one, sizeof(one));
}

/* Under the lock: the published counters, from the scheduler's. */
static void loop_publish_stats(EngineLoop *l)
{
        SchedStats ss;
        uint64_t now = now_usec();

        sched_stats(l->s, &ss);
        l->n_queued = l->n_inbox + ss.queued;
        l->stats.active = ss.running + ss.preempted;
        l->stats.queued = l->n_queued;
        l->stats.paused_clients = ss.paused_clients;
        l->stats.kv_blocks_total = ss.kv_blocks_total;
        l->stats.kv_blocks_free = ss.kv_blocks_free;
        l->stats.steps = ss.steps;
        l->stats.prompt_tokens = ss.prompt_tokens;
        l->stats.generated_tokens = ss.generated_tokens;
        l->stats.preemptions = ss.preemptions;
        l->stats.finished = ss.finished;
        l->stats.cancelled = ss.cancelled;
        l->stats.failed = ss.failed;
        if (now - l->rate_start_usec >= RATE_WINDOW_USEC) {
                l->stats.tokens_per_s = (double) (ss.generated_tokens - l->rate_start_tokens) *
                                        1e6 / (double) (now - l->rate_start_usec);
                l->rate_start_usec = now;
                l->rate_start_tokens = ss.generated_tokens;
        }
}

/* sched_set_flush: the events of the step just collected go to the I/O thread before
 * the next step runs, which may take a prefill's milliseconds inside the backend. */
static void loop_flush(void *userdata)
{
        EngineLoop *l = userdata;

        pthread_mutex_lock(&l->lock);
        loop_publish_stats(l); /* what the events report, as after a round */
        if (l->pushed)
                loop_notify(l);
        l->pushed = 0;
        pthread_mutex_unlock(&l->lock);
}

static void loop_apply(EngineLoop *l, uint32_t n_taken, uint32_t n_cmds)
{
        for (uint32_t i = 0; i < n_taken; i++)
                /* On -ENOMEM sched_add() has emitted the request's ERROR event already. */
                (void) sched_add(l->s, l->taken[i]);
        for (uint32_t i = 0; i < n_cmds; i++) {
                const Cmd *c = &l->taken_cmds[i];
                switch (c->type) {
                case CMD_CANCEL:
                        sched_cancel(l->s, c->request_id);
                        break;
                case CMD_CANCEL_CLIENT:
                        sched_cancel_client(l->s, c->client);
                        break;
                case CMD_PAUSE_CLIENT:
                        if (sched_pause_client(l->s, c->client) < 0)
                                log_warning("Failed to pause client %u: out of memory, "
                                            "ignoring",
                                        c->client);
                        break;
                case CMD_RESUME_CLIENT:
                        sched_resume_client(l->s, c->client);
                        break;
                }
        }
}

/* Under the lock: pings the watchdog when half its period has passed. The ping comes from
 * this thread and no other, so a step that never returns stops the pings. */
static void loop_watchdog(EngineLoop *l)
{
        uint64_t now;

        if (l->watchdog_usec == 0)
                return;
        now = now_usec();
        if (l->stall_at_usec != 0 && now >= l->stall_at_usec) {
                log_warning("DSD_TEST_STALL_ENGINE_SEC: stalling the engine thread until "
                            "stopped");
                while (!l->stopping) {
                        pthread_mutex_unlock(&l->lock);
                        usleep(100000);
                        pthread_mutex_lock(&l->lock);
                }
                l->stall_at_usec = 0;
                return;
        }
        if (now - l->watchdog_last_usec < l->watchdog_usec)
                return;
        l->watchdog_last_usec = now;
        l->watchdog_fn();
}

/* Waits on the condition, waking in time for the next watchdog ping. */
static void loop_wait(EngineLoop *l)
{
        struct timespec ts;
        uint64_t at;

        if (l->watchdog_usec == 0) {
                pthread_cond_wait(&l->wake, &l->lock);
                return;
        }
        at = l->watchdog_last_usec + l->watchdog_usec;
        ts = (struct timespec){
                .tv_sec = (time_t) (at / 1000000), .tv_nsec = (long) (at % 1000000) * 1000};
        (void) pthread_cond_timedwait(&l->wake, &l->lock, &ts);
        loop_watchdog(l);
}

static void *loop_thread(void *userdata)
{
        EngineLoop *l = userdata;

        pthread_mutex_lock(&l->lock);
        for (;;) {
                loop_watchdog(l);
                /* Room for a round, and at most one round's events not yet taken by the I/O
                 * thread: a client the I/O thread pauses then gets at most two rounds'
                 * events more, which its session's bound holds (session.c), even when the
                 * I/O thread was kept from the outbox for many steps. A stop that cancels,
                 * or that drains a scheduler with nothing left, makes no events: it does not
                 * wait, since the thread that takes them may be the one joining this one
                 * (the server retiring a reloaded model's loop). */
                while ((out_room(l) < l->max_events || l->out_head < l->round_end[0]) &&
                        !(l->stopping && (!l->drain || sched_idle(l->s))))
                        loop_wait(l);

                /* Take the inbox. Requests before commands: a cancel always follows the
                 * submit it names. */
                uint32_t n_taken = l->n_inbox, n_cmds = l->n_cmds;
                memcpy(l->taken, l->inbox, n_taken * sizeof(*l->inbox));
                l->n_inbox = 0;
                Cmd *swap = l->taken_cmds;
                uint32_t swap_cap = l->cap_taken_cmds;
                l->taken_cmds = l->cmds;
                l->cap_taken_cmds = l->cap_cmds;
                l->cmds = swap;
                l->cap_cmds = swap_cap;
                l->n_cmds = 0;
                bool stopping = l->stopping, abort = stopping && !l->drain;
                l->pushed = 0;
                pthread_mutex_unlock(&l->lock);

                loop_apply(l, n_taken, n_cmds);
                int n = 0;
                if (abort)
                        sched_cancel_all(l->s);
                else if (sched_has_work(l->s)) {
                        n = sched_step(l->s, &l->err);
                        if (n < 0)
                                log_error("Failed to run a batch step, its requests failed: %s",
                                        l->err.msg);
                        else if (n == 0 && stopping)
                                /* Draining, and what is left cannot run (paused): end it. */
                                sched_cancel_all(l->s);
                } else if (stopping)
                        sched_cancel_all(l->s);

                pthread_mutex_lock(&l->lock);
                l->round_end[0] = l->round_end[1];
                l->round_end[1] = l->out_tail;
                loop_publish_stats(l);
                if (l->pushed)
                        loop_notify(l);
                if (stopping && sched_idle(l->s))
                        break;
                /* Nothing ran: sleep until input arrives. n < 0 goes round again at once,
                 * with the failed batch gone. */
                if (n == 0 && l->n_inbox == 0 && l->n_cmds == 0 && !l->stopping)
                        loop_wait(l);
        }
        pthread_mutex_unlock(&l->lock);
        return NULL;
}

int engine_loop_start(
        Engine *e, const SchedLimits *lim, int notify_fd, EngineLoop **ret, DsError *err)
{
        _cleanup_(engine_loop_freep) EngineLoop *l = NULL;
        int r;

        if (!e || !lim || !ret)
                return ds_error(err, -EINVAL, "engine loop: missing engine, limits or result");
        l = calloc(1, sizeof(*l));
        if (!l)
                return ds_error(err, -ENOMEM, "out of memory");
        l->e = e;
        l->lim = *lim;
        l->notify_fd = notify_fd;
        pthread_mutex_init(&l->lock, NULL);
        /* Timed waits (the watchdog) count on now_usec()'s clock. */
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&l->wake, &ca);
        pthread_condattr_destroy(&ca);
        r = sched_limits_check(&l->lim, err);
        if (r < 0)
                return r;
        r = sched_new(e, &l->lim, loop_emit, l, &l->s, err);
        if (r < 0)
                return r;
        sched_set_flush(l->s, loop_flush);
        l->max_events = sched_max_events(l->s);
        /* Twice one round's worth: the engine runs on while the I/O thread holds a round. */
        l->out_cap = 2 * l->max_events;
        l->out = calloc(l->out_cap, sizeof(*l->out));
        l->inbox = calloc(l->lim.max_queued, sizeof(*l->inbox));
        l->taken = calloc(l->lim.max_queued, sizeof(*l->taken));
        if (!l->out || !l->inbox || !l->taken)
                return ds_error(err, -ENOMEM, "out of memory for the engine's queues");
        l->rate_start_usec = now_usec();

        r = -pthread_create(&l->thread, NULL, loop_thread, l);
        if (r < 0)
                return ds_error(err, r, "cannot start the engine thread");
        l->running = true;
        *ret = TAKE_PTR(l);
        return 0;
}

void engine_loop_set_watchdog(EngineLoop *l, uint64_t interval_usec, EngineLoopPing ping)
{
        const char *stall = getenv("DSD_TEST_STALL_ENGINE_SEC");

        pthread_mutex_lock(&l->lock);
        l->watchdog_usec = ping ? interval_usec : 0;
        l->watchdog_fn = ping;
        l->watchdog_last_usec = 0; /* the first round pings at once */
        if (stall && l->watchdog_usec > 0)
                l->stall_at_usec = now_usec() + (uint64_t) (strtod(stall, NULL) * 1e6);
        pthread_cond_signal(&l->wake);
        pthread_mutex_unlock(&l->lock);
}

int engine_loop_submit(EngineLoop *l, SchedRequest **req, DsError *err)
{
        int r;

        if (!l || !req || !*req)
                return ds_error(err, -EINVAL, "engine loop: no request");
        r = sched_request_check(l->e, *req, err);
        if (r < 0) {
                log_debug("Rejected request %llu of client %u: %s", (unsigned long long) (*req)->id,
                        (*req)->client, err ? err->msg : "");
                return r;
        }

        pthread_mutex_lock(&l->lock);
        if (l->stopping)
                r = ds_error(err, -ESHUTDOWN, "the engine is stopping");
        else if (l->n_queued >= l->lim.max_queued) {
                l->stats.rejected_busy++;
                r = ds_error(err, -EBUSY, "busy: %u requests are queued, the limit is %u",
                        l->n_queued, l->lim.max_queued);
        } else {
                l->inbox[l->n_inbox++] = TAKE_PTR(*req);
                l->n_queued++;
                l->stats.submitted++;
                pthread_cond_signal(&l->wake);
        }
        pthread_mutex_unlock(&l->lock);
        if (r < 0)
                log_debug("Rejected request %llu of client %u: %s", (unsigned long long) (*req)->id,
                        (*req)->client, err ? err->msg : "");
        return r;
}

static int loop_command(EngineLoop *l, Cmd cmd)
{
        int r = 0;

        if (!l)
                return -EINVAL;
        pthread_mutex_lock(&l->lock);
        if (l->n_cmds == l->cap_cmds) {
                /* Unbounded by count on purpose: a command names a request or client the
                 * I/O thread holds, and the engine thread empties the list every round. */
                uint32_t cap = MAX(64u, l->cap_cmds * 2);
                Cmd *a = realloc(l->cmds, cap * sizeof(*a));
                if (!a)
                        r = -ENOMEM;
                else {
                        l->cmds = a;
                        l->cap_cmds = cap;
                }
        }
        if (r == 0) {
                l->cmds[l->n_cmds++] = cmd;
                pthread_cond_signal(&l->wake);
        }
        pthread_mutex_unlock(&l->lock);
        return r;
}

int engine_loop_cancel(EngineLoop *l, uint64_t request_id)
{
        return loop_command(l, (Cmd){.type = CMD_CANCEL, .request_id = request_id});
}

int engine_loop_cancel_client(EngineLoop *l, uint32_t client)
{
        return loop_command(l, (Cmd){.type = CMD_CANCEL_CLIENT, .client = client});
}

int engine_loop_pause_client(EngineLoop *l, uint32_t client)
{
        return loop_command(l, (Cmd){.type = CMD_PAUSE_CLIENT, .client = client});
}

int engine_loop_resume_client(EngineLoop *l, uint32_t client)
{
        return loop_command(l, (Cmd){.type = CMD_RESUME_CLIENT, .client = client});
}

size_t engine_loop_take_events(EngineLoop *l, SchedEvent *ret, size_t max)
{
        size_t n = 0;

        if (!l || !ret)
                return 0;
        pthread_mutex_lock(&l->lock);
        for (; n < max && l->out_head != l->out_tail; n++, l->out_head++) {
                const SchedEvent *ev = &l->out[l->out_head % l->out_cap];
                memcpy(&ret[n], ev, offsetof(SchedEvent, text));
                memcpy(ret[n].text, ev->text, ev->text_len);
                memcpy(&ret[n].sampled, &ev->sampled,
                        sizeof(SchedEvent) - offsetof(SchedEvent, sampled));
        }
        if (n)
                pthread_cond_signal(&l->wake); /* room for a round, maybe */
        pthread_mutex_unlock(&l->lock);
        return n;
}

void engine_loop_stats(EngineLoop *l, EngineLoopStats *ret)
{
        pthread_mutex_lock(&l->lock);
        *ret = l->stats;
        if (now_usec() - l->rate_start_usec > RATE_STALE_USEC)
                ret->tokens_per_s = 0;
        pthread_mutex_unlock(&l->lock);
}

void engine_loop_stop(EngineLoop *l, bool drain)
{
        if (!l)
                return;
        pthread_mutex_lock(&l->lock);
        if (!l->running) {
                pthread_mutex_unlock(&l->lock);
                return;
        }
        /* A stop without drain overrides an earlier drain, never the other way. */
        l->drain = l->stopping ? l->drain && drain : drain;
        l->stopping = true;
        pthread_cond_signal(&l->wake);
        pthread_mutex_unlock(&l->lock);

        pthread_join(l->thread, NULL);
        pthread_mutex_lock(&l->lock);
        l->running = false;
        pthread_mutex_unlock(&l->lock);
}

EngineLoop *engine_loop_free(EngineLoop *l)
{
        if (!l)
                return NULL;
        engine_loop_stop(l, false);
        sched_free(l->s);
        for (uint32_t i = 0; i < l->n_inbox; i++)
                sched_request_free(l->inbox[i]);
        free(l->inbox);
        free(l->taken);
        free(l->cmds);
        free(l->taken_cmds);
        free(l->out);
        pthread_cond_destroy(&l->wake);
        pthread_mutex_destroy(&l->lock);
        free(l);
        return NULL;
}
