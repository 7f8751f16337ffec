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

/* The latent row of token r into the cache: one block. */
__device__ void mla_kv_row(const CuMlaKv &a, uint32_t r, uint32_t pos, uint32_t slot)
{
        __shared__ float v[MLA_WIDTH_MAX];
        uint32_t W = a.rank + a.R;
        size_t row = (size_t) r * a.ld + a.col0;
        __half *out = a.cache + (size_t) slot * W;
        float ss = 0.0f;

        for (uint32_t i = threadIdx.x; i < W; i += blockDim.x) {
                v[i] = sum_part(a.part, a.splits, a.stride, row + i, a.bias, a.col0 + i);
                if (i < a.rank)
                        ss += v[i] * v[i];
        }
        float inv = 1.0f / sqrtf(mla_block_sum(ss) / (float) a.rank + a.eps);
        for (uint32_t i = threadIdx.x; i < a.rank; i += blockDim.x)
                out[i] = __float2half(a.norm_w[i] * (v[i] * inv));
        for (uint32_t i = threadIdx.x; i < a.R / 2; i += blockDim.x) {
                float2 o = rope_pair(v[a.rank + 2 * i], v[a.rank + 2 * i + 1], pos, a.inv_freq, i,
                        a.af);
                out[a.rank + 2 * i] = __float2half(o.x);
                out[a.rank + 2 * i + 1] = __float2half(o.y);
        }
}

__global__ void k_mla_kv(const CuMlaKv a, const uint32_t *pos, const uint32_t *slot)
{
        mla_kv_row(a, blockIdx.x, pos[blockIdx.x], slot[blockIdx.x]);
}

void cu_mla_kv(cudaStream_t st, const CuMlaKv *kv, CuMeta meta, uint32_t rows)
{
        k_mla_kv<<<rows, 128, 0, st>>>(*kv, meta.pos, meta.slot);
}

__global__ void k_mla_q_norm(const float *__restrict__ part, uint32_t splits, size_t stride,
        const float *__restrict__ bias, uint32_t ld, uint32_t n, const float *norm_w, float eps,
        __half *xq)
{
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

/* One block per (row, head); with kv, block H of a row stores its latent row instead. */
__global__ void k_mla_q(const float *__restrict__ part, uint32_t splits, size_t stride,
        const float *__restrict__ bias, uint32_t ld, const uint32_t *pos, const uint32_t *slot,
        uint32_t H, uint32_t P, uint32_t R, uint32_t rank, const float *inv_freq, float af,
        float *qn, float *q, const CuMlaKv kv)
{
        uint32_t r = blockIdx.x, h = blockIdx.y, qk = P + R;
        size_t row = (size_t) r * ld;
        uint32_t c0 = h * qk;

        if (h == H) {
                mla_kv_row(kv, r, pos[r], slot[r]);
                return;
        }
        for (uint32_t i = threadIdx.x; i < P; i += blockDim.x)
                qn[((size_t) r * H + h) * P + i] = sum_part(part, splits, stride, row + c0 + i, bias, c0 + i);
        for (uint32_t i = threadIdx.x; i < R / 2; i += blockDim.x) {
                uint32_t c = c0 + P + 2 * i;
                float a = sum_part(part, splits, stride, row + c, bias, c);
                float b = sum_part(part, splits, stride, row + c + 1, bias, c + 1);
                float2 o = rope_pair(a, b, pos[r], inv_freq, i, af);
                float *qp = q + ((size_t) r * H + h) * (rank + R) + rank;
                qp[2 * i] = o.x;
                qp[2 * i + 1] = o.y;
        }
}

void cu_mla_q(cudaStream_t st, const float *part, uint32_t splits, size_t slice_stride,
        const float *bias, uint32_t ld, CuMeta meta, uint32_t rows, uint32_t H, uint32_t P,
        uint32_t R, uint32_t rank, const float *inv_freq, float af, float *qn, float *q,
        const CuMlaKv *kv)
{
        dim3 grid(rows, H + (kv ? 1 : 0));
        k_mla_q<<<grid, 128, 0, st>>>(part, splits, slice_stride, bias, ld, meta.pos, meta.slot, H,
                P, R, rank, inv_freq, af, qn, q, kv ? *kv : CuMlaKv{});
}

/* The absorb and values kernels: a block takes MLA_RB rows (each weight load serves them
 * all), one head and MLA_COLS output columns, lane l on columns 2l, 2l + 1; its warps split
 * the reduction dimension into MLA_WARPS consecutive slices and add their sums in warp
 * order through shared memory, so a row's result does not depend on the other rows. */
#define MLA_RB    16
#define MLA_COLS  64
#define MLA_WARPS 8

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

/* out[r][h][n] (row stride out_ld) = in[r][h][0 .. K) · w[h] (K, N): blocks (N / MLA_COLS,
 * H, row groups), the block's rows of in staged in shared memory as TI. */
template <typename TI, typename TO>
__global__ void __launch_bounds__(MLA_WARPS * 32) k_mla_heads(const TI *__restrict__ in,
        const __half *__restrict__ w, uint32_t rows, uint32_t H, uint32_t K, uint32_t N,
        uint32_t out_ld, TO *out)
{
        __shared__ float2 red[(MLA_WARPS - 1) * MLA_RB * 32];
        extern __shared__ float4 in_s4[]; /* (MLA_RB, K) */
        TI *in_s = (TI *) in_s4;
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t n = blockIdx.x * MLA_COLS + 2 * lane, h = blockIdx.y, r0 = blockIdx.z * MLA_RB;
        uint32_t nr = min((uint32_t) MLA_RB, rows - r0);
        for (uint32_t i = threadIdx.x; i < nr * K; i += blockDim.x)
                in_s[i] = in[((size_t) (r0 + i / K) * H + h) * K + i % K];
        __syncthreads();
        uint32_t k0 = (uint32_t) ((uint64_t) K * warp / MLA_WARPS);
        uint32_t k1 = (uint32_t) ((uint64_t) K * (warp + 1) / MLA_WARPS);
        bool live = n < N;
        float2 acc[MLA_RB];
#pragma unroll
        for (uint32_t j = 0; j < MLA_RB; j++)
                acc[j] = make_float2(0.0f, 0.0f);
        const __half2 *wh = (const __half2 *) (w + (size_t) h * K * N + (live ? n : 0));
        for (uint32_t k = k0; k < k1; k += 4) {
                float2 wf[4];
#pragma unroll
                for (uint32_t i = 0; i < 4; i++)
                        wf[i] = k + i < k1 && live ? __half22float2(wh[(size_t) (k + i) * N / 2])
                                                   : make_float2(0.0f, 0.0f);
#pragma unroll
                for (uint32_t j = 0; j < MLA_RB; j++) {
                        if (j >= nr)
                                break;
#pragma unroll
                        for (uint32_t i = 0; i < 4; i++)
                                if (k + i < k1) {
                                        float a = (float) in_s[j * K + k + i];
                                        acc[j].x += a * wf[i].x;
                                        acc[j].y += a * wf[i].y;
                                }
                }
        }
        mla_reduce(acc, red);
        if (warp == 0 && live)
                for (uint32_t j = 0; j < nr; j++) {
                        TO *o = out + ((size_t) (r0 + j) * H + h) * out_ld + n;
                        o[0] = (TO) acc[j].x;
                        o[1] = (TO) acc[j].y;
                }
}

void cu_mla_absorb(cudaStream_t st, const float *qn, const __half *wk, uint32_t rows, uint32_t H,
        uint32_t P, uint32_t rank, uint32_t R, float *q)
{
        dim3 grid(div_up(rank, MLA_COLS), H, div_up(rows, MLA_RB));
        k_mla_heads<float, float><<<grid, MLA_WARPS * 32, MLA_RB * P * sizeof(float), st>>>(qn, wk,
                rows, H, P, rank, rank + R, q);
}

void cu_mla_values(cudaStream_t st, const __half *o_lat, const __half *wvt, uint32_t rows,
        uint32_t H, uint32_t rank, uint32_t Vd, __half *out)
{
        dim3 grid(div_up(Vd, MLA_COLS), H, div_up(rows, MLA_RB));
        k_mla_heads<__half, __half><<<grid, MLA_WARPS * 32, MLA_RB * rank * sizeof(__half), st>>>(
                o_lat, wvt, rows, H, rank, Vd, Vd, out);
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
 * Attention over the latent cache, on tensor cores
 *
 * One block of MLA_THREADS (4 warps) per (work item, group of MLA_HEADS heads): the 16
 * heads are the M of mma.m16n8k16 (FlashMLA's observation: absorbed MLA decode is a
 * 16-row GEMM against the shared latent rows). The group's queries go to shared memory as
 * FP16; the item's positions go through in chunks of MLA_CHUNK latent rows staged in
 * shared memory with 16-byte loads. Per chunk: S = Q·Kᵀ over the W = rank + R dimensions
 * (warp w on positions 8w..8w+8), the online softmax per head in float32 (running max and
 * sum, the chunk's P as FP16), then O += P·V over the first rank dimensions (warp w on
 * dimensions w·rank/4 .. (w+1)·rank/4, V's fragments by ldmatrix.trans). O, m and l are
 * float32; the result is the same partial (acc, ml) the combine kernel merges. Everything
 * depends on the item only, so a row's output does not depend on the batch. */
#define MLA_THREADS 128
#define MLA_CHUNK   32
#define MLA_NT_MAX  (MLA_RANK_MAX / 32) /* n-tiles of 8 dimensions per warp in P·V */

__device__ __forceinline__ void mla_mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
{
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t lds32(const __half *p)
{
        return *(const uint32_t *) p;
}

__global__ void __launch_bounds__(MLA_THREADS) k_mla_attention(const float *__restrict__ q,
        const __half *__restrict__ cache, const uint32_t *meta, const uint32_t *row_bt,
        uint32_t bt_tokens, uint32_t H, uint32_t rank, uint32_t R, float scale,
        float *__restrict__ acc_out, float2 *__restrict__ ml_out)
{
        extern __shared__ uint4 smem[];
        uint32_t W = rank + R, WS = W + 8; /* row stride of q_h and kv_s, in halves */
        uint32_t h0 = blockIdx.y * MLA_HEADS, hg = min((uint32_t) MLA_HEADS, H - h0);
        __half *q_h = (__half *) smem;                          /* (16, WS) */
        __half *kv_s = q_h + MLA_HEADS * WS;                    /* (MLA_CHUNK, WS) */
        float *p_s = (float *) (kv_s + MLA_CHUNK * WS);         /* (16, MLA_CHUNK) */
        __half *p_h = (__half *) (p_s + MLA_HEADS * MLA_CHUNK); /* (16, MLA_CHUNK + 8) */
        uint32_t *slot_s = (uint32_t *) (p_h + MLA_HEADS * (MLA_CHUNK + 8)); /* (ATT_CHUNK) */
        float *m_s = (float *) (slot_s + ATT_CHUNK);            /* (16) running max */
        float *l_s = m_s + MLA_HEADS;                           /* (16) running sum */
        float *f_s = l_s + MLA_HEADS;                           /* (16) rescale factor */
        uint32_t n_items = meta[0];
        const int4 *items = (const int4 *) (meta + meta[1]);
        uint32_t t = threadIdx.x, warp = t / 32, lane = t % 32, g = lane / 4, tq = lane % 4;
        uint32_t nt = rank / 32, d0 = warp * (rank / 4), units = W / 8;

        for (uint32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
                int4 item = items[it]; /* row, first position, end position */
                uint32_t row = (uint32_t) item.x, t0 = (uint32_t) item.y;
                uint32_t n = (uint32_t) (item.z - item.y);

                __syncthreads(); /* the previous item's readers are done with shared memory */
                {
                        /* the group's queries: rows of W floats, four at a time, six loads
                         * in flight */
                        const float4 *q4 = (const float4 *) (q + ((size_t) row * H + h0) * W);
                        uint32_t w4 = W / 4;
                        for (uint32_t i0 = t; i0 < MLA_HEADS * w4; i0 += 6 * MLA_THREADS) {
                                float4 v[6];
#pragma unroll
                                for (uint32_t j = 0; j < 6; j++) {
                                        uint32_t i = i0 + j * MLA_THREADS;
                                        v[j] = i < hg * w4 ? __ldg(q4 + i)
                                                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                                }
#pragma unroll
                                for (uint32_t j = 0; j < 6; j++) {
                                        uint32_t i = i0 + j * MLA_THREADS;
                                        if (i >= MLA_HEADS * w4)
                                                break;
                                        __half2 *d = (__half2 *) (q_h + (i / w4) * WS + 4 * (i % w4));
                                        d[0] = __floats2half2_rn(v[j].x, v[j].y);
                                        d[1] = __floats2half2_rn(v[j].z, v[j].w);
                                }
                        }
                }
                for (uint32_t i = t; i < n; i += MLA_THREADS) {
                        uint32_t p = t0 + i;
                        uint32_t block = meta[row_bt[row] + p / bt_tokens];
                        slot_s[i] = block * bt_tokens + p % bt_tokens;
                }
                if (t < MLA_HEADS) {
                        m_s[t] = -FLT_MAX;
                        l_s[t] = 0.0f;
                }
                float o[MLA_NT_MAX][4];
#pragma unroll
                for (uint32_t j = 0; j < MLA_NT_MAX; j++)
                        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
                __syncthreads();

                for (uint32_t c0 = 0; c0 < n; c0 += MLA_CHUNK) {
                        uint32_t cn = min((uint32_t) MLA_CHUNK, n - c0);
                        /* stage the chunk's latent rows; rows past the item are zeros */
                        for (uint32_t i0 = t; i0 < MLA_CHUNK * units; i0 += 6 * MLA_THREADS) {
                                uint4 v[6];
#pragma unroll
                                for (uint32_t j = 0; j < 6; j++) {
                                        uint32_t i = i0 + j * MLA_THREADS, r = i / units;
                                        v[j] = r < cn ? __ldg((const uint4 *) (cache +
                                                                (size_t) slot_s[c0 + r] * W) +
                                                              i % units)
                                                      : make_uint4(0, 0, 0, 0);
                                }
#pragma unroll
                                for (uint32_t j = 0; j < 6; j++) {
                                        uint32_t i = i0 + j * MLA_THREADS, r = i / units;
                                        if (r < MLA_CHUNK)
                                                *(uint4 *) (kv_s + r * WS + 8 * (i % units)) = v[j];
                                }
                        }
                        __syncthreads();

                        /* S = Q·Kᵀ: warp w on the chunk's positions 8w .. 8w + 8 */
                        {
                                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                                const __half *kr = kv_s + (8 * warp + g) * WS + 2 * tq;
                                const __half *qa = q_h + g * WS + 2 * tq;
                                for (uint32_t k = 0; k < W; k += 16) {
                                        uint32_t a[4] = {lds32(qa + k), lds32(qa + 8 * WS + k),
                                                lds32(qa + k + 8), lds32(qa + 8 * WS + k + 8)};
                                        mla_mma(c, a, lds32(kr + k), lds32(kr + k + 8));
                                }
                                uint32_t i = 8 * warp + 2 * tq;
                                p_s[g * MLA_CHUNK + i] = i < cn ? c[0] * scale : -FLT_MAX;
                                p_s[g * MLA_CHUNK + i + 1] = i + 1 < cn ? c[1] * scale : -FLT_MAX;
                                p_s[(g + 8) * MLA_CHUNK + i] = i < cn ? c[2] * scale : -FLT_MAX;
                                p_s[(g + 8) * MLA_CHUNK + i + 1] =
                                        i + 1 < cn ? c[3] * scale : -FLT_MAX;
                        }
                        __syncthreads();

                        /* online softmax: warp w on heads 4w .. 4w + 4, lane on a position */
                        for (uint32_t h = 4 * warp; h < 4 * warp + 4; h++) {
                                float sv = p_s[h * MLA_CHUNK + lane];
                                float cm = sv;
                                for (int off = 16; off > 0; off >>= 1)
                                        cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, off));
                                float m_old = m_s[h], m_new = fmaxf(m_old, cm);
                                float e = lane < cn ? expf(sv - m_new) : 0.0f;
                                p_h[h * (MLA_CHUNK + 8) + lane] = __float2half(e);
                                float ls = e;
                                for (int off = 16; off > 0; off >>= 1)
                                        ls += __shfl_xor_sync(0xffffffffu, ls, off);
                                __syncwarp();
                                if (lane == 0) {
                                        float f = expf(m_old - m_new);
                                        f_s[h] = f;
                                        l_s[h] = l_s[h] * f + ls;
                                        m_s[h] = m_new;
                                }
                        }
                        __syncthreads();

                        /* O = O·f + P·V over the warp's dimensions */
                        float fa = f_s[g], fb = f_s[g + 8];
#pragma unroll
                        for (uint32_t j = 0; j < MLA_NT_MAX; j++) {
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
                                for (uint32_t j = 0; j < MLA_NT_MAX; j += 2) {
                                        if (j >= nt)
                                                break;
                                        uint32_t col = d0 + 8 * j + 8 * (lane / 16);
                                        uint32_t addr = (uint32_t) __cvta_generic_to_shared(
                                                kv_s + lr * WS + col);
                                        uint32_t b0, b1, b2, b3;
                                        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 "
                                                     "{%0,%1,%2,%3}, [%4];"
                                                     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                                                     : "r"(addr));
                                        mla_mma(o[j], a, b0, b1);
                                        mla_mma(o[j + 1], a, b2, b3);
                                }
                        }
                        __syncthreads(); /* kv_s and p_h are refilled by the next chunk */
                }

                /* the item's partials: unnormalised O with its max and sum per head */
#pragma unroll
                for (uint32_t j = 0; j < MLA_NT_MAX; j++) {
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
                if (t < hg)
                        ml_out[(size_t) it * H + h0 + t] = make_float2(m_s[t], l_s[t]);
        }
}

static size_t mla_smem(uint32_t W)
{
        return ((size_t) MLA_HEADS + MLA_CHUNK) * (W + 8) * 2 + MLA_HEADS * MLA_CHUNK * 4 +
               MLA_HEADS * (MLA_CHUNK + 8) * 2 + ATT_CHUNK * 4 + 3 * MLA_HEADS * 4;
}

void cu_mla_attention(cudaStream_t st, const float *q, const __half *cache, CuMeta meta,
        uint32_t grid, uint32_t block_tokens, uint32_t H, uint32_t rank, uint32_t R, float scale,
        float *acc, float2 *ml)
{
        static bool opted;
        if (!opted) {
                cudaFuncSetAttribute(k_mla_attention, cudaFuncAttributeMaxDynamicSharedMemorySize,
                        (int) mla_smem(MLA_WIDTH_MAX));
                opted = true;
        }
        dim3 blocks(grid, div_up(H, MLA_HEADS));
        k_mla_attention<<<blocks, MLA_THREADS, mla_smem(rank + R), st>>>(q, cache, meta.base,
                meta.row_bt, block_tokens, H, rank, R, scale, acc, ml);
}
