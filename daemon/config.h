/* SPDX-License-Identifier: MIT */
/* /etc/dsd/dsd.json: the daemon's configuration. The file is read once at start and again on
 * every reload; command-line flags are applied on top with config_set(). Every field is
 * type- and range-checked and every message names the field and, for a file, its line and
 * column. The defaults and ranges live in one table in config.c (config_fields). */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "error.h"

#define CONFIG_FILE_MAX        (1u << 20) /* a config larger than this is refused unread */
#define CONFIG_IDS_MAX         64u        /* entries in socket.allowed_uids / allowed_gids */
#define CONFIG_SOCKET_PATH_MAX 108        /* sizeof(struct sockaddr_un.sun_path) */

typedef enum ConfigBackend {
        CONFIG_BACKEND_AUTO,
        CONFIG_BACKEND_CPU,
        CONFIG_BACKEND_CUDA,
        _CONFIG_BACKEND_MAX,
        _CONFIG_BACKEND_INVALID = -EINVAL,
} ConfigBackend;

typedef enum ConfigBus {
        CONFIG_BUS_SYSTEM,
        CONFIG_BUS_SESSION,
        CONFIG_BUS_NONE,
        _CONFIG_BUS_MAX,
        _CONFIG_BUS_INVALID = -EINVAL,
} ConfigBus;

typedef struct ConfigLimits {
        uint32_t context_length;            /* 0: the model's own max_position_embeddings */
        uint32_t max_batch;                 /* sequences decoded together */
        uint32_t queue_length;              /* requests waiting for a batch slot */
        double kv_memory_fraction;          /* of the free memory the KV cache may take */
        uint32_t client_max_requests;       /* requests one client may have in flight */
        uint32_t client_max_pending_events; /* undelivered events before a client stalls */
        uint64_t client_max_pending_bytes;  /* undelivered event bytes, same */
} ConfigLimits;

typedef struct DsdConfig {
        char model[PATH_MAX]; /* "" when absent: the daemon starts in state no-model */
        ConfigBackend backend;
        uint32_t device; /* CUDA device index; ignored by the CPU backend */
        bool quantize_at_load;
        bool lm_head_int8; /* the lm_head as 8-bit rows at load (daemon/model/q8_pack.h) */
        /* the CUDA backend screens greedy rows through an 8-bit copy of a dense FP16
         * lm_head (kernels/cuda/cuda_screen.cu) */
        bool lm_head_screen;
        ConfigLimits limits;
        char socket_path[CONFIG_SOCKET_PATH_MAX];
        mode_t socket_mode;
        uid_t allowed_uids[CONFIG_IDS_MAX]; /* empty: the socket's mode and group decide */
        size_t n_allowed_uids;
        gid_t allowed_gids[CONFIG_IDS_MAX];
        size_t n_allowed_gids;
        int log_level; /* LOG_LVL_* */
        ConfigBus bus;
        uint32_t stop_timeout_sec; /* SIGTERM's drain deadline, below TimeoutStopSec= */
        char http[4096]; /* the "http" object as JSON text, "" when absent (daemon/http) */
} DsdConfig;

const char *config_backend_to_string(ConfigBackend b);
const char *config_bus_to_string(ConfigBus b);

/* The CUDA backend's BkOptions.device for c: its device index, then the words its fields
 * ask for (" no-screen" without lm_head_screen). */
void config_device(const DsdConfig *c, char *buf, size_t size);

/* Fills c with the defaults of every field. */
void config_init(DsdConfig *c);

/* Parses len bytes of JSON text (not NUL-terminated) named name in messages. Fields that
 * are absent or null keep their default. On failure returns a negative code, leaves *ret
 * untouched and fills err with "NAME:LINE:COLUMN: field 'x.y' ...". The position of a
 * syntax error is cJSON's; that of a semantic error is where the field's key first appears
 * in the text, found by a scan of the text (best effort: a key spelled with escapes is not
 * found, and the message then has no position). */
int config_parse(const char *name, const char *json, size_t len, DsdConfig *ret, DsError *err);

/* Reads and parses path. A missing file is not an error when missing_ok: *ret then holds
 * the defaults and the return value is 0; otherwise -ENOENT. Returns 1 when the file was
 * read. */
int config_load(const char *path, bool missing_ok, DsdConfig *ret, DsError *err);

/* Sets one field from text, as a command-line flag does: key is the field's dotted name
 * ("limits.max_batch"), value is parsed by the field's type (numbers, true/false, and
 * comma-separated lists for allowed_uids/allowed_gids; "" clears model). source names the
 * origin in messages ("--max-batch"). c is left unchanged on failure. */
int config_set(DsdConfig *c, const char *source, const char *key, const char *value, DsError *err);

/* The configuration as a JSON document with every field, in the file's layout, for
 * `dsd --dump-config` and to compare configurations. The caller frees *ret. */
int config_to_json(const DsdConfig *c, char **ret);
