/* SPDX-License-Identifier: MIT */
/* tokenizer_config.json handling and chat rendering. The expected strings are written out
 * by hand from the template definitions (DeepSeek-R1's Jinja source and ChatML), not
 * taken from chat_render().
 * Usage: test-chat-template DEEPSEEK-TOKENIZER.json QWEN-TOKENIZER.json */
#include <string.h>

#include "test_util.h"
#include "tokenizer.h"

#define BOS                                                                                        \
        "<\xef\xbd\x9c"                                                                            \
        "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define EOS                                                                                        \
        "<\xef\xbd\x9c"                                                                            \
        "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define ASSISTANT                                                                                  \
        "<\xef\xbd\x9c"                                                                            \
        "Assistant\xef\xbd\x9c>"

static void check_render(const Tokenizer *t, const ChatMessage *m, size_t n, const char *want)
{
        _cleanup_free_ char *got = NULL;
        DsError err = {};

        CHECK(chat_render(t, m, n, &got, &err) == 0, "%s", err.msg);
        CHECK(!strcmp(got, want), "rendered\n%s\nwanted\n%s", got, want);
}

static const char *write_config(const char *name, const char *json)
{
        const char *path = test_build(name);
        FILE *f = fopen(path, "w");
        CHECK(f && fputs(json, f) >= 0 && fclose(f) == 0, "cannot write %s", path);
        return path;
}

static Tokenizer *load(const char *json, const char *config, bool *ret_unknown)
{
        Tokenizer *t = NULL;
        DsError err = {};

        CHECK(tokenizer_load(json, &t, &err) == 0, "%s", err.msg);
        CHECK(tokenizer_load_config(t, config, ret_unknown, &err) == 0, "%s", err.msg);
        return t;
}

int main(int argc, char **argv)
{
        DsError err = {};
        bool unknown = true;

        CHECK(argc == 3, "usage: %s DEEPSEEK.json QWEN.json", argv[0]);

        /* DeepSeek: BOS from the config, earlier reasoning dropped, no "<think>\n" because
         * the shipped template does not open the reply with it. */
        {
                _cleanup_(tokenizer_freep) Tokenizer *t = load(argv[1],
                        test_shared("tokenizers/deepseek-v3/tokenizer_config.json"), &unknown);
                _cleanup_free_ int32_t *ids = NULL;
                _cleanup_free_ char *text = NULL;
                size_t n;

                CHECK(!unknown && tokenizer_chat_family(t) == CHAT_DEEPSEEK_R1, "family");
                CHECK(tokenizer_bos(t) == 0 && tokenizer_eos(t) == 1 && tokenizer_add_bos(t),
                        "bos/eos");
                const ChatMessage conv[] = {
                        {"user", "What is 2+2?"},
                        {"assistant", "<think>\nEasy: <think> twice </think> then\n</think>\n\n4"},
                        {"user", "And 3+3?"},
                };
                check_render(t, conv, 3,
                        BOS USER "What is 2+2?" ASSISTANT "\n\n4" EOS USER "And 3+3?" ASSISTANT);
                const ChatMessage sys[] = {
                        {"system", "You are a helpful assistant."},
                        {"user", "Hi"},
                        {"system", "Be brief."},
                };
                check_render(t, sys, 3,
                        BOS "You are a helpful assistant.\n\nBe brief." USER "Hi" ASSISTANT);

                /* The rendered text encodes with the special tokens recognised. */
                CHECK(chat_render(t, conv, 3, &text, &err) == 0, "%s", err.msg);
                CHECK(tokenizer_encode(t, text, strlen(text), &ids, &n, &err) == 0, "%s", err.msg);
                CHECK(n > 4 && ids[0] == 0 && ids[1] == tokenizer_token_id(t, USER) &&
                                ids[n - 1] == tokenizer_token_id(t, ASSISTANT),
                        "special tokens in the rendered prompt");

                const ChatMessage bad[] = {{"tool", "x"}};
                _cleanup_free_ char *none = NULL;
                CHECK(chat_render(t, bad, 1, &none, &err) == -EINVAL, "unknown role refused");
        }

        /* A newer R1 template that opens the reply with "<think>\n". */
        {
                const char *cfg = write_config("tests/tokenizer/config-r1-think.json",
                        "{\"bos_token\": \"" BOS "\", \"eos_token\": {\"content\": \"" EOS "\"},"
                        " \"chat_template\": \"{{'" USER "' + m}}{{'" ASSISTANT
                        "<think>\\\\n'}}\"}");
                _cleanup_(tokenizer_freep) Tokenizer *t = load(argv[1], cfg, &unknown);
                const ChatMessage conv[] = {
                        {"system", "S"},
                        {"user", "U"},
                        {"assistant", "A"},
                };
                CHECK(!unknown && tokenizer_chat_family(t) == CHAT_DEEPSEEK_R1, "family");
                check_render(t, conv, 3, BOS "S" USER "U" ASSISTANT "A" EOS ASSISTANT "<think>\n");
        }

        /* Qwen: ChatML, no BOS, <|im_end|> as EOS. */
        {
                _cleanup_(tokenizer_freep) Tokenizer *t = load(
                        argv[2], test_shared("tokenizers/qwen/tokenizer_config.json"), &unknown);
                CHECK(!unknown && tokenizer_chat_family(t) == CHAT_CHATML, "family");
                CHECK(tokenizer_bos(t) == -1 && !tokenizer_add_bos(t), "no BOS");
                CHECK(tokenizer_eos(t) == tokenizer_token_id(t, "<|im_end|>"), "eos");
                const ChatMessage conv[] = {
                        {"system", "You are Qwen."},
                        {"user", "Hello"},
                        {"assistant", "Hi! How can I help?"},
                };
                check_render(t, conv, 3,
                        "<|im_start|>system\nYou are Qwen.<|im_end|>\n"
                        "<|im_start|>user\nHello<|im_end|>\n"
                        "<|im_start|>assistant\nHi! How can I help?<|im_end|>\n"
                        "<|im_start|>assistant\n");
        }

        /* An unknown template is reported; a missing file is no error; a BOS that is
         * not in the vocabulary is. */
        {
                const char *cfg = write_config("tests/tokenizer/config-unknown.json",
                        "{\"chat_template\": \"{% for m in messages %}{{ m.content }}{% endfor "
                        "%}\"}");
                _cleanup_(tokenizer_freep) Tokenizer *t = load(argv[2], cfg, &unknown);
                _cleanup_free_ char *text = NULL;
                const ChatMessage m[] = {{"user", "x"}};

                CHECK(unknown && tokenizer_chat_family(t) == CHAT_NONE, "unknown template");
                CHECK(chat_render(t, m, 1, &text, &err) == -DS_ERR_UNSUPPORTED, "no template");
                unknown = true;
                CHECK(tokenizer_load_config(
                              t, test_build("tests/tokenizer/no-such.json"), &unknown, &err) == 0 &&
                                !unknown,
                        "missing config");
                cfg = write_config(
                        "tests/tokenizer/config-bad-bos.json", "{\"bos_token\": \"<nope>\"}");
                CHECK(tokenizer_load_config(t, cfg, &unknown, &err) == -DS_ERR_FORMAT &&
                                strstr(err.msg, "config-bad-bos.json"),
                        "bad bos: %s", err.msg);
        }
        printf("chat templates: all renderings match\n");
        return 0;
}
