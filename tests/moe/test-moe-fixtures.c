/* SPDX-License-Identifier: MIT */
/* The CPU backend against transformers 5.17 on the DeepSeek fixtures (MLA + MoE):
 * - one pass over golden.json's 48 input ids matches golden_logits.f32 to
 *   ‖out−ref‖/‖ref‖ < 1e-4;
 * - the same prompt fed in chunks gives the same last-position logits;
 * - greedy ids follow transformers' up to the first step whose top-2 margin is below 1e-2. */
#include "cpu_fixture.h"

#define MARGIN_MIN 1e-2

static const char *const fixtures[] = {
        "fixtures/tiny-deepseek-v2-awq",
        "fixtures/tiny-deepseek-v3-awq",
};

static void check_logits(Fixture *f, const Golden *g, const char *dir)
{
        size_t n = (size_t) g->n_input * f->vocab;
        float *out = calloc(n, sizeof(float));
        float *tmp = calloc(n, sizeof(float));
        CHECK(out && tmp, "out of memory");

        /* One pass over all 48 tokens. */
        fix_kv_reset(f);
        fix_step(f, g->input_ids, g->n_input, 0, out, false);
        double e = fix_rel_err(out, g->logits, n);
        printf("%s: rel err %.3g over %u positions\n", dir, e, g->n_input);
        CHECK(e < 1e-4, "%s: rel err %g", dir, e);

        /* The same prompt in chunks of 5, 7 and 1. */
        const float *ref_last = out + (size_t) (g->n_input - 1) * f->vocab;
        const uint32_t chunks[] = {5, 7, 1};
        for (size_t i = 0; i < ELEMENTSOF(chunks); i++) {
                const float *last = NULL;
                fix_kv_reset(f);
                for (uint32_t pos = 0; pos < g->n_input; pos += chunks[i]) {
                        uint32_t k = MIN(chunks[i], g->n_input - pos);
                        fix_step(f, g->input_ids + pos, k, pos, tmp, false);
                        last = tmp + (size_t) (k - 1) * f->vocab;
                }
                double c = fix_rel_err(last, ref_last, f->vocab);
                printf("%s: chunks of %u: last-position rel diff %.3g\n", dir, chunks[i], c);
                CHECK(c < 1e-5, "%s: chunks of %u differ by %g", dir, chunks[i], c);
        }
        free(out);
        free(tmp);
}

static void check_greedy(Fixture *f, const Golden *g, const char *dir)
{
        uint32_t compared = 0;

        fix_kv_reset(f);
        int32_t id = fix_step(f, g->prompt, g->n_prompt, 0, NULL, true);
        for (uint32_t i = 0; i < g->n_new; i++) {
                if (g->margins[i] < MARGIN_MIN)
                        break;
                CHECK(id == g->new_ids[i], "%s: step %u: id %d, transformers %d (margin %.3g)", dir,
                        i, id, g->new_ids[i], g->margins[i]);
                compared++;
                /* Feed the reference id, so one step's miss cannot hide in the next. */
                id = fix_step(f, &g->new_ids[i], 1, g->n_prompt + i, NULL, true);
        }
        printf("%s: %u of %u greedy ids agree (compared up to the first margin < %g)\n", dir,
                compared, g->n_new, MARGIN_MIN);
        CHECK(compared > 0, "%s: nothing compared", dir);
}

int main(void)
{
        for (size_t i = 0; i < ELEMENTSOF(fixtures); i++) {
                const char *dir = test_shared(fixtures[i]);
                Fixture f = fix_open(dir);
                Golden g = fix_golden(dir, f.vocab);

                check_logits(&f, &g, dir);
                check_greedy(&f, &g, dir);
                fix_golden_free(&g);
                fix_close(&f);
        }
        return 0;
}
