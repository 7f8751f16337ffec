/* SPDX-License-Identifier: MIT */
/* The CUDA backend's kernels and their launchers, shared by cuda_kernels.cu and
 * cuda_gemv.cu (the GEMVs, the AWQ repack and dequantization), which define them, and
 * cuda_backend.cu, which drives them. C++ linkage: nothing here crosses into C.
 *
 * The residual stream, queries and a linear's partial sums are float32; a linear's input
 * is FP16 (its producer rounds once, as the tensor cores and cuBLAS take it), and for the
 * integer GEMV of up to QX_ROWS rows also quantized to 16-bit integers (CuQx); weights are
 * INT4 (AWQ, repacked at load) or FP16; the KV cache is FP16.
 * A linear writes float32 partial sums [splits][rows][out] and the kernel that consumes its
 * output adds the slices in a fixed order plus the bias, so no reduction kernel and no
 * atomics: results do not depend on scheduling. */
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* Rows one dense GEMV launch takes; more rows go through in passes of this many (the
 * INT4 GEMV takes up to 16 at once). */
#define GEMV_ROWS 8
/* Most positions one attention work item covers (decode rows take fewer, see att_chunk). */
#define ATT_CHUNK 128
/* Most query heads sharing one KV head that the attention kernel holds in registers. */
#define ATT_GROUP_MAX 16

/* A linear's input of up to QX_ROWS rows quantized to integers (the integer INT4 GEMV's x,
 * see cuda_gemv.cu), made by the add_norm that makes it in FP16: chunk c of 64 k of row r,
 * x ~ scale * X with scale = max |x| / QX_XMAX over the chunk and X = 256 xh + xl, xh and
 * xl signed bytes. Item r * chunks + c is 32 words: word 16 p + 4 t + j holds part p (0:
 * xh, 1: xl) of k 16 j + 4 t + {0, 2, 1, 3}, byte by byte (the order of an AWQ word's
 * nibbles, so that A and B of mma.m16n8k32 meet); its record is (scale, sum of X as int
 * bits). */
#define QX_ROWS 4
#define QX_XMAX 32639 /* so that (X + 128) >> 8 is a signed byte */
typedef struct CuQx {
        uint32_t *items;
        float2 *recs;
        uint32_t chunks; /* per row */
        /* NULL: the rows are the normed ones. Else (one row, made by cu_gemv_res) they are w
         * h, the residual h times the norm's weights before the norm's factor, and ss[c] is
         * chunk c's sum of h^2: the integer GEMV multiplies its sums by the norm's factor
         * of the sum of ss (about 1 / sqrt(sum / K + eps): k_gemv_qx's NORM), one scalar a
         * row. QX_SS_COPIES copies, QX_SS_CHUNKS floats apart, so that the consumer's CTAs
         * spread their reads of them. */
        float *ss;
        float eps;
} CuQx;
/* A dense MLP's hb of one row quantized by 16 k instead (hq: cu_gemv_gate_up makes it,
 * cu_gemv_res takes it as x): X = 256 xh + xl and the record (scale, sum of X) as above,
 * but for each 16 k of a chunk (record 4 c + s is k-step s's), and word 8 s + 4 p + t of
 * chunk c's item holds part p of k 16 s + 4 t + {0, 2, 1, 3}. A gate|up CTA's 16 columns of
 * hb are one k-step: it writes one 32-byte sector and one record, with no cluster; the
 * consumer's lane l reads word l. ss is NULL. */
/* Most chunks of a row whose norm the integer GEMV can finish (CuQx.ss): 4 a lane. */
#define QX_SS_CHUNKS 128
#define QX_SS_COPIES 16

/* A linear layer resident on the device. */
typedef struct CuLinear {
        bool awq;
        uint32_t in, out;    /* K, N */
        uint32_t kp;         /* dense: row stride of w, in padded to a multiple of 8 */
        uint32_t group_size; /* awq */
        uint32_t splits;     /* K slices of the GEMV, fixed per shape */
        uint32_t res_splits; /* K slices of cu_gemv_res at one row; 0: it does not apply */
        uint32_t res_kw;     /* ... and the warps of each half of its CTAs */
        bool pairs;          /* awq gate|up: tiles in (gate, up) pairs, see cu_awq_pair_tiles */
        uint32_t rope_tph;   /* awq q|k|v: tiles a head, its halves paired (cu_awq_rope_tiles); 0: not */
        uint4 *qw;           /* awq: (ceil(N/16), ceil(K/64), 32) 16-byte units, see cuda_gemv.cu */
        __half2 *sz;         /* awq: scales and zeros per (group, column), see cuda_gemv.cu */
        __half *w;           /* dense: (N, kp), zero beyond in; awq: NULL or an FP16 copy (N, K);
                              * q8: its FP16 copy (N, K) */
        uint4 *q8w;          /* q8: (ceil(N/16), K/32, 32) 16-byte units, see k_gemv_q8 */
        float *q8s;          /* q8: (ceil(N/16), K/group_size, 16) scales of the tiles' outputs */
        float *bias;         /* (N) or NULL */
} CuLinear;

/* Where one step's metadata lives in the device buffer the host fills before each step
 * (the same buffer for eager runs and graph replays). meta[0] is the number of attention
 * work items and meta[1] their offset in uint32s from meta, each item four int32s: its row,
 * its first and end position, and the first position of the row's sequence that the step
 * writes (earlier ones may be read before the wait on the kernel that writes the cache);
 * the arrays below hold rows. */
typedef struct CuMeta {
        const uint32_t *base;
        const int32_t *tokens;   /* (rows) */
        const uint32_t *pos;     /* (rows) */
        const uint32_t *slot;    /* (rows) KV slot: block * block_tokens + pos % block_tokens */
        const uint32_t *row_bt;  /* (rows) offset from base of the row's block table */
        const uint2 *row_items;  /* (rows) first attention item, count */
        const uint32_t *out_row; /* (rows) the rows whose logits are computed, in order */
} CuMeta;

/* Element at of a linear's output: its partial slices added in order, plus bias[col]. */
__device__ __forceinline__ float sum_part(const float *part, uint32_t splits, size_t slice_stride,
        size_t at, const float *bias, uint32_t col)
{
        float y = 0.0f;
        for (uint32_t s = 0; s < splits; s++)
                y += part[s * slice_stride + at];
        return bias ? y + bias[col] : y;
}

/* The dense FP16 GEMV's sum of 8 products, a 16-byte piece of a weight row by one of x, as
 * float pairs: k_gemv_dense and the screened lm_head's rescoring (cuda_screen.cu) both add
 * through this, so that a logit comes out of either with the same bits. */
__device__ __forceinline__ float dense_dot8(const float2 (&wf)[4], const float2 (&xs)[4])
{
        float p = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++)
                p += wf[j].x * xs[j].x + wf[j].y * xs[j].y;
        return p;
}

/* silu(g) * u, as every SwiGLU on the device computes it (the GEMVs' epilogues and the
 * swiglu kernels give the same bits). __fdividef (2 ulp, no branch) rather than the IEEE
 * division, whose slow-path branch made each value of a GEMV's epilogue wait for the
 * one before it. */
__device__ __forceinline__ float silu_mul(float g, float u)
{
        return __fdividef(g, 1.0f + expf(-g)) * u;
}

/* x[0] = the embedding of one row, as cu_embed, ending as cu_gemv_res does: w x quantized
 * into qx (hidden a multiple of 256, at most QX_SS_CHUNKS chunks) with each chunk's sum of
 * x^2, so that no add_norm launch sits between the embedding and the first q|k|v. */
void cu_embed_qx(cudaStream_t st, const __half *embed, CuMeta meta, const int32_t *chain,
        uint32_t hidden, float *x, const float *w, const CuQx *qx);

/* x[m] = embed[token[m]] widened to float32; a token t < 0 is chain[-1 - t], an id the
 * step before sampled (chained steps, see cuda_submit). */
void cu_embed(cudaStream_t st, const __half *embed, CuMeta meta, const int32_t *chain,
        uint32_t rows, uint32_t hidden, float *x);

/* A MoE layer's output as add_norm's input (see cu_add_norm): row r's top_k pairs' down
 * partials, each pair's slices summed and weighted by w[r * top_k + k], plus the shared
 * experts' slices when shared is not NULL. y: where steps of many rows sum it first. */
typedef struct CuMoeSum {
        const float *w;
        uint32_t top_k;
        const float *shared;
        uint32_t s_splits;
        size_t s_stride;
        uint32_t rows; /* of the step, which y holds */
        float *y;
} CuMoeSum;

/* For j < rows, r = out_row ? out_row[j] : j: v = x[r] + sum of part's slices + bias;
 * x[r] = v when write_res; xn[j] = rmsnorm(v) * w. part may be NULL (v = x[r]). With moe,
 * part holds a MoE layer's pair partials instead (moe->rows * top_k of hidden a slice),
 * v = x[r] + their sum as moe says (in moe->y first, for many rows), and bias is NULL.
 * router (not with moe; NULL: none): also the router's logits of xn, where
 * cu_add_norm_routes says so (cuda_deepseek.cuh). qx (or NULL): also xn quantized into it,
 * where cu_add_norm_quantizes says so and there is no router; returns whether it was. */
struct CuNormRouter;
bool cu_add_norm(cudaStream_t st, float *x, const float *part, uint32_t splits,
        size_t slice_stride, const float *bias, const CuMoeSum *moe, const float *w, __half *xn,
        uint32_t rows, uint32_t hidden, float eps, const uint32_t *out_row, bool write_res,
        const struct CuNormRouter *router, const CuQx *qx);

/* Whether cu_add_norm also quantizes xn into a CuQx (its qx argument) at rows rows of
 * hidden: the cluster kernel's rows, up to QX_ROWS, each block's slice whole chunks. */
bool cu_add_norm_quantizes(uint32_t rows, uint32_t hidden);

/* qx = rows of x (row stride ldx, a multiple of 8; K a multiple of 64) quantized, as
 * cu_add_norm does it: for the tests of the integer GEMV. */
void cu_quantize_x(cudaStream_t st, const __half *x, uint32_t ldx, uint32_t rows, uint32_t K,
        const CuQx *qx);

/* Whether cu_add_norm takes a router of n_routed experts at rows rows of hidden: the
 * cluster kernel's rows, each block's slice of the row in whole 16-byte pieces for every
 * expert's threads. */
bool cu_add_norm_routes(uint32_t rows, uint32_t hidden, uint32_t n_routed);

/* Logical tile of physical tile p of a linear whose tiles are paired by halves of spans of
 * span tiles: p / 2 is pair i of its span (i < span / 2), and p % 2 says which half, so p
 * holds tile i or i + span / 2 of the span. */
__host__ __device__ __forceinline__ uint32_t pair_logical_tile(uint32_t p, uint32_t span)
{
        uint32_t half = span / 2;
        return p / 2 / half * span + p / 2 % half + (p % 2) * half;
}

/* Physical column of logical column c (the inverse of pair_logical_tile) of a linear whose
 * tiles are paired by halves of spans of tph tiles (cu_awq_rope_tiles; cu_awq_pair_tiles
 * is one span of all the tiles): tile i < tph / 2 of span s and tile i + tph / 2 are
 * physical tiles 2 (s tph / 2 + i) and the one after it. */
__host__ __device__ __forceinline__ uint32_t paired_col(uint32_t c, uint32_t tph)
{
        uint32_t t = c / 16, half = tph / 2, s = t / tph, i = t % tph;
        return (2 * (s * half + i % half) + (i >= half)) * 16 + c % 16;
}

/* Where the rotated q and the new k and v of a step go: the rope's inputs and outputs
 * (k_rope_kv, or the q|k|v GEMV's epilogue, cu_gemv_qkv_rope). */
typedef struct CuRopeKv {
        const float *bias; /* (n) or NULL, by logical column */
        const uint32_t *pos, *slot;
        const float *inv_freq;
        float af;
        uint32_t n_heads, n_kv_heads, hd;
        float *q_out; /* (rows, n_heads * hd) */
        __half *k_cache, *v_cache;
} CuRopeKv;

/* The rotation (c, sn) of position pos at frequency f, times af. Here and in rope_kv_store
 * every rounding is explicit: ptxas may fuse a plain multiply and add into an fma, and
 * did so differently in the q|k|v GEMV's epilogue than in k_rope_kv, whose bits it must
 * give (test-gpu-linear). */
__device__ __forceinline__ void rope_angle(uint32_t pos, float f, float af, float *c, float *sn)
{
        sincosf(__fmul_rn((float) pos, f), sn, c);
        *c = __fmul_rn(*c, af);
        *sn = __fmul_rn(*sn, af);
}

/* Row r's logical columns col (of the first half of a head) and col + hd / 2 of q|k|v,
 * summed (a, b), into their places: rotated by (c, sn) into q_out or the k cache, or as they
 * are into the v cache. */
__device__ __forceinline__ void rope_kv_store(const CuRopeKv &rk, uint32_t r, uint32_t col,
        float a, float b, float c, float sn)
{
        uint32_t hd = rk.hd, half = hd / 2, h = col / hd;
        uint32_t q_dim = rk.n_heads * hd, kv_dim = rk.n_kv_heads * hd;
        size_t kv_at = (size_t) rk.slot[r] * kv_dim;
        if (h >= rk.n_heads + rk.n_kv_heads) {
                rk.v_cache[kv_at + col - q_dim - kv_dim] = __float2half(a);
                rk.v_cache[kv_at + col + half - q_dim - kv_dim] = __float2half(b);
                return;
        }
        float ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn));
        float rb = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, sn));
        if (h < rk.n_heads) {
                rk.q_out[(size_t) r * q_dim + col] = ra;
                rk.q_out[(size_t) r * q_dim + col + half] = rb;
        } else {
                rk.k_cache[kv_at + col - q_dim] = __float2half(ra);
                rk.k_cache[kv_at + col + half - q_dim] = __float2half(rb);
        }
}

/* Sums the fused q|k|v partials plus bias, rotates q and k (rotate-half), writes q to
 * q_out (rows, n_heads*head_dim) and k, v as FP16 into the layer's cache at each row's
 * slot. tph: the linear's rope_tph, by which its columns are paired (0: not). */
void cu_rope_kv(cudaStream_t st, const float *part, uint32_t splits, size_t slice_stride,
        uint32_t rows, uint32_t tph, const CuRopeKv *rk);

/* Attention partials: one block per (work item, KV head), or per (work item, half of a KV
 * head's query heads) with head_split 2 where the group size is compiled for (2, 4..8);
 * items are read from meta. grid is the number of blocks along items (they loop),
 * fixed for a graph. small: a step of at most ATT_SMALL_STEP sequences, whose items are
 * short; there a warp takes each query head where head_dim is 32, 64 or 128 and a group
 * has at most 8 heads (head_split does not apply). */
void cu_attention(cudaStream_t st, const float *q, const __half *k_cache, const __half *v_cache,
        CuMeta meta, uint32_t grid, bool small, uint32_t head_split, uint32_t block_tokens,
        uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, float *acc, float2 *ml);

/* Prefill attention on tensor cores (cuda_flash.cu), for head_dim 64 or 128 and fewer
 * than 2^23 positions (cu_flash_takes): out rows = causal softmax(q·K^T / sqrt(head_dim))·V of n_tasks tasks,
 * tasks[k] = first row | rows << 16, rows <= FLASH_ROWS consecutive rows of one sequence at
 * consecutive positions (meta.pos, meta.row_bt of the first row); blocks take them from
 * the last, so a chunk's latest (longest) tasks start first. */
#define FLASH_ROWS 64
bool cu_flash_takes(uint32_t head_dim, uint32_t max_positions);
void cu_flash_attention(cudaStream_t st, const float *q, const __half *k_cache,
        const __half *v_cache, CuMeta meta, const uint32_t *tasks, uint32_t n_tasks,
        uint32_t block_tokens, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
        __half *out);

/* out (rows, n_heads*head_dim) = the softmax-weighted merge of each row's item partials
 * (GQA heads, or the MLA latent with head_dim = kv_lora_rank). */
void cu_attention_combine(cudaStream_t st, const float *acc, const float2 *ml, CuMeta meta,
        uint32_t rows, uint32_t n_heads, uint32_t head_dim, __half *out);

/* out (rows, inter) = silu(gate) * up, gate and up being the two halves of the fused
 * gate|up partials plus bias; with pairs, the columns of a gate|up linear whose tiles are
 * paired (see cu_awq_pair_tiles), and no bias. */
void cu_swiglu(cudaStream_t st, const float *part, uint32_t splits, size_t slice_stride,
        const float *bias, uint32_t rows, uint32_t inter, bool pairs, __half *out);

/* Float32 to FP16, n elements. */
void cu_to_half(cudaStream_t st, const float *x, __half *y, size_t n);

/* *ms = the time n launches of g back to back take on st, between two events (the bench
 * hooks: decode graphs, GEMV graphs). */
cudaError_t cu_graph_time(cudaStream_t st, cudaGraphExec_t g, uint32_t n, float *ms);

/* One logits row's sampling request, uploaded with the step (kernels/sample.c decides
 * alike): temperature 0 is greedy. The row's penalties are pen_n (id, count) pairs of
 * distinct ids at pen_off of the step's penalty list. */
typedef struct CuSampleParams {
        float temperature;
        uint32_t top_k;
        float top_p, min_p;
        float repetition, presence, frequency;
        uint32_t pen_off, pen_n;
        uint64_t seed, draw;
        int32_t *out; /* NULL, or where the id goes too: mapped host memory */
} CuSampleParams;

/* ids[j] (and *params[j].out) = the sampling decision of logits row j over the first
 * vocab ids, with the penalties applied to the row in place and undone before it returns
 * (pen_saved holds the raw values meanwhile, one per penalty pair). A cluster of blocks
 * per row up to 16 rows, else one block. */
void cu_sample(cudaStream_t st, float *logits, uint32_t rows, uint32_t ld, uint32_t vocab,
        const CuSampleParams *params, const uint2 *pen, float *pen_saved, int32_t *ids);

/* ---------------------------------------------------------------------------------------
 * cuda_screen.cu */

/* A dense FP16 lm_head and its 8-bit copy's bounds of one row's logits (cu_gemv_q8_bounds). */
typedef struct CuScreen {
        const __half *w; /* (N, kp): the FP16 weights */
        uint32_t kp;
        const float *hi;       /* (N) the upper bounds */
        const float *tlo, *thi; /* (ceil(N/16)) a tile's largest lower and upper bounds */
} CuScreen;

/* Whether cu_screen_argmax takes an lm_head of K inputs (row stride kp) and vocab sampled
 * ids. */
bool cu_screen_takes(uint32_t K, uint32_t kp, uint32_t vocab);

/* ids[0] (and *params[0].out) = the greedy id over the first vocab of the FP16 logits
 * x · W of s->w, the largest, the lowest id on a tie, as k_gemv_dense and k_sample give it
 * for finite logits, from the 8-bit copy's bounds (cu_gemv_q8_bounds of x), with only the
 * rows they leave in doubt multiplied in FP16. One row, greedy, without penalties: the
 * caller picks it. */
void cu_screen_argmax(cudaStream_t st, const CuScreen *s, const __half *x, uint32_t vocab,
        const CuSampleParams *params, int32_t *ids);

/* ---------------------------------------------------------------------------------------
 * cuda_gemv.cu */

/* y[s] (rows, N) = slice s of x (rows, K; row stride ldx, a multiple of 4 for AWQ, even
 * for dense) · W, for rows <= 16 (AWQ) or GEMV_ROWS (dense); slices are slice_stride
 * floats apart. An AWQ row's result does not depend on the other rows. qx (or NULL): x
 * quantized, which the integer GEMV takes instead where it applies (AWQ, up to QX_ROWS
 * rows, groups of whole chunks). */
void cu_gemv(cudaStream_t st, const CuLinear *l, const __half *x, uint32_t ldx, uint32_t rows,
        float *y, size_t slice_stride, const CuQx *qx);

/* y (rows, N) = x (rows, K; row stride ldx, a multiple of 8) · W of an 8-bit linear l (q8w),
 * rows <= 16, in one slice; a row's result does not depend on the other rows. */
void cu_gemv_q8(cudaStream_t st, const CuLinear *l, const __half *x, uint32_t ldx, uint32_t rows,
        float *y);

/* Whether cu_gemv_h16 takes the dense FP16 linear l with x (row stride ldx) on a device of
 * n_sm SMs: K a multiple of 32, x and its rows 16-byte aligned, and at least a tile of 16
 * outputs an SM (the lm_head; a narrow linear, the MoE router, keeps k_gemv_dense's K
 * slices). */
bool cu_h16_takes(const CuLinear *l, int n_sm, const __half *x, uint32_t ldx);

/* y (rows, N) = x (rows, K; row stride ldx) · W of a dense FP16 linear that cu_h16_takes,
 * rows <= 16, on tensor cores, in one slice; a row's result does not depend on the other
 * rows. */
void cu_gemv_h16(cudaStream_t st, const CuLinear *l, const __half *x, uint32_t ldx, uint32_t rows,
        float *y);

/* Groups of the 8-bit linear whose logits cu_gemv_q8_bounds bounds; its sums of |x| and of
 * the bounds are rounded up by Q8_BOUND_UP past their float rounding. */
#define Q8_BOUND_GROUPS 256
#define Q8_BOUND_UP     (1.0f + 1.0f / 1024.0f)
typedef struct CuQ8Bounds {
        float *tlo, *thi;
        uint32_t nmax;
        float cfac;
} CuQ8Bounds;

/* The group of an 8-bit linear of K inputs (a multiple of 32), as q8_group_size gives it on
 * the host: the largest of 128, 64 and 32 that divides K. */
uint32_t cu_q8_group(uint32_t K);

/* Whether cu_gemv_q8_bounds takes an 8-bit linear of K inputs. */
bool cu_q8_bounds_take(uint32_t K);

/* For one row x of an 8-bit copy l of a dense FP16 linear (cu_q8_from_dense): output v's
 * logit a_v by l as cu_gemv_q8 makes it, within B_v = cfac sum_g s_vg X_g of the FP16
 * logit k_gemv_dense makes (s_vg: its group g's scale; X_g: the sum of |x| over the group;
 * cfac: 1/2 for the rounding to 8 bits plus both sums' float rounding), hi[v] = a_v + B_v,
 * and tile t's largest a_v - B_v and a_v + B_v over v < nmax into tlo[t] and thi[t]. */
void cu_gemv_q8_bounds(cudaStream_t st, const CuLinear *l, const __half *x, float *hi,
        float *tlo, float *thi, uint32_t nmax);

/* q's 8-bit weights and scales (q->q8w, q->q8s allocated, its in, out and group_size set)
 * from the dense FP16 w (q->out, kp), rounded as q8_quantize_row rounds on the host. */
void cu_q8_from_dense(cudaStream_t st, const __half *w, uint32_t kp, const CuLinear *q);

/* w16 (N, K) = l's 8-bit weights times their scales, rounded to FP16: the copy that
 * cuBLAS multiplies above 16 rows. */
void cu_q8_dequant(cudaStream_t st, const CuLinear *l, __half *w16);

/* hb (rows, l->out / 2) = silu(gate) * up of x · W, for a gate|up linear l with paired
 * tiles and one K slice, rows <= 16: a CTA holds a gate tile and its up tile, and its
 * sums go through k_swiglu4's arithmetic into hb instead of out as partials. hq (NULL, or
 * for one row of l->out / 2 = 64 hq->chunks): where the integer GEMV takes x (qx), hb goes
 * quantized by 16 k into hq instead; returns whether it did. */
bool cu_gemv_gate_up(cudaStream_t st, const CuLinear *l, const __half *x, uint32_t ldx,
        uint32_t rows, __half *hb, const CuQx *qx, const CuQx *hq);

/* Reorders the tiles of l (gate | up, l->out / 2 columns each, a multiple of 16) so that
 * gate tile t and up tile t are physical tiles 2t and 2t + 1, one CTA's pair, through tmp
 * (the bytes of l's weights and scale records), and sets l->pairs unless it fails. Gate
 * column c is then physical column c / 16 * 32 + c % 16 and up column c 16 after it, in
 * every path (the GEMVs, the FP16 copy, the dequantization). */
cudaError_t cu_awq_pair_tiles(cudaStream_t st, CuLinear *l, void *tmp);

/* Reorders the tiles of a q|k|v linear l of heads of tph tiles (tph even, dividing l's
 * tiles) so that tile i and tile i + tph / 2 of a head, the halves that the rope rotates
 * into each other, are one CTA's pair (see paired_col), and sets l->rope_tph unless it
 * fails; tmp as for cu_awq_pair_tiles. */
cudaError_t cu_awq_rope_tiles(cudaStream_t st, CuLinear *l, void *tmp, uint32_t tph);

/* The q|k|v GEMV ending in the rope (cu_rope_kv's arithmetic) for x (rows) quantized in
 * qx, where l's tiles are paired for it: its K slices run as one cluster a tile pair,
 * whose CTAs sum the slices through distributed shared memory in slice order, one launch
 * fewer a layer. Returns false, launching nothing, where it does not apply (then
 * cu_gemv and cu_rope_kv). */
bool cu_gemv_qkv_rope(cudaStream_t st, const CuLinear *l, uint32_t rows, const CuQx *qx,
        const CuRopeKv *rk);

/* Whether the integer GEMV (cu_gemv, cu_gemv_gate_up, cu_gemv_qkv_rope) takes rows rows of
 * l's input quantized in chunks chunks a row: AWQ with groups of whole chunks, up to
 * QX_ROWS rows. */
bool cu_qx_takes(const CuLinear *l, uint32_t rows, uint32_t chunks);

/* Whether the integer GEMV of one row of l taking qx with the norm's sums (qx->ss) runs in
 * its wide resident CTAs (QX_WIDE_KW in cuda_gemv.cu): for tests. */
bool cu_qx_wide(const CuLinear *l, const CuQx *qx);

/* The GEMV of one row x (l->in) into y = x · W + bias that ends in the residual add and the
 * next norm's quantization, in place of cu_gemv and the add_norm after it (o, and down
 * where the next layer is dense): h += y, written back to h, and w * h quantized into qx
 * by chunks of 64, with each chunk's sum of h^2 in qx->ss (the integer GEMV that takes qx
 * finishes the norm). A CTA holds one chunk of columns; l->res_splits K slices of it run
 * as one cluster, and the first adds the slices' sums in slice order. hq (or NULL): x
 * quantized by 16 k (cu_gemv_gate_up's), which it takes instead of x. */
void cu_gemv_res(cudaStream_t st, const CuLinear *l, const __half *x, float *h,
        const float *w, const CuQx *qx, const CuQx *hq);

/* Sets l->res_splits and l->res_kw for cu_gemv_res, or leaves them 0 where it does not
 * apply: l not AWQ with groups of whole chunks, columns not whole chunks, or more chunks of
 * columns than its clusters that fit on the GPU at once. wide: two CTAs an SM wherever two
 * slices of them fit (an attention's o), else the most slices that fit. */
void cu_res_plan(CuLinear *l, bool wide);

/* cu_gemv_res for a MoE layer's down at one row (in place of the expert GEMV and the
 * add_norm after it): l describes expert 0 as cu_gemv_experts's does, and pair p of the
 * row (l->res_splits of them) takes expert idx[p]'s weights and row p of x (row stride
 * ldx); h += the pairs' products times their weights pair_w, added in pair order. Both idx
 * and pair_w come from the routing, so no weight loads before the launch's wait. part
 * (l->res_splits * l->out floats) takes the pairs' sums; count (l->out / 64 words, zero
 * before the first launch) is left zero. */
void cu_gemv_res_moe(cudaStream_t st, const CuLinear *l, size_t qw_units, size_t sz_units,
        const uint32_t *idx, const float *pair_w, const __half *x, uint32_t ldx, float *h,
        const float *w, const CuQx *qx, float *part, uint32_t *count);

/* Sets l->res_splits (pairs, at most 8) and l->res_kw (kw, or cu_gemv_res_moe's choice
 * where kw is 0; 5 or 3) for cu_gemv_res_moe and returns true where it applies (AWQ with
 * groups of whole chunks, columns in whole groups of 4 chunks); else leaves them 0. */
bool cu_res_plan_moe(CuLinear *l, uint32_t pairs, uint32_t kw);

/* An MLA layer's attention output at one row, from the attention items' partials acc and
 * ml (cu_mla_attention's) through the combine, W_UV (wvt, cu_mla_split_kvb's) and o, into
 * H / 2 slices of o->out floats in y, to be added in order (by the add_norm after it): three
 * launches in one. cu_mla_out_takes says where it applies. */
bool cu_mla_out_takes(const CuLinear *o, uint32_t H, uint32_t rank, uint32_t Vd);
void cu_mla_out(cudaStream_t st, const CuLinear *o, const float *acc, const float2 *ml,
        CuMeta meta, const __half *wvt, uint32_t H, uint32_t rank, uint32_t Vd, float *y);

/* Tests: sets l->res_splits and l->res_kw to splits and kw where cu_gemv_res takes them
 * (kw 5 or 3, at most 4 slices, a chunk a warp), whatever cu_res_plan would pick; false,
 * changing nothing, where not. */
bool cu_res_set(CuLinear *l, uint32_t splits, uint32_t kw);

/* MoE: matrices of one shape, one per expert. l describes expert 0 (in, out, group_size,
 * splits, qw and sz of expert 0); expert e's weights are at l->qw + e*qw_units (uint4
 * units) and l->sz + e*sz_units (__half2 units). The launch has n_slots slots; slot z runs
 * expert ids[z] (z itself when ids is NULL) on the rows list[off[z] .. off[z+1]) (off: n_slots
 * + 1 entries; all three on the device). An entry p is a "pair" index: its input is row p /
 * x_div of x (x_rows rows of stride ldx, a multiple of 4, FP16; where x_rows is 1 the
 * kernel takes that row without reading the list for it) and its output is row p of each
 * slice of y (slice s at y + s*slice_stride, row stride l->out, float32). Any number of rows per
 * slot (passes of 8); a slot without rows costs empty blocks, so callers compact the
 * touched experts into the first slots (cu_moe_group). The grid depends on n_slots only
 * (the launch can be captured in CUDA graphs), and row p's result does not depend on which
 * other rows share its expert. hb: for gate|up experts with paired tiles and one slice,
 * row p of hb (l->out / 2 FP16 a row) gets silu(gate) * up instead of y its partials (see
 * cu_gemv_gate_up); else NULL. order: how this launch and the next overlap (below).
 * Returns whether it ran the staged kernel, which honours order (else it is PLAIN). */
typedef enum CuExpertsOrder {
        EXPERTS_PLAIN, /* the next launch's blocks start once this one's are past their loop */
        EXPERTS_LEAD,  /* ... once they are past their wait: the next may be EARLY */
        /* the launch before was a LEAD cu_gemv_experts over the same routing that returned
         * true: the routing is done before this launch's blocks start, and they read it
         * and load their first weights before their wait */
        EXPERTS_EARLY,
} CuExpertsOrder;

bool cu_gemv_experts(cudaStream_t st, const CuLinear *l, uint32_t n_slots, size_t qw_units,
        size_t sz_units, const uint32_t *ids, const uint32_t *off, const uint32_t *list,
        uint32_t x_div, uint32_t x_rows, const __half *x, uint32_t ldx, float *y,
        size_t slice_stride, __half *hb, CuExpertsOrder order);

/* The same product as cu_gemv_experts for steps whose experts get many rows (n_pairs
 * pairs in all): each expert's weights are read once per MG_ROWS (32) of its rows instead
 * of once per 8, on tensor cores with the rows as the mma's N. One slice: y (row stride
 * l->out) whatever l->splits says. The grid depends on n_slots and n_pairs only, and row
 * p's result does not depend on which other rows share its expert. */
void cu_gemm_experts(cudaStream_t st, const CuLinear *l, uint32_t n_slots, uint32_t n_pairs,
        size_t qw_units, size_t sz_units, const uint32_t *ids, const uint32_t *off,
        const uint32_t *list, uint32_t x_div, const __half *x, uint32_t ldx, float *y);

/* Bytes of the repacked weight units and of the (scale, zero) pairs of one AWQ matrix. */
void cu_awq_sizes(uint32_t in, uint32_t out, uint32_t group_size, size_t *qw_bytes,
        size_t *sz_bytes);

/* K slices for an AWQ GEMV of n x k when `matrices` such GEMVs run in the same launch. */
uint32_t cu_awq_splits(int n_sm, uint32_t n, uint32_t k, uint32_t matrices);

/* K slices for a dense GEMV of n x k (k the padded row stride). */
uint32_t cu_dense_splits(int n_sm, uint32_t n, uint32_t k);

/* Repacks AWQ GEMM-layout tensors (device copies) into l's layout, at column offset n_off
 * of a fused layer of l->out columns: q has in rows of n/8 words. Parts go in one after
 * the other; the last one (n_off + n == l->out) also fills the padding of the last tile,
 * so l->qw and l->sz need no clearing first. */
void cu_awq_repack(cudaStream_t st, const CuLinear *l, const uint32_t *qweight,
        const uint32_t *qzeros, const __half *scales, uint32_t n, uint32_t n_off);

/* w16 (N, K) = the dequantized AWQ weight, FP16. */
void cu_awq_dequant(cudaStream_t st, const CuLinear *l, __half *w16);
