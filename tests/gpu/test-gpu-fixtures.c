/* SPDX-License-Identifier: MIT */
/* The CUDA backend against transformers on the tiny fixtures: one forward pass over
 * golden.json's input ids within 1e-2 relative error of golden_logits.f32, and greedy
 * decoding equal to transformers' up to the first top-2 margin below 1e-2; both again with
 * the lm_head quantized to 8 bits at load (the forward pass's 48 rows through cuBLAS on its
 * FP16 copy, the greedy steps through the 8-bit GEMV), the ids then at the steps whose margin
 * is at least 0.5. */
#include "cpu_fixture.h"
#include "gpu_util.h"

#define TOL         1e-2
#define MARGIN_MIN  1e-2
#define MARGIN_INT8 0.5

static const char *const fixtures[] = {
        "fixtures/tiny-qwen2-awq",
        "fixtures/tiny-llama-awq",
        "fixtures/tiny-llama-awq-sharded",
        "fixtures/tiny-deepseek-v2-awq",
        "fixtures/tiny-deepseek-v3-awq",
};

static int32_t step(Backend *b, const int32_t *tokens, uint32_t n, uint32_t pos, float *logits)
{
        static uint32_t blocks[FIX_MAX_BLOCKS];
        DsError err = {0};
        int32_t id;

        for (uint32_t i = 0; i < FIX_MAX_BLOCKS; i++)
                blocks[i] = FIX_MAX_BLOCKS - 1 - i;
        BkSeq s = {.tokens = tokens,
                .n_tokens = n,
                .pos = pos,
                .blocks = blocks,
                .n_blocks = FIX_MAX_BLOCKS,
                .sample = true,
                .sampling = {.temperature = 0, .repetition_penalty = 1},
                .logits = logits};
        CHECK(backend_cuda_ops.step(b, &s, 1, &id, &err) == 0, "step: %s", err.msg);
        return id;
}

static double check_fixture(const char *dir, bool int8)
{
        DsError err = {0};
        Model *m = NULL;

        CHECK(model_load(dir, &(ModelOptions){.lm_head_int8 = int8}, &m, &err) == 0, "%s: %s", dir,
                err.msg);
        CHECK(!int8 || m->bk.lm_head.kind == BK_LINEAR_Q8, "%s: lm_head not 8-bit", dir);
        uint32_t V = m->bk.cfg.vocab_size;
        Backend *b = backend_open(&backend_cuda_ops, &m->bk, NULL, FIX_MAX_BLOCKS);
        Golden g = fix_golden(dir, V);
        float *out = (float *) rnd_alloc((size_t) g.n_input * V * 4);
        for (size_t i = 0; i < (size_t) g.n_input * V; i++)
                out[i] = NAN;

        step(b, g.input_ids, g.n_input, 0, out);
        double e = fix_rel_err(out, g.logits, (size_t) g.n_input * V);
        const char *head = int8 ? " (8-bit lm_head)" : "";
        printf("%s%s: logits relative error %.3g (tolerance %g)\n", dir, head, e, TOL);
        CHECK(e < TOL, "%s%s: relative error %.3g", dir, head, e);

        /* FP16 head: every id up to the first near-tie. 8-bit head: its logits move by up to
         * 0.13 on these fixtures (tests/cpu/test-lm-head-int8.c), so the ids of the steps
         * whose margin is at least MARGIN_INT8, each step fed transformers' id. */
        uint32_t compared = 0;
        int32_t id = step(b, g.prompt, g.n_prompt, 0, NULL);
        for (uint32_t i = 0; i < g.n_new && (int8 || g.margins[i] >= MARGIN_MIN); i++) {
                if (!int8 || g.margins[i] >= MARGIN_INT8) {
                        CHECK(id == g.new_ids[i],
                                "%s%s: step %u: id %d, transformers %d (margin %.3g)", dir, head, i,
                                id, g.new_ids[i], g.margins[i]);
                        compared++;
                }
                id = step(b, &g.new_ids[i], 1, g.n_prompt + i, NULL);
        }
        printf("%s%s: %u of %u greedy ids agree\n", dir, head, compared, g.n_new);
        CHECK(compared > 0, "%s%s: nothing compared", dir, head);

        free(out);
        fix_golden_free(&g);
        backend_cuda_ops.free(b);
        model_free(m);
        return e;
}

int main(void)
{
        double worst = 0;

        gpu_require();
        for (size_t i = 0; i < ELEMENTSOF(fixtures); i++)
                for (int int8 = 0; int8 < 2; int8++)
                        worst = fmax(worst, check_fixture(test_shared(fixtures[i]), int8));
        printf("worst logits relative error %.3g\n", worst);
        return 0;
}
