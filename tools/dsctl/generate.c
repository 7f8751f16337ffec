/* SPDX-License-Identifier: MIT */
/* dsctl generate: an ordinary libdsclient client, the demo of the README. The answer goes
 * to stdout as it streams; a one-line summary goes to stderr. */
#include "generate.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsclient.h"

enum {
        EXIT_DAEMON = 1,
        EXIT_USAGE = 2,
        EXIT_NOT_RUNNING = 3,
};

static const char *arg_socket;
static bool arg_chat;
static uint32_t arg_max_tokens = 256;
static float arg_temperature;
static uint64_t arg_seed;

static void help(void)
{
        printf("Usage: dsctl generate [OPTIONS] TEXT\n"
               "\n"
               "Send TEXT to the dsd daemon and stream the answer to stdout; a summary (finish\n"
               "reason, tokens, queue time, time to first token, total time) goes to stderr.\n"
               "\n"
               "Options:\n"
               "  --socket PATH      the daemon's socket (default: $DSD_SOCKET, else\n"
               "                     /run/dsd/dsd.sock)\n"
               "  --chat             send TEXT as one user message through the model's chat\n"
               "                     template (default: a plain completion of TEXT)\n"
               "  --max-tokens N     stop after N tokens (default 256; 0: up to the context)\n"
               "  --temperature T    sampling temperature in [0, 100] (default 0: greedy)\n"
               "  --seed S           sampling seed (default 0)\n"
               "  -h, --help         this text\n"
               "\n"
               "Exit status: 0 done, 1 the daemon refused or failed, 2 bad arguments,\n"
               "3 no daemon at the socket.\n");
}

static int parse_u64(const char *opt, const char *s, uint64_t max, uint64_t *ret)
{
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || end == s || *end || s[0] == '-' || v > max) {
                fprintf(stderr,
                        "dsctl generate: %s wants an integer in [0, %" PRIu64 "], not '%s'\n", opt,
                        max, s);
                return -EINVAL;
        }
        *ret = v;
        return 0;
}

static int parse_args(int argc, char **argv)
{
        enum { OPT_SOCKET = 256, OPT_CHAT, OPT_MAX_TOKENS, OPT_TEMPERATURE, OPT_SEED };
        static const struct option options[] = {
                {"socket", required_argument, NULL, OPT_SOCKET},
                {"chat", no_argument, NULL, OPT_CHAT},
                {"max-tokens", required_argument, NULL, OPT_MAX_TOKENS},
                {"temperature", required_argument, NULL, OPT_TEMPERATURE},
                {"seed", required_argument, NULL, OPT_SEED},
                {"help", no_argument, NULL, 'h'},
                {},
        };
        uint64_t v;
        int c;

        optind = 1;
        while ((c = getopt_long(argc, argv, "+h", options, NULL)) >= 0) {
                switch (c) {
                case OPT_SOCKET:
                        arg_socket = optarg;
                        break;
                case OPT_CHAT:
                        arg_chat = true;
                        break;
                case OPT_MAX_TOKENS:
                        if (parse_u64("--max-tokens", optarg, UINT32_MAX, &v) < 0)
                                return -EINVAL;
                        arg_max_tokens = (uint32_t) v;
                        break;
                case OPT_TEMPERATURE: {
                        char *end;
                        errno = 0;
                        float t = strtof(optarg, &end);
                        if (errno || end == optarg || *end || !(t >= 0.0f && t <= 100.0f)) {
                                fprintf(stderr,
                                        "dsctl generate: --temperature wants a number in "
                                        "[0, 100], not '%s'\n",
                                        optarg);
                                return -EINVAL;
                        }
                        arg_temperature = t;
                        break;
                }
                case OPT_SEED:
                        if (parse_u64("--seed", optarg, UINT64_MAX, &arg_seed) < 0)
                                return -EINVAL;
                        break;
                case 'h':
                        help();
                        return 0;
                default:
                        return -EINVAL; /* getopt named the bad option */
                }
        }
        if (optind != argc - 1) {
                fprintf(stderr, "dsctl generate: expected exactly one TEXT argument "
                                "(try 'dsctl generate --help')\n");
                return -EINVAL;
        }
        return 1;
}

static const char *finish_name(uint32_t f)
{
        switch (f) {
        case DS_FINISH_LENGTH:
                return "length";
        case DS_FINISH_EOS:
                return "eos";
        case DS_FINISH_STOP:
                return "stop";
        case DS_FINISH_CANCELLED:
                return "cancelled";
        default:
                return "unknown";
        }
}

int dsctl_generate_main(int argc, char **argv)
{
        ds_client *c = NULL;
        ds_request req;
        ds_message msg;
        ds_event *ev;
        uint64_t id;
        int r, status = EXIT_DAEMON;

        r = parse_args(argc, argv);
        if (r <= 0)
                return r < 0 ? EXIT_USAGE : EXIT_SUCCESS;
        const char *text = argv[optind];
        if (!*text) {
                fprintf(stderr, "dsctl generate: TEXT is empty\n");
                return EXIT_USAGE;
        }

        r = ds_connect(arg_socket, DS_CONNECT_AUTO, &c);
        if (r < 0) {
                const char *why = ds_connect_message();
                fprintf(stderr, "dsctl generate: Failed to connect to dsd at '%s': %s%s%s\n",
                        arg_socket             ? arg_socket
                        : getenv("DSD_SOCKET") ? getenv("DSD_SOCKET")
                                               : "/run/dsd/dsd.sock",
                        ds_strerror(r), *why ? ": " : "", why);
                return r == -ENOENT || r == -ECONNREFUSED ? EXIT_NOT_RUNNING : EXIT_DAEMON;
        }

        ds_request_init(&req);
        if (arg_chat) {
                msg = (ds_message){.role = DS_ROLE_USER, .content = text};
                req.kind = DS_PROMPT_CHAT;
                req.messages = &msg;
                req.n_messages = 1;
        } else {
                req.kind = DS_PROMPT_TEXT;
                req.text = text;
                req.text_len = strlen(text);
        }
        req.sampling.temperature = arg_temperature;
        req.sampling.seed = arg_seed;
        req.max_tokens = arg_max_tokens;

        ev = malloc(sizeof(*ev)); /* 4 KiB of text: not on the stack of a small tool */
        if (!ev) {
                fprintf(stderr, "dsctl generate: out of memory\n");
                ds_close(c);
                return EXIT_DAEMON;
        }
        r = ds_submit(c, &req, &id);
        if (r < 0) {
                fprintf(stderr, "dsctl generate: Failed to submit the request: %s\n",
                        ds_strerror(r));
                goto out;
        }
        for (;;) {
                r = ds_next(c, -1, ev);
                if (r < 0) {
                        fprintf(stderr, "\ndsctl generate: Failed to read events: %s\n",
                                ds_strerror(r));
                        goto out;
                }
                if (ev->request_id != id && ev->request_id != 0)
                        continue;
                if (ev->type == DS_EVENT_TOKEN) {
                        fwrite(ev->text, 1, ev->text_len, stdout);
                        fflush(stdout);
                } else if (ev->type == DS_EVENT_FINAL) {
                        fprintf(stderr,
                                "\n[%s: %" PRIu32 " prompt + %" PRIu32 " generated tokens, queue "
                                "%.1f ms, first token %.1f ms, total %.1f ms]\n",
                                finish_name(ev->finish), ev->prompt_tokens, ev->generated_tokens,
                                ev->queue_us / 1e3, ev->ttft_us / 1e3, ev->total_us / 1e3);
                        status = EXIT_SUCCESS;
                        goto out;
                } else {
                        /* The daemon's message names the error itself ("draining: ..."). */
                        fprintf(stderr, "\ndsctl generate: the daemon failed the request: %s\n",
                                ev->message[0] ? ev->message : ds_strerror(ev->error));
                        goto out;
                }
        }
out:
        free(ev);
        ds_close(c);
        return status;
}
