/* SPDX-License-Identifier: MIT */
/* Feeds arbitrary bytes as tokenizer_config.json to the real DeepSeek-V3 tokenizer. A refused
 * file must leave the tokenizer as it was; an accepted one must render a chat (where it
 * names a template family) that is UTF-8, starts with the BOS text it set, and encodes. */
#include <stdint.h>
#include <string.h>

#include "test_util.h"
#include "tok_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct ConfigState {
        int32_t bos, eos;
        bool add_bos, think;
        ChatFamily chat;
        char *bos_text;
} ConfigState;

static void state_get(const Tokenizer *t, ConfigState *s)
{
        *s = (ConfigState){t->bos, t->eos, t->add_bos, t->chat_think_prompt, t->chat,
                t->bos_text ? strdup(t->bos_text) : NULL};
        CHECK(!t->bos_text || s->bos_text, "oom");
}

static bool state_same(const Tokenizer *t, const ConfigState *s)
{
        return t->bos == s->bos && t->eos == s->eos && t->add_bos == s->add_bos &&
               t->chat_think_prompt == s->think && t->chat == s->chat &&
               (t->bos_text && s->bos_text ? !strcmp(t->bos_text, s->bos_text)
                                           : t->bos_text == s->bos_text);
}

/* Puts the loaded file's settings back, so that every input starts from the same tokenizer. */
static void state_put(Tokenizer *t, const ConfigState *s)
{
        free(t->bos_text);
        t->bos_text = s->bos_text ? strdup(s->bos_text) : NULL;
        CHECK(!s->bos_text || t->bos_text, "oom");
        t->bos = s->bos;
        t->eos = s->eos;
        t->add_bos = s->add_bos;
        t->chat_think_prompt = s->think;
        t->chat = s->chat;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static const ChatMessage msgs[] = {{"system", "Be brief."}, {"user", "Hi é 😀"},
                {"assistant", "<think>x</think>Hello."}, {"user", "<｜User｜> and <|im_end|>"}};
        static Tokenizer *t;
        static ConfigState loaded;
        ConfigState before;
        DsError err = {};
        bool unknown = true;

        if (!t) {
                CHECK(tokenizer_load(TOKENIZER_JSON, &t, &err) == 0, "%s", err.msg);
                state_get(t, &loaded);
        }
        state_get(t, &before);
        int r = tokenizer_config_from_memory(
                t, (const char *) data, size, "fuzz/tokenizer_config.json", &unknown, &err);
        if (r < 0) {
                CHECK(err.code < 0 && err.msg[0], "an error comes with a message");
                CHECK(state_same(t, &before), "a refused file changed the tokenizer");
        } else if (t->chat != CHAT_NONE) {
                _cleanup_free_ char *text = NULL;
                _cleanup_free_ int32_t *ids = NULL;
                size_t n_ids;

                CHECK(!unknown, "a known family is not unknown");
                CHECK(chat_render(t, msgs, ELEMENTSOF(msgs), &text, &err) == 0, "%s", err.msg);
                CHECK(utf8_valid(text, strlen(text)), "the chat is not UTF-8");
                CHECK(t->chat != CHAT_DEEPSEEK_R1 || !t->bos_text ||
                                !strncmp(text, t->bos_text, strlen(t->bos_text)),
                        "the chat does not start with the BOS text");
                CHECK(tokenizer_encode(t, text, strlen(text), &ids, &n_ids, &err) == 0, "%s",
                        err.msg);
        }
        free(before.bos_text);
        state_put(t, &loaded);
        return 0;
}
