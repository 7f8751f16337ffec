/* SPDX-License-Identifier: MIT */
/* Mixture-of-experts kernels (see cuda_deepseek.cuh): routing, grouping by expert, and the
 * weighted sum. The expert matrices themselves run in cu_gemv_experts. */
#include <float.h>

#include "cuda_deepseek.cuh"
#include "cuda_ptx.cuh"
#include "cuda_route.cuh"

static inline uint32_t div_up(uint32_t a, uint32_t b)
{
        return (a + b - 1) / b;
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
