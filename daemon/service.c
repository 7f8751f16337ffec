/* SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bus.h"
#include "listener.h"
#include "log.h"
#include "notify.h"
#include "service.h"

/* One model load on the loader thread. */
typedef struct Load {
        DsdConfig cfg; /* the configuration the new model is served under */
        EngineOptions eo;
        char device[32];
        Engine *engine; /* the result */
        int r;
        DsError err;
} Load;

typedef struct Service {
        const ServiceOptions *opt;
        DsdConfig cfg; /* in force: the one the served model was loaded under */
        Server *srv;
        Bus *bus;
        int notify_fd; /* the engine loops' eventfd */
        int loader_fd; /* the loader thread's "done" eventfd */
        HttpConfig http;

        char model[PATH_MAX]; /* served, "" for none */
        char backend[16];
        char device[64];
        char architecture[64];
        uint32_t context_length;
        uint64_t kv_bytes_per_token;
        bool failed;   /* the last load failed and nothing is served */
        bool drained;  /* dsctl drain */
        bool stopping; /* SIGTERM */
        bool initial;  /* the load in progress is the start's: failing it ends the daemon */
        int exit_status;
        uint64_t reloads;
        uint64_t watchdog_usec;      /* ping interval (half of WatchdogSec=), 0 for none */
        uint64_t watchdog_last_usec; /* the I/O thread's pings, while no engine runs */

        pthread_t loader;
        bool loading;         /* the loader thread runs or waits to be joined */
        bool drain_then_load; /* memory cannot hold both: waiting for idle first */
        Load *load;
} Service;

/* ---- configuration ---- */

int service_read_config(const ServiceOptions *o, DsdConfig *ret, DsError *err)
{
        DsdConfig c;
        struct stat st;
        int r;

        config_init(&c);
        if (o->config_path) {
                r = config_load(o->config_path, false, &c, err);
                if (r < 0)
                        return r;
        }
        for (size_t i = 0; i < o->n_overrides; i++) {
                r = config_set(&c, o->overrides[i].source, o->overrides[i].key,
                        o->overrides[i].value, err);
                if (r < 0)
                        return r;
        }
        if (c.model[0] && (stat(c.model, &st) < 0 || !S_ISDIR(st.st_mode)))
                return ds_error(err, -ENOENT, "%s: field 'model': '%s' is not a directory",
                        o->config_path ? o->config_path : "command line", c.model);
        *ret = c;
        return 0;
}

static void load_init(const Service *sv, const DsdConfig *c, Load *l)
{
        *l = (Load){.cfg = *c};
        config_device(c, l->device, sizeof(l->device));
        l->eo = (EngineOptions){
                .backend = config_backend_to_string(c->backend),
                .quantize_int4 = c->quantize_at_load,
                .lm_head_int8 = c->lm_head_int8,
                .threads = sv->opt->threads,
                .kv_bytes = sv->opt->kv_bytes,
                .kv_fraction = sv->opt->config_path ? c->limits.kv_memory_fraction : 0,
                .device = c->backend == CONFIG_BACKEND_CPU ? NULL : l->device,
        };
}

static void limits_of(const DsdConfig *c, const ServiceOptions *o, SchedLimits *ret)
{
        *ret = (SchedLimits){
                .max_seqs = c->limits.max_batch,
                .step_tokens = o->step_tokens,
                .max_queued = c->limits.queue_length,
        };
}

/* ---- state ---- */

static BusState service_state(const Service *sv)
{
        if (sv->stopping || sv->drained || sv->drain_then_load)
                return BUS_STATE_DRAINING;
        if (sv->loading)
                return sv->model[0] ? BUS_STATE_RELOADING : BUS_STATE_LOADING;
        if (sv->model[0])
                return BUS_STATE_READY;
        return sv->failed ? BUS_STATE_FAILED : BUS_STATE_NO_MODEL;
}

static void state_changed(Service *sv)
{
        if (sv->bus)
                (void) bus_info_changed(sv->bus);
}

/* READY=1 with a formatted STATUS= line. */
_printf_(1, 2) static int ready(const char *fmt, ...)
{
        char buf[512];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        return notify_ready(buf);
}

static void watchdog_ping(void)
{
        (void) notify_watchdog();
}

/* ---- loading ---- */

static void load_progress(void *userdata, uint32_t done, uint32_t n)
{
        const Load *l = userdata;

        (void) notify_status("loading %s: %u/%u layers", l->cfg.model, done, n);
}

static void *loader_thread(void *userdata)
{
        Service *sv = userdata;
        Load *l = sv->load;
        uint64_t one = 1;

        l->eo.progress = load_progress;
        l->eo.progress_userdata = l;
        l->r = engine_open(l->cfg.model, &l->eo, &l->engine, &l->err);
        if (l->r >= 0 && l->cfg.limits.context_length > 0) {
                /* The configured context may only shorten the model's. */
                BkConfig *bc = &l->engine->model->bk.cfg;
                bc->max_positions = MIN(bc->max_positions, l->cfg.limits.context_length);
        }
        /* A device backend's first use of its kernels costs the first requests (a host
         * backend has none, and its steps are slow enough that warming would delay the
         * start for nothing). */
        SchedLimits lim;
        DsError ignored = {}; /* load_finish reports bad limits */
        limits_of(&l->cfg, sv->opt, &lim);
        if (l->r >= 0 && l->engine->ops->mem_info && sched_limits_check(&lim, &ignored) == 0) {
                uint64_t t0 = now_usec();
                (void) notify_status("warming up %s", l->cfg.model);
                uint32_t prompt = 0, seqs = 0;
                /* the longest prefill chunk a step takes, and the most sequences */
                l->r = engine_warm_up(
                        l->engine, lim.max_seqs, lim.step_tokens, &prompt, &seqs, &l->err);
                if (l->r >= 0)
                        log_info("Warmed up '%s' in %.0f ms: prompts of up to %u tokens, "
                                 "decode steps of up to %u sequences",
                                l->cfg.model, (double) (now_usec() - t0) / 1e3, prompt, seqs);
        }
        (void) !write(sv->loader_fd, &one, sizeof(one));
        return NULL;
}

static int load_start(Service *sv)
{
        int r;

        (void) notify_status("loading %s", sv->load->cfg.model);
        log_info("Loading '%s' (%s backend)", sv->load->cfg.model, sv->load->eo.backend);
        r = -pthread_create(&sv->loader, NULL, loader_thread, sv);
        if (r < 0)
                return r;
        sv->loading = true;
        return 0;
}

static void closedirp(DIR **d)
{
        if (*d)
                closedir(*d);
}

/* Bytes of the checkpoint's safetensors files: what a device backend will upload. */
static uint64_t checkpoint_bytes(const char *dir)
{
        _cleanup_(closedirp) DIR *d = opendir(dir);
        struct dirent *de;
        uint64_t sum = 0;

        while (d && (de = readdir(d))) {
                size_t n = strlen(de->d_name);
                struct stat st;
                if (n < 12 || strcmp(de->d_name + n - 12, ".safetensors") != 0 ||
                        fstatat(dirfd(d), de->d_name, &st, 0) < 0)
                        continue;
                sum += (uint64_t) st.st_size;
        }
        return sum;
}

/* Where two models may not fit: the CPU backend's memory is the host's, which holds both
 * for the models dsd serves. On a device the new weights are repacked there and may get
 * an FP16 copy for the batched path, so the free device memory must hold twice the
 * checkpoint; else the reload drains first rather than run out mid-load. */
static bool reload_fits(const Service *sv, const Load *l)
{
        uint64_t used, total;

        if (l->cfg.backend == CONFIG_BACKEND_CPU ||
                (l->cfg.backend == CONFIG_BACKEND_AUTO && strcmp(sv->backend, "cuda") != 0))
                return true;
        /* a KV cache sized from the device's free memory took the room a second model
         * would need, and the new one's, sized beside the old, would be a sliver */
        if (!l->eo.kv_bytes && l->eo.kv_fraction > 0)
                return false;
        server_memory(sv->srv, &used, &total);
        return total > used && total - used >= 2 * checkpoint_bytes(l->cfg.model);
}

static void device_name(Service *sv, const Engine *e, const Load *l)
{
        snprintf(sv->backend, sizeof(sv->backend), "%s", e->ops->name);
        if (!strcmp(e->ops->name, "cpu"))
                snprintf(sv->device, sizeof(sv->device), "cpu (%u thread%s)",
                        MAX(sv->opt->threads, 1u), sv->opt->threads > 1 ? "s" : "");
        else
                snprintf(
                        sv->device, sizeof(sv->device), "%s:%" PRIu32, e->ops->name, l->cfg.device);
}

/* On the I/O thread once the loader is done: the new engine serves new requests, or the
 * error goes to the caller and the log while the old model keeps serving. */
static void load_finish(Service *sv)
{
        _cleanup_free_ Load *l = TAKE_PTR(sv->load);
        _cleanup_(engine_loop_freep) EngineLoop *loop = NULL;
        SchedLimits lim;
        DsError err = {};
        int r;

        pthread_join(sv->loader, NULL);
        sv->loading = false;
        r = l->r;
        if (r >= 0) {
                limits_of(&l->cfg, sv->opt, &lim);
                r = engine_loop_start(l->engine, &lim, sv->notify_fd, &loop, &l->err);
        }
        if (r >= 0) {
                engine_loop_set_watchdog(loop, sv->watchdog_usec, watchdog_ping);
                r = server_set_engine(sv->srv, l->engine, loop, l->cfg.model, &err);
                if (r == -EBUSY) {
                        snprintf(l->err.msg, sizeof(l->err.msg), "%s", err.msg);
                } else {
                        /* The server owns both now, also when only HTTP failed. */
                        TAKE_PTR(loop);
                        TAKE_PTR(l->engine);
                        if (r < 0)
                                log_error("The HTTP listener does not serve '%s': %s", l->cfg.model,
                                        err.msg);
                        r = 0;
                }
        }
        if (r < 0) {
                engine_loop_free(TAKE_PTR(loop));
                engine_free(TAKE_PTR(l->engine));
                log_error("Failed to load '%s': %s%s", l->cfg.model, l->err.msg,
                        sv->model[0] ? "; the previous model keeps serving" : "");
                if (!sv->initial)
                        server_accept(sv->srv); /* state failed: clients learn why */
                if (!sv->model[0])
                        sv->failed = true;
                if (sv->bus)
                        bus_reload_done(sv->bus, r, l->err.msg);
                if (sv->initial) {
                        sv->exit_status = EXIT_FAILURE;
                        (void) raise(SIGTERM); /* blocked: the server's signalfd reads it */
                } else if (sv->model[0])
                        (void) ready("serving %s; the reload failed: %s", sv->model, l->err.msg);
                else
                        (void) ready("failed: %s", l->err.msg);
                sv->initial = false;
                state_changed(sv);
                return;
        }
        if (!sv->initial)
                sv->reloads++;
        sv->initial = false;
        sv->failed = false;
        sv->cfg = l->cfg;
        log_set_max_level(sv->cfg.log_level);
        snprintf(sv->model, sizeof(sv->model), "%s", l->cfg.model);
        const Engine *e = server_engine(sv->srv);
        device_name(sv, e, l);
        snprintf(sv->architecture, sizeof(sv->architecture), "%s", e->model->info.architecture);
        sv->kv_bytes_per_token = e->ops->kv_bytes_per_token(e->be);
        sv->context_length = server_context_length(sv->srv);
        log_info("Serving '%s' (%s): %s, context %u", sv->model, e->model->info.quant, sv->device,
                sv->context_length);
        (void) ready("serving %s", sv->model);
        if (sv->bus)
                bus_reload_done(sv->bus, 0, NULL);
        state_changed(sv);
}

/* Reload("") and SIGHUP: the configuration again, or model instead of its model. */
static int service_reload(void *userdata, const char *model, DsError *err)
{
        Service *sv = userdata;
        _cleanup_free_ Load *l = NULL;
        DsdConfig c;
        int r;

        if (sv->stopping)
                return ds_error(err, -ESHUTDOWN, "the daemon is stopping");
        if (sv->loading || sv->drain_then_load)
                return ds_error(err, -EBUSY, "a reload is already in progress");
        if (server_retiring(sv->srv))
                return ds_error(err, -EBUSY,
                        "the previous model still finishes its requests; try again later");
        r = service_read_config(sv->opt, &c, err);
        if (r < 0)
                return r;
        if (model && model[0]) {
                r = config_set(&c, "Reload()", "model", model, err);
                if (r < 0)
                        return r;
                struct stat st;
                if (stat(c.model, &st) < 0 || !S_ISDIR(st.st_mode))
                        return ds_error(err, -ENOENT, "model '%s' is not a directory", c.model);
        }
        if (!c.model[0])
                return ds_error(err, -DS_ERR_MODEL_NOT_LOADED,
                        "no model is configured: set 'model' in %s or name one",
                        sv->opt->config_path ? sv->opt->config_path : "the configuration");
        l = malloc(sizeof(*l));
        if (!l)
                return ds_error(err, -ENOMEM, "out of memory");
        load_init(sv, &c, l);
        sv->load = TAKE_PTR(l);
        (void) notify_reloading(sv->model[0] ? "reloading" : "loading");
        if (sv->model[0] && !reload_fits(sv, sv->load)) {
                log_notice("Reload of '%s': device memory cannot hold two models, draining "
                           "before the switch",
                        sv->load->cfg.model);
                (void) notify_status("draining before switching to %s: memory cannot hold "
                                     "both models",
                        sv->load->cfg.model);
                sv->drain_then_load = true;
                server_set_draining(sv->srv, true);
                state_changed(sv);
                return 0;
        }
        r = load_start(sv);
        if (r < 0) {
                free(sv->load);
                sv->load = NULL;
                (void) ready("serving %s", sv->model);
                return ds_error(err, r, "cannot start the loader thread: %s", strerror(-r));
        }
        state_changed(sv);
        return 0;
}

/* SIGHUP and Reload() log a refusal alike: the daemon's log is where an operator looks
 * later, and the bus caller's stderr may have gone nowhere (a script, a timer unit). Without
 * a model named, the reload was of the configuration file, or of the flags without one. */
static int service_reload_or_log(Service *sv, const char *how, const char *model, DsError *err)
{
        const char *what = model[0] ? model : sv->opt->config_path;
        int r;

        r = service_reload(sv, model, err);
        if (r < 0 && what)
                log_error("%s: reload of '%s' refused: %s", how, what, err->msg);
        else if (r < 0)
                log_error("%s: reload of the command line's model refused: %s", how, err->msg);
        return r;
}

/* ---- the bus object's ops ---- */

static void op_get_info(void *userdata, BusInfo *ret)
{
        Service *sv = userdata;

        *ret = (BusInfo){
                .state = service_state(sv),
                .model = sv->model,
                .backend = sv->model[0] ? sv->backend : "",
                .device = sv->model[0] ? sv->device : "",
                .context_length = sv->model[0] ? sv->context_length : 0,
                .architecture = sv->model[0] ? sv->architecture : "",
                .kv_bytes_per_token = sv->model[0] ? sv->kv_bytes_per_token : 0,
        };
}

static void op_get_counters(void *userdata, BusCounters *ret)
{
        Service *sv = userdata;
        EngineLoopStats st;
        uint32_t clients;

        server_stats(sv->srv, &st, &clients);
        uint64_t mem_used, mem_total;
        server_memory(sv->srv, &mem_used, &mem_total);
        *ret = (BusCounters){
                .gpu_memory_used = mem_used,
                .gpu_memory_total = mem_total,
                .active_requests = st.active,
                .queued_requests = st.queued,
                .clients = clients,
                .kv_blocks_total = st.kv_blocks_total,
                .kv_blocks_free = st.kv_blocks_free,
                .tokens_per_second = st.tokens_per_s,
        };
}

static void op_get_stats(void *userdata, BusStats *ret)
{
        Service *sv = userdata;
        EngineLoopStats st;
        uint64_t ttft[3], itl[3];

        server_stats(sv->srv, &st, NULL);
        server_latencies(sv->srv, ttft, itl);
        *ret = (BusStats){
                .requests_total = st.submitted,
                .requests_finished = st.finished - st.cancelled,
                .requests_cancelled = st.cancelled,
                .requests_failed = st.failed,
                .prompt_tokens_total = st.prompt_tokens,
                .generated_tokens_total = st.generated_tokens,
                .reloads_total = sv->reloads,
                .ttft_p50_usec = ttft[0],
                .ttft_p90_usec = ttft[1],
                .ttft_p99_usec = ttft[2],
                .token_p50_usec = itl[0],
                .token_p90_usec = itl[1],
                .token_p99_usec = itl[2],
        };
}

typedef struct ListCtx {
        BusClientFn fn;
        void *ctx;
} ListCtx;

static int list_one(void *ctx, const Session *c)
{
        ListCtx *x = ctx;
        BusClient bc = {
                .id = SERVER_CLIENT_ID_BIT | c->key,
                .pid = (uint32_t) c->cred.pid,
                .uid = (uint32_t) c->cred.uid,
                .comm = c->comm,
                .active_requests = c->n_requests,
                .requests_total = c->requests_total,
                .tokens_total = c->tokens_total,
        };
        return x->fn(x->ctx, &bc);
}

static int op_list_clients(void *userdata, BusClientFn fn, void *ctx)
{
        Service *sv = userdata;
        ListCtx x = {fn, ctx};

        return server_foreach_client(sv->srv, list_one, &x);
}

static int op_drain(void *userdata, DsError *err)
{
        Service *sv = userdata;

        if (sv->stopping)
                return ds_error(err, -ESHUTDOWN, "the daemon is stopping");
        sv->drained = true;
        server_set_draining(sv->srv, true);
        log_notice("Draining: new requests are refused until resumed");
        (void) notify_status("draining: new requests are refused until 'dsctl resume'");
        state_changed(sv);
        return 0;
}

static int op_resume(void *userdata, DsError *err)
{
        Service *sv = userdata;

        if (sv->stopping)
                return ds_error(err, -ESHUTDOWN, "the daemon is stopping");
        sv->drained = false;
        /* A drain-then-switch reload keeps refusing until its model is loaded. */
        server_set_draining(sv->srv, sv->drain_then_load);
        log_notice("Resumed: admitting requests");
        (void) notify_status("%s %s", sv->model[0] ? "serving" : "no model", sv->model);
        state_changed(sv);
        return 0;
}

static int op_cancel(void *userdata, uint64_t id, DsError *err)
{
        Service *sv = userdata;
        int r = server_cancel(sv->srv, id);

        if (r == -ESRCH)
                return ds_error(err, r, "No request or client with id %" PRIu64, id);
        return r;
}

static int op_reload(void *userdata, const char *model, DsError *err)
{
        return service_reload_or_log(userdata, "Reload()", model, err);
}

static const BusOps service_bus_ops = {
        .get_info = op_get_info,
        .get_counters = op_get_counters,
        .get_stats = op_get_stats,
        .list_clients = op_list_clients,
        .reload = op_reload,
        .drain = op_drain,
        .resume = op_resume,
        .cancel = op_cancel,
};

/* ---- the server's hooks ---- */

static void hook_reload(void *userdata)
{
        Service *sv = userdata;
        DsError err = {};

        log_info("Received SIGHUP: reloading");
        (void) service_reload_or_log(sv, "SIGHUP", "", &err);
}

static void hook_stopping(void *userdata)
{
        Service *sv = userdata;

        sv->stopping = true;
        (void) notify_stopping("draining for shutdown");
        state_changed(sv);
}

static uint64_t hook_service(void *userdata)
{
        Service *sv = userdata;
        uint64_t v, wake = UINT64_MAX, now = now_usec();
        int r;

        if (sv->loading && read(sv->loader_fd, &v, sizeof(v)) == (ssize_t) sizeof(v))
                load_finish(sv);
        if (sv->drain_then_load && server_idle(sv->srv)) {
                log_info("Drained: freeing '%s' to load '%s'", sv->model, sv->load->cfg.model);
                server_drop_engine(sv->srv);
                sv->model[0] = 0;
                sv->drain_then_load = false;
                server_set_draining(sv->srv, sv->drained);
                r = load_start(sv);
                if (r < 0) {
                        log_error_errno(r, "Failed to start the loader thread: %m");
                        free(sv->load);
                        sv->load = NULL;
                        sv->failed = true;
                        (void) ready("failed: the loader thread did not start");
                }
                state_changed(sv);
        }
        if (sv->bus) {
                uint64_t t;
                r = bus_process(sv->bus);
                if (r < 0)
                        log_error_errno(r, "Failed to process the bus connection: %m");
                server_watch(sv->srv, 0, bus_get_fd(sv->bus), bus_get_events(sv->bus));
                if (bus_get_timeout_usec(sv->bus, &t) >= 0)
                        wake = MIN(wake, t);
        }

        /* After the bus: a Reload() call starts the loader, whose end must wake this
         * thread even when nothing else happens meanwhile. */
        if (sv->loading)
                server_watch(sv->srv, 1, sv->loader_fd, POLLIN);
        else if (sv->drain_then_load)
                wake = MIN(wake, now + 10000);

        /* Without an engine loop the I/O thread keeps systemd's watchdog fed. */
        if (sv->watchdog_usec > 0 && !server_engine(sv->srv)) {
                if (now - sv->watchdog_last_usec >= sv->watchdog_usec) {
                        sv->watchdog_last_usec = now;
                        watchdog_ping();
                }
                wake = MIN(wake, sv->watchdog_last_usec + sv->watchdog_usec);
        }
        return wake;
}

/* ---- running ---- */

static int server_options_of(const DsdConfig *c, const ServiceOptions *o, const HttpConfig *http,
        ServerOptions *ret, DsError *err)
{
        server_options_init(ret);
        ret->socket_path = c->socket_path;
        ret->socket_mode = c->socket_mode;
        if (c->n_allowed_uids + c->n_allowed_gids > 0) {
                ret->n_allow_uids = c->n_allowed_uids;
                memcpy(ret->allow_uids, c->allowed_uids, c->n_allowed_uids * sizeof(uid_t));
                ret->n_allow_gids = c->n_allowed_gids;
                memcpy(ret->allow_gids, c->allowed_gids, c->n_allowed_gids * sizeof(gid_t));
        }
        ret->max_requests = c->limits.client_max_requests;
        /* The bytes bound in records of the wire's slot size. */
        ret->max_pending = (uint32_t) MIN((uint64_t) c->limits.client_max_pending_events,
                MAX(c->limits.client_max_pending_bytes / DS_WIRE_SLOT_SIZE, (uint64_t) 1));
        if (o->max_clients)
                ret->max_clients = o->max_clients;
        if (o->slow_timeout_ms)
                ret->slow_timeout_ms = o->slow_timeout_ms;
        /* the scheduler's bound, its default for 0 included, as the welcome reports it */
        SchedLimits lim;
        DsError ignored = {}; /* load_finish reports bad limits */
        limits_of(c, o, &lim);
        (void) sched_limits_check(&lim, &ignored);
        ret->max_queue = lim.max_queued;
        ret->stop_drain_usec = (uint64_t) c->stop_timeout_sec * 1000000;
        ret->http = http;
        int r = notify_listen_fd(c->socket_path, err);
        if (r < 0 && r != -ENOENT)
                return r;
        ret->listen_fd = r < 0 ? -1 : r;
        return 0;
}

int service_run(const ServiceOptions *o, const DsdConfig *c)
{
        _cleanup_free_ Service *sv = NULL;
        _cleanup_close_ int notify_fd = -EBADF, loader_fd = -EBADF;
        ServerOptions so;
        DsError err = {};
        sigset_t mask;
        int r;

        sv = calloc(1, sizeof(*sv));
        if (!sv)
                return log_error_errno(-ENOMEM, "Out of memory");
        sv->opt = o;
        sv->cfg = *c;
        sv->watchdog_usec = notify_watchdog_usec() / 2;
        http_config_init(&sv->http);
        if (c->http[0]) {
                cJSON *j = cJSON_Parse(c->http);
                r = j ? http_config_parse(j, &sv->http, &err) : -EINVAL;
                cJSON_Delete(j);
                if (r < 0)
                        return log_error_errno(r, "%s: %s",
                                o->config_path ? o->config_path : "--http-config", err.msg);
        }

        /* Blocked in every thread (the engine and loader threads inherit the mask): the
         * I/O thread reads them from its signalfd. A client that vanishes must not kill
         * us either. */
        sigemptyset(&mask);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGINT);
        sigaddset(&mask, SIGHUP);
        r = pthread_sigmask(SIG_BLOCK, &mask, NULL);
        if (r != 0)
                return log_error_errno(-r, "Failed to block SIGTERM, SIGINT and SIGHUP: %m");
        signal(SIGPIPE, SIG_IGN);

        notify_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        loader_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (notify_fd < 0 || loader_fd < 0)
                return log_error_errno(-errno, "Failed to create an eventfd: %m");
        sv->notify_fd = notify_fd;
        sv->loader_fd = loader_fd;

        r = server_options_of(c, o, &sv->http, &so, &err);
        if (r < 0)
                return log_error_errno(r, "%s", err.msg);
        ServerHooks hooks = {
                .userdata = sv,
                .reload = hook_reload,
                .stopping = hook_stopping,
                .service = hook_service,
        };
        r = server_new(notify_fd, &so, &hooks, &sv->srv, &err);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the server: %s", err.msg);

        if (c->bus != CONFIG_BUS_NONE) {
                BusOptions bo = {
                        .user_bus = c->bus == CONFIG_BUS_SESSION,
                        .version = DSD_VERSION,
                        .started_at_usec = (uint64_t) time(NULL) * 1000000,
                        .admin_gid = c->n_allowed_gids > 0 ? c->allowed_gids[0] : (gid_t) -1,
                };
                r = bus_new(&bo, &service_bus_ops, sv, &sv->bus, &err);
                if (r < 0) {
                        log_error_errno(r, "Failed to connect to the %s bus: %s",
                                config_bus_to_string(c->bus), err.msg);
                        sv->srv = server_free(sv->srv);
                        return r;
                }
        }

        log_info("Listening on %s%s, bus %s", c->socket_path,
                so.listen_fd >= 0 ? " (from systemd)" : "", config_bus_to_string(c->bus));
        if (c->model[0]) {
                sv->initial = true;
                sv->load = malloc(sizeof(*sv->load));
                if (!sv->load)
                        r = -ENOMEM;
                else {
                        load_init(sv, c, sv->load);
                        r = load_start(sv);
                }
                if (r < 0) {
                        log_error_errno(r, "Failed to start loading: %m");
                        free(sv->load);
                        sv->load = NULL;
                        sv->bus = bus_free(sv->bus);
                        sv->srv = server_free(sv->srv);
                        return r;
                }
        } else {
                log_notice("No model configured: state no-model until 'dsctl reload MODEL'");
                server_accept(sv->srv);
                (void) ready("no model configured; waiting for a reload");
        }
        state_changed(sv);

        r = server_run(sv->srv);
        if (sv->loading) {
                /* A load cannot be interrupted: wait for it, then drop its result. */
                pthread_join(sv->loader, NULL);
                engine_free(sv->load->engine);
        }
        free(sv->load);
        sv->load = NULL;
        sv->bus = bus_free(sv->bus);
        sv->srv = server_free(sv->srv);
        if (r < 0)
                return r;
        log_info("Stopped");
        return sv->exit_status == EXIT_SUCCESS ? 0 : -ECANCELED;
}
