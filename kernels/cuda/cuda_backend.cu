/* SPDX-License-Identifier: MIT */
/* The CUDA backend: Llama, Qwen2 and DeepSeek-V2/V3 (MLA + MoE) forward passes on one GPU,
 * with the stage names of kernels/cpu/cpu_backend.c so the two read side by side.
 *
 * Weights go up once at load: AWQ linears repacked for the GEMV (cuda_gemv.cu), q|k|v
 * and gate|up fused, dense layers and the embedding as FP16, norms and biases as float32.
 * A step's tokens are dealt into tiles (rows, attention items, block-table entries and
 * logits rows bounded by the scratch sized at load); each tile runs through every layer.
 * Up to 16 rows an AWQ linear is the tensor-core INT4 GEMV (dense ones the FP16 GEMV, in
 * passes of GEMV_ROWS, or for 2-16 rows of a wide one its tensor-core form); above, cuBLAS
 * multiplies the resident FP16 copy of the weight (or one dequantized into scratch) with
 * float32 accumulation.
 *
 * A step made only of single-token decodes replays a CUDA graph captured once per batch
 * bucket (1, 2, 4, ...): the step's metadata (tokens, positions, slots, block tables,
 * attention items) goes up in one copy into a buffer the graph reads, padded rows write
 * their K/V into a spare block nobody owns, and only ids come back. Every logits row is
 * sampled on the GPU (cuda_sample.cu) with bk_sample's decision: the rows' sampling
 * parameters and penalty lists go up with the step into buffers the graphs read too. Only
 * a row whose penalty list does not fit PEN_MAX copies its logits to the host and goes
 * through bk_sample there.
 *
 * Attention: a sequence bringing more than one token (a prefill chunk) goes through the
 * tensor-core flash kernel (cuda_flash.cu) when it takes the head size, other rows through
 * work items of k_attention merged by k_attention_combine.
 *
 * Every row of a sequence is computed by the same kernels in the same order whatever else
 * is in the step, as long as the step's row count stays in the same batch-size class (one
 * row, the GEMVs' classes up to 16, cuBLAS above; docs/design-notes.md): cuBLAS's own
 * blocking is not ours to fix. */
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "cpu_linear.h"
#include "cpu_rope.h"
#include "cuda_backend.h"
#include "half.h"
}
#include "cuda_deepseek.cuh"
#include "cuda_staging.cuh"
#include "sample_math.h"

/* Rows above which a linear goes through cuBLAS instead of the GEMV. */
#define GEMV_MAX_ROWS 16
/* Rows from which a wide dense FP16 linear (the lm_head) multiplies on tensor cores
 * (cu_gemv_h16) instead of k_gemv_dense, which streams faster at one row. */
#define H16_MIN_ROWS 2
/* Rows of one pass of the expert GEMV: an expert with more takes one slot per pass. */
#define EXPERT_PASS 8
/* Scratch bounds of one tile. */
#define TILE_ROWS   2048u
#define TILE_OUT    256u     /* rows whose logits one tile computes */
#define TILE_ITEMS  24576u   /* attention work items */
#define TILE_BT     1048576u /* block-table entries */
#define GRAPH_MAX   256u     /* largest decode batch replayed from a graph */
#define N_BUCKETS   9        /* 1, 2, 4, ..., GRAPH_MAX */
#define BLAS_WS     (32u << 20)
/* kv_a_layernorm and q_a_layernorm: DeepSeek's modeling code fixes their epsilon. */
#define MLA_NORM_EPS 1e-6f
#define PEN_MAX     (1u << 20) /* (id, count) penalty pairs of one tile */

/* DeepSeek: qkv is q_proj | kv_a_proj_with_mqa, or q_a_proj | kv_a_proj_with_mqa with q
 * LoRA; gate_up and down are the dense MLP (in 0 in a MoE layer). The routed experts of a
 * MoE layer lie one after another, then its shared experts in slices of expert_dim (see
 * shared_slice; s_gu and s_down hold them as one MLP too): e_gu and e_down describe
 * expert 0, expert e being
 * e * e_*_qw 16-byte units and e * e_*_sz scale pairs further; e_gu1 and e_down1 are the
 * same weights with one K slice, for steps that touch more than a quarter of the experts
 * (see mlp_moe). */
typedef struct CuLayer {
        float *attn_norm, *mlp_norm;
        CuLinear qkv, o, gate_up, down;
        CuLinear q_b;                /* q LoRA only */
        float *q_a_norm, *kv_a_norm; /* MLA */
        __half *wk, *wvt;            /* MLA: W_UK and W_UV, see cuda_deepseek.cuh */
        CuLinear router;             /* MoE: mlp.gate, FP16; out 0 in a dense layer */
        float *score_bias;           /* MoE: e_score_correction_bias or NULL */
        CuLinear e_gu, e_down, e_gu1, e_down1;
        size_t e_gu_qw, e_gu_sz, e_down_qw, e_down_sz;
        CuLinear s_gu, s_down; /* the shared experts as one MLP, for steps of many rows */
} CuLayer;

/* A step submitted and not yet collected (cuda_submit). An async one runs in the stream
 * and its sampler writes its ids into ids_pin, after which done fires; the others ran
 * inside submit and left their ids in ids. */
typedef struct Pending {
        bool async;
        cudaEvent_t done;
        int32_t *ids_pin; /* (TILE_OUT) pinned, mapped: the device writes ids_map */
        int32_t *ids_map;
        int32_t *ids;     /* (cap) */
        uint32_t n, cap;
} Pending;

/* One row of a tile, as the host plans it. */
typedef struct Row {
        uint32_t seq;
        uint32_t pos;
        bool logits;
} Row;

struct Backend {
        const BkModel *model;
        BkConfig cfg;
        bool mla, moe;
        bool eager;
        bool fp16_copies; /* keep FP16 copies of AWQ weights for the cuBLAS path if they fit */
        bool pdl;         /* programmatic edges in the decode graphs (see pdl_edges) */
        bool screen_opt;  /* screen a dense lm_head's greedy rows (see screen_step) */
        int dev;          /* made current on every entry: the daemon calls from several threads */
        int n_sm;
        cudaStream_t st;
        cublasHandle_t blas;
        cublasStatus_t blas_status; /* the first failed call since the last check */
        /* The nodes cuBLAS added to the graph being captured (see pdl_edges); lib_lost:
         * one could not be noted, so the graph keeps full dependencies. */
        cudaGraphNode_t *lib_nodes;
        size_t n_lib, lib_cap;
        bool lib_lost;
        void *blas_ws;
        /* The shared experts' lane (MoE models with shared experts, steps that run them as
         * their own MLP): a second stream beside the routing and the routed experts, which
         * need only the normed rows too, with its own cuBLAS handle and workspace (calls on
         * two streams at once must not share one) and its own partial sums. */
        cudaStream_t side;
        cublasHandle_t side_blas;
        void *side_ws;
        cudaEvent_t fork, join;
        cudaError_t side_err; /* the first failed fork or join since the last check */
        float *spart;

        /* weights */
        __half *embed;
        CuLayer *layers;
        float *final_norm;
        CuLinear lm_head;
        /* The screened lm_head (cuda_screen.cu): an 8-bit copy of a dense FP16 lm_head (no
         * q8w: none), and a step's largest lower and upper bounds of its tiles' logits. */
        CuLinear head_q8;
        float *screen_tlo, *screen_thi;
        float *inv_freq;
        float attention_factor;

        /* scratch, for TILE_ROWS rows */
        float *x, *q, *part, *acc, *logits;
        __half *xn, *att, *hb; /* linear inputs */
        /* xn quantized, up to QX_ROWS rows (NULL items: the hidden size does not allow it),
         * and whether the add_norms of the step being recorded make it */
        CuQx qx;
        bool qx_live;
        /* qx with the chunks' sums of squares: the rows as o and down quantize them before
         * the norm's factor at one row (cu_gemv_res), and whether the step's rows are such */
        CuQx qx_res;
        bool qx_deferred;
        uint32_t *res_count; /* cu_gemv_res_moe's counts, one a chunk of hidden columns */
        /* a dense MLP's hb of one row quantized by 16 k, where down ends as o does (NULL
         * items: no layer's does, or the MLP's width is not whole chunks) */
        CuQx hq;
        float2 *ml;
        __half *w16;
        int32_t *ids_d;
        /* DeepSeek scratch, for TILE_ROWS rows (pairs: rows * top_k) */
        __half *xq, *olat;        /* (rows, q_lora_rank), (rows, H, rank) */
        float *epart, *edpart;    /* experts' gate|up and down partials, by pair */
        __half *ehb;              /* (pairs, expert_dim) */
        uint32_t *ridx, *eids, *eoff, *elist;
        float *rw, *moe_y;        /* (pairs), (rows, hidden) */
        float *rlog;              /* (rows, n_routed): router logits made by add_norm */

        /* the step's metadata: device copy, pinned host copy, fixed offsets */
        uint32_t *meta_d, *meta_h;
        /* Two pairs of the metadata and the sampling parameters, each pinned and on the
         * device: a submitted step's copies may still wait in the stream while the next
         * step is planned into the other pair, and an async step's go up on the upload
         * lane while the step before runs from the other pair's device copies. meta_d,
         * meta_h, samp_* and pen_* point into the current pair. */
        uint32_t *meta_hb[2], *meta_db[2];
        CuSampleParams *samp_hb[2], *samp_db[2];
        uint32_t pair;
        /* The upload lane (async steps): a pair's copies wait for used (what the stream held
         * when the steps left that pair), and the stream for upd (the copies). */
        cudaStream_t up;
        cudaEvent_t used[2], upd[2];
        size_t dyn_off;
        CuMeta meta;
        const uint32_t *flash_tasks; /* device: meta array 7 */
        uint32_t n_flash;            /* flash tasks of the tile being run */

        /* results and host sampling */
        int32_t *ids_h;
        float *row_h, *sample_f;
        int32_t *sample_i;
        Row rows[TILE_ROWS];

        /* sampling: (TILE_OUT) parameters then (PEN_MAX) penalty pairs, pinned and on the
         * device; the raw logits under the penalties while the kernel runs */
        CuSampleParams *samp_h, *samp_d;
        uint2 *pen_h, *pen_d;
        float *pen_saved;
        bool host_row[TILE_OUT]; /* logits rows sampled on the host */

        /* paged KV cache: (layer, block, block_tokens, kv_dim), block n_blocks is the pad */
        __half *kc, *vc;
        uint32_t block_tokens, n_blocks;

        cudaGraphExec_t graphs[N_BUCKETS][2]; /* by bucket, then the pair its reads are of */
        cudaGraphExec_t graph_screen[2];      /* one row, screened (screen_step), by pair */
        /* Steps submitted, a ring of three: up to two outstanding, and the newest still
         * readable after its collect, since the next submit may chain from it. */
        Pending pend[3];
        uint32_t last, n_pend;
        bool have_last;
        BkSeq *chain_seqs; /* (chain_cap) a step with its chained tokens resolved */
        int32_t *chain_tok;
        uint32_t chain_cap;
        CuRoute route;    /* MoE */
        CuStaging stage;  /* open during load() only */
        uint8_t *awq_raw; /* a checkpoint AWQ part on the device, before its repack */
        size_t awq_raw_bytes;
};

static int cuda_fail(DsError *err, cudaError_t e, const char *what)
{
        return ds_error(err, -EIO, "cuda backend: %s: %s", what, cudaGetErrorString(e));
}

#define CU_TRY(call, what)                                                                         \
        do {                                                                                       \
                cudaError_t _e = (call);                                                           \
                if (_e != cudaSuccess)                                                             \
                        return cuda_fail(err, _e, what);                                           \
        } while (0)

static uint32_t div_up(uint32_t a, uint32_t b)
{
        return (a + b - 1) / b;
}

/* Numbers per position per layer in the K cache (MLA: the latent row, and no V cache). */
static size_t kv_dim(const BkConfig *c)
{
        if (bk_is_mla(c))
                return (size_t) c->mla.kv_lora_rank + c->mla.qk_rope_dim;
        return (size_t) c->n_kv_heads * c->head_dim;
}

/* The width of the query scratch per row: q, or MLA's latent queries. */
static size_t q_width(const BkConfig *c)
{
        if (bk_is_mla(c))
                return (size_t) c->n_heads * kv_dim(c);
        return (size_t) c->n_heads * c->head_dim;
}

/* Every linear of a layer that linear() runs, for the loops over them. */
static void layer_linears(CuLayer *L, CuLinear *out[8])
{
        CuLinear *all[8] = {&L->qkv, &L->o, &L->gate_up, &L->down, &L->q_b, &L->router, &L->s_gu,
                &L->s_down};
        memcpy(out, all, sizeof(all));
}

/* ---------------------------------------------------------------------------------------
 * Device memory */

static void dfree(void *p)
{
        if (p)
                cudaFree(p);
}

static int dalloc(void **p, size_t bytes, const char *what, DsError *err)
{
        cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
        if (e != cudaSuccess) {
                *p = NULL;
                return ds_error(err, -ENOMEM, "cuda backend: %zu bytes for %s: %s", bytes, what,
                        cudaGetErrorString(e));
        }
        return 0;
}

#define DALLOC(ptr, bytes, what)                                                                   \
        do {                                                                                       \
                int _r = dalloc((void **) &(ptr), (bytes), (what), err);                           \
                if (_r < 0)                                                                        \
                        return _r;                                                                 \
        } while (0)

static void linear_free(CuLinear *l)
{
        dfree(l->qw);
        dfree(l->sz);
        dfree(l->w);
        dfree(l->q8w);
        dfree(l->q8s);
        dfree(l->bias);
        *l = (CuLinear){};
}

static void graphs_free(Backend *b)
{
        for (int i = 0; i <= N_BUCKETS; i++)
                for (int k = 0; k < 2; k++) {
                        cudaGraphExec_t *g = i < N_BUCKETS ? &b->graphs[i][k] : &b->graph_screen[k];
                        if (*g) {
                                cudaGraphExecDestroy(*g);
                                *g = NULL;
                        }
                }
}

static void kv_free(Backend *b)
{
        graphs_free(b); /* they point into the cache */
        dfree(b->kc);
        dfree(b->vc);
        b->kc = b->vc = NULL;
        b->n_blocks = 0;
}

static void awq_raw_free(Backend *b)
{
        dfree(b->awq_raw);
        b->awq_raw = NULL;
        b->awq_raw_bytes = 0;
}

static void weights_free(Backend *b)
{
        graphs_free(b);
        if (b->layers)
                for (uint32_t l = 0; l < b->cfg.n_layers; l++) {
                        CuLayer *L = &b->layers[l];
                        CuLinear *lins[8];
                        layer_linears(L, lins);
                        for (size_t i = 0; i < ELEMENTSOF(lins); i++)
                                linear_free(lins[i]);
                        /* the one-slice views share the experts' memory */
                        linear_free(&L->e_gu);
                        linear_free(&L->e_down);
                        void *p[] = {L->attn_norm, L->mlp_norm, L->q_a_norm, L->kv_a_norm, L->wk,
                                L->wvt, L->score_bias};
                        for (size_t i = 0; i < ELEMENTSOF(p); i++)
                                dfree(p[i]);
                }
        free(b->layers);
        b->layers = NULL;
        linear_free(&b->lm_head);
        linear_free(&b->head_q8);
        dfree(b->screen_tlo);
        dfree(b->screen_thi);
        b->screen_tlo = b->screen_thi = NULL;
        dfree(b->embed);
        dfree(b->final_norm);
        dfree(b->inv_freq);
        awq_raw_free(b);
        void *scratch[] = {b->x, b->xn, b->q, b->att, b->hb, b->part, b->acc, b->logits, b->ml,
                b->w16, b->ids_d, b->meta_db[0], b->meta_db[1], b->samp_db[0], b->samp_db[1],
                b->pen_saved, b->xq, b->olat,
                b->epart, b->edpart, b->ehb, b->ridx, b->eids, b->eoff, b->elist, b->rw, b->moe_y,
                b->spart, b->rlog, b->qx.items, b->qx.recs, b->qx_res.ss, b->hq.items, b->hq.recs,
                /* an MLA model's own (scratch_alloc), else b->qx's */
                b->qx_res.items != b->qx.items ? b->qx_res.items : NULL,
                b->qx_res.recs != b->qx.recs ? b->qx_res.recs : NULL, b->res_count};
        for (size_t i = 0; i < ELEMENTSOF(scratch); i++)
                dfree(scratch[i]);
        b->qx = b->qx_res = b->hq = CuQx{};
        b->res_count = NULL;
        b->qx_live = b->qx_deferred = false;
        for (int i = 0; i < 2; i++) {
                cudaFreeHost(b->meta_hb[i]);
                cudaFreeHost(b->samp_hb[i]);
                b->meta_hb[i] = b->meta_db[i] = NULL;
                b->samp_hb[i] = b->samp_db[i] = NULL;
        }
        cudaFreeHost(b->ids_h);
        /* what was outstanding went with the model's scratch */
        b->n_pend = 0;
        b->have_last = false;
        free(b->row_h);
        free(b->sample_f);
        free(b->sample_i);
        b->embed = NULL;
        b->final_norm = b->inv_freq = NULL;
        b->x = b->q = b->part = b->acc = b->logits = NULL;
        b->xn = b->att = b->hb = b->w16 = NULL;
        b->ml = NULL;
        b->ids_d = NULL;
        b->epart = b->edpart = b->rw = b->moe_y = b->spart = b->rlog = NULL;
        b->xq = b->olat = b->ehb = NULL;
        b->ridx = b->eids = b->eoff = b->elist = NULL;
        b->meta_d = b->meta_h = NULL;
        b->ids_h = NULL;
        b->samp_h = b->samp_d = NULL;
        b->pen_h = b->pen_d = NULL;
        b->pen_saved = NULL;
        b->row_h = b->sample_f = NULL;
        b->sample_i = NULL;
        b->model = NULL;
}

/* ---------------------------------------------------------------------------------------
 * Uploading the weights */

/* A float32 copy of n elements of t, on the device. */
static int upload_f32(const BkTensor *t, size_t n, float **ret, const char *what, DsError *err)
{
        float *h = (float *) malloc(n * sizeof(float));
        if (!h)
                return ds_error(err, -ENOMEM, "cuda backend: out of memory for %s", what);
        for (size_t i = 0; i < n; i++)
                h[i] = cpu_tensor_get(*t, i);
        int r = dalloc((void **) ret, n * sizeof(float), what, err);
        if (r == 0) {
                cudaError_t e = cudaMemcpy(*ret, h, n * sizeof(float), cudaMemcpyHostToDevice);
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, what);
        }
        free(h);
        return r;
}

/* dst (device) = src (host) on the backend's stream: through the NUMA-placed pinned
 * staging during load(), else directly (the test hooks); src may be reused on return. */
static int h2d(Backend *b, void *dst, const void *src, size_t bytes, const char *what,
        DsError *err)
{
        if (b->stage.buf[0])
                return cu_staging_copy(&b->stage, b->st, dst, src, bytes, err);
        CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, b->st), what);
        CU_TRY(cudaStreamSynchronize(b->st), what);
        return 0;
}

/* rows x cols of t as FP16 into dst (device) with row stride ld, zero beyond cols. */
static int upload_f16_rows(Backend *b, const BkTensor *t, size_t rows, uint32_t cols, uint32_t ld,
        __half *dst, const char *what, DsError *err)
{
        if (t->dtype == BK_DT_F16 && ld == cols)
                return h2d(b, dst, t->data, rows * cols * 2, what, err);
        /* Other dtypes and padded rows: convert through a host buffer of a few MB. */
        size_t chunk = MAX((size_t) 1, ((size_t) 4 << 20) / ld);
        uint16_t *h = (uint16_t *) calloc(chunk * ld, 2);
        if (!h)
                return ds_error(err, -ENOMEM, "cuda backend: out of memory for %s", what);
        for (size_t r0 = 0; r0 < rows; r0 += chunk) {
                size_t n = MIN(chunk, rows - r0);
                for (size_t r = 0; r < n; r++)
                        for (uint32_t c = 0; c < cols; c++) {
                                __half v = __float2half(cpu_tensor_get(*t, (r0 + r) * cols + c));
                                memcpy(&h[r * ld + c], &v, 2);
                        }
                int r = h2d(b, dst + r0 * ld, h, n * ld * 2, what, err);
                if (r < 0) {
                        free(h);
                        return r;
                }
        }
        free(h);
        return 0;
}

/* b->awq_raw of at least bytes (the device side of the load's AWQ work). */
static int raw_reserve(Backend *b, size_t bytes, DsError *err)
{
        if (b->awq_raw_bytes >= bytes)
                return 0;
        awq_raw_free(b);
        int r = dalloc((void **) &b->awq_raw, bytes, "AWQ staging", err);
        if (r == 0)
                b->awq_raw_bytes = bytes;
        return r;
}

/* Repacks the AWQ part p into l (device storage already there) at column n_off. The part
 * goes up into one device buffer kept for the whole load: the stream orders each copy after
 * the previous part's repack, so nothing waits here and the host can fill the pinned staging
 * with the next part while the GPU copies and repacks this one. */
static int awq_repack_part(Backend *b, const CuLinear *l, const BkLinear *p, uint32_t n_off,
        const char *what, DsError *err)
{
        uint32_t groups = p->in / p->group_size;
        size_t qb = (size_t) p->in * p->out / 2, zb = (size_t) groups * p->out / 2;
        size_t sb = (size_t) groups * p->out * 2;
        int r;

        if ((r = raw_reserve(b, qb + zb + sb, err)) < 0)
                return r;
        uint8_t *raw = b->awq_raw;
        if ((r = h2d(b, raw, p->qweight, qb, what, err)) < 0 ||
                (r = h2d(b, raw + qb, p->qzeros, zb, what, err)) < 0 ||
                (r = h2d(b, raw + qb + zb, p->scales, sb, what, err)) < 0)
                return r;
        cu_awq_repack(b->st, l, (const uint32_t *) raw, (const uint32_t *) (raw + qb),
                (const __half *) (raw + qb + zb), p->out, n_off);
        CU_TRY(cudaGetLastError(), what);
        return 0;
}

/* Repacks AWQ parts[0..n_parts) (same input, outputs concatenated) into l's weight memory,
 * already allocated for l->out columns. */
static int awq_repack_parts(Backend *b, const BkLinear *const *parts, uint32_t n_parts,
        const CuLinear *l, const char *what, DsError *err)
{
        uint32_t n_off = 0;
        int r = 0;

        for (uint32_t i = 0; i < n_parts && r == 0; i++) {
                r = awq_repack_part(b, l, parts[i], n_off, what, err);
                n_off += parts[i]->out;
        }
        return r;
}

/* An AWQ gate|up, a dense MLP's or one MoE expert's (no bias, halves of whole tiles), gets
 * its tiles paired, so that its GEMV can end in the swiglu (cu_gemv_gate_up,
 * cu_gemv_experts): one launch a layer fewer at decode. */
static int pair_gate_up(Backend *b, CuLinear *gu, const char *what, DsError *err)
{
        if (!gu->awq || gu->bias || (gu->out / 2) % 16 != 0)
                return 0;
        size_t qb, zb;
        cu_awq_sizes(gu->in, gu->out, gu->group_size, &qb, &zb);
        int r = raw_reserve(b, qb + zb, err);
        if (r < 0)
                return r;
        CU_TRY(cu_awq_pair_tiles(b->st, gu, b->awq_raw), what);
        return 0;
}

/* An AWQ q|k|v whose heads are whole tile pairs gets the halves of each head paired, so
 * that its GEMV can end in the rope (cu_gemv_qkv_rope). */
static int pair_qkv_rope(Backend *b, CuLinear *qkv, const char *what, DsError *err)
{
        uint32_t hd = b->cfg.head_dim;
        if (!qkv->awq || hd % 32 != 0 || qkv->out % hd != 0)
                return 0;
        size_t qb, zb;
        cu_awq_sizes(qkv->in, qkv->out, qkv->group_size, &qb, &zb);
        int r = raw_reserve(b, qb + zb, err);
        if (r < 0)
                return r;
        CU_TRY(cu_awq_rope_tiles(b->st, qkv, b->awq_raw, hd / 16), what);
        return 0;
}

/* Uploads parts[0..n_parts) (same input, outputs concatenated) as one device linear. */
static int upload_linear(Backend *b, const BkLinear *const *parts, uint32_t n_parts,
        bool split, CuLinear *l, const char *what, DsError *err)
{
        const BkLinear *p0 = parts[0];
        uint32_t N = 0;
        bool any_bias = false;
        int r = 0;

        if (p0->kind == BK_LINEAR_Q8)
                return ds_error(err, -DS_ERR_UNSUPPORTED,
                        "cuda backend: %s: 8-bit weights are for the lm_head only", what);
        for (uint32_t i = 0; i < n_parts; i++) {
                if (parts[i]->kind != p0->kind || parts[i]->in != p0->in ||
                        (p0->kind == BK_LINEAR_AWQ && parts[i]->group_size != p0->group_size))
                        return ds_error(err, -DS_ERR_UNSUPPORTED,
                                "cuda backend: %s: fused parts of different kinds", what);
                N += parts[i]->out;
                any_bias = any_bias || parts[i]->bias.data;
        }
        *l = (CuLinear){};
        l->awq = p0->kind == BK_LINEAR_AWQ;
        l->in = p0->in;
        l->out = N;

        if (l->awq) {
                if (p0->in % 32 != 0 || p0->group_size % 32 != 0)
                        return ds_error(err, -DS_ERR_UNSUPPORTED,
                                "cuda backend: %s: AWQ needs in and group size multiples of 32",
                                what);
                l->group_size = p0->group_size;
                l->splits = split ? cu_awq_splits(b->n_sm, N, l->in, 1) : 1;
                size_t qw_bytes, sz_bytes;
                cu_awq_sizes(l->in, N, l->group_size, &qw_bytes, &sz_bytes);
                DALLOC(l->qw, qw_bytes, what);
                DALLOC(l->sz, sz_bytes, what);
                r = awq_repack_parts(b, parts, n_parts, l, what, err);
        } else {
                l->kp = (p0->in + 7) / 8 * 8;
                l->splits = split ? cu_dense_splits(b->n_sm, N, l->kp) : 1;
                /* No cudaMemset of the padding: on the legacy stream it is not ordered
                 * with the staged copies on b->st and could land after them, zeroing rows
                 * (seen as text differing between concurrent daemons); the padded host rows
                 * carry the zeros. */
                DALLOC(l->w, (size_t) N * l->kp * 2, what);
                uint32_t n_off = 0;
                for (uint32_t i = 0; i < n_parts && r == 0; i++) {
                        r = upload_f16_rows(b, &parts[i]->w, parts[i]->out, l->in, l->kp,
                                l->w + (size_t) n_off * l->kp, what, err);
                        n_off += parts[i]->out;
                }
        }
        if (r < 0 || !any_bias)
                return r;

        float *bias = (float *) calloc(N, sizeof(float));
        if (!bias)
                return ds_error(err, -ENOMEM, "cuda backend: out of memory for %s", what);
        uint32_t n_off = 0;
        for (uint32_t i = 0; i < n_parts; i++) {
                if (parts[i]->bias.data)
                        for (uint32_t o = 0; o < parts[i]->out; o++)
                                bias[n_off + o] = cpu_tensor_get(parts[i]->bias, o);
                n_off += parts[i]->out;
        }
        r = dalloc((void **) &l->bias, N * sizeof(float), what, err);
        if (r == 0) {
                cudaError_t e = cudaMemcpy(l->bias, bias, N * sizeof(float), cudaMemcpyHostToDevice);
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, what);
        }
        free(bias);
        return r;
}

/* The 8-bit linear p (BK_LINEAR_Q8, the lm_head) into l: its weights in k_gemv_q8's layout,
 * each byte biased by 128, rows past N as zeros, and the FP16 copy of the rounded weights
 * that cuBLAS multiplies above 16 rows. */
static int upload_q8(Backend *b, const BkLinear *p, CuLinear *l, const char *what, DsError *err)
{
        uint32_t K = p->in, N = p->out, gs = p->group_size;
        if (K % 32 != 0 || (gs != 32 && gs != 64 && gs != 128) || K % gs != 0 || p->bias.data)
                return ds_error(err, -DS_ERR_UNSUPPORTED,
                        "cuda backend: %s: 8-bit weights need in a multiple of 32, groups of "
                        "32, 64 or 128 and no bias (in %u, group %u)",
                        what, K, gs);
        size_t tiles = div_up(N, 16), nb = K / 32, groups = K / gs, tile_bytes = nb * 512;
        *l = (CuLinear){};
        l->in = K;
        l->out = N;
        l->kp = K;
        l->group_size = gs;
        l->splits = 1;
        DALLOC(l->q8w, tiles * tile_bytes, what);
        DALLOC(l->q8s, tiles * groups * 16 * sizeof(float), what);
        DALLOC(l->w, (size_t) N * K * 2, what);

        float *s = (float *) calloc(tiles * groups * 16, sizeof(float));
        size_t chunk = MAX((size_t) 1, ((size_t) 16 << 20) / tile_bytes);
        uint8_t *h = (uint8_t *) malloc(MIN(chunk, tiles) * tile_bytes);
        int r = s && h ? 0 : ds_error(err, -ENOMEM, "cuda backend: out of memory for %s", what);
        for (size_t n = 0; n < N && r == 0; n++)
                for (size_t gi = 0; gi < groups; gi++)
                        s[(n / 16 * groups + gi) * 16 + n % 16] = p->q8_scales[n * groups + gi];
        if (r == 0)
                r = h2d(b, l->q8s, s, tiles * groups * 16 * sizeof(float), what, err);
        for (size_t t0 = 0; t0 < tiles && r == 0; t0 += chunk) {
                size_t n_tiles = MIN(chunk, tiles - t0);
                for (size_t tt = 0; tt < n_tiles; tt++)
                        for (uint32_t row = 0; row < 16; row++) {
                                size_t n = (t0 + tt) * 16 + row;
                                const int8_t *src = n < N ? p->q8 + n * K : NULL;
                                uint8_t *dst = h + tt * tile_bytes + (row % 8) * 64 + (row / 8) * 8;
                                for (size_t c = 0; c < nb; c++)
                                        for (uint32_t t = 0; t < 4; t++) {
                                                /* q + 128 of a two's complement byte is q ^ 0x80 */
                                                uint64_t v = 0;
                                                if (src)
                                                        memcpy(&v, src + c * 32 + 8 * t, 8);
                                                v ^= 0x8080808080808080ull;
                                                memcpy(dst + c * 512 + t * 16, &v, 8);
                                        }
                        }
                r = h2d(b, (uint8_t *) l->q8w + t0 * tile_bytes, h, n_tiles * tile_bytes, what,
                        err);
        }
        free(s);
        free(h);
        if (r == 0)
                cu_q8_dequant(b->st, l, l->w);
        return r;
}

/* Dequantizes every AWQ linear once into a resident FP16 (N, K) copy that the cuBLAS path
 * (more than GEMV_MAX_ROWS rows) multiplies directly, instead of dequantizing per step;
 * only when all of them fit in half of the free memory, so the KV cache keeps room. */
static int fp16_copies(Backend *b, DsError *err)
{
        size_t free_b, total_b, need = 0;
        CU_TRY(cudaMemGetInfo(&free_b, &total_b), "memory info");
        for (uint32_t l = 0; l < b->cfg.n_layers; l++) {
                CuLinear *all[8];
                layer_linears(&b->layers[l], all);
                for (size_t i = 0; i < ELEMENTSOF(all); i++)
                        if (all[i]->awq)
                                need += (size_t) all[i]->out * all[i]->in * 2;
        }
        if (need > free_b / 2)
                return 0;
        for (uint32_t l = 0; l < b->cfg.n_layers; l++) {
                CuLinear *all[8];
                layer_linears(&b->layers[l], all);
                for (size_t i = 0; i < ELEMENTSOF(all); i++) {
                        CuLinear *x = all[i];
                        if (!x->awq)
                                continue;
                        DALLOC(x->w, (size_t) x->out * x->in * 2, "FP16 weight copy");
                        x->kp = x->in;
                        cu_awq_dequant(b->st, x, x->w);
                }
        }
        CU_TRY(cudaStreamSynchronize(b->st), "FP16 weight copies");
        return 0;
}

/* What the kernels hold, beyond what bk_model_check verifies. */
static int model_check(const BkModel *m, DsError *err)
{
        const BkConfig *c = &m->cfg;
        int r = bk_model_check(m, err);

        if (r < 0)
                return r;
        if (m->lm_head.bias.data)
                return ds_error(err, -DS_ERR_UNSUPPORTED, "lm_head with a bias");
        if (c->hidden > 8192)
                return ds_error(err, -DS_ERR_UNSUPPORTED, "hidden %u: not what the kernels hold",
                        c->hidden);
        if (!bk_is_mla(c)) {
                /* The attention kernel reads keys 16 bytes at a time (at most 32 lanes a
                 * key) and values 8 bytes at a time (at most 64 lanes a row). */
                if (c->n_heads / c->n_kv_heads > ATT_GROUP_MAX || c->head_dim % 8 != 0 ||
                        c->head_dim > 2 * ATT_CHUNK)
                        return ds_error(err, -DS_ERR_UNSUPPORTED,
                                "%u query heads per KV head or head_dim %u: not what the "
                                "kernels hold",
                                c->n_heads / c->n_kv_heads, c->head_dim);
                return 0;
        }
        const BkMlaConfig *a = &c->mla;
        const BkMoeConfig *mc = &c->moe;
        uint32_t W = a->kv_lora_rank + a->qk_rope_dim;
        if (a->kv_lora_rank > MLA_RANK_MAX || a->kv_lora_rank % 64 != 0 || W > MLA_WIDTH_MAX ||
                W % 16 != 0 || a->v_head_dim > 1024 || a->v_head_dim % 16 != 0 ||
                a->qk_nope_dim > 256 || a->qk_nope_dim % 16 != 0 || a->q_lora_rank % 16 != 0)
                return ds_error(err, -DS_ERR_UNSUPPORTED,
                        "MLA with q_lora_rank %u, kv_lora_rank %u, qk_nope_head_dim %u, "
                        "qk_rope_head_dim %u, v_head_dim %u: not what the kernels hold",
                        a->q_lora_rank, a->kv_lora_rank, a->qk_nope_dim, a->qk_rope_dim,
                        a->v_head_dim);
        if (mc->n_routed > 256 || mc->n_group > 32 || mc->n_shared > 16)
                return ds_error(err, -DS_ERR_UNSUPPORTED,
                        "%u routed experts in %u groups and %u shared: the router holds at most "
                        "256 in 32, and 16 shared",
                        mc->n_routed, mc->n_group, mc->n_shared);
        for (uint32_t l = 0; l < c->n_layers; l++) {
                const BkMoe *moe = &m->layers[l].moe;
                for (uint32_t e = 0; moe->experts && e < mc->n_routed; e++) {
                        const BkExpert *x = &moe->experts[e], *x0 = &moe->experts[0];
                        const BkLinear *all[] = {&x->gate, &x->up, &x->down};
                        for (size_t i = 0; i < ELEMENTSOF(all); i++)
                                if (all[i]->kind != BK_LINEAR_AWQ || all[i]->bias.data ||
                                        all[i]->group_size != (i < 2 ? x0->gate.group_size
                                                                     : x0->down.group_size))
                                        return ds_error(err, -DS_ERR_UNSUPPORTED,
                                                "layer %u expert %u: the expert kernels take AWQ "
                                                "experts of one group size, without bias",
                                                l, e);
                }
                const BkExpert *sh = &moe->shared, *x0 = moe->experts;
                if (moe->experts && mc->n_shared &&
                        (sh->gate.kind != BK_LINEAR_AWQ || sh->up.kind != BK_LINEAR_AWQ ||
                                sh->down.kind != BK_LINEAR_AWQ || sh->gate.bias.data ||
                                sh->up.bias.data || sh->down.bias.data ||
                                sh->gate.group_size != x0->gate.group_size ||
                                sh->up.group_size != x0->gate.group_size ||
                                sh->down.group_size != x0->down.group_size ||
                                mc->expert_dim % 8 != 0 ||
                                mc->expert_dim % sh->down.group_size != 0))
                        return ds_error(err, -DS_ERR_UNSUPPORTED,
                                "layer %u: the shared experts run as %u more experts: they must "
                                "be AWQ of the routed experts' group sizes, without bias",
                                l, mc->n_shared);
        }
        return 0;
}

/* Plans the next step into staging pair i. */
static void stage_use(Backend *b, uint32_t i)
{
        b->pair = i;
        b->meta_h = b->meta_hb[i];
        b->samp_h = b->samp_hb[i];
        b->pen_h = (uint2 *) (b->samp_h + TILE_OUT);
        b->samp_d = b->samp_db[i];
        b->pen_d = (uint2 *) (b->samp_d + TILE_OUT);
        b->meta_d = b->meta_db[i];
        if (!b->meta_d) /* sampling alone (cuda_test_sample) */
                return;
        const uint32_t *m = b->meta_d;
        size_t R = TILE_ROWS;
        b->meta = (CuMeta){
                .base = m,
                .tokens = (const int32_t *) (m + 4),
                .pos = m + 4 + R,
                .slot = m + 4 + 2 * R,
                .row_bt = m + 4 + 3 * R,
                .row_items = (const uint2 *) (m + 4 + 4 * R),
                .out_row = m + 4 + 6 * R,
        };
        b->flash_tasks = m + 4 + 7 * R;
}

/* The sampling buffers, for the TILE_OUT logits rows of a tile. */
static int sample_alloc(Backend *b, DsError *err)
{
        const BkConfig *c = &b->cfg;

        if (c->vocab_sample > SM_VOCAB_MAX)
                return ds_error(err, -DS_ERR_UNSUPPORTED,
                        "cuda backend: %u sampled ids, the sampler takes at most %u",
                        c->vocab_sample, SM_VOCAB_MAX);
        size_t samp_bytes = TILE_OUT * sizeof(CuSampleParams) + (size_t) PEN_MAX * sizeof(uint2);
        DALLOC(b->pen_saved, (size_t) PEN_MAX * 4, "penalized logits");
        for (int i = 0; i < 2; i++) {
                DALLOC(b->samp_db[i], samp_bytes, "sampling parameters");
                CU_TRY(cudaMallocHost((void **) &b->samp_hb[i], samp_bytes),
                        "pinned sampling parameters");
        }
        stage_use(b, 0);
        b->row_h = (float *) malloc((size_t) c->vocab_size * 4);
        b->sample_f = (float *) malloc((size_t) c->vocab_size * 4);
        b->sample_i = (int32_t *) malloc((size_t) c->vocab_size * 4);
        if (!b->row_h || !b->sample_f || !b->sample_i)
                return ds_error(err, -ENOMEM, "cuda backend: out of memory for sampling");
        return 0;
}

/* Creates the shared experts' lane, or what a load before did not; it lives until
 * cuda_free, across reloads. */
static int side_lane(Backend *b, DsError *err)
{
        if (!b->side)
                CU_TRY(cudaStreamCreateWithFlags(&b->side, cudaStreamNonBlocking),
                        "shared experts' stream");
        if (!b->fork)
                CU_TRY(cudaEventCreateWithFlags(&b->fork, cudaEventDisableTiming),
                        "shared experts' fork");
        if (!b->join)
                CU_TRY(cudaEventCreateWithFlags(&b->join, cudaEventDisableTiming),
                        "shared experts' join");
        if (!b->side_ws)
                DALLOC(b->side_ws, BLAS_WS, "shared experts' cuBLAS workspace");
        if (b->side_blas)
                return 0;
        if (cublasCreate(&b->side_blas) != CUBLAS_STATUS_SUCCESS) {
                b->side_blas = NULL;
                return ds_error(err, -EIO, "cuda backend: no cuBLAS handle for the shared experts");
        }
        if (cublasSetStream(b->side_blas, b->side) != CUBLAS_STATUS_SUCCESS ||
                cublasSetWorkspace(b->side_blas, b->side_ws, BLAS_WS) != CUBLAS_STATUS_SUCCESS) {
                cublasDestroy(b->side_blas);
                b->side_blas = NULL;
                return ds_error(err, -EIO,
                        "cuda backend: cuBLAS setup of the shared experts' lane failed");
        }
        return 0;
}

/* Swaps the shared experts' lane with the main one: linear() and the launchers take b->st
 * and b->blas, so the shared experts' calls between two swaps go to the side stream. */
static void swap_lane(Backend *b)
{
        cudaStream_t st = b->st;
        cublasHandle_t h = b->blas;
        b->st = b->side;
        b->blas = b->side_blas;
        b->side = st;
        b->side_blas = h;
}

/* Stream `to` waits for what `from` has issued so far (an edge of the captured graph). */
static void lane_wait(Backend *b, cudaEvent_t ev, cudaStream_t from, cudaStream_t to)
{
        cudaError_t e = cudaEventRecord(ev, from);
        if (e == cudaSuccess)
                e = cudaStreamWaitEvent(to, ev, 0);
        if (e != cudaSuccess && b->side_err == cudaSuccess)
                b->side_err = e;
}

/* cu_res_plan for l, or the plan of like, a linear of the same shape planned before (the
 * layers repeat a few shapes, and each plan asks the occupancy of 8 launches). */
static void res_plan_like(CuLinear *l, const CuLinear **like, bool wide)
{
        const CuLinear *p = *like;
        if (p && p->in == l->in && p->out == l->out && p->group_size == l->group_size) {
                l->res_splits = p->res_splits;
                l->res_kw = p->res_kw;
                return;
        }
        cu_res_plan(l, wide);
        *like = l;
}

/* Which o and down linears end in the residual add and the next norm's quantization at one
 * row (cu_gemv_res): those of dense layers whose next linear (gate|up, the next layer's
 * q|k|v) takes quantized rows. Returns whether any does. */
static bool res_plan(Backend *b)
{
        const CuLinear *o_like = NULL, *down_like = NULL;
        bool any = false;
        for (uint32_t l = 0; l < b->cfg.n_layers; l++) {
                CuLayer *L = &b->layers[l];
                if (L->router.out || b->mla)
                        continue;
                if (cu_qx_takes(&L->gate_up, 1, b->qx.chunks))
                        res_plan_like(&L->o, &o_like, true);
                const CuLayer *N = l + 1 < b->cfg.n_layers ? &b->layers[l + 1] : NULL;
                if (N && cu_qx_takes(&N->qkv, 1, b->qx.chunks))
                        res_plan_like(&L->down, &down_like, false);
                any = any || L->o.res_splits || L->down.res_splits;
        }
        return any;
}

/* Which MoE layers' down ends in the residual add and the next norm's quantization at one
 * row (cu_gemv_res_moe): those whose next layer's q|k|v takes quantized rows. Returns
 * whether any does. */
static bool moe_res_plan(Backend *b)
{
        const BkMoeConfig *mc = &b->cfg.moe;
        uint32_t pairs = mc->top_k + mc->n_shared, chunks = b->cfg.hidden / 64;
        const CuLinear *like = NULL;
        bool any = false;
        for (uint32_t l = 0; l + 1 < b->cfg.n_layers; l++) {
                CuLayer *L = &b->layers[l];
                if (!L->router.out || !cu_qx_takes(&b->layers[l + 1].qkv, 1, chunks))
                        continue;
                if (like) {
                        L->e_down.res_splits = like->res_splits;
                        L->e_down.res_kw = like->res_kw;
                } else if (cu_res_plan_moe(&L->e_down, pairs, 0)) {
                        like = &L->e_down;
                } else {
                        return false;
                }
                any = true;
        }
        return any;
}

/* b->hq for one row of n values (whole chunks of 64): 128 bytes of items a chunk and a
 * record each 16 k. */
static int hq_alloc(Backend *b, size_t n, DsError *err)
{
        b->hq.chunks = (uint32_t) (n / 64);
        int r = dalloc((void **) &b->hq.items, n * 2, "quantized mlp activations", err);
        if (r == 0)
                r = dalloc((void **) &b->hq.recs, n / 16 * sizeof(float2),
                        "quantized mlp activations' scales", err);
        return r;
}

static int scratch_alloc(Backend *b, DsError *err)
{
        const BkConfig *c = &b->cfg;
        size_t R = TILE_ROWS, q_dim = (size_t) c->n_heads * c->head_dim;
        size_t n_max = MAX((size_t) 2 * c->intermediate, q_dim + 2 * kv_dim(c));
        size_t k_max = MAX((size_t) MAX(c->hidden, c->intermediate), q_dim);
        size_t w16 = 0, part = R * n_max, inter = c->intermediate, att = q_dim;

        for (uint32_t l = 0; l < c->n_layers; l++) {
                CuLinear *all[8];
                layer_linears(&b->layers[l], all);
                for (size_t i = 0; i < ELEMENTSOF(all); i++) {
                        if (all[i]->awq)
                                w16 = MAX(w16, (size_t) all[i]->out * all[i]->in);
                        part = MAX(part, (size_t) GEMV_MAX_ROWS * all[i]->splits * all[i]->out);
                        part = MAX(part, R * all[i]->out);
                        k_max = MAX(k_max, (size_t) all[i]->in);
                }
        }
        if (b->lm_head.awq)
                w16 = MAX(w16, (size_t) b->lm_head.out * b->lm_head.in);
        for (uint32_t l = 0; l < c->n_layers; l++)
                inter = MAX(inter, (size_t) b->layers[l].s_gu.out / 2);
        if (b->mla) {
                att = MAX(att, (size_t) c->n_heads * c->mla.v_head_dim);
                part = MAX(part, (size_t) c->n_heads / 2 * c->hidden); /* cu_mla_out's slices */
        }

        DALLOC(b->x, R * c->hidden * 4, "residual");
        DALLOC(b->xn, R * k_max * 2, "normed rows");
        /* not in MLA models: V2-Lite batch 1 was 1.4% slower with it, even with the routing
         * add_norms left out (docs/PERF.md, fifteenth session), and still 0.8% slower in the
         * thirty-second session (run 10) */
        if (!b->mla && cu_add_norm_quantizes(1, c->hidden)) {
                b->qx.chunks = c->hidden / 64;
                DALLOC(b->qx.items, (size_t) QX_ROWS * b->qx.chunks * 128, "quantized rows");
                DALLOC(b->qx.recs, (size_t) QX_ROWS * b->qx.chunks * sizeof(float2),
                        "quantized rows' scales");
                if (b->qx.chunks <= QX_SS_CHUNKS && res_plan(b)) {
                        b->qx_res = b->qx;
                        b->qx_res.eps = c->rms_eps;
                        DALLOC(b->qx_res.ss, QX_SS_COPIES * QX_SS_CHUNKS * sizeof(float),
                                "quantized rows' sums of squares");
                        int r = c->intermediate % 64 == 0 ? hq_alloc(b, c->intermediate, err) : 0;
                        if (r < 0)
                                return r;
                }
        }
        /* An MLA model's add_norms leave their rows in FP16 (above), but where a MoE layer's
         * down ends in the next norm at one row (cu_gemv_res_moe), the next q|k|v takes its
         * quantized row, in place of the add_norm after the experts. */
        if (b->mla && b->moe && c->hidden % 64 == 0 && c->hidden / 64 <= QX_SS_CHUNKS &&
                moe_res_plan(b)) {
                b->qx_res.chunks = c->hidden / 64;
                b->qx_res.eps = c->rms_eps;
                DALLOC(b->qx_res.items, (size_t) b->qx_res.chunks * 128, "quantized row");
                DALLOC(b->qx_res.recs, b->qx_res.chunks * sizeof(float2), "quantized row's scales");
                DALLOC(b->qx_res.ss, QX_SS_COPIES * QX_SS_CHUNKS * sizeof(float),
                        "quantized row's sums of squares");
                DALLOC(b->res_count, b->qx_res.chunks * sizeof(uint32_t), "MoE down's counts");
                CU_TRY(cudaMemset(b->res_count, 0, b->qx_res.chunks * sizeof(uint32_t)),
                        "MoE down's counts");
        }
        DALLOC(b->q, R * q_width(c) * 4, "queries");
        DALLOC(b->att, R * att * 2, "attention output");
        DALLOC(b->hb, R * inter * 2, "mlp activations");
        DALLOC(b->part, part * 4, "partial sums");
        DALLOC(b->acc,
                (size_t) TILE_ITEMS * c->n_heads * (b->mla ? c->mla.kv_lora_rank : c->head_dim) * 4,
                "attention partials");
        DALLOC(b->ml, (size_t) TILE_ITEMS * c->n_heads * sizeof(float2), "attention maxima");
        DALLOC(b->logits, (size_t) TILE_OUT * c->vocab_size * 4, "logits");
        DALLOC(b->w16, w16 * 2, "dequantized weights");
        DALLOC(b->ids_d, TILE_OUT * 4, "ids");
        if (b->mla) {
                const BkMlaConfig *a = &c->mla;
                DALLOC(b->xq, R * MAX(a->q_lora_rank, 1u) * 2, "MLA q LoRA");
                DALLOC(b->olat, R * c->n_heads * a->kv_lora_rank * 2, "MLA latent outputs");
        }
        if (b->moe) {
                const BkMoeConfig *mc = &c->moe;
                size_t pairs = R * (mc->top_k + mc->n_shared), gsl = 1, dsl = 1;
                for (uint32_t l = 0; l < c->n_layers; l++) {
                        gsl = MAX(gsl, (size_t) b->layers[l].e_gu.splits);
                        dsl = MAX(dsl, (size_t) b->layers[l].e_down.splits);
                }
                size_t small = ((size_t) mc->n_routed + mc->n_shared) / 4; /* pairs of a sliced step */
                DALLOC(b->epart, MAX(pairs, small * gsl) * 2 * mc->expert_dim * 4, "expert partials");
                DALLOC(b->edpart, MAX(pairs, small * dsl) * c->hidden * 4, "expert partials");
                DALLOC(b->ehb, pairs * mc->expert_dim * 2, "expert activations");
                DALLOC(b->ridx, pairs * 4, "routing");
                DALLOC(b->rw, pairs * 4, "routing weights");
                DALLOC(b->elist, pairs * 4, "routing lists");
                /* slots: the experts, plus one per EXPERT_PASS pairs when experts split */
                size_t slots = (size_t) mc->n_routed + mc->n_shared + pairs / EXPERT_PASS;
                DALLOC(b->eoff, (slots + 1) * 4, "routing offsets");
                DALLOC(b->eids, slots * 4, "routing slots");
                DALLOC(b->moe_y, R * c->hidden * 4, "MoE outputs");
                DALLOC(b->rlog, R * mc->n_routed * 4, "router logits");
                if (mc->n_shared) {
                        size_t sp = 0;
                        for (uint32_t l = 0; l < c->n_layers; l++) {
                                const CuLinear *sl[] = {&b->layers[l].s_gu, &b->layers[l].s_down};
                                for (size_t i = 0; i < ELEMENTSOF(sl); i++)
                                        sp = MAX(sp, MAX(R, (size_t) GEMV_MAX_ROWS * sl[i]->splits) *
                                                        sl[i]->out);
                        }
                        DALLOC(b->spart, sp * 4, "shared experts' partial sums");
                        int r = side_lane(b, err);
                        if (r < 0)
                                return r;
                }
        }

        /* meta: header, eight arrays of rows, then items and block tables */
        b->dyn_off = (4 + 8 * R + 3) / 4 * 4;
        size_t words = b->dyn_off + 4 * (size_t) TILE_ITEMS + TILE_BT;
        for (int i = 0; i < 2; i++) {
                DALLOC(b->meta_db[i], words * 4, "step metadata");
                CU_TRY(cudaMallocHost((void **) &b->meta_hb[i], words * 4), "pinned step metadata");
        }
        CU_TRY(cudaMallocHost((void **) &b->ids_h, TILE_OUT * 4), "pinned ids");
        return sample_alloc(b, err);
}

/* kv_b_proj → W_UK and W_UV (cuda_deepseek.cuh), through an FP16 copy of the matrix. */
static int upload_kvb(Backend *b, const BkLinear *kv_b, CuLayer *D, const char *what, DsError *err)
{
        const BkConfig *c = &b->cfg;
        const BkMlaConfig *a = &c->mla;
        uint32_t H = c->n_heads, P = a->qk_nope_dim, V = a->v_head_dim, rank = a->kv_lora_rank;
        const BkLinear *parts[] = {kv_b};
        CuLinear t;
        __half *w16 = NULL;

        int r = upload_linear(b, parts, 1, false, &t, what, err);
        if (r == 0)
                r = dalloc((void **) &w16, (size_t) t.out * t.in * 2, what, err);
        if (r == 0 && t.awq)
                cu_awq_dequant(b->st, &t, w16);
        else if (r == 0 && cudaMemcpy2DAsync(w16, (size_t) t.in * 2, t.w, (size_t) t.kp * 2,
                                   (size_t) t.in * 2, t.out, cudaMemcpyDeviceToDevice,
                                   b->st) != cudaSuccess)
                r = ds_error(err, -EIO, "cuda backend: %s: copying kv_b_proj", what);
        if (r == 0)
                r = dalloc((void **) &D->wk, (size_t) H * P * rank * 2, what, err);
        if (r == 0)
                r = dalloc((void **) &D->wvt, (size_t) H * rank * V * 2, what, err);
        if (r == 0) {
                cu_mla_split_kvb(b->st, w16, H, P, V, rank, D->wk, D->wvt);
                cudaError_t e = cudaStreamSynchronize(b->st);
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, what);
        }
        dfree(w16);
        linear_free(&t);
        return r;
}

/* Columns c0 .. c0 + n of the AWQ linear l, as a linear of its own in fresh host memory
 * (qweight and qzeros pack 8 columns a word, so the column range is cut row by row). */
static BkLinear awq_columns(const BkLinear *l, uint32_t c0, uint32_t n)
{
        BkLinear x = *l;
        uint32_t groups = l->in / l->group_size, w = n / 8, lw = l->out / 8;
        uint32_t *qw = (uint32_t *) malloc((size_t) l->in * w * 4);
        uint32_t *qz = (uint32_t *) malloc((size_t) groups * w * 4);
        uint16_t *sc = (uint16_t *) malloc((size_t) groups * n * 2);

        x.out = n;
        x.qweight = qw;
        x.qzeros = qz;
        x.scales = sc;
        if (!qw || !qz || !sc) {
                free(qw);
                free(qz);
                free(sc);
                x.qweight = x.qzeros = NULL;
                x.scales = NULL;
                return x;
        }
        for (size_t k = 0; k < l->in; k++)
                memcpy(qw + k * w, l->qweight + k * lw + c0 / 8, (size_t) w * 4);
        for (size_t g = 0; g < groups; g++) {
                memcpy(qz + g * w, l->qzeros + g * lw + c0 / 8, (size_t) w * 4);
                memcpy(sc + g * n, l->scales + g * l->out + c0, (size_t) n * 2);
        }
        return x;
}

/* Shared expert j of width Dm: the shared MLP of n_shared * Dm is the sum of n_shared MLPs
 * on consecutive slices of its intermediate dimension (gate and up columns, down rows), so
 * each slice runs as one more expert with weight 1. The down rows need no copy. */
static BkExpert shared_slice(const BkExpert *sh, uint32_t j, uint32_t Dm)
{
        BkExpert x;
        uint32_t r0 = j * Dm, lw = sh->down.out / 8;

        x.gate = awq_columns(&sh->gate, r0, Dm);
        x.up = awq_columns(&sh->up, r0, Dm);
        x.down = sh->down;
        x.down.in = Dm;
        x.down.qweight = sh->down.qweight + (size_t) r0 * lw;
        x.down.qzeros = sh->down.qzeros + (size_t) r0 / sh->down.group_size * lw;
        x.down.scales = sh->down.scales + (size_t) r0 / sh->down.group_size * sh->down.out;
        return x;
}

static void shared_slice_free(BkExpert *x)
{
        free((void *) x->gate.qweight);
        free((void *) x->gate.qzeros);
        free((void *) x->gate.scales);
        free((void *) x->up.qweight);
        free((void *) x->up.qzeros);
        free((void *) x->up.scales);
}

/* The router and the experts of a MoE layer, one after another (see CuLayer): the routed
 * ones, then the shared ones in slices of expert_dim. */
static int upload_moe(Backend *b, const BkMoe *moe, CuLayer *D, const char *what, DsError *err)
{
        const BkConfig *c = &b->cfg;
        const BkMoeConfig *mc = &c->moe;
        const BkExpert *x0 = &moe->experts[0];
        uint32_t E = mc->n_routed, Dm = mc->expert_dim, hid = c->hidden;
        size_t qb, zb;
        int r;

        BkLinear router = {};
        router.kind = BK_LINEAR_DENSE;
        router.in = hid;
        router.out = E;
        router.w = moe->router;
        const BkLinear *rp[] = {&router};
        if ((r = upload_linear(b, rp, 1, true, &D->router, what, err)) < 0)
                return r;
        if (moe->score_bias.data && (r = upload_f32(&moe->score_bias, E, &D->score_bias, what, err)) < 0)
                return r;
        if (mc->n_shared) {
                const BkLinear *gu[] = {&moe->shared.gate, &moe->shared.up}, *dn[] = {&moe->shared.down};
                if ((r = upload_linear(b, gu, 2, true, &D->s_gu, what, err)) < 0 ||
                        (r = upload_linear(b, dn, 1, true, &D->s_down, what, err)) < 0)
                        return r;
        }

        struct {
                CuLinear *l;
                size_t *qw, *sz;
                uint32_t in, out, gs;
        } mats[] = {
                {&D->e_gu, &D->e_gu_qw, &D->e_gu_sz, hid, 2 * Dm, x0->gate.group_size},
                {&D->e_down, &D->e_down_qw, &D->e_down_sz, Dm, hid, x0->down.group_size},
        };
        for (size_t i = 0; i < ELEMENTSOF(mats); i++) {
                CuLinear *l = mats[i].l;
                *l = (CuLinear){};
                l->awq = true;
                l->in = mats[i].in;
                l->out = mats[i].out;
                l->group_size = mats[i].gs;
                if (l->in % 32 != 0 || l->group_size % 32 != 0)
                        return ds_error(err, -DS_ERR_UNSUPPORTED,
                                "cuda backend: %s: AWQ experts need in and group size multiples "
                                "of 32",
                                what);
                cu_awq_sizes(l->in, l->out, l->group_size, &qb, &zb);
                *mats[i].qw = qb / sizeof(uint4);
                *mats[i].sz = zb / sizeof(__half2);
                /* sized for the dense GEMV's 4-warp CTAs, although the expert GEMV's have
                 * 2: counted as the expert kernel's, V2-Lite's experts took 3 and 4 slices
                 * and batch 1 was 3.4% slower (docs/PERF.md, seventh session) */
                l->splits = cu_awq_splits(b->n_sm, l->out, l->in, mc->top_k);
                DALLOC(l->qw, qb * (E + mc->n_shared), what);
                DALLOC(l->sz, zb * (E + mc->n_shared), what);
        }
        for (uint32_t e = 0; e < E + mc->n_shared; e++) {
                BkExpert x = e < E ? moe->experts[e] : shared_slice(&moe->shared, e - E, Dm);
                const BkLinear *gu[] = {&x.gate, &x.up}, *dn[] = {&x.down};
                CuLinear vg = D->e_gu, vd = D->e_down;
                vg.qw += e * D->e_gu_qw;
                vg.sz += e * D->e_gu_sz;
                vd.qw += e * D->e_down_qw;
                vd.sz += e * D->e_down_sz;
                r = x.gate.qweight && x.up.qweight
                            ? 0
                            : ds_error(err, -ENOMEM, "cuda backend: %s: out of memory", what);
                if (r == 0)
                        r = awq_repack_parts(b, gu, 2, &vg, what, err);
                if (r == 0)
                        r = awq_repack_parts(b, dn, 1, &vd, what, err);
                if (e >= E)
                        shared_slice_free(&x);
                if (r < 0)
                        return r;
        }
        /* each expert's gate|up tiles in (gate, up) pairs, as a dense MLP's */
        for (uint32_t e = 0; e < E + mc->n_shared; e++) {
                CuLinear v = D->e_gu;
                v.qw += e * D->e_gu_qw;
                v.sz += e * D->e_gu_sz;
                if ((r = pair_gate_up(b, &v, what, err)) < 0)
                        return r;
                D->e_gu.pairs = v.pairs;
        }
        D->e_gu1 = D->e_gu;
        D->e_gu1.splits = 1;
        D->e_down1 = D->e_down;
        D->e_down1.splits = 1;
        return 0;
}

/* A DeepSeek layer: MLA projections, then the dense MLP or the MoE. */
static int upload_deepseek_layer(Backend *b, const BkLayer *L, CuLayer *D, const char *what,
        DsError *err)
{
        const BkMlaConfig *a = &b->cfg.mla;
        const BkLinear *qkv[] = {a->q_lora_rank ? &L->mla.q_a : &L->q, &L->mla.kv_a};
        const BkLinear *o[] = {&L->o}, *qb[] = {&L->mla.q_b};
        int r;

        if ((r = upload_linear(b, qkv, 2, true, &D->qkv, what, err)) < 0 ||
                (r = upload_linear(b, o, 1, true, &D->o, what, err)) < 0 ||
                (r = upload_f32(&L->mla.kv_a_norm, a->kv_lora_rank, &D->kv_a_norm, what, err)) < 0 ||
                (r = upload_kvb(b, &L->mla.kv_b, D, what, err)) < 0)
                return r;
        if (a->q_lora_rank &&
                ((r = upload_linear(b, qb, 1, true, &D->q_b, what, err)) < 0 ||
                        (r = upload_f32(&L->mla.q_a_norm, a->q_lora_rank, &D->q_a_norm, what, err)) < 0))
                return r;
        if (L->moe.experts)
                return upload_moe(b, &L->moe, D, what, err);
        const BkLinear *gu[] = {&L->gate, &L->up}, *down[] = {&L->down};
        if ((r = upload_linear(b, gu, 2, true, &D->gate_up, what, err)) < 0 ||
                (r = pair_gate_up(b, &D->gate_up, what, err)) < 0)
                return r;
        return upload_linear(b, down, 1, true, &D->down, what, err);
}

/* The screened lm_head's 8-bit copy, made on the device from the FP16 lm_head, where the
 * option and the shape allow it: half the lm_head's bytes again in memory, for greedy rows
 * that read half of them (screen_step). */
static int screen_upload(Backend *b, DsError *err)
{
        const CuLinear *h = &b->lm_head;
        uint32_t gs = cu_q8_group(h->in);
        if (!b->screen_opt || h->awq || h->q8w || !h->w || h->bias || h->splits != 1 ||
                !cu_q8_bounds_take(h->in) || !cu_screen_takes(h->in, h->kp, b->cfg.vocab_sample))
                return 0;
        CuLinear *q = &b->head_q8;
        size_t tiles = div_up(h->out, 16);
        *q = (CuLinear){};
        q->in = h->in;
        q->out = h->out;
        q->kp = h->in;
        q->group_size = gs;
        q->splits = 1;
        DALLOC(q->q8w, tiles * (h->in / 32) * 512, "screened lm_head");
        DALLOC(q->q8s, tiles * (h->in / gs) * 16 * sizeof(float), "screened lm_head");
        DALLOC(b->screen_tlo, tiles * sizeof(float), "screened lm_head");
        DALLOC(b->screen_thi, tiles * sizeof(float), "screened lm_head");
        cu_q8_from_dense(b->st, h->w, h->kp, q);
        CU_TRY(cudaGetLastError(), "screened lm_head");
        return 0;
}

static int weights_upload(Backend *b, const BkModel *m, DsError *err)
{
        const BkConfig *c = &m->cfg;
        char what[64];
        int r;

        DALLOC(b->embed, (size_t) c->vocab_size * c->hidden * 2, "embedding");
        r = upload_f16_rows(b, &m->embed, c->vocab_size, c->hidden, c->hidden, b->embed, "embedding",
                err);
        if (r < 0)
                return r;
        r = upload_f32(&m->final_norm, c->hidden, &b->final_norm, "final norm", err);
        if (r < 0)
                return r;
        const BkLinear *head[] = {&m->lm_head};
        if (m->lm_head.kind == BK_LINEAR_Q8)
                r = upload_q8(b, &m->lm_head, &b->lm_head, "lm_head", err);
        else
                r = upload_linear(b, head, 1, false, &b->lm_head, "lm_head", err);
        if (r == 0)
                r = screen_upload(b, err);
        if (r < 0)
                return r;

        b->layers = (CuLayer *) calloc(c->n_layers, sizeof(CuLayer));
        if (!b->layers)
                return ds_error(err, -ENOMEM, "cuda backend: out of memory");
        for (uint32_t l = 0; l < c->n_layers; l++) {
                const BkLayer *L = &m->layers[l];
                CuLayer *D = &b->layers[l];
                const BkLinear *qkv[] = {&L->q, &L->k, &L->v}, *o[] = {&L->o};
                const BkLinear *gu[] = {&L->gate, &L->up}, *down[] = {&L->down};

                snprintf(what, sizeof(what), "layer %u", l);
                if ((r = upload_f32(&L->attn_norm, c->hidden, &D->attn_norm, what, err)) < 0 ||
                        (r = upload_f32(&L->mlp_norm, c->hidden, &D->mlp_norm, what, err)) < 0)
                        return r;
                if (b->mla) {
                        if ((r = upload_deepseek_layer(b, L, D, what, err)) < 0)
                                return r;
                        continue;
                }
                if ((r = upload_linear(b, qkv, 3, true, &D->qkv, what, err)) < 0 ||
                        (r = pair_qkv_rope(b, &D->qkv, what, err)) < 0 ||
                        (r = upload_linear(b, o, 1, true, &D->o, what, err)) < 0 ||
                        (r = upload_linear(b, gu, 2, true, &D->gate_up, what, err)) < 0 ||
                        (r = pair_gate_up(b, &D->gate_up, what, err)) < 0 ||
                        (r = upload_linear(b, down, 1, true, &D->down, what, err)) < 0)
                        return r;
        }

        /* MLA ropes only the qk_rope_head_dim part */
        uint32_t rd = b->mla ? c->mla.qk_rope_dim : c->head_dim;
        float *inv_freq = (float *) calloc(rd / 2, sizeof(float));
        if (!inv_freq)
                return ds_error(err, -ENOMEM, "cuda backend: out of memory");
        r = cpu_rope_init(&c->rope, rd, inv_freq, &b->attention_factor, err);
        if (r == 0)
                r = dalloc((void **) &b->inv_freq, rd / 2 * 4, "rope", err);
        if (r == 0) {
                cudaError_t e = cudaMemcpy(b->inv_freq, inv_freq, rd / 2 * 4,
                        cudaMemcpyHostToDevice);
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, "rope");
        }
        free(inv_freq);
        return r;
}

/* ---------------------------------------------------------------------------------------
 * The forward pass */

/* The library-node bookkeeping of a capture (see pdl_edges). At a library call the stream
 * it goes to has one leaf (the shared experts' lane forks after a kernel of ours and joins
 * before one); LIB_DEPS bounds what is kept of it. */
#define LIB_DEPS 4

/* The capture's current leaves into deps; 0 when b->st is not being captured for
 * programmatic edges. */
static size_t capture_leaves(Backend *b, cudaGraphNode_t *deps)
{
        cudaStreamCaptureStatus cs;
        const cudaGraphNode_t *d = NULL;
        const cudaGraphEdgeData *ed = NULL;
        size_t n = 0;

        if (!b->pdl || b->lib_lost ||
                cudaStreamGetCaptureInfo(b->st, &cs, NULL, NULL, &d, &ed, &n) != cudaSuccess ||
                cs != cudaStreamCaptureStatusActive)
                return 0;
        if (n == 0 || n > LIB_DEPS) {
                b->lib_lost = true;
                return 0;
        }
        memcpy(deps, d, n * sizeof(*d));
        return n;
}

static bool is_lib_node(const Backend *b, cudaGraphNode_t node)
{
        for (size_t i = 0; i < b->n_lib; i++)
                if (b->lib_nodes[i] == node)
                        return true;
        return false;
}

/* Notes every node between the leaves before a library call and the capture's leaves
 * after it, walking the dependencies back from the latter. */
static void note_library_nodes(Backend *b, const cudaGraphNode_t *before, size_t n_before)
{
        cudaStreamCaptureStatus cs;
        const cudaGraphNode_t *d = NULL;
        const cudaGraphEdgeData *ed = NULL;
        size_t n = 0;

        if (cudaStreamGetCaptureInfo(b->st, &cs, NULL, NULL, &d, &ed, &n) != cudaSuccess ||
                n > LIB_DEPS) {
                b->lib_lost = true;
                return;
        }
        cudaGraphNode_t todo[64];
        cudaGraphEdgeData todo_ed[64];
        size_t n_todo = n;
        memcpy(todo, d, n * sizeof(*d));
        while (n_todo > 0 && !b->lib_lost) {
                cudaGraphNode_t node = todo[--n_todo];
                bool stop = is_lib_node(b, node);
                for (size_t i = 0; i < n_before; i++)
                        stop = stop || node == before[i];
                if (stop)
                        continue;
                if (b->n_lib == b->lib_cap) {
                        size_t cap = b->lib_cap ? 2 * b->lib_cap : 256;
                        cudaGraphNode_t *m = (cudaGraphNode_t *) realloc(b->lib_nodes,
                                cap * sizeof(*m));
                        if (!m) {
                                b->lib_lost = true;
                                break;
                        }
                        b->lib_nodes = m;
                        b->lib_cap = cap;
                }
                b->lib_nodes[b->n_lib++] = node;
                size_t nd = 0;
                if (cudaGraphNodeGetDependencies(node, NULL, NULL, &nd) != cudaSuccess ||
                        n_todo + nd > sizeof(todo) / sizeof(todo[0]) ||
                        cudaGraphNodeGetDependencies(node, todo + n_todo, todo_ed + n_todo, &nd) !=
                                cudaSuccess) {
                        b->lib_lost = true;
                        break;
                }
                n_todo += nd;
        }
}

/* The quantized rows of x, where x is b->xn as the step's add_norms quantize it, or as o or
 * down quantized it before the norm's factor (then xn itself is not written). */
static const CuQx *xn_quantized(const Backend *b, const __half *x)
{
        if (x != b->xn || !b->qx_live)
                return NULL;
        return b->qx_deferred ? &b->qx_res : &b->qx;
}

/* The rows a cuBLAS product runs on: a step's row count rounded up to one of a few sizes,
 * every one of which cuda_warm has run. cuBLAS picks, and may load, a kernel the first time
 * it sees a row count: 2-3.4 ms a matrix shape on the H200 where the kernel is new, 0.2 ms
 * where only the count is (docs/PERF.md, thirtieth session), so each new prompt length cost
 * its first request 10-14 ms. The extra rows are scratch (every buffer a product reads or
 * writes holds TILE_ROWS rows, the logits TILE_OUT); up to 256 rows the product is bound
 * by the weights' reads, so they cost little there, and above it at most a quarter more
 * rows. The sizes depend on the row count only, as the kernels' choice did. */
static uint32_t blas_rows(uint32_t rows)
{
        if (rows <= GEMV_MAX_ROWS)
                return rows;
        uint32_t step = rows <= 256 ? 32 : rows <= 512 ? 64 : 128;
        return div_up(rows, step) * step;
}

static_assert(TILE_ROWS % 128 == 0 && TILE_OUT % 32 == 0 && TILE_OUT <= 256,
        "blas_rows stays within the scratch buffers' rows");

/* The FP16 weights a cuBLAS product of l reads, and their row stride: its FP16 copy, or
 * b->w16, into which linear dequantizes the INT4 ones first. */
static const __half *blas_weights(const Backend *b, const CuLinear *l, uint32_t *ldw)
{
        if (l->awq && !l->w) {
                *ldw = l->in;
                return b->w16;
        }
        *ldw = l->kp;
        return l->w;
}

/* y (m, l->out) = x (m, l->in) · W^T in float32 on cuBLAS. Row-major y = x · W^T, W being
 * (N, K) row-major, is y^T = W · x^T in cuBLAS's column-major terms. The first failure is
 * kept for the step to report. */
static void blas_gemm(Backend *b, const CuLinear *l, const __half *w, uint32_t ldw,
        const __half *x, uint32_t m, float *y)
{
        const float one = 1.0f, zero = 0.0f;
        cudaGraphNode_t before[LIB_DEPS];
        size_t n_before = capture_leaves(b, before);
        cublasStatus_t st = cublasGemmEx(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int) l->out, (int) m,
                (int) l->in, &one, w, CUDA_R_16F, (int) ldw, x, CUDA_R_16F, (int) l->in, &zero, y,
                CUDA_R_32F, (int) l->out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS && b->blas_status == CUBLAS_STATUS_SUCCESS)
                b->blas_status = st;
        if (n_before)
                note_library_nodes(b, before, n_before);
}

/* y = x (rows, l->in) · W as float32 partial slices; returns the number of slices. */
static uint32_t linear(Backend *b, const CuLinear *l, const __half *x, uint32_t rows, float *y)
{
        if (rows <= GEMV_MAX_ROWS && l->q8w) {
                cu_gemv_q8(b->st, l, x, l->in, rows, y);
                return 1;
        }
        if (rows >= H16_MIN_ROWS && rows <= GEMV_MAX_ROWS && cu_h16_takes(l, b->n_sm, x, l->in)) {
                cu_gemv_h16(b->st, l, x, l->in, rows, y);
                return 1;
        }
        if (rows <= GEMV_MAX_ROWS) {
                size_t slice = (size_t) rows * l->out;
                if (l->awq) {
                        cu_gemv(b->st, l, x, l->in, rows, y, slice, xn_quantized(b, x));
                        return l->splits;
                }
                for (uint32_t r0 = 0; r0 < rows; r0 += GEMV_ROWS)
                        cu_gemv(b->st, l, x + (size_t) r0 * l->in, l->in,
                                MIN((uint32_t) GEMV_ROWS, rows - r0), y + (size_t) r0 * l->out,
                                slice, NULL);
                return l->splits;
        }
        uint32_t ldw;
        const __half *w = blas_weights(b, l, &ldw);
        if (l->awq && !l->w)
                cu_awq_dequant(b->st, l, b->w16);
        blas_gemm(b, l, w, ldw, x, blas_rows(rows), y);
        return 1;
}

/* Whether an attention launch leaves SMs to spare: each item has its own block (own: the
 * grid of att_grid blocks along items does not loop over them) and there are at most two
 * blocks an SM, per_item blocks an item (batch 1). There the attention kernels split each
 * block's work in two, since they are bound by their instructions' latency, not by the
 * SMs' throughput (7B batch 1 5% faster, V2-Lite 1.1%; docs/PERF.md, ninth session). A
 * looping grid of the same size has many items a block, and splitting them repeats each
 * item's scores (V2-Lite batch 64 8% slower, tenth session). */
static bool sms_to_spare(const Backend *b, uint32_t att_grid, bool own, uint32_t per_item)
{
        return own && att_grid * per_item <= 2 * (uint32_t) b->n_sm;
}

/* The q, k, v projections of the rows from b->xn, rope on q and k, q into b->q and k and v
 * into the layer's cache kc, vc: in the GEMV's end where it can and fuse allows (7B batch 1
 * 0.8% faster, 32B 1.1%; docs/PERF.md, eighteenth session). Returns whether it did. */
static bool qkv_rope(Backend *b, const CuLinear *qkv, uint32_t rows, bool fuse, __half *kc,
        __half *vc)
{
        const BkConfig *c = &b->cfg;
        CuRopeKv rk = {qkv->bias, b->meta.pos, b->meta.slot, b->inv_freq, b->attention_factor,
                c->n_heads, c->n_kv_heads, c->head_dim, b->q, kc, vc};
        if (fuse && cu_gemv_qkv_rope(b->st, qkv, rows, xn_quantized(b, b->xn), &rk))
                return true;
        uint32_t s = linear(b, qkv, b->xn, rows, b->part);
        cu_rope_kv(b->st, b->part, s, (size_t) rows * qkv->out, rows, qkv->rope_tph, &rk);
        return false;
}

/* Grouped-query attention (Llama, Qwen2) of the rows from b->xn into b->att. */
static void attention_gqa(Backend *b, const CuLayer *L, uint32_t l, uint32_t rows,
        uint32_t att_grid, bool att_own, bool att_small)
{
        const BkConfig *c = &b->cfg;
        uint32_t hd = c->head_dim;
        size_t layer_kv = (size_t) (b->n_blocks + 1) * b->block_tokens * kv_dim(c);
        __half *kc = b->kc + l * layer_kv, *vc = b->vc + l * layer_kv;

        qkv_rope(b, &L->qkv, rows, true, kc, vc);

        /* causal grouped-query attention over the cache: items (none in a tile of prefill
         * chunks only), then the prefill chunks' rows */
        if (att_grid > 0) {
                /* a KV head's query heads in two blocks: each block's warps run half the
                 * per-head instructions, and two blocks share an SM's schedulers */
                bool two = c->n_heads / c->n_kv_heads >= 2 &&
                           sms_to_spare(b, att_grid, att_own, c->n_kv_heads);
                uint32_t split = two ? 2 : 1;
                cu_attention(b->st, b->q, kc, vc, b->meta, att_grid, att_small, split,
                        b->block_tokens, c->n_heads, c->n_kv_heads, hd, b->acc, b->ml);
                cu_attention_combine(b->st, b->acc, b->ml, b->meta, rows, c->n_heads, hd, b->att);
        }
        cu_flash_attention(b->st, b->q, kc, vc, b->meta, b->flash_tasks, b->n_flash,
                b->block_tokens, c->n_heads, c->n_kv_heads, hd, b->att);
}

/* Multi-head latent attention (DeepSeek) of the rows from b->xn into b->att, in the
 * absorbed form; only the latent row reaches the cache. At one row, where cu_mla_out
 * takes o, it goes on through o into b->part instead, and returns o's slices; else 0. */
static uint32_t attention_mla(Backend *b, const CuLayer *L, uint32_t l, uint32_t rows,
        uint32_t att_grid, bool att_own)
{
        const BkConfig *c = &b->cfg;
        const BkMlaConfig *a = &c->mla;
        uint32_t H = c->n_heads, rank = a->kv_lora_rank, R = a->qk_rope_dim, N = L->qkv.out;
        size_t layer_kv = (size_t) (b->n_blocks + 1) * b->block_tokens * kv_dim(c);
        __half *cache = b->kc + l * layer_kv;

        /* q_proj or q_a_proj, with kv_a_proj_with_mqa: [q | c_kv | k_pe] */
        uint32_t s = linear(b, &L->qkv, b->xn, rows, b->part);
        size_t stride = (size_t) rows * N;

        /* kv_a_layernorm on c_kv and rope on k_pe, into the cache: with the queries when
         * they come from the same linear, else now (q_b_proj reuses the partials) */
        CuMlaKv kv = {b->part, s, stride, L->qkv.bias, N, N - (rank + R), rank, R, L->kv_a_norm,
                MLA_NORM_EPS, b->inv_freq, b->attention_factor, cache};
        const float *qbias = L->qkv.bias;
        uint32_t qld = N;
        if (a->q_lora_rank) {
                cu_mla_kv(b->st, &kv, b->meta, rows);
                /* q LoRA: q_a_layernorm, q_b_proj */
                cu_mla_q_norm(b->st, b->part, s, stride, L->qkv.bias, N, a->q_lora_rank, rows,
                        L->q_a_norm, MLA_NORM_EPS, b->xq);
                s = linear(b, &L->q_b, b->xq, rows, b->part);
                qld = L->q_b.out;
                stride = (size_t) rows * qld;
                qbias = L->q_b.bias;
        }

        /* q_nope through W_UK into the latent space, rope on q_pe, FP16 queries */
        __half *q = (__half *) b->q;
        cu_mla_absorb(b->st, b->part, s, stride, qbias, qld, b->meta, rows, H, a->qk_nope_dim, R,
                rank, b->inv_freq, b->attention_factor, L->wk, q, a->q_lora_rank ? NULL : &kv);

        /* causal attention over the latent cache, then each head's latent through W_UV */
        /* two blocks an item, each with half of the rank's dimensions, or four where they
         * too leave SMs to spare */
        uint32_t per = div_up(H, MLA_HEADS);
        uint32_t v_split = sms_to_spare(b, att_grid, att_own, 4 * per) ? 4
                           : sms_to_spare(b, att_grid, att_own, per) ? 2
                                                                      : 1;
        cu_mla_attention(b->st, q, cache, b->meta, att_grid, v_split, b->block_tokens, H, rank,
                R, a->softmax_scale, b->acc, b->ml);
        if (rows == 1 && cu_mla_out_takes(&L->o, H, rank, a->v_head_dim)) {
                cu_mla_out(b->st, &L->o, b->acc, b->ml, b->meta, L->wvt, H, rank, a->v_head_dim,
                        b->part);
                return H / 2;
        }
        cu_attention_combine(b->st, b->acc, b->ml, b->meta, rows, H, rank, b->olat);
        cu_mla_values(b->st, b->olat, L->wvt, rows, H, rank, a->v_head_dim, b->att);
        return 0;
}

/* One of a MoE layer's expert matrices over the step's grouped pairs (b->eids, eoff,
 * elist): the grouped GEMM (one slice) or the expert GEMV (l's slices, stride apart; with
 * hb, gate|up experts of paired tiles in one slice, silu(gate) * up into hb). */
static bool experts_mul(Backend *b, bool grouped, const CuLinear *l, uint32_t slots,
        uint32_t pairs, size_t qw_units, size_t sz_units, uint32_t x_div, const __half *x,
        uint32_t ldx, float *y, size_t stride, __half *hb, CuExpertsOrder order)
{
        if (grouped) {
                cu_gemm_experts(b->st, l, slots, pairs, qw_units, sz_units, b->eids, b->eoff,
                        b->elist, x_div, x, ldx, y);
                return false;
        }
        return cu_gemv_experts(b->st, l, slots, qw_units, sz_units, b->eids, b->eoff, b->elist,
                x_div, div_up(pairs, x_div), x, ldx, y, stride, hb, order);
}

/* How a MoE layer runs a step of rows rows: the routing, the experts' launches and slots. */
typedef struct MoePlan {
        CuRoute rt;
        bool grouped, few;
        uint32_t K, E, pairs, slots, slot_rows;
} MoePlan;

static MoePlan moe_plan(const Backend *b, uint32_t rows)
{
        const BkMoeConfig *mc = &b->cfg.moe;
        MoePlan p = {};
        p.rt = b->route;
        /* From 8 rows per routed expert on average (a pass of the expert GEMV) the experts
         * go through the grouped GEMM, which reads an expert's weights once per 32 of its
         * rows, not once per 8: on V2-Lite it made prefill 512 27% faster, and batch 32
         * and 64 (3 and 6 rows per expert) 3.4% and 1.4% slower (docs/PERF.md). The choice
         * depends on the bucket only. There, and up to 8 rows (one pass of the expert
         * GEMV), the shared experts' slices ride along with the routed experts as more
         * pairs at weight 1, three launches fewer; else they run as one MLP through
         * linear(), on a second stream beside the routing and the routed experts. */
        p.grouped = rows * mc->top_k >= 8 * mc->n_routed;
        p.rt.n_shared = rows <= 8 || p.grouped ? mc->n_shared : 0;
        p.K = mc->top_k + p.rt.n_shared;
        p.E = mc->n_routed + p.rt.n_shared;
        p.pairs = rows * p.K;
        p.slots = MIN(p.E, p.pairs);
        /* K slices pay off while few experts are touched; with many, the experts alone fill
         * the GPU (and the one-slice partials are what the scratch holds for big tiles) */
        p.few = !p.grouped && p.slots * 4 <= p.E;
        /* One-slice expert GEMVs: an expert's pairs go in slots of one pass each, so that
         * an expert of 9 to 16 rows runs its two passes in two CTAs side by side instead
         * of one after the other in one; the grid is sized for the most slots that can
         * take. */
        p.slot_rows = p.grouped || p.few ? 0 : EXPERT_PASS;
        if (p.slot_rows)
                p.slots = MIN(p.E + p.pairs / p.slot_rows, p.pairs);
        return p;
}

/* Whether the add_norm before layer L's MoE makes its router logits (into b->rlog), and at
 * one row routes and groups them too: *rr says how. The router's GEMV, and at one row the
 * routing launch, then go (V2-Lite batch 1 1.0% faster, batch 8 1.7%; docs/PERF.md, tenth
 * session). */
static bool norm_router(Backend *b, const CuLayer *L, uint32_t rows, const MoePlan *mp,
        CuNormRouter *rr)
{
        const CuLinear *r = &L->router;
        if (!r->out || r->awq || !r->w || r->bias ||
                !cu_add_norm_routes(rows, b->cfg.hidden, b->cfg.moe.n_routed))
                return false;
        *rr = CuNormRouter{};
        rr->w = r->w;
        rr->kp = r->kp;
        rr->logits = b->rlog;
        rr->rt = mp->rt;
        if (rows == 1 && mp->K <= 32) { /* group_one_row: a warp's lanes hold the experts */
                rr->bias = L->score_bias;
                rr->idx = b->ridx;
                rr->rw = b->rw;
                rr->n_slots = mp->slots;
                rr->slot_rows = mp->slot_rows;
                rr->ids = b->eids;
                rr->off = b->eoff;
                rr->list = b->elist;
        }
        return true;
}

/* The MoE MLP (DeepSeek) of the rows from b->xn as mp plans it: the pairs' down partials
 * into b->edpart, slices *ret_stride apart, to be summed as *ret says (the routed experts
 * weighted, plus the shared experts) by the add_norm that follows. Returns the slices. rr:
 * what of the routing the add_norm before did (norm_router), or NULL. res_w (one row, where
 * L->e_down.res_splits): the next norm's weights; down then ends in the residual add and
 * that norm's quantization into b->qx_res (cu_gemv_res_moe), and nothing is left to sum. */
static uint32_t mlp_moe(Backend *b, const CuLayer *L, uint32_t rows, const MoePlan *mp,
        const CuNormRouter *rr, const float *res_w, CuMoeSum *ret, size_t *ret_stride)
{
        const BkConfig *c = &b->cfg;
        const BkMoeConfig *mc = &c->moe;
        CuRoute rt = mp->rt;
        bool grouped = mp->grouped, few = mp->few;
        uint32_t K = mp->K, H = c->hidden, pairs = mp->pairs, slots = mp->slots;
        uint32_t slot_rows = mp->slot_rows;
        const CuLinear *gu = few ? &L->e_gu : &L->e_gu1, *dn = few ? &L->e_down : &L->e_down1;
        size_t gstride = (size_t) pairs * gu->out, dstride = (size_t) pairs * H;

        /* the shared experts on every row, when not among the pairs: on the side lane,
         * beside everything up to the combine */
        const float *shared = NULL;
        uint32_t ss = 0;
        bool side = false;
        if (mc->n_shared && !rt.n_shared) {
                /* both lanes' cuBLAS calls would dequantize into b->w16 if the router were
                 * an AWQ matrix without its FP16 copy: then the shared experts stay here */
                side = !L->router.awq || L->router.w;
                if (side) {
                        lane_wait(b, b->fork, b->st, b->side);
                        swap_lane(b);
                }
                uint32_t s = linear(b, &L->s_gu, b->xn, rows, b->spart);
                cu_swiglu(b->st, b->spart, s, (size_t) rows * L->s_gu.out, L->s_gu.bias, rows,
                        L->s_gu.out / 2, false, b->hb);
                ss = linear(b, &L->s_down, b->hb, rows, b->spart);
                if (side)
                        swap_lane(b);
                shared = b->spart;
        }

        /* router logits in float32, each row's experts and weights, pairs grouped by expert
         * (what of it the add_norm before did not do) */
        if (!rr) {
                uint32_t s = linear(b, &L->router, b->xn, rows, b->part);
                cu_moe_route_group(b->st, b->part, s, (size_t) rows * mc->n_routed,
                        L->score_bias, rt, rows, b->ridx, b->rw, slots, slot_rows, b->eids,
                        b->eoff, b->elist);
        } else if (!rr->idx) {
                cu_moe_route_group(b->st, rr->logits, 1, (size_t) rows * mc->n_routed,
                        L->score_bias, rt, rows, b->ridx, b->rw, slots, slot_rows, b->eids,
                        b->eoff, b->elist);
        }

        /* every pair's gate|up, swiglu (in the GEMV where the tiles are paired and it has
         * one slice), down */
        bool gu_swiglu = !grouped && gu->pairs && gu->splits == 1;
        /* From two rows, down's blocks start as soon as gate|up's are past their wait, and
         * load their first weights before their own: V2-Lite batch 8 1.35% faster, batch
         * 32 and 64 0.4%. At one row, where gate|up streams at the memory's rate, down's
         * early start made V2-Lite 0.7% slower (docs/PERF.md, thirty-first session, run
         * 8). */
        bool lead = rows > 1 && gu_swiglu;
        bool early = experts_mul(b, grouped, gu, slots, pairs, L->e_gu_qw, L->e_gu_sz, K, b->xn,
                             H, b->epart, gstride, gu_swiglu ? b->ehb : NULL,
                             lead ? EXPERTS_LEAD : EXPERTS_PLAIN) &&
                     lead;
        if (!gu_swiglu)
                cu_swiglu(b->st, b->epart, gu->splits, gstride, NULL, pairs,
                        mc->expert_dim, gu->pairs, b->ehb);
        if (res_w) {
                /* the pairs' sums where the expert GEMV would put its partials */
                cu_gemv_res_moe(b->st, &L->e_down, L->e_down_qw, L->e_down_sz, b->ridx, b->rw,
                        b->ehb, mc->expert_dim, b->x, res_w, &b->qx_res, b->edpart,
                        b->res_count);
                return 0;
        }
        experts_mul(b, grouped, dn, slots, pairs, L->e_down_qw, L->e_down_sz, 1, b->ehb,
                mc->expert_dim, b->edpart, dstride, NULL, early ? EXPERTS_EARLY : EXPERTS_PLAIN);

        if (side)
                lane_wait(b, b->join, b->side, b->st);
        *ret = (CuMoeSum){b->rw, K, shared, ss, (size_t) rows * H, rows, b->moe_y};
        *ret_stride = dstride;
        return dn->splits;
}

/* b->hb = silu(gate) * up of the rows from b->xn: in the GEMV's last step where its tiles
 * are paired and it has one slice (the GEMV path; returns true), else through the
 * partials. *hq (NULL, or one row of gu->out / 2 = 64 (*hq)->chunks): where the GEMV can,
 * it writes hb quantized by 16 k there instead; else *hq becomes NULL. */
static bool mlp_gate_up(Backend *b, const CuLinear *gu, uint32_t rows, const CuQx **hq)
{
        if (gu->pairs && rows <= GEMV_MAX_ROWS && gu->splits == 1) {
                if (!cu_gemv_gate_up(b->st, gu, b->xn, gu->in, rows, b->hb, xn_quantized(b, b->xn),
                            *hq))
                        *hq = NULL;
                return true;
        }
        *hq = NULL;
        uint32_t s = linear(b, gu, b->xn, rows, b->part);
        cu_swiglu(b->st, b->part, s, (size_t) rows * gu->out, gu->bias, rows, gu->out / 2,
                gu->pairs, b->hb);
        return false;
}

/* The greedy id of one row x through the screened lm_head into ids[0]; logits gets the
 * 8-bit copy's upper bounds. */
static void screen_head(Backend *b, const __half *x, float *logits, const CuSampleParams *params,
        int32_t *ids)
{
        CuScreen sc = {b->lm_head.w, b->lm_head.kp, logits, b->screen_tlo, b->screen_thi};
        cu_gemv_q8_bounds(b->st, &b->head_q8, x, logits, b->screen_tlo, b->screen_thi,
                b->cfg.vocab_sample);
        cu_screen_argmax(b->st, &sc, x, b->cfg.vocab_sample, params, ids);
}

/* Runs rows rows described by the metadata on the device through the model, leaving the
 * logits of the n_out rows of meta.out_row in b->logits and their sampled ids in b->ids_d.
 * att_grid: blocks along attention items; att_own: one an item (else they loop); att_small:
 * a step of at most ATT_SMALL_STEP sequences (their items are short, att_chunk). screen:
 * one greedy row (screen_step), its id through the screened lm_head, b->logits then holding
 * the 8-bit copy's upper bounds. */
static void forward(Backend *b, uint32_t rows, uint32_t n_out, uint32_t att_grid, bool att_own,
        bool att_small, bool screen)
{
        const BkConfig *c = &b->cfg;
        uint32_t H = c->hidden;
        const float *prev = NULL, *prev_bias = NULL;
        uint32_t prev_s = 0, s = 0;
        /* the previous layer's MLP output: a linear's slices, or a MoE layer's pairs */
        size_t prev_stride = (size_t) rows * H;
        CuMoeSum moe;
        const CuMoeSum *prev_moe = NULL;

        /* token embedding; at one row into the first q|k|v's quantized rows, where the
         * layers' o and down do the same for the GEMVs after them */
        const CuLayer *L0 = &b->layers[0];
        bool embed_qx = rows == 1 && b->qx_res.ss && !b->mla && !L0->router.out &&
                        H % (4 * 64) == 0 && cu_qx_takes(&L0->qkv, 1, b->qx.chunks);
        if (embed_qx)
                cu_embed_qx(b->st, b->embed, b->meta, b->ids_d, H, b->x, L0->attn_norm,
                        &b->qx_res);
        else
                cu_embed(b->st, b->embed, b->meta, b->ids_d, rows, H, b->x);
        /* the layers' add_norms quantize xn for the integer GEMV where they can (qx_live) */
        const CuQx *qx = b->qx.items ? &b->qx : NULL;

        for (uint32_t l = 0; l < c->n_layers; l++) {
                const CuLayer *L = &b->layers[l];

                /* the previous layer's MLP output into the residual, attention rmsnorm: done
                 * where the previous down ended in them (cu_gemv_res) */
                const CuLayer *P = l > 0 ? &b->layers[l - 1] : NULL;
                b->qx_deferred = rows == 1 && (P ? P->down.res_splits || P->e_down.res_splits
                                                 : embed_qx);
                if (b->qx_deferred)
                        b->qx_live = true;
                else
                        b->qx_live = cu_add_norm(b->st, b->x, prev, prev_s, prev_stride, prev_bias,
                                prev_moe, L->attn_norm, b->xn, rows, H, c->rms_eps, NULL, true,
                                NULL, qx);

                /* attention: latent (DeepSeek) or grouped-query, into b->att */
                uint32_t o_done = 0;
                if (b->mla)
                        o_done = attention_mla(b, L, l, rows, att_grid, att_own);
                else
                        attention_gqa(b, L, l, rows, att_grid, att_own, att_small);

                /* output projection and residual, ffn rmsnorm */
                if (o_done) {
                        b->qx_deferred = false;
                        s = o_done;
                } else if (rows == 1 && L->o.res_splits) {
                        cu_gemv_res(b->st, &L->o, b->att, b->x, L->mlp_norm, &b->qx_res, NULL);
                        b->qx_live = b->qx_deferred = true;
                } else {
                        b->qx_deferred = false;
                        s = linear(b, &L->o, b->att, rows, b->part);
                }
                MoePlan mp = {};
                CuNormRouter rr;
                bool routed = false;
                if (L->router.out) {
                        mp = moe_plan(b, rows);
                        routed = norm_router(b, L, rows, &mp, &rr);
                }
                if (!b->qx_deferred)
                        b->qx_live = cu_add_norm(b->st, b->x, b->part, s, (size_t) rows * H,
                                L->o.bias, NULL, L->mlp_norm, b->xn, rows, H, c->rms_eps, NULL,
                                true, routed ? &rr : NULL, qx);

                /* mixture of experts, or swiglu: silu(gate) * up, then down; the residual
                 * add opens the next layer */
                if (L->router.out) {
                        /* moe_res_plan: only where a next layer takes the row */
                        const float *res_w = rows == 1 && L->e_down.res_splits
                                                     ? b->layers[l + 1].attn_norm
                                                     : NULL;
                        prev_s = mlp_moe(b, L, rows, &mp, routed ? &rr : NULL, res_w, &moe,
                                &prev_stride);
                        prev = b->edpart;
                        prev_bias = NULL;
                        prev_moe = &moe;
                        continue;
                }
                /* at one row, where down ends as o does, hb goes to it quantized by 16 k
                 * (CuQx, cuda_kernels.cuh), so that down runs the integer GEMV's loop */
                const CuQx *hq = rows == 1 && L->down.res_splits && b->hq.items &&
                                                 L->gate_up.out / 2 == b->hq.chunks * 64
                                         ? &b->hq
                                         : NULL;
                mlp_gate_up(b, &L->gate_up, rows, &hq);
                if (rows == 1 && L->down.res_splits) {
                        cu_gemv_res(b->st, &L->down, b->hb, b->x, b->layers[l + 1].attn_norm,
                                &b->qx_res, hq);
                        continue;
                }
                prev_s = linear(b, &L->down, b->hb, rows, b->part);
                prev = b->part;
                prev_bias = L->down.bias;
                prev_stride = (size_t) rows * H;
                prev_moe = NULL;
        }

        /* last residual add and final rmsnorm of the rows whose logits are wanted */
        b->qx_live = false;
        cu_add_norm(b->st, b->x, prev, prev_s, prev_stride, prev_bias, prev_moe, b->final_norm,
                b->xn, n_out, H, c->rms_eps, b->meta.out_row, false, NULL, NULL);

        /* lm_head (one slice: it is wide enough) and sampling */
        if (screen) {
                screen_head(b, b->xn, b->logits, b->samp_d, b->ids_d);
                return;
        }
        linear(b, &b->lm_head, b->xn, n_out, b->logits);
        cu_sample(b->st, b->logits, n_out, c->vocab_size, c->vocab_sample, b->samp_d, b->pen_d,
                b->pen_saved, b->ids_d);
}

/* ---------------------------------------------------------------------------------------
 * Planning a tile: the metadata the kernels read */

typedef struct Plan {
        uint32_t rows, n_out, n_items, n_bt;
        uint32_t n_seqs;    /* sequences in the step (att_chunk) */
        int32_t seq_bt_seq; /* the last sequence whose block table is in the tile */
        uint32_t seq_bt_at; /* ... at this offset from meta */
        uint32_t n_flash;   /* flash tasks (meta array 7) */
        int32_t flash_seq;  /* the sequence of the last one */
} Plan;

static Plan plan_new(uint32_t n_seqs)
{
        Plan p;
        memset(&p, 0, sizeof(p));
        p.n_seqs = n_seqs;
        p.seq_bt_seq = -1;
        p.flash_seq = -1;
        return p;
}

static uint32_t *meta_arr(Backend *b, uint32_t which)
{
        return b->meta_h + 4 + (size_t) which * TILE_ROWS;
}

static uint32_t seq_blocks(const Backend *b, const BkSeq *s)
{
        return div_up(s->pos + s->n_tokens, b->block_tokens);
}

/* Items of one wave of k_attention_heads: its blocks, an item and a KV head, are two an SM
 * at its registers (118-128 a thread, docs/design-notes.md). */
static uint32_t att_wave(const Backend *b)
{
        return MAX(1u, 2 * (uint32_t) b->n_sm / b->cfg.n_kv_heads);
}

/* Positions per attention item of a row at pos of s, in a step of n_seqs sequences. In a
 * step of at most ATT_SMALL_STEP sequences, a decode row (its sequence brings one token)
 * is cut into items of 16..ATT_CHUNK positions, at most att_row_items a row (up to
 * ATT_CHUNK times as many positions), so that a few sequences at a short context still
 * spread over the SMs; other rows take ATT_CHUNK (a larger batch fills the SMs anyway, and
 * an item's chain of dependent loads costs about the same at 16 positions as at 128). The
 * partition, hence a row's float rounding, depends on the row and the step's sequence
 * count only: graphs and eager steps of the same sequences agree, but a sequence decoded
 * with more than ATT_SMALL_STEP others may round differently than alone. MLA decode rows
 * of a small step are cut the same way from one chunk of the latent kernel up (a shorter
 * item costs that kernel as much and the combine more); other MLA rows take MLA_ITEM. */
#define ATT_SMALL_STEP 8u

/* Items a decode row of a small step of n_seqs sequences is cut into at most: 64, and for
 * GQA the row's share of one wave of k_attention_heads's blocks (att_wave), so that the
 * graphs' grids can be one wave (graph_launch). */
static uint32_t att_row_items(const Backend *b, uint32_t n_seqs)
{
        if (b->mla)
                return 64;
        return MIN(64u, MAX(1u, att_wave(b) / n_seqs));
}

/* Item blocks a decode graph of bucket rows launches: the most items that att_row_items
 * lets a step of up to bucket sequences have, for GQA one wave of blocks. */
static uint32_t att_graph_items(const Backend *b, uint32_t bucket)
{
        uint32_t most = 0;
        for (uint32_t n = 1; n <= bucket; n++)
                most = MAX(most, n * att_row_items(b, n));
        return most;
}

static uint32_t att_chunk(const Backend *b, const BkSeq *s, uint32_t pos, uint32_t n_seqs)
{
        if (s->n_tokens != 1 || n_seqs > ATT_SMALL_STEP)
                return b->mla ? MLA_ITEM : ATT_CHUNK;
        uint32_t c = b->mla ? MLA_CHUNK : 16, want = div_up(pos + 1, att_row_items(b, n_seqs));
        while (c < want && c < ATT_CHUNK)
                c *= 2;
        return c;
}

/* True when the rows of s attend through the flash kernel rather than items (prefill
 * chunks of GQA models; MLA rows always go through the latent items). */
static bool uses_flash(const Backend *b, const BkSeq *s)
{
        return !b->mla && s->n_tokens > 1 &&
               cu_flash_takes(b->cfg.head_dim, b->cfg.max_positions);
}

/* True when row (seq i, position pos) fits in the tile as planned so far. */
static bool plan_fits(const Backend *b, const Plan *p, const BkSeq *seqs, uint32_t i, uint32_t pos,
        bool logits)
{
        uint32_t items = uses_flash(b, &seqs[i])
                                 ? 0
                                 : div_up(pos + 1, att_chunk(b, &seqs[i], pos, p->n_seqs));
        uint32_t bt = p->seq_bt_seq == (int32_t) i ? 0 : seq_blocks(b, &seqs[i]);
        return p->rows < TILE_ROWS && p->n_items + items <= TILE_ITEMS &&
               p->n_bt + bt <= TILE_BT && (!logits || p->n_out < TILE_OUT);
}

static void plan_row(Backend *b, Plan *p, const BkSeq *seqs, uint32_t i, uint32_t pos, int32_t token,
        bool logits)
{
        const BkSeq *s = &seqs[i];
        uint32_t r = p->rows++;
        uint32_t *dyn = b->meta_h + b->dyn_off;

        if (p->seq_bt_seq != (int32_t) i) {
                /* Block tables are gathered past the largest item area and moved next to
                 * the items by plan_finish, once their number is known. */
                uint32_t n = seq_blocks(b, s);
                p->seq_bt_at = p->n_bt;
                memcpy(dyn + 4 * (size_t) TILE_ITEMS + p->n_bt, s->blocks, n * 4);
                p->n_bt += n;
                p->seq_bt_seq = (int32_t) i;
        }
        ((int32_t *) meta_arr(b, 0))[r] = token;
        meta_arr(b, 1)[r] = pos;
        meta_arr(b, 2)[r] = s->blocks[pos / b->block_tokens] * b->block_tokens + pos % b->block_tokens;
        meta_arr(b, 3)[r] = p->seq_bt_at; /* relative for now, see plan_finish */
        bool flash = uses_flash(b, s);
        uint32_t chunk = att_chunk(b, s, pos, p->n_seqs), items = flash ? 0 : div_up(pos + 1, chunk);
        meta_arr(b, 4)[2 * r] = p->n_items;
        meta_arr(b, 4)[2 * r + 1] = items;
        for (uint32_t k = 0; k < items; k++) {
                uint32_t *it = dyn + 4 * (size_t) (p->n_items + k);
                it[0] = r;
                it[1] = k * chunk;
                it[2] = MIN((k + 1) * chunk, pos + 1);
                it[3] = s->pos;
        }
        p->n_items += items;
        if (flash) {
                /* consecutive rows of the sequence, in tasks of up to FLASH_ROWS */
                uint32_t *tasks = meta_arr(b, 7);
                if (p->flash_seq == (int32_t) i && tasks[p->n_flash - 1] >> 16 < FLASH_ROWS) {
                        tasks[p->n_flash - 1] += 1u << 16;
                } else {
                        tasks[p->n_flash++] = r | 1u << 16;
                        p->flash_seq = (int32_t) i;
                }
        }
        if (logits)
                meta_arr(b, 6)[p->n_out++] = r;
        b->rows[r] = (Row){.seq = i, .pos = pos, .logits = logits};
}

/* Packs the block tables right after the items and uploads the metadata in st. */
static int plan_finish(Backend *b, const Plan *p, cudaStream_t st, DsError *err)
{
        uint32_t *dyn = b->meta_h + b->dyn_off;
        uint32_t bt_at = (uint32_t) b->dyn_off + 4 * p->n_items;

        memmove(b->meta_h + bt_at, dyn + 4 * (size_t) TILE_ITEMS, (size_t) p->n_bt * 4);
        for (uint32_t r = 0; r < p->rows; r++)
                meta_arr(b, 3)[r] += bt_at;
        b->meta_h[0] = p->n_items;
        b->meta_h[1] = (uint32_t) b->dyn_off;
        b->n_flash = p->n_flash;
        CU_TRY(cudaMemcpyAsync(b->meta_d, b->meta_h, ((size_t) bt_at + p->n_bt) * 4,
                       cudaMemcpyHostToDevice, st),
                "step metadata");
        return 0;
}

static bool has_penalties(const BkSeq *s)
{
        const BkSampling *p = &s->sampling;
        return s->n_history > 0 &&
               ((p->repetition_penalty > 0.0f && p->repetition_penalty != 1.0f) ||
                       p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);
}

/* Whether a step's logits rows go through the screened lm_head: one row at most (a tile
 * without one computes a row nobody reads), sampled greedily without penalties, whose
 * logits nobody asks for. The ids are the FP16 lm_head's (cuda_screen.cu). */
static bool screen_step(const Backend *b, const BkSeq *seqs, uint32_t live)
{
        uint32_t n = 0;
        if (!b->head_q8.q8w)
                return false;
        for (uint32_t r = 0; r < live; r++) {
                const Row *row = &b->rows[r];
                const BkSeq *s = &seqs[row->seq];
                if (!row->logits)
                        continue;
                if (++n > 1 || s->logits || s->sample_logits || s->sampling.temperature > 0.0f ||
                        has_penalties(s))
                        return false;
        }
        return true;
}

/* Appends s's penalty list, its distinct sampled ids with their counts, at *n_pen; false
 * (nothing appended) when it would pass PEN_MAX. b->sample_i counts, as in bk_sample. */
static bool pen_list(Backend *b, const BkSeq *s, uint32_t *n_pen)
{
        int32_t *count = b->sample_i;
        uint32_t vocab = b->cfg.vocab_sample, n = *n_pen;
        bool fits = true;

        for (uint32_t i = 0; i < s->n_history; i++)
                if (s->history[i] >= 0 && (uint32_t) s->history[i] < vocab)
                        count[s->history[i]] = 0;
        for (uint32_t i = 0; i < s->n_history; i++)
                if (s->history[i] >= 0 && (uint32_t) s->history[i] < vocab)
                        count[s->history[i]]++;
        for (uint32_t i = 0; i < s->n_history; i++) {
                int32_t id = s->history[i];
                if (id < 0 || (uint32_t) id >= vocab || count[id] == 0)
                        continue;
                fits = fits && n < PEN_MAX;
                if (fits)
                        b->pen_h[n++] = make_uint2((uint32_t) id, (uint32_t) count[id]);
                count[id] = 0;
        }
        if (fits)
                *n_pen = n;
        return fits;
}

/* Fills and uploads in st the sampling parameters of the tile's n_out logits rows, of
 * which those among the first live rows of b->rows belong to sequences (the others, graph
 * padding, are greedy). out (or NULL): where the sampler also writes the live rows' ids,
 * mapped host memory. */
static int sample_upload(Backend *b, const Plan *p, const BkSeq *seqs, uint32_t live,
        int32_t *out, cudaStream_t st, DsError *err)
{
        uint32_t j = 0, n_pen = 0, n_out = MAX(p->n_out, 1u);

        for (uint32_t r = 0; r < live; r++) {
                const Row *row = &b->rows[r];
                const BkSeq *s = &seqs[row->seq];
                if (!row->logits)
                        continue;
                CuSampleParams *q = &b->samp_h[j];
                *q = (CuSampleParams){};
                b->host_row[j] = false;
                if (s->sample && row->pos == s->pos + s->n_tokens - 1) {
                        const BkSampling *sp = &s->sampling;
                        uint32_t pen_off = n_pen;
                        if (has_penalties(s) && !pen_list(b, s, &n_pen)) {
                                b->host_row[j++] = true;
                                continue;
                        }
                        *q = (CuSampleParams){
                                .temperature = sp->temperature,
                                .top_k = sp->top_k,
                                .top_p = sp->top_p,
                                .min_p = sp->min_p,
                                .repetition = sp->repetition_penalty,
                                .presence = sp->presence_penalty,
                                .frequency = sp->frequency_penalty,
                                .pen_off = pen_off,
                                .pen_n = n_pen - pen_off,
                                .seed = sp->seed,
                                .draw = s->draw,
                                .out = NULL,
                        };
                }
                q->out = out ? out + j : NULL;
                j++;
        }
        for (; j < n_out; j++) {
                b->samp_h[j] = (CuSampleParams){};
                b->host_row[j] = false;
        }
        size_t bytes = n_pen ? TILE_OUT * sizeof(CuSampleParams) + (size_t) n_pen * sizeof(uint2)
                             : n_out * sizeof(CuSampleParams);
        CU_TRY(cudaMemcpyAsync(b->samp_d, b->samp_h, bytes, cudaMemcpyHostToDevice, st),
                "sampling parameters");
        return 0;
}

/* Copies ids and wanted logits back after a tile of p->rows rows, and samples. */
static int tile_outputs(Backend *b, const Plan *p, const BkSeq *seqs, int32_t *ret_ids, DsError *err)
{
        const BkConfig *c = &b->cfg;
        uint32_t j = 0;

        CU_TRY(cudaMemcpyAsync(b->ids_h, b->ids_d, (size_t) p->n_out * 4, cudaMemcpyDeviceToHost,
                       b->st),
                "ids");
        CU_TRY(cudaStreamSynchronize(b->st), "step");
        for (uint32_t r = 0; r < p->rows; r++) {
                const Row *row = &b->rows[r];
                const BkSeq *s = &seqs[row->seq];
                if (!row->logits)
                        continue;
                const float *lg = b->logits + (size_t) j * c->vocab_size;
                bool last = row->pos == s->pos + s->n_tokens - 1;
                if (s->logits)
                        CU_TRY(cudaMemcpy(s->logits + (size_t) (row->pos - s->pos) * c->vocab_size,
                                       lg, (size_t) c->vocab_size * 4, cudaMemcpyDeviceToHost),
                                "logits");
                if (s->sample && last && s->sample_logits)
                        CU_TRY(cudaMemcpy(s->sample_logits, lg, (size_t) c->vocab_size * 4,
                                       cudaMemcpyDeviceToHost),
                                "logits");
                if (s->sample && last) {
                        if (!b->host_row[j])
                                ret_ids[row->seq] = b->ids_h[j];
                        else {
                                CU_TRY(cudaMemcpy(b->row_h, lg, (size_t) c->vocab_size * 4,
                                               cudaMemcpyDeviceToHost),
                                        "logits");
                                ret_ids[row->seq] = bk_sample(b->row_h, c->vocab_sample,
                                        &s->sampling, s->history, s->n_history, s->draw,
                                        b->sample_f, b->sample_i);
                        }
                }
                j++;
        }
        return 0;
}

static int blas_check(Backend *b, DsError *err)
{
        cublasStatus_t st = b->blas_status;
        cudaError_t e = b->side_err;
        b->blas_status = CUBLAS_STATUS_SUCCESS;
        b->side_err = cudaSuccess;
        if (st != CUBLAS_STATUS_SUCCESS)
                return ds_error(err, -EIO, "cuda backend: cuBLAS: %s", cublasGetStatusString(st));
        if (e != cudaSuccess)
                return cuda_fail(err, e, "shared experts' stream");
        return 0;
}

static int run_tile(Backend *b, Plan *p, const BkSeq *seqs, int32_t *ret_ids, DsError *err)
{
        /* A tile without logits rows still fills the cache: it computes one logits row
         * that nobody reads. */
        if (p->n_out == 0)
                meta_arr(b, 6)[0] = 0;
        int r = plan_finish(b, p, b->st, err);
        if (r == 0)
                r = sample_upload(b, p, seqs, p->rows, NULL, b->st, err);
        if (r < 0)
                return r;
        forward(b, p->rows, MAX(p->n_out, 1u), p->n_items, true, p->n_seqs <= ATT_SMALL_STEP,
                screen_step(b, seqs, p->rows));
        CU_TRY(cudaGetLastError(), "kernel launch");
        r = blas_check(b, err);
        if (r < 0)
                return r;
        return tile_outputs(b, p, seqs, ret_ids, err);
}

/* ---------------------------------------------------------------------------------------
 * Decode steps from graphs */

/* The decode graph bucket of a step of n rows: the power of two >= n, the graph
 * b->graphs[*which] (which may be NULL). */
static uint32_t decode_bucket(uint32_t n, uint32_t *which)
{
        uint32_t bucket = 1, w = 0;
        while (bucket < n) {
                bucket *= 2;
                w++;
        }
        if (which)
                *which = w;
        return bucket;
}

static bool graph_step(const Backend *b, const BkSeq *seqs, uint32_t n)
{
        if (b->eager || n == 0 || n > GRAPH_MAX)
                return false;
        uint32_t items = 0, bt = 0;
        for (uint32_t i = 0; i < n; i++) {
                if (seqs[i].n_tokens != 1 || !seqs[i].sample || seqs[i].logits)
                        return false;
                items += div_up(seqs[i].pos + 1, att_chunk(b, &seqs[i], seqs[i].pos, n));
                bt += seq_blocks(b, &seqs[i]);
        }
        return items + (decode_bucket(n, NULL) - n) <= TILE_ITEMS && bt + 1 <= TILE_BT;
}

/* Turns g's edges from a kernel into one of ours into programmatic ones: the successor's
 * blocks launch once every block of the predecessor has called pdl_trigger() or exited,
 * and wait in pdl_wait() for its completion, so the successor's start (and the weight
 * loads it issues before the wait) overlap the predecessor's tail instead of following it.
 * Edges into the nodes cuBLAS added (noted during the capture: asking a library kernel
 * node for its function is an API error) stay full dependencies, as its kernels do not
 * wait for ours; so do the edges into a node that waits on two lanes (the join of the
 * shared experts' stream), the one place a node has more than one. */
static cudaError_t pdl_edges(const Backend *b, cudaGraph_t g)
{
        size_t n = 0;
        cudaError_t e = cudaGraphGetEdges(g, NULL, NULL, NULL, &n);
        if (e != cudaSuccess || n == 0)
                return e;
        cudaGraphNode_t *from = (cudaGraphNode_t *) calloc(n, sizeof(*from));
        cudaGraphNode_t *to = (cudaGraphNode_t *) calloc(n, sizeof(*to));
        cudaGraphEdgeData *ed = (cudaGraphEdgeData *) calloc(n, sizeof(*ed));
        if (!from || !to || !ed)
                e = cudaErrorMemoryAllocation;
        if (e == cudaSuccess)
                e = cudaGraphGetEdges(g, from, to, ed, &n);
        for (size_t i = 0; i < n && e == cudaSuccess; i++) {
                cudaGraphNodeType type;
                cudaGraphNodeType to_type;
                size_t n_deps = 0;
                if (ed[i].type != cudaGraphDependencyTypeDefault || is_lib_node(b, to[i]) ||
                        cudaGraphNodeGetDependencies(to[i], NULL, NULL, &n_deps) != cudaSuccess ||
                        n_deps != 1 || cudaGraphNodeGetType(to[i], &to_type) != cudaSuccess ||
                        to_type != cudaGraphNodeTypeKernel ||
                        cudaGraphNodeGetType(from[i], &type) != cudaSuccess ||
                        type != cudaGraphNodeTypeKernel)
                        continue;
                cudaGraphEdgeData pe = {};
                pe.from_port = cudaGraphKernelNodePortProgrammatic;
                pe.type = cudaGraphDependencyTypeProgrammatic;
                e = cudaGraphRemoveDependencies(g, &from[i], &to[i], &ed[i], 1);
                if (e == cudaSuccess)
                        e = cudaGraphAddDependencies(g, &from[i], &to[i], &pe, 1);
        }
        free(from);
        free(to);
        free(ed);
        return e;
}

/* Plans and launches the decode graph of seqs, sequence i fed tok[i] (or its token when
 * tok is NULL; below 0, a chained one: see cu_embed). *ret_p gets the plan of the live
 * rows, whose ids the graph leaves in ids_d in sequence order, and with out (mapped host
 * memory) there too. With out, the step's copies go up on the upload lane, beside what
 * the stream still runs of the other pair. */
static int graph_launch(Backend *b, const BkSeq *seqs, uint32_t n, const int32_t *tok,
        int32_t *out, Plan *ret_p, DsError *err)
{
        uint32_t which, bucket = decode_bucket(n, &which);
        Plan p = plan_new(n);
        for (uint32_t i = 0; i < n; i++)
                plan_row(b, &p, seqs, i, seqs[i].pos, tok ? tok[i] : seqs[i].tokens[0], true);

        /* Padding rows: token 0 at position 0 of the spare block, with their own item. */
        if (bucket > n) {
                uint32_t *dyn = b->meta_h + b->dyn_off;
                uint32_t pad_bt = p.n_bt;
                dyn[4 * (size_t) TILE_ITEMS + p.n_bt++] = b->n_blocks;
                for (uint32_t r = n; r < bucket; r++) {
                        meta_arr(b, 0)[r] = 0;
                        meta_arr(b, 1)[r] = 0;
                        meta_arr(b, 2)[r] = b->n_blocks * b->block_tokens;
                        meta_arr(b, 3)[r] = pad_bt;
                        meta_arr(b, 4)[2 * r] = p.n_items;
                        meta_arr(b, 4)[2 * r + 1] = 1;
                        uint32_t *it = dyn + 4 * (size_t) p.n_items++;
                        it[0] = r;
                        it[1] = 0;
                        it[2] = 1;
                        it[3] = 0;
                        meta_arr(b, 6)[p.n_out++] = r;
                }
                p.rows = bucket;
        }
        cudaStream_t cp = out ? b->up : b->st;
        if (out)
                CU_TRY(cudaStreamWaitEvent(b->up, b->used[b->pair], 0), "upload lane");
        int r = plan_finish(b, &p, cp, err);
        if (r == 0)
                r = sample_upload(b, &p, seqs, n, out, cp, err);
        if (r < 0)
                return r;
        if (out) {
                CU_TRY(cudaEventRecord(b->upd[b->pair], b->up), "upload lane");
                CU_TRY(cudaStreamWaitEvent(b->st, b->upd[b->pair], 0), "upload lane");
        }

        bool screen = n == 1 && screen_step(b, seqs, n);
        cudaGraphExec_t *exec = screen ? &b->graph_screen[b->pair] : &b->graphs[which][b->pair];
        if (!*exec) {
                cudaGraph_t g;
                b->n_lib = 0;
                b->lib_lost = false;
                CU_TRY(cudaStreamBeginCapture(b->st, cudaStreamCaptureModeThreadLocal),
                        "graph capture");
                /* Blocks along items: the kernel loops, so any count gives the same result.
                 * A decode row in a small step of n <= bucket sequences has at most
                 * att_row_items(n) items up to ATT_CHUNK times as many positions
                 * (att_chunk), so one block per item there: an item is a chain of
                 * dependent loads, and a block looping over items waits on each in turn.
                 * For GQA that is one wave of blocks: at 7B batch 8 a grid of 64 items a
                 * row (2048 blocks, 1056 of them with an item of 16 positions) took 15.4 us
                 * a layer, and one wave (264, 160 of them with an item of 128) 13.5: batch 8
                 * -1.5% (docs/PERF.md, fortieth session). */
                bool small = bucket <= ATT_SMALL_STEP;
                forward(b, bucket, bucket,
                        small ? att_graph_items(b, bucket) : (uint32_t) b->n_sm * 2, small, small,
                        screen);
                CU_TRY(cudaStreamEndCapture(b->st, &g), "graph capture");
                r = blas_check(b, err);
                cudaError_t e = cudaSuccess;
                if (r == 0 && b->pdl && !b->lib_lost && (e = pdl_edges(b, g)) != cudaSuccess)
                        r = cuda_fail(err, e, "graph: programmatic edges");
                if (r < 0) {
                        cudaGraphDestroy(g);
                        return r;
                }
                e = cudaGraphInstantiate(exec, g, 0);
                cudaGraphDestroy(g);
                if (e != cudaSuccess) {
                        *exec = NULL;
                        return cuda_fail(err, e, "graph instantiation");
                }
        }
        CU_TRY(cudaGraphLaunch(*exec, b->st), "graph launch");
        p.rows = n; /* hand out the live rows only */
        p.n_out = n;
        *ret_p = p;
        return 0;
}

static int run_graph(Backend *b, const BkSeq *seqs, uint32_t n, int32_t *ret_ids, DsError *err)
{
        Plan p;
        int r = graph_launch(b, seqs, n, NULL, NULL, &p, err);
        if (r < 0)
                return r;
        return tile_outputs(b, &p, seqs, ret_ids, err);
}

extern "C" int cuda_bench_replay(Backend *b, uint32_t rows, uint32_t n, double *us, DsError *err)
{
        uint32_t which;
        decode_bucket(rows, &which);
        /* one row: the screened graph where greedy steps made one */
        cudaGraphExec_t g = !b || which >= N_BUCKETS ? NULL
                            : rows == 1 && b->graph_screen[b->pair] ? b->graph_screen[b->pair]
                                                                    : b->graphs[which][b->pair];
        if (rows == 0 || n == 0 || !g)
                return ds_error(err, -ENOENT, "cuda backend: no decode graph for %u rows", rows);
        CU_TRY(cudaSetDevice(b->dev), "device");
        float ms = 0;
        CU_TRY(cu_graph_time(b->st, g, n, &ms), "graph replays");
        *us = ms * 1e3 / n;
        return 0;
}

/* ---------------------------------------------------------------------------------------
 * BackendOps */

/* The CUDA device of BkOptions.device: its leading decimal number, 0 without one (the rest
 * holds the flags "eager", "int4-only" and "no-pdl"). */
static int device_index(const char *dev_opt, int *ret, DsError *err)
{
        int n = 0;
        char *end;
        unsigned long v = strtoul(dev_opt, &end, 10);

        if (end == dev_opt)
                v = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess)
                return cuda_fail(err, e, "device count");
        if (v >= (unsigned long) n)
                return ds_error(err, -ENODEV, "cuda backend: device %lu: this machine has %d",
                        v, n);
        *ret = (int) v;
        return 0;
}

static int cuda_create(const BkOptions *opt, Backend **ret, DsError *err)
{
        Backend *b;
        int dev = 0, r;

        if (!ret)
                return ds_error(err, -EINVAL, "cuda backend: no return pointer");
        b = (Backend *) calloc(1, sizeof(*b));
        if (!b)
                return ds_error(err, -ENOMEM, "cuda backend: out of memory");
        const char *dev_opt = opt && opt->device ? opt->device : "";
        if ((r = device_index(dev_opt, &dev, err)) < 0) {
                free(b);
                return r;
        }
        b->dev = dev;
        b->eager = strstr(dev_opt, "eager") != NULL;
        b->fp16_copies = strstr(dev_opt, "int4-only") == NULL;
        b->pdl = strstr(dev_opt, "no-pdl") == NULL;
        b->screen_opt = strstr(dev_opt, "no-screen") == NULL;

        cudaError_t e = cudaSetDevice(dev);
        if (e == cudaSuccess)
                e = cudaDeviceGetAttribute(&b->n_sm, cudaDevAttrMultiProcessorCount, dev);
        if (e == cudaSuccess)
                e = cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking);
        if (e == cudaSuccess)
                e = cudaMalloc(&b->blas_ws, BLAS_WS);
        if (e != cudaSuccess) {
                free(b);
                return cuda_fail(err, e, "device setup");
        }
        /* A fixed workspace makes cuBLAS calls capturable in graphs. */
        if (cublasCreate(&b->blas) != CUBLAS_STATUS_SUCCESS ||
                cublasSetStream(b->blas, b->st) != CUBLAS_STATUS_SUCCESS ||
                cublasSetWorkspace(b->blas, b->blas_ws, BLAS_WS) != CUBLAS_STATUS_SUCCESS) {
                cudaFree(b->blas_ws);
                cudaStreamDestroy(b->st);
                free(b);
                return ds_error(err, -EIO, "cuda backend: cuBLAS setup failed");
        }
        *ret = b;
        return 0;
}

static int cuda_load(Backend *b, const BkModel *model, DsError *err)
{
        int r;

        if (!b || !model)
                return ds_error(err, -EINVAL, "cuda backend: no backend or model");
        CU_TRY(cudaSetDevice(b->dev), "device");
        r = model_check(model, err);
        if (r < 0)
                return ds_error_prefix(err, "cuda backend");

        kv_free(b);
        weights_free(b);
        b->cfg = model->cfg;
        b->mla = bk_is_mla(&b->cfg);
        b->moe = b->mla && b->cfg.moe.n_routed > 0;
        const BkMoeConfig *mc = &b->cfg.moe;
        b->route = (CuRoute){.n_routed = mc->n_routed, .top_k = mc->top_k, .n_group = mc->n_group,
                .topk_group = mc->topk_group, .topk_method = (int) mc->topk_method,
                .scoring = (int) mc->scoring, .norm_topk_prob = mc->norm_topk_prob,
                .routed_scaling_factor = mc->routed_scaling_factor, .n_shared = mc->n_shared};
        r = cu_staging_open(&b->stage, b->dev, err);
        if (r == 0)
                r = weights_upload(b, model, err);
        cu_staging_close(&b->stage);
        if (r == 0)
                r = scratch_alloc(b, err);
        if (r == 0 && b->fp16_copies)
                r = fp16_copies(b, err);
        if (r == 0)
                CU_TRY(cudaDeviceSynchronize(), "weight upload");
        awq_raw_free(b);
        if (r < 0) {
                weights_free(b);
                return r;
        }
        b->model = model;
        return 0;
}

/* Runs every cuBLAS product the model's steps of up to max_rows rows can ask for once:
 * each matrix shape that linear() takes through cuBLAS at each row count blas_rows gives,
 * so that cuBLAS has chosen and loaded its kernels before a request waits on them. The
 * products read and write scratch. */
static int cuda_warm(Backend *b, uint32_t max_rows, DsError *err)
{
        if (!b || !b->model)
                return ds_error(err, -DS_ERR_MODEL_NOT_LOADED, "cuda backend: no model loaded");
        CU_TRY(cudaSetDevice(b->dev), "device");
        /* a layer's 8 linears, in dense and in MoE layers, then the lm_head */
        const CuLinear *shapes[8 * 2 + 1];
        size_t n = 0;
        for (uint32_t i = 0; i < b->cfg.n_layers; i++) {
                CuLinear *all[8];
                layer_linears(&b->layers[i], all);
                for (size_t j = 0; j < ELEMENTSOF(all); j++) {
                        const CuLinear *l = all[j];
                        bool seen = l->out == 0;
                        for (size_t k = 0; k < n && !seen; k++)
                                seen = shapes[k]->in == l->in && shapes[k]->out == l->out &&
                                       shapes[k]->awq == l->awq && !shapes[k]->w == !l->w;
                        if (!seen && n < ELEMENTSOF(shapes) - 1)
                                shapes[n++] = l;
                }
        }
        shapes[n++] = &b->lm_head;
        b->blas_status = CUBLAS_STATUS_SUCCESS;
        uint32_t top = blas_rows(MIN(max_rows, TILE_ROWS)), runs = 0;
        for (size_t k = 0; k < n; k++) {
                /* the lm_head runs on the logits rows only */
                bool head = shapes[k] == &b->lm_head;
                uint32_t ldw, last = head ? MIN(top, TILE_OUT) : top;
                const __half *w = blas_weights(b, shapes[k], &ldw);
                for (uint32_t m = blas_rows(GEMV_MAX_ROWS + 1); m <= last;
                        m = blas_rows(m + 1), runs++)
                        blas_gemm(b, shapes[k], w, ldw, b->xn, m, head ? b->logits : b->part);
        }
        CU_TRY(cudaStreamSynchronize(b->st), "cuBLAS warm-up");
        if (b->blas_status != CUBLAS_STATUS_SUCCESS)
                return ds_error(err, -EIO, "cuda backend: cuBLAS warm-up of %u products failed: %s",
                        runs, cublasGetStatusString(b->blas_status));
        return 0;
}

static uint64_t cuda_kv_bytes_per_token(const Backend *b)
{
        if (!b || !b->model)
                return 0;
        return (uint64_t) b->cfg.n_layers * (b->mla ? 1 : 2) * kv_dim(&b->cfg) * sizeof(__half);
}

static int64_t cuda_kv_init(Backend *b, uint32_t block_tokens, uint64_t mem_bytes, DsError *err)
{
        if (!b || !b->model)
                return ds_error(err, -DS_ERR_MODEL_NOT_LOADED, "cuda backend: no model loaded");
        if (block_tokens == 0)
                return ds_error(err, -EINVAL, "cuda backend: KV blocks of 0 tokens");
        CU_TRY(cudaSetDevice(b->dev), "device");
        kv_free(b);

        uint64_t block_bytes = cuda_kv_bytes_per_token(b) * block_tokens;
        /* One block more than handed out: the padding rows of graph replays write there. */
        uint64_t n_blocks = MIN(mem_bytes / block_bytes, (uint64_t) UINT32_MAX - 1);
        if (n_blocks == 0)
                return ds_error(err, -ENOMEM,
                        "cuda backend: %llu bytes hold no KV block of %u tokens (%llu bytes)",
                        (unsigned long long) mem_bytes, block_tokens,
                        (unsigned long long) block_bytes);
        size_t k_bytes = (size_t) (n_blocks + 1) * block_bytes / (b->mla ? 1 : 2);
        int r = dalloc((void **) &b->kc, k_bytes, b->mla ? "latent cache" : "K cache", err);
        if (r == 0 && !b->mla)
                r = dalloc((void **) &b->vc, k_bytes, "V cache", err);
        if (r < 0) {
                kv_free(b);
                return r;
        }
        b->block_tokens = block_tokens;
        b->n_blocks = (uint32_t) n_blocks;
        return (int64_t) n_blocks;
}

static int seq_check(const Backend *b, const BkSeq *seq, uint32_t i, DsError *err)
{
        const BkConfig *c = &b->cfg;
        uint64_t end = (uint64_t) seq->pos + seq->n_tokens;

        if (seq->chained ? seq->n_tokens != 1 : seq->n_tokens == 0 || !seq->tokens)
                return ds_error(err, -EINVAL, "cuda backend: sequence %u has %s", i,
                        seq->chained ? "chained tokens but not one" : "no tokens");
        if (end > c->max_positions)
                return ds_error(err, -DS_ERR_CONTEXT_FULL,
                        "cuda backend: sequence %u reaches position %llu, past the limit %u", i,
                        (unsigned long long) end, c->max_positions);
        for (uint32_t t = 0; t < (seq->chained ? 0 : seq->n_tokens); t++)
                if (seq->tokens[t] < 0 || (uint32_t) seq->tokens[t] >= c->vocab_size)
                        return ds_error(err, -EINVAL,
                                "cuda backend: sequence %u: token %d out of range", i,
                                seq->tokens[t]);
        uint64_t need = (end + b->block_tokens - 1) / b->block_tokens;
        if (!seq->blocks || seq->n_blocks < need)
                return ds_error(err, -EINVAL,
                        "cuda backend: sequence %u: %u KV blocks cover less than %llu positions",
                        i, seq->n_blocks, (unsigned long long) end);
        if (need > TILE_BT ||
                div_up((uint32_t) end, att_chunk(b, seq, (uint32_t) end - 1, 1)) > TILE_ITEMS)
                return ds_error(err, -DS_ERR_UNSUPPORTED,
                        "cuda backend: sequence %u: context of %llu positions is too long", i,
                        (unsigned long long) end);
        for (uint64_t k = 0; k < need; k++)
                if (seq->blocks[k] >= b->n_blocks)
                        return ds_error(err, -EINVAL,
                                "cuda backend: sequence %u: KV block id %u, the cache has %u", i,
                                seq->blocks[k], b->n_blocks);
        if (seq->sample && !seq->history && seq->n_history > 0)
                return ds_error(err, -EINVAL, "cuda backend: sequence %u: history missing", i);
        return 0;
}

/* The checks every step makes before it runs. */
static int step_check(Backend *b, const BkSeq *seqs, uint32_t n_seqs, DsError *err)
{
        if (!b || !b->model)
                return ds_error(err, -DS_ERR_MODEL_NOT_LOADED, "cuda backend: no model loaded");
        if (!b->kc)
                return ds_error(err, -EINVAL, "cuda backend: KV cache not initialised");
        CU_TRY(cudaSetDevice(b->dev), "device");
        if (n_seqs > 0 && !seqs)
                return ds_error(err, -EINVAL, "cuda backend: no sequences");
        for (uint32_t i = 0; i < n_seqs; i++) {
                int r = seq_check(b, &seqs[i], i, err);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* A step run to its end, of sequences with their tokens that step_check passed (chained
 * ones resolved to the ids their predecessor sampled). */
static int step_sync(Backend *b, const BkSeq *seqs, uint32_t n_seqs, int32_t *ret_ids,
        DsError *err)
{
        int r;

        if (n_seqs > 0 && !ret_ids)
                return ds_error(err, -EINVAL, "cuda backend: no result array");
        for (uint32_t i = 0; i < n_seqs; i++)
                ret_ids[i] = -1;
        if (graph_step(b, seqs, n_seqs))
                return run_graph(b, seqs, n_seqs, ret_ids, err);

        /* Deal the step's tokens into tiles, in sequence order, and run each. */
        Plan p = plan_new(n_seqs);
        for (uint32_t i = 0; i < n_seqs; i++)
                for (uint32_t t = 0; t < seqs[i].n_tokens; t++) {
                        bool last = t == seqs[i].n_tokens - 1;
                        bool logits = seqs[i].logits || (seqs[i].sample && last);
                        uint32_t pos = seqs[i].pos + t;
                        if (!plan_fits(b, &p, seqs, i, pos, logits)) {
                                r = run_tile(b, &p, seqs, ret_ids, err);
                                if (r < 0)
                                        return r;
                                p = plan_new(n_seqs);
                        }
                        plan_row(b, &p, seqs, i, pos, seqs[i].tokens[t], logits);
                }
        if (p.rows > 0)
                return run_tile(b, &p, seqs, ret_ids, err);
        return 0;
}

static int cuda_step(Backend *b, const BkSeq *seqs, uint32_t n_seqs, int32_t *ret_ids,
        DsError *err)
{
        int r = step_check(b, seqs, n_seqs, err);
        if (r < 0)
                return r;
        if (b->n_pend > 0)
                return ds_error(err, -EBUSY, "cuda backend: %u submitted steps not collected",
                        b->n_pend);
        for (uint32_t i = 0; i < n_seqs; i++)
                if (seqs[i].chained)
                        return ds_error(err, -EINVAL,
                                "cuda backend: sequence %u is chained, which only submit() takes",
                                i);
        /* ids_d is this step's now: nothing may chain from the last one submitted */
        b->have_last = false;
        return step_sync(b, seqs, n_seqs, ret_ids, err);
}

/* Makes pd ready for a step of n sequences, and the chain scratch too. */
static int pend_ready(Backend *b, Pending *pd, uint32_t n, DsError *err)
{
        if (!pd->done)
                CU_TRY(cudaEventCreateWithFlags(&pd->done, cudaEventDisableTiming), "step event");
        if (!pd->ids_pin) {
                CU_TRY(cudaHostAlloc((void **) &pd->ids_pin, TILE_OUT * 4, cudaHostAllocMapped),
                        "pinned ids");
                CU_TRY(cudaHostGetDevicePointer((void **) &pd->ids_map, pd->ids_pin, 0),
                        "pinned ids");
        }
        if (!b->up) {
                CU_TRY(cudaStreamCreateWithFlags(&b->up, cudaStreamNonBlocking), "upload lane");
                for (int i = 0; i < 2; i++) {
                        CU_TRY(cudaEventCreateWithFlags(&b->used[i], cudaEventDisableTiming),
                                "upload lane");
                        CU_TRY(cudaEventCreateWithFlags(&b->upd[i], cudaEventDisableTiming),
                                "upload lane");
                }
        }
        if (n > pd->cap) {
                int32_t *ids = (int32_t *) realloc(pd->ids, (size_t) n * 4);
                if (!ids)
                        return ds_error(err, -ENOMEM, "cuda backend: out of memory for ids");
                pd->ids = ids;
                pd->cap = n;
        }
        if (n > b->chain_cap) {
                BkSeq *q = (BkSeq *) realloc(b->chain_seqs, (size_t) n * sizeof(*q));
                if (q)
                        b->chain_seqs = q;
                int32_t *t = q ? (int32_t *) realloc(b->chain_tok, (size_t) n * 4) : NULL;
                if (!t)
                        return ds_error(err, -ENOMEM, "cuda backend: out of memory for a step");
                b->chain_tok = t;
                b->chain_cap = n;
        }
        return 0;
}

static const int32_t *pend_ids(const Pending *pd)
{
        return pd->async ? pd->ids_pin : pd->ids;
}

/* A decode step that can run from its graph while the host goes on: its outputs are the
 * ids alone. Its chained tokens come from the device when the step before ran there. */
static bool async_step(const Backend *b, const BkSeq *seqs, uint32_t n)
{
        if (!graph_step(b, seqs, n))
                return false;
        for (uint32_t i = 0; i < n; i++)
                if (seqs[i].sample_logits)
                        return false;
        return true;
}

/* The tokens of a step launched from its graph: a chained one refers to the step before
 * on the device when that one ran in the stream, else takes its id from the host. */
static int async_tokens(Backend *b, const BkSeq *seqs, uint32_t n, const Pending *prev,
        DsError *err)
{
        for (uint32_t i = 0; i < n; i++) {
                if (!seqs[i].chained) {
                        b->chain_tok[i] = seqs[i].tokens[0];
                        continue;
                }
                if (!prev || seqs[i].prev >= prev->n || (!prev->async && prev->ids[seqs[i].prev] < 0))
                        return ds_error(err, -EINVAL,
                                "cuda backend: sequence %u chains from sequence %u of the step "
                                "before, which sampled no id for it",
                                i, seqs[i].prev);
                b->chain_tok[i] = prev->async ? -1 - (int32_t) seqs[i].prev
                                              : prev->ids[seqs[i].prev];
        }
        return 0;
}

static int cuda_submit(Backend *b, const BkSeq *seqs, uint32_t n_seqs, DsError *err)
{
        int r = step_check(b, seqs, n_seqs, err);
        if (r < 0)
                return r;
        if (b->n_pend == 2)
                return ds_error(err, -EBUSY, "cuda backend: two steps are outstanding already");
        Pending *pd = &b->pend[(b->last + 1) % 3];
        const Pending *prev = b->have_last ? &b->pend[b->last] : NULL;
        r = pend_ready(b, pd, n_seqs, err);
        if (r < 0)
                return r;
        /* the other staging pair: the copies of the step before may not have run yet, nor
         * the stream's reads of its device copies, which the upload lane waits for */
        CU_TRY(cudaEventRecord(b->used[b->pair], b->st), "upload lane");
        stage_use(b, b->pair ^ 1);
        if (async_step(b, seqs, n_seqs)) {
                Plan p;
                r = async_tokens(b, seqs, n_seqs, prev, err);
                if (r == 0)
                        r = graph_launch(b, seqs, n_seqs, b->chain_tok, pd->ids_map, &p, err);
                if (r < 0)
                        return r;
                bool host = false;
                for (uint32_t j = 0; j < n_seqs; j++)
                        host = host || b->host_row[j];
                if (host) {
                        /* a penalty list too long for the device: sampled on the host now */
                        r = tile_outputs(b, &p, seqs, pd->ids, err);
                        if (r < 0)
                                return r;
                        pd->async = false;
                } else {
                        CU_TRY(cudaEventRecord(pd->done, b->st), "step event");
                        pd->async = true;
                }
        } else {
                /* Run to its end; chained tokens need the step before's ids on the host. */
                if (prev && prev->async)
                        CU_TRY(cudaEventSynchronize(prev->done), "step");
                r = bk_chain_resolve(seqs, n_seqs, prev ? pend_ids(prev) : NULL,
                        prev ? prev->n : 0, b->chain_seqs, b->chain_tok, err);
                if (r < 0)
                        return ds_error_prefix(err, "cuda backend");
                r = step_sync(b, b->chain_seqs, n_seqs, pd->ids, err);
                if (r < 0)
                        return r;
                pd->async = false;
        }
        pd->n = n_seqs;
        b->last = (b->last + 1) % 3;
        b->have_last = true;
        b->n_pend++;
        return 0;
}

static int cuda_collect(Backend *b, int32_t *ret_ids, uint32_t n_seqs, DsError *err)
{
        if (!b || b->n_pend == 0)
                return ds_error(err, -EINVAL, "cuda backend: no step to collect");
        CU_TRY(cudaSetDevice(b->dev), "device");
        Pending *pd = &b->pend[(b->last + 4 - b->n_pend) % 3];
        b->n_pend--;
        if (pd->async)
                CU_TRY(cudaEventSynchronize(pd->done), "step");
        if (n_seqs != pd->n || (n_seqs > 0 && !ret_ids))
                return ds_error(err, -EINVAL,
                        "cuda backend: the step collected had %u sequences, not %u", pd->n, n_seqs);
        memcpy(ret_ids, pend_ids(pd), (size_t) n_seqs * 4);
        return 0;
}

static void cuda_free(Backend *b)
{
        if (!b)
                return;
        cudaSetDevice(b->dev);
        kv_free(b);
        weights_free(b);
        cublasDestroy(b->blas);
        free(b->lib_nodes);
        cudaFree(b->blas_ws);
        cudaStreamDestroy(b->st);
        if (b->side_blas)
                cublasDestroy(b->side_blas);
        cudaFree(b->side_ws);
        if (b->side)
                cudaStreamDestroy(b->side);
        if (b->fork)
                cudaEventDestroy(b->fork);
        if (b->join)
                cudaEventDestroy(b->join);
        if (b->up)
                cudaStreamDestroy(b->up);
        for (int i = 0; i < 2; i++) {
                if (b->used[i])
                        cudaEventDestroy(b->used[i]);
                if (b->upd[i])
                        cudaEventDestroy(b->upd[i]);
        }
        for (size_t i = 0; i < ELEMENTSOF(b->pend); i++) {
                if (b->pend[i].done)
                        cudaEventDestroy(b->pend[i].done);
                cudaFreeHost(b->pend[i].ids_pin);
                free(b->pend[i].ids);
        }
        free(b->chain_seqs);
        free(b->chain_tok);
        free(b);
}

static int cuda_mem_info(const Backend *b, uint64_t *ret_used, uint64_t *ret_total)
{
        size_t free_bytes = 0, total = 0;

        if (cudaSetDevice(b->dev) != cudaSuccess || cudaMemGetInfo(&free_bytes, &total) != cudaSuccess)
                return -EIO;
        *ret_used = total - free_bytes;
        *ret_total = total;
        return 0;
}

extern "C" const BackendOps backend_cuda_ops = {
        .name = "cuda",
        .create = cuda_create,
        .load = cuda_load,
        .kv_init = cuda_kv_init,
        .kv_bytes_per_token = cuda_kv_bytes_per_token,
        .step = cuda_step,
        .submit = cuda_submit,
        .collect = cuda_collect,
        .overlaps = true,
        .mem_info = cuda_mem_info,
        .warm = cuda_warm,
        .free = cuda_free,
};

extern "C" bool cuda_device_present(void)
{
        int n = 0;
        return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/* Tests: b->xn's rows quantized into b->qx as a step's add_norm would (and the linears
 * then take them), where the integer GEMV applies. */
static int test_quantize(Backend *b, uint32_t rows, uint32_t K, DsError *err)
{
        if (rows > QX_ROWS || K % 64 != 0)
                return 0;
        b->qx.chunks = K / 64;
        int r = dalloc((void **) &b->qx.items, (size_t) rows * K * 2, "quantized x", err);
        if (r == 0)
                r = dalloc((void **) &b->qx.recs, (size_t) rows * b->qx.chunks * sizeof(float2),
                        "quantized x's scales", err);
        if (r == 0) {
                cu_quantize_x(b->st, b->xn, K, rows, K, &b->qx);
                b->qx_live = true;
        }
        return r;
}

/* Tests: the host's x (rows, K) into b->xn as FP16 through xd, on the kernels' stream (it
 * does not wait for the legacy one), and quantized where the integer GEMV applies. */
static int test_input(Backend *b, float *xd, const float *x, uint32_t rows, uint32_t K,
        DsError *err)
{
        cudaError_t e = cudaMemcpyAsync(xd, x, (size_t) rows * K * 4, cudaMemcpyHostToDevice,
                b->st);
        if (e != cudaSuccess)
                return cuda_fail(err, e, "test input");
        cu_to_half(b->st, xd, b->xn, (size_t) rows * K);
        return test_quantize(b, rows, K, err);
}

/* Tests: the launches' error, else the stream's once it has run them. */
static cudaError_t test_sync(Backend *b)
{
        cudaError_t e = cudaGetLastError();
        return e == cudaSuccess ? cudaStreamSynchronize(b->st) : e;
}

/* Tests: y (n values, rows of l->out) = the sum of s slices of n values in yh, plus l's bias. */
static void test_slices(const float *yh, uint32_t s, size_t n, const BkLinear *l, float *y)
{
        for (size_t i = 0; i < n; i++) {
                float v = 0.0f;
                for (uint32_t k = 0; k < s; k++)
                        v += yh[k * n + i];
                y[i] = v + (l->bias.data ? cpu_tensor_get(l->bias, i % l->out) : 0.0f);
        }
}

/* Tests: where part p of k (of a chunk) lies in CuQx's by-16 layout: its word and byte
 * (k 4 t + {0, 2, 1, 3} are a word's bytes 0..3). */
static void hq_place(uint32_t k, uint32_t p, uint32_t *word, uint32_t *byte)
{
        uint32_t i = k % 4;
        *word = 8 * (k / 16) + 4 * p + k % 16 / 4;
        *byte = i == 1 ? 2 : i == 2 ? 1 : i;
}

/* Tests: n values (whole chunks) quantized by 16 k into items and recs (by-16 layout),
 * with the arithmetic of the gate|up GEMV's hq_store. */
static void hq_encode(const float *v, size_t n, uint32_t *items, float2 *recs)
{
        memset(items, 0, n / 64 * 128);
        for (size_t s0 = 0; s0 < n; s0 += 16) {
                float m = 0.0f;
                for (size_t k = 0; k < 16; k++)
                        m = fmaxf(m, fabsf(v[s0 + k]));
                float inv = m > 0.0f ? (float) QX_XMAX / m : 0.0f;
                int sum = 0;
                for (size_t k = 0; k < 16; k++) {
                        int X = (int) rintf(v[s0 + k] * inv);
                        int hi = (X + 128 + 32768) / 256 - 128, part[2] = {hi, X - 256 * hi};
                        sum += X;
                        for (uint32_t p = 0; p < 2; p++) {
                                uint32_t w, byte;
                                hq_place((uint32_t) ((s0 + k) % 64), p, &w, &byte);
                                items[(s0 + k) / 64 * 32 + w] |= ((uint32_t) part[p] & 0xffu)
                                                                << (8 * byte);
                        }
                }
                float2 rec = {m / (float) QX_XMAX, 0.0f};
                memcpy(&rec.y, &sum, 4);
                recs[s0 / 16] = rec;
        }
}

/* Tests: the n values that items and recs (by-16 layout) hold; -EPROTO where a value is
 * out of range or a record's sum is not its k-step's. */
static int hq_decode(const uint32_t *items, const float2 *recs, size_t n, float *v, DsError *err)
{
        for (size_t s0 = 0; s0 < n; s0 += 16) {
                int sum = 0, want;
                memcpy(&want, &recs[s0 / 16].y, 4);
                for (size_t k = 0; k < 16; k++) {
                        int part[2];
                        for (uint32_t p = 0; p < 2; p++) {
                                uint32_t w, byte;
                                hq_place((uint32_t) ((s0 + k) % 64), p, &w, &byte);
                                part[p] = (int8_t) (items[(s0 + k) / 64 * 32 + w] >> (8 * byte));
                        }
                        int X = 256 * part[0] + part[1];
                        if (X > QX_XMAX || X < -QX_XMAX)
                                return ds_error(err, -EPROTO, "hq: k %zu is %d, out of range",
                                        s0 + k, X);
                        sum += X;
                        v[s0 + k] = recs[s0 / 16].x * (float) X;
                }
                if (sum != want)
                        return ds_error(err, -EPROTO,
                                "hq: k-step %zu's record sums %d, its values %d", s0 / 16, want,
                                sum);
        }
        return 0;
}

extern "C" int cuda_test_gate_up(const BkLinear *gate, const BkLinear *up, const float *x,
        uint32_t rows, bool by16, float *h, bool *paired, bool *fused, DsError *err)
{
        Backend *b = NULL;
        CuLinear gu = {};
        int r = cuda_create(NULL, &b, err);
        if (r < 0)
                return r;
        const BkLinear *parts[] = {gate, up};
        size_t K = gate->in, I = gate->out;
        r = upload_linear(b, parts, 2, true, &gu, "test gate_up", err);
        if (r == 0)
                r = pair_gate_up(b, &gu, "test gate_up", err);
        *paired = gu.pairs;
        *fused = false;
        float *xd = NULL;
        if (r == 0)
                r = dalloc((void **) &xd, rows * K * 4, "x", err);
        if (r == 0)
                r = dalloc((void **) &b->xn, blas_rows(rows) * K * 2, "x16", err);
        if (r == 0)
                r = dalloc((void **) &b->part,
                        (size_t) MAX(blas_rows(rows), GEMV_MAX_ROWS) * gu.splits * 2 * I * 4, "part",
                        err);
        if (r == 0)
                r = dalloc((void **) &b->hb, rows * I * 2, "hb", err);
        if (r == 0 && gu.awq)
                r = dalloc((void **) &b->w16, 2 * I * K * 2, "w16", err);
        if (r == 0 && by16 && (rows != 1 || I % 64 != 0))
                r = ds_error(err, -EINVAL, "test gate_up: hb of %u rows of %zu by 16 k", rows, I);
        if (r == 0 && by16)
                r = hq_alloc(b, I, err);
        uint16_t *hh = (uint16_t *) calloc(rows * I, 2);
        uint32_t *items = (uint32_t *) calloc(I / 2 + 1, 4);
        float2 *recs = (float2 *) calloc(I / 16 + 1, sizeof(float2));
        if (r == 0 && (!hh || !items || !recs))
                r = ds_error(err, -ENOMEM, "out of memory");
        if (r == 0)
                r = test_input(b, xd, x, rows, K, err);
        if (r == 0) {
                /* poison: a k-step not written shows as a NaN scale */
                cudaError_t e = by16 ? cudaMemsetAsync(b->hq.recs, 0xff, I / 16 * sizeof(float2),
                                               b->st)
                                     : cudaSuccess;
                const CuQx *hq = by16 ? &b->hq : NULL;
                *fused = mlp_gate_up(b, &gu, rows, &hq);
                if (by16 && !hq)
                        r = ds_error(err, -EINVAL, "test gate_up: %zu -> 2 x %zu: hb not by 16 k",
                                K, I);
                if (e == cudaSuccess)
                        e = test_sync(b);
                if (e == cudaSuccess && by16)
                        e = cudaMemcpy(items, b->hq.items, I * 2, cudaMemcpyDeviceToHost);
                if (e == cudaSuccess && by16)
                        e = cudaMemcpy(recs, b->hq.recs, I / 16 * sizeof(float2),
                                cudaMemcpyDeviceToHost);
                if (e == cudaSuccess && !by16)
                        e = cudaMemcpy(hh, b->hb, rows * I * 2, cudaMemcpyDeviceToHost);
                if (e == cudaSuccess && !by16)
                        for (size_t i = 0; i < rows * I; i++)
                                h[i] = f16_to_f32(hh[i]);
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, "test gate_up");
                else if (r == 0 && by16)
                        r = hq_decode(items, recs, I, h, err);
        }
        free(hh);
        free(items);
        free(recs);
        dfree(xd);
        linear_free(&gu);
        cuda_free(b);
        return r;
}

extern "C" int cuda_test_linear(const BkLinear *l, const float *x, uint32_t rows, float *y,
        DsError *err)
{
        Backend *b = NULL;
        CuLinear d = {};
        float *xd = NULL, *yd = NULL;
        int r = cuda_create(NULL, &b, err);
        if (r < 0)
                return r;
        const BkLinear *parts[] = {l};
        if (l->kind == BK_LINEAR_Q8)
                r = upload_q8(b, l, &d, "test linear", err);
        else
                r = upload_linear(b, parts, 1, true, &d, "test linear", err);
        size_t K = l->in, N = l->out;
        size_t slices = rows <= GEMV_MAX_ROWS ? d.splits : 1, pad = blas_rows(rows);
        if (r == 0)
                r = dalloc((void **) &xd, rows * K * 4, "x", err);
        if (r == 0)
                r = dalloc((void **) &yd, slices * pad * N * 4, "y", err);
        if (r == 0)
                r = dalloc((void **) &b->xn, pad * K * 2, "x16", err);
        if (r == 0 && d.awq)
                r = dalloc((void **) &b->w16, N * K * 2, "w16", err);
        float *yh = (float *) calloc(slices * rows * N, sizeof(float));
        if (r == 0 && !yh)
                r = ds_error(err, -ENOMEM, "out of memory");
        if (r == 0)
                r = test_input(b, xd, x, rows, K, err);
        if (r == 0) {
                uint32_t s = linear(b, &d, b->xn, rows, yd);
                cudaError_t e = test_sync(b);
                if (e == cudaSuccess)
                        e = cudaMemcpy(yh, yd, (size_t) s * rows * N * 4, cudaMemcpyDeviceToHost);
                if (e == cudaSuccess)
                        test_slices(yh, s, rows * N, l, y);
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, "test linear");
        }
        free(yh);
        dfree(xd);
        dfree(yd);
        linear_free(&d);
        cuda_free(b);
        return r;
}

extern "C" int cuda_test_screen(const BkLinear *l, const float *x, uint32_t vocab, int32_t *id,
        float *y, float *hi, DsError *err)
{
        Backend *b = NULL;
        float *xd = NULL, *yd = NULL, *qd = NULL;
        CuSampleParams *pd = NULL;
        int32_t *idd = NULL;
        int r = cuda_create(NULL, &b, err);
        if (r < 0)
                return r;
        const BkLinear *parts[] = {l};
        size_t K = l->in, N = l->out;
        b->cfg.vocab_sample = vocab;
        r = upload_linear(b, parts, 1, false, &b->lm_head, "test lm_head", err);
        if (r == 0)
                r = screen_upload(b, err);
        if (r == 0 && !b->head_q8.q8w)
                r = ds_error(err, -ENOTSUP, "test lm_head: not screened (in %zu, vocab %u)", K,
                        vocab);
        if (r == 0)
                r = dalloc((void **) &xd, K * 4, "x", err);
        if (r == 0)
                r = dalloc((void **) &yd, N * 4, "y", err);
        if (r == 0)
                r = dalloc((void **) &qd, N * 4, "8-bit logits", err);
        if (r == 0)
                r = dalloc((void **) &b->xn, K * 2, "x16", err);
        if (r == 0)
                r = dalloc((void **) &pd, sizeof(*pd), "sampling parameters", err);
        if (r == 0)
                r = dalloc((void **) &idd, sizeof(*idd), "id", err);
        if (r == 0)
                r = test_input(b, xd, x, 1, (uint32_t) K, err);
        if (r == 0) {
                cudaError_t e = cudaMemsetAsync(pd, 0, sizeof(*pd), b->st);
                linear(b, &b->lm_head, b->xn, 1, yd);
                screen_head(b, b->xn, qd, pd, idd);
                if (e == cudaSuccess)
                        e = test_sync(b);
                if (e == cudaSuccess)
                        e = cudaMemcpy(y, yd, N * 4, cudaMemcpyDeviceToHost);
                if (e == cudaSuccess)
                        e = cudaMemcpy(id, idd, sizeof(*id), cudaMemcpyDeviceToHost);
                if (e == cudaSuccess && hi)
                        e = cudaMemcpy(hi, qd, N * 4, cudaMemcpyDeviceToHost);
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, "test lm_head");
        }
        dfree(xd);
        dfree(yd);
        dfree(qd);
        dfree(pd);
        dfree(idd);
        cuda_free(b);
        return r;
}

/* Tests: n_experts AWQ linears of one shape into l, one after the other as a MoE layer
 * holds them (l describes expert 0; *qb and *sb: an expert's bytes of weights and scales). */
static int test_experts_upload(Backend *b, const BkLinear *experts, uint32_t n_experts,
        CuLinear *l, size_t *qb, size_t *sb, const char *what, DsError *err)
{
        const BkLinear *e0 = &experts[0];
        for (uint32_t e = 0; e < n_experts; e++)
                if (experts[e].kind != BK_LINEAR_AWQ || experts[e].in != e0->in ||
                        experts[e].out != e0->out || experts[e].group_size != e0->group_size)
                        return ds_error(err, -EINVAL, "%s: expert %u differs", what, e);
        *l = CuLinear{};
        l->awq = true;
        l->in = e0->in;
        l->out = e0->out;
        l->group_size = e0->group_size;
        cu_awq_sizes(l->in, l->out, l->group_size, qb, sb);
        int r = dalloc((void **) &l->qw, *qb * n_experts, "experts", err);
        if (r == 0)
                r = dalloc((void **) &l->sz, *sb * n_experts, "experts", err);
        for (uint32_t e = 0; r == 0 && e < n_experts; e++) {
                CuLinear v = *l;
                v.qw = (uint4 *) ((char *) l->qw + e * *qb);
                v.sz = (__half2 *) ((char *) l->sz + e * *sb);
                r = awq_repack_part(b, &v, &experts[e], 0, what, err);
        }
        return r;
}

/* Tests: what follows a cu_gemv_res launch in a step, for cuda_test_res and
 * cuda_test_moe_res: h (n) and w to the device, launch(hd, wd) (a producer ending in the
 * residual add and the norm's quantization into b->qx_res), then the integer GEMV of the
 * linear c taking the quantized row as the step's next linear does, into y (c->out); h
 * comes back. The consumer's FP16 input stays NaN: it must take the quantized row. */
template <typename Launch>
static int test_res_consumer(Backend *b, const BkLinear *c, size_t n, float *h, const float *w,
        float eps, float *y, bool *wide, Launch launch, DsError *err)
{
        CuLinear cd = {};
        float *hd = NULL, *wd = NULL, *yd = NULL;
        const BkLinear *cparts[] = {c};
        int r = upload_linear(b, cparts, 1, true, &cd, "test res consumer", err);
        b->qx.chunks = (uint32_t) (n / 64);
        if (r == 0 && (c->in != n || n % 64 != 0 || n / 64 > QX_SS_CHUNKS ||
                              !cu_qx_takes(&cd, 1, b->qx.chunks)))
                r = ds_error(err, -EINVAL, "test res: %zu values, then %u x %u: not taken", n,
                        c->in, c->out);
        if (r == 0)
                r = dalloc((void **) &hd, n * 4, "h", err);
        if (r == 0)
                r = dalloc((void **) &wd, n * 4, "norm weights", err);
        if (r == 0)
                r = dalloc((void **) &yd, (size_t) cd.splits * c->out * 4, "y", err);
        if (r == 0)
                r = dalloc((void **) &b->xn, n * 2, "x16 (unused)", err);
        if (r == 0)
                r = dalloc((void **) &b->qx.items, n * 2, "quantized h", err);
        if (r == 0)
                r = dalloc((void **) &b->qx.recs, n / 64 * sizeof(float2), "quantized h's scales",
                        err);
        if (r == 0)
                r = dalloc((void **) &b->qx_res.ss, QX_SS_COPIES * QX_SS_CHUNKS * sizeof(float),
                        "sums of squares", err);
        float *yh = (float *) calloc((size_t) cd.splits * c->out, sizeof(float));
        if (r == 0 && !yh)
                r = ds_error(err, -ENOMEM, "out of memory");
        if (r == 0) {
                /* on the kernels' stream, which does not wait for the legacy one */
                cudaError_t e = cudaMemcpyAsync(hd, h, n * 4, cudaMemcpyHostToDevice, b->st);
                if (e == cudaSuccess)
                        e = cudaMemcpyAsync(wd, w, n * 4, cudaMemcpyHostToDevice, b->st);
                if (e == cudaSuccess)
                        e = cudaMemsetAsync(b->xn, 0xff, n * 2, b->st);
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, "test res input");
        }
        if (r == 0) {
                float *ss = b->qx_res.ss;
                b->qx_res = b->qx;
                b->qx_res.ss = ss;
                b->qx_res.eps = eps;
                launch(hd, wd);
                b->qx_live = b->qx_deferred = true;
                if (wide)
                        *wide = cu_qx_wide(&cd, &b->qx_res);
                uint32_t s = linear(b, &cd, b->xn, 1, yd);
                cudaError_t e = test_sync(b);
                if (e == cudaSuccess)
                        e = cudaMemcpy(h, hd, n * 4, cudaMemcpyDeviceToHost);
                if (e == cudaSuccess)
                        e = cudaMemcpy(yh, yd, (size_t) s * c->out * 4, cudaMemcpyDeviceToHost);
                if (e == cudaSuccess)
                        test_slices(yh, s, c->out, c, y);
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, "test res");
        }
        free(yh);
        dfree(hd);
        dfree(wd);
        dfree(yd);
        linear_free(&cd);
        return r;
}

extern "C" int cuda_test_res(const BkLinear *l, uint32_t splits, uint32_t kw, const BkLinear *c,
        const float *x, bool by16, float *h, const float *w, float eps, float *y, bool *wide,
        DsError *err)
{
        Backend *b = NULL;
        CuLinear d = {};
        float *xd = NULL;
        __half *x16 = NULL;
        size_t K = l->in, N = l->out;
        int r = cuda_create(NULL, &b, err);
        if (r < 0)
                return r;
        const BkLinear *parts[] = {l};
        r = upload_linear(b, parts, 1, true, &d, "test res", err);
        if (r == 0 && !cu_res_set(&d, splits, kw))
                r = ds_error(err, -EINVAL, "test res: %zu x %zu in %u slices of %u warps: not taken",
                        K, N, splits, kw);
        if (r == 0)
                r = dalloc((void **) &xd, K * 4, "x", err);
        if (r == 0)
                r = dalloc((void **) &x16, K * 2, "x16", err);
        if (r == 0 && by16 && K % 64 != 0)
                r = ds_error(err, -EINVAL, "test res: x of %zu by 16 k", K);
        if (r == 0 && by16)
                r = hq_alloc(b, K, err);
        uint32_t *items = (uint32_t *) calloc(K / 2 + 1, 4);
        float2 *recs = (float2 *) calloc(K / 16 + 1, sizeof(float2));
        if (r == 0 && (!items || !recs))
                r = ds_error(err, -ENOMEM, "out of memory");
        if (r == 0 && by16) {
                hq_encode(x, K, items, recs);
                cudaError_t e = cudaMemcpyAsync(b->hq.items, items, K * 2, cudaMemcpyHostToDevice,
                        b->st);
                if (e == cudaSuccess)
                        e = cudaMemcpyAsync(b->hq.recs, recs, K / 16 * sizeof(float2),
                                cudaMemcpyHostToDevice, b->st);
                if (e == cudaSuccess)
                        e = cudaStreamSynchronize(b->st);
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, "test res quantized input");
        }
        if (r == 0) {
                cudaError_t e = cudaMemcpyAsync(xd, x, K * 4, cudaMemcpyHostToDevice, b->st);
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, "test res input");
        }
        if (r == 0)
                r = test_res_consumer(b, c, N, h, w, eps, y, wide, [&](float *hd, float *wd) {
                        /* by 16: x16 stays NaN, and the GEMV must take the quantized x */
                        if (by16)
                                cudaMemsetAsync(x16, 0xff, K * 2, b->st);
                        else
                                cu_to_half(b->st, xd, x16, K);
                        cu_gemv_res(b->st, &d, x16, hd, wd, &b->qx_res, by16 ? &b->hq : NULL);
                }, err);
        free(items);
        free(recs);
        dfree(xd);
        dfree(x16);
        linear_free(&d);
        cuda_free(b);
        return r;
}

extern "C" int cuda_test_mla_out(const BkLinear *o, const uint16_t *wuv, uint32_t H,
        uint32_t rank, uint32_t Vd, uint32_t n_items, const float *acc, const float *ml, float *y,
        DsError *err)
{
        Backend *b = NULL;
        CuLinear d = {};
        const uint32_t P = 16; /* W_UK's rows of kv_b, zero here */
        size_t n_acc = (size_t) n_items * H * rank, n_w = (size_t) H * (P + Vd) * rank;
        size_t slices = H / 2, N = o->out;
        __half *w16 = NULL, *wk = NULL, *wvt = NULL;
        float *accd = NULL, *mld = NULL, *yd = NULL;
        uint2 *items = NULL;
        int r = cuda_create(NULL, &b, err);
        if (r < 0)
                return r;
        const BkLinear *parts[] = {o};
        r = upload_linear(b, parts, 1, true, &d, "test mla out", err);
        if (r == 0 && !cu_mla_out_takes(&d, H, rank, Vd))
                r = ds_error(err, -EINVAL,
                        "test mla out: %u heads of rank %u, Vd %u, o %zu: not taken", H, rank, Vd,
                        N);
        if (r == 0)
                r = dalloc((void **) &w16, n_w * 2, "kv_b", err);
        if (r == 0)
                r = dalloc((void **) &wk, (size_t) H * P * rank * 2, "wk", err);
        if (r == 0)
                r = dalloc((void **) &wvt, (size_t) H * Vd * rank * 2, "wvt", err);
        if (r == 0)
                r = dalloc((void **) &accd, n_acc * 4, "acc", err);
        if (r == 0)
                r = dalloc((void **) &mld, (size_t) n_items * H * 8, "ml", err);
        if (r == 0)
                r = dalloc((void **) &yd, slices * N * 4, "y", err);
        if (r == 0)
                r = dalloc((void **) &items, sizeof(uint2), "items", err);
        uint16_t *wh = (uint16_t *) calloc(n_w, 2);
        float *yh = (float *) malloc(slices * N * 4);
        if (r == 0 && (!wh || !yh))
                r = ds_error(err, -ENOMEM, "out of memory");
        if (r == 0) {
                for (uint32_t h = 0; h < H; h++)
                        memcpy(wh + ((size_t) h * (P + Vd) + P) * rank,
                                wuv + (size_t) h * Vd * rank, (size_t) Vd * rank * 2);
                uint2 it = {0, n_items};
                cudaError_t e = cudaMemcpy(w16, wh, n_w * 2, cudaMemcpyHostToDevice);
                if (e == cudaSuccess)
                        e = cudaMemcpy(accd, acc, n_acc * 4, cudaMemcpyHostToDevice);
                if (e == cudaSuccess)
                        e = cudaMemcpy(mld, ml, (size_t) n_items * H * 8, cudaMemcpyHostToDevice);
                if (e == cudaSuccess)
                        e = cudaMemcpy(items, &it, sizeof(it), cudaMemcpyHostToDevice);
                /* poison: a slice element the kernel did not write shows as NaN */
                if (e == cudaSuccess)
                        e = cudaMemset(yd, 0xff, slices * N * 4);
                if (e == cudaSuccess) {
                        CuMeta meta = {};
                        meta.row_items = items;
                        cu_mla_split_kvb(b->st, w16, H, P, Vd, rank, wk, wvt);
                        cu_mla_out(b->st, &d, accd, (const float2 *) mld, meta, wvt, H, rank, Vd,
                                yd);
                        e = cudaStreamSynchronize(b->st);
                }
                if (e == cudaSuccess)
                        e = cudaMemcpy(yh, yd, slices * N * 4, cudaMemcpyDeviceToHost);
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, "test mla out");
        }
        if (r == 0)
                for (size_t i = 0; i < N; i++) {
                        float v = 0.0f;
                        for (size_t s = 0; s < slices; s++)
                                v += yh[s * N + i];
                        y[i] = v;
                }
        free(wh);
        free(yh);
        dfree(w16);
        dfree(wk);
        dfree(wvt);
        dfree(accd);
        dfree(mld);
        dfree(yd);
        dfree(items);
        linear_free(&d);
        cuda_free(b);
        return r;
}

extern "C" int cuda_test_moe_res(const BkLinear *experts, uint32_t n_experts,
        const uint32_t *expert_of, const float *pair_w, uint32_t n_pairs, uint32_t kw,
        const BkLinear *c, const float *x, float *h, const float *w, float eps, float *y,
        DsError *err)
{
        Backend *b = NULL;
        int r = cuda_create(NULL, &b, err);
        if (r < 0)
                return r;
        CuLinear l = {};
        size_t qb = 0, sb = 0, K = experts[0].in;
        float *xd = NULL, *pwd = NULL, *partd = NULL;
        __half *xh = NULL;
        uint32_t *idxd = NULL, *countd = NULL;
        r = test_experts_upload(b, experts, n_experts, &l, &qb, &sb, "test moe res", err);
        if (r == 0 && !cu_res_plan_moe(&l, n_pairs, kw))
                r = ds_error(err, -EINVAL,
                        "test moe res: %u pairs of %u x %u in CTAs of 2 x %u warps: not taken",
                        n_pairs, l.in, l.out, kw);
        if (r == 0)
                r = dalloc((void **) &xd, n_pairs * K * 4, "x", err);
        if (r == 0)
                r = dalloc((void **) &xh, n_pairs * K * 2, "x16", err);
        if (r == 0)
                r = dalloc((void **) &idxd, n_pairs * 4, "experts of the pairs", err);
        if (r == 0)
                r = dalloc((void **) &pwd, n_pairs * 4, "pair weights", err);
        if (r == 0)
                r = dalloc((void **) &partd, (size_t) n_pairs * l.out * 4, "pair sums", err);
        if (r == 0)
                r = dalloc((void **) &countd, l.out / 64 * 4, "counts", err);
        if (r == 0) {
                cudaError_t e = cudaMemcpyAsync(xd, x, n_pairs * K * 4, cudaMemcpyHostToDevice,
                        b->st);
                if (e == cudaSuccess)
                        e = cudaMemcpyAsync(idxd, expert_of, n_pairs * 4, cudaMemcpyHostToDevice,
                                b->st);
                if (e == cudaSuccess)
                        e = cudaMemcpyAsync(pwd, pair_w, n_pairs * 4, cudaMemcpyHostToDevice,
                                b->st);
                if (e == cudaSuccess)
                        e = cudaMemsetAsync(countd, 0, l.out / 64 * 4, b->st);
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, "test moe res input");
        }
        if (r == 0)
                r = test_res_consumer(b, c, l.out, h, w, eps, y, NULL, [&](float *hd, float *wd) {
                        cu_to_half(b->st, xd, xh, n_pairs * K);
                        cu_gemv_res_moe(b->st, &l, qb / 16, sb / 4, idxd, pwd, xh, (uint32_t) K,
                                hd, wd, &b->qx_res, partd, countd);
                }, err);
        dfree(xd);
        dfree(xh);
        dfree(idxd);
        dfree(pwd);
        dfree(partd);
        dfree(countd);
        linear_free(&l);
        cuda_free(b);
        return r;
}

extern "C" int cuda_test_qkv_rope(const BkLinear *l, uint32_t n_heads, uint32_t n_kv_heads,
        uint32_t hd, const float *inv_freq, const float *x, const uint32_t *pos, uint32_t rows,
        bool fuse, float *q, float *k, float *v, bool *paired, bool *fused, DsError *err)
{
        Backend *b = NULL;
        CuLinear d = {};
        float *xd = NULL;
        uint32_t *pd = NULL;
        __half *kc = NULL, *vc = NULL;
        size_t K = l->in, qd = (size_t) n_heads * hd, kvd = (size_t) n_kv_heads * hd;
        int r = cuda_create(NULL, &b, err);
        if (r < 0)
                return r;
        b->cfg.n_heads = n_heads;
        b->cfg.n_kv_heads = n_kv_heads;
        b->cfg.head_dim = hd;
        b->attention_factor = 1.0f;
        const BkLinear *parts[] = {l};
        r = upload_linear(b, parts, 1, true, &d, "test qkv", err);
        if (r == 0)
                r = pair_qkv_rope(b, &d, "test qkv", err);
        *paired = d.rope_tph != 0;
        *fused = false;
        if (r == 0)
                r = dalloc((void **) &xd, rows * K * 4, "x", err);
        if (r == 0)
                r = dalloc((void **) &b->xn, blas_rows(rows) * K * 2, "x16", err);
        if (r == 0)
                r = dalloc((void **) &b->part,
                        (size_t) MAX(blas_rows(rows), GEMV_MAX_ROWS) * d.splits * l->out * 4, "part",
                        err);
        if (r == 0 && d.awq)
                r = dalloc((void **) &b->w16, l->out * K * 2, "w16", err);
        if (r == 0)
                r = dalloc((void **) &b->q, rows * qd * 4, "q", err);
        if (r == 0)
                r = dalloc((void **) &kc, rows * kvd * 2, "k", err);
        if (r == 0)
                r = dalloc((void **) &vc, rows * kvd * 2, "v", err);
        if (r == 0)
                r = dalloc((void **) &b->inv_freq, hd / 2 * 4, "inv_freq", err);
        if (r == 0)
                r = dalloc((void **) &pd, 2 * rows * 4, "positions", err);
        uint32_t *pm = (uint32_t *) calloc(2 * rows, 4); /* positions, then slots */
        uint16_t *kh = (uint16_t *) calloc(2 * rows * kvd, 2);
        if (r == 0 && (!pm || !kh))
                r = ds_error(err, -ENOMEM, "out of memory");
        if (r == 0) {
                for (uint32_t i = 0; i < rows; i++) {
                        pm[i] = pos[i];
                        pm[rows + i] = i;
                }
                b->meta.pos = pd;
                b->meta.slot = pd + rows;
                cudaError_t e = cudaMemcpyAsync(pd, pm, 2 * rows * 4, cudaMemcpyHostToDevice,
                        b->st);
                if (e == cudaSuccess)
                        e = cudaMemcpyAsync(b->inv_freq, inv_freq, hd / 2 * 4,
                                cudaMemcpyHostToDevice, b->st);
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, "test qkv rope: inputs");
        }
        if (r == 0)
                r = test_input(b, xd, x, rows, K, err);
        if (r == 0) {
                *fused = qkv_rope(b, &d, rows, fuse, kc, vc);
                cudaError_t e = test_sync(b);
                if (e == cudaSuccess)
                        e = cudaMemcpy(q, b->q, rows * qd * 4, cudaMemcpyDeviceToHost);
                if (e == cudaSuccess)
                        e = cudaMemcpy(kh, kc, rows * kvd * 2, cudaMemcpyDeviceToHost);
                if (e == cudaSuccess)
                        e = cudaMemcpy(kh + rows * kvd, vc, rows * kvd * 2, cudaMemcpyDeviceToHost);
                if (e == cudaSuccess)
                        for (size_t i = 0; i < rows * kvd; i++) {
                                k[i] = f16_to_f32(kh[i]);
                                v[i] = f16_to_f32(kh[rows * kvd + i]);
                        }
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, "test qkv rope");
        }
        free(pm);
        free(kh);
        dfree(xd);
        dfree(pd);
        dfree(kc);
        dfree(vc);
        linear_free(&d);
        cuda_free(b);
        return r;
}

extern "C" int cuda_test_experts(const BkLinear *experts, uint32_t n_experts,
        const uint32_t *expert_of, uint32_t n_pairs, uint32_t x_div, bool reverse, bool grouped,
        const float *x, float *y, DsError *err)
{
        Backend *b = NULL;
        int r = cuda_create(NULL, &b, err);
        if (r < 0)
                return r;
        CuLinear l = {};
        size_t qb = 0, sb = 0;
        r = test_experts_upload(b, experts, n_experts, &l, &qb, &sb, "test experts", err);
        l.splits = r == 0 && !grouped ? cu_awq_splits(b->n_sm, l.out, l.in, 6) : 1;
        size_t K = l.in, N = l.out, x_rows = (n_pairs + x_div - 1) / x_div;
        size_t y_floats = (size_t) l.splits * n_pairs * N;
        uint32_t *off = (uint32_t *) calloc(n_experts + 1, sizeof(uint32_t));
        uint32_t *list = (uint32_t *) calloc(n_pairs + 1, sizeof(uint32_t));
        float *xd = NULL, *yd = NULL, *yh = (float *) calloc(y_floats, sizeof(float));
        __half *xh = NULL;
        uint32_t *offd = NULL, *listd = NULL;
        if (!off || !list || !yh)
                r = ds_error(err, -ENOMEM, "test experts: out of memory");
        /* counting sort of the pairs by expert, in pair order or its reverse */
        for (uint32_t p = 0; r == 0 && p < n_pairs; p++)
                off[expert_of[p] + 1]++;
        for (uint32_t e = 0; r == 0 && e < n_experts; e++)
                off[e + 1] += off[e];
        for (uint32_t i = 0; r == 0 && i < n_pairs; i++) {
                uint32_t p = reverse ? n_pairs - 1 - i : i;
                list[off[expert_of[p]]++] = p;
        }
        for (uint32_t e = n_experts; r == 0 && e > 0; e--)
                off[e] = off[e - 1];
        if (r == 0)
                off[0] = 0;
        if (r == 0)
                r = dalloc((void **) &xd, x_rows * K * 4, "x", err);
        if (r == 0)
                r = dalloc((void **) &xh, x_rows * K * 2, "x16", err);
        if (r == 0)
                r = dalloc((void **) &yd, y_floats * 4, "y", err);
        if (r == 0)
                r = dalloc((void **) &offd, (n_experts + 1) * 4, "off", err);
        if (r == 0)
                r = dalloc((void **) &listd, (n_pairs + 1) * 4, "list", err);
        if (r == 0) {
                cudaError_t e = cudaMemcpyAsync(xd, x, x_rows * K * 4, cudaMemcpyHostToDevice,
                        b->st);
                if (e == cudaSuccess)
                        e = cudaMemcpyAsync(offd, off, (n_experts + 1) * 4,
                                cudaMemcpyHostToDevice, b->st);
                if (e == cudaSuccess)
                        e = cudaMemcpyAsync(listd, list, (n_pairs + 1) * 4,
                                cudaMemcpyHostToDevice, b->st);
                /* poison: a row a slice misses shows as NaN */
                if (e == cudaSuccess)
                        e = cudaMemsetAsync(yd, 0xff, y_floats * 4, b->st);
                if (e == cudaSuccess) {
                        cu_to_half(b->st, xd, xh, x_rows * K);
                        if (grouped)
                                cu_gemm_experts(b->st, &l, n_experts, n_pairs, qb / 16, sb / 4,
                                        NULL, offd, listd, x_div, xh, (uint32_t) K, yd);
                        else
                                cu_gemv_experts(b->st, &l, n_experts, qb / 16, sb / 4, NULL,
                                        offd, listd, x_div, (uint32_t) x_rows, xh, (uint32_t) K,
                                        yd, (size_t) n_pairs * N, NULL, EXPERTS_PLAIN);
                        e = cudaGetLastError();
                }
                if (e == cudaSuccess)
                        e = cudaStreamSynchronize(b->st);
                if (e == cudaSuccess)
                        e = cudaMemcpy(yh, yd, y_floats * 4, cudaMemcpyDeviceToHost);
                /* the EARLY order's kernel (its first weights before the wait, a step's down
                 * from two rows) gives the same bits (its first slice) */
                if (e == cudaSuccess && !grouped) {
                        e = cudaMemsetAsync(yd, 0xff, y_floats * 4, b->st);
                        if (e == cudaSuccess &&
                                cu_gemv_experts(b->st, &l, n_experts, qb / 16, sb / 4, NULL, offd,
                                        listd, x_div, (uint32_t) x_rows, xh, (uint32_t) K, yd,
                                        (size_t) n_pairs * N, NULL, EXPERTS_EARLY))
                                e = cudaGetLastError();
                        if (e == cudaSuccess)
                                e = cudaStreamSynchronize(b->st);
                        if (e == cudaSuccess)
                                e = cudaMemcpy(y, yd, (size_t) n_pairs * N * 4,
                                        cudaMemcpyDeviceToHost);
                        if (e == cudaSuccess && memcmp(y, yh, (size_t) n_pairs * N * 4) != 0)
                                r = ds_error(err, -EPROTO,
                                        "test experts: the EARLY order's results differ");
                }
                if (e == cudaSuccess)
                        for (size_t i = 0; i < (size_t) n_pairs * N; i++) {
                                float v = 0.0f;
                                for (uint32_t s = 0; s < l.splits; s++)
                                        v += yh[s * (size_t) n_pairs * N + i];
                                y[i] = v;
                        }
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, "test experts");
        }
        free(off);
        free(list);
        free(yh);
        dfree(xd);
        dfree(xh);
        dfree(yd);
        dfree(offd);
        dfree(listd);
        linear_free(&l);
        cuda_free(b);
        return r;
}

extern "C" int cuda_test_moe_route(const BkMoeConfig *mc, const float *logits, const float *bias,
        uint32_t rows, uint32_t *idx, float *w, DsError *err)
{
        CuRoute rt = {.n_routed = mc->n_routed, .top_k = mc->top_k, .n_group = mc->n_group,
                .topk_group = mc->topk_group, .topk_method = (int) mc->topk_method,
                .scoring = (int) mc->scoring, .norm_topk_prob = mc->norm_topk_prob,
                .routed_scaling_factor = mc->routed_scaling_factor, .n_shared = 0};
        size_t nl = (size_t) rows * mc->n_routed, nk = (size_t) rows * mc->top_k;
        float *ld = NULL, *bd = NULL, *wd = NULL;
        uint32_t *id = NULL;
        int r = dalloc((void **) &ld, nl * 4, "logits", err);
        if (r == 0)
                r = dalloc((void **) &bd, mc->n_routed * 4, "bias", err);
        if (r == 0)
                r = dalloc((void **) &wd, nk * 4, "weights", err);
        if (r == 0)
                r = dalloc((void **) &id, nk * 4, "ids", err);
        if (r == 0) {
                cudaError_t e = cudaMemcpy(ld, logits, nl * 4, cudaMemcpyHostToDevice);
                if (e == cudaSuccess && bias)
                        e = cudaMemcpy(bd, bias, mc->n_routed * 4, cudaMemcpyHostToDevice);
                if (e == cudaSuccess) {
                        cu_moe_route(0, ld, 1, nl, bias ? bd : NULL, rt, rows, id, wd);
                        e = cudaDeviceSynchronize();
                }
                if (e == cudaSuccess)
                        e = cudaMemcpy(idx, id, nk * 4, cudaMemcpyDeviceToHost);
                if (e == cudaSuccess)
                        e = cudaMemcpy(w, wd, nk * 4, cudaMemcpyDeviceToHost);
                if (e != cudaSuccess)
                        r = cuda_fail(err, e, "test routing");
        }
        dfree(ld);
        dfree(bd);
        dfree(wd);
        dfree(id);
        return r;
}

extern "C" int cuda_test_sample(const float *logits, uint32_t rows, uint32_t vocab,
        const BkSeq *seqs, bool graph, int32_t *ids, float *logits_after, DsError *err)
{
        Backend *b = NULL;
        cudaGraphExec_t exec = NULL;
        size_t bytes = (size_t) rows * vocab * 4;

        if (rows == 0 || rows > TILE_OUT)
                return ds_error(err, -EINVAL, "test sample: %u rows, 1 to %u", rows, TILE_OUT);
        /* Only what sampling uses: no cuBLAS, no weights. */
        b = (Backend *) calloc(1, sizeof(*b));
        if (!b)
                return ds_error(err, -ENOMEM, "test sample: out of memory");
        cudaError_t e = cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking);
        if (e != cudaSuccess) {
                free(b);
                return cuda_fail(err, e, "test sample stream");
        }
        b->cfg.vocab_size = b->cfg.vocab_sample = vocab;
        int r = sample_alloc(b, err);
        if (r == 0)
                r = dalloc((void **) &b->logits, bytes, "test logits", err);
        if (r == 0)
                r = dalloc((void **) &b->ids_d, TILE_OUT * 4, "test ids", err);
        if (r == 0)
                r = cudaMallocHost((void **) &b->ids_h, TILE_OUT * 4) == cudaSuccess
                            ? 0
                            : ds_error(err, -ENOMEM, "test sample: pinned ids");
        if (r == 0 && graph) {
                /* Captured before the parameters go up: a replay reads them afresh. */
                cudaGraph_t g;
                e = cudaStreamBeginCapture(b->st, cudaStreamCaptureModeThreadLocal);
                cu_sample(b->st, b->logits, rows, vocab, vocab, b->samp_d, b->pen_d, b->pen_saved,
                        b->ids_d);
                if (e == cudaSuccess)
                        e = cudaStreamEndCapture(b->st, &g);
                if (e == cudaSuccess) {
                        e = cudaGraphInstantiate(&exec, g, 0);
                        cudaGraphDestroy(g);
                }
        }
        if (r == 0 && e == cudaSuccess) {
                Plan p = plan_new(rows);
                p.rows = p.n_out = rows;
                for (uint32_t i = 0; i < rows; i++)
                        b->rows[i] = (Row){
                                .seq = i, .pos = seqs[i].pos + seqs[i].n_tokens - 1, .logits = true};
                e = cudaMemcpyAsync(b->logits, logits, bytes, cudaMemcpyHostToDevice, b->st);
                if (e == cudaSuccess)
                        r = sample_upload(b, &p, seqs, rows, NULL, b->st, err);
                if (r == 0 && e == cudaSuccess) {
                        if (exec)
                                e = cudaGraphLaunch(exec, b->st);
                        else
                                cu_sample(b->st, b->logits, rows, vocab, vocab, b->samp_d,
                                        b->pen_d, b->pen_saved, b->ids_d);
                }
                if (r == 0 && e == cudaSuccess)
                        e = cudaMemcpyAsync(b->ids_h, b->ids_d, rows * 4, cudaMemcpyDeviceToHost,
                                b->st);
                if (r == 0 && e == cudaSuccess && logits_after)
                        e = cudaMemcpyAsync(logits_after, b->logits, bytes, cudaMemcpyDeviceToHost,
                                b->st);
                if (r == 0 && e == cudaSuccess)
                        e = cudaStreamSynchronize(b->st);
                for (uint32_t i = 0; r == 0 && e == cudaSuccess && i < rows; i++)
                        ids[i] = b->host_row[i]
                                         ? bk_sample(logits + (size_t) i * vocab, vocab,
                                                   &seqs[i].sampling, seqs[i].history,
                                                   seqs[i].n_history, seqs[i].draw, b->sample_f,
                                                   b->sample_i)
                                         : b->ids_h[i];
        }
        if (r == 0 && e != cudaSuccess)
                r = cuda_fail(err, e, "test sample");
        if (exec)
                cudaGraphExecDestroy(exec);
        weights_free(b);
        cudaStreamDestroy(b->st);
        free(b);
        return r;
}
