/* SPDX-License-Identifier: MIT */
/* Mixture-of-experts kernels (see cuda_deepseek.cuh): routing, grouping by expert, and the
 * weighted sum. The expert matrices themselves run in cu_gemv_experts. */
#include <float.h>

#include "cuda_deepseek.cuh"

/* Routed experts a routing warp holds (8 per lane). */
#define ROUTE_MAX 256
#define ROUTE_WARPS 4

static inline uint32_t div_up(uint32_t a, uint32_t b)
{
        return (a + b - 1) / b;
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

/* One warp per row, following cpu_moe_route step by step. */
__global__ void __launch_bounds__(ROUTE_WARPS * 32) k_moe_route(const float *__restrict__ logits,
        uint32_t splits, size_t stride, const float *__restrict__ bias, CuRoute rt, uint32_t rows,
        uint32_t *idx, float *w)
{
        __shared__ float sc_all[ROUTE_WARPS][ROUTE_MAX], ch_all[ROUTE_WARPS][ROUTE_MAX];
        __shared__ bool tk_all[ROUTE_WARPS][ROUTE_MAX];
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t r = blockIdx.x * ROUTE_WARPS + warp, E = rt.n_routed;
        if (r >= rows)
                return;
        float *scores = sc_all[warp], *choice = ch_all[warp];
        bool *taken = tk_all[warp];
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
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float sum = 0.0f;
        for (uint32_t e = lane; e < E; e += 32) {
                if (rt.scoring == BK_SCORING_SOFTMAX) {
                        scores[e] = expf(scores[e] - m);
                        sum += scores[e];
                } else
                        scores[e] = 1.0f / (1.0f + expf(-scores[e]));
        }
        for (int o = 16; o > 0; o >>= 1)
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
        for (uint32_t e = lane; e < E; e += 32) {
                if (rt.scoring == BK_SCORING_SOFTMAX)
                        scores[e] /= sum;
                choice[e] = scores[e] + (rt.topk_method == BK_TOPK_NOAUX_TC && bias ? bias[e] : 0.0f);
                taken[e] = false;
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

        /* top-k */
        for (uint32_t i = 0; i < rt.top_k; i++) {
                uint32_t e = take_best(choice, taken, E, lane);
                if (lane == 0)
                        taken[e] = true;
                __syncwarp();
        }
        if (lane != 0)
                return;

        /* in ascending expert order, then the weights as the CPU computes them */
        uint32_t *ri = idx + (size_t) r * (rt.top_k + rt.n_shared);
        float *rw = w + (size_t) r * (rt.top_k + rt.n_shared);
        uint32_t k = 0;
        for (uint32_t e = 0; e < E && k < rt.top_k; e++)
                if (taken[e]) {
                        ri[k] = e;
                        rw[k++] = scores[e];
                }
        bool norm = rt.norm_topk_prob && (rt.topk_method == BK_TOPK_NOAUX_TC || rt.top_k > 1);
        if (norm) {
                float s = 0.0f;
                for (uint32_t i = 0; i < rt.top_k; i++)
                        s += rw[i];
                for (uint32_t i = 0; i < rt.top_k; i++)
                        rw[i] /= s + 1e-20f;
        }
        if (!norm || rt.topk_method == BK_TOPK_NOAUX_TC)
                for (uint32_t i = 0; i < rt.top_k; i++)
                        rw[i] *= rt.routed_scaling_factor;
        for (uint32_t j = 0; j < rt.n_shared; j++) {
                ri[rt.top_k + j] = E + j;
                rw[rt.top_k + j] = 1.0f;
        }
}

void cu_moe_route(cudaStream_t st, const float *logits, uint32_t splits, size_t slice_stride,
        const float *bias, CuRoute rt, uint32_t rows, uint32_t *idx, float *w)
{
        k_moe_route<<<div_up(rows, ROUTE_WARPS), ROUTE_WARPS * 32, 0, st>>>(logits, splits,
                slice_stride, bias, rt, rows, idx, w);
}

/* One block: counts per expert, the touched experts into the first slots in ascending id
 * with their ranges of the list, then each pair into its expert's range. */
__global__ void k_moe_group(const uint32_t *idx, uint32_t n_pairs, uint32_t E, uint32_t n_slots,
        uint32_t *ids, uint32_t *off, uint32_t *list)
{
        __shared__ uint32_t cnt[ROUTE_MAX + 16], cur[ROUTE_MAX + 16];

        for (uint32_t e = threadIdx.x; e < E; e += blockDim.x) {
                cnt[e] = 0;
                cur[e] = 0;
        }
        __syncthreads();
        for (uint32_t p = threadIdx.x; p < n_pairs; p += blockDim.x)
                atomicAdd(&cnt[idx[p]], 1u);
        __syncthreads();
        if (threadIdx.x == 0) {
                uint32_t s = 0, j = 0;
                for (uint32_t e = 0; e < E; e++) {
                        uint32_t c = cnt[e];
                        cnt[e] = s;
                        if (c == 0)
                                continue;
                        ids[j] = e;
                        off[j++] = s;
                        s += c;
                }
                for (; j < n_slots; j++) {
                        ids[j] = 0;
                        off[j] = s;
                }
                off[n_slots] = s;
        }
        __syncthreads();
        for (uint32_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
                uint32_t e = idx[p];
                list[cnt[e] + atomicAdd(&cur[e], 1u)] = p;
        }
}

void cu_moe_group(cudaStream_t st, const uint32_t *idx, uint32_t n_pairs, uint32_t n_experts,
        uint32_t n_slots, uint32_t *ids, uint32_t *off, uint32_t *list)
{
        k_moe_group<<<1, 1024, 0, st>>>(idx, n_pairs, n_experts, n_slots, ids, off, list);
}

__global__ void k_moe_combine(const float *__restrict__ routed, uint32_t r_splits,
        size_t r_stride, const float *__restrict__ w, uint32_t top_k,
        const float *__restrict__ shared, uint32_t s_splits, size_t s_stride, uint32_t hidden,
        float *y)
{
        uint32_t r = blockIdx.y;
        for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < hidden;
                i += gridDim.x * blockDim.x) {
                float v = 0.0f;
                for (uint32_t k = 0; k < top_k; k++) {
                        size_t at = ((size_t) r * top_k + k) * hidden + i;
                        float d = 0.0f;
                        for (uint32_t s = 0; s < r_splits; s++)
                                d += routed[s * r_stride + at];
                        v += d * w[(size_t) r * top_k + k];
                }
                if (shared) {
                        float d = 0.0f;
                        for (uint32_t s = 0; s < s_splits; s++)
                                d += shared[s * s_stride + (size_t) r * hidden + i];
                        v += d;
                }
                y[(size_t) r * hidden + i] = v;
        }
}

void cu_moe_combine(cudaStream_t st, const float *routed, uint32_t r_splits, size_t r_stride,
        const float *w, uint32_t top_k, const float *shared, uint32_t s_splits, size_t s_stride,
        uint32_t rows, uint32_t hidden, float *y)
{
        dim3 grid(div_up(hidden, 128), rows);
        k_moe_combine<<<grid, 128, 0, st>>>(routed, r_splits, r_stride, w, top_k, shared, s_splits,
                s_stride, hidden, y);
}
