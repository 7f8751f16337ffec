/* SPDX-License-Identifier: MIT */
/* io.dsd.Daemon1 at /io/dsd/Daemon1: the properties, the methods and their credential
 * check, after systemd's resolved-bus.c. The daemon's state comes through BusOps. */
#include "bus.h"

#include <assert.h>
#include <grp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if HAVE_LIBSYSTEMD
#include <systemd/sd-bus.h>
#endif

static const char *const bus_state_names[_BUS_STATE_MAX] = {
        [BUS_STATE_LOADING] = "loading",
        [BUS_STATE_READY] = "ready",
        [BUS_STATE_RELOADING] = "reloading",
        [BUS_STATE_DRAINING] = "draining",
        [BUS_STATE_NO_MODEL] = "no-model",
        [BUS_STATE_FAILED] = "failed",
};

const char *bus_state_to_string(BusState s)
{
        return s >= 0 && s < _BUS_STATE_MAX ? bus_state_names[s] : NULL;
}

/* The one table from codes to D-Bus error names; anything else is Failed. */
static const struct {
        int code;
        const char *name;
} bus_errors[] = {
        {-EACCES, "org.freedesktop.DBus.Error.AccessDenied"},
        {-EPERM, "org.freedesktop.DBus.Error.AccessDenied"},
        {-EINVAL, "org.freedesktop.DBus.Error.InvalidArgs"},
        {-ENOMEM, "org.freedesktop.DBus.Error.NoMemory"},
        {-EBUSY, BUS_ERROR_BUSY},
        {-ESRCH, BUS_ERROR_NO_SUCH_REQUEST},
        {-DS_ERR_MODEL_NOT_LOADED, BUS_ERROR_NO_MODEL},
        {-DS_ERR_FORMAT, BUS_ERROR_LOAD_FAILED},
        {-DS_ERR_UNSUPPORTED, BUS_ERROR_LOAD_FAILED},
        {-ENOENT, BUS_ERROR_LOAD_FAILED},
};

const char *bus_error_name(int code)
{
        for (size_t i = 0; i < ELEMENTSOF(bus_errors); i++)
                if (bus_errors[i].code == code)
                        return bus_errors[i].name;
        return "org.freedesktop.DBus.Error.Failed";
}

#if HAVE_LIBSYSTEMD

struct Bus {
        sd_bus *bus;
        const BusOps *ops;
        void *userdata;
        char *version;
        uint64_t started_at_usec;
        gid_t admin_gid;            /* (gid_t) -1: no group besides root and our own uid */
        sd_bus_message *reload_msg; /* the Reload() call awaiting bus_reload_done() */

        /* What PropertiesChanged last announced, to emit only what differs. */
        BusState last_state;
        uint32_t last_context_length;
        uint64_t last_kv_bytes_per_token;
        char *last_model, *last_backend, *last_device, *last_architecture;
};

static void bus_get_info(Bus *b, BusInfo *ret)
{
        *ret = (BusInfo){.state = BUS_STATE_NO_MODEL};
        b->ops->get_info(b->userdata, ret);
        if (!ret->model)
                ret->model = "";
        if (!ret->backend)
                ret->backend = "";
        if (!ret->device)
                ret->device = "";
        if (!ret->architecture)
                ret->architecture = "";
}

/* Sets error from a code and the daemon's message, and returns the negative errno sd-bus
 * derives from the error name, as method handlers return. */
static int bus_reply_code(sd_bus_error *error, int code, const DsError *err)
{
        const char *msg =
                err && err->code == code && err->msg[0] ? err->msg : ds_strerror_internal(code);

        return sd_bus_error_set(error, bus_error_name(code), msg);
}

/* Whether the sender may change the daemon: root, the daemon's own uid, or a member of
 * the admin group. The bus policy file says the same, but it can be loosened by a local
 * administrator or absent on a session bus, so the object checks again. The uid comes from
 * the bus (SO_PEERCRED); the groups from the bus where it reports them (dbus >= 1.15.2),
 * else from /proc/PID/status (SD_BUS_CREDS_AUGMENT), which is what systemd does too. */
static int bus_check_caller(Bus *b, sd_bus_message *m, sd_bus_error *error)
{
        __attribute__((cleanup(sd_bus_creds_unrefp))) sd_bus_creds *creds = NULL;
        const gid_t *gids;
        gid_t egid;
        uid_t uid;
        int r, n;

        r = sd_bus_query_sender_creds(m,
                SD_BUS_CREDS_EUID | SD_BUS_CREDS_EGID | SD_BUS_CREDS_SUPPLEMENTARY_GIDS |
                        SD_BUS_CREDS_AUGMENT,
                &creds);
        if (r < 0)
                return r;
        r = sd_bus_creds_get_euid(creds, &uid);
        if (r < 0)
                return r;
        if (uid == 0 || uid == geteuid())
                return 0;
        if (b->admin_gid != (gid_t) -1) {
                if (sd_bus_creds_get_egid(creds, &egid) >= 0 && egid == b->admin_gid)
                        return 0;
                n = sd_bus_creds_get_supplementary_gids(creds, &gids);
                for (int i = 0; i < n; i++)
                        if (gids[i] == b->admin_gid)
                                return 0;
        }
        return sd_bus_error_setf(error, SD_BUS_ERROR_ACCESS_DENIED,
                "Access to %s.%s() denied: uid %u is not root and not in the daemon's admin "
                "group",
                sd_bus_message_get_interface(m), sd_bus_message_get_member(m), (unsigned) uid);
}

// --- Properties ------------------------------------------------------------------------

/* All the model properties come from one bus_get_info() snapshot, as the counters below
 * come from one get_counters(); the property name picks one. */
static int bus_property_get_info(sd_bus *bus, const char *path, const char *interface,
        const char *property, sd_bus_message *reply, void *userdata, sd_bus_error *error)
{
        Bus *b = userdata;
        BusInfo info;

        assert(reply);
        assert(b);

        bus_get_info(b, &info);
        if (strcmp(property, "State") == 0) {
                const char *s = bus_state_to_string(info.state);
                return sd_bus_message_append(reply, "s", s ? s : "failed");
        }
        if (strcmp(property, "Model") == 0)
                return sd_bus_message_append(reply, "s", info.model);
        if (strcmp(property, "Backend") == 0)
                return sd_bus_message_append(reply, "s", info.backend);
        if (strcmp(property, "Device") == 0)
                return sd_bus_message_append(reply, "s", info.device);
        if (strcmp(property, "ContextLength") == 0)
                return sd_bus_message_append(reply, "u", info.context_length);
        if (strcmp(property, "Architecture") == 0)
                return sd_bus_message_append(reply, "s", info.architecture);
        if (strcmp(property, "KVBytesPerToken") == 0)
                return sd_bus_message_append(reply, "t", info.kv_bytes_per_token);
        return -ENOENT;
}

static int bus_property_get_version(sd_bus *bus, const char *path, const char *interface,
        const char *property, sd_bus_message *reply, void *userdata, sd_bus_error *error)
{
        Bus *b = userdata;

        assert(reply);
        assert(b);

        return sd_bus_message_append(reply, "s", b->version);
}

static int bus_property_get_started_at(sd_bus *bus, const char *path, const char *interface,
        const char *property, sd_bus_message *reply, void *userdata, sd_bus_error *error)
{
        Bus *b = userdata;

        assert(reply);
        assert(b);

        return sd_bus_message_append(reply, "t", b->started_at_usec);
}

/* All the counters come from one get_counters() call; the property name picks one. */
static int bus_property_get_counter(sd_bus *bus, const char *path, const char *interface,
        const char *property, sd_bus_message *reply, void *userdata, sd_bus_error *error)
{
        Bus *b = userdata;
        BusCounters c = {};

        assert(reply);
        assert(b);

        b->ops->get_counters(b->userdata, &c);
        if (strcmp(property, "ActiveRequests") == 0)
                return sd_bus_message_append(reply, "u", c.active_requests);
        if (strcmp(property, "QueuedRequests") == 0)
                return sd_bus_message_append(reply, "u", c.queued_requests);
        if (strcmp(property, "Clients") == 0)
                return sd_bus_message_append(reply, "u", c.clients);
        if (strcmp(property, "KVBlocksTotal") == 0)
                return sd_bus_message_append(reply, "t", c.kv_blocks_total);
        if (strcmp(property, "KVBlocksFree") == 0)
                return sd_bus_message_append(reply, "t", c.kv_blocks_free);
        if (strcmp(property, "GPUMemoryUsed") == 0)
                return sd_bus_message_append(reply, "t", c.gpu_memory_used);
        if (strcmp(property, "GPUMemoryTotal") == 0)
                return sd_bus_message_append(reply, "t", c.gpu_memory_total);
        if (strcmp(property, "TokensPerSecond") == 0)
                return sd_bus_message_append(reply, "d", c.tokens_per_second);
        return -ENOENT;
}

// --- Methods ---------------------------------------------------------------------------

static int bus_method_reload(sd_bus_message *m, void *userdata, sd_bus_error *error)
{
        Bus *b = userdata;
        DsError err = {};
        const char *model;
        int r;

        assert(m);
        assert(b);

        r = sd_bus_message_read(m, "s", &model);
        if (r < 0)
                return r;
        r = bus_check_caller(b, m, error);
        if (r < 0)
                return r;
        if (model[0] && model[0] != '/')
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                        "Model must be an absolute directory path or empty, got '%s'", model);
        if (b->reload_msg)
                return sd_bus_error_set(error, BUS_ERROR_BUSY, "A reload is already in progress");

        /* Set before calling: the daemon may complete the reload from inside the call. */
        b->reload_msg = sd_bus_message_ref(m);
        r = b->ops->reload(b->userdata, model, &err);
        if (r < 0) {
                b->reload_msg = sd_bus_message_unref(b->reload_msg);
                return bus_reply_code(error, r, &err);
        }
        /* No reply now: bus_reload_done() sends it once the new model serves or failed. */
        return 1;
}

/* Drain(), Resume() and Cancel(t) check the caller, act, and reply with nothing; Drain and
 * Resume also announce the state they leave. */
static int bus_state_method(
        sd_bus_message *m, Bus *b, int (*op)(void *userdata, DsError *err), sd_bus_error *error)
{
        DsError err = {};
        int r;

        assert(m);

        r = bus_check_caller(b, m, error);
        if (r < 0)
                return r;
        r = op(b->userdata, &err);
        if (r < 0)
                return bus_reply_code(error, r, &err);
        r = bus_info_changed(b);
        if (r < 0)
                return r;
        return sd_bus_reply_method_return(m, NULL);
}

static int bus_method_drain(sd_bus_message *m, void *userdata, sd_bus_error *error)
{
        Bus *b = userdata;

        assert(b);
        return bus_state_method(m, b, b->ops->drain, error);
}

static int bus_method_resume(sd_bus_message *m, void *userdata, sd_bus_error *error)
{
        Bus *b = userdata;

        assert(b);
        return bus_state_method(m, b, b->ops->resume, error);
}

static int bus_method_cancel(sd_bus_message *m, void *userdata, sd_bus_error *error)
{
        Bus *b = userdata;
        DsError err = {};
        uint64_t id;
        int r;

        assert(m);
        assert(b);

        r = sd_bus_message_read(m, "t", &id);
        if (r < 0)
                return r;
        r = bus_check_caller(b, m, error);
        if (r < 0)
                return r;
        r = b->ops->cancel(b->userdata, id, &err);
        if (r < 0)
                return bus_reply_code(error, r, &err);
        return sd_bus_reply_method_return(m, NULL);
}

static int bus_append_client(void *ctx, const BusClient *c)
{
        sd_bus_message *reply = ctx;

        return sd_bus_message_append(reply, "(tuusutt)", c->id, c->pid, c->uid,
                c->comm ? c->comm : "", c->active_requests, c->requests_total, c->tokens_total);
}

static int bus_method_list_clients(sd_bus_message *m, void *userdata, sd_bus_error *error)
{
        __attribute__((cleanup(sd_bus_message_unrefp))) sd_bus_message *reply = NULL;
        Bus *b = userdata;
        int r;

        assert(m);
        assert(b);

        r = sd_bus_message_new_method_return(m, &reply);
        if (r < 0)
                return r;
        r = sd_bus_message_open_container(reply, 'a', "(tuusutt)");
        if (r < 0)
                return r;
        r = b->ops->list_clients(b->userdata, bus_append_client, reply);
        if (r < 0)
                return r;
        r = sd_bus_message_close_container(reply);
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}

static int bus_method_get_stats(sd_bus_message *m, void *userdata, sd_bus_error *error)
{
        __attribute__((cleanup(sd_bus_message_unrefp))) sd_bus_message *reply = NULL;
        Bus *b = userdata;
        BusStats s = {};
        int r;

        assert(m);
        assert(b);

        b->ops->get_stats(b->userdata, &s);
        const struct {
                const char *name;
                uint64_t value;
        } items[] = {
                {"RequestsTotal", s.requests_total},
                {"RequestsFinished", s.requests_finished},
                {"RequestsCancelled", s.requests_cancelled},
                {"RequestsFailed", s.requests_failed},
                {"PromptTokensTotal", s.prompt_tokens_total},
                {"GeneratedTokensTotal", s.generated_tokens_total},
                {"ReloadsTotal", s.reloads_total},
                {"TimeToFirstTokenP50USec", s.ttft_p50_usec},
                {"TimeToFirstTokenP90USec", s.ttft_p90_usec},
                {"TimeToFirstTokenP99USec", s.ttft_p99_usec},
                {"InterTokenP50USec", s.token_p50_usec},
                {"InterTokenP90USec", s.token_p90_usec},
                {"InterTokenP99USec", s.token_p99_usec},
        };

        r = sd_bus_message_new_method_return(m, &reply);
        if (r < 0)
                return r;
        r = sd_bus_message_open_container(reply, 'a', "{sv}");
        if (r < 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(items); i++) {
                r = sd_bus_message_append(reply, "{sv}", items[i].name, "t", items[i].value);
                if (r < 0)
                        return r;
        }
        r = sd_bus_message_close_container(reply);
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}

/* State, Model, Backend, Device, ContextLength, Architecture and KVBytesPerToken change
 * with loads and are announced;
 * Version and StartedAt never change for the process, so they are CONST and clients may
 * cache them. The counters change every decode step: no flag means no PropertiesChanged
 * (the introspection data says EmitsChangedSignal=false), so clients poll them. Every
 * method is UNPRIVILEGED because sd-bus would otherwise demand CAP_SYS_ADMIN on the system
 * bus; the mutating ones check the caller in bus_check_caller(). */
static const sd_bus_vtable bus_daemon_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_PROPERTY(
                "State", "s", bus_property_get_info, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY(
                "Model", "s", bus_property_get_info, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY(
                "Backend", "s", bus_property_get_info, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY(
                "Device", "s", bus_property_get_info, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("Version", "s", bus_property_get_version, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY(
                "StartedAt", "t", bus_property_get_started_at, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("ContextLength", "u", bus_property_get_info, 0,
                SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY(
                "Architecture", "s", bus_property_get_info, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("KVBytesPerToken", "t", bus_property_get_info, 0,
                SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("ActiveRequests", "u", bus_property_get_counter, 0, 0),
        SD_BUS_PROPERTY("QueuedRequests", "u", bus_property_get_counter, 0, 0),
        SD_BUS_PROPERTY("Clients", "u", bus_property_get_counter, 0, 0),
        SD_BUS_PROPERTY("KVBlocksTotal", "t", bus_property_get_counter, 0, 0),
        SD_BUS_PROPERTY("KVBlocksFree", "t", bus_property_get_counter, 0, 0),
        SD_BUS_PROPERTY("GPUMemoryUsed", "t", bus_property_get_counter, 0, 0),
        SD_BUS_PROPERTY("GPUMemoryTotal", "t", bus_property_get_counter, 0, 0),
        SD_BUS_PROPERTY("TokensPerSecond", "d", bus_property_get_counter, 0, 0),
        SD_BUS_METHOD_WITH_ARGS("Reload", SD_BUS_ARGS("s", model), SD_BUS_NO_RESULT,
                bus_method_reload, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Drain", SD_BUS_NO_ARGS, SD_BUS_NO_RESULT, bus_method_drain,
                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Resume", SD_BUS_NO_ARGS, SD_BUS_NO_RESULT, bus_method_resume,
                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ListClients", SD_BUS_NO_ARGS, SD_BUS_RESULT("a(tuusutt)", clients),
                bus_method_list_clients, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("GetStats", SD_BUS_NO_ARGS, SD_BUS_RESULT("a{sv}", stats),
                bus_method_get_stats, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Cancel", SD_BUS_ARGS("t", id), SD_BUS_NO_RESULT, bus_method_cancel,
                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_VTABLE_END,
};

// --- The connection --------------------------------------------------------------------

int bus_new(const BusOptions *opt, const BusOps *ops, void *userdata, Bus **ret, DsError *err)
{
        _cleanup_(bus_freep) Bus *b = NULL;
        int r;

        if (!opt || !ops || !ops->get_info || !ops->get_counters || !ops->get_stats ||
                !ops->list_clients || !ops->reload || !ops->drain || !ops->resume || !ops->cancel ||
                !ret)
                return -EINVAL;

        b = calloc(1, sizeof(*b));
        if (!b)
                return ds_error(err, -ENOMEM, "out of memory");
        b->ops = ops;
        b->userdata = userdata;
        b->started_at_usec = opt->started_at_usec;
        b->version = strdup(opt->version ? opt->version : "");
        if (!b->version)
                return ds_error(err, -ENOMEM, "out of memory");
        b->admin_gid = opt->admin_gid;
        if (b->admin_gid == (gid_t) -1) {
                struct group *g = getgrnam("dsd");
                if (g)
                        b->admin_gid = g->gr_gid;
        }
        /* Announce the first state as a change from an impossible one. */
        b->last_state = _BUS_STATE_INVALID;

        r = opt->user_bus ? sd_bus_open_user(&b->bus) : sd_bus_open_system(&b->bus);
        if (r < 0)
                return ds_error(err, r, "Failed to connect to the %s bus: %s",
                        opt->user_bus ? "session" : "system", strerror(-r));
        r = sd_bus_add_object_vtable(b->bus, NULL, BUS_PATH, BUS_INTERFACE, bus_daemon_vtable, b);
        if (r < 0)
                return ds_error(err, r, "Failed to add the %s object: %s", BUS_PATH, strerror(-r));
        r = sd_bus_request_name(b->bus, BUS_NAME, 0);
        if (r < 0)
                return ds_error(err, r, "Failed to acquire the bus name %s: %s%s", BUS_NAME,
                        strerror(-r),
                        r == -EEXIST   ? " (is another dsd running?)"
                        : r == -EACCES ? " (is the D-Bus policy io.dsd.Daemon1.conf installed?)"
                                       : "");
        r = bus_info_changed(b);
        if (r < 0)
                return ds_error(err, r, "Failed to read the daemon state: %s", strerror(-r));

        *ret = TAKE_PTR(b);
        return 0;
}

Bus *bus_free(Bus *b)
{
        if (!b)
                return NULL;
        /* A Reload() caller waits for an answer; give it one rather than a timeout. */
        bus_reload_done(b, -ECANCELED, "The daemon is shutting down");
        sd_bus_flush_close_unref(b->bus);
        free(b->version);
        free(b->last_model);
        free(b->last_backend);
        free(b->last_device);
        free(b->last_architecture);
        free(b);
        return NULL;
}

int bus_get_fd(Bus *b)
{
        return b ? sd_bus_get_fd(b->bus) : -EINVAL;
}

int bus_get_events(Bus *b)
{
        return b ? sd_bus_get_events(b->bus) : -EINVAL;
}

int bus_get_timeout_usec(Bus *b, uint64_t *ret)
{
        return b && ret ? sd_bus_get_timeout(b->bus, ret) : -EINVAL;
}

int bus_process(Bus *b)
{
        int r;

        if (!b)
                return -EINVAL;
        do {
                r = sd_bus_process(b->bus, NULL);
        } while (r > 0);
        return r;
}

/* Replaces *s with a copy of v when they differ; returns 1 when changed, -ENOMEM. */
static int update_string(char **s, const char *v)
{
        char *n;

        if (*s && strcmp(*s, v) == 0)
                return 0;
        n = strdup(v);
        if (!n)
                return -ENOMEM;
        free(*s);
        *s = n;
        return 1;
}

int bus_info_changed(Bus *b)
{
        const char *changed[9];
        size_t n = 0;
        BusInfo info;
        int r;

        if (!b)
                return -EINVAL;
        bus_get_info(b, &info);
        if (info.state != b->last_state) {
                b->last_state = info.state;
                changed[n++] = "State";
        }
        if (info.context_length != b->last_context_length) {
                b->last_context_length = info.context_length;
                changed[n++] = "ContextLength";
        }
        if (info.kv_bytes_per_token != b->last_kv_bytes_per_token) {
                b->last_kv_bytes_per_token = info.kv_bytes_per_token;
                changed[n++] = "KVBytesPerToken";
        }
        r = update_string(&b->last_model, info.model);
        if (r < 0)
                return r;
        if (r > 0)
                changed[n++] = "Model";
        r = update_string(&b->last_backend, info.backend);
        if (r < 0)
                return r;
        if (r > 0)
                changed[n++] = "Backend";
        r = update_string(&b->last_device, info.device);
        if (r < 0)
                return r;
        if (r > 0)
                changed[n++] = "Device";
        r = update_string(&b->last_architecture, info.architecture);
        if (r < 0)
                return r;
        if (r > 0)
                changed[n++] = "Architecture";
        if (n == 0)
                return 0;
        changed[n] = NULL;
        return sd_bus_emit_properties_changed_strv(
                b->bus, BUS_PATH, BUS_INTERFACE, (char **) changed);
}

void bus_reload_done(Bus *b, int error, const char *message)
{
        __attribute__((cleanup(sd_bus_message_unrefp))) sd_bus_message *m = NULL;

        if (!b || !b->reload_msg)
                return;
        m = TAKE_PTR(b->reload_msg);
        /* The caller may have gone away meanwhile; nobody is left to tell, so a failed
         * reply is dropped. */
        if (error >= 0)
                (void) sd_bus_reply_method_return(m, NULL);
        else
                (void) sd_bus_reply_method_errorf(m, bus_error_name(error), "%s",
                        message ? message : ds_strerror_internal(error));
}

#else /* !HAVE_LIBSYSTEMD */

/* Built without libsystemd: the daemon runs with bus "none" only. */
struct Bus {
        int unused;
};

int bus_new(const BusOptions *opt, const BusOps *ops, void *userdata, Bus **ret, DsError *err)
{
        return ds_error(err, -EOPNOTSUPP, "dsd was built without libsystemd: no D-Bus");
}

Bus *bus_free(Bus *b)
{
        return NULL;
}

int bus_get_fd(Bus *b)
{
        return -EOPNOTSUPP;
}

int bus_get_events(Bus *b)
{
        return -EOPNOTSUPP;
}

int bus_get_timeout_usec(Bus *b, uint64_t *ret)
{
        return -EOPNOTSUPP;
}

int bus_process(Bus *b)
{
        return -EOPNOTSUPP;
}

int bus_info_changed(Bus *b)
{
        return 0;
}

void bus_reload_done(Bus *b, int error, const char *message)
{
}

#endif
