/* SPDX-License-Identifier: MIT */
/* The engine thread end to end on the synthetic model:
 *   - a full queue answers -EBUSY at once, and a prompt past the context limit
 *     -DS_ERR_CONTEXT_FULL, both with messages naming the numbers;
 *   - requests submitted from another thread stream back through the outbox, woken by the
 *     eventfd, with the text engine_generate() gives each alone;
 *   - cancel_client ends a paused client's requests; stop joins cleanly and the pool is
 *     full again (ASan checks for leaks);
 *   - the engine runs at most two rounds ahead of the events taken;
 *   - a drain stop of a finished loop returns with its events untaken. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>

#include "engine_loop.h"
#include "sched_test.h"

#define N_THREADED 12

static const char *const prompts[] = {
        "The quick brown fox",
        "A lazy dog",
        "Hello world",
        "Once upon a time",
        "Quiet",
        "Numbers 1 2 3",
        "Über café",
        "Tokens and text",
};

static Sink sink;

/* Waits on the eventfd and files every event, until n finals came or the timeout. */
static void drain_until(EngineLoop *l, int efd, uint32_t n_final)
{
        static SchedEvent evs[16];

        while (sink.n_final < n_final) {
                struct pollfd p = {.fd = efd, .events = POLLIN};
                int r = poll(&p, 1, 60000);
                CHECK(r == 1, "no wakeup within 60 s (%u of %u finals)", sink.n_final, n_final);
                uint64_t v;
                CHECK(read(efd, &v, sizeof(v)) == sizeof(v) && v > 0, "eventfd read");
                size_t k;
                do {
                        k = engine_loop_take_events(l, evs, ELEMENTSOF(evs));
                        for (size_t i = 0; i < k; i++) {
                                CHECK(evs[i].publish_ns > 0, "no publish timestamp");
                                CHECK((uintptr_t) evs[i].userdata == evs[i].request_id + 1000,
                                        "userdata not carried");
                                sink_event(&sink, &evs[i]);
                        }
                } while (k == ELEMENTSOF(evs));
        }
}

static void test_limits(Engine *e, int efd)
{
        _cleanup_(engine_loop_freep) EngineLoop *l = NULL;
        SchedLimits lim = {.max_seqs = 2, .step_tokens = 64, .max_queued = 2};
        DsError err = {};
        int r;

        memset(&sink, 0, sizeof(sink));
        CHECK(engine_loop_start(e, &lim, efd, &l, &err) == 0, "%s", err.msg);

        /* A paused client's requests stay queued, so the queue fills deterministically. */
        CHECK(engine_loop_pause_client(l, 7) == 0, "pause");
        for (uint64_t id = 0; id < 2; id++) {
                _cleanup_(sched_request_freep) SchedRequest *req =
                        make_request(e, id, 7, "Hello", 8, NULL);
                req->userdata = (void *) (uintptr_t) (id + 1000);
                CHECK(engine_loop_submit(l, &req, &err) == 0, "%s", err.msg);
                CHECK(!req, "submit did not take the request");
        }
        _cleanup_(sched_request_freep) SchedRequest *busy = make_request(e, 2, 8, "Hi", 8, NULL);
        r = engine_loop_submit(l, &busy, &err);
        CHECK(r == -EBUSY, "a full queue answered %d", r);
        CHECK(busy, "a refused request was taken");
        CHECK(strstr(err.msg, "busy") && strstr(err.msg, " 2"), "message: %s", err.msg);

        /* Context: the prompt plus one generated token must fit. */
        uint32_t ctx = MIN(e->model->bk.cfg.max_positions, e->kv.n_total * e->block_tokens);
        _cleanup_(sched_request_freep) SchedRequest *big = make_request(e, 3, 8, "Hi", 8, NULL);
        free(big->prompt);
        big->n_prompt = ctx;
        big->prompt = calloc(ctx, sizeof(int32_t));
        CHECK(big->prompt, "out of memory");
        r = engine_loop_submit(l, &big, &err);
        CHECK(r == -DS_ERR_CONTEXT_FULL, "an over-long prompt answered %d", r);
        char want[64];
        snprintf(want, sizeof(want), "%u tokens", ctx);
        CHECK(strstr(err.msg, want) && strstr(err.msg, "context limit of"), "message: %s", err.msg);
        big->n_prompt = ctx - 1;
        CHECK(sched_request_check(e, big, &err) == 0, "a prompt of context - 1: %s", err.msg);

        /* The client went away while paused: both end cancelled, blocks all free. */
        CHECK(engine_loop_cancel_client(l, 7) == 0, "cancel_client");
        drain_until(l, efd, 2);
        for (int id = 0; id < 2; id++)
                CHECK(sink.out[id].finish == FINISH_CANCELLED, "request %d: finish %s", id,
                        finish_reason_name(sink.out[id].finish));
        engine_loop_stop(l, true);
        EngineLoopStats st;
        engine_loop_stats(l, &st);
        CHECK(st.rejected_busy == 1 && st.submitted == 2 && st.cancelled == 2,
                "stats: %llu busy, %llu submitted, %llu cancelled",
                (unsigned long long) st.rejected_busy, (unsigned long long) st.submitted,
                (unsigned long long) st.cancelled);
        CHECK(st.kv_blocks_free == st.kv_blocks_total && st.active == 0 && st.queued == 0,
                "%u of %u blocks free, %u active, %u queued", st.kv_blocks_free, st.kv_blocks_total,
                st.active, st.queued);
}

typedef struct Submitter {
        Engine *e;
        EngineLoop *l;
} Submitter;

static void *submitter(void *userdata)
{
        Submitter *sb = userdata;
        DsError err = {};

        for (uint64_t id = 0; id < N_THREADED; id++) {
                SchedRequest *req = make_request(sb->e, id, (uint32_t) id % 3,
                        prompts[id % ELEMENTSOF(prompts)], 24 + (uint32_t) id, NULL);
                req->userdata = (void *) (uintptr_t) (id + 1000);
                CHECK(engine_loop_submit(sb->l, &req, &err) == 0, "%s", err.msg);
        }
        return NULL;
}

static void test_threaded(Engine *e, int efd)
{
        _cleanup_(engine_loop_freep) EngineLoop *l = NULL;
        SchedLimits lim = {.max_seqs = 4, .step_tokens = 32, .max_queued = N_THREADED};
        static Output want[N_THREADED];
        DsError err = {};
        pthread_t t;

        for (uint32_t id = 0; id < N_THREADED; id++)
                reference(e, prompts[id % ELEMENTSOF(prompts)], 24 + id, NULL, &want[id]);
        memset(&sink, 0, sizeof(sink));
        CHECK(engine_loop_start(e, &lim, efd, &l, &err) == 0, "%s", err.msg);
        Submitter sb = {.e = e, .l = l};
        CHECK(pthread_create(&t, NULL, submitter, &sb) == 0, "pthread_create");
        drain_until(l, efd, N_THREADED);
        CHECK(pthread_join(t, NULL) == 0, "pthread_join");
        for (uint32_t id = 0; id < N_THREADED; id++) {
                char what[64];
                snprintf(what, sizeof(what), "request %u", id);
                check_same(&sink.out[id], &want[id], what);
                CHECK(sink.out[id].usage.total_usec >= sink.out[id].usage.ttft_usec,
                        "usage times out of order");
        }

        EngineLoopStats st;
        engine_loop_stats(l, &st);
        CHECK(st.finished == N_THREADED && st.failed == 0, "%llu finished",
                (unsigned long long) st.finished);
        CHECK(st.generated_tokens > 0 && st.steps > 0, "no work counted");
        engine_loop_stop(l, false);
        engine_loop_stop(l, true); /* idempotent */
        _cleanup_(sched_request_freep) SchedRequest *late = make_request(e, 0, 0, "Hi", 4, NULL);
        CHECK(engine_loop_submit(l, &late, &err) == -ESHUTDOWN, "submit after stop");
}

/* Stop without drain while requests run: each gets a cancelled FINAL, nothing leaks. */
static void test_stop_cancels(Engine *e, int efd)
{
        _cleanup_(engine_loop_freep) EngineLoop *l = NULL;
        SchedLimits lim = {.max_seqs = 2, .step_tokens = 32, .max_queued = 8};
        static SchedEvent evs[64];
        DsError err = {};

        memset(&sink, 0, sizeof(sink));
        CHECK(engine_loop_start(e, &lim, efd, &l, &err) == 0, "%s", err.msg);
        for (uint64_t id = 0; id < 6; id++) {
                SchedRequest *req = make_request(e, id, 1, "The quick brown fox", 2000, NULL);
                req->userdata = (void *) (uintptr_t) (id + 1000);
                CHECK(engine_loop_submit(l, &req, &err) == 0, "%s", err.msg);
        }
        engine_loop_stop(l, false);
        size_t k;
        while ((k = engine_loop_take_events(l, evs, ELEMENTSOF(evs))) > 0)
                for (size_t i = 0; i < k; i++)
                        sink_event(&sink, &evs[i]);
        CHECK(sink.n_final == 6, "%u finals after stop", sink.n_final);
        for (int id = 0; id < 6; id++)
                CHECK(sink.out[id].finish == FINISH_CANCELLED, "request %d: %s", id,
                        finish_reason_name(sink.out[id].finish));
        CHECK(e->kv.n_free == e->kv.n_total, "blocks held after stop");
}

/* The engine keeps at most two rounds' events that the I/O thread has not taken: left
 * alone for 300 ms after its first event (hundreds of the tiny model's steps), a stream
 * has a few events waiting, not hundreds, and goes on to its reference text once they are
 * taken. The first event is waited for (on a cleared eventfd), not timed: under ASan
 * beside other tests on two cores the prefill alone took more than 300 ms (CI, seventeenth
 * session). */
static void test_runahead(Engine *e, int efd)
{
        _cleanup_(engine_loop_freep) EngineLoop *l = NULL;
        SchedLimits lim = {.max_seqs = 4, .step_tokens = 64, .max_queued = 4};
        static Output want;
        static SchedEvent evs[64];
        DsError err = {};

        reference(e, prompts[0], 200, NULL, &want);
        memset(&sink, 0, sizeof(sink));
        /* earlier tests may leave wakeups unread: only this stream's events may wake us */
        uint64_t v;
        CHECK(read(efd, &v, sizeof(v)) == sizeof(v) || errno == EAGAIN, "eventfd read");
        CHECK(engine_loop_start(e, &lim, efd, &l, &err) == 0, "%s", err.msg);
        SchedRequest *req = make_request(e, 0, 1, prompts[0], 200, NULL);
        req->userdata = (void *) (uintptr_t) 1000;
        CHECK(engine_loop_submit(l, &req, &err) == 0, "%s", err.msg);
        struct pollfd p = {.fd = efd, .events = POLLIN};
        CHECK(poll(&p, 1, 60000) == 1, "no event within 60 s");
        usleep(300000);
        size_t n = engine_loop_take_events(l, evs, ELEMENTSOF(evs));
        CHECK(n >= 1 && n <= 4, "%zu events waited for the I/O thread", n);
        for (size_t i = 0; i < n; i++)
                sink_event(&sink, &evs[i]);
        drain_until(l, efd, 1);
        check_same(&sink.out[0], &want, "the held-back stream");
}

static void *stop_draining(void *userdata)
{
        engine_loop_stop(userdata, true);
        return NULL;
}

/* A drain stop of a loop whose requests have all finished, from a thread that has not taken
 * their events (as the server retires a reloaded model's loop): it must not wait for room
 * in the outbox, since nothing takes the events until the stop returns. A request of 2
 * tokens leaves the engine thread at the outbox's bound (its first round's event untaken)
 * after its final event. dsd hung there in test-moe-serve, about once in 45 runs
 * (eighteenth session). */
static void test_drain_unread(Engine *e, int efd)
{
        _cleanup_(engine_loop_freep) EngineLoop *l = NULL;
        SchedLimits lim = {.max_seqs = 2, .step_tokens = 64, .max_queued = 2};
        static SchedEvent evs[16];
        EngineLoopStats st = {};
        DsError err = {};
        pthread_t t;

        memset(&sink, 0, sizeof(sink));
        CHECK(engine_loop_start(e, &lim, efd, &l, &err) == 0, "%s", err.msg);
        SchedRequest *req = make_request(e, 0, 1, prompts[0], 2, NULL);
        req->userdata = (void *) (uintptr_t) 1000;
        CHECK(engine_loop_submit(l, &req, &err) == 0, "%s", err.msg);
        for (int i = 0; i < 6000 && st.finished == 0; i++) {
                usleep(10000);
                engine_loop_stats(l, &st);
        }
        CHECK(st.finished == 1, "the 2-token request did not finish within 60 s");
        CHECK(pthread_create(&t, NULL, stop_draining, l) == 0, "pthread_create");
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 30;
        CHECK(pthread_timedjoin_np(t, NULL, &until) == 0,
                "a drain stop with its events untaken did not return within 30 s");
        size_t k = engine_loop_take_events(l, evs, ELEMENTSOF(evs));
        for (size_t i = 0; i < k; i++)
                sink_event(&sink, &evs[i]);
        CHECK(sink.n_final == 1 && sink.out[0].finish == FINISH_LENGTH,
                "%u finals, finish %s after the stop", sink.n_final,
                finish_reason_name(sink.out[0].finish));
}

int main(void)
{
        _cleanup_(engine_freep) Engine *e = NULL;
        _cleanup_close_ int efd = -EBADF;
        DsError err = {};

        CHECK(engine_open(test_build("models/tiny"), NULL, &e, &err) == 0, "%s", err.msg);
        efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        CHECK(efd >= 0, "eventfd");
        test_limits(e, efd);
        test_threaded(e, efd);
        test_stop_cancels(e, efd);
        test_runahead(e, efd);
        test_drain_unread(e, efd);
        return 0;
}
