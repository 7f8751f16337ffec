/* SPDX-License-Identifier: MIT */
/* DeepSeek MoE routing for one token, in float32, following transformers 5.17's
 * DeepseekV2Moe / DeepseekV3TopkRouter and docs/formats.md:
 * - scores: softmax (V2) or sigmoid (V3) of the router logits;
 * - choice: the scores, plus e_score_correction_bias for noaux_tc;
 * - group_limited_greedy keeps the topk_group groups of best max choice, noaux_tc those of
 *   best top-2 sum, and experts outside them are never picked (transformers 5.17 ranks them
 *   at -inf: with a negative bias, a kept expert's choice value can be below 0, and the
 *   golden logits show it still wins over every expert of a dropped group);
 * - top_k of the choice values, ties to the lower id;
 * - weights: the unbiased scores of the chosen experts. noaux_tc: divided by their sum
 *   (+1e-20) when norm_topk_prob, then times routed_scaling_factor. softmax: divided by
 *   their sum (+1e-20) when top_k > 1 and norm_topk_prob, else times
 *   routed_scaling_factor. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* Floats of scratch cpu_moe_route() needs. */
size_t cpu_moe_route_scratch(const BkMoeConfig *mc);

/* Chooses mc->top_k experts from logits (n_routed). bias is e_score_correction_bias
 * (n_routed) for noaux_tc and ignored otherwise. ret_idx (top_k) gets the expert ids in
 * ascending order, the order their outputs are summed in, and ret_w (top_k) their
 * weights. */
void cpu_moe_route(const BkMoeConfig *mc, const float *logits, BkTensor bias, float *scratch,
        uint32_t *ret_idx, float *ret_w);
