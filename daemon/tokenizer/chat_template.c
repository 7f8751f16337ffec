/* SPDX-License-Identifier: MIT */
/* tokenizer_config.json and the chat templates. dsd does not run Jinja: it recognises a
 * template's family from its text and renders that family's fixed layout.
 *
 * DeepSeek-R1: BOS, the system messages joined by "\n\n", then "<｜User｜>" + content per
 * user turn and "<｜Assistant｜>" + the text after the last "</think>" +
 * "<｜end▁of▁sentence｜>" per assistant turn, then "<｜Assistant｜>". Newer R1 revisions
 * open the reply with "<think>\n"; that is added when the template text does so.
 * ChatML: "<|im_start|>" role "\n" content "<|im_end|>\n" per message, then
 * "<|im_start|>assistant\n". */
#include <cjson/cJSON.h>
#include <string.h>

#include "tok_internal.h"

#define DS_USER      "<｜User｜>"
#define DS_ASSISTANT "<｜Assistant｜>"
#define DS_EOS       "<｜end▁of▁sentence｜>"

static void cjson_deletep(cJSON **j)
{
        cJSON_Delete(*j);
}

/* bos_token / eos_token: a string, an {"content": ...} object, or null for none. Returns 1
 * when the key is absent, so the default stays. */
static int config_token(const Tokenizer *t, const cJSON *root, const char *key, const char *path,
        int32_t *ret_id, const char **ret_text, DsError *err)
{
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
        const char *text;

        if (!v)
                return 1;
        if (cJSON_IsNull(v)) {
                *ret_id = -1;
                *ret_text = NULL;
                return 0;
        }
        if (cJSON_IsString(v))
                text = v->valuestring;
        else if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(v, "content")))
                text = cJSON_GetObjectItemCaseSensitive(v, "content")->valuestring;
        else
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: %s is neither a string nor a token object", path, key);
        int32_t id = tokenizer_token_id(t, text);
        if (id < 0)
                return ds_error(err, -DS_ERR_FORMAT, "%s: %s '%s' is not in the vocabulary", path,
                        key, text);
        *ret_id = id;
        *ret_text = text;
        return 0;
}

/* chat_template: a string, or a list of {"name", "template"} where "default" is used. */
static const char *config_template(const cJSON *root)
{
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "chat_template"), *e;

        if (cJSON_IsString(v))
                return v->valuestring;
        if (!cJSON_IsArray(v))
                return NULL;
        cJSON_ArrayForEach(e, v)
        {
                const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
                const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(e, "template");
                if (cJSON_IsString(name) && !strcmp(name->valuestring, "default") &&
                        cJSON_IsString(tpl))
                        return tpl->valuestring;
        }
        return NULL;
}

int tokenizer_load_config(Tokenizer *t, const char *path, bool *ret_unknown_template, DsError *err)
{
        _cleanup_free_ char *buf = NULL;
        size_t len;
        int r;

        if (!t || !path || !ret_unknown_template)
                return ds_error(err, -EINVAL, "tokenizer: invalid arguments");
        r = tokenizer_read_file(path, &buf, &len, err);
        if (r == -ENOENT) {
                *ret_unknown_template = false;
                return 0;
        }
        if (r < 0)
                return r;
        return tokenizer_config_from_memory(t, buf, len, path, ret_unknown_template, err);
}

int tokenizer_config_from_memory(Tokenizer *t, const char *json, size_t len, const char *path,
        bool *ret_unknown_template, DsError *err)
{
        _cleanup_(cjson_deletep) cJSON *root = NULL;
        int r;

        if (!t || !json || !path || !ret_unknown_template)
                return ds_error(err, -EINVAL, "tokenizer: invalid arguments");
        root = cJSON_ParseWithLength(json, len);
        if (!cJSON_IsObject(root))
                return ds_error(err, -DS_ERR_FORMAT, "%s: not a JSON object", path);

        const char *bos_text = t->bos_text, *eos_text = NULL;
        int32_t bos = t->bos, eos = t->eos;
        r = config_token(t, root, "bos_token", path, &bos, &bos_text, err);
        if (r < 0)
                return r;
        r = config_token(t, root, "eos_token", path, &eos, &eos_text, err);
        if (r < 0)
                return r;
        const cJSON *add_bos = cJSON_GetObjectItemCaseSensitive(root, "add_bos_token");
        if (add_bos && !cJSON_IsBool(add_bos) && !cJSON_IsNull(add_bos))
                return ds_error(err, -DS_ERR_FORMAT, "%s: add_bos_token is not a boolean", path);

        ChatFamily chat = CHAT_NONE;
        bool unknown = false, think = false;
        const char *tpl = config_template(root);
        if (tpl && strstr(tpl, DS_USER) && strstr(tpl, DS_ASSISTANT)) {
                chat = CHAT_DEEPSEEK_R1;
                /* The Jinja source spells the newline as backslash-n inside a string. */
                think = strstr(tpl, DS_ASSISTANT "<think>\\n") != NULL;
        } else if (tpl && strstr(tpl, "<|im_start|>"))
                chat = CHAT_CHATML;
        else if (tpl)
                unknown = true;

        char *dup = NULL;
        if (bos_text && bos_text != t->bos_text && !(dup = strdup(bos_text)))
                return ds_error(err, -ENOMEM, "%s: out of memory", path);
        if (bos_text != t->bos_text) {
                free(t->bos_text);
                t->bos_text = dup;
        }
        t->bos = bos;
        t->eos = eos;
        if (cJSON_IsBool(add_bos))
                t->add_bos = cJSON_IsTrue(add_bos);
        t->chat = chat;
        t->chat_think_prompt = think;
        *ret_unknown_template = unknown;
        return 0;
}

static int append_str(TokBuf *b, const char *s)
{
        return tokbuf_append(b, s, strlen(s));
}

static int render_deepseek(const Tokenizer *t, const ChatMessage *msgs, size_t n, TokBuf *out)
{
        bool first_system = true;
        int r = 0;

        if (t->bos_text)
                r = append_str(out, t->bos_text);
        for (size_t i = 0; i < n && r >= 0; i++) {
                if (strcmp(msgs[i].role, "system"))
                        continue;
                if (!first_system)
                        r = append_str(out, "\n\n");
                if (r >= 0)
                        r = append_str(out, msgs[i].content);
                first_system = false;
        }
        for (size_t i = 0; i < n && r >= 0; i++) {
                const char *c = msgs[i].content;
                if (!strcmp(msgs[i].role, "user")) {
                        r = append_str(out, DS_USER);
                        if (r >= 0)
                                r = append_str(out, c);
                } else if (!strcmp(msgs[i].role, "assistant")) {
                        /* Earlier reasoning is not shown to the model again. */
                        for (const char *p; (p = strstr(c, "</think>"));)
                                c = p + strlen("</think>");
                        r = append_str(out, DS_ASSISTANT);
                        if (r >= 0)
                                r = append_str(out, c);
                        if (r >= 0)
                                r = append_str(out, DS_EOS);
                }
        }
        if (r >= 0)
                r = append_str(out, t->chat_think_prompt ? DS_ASSISTANT "<think>\n" : DS_ASSISTANT);
        return r;
}

static int render_chatml(const ChatMessage *msgs, size_t n, TokBuf *out)
{
        int r = 0;

        for (size_t i = 0; i < n && r >= 0; i++) {
                r = append_str(out, "<|im_start|>");
                if (r >= 0)
                        r = append_str(out, msgs[i].role);
                if (r >= 0)
                        r = append_str(out, "\n");
                if (r >= 0)
                        r = append_str(out, msgs[i].content);
                if (r >= 0)
                        r = append_str(out, "<|im_end|>\n");
        }
        if (r >= 0)
                r = append_str(out, "<|im_start|>assistant\n");
        return r;
}

int chat_render(
        const Tokenizer *t, const ChatMessage *msgs, size_t n, char **ret_text, DsError *err)
{
        _cleanup_(tokbuf_done) TokBuf out = {};
        int r;

        if (!t || (!msgs && n) || !ret_text)
                return ds_error(err, -EINVAL, "chat: invalid arguments");
        for (size_t i = 0; i < n; i++) {
                if (!msgs[i].role || !msgs[i].content)
                        return ds_error(
                                err, -EINVAL, "chat: message %zu has no role or content", i);
                if (strcmp(msgs[i].role, "system") && strcmp(msgs[i].role, "user") &&
                        strcmp(msgs[i].role, "assistant"))
                        return ds_error(err, -EINVAL, "chat: message %zu has unknown role '%s'", i,
                                msgs[i].role);
        }

        switch (t->chat) {
        case CHAT_DEEPSEEK_R1:
                r = render_deepseek(t, msgs, n, &out);
                break;
        case CHAT_CHATML:
                r = render_chatml(msgs, n, &out);
                break;
        default:
                return ds_error(
                        err, -DS_ERR_UNSUPPORTED, "chat: the tokenizer has no chat template");
        }
        if (r >= 0)
                r = tokbuf_append(&out, "", 1);
        if (r < 0)
                return ds_error(err, r, "chat: out of memory");
        *ret_text = TAKE_PTR(out.p);
        return 0;
}
