/* SPDX-License-Identifier: MIT */
/* The CPU backend refuses bad calls with the documented codes and a message, before
 * touching the cache: no model, no cache, a cache too small, out-of-range tokens and
 * blocks, too few blocks, and positions past the context limit; submit and collect out of
 * turn, and chained tokens with nothing to chain from. A chained step samples what the
 * plain step does. A good step afterwards still gives the reference logits. */
#include "cpu_fixture.h"

static void expect(int got, int want, const DsError *err, const char *what)
{
        CHECK(got == want, "%s: returned %d, expected %d (%s)", what, got, want, err->msg);
        CHECK(err->msg[0], "%s: no message", what);
        printf("%s: %s\n", what, err->msg);
}

int main(void)
{
        const char *dir = test_shared("fixtures/tiny-qwen2-awq");
        const BackendOps *ops = backend_find("cpu");
        DsError err = {0};
        Backend *b;
        int32_t id, tok = 5;
        uint32_t blocks[FIX_MAX_BLOCKS] = {0};

        CHECK(ops == &backend_cpu_ops && backend_find(NULL) == ops && backend_find("auto") == ops,
                "backend_find");
        CHECK(backend_find("cuda") == NULL && backend_find("nope") == NULL, "backend_find");

        /* No model yet. */
        CHECK(ops->create(NULL, &b, &err) == 0, "%s", err.msg);
        BkSeq s = {.tokens = &tok, .n_tokens = 1, .blocks = blocks, .n_blocks = 1};
        expect(ops->step(b, &s, 1, &id, &err), -DS_ERR_MODEL_NOT_LOADED, &err, "step, no model");
        expect((int) ops->kv_init(b, 16, 1 << 20, &err), -DS_ERR_MODEL_NOT_LOADED, &err,
                "kv_init, no model");
        CHECK(ops->kv_bytes_per_token(b) == 0, "kv bytes without a model");
        ops->free(b);

        Fixture f = fix_open(dir);
        Golden g = fix_golden(dir, f.vocab);
        const BkConfig *c = &f.model->bk.cfg;
        CHECK(ops->kv_bytes_per_token(f.b) ==
                        (uint64_t) c->n_layers * 2 * c->n_kv_heads * c->head_dim * sizeof(float),
                "kv bytes per token");

        expect(ops->step(f.b, &s, 1, &id, &err), -EINVAL, &err, "step, no cache");
        expect((int) ops->kv_init(f.b, 0, 1 << 20, &err), -EINVAL, &err, "kv_init, 0 tokens");
        expect((int) ops->kv_init(f.b, 16, 100, &err), -ENOMEM, &err, "kv_init, too small");
        fix_kv_reset(&f);

        BkSeq bad = s;
        bad.n_tokens = 0;
        expect(ops->step(f.b, &bad, 1, &id, &err), -EINVAL, &err, "no tokens");
        bad = s;
        int32_t big = (int32_t) f.vocab;
        bad.tokens = &big;
        expect(ops->step(f.b, &bad, 1, &id, &err), -EINVAL, &err, "token past the vocab");
        bad = s;
        blocks[0] = FIX_MAX_BLOCKS;
        expect(ops->step(f.b, &bad, 1, &id, &err), -EINVAL, &err, "block past the cache");
        blocks[0] = 0;
        bad = s;
        bad.pos = FIX_BLOCK_TOKENS;
        expect(ops->step(f.b, &bad, 1, &id, &err), -EINVAL, &err, "too few blocks");
        bad = s;
        bad.pos = c->max_positions;
        expect(ops->step(f.b, &bad, 1, &id, &err), -DS_ERR_CONTEXT_FULL, &err, "context full");

        /* A bad sequence anywhere in the batch fails the whole step before any work. */
        BkSeq two[2] = {s, bad};
        expect(ops->step(f.b, two, 2, (int32_t[2]){}, &err), -DS_ERR_CONTEXT_FULL, &err,
                "bad second sequence");

        /* submit and collect: a chained step feeds the id its predecessor sampled, as a
         * plain step fed that id does; misuse is refused. */
        int32_t ids[2], plain[2];
        BkSeq first = s, chained = s;
        first.sample = chained.sample = true;
        chained.tokens = NULL;
        chained.chained = true;
        chained.pos = 1;
        expect(ops->collect(f.b, ids, 1, &err), -EINVAL, &err, "collect, nothing submitted");
        expect(ops->submit(f.b, &chained, 1, &err), -EINVAL, &err, "chained, no step before");
        CHECK(ops->step(f.b, &first, 1, &plain[0], &err) == 0, "%s", err.msg);
        BkSeq next = s;
        next.tokens = &plain[0];
        next.pos = 1;
        next.sample = true;
        CHECK(ops->step(f.b, &next, 1, &plain[1], &err) == 0, "%s", err.msg);
        CHECK(ops->submit(f.b, &first, 1, &err) == 0, "%s", err.msg);
        CHECK(ops->submit(f.b, &chained, 1, &err) == 0, "%s", err.msg);
        expect(ops->submit(f.b, &first, 1, &err), -EBUSY, &err, "a third step outstanding");
        expect(ops->collect(f.b, ids, 2, &err), -EINVAL, &err, "collect, wrong count");
        CHECK(ops->collect(f.b, &ids[1], 1, &err) == 0, "%s", err.msg);
        CHECK(ids[1] == plain[1], "chained step sampled %d, the plain one %d", ids[1], plain[1]);
        CHECK(plain[0] >= 0 && plain[1] >= 0, "no ids sampled");
        BkSeq unsampled = s;
        CHECK(ops->submit(f.b, &unsampled, 1, &err) == 0, "%s", err.msg);
        CHECK(ops->collect(f.b, ids, 1, &err) == 0 && ids[0] == -1, "an unsampled id");
        expect(ops->submit(f.b, &chained, 1, &err), -EINVAL, &err, "chained to no sample");
        chained.prev = 1;
        expect(ops->submit(f.b, &chained, 1, &err), -EINVAL, &err, "chained past the step");

        /* The backend is still good. */
        float *out = calloc((size_t) g.n_input * f.vocab, sizeof(float));
        CHECK(out, "out of memory");
        fix_step(&f, g.input_ids, g.n_input, 0, out, false);
        double e = fix_rel_err(out, g.logits, (size_t) g.n_input * f.vocab);
        CHECK(e < 1e-4, "rel err %g after the errors", e);

        free(out);
        fix_golden_free(&g);
        fix_close(&f);
        return 0;
}
