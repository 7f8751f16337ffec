/* SPDX-License-Identifier: MIT */
/* dsctl: the dsd command-line tool. Each verb lives in its own file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"

static const struct {
        const char *name;
        int (*run)(int argc, char **argv);
        const char *help;
} verbs[] = {
        { "generate", dsctl_generate_main,
                "[--socket PATH] [--chat] [--max-tokens N] [--temperature T] [--seed S] TEXT\n"
                "        Stream the daemon's answer to TEXT to stdout." },
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
        fprintf(stderr, "dsctl: unknown command '%s' (try 'dsctl --help')\n", argv[1]);
        return 2;
}
