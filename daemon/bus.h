/* SPDX-License-Identifier: MIT */
/* The io.dsd.Daemon1 D-Bus object (sd-bus). The object does not know the server: it reads
 * the daemon's state through the BusOps getters and acts through the BusOps actions, which
 * the daemon fills in. Everything here runs on the thread that calls bus_process(), and the
 * ops are called from inside bus_process() only.
 *
 * The daemon drives the connection from its own loop: poll bus_get_fd() for
 * bus_get_events() until bus_get_timeout_usec(), then call bus_process(). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "error.h"

#define BUS_NAME      "io.dsd.Daemon1"
#define BUS_PATH      "/io/dsd/Daemon1"
#define BUS_INTERFACE "io.dsd.Daemon1"

/* Error names beyond org.freedesktop.DBus.Error.*, for codes bus_error_name() maps. */
#define BUS_ERROR_BUSY            "io.dsd.Daemon1.Error.Busy"          /* -EBUSY */
#define BUS_ERROR_NO_SUCH_REQUEST "io.dsd.Daemon1.Error.NoSuchRequest" /* -ESRCH */
#define BUS_ERROR_NO_MODEL        "io.dsd.Daemon1.Error.NoModel"    /* -DS_ERR_MODEL_NOT_LOADED */
#define BUS_ERROR_LOAD_FAILED     "io.dsd.Daemon1.Error.LoadFailed" /* -DS_ERR_FORMAT etc. */

typedef enum BusState {
        BUS_STATE_LOADING,   /* the first model is being loaded; nothing is served yet */
        BUS_STATE_READY,     /* serving */
        BUS_STATE_RELOADING, /* serving the old model while the new one loads */
        BUS_STATE_DRAINING,  /* not admitting; in-flight requests finish */
        BUS_STATE_NO_MODEL,  /* no model configured or loaded; waiting for Reload */
        BUS_STATE_FAILED,    /* the model failed to load and nothing is served */
        _BUS_STATE_MAX,
        _BUS_STATE_INVALID = -EINVAL,
} BusState;

const char *bus_state_to_string(BusState s);

/* The change-signalled properties. The strings belong to the daemon and need only stay
 * valid until get_info returns to its caller; NULL reads as "". */
typedef struct BusInfo {
        BusState state;
        const char *model;           /* the model directory being served, "" for none */
        const char *backend;         /* "cpu", "cuda", "" before a model is loaded */
        const char *device;          /* a human name: "cpu (16 threads)", "NVIDIA H200 (0)" */
        uint32_t context_length;     /* positions per sequence, 0 without a model */
        const char *architecture;    /* config.json's, "DeepseekV2ForCausalLM"; "" for none */
        uint64_t kv_bytes_per_token; /* KV cache bytes per position, all layers; 0 for none */
} BusInfo;

/* Counters that change with every step; their properties are not change-signalled, so
 * clients poll them. */
typedef struct BusCounters {
        uint32_t active_requests; /* in a batch */
        uint32_t queued_requests; /* admitted, waiting for a batch slot */
        uint32_t clients;         /* connected libdsclient clients */
        uint64_t kv_blocks_total;
        uint64_t kv_blocks_free;
        uint64_t gpu_memory_used;  /* bytes; 0 on the CPU backend */
        uint64_t gpu_memory_total; /* bytes; 0 on the CPU backend */
        double tokens_per_second;  /* generated tokens, averaged over the last seconds */
} BusCounters;

/* One entry of ListClients(), signature a(tuusutt) in this order. */
typedef struct BusClient {
        uint64_t id; /* what Cancel() takes to cancel all of this client's requests */
        uint32_t pid;
        uint32_t uid;
        const char *comm; /* process name from /proc/PID/comm at connect time */
        uint32_t active_requests;
        uint64_t requests_total;
        uint64_t tokens_total; /* prompt plus generated */
} BusClient;

/* GetStats() returns these as a{sv} under the names in bus.c (bus_method_get_stats), each
 * a "t". Latencies are microseconds; 0 when no sample exists yet. */
typedef struct BusStats {
        uint64_t requests_total;
        uint64_t requests_finished;
        uint64_t requests_cancelled;
        uint64_t requests_failed;
        uint64_t prompt_tokens_total;
        uint64_t generated_tokens_total;
        uint64_t reloads_total;
        uint64_t ttft_p50_usec, ttft_p90_usec, ttft_p99_usec;    /* time to first token */
        uint64_t token_p50_usec, token_p90_usec, token_p99_usec; /* between tokens */
} BusStats;

/* Appends one client to the ListClients() reply; returns < 0 to stop the listing. */
typedef int (*BusClientFn)(void *ctx, const BusClient *c);

/* What the daemon provides. Getters cannot fail; actions return 0 or a negative code and
 * may fill err with a message for the caller (else ds_strerror_internal() is used). The
 * bus has already checked the caller's credentials before calling an action. */
typedef struct BusOps {
        void (*get_info)(void *userdata, BusInfo *ret);
        void (*get_counters)(void *userdata, BusCounters *ret);
        void (*get_stats)(void *userdata, BusStats *ret);
        /* Calls fn once per connected client. */
        int (*list_clients)(void *userdata, BusClientFn fn, void *ctx);
        /* Starts a reload of the configuration, switching to model when it is not "".
         * Returning 0 promises exactly one bus_reload_done() later (possibly before
         * returning); returning < 0 refuses now and bus_reload_done() must not be
         * called. */
        int (*reload)(void *userdata, const char *model, DsError *err);
        int (*drain)(void *userdata, DsError *err);
        int (*resume)(void *userdata, DsError *err);
        /* id is a request id or a client id (BusClient.id); -ESRCH when neither exists. */
        int (*cancel)(void *userdata, uint64_t id, DsError *err);
} BusOps;

typedef struct BusOptions {
        bool user_bus;            /* the session bus instead of the system bus */
        const char *version;      /* the Version property */
        uint64_t started_at_usec; /* the StartedAt property, CLOCK_REALTIME */
        /* Besides root and the daemon's own uid, members of this group may call the
         * mutating methods. (gid_t) -1 looks up the group "dsd" (none if it is absent). */
        gid_t admin_gid;
} BusOptions;

typedef struct Bus Bus;

/* Connects, exports the object and takes the name BUS_NAME; -EEXIST when another process
 * owns it. ops and userdata must outlive the Bus. Fills err on failure. */
int bus_new(const BusOptions *opt, const BusOps *ops, void *userdata, Bus **ret, DsError *err);

/* Flushes queued messages, replies to a pending Reload with an error, and closes. */
Bus *bus_free(Bus *b);
DEFINE_TRIVIAL_CLEANUP_FUNC(Bus *, bus_free);

int bus_get_fd(Bus *b);
/* POLLIN / POLLOUT mask to wait for. */
int bus_get_events(Bus *b);
/* The CLOCK_MONOTONIC time by which bus_process() must run, UINT64_MAX for none. */
int bus_get_timeout_usec(Bus *b, uint64_t *ret);

/* Reads and dispatches everything pending; calls the ops. */
int bus_process(Bus *b);

/* Re-reads get_info and emits PropertiesChanged for the properties that differ from the
 * last emitted values. Call after every change of what BusInfo holds. */
int bus_info_changed(Bus *b);

/* Completes the Reload() call the last successful ops->reload started: error 0 replies
 * success, < 0 replies the error with message (NULL: the code's string). A no-op when no
 * Reload() call is pending (a reload started by SIGHUP). */
void bus_reload_done(Bus *b, int error, const char *message);

/* The D-Bus error name for a negative code, as every reply of this object uses. */
const char *bus_error_name(int code);
