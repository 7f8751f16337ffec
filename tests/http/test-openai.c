/* SPDX-License-Identifier: MIT */
/* OpenAI request decoding (every bad field is refused naming it), the response and SSE
 * builders, and the <think> splitter on every way of cutting its input. */
#include <cjson/cJSON.h>
#include <string.h>

#include "openai.h"
#include "test_util.h"

static void expect_error(OaiKind kind, const char *body, const char *param)
{
        OaiRequest *q = NULL;
        OaiError e = {};
        int r = oai_request_parse(kind, body, strlen(body), &q, &e);
        CHECK(r < 0 && !q, "accepted: %s", body);
        CHECK(e.status == 400, "status %d for %s", e.status, body);
        CHECK(strcmp(e.param, param) == 0, "param '%s', want '%s' for %s (%s)", e.param, param,
                body, e.message);

        /* The error body is OpenAI's shape and valid JSON. */
        StrBuf b = {};
        CHECK(oai_error_json(&b, &e) == 0, "error json");
        cJSON *j = cJSON_Parse(b.data);
        CHECK(j, "error body parses: %s", b.data);
        cJSON *err = cJSON_GetObjectItem(j, "error");
        CHECK(cJSON_IsString(cJSON_GetObjectItem(err, "message")), "message");
        CHECK(strcmp(cJSON_GetObjectItem(err, "type")->valuestring, "invalid_request_error") == 0,
                "type");
        cJSON *p = cJSON_GetObjectItem(err, "param");
        CHECK(param[0] ? cJSON_IsString(p) && strcmp(p->valuestring, param) == 0 : cJSON_IsNull(p),
                "param in json");
        CHECK(cJSON_HasObjectItem(err, "code"), "code");
        cJSON_Delete(j);
        strbuf_free(&b);
}

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static void test_request_errors(void)
{
        expect_error(OAI_CHAT, "", "");
        expect_error(OAI_CHAT, "{", "");
        expect_error(OAI_CHAT, "[]", "");
        expect_error(OAI_CHAT, "{}", "messages");
        expect_error(OAI_CHAT, "{\"messages\":[]}", "messages");
        expect_error(OAI_CHAT, "{\"messages\":\"hi\"}", "messages");
        expect_error(OAI_CHAT, "{\"messages\":[1]}", "messages[0]");
        expect_error(OAI_CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
                "messages[0].role");
        expect_error(OAI_CHAT,
                "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},"
                "{\"role\":\"user\"}]}",
                "messages[1].content");
        expect_error(OAI_CHAT,
                "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                "\"image_url\"}]}]}",
                "messages[0].content");
        expect_error(OAI_CHAT, "{" MSG ",\"model\":3}", "model");
        expect_error(OAI_CHAT, "{" MSG ",\"n\":2}", "n");
        expect_error(OAI_CHAT, "{" MSG ",\"max_tokens\":0}", "max_tokens");
        expect_error(OAI_CHAT, "{" MSG ",\"max_tokens\":1.5}", "max_tokens");
        expect_error(OAI_CHAT, "{" MSG ",\"max_tokens\":\"8\"}", "max_tokens");
        expect_error(OAI_CHAT, "{" MSG ",\"max_completion_tokens\":-1}", "max_completion_tokens");
        expect_error(OAI_CHAT, "{" MSG ",\"max_tokens\":3,\"max_completion_tokens\":4}",
                "max_completion_tokens");
        expect_error(OAI_CHAT, "{" MSG ",\"temperature\":2.5}", "temperature");
        expect_error(OAI_CHAT, "{" MSG ",\"temperature\":\"hot\"}", "temperature");
        expect_error(OAI_CHAT, "{" MSG ",\"top_p\":0}", "top_p");
        expect_error(OAI_CHAT, "{" MSG ",\"top_p\":1.1}", "top_p");
        expect_error(OAI_CHAT, "{" MSG ",\"top_k\":-2}", "top_k");
        expect_error(OAI_CHAT, "{" MSG ",\"min_p\":2}", "min_p");
        expect_error(OAI_CHAT, "{" MSG ",\"seed\":0.5}", "seed");
        expect_error(OAI_CHAT, "{" MSG ",\"stop\":5}", "stop");
        expect_error(OAI_CHAT, "{" MSG ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop");
        expect_error(OAI_CHAT, "{" MSG ",\"stop\":[\"\"]}", "stop");
        expect_error(OAI_CHAT, "{" MSG ",\"stop\":[1]}", "stop");
        expect_error(OAI_CHAT, "{" MSG ",\"presence_penalty\":3}", "presence_penalty");
        expect_error(OAI_CHAT, "{" MSG ",\"frequency_penalty\":-3}", "frequency_penalty");
        expect_error(OAI_CHAT, "{" MSG ",\"logprobs\":1}", "logprobs");
        expect_error(OAI_CHAT, "{" MSG ",\"top_logprobs\":3}", "top_logprobs");
        expect_error(OAI_CHAT, "{" MSG ",\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs");
        expect_error(OAI_CHAT, "{" MSG ",\"stream\":\"yes\"}", "stream");
        expect_error(OAI_CHAT, "{" MSG ",\"stream_options\":{\"include_usage\":true}}",
                "stream_options");
        expect_error(OAI_CHAT, "{" MSG ",\"stream\":true,\"stream_options\":{\"include_usage\":1}}",
                "stream_options.include_usage");
        expect_error(OAI_CHAT, "{" MSG ",\"reasoning_format\":\"hidden\"}", "reasoning_format");
        expect_error(OAI_CHAT, "{" MSG ",\"dsd_timing\":1}", "dsd_timing");
        expect_error(OAI_CHAT, "{" MSG ",\"tools\":[{}]}", "tools");
        expect_error(OAI_CHAT, "{" MSG ",\"logit_bias\":{\"1\":2}}", "logit_bias");
        expect_error(OAI_CHAT, "{" MSG ",\"response_format\":{\"type\":\"json_object\"}}",
                "response_format");
        expect_error(OAI_COMPLETION, "{\"prompt\":\"x\"}}", "");
        expect_error(OAI_COMPLETION, "{\"prompt\":\"x\"} {}", "");
        expect_error(OAI_COMPLETION, "{}", "prompt");
        expect_error(OAI_COMPLETION, "{\"prompt\":5}", "prompt");
        expect_error(OAI_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", "prompt");
        expect_error(OAI_COMPLETION, "{\"prompt\":[1,-2]}", "prompt");
        expect_error(OAI_COMPLETION, "{\"prompt\":[]}", "prompt");
        expect_error(OAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":true}", "logprobs");
        expect_error(OAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":21}", "logprobs");
        expect_error(OAI_COMPLETION, "{\"prompt\":\"x\",\"echo\":true}", "echo");
        expect_error(OAI_COMPLETION, "{\"prompt\":\"x\",\"best_of\":2}", "best_of");
        expect_error(OAI_COMPLETION, "{\"prompt\":\"x\",\"suffix\":\"y\"}", "suffix");
}

static void test_request_fields(void)
{
        const char *body = "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":"
                           "\"s\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                           "\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],"
                           "\"max_completion_tokens\":7,\"temperature\":0,\"top_p\":0.5,"
                           "\"top_k\":-1,\"min_p\":0.1,\"seed\":42,\"stop\":\"x\","
                           "\"presence_penalty\":1,\"frequency_penalty\":-1,\"logprobs\":true,"
                           "\"top_logprobs\":5,\"n\":1,\"stream\":true,"
                           "\"stream_options\":{\"include_usage\":true},"
                           "\"reasoning_format\":\"inline\",\"dsd_timing\":true,"
                           "\"user\":\"ignored\"}";
        OaiRequest *q;
        OaiError e;

        CHECK(oai_request_parse(OAI_CHAT, body, strlen(body), &q, &e) == 0, "%s", e.message);
        CHECK(q->n_messages == 2 && strcmp(q->messages[0].role, "system") == 0, "developer");
        CHECK(strcmp(q->messages[1].content, "ab") == 0, "parts joined");
        CHECK(q->max_tokens == 7 && q->sampling.temperature == 0 && q->sampling.top_p == 0.5f,
                "numbers");
        CHECK(q->sampling.top_k == 0 && q->sampling.seed == 42 && q->has_seed, "top_k, seed");
        CHECK(q->n_stops == 1 && strcmp(q->stops[0], "x") == 0, "stop");
        CHECK(q->logprobs && q->top_logprobs == 5, "logprobs");
        CHECK(q->stream && q->include_usage && q->reasoning_inline && q->dsd_timing, "stream");
        oai_request_free(q);

        body = "{\"prompt\":[[1,2,3]],\"logprobs\":2,\"max_tokens\":null}";
        CHECK(oai_request_parse(OAI_COMPLETION, body, strlen(body), &q, &e) == 0, "%s", e.message);
        CHECK(q->n_prompt_ids == 3 && q->prompt_ids[2] == 3, "ids");
        CHECK(q->logprobs && q->top_logprobs == 2, "legacy logprobs");
        CHECK(q->max_tokens == UINT32_MAX && q->sampling.temperature == 1.0f && !q->has_seed,
                "defaults");
        oai_request_free(q);
}

static cJSON *parse_sse(const StrBuf *b)
{
        CHECK(strncmp(b->data, "data: ", 6) == 0, "data: prefix");
        CHECK(b->len >= 8 && strcmp(b->data + b->len - 2, "\n\n") == 0, "blank line");
        CHECK(!memchr(b->data, '\n', b->len - 2), "one line");
        cJSON *j = cJSON_Parse(b->data + 6);
        CHECK(j, "chunk parses: %s", b->data);
        return j;
}

static void test_builders(void)
{
        OaiResponse r = {.kind = OAI_CHAT, .id = "chatcmpl-1", .model = "m\"\n", .created = 5};
        OaiUsage u = {3, 4};
        OaiLogprobs lp = {.kind = OAI_CHAT};
        OaiLogprobEntry s = {"a\xff", 2, -0.5f}, top[2] = {{"a", 1, -0.5f}, {"\"", 1, -1}};
        StrBuf b = {};

        CHECK(oai_logprobs_add(&lp, &s, top, 2) == 0, "lp");
        CHECK(oai_response_json(&b, &r, "x\x01y", 3, "think", 5, &lp, "stop", &u) == 0, "json");
        cJSON *j = cJSON_Parse(b.data);
        CHECK(j, "response parses: %s", b.data);
        cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
        cJSON *msg = cJSON_GetObjectItem(ch, "message");
        CHECK(strcmp(cJSON_GetObjectItem(msg, "content")->valuestring, "x\x01y") == 0, "content");
        CHECK(strcmp(cJSON_GetObjectItem(msg, "reasoning_content")->valuestring, "think") == 0,
                "reasoning");
        CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "total_tokens")->valueint == 7,
                "usage");
        cJSON *c0 = cJSON_GetArrayItem(
                cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "logprobs"), "content"), 0);
        CHECK(strcmp(cJSON_GetObjectItem(c0, "token")->valuestring, "a\xef\xbf\xbd") == 0,
                "invalid UTF-8 replaced");
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(c0, "bytes")) == 2, "raw bytes");
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(c0, "top_logprobs")) == 2, "tops");
        cJSON_Delete(j);
        strbuf_clear(&b);

        CHECK(oai_stream_chunk(&b, &r, true, "", 0, NULL, 0, NULL, NULL, true) == 0, "chunk");
        j = parse_sse(&b);
        CHECK(cJSON_IsNull(cJSON_GetObjectItem(j, "usage")), "usage null");
        CHECK(!cJSON_HasObjectItem(j, "dsd_publish_ns"), "no publish time unless asked");
        cJSON_Delete(j);
        strbuf_clear(&b);
        /* 2^53 + 1: the exact digits, not a double's rounding. */
        r.publish_ns = UINT64_C(9007199254740993);
        CHECK(oai_stream_chunk(&b, &r, false, "a", 1, NULL, 0, NULL, NULL, false) == 0, "chunk");
        cJSON_Delete(parse_sse(&b));
        CHECK(strstr(b.data, ",\"dsd_publish_ns\":9007199254740993}") != NULL, "publish time: %s",
                b.data);
        r.publish_ns = 0;
        strbuf_clear(&b);
        CHECK(oai_stream_usage(&b, &r, &u) == 0, "usage chunk");
        j = parse_sse(&b);
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")) == 0, "no choices");
        cJSON_Delete(j);
        strbuf_clear(&b);
        CHECK(oai_stream_done(&b) == 0 && strcmp(b.data, "data: [DONE]\n\n") == 0, "done");
        strbuf_clear(&b);

        OaiLogprobs lc = {.kind = OAI_COMPLETION};
        r.kind = OAI_COMPLETION;
        CHECK(oai_logprobs_add(&lc, &top[0], top, 2) == 0 &&
                        oai_logprobs_add(&lc, &top[1], top, 1) == 0,
                "legacy lp");
        CHECK(oai_response_json(&b, &r, "ab", 2, NULL, 0, &lc, "length", &u) == 0, "text");
        j = cJSON_Parse(b.data);
        CHECK(j, "text_completion parses: %s", b.data);
        cJSON *l = cJSON_GetObjectItem(
                cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "logprobs");
        CHECK(cJSON_GetArrayItem(cJSON_GetObjectItem(l, "text_offset"), 1)->valueint == 1,
                "offsets");
        cJSON_Delete(j);
        oai_logprobs_free(&lp);
        oai_logprobs_free(&lc);
        strbuf_free(&b);
}

/* Splits text at every pair of cut points and checks the result never depends on them. */
static void check_split(const char *text, bool inside, const char *want_r, const char *want_c)
{
        size_t n = strlen(text);
        for (size_t i = 0; i <= n; i++)
                for (size_t k = i; k <= n; k++) {
                        ThinkSplit t;
                        StrBuf r = {}, c = {};
                        think_split_init(&t, inside);
                        CHECK(think_split_feed(&t, text, i, &r, &c) == 0, "feed");
                        CHECK(think_split_feed(&t, text + i, k - i, &r, &c) == 0, "feed");
                        CHECK(think_split_feed(&t, text + k, n - k, &r, &c) == 0, "feed");
                        CHECK(think_split_flush(&t, &r, &c) == 0, "flush");
                        CHECK(strcmp(r.data ? r.data : "", want_r) == 0 &&
                                        strcmp(c.data ? c.data : "", want_c) == 0,
                                "'%s' cut at %zu,%zu: reasoning '%s' content '%s'", text, i, k,
                                r.data, c.data);
                        strbuf_free(&r);
                        strbuf_free(&c);
                }
}

static void test_think(void)
{
        check_split("<think>\nhmm</think>\n\nAnswer", false, "\nhmm", "\n\nAnswer");
        check_split("hmm</think>Answer", true, "hmm", "Answer");
        check_split("a <b < </thin</think>x<think>y</think>", true, "a <b < </thin",
                "x<think>y</think>");
        check_split("no tags <think>", false, "", "no tags <think>");
        check_split("<thin", false, "", "<thin");
        check_split("<think>unfinished </thi", false, "unfinished </thi", "");
        check_split("", true, "", "");
}

int main(void)
{
        test_request_errors();
        test_request_fields();
        test_builders();
        test_think();
        return 0;
}
