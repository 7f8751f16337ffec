/* SPDX-License-Identifier: MIT */
/* The CUDA backend's kernels, in the order one layer runs them (see cuda_kernels.cuh). */
#include <errno.h>
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include <cooperative_groups.h>

extern "C" {
#include "cuda_backend.h"
}
#include "cuda_deepseek.cuh"
#include "cuda_qx.cuh"
#include "cuda_kernels.cuh"
#include "cuda_ptx.cuh"
#include "cuda_route.cuh"

namespace cg = cooperative_groups;

static inline uint32_t div_up(uint32_t a, uint32_t b)
{
        return (a + b - 1) / b;
}

__device__ __forceinline__ float warp_sum(float v)
{
        for (int o = 16; o > 0; o >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, o);
        return v;
}

__device__ __forceinline__ float warp_max(float v)
{
        for (int o = 16; o > 0; o >>= 1)
                v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it. */
__device__ float block_sum(float v, float *red)
{
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, n = blockDim.x / 32;

        v = warp_sum(v);
        __syncthreads(); /* red may still be read by a previous call */
        if (lane == 0)
                red[warp] = v;
        __syncthreads();
        float s = 0.0f;
        for (uint32_t i = 0; i < n; i++)
                s += red[i];
        return s;
}

/* ---------------------------------------------------------------------------------------
 * Embedding, RMSNorm with the residual add, RoPE with the KV append, SwiGLU */

/* A token below 0 is the id sampled for row -1 - token of the step before, which that
 * step's sampler left in chain. A thread loads all its pieces of the row before it stores
 * any: a loop of load, store, load... waited on memory once a piece, since a store to x
 * might have been to the table (7B batch 1: 14 round trips, 6.8 us of the step's critical
 * path, now 2.0; docs/PERF.md, twenty-fifth session). */
#define EMBED_THREADS 256
#define EMBED_PIECES  4 /* 16-byte pieces a thread: rows of up to 8192 in one round */

__global__ void __launch_bounds__(EMBED_THREADS) k_embed(const __half *embed,
        const int32_t *tokens, const int32_t *chain, uint32_t hidden, float *x)
{
        pdl_wait();
        pdl_trigger();
        int32_t tk = tokens[blockIdx.x];
        if (tk < 0)
                tk = chain[-1 - tk];
        const __half *e = embed + (size_t) tk * hidden;
        float *o = x + (size_t) blockIdx.x * hidden;

        if (hidden % 8 != 0) {
                for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x)
                        o[i] = __half2float(e[i]);
                return;
        }
        const uint4 *e4 = (const uint4 *) e;
        float4 *o4 = (float4 *) o;
        for (uint32_t b = threadIdx.x; b < hidden / 8; b += EMBED_PIECES * EMBED_THREADS) {
                uint4 v[EMBED_PIECES];
#pragma unroll
                for (uint32_t j = 0; j < EMBED_PIECES; j++)
                        if (b + j * EMBED_THREADS < hidden / 8)
                                v[j] = e4[b + j * EMBED_THREADS];
#pragma unroll
                for (uint32_t j = 0; j < EMBED_PIECES; j++) {
                        uint32_t i = b + j * EMBED_THREADS;
                        if (i >= hidden / 8)
                                break;
                        float2 a = __half22float2(u32_as_h2(v[j].x));
                        float2 c = __half22float2(u32_as_h2(v[j].y));
                        float2 d = __half22float2(u32_as_h2(v[j].z));
                        float2 f = __half22float2(u32_as_h2(v[j].w));
                        o4[2 * i] = make_float4(a.x, a.y, c.x, c.y);
                        o4[2 * i + 1] = make_float4(d.x, d.y, f.x, f.y);
                }
        }
}

/* An 8-lane group a chunk of 64, a lane 8 of its columns, ending as k_gemv_res does
 * (qx_chunk_ss); a thread's rounds (at most 4: QX_SS_CHUNKS) all loaded before any store, as
 * in k_embed. The row is whole groups of 4 chunks (the caller checks). */
#define EMBED_QX_ROUNDS (QX_SS_CHUNKS / (EMBED_THREADS / 8))

__global__ void __launch_bounds__(EMBED_THREADS) k_embed_qx(const __half *embed,
        const int32_t *tokens, const int32_t *chain, uint32_t hidden, float *x, const float *w,
        CuQx qx)
{
        uint32_t lane = threadIdx.x % 32, e = lane % 8, chunks = hidden / 64;
        pdl_wait();
        pdl_trigger();
        int32_t tk = tokens[0];
        if (tk < 0)
                tk = chain[-1 - tk];
        const uint4 *e4 = (const uint4 *) (embed + (size_t) tk * hidden);
        const float4 *w4 = (const float4 *) w;
        float4 *x4 = (float4 *) x;
        uint4 raw[EMBED_QX_ROUNDS];
        float4 wa[EMBED_QX_ROUNDS], wb[EMBED_QX_ROUNDS];
        /* chunk of round i: every lane of a warp takes each round (qx_chunk_f's shuffles
         * take all 32), the lanes past the row on chunk 0 */
        auto chunk = [&](uint32_t i) {
                return threadIdx.x / 32 * 4 + i * (EMBED_THREADS / 8) + lane / 8;
        };
#pragma unroll
        for (uint32_t i = 0; i < EMBED_QX_ROUNDS; i++) {
                uint32_t col = 64 * (chunk(i) < chunks ? chunk(i) : 0) + 8 * e;
                raw[i] = e4[col / 8];
                wa[i] = w4[col / 4];
                wb[i] = w4[col / 4 + 1];
        }
#pragma unroll
        for (uint32_t i = 0; i < EMBED_QX_ROUNDS; i++) {
                uint32_t ch = chunk(i), col = 64 * ch + 8 * e;
                if (__shfl_sync(0xffffffffu, ch, 0) >= chunks)
                        break; /* the warp's rounds past the row: its four chunks of a round
                                * are all in the row or all past it (chunks % 4 == 0) */
                const float wv[8] = {wa[i].x, wa[i].y, wa[i].z, wa[i].w, wb[i].x, wb[i].y, wb[i].z,
                        wb[i].w};
                float h[8], hw[8], sq = 0.0f;
                h8_to_f(raw[i], h);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                        hw[k] = wv[k] * h[k];
                        sq += h[k] * h[k];
                }
                qx_chunk_ss(hw, sq, true, qx, ch);
                x4[col / 4] = make_float4(h[0], h[1], h[2], h[3]);
                x4[col / 4 + 1] = make_float4(h[4], h[5], h[6], h[7]);
        }
}

void cu_embed_qx(cudaStream_t st, const __half *embed, CuMeta meta, const int32_t *chain,
        uint32_t hidden, float *x, const float *w, const CuQx *qx)
{
        k_embed_qx<<<1, EMBED_THREADS, 0, st>>>(embed, meta.tokens, chain, hidden, x, w, *qx);
}

void cu_embed(cudaStream_t st, const __half *embed, CuMeta meta, const int32_t *chain,
        uint32_t rows, uint32_t hidden, float *x)
{
        k_embed<<<rows, EMBED_THREADS, 0, st>>>(embed, meta.tokens, chain, hidden, x);
}

/* One cluster of NC blocks of ADD_NORM_THREADS per output row (NC: ADD_NORM_CTAS, or
 * ADD_NORM_WIDE where add_norm_ctas says): block c of the cluster owns elements [c * chunk,
 * (c + 1) * chunk) of the row, thread t elements c * chunk + t + e * ADD_NORM_THREADS (e <
 * ADD_NORM_PER), kept in registers. The partial slices are read slice by slice for all of a
 * thread's elements at once, so the loads of one slice are in flight together and the sum
 * keeps the fixed order s = 0, 1, ... The blocks' sums of squares meet through distributed
 * shared memory, each block adding them in the order of an ADD_NORM_CTAS cluster's ranks
 * (hidden <= ADD_NORM_CTAS * ADD_NORM_THREADS * ADD_NORM_PER). MOE: the input is a MoE layer's
 * pairs, summed as k_moe_combine sums them (the same order and fmas, so a row comes
 * out as from k_moe_combine then this kernel), in one launch where the two took two: up to
 * ADD_NORM_MOE rows, V2-Lite batch 1 took 1.7% less time, and at 32 rows 1.4% more (the
 * combine's 16-byte loads do better there; docs/PERF.md, eighth session). */
#define ADD_NORM_MOE 8
#define ADD_NORM_CTAS    8
#define ADD_NORM_WIDE    16
#define ADD_NORM_WIDE_ROWS 8
#define ADD_NORM_THREADS 256
#define ADD_NORM_PER     4
#define ADD_NORM_LOADS   8 /* partial slices loaded at once */

/* add_norm's router epilogue (ROUTE 1: the logits; 2, one row: also the routing and the
 * grouping, as k_moe_route_group does them). Each thread's dot product over its segment in
 * order, the rq segments of an expert by a shuffle tree, the blocks' partials in rank
 * order by block 0: a fixed order, so a row's logits do not depend on the other rows. */
template <int ROUTE, uint32_t NC>
__device__ __forceinline__ void router_epilogue(const CuNormRouter &rr, const uint4 *rwv,
        const __half *xs_s, float (*rpart_s)[ROUTE_MAX], uint64_t *rbar, uint32_t re, uint32_t rs,
        uint32_t rq, uint32_t seg, bool rlive, uint32_t c, uint32_t j)
{
        __syncthreads(); /* the slice in xs_s */
        float acc = 0.0f;
#pragma unroll
        for (uint32_t k = 0; k < 8; k++) {
                if (8 * k >= seg)
                        break;
                const __half2 *wh = (const __half2 *) &rwv[k];
                const __half2 *xh = (const __half2 *) (xs_s + rs * seg + 8 * k);
#pragma unroll
                for (uint32_t m = 0; m < 4; m++) {
                        float2 wf = __half22float2(wh[m]), xf = __half22float2(xh[m]);
                        acc = fmaf(wf.x, xf.x, acc);
                        acc = fmaf(wf.y, xf.y, acc);
                }
        }
        for (uint32_t o = rq / 2; o > 0; o >>= 1)
                acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (rlive && rs == 0)
                cl_send(&rpart_s[c][re], rbar, 0, acc);
        if (c != 0)
                return;
        cl_slots_wait(rbar);
        uint32_t E = rr.rt.n_routed;
        /* ROUTE 2: the logits, the row's experts and weights stay in shared memory for
         * the routing and grouping that follow, which warp 0 does alone */
        __shared__ float lg_s[ROUTE == 2 ? ROUTE_MAX : 1], rw_s[ROUTE == 2 ? 32 : 1];
        __shared__ uint32_t idx_s[ROUTE == 2 ? 32 : 1];
        for (uint32_t e = threadIdx.x; e < E; e += blockDim.x) {
                float v = 0.0f;
                for (uint32_t k = 0; k < NC; k++)
                        v += rpart_s[k][e];
                rr.logits[(size_t) j * E + e] = v;
                if constexpr (ROUTE == 2)
                        lg_s[e] = v;
        }
        if constexpr (ROUTE == 2) {
                __syncthreads();
                if (threadIdx.x >= 32)
                        return;
                uint32_t K = rr.rt.top_k + rr.rt.n_shared, lane = threadIdx.x;
                route_row(lg_s, 1, E, rr.bias, rr.rt, 0, idx_s, rw_s);
                __syncwarp();
                if (lane < K) {
                        rr.idx[lane] = idx_s[lane];
                        rr.rw[lane] = rw_s[lane];
                }
                group_one_row(idx_s, K, rr.n_slots, rr.ids, rr.off, rr.list);
        }
}

/* QX: also the rows quantized into qx (cu_add_norm_quantizes). A template argument, not
 * a test of qx alone: the kernels without it stay as they were (7B and V2-Lite batch 8 were
 * 0.6% and 1% slower with the test; docs/PERF.md, fifteenth session). */
template <bool MOE, int ROUTE, bool QX, uint32_t NC>
__global__ void __cluster_dims__(NC, 1, 1) __launch_bounds__(ADD_NORM_THREADS)
        k_add_norm(float *x, const float *part, uint32_t splits, size_t slice_stride,
                const float *__restrict__ bias, const CuMoeSum moe,
                const float *__restrict__ w, __half *xn, uint32_t hidden, float eps,
                const uint32_t *out_row, bool write_res, const CuNormRouter rr, uint32_t rq,
                const CuQx qx)
{
        __shared__ float red[32];
        /* the blocks' sums of squares, by rank; in a wide cluster their first 4 warps' */
        constexpr bool WIDE = NC == ADD_NORM_WIDE;
        constexpr uint32_t WARPS = ADD_NORM_THREADS / 32;
        static_assert(NC == ADD_NORM_CTAS || (WIDE && NC == 2 * ADD_NORM_CTAS && WARPS == 2 * 4),
                "a wide block is half of an ADD_NORM_CTAS block: 4 warps, one float4");
        __shared__ __align__(16) float ss_all[WIDE ? 4 * NC : NC];
        /* the block's normed slice (ROUTE, qx), and (rank 0) every block's router partials */
        __shared__ __align__(16) __half xs_s[ROUTE || QX ? ADD_NORM_THREADS * ADD_NORM_PER : 1];
        __shared__ float rpart_s[ROUTE ? NC : 1][ROUTE ? ROUTE_MAX : 1];
        /* what the other blocks send: the sums of squares, (rank 0, ROUTE) the router's */
        __shared__ __align__(8) uint64_t bar[2];
        uint32_t c = cg::this_cluster().block_rank();
        uint32_t chunk = (hidden + NC - 1) / NC;
        if (threadIdx.x == 0) {
                cl_slots_init(&bar[0], sizeof(ss_all));
                if (ROUTE && c == 0)
                        cl_slots_init(&bar[1], NC * rr.rt.n_routed * sizeof(float));
        }
        __cluster_barrier_arrive_relaxed();
        uint32_t lo = c * chunk, hi = min(hidden, lo + chunk);
        uint32_t j = blockIdx.y, r = out_row ? out_row[j] : j;
        size_t row = (size_t) r * hidden;
        float y[ADD_NORM_PER], a[ADD_NORM_PER], wn[ADD_NORM_PER], bs[ADD_NORM_PER];
        float ss = 0.0f;
        /* the norm's weights and the bias are constant: loaded before the wait, they are no
         * memory round trip after the cluster's barrier */
#pragma unroll
        for (uint32_t e = 0; e < ADD_NORM_PER; e++) {
                uint32_t i = lo + threadIdx.x + e * ADD_NORM_THREADS;
                wn[e] = i < hi ? w[i] : 0.0f;
                bs[e] = i < hi && bias ? bias[i] : 0.0f;
        }
        /* ROUTE: thread t takes expert t / rq over segment t % rq of the block's slice (seg
         * halves, at most 64), its router weights loaded before the wait as well */
        uint32_t re = threadIdx.x / rq, rs = threadIdx.x % rq, seg = chunk / rq;
        bool rlive = ROUTE && re < rr.rt.n_routed;
        uint4 rwv[ROUTE ? 8 : 1];
#pragma unroll
        for (uint32_t k = 0; k < (ROUTE ? 8u : 1u); k++)
                rwv[k] = ROUTE && rlive && 8 * k < seg
                                 ? *(const uint4 *) (rr.w + (size_t) re * rr.kp + lo + rs * seg + 8 * k)
                                 : make_uint4(0, 0, 0, 0);
        pdl_wait();
        pdl_trigger();

        /* the residual and up to ADD_NORM_LOADS slices at once: one wait on the memory for
         * the usual split counts; the slices are added in order s = 0, 1, ... */
#pragma unroll
        for (uint32_t e = 0; e < ADD_NORM_PER; e++) {
                uint32_t i = lo + threadIdx.x + e * ADD_NORM_THREADS;
                y[e] = 0.0f;
                a[e] = i < hi ? x[row + i] : 0.0f;
        }
        if (MOE) {
                /* pair by pair: its slices in order, then times its weight */
                uint32_t total = moe.top_k * splits;
                float d[ADD_NORM_PER] = {};
                for (uint32_t f0 = 0; f0 < total; f0 += ADD_NORM_LOADS) {
                        float v[ADD_NORM_LOADS][ADD_NORM_PER], wk[ADD_NORM_LOADS];
#pragma unroll
                        for (uint32_t u = 0; u < ADD_NORM_LOADS; u++) {
                                uint32_t f = f0 + u, k = f / splits, s = f % splits;
                                size_t pr = s * slice_stride + ((size_t) r * moe.top_k + k) * hidden;
                                wk[u] = f < total && s + 1 == splits ? moe.w[(size_t) r * moe.top_k + k]
                                                                     : 0.0f;
#pragma unroll
                                for (uint32_t e = 0; e < ADD_NORM_PER; e++) {
                                        uint32_t i = lo + threadIdx.x + e * ADD_NORM_THREADS;
                                        v[u][e] = f < total && i < hi ? part[pr + i] : 0.0f;
                                }
                        }
#pragma unroll
                        for (uint32_t u = 0; u < ADD_NORM_LOADS; u++) {
                                uint32_t f = f0 + u, s = f % splits;
                                if (f >= total)
                                        break;
#pragma unroll
                                for (uint32_t e = 0; e < ADD_NORM_PER; e++)
                                        moe_pair_add(v[u][e], wk[u], s, splits, d[e], y[e]);
                        }
                }
                if (moe.shared)
#pragma unroll
                        for (uint32_t e = 0; e < ADD_NORM_PER; e++) {
                                uint32_t i = lo + threadIdx.x + e * ADD_NORM_THREADS;
                                if (i < hi)
                                        y[e] += moe_shared(moe.shared, moe.s_splits, moe.s_stride,
                                                row + i);
                        }
        }
        for (uint32_t s0 = 0; part && !MOE && s0 < splits; s0 += ADD_NORM_LOADS) {
                float v[ADD_NORM_LOADS][ADD_NORM_PER];
#pragma unroll
                for (uint32_t s = 0; s < ADD_NORM_LOADS; s++)
#pragma unroll
                        for (uint32_t e = 0; e < ADD_NORM_PER; e++) {
                                uint32_t i = lo + threadIdx.x + e * ADD_NORM_THREADS;
                                v[s][e] = s0 + s < splits && i < hi
                                                  ? part[(s0 + s) * slice_stride + row + i]
                                                  : 0.0f;
                        }
#pragma unroll
                for (uint32_t s = 0; s < ADD_NORM_LOADS; s++)
#pragma unroll
                        for (uint32_t e = 0; e < ADD_NORM_PER; e++)
                                if (s0 + s < splits)
                                        y[e] += v[s][e];
        }
#pragma unroll
        for (uint32_t e = 0; e < ADD_NORM_PER; e++) {
                uint32_t i = lo + threadIdx.x + e * ADD_NORM_THREADS;
                if (i < hi) {
                        /* The linear's own sum first, then the residual, as the CPU adds. */
                        if (part)
                                a[e] += bias ? y[e] + bs[e] : y[e];
                        if (write_res)
                                x[row + i] = a[e];
                        ss += a[e] * a[e];
                }
        }
        /* Each block sends its sum into every block's ss_all[c]: all reads are local, so no
         * block waits for the others to finish reading, and each waits for its sums only
         * (cl_send: half a cluster barrier's time). A wide block sends its 4 warps' sums
         * instead, which its receivers add as the ADD_NORM_CTAS block of which it is a half
         * would have (block_sum's order): a row's bits do not depend on the cluster. */
        ss = block_sum(ss, red);
        __cluster_barrier_wait();
        if (threadIdx.x < NC) {
                if constexpr (WIDE)
                        cl_send4((float4 *) &ss_all[4 * c], &bar[0], threadIdx.x,
                                make_float4(red[0], red[1], red[2], red[3]));
                else
                        cl_send(&ss_all[c], &bar[0], threadIdx.x, ss);
        }
        cl_slots_wait(&bar[0]);
        float tot = 0.0f;
        for (uint32_t k = 0; k < ADD_NORM_CTAS; k++) {
                if constexpr (WIDE) {
                        float sk = 0.0f;
                        for (uint32_t w = 0; w < WARPS; w++)
                                sk += ss_all[WARPS * k + w];
                        tot += sk;
                } else {
                        tot += ss_all[k];
                }
        }
        float inv = 1.0f / sqrtf(tot / (float) hidden + eps);
#pragma unroll
        for (uint32_t e = 0; e < ADD_NORM_PER; e++) {
                uint32_t i = lo + threadIdx.x + e * ADD_NORM_THREADS;
                if (i < hi) {
                        __half h = __float2half(wn[e] * (a[e] * inv));
                        xn[(size_t) j * hidden + i] = h;
                        if constexpr (ROUTE > 0 || QX)
                                xs_s[threadIdx.x + e * ADD_NORM_THREADS] = h;
                }
        }
        if constexpr (QX) {
                /* the slice's chunks (cu_add_norm_quantizes: whole ones), 8 lanes each */
                __syncthreads();
                uint32_t n = (hi - lo) / 64, it = threadIdx.x / 8, at = j * qx.chunks + lo / 64 + it;
                if (threadIdx.x / 32 * 4 < n)
                        qx_chunk(it < n ? *(const uint4 *) (xs_s + 64 * it + 8 * (threadIdx.x % 8))
                                        : make_uint4(0, 0, 0, 0),
                                it < n, qx.items + (size_t) at * 32, qx.recs + at);
        }
        if constexpr (ROUTE > 0)
                router_epilogue<ROUTE, NC>(rr, rwv, xs_s, rpart_s, &bar[1], re, rs, rq, seg, rlive,
                        c, j);
}

/* Steps of more than ADD_NORM_MANY rows: one block of ADD_NORM_GROUPS groups of
 * ADD_NORM_THREADS per row doing a whole cluster's work, group q standing for cluster
 * blocks c = q * CPG ... (CPG = ADD_NORM_CTAS / ADD_NORM_GROUPS chunks), its thread t taking
 * element c * chunk + t + e * ADD_NORM_THREADS of each, all loads issued before the first
 * use, and the sums of squares added in the cluster's order (per chunk over the warps, then
 * over the chunks): a row comes out bit for bit as from k_add_norm. Thousands of 6 KB
 * clusters left the memory system idle between launches (1.1 TB/s at 2048 rows). From 33
 * rows the rows alone fill the GPU: this kernel instead of the clusters took 1.3% off 7B
 * batch 64, 2-3% off 7B and V2-Lite batch 128, and left batch 32 even (docs/PERF.md,
 * seventh session). */
#define ADD_NORM_MANY   32
#define ADD_NORM_GROUPS 4

__global__ void __launch_bounds__(ADD_NORM_GROUPS * ADD_NORM_THREADS) k_add_norm_rows(float *x,
        const float *part, uint32_t splits, size_t slice_stride,
        const float *__restrict__ bias, const float *__restrict__ w, __half *xn, uint32_t hidden,
        float eps, const uint32_t *out_row, bool write_res)
{
        pdl_wait();
        pdl_trigger();
        constexpr uint32_t CPG = ADD_NORM_CTAS / ADD_NORM_GROUPS;
        __shared__ float red[ADD_NORM_CTAS][ADD_NORM_THREADS / 32];
        uint32_t chunk = (hidden + ADD_NORM_CTAS - 1) / ADD_NORM_CTAS;
        uint32_t j = blockIdx.x, r = out_row ? out_row[j] : j;
        uint32_t t = threadIdx.x % ADD_NORM_THREADS, c0 = threadIdx.x / ADD_NORM_THREADS * CPG;
        uint32_t warp = t / 32, lane = t % 32;
        /* element e of chunk c0 + c: offset first + c * chunk + e * ADD_NORM_THREADS, live
         * when t + e * ADD_NORM_THREADS < n[c] */
        uint32_t first = c0 * chunk + t;
        int n[CPG];
        float y[CPG][ADD_NORM_PER], a[CPG][ADD_NORM_PER];
        float *xr = x + (size_t) r * hidden + first;

#pragma unroll
        for (uint32_t c = 0; c < CPG; c++) {
                uint32_t lo = (c0 + c) * chunk;
                n[c] = (int) min(hidden, lo + chunk) - (int) lo - (int) t;
#pragma unroll
                for (uint32_t e = 0; e < ADD_NORM_PER; e++) {
                        y[c][e] = 0.0f;
                        a[c][e] = (int) (e * ADD_NORM_THREADS) < n[c]
                                          ? xr[c * chunk + e * ADD_NORM_THREADS]
                                          : 0.0f;
                }
        }
        if (part)
#pragma unroll 1
                for (uint32_t s = 0; s < splits; s++) {
                        const float *pr = part + s * slice_stride + (size_t) r * hidden + first;
#pragma unroll
                        for (uint32_t c = 0; c < CPG; c++)
#pragma unroll
                                for (uint32_t e = 0; e < ADD_NORM_PER; e++)
                                        if ((int) (e * ADD_NORM_THREADS) < n[c])
                                                y[c][e] += pr[c * chunk + e * ADD_NORM_THREADS];
                }
#pragma unroll
        for (uint32_t c = 0; c < CPG; c++) {
                float ss = 0.0f;
#pragma unroll
                for (uint32_t e = 0; e < ADD_NORM_PER; e++) {
                        if ((int) (e * ADD_NORM_THREADS) < n[c]) {
                                uint32_t i = first + c * chunk + e * ADD_NORM_THREADS;
                                if (part)
                                        a[c][e] += bias ? y[c][e] + bias[i] : y[c][e];
                                if (write_res)
                                        xr[c * chunk + e * ADD_NORM_THREADS] = a[c][e];
                                ss += a[c][e] * a[c][e];
                        }
                }
                ss = warp_sum(ss);
                if (lane == 0)
                        red[c0 + c][warp] = ss;
        }
        __syncthreads();
        float tot = 0.0f;
        for (uint32_t c = 0; c < ADD_NORM_CTAS; c++) {
                float sc = 0.0f;
                for (uint32_t k = 0; k < ADD_NORM_THREADS / 32; k++)
                        sc += red[c][k];
                tot += sc;
        }
        float inv = 1.0f / sqrtf(tot / (float) hidden + eps);
        __half *xo = xn + (size_t) j * hidden + first;
#pragma unroll
        for (uint32_t c = 0; c < CPG; c++)
#pragma unroll
                for (uint32_t e = 0; e < ADD_NORM_PER; e++)
                        if ((int) (e * ADD_NORM_THREADS) < n[c]) {
                                uint32_t o = c * chunk + e * ADD_NORM_THREADS;
                                xo[o] = __float2half(w[first + o] * (a[c][e] * inv));
                        }
}

#define ROUTER_ROWS 8

/* Segments an expert's router dot product takes in a block's slice of hidden (rq in
 * k_add_norm): the most, up to a warp, that leave every expert's threads in the block and
 * whole 16-byte pieces in each segment; 0 where a segment would be over 64 halves. */
static uint32_t router_segs(uint32_t hidden, uint32_t n_routed, uint32_t nc)
{
        uint32_t chunk = hidden / nc, rq = 1;
        if (n_routed == 0 || n_routed > ROUTE_MAX || hidden % (8 * nc) != 0)
                return 0;
        while (rq < 32 && 2 * rq * n_routed <= ADD_NORM_THREADS && chunk % (16 * rq) == 0)
                rq *= 2;
        return rq * n_routed <= ADD_NORM_THREADS && chunk / rq <= 64 ? rq : 0;
}

/* k_add_norm's blocks a row: ADD_NORM_WIDE in steps of up to ADD_NORM_WIDE_ROWS where a
 * thread of ADD_NORM_CTAS blocks holds one element at most and a wide block is whole chunks
 * of 64 (so whole warps, and whole quantized chunks). Each wide block is then half of an
 * ADD_NORM_CTAS block, with that block's first or last 4 warps, and the sums come out bit
 * for bit as there. Half the partials and router weights a block made V2-Lite batch 8
 * faster; at 32 rows an earlier form was slower, and this one is not measured there
 * (docs/PERF.md, thirty-second session). */
static uint32_t add_norm_ctas(uint32_t rows, uint32_t hidden)
{
        return rows <= ADD_NORM_WIDE_ROWS && hidden <= ADD_NORM_CTAS * ADD_NORM_THREADS &&
                               hidden % (64 * ADD_NORM_WIDE) == 0
                       ? ADD_NORM_WIDE
                       : ADD_NORM_CTAS;
}

bool cu_add_norm_routes(uint32_t rows, uint32_t hidden, uint32_t n_routed)
{
        /* up to 8 rows: V2-Lite batch 1 1.0% and batch 8 1.7% faster; batch 32 was 3% slower
         * (docs/PERF.md, tenth session) */
        return rows <= ROUTER_ROWS && hidden <= ADD_NORM_CTAS * ADD_NORM_THREADS * ADD_NORM_PER &&
               router_segs(hidden, n_routed, add_norm_ctas(rows, hidden)) > 0;
}

static_assert(QX_ROWS <= ADD_NORM_MANY, "the cluster kernel quantizes");

bool cu_add_norm_quantizes(uint32_t rows, uint32_t hidden)
{
        return rows <= QX_ROWS && hidden % (64 * ADD_NORM_CTAS) == 0 &&
               hidden <= ADD_NORM_CTAS * ADD_NORM_THREADS * ADD_NORM_PER;
}

/* k_add_norm for a cluster of NC (a wide one may take a non-portable size: allowed once). */
template <uint32_t NC>
static auto add_norm_kernel(bool moe, int route, bool qx)
{
        if constexpr (NC != ADD_NORM_CTAS) {
                static bool opted;
                if (!opted) {
                        for (auto f : {k_add_norm<true, 0, true, NC>, k_add_norm<true, 0, false, NC>,
                                     k_add_norm<false, 0, true, NC>, k_add_norm<false, 0, false, NC>,
                                     k_add_norm<false, 1, false, NC>, k_add_norm<false, 2, false, NC>})
                                cudaFuncSetAttribute(f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
                        opted = true;
                }
        }
        if (route)
                return route == 2 ? k_add_norm<false, 2, false, NC> : k_add_norm<false, 1, false, NC>;
        if (moe)
                return qx ? k_add_norm<true, 0, true, NC> : k_add_norm<true, 0, false, NC>;
        return qx ? k_add_norm<false, 0, true, NC> : k_add_norm<false, 0, false, NC>;
}

bool cu_add_norm(cudaStream_t st, float *x, const float *part, uint32_t splits,
        size_t slice_stride, const float *bias, const CuMoeSum *moe, const float *w, __half *xn,
        uint32_t rows, uint32_t hidden, float eps, const uint32_t *out_row, bool write_res,
        const CuNormRouter *router, const CuQx *qx)
{
        /* not where it routes: the routing is the experts' critical path, and the shared
         * experts that would take the quantized rows run beside it (V2-Lite batch 1 was 2.4%
         * slower with it; docs/PERF.md, fifteenth session) */
        CuQx q = qx && !router && cu_add_norm_quantizes(rows, hidden) ? *qx : CuQx{};
        CuMoeSum m = {};
        if (moe && rows > ADD_NORM_MOE) {
                /* the combine's 16-byte loads sum the pairs first (see k_add_norm) */
                cu_moe_combine(st, part, splits, slice_stride, moe->w, moe->top_k, moe->shared,
                        moe->s_splits, moe->s_stride, moe->rows, hidden, moe->y);
                part = moe->y;
                splits = 1;
                bias = NULL;
        } else if (moe)
                m = *moe;
        if (rows > ADD_NORM_MANY) {
                k_add_norm_rows<<<rows, ADD_NORM_GROUPS * ADD_NORM_THREADS, 0, st>>>(x, part,
                        splits, slice_stride, bias, w, xn, hidden, eps, out_row, write_res);
                return false;
        }
        uint32_t nc = add_norm_ctas(rows, hidden);
        CuNormRouter rr = {};
        uint32_t rq = 1;
        int route = 0;
        if (router && !m.w) {
                rr = *router;
                rq = router_segs(hidden, rr.rt.n_routed, nc);
                route = rows == 1 && rr.idx ? 2 : 1;
        }
        auto k = nc == ADD_NORM_WIDE ? add_norm_kernel<ADD_NORM_WIDE>(m.w, route, q.items)
                                     : add_norm_kernel<ADD_NORM_CTAS>(m.w, route, q.items);
        k<<<dim3(nc, rows), ADD_NORM_THREADS, 0, st>>>(x, part, splits, slice_stride, bias, m, w,
                xn, hidden, eps, out_row, write_res, rr, rq, q);
        return q.items != NULL;
}

/* A block of 4 warps a row: 16 chunks a round. */
__global__ void k_quantize_x(const __half *x, uint32_t ldx, uint32_t K, const CuQx qx)
{
        uint32_t r = blockIdx.y, n = K / 64;
        for (uint32_t base = threadIdx.x / 32 * 4; base < n; base += blockDim.x / 8) {
                uint32_t c = base + threadIdx.x % 32 / 8, at = r * qx.chunks + c;
                bool live = c < n;
                qx_chunk(live ? *(const uint4 *) (x + (size_t) r * ldx + 64 * c +
                                                  8 * (threadIdx.x % 8))
                              : make_uint4(0, 0, 0, 0),
                        live, qx.items + (size_t) at * 32, qx.recs + at);
        }
}

void cu_quantize_x(cudaStream_t st, const __half *x, uint32_t ldx, uint32_t rows, uint32_t K,
        const CuQx *qx)
{
        k_quantize_x<<<dim3(1, rows), 128, 0, st>>>(x, ldx, K, *qx);
}

#define TRY(call, what)                                                                            \
        do {                                                                                       \
                cudaError_t _e = (call);                                                           \
                if (_e != cudaSuccess) {                                                           \
                        r = ds_error(err, -EIO, "add_norm test: %s: %s", what,                     \
                                cudaGetErrorString(_e));                                           \
                        goto out;                                                                  \
                }                                                                                  \
        } while (0)

extern "C" int cuda_test_add_norm(const CudaNormTest *t, float *x_out, uint16_t *xn_out,
        bool *same, DsError *err)
{
        size_t xn_floats = (size_t) t->x_rows * t->hidden, on = (size_t) t->rows * t->hidden;
        float *x_d = NULL, *p_d = NULL, *b_d = NULL, *w_d = NULL, *x2 = NULL;
        __half *o_d = NULL, *o2 = NULL;
        uint32_t *r_d = NULL;
        int r = 0;

        CuQx qx = {NULL, NULL, t->hidden / 64, NULL, 0.0f};
        size_t qn = (size_t) t->rows * qx.chunks;

        if (t->rows == 0 || t->hidden > ADD_NORM_CTAS * ADD_NORM_THREADS * ADD_NORM_PER ||
                (!t->out_row && t->rows != t->x_rows) ||
                (t->qx_items && !cu_add_norm_quantizes(t->rows, t->hidden)))
                return ds_error(err, -EINVAL, "add_norm test: %u rows of %u", t->rows, t->hidden);
        if (t->qx_items) {
                TRY(cudaMalloc(&qx.items, qn * 128), "quantized rows");
                TRY(cudaMalloc(&qx.recs, qn * 8), "quantized rows");
        }
        TRY(cudaMalloc(&x_d, xn_floats * 4), "x");
        TRY(cudaMalloc(&x2, xn_floats * 4), "x");
        TRY(cudaMalloc(&p_d, (size_t) t->splits * xn_floats * 4 + 4), "part");
        TRY(cudaMalloc(&b_d, t->hidden * 4), "bias");
        TRY(cudaMalloc(&w_d, t->hidden * 4), "w");
        TRY(cudaMalloc(&o_d, on * 2), "xn");
        TRY(cudaMalloc(&o2, on * 2), "xn");
        TRY(cudaMalloc(&r_d, t->rows * 4), "out_row");
        TRY(cudaMemcpy(x_d, t->x, xn_floats * 4, cudaMemcpyHostToDevice), "x");
        TRY(cudaMemcpy(x2, t->x, xn_floats * 4, cudaMemcpyHostToDevice), "x");
        if (t->part)
                TRY(cudaMemcpy(p_d, t->part, (size_t) t->splits * xn_floats * 4,
                            cudaMemcpyHostToDevice),
                        "part");
        if (t->bias)
                TRY(cudaMemcpy(b_d, t->bias, t->hidden * 4, cudaMemcpyHostToDevice), "bias");
        TRY(cudaMemcpy(w_d, t->w, t->hidden * 4, cudaMemcpyHostToDevice), "w");
        if (t->out_row)
                TRY(cudaMemcpy(r_d, t->out_row, t->rows * 4, cudaMemcpyHostToDevice), "out_row");

        /* all rows at once, then in passes small enough for the cluster kernel */
        cu_add_norm(0, x_d, t->part ? p_d : NULL, t->splits, xn_floats, t->bias ? b_d : NULL,
                NULL, w_d, o_d, t->rows, t->hidden, t->eps, t->out_row ? r_d : NULL,
                t->write_res, NULL, t->qx_items ? &qx : NULL);
        for (uint32_t r0 = 0; r0 < t->rows; r0 += ADD_NORM_MANY) {
                uint32_t n = t->rows - r0 < ADD_NORM_MANY ? t->rows - r0 : ADD_NORM_MANY;
                size_t skip = t->out_row ? 0 : (size_t) r0 * t->hidden;
                cu_add_norm(0, x2 + skip, t->part ? p_d + skip : NULL, t->splits, xn_floats,
                        t->bias ? b_d : NULL, NULL, w_d, o2 + (size_t) r0 * t->hidden, n,
                        t->hidden, t->eps, t->out_row ? r_d + r0 : NULL, t->write_res, NULL,
                        NULL);
        }
        TRY(cudaGetLastError(), "launch");
        TRY(cudaDeviceSynchronize(), "run");
        {
                float *xa = (float *) malloc(xn_floats * 4);
                uint16_t *oa = (uint16_t *) malloc(on * 2);
                if (!xa || !oa) {
                        free(xa);
                        free(oa);
                        r = ds_error(err, -ENOMEM, "add_norm test: out of memory");
                        goto out;
                }
                cudaError_t e = cudaMemcpy(x_out, x_d, xn_floats * 4, cudaMemcpyDeviceToHost);
                if (e == cudaSuccess)
                        e = cudaMemcpy(xn_out, o_d, on * 2, cudaMemcpyDeviceToHost);
                if (e == cudaSuccess)
                        e = cudaMemcpy(xa, x2, xn_floats * 4, cudaMemcpyDeviceToHost);
                if (e == cudaSuccess)
                        e = cudaMemcpy(oa, o2, on * 2, cudaMemcpyDeviceToHost);
                *same = e == cudaSuccess && memcmp(xa, x_out, xn_floats * 4) == 0 &&
                        memcmp(oa, xn_out, on * 2) == 0;
                if (e == cudaSuccess && t->qx_items)
                        e = cudaMemcpy(t->qx_items, qx.items, qn * 128, cudaMemcpyDeviceToHost);
                if (e == cudaSuccess && t->qx_items)
                        e = cudaMemcpy(t->qx_recs, qx.recs, qn * 8, cudaMemcpyDeviceToHost);
                free(xa);
                free(oa);
                if (e != cudaSuccess)
                        r = ds_error(err, -EIO, "add_norm test: copy back: %s",
                                cudaGetErrorString(e));
        }
out:
        cudaFree(x_d);
        cudaFree(x2);
        cudaFree(p_d);
        cudaFree(b_d);
        cudaFree(w_d);
        cudaFree(o_d);
        cudaFree(o2);
        cudaFree(r_d);
        cudaFree(qx.items);
        cudaFree(qx.recs);
        return r;
}

/* One block of head_dim/2 threads per (row, head): heads below n_heads are q, then k, then
 * v. Thread i rotates the pair (i, i + head_dim/2) of a q or k head, or copies elements i
 * and i + head_dim/2 of a v head into the cache. */
__global__ void k_rope_kv(const float *part, uint32_t splits, size_t slice_stride,
        uint32_t tph, const CuRopeKv rk)
{
        uint32_t r = blockIdx.x, h = blockIdx.y, i = threadIdx.x, hd = rk.hd, half = hd / 2;
        uint32_t q_dim = rk.n_heads * hd, kv_dim = rk.n_kv_heads * hd, n = q_dim + 2 * kv_dim;
        uint32_t col = h * hd + i;
        size_t row = (size_t) r * n;
        uint32_t pa = tph ? paired_col(col, tph) : col;
        uint32_t pb = tph ? paired_col(col + half, tph) : col + half;
        /* the angle comes from the step's constants: computed before the wait (the empty
         * asm keeps the compiler from moving it after), it is off the path */
        float c = 1.0f, sn = 0.0f;
        if (h < rk.n_heads + rk.n_kv_heads)
                rope_angle(rk.pos[r], rk.inv_freq[i], rk.af, &c, &sn);
        asm volatile("" : "+f"(c), "+f"(sn));
        pdl_wait();
        pdl_trigger();
        float a = sum_part(part, splits, slice_stride, row + pa, rk.bias, col);
        float b = sum_part(part, splits, slice_stride, row + pb, rk.bias, col + half);
        rope_kv_store(rk, r, col, a, b, c, sn);
}

void cu_rope_kv(cudaStream_t st, const float *part, uint32_t splits, size_t slice_stride,
        uint32_t rows, uint32_t tph, const CuRopeKv *rk)
{
        dim3 grid(rows, rk->n_heads + 2 * rk->n_kv_heads);
        k_rope_kv<<<grid, rk->hd / 2, 0, st>>>(part, splits, slice_stride, tph, *rk);
}

__global__ void k_swiglu(const float *part, uint32_t splits, size_t slice_stride,
        const float *bias, uint32_t inter, __half *out)
{
        pdl_wait();
        pdl_trigger();
        uint32_t r = blockIdx.y;
        size_t row = (size_t) r * 2 * inter;

        for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < inter;
                i += gridDim.x * blockDim.x) {
                float g = sum_part(part, splits, slice_stride, row + i, bias, i);
                float u = sum_part(part, splits, slice_stride, row + inter + i, bias, inter + i);
                out[(size_t) r * inter + i] = __float2half(silu_mul(g, u));
        }
}

/* inter % 4 == 0: four columns a thread with 16-byte loads, all of them in flight at once
 * (the strided loop above reached 2.1 TB/s at 2048 rows); the same arithmetic per element.
 * pairs: gate column i is physical column i / 16 * 32 + i % 16, and up's 16 after it. */
__global__ void k_swiglu4(const float *part, uint32_t splits, size_t slice_stride,
        const float *__restrict__ bias, uint32_t inter, bool pairs, __half *out)
{
        pdl_wait();
        pdl_trigger();
        uint32_t r = blockIdx.y, i = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
        if (i >= inter)
                return;
        size_t row = (size_t) r * 2 * inter;
        uint32_t gc = pairs ? i / 16 * 32 + i % 16 : i, uc = pairs ? gc + 16 : inter + i;
        float4 g = make_float4(0.0f, 0.0f, 0.0f, 0.0f), u = g;

        for (uint32_t s = 0; s < splits; s++) {
                float4 pg = *(const float4 *) (part + s * slice_stride + row + gc);
                float4 pu = *(const float4 *) (part + s * slice_stride + row + uc);
                g.x += pg.x;
                g.y += pg.y;
                g.z += pg.z;
                g.w += pg.w;
                u.x += pu.x;
                u.y += pu.y;
                u.z += pu.z;
                u.w += pu.w;
        }
        if (bias) {
                float4 bg = *(const float4 *) (bias + i), bu = *(const float4 *) (bias + inter + i);
                g = make_float4(g.x + bg.x, g.y + bg.y, g.z + bg.z, g.w + bg.w);
                u = make_float4(u.x + bu.x, u.y + bu.y, u.z + bu.z, u.w + bu.w);
        }
        __half2 lo = __halves2half2(__float2half(silu_mul(g.x, u.x)),
                __float2half(silu_mul(g.y, u.y)));
        __half2 hi = __halves2half2(__float2half(silu_mul(g.z, u.z)),
                __float2half(silu_mul(g.w, u.w)));
        uint2 o;
        o.x = *reinterpret_cast<uint32_t *>(&lo);
        o.y = *reinterpret_cast<uint32_t *>(&hi);
        *(uint2 *) (out + (size_t) r * inter + i) = o;
}

void cu_swiglu(cudaStream_t st, const float *part, uint32_t splits, size_t slice_stride,
        const float *bias, uint32_t rows, uint32_t inter, bool pairs, __half *out)
{
        if (inter % 4 == 0) {
                dim3 grid(div_up(inter / 4, 256), rows);
                k_swiglu4<<<grid, 256, 0, st>>>(part, splits, slice_stride, bias, inter, pairs,
                        out);
                return;
        }
        dim3 grid(div_up(inter, 256 * 4), rows);
        k_swiglu<<<grid, 256, 0, st>>>(part, splits, slice_stride, bias, inter, out);
}

/* ---------------------------------------------------------------------------------------
 * Attention over the paged cache: items of up to ATT_CHUNK positions of one row, merged by
 * log-sum-exp (flash-decoding). Each item's result depends only on its own positions, so
 * a row's output is the same whatever the batch and whatever the launch's grid. */

#define ATT_THREADS 128
/* Items of at most this many positions score with lanes split over the key (lane groups
 * of kl lanes, 16 bytes each, reduced by shuffles); longer ones, thread per position. */
#define ATT_SPLIT_MAX 32

__device__ __forceinline__ float dot8(const float *q, const float *kf)
{
        const float4 *qa = (const float4 *) q;
        float4 x0 = qa[0], x1 = qa[1];
        return x0.x * kf[0] + x0.y * kf[1] + x0.z * kf[2] + x0.w * kf[3] + x1.x * kf[4] +
               x1.y * kf[5] + x1.z * kf[6] + x1.w * kf[7];
}

/* One block of ATT_THREADS per (work item, KV head), the g query heads of the KV head
 * sharing each key and value load; with S > 1, gridDim.y is S * n_kv_heads and a block
 * takes one S-th of the heads (the same arithmetic per head: the same bits). kl = the
 * power of two >= hd/8 lanes that read one key (16 bytes each); vl = the power of two >=
 * hd/4 lanes that read one value row (8 bytes each), ATT_THREADS / vl shares of the item's
 * positions being summed in a fixed order. */
template <uint32_t G, uint32_t S>
__global__ void __launch_bounds__(ATT_THREADS) k_attention(const float *q, const __half *k_cache,
        const __half *v_cache, const uint32_t *meta, const uint32_t *row_bt, uint32_t bt_tokens,
        uint32_t n_heads, uint32_t n_kv_heads, uint32_t hd, uint32_t kl, uint32_t vl, float scale,
        float *acc_out, float2 *ml_out)
{
        extern __shared__ float4 sh4[];
        /* G > 0: the group size, known at compile time (no code for absent heads) */
        /* S: the parts a KV head's query heads are split into, compiled apart so that
         * unsplit launches keep their registers (7B batch 64 was 6% slower with the split
         * read from the grid) */
        constexpr uint32_t GM = G ? (G + S - 1) / S : ATT_GROUP_MAX;
        const uint32_t g = G ? G : n_heads / n_kv_heads;
        uint32_t kvh = blockIdx.y / S, kv_dim = n_kv_heads * hd;
        /* this block's heads: h0 .. h0 + gh of the KV head's g */
        uint32_t h0 = blockIdx.y % S * g / S;
        uint32_t gh = (blockIdx.y % S + 1) * g / S - h0;
        uint32_t shares = ATT_THREADS / vl;
        float *q_s = (float *) sh4;                            /* (g, hd) */
        float *p_s = q_s + g * hd;                             /* (g, ATT_CHUNK) */
        float *o_s = p_s + g * ATT_CHUNK;                      /* (shares - 1, g, hd) */
        uint32_t *slot_s = (uint32_t *) (o_s + (shares - 1) * g * hd); /* (ATT_CHUNK) */
        float *ml_s = (float *) (slot_s + ATT_CHUNK);          /* (g, 2) */
        uint32_t n_items = meta[0];
        const int4 *items = (const int4 *) (meta + meta[1]);
        uint32_t t = threadIdx.x, warp = t / 32, lane = t % 32;

        for (uint32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
                /* row, first position, end position, first position the step writes */
                int4 item = items[it];
                uint32_t row = (uint32_t) item.x, t0 = (uint32_t) item.y;
                uint32_t n = (uint32_t) (item.z - item.y);
                /* positions i >= fresh are this step's, written by the predecessor */
                uint32_t fresh = (uint32_t) max(item.w - item.y, 0);

                __syncthreads(); /* the previous item's readers are done with shared memory */
                if (t < n) {
                        uint32_t p = t0 + t;
                        uint32_t block = meta[row_bt[row] + p / bt_tokens];
                        slot_s[t] = block * bt_tokens + p % bt_tokens;
                }
                __syncthreads();

                /* The keys and the first values of earlier steps' positions load before
                 * the wait on the kernel that writes the queries and this step's keys, so
                 * that the memory round trip overlaps it; this step's load after it. */
                uint32_t li = t % kl, pp = t / kl, per = ATT_THREADS / kl;
                bool live = 8 * li < hd, split = n <= ATT_SPLIT_MAX;
                uint4 kv[ATT_SPLIT_MAX / 4];
#pragma unroll
                for (uint32_t r = 0; r < ATT_SPLIT_MAX / 4; r++) {
                        uint32_t i = pp + r * per;
                        kv[r] = make_uint4(0, 0, 0, 0);
                        if (split && r * per < ATT_SPLIT_MAX && i < min(n, fresh) && live)
                                kv[r] = ld_cg((const uint4 *) (k_cache + (size_t) slot_s[i] * kv_dim +
                                                               kvh * hd) + li);
                }
                uint32_t vi = t % vl, share = t / vl;
                uint32_t vper = (n + shares - 1) / shares;
                uint32_t i0 = share * vper, i1 = min(n, i0 + vper);
                bool vlive = 4 * vi < hd;
                const uint2 *v4 = (const uint2 *) (v_cache + kvh * hd) + vi;
                uint2 u[8];
#pragma unroll
                for (uint32_t j = 0; j < 8; j++)
                        u[j] = vlive && i0 + j < min(i1, fresh)
                                       ? ld_cg(v4 + (size_t) slot_s[i0 + j] * (kv_dim / 4))
                                       : make_uint2(0, 0);
                pdl_wait();
                if (it == blockIdx.x)
                        pdl_trigger();
                {
                        const float4 *q4 = (const float4 *) (q + (size_t) row * n_heads * hd +
                                                             (size_t) (kvh * g + h0) * hd);
                        for (uint32_t i = t; i < gh * hd / 4; i += ATT_THREADS)
                                sh4[i] = q4[i];
                }
#pragma unroll
                for (uint32_t r = 0; r < ATT_SPLIT_MAX / 4; r++) {
                        uint32_t i = pp + r * per;
                        if (split && r * per < ATT_SPLIT_MAX && i >= fresh && i < n && live)
                                kv[r] = ld_cg((const uint4 *) (k_cache + (size_t) slot_s[i] * kv_dim +
                                                               kvh * hd) + li);
                }
#pragma unroll
                for (uint32_t j = 0; j < 8; j++)
                        if (vlive && i0 + j >= fresh && i0 + j < i1)
                                u[j] = ld_cg(v4 + (size_t) slot_s[i0 + j] * (kv_dim / 4));
                __syncthreads();

                if (split) {
                        /* lane group pp of kl lanes takes positions pp, pp + per, ...; lane li
                         * of the group dimensions 8li..8li+8, its loads issued above */
#pragma unroll
                        for (uint32_t r = 0; r < ATT_SPLIT_MAX / 4; r++) {
                                if (r * per >= n) /* uniform over the block */
                                        break;
                                uint32_t i = pp + r * per;
                                float kf[8];
                                h8_to_f(kv[r], kf);
#pragma unroll
                                for (uint32_t h = 0; h < GM; h++) {
                                        if (h >= gh)
                                                break;
                                        float s = live ? dot8(q_s + h * hd + 8 * li, kf) : 0.0f;
                                        for (uint32_t o = kl / 2; o > 0; o >>= 1)
                                                s += __shfl_xor_sync(0xffffffffu, s, o);
                                        if (li == 0 && i < n)
                                                p_s[h * ATT_CHUNK + i] = s * scale;
                                }
                        }
                } else if (t < n) {
                        /* thread t takes position t0 + t for the g heads */
                        const uint4 *k8 =
                                (const uint4 *) (k_cache + (size_t) slot_s[t] * kv_dim + kvh * hd);
                        float sc[GM];
#pragma unroll
                        for (uint32_t h = 0; h < GM; h++)
                                sc[h] = 0.0f;
                        for (uint32_t d8 = 0; d8 < hd / 8; d8 += 2) {
                                uint4 ku[2];
                                ku[0] = ld_cg(k8 + d8);
                                ku[1] = d8 + 1 < hd / 8 ? ld_cg(k8 + d8 + 1) : make_uint4(0, 0, 0, 0);
#pragma unroll
                                for (uint32_t v = 0; v < 2; v++) {
                                        if (d8 + v >= hd / 8)
                                                break;
                                        float kf[8];
                                        h8_to_f(ku[v], kf);
                                        uint32_t d = 8 * (d8 + v);
#pragma unroll
                                        for (uint32_t h = 0; h < GM; h++) {
                                                if (h >= gh)
                                                        break;
                                                sc[h] += dot8(q_s + h * hd + d, kf);
                                        }
                                }
                        }
#pragma unroll
                        for (uint32_t h = 0; h < GM; h++)
                                if (h < gh)
                                        p_s[h * ATT_CHUNK + t] = sc[h] * scale;
                }
                __syncthreads();

                /* softmax numerators per head, one warp per head */
                for (uint32_t h = warp; h < gh; h += ATT_THREADS / 32) {
                        float m = -FLT_MAX;
                        for (uint32_t i = lane; i < n; i += 32)
                                m = fmaxf(m, p_s[h * ATT_CHUNK + i]);
                        m = warp_max(m);
                        float l = 0.0f;
                        for (uint32_t i = lane; i < n; i += 32) {
                                float e = expf(p_s[h * ATT_CHUNK + i] - m);
                                p_s[h * ATT_CHUNK + i] = e;
                                l += e;
                        }
                        l = warp_sum(l);
                        if (lane == 0) {
                                ml_s[2 * h] = m;
                                ml_s[2 * h + 1] = l;
                        }
                }
                __syncthreads();

                /* weighted values: lane vi of a share takes dimensions 4vi..4vi+4 for every
                 * head over the share's consecutive positions, eight loads in flight (the
                 * first eight issued above) */
                float4 acc[GM];
#pragma unroll
                for (uint32_t h = 0; h < GM; h++)
                        acc[h] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (vlive) {
                        for (uint32_t b = i0; b < i1; b += 8) {
                                if (b > i0)
#pragma unroll
                                        for (uint32_t j = 0; j < 8; j++)
                                                u[j] = b + j < i1 ? ld_cg(v4 + (size_t) slot_s[b + j] *
                                                                                       (kv_dim / 4))
                                                                  : make_uint2(0, 0);
#pragma unroll
                                for (uint32_t j = 0; j < 8; j++) {
                                        if (b + j >= i1)
                                                break;
                                        float2 v01 = __half22float2(u32_as_h2(u[j].x));
                                        float2 v23 = __half22float2(u32_as_h2(u[j].y));
#pragma unroll
                                        for (uint32_t h = 0; h < GM; h++) {
                                                if (h >= gh)
                                                        break;
                                                float p = p_s[h * ATT_CHUNK + b + j];
                                                acc[h].x += p * v01.x;
                                                acc[h].y += p * v01.y;
                                                acc[h].z += p * v23.x;
                                                acc[h].w += p * v23.y;
                                        }
                                }
                        }
                        if (share > 0)
#pragma unroll
                                for (uint32_t h = 0; h < GM; h++)
                                        if (h < gh)
                                                ((float4 *) (o_s + ((share - 1) * g + h) * hd))[vi] = acc[h];
                }
                __syncthreads();
                /* the shares in order 0, 1, ... */
                if (share == 0 && vlive)
#pragma unroll
                        for (uint32_t h = 0; h < GM; h++)
                                if (h < gh) {
                                        float4 a = acc[h];
                                        for (uint32_t sh = 1; sh < shares; sh++) {
                                                float4 o = ((const float4 *) (o_s + ((sh - 1) * g + h) * hd))[vi];
                                                a.x += o.x;
                                                a.y += o.y;
                                                a.z += o.z;
                                                a.w += o.w;
                                        }
                                        size_t at = (size_t) it * n_heads + kvh * g + h0 + h;
                                        ((float4 *) (acc_out + at * hd))[vi] = a;
                                }
                if (t < gh)
                        ml_out[(size_t) it * n_heads + kvh * g + h0 + t] =
                                make_float2(ml_s[2 * t], ml_s[2 * t + 1]);
        }
}

/* Decode attention of small steps (at most ATT_SMALL_STEP sequences, whose decode rows are
 * cut into short items): one block per (item, KV head), one warp per query head of the
 * group. The block copies the item's keys and values into shared memory a round of P
 * positions at a time, the next round while the warps use the current one (the first
 * round's positions of earlier steps before the wait); each warp then scores its head,
 * keeps its running maximum and sum, and adds the round's values, with shuffles and no
 * barrier of its own. In k_attention every warp takes each of the block's heads in turn,
 * with barriers between the phases: at the 7B shape, batch 1, about 2100 dependent
 * instructions a warp (docs/PERF.md, fifth session); here a warp has one head. A row's
 * partition into items is k_attention's, and a head's result depends only on its own
 * positions, so graph and eager steps give the same bits. */
#define ATT_HEADS_WARPS 8

template <uint32_t HD> struct AttHeads {
        static constexpr uint32_t DL = HD < 64 ? HD : 64; /* q and K dimensions a scoring lane takes */
        static constexpr uint32_t L = HD / DL;            /* scoring lanes a position */
        static constexpr uint32_t P = 32 / L;             /* positions a round */
        static constexpr uint32_t VD = HD / 32;           /* value dimensions a lane sums */
        static constexpr uint32_t ROW = HD + 8; /* halves a cached row: 16 bytes of padding keep
                                                 * the scoring lanes' rows in distinct banks */
};

template <uint32_t HD>
__global__ void __launch_bounds__(ATT_HEADS_WARPS * 32) k_attention_heads(const float *q,
        const __half *k_cache, const __half *v_cache, const uint32_t *meta,
        const uint32_t *row_bt, uint32_t bt_tokens, uint32_t n_heads, uint32_t n_kv_heads,
        float scale, float *acc_out, float2 *ml_out)
{
        using A = AttHeads<HD>;
        constexpr uint32_t PIECES = HD / 8; /* 16-byte pieces a cached row */
        __shared__ __align__(16) __half kv_s[2][2][A::P * A::ROW]; /* round parity, K | V */
        __shared__ uint32_t slot_s[ATT_CHUNK];
        uint32_t g = n_heads / n_kv_heads, kvh = blockIdx.y, kv_dim = n_kv_heads * HD;
        uint32_t t = threadIdx.x, nt = blockDim.x, lane = t % 32, head = kvh * g + t / 32;
        /* scoring: lane takes position p of a round, dimensions ph * DL .. */
        uint32_t p = lane % A::P, ph = lane / A::P;
        uint32_t n_items = meta[0];
        const int4 *items = (const int4 *) (meta + meta[1]);

        for (uint32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
                /* row, first position, end position, first position the step writes */
                int4 item = items[it];
                uint32_t row = (uint32_t) item.x, t0 = (uint32_t) item.y;
                uint32_t n = (uint32_t) (item.z - item.y);
                uint32_t fresh = (uint32_t) max(item.w - item.y, 0);
                uint32_t rounds = (n + A::P - 1) / A::P;

                __syncthreads(); /* the previous item's readers are done with shared memory */
                for (uint32_t i = t; i < n; i += nt) {
                        uint32_t pos = t0 + i;
                        slot_s[i] = meta[row_bt[row] + pos / bt_tokens] * bt_tokens +
                                    pos % bt_tokens;
                }
                __syncthreads();
                /* round r's positions in [lo, hi) into its buffer */
                auto copy = [&](uint32_t r, uint32_t lo, uint32_t hi) {
                        for (uint32_t i = t; i < 2 * A::P * PIECES; i += nt) {
                                uint32_t v = i / (A::P * PIECES), j = i % (A::P * PIECES);
                                uint32_t pr = j / PIECES, pc = j % PIECES, at = r * A::P + pr;
                                if (at < lo || at >= hi)
                                        continue;
                                const __half *src = (v ? v_cache : k_cache) +
                                                    (size_t) slot_s[at] * kv_dim + kvh * HD + 8 * pc;
                                cp_async16(&kv_s[r % 2][v][pr * A::ROW + 8 * pc], src, true);
                        }
                        cp_async_commit();
                };
                copy(0, 0, min(fresh, n));
                pdl_wait();
                if (it == blockIdx.x)
                        pdl_trigger();
                copy(0, fresh, n);

                float qr[A::DL];
                const float4 *q4 = (const float4 *) (q + ((size_t) row * n_heads + head) * HD +
                                                     ph * A::DL);
#pragma unroll
                for (uint32_t j = 0; j < A::DL / 4; j++) {
                        float4 v = q4[j];
                        qr[4 * j] = v.x;
                        qr[4 * j + 1] = v.y;
                        qr[4 * j + 2] = v.z;
                        qr[4 * j + 3] = v.w;
                }

                float m = -INFINITY, l = 0.0f, acc[A::VD];
#pragma unroll
                for (uint32_t d = 0; d < A::VD; d++)
                        acc[d] = 0.0f;
                for (uint32_t r = 0; r < rounds; r++) {
                        if (r + 1 < rounds) {
                                copy(r + 1, 0, n);
                                cp_async_wait<1>();
                        } else {
                                cp_async_wait<0>();
                        }
                        __syncthreads();
                        const __half *ks = &kv_s[r % 2][0][p * A::ROW + ph * A::DL];
                        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                        for (uint32_t j = 0; j < A::DL / 8; j++) {
                                float kf[8];
                                h8_to_f(*(const uint4 *) (ks + 8 * j), kf);
                                part[j % 4] += dot8(qr + 8 * j, kf);
                        }
                        float s = (part[0] + part[1]) + (part[2] + part[3]);
                        if constexpr (A::L == 2)
                                s += __shfl_xor_sync(0xffffffffu, s, 16);
                        uint32_t at = r * A::P + p;
                        s = at < n ? s * scale : -INFINITY;
                        float mn = fmaxf(m, warp_max(s));
                        float corr = expf(m - mn);
                        float e = at < n ? expf(s - mn) : 0.0f;
                        l = l * corr + warp_sum(ph == 0 ? e : 0.0f);
                        m = mn;
#pragma unroll
                        for (uint32_t d = 0; d < A::VD; d++)
                                acc[d] *= corr;
                        const __half *vs = &kv_s[r % 2][1][lane * A::VD];
#pragma unroll 4
                        for (uint32_t j = 0; j < A::P; j++) {
                                if (r * A::P + j >= n)
                                        break;
                                float w = __shfl_sync(0xffffffffu, e, j);
                                const __half *vj = vs + j * A::ROW;
                                if constexpr (A::VD == 4) {
                                        uint2 u = *(const uint2 *) vj;
                                        float2 v01 = __half22float2(u32_as_h2(u.x));
                                        float2 v23 = __half22float2(u32_as_h2(u.y));
                                        acc[0] += w * v01.x;
                                        acc[1] += w * v01.y;
                                        acc[2] += w * v23.x;
                                        acc[3] += w * v23.y;
                                } else if constexpr (A::VD == 2) {
                                        float2 v01 = __half22float2(*(const __half2 *) vj);
                                        acc[0] += w * v01.x;
                                        acc[1] += w * v01.y;
                                } else {
                                        acc[0] += w * __half2float(*vj);
                                }
                        }
                        if (r + 2 < rounds)
                                __syncthreads(); /* round r + 2 refills this buffer */
                }
                float *o = acc_out + ((size_t) it * n_heads + head) * HD + lane * A::VD;
#pragma unroll
                for (uint32_t d = 0; d < A::VD; d++)
                        o[d] = acc[d];
                if (lane == 0)
                        ml_out[(size_t) it * n_heads + head] = make_float2(m, l);
        }
}

static uint32_t pow2_at_least(uint32_t v)
{
        uint32_t p = 1;
        while (p < v)
                p *= 2;
        return p;
}

void cu_attention(cudaStream_t st, const float *q, const __half *k_cache, const __half *v_cache,
        CuMeta meta, uint32_t grid, bool small, uint32_t head_split, uint32_t block_tokens,
        uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, float *acc, float2 *ml)
{
        uint32_t g = n_heads / n_kv_heads;
        uint32_t kl = pow2_at_least(head_dim / 8), vl = pow2_at_least(head_dim / 4);
        uint32_t shares = ATT_THREADS / vl;
        size_t smem = ((size_t) shares * g * head_dim + (size_t) g * ATT_CHUNK + ATT_CHUNK + 2 * g) *
                      sizeof(float);
        float scale = (float) (1.0 / sqrt((double) head_dim));
        auto kh = head_dim == 128 ? k_attention_heads<128>
                  : head_dim == 64 ? k_attention_heads<64>
                  : head_dim == 32 ? k_attention_heads<32>
                                   : NULL;
        if (small && kh && g <= ATT_HEADS_WARPS) {
                kh<<<dim3(grid, n_kv_heads), g * 32, 0, st>>>(q, k_cache, v_cache, meta.base,
                        meta.row_bt, block_tokens, n_heads, n_kv_heads, scale, acc, ml);
                return;
        }
        /* the common group sizes compiled for: at the 7B shape (7) batch 64 ran 7% faster;
         * their heads split in two where asked (the generic kernel is never split) */
        bool two = head_split == 2;
        uint32_t split = 1;
        auto k = k_attention<0, 1>;
        switch (g) {
#define ATT_G(n)                                                                                   \
        case n:                                                                                    \
                k = two ? k_attention<n, 2> : k_attention<n, 1>;                                   \
                split = two ? 2 : 1;                                                               \
                break;
        case 1: k = k_attention<1, 1>; break;
        ATT_G(2)
        ATT_G(4)
        ATT_G(5)
        ATT_G(6)
        ATT_G(7)
        ATT_G(8)
#undef ATT_G
        default: break;
        }
        dim3 blocks(grid, n_kv_heads * split);
        k<<<blocks, ATT_THREADS, smem, st>>>(q, k_cache, v_cache, meta.base, meta.row_bt,
                block_tokens, n_heads, n_kv_heads, head_dim, kl, vl, scale, acc, ml);
}

/* One block per (row, head, COMBINE_THREADS dimensions), for the GQA heads (128 wide) and
 * the MLA latent (512): the items' maxima give m, then in chunks of the block's size each
 * item's weight exp(m_i - m) goes to shared memory and every thread adds its dimension's
 * partials (and l) in item order, COMBINE_LOADS loads in flight. The first items' (m, l)
 * stay in registers from the maximum's pass. With FIRST > 0 (steps of few rows, whose
 * decode rows have many items, see att_chunk) the first FIRST items' partials load together
 * with them, so that the block waits on the memory once instead of twice: at the 7B shape,
 * batch 1, the combine's share of the step's critical path went from 6.4 to 3.9 us a layer
 * (kernel-trace.c). Steps of many rows take FIRST = 0: their rows have a few items each,
 * and the registers cost them occupancy (V2-Lite batch 64 lost 2%). Both sum in item
 * order: the same bits. With V = 4 (FIRST = 0, heads of a multiple of 4 COMBINE_THREADS
 * dimensions: the MLA latent) a thread takes 4 neighbouring dimensions, copied 16 bytes
 * at a time through shared memory, so a (row, head) is one block instead of four, with the
 * same arithmetic per dimension. */
#define COMBINE_THREADS 128
#define COMBINE_LOADS   16
#define COMBINE_FIRST   48
#define COMBINE_FEW_ROWS 8

template <uint32_t FIRST, uint32_t V>
__global__ void __launch_bounds__(COMBINE_THREADS) k_attention_combine(
        const float *acc, const float2 *ml, const uint2 *row_items,
        uint32_t n_heads, uint32_t hd, __half *out)
{
        __shared__ float w_s[COMBINE_THREADS], l_s[COMBINE_THREADS];
        __shared__ float red[32];
        __shared__ float4 v4_s[V == 4 ? COMBINE_LOADS : 1][COMBINE_THREADS];
        uint32_t r = blockIdx.x, h = blockIdx.y, t = threadIdx.x;
        static_assert(V == 1 || (V == 4 && FIRST == 0), "4 dimensions a thread without FIRST");
        uint32_t d = (blockIdx.z * COMBINE_THREADS + t) * V;
        uint2 ri = row_items[r];

        if (ri.y == 0)
                return; /* a prefill row: the flash kernel writes it */
        /* the row's items are the step's constants, read before the wait: the partials'
         * addresses then need no memory round trip after it */
        pdl_wait();
        pdl_trigger();

        size_t stride = (size_t) n_heads * hd;
        const float *ap0 = acc + ((size_t) ri.x * n_heads + h) * hd + d;
        float v0[FIRST > 0 ? FIRST : 1];
        if constexpr (FIRST > 0)
#pragma unroll
                for (uint32_t j = 0; j < FIRST; j++)
                        v0[j] = j < ri.y && d < hd ? ap0[j * stride] : 0.0f;
        float2 e0 = t < ri.y ? ml[(size_t) (ri.x + t) * n_heads + h] : make_float2(-FLT_MAX, 0.0f);
        float m = e0.x;
        for (uint32_t i = t + COMBINE_THREADS; i < ri.y; i += COMBINE_THREADS)
                m = fmaxf(m, ml[(size_t) (ri.x + i) * n_heads + h].x);
        m = warp_max(m);
        if (t % 32 == 0)
                red[t / 32] = m;
        __syncthreads();
        for (uint32_t w = 0; w < COMBINE_THREADS / 32; w++)
                m = fmaxf(m, red[w]);

        float a[V] = {}, l = 0.0f;
        for (uint32_t c0 = 0; c0 < ri.y; c0 += COMBINE_THREADS) {
                uint32_t nc = min((uint32_t) COMBINE_THREADS, ri.y - c0);
                __syncthreads(); /* the previous chunk's readers are done */
                if (t < nc) {
                        float2 e = c0 == 0 ? e0 : ml[(size_t) (ri.x + c0 + t) * n_heads + h];
                        w_s[t] = expf(e.x - m);
                        l_s[t] = w_s[t] * e.y;
                }
                __syncthreads();
                for (uint32_t i = 0; i < nc; i++)
                        l += l_s[i];
                if (d >= hd)
                        continue;
                const float *ap = ap0 + (size_t) c0 * stride;
                uint32_t i = 0;
                if constexpr (FIRST > 0)
                        if (c0 == 0) {
#pragma unroll
                                for (uint32_t j = 0; j < FIRST; j++)
                                        if (j < nc)
                                                a[0] += w_s[j] * v0[j];
                                i = FIRST;
                        }
                for (; i < nc; i += COMBINE_LOADS) {
                        float v[COMBINE_LOADS][V];
                        if constexpr (V == 4) {
                                /* through shared memory by cp.async, each thread its own
                                 * pieces, so that all the batch's loads are in flight at
                                 * once (as plain loads the compiler kept two in flight) */
#pragma unroll
                                for (uint32_t j = 0; j < COMBINE_LOADS; j++)
                                        if (i + j < nc)
                                                cp_async16(&v4_s[j][t], ap + (size_t) (i + j) * stride,
                                                        true);
                                cp_async_commit();
                                cp_async_wait<0>();
#pragma unroll
                                for (uint32_t j = 0; j < COMBINE_LOADS; j++) {
                                        float4 x = i + j < nc ? v4_s[j][t]
                                                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                                        v[j][0] = x.x;
                                        v[j][1] = x.y;
                                        v[j][2] = x.z;
                                        v[j][3] = x.w;
                                }
                        } else {
#pragma unroll
                                for (uint32_t j = 0; j < COMBINE_LOADS; j++)
                                        v[j][0] = i + j < nc ? ap[(i + j) * stride] : 0.0f;
                        }
#pragma unroll
                        for (uint32_t j = 0; j < COMBINE_LOADS; j++)
                                if (i + j < nc)
#pragma unroll
                                        for (uint32_t k = 0; k < V; k++)
                                                a[k] += w_s[i + j] * v[j][k];
                }
        }
        if (d < hd) {
                __half *o = out + ((size_t) r * n_heads + h) * hd + d;
#pragma unroll
                for (uint32_t k = 0; k < V; k++)
                        o[k] = __float2half(a[k] / l);
        }
}

void cu_attention_combine(cudaStream_t st, const float *acc, const float2 *ml, CuMeta meta,
        uint32_t rows, uint32_t n_heads, uint32_t head_dim, __half *out)
{
        bool few = rows <= COMBINE_FEW_ROWS, vec = !few && head_dim % (4 * COMBINE_THREADS) == 0;
        dim3 grid(rows, n_heads, div_up(head_dim, (vec ? 4 : 1) * COMBINE_THREADS));
        auto k = few ? k_attention_combine<COMBINE_FIRST, 1>
                 : vec ? k_attention_combine<0, 4>
                       : k_attention_combine<0, 1>;
        k<<<grid, COMBINE_THREADS, 0, st>>>(acc, ml, meta.row_items, n_heads, head_dim, out);
}

/* ---------------------------------------------------------------------------------------
 * Conversions */

__global__ void k_to_half(const float *x, __half *y, size_t n)
{
        pdl_wait();
        pdl_trigger();
        for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < n;
                i += (size_t) gridDim.x * blockDim.x)
                y[i] = __float2half(x[i]);
}

void cu_to_half(cudaStream_t st, const float *x, __half *y, size_t n)
{
        size_t blocks = (n + 255) / 256;
        if (blocks > 4096)
                blocks = 4096; /* the kernel loops; more blocks only cost launch slots */
        k_to_half<<<(unsigned) blocks, 256, 0, st>>>(x, y, n);
}

cudaError_t cu_graph_time(cudaStream_t st, cudaGraphExec_t g, uint32_t n, float *ms)
{
        cudaEvent_t e0 = NULL, e1 = NULL;
        cudaError_t e = cudaEventCreate(&e0);
        if (e == cudaSuccess)
                e = cudaEventCreate(&e1);
        if (e == cudaSuccess)
                e = cudaEventRecord(e0, st);
        for (uint32_t i = 0; e == cudaSuccess && i < n; i++)
                e = cudaGraphLaunch(g, st);
        if (e == cudaSuccess)
                e = cudaEventRecord(e1, st);
        if (e == cudaSuccess)
                e = cudaEventSynchronize(e1);
        if (e == cudaSuccess)
                e = cudaEventElapsedTime(ms, e0, e1);
        if (e0)
                cudaEventDestroy(e0);
        if (e1)
                cudaEventDestroy(e1);
        return e;
}
