/* SPDX-License-Identifier: MIT */
/* Bench hook: what the decode chain's hand-offs cost on their own, apart from any kernel's
 * work. A batch-1 step is a chain of about 10 launches a layer whose blocks meet inside
 * clusters and wait on their predecessor (cuda_ptx.cuh), so these two costs are paid a few
 * hundred times a step:
 * - a cluster's all-to-all of one float a block (add_norm's sums of squares): remote
 *   stores then cluster.sync, against cl_send and cl_slots_wait;
 * - a grid's hand-off to the next: from the producer's last block's end to the consumer's
 *   pdl_wait returning (programmatic launch), or to its first block's start (without).
 * And what a persistent decode kernel (docs/design-notes.md) would pay instead of the
 * second: a barrier of all its resident blocks through one counter in global memory, each
 * block then reading a word another block wrote before it. */
extern "C" {
#include "cuda_backend.h"
}
#include "cuda_ptx.cuh"
#include <cooperative_groups.h>
#include <errno.h>
#include <stdlib.h>

namespace cg = cooperative_groups;

#define EXCH_ROUNDS 200
#define EXCH_LAUNCHES 12
#define HAND_LAUNCHES 40
#define HAND_THREADS 128

__device__ __forceinline__ long long clock_now()
{
        long long t;
        asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
        return t;
}

/* EXCH_ROUNDS rounds in which every block sends a float to every block and adds what it
 * got, each round's value depending on the last; block 0's cycles a round into *cyc. The
 * slots alternate between two sets by round parity, since a block is at most one round
 * ahead of another (it needs the other's value of the round before). SEND: through
 * cl_send, each set with its mbarrier, re-armed a phase at a time; else remote stores and
 * one cluster.sync a round, as the kernels had it. */
template <bool SEND>
__global__ void __launch_bounds__(256) k_exchange(float *res, long long *cyc)
{
        __shared__ float slot[2][8];
        __shared__ __align__(8) uint64_t bar[2];
        cg::cluster_group cl = cg::this_cluster();
        uint32_t c = cl.block_rank(), n = cl.num_blocks();
        if (SEND && threadIdx.x == 0) {
                cl_slots_init(&bar[0], n * sizeof(float));
                cl_slots_init(&bar[1], n * sizeof(float));
        }
        cl.sync();
        float acc = (float) c;
        long long t0 = clock_now();
        for (int it = 0; it < EXCH_ROUNDS; it++) {
                uint32_t p = it & 1;
                float mine = acc * 0.5f;
                if (SEND) {
                        if (threadIdx.x < n)
                                cl_send(&slot[p][c], &bar[p], threadIdx.x, mine);
                        uint32_t parity = (it >> 1) & 1, done = 0;
                        while (!done)
                                asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.acquire.cluster."
                                             "shared::cta.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
                                             : "=r"(done)
                                             : "r"(smem_addr(&bar[p])), "r"(parity)
                                             : "memory");
                } else {
                        if (threadIdx.x < n)
                                *cl.map_shared_rank(&slot[p][c], threadIdx.x) = mine;
                        cl.sync();
                }
                float t = 0.0f;
                for (uint32_t k = 0; k < n; k++)
                        t += slot[p][k];
                acc = t;
                __syncthreads();
                /* the next phase of this parity's barrier */
                if (SEND && threadIdx.x == 0)
                        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                                             smem_addr(&bar[p])),
                                "r"(n * (uint32_t) sizeof(float))
                                : "memory");
        }
        long long t1 = clock_now();
        if (threadIdx.x == 0) {
                res[blockIdx.x] = acc;
                if (blockIdx.x == 0)
                        *cyc = t1 - t0;
        }
        cl.sync();
}

__device__ __forceinline__ void red_add_release(uint32_t *p, uint32_t v)
{
        asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t ld_acquire(const uint32_t *p)
{
        uint32_t v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
        return v;
}

/* EXCH_ROUNDS rounds of a grid barrier: each block's thread 0 stores a float that depends on
 * the last round, adds one to *count (release) and spins until every block has (acquire),
 * then reads the next block's float; block 0's cycles a round into *cyc. The floats alternate
 * between two sets by round parity, as in k_exchange. *count goes up by the grid each round
 * and is zero at launch. */
__global__ void __launch_bounds__(128) k_grid_barrier(uint32_t *count, float *slot, float *res,
        long long *cyc)
{
        __shared__ float got;
        uint32_t g = gridDim.x, b = blockIdx.x;
        float acc = (float) b;
        long long t0 = clock_now();
        for (int it = 0; it < EXCH_ROUNDS; it++) {
                float *set = slot + (size_t) (it & 1) * g;
                if (threadIdx.x == 0) {
                        set[b] = acc * 0.5f;
                        red_add_release(count, 1);
                        uint32_t target = (uint32_t) (it + 1) * g;
                        while (ld_acquire(count) < target) {
                        }
                        got = ld_cg(set + (b + 1) % g);
                }
                __syncthreads();
                acc = acc * 0.25f + got;
                __syncthreads();
        }
        long long t1 = clock_now();
        if (threadIdx.x == 0) {
                res[b] = acc;
                if (b == 0)
                        *cyc = t1 - t0;
        }
}

/* A producer: every block streams its share of w (so that the grid ends as a GEMV does,
 * with the memory busy), writes one word and its end time. */
__global__ void __launch_bounds__(HAND_THREADS) k_produce(const uint4 *w, size_t per, float *out,
        uint64_t *ends)
{
        pdl_trigger();
        pdl_wait();
        uint32_t acc = 0;
        for (size_t i = threadIdx.x; i < per; i += HAND_THREADS) {
                uint4 v = ld_cg(w + (size_t) blockIdx.x * per + i);
                acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
        __shared__ uint32_t red[HAND_THREADS / 32];
        if (threadIdx.x % 32 == 0)
                red[threadIdx.x / 32] = acc;
        __syncthreads();
        if (threadIdx.x == 0) {
                out[blockIdx.x] = (float) (red[0] & 1u);
                ends[blockIdx.x] = globaltimer_ns();
        }
}

/* The consumer: its first block's time at entry and once the wait returns. */
__global__ void k_consume(const float *out, uint64_t *t)
{
        uint64_t t0 = globaltimer_ns();
        pdl_wait();
        uint64_t t1 = globaltimer_ns();
        if (blockIdx.x == 0 && threadIdx.x == 0) {
                t[0] = t0;
                t[1] = t1;
                t[2] = (uint64_t) ld_cg(out);
        }
}

static int cmp_double(const void *a, const void *b)
{
        double x = *(const double *) a, y = *(const double *) b;
        return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
        qsort(v, n, sizeof(*v), cmp_double);
        return v[n / 2];
}

/* The median over EXCH_LAUNCHES launches of block 0's cycles a round, which each launch
 * leaves in *cyc. */
template <typename Launch> static cudaError_t cycles_median(Launch launch, long long *cyc, double *ret)
{
        double v[EXCH_LAUNCHES];
        for (int r = 0; r < EXCH_LAUNCHES; r++) {
                long long c = 0;
                cudaError_t e = launch();
                if (e == cudaSuccess)
                        e = cudaMemcpy(&c, cyc, sizeof(c), cudaMemcpyDeviceToHost);
                if (e != cudaSuccess)
                        return e;
                v[r] = (double) c / EXCH_ROUNDS;
        }
        *ret = median(v, EXCH_LAUNCHES);
        return cudaSuccess;
}

template <bool SEND> static cudaError_t exchange(uint32_t size, float *res, long long *cyc, double *ret)
{
        cudaLaunchAttribute at = {};
        at.id = cudaLaunchAttributeClusterDimension;
        at.val.clusterDim.x = size;
        at.val.clusterDim.y = 1;
        at.val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(size);
        cfg.blockDim = dim3(256);
        cfg.attrs = &at;
        cfg.numAttrs = 1;
        return cycles_median([&] { return cudaLaunchKernelEx(&cfg, k_exchange<SEND>, res, cyc); },
                cyc, ret);
}

/* k_grid_barrier over blocks blocks, all resident (a cooperative launch): the median of
 * its cycles a round. */
static cudaError_t grid_barrier(uint32_t blocks, uint32_t *count, float *slot, float *res,
        long long *cyc, double *ret)
{
        return cycles_median(
                [&] {
                        void *args[] = {&count, &slot, &res, &cyc};
                        cudaError_t e = cudaMemset(count, 0, sizeof(uint32_t));
                        return e != cudaSuccess ? e
                                                : cudaLaunchCooperativeKernel(
                                                          (const void *) k_grid_barrier,
                                                          dim3(blocks), dim3(128), args, 0, 0);
                },
                cyc, ret);
}

/* The producer (n_sm * 8 blocks, 12 MB, a fresh part of w each launch) and the consumer
 * (n_sm blocks) back to back, the consumer behind a programmatic edge when pdl: the median
 * ns from the producer's last end to the consumer's wait returning (pdl) or its start. */
static cudaError_t hand_off(bool pdl, uint32_t n_sm, const uint4 *w, size_t w_units, float *out,
        uint64_t *ends, uint64_t *t, double *ret)
{
        uint32_t grid = n_sm * 8;
        size_t per = (12u << 20) / sizeof(uint4) / grid;
        uint64_t *host = (uint64_t *) malloc(grid * sizeof(uint64_t));
        if (!host)
                return cudaErrorMemoryAllocation;
        cudaLaunchAttribute at = {};
        at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at.val.programmaticStreamSerializationAllowed = 1;
        double v[HAND_LAUNCHES];
        cudaError_t e = cudaSuccess;
        for (int r = 0; r < HAND_LAUNCHES && e == cudaSuccess; r++) {
                const uint4 *wr = w + (size_t) r * grid * per % (w_units - grid * per);
                k_produce<<<grid, HAND_THREADS>>>(wr, per, out, ends);
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(n_sm);
                cfg.blockDim = dim3(128);
                cfg.attrs = &at;
                cfg.numAttrs = pdl ? 1 : 0;
                uint64_t tc[3];
                e = cudaLaunchKernelEx(&cfg, k_consume, (const float *) out, t);
                if (e == cudaSuccess)
                        e = cudaMemcpy(tc, t, sizeof(tc), cudaMemcpyDeviceToHost);
                if (e == cudaSuccess)
                        e = cudaMemcpy(host, ends, grid * sizeof(uint64_t), cudaMemcpyDeviceToHost);
                uint64_t last = 0;
                for (uint32_t i = 0; i < grid; i++)
                        last = host[i] > last ? host[i] : last;
                v[r] = (double) ((int64_t) (pdl ? tc[1] : tc[0]) - (int64_t) last);
        }
        free(host);
        if (e == cudaSuccess)
                *ret = median(v + 4, HAND_LAUNCHES - 4);
        return e;
}

extern "C" int cuda_bench_handoff(CudaHandoffBench *r, DsError *err)
{
        int dev = 0, n_sm = 0;
        float *res = NULL, *out = NULL, *slot = NULL;
        long long *cyc = NULL;
        uint32_t *count = NULL;
        uint64_t *ends = NULL, *t = NULL;
        uint4 *w = NULL;
        size_t w_bytes = (size_t) 1 << 30;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess)
                e = cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev);
        if (e == cudaSuccess)
                e = cudaMalloc(&res, (size_t) n_sm * 8 * sizeof(float));
        if (e == cudaSuccess)
                e = cudaMalloc(&slot, (size_t) n_sm * 8 * sizeof(float));
        if (e == cudaSuccess)
                e = cudaMalloc(&count, sizeof(uint32_t));
        if (e == cudaSuccess)
                e = cudaMalloc(&cyc, sizeof(long long));
        if (e == cudaSuccess)
                e = cudaMalloc(&out, (size_t) n_sm * 8 * sizeof(float));
        if (e == cudaSuccess)
                e = cudaMalloc(&ends, (size_t) n_sm * 8 * sizeof(uint64_t));
        if (e == cudaSuccess)
                e = cudaMalloc(&t, 3 * sizeof(uint64_t));
        if (e == cudaSuccess)
                e = cudaMalloc(&w, w_bytes);
        if (e == cudaSuccess)
                e = cudaMemset(w, 1, w_bytes);
        static const uint32_t sizes[] = {2, 4, 8};
        for (int i = 0; i < 3 && e == cudaSuccess; i++) {
                r->cluster[i] = sizes[i];
                e = exchange<false>(sizes[i], res, cyc, &r->sync_cycles[i]);
                if (e == cudaSuccess)
                        e = exchange<true>(sizes[i], res, cyc, &r->send_cycles[i]);
        }
        for (int i = 0; i < 3 && e == cudaSuccess; i++) {
                r->grid_blocks[i] = (uint32_t) n_sm * (1u << i);
                e = grid_barrier(r->grid_blocks[i], count, slot, res, cyc, &r->grid_cycles[i]);
        }
        if (e == cudaSuccess)
                e = hand_off(true, (uint32_t) n_sm, w, w_bytes / sizeof(uint4), out, ends, t,
                        &r->pdl_ns);
        if (e == cudaSuccess)
                e = hand_off(false, (uint32_t) n_sm, w, w_bytes / sizeof(uint4), out, ends, t,
                        &r->launch_ns);
        int clock_khz = 0;
        if (e == cudaSuccess)
                e = cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev);
        r->clock_mhz = clock_khz / 1000.0;
        cudaFree(res);
        cudaFree(slot);
        cudaFree(count);
        cudaFree(cyc);
        cudaFree(out);
        cudaFree(ends);
        cudaFree(t);
        cudaFree(w);
        if (e != cudaSuccess)
                return ds_error(err, -EIO, "bench handoff: %s", cudaGetErrorString(e));
        return 0;
}
