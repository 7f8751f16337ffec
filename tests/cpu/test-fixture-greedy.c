/* SPDX-License-Identifier: MIT */
/* Greedy decoding on the CPU backend follows transformers' greedy continuation of
 * greedy_prompt_ids: ids must agree up to the first step whose top-2 margin is below
 * 1e-2 (a near-tie a correct engine may resolve either way, per the fixture README). */
#include "cpu_fixture.h"

#define MARGIN_MIN 1e-2

static const char *const fixtures[] = {
        "fixtures/tiny-qwen2-awq",
        "fixtures/tiny-llama-awq",
        "fixtures/tiny-llama-awq-sharded",
};

static void check_fixture(const char *dir)
{
        Fixture f = fix_open(dir);
        Golden g = fix_golden(dir, f.vocab);
        uint32_t compared = 0;

        fix_kv_reset(&f);
        int32_t id = fix_step(&f, g.prompt, g.n_prompt, 0, NULL, true);
        for (uint32_t i = 0; i < g.n_new; i++) {
                if (g.margins[i] < MARGIN_MIN)
                        break;
                CHECK(id == g.new_ids[i], "%s: step %u: id %d, transformers %d (margin %.3g)", dir,
                        i, id, g.new_ids[i], g.margins[i]);
                compared++;
                /* Feed the reference id, so one step's miss cannot hide in the next. */
                id = fix_step(&f, &g.new_ids[i], 1, g.n_prompt + i, NULL, true);
        }
        printf("%s: %u of %u greedy ids agree (compared up to the first margin < %g)\n", dir,
                compared, g.n_new, MARGIN_MIN);
        CHECK(compared > 0, "%s: nothing compared", dir);

        fix_golden_free(&g);
        fix_close(&f);
}

int main(void)
{
        for (size_t i = 0; i < ELEMENTSOF(fixtures); i++)
                check_fixture(test_shared(fixtures[i]));
        return 0;
}
