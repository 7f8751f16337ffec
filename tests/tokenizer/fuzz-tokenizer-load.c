/* SPDX-License-Identifier: MIT */
/* Feeds arbitrary bytes to the tokenizer.json loader; whatever loads must then encode,
 * decode and stream without faults. */
#include <stdint.h>
#include <string.h>

#include "test_util.h"
#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static const char *const texts[] = {"", "ab ab\n", " a b  c 12 é [X] x",
                "<|end|><s>ab</s><think>", "\xc3\xa9\xf0\x9f\x98\x80 \t\r\n"};
        _cleanup_(tokenizer_freep) Tokenizer *t = NULL;
        DsError err = {};

        if (tokenizer_load_from_memory((const char *) data, size, "fuzz", &t, &err) < 0) {
                CHECK(err.code < 0 && err.msg[0], "an error comes with a message");
                return 0;
        }
        for (size_t i = 0; i < ELEMENTSOF(texts); i++) {
                _cleanup_free_ int32_t *ids = NULL;
                _cleanup_free_ char *dec = NULL;
                size_t n, len;

                if (tokenizer_encode(t, texts[i], strlen(texts[i]), &ids, &n, &err) < 0)
                        continue;
                CHECK(tokenizer_decode(t, ids, n, &dec, &len, &err) == 0, "%s", err.msg);
        }

        _cleanup_(tok_stream_freep) TokStream *s = NULL;
        char out[TOK_STREAM_OUT_MAX];
        CHECK(tok_stream_new(t, &s) == 0, "stream");
        for (int32_t id = -1; id < 20; id++)
                CHECK(tok_stream_push(s, id, out) >= 0, "push");
        CHECK(tok_stream_flush(s, out) >= 0, "flush");
        return 0;
}
