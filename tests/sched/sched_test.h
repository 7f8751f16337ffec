/* SPDX-License-Identifier: MIT */
/* Helpers for the scheduler tests: a sink that collects each request's events, reference
 * runs through engine_generate(), and prompts. */
#pragma once

#include <string.h>

#include "engine.h"
#include "scheduler.h"
#include "test_util.h"

#define MAX_REQS  64
#define OUT_BYTES 8192

typedef struct Output {
        char text[OUT_BYTES];
        size_t len;
        uint32_t tokens;
        bool final, error;
        FinishReason finish;
        SchedUsage usage;
        uint64_t first_token_step; /* Sink.step when the first TOKEN came; 0: none yet */
} Output;

typedef struct Sink {
        Output out[MAX_REQS]; /* by request id */
        uint64_t step;        /* set by the test before each sched_step() */
        uint32_t n_final;
        uint32_t n_events;
        SchedEvent last; /* the last event, for checks on logprobs */
} Sink;

static inline void output_add(Output *o, const char *text, size_t len)
{
        CHECK(o->len + len < sizeof(o->text), "output too long");
        memcpy(o->text + o->len, text, len);
        o->len += len;
        o->text[o->len] = 0;
}

/* Checks what every event must satisfy and files it under its request. */
static inline void sink_event(Sink *k, const SchedEvent *ev)
{
        CHECK(ev->request_id < MAX_REQS, "unknown request id %llu",
                (unsigned long long) ev->request_id);
        Output *o = &k->out[ev->request_id];
        CHECK(!o->final && !o->error, "event after the last one for request %llu",
                (unsigned long long) ev->request_id);
        CHECK(ev->text_len <= sizeof(ev->text), "text_len %u", ev->text_len);
        k->n_events++;
        k->last = *ev;
        switch (ev->type) {
        case SCHED_EV_TOKEN:
                output_add(o, ev->text, ev->text_len);
                o->tokens++;
                if (!o->first_token_step)
                        o->first_token_step = k->step;
                break;
        case SCHED_EV_FINAL:
                output_add(o, ev->text, ev->text_len);
                o->final = true;
                o->finish = ev->finish;
                o->usage = ev->usage;
                CHECK(ev->usage.generated_tokens == o->tokens,
                        "request %llu: usage says %u tokens, %u TOKEN events",
                        (unsigned long long) ev->request_id, ev->usage.generated_tokens, o->tokens);
                k->n_final++;
                break;
        case SCHED_EV_ERROR:
                o->error = true;
                fprintf(stderr, "request %llu failed: %.*s\n", (unsigned long long) ev->request_id,
                        (int) ev->text_len, ev->text);
                k->n_final++;
                break;
        default:
                CHECK(false, "event type %d", ev->type);
        }
}

static inline void sink_emit(void *userdata, const SchedEvent *ev)
{
        sink_event(userdata, ev);
}

static inline void collect_text(void *userdata, const char *text, size_t len)
{
        output_add(userdata, text, len);
}

/* A request for text, tokenized as engine_generate() does it. */
static inline SchedRequest *make_request(Engine *e, uint64_t id, uint32_t client, const char *text,
        uint32_t max_tokens, const char *stop)
{
        SchedRequest *r = NULL;
        DsError err = {};
        size_t n = 0;

        CHECK(sched_request_new(&r) == 0, "out of memory");
        CHECK(engine_encode_prompt(e, text, false, &r->prompt, &n, &err) == 0, "%s", err.msg);
        r->id = id;
        r->client = client;
        r->n_prompt = (uint32_t) n;
        r->max_tokens = max_tokens;
        r->enqueue_usec = now_usec();
        if (stop) {
                r->stops = calloc(1, sizeof(char *));
                CHECK(r->stops, "out of memory");
                r->stops[0] = strdup(stop);
                CHECK(r->stops[0], "out of memory");
                r->n_stops = 1;
        }
        CHECK(sched_request_check(e, r, &err) == 0, "%s", err.msg);
        return r;
}

/* The reference: text alone through engine_generate(). */
static inline void reference(
        Engine *e, const char *text, uint32_t max_tokens, const char *stop, Output *ret)
{
        DsError err = {};
        GenResult res = {};
        const char *stops[] = {stop};
        GenParams gp = {
                .max_tokens = max_tokens,
                .sampling = {.temperature = 0, .top_p = 1, .repetition_penalty = 1},
                .stops = stops,
                .n_stops = stop ? 1 : 0,
        };

        memset(ret, 0, sizeof(*ret));
        CHECK(engine_generate(e, text, &gp, collect_text, ret, &res, &err) == 0, "%s", err.msg);
        ret->tokens = res.generated_tokens;
        ret->finish = res.finish;
        ret->final = true;
}

static inline void check_same(const Output *got, const Output *want, const char *what)
{
        CHECK(got->final && !got->error, "%s: no final event", what);
        CHECK(got->len == want->len && !memcmp(got->text, want->text, want->len),
                "%s: text differs from engine_generate's\n  want %zu bytes: %s\n  got  %zu "
                "bytes: %s",
                what, want->len, want->text, got->len, got->text);
        CHECK(got->tokens == want->tokens && got->finish == want->finish,
                "%s: %u tokens finish %s, engine_generate: %u tokens finish %s", what, got->tokens,
                finish_reason_name(got->finish), want->tokens, finish_reason_name(want->finish));
}

/* 32 different story openings for stories260K (and any other model). */
static const char *const story_prompts[] = {
        "Once upon a time",
        "Lily and Tom were playing",
        "",
        "The little dog",
        "One day, a girl named Sue",
        "Tim had a big red ball",
        "The sun was shining and",
        "Mom said",
        "There was a cat who liked to",
        "Ben went to the park",
        "A bird sat on a tree",
        "The boy was sad because",
        "Anna found a shiny stone",
        "It was a rainy day",
        "The old man had a boat",
        "Sara and her friend",
        "In the forest there lived",
        "The toy car was fast",
        "Max wanted to fly",
        "Every morning, the farmer",
        "The princess looked at the moon",
        "Jack climbed up the hill",
        "A big bear came",
        "The kids were happy when",
        "Lucy liked to draw",
        "At school, the teacher",
        "The fish swam in the pond",
        "Dad made a cake",
        "Once there was a tiny frog",
        "The wind blew hard and",
        "Sam lost his hat",
        "A little girl named Mia",
};
