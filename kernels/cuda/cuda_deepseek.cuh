/* SPDX-License-Identifier: MIT */
/* Kernels of the DeepSeek layers (cuda_mla.cu, cuda_moe.cu), driven by cuda_backend.cu.
 *
 * MLA decodes in the absorbed form (docs/kernels.md of shared/, §3): the cache holds per
 * position one latent row [kv_a_layernorm(c_kv) | roped k_pe] of W = rank + R FP16 values;
 * each head's q_nope goes through W_UK into the latent space, so attention is one shared
 * W-wide key "head" and a rank-wide value "head" for all query heads; the attention's
 * latent output goes through W_UV. W_UK and W_UV are kv_b_proj split at load, FP16, each
 * head's matrix A (M, K) of the tensor-core product out = A · in stored in mma.m16n8k16
 * fragment order (cuda_mla.cu):
 *   wk  A (rank, P)   A[c][p] = kv_b.W[h (P + Vd) + p][c]
 *   wvt A (Vd, rank)  A[v][c] = kv_b.W[h (P + Vd) + P + v][c]
 * Queries are FP16 (rows, H, W): the latent query then the roped q_pe.
 *
 * MoE routes on the device (one warp a row, as cpu_moe_route decides), groups the
 * (row, k) pairs by expert (cu_moe_group; up to 8 rows in the routing's launch), runs the
 * experts through cu_gemv_experts, or cu_gemm_experts when they get many rows, and sums
 * the pairs' outputs with their weights plus the shared experts' in a fixed order. */
#pragma once

extern "C" {
#include "backend.h"
}
#include "cuda_kernels.cuh"

/* Query heads one MLA attention block holds; more heads take more blocks. */
#define MLA_HEADS 16
/* Latent rows the MLA attention kernel stages at a time. */
#define MLA_CHUNK 32
/* Positions of an MLA item outside small decode steps: five chunks of the attention
 * kernel, so that 64 rows at a 512-position context are 256 items, one wave of its two
 * blocks per SM (128-position items made 320, two waves). */
#define MLA_ITEM 160
/* Widest latent row (rank + R) and latent (rank) the MLA kernels hold. */
#define MLA_WIDTH_MAX 640
#define MLA_RANK_MAX  512

/* Where a row's latent comes from and goes: the fused linear's partials (row stride ld) at
 * columns col0 .. col0 + rank + R, and the layer's cache (rows of rank + R). */
typedef struct CuMlaKv {
        const float *part;
        uint32_t splits;
        size_t stride;
        const float *bias;
        uint32_t ld, col0, rank, R;
        const float *norm_w;
        float eps;
        const float *inv_freq;
        float af;
        __half *cache;
} CuMlaKv;

/* Writes rmsnorm(c_kv) * norm_w and the interleaved-roped k_pe as FP16 into the cache at
 * each row's slot. */
void cu_mla_kv(cudaStream_t st, const CuMlaKv *kv, CuMeta meta, uint32_t rows);

/* xq (rows, n) FP16 = rmsnorm of the partials' columns 0 .. n (row stride ld) * norm_w: the
 * q LoRA's q_a_layernorm. */
void cu_mla_q_norm(cudaStream_t st, const float *part, uint32_t splits, size_t slice_stride,
        const float *bias, uint32_t ld, uint32_t n, uint32_t rows, const float *norm_w,
        float eps, __half *xq);

/* From the partials' columns 0 .. H (P + R) (row stride ld) of each row, q (rows, H,
 * rank + R): q_nope · W_UK, then the interleaved-roped q_pe; with kv (else NULL), the same
 * launch does what cu_mla_kv does. */
void cu_mla_absorb(cudaStream_t st, const float *part, uint32_t splits, size_t slice_stride,
        const float *bias, uint32_t ld, CuMeta meta, uint32_t rows, uint32_t H, uint32_t P,
        uint32_t R, uint32_t rank, const float *inv_freq, float af, const __half *wk, __half *q,
        const CuMlaKv *kv);

/* Attention partials over the latent cache, one block per (work item, group of MLA_HEADS
 * heads), or two with v_split (each with half of the rank's dimensions; where rank is a
 * multiple of 128), items read from meta as cu_attention does: acc (item, H, rank), ml
 * (item, H), which cu_attention_combine merges (head_dim = rank). */
void cu_mla_attention(cudaStream_t st, const __half *q, const __half *cache, CuMeta meta,
        uint32_t grid, uint32_t v_split, uint32_t block_tokens, uint32_t H, uint32_t rank,
        uint32_t R, float scale, float *acc, float2 *ml);

/* out (rows, H, Vd) FP16 = o_lat (rows, H, rank) · wvt. */
void cu_mla_values(cudaStream_t st, const __half *o_lat, const __half *wvt, uint32_t rows,
        uint32_t H, uint32_t rank, uint32_t Vd, __half *out);

/* Splits w16 = kv_b.W (H (P + Vd), rank) FP16 into wk and wvt (layouts above; P, Vd and
 * rank multiples of 16, rank of 64). */
void cu_mla_split_kvb(cudaStream_t st, const __half *w16, uint32_t H, uint32_t P, uint32_t Vd,
        uint32_t rank, __half *wk, __half *wvt);

/* How a layer routes: BkMoeConfig's numbers, for the device. */
typedef struct CuRoute {
        uint32_t n_routed, top_k, n_group, topk_group;
        int topk_method; /* BkTopkMethod */
        int scoring;     /* BkScoring */
        bool norm_topk_prob;
        float routed_scaling_factor;
        uint32_t n_shared; /* shared expert slices appended to each row, at weight 1 */
} CuRoute;

/* A MoE layer's router in the add_norm before it (cu_add_norm, cu_add_norm_routes): the
 * logits (rows, n_routed) of the FP16 router w (n_routed, kp) on the normed rows; at one
 * row, with idx set, also the routing and grouping cu_moe_route_group would do with
 * them, so that neither the router's GEMV nor the routing is a launch of its own. */
typedef struct CuNormRouter {
        const __half *w;
        uint32_t kp;
        float *logits;
        const float *bias; /* e_score_correction_bias or NULL */
        CuRoute rt;
        uint32_t *idx;
        float *rw;
        uint32_t n_slots, slot_rows;
        uint32_t *ids, *off, *list;
} CuNormRouter;

/* Each row's top_k experts in ascending id and their weights, from the router logits
 * (partials, row stride n_routed) as cpu_moe_route decides, then its n_shared shared
 * slices (experts n_routed ..) at weight 1: idx, w (rows, top_k + n_shared). bias:
 * e_score_correction_bias or NULL. */
void cu_moe_route(cudaStream_t st, const float *logits, uint32_t splits, size_t slice_stride,
        const float *bias, CuRoute rt, uint32_t rows, uint32_t *idx, float *w);

/* Groups the pairs p < n_pairs (p = row * top_k + k) by expert into the n_slots of
 * cu_gemv_experts: the touched experts in ascending id in the first slots (ids), their
 * pairs' ranges of list (off, n_slots + 1), empty slots after them. slot_rows 0: one slot
 * an expert (n_slots at least the touched experts); else an expert of c pairs takes
 * ceil(c / slot_rows) slots in a row, slot_rows pairs each but the last (n_slots at least
 * the touched experts plus n_pairs / slot_rows). The order within an expert is not fixed;
 * nothing depends on it. */
void cu_moe_group(cudaStream_t st, const uint32_t *idx, uint32_t n_pairs, uint32_t n_experts,
        uint32_t n_slots, uint32_t slot_rows, uint32_t *ids, uint32_t *off, uint32_t *list);

/* cu_moe_route then cu_moe_group over its pairs (rows * (top_k + n_shared) of n_routed +
 * n_shared experts), in one launch up to 8 rows. */
void cu_moe_route_group(cudaStream_t st, const float *logits, uint32_t splits,
        size_t slice_stride, const float *bias, CuRoute rt, uint32_t rows, uint32_t *idx,
        float *w, uint32_t n_slots, uint32_t slot_rows, uint32_t *ids, uint32_t *off,
        uint32_t *list);

/* One (pair, slice) partial x of a MoE sum at one element: d sums the pair's slices in
 * order, and its last slice adds d times the pair's weight wk to y. k_moe_combine and
 * add_norm's MoE sum both take this and moe_shared, so they make the same bits. */
__device__ __forceinline__ void moe_pair_add(float x, float wk, uint32_t s, uint32_t splits,
        float &d, float &y)
{
        d = s == 0 ? x : d + x;
        if (s + 1 == splits)
                y = fmaf(d, wk, y);
}

/* The shared experts' partial slices at element at, in slice order. */
__device__ __forceinline__ float moe_shared(const float *shared, uint32_t splits, size_t stride,
        size_t at)
{
        float e = 0.0f;
        for (uint32_t s = 0; s < splits; s++)
                e += shared[s * stride + at];
        return e;
}

/* y (rows, hidden) = sum over k of w[r][k] * (sum of the routed partials' slices of pair
 * r * top_k + k), then plus the shared experts' partials (NULL when none), in that order. */
void cu_moe_combine(cudaStream_t st, const float *routed, uint32_t r_splits, size_t r_stride,
        const float *w, uint32_t top_k, const float *shared, uint32_t s_splits, size_t s_stride,
        uint32_t rows, uint32_t hidden, float *y);
