/* SPDX-License-Identifier: MIT */
/* dsctl chat: a multi-turn chat on the terminal over libdsclient. Each turn sends the whole
 * conversation as chat messages (the daemon applies the model's template) and streams the
 * answer. Ctrl-C cancels the answer being generated (ds_cancel) and returns to the prompt;
 * end of input (Ctrl-D) ends the program. */
#include "chat.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsclient.h"

enum {
        EXIT_DAEMON = 1,
        EXIT_USAGE = 2,
        EXIT_NOT_RUNNING = 3,
};

/* How often a streaming answer looks at the Ctrl-C flag. */
#define CHAT_POLL_MS 50

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
        interrupted = 1;
}

typedef struct Conversation {
        ds_message *msgs;
        char **texts; /* owned contents, parallel to msgs */
        size_t n, cap;
} Conversation;

static int conv_add(Conversation *v, uint32_t role, char *text)
{
        if (v->n == v->cap) {
                size_t cap = v->cap ? 2 * v->cap : 16;
                ds_message *m = realloc(v->msgs, cap * sizeof(*m));
                if (m)
                        v->msgs = m;
                char **t = realloc(v->texts, cap * sizeof(*t));
                if (t)
                        v->texts = t;
                if (!m || !t)
                        return -ENOMEM;
                v->cap = cap;
        }
        v->texts[v->n] = text;
        v->msgs[v->n] = (ds_message){.role = role, .content = text};
        v->n++;
        return 0;
}

static void conv_free(Conversation *v)
{
        for (size_t i = 0; i < v->n; i++)
                free(v->texts[i]);
        free(v->texts);
        free(v->msgs);
}

static void help(void)
{
        printf("Usage: dsctl chat [--socket PATH] [--system TEXT] [--max-tokens N]\n"
               "\n"
               "Chat with the model on the terminal: type a message and press Enter; the\n"
               "answer streams back. The whole conversation goes to the model each turn.\n"
               "Ctrl-C cancels the answer being generated; Ctrl-D (end of input) exits.\n"
               "\n"
               "Options:\n"
               "  --socket PATH      the daemon's socket (default: $DSD_SOCKET, else\n"
               "                     /run/dsd/dsd.sock)\n"
               "  --system TEXT      a system message first in the conversation\n"
               "  --max-tokens N     longest answer in tokens (default 512)\n"
               "  -h, --help         this text\n"
               "\n"
               "Exit status: 0 end of input, 1 the daemon failed, 2 bad arguments,\n"
               "3 no daemon at the socket.\n");
}

/* Streams one answer into *ret (owned by the caller). 0 done or cancelled, < 0 when the
 * connection failed; a refused request prints its reason and returns 0 without text. */
static int answer(
        ds_client *c, const Conversation *v, uint32_t max_tokens, ds_event *ev, char **ret)
{
        ds_request req;
        char *text = NULL;
        size_t len = 0;
        bool cancelled = false;
        uint64_t id;
        int r;

        ds_request_init(&req);
        req.kind = DS_PROMPT_CHAT;
        req.messages = v->msgs;
        req.n_messages = v->n;
        req.max_tokens = max_tokens;
        interrupted = 0;
        r = ds_submit(c, &req, &id);
        if (r < 0) {
                fprintf(stderr, "dsctl chat: Failed to submit: %s\n", ds_strerror(r));
                return r == -ECONNRESET || r == -EPROTO ? r : 0;
        }
        for (;;) {
                if (interrupted && !cancelled) {
                        cancelled = true;
                        (void) ds_cancel(c, id);
                }
                r = ds_next(c, CHAT_POLL_MS, ev);
                if (r < 0) {
                        free(text);
                        fprintf(stderr, "\ndsctl chat: Failed to read events: %s\n",
                                ds_strerror(r));
                        return r;
                }
                if (r == 0 || (ev->request_id != id && ev->request_id != 0))
                        continue;
                if (ev->type == DS_EVENT_TOKEN) {
                        char *t = realloc(text, len + ev->text_len + 1);
                        if (!t) {
                                free(text);
                                return -ENOMEM;
                        }
                        text = t;
                        memcpy(text + len, ev->text, ev->text_len);
                        len += ev->text_len;
                        text[len] = 0;
                        fwrite(ev->text, 1, ev->text_len, stdout);
                        fflush(stdout);
                } else if (ev->type == DS_EVENT_FINAL) {
                        printf(ev->finish == DS_FINISH_CANCELLED ? " [cancelled]\n" : "\n");
                        break;
                } else {
                        /* The daemon's message names the error itself ("draining: ..."). */
                        fprintf(stderr, "\ndsctl chat: the daemon failed the request: %s\n",
                                ev->message[0] ? ev->message : ds_strerror(ev->error));
                        break;
                }
        }
        *ret = text;
        return 0;
}

int dsctl_chat_main(int argc, char **argv)
{
        enum { OPT_SOCKET = 256, OPT_SYSTEM, OPT_MAX_TOKENS };
        static const struct option options[] = {
                {"socket", required_argument, NULL, OPT_SOCKET},
                {"system", required_argument, NULL, OPT_SYSTEM},
                {"max-tokens", required_argument, NULL, OPT_MAX_TOKENS},
                {"help", no_argument, NULL, 'h'},
                {},
        };
        const char *socket_path = NULL, *system_text = NULL;
        unsigned long max_tokens = 512;
        Conversation v = {};
        ds_client *c = NULL;
        ds_event *ev = NULL;
        char *line = NULL, *end;
        size_t cap = 0;
        bool tty = isatty(STDIN_FILENO);
        int r, opt, status = EXIT_SUCCESS;

        optind = 1;
        while ((opt = getopt_long(argc, argv, "+h", options, NULL)) >= 0) {
                switch (opt) {
                case OPT_SOCKET:
                        socket_path = optarg;
                        break;
                case OPT_SYSTEM:
                        system_text = optarg;
                        break;
                case OPT_MAX_TOKENS:
                        errno = 0;
                        max_tokens = strtoul(optarg, &end, 10);
                        if (errno || end == optarg || *end || optarg[0] == '-' ||
                                max_tokens > UINT32_MAX) {
                                fprintf(stderr,
                                        "dsctl chat: --max-tokens wants an integer, "
                                        "not '%s'\n",
                                        optarg);
                                return EXIT_USAGE;
                        }
                        break;
                case 'h':
                        help();
                        return EXIT_SUCCESS;
                default:
                        return EXIT_USAGE;
                }
        }
        if (optind != argc) {
                fprintf(stderr, "dsctl chat: unexpected argument '%s'\n", argv[optind]);
                return EXIT_USAGE;
        }

        r = ds_connect(socket_path, DS_CONNECT_AUTO, &c);
        if (r < 0) {
                const char *why = ds_connect_message();
                fprintf(stderr, "dsctl chat: Failed to connect to dsd: %s%s%s\n", ds_strerror(r),
                        *why ? ": " : "", why);
                return r == -ENOENT || r == -ECONNREFUSED ? EXIT_NOT_RUNNING : EXIT_DAEMON;
        }
        /* No SA_RESTART: Ctrl-C at the prompt interrupts the read, which starts over. */
        struct sigaction sa = {.sa_handler = on_sigint};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);

        ev = malloc(sizeof(*ev));
        if (!ev || (system_text && conv_add(&v, DS_ROLE_SYSTEM, strdup(system_text)) < 0)) {
                fprintf(stderr, "dsctl chat: out of memory\n");
                status = EXIT_DAEMON;
                goto out;
        }
        for (;;) {
                if (tty) {
                        fputs("> ", stdout);
                        fflush(stdout);
                }
                interrupted = 0;
                errno = 0;
                ssize_t n = getline(&line, &cap, stdin);
                if (n < 0 && errno == EINTR) {
                        clearerr(stdin);
                        putchar('\n');
                        continue;
                }
                if (n < 0)
                        break; /* end of input */
                line[strcspn(line, "\n")] = 0;
                if (!line[0])
                        continue;
                char *user = strdup(line), *reply = NULL;
                if (!user || conv_add(&v, DS_ROLE_USER, user) < 0) {
                        free(user);
                        status = EXIT_DAEMON;
                        break;
                }
                r = answer(c, &v, (uint32_t) max_tokens, ev, &reply);
                if (r < 0) {
                        status = EXIT_DAEMON;
                        break;
                }
                /* A cancelled answer stays in the history as far as it got, so the next
                 * turn reads as the user saw it. No answer at all drops the question. */
                if (!reply) {
                        free(v.texts[--v.n]);
                        continue;
                }
                if (conv_add(&v, DS_ROLE_ASSISTANT, reply) < 0) {
                        free(reply);
                        status = EXIT_DAEMON;
                        break;
                }
        }
        if (tty && status == EXIT_SUCCESS)
                putchar('\n');
out:
        free(line);
        free(ev);
        conv_free(&v);
        ds_close(c);
        return status;
}
