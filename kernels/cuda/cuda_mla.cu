/* SPDX-License-Identifier: MIT */
/* Multi-head latent attention kernels (see cuda_deepseek.cuh), in the order a layer runs
 * them. Every sum runs in a fixed order, so a row's results do not depend on the batch. */
#include <float.h>

#include "cuda_deepseek.cuh"
#include "cuda_ptx.cuh"

static inline uint32_t div_up(uint32_t a, uint32_t b)
{
        return (a + b - 1) / b;
}

/* The sum of v over the block (blockDim.x a multiple of 32), for every thread. */
__device__ float mla_block_sum(float v)
{
        __shared__ float part[32];
        for (int o = 16; o > 0; o >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, o);
        __syncthreads();
        if (threadIdx.x % 32 == 0)
                part[threadIdx.x / 32] = v;
        __syncthreads();
        float s = 0.0f;
        for (uint32_t i = 0; i < blockDim.x / 32; i++)
                s += part[i];
        return s;
}

/* The interleaved rope of cpu_rope_apply_pairs: the angle of frequency i at pos, scaled, and
 * its rotation of the pair (a, b). */
__device__ __forceinline__ float2 rope_cs(uint32_t pos, const float *inv_freq, uint32_t i, float af)
{
        float c, s;
        sincosf((float) pos * inv_freq[i], &s, &c);
        return make_float2(c * af, s * af);
}

__device__ __forceinline__ float2 rope_rot(float a, float b, float2 cs)
{
        return make_float2(a * cs.x - b * cs.y, a * cs.y + b * cs.x);
}

/* ---------------------------------------------------------------------------------------
 * Projections around the attention */

/* Loads in flight per thread in the staging loops: each round of loads waits on the
 * memory once, so rounds, not loads, set the time of a small step. */
#define MLA_LOADS 8

static __device__ __forceinline__ float4 f4_add(float4 a, float4 b)
{
        return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

/* sum_part four columns at a time: for the quads i = first, first + step, .. < n, put(i, v)
 * with v the sum over the slices, in slice order, of the four floats at offset at(i).x of
 * each slice, plus bias[at(i).y ..] when there is a bias. The (quad, slice) loads go
 * MLA_LOADS at a time whatever the slice count. Offsets and columns are multiples of 4.
 * S: the slice count when compiled in (1, the common case from cuBLAS, costs no division
 * per load), else 0. */
template <uint32_t S, typename At, typename Put>
static __device__ __forceinline__ void mla_quads_s(const float *part, uint32_t splits,
        size_t stride, const float *__restrict__ bias, uint32_t first, uint32_t step, uint32_t n,
        At at, Put put)
{
        const uint32_t sl = S ? S : splits;
        uint32_t total = first < n ? (n - first + step - 1) / step * sl : 0;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (uint32_t f0 = 0; f0 < total; f0 += MLA_LOADS) {
                float4 v[MLA_LOADS], b[MLA_LOADS];
#pragma unroll
                for (uint32_t u = 0; u < MLA_LOADS; u++) {
                        uint32_t f = f0 + u, s = f % sl;
                        v[u] = b[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                        if (f >= total)
                                continue;
                        uint2 o = at(first + f / sl * step);
                        v[u] = *(const float4 *) (part + s * stride + o.x);
                        if (bias && s + 1 == sl)
                                b[u] = __ldg((const float4 *) (bias + o.y));
                }
#pragma unroll
                for (uint32_t u = 0; u < MLA_LOADS; u++) {
                        uint32_t f = f0 + u, s = f % sl;
                        if (f >= total)
                                break;
                        acc = s == 0 ? v[u] : f4_add(acc, v[u]);
                        if (s + 1 == sl)
                                put(first + f / sl * step, bias ? f4_add(acc, b[u]) : acc);
                }
        }
}

template <typename At, typename Put>
static __device__ __forceinline__ void mla_quads(const float *part, uint32_t splits,
        size_t stride, const float *__restrict__ bias, uint32_t first, uint32_t step, uint32_t n,
        At at, Put put)
{
        if (splits == 1)
                mla_quads_s<1>(part, splits, stride, bias, first, step, n, at, put);
        else
                mla_quads_s<0>(part, splits, stride, bias, first, step, n, at, put);
}

/* The latent row of token r into the cache, by one block of MLA_KV_THREADS: what depends on
 * the weights and the step's positions only (the norm's weights, the rope's angles) is loaded
 * and computed before the wait on the kernel that writes the partials (mla_kv_pre), the
 * rest after it (mla_kv_row). In the absorb kernel at batch 1 this block was its last by 2
 * us, 5 us after the wait against the other blocks' 3: the weights' and the frequencies'
 * loads, and the rope's sincos, came after the partials' (docs/PERF.md, thirtieth
 * session). */
#define MLA_KV_THREADS 128
#define MLA_KV_PER     (MLA_RANK_MAX / MLA_KV_THREADS)

struct MlaKvPre {
        float w[MLA_KV_PER]; /* norm_w[threadIdx.x + MLA_KV_THREADS k] */
        float2 cs;           /* the rope's pair threadIdx.x: its scaled cos and sin (the
                              * pairs from MLA_KV_THREADS on, where qk_rope_head_dim has
                              * them, take theirs after the wait) */
};

__device__ __forceinline__ MlaKvPre mla_kv_pre(const CuMlaKv &a, uint32_t pos)
{
        MlaKvPre p;
#pragma unroll
        for (uint32_t k = 0; k < MLA_KV_PER; k++) {
                uint32_t i = threadIdx.x + MLA_KV_THREADS * k;
                p.w[k] = i < a.rank ? a.norm_w[i] : 0.0f;
        }
        p.cs = threadIdx.x < a.R / 2 ? rope_cs(pos, a.inv_freq, threadIdx.x, a.af)
                                     : make_float2(0.0f, 0.0f);
        return p;
}

__device__ void mla_kv_row(const CuMlaKv &a, uint32_t r, uint32_t pos, uint32_t slot,
        const MlaKvPre &p)
{
        __shared__ __align__(16) float v[MLA_WIDTH_MAX];
        uint32_t W = a.rank + a.R, row = r * a.ld + a.col0, col0 = a.col0, rank = a.rank;
        __half *out = a.cache + (size_t) slot * W;
        float ss = 0.0f;

        mla_quads(
                a.part, a.splits, a.stride, a.bias, threadIdx.x, MLA_KV_THREADS, W / 4,
                [=](uint32_t i) { return make_uint2(row + 4 * i, col0 + 4 * i); },
                [&](uint32_t i, float4 x) {
                        *(float4 *) (v + 4 * i) = x;
                        if (4 * i < rank)
                                ss += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
                });
        float inv = 1.0f / sqrtf(mla_block_sum(ss) / (float) a.rank + a.eps);
#pragma unroll
        for (uint32_t k = 0; k < MLA_KV_PER; k++) {
                uint32_t i = threadIdx.x + MLA_KV_THREADS * k;
                if (i < rank)
                        out[i] = __float2half(p.w[k] * (v[i] * inv));
        }
        for (uint32_t i = threadIdx.x; i < a.R / 2; i += MLA_KV_THREADS) {
                float2 cs = i == threadIdx.x ? p.cs : rope_cs(pos, a.inv_freq, i, a.af);
                float2 o = rope_rot(v[a.rank + 2 * i], v[a.rank + 2 * i + 1], cs);
                out[a.rank + 2 * i] = __float2half(o.x);
                out[a.rank + 2 * i + 1] = __float2half(o.y);
        }
}

__global__ void __launch_bounds__(MLA_KV_THREADS) k_mla_kv(const CuMlaKv a, const uint32_t *pos,
        const uint32_t *slot)
{
        /* the step's positions and slots are its metadata, written before it starts */
        uint32_t at = pos[blockIdx.x];
        MlaKvPre p = mla_kv_pre(a, at);
        pdl_wait();
        pdl_trigger();
        mla_kv_row(a, blockIdx.x, at, slot[blockIdx.x], p);
}

void cu_mla_kv(cudaStream_t st, const CuMlaKv *kv, CuMeta meta, uint32_t rows)
{
        k_mla_kv<<<rows, MLA_KV_THREADS, 0, st>>>(*kv, meta.pos, meta.slot);
}

__global__ void k_mla_q_norm(const float *part, uint32_t splits, size_t stride,
        const float *__restrict__ bias, uint32_t ld, uint32_t n, const float *norm_w, float eps,
        __half *xq)
{
        pdl_wait();
        pdl_trigger();
        extern __shared__ float qa[];
        uint32_t r = blockIdx.x;
        float ss = 0.0f;

        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
                qa[i] = sum_part(part, splits, stride, (size_t) r * ld + i, bias, i);
                ss += qa[i] * qa[i];
        }
        float inv = 1.0f / sqrtf(mla_block_sum(ss) / (float) n + eps);
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
                xq[(size_t) r * n + i] = __float2half(norm_w[i] * (qa[i] * inv));
}

void cu_mla_q_norm(cudaStream_t st, const float *part, uint32_t splits, size_t slice_stride,
        const float *bias, uint32_t ld, uint32_t n, uint32_t rows, const float *norm_w,
        float eps, __half *xq)
{
        k_mla_q_norm<<<rows, 256, n * sizeof(float), st>>>(part, splits, slice_stride, bias, ld, n,
                norm_w, eps, xq);
}

/* ---------------------------------------------------------------------------------------
 * W_UK and W_UV on the tensor cores
 *
 * Per head, out (rows, N) = in (rows, K) · w (K, N) runs as outᵀ = wᵀ · inᵀ on
 * mma.m16n8k16: wᵀ is A (16 output columns an m-tile), the rows are B's n (8 rows a row
 * tile), so a weight fragment loaded once serves every row the block holds, and a batch
 * of one wastes only the unused rows' multiplies. cu_mla_split_kvb stores the weights in
 * fragment order: per head, m-tile and k-step (16 of K), the 32 lanes' A fragments of
 * 16 bytes each in lane order, so a warp loads a tile with one coalesced 16-byte load a
 * lane, all its tiles at once. The block's rows are staged in shared memory as FP16 (row
 * stride K + 8 halves, so the B fragments' rows fall in distinct banks). Every output is a
 * sum over K in a fixed order that the other rows do not change. */
#define MLA_HW     4  /* warps of a block */
static_assert(MLA_HW * 32 == MLA_KV_THREADS, "an absorb block writes the latent row");
#define MLA_RB     64 /* rows of a block */
#define MLA_KS_MAX 16 /* k-steps a warp holds: qk_nope_dim <= 256, kv_lora_rank / 4 <= 128 */

static __device__ __forceinline__ void mla_mma4(float *c, uint4 a, uint32_t b0, uint32_t b1)
{
        uint32_t r[4] = {a.x, a.y, a.z, a.w};
        mma16816(c, r, b0, b1);
}

static __device__ __forceinline__ uint32_t lds32(const __half *p)
{
        return *(const uint32_t *) p;
}

/* Stores a row tile's D fragment (output columns col, col + 8 of rows 2 tq, 2 tq + 1 of
 * the tile at r) into out (row stride ld), rows from nr on left out. */
static __device__ __forceinline__ void mla_store(const float *c, __half *out, size_t ld,
        uint32_t r, uint32_t nr, uint32_t col)
{
        __half *o = out + r * ld + col;
        if (r < nr) {
                o[0] = __float2half(c[0]);
                o[8] = __float2half(c[2]);
        }
        if (r + 1 < nr) {
                o[ld] = __float2half(c[1]);
                o[ld + 8] = __float2half(c[3]);
        }
}

/* The fused query kernel. Blocks below n_gemm: (m-group of MLA_HW m-tiles, head, row
 * group) of q[r][h][0 .. rank) = q_nope · W_UK, q_nope summed from the partials as it is
 * staged; float32 q_nope goes in as two FP16 halves (hi and the rest), so the product
 * keeps about 22 bits of it. A head's blocks also share its roped q_pe of the group's rows
 * into q[r][h][rank ..). With kv, one block a row after them writes its latent row. */
template <uint32_t PC, uint32_t RC>
__global__ void __launch_bounds__(MLA_HW * 32) k_mla_absorb(const float *part,
        uint32_t splits, size_t stride, const float *__restrict__ bias, uint32_t ld,
        const uint32_t *pos, const uint32_t *slot, uint32_t rows, uint32_t H, uint32_t P,
        uint32_t R, uint32_t rank, const float *inv_freq, float af, const uint4 *__restrict__ wk,
        __half *q, const CuMlaKv kv)
{
        extern __shared__ uint4 smem[];
        if (PC) { /* the divisions by P / 4 and R / 4 below become shifts */
                P = PC;
                R = RC;
        }
        uint32_t W = rank + R, qk = P + R, MG = rank / (16 * MLA_HW);
        uint32_t n_gemm = MG * H * ((rows + MLA_RB - 1) / MLA_RB);

        if (blockIdx.x >= n_gemm) {
                uint32_t r = blockIdx.x - n_gemm;
                uint32_t at = pos[r];
                MlaKvPre p = mla_kv_pre(kv, at);
                pdl_wait();
                pdl_trigger();
                mla_kv_row(kv, r, at, slot[r], p);
                return;
        }

        uint32_t bi = blockIdx.x, mg = bi % MG, h = bi / MG % H, r0 = bi / (MG * H) * MLA_RB;
        uint32_t nr = min((uint32_t) MLA_RB, rows - r0), nrt = (nr + 7) / 8;
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
        uint32_t KS = P / 16, mt = mg * MLA_HW + warp, LD = P + 8, P4 = P / 4, R4 = R / 4;

        /* the warp's weight tiles first, before the wait on the kernel that writes the
         * partials: in flight while it ends and the rows are staged */
        uint4 a[MLA_KS_MAX];
        const uint4 *wa = wk + ((size_t) h * (rank / 16) + mt) * KS * 32 + lane;
#pragma unroll
        for (uint32_t ks = 0; ks < MLA_KS_MAX; ks++)
                if (ks < KS)
                        a[ks] = __ldg(wa + ks * 32);
        /* the rope's angles of the thread's first quad, if q_pe, from the step's positions:
         * before the wait too, as in the latent row's block */
        uint32_t n_nope = nr * P4, n_pe = mg < nr * R4 ? (nr * R4 - mg + MG - 1) / MG : 0;
        float2 cs0[2] = {};
        if (threadIdx.x >= n_nope && threadIdx.x < n_nope + n_pe) {
                uint32_t i = mg + MG * (threadIdx.x - n_nope);
                uint32_t r = r0 + i / R4, k = 2 * (i % R4);
                cs0[0] = rope_cs(pos[r], inv_freq, k, af);
                cs0[1] = rope_cs(pos[r], inv_freq, k + 1, af);
        }
        pdl_wait();
        pdl_trigger();

        /* One staging pass, so that its loads go out together (one wait on the memory at
         * batch 1, where q_pe and q_nope as two passes were two): quads j < n_nope are
         * the group's q_nope, as hi and lo halves; the others the block's share of the
         * head's roped q_pe (its quads i = mg, mg + MG, .. of the group's rows). */
        __half *hi_s = (__half *) smem, *lo_s = hi_s + MLA_RB * LD;
        mla_quads(
                part, splits, stride, bias, threadIdx.x, blockDim.x, n_nope + n_pe,
                [=](uint32_t j) {
                        if (j < n_nope) {
                                uint32_t c = h * qk + 4 * (j % P4);
                                return make_uint2((r0 + j / P4) * ld + c, c);
                        }
                        uint32_t i = mg + MG * (j - n_nope), c = h * qk + P + 4 * (i % R4);
                        return make_uint2((r0 + i / R4) * ld + c, c);
                },
                [=](uint32_t j, float4 v) {
                        if (j < n_nope) {
                                uint32_t at = j / P4 * LD + 4 * (j % P4);
                                __half2 h0 = __floats2half2_rn(v.x, v.y);
                                __half2 h1 = __floats2half2_rn(v.z, v.w);
                                float2 f0 = __half22float2(h0), f1 = __half22float2(h1);
                                __half2 l0 = __floats2half2_rn(v.x - f0.x, v.y - f0.y);
                                __half2 l1 = __floats2half2_rn(v.z - f1.x, v.w - f1.y);
                                *(uint2 *) (hi_s + at) =
                                        make_uint2(*(uint32_t *) &h0, *(uint32_t *) &h1);
                                *(uint2 *) (lo_s + at) =
                                        make_uint2(*(uint32_t *) &l0, *(uint32_t *) &l1);
                                return;
                        }
                        uint32_t i = mg + MG * (j - n_nope);
                        uint32_t r = r0 + i / R4, k = 2 * (i % R4);
                        bool first = j == threadIdx.x;
                        float2 x = rope_rot(v.x, v.y,
                                first ? cs0[0] : rope_cs(pos[r], inv_freq, k, af));
                        float2 y = rope_rot(v.z, v.w,
                                first ? cs0[1] : rope_cs(pos[r], inv_freq, k + 1, af));
                        __half2 *o = (__half2 *) (q + ((size_t) r * H + h) * W + rank + 2 * k);
                        o[0] = __floats2half2_rn(x.x, x.y);
                        o[1] = __floats2half2_rn(y.x, y.y);
                });
        for (uint32_t i = nr * P4 + threadIdx.x; i < nrt * 8 * P4; i += blockDim.x) {
                uint32_t at = i / P4 * LD + 4 * (i % P4);
                *(uint2 *) (hi_s + at) = make_uint2(0, 0);
                *(uint2 *) (lo_s + at) = make_uint2(0, 0);
        }
        __syncthreads();

        /* row tiles two at a time, so that their mma chains overlap; the hi and lo halves
         * go into separate sums, added at the end */
        for (uint32_t rt = 0; rt < nrt; rt += 2) {
                bool two = rt + 1 < nrt;
                float c[2][2][4] = {};
#pragma unroll
                for (uint32_t u = 0; u < 2; u++) {
                        if (u == 1 && !two)
                                break;
                        const __half *bh = hi_s + ((rt + u) * 8 + g) * LD + 2 * tq;
                        const __half *bl = lo_s + ((rt + u) * 8 + g) * LD + 2 * tq;
#pragma unroll
                        for (uint32_t ks = 0; ks < MLA_KS_MAX; ks++) {
                                if (ks >= KS)
                                        break;
                                mla_mma4(c[u][0], a[ks], lds32(bh + 16 * ks),
                                        lds32(bh + 16 * ks + 8));
                                mla_mma4(c[u][1], a[ks], lds32(bl + 16 * ks),
                                        lds32(bl + 16 * ks + 8));
                        }
                }
#pragma unroll
                for (uint32_t u = 0; u < 2; u++) {
                        if (u == 1 && !two)
                                break;
                        float d[4];
#pragma unroll
                        for (uint32_t j = 0; j < 4; j++)
                                d[j] = c[u][0][j] + c[u][1][j];
                        mla_store(d, q + ((size_t) r0 * H + h) * W, (size_t) H * W,
                                (rt + u) * 8 + 2 * tq, nr, mt * 16 + g);
                }
        }
}

static uint32_t mla_absorb_smem(uint32_t P)
{
        return 2 * MLA_RB * (P + 8) * 2;
}

void cu_mla_absorb(cudaStream_t st, const float *part, uint32_t splits, size_t slice_stride,
        const float *bias, uint32_t ld, CuMeta meta, uint32_t rows, uint32_t H, uint32_t P,
        uint32_t R, uint32_t rank, const float *inv_freq, float af, const __half *wk, __half *q,
        const CuMlaKv *kv)
{
        static bool opted;
        if (!opted) {
                for (auto k : {k_mla_absorb<128, 64>, k_mla_absorb<0, 0>})
                        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int) mla_absorb_smem(16 * MLA_KS_MAX));
                opted = true;
        }
        /* DeepSeek-V2 and V3's head dimensions compiled in */
        auto k = P == 128 && R == 64 ? k_mla_absorb<128, 64> : k_mla_absorb<0, 0>;
        uint32_t n_gemm = rank / (16 * MLA_HW) * H * div_up(rows, MLA_RB);
        k<<<n_gemm + (kv ? rows : 0), MLA_HW * 32, mla_absorb_smem(P), st>>>(part, splits,
                slice_stride, bias, ld, meta.pos, meta.slot, rows, H, P, R, rank, inv_freq, af,
                (const uint4 *) wk, q, kv ? *kv : CuMlaKv{});
}

/* Blocks (m-tile, head, row group); warp w takes the w-th quarter of the rank's k-steps,
 * and warp 0 adds the others' sums to its own in warp order. */
__global__ void __launch_bounds__(MLA_HW * 32) k_mla_values(const __half *o_lat,
        const uint4 *__restrict__ wvt, uint32_t rows, uint32_t H, uint32_t rank, uint32_t Vd,
        __half *out)
{
        extern __shared__ uint4 smem[];
        __shared__ float4 red[(MLA_HW - 1) * (MLA_RB / 8) * 32];
        uint32_t MT = Vd / 16, bi = blockIdx.x, mt = bi % MT, h = bi / MT % H;
        uint32_t r0 = bi / (MT * H) * MLA_RB, nr = min((uint32_t) MLA_RB, rows - r0);
        uint32_t nrt = (nr + 7) / 8, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t g = lane / 4, tq = lane % 4, KS = rank / 16, KW = KS / MLA_HW, ks0 = warp * KW;
        uint32_t LD = rank + 8, units = rank / 8;

        uint4 a[MLA_KS_MAX / 2];
        const uint4 *wa = wvt + (((size_t) h * MT + mt) * KS + ks0) * 32 + lane;
#pragma unroll
        for (uint32_t ks = 0; ks < MLA_KS_MAX / 2; ks++)
                if (ks < KW)
                        a[ks] = __ldg(wa + ks * 32);
        /* the weights above are in flight while the latent rows' producer ends */
        pdl_wait();
        pdl_trigger();

        __half *in_s = (__half *) smem;
        for (uint32_t i0 = threadIdx.x; i0 < nrt * 8 * units; i0 += 2 * MLA_LOADS * blockDim.x) {
                uint4 v[2 * MLA_LOADS];
#pragma unroll
                for (uint32_t u = 0; u < 2 * MLA_LOADS; u++) {
                        uint32_t i = i0 + u * blockDim.x, r = i / units;
                        v[u] = r < nr ? *((const uint4 *) (o_lat +
                                                               ((size_t) (r0 + r) * H + h) * rank +
                                                               8 * (i % units)))
                                      : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
                for (uint32_t u = 0; u < 2 * MLA_LOADS; u++) {
                        uint32_t i = i0 + u * blockDim.x;
                        if (i < nrt * 8 * units)
                                *(uint4 *) (in_s + i / units * LD + 8 * (i % units)) = v[u];
                }
        }
        __syncthreads();

        float c[MLA_RB / 8][4];
#pragma unroll
        for (uint32_t rt = 0; rt < MLA_RB / 8; rt++)
                c[rt][0] = c[rt][1] = c[rt][2] = c[rt][3] = 0.0f;
#pragma unroll
        for (uint32_t rt = 0; rt < MLA_RB / 8; rt++) {
                if (rt >= nrt)
                        break;
                const __half *bp = in_s + (rt * 8 + g) * LD + 16 * ks0 + 2 * tq;
#pragma unroll
                for (uint32_t ks = 0; ks < MLA_KS_MAX / 2; ks++) {
                        if (ks >= KW)
                                break;
                        mla_mma4(c[rt], a[ks], lds32(bp + 16 * ks), lds32(bp + 16 * ks + 8));
                }
        }
        if (warp > 0) {
#pragma unroll
                for (uint32_t rt = 0; rt < MLA_RB / 8; rt++) {
                        if (rt >= nrt)
                                break;
                        red[((warp - 1) * (MLA_RB / 8) + rt) * 32 + lane] =
                                make_float4(c[rt][0], c[rt][1], c[rt][2], c[rt][3]);
                }
        }
        __syncthreads();
        if (warp > 0)
                return;
#pragma unroll
        for (uint32_t rt = 0; rt < MLA_RB / 8; rt++) {
                if (rt >= nrt)
                        break;
                for (uint32_t w = 1; w < MLA_HW; w++) {
                        float4 o = red[((w - 1) * (MLA_RB / 8) + rt) * 32 + lane];
                        c[rt][0] += o.x;
                        c[rt][1] += o.y;
                        c[rt][2] += o.z;
                        c[rt][3] += o.w;
                }
                mla_store(c[rt], out + ((size_t) r0 * H + h) * Vd, (size_t) H * Vd,
                        rt * 8 + 2 * tq, nr, mt * 16 + g);
        }
}

static uint32_t mla_values_smem(uint32_t rank)
{
        return MLA_RB * (rank + 8) * 2;
}

void cu_mla_values(cudaStream_t st, const __half *o_lat, const __half *wvt, uint32_t rows,
        uint32_t H, uint32_t rank, uint32_t Vd, __half *out)
{
        static bool opted;
        if (!opted) {
                cudaFuncSetAttribute(k_mla_values, cudaFuncAttributeMaxDynamicSharedMemorySize,
                        (int) mla_values_smem(MLA_RANK_MAX));
                opted = true;
        }
        uint32_t blocks = Vd / 16 * H * div_up(rows, MLA_RB);
        k_mla_values<<<blocks, MLA_HW * 32, mla_values_smem(rank), st>>>(o_lat,
                (const uint4 *) wvt, rows, H, rank, Vd, out);
}

/* Element e (0 .. 8) of lane's A fragment in tile (mt, ks): A[m][k] with m, k below. */
static __device__ __forceinline__ uint2 mla_frag_mk(size_t j, uint32_t KS)
{
        uint32_t e = (uint32_t) (j % 8), lane = (uint32_t) (j / 8 % 32);
        uint32_t tile = (uint32_t) (j / 256), mt = tile / KS, ks = tile % KS, reg = e / 2;
        return make_uint2(mt * 16 + lane / 4 + 8 * (reg & 1),
                ks * 16 + 2 * (lane % 4) + (e & 1) + 8 * (reg >> 1));
}

/* wk: A[c][p] = kv_b.W[h (P + Vd) + p][c]; wvt: A[v][c] = kv_b.W[h (P + Vd) + P + v][c]. */
__global__ void k_mla_split_kvb(const __half *w16, uint32_t H, uint32_t P, uint32_t Vd,
        uint32_t rank, __half *wk, __half *wvt)
{
        pdl_wait();
        size_t per = (size_t) P * rank, n = (size_t) H * per;
        for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < n;
                i += (size_t) gridDim.x * blockDim.x) {
                uint32_t h = (uint32_t) (i / per);
                uint2 mk = mla_frag_mk(i % per, P / 16);
                wk[i] = w16[((size_t) h * (P + Vd) + mk.y) * rank + mk.x];
        }
        per = (size_t) Vd * rank;
        n = (size_t) H * per;
        for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < n;
                i += (size_t) gridDim.x * blockDim.x) {
                uint32_t h = (uint32_t) (i / per);
                uint2 mk = mla_frag_mk(i % per, rank / 16);
                wvt[i] = w16[((size_t) h * (P + Vd) + P + mk.x) * rank + mk.y];
        }
}

void cu_mla_split_kvb(cudaStream_t st, const __half *w16, uint32_t H, uint32_t P, uint32_t Vd,
        uint32_t rank, __half *wk, __half *wvt)
{
        k_mla_split_kvb<<<1024, 256, 0, st>>>(w16, H, P, Vd, rank, wk, wvt);
}

/* ---------------------------------------------------------------------------------------
 * Attention over the latent cache, on tensor cores
 *
 * One block of MLA_THREADS (4 warps) per (work item, group of MLA_HEADS heads): the 16
 * heads are the M of mma.m16n8k16 (FlashMLA's observation: absorbed MLA decode is a
 * 16-row GEMM against the shared latent rows). The group's FP16 queries and the item's
 * positions, in chunks of MLA_CHUNK latent rows, come to shared memory through cp.async,
 * double-buffered: the next chunk loads while this one is computed. Per chunk: S = Q·Kᵀ over the W = rank + R dimensions
 * (warp w on positions 8w..8w+8), the online softmax per head in float32 (running max and
 * sum, the chunk's P as FP16), then O += P·V over the first rank dimensions (warp w on
 * dimensions w·rank/4 .. (w+1)·rank/4, V's fragments by ldmatrix.trans). O, m and l are
 * float32; the result is the same partial (acc, ml) the combine kernel merges. Everything
 * depends on the item only, so a row's output does not depend on the batch.
 *
 * VS 2 or 4 (steps whose items leave SMs idle: batch 1 has 17 at a 512-position context):
 * VS blocks per (item, group), each with S and the softmax in full and O over 1 / VS of the
 * rank dimensions, so that a warp's P·V and stores are shorter; each dimension's arithmetic
 * is unchanged (the same bits). Two blocks took V2-Lite batch 1 1.1% less time (docs/PERF.md,
 * ninth session), four another 0.3% (thirtieth session). */
#define MLA_THREADS 128
#define MLA_NT_MAX  (MLA_RANK_MAX / 32) /* n-tiles of 8 dimensions per warp in P·V */

/* Starts loading rows of W halves into buf (row stride WS), row r < nrows from src(r)
 * when r < live else zeros, warp w on rows w, w + 4, .. and its lanes on the 16-byte
 * units of a row. The caller commits the group. */
template <typename Src>
static __device__ __forceinline__ void mla_rows(__half *buf, uint32_t nrows, uint32_t live,
        uint32_t W, uint32_t WS, Src src)
{
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, units = W / 8;
        for (uint32_t r = warp; r < nrows; r += MLA_THREADS / 32) {
                const __half *p = src(r < live ? r : 0);
                for (uint32_t u = lane; u < units; u += 32)
                        cp_async16(buf + r * WS + 8 * u, p + 8 * u, r < live);
        }
}

/* Starts loading latent rows c0 .. c0 + cn of the item (slots in slot_s) into buf, zeros
 * up to MLA_CHUNK rows, as one cp.async group. */
static __device__ __forceinline__ void mla_stage(__half *buf, const __half *cache,
        const uint32_t *slot_s, uint32_t c0, uint32_t cn, uint32_t W, uint32_t WS)
{
        mla_rows(buf, MLA_CHUNK, cn, W, WS,
                [=](uint32_t r) { return cache + (size_t) slot_s[c0 + r] * W; });
        cp_async_commit();
}

/* x[i] without indexing the register array at run time. */
static __device__ __forceinline__ float pick4(const float (&x)[4], uint32_t i)
{
        return i == 0 ? x[0] : i == 1 ? x[1] : i == 2 ? x[2] : x[3];
}

template <uint32_t VS>
__global__ void __launch_bounds__(MLA_THREADS) k_mla_attention(const __half *q,
        const __half *cache, const uint32_t *meta, const uint32_t *row_bt,
        uint32_t bt_tokens, uint32_t H, uint32_t rank, uint32_t R, float scale,
        float *acc_out, float2 *ml_out)
{
        extern __shared__ uint4 smem[];
        uint32_t W = rank + R, WS = W + 8; /* row stride of q_h and kv_s, in halves */
        uint32_t h0 = blockIdx.y / VS * MLA_HEADS, hg = min((uint32_t) MLA_HEADS, H - h0);
        uint32_t vp = blockIdx.y % VS;
        __half *q_h = (__half *) smem;                          /* (16, WS) */
        __half *kv_b = q_h + MLA_HEADS * WS;                    /* (2, MLA_CHUNK, WS) */
        float *p_s = (float *) (kv_b + 2 * MLA_CHUNK * WS);     /* (16, MLA_CHUNK) */
        __half *p_h = (__half *) (p_s + MLA_HEADS * MLA_CHUNK); /* (16, MLA_CHUNK + 8) */
        uint32_t *slot_s = (uint32_t *) (p_h + MLA_HEADS * (MLA_CHUNK + 8)); /* (MLA_ITEM) */
        float *m_s = (float *) (slot_s + MLA_ITEM);             /* (16) running max */
        float *l_s = m_s + MLA_HEADS;                           /* (16) running sum */
        float *f_s = l_s + MLA_HEADS;                           /* (16) rescale factor */
        uint32_t n_items = meta[0];
        const int4 *items = (const int4 *) (meta + meta[1]);
        uint32_t t = threadIdx.x, warp = t / 32, lane = t % 32, g = lane / 4, tq = lane % 4;
        uint32_t nt = rank / VS / 32, d0 = vp * (rank / VS) + warp * (rank / VS / 4);

        for (uint32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
                /* row, first position, end position, first position the step writes */
                int4 item = items[it];
                uint32_t row = (uint32_t) item.x, t0 = (uint32_t) item.y;
                uint32_t n = (uint32_t) (item.z - item.y);
                uint32_t fresh = (uint32_t) max(item.w - item.y, 0);

                __syncthreads(); /* the previous item's readers are done with shared memory */
                for (uint32_t i = t; i < n; i += MLA_THREADS) {
                        uint32_t p = t0 + i;
                        uint32_t block = meta[row_bt[row] + p / bt_tokens];
                        slot_s[i] = block * bt_tokens + p % bt_tokens;
                }
                if (t < MLA_HEADS) {
                        m_s[t] = -FLT_MAX;
                        l_s[t] = 0.0f;
                }
                constexpr uint32_t NT = MLA_NT_MAX / VS;
                float o[NT][4];
#pragma unroll
                for (uint32_t j = 0; j < NT; j++)
                        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
                __syncthreads();

                /* The first chunk's latent rows of earlier steps load before the wait on
                 * the kernel that writes the queries and this step's rows, overlapping
                 * it; then the group's queries (zeros past hg heads) and this step's rows
                 * of the chunk, as a second group. */
                uint32_t cn0 = min((uint32_t) MLA_CHUNK, n), pre = min(cn0, fresh);
                mla_rows(kv_b, pre, pre, W, WS,
                        [=](uint32_t r) { return cache + (size_t) slot_s[r] * W; });
                cp_async_commit();
                pdl_wait();
                if (it == blockIdx.x)
                        pdl_trigger();
                const __half *qg = q + ((size_t) row * H + h0) * W;
                mla_rows(q_h, MLA_HEADS, hg, W, WS, [=](uint32_t r) { return qg + (size_t) r * W; });
                mla_rows(kv_b + pre * WS, MLA_CHUNK - pre, cn0 - pre, W, WS,
                        [=](uint32_t r) { return cache + (size_t) slot_s[pre + r] * W; });
                cp_async_commit();
                for (uint32_t c0 = 0, ci = 0; c0 < n; c0 += MLA_CHUNK, ci++) {
                        uint32_t cn = min((uint32_t) MLA_CHUNK, n - c0);
                        const __half *kv_s = kv_b + (ci % 2) * MLA_CHUNK * WS;
                        if (c0 + MLA_CHUNK < n) {
                                mla_stage(kv_b + (1 - ci % 2) * MLA_CHUNK * WS, cache, slot_s,
                                        c0 + MLA_CHUNK,
                                        min((uint32_t) MLA_CHUNK, n - c0 - MLA_CHUNK), W, WS);
                                cp_async_wait<1>();
                        } else {
                                cp_async_wait<0>();
                        }
                        __syncthreads();

                        /* S = Q·Kᵀ: warp w on the chunk's positions 8w .. 8w + 8, fragments
                         * by ldmatrix (A: heads (lane % 8, + 8) x k (+ 8 from lane 16); B:
                         * positions x k (+ 8 from lane 8)), even and odd k-steps into two
                         * sums added at the end */
                        {
                                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                                float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                                const __half *qa = q_h + (lane % 8 + 8 * (lane / 8 % 2)) * WS +
                                                   8 * (lane / 16);
                                const __half *kr = kv_s + (8 * warp + lane % 8) * WS +
                                                   8 * (lane / 8 % 2);
                                uint32_t a[4], b[2], k = 0;
                                for (; k + 32 <= W; k += 32) {
                                        ldsm_x4(a, qa + k);
                                        ldsm_x2(b, kr + k);
                                        mma16816(c, a, b[0], b[1]);
                                        ldsm_x4(a, qa + k + 16);
                                        ldsm_x2(b, kr + k + 16);
                                        mma16816(d, a, b[0], b[1]);
                                }
                                if (k < W) {
                                        ldsm_x4(a, qa + k);
                                        ldsm_x2(b, kr + k);
                                        mma16816(c, a, b[0], b[1]);
                                }
#pragma unroll
                                for (uint32_t j = 0; j < 4; j++)
                                        c[j] += d[j];
                                uint32_t i = 8 * warp + 2 * tq;
                                p_s[g * MLA_CHUNK + i] = i < cn ? c[0] * scale : -FLT_MAX;
                                p_s[g * MLA_CHUNK + i + 1] = i + 1 < cn ? c[1] * scale : -FLT_MAX;
                                p_s[(g + 8) * MLA_CHUNK + i] = i < cn ? c[2] * scale : -FLT_MAX;
                                p_s[(g + 8) * MLA_CHUNK + i + 1] =
                                        i + 1 < cn ? c[3] * scale : -FLT_MAX;
                        }
                        __syncthreads();

                        /* online softmax: warp w on heads 4w .. 4w + 4 together, lane on a
                         * position */
                        {
                                float sv[4], cm[4], mo[4], mn[4], ls[4];
#pragma unroll
                                for (uint32_t j = 0; j < 4; j++)
                                        cm[j] = sv[j] = p_s[(4 * warp + j) * MLA_CHUNK + lane];
#pragma unroll
                                for (int off = 16; off > 0; off >>= 1)
#pragma unroll
                                        for (uint32_t j = 0; j < 4; j++)
                                                cm[j] = fmaxf(cm[j],
                                                        __shfl_xor_sync(0xffffffffu, cm[j], off));
#pragma unroll
                                for (uint32_t j = 0; j < 4; j++) {
                                        uint32_t h = 4 * warp + j;
                                        mo[j] = m_s[h];
                                        mn[j] = fmaxf(mo[j], cm[j]);
                                        ls[j] = lane < cn ? expf(sv[j] - mn[j]) : 0.0f;
                                        p_h[h * (MLA_CHUNK + 8) + lane] = __float2half(ls[j]);
                                }
#pragma unroll
                                for (int off = 16; off > 0; off >>= 1)
#pragma unroll
                                        for (uint32_t j = 0; j < 4; j++)
                                                ls[j] += __shfl_xor_sync(0xffffffffu, ls[j], off);
                                __syncwarp();
                                if (lane < 4) {
                                        uint32_t h = 4 * warp + lane;
                                        float m_old = pick4(mo, lane), m_new = pick4(mn, lane);
                                        float f = expf(m_old - m_new);
                                        f_s[h] = f;
                                        l_s[h] = l_s[h] * f + pick4(ls, lane);
                                        m_s[h] = m_new;
                                }
                        }
                        __syncthreads();

                        /* O = O·f + P·V over the warp's dimensions */
                        float fa = f_s[g], fb = f_s[g + 8];
#pragma unroll
                        for (uint32_t j = 0; j < NT; j++) {
                                o[j][0] *= fa;
                                o[j][1] *= fa;
                                o[j][2] *= fb;
                                o[j][3] *= fb;
                        }
                        const __half *pa = p_h + g * (MLA_CHUNK + 8) + 2 * tq;
#pragma unroll
                        for (uint32_t k = 0; k < MLA_CHUNK; k += 16) {
                                uint32_t a[4] = {lds32(pa + k), lds32(pa + 8 * (MLA_CHUNK + 8) + k),
                                        lds32(pa + k + 8), lds32(pa + 8 * (MLA_CHUNK + 8) + k + 8)};
                                /* ldmatrix.x4.trans: matrices (rows k..k+8 | k+8..k+16) x
                                 * (dims n..n+8 | n+8..n+16) give the B fragments of two
                                 * n-tiles */
                                uint32_t lr = k + (lane % 8) + 8 * ((lane / 8) % 2);
#pragma unroll
                                for (uint32_t j = 0; j < NT; j += 2) {
                                        if (j >= nt)
                                                break;
                                        uint32_t col = d0 + 8 * j + 8 * (lane / 16);
                                        uint32_t b[4];
                                        ldsm_x4_t(b, kv_s + lr * WS + col);
                                        mma16816(o[j], a, b[0], b[1]);
                                        mma16816(o[j + 1], a, b[2], b[3]);
                                }
                        }
                        __syncthreads(); /* kv_s is refilled two chunks on, p_h next */
                }

                /* the item's partials: unnormalised O with its max and sum per head */
#pragma unroll
                for (uint32_t j = 0; j < NT; j++) {
                        if (j >= nt)
                                break;
                        uint32_t d = d0 + 8 * j + 2 * tq;
                        if (g < hg)
                                *(float2 *) (acc_out + ((size_t) it * H + h0 + g) * rank + d) =
                                        make_float2(o[j][0], o[j][1]);
                        if (g + 8 < hg)
                                *(float2 *) (acc_out + ((size_t) it * H + h0 + g + 8) * rank + d) =
                                        make_float2(o[j][2], o[j][3]);
                }
                if (t < hg && vp == 0)
                        ml_out[(size_t) it * H + h0 + t] = make_float2(m_s[t], l_s[t]);
        }
}

static size_t mla_smem(uint32_t W)
{
        return ((size_t) MLA_HEADS + 2 * MLA_CHUNK) * (W + 8) * 2 + MLA_HEADS * MLA_CHUNK * 4 +
               MLA_HEADS * (MLA_CHUNK + 8) * 2 + MLA_ITEM * 4 + 3 * MLA_HEADS * 4;
}

void cu_mla_attention(cudaStream_t st, const __half *q, const __half *cache, CuMeta meta,
        uint32_t grid, uint32_t v_split, uint32_t block_tokens, uint32_t H, uint32_t rank,
        uint32_t R, float scale, float *acc, float2 *ml)
{
        static bool opted;
        if (!opted) {
                cudaFuncSetAttribute(k_mla_attention<1>,
                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int) mla_smem(MLA_WIDTH_MAX));
                cudaFuncSetAttribute(k_mla_attention<2>,
                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int) mla_smem(MLA_WIDTH_MAX));
                cudaFuncSetAttribute(k_mla_attention<4>,
                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int) mla_smem(MLA_WIDTH_MAX));
                opted = true;
        }
        /* a block's share of the rank is whole 16-dimension tiles of the 4 warps */
        uint32_t vs = v_split == 4 && rank % 256 == 0 ? 4 : v_split >= 2 && rank % 128 == 0 ? 2 : 1;
        dim3 blocks(grid, div_up(H, MLA_HEADS) * vs);
        auto k = vs == 4 ? k_mla_attention<4> : vs == 2 ? k_mla_attention<2> : k_mla_attention<1>;
        k<<<blocks, MLA_THREADS, mla_smem(rank + R), st>>>(q, cache, meta.base, meta.row_bt,
                block_tokens, H, rank, R, scale, acc, ml);
}
