/* SPDX-License-Identifier: MIT */
/* The CUDA backend's kernels, in the order one layer runs them (see cuda_kernels.cuh). */
#include <float.h>

#include "cuda_kernels.cuh"

/* Logical column j of a packed AWQ word is nibble AWQ_REV[j] (docs/formats.md). Our
 * repacked words put k-element e at the same nibble AWQ_REV[e], which makes the pairs
 * (e, e+1) = (0,1), (2,3), (4,5), (6,7) come out of one mask each as the two halves of a
 * half2 (the FasterTransformer "interleaved" order). */
__constant__ uint32_t AWQ_REV[8] = {0, 4, 1, 5, 2, 6, 3, 7};

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

__global__ void k_embed(const __half *embed, const int32_t *tokens, uint32_t hidden, float *x)
{
        const __half *e = embed + (size_t) tokens[blockIdx.x] * hidden;
        float *o = x + (size_t) blockIdx.x * hidden;

        for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x)
                o[i] = __half2float(e[i]);
}

void cu_embed(cudaStream_t st, const __half *embed, CuMeta meta, uint32_t rows, uint32_t hidden,
        float *x)
{
        k_embed<<<rows, 256, 0, st>>>(embed, meta.tokens, hidden, x);
}

/* One block of ADD_NORM_THREADS per output row; thread t owns elements t + j * blockDim
 * (j < ADD_NORM_PER), kept in registers. The partial slices are read slice by slice for all
 * of a thread's elements at once, so the loads of one slice are in flight together and the
 * sum keeps the fixed order s = 0, 1, ... (hidden <= ADD_NORM_THREADS * ADD_NORM_PER). */
#define ADD_NORM_THREADS 1024
#define ADD_NORM_PER     8

__global__ void __launch_bounds__(ADD_NORM_THREADS) k_add_norm(float *x,
        const float *__restrict__ part, uint32_t splits, size_t slice_stride,
        const float *__restrict__ bias, const float *__restrict__ w, float *xn, uint32_t hidden,
        float eps, const uint32_t *out_row, bool write_res)
{
        __shared__ float red[32];
        uint32_t j = blockIdx.x, r = out_row ? out_row[j] : j;
        size_t row = (size_t) r * hidden;
        float y[ADD_NORM_PER], a[ADD_NORM_PER];
        float ss = 0.0f;

#pragma unroll
        for (uint32_t e = 0; e < ADD_NORM_PER; e++)
                y[e] = 0.0f;
        if (part) {
#pragma unroll 4
                for (uint32_t s = 0; s < splits; s++)
#pragma unroll
                        for (uint32_t e = 0; e < ADD_NORM_PER; e++) {
                                uint32_t i = threadIdx.x + e * blockDim.x;
                                if (i < hidden)
                                        y[e] += part[s * slice_stride + row + i];
                        }
        }
#pragma unroll
        for (uint32_t e = 0; e < ADD_NORM_PER; e++) {
                uint32_t i = threadIdx.x + e * blockDim.x;
                a[e] = 0.0f;
                if (i < hidden) {
                        /* The linear's own sum first, then the residual, as the CPU adds. */
                        a[e] = x[row + i];
                        if (part)
                                a[e] += bias ? y[e] + bias[i] : y[e];
                        if (write_res)
                                x[row + i] = a[e];
                        ss += a[e] * a[e];
                }
        }
        ss = block_sum(ss, red);
        float inv = 1.0f / sqrtf(ss / (float) hidden + eps);
#pragma unroll
        for (uint32_t e = 0; e < ADD_NORM_PER; e++) {
                uint32_t i = threadIdx.x + e * blockDim.x;
                if (i < hidden)
                        xn[(size_t) j * hidden + i] = w[i] * (a[e] * inv);
        }
}

void cu_add_norm(cudaStream_t st, float *x, const float *part, uint32_t splits,
        size_t slice_stride, const float *bias, const float *w, float *xn, uint32_t rows,
        uint32_t hidden, float eps, const uint32_t *out_row, bool write_res)
{
        k_add_norm<<<rows, ADD_NORM_THREADS, 0, st>>>(x, part, splits, slice_stride, bias, w, xn, hidden,
                eps, out_row, write_res);
}

__device__ __forceinline__ float sum_part(const float *part, uint32_t splits, size_t slice_stride,
        size_t at, const float *bias, uint32_t col)
{
        float y = 0.0f;
        for (uint32_t s = 0; s < splits; s++)
                y += part[s * slice_stride + at];
        return bias ? y + bias[col] : y;
}

/* One block of head_dim/2 threads per (row, head): heads below n_heads are q, then k, then
 * v. Thread i rotates the pair (i, i + head_dim/2) of a q or k head, or copies elements i
 * and i + head_dim/2 of a v head into the cache. */
__global__ void k_rope_kv(const float *__restrict__ part, uint32_t splits, size_t slice_stride,
        const float *__restrict__ bias, const uint32_t *pos, const uint32_t *slot,
        const float *inv_freq, float af, uint32_t n_heads, uint32_t n_kv_heads, uint32_t hd,
        float *q_out, __half *k_cache, __half *v_cache)
{
        uint32_t r = blockIdx.x, h = blockIdx.y, i = threadIdx.x, half = hd / 2;
        uint32_t q_dim = n_heads * hd, kv_dim = n_kv_heads * hd, n = q_dim + 2 * kv_dim;
        uint32_t col = h * hd + i;
        size_t row = (size_t) r * n;
        size_t kv_at = (size_t) slot[r] * kv_dim;
        float a = sum_part(part, splits, slice_stride, row + col, bias, col);
        float b = sum_part(part, splits, slice_stride, row + col + half, bias, col + half);

        if (h >= n_heads + n_kv_heads) {
                v_cache[kv_at + col - q_dim - kv_dim] = __float2half(a);
                v_cache[kv_at + col + half - q_dim - kv_dim] = __float2half(b);
                return;
        }
        float c, sn;
        sincosf((float) pos[r] * inv_freq[i], &sn, &c);
        c *= af;
        sn *= af;
        float ra = a * c - b * sn, rb = b * c + a * sn;
        if (h < n_heads) {
                q_out[(size_t) r * q_dim + col] = ra;
                q_out[(size_t) r * q_dim + col + half] = rb;
        } else {
                k_cache[kv_at + col - q_dim] = __float2half(ra);
                k_cache[kv_at + col + half - q_dim] = __float2half(rb);
        }
}

void cu_rope_kv(cudaStream_t st, const float *part, uint32_t splits, size_t slice_stride,
        const float *bias, CuMeta meta, uint32_t rows, const float *inv_freq,
        float attention_factor, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
        float *q_out, __half *k_cache, __half *v_cache)
{
        dim3 grid(rows, n_heads + 2 * n_kv_heads);
        k_rope_kv<<<grid, head_dim / 2, 0, st>>>(part, splits, slice_stride, bias, meta.pos,
                meta.slot, inv_freq, attention_factor, n_heads, n_kv_heads, head_dim, q_out,
                k_cache, v_cache);
}

__global__ void k_swiglu(const float *part, uint32_t splits, size_t slice_stride,
        const float *bias, uint32_t inter, float *out)
{
        uint32_t r = blockIdx.y;
        size_t row = (size_t) r * 2 * inter;

        for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < inter;
                i += gridDim.x * blockDim.x) {
                float g = sum_part(part, splits, slice_stride, row + i, bias, i);
                float u = sum_part(part, splits, slice_stride, row + inter + i, bias, inter + i);
                out[(size_t) r * inter + i] = g / (1.0f + expf(-g)) * u;
        }
}

void cu_swiglu(cudaStream_t st, const float *part, uint32_t splits, size_t slice_stride,
        const float *bias, uint32_t rows, uint32_t inter, float *out)
{
        dim3 grid(div_up(inter, 256 * 4), rows);
        k_swiglu<<<grid, 256, 0, st>>>(part, splits, slice_stride, bias, inter, out);
}

/* ---------------------------------------------------------------------------------------
 * Attention over the paged cache: items of up to ATT_CHUNK positions of one row, merged by
 * log-sum-exp (flash-decoding). Each item's result depends only on its own positions, so
 * a row's output is the same whatever the batch and whatever the launch's grid. */

__global__ void __launch_bounds__(ATT_CHUNK) k_attention(const float *q, const __half *k_cache,
        const __half *v_cache, const uint32_t *meta, const uint32_t *row_bt, uint32_t bt_tokens,
        uint32_t n_heads, uint32_t n_kv_heads, uint32_t hd, float scale, float *acc_out,
        float2 *ml_out)
{
        extern __shared__ float4 sh4[];
        uint32_t g = n_heads / n_kv_heads, kvh = blockIdx.y, kv_dim = n_kv_heads * hd;
        float *q_s = (float *) sh4;                            /* (g, hd) */
        float *p_s = q_s + g * hd;                             /* (g, ATT_CHUNK) */
        float *o_s = p_s + g * ATT_CHUNK;                      /* (g, hd) */
        uint32_t *slot_s = (uint32_t *) (o_s + g * hd);        /* (ATT_CHUNK) */
        float *ml_s = (float *) (slot_s + ATT_CHUNK);          /* (g, 2) */
        uint32_t n_items = meta[0];
        const int4 *items = (const int4 *) (meta + meta[1]);
        uint32_t t = threadIdx.x, warp = t / 32, lane = t % 32;

        for (uint32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
                int4 item = items[it]; /* row, first position, end position */
                uint32_t row = (uint32_t) item.x, t0 = (uint32_t) item.y;
                uint32_t n = (uint32_t) (item.z - item.y);

                __syncthreads(); /* the previous item's readers are done with shared memory */
                for (uint32_t i = t; i < g * hd; i += blockDim.x)
                        q_s[i] = q[(size_t) row * n_heads * hd + (size_t) kvh * g * hd + i];
                if (t < n) {
                        uint32_t p = t0 + t;
                        uint32_t block = meta[row_bt[row] + p / bt_tokens];
                        slot_s[t] = block * bt_tokens + p % bt_tokens;
                }
                __syncthreads();

                /* scores: thread t takes position t0 + t for the g heads, reading its key 16
                 * bytes at a time (head_dim % 8 == 0) against q broadcast from shared memory */
                if (t < n) {
                        const uint4 *k8 =
                                (const uint4 *) (k_cache + (size_t) slot_s[t] * kv_dim + kvh * hd);
                        float sc[ATT_GROUP_MAX];
#pragma unroll
                        for (uint32_t h = 0; h < ATT_GROUP_MAX; h++)
                                sc[h] = 0.0f;
                        for (uint32_t d8 = 0; d8 < hd / 8; d8 += 2) {
                                uint4 u[2];
                                u[0] = __ldg(k8 + d8);
                                u[1] = d8 + 1 < hd / 8 ? __ldg(k8 + d8 + 1) : make_uint4(0, 0, 0, 0);
#pragma unroll
                                for (uint32_t v = 0; v < 2; v++) {
                                        if (d8 + v >= hd / 8)
                                                break;
                                        float kf[8];
                                        const uint32_t *uw = (const uint32_t *) &u[v];
#pragma unroll
                                        for (uint32_t j = 0; j < 4; j++) {
                                                float2 f = __half22float2(
                                                        *reinterpret_cast<const __half2 *>(&uw[j]));
                                                kf[2 * j] = f.x;
                                                kf[2 * j + 1] = f.y;
                                        }
                                        uint32_t d = 8 * (d8 + v);
#pragma unroll
                                        for (uint32_t h = 0; h < ATT_GROUP_MAX; h++) {
                                                if (h >= g)
                                                        break;
                                                const float4 *qa = (const float4 *) (q_s + h * hd + d);
                                                float4 x0 = qa[0], x1 = qa[1];
                                                sc[h] += x0.x * kf[0] + x0.y * kf[1] + x0.z * kf[2] +
                                                         x0.w * kf[3] + x1.x * kf[4] + x1.y * kf[5] +
                                                         x1.z * kf[6] + x1.w * kf[7];
                                        }
                                }
                        }
#pragma unroll
                        for (uint32_t h = 0; h < ATT_GROUP_MAX; h++)
                                if (h < g)
                                        p_s[h * ATT_CHUNK + t] = sc[h] * scale;
                }
                __syncthreads();

                /* softmax numerators per head, one warp per head */
                for (uint32_t h = warp; h < g; h += blockDim.x / 32) {
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

                /* weighted values: thread t takes the dimension pair d2 = t % (hd/2) for
                 * every head, over the positions of its share (t / (hd/2)) of the item; a
                 * warp reads whole value rows. The shares are then added in order. */
                uint32_t pairs = hd / 2, shares = blockDim.x / pairs;
                uint32_t d2 = t % pairs, share = t / pairs;
                uint32_t per = (n + shares - 1) / shares;
                uint32_t i0 = share * per, i1 = min(n, i0 + per);
                float2 acc[ATT_GROUP_MAX];
#pragma unroll
                for (uint32_t h = 0; h < ATT_GROUP_MAX; h++)
                        acc[h] = make_float2(0.0f, 0.0f);
                if (share < shares) {
                        const __half2 *v2 = (const __half2 *) (v_cache + kvh * hd) + d2;
#pragma unroll 4
                        for (uint32_t i = i0; i < i1; i++) {
                                float2 v = __half22float2(v2[(size_t) slot_s[i] * (kv_dim / 2)]);
#pragma unroll
                                for (uint32_t h = 0; h < ATT_GROUP_MAX; h++) {
                                        if (h >= g)
                                                break;
                                        float p = p_s[h * ATT_CHUNK + i];
                                        acc[h].x += p * v.x;
                                        acc[h].y += p * v.y;
                                }
                        }
                }
                for (uint32_t sh = 1; sh < shares; sh++) {
                        if (share == sh)
#pragma unroll
                                for (uint32_t h = 0; h < ATT_GROUP_MAX; h++)
                                        if (h < g)
                                                ((float2 *) o_s)[h * pairs + d2] = acc[h];
                        __syncthreads();
                        if (share == 0)
#pragma unroll
                                for (uint32_t h = 0; h < ATT_GROUP_MAX; h++)
                                        if (h < g) {
                                                float2 o = ((const float2 *) o_s)[h * pairs + d2];
                                                acc[h].x += o.x;
                                                acc[h].y += o.y;
                                        }
                        __syncthreads();
                }
                if (share == 0)
#pragma unroll
                        for (uint32_t h = 0; h < ATT_GROUP_MAX; h++)
                                if (h < g)
                                        ((float2 *) (acc_out + ((size_t) it * n_heads + kvh * g + h) *
                                                                      hd))[d2] = acc[h];
                if (t < g)
                        ml_out[(size_t) it * n_heads + kvh * g + t] =
                                make_float2(ml_s[2 * t], ml_s[2 * t + 1]);
        }
}

void cu_attention(cudaStream_t st, const float *q, const __half *k_cache, const __half *v_cache,
        CuMeta meta, uint32_t grid, uint32_t block_tokens, uint32_t n_heads, uint32_t n_kv_heads,
        uint32_t head_dim, float *acc, float2 *ml)
{
        uint32_t g = n_heads / n_kv_heads;
        size_t smem = ((size_t) 2 * g * head_dim + (size_t) g * ATT_CHUNK + ATT_CHUNK + 2 * g) *
                      sizeof(float);
        float scale = (float) (1.0 / sqrt((double) head_dim));
        dim3 blocks(grid, n_kv_heads);
        k_attention<<<blocks, ATT_CHUNK, smem, st>>>(q, k_cache, v_cache, meta.base, meta.row_bt,
                block_tokens, n_heads, n_kv_heads, head_dim, scale, acc, ml);
}

__global__ void k_attention_combine(const float *acc, const float2 *ml, const uint2 *row_items,
        uint32_t n_heads, uint32_t hd, float *out)
{
        uint32_t r = blockIdx.x, h = blockIdx.y;
        uint2 ri = row_items[r];
        float m = -FLT_MAX;

        for (uint32_t i = 0; i < ri.y; i++)
                m = fmaxf(m, ml[(size_t) (ri.x + i) * n_heads + h].x);
        float l = 0.0f;
        for (uint32_t i = 0; i < ri.y; i++) {
                float2 e = ml[(size_t) (ri.x + i) * n_heads + h];
                l += expf(e.x - m) * e.y;
        }
        for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
                float a = 0.0f;
                for (uint32_t i = 0; i < ri.y; i++) {
                        size_t it = ri.x + i;
                        a += expf(ml[it * n_heads + h].x - m) * acc[(it * n_heads + h) * hd + d];
                }
                out[((size_t) r * n_heads + h) * hd + d] = a / l;
        }
}

void cu_attention_combine(cudaStream_t st, const float *acc, const float2 *ml, CuMeta meta,
        uint32_t rows, uint32_t n_heads, uint32_t head_dim, float *out)
{
        dim3 grid(rows, n_heads);
        k_attention_combine<<<grid, 128, 0, st>>>(acc, ml, meta.row_items, n_heads, head_dim, out);
}

/* ---------------------------------------------------------------------------------------
 * INT4 x float32 GEMV for up to GEMV_ROWS rows, streaming the weights.
 *
 * Layout (k_awq_repack): for each group of 4 output columns, K/32 chunks of four 16-byte
 * units, unit c holding the 32 nibbles of column 4g+c over 32 consecutive k. A warp owns a
 * pair of column groups and one K slice: lane l loads unit l of each run of 32 of both,
 * so every load instruction reads 512 contiguous bytes, lane l works on column l%4 of
 * each, and eight loads per lane are in flight before any is used. The lanes of a column are reduced by shuffles in
 * a fixed order. */

#define GEMV_WARPS  8
#define GEMV_UNROLL 4

__device__ __forceinline__ uint4 ld_stream(const uint4 *p)
{
        uint4 v;
        /* Read once per step: keep it out of L1 so x and the scales stay there. */
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
        return v;
}

__device__ __forceinline__ __half2 u32_as_h2(uint32_t u)
{
        return *reinterpret_cast<__half2 *>(&u);
}

/* The 8 values q - z of one packed word, as 4 float pairs (k, k+1). The magic 0x6400
 * makes fp16 1024 + nibble; subtracting 1024 + z (or scaling the nibble shifted by 4 and
 * subtracting 64 + z) leaves q - z exactly. */
__device__ __forceinline__ void awq_dq(uint32_t w, __half2 z1024, __half2 z64, float2 *f)
{
        const __half2 sixteenth = __float2half2_rn(1.0f / 16.0f);
        f[0] = __half22float2(__hsub2(u32_as_h2((w & 0x000f000fu) | 0x64006400u), z1024));
        f[1] = __half22float2(__hfma2(u32_as_h2((w & 0x00f000f0u) | 0x64006400u), sixteenth, z64));
        w >>= 8;
        f[2] = __half22float2(__hsub2(u32_as_h2((w & 0x000f000fu) | 0x64006400u), z1024));
        f[3] = __half22float2(__hfma2(u32_as_h2((w & 0x00f000f0u) | 0x64006400u), sixteenth, z64));
}

/* One word of each of the two column groups a lane works on: x[k..k+8) is loaded once
 * per row and used for both, which halves the x traffic through L1 per weight byte. */
template <int M>
__device__ __forceinline__ void awq_word2(uint32_t wa, uint32_t wb, const __half2 *z,
        const float *x, uint32_t ldx, uint32_t k, float *pa, float *pb)
{
        float2 a[4], b[4];
        awq_dq(wa, z[0], z[1], a);
        awq_dq(wb, z[2], z[3], b);
#pragma unroll
        for (int m = 0; m < M; m++) {
                const float4 *xp = (const float4 *) (x + (size_t) m * ldx + k);
                float4 u = __ldg(xp), v = __ldg(xp + 1);
                pa[m] += a[0].x * u.x + a[0].y * u.y + a[1].x * u.z + a[1].y * u.w +
                         a[2].x * v.x + a[2].y * v.y + a[3].x * v.z + a[3].y * v.w;
                pb[m] += b[0].x * u.x + b[0].y * u.y + b[1].x * u.z + b[1].y * u.w +
                         b[2].x * v.x + b[2].y * v.y + b[3].x * v.z + b[3].y * v.w;
        }
}

/* A warp owns the column groups 2w and 2w+1 (N % 8 == 0 makes them pairs). */
template <int M>
__global__ void __launch_bounds__(GEMV_WARPS * 32) k_gemv_awq(const uint4 *__restrict__ qw,
        const __half2 *__restrict__ sz, const float *__restrict__ x, uint32_t ldx,
        float *__restrict__ y, size_t slice_stride, uint32_t K, uint32_t N, uint32_t gs,
        uint32_t splits)
{
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t g = 2 * (blockIdx.x * GEMV_WARPS + warp);
        if (g >= N / 4)
                return;
        uint32_t kc_n = K / 32, s = blockIdx.y;
        uint32_t c0 = (uint32_t) ((uint64_t) kc_n * s / splits);
        uint32_t c1 = (uint32_t) ((uint64_t) kc_n * (s + 1) / splits);
        uint32_t col = lane % 4, na = 4 * g + col, nb = na + 4;
        const uint4 *wa = qw + (size_t) g * kc_n * 4 + col;
        const uint4 *wb = wa + (size_t) kc_n * 4;
        float acc_a[M], acc_b[M];
#pragma unroll
        for (int m = 0; m < M; m++)
                acc_a[m] = acc_b[m] = 0.0f;

        for (uint32_t base = c0 + lane / 4; base < c1; base += 8 * GEMV_UNROLL) {
                uint4 va[GEMV_UNROLL], vb[GEMV_UNROLL];
#pragma unroll
                for (int i = 0; i < GEMV_UNROLL; i++)
                        if (base + 8 * i < c1) {
                                va[i] = ld_stream(wa + (size_t) (base + 8 * i) * 4);
                                vb[i] = ld_stream(wb + (size_t) (base + 8 * i) * 4);
                        }
#pragma unroll
                for (int i = 0; i < GEMV_UNROLL; i++) {
                        uint32_t kc = base + 8 * i;
                        if (kc >= c1)
                                break;
                        const __half2 *szr = sz + (size_t) (kc * 32 / gs) * N;
                        __half2 sa = __ldg(szr + na), sb = __ldg(szr + nb);
                        __half2 za = __half2half2(__high2half(sa)), zb = __half2half2(__high2half(sb));
                        __half2 z[4] = {
                                __hadd2(za, __float2half2_rn(1024.0f)),
                                __hneg2(__hadd2(za, __float2half2_rn(64.0f))),
                                __hadd2(zb, __float2half2_rn(1024.0f)),
                                __hneg2(__hadd2(zb, __float2half2_rn(64.0f))),
                        };
                        float pa[M], pb[M];
#pragma unroll
                        for (int m = 0; m < M; m++)
                                pa[m] = pb[m] = 0.0f;
                        uint32_t k = kc * 32;
                        awq_word2<M>(va[i].x, vb[i].x, z, x, ldx, k, pa, pb);
                        awq_word2<M>(va[i].y, vb[i].y, z, x, ldx, k + 8, pa, pb);
                        awq_word2<M>(va[i].z, vb[i].z, z, x, ldx, k + 16, pa, pb);
                        awq_word2<M>(va[i].w, vb[i].w, z, x, ldx, k + 24, pa, pb);
                        float scale_a = __low2float(sa), scale_b = __low2float(sb);
#pragma unroll
                        for (int m = 0; m < M; m++) {
                                acc_a[m] += scale_a * pa[m];
                                acc_b[m] += scale_b * pb[m];
                        }
                }
        }
#pragma unroll
        for (int m = 0; m < M; m++) {
                float a = acc_a[m], b = acc_b[m];
                for (int o = 4; o < 32; o <<= 1) {
                        a += __shfl_xor_sync(0xffffffffu, a, o);
                        b += __shfl_xor_sync(0xffffffffu, b, o);
                }
                if (lane < 4) {
                        y[s * slice_stride + (size_t) m * N + na] = a;
                        y[s * slice_stride + (size_t) m * N + nb] = b;
                }
        }
}

/* Dense FP16 weights (N, kp): the same scheme, a warp on 4 rows of w, lane l on row l%4
 * and 8 consecutive k per 16-byte load. x is read as float4 when vec (K % 4 == 0), else
 * element by element; k >= K reads as 0 (the weights are zero there too). */
template <int M, bool VEC>
__global__ void __launch_bounds__(GEMV_WARPS * 32) k_gemv_dense(const __half *__restrict__ w,
        const float *__restrict__ x, uint32_t ldx, float *__restrict__ y, size_t slice_stride,
        uint32_t K, uint32_t kp, uint32_t N, uint32_t splits)
{
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t g = blockIdx.x * GEMV_WARPS + warp;
        if (4 * g >= N)
                return;
        uint32_t kc_n = kp / 8, s = blockIdx.y;
        uint32_t c0 = (uint32_t) ((uint64_t) kc_n * s / splits);
        uint32_t c1 = (uint32_t) ((uint64_t) kc_n * (s + 1) / splits);
        uint32_t n = 4 * g + lane % 4;
        bool live = n < N;
        const uint4 *wp = (const uint4 *) (w + (size_t) (live ? n : 0) * kp);
        float acc[M];
#pragma unroll
        for (int m = 0; m < M; m++)
                acc[m] = 0.0f;

        for (uint32_t base = c0 + lane / 4; base < c1; base += 8 * GEMV_UNROLL) {
                uint4 wv[GEMV_UNROLL];
#pragma unroll
                for (int i = 0; i < GEMV_UNROLL; i++)
                        if (base + 8 * i < c1)
                                wv[i] = ld_stream(wp + base + 8 * i);
#pragma unroll
                for (int i = 0; i < GEMV_UNROLL; i++) {
                        uint32_t kc = base + 8 * i;
                        if (kc >= c1)
                                break;
                        float wf[8];
                        const uint32_t *u = (const uint32_t *) &wv[i];
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                                float2 f = __half22float2(u32_as_h2(u[j]));
                                wf[2 * j] = f.x;
                                wf[2 * j + 1] = f.y;
                        }
                        uint32_t k = kc * 8;
#pragma unroll
                        for (int m = 0; m < M; m++) {
                                const float *xr = x + (size_t) m * ldx + k;
                                float xs[8];
                                if (VEC && k + 8 <= K) {
                                        float4 a = __ldg((const float4 *) xr);
                                        float4 b = __ldg((const float4 *) xr + 1);
                                        xs[0] = a.x, xs[1] = a.y, xs[2] = a.z, xs[3] = a.w;
                                        xs[4] = b.x, xs[5] = b.y, xs[6] = b.z, xs[7] = b.w;
                                } else {
#pragma unroll
                                        for (int j = 0; j < 8; j++)
                                                xs[j] = k + j < K ? __ldg(xr + j) : 0.0f;
                                }
                                float p = 0.0f;
#pragma unroll
                                for (int j = 0; j < 8; j++)
                                        p += wf[j] * xs[j];
                                acc[m] += p;
                        }
                }
        }
#pragma unroll
        for (int m = 0; m < M; m++) {
                float v = acc[m];
                v += __shfl_xor_sync(0xffffffffu, v, 4);
                v += __shfl_xor_sync(0xffffffffu, v, 8);
                v += __shfl_xor_sync(0xffffffffu, v, 16);
                if (lane < 4 && live)
                        y[s * slice_stride + (size_t) m * N + n] = v;
        }
}

template <int M>
static void gemv_rows(cudaStream_t st, const CuLinear *l, const float *x, uint32_t ldx, float *y,
        size_t slice_stride)
{
        dim3 grid(div_up(div_up(l->out, 4), GEMV_WARPS), l->splits);
        dim3 grid_awq(div_up(l->out / 8, GEMV_WARPS), l->splits);
        if (l->awq)
                k_gemv_awq<M><<<grid_awq, GEMV_WARPS * 32, 0, st>>>(l->qw, l->sz, x, ldx, y,
                        slice_stride, l->in, l->out, l->group_size, l->splits);
        else if (l->in % 4 == 0 && ldx % 4 == 0)
                k_gemv_dense<M, true><<<grid, GEMV_WARPS * 32, 0, st>>>(
                        l->w, x, ldx, y, slice_stride, l->in, l->kp, l->out, l->splits);
        else
                k_gemv_dense<M, false><<<grid, GEMV_WARPS * 32, 0, st>>>(
                        l->w, x, ldx, y, slice_stride, l->in, l->kp, l->out, l->splits);
}

void cu_gemv(cudaStream_t st, const CuLinear *l, const float *x, uint32_t ldx, uint32_t rows,
        float *y, size_t slice_stride)
{
        switch (rows) {
        case 1: gemv_rows<1>(st, l, x, ldx, y, slice_stride); break;
        case 2: gemv_rows<2>(st, l, x, ldx, y, slice_stride); break;
        case 3: gemv_rows<3>(st, l, x, ldx, y, slice_stride); break;
        case 4: gemv_rows<4>(st, l, x, ldx, y, slice_stride); break;
        case 5: gemv_rows<5>(st, l, x, ldx, y, slice_stride); break;
        case 6: gemv_rows<6>(st, l, x, ldx, y, slice_stride); break;
        case 7: gemv_rows<7>(st, l, x, ldx, y, slice_stride); break;
        default: gemv_rows<8>(st, l, x, ldx, y, slice_stride); break;
        }
}

/* ---------------------------------------------------------------------------------------
 * Load-time repacking, dequantization for the GEMM path, conversions, argmax */

/* One thread per 16-byte unit (g, kc, c): column n = 4g + c, k = 32kc + 8j + e goes to
 * nibble AWQ_REV[e] of word j. */
__global__ void k_awq_repack(const uint32_t *qweight, uint32_t n, uint32_t K, uint32_t n_off,
        uint4 *qw)
{
        size_t u = (size_t) blockIdx.x * blockDim.x + threadIdx.x;
        uint32_t kc_n = K / 32;
        if (u >= (size_t) n / 4 * kc_n * 4)
                return;
        uint32_t c = u % 4, kc = (u / 4) % kc_n, g = (uint32_t) (u / 4 / kc_n);
        uint32_t col = 4 * g + c, words = n / 8;
        uint32_t shift = 4 * AWQ_REV[col % 8];
        uint32_t out[4];
        for (uint32_t j = 0; j < 4; j++) {
                uint32_t word = 0;
                for (uint32_t e = 0; e < 8; e++) {
                        uint32_t k = 32 * kc + 8 * j + e;
                        uint32_t q = (qweight[(size_t) k * words + col / 8] >> shift) & 0xF;
                        word |= q << (4 * AWQ_REV[e]);
                }
                out[j] = word;
        }
        size_t g_out = n_off / 4 + g;
        qw[(g_out * kc_n + kc) * 4 + c] = make_uint4(out[0], out[1], out[2], out[3]);
}

__global__ void k_awq_scales(const uint32_t *qzeros, const __half *scales, uint32_t n,
        uint32_t groups, uint32_t N, uint32_t n_off, __half2 *sz)
{
        size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= (size_t) groups * n)
                return;
        uint32_t gi = (uint32_t) (i / n), col = (uint32_t) (i % n);
        uint32_t z = (qzeros[(size_t) gi * (n / 8) + col / 8] >> (4 * AWQ_REV[col % 8])) & 0xF;
        sz[(size_t) gi * N + n_off + col] = __halves2half2(scales[i], __uint2half_rn(z));
}

void cu_awq_repack(cudaStream_t st, const CuLinear *l, const uint32_t *qweight,
        const uint32_t *qzeros, const __half *scales, uint32_t n, uint32_t n_off)
{
        size_t units = (size_t) n / 4 * (l->in / 32) * 4;
        k_awq_repack<<<(unsigned) ((units + 255) / 256), 256, 0, st>>>(
                qweight, n, l->in, n_off, l->qw);
        size_t g = (size_t) (l->in / l->group_size) * n;
        k_awq_scales<<<(unsigned) ((g + 255) / 256), 256, 0, st>>>(
                qzeros, scales, n, l->in / l->group_size, l->out, n_off, l->sz);
}

/* One thread per 16-byte unit: 32 weights (q - z) * s of one column, written to w16 (N, K). */
__global__ void k_awq_dequant(const uint4 *qw, const __half2 *sz, uint32_t K, uint32_t N,
        uint32_t gs, __half *w16)
{
        size_t u = (size_t) blockIdx.x * blockDim.x + threadIdx.x;
        uint32_t kc_n = K / 32;
        if (u >= (size_t) N / 4 * kc_n * 4)
                return;
        uint32_t c = u % 4, kc = (u / 4) % kc_n, g = (uint32_t) (u / 4 / kc_n);
        uint32_t col = 4 * g + c;
        uint4 v = qw[u];
        __half2 s_z = sz[(size_t) (kc * 32 / gs) * N + col];
        float s = __low2float(s_z), z = __high2float(s_z);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
        __align__(16) __half out[32];
        for (uint32_t j = 0; j < 4; j++)
                for (uint32_t e = 0; e < 8; e++) {
                        float q = (float) ((words[j] >> (4 * AWQ_REV[e])) & 0xF);
                        out[8 * j + e] = __float2half((q - z) * s);
                }
        uint4 *dst = (uint4 *) (w16 + (size_t) col * K + 32 * kc);
        for (uint32_t i = 0; i < 4; i++)
                dst[i] = ((const uint4 *) out)[i];
}

void cu_awq_dequant(cudaStream_t st, const CuLinear *l, __half *w16)
{
        size_t units = (size_t) l->out / 4 * (l->in / 32) * 4;
        k_awq_dequant<<<(unsigned) ((units + 255) / 256), 256, 0, st>>>(
                l->qw, l->sz, l->in, l->out, l->group_size, w16);
}

__global__ void k_to_half(const float *x, __half *y, size_t n)
{
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

/* One block per row; (value, id) pairs ordered by larger value, then lower id, as
 * bk_sample's argmax. */
__global__ void k_argmax(const float *logits, uint32_t ld, uint32_t vocab, int32_t *ids)
{
        __shared__ float bv[32];
        __shared__ int32_t bi[32];
        const float *row = logits + (size_t) blockIdx.x * ld;
        float best = -INFINITY;
        int32_t id = 0x7fffffff;

        for (uint32_t i = threadIdx.x; i < vocab; i += blockDim.x)
                if (row[i] > best || id == 0x7fffffff) {
                        best = row[i];
                        id = (int32_t) i;
                }
        for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, best, o);
                int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
                if (ov > best || (ov == best && oi < id)) {
                        best = ov;
                        id = oi;
                }
        }
        if (threadIdx.x % 32 == 0) {
                bv[threadIdx.x / 32] = best;
                bi[threadIdx.x / 32] = id;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
                for (uint32_t w = 1; w < blockDim.x / 32; w++)
                        if (bv[w] > best || (bv[w] == best && bi[w] < id)) {
                                best = bv[w];
                                id = bi[w];
                        }
                ids[blockIdx.x] = id;
        }
}

void cu_argmax(cudaStream_t st, const float *logits, uint32_t rows, uint32_t ld, uint32_t vocab,
        int32_t *ids)
{
        k_argmax<<<rows, 1024, 0, st>>>(logits, ld, vocab, ids);
}
