/* SPDX-License-Identifier: MIT */
/* dsquant: convert, quantize, synthesize and examine checkpoints. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "macro.h"

static const struct {
        const char *name;
        int (*run)(int argc, char **argv);
        const char *help;
} commands[] = {
        {"convert", cmd_convert,
                "--from llama2c CHECKPOINT.bin TOKENIZER.bin OUTDIR\n"
                "        Write a Hugging Face-layout model directory from a llama2.c checkpoint."},
        {"synth", cmd_synth,
                "--shape NAME|--config FILE OUTDIR [--seed S]\n"
                "        Write a deterministic synthetic AWQ INT4 checkpoint with a tokenizer."},
        {"inspect", cmd_inspect,
                "--model DIR\n"
                "        Print architecture, dimensions, quantization and tensors; validate every "
                "file."},
        {"tokenize", cmd_tokenize,
                "--tokenizer FILE\n"
                "        Read one JSON string per line on stdin, write one JSON array of ids per "
                "line."},
        {"detokenize", cmd_detokenize,
                "--tokenizer FILE\n"
                "        Read one JSON array of ids per line on stdin, write one JSON string per "
                "line."},
        {"eval", cmd_eval,
                "--model DIR (--ids FILE.json [--logits-out OUT.f32] [--decode N] | --text "
                "FILE)\n"
                "        One forward pass from position 0: write float32 logits [n][vocab], or "
                "print\n"
                "        the perplexity of a text."},
};

static void help(FILE *f)
{
        fprintf(f, "Usage: dsquant COMMAND [OPTIONS]\n\nCommands:\n");
        for (size_t i = 0; i < ELEMENTSOF(commands); i++)
                fprintf(f, "  %s %s\n", commands[i].name, commands[i].help);
        fprintf(f, "\n'dsquant COMMAND --help' describes one command.\n");
}

int main(int argc, char **argv)
{
        if (argc < 2) {
                help(stderr);
                return EXIT_FAILURE;
        }
        if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
                help(stdout);
                return EXIT_SUCCESS;
        }
        for (size_t i = 0; i < ELEMENTSOF(commands); i++)
                if (!strcmp(argv[1], commands[i].name))
                        return commands[i].run(argc - 1, argv + 1);
        fprintf(stderr, "dsquant: unknown command '%s' (try 'dsquant --help')\n", argv[1]);
        return EXIT_FAILURE;
}
