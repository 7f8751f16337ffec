/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "openai.h"

int oai_error(OaiError *e, int status, const char *param, const char *fmt, ...)
{
        va_list ap;

        e->status = status;
        e->type = status == 401   ? "authentication_error"
                  : status >= 500 ? "server_error"
                  : status == 429 ? "rate_limit_error"
                                  : "invalid_request_error";
        e->code = NULL;
        snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
        va_start(ap, fmt);
        vsnprintf(e->message, sizeof(e->message), fmt, ap);
        va_end(ap);
        return -EINVAL;
}

int oai_error_json(StrBuf *b, const OaiError *e)
{
        int r = 0;

        r = r ?: strbuf_puts(b, "{\"error\":{\"message\":");
        r = r ?: strbuf_json_string(b, e->message, strlen(e->message));
        r = r ?: strbuf_puts(b, ",\"type\":");
        r = r ?: strbuf_json_string(b, e->type, strlen(e->type));
        r = r ?: strbuf_puts(b, ",\"param\":");
        r = r
                    ?: (e->param[0] ? strbuf_json_string(b, e->param, strlen(e->param))
                                    : strbuf_puts(b, "null"));
        r = r ?: strbuf_puts(b, ",\"code\":");
        r = r
                    ?: (e->code ? strbuf_json_string(b, e->code, strlen(e->code))
                                : strbuf_puts(b, "null"));
        return r ?: strbuf_puts(b, "}}");
}

// --- Field decoding ----------------------------------------------------------------------

static void cjson_deletep(cJSON **j)
{
        cJSON_Delete(*j);
}

/* The body as a JSON object, or a 400. */
static int parse_object(const char *body, size_t len, cJSON **ret, OaiError *e)
{
        if (len == 0)
                return oai_error(e, 400, NULL, "The request body is empty; send a JSON object");
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, false);
        if (!j)
                return oai_error(e, 400, NULL,
                        "The request body is not valid JSON (near byte "
                        "%zu)",
                        (size_t) (cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - body : 0));
        /* cJSON stops after the first value: what follows must be whitespace, or the body
         * is not one JSON document. */
        for (size_t i = (size_t) (end - body); i < len; i++)
                if (!strchr(" \t\r\n", body[i]) || body[i] == 0) {
                        cJSON_Delete(j);
                        return oai_error(e, 400, NULL,
                                "The request body is not valid JSON: "
                                "data after the object at byte %zu",
                                i);
                }
        if (!cJSON_IsObject(j)) {
                cJSON_Delete(j);
                return oai_error(e, 400, NULL, "The request body must be a JSON object");
        }
        *ret = j;
        return 0;
}

/* A field, or NULL when absent or null (OpenAI treats null as "not given"). */
static const cJSON *field(const cJSON *o, const char *name)
{
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
        return f && !cJSON_IsNull(f) ? f : NULL;
}

static int get_bool(const cJSON *o, const char *name, bool *v, OaiError *e)
{
        const cJSON *f = field(o, name);
        if (!f)
                return 0;
        if (!cJSON_IsBool(f))
                return oai_error(e, 400, name, "'%s' must be a boolean", name);
        *v = cJSON_IsTrue(f);
        return 0;
}

static int get_number(
        const cJSON *o, const char *name, double lo, double hi, double *v, OaiError *e)
{
        const cJSON *f = field(o, name);
        if (!f)
                return 0;
        if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble))
                return oai_error(e, 400, name, "'%s' must be a number", name);
        if (f->valuedouble < lo || f->valuedouble > hi)
                return oai_error(e, 400, name, "'%s' must be between %g and %g, got %g", name, lo,
                        hi, f->valuedouble);
        *v = f->valuedouble;
        return 0;
}

/* Returns 1 when present, 0 when absent. */
static int get_int(const cJSON *o, const char *name, double lo, double hi, int64_t *v, OaiError *e)
{
        const cJSON *f = field(o, name);
        if (!f)
                return 0;
        if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble) ||
                f->valuedouble != floor(f->valuedouble))
                return oai_error(e, 400, name, "'%s' must be an integer", name);
        if (f->valuedouble < lo || f->valuedouble > hi)
                return oai_error(e, 400, name, "'%s' must be between %.0f and %.0f, got %.0f", name,
                        lo, hi, f->valuedouble);
        *v = (int64_t) f->valuedouble;
        return 1;
}

static int dup_string(const char *s, char **ret, OaiError *e)
{
        char *d = strdup(s);
        if (!d)
                return oai_error(e, 500, NULL, "Out of memory"), -ENOMEM;
        *ret = d;
        return 0;
}

/* Message content: a string, or an array of {"type": "text", "text": "..."} parts that
 * are concatenated. */
static int get_content(const cJSON *c, const char *param, char **ret, OaiError *e)
{
        if (cJSON_IsString(c))
                return dup_string(c->valuestring, ret, e);
        if (!cJSON_IsArray(c))
                return oai_error(e, 400, param,
                        "'%s' must be a string or an array of text "
                        "parts",
                        param);
        StrBuf b = {};
        const cJSON *part;
        cJSON_ArrayForEach(part, c)
        {
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
                if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
                        !cJSON_IsString(text)) {
                        strbuf_free(&b);
                        return oai_error(e, 400, param,
                                "'%s' parts must be "
                                "{\"type\": \"text\", \"text\": string}",
                                param);
                }
                if (strbuf_puts(&b, text->valuestring) < 0) {
                        strbuf_free(&b);
                        return oai_error(e, 500, NULL, "Out of memory"), -ENOMEM;
                }
        }
        if (!b.data)
                return dup_string("", ret, e);
        *ret = b.data;
        return 0;
}

static int get_messages(
        const cJSON *o, bool required, ChatMessage **ret, size_t *ret_n, OaiError *e)
{
        const cJSON *m = field(o, "messages");
        int r;

        if (!m) {
                if (required)
                        return oai_error(e, 400, "messages", "'messages' is required");
                return 0;
        }
        if (!cJSON_IsArray(m))
                return oai_error(e, 400, "messages", "'messages' must be an array");
        int n = cJSON_GetArraySize(m);
        if (n == 0)
                return oai_error(e, 400, "messages", "'messages' must not be empty");
        if ((unsigned) n > OAI_MESSAGES_MAX)
                return oai_error(e, 400, "messages", "'messages' has %d entries; at most %u", n,
                        OAI_MESSAGES_MAX);

        ChatMessage *msgs = calloc((size_t) n, sizeof(*msgs));
        if (!msgs)
                return oai_error(e, 500, NULL, "Out of memory"), -ENOMEM;
        size_t i = 0;
        const cJSON *msg;
        cJSON_ArrayForEach(msg, m)
        {
                char param[64];
                snprintf(param, sizeof(param), "messages[%zu].role", i);
                const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
                if (!cJSON_IsObject(msg)) {
                        snprintf(param, sizeof(param), "messages[%zu]", i);
                        r = oai_error(e, 400, param, "'%s' must be an object", param);
                        goto fail;
                }
                if (!cJSON_IsString(role)) {
                        r = oai_error(e, 400, param, "'%s' must be a string", param);
                        goto fail;
                }
                /* "developer" is OpenAI's newer name for the system role. */
                const char *rn = role->valuestring;
                if (strcmp(rn, "developer") == 0)
                        rn = "system";
                if (strcmp(rn, "system") != 0 && strcmp(rn, "user") != 0 &&
                        strcmp(rn, "assistant") != 0) {
                        r = oai_error(e, 400, param,
                                "'%s' must be system, user or assistant, "
                                "not '%.32s'",
                                param, role->valuestring);
                        goto fail;
                }
                snprintf(param, sizeof(param), "messages[%zu].content", i);
                const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
                char *text = NULL;
                if (!content || cJSON_IsNull(content)) {
                        r = oai_error(e, 400, param, "'%s' is required", param);
                        goto fail;
                }
                r = get_content(content, param, &text, e);
                if (r < 0)
                        goto fail;
                msgs[i].content = text;
                msgs[i].role = strdup(rn);
                if (!msgs[i].role) {
                        oai_error(e, 500, NULL, "Out of memory");
                        r = -ENOMEM;
                        goto fail;
                }
                i++;
        }
        *ret = msgs;
        *ret_n = i;
        return 0;
fail:
        for (size_t k = 0; k <= i && k < (size_t) n; k++) {
                free((char *) msgs[k].role);
                free((char *) msgs[k].content);
        }
        free(msgs);
        return r;
}

static void free_messages(ChatMessage *m, size_t n)
{
        for (size_t i = 0; i < n; i++) {
                free((char *) m[i].role);
                free((char *) m[i].content);
        }
        free(m);
}

/* "prompt" of /v1/completions: a string, an array of one string, or an array of token
 * ids (or an array holding one such array). n = 1 only, so one prompt. */
static int get_prompt(const cJSON *o, OaiRequest *q, OaiError *e)
{
        const cJSON *p = field(o, "prompt");

        if (!p)
                return oai_error(e, 400, "prompt", "'prompt' is required");
        if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 &&
                (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
                p = p->child;
        if (cJSON_IsString(p))
                return dup_string(p->valuestring, &q->prompt, e);
        if (!cJSON_IsArray(p))
                return oai_error(e, 400, "prompt",
                        "'prompt' must be a string or an array of "
                        "token ids");
        int n = cJSON_GetArraySize(p);
        if (n == 0)
                return oai_error(e, 400, "prompt", "'prompt' must not be empty");
        q->prompt_ids = calloc((size_t) n, sizeof(int32_t));
        if (!q->prompt_ids)
                return oai_error(e, 500, NULL, "Out of memory"), -ENOMEM;
        const cJSON *id;
        cJSON_ArrayForEach(id, p)
        {
                if (!cJSON_IsNumber(id) || id->valuedouble != floor(id->valuedouble) ||
                        id->valuedouble < 0 || id->valuedouble > INT32_MAX)
                        return oai_error(e, 400, "prompt",
                                "'prompt' must be one string or one "
                                "array of token ids (n is 1)");
                q->prompt_ids[q->n_prompt_ids++] = (int32_t) id->valuedouble;
        }
        return 0;
}

static int get_stops(const cJSON *o, OaiRequest *q, OaiError *e)
{
        const cJSON *s = field(o, "stop");
        const cJSON *item;

        if (!s)
                return 0;
        if (cJSON_IsString(s)) {
                item = s;
                goto one;
        }
        if (!cJSON_IsArray(s))
                return oai_error(e, 400, "stop",
                        "'stop' must be a string or an array of "
                        "strings");
        if ((unsigned) cJSON_GetArraySize(s) > OAI_STOPS_MAX)
                return oai_error(e, 400, "stop", "'stop' has at most %u strings", OAI_STOPS_MAX);
        cJSON_ArrayForEach(item, s)
        {
        one:
                if (!cJSON_IsString(item))
                        return oai_error(e, 400, "stop",
                                "'stop' must be a string or an array "
                                "of strings");
                size_t n = strlen(item->valuestring);
                if (n == 0 || n > OAI_STOP_LEN_MAX)
                        return oai_error(e, 400, "stop",
                                "each 'stop' string must be 1 to %u "
                                "bytes",
                                OAI_STOP_LEN_MAX);
                int r = dup_string(item->valuestring, &q->stops[q->n_stops], e);
                if (r < 0)
                        return r;
                q->n_stops++;
                if (s == item)
                        break;
        }
        return 0;
}

/* Fields OpenAI defines that dsd does not implement: refused when they ask for something,
 * so that a client never silently gets less than it asked for. */
static int refuse_unsupported(const cJSON *o, OaiKind kind, OaiError *e)
{
        const cJSON *f;

        if ((f = field(o, "tools")) && (!cJSON_IsArray(f) || cJSON_GetArraySize(f) > 0))
                return oai_error(e, 400, "tools", "'tools' is not supported");
        if ((f = field(o, "functions")))
                return oai_error(e, 400, "functions", "'functions' is not supported");
        if ((f = field(o, "logit_bias")) && (!cJSON_IsObject(f) || f->child))
                return oai_error(e, 400, "logit_bias", "'logit_bias' is not supported");
        if ((f = field(o, "response_format"))) {
                const cJSON *t = cJSON_GetObjectItemCaseSensitive(f, "type");
                if (!cJSON_IsString(t) || strcmp(t->valuestring, "text") != 0)
                        return oai_error(e, 400, "response_format",
                                "only 'response_format' "
                                "{\"type\": \"text\"} is "
                                "supported");
        }
        if (kind == OAI_COMPLETION) {
                bool echo = false;
                int64_t best_of = 1;
                if (get_bool(o, "echo", &echo, e) < 0)
                        return -EINVAL;
                if (echo)
                        return oai_error(e, 400, "echo", "'echo' is not supported");
                if (get_int(o, "best_of", 1, 1, &best_of, e) < 0)
                        return -EINVAL;
                if (field(o, "suffix"))
                        return oai_error(e, 400, "suffix", "'suffix' is not supported");
        }
        return 0;
}

static int parse_request(OaiKind kind, const cJSON *o, OaiRequest *q, OaiError *e)
{
        int64_t v;
        double d;
        int r;

        const cJSON *model = field(o, "model");
        if (model && !cJSON_IsString(model))
                return oai_error(e, 400, "model", "'model' must be a string");
        if (model && (r = dup_string(model->valuestring, &q->model, e)) < 0)
                return r;

        if (kind == OAI_CHAT)
                r = get_messages(o, true, &q->messages, &q->n_messages, e);
        else
                r = get_prompt(o, q, e);
        if (r < 0)
                return r;

        r = get_int(o, "n", 1, 1, &v, e);
        if (r < 0)
                return oai_error(e, 400, "n", "'n' must be 1: dsd returns one choice");

        /* max_completion_tokens is the newer name; the two must agree when both are given. */
        int64_t mt = -1, mct = -1;
        if (get_int(o, "max_tokens", 1, UINT32_MAX - 1, &mt, e) < 0 ||
                get_int(o, "max_completion_tokens", 1, UINT32_MAX - 1, &mct, e) < 0)
                return -EINVAL;
        if (mt >= 0 && mct >= 0 && mt != mct)
                return oai_error(e, 400, "max_completion_tokens",
                        "'max_tokens' and "
                        "'max_completion_tokens' "
                        "differ");
        q->max_tokens = mct >= 0 ? (uint32_t) mct : mt >= 0 ? (uint32_t) mt : UINT32_MAX;

        d = 1.0;
        if (get_number(o, "temperature", 0, 2, &d, e) < 0)
                return -EINVAL;
        q->sampling.temperature = (float) d;
        d = 1.0;
        if (get_number(o, "top_p", 0, 1, &d, e) < 0)
                return -EINVAL;
        if (d <= 0)
                return oai_error(e, 400, "top_p", "'top_p' must be greater than 0");
        q->sampling.top_p = (float) d;
        /* -1 is vLLM's spelling of "no top-k". */
        v = 0;
        if (get_int(o, "top_k", -1, 1u << 20, &v, e) < 0)
                return -EINVAL;
        q->sampling.top_k = v < 0 ? 0 : (uint32_t) v;
        d = 0;
        if (get_number(o, "min_p", 0, 1, &d, e) < 0)
                return -EINVAL;
        q->sampling.min_p = (float) d;
        d = 0;
        if (get_number(o, "presence_penalty", -2, 2, &d, e) < 0)
                return -EINVAL;
        q->sampling.presence_penalty = (float) d;
        d = 0;
        if (get_number(o, "frequency_penalty", -2, 2, &d, e) < 0)
                return -EINVAL;
        q->sampling.frequency_penalty = (float) d;
        d = 1.0;
        if (get_number(o, "repetition_penalty", 0.01, 100, &d, e) < 0)
                return -EINVAL;
        q->sampling.repetition_penalty = (float) d;
        /* Seeds are 64-bit; JSON numbers (doubles) are exact up to 2^53. */
        r = get_int(o, "seed", -9007199254740992.0, 9007199254740992.0, &v, e);
        if (r < 0)
                return r;
        q->has_seed = r > 0;
        q->sampling.seed = (uint64_t) v;

        r = get_stops(o, q, e);
        if (r < 0)
                return r;

        if (kind == OAI_CHAT) {
                if (get_bool(o, "logprobs", &q->logprobs, e) < 0)
                        return -EINVAL;
                r = get_int(o, "top_logprobs", 0, OAI_TOP_LOGPROBS_MAX, &v, e);
                if (r < 0)
                        return r;
                if (r > 0 && !q->logprobs)
                        return oai_error(e, 400, "top_logprobs",
                                "'top_logprobs' needs "
                                "'logprobs': true");
                q->top_logprobs = r > 0 ? (uint32_t) v : 0;
        } else {
                /* Legacy completions: logprobs is the number of alternatives. */
                r = get_int(o, "logprobs", 0, OAI_TOP_LOGPROBS_MAX, &v, e);
                if (r < 0)
                        return r;
                q->logprobs = r > 0;
                q->top_logprobs = r > 0 ? (uint32_t) v : 0;
        }

        if (get_bool(o, "stream", &q->stream, e) < 0)
                return -EINVAL;
        const cJSON *so = field(o, "stream_options");
        if (so) {
                if (!q->stream)
                        return oai_error(e, 400, "stream_options",
                                "'stream_options' needs "
                                "'stream': true");
                if (!cJSON_IsObject(so))
                        return oai_error(e, 400, "stream_options",
                                "'stream_options' must be "
                                "an object");
                if (get_bool(so, "include_usage", &q->include_usage, e) < 0)
                        return oai_error(e, 400, "stream_options.include_usage",
                                "'stream_options.include_usage' must be a boolean");
        }

        const cJSON *rf = field(o, "reasoning_format");
        if (rf) {
                if (!cJSON_IsString(rf) || (strcmp(rf->valuestring, "inline") != 0 &&
                                                   strcmp(rf->valuestring, "separate") != 0))
                        return oai_error(e, 400, "reasoning_format",
                                "'reasoning_format' must "
                                "be \"inline\" or "
                                "\"separate\"");
                q->reasoning_inline = strcmp(rf->valuestring, "inline") == 0;
        }
        if (get_bool(o, "dsd_timing", &q->dsd_timing, e) < 0)
                return -EINVAL;

        return refuse_unsupported(o, kind, e);
}

int oai_request_parse(OaiKind kind, const char *body, size_t len, OaiRequest **ret, OaiError *e)
{
        _cleanup_(cjson_deletep) cJSON *o = NULL;
        int r;

        assert(kind >= 0 && kind < _OAI_KIND_MAX);
        r = parse_object(body, len, &o, e);
        if (r < 0)
                return r;
        OaiRequest *q = calloc(1, sizeof(*q));
        if (!q)
                return oai_error(e, 500, NULL, "Out of memory"), -ENOMEM;
        q->kind = kind;
        r = parse_request(kind, o, q, e);
        if (r < 0) {
                oai_request_free(q);
                return r;
        }
        *ret = q;
        return 0;
}

OaiRequest *oai_request_free(OaiRequest *r)
{
        if (!r)
                return NULL;
        free(r->model);
        free_messages(r->messages, r->n_messages);
        free(r->prompt);
        free(r->prompt_ids);
        for (uint32_t i = 0; i < r->n_stops; i++)
                free(r->stops[i]);
        free(r);
        return NULL;
}

int oai_tokenize_parse(const char *body, size_t len, OaiTokenizeRequest **ret, OaiError *e)
{
        _cleanup_(cjson_deletep) cJSON *o = NULL;
        int r;

        r = parse_object(body, len, &o, e);
        if (r < 0)
                return r;
        OaiTokenizeRequest *q = calloc(1, sizeof(*q));
        if (!q)
                return oai_error(e, 500, NULL, "Out of memory"), -ENOMEM;
        q->add_special = true;
        const cJSON *p = field(o, "prompt");
        if (p && field(o, "messages"))
                r = oai_error(e, 400, "messages", "give 'prompt' or 'messages', not both");
        else if (p && !cJSON_IsString(p))
                r = oai_error(e, 400, "prompt", "'prompt' must be a string");
        else if (p)
                r = dup_string(p->valuestring, &q->prompt, e);
        else if (!field(o, "messages"))
                r = oai_error(e, 400, "prompt", "'prompt' or 'messages' is required");
        else
                r = get_messages(o, true, &q->messages, &q->n_messages, e);
        if (r >= 0)
                r = get_bool(o, "add_special_tokens", &q->add_special, e);
        if (r < 0) {
                oai_tokenize_free(q);
                return r;
        }
        *ret = q;
        return 0;
}

OaiTokenizeRequest *oai_tokenize_free(OaiTokenizeRequest *r)
{
        if (!r)
                return NULL;
        free(r->prompt);
        free_messages(r->messages, r->n_messages);
        free(r);
        return NULL;
}

int oai_detokenize_parse(const char *body, size_t len, uint32_t n_vocab, int32_t **ret_ids,
        size_t *ret_n, OaiError *e)
{
        _cleanup_(cjson_deletep) cJSON *o = NULL;
        int r;

        r = parse_object(body, len, &o, e);
        if (r < 0)
                return r;
        const cJSON *t = field(o, "tokens");
        if (!t)
                return oai_error(e, 400, "tokens", "'tokens' is required");
        if (!cJSON_IsArray(t))
                return oai_error(e, 400, "tokens", "'tokens' must be an array of token ids");
        int n = cJSON_GetArraySize(t);
        int32_t *ids = calloc((size_t) n + 1, sizeof(int32_t));
        if (!ids)
                return oai_error(e, 500, NULL, "Out of memory"), -ENOMEM;
        size_t i = 0;
        const cJSON *id;
        cJSON_ArrayForEach(id, t)
        {
                if (!cJSON_IsNumber(id) || id->valuedouble != floor(id->valuedouble) ||
                        id->valuedouble < 0 || id->valuedouble >= n_vocab) {
                        free(ids);
                        return oai_error(e, 400, "tokens",
                                "'tokens[%zu]' is not a token id "
                                "below %u",
                                i, n_vocab);
                }
                ids[i++] = (int32_t) id->valuedouble;
        }
        *ret_ids = ids;
        *ret_n = i;
        return 0;
}

// --- Responses ---------------------------------------------------------------------------

const char *oai_finish_reason(int finish)
{
        switch (finish) {
        case FINISH_LENGTH:
                return "length";
        case FINISH_EOS:
        case FINISH_STOP:
                return "stop";
        default:
                return NULL;
        }
}

/* The token's bytes as a JSON array of numbers, as OpenAI's "bytes". */
static int bytes_json(StrBuf *b, const char *s, size_t n)
{
        int r = strbuf_puts(b, "[");
        for (size_t i = 0; r >= 0 && i < n; i++)
                r = strbuf_printf(b, i ? ",%u" : "%u", (unsigned) (uint8_t) s[i]);
        return r ?: strbuf_puts(b, "]");
}

/* A logprob as JSON: the softmax of a masked logit is -inf, which JSON cannot carry. */
static int logprob_json(StrBuf *b, float lp)
{
        return strbuf_printf(b, "%.9g", isfinite(lp) ? (double) lp : -9999.0);
}

static int chat_logprob_entry(StrBuf *b, const OaiLogprobEntry *t)
{
        int r = 0;
        r = r ?: strbuf_puts(b, "{\"token\":");
        r = r ?: strbuf_json_string(b, t->text, t->len);
        r = r ?: strbuf_puts(b, ",\"logprob\":");
        r = r ?: logprob_json(b, t->logprob);
        r = r ?: strbuf_puts(b, ",\"bytes\":");
        return r ?: bytes_json(b, t->text, t->len);
}

int oai_logprobs_add(
        OaiLogprobs *l, const OaiLogprobEntry *s, const OaiLogprobEntry *top, uint32_t n_top)
{
        int r = 0;

        if (l->kind == OAI_CHAT) {
                StrBuf *b = &l->items;
                r = r ?: (l->n ? strbuf_puts(b, ",") : 0);
                r = r ?: chat_logprob_entry(b, s);
                r = r ?: strbuf_puts(b, ",\"top_logprobs\":[");
                for (uint32_t i = 0; r >= 0 && i < n_top; i++) {
                        r = r ?: (i ? strbuf_puts(b, ",") : 0);
                        r = r ?: chat_logprob_entry(b, &top[i]);
                        r = r ?: strbuf_puts(b, "}");
                }
                r = r ?: strbuf_puts(b, "]}");
        } else {
                const char *sep = l->n ? "," : "";
                r = r ?: strbuf_puts(&l->items, sep);
                r = r ?: strbuf_json_string(&l->items, s->text, s->len);
                r = r ?: strbuf_puts(&l->values, sep);
                r = r ?: logprob_json(&l->values, s->logprob);
                r = r ?: strbuf_printf(&l->offsets, "%s%" PRIu64, sep, l->text_offset);
                r = r ?: strbuf_puts(&l->tops, sep);
                r = r ?: strbuf_puts(&l->tops, "{");
                for (uint32_t i = 0; r >= 0 && i < n_top; i++) {
                        r = r ?: (i ? strbuf_puts(&l->tops, ",") : 0);
                        r = r ?: strbuf_json_string(&l->tops, top[i].text, top[i].len);
                        r = r ?: strbuf_puts(&l->tops, ":");
                        r = r ?: logprob_json(&l->tops, top[i].logprob);
                }
                r = r ?: strbuf_puts(&l->tops, "}");
                l->text_offset += s->len;
        }
        if (r >= 0)
                l->n++;
        return r;
}

static const char *sb(const StrBuf *b)
{
        return b->data ? b->data : "";
}

int oai_logprobs_json(StrBuf *b, const OaiLogprobs *l)
{
        if (!l || l->n == 0)
                return strbuf_puts(b, "null");
        if (l->kind == OAI_CHAT)
                return strbuf_printf(b, "{\"content\":[%s]}", sb(&l->items));
        return strbuf_printf(b,
                "{\"tokens\":[%s],\"token_logprobs\":[%s],\"top_logprobs\":[%s],"
                "\"text_offset\":[%s]}",
                sb(&l->items), sb(&l->values), sb(&l->tops), sb(&l->offsets));
}

void oai_logprobs_clear(OaiLogprobs *l)
{
        strbuf_clear(&l->items);
        strbuf_clear(&l->values);
        strbuf_clear(&l->tops);
        strbuf_clear(&l->offsets);
        l->n = 0;
}

void oai_logprobs_free(OaiLogprobs *l)
{
        strbuf_free(&l->items);
        strbuf_free(&l->values);
        strbuf_free(&l->tops);
        strbuf_free(&l->offsets);
        l->n = 0;
}

static int usage_json(StrBuf *b, const OaiUsage *u)
{
        return strbuf_printf(b,
                "{\"prompt_tokens\":%u,\"completion_tokens\":%u,\"total_tokens\":%" PRIu64 "}",
                u->prompt_tokens, u->completion_tokens,
                (uint64_t) u->prompt_tokens + u->completion_tokens);
}

static int header_json(StrBuf *b, const OaiResponse *r, const char *object)
{
        int k = strbuf_puts(b, "{\"id\":");
        k = k ?: strbuf_json_string(b, r->id, strlen(r->id));
        k = k
                    ?: strbuf_printf(b,
                               ",\"object\":\"%s\",\"created\":%" PRId64 ",\"model\":", object,
                               r->created);
        return k ?: strbuf_json_string(b, r->model, strlen(r->model));
}

static int finish_json(StrBuf *b, const char *finish)
{
        return finish ? strbuf_printf(b, "\"%s\"", finish) : strbuf_puts(b, "null");
}

int oai_response_json(StrBuf *b, const OaiResponse *r, const char *content, size_t content_len,
        const char *reasoning, size_t reasoning_len, const OaiLogprobs *logprobs,
        const char *finish_reason, const OaiUsage *usage)
{
        bool chat = r->kind == OAI_CHAT;
        int k = header_json(b, r, chat ? "chat.completion" : "text_completion");

        k = k ?: strbuf_puts(b, ",\"choices\":[{\"index\":0,");
        if (chat) {
                k = k ?: strbuf_puts(b, "\"message\":{\"role\":\"assistant\",\"content\":");
                k = k ?: strbuf_json_string(b, content, content_len);
                if (reasoning) {
                        k = k ?: strbuf_puts(b, ",\"reasoning_content\":");
                        k = k ?: strbuf_json_string(b, reasoning, reasoning_len);
                }
                k = k ?: strbuf_puts(b, "},");
        } else {
                k = k ?: strbuf_puts(b, "\"text\":");
                k = k ?: strbuf_json_string(b, content, content_len);
                k = k ?: strbuf_puts(b, ",");
        }
        k = k ?: strbuf_puts(b, "\"logprobs\":");
        k = k ?: oai_logprobs_json(b, logprobs);
        k = k ?: strbuf_puts(b, ",\"finish_reason\":");
        k = k ?: finish_json(b, finish_reason);
        k = k ?: strbuf_puts(b, "}],\"usage\":");
        k = k ?: usage_json(b, usage);
        return k ?: strbuf_puts(b, "}");
}

int oai_stream_chunk(StrBuf *b, const OaiResponse *r, bool role, const char *content,
        size_t content_len, const char *reasoning, size_t reasoning_len,
        const OaiLogprobs *logprobs, const char *finish_reason, bool include_usage)
{
        bool chat = r->kind == OAI_CHAT;
        int k = strbuf_puts(b, "data: ");

        k = k ?: header_json(b, r, chat ? "chat.completion.chunk" : "text_completion");
        k = k ?: strbuf_puts(b, ",\"choices\":[{\"index\":0,");
        if (chat) {
                const char *sep = "";
                k = k ?: strbuf_puts(b, "\"delta\":{");
                if (role) {
                        k = k ?: strbuf_puts(b, "\"role\":\"assistant\"");
                        sep = ",";
                }
                if (content) {
                        k = k ?: strbuf_printf(b, "%s\"content\":", sep);
                        k = k ?: strbuf_json_string(b, content, content_len);
                        sep = ",";
                }
                if (reasoning) {
                        k = k ?: strbuf_printf(b, "%s\"reasoning_content\":", sep);
                        k = k ?: strbuf_json_string(b, reasoning, reasoning_len);
                }
                k = k ?: strbuf_puts(b, "},");
        } else {
                k = k ?: strbuf_puts(b, "\"text\":");
                k = k ?: strbuf_json_string(b, content ? content : "", content ? content_len : 0);
                k = k ?: strbuf_puts(b, ",");
        }
        k = k ?: strbuf_puts(b, "\"logprobs\":");
        k = k ?: oai_logprobs_json(b, logprobs);
        k = k ?: strbuf_puts(b, ",\"finish_reason\":");
        k = k ?: finish_json(b, finish_reason);
        k = k ?: strbuf_puts(b, "}]");
        /* OpenAI: with include_usage every chunk carries "usage": null but the last. */
        if (include_usage)
                k = k ?: strbuf_puts(b, ",\"usage\":null");
        if (r->publish_ns)
                k = k ?: strbuf_printf(b, ",\"dsd_publish_ns\":%" PRIu64, r->publish_ns);
        return k ?: strbuf_puts(b, "}\n\n");
}

int oai_stream_usage(StrBuf *b, const OaiResponse *r, const OaiUsage *usage)
{
        int k = strbuf_puts(b, "data: ");
        k = k
                    ?: header_json(b, r,
                               r->kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion");
        k = k ?: strbuf_puts(b, ",\"choices\":[],\"usage\":");
        k = k ?: usage_json(b, usage);
        return k ?: strbuf_puts(b, "}\n\n");
}

int oai_stream_done(StrBuf *b)
{
        return strbuf_puts(b, "data: [DONE]\n\n");
}

int oai_models_json(StrBuf *b, const char *model, int64_t created)
{
        int k = strbuf_puts(b, "{\"object\":\"list\",\"data\":[");
        if (model) {
                k = k ?: strbuf_puts(b, "{\"id\":");
                k = k ?: strbuf_json_string(b, model, strlen(model));
                k = k
                            ?: strbuf_printf(b,
                                       ",\"object\":\"model\",\"created\":%" PRId64
                                       ",\"owned_by\":\"dsd\"}",
                                       created);
        }
        return k ?: strbuf_puts(b, "]}");
}

// --- <think> splitting -------------------------------------------------------------------

static const char THINK_OPEN[] = "<think>";
static const char THINK_CLOSE[] = "</think>";

void think_split_init(ThinkSplit *t, bool inside)
{
        *t = (ThinkSplit){.state = inside ? THINK_INSIDE : THINK_START};
}

static StrBuf *think_target(const ThinkSplit *t, StrBuf *reasoning, StrBuf *content)
{
        return t->state == THINK_INSIDE ? reasoning : content;
}

int think_split_feed(
        ThinkSplit *t, const char *text, size_t len, StrBuf *reasoning, StrBuf *content)
{
        int r;

        for (size_t i = 0; i < len; i++) {
                char c = text[i];
                if (t->state == THINK_CONTENT) {
                        /* The rest goes through unexamined. */
                        return strbuf_append(content, text + i, len - i);
                }
                const char *tag = t->state == THINK_INSIDE ? THINK_CLOSE : THINK_OPEN;
                if (c == tag[t->matched]) {
                        if (tag[++t->matched])
                                continue;
                        /* A whole tag: it is dropped and the state moves on. */
                        t->matched = 0;
                        t->state = t->state == THINK_INSIDE ? THINK_CONTENT : THINK_INSIDE;
                        continue;
                }
                /* Not the tag after all: the held bytes are text. Both tags start with '<'
                 * and hold no other '<', so the current byte can only restart a match. */
                StrBuf *out = think_target(t, reasoning, content);
                r = strbuf_append(out, tag, t->matched);
                if (r < 0)
                        return r;
                t->matched = 0;
                if (t->state == THINK_START) {
                        /* Output that does not open with <think> has no reasoning. */
                        t->state = THINK_CONTENT;
                        return strbuf_append(content, text + i, len - i);
                }
                if (c == tag[0]) {
                        t->matched = 1;
                        continue;
                }
                r = strbuf_append(out, &c, 1);
                if (r < 0)
                        return r;
        }
        return 0;
}

int think_split_flush(ThinkSplit *t, StrBuf *reasoning, StrBuf *content)
{
        const char *tag = t->state == THINK_INSIDE ? THINK_CLOSE : THINK_OPEN;
        int r = strbuf_append(think_target(t, reasoning, content), tag, t->matched);
        t->matched = 0;
        return r;
}
