/* SPDX-License-Identifier: MIT */
/* The GEMVs (INT4 AWQ up to 16 rows, and per MoE expert through shared-memory stages; dense
 * FP16 up to GEMV_ROWS, and on tensor cores up to 16; 8-bit up to 16; an MLA layer's o at one
 * row with its input made in its prologue),
 * the grouped INT4 GEMM of MoE experts with many rows, the AWQ repack that lays the weights
 * out for them, and the dequantization the cuBLAS path multiplies (see cuda_kernels.cuh). */
extern "C" {
#include "cuda_backend.h"
}
#include "cuda_kernels.cuh"
#include "cuda_ptx.cuh"
#include "cuda_qx.cuh"
#include <cfloat>
#include <cooperative_groups.h>

namespace cg = cooperative_groups;

/* Logical column j of a packed AWQ word is nibble AWQ_REV[j] (docs/formats.md); the
 * repack reads the checkpoint through it. */
__constant__ uint32_t AWQ_REV[8] = {0, 4, 1, 5, 2, 6, 3, 7};

static inline uint32_t div_up(uint32_t a, uint32_t b)
{
        return (a + b - 1) / b;
}

/* ---------------------------------------------------------------------------------------
 * INT4 x FP16 GEMV for up to 16 rows on tensor cores, streaming the weights.
 *
 * The weights are the A operand of mma.m16n8k16 (16 output columns by 16 k) and the rows
 * of x the B operand (8 rows; a second mma takes rows 8..15), so one 32-bit word of
 * weights feeds one mma and up to 8 rows cost the same instructions as one.
 *
 * Layout (k_awq_repack): tiles of AWQ_TN = 16 columns, chunks of AWQ_KC = 64 k. One (tile,
 * chunk) unit is 32 16-byte pieces, piece l for lane l = 4g + t; its word j is k-step j (k
 * 16j..16j+15 of the chunk), in which the lane holds columns g and g + 8 at k 16j + 4t +
 * {0..3}: nibble i is column g + 8 (i & 1) at k offset (i & 2) + (i >> 2). The mma's k
 * order is a permutation of ours (its k 2t, 2t+1, 2t+8, 2t+9 are our 4t..4t+3, in A and B
 * alike), so a lane's x fragment is 4 consecutive halves (one 8-byte load) and a lop3 on
 * nibbles i and i + 4 gives an A register: 0x6400 | q is the fp16 1024 + q; the upper
 * nibbles come out as 1024 + 16q and one fma brings them back. Units go by groups of
 * AWQ_NT tiles (one CTA's), chunk after chunk, the group's tiles next to each other
 * (awq_unit): a warp reads AWQ_NT * 512 contiguous bytes per chunk.
 *
 * Scales and zeros: 8 bytes per (group, tile, g): s of columns g and g + 8, then -(1024 +
 * z) of column g and -(64 + z) of column g + 8 in fp16, so one hadd2 / hfma2 yields q - z
 * exactly. The mma multiplies q - z by x into float32 and the scale multiplies each
 * group's float32 sum: the weights are never rounded (as in the CPU reference).
 *
 * A CTA of AWQ_KW warps takes AWQ_NT tiles and one K slice (blockIdx.y): its warps split
 * the slice's chunks, each with AWQ_D chunks of loads in flight, and their sums meet in
 * shared memory in warp order. blockIdx.z is the MoE slot (expert ids[z]). Rows go in
 * passes of 8 (one mma per word), or one pass of 9..16 (two); MoE experts with more than 8
 * rows re-read their weights per pass (steps where that is common take k_moe_gemm). A
 * row's result depends only on its own x row (the mma's columns are independent, and the
 * arithmetic is the same in both kinds of pass), never on the other rows or their number. */

#define AWQ_TN 16
#define AWQ_KC 64
#define AWQ_NT 2
#define AWQ_KW 4
#define AWQ_D  4 /* even */

/* AwqArgs.group_magic of l. */
static inline uint32_t awq_group_magic(const CuLinear *l)
{
        uint32_t d = l->group_size / 32;
        return (uint32_t) ((((uint64_t) 1 << 31) + d - 1) / d);
}

/* Index of unit (tile, chunk) among a matrix's units of chunks chunks each. */
__host__ __device__ static inline size_t awq_unit(uint32_t tile, uint32_t ch, uint32_t chunks)
{
        return ((size_t) (tile / AWQ_NT) * chunks + ch) * AWQ_NT + tile % AWQ_NT;
}

/* Tiles of an AWQ matrix of n columns: a whole number of CTAs' worth (the padding is
 * zero), so that no CTA checks for a missing tile. */
static inline uint32_t awq_tiles(uint32_t n)
{
        return div_up(n, AWQ_TN * AWQ_NT) * AWQ_NT;
}

struct AwqArgs {
        const uint4 *qw;
        const __half2 *sz;
        size_t qw_units, sz_units; /* per expert */
        const uint32_t *ids;        /* the expert of each blockIdx.z; NULL: blockIdx.z */
        const uint32_t *off, *list; /* NULL: rows 0..rows of x are the rows of y */
        uint32_t rows, x_div, ldx;
        const __half *x;
        float *y;
        size_t slice_stride;
        uint32_t K, N, tiles, chunks, splits;
        uint32_t group_magic; /* ceil(2^31 / (group size / 32)) */
        __half *hb; /* paired gate|up tiles, one slice: silu(gate) * up (rows, N / 2), not y */
        CuQx qx;    /* x quantized, for k_gemv_qx */
        CuRopeKv rope; /* k_gemv_qx's rope epilogue (cu_gemv_qkv_rope) */
        CuQx hq;       /* with hb, one row: hb quantized by 16 k instead (cu_gemv_gate_up) */
};

/* (w & mask) | 0x64006400 in one lop3 (the compiler makes two of it). */
template <uint32_t MASK>
__device__ __forceinline__ __half2 nibbles(uint32_t w)
{
        uint32_t r;
        asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(w), "n"(MASK), "n"(0x64006400u));
        return u32_as_h2(r);
}

/* The A registers of one word; zlo = -(1024 + z) of column g, zhi = -(64 + z) of g + 8. */
__device__ __forceinline__ void awq_a(uint32_t w, __half2 zlo, __half2 zhi, uint32_t *a)
{
        const __half2 sixteenth = __float2half2_rn(1.0f / 16.0f);
        a[0] = h2_as_u32(__hadd2(nibbles<0x000f000fu>(w), zlo));
        a[1] = h2_as_u32(__hfma2(nibbles<0x00f000f0u>(w), sixteenth, zhi));
        w >>= 8;
        a[2] = h2_as_u32(__hadd2(nibbles<0x000f000fu>(w), zlo));
        a[3] = h2_as_u32(__hfma2(nibbles<0x00f000f0u>(w), sixteenth, zhi));
}

__device__ __forceinline__ void mma16816(float *c, const uint32_t *a, uint2 b)
{
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}

/* One warp's sums of a pass, as awq_store gathers them: by tile, register and lane. */
typedef float AwqRed[AWQ_NT][8][32];

/* c[h] (rows 8h..8h+7 of tile's columns) += one chunk of one tile: its weight piece v, its
 * scale records r (one per Q-th of the chunk) and the pass's x fragments xq. */
template <int H, int Q>
__device__ __forceinline__ void awq_tile(uint4 v, const uint2 *r, const uint2 (*xq)[4],
        float (*c)[4])
{
        const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < Q; q++) {
                __half2 zlo = __low2half2(u32_as_h2(r[q].y));
                __half2 zhi = __high2half2(u32_as_h2(r[q].y));
                float2 s = __half22float2(u32_as_h2(r[q].x));
                float tmp[H][4];
#pragma unroll
                for (int h = 0; h < H; h++)
                        tmp[h][0] = tmp[h][1] = tmp[h][2] = tmp[h][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < 4 / Q; kk++) {
                        uint32_t A[4];
                        awq_a(wd[q * (4 / Q) + kk], zlo, zhi, A);
#pragma unroll
                        for (int h = 0; h < H; h++)
                                mma16816(tmp[h], A, xq[h][q * (4 / Q) + kk]);
                }
#pragma unroll
                for (int h = 0; h < H; h++) {
                        c[h][0] += s.x * tmp[h][0];
                        c[h][1] += s.x * tmp[h][1];
                        c[h][2] += s.y * tmp[h][2];
                        c[h][3] += s.y * tmp[h][3];
                }
        }
}

/* Register q of tile j as lane lane of every warp holds it in red, added in warp order. */
template <int KW>
__device__ __forceinline__ float warps_sum(const AwqRed *red, int j, int q, uint32_t lane)
{
        float v = red[0][j][q][lane];
#pragma unroll
        for (int w = 1; w < KW; w++)
                v += red[w][j][q][lane];
        return v;
}

/* hb of one row quantized by 16 k (CuQx's by-16 layout, cuda_kernels.cuh): the CTA's gate
 * and up tiles make columns 16 u .. 16 u + 15 of hb (u = tile0 / 2), k-step u % 4 of chunk
 * u / 4, which one warp quantizes as qx_chunk_f does a chunk, from red: lane l and l + 16
 * take column l % 16 (a shuffle takes all 32), lanes 0..7 write the 8 words, lane 0 the
 * record. The SwiGLU is awq_store's, so X is the FP16 path's value before its rounding. */
template <int KW>
__device__ __forceinline__ void hq_store(const AwqArgs &a, const AwqRed *red, uint32_t tile0)
{
        uint32_t lane = threadIdx.x % 32, l = lane % 16;
        /* column l of row 0: register 2 (l / 8) of lane 4 (l % 8) */
        uint32_t src = 4 * (l % 8), q = 2 * (l / 8);
        float v = silu_mul(warps_sum<KW>(red, 0, q, src), warps_sum<KW>(red, 1, q, src));
        /* the largest |v| in one redux: the bits of floats >= 0 order as their values */
        float m = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(fabsf(v))));
        float inv = m > 0.0f ? (float) QX_XMAX / m : 0.0f;
        /* |v| <= m, so |v * inv| rounds to at most QX_XMAX */
        int X = __float2int_rn(v * inv);
        int sum = __reduce_add_sync(0xffffffffu, lane < 16 ? X : 0);
        int hi = (X + 128) >> 8, lo = X - 256 * hi;
        uint32_t both = ((uint32_t) hi & 0xffu) | ((uint32_t) lo & 0xffu) << 8;
        /* lane 4 p + t < 8: word 4 p + t, part p of k 4 t + {0, 2, 1, 3} (qx_word's order) */
        uint32_t p = lane / 4 % 2, t = lane % 4, word = 0;
#pragma unroll
        for (uint32_t b = 0; b < 4; b++) {
                uint32_t k = 4 * t + (b == 1 ? 2 : b == 2 ? 1 : b);
                word |= (__shfl_sync(0xffffffffu, both, k) >> (8 * p) & 0xffu) << (8 * b);
        }
        uint32_t u = tile0 / 2, ch = u / 4, s = u % 4;
        if (lane < 8)
                a.hq.items[(size_t) ch * 32 + 8 * s + lane] = word;
        if (lane == 0)
                a.hq.recs[(size_t) ch * 4 + s] = make_float2(m / (float) QX_XMAX, __int_as_float(sum));
}

/* The warps' sums c of a pass meet in red in warp order; warp 0 writes the pass's rows.
 * c[j][h]: columns g, g, g + 8, g + 8 of tile tile0 + j; rows 8h + 2t, 8h + 2t + 1.
 * SPREAD: every warp writes its share of the outputs. A barrier follows only where reuse
 * says red's space is written next by a warp that may be ahead of the others' reads; a
 * caller that alternates two reds passes false (a pass's red is rewritten only after the
 * next pass's barrier, which every warp reaches after its reads). HQ: where a.hq.items is
 * set, hb goes there quantized by 16 k (hq_store); only k_gemv_qx's one-row gate|up asks,
 * and the other kernels do without the code. */
template <int H, int KW = AWQ_KW, bool SPREAD = false, bool HQ = false>
__device__ __forceinline__ void awq_store(const AwqArgs &a, float (*c)[H][4], uint32_t tile0,
        uint32_t p0, uint32_t pr, AwqRed *red, bool reuse = true)
{
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
        for (int j = 0; j < AWQ_NT; j++)
#pragma unroll
                for (int h = 0; h < H; h++)
#pragma unroll
                        for (int r = 0; r < 4; r++)
                                red[warp][j][4 * h + r][lane] = c[j][h][r];
        __syncthreads();
        if (HQ && a.hq.items) {
                /* one row (cu_gemv_gate_up): a warp a unit, in turn */
                if (warp == tile0 / 2 % KW)
                        hq_store<KW>(a, red, tile0);
        } else if (SPREAD && a.hb) {
#pragma unroll
                for (int h = 0; h < H; h++)
#pragma unroll
                        for (int r = 0; r < 4; r++) {
                                uint32_t i = 8 * h + 2 * t + r % 2;
                                if ((4 * h + r) % KW != (int) warp || i >= pr)
                                        continue;
                                float v = silu_mul(warps_sum<KW>(red, 0, 4 * h + r, lane),
                                        warps_sum<KW>(red, 1, 4 * h + r, lane));
                                uint32_t row = a.list ? a.list[p0 + i] : p0 + i;
                                a.hb[(size_t) row * (a.N / 2) + tile0 / 2 * AWQ_TN + g +
                                        8 * (r / 2)] = __float2half(v);
                        }
        } else if (!SPREAD && warp == 0 && a.hb) {
                /* the CTA's tiles are gate tile tile0 / 2 and its up tile: a lane holds both
                 * sums of its columns and rows (k_swiglu4's arithmetic from here). Every
                 * SwiGLU first, then the stores that apply: their loads and arithmetic
                 * overlap, where a test around each made the CTA's tail a chain of them. */
                float hv[H][4];
#pragma unroll
                for (int h = 0; h < H; h++)
#pragma unroll
                        for (int r = 0; r < 4; r++) {
                                hv[h][r] = silu_mul(warps_sum<KW>(red, 0, 4 * h + r, lane),
                                        warps_sum<KW>(red, 1, 4 * h + r, lane));
                        }
#pragma unroll
                for (int h = 0; h < H; h++)
#pragma unroll
                        for (int r = 0; r < 4; r++) {
                                uint32_t col = tile0 / 2 * AWQ_TN + g + 8 * (r / 2);
                                uint32_t i = 8 * h + 2 * t + r % 2;
                                if (i < pr) {
                                        uint32_t row = a.list ? a.list[p0 + i] : p0 + i;
                                        a.hb[(size_t) row * (a.N / 2) + col] =
                                                __float2half(hv[h][r]);
                                }
                        }
        } else if (SPREAD || warp == 0) {
                float *ys = a.y + blockIdx.y * a.slice_stride;
#pragma unroll
                for (int j = 0; j < AWQ_NT; j++) {
#pragma unroll
                        for (int h = 0; h < H; h++)
#pragma unroll
                                for (int r = 0; r < 4; r++) {
                                        uint32_t col = (tile0 + j) * AWQ_TN + g + 8 * (r / 2);
                                        uint32_t i = 8 * h + 2 * t + r % 2;
                                        /* SPREAD: a warp sums only the outputs it stores */
                                        if (SPREAD && (((j * H + h) * 4 + r) % KW != (int) warp ||
                                                              col >= a.N || i >= pr))
                                                continue;
                                        float v = warps_sum<KW>(red, j, 4 * h + r, lane);
                                        if (SPREAD || (col < a.N && i < pr)) {
                                                uint32_t row = a.list ? a.list[p0 + i] : p0 + i;
                                                ys[(size_t) row * a.N + col] = v;
                                        }
                                }
                }
        }
        if (!SPREAD || reuse)
                __syncthreads(); /* red's space is reused by the next pass */
}

/* The CTA's K slice [c0, c1) of chunks (blockIdx.y of a.splits) and its warp's part [w0,
 * w1) of it. */
template <int KW = AWQ_KW>
__device__ __forceinline__ void awq_slice(const AwqArgs &a, uint32_t *c0, uint32_t *c1,
        uint32_t *w0, uint32_t *w1)
{
        uint32_t s = blockIdx.y, warp = threadIdx.x / 32;
        *c0 = (uint32_t) ((uint64_t) a.chunks * s / a.splits);
        *c1 = (uint32_t) ((uint64_t) a.chunks * (s + 1) / a.splits);
        *w0 = *c0 + (*c1 - *c0) * warp / KW;
        *w1 = *c0 + (*c1 - *c0) * (warp + 1) / KW;
}

/* Halves per row of x a CTA keeps in shared memory (XS passes): the slice's k and 16 of
 * padding, so that the two rows' fragments of a warp's load fall in distinct banks. */
__host__ __device__ static inline uint32_t awq_xs_row(uint32_t slice_chunks)
{
        return slice_chunks * AWQ_KC + 16;
}

/* A warp's chunks [w0, w1) with D stages of weights in flight: load(i, ch) fills stage i
 * with chunk ch's weights, load_x(s, ch) x stage s (two, by parity) with chunk ch's x,
 * compute(i, s) uses both. preload takes the first D stages, before the PDL wait (the
 * weights are constant, so they stream in while the predecessor finishes); stream then
 * loads x a chunk ahead and the weights D ahead. D is even, so chunk base + i's x is in
 * stage i % 2 on every round. */
template <int D, typename Load>
__device__ __forceinline__ void awq_preload(uint32_t w0, uint32_t w1, Load load)
{
        if (w0 < w1) {
#pragma unroll
                for (int i = 0; i < D; i++)
                        if (w0 + i < w1)
                                load(i, w0 + i);
        }
}

template <int D, typename Load, typename LoadX, typename Compute>
__device__ __forceinline__ void awq_stream(uint32_t w0, uint32_t w1, Load load, LoadX load_x,
        Compute compute)
{
        if (w0 < w1)
                load_x(0, w0);
        for (uint32_t base = w0; base < w1; base += D) {
#pragma unroll
                for (int i = 0; i < D; i++) {
                        uint32_t ch = base + i;
                        if (ch >= w1)
                                break;
                        if (ch + 1 < w1)
                                load_x((i + 1) % 2, ch + 1);
                        compute(i, i % 2);
                        if (ch + D < w1)
                                load(i, ch + D);
                }
        }
}

/* The warp's sums c of one pass of up to 16 rows (HI), else 8, over AWQ_NT tiles from tile0
 * and the warp's chunks [w0, w1) of its slice [c0, c1) (awq_pass stores them, k_gemv_res
 * takes them on); HI has half the chunks in flight, for registers. G64:
 * the group size is a multiple of the chunk (so is K), one (scale, zero) per tile and
 * chunk; else one per half chunk (32 k), and the last chunk may be half beyond K.
 *
 * XS (dense passes of 1 or 2 rows): the CTA first copies its slice of the rows of x into
 * shared memory (xsl), and the warps take x from there. Read from global memory one chunk
 * ahead, x mostly came from L2 (ncu: 9% L1 hits) and cost a fifth of gate_up's time
 * (bench-gemv with x not loaded: 22.8 against 28.0 us, PERF.md, fourth session). */
template <bool HI, bool G64, bool XS>
__device__ __forceinline__ void awq_sums(const AwqArgs &a, const uint4 *qw, const uint2 *sz,
        uint32_t tile0, uint32_t c0, uint32_t c1, uint32_t w0, uint32_t w1, uint32_t p0,
        uint32_t pr, __half *xsl, float (*c)[HI ? 2 : 1][4])
{
        constexpr int H = HI ? 2 : 1, Q = G64 ? 1 : 2, D = HI ? AWQ_D / 2 : AWQ_D;
        uint32_t lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
        /* Lanes past the pass's rows read its first row: their columns of the mma's
         * result are never written, and no other column depends on them. */
        const __half *xr[H];
#pragma unroll
        for (int h = 0; h < H; h++) {
                uint32_t i = p0 + (g + 8 * h < pr ? g + 8 * h : 0);
                uint32_t row = a.list ? a.list[i] / a.x_div : i;
                xr[h] = a.x + (size_t) row * a.ldx + 4 * t;
        }
        const uint4 *qp = qw + awq_unit(tile0, 0, a.chunks) * 32 + lane;
        const uint2 *sp = sz + (size_t) tile0 * 8 + g;
        uint32_t group_recs = a.tiles * 8;
#pragma unroll
        for (int j = 0; j < AWQ_NT; j++)
#pragma unroll
                for (int h = 0; h < H; h++)
                        c[j][h][0] = c[j][h][1] = c[j][h][2] = c[j][h][3] = 0.0f;
        uint4 buf[D][AWQ_NT];
        uint2 szb[D][AWQ_NT][Q];
        uint2 xb[2][H][4]; /* x of the chunk being computed and of the next (stage parity) */

        /* weights and scales of chunk ch into stage i; a half chunk beyond K gets zero
         * scales (its x is zero too). The group of half chunk hc is hc / (gs / 32), as a
         * multiply-high of 2 hc (exact for hc < 2^15). */
        auto load = [&](int i, uint32_t ch) {
                const uint4 *qc = qp + (size_t) ch * (AWQ_NT * 32);
#pragma unroll
                for (int j = 0; j < AWQ_NT; j++)
                        buf[i][j] = ld_stream(qc + 32 * j);
#pragma unroll
                for (int q = 0; q < Q; q++) {
                        uint32_t hc = 2 * ch + q;
                        uint32_t grp = __umulhi(2 * hc, a.group_magic);
                        const uint2 *sc = sp + (size_t) grp * group_recs;
#pragma unroll
                        for (int j = 0; j < AWQ_NT; j++)
                                szb[i][j][q] = G64 || 32 * hc < a.K ? ld_stream(sc + 8 * j)
                                                                    : make_uint2(0, 0);
                }
        };
        const uint32_t xs_row = awq_xs_row(c1 - c0);
        auto load_x = [&](uint2 (*xd)[4], uint32_t ch) {
                if (XS) {
                        const __half *p = xsl + (g < pr ? g : 0) * xs_row +
                                          (ch - c0) * AWQ_KC + 4 * t;
#pragma unroll
                        for (int j = 0; j < 4; j++)
                                xd[0][j] = *(const uint2 *) (p + 16 * j);
                } else {
#pragma unroll
                        for (int h = 0; h < H; h++) {
                                const __half *p = xr[h] + (size_t) ch * AWQ_KC;
#pragma unroll
                                for (int j = 0; j < 4; j++)
                                        xd[h][j] = G64 || ch * AWQ_KC + 16 * j < a.K
                                                ? *(const uint2 *) (p + 16 * j)
                                                : make_uint2(0, 0);
                        }
                }
        };
        auto compute = [&](int i, int st) {
#pragma unroll
                for (int j = 0; j < AWQ_NT; j++)
                        awq_tile<H, Q>(buf[i][j], szb[i][j], xb[st], c[j]);
        };

        awq_preload<D>(w0, w1, load);
        pdl_wait();
        if (XS) {
                /* 16-byte pieces of the pass's rows over the slice; beyond K, zeros */
                uint32_t per_row = (c1 - c0) * AWQ_KC / 8;
                for (uint32_t i = threadIdx.x; i < pr * per_row; i += blockDim.x) {
                        uint32_t r = i / per_row, k = c0 * AWQ_KC + 8 * (i % per_row);
                        cp_async16(xsl + r * xs_row + 8 * (i % per_row),
                                a.x + (size_t) (p0 + r) * a.ldx + (k < a.K ? k : 0), k < a.K);
                }
                cp_async_commit();
                cp_async_wait<0>();
                __syncthreads();
        }
        awq_stream<D>(w0, w1, load, [&](int st, uint32_t ch) { load_x(xb[st], ch); }, compute);
}

template <bool HI, bool G64, bool XS>
__device__ __forceinline__ void awq_pass(const AwqArgs &a, const uint4 *qw, const uint2 *sz,
        uint32_t tile0, uint32_t c0, uint32_t c1, uint32_t w0, uint32_t w1, uint32_t p0,
        uint32_t pr, __half *xsl, AwqRed *red)
{
        float c[AWQ_NT][HI ? 2 : 1][4];
        awq_sums<HI, G64, XS>(a, qw, sz, tile0, c0, c1, w0, w1, p0, pr, xsl, c);
        awq_store<HI ? 2 : 1>(a, c, tile0, p0, pr, red);
}

template <bool HI, bool G64, bool XS>
__global__ void __launch_bounds__(AWQ_KW * 32, !HI && G64 ? 5 : 4) k_gemv_awq(const AwqArgs a)
{
        __shared__ AwqRed red[AWQ_KW];
        extern __shared__ __align__(16) __half awq_xsl[];
        pdl_trigger(); /* at entry (cuda_ptx.cuh) */
        if (a.ids || a.off || a.list)
                pdl_wait(); /* the experts and their rows come from the routing */
        uint32_t e = a.ids ? a.ids[blockIdx.z] : blockIdx.z, r0 = 0, r1 = a.rows;
        if (a.off) {
                r0 = a.off[blockIdx.z];
                r1 = a.off[blockIdx.z + 1];
        }
        uint32_t tile0 = blockIdx.x * AWQ_NT, c0, c1, w0, w1;
        awq_slice(a, &c0, &c1, &w0, &w1);
        const uint4 *qw = a.qw + e * a.qw_units;
        const uint2 *sz = (const uint2 *) (a.sz + e * a.sz_units);
        for (uint32_t p0 = r0; p0 < r1; p0 += HI ? 16 : 8)
                awq_pass<HI, G64, XS>(a, qw, sz, tile0, c0, c1, w0, w1, p0,
                        min(HI ? 16u : 8u, r1 - p0), awq_xsl, red);
}

/* ---------------------------------------------------------------------------------------
 * The INT4 GEMV of 1 to QX_ROWS dense rows on integer tensor cores.
 *
 * k_gemv_awq spends most of a chunk's instructions making FP16 operands of the nibbles:
 * the lop3 and shifts that unpack them and the hadd2 / hfma2 that take off the zero (SASS:
 * 41 and 36 of about 125 instructions a 1 KB chunk, eleventh session). Here x comes
 * quantized (CuQx, made once a row by the add_norm before), and the nibbles go to
 * mma.m16n8k32 (u8 x s8 -> s32) as they lie in the AWQ layout: w & 0x0f0f0f0f is column
 * g's four k of a word as bytes, w & 0xf0f0f0f0 column g + 8's times 16. A word costs one
 * lop3, two words one mma, and the zero comes off each chunk's integer sum: about 90
 * instructions a chunk, against k_gemv_awq's 126 (SASS, fifteenth session). B's column 2r
 * is row r's xh, column 2r + 1 its xl, so a lane (g, t) of the result holds row t's two
 * sums of columns g and g + 8, and 256 c_h + c_l is sum q X exactly. The chunk's term is
 * then s_w s (sum q X - z sum X), in float32 from there.
 * Against k_gemv_awq's FP16 x (11 bits a value) X keeps 15 bits of the chunk's largest.
 *
 * Quantizing in the GEMV itself cost more than it saved: each of 7B gate|up's 1184 CTAs
 * quantized the whole row (25.0 against 23.7 us a launch, and 20.9 with x not read at all;
 * docs/PERF.md, fifteenth session). The work split (AWQ_NT tiles and a K slice a CTA, the
 * slice's chunks split between its warps, AWQ_D chunks of weights in flight a warp) and
 * the sums' meeting are k_gemv_awq's; x goes one chunk ahead, from L2. G64 layouts only
 * (one scale record a tile and chunk). */

__device__ __forceinline__ void imma16832(int *c, const uint32_t *a, uint32_t b0, uint32_t b1)
{
        asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Chunk ch's weights and scale records of the CTA's AWQ_NT tiles into buf and szb, from qp
 * and sp (the warp's lane of its first unit, and its g of the tiles' records; group_recs
 * records a group). */
__device__ __forceinline__ void qx_load(const AwqArgs &a, const uint4 *qp, const uint2 *sp,
        uint32_t group_recs, uint32_t ch, uint4 *buf, uint2 *szb)
{
        const uint4 *qc = qp + (size_t) ch * (AWQ_NT * 32);
        const uint2 *sc = sp + (size_t) __umulhi(4 * ch, a.group_magic) * group_recs;
#pragma unroll
        for (int j = 0; j < AWQ_NT; j++) {
                buf[j] = ld_stream(qc + 32 * j);
                szb[j] = ld_stream(sc + 8 * j);
        }
}

/* One tile's chunk: the AWQ words v against B (b.x .. b.w: k-steps 0..3), the zeros of
 * record sz taken off with the x sum, scaled by it and sx into f (columns g and g + 8). */
__device__ __forceinline__ void qx_tile(uint4 v, uint2 sz, uint4 b, float sx, int sum, float *f)
{
        uint32_t A0[4] = {v.x & 0x0f0f0f0fu, v.x & 0xf0f0f0f0u, v.y & 0x0f0f0f0fu,
                v.y & 0xf0f0f0f0u};
        uint32_t A1[4] = {v.z & 0x0f0f0f0fu, v.z & 0xf0f0f0f0u, v.w & 0x0f0f0f0fu,
                v.w & 0xf0f0f0f0u};
        int c[4] = {0, 0, 0, 0};
        imma16832(c, A0, b.x, b.y);
        imma16832(c, A1, b.z, b.w);
        /* the record's zeros as FP16 bits: -(1024 + z) is 0xe400 | z, -(64 + z) is 0xd400 | 16 z */
        uint32_t zw = sz.y;
        int dg = 256 * c[0] + c[1] - (int) (zw & 0xfu) * sum;
        int dg8 = 256 * c[2] + c[3] - (int) ((zw >> 16) & 0xf0u) * sum;
        float2 s = __half22float2(u32_as_h2(sz.x));
        f[0] += s.x * sx * (float) dg;
        f[1] += s.y * (sx * 0.0625f) * (float) dg8;
}

/* Shared-memory bytes of a CTA's slice of the quantized rows (XS): items and records. */
__host__ __device__ static inline size_t qx_xs_bytes(uint32_t rows, uint32_t slice_chunks)
{
        return (size_t) rows * slice_chunks * (128 + sizeof(float2));
}

/* cu_gemv_qkv_rope's end of a CTA, in place of awq_store: its warps' sums meet in red in
 * warp order, as there, and the cluster (the tile pair's K slices, by rank) adds the slices'
 * sums in slice order, then the bias, as sum_part does. A lane's values of the pair's two
 * tiles are columns col and col + hd / 2 of one head (cu_awq_rope_tiles), which the rope
 * rotates into each other. Thread u's (register u / 32, lane u % 32) pair of values is rank
 * (u / 4) % S's to rotate and store: warp 0 sends each rank its share of the slice's sums
 * (cl_send into rope_in, counted on rope_bar, which k_gemv_qx set up at entry), so that a
 * CTA waits for its own values only and leaves without waiting for the others. Against the
 * cluster barrier before the ranks read each other's sums and the one after, 7B batch 1
 * was 0.5% faster (docs/PERF.md, thirty-first session, run 5). */
static_assert(AWQ_KW * 32 == 128 && AWQ_NT == 2, "qkv_rope_store: a thread a (register, lane)");
#define ROPE_IN_MAX 40 /* S * ceil(32 / S) for S <= 8 */

/* Bytes that rank of S receives: S senders, two tiles, 4 lanes of each of its groups v
 * (v % S == rank, v < 32). */
__device__ __forceinline__ uint32_t rope_in_bytes(uint32_t rank, uint32_t S)
{
        return S * 2 * 4 * ((32 - rank + S - 1) / S) * (uint32_t) sizeof(float);
}

/* Thread u (of AWQ_KW * 32 = 128) takes lane u % 32's (row i, column col) of register r = u
 * / 32 in qkv_rope_store. Its bias and angle depend on the weights and the step's positions
 * only (the host's copies, done before the graph starts), so k_gemv_qx takes them before its
 * wait: in the epilogue, between the sums and the cluster's exchange, the loads and the
 * sincos cost 7B batch 1 1.1% and 32B 0.5% (docs/PERF.md, thirty-third session, run 6). */
struct RopePrep {
        float cs, sn, ba, bb;
};

__device__ __forceinline__ RopePrep rope_prep(const AwqArgs &a, uint32_t pr)
{
        const CuRopeKv &rk = a.rope;
        uint32_t u = threadIdx.x, r = u / 32, g = u % 32 / 4, i = 2 * (u % 4) + r % 2;
        uint32_t col = pair_logical_tile(2 * blockIdx.x, rk.hd / 16) * 16 + g + 8 * (r / 2);
        RopePrep p = {1.0f, 0.0f, 0.0f, 0.0f};
        if (i < pr && rk.bias) {
                p.ba = rk.bias[col];
                p.bb = rk.bias[col + rk.hd / 2];
        }
        if (i < pr && col / rk.hd < rk.n_heads + rk.n_kv_heads)
                rope_angle(rk.pos[i], rk.inv_freq[col % rk.hd], rk.af, &p.cs, &p.sn);
        return p;
}

__device__ __forceinline__ void qkv_rope_store(const AwqArgs &a, float (*c)[1][4], uint32_t pr,
        AwqRed *red, float *rope_in, uint64_t *rope_bar, const RopePrep &rp)
{
        const CuRopeKv &rk = a.rope;
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
        for (int j = 0; j < AWQ_NT; j++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                        red[warp][j][r][lane] = c[j][0][r];
        uint32_t u = threadIdx.x, r = u / 32, g = u % 32 / 4, i = 2 * (u % 4) + r % 2;
        uint32_t col = pair_logical_tile(2 * blockIdx.x, rk.hd / 16) * 16 + g + 8 * (r / 2);
        float cs = rp.cs, sn = rp.sn, ba = rp.ba, bb = rp.bb;
        cg::cluster_group cluster = cg::this_cluster();
        uint32_t S = cluster.num_blocks(), rank = cluster.block_rank(), n = (32 + S - 1) / S;
        __syncthreads();
        __cluster_barrier_wait(); /* every rank's rope_bar is set up */
        if (warp == 0)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                        uint32_t v = 8 * q + lane / 4, to = v % S;
                        float *slot = rope_in + (rank * n + v / S) * 8 + lane % 4;
#pragma unroll
                        for (int j = 0; j < AWQ_NT; j++)
                                cl_send(slot + 4 * j, rope_bar, to, warps_sum<AWQ_KW>(red, j, q, lane));
                }
        bool mine = u / 4 % S == rank && i < pr;
        float va = 0.0f, vb = 0.0f;
        cl_slots_wait(rope_bar);
        if (mine)
                for (uint32_t q = 0; q < S; q++) {
                        const float *in = rope_in + (q * n + u / 4 / S) * 8 + u % 4;
                        va += in[0];
                        vb += in[4];
                }
        if (mine) {
                if (rk.bias) {
                        va += ba;
                        vb += bb;
                }
                rope_kv_store(rk, i, col, va, vb, cs, sn);
        }
}

/* The resident CTAs of the one-row NORM GEMV (a gate|up after a down that ends in the norm)
 * have QX_WIDE_KW warps, two an SM, where each warp still walks at least QX_WIDE_CHUNKS
 * chunks of a unit: 32B's gate|up (80 chunks, 10 a warp) took 36.1 us a layer against 37.5
 * in five CTAs of 4 (32B batch 1 -1.2 to -1.5%, two runs), while 7B's (56 chunks, 7 a
 * warp) was 0.5% slower and 5 or 10 warps lost at both (10 without room for x in shared
 * memory; docs/PERF.md, thirty-sixth session, run 5). The same bytes stream 4-6% faster
 * in two CTAs of 8-10 warps an SM than in five of 4 (bench-stream, run 4); a shorter run a
 * warp pays more for each unit's end (inferred, not profiled). */
#define QX_WIDE_KW     8
#define QX_WIDE_CHUNKS 10

/* XS: the CTA first copies its slice of the quantized rows into shared memory, as
 * k_gemv_awq does with FP16 x on long slices: read from L2 a chunk ahead by every warp, x
 * made 7B gate|up 5% slower than k_gemv_awq (24.9 against 23.6 us) where qkv, 14 chunks a
 * slice, was 9% faster (docs/PERF.md, fifteenth session). */
/* NORM: x is w h before the norm's factor (CuQx.ss, one row). The chunks' sums of h^2 come
 * into shared memory by cp.async after the wait, with the XS copy where there is one, zeros
 * past the chunks; at the end of its first unit every warp adds them in one fixed order (8
 * lanes a quarter each, then a butterfly, in which both lanes of a pair add the same two
 * numbers), so every CTA scales by the same factor, rsqrtf(sum * (1 / K) + eps), within a
 * few ulps of k_add_norm's. A resident CTA keeps it for its later units. Each CTA reads
 * one of the sums' copies (with one copy, 7B and 32B batch 1 were 0.3-0.5% slower), and
 * 1 / K is taken before the wait. Once a CTA in three butterfly steps, instead of every
 * unit in five and a broadcast, was 0.06-0.43% faster at 7B batch 1 and 0.02-0.20% at 32B
 * (three runs). Earlier, from each warp's own copy of the sums, it cost more: in the
 * stream once its last weights were in flight, 32B +1.2%; before the stream, +0.8%
 * (docs/PERF.md, twenty-seventh session). */
template <bool XS, bool ROPE = false, bool NORM = false, int KW = AWQ_KW>
__global__ void __launch_bounds__(KW * 32, KW == AWQ_KW ? 5 : 2) k_gemv_qx(const AwqArgs a)
{
        static_assert(!ROPE || KW == AWQ_KW, "qkv_rope_store: a thread a (register, lane)");
        __shared__ AwqRed red[ROPE ? 1 : 2][KW];
        extern __shared__ __align__(16) uint4 qx_xs[];
        __shared__ float rope_in[ROPE ? ROPE_IN_MAX * 8 : 1];
        __shared__ __align__(8) uint64_t rope_bar;
        pdl_trigger(); /* at entry (cuda_ptx.cuh) */
        if constexpr (ROPE) {
                cg::cluster_group cluster = cg::this_cluster();
                if (threadIdx.x == 0)
                        cl_slots_init(&rope_bar,
                                rope_in_bytes(cluster.block_rank(), cluster.num_blocks()));
                __cluster_barrier_arrive_relaxed();
        }
        constexpr int D = AWQ_D;
        uint32_t lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, pr = a.rows;
        uint32_t tile0 = blockIdx.x * AWQ_NT, c0, c1, w0, w1;
        awq_slice<KW>(a, &c0, &c1, &w0, &w1);
        const uint4 *qp = a.qw + awq_unit(tile0, 0, a.chunks) * 32 + lane;
        const uint2 *sp = (const uint2 *) a.sz + (size_t) tile0 * 8 + g;
        uint32_t group_recs = a.tiles * 8;
        uint4 buf[D][AWQ_NT];
        uint2 szb[D][AWQ_NT];
        auto load = [&](int i, uint32_t ch) {
                qx_load(a, qp, sp, group_recs, ch, buf[i], szb[i]);
        };
        /* B: column g is row g / 2's xh (g even) or xl; lanes past the rows read row 0, and
         * take row 0's record where their own row t is past them */
        uint32_t xrow = g / 2 < pr ? g / 2 : 0, rrow = t < pr ? t : 0, n = c1 - c0;
        const uint4 *xp = (const uint4 *) (a.qx.items + (size_t) xrow * a.qx.chunks * 32) +
                          4 * (g % 2) + t;
        const uint2 *rp = (const uint2 *) (a.qx.recs + (size_t) rrow * a.qx.chunks);
        const uint4 *sxp = qx_xs + xrow * n * 8 + 4 * (g % 2) + t;
        const uint2 *srp = (const uint2 *) (qx_xs + pr * n * 8) + rrow * n;
        uint4 xb[2];
        uint2 rb[2];
        /* x is the predecessor's output: loads after the wait, which orders them; plain
         * loads, which the CTAs of an SM share through L1, not L2-only ones: 7B batch 1
         * 0.3% faster (docs/PERF.md, thirty-first session, run 9) */
        auto load_x = [&](int i, uint32_t ch) {
                if (XS) {
                        xb[i] = sxp[(ch - c0) * 8];
                        rb[i] = srp[ch - c0];
                } else {
                        xb[i] = xp[(size_t) ch * 8];
                        rb[i] = rp[ch];
                }
        };
        awq_preload<D>(w0, w1, load);
        float rk = NORM ? 1.0f / (float) a.K : 0.0f;
        RopePrep ang = {};
        if constexpr (ROPE)
                ang = rope_prep(a, pr);
        pdl_wait();
        __shared__ __align__(16) float ss_s[NORM ? QX_SS_CHUNKS : 4];
        static_assert(QX_SS_CHUNKS == 4 * 8 * 4, "NORM: 8 lanes of 4 16-byte pieces");
        if constexpr (NORM) {
                /* cu_res_plan: whole 16-byte pieces */
                const float *ss = a.qx.ss + (blockIdx.x + blockIdx.y) % QX_SS_COPIES * QX_SS_CHUNKS;
                if (threadIdx.x < QX_SS_CHUNKS / 4)
                        cp_async16(ss_s + 4 * threadIdx.x, ss + 4 * threadIdx.x,
                                4 * threadIdx.x < a.qx.chunks);
                cp_async_commit();
        }
        if (XS) {
                /* items by rows, then records */
                for (uint32_t i = threadIdx.x; i < pr * n * 8; i += blockDim.x)
                        cp_async16(qx_xs + i,
                                (const uint4 *) (a.qx.items +
                                                 ((size_t) (i / (n * 8)) * a.qx.chunks + c0) * 32) +
                                        i % (n * 8),
                                true);
                cp_async_commit();
                uint2 *sr = (uint2 *) (qx_xs + pr * n * 8);
                for (uint32_t i = threadIdx.x; i < pr * n; i += blockDim.x)
                        sr[i] = *((const uint2 *) (a.qx.recs + (size_t) (i / n) * a.qx.chunks +
                                                       c0 + i % n));
                cp_async_wait<0>();
                __syncthreads();
        }
        float inv = NORM ? 0.0f : 1.0f;
        float f[AWQ_NT][2];
        auto compute = [&](int i, int st) {
#pragma unroll
                for (int j = 0; j < AWQ_NT; j++)
                        qx_tile(buf[i][j], szb[i][j], xb[st], __uint_as_float(rb[st].x),
                                (int) rb[st].y, f[j]);
        };
        /* Where the grid is fewer CTAs than units (gemv_awq), a CTA takes units blockIdx.x,
         * + gridDim.x, ...: the next unit's first weights load while this one's sums meet
         * and store, and the slice of x is copied once. Every warp stores a quarter of a
         * unit's outputs (at gate|up one SwiGLU a lane, where warp 0 did four), from the two
         * reds in turn, so that no barrier ends a unit: 7B batch 1 0.3% faster than with
         * warp 0 and one red (32B 0.0-0.1%; docs/PERF.md, twenty-seventh session). */
        uint32_t par = 0;
        for (uint32_t ux = blockIdx.x;;) {
#pragma unroll
                for (int j = 0; j < AWQ_NT; j++)
                        f[j][0] = f[j][1] = 0.0f;
                awq_stream<D>(w0, w1, load, load_x, compute);
                /* into awq_store's order: lane (g, t) takes rows 2t and 2t + 1, which lanes
                 * (g, 2t) and (g, 2t + 1) hold */
                float cs[AWQ_NT][1][4];
                uint32_t s0 = 4 * g + (2 * t) % 4, s1 = 4 * g + (2 * t + 1) % 4;
#pragma unroll
                for (int j = 0; j < AWQ_NT; j++) {
                        cs[j][0][0] = __shfl_sync(0xffffffffu, f[j][0], s0);
                        cs[j][0][1] = __shfl_sync(0xffffffffu, f[j][0], s1);
                        cs[j][0][2] = __shfl_sync(0xffffffffu, f[j][1], s0);
                        cs[j][0][3] = __shfl_sync(0xffffffffu, f[j][1], s1);
                }
                uint32_t next = ux + gridDim.x;
                bool more = !ROPE && next < a.tiles / AWQ_NT;
                if (more) {
                        qp = a.qw + awq_unit(next * AWQ_NT, 0, a.chunks) * 32 + lane;
                        sp = (const uint2 *) a.sz + (size_t) next * AWQ_NT * 8 + g;
                        awq_preload<D>(w0, w1, load);
                }
                if constexpr (NORM) {
                        if (inv == 0.0f) {
                                if (!XS) {
                                        cp_async_wait<0>();
                                        __syncthreads();
                                }
                                const float4 *s4 = (const float4 *) ss_s + lane % 8;
                                float4 v0 = s4[0], v1 = s4[8], v2 = s4[16], v3 = s4[24];
                                float tot = (((v0.x + v0.y) + (v0.z + v0.w)) +
                                                    ((v1.x + v1.y) + (v1.z + v1.w))) +
                                            (((v2.x + v2.y) + (v2.z + v2.w)) +
                                                    ((v3.x + v3.y) + (v3.z + v3.w)));
#pragma unroll
                                for (int o = 1; o < 8; o *= 2)
                                        tot += __shfl_xor_sync(0xffffffffu, tot, o);
                                inv = rsqrtf(tot * rk + a.qx.eps);
                        }
#pragma unroll
                        for (int j = 0; j < AWQ_NT; j++)
#pragma unroll
                                for (int q = 0; q < 4; q++)
                                        cs[j][0][q] *= inv;
                }
                if constexpr (ROPE)
                        qkv_rope_store(a, cs, pr, red[0], rope_in, &rope_bar, ang);
                else
                        awq_store<1, KW, true, true>(a, cs, tile0, 0, pr, red[par], false);
                if (!more)
                        break;
                par ^= 1;
                ux = next;
                tile0 = next * AWQ_NT;
        }
}

/* CTAs of kernel k (threads, smem dynamic bytes) that the current device holds at once, 0
 * if unknown. Asked of the runtime once per (kernel, threads, bytes, device) and kept, since
 * eager steps launch these GEMVs every layer; the backend launches from one thread. */
static uint32_t resident_ctas(const void *k, int threads, size_t smem)
{
        struct Seen {
                const void *k;
                int threads;
                size_t smem;
                int dev;
                uint32_t n;
        };
        static Seen seen[32];
        static uint32_t n_seen;
        int dev = 0, n_sm = 0, per = 0;
        if (cudaGetDevice(&dev) != cudaSuccess)
                return 0;
        for (uint32_t i = 0; i < n_seen; i++)
                if (seen[i].k == k && seen[i].threads == threads && seen[i].smem == smem &&
                        seen[i].dev == dev)
                        return seen[i].n;
        if (cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, threads, smem) !=
                        cudaSuccess)
                return 0;
        uint32_t n = (uint32_t) (per * n_sm);
        if (n_seen < sizeof(seen) / sizeof(seen[0]))
                seen[n_seen++] = Seen{k, threads, smem, dev, n};
        return n;
}

/* Dynamic shared memory kernel k may ask at launch without opting in: 48 KB less its
 * static arrays (the runtime's maxDynamicSharedSizeBytes). Asked once per (kernel, device)
 * and kept, as resident_ctas; 0 if unknown. */
static size_t dynamic_smem_max(const void *k)
{
        struct Seen {
                const void *k;
                int dev;
                size_t max;
        };
        static Seen seen[16];
        static uint32_t n_seen;
        int dev = 0;
        cudaFuncAttributes fa;
        if (cudaGetDevice(&dev) != cudaSuccess)
                return 0;
        for (uint32_t i = 0; i < n_seen; i++)
                if (seen[i].k == k && seen[i].dev == dev)
                        return seen[i].max;
        if (cudaFuncGetAttributes(&fa, k) != cudaSuccess || fa.maxDynamicSharedSizeBytes < 0)
                return 0;
        size_t max = (size_t) fa.maxDynamicSharedSizeBytes;
        if (n_seen < sizeof(seen) / sizeof(seen[0]))
                seen[n_seen++] = Seen{k, dev, max};
        return max;
}

/* Whether k_gemv_qx takes its slice of x through shared memory (XS, as kernel k): a slice
 * of 32 chunks or more, whose copy fits in what k may ask. (32B q|k|v's 40 chunks from L2
 * a chunk ahead made 32B batch 1 0.9% slower, docs/PERF.md, twenty-seventh session.) The
 * bound is the kernel's own: 48 KB less one sums' array, as it was, let through copies
 * that do not fit beside the two arrays the kernel has had since the twenty-seventh session
 * (2 rows of 128 chunks, a 70B Llama's gate|up in one slice: 34816 bytes where 32.7 KB
 * are left), and such a launch fails. */
static bool qx_takes_xs(uint32_t rows, uint32_t slice_chunks, const void *k)
{
        return slice_chunks >= 32 && qx_xs_bytes(rows, slice_chunks) <= dynamic_smem_max(k);
}

bool cu_qx_takes(const CuLinear *l, uint32_t rows, uint32_t chunks)
{
        return l->awq && l->group_size % AWQ_KC == 0 && rows >= 1 && rows <= QX_ROWS &&
               (size_t) chunks * AWQ_KC == l->in;
}

/* k_gemv_qx's launch for a grid of units (tile pairs, K slices, matrices) of rows rows,
 * slices of slice chunks, x with the norm's sums or not: the kernel, its warps, its dynamic
 * shared memory and its CTAs along x. Above a wave, as many CTAs as are resident at once,
 * which take the units in turn (7B and 32B gate|up, 1.8 and 2.6 waves: batch 1 1.6% and
 * 1.1% faster, docs/PERF.md, twenty-sixth session), of QX_WIDE_KW warps where the rule
 * above says. */
struct QxLaunch {
        const void *k;
        uint32_t warps;
        size_t smem;
        uint32_t ctas;
};

static QxLaunch qx_launch(uint32_t rows, uint32_t slice, bool norm, dim3 grid)
{
        /* [wide][norm][xs] */
        static const void *const ks[2][2][2] = {
                {{(const void *) k_gemv_qx<false>, (const void *) k_gemv_qx<true>},
                        {(const void *) k_gemv_qx<false, false, true>,
                                (const void *) k_gemv_qx<true, false, true>}},
                {{NULL, NULL},
                        {(const void *) k_gemv_qx<false, false, true, QX_WIDE_KW>,
                                (const void *) k_gemv_qx<true, false, true, QX_WIDE_KW>}}};
        bool xs = qx_takes_xs(rows, slice, ks[0][norm][1]);
        size_t smem = xs ? qx_xs_bytes(rows, slice) : 0;
        uint32_t slots = resident_ctas(ks[0][norm][xs], AWQ_KW * 32, smem);
        bool resident = grid.y == 1 && grid.z == 1 && slots && grid.x > slots;
        bool wide = resident && norm && slice >= QX_WIDE_KW * QX_WIDE_CHUNKS;
        if (wide) {
                xs = qx_takes_xs(rows, slice, ks[1][1][1]);
                smem = xs ? qx_xs_bytes(rows, slice) : 0;
                slots = resident_ctas(ks[1][1][xs], QX_WIDE_KW * 32, smem);
        }
        return QxLaunch{ks[wide][norm][xs], (uint32_t) (wide ? QX_WIDE_KW : AWQ_KW), smem,
                resident && slots && grid.x > slots ? slots : grid.x};
}

bool cu_qx_wide(const CuLinear *l, const CuQx *qx)
{
        uint32_t slice = div_up(div_up(l->in, AWQ_KC), l->splits);
        return qx->ss && cu_qx_takes(l, 1, qx->chunks) &&
               qx_launch(1, slice, true, dim3(awq_tiles(l->out) / AWQ_NT, l->splits, 1)).warps ==
                       QX_WIDE_KW;
}

/* HI: passes of 16 rows, else of 8. Returns whether the integer GEMV ran (k_gemv_qx, the
 * one that takes hq). */
static bool gemv_awq(cudaStream_t st, const CuLinear *l, uint32_t n_mat, size_t qw_units,
        size_t sz_units, const uint32_t *ids, const uint32_t *off, const uint32_t *list,
        uint32_t rows, uint32_t x_div, bool hi, const __half *x, uint32_t ldx, float *y,
        size_t slice_stride, __half *hb = NULL, const CuQx *qx = NULL, const CuQx *hq = NULL)
{
        AwqArgs a = {l->qw, l->sz, qw_units, sz_units, ids, off, list, rows, x_div, ldx, x, y,
                slice_stride, l->in, l->out, awq_tiles(l->out), div_up(l->in, AWQ_KC),
                l->splits, awq_group_magic(l), hb,
                qx ? *qx : CuQx{}, CuRopeKv{}, hq ? *hq : CuQx{}};
        dim3 grid(a.tiles / AWQ_NT, l->splits, n_mat);
        bool g64 = l->group_size % AWQ_KC == 0;
        uint32_t slice = div_up(a.chunks, a.splits);
        if (qx && !ids && !off && !list && cu_qx_takes(l, rows, qx->chunks)) {
                QxLaunch q = qx_launch(rows, slice, qx->ss != NULL, grid);
                grid.x = q.ctas;
                void *args[] = {&a};
                /* a failed launch is the step's error, as for the <<<>>> launches */
                cudaLaunchKernel(q.k, grid, dim3(q.warps * 32), args, q.smem, st);
                return true;
        }
        auto k = hi ? (g64 ? k_gemv_awq<true, true, false> : k_gemv_awq<true, false, false>)
                    : (g64 ? k_gemv_awq<false, true, false> : k_gemv_awq<false, false, false>);
        /* x through shared memory for dense passes of 1 or 2 rows, in 16-byte pieces, where
         * the slice is long enough to repay the copy (7B gate_up and down, 56 and 60 chunks:
         * 13% and 11% faster; qkv and o, 14 and 12 chunks: 4% slower) and fits in the 48 KB a
         * launch may take without opting in */
        size_t xs = (size_t) rows * awq_xs_row(slice) * 2;
        bool use_xs = !hi && !off && !list && rows <= 2 && slice >= 32 && ldx % 8 == 0 &&
                      (uintptr_t) x % 16 == 0 &&
                      xs <= 48 * 1024 - AWQ_KW * sizeof(AwqRed);
        if (use_xs)
                k = g64 ? k_gemv_awq<false, true, true> : k_gemv_awq<false, false, true>;
        k<<<grid, AWQ_KW * 32, use_xs ? xs : 0, st>>>(a);
        return false;
}

/* ---------------------------------------------------------------------------------------
 * o and down of one row ending in the residual add and the next norm's quantization
 * (cu_gemv_res), so that no add_norm launch sits between them and the integer GEMV that
 * takes their output: without those launches the dense layers of 7B and 32B were 6.5%
 * faster (a timing-only proxy, docs/PERF.md, nineteenth session).
 *
 * The norm's factor needs the whole row, which no CTA holds, but it is one scalar a row:
 * the consumer applies it (k_gemv_qx's NORM), and the producer quantizes w h, whose chunk
 * scale absorbs the factor. A chunk's scale needs its 64 columns together, so a CTA is two
 * halves of KW warps, each k_gemv_awq's work on AWQ_NT tiles: 4 tiles, one chunk. The K
 * slices run as one cluster (at most RES_MAX_SPLITS: clusters of 8-10 CTAs cost 4.8-7 us a
 * launch where 2 cost nothing measurable and 4 0.9 us, nineteenth and eighteenth
 * sessions); the other slices send their sums to the first and leave, so that their SM
 * slots go to the next kernel's CTAs. KW is 5 (two CTAs an SM, k_gemv_awq's 20 warps) where
 * the clusters fit, else 3 (three CTAs an SM); 96 registers either way.
 *
 * MOE: a MoE layer's down at one row. Slice s is the row's pair s (RES_MOE_PAIRS at most:
 * V2-Lite's 6 routed and 2 shared slices), over the whole K of its expert, whose weights
 * the routing picks: the pairs' partials and the add_norm after them become one launch.
 * The slices do not form a cluster: clusters of 8 CTAs of 10 warps, two an SM, do not all
 * fit on the H200, and at three CTAs of 6 warps an SM V2-Lite's down took 9.7 us a layer,
 * against 8.9 with no cluster at two of 10 (V2-Lite batch 1 -1.2% and -2.5% against the
 * expert GEMV and the add_norm; docs/PERF.md, thirty-fourth session, runs 2-4). Each slice
 * stores its sums, and the last of a chunk's slices to count itself in ends it, adding the
 * slices times the pairs' weights in pair order, as k_add_norm adds a MoE layer's pairs. */
#define RES_KW_MAX      5
#define RES_KW_MIN      3
#define RES_MAX_SPLITS  4
#define RES_MOE_PAIRS   8
#define RES_COLS        (2 * AWQ_NT * AWQ_TN)
static_assert(RES_COLS == AWQ_KC, "a CTA of cu_gemv_res holds one chunk of columns");

struct ResArgs {
        float *h;         /* the residual row: h += x W + bias */
        const float *bias; /* (N) or NULL */
        const float *w;   /* the next norm's weights (N) */
        CuQx qx;          /* w h quantized, and the chunks' sums of h^2 */
        const float *pair_w; /* MOE: the pairs' weights (a.ids: their experts) */
        float *part;         /* MOE: the slices' sums (chunk of columns, slice, column) */
        uint32_t *count;     /* MOE: the slices in, a chunk of columns (0 between launches) */
};

/* k_gemv_res's sums where x is hb of one row quantized by 16 k (a.qx, cu_gemv_gate_up's
 * hq): k_gemv_qx's loop, with B's column 2 s + p holding part p of k-step s alone. Lane (g,
 * t) keeps word g / 2 of the four it would take there and zeroes the others, so lane t of
 * the result holds k-step t's two sums and applies k-step t's record; the quad's four
 * k-steps add at the end. Four masks a chunk more than k_gemv_qx's rows, which need no
 * FP16 operands at all: down's CTAs are the step's most loaded (two an SM), where the FP16
 * path's 126 instructions a chunk against 90 showed (down 12.8 against 10.9 us at 7B with
 * x quantized for free, docs/PERF.md, sixteenth session). XS: the slice's items, then its
 * records, in shared memory (xs). */
template <bool XS>
__device__ __forceinline__ void qh_sums(const AwqArgs &a, uint32_t tile0, uint32_t c0,
        uint32_t c1, uint32_t w0, uint32_t w1, uint4 *xs, float (*c)[1][4])
{
        constexpr int D = AWQ_D;
        uint32_t lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, n = c1 - c0;
        const uint4 *qp = a.qw + awq_unit(tile0, 0, a.chunks) * 32 + lane;
        const uint2 *sp = (const uint2 *) a.sz + (size_t) tile0 * 8 + g;
        uint32_t group_recs = a.tiles * 8;
        uint4 buf[D][AWQ_NT];
        uint2 szb[D][AWQ_NT];
        auto load = [&](int i, uint32_t ch) {
                qx_load(a, qp, sp, group_recs, ch, buf[i], szb[i]);
        };
        const uint32_t *sxw = (const uint32_t *) xs + lane;
        const uint2 *sxr = (const uint2 *) (xs + 8 * n) + t;
        uint32_t xb[2];
        uint2 rb[2];
        auto load_x = [&](int i, uint32_t ch) {
                if (XS) {
                        xb[i] = sxw[(ch - c0) * 32];
                        rb[i] = sxr[(ch - c0) * 4];
                } else {
                        xb[i] = a.qx.items[(size_t) ch * 32 + lane];
                        rb[i] = ((const uint2 *) a.qx.recs)[(size_t) ch * 4 + t];
                }
        };
        uint32_t keep[4];
#pragma unroll
        for (uint32_t k = 0; k < 4; k++)
                keep[k] = g / 2 == k ? 0xffffffffu : 0u;
        float f[AWQ_NT][2];
#pragma unroll
        for (int j = 0; j < AWQ_NT; j++)
                f[j][0] = f[j][1] = 0.0f;
        auto compute = [&](int i, int st) {
                uint32_t w = xb[st];
                uint4 b = make_uint4(w & keep[0], w & keep[1], w & keep[2], w & keep[3]);
#pragma unroll
                for (int j = 0; j < AWQ_NT; j++)
                        qx_tile(buf[i][j], szb[i][j], b, __uint_as_float(rb[st].x), (int) rb[st].y,
                                f[j]);
        };
        awq_preload<D>(w0, w1, load);
        pdl_wait();
        if (XS) {
                for (uint32_t i = threadIdx.x; i < 8 * n; i += blockDim.x)
                        cp_async16(xs + i, (const uint4 *) (a.qx.items + (size_t) c0 * 32) + i, true);
                for (uint32_t i = threadIdx.x; i < 2 * n; i += blockDim.x)
                        cp_async16(xs + 8 * n + i, (const uint4 *) (a.qx.recs + (size_t) c0 * 4) + i,
                                true);
                cp_async_commit();
                cp_async_wait<0>();
                __syncthreads();
        }
        awq_stream<D>(w0, w1, load, load_x, compute);
        /* k-steps (0 + 1) + (2 + 3) on every lane of the quad: the same bits on each */
#pragma unroll
        for (int j = 0; j < AWQ_NT; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                        f[j][h] += __shfl_xor_sync(0xffffffffu, f[j][h], 1);
                        f[j][h] += __shfl_xor_sync(0xffffffffu, f[j][h], 2);
                }
#pragma unroll
        for (int j = 0; j < AWQ_NT; j++) {
                c[j][0][0] = f[j][0];
                c[j][0][2] = f[j][1];
                c[j][0][1] = c[j][0][3] = 0.0f;
        }
}

/* QH: x is hb quantized by 16 k (qh_sums). MOE: the pairs' down (above). */
template <bool XS, int KW, bool QH, bool MOE = false>
__global__ void __launch_bounds__(2 * KW * 32, KW == RES_KW_MAX ? 2 : 3)
        k_gemv_res(const AwqArgs a, const ResArgs r)
{
        static_assert(!(QH && MOE), "a MoE down takes FP16 x");
        __shared__ AwqRed red[2 * KW];
        __shared__ __align__(8) float part_s[MOE ? 1 : RES_MAX_SPLITS][RES_COLS];
        __shared__ __align__(16) float wb_s[2][RES_COLS]; /* the norm's weights, the bias */
        __shared__ float pw_s[MOE ? RES_MOE_PAIRS : 1];    /* MOE: the pairs' weights */
        __shared__ __align__(8) uint64_t part_bar; /* the first slice's: the slices' sums */
        extern __shared__ __align__(16) __half res_xsl[];
        /* at entry where a CTA is two to an SM (7B batch 1 -2.7%), where it is three after
         * the sums (at entry 32B was 0.3% slower): docs/PERF.md, twenty-second session */
        if (KW == RES_KW_MAX)
                pdl_trigger();
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, u = threadIdx.x;
        uint32_t half = warp / KW, wq = warp % KW, s = blockIdx.y;
        uint32_t tile0 = (2 * blockIdx.x + half) * AWQ_NT;
        uint32_t c0 = MOE ? 0 : (uint32_t) ((uint64_t) a.chunks * s / a.splits);
        uint32_t c1 = MOE ? a.chunks : (uint32_t) ((uint64_t) a.chunks * (s + 1) / a.splits);
        /* MOE: c0 as a value the compiler does not know; known to be 0, the loop of the
         * kernels without XS spilled 24 bytes (ptxas of CUDA 13) */
        if (MOE)
                asm volatile("" : "+r"(c0));
        uint32_t w0 = c0 + (c1 - c0) * wq / KW, w1 = c0 + (c1 - c0) * (wq + 1) / KW;
        /* the epilogue is the first slice's warp 0 (MOE: the last slice's, which every warp 0
         * may be), lane l columns 2 l and 2 l + 1 */
        uint32_t col = RES_COLS * blockIdx.x + 2 * lane;
        bool mine = (MOE || s == 0) && warp == 0;
        /* the slices' sums by cl_send (below); not in a cluster of one CTA, where st.async is
         * not defined (compute-sanitizer: "Cluster needs to have at least 2 blocks") */
        constexpr bool SEND = KW == RES_KW_MAX && !MOE;
        bool send = SEND && a.splits > 1;
        /* before any load, which its fence would otherwise wait for */
        if (send && s == 0 && u == 0)
                cl_slots_init(&part_bar, a.splits * RES_COLS * sizeof(float));
        /* the norm's weights and the bias are constant: into shared memory before the wait,
         * where they hold no registers through the loop (in registers, two columns a lane
         * spilled in the FP16 kernels) */
        if (mine) {
                const float *src = lane < 16 ? r.w : r.bias;
                cp_async16(&wb_s[lane / 16][4 * (lane % 16)],
                        (src ? src : r.w) + RES_COLS * blockIdx.x + 4 * (lane % 16), src != NULL);
                cp_async_commit();
        }
        /* Two CTAs an SM: the slices' sums go to the first CTA by cl_send, which waits for them
         * alone: with add_norm's sums sent likewise, 7B batch 1 1.0% and V2-Lite 1.5% faster
         * than remote stores and a cluster barrier (docs/PERF.md, thirty-first session, run 5).
         * Three CTAs an SM keep the stores and the barrier: cl_send there made 32B 0.9% slower
         * (thirty-second session, run 1; not explained). A CTA sends to another's shared memory
         * only once every CTA of the cluster has started: this arrival's wait comes long after,
         * and it need order no memory but part_bar's init (whose fence releases it). The
         * group's arrive releases: a MEMBAR.ALL.GPU that waits for the loads above before the
         * sums issue theirs. Relaxed, 32B (three CTAs an SM) was 0.2-0.5% faster and 7B (two)
         * 0.2-0.5% slower, in three runs (docs/PERF.md, twenty-third session) */
        cg::cluster_group cluster = cg::this_cluster();
        if (SEND)
                cluster.barrier_arrive();
        else if (!MOE)
                __cluster_barrier_arrive_relaxed();
        const uint4 *qw = a.qw;
        const uint2 *sz = (const uint2 *) a.sz;
        if constexpr (MOE) {
                /* the pair's expert and the pairs' weights come from the routing: no weights
                 * load before the wait, as in the expert GEMV at one row; the weights into
                 * shared memory, where they hold no registers through the loop */
                pdl_wait();
                uint32_t e = a.ids[s];
                qw += e * a.qw_units;
                sz = (const uint2 *) (a.sz + e * a.sz_units);
                if (mine) {
                        if (lane < RES_MOE_PAIRS)
                                cp_async4(&pw_s[lane], r.pair_w + lane, lane < a.splits);
                        cp_async_commit();
                }
        }
        float c[AWQ_NT][1][4];
        if constexpr (QH)
                qh_sums<XS>(a, tile0, c0, c1, w0, w1, (uint4 *) res_xsl, c);
        else /* x row s: its pair's (MOE), else row 0 */
                awq_sums<false, true, XS>(a, qw, sz, tile0, c0, c1, w0, w1, MOE ? s : 0, 1,
                        res_xsl, c);
        if (KW != RES_KW_MAX)
                pdl_trigger();
        /* the residual, which an earlier launch wrote: its load under the sums' meeting */
        float2 h = mine ? *(const float2 *) (r.h + col) : make_float2(0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < AWQ_NT; j++)
#pragma unroll
                for (int q = 0; q < 4; q++)
                        red[warp][j][q][lane] = c[j][0][q];
        __syncthreads();
        if (!MOE)
                cluster.barrier_wait();
        if (u < RES_COLS) {
                /* column u: half u / 32, its tile (u / 16) % 2, lane 4 g of register q (row 0) */
                uint32_t j = u / 16 % 2, g = u % 8, q = 2 * (u % 16 / 8);
                float v = 0.0f;
#pragma unroll
                for (int k = 0; k < KW; k++)
                        v += red[u / 32 * KW + k][j][q][4 * g];
                if (MOE)
                        r.part[((size_t) blockIdx.x * a.splits + s) * RES_COLS + u] = v;
                else if (send)
                        cl_send(&part_s[s][u], &part_bar, 0, v);
                else
                        *cluster.map_shared_rank(&part_s[s][u], 0) = v;
        }
        if constexpr (MOE) {
                /* the slice counts itself in once its sums are stored (the barrier, then the
                 * count's release); the last one in has every slice's sums (its acquire) and
                 * sets the count back for the next launch, which comes after this grid's end */
                __shared__ uint32_t before;
                __syncthreads();
                if (u == 0)
                        before = atom_add_acq_rel(r.count + blockIdx.x, 1u);
                __syncthreads();
                if (mine) /* the staged weights: no copy in flight when the CTA leaves */
                        cp_async_wait<0>();
                if (before + 1 != a.splits || !mine)
                        return;
                if (lane == 0)
                        r.count[blockIdx.x] = 0;
        } else {
                if (!send)
                        cluster.barrier_arrive();
                if (s != 0)
                        return;
                if (send)
                        cl_slots_wait(&part_bar);
                else
                        cluster.barrier_wait();
                if (!mine)
                        return;
        }
        /* the slices in order (MOE: each times its pair's weight, moe_pair_add's fma), then
         * the bias, then the residual, as k_add_norm adds; then w h quantized by the same
         * warp, from registers: warp 0 after a barrier, from shared memory, 8 lanes of 8
         * columns, took 0.7 us of each launch (docs/PERF.md, thirty-third session, run 5) */
        cp_async_wait<0>();
        __syncwarp();
        float2 y = make_float2(0.0f, 0.0f);
        for (uint32_t k = 0; k < a.splits; k++) {
                if constexpr (MOE) {
                        /* from L2: this SM's L1 may hold an earlier launch's sums */
                        uint2 p = ld_cg((const uint2 *) (r.part + ((size_t) blockIdx.x * a.splits + k) *
                                                                          RES_COLS +
                                                         2 * lane));
                        y.x = fmaf(__uint_as_float(p.x), pw_s[k], y.x);
                        y.y = fmaf(__uint_as_float(p.y), pw_s[k], y.y);
                } else {
                        float2 p = *(const float2 *) &part_s[k][2 * lane];
                        y.x += p.x;
                        y.y += p.y;
                }
        }
        float2 wn = *(const float2 *) &wb_s[0][2 * lane], bs = *(const float2 *) &wb_s[1][2 * lane];
        h.x += r.bias ? y.x + bs.x : y.x;
        h.y += r.bias ? y.y + bs.y : y.y;
        *(float2 *) (r.h + col) = h;
        qx_chunk_pairs(wn.x * h.x, wn.y * h.y, h.x * h.x + h.y * h.y, r.qx, blockIdx.x);
}

/* What x a k_gemv_res launch takes: FP16, hb quantized by 16 k (QH), or a MoE layer's
 * pairs' FP16 hb (MOE). */
enum ResX { RES_FP16, RES_QH, RES_MOE };

/* Static shared memory of k_gemv_res, beside which its slice of x must fit the 48 KB a
 * launch may take without opting in. */
static constexpr size_t res_smem(int kw, bool moe)
{
        return 2 * kw * sizeof(AwqRed) + ((moe ? 1 : RES_MAX_SPLITS) + 2) * RES_COLS * sizeof(float) +
               (moe ? RES_MOE_PAIRS + 1 : 1) * sizeof(float) + sizeof(uint64_t);
}

/* The launch of cu_gemv_res for l in S slices of halves of kw warps (its cluster attribute
 * at), and its kernel: x through shared memory where the slice is long enough (gemv_awq's
 * rule) and x allows (x NULL: planning, any x); RES_QH: x quantized by 16 k (its items and
 * records, 160 bytes a chunk, always aligned); RES_MOE: a slice is a pair, over all of K,
 * and the slices no cluster. */
static const void *res_config(const CuLinear *l, uint32_t S, uint32_t kw, const __half *x,
        ResX rx, cudaLaunchAttribute *at, cudaLaunchConfig_t *cfg)
{
        bool qh = rx == RES_QH, moe = rx == RES_MOE;
        uint32_t slice = div_up(div_up(l->in, AWQ_KC), moe ? 1 : S);
        size_t xs = qh ? (size_t) slice * (128 + 4 * sizeof(float2))
                       : (size_t) awq_xs_row(slice) * 2;
        bool use_xs = slice >= 32 && l->in % 8 == 0 && (qh || (uintptr_t) x % 16 == 0) &&
                      xs <= 48 * 1024 - res_smem(kw, moe);
        at->id = cudaLaunchAttributeClusterDimension;
        at->val.clusterDim.x = 1;
        at->val.clusterDim.y = S;
        at->val.clusterDim.z = 1;
        *cfg = cudaLaunchConfig_t{};
        cfg->gridDim = dim3(l->out / RES_COLS, S, 1);
        cfg->blockDim = dim3(2 * kw * 32);
        cfg->dynamicSmemBytes = use_xs ? xs : 0;
        cfg->attrs = at;
        cfg->numAttrs = moe ? 0 : 1;
        /* [rx][kw == RES_KW_MAX][use_xs] */
        static const void *const ks[3][2][2] = {
                {{(const void *) k_gemv_res<false, RES_KW_MIN, false>,
                         (const void *) k_gemv_res<true, RES_KW_MIN, false>},
                        {(const void *) k_gemv_res<false, RES_KW_MAX, false>,
                                (const void *) k_gemv_res<true, RES_KW_MAX, false>}},
                {{(const void *) k_gemv_res<false, RES_KW_MIN, true>,
                         (const void *) k_gemv_res<true, RES_KW_MIN, true>},
                        {(const void *) k_gemv_res<false, RES_KW_MAX, true>,
                                (const void *) k_gemv_res<true, RES_KW_MAX, true>}},
                {{(const void *) k_gemv_res<false, RES_KW_MIN, false, true>,
                         (const void *) k_gemv_res<true, RES_KW_MIN, false, true>},
                        {(const void *) k_gemv_res<false, RES_KW_MAX, false, true>,
                                (const void *) k_gemv_res<true, RES_KW_MAX, false, true>}}};
        return ks[rx][kw == RES_KW_MAX][use_xs];
}

/* Whether cu_gemv_res can take l at all: the consumer copies the chunks' sums of squares in
 * 16-byte pieces (k_gemv_qx), so the columns are whole groups of 4 chunks. */
static bool res_takes(const CuLinear *l)
{
        return l->awq && l->group_size % AWQ_KC == 0 && l->out % (4 * RES_COLS) == 0 &&
               !l->pairs && !l->rope_tph;
}

bool cu_res_set(CuLinear *l, uint32_t splits, uint32_t kw)
{
        if (!res_takes(l) || (kw != RES_KW_MAX && kw != RES_KW_MIN) || splits < 1 ||
                splits > RES_MAX_SPLITS || div_up(l->in, AWQ_KC) < splits * kw)
                return false;
        l->res_splits = splits;
        l->res_kw = kw;
        return true;
}

/* Whether every cluster of l in S slices of halves of kw warps is resident at once, with x
 * as rx says. */
static bool res_fits(const CuLinear *l, uint32_t S, uint32_t kw, ResX rx)
{
        cudaLaunchAttribute at;
        cudaLaunchConfig_t cfg;
        const void *k = res_config(l, S, kw, NULL, rx, &at, &cfg);
        int n = 0;
        return cudaOccupancyMaxActiveClusters(&n, k, &cfg) == cudaSuccess &&
               (uint32_t) n >= l->out / RES_COLS;
}

/* Slices first (the fewer, the fewer loads in flight: 7B at 2 slices was 9% slower than at
 * 4), then the wider CTAs; every cluster resident at once (a cluster's CTAs share a GPC, so
 * fewer clusters of 3 may fit than the SMs' slots / 3: 32B's 80 did not at two CTAs an SM),
 * whichever x it takes (a down's may come by 16 k, with a larger slice in shared memory),
 * each warp at least one chunk. wide: the wider CTAs wherever 2 slices of them fit, before
 * more slices of the narrower. 32B's o at 2 slices of KW 5 took 7.20 us a layer against
 * 7.50 at 4 of KW 3 (32B batch 1 -0.6 to -0.7%), while its down at 2 of KW 5 took 28.5
 * against 20.7 (+9%), and 7B's o at 2 slices instead of 4 of KW 5 was 2% slower
 * (docs/PERF.md, thirty-fifth session, runs 3-4). */
void cu_res_plan(CuLinear *l, bool wide)
{
        l->res_splits = l->res_kw = 0;
        if (!res_takes(l))
                return;
        uint32_t chunks = div_up(l->in, AWQ_KC);
        const uint32_t kws[] = {RES_KW_MAX, RES_KW_MIN};
        for (uint32_t kw : kws) {
                if (kw != RES_KW_MAX && wide && l->res_splits >= 2)
                        break;
                for (uint32_t s = l->res_splits + 1; s <= RES_MAX_SPLITS && chunks >= s * kw; s++)
                        if (res_fits(l, s, kw, RES_FP16) && res_fits(l, s, kw, RES_QH)) {
                                l->res_splits = s;
                                l->res_kw = kw;
                        }
        }
}

/* The wider CTAs, two an SM: no CTA waits for another, so none need be resident with
 * another. An expert narrower than a half's warps leaves some of them no chunk (the small
 * test models'; V2-Lite's has 22 chunks). */
bool cu_res_plan_moe(CuLinear *l, uint32_t pairs, uint32_t kw)
{
        l->res_splits = l->res_kw = 0;
        kw = kw ? kw : RES_KW_MAX;
        if (!res_takes(l) || pairs < 1 || pairs > RES_MOE_PAIRS ||
                (kw != RES_KW_MAX && kw != RES_KW_MIN))
                return false;
        l->res_splits = pairs;
        l->res_kw = kw;
        return true;
}

/* k_gemv_res's launch (MOE: rw and a.ids set, x the pairs' rows). */
static void res_launch(cudaStream_t st, const CuLinear *l, const AwqArgs &a, const ResArgs &r,
        ResX rx)
{
        cudaLaunchAttribute at;
        cudaLaunchConfig_t cfg;
        const void *k = res_config(l, l->res_splits, l->res_kw, a.x, rx, &at, &cfg);
        cfg.stream = st;
        void *args[] = {(void *) &a, (void *) &r};
        /* a failed launch is the step's error, as for the <<<>>> launches */
        cudaLaunchKernelExC(&cfg, k, args);
}

void cu_gemv_res(cudaStream_t st, const CuLinear *l, const __half *x, float *h,
        const float *w, const CuQx *qx, const CuQx *hq)
{
        AwqArgs a = {l->qw, l->sz, 0, 0, NULL, NULL, NULL, 1, 1, l->in, x, NULL, 0, l->in,
                l->out, awq_tiles(l->out), div_up(l->in, AWQ_KC), l->res_splits,
                awq_group_magic(l), NULL, hq ? *hq : CuQx{}, CuRopeKv{}, CuQx{}};
        ResArgs r = {h, l->bias, w, *qx, NULL, NULL, NULL};
        res_launch(st, l, a, r, hq ? RES_QH : RES_FP16);
}

void cu_gemv_res_moe(cudaStream_t st, const CuLinear *l, size_t qw_units, size_t sz_units,
        const uint32_t *idx, const float *pair_w, const __half *x, uint32_t ldx, float *h,
        const float *w, const CuQx *qx, float *part, uint32_t *count)
{
        AwqArgs a = {l->qw, l->sz, qw_units, sz_units, idx, NULL, NULL, 1, 1, ldx, x, NULL, 0,
                l->in, l->out, awq_tiles(l->out), div_up(l->in, AWQ_KC), l->res_splits,
                awq_group_magic(l), NULL, CuQx{}, CuRopeKv{}, CuQx{}};
        ResArgs r = {h, NULL, w, *qx, pair_w, part, count};
        res_launch(st, l, a, r, RES_MOE);
}

/* ---------------------------------------------------------------------------------------
 * An MLA layer's way out at one row: the attention's combine, W_UV and o in one launch, in
 * place of three (k_attention_combine, k_mla_values, the o GEMV).
 *
 * One cluster of C = Vd / 16 CTAs a pair of heads, a half of each CTA's warps a head. CTA
 * j combines latent dimensions [j rank / C, (j + 1) rank / C) of both heads as
 * k_attention_combine does (the same order, the same bits), and sends them in FP16 to every
 * CTA of the cluster; each then has the heads' whole latent rows. CTA j then makes value
 * dimensions [16 j, 16 j + 16) of each head as k_mla_values's block (m-tile j, head) does
 * (the same bits again), and sends those, so that each CTA has the pair's 2 Vd values, o's
 * K slice for the pair. CTA j multiplies them by o's tiles [j T / C, (j + 1) T / C) over
 * that slice, whose weights (like W_UV's) it loaded before its wait, into the pair's slice
 * of y: the H / 2 slices are added by the add_norm after it. */
#define MO_THREADS       256 /* two heads of MLA_HW warps */
#define MO_FIRST         32  /* items whose partials load with their (max, sum) */
#define MO_TPW           2   /* o tiles a warp holds at once (a CTA's share of V2-Lite's o) */
#define MLA_OUT_RANK_MAX 512
#define MLA_OUT_VD_MAX   128 /* a cluster of 8 */

struct MlaOutArgs {
        const float *acc;       /* the attention items' partials (item, head, rank) */
        const float2 *ml;       /* (item, head): their max and sum */
        const uint2 *row_items; /* row 0's first item and count */
        const uint4 *wvt;       /* W_UV in mma fragment order (cu_mla_split_kvb) */
        const uint4 *qw;        /* o */
        const uint2 *sz;
        float *y; /* H / 2 slices of N */
        uint32_t H, rank, Vd, N, tiles, chunks, group_magic;
};

template <int Q>
__global__ void __launch_bounds__(MO_THREADS) k_mla_out(const MlaOutArgs a)
{
        constexpr uint32_t HT = MO_THREADS / 2, HW = HT / 32; /* a head's threads, warps */
        __shared__ __align__(16) __half lat_s[2][MLA_OUT_RANK_MAX]; /* the heads' latent rows */
        __shared__ __align__(16) __half v_s[2 * MLA_OUT_VD_MAX];    /* their values */
        __shared__ __align__(16) __half mine_s[2][MLA_OUT_RANK_MAX / 4];
        __shared__ float w_s[2][HT], l_s[2][HT], red_m[2][HW];
        __shared__ float4 red[2][HW - 1][32];
        __shared__ __align__(8) uint64_t lat_bar, v_bar;
        uint32_t j = blockIdx.x, C = gridDim.x, t = threadIdx.x, hp = t / HT, ht = t % HT;
        uint32_t h = 2 * blockIdx.y + hp, warp = ht / 32, lane = t % 32;
        uint32_t g = lane / 4, tq = lane % 4;
        uint32_t dims = a.rank / C, KS = a.rank / 16, KW = KS / HW, ks0 = warp * KW;

        /* before any load, which the init's fence would wait for */
        if (t == 0) {
                cl_slots_init(&lat_bar, 2 * a.rank * 2);
                cl_slots_init(&v_bar, 2 * a.Vd * 2);
        }
        __cluster_barrier_arrive_relaxed();

        /* the constants: W_UV's m-tile j of head h (k_mla_values's warp split), o's first
         * tiles over the pair's chunks, and the row's items */
        uint4 wa[8];
        const uint4 *wp = a.wvt + (((size_t) h * C + j) * KS + ks0) * 32 + lane;
#pragma unroll
        for (uint32_t ks = 0; ks < 8; ks++)
                if (ks < KW)
                        wa[ks] = __ldg(wp + ks * 32);
        uint32_t TC = a.tiles / C, CH = 2 * a.Vd / AWQ_KC, ch0 = blockIdx.y * CH;
        uint32_t ow = t / 32, OW = MO_THREADS / 32;
        uint4 oq[MO_TPW][4];
        uint2 orec[MO_TPW][4][Q];
        auto load_o = [&](uint32_t i0) {
#pragma unroll
                for (uint32_t i = 0; i < MO_TPW; i++) {
                        uint32_t k = ow + OW * (i0 + i), tile = j * TC + k;
                        if (k >= TC)
                                break;
#pragma unroll
                        for (uint32_t c = 0; c < 4; c++) {
                                if (c >= CH)
                                        break;
                                uint32_t ch = ch0 + c;
                                oq[i][c] = ld_stream(a.qw + awq_unit(tile, ch, a.chunks) * 32 +
                                                     lane);
#pragma unroll
                                for (int q = 0; q < Q; q++) {
                                        uint32_t grp = __umulhi(2 * (2 * ch + q), a.group_magic);
                                        orec[i][c][q] = ld_stream(
                                                a.sz + ((size_t) grp * a.tiles + tile) * 8 + g);
                                }
                        }
                }
        };
        load_o(0);
        uint2 ri = a.row_items[0];
        pdl_wait();
        pdl_trigger();

        /* the combine of head h's dimension j dims + ht (k_attention_combine's
         * arithmetic), the first items' partials loading with their (max, sum) */
        size_t stride = (size_t) a.H * a.rank;
        const float2 *mlh = a.ml + (size_t) ri.x * a.H + h;
        const float *ap = a.acc + ((size_t) ri.x * a.H + h) * a.rank + j * dims + ht;
        bool mine = ht < dims;
        float v0[MO_FIRST];
#pragma unroll
        for (uint32_t k = 0; k < MO_FIRST; k++)
                v0[k] = mine && k < ri.y ? ap[(size_t) k * stride] : 0.0f;
        float2 e0 = ht < ri.y ? mlh[(size_t) ht * a.H] : make_float2(-FLT_MAX, 0.0f);
        float m = e0.x;
        for (uint32_t i = ht + HT; i < ri.y; i += HT)
                m = fmaxf(m, mlh[(size_t) i * a.H].x);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        if (lane == 0)
                red_m[hp][warp] = m;
        __syncthreads();
        for (uint32_t w = 0; w < HW; w++)
                m = fmaxf(m, red_m[hp][w]);
        float acc = 0.0f, l = 0.0f;
        for (uint32_t c0 = 0; c0 < ri.y; c0 += HT) {
                uint32_t nc = min(HT, ri.y - c0);
                __syncthreads(); /* the previous chunk's readers are done */
                if (ht < nc) {
                        float2 e = c0 == 0 ? e0 : mlh[(size_t) (c0 + ht) * a.H];
                        w_s[hp][ht] = expf(e.x - m);
                        l_s[hp][ht] = w_s[hp][ht] * e.y;
                }
                __syncthreads();
                for (uint32_t i = 0; i < nc; i++)
                        l += l_s[hp][i];
                if (!mine)
                        continue;
                uint32_t i = 0;
                if (c0 == 0) {
#pragma unroll
                        for (uint32_t k = 0; k < MO_FIRST; k++)
                                if (k < nc)
                                        acc += w_s[hp][k] * v0[k];
                        i = MO_FIRST;
                }
                for (; i < nc; i += 16) {
                        float v[16];
#pragma unroll
                        for (uint32_t k = 0; k < 16; k++)
                                v[k] = i + k < nc ? ap[(size_t) (c0 + i + k) * stride] : 0.0f;
#pragma unroll
                        for (uint32_t k = 0; k < 16; k++)
                                if (i + k < nc)
                                        acc += w_s[hp][i + k] * v[k];
                }
        }
        if (mine)
                mine_s[hp][ht] = __float2half(acc / l);
        __syncthreads();
        /* the pieces to every CTA of the cluster, once all have started (the entry's
         * arrival) */
        __cluster_barrier_wait();
        uint32_t pieces = dims / 8;
        if (t < 2 * pieces * C) {
                uint32_t p = t % pieces, hh = t / pieces % 2;
                cl_send4((float4 *) (&lat_s[hh][j * dims + 8 * p]), &lat_bar, t / (2 * pieces),
                        *(const float4 *) (&mine_s[hh][8 * p]));
        }
        cl_slots_wait(&lat_bar);

        /* head h's value dimensions 16 j .. 16 j + 16 (k_mla_values's arithmetic, row 0 of
         * the mma's n; the other rows are zero) */
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const __half *bp = lat_s[hp] + 16 * ks0 + 2 * tq;
#pragma unroll
        for (uint32_t ks = 0; ks < 8; ks++) {
                if (ks >= KW)
                        break;
                uint32_t r[4] = {wa[ks].x, wa[ks].y, wa[ks].z, wa[ks].w};
                uint32_t b0 = g == 0 ? *(const uint32_t *) (bp + 16 * ks) : 0u;
                uint32_t b1 = g == 0 ? *(const uint32_t *) (bp + 16 * ks + 8) : 0u;
                mma16816(c, r, b0, b1);
        }
        if (warp > 0)
                red[hp][warp - 1][lane] = make_float4(c[0], c[1], c[2], c[3]);
        __syncthreads();
        if (warp == 0) {
                for (uint32_t w = 1; w < HW; w++) {
                        float4 o = red[hp][w - 1][lane];
                        c[0] += o.x;
                        c[1] += o.y;
                        c[2] += o.z;
                        c[3] += o.w;
                }
                if (tq == 0) {
                        mine_s[hp][g] = __float2half(c[0]);
                        mine_s[hp][g + 8] = __float2half(c[2]);
                }
                __syncwarp();
                if (lane < 2 * C)
                        cl_send4((float4 *) (v_s + hp * a.Vd + 16 * j + 8 * (lane % 2)), &v_bar,
                                lane / 2, *(const float4 *) (&mine_s[hp][8 * (lane % 2)]));
        }
        cl_slots_wait(&v_bar);

        /* o's tiles over the pair's K: x fragments of row 0 (the mma's other rows zero) */
        uint2 xq[4][1][4];
#pragma unroll
        for (uint32_t cc = 0; cc < 4; cc++)
#pragma unroll
                for (uint32_t s = 0; s < 4; s++)
                        xq[cc][0][s] = g == 0 && cc < CH
                                               ? *(const uint2 *) (v_s + 64 * cc + 16 * s + 4 * tq)
                                               : make_uint2(0, 0);
        float *y = a.y + (size_t) blockIdx.y * a.N;
        for (uint32_t i0 = 0; ow + OW * i0 < TC; i0 += MO_TPW) {
                if (i0 > 0)
                        load_o(i0);
#pragma unroll
                for (uint32_t i = 0; i < MO_TPW; i++) {
                        uint32_t k = ow + OW * (i0 + i), tile = j * TC + k;
                        if (k >= TC)
                                break;
                        float o[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
                        for (uint32_t cc = 0; cc < 4; cc++)
                                if (cc < CH)
                                        awq_tile<1, Q>(oq[i][cc], orec[i][cc], xq[cc], o);
                        uint32_t col = tile * AWQ_TN + g;
                        if (tq == 0 && col < a.N)
                                y[col] = o[0][0];
                        if (tq == 0 && col + 8 < a.N)
                                y[col + 8] = o[0][2];
                }
        }
}

bool cu_mla_out_takes(const CuLinear *o, uint32_t H, uint32_t rank, uint32_t Vd)
{
        uint32_t C = Vd / 16, tiles = awq_tiles(o->out);
        return o->awq && H % 2 == 0 && o->in == H * Vd && Vd % AWQ_KC == 0 &&
               Vd <= MLA_OUT_VD_MAX && rank % 64 == 0 && rank <= MLA_OUT_RANK_MAX &&
               rank / C <= MLA_OUT_RANK_MAX / 4 && rank / C % 8 == 0 && tiles % C == 0 &&
               o->group_size % 32 == 0;
}

void cu_mla_out(cudaStream_t st, const CuLinear *o, const float *acc, const float2 *ml,
        CuMeta meta, const __half *wvt, uint32_t H, uint32_t rank, uint32_t Vd, float *y)
{
        MlaOutArgs a = {acc, ml, meta.row_items, (const uint4 *) wvt, o->qw,
                (const uint2 *) o->sz, y, H, rank, Vd, o->out, awq_tiles(o->out),
                div_up(o->in, AWQ_KC), awq_group_magic(o)};
        cudaLaunchAttribute at;
        at.id = cudaLaunchAttributeClusterDimension;
        at.val.clusterDim.x = Vd / 16;
        at.val.clusterDim.y = 1;
        at.val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(Vd / 16, H / 2, 1);
        cfg.blockDim = dim3(MO_THREADS);
        cfg.stream = st;
        cfg.attrs = &at;
        cfg.numAttrs = 1;
        if (o->group_size % 64 == 0)
                cudaLaunchKernelEx(&cfg, k_mla_out<1>, a);
        else
                cudaLaunchKernelEx(&cfg, k_mla_out<2>, a);
}

/* ---------------------------------------------------------------------------------------
 * The expert GEMV: k_gemv_awq's work split (AWQ_NT tiles and one K slice a CTA, the
 * slice's chunks split between its warps, passes of up to 8 rows of one MoE slot), with
 * each warp's loads staged in shared memory by cp.async: a chunk's weights, scale records
 * and x rows arrive AWQ_ES - 1 chunks ahead of their use, and hold no registers. Here the
 * rows of a pass are gathered from the list, and the registers that k_gemv_awq's load
 * stages take cap it at fewer loads in flight: V2-Lite's expert GEMVs at 8 and 16 tokens
 * took 12-21% less time staged (bench-gemv, PERF.md, fourth session), where the dense 7B
 * shapes at one row did not gain. */

/* Stages per warp: 3, with 24 warps an SM (12 CTAs of AWQ_EKW), not 4 stages and 16 warps:
 * more warps with fewer chunks each in flight took 2-3% off V2-Lite batch 1 and 8 and 1%
 * off batch 64; 32 warps of 2 stages, or 20 of 4, did no better (docs/PERF.md, sixth
 * session). */
#define AWQ_ES     3
#define AWQ_ES_CTA 12
/* Warps of an expert GEMV CTA, splitting its chunks (where the grid is small, see
 * AWQ_EKW_FEW): 2, not AWQ_KW, so that each warp walks twice the chunks per pass, and its
 * fixed cost (row gathering, first loads, the sums meeting in shared memory) weighs half as
 * much: at V2-Lite's 32 and 22 chunks a matrix, a pass was 8 or 5.5 chunks of 182
 * instructions a warp plus about 600 more (SASS, sixth session). */
#define AWQ_EKW 2
#define AWQ_XS 80 /* halves per x row of a stage: 64 and 16 of padding, so that the B loads
                   * of a half warp hit 32 distinct banks */

/* Bytes of one stage: weights, scale records (two per tile and chunk unless the group size
 * is a multiple of the chunk), 8 rows of x. A CTA's stages stay under the 48 KB a launch
 * may take without opting in. */
__host__ __device__ constexpr uint32_t awq_stage_bytes(bool g64)
{
        return AWQ_NT * 512 + (g64 ? 1 : 2) * AWQ_NT * 64 + 8 * AWQ_XS * 2;
}
/* Steps of few pairs leave the expert GEMV's CTAs few to an SM (V2-Lite batch 1: 8 slots,
 * 704 gate|up CTAs, 5 an SM): where a grid of CTAs of AWQ_EKW_FEW warps is still one wave,
 * those split the slice's chunks four ways, so that twice the warps and loads are in
 * flight (V2-Lite batch 1 2% faster; docs/PERF.md, eleventh session). The K split differs,
 * so the sums' order does: a batch-size class boundary. */
#define AWQ_EKW_FEW 4
static_assert(AWQ_EKW_FEW * AWQ_ES * awq_stage_bytes(false) <= 48 * 1024,
        "the expert GEMV's stages need no opt-in");
/* A pass's sums meet in its warps' stages, not in shared memory of their own: shared
 * memory is what limits the CTAs an SM holds (4-warp CTAs: 6 instead of 5, so that V2-Lite
 * batch 1 is one wave; 2-warp CTAs: V2-Lite batch 64 0.6% faster). */
static_assert(AWQ_ES * awq_stage_bytes(true) >= sizeof(AwqRed), "a warp's sums fit its stages");

/* One pass of up to 8 rows of an expert. early (the EARLY order's first pass): the kernel
 * has not waited yet; the pass reads its rows from L2 and loads its first chunks' weights
 * before the wait, their x after it. */
template <bool G64, int KW>
__device__ __forceinline__ void awq_pass_staged(const AwqArgs &a, const uint4 *qw,
        const uint2 *sz, uint32_t tile0, uint32_t w0, uint32_t w1, uint32_t p0, uint32_t pr,
        char *stages0, char *stages, bool more, bool early = false)
{
        constexpr int Q = G64 ? 1 : 2, S = AWQ_ES;
        constexpr uint32_t WB = AWQ_NT * 512, SB = Q * AWQ_NT * 64, SBYTES = awq_stage_bytes(G64);
        uint32_t lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

        /* x pieces (16 bytes: row p / 8, halves 8 (p % 8) ..) p = lane, lane + 32 of a
         * chunk; rows past the pass's are not copied, as no lane reads them: lanes past
         * the pass's rows read its first row (their columns of the mma's result are never
         * written, and no other column depends on them) */
        const __half *xs[2];
#pragma unroll
        for (int m = 0; m < 2; m++) {
                uint32_t p = lane + 32 * m, row = p / 8;
                uint32_t pair = row >= pr || a.rows == 1 ? 0
                                : early ? ld_cg(a.list + p0 + row)
                                        : a.list[p0 + row];
                xs[m] = row < pr ? a.x + (size_t) (pair / a.x_div) * a.ldx +
                                           8 * (p % 8)
                                 : NULL;
        }
        uint32_t xrow = g < pr ? g : 0;

        const uint4 *qp = qw + awq_unit(tile0, 0, a.chunks) * 32 + lane;
        /* scale record lane l < Q * AWQ_NT * 8: half chunk q = l / 16 (G64: 0), tile j, g */
        const uint32_t sq = lane / (AWQ_NT * 8), sj = (lane / 8) % AWQ_NT, sg = lane % 8;
        const uint2 *sp = sz + (size_t) (tile0 + sj) * 8 + sg;
        uint32_t group_recs = a.tiles * 8;

        auto load = [&](uint32_t ch, bool w, bool x) {
                char *st = stages + (ch % S) * SBYTES;
                const uint4 *qc = qp + (size_t) ch * (AWQ_NT * 32);
#pragma unroll
                for (int j = 0; j < AWQ_NT; j++)
                        if (w)
                                cp_async16((uint4 *) st + 32 * j + lane, qc + 32 * j, true);
                if (w && lane < Q * AWQ_NT * 8) {
                        uint32_t hc = 2 * ch + sq, grp = __umulhi(2 * hc, a.group_magic);
                        bool in = G64 || 32 * hc < a.K;
                        cp_async8((uint2 *) (st + WB) + lane,
                                in ? sp + (size_t) grp * group_recs : sp, in);
                }
#pragma unroll
                for (int m = 0; m < 2 && x; m++) {
                        uint32_t p = lane + 32 * m;
                        if (xs[m]) {
                                bool in = G64 || ch * AWQ_KC + 8 * (p % 8) < a.K;
                                cp_async16((__half *) (st + WB + SB) + (p / 8) * AWQ_XS +
                                                8 * (p % 8),
                                        in ? xs[m] + (size_t) ch * AWQ_KC : xs[m], in);
                        }
                }
        };

        float c[AWQ_NT][1][4];
#pragma unroll
        for (int j = 0; j < AWQ_NT; j++)
                c[j][0][0] = c[j][0][1] = c[j][0][2] = c[j][0][3] = 0.0f;

        /* one commit group per chunk, empty ones included, so that the groups in flight
         * stay S - 2 behind the chunk being computed */
#pragma unroll
        for (int i = 0; i < S - 1; i++) {
                if (w0 + i < w1)
                        load(w0 + i, true, !early);
                cp_async_commit();
        }
        if (early) {
                /* the first chunks' weights and scales went before the wait, their x goes
                 * after it in S - 1 more groups: chunk w0's wait below finds both done */
                pdl_wait();
#pragma unroll
                for (int i = 0; i < S - 1; i++) {
                        if (w0 + i < w1)
                                load(w0 + i, false, true);
                        cp_async_commit();
                }
        }
        for (uint32_t ch = w0; ch < w1; ch++) {
                cp_async_wait<S - 2>();
                __syncwarp();
                /* into the stage of chunk ch - 1, free since every lane passed the barrier */
                if (ch + S - 1 < w1)
                        load(ch + S - 1, true, true);
                cp_async_commit();
                const char *st = stages + (ch % S) * SBYTES;
                const __half *xc = (const __half *) (st + WB + SB) + xrow * AWQ_XS + 4 * t;
                uint2 xq[1][4];
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                        xq[0][kk] = *(const uint2 *) (xc + 16 * kk);
#pragma unroll
                for (int j = 0; j < AWQ_NT; j++) {
                        uint2 r[Q];
#pragma unroll
                        for (int q = 0; q < Q; q++)
                                r[q] = ((const uint2 *) (st + WB))[q * AWQ_NT * 8 + j * 8 + g];
                        awq_tile<1, Q>(((const uint4 *) st)[32 * j + lane], r, xq, c[j]);
                }
        }
        cp_async_wait<0>();
        pdl_trigger();
        __syncthreads(); /* every warp is done with its stages: red takes their space */
        /* red aliases the stages, which a next pass's loads overwrite */
        awq_store<1, KW, true>(a, c, tile0, p0, pr, (AwqRed *) stages0, more);
}

/* ORDER (CuExpertsOrder): LEAD lets the next launch's blocks start once every block is
 * past its wait, not after its main loop; EARLY: the routing was done before this grid's
 * blocks could start (its predecessor, the LEAD expert GEMV of the same pairs, let them
 * start only once past its own wait), so the experts and their rows are read, and the
 * first chunks' weights loaded, before the wait. */
template <bool G64, int KW, int ORDER = EXPERTS_PLAIN>
__global__ void __launch_bounds__(KW * 32, AWQ_ES_CTA * AWQ_EKW / KW)
        k_gemv_experts(const AwqArgs a)
{
        constexpr bool EARLY = ORDER == EXPERTS_EARLY;
        extern __shared__ __align__(16) char awq_stages[];
        if (!EARLY)
                pdl_wait(); /* the experts and their rows come from the routing */
        if (ORDER == EXPERTS_LEAD)
                pdl_trigger();
        /* before the wait (EARLY), from L2: this SM's L1 may hold an earlier step's */
        uint32_t z = blockIdx.z, e = !a.ids ? z : EARLY ? ld_cg(a.ids + z) : a.ids[z];
        uint32_t r0 = EARLY ? ld_cg(a.off + z) : a.off[z];
        uint32_t r1 = EARLY ? ld_cg(a.off + z + 1) : a.off[z + 1];
        uint32_t tile0 = blockIdx.x * AWQ_NT, c0, c1, w0, w1;
        awq_slice<KW>(a, &c0, &c1, &w0, &w1);
        const uint4 *qw = a.qw + e * a.qw_units;
        const uint2 *sz = (const uint2 *) (a.sz + e * a.sz_units);
        char *stages = awq_stages + threadIdx.x / 32 * AWQ_ES * awq_stage_bytes(G64);
        if (EARLY && r0 == r1)
                pdl_wait();
        for (uint32_t p0 = r0; p0 < r1; p0 += 8)
                awq_pass_staged<G64, KW>(a, qw, sz, tile0, w0, w1, p0, min(8u, r1 - p0),
                        awq_stages, stages, p0 + 8 < r1, EARLY && p0 == r0);
}

bool cu_gemv_experts(cudaStream_t st, const CuLinear *l, uint32_t n_slots, size_t qw_units,
        size_t sz_units, const uint32_t *ids, const uint32_t *off, const uint32_t *list,
        uint32_t x_div, uint32_t x_rows, const __half *x, uint32_t ldx, float *y,
        size_t slice_stride, __half *hb, CuExpertsOrder order)
{
        if (ldx % 8 != 0 || (uintptr_t) x % 16 != 0) { /* x goes in 16-byte pieces */
                gemv_awq(st, l, n_slots, qw_units, sz_units, ids, off, list, 0, x_div, false,
                        x, ldx, y, slice_stride, hb);
                return false;
        }
        /* rows 1: one row of x, which every pair reads (no list read for its address) */
        AwqArgs a = {l->qw, l->sz, qw_units, sz_units, ids, off, list, x_rows == 1 ? 1u : 0u,
                x_div, ldx, x, y, slice_stride, l->in, l->out, awq_tiles(l->out),
                div_up(l->in, AWQ_KC), l->splits, awq_group_magic(l), hb, CuQx{}, CuRopeKv{},
                CuQx{}};
        dim3 grid(a.tiles / AWQ_NT, l->splits, n_slots);
        bool g64 = l->group_size % AWQ_KC == 0;
        /* [g64][few][order] */
        static const void *const ks[2][2][3] = {
                {{(const void *) k_gemv_experts<false, AWQ_EKW, EXPERTS_PLAIN>,
                         (const void *) k_gemv_experts<false, AWQ_EKW, EXPERTS_LEAD>,
                         (const void *) k_gemv_experts<false, AWQ_EKW, EXPERTS_EARLY>},
                        {(const void *) k_gemv_experts<false, AWQ_EKW_FEW, EXPERTS_PLAIN>,
                                (const void *) k_gemv_experts<false, AWQ_EKW_FEW, EXPERTS_LEAD>,
                                (const void *) k_gemv_experts<false, AWQ_EKW_FEW, EXPERTS_EARLY>}},
                {{(const void *) k_gemv_experts<true, AWQ_EKW, EXPERTS_PLAIN>,
                         (const void *) k_gemv_experts<true, AWQ_EKW, EXPERTS_LEAD>,
                         (const void *) k_gemv_experts<true, AWQ_EKW, EXPERTS_EARLY>},
                        {(const void *) k_gemv_experts<true, AWQ_EKW_FEW, EXPERTS_PLAIN>,
                                (const void *) k_gemv_experts<true, AWQ_EKW_FEW, EXPERTS_LEAD>,
                                (const void *) k_gemv_experts<true, AWQ_EKW_FEW, EXPERTS_EARLY>}}};
        uint32_t wave = resident_ctas(ks[g64][1][EXPERTS_PLAIN], AWQ_EKW_FEW * 32,
                AWQ_EKW_FEW * AWQ_ES * awq_stage_bytes(g64));
        bool few = (size_t) grid.x * grid.y * grid.z <= wave &&
                   a.chunks / l->splits >= AWQ_EKW_FEW;
        uint32_t warps = few ? AWQ_EKW_FEW : AWQ_EKW;
        void *args[] = {&a};
        /* a failed launch is the step's error, as for the <<<>>> launches */
        cudaLaunchKernel(ks[g64][few][order], grid, dim3(warps * 32), args,
                warps * AWQ_ES * awq_stage_bytes(g64), st);
        return true;
}

/* ---------------------------------------------------------------------------------------
 * Grouped INT4 x FP16 GEMM for MoE steps whose experts get many rows.
 *
 * k_gemv_awq re-reads an expert's weights for every pass of 8 rows. Here a CTA takes one
 * block of up to MG_ROWS rows of one expert and MG_WARPS * AWQ_NT tiles, and walks all of
 * K once: an expert's weights are read once per block, so once per step up to MG_ROWS rows
 * (the blocks of an expert are neighbours in the grid, so its further blocks mostly find
 * the weights in L2). The weights are the mma A operand as in k_gemv_awq (same layout,
 * dequantization and per-group scaling); the block's rows are the B operand in tiles of
 * 8, walked while a chunk's A registers stay live. The warps split the tiles, not K: a
 * warp owns its columns over all of K (no reduction between warps), and the x chunk of
 * the block's rows, the same for all of them, comes through shared memory (cp.async,
 * MG_XST stages, MG_XST - 1 chunks ahead, further than the weights: 2 ahead cost 9% at
 * V2-Lite batch 64). Blocks go slot after slot from the last, MG_ROWS rows at a time, so
 * the shared experts' slices (every row's, the slowest blocks) start first instead of
 * forming the grid's tail; every warp finds its CTA's block from off alone, so the grid
 * is sized for the worst case and spare CTAs leave at once. A row's result depends only
 * on its own x row (the mma's columns are independent, and every row tile does the same
 * arithmetic), not on the other rows of its expert or their number. Needs group size and
 * K multiples of the chunk and a row stride of x a multiple of 8 (cu_gemm_experts falls
 * back else). */

#define MG_WARPS 4
#define MG_H     4 /* row tiles of 8 */
#define MG_ROWS  (8 * MG_H)
#define MG_D     4 /* chunks of weights in flight per warp */
#define MG_XST   6 /* x stages: x is MG_XST - 1 chunks ahead, further than the weights */
#define MG_XS    80 /* halves per row of an x stage: 64 and 16 of padding, so that the B
                     * loads of a half warp hit 32 distinct banks */

struct MoeGemmArgs {
        const uint4 *qw;
        const __half2 *sz;
        size_t qw_units, sz_units; /* per expert */
        const uint32_t *ids, *off, *list;
        uint32_t n_slots, x_div, ldx;
        const __half *x;
        float *y;
        uint32_t N, tiles, chunks, chunks_per_group;
};

__global__ void __launch_bounds__(MG_WARPS * 32, 4) k_moe_gemm(const MoeGemmArgs a)
{
        pdl_wait();
        __shared__ __align__(16) __half xs[MG_XST][MG_ROWS][MG_XS];
        const uint32_t full = 0xffffffffu;
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

        /* the CTA's block: slot, first row p0 of the list, pr rows */
        uint32_t z = blockIdx.y, before = 0, slot = UINT32_MAX, p0 = 0, pr = 0;
        for (uint32_t s0 = 0; s0 < a.n_slots && slot == UINT32_MAX; s0 += 32) {
                uint32_t q = s0 + lane, s = a.n_slots - 1 - q, r0 = 0, r1 = 0;
                if (q < a.n_slots) {
                        r0 = a.off[s];
                        r1 = a.off[s + 1];
                }
                uint32_t nb = (r1 - r0 + MG_ROWS - 1) / MG_ROWS, inc = nb;
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                        uint32_t v = __shfl_up_sync(full, inc, o);
                        if (lane >= (uint32_t) o)
                                inc += v;
                }
                uint32_t first = before + inc - nb;
                uint32_t hit = __ballot_sync(full, z >= first && z < first + nb);
                if (hit) {
                        uint32_t src = __ffs(hit) - 1;
                        slot = __shfl_sync(full, s, src);
                        p0 = __shfl_sync(full, r0 + (z - first) * MG_ROWS, src);
                        pr = min((uint32_t) MG_ROWS, __shfl_sync(full, r1, src) - p0);
                }
                before += __shfl_sync(full, inc, 31);
        }
        if (slot == UINT32_MAX)
                return;

        uint32_t e = a.ids ? a.ids[slot] : slot, nh = (pr + 7) / 8;
        const uint4 *qw = a.qw + e * a.qw_units;
        const uint2 *sz = (const uint2 *) (a.sz + e * a.sz_units);
        uint32_t tile0 = (blockIdx.x * MG_WARPS + warp) * AWQ_NT;
        bool live = tile0 < a.tiles; /* else the warp only helps to copy x */

        /* x: thread i copies the 16-byte pieces i + MG_WARPS * 32 * j of each chunk (row
         * piece / 8, halves 8 (piece % 8) ..); rows past pr are zero */
        constexpr int XP = MG_ROWS * 8 / (MG_WARPS * 32);
        const __half *xp[XP];
#pragma unroll
        for (int j = 0; j < XP; j++) {
                uint32_t piece = threadIdx.x + MG_WARPS * 32 * j, row = piece / 8;
                xp[j] = row < pr ? a.x + (size_t) (a.list[p0 + row] / a.x_div) * a.ldx +
                                           8 * (piece % 8)
                                 : NULL;
        }
        auto load_x = [&](uint32_t ch) {
#pragma unroll
                for (int j = 0; j < XP; j++) {
                        uint32_t piece = threadIdx.x + MG_WARPS * 32 * j;
                        cp_async16(&xs[ch % MG_XST][piece / 8][8 * (piece % 8)],
                                xp[j] ? xp[j] + (size_t) ch * AWQ_KC : a.x, xp[j] != NULL);
                }
                cp_async_commit();
        };

        const uint4 *qp = qw + awq_unit(live ? tile0 : 0, 0, a.chunks) * 32 + lane;
        const uint2 *sp = sz + (size_t) (live ? tile0 : 0) * 8 + g;
        uint32_t group_recs = a.tiles * 8;
        uint4 buf[MG_D][AWQ_NT];
        uint2 szb[MG_D][AWQ_NT];
        float c[AWQ_NT][MG_H][4];
#pragma unroll
        for (int j = 0; j < AWQ_NT; j++)
#pragma unroll
                for (int h = 0; h < MG_H; h++)
                        c[j][h][0] = c[j][h][1] = c[j][h][2] = c[j][h][3] = 0.0f;

        auto load = [&](int i, uint32_t ch) {
                const uint4 *qc = qp + (size_t) ch * (AWQ_NT * 32);
                const uint2 *sc = sp + (size_t) (ch / a.chunks_per_group) * group_recs;
#pragma unroll
                for (int j = 0; j < AWQ_NT; j++) {
                        buf[i][j] = ld_stream(qc + 32 * j);
                        szb[i][j] = ld_stream(sc + 8 * j);
                }
        };
        /* c[j][h]: columns g, g, g + 8, g + 8 of tile tile0 + j; rows 8h + 2t, 8h + 2t + 1 */
        auto compute = [&](int i, const __half (*xc)[MG_XS]) {
#pragma unroll
                for (int j = 0; j < AWQ_NT; j++) {
                        const uint4 v = buf[i][j];
                        const uint2 r = szb[i][j];
                        __half2 zlo = __low2half2(u32_as_h2(r.y));
                        __half2 zhi = __high2half2(u32_as_h2(r.y));
                        float2 s = __half22float2(u32_as_h2(r.x));
                        uint32_t A[4][4];
                        awq_a(v.x, zlo, zhi, A[0]);
                        awq_a(v.y, zlo, zhi, A[1]);
                        awq_a(v.z, zlo, zhi, A[2]);
                        awq_a(v.w, zlo, zhi, A[3]);
#pragma unroll
                        for (int h = 0; h < MG_H; h++) {
                                if ((uint32_t) h >= nh)
                                        break;
                                const __half *xr = xc[8 * h + g] + 4 * t;
                                float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                                for (int kk = 0; kk < 4; kk++)
                                        mma16816(tmp, A[kk], *(const uint2 *) (xr + 16 * kk));
                                c[j][h][0] += s.x * tmp[0];
                                c[j][h][1] += s.x * tmp[1];
                                c[j][h][2] += s.y * tmp[2];
                                c[j][h][3] += s.y * tmp[3];
                        }
                }
        };

        if (live)
#pragma unroll
                for (int i = 0; i < MG_D; i++)
                        if ((uint32_t) i < a.chunks)
                                load(i, i);
#pragma unroll
        for (int i = 0; i < MG_XST - 1; i++) {
                if ((uint32_t) i < a.chunks)
                        load_x(i);
                else
                        cp_async_commit();
        }
        /* Chunk ch's copy is the oldest group but MG_XST - 2 at its turn; the barrier also
         * tells that every warp is done with chunk ch - 1, whose stage the copy of chunk
         * ch + MG_XST - 1 then takes. */
        for (uint32_t base = 0; base < a.chunks; base += MG_D) {
#pragma unroll
                for (int i = 0; i < MG_D; i++) {
                        uint32_t ch = base + i;
                        if (ch >= a.chunks)
                                break;
                        cp_async_wait<MG_XST - 2>();
                        __syncthreads();
                        if (ch + MG_XST - 1 < a.chunks)
                                load_x(ch + MG_XST - 1);
                        else
                                cp_async_commit();
                        if (live) {
                                compute(i, xs[ch % MG_XST]);
                                if (ch + MG_D < a.chunks)
                                        load(i, ch + MG_D);
                        }
                }
        }
        if (!live)
                return;
#pragma unroll
        for (int j = 0; j < AWQ_NT; j++)
#pragma unroll
                for (int h = 0; h < MG_H; h++) {
                        if ((uint32_t) h >= nh)
                                break;
#pragma unroll
                        for (int r = 0; r < 4; r++) {
                                uint32_t col = (tile0 + j) * AWQ_TN + g + 8 * (r / 2);
                                uint32_t i = 8 * h + 2 * t + r % 2;
                                if (col < a.N && i < pr)
                                        a.y[(size_t) a.list[p0 + i] * a.N + col] = c[j][h][r];
                        }
                }
}

void cu_gemm_experts(cudaStream_t st, const CuLinear *l, uint32_t n_slots, uint32_t n_pairs,
        size_t qw_units, size_t sz_units, const uint32_t *ids, const uint32_t *off,
        const uint32_t *list, uint32_t x_div, const __half *x, uint32_t ldx, float *y)
{
        CuLinear one = *l;
        one.splits = 1;
        if (l->group_size % AWQ_KC != 0 || l->in % AWQ_KC != 0 || ldx % 8 != 0) {
                gemv_awq(st, &one, n_slots, qw_units, sz_units, ids, off, list, 0, x_div, false,
                        x, ldx, y, 0);
                return;
        }
        uint32_t tiles = awq_tiles(l->out);
        MoeGemmArgs a = {l->qw, l->sz, qw_units, sz_units, ids, off, list, n_slots, x_div, ldx,
                x, y, l->out, tiles, l->in / AWQ_KC, l->group_size / AWQ_KC};
        /* an expert of c rows takes ceil(c / MG_ROWS) <= c / MG_ROWS + 1 blocks */
        dim3 grid(div_up(tiles / AWQ_NT, MG_WARPS), div_up(n_pairs, MG_ROWS) + n_slots);
        k_moe_gemm<<<grid, MG_WARPS * 32, 0, st>>>(a);
}

void cu_awq_sizes(uint32_t in, uint32_t out, uint32_t group_size, size_t *qw_bytes,
        size_t *sz_bytes)
{
        size_t tiles = awq_tiles(out);
        *qw_bytes = tiles * div_up(in, AWQ_KC) * 512;
        *sz_bytes = (size_t) (in / group_size) * tiles * AWQ_TN * 4;
}

uint32_t cu_awq_splits(int n_sm, uint32_t n, uint32_t k, uint32_t matrices)
{
        int per_sm = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_gemv_awq<false, true, false>,
                    AWQ_KW * 32, 0) != cudaSuccess ||
                per_sm < 1)
                per_sm = 1;
        uint32_t slots = (uint32_t) n_sm * (uint32_t) per_sm;
        uint32_t ctas = matrices * awq_tiles(n) / AWQ_NT, chunks = div_up(k, AWQ_KC);
        /* One wave of resident CTAs if the matrix is small enough: the most slices that
         * still fit, each CTA's loads all in flight at once. Above a wave, the fewest
         * slices that fill the last wave to 85%: many short CTAs cost more than a partial
         * wave (7B gate_up, 1.8 waves: 27.9 us unsplit, 31.0 us in 5 slices; PERF.md).
         * Each warp keeps at least one chunk. */
        uint32_t best = 1;
        double best_fill = 0;
        for (uint32_t s = 1; s <= 8 && chunks >= s * AWQ_KW; s++) {
                uint32_t n_ctas = ctas * s;
                if (ctas <= slots) {
                        if (n_ctas <= slots)
                                best = s;
                        continue;
                }
                double fill = (double) n_ctas / ((double) div_up(n_ctas, slots) * slots);
                if (fill >= 0.85)
                        return s;
                if (fill > best_fill) {
                        best_fill = fill;
                        best = s;
                }
        }
        return best;
}

/* ---------------------------------------------------------------------------------------
 * FP16 GEMV for the dense linears */

/* Dense FP16 weights (N, kp): a warp on 4 rows of w, lane l on row l%4 and 8 consecutive k
 * per 16-byte load, for up to GEMV_ROWS rows of x. x is read 16 bytes at a time when vec
 * (K % 8 == 0), else element by element; k >= K reads as 0 (the weights are zero there
 * too). */
#define DENSE_UNROLL 4

template <int M, bool VEC>
__global__ void __launch_bounds__(256) k_gemv_dense(const __half *__restrict__ w,
        const __half *x, uint32_t ldx, float *y, size_t slice_stride,
        uint32_t K, uint32_t kp, uint32_t N, uint32_t splits)
{
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t g = blockIdx.x * 8 + warp;
        uint32_t kc_n = kp / 8, s = blockIdx.y;
        uint32_t c0 = (uint32_t) ((uint64_t) kc_n * s / splits);
        uint32_t c1 = (uint32_t) ((uint64_t) kc_n * (s + 1) / splits);
        uint32_t n = 4 * g + lane % 4;
        bool live = n < N;
        const uint32_t first = c0 + lane / 4;
        const uint4 *wp = (const uint4 *) (w + (size_t) (live ? n : 0) * kp);
        uint4 wv[DENSE_UNROLL];
        auto load = [&](uint32_t base) {
#pragma unroll
                for (int i = 0; i < DENSE_UNROLL; i++)
                        if (base + 8 * i < c1)
                                wv[i] = ld_stream(wp + base + 8 * i);
        };
        /* The weights are constant: the first loads go into registers before the wait on
         * the kernel that writes x, so that after it only x is a memory round trip (an
         * L2 prefetch there left the weights one more: V2-Lite's router, batch 1, 0.6% of
         * the step; docs/PERF.md, ninth session). */
        if (4 * g < N)
                load(first);
        pdl_wait();
        pdl_trigger();
        if (4 * g >= N)
                return;
        float acc[M];
#pragma unroll
        for (int m = 0; m < M; m++)
                acc[m] = 0.0f;

        for (uint32_t base = first; base < c1; base += 8 * DENSE_UNROLL) {
                if (base != first)
                        load(base);
#pragma unroll
                for (int i = 0; i < DENSE_UNROLL; i++) {
                        uint32_t kc = base + 8 * i;
                        if (kc >= c1)
                                break;
                        float2 wf[4];
                        const uint32_t *u = (const uint32_t *) &wv[i];
#pragma unroll
                        for (int j = 0; j < 4; j++)
                                wf[j] = __half22float2(u32_as_h2(u[j]));
                        uint32_t k = kc * 8;
#pragma unroll
                        for (int m = 0; m < M; m++) {
                                const __half *xr = x + (size_t) m * ldx + k;
                                float2 xs[4];
                                if (VEC) {
                                        uint4 xv = *(const uint4 *) xr;
                                        const uint32_t *xu = (const uint32_t *) &xv;
#pragma unroll
                                        for (int j = 0; j < 4; j++)
                                                xs[j] = __half22float2(u32_as_h2(xu[j]));
                                } else {
#pragma unroll
                                        for (int j = 0; j < 4; j++) {
                                                xs[j].x = k + 2 * j < K ? __half2float(xr[2 * j]) : 0.0f;
                                                xs[j].y = k + 2 * j + 1 < K ? __half2float(xr[2 * j + 1]) : 0.0f;
                                        }
                                }
                                acc[m] += dense_dot8(wf, xs);
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
static void gemv_dense_rows(cudaStream_t st, const CuLinear *l, const __half *x, uint32_t ldx,
        float *y, size_t slice_stride)
{
        dim3 grid(div_up(div_up(l->out, 4), 8), l->splits);
        if (l->in % 8 == 0 && ldx % 8 == 0)
                k_gemv_dense<M, true><<<grid, 256, 0, st>>>(
                        l->w, x, ldx, y, slice_stride, l->in, l->kp, l->out, l->splits);
        else
                k_gemv_dense<M, false><<<grid, 256, 0, st>>>(
                        l->w, x, ldx, y, slice_stride, l->in, l->kp, l->out, l->splits);
}

/* ---------------------------------------------------------------------------------------
 * 8-bit GEMV for the lm_head quantized at load (BK_LINEAR_Q8) */

/* The weights are the A operand of mma.m16n8k16, a tile of 16 outputs, and the rows of x
 * its B columns, as in the INT4 GEMV, so a row's result does not depend on the other rows.
 * Within each block of 32 k the mma's k order is permuted so that both operands of a lane
 * are contiguous: lane l (g = l / 4, t = l % 4) holds the 16 bytes of outputs g and g + 8
 * at k 8t .. 8t + 7 of the block and loads x[n][8t .. 8t + 7] in one 16-byte load. Each
 * byte is q + 128, which is the FP16 number 1024 + q + 128 once 0x64 sits above it: one
 * byte permute and one subtraction of 1152 make q exactly. */

__device__ __forceinline__ void q8_frag(uint32_t lo, uint32_t hi, uint32_t sel, uint32_t *a)
{
        const __half2 off = __float2half2_rn(-1152.0f);
        a[0] = h2_as_u32(__hadd2(u32_as_h2(__byte_perm(lo, 0x64646464u, sel)), off));
        a[1] = h2_as_u32(__hadd2(u32_as_h2(__byte_perm(hi, 0x64646464u, sel)), off));
}

/* A fragments of one block of a lane's unit v (words x, y: output g; z, w: output g + 8):
 * step 0 takes k 8t .. 8t + 3, step 1 k 8t + 4 .. 8t + 7. */
__device__ __forceinline__ void q8_unpack(uint4 v, uint32_t (*a)[4])
{
        uint32_t p[2];
        q8_frag(v.x, v.z, 0x4140u, p);
        a[0][0] = p[0];
        a[0][1] = p[1];
        q8_frag(v.x, v.z, 0x4342u, p);
        a[0][2] = p[0];
        a[0][3] = p[1];
        q8_frag(v.y, v.w, 0x4140u, p);
        a[1][0] = p[0];
        a[1][1] = p[1];
        q8_frag(v.y, v.w, 0x4342u, p);
        a[1][2] = p[0];
        a[1][3] = p[1];
}

/* The end of a tile of 16 outputs whose K ran in KS parts, the consecutive warps of one
 * CTA (k_gemv_q8, k_gemv_h16): the parts meet in shared memory (red: a [NT * 4][32] a warp
 * of the CTA), added in part order, and part 0 stores the tile's outputs of the rows of x.
 * Every warp of the CTA comes here (KS > 1: its barrier). */
template <int NT, int KS>
__device__ __forceinline__ void tile_parts_store(float (*acc)[4], float (*red)[NT * 4][32],
        uint32_t part, bool live, uint32_t tile, uint32_t rows, float *y, uint32_t N)
{
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
        if (KS > 1) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int j = 0; j < 4; j++)
                                red[warp][nt * 4 + j][lane] = acc[nt][j];
                __syncthreads();
                if (part != 0 || !live)
                        return;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int j = 0; j < 4; j++)
#pragma unroll
                                for (int p = 1; p < KS; p++)
                                        acc[nt][j] += red[warp + p][nt * 4 + j][lane];
        }
        uint32_t v = tile * 16 + g;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
                uint32_t n = nt * 8 + 2 * t;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                        uint32_t vj = v + (j / 2) * 8, nj = n + j % 2;
                        if (vj < N && nj < rows)
                                y[(size_t) nj * N + vj] = acc[nt][j];
                }
        }
}

/* KS warps of a CTA a tile of 16 outputs, each a KS-th of K in whole groups (no slices
 * across CTAs: the lm_head has tiles enough), NT tiles of 8 rows of x, GB blocks of 32 k a
 * group, U blocks' weights in flight a lane. Each group sums into its own accumulators,
 * which its outputs' scales then add into the part's result, as the CPU adds the groups;
 * the parts meet in shared memory in part order. x is loaded at each block's use, not a
 * round ahead: the registers go to weights in flight, which is what the bandwidth needs (as
 * in k_gemv_dense, CTAs enough an SM). 8 blocks in flight a lane at 4 CTAs an SM, instead
 * of 4 at 5, took 7B's lm_head from 143 to 153 us (docs/PERF.md, thirty-ninth session). */
template <int NT, int GB, int U, int KS, bool SCREEN = false>
__global__ void __launch_bounds__(256, NT == 1 ? (GB == 4 ? 5 : 4) : 3)
        k_gemv_q8(const uint4 *__restrict__ w, const float *__restrict__ sc, const __half *x,
                uint32_t ldx, uint32_t rows, float *y, uint32_t K, uint32_t N, CuQ8Bounds bd)
{
        static_assert(U % GB == 0, "a group ends inside a round");
        static_assert(!SCREEN || NT == 1, "the screen's bounds are of one row");
        __shared__ float red[KS > 1 ? 8 : 1][NT * 4][32];
        /* SCREEN: the sums of |x| by group, rounded up (see cu_gemv_q8_bounds) */
        __shared__ float xg_s[SCREEN ? Q8_BOUND_GROUPS : 1];
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t tile = blockIdx.x * (8 / KS) + warp / KS, part = warp % KS;
        uint32_t tiles = (N + 15) / 16;
        uint32_t nb = K / 32, nbk = nb / KS, g = lane / 4, t = lane % 4;
        bool live = tile < tiles;
        uint32_t b0 = part * nbk;
        const uint4 *wp = w + ((size_t) tile * nb + b0) * 32 + lane;
        const float *sp = sc + ((size_t) tile * (nb / GB) + b0 / GB) * 16 + g;
        uint4 wv[U];
        float s0[U / GB], s1[U / GB];
        auto load = [&](uint32_t c0) {
#pragma unroll
                for (int i = 0; i < U; i++)
                        if (c0 + i < nbk)
                                wv[i] = ld_stream(wp + (size_t) (c0 + i) * 32);
#pragma unroll
                for (int i = 0; i < U / GB; i++)
                        if (c0 + i * GB < nbk) {
                                s0[i] = sp[(c0 / GB + i) * 16];
                                s1[i] = sp[(c0 / GB + i) * 16 + 8];
                        }
        };
        /* The weights are constant: the first loads go out before the wait on the kernel
         * that writes x, as in k_gemv_dense. */
        if (live)
                load(0);
        pdl_wait();
        pdl_trigger();
        if constexpr (SCREEN) {
                /* warp w takes groups w, w + 8, ...; lane l of a group its k l, l + 32, ...
                 * (all loads of a round of 4 groups first: 8 spill at 5 CTAs an SM) */
                uint32_t gs = 32 * GB, G = K / gs;
                for (uint32_t g0 = warp; g0 < G; g0 += 8 * 4) {
                        float v[4];
#pragma unroll
                        for (uint32_t u = 0; u < 4; u++) {
                                v[u] = 0.0f;
                                for (uint32_t k = lane; g0 + 8 * u < G && k < gs; k += 32)
                                        v[u] += fabsf(__half2float(x[(g0 + 8 * u) * gs + k]));
                        }
#pragma unroll
                        for (uint32_t u = 0; u < 4; u++) {
                                for (int o = 16; o > 0; o >>= 1)
                                        v[u] += __shfl_xor_sync(0xffffffffu, v[u], o);
                                if (lane == 0 && g0 + 8 * u < G)
                                        xg_s[g0 + 8 * u] = v[u] * Q8_BOUND_UP;
                        }
                }
                __syncthreads();
        }
        if (KS == 1 && !live)
                return;
        float acc[NT][4], gacc[NT][4], bnd[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                        acc[nt][j] = gacc[nt][j] = 0.0f;
        const __half *xr[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
                xr[nt] = nt * 8 + g < rows ? x + (size_t) (nt * 8 + g) * ldx + b0 * 32 + 8 * t
                                           : NULL;

        for (uint32_t c0 = 0; live && c0 < nbk; c0 += U) {
                if (c0 != 0)
                        load(c0);
#pragma unroll
                for (int i = 0; i < U; i++) {
                        uint32_t c = c0 + i;
                        if (c >= nbk)
                                break;
                        uint32_t a[2][4];
                        q8_unpack(wv[i], a);
#pragma unroll
                        for (int nt = 0; nt < NT; nt++) {
                                uint4 xv = xr[nt] ? *(const uint4 *) (xr[nt] + c * 32)
                                                  : make_uint4(0, 0, 0, 0);
                                mma16816(gacc[nt], a[0], make_uint2(xv.x, xv.y));
                                mma16816(gacc[nt], a[1], make_uint2(xv.z, xv.w));
                        }
                        if (i % GB == GB - 1) {
                                float sa = s0[i / GB], sb = s1[i / GB];
                                if constexpr (SCREEN) {
                                        float xg = xg_s[(b0 + c) / GB];
                                        bnd[0] = fmaf(sa, xg, bnd[0]);
                                        bnd[1] = fmaf(sb, xg, bnd[1]);
                                }
#pragma unroll
                                for (int nt = 0; nt < NT; nt++) {
                                        acc[nt][0] = fmaf(sa, gacc[nt][0], acc[nt][0]);
                                        acc[nt][1] = fmaf(sa, gacc[nt][1], acc[nt][1]);
                                        acc[nt][2] = fmaf(sb, gacc[nt][2], acc[nt][2]);
                                        acc[nt][3] = fmaf(sb, gacc[nt][3], acc[nt][3]);
#pragma unroll
                                        for (int j = 0; j < 4; j++)
                                                gacc[nt][j] = 0.0f;
                                }
                        }
                }
        }
        if constexpr (!SCREEN) {
                tile_parts_store<NT, KS>(acc, red, part, live, tile, rows, y, N);
        } else {
                /* the parts' logits and bounds of row 0 (lanes t = 0: outputs g and g + 8)
                 * meet in part order; y gets each output's upper bound, and the tile's
                 * largest lower and upper bounds below nmax go to tlo and thi (fmaxf passes
                 * over a NaN: the screen catches a non-finite x itself) */
                float a[2] = {acc[0][0], acc[0][2]};
                if (KS > 1) {
                        red[warp][0][lane] = a[0];
                        red[warp][1][lane] = a[1];
                        red[warp][2][lane] = bnd[0];
                        red[warp][3][lane] = bnd[1];
                        __syncthreads();
                        if (part != 0 || !live)
                                return;
#pragma unroll
                        for (int p = 1; p < KS; p++) {
                                a[0] += red[warp + p][0][lane];
                                a[1] += red[warp + p][1][lane];
                                bnd[0] += red[warp + p][2][lane];
                                bnd[1] += red[warp + p][3][lane];
                        }
                }
                float lo = -INFINITY, hi = -INFINITY;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                        uint32_t v = tile * 16 + g + 8 * h;
                        float b = bnd[h] * bd.cfac * Q8_BOUND_UP;
                        if (t == 0 && v < N)
                                y[v] = a[h] + b;
                        if (t == 0 && v < bd.nmax) {
                                lo = fmaxf(lo, a[h] - b);
                                hi = fmaxf(hi, a[h] + b);
                        }
                }
                for (int o = 4; o < 32; o <<= 1) {
                        lo = fmaxf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
                        hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
                }
                if (lane == 0) {
                        bd.tlo[tile] = lo;
                        bd.thi[tile] = hi;
                }
        }
}

/* The most K parts a tile (warps of one CTA, up to 4) that hold whole groups each. Shorter
 * warps spread the tiles' rows over the SMs more evenly than one a tile: 7B's lm_head in
 * 130 us in 4 parts, 143 in one; V2-Lite's in 51 and 63 (docs/PERF.md, thirty-ninth
 * session). */
template <int NT, int GB, bool SCREEN>
static void gemv_q8_parts(cudaStream_t st, const CuLinear *l, const __half *x, uint32_t ldx,
        uint32_t rows, float *y, const CuQ8Bounds &bd)
{
        uint32_t nb = l->in / 32, tiles = div_up(l->out, 16u);
        if (nb % (4 * GB) == 0)
                k_gemv_q8<NT, GB, 4, 4, SCREEN><<<div_up(tiles, 2u), 256, 0, st>>>(
                        l->q8w, l->q8s, x, ldx, rows, y, l->in, l->out, bd);
        else if (nb % (2 * GB) == 0)
                k_gemv_q8<NT, GB, 4, 2, SCREEN><<<div_up(tiles, 4u), 256, 0, st>>>(
                        l->q8w, l->q8s, x, ldx, rows, y, l->in, l->out, bd);
        else
                k_gemv_q8<NT, GB, 4, 1, SCREEN><<<div_up(tiles, 8u), 256, 0, st>>>(
                        l->q8w, l->q8s, x, ldx, rows, y, l->in, l->out, bd);
}

template <int NT, bool SCREEN>
static void gemv_q8_rows(cudaStream_t st, const CuLinear *l, const __half *x, uint32_t ldx,
        uint32_t rows, float *y, const CuQ8Bounds &bd)
{
        if (l->group_size == 32)
                gemv_q8_parts<NT, 1, SCREEN>(st, l, x, ldx, rows, y, bd);
        else if (l->group_size == 64)
                gemv_q8_parts<NT, 2, SCREEN>(st, l, x, ldx, rows, y, bd);
        else
                gemv_q8_parts<NT, 4, SCREEN>(st, l, x, ldx, rows, y, bd);
}

void cu_gemv_q8(cudaStream_t st, const CuLinear *l, const __half *x, uint32_t ldx, uint32_t rows,
        float *y)
{
        CuQ8Bounds none = {};
        if (rows <= 8)
                gemv_q8_rows<1, false>(st, l, x, ldx, rows, y, none);
        else
                gemv_q8_rows<2, false>(st, l, x, ldx, rows, y, none);
}

uint32_t cu_q8_group(uint32_t K)
{
        return K % 128 == 0 ? 128 : K % 64 == 0 ? 64 : 32;
}

bool cu_q8_bounds_take(uint32_t K)
{
        return K % 32 == 0 && K / cu_q8_group(K) <= Q8_BOUND_GROUPS;
}

void cu_gemv_q8_bounds(cudaStream_t st, const CuLinear *l, const __half *x, float *hi,
        float *tlo, float *thi, uint32_t nmax)
{
        /* 1/2 for the rounding to 8 bits, and the float rounding of both sums, four times
         * over. Here a group's products (exact) go through up to 8 mma steps of 17 terms,
         * each term losing at most 2^-22 of the step's largest magnitude when aligned (the
         * running sum is one of them): at most 136 * 2^-22 of the group's sum of |terms|;
         * then up to K/32 + 4 float adds of the groups and parts. k_gemv_dense adds K/64
         * pieces a lane, each 8 exact products in 8 adds, then the lanes' sums in 3: under
         * K/64 + 11 float adds. A float add loses at most 2^-24 of the sum of |terms|, and
         * sum_k |w_k x_k| <= 127 sum_g s_g X_g for both the FP16 and the 8-bit weights. */
        float K = (float) l->in;
        float cfac =
                0.5f + 4.0f * 127.0f * (136.0f / 4194304.0f + (K / 16.0f + 20.0f) / 16777216.0f);
        CuQ8Bounds bd = {tlo, thi, nmax, cfac};
        gemv_q8_rows<1, true>(st, l, x, l->in, 1, hi, bd);
}

/* One thread a (row, group) of the dense w (N, kp): q8_quantize_row's arithmetic
 * (daemon/model/q8_pack.h), its bytes biased by 128 into k_gemv_q8's layout (upload_q8 lays
 * out the host's the same way), rows past N as zeros. */
__global__ void k_q8_quantize(const __half *__restrict__ w, uint32_t kp, uint32_t K, uint32_t N,
        uint32_t gs, uint8_t *q8w, float *q8s)
{
        uint32_t groups = K / gs, nb = K / 32;
        size_t u = (size_t) blockIdx.x * blockDim.x + threadIdx.x;
        if (u >= (size_t) ((N + 15) / 16) * 16 * groups)
                return;
        uint32_t n = (uint32_t) (u / groups), gi = (uint32_t) (u % groups);
        uint32_t tile = n / 16, row = n % 16;
        const __half *wr = w + (size_t) n * kp + (size_t) gi * gs;
        float amax = 0.0f;
        for (uint32_t k = 0; n < N && k < gs; k++)
                amax = fmaxf(amax, fabsf(__half2float(wr[k])));
        float s = amax / 127.0f;
        q8s[((size_t) tile * groups + gi) * 16 + row] = s;
        uint8_t *dst = q8w + (size_t) tile * nb * 512 + (row % 8) * 64 + (row / 8) * 8;
        for (uint32_t c = gi * gs / 32; c < (gi + 1) * gs / 32; c++)
                for (uint32_t t = 0; t < 4; t++) {
                        uint8_t b[8];
                        for (uint32_t j = 0; j < 8; j++) {
                                uint32_t k = c * 32 + 8 * t + j - gi * gs;
                                float q = 0.0f;
                                if (n < N && s > 0.0f)
                                        q = fmaxf(-127.0f,
                                                fminf(127.0f, rintf(__half2float(wr[k]) / s)));
                                b[j] = (uint8_t) ((int) q + 128);
                        }
                        *(uint2 *) (dst + (size_t) c * 512 + t * 16) = *(const uint2 *) b;
                }
}

void cu_q8_from_dense(cudaStream_t st, const __half *w, uint32_t kp, const CuLinear *q)
{
        size_t units = (size_t) div_up(q->out, 16u) * 16 * (q->in / q->group_size);
        k_q8_quantize<<<(unsigned) ((units + 255) / 256), 256, 0, st>>>(
                w, kp, q->in, q->out, q->group_size, (uint8_t *) q->q8w, q->q8s);
}

/* One thread a 16-byte unit of the layout above: its 8 k of two outputs. */
__global__ void k_q8_dequant(const uint4 *__restrict__ w, const float *__restrict__ sc,
        uint32_t K, uint32_t N, uint32_t gb, __half *w16)
{
        size_t u = (size_t) blockIdx.x * blockDim.x + threadIdx.x;
        uint32_t nb = K / 32, tiles = (N + 15) / 16;
        if (u >= (size_t) tiles * nb * 32)
                return;
        uint32_t lane = u % 32, c = (uint32_t) (u / 32 % nb), tile = (uint32_t) (u / 32 / nb);
        uint4 v = w[u];
        const uint8_t *q = (const uint8_t *) &v;
        for (uint32_t h = 0; h < 2; h++) {
                uint32_t r = lane / 4 + 8 * h, n = tile * 16 + r;
                if (n >= N)
                        continue;
                float s = sc[((size_t) tile * (nb / gb) + c / gb) * 16 + r];
                __half o[8];
                for (int j = 0; j < 8; j++)
                        o[j] = __float2half_rn((float) ((int) q[8 * h + j] - 128) * s);
                *(uint4 *) (w16 + (size_t) n * K + c * 32 + 8 * (lane % 4)) = *(const uint4 *) o;
        }
}

void cu_q8_dequant(cudaStream_t st, const CuLinear *l, __half *w16)
{
        size_t units = (size_t) div_up(l->out, 16u) * (l->in / 32) * 32;
        k_q8_dequant<<<(unsigned) ((units + 255) / 256), 256, 0, st>>>(
                l->q8w, l->q8s, l->in, l->out, l->group_size / 32, w16);
}

/* ---------------------------------------------------------------------------------------
 * FP16 GEMV on tensor cores, for 2-16 rows of a wide dense linear (the lm_head) */

/* k_gemv_dense multiplies on the CUDA cores, each row of x again: at 8 rows 7B's FP16
 * lm_head took about 2.3 times its streaming time, and 9-16 rows read its weights twice.
 * Here the FP16 weights, row-major as they are, are mma.m16n8k16's A operand, with
 * k_gemv_q8's order of k in each block of 32: lane (g, t) loads outputs g's and g + 8's 16
 * bytes at k 8t .. 8t + 7 (two loads, each 64 contiguous bytes of a row for a lane quad)
 * and x[n][8t .. 8t + 7] in one. So a row's result does not depend on the other rows, and
 * 2-8 rows (one tile of B) and 9-16 (two) give a row the same bits. KS warps of a CTA take a
 * tile's K in parts, U blocks' weights (64 bytes) in flight a lane at 5 CTAs an SM, as in
 * k_gemv_q8: 7B batch 8 11.3% faster than k_gemv_dense, V2-Lite 4.7%, where 128 bytes at 4
 * CTAs gave 10.8% and 4.3%. At one row it streams slower than k_gemv_dense (7B's lm_head in
 * 266 us against 244, V2-Lite's in 102 against 98; docs/PERF.md, fortieth session), which
 * keeps that row (inferred, not profiled: a quad's four lanes read 64 bytes of a row, half a
 * line, where k_gemv_dense's eight read a whole one). Outputs past N read row N - 1 and are not
 * stored. */
#define H16_U 2

template <int NT, int U, int KS>
__global__ void __launch_bounds__(256, NT == 1 ? 5 : 4)
        k_gemv_h16(const __half *__restrict__ w, uint32_t kp, const __half *x, uint32_t ldx,
                uint32_t rows, float *y, uint32_t K, uint32_t N)
{
        __shared__ float red[KS > 1 ? 8 : 1][NT * 4][32];
        uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        uint32_t tile = blockIdx.x * (8 / KS) + warp / KS, part = warp % KS;
        uint32_t nb = K / 32, g = lane / 4, t = lane % 4;
        uint32_t b0 = nb * part / KS, nbk = nb * (part + 1) / KS - b0;
        bool live = tile < (N + 15) / 16;
        uint32_t n0 = min(tile * 16 + g, N - 1), n1 = min(tile * 16 + g + 8, N - 1);
        const uint4 *w0 = (const uint4 *) (w + (size_t) n0 * kp + b0 * 32 + 8 * t);
        uint32_t d1 = (n1 - n0) * (kp / 8); /* output g + 8's row, in 16-byte units */
        uint4 wa[U], wb[U];
        auto load = [&](uint32_t c0) {
#pragma unroll
                for (int i = 0; i < U; i++)
                        if (c0 + i < nbk) {
                                wa[i] = ld_stream(w0 + (c0 + i) * 4);
                                wb[i] = ld_stream(w0 + (c0 + i) * 4 + d1);
                        }
        };
        /* the weights are constant: the first loads go out before the wait on the kernel
         * that writes x, as in k_gemv_dense */
        if (live)
                load(0);
        pdl_wait();
        pdl_trigger();
        if (KS == 1 && !live)
                return;
        float acc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                        acc[nt][j] = 0.0f;
        const __half *xr[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
                xr[nt] = nt * 8 + g < rows ? x + (size_t) (nt * 8 + g) * ldx + b0 * 32 + 8 * t
                                           : NULL;

        for (uint32_t c0 = 0; live && c0 < nbk; c0 += U) {
                if (c0 != 0)
                        load(c0);
#pragma unroll
                for (int i = 0; i < U; i++) {
                        uint32_t c = c0 + i;
                        if (c >= nbk)
                                break;
                        /* step 0: k 8t .. 8t + 3 (words x, y), step 1: 8t + 4 .. 8t + 7 */
                        uint32_t a0[4] = {wa[i].x, wb[i].x, wa[i].y, wb[i].y};
                        uint32_t a1[4] = {wa[i].z, wb[i].z, wa[i].w, wb[i].w};
#pragma unroll
                        for (int nt = 0; nt < NT; nt++) {
                                uint4 xv = xr[nt] ? *(const uint4 *) (xr[nt] + c * 32)
                                                  : make_uint4(0, 0, 0, 0);
                                mma16816(acc[nt], a0, make_uint2(xv.x, xv.y));
                                mma16816(acc[nt], a1, make_uint2(xv.z, xv.w));
                        }
                }
        }
        tile_parts_store<NT, KS>(acc, red, part, live, tile, rows, y, N);
}

bool cu_h16_takes(const CuLinear *l, int n_sm, const __half *x, uint32_t ldx)
{
        return !l->awq && !l->q8w && l->w && l->in % 32 == 0 && l->kp % 8 == 0 &&
               ldx % 8 == 0 && (uintptr_t) x % 16 == 0 && div_up(l->out, 16u) >= (uint32_t) n_sm;
}

template <int NT>
static void gemv_h16_rows(cudaStream_t st, const CuLinear *l, const __half *x, uint32_t ldx,
        uint32_t rows, float *y)
{
        uint32_t tiles = div_up(l->out, 16u);
        if (l->in / 32 >= 4 * H16_U)
                k_gemv_h16<NT, H16_U, 4><<<div_up(tiles, 2u), 256, 0, st>>>(
                        l->w, l->kp, x, ldx, rows, y, l->in, l->out);
        else
                k_gemv_h16<NT, H16_U, 1><<<div_up(tiles, 8u), 256, 0, st>>>(
                        l->w, l->kp, x, ldx, rows, y, l->in, l->out);
}

void cu_gemv_h16(cudaStream_t st, const CuLinear *l, const __half *x, uint32_t ldx, uint32_t rows,
        float *y)
{
        if (rows <= 8)
                gemv_h16_rows<1>(st, l, x, ldx, rows, y);
        else
                gemv_h16_rows<2>(st, l, x, ldx, rows, y);
}

bool cu_gemv_gate_up(cudaStream_t st, const CuLinear *l, const __half *x, uint32_t ldx,
        uint32_t rows, __half *hb, const CuQx *qx, const CuQx *hq)
{
        if (rows != 1)
                hq = NULL;
        return gemv_awq(st, l, 1, 0, 0, NULL, NULL, NULL, rows, 1, rows > 8, x, ldx, NULL, 0, hb,
                       qx, hq) &&
               hq;
}

bool cu_gemv_qkv_rope(cudaStream_t st, const CuLinear *l, uint32_t rows, const CuQx *qx,
        const CuRopeKv *rk)
{
        /* a cluster is at most 8 CTAs where no opt-in asks for more */
        if (l->rope_tph == 0 || l->rope_tph != rk->hd / 16 || !qx || l->splits > 8 ||
                !cu_qx_takes(l, rows, qx->chunks))
                return false;
        AwqArgs a = {l->qw, l->sz, 0, 0, NULL, NULL, NULL, rows, 1, l->in, NULL, NULL, 0, l->in,
                l->out, awq_tiles(l->out), div_up(l->in, AWQ_KC), l->splits,
                awq_group_magic(l), NULL, *qx, *rk, CuQx{}};
        uint32_t slice = div_up(a.chunks, a.splits);
        bool xs = qx_takes_xs(rows, slice,
                qx->ss ? (const void *) k_gemv_qx<true, true, true>
                       : (const void *) k_gemv_qx<true, true>);
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = 1;
        at[0].val.clusterDim.y = l->splits;
        at[0].val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(a.tiles / AWQ_NT, l->splits, 1);
        cfg.blockDim = dim3(AWQ_KW * 32);
        cfg.dynamicSmemBytes = xs ? qx_xs_bytes(rows, slice) : 0;
        cfg.stream = st;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        /* a failed launch is the step's error, as for the <<<>>> launches */
        auto k = qx->ss ? (xs ? k_gemv_qx<true, true, true> : k_gemv_qx<false, true, true>)
                        : (xs ? k_gemv_qx<true, true> : k_gemv_qx<false, true>);
        cudaLaunchKernelEx(&cfg, k, a);
        return true;
}

/* One thread per 16-byte unit or scale record of the paired layout (pair_logical_tile),
 * read from the unpaired copy in tmp. */
__global__ void k_awq_pair_tiles(const uint4 *qw_in, const uint2 *sz_in, uint32_t tiles,
        uint32_t chunks, uint32_t groups, uint32_t span, uint4 *qw, uint2 *sz)
{
        size_t u = (size_t) blockIdx.x * blockDim.x + threadIdx.x;
        size_t units = (size_t) tiles * chunks * 32, recs = (size_t) groups * tiles * 8;
        if (u < units) {
                uint32_t lane = u % 32, ch = (u / 32) % chunks, p = (uint32_t) (u / 32 / chunks);
                uint32_t lt = pair_logical_tile(p, span);
                qw[awq_unit(p, ch, chunks) * 32 + lane] = qw_in[awq_unit(lt, ch, chunks) * 32 + lane];
        } else if (u < units + recs) {
                size_t v = u - units;
                uint32_t g = v % 8, p = (uint32_t) (v / 8 % tiles), gi = (uint32_t) (v / 8 / tiles);
                uint32_t lt = pair_logical_tile(p, span);
                sz[((size_t) gi * tiles + p) * 8 + g] = sz_in[((size_t) gi * tiles + lt) * 8 + g];
        }
}

/* l's tiles paired by halves of spans of span tiles, through tmp. */
static cudaError_t awq_pair(cudaStream_t st, CuLinear *l, void *tmp, uint32_t span)
{
        size_t qb, zb;
        cu_awq_sizes(l->in, l->out, l->group_size, &qb, &zb);
        uint32_t tiles = awq_tiles(l->out), chunks = div_up(l->in, AWQ_KC);
        uint32_t groups = l->in / l->group_size;
        cudaError_t e = cudaMemcpyAsync(tmp, l->qw, qb, cudaMemcpyDeviceToDevice, st);
        if (e == cudaSuccess)
                e = cudaMemcpyAsync((char *) tmp + qb, l->sz, zb, cudaMemcpyDeviceToDevice, st);
        if (e != cudaSuccess)
                return e;
        size_t n = (size_t) tiles * chunks * 32 + (size_t) groups * tiles * 8;
        k_awq_pair_tiles<<<(unsigned) ((n + 255) / 256), 256, 0, st>>>((const uint4 *) tmp,
                (const uint2 *) ((char *) tmp + qb), tiles, chunks, groups,
                span ? span : tiles, l->qw, (uint2 *) l->sz);
        return cudaGetLastError();
}

cudaError_t cu_awq_pair_tiles(cudaStream_t st, CuLinear *l, void *tmp)
{
        cudaError_t e = awq_pair(st, l, tmp, 0);
        if (e == cudaSuccess)
                l->pairs = true;
        return e;
}

cudaError_t cu_awq_rope_tiles(cudaStream_t st, CuLinear *l, void *tmp, uint32_t tph)
{
        if (tph < 2 || tph % 2 != 0 || awq_tiles(l->out) % tph != 0)
                return cudaErrorInvalidValue;
        cudaError_t e = awq_pair(st, l, tmp, tph);
        if (e == cudaSuccess)
                l->rope_tph = tph;
        return e;
}

void cu_gemv(cudaStream_t st, const CuLinear *l, const __half *x, uint32_t ldx, uint32_t rows,
        float *y, size_t slice_stride, const CuQx *qx)
{
        if (l->awq) {
                gemv_awq(st, l, 1, 0, 0, NULL, NULL, NULL, rows, 1, rows > 8, x, ldx, y,
                        slice_stride, NULL, qx);
                return;
        }
        switch (rows) {
        case 1: gemv_dense_rows<1>(st, l, x, ldx, y, slice_stride); break;
        case 2: gemv_dense_rows<2>(st, l, x, ldx, y, slice_stride); break;
        case 3: gemv_dense_rows<3>(st, l, x, ldx, y, slice_stride); break;
        case 4: gemv_dense_rows<4>(st, l, x, ldx, y, slice_stride); break;
        case 5: gemv_dense_rows<5>(st, l, x, ldx, y, slice_stride); break;
        case 6: gemv_dense_rows<6>(st, l, x, ldx, y, slice_stride); break;
        case 7: gemv_dense_rows<7>(st, l, x, ldx, y, slice_stride); break;
        default: gemv_dense_rows<8>(st, l, x, ldx, y, slice_stride); break;
        }
}

uint32_t cu_dense_splits(int n_sm, uint32_t n, uint32_t k)
{
        /* Enough warps for ~32 per SM, while each lane keeps four loads per slice; a dense
         * warp takes 4 columns and 8 k per load. */
        uint32_t warps = div_up(n, 4), s = div_up((uint32_t) n_sm * 32, warps);
        uint32_t most = k / 8 / 32 > 1 ? k / 8 / 32 : 1;
        if (s > most)
                s = most;
        return s < 16 ? s : 16;
}

/* ---------------------------------------------------------------------------------------
 * Load-time repacking and the dequantization for the cuBLAS path */

/* One thread per unit (tile, chunk, lane) of the tiles that hold the part's columns n_off
 * .. n_off + n: it rewrites the nibbles of those columns (and, for the last part of the
 * layer, of the padding columns up to the tile's end) and keeps the others, so the parts
 * of a fused layer go in one after the other. k >= K and the padding are 0. */
__global__ void k_awq_repack(const uint32_t *qweight, uint32_t n, uint32_t n_off, uint32_t K,
        uint32_t N, uint32_t chunks, uint32_t tile_lo, uint32_t n_tiles, uint4 *qw)
{
        pdl_wait();
        size_t u = (size_t) blockIdx.x * blockDim.x + threadIdx.x;
        if (u >= (size_t) n_tiles * chunks * 32)
                return;
        uint32_t lane = u % 32, ch = (u / 32) % chunks;
        uint32_t tile = tile_lo + (uint32_t) (u / 32 / chunks);
        uint32_t g = lane / 4, t = lane % 4, words = n / 8, end = n_off + n;
        size_t at = awq_unit(tile, ch, chunks) * 32 + lane;
        uint4 v = qw[at];
        uint32_t wd[4] = {v.x, v.y, v.z, v.w};
        for (uint32_t j = 0; j < 4; j++)
                for (uint32_t i = 0; i < 8; i++) {
                        uint32_t col = tile * AWQ_TN + g + 8 * (i & 1);
                        if (col < n_off || (col >= end && end != N))
                                continue;
                        uint32_t k = ch * AWQ_KC + 16 * j + 4 * t + (i & 2) + (i >> 2), q = 0;
                        if (col < end && k < K) {
                                uint32_t c = col - n_off;
                                q = (qweight[(size_t) k * words + c / 8] >> (4 * AWQ_REV[c % 8])) &
                                    0xF;
                        }
                        wd[j] = (wd[j] & ~(0xFu << (4 * i))) | (q << (4 * i));
                }
        qw[at] = make_uint4(wd[0], wd[1], wd[2], wd[3]);
}

/* One thread per (group, column) of the part, plus the padding columns after the last
 * part (scale 0, zero 0). */
__global__ void k_awq_scales(const uint32_t *qzeros, const __half *scales, uint32_t n,
        uint32_t n_off, uint32_t cols, uint32_t groups, uint32_t tiles, __half *sz)
{
        pdl_wait();
        size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= (size_t) groups * cols)
                return;
        uint32_t gi = (uint32_t) (i / cols), c = (uint32_t) (i % cols), col = n_off + c;
        __half s = __float2half(0.0f);
        float z = 0.0f;
        if (c < n) {
                z = (float) ((qzeros[(size_t) gi * (n / 8) + c / 8] >> (4 * AWQ_REV[c % 8])) & 0xF);
                s = scales[(size_t) gi * n + c];
        }
        uint32_t h = (col % AWQ_TN) / 8;
        __half *rec = sz + (((size_t) gi * tiles + col / AWQ_TN) * 8 + col % 8) * 4;
        rec[h] = s;
        rec[2 + h] = __float2half(-(h ? 64.0f : 1024.0f) - z);
}

void cu_awq_repack(cudaStream_t st, const CuLinear *l, const uint32_t *qweight,
        const uint32_t *qzeros, const __half *scales, uint32_t n, uint32_t n_off)
{
        uint32_t tiles = awq_tiles(l->out), chunks = div_up(l->in, AWQ_KC);
        bool last = n_off + n == l->out;
        uint32_t tile_lo = n_off / AWQ_TN, tile_hi = last ? tiles : div_up(n_off + n, AWQ_TN);
        size_t units = (size_t) (tile_hi - tile_lo) * chunks * 32;
        k_awq_repack<<<(unsigned) ((units + 255) / 256), 256, 0, st>>>(
                qweight, n, n_off, l->in, l->out, chunks, tile_lo, tile_hi - tile_lo, l->qw);
        uint32_t cols = last ? tiles * AWQ_TN - n_off : n, groups = l->in / l->group_size;
        size_t g = (size_t) groups * cols;
        k_awq_scales<<<(unsigned) ((g + 255) / 256), 256, 0, st>>>(
                qzeros, scales, n, n_off, cols, groups, tiles, (__half *) l->sz);
}

/* One thread per unit: its 32 weights (q - z) * s, 4 consecutive k of one column at a
 * time, to w16 (N, K). */
__global__ void k_awq_dequant(const uint4 *qw, const __half *sz, uint32_t K, uint32_t N,
        uint32_t gs, uint32_t tiles, uint32_t chunks, __half *w16)
{
        pdl_wait();
        size_t u = (size_t) blockIdx.x * blockDim.x + threadIdx.x;
        if (u >= (size_t) tiles * chunks * 32)
                return;
        uint32_t lane = u % 32, ch = (u / 32) % chunks, tile = (uint32_t) (u / 32 / chunks);
        uint32_t g = lane / 4, t = lane % 4;
        uint4 v = qw[awq_unit(tile, ch, chunks) * 32 + lane];
        const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
        for (uint32_t j = 0; j < 4; j++) {
                uint32_t k = ch * AWQ_KC + 16 * j + 4 * t;
                if (k >= K)
                        break;
                const __half *rec = sz + (((size_t) (k / gs) * tiles + tile) * 8 + g) * 4;
                for (uint32_t h = 0; h < 2; h++) {
                        uint32_t col = tile * AWQ_TN + g + 8 * h;
                        if (col >= N)
                                break;
                        float s = __half2float(rec[h]);
                        float z = -__half2float(rec[2 + h]) - (h ? 64.0f : 1024.0f);
                        /* k offsets 0..3 are nibbles h, 4 + h, 2 + h, 6 + h */
                        const uint32_t nib[4] = {h, 4 + h, 2 + h, 6 + h};
                        __half2 o[2];
                        float d[4];
                        for (uint32_t m = 0; m < 4; m++)
                                d[m] = ((float) ((wd[j] >> (4 * nib[m])) & 0xF) - z) * s;
                        o[0] = __floats2half2_rn(d[0], d[1]);
                        o[1] = __floats2half2_rn(d[2], d[3]);
                        *(uint2 *) (w16 + (size_t) col * K + k) =
                                make_uint2(h2_as_u32(o[0]), h2_as_u32(o[1]));
                }
        }
}

void cu_awq_dequant(cudaStream_t st, const CuLinear *l, __half *w16)
{
        uint32_t tiles = awq_tiles(l->out), chunks = div_up(l->in, AWQ_KC);
        size_t units = (size_t) tiles * chunks * 32;
        k_awq_dequant<<<(unsigned) ((units + 255) / 256), 256, 0, st>>>(
                l->qw, (const __half *) l->sz, l->in, l->out, l->group_size, tiles, chunks, w16);
}

/* ---------------------------------------------------------------------------------------
 * Bench hook (cuda_backend.h) */

extern "C" int cuda_bench_awq(uint32_t in, uint32_t out, uint32_t gs, uint32_t rows,
        uint32_t n_experts, uint32_t top_k, double *us, double *bytes, uint32_t *splits,
        DsError *err)
{
        int dev = 0, n_sm = 0;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess)
                e = cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess)
                return ds_error(err, -EIO, "bench awq: device: %s", cudaGetErrorString(e));
        size_t qb, sb;
        cu_awq_sizes(in, out, gs, &qb, &sb);
        uint32_t mats = n_experts ? n_experts : 1, pairs = n_experts ? rows * top_k : rows;
        CuLinear l = {};
        l.awq = true;
        l.in = in;
        l.out = out;
        l.group_size = gs;
        l.splits = cu_awq_splits(n_sm, out, in, n_experts ? top_k : 1);
        *splits = l.splits;

        /* token r's experts: distinct, from a fixed pseudo-random sequence */
        uint32_t *off = (uint32_t *) calloc(mats + 1, 4);
        uint32_t *list = (uint32_t *) calloc(pairs + 1, 4);
        uint32_t *of = (uint32_t *) calloc(pairs + 1, 4), active = 0, seed = 12345;
        if (!off || !list || !of) {
                free(off);
                free(list);
                free(of);
                return ds_error(err, -ENOMEM, "bench awq: out of memory");
        }
        for (uint32_t p = 0; n_experts && p < pairs; p++) {
                bool dup = true;
                while (dup) {
                        seed = seed * 1664525u + 1013904223u;
                        of[p] = (seed >> 8) % n_experts;
                        dup = false;
                        for (uint32_t q = p - p % top_k; q < p; q++)
                                dup = dup || of[q] == of[p];
                }
                off[of[p] + 1]++;
        }
        for (uint32_t x = 0; n_experts && x < n_experts; x++) {
                active += off[x + 1] > 0;
                off[x + 1] += off[x];
        }
        for (uint32_t p = 0; n_experts && p < pairs; p++)
                list[off[of[p]]++] = p;
        for (uint32_t x = mats; n_experts && x > 0; x--)
                off[x] = off[x - 1];
        off[0] = 0;
        *bytes = (double) (qb + sb) * (n_experts ? active : 1);
        /* enough copies that a launch's weights were evicted from L2 (50 MB) since the
         * last launch on the same copy */
        uint32_t copies = (uint32_t) ((double) (1u << 29) / *bytes) + 1;
        copies = copies < 2 ? 2 : copies > 64 ? 64 : copies;

        uint4 *qw = NULL;
        __half2 *sz = NULL;
        __half *x = NULL;
        float *y = NULL;
        uint32_t *offd = NULL, *listd = NULL;
        /* dense rows as a step's add_norm leaves them: quantized too, for the integer GEMV */
        CuQx qx = {NULL, NULL, in / AWQ_KC, NULL, 0.0f};
        bool quantized = !n_experts && rows <= QX_ROWS && in % AWQ_KC == 0;
        cudaStream_t st = NULL;
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        e = cudaMalloc(&qw, qb * mats * copies);
        if (e == cudaSuccess)
                e = cudaMalloc(&sz, sb * mats * copies);
        if (e == cudaSuccess)
                e = cudaMalloc(&x, (size_t) pairs * in * 2);
        if (e == cudaSuccess)
                e = cudaMalloc(&y, (size_t) l.splits * pairs * out * 4);
        if (e == cudaSuccess)
                e = cudaMalloc(&offd, (mats + 1) * 4);
        if (e == cudaSuccess)
                e = cudaMalloc(&listd, (pairs + 1) * 4);
        if (e == cudaSuccess)
                e = cudaMemset(qw, 0x5a, qb * mats * copies);
        if (e == cudaSuccess)
                e = cudaMemset(sz, 0x11, sb * mats * copies);
        if (e == cudaSuccess)
                e = cudaMemset(x, 0x22, (size_t) pairs * in * 2);
        if (e == cudaSuccess && quantized)
                e = cudaMalloc(&qx.items, (size_t) rows * in * 2);
        if (e == cudaSuccess && quantized)
                e = cudaMalloc(&qx.recs, (size_t) rows * qx.chunks * sizeof(float2));
        if (e == cudaSuccess && quantized) {
                cu_quantize_x(0, x, in, rows, in, &qx);
                e = cudaDeviceSynchronize();
        }
        if (e == cudaSuccess)
                e = cudaMemcpy(offd, off, (mats + 1) * 4, cudaMemcpyHostToDevice);
        if (e == cudaSuccess)
                e = cudaMemcpy(listd, list, (pairs + 1) * 4, cudaMemcpyHostToDevice);
        if (e == cudaSuccess)
                e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
        if (e == cudaSuccess)
                e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
        for (uint32_t c = 0; e == cudaSuccess && c < 2 * copies; c++) {
                CuLinear v = l;
                v.qw = (uint4 *) ((char *) qw + (c % copies) * qb * mats);
                v.sz = (__half2 *) ((char *) sz + (c % copies) * sb * mats);
                if (n_experts)
                        cu_gemv_experts(st, &v, n_experts, qb / 16, sb / 4, NULL, offd, listd,
                                top_k, div_up(pairs, top_k), x, in, y, (size_t) pairs * out,
                                NULL, EXPERTS_PLAIN);
                else
                        cu_gemv(st, &v, x, in, rows, y, (size_t) rows * out,
                                quantized ? &qx : NULL);
        }
        if (st) {
                cudaError_t e2 = cudaStreamEndCapture(st, &graph);
                if (e == cudaSuccess)
                        e = e2;
        }
        if (e == cudaSuccess)
                e = cudaGraphInstantiate(&exec, graph, 0);
        if (e == cudaSuccess)
                e = cudaGraphLaunch(exec, st);
        float ms = 0;
        if (e == cudaSuccess)
                e = cu_graph_time(st, exec, 5, &ms);
        *us = ms * 1e3 / (5.0 * 2 * copies);
        if (exec)
                cudaGraphExecDestroy(exec);
        if (graph)
                cudaGraphDestroy(graph);
        if (st)
                cudaStreamDestroy(st);
        cudaFree(qw);
        cudaFree(sz);
        cudaFree(x);
        cudaFree(y);
        cudaFree(offd);
        cudaFree(listd);
        cudaFree(qx.items);
        cudaFree(qx.recs);
        free(off);
        free(list);
        free(of);
        if (e != cudaSuccess)
                return ds_error(err, -EIO, "bench awq %u->%u: %s", in, out, cudaGetErrorString(e));
        return 0;
}
