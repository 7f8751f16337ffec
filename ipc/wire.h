/* SPDX-License-Identifier: MIT */
/* The wire contract between dsd and its clients: the handshake on the Unix socket, the
 * shared-memory segment (a header, two single-producer/single-consumer rings and a data
 * area) and the fixed-size records that travel through the rings or, in socket-only mode,
 * framed on the socket. docs/protocol.md explains the whole; this file is the one source
 * of truth for every size and offset, and each is pinned by a static_assert below.
 *
 * Everything is little-endian, fixed-width and explicitly padded. Both peers are the same
 * machine, so no byte swapping is ever done; a big-endian build refuses to compile.
 *
 * Directions: c2d is client → daemon, d2c is daemon → client. The daemon treats every c2d
 * byte as hostile: it copies a record first and validates the copy with the pure
 * functions at the end of this file; a violation disconnects that client. */
#pragma once

#include <assert.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the dsd wire format is little-endian"
#endif

/* The cursors and flags are shared between two processes: they must be real lock-free
 * atomics, never a lock inside one process's address space. */
static_assert(ATOMIC_INT_LOCK_FREE == 2, "shared-memory atomics must be lock-free");
static_assert(sizeof(_Atomic uint32_t) == 4, "a shared cursor is 4 bytes");

/* ---- constants ---- */

#define DS_WIRE_MAGIC     0x31445344u /* "DSD1": first 4 bytes of hello and welcome */
#define DS_WIRE_SEG_MAGIC 0x47455344u /* "DSEG": first 4 bytes of the segment */
/* The protocol version. Peers must match exactly; the daemon answers any other version
 * with status DS_WIRE_ERR_VERSION, its own version and a message (the welcome's first
 * DS_WIRE_WELCOME_STABLE bytes never change between versions, so an old or new client
 * can always read why). Any change to a layout in this file bumps it. */
#define DS_WIRE_VERSION 1u

#define DS_WIRE_CACHELINE 64u
#define DS_WIRE_SLOT_SIZE 256u /* every ring record, whatever its type */

/* Limits a well-formed record respects; the daemon may configure smaller ones. */
#define DS_WIRE_MAX_SLOTS        65536u                            /* per ring, a power of two */
#define DS_WIRE_MAX_DATA         (256u << 20)                      /* data area bytes */
#define DS_WIRE_MAX_SEGMENT      (512u << 20)                      /* whole segment bytes */
#define DS_WIRE_MAX_FRAME        (DS_WIRE_SLOT_SIZE + (16u << 20)) /* socket frame body */
#define DS_WIRE_MAX_STOP         16u                               /* stop strings per request */
#define DS_WIRE_MAX_STOP_LEN     256u                              /* bytes per stop string */
#define DS_WIRE_MAX_MESSAGES     1024u                             /* chat messages per request */
#define DS_WIRE_MAX_TOP_LOGPROBS 20u   /* top-n alternatives per token */
#define DS_WIRE_MAX_PIECE        4096u /* text bytes of one token event */
#define DS_WIRE_MODEL_NAME       128u  /* bytes, NUL-padded */
#define DS_WIRE_MESSAGE          192u  /* error text bytes, NUL-padded */

/* Sampling ranges (the daemon's sampler agrees: kernels/sample.c). */
#define DS_WIRE_MAX_TEMPERATURE 100.0f
#define DS_WIRE_MAX_REP_PENALTY 100.0f
#define DS_WIRE_MAX_PENALTY     100.0f /* |presence|, |frequency| */

/* Defaults the daemon uses for a segment unless configured otherwise. */
#define DS_WIRE_DEFAULT_SUB_SLOTS 128u
#define DS_WIRE_DEFAULT_CPL_SLOTS 1024u
#define DS_WIRE_DEFAULT_DATA      (4u << 20)

/* ---- enums (stored in fixed-width fields; 0 is never a valid value) ---- */

enum ds_wire_mode {
        DS_WIRE_MODE_RING = 1,   /* segment + eventfd passed with SCM_RIGHTS */
        DS_WIRE_MODE_SOCKET = 2, /* records framed on the socket, nothing mapped */
};

enum ds_wire_type {
        /* c2d */
        DS_WIRE_SUBMIT = 1,   /* struct ds_wire_submit */
        DS_WIRE_CANCEL = 2,   /* header only: cancel hdr.request_id */
        DS_WIRE_INFO_REQ = 3, /* header only: ask for a DS_WIRE_INFO with live counters */
        /* d2c */
        DS_WIRE_TOKEN = 16,    /* struct ds_wire_token, then its hdr.n_follow records */
        DS_WIRE_TEXT = 17,     /* struct ds_wire_text: more text of the token before it */
        DS_WIRE_LOGPROBS = 18, /* struct ds_wire_logprobs: top-n of the token before it */
        DS_WIRE_FINAL = 19,    /* struct ds_wire_final: the request's last event */
        DS_WIRE_ERROR = 20,    /* struct ds_wire_error: the request's last event */
        DS_WIRE_INFO = 21,     /* struct ds_wire_info: answer to DS_WIRE_INFO_REQ */
};

/* DS_WIRE_SUBMIT flags: exactly one prompt kind. */
enum {
        DS_WIRE_SUBMIT_TEXT = 1u << 0, /* prompt: UTF-8 text, tokenized by the daemon */
        DS_WIRE_SUBMIT_IDS = 1u << 1,  /* prompt: int32 token ids */
        DS_WIRE_SUBMIT_CHAT = 1u << 2, /* prompt: n_messages chat messages, templated */
        DS_WIRE_SUBMIT_KINDS = DS_WIRE_SUBMIT_TEXT | DS_WIRE_SUBMIT_IDS | DS_WIRE_SUBMIT_CHAT,
};

enum ds_wire_role {
        DS_WIRE_ROLE_SYSTEM = 1,
        DS_WIRE_ROLE_USER = 2,
        DS_WIRE_ROLE_ASSISTANT = 3,
        _DS_WIRE_ROLE_MAX,
};

enum ds_wire_finish {
        DS_WIRE_FINISH_LENGTH = 1, /* max_tokens or the context limit */
        DS_WIRE_FINISH_EOS = 2,
        DS_WIRE_FINISH_STOP = 3, /* a stop string; it is not part of the output */
        DS_WIRE_FINISH_CANCELLED = 4,
        _DS_WIRE_FINISH_MAX,
};

/* Error codes in DS_WIRE_ERROR records and in the welcome's status. libdsclient reports
 * code c as -(DS_ERR_WIRE_BASE + c) (see dsclient.h). */
enum ds_wire_code {
        DS_WIRE_OK = 0,
        DS_WIRE_ERR_BUSY = 1,            /* the daemon's queue is full: retry later */
        DS_WIRE_ERR_PROMPT_TOO_LONG = 2, /* prompt + max_tokens exceed the context */
        DS_WIRE_ERR_BAD_REQUEST = 3,     /* well-formed but unusable (bad id, bad UTF-8) */
        DS_WIRE_ERR_CLIENT_TOO_SLOW = 4, /* events piled up past the client's bound */
        DS_WIRE_ERR_INTERNAL = 5,        /* the daemon failed; see the message */
        DS_WIRE_ERR_VERSION = 6,         /* welcome only: protocol versions differ */
        DS_WIRE_ERR_DENIED = 7,          /* welcome only: the peer's uid/gid is not allowed */
        DS_WIRE_ERR_TOO_MANY = 8,        /* the client's in-flight request limit */
        DS_WIRE_ERR_DUPLICATE_ID = 9,    /* request id already in flight on this client */
        DS_WIRE_ERR_SHUTTING_DOWN = 10,  /* draining or stopping: no new work */
        DS_WIRE_ERR_UNSUPPORTED = 11,    /* e.g. chat without a template, mode not offered */
        DS_WIRE_ERR_DRAINING = 12,       /* drained by the operator (dsctl drain): retry later */
        DS_WIRE_ERR_NO_MODEL = 13,       /* no model is loaded (state no-model or failed) */
        _DS_WIRE_ERR_MAX,
};

/* ---- handshake (socket, framed as [u32 length][message]) ---- */

/* Client → daemon, the first frame on a new connection. */
struct ds_wire_hello {
        uint32_t magic;   /* DS_WIRE_MAGIC */
        uint16_t version; /* DS_WIRE_VERSION the client speaks */
        uint16_t mode;    /* enum ds_wire_mode wanted */
        uint32_t pid;     /* for logs only: the daemon trusts SO_PEERCRED */
        uint32_t flags;   /* 0 */
        char name[32];    /* client name for logs, NUL-padded, may be empty */
};
static_assert(sizeof(struct ds_wire_hello) == 48, "hello");
static_assert(offsetof(struct ds_wire_hello, version) == 4, "hello.version");
static_assert(offsetof(struct ds_wire_hello, mode) == 6, "hello.mode");
static_assert(offsetof(struct ds_wire_hello, pid) == 8, "hello.pid");
static_assert(offsetof(struct ds_wire_hello, flags) == 12, "hello.flags");
static_assert(offsetof(struct ds_wire_hello, name) == 16, "hello.name");

/* Where the parts of a segment lie. All offsets are from the segment start, multiples of
 * DS_WIRE_CACHELINE; slot counts are powers of two. */
struct ds_wire_layout {
        uint64_t segment_size; /* the memfd's size, a multiple of 4096 */
        uint32_t sub_ctl;      /* struct ds_wire_ring_ctl of the submission ring (c2d) */
        uint32_t cpl_ctl;      /* struct ds_wire_ring_ctl of the completion ring (d2c) */
        uint32_t sub_slots;    /* sub_n slots of DS_WIRE_SLOT_SIZE */
        uint32_t sub_n;
        uint32_t cpl_slots; /* cpl_n slots of DS_WIRE_SLOT_SIZE */
        uint32_t cpl_n;
        uint32_t data; /* the data area, data_size bytes */
        uint32_t data_size;
};
static_assert(sizeof(struct ds_wire_layout) == 40, "layout");
static_assert(offsetof(struct ds_wire_layout, sub_ctl) == 8, "layout.sub_ctl");
static_assert(offsetof(struct ds_wire_layout, cpl_ctl) == 12, "layout.cpl_ctl");
static_assert(offsetof(struct ds_wire_layout, sub_slots) == 16, "layout.sub_slots");
static_assert(offsetof(struct ds_wire_layout, sub_n) == 20, "layout.sub_n");
static_assert(offsetof(struct ds_wire_layout, cpl_slots) == 24, "layout.cpl_slots");
static_assert(offsetof(struct ds_wire_layout, cpl_n) == 28, "layout.cpl_n");
static_assert(offsetof(struct ds_wire_layout, data) == 32, "layout.data");
static_assert(offsetof(struct ds_wire_layout, data_size) == 36, "layout.data_size");

/* What the model and the daemon's limits are; fixed for the life of a connection. */
struct ds_wire_server_info {
        char model[DS_WIRE_MODEL_NAME]; /* NUL-padded; NUL-terminated when well-formed */
        uint32_t context_length;        /* positions per sequence */
        uint32_t vocab_size;
        uint64_t kv_bytes_per_token; /* all layers of one position */
        uint32_t kv_block_tokens;    /* positions per KV block */
        uint32_t max_requests;       /* in flight per client */
        uint32_t max_queue;          /* waiting requests, all clients together */
        uint32_t _pad0;
};
static_assert(sizeof(struct ds_wire_server_info) == 160, "server_info");
static_assert(offsetof(struct ds_wire_server_info, context_length) == 128, "info.ctx");
static_assert(offsetof(struct ds_wire_server_info, vocab_size) == 132, "info.vocab");
static_assert(offsetof(struct ds_wire_server_info, kv_bytes_per_token) == 136, "info.kvb");
static_assert(offsetof(struct ds_wire_server_info, kv_block_tokens) == 144, "info.kvbt");
static_assert(offsetof(struct ds_wire_server_info, max_requests) == 148, "info.maxreq");
static_assert(offsetof(struct ds_wire_server_info, max_queue) == 152, "info.maxq");

/* Daemon → client, the answer to a hello. In ring mode with status 0 the frame's first
 * byte carries SCM_RIGHTS with DS_WIRE_RING_FDS fds:
 *   [0] the sealed memfd segment (map it shared, read-write, layout.segment_size bytes);
 *   [1] the doorbell eventfd the client writes to wake the daemon;
 *   [2] the notify eventfd the daemon writes to wake a client that polls (ds_fd()).
 * Otherwise no fds. After a non-zero status the daemon closes the connection. */
#define DS_WIRE_RING_FDS 3u
struct ds_wire_welcome {
        /* The first DS_WIRE_WELCOME_STABLE bytes are the same in every protocol version. */
        uint32_t magic;                /* DS_WIRE_MAGIC */
        uint16_t version;              /* the daemon's DS_WIRE_VERSION */
        uint16_t mode;                 /* enum ds_wire_mode granted */
        uint32_t status;               /* enum ds_wire_code: 0 or why not */
        uint32_t n_fds;                /* DS_WIRE_RING_FDS in ring mode, else 0 */
        char message[DS_WIRE_MESSAGE]; /* why, when status != 0; NUL-padded */
        /* Version-specific from here on. */
        struct ds_wire_layout layout; /* ring mode only, else zero */
        struct ds_wire_server_info info;
};
#define DS_WIRE_WELCOME_STABLE 208u
static_assert(sizeof(struct ds_wire_welcome) == 408, "welcome");
static_assert(offsetof(struct ds_wire_welcome, version) == 4, "welcome.version");
static_assert(offsetof(struct ds_wire_welcome, mode) == 6, "welcome.mode");
static_assert(offsetof(struct ds_wire_welcome, status) == 8, "welcome.status");
static_assert(offsetof(struct ds_wire_welcome, n_fds) == 12, "welcome.n_fds");
static_assert(offsetof(struct ds_wire_welcome, message) == 16, "welcome.message");
static_assert(offsetof(struct ds_wire_welcome, layout) == DS_WIRE_WELCOME_STABLE, "welcome");
static_assert(offsetof(struct ds_wire_welcome, info) == 248, "welcome.info");

/* ---- the segment ---- */

/* At offset 0. Written once by the daemon before it passes the fd; the daemon never reads
 * it back (it keeps its own layout), so a client that scribbles here only hurts itself. */
struct ds_wire_seg_header {
        uint32_t magic;   /* DS_WIRE_SEG_MAGIC */
        uint16_t version; /* DS_WIRE_VERSION */
        uint16_t _pad0;
        uint32_t slot_size; /* DS_WIRE_SLOT_SIZE */
        uint32_t _pad1;
        struct ds_wire_layout layout; /* the same as the welcome's */
        uint8_t _pad2[8];
};
static_assert(sizeof(struct ds_wire_seg_header) == DS_WIRE_CACHELINE, "seg header");
static_assert(offsetof(struct ds_wire_seg_header, slot_size) == 8, "seg.slot_size");
static_assert(offsetof(struct ds_wire_seg_header, layout) == 16, "seg.layout");

/* The control block of one ring; each word has a cache line to itself so that the
 * producer's and the consumer's stores never share a line (no false sharing).
 *   head: written by the consumer (records before it are free again);
 *   tail: written by the producer (records before it are published). In the completion
 *         ring it is also the futex word the client sleeps on.
 *   consumer_waiting: the consumer sets it non-zero before sleeping on new records;
 *   producer_waiting: the producer sets it non-zero before sleeping on free slots.
 * Wakes, when the peer's flag is non-zero after the producer's publish or the consumer's
 * release (ring.h has the ordering):
 *   the daemon sleeps on its io_uring: the client writes the doorbell eventfd, after
 *     publishing submissions (submission consumer_waiting) or after consuming completions
 *     (completion producer_waiting);
 *   the client sleeps with FUTEX_WAIT (shared, never FUTEX_PRIVATE_FLAG) on the word it
 *     waits for, or polls the notify eventfd; its flag says which (DS_WIRE_WAKE_* bits):
 *     after publishing completions the daemon does FUTEX_WAKE on the completion tail for
 *     DS_WIRE_WAKE_FUTEX and writes the notify eventfd for DS_WIRE_WAKE_FD; after
 *     consuming submissions it does FUTEX_WAKE on the submission head when that ring's
 *     producer_waiting is non-zero. A flag value with other bits set is harmless: wake
 *     both ways. */
enum {
        DS_WIRE_WAKE_FUTEX = 1u << 0,
        DS_WIRE_WAKE_FD = 1u << 1,
};
struct ds_wire_ring_ctl {
        _Alignas(DS_WIRE_CACHELINE) _Atomic uint32_t head;
        uint8_t _pad0[DS_WIRE_CACHELINE - 4];
        _Atomic uint32_t tail;
        uint8_t _pad1[DS_WIRE_CACHELINE - 4];
        _Atomic uint32_t consumer_waiting;
        uint8_t _pad2[DS_WIRE_CACHELINE - 4];
        _Atomic uint32_t producer_waiting;
        uint8_t _pad3[DS_WIRE_CACHELINE - 4];
};
static_assert(sizeof(struct ds_wire_ring_ctl) == 4 * DS_WIRE_CACHELINE, "ring ctl");
static_assert(_Alignof(struct ds_wire_ring_ctl) == DS_WIRE_CACHELINE, "ring ctl align");
static_assert(offsetof(struct ds_wire_ring_ctl, head) == 0, "ctl.head");
static_assert(offsetof(struct ds_wire_ring_ctl, tail) == 64, "ctl.tail");
static_assert(offsetof(struct ds_wire_ring_ctl, consumer_waiting) == 128, "ctl.cwait");
static_assert(offsetof(struct ds_wire_ring_ctl, producer_waiting) == 192, "ctl.pwait");

/* ---- records ---- */

/* A span of the data area (ring mode) or of the bytes after the record in its frame
 * (socket mode). Valid when len <= size && off <= size - len. */
struct ds_wire_ref {
        uint32_t off;
        uint32_t len;
};
static_assert(sizeof(struct ds_wire_ref) == 8, "ref");

/* The first 16 bytes of every record. */
struct ds_wire_hdr {
        uint16_t type;       /* enum ds_wire_type */
        uint16_t flags;      /* per type; 0 where none are defined */
        uint32_t n_follow;   /* DS_WIRE_TOKEN: TEXT and LOGPROBS records that follow it,
                              * published together with it; 0 for every other type */
        uint64_t request_id; /* chosen by the client, non-zero, unique among its requests
                              * in flight */
};
static_assert(sizeof(struct ds_wire_hdr) == 16, "hdr");
static_assert(offsetof(struct ds_wire_hdr, flags) == 2, "hdr.flags");
static_assert(offsetof(struct ds_wire_hdr, n_follow) == 4, "hdr.n_follow");
static_assert(offsetof(struct ds_wire_hdr, request_id) == 8, "hdr.request_id");

/* The same fields and meanings as the backend's BkSampling. */
struct ds_wire_sampling {
        float temperature;        /* [0, 100]; 0 is greedy */
        uint32_t top_k;           /* 0 is off */
        float top_p;              /* [0, 1]; 0 and 1 are off */
        float min_p;              /* [0, 1]; 0 is off */
        float repetition_penalty; /* (0, 100]; 1 is off */
        float presence_penalty;   /* [-100, 100]; 0 is off */
        float frequency_penalty;  /* [-100, 100]; 0 is off */
        uint32_t _pad0;
        uint64_t seed;
};
static_assert(sizeof(struct ds_wire_sampling) == 40, "sampling");
static_assert(offsetof(struct ds_wire_sampling, top_k) == 4, "sampling.top_k");
static_assert(offsetof(struct ds_wire_sampling, top_p) == 8, "sampling.top_p");
static_assert(offsetof(struct ds_wire_sampling, min_p) == 12, "sampling.min_p");
static_assert(offsetof(struct ds_wire_sampling, repetition_penalty) == 16, "sampling.rep");
static_assert(offsetof(struct ds_wire_sampling, presence_penalty) == 20, "sampling.pres");
static_assert(offsetof(struct ds_wire_sampling, frequency_penalty) == 24, "sampling.freq");
static_assert(offsetof(struct ds_wire_sampling, seed) == 32, "sampling.seed");

/* c2d DS_WIRE_SUBMIT. hdr.flags holds exactly one DS_WIRE_SUBMIT_{TEXT,IDS,CHAT}.
 * prompt, by kind:
 *   TEXT: len > 0 bytes of UTF-8;
 *   IDS:  len / 4 > 0 int32 token ids (len a multiple of 4, no alignment required);
 *   CHAT: n_messages > 0 messages packed back to back, each
 *         [u32 role (enum ds_wire_role)][u32 n][n bytes of UTF-8], exactly filling len.
 * stop: n_stop strings packed back to back, each [u32 n][n bytes], 1 <= n <=
 * DS_WIRE_MAX_STOP_LEN, exactly filling len (n_stop == 0 requires len == 0).
 * In ring mode the client must not reuse the data a record references until the daemon
 * has moved the submission head past that record: the daemon copies it before. */
struct ds_wire_submit {
        struct ds_wire_hdr hdr;
        struct ds_wire_sampling sampling;
        uint32_t max_tokens;   /* 0: up to the context limit */
        uint32_t top_logprobs; /* 0 .. DS_WIRE_MAX_TOP_LOGPROBS alternatives per token */
        struct ds_wire_ref prompt;
        struct ds_wire_ref stop;
        uint32_t n_stop;     /* 0 .. DS_WIRE_MAX_STOP */
        uint32_t n_messages; /* CHAT: 1 .. DS_WIRE_MAX_MESSAGES, else 0 */
};
static_assert(sizeof(struct ds_wire_submit) == 88, "submit");
static_assert(offsetof(struct ds_wire_submit, sampling) == 16, "submit.sampling");
static_assert(offsetof(struct ds_wire_submit, max_tokens) == 56, "submit.max_tokens");
static_assert(offsetof(struct ds_wire_submit, top_logprobs) == 60, "submit.top_logprobs");
static_assert(offsetof(struct ds_wire_submit, prompt) == 64, "submit.prompt");
static_assert(offsetof(struct ds_wire_submit, stop) == 72, "submit.stop");
static_assert(offsetof(struct ds_wire_submit, n_stop) == 80, "submit.n_stop");
static_assert(offsetof(struct ds_wire_submit, n_messages) == 84, "submit.n_messages");

/* d2c DS_WIRE_TOKEN: one sampled token and the text it completes. The text of one token
 * may be empty (an incomplete UTF-8 character waits for the next token) or longer than
 * fits inline: then text_len > inline_len and DS_WIRE_TEXT records carry the rest. When
 * the request asked for top_logprobs, a DS_WIRE_LOGPROBS record comes last.
 * hdr.n_follow counts those records; the daemon publishes the token and all of them with
 * one tail store, so a consumer that sees the token sees them too.
 * token_id DS_WIRE_TOKEN_NONE: no new token, only text the end of the request released
 * (held back as a possible stop-string prefix, or an unfinished UTF-8 character as
 * U+FFFD); it comes right before the FINAL, never with a LOGPROBS record. */
#define DS_WIRE_TOKEN_INLINE 216u
#define DS_WIRE_TOKEN_NONE   (-1)
struct ds_wire_token {
        struct ds_wire_hdr hdr;
        int32_t token_id;
        float logprob;       /* of token_id; 0 unless top_logprobs was asked for */
        uint64_t publish_ns; /* CLOCK_MONOTONIC when the daemon published the record */
        uint32_t text_len;   /* the piece's bytes in this and the TEXT records, <= MAX_PIECE */
        uint16_t inline_len; /* bytes in text[] */
        uint16_t _pad0;
        char text[DS_WIRE_TOKEN_INLINE];
};
static_assert(sizeof(struct ds_wire_token) == DS_WIRE_SLOT_SIZE, "token");
static_assert(offsetof(struct ds_wire_token, token_id) == 16, "token.token_id");
static_assert(offsetof(struct ds_wire_token, logprob) == 20, "token.logprob");
static_assert(offsetof(struct ds_wire_token, publish_ns) == 24, "token.publish_ns");
static_assert(offsetof(struct ds_wire_token, text_len) == 32, "token.text_len");
static_assert(offsetof(struct ds_wire_token, inline_len) == 36, "token.inline_len");
static_assert(offsetof(struct ds_wire_token, text) == 40, "token.text");

/* d2c DS_WIRE_TEXT: the next bytes of the token's text. */
#define DS_WIRE_TEXT_INLINE 232u
struct ds_wire_text {
        struct ds_wire_hdr hdr;
        uint32_t len; /* 1 .. DS_WIRE_TEXT_INLINE */
        uint32_t _pad0;
        char text[DS_WIRE_TEXT_INLINE];
};
static_assert(sizeof(struct ds_wire_text) == DS_WIRE_SLOT_SIZE, "text");
static_assert(offsetof(struct ds_wire_text, len) == 16, "text.len");
static_assert(offsetof(struct ds_wire_text, text) == 24, "text.text");

/* d2c DS_WIRE_LOGPROBS: the top n alternatives of the token before it, best first. */
struct ds_wire_top {
        int32_t token_id;
        float logprob;
};
static_assert(sizeof(struct ds_wire_top) == 8, "top");
struct ds_wire_logprobs {
        struct ds_wire_hdr hdr;
        uint32_t n; /* 1 .. DS_WIRE_MAX_TOP_LOGPROBS */
        uint32_t _pad0;
        struct ds_wire_top top[DS_WIRE_MAX_TOP_LOGPROBS];
};
static_assert(sizeof(struct ds_wire_logprobs) == 184, "logprobs");
static_assert(offsetof(struct ds_wire_logprobs, n) == 16, "logprobs.n");
static_assert(offsetof(struct ds_wire_logprobs, top) == 24, "logprobs.top");

/* d2c DS_WIRE_FINAL: the request is over; its id may be reused. Times are CLOCK_MONOTONIC
 * microseconds measured by the daemon from the moment it read the submission. */
struct ds_wire_final {
        struct ds_wire_hdr hdr;
        uint32_t finish; /* enum ds_wire_finish */
        uint32_t prompt_tokens;
        uint32_t generated_tokens;
        uint32_t _pad0;
        uint64_t queue_us; /* submission read → first scheduled */
        uint64_t ttft_us;  /* submission read → first token published */
        uint64_t total_us; /* submission read → this record */
        uint64_t publish_ns;
};
static_assert(sizeof(struct ds_wire_final) == 64, "final");
static_assert(offsetof(struct ds_wire_final, finish) == 16, "final.finish");
static_assert(offsetof(struct ds_wire_final, prompt_tokens) == 20, "final.prompt_tokens");
static_assert(offsetof(struct ds_wire_final, generated_tokens) == 24, "final.generated");
static_assert(offsetof(struct ds_wire_final, queue_us) == 32, "final.queue_us");
static_assert(offsetof(struct ds_wire_final, ttft_us) == 40, "final.ttft_us");
static_assert(offsetof(struct ds_wire_final, total_us) == 48, "final.total_us");
static_assert(offsetof(struct ds_wire_final, publish_ns) == 56, "final.publish_ns");

/* d2c DS_WIRE_ERROR: the request failed and is over (hdr.request_id 0: the connection is
 * about to be closed). The message names the limit or the field, e.g. "prompt has 5000
 * tokens, the context holds 4096". */
struct ds_wire_error {
        struct ds_wire_hdr hdr;
        uint32_t code;                 /* enum ds_wire_code, not DS_WIRE_OK */
        uint32_t len;                  /* bytes of message, <= DS_WIRE_MESSAGE */
        char message[DS_WIRE_MESSAGE]; /* not NUL-terminated */
};
static_assert(sizeof(struct ds_wire_error) == 216, "error");
static_assert(offsetof(struct ds_wire_error, code) == 16, "error.code");
static_assert(offsetof(struct ds_wire_error, len) == 20, "error.len");
static_assert(offsetof(struct ds_wire_error, message) == 24, "error.message");

/* d2c DS_WIRE_INFO: live counters, answering the DS_WIRE_INFO_REQ with the same id. */
struct ds_wire_info {
        struct ds_wire_hdr hdr;
        uint32_t active;  /* requests running, all clients */
        uint32_t queued;  /* requests waiting, all clients */
        uint32_t clients; /* connections */
        uint32_t _pad0;
        uint64_t kv_blocks_total;
        uint64_t kv_blocks_free;
};
static_assert(sizeof(struct ds_wire_info) == 48, "info");
static_assert(offsetof(struct ds_wire_info, active) == 16, "info.active");
static_assert(offsetof(struct ds_wire_info, queued) == 20, "info.queued");
static_assert(offsetof(struct ds_wire_info, clients) == 24, "info.clients");
static_assert(offsetof(struct ds_wire_info, kv_blocks_total) == 32, "info.kv_total");
static_assert(offsetof(struct ds_wire_info, kv_blocks_free) == 40, "info.kv_free");

/* One ring slot, or one socket frame's record. */
union ds_wire_slot {
        struct ds_wire_hdr hdr;
        struct ds_wire_submit submit;
        struct ds_wire_token token;
        struct ds_wire_text text;
        struct ds_wire_logprobs logprobs;
        struct ds_wire_final final;
        struct ds_wire_error error;
        struct ds_wire_info info;
        uint8_t bytes[DS_WIRE_SLOT_SIZE];
};
static_assert(sizeof(union ds_wire_slot) == DS_WIRE_SLOT_SIZE, "slot");

/* ---- socket-only mode ----
 * Every message on the socket, in both modes, is a frame: [u32 length][length bytes].
 * The first frame each way is the hello and the welcome (length = their sizeof). After a
 * socket-mode welcome each frame holds one record of DS_WIRE_SLOT_SIZE bytes (a full
 * union ds_wire_slot); a c2d DS_WIRE_SUBMIT frame is followed, inside the same frame, by
 * the bytes its prompt and stop refs point into (offsets from the first byte after the
 * record), so length = DS_WIRE_SLOT_SIZE + data bytes <= DS_WIRE_MAX_FRAME. In ring mode
 * nothing but the hello and the welcome travels on the socket; its EOF means the peer is
 * gone. */
#define DS_WIRE_FRAME_HDR 4u

/* ---- validation: pure functions of copied bytes; 0 or a negative errno ----
 * -EPROTO       wrong magic, unknown record type or a type from the wrong direction
 * -EPROTONOSUPPORT  the peer speaks another protocol version
 * -EBADMSG      a length, offset, count or enum outside its field's range
 * -ERANGE       a sampling parameter outside its range (NaN included)
 * Ranges are in the comments of each struct above. */

/* Overflow-safe: does [off, off + len) lie within [0, size)? */
static inline bool wire_span_ok(uint64_t off, uint64_t len, uint64_t size)
{
        return len <= size && off <= size - len;
}

int wire_hello_validate(const struct ds_wire_hello *h);
/* Checks magic and version only; the rest is checked by wire_welcome_validate. */
int wire_welcome_check_version(const struct ds_wire_welcome *w);
/* A complete status-0 welcome: mode, fd count, layout (when in ring mode) and info. */
int wire_welcome_validate(const struct ds_wire_welcome *w);
/* A layout's parts are aligned, power-of-two, non-overlapping and inside segment_size,
 * which is at most DS_WIRE_MAX_SEGMENT. */
int wire_layout_validate(const struct ds_wire_layout *l);
/* Fills a layout for the given slot counts and data size (header, ctl blocks, slots,
 * data, then rounded to 4096). Returns -EINVAL if the result would be invalid. */
int wire_layout_init(
        uint32_t sub_n, uint32_t cpl_n, uint32_t data_size, struct ds_wire_layout *ret);

int wire_sampling_validate(const struct ds_wire_sampling *s);
/* A c2d record: SUBMIT (refs within data_size, counts and kinds consistent, sampling),
 * CANCEL, INFO_REQ. It checks the record only; the referenced bytes are checked by
 * wire_stops_validate / wire_chat_validate once copied. */
int wire_c2d_validate(const union ds_wire_slot *s, uint32_t data_size);
/* A d2c record on its own (a TOKEN's n_follow is checked against its text_len). */
int wire_d2c_validate(const union ds_wire_slot *s);

/* The packed stop strings / chat messages of a submission, as copied out of the data
 * area: each entry within len, counts matching, the entries exactly filling len. */
int wire_stops_validate(const uint8_t *buf, uint32_t len, uint32_t n_stop);
int wire_chat_validate(const uint8_t *buf, uint32_t len, uint32_t n_messages);
/* Iterate a validated list: *pos starts at 0; each call yields one entry and returns 1,
 * or 0 at the end. role may be NULL for stop lists. */
int wire_stops_next(
        const uint8_t *buf, uint32_t len, uint32_t *pos, const uint8_t **ret, uint32_t *ret_len);
int wire_chat_next(const uint8_t *buf, uint32_t len, uint32_t *pos, uint32_t *ret_role,
        const uint8_t **ret, uint32_t *ret_len);

/* The length field of a record frame (after the handshake): DS_WIRE_SLOT_SIZE, plus the
 * data bytes for a c2d frame, at most DS_WIRE_MAX_FRAME. The hello and welcome frames'
 * lengths are exactly sizeof(struct ds_wire_hello) and sizeof(struct ds_wire_welcome). */
int wire_frame_len_validate(uint32_t len, bool c2d);
