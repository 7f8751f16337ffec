/* SPDX-License-Identifier: MIT */
/* One function per dsquant subcommand. Each parses its own options (argv[0] is the
 * subcommand name) and returns an exit status. */
#pragma once

int cmd_tokenize(int argc, char **argv);   /* cmd_tokenize.c */
int cmd_detokenize(int argc, char **argv); /* cmd_tokenize.c */
int cmd_inspect(int argc, char **argv);    /* cmd_inspect.c */
int cmd_eval(int argc, char **argv);       /* cmd_eval.c */
int cmd_convert(int argc, char **argv);    /* cmd_convert.c */
int cmd_synth(int argc, char **argv);      /* cmd_synth.c */
