/* SPDX-License-Identifier: MIT */
/* Shared by the tokenizer's .c files only: the Tokenizer layout, two small open-addressing
 * hash tables, a growable byte buffer and the UTF-8 classification that both the full
 * decoder and the stream use, so that the two agree byte for byte. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer.h"

/* Ids are array indexes; a file asking for more is refused rather than allocated. */
#define TOK_ID_MAX (1u << 22)
/* The longest decoded piece a token may have: with it, one stream push stays within
 * TOK_STREAM_OUT_MAX even when every byte turns into a 3-byte U+FFFD. */
#define TOK_PIECE_MAX 320u
/* The longest run of byte-fallback tokens a stream holds back before deciding it. */
#define TOK_STREAM_RUN_MAX 224u

/* --- growable buffer --- */

typedef struct TokBuf {
        char *p;
        size_t n, cap;
} TokBuf;

int tokbuf_reserve(TokBuf *b, size_t extra);
int tokbuf_append(TokBuf *b, const void *data, size_t len);
void tokbuf_done(TokBuf *b);

/* Appends s with every occurrence of from replaced by to. */
int tok_replace_all(const char *s, size_t len, const char *from, const char *to, TokBuf *out);

/* --- string -> int32 map; keys are copied into the map's own arena --- */

typedef struct StrMapEntry {
        uint32_t off, len;
        int32_t value;
        uint32_t hash;
} StrMapEntry;

typedef struct StrMap {
        TokBuf arena;
        StrMapEntry *entries;
        size_t n, cap;
        uint32_t *slots; /* entry index + 1; 0 is empty */
        size_t n_slots;  /* a power of two, at least twice n */
} StrMap;

/* Returns 1 and leaves the old value when the key is present, 0 when it was added. */
int strmap_put(StrMap *m, const char *key, size_t len, int32_t value);
int32_t strmap_get(const StrMap *m, const char *key, size_t len); /* -1 when absent */
void strmap_done(StrMap *m);

/* --- uint64 -> uint64 map --- */

typedef struct U64Map {
        uint64_t *keys, *vals;
        uint8_t *used;
        size_t n, n_slots;
} U64Map;

int u64map_set(U64Map *m, uint64_t key, uint64_t val); /* inserts or overwrites */
bool u64map_get(const U64Map *m, uint64_t key, uint64_t *ret_val);
void u64map_done(U64Map *m);

/* --- the tokenizer --- */

typedef enum NormKind {
        NORM_NFC,
        NORM_PREPEND, /* a: the prefix, added to non-empty text */
        NORM_REPLACE, /* a -> b, literal */
        _NORM_MAX,
        _NORM_INVALID = -EINVAL,
} NormKind;

typedef struct NormStep {
        NormKind kind;
        char *a, *b;
} NormStep;

typedef struct AddedToken {
        int32_t id;
        char *content;
        size_t len;
        bool lstrip, rstrip, single_word, normalized, special;
} AddedToken;

/* A byte trie over added-token contents: node*256+byte -> child in edges; node_token[node]
 * is the index of the added token ending there, or -1. Node 0 is the root. */
typedef struct AddedTrie {
        U64Map edges;
        int32_t *node_token;
        size_t n_nodes;
        uint8_t first[32]; /* bitmap of bytes that start some token */
} AddedTrie;

typedef enum DecoderKind {
        DECODER_BYTE_LEVEL,
        DECODER_SENTENCEPIECE, /* Replace, ByteFallback, Fuse, Strip: each optional */
        _DECODER_MAX,
        _DECODER_INVALID = -EINVAL,
} DecoderKind;

enum {
        PIECE_EXISTS = 1 << 0,
        PIECE_SPECIAL = 1 << 1,
};

struct Tokenizer {
        /* model */
        StrMap vocab;          /* model vocabulary, strings as written in the file */
        StrMap added_by_text;  /* added-token content -> id */
        U64Map merges;         /* (left id << 32 | right id) -> (rank << 32 | merged id) */
        int32_t fallback[256]; /* byte fallback: the <0xNN> tokens, or -1 */
        int32_t unk;           /* -1 when none */
        bool byte_level;       /* ByteLevel pre-tokenizer: BPE runs on bytes */
        bool byte_fallback, fuse_unk, ignore_merges;

        NormStep *norm;
        size_t n_norm;

        /* pre-tokenizer: Split regexes applied in order, then byte-level mapping */
        pcre2_code **splits;
        size_t n_splits;
        bool prefix_space; /* ByteLevel add_prefix_space */

        AddedToken *added;
        size_t n_added;
        AddedTrie trie_raw, trie_norm; /* normalized=false / normalized=true tokens */

        /* decoder: what each id turns into */
        DecoderKind decoder;
        uint32_t n_vocab;
        uint32_t *piece_off; /* into pieces.p */
        uint16_t *piece_len;
        int16_t *piece_byte;  /* ByteFallback: the byte a <0xNN> token stands for, or -1 */
        uint8_t *piece_flags; /* PIECE_* */
        TokBuf pieces;
        char strip_char[5]; /* Strip decoder content, "" when none */
        uint32_t strip_start;

        /* tokenizer_config.json */
        int32_t bos, eos;
        bool add_bos;
        char *bos_text;
        ChatFamily chat;
        bool chat_think_prompt; /* the template opens the reply with "<think>\n" */
};

/* Reads a whole (regular, at most 1 GiB) file; *ret is malloc'ed and NUL-terminated. */
int tokenizer_read_file(const char *path, char **ret, size_t *ret_len, DsError *err);

/* --- UTF-8 --- */

/* Classifies the bytes at s (n >= 1): the length of a complete valid character; 0 when
 * all n bytes are a valid but unfinished start of one; otherwise minus the length of the
 * maximal invalid subpart, which Rust's from_utf8_lossy (and so Hugging Face) turns into
 * one U+FFFD. */
static inline int utf8_classify(const uint8_t *s, size_t n)
{
        uint8_t c = s[0], lo = 0x80, hi = 0xbf;
        int need;

        if (c < 0x80)
                return 1;
        if (c >= 0xc2 && c <= 0xdf)
                need = 1;
        else if (c == 0xe0) {
                need = 2;
                lo = 0xa0;
        } else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef)
                need = 2;
        else if (c == 0xed) {
                need = 2;
                hi = 0x9f;
        } else if (c == 0xf0) {
                need = 3;
                lo = 0x90;
        } else if (c >= 0xf1 && c <= 0xf3)
                need = 3;
        else if (c == 0xf4) {
                need = 3;
                hi = 0x8f;
        } else
                return -1;

        for (int i = 1; i <= need; i++) {
                if ((size_t) i >= n)
                        return 0;
                uint8_t b = s[i];
                if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf))
                        return -i;
        }
        return need + 1;
}

static inline bool utf8_valid(const char *s, size_t n)
{
        for (size_t i = 0; i < n;) {
                int k = utf8_classify((const uint8_t *) s + i, n - i);
                if (k <= 0)
                        return false;
                i += (size_t) k;
        }
        return true;
}

#define UTF8_REPLACEMENT "\xef\xbf\xbd"

/* --- decoding state shared by tokenizer_decode() and TokStream --- */

typedef struct DecodeState {
        TokBuf pending;              /* ByteLevel: an unfinished character; SP: a byte-token run */
        uint32_t strip_left;         /* Strip: leading strip_char still to remove */
        bool skip_special_for_strip; /* streams: special tokens do not end the strip */
        size_t run_max;              /* SP runs longer than this are decided early */
} DecodeState;

/* Appends to out the text that id completes. */
int decode_push(const Tokenizer *t, DecodeState *d, int32_t id, TokBuf *out);
/* Appends what is still held back, as U+FFFD where it never completed. */
int decode_flush(const Tokenizer *t, DecodeState *d, TokBuf *out);
void decode_state_init(const Tokenizer *t, DecodeState *d, bool stream);
