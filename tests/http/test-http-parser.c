/* SPDX-License-Identifier: MIT */
/* The HTTP request parser: valid, invalid, pipelined and split-at-every-byte input, and
 * every limit with its status. */
#include <errno.h>
#include <string.h>

#include "http_parser.h"
#include "macro.h"
#include "test_util.h"

typedef struct Result {
        HttpParseState st;
        int status;
        size_t consumed;
} Result;

/* Feeds msg in pieces of at most step bytes (0: all at once); stops at DONE or ERROR. */
static Result feed(HttpParser *p, const char *msg, size_t len, size_t step)
{
        Result res = {.st = HTTP_PARSE_MORE};
        size_t off = 0;

        while (off < len) {
                size_t n = step ? MIN(step, len - off) : len - off, used;
                res.st = http_parser_feed(p, (const uint8_t *) msg + off, n, &used);
                CHECK(used <= n, "consumed more than given");
                off += used;
                if (res.st == HTTP_PARSE_DONE || res.st == HTTP_PARSE_ERROR)
                        break;
                CHECK(res.st == HTTP_PARSE_HEAD || used == n, "MORE without consuming all");
        }
        res.status = http_parser_status(p);
        res.consumed = off;
        return res;
}

static HttpParser *parser(void)
{
        HttpLimits l;
        HttpParser *p;
        http_limits_init(&l);
        l.max_body_bytes = 1000;
        l.max_head_bytes = 2048;
        l.max_target_bytes = 512;
        l.max_headers = 8;
        CHECK(http_parser_new(&l, &p) == 0, "new");
        return p;
}

static int status_of(const char *msg)
{
        HttpParser *p = parser();
        Result r = feed(p, msg, strlen(msg), 0);
        int s = r.st == HTTP_PARSE_ERROR ? r.status : r.st == HTTP_PARSE_DONE ? 200 : 0;
        http_parser_free(p);
        return s;
}

static void test_valid_every_split(void)
{
        static const char msg[] = "POST /v1/completions?x=1 HTTP/1.1\r\n"
                                  "Host: localhost\r\n"
                                  "Content-Type:application/json  \r\n"
                                  "content-length: 11\r\n"
                                  "\r\n"
                                  "{\"a\": true}";
        for (size_t step = 0; step <= sizeof(msg); step++) {
                HttpParser *p = parser();
                Result r = feed(p, msg, sizeof(msg) - 1, step);
                CHECK(r.st == HTTP_PARSE_DONE, "step %zu: state %d status %d", step, r.st,
                        r.status);
                CHECK(r.consumed == sizeof(msg) - 1, "step %zu consumed %zu", step, r.consumed);
                const HttpRequest *q = http_parser_request(p);
                CHECK(q->method == HTTP_POST, "method");
                CHECK(strcmp(q->target, "/v1/completions?x=1") == 0, "target %s", q->target);
                CHECK(strcmp(q->path, "/v1/completions") == 0, "path %s", q->path);
                CHECK(q->version_minor == 1 && q->keep_alive, "keep-alive");
                CHECK(strcmp(http_request_header(q, "CONTENT-TYPE"), "application/json") == 0,
                        "header value trimmed: '%s'", http_request_header(q, "content-type"));
                CHECK(q->body_len == 11 && memcmp(q->body, "{\"a\": true}", 11) == 0, "body");
                http_parser_free(p);
        }
}

static void test_pipelined(void)
{
        static const char msg[] = "GET /health HTTP/1.1\r\nHost: a\r\n\r\n"
                                  "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
                                  "GET /metrics HTTP/1.0\r\n\r\n";
        const char *paths[] = {"/health", "/x", "/metrics"};
        HttpParser *p = parser();
        size_t off = 0;

        for (int i = 0; i < 3; i++) {
                size_t used;
                HttpParseState st;
                do {
                        st = http_parser_feed(
                                p, (const uint8_t *) msg + off, sizeof(msg) - 1 - off, &used);
                        off += used;
                } while (st == HTTP_PARSE_HEAD);
                CHECK(st == HTTP_PARSE_DONE, "request %d: %d", i, st);
                const HttpRequest *q = http_parser_request(p);
                CHECK(strcmp(q->path, paths[i]) == 0, "path %s", q->path);
                CHECK(q->keep_alive == (i < 2), "HTTP/1.0 without keep-alive closes");
                http_parser_reset(p);
        }
        CHECK(off == sizeof(msg) - 1, "all consumed");
        CHECK(!http_parser_started(p), "idle after the last");
        http_parser_free(p);
}

static void test_statuses(void)
{
        char big[4096];

        CHECK(status_of("GET / HTTP/1.1\r\nHost: a\r\n\r\n") == 200, "plain");
        CHECK(status_of("GET / HTTP/1.1\nHost: a\n\n") == 200, "bare LF");
        CHECK(status_of("\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n") == 200, "leading CRLF");
        CHECK(status_of("GET / HTTP/1.0\r\n\r\n") == 200, "1.0 needs no Host");
        CHECK(status_of("GET / HTTP/1.1\r\n\r\n") == 400, "1.1 without Host");
        CHECK(status_of("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n") == 400, "two Hosts");
        CHECK(status_of("GET  / HTTP/1.1\r\nHost: a\r\n\r\n") == 400, "double space");
        CHECK(status_of("GET / HTTP/1.1 \r\nHost: a\r\n\r\n") == 400, "trailing space");
        CHECK(status_of("GET /\x01 HTTP/1.1\r\nHost: a\r\n\r\n") == 400, "control in target");
        CHECK(status_of("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n") == 400, "absolute form");
        CHECK(status_of("GET / HTTP/1.1\r\nHost : a\r\n\r\n") == 400, "space before colon");
        CHECK(status_of("GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n") == 400, "obs-fold");
        CHECK(status_of("GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n") == 400, "bare CR");
        CHECK(status_of("GET / HTTP/1.1\r\nHost: a\x7f\r\n\r\n") == 400, "DEL in value");
        CHECK(status_of("GET / HTTP/1.1\r\nNoColon\r\n\r\n") == 400, "no colon");
        CHECK(status_of("GET / HTTP/2.0\r\nHost: a\r\n\r\n") == 505, "HTTP/2");
        CHECK(status_of("GET / HTTP/1.2\r\nHost: a\r\n\r\n") == 200, "1.2 served as 1.1");
        CHECK(status_of("GET / HTTP/x\r\nHost: a\r\n\r\n") == 400, "bad version");
        CHECK(status_of("PUT / HTTP/1.1\r\nHost: a\r\n\r\n") == 501, "PUT");
        CHECK(status_of("POST / HTTP/1.1\r\nHost: a\r\n\r\n") == 411, "POST without length");
        CHECK(status_of("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n") == 411,
                "chunked");
        CHECK(status_of("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n") == 501,
                "gzip");
        CHECK(status_of("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                        "Content-Length: 3\r\n\r\nabc") == 400,
                "TE and CL");
        CHECK(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n"
                        "Content-Length: 4\r\n\r\nabcd") == 400,
                "conflicting CL");
        CHECK(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n"
                        "Content-Length: 3\r\n\r\nabc") == 200,
                "repeated CL");
        CHECK(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n") == 400,
                "negative CL");
        CHECK(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1001\r\n\r\n") == 413,
                "CL over the limit");
        CHECK(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: "
                        "99999999999999999999999\r\n\r\n") == 413,
                "CL overflow");
        CHECK(status_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n") == 0,
                "CL at the limit waits for the body");
        CHECK(status_of("GET / HTTP/1.1\r\nHost: a\r\nExpect: magic\r\n\r\n") == 417, "expect");

        /* The target: 512 bytes pass, 513 get 414 before the line ends. */
        memset(big, 'a', sizeof(big));
        big[0] = '/';
        char msg[8192];
        snprintf(msg, sizeof(msg), "GET %.*s HTTP/1.1\r\nHost: a\r\n\r\n", 512, big);
        CHECK(status_of(msg) == 200, "target at the limit");
        snprintf(msg, sizeof(msg), "GET %.*s", 513, big);
        CHECK(status_of(msg) == 414, "target past the limit");
        /* Head size: one long header gets 431. */
        snprintf(msg, sizeof(msg), "GET / HTTP/1.1\r\nHost: a\r\nX: %.*s\r\n\r\n", 2100, big);
        CHECK(status_of(msg) == 431, "head too large");
        /* Header count: 8 pass, 9 get 431. */
        strcpy(msg, "GET / HTTP/1.1\r\nHost: a\r\n");
        for (int i = 0; i < 7; i++)
                strcat(msg, "X: y\r\n");
        CHECK(status_of(strcat(strcpy(big, msg), "\r\n")) == 200, "8 headers");
        strcat(msg, "X: y\r\n\r\n");
        CHECK(status_of(msg) == 431, "9 headers");
        /* An over-long method is not implemented, whatever it is. */
        CHECK(status_of("GETGETGETGETGETGETGETGETGETGETGETGETGET / HTTP/1.1\r\n") == 501,
                "long method");
        CHECK(status_of("\r\n\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\n") == 400, "many empty lines");
}

static void test_keep_alive_and_expect(void)
{
        HttpParser *p = parser();
        const char *m = "GET / HTTP/1.1\r\nHost: a\r\nConnection: foo, Close\r\n\r\n";
        CHECK(feed(p, m, strlen(m), 0).st == HTTP_PARSE_DONE, "close");
        CHECK(!http_parser_request(p)->keep_alive, "Connection: close");
        http_parser_reset(p);
        m = "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
        CHECK(feed(p, m, strlen(m), 0).st == HTTP_PARSE_DONE, "1.0 keep-alive");
        CHECK(http_parser_request(p)->keep_alive, "1.0 keep-alive");
        http_parser_reset(p);

        /* 100-continue: HEAD comes back after the head, before any body byte. */
        m = "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok";
        size_t used, len = strlen(m);
        CHECK(http_parser_feed(p, (const uint8_t *) m, len, &used) == HTTP_PARSE_HEAD, "head");
        CHECK(used == len - 2, "stops before the body");
        CHECK(p && http_parser_request(p) == NULL, "not complete");
        CHECK(http_parser_feed(p, (const uint8_t *) m + used, 2, &used) == HTTP_PARSE_DONE, "body");
        CHECK(http_parser_request(p)->expect_continue, "expect_continue");
        CHECK(http_parser_feed(p, (const uint8_t *) "x", 1, &used) == HTTP_PARSE_DONE && used == 0,
                "nothing consumed after DONE");
        http_parser_free(p);

        CHECK(http_token_list_has(" a ,b,  close ", "close"), "token list");
        CHECK(!http_token_list_has("closed", "close"), "token list prefix");
}

static void test_limits_checked(void)
{
        HttpLimits l;
        HttpParser *p;
        http_limits_init(&l);
        l.max_headers = HTTP_HEADERS_MAX + 1;
        CHECK(http_parser_new(&l, &p) == -EINVAL, "headers bound");
        http_limits_init(&l);
        l.max_head_bytes = HTTP_HEAD_MAX_LIMIT + 1;
        CHECK(http_parser_new(&l, &p) == -EINVAL, "head bound");
        http_limits_init(&l);
        l.max_body_bytes = 0;
        CHECK(http_parser_new(&l, &p) == -EINVAL, "body bound");
}

int main(void)
{
        test_valid_every_split();
        test_pipelined();
        test_statuses();
        test_keep_alive_and_expect();
        test_limits_checked();
        return 0;
}
