/* SPDX-License-Identifier: MIT */
/* dsctl's bus verbs as a program of their own, for test-bus.py: "dsctl-bus VERB [ARGS]"
 * does what "dsctl VERB [ARGS]" does. */
#include "bus_commands.h"

int main(int argc, char **argv)
{
        return dsctl_bus_main(argc - 1, argv + 1);
}
