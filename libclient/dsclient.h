/* SPDX-License-Identifier: MIT */
/* libdsclient: the C API of the dsd inference daemon.
 *
 * A client connects to the daemon's Unix socket, submits requests (text, token ids or chat
 * messages, with sampling parameters) and reads a stream of events: tokens as they are
 * generated, then one final or error event per request. Token delivery goes through a
 * shared-memory ring when the daemon grants one, else through the socket.
 *
 * Conventions of every call:
 *   - Errors are values: 0 (or a count) on success, a negative errno (-EINVAL, -ENOMEM,
 *     -ECONNRESET, ...) or a negative DS_ERR_* code on failure; ds_strerror() names both.
 *   - A NULL or out-of-range argument returns -EINVAL; nothing is ever logged or printed.
 *   - Output parameters are named ret and written only on success.
 *   - A ds_client may be used from several threads at once: each call takes the handle's
 *     own lock (a thread blocked in ds_next() releases it while it sleeps). Distinct
 *     handles share nothing. Signals interrupting a wait are retried internally.
 *
 * Build with `pkg-config --cflags --libs dsclient`. */
#ifndef DSCLIENT_H
#define DSCLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DS_PUBLIC __attribute__((visibility("default")))

/* A connection to the daemon. Opaque; created by ds_connect(), freed by ds_close(). */
typedef struct ds_client ds_client;

/* ---- error codes (returned negated), above every errno value ---- */
#define DS_ERR_WIRE_BASE 8192
enum {
        DS_ERR_BUSY = DS_ERR_WIRE_BASE + 1,            /* the daemon's queue is full */
        DS_ERR_PROMPT_TOO_LONG = DS_ERR_WIRE_BASE + 2, /* prompt + max tokens > context */
        DS_ERR_BAD_REQUEST = DS_ERR_WIRE_BASE + 3,     /* e.g. a token id >= vocab size */
        DS_ERR_CLIENT_TOO_SLOW = DS_ERR_WIRE_BASE + 4, /* events not read in time */
        DS_ERR_INTERNAL = DS_ERR_WIRE_BASE + 5,        /* the daemon failed */
        DS_ERR_VERSION = DS_ERR_WIRE_BASE + 6,         /* protocol versions differ */
        DS_ERR_DENIED = DS_ERR_WIRE_BASE + 7,          /* uid/gid not allowed to connect */
        DS_ERR_TOO_MANY = DS_ERR_WIRE_BASE + 8,        /* too many requests in flight */
        DS_ERR_DUPLICATE_ID = DS_ERR_WIRE_BASE + 9,    /* request id already in flight */
        DS_ERR_SHUTTING_DOWN = DS_ERR_WIRE_BASE + 10,  /* the daemon takes no new work */
        DS_ERR_UNSUPPORTED = DS_ERR_WIRE_BASE + 11,    /* e.g. chat without a template */
        DS_ERR_DRAINING = DS_ERR_WIRE_BASE + 12,       /* drained (dsctl drain): retry later */
        DS_ERR_NO_MODEL = DS_ERR_WIRE_BASE + 13,       /* the daemon has no model loaded */
};

/* ---- connection ---- */

enum {
        DS_CONNECT_AUTO = 0,             /* shared-memory ring, else the socket alone */
        DS_CONNECT_SOCKET_ONLY = 1u << 0 /* never map memory: events come on the socket */
};

/* Connects to the daemon at path (NULL: $DSD_SOCKET if set, else /run/dsd/dsd.sock) and
 * completes the handshake, waiting up to 30 s for the daemon's answer.
 * Returns 0 and a new handle in *ret, which the caller owns and frees with ds_close().
 * Errors: -EINVAL (flags, path too long), -ENOENT/-ECONNREFUSED (no daemon), -ETIMEDOUT,
 * -EPROTO (not a dsd socket), -DS_ERR_VERSION (the daemon speaks another protocol
 * version), -DS_ERR_DENIED, -DS_ERR_SHUTTING_DOWN; ds_connect_message() then gives the
 * daemon's own words, naming the versions or the limit. */
DS_PUBLIC int ds_connect(const char *path, uint32_t flags, ds_client **ret);

/* The daemon's message from this thread's last failed ds_connect() ("" if there was
 * none). The string is thread-local and valid until this thread's next ds_connect(). */
DS_PUBLIC const char *ds_connect_message(void);

/* Closes the connection (the daemon cancels every request still in flight), unmaps the
 * ring and frees the handle. Accepts NULL. No other thread may use c during or after the
 * call. Always returns NULL, so that callers can write c = ds_close(c). */
DS_PUBLIC ds_client *ds_close(ds_client *c);

/* ---- requests ---- */

enum {
        DS_PROMPT_TEXT = 1, /* text, tokenized by the daemon */
        DS_PROMPT_IDS = 2,  /* token ids, fed as they are */
        DS_PROMPT_CHAT = 3, /* messages, rendered with the model's chat template */
};

enum {
        DS_ROLE_SYSTEM = 1,
        DS_ROLE_USER = 2,
        DS_ROLE_ASSISTANT = 3,
};

typedef struct ds_message {
        uint32_t role;       /* DS_ROLE_* */
        uint32_t _reserved;  /* 0 */
        const char *content; /* UTF-8, NUL-terminated */
} ds_message;

/* The ranges are checked by ds_submit() (-EINVAL outside them; NaN is outside). */
typedef struct ds_sampling {
        float temperature;        /* [0, 100]; 0 is greedy */
        uint32_t top_k;           /* 0 is off */
        float top_p;              /* [0, 1]; 0 and 1 are off */
        float min_p;              /* [0, 1]; 0 is off */
        float repetition_penalty; /* (0, 100]; 1 is off */
        float presence_penalty;   /* [-100, 100]; 0 is off */
        float frequency_penalty;  /* [-100, 100]; 0 is off */
        uint32_t _reserved;       /* 0 */
        uint64_t seed;            /* the same seed and request give the same tokens */
} ds_sampling;

#define DS_MAX_STOP         16   /* stop strings per request */
#define DS_MAX_STOP_LEN     256  /* bytes per stop string */
#define DS_MAX_MESSAGES     1024 /* chat messages per request */
#define DS_MAX_TOP_LOGPROBS 20
#define DS_MAX_PIECE        4096 /* text bytes of one token event */
#define DS_MAX_MESSAGE      192  /* bytes of an error message */

typedef struct ds_request {
        uint32_t kind; /* DS_PROMPT_* */
        uint32_t _reserved0;
        /* DS_PROMPT_TEXT: text_len bytes of UTF-8 (need not be NUL-terminated). */
        const char *text;
        size_t text_len;
        /* DS_PROMPT_IDS: n_ids token ids. */
        const int32_t *ids;
        size_t n_ids;
        /* DS_PROMPT_CHAT: n_messages messages in order. */
        const ds_message *messages;
        size_t n_messages;
        ds_sampling sampling;
        /* Generation stops before any of these strings appears in the output. */
        const char *const *stop; /* n_stop NUL-terminated strings, 1..DS_MAX_STOP_LEN bytes */
        size_t n_stop;           /* 0..DS_MAX_STOP */
        uint32_t max_tokens;     /* 0: up to the context limit */
        uint32_t top_logprobs;   /* 0..DS_MAX_TOP_LOGPROBS alternatives with each token */
} ds_request;

/* Fills *req with an empty text prompt and neutral sampling: temperature 1, top_k 0,
 * top_p 1, min_p 0, repetition penalty 1, other penalties 0, seed 0, no stop strings,
 * max_tokens 0, no logprobs. Set kind and the prompt fields, then change what you need. */
DS_PUBLIC void ds_request_init(ds_request *req);

/* Sends a request. The daemon copies everything req points to before this returns or
 * soon after, in ring mode, from the client's own segment, so the caller may reuse or free
 * req and its buffers as soon as ds_submit() returns.
 * Returns 0 and the request's id in *ret_id (non-zero, unique within c): its events carry
 * it. Blocks while the submission ring or data area is full (the daemon drains them
 * without waiting for generation).
 * Errors: -EINVAL (bad argument or parameter), -EMSGSIZE (the prompt and stop strings do
 * not fit the segment's data area or a socket frame), -ECONNRESET (the daemon is gone),
 * -EPROTO. Errors about the request itself (-DS_ERR_BUSY, -DS_ERR_PROMPT_TOO_LONG, ...)
 * come later as its DS_EVENT_ERROR. */
DS_PUBLIC int ds_submit(ds_client *c, const ds_request *req, uint64_t *ret_id);

/* Asks the daemon to stop request id. Returns 0 once the cancel is sent; the request
 * still ends with one DS_EVENT_FINAL (DS_FINISH_CANCELLED, or its real reason if it ended
 * first). Cancelling an id that is not in flight is not an error and has no effect.
 * Errors: -EINVAL (id 0), -ECONNRESET, -EPROTO. */
DS_PUBLIC int ds_cancel(ds_client *c, uint64_t id);

/* ---- events ---- */

enum {
        DS_EVENT_TOKEN = 1, /* one generated token and its text */
        DS_EVENT_FINAL = 2, /* the request ended normally; the last event of its id */
        DS_EVENT_ERROR = 3, /* the request failed; the last event of its id */
};

enum {
        DS_FINISH_LENGTH = 1, /* max_tokens or the context limit */
        DS_FINISH_EOS = 2,
        DS_FINISH_STOP = 3, /* a stop string; it is not in the text */
        DS_FINISH_CANCELLED = 4,
};

#define DS_TOKEN_NONE (-1)

typedef struct ds_logprob {
        int32_t token_id;
        float logprob;
} ds_logprob;

/* One event, copied into the caller's struct: nothing in it points into the library, so
 * it stays valid after further calls. The fields of other types are zero. */
typedef struct ds_event {
        uint32_t type; /* DS_EVENT_* */
        uint32_t _reserved0;
        uint64_t request_id; /* 0 only for an ERROR about the whole connection */
        uint64_t publish_ns; /* CLOCK_MONOTONIC when the daemon published it (TOKEN, FINAL) */

        /* DS_EVENT_TOKEN. The text of one token may be empty (a UTF-8 character
         * continues in the next token); concatenating the texts of a request's tokens
         * gives its output. token_id is DS_TOKEN_NONE for text that only the end of the
         * request released (held back as a possible stop-string prefix): it comes right
         * before the request's DS_EVENT_FINAL. */
        int32_t token_id;
        float logprob; /* of token_id, when top_logprobs was asked for; else 0 */
        uint32_t text_len;
        uint32_t n_top;              /* entries of top[], best first */
        char text[DS_MAX_PIECE + 1]; /* NUL-terminated; may contain other NULs */
        ds_logprob top[DS_MAX_TOP_LOGPROBS];

        /* DS_EVENT_FINAL */
        uint32_t finish; /* DS_FINISH_* */
        uint32_t prompt_tokens;
        uint32_t generated_tokens;
        uint32_t _reserved1;
        uint64_t queue_us; /* read by the daemon → first scheduled */
        uint64_t ttft_us;  /* read by the daemon → first token */
        uint64_t total_us; /* read by the daemon → final */

        /* DS_EVENT_ERROR */
        int32_t error;                    /* negative DS_ERR_* code */
        char message[DS_MAX_MESSAGE + 1]; /* the daemon's words, NUL-terminated */
} ds_event;

/* Takes the next event of any request of c into *ret.
 * timeout_ms: -1 waits without limit, 0 only looks, > 0 waits at most that long.
 * Returns 1 with an event, 0 when none came in time, or a negative code: -ECONNRESET once
 * the daemon has closed the connection or died (noticed within 100 ms even while
 * blocked; events it published before are still delivered first), -EPROTO if it broke
 * the protocol; after either, only ds_close() is useful.
 * Several threads may call it at once; each event goes to exactly one of them. */
DS_PUBLIC int ds_next(ds_client *c, int timeout_ms, ds_event *ret);

/* A file descriptor for poll()/epoll()/select(), owned by c (do not close or read it).
 * It becomes readable when ds_next() may have an event or an error to report. It is
 * armed by a ds_next() call that returned 0 (with any timeout): the usual loop is
 *     poll until readable; then call ds_next(c, 0, &ev) until it returns 0 (or < 0).
 * Readable does not promise an event (ds_next() may still return 0). Returns the fd. */
DS_PUBLIC int ds_fd(ds_client *c);

/* ---- the daemon ---- */

enum {
        DS_MODE_RING = 1,   /* events come through shared memory */
        DS_MODE_SOCKET = 2, /* events come on the socket */
};

typedef struct ds_info {
        char model[128];         /* the model's name, NUL-terminated */
        uint32_t context_length; /* positions per sequence */
        uint32_t vocab_size;
        uint64_t kv_bytes_per_token; /* KV cache bytes per position, all layers */
        uint32_t kv_block_tokens;    /* positions per KV block */
        uint32_t max_requests;       /* in flight per client */
        uint32_t max_queue;          /* waiting requests, all clients */
        uint32_t mode;               /* DS_MODE_* of this connection */
        /* Live counters, read when the call was made. */
        uint32_t active;  /* requests running */
        uint32_t queued;  /* requests waiting */
        uint32_t clients; /* connections */
        uint32_t _reserved;
        uint64_t kv_blocks_total;
        uint64_t kv_blocks_free;
} ds_info;

/* Asks the daemon for its model, limits and live counters, waiting up to 5 s for the
 * answer (events of requests that arrive meanwhile are kept for ds_next()).
 * Returns 0 and fills *ret. Errors: -ETIMEDOUT, -ECONNRESET, -EPROTO, -ENOBUFS (more
 * than 16384 event records arrived while waiting). */
DS_PUBLIC int ds_server_info(ds_client *c, ds_info *ret);

/* A static string for any code these calls return (negative errno or -DS_ERR_*), also
 * for a DS_EVENT_ERROR's error. Never NULL. */
DS_PUBLIC const char *ds_strerror(int code);

#ifdef __cplusplus
}
#endif

#endif
