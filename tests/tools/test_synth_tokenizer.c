/* SPDX-License-Identifier: MIT */
/* The tokenizer that dsquant synth writes (argv[1]: the embedded tiny model) loads with
 * the project's tokenizer, uses its merges and ChatML specials, round-trips text and fits
 * the model's vocabulary. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "tokenizer.h"

static bool contains(const int32_t *ids, size_t n, int32_t id)
{
        for (size_t i = 0; i < n; i++)
                if (ids[i] == id)
                        return true;
        return false;
}

int main(int argc, char **argv)
{
        _cleanup_(tokenizer_freep) Tokenizer *t = NULL;
        char path[4096];
        DsError err = {0};
        bool unknown = false;

        CHECK(argc == 2, "usage: %s MODEL_DIR", argv[0]);
        snprintf(path, sizeof(path), "%s/tokenizer.json", argv[1]);
        CHECK(tokenizer_load(path, &t, &err) == 0, "load: %s", err.msg);
        snprintf(path, sizeof(path), "%s/tokenizer_config.json", argv[1]);
        CHECK(tokenizer_load_config(t, path, &unknown, &err) == 0, "config: %s", err.msg);

        CHECK(!unknown && tokenizer_chat_family(t) == CHAT_CHATML,
                "chat template not recognised as ChatML");
        CHECK(tokenizer_n_vocab(t) <= 512, "%u ids do not fit the tiny model's 512",
                tokenizer_n_vocab(t));
        int32_t eot = tokenizer_token_id(t, "<|endoftext|>");
        int32_t im_end = tokenizer_token_id(t, "<|im_end|>");
        CHECK(eot >= 0 && tokenizer_eos(t) == eot, "eos is %d, <|endoftext|> is %d",
                tokenizer_eos(t), eot);
        CHECK(im_end >= 0 && tokenizer_is_special(t, im_end), "<|im_end|> is not special");
        CHECK(!tokenizer_add_bos(t), "a ChatML tokenizer adds no BOS");

        const char *text = "Once upon a time, the little girl said: "
                           "hello!\n<|im_end|>\t\xc3\xa9\xe2\x82\xac 42";
        _cleanup_free_ int32_t *ids = NULL;
        size_t n;
        CHECK(tokenizer_encode(t, text, strlen(text), &ids, &n, &err) == 0, "encode: %s", err.msg);
        CHECK(contains(ids, n, tokenizer_token_id(t, "\xc4\xa0the")), "\" the\" is not one token");
        CHECK(contains(ids, n, tokenizer_token_id(t, "\xc4\xa0little")),
                "\" little\" is not one token");
        CHECK(contains(ids, n, im_end), "<|im_end|> in the text is not the special token");
        CHECK(n < strlen(text) / 2, "%zu tokens for %zu bytes: the merges are not used", n,
                strlen(text));

        _cleanup_free_ char *back = NULL;
        size_t len;
        CHECK(tokenizer_decode(t, ids, n, &back, &len, &err) == 0, "decode: %s", err.msg);
        CHECK(len == strlen(text) && !memcmp(back, text, len), "round trip gave \"%s\"", back);
        return 0;
}
