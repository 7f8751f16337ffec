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
 * refused with -DS_ERR_UNSUPPORTED and a message naming them, as is a token that decodes
 * to more than 320 bytes (it would not fit one stream push). Supported: BPE with vocab and
 * merges (ignore_merges, byte_fallback, unk_token, fuse_unk); normalizers NFC, Prepend,
 * Replace (literal) and Sequences of them; pre-tokenizers Split (Isolated) and ByteLevel;
 * decoders ByteLevel, or a Sequence of Replace, ByteFallback, Fuse, Strip in that order.
 * Without tokenizer_config.json a SentencePiece-style file takes "<s>" and "</s>" as BOS
 * and EOS and adds BOS; a byte-level one has neither. */
int tokenizer_load(const char *path, Tokenizer **ret, DsError *err);

/* The same from a tokenizer.json already in memory (len bytes, no NUL needed); name is
 * what error messages call it. */
int tokenizer_load_from_memory(
        const char *json, size_t len, const char *name, Tokenizer **ret, DsError *err);

/* Converts a llama2.c tokenizer.bin (int32 max_token_length, then per token float32 score,
 * int32 length, bytes) of vocab_size tokens into a Llama-2-style tokenizer.json: pieces
 * with ' ' written as U+2581, <unk>/<s>/</s> as special added tokens, byte fallback, and
 * merges derived the way Hugging Face's SentencePiece converter does (every split of a
 * piece into two pieces, ranked by the merged piece's score, highest first). Encoding
 * with the result equals llama2.c run.c's encode(). A piece of more than 320 bytes, which
 * the loader would refuse, is refused here by its id. *ret_json is malloc'ed. */
int tokenizer_json_from_llama2c(
        const char *tok_bin_path, uint32_t vocab_size, char **ret_json, DsError *err);
/* The same from the file's len bytes in memory; name is what error messages call it. */
int tokenizer_json_from_llama2c_memory(const char *bin, size_t len, const char *name,
        uint32_t vocab_size, char **ret_json, DsError *err);

/* Reads tokenizer_config.json: bos/eos tokens, add_bos_token and the chat template
 * family, recognised from the template text. A missing file is not an error. When the
 * template is of no known family, *ret_unknown_template is set so the caller can warn. */
int tokenizer_load_config(Tokenizer *t, const char *path, bool *ret_unknown_template, DsError *err);
/* The same from the file's len bytes in memory; path is what error messages call it. On an
 * error t is as it was. */
int tokenizer_config_from_memory(Tokenizer *t, const char *json, size_t len, const char *path,
        bool *ret_unknown_template, DsError *err);

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

uint32_t tokenizer_n_vocab(const Tokenizer *t);                    /* highest id + 1 */
int32_t tokenizer_token_id(const Tokenizer *t, const char *token); /* -1 when absent */
int32_t tokenizer_bos(const Tokenizer *t);                         /* -1 when none */
int32_t tokenizer_eos(const Tokenizer *t);                         /* -1 when none */
/* From tokenizer_config.json; without one, true exactly for SentencePiece-style files
 * that have a "<s>" token (Llama's habit), false for byte-level BPE. */
bool tokenizer_add_bos(const Tokenizer *t);
/* Whether id is an added token marked special (what skip_special_tokens would drop). */
bool tokenizer_is_special(const Tokenizer *t, int32_t id);
ChatFamily tokenizer_chat_family(const Tokenizer *t);

/* Incremental decoding for streaming: push ids one at a time and get back only complete
 * UTF-8 text, never half a character, and the same bytes in total as tokenizer_decode()
 * over the pushed ids minus the primed ones. Two exceptions, both for SentencePiece-style
 * decoders: the Strip step (drop the leading space) passes over special tokens, so after
 * priming with just BOS the first generated piece loses its space, as llama2.c prints it
 * (tokenizer_decode() gives "<s> Once", the stream "Once"); and a run of more than
 * TOK_STREAM_RUN_MAX (224) byte-fallback tokens is decided early, which differs from a
 * whole decode only if a later byte of the same run is invalid UTF-8. */
typedef struct TokStream TokStream;

#define TOK_STREAM_OUT_MAX 1024 /* the most one push can return */

int tok_stream_new(const Tokenizer *t, TokStream **ret);
TokStream *tok_stream_free(TokStream *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(TokStream *, tok_stream_free);
/* Feeds prompt ids whose text the caller already has: updates state, emits nothing. Bytes
 * of a character the prompt leaves unfinished come out with the push that completes it. */
int tok_stream_prime(TokStream *s, const int32_t *ids, size_t n);
/* Appends the text that id completes to out; returns its length (0..TOK_STREAM_OUT_MAX). */
int tok_stream_push(TokStream *s, int32_t id, char out[static TOK_STREAM_OUT_MAX]);
/* At the end of a stream: bytes of a character that never completed, as U+FFFD. */
int tok_stream_flush(TokStream *s, char out[static TOK_STREAM_OUT_MAX]);

typedef struct ChatMessage {
        const char *role; /* "system", "user" or "assistant" */
        const char *content;
} ChatMessage;

/* Renders messages with the family's template (with the generation prompt), ready for
 * tokenizer_encode(). The template supplies any BOS itself. */
int chat_render(
        const Tokenizer *t, const ChatMessage *msgs, size_t n, char **ret_text, DsError *err);
