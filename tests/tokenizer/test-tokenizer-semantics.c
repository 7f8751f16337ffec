/* SPDX-License-Identifier: MIT */
/* Hugging Face behaviours the real vocabularies do not reach, on the small files of the
 * fuzz corpus. Expected ids and texts were produced by Hugging Face tokenizers 0.23.3 on
 * these same files.
 * Usage: test-tokenizer-semantics CORPUS-DIR */
#include <stdarg.h>
#include <string.h>

#include "test_util.h"
#include "tokenizer.h"

static const char *dir;

static Tokenizer *load(const char *name)
{
        char path[4096];
        Tokenizer *t = NULL;
        DsError err = {};

        snprintf(path, sizeof(path), "%s/%s", dir, name);
        CHECK(tokenizer_load(path, &t, &err) == 0, "%s", err.msg);
        return t;
}

static void check_refused(const char *name, int code, const char *what)
{
        char path[4096];
        Tokenizer *t = NULL;
        DsError err = {};

        snprintf(path, sizeof(path), "%s/%s", dir, name);
        CHECK(tokenizer_load(path, &t, &err) == code, "%s: %s", name, err.msg);
        CHECK(!t && strstr(err.msg, name) && strstr(err.msg, what), "%s: message '%s'", name,
                err.msg);
}

/* want: n ids, then the ids. */
static void check_encode(const Tokenizer *t, const char *text, size_t n, ...)
{
        _cleanup_free_ int32_t *ids = NULL;
        DsError err = {};
        size_t got;
        va_list ap;

        CHECK(tokenizer_encode(t, text, strlen(text), &ids, &got, &err) == 0, "%s", err.msg);
        CHECK(got == n, "\"%s\": %zu ids, want %zu", text, got, n);
        va_start(ap, n);
        for (size_t i = 0; i < n; i++) {
                int32_t want = va_arg(ap, int32_t);
                CHECK(ids[i] == want, "\"%s\": id %zu is %d, want %d", text, i, ids[i], want);
        }
        va_end(ap);
}

static void check_decode(const Tokenizer *t, const char *want, size_t n, const int32_t *ids)
{
        _cleanup_free_ char *got = NULL;
        DsError err = {};

        CHECK(tokenizer_decode(t, ids, n, &got, NULL, &err) == 0, "%s", err.msg);
        CHECK(!strcmp(got, want), "decoded \"%s\", want \"%s\"", got, want);
}

static void check_stream(const Tokenizer *t, size_t n_prime, const int32_t *prime, size_t n,
        const int32_t *ids, const char *want)
{
        _cleanup_(tok_stream_freep) TokStream *s = NULL;
        char out[TOK_STREAM_OUT_MAX], all[256];
        size_t pos = 0;

        CHECK(tok_stream_new(t, &s) == 0 && tok_stream_prime(s, prime, n_prime) == 0, "stream");
        for (size_t i = 0; i <= n; i++) {
                int k = i < n ? tok_stream_push(s, ids[i], out) : tok_stream_flush(s, out);
                CHECK(k >= 0 && pos + (size_t) k < sizeof(all), "push");
                memcpy(all + pos, out, (size_t) k);
                pos += (size_t) k;
        }
        all[pos] = 0;
        CHECK(!strcmp(all, want), "streamed \"%s\", want \"%s\"", all, want);
}

#define IDS(...) ELEMENTSOF(((int32_t[]){__VA_ARGS__})), ((int32_t[]){__VA_ARGS__})

int main(int argc, char **argv)
{
        CHECK(argc == 2, "usage: %s CORPUS-DIR", argv[0]);
        dir = argv[1];

        /* "[X]" is single_word, lstrip and rstrip: it needs non-word neighbours (Rust
         * regex \w: marks count as word, "²" does not) and swallows White_Space around
         * it. ByteLevel's add_prefix_space gives each text piece a leading "Ġ" (2). */
        {
                _cleanup_(tokenizer_freep) Tokenizer *t = load("bytelevel-gpt2.json");
                check_encode(t, "a [X] b", 4, 4, 8, 2, 1);
                check_encode(t, "\xc2\xa9[X]", 2, 2, 8);
                check_encode(t, "x[X]", 1, 2);
                check_encode(t, "[X]\xc3\xa9", 1, 2);
                check_encode(t, "\xcc\x81[X]", 1, 2);
                check_encode(t, "\xc2\xb2[X]", 2, 2, 8);
                check_encode(t, "\xc2\x85[X]\xc2\x85", 1, 8);
                check_encode(t, "\xe2\x80\x8b[X]\xe2\x80\x8b", 3, 2, 8, 2);
                check_encode(t, "<|end|>ab", 3, 7, 2, 3);
        }

        /* SentencePiece: byte fallback ahead of a pending unk, a run of fallback bytes
         * that is not UTF-8 becomes one U+FFFD per byte, Strip removes one space of the
         * whole text; a stream primed with BOS strips the first piece's space instead. */
        {
                _cleanup_(tokenizer_freep) Tokenizer *t = load("sentencepiece.json");
                check_encode(t, "ab", 1, 11);
                check_encode(t, "a b", 3, 9, 6, 8);
                check_encode(t, "  a", 3, 6, 6, 9);
                check_encode(t, "x\xc3\xa9", 4, 6, 3, 4, 0);
                check_encode(t, "a<s>b", 4, 9, 1, 6, 8);
                check_encode(t, "", 0);
                check_decode(t, "\xc3\xa9", IDS(3, 4));
                check_decode(t, "\xef\xbf\xbd", IDS(3));
                check_decode(t,
                        "\xef\xbf\xbd"
                        "a",
                        IDS(3, 7));
                check_decode(t,
                        "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                        "a",
                        IDS(5, 3, 4, 7));
                check_decode(t, "<s> a", IDS(1, 9));
                check_decode(t, "  a", IDS(6, 6, 9));
                check_decode(t, "\xef\xbf\xbd<unk> ab", IDS(4, 0, 11));
                check_stream(t, 0, NULL, IDS(5, 3, 4, 7),
                        "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                        "a");
                check_stream(t, IDS(1), IDS(9, 6, 8), "a b");
                check_stream(t, IDS(1, 9), IDS(6, 8), " b");
        }

        /* NFC and a sequence of Split regexes. */
        {
                _cleanup_(tokenizer_freep) Tokenizer *t = load("split-nfc.json");
                check_encode(t, "12", 2, 0, 1);
                check_encode(t, "e\xcc\x81", 1, 5);
                check_encode(t, "\xc3\xa9 x", 2, 5, 7);
                check_encode(t, "<think>x", 2, 9, 6);
        }

        check_refused("unsupported-wordpiece.json", -DS_ERR_UNSUPPORTED, "WordPiece");
        check_refused("unsupported-normalizer.json", -DS_ERR_UNSUPPORTED, "Lowercase");
        check_refused("bad-merge.json", -DS_ERR_FORMAT, "merge 0");
        check_refused("truncated.json", -DS_ERR_FORMAT, "JSON");
        printf("tokenizer semantics: all cases match\n");
        return 0;
}
