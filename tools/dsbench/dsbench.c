/* SPDX-License-Identifier: MIT */
/* dsbench: drives a running dsd through libdsclient and reports what clients see.
 * N client processes each keep up to M requests in flight (closed loop) or start them at
 * Poisson arrival times (open loop, --rate), with fixed or random prompt and output
 * lengths. Every token event carries the daemon's publish time (CLOCK_MONOTONIC, the
 * engine thread's), so the delay until the client holds it is measured for sleeping
 * (blocking ds_next) or spinning (ds_next(0) in a loop) clients, and compared with a plain
 * Unix-socket round trip measured here. Each child writes its samples to its own
 * unlinked temp file; the parent merges them after the run.
 *
 * With --http ADDR the same workload goes to dsd's OpenAI-compatible listener instead:
 * streamed /v1/completions with "dsd_timing": true, whose chunks carry the same publish
 * time, read by a minimal HTTP/1.1 client (one connection per request, poll() over a
 * process's requests), so both transports' delivery latencies compare directly. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dsclient.h"

typedef struct Range {
        uint32_t lo, hi;
} Range;

/* Words a prompt may add: each takes at most 8 bytes of the client's prompt buffer, and
 * a million of them are far past any model's context. */
#define PROMPT_WORDS_MAX 1000000u

static const char *arg_socket;
static uint32_t arg_clients = 1;
static uint32_t arg_concurrency = 1;
static uint32_t arg_requests = 16; /* per client */
static Range arg_prompt_words = {16, 16};
static Range arg_max_tokens = {128, 128};
static double arg_rate; /* requests/s over all clients; 0: closed loop */
static bool arg_spin;
static bool arg_socket_only;
static uint64_t arg_seed = 1;
static const char *arg_json;
static uint32_t arg_rtt_rounds = 20000;
static const char *arg_http;    /* the HTTP listener, instead of the native socket */
static const char *arg_api_key; /* its bearer token, when it wants one */

enum { S_TTFT, S_ITL, S_QUEUE, S_DELIVERY, S_TOKENS, S_ERROR, S_LATENCY, _S_MAX };

typedef struct Sample {
        uint32_t kind;
        int32_t code; /* S_ERROR: the error; S_TOKENS: prompt tokens */
        double v;     /* µs, or a count for S_TOKENS */
} Sample;

static uint64_t mono_ns(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

static uint64_t rnd(uint64_t *s)
{
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        return *s;
}

static uint32_t pick(Range r, uint64_t *s)
{
        return r.lo + (uint32_t) (rnd(s) % ((uint64_t) r.hi - r.lo + 1));
}

/* ---- one client process ---- */

typedef struct Slot {
        bool busy;
        uint64_t id;
        uint64_t submit_ns, last_ns;
        uint32_t tokens;
} Slot;

#define HTTP_MAX_CONCURRENCY 64u

/* One streamed HTTP request: its connection and what arrived but was not used yet. */
typedef struct HttpStream {
        int fd;
        bool head_done, done;
        int status;
        uint64_t chunk_left; /* body bytes of the current chunk still to come */
        bool chunk_crlf;     /* the CRLF after a chunk's data is still to come */
        char raw[65536];     /* received, not yet de-chunked */
        size_t raw_len;
        char sse[65536]; /* de-chunked event text, not yet parsed */
        size_t sse_len;
        uint64_t final_ns; /* the finish chunk's publish time */
        uint32_t finish_seen, prompt_tokens, generated_tokens;
} HttpStream;

typedef struct Child {
        ds_client *c;
        HttpStream *http; /* --http: one per slot */
        uint64_t next_id;
        FILE *out;
        Slot *slots;
        uint64_t seed;
        char *prompt;
        ds_event ev;
} Child;

static void emit(Child *ch, uint32_t kind, int32_t code, double v)
{
        Sample s = {kind, code, v};
        fwrite(&s, sizeof(s), 1, ch->out);
}

static int http_submit(Child *ch, Slot *sl, const char *prompt, uint32_t max_tokens);

/* A prompt is "Once upon a time" and words of these, each after a space. */
#define PROMPT_START    "Once upon a time"
#define PROMPT_WORD_MAX 6 /* "little" */
#define HTTP_BODY_MAX   4096
#define HTTP_BODY_FORMAT                                                                           \
        "{\"prompt\":\"%s\",\"max_tokens\":%u,\"temperature\":0,\"stream\":true,"                  \
        "\"stream_options\":{\"include_usage\":true},\"dsd_timing\":true}"

static int child_submit(Child *ch, Slot *sl)
{
        static const char *const words[] = {"the", "little", "dog", "ran", "to", "a", "big", "tree",
                "and", "saw", "bird", "happy"};
        uint32_t n = pick(arg_prompt_words, &ch->seed);
        ds_request req;
        size_t len = 0;
        int r;

        len += (size_t) sprintf(ch->prompt, PROMPT_START);
        for (uint32_t i = 0; i < n; i++)
                len += (size_t) sprintf(ch->prompt + len, " %s",
                        words[rnd(&ch->seed) % (sizeof(words) / sizeof(words[0]))]);
        if (arg_http)
                return http_submit(ch, sl, ch->prompt, pick(arg_max_tokens, &ch->seed));
        ds_request_init(&req);
        req.kind = DS_PROMPT_TEXT;
        req.text = ch->prompt;
        req.text_len = len;
        req.sampling.temperature = 0;
        req.max_tokens = pick(arg_max_tokens, &ch->seed);
        sl->submit_ns = mono_ns();
        r = ds_submit(ch->c, &req, &sl->id);
        if (r < 0)
                return r;
        sl->busy = true;
        sl->tokens = 0;
        sl->last_ns = sl->submit_ns;
        return 0;
}

static Slot *slot_of(Child *ch, uint64_t id)
{
        for (uint32_t i = 0; i < arg_concurrency; i++)
                if (ch->slots[i].busy && ch->slots[i].id == id)
                        return &ch->slots[i];
        return NULL;
}

static int http_next(Child *ch, int timeout_ms, ds_event *ev);

/* Takes one event, waiting until deadline_ns at most. 1, 0 (nothing) or < 0. */
static int child_next(Child *ch, uint64_t deadline_ns)
{
        for (;;) {
                uint64_t now = mono_ns();
                int timeout = arg_spin || deadline_ns <= now ? 0
                              : deadline_ns == UINT64_MAX
                                      ? -1
                                      : (int) ((deadline_ns - now + 999999) / 1000000);
                int r = arg_http ? http_next(ch, timeout, &ch->ev)
                                 : ds_next(ch->c, timeout, &ch->ev);
                if (r != 0 || mono_ns() >= deadline_ns)
                        return r;
        }
}

static int child_run(uint32_t index, FILE *out)
{
        Child ch = {.out = out, .seed = arg_seed * 7919 + index + 1};
        uint32_t started = 0, done = 0, in_flight = 0;
        double rate = arg_rate / arg_clients; /* this process's share */
        uint64_t next_arrival = mono_ns();
        int r;

        ch.slots = calloc(arg_concurrency, sizeof(*ch.slots));
        ch.prompt = malloc((size_t) arg_prompt_words.hi * 8 + 32);
        if (!ch.slots || !ch.prompt)
                return 1;
        if (arg_http) {
                ch.http = calloc(arg_concurrency, sizeof(*ch.http));
                if (!ch.http)
                        return 1;
                for (uint32_t i = 0; i < arg_concurrency; i++)
                        ch.http[i].fd = -1;
        } else {
                r = ds_connect(arg_socket, arg_socket_only ? DS_CONNECT_SOCKET_ONLY : 0, &ch.c);
                if (r < 0) {
                        const char *why = ds_connect_message();
                        fprintf(stderr,
                                "dsbench: client %u: cannot connect to dsd at '%s': %s%s%s\n",
                                index, arg_socket, ds_strerror(r), *why ? ": " : "", why);
                        return 1;
                }
        }
        while (done < arg_requests) {
                /* Start what the mode allows now. */
                while (started < arg_requests && in_flight < arg_concurrency &&
                        (rate <= 0 || mono_ns() >= next_arrival)) {
                        Slot *sl = NULL;
                        for (uint32_t i = 0; i < arg_concurrency && !sl; i++)
                                if (!ch.slots[i].busy)
                                        sl = &ch.slots[i];
                        r = child_submit(&ch, sl);
                        if (r < 0) {
                                fprintf(stderr, "dsbench: submit: %s\n",
                                        arg_http ? strerror(-r) : ds_strerror(r));
                                return 1;
                        }
                        started++;
                        in_flight++;
                        if (rate > 0) {
                                /* Exponential gaps: a Poisson process of the given rate. */
                                double u = (double) (rnd(&ch.seed) % 1000000 + 1) / 1000001.0;
                                next_arrival += (uint64_t) (-log(u) / rate * 1e9);
                        }
                }
                uint64_t deadline = rate > 0 && started < arg_requests ? next_arrival : UINT64_MAX;
                if (in_flight == 0 && deadline == UINT64_MAX)
                        break;
                r = child_next(&ch, deadline);
                if (r < 0) {
                        fprintf(stderr, "dsbench: %s: %s\n", arg_http ? "HTTP" : "ds_next",
                                arg_http ? strerror(-r) : ds_strerror(r));
                        return 1;
                }
                if (r == 0)
                        continue;
                uint64_t now = mono_ns();
                Slot *sl = slot_of(&ch, ch.ev.request_id);
                if (!sl)
                        continue;
                if (ch.ev.publish_ns && ch.ev.type != DS_EVENT_ERROR)
                        emit(&ch, S_DELIVERY, 0, (double) (now - ch.ev.publish_ns) / 1e3);
                if (ch.ev.type == DS_EVENT_TOKEN) {
                        if (ch.ev.token_id < 0)
                                continue; /* text released at the end, not a token */
                        emit(&ch, sl->tokens == 0 ? S_TTFT : S_ITL, 0,
                                (double) (now - sl->last_ns) / 1e3);
                        sl->last_ns = now;
                        sl->tokens++;
                        continue;
                }
                if (ch.ev.type == DS_EVENT_FINAL) {
                        /* HTTP answers do not report the queue time. */
                        if (!arg_http)
                                emit(&ch, S_QUEUE, 0, (double) ch.ev.queue_us);
                        emit(&ch, S_TOKENS, (int32_t) ch.ev.prompt_tokens,
                                (double) ch.ev.generated_tokens);
                } else
                        emit(&ch, S_ERROR, ch.ev.error, 0);
                emit(&ch, S_LATENCY, 0, (double) (now - sl->submit_ns) / 1e3);
                sl->busy = false;
                in_flight--;
                done++;
        }
        ds_close(ch.c);
        return 0;
}

/* ---- the HTTP client ---- */

static int http_connect(const char *addr)
{
        const char *path = strncmp(addr, "unix:", 5) == 0 ? addr + 5 : addr[0] == '/' ? addr : NULL;
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
        char host[256];
        int fd, r;

        if (path) {
                struct sockaddr_un un = {.sun_family = AF_UNIX};
                if (strlen(path) >= sizeof(un.sun_path))
                        return -ENAMETOOLONG;
                strcpy(un.sun_path, path);
                fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
                if (fd < 0)
                        return -errno;
                if (connect(fd, (struct sockaddr *) &un, sizeof(un)) < 0) {
                        r = -errno;
                        close(fd);
                        return r;
                }
                return fd;
        }
        const char *colon = strrchr(addr, ':');
        if (!colon || (size_t) (colon - addr) >= sizeof(host))
                return -EINVAL;
        /* "[::1]:8080" and "127.0.0.1:8080"; no host means loopback, as dsd reads it. */
        if (addr[0] == '[' && colon > addr + 1 && colon[-1] == ']')
                snprintf(host, sizeof(host), "%.*s", (int) (colon - addr - 2), addr + 1);
        else
                snprintf(host, sizeof(host), "%.*s", (int) (colon - addr), addr);
        if (getaddrinfo(host[0] ? host : "127.0.0.1", colon + 1, &hints, &ai) != 0 || !ai)
                return -EHOSTUNREACH;
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
                r = -errno;
                if (fd >= 0)
                        close(fd);
                freeaddrinfo(ai);
                return r;
        }
        freeaddrinfo(ai);
        /* Requests are single writes; the answer's chunks must not wait on our ACKs. */
        int one = 1;
        (void) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return fd;
}

/* A streamed completion of the same greedy request the ring mode sends; the connection
 * closes after the answer. The prompt is our own words: nothing to escape. */
static int http_submit(Child *ch, Slot *sl, const char *prompt, uint32_t max_tokens)
{
        HttpStream *h = &ch->http[sl - ch->slots];
        char body[HTTP_BODY_MAX], req[HTTP_BODY_MAX + 4096];
        int n, m, fd;

        n = snprintf(body, sizeof(body), HTTP_BODY_FORMAT, prompt, max_tokens);
        if (n < 0 || (size_t) n >= sizeof(body))
                return -E2BIG;
        m = snprintf(req, sizeof(req),
                "POST /v1/completions HTTP/1.1\r\nHost: dsd\r\nConnection: close\r\n"
                "Content-Type: application/json\r\n%s%s%sContent-Length: %d\r\n\r\n%s",
                arg_api_key ? "Authorization: Bearer " : "", arg_api_key ? arg_api_key : "",
                arg_api_key ? "\r\n" : "", n, body);
        if (m < 0 || (size_t) m >= sizeof(req))
                return -E2BIG;
        sl->submit_ns = mono_ns();
        fd = http_connect(arg_http);
        if (fd < 0)
                return fd;
        for (int off = 0; off < m;) {
                ssize_t k = send(fd, req + off, (size_t) (m - off), MSG_NOSIGNAL);
                if (k < 0) {
                        int r = -errno;
                        close(fd);
                        return r;
                }
                off += (int) k;
        }
        *h = (HttpStream){.fd = fd};
        sl->id = ++ch->next_id;
        sl->busy = true;
        sl->tokens = 0;
        sl->last_ns = sl->submit_ns;
        return 0;
}

static uint64_t json_u64(const char *ev, const char *key)
{
        const char *p = strstr(ev, key);
        return p ? strtoull(p + strlen(key), NULL, 10) : 0;
}

/* Moves the body's bytes from raw to sse, undoing the chunked encoding. -EPROTO on a
 * malformed answer. */
static int http_dechunk(HttpStream *h)
{
        size_t i = 0;

        if (!h->head_done) {
                char *end = memmem(h->raw, h->raw_len, "\r\n\r\n", 4);
                if (!end)
                        return h->raw_len == sizeof(h->raw) ? -EPROTO : 0;
                if (sscanf(h->raw, "HTTP/1.1 %d", &h->status) != 1)
                        return -EPROTO;
                h->head_done = true;
                i = (size_t) (end - h->raw) + 4;
                /* An error answer is not chunked: its status is all we keep. */
                if (h->status != 200) {
                        h->done = true;
                        return 0;
                }
        }
        while (i < h->raw_len && !h->done) {
                if (h->chunk_left > 0) {
                        size_t n = h->raw_len - i;
                        if (n > h->chunk_left)
                                n = (size_t) h->chunk_left;
                        if (n > sizeof(h->sse) - h->sse_len)
                                n = sizeof(h->sse) - h->sse_len;
                        if (n == 0)
                                break; /* the events parsed so far make room */
                        memcpy(h->sse + h->sse_len, h->raw + i, n);
                        h->sse_len += n;
                        h->chunk_left -= n;
                        i += n;
                        h->chunk_crlf = h->chunk_left == 0;
                        continue;
                }
                char *eol = memmem(h->raw + i, h->raw_len - i, "\r\n", 2);
                if (!eol)
                        break;
                if (h->chunk_crlf) {
                        if (eol != h->raw + i)
                                return -EPROTO;
                        h->chunk_crlf = false;
                } else {
                        char *end;
                        h->chunk_left = strtoull(h->raw + i, &end, 16);
                        if (end != eol)
                                return -EPROTO;
                        if (h->chunk_left == 0)
                                h->done = true;
                }
                i = (size_t) (eol - h->raw) + 2;
        }
        memmove(h->raw, h->raw + i, h->raw_len - i);
        h->raw_len -= i;
        return 0;
}

/* The next event of slot s from what arrived: 1 and ev filled, or 0. */
static int http_event(Child *ch, uint32_t s, ds_event *ev)
{
        HttpStream *h = &ch->http[s];
        char *end;

        for (;;) {
                if (h->head_done && h->status != 200) {
                        *ev = (ds_event){.type = DS_EVENT_ERROR,
                                .request_id = ch->slots[s].id,
                                .error = -h->status};
                        return 1;
                }
                end = memmem(h->sse, h->sse_len, "\n\n", 2);
                if (!end)
                        return 0;
                *end = 0;
                size_t used = (size_t) (end - h->sse) + 2;
                int r = 0;
                if (strncmp(h->sse, "data: [DONE]", 12) == 0) {
                        *ev = (ds_event){.type = DS_EVENT_FINAL,
                                .request_id = ch->slots[s].id,
                                .publish_ns = h->final_ns,
                                .prompt_tokens = h->prompt_tokens,
                                .generated_tokens = h->generated_tokens};
                        r = 1;
                } else if (strstr(h->sse, "\"choices\":[]")) {
                        h->prompt_tokens = (uint32_t) json_u64(h->sse, "\"prompt_tokens\":");
                        h->generated_tokens = (uint32_t) json_u64(h->sse, "\"completion_tokens\":");
                } else if (strstr(h->sse, "\"finish_reason\":null")) {
                        *ev = (ds_event){.type = DS_EVENT_TOKEN,
                                .request_id = ch->slots[s].id,
                                .publish_ns = json_u64(h->sse, "\"dsd_publish_ns\":")};
                        r = 1;
                } else if (strstr(h->sse, "\"error\":")) {
                        *ev = (ds_event){.type = DS_EVENT_ERROR,
                                .request_id = ch->slots[s].id,
                                .error = -500};
                        r = 1;
                } else {
                        /* The finish chunk: its publish time is the final event's. */
                        h->final_ns = json_u64(h->sse, "\"dsd_publish_ns\":");
                }
                memmove(h->sse, h->sse + used, h->sse_len - used);
                h->sse_len -= used;
                if (r)
                        return 1;
        }
}

static void http_end(HttpStream *h)
{
        if (h->fd >= 0)
                close(h->fd);
        h->fd = -1;
}

/* Like ds_next(): an event of any request in flight, waiting up to timeout_ms (-1: no
 * limit). 1, 0 or a negative errno. */
static int http_next(Child *ch, int timeout_ms, ds_event *ev)
{
        struct pollfd pfd[HTTP_MAX_CONCURRENCY];
        uint32_t idx[HTTP_MAX_CONCURRENCY], n = 0;
        int r;

        for (uint32_t s = 0; s < arg_concurrency; s++) {
                if (!ch->slots[s].busy)
                        continue;
                if (http_event(ch, s, ev) > 0) {
                        if (ev->type != DS_EVENT_TOKEN)
                                http_end(&ch->http[s]);
                        return 1;
                }
                if (ch->http[s].fd >= 0) {
                        pfd[n] = (struct pollfd){.fd = ch->http[s].fd, .events = POLLIN};
                        idx[n++] = s;
                }
        }
        if (n == 0)
                return 0;
        r = poll(pfd, n, timeout_ms);
        if (r < 0)
                return errno == EINTR ? 0 : -errno;
        for (uint32_t i = 0; i < n; i++) {
                HttpStream *h = &ch->http[idx[i]];
                if (!pfd[i].revents)
                        continue;
                ssize_t k = recv(h->fd, h->raw + h->raw_len, sizeof(h->raw) - h->raw_len, 0);
                if (k < 0)
                        return -errno;
                if (k == 0 && !h->done)
                        return -ECONNRESET; /* closed before the answer's end */
                h->raw_len += (size_t) k;
                r = http_dechunk(h);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* An HTTP error as dsbench keeps it: the negated status. */
static const char *http_status_text(int32_t code)
{
        static char buf[32];

        snprintf(buf, sizeof(buf), "HTTP status %d", -code);
        return buf;
}

/* ---- before the run ---- */

/* One connection before anything is measured: without a daemon every client would fail at
 * once, and a report of zeros would read like a measurement. */
static int probe_daemon(void)
{
        ds_client *c;
        int r;

        if (arg_http) {
                r = http_connect(arg_http);
                if (r < 0) {
                        fprintf(stderr, "dsbench: cannot connect to the HTTP listener '%s': %s\n",
                                arg_http, strerror(-r));
                        return r;
                }
                close(r);
                return 0;
        }
        r = ds_connect(arg_socket, arg_socket_only ? DS_CONNECT_SOCKET_ONLY : 0, &c);
        if (r < 0) {
                const char *why = ds_connect_message();
                fprintf(stderr, "dsbench: cannot connect to dsd at '%s': %s%s%s\n", arg_socket,
                        ds_strerror(r), *why ? ": " : "", why);
                return r;
        }
        ds_close(c);
        return 0;
}

/* ---- the plain socket round trip ---- */

static int socket_rtt(double **ret, uint32_t n)
{
        char buf[256] = {};
        int sv[2];
        pid_t pid;
        double *v = calloc(n, sizeof(*v));

        if (!v || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
                return -errno;
        pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                close(sv[0]);
                while (read(sv[1], buf, sizeof(buf)) == (ssize_t) sizeof(buf))
                        if (write(sv[1], buf, sizeof(buf)) != (ssize_t) sizeof(buf))
                                break;
                _exit(0);
        }
        close(sv[1]);
        for (uint32_t i = 0; i < n; i++) {
                uint64_t t0 = mono_ns();
                if (write(sv[0], buf, sizeof(buf)) != (ssize_t) sizeof(buf) ||
                        recv(sv[0], buf, sizeof(buf), MSG_WAITALL) != (ssize_t) sizeof(buf))
                        return -EIO;
                v[i] = (double) (mono_ns() - t0) / 1e3;
        }
        close(sv[0]);
        waitpid(pid, NULL, 0);
        *ret = v;
        return 0;
}

/* ---- statistics ---- */

typedef struct Vec {
        double *v;
        size_t n, cap;
} Vec;

static void vec_push(Vec *x, double v)
{
        if (x->n == x->cap) {
                x->cap = x->cap ? x->cap * 2 : 1024;
                x->v = realloc(x->v, x->cap * sizeof(double));
                if (!x->v) {
                        fprintf(stderr, "dsbench: out of memory\n");
                        exit(EXIT_FAILURE);
                }
        }
        x->v[x->n++] = v;
}

static int cmp_double(const void *a, const void *b)
{
        double x = *(const double *) a, y = *(const double *) b;
        return (x > y) - (x < y);
}

static double pct(const Vec *x, double p)
{
        if (x->n == 0)
                return 0;
        size_t i = (size_t) ceil(p / 100.0 * (double) x->n);
        return x->v[i > 0 ? i - 1 : 0];
}

static void print_dist(FILE *f, const char *name, Vec *x, bool json, bool last)
{
        if (x->n) /* an empty one has no array: qsort must not see NULL */
                qsort(x->v, x->n, sizeof(double), cmp_double);
        if (json)
                fprintf(f,
                        "    \"%s\": {\"n\": %zu, \"p50_us\": %.1f, \"p90_us\": %.1f, "
                        "\"p99_us\": %.1f}%s\n",
                        name, x->n, pct(x, 50), pct(x, 90), pct(x, 99), last ? "" : ",");
        else
                fprintf(f, "  %-22s n=%-7zu p50 %10.1f us  p90 %10.1f us  p99 %10.1f us\n", name,
                        x->n, pct(x, 50), pct(x, 90), pct(x, 99));
}

/* ---- options ---- */

/* A decimal number in [lo, hi], digits only: no sign, no space, no overflow. */
static int parse_number(
        const char *s, const char **ret_end, uint32_t lo, uint32_t hi, uint32_t *ret)
{
        char *end;

        if (*s < '0' || *s > '9')
                return -EINVAL;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || v < lo || v > hi)
                return -EINVAL;
        *ret_end = end;
        *ret = (uint32_t) v;
        return 0;
}

static int parse_range(const char *opt, const char *s, uint32_t max, Range *ret)
{
        const char *end;
        Range r;

        int k = parse_number(s, &end, 0, max, &r.lo);
        r.hi = r.lo;
        if (k >= 0 && *end == ':')
                k = parse_number(end + 1, &end, r.lo, max, &r.hi);
        if (k < 0 || *end) {
                fprintf(stderr,
                        "dsbench: %s: '%s' is not N or MIN:MAX with 0 <= MIN <= MAX <= %" PRIu32
                        "\n",
                        opt, s, max);
                return -EINVAL;
        }
        *ret = r;
        return 0;
}

static int parse_u32(const char *opt, const char *s, uint32_t *ret, uint32_t min)
{
        const char *end;
        uint32_t v;

        if (parse_number(s, &end, min, UINT32_MAX, &v) < 0 || *end) {
                fprintf(stderr,
                        "dsbench: %s: '%s' is not an integer in [%" PRIu32 ", %" PRIu32 "]\n", opt,
                        s, min, UINT32_MAX);
                return -EINVAL;
        }
        *ret = v;
        return 0;
}

static void help(void)
{
        printf("Usage: dsbench [OPTIONS]\n"
               "\n"
               "Drives a running dsd through libdsclient and reports throughput, time to first\n"
               "token, inter-token latency, queue time, errors and delivery latency, against a\n"
               "plain Unix-socket round trip measured on the same machine.\n"
               "\n"
               "  --socket PATH          the daemon (default $DSD_SOCKET or /run/dsd/dsd.sock)\n"
               "  --clients N            client processes (default 1)\n"
               "  --concurrency M        requests in flight per client (default 1)\n"
               "  --requests R           requests per client (default 16)\n"
               "  --prompt-words N|A:B   words after 'Once upon a time' (default 16, at most\n"
               "                         1000000; with --http, as many as fit its 4096-byte\n"
               "                         request body)\n"
               "  --max-tokens N|A:B     output tokens at most (default 128)\n"
               "  --rate R               open loop: R requests/s over all clients (default:\n"
               "                         closed loop)\n"
               "  --spin                 spin with ds_next(0) instead of blocking\n"
               "  --socket-only          events on the socket, no shared memory\n"
               "  --seed S               prompt words, lengths and, with --rate, arrival gaps\n"
               "                         (default 1)\n"
               "  --rtt-rounds N         plain socket round trips to measure (default 20000)\n"
               "  --json FILE            also write the results as JSON\n"
               "  --http ADDR            the OpenAI HTTP listener instead (an absolute Unix\n"
               "                         socket path, unix:PATH or host:port): streamed\n"
               "                         /v1/completions with dsd_timing\n"
               "  --api-key KEY          its bearer token, when it wants one\n"
               "  -h, --help             this text\n");
}

static int parse_argv(int argc, char **argv)
{
        enum {
                ARG_SOCKET = 0x100,
                ARG_CLIENTS,
                ARG_CONCURRENCY,
                ARG_REQUESTS,
                ARG_PROMPT,
                ARG_MAX_TOKENS,
                ARG_RATE,
                ARG_SPIN,
                ARG_SOCKET_ONLY,
                ARG_SEED,
                ARG_JSON,
                ARG_RTT,
                ARG_HTTP,
                ARG_API_KEY,
        };
        static const struct option options[] = {{"help", no_argument, NULL, 'h'},
                {"socket", required_argument, NULL, ARG_SOCKET},
                {"clients", required_argument, NULL, ARG_CLIENTS},
                {"concurrency", required_argument, NULL, ARG_CONCURRENCY},
                {"requests", required_argument, NULL, ARG_REQUESTS},
                {"prompt-words", required_argument, NULL, ARG_PROMPT},
                {"max-tokens", required_argument, NULL, ARG_MAX_TOKENS},
                {"rate", required_argument, NULL, ARG_RATE}, {"spin", no_argument, NULL, ARG_SPIN},
                {"socket-only", no_argument, NULL, ARG_SOCKET_ONLY},
                {"seed", required_argument, NULL, ARG_SEED},
                {"rtt-rounds", required_argument, NULL, ARG_RTT},
                {"json", required_argument, NULL, ARG_JSON},
                {"http", required_argument, NULL, ARG_HTTP},
                {"api-key", required_argument, NULL, ARG_API_KEY}, {}};
        uint32_t seed;
        char *end;
        int c, r;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                r = 0;
                switch (c) {
                case 'h':
                        help();
                        exit(EXIT_SUCCESS);
                case ARG_SOCKET:
                        arg_socket = optarg;
                        break;
                case ARG_CLIENTS:
                        r = parse_u32("--clients", optarg, &arg_clients, 1);
                        break;
                case ARG_CONCURRENCY:
                        r = parse_u32("--concurrency", optarg, &arg_concurrency, 1);
                        break;
                case ARG_REQUESTS:
                        r = parse_u32("--requests", optarg, &arg_requests, 1);
                        break;
                case ARG_PROMPT:
                        r = parse_range(
                                "--prompt-words", optarg, PROMPT_WORDS_MAX, &arg_prompt_words);
                        break;
                case ARG_MAX_TOKENS:
                        r = parse_range("--max-tokens", optarg, UINT32_MAX, &arg_max_tokens);
                        break;
                case ARG_RATE:
                        arg_rate = strtod(optarg, &end);
                        if (end == optarg || *end || !(arg_rate > 0 && isfinite(arg_rate))) {
                                fprintf(stderr, "dsbench: --rate: '%s' is not a rate > 0\n",
                                        optarg);
                                r = -EINVAL;
                        }
                        break;
                case ARG_SPIN:
                        arg_spin = true;
                        break;
                case ARG_SOCKET_ONLY:
                        arg_socket_only = true;
                        break;
                case ARG_SEED:
                        r = parse_u32("--seed", optarg, &seed, 0);
                        arg_seed = seed;
                        break;
                case ARG_RTT:
                        r = parse_u32("--rtt-rounds", optarg, &arg_rtt_rounds, 1);
                        break;
                case ARG_JSON:
                        arg_json = optarg;
                        break;
                case ARG_HTTP:
                        arg_http = optarg;
                        break;
                case ARG_API_KEY:
                        arg_api_key = optarg;
                        break;
                default:
                        return -EINVAL;
                }
                if (r < 0)
                        return r;
        }
        if (arg_http && (arg_socket_only || arg_concurrency > HTTP_MAX_CONCURRENCY)) {
                fprintf(stderr,
                        "dsbench: --http takes neither --socket-only nor more than %u "
                        "in flight per client\n",
                        HTTP_MAX_CONCURRENCY);
                return -EINVAL;
        }
        if (arg_http) {
                /* the longest prompt must fit the request body, checked before anything runs */
                size_t fixed = (size_t) snprintf(
                        NULL, 0, HTTP_BODY_FORMAT, PROMPT_START, arg_max_tokens.hi);
                size_t fit = fixed < HTTP_BODY_MAX
                                     ? (HTTP_BODY_MAX - 1 - fixed) / (PROMPT_WORD_MAX + 1)
                                     : 0;
                if (arg_prompt_words.hi > fit) {
                        fprintf(stderr,
                                "dsbench: --prompt-words: at most %zu words fit the %d-byte body "
                                "of an --http request, not %u\n",
                                fit, HTTP_BODY_MAX, arg_prompt_words.hi);
                        return -EINVAL;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "dsbench: unexpected argument '%s'\n", argv[optind]);
                return -EINVAL;
        }
        /* libdsclient's own choice, resolved here so that messages can name the socket. */
        if (!arg_socket) {
                const char *env = getenv("DSD_SOCKET");
                arg_socket = env && *env ? env : "/run/dsd/dsd.sock";
        }
        return 0;
}

int main(int argc, char **argv)
{
        Vec v[_S_MAX] = {}, rtt = {};
        uint64_t prompt_tokens = 0, generated = 0, n_errors = 0, n_final = 0;
        int32_t first_error = 0;
        FILE *json = NULL;
        FILE **files;
        double *rv = NULL, secs;
        uint64_t t0, t1;
        bool failed = false;
        int r;

        if (parse_argv(argc, argv) < 0)
                return EXIT_FAILURE;
        /* Before the run, not after it: a long benchmark must not end in a path typo. */
        if (arg_json) {
                json = fopen(arg_json, "we");
                if (!json) {
                        fprintf(stderr, "dsbench: --json: cannot create '%s': %s\n", arg_json,
                                strerror(errno));
                        return EXIT_FAILURE;
                }
        }

        if (probe_daemon() < 0) {
                if (json) {
                        fclose(json);
                        unlink(arg_json);
                }
                return EXIT_FAILURE;
        }
        r = socket_rtt(&rv, arg_rtt_rounds);
        if (r < 0) {
                fprintf(stderr, "dsbench: socket round trip: %s\n", strerror(-r));
                return EXIT_FAILURE;
        }
        for (uint32_t i = 0; i < arg_rtt_rounds; i++)
                vec_push(&rtt, rv[i]);
        free(rv);

        files = calloc(arg_clients, sizeof(*files));
        if (!files)
                return EXIT_FAILURE;
        fflush(NULL);
        t0 = mono_ns();
        for (uint32_t i = 0; i < arg_clients; i++) {
                files[i] = tmpfile();
                if (!files[i]) {
                        perror("dsbench: tmpfile");
                        return EXIT_FAILURE;
                }
                pid_t pid = fork();
                if (pid < 0) {
                        perror("dsbench: fork");
                        return EXIT_FAILURE;
                }
                if (pid == 0) {
                        int rc = child_run(i, files[i]);
                        fflush(files[i]);
                        _exit(rc);
                }
        }
        for (uint32_t i = 0; i < arg_clients; i++) {
                int status;
                if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
                        failed = true;
        }
        t1 = mono_ns();
        secs = (double) (t1 - t0) / 1e9;

        for (uint32_t i = 0; i < arg_clients; i++) {
                Sample s;
                rewind(files[i]);
                while (fread(&s, sizeof(s), 1, files[i]) == 1) {
                        if (s.kind >= _S_MAX)
                                continue;
                        if (s.kind == S_TOKENS) {
                                prompt_tokens += (uint64_t) s.code;
                                generated += (uint64_t) s.v;
                                n_final++;
                        } else if (s.kind == S_ERROR) {
                                n_errors++;
                                if (!first_error)
                                        first_error = s.code;
                        } else
                                vec_push(&v[s.kind], s.v);
                }
                fclose(files[i]);
        }
        free(files);

        const char *mode = arg_rate > 0 ? "open" : "closed";
        const char *wait_mode = arg_spin ? "spin" : "sleep";
        printf("dsbench: %u clients x %u in flight, %u requests each, %s loop", arg_clients,
                arg_concurrency, arg_requests, mode);
        if (arg_rate > 0)
                printf(" at %.2f req/s", arg_rate);
        const char *transport = arg_http ? "http" : arg_socket_only ? "socket" : "ring";
        printf(", %s clients, %s\n", wait_mode, transport);
        printf("  %.2f s, %" PRIu64 " requests done, %" PRIu64 " errors%s%s%s\n", secs, n_final,
                n_errors, n_errors ? " (first: " : "",
                !n_errors  ? ""
                : arg_http ? http_status_text(first_error)
                           : ds_strerror(first_error),
                n_errors ? ")" : "");
        printf("  throughput: %.1f generated tokens/s, %.1f prompt tokens/s, %.2f requests/s\n",
                (double) generated / secs, (double) prompt_tokens / secs, (double) n_final / secs);
        print_dist(stdout, "time to first token", &v[S_TTFT], false, false);
        print_dist(stdout, "inter-token latency", &v[S_ITL], false, false);
        print_dist(stdout, "request latency", &v[S_LATENCY], false, false);
        print_dist(stdout, "queue time", &v[S_QUEUE], false, false);
        print_dist(stdout, "delivery (publish->read)", &v[S_DELIVERY], false, false);
        print_dist(stdout, "socket round trip", &rtt, false, false);

        if (json) {
                fprintf(json,
                        "{\n  \"clients\": %u, \"concurrency\": %u, \"requests_per_client\": %u,\n"
                        "  \"prompt_words\": [%u, %u], \"max_tokens\": [%u, %u],\n"
                        "  \"loop\": \"%s\", \"rate\": %.3f, \"wait\": \"%s\", \"transport\": "
                        "\"%s\",\n"
                        "  \"seconds\": %.3f, \"requests\": %" PRIu64 ", \"errors\": %" PRIu64 ",\n"
                        "  \"generated_tokens\": %" PRIu64 ", \"prompt_tokens\": %" PRIu64 ",\n"
                        "  \"generated_tokens_per_s\": %.1f, \"requests_per_s\": %.3f,\n"
                        "  \"latency\": {\n",
                        arg_clients, arg_concurrency, arg_requests, arg_prompt_words.lo,
                        arg_prompt_words.hi, arg_max_tokens.lo, arg_max_tokens.hi, mode, arg_rate,
                        wait_mode, transport, secs, n_final, n_errors, generated, prompt_tokens,
                        (double) generated / secs, (double) n_final / secs);
                print_dist(json, "ttft", &v[S_TTFT], true, false);
                print_dist(json, "itl", &v[S_ITL], true, false);
                print_dist(json, "request", &v[S_LATENCY], true, false);
                print_dist(json, "queue", &v[S_QUEUE], true, false);
                print_dist(json, "delivery", &v[S_DELIVERY], true, false);
                print_dist(json, "socket_rtt", &rtt, true, true);
                fprintf(json, "  }\n}\n");
                if (ferror(json) | fclose(json)) {
                        fprintf(stderr, "dsbench: --json: cannot write '%s'\n", arg_json);
                        failed = true;
                }
        }
        for (int i = 0; i < _S_MAX; i++)
                free(v[i].v);
        free(rtt.v);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
