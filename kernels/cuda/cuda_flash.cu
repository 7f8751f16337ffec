/* SPDX-License-Identifier: MIT */
/* Causal attention of prefill chunks on tensor cores over the paged FP16 KV cache, in the
 * FlashAttention-2 arrangement: one block per (task, query head), a task being up to
 * FLASH_ROWS consecutive rows of one sequence at consecutive positions (the host plans
 * them, see cu_flash_attention). Each of the block's four warps holds 16 query rows as
 * FP16 A fragments and walks the K/V tiles of FL_BN positions from position 0 up to its
 * last row: S = Q·K^T with mma.sync m16n8k16 (FP16 in, fp32 accumulation), the causal
 * mask, an online softmax in fp32 (base 2, the scale folded in), P rounded to FP16 and
 * O += P·V on the tensor cores again. K/V tiles come through cp.async, double-buffered,
 * gathered position by position through the block table. 168 registers and 64 KB of
 * shared memory (Q passes through the second K buffer on its way to registers) let three
 * blocks share an SM: the loop is latency-bound, and two blocks left it at 17% of the
 * tensor cores' peak.
 *
 * Tiles are aligned to absolute positions, so a row meets the same tiles in the same order
 * whatever task it is planned into; tiles past its own position are fully masked for it and
 * leave its m, l and O bit for bit unchanged (a factor exp2(0) = 1 and terms of 0). A row's
 * output therefore depends only on its sequence, not on the step around it. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "cuda_backend.h"
}
#include "cuda_kernels.cuh"
#include "cuda_ptx.cuh"

#define FL_BN      64 /* positions per K/V tile */
#define FL_WARPS   (FLASH_ROWS / 16)
#define FL_THREADS (FL_WARPS * 32)
#define FL_BLOCKS  3 /* per SM */

static_assert(FLASH_ROWS == FL_BN, "the Q tile is staged in a K buffer");

bool cu_flash_takes(uint32_t head_dim, uint32_t max_positions)
{
        return (head_dim == 64 || head_dim == 128) && max_positions <= 1u << 23; /* div_rem */
}

/* 16-byte unit c of row r of a tile of rows of HD halves, XOR-swizzled over 8 rows so
 * that ldmatrix's eight row reads of one unit column hit distinct banks (HD >= 64). */
template <uint32_t HD> __device__ __forceinline__ uint32_t sw(uint32_t r, uint32_t c)
{
        return r * (HD / 8) + (c ^ (r & 7));
}

/* p / d and p % d for p < 2^23 from a float estimate of the quotient (inv = 1 / d), off by
 * at most one there: no division sequence per K/V row. */
__device__ __forceinline__ uint32_t div_rem(uint32_t p, uint32_t d, float inv, uint32_t *rem)
{
        uint32_t q = (uint32_t) ((float) p * inv);
        int32_t r = (int32_t) (p - q * d);
        if (r < 0) {
                q--;
                r += (int32_t) d;
        } else if (r >= (int32_t) d) {
                q++;
                r -= (int32_t) d;
        }
        *rem = (uint32_t) r;
        return q;
}

__device__ __forceinline__ uint32_t pack_h2(float lo, float hi)
{
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
}

/* Grid (n_heads, n_tasks); tasks[k] = first row | rows << 16, heaviest (latest) last, so
 * block y takes task n_tasks - 1 - y and the long ones start first. */
template <uint32_t HD>
__global__ void __launch_bounds__(FL_THREADS, FL_BLOCKS) k_flash(const float *q,
        const __half *k_cache, const __half *v_cache,
        const uint32_t *meta, const uint32_t *pos,
        const uint32_t *row_bt, const uint32_t *tasks, uint32_t bt_tokens,
        uint32_t group, uint32_t kv_dim, float scale_log2, __half *out)
{
        pdl_wait();
        constexpr uint32_t CH = HD / 8; /* 16-byte units per row */
        extern __shared__ uint4 smem[];
        uint4 *k_s = smem;                 /* 2 x (FL_BN, CH) */
        uint4 *v_s = k_s + 2 * FL_BN * CH; /* 2 x (FL_BN, CH) */
        uint4 *q_s = k_s + FL_BN * CH;     /* (FLASH_ROWS, CH) in K buffer 1, until tile 1 */
        uint32_t h = blockIdx.x, n_heads = gridDim.x, q_dim = n_heads * HD;
        uint32_t task = tasks[gridDim.y - 1 - blockIdx.y];
        uint32_t r0 = task & 0xffffu, nq = task >> 16;
        uint32_t p0 = pos[r0], p_last = p0 + nq - 1, n_tiles = p_last / FL_BN + 1;
        const uint32_t *bt = meta + row_bt[r0];
        size_t head_off = (size_t) (h / group) * HD;
        uint32_t t = threadIdx.x, warp = t / 32, lane = t % 32;
        float inv_bt = 1.0f / (float) bt_tokens;

        /* K and V of tile j into buffer j % 2, thread t taking unit t % CH of rows t / CH +
         * u * (FL_THREADS / CH); positions past the task's last row are zero-filled (they
         * may lie past the block table). */
        auto load_kv = [&](uint32_t j) {
                uint32_t buf = (j & 1) * FL_BN * CH, c = t % CH;
#pragma unroll
                for (uint32_t u = 0; u < FL_BN * CH / FL_THREADS; u++) {
                        uint32_t r = t / CH + u * (FL_THREADS / CH), p = j * FL_BN + r;
                        bool valid = p <= p_last;
                        size_t at = 0;
                        if (valid) {
                                uint32_t off, blk = div_rem(p, bt_tokens, inv_bt, &off);
                                at = ((size_t) bt[blk] * bt_tokens + off) * kv_dim + head_off +
                                     c * 8;
                        }
                        cp_async16(&k_s[buf + sw<HD>(r, c)], k_cache + at, valid);
                        cp_async16(&v_s[buf + sw<HD>(r, c)], v_cache + at, valid);
                }
                cp_async_commit();
        };
        load_kv(0);

        /* Q rows as FP16 (rows past the task: zeros, never stored) */
#pragma unroll
        for (uint32_t u = 0; u < FLASH_ROWS * CH / FL_THREADS; u++) {
                uint32_t i = t + u * FL_THREADS, r = i / CH, c = i % CH;
                uint4 x = make_uint4(0, 0, 0, 0);
                if (r < nq) {
                        const float4 *src =
                                (const float4 *) (q + (size_t) (r0 + r) * q_dim + h * HD + c * 8);
                        float4 a = src[0], b = src[1];
                        x = make_uint4(pack_h2(a.x, a.y), pack_h2(a.z, a.w), pack_h2(b.x, b.y),
                                pack_h2(b.z, b.w));
                }
                q_s[sw<HD>(r, c)] = x;
        }
        __syncthreads();
        uint32_t qf[HD / 16][4];
#pragma unroll
        for (uint32_t kk = 0; kk < HD / 16; kk++)
                ldsm_x4(qf[kk], &q_s[sw<HD>(warp * 16 + lane % 16, 2 * kk + lane / 16)]);
        __syncthreads(); /* Q is in registers everywhere before tile 1 lands on it */

        /* this thread's rows: g and g + 8 of the warp's 16 */
        uint32_t pr[2];
        pr[0] = p0 + warp * 16 + lane / 4;
        pr[1] = pr[0] + 8;
        float o[HD / 8][4];
#pragma unroll
        for (uint32_t n = 0; n < HD / 8; n++)
                o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

        for (uint32_t j = 0; j < n_tiles; j++) {
                if (j + 1 < n_tiles) {
                        load_kv(j + 1);
                        cp_async_wait<1>();
                } else {
                        cp_async_wait<0>();
                }
                __syncthreads();
                const uint4 *ks = k_s + (j & 1) * FL_BN * CH, *vs = v_s + (j & 1) * FL_BN * CH;

                float s[FL_BN / 8][4];
#pragma unroll
                for (uint32_t n = 0; n < FL_BN / 8; n++)
                        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
                for (uint32_t kk = 0; kk < HD / 16; kk++)
#pragma unroll
                        for (uint32_t n2 = 0; n2 < FL_BN / 16; n2++) {
                                uint32_t b[4];
                                ldsm_x4(b, &ks[sw<HD>(n2 * 16 + (lane / 16) * 8 + lane % 8,
                                        2 * kk + (lane / 8) % 2)]);
                                mma16816(s[2 * n2], qf[kk], b[0], b[1]);
                                mma16816(s[2 * n2 + 1], qf[kk], b[2], b[3]);
                        }

                /* scale, causal mask (only tiles reaching past the task's first row) */
                bool mask = j * FL_BN + FL_BN - 1 > p0;
#pragma unroll
                for (uint32_t n = 0; n < FL_BN / 8; n++)
#pragma unroll
                        for (uint32_t e = 0; e < 4; e++) {
                                uint32_t kv = j * FL_BN + n * 8 + 2 * (lane % 4) + e % 2;
                                s[n][e] = mask && kv > pr[e / 2] ? -INFINITY
                                                                 : s[n][e] * scale_log2;
                        }

                /* online softmax: each row lives in a quad of lanes */
#pragma unroll
                for (uint32_t rr = 0; rr < 2; rr++) {
                        float mx = -INFINITY;
#pragma unroll
                        for (uint32_t n = 0; n < FL_BN / 8; n++)
                                mx = fmaxf(mx, fmaxf(s[n][2 * rr], s[n][2 * rr + 1]));
                        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                        /* finite: tile 0 holds position 0, which every row sees */
                        float mn = fmaxf(m[rr], mx);
                        float alpha = exp2f(m[rr] - mn);
                        m[rr] = mn;
                        float sum = 0.0f;
#pragma unroll
                        for (uint32_t n = 0; n < FL_BN / 8; n++) {
                                s[n][2 * rr] = exp2f(s[n][2 * rr] - mn);
                                s[n][2 * rr + 1] = exp2f(s[n][2 * rr + 1] - mn);
                                sum += s[n][2 * rr] + s[n][2 * rr + 1];
                        }
                        l[rr] = l[rr] * alpha + sum;
#pragma unroll
                        for (uint32_t n = 0; n < HD / 8; n++) {
                                o[n][2 * rr] *= alpha;
                                o[n][2 * rr + 1] *= alpha;
                        }
                }

                /* O += P·V, P's accumulator fragments reused as A fragments */
#pragma unroll
                for (uint32_t kk = 0; kk < FL_BN / 16; kk++) {
                        uint32_t a[4] = {pack_h2(s[2 * kk][0], s[2 * kk][1]),
                                pack_h2(s[2 * kk][2], s[2 * kk][3]),
                                pack_h2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack_h2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                        for (uint32_t d2 = 0; d2 < HD / 16; d2++) {
                                uint32_t b[4];
                                ldsm_x4_t(b, &vs[sw<HD>(kk * 16 + ((lane / 8) % 2) * 8 + lane % 8,
                                        2 * d2 + lane / 16)]);
                                mma16816(o[2 * d2], a, b[0], b[1]);
                                mma16816(o[2 * d2 + 1], a, b[2], b[3]);
                        }
                }
                __syncthreads(); /* everyone is done with buffer j % 2 before it is refilled */
        }

#pragma unroll
        for (uint32_t rr = 0; rr < 2; rr++) {
                float lt = l[rr];
                lt += __shfl_xor_sync(0xffffffffu, lt, 1);
                lt += __shfl_xor_sync(0xffffffffu, lt, 2);
                float inv = 1.0f / lt;
                uint32_t r = warp * 16 + lane / 4 + 8 * rr;
                if (r < nq) {
                        __half *dst = out + (size_t) (r0 + r) * q_dim + h * HD + 2 * (lane % 4);
#pragma unroll
                        for (uint32_t n = 0; n < HD / 8; n++)
                                *(uint32_t *) (dst + n * 8) =
                                        pack_h2(o[n][2 * rr] * inv, o[n][2 * rr + 1] * inv);
                }
        }
}

template <uint32_t HD>
static void flash_launch(cudaStream_t st, const float *q, const __half *k_cache,
        const __half *v_cache, CuMeta meta, const uint32_t *tasks, uint32_t n_tasks,
        uint32_t block_tokens, uint32_t n_heads, uint32_t n_kv_heads, __half *out)
{
        static bool smem_set; /* the same value from any thread: a race is harmless */
        size_t smem = (size_t) 4 * FL_BN * HD * 2;
        if (!smem_set) {
                cudaFuncSetAttribute(k_flash<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                        (int) smem);
                smem_set = true;
        }
        float scale_log2 = (float) (1.4426950408889634 / sqrt((double) HD));
        dim3 grid(n_heads, n_tasks);
        k_flash<HD><<<grid, FL_THREADS, smem, st>>>(q, k_cache, v_cache, meta.base, meta.pos,
                meta.row_bt, tasks, block_tokens, n_heads / n_kv_heads, n_kv_heads * HD,
                scale_log2, out);
}

void cu_flash_attention(cudaStream_t st, const float *q, const __half *k_cache,
        const __half *v_cache, CuMeta meta, const uint32_t *tasks, uint32_t n_tasks,
        uint32_t block_tokens, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
        __half *out)
{
        if (n_tasks == 0)
                return;
        if (head_dim == 64)
                flash_launch<64>(st, q, k_cache, v_cache, meta, tasks, n_tasks, block_tokens,
                        n_heads, n_kv_heads, out);
        else
                flash_launch<128>(st, q, k_cache, v_cache, meta, tasks, n_tasks, block_tokens,
                        n_heads, n_kv_heads, out);
}

/* ---------------------------------------------------------------------------------------
 * Test hook */

#define TRY(call, what)                                                                            \
        do {                                                                                       \
                cudaError_t _e = (call);                                                           \
                if (_e != cudaSuccess) {                                                           \
                        r = ds_error(err, -EIO, "flash test: %s: %s", what,                        \
                                cudaGetErrorString(_e));                                           \
                        goto out;                                                                  \
                }                                                                                  \
        } while (0)

extern "C" int cuda_test_flash(const CudaFlashTest *ft, const float *q, const uint16_t *k,
        const uint16_t *v, uint16_t *out, DsError *err)
{
        uint32_t n = ft->n, hd = ft->head_dim, q_dim = ft->n_heads * hd;
        uint32_t kvd = ft->n_kv_heads * hd;
        size_t cache = (size_t) ft->cache_blocks * ft->block_tokens * kvd;
        float *q_d = NULL;
        __half *k_d = NULL, *v_d = NULL, *o_d = NULL;
        uint32_t *m_d = NULL, *m_h = NULL, n_tasks = 0;
        int r = 0;

        if (!cu_flash_takes(hd, ft->pos + n) || n == 0 || n > 0xffffu || ft->first == 0 ||
                ft->n_heads % ft->n_kv_heads != 0)
                return ds_error(err, -EINVAL, "flash test: head_dim %u, %u rows, first task %u",
                        hd, n, ft->first);
        /* meta: header, pos, row_bt, tasks, block table; the kernel reads only those */
        size_t words = 4 + 3 * (size_t) n + ft->n_blocks;
        m_h = (uint32_t *) calloc(words, 4);
        if (!m_h)
                return ds_error(err, -ENOMEM, "flash test: out of memory");
        for (uint32_t i = 0; i < n; i++) {
                m_h[4 + i] = ft->pos + i;
                m_h[4 + n + i] = 4 + 3 * n;
        }
        for (uint32_t r0 = 0; r0 < n;) {
                uint32_t len = MIN(n - r0, r0 == 0 ? MIN(ft->first, (uint32_t) FLASH_ROWS)
                                                   : (uint32_t) FLASH_ROWS);
                m_h[4 + 2 * n + n_tasks++] = r0 | len << 16;
                r0 += len;
        }
        memcpy(m_h + 4 + 3 * n, ft->blocks, (size_t) ft->n_blocks * 4);

        TRY(cudaMalloc(&q_d, (size_t) n * q_dim * 4), "q");
        TRY(cudaMalloc(&k_d, cache * 2), "k");
        TRY(cudaMalloc(&v_d, cache * 2), "v");
        TRY(cudaMalloc(&o_d, (size_t) n * q_dim * 2), "out");
        TRY(cudaMalloc(&m_d, words * 4), "meta");
        TRY(cudaMemcpy(q_d, q, (size_t) n * q_dim * 4, cudaMemcpyHostToDevice), "q");
        TRY(cudaMemcpy(k_d, k, cache * 2, cudaMemcpyHostToDevice), "k");
        TRY(cudaMemcpy(v_d, v, cache * 2, cudaMemcpyHostToDevice), "v");
        TRY(cudaMemcpy(o_d, out, (size_t) n * q_dim * 2, cudaMemcpyHostToDevice), "out");
        TRY(cudaMemcpy(m_d, m_h, words * 4, cudaMemcpyHostToDevice), "meta");
        {
                CuMeta meta = {};
                meta.base = m_d;
                meta.pos = m_d + 4;
                meta.row_bt = m_d + 4 + n;
                cu_flash_attention(0, q_d, k_d, v_d, meta, m_d + 4 + 2 * n, n_tasks,
                        ft->block_tokens, ft->n_heads, ft->n_kv_heads, hd, o_d);
        }
        TRY(cudaGetLastError(), "launch");
        TRY(cudaDeviceSynchronize(), "run");
        TRY(cudaMemcpy(out, o_d, (size_t) n * q_dim * 2, cudaMemcpyDeviceToHost), "out");
out:
        cudaFree(q_d);
        cudaFree(k_d);
        cudaFree(v_d);
        cudaFree(o_d);
        cudaFree(m_d);
        free(m_h);
        return r;
}
