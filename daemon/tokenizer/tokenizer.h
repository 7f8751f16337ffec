/* SPDX-License-Identifier: MIT */
/* Text <-> token ids from a Hugging Face tokenizer.json: byte-level BPE with Split regex
 * pre-tokenizers and an optional NFC normalizer (DeepSeek-V3/R1, Qwen), and
 * SentencePiece-style BPE with byte fallback (Llama-2, converted llama2.c). Added tokens
 * are matched on the raw text first. Nothing here logs; errors come back in DsError. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef struct Tokenizer Tokenizer;

typedef enum ChatFamily {
        CHAT_NONE,        /* raw completion */
        CHAT_DEEPSEEK_R1, /* <｜User｜> ... <｜Assistant｜> */
        CHAT_CHATML,      /* <|im_start|>role\n ... <|im_end|> */
        _CHAT_MAX,
} ChatFamily;

/* Loads tokenizer.json. Unsupported models, normalizers, pre-tokenizers or decoders are
 * refused with -DS_ERR_UNSUPPORTED and a message naming them. */
int tokenizer_load(const char *path, Tokenizer **ret, DsError *err);

/* Reads tokenizer_config.json: bos/eos tokens, add_bos_token and the chat template
 * family, recognised from the template text. A missing file is not an error. When the
 * template is of no known family, *ret_unknown_template is set so the caller can warn. */
int tokenizer_load_config(Tokenizer *t, const char *path, bool *ret_unknown_template,
        DsError *err);

Tokenizer *tokenizer_free(Tokenizer *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(Tokenizer *, tokenizer_free);

/* Encodes len bytes of UTF-8 text. No BOS/EOS is added. Special and added tokens written
 * literally in the text are recognised. *ret_ids is malloc'ed. Invalid UTF-8 is an
 * error (-EILSEQ). */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ret_ids,
        size_t *ret_n, DsError *err);

/* Decodes ids to text the way Hugging Face's decode(skip_special_tokens=False) does.
 * *ret_text is malloc'ed and NUL-terminated. */
int tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n, char **ret_text,
        size_t *ret_len, DsError *err);

uint32_t tokenizer_n_vocab(const Tokenizer *t);           /* highest id + 1 */
int32_t tokenizer_token_id(const Tokenizer *t, const char *token); /* -1 when absent */
int32_t tokenizer_bos(const Tokenizer *t);                /* -1 when none */
int32_t tokenizer_eos(const Tokenizer *t);                /* -1 when none */
bool tokenizer_add_bos(const Tokenizer *t);
ChatFamily tokenizer_chat_family(const Tokenizer *t);

/* Incremental decoding for streaming: push ids one at a time and get back only complete
 * UTF-8 text, never half a character, and the same bytes in total as tokenizer_decode()
 * over the pushed ids minus the primed ones. */
typedef struct TokStream TokStream;

#define TOK_STREAM_OUT_MAX 1024 /* the most one push can return */

int tok_stream_new(const Tokenizer *t, TokStream **ret);
TokStream *tok_stream_free(TokStream *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(TokStream *, tok_stream_free);
/* Feeds prompt ids whose text the caller already has: updates state, emits nothing. */
int tok_stream_prime(TokStream *s, const int32_t *ids, size_t n);
/* Appends the text that id completes to out; returns its length (0..TOK_STREAM_OUT_MAX). */
int tok_stream_push(TokStream *s, int32_t id, char out[static TOK_STREAM_OUT_MAX]);
/* At the end of a stream: bytes of a character that never completed, as U+FFFD. */
int tok_stream_flush(TokStream *s, char out[static TOK_STREAM_OUT_MAX]);

typedef struct ChatMessage {
        const char *role;    /* "system", "user" or "assistant" */
        const char *content;
} ChatMessage;

/* Renders messages with the family's template (with the generation prompt), ready for
 * tokenizer_encode(). The template supplies any BOS itself. */
int chat_render(const Tokenizer *t, const ChatMessage *msgs, size_t n, char **ret_text,
        DsError *err);
