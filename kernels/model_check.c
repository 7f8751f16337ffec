/* SPDX-License-Identifier: MIT */
/* bk_model_check: what every backend verifies of a BkModel before load(), so that a
 * malformed checkpoint fails the same way, naming the tensor, whichever backend loads it. */
#include <stdio.h>

#include "backend.h"
#include "cpu_linear.h"
#include "macro.h"

static int dimensions_check(const BkModel *m, DsError *err)
{
        const BkConfig *c = &m->cfg;

        if ((unsigned) c->arch >= _BK_ARCH_MAX)
                return ds_error(err, -DS_ERR_UNSUPPORTED, "architecture %d", (int) c->arch);
        if (c->hidden == 0 || c->intermediate == 0 || c->n_layers == 0 || c->n_heads == 0 ||
                c->n_kv_heads == 0 || c->n_heads % c->n_kv_heads != 0 || c->head_dim == 0 ||
                c->head_dim % 2 != 0 || c->vocab_size == 0 || c->vocab_sample == 0 ||
                c->vocab_sample > c->vocab_size || c->max_positions == 0 || !m->layers)
                return ds_error(err, -DS_ERR_FORMAT, "inconsistent model dimensions");
        return 0;
}

static int tensor_check(BkTensor t, const char *what, DsError *err)
{
        if (!t.data || (unsigned) t.dtype >= _BK_DT_MAX)
                return ds_error(err, -DS_ERR_FORMAT, "%s: missing or of a bad dtype", what);
        return 0;
}

typedef struct LinearSpec {
        const BkLinear *lin;
        const char *name;
        uint32_t in, out;
} LinearSpec;

static int linears_check(const LinearSpec *lins, size_t n, uint32_t l, DsError *err)
{
        char what[96];

        for (size_t i = 0; i < n; i++) {
                snprintf(what, sizeof(what), "layer %u %s", l, lins[i].name);
                int r = cpu_linear_check(lins[i].lin, lins[i].in, lins[i].out, what, err);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int expert_check(const BkConfig *c, const BkExpert *e, const char *name, uint32_t width,
        uint32_t l, DsError *err)
{
        char g[64], u[64], d[64];

        snprintf(g, sizeof(g), "%s gate_proj", name);
        snprintf(u, sizeof(u), "%s up_proj", name);
        snprintf(d, sizeof(d), "%s down_proj", name);
        const LinearSpec lins[] = {
                {&e->gate, g, c->hidden, width},
                {&e->up, u, c->hidden, width},
                {&e->down, d, width, c->hidden},
        };
        return linears_check(lins, ELEMENTSOF(lins), l, err);
}

/* MLA projections, and the MoE or the dense MLP, of DeepSeek layer l. */
static int deepseek_layer_check(const BkConfig *c, const BkLayer *L, uint32_t l, DsError *err)
{
        const BkMlaConfig *m = &c->mla;
        const BkMoeConfig *mc = &c->moe;
        uint32_t q_dim = c->n_heads * (m->qk_nope_dim + m->qk_rope_dim);
        char what[96];
        int r;

        const LinearSpec attn[] = {
                {&L->mla.kv_a, "kv_a_proj_with_mqa", c->hidden, m->kv_lora_rank + m->qk_rope_dim},
                {&L->mla.kv_b, "kv_b_proj", m->kv_lora_rank,
                        c->n_heads * (m->qk_nope_dim + m->v_head_dim)},
                {&L->o, "o_proj", c->n_heads * m->v_head_dim, c->hidden},
        };
        const LinearSpec q_lora[] = {
                {&L->mla.q_a, "q_a_proj", c->hidden, m->q_lora_rank},
                {&L->mla.q_b, "q_b_proj", m->q_lora_rank, q_dim},
        };
        const LinearSpec q_plain[] = {{&L->q, "q_proj", c->hidden, q_dim}};
        if ((r = linears_check(attn, ELEMENTSOF(attn), l, err)) < 0 ||
                (r = m->q_lora_rank ? linears_check(q_lora, ELEMENTSOF(q_lora), l, err)
                                    : linears_check(q_plain, 1, l, err)) < 0)
                return r;
        snprintf(what, sizeof(what), "layer %u kv_a_layernorm", l);
        if ((r = tensor_check(L->mla.kv_a_norm, what, err)) < 0)
                return r;
        if (m->q_lora_rank) {
                snprintf(what, sizeof(what), "layer %u q_a_layernorm", l);
                if ((r = tensor_check(L->mla.q_a_norm, what, err)) < 0)
                        return r;
        }

        if (!L->moe.experts) {
                const BkExpert dense = {L->gate, L->up, L->down};
                return expert_check(c, &dense, "mlp", c->intermediate, l, err);
        }
        snprintf(what, sizeof(what), "layer %u router", l);
        if ((r = tensor_check(L->moe.router, what, err)) < 0)
                return r;
        if (mc->topk_method == BK_TOPK_NOAUX_TC) {
                snprintf(what, sizeof(what), "layer %u e_score_correction_bias", l);
                if ((r = tensor_check(L->moe.score_bias, what, err)) < 0)
                        return r;
        }
        for (uint32_t e = 0; e < mc->n_routed; e++) {
                snprintf(what, sizeof(what), "expert %u", e);
                if ((r = expert_check(c, &L->moe.experts[e], what, mc->expert_dim, l, err)) < 0)
                        return r;
        }
        if (mc->n_shared == 0)
                return 0;
        return expert_check(
                c, &L->moe.shared, "shared_experts", mc->n_shared * mc->expert_dim, l, err);
}

/* The routing and latent dimensions the forward pass relies on. */
static int deepseek_config_check(const BkConfig *c, DsError *err)
{
        const BkMlaConfig *m = &c->mla;
        const BkMoeConfig *mc = &c->moe;

        if (m->kv_lora_rank == 0 || m->qk_nope_dim == 0 || m->qk_rope_dim == 0 ||
                m->qk_rope_dim % 2 != 0 || m->v_head_dim == 0 ||
                c->head_dim != m->qk_nope_dim + m->qk_rope_dim || c->n_kv_heads != c->n_heads ||
                !(m->softmax_scale > 0.0f))
                return ds_error(err, -DS_ERR_FORMAT, "inconsistent MLA dimensions");
        if (mc->n_routed == 0)
                return 0;
        if (mc->top_k == 0 || mc->top_k > mc->n_routed || mc->expert_dim == 0 || mc->n_group == 0 ||
                mc->n_routed % mc->n_group != 0 || mc->topk_group == 0 ||
                mc->topk_group > mc->n_group || mc->layer_freq == 0 ||
                (unsigned) mc->topk_method >= _BK_TOPK_MAX ||
                (unsigned) mc->scoring >= _BK_SCORING_MAX ||
                (mc->topk_method == BK_TOPK_NOAUX_TC && mc->n_routed / mc->n_group < 2) ||
                !(mc->routed_scaling_factor > 0.0f))
                return ds_error(err, -DS_ERR_FORMAT, "inconsistent MoE routing parameters");
        return 0;
}

int bk_model_check(const BkModel *m, DsError *err)
{
        const BkConfig *c = &m->cfg;
        uint32_t q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
        char what[64];
        int r;

        r = dimensions_check(m, err);
        if (r < 0)
                return r;
        if (bk_is_mla(c) && (r = deepseek_config_check(c, err)) < 0)
                return r;
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
                const LinearSpec lins[] = {
                        {&L->q, "q_proj", c->hidden, q_dim},
                        {&L->k, "k_proj", c->hidden, kv_dim},
                        {&L->v, "v_proj", c->hidden, kv_dim},
                        {&L->o, "o_proj", q_dim, c->hidden},
                        {&L->gate, "gate_proj", c->hidden, c->intermediate},
                        {&L->up, "up_proj", c->hidden, c->intermediate},
                        {&L->down, "down_proj", c->intermediate, c->hidden},
                };
                r = bk_is_mla(c) ? deepseek_layer_check(c, L, l, err)
                                 : linears_check(lins, ELEMENTSOF(lins), l, err);
                if (r < 0)
                        return r;
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
