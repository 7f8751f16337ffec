/* SPDX-License-Identifier: MIT */
/* Quantizing a linear's input into a CuQx (cuda_kernels.cuh), shared by the kernels that
 * make it (the add_norm, k_gemv_res, k_embed_qx) and the tests' quantizer, so that all
 * write the same bits. Internal to kernels/cuda. */
#pragma once

#include "cuda_kernels.cuh"
#include "cuda_ptx.cuh"

/* The bytes (X[0], X[2], X[1], X[3]) of four signed bytes as one word: k 4t + {0, 2, 1,
 * 3}, the order of an AWQ word's nibbles. */
__device__ __forceinline__ uint32_t qx_word(const int *X)
{
        return ((uint32_t) X[0] & 0xff) | ((uint32_t) X[2] & 0xff) << 8 |
               ((uint32_t) X[1] & 0xff) << 16 | ((uint32_t) X[3] & 0xff) << 24;
}

/* One chunk by 8 lanes of a warp: lane u = lane % 8 holds its k 8u..8u+7 in v. Every lane
 * of the warp calls it (the shuffles take all 32); the lanes with live set write item (32
 * words) and rec. */
__device__ __forceinline__ void qx_chunk_f(const float *v, bool live, uint32_t *item, float2 *rec)
{
        uint32_t u = threadIdx.x % 8;
        float m = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++)
                m = fmaxf(m, fabsf(v[k]));
#pragma unroll
        for (int o = 1; o < 8; o *= 2)
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float inv = m > 0.0f ? (float) QX_XMAX / m : 0.0f;
        int X[8], H[8], L[8], sum = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
                /* |v| <= m, so |v * inv| rounds to at most QX_XMAX */
                X[k] = __float2int_rn(v[k] * inv);
                sum += X[k];
                H[k] = (X[k] + 128) >> 8;
                L[k] = X[k] - 256 * H[k];
        }
#pragma unroll
        for (int o = 1; o < 8; o *= 2)
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (!live)
                return;
        /* k 8u..8u+7: k-step j = u / 2, lanes-of-quad t0 = 2 (u % 2) and t0 + 1 */
        uint32_t t0 = 2 * (u % 2), j = u / 2;
        item[4 * t0 + j] = qx_word(H);
        item[4 * (t0 + 1) + j] = qx_word(H + 4);
        item[16 + 4 * t0 + j] = qx_word(L);
        item[16 + 4 * (t0 + 1) + j] = qx_word(L + 4);
        if (u == 0)
                *rec = make_float2(m / (float) QX_XMAX, __int_as_float(sum));
}

/* The end of a chunk ch of a CuQx with sums of squares (k_gemv_res, k_embed_qx): the 8-lane
 * group of qx_chunk_f, with v its lanes' w h and sq each lane's sum of its h^2. The group's
 * first lane's total goes into every copy of ss (the lanes' trees add in different orders,
 * and every consumer must read the same bits). Every lane of the warp calls it; the groups
 * with live set write. */
__device__ __forceinline__ void qx_chunk_ss(const float *v, float sq, bool live, const CuQx &qx,
        uint32_t ch)
{
        uint32_t lane = threadIdx.x % 32;
#pragma unroll
        for (int o = 1; o < 8; o *= 2)
                sq += __shfl_xor_sync(0xffffffffu, sq, o);
        sq = __shfl_sync(0xffffffffu, sq, lane & ~7u);
        qx_chunk_f(v, live, qx.items + (size_t) ch * 32, qx.recs + ch);
        if (live)
                for (uint32_t c = lane % 8; c < QX_SS_COPIES; c += 8)
                        qx.ss[c * QX_SS_CHUNKS + ch] = sq;
}

/* The end of chunk ch of a CuQx with sums of squares by a whole warp, lane l holding k 2 l
 * and 2 l + 1 (v0, v1, and sq the sum of their h^2): the items and record of qx_chunk_f for
 * the same values (the largest |v| and the sum of X by redux.sync, each X as there), and
 * the chunk's sum of h^2 in another order than qx_chunk_ss's (a butterfly, whose two lanes
 * of a pair add the same two numbers, so every lane holds the same total). Every lane of
 * the warp calls it. */
__device__ __forceinline__ void qx_chunk_pairs(float v0, float v1, float sq, const CuQx &qx,
        uint32_t ch)
{
        uint32_t lane = threadIdx.x % 32;
        float m = __uint_as_float(
                __reduce_max_sync(0xffffffffu, __float_as_uint(fmaxf(fabsf(v0), fabsf(v1)))));
        float inv = m > 0.0f ? (float) QX_XMAX / m : 0.0f;
        /* |v| <= m, so |v * inv| rounds to at most QX_XMAX */
        int X0 = __float2int_rn(v0 * inv), X1 = __float2int_rn(v1 * inv);
        int sum = __reduce_add_sync(0xffffffffu, X0 + X1);
        int H0 = (X0 + 128) >> 8, H1 = (X1 + 128) >> 8;
        /* bytes xh, xl of k 2 l, then of k 2 l + 1 */
        uint32_t b = ((uint32_t) H0 & 0xffu) | ((uint32_t) (X0 - 256 * H0) & 0xffu) << 8 |
                     ((uint32_t) H1 & 0xffu) << 16 | ((uint32_t) (X1 - 256 * H1) & 0xffu) << 24;
#pragma unroll
        for (int o = 1; o < 32; o *= 2)
                sq += __shfl_xor_sync(0xffffffffu, sq, o);
        /* word w = 16 p + 4 t + j: part p of k 16 j + 4 t + {0, 2, 1, 3} (qx_word's order),
         * k 16 j + 4 t + {0, 1} from lane 8 j + 2 t, {2, 3} from the next */
        uint32_t p = lane / 16, t = lane / 4 % 4, j = lane % 4;
        uint32_t lo = __shfl_sync(0xffffffffu, b, 8 * j + 2 * t);
        uint32_t hi = __shfl_sync(0xffffffffu, b, 8 * j + 2 * t + 1);
        qx.items[(size_t) ch * 32 + lane] = __byte_perm(lo, hi, p ? 0x7351 : 0x6240);
        if (lane == 0)
                qx.recs[ch] = make_float2(m / (float) QX_XMAX, __int_as_float(sum));
        if (lane < QX_SS_COPIES)
                qx.ss[lane * QX_SS_CHUNKS + ch] = sq;
}

/* qx_chunk_f of 8 halves a lane (raw). */
__device__ __forceinline__ void qx_chunk(uint4 raw, bool live, uint32_t *item, float2 *rec)
{
        float v[8];
        h8_to_f(raw, v);
        qx_chunk_f(v, live, item, rec);
}
