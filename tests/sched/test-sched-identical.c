/* SPDX-License-Identifier: MIT */
/* 32 concurrent greedy requests through the scheduler produce byte for byte the text each
 * produces alone through engine_generate(): with a KV pool large enough for all of them,
 * and (argument "preempt") with one so small that sequences are preempted and recomputed.
 * Some prompts reach the model's context limit, some stop on a stop string. Steps are
 * chained (submitted before the one they follow is collected, sched_set_chaining) where
 * the batch allows, so the comparison covers chained tokens and the position a stopped
 * sequence computes in vain.
 *
 * usage: test-sched-identical MODEL_DIR [preempt] */
#include <string.h>

#include "sched_test.h"

#define N_REQS 32

int main(int argc, char **argv)
{
        _cleanup_(engine_freep) Engine *probe = NULL, *e = NULL;
        _cleanup_(sched_freep) Sched *s = NULL;
        static Sink sink;
        static Output want[N_REQS];
        DsError err = {};

        CHECK(argc >= 2, "usage: %s MODEL_DIR [preempt]", argv[0]);
        bool preempt = argc > 2 && !strcmp(argv[2], "preempt");

        /* Size the pool from the model: every sequence at full context, or three. */
        CHECK(engine_open(argv[1], NULL, &probe, &err) == 0, "%s", err.msg);
        uint32_t ctx = probe->model->bk.cfg.max_positions;
        uint64_t per_token = probe->ops->kv_bytes_per_token(probe->be);
        probe = engine_free(probe);
        EngineOptions eo = {
                .kv_block_tokens = 16,
                .kv_bytes = (uint64_t) (preempt ? 3 : N_REQS) * ctx * per_token,
        };
        CHECK(engine_open(argv[1], &eo, &e, &err) == 0, "%s", err.msg);

        /* Lengths vary: short ones, ones the context limit ends, and a stop string. */
        uint32_t max_tokens[N_REQS];
        const char *stops[N_REQS] = {};
        for (uint32_t i = 0; i < N_REQS; i++) {
                max_tokens[i] = i % 4 == 0 ? ctx : 40 + 7 * i;
                if (i % 5 == 3)
                        stops[i] = "he";
                reference(e, story_prompts[i], max_tokens[i], stops[i], &want[i]);
        }
        CHECK(e->kv.n_free == e->kv.n_total, "engine_generate leaked blocks");

        SchedLimits lim = {.max_seqs = N_REQS, .step_tokens = 256, .max_queued = N_REQS};
        CHECK(sched_limits_check(&lim, &err) == 0, "%s", err.msg);
        CHECK(sched_new(e, &lim, sink_emit, &sink, &s, &err) == 0, "%s", err.msg);
        sched_set_chaining(s, true);
        for (uint32_t i = 0; i < N_REQS; i++)
                CHECK(sched_add(s, make_request(e, i, i % 5, story_prompts[i], max_tokens[i],
                                           stops[i])) == 0,
                        "add %u", i);

        uint32_t max_batch = 0;
        for (sink.step = 1; !sched_idle(s); sink.step++) {
                int n = sched_step(s, &err);
                CHECK(n > 0, "step %llu ran nothing (%d): %s", (unsigned long long) sink.step, n,
                        err.msg);
                max_batch = MAX(max_batch, (uint32_t) n);
                CHECK(sink.step < 100000, "no progress");
        }
        for (uint32_t i = 0; i < N_REQS; i++) {
                char what[128];
                snprintf(what, sizeof(what), "request %u '%s'", i, story_prompts[i]);
                check_same(&sink.out[i], &want[i], what);
        }

        SchedStats st;
        sched_stats(s, &st);
        printf("%llu steps (%llu chained), batches up to %u sequences, %llu preemptions, %llu "
               "tokens\n",
                (unsigned long long) st.steps, (unsigned long long) st.chained_steps, max_batch,
                (unsigned long long) st.preemptions, (unsigned long long) st.generated_tokens);
        CHECK(st.chained_steps > 0 && st.chained_steps < st.steps, "%llu of %llu steps chained",
                (unsigned long long) st.chained_steps, (unsigned long long) st.steps);
        CHECK(st.kv_blocks_free == st.kv_blocks_total, "%u of %u blocks free at the end",
                st.kv_blocks_free, st.kv_blocks_total);
        CHECK(st.finished == N_REQS && st.failed == 0, "%llu finished, %llu failed",
                (unsigned long long) st.finished, (unsigned long long) st.failed);
        if (preempt)
                CHECK(st.preemptions > 0, "the small pool preempted nothing");
        else {
                CHECK(st.preemptions == 0, "%llu preemptions with room for all",
                        (unsigned long long) st.preemptions);
                /* Short requests finish while the last prompts are still admitted. */
                CHECK(max_batch > N_REQS * 3 / 4, "batches reached only %u sequences", max_batch);
        }
        return 0;
}
