/* SPDX-License-Identifier: MIT */
/* The scheduler's controls on the synthetic model, driven step by step:
 *   - fairness: a client that queued 20 requests first does not hold back a second
 *     client's one request past the first steps;
 *   - cancel and cancel_client: cancelled FINALs, every KV block back in the pool;
 *   - pause and resume: a paused client's sequence does not advance while others do;
 *   - logprobs: the sampled token's logprob and the top alternatives, sorted;
 *   - cancel and pause while a chained step is in flight. */
#include <math.h>

#include "sched_test.h"

static Sink sink;

static Sched *new_sched(Engine *e, uint32_t max_seqs, uint32_t step_tokens)
{
        SchedLimits lim = {.max_seqs = max_seqs, .step_tokens = step_tokens, .max_queued = 64};
        DsError err = {};
        Sched *s = NULL;

        memset(&sink, 0, sizeof(sink));
        CHECK(sched_limits_check(&lim, &err) == 0, "%s", err.msg);
        CHECK(sched_new(e, &lim, sink_emit, &sink, &s, &err) == 0, "%s", err.msg);
        return s;
}

static int step(Sched *s)
{
        DsError err = {};
        sink.step++;
        int n = sched_step(s, &err);
        CHECK(n >= 0, "step %llu: %s", (unsigned long long) sink.step, err.msg);
        return n;
}

static void test_fairness(Engine *e)
{
        _cleanup_(sched_freep) Sched *s = new_sched(e, 4, 64);

        /* Client 1 queues 20 long requests before client 2 queues one. */
        for (uint64_t id = 0; id < 20; id++)
                CHECK(sched_add(s, make_request(e, id, 1, "The quick brown fox", 64, NULL)) == 0,
                        "add");
        CHECK(sched_add(s, make_request(e, 20, 2, "A lazy dog", 64, NULL)) == 0, "add");
        for (int i = 0; i < 3; i++)
                step(s);
        CHECK(sink.out[20].first_token_step && sink.out[20].first_token_step <= 2,
                "client 2's request got its first token at step %llu",
                (unsigned long long) sink.out[20].first_token_step);
        /* First come, first served would have run requests 0..3 for 64 tokens first. */
        uint32_t started = 0;
        for (int id = 0; id < 20; id++)
                started += sink.out[id].first_token_step != 0;
        CHECK(started == 3, "%u of client 1's requests started beside client 2's", started);
        while (!sched_idle(s))
                step(s);
        CHECK(sink.n_final == 21, "%u finals", sink.n_final);
}

static void test_cancel(Engine *e)
{
        _cleanup_(sched_freep) Sched *s = new_sched(e, 4, 64);
        SchedStats st;

        /* Client 1: requests 0..2; client 2: 3..5. Four run, two wait. */
        for (uint64_t id = 0; id < 6; id++)
                CHECK(sched_add(s, make_request(e, id, id < 3 ? 1 : 2, "Once upon a time", 200,
                                           NULL)) == 0,
                        "add");
        for (int i = 0; i < 5; i++)
                step(s);
        sched_stats(s, &st);
        CHECK(st.running == 4 && st.queued == 2, "%u running, %u queued", st.running, st.queued);
        CHECK(st.kv_blocks_free < st.kv_blocks_total, "nothing allocated");

        sched_cancel(s, 0);        /* running */
        sched_cancel(s, 12345);    /* unknown: ignored */
        sched_cancel_client(s, 2); /* two running, one queued */
        CHECK(sink.out[0].final && sink.out[0].finish == FINISH_CANCELLED,
                "request 0 not cancelled");
        for (int id = 3; id < 6; id++)
                CHECK(sink.out[id].final && sink.out[id].finish == FINISH_CANCELLED,
                        "request %d not cancelled", id);
        CHECK(sink.out[0].usage.generated_tokens == sink.out[0].tokens, "usage");
        CHECK(!sink.out[1].final && !sink.out[2].final, "client 1's others were touched");

        step(s);
        uint32_t before = sink.out[1].tokens;
        step(s);
        CHECK(sink.out[1].tokens == before + 1, "request 1 stopped advancing");
        sched_cancel_client(s, 1);
        sched_stats(s, &st);
        CHECK(sched_idle(s) && st.running == 0 && st.queued == 0, "not idle after cancelling");
        CHECK(st.kv_blocks_free == st.kv_blocks_total, "%u of %u blocks free", st.kv_blocks_free,
                st.kv_blocks_total);
        CHECK(st.cancelled == 6 && sink.n_final == 6, "%llu cancelled, %u finals",
                (unsigned long long) st.cancelled, sink.n_final);
        CHECK(step(s) == 0, "a step ran with nothing left");
}

static void test_pause(Engine *e)
{
        _cleanup_(sched_freep) Sched *s = new_sched(e, 4, 64);
        static Output want;

        reference(e, "The quick brown fox", 60, NULL, &want);
        CHECK(sched_add(s, make_request(e, 0, 1, "The quick brown fox", 60, NULL)) == 0, "add");
        CHECK(sched_add(s, make_request(e, 1, 2, "A lazy dog", 60, NULL)) == 0, "add");
        for (int i = 0; i < 4; i++)
                step(s);
        CHECK(sched_pause_client(s, 1) == 0, "pause");
        SchedStats st;
        /* The step in flight when the pause came still delivers its token, then no more. */
        uint32_t a = sink.out[0].tokens;
        CHECK(step(s) == 1, "the paused client's sequence is in the batch");
        CHECK(sink.out[0].tokens <= a + 1, "paused request advanced from %u to %u tokens", a,
                sink.out[0].tokens);
        a = sink.out[0].tokens;
        uint32_t b = sink.out[1].tokens;
        for (int i = 0; i < 5; i++)
                CHECK(step(s) == 1, "the paused client's sequence is in the batch");
        CHECK(sink.out[0].tokens == a, "paused request advanced from %u to %u tokens", a,
                sink.out[0].tokens);
        CHECK(sink.out[1].tokens == b + 5, "the other request did not advance");
        sched_stats(s, &st);
        CHECK(st.paused_clients == 1 && st.running == 2, "%u paused clients, %u running",
                st.paused_clients, st.running);
        CHECK(sched_has_work(s), "the unpaused request has work");

        /* A request of the paused client waits too. */
        CHECK(sched_add(s, make_request(e, 2, 1, "Hello", 10, NULL)) == 0, "add");
        while (!sink.out[1].final)
                step(s);
        CHECK(!sched_has_work(s) && !sched_idle(s), "only paused work is left");
        CHECK(step(s) == 0, "a step ran with only paused work");
        CHECK(sink.out[2].tokens == 0, "the paused client's new request started");

        sched_resume_client(s, 1);
        while (!sched_idle(s))
                step(s);
        check_same(&sink.out[0], &want, "paused and resumed request");
        CHECK(sink.out[2].final, "the queued request did not finish");
        sched_stats(s, &st);
        CHECK(st.kv_blocks_free == st.kv_blocks_total && st.paused_clients == 0,
                "%u of %u blocks free, %u paused", st.kv_blocks_free, st.kv_blocks_total,
                st.paused_clients);
}

static void logprobs_check(const SchedEvent *ev, uint32_t n)
{
        double mass = 0;

        CHECK(ev->n_top == n, "%u alternatives, asked for %u", ev->n_top, n);
        /* Greedy: the sampled token is the best one. */
        CHECK(ev->sampled.id == ev->token && ev->top[0].id == ev->token,
                "sampled %d, top %d, token %d", ev->sampled.id, ev->top[0].id, ev->token);
        CHECK(ev->sampled.logprob == ev->top[0].logprob, "sampled logprob differs from top[0]");
        for (uint32_t i = 0; i < n; i++) {
                CHECK(ev->top[i].logprob <= 0, "logprob %g > 0", (double) ev->top[i].logprob);
                if (i)
                        CHECK(ev->top[i].logprob < ev->top[i - 1].logprob ||
                                        (ev->top[i].logprob == ev->top[i - 1].logprob &&
                                                ev->top[i].id > ev->top[i - 1].id),
                                "alternatives out of order at %u", i);
                mass += exp(ev->top[i].logprob);
        }
        CHECK(mass <= 1.0 + 1e-5, "top logprobs add up to %g", mass);
}

typedef struct TokSink {
        Sink *inner;
        uint32_t n_tok;
} TokSink;

static void tok_sink_emit(void *userdata, const SchedEvent *ev)
{
        TokSink *t = userdata;

        if (ev->type == SCHED_EV_TOKEN) {
                logprobs_check(ev, 5);
                t->n_tok++;
        }
        sink_event(t->inner, ev);
}

static void test_logprobs(Engine *e)
{
        _cleanup_(sched_freep) Sched *s = NULL;
        SchedLimits lim = {.max_seqs = 2, .step_tokens = 64, .max_queued = 4};
        TokSink ts = {.inner = &sink};
        static Output want;
        DsError err = {};

        memset(&sink, 0, sizeof(sink));
        reference(e, "The quick brown fox", 20, NULL, &want);
        CHECK(sched_limits_check(&lim, &err) == 0, "%s", err.msg);
        CHECK(sched_new(e, &lim, tok_sink_emit, &ts, &s, &err) == 0, "%s", err.msg);
        SchedRequest *r = make_request(e, 0, 1, "The quick brown fox", 20, NULL);
        r->top_logprobs = 5;
        CHECK(sched_add(s, r) == 0, "add");
        while (!sched_idle(s))
                CHECK(sched_step(s, &err) >= 0, "%s", err.msg);
        CHECK(ts.n_tok == want.tokens && ts.n_tok > 0, "%u TOKEN events", ts.n_tok);
        check_same(&sink.out[0], &want, "request with logprobs");
}

/* With steps chained (sched_set_chaining), a cancel and a pause land while a step is in
 * flight: the cancelled request gets nothing after its FINAL, the paused one at most the
 * token already in flight, the others their reference text, and every block comes back. */
static void test_chained_controls(Engine *e)
{
        _cleanup_(sched_freep) Sched *s = new_sched(e, 4, 64);
        static const char *const text[] = {"Once upon a time", "The quick brown fox", "A lazy dog"};
        static Output want[3];
        SchedStats st;

        sched_set_chaining(s, true);
        for (uint64_t id = 0; id < 3; id++) {
                reference(e, text[id], 60, NULL, &want[id]);
                CHECK(want[id].tokens > 20, "reference %llu has only %u tokens",
                        (unsigned long long) id, want[id].tokens);
                CHECK(sched_add(s, make_request(e, id, (uint32_t) id + 1, text[id], 60, NULL)) == 0,
                        "add");
        }
        for (int i = 0; i < 6; i++)
                step(s);
        sched_stats(s, &st);
        CHECK(st.chained_steps > 0, "no step was chained");

        sched_cancel(s, 0);
        CHECK(sink.out[0].final && sink.out[0].finish == FINISH_CANCELLED,
                "request 0 not cancelled");
        CHECK(sched_pause_client(s, 2) == 0, "pause");
        step(s);
        uint32_t a = sink.out[1].tokens;
        for (int i = 0; i < 4; i++)
                step(s);
        CHECK(sink.out[1].tokens == a, "paused request advanced from %u to %u tokens", a,
                sink.out[1].tokens);
        sched_resume_client(s, 2);
        while (!sched_idle(s))
                step(s);
        check_same(&sink.out[1], &want[1], "paused and resumed request, chained");
        check_same(&sink.out[2], &want[2], "the request beside it, chained");
        sched_stats(s, &st);
        CHECK(st.kv_blocks_free == st.kv_blocks_total, "%u of %u blocks free", st.kv_blocks_free,
                st.kv_blocks_total);
}

int main(void)
{
        _cleanup_(engine_freep) Engine *e = NULL;
        DsError err = {};

        CHECK(engine_open(test_build("models/tiny"), NULL, &e, &err) == 0, "%s", err.msg);
        test_fairness(e);
        test_cancel(e);
        test_pause(e);
        test_logprobs(e);
        test_chained_controls(e);
        CHECK(e->kv.n_free == e->kv.n_total, "blocks leaked");
        return 0;
}
