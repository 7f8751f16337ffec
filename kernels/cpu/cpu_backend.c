/* SPDX-License-Identifier: MIT */
/* The CPU reference backend: Llama, Qwen2 and DeepSeek-V2/V3 (MLA + MoE) forward passes
 * in float32, laid out like llama2.c's run.c. The config and the weights belong to the BkModel
 * (read in place, never written); the run state and the paged KV cache belong to the backend.
 *
 * A step's tokens are processed in tiles of up to TILE_ROWS rows, each tile through every
 * layer before the next one starts, so later tiles see earlier tiles' K/V in the cache.
 * Every row is computed with the same loops in the same order whichever tile it lands in,
 * which makes a sequence's logits bit-identical alone or in any batch, and for any split
 * of its prompt into chunks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu_linear.h"
#include "cpu_mla.h"
#include "cpu_moe.h"
#include "cpu_rope.h"

/* Rows (tokens, from any sequences) that go through the layers together. More rows share
 * each dequantized weight; fewer keep the activations in cache. */
#define TILE_ROWS 32

/* q_a_layernorm and kv_a_layernorm are built without an eps argument in the reference,
 * so they keep RMSNorm's default. */
#define MLA_NORM_EPS 1e-6f

/* One token of the step: which sequence, where, and whether its logits are wanted. */
typedef struct Row {
        uint32_t seq; /* index into the step's seqs */
        uint32_t pos; /* absolute position */
        int32_t token;
        bool logits; /* compute this row's logits (asked for, or sampled from) */
} Row;

/* MLA caches one latent per token instead of K and V: k holds, per position,
 * [kv_a_layernorm(c_kv) | roped k_pe] (kv_width = kv_lora_rank + R), and v is NULL. */
typedef struct KvCache {
        uint32_t block_tokens;
        uint32_t n_blocks;
        float *k; /* (layer, block, block_tokens, kv_width) */
        float *v; /* (layer, block, block_tokens, kv_width); NULL for MLA */
} KvCache;

/* Scratch reused by every step, sized at load for TILE_ROWS rows. */
typedef struct RunState {
        float *x;               /* (TILE_ROWS, hidden) the residual stream */
        float *xb;              /* (TILE_ROWS, hidden) a sublayer's normed input or its output */
        float *q;               /* (TILE_ROWS, n_heads * head_dim) */
        float *k;               /* (TILE_ROWS, kv_dim) */
        float *v;               /* (TILE_ROWS, kv_dim) */
        float *att_out;         /* (TILE_ROWS, n_heads * max(head_dim, Vd)) weighted values */
        float *hb;              /* (TILE_ROWS, mlp_width) gate, then silu(gate) * up */
        float *hb2;             /* (TILE_ROWS, mlp_width) up */
        float *att;             /* (max_positions) one head's scores for one row */
        float *cos;             /* (TILE_ROWS, rope_dim / 2) */
        float *sin;             /* (TILE_ROWS, rope_dim / 2) */
        float *inv_freq;        /* (rope_dim / 2) rope frequencies, computed at load */
        float attention_factor; /* multiplies cos and sin (yarn) */
        float *logits;          /* (TILE_ROWS, vocab_size) the rows whose logits are wanted */
        float *linear;          /* (threads, largest cpu_linear_scratch_size) */
        float *sample_f;        /* (vocab_size) bk_sample scratch */
        int32_t *sample_i;      /* (vocab_size) bk_sample scratch */
        /* MLA only */
        float *qa;    /* (TILE_ROWS, q_lora_rank) q_a_proj, then q_a_layernorm */
        float *kva;   /* (TILE_ROWS, kv_lora_rank + R) kv_a_proj_with_mqa */
        float *q_lat; /* (TILE_ROWS, n_heads, kv_lora_rank) absorbed queries */
        float *o_lat; /* (TILE_ROWS, n_heads, kv_lora_rank) weighted latent sums */
        float *wrow;  /* (n_heads * (P + Vd)) one dequantized row of kv_b_proj */
        /* MoE only */
        float *router;        /* (TILE_ROWS, n_routed) router logits */
        float *route;         /* (cpu_moe_route_scratch) */
        uint32_t *expert_idx; /* (TILE_ROWS, top_k) each row's experts, ascending */
        float *expert_w;      /* (TILE_ROWS, top_k) their weights */
        float *gx;            /* (TILE_ROWS, hidden) the rows routed to one expert */
        float *gy;            /* (TILE_ROWS, hidden) that expert's outputs for them */
        float *moe_out;       /* (TILE_ROWS, hidden) the weighted sum of routed outputs */
        Row rows[TILE_ROWS];
} RunState;

/* A submitted step's ids (submit() runs the step at once). */
typedef struct Done {
        int32_t *ids;
        uint32_t n, cap;
} Done;

struct Backend {
        const BkModel *model; /* config and weights, owned by the caller; NULL until load */
        CpuPool *pool;        /* BkOptions.threads: the linear layers' threads */
        RunState s;
        KvCache kv;
        /* Steps submitted, a ring of three: up to two outstanding, and the newest still
         * readable after its collect, since the next submit may chain from it. */
        Done done[3];
        uint32_t last, n_out;
        bool have_last;
        BkSeq *chain_seqs; /* (chain_cap) the step with chained tokens resolved */
        int32_t *chain_tok;
        uint32_t chain_cap;
};

/* ---------------------------------------------------------------------------------------
 * Run state and KV cache */

static void run_state_free(RunState *s)
{
        free(s->x);
        free(s->xb);
        free(s->q);
        free(s->k);
        free(s->v);
        free(s->att_out);
        free(s->hb);
        free(s->hb2);
        free(s->att);
        free(s->cos);
        free(s->sin);
        free(s->inv_freq);
        free(s->logits);
        free(s->linear);
        free(s->sample_f);
        free(s->sample_i);
        free(s->qa);
        free(s->kva);
        free(s->q_lat);
        free(s->o_lat);
        free(s->wrow);
        free(s->router);
        free(s->route);
        free(s->expert_idx);
        free(s->expert_w);
        free(s->gx);
        free(s->gy);
        free(s->moe_out);
        *s = (RunState){0};
}

static void kv_free(KvCache *kv)
{
        free(kv->k);
        free(kv->v);
        *kv = (KvCache){0};
}

/* Floats per cached position per layer. */
static uint32_t kv_width(const BkConfig *c)
{
        return bk_is_mla(c) ? c->mla.kv_lora_rank + c->mla.qk_rope_dim
                            : c->n_kv_heads * c->head_dim;
}

/* The part of a head RoPE rotates. */
static uint32_t rope_dim(const BkConfig *c)
{
        return bk_is_mla(c) ? c->mla.qk_rope_dim : c->head_dim;
}

/* The router as a dense linear, so its logits use the same float32 dot as every linear. */
static BkLinear router_linear(const BkConfig *c, const BkMoe *moe)
{
        return (BkLinear){
                .kind = BK_LINEAR_DENSE, .in = c->hidden, .out = c->moe.n_routed, .w = moe->router};
}

static size_t expert_scratch_max(size_t n, const BkExpert *e)
{
        n = MAX(n, cpu_linear_scratch_size(&e->gate));
        n = MAX(n, cpu_linear_scratch_size(&e->up));
        return MAX(n, cpu_linear_scratch_size(&e->down));
}

static size_t linear_scratch_max(const BkModel *m)
{
        const BkConfig *c = &m->cfg;
        size_t n = cpu_linear_scratch_size(&m->lm_head);

        for (uint32_t l = 0; l < c->n_layers; l++) {
                const BkLayer *L = &m->layers[l];
                const BkLinear *all[] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down,
                        &L->mla.q_a, &L->mla.q_b, &L->mla.kv_a, &L->mla.kv_b};
                for (size_t i = 0; i < ELEMENTSOF(all); i++)
                        n = MAX(n, cpu_linear_scratch_size(all[i]));
                if (!L->moe.experts)
                        continue;
                BkLinear router = router_linear(c, &L->moe);
                n = MAX(n, cpu_linear_scratch_size(&router));
                for (uint32_t e = 0; e < c->moe.n_routed; e++)
                        n = expert_scratch_max(n, &L->moe.experts[e]);
                n = expert_scratch_max(n, &L->moe.shared);
        }
        return n;
}

static int run_state_alloc(RunState *s, const BkModel *m, uint32_t threads)
{
        const BkConfig *c = &m->cfg;
        size_t q_dim = (size_t) c->n_heads * c->head_dim;
        size_t kv_dim = (size_t) c->n_kv_heads * c->head_dim;
        size_t out_dim = MAX(q_dim, (size_t) c->n_heads * c->mla.v_head_dim);
        size_t mlp_width = MAX(c->intermediate, c->moe.expert_dim * MAX(c->moe.n_shared, 1u));
        size_t rd = rope_dim(c);

        if (bk_is_mla(c)) {
                const BkMlaConfig *mla = &c->mla;
                size_t lat = (size_t) TILE_ROWS * c->n_heads * mla->kv_lora_rank;
                s->qa = calloc((size_t) TILE_ROWS * MAX(mla->q_lora_rank, 1u), sizeof(float));
                s->kva = calloc((size_t) TILE_ROWS * kv_width(c), sizeof(float));
                s->q_lat = calloc(lat, sizeof(float));
                s->o_lat = calloc(lat, sizeof(float));
                s->wrow = calloc(
                        (size_t) c->n_heads * (mla->qk_nope_dim + mla->v_head_dim), sizeof(float));
                if (!s->qa || !s->kva || !s->q_lat || !s->o_lat || !s->wrow)
                        return -ENOMEM;
        }
        if (c->moe.n_routed > 0) {
                const BkMoeConfig *mc = &c->moe;
                s->router = calloc((size_t) TILE_ROWS * mc->n_routed, sizeof(float));
                s->route = calloc(cpu_moe_route_scratch(mc), sizeof(float));
                s->expert_idx = calloc((size_t) TILE_ROWS * mc->top_k, sizeof(uint32_t));
                s->expert_w = calloc((size_t) TILE_ROWS * mc->top_k, sizeof(float));
                s->gx = calloc((size_t) TILE_ROWS * c->hidden, sizeof(float));
                s->gy = calloc((size_t) TILE_ROWS * c->hidden, sizeof(float));
                s->moe_out = calloc((size_t) TILE_ROWS * c->hidden, sizeof(float));
                if (!s->router || !s->route || !s->expert_idx || !s->expert_w || !s->gx || !s->gy ||
                        !s->moe_out)
                        return -ENOMEM;
        }

        s->x = calloc((size_t) TILE_ROWS * c->hidden, sizeof(float));
        s->xb = calloc((size_t) TILE_ROWS * c->hidden, sizeof(float));
        s->q = calloc(TILE_ROWS * q_dim, sizeof(float));
        s->k = calloc(TILE_ROWS * kv_dim, sizeof(float));
        s->v = calloc(TILE_ROWS * kv_dim, sizeof(float));
        s->att_out = calloc(TILE_ROWS * out_dim, sizeof(float));
        s->hb = calloc(TILE_ROWS * mlp_width, sizeof(float));
        s->hb2 = calloc(TILE_ROWS * mlp_width, sizeof(float));
        s->att = calloc(c->max_positions, sizeof(float));
        s->cos = calloc(TILE_ROWS * rd / 2, sizeof(float));
        s->sin = calloc(TILE_ROWS * rd / 2, sizeof(float));
        s->inv_freq = calloc(rd / 2, sizeof(float));
        s->logits = calloc((size_t) TILE_ROWS * c->vocab_size, sizeof(float));
        s->linear = calloc(threads * linear_scratch_max(m), sizeof(float));
        s->sample_f = calloc(c->vocab_size, sizeof(float));
        s->sample_i = calloc(c->vocab_size, sizeof(int32_t));
        if (!s->x || !s->xb || !s->q || !s->k || !s->v || !s->att_out || !s->hb || !s->hb2 ||
                !s->att || !s->cos || !s->sin || !s->inv_freq || !s->logits || !s->linear ||
                !s->sample_f || !s->sample_i)
                return -ENOMEM;
        return 0;
}

/* ---------------------------------------------------------------------------------------
 * The forward pass */

/* o = x * rsqrt(mean(x^2) + eps) * w, in float32, for each of rows rows of n. */
static void rmsnorm(float *o, const float *x, BkTensor w, uint32_t rows, uint32_t n, float eps)
{
        for (uint32_t r = 0; r < rows; r++) {
                const float *xr = x + (size_t) r * n;
                float * or = o + (size_t) r * n;
                float ss = 0.0f;
                for (uint32_t i = 0; i < n; i++)
                        ss += xr[i] * xr[i];
                float inv = 1.0f / sqrtf(ss / (float) n + eps);
                for (uint32_t i = 0; i < n; i++)
                        or [i] = cpu_tensor_get(w, i) * (xr[i] * inv);
        }
}

static float *kv_at(const KvCache *kv, float *cache, uint32_t kv_dim, uint32_t layer,
        const BkSeq *seq, uint32_t pos)
{
        uint32_t block = seq->blocks[pos / kv->block_tokens];
        size_t slot =
                ((size_t) layer * kv->n_blocks + block) * kv->block_tokens + pos % kv->block_tokens;
        return cache + slot * kv_dim;
}

/* x[0..n) = softmax of x, whose maximum is max, in place (llama2.c's order). */
static void softmax(float *x, uint32_t n, float max)
{
        float sum = 0.0f;
        for (uint32_t t = 0; t < n; t++) {
                x[t] = expf(x[t] - max);
                sum += x[t];
        }
        for (uint32_t t = 0; t < n; t++)
                x[t] /= sum;
}

/* Causal attention of one row over positions 0..row->pos of its sequence. */
static void attention_row(
        Backend *b, const BkSeq *seq, const Row *row, uint32_t layer, const float *q, float *out)
{
        const BkConfig *c = &b->model->cfg;
        uint32_t hd = c->head_dim, kv_dim = c->n_kv_heads * hd;
        uint32_t group = c->n_heads / c->n_kv_heads;
        float scale = (float) (1.0 / sqrt((double) hd));
        float *att = b->s.att;

        for (uint32_t h = 0; h < c->n_heads; h++) {
                const float *qh = q + (size_t) h * hd;
                uint32_t kvh = h / group;
                float *oh = out + (size_t) h * hd;

                /* scores */
                float max = -INFINITY;
                for (uint32_t t = 0; t <= row->pos; t++) {
                        const float *k = kv_at(&b->kv, b->kv.k, kv_dim, layer, seq, t) + kvh * hd;
                        float score = 0.0f;
                        for (uint32_t i = 0; i < hd; i++)
                                score += qh[i] * k[i];
                        att[t] = score * scale;
                        max = fmaxf(max, att[t]);
                }

                softmax(att, row->pos + 1, max);

                /* weighted sum of the values */
                memset(oh, 0, hd * sizeof(float));
                for (uint32_t t = 0; t <= row->pos; t++) {
                        const float *v = kv_at(&b->kv, b->kv.v, kv_dim, layer, seq, t) + kvh * hd;
                        for (uint32_t i = 0; i < hd; i++)
                                oh[i] += att[t] * v[i];
                }
        }
}

/* Causal attention of one row over the latent cache, in the absorbed form: head h scores
 * position t as q_lat[h]·c_kv[t] + q_pe[h]·k_pe[t] and sums the latents c_kv[t]. q is the
 * row's (n_heads, P + R) queries with the rope part rotated, out its (n_heads, rank). */
static void attention_row_mla(Backend *b, const BkSeq *seq, const Row *row, uint32_t layer,
        const float *q, const float *q_lat, float *out)
{
        const BkConfig *c = &b->model->cfg;
        const BkMlaConfig *m = &c->mla;
        uint32_t rank = m->kv_lora_rank, R = m->qk_rope_dim, qk = c->head_dim;
        uint32_t width = kv_width(c);
        float *att = b->s.att;

        for (uint32_t h = 0; h < c->n_heads; h++) {
                const float *ql = q_lat + (size_t) h * rank;
                const float *qpe = q + (size_t) h * qk + m->qk_nope_dim;
                float *oh = out + (size_t) h * rank;

                /* scores */
                float max = -INFINITY;
                for (uint32_t t = 0; t <= row->pos; t++) {
                        const float *lat = kv_at(&b->kv, b->kv.k, width, layer, seq, t);
                        float nope = 0.0f, pe = 0.0f;
                        for (uint32_t i = 0; i < rank; i++)
                                nope += ql[i] * lat[i];
                        for (uint32_t i = 0; i < R; i++)
                                pe += qpe[i] * lat[rank + i];
                        att[t] = (nope + pe) * m->softmax_scale;
                        max = fmaxf(max, att[t]);
                }

                softmax(att, row->pos + 1, max);

                /* weighted sum of the latents */
                memset(oh, 0, rank * sizeof(float));
                for (uint32_t t = 0; t <= row->pos; t++) {
                        const float *lat = kv_at(&b->kv, b->kv.k, width, layer, seq, t);
                        for (uint32_t i = 0; i < rank; i++)
                                oh[i] += att[t] * lat[i];
                }
        }
}

/* Grouped-query attention of rows 0..n-1 (Llama, Qwen2) from their normed inputs in s->xb
 * into s->att_out (n, n_heads * head_dim). */
static void attention_gqa(Backend *b, const BkSeq *seqs, uint32_t n, uint32_t l)
{
        const BkConfig *c = &b->model->cfg;
        const BkLayer *L = &b->model->layers[l];
        RunState *s = &b->s;
        uint32_t hd = c->head_dim, q_dim = c->n_heads * hd, kv_dim = c->n_kv_heads * hd;

        /* q, k, v projections */
        cpu_linear(&L->q, s->xb, n, s->q, s->linear, b->pool);
        cpu_linear(&L->k, s->xb, n, s->k, s->linear, b->pool);
        cpu_linear(&L->v, s->xb, n, s->v, s->linear, b->pool);

        /* rope on q and k, then k and v into the cache at each row's position */
        for (uint32_t r = 0; r < n; r++) {
                const float *cs = s->cos + (size_t) r * hd / 2;
                const float *sn = s->sin + (size_t) r * hd / 2;
                const BkSeq *seq = &seqs[s->rows[r].seq];
                float *k = s->k + (size_t) r * kv_dim, *v = s->v + (size_t) r * kv_dim;

                cpu_rope_apply(s->q + (size_t) r * q_dim, c->n_heads, hd, cs, sn);
                cpu_rope_apply(k, c->n_kv_heads, hd, cs, sn);
                memcpy(kv_at(&b->kv, b->kv.k, kv_dim, l, seq, s->rows[r].pos), k,
                        kv_dim * sizeof(float));
                memcpy(kv_at(&b->kv, b->kv.v, kv_dim, l, seq, s->rows[r].pos), v,
                        kv_dim * sizeof(float));
        }

        /* causal grouped-query attention over the cache */
        for (uint32_t r = 0; r < n; r++)
                attention_row(b, &seqs[s->rows[r].seq], &s->rows[r], l, s->q + (size_t) r * q_dim,
                        s->att_out + (size_t) r * q_dim);
}

/* Multi-head latent attention (DeepSeek) of rows 0..n-1 from their normed inputs in s->xb
 * into s->att_out (n, n_heads * Vd). Only the latent and k_pe reach the cache. */
static void attention_mla(Backend *b, const BkSeq *seqs, uint32_t n, uint32_t l)
{
        const BkConfig *c = &b->model->cfg;
        const BkMlaConfig *m = &c->mla;
        const BkLayer *L = &b->model->layers[l];
        RunState *s = &b->s;
        uint32_t qk = c->head_dim, q_dim = c->n_heads * qk, R = m->qk_rope_dim;
        uint32_t rank = m->kv_lora_rank, width = kv_width(c);

        /* queries: q_proj, or q_a_proj → q_a_layernorm → q_b_proj */
        if (m->q_lora_rank) {
                cpu_linear(&L->mla.q_a, s->xb, n, s->qa, s->linear, b->pool);
                rmsnorm(s->qa, s->qa, L->mla.q_a_norm, n, m->q_lora_rank, MLA_NORM_EPS);
                cpu_linear(&L->mla.q_b, s->qa, n, s->q, s->linear, b->pool);
        } else
                cpu_linear(&L->q, s->xb, n, s->q, s->linear, b->pool);

        /* the compressed latent and the shared rope key: [c_kv | k_pe] */
        cpu_linear(&L->mla.kv_a, s->xb, n, s->kva, s->linear, b->pool);

        /* kv_a_layernorm on c_kv, rope on k_pe and on every head's q_pe, both into the
         * cache at each row's position */
        for (uint32_t r = 0; r < n; r++) {
                const float *cs = s->cos + (size_t) r * R / 2;
                const float *sn = s->sin + (size_t) r * R / 2;
                const BkSeq *seq = &seqs[s->rows[r].seq];
                float *lat = kv_at(&b->kv, b->kv.k, width, l, seq, s->rows[r].pos);
                const float *kva = s->kva + (size_t) r * width;

                rmsnorm(lat, kva, L->mla.kv_a_norm, 1, rank, MLA_NORM_EPS);
                memcpy(lat + rank, kva + rank, R * sizeof(float));
                cpu_rope_apply_pairs(lat + rank, R, cs, sn);
                for (uint32_t h = 0; h < c->n_heads; h++)
                        cpu_rope_apply_pairs(
                                s->q + (size_t) r * q_dim + (size_t) h * qk + m->qk_nope_dim, R, cs,
                                sn);
        }

        /* absorbed queries: each head's q_nope through W_UK into the latent space */
        cpu_mla_absorb_q(c, &L->mla.kv_b, s->q, n, s->q_lat, s->wrow);

        /* causal attention over the latent cache */
        for (uint32_t r = 0; r < n; r++)
                attention_row_mla(b, &seqs[s->rows[r].seq], &s->rows[r], l,
                        s->q + (size_t) r * q_dim, s->q_lat + (size_t) r * c->n_heads * rank,
                        s->o_lat + (size_t) r * c->n_heads * rank);

        /* values: each head's latent sum through W_UV */
        cpu_mla_values(c, &L->mla.kv_b, s->o_lat, n, s->att_out, s->wrow);
}

/* y (rows, hidden) = down(silu(gate(x)) * up(x)) for x (rows, hidden). */
static void swiglu(Backend *b, const BkExpert *e, const float *x, uint32_t rows, float *y)
{
        RunState *s = &b->s;
        uint32_t width = e->gate.out;

        cpu_linear(&e->gate, x, rows, s->hb, s->linear, b->pool);
        cpu_linear(&e->up, x, rows, s->hb2, s->linear, b->pool);
        for (size_t i = 0; i < (size_t) rows * width; i++) {
                float g = s->hb[i];
                s->hb[i] = g / (1.0f + expf(-g)) * s->hb2[i];
        }
        cpu_linear(&e->down, s->hb, rows, y, s->linear, b->pool);
}

/* The MoE MLP of rows 0..n-1 from s->xb back into s->xb: routed experts weighted, plus
 * the shared experts. */
static void ffn_moe(Backend *b, uint32_t n, uint32_t l)
{
        const BkConfig *c = &b->model->cfg;
        const BkMoeConfig *mc = &c->moe;
        const BkMoe *moe = &b->model->layers[l].moe;
        RunState *s = &b->s;
        uint32_t dim = c->hidden, k = mc->top_k;

        /* router logits in float32, and each row's experts and weights */
        BkLinear router = router_linear(c, moe);
        cpu_linear(&router, s->xb, n, s->router, s->linear, b->pool);
        for (uint32_t r = 0; r < n; r++)
                cpu_moe_route(mc, s->router + (size_t) r * mc->n_routed, moe->score_bias, s->route,
                        s->expert_idx + (size_t) r * k, s->expert_w + (size_t) r * k);

        /* routed experts in ascending id, each on the rows that chose it; a row's sum so
         * runs in the same order whatever else is in the tile */
        memset(s->moe_out, 0, (size_t) n * dim * sizeof(float));
        for (uint32_t e = 0; e < mc->n_routed; e++) {
                uint32_t who[TILE_ROWS], m = 0;
                float w[TILE_ROWS];
                for (uint32_t r = 0; r < n; r++)
                        for (uint32_t j = 0; j < k; j++)
                                if (s->expert_idx[(size_t) r * k + j] == e) {
                                        memcpy(s->gx + (size_t) m * dim, s->xb + (size_t) r * dim,
                                                dim * sizeof(float));
                                        w[m] = s->expert_w[(size_t) r * k + j];
                                        who[m++] = r;
                                }
                if (m == 0)
                        continue;
                swiglu(b, &moe->experts[e], s->gx, m, s->gy);
                for (uint32_t j = 0; j < m; j++)
                        for (uint32_t i = 0; i < dim; i++)
                                s->moe_out[(size_t) who[j] * dim + i] +=
                                        s->gy[(size_t) j * dim + i] * w[j];
        }

        /* shared experts on every row, added to the routed sum */
        if (mc->n_shared == 0) {
                memcpy(s->xb, s->moe_out, (size_t) n * dim * sizeof(float));
                return;
        }
        swiglu(b, &moe->shared, s->xb, n, s->gy);
        for (size_t i = 0; i < (size_t) n * dim; i++)
                s->xb[i] = s->moe_out[i] + s->gy[i];
}

/* Runs the first n rows of b->s.rows through the model and leaves the logits of the rows
 * that want them, in row order, in s->logits. */
static void forward(Backend *b, const BkSeq *seqs, uint32_t n)
{
        const BkModel *m = b->model;
        const BkConfig *c = &m->cfg;
        RunState *s = &b->s;
        uint32_t dim = c->hidden, rd = rope_dim(c);

        /* token embedding */
        for (uint32_t r = 0; r < n; r++)
                for (uint32_t i = 0; i < dim; i++)
                        s->x[(size_t) r * dim + i] =
                                cpu_tensor_get(m->embed, (size_t) s->rows[r].token * dim + i);

        /* rope angles, shared by every layer */
        for (uint32_t r = 0; r < n; r++)
                cpu_rope_angles(s->inv_freq, rd, s->attention_factor, s->rows[r].pos,
                        s->cos + (size_t) r * rd / 2, s->sin + (size_t) r * rd / 2);

        for (uint32_t l = 0; l < c->n_layers; l++) {
                const BkLayer *L = &m->layers[l];

                /* attention rmsnorm */
                rmsnorm(s->xb, s->x, L->attn_norm, n, dim, c->rms_eps);

                /* attention: latent (DeepSeek) or grouped-query, into s->att_out */
                if (bk_is_mla(c))
                        attention_mla(b, seqs, n, l);
                else
                        attention_gqa(b, seqs, n, l);

                /* output projection and residual */
                cpu_linear(&L->o, s->att_out, n, s->xb, s->linear, b->pool);
                for (size_t i = 0; i < (size_t) n * dim; i++)
                        s->x[i] += s->xb[i];

                /* ffn rmsnorm */
                rmsnorm(s->xb, s->x, L->mlp_norm, n, dim, c->rms_eps);

                /* mixture of experts, or the dense swiglu MLP, into s->xb */
                if (L->moe.experts)
                        ffn_moe(b, n, l);
                else {
                        const BkExpert dense = {L->gate, L->up, L->down};
                        swiglu(b, &dense, s->xb, n, s->xb);
                }

                /* residual */
                for (size_t i = 0; i < (size_t) n * dim; i++)
                        s->x[i] += s->xb[i];
        }

        /* final rmsnorm of the rows whose logits are wanted, gathered in order */
        uint32_t n_out = 0;
        for (uint32_t r = 0; r < n; r++)
                if (s->rows[r].logits) {
                        rmsnorm(s->xb + (size_t) n_out * dim, s->x + (size_t) r * dim,
                                m->final_norm, 1, dim, c->rms_eps);
                        n_out++;
                }

        /* lm_head */
        if (n_out > 0)
                cpu_linear(&m->lm_head, s->xb, n_out, s->logits, s->linear, b->pool);
}

/* ---------------------------------------------------------------------------------------
 * BackendOps */

static int cpu_create(const BkOptions *opt, Backend **ret, DsError *err)
{
        Backend *b;
        int r;

        if (!ret)
                return ds_error(err, -EINVAL, "cpu backend: no return pointer");
        b = calloc(1, sizeof(*b));
        if (!b)
                return ds_error(err, -ENOMEM, "cpu backend: out of memory");
        r = cpu_pool_new(opt ? opt->threads : 1, &b->pool, err);
        if (r < 0) {
                free(b);
                return ds_error_prefix(err, "cpu backend");
        }
        *ret = b;
        return 0;
}

static int cpu_load(Backend *b, const BkModel *model, DsError *err)
{
        int r;

        if (!b || !model)
                return ds_error(err, -EINVAL, "cpu backend: no backend or model");

        r = bk_model_check(model, err);
        if (r < 0)
                return ds_error_prefix(err, "cpu backend");

        /* The old model's cache and scratch have the old shapes. */
        kv_free(&b->kv);
        run_state_free(&b->s);
        b->model = NULL;

        r = run_state_alloc(&b->s, model, cpu_pool_threads(b->pool));
        if (r < 0) {
                run_state_free(&b->s);
                return ds_error(err, r, "cpu backend: out of memory for the run state");
        }
        r = cpu_rope_init(&model->cfg.rope, rope_dim(&model->cfg), b->s.inv_freq,
                &b->s.attention_factor, err);
        if (r < 0) {
                run_state_free(&b->s);
                return ds_error_prefix(err, "cpu backend");
        }
        b->model = model;
        return 0;
}

static uint64_t cpu_kv_bytes_per_token(const Backend *b)
{
        if (!b || !b->model)
                return 0;
        const BkConfig *c = &b->model->cfg;
        /* MLA keeps one latent per position; other models a K and a V. */
        uint64_t per_layer = bk_is_mla(c) ? kv_width(c) : 2 * (uint64_t) kv_width(c);
        return (uint64_t) c->n_layers * per_layer * sizeof(float);
}

static int64_t cpu_kv_init(Backend *b, uint32_t block_tokens, uint64_t mem_bytes, DsError *err)
{
        if (!b || !b->model)
                return ds_error(err, -DS_ERR_MODEL_NOT_LOADED, "cpu backend: no model loaded");
        if (block_tokens == 0)
                return ds_error(err, -EINVAL, "cpu backend: KV blocks of 0 tokens");

        kv_free(&b->kv);

        uint64_t block_bytes = cpu_kv_bytes_per_token(b) * block_tokens;
        uint64_t n_blocks = MIN(mem_bytes / block_bytes, (uint64_t) UINT32_MAX);
        if (n_blocks == 0)
                return ds_error(err, -ENOMEM,
                        "cpu backend: %llu bytes hold no KV block of %u tokens (%llu bytes)",
                        (unsigned long long) mem_bytes, block_tokens,
                        (unsigned long long) block_bytes);

        /* Half of block_bytes each for K and V, or all of it for MLA's latent. */
        bool mla = bk_is_mla(&b->model->cfg);
        size_t floats = (size_t) (n_blocks * block_bytes / (mla ? 1 : 2) / sizeof(float));
        b->kv.k = calloc(floats, sizeof(float));
        b->kv.v = mla ? NULL : calloc(floats, sizeof(float));
        if (!b->kv.k || (!mla && !b->kv.v)) {
                kv_free(&b->kv);
                return ds_error(err, -ENOMEM, "cpu backend: out of memory for %llu KV blocks",
                        (unsigned long long) n_blocks);
        }
        b->kv.block_tokens = block_tokens;
        b->kv.n_blocks = (uint32_t) n_blocks;
        return (int64_t) n_blocks;
}

static int seq_check(const Backend *b, const BkSeq *seq, uint32_t i, DsError *err)
{
        const BkConfig *c = &b->model->cfg;
        uint64_t end = (uint64_t) seq->pos + seq->n_tokens;

        if (seq->n_tokens == 0 || !seq->tokens)
                return ds_error(err, -EINVAL, "cpu backend: sequence %u has no tokens", i);
        if (end > c->max_positions)
                return ds_error(err, -DS_ERR_CONTEXT_FULL,
                        "cpu backend: sequence %u reaches position %llu, past the limit %u", i,
                        (unsigned long long) end, c->max_positions);
        for (uint32_t t = 0; t < seq->n_tokens; t++)
                if (seq->tokens[t] < 0 || (uint32_t) seq->tokens[t] >= c->vocab_size)
                        return ds_error(err, -EINVAL,
                                "cpu backend: sequence %u: token %d out of range", i,
                                seq->tokens[t]);

        uint64_t blocks_needed = (end + b->kv.block_tokens - 1) / b->kv.block_tokens;
        if (!seq->blocks || seq->n_blocks < blocks_needed)
                return ds_error(err, -EINVAL,
                        "cpu backend: sequence %u: %u KV blocks cover less than %llu positions", i,
                        seq->n_blocks, (unsigned long long) end);
        for (uint64_t k = 0; k < blocks_needed; k++)
                if (seq->blocks[k] >= b->kv.n_blocks)
                        return ds_error(err, -EINVAL,
                                "cpu backend: sequence %u: KV block id %u, the cache has %u", i,
                                seq->blocks[k], b->kv.n_blocks);
        if (seq->sample && !seq->history && seq->n_history > 0)
                return ds_error(err, -EINVAL, "cpu backend: sequence %u: history missing", i);
        return 0;
}

/* Hands out the logits of a finished tile: copies to the sequences that asked for them and
 * samples the sequences whose last token was in it. */
static void tile_outputs(Backend *b, const BkSeq *seqs, uint32_t n, int32_t *ret_ids)
{
        const BkConfig *c = &b->model->cfg;
        RunState *s = &b->s;
        uint32_t j = 0;

        for (uint32_t r = 0; r < n; r++) {
                const Row *row = &s->rows[r];
                const BkSeq *seq = &seqs[row->seq];
                if (!row->logits)
                        continue;
                const float *lg = s->logits + (size_t) j++ * c->vocab_size;
                if (seq->logits)
                        memcpy(seq->logits + (size_t) (row->pos - seq->pos) * c->vocab_size, lg,
                                c->vocab_size * sizeof(float));
                if (seq->sample && row->pos == seq->pos + seq->n_tokens - 1) {
                        if (seq->sample_logits)
                                memcpy(seq->sample_logits, lg, c->vocab_size * sizeof(float));
                        ret_ids[row->seq] = bk_sample(lg, c->vocab_sample, &seq->sampling,
                                seq->history, seq->n_history, seq->draw, s->sample_f, s->sample_i);
                }
        }
}

static int cpu_step(Backend *b, const BkSeq *seqs, uint32_t n_seqs, int32_t *ret_ids, DsError *err)
{
        int r;

        if (!b || !b->model)
                return ds_error(err, -DS_ERR_MODEL_NOT_LOADED, "cpu backend: no model loaded");
        if (!b->kv.k)
                return ds_error(err, -EINVAL, "cpu backend: KV cache not initialised");
        if (n_seqs > 0 && (!seqs || !ret_ids))
                return ds_error(err, -EINVAL, "cpu backend: no sequences or no result array");

        for (uint32_t i = 0; i < n_seqs; i++) {
                r = seq_check(b, &seqs[i], i, err);
                if (r < 0)
                        return r;
                ret_ids[i] = -1;
        }

        /* Deal the step's tokens into tiles, in sequence order, and run each. */
        uint32_t n = 0;
        for (uint32_t i = 0; i < n_seqs; i++)
                for (uint32_t t = 0; t < seqs[i].n_tokens; t++) {
                        bool last = t == seqs[i].n_tokens - 1;
                        b->s.rows[n++] = (Row){
                                .seq = i,
                                .pos = seqs[i].pos + t,
                                .token = seqs[i].tokens[t],
                                .logits = seqs[i].logits || (seqs[i].sample && last),
                        };
                        if (n == TILE_ROWS || (i == n_seqs - 1 && last)) {
                                forward(b, seqs, n);
                                tile_outputs(b, seqs, n, ret_ids);
                                n = 0;
                        }
                }
        return 0;
}

/* Grows an array of *cap elements of size to hold n; false when out of memory. */
static bool grow(void **p, uint32_t *cap, uint32_t n, size_t size)
{
        if (n <= *cap)
                return true;
        void *q = realloc(*p, (size_t) n * size);
        if (!q)
                return false;
        *p = q;
        *cap = n;
        return true;
}

static int cpu_submit(Backend *b, const BkSeq *seqs, uint32_t n_seqs, DsError *err)
{
        if (b && b->n_out == 2)
                return ds_error(err, -EBUSY, "cpu backend: two steps are outstanding already");
        if (!b || (n_seqs > 0 && !seqs))
                return ds_error(err, -EINVAL, "cpu backend: no sequences");
        uint32_t k = (b->last + 1) % 3, cap = b->chain_cap;
        Done *d = &b->done[k], *prev = &b->done[b->last];
        if (!grow((void **) &d->ids, &d->cap, n_seqs, sizeof(*d->ids)) ||
                !grow((void **) &b->chain_seqs, &cap, n_seqs, sizeof(*b->chain_seqs)) ||
                !grow((void **) &b->chain_tok, &b->chain_cap, n_seqs, sizeof(*b->chain_tok)))
                return ds_error(
                        err, -ENOMEM, "cpu backend: out of memory for a step of %u", n_seqs);
        int r = bk_chain_resolve(seqs, n_seqs, prev->ids, b->have_last ? prev->n : 0, b->chain_seqs,
                b->chain_tok, err);
        if (r < 0)
                return ds_error_prefix(err, "cpu backend");
        r = cpu_step(b, b->chain_seqs, n_seqs, d->ids, err);
        if (r < 0)
                return r;
        d->n = n_seqs;
        b->last = k;
        b->have_last = true;
        b->n_out++;
        return 0;
}

static int cpu_collect(Backend *b, int32_t *ret_ids, uint32_t n_seqs, DsError *err)
{
        if (!b || b->n_out == 0)
                return ds_error(err, -EINVAL, "cpu backend: no step to collect");
        Done *d = &b->done[(b->last + 4 - b->n_out) % 3];
        b->n_out--;
        if (n_seqs != d->n || (n_seqs > 0 && !ret_ids))
                return ds_error(err, -EINVAL,
                        "cpu backend: the step collected had %u sequences, not %u", d->n, n_seqs);
        memcpy(ret_ids, d->ids, (size_t) n_seqs * sizeof(*ret_ids));
        return 0;
}

static void cpu_free(Backend *b)
{
        if (!b)
                return;
        for (size_t i = 0; i < ELEMENTSOF(b->done); i++)
                free(b->done[i].ids);
        free(b->chain_seqs);
        free(b->chain_tok);
        kv_free(&b->kv);
        run_state_free(&b->s);
        cpu_pool_free(b->pool);
        free(b);
}

const BackendOps backend_cpu_ops = {
        .name = "cpu",
        .create = cpu_create,
        .load = cpu_load,
        .kv_init = cpu_kv_init,
        .kv_bytes_per_token = cpu_kv_bytes_per_token,
        .step = cpu_step,
        .submit = cpu_submit,
        .collect = cpu_collect,
        .free = cpu_free,
};
