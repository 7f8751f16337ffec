/* SPDX-License-Identifier: MIT */
#pragma once

/* dsctl chat: an interactive multi-turn chat over libdsclient. */
int dsctl_chat_main(int argc, char **argv);
