/* SPDX-License-Identifier: MIT */
/* dsd as a system service (DESIGN.md §7, docs/operations.md): the configuration in force,
 * the io.dsd.Daemon1 bus object, systemd notification and the model's lifecycle around
 * the server. Models load on a loader thread while the I/O thread keeps serving; a
 * finished load hands the new engine to the server, which lets the old one finish its
 * requests. Everything but the loader runs on the I/O thread, through the server's
 * hooks. */
#pragma once

#include "config.h"
#include "error.h"
#include "server.h"

/* One command-line flag, applied over the file at start and again at every reload. */
typedef struct ConfigOverride {
        const char *source; /* "--max-batch" */
        const char *key;    /* "limits.max_batch" */
        const char *value;
} ConfigOverride;

typedef struct ServiceOptions {
        const char *config_path; /* NULL: no file, defaults and flags only */
        const ConfigOverride *overrides;
        size_t n_overrides;
        uint32_t threads; /* CPU backend threads */
        /* Explicit KV budget (--kv-bytes). 0: kv_memory_fraction of the budget with a
         * configuration file, one full context without one. */
        uint64_t kv_bytes;
        uint32_t step_tokens; /* --step-tokens; 0: the scheduler's default */
        uint32_t max_clients;
        uint32_t slow_timeout_ms;
} ServiceOptions;

/* Reads the file (when any) and applies the overrides. The message names the field and,
 * for the file, its line; a model directory that does not exist fails as field 'model'. */
int service_read_config(const ServiceOptions *o, DsdConfig *ret, DsError *err);

/* Runs the daemon with configuration c until SIGTERM/SIGINT: 0 after a clean stop. */
int service_run(const ServiceOptions *o, const DsdConfig *c);
