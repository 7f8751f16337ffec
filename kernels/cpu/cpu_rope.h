/* SPDX-License-Identifier: MIT */
/* Rotary position embeddings, "rotate-half" style, with the float32 arithmetic of
 * transformers' rope initialisation functions so that angles match it bit for bit where
 * libm agrees with PyTorch's. */
#pragma once

#include <stdint.h>

#include "backend.h"

/* Fills inv_freq (head_dim/2) and *ret_attention_factor (what cos and sin are multiplied
 * by) for rope->type. Returns 0, or -DS_ERR_UNSUPPORTED / -EINVAL with err filled. */
int cpu_rope_init(const BkRope *rope, uint32_t head_dim, float *inv_freq,
        float *ret_attention_factor, DsError *err);

/* cos/sin (head_dim/2) of position pos times inv_freq, times attention_factor. */
void cpu_rope_angles(const float *inv_freq, uint32_t head_dim, float attention_factor, uint32_t pos,
        float *cos_out, float *sin_out);

/* Rotates the n_heads heads of x (n_heads, head_dim) in place: element i pairs with
 * element i + head_dim/2. */
void cpu_rope_apply(
        float *x, uint32_t n_heads, uint32_t head_dim, const float *cos_in, const float *sin_in);

/* Rotates one vector x (dim) in place with interleaved pairs (2i, 2i+1), as DeepSeek's
 * MLA does on its rope part: transformers' complex multiply (V2) and its
 * de-interleave-then-rotate-half (V3) give these values, the latter in the order
 * evens-then-odds, which no dot product between rotated vectors can tell apart. */
void cpu_rope_apply_pairs(float *x, uint32_t dim, const float *cos_in, const float *sin_in);
