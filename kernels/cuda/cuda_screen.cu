/* SPDX-License-Identifier: MIT */
/* The screened lm_head of a greedy row: the id that k_gemv_dense's FP16 logits and
 * k_sample's greedy pick would give (the largest logit, the lowest id on a tie), read
 * through an 8-bit copy of the lm_head, which is half the bytes, and a bound on that copy's
 * error, so that only the rows the bound cannot rule out are multiplied in FP16.
 *
 * cu_gemv_q8_bounds gives each row v an interval [a_v - B_v, a_v + B_v] that holds its FP16
 * logit l_v (cuda_kernels.cuh), and each tile of 16 rows its largest lower and upper ends.
 *  1. M = the largest lower end of all rows: some row's logit is at least M;
 *  2. only tiles whose largest upper end reaches M can hold the largest logit, and in them
 *     only rows whose upper end reaches M;
 *  3. those rows are rescored in FP16 with k_gemv_dense's arithmetic in its order
 *     (dense_dot8 a piece, a lane's pieces in turn, the lanes' sums by the same butterfly),
 *     and the largest, the lowest id on a tie, is the row's id.
 * So the id is the FP16 lm_head's for finite logits; a non-finite x rescores every row.
 * One cluster of SCR_BLOCKS blocks, each a run of tiles, meeting through distributed shared
 * memory, as k_sample's greedy rows do. */
#include <math.h>

#include "cuda_kernels.cuh"
#include "cuda_ptx.cuh"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define SCR_BLOCKS  8
#define SCR_THREADS 512
#define SCR_WARPS   (SCR_THREADS / 32)
#define SCR_K_MAX   8192 /* x in shared memory */
#define SCR_TILES   2048 /* most tiles a block screens */
#define SCR_CANDS   512  /* rows a block lists; more are rescored where they are found */
/* pieces a lane loads at once when rescoring: a row of K <= 4096 in one round trip */
#define SCR_R 16
#define FULL  0xffffffffu

struct ScrArgs {
        CuScreen s;
        const __half *x;
        uint32_t vocab;
        const CuSampleParams *params;
        int32_t *ids;
};

/* Row v's FP16 logit as k_gemv_dense<1, true> computes it with one slice: its lane j of 8
 * adds pieces j, j + 8, ... in turn, and the 8 sums meet by xor 1, 2, 4 of j. Here four
 * lanes load each j's pieces at once and lane j takes their sums in that order. Every lane
 * returns the logit. */
__device__ float rescore_row(const __half *w, uint32_t kp, const __half *x_s, uint32_t v,
        uint32_t lane)
{
        uint32_t kc_n = kp / 8, j = lane % 8, sub = lane / 8;
        uint32_t n_j = kc_n > j ? (kc_n - j + 7) / 8 : 0, n0 = (kc_n + 7) / 8;
        const uint4 *wp = (const uint4 *) (w + (size_t) v * kp) + j;
        float acc = 0.0f;
        for (uint32_t base = 0; base < n0; base += 4 * SCR_R) {
                uint4 wv[SCR_R];
#pragma unroll
                for (uint32_t m = 0; m < SCR_R; m++) {
                        uint32_t i = base + sub + 4 * m;
                        wv[m] = i < n_j ? ld_stream(wp + 8 * (size_t) i) : make_uint4(0, 0, 0, 0);
                }
                float p[SCR_R];
#pragma unroll
                for (uint32_t m = 0; m < SCR_R; m++) {
                        uint32_t i = base + sub + 4 * m;
                        uint4 xv = i < n_j ? *(const uint4 *) (x_s + 8 * (j + 8 * i))
                                           : make_uint4(0, 0, 0, 0);
                        const uint32_t *wu = (const uint32_t *) &wv[m];
                        const uint32_t *xu = (const uint32_t *) &xv;
                        float2 wf[4], xs[4];
#pragma unroll
                        for (int q = 0; q < 4; q++) {
                                wf[q] = __half22float2(u32_as_h2(wu[q]));
                                xs[q] = __half22float2(u32_as_h2(xu[q]));
                        }
                        p[m] = dense_dot8(wf, xs);
                }
#pragma unroll
                for (uint32_t q = 0; q < 4 * SCR_R; q++) {
                        float pv = __shfl_sync(FULL, p[q / 4], j + 8 * (q % 4));
                        if (base + q < n_j)
                                acc += pv;
                }
        }
        acc += __shfl_xor_sync(FULL, acc, 1);
        acc += __shfl_xor_sync(FULL, acc, 2);
        acc += __shfl_xor_sync(FULL, acc, 4);
        return acc;
}

__device__ __forceinline__ void take(float v, int32_t i, float &bv, int32_t &bi)
{
        if (v > bv || (v == bv && i < bi)) {
                bv = v;
                bi = i;
        }
}

__device__ float block_max(float v, float *red)
{
        for (int o = 16; o > 0; o >>= 1)
                v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
        __syncthreads();
        if (threadIdx.x % 32 == 0)
                red[threadIdx.x / 32] = v;
        __syncthreads();
        v = red[0];
        for (uint32_t w = 1; w < SCR_WARPS; w++)
                v = fmaxf(v, red[w]);
        return v;
}

/* The largest of every block's *slot (each block wrote its own) after a cluster barrier. */
__device__ float cluster_max(cg::cluster_group &cl, float *slot)
{
        cl.sync();
        float m = -INFINITY;
        for (uint32_t k = 0; k < SCR_BLOCKS; k++)
                m = fmaxf(m, *cl.map_shared_rank(slot, k));
        return m;
}

__global__ void __cluster_dims__(SCR_BLOCKS, 1, 1) __launch_bounds__(SCR_THREADS, 1)
        k_screen_argmax(const ScrArgs a)
{
        __shared__ __align__(16) __half x_s[SCR_K_MAX];
        __shared__ float red[SCR_WARPS];
        __shared__ uint32_t pass_s[SCR_TILES], cand_s[SCR_CANDS], n_pass, n_cand;
        __shared__ float m_s, bv_s[SCR_WARPS];
        __shared__ int32_t bi_s[SCR_WARPS];
        cg::cluster_group cl = cg::this_cluster();
        const CuScreen &s = a.s;
        uint32_t rank = cl.block_rank(), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t tiles = (a.vocab + 15) / 16;
        uint32_t t0 = tiles * rank / SCR_BLOCKS, t1 = tiles * (rank + 1) / SCR_BLOCKS;
        if (threadIdx.x == 0) {
                n_pass = 0;
                n_cand = 0;
        }
        pdl_wait();

        /* the block's tiles' bounds, a thread's in registers, and x for the rescoring (all
         * loads at once); a non-finite x leaves no bound, and every row is rescored */
        constexpr uint32_t PER = SCR_TILES / SCR_THREADS;
        float tlo[PER], thi[PER];
#pragma unroll
        for (uint32_t i = 0; i < PER; i++) {
                uint32_t t = t0 + threadIdx.x + i * SCR_THREADS;
                tlo[i] = t < t1 ? s.tlo[t] : -INFINITY;
                thi[i] = t < t1 ? s.thi[t] : -INFINITY;
        }
        bool bad = false;
        for (uint32_t i = threadIdx.x; i < s.kp / 8; i += SCR_THREADS) {
                uint4 v = ((const uint4 *) a.x)[i];
                ((uint4 *) x_s)[i] = v;
                const uint32_t *u = (const uint32_t *) &v;
                for (int q = 0; q < 4; q++) {
                        float2 f = __half22float2(u32_as_h2(u[q]));
                        bad = bad || !isfinite(f.x) || !isfinite(f.y);
                }
        }
        bool all = __syncthreads_or(bad);

        /* 1: M, the largest lower bound */
        float lo = -INFINITY;
#pragma unroll
        for (uint32_t i = 0; i < PER; i++)
                lo = fmaxf(lo, tlo[i]);
        lo = block_max(lo, red);
        if (threadIdx.x == 0)
                m_s = lo;
        float m = cluster_max(cl, &m_s);
        all = all || !isfinite(m);

        /* 2: the tiles that may hold the largest logit, then their rows that may be it,
         * listed, or rescored where they are found once the list is full */
#pragma unroll
        for (uint32_t i = 0; i < PER; i++) {
                uint32_t t = t0 + threadIdx.x + i * SCR_THREADS;
                if (t < t1 && (all || thi[i] >= m))
                        pass_s[atomicAdd(&n_pass, 1u)] = t;
        }
        __syncthreads();
        float bv = -INFINITY;
        int32_t bi = INT32_MAX;
        for (uint32_t e = warp; e < n_pass; e += SCR_WARPS) {
                uint32_t t = pass_s[e], v = t * 16 + lane;
                bool c = lane < 16 && v < a.vocab && (all || s.hi[v] >= m);
                uint32_t at = c ? atomicAdd(&n_cand, 1u) : 0;
                if (c && at < SCR_CANDS)
                        cand_s[at] = v;
                uint32_t more = __ballot_sync(FULL, c && at >= SCR_CANDS);
                while (more) {
                        uint32_t r = __ffs(more) - 1;
                        more &= more - 1;
                        take(rescore_row(s.w, s.kp, x_s, t * 16 + r, lane), (int32_t) (t * 16 + r),
                                bv, bi);
                }
        }
        __syncthreads();

        /* 3: the listed rows in FP16, then the largest of the cluster */
        uint32_t nc = min(n_cand, (uint32_t) SCR_CANDS);
        for (uint32_t e = warp; e < nc; e += SCR_WARPS)
                take(rescore_row(s.w, s.kp, x_s, cand_s[e], lane), (int32_t) cand_s[e], bv, bi);
        if (lane == 0) {
                bv_s[warp] = bv;
                bi_s[warp] = bi;
        }
        __syncthreads();
        if (threadIdx.x == 0)
                for (uint32_t w = 1; w < SCR_WARPS; w++)
                        take(bv_s[w], bi_s[w], bv_s[0], bi_s[0]);
        cl.sync();
        if (rank == 0 && threadIdx.x == 0) {
                for (uint32_t k = 1; k < SCR_BLOCKS; k++)
                        take(*cl.map_shared_rank(&bv_s[0], k), *cl.map_shared_rank(&bi_s[0], k),
                                bv_s[0], bi_s[0]);
                int32_t id = bi_s[0] == INT32_MAX ? 0 : bi_s[0];
                a.ids[0] = id;
                if (a.params[0].out)
                        *a.params[0].out = id;
        }
        /* the first block is done with the others' shared memory */
        cl.sync();
}

bool cu_screen_takes(uint32_t K, uint32_t kp, uint32_t vocab)
{
        uint32_t tiles = (vocab + 15) / 16;
        return K % 32 == 0 && kp == K && K <= SCR_K_MAX && vocab > 0 &&
               (tiles + SCR_BLOCKS - 1) / SCR_BLOCKS <= SCR_TILES;
}

void cu_screen_argmax(cudaStream_t st, const CuScreen *s, const __half *x, uint32_t vocab,
        const CuSampleParams *params, int32_t *ids)
{
        ScrArgs a = {*s, x, vocab, params, ids};
        k_screen_argmax<<<SCR_BLOCKS, SCR_THREADS, 0, st>>>(a);
}
