/* SPDX-License-Identifier: MIT */
/* Hosts io.dsd.Daemon1 (daemon/bus.c) with fake state on the session bus
 * (DBUS_SESSION_BUS_ADDRESS), driven by the same poll loop the daemon uses, for
 * test-bus.py. Prints "ready" on stdout once the name is owned; exits 0 on SIGTERM.
 *
 * The fake: Reload(m) goes to "reloading" and completes 200 ms later from the loop; a model
 * ending in "/fail" fails (LoadFailed) and leaves the old model serving. Drain() and
 * Resume() switch the state. Cancel(7) succeeds, any other id is NoSuchRequest. Usage:
 * bus-fake-daemon ADMIN_GID */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>

#include "bus.h"
#include "test_util.h"

typedef struct Fake {
        Bus *bus;
        BusState state;
        char model[256];
        char pending_model[256];
        uint64_t reload_at_usec; /* when the pending reload completes, 0 for none */
        uint64_t reloads;
} Fake;

static uint64_t mono_usec(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

static void fake_get_info(void *userdata, BusInfo *ret)
{
        Fake *f = userdata;
        *ret = (BusInfo){
                .state = f->state,
                .model = f->model,
                .backend = "cpu",
                .device = "cpu (1 thread)",
                .context_length = strstr(f->model, "/b") ? 4096 : 2048,
                .architecture =
                        strstr(f->model, "/b") ? "DeepseekV2ForCausalLM" : "Qwen2ForCausalLM",
                .kv_bytes_per_token = strstr(f->model, "/b") ? 3456 : 2048,
        };
}

static void fake_get_counters(void *userdata, BusCounters *ret)
{
        *ret = (BusCounters){
                .active_requests = 2,
                .queued_requests = 1,
                .clients = 2,
                .kv_blocks_total = 128,
                .kv_blocks_free = 100,
                .gpu_memory_used = 3ull << 30,
                .gpu_memory_total = 80ull << 30,
                .tokens_per_second = 12.5,
        };
}

static void fake_get_stats(void *userdata, BusStats *ret)
{
        Fake *f = userdata;
        *ret = (BusStats){
                .requests_total = 10,
                .requests_finished = 7,
                .requests_cancelled = 2,
                .requests_failed = 1,
                .prompt_tokens_total = 1000,
                .generated_tokens_total = 500,
                .reloads_total = f->reloads,
                .ttft_p50_usec = 1500,
                .ttft_p90_usec = 3000,
                .ttft_p99_usec = 9000,
                .token_p50_usec = 20000,
                .token_p90_usec = 25000,
                .token_p99_usec = 40000,
        };
}

static int fake_list_clients(void *userdata, BusClientFn fn, void *ctx)
{
        static const BusClient clients[] = {
                {.id = 7,
                        .pid = 1234,
                        .uid = 1000,
                        .comm = "chat",
                        .active_requests = 1,
                        .requests_total = 3,
                        .tokens_total = 300},
                {.id = 9,
                        .pid = 1240,
                        .uid = 0,
                        .comm = "batchjob",
                        .active_requests = 1,
                        .requests_total = 7,
                        .tokens_total = 1200},
        };
        for (size_t i = 0; i < ELEMENTSOF(clients); i++) {
                int r = fn(ctx, &clients[i]);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int fake_reload(void *userdata, const char *model, DsError *err)
{
        Fake *f = userdata;

        if (f->state == BUS_STATE_DRAINING)
                return ds_error(err, -EBUSY, "draining: resume before reloading");
        snprintf(f->pending_model, sizeof(f->pending_model), "%s", model[0] ? model : f->model);
        f->state = BUS_STATE_RELOADING;
        f->reload_at_usec = mono_usec() + 200000;
        return bus_info_changed(f->bus);
}

static void fake_reload_complete(Fake *f)
{
        size_t n = strlen(f->pending_model);
        bool fail = n >= 5 && strcmp(f->pending_model + n - 5, "/fail") == 0;

        f->reload_at_usec = 0;
        f->state = BUS_STATE_READY;
        if (!fail) {
                snprintf(f->model, sizeof(f->model), "%s", f->pending_model);
                f->reloads++;
        }
        CHECK(bus_info_changed(f->bus) >= 0, "bus_info_changed");
        if (fail)
                bus_reload_done(f->bus, -DS_ERR_FORMAT,
                        "Failed to load model: config.json: field 'hidden_size' is missing");
        else
                bus_reload_done(f->bus, 0, NULL);
}

static int fake_drain(void *userdata, DsError *err)
{
        Fake *f = userdata;
        f->state = BUS_STATE_DRAINING;
        return 0;
}

static int fake_resume(void *userdata, DsError *err)
{
        Fake *f = userdata;
        f->state = BUS_STATE_READY;
        return 0;
}

static int fake_cancel(void *userdata, uint64_t id, DsError *err)
{
        if (id != 7)
                return ds_error(
                        err, -ESRCH, "No request or client with id %llu", (unsigned long long) id);
        return 0;
}

static const BusOps fake_ops = {
        .get_info = fake_get_info,
        .get_counters = fake_get_counters,
        .get_stats = fake_get_stats,
        .list_clients = fake_list_clients,
        .reload = fake_reload,
        .drain = fake_drain,
        .resume = fake_resume,
        .cancel = fake_cancel,
};

int main(int argc, char **argv)
{
        Fake f = {.state = BUS_STATE_READY, .model = "/models/a"};
        DsError err = {};
        sigset_t mask;
        int sfd, r;

        CHECK(argc == 2, "usage: bus-fake-daemon ADMIN_GID");
        BusOptions opt = {
                .user_bus = true,
                .version = "0.1.0-test",
                .started_at_usec = 1700000000000000ull,
                .admin_gid = (gid_t) strtoul(argv[1], NULL, 10),
        };

        sigemptyset(&mask);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGINT);
        CHECK(sigprocmask(SIG_BLOCK, &mask, NULL) == 0, "sigprocmask");
        sfd = signalfd(-1, &mask, SFD_CLOEXEC);
        CHECK(sfd >= 0, "signalfd");

        r = bus_new(&opt, &fake_ops, &f, &f.bus, &err);
        CHECK(r == 0, "bus_new: %s", err.msg);
        printf("ready\n");
        fflush(stdout);

        for (;;) {
                uint64_t until, now = mono_usec();
                int timeout_ms = -1;

                r = bus_process(f.bus);
                CHECK(r >= 0, "bus_process: %s", strerror(-r));
                if (f.reload_at_usec && now >= f.reload_at_usec) {
                        fake_reload_complete(&f);
                        continue;
                }
                CHECK(bus_get_timeout_usec(f.bus, &until) >= 0, "timeout");
                if (f.reload_at_usec)
                        until = MIN(until, f.reload_at_usec);
                if (until != UINT64_MAX)
                        timeout_ms = until > now ? (int) ((until - now + 999) / 1000) : 0;

                struct pollfd p[2] = {
                        {.fd = bus_get_fd(f.bus), .events = (short) bus_get_events(f.bus)},
                        {.fd = sfd, .events = POLLIN},
                };
                r = poll(p, 2, timeout_ms);
                CHECK(r >= 0 || errno == EINTR, "poll");
                if (r > 0 && p[1].revents)
                        break;
        }
        f.bus = bus_free(f.bus);
        return 0;
}
