/* SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdbool.h>

#include "cpu_linear.h"
#include "cpu_moe.h"

size_t cpu_moe_route_scratch(const BkMoeConfig *mc)
{
        return 3 * (size_t) mc->n_routed + mc->n_group;
}

/* Marks taken (nonzero) the largest v[i] not yet taken, the lowest such i on a tie. */
static void take_max(const float *v, float *taken, uint32_t n)
{
        uint32_t best = UINT32_MAX;

        for (uint32_t i = 0; i < n; i++)
                if (taken[i] == 0.0f && (best == UINT32_MAX || v[i] > v[best]))
                        best = i;
        taken[best] = 1.0f;
}

void cpu_moe_route(const BkMoeConfig *mc, const float *logits, BkTensor bias, float *scratch,
        uint32_t *ret_idx, float *ret_w)
{
        uint32_t E = mc->n_routed, per_group = E / mc->n_group;
        float *scores = scratch;                 /* (E) */
        float *choice = scratch + E;             /* (E) */
        float *taken = scratch + 2 * (size_t) E; /* (E) 1 for a kept group, then expert */
        float *group = scratch + 3 * (size_t) E; /* (n_group) each group's rank value */

        /* scores */
        if (mc->scoring == BK_SCORING_SOFTMAX) {
                float max = -INFINITY, sum = 0.0f;
                for (uint32_t e = 0; e < E; e++)
                        max = fmaxf(max, logits[e]);
                for (uint32_t e = 0; e < E; e++) {
                        scores[e] = expf(logits[e] - max);
                        sum += scores[e];
                }
                for (uint32_t e = 0; e < E; e++)
                        scores[e] /= sum;
        } else
                for (uint32_t e = 0; e < E; e++)
                        scores[e] = 1.0f / (1.0f + expf(-logits[e]));

        /* choice values: the scores, biased for noaux_tc */
        for (uint32_t e = 0; e < E; e++)
                choice[e] = scores[e] + (mc->topk_method == BK_TOPK_NOAUX_TC && bias.data
                                                        ? cpu_tensor_get(bias, e)
                                                        : 0.0f);

        /* group limit: rank the groups, zero the choice values outside the best ones */
        if (mc->topk_method != BK_TOPK_GREEDY) {
                for (uint32_t g = 0; g < mc->n_group; g++) {
                        const float *cg = choice + (size_t) g * per_group;
                        float top1 = -INFINITY, top2 = -INFINITY;
                        for (uint32_t i = 0; i < per_group; i++) {
                                if (cg[i] > top1) {
                                        top2 = top1;
                                        top1 = cg[i];
                                } else if (cg[i] > top2)
                                        top2 = cg[i];
                        }
                        group[g] = mc->topk_method == BK_TOPK_NOAUX_TC ? top1 + top2 : top1;
                }
                for (uint32_t g = 0; g < mc->n_group; g++)
                        taken[g] = 0.0f;
                for (uint32_t i = 0; i < mc->topk_group; i++)
                        take_max(group, taken, mc->n_group);
                for (uint32_t e = 0; e < E; e++)
                        if (taken[e / per_group] == 0.0f)
                                choice[e] = -INFINITY;
        }

        /* top-k, then in ascending expert order */
        for (uint32_t e = 0; e < E; e++)
                taken[e] = 0.0f;
        for (uint32_t i = 0; i < mc->top_k; i++)
                take_max(choice, taken, E);
        uint32_t k = 0;
        for (uint32_t e = 0; e < E && k < mc->top_k; e++)
                if (taken[e] != 0.0f) {
                        ret_idx[k] = e;
                        ret_w[k++] = scores[e];
                }

        /* weights */
        bool norm = mc->norm_topk_prob && (mc->topk_method == BK_TOPK_NOAUX_TC || mc->top_k > 1);
        if (norm) {
                float sum = 0.0f;
                for (uint32_t i = 0; i < mc->top_k; i++)
                        sum += ret_w[i];
                for (uint32_t i = 0; i < mc->top_k; i++)
                        ret_w[i] /= sum + 1e-20f;
        }
        if (!norm || mc->topk_method == BK_TOPK_NOAUX_TC)
                for (uint32_t i = 0; i < mc->top_k; i++)
                        ret_w[i] *= mc->routed_scaling_factor;
}
