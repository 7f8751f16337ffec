#include "commands.h"
int cmd_tokenize(int argc, char **argv) { (void) argc; (void) argv; return 1; }
int cmd_detokenize(int argc, char **argv) { (void) argc; (void) argv; return 1; }
