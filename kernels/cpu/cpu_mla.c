/* SPDX-License-Identifier: MIT */
#include <string.h>

#include "cpu_linear.h"
#include "cpu_mla.h"

void cpu_mla_absorb_q(const BkConfig *c, const BkLinear *kv_b, const float *q, uint32_t rows,
        float *q_lat, float *wrow)
{
        const BkMlaConfig *m = &c->mla;
        uint32_t P = m->qk_nope_dim, qk = P + m->qk_rope_dim, kv = P + m->v_head_dim;
        uint32_t rank = m->kv_lora_rank, N = c->n_heads;

        /* One dequantized latent row of W serves every row of the tile. */
        for (uint32_t k = 0; k < rank; k++) {
                cpu_linear_row(kv_b, k, wrow);
                for (uint32_t r = 0; r < rows; r++)
                        for (uint32_t h = 0; h < N; h++) {
                                const float *qn = q + ((size_t) r * N + h) * qk;
                                const float *wk = wrow + (size_t) h * kv;
                                float sum = 0.0f;
                                for (uint32_t p = 0; p < P; p++)
                                        sum += qn[p] * wk[p];
                                q_lat[((size_t) r * N + h) * rank + k] = sum;
                        }
        }
}

void cpu_mla_values(const BkConfig *c, const BkLinear *kv_b, const float *o_lat, uint32_t rows,
        float *out, float *wrow)
{
        const BkMlaConfig *m = &c->mla;
        uint32_t P = m->qk_nope_dim, V = m->v_head_dim, kv = P + V;
        uint32_t rank = m->kv_lora_rank, N = c->n_heads;

        memset(out, 0, (size_t) rows * N * V * sizeof(float));
        for (uint32_t k = 0; k < rank; k++) {
                cpu_linear_row(kv_b, k, wrow);
                for (uint32_t r = 0; r < rows; r++)
                        for (uint32_t h = 0; h < N; h++) {
                                float a = o_lat[((size_t) r * N + h) * rank + k];
                                const float *wv = wrow + (size_t) h * kv + P;
                                float *o = out + ((size_t) r * N + h) * V;
                                for (uint32_t v = 0; v < V; v++)
                                        o[v] += a * wv[v];
                        }
        }
}
