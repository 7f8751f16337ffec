/* SPDX-License-Identifier: MIT */
/* Bench hook: how fast a grid of a given shape streams a matrix's bytes, with the GEMVs'
 * load pattern and none of their arithmetic. Each warp reads a contiguous run of 1 KB chunks
 * (two 512-byte loads a chunk, as a tile pair's), STREAM_DEPTH chunks in flight, and keeps
 * only an xor of what it read. The question it answers is the fused-MoE proposal's
 * (docs/design-notes.md): whether fewer, longer CTAs, one a (pair, run of columns), read a
 * layer's experts' weights as fast as a grid filling every SM does, and the same for a dense
 * MLP. */
extern "C" {
#include "cuda_backend.h"
}
#include "cuda_ptx.cuh"
#include <errno.h>
#include <stdlib.h>

#define STREAM_DEPTH    4 /* AWQ_D: the GEMVs' chunks in flight a warp */
#define STREAM_LAUNCHES 20
#define STREAM_WARM     4 /* launches left out of the median */
#define STREAM_BUFFER   ((size_t) 2 << 30)
#define STREAM_PF_WARPS 132    /* a warp on each of the H200's SMs issues the bulk prefetches */
#define STREAM_PF_NS    100000 /* ... and they have 100 us to land */
#define STREAM_OTHER    264    /* the bytes between: two CTAs of 10 warps an SM */

/* CTA b reads per_cta uint4s from w + b * per_cta; its start and end (ns) into t[2b..]. */
__global__ void __launch_bounds__(1024) k_stream(const uint4 *w, size_t per_cta, uint32_t *sink,
        uint64_t *t)
{
        uint64_t t0 = globaltimer_ns();
        uint32_t warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        size_t chunks = per_cta / 64, c0 = chunks * warp / warps, c1 = chunks * (warp + 1) / warps;
        const uint4 *p = w + (size_t) blockIdx.x * per_cta + lane;
        uint4 buf[STREAM_DEPTH][2];
        auto load = [&](int i, size_t c) {
                buf[i][0] = ld_stream(p + c * 64);
                buf[i][1] = ld_stream(p + c * 64 + 32);
        };
#pragma unroll
        for (int i = 0; i < STREAM_DEPTH; i++)
                if (c0 + i < c1)
                        load(i, c0 + i);
        uint32_t acc = 0;
        for (size_t c = c0; c < c1; c += STREAM_DEPTH)
#pragma unroll
                for (int i = 0; i < STREAM_DEPTH; i++) {
                        if (c + i >= c1)
                                break;
                        acc ^= buf[i][0].x ^ buf[i][0].y ^ buf[i][0].z ^ buf[i][0].w ^ buf[i][1].x ^
                               buf[i][1].y ^ buf[i][1].z ^ buf[i][1].w;
                        if (c + i + STREAM_DEPTH < c1)
                                load(i, c + i + STREAM_DEPTH);
                }
        /* the buffer is filled with one byte value, so this store never happens; it keeps
         * the xor, hence the loads' results, live */
        if (acc == 0x9e3779b9u)
                sink[0] = acc;
        __syncthreads();
        if (threadIdx.x == 0) {
                t[2 * blockIdx.x] = t0;
                t[2 * blockIdx.x + 1] = globaltimer_ns();
        }
}

/* Bulk L2 prefetches of bytes from p, 64 KB each; KEEP: marked evict_last. */
template <bool KEEP>
__global__ void k_prefetch(const char *p, size_t bytes)
{
        uint64_t pol = 0;
        if (KEEP)
                asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
        for (size_t o = (size_t) (blockIdx.x * blockDim.x + threadIdx.x) << 16; o < bytes;
                o += (size_t) gridDim.x * blockDim.x << 16) {
                uint32_t n = (uint32_t) (bytes - o < (1u << 16) ? bytes - o : 1u << 16);
                if (KEEP)
                        asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;"
                                     :
                                     : "l"(p + o), "r"(n), "l"(pol)
                                     : "memory");
                else
                        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"
                                     :
                                     : "l"(p + o), "r"(n)
                                     : "memory");
        }
}

/* Holds the stream for ns nanoseconds, so that the prefetches land before what follows: a
 * warp's bulk prefetches are not fire and forget, they issue at a fraction of a TB/s. */
__global__ void k_idle(uint64_t ns)
{
        uint64_t t0 = globaltimer_ns();
        while (globaltimer_ns() - t0 < ns) {
        }
}

static int cmp_double(const void *a, const void *b)
{
        double x = *(const double *) a, y = *(const double *) b;
        return (x > y) - (x < y);
}

/* One case: STREAM_LAUNCHES launches, each over a fresh part of w (2 GB, beyond L2), each
 * timed from its first CTA's start to its last CTA's end, after what c->before says and
 * c->between bytes of the buffer's other end. */
static cudaError_t stream_case(CudaStreamCase *c, const uint4 *w, uint32_t *sink, uint64_t *t,
        uint64_t *host)
{
        size_t per = c->bytes / c->ctas / 1024 * 64; /* whole 1 KB chunks, in uint4s */
        size_t span = per * c->ctas, n16 = STREAM_BUFFER / sizeof(uint4);
        size_t other = c->between / STREAM_OTHER / 1024 * 64;
        double v[STREAM_LAUNCHES];
        cudaError_t e = cudaSuccess;
        for (int r = 0; r < STREAM_LAUNCHES && e == cudaSuccess; r++) {
                const uint4 *wr = w + (size_t) r * span % (n16 / 2 - span);
                if (c->before == STREAM_READ)
                        k_stream<<<c->ctas, c->warps * 32>>>(wr, per, sink, t);
                if (c->before == STREAM_PREFETCH || c->before == STREAM_KEEP) {
                        if (c->before == STREAM_KEEP)
                                k_prefetch<true><<<STREAM_PF_WARPS, 32>>>((const char *) wr,
                                        span * sizeof(uint4));
                        else
                                k_prefetch<false><<<STREAM_PF_WARPS, 32>>>((const char *) wr,
                                        span * sizeof(uint4));
                        k_idle<<<1, 32>>>(STREAM_PF_NS);
                }
                if (other)
                        k_stream<<<STREAM_OTHER, 320>>>(w + n16 - STREAM_OTHER * other, other,
                                sink, t);
                k_stream<<<c->ctas, c->warps * 32>>>(wr, per, sink, t);
                e = cudaGetLastError();
                if (e == cudaSuccess)
                        e = cudaMemcpy(host, t, 2 * c->ctas * sizeof(uint64_t),
                                cudaMemcpyDeviceToHost);
                uint64_t first = UINT64_MAX, last = 0;
                for (uint32_t i = 0; i < c->ctas; i++) {
                        first = host[2 * i] < first ? host[2 * i] : first;
                        last = host[2 * i + 1] > last ? host[2 * i + 1] : last;
                }
                v[r] = (double) (last - first) / 1e3;
        }
        if (e != cudaSuccess)
                return e;
        qsort(v + STREAM_WARM, STREAM_LAUNCHES - STREAM_WARM, sizeof(double), cmp_double);
        c->us = v[STREAM_WARM + (STREAM_LAUNCHES - STREAM_WARM) / 2];
        c->tbs = (double) span * sizeof(uint4) / (c->us * 1e6);
        return cudaSuccess;
}

extern "C" int cuda_bench_stream(CudaStreamCase *cases, uint32_t n, DsError *err)
{
        uint4 *w = NULL;
        uint32_t *sink = NULL;
        uint64_t *t = NULL, *host = NULL;
        uint32_t max_ctas = 0;
        for (uint32_t i = 0; i < n; i++) {
                if (cases[i].ctas == 0 || cases[i].warps == 0 || cases[i].warps > 32 ||
                        cases[i].bytes / cases[i].ctas < 1024 ||
                        cases[i].bytes > (cases[i].before ? STREAM_L2_MAX : STREAM_BUFFER / 4) ||
                        cases[i].between > STREAM_BUFFER / 4)
                        return ds_error(err, -EINVAL,
                                "bench stream: case %u (%zu bytes, %u CTAs of %u warps, %zu "
                                "between): not a shape it runs",
                                i, cases[i].bytes, cases[i].ctas, cases[i].warps,
                                cases[i].between);
                max_ctas = cases[i].ctas > max_ctas ? cases[i].ctas : max_ctas;
        }
        host = (uint64_t *) malloc(2 * (size_t) max_ctas * sizeof(uint64_t));
        cudaError_t e = host ? cudaSuccess : cudaErrorMemoryAllocation;
        if (e == cudaSuccess)
                e = cudaMalloc(&w, STREAM_BUFFER);
        if (e == cudaSuccess)
                e = cudaMemset(w, 1, STREAM_BUFFER);
        if (e == cudaSuccess)
                e = cudaMalloc(&sink, sizeof(uint32_t));
        if (e == cudaSuccess)
                e = cudaMalloc(&t, 2 * (size_t) max_ctas * sizeof(uint64_t));
        for (uint32_t i = 0; i < n && e == cudaSuccess; i++)
                e = stream_case(&cases[i], w, sink, t, host);
        cudaFree(w);
        cudaFree(sink);
        cudaFree(t);
        free(host);
        if (e != cudaSuccess)
                return ds_error(err, -EIO, "bench stream: %s", cudaGetErrorString(e));
        return 0;
}
