/* SPDX-License-Identifier: MIT */
/* An incremental HTTP/1.1 request parser (RFC 9112) for the OpenAI-compatible listener.
 * It is a state machine over bytes: the caller feeds whatever the socket gave it, the
 * parser copies the request head into a buffer sized once at init and the body into one
 * sized once per request from Content-Length, and says when a request is complete. Bytes
 * past the end of one request are not consumed, so pipelined requests are parsed one
 * after another: handle the request, http_parser_reset(), feed the rest.
 *
 * Only what the listener needs is accepted: GET, HEAD and POST; HTTP/1.0 and 1.1;
 * Content-Length bodies. Everything else gets the precise status: 400 malformed, 411
 * chunked or missing length on POST, 413 body too large, 414 target too long, 431 head
 * too large or too many headers, 501 unknown method or transfer coding, 505 version.
 * Nothing here logs or does I/O. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HTTP_HEAD_MAX_LIMIT (64u * 1024u) /* the largest max_head_bytes accepted */
#define HTTP_HEADERS_MAX    64u           /* the largest max_headers accepted */

typedef struct HttpLimits {
        uint32_t max_head_bytes;   /* request line and headers, CRLFs included */
        uint32_t max_target_bytes; /* the request target (path and query) */
        uint32_t max_headers;      /* header fields */
        uint64_t max_body_bytes;   /* Content-Length */
} HttpLimits;

/* Defaults: 16 KiB head, 8 KiB target, 64 headers, 1 MiB body. */
void http_limits_init(HttpLimits *l);

typedef enum HttpMethod {
        HTTP_GET,
        HTTP_HEAD,
        HTTP_POST,
        _HTTP_METHOD_MAX,
        _HTTP_METHOD_INVALID = -EINVAL,
} HttpMethod;

const char *http_method_name(HttpMethod m);

typedef struct HttpHeader {
        const char *name;  /* as sent; NUL-terminated inside the parser's head buffer */
        const char *value; /* leading and trailing whitespace removed */
} HttpHeader;

/* A parsed request; its strings point into the parser and stay valid until the next
 * http_parser_reset() or http_parser_free(). */
typedef struct HttpRequest {
        HttpMethod method;
        const char *target;     /* origin-form: starts with '/' */
        const char *path;       /* target without the query, in a copy of its own */
        unsigned version_minor; /* 0 or 1 */
        HttpHeader headers[HTTP_HEADERS_MAX];
        uint32_t n_headers;
        bool keep_alive;      /* the connection may carry another request after this one */
        bool expect_continue; /* "Expect: 100-continue" on a request with a body */
        const uint8_t *body;  /* (body_len) bytes; NULL when there is none */
        uint64_t body_len;
} HttpRequest;

typedef enum HttpParseState {
        HTTP_PARSE_MORE,  /* every byte consumed; the request is not complete yet */
        HTTP_PARSE_HEAD,  /* the head is complete and a body follows: the caller may answer
                           * "100 Continue" now; feed on */
        HTTP_PARSE_DONE,  /* a request is complete: read it from http_parser_request() */
        HTTP_PARSE_ERROR, /* the request is refused: http_parser_status() says how */
} HttpParseState;

typedef struct HttpParser HttpParser;

/* limits are copied and checked: -EINVAL when one is 0 or past its *_LIMIT/_MAX bound. */
int http_parser_new(const HttpLimits *limits, HttpParser **ret);
HttpParser *http_parser_free(HttpParser *p);

/* Consumes bytes of buf until the request completes or fails, and returns the state.
 * *ret_consumed counts the bytes taken; after DONE the rest belongs to the next request.
 * HEAD is returned once per request, right after the head, whether or not more bytes
 * were given. After DONE or ERROR nothing more is consumed until http_parser_reset(). */
HttpParseState http_parser_feed(
        HttpParser *p, const uint8_t *buf, size_t len, size_t *ret_consumed);

/* Ready for the next request on the same connection. Keeps the buffers. */
void http_parser_reset(HttpParser *p);

/* True once any byte of the current request was fed: a connection closed now loses a
 * request, one closed before is simply idle. */
bool http_parser_started(const HttpParser *p);

/* After HEAD: whether the client waits for "100 Continue" before sending the body. */
bool http_parser_expects_continue(const HttpParser *p);

/* After DONE: the request. */
const HttpRequest *http_parser_request(const HttpParser *p);

/* After ERROR: the HTTP status to answer with, and a static reason for the error body. */
int http_parser_status(const HttpParser *p);
const char *http_parser_error(const HttpParser *p);

/* The value of the first header named name (case-insensitive), or NULL. */
const char *http_request_header(const HttpRequest *r, const char *name);

/* True when the comma-separated header value list contains token (case-insensitive). */
bool http_token_list_has(const char *list, const char *token);

/* The standard reason phrase of a status code ("Not Found"), "" when unknown. */
const char *http_status_reason(int status);
