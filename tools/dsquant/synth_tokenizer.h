/* SPDX-License-Identifier: MIT */
/* The tokenizer of a synthetic checkpoint: a small byte-level BPE in the Qwen2 form
 * (Split with the Qwen2 regex, then ByteLevel), with merges built from a fixed list of
 * common English words, and the ChatML special tokens. It is deterministic, so synthetic
 * checkpoints are byte-identical for a given seed. */
#pragma once

#include <stdint.h>

#include "error.h"

typedef struct SynthTokens {
        uint32_t n_vocab;  /* highest id + 1 */
        int32_t endoftext; /* <|endoftext|>: BOS and EOS */
        int32_t im_start;
        int32_t im_end;
} SynthTokens;

/* Writes outdir/tokenizer.json and outdir/tokenizer_config.json, using at most
 * max_vocab ids (at least SYNTH_TOKENIZER_MIN_VOCAB). */
int synth_tokenizer_write(const char *outdir, uint32_t max_vocab, SynthTokens *ret, DsError *err);

/* The 256 byte symbols and the three special tokens. */
#define SYNTH_TOKENIZER_MIN_VOCAB 259u
