/* SPDX-License-Identifier: MIT */
/* ModelOptions.lm_head_int8 on the CPU backend against transformers. The tiny fixtures'
 * lm_heads (FP16, untied, hidden 512: group 128) quantized to 8 bits at load must give
 * - logits within TOLERANCE of golden_logits.f32 over golden.json's 48 input ids, and not
 *   the bits of the plain load (the option took effect);
 * - transformers' greedy ids at every step whose top-2 margin is at least MARGIN_MIN, the
 *   reference id fed at each step so that steps are independent. */
#include "cpu_fixture.h"

/* Measured: 6.42e-3 .. 6.49e-3 on the four fixtures (6.49e-3 vs the plain load too,
 * whose own error is 1e-6), which is what round-to-nearest with a step of amax / 127 costs
 * random weights. 2e-2 keeps a margin of three; a wrong scale, group or dtype gives O(1). */
#define TOLERANCE 2e-2

/* About four times the largest logit error measured at the input positions (0.127 of
 * logits up to 18), so a margin this wide cannot flip. */
#define MARGIN_MIN 0.5

static const char *const fixtures[] = {
        "fixtures/tiny-qwen2-awq",
        "fixtures/tiny-llama-awq",
        "fixtures/tiny-deepseek-v2-awq",
        "fixtures/tiny-deepseek-v3-awq",
};

static void check_greedy(Fixture *f, const Golden *g, const char *dir)
{
        uint32_t compared = 0;

        fix_kv_reset(f);
        int32_t id = fix_step(f, g->prompt, g->n_prompt, 0, NULL, true);
        for (uint32_t i = 0; i < g->n_new; i++) {
                if (g->margins[i] >= MARGIN_MIN) {
                        CHECK(id == g->new_ids[i],
                                "%s: step %u: id %d, transformers %d (margin %.3g)", dir, i, id,
                                g->new_ids[i], g->margins[i]);
                        compared++;
                }
                id = fix_step(f, &g->new_ids[i], 1, g->n_prompt + i, NULL, true);
        }
        printf("%s: %u of %u greedy ids compared (margin >= %g), all agree\n", dir, compared,
                g->n_new, MARGIN_MIN);
        CHECK(compared > 0, "%s: nothing compared", dir);
}

int main(void)
{
        for (size_t i = 0; i < ELEMENTSOF(fixtures); i++) {
                const char *dir = test_shared(fixtures[i]);
                Fixture p = fix_open(dir);
                Fixture q = fix_open_with(dir, 0, &(ModelOptions){.lm_head_int8 = true});
                Golden g = fix_golden(dir, q.vocab);
                size_t n = (size_t) g.n_input * q.vocab;
                float *lp = calloc(n, sizeof(float)), *lq = calloc(n, sizeof(float));
                CHECK(lp && lq, "out of memory");

                const BkLinear *head = &q.model->bk.lm_head;
                CHECK(head->kind == BK_LINEAR_Q8 && head->group_size == 128, "%s: lm_head %d g%u",
                        dir, (int) head->kind, head->group_size);
                CHECK(strstr(q.model->info.quant, ", lm_head int8 g128"), "%s: quant '%s'", dir,
                        q.model->info.quant);

                fix_kv_reset(&p);
                fix_step(&p, g.input_ids, g.n_input, 0, lp, false);
                fix_kv_reset(&q);
                fix_step(&q, g.input_ids, g.n_input, 0, lq, false);
                double e = fix_rel_err(lq, g.logits, n), d = fix_rel_err(lq, lp, n);
                double amax = 0;
                for (size_t k = 0; k < n; k++)
                        amax = fmax(amax, fabs((double) lq[k] - g.logits[k]));
                printf("%s (%s): rel err %.3g vs transformers (%.3g vs the plain load), largest "
                       "logit error %.3g\n",
                        dir, q.model->info.quant, e, d, amax);
                CHECK(e < TOLERANCE, "%s: rel err %g", dir, e);
                CHECK(memcmp(lp, lq, n * sizeof(float)) != 0,
                        "%s: the int8 lm_head gives the plain load's logits", dir);

                check_greedy(&q, &g, dir);
                free(lp);
                free(lq);
                fix_golden_free(&g);
                fix_close(&p);
                fix_close(&q);
        }
        return 0;
}
