/* SPDX-License-Identifier: MIT */
/* The continuous-batching scheduler (DESIGN.md §4 step 4). It owns every request from
 * the moment the engine thread takes it from the inbox until its last event: each step it
 * decodes one token for every running sequence, prefills waiting prompts in chunks within
 * a token budget, takes paged KV blocks from the Engine's KvPool as sequences grow,
 * preempts by recomputation when they run out, and admits new requests round-robin over
 * clients. Output goes through incremental detokenization and the stop-string holdback,
 * exactly as engine_generate() does it, so a greedy request's text does not depend on
 * what else runs beside it.
 *
 * Only the engine thread calls sched_*() (engine_loop.h hands requests over from the I/O
 * thread); nothing here locks. The request and event types below are shared with the I/O
 * thread. (The file is not sched.h: daemon/ is on the include path, and the C library's
 * <sched.h>, which <pthread.h> includes, must stay reachable.) */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "engine.h"
#include "error.h"
#include "tokenizer.h"

#define SCHED_TOP_LOGPROBS_MAX 20u  /* most alternatives a TOKEN event carries */
#define SCHED_STOPS_MAX        8u   /* stop strings per request */
#define SCHED_STOP_LEN_MAX     256u /* bytes of one stop string, not counting the NUL */
/* The most text one event carries: a token's bytes plus what the holdback kept back. */
#define SCHED_TEXT_MAX (TOK_STREAM_OUT_MAX + SCHED_STOP_LEN_MAX)

/* Configured bounds (DESIGN.md §5 "Bounded everything"). */
typedef struct SchedLimits {
        uint32_t max_seqs;    /* sequences admitted at once (running, prefilling or preempted);
                               * also the most sequences in one step. 1.. */
        uint32_t step_tokens; /* token budget of one step: decode tokens plus prefill chunks;
                               * at least max_seqs, so every running sequence decodes */
        uint32_t max_queued;  /* requests waiting for admission; one more gets -EBUSY */
} SchedLimits;

/* Fills zero fields of l with the defaults (32 sequences, 512 tokens, 256 queued) and
 * checks the rest: 0, or -EINVAL with a message naming the field. */
int sched_limits_check(SchedLimits *l, DsError *err);

/* A request as the I/O thread hands it over: tokenized, templated, validated. Allocate it
 * with sched_request_new(); the pointers it holds are owned by it and freed with it. */
typedef struct SchedRequest {
        uint64_t id;           /* daemon-wide request id, unique while the request lives */
        uint32_t client;       /* client/session key: the unit of fairness, pause and
                                * cancel_client; never reused during the daemon's life */
        int32_t *prompt;       /* (n_prompt) token ids, BOS and chat template applied;
                                * malloc'd, owned */
        uint32_t n_prompt;     /* 1.. */
        uint32_t max_tokens;   /* generated tokens at most; the context limit may stop
                                * earlier (finish length). 0 finishes at once. */
        BkSampling sampling;   /* seed included: results depend only on the request */
        char **stops;          /* (n_stops) NUL-terminated stop strings, each 1..
                                * SCHED_STOP_LEN_MAX bytes; malloc'd, owned */
        uint32_t n_stops;      /* 0..SCHED_STOPS_MAX */
        uint32_t top_logprobs; /* 0..SCHED_TOP_LOGPROBS_MAX alternatives per TOKEN event;
                                * 0 also skips the sampled token's own logprob */
        uint64_t enqueue_usec; /* CLOCK_MONOTONIC µs when the I/O thread received it;
                                * queue time is measured from here */
        void *userdata;        /* opaque, copied into every event of this request */
} SchedRequest;

int sched_request_new(SchedRequest **ret);
/* Accepts NULL; frees the prompt and stop strings too. */
SchedRequest *sched_request_free(SchedRequest *r);
DEFINE_TRIVIAL_CLEANUP_FUNC(SchedRequest *, sched_request_free);

/* Checks r against the limits that do not change while the engine runs: sizes and
 * parameters, and the context limit (prompt plus one generated token must fit). Safe to
 * call from any thread. 0, -EINVAL, or -DS_ERR_CONTEXT_FULL with a message naming the
 * prompt's length and the limit. */
int sched_request_check(const Engine *e, const SchedRequest *r, DsError *err);

typedef enum SchedEventType {
        SCHED_EV_TOKEN, /* one generated token and the text it made final */
        SCHED_EV_FINAL, /* the request ended; its last event */
        SCHED_EV_ERROR, /* the request failed; its last event, no FINAL follows */
        _SCHED_EV_MAX,
        _SCHED_EV_INVALID = -EINVAL,
} SchedEventType;

typedef struct SchedLogprob {
        int32_t id;
        float logprob; /* natural log of the softmax of the raw logits (before penalties and
                        * filters), over the sampleable vocabulary */
} SchedLogprob;

typedef struct SchedUsage {
        uint32_t prompt_tokens;
        uint32_t generated_tokens;
        uint32_t preemptions; /* times this request was preempted and recomputed */
        uint64_t queue_usec;  /* enqueue to first scheduled prefill chunk */
        uint64_t ttft_usec;   /* enqueue to the first generated token; 0 when none */
        uint64_t total_usec;  /* enqueue to this FINAL */
} SchedUsage;

/* One event for the I/O thread. Fields not named for a type are zero. */
typedef struct SchedEvent {
        SchedEventType type;
        uint32_t client; /* the request's client key */
        uint64_t request_id;
        void *userdata;      /* the request's userdata */
        uint64_t publish_ns; /* CLOCK_MONOTONIC ns when the engine thread published the
                              * event to the outbox, for delivery-latency figures */
        /* TOKEN: the generated id. */
        int32_t token;
        /* TOKEN and FINAL: output text made final by this event, whole UTF-8 characters
         * never part of a stop string (FINAL: what the end released: held-back bytes, a
         * character that never completed as U+FFFD). ERROR: the message. Not
         * NUL-terminated. The concatenated TOKEN and FINAL texts are the request's
         * output, byte for byte what engine_generate() emits. */
        uint32_t text_len;
        char text[SCHED_TEXT_MAX];
        /* TOKEN with top_logprobs > 0: the sampled token's logprob and the n_top best
         * alternatives, best first (lowest id first on a tie). */
        SchedLogprob sampled;
        uint32_t n_top;
        SchedLogprob top[SCHED_TOP_LOGPROBS_MAX];
        /* FINAL */
        FinishReason finish;
        SchedUsage usage;
        /* ERROR: a negative errno or DS_ERR_* code; text holds the message. */
        int error;
} SchedEvent;

/* Receives each event as it is made; the scheduler's copy is reused after the call. The
 * engine loop guarantees room for sched_max_events() events before every sched_step(). */
typedef void (*SchedEmit)(void *userdata, const SchedEvent *ev);

typedef struct SchedStats {
        uint32_t running;   /* admitted sequences holding or building KV (paused included) */
        uint32_t preempted; /* admitted sequences waiting to be recomputed */
        uint32_t queued;    /* requests never admitted yet */
        uint32_t paused_clients;
        uint32_t kv_blocks_total;
        uint32_t kv_blocks_free;
        uint64_t steps;         /* steps that ran the backend */
        uint64_t chained_steps; /* of them, submitted while the step before was in flight */
        uint64_t prompt_tokens; /* prefill tokens computed, recomputation included */
        uint64_t generated_tokens;
        uint64_t preemptions;
        uint64_t finished; /* FINAL events, cancelled included */
        uint64_t cancelled;
        uint64_t failed; /* ERROR events */
} SchedStats;

typedef struct Sched Sched;

/* The scheduler serving e, which it uses alone from now on (the KvPool must be full). lim
 * must have passed sched_limits_check(). */
int sched_new(Engine *e, const SchedLimits *lim, SchedEmit emit, void *userdata, Sched **ret,
        DsError *err);
/* Accepts NULL. Requests still inside are freed without events; their blocks go back. */
Sched *sched_free(Sched *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(Sched *, sched_free);

/* Called by sched_step() once the events of the step it collected are emitted, before it
 * submits the next, which the backend may run inside submit: where the owner makes them
 * visible (the engine loop wakes the I/O thread). NULL: nothing. */
void sched_set_flush(Sched *s, void (*flush)(void *userdata));

/* Chains steps (see sched_step) even on a backend that runs them inside submit, where it
 * only delays each step's events by the next step: for tests of the chaining on the CPU. */
void sched_set_chaining(Sched *s, bool on);

/* Events one sched_step() or sched_cancel_all() may emit at most. */
uint32_t sched_max_events(const Sched *s);

/* Takes ownership of r (checked with sched_request_check()) and queues it behind its
 * client's earlier requests. Returns 0, or -ENOMEM after emitting an ERROR event for it
 * (r is freed either way). Allocates the request's per-sequence arrays now, so the
 * steps that serve it do not. */
int sched_add(Sched *s, SchedRequest *r);

/* Marks a request, or every request of a client, cancelled: the next sched_step() frees
 * their blocks and emits a FINAL with finish cancelled. Unknown ids are ignored (the
 * request may have finished already). */
void sched_cancel(Sched *s, uint64_t request_id);
void sched_cancel_client(Sched *s, uint32_t client);
/* A paused client's sequences keep their KV blocks but take no part in steps and its
 * queued requests are not admitted, until it is resumed; a step already in flight (see
 * sched_step) still delivers its token. Pausing an unknown client
 * records the pause for its future requests; resume forgets it. Returns 0 or -ENOMEM. */
int sched_pause_client(Sched *s, uint32_t client);
void sched_resume_client(Sched *s, uint32_t client);

/* Cancels everything now (emitting cancelled FINALs), for a stop without drain. */
void sched_cancel_all(Sched *s);

/* Runs one step: collects the step in flight and emits its events, then admits, builds
 * the next batch and submits it to the backend, where it stays in flight until the next
 * call. When the next batch can be chained (see scheduler.c; on a backend that overlaps,
 * BackendOps.overlaps, or after sched_set_chaining) it is submitted before the collect;
 * else the flush callback runs between the collect's events and the submit. Returns the
 * number of sequences submitted, else collected (0 when nothing could run: all idle or
 * paused), or a negative code when the backend failed, after emitting an ERROR event for
 * every sequence of that batch. */
int sched_step(Sched *s, DsError *err);

/* True when no request is queued, admitted or pending cancellation. */
bool sched_idle(const Sched *s);
/* True when a step would run the backend or emit events (not everything paused). */
bool sched_has_work(const Sched *s);

void sched_stats(const Sched *s, SchedStats *ret);
