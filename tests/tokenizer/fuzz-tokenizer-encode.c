/* SPDX-License-Identifier: MIT */
/* Encodes arbitrary bytes with the real DeepSeek-V3 tokenizer. Valid UTF-8 must come back
 * unchanged from decode (no normalizer, byte-level BPE loses nothing) and a stream must
 * give the same bytes; invalid UTF-8 must be refused with -EILSEQ. The input is also read
 * as token ids, to drive the decoder through broken UTF-8. */
#include <stdint.h>
#include <string.h>

#include "test_util.h"
#include "tok_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *stream(const Tokenizer *t, const int32_t *ids, size_t n, size_t *ret_len)
{
        _cleanup_(tok_stream_freep) TokStream *s = NULL;
        char chunk[TOK_STREAM_OUT_MAX];
        TokBuf out = {};

        CHECK(tok_stream_new(t, &s) == 0, "stream");
        for (size_t i = 0; i <= n; i++) {
                int k = i < n ? tok_stream_push(s, ids[i], chunk) : tok_stream_flush(s, chunk);
                CHECK(k >= 0 && utf8_valid(chunk, (size_t) k), "chunk %zu", i);
                CHECK(tokbuf_append(&out, chunk, (size_t) k) == 0, "oom");
        }
        CHECK(tokbuf_append(&out, "", 1) == 0, "oom");
        *ret_len = out.n - 1;
        return out.p;
}

static void check_decode(
        const Tokenizer *t, const int32_t *ids, size_t n, const char *want, size_t want_len)
{
        _cleanup_free_ char *dec = NULL, *str = NULL;
        DsError err = {};
        size_t len, str_len;

        CHECK(tokenizer_decode(t, ids, n, &dec, &len, &err) == 0, "%s", err.msg);
        CHECK(utf8_valid(dec, len), "decode output is not UTF-8");
        if (want)
                CHECK(len == want_len && !memcmp(dec, want, len), "round trip differs");
        str = stream(t, ids, n, &str_len);
        CHECK(str_len == len && !memcmp(str, dec, len), "stream differs from decode");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static Tokenizer *t;
        _cleanup_free_ int32_t *ids = NULL, *raw = NULL;
        DsError err = {};
        size_t n;
        int r;

        if (!t)
                CHECK(tokenizer_load(TOKENIZER_JSON, &t, &err) == 0, "%s", err.msg);

        r = tokenizer_encode(t, (const char *) data, size, &ids, &n, &err);
        if (utf8_valid((const char *) data, size)) {
                CHECK(r == 0, "%s", err.msg);
                check_decode(t, ids, n, (const char *) data, size);
        } else
                CHECK(r == -EILSEQ, "invalid UTF-8 gave %d", r);

        /* Pairs of bytes as ids, a few past the vocabulary, which decode skips. */
        raw = malloc((size / 2 + 1) * sizeof(int32_t));
        CHECK(raw, "oom");
        for (size_t i = 0; i + 1 < size; i += 2)
                raw[i / 2] = (int32_t) ((data[i] | data[i + 1] << 8) * 2) - 1000;
        check_decode(t, raw, size / 2, NULL, 0);
        return 0;
}
