/* SPDX-License-Identifier: MIT */
/* Mixture-of-experts kernels (see cuda_deepseek.cuh): routing, grouping by expert, and the
 * weighted sum. The expert matrices themselves run in cu_gemv_experts. */
#include <float.h>

#include "cuda_deepseek.cuh"
#include "cuda_ptx.cuh"

/* Routed experts a routing warp holds (8 per lane); warps per routing block, and so the
 * rows up to which one block routes and groups (k_moe_route_group). */
#define ROUTE_MAX   256
#define ROUTE_WARPS 8

static inline uint32_t div_up(uint32_t a, uint32_t b)
{
        return (a + b - 1) / b;
}

__device__ __forceinline__ uint32_t lanes_below(uint32_t lane)
{
        return (1u << lane) - 1u;
}

/* The index of the largest v[i] over lanes' candidates (i, v), the lowest i on a tie, as
 * cpu_moe_route's take_max picks: every lane gets it. */
__device__ __forceinline__ uint32_t warp_argmax(float v, uint32_t i)
{
        for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, v, o);
                uint32_t oi = __shfl_xor_sync(0xffffffffu, i, o);
                if (ov > v || (ov == v && oi < i)) {
                        v = ov;
                        i = oi;
                }
        }
        return i;
}

/* The best untaken entry of v (n entries in shared memory, taken flags beside), the lowest
 * index on a tie; an untaken -inf still beats nothing, as on the CPU. */
__device__ uint32_t take_best(const float *v, const bool *taken, uint32_t n, uint32_t lane)
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
 * the taken go into ri in ascending id, their scores into sel. */
template <int NI>
__device__ __forceinline__ void take_top_k(const float *choice, const float *scores, uint32_t E,
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
                        rk[i] += v > cv[i] || (v == cv[i] && j < lane + 32 * i);
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
__device__ void route_row(const float *logits, uint32_t splits, size_t stride,
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

/* One warp per row. */
__global__ void __launch_bounds__(ROUTE_WARPS * 32) k_moe_route(const float *logits,
        uint32_t splits, size_t stride, const float *__restrict__ bias, CuRoute rt, uint32_t rows,
        uint32_t *idx, float *w)
{
        pdl_wait();
        pdl_trigger();
        uint32_t r = blockIdx.x * ROUTE_WARPS + threadIdx.x / 32;
        if (r < rows)
                route_row(logits, splits, stride, bias, rt, r, idx, w);
}

void cu_moe_route(cudaStream_t st, const float *logits, uint32_t splits, size_t slice_stride,
        const float *bias, CuRoute rt, uint32_t rows, uint32_t *idx, float *w)
{
        k_moe_route<<<div_up(rows, ROUTE_WARPS), ROUTE_WARPS * 32, 0, st>>>(logits, splits,
                slice_stride, bias, rt, rows, idx, w);
}

/* The block groups the pairs (see cu_moe_group): counts per expert, then warp 0 puts the
 * touched experts into the first slots in ascending id with their ranges of the list (a
 * scan over the counts, and one over the slots each takes), then each pair goes into its
 * expert's range. */
__device__ void group_pairs(const uint32_t *idx, uint32_t n_pairs, uint32_t E, uint32_t n_slots,
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

__global__ void k_moe_group(const uint32_t *idx, uint32_t n_pairs, uint32_t E, uint32_t n_slots,
        uint32_t slot_rows, uint32_t *ids, uint32_t *off, uint32_t *list)
{
        pdl_wait();
        pdl_trigger();
        group_pairs(idx, n_pairs, E, n_slots, slot_rows, ids, off, list);
}

/* One block of a warp per row routes, then groups what it routed (idx is read back after
 * the barrier, which makes the block's writes visible to it). */
__global__ void __launch_bounds__(ROUTE_WARPS * 32) k_moe_route_group(
        const float *logits, uint32_t splits, size_t stride,
        const float *__restrict__ bias, CuRoute rt, uint32_t rows, uint32_t *idx, float *w,
        uint32_t n_slots, uint32_t slot_rows, uint32_t *ids, uint32_t *off, uint32_t *list)
{
        pdl_wait();
        pdl_trigger();
        uint32_t r = threadIdx.x / 32;
        if (r < rows)
                route_row(logits, splits, stride, bias, rt, r, idx, w);
        __syncthreads();
        group_pairs(idx, rows * (rt.top_k + rt.n_shared), rt.n_routed + rt.n_shared, n_slots,
                slot_rows, ids, off, list);
}

void cu_moe_group(cudaStream_t st, const uint32_t *idx, uint32_t n_pairs, uint32_t n_experts,
        uint32_t n_slots, uint32_t slot_rows, uint32_t *ids, uint32_t *off, uint32_t *list)
{
        k_moe_group<<<1, 1024, 0, st>>>(idx, n_pairs, n_experts, n_slots, slot_rows, ids, off,
                list);
}

void cu_moe_route_group(cudaStream_t st, const float *logits, uint32_t splits,
        size_t slice_stride, const float *bias, CuRoute rt, uint32_t rows, uint32_t *idx,
        float *w, uint32_t n_slots, uint32_t slot_rows, uint32_t *ids, uint32_t *off,
        uint32_t *list)
{
        if (rows > ROUTE_WARPS) {
                cu_moe_route(st, logits, splits, slice_stride, bias, rt, rows, idx, w);
                cu_moe_group(st, idx, rows * (rt.top_k + rt.n_shared), rt.n_routed + rt.n_shared,
                        n_slots, slot_rows, ids, off, list);
                return;
        }
        k_moe_route_group<<<1, rows * 32, 0, st>>>(logits, splits, slice_stride, bias, rt, rows,
                idx, w, n_slots, slot_rows, ids, off, list);
}

#define MOE_COMBINE_LOADS 16

/* A thread takes V neighbouring columns (4 with 16-byte loads when hidden allows); each
 * column's sum is the same either way. The pairs' weights load in the same batch as their
 * partials: read where they were used, each had been waited on in turn (the SASS showed
 * one load, then its four FFMAs, per pair). */
template <uint32_t V>
__global__ void k_moe_combine(const float *routed, uint32_t r_splits,
        size_t r_stride, const float *w, uint32_t top_k,
        const float *shared, uint32_t s_splits, size_t s_stride, uint32_t hidden,
        float *y)
{
        pdl_wait();
        pdl_trigger();
        uint32_t r = blockIdx.y;
        for (uint32_t i = (blockIdx.x * blockDim.x + threadIdx.x) * V; i < hidden;
                i += gridDim.x * blockDim.x * V) {
                /* the (pair, slice) loads MOE_COMBINE_LOADS at a time, so that the block
                 * waits on the memory once per batch, not once per load; the sums keep
                 * the order slice by slice, pair by pair */
                float v[V] = {}, d[V] = {};
                uint32_t total = top_k * r_splits;
                for (uint32_t f0 = 0; f0 < total; f0 += MOE_COMBINE_LOADS) {
                        float x[MOE_COMBINE_LOADS][V], wk[MOE_COMBINE_LOADS];
#pragma unroll
                        for (uint32_t u = 0; u < MOE_COMBINE_LOADS; u++) {
                                uint32_t f = f0 + u, k = f / r_splits, s = f % r_splits;
                                const float *p = routed + s * r_stride +
                                                 ((size_t) r * top_k + k) * hidden + i;
                                wk[u] = f < total && s + 1 == r_splits ? w[(size_t) r * top_k + k]
                                                                       : 0.0f;
                                if constexpr (V == 4) {
                                        float4 q = f < total ? *(const float4 *) p
                                                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                                        x[u][0] = q.x;
                                        x[u][1] = q.y;
                                        x[u][2] = q.z;
                                        x[u][3] = q.w;
                                } else
                                        x[u][0] = f < total ? *p : 0.0f;
                        }
#pragma unroll
                        for (uint32_t u = 0; u < MOE_COMBINE_LOADS; u++) {
                                uint32_t f = f0 + u, s = f % r_splits;
                                if (f >= total)
                                        break;
#pragma unroll
                                for (uint32_t c = 0; c < V; c++)
                                        moe_pair_add(x[u][c], wk[u], s, r_splits, d[c], v[c]);
                        }
                }
                if (shared)
#pragma unroll
                        for (uint32_t c = 0; c < V; c++)
                                v[c] += moe_shared(shared, s_splits, s_stride,
                                        (size_t) r * hidden + i + c);
#pragma unroll
                for (uint32_t c = 0; c < V; c++)
                        y[(size_t) r * hidden + i + c] = v[c];
        }
}

void cu_moe_combine(cudaStream_t st, const float *routed, uint32_t r_splits, size_t r_stride,
        const float *w, uint32_t top_k, const float *shared, uint32_t s_splits, size_t s_stride,
        uint32_t rows, uint32_t hidden, float *y)
{
        bool vec = hidden % 4 == 0;
        dim3 grid(div_up(hidden, 128 * (vec ? 4 : 1)), rows);
        auto k = vec ? k_moe_combine<4> : k_moe_combine<1>;
        k<<<grid, 128, 0, st>>>(routed, r_splits, r_stride, w, top_k, shared, s_splits, s_stride,
                hidden, y);
}
