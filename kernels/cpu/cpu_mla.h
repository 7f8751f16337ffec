/* SPDX-License-Identifier: MIT */
/* Multi-head latent attention's two weight products in the absorbed form. kv_b_proj holds,
 * per head h, W_UK[h] (kv_lora_rank × P) and W_UV[h] (kv_lora_rank × Vd) side by side in
 * its [in][out] view. Instead of expanding every cached latent into per-head keys and
 * values, a query's nope part is mapped into the latent space once (q·W_UK^T), scored
 * against the cached latents directly, and the weighted latent sum is mapped out through
 * W_UV. Both products walk kv_lora_rank in ascending order for every row, so a row's result
 * does not depend on the other rows of the tile. */
#pragma once

#include <stdint.h>

#include "backend.h"

/* q_lat (rows, n_heads, kv_lora_rank): q_lat[r][h][k] = Σ_p q[r][h][p] · W_UK[h][k][p] for
 * the nope part p < P of each head of q (rows, n_heads, P + R). wrow holds kv_b->out
 * floats. */
void cpu_mla_absorb_q(const BkConfig *c, const BkLinear *kv_b, const float *q, uint32_t rows,
        float *q_lat, float *wrow);

/* out (rows, n_heads, Vd): out[r][h][v] = Σ_k o_lat[r][h][k] · W_UV[h][k][v] for o_lat
 * (rows, n_heads, kv_lora_rank). wrow holds kv_b->out floats. */
void cpu_mla_values(const BkConfig *c, const BkLinear *kv_b, const float *o_lat, uint32_t rows,
        float *out, float *wrow);
