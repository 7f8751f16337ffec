/* SPDX-License-Identifier: MIT */
/* The CUDA backend's C entry points (defined in cuda_backend.cu). */
#pragma once

#include <stdbool.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* BkOptions.device: NULL or "" for the defaults, else the device index and words: "eager"
 * runs every step without CUDA graphs (the tests compare the two); "int4-only" keeps no
 * resident FP16 copy of the AWQ weights for steps of more than 16 rows (they dequantize
 * per step instead); "no-pdl" captures the decode graphs without programmatic edges (for
 * measuring what they bring); "no-screen" keeps no 8-bit copy of a dense FP16 lm_head, so
 * greedy rows read the whole FP16 lm_head (cuda_screen.cu). */
extern const BackendOps backend_cuda_ops;

/* True when the CUDA runtime sees at least one device. */
bool cuda_device_present(void);

/* Test hook: y (rows, l->out) = x (rows, l->in) · W + bias through the path a step of
 * rows rows takes (the GEMV up to 16 rows, dequantize + cuBLAS above), on a fresh device
 * copy of l. */
int cuda_test_linear(const BkLinear *l, const float *x, uint32_t rows, float *y, DsError *err);

/* Test hook: the screened lm_head (cuda_screen.cu) of the dense FP16 linear l for one row x
 * over l's first vocab outputs: *id, y (l->out) = the FP16 logits of the path one row takes
 * without the screen, and (hi not NULL) hi (l->out) = the upper bounds of the 8-bit copy's
 * logits. -ENOTSUP where the shape cannot be screened. */
int cuda_test_screen(const BkLinear *l, const float *x, uint32_t vocab, int32_t *id, float *y,
        float *hi, DsError *err);

/* Test hook: h (rows, gate->out) = silu(x · gate) * (x · up) through a dense MLP's gate|up
 * as a step of rows rows runs it, gate and up uploaded as one linear; *paired: whether its
 * tiles were paired (cu_awq_pair_tiles); *fused: whether the GEMV made h itself. by16 (one
 * row, gate->out a multiple of 64): h as the GEMV quantizes it by 16 k for down, decoded;
 * -EPROTO where a record's sum or a value is wrong. */
int cuda_test_gate_up(const BkLinear *gate, const BkLinear *up, const float *x, uint32_t rows,
        bool by16, float *h, bool *paired, bool *fused, DsError *err);

/* Test hook: a GQA layer's q|k|v linear l (n_heads + 2 n_kv_heads heads of hd) of the rows
 * of x, rotated at positions pos with inv_freq (hd / 2), as a step of rows rows runs it on
 * a fresh device copy of l: q (rows, n_heads hd), and k and v (rows, n_kv_heads hd) as the
 * cache holds them. *paired: whether l's tiles were paired for the rope
 * (cu_awq_rope_tiles); *fused: whether the GEMV ended in the rope, which fuse allows. */
int cuda_test_qkv_rope(const BkLinear *l, uint32_t n_heads, uint32_t n_kv_heads, uint32_t hd,
        const float *inv_freq, const float *x, const uint32_t *pos, uint32_t rows, bool fuse,
        float *q, float *k, float *v, bool *paired, bool *fused, DsError *err);

/* Test hook: o or down l of one row x (l->in) ending in the residual add and the next norm
 * (cu_gemv_res) in splits K slices of CTAs of 2 kw warps, then the integer GEMV of the
 * linear c (c->in = l->out) taking its output as a step does: h (l->out) += x · W + bias in
 * place, and y (c->out) = (w * h / rms(h)) · C + c's bias, rms(h) = sqrt(mean h^2 + eps).
 * -EINVAL where cu_gemv_res or the integer GEMV does not take l, splits, kw or c. by16: x
 * goes to it quantized by 16 k, as gate|up's GEMV hands hb to down (l->in a multiple of
 * 64). *wide: whether c's GEMV ran in the wide resident CTAs of the integer GEMV. */
int cuda_test_res(const BkLinear *l, uint32_t splits, uint32_t kw, const BkLinear *c,
        const float *x, bool by16, float *h, const float *w, float eps, float *y, bool *wide,
        DsError *err);

/* Test hook: an MLA layer's attention output at one row (cu_mla_out): n_items attention
 * items' partials acc (item, H, rank) with their (max, sum) pairs ml (item, H, 2) merged
 * per head, each head's latent row times W_UV (wuv: FP16 (H, Vd, rank)), and the H Vd
 * values times the AWQ linear o, into y (o->out). -EINVAL where cu_mla_out does not take
 * the shape. */
int cuda_test_mla_out(const BkLinear *o, const uint16_t *wuv, uint32_t H, uint32_t rank,
        uint32_t Vd, uint32_t n_items, const float *acc, const float *ml, float *y, DsError *err);

/* Test hook: a MoE layer's down at one row ending in the residual add and the next norm
 * (cu_gemv_res_moe) in CTAs of 2 kw warps, then the integer GEMV of c taking its output as
 * cuda_test_res's: pair p < n_pairs multiplies row p of x (n_pairs, in) by the AWQ linear
 * experts[expert_of[p]] (n_experts of one shape), and h (out) += the pairs' products times
 * pair_w[p], in place. -EINVAL where cu_gemv_res_moe does not take the shape, n_pairs or
 * kw. */
int cuda_test_moe_res(const BkLinear *experts, uint32_t n_experts, const uint32_t *expert_of,
        const float *pair_w, uint32_t n_pairs, uint32_t kw, const BkLinear *c, const float *x,
        float *h, const float *w, float eps, float *y, DsError *err);

/* Test hook: the MoE expert GEMV (cu_gemv_experts), or the grouped GEMM (cu_gemm_experts)
 * when grouped, over n_experts AWQ linears of one shape stored one after the other. Pair p
 * goes to expert expert_of[p] and reads row p / x_div of x (ceil(n_pairs / x_div) rows of
 * in); an expert's rows are listed in pair order, or in reverse when reverse. y (n_pairs,
 * out) = the sum of the slices; the expert GEMV also runs in the EARLY order, which must
 * give the same bits. */
int cuda_test_experts(const BkLinear *experts, uint32_t n_experts, const uint32_t *expert_of,
        uint32_t n_pairs, uint32_t x_div, bool reverse, bool grouped, const float *x, float *y,
        DsError *err);

/* Test hook: the MoE router kernel on rows rows of float32 logits (rows, n_routed) with
 * e_score_correction_bias or NULL: idx, w (rows, top_k) as cpu_moe_route returns them. */
int cuda_test_moe_route(const BkMoeConfig *mc, const float *logits, const float *bias,
        uint32_t rows, uint32_t *idx, float *w, DsError *err);

/* Test hook: the prefill attention kernel alone on rows pos..pos+n-1 of one sequence
 * whose positions 0..pos+n-1 are in a paged cache of cache_blocks blocks (FP16 bits,
 * (block, block_tokens, n_kv_heads * head_dim), K and V alike) through its block table;
 * the rows are cut into a first task of `first` rows, then tasks of the kernel's most.
 * q (n, n_heads * head_dim) float32; out (n, n_heads * head_dim) FP16 bits, written where
 * the kernel writes (poison it to see). */
typedef struct CudaFlashTest {
        uint32_t n_heads, n_kv_heads, head_dim;
        uint32_t block_tokens, cache_blocks;
        const uint32_t *blocks;
        uint32_t n_blocks;
        uint32_t pos, n, first;
} CudaFlashTest;

int cuda_test_flash(const CudaFlashTest *t, const float *q, const uint16_t *k, const uint16_t *v,
        uint16_t *out, DsError *err);

/* Test hook: cu_add_norm on rows rows at once (x_rows rows of hidden in x and in each of
 * the splits slices of part; out_row NULL or rows entries), then again in passes of
 * at most the rows the cluster kernel takes. x_out (x_rows, hidden) and xn_out (rows,
 * hidden, FP16 bits) from the first; same: the passes gave the same bits. qx_items,
 * qx_recs (or NULL): the first also quantizes xn for the integer GEMV (rows up to 4, hidden
 * a multiple of 512), its items (rows, hidden / 64, 32 words) and records (rows, hidden /
 * 64, scale and sum of X as int bits) copied there. */
typedef struct CudaNormTest {
        uint32_t rows, x_rows, hidden, splits;
        const float *x, *part, *bias, *w;
        const uint32_t *out_row;
        bool write_res;
        float eps;
        uint32_t *qx_items;
        float *qx_recs;
} CudaNormTest;

int cuda_test_add_norm(
        const CudaNormTest *t, float *x_out, uint16_t *xn_out, bool *same, DsError *err);

/* Test hook: ids[i] = the device's sampling decision for row i of logits (rows <= 256 rows
 * of vocab floats, all of them sampled ids) under seqs[i]'s sampling, history and draw,
 * through the upload a step makes; from a CUDA graph captured before the upload when
 * graph. logits_after (or NULL) gets the rows as the kernel leaves them. */
int cuda_test_sample(const float *logits, uint32_t rows, uint32_t vocab, const BkSeq *seqs,
        bool graph, int32_t *ids, float *logits_after, DsError *err);

/* Bench hook (defined in cuda_gemv.cu): the INT4 GEMV on an in -> out AWQ matrix of group
 * size gs with rows rows, or, when n_experts > 0, the expert GEMV over n_experts such
 * matrices with rows tokens of top_k distinct experts each (x_div = top_k). Times launches
 * replayed from a CUDA graph over enough copies of the weights that they come from DRAM:
 * *us per launch, *bytes of weights (scales included) one launch reads, *splits its K
 * slices. */
int cuda_bench_awq(uint32_t in, uint32_t out, uint32_t gs, uint32_t rows, uint32_t n_experts,
        uint32_t top_k, double *us, double *bytes, uint32_t *splits, DsError *err);

/* Bench hook (cuda_bench_handoff.cu): the hand-offs of the decode chain alone. For
 * clusters of cluster[i] blocks, the cycles (block 0's clock) of a round in which each
 * block sends one float to every block and adds what it got: sync_cycles through remote
 * stores and cluster.sync, send_cycles through cl_send (cuda_ptx.cuh). pdl_ns: the median
 * ns from a 12 MB streaming grid's last block's end to the next grid's wait returning,
 * behind a programmatic edge; launch_ns: to its first block's start, without one. */
typedef struct CudaHandoffBench {
        uint32_t cluster[3];
        double sync_cycles[3], send_cycles[3];
        uint32_t grid_blocks[3]; /* one, two and four blocks an SM */
        double grid_cycles[3];   /* a grid barrier and a read of another block's word */
        double pdl_ns, launch_ns, clock_mhz;
} CudaHandoffBench;

int cuda_bench_handoff(CudaHandoffBench *r, DsError *err);

/* Bench hook (cuda_bench_stream.cu): how fast one launch of ctas CTAs of warps warps reads
 * bytes (an equal share a CTA, whole 1 KB chunks; at most 512 MB) in the GEMVs' load pattern
 * without their arithmetic. Fills us, from the first CTA's start to the last one's end (the
 * median of 16 launches over fresh memory), and tbs, the TB/s that makes. before: what
 * brought the bytes towards L2 ahead of the timed launch (at most STREAM_L2_MAX of them), and
 * between: the bytes of other memory streamed after that and before it. */
#define STREAM_L2_MAX ((size_t) 40 << 20)
typedef enum CudaStreamBefore {
        STREAM_NOTHING,  /* the bytes come from DRAM */
        STREAM_READ,     /* an untimed launch read them */
        STREAM_PREFETCH, /* bulk L2 prefetches (cp.async.bulk.prefetch.L2), a warp an SM */
        STREAM_KEEP,     /* ... with an evict_last cache policy */
} CudaStreamBefore;
typedef struct CudaStreamCase {
        size_t bytes;
        uint32_t ctas, warps;
        CudaStreamBefore before;
        size_t between;
        double us, tbs;
} CudaStreamCase;

int cuda_bench_stream(CudaStreamCase *cases, uint32_t n, DsError *err);

/* Bench hook: the decode graph that a step of rows rows last ran, replayed n times back to
 * back with nothing between the replays (the same inputs, so the same work): *us per
 * replay, the step's GPU time without the host's part (planning, the metadata and
 * sampling uploads, the launch, the wait for the ids). -ENOENT when no such graph was
 * captured (eager steps). */
int cuda_bench_replay(Backend *b, uint32_t rows, uint32_t n, double *us, DsError *err);

#ifdef __cplusplus
}
#endif
