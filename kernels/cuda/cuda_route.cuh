/* SPDX-License-Identifier: MIT */
/* Routing a row and grouping pairs by expert, as device code: the routing kernels
 * (cuda_moe.cu) and add_norm's router epilogue (cuda_kernels.cu) both run it. */
#pragma once

#include <float.h>

#include "cuda_deepseek.cuh"

/* Routed experts a routing warp holds (8 per lane); warps per routing block, and so the
 * rows up to which one block routes and groups (k_moe_route_group). */
#define ROUTE_MAX   256
#define ROUTE_WARPS 8

static __device__ __forceinline__ uint32_t lanes_below(uint32_t lane)
{
        return (1u << lane) - 1u;
}

/* The index of the largest v[i] over lanes' candidates (i, v), the lowest i on a tie, as
 * cpu_moe_route's take_max picks: every lane gets it. */
static __device__ __forceinline__ uint32_t warp_argmax(float v, uint32_t i)
{
        for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, v, o);
                uint32_t oi = __shfl_xor_sync(0xffffffffu, i, o);
                /* bitwise, without a branch that splits the warp (see take_top_k) */
                bool take = (ov > v) | ((ov == v) & (oi < i));
                v = take ? ov : v;
                i = take ? oi : i;
        }
        return i;
}

/* The best untaken entry of v (n entries in shared memory, taken flags beside), the lowest
 * index on a tie; an untaken -inf still beats nothing, as on the CPU. */
static __device__ uint32_t take_best(const float *v, const bool *taken, uint32_t n, uint32_t lane)
{
        float bv = -INFINITY;
        uint32_t bi = UINT32_MAX;
        for (uint32_t i = lane; i < n; i += 32)
                if (!taken[i] && (bi == UINT32_MAX || v[i] > bv)) {
                        bv = v[i];
                        bi = i;
                }
        return warp_argmax(bi == UINT32_MAX ? -FLT_MAX : bv, bi);
}

/* Top-k of choice (E <= 32 NI values in shared memory): expert e is taken when fewer than
 * top_k experts rank above it (a larger choice value, or an equal one at a lower id), which
 * is what top_k rounds of take_max take. Lane l ranks experts l + 32 i, all lanes at once;
 * the taken go into ri in ascending id, their scores into sel. Each comparison is bitwise,
 * not a short-circuit ||: compiled as a branch on which the lanes disagree, each split the
 * warp and joined it again, and ranking V2-Lite's 64 experts took 2.25 us of the routing
 * add_norm's 7.4 (V2-Lite batch 1 1.7% faster without; docs/PERF.md, thirtieth session). */
template <int NI>
static __device__ __forceinline__ void take_top_k(const float *choice, const float *scores, uint32_t E,
        uint32_t top_k, uint32_t lane, uint32_t *ri, float *sel)
{
        float cv[NI];
        uint32_t rk[NI];
#pragma unroll
        for (int i = 0; i < NI; i++) {
                uint32_t e = lane + 32 * i;
                cv[i] = e < E ? choice[e] : 0.0f;
                rk[i] = 0;
        }
#pragma unroll 4
        for (uint32_t j = 0; j < E; j++) {
                float v = choice[j];
#pragma unroll
                for (int i = 0; i < NI; i++)
                        rk[i] += (uint32_t) (v > cv[i]) |
                                 ((uint32_t) (v == cv[i]) & (uint32_t) (j < lane + 32 * i));
        }
        uint32_t k = 0;
#pragma unroll
        for (int i = 0; i < NI; i++) {
                uint32_t e = lane + 32 * i;
                bool tk = e < E && rk[i] < top_k;
                uint32_t mask = __ballot_sync(0xffffffffu, tk);
                if (tk) {
                        uint32_t at = k + __popc(mask & lanes_below(lane));
                        ri[at] = e;
                        sel[at] = scores[e];
                }
                k += __popc(mask);
        }
}

/* The calling warp routes row r, following cpu_moe_route step by step. */
static __device__ void route_row(const float *logits, uint32_t splits, size_t stride,
        const float *__restrict__ bias, const CuRoute &rt, uint32_t r, uint32_t *idx, float *w)
{
        __shared__ float sc_all[ROUTE_WARPS][ROUTE_MAX], ch_all[ROUTE_WARPS][ROUTE_MAX];
        __shared__ float sel_all[ROUTE_WARPS][ROUTE_MAX];
        const uint32_t full = 0xffffffffu;
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, E = rt.n_routed;
        float *scores = sc_all[warp], *choice = ch_all[warp], *sel = sel_all[warp];
        const float *lg = logits + (size_t) r * E;

        /* scores */
        float m = -FLT_MAX;
        for (uint32_t e = lane; e < E; e += 32) {
                float v = 0.0f;
                for (uint32_t s = 0; s < splits; s++)
                        v += lg[s * stride + e];
                scores[e] = v;
                m = fmaxf(m, v);
        }
        for (int o = 16; o > 0; o >>= 1)
                m = fmaxf(m, __shfl_xor_sync(full, m, o));
        float sum = 0.0f;
        for (uint32_t e = lane; e < E; e += 32) {
                if (rt.scoring == BK_SCORING_SOFTMAX) {
                        scores[e] = expf(scores[e] - m);
                        sum += scores[e];
                } else
                        scores[e] = 1.0f / (1.0f + expf(-scores[e]));
        }
        for (int o = 16; o > 0; o >>= 1)
                sum += __shfl_xor_sync(full, sum, o);
        for (uint32_t e = lane; e < E; e += 32) {
                if (rt.scoring == BK_SCORING_SOFTMAX)
                        scores[e] /= sum;
                choice[e] = scores[e] + (rt.topk_method == BK_TOPK_NOAUX_TC && bias ? bias[e] : 0.0f);
        }
        __syncwarp();

        /* group limit: rank the groups by their best (noaux_tc: best two) choice values and
         * drop the experts outside the topk_group best */
        if (rt.topk_method != BK_TOPK_GREEDY) {
                __shared__ float gv_all[ROUTE_WARPS][32];
                __shared__ bool gk_all[ROUTE_WARPS][32];
                float *gv = gv_all[warp];
                bool *gk = gk_all[warp];
                uint32_t per = E / rt.n_group;
                if (lane < rt.n_group) {
                        float top1 = -INFINITY, top2 = -INFINITY;
                        for (uint32_t i = 0; i < per; i++) {
                                float v = choice[lane * per + i];
                                if (v > top1) {
                                        top2 = top1;
                                        top1 = v;
                                } else if (v > top2)
                                        top2 = v;
                        }
                        gv[lane] = rt.topk_method == BK_TOPK_NOAUX_TC ? top1 + top2 : top1;
                        gk[lane] = false;
                }
                __syncwarp();
                for (uint32_t i = 0; i < rt.topk_group; i++) {
                        uint32_t g = take_best(gv, gk, rt.n_group, lane);
                        if (lane == 0)
                                gk[g] = true;
                        __syncwarp();
                }
                for (uint32_t e = lane; e < E; e += 32)
                        if (!gk[e / per])
                                choice[e] = -INFINITY;
                __syncwarp();
        }

        /* top-k, by the lane's NI columns of 32 experts (the count compiled in, so that the
         * loop over experts compares only those) */
        uint32_t K = rt.top_k + rt.n_shared;
        uint32_t *ri = idx + (size_t) r * K;
        if (E <= 32)
                take_top_k<1>(choice, scores, E, rt.top_k, lane, ri, sel);
        else if (E <= 64)
                take_top_k<2>(choice, scores, E, rt.top_k, lane, ri, sel);
        else if (E <= 128)
                take_top_k<4>(choice, scores, E, rt.top_k, lane, ri, sel);
        else
                take_top_k<ROUTE_MAX / 32>(choice, scores, E, rt.top_k, lane, ri, sel);
        float *rw = w + (size_t) r * K;
        __syncwarp();
        bool norm = rt.norm_topk_prob && (rt.topk_method == BK_TOPK_NOAUX_TC || rt.top_k > 1);
        float s = 0.0f;
        if (norm)
                for (uint32_t i = 0; i < rt.top_k; i++)
                        s += sel[i];
        for (uint32_t i = lane; i < rt.top_k; i += 32) {
                float v = sel[i];
                if (norm)
                        v /= s + 1e-20f;
                if (!norm || rt.topk_method == BK_TOPK_NOAUX_TC)
                        v *= rt.routed_scaling_factor;
                rw[i] = v;
        }
        for (uint32_t j = lane; j < rt.n_shared; j += 32) {
                ri[rt.top_k + j] = E + j;
                rw[rt.top_k + j] = 1.0f;
        }
}

/* The block groups the pairs (see cu_moe_group): counts per expert, then warp 0 puts the
 * touched experts into the first slots in ascending id with their ranges of the list (a
 * scan over the counts, and one over the slots each takes), then each pair goes into its
 * expert's range. */
static __device__ void group_pairs(const uint32_t *idx, uint32_t n_pairs, uint32_t E, uint32_t n_slots,
        uint32_t slot_rows, uint32_t *ids, uint32_t *off, uint32_t *list)
{
        __shared__ uint32_t cnt[ROUTE_MAX + 16], cur[ROUTE_MAX + 16];
        const uint32_t full = 0xffffffffu;

        for (uint32_t e = threadIdx.x; e < E; e += blockDim.x) {
                cnt[e] = 0;
                cur[e] = 0;
        }
        __syncthreads();
        for (uint32_t p = threadIdx.x; p < n_pairs; p += blockDim.x)
                atomicAdd(&cnt[idx[p]], 1u);
        __syncthreads();
        if (threadIdx.x < 32) {
                uint32_t lane = threadIdx.x, s = 0, j = 0;
                for (uint32_t e0 = 0; e0 < E; e0 += 32) {
                        uint32_t e = e0 + lane, c = e < E ? cnt[e] : 0, inc = c;
                        uint32_t ns = c == 0 ? 0 : slot_rows ? (c + slot_rows - 1) / slot_rows : 1;
                        uint32_t sinc = ns;
#pragma unroll
                        for (int o = 1; o < 32; o <<= 1) {
                                uint32_t v = __shfl_up_sync(full, inc, o);
                                uint32_t w = __shfl_up_sync(full, sinc, o);
                                if (lane >= (uint32_t) o) {
                                        inc += v;
                                        sinc += w;
                                }
                        }
                        if (e < E)
                                cnt[e] = s + inc - c;
                        for (uint32_t q = 0; q < ns; q++) {
                                ids[j + sinc - ns + q] = e;
                                off[j + sinc - ns + q] = s + inc - c + q * slot_rows;
                        }
                        s += __shfl_sync(full, inc, 31);
                        j += __shfl_sync(full, sinc, 31);
                }
                for (uint32_t i = j + lane; i < n_slots; i += 32) {
                        ids[i] = 0;
                        off[i] = s;
                }
                if (lane == 0)
                        off[n_slots] = s;
        }
        __syncthreads();
        for (uint32_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
                uint32_t e = idx[p];
                list[cnt[e] + atomicAdd(&cur[e], 1u)] = p;
        }
}

/* group_pairs for one row, by the calling warp: a row's K <= 32 experts are distinct (its
 * top-k, then the shared experts E, E + 1, ...), so each touched expert takes one slot in
 * ascending id, and the slot's one pair is the row's. Lane p ranks its expert against the
 * others by shuffles: the same ids, off and list as group_pairs, without its barriers. */
static __device__ void group_one_row(const uint32_t *idx, uint32_t K, uint32_t n_slots,
        uint32_t *ids, uint32_t *off, uint32_t *list)
{
        const uint32_t full = 0xffffffffu;
        uint32_t lane = threadIdx.x % 32, e = lane < K ? idx[lane] : 0xffffffffu, rank = 0;
        for (uint32_t q = 0; q < K; q++)
                rank += __shfl_sync(full, e, q) < e;
        if (lane < K) {
                ids[rank] = e;
                off[rank] = rank;
                list[rank] = lane;
        }
        for (uint32_t i = K + lane; i < n_slots; i += 32) {
                ids[i] = 0;
                off[i] = K;
        }
        if (lane == 0)
                off[n_slots] = K;
}
