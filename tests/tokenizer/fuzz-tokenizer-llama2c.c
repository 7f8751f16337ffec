/* SPDX-License-Identifier: MIT */
/* Feeds arbitrary bytes as a llama2.c tokenizer.bin (the first two bytes choose the vocab
 * size, 3..1026) to the converter. What it accepts it wrote itself, so the tokenizer.json
 * must load, and the tokenizer must encode and decode. */
#include <stdint.h>
#include <string.h>

#include "test_util.h"
#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static const char *const texts[] = {
                "", "ab ab\n", " a b  c 12 é x", "<s>ab</s>", "\xc3\xa9\xf0\x9f\x98\x80 \t\r\n"};
        _cleanup_(tokenizer_freep) Tokenizer *t = NULL;
        _cleanup_free_ char *json = NULL;
        DsError err = {};

        if (size < 2)
                return 0;
        uint32_t vocab = 3 + (((uint32_t) data[0] << 8 | data[1]) & 0x3ff);
        if (tokenizer_json_from_llama2c_memory((const char *) data + 2, size - 2,
                    "fuzz/tokenizer.bin", vocab, &json, &err) < 0) {
                CHECK(err.code < 0 && err.msg[0], "an error comes with a message");
                return 0;
        }
        CHECK(tokenizer_load_from_memory(json, strlen(json), "fuzz/tokenizer.json", &t, &err) == 0,
                "the converter's own output does not load: %s", err.msg);
        CHECK(tokenizer_n_vocab(t) == vocab, "vocab %u, want %u", tokenizer_n_vocab(t), vocab);
        for (size_t i = 0; i < ELEMENTSOF(texts); i++) {
                _cleanup_free_ int32_t *ids = NULL;
                _cleanup_free_ char *dec = NULL;
                size_t n, len;

                CHECK(tokenizer_encode(t, texts[i], strlen(texts[i]), &ids, &n, &err) == 0, "%s",
                        err.msg);
                CHECK(tokenizer_decode(t, ids, n, &dec, &len, &err) == 0, "%s", err.msg);
        }
        return 0;
}
