/* SPDX-License-Identifier: MIT */
/* cpu_moe_route() on hand-computed cases: greedy and group-limited softmax routing,
 * noaux_tc with a correction bias that changes the choice but not the weights, a kept
 * expert with a negative biased value beating every expert of a dropped group,
 * norm_topk_prob on and off, and routed_scaling_factor. */
#include <math.h>
#include <string.h>

#include "cpu_moe.h"
#include "test_util.h"

#define MAX_E 8

static void route(const BkMoeConfig *mc, const float *logits, const float *bias,
        const uint32_t *want_idx, const float *want_w, const char *what)
{
        float scratch[3 * MAX_E + MAX_E], w[MAX_E];
        uint32_t idx[MAX_E];
        BkTensor b = {.dtype = BK_DT_F32, .data = bias};

        CHECK(cpu_moe_route_scratch(mc) <= ELEMENTSOF(scratch), "%s: scratch", what);
        cpu_moe_route(mc, logits, b, scratch, idx, w);
        for (uint32_t i = 0; i < mc->top_k; i++) {
                CHECK(idx[i] == want_idx[i], "%s: expert %u is %u, expected %u", what, i, idx[i],
                        want_idx[i]);
                CHECK(fabsf(w[i] - want_w[i]) < 1e-6f, "%s: weight %u is %.9g, expected %.9g", what,
                        i, w[i], want_w[i]);
        }
        printf("%s: ok\n", what);
}

static float sigmoid(float x)
{
        return 1.0f / (1.0f + expf(-x));
}

int main(void)
{
        /* softmax of ln(1..4) is 0.1, 0.2, 0.3, 0.4 */
        const float ln4[4] = {logf(1), logf(2), logf(3), logf(4)};
        BkMoeConfig greedy = {.n_routed = 4,
                .top_k = 2,
                .n_group = 1,
                .topk_group = 1,
                .topk_method = BK_TOPK_GREEDY,
                .scoring = BK_SCORING_SOFTMAX,
                .routed_scaling_factor = 2.0f};
        route(&greedy, ln4, NULL, (uint32_t[]){2, 3}, (float[]){0.6f, 0.8f}, "greedy, scaled by 2");
        greedy.norm_topk_prob = true;
        route(&greedy, ln4, NULL, (uint32_t[]){2, 3}, (float[]){0.3f / 0.7f, 0.4f / 0.7f},
                "greedy, normalised (and so not scaled)");

        /* Probabilities 8,1 | 7,1 | 2,2 | 1,1 over 23: greedy takes 0 and 2; keeping only
         * the group of best max (group 0) takes 0 and 1. */
        const float p8[8] = {logf(8), 0, logf(7), 0, logf(2), logf(2), 0, 0};
        BkMoeConfig grouped = {.n_routed = 8,
                .top_k = 2,
                .n_group = 4,
                .topk_group = 1,
                .topk_method = BK_TOPK_GROUP_LIMITED_GREEDY,
                .scoring = BK_SCORING_SOFTMAX,
                .routed_scaling_factor = 1.0f};
        route(&grouped, p8, NULL, (uint32_t[]){0, 1}, (float[]){8.0f / 23, 1.0f / 23},
                "group_limited_greedy, one group kept");
        grouped.topk_method = BK_TOPK_GREEDY;
        route(&grouped, p8, NULL, (uint32_t[]){0, 2}, (float[]){8.0f / 23, 7.0f / 23},
                "greedy on the same scores");

        /* noaux_tc: the bias lifts expert 2 above expert 1, but the weights stay the
         * unbiased sigmoids, normalised, times 2.5. */
        const float lg[4] = {2, 1, 0, -1}, bias[4] = {0, 0, 1, 0}, zero[4] = {0};
        float s0 = sigmoid(2), s1 = sigmoid(1), s2 = sigmoid(0);
        BkMoeConfig v3 = {.n_routed = 4,
                .top_k = 2,
                .n_group = 1,
                .topk_group = 1,
                .topk_method = BK_TOPK_NOAUX_TC,
                .scoring = BK_SCORING_SIGMOID,
                .norm_topk_prob = true,
                .routed_scaling_factor = 2.5f};
        route(&v3, lg, zero, (uint32_t[]){0, 1},
                (float[]){2.5f * s0 / (s0 + s1), 2.5f * s1 / (s0 + s1)}, "noaux_tc, no bias");
        route(&v3, lg, bias, (uint32_t[]){0, 2},
                (float[]){2.5f * s0 / (s0 + s2), 2.5f * s2 / (s0 + s2)},
                "noaux_tc, the bias changes the choice");
        v3.norm_topk_prob = false;
        route(&v3, lg, bias, (uint32_t[]){0, 2}, (float[]){2.5f * s0, 2.5f * s2},
                "noaux_tc, not normalised, still scaled");

        /* Groups of 2 ranked by their top-2 sums (1.1, 2.6, -3, -3): groups 1 and 0 are
         * kept, and all four of their experts are taken, expert 1 at -0.4 included, even
         * though the dropped experts' unbiased sigmoids are as large. */
        const float flat[8] = {0};
        const float nbias[8] = {1, -0.9f, 0.8f, 0.8f, -2, -2, -2, -2};
        BkMoeConfig v3g = {.n_routed = 8,
                .top_k = 4,
                .n_group = 4,
                .topk_group = 2,
                .topk_method = BK_TOPK_NOAUX_TC,
                .scoring = BK_SCORING_SIGMOID,
                .norm_topk_prob = true,
                .routed_scaling_factor = 1.0f};
        route(&v3g, flat, nbias, (uint32_t[]){0, 1, 2, 3}, (float[]){0.25f, 0.25f, 0.25f, 0.25f},
                "noaux_tc, groups ranked by top-2 sums, negative kept value");
        return 0;
}
