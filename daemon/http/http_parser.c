/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http_parser.h"
#include "macro.h"

/* Empty lines allowed before the request line (RFC 9112 §2.2 asks servers to ignore at
 * least one, left by clients that end a POST body with CRLF). */
#define LEADING_EMPTY_LINES_MAX 4u

typedef enum Phase {
        PHASE_HEAD,
        PHASE_BODY,
        PHASE_DONE,
        PHASE_ERROR,
} Phase;

struct HttpParser {
        HttpLimits lim;
        Phase phase;
        bool started;

        /* The head as received, then split in place into NUL-terminated strings. */
        char *head; /* (lim.max_head_bytes + 1) */
        uint32_t head_len;
        uint32_t line_len; /* bytes of the current line so far, its LF excluded */
        uint32_t n_lines;  /* complete lines of the head, the request line included */
        uint32_t n_spaces; /* in the request line so far: which of its parts we are in */
        uint32_t part_len; /* bytes of that part so far */
        uint32_t n_empty;  /* leading empty lines skipped */
        char prev;         /* the byte before this one in the head */

        char *path; /* (lim.max_target_bytes + 1) */

        uint8_t *body; /* (body_cap) */
        uint64_t body_cap;
        uint64_t body_got;

        HttpRequest req;
        int status;
        const char *error;
};

void http_limits_init(HttpLimits *l)
{
        *l = (HttpLimits){
                .max_head_bytes = 16u * 1024u,
                .max_target_bytes = 8u * 1024u,
                .max_headers = HTTP_HEADERS_MAX,
                .max_body_bytes = 1u << 20,
        };
}

const char *http_method_name(HttpMethod m)
{
        static const char *const names[_HTTP_METHOD_MAX] = {
                [HTTP_GET] = "GET",
                [HTTP_HEAD] = "HEAD",
                [HTTP_POST] = "POST",
        };
        return m >= 0 && m < _HTTP_METHOD_MAX ? names[m] : NULL;
}

int http_parser_new(const HttpLimits *limits, HttpParser **ret)
{
        if (!limits || !ret)
                return -EINVAL;
        if (limits->max_head_bytes == 0 || limits->max_head_bytes > HTTP_HEAD_MAX_LIMIT ||
                limits->max_target_bytes == 0 ||
                limits->max_target_bytes >= limits->max_head_bytes || limits->max_headers == 0 ||
                limits->max_headers > HTTP_HEADERS_MAX || limits->max_body_bytes == 0)
                return -EINVAL;

        HttpParser *p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        p->lim = *limits;
        p->head = malloc(limits->max_head_bytes + 1);
        p->path = malloc(limits->max_target_bytes + 1);
        if (!p->head || !p->path)
                return http_parser_free(p), -ENOMEM;
        http_parser_reset(p);
        *ret = p;
        return 0;
}

HttpParser *http_parser_free(HttpParser *p)
{
        if (!p)
                return NULL;
        free(p->head);
        free(p->path);
        free(p->body);
        free(p);
        return NULL;
}

void http_parser_reset(HttpParser *p)
{
        assert(p);
        p->phase = PHASE_HEAD;
        p->started = false;
        p->head_len = p->line_len = p->n_lines = p->n_spaces = p->part_len = p->n_empty = 0;
        p->prev = 0;
        p->body_got = 0;
        p->req = (HttpRequest){};
        p->status = 0;
        p->error = NULL;
}

bool http_parser_started(const HttpParser *p)
{
        return p->started;
}

bool http_parser_expects_continue(const HttpParser *p)
{
        return p->phase == PHASE_BODY && p->req.expect_continue;
}

const HttpRequest *http_parser_request(const HttpParser *p)
{
        return p->phase == PHASE_DONE ? &p->req : NULL;
}

int http_parser_status(const HttpParser *p)
{
        return p->status;
}

const char *http_parser_error(const HttpParser *p)
{
        return p->error ? p->error : "";
}

static HttpParseState fail(HttpParser *p, int status, const char *why)
{
        p->phase = PHASE_ERROR;
        p->status = status;
        p->error = why;
        return HTTP_PARSE_ERROR;
}

/* RFC 9110 §5.6.2 tchar. */
static bool is_tchar(unsigned char c)
{
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
                return true;
        return c && strchr("!#$%&'*+-.^_`|~", c);
}

/* Field-value bytes: VCHAR, obs-text, SP and HTAB. */
static bool is_value_char(unsigned char c)
{
        return c == ' ' || c == '\t' || (c > 0x20 && c != 0x7f);
}

bool http_token_list_has(const char *list, const char *token)
{
        size_t n = strlen(token);

        if (!list)
                return false;
        for (const char *s = list; *s;) {
                s += strspn(s, " \t,");
                size_t len = strcspn(s, ",");
                size_t trimmed = len;
                while (trimmed > 0 && (s[trimmed - 1] == ' ' || s[trimmed - 1] == '\t'))
                        trimmed--;
                if (trimmed == n && strncasecmp(s, token, n) == 0)
                        return true;
                s += len;
        }
        return false;
}

const char *http_request_header(const HttpRequest *r, const char *name)
{
        for (uint32_t i = 0; i < r->n_headers; i++)
                if (strcasecmp(r->headers[i].name, name) == 0)
                        return r->headers[i].value;
        return NULL;
}

/* Content-Length: 1*DIGIT, without overflow. */
static int parse_length(const char *s, uint64_t *ret)
{
        uint64_t v = 0;

        if (!*s)
                return -EINVAL;
        for (; *s; s++) {
                if (*s < '0' || *s > '9')
                        return -EINVAL;
                if (v > (UINT64_MAX - 9) / 10)
                        return -ERANGE;
                v = v * 10 + (uint64_t) (*s - '0');
        }
        *ret = v;
        return 0;
}

static HttpParseState parse_request_line(HttpParser *p, char *line)
{
        static const struct {
                const char *name;
                HttpMethod m;
        } methods[] = {{"GET", HTTP_GET}, {"HEAD", HTTP_HEAD}, {"POST", HTTP_POST}};
        char *sp1 = strchr(line, ' ');
        char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;

        if (!sp1 || !sp2 || strchr(sp2 + 1, ' '))
                return fail(p, 400, "malformed request line");
        *sp1 = *sp2 = 0;
        const char *method = line, *target = sp1 + 1, *version = sp2 + 1;

        if (!*method)
                return fail(p, 400, "malformed request line");
        for (const char *c = method; *c; c++)
                if (!is_tchar((unsigned char) *c))
                        return fail(p, 400, "malformed method");

        /* The version decides how the rest is read, so it is checked first. */
        if (strncmp(version, "HTTP/", 5) != 0 || version[5] < '0' || version[5] > '9' ||
                version[6] != '.' || version[7] < '0' || version[7] > '9' || version[8])
                return fail(p, 400, "malformed HTTP version");
        if (version[5] != '1')
                return fail(p, 505, "only HTTP/1.0 and HTTP/1.1 are served");
        /* A later 1.x is answered as 1.1 (RFC 9110 §6.2). */
        p->req.version_minor = version[7] == '0' ? 0 : 1;

        p->req.method = _HTTP_METHOD_INVALID;
        for (size_t i = 0; i < ELEMENTSOF(methods); i++)
                if (strcmp(method, methods[i].name) == 0)
                        p->req.method = methods[i].m;
        if (p->req.method < 0)
                return fail(p, 501, "method not implemented");

        if (target[0] != '/')
                return fail(p, 400, "the request target must be a path");
        for (const char *c = target; *c; c++)
                if ((unsigned char) *c <= 0x20 || (unsigned char) *c >= 0x7f)
                        return fail(p, 400, "malformed request target");
        p->req.target = target;
        size_t path_len = strcspn(target, "?#");
        memcpy(p->path, target, path_len);
        p->path[path_len] = 0;
        p->req.path = p->path;
        return HTTP_PARSE_MORE;
}

static HttpParseState parse_header(HttpParser *p, char *line)
{
        if (line[0] == ' ' || line[0] == '\t')
                return fail(p, 400, "obsolete header line folding");
        char *colon = strchr(line, ':');
        if (!colon || colon == line)
                return fail(p, 400, "malformed header line");
        *colon = 0;
        for (const char *c = line; *c; c++)
                if (!is_tchar((unsigned char) *c))
                        return fail(p, 400, "malformed header name");

        char *v = colon + 1;
        v += strspn(v, " \t");
        size_t n = strlen(v);
        for (size_t i = 0; i < n; i++)
                if (!is_value_char((unsigned char) v[i]))
                        return fail(p, 400, "malformed header value");
        while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t'))
                v[--n] = 0;

        assert(p->req.n_headers < p->lim.max_headers);
        p->req.headers[p->req.n_headers++] = (HttpHeader){.name = line, .value = v};
        return HTTP_PARSE_MORE;
}

/* The head is complete in p->head: split it into lines, parse them, and decide what
 * follows. */
static HttpParseState parse_head(HttpParser *p)
{
        char *s = p->head;
        HttpParseState st;
        bool have_length = false;
        uint64_t length = 0;

        p->head[p->head_len] = 0;
        for (uint32_t i = 0; i < p->n_lines; i++) {
                char *lf = strchr(s, '\n');
                assert(lf);
                *lf = 0;
                size_t n = (size_t) (lf - s);
                /* CR only as the line's end (bare LF is tolerated, RFC 9112 §2.2). */
                if (n > 0 && s[n - 1] == '\r')
                        s[--n] = 0;
                if (memchr(s, '\r', n))
                        return fail(p, 400, "stray CR in the request head");
                st = i == 0 ? parse_request_line(p, s) : parse_header(p, s);
                if (st == HTTP_PARSE_ERROR)
                        return st;
                s = lf + 1;
        }

        uint32_t n_host = 0;
        for (uint32_t i = 0; i < p->req.n_headers; i++) {
                const HttpHeader *h = &p->req.headers[i];
                if (strcasecmp(h->name, "host") == 0)
                        n_host++;
                else if (strcasecmp(h->name, "content-length") == 0) {
                        uint64_t v;
                        int r = parse_length(h->value, &v);
                        if (r == -ERANGE)
                                return fail(p, 413, "request body too large");
                        if (r < 0)
                                return fail(p, 400, "malformed Content-Length");
                        if (have_length && v != length)
                                return fail(p, 400, "conflicting Content-Length headers");
                        have_length = true;
                        length = v;
                }
        }
        /* RFC 9112 §3.2: exactly one Host in HTTP/1.1. */
        if (n_host > 1 || (p->req.version_minor == 1 && n_host == 0))
                return fail(p, 400, "an HTTP/1.1 request needs exactly one Host header");

        const char *te = http_request_header(&p->req, "transfer-encoding");
        if (te) {
                /* Both would let a proxy and us disagree on where the request ends. */
                if (have_length)
                        return fail(p, 400, "both Transfer-Encoding and Content-Length");
                if (http_token_list_has(te, "chunked"))
                        return fail(p, 411,
                                "chunked request bodies are not accepted; send "
                                "Content-Length");
                return fail(p, 501, "transfer coding not implemented");
        }
        if (p->req.method == HTTP_POST && !have_length)
                return fail(p, 411, "POST needs Content-Length");
        if (length > p->lim.max_body_bytes)
                return fail(p, 413, "request body too large");

        const char *conn = http_request_header(&p->req, "connection");
        p->req.keep_alive = p->req.version_minor == 1 ? !http_token_list_has(conn, "close")
                                                      : http_token_list_has(conn, "keep-alive");

        const char *expect = http_request_header(&p->req, "expect");
        if (expect && p->req.version_minor == 1) {
                if (strcasecmp(expect, "100-continue") != 0)
                        return fail(p, 417, "unsupported expectation");
                p->req.expect_continue = length > 0;
        }

        p->req.body_len = length;
        if (length == 0) {
                p->phase = PHASE_DONE;
                return HTTP_PARSE_DONE;
        }
        if (p->body_cap < length) {
                uint8_t *b = realloc(p->body, length);
                if (!b)
                        return fail(p, 503, "out of memory");
                p->body = b;
                p->body_cap = length;
        }
        p->req.body = p->body;
        p->phase = PHASE_BODY;
        return HTTP_PARSE_HEAD;
}

/* One byte of the head. Returns MORE to go on, DONE-or-HEAD from parse_head(), ERROR. */
static HttpParseState head_byte(HttpParser *p, char c)
{
        /* The head is split with string functions: a NUL would hide the rest. */
        if (c == 0)
                return fail(p, 400, "NUL in the request head");
        if (c == '\n') {
                bool empty = p->line_len == 0 || (p->line_len == 1 && p->prev == '\r');
                if (empty && p->n_lines == 0) {
                        /* Before the request line: skipped, not stored. */
                        if (++p->n_empty > LEADING_EMPTY_LINES_MAX)
                                return fail(p, 400, "empty lines before the request line");
                        p->head_len -= p->line_len;
                        p->line_len = 0;
                        p->prev = 0;
                        return HTTP_PARSE_MORE;
                }
                if (empty) {
                        /* The terminating empty line is not kept. */
                        p->head_len -= p->line_len;
                        return parse_head(p);
                }
                if (p->n_lines > p->lim.max_headers)
                        return fail(p, 431, "too many header fields");
                p->n_lines++;
                p->line_len = 0;
        } else {
                p->line_len++;
                if (p->n_lines == 0) {
                        /* Request line: method, target, version; the target is bounded
                         * on its own so that a long URL gets 414, not 431. */
                        if (c == ' ') {
                                p->n_spaces++;
                                p->part_len = 0;
                        } else if (++p->part_len > p->lim.max_target_bytes && p->n_spaces == 1)
                                return fail(p, 414, "request target too long");
                        else if (p->n_spaces == 0 && p->part_len > 32)
                                return fail(p, 501, "method not implemented");
                }
        }
        if (p->head_len >= p->lim.max_head_bytes)
                return fail(p, p->n_lines == 0 ? 414 : 431, "request head too large");
        p->head[p->head_len++] = c;
        p->prev = c;
        return HTTP_PARSE_MORE;
}

HttpParseState http_parser_feed(HttpParser *p, const uint8_t *buf, size_t len, size_t *ret_consumed)
{
        size_t i = 0;
        HttpParseState st = HTTP_PARSE_MORE;

        assert(p);
        assert(buf || len == 0);

        switch (p->phase) {
        case PHASE_DONE:
                st = HTTP_PARSE_DONE;
                break;
        case PHASE_ERROR:
                st = HTTP_PARSE_ERROR;
                break;
        case PHASE_HEAD:
                if (len > 0)
                        p->started = true;
                while (i < len && st == HTTP_PARSE_MORE)
                        st = head_byte(p, (char) buf[i++]);
                break;
        case PHASE_BODY: {
                uint64_t want = p->req.body_len - p->body_got;
                size_t n = (size_t) MIN((uint64_t) len, want);
                if (n > 0)
                        memcpy(p->body + p->body_got, buf, n);
                p->body_got += n;
                i = n;
                if (p->body_got == p->req.body_len) {
                        p->phase = PHASE_DONE;
                        st = HTTP_PARSE_DONE;
                }
                break;
        }
        }
        *ret_consumed = i;
        return st;
}

const char *http_status_reason(int status)
{
        switch (status) {
        case 100:
                return "Continue";
        case 200:
                return "OK";
        case 204:
                return "No Content";
        case 400:
                return "Bad Request";
        case 401:
                return "Unauthorized";
        case 404:
                return "Not Found";
        case 405:
                return "Method Not Allowed";
        case 408:
                return "Request Timeout";
        case 411:
                return "Length Required";
        case 413:
                return "Content Too Large";
        case 414:
                return "URI Too Long";
        case 415:
                return "Unsupported Media Type";
        case 417:
                return "Expectation Failed";
        case 429:
                return "Too Many Requests";
        case 431:
                return "Request Header Fields Too Large";
        case 500:
                return "Internal Server Error";
        case 501:
                return "Not Implemented";
        case 503:
                return "Service Unavailable";
        case 505:
                return "HTTP Version Not Supported";
        default:
                return "";
        }
}
