/* SPDX-License-Identifier: MIT */
/* The OpenAI API's JSON, both ways: request bodies of /v1/chat/completions and
 * /v1/completions decoded into an OaiRequest (every bad field refused with OpenAI's error
 * shape, naming the field), and the response objects and Server-Sent Events chunks built
 * from generated text. Also the DeepSeek-R1 <think> splitter that turns output into
 * reasoning_content and content as DeepSeek's API does. Pure functions over memory: no
 * I/O, no engine, no logging. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "macro.h"
#include "strbuf.h"
#include "tokenizer.h"

#define OAI_STOPS_MAX        4u   /* OpenAI's own bound on "stop" */
#define OAI_STOP_LEN_MAX     256u /* bytes of one stop string (the scheduler's bound) */
#define OAI_TOP_LOGPROBS_MAX 20u
#define OAI_MESSAGES_MAX     4096u

typedef enum OaiKind {
        OAI_CHAT,       /* POST /v1/chat/completions */
        OAI_COMPLETION, /* POST /v1/completions */
        _OAI_KIND_MAX,
        _OAI_KIND_INVALID = -EINVAL,
} OaiKind;

/* An error answer: HTTP status and the fields of {"error": {...}}. */
typedef struct OaiError {
        int status;
        const char *type; /* "invalid_request_error", "authentication_error", ... */
        const char *code; /* NULL or a short machine-readable code */
        char param[64];   /* the field at fault, "" for none */
        char message[512];
} OaiError;

/* Fills e and returns -EINVAL, for `return oai_error(e, 400, "temperature", ...)`. */
int oai_error(OaiError *e, int status, const char *param, const char *fmt, ...) _printf_(4, 5);

/* {"error": {"message", "type", "param", "code"}} with null for an empty param or code. */
int oai_error_json(StrBuf *b, const OaiError *e);

typedef struct OaiRequest {
        OaiKind kind;
        char *model; /* NULL when absent; not checked against the served one */
        /* OAI_CHAT */
        ChatMessage *messages; /* (n_messages), strings owned */
        size_t n_messages;
        /* OAI_COMPLETION: text, or token ids when prompt_ids is set */
        char *prompt;
        int32_t *prompt_ids; /* (n_prompt_ids) */
        size_t n_prompt_ids;

        uint32_t max_tokens; /* UINT32_MAX when absent: the context limit decides */
        BkSampling sampling; /* OpenAI's defaults: temperature 1, top_p 1 */
        bool has_seed;       /* else the caller picks a seed */
        char *stops[OAI_STOPS_MAX];
        uint32_t n_stops;
        bool logprobs;         /* report the sampled token's logprob */
        uint32_t top_logprobs; /* and this many alternatives */
        bool stream;
        bool include_usage;    /* stream_options.include_usage */
        bool reasoning_inline; /* "reasoning_format": "inline": keep <think> in content */
        bool dsd_timing;       /* "dsd_timing": true: stream chunks carry the publish time */
} OaiRequest;

/* Decodes a request body. 0 and *ret, or -EINVAL (or -ENOMEM) with e filled: status 400
 * and the field named in e->param. */
int oai_request_parse(OaiKind kind, const char *body, size_t len, OaiRequest **ret, OaiError *e);
OaiRequest *oai_request_free(OaiRequest *r);
DEFINE_TRIVIAL_CLEANUP_FUNC(OaiRequest *, oai_request_free);

/* POST /tokenize {"prompt": "..."} or {"messages": [...]} (rendered with the chat
 * template), optional "add_special_tokens" (default true: BOS as generation adds it).
 * POST /detokenize {"tokens": [ids]}. */
typedef struct OaiTokenizeRequest {
        char *prompt;          /* NULL when messages are given */
        ChatMessage *messages; /* (n_messages) */
        size_t n_messages;
        bool add_special;
} OaiTokenizeRequest;

int oai_tokenize_parse(const char *body, size_t len, OaiTokenizeRequest **ret, OaiError *e);
OaiTokenizeRequest *oai_tokenize_free(OaiTokenizeRequest *r);
DEFINE_TRIVIAL_CLEANUP_FUNC(OaiTokenizeRequest *, oai_tokenize_free);
/* Ids are checked against n_vocab: an id out of range is refused naming "tokens". */
int oai_detokenize_parse(const char *body, size_t len, uint32_t n_vocab, int32_t **ret_ids,
        size_t *ret_n, OaiError *e);

/* --- Responses ------------------------------------------------------------------- */

typedef struct OaiResponse {
        OaiKind kind;
        const char *id; /* "chatcmpl-..." or "cmpl-..." */
        const char *model;
        int64_t created; /* Unix seconds */
        /* Not 0: a stream chunk carries "dsd_publish_ns", the CLOCK_MONOTONIC time the
         * engine published the event it holds, for measuring delivery latency (dsbench). */
        uint64_t publish_ns;
} OaiResponse;

typedef struct OaiUsage {
        uint32_t prompt_tokens;
        uint32_t completion_tokens;
} OaiUsage;

/* One token's logprob entry, and its alternatives. Texts need not be valid UTF-8. */
typedef struct OaiLogprobEntry {
        const char *text;
        size_t len;
        float logprob;
} OaiLogprobEntry;

/* Logprobs accumulated over a response, in the shape of its kind: chat's
 * {"content": [{token, logprob, bytes, top_logprobs}]} or completions' legacy
 * {tokens, token_logprobs, top_logprobs, text_offset}. */
typedef struct OaiLogprobs {
        OaiKind kind;
        uint32_t n;
        StrBuf items;   /* chat: entries; completion: the tokens list */
        StrBuf values;  /* completion: token_logprobs */
        StrBuf tops;    /* completion: top_logprobs */
        StrBuf offsets; /* completion: text_offset */
        uint64_t text_offset;
} OaiLogprobs;

int oai_logprobs_add(
        OaiLogprobs *l, const OaiLogprobEntry *sampled, const OaiLogprobEntry *top, uint32_t n_top);
/* Appends the JSON object (or null when nothing was added). */
int oai_logprobs_json(StrBuf *b, const OaiLogprobs *l);
void oai_logprobs_clear(OaiLogprobs *l);
void oai_logprobs_free(OaiLogprobs *l);

/* "stop", "length"; NULL for a request that was not finished normally. */
const char *oai_finish_reason(int finish);

/* The whole non-streaming answer: chat.completion or text_completion with usage.
 * reasoning may be NULL (no reasoning_content field); logprobs may be NULL. */
int oai_response_json(StrBuf *b, const OaiResponse *r, const char *content, size_t content_len,
        const char *reasoning, size_t reasoning_len, const OaiLogprobs *logprobs,
        const char *finish_reason, const OaiUsage *usage);

/* One SSE event "data: {chunk}\n\n". A chat chunk's delta carries the role when role is
 * set, content and reasoning_content when given (NULL: absent); finish_reason NULL is
 * null. usage, when given, is included (null in the others when include_usage). */
int oai_stream_chunk(StrBuf *b, const OaiResponse *r, bool role, const char *content,
        size_t content_len, const char *reasoning, size_t reasoning_len,
        const OaiLogprobs *logprobs, const char *finish_reason, bool include_usage);
/* The final usage-only chunk (choices empty), sent when include_usage. */
int oai_stream_usage(StrBuf *b, const OaiResponse *r, const OaiUsage *usage);
int oai_stream_done(StrBuf *b);

/* GET /v1/models */
int oai_models_json(StrBuf *b, const char *model, int64_t created);

/* --- DeepSeek-R1 reasoning ----------------------------------------------------------- */

/* Splits output into reasoning and content incrementally: the text between a leading
 * "<think>" (or, when the prompt already opened it, from the start) and the first
 * "</think>" is reasoning; everything else is content, tags removed. A tag may arrive
 * split over any number of pieces: bytes that may begin one are held back until the
 * next piece decides. Only the first think block counts, as in DeepSeek's API. */
typedef enum ThinkState {
        THINK_START,   /* nothing decided: a "<think>" here opens reasoning */
        THINK_INSIDE,  /* reasoning until "</think>" */
        THINK_CONTENT, /* the rest is content */
} ThinkState;

typedef struct ThinkSplit {
        ThinkState state;
        uint8_t matched; /* bytes of the tag matched and held back */
} ThinkSplit;

void think_split_init(ThinkSplit *t, bool inside);
/* Appends the decided text to reasoning and content. */
int think_split_feed(
        ThinkSplit *t, const char *text, size_t len, StrBuf *reasoning, StrBuf *content);
/* At the end: held-back bytes go where they were heading. */
int think_split_flush(ThinkSplit *t, StrBuf *reasoning, StrBuf *content);
