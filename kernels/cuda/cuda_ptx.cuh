/* SPDX-License-Identifier: MIT */
/* The PTX the kernels share: cp.async into shared memory, ldmatrix, mma.sync m16n8k16 with
 * fp32 accumulation, the FP16 pair <-> word casts and 8 halves to float, L2-only loads, and
 * the controls of programmatic dependent launch, and hand-offs inside a cluster by st.async.
 * Internal to kernels/cuda. */
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ __half2 u32_as_h2(uint32_t u)
{
        return *reinterpret_cast<__half2 *>(&u);
}

__device__ __forceinline__ uint32_t h2_as_u32(__half2 h)
{
        return *reinterpret_cast<uint32_t *>(&h);
}

/* 8 halves (16 bytes) widened to float, in order. */
__device__ __forceinline__ void h8_to_f(uint4 u, float *f)
{
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
                float2 p = __half22float2(u32_as_h2(w[j]));
                f[2 * j] = p.x;
                f[2 * j + 1] = p.y;
        }
}

/* A 16-byte cp.async into shared memory; zeros where !valid (src is not read then). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid)
{
        uint32_t s = (uint32_t) __cvta_generic_to_shared(dst);
        int n = valid ? 16 : 0;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(n));
}

/* An 8-byte cp.async (cached in L1 too: .cg takes 16 bytes only); zeros where !valid. */
__device__ __forceinline__ void cp_async8(void *dst, const void *src, bool valid)
{
        uint32_t d = (uint32_t) __cvta_generic_to_shared(dst);
        int n = valid ? 8 : 0;
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(n));
}

/* A 4-byte cp.async; zeros where !valid. */
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid)
{
        uint32_t d = (uint32_t) __cvta_generic_to_shared(dst);
        int n = valid ? 4 : 0;
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(n));
}

__device__ __forceinline__ void cp_async_commit()
{
        asm volatile("cp.async.commit_group;\n" ::);
}

/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
        asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p)
{
        uint32_t s = (uint32_t) __cvta_generic_to_shared(p);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t *r, const void *p)
{
        uint32_t s = (uint32_t) __cvta_generic_to_shared(p);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
}

__device__ __forceinline__ void ldsm_x2(uint32_t *r, const void *p)
{
        uint32_t s = (uint32_t) __cvta_generic_to_shared(p);
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1])
                     : "r"(s));
}

/* c (16x8 fp32) += a (16x16 FP16, row) · b (16x8 FP16, col) */
__device__ __forceinline__ void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
{
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Programmatic dependent launch (sm_90). A kernel that a graph launches behind a
 * programmatic edge (see pdl_edges in cuda_backend.cu) may start before its predecessor
 * has finished: it must call pdl_wait() before it reads anything the predecessor writes
 * or writes anything the predecessor reads, and may issue reads of constant data (the
 * weights) before. Data a step writes is never read through the non-coherent path
 * (__ldg, const __restrict__): the compiler takes those loads as invariant and may hoist
 * them above the wait (graph replays then read stale activations; the gpu suite caught
 * it). Outside such an edge both instructions do nothing. pdl_trigger() lets
 * the successor's blocks launch once every block of this grid has called it or exited.
 * Called at a block's entry, that is once this grid's last block has started: the
 * successor's blocks then take the SM slots the grid leaves free (a one-wave GEMV's
 * unevenly filled SMs, a last partial wave) and issue their weight loads there, while
 * this grid runs. The integer GEMVs trigger at entry: 7B batch 1 5.2%, 32B 1.0% and
 * V2-Lite 1.6% faster than triggering after their main loop, when every block was near
 * its end (docs/PERF.md, twenty-second session). */
__device__ __forceinline__ void pdl_wait()
{
        asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ __forceinline__ void pdl_trigger()
{
        asm volatile("griddepcontrol.launch_dependents;" :::);
}

/* The GPU's nanosecond clock, comparable across SMs (the benches' hooks time grids by it). */
__device__ __forceinline__ uint64_t globaltimer_ns()
{
        uint64_t t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
        return t;
}

/* Weights are read once per step: keep them out of L1 so x and the scales stay there. */
__device__ __forceinline__ uint4 ld_stream(const uint4 *p)
{
        uint4 v;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
        return v;
}

__device__ __forceinline__ uint2 ld_stream(const uint2 *p)
{
        uint2 v;
        asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];"
                     : "=r"(v.x), "=r"(v.y)
                     : "l"(p));
        return v;
}

/* Loads cached in L2 only, for data read once per SM (the KV cache): coherent with what
 * the kernel's predecessor wrote (see pdl_wait), and never hoisted above the wait. */
__device__ __forceinline__ uint4 ld_cg(const uint4 *p)
{
        uint4 v;
        asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
        return v;
}

/* *p += v at GPU scope, acquire and release: the writes this CTA made before a barrier
 * that precedes it are visible to whoever reads the count after it; returns the old value. */
__device__ __forceinline__ uint32_t atom_add_acq_rel(uint32_t *p, uint32_t v)
{
        uint32_t old;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;"
                     : "=r"(old)
                     : "l"(p), "r"(v)
                     : "memory");
        return old;
}

__device__ __forceinline__ uint2 ld_cg(const uint2 *p)
{
        uint2 v;
        asm volatile("ld.global.cg.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
        return v;
}

__device__ __forceinline__ uint32_t ld_cg(const uint32_t *p)
{
        uint32_t v;
        asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
        return v;
}

__device__ __forceinline__ float ld_cg(const float *p)
{
        float v;
        asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
        return v;
}

/* One-way hand-offs inside a cluster: a CTA's shared-memory slots filled by the others'
 * st.async, each counted in bytes on the receiver's mbarrier, so that the receiver waits
 * for its bytes alone. A cluster barrier (cluster.sync) after plain remote stores takes
 * about twice as long a round (bench-handoff, docs/PERF.md, thirty-first session). The
 * receiver's one thread inits its mbarrier and says how many bytes come (cl_slots_init);
 * the cluster barrier's arrival after it (__cluster_barrier_arrive_relaxed suffices: the
 * init's fence releases) and its wait in every sender before the first cl_send make the
 * init visible. A sender may leave once it has sent: the receiver waits for the bytes. */
__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
        return (uint32_t) __cvta_generic_to_shared(p);
}

/* bar: its first phase completes once bytes have arrived. One thread calls it. */
__device__ __forceinline__ void cl_slots_init(uint64_t *bar, uint32_t bytes)
{
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)));
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                "r"(bytes)
                : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* CTA rank's addresses of this CTA's *slot and *bar, for st.async. */
__device__ __forceinline__ void cl_map(const void *slot, uint64_t *bar, uint32_t rank, uint32_t *d,
        uint32_t *b)
{
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(*d) : "r"(smem_addr(slot)), "r"(rank));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(*b) : "r"(smem_addr(bar)), "r"(rank));
}

/* v into CTA rank's copy of *slot, counted on its copy of *bar. */
__device__ __forceinline__ void cl_send(float *slot, uint64_t *bar, uint32_t rank, float v)
{
        uint32_t d, b;
        cl_map(slot, bar, rank, &d, &b);
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(d),
                "r"(__float_as_uint(v)), "r"(b)
                : "memory");
}

/* v into CTA rank's copy of *slot (16-byte aligned), counted on its copy of *bar. */
__device__ __forceinline__ void cl_send4(float4 *slot, uint64_t *bar, uint32_t rank, float4 v)
{
        uint32_t d, b;
        cl_map(slot, bar, rank, &d, &b);
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
                     "[%5];" ::"r"(d),
                "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
                "r"(__float_as_uint(v.w)), "r"(b)
                : "memory");
}

/* Until bar's first phase is complete: every byte sent to this CTA is visible. */
__device__ __forceinline__ void cl_slots_wait(uint64_t *bar)
{
        uint32_t done = 0;
        while (!done)
                asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 "
                             "p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                             : "=r"(done)
                             : "r"(smem_addr(bar))
                             : "memory");
}
