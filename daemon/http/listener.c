/* SPDX-License-Identifier: MIT */
#include <arpa/inet.h>
#include <assert.h>
#include <inttypes.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

#include "auth.h"
#include "listener.h"
#include "log.h"
#include "openai.h"
#include "session.h"
#include "strbuf.h"

#define HTTP_IN_BUF    16384u
#define HTTP_TICK_NSEC 100000000ll /* timeouts are checked ten times a second */

typedef enum HttpOpKind {
        HOP_ACCEPT,
        HOP_READ,
        HOP_WRITE,
        HOP_TICK,
        HOP_CANCEL,
} HttpOpKind;

typedef struct HttpConn HttpConn;
typedef struct HttpGen HttpGen;

/* Our operations: io is what the server sees (kind IO_HTTP); the rest says whose. */
typedef struct HttpOp {
        IoOp io;
        HttpOpKind kind;
        HttpConn *conn;
} HttpOp;

/* A completion request on its way through the engine. It outlives its connection when the
 * client leaves: it is freed with the request's last event. */
struct HttpGen {
        HttpListener *h;
        HttpConn *conn; /* NULL once the connection is gone */
        /* The model it runs on: after a reload the old one finishes it, so cancels and
         * token texts must go there, not to the listener's current model. */
        Engine *engine;
        EngineLoop *loop;
        uint64_t id;
        OaiRequest *req;
        OaiResponse resp;
        char resp_id[40];
        bool split; /* reasoning_content apart from content */
        ThinkSplit think;
        bool started;              /* streaming: the response head and role chunk were sent */
        StrBuf content, reasoning; /* non-streaming: all of it; streaming: this event's */
        OaiLogprobs lp;
        uint32_t prompt_tokens;
        uint64_t last_token_ns;
};

struct HttpConn {
        HttpListener *h;
        unsigned n_ref; /* the list's and each armed operation's */
        int fd;
        uint32_t key;
        bool closed;
        bool close_after; /* close once the output is sent */
        HttpParser *parser;
        uint8_t in[HTTP_IN_BUF];
        size_t in_len;
        StrBuf out;     /* being filled */
        StrBuf sending; /* handed to the kernel: never touched while op_write is armed */
        size_t sent;
        uint64_t deadline; /* µs: closed when reached with no request being answered */
        bool keep_alive;   /* of the request being answered */
        bool head_only;    /* a HEAD request: headers only */
        bool in_request;   /* bytes of a request arrived: the request timeout runs */
        HttpGen *gen;
        HttpOp op_read, op_write;
        HttpConn *prev, *next;
};

struct HttpListener {
        struct io_uring *ring;
        Engine *engine;
        EngineLoop *loop;
        HttpConfig cfg;
        HttpAuth auth;
        Metrics *metrics;
        char *model;
        int64_t created;
        int listen_fd;
        char unix_path[sizeof(((struct sockaddr_un *) 0)->sun_path)];
        HttpOp op_accept, op_tick, op_cancel;
        struct __kernel_timespec tick;
        unsigned n_armed;
        bool stopping;
        bool draining; /* dsctl drain: completions answer 503 until resumed */
        /* Names of models served before a reload: answers in flight still point at
         * them, so they live as long as the listener. */
        char **old_models;
        size_t n_old_models;
        HttpConn *conns;
        uint32_t n_conns;
        uint32_t next_key;
        uint64_t next_id;
};

// --- Configuration ----------------------------------------------------------------------

void http_config_init(HttpConfig *c)
{
        *c = (HttpConfig){
                .max_connections = 64,
                .request_timeout_ms = 10000,
                .idle_timeout_ms = 60000,
                .max_output_bytes = 4u << 20,
        };
        http_limits_init(&c->limits);
}

static int config_uint(
        const cJSON *o, const char *name, uint64_t lo, uint64_t hi, uint64_t *ret, DsError *err)
{
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
        if (!f || cJSON_IsNull(f))
                return 0;
        if (!cJSON_IsNumber(f) || f->valuedouble != (double) (uint64_t) f->valuedouble ||
                f->valuedouble < (double) lo || f->valuedouble > (double) hi)
                return ds_error(err, -EINVAL,
                        "field 'http.%s' must be an integer from %" PRIu64 " to %" PRIu64, name, lo,
                        hi);
        *ret = (uint64_t) f->valuedouble;
        return 0;
}

static int config_string(const cJSON *o, const char *name, char *buf, size_t size, DsError *err)
{
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
        if (!f || cJSON_IsNull(f))
                return 0;
        if (!cJSON_IsString(f) || strlen(f->valuestring) >= size)
                return ds_error(err, -EINVAL,
                        "field 'http.%s' must be a string of at most %zu "
                        "bytes",
                        name, size - 1);
        strcpy(buf, f->valuestring);
        return 0;
}

int http_config_parse(const cJSON *o, HttpConfig *ret, DsError *err)
{
        static const char *const known[] = {"listen", "auth_token_file", "max_connections",
                "request_timeout_ms", "idle_timeout_ms", "max_header_bytes", "max_body_bytes"};
        HttpConfig c = *ret;
        const cJSON *f;
        uint64_t v;
        int r;

        if (!o || cJSON_IsNull(o))
                return 0;
        if (!cJSON_IsObject(o))
                return ds_error(err, -EINVAL, "field 'http' must be an object");
        /* As in the rest of dsd.json, a misspelt field is an error, not a silent default. */
        cJSON_ArrayForEach(f, o)
        {
                size_t i = 0;
                while (i < ELEMENTSOF(known) && strcmp(f->string, known[i]))
                        i++;
                if (i == ELEMENTSOF(known))
                        return ds_error(
                                err, -EINVAL, "field 'http.%s' is not a known field", f->string);
        }
        r = config_string(o, "listen", c.listen, sizeof(c.listen), err);
        if (r >= 0)
                r = config_string(
                        o, "auth_token_file", c.auth_token_file, sizeof(c.auth_token_file), err);
        if (r < 0)
                return r;
#define U(name, lo, hi, field)                                                                     \
        do {                                                                                       \
                v = (field);                                                                       \
                r = config_uint(o, name, lo, hi, &v, err);                                         \
                if (r < 0)                                                                         \
                        return r;                                                                  \
                (field) = v;                                                                       \
        } while (0)
        U("max_connections", 1, 65536, c.max_connections);
        U("request_timeout_ms", 100, 3600000, c.request_timeout_ms);
        U("idle_timeout_ms", 100, 86400000, c.idle_timeout_ms);
        U("max_header_bytes", 1024, HTTP_HEAD_MAX_LIMIT, c.limits.max_head_bytes);
        U("max_body_bytes", 1024, 1u << 30, c.limits.max_body_bytes);
#undef U
        c.limits.max_target_bytes = MIN(c.limits.max_target_bytes, c.limits.max_head_bytes / 2);
        *ret = c;
        return 0;
}

// --- Operations -------------------------------------------------------------------------

static struct io_uring_sqe *get_sqe(HttpListener *h)
{
        struct io_uring_sqe *sqe = io_uring_get_sqe(h->ring);
        if (!sqe) {
                io_uring_submit(h->ring);
                sqe = io_uring_get_sqe(h->ring);
        }
        return sqe;
}

static void arm(HttpListener *h, HttpOp *op, struct io_uring_sqe *sqe)
{
        io_uring_sqe_set_data(sqe, &op->io);
        op->io.armed = true;
        h->n_armed++;
        if (op->conn)
                op->conn->n_ref++;
}

static void cancel(HttpListener *h, HttpOp *op)
{
        struct io_uring_sqe *sqe;

        if (!op->io.armed)
                return;
        sqe = get_sqe(h);
        if (!sqe)
                return; /* the fd is shut down too, so the operation ends anyway */
        io_uring_prep_cancel(sqe, &op->io, 0);
        io_uring_sqe_set_data(sqe, &h->op_cancel.io);
        h->n_armed++;
}

static void op_init(HttpOp *op, HttpOpKind kind, HttpConn *c)
{
        *op = (HttpOp){.io = {.kind = IO_HTTP}, .kind = kind, .conn = c};
}

static int arm_accept(HttpListener *h)
{
        struct io_uring_sqe *sqe = get_sqe(h);
        if (!sqe)
                return -EBUSY;
        io_uring_prep_multishot_accept(sqe, h->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        arm(h, &h->op_accept, sqe);
        return 0;
}

static int arm_tick(HttpListener *h)
{
        struct io_uring_sqe *sqe = get_sqe(h);
        if (!sqe)
                return -EBUSY;
        h->tick = (struct __kernel_timespec){.tv_nsec = HTTP_TICK_NSEC};
        io_uring_prep_timeout(sqe, &h->tick, 0, 0);
        arm(h, &h->op_tick, sqe);
        return 0;
}

static int arm_read(HttpConn *c)
{
        if (c->op_read.io.armed || c->closed || c->in_len == sizeof(c->in))
                return 0;
        struct io_uring_sqe *sqe = get_sqe(c->h);
        if (!sqe)
                return -EBUSY;
        io_uring_prep_recv(sqe, c->fd, c->in + c->in_len, sizeof(c->in) - c->in_len, 0);
        arm(c->h, &c->op_read, sqe);
        return 0;
}

static void conn_close(HttpConn *c, const char *why);

/* Sends what is queued: out becomes sending when the kernel has taken all of sending. */
static void flush(HttpConn *c)
{
        if (c->closed || c->op_write.io.armed)
                return;
        if (c->sent == c->sending.len) {
                StrBuf t = c->sending;
                strbuf_clear(&t);
                c->sending = c->out;
                c->out = t;
                c->sent = 0;
        }
        if (c->sending.len == 0) {
                if (c->close_after)
                        conn_close(c, "answered");
                return;
        }
        struct io_uring_sqe *sqe = get_sqe(c->h);
        if (!sqe)
                return conn_close(c, "no submission entry");
        io_uring_prep_send(
                sqe, c->fd, c->sending.data + c->sent, c->sending.len - c->sent, MSG_NOSIGNAL);
        arm(c->h, &c->op_write, sqe);
}

// --- Connections ------------------------------------------------------------------------

static void conn_unref(HttpConn *c)
{
        assert(c->n_ref > 0);
        if (--c->n_ref > 0)
                return;
        if (c->fd >= 0)
                close(c->fd);
        http_parser_free(c->parser);
        strbuf_free(&c->out);
        strbuf_free(&c->sending);
        free(c);
}

static void gen_free(HttpGen *g)
{
        oai_request_free(g->req);
        strbuf_free(&g->content);
        strbuf_free(&g->reasoning);
        oai_logprobs_free(&g->lp);
        free(g);
}

static void conn_close(HttpConn *c, const char *why)
{
        HttpListener *h = c->h;

        if (c->closed)
                return;
        log_debug("HTTP connection %u closed: %s", c->key & ~HTTP_CLIENT_KEY_BIT, why);
        c->closed = true;
        if (c->gen) {
                /* The engine frees its blocks at the next step; the FINAL frees g. */
                EngineLoop *loop = c->gen->loop;
                c->gen->conn = NULL;
                c->gen = NULL;
                if (engine_loop_cancel_client(loop, c->key) < 0)
                        log_error("Failed to cancel the request of HTTP connection %u",
                                c->key & ~HTTP_CLIENT_KEY_BIT);
        }
        shutdown(c->fd, SHUT_RDWR);
        cancel(h, &c->op_read);
        cancel(h, &c->op_write);
        if (c->prev)
                c->prev->next = c->next;
        else
                h->conns = c->next;
        if (c->next)
                c->next->prev = c->prev;
        h->n_conns--;
        conn_unref(c);
}

static void set_idle(HttpConn *c)
{
        c->deadline = now_usec() + (uint64_t) c->h->cfg.idle_timeout_ms * 1000;
}

static void respond(HttpConn *c, int status, const char *ctype, const char *body, size_t len,
        const char *extra_headers)
{
        int r = strbuf_printf(&c->out,
                "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s%s\r\n", status,
                http_status_reason(status), ctype, len, extra_headers ? extra_headers : "",
                c->keep_alive ? "" : "Connection: close\r\n");
        if (r >= 0 && !c->head_only)
                r = strbuf_append(&c->out, body, len);
        if (r < 0)
                return conn_close(c, "out of memory");
        if (!c->keep_alive)
                c->close_after = true;
        flush(c);
}

static void respond_json(HttpConn *c, int status, const StrBuf *b)
{
        respond(c, status, "application/json", b->data ? b->data : "", b->len, NULL);
}

static void respond_error(HttpConn *c, const OaiError *e)
{
        StrBuf b = {};
        const char *extra = e->status == 401                       ? "WWW-Authenticate: Bearer\r\n"
                            : e->status == 429 || e->status == 503 ? "Retry-After: 1\r\n"
                                                                   : NULL;
        if (oai_error_json(&b, e) < 0)
                return strbuf_free(&b), conn_close(c, "out of memory");
        respond(c, e->status, "application/json", b.data, b.len, extra);
        strbuf_free(&b);
}

static void respond_status(
        HttpConn *c, int status, const char *param, const char *fmt, const char *msg)
{
        OaiError e;
        oai_error(&e, status, param, fmt, msg);
        respond_error(c, &e);
}

// --- Generation -------------------------------------------------------------------------

static int token_text(const HttpGen *g, int32_t id, char **ret, size_t *ret_len)
{
        return tokenizer_decode(g->engine->tok, &id, 1, ret, ret_len, NULL);
}

static int add_logprobs(HttpGen *g, const SchedEvent *ev)
{
        OaiLogprobEntry s = {.logprob = ev->sampled.logprob}, top[SCHED_TOP_LOGPROBS_MAX];
        char *texts[SCHED_TOP_LOGPROBS_MAX + 1] = {};
        uint32_t n = MIN(ev->n_top, g->req->top_logprobs);
        int r;

        r = token_text(g, ev->token, &texts[0], &s.len);
        s.text = texts[0];
        for (uint32_t i = 0; r >= 0 && i < n; i++) {
                r = token_text(g, ev->top[i].id, &texts[i + 1], &top[i].len);
                top[i].text = texts[i + 1];
                top[i].logprob = ev->top[i].logprob;
        }
        if (r >= 0)
                r = oai_logprobs_add(&g->lp, &s, top, n);
        for (uint32_t i = 0; i <= n; i++)
                free(texts[i]);
        return r;
}

static int gen_text(HttpGen *g, const char *text, size_t len)
{
        if (!g->split)
                return strbuf_append(&g->content, text, len);
        return think_split_feed(&g->think, text, len, &g->reasoning, &g->content);
}

/* Appends one SSE event as one chunk of the chunked body. */
static int sse(HttpConn *c, const StrBuf *ev)
{
        int r = strbuf_printf(&c->out, "%zx\r\n", ev->len);
        r = r ?: strbuf_append(&c->out, ev->data, ev->len);
        return r ?: strbuf_puts(&c->out, "\r\n");
}

static int stream_start(HttpConn *c, HttpGen *g)
{
        StrBuf ev = {};
        int r;

        g->started = true;
        r = strbuf_puts(&c->out, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n");
        r = r ?: strbuf_puts(&c->out, c->keep_alive ? "\r\n" : "Connection: close\r\n\r\n");
        if (r >= 0 && g->req->kind == OAI_CHAT) {
                r = oai_stream_chunk(
                        &ev, &g->resp, true, "", 0, NULL, 0, NULL, NULL, g->req->include_usage);
                r = r ?: sse(c, &ev);
        }
        strbuf_free(&ev);
        return r;
}

/* Streaming: the text and logprobs this event decided, as one chunk. */
static int stream_delta(HttpConn *c, HttpGen *g, const char *finish)
{
        StrBuf ev = {};
        bool has_reasoning = g->reasoning.len > 0, has_content = g->content.len > 0;
        int r = 0;

        if (has_content || has_reasoning || g->lp.n > 0 || finish) {
                r = oai_stream_chunk(&ev, &g->resp, false,
                        has_content || !has_reasoning ? (g->content.data ?: "") : NULL,
                        g->content.len, has_reasoning ? g->reasoning.data : NULL, g->reasoning.len,
                        g->lp.n ? &g->lp : NULL, finish, g->req->include_usage);
                r = r ?: sse(c, &ev);
        }
        strbuf_free(&ev);
        strbuf_clear(&g->content);
        strbuf_clear(&g->reasoning);
        oai_logprobs_clear(&g->lp);
        return r;
}

static void conn_next(HttpConn *c);
static void conn_unref(HttpConn *c);

static void gen_finish(HttpConn *c, HttpGen *g, const SchedEvent *ev)
{
        const char *finish = oai_finish_reason(ev->finish);
        OaiUsage usage = {ev->usage.prompt_tokens, ev->usage.generated_tokens};
        StrBuf b = {};
        int r = 0;

        if (g->split)
                r = think_split_flush(&g->think, &g->reasoning, &g->content);
        if (r < 0)
                return conn_close(c, "out of memory");
        if (ev->type == SCHED_EV_ERROR || !finish) {
                OaiError e;
                if (ev->type == SCHED_EV_ERROR)
                        oai_error(&e, 500, NULL, "%.*s", (int) ev->text_len, ev->text);
                else
                        oai_error(&e, 503, NULL, "The request was cancelled: the daemon stops");
                if (!g->started)
                        return respond_error(c, &e);
                /* Mid-stream: an error event, then the stream ends. */
                r = strbuf_puts(&b, "data: ");
                r = r ?: oai_error_json(&b, &e);
                r = r ?: strbuf_puts(&b, "\n\n");
                r = r ?: sse(c, &b);
                c->close_after = true;
        } else if (g->req->stream) {
                r = stream_delta(c, g, finish);
                if (r >= 0 && g->req->include_usage) {
                        r = oai_stream_usage(&b, &g->resp, &usage);
                        r = r ?: sse(c, &b);
                        strbuf_clear(&b);
                }
                r = r ?: oai_stream_done(&b);
                r = r ?: sse(c, &b);
        } else {
                r = oai_response_json(&b, &g->resp, g->content.data ?: "", g->content.len,
                        g->split && g->reasoning.len ? g->reasoning.data : NULL, g->reasoning.len,
                        g->req->logprobs ? &g->lp : NULL, finish, &usage);
                if (r >= 0)
                        respond_json(c, 200, &b);
                strbuf_free(&b);
                return;
        }
        if (r >= 0 && g->started)
                r = strbuf_puts(&c->out, "0\r\n\r\n");
        strbuf_free(&b);
        if (r < 0)
                return conn_close(c, "out of memory");
        if (!c->keep_alive)
                c->close_after = true;
        flush(c);
}

/* One event of g's request on its live connection c. */
static void gen_event(HttpConn *c, HttpGen *g, const SchedEvent *ev)
{
        HttpListener *h = c->h;
        bool last = ev->type != SCHED_EV_TOKEN;
        int r = 0;

        if (g->req->dsd_timing)
                g->resp.publish_ns = ev->publish_ns;
        if (ev->type != SCHED_EV_ERROR) {
                r = gen_text(g, ev->text, ev->text_len);
                if (r >= 0 && ev->type == SCHED_EV_TOKEN && g->req->logprobs)
                        r = add_logprobs(g, ev);
                if (r >= 0 && ev->type == SCHED_EV_TOKEN && g->req->stream) {
                        r = g->started ? 0 : stream_start(c, g);
                        r = r ?: stream_delta(c, g, NULL);
                        if (r >= 0)
                                flush(c);
                        /* A reader that does not keep up is not buffered without bound. */
                        if (!c->closed && c->out.len + c->sending.len > h->cfg.max_output_bytes)
                                conn_close(c, "the client does not read its stream");
                }
                if (r < 0)
                        conn_close(c, "out of memory");
        }
        if (!last || c->closed)
                return;
        /* A stream that ends before its first token still gets its head. */
        r = 0;
        if (g->req->stream && !g->started && ev->type == SCHED_EV_FINAL &&
                oai_finish_reason(ev->finish))
                r = stream_start(c, g);
        if (r < 0)
                return conn_close(c, "out of memory");
        gen_finish(c, g, ev);
        if (!c->closed) {
                c->gen = NULL;
                conn_next(c);
        }
}

void http_listener_deliver(HttpListener *h, const SchedEvent *ev)
{
        HttpGen *g = ev->userdata;
        HttpConn *c = g->conn;

        metrics_on_event(h->metrics, ev, &g->last_token_ns);
        if (c) {
                /* Whatever closes c below, it is freed only by our unref. */
                c->n_ref++;
                gen_event(c, g, ev);
                conn_unref(c);
        }
        if (ev->type != SCHED_EV_TOKEN)
                gen_free(g);
}

void http_listener_account(HttpListener *h, const SchedEvent *ev, uint64_t *last_token_ns)
{
        metrics_on_event(h->metrics, ev, last_token_ns);
}

Metrics *http_listener_metrics(HttpListener *h)
{
        return h->metrics;
}

// --- Requests ---------------------------------------------------------------------------

/* The prompt's ids, and whether the prompt opened a <think> block already. */
static int encode(HttpListener *h, const OaiRequest *q, int32_t **ret, size_t *ret_n,
        bool *ret_think, OaiError *e)
{
        Tokenizer *tok = h->engine->tok;
        const char *param = q->kind == OAI_CHAT ? "messages" : "prompt";
        _cleanup_free_ char *text = NULL;
        DsError err = {};
        int r;

        *ret_think = false;
        if (q->kind == OAI_COMPLETION && q->prompt_ids) {
                uint32_t n_vocab = tokenizer_n_vocab(tok);
                for (size_t i = 0; i < q->n_prompt_ids; i++)
                        if ((uint32_t) q->prompt_ids[i] >= n_vocab)
                                return oai_error(e, 400, "prompt",
                                        "'prompt' holds token id %d; "
                                        "the vocabulary has %u",
                                        q->prompt_ids[i], n_vocab);
                int32_t *ids = malloc(q->n_prompt_ids * sizeof(int32_t));
                if (!ids)
                        return oai_error(e, 500, NULL, "Out of memory");
                memcpy(ids, q->prompt_ids, q->n_prompt_ids * sizeof(int32_t));
                *ret = ids;
                *ret_n = q->n_prompt_ids;
                return 0;
        }
        if (q->kind == OAI_COMPLETION)
                r = engine_encode_prompt(h->engine, q->prompt, false, ret, ret_n, &err);
        else if (tokenizer_chat_family(tok) != CHAT_NONE) {
                r = chat_render(tok, q->messages, q->n_messages, &text, &err);
                if (r >= 0) {
                        size_t n = strlen(text);
                        *ret_think = n >= 8 && strcmp(text + n - 8, "<think>\n") == 0;
                        r = tokenizer_encode(tok, text, n, ret, ret_n, &err);
                }
        } else if (q->n_messages == 1) {
                /* As a native chat request: the one text through the same path. */
                r = engine_encode_prompt(h->engine, q->messages[0].content, true, ret, ret_n, &err);
        } else {
                /* No template: the turns joined by blank lines. */
                StrBuf b = {};
                r = 0;
                for (size_t i = 0; r >= 0 && i < q->n_messages; i++)
                        r = strbuf_printf(&b, "%s%s", i ? "\n\n" : "", q->messages[i].content);
                if (r >= 0)
                        r = engine_encode_prompt(h->engine, b.data, false, ret, ret_n, &err);
                strbuf_free(&b);
        }
        if (r == -ENOMEM)
                return oai_error(e, 500, NULL, "Out of memory");
        if (r < 0)
                return oai_error(e, 400, param, "'%s' cannot be tokenized: %s", param, err.msg);
        return 0;
}

static void handle_completion(HttpConn *c, const HttpRequest *hr, OaiKind kind)
{
        HttpListener *h = c->h;
        _cleanup_(oai_request_freep) OaiRequest *q = NULL;
        _cleanup_(sched_request_freep) SchedRequest *sr = NULL;
        size_t n_prompt = 0;
        bool think = false;
        OaiError e;
        DsError err = {};
        int r;

        if (h->stopping || h->draining)
                return respond_status(c, 503, NULL, "%s", "The daemon is draining");
        r = oai_request_parse(kind, (const char *) hr->body, hr->body_len, &q, &e);
        if (r < 0)
                return respond_error(c, &e);
        if (sched_request_new(&sr) < 0)
                return respond_status(c, 500, NULL, "%s", "Out of memory");
        r = encode(h, q, &sr->prompt, &n_prompt, &think, &e);
        if (r < 0)
                return respond_error(c, &e);
        sr->n_prompt = (uint32_t) MIN(n_prompt, (size_t) UINT32_MAX);
        sr->id = HTTP_REQUEST_ID_BIT | ++h->next_id;
        sr->client = c->key;
        sr->max_tokens = q->max_tokens;
        sr->sampling = q->sampling;
        if (!q->has_seed && getrandom(&sr->sampling.seed, sizeof(sr->sampling.seed), 0) < 0)
                sr->sampling.seed = now_usec() ^ sr->id;
        if (q->n_stops > 0) {
                sr->stops = calloc(q->n_stops, sizeof(char *));
                if (!sr->stops)
                        return respond_status(c, 500, NULL, "%s", "Out of memory");
                for (uint32_t i = 0; i < q->n_stops; i++) {
                        sr->stops[i] = strdup(q->stops[i]);
                        if (!sr->stops[i])
                                return respond_status(c, 500, NULL, "%s", "Out of memory");
                        sr->n_stops++;
                }
        }
        /* The sampled token's own logprob comes with at least one alternative. */
        sr->top_logprobs = q->logprobs ? MAX(q->top_logprobs, 1u) : 0;
        sr->enqueue_usec = now_usec();

        HttpGen *g = calloc(1, sizeof(*g));
        if (!g)
                return respond_status(c, 500, NULL, "%s", "Out of memory");
        g->h = h;
        g->conn = c;
        g->id = sr->id;
        g->split = !q->reasoning_inline;
        think_split_init(&g->think, think);
        g->lp.kind = kind;
        g->prompt_tokens = sr->n_prompt;
        snprintf(g->resp_id, sizeof(g->resp_id), "%s-%016" PRIx64,
                kind == OAI_CHAT ? "chatcmpl" : "cmpl", sr->id & ~HTTP_REQUEST_ID_BIT);
        g->resp = (OaiResponse){
                .kind = kind, .id = g->resp_id, .model = h->model, .created = time(NULL)};
        sr->userdata = g;
        g->engine = h->engine;
        g->loop = h->loop;

        r = engine_loop_submit(h->loop, &sr, &err);
        if (r < 0) {
                free(g);
                const char *param = kind == OAI_CHAT ? "messages" : "prompt";
                if (r == -EBUSY) {
                        oai_error(&e, 429, NULL, "The queue is full: %s", err.msg);
                        e.code = "queue_full";
                } else if (r == -DS_ERR_CONTEXT_FULL) {
                        oai_error(&e, 400, param, "%s", err.msg);
                        e.code = "context_length_exceeded";
                } else if (r == -ESHUTDOWN)
                        oai_error(&e, 503, NULL, "The daemon is draining");
                else
                        oai_error(&e, r == -EINVAL ? 400 : 500, NULL, "%s", err.msg);
                return respond_error(c, &e);
        }
        g->req = TAKE_PTR(q);
        c->gen = g;
}

static void handle_tokenize(HttpConn *c, const HttpRequest *hr)
{
        HttpListener *h = c->h;
        _cleanup_(oai_tokenize_freep) OaiTokenizeRequest *q = NULL;
        _cleanup_free_ int32_t *ids = NULL;
        _cleanup_free_ char *text = NULL;
        size_t n = 0;
        DsError err = {};
        OaiError e;
        int r;

        r = oai_tokenize_parse((const char *) hr->body, hr->body_len, &q, &e);
        if (r < 0)
                return respond_error(c, &e);
        if (q->messages) {
                r = chat_render(h->engine->tok, q->messages, q->n_messages, &text, &err);
                r = r ?: tokenizer_encode(h->engine->tok, text, strlen(text), &ids, &n, &err);
        } else if (q->add_special)
                r = engine_encode_prompt(h->engine, q->prompt, false, &ids, &n, &err);
        else
                r = tokenizer_encode(h->engine->tok, q->prompt, strlen(q->prompt), &ids, &n, &err);
        if (r < 0)
                return respond_status(c, 400, q->messages ? "messages" : "prompt",
                        "cannot tokenize: %s", err.msg);
        StrBuf b = {};
        r = strbuf_puts(&b, "{\"tokens\":[");
        for (size_t i = 0; r >= 0 && i < n; i++)
                r = strbuf_printf(&b, i ? ",%d" : "%d", ids[i]);
        r = r ?: strbuf_printf(&b, "],\"count\":%zu}", n);
        if (r < 0)
                conn_close(c, "out of memory");
        else
                respond_json(c, 200, &b);
        strbuf_free(&b);
}

static void handle_detokenize(HttpConn *c, const HttpRequest *hr)
{
        HttpListener *h = c->h;
        _cleanup_free_ int32_t *ids = NULL;
        _cleanup_free_ char *text = NULL;
        size_t n, len;
        OaiError e;
        int r;

        r = oai_detokenize_parse((const char *) hr->body, hr->body_len,
                tokenizer_n_vocab(h->engine->tok), &ids, &n, &e);
        if (r < 0)
                return respond_error(c, &e);
        r = tokenizer_decode(h->engine->tok, ids, n, &text, &len, NULL);
        if (r < 0)
                return respond_status(c, 500, NULL, "%s", "cannot detokenize");
        StrBuf b = {};
        r = strbuf_puts(&b, "{\"prompt\":");
        r = r ?: strbuf_json_string(&b, text, len);
        r = r ?: strbuf_puts(&b, "}");
        if (r < 0)
                conn_close(c, "out of memory");
        else
                respond_json(c, 200, &b);
        strbuf_free(&b);
}

static void handle_metrics(HttpConn *c)
{
        HttpListener *h = c->h;
        EngineLoopStats st;
        StrBuf b = {};

        if (h->loop)
                engine_loop_stats(h->loop, &st);
        else
                st = (EngineLoopStats){};
        uint32_t used = st.kv_blocks_total - st.kv_blocks_free;
        metrics_set(h->metrics, METRIC_RUNNING, st.active);
        metrics_set(h->metrics, METRIC_WAITING, st.queued);
        metrics_set(h->metrics, METRIC_KV_BLOCKS_USED, used);
        metrics_set(h->metrics, METRIC_KV_BLOCKS_TOTAL, st.kv_blocks_total);
        metrics_set(h->metrics, METRIC_KV_USAGE,
                st.kv_blocks_total ? (double) used / st.kv_blocks_total : 0);
        uint64_t mem_used, mem_total;
        engine_memory(h->engine, &mem_used, &mem_total);
        metrics_set(h->metrics, METRIC_GPU_MEMORY_USED, (double) mem_used);
        if (metrics_render(h->metrics, &b) < 0)
                conn_close(c, "out of memory");
        else
                respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len, NULL);
        strbuf_free(&b);
}

/* Bodies of /health; their lengths come from sizeof, never counted by hand. */
#define HEALTH_OK       "{\"status\":\"ok\"}"
#define HEALTH_LOADING  "{\"status\":\"loading\"}"
#define HEALTH_DRAINING "{\"status\":\"draining\"}"

static void route(HttpConn *c, const HttpRequest *hr)
{
        HttpListener *h = c->h;
        const char *p = hr->path;
        bool get = hr->method == HTTP_GET || hr->method == HTTP_HEAD;
        bool post = hr->method == HTTP_POST;
        StrBuf b = {};

        c->keep_alive = hr->keep_alive && !h->stopping;
        c->head_only = hr->method == HTTP_HEAD;
        if (strcmp(p, "/health") == 0 && get) {
                /* Load balancers steer away from a drained daemon as from a stopping one. */
                if (h->stopping || h->draining)
                        return respond(c, 503, "application/json", HEALTH_DRAINING,
                                sizeof(HEALTH_DRAINING) - 1, "Retry-After: 1\r\n");
                if (!h->engine)
                        return respond(c, 503, "application/json", HEALTH_LOADING,
                                sizeof(HEALTH_LOADING) - 1, "Retry-After: 1\r\n");
                return respond(c, 200, "application/json", HEALTH_OK, sizeof(HEALTH_OK) - 1, NULL);
        }
        /* Everything but the health check needs the token when one is configured. */
        if (!http_auth_check(&h->auth, http_request_header(hr, "authorization"))) {
                OaiError e;
                oai_error(&e, 401, NULL, "Missing or wrong bearer token");
                e.code = "invalid_api_key";
                return respond_error(c, &e);
        }
        if (strcmp(p, "/metrics") == 0 && get)
                return handle_metrics(c);
        /* Until the first model is resident there is nothing else to answer with. */
        if (!h->engine)
                return respond_status(c, 503, NULL, "%s", "No model is loaded yet");
        if (strcmp(p, "/v1/chat/completions") == 0 && post)
                return handle_completion(c, hr, OAI_CHAT);
        if (strcmp(p, "/v1/completions") == 0 && post)
                return handle_completion(c, hr, OAI_COMPLETION);
        if (strcmp(p, "/tokenize") == 0 && post)
                return handle_tokenize(c, hr);
        if (strcmp(p, "/detokenize") == 0 && post)
                return handle_detokenize(c, hr);
        if (strcmp(p, "/v1/models") == 0 && get) {
                if (oai_models_json(&b, h->model, h->created) < 0)
                        conn_close(c, "out of memory");
                else
                        respond_json(c, 200, &b);
                strbuf_free(&b);
                return;
        }
        static const char *const known[] = {"/health", "/metrics", "/v1/models",
                "/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"};
        for (size_t i = 0; i < ELEMENTSOF(known); i++)
                if (strcmp(p, known[i]) == 0)
                        return respond_status(
                                c, 405, NULL, "%s not allowed here", http_method_name(hr->method));
        respond_status(c, 404, NULL, "No such endpoint: %s", p);
}

/* Parses what is buffered and answers requests until one is in the engine, the input is
 * used up or the connection closes. */
static void conn_next(HttpConn *c)
{
        while (!c->closed && !c->gen && !c->close_after) {
                size_t used;
                HttpParseState st = http_parser_feed(c->parser, c->in, c->in_len, &used);
                memmove(c->in, c->in + used, c->in_len - used);
                c->in_len -= used;
                if (http_parser_started(c->parser) && !c->in_request) {
                        /* Head and body must arrive within the timeout (no slowloris). */
                        c->in_request = true;
                        c->deadline = now_usec() + (uint64_t) c->h->cfg.request_timeout_ms * 1000;
                }
                if (st == HTTP_PARSE_MORE)
                        break;
                if (st == HTTP_PARSE_HEAD) {
                        if (http_parser_expects_continue(c->parser) &&
                                strbuf_puts(&c->out, "HTTP/1.1 100 Continue\r\n\r\n") >= 0)
                                flush(c);
                        continue;
                }
                if (st == HTTP_PARSE_ERROR) {
                        c->keep_alive = false;
                        c->head_only = false;
                        respond_status(c, http_parser_status(c->parser), NULL, "%s",
                                http_parser_error(c->parser));
                        break;
                }
                route(c, http_parser_request(c->parser));
                http_parser_reset(c->parser);
                c->in_request = false;
                set_idle(c);
        }
        if (!c->closed && arm_read(c) < 0)
                conn_close(c, "no submission entry");
}

static void on_accept(HttpListener *h, int fd)
{
        HttpConn *c;

        if (h->stopping || h->n_conns >= h->cfg.max_connections) {
                /* Refused with a status rather than a silent close. */
                static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\n"
                                           "Content-Length: 0\r\nConnection: close\r\n\r\n";
                (void) !send(fd, busy, sizeof(busy) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
                close(fd);
                return;
        }
        c = calloc(1, sizeof(*c));
        if (!c || http_parser_new(&h->cfg.limits, &c->parser) < 0) {
                free(c);
                close(fd);
                return;
        }
        c->h = h;
        c->fd = fd;
        c->n_ref = 1;
        c->key = HTTP_CLIENT_KEY_BIT | (++h->next_key & ~HTTP_CLIENT_KEY_BIT);
        op_init(&c->op_read, HOP_READ, c);
        op_init(&c->op_write, HOP_WRITE, c);
        set_idle(c);
        c->next = h->conns;
        if (h->conns)
                h->conns->prev = c;
        h->conns = c;
        h->n_conns++;
        if (arm_read(c) < 0)
                conn_close(c, "no submission entry");
}

static void on_tick(HttpListener *h)
{
        uint64_t now = now_usec();

        for (HttpConn *c = h->conns, *next; c; c = next) {
                next = c->next;
                if (c->gen || now < c->deadline)
                        continue;
                if (http_parser_started(c->parser) && !c->close_after) {
                        /* Slow or stalled sender: it gets a status, then the close. */
                        c->keep_alive = false;
                        c->head_only = false;
                        c->deadline = now + 1000000;
                        c->n_ref++;
                        respond_status(c, 408, NULL, "%s", "The request did not arrive in time");
                        conn_unref(c);
                } else
                        conn_close(c, "timed out");
        }
}

void http_listener_cqe(HttpListener *h, IoOp *io, int res, unsigned flags)
{
        HttpOp *op = (HttpOp *) ((char *) io - offsetof(HttpOp, io));
        HttpConn *c = op->conn;

        if (op->kind == HOP_CANCEL) {
                h->n_armed--;
                return;
        }
        if (!(op->kind == HOP_ACCEPT && (flags & IORING_CQE_F_MORE))) {
                op->io.armed = false;
                h->n_armed--;
        }
        switch (op->kind) {
        case HOP_ACCEPT:
                if (res >= 0)
                        on_accept(h, res);
                else if (res != -ECANCELED)
                        log_warning_errno(res, "Failed to accept an HTTP connection: %m");
                if (!op->io.armed && !h->stopping && arm_accept(h) < 0)
                        log_error("Failed to re-arm the HTTP accept: no submission entry");
                return;
        case HOP_TICK:
                if (res != -ECANCELED) {
                        on_tick(h);
                        if (!h->stopping || h->conns)
                                (void) arm_tick(h);
                }
                return;
        case HOP_READ:
                if (!c->closed) {
                        if (res <= 0)
                                conn_close(c, res == 0 ? "end of stream" : strerror(-res));
                        else {
                                c->in_len += (size_t) res;
                                conn_next(c);
                        }
                }
                break;
        case HOP_WRITE:
                if (!c->closed) {
                        if (res < 0)
                                conn_close(c, strerror(-res));
                        else {
                                c->sent += (size_t) res;
                                flush(c);
                        }
                }
                break;
        default:
                break;
        }
        conn_unref(c);
}

// --- Setup ------------------------------------------------------------------------------

static int listen_on(HttpListener *h, const char *addr, DsError *err)
{
        _cleanup_close_ int fd = -EBADF;
        union {
                struct sockaddr sa;
                struct sockaddr_un un;
                struct sockaddr_in in;
                struct sockaddr_in6 in6;
        } sa = {};
        socklen_t len;
        const char *path = strncmp(addr, "unix:", 5) == 0 ? addr + 5 : addr[0] == '/' ? addr : NULL;

        if (path) {
                if (strlen(path) >= sizeof(sa.un.sun_path))
                        return ds_error(err, -ENAMETOOLONG, "http.listen: '%s' is too long", path);
                sa.un.sun_family = AF_UNIX;
                strcpy(sa.un.sun_path, path);
                len = sizeof(sa.un);
                struct stat st;
                if (lstat(path, &st) == 0) {
                        if (!S_ISSOCK(st.st_mode))
                                return ds_error(err, -EEXIST,
                                        "http.listen: '%s' exists and is "
                                        "not a socket",
                                        path);
                        (void) unlink(path);
                }
                snprintf(h->unix_path, sizeof(h->unix_path), "%s", path);
        } else {
                char host[256];
                const char *port;
                if (addr[0] == '[') {
                        const char *end = strchr(addr, ']');
                        if (!end || end[1] != ':' || (size_t) (end - addr) > sizeof(host))
                                return ds_error(err, -EINVAL,
                                        "http.listen: '%s' is not "
                                        "[address]:port",
                                        addr);
                        snprintf(host, sizeof(host), "%.*s", (int) (end - addr - 1), addr + 1);
                        port = end + 2;
                } else if (strchr(addr, ':')) {
                        const char *colon = strrchr(addr, ':');
                        snprintf(host, sizeof(host), "%.*s", (int) (colon - addr), addr);
                        port = colon + 1;
                } else {
                        host[0] = 0;
                        port = addr;
                }
                /* No host means loopback: the wildcard only when written out. */
                if (!host[0] || strcmp(host, "localhost") == 0)
                        strcpy(host, "127.0.0.1");
                char *end;
                unsigned long p = strtoul(port, &end, 10);
                if (!*port || *end || p > 65535)
                        return ds_error(err, -EINVAL, "http.listen: bad port in '%s'", addr);
                if (inet_pton(AF_INET, host, &sa.in.sin_addr) == 1) {
                        sa.in.sin_family = AF_INET;
                        sa.in.sin_port = htons((uint16_t) p);
                        len = sizeof(sa.in);
                } else if (inet_pton(AF_INET6, host, &sa.in6.sin6_addr) == 1) {
                        sa.in6.sin6_family = AF_INET6;
                        sa.in6.sin6_port = htons((uint16_t) p);
                        len = sizeof(sa.in6);
                } else
                        return ds_error(err, -EINVAL,
                                "http.listen: '%s' is not a numeric "
                                "address",
                                host);
        }
        fd = socket(sa.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return ds_error(err, -errno, "http.listen: cannot create a socket: %m");
        if (!path) {
                int one = 1;
                (void) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        }
        if (bind(fd, &sa.sa, len) < 0)
                return ds_error(err, -errno, "http.listen: cannot bind '%s': %m", addr);
        if (listen(fd, SOMAXCONN) < 0)
                return ds_error(err, -errno, "http.listen: cannot listen on '%s': %m", addr);
        return TAKE_FD(fd);
}

int http_listener_new(struct io_uring *ring, Engine *e, EngineLoop *loop, const HttpConfig *cfg,
        const char *model, HttpListener **ret, DsError *err)
{
        _cleanup_(http_listener_freep) HttpListener *h = NULL;
        int r;

        h = calloc(1, sizeof(*h));
        if (!h)
                return ds_error(err, -ENOMEM, "out of memory");
        h->listen_fd = -EBADF;
        h->ring = ring;
        h->engine = e;
        h->loop = loop;
        h->cfg = *cfg;
        h->created = time(NULL);
        op_init(&h->op_accept, HOP_ACCEPT, NULL);
        op_init(&h->op_tick, HOP_TICK, NULL);
        op_init(&h->op_cancel, HOP_CANCEL, NULL);
        h->model = strdup(model);
        if (!h->model)
                return ds_error(err, -ENOMEM, "out of memory");
        r = metrics_new(model, &h->metrics);
        if (r < 0)
                return ds_error(err, r, "out of memory");
        r = http_auth_load(&h->auth, cfg->auth_token_file, err);
        if (r < 0)
                return ds_error_prefix(err, "http.auth_token_file"), r;
        r = listen_on(h, cfg->listen, err);
        if (r < 0)
                return r;
        h->listen_fd = r;
        if (arm_accept(h) < 0 || arm_tick(h) < 0)
                return ds_error(err, -EBUSY, "cannot queue the HTTP listener's operations");
        *ret = TAKE_PTR(h);
        return 0;
}

void http_listener_set_draining(HttpListener *h, bool draining)
{
        if (h)
                h->draining = draining;
}

int http_listener_set_engine(HttpListener *h, Engine *e, EngineLoop *loop, const char *model)
{
        char *m = strdup(model);
        char **old = realloc(h->old_models, (h->n_old_models + 1) * sizeof(*old));

        if (old)
                h->old_models = old;
        if (!m || !old) {
                free(m);
                return -ENOMEM;
        }
        h->old_models[h->n_old_models++] = h->model;
        h->model = m;
        h->engine = e;
        h->loop = loop;
        /* Series carry the model that serves now; the counters themselves go on. */
        return metrics_set_model(h->metrics, model);
}

void http_listener_stop(HttpListener *h)
{
        if (!h || h->stopping)
                return;
        h->stopping = true;
        cancel(h, &h->op_accept);
        if (h->unix_path[0])
                (void) unlink(h->unix_path);
}

unsigned http_listener_armed(const HttpListener *h)
{
        return h ? h->n_armed : 0;
}

void http_listener_close_all(HttpListener *h)
{
        if (!h)
                return;
        http_listener_stop(h);
        while (h->conns)
                conn_close(h->conns, "the daemon stops");
        cancel(h, &h->op_tick);
}

HttpListener *http_listener_free(HttpListener *h)
{
        if (!h)
                return NULL;
        assert(h->n_armed == 0 || !h->ring);
        if (h->listen_fd >= 0)
                close(h->listen_fd);
        http_auth_clear(&h->auth);
        metrics_free(h->metrics);
        free(h->model);
        for (size_t i = 0; i < h->n_old_models; i++)
                free(h->old_models[i]);
        free(h->old_models);
        free(h);
        return NULL;
}
