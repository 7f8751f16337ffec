/* SPDX-License-Identifier: MIT */
/* libdsclient against the fake daemon (fake-daemon.h), in ring and socket-only mode:
 * streamed text, long pieces with TEXT continuations and logprobs, errors, cancel, server
 * info, ds_fd() readiness, timeouts, argument checks, a version refusal, and a daemon
 * killed with SIGKILL while a client is blocked in ds_next(). */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dsclient-debug.h"
#include "dsclient.h"
#include "fake-daemon.h"
#include "test_util.h"

static ds_event ev;

static uint64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

static uint64_t submit_text(ds_client *c, const char *text, uint32_t top_logprobs)
{
        ds_request req;
        uint64_t id;
        int r;

        ds_request_init(&req);
        req.text = text;
        req.text_len = strlen(text);
        req.sampling.temperature = 0;
        req.top_logprobs = top_logprobs;
        r = ds_submit(c, &req, &id);
        CHECK(r == 0, "submit '%s': %s", text, ds_strerror(r));
        return id;
}

/* Reads request id's events to its end; returns the text and checks the final. */
static void expect_text(ds_client *c, uint64_t id, const char *want, uint32_t want_gen)
{
        static char got[8192];
        size_t n = 0;

        for (;;) {
                int r = ds_next(c, 5000, &ev);
                CHECK(r == 1, "ds_next: %d %s", r, ds_strerror(r));
                CHECK(ev.request_id == id, "id %llu, want %llu", (unsigned long long) ev.request_id,
                        (unsigned long long) id);
                if (ev.type == DS_EVENT_FINAL)
                        break;
                CHECK(ev.type == DS_EVENT_TOKEN, "type %u", ev.type);
                CHECK(ev.publish_ns > 0, "publish time");
                CHECK(n + ev.text_len < sizeof(got), "text size");
                memcpy(got + n, ev.text, ev.text_len);
                n += ev.text_len;
        }
        got[n] = 0;
        CHECK(strcmp(got, want) == 0, "text '%s', want '%s'", got, want);
        CHECK(ev.finish == DS_FINISH_LENGTH && ev.generated_tokens == want_gen && ev.total_us == 3,
                "final %u %u", ev.finish, ev.generated_tokens);
}

static void test_session(const char *path, uint32_t flags, uint32_t want_mode)
{
        ds_client *c = NULL;
        ds_info info;
        uint64_t a, b;
        int r;

        r = ds_connect(path, flags, &c);
        CHECK(r == 0, "connect: %s %s", ds_strerror(r), ds_connect_message());

        CHECK(ds_server_info(c, &info) == 0, "server info");
        CHECK(!strcmp(info.model, "fake-model") && info.context_length == 512 &&
                        info.vocab_size == 256 && info.mode == want_mode && info.active == 1 &&
                        info.queued == 2 && info.clients == 3 && info.kv_blocks_total == 100 &&
                        info.kv_blocks_free == 40,
                "info: %s %u mode %u", info.model, info.context_length, info.mode);

        /* Two requests in flight, read one after the other (they arrive in order). */
        a = submit_text(c, "hello, world", 0);
        b = submit_text(c, "second", 0);
        CHECK(a != b && a != 0 && b != 0, "ids");
        expect_text(c, a, "hello, world", 12);
        expect_text(c, b, "second", 6);

        /* A 1000-byte piece in TEXT continuations, with three logprobs. */
        a = submit_text(c, "long", 3);
        for (int i = 0; i < 4; i++)
                CHECK(ds_next(c, 5000, &ev) == 1 && ev.text_len == 1, "prefix token");
        CHECK(ds_next(c, 5000, &ev) == 1 && ev.type == DS_EVENT_TOKEN, "long token");
        CHECK(ev.text_len == 1000 && ev.text[999] == 'x' && ev.text[1000] == 0, "len %u",
                ev.text_len);
        CHECK(ev.n_top == 3 && ev.top[2].token_id == 2 && ev.top[2].logprob == -2.0f &&
                        ev.logprob == -0.25f,
                "logprobs");
        CHECK(ds_next(c, 5000, &ev) == 1 && ev.type == DS_EVENT_FINAL, "final");

        /* An error event. */
        a = submit_text(c, "busy", 0);
        CHECK(ds_next(c, 5000, &ev) == 1 && ev.type == DS_EVENT_ERROR, "error event");
        CHECK(ev.request_id == a && ev.error == -DS_ERR_BUSY &&
                        !strcmp(ev.message, "queue full: 8 of 8 waiting"),
                "error %d '%s'", ev.error, ev.message);

        /* Cancel, and a timeout that really waits. */
        a = submit_text(c, "hang", 0);
        uint64_t t0 = now_ms();
        CHECK(ds_next(c, 60, &ev) == 0, "nothing yet");
        CHECK(now_ms() - t0 >= 55, "waited %llu ms", (unsigned long long) (now_ms() - t0));
        CHECK(ds_cancel(c, a) == 0, "cancel");
        CHECK(ds_next(c, 5000, &ev) == 1 && ev.type == DS_EVENT_FINAL &&
                        ev.finish == DS_FINISH_CANCELLED && ev.request_id == a,
                "cancelled");

        /* ds_fd(): armed by a ds_next() that found nothing, readable once an event comes. */
        CHECK(ds_next(c, 0, &ev) == 0, "empty");
        a = submit_text(c, "fd", 0);
        struct pollfd p = {.fd = ds_fd(c), .events = POLLIN};
        CHECK(poll(&p, 1, 5000) == 1, "ds_fd readable");
        int n = 0;
        for (uint64_t end = now_ms() + 5000; n < 3 && now_ms() < end;) {
                r = ds_next(c, 0, &ev);
                CHECK(r >= 0, "ds_next");
                if (r == 0) {
                        CHECK(poll(&p, 1, 5000) == 1, "ds_fd readable again");
                        continue;
                }
                n++;
        }
        CHECK(n == 3 && ev.type == DS_EVENT_FINAL, "events through ds_fd: %d", n);

        /* Arguments. */
        ds_request req;
        uint64_t id;
        ds_request_init(&req);
        req.text = "x";
        req.text_len = 1;
        req.sampling.temperature = NAN;
        CHECK(ds_submit(c, &req, &id) == -EINVAL, "NaN temperature");
        req.sampling.temperature = 0;
        req.sampling.top_p = 2;
        CHECK(ds_submit(c, &req, &id) == -EINVAL, "top_p 2");
        req.sampling.top_p = 1;
        req.text_len = 0;
        CHECK(ds_submit(c, &req, &id) == -EINVAL, "empty text");
        req.text_len = 1;
        const char *stops[] = {""};
        req.stop = stops;
        req.n_stop = 1;
        CHECK(ds_submit(c, &req, &id) == -EINVAL, "empty stop string");
        req.n_stop = 0;
        req.kind = 9;
        CHECK(ds_submit(c, &req, &id) == -EINVAL, "kind");
        req.kind = DS_PROMPT_TEXT;
        CHECK(ds_submit(NULL, &req, &id) == -EINVAL, "NULL client");
        CHECK(ds_submit(c, NULL, &id) == -EINVAL, "NULL request");
        CHECK(ds_next(c, -2, &ev) == -EINVAL, "timeout -2");
        CHECK(ds_cancel(c, 0) == -EINVAL, "cancel 0");
        CHECK(ds_connect(path, 0x80, &c) == -EINVAL, "flags");

        if (want_mode == DS_MODE_RING) {
                void *seg;
                size_t size;
                int doorbell;
                CHECK(ds_debug_segment(c, &seg, &size, &doorbell) == 0 && size > 0 && seg &&
                                doorbell >= 0,
                        "debug segment");
        }

        CHECK(ds_close(c) == NULL, "close");
        CHECK(ds_close(NULL) == NULL, "close NULL");
}

static pid_t victim;

static void *killer(void *arg)
{
        usleep(100 * 1000);
        *(uint64_t *) arg = now_ms();
        kill(victim, SIGKILL);
        return NULL;
}

/* A daemon killed with SIGKILL: a blocked ds_next() returns an error within 100 ms. */
static void test_killed(const char *path, uint32_t flags)
{
        ds_client *c;
        pthread_t t;
        uint64_t killed_at = 0;
        int r;

        victim = fake_daemon_start(path, FAKE_SERVE);
        CHECK(ds_connect(path, flags, &c) == 0, "connect");
        submit_text(c, "hang", 0);
        CHECK(pthread_create(&t, NULL, killer, &killed_at) == 0, "thread");
        r = ds_next(c, -1, &ev);
        uint64_t returned_at = now_ms();
        pthread_join(t, NULL);
        CHECK(r == -ECONNRESET, "ds_next after SIGKILL: %d %s", r, ds_strerror(r));
        CHECK(returned_at - killed_at < 100, "noticed after %llu ms",
                (unsigned long long) (returned_at - killed_at));
        CHECK(ds_submit(c,
                      &(ds_request){.kind = DS_PROMPT_TEXT,
                              .text = "x",
                              .text_len = 1,
                              .sampling = {.top_p = 1, .repetition_penalty = 1}},
                      &(uint64_t){0}) == -ECONNRESET,
                "submit after death");
        waitpid(victim, NULL, 0);
        ds_close(c);
}

int main(void)
{
        char dir[] = "/tmp/dsclient-test-XXXXXX";
        char path[256], refuse[256];
        ds_client *c = NULL;
        pid_t pid, pid_refuse;
        int r;

        CHECK(mkdtemp(dir), "mkdtemp");
        snprintf(path, sizeof(path), "%s/dsd.sock", dir);
        snprintf(refuse, sizeof(refuse), "%s/old.sock", dir);
        pid = fake_daemon_start(path, FAKE_SERVE);
        pid_refuse = fake_daemon_start(refuse, FAKE_REFUSE_VERSION);

        test_session(path, DS_CONNECT_AUTO, DS_MODE_RING);
        test_session(path, DS_CONNECT_SOCKET_ONLY, DS_MODE_SOCKET);

        /* $DSD_SOCKET is the default path. */
        setenv("DSD_SOCKET", path, 1);
        CHECK(ds_connect(NULL, 0, &c) == 0, "connect through $DSD_SOCKET");
        c = ds_close(c);

        r = ds_connect(refuse, 0, &c);
        CHECK(r == -DS_ERR_VERSION && strstr(ds_connect_message(), "version 99"),
                "version refusal: %d '%s'", r, ds_connect_message());
        snprintf(path + strlen(path), sizeof(path) - strlen(path), ".missing");
        CHECK(ds_connect(path, 0, &c) == -ENOENT, "no daemon");

        kill(pid, SIGTERM);
        kill(pid_refuse, SIGTERM);
        waitpid(pid, NULL, 0);
        waitpid(pid_refuse, NULL, 0);

        snprintf(path, sizeof(path), "%s/killed.sock", dir);
        test_killed(path, DS_CONNECT_AUTO);
        test_killed(path, DS_CONNECT_SOCKET_ONLY);

        unlink(path);
        snprintf(path, sizeof(path), "%s/dsd.sock", dir);
        unlink(path);
        unlink(refuse);
        rmdir(dir);
        printf("ok\n");
        return 0;
}
