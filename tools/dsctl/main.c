/* SPDX-License-Identifier: MIT */
/* dsctl: the dsd command-line tool. Each verb lives in its own file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bus_commands.h"
#include "chat.h"
#include "generate.h"

static const struct {
        const char *name;
        int (*run)(int argc, char **argv);
        const char *help;
} verbs[] = {
        {"generate", dsctl_generate_main,
                "[--socket PATH] [--chat] [--max-tokens N] [--temperature T] [--seed S] TEXT\n"
                "        Stream the daemon's answer to TEXT to stdout."},
        {"chat", dsctl_chat_main,
                "[--socket PATH] [--system TEXT] [--max-tokens N]\n"
                "        Chat on the terminal; Ctrl-C cancels an answer, Ctrl-D exits."},
#if HAVE_BUS_COMMANDS
        {"status", dsctl_bus_main,
                "[--system|--user] [--json]\n"
                "        Show the daemon's state, model, backend and load (D-Bus)."},
        {"reload", dsctl_bus_main,
                "[MODEL]\n"
                "        Re-read /etc/dsd/dsd.json, or switch to the model directory MODEL."},
        {"drain", dsctl_bus_main, "\n        Stop admitting requests; running ones finish."},
        {"resume", dsctl_bus_main, "\n        Admit requests again after drain."},
        {"clients", dsctl_bus_main, "[--json]\n        List the connected clients."},
        {"stats", dsctl_bus_main, "[--json]\n        Request totals and latency percentiles."},
        {"cancel", dsctl_bus_main, "ID\n        Cancel a request, or all requests of a client."},
#endif
};

static void help(FILE *f)
{
        fprintf(f, "Usage: dsctl COMMAND [OPTIONS]\n\nCommands:\n");
        for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
                fprintf(f, "  %s %s\n", verbs[i].name, verbs[i].help);
        fprintf(f, "\n'dsctl COMMAND --help' describes one command.\n");
}

int main(int argc, char **argv)
{
        if (argc < 2) {
                help(stderr);
                return 2;
        }
        if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
                help(stdout);
                return EXIT_SUCCESS;
        }
        for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
                if (!strcmp(argv[1], verbs[i].name))
                        return verbs[i].run(argc - 1, argv + 1);
#if HAVE_BUS_COMMANDS
        /* "dsctl --user status": options before a bus verb. */
        if (argv[1][0] == '-')
                return dsctl_bus_main(argc - 1, argv + 1);
#endif
        fprintf(stderr, "dsctl: unknown command '%s' (try 'dsctl --help')\n", argv[1]);
        return 2;
}
