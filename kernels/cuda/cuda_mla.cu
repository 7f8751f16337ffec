/* SPDX-License-Identifier: MIT */
/* Multi-head latent attention kernels (see cuda_deepseek.cuh), in the order a layer runs
 * them. Every sum runs in a fixed order, so a row's results do not depend on the batch. */
#include <float.h>

#include "cuda_deepseek.cuh"

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

__device__ __forceinline__ float part_at(const float *part, uint32_t splits, size_t stride,
        size_t at, const float *bias, uint32_t col)
{
        float y = 0.0f;
        for (uint32_t s = 0; s < splits; s++)
                y += part[s * stride + at];
        return bias ? y + bias[col] : y;
}

/* The interleaved rope of cpu_rope_apply_pairs on the pair (a, b) at frequency i. */
__device__ __forceinline__ float2 rope_pair(float a, float b, uint32_t pos, const float *inv_freq,
        uint32_t i, float af)
{
        float c, s;
        sincosf((float) pos * inv_freq[i], &s, &c);
        c *= af;
        s *= af;
        return make_float2(a * c - b * s, a * s + b * c);
}

/* ---------------------------------------------------------------------------------------
 * Projections around the attention */

__global__ void k_mla_kv(const float *__restrict__ part, uint32_t splits, size_t stride,
        const float *__restrict__ bias, uint32_t ld, uint32_t col0, const uint32_t *pos,
        const uint32_t *slot, uint32_t rank, uint32_t R, const float *norm_w, float eps,
        const float *inv_freq, float af, __half *cache)
{
        __shared__ float v[MLA_WIDTH_MAX];
        uint32_t r = blockIdx.x, W = rank + R;
        size_t row = (size_t) r * ld + col0;
        __half *out = cache + (size_t) slot[r] * W;
        float ss = 0.0f;

        for (uint32_t i = threadIdx.x; i < W; i += blockDim.x) {
                v[i] = part_at(part, splits, stride, row + i, bias, col0 + i);
                if (i < rank)
                        ss += v[i] * v[i];
        }
        float inv = 1.0f / sqrtf(mla_block_sum(ss) / (float) rank + eps);
        for (uint32_t i = threadIdx.x; i < rank; i += blockDim.x)
                out[i] = __float2half(norm_w[i] * (v[i] * inv));
        for (uint32_t i = threadIdx.x; i < R / 2; i += blockDim.x) {
                float2 o = rope_pair(v[rank + 2 * i], v[rank + 2 * i + 1], pos[r], inv_freq, i, af);
                out[rank + 2 * i] = __float2half(o.x);
                out[rank + 2 * i + 1] = __float2half(o.y);
        }
}

void cu_mla_kv(cudaStream_t st, const float *part, uint32_t splits, size_t slice_stride,
        const float *bias, uint32_t ld, uint32_t col0, CuMeta meta, uint32_t rows, uint32_t rank,
        uint32_t R, const float *norm_w, float eps, const float *inv_freq, float af,
        __half *cache)
{
        k_mla_kv<<<rows, 256, 0, st>>>(part, splits, slice_stride, bias, ld, col0, meta.pos,
                meta.slot, rank, R, norm_w, eps, inv_freq, af, cache);
}

__global__ void k_mla_q_norm(const float *__restrict__ part, uint32_t splits, size_t stride,
        const float *__restrict__ bias, uint32_t ld, uint32_t n, const float *norm_w, float eps,
        __half *xq)
{
        extern __shared__ float qa[];
        uint32_t r = blockIdx.x;
        float ss = 0.0f;

        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
                qa[i] = part_at(part, splits, stride, (size_t) r * ld + i, bias, i);
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

/* One block per (row, head). */
__global__ void k_mla_q(const float *__restrict__ part, uint32_t splits, size_t stride,
        const float *__restrict__ bias, uint32_t ld, const uint32_t *pos, uint32_t H, uint32_t P,
        uint32_t R, uint32_t rank, const float *inv_freq, float af, float *qn, float *q)
{
        uint32_t r = blockIdx.x, h = blockIdx.y, qk = P + R;
        size_t row = (size_t) r * ld;
        uint32_t c0 = h * qk;

        for (uint32_t i = threadIdx.x; i < P; i += blockDim.x)
                qn[((size_t) r * H + h) * P + i] = part_at(part, splits, stride, row + c0 + i, bias, c0 + i);
        for (uint32_t i = threadIdx.x; i < R / 2; i += blockDim.x) {
                uint32_t c = c0 + P + 2 * i;
                float a = part_at(part, splits, stride, row + c, bias, c);
                float b = part_at(part, splits, stride, row + c + 1, bias, c + 1);
                float2 o = rope_pair(a, b, pos[r], inv_freq, i, af);
                float *qp = q + ((size_t) r * H + h) * (rank + R) + rank;
                qp[2 * i] = o.x;
                qp[2 * i + 1] = o.y;
        }
}

void cu_mla_q(cudaStream_t st, const float *part, uint32_t splits, size_t slice_stride,
        const float *bias, uint32_t ld, CuMeta meta, uint32_t rows, uint32_t H, uint32_t P,
        uint32_t R, uint32_t rank, const float *inv_freq, float af, float *qn, float *q)
{
        dim3 grid(rows, H);
        k_mla_q<<<grid, 128, 0, st>>>(part, splits, slice_stride, bias, ld, meta.pos, H, P, R, rank,
                inv_freq, af, qn, q);
}

/* The absorb and values kernels: a block takes MLA_RB rows (each weight load serves them
 * all), one head and MLA_COLS output columns, lane l on columns 2l, 2l + 1; its warps split
 * the reduction dimension into MLA_WARPS consecutive slices and add their sums in warp
 * order through shared memory, so a row's result does not depend on the other rows. */
#define MLA_RB    8
#define MLA_COLS  64
#define MLA_WARPS 16

/* Adds the warps' (MLA_RB, MLA_COLS) partial sums in warp order; warp 0's lanes get them. */
__device__ void mla_reduce(float2 (&acc)[MLA_RB], float2 *red)
{
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        if (warp > 0)
                for (uint32_t j = 0; j < MLA_RB; j++)
                        red[((warp - 1) * MLA_RB + j) * 32 + lane] = acc[j];
        __syncthreads();
        if (warp == 0)
                for (uint32_t w = 1; w < MLA_WARPS; w++)
                        for (uint32_t j = 0; j < MLA_RB; j++) {
                                float2 o = red[((w - 1) * MLA_RB + j) * 32 + lane];
                                acc[j].x += o.x;
                                acc[j].y += o.y;
                        }
}

/* Blocks (rank / MLA_COLS, H, row groups). q_nope slice values come from the float32 qn. */
__global__ void __launch_bounds__(MLA_WARPS * 32) k_mla_absorb(const float *__restrict__ qn,
        const __half *__restrict__ wk, uint32_t rows, uint32_t H, uint32_t P, uint32_t rank,
        uint32_t R, float *q)
{
        __shared__ float2 red[(MLA_WARPS - 1) * MLA_RB * 32];
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t c = blockIdx.x * MLA_COLS + 2 * lane, h = blockIdx.y, r0 = blockIdx.z * MLA_RB;
        uint32_t nr = min((uint32_t) MLA_RB, rows - r0);
        uint32_t p0 = (uint32_t) ((uint64_t) P * warp / MLA_WARPS);
        uint32_t p1 = (uint32_t) ((uint64_t) P * (warp + 1) / MLA_WARPS);
        bool live = c < rank;
        float2 acc[MLA_RB];
#pragma unroll
        for (uint32_t j = 0; j < MLA_RB; j++)
                acc[j] = make_float2(0.0f, 0.0f);
        const __half2 *w = (const __half2 *) (wk + (size_t) h * P * rank + (live ? c : 0));
        for (uint32_t p = p0; p < p1; p += 4) {
                float2 wf[4];
#pragma unroll
                for (uint32_t i = 0; i < 4; i++)
                        wf[i] = p + i < p1 && live ? __half22float2(w[(size_t) (p + i) * rank / 2])
                                                   : make_float2(0.0f, 0.0f);
#pragma unroll
                for (uint32_t j = 0; j < MLA_RB; j++) {
                        if (j >= nr)
                                break;
                        const float *qr = qn + ((size_t) (r0 + j) * H + h) * P;
#pragma unroll
                        for (uint32_t i = 0; i < 4; i++)
                                if (p + i < p1) {
                                        float a = __ldg(qr + p + i);
                                        acc[j].x += a * wf[i].x;
                                        acc[j].y += a * wf[i].y;
                                }
                }
        }
        mla_reduce(acc, red);
        if (warp == 0 && live)
                for (uint32_t j = 0; j < nr; j++)
                        *(float2 *) (q + ((size_t) (r0 + j) * H + h) * (rank + R) + c) = acc[j];
}

void cu_mla_absorb(cudaStream_t st, const float *qn, const __half *wk, uint32_t rows, uint32_t H,
        uint32_t P, uint32_t rank, uint32_t R, float *q)
{
        dim3 grid(div_up(rank, MLA_COLS), H, div_up(rows, MLA_RB));
        k_mla_absorb<<<grid, MLA_WARPS * 32, 0, st>>>(qn, wk, rows, H, P, rank, R, q);
}

/* Blocks (Vd / MLA_COLS, H, row groups): the latent columns are the reduction. */
__global__ void __launch_bounds__(MLA_WARPS * 32) k_mla_values(const __half *__restrict__ o_lat,
        const __half *__restrict__ wvt, uint32_t rows, uint32_t H, uint32_t rank, uint32_t Vd,
        __half *out)
{
        __shared__ float2 red[(MLA_WARPS - 1) * MLA_RB * 32];
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t v = blockIdx.x * MLA_COLS + 2 * lane, h = blockIdx.y, r0 = blockIdx.z * MLA_RB;
        uint32_t nr = min((uint32_t) MLA_RB, rows - r0);
        uint32_t c0 = (uint32_t) ((uint64_t) rank * warp / MLA_WARPS);
        uint32_t c1 = (uint32_t) ((uint64_t) rank * (warp + 1) / MLA_WARPS);
        bool live = v < Vd;
        float2 acc[MLA_RB];
#pragma unroll
        for (uint32_t j = 0; j < MLA_RB; j++)
                acc[j] = make_float2(0.0f, 0.0f);
        const __half2 *w = (const __half2 *) (wvt + (size_t) h * rank * Vd + (live ? v : 0));
        for (uint32_t c = c0; c < c1; c += 4) {
                float2 wf[4];
#pragma unroll
                for (uint32_t i = 0; i < 4; i++)
                        wf[i] = c + i < c1 && live ? __half22float2(w[(size_t) (c + i) * Vd / 2])
                                                   : make_float2(0.0f, 0.0f);
#pragma unroll
                for (uint32_t j = 0; j < MLA_RB; j++) {
                        if (j >= nr)
                                break;
                        const __half *orow = o_lat + ((size_t) (r0 + j) * H + h) * rank;
#pragma unroll
                        for (uint32_t i = 0; i < 4; i++)
                                if (c + i < c1) {
                                        float a = __half2float(orow[c + i]);
                                        acc[j].x += a * wf[i].x;
                                        acc[j].y += a * wf[i].y;
                                }
                }
        }
        mla_reduce(acc, red);
        if (warp == 0 && live)
                for (uint32_t j = 0; j < nr; j++)
                        *(__half2 *) (out + ((size_t) (r0 + j) * H + h) * Vd + v) =
                                __floats2half2_rn(acc[j].x, acc[j].y);
}

void cu_mla_values(cudaStream_t st, const __half *o_lat, const __half *wvt, uint32_t rows,
        uint32_t H, uint32_t rank, uint32_t Vd, __half *out)
{
        dim3 grid(div_up(Vd, MLA_COLS), H, div_up(rows, MLA_RB));
        k_mla_values<<<grid, MLA_WARPS * 32, 0, st>>>(o_lat, wvt, rows, H, rank, Vd, out);
}

__global__ void k_mla_split_kvb(const __half *w16, uint32_t H, uint32_t P, uint32_t Vd,
        uint32_t rank, __half *wk, __half *wvt)
{
        size_t n = (size_t) H * (P + Vd) * rank;
        for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < n;
                i += (size_t) gridDim.x * blockDim.x) {
                uint32_t c = (uint32_t) (i % rank), o = (uint32_t) (i / rank);
                uint32_t h = o / (P + Vd), j = o % (P + Vd);
                if (j < P)
                        wk[((size_t) h * P + j) * rank + c] = w16[i];
                else
                        wvt[((size_t) h * rank + c) * Vd + (j - P)] = w16[i];
        }
}

void cu_mla_split_kvb(cudaStream_t st, const __half *w16, uint32_t H, uint32_t P, uint32_t Vd,
        uint32_t rank, __half *wk, __half *wvt)
{
        k_mla_split_kvb<<<1024, 256, 0, st>>>(w16, H, P, Vd, rank, wk, wvt);
}

/* ---------------------------------------------------------------------------------------
 * Attention over the latent cache
 *
 * One block of MLA_THREADS per (work item, head group): the group's queries (float32) in
 * shared memory; warp w scores positions w, w + 8, ... reading each latent row once for
 * all the group's heads (lane l on 16-byte units l, l + 32, ...); one warp per head turns
 * the scores into softmax numerators; then thread t sums latent columns 2t, 2t + 1 over the
 * item's positions for every head, eight rows in flight. */
#define MLA_THREADS 256

__global__ void __launch_bounds__(MLA_THREADS) k_mla_attention(const float *__restrict__ q,
        const __half *__restrict__ cache, const uint32_t *meta, const uint32_t *row_bt,
        uint32_t bt_tokens, uint32_t H, uint32_t rank, uint32_t R, float scale,
        float *__restrict__ acc_out, float2 *__restrict__ ml_out)
{
        extern __shared__ float4 sh4[];
        uint32_t W = rank + R, h0 = blockIdx.y * MLA_HEADS, hg = min((uint32_t) MLA_HEADS, H - h0);
        float *q_s = (float *) sh4;                           /* (hg, W) */
        float *p_s = q_s + MLA_HEADS * W;                     /* (hg, ATT_CHUNK) */
        uint32_t *slot_s = (uint32_t *) (p_s + MLA_HEADS * ATT_CHUNK); /* (ATT_CHUNK) */
        float *ml_s = (float *) (slot_s + ATT_CHUNK);         /* (hg, 2) */
        uint32_t n_items = meta[0];
        const int4 *items = (const int4 *) (meta + meta[1]);
        uint32_t t = threadIdx.x, warp = t / 32, lane = t % 32, units = W / 8;

        for (uint32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
                int4 item = items[it]; /* row, first position, end position */
                uint32_t row = (uint32_t) item.x, t0 = (uint32_t) item.y;
                uint32_t n = (uint32_t) (item.z - item.y);

                __syncthreads(); /* the previous item's readers are done with shared memory */
                {
                        const float4 *q4 = (const float4 *) (q + ((size_t) row * H + h0) * W);
                        for (uint32_t i = t; i < hg * W / 4; i += MLA_THREADS)
                                sh4[i] = q4[i];
                }
                if (t < n) {
                        uint32_t p = t0 + t;
                        uint32_t block = meta[row_bt[row] + p / bt_tokens];
                        slot_s[t] = block * bt_tokens + p % bt_tokens;
                }
                __syncthreads();

                for (uint32_t i = warp; i < n; i += MLA_THREADS / 32) {
                        const uint4 *k8 = (const uint4 *) (cache + (size_t) slot_s[i] * W);
                        uint4 u[3];
#pragma unroll
                        for (uint32_t j = 0; j < 3; j++)
                                u[j] = lane + 32 * j < units ? __ldg(k8 + lane + 32 * j)
                                                             : make_uint4(0, 0, 0, 0);
                        float s[MLA_HEADS];
#pragma unroll
                        for (uint32_t h = 0; h < MLA_HEADS; h++)
                                s[h] = 0.0f;
#pragma unroll
                        for (uint32_t j = 0; j < 3; j++) {
                                uint32_t un = lane + 32 * j;
                                if (un >= units)
                                        break;
                                float kf[8];
                                const __half2 *k2 = (const __half2 *) &u[j];
#pragma unroll
                                for (uint32_t e = 0; e < 4; e++) {
                                        float2 f = __half22float2(k2[e]);
                                        kf[2 * e] = f.x;
                                        kf[2 * e + 1] = f.y;
                                }
#pragma unroll
                                for (uint32_t h = 0; h < MLA_HEADS; h++) {
                                        if (h >= hg)
                                                break;
                                        const float4 *qa = (const float4 *) (q_s + h * W + 8 * un);
                                        float4 x0 = qa[0], x1 = qa[1];
                                        s[h] += x0.x * kf[0] + x0.y * kf[1] + x0.z * kf[2] +
                                                x0.w * kf[3] + x1.x * kf[4] + x1.y * kf[5] +
                                                x1.z * kf[6] + x1.w * kf[7];
                                }
                        }
#pragma unroll
                        for (uint32_t h = 0; h < MLA_HEADS; h++) {
                                if (h >= hg)
                                        break;
                                float v = s[h];
                                for (int o = 16; o > 0; o >>= 1)
                                        v += __shfl_xor_sync(0xffffffffu, v, o);
                                if (lane == 0)
                                        p_s[h * ATT_CHUNK + i] = v * scale;
                        }
                }
                __syncthreads();

                for (uint32_t h = warp; h < hg; h += MLA_THREADS / 32) {
                        float m = -FLT_MAX;
                        for (uint32_t i = lane; i < n; i += 32)
                                m = fmaxf(m, p_s[h * ATT_CHUNK + i]);
                        for (int o = 16; o > 0; o >>= 1)
                                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                        float l = 0.0f;
                        for (uint32_t i = lane; i < n; i += 32) {
                                float e = expf(p_s[h * ATT_CHUNK + i] - m);
                                p_s[h * ATT_CHUNK + i] = e;
                                l += e;
                        }
                        for (int o = 16; o > 0; o >>= 1)
                                l += __shfl_xor_sync(0xffffffffu, l, o);
                        if (lane == 0) {
                                ml_s[2 * h] = m;
                                ml_s[2 * h + 1] = l;
                        }
                }
                __syncthreads();

                uint32_t c = 2 * t;
                if (c < rank) {
                        float2 a[MLA_HEADS];
#pragma unroll
                        for (uint32_t h = 0; h < MLA_HEADS; h++)
                                a[h] = make_float2(0.0f, 0.0f);
                        for (uint32_t b = 0; b < n; b += 8) {
                                __half2 u[8];
#pragma unroll
                                for (uint32_t j = 0; j < 8; j++)
                                        u[j] = b + j < n ? __ldg((const __half2 *) (cache +
                                                                   (size_t) slot_s[b + j] * W + c))
                                                         : __float2half2_rn(0.0f);
#pragma unroll
                                for (uint32_t j = 0; j < 8; j++) {
                                        if (b + j >= n)
                                                break;
                                        float2 v = __half22float2(u[j]);
#pragma unroll
                                        for (uint32_t h = 0; h < MLA_HEADS; h++) {
                                                if (h >= hg)
                                                        break;
                                                float p = p_s[h * ATT_CHUNK + b + j];
                                                a[h].x += p * v.x;
                                                a[h].y += p * v.y;
                                        }
                                }
                        }
#pragma unroll
                        for (uint32_t h = 0; h < MLA_HEADS; h++)
                                if (h < hg)
                                        *(float2 *) (acc_out + ((size_t) it * H + h0 + h) * rank + c) = a[h];
                }
                if (t < hg)
                        ml_out[(size_t) it * H + h0 + t] = make_float2(ml_s[2 * t], ml_s[2 * t + 1]);
        }
}

void cu_mla_attention(cudaStream_t st, const float *q, const __half *cache, CuMeta meta,
        uint32_t grid, uint32_t block_tokens, uint32_t H, uint32_t rank, uint32_t R, float scale,
        float *acc, float2 *ml)
{
        size_t smem = ((size_t) MLA_HEADS * (rank + R) + (size_t) MLA_HEADS * ATT_CHUNK + ATT_CHUNK +
                              2 * MLA_HEADS) * sizeof(float);
        static bool opted;
        if (!opted) {
                cudaFuncSetAttribute(k_mla_attention, cudaFuncAttributeMaxDynamicSharedMemorySize,
                        (int) ((MLA_HEADS * MLA_WIDTH_MAX + MLA_HEADS * ATT_CHUNK + ATT_CHUNK +
                                       2 * MLA_HEADS) * sizeof(float)));
                opted = true;
        }
        dim3 blocks(grid, div_up(H, MLA_HEADS));
        k_mla_attention<<<blocks, MLA_THREADS, smem, st>>>(q, cache, meta.base, meta.row_bt,
                block_tokens, H, rank, R, scale, acc, ml);
}
