/* SPDX-License-Identifier: MIT */
/* The CPU backend's logits do not depend on its thread count: each fixture's prompt in
 * one step, then greedy decode one token a step, on 1, 2 and 3 threads, compared with
 * memcmp. */
#include "cpu_fixture.h"

#define N_DECODE 8

static const uint32_t THREADS[] = {1, 2, 3};
#define N_THREADS (sizeof(THREADS) / sizeof(THREADS[0]))

/* logits ((n_input + N_DECODE), vocab) of the prompt and of every decoded token. */
static void run(const char *dir, const Golden *g, uint32_t threads, float *logits)
{
        Fixture f = fix_open_threads(dir, threads);
        fix_kv_reset(&f);

        int32_t id = fix_step(&f, g->input_ids, g->n_input, 0, logits, true);
        for (uint32_t i = 0; i < N_DECODE; i++)
                id = fix_step(&f, &id, 1, g->n_input + i,
                        logits + (size_t) (g->n_input + i) * f.vocab, true);
        fix_close(&f);
}

static void check_fixture(const char *dir)
{
        Fixture f = fix_open(dir);
        uint32_t vocab = f.vocab;
        fix_close(&f);

        Golden g = fix_golden(dir, vocab);
        size_t n = (size_t) (g.n_input + N_DECODE) * vocab;
        float *ref = calloc(n, sizeof(float));
        float *out = calloc(n, sizeof(float));
        CHECK(ref && out, "out of memory");

        run(dir, &g, THREADS[0], ref);
        for (size_t i = 1; i < N_THREADS; i++) {
                memset(out, 0, n * sizeof(float));
                run(dir, &g, THREADS[i], out);
                CHECK(memcmp(out, ref, n * sizeof(float)) == 0,
                        "%s: logits on %u threads differ from %u thread", dir, THREADS[i],
                        THREADS[0]);
        }
        printf("%s: %u prompt + %u decode rows bit-identical on 1, 2 and 3 threads\n", dir,
                g.n_input, N_DECODE);
        free(ref);
        free(out);
        fix_golden_free(&g);
}

int main(void)
{
        check_fixture(test_shared("fixtures/tiny-qwen2-awq"));
        check_fixture(test_shared("fixtures/tiny-deepseek-v2-awq"));
        return 0;
}
