/* SPDX-License-Identifier: MIT */
/* The CPU reference backend: Llama and Qwen2 forward passes in float32, laid out like
 * llama2.c's run.c. The config and the weights belong to the BkModel (read in place, never
 * written); the run state and the paged KV cache belong to the backend.
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
#include "cpu_rope.h"

/* Rows (tokens, from any sequences) that go through the layers together. More rows share
 * each dequantized weight; fewer keep the activations in cache. */
#define TILE_ROWS 32

/* One token of the step: which sequence, where, and whether its logits are wanted. */
typedef struct Row {
        uint32_t seq; /* index into the step's seqs */
        uint32_t pos; /* absolute position */
        int32_t token;
        bool logits; /* compute this row's logits (asked for, or sampled from) */
} Row;

typedef struct KvCache {
        uint32_t block_tokens;
        uint32_t n_blocks;
        float *k; /* (layer, block, block_tokens, kv_dim) */
        float *v; /* (layer, block, block_tokens, kv_dim) */
} KvCache;

/* Scratch reused by every step, sized at load for TILE_ROWS rows. */
typedef struct RunState {
        float *x;               /* (TILE_ROWS, hidden) the residual stream */
        float *xb;              /* (TILE_ROWS, hidden) a sublayer's normed input or its output */
        float *q;               /* (TILE_ROWS, n_heads * head_dim) */
        float *k;               /* (TILE_ROWS, kv_dim) */
        float *v;               /* (TILE_ROWS, kv_dim) */
        float *att_out;         /* (TILE_ROWS, n_heads * head_dim) attention's weighted values */
        float *hb;              /* (TILE_ROWS, intermediate) gate, then silu(gate) * up */
        float *hb2;             /* (TILE_ROWS, intermediate) up */
        float *att;             /* (max_positions) one head's scores for one row */
        float *cos;             /* (TILE_ROWS, head_dim / 2) */
        float *sin;             /* (TILE_ROWS, head_dim / 2) */
        float *inv_freq;        /* (head_dim / 2) rope frequencies, computed at load */
        float attention_factor; /* multiplies cos and sin (yarn) */
        float *logits;          /* (TILE_ROWS, vocab_size) the rows whose logits are wanted */
        float *linear;          /* (largest cpu_linear_scratch_size) */
        float *sample_f;        /* (vocab_size) bk_sample scratch */
        int32_t *sample_i;      /* (vocab_size) bk_sample scratch */
        Row rows[TILE_ROWS];
} RunState;

/* BkOptions.threads is accepted and not used: every kernel runs on the calling thread. */
struct Backend {
        const BkModel *model; /* config and weights, owned by the caller; NULL until load */
        RunState s;
        KvCache kv;
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
        *s = (RunState){0};
}

static void kv_free(KvCache *kv)
{
        free(kv->k);
        free(kv->v);
        *kv = (KvCache){0};
}

static size_t linear_scratch_max(const BkModel *m)
{
        size_t n = cpu_linear_scratch_size(&m->lm_head);

        for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
                const BkLayer *L = &m->layers[l];
                const BkLinear *all[] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down};
                for (size_t i = 0; i < ELEMENTSOF(all); i++)
                        n = MAX(n, cpu_linear_scratch_size(all[i]));
        }
        return n;
}

static int run_state_alloc(RunState *s, const BkModel *m)
{
        const BkConfig *c = &m->cfg;
        size_t q_dim = (size_t) c->n_heads * c->head_dim;
        size_t kv_dim = (size_t) c->n_kv_heads * c->head_dim;

        s->x = calloc((size_t) TILE_ROWS * c->hidden, sizeof(float));
        s->xb = calloc((size_t) TILE_ROWS * c->hidden, sizeof(float));
        s->q = calloc(TILE_ROWS * q_dim, sizeof(float));
        s->k = calloc(TILE_ROWS * kv_dim, sizeof(float));
        s->v = calloc(TILE_ROWS * kv_dim, sizeof(float));
        s->att_out = calloc(TILE_ROWS * q_dim, sizeof(float));
        s->hb = calloc((size_t) TILE_ROWS * c->intermediate, sizeof(float));
        s->hb2 = calloc((size_t) TILE_ROWS * c->intermediate, sizeof(float));
        s->att = calloc(c->max_positions, sizeof(float));
        s->cos = calloc((size_t) TILE_ROWS * c->head_dim / 2, sizeof(float));
        s->sin = calloc((size_t) TILE_ROWS * c->head_dim / 2, sizeof(float));
        s->inv_freq = calloc(c->head_dim / 2, sizeof(float));
        s->logits = calloc((size_t) TILE_ROWS * c->vocab_size, sizeof(float));
        s->linear = calloc(linear_scratch_max(m), sizeof(float));
        s->sample_f = calloc(c->vocab_size, sizeof(float));
        s->sample_i = calloc(c->vocab_size, sizeof(int32_t));
        if (!s->x || !s->xb || !s->q || !s->k || !s->v || !s->att_out || !s->hb || !s->hb2 ||
                !s->att || !s->cos || !s->sin || !s->inv_freq || !s->logits || !s->linear ||
                !s->sample_f || !s->sample_i)
                return -ENOMEM;
        return 0;
}

/* ---------------------------------------------------------------------------------------
 * Checking the model */

static int tensor_check(BkTensor t, const char *what, DsError *err)
{
        if (!t.data || (unsigned) t.dtype >= _BK_DT_MAX)
                return ds_error(err, -DS_ERR_FORMAT, "%s: missing or of a bad dtype", what);
        return 0;
}

static int model_check(const BkModel *m, DsError *err)
{
        const BkConfig *c = &m->cfg;
        uint32_t q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
        char what[64];
        int r;

        if ((unsigned) c->arch >= _BK_ARCH_MAX)
                return ds_error(err, -DS_ERR_UNSUPPORTED, "architecture %d", (int) c->arch);
        if (c->hidden == 0 || c->intermediate == 0 || c->n_layers == 0 || c->n_heads == 0 ||
                c->n_kv_heads == 0 || c->n_heads % c->n_kv_heads != 0 || c->head_dim == 0 ||
                c->head_dim % 2 != 0 || c->vocab_size == 0 || c->vocab_sample == 0 ||
                c->vocab_sample > c->vocab_size || c->max_positions == 0 || !m->layers)
                return ds_error(err, -DS_ERR_FORMAT, "inconsistent model dimensions");

        r = tensor_check(m->embed, "embedding", err);
        if (r < 0)
                return r;
        r = tensor_check(m->final_norm, "final norm", err);
        if (r < 0)
                return r;
        r = cpu_linear_check(&m->lm_head, c->hidden, c->vocab_size, "lm_head", err);
        if (r < 0)
                return r;

        for (uint32_t l = 0; l < c->n_layers; l++) {
                const BkLayer *L = &m->layers[l];
                const struct {
                        const BkLinear *lin;
                        const char *name;
                        uint32_t in, out;
                } lins[] = {
                        {&L->q, "q_proj", c->hidden, q_dim},
                        {&L->k, "k_proj", c->hidden, kv_dim},
                        {&L->v, "v_proj", c->hidden, kv_dim},
                        {&L->o, "o_proj", q_dim, c->hidden},
                        {&L->gate, "gate_proj", c->hidden, c->intermediate},
                        {&L->up, "up_proj", c->hidden, c->intermediate},
                        {&L->down, "down_proj", c->intermediate, c->hidden},
                };
                for (size_t i = 0; i < ELEMENTSOF(lins); i++) {
                        snprintf(what, sizeof(what), "layer %u %s", l, lins[i].name);
                        r = cpu_linear_check(lins[i].lin, lins[i].in, lins[i].out, what, err);
                        if (r < 0)
                                return r;
                }
                snprintf(what, sizeof(what), "layer %u input_layernorm", l);
                r = tensor_check(L->attn_norm, what, err);
                if (r < 0)
                        return r;
                snprintf(what, sizeof(what), "layer %u post_attention_layernorm", l);
                r = tensor_check(L->mlp_norm, what, err);
                if (r < 0)
                        return r;
        }
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

                /* softmax */
                float sum = 0.0f;
                for (uint32_t t = 0; t <= row->pos; t++) {
                        att[t] = expf(att[t] - max);
                        sum += att[t];
                }
                for (uint32_t t = 0; t <= row->pos; t++)
                        att[t] /= sum;

                /* weighted sum of the values */
                memset(oh, 0, hd * sizeof(float));
                for (uint32_t t = 0; t <= row->pos; t++) {
                        const float *v = kv_at(&b->kv, b->kv.v, kv_dim, layer, seq, t) + kvh * hd;
                        for (uint32_t i = 0; i < hd; i++)
                                oh[i] += att[t] * v[i];
                }
        }
}

/* Runs the first n rows of b->s.rows through the model and leaves the logits of the rows
 * that want them, in row order, in s->logits. */
static void forward(Backend *b, const BkSeq *seqs, uint32_t n)
{
        const BkModel *m = b->model;
        const BkConfig *c = &m->cfg;
        RunState *s = &b->s;
        uint32_t dim = c->hidden, hd = c->head_dim;
        uint32_t q_dim = c->n_heads * hd, kv_dim = c->n_kv_heads * hd;

        /* token embedding */
        for (uint32_t r = 0; r < n; r++)
                for (uint32_t i = 0; i < dim; i++)
                        s->x[(size_t) r * dim + i] =
                                cpu_tensor_get(m->embed, (size_t) s->rows[r].token * dim + i);

        /* rope angles, shared by every layer */
        for (uint32_t r = 0; r < n; r++)
                cpu_rope_angles(s->inv_freq, hd, s->attention_factor, s->rows[r].pos,
                        s->cos + (size_t) r * hd / 2, s->sin + (size_t) r * hd / 2);

        for (uint32_t l = 0; l < c->n_layers; l++) {
                const BkLayer *L = &m->layers[l];

                /* attention rmsnorm */
                rmsnorm(s->xb, s->x, L->attn_norm, n, dim, c->rms_eps);

                /* q, k, v projections */
                cpu_linear(&L->q, s->xb, n, s->q, s->linear);
                cpu_linear(&L->k, s->xb, n, s->k, s->linear);
                cpu_linear(&L->v, s->xb, n, s->v, s->linear);

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
                        attention_row(b, &seqs[s->rows[r].seq], &s->rows[r], l,
                                s->q + (size_t) r * q_dim, s->att_out + (size_t) r * q_dim);

                /* output projection and residual */
                cpu_linear(&L->o, s->att_out, n, s->xb, s->linear);
                for (size_t i = 0; i < (size_t) n * dim; i++)
                        s->x[i] += s->xb[i];

                /* ffn rmsnorm */
                rmsnorm(s->xb, s->x, L->mlp_norm, n, dim, c->rms_eps);

                /* swiglu: silu(gate) * up */
                cpu_linear(&L->gate, s->xb, n, s->hb, s->linear);
                cpu_linear(&L->up, s->xb, n, s->hb2, s->linear);
                for (size_t i = 0; i < (size_t) n * c->intermediate; i++) {
                        float g = s->hb[i];
                        s->hb[i] = g / (1.0f + expf(-g)) * s->hb2[i];
                }

                /* down projection and residual */
                cpu_linear(&L->down, s->hb, n, s->xb, s->linear);
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
                cpu_linear(&m->lm_head, s->xb, n_out, s->logits, s->linear);
}

/* ---------------------------------------------------------------------------------------
 * BackendOps */

static int cpu_create(const BkOptions *opt, Backend **ret, DsError *err)
{
        Backend *b;

        if (!ret)
                return ds_error(err, -EINVAL, "cpu backend: no return pointer");
        b = calloc(1, sizeof(*b));
        if (!b)
                return ds_error(err, -ENOMEM, "cpu backend: out of memory");
        *ret = b;
        return 0;
}

static int cpu_load(Backend *b, const BkModel *model, DsError *err)
{
        int r;

        if (!b || !model)
                return ds_error(err, -EINVAL, "cpu backend: no backend or model");

        r = model_check(model, err);
        if (r < 0)
                return ds_error_prefix(err, "cpu backend");

        /* The old model's cache and scratch have the old shapes. */
        kv_free(&b->kv);
        run_state_free(&b->s);
        b->model = NULL;

        r = run_state_alloc(&b->s, model);
        if (r < 0) {
                run_state_free(&b->s);
                return ds_error(err, r, "cpu backend: out of memory for the run state");
        }
        r = cpu_rope_init(
                &model->cfg.rope, model->cfg.head_dim, b->s.inv_freq, &b->s.attention_factor, err);
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
        return (uint64_t) c->n_layers * 2 * c->n_kv_heads * c->head_dim * sizeof(float);
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

        /* Half of block_bytes each for K and V. */
        size_t floats = (size_t) (n_blocks * block_bytes / 2 / sizeof(float));
        b->kv.k = calloc(floats, sizeof(float));
        b->kv.v = calloc(floats, sizeof(float));
        if (!b->kv.k || !b->kv.v) {
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

static void cpu_free(Backend *b)
{
        if (!b)
                return;
        kv_free(&b->kv);
        run_state_free(&b->s);
        free(b);
}

const BackendOps backend_cpu_ops = {
        .name = "cpu",
        .create = cpu_create,
        .load = cpu_load,
        .kv_init = cpu_kv_init,
        .kv_bytes_per_token = cpu_kv_bytes_per_token,
        .step = cpu_step,
        .free = cpu_free,
};
