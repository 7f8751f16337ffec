/* SPDX-License-Identifier: MIT */
/* engine_warm_up on the synthetic model, through the CPU backend's submit and collect: it
 * returns every KV block it took, leaves the model generating exactly the text it
 * generated before, covers more sequences than the cache would hold at full length (the
 * others take one block each, or two where a block is 2 positions), runs as many of the
 * sequences asked for as the free blocks hold, shortens its prompt to what two free
 * blocks hold, and refuses, naming the numbers, a cache with no free block. A backend's
 * warm hook (the CPU backend has none: a copy of its table with one) is asked for the step's
 * whole token budget, also where the prompt is shortened, and its failure fails the
 * warm-up before a block is taken. */
#include <errno.h>
#include <string.h>

#include "engine.h"
#include "gen_text.h"

static uint32_t warm_rows, warm_calls;
static int warm_result;

static int warm_hook(Backend *b, uint32_t max_rows, DsError *err)
{
        (void) b;
        warm_rows = max_rows;
        warm_calls++;
        return warm_result < 0 ? ds_error(err, warm_result, "cuBLAS said no") : 0;
}

static void generate(Engine *e, Collect *t)
{
        GenParams gp = {.max_tokens = 40, .sampling = {.temperature = 0, .top_p = 1}};
        GenResult res;
        DsError err = {};
        CHECK(engine_generate(e, "The quick brown fox", &gp, collect, t, &res, &err) == 0, "%s",
                err.msg);
        CHECK(res.generated_tokens > 0, "nothing generated");
}

int main(void)
{
        _cleanup_(engine_freep) Engine *e = NULL;
        static Collect before, after;
        DsError err = {};

        EngineOptions eo = {.kv_block_tokens = 16, .kv_bytes = 0};
        CHECK(engine_open(test_build("models/tiny"), &eo, &e, &err) == 0, "%s", err.msg);
        generate(e, &before);

        uint32_t free0 = e->kv.n_free;
        CHECK(free0 > 8, "the cache has %u blocks", free0);
        /* more sequences than blocks of a full-length prompt: one block each after the first */
        uint32_t prompt = 5 * 16 - 2, got_prompt = 0, got_seqs = 0;
        CHECK(engine_warm_up(e, 13, prompt, &got_prompt, &got_seqs, &err) == 0, "%s", err.msg);
        CHECK(got_prompt == prompt && got_seqs == 13, "warm-up ran %u tokens, %u sequences",
                got_prompt, got_seqs);
        CHECK(e->kv.n_free == free0, "warm-up kept %u of %u blocks", free0 - e->kv.n_free, free0);
        generate(e, &after);
        CHECK(after.len == before.len && memcmp(after.buf, before.buf, before.len) == 0,
                "the text after the warm-up differs:\n%s\nbefore:\n%s", after.buf, before.buf);

        /* a cache that holds the prompt and three more sequences of the 13 asked for */
        uint32_t *ids = calloc(free0, sizeof(*ids)), held = free0 - (6 + 3);
        CHECK(ids && kv_pool_alloc(&e->kv, held, ids) == 0, "cannot hold the blocks");
        CHECK(engine_warm_up(e, 13, prompt, NULL, &got_seqs, &err) == 0, "%s", err.msg);
        CHECK(got_seqs == 4, "warm-up in 9 free blocks ran %u sequences", got_seqs);
        CHECK(e->kv.n_free == 9, "warm-up in 9 free blocks left %u", e->kv.n_free);
        kv_pool_release(&e->kv, ids, held);

        /* two free blocks: a shorter prompt in them; none: refused, naming the numbers */
        held = e->kv.n_free - 2;
        CHECK(kv_pool_alloc(&e->kv, held, ids) == 0, "cannot hold the blocks");
        CHECK(engine_warm_up(e, 4, prompt, &got_prompt, &got_seqs, &err) == 0, "%s", err.msg);
        CHECK(got_prompt == 2 * 16 - 3 && got_seqs == 1,
                "warm-up in 2 blocks ran %u tokens, %u "
                "sequences",
                got_prompt, got_seqs);
        CHECK(e->kv.n_free == 2, "warm-up in 2 free blocks left %u", e->kv.n_free);
        CHECK(kv_pool_alloc(&e->kv, 2, ids + held) == 0, "cannot hold the last blocks");
        int r = engine_warm_up(e, 4, prompt, NULL, NULL, &err);
        CHECK(r == -ENOSPC, "warm-up with no free block returned %d", r);
        CHECK(strstr(err.msg, "0 free KV blocks of 16 positions"), "message: %s", err.msg);
        held += 2;
        kv_pool_release(&e->kv, ids, held);
        free(ids);

        /* blocks of 2 positions: each decode sequence takes two */
        _cleanup_(engine_freep) Engine *e2 = NULL;
        eo.kv_block_tokens = 2;
        CHECK(engine_open(test_build("models/tiny"), &eo, &e2, &err) == 0, "%s", err.msg);
        uint32_t free2 = e2->kv.n_free;
        CHECK(engine_warm_up(e2, 5, 7, NULL, NULL, &err) == 0, "%s", err.msg);
        CHECK(e2->kv.n_free == free2, "warm-up kept %u of %u blocks of 2", free2 - e2->kv.n_free,
                free2);

        BackendOps hooked = *e2->ops;
        hooked.warm = warm_hook;
        e2->ops = &hooked;
        CHECK(engine_warm_up(e2, 5, 7, NULL, NULL, &err) == 0, "%s", err.msg);
        CHECK(warm_calls == 1 && warm_rows == 7, "warm hook: %u calls, last %u rows", warm_calls,
                warm_rows);
        uint32_t most = e2->kv.n_free * 2;
        CHECK(engine_warm_up(e2, 5, most + 100, &got_prompt, NULL, &err) == 0, "%s", err.msg);
        CHECK(warm_rows == most + 100 && got_prompt < most,
                "a shortened prompt (%u tokens) warmed %u rows", got_prompt, warm_rows);
        warm_result = -EIO;
        r = engine_warm_up(e2, 5, 7, NULL, NULL, &err);
        CHECK(r == -EIO && strstr(err.msg, "warm-up: cuBLAS said no"), "failed hook: %d, %s", r,
                err.msg);
        CHECK(e2->kv.n_free == free2, "a failed warm-up kept %u blocks", free2 - e2->kv.n_free);
        printf("warm-up: %u blocks back, the same %zu bytes of text\n", free0, before.len);
        return 0;
}
