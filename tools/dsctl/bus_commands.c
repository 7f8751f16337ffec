/* SPDX-License-Identifier: MIT */
/* The bus verbs: properties are read with one GetAll call into a cJSON object keyed by the
 * D-Bus property names, which --json prints as it is and the human output formats. */
#include "bus_commands.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-bus.h>
#include <time.h>
#include <unistd.h>

#include "bus.h"
#include "macro.h"

/* Loading a large model takes minutes; Reload() replies only when it serves or failed. */
#define RELOAD_TIMEOUT_USEC (30ull * 60 * 1000000)

static bool arg_json;
static int arg_user = -1; /* -1: DSD_BUS decides */

static void cjson_deletep(cJSON **j)
{
        cJSON_Delete(*j);
}

static void help(void)
{
        printf("Usage: dsctl [--system|--user] [--json] COMMAND [ARG]\n"
               "\n"
               "Manage the dsd daemon over D-Bus (io.dsd.Daemon1).\n"
               "\n"
               "Commands:\n"
               "  status          state, model, backend, load and throughput\n"
               "  reload [MODEL]  re-read /etc/dsd/dsd.json, or switch to the model directory\n"
               "  drain           stop admitting requests; running ones finish\n"
               "  resume          admit requests again after drain\n"
               "  clients         connected clients\n"
               "  stats           request totals and latency percentiles\n"
               "  cancel ID       cancel a request, or all requests of a client\n"
               "\n"
               "Options:\n"
               "  --system        the system bus (default; DSD_BUS=session changes it)\n"
               "  --user          the session bus\n"
               "  --json          JSON output (status, clients, stats)\n"
               "\n"
               "Environment: DSD_BUS=system or DSD_BUS=session picks the bus when neither\n"
               "option is given; any other non-empty value is an error.\n"
               "\n"
               "Exit status: 0 ok, 1 the daemon refused or failed, 2 usage, 3 dsd is not "
               "running.\n");
}

/* An error from the bus or the daemon: prints it and picks the exit code. */
static int report_error(const char *what, int r, const sd_bus_error *error)
{
        if (sd_bus_error_has_names(
                    error, SD_BUS_ERROR_SERVICE_UNKNOWN, SD_BUS_ERROR_NAME_HAS_NO_OWNER)) {
                fprintf(stderr, "dsctl: dsd is not running on this bus\n");
                return DSCTL_EXIT_NOT_RUNNING;
        }
        if (sd_bus_error_is_set(error))
                fprintf(stderr, "dsctl: %s: %s\n", what,
                        error->message ? error->message : error->name);
        else
                fprintf(stderr, "dsctl: %s: %s\n", what, strerror(-r));
        return DSCTL_EXIT_DAEMON;
}

static int bus_connect(sd_bus **ret)
{
        const char *env = getenv("DSD_BUS");
        bool user = arg_user > 0;
        int r;

        /* A misspelt value must not quietly mean the system bus, where another daemon may
         * answer. Empty counts as unset, as "DSD_BUS= dsctl ..." means in a shell. */
        if (arg_user < 0 && env && env[0]) {
                if (strcmp(env, "session") == 0)
                        user = true;
                else if (strcmp(env, "system") != 0) {
                        fprintf(stderr,
                                "dsctl: DSD_BUS='%s' is not a bus: use 'system' or 'session', or "
                                "--system or --user\n",
                                env);
                        return DSCTL_EXIT_USAGE;
                }
        }
        r = user ? sd_bus_open_user(ret) : sd_bus_open_system(ret);
        if (r < 0) {
                fprintf(stderr, "dsctl: cannot connect to the %s bus: %s\n",
                        user ? "session" : "system", strerror(-r));
                return DSCTL_EXIT_NOT_RUNNING;
        }
        return 0;
}

/* Reads the variant at the read position into a cJSON value (the types the interface
 * uses); other types are skipped and yield NULL. */
static int read_variant(sd_bus_message *m, cJSON **ret)
{
        const char *contents;
        char type;
        int r;

        r = sd_bus_message_peek_type(m, &type, &contents);
        if (r < 0)
                return r;
        r = sd_bus_message_enter_container(m, 'v', contents);
        if (r < 0)
                return r;
        *ret = NULL;
        switch (contents[0]) {
        case 's': {
                const char *s;
                r = sd_bus_message_read_basic(m, 's', &s);
                if (r >= 0)
                        *ret = cJSON_CreateString(s);
                break;
        }
        case 'u': {
                uint32_t u;
                r = sd_bus_message_read_basic(m, 'u', &u);
                if (r >= 0)
                        *ret = cJSON_CreateNumber(u);
                break;
        }
        case 't': {
                uint64_t t;
                r = sd_bus_message_read_basic(m, 't', &t);
                if (r >= 0)
                        *ret = cJSON_CreateNumber((double) t);
                break;
        }
        case 'd': {
                double d;
                r = sd_bus_message_read_basic(m, 'd', &d);
                if (r >= 0)
                        *ret = cJSON_CreateNumber(d);
                break;
        }
        default:
                r = sd_bus_message_skip(m, contents);
                break;
        }
        if (r < 0)
                return r;
        return sd_bus_message_exit_container(m);
}

/* An a{sv} into a cJSON object. */
static int read_dict(sd_bus_message *m, cJSON **ret)
{
        _cleanup_(cjson_deletep) cJSON *o = cJSON_CreateObject();
        const char *name;
        int r;

        if (!o)
                return -ENOMEM;
        r = sd_bus_message_enter_container(m, 'a', "{sv}");
        if (r < 0)
                return r;
        while ((r = sd_bus_message_enter_container(m, 'e', "sv")) > 0) {
                cJSON *v;
                r = sd_bus_message_read_basic(m, 's', &name);
                if (r < 0)
                        return r;
                r = read_variant(m, &v);
                if (r < 0)
                        return r;
                if (v)
                        cJSON_AddItemToObject(o, name, v);
                r = sd_bus_message_exit_container(m);
                if (r < 0)
                        return r;
        }
        if (r < 0)
                return r;
        r = sd_bus_message_exit_container(m);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(o);
        return 0;
}

static void print_json(const cJSON *j)
{
        _cleanup_free_ char *s = cJSON_Print(j);

        if (s)
                printf("%s\n", s);
}

static double num(const cJSON *o, const char *key)
{
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
        return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static const char *str(const cJSON *o, const char *key)
{
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
        return cJSON_IsString(v) ? v->valuestring : "";
}

static const char *format_bytes(double b, char *buf, size_t size)
{
        static const char units[] = "BKMGTP";
        size_t i = 0;

        while (b >= 1024 && i + 1 < sizeof(units) - 1) {
                b /= 1024;
                i++;
        }
        snprintf(buf, size, i ? "%.1f%c" : "%.0f%c", b, units[i]);
        return buf;
}

static const char *format_since(uint64_t usec, char *buf, size_t size)
{
        time_t t = (time_t) (usec / 1000000);
        time_t now = time(NULL);
        struct tm tm;
        char when[64];
        long ago = (long) (now - t);

        if (usec == 0 || !localtime_r(&t, &tm) ||
                strftime(when, sizeof(when), "%a %Y-%m-%d %H:%M:%S %Z", &tm) == 0) {
                snprintf(buf, size, "n/a");
                return buf;
        }
        if (ago < 0)
                ago = 0;
        if (ago >= 86400)
                snprintf(buf, size, "%s; %ldd %ldh ago", when, ago / 86400, ago % 86400 / 3600);
        else if (ago >= 3600)
                snprintf(buf, size, "%s; %ldh %ldmin ago", when, ago / 3600, ago % 3600 / 60);
        else if (ago >= 60)
                snprintf(buf, size, "%s; %ldmin %lds ago", when, ago / 60, ago % 60);
        else
                snprintf(buf, size, "%s; %lds ago", when, ago);
        return buf;
}

static int verb_status(sd_bus *bus)
{
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(cjson_deletep) cJSON *p = NULL;
        char a[32], b[32], since[128];
        int r;

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, "org.freedesktop.DBus.Properties", "GetAll",
                &error, &reply, "s", BUS_INTERFACE);
        if (r < 0)
                return report_error("cannot read the daemon's properties", r, &error);
        r = read_dict(reply, &p);
        if (r < 0)
                return report_error("cannot parse the daemon's properties", r, NULL);
        if (arg_json) {
                print_json(p);
                return DSCTL_EXIT_OK;
        }

        const char *state = str(p, "State");
        bool good = strcmp(state, "ready") == 0;
        bool bad = strcmp(state, "failed") == 0;
        /* The bullet is coloured like systemctl's only on a terminal. */
        bool tty = isatty(STDOUT_FILENO);
        printf("%s●%s dsd %s — %s\n",
                !tty   ? ""
                : good ? "\033[0;1;32m"
                : bad  ? "\033[0;1;31m"
                       : "",
                tty ? "\033[0m" : "", str(p, "Version"), state);
        if (str(p, "Architecture")[0])
                printf("      Model: %s (%s)\n", str(p, "Model"), str(p, "Architecture"));
        else
                printf("      Model: %s\n", str(p, "Model")[0] ? str(p, "Model") : "(none)");
        if (str(p, "Backend")[0])
                printf("    Backend: %s on %s\n", str(p, "Backend"), str(p, "Device"));
        if (num(p, "ContextLength") > 0)
                printf("    Context: %.0f positions\n", num(p, "ContextLength"));
        printf("    Started: %s\n",
                format_since((uint64_t) num(p, "StartedAt"), since, sizeof(since)));
        printf("   Requests: %.0f active, %.0f queued\n", num(p, "ActiveRequests"),
                num(p, "QueuedRequests"));
        printf("    Clients: %.0f\n", num(p, "Clients"));
        printf("   KV cache: %.0f of %.0f blocks free", num(p, "KVBlocksFree"),
                num(p, "KVBlocksTotal"));
        if (num(p, "KVBytesPerToken") > 0)
                printf(", %.0f bytes per token", num(p, "KVBytesPerToken"));
        printf("\n");
        if (num(p, "GPUMemoryTotal") > 0)
                printf(" GPU memory: %s of %s used\n",
                        format_bytes(num(p, "GPUMemoryUsed"), a, sizeof(a)),
                        format_bytes(num(p, "GPUMemoryTotal"), b, sizeof(b)));
        printf(" Throughput: %.1f tokens/s\n", num(p, "TokensPerSecond"));
        return DSCTL_EXIT_OK;
}

static int verb_clients(sd_bus *bus)
{
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(cjson_deletep) cJSON *list = cJSON_CreateArray();
        uint64_t id, requests, tokens;
        uint32_t pid, uid, active;
        const char *comm;
        int r;

        if (!list)
                return report_error("out of memory", -ENOMEM, NULL);
        r = sd_bus_call_method(
                bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "ListClients", &error, &reply, NULL);
        if (r < 0)
                return report_error("cannot list clients", r, &error);
        r = sd_bus_message_enter_container(reply, 'a', "(tuusutt)");
        if (r < 0)
                return report_error("cannot parse the client list", r, NULL);
        if (!arg_json)
                printf("%-8s %8s %8s %-16s %6s %10s %12s\n", "ID", "PID", "UID", "COMMAND",
                        "ACTIVE", "REQUESTS", "TOKENS");
        while ((r = sd_bus_message_read(reply, "(tuusutt)", &id, &pid, &uid, &comm, &active,
                        &requests, &tokens)) > 0) {
                if (!arg_json) {
                        printf("%-8" PRIu64 " %8u %8u %-16s %6u %10" PRIu64 " %12" PRIu64 "\n", id,
                                pid, uid, comm, active, requests, tokens);
                        continue;
                }
                cJSON *c = cJSON_CreateObject();
                if (!c || !cJSON_AddItemToArray(list, c))
                        return report_error("out of memory", -ENOMEM, NULL);
                cJSON_AddNumberToObject(c, "id", (double) id);
                cJSON_AddNumberToObject(c, "pid", pid);
                cJSON_AddNumberToObject(c, "uid", uid);
                cJSON_AddStringToObject(c, "comm", comm);
                cJSON_AddNumberToObject(c, "active_requests", active);
                cJSON_AddNumberToObject(c, "requests_total", (double) requests);
                cJSON_AddNumberToObject(c, "tokens_total", (double) tokens);
        }
        if (r < 0)
                return report_error("cannot parse the client list", r, NULL);
        if (arg_json)
                print_json(list);
        return DSCTL_EXIT_OK;
}

static int verb_stats(sd_bus *bus)
{
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(cjson_deletep) cJSON *s = NULL;
        const cJSON *v;
        int r;

        r = sd_bus_call_method(
                bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "GetStats", &error, &reply, NULL);
        if (r < 0)
                return report_error("cannot read statistics", r, &error);
        r = read_dict(reply, &s);
        if (r < 0)
                return report_error("cannot parse statistics", r, NULL);
        if (arg_json) {
                print_json(s);
                return DSCTL_EXIT_OK;
        }
        cJSON_ArrayForEach(v, s)
        {
                printf("%24s: %.0f\n", v->string, v->valuedouble);
        }
        return DSCTL_EXIT_OK;
}

/* Reload(), Drain(), Resume() and Cancel(): no output on success. */
static int verb_call(sd_bus *bus, const char *method, const char *arg)
{
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_free_ char *model = NULL;
        uint64_t timeout = 0;
        int r;

        r = sd_bus_message_new_method_call(bus, &m, BUS_NAME, BUS_PATH, BUS_INTERFACE, method);
        if (r < 0)
                return report_error(method, r, NULL);
        if (strcmp(method, "Reload") == 0) {
                /* The daemon runs elsewhere (/ under systemd): send an absolute path. */
                if (arg && arg[0]) {
                        model = realpath(arg, NULL);
                        if (!model) {
                                fprintf(stderr, "dsctl: reload: '%s': %s\n", arg, strerror(errno));
                                return DSCTL_EXIT_USAGE;
                        }
                }
                r = sd_bus_message_append(m, "s", model ? model : "");
                timeout = RELOAD_TIMEOUT_USEC;
        } else if (strcmp(method, "Cancel") == 0) {
                char *end;
                errno = 0;
                unsigned long long id = strtoull(arg, &end, 10);
                if (errno || end == arg || *end || arg[0] == '-') {
                        fprintf(stderr, "dsctl: cancel: '%s' is not a request or client id\n", arg);
                        return DSCTL_EXIT_USAGE;
                }
                r = sd_bus_message_append(m, "t", (uint64_t) id);
        }
        if (r < 0)
                return report_error(method, r, NULL);
        r = sd_bus_call(bus, m, timeout, &error, NULL);
        if (r < 0) {
                char what[64];
                snprintf(what, sizeof(what), "%s failed", method);
                return report_error(what, r, &error);
        }
        return DSCTL_EXIT_OK;
}

static const struct {
        const char *verb;
        int min_args, max_args;
        bool reads; /* takes --json */
} verbs[] = {
        {"status", 0, 0, true},
        {"reload", 0, 1, false},
        {"drain", 0, 0, false},
        {"resume", 0, 0, false},
        {"clients", 0, 0, true},
        {"stats", 0, 0, true},
        {"cancel", 1, 1, false},
};

bool dsctl_bus_handles(const char *verb)
{
        for (size_t i = 0; verb && i < ELEMENTSOF(verbs); i++)
                if (strcmp(verb, verbs[i].verb) == 0)
                        return true;
        return false;
}

int dsctl_bus_main(int argc, char **argv)
{
        enum { ARG_JSON = 0x100, ARG_SYSTEM, ARG_USER };
        static const struct option options[] = {
                {"help", no_argument, NULL, 'h'},
                {"json", no_argument, NULL, ARG_JSON},
                {"system", no_argument, NULL, ARG_SYSTEM},
                {"user", no_argument, NULL, ARG_USER},
                {},
        };
        _cleanup_(sd_bus_flush_close_unrefp) sd_bus *bus = NULL;
        _cleanup_free_ char **args = NULL;
        const char *verb;
        int c, r, n_args;
        size_t v;

        /* getopt wants a program name first; the verb may come before or after the
         * options ("status --json", "--user status"), and getopt moves it behind them. */
        if (argc < 1) {
                help();
                return DSCTL_EXIT_USAGE;
        }
        args = calloc((size_t) argc + 2, sizeof(char *));
        if (!args)
                return report_error("out of memory", -ENOMEM, NULL);
        args[0] = (char *) "dsctl";
        memcpy(args + 1, argv, (size_t) argc * sizeof(char *));
        optind = 0; /* also resets getopt for a caller that parsed its own options */
        while ((c = getopt_long(argc + 1, args, "h", options, NULL)) >= 0) {
                switch (c) {
                case 'h':
                        help();
                        return DSCTL_EXIT_OK;
                case ARG_JSON:
                        arg_json = true;
                        break;
                case ARG_SYSTEM:
                        arg_user = 0;
                        break;
                case ARG_USER:
                        arg_user = 1;
                        break;
                default:
                        return DSCTL_EXIT_USAGE; /* getopt named the option */
                }
        }
        verb = optind <= argc ? args[optind] : NULL;
        if (!dsctl_bus_handles(verb)) {
                fprintf(stderr, "dsctl: %s%s%s\n", verb ? "unknown command '" : "no command",
                        verb ? verb : "", verb ? "'" : "");
                return DSCTL_EXIT_USAGE;
        }
        for (v = 0; strcmp(verbs[v].verb, verb) != 0; v++)
                ;
        n_args = argc - optind;
        const char *arg = n_args ? args[optind + 1] : NULL;
        if (n_args < verbs[v].min_args || n_args > verbs[v].max_args) {
                fprintf(stderr, "dsctl: %s takes %s\n", verb,
                        verbs[v].max_args == 0   ? "no arguments"
                        : verbs[v].min_args == 0 ? "at most one argument"
                                                 : "exactly one argument");
                return DSCTL_EXIT_USAGE;
        }
        if (arg_json && !verbs[v].reads) {
                fprintf(stderr, "dsctl: --json applies to status, clients and stats, not %s\n",
                        verb);
                return DSCTL_EXIT_USAGE;
        }

        r = bus_connect(&bus);
        if (r != 0)
                return r;
        if (strcmp(verb, "status") == 0)
                return verb_status(bus);
        if (strcmp(verb, "clients") == 0)
                return verb_clients(bus);
        if (strcmp(verb, "stats") == 0)
                return verb_stats(bus);
        if (strcmp(verb, "reload") == 0)
                return verb_call(bus, "Reload", arg);
        if (strcmp(verb, "drain") == 0)
                return verb_call(bus, "Drain", NULL);
        if (strcmp(verb, "resume") == 0)
                return verb_call(bus, "Resume", NULL);
        return verb_call(bus, "Cancel", arg);
}
