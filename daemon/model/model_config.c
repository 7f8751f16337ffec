/* SPDX-License-Identifier: MIT */
/* config.json (and the older quant_config.json) into BkConfig and ModelInfo. Every field is
 * type- and range-checked, and every message names the file and the field, because a bad
 * config is the most common way a checkpoint fails to load. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "json_excerpt.h"
#include "model.h"

/* Limits well above any real model, so that products of dimensions stay far from
 * overflow and a hostile config cannot ask for absurd allocations. */
#define DIM_MAX         (1u << 20)
#define HEADS_MAX       4096u
#define LAYERS_MAX      4096u
#define VOCAB_MAX       (1u << 24)
#define POSITIONS_MAX   (1u << 26)
#define CONFIG_FILE_MAX (16u << 20)

static void cjson_deletep(cJSON **j)
{
        cJSON_Delete(*j);
}

/* The context every field reader needs for its message: the file and the object's path. */
typedef struct Field {
        const char *file;
        const char *prefix; /* "" or "rope_scaling." etc. */
        const cJSON *obj;
        DsError *err;
} Field;

static int field_error(const Field *f, int code, const char *key, const cJSON *v, const char *want)
{
        char buf[48];

        if (!v)
                return ds_error(
                        f->err, code, "%s: field '%s%s' is missing", f->file, f->prefix, key);
        return ds_error(f->err, code, "%s: field '%s%s' must be %s, got %s", f->file, f->prefix,
                key, want, json_excerpt(v, buf, sizeof(buf)));
}

/* A value that is absent or null takes the default. */
static const cJSON *field_get(const Field *f, const char *key)
{
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->obj, key);
        return cJSON_IsNull(v) ? NULL : v;
}

/* An integer in [lo, hi]; absent → def when !required. */
static int field_uint(const Field *f, const char *key, bool required, uint32_t def, uint32_t lo,
        uint32_t hi, uint32_t *ret)
{
        const cJSON *v = field_get(f, key);
        char want[64];
        double d;

        if (!v) {
                if (required)
                        return field_error(f, -DS_ERR_FORMAT, key, NULL, NULL);
                *ret = def;
                return 0;
        }
        snprintf(want, sizeof(want), "an integer in [%u, %u]", lo, hi);
        if (!cJSON_IsNumber(v))
                return field_error(f, -DS_ERR_FORMAT, key, v, want);
        d = v->valuedouble;
        if (!isfinite(d) || d != floor(d) || d < lo || d > hi)
                return field_error(f, -DS_ERR_FORMAT, key, v, want);
        *ret = (uint32_t) d;
        return 0;
}

/* A finite number > lo (or >= lo when inclusive). */
static int field_float(const Field *f, const char *key, bool required, double def, double lo,
        bool inclusive, float *ret)
{
        const cJSON *v = field_get(f, key);
        char want[64];
        double d;

        if (!v) {
                if (required)
                        return field_error(f, -DS_ERR_FORMAT, key, NULL, NULL);
                *ret = (float) def;
                return 0;
        }
        snprintf(want, sizeof(want), "a finite number %s %g", inclusive ? ">=" : ">", lo);
        if (!cJSON_IsNumber(v))
                return field_error(f, -DS_ERR_FORMAT, key, v, want);
        d = v->valuedouble;
        /* Checked after narrowing: 1e-60 is positive as a double but 0 as a float. */
        float x = (float) d;
        if (!isfinite(d) || !isfinite(x) || x < lo || (!inclusive && x <= lo))
                return field_error(f, -DS_ERR_FORMAT, key, v, want);
        *ret = x;
        return 0;
}

static int field_bool(const Field *f, const char *key, bool def, bool *ret)
{
        const cJSON *v = field_get(f, key);

        if (!v) {
                *ret = def;
                return 0;
        }
        if (!cJSON_IsBool(v))
                return field_error(f, -DS_ERR_FORMAT, key, v, "true or false");
        *ret = cJSON_IsTrue(v);
        return 0;
}

/* A string, or NULL in *ret when absent and not required. */
static int field_string(const Field *f, const char *key, bool required, const char **ret)
{
        const cJSON *v = field_get(f, key);

        if (!v) {
                if (required)
                        return field_error(f, -DS_ERR_FORMAT, key, NULL, NULL);
                *ret = NULL;
                return 0;
        }
        if (!cJSON_IsString(v))
                return field_error(f, -DS_ERR_FORMAT, key, v, "a string");
        *ret = v->valuestring;
        return 0;
}

// --- Architecture and dimensions

static int parse_arch(const Field *f, BkArch *ret_arch, ModelInfo *info)
{
        static const struct {
                const char *name;
                BkArch arch;
        } archs[] = {
                {"Qwen2ForCausalLM", BK_ARCH_QWEN2},
                {"LlamaForCausalLM", BK_ARCH_LLAMA},
                {"DeepseekV2ForCausalLM", BK_ARCH_DEEPSEEK_V2},
                {"DeepseekV3ForCausalLM", BK_ARCH_DEEPSEEK_V3},
        };
        const cJSON *v = field_get(f, "architectures");
        const char *name;

        if (!v)
                return field_error(f, -DS_ERR_FORMAT, "architectures", NULL, NULL);
        if (!cJSON_IsArray(v) || !cJSON_IsString(v->child))
                return field_error(
                        f, -DS_ERR_FORMAT, "architectures", v, "a list of architecture names");
        name = v->child->valuestring;
        for (size_t i = 0; i < ELEMENTSOF(archs); i++)
                if (!strcmp(name, archs[i].name)) {
                        *ret_arch = archs[i].arch;
                        snprintf(info->architecture, sizeof(info->architecture), "%s", name);
                        return 0;
                }
        return ds_error(f->err, -DS_ERR_UNSUPPORTED,
                "%s: architecture '%.100s' is not supported (supported: Qwen2ForCausalLM, "
                "LlamaForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM)",
                f->file, name);
}

static int parse_dims(const Field *f, BkConfig *c)
{
        bool has_head_dim = field_get(f, "head_dim") != NULL;
        int r;

        if ((r = field_uint(f, "hidden_size", true, 0, 1, DIM_MAX, &c->hidden)) < 0 ||
                (r = field_uint(f, "intermediate_size", true, 0, 1, DIM_MAX, &c->intermediate)) <
                        0 ||
                (r = field_uint(f, "num_hidden_layers", true, 0, 1, LAYERS_MAX, &c->n_layers)) <
                        0 ||
                (r = field_uint(f, "num_attention_heads", true, 0, 1, HEADS_MAX, &c->n_heads)) <
                        0 ||
                (r = field_uint(f, "num_key_value_heads", false, c->n_heads, 1, HEADS_MAX,
                         &c->n_kv_heads)) < 0 ||
                (r = field_uint(f, "vocab_size", true, 0, 1, VOCAB_MAX, &c->vocab_size)) < 0 ||
                (r = field_uint(f, "max_position_embeddings", true, 0, 1, POSITIONS_MAX,
                         &c->max_positions)) < 0 ||
                (r = field_float(f, "rms_norm_eps", false, 1e-6, 0, false, &c->rms_eps)) < 0)
                return r;

        if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads != 0)
                return ds_error(f->err, -DS_ERR_FORMAT,
                        "%s: field 'num_key_value_heads' (%u) must divide num_attention_heads (%u)",
                        f->file, c->n_kv_heads, c->n_heads);
        if (!has_head_dim && c->hidden % c->n_heads != 0)
                return ds_error(f->err, -DS_ERR_FORMAT,
                        "%s: field 'num_attention_heads' (%u) must divide hidden_size (%u) when "
                        "head_dim is not given",
                        f->file, c->n_heads, c->hidden);
        r = field_uint(f, "head_dim", false, c->hidden / c->n_heads, 2, DIM_MAX, &c->head_dim);
        if (r < 0)
                return r;
        /* Rotate-half RoPE pairs element i with i + head_dim/2. */
        if (c->head_dim % 2 != 0)
                return ds_error(f->err, -DS_ERR_FORMAT, "%s: field 'head_dim' (%u) must be even",
                        f->file, c->head_dim);
        if ((uint64_t) c->head_dim * c->n_heads > DIM_MAX)
                return ds_error(f->err, -DS_ERR_FORMAT,
                        "%s: field 'head_dim' (%u) times num_attention_heads (%u) is over %u",
                        f->file, c->head_dim, c->n_heads, DIM_MAX);
        c->vocab_sample = c->vocab_size;
        return 0;
}

// --- RoPE

/* transformers' get_mscale. */
static float yarn_mscale(float scale, float mscale)
{
        return scale <= 1.0f ? 1.0f : 0.1f * mscale * logf(scale) + 1.0f;
}

static int parse_rope_llama3(const Field *p, BkRope *rope)
{
        int r;

        if ((r = field_float(p, "factor", true, 0, 1, true, &rope->factor)) < 0 ||
                (r = field_float(p, "low_freq_factor", true, 0, 0, false, &rope->low_freq_factor)) <
                        0 ||
                (r = field_float(
                         p, "high_freq_factor", true, 0, 0, false, &rope->high_freq_factor)) < 0 ||
                (r = field_uint(p, "original_max_position_embeddings", true, 0, 1, POSITIONS_MAX,
                         &rope->original_max_pos)) < 0)
                return r;
        /* The smoothing ramp divides by high - low. */
        if (rope->high_freq_factor <= rope->low_freq_factor)
                return ds_error(p->err, -DS_ERR_FORMAT,
                        "%s: field '%shigh_freq_factor' (%g) must be above low_freq_factor (%g)",
                        p->file, p->prefix, rope->high_freq_factor, rope->low_freq_factor);
        return 0;
}

static int parse_rope_yarn(const Field *p, uint32_t max_positions, BkRope *rope)
{
        int r;

        if ((r = field_float(p, "factor", true, 0, 1, true, &rope->factor)) < 0 ||
                (r = field_uint(p, "original_max_position_embeddings", false, max_positions, 1,
                         POSITIONS_MAX, &rope->original_max_pos)) < 0 ||
                (r = field_float(p, "beta_fast", false, 32, 0, false, &rope->beta_fast)) < 0 ||
                (r = field_float(p, "beta_slow", false, 1, 0, false, &rope->beta_slow)) < 0 ||
                (r = field_float(p, "mscale", false, 0, 0, true, &rope->mscale)) < 0 ||
                (r = field_float(p, "mscale_all_dim", false, 0, 0, true, &rope->mscale_all_dim)) <
                        0 ||
                (r = field_float(
                         p, "attention_factor", false, 0, 0, true, &rope->attention_factor)) < 0)
                return r;
        if (rope->beta_fast < rope->beta_slow)
                return ds_error(p->err, -DS_ERR_FORMAT,
                        "%s: field '%sbeta_fast' (%g) must not be below beta_slow (%g)", p->file,
                        p->prefix, rope->beta_fast, rope->beta_slow);
        /* As transformers' _compute_yarn_parameters: an explicit attention_factor wins,
         * then the DeepSeek-style mscale ratio, then 0.1 ln(factor) + 1. */
        if (rope->attention_factor == 0) {
                if (rope->mscale > 0 && rope->mscale_all_dim > 0)
                        rope->attention_factor = yarn_mscale(rope->factor, rope->mscale) /
                                                 yarn_mscale(rope->factor, rope->mscale_all_dim);
                else
                        rope->attention_factor = yarn_mscale(rope->factor, 1.0f);
        }
        return 0;
}

/* Two spellings: transformers 5's rope_parameters {rope_theta, rope_type, ...}, or the
 * published top-level rope_theta plus rope_scaling {type|rope_type, ...}. */
static int parse_rope(const Field *f, uint32_t max_positions, BkRope *rope)
{
        const cJSON *params = field_get(f, "rope_parameters");
        bool v5 = params != NULL;
        const char *type = NULL;
        Field p;
        int r;

        *rope = (BkRope){.type = BK_ROPE_DEFAULT};
        r = field_float(f, "rope_theta", false, 10000.0, 0, false, &rope->theta);
        if (r < 0)
                return r;
        if (!v5)
                params = field_get(f, "rope_scaling");
        if (!params)
                return 0;
        if (!cJSON_IsObject(params))
                return field_error(f, -DS_ERR_FORMAT, v5 ? "rope_parameters" : "rope_scaling",
                        params, "an object or null");

        p = (Field){f->file, v5 ? "rope_parameters." : "rope_scaling.", params, f->err};
        if (v5) {
                r = field_float(&p, "rope_theta", false, rope->theta, 0, false, &rope->theta);
                if (r < 0)
                        return r;
        }
        const char *key = "rope_type";
        r = field_string(&p, key, false, &type);
        if (r >= 0 && !type) {
                key = "type";
                r = field_string(&p, key, !v5, &type);
        }
        if (r < 0)
                return r;

        if (!type || !strcmp(type, "default"))
                return 0;
        if (!strcmp(type, "llama3")) {
                rope->type = BK_ROPE_LLAMA3;
                return parse_rope_llama3(&p, rope);
        }
        if (!strcmp(type, "yarn")) {
                rope->type = BK_ROPE_YARN;
                return parse_rope_yarn(&p, max_positions, rope);
        }
        return ds_error(f->err, -DS_ERR_UNSUPPORTED,
                "%s: field '%s%s': RoPE scaling '%.64s' is not supported (supported: default, "
                "llama3, yarn)",
                f->file, p.prefix, key, type);
}

// --- DeepSeek MLA and MoE

/* q_lora_rank, kv_lora_rank and the head split; head_dim becomes P + R, the width the
 * softmax scale and the query/key heads have, and every head is its own KV head. */
static int parse_mla(const Field *f, const BkRope *rope, BkConfig *c)
{
        BkMlaConfig *m = &c->mla;
        int r;

        if ((r = field_uint(f, "q_lora_rank", false, 0, 1, DIM_MAX, &m->q_lora_rank)) < 0 ||
                (r = field_uint(f, "kv_lora_rank", true, 0, 1, DIM_MAX, &m->kv_lora_rank)) < 0 ||
                (r = field_uint(f, "qk_nope_head_dim", true, 0, 1, DIM_MAX, &m->qk_nope_dim)) < 0 ||
                (r = field_uint(f, "qk_rope_head_dim", true, 0, 2, DIM_MAX, &m->qk_rope_dim)) < 0 ||
                (r = field_uint(f, "v_head_dim", true, 0, 1, DIM_MAX, &m->v_head_dim)) < 0)
                return r;
        /* RoPE rotates the pairs (2i, 2i+1) of the rope part. */
        if (m->qk_rope_dim % 2 != 0)
                return ds_error(f->err, -DS_ERR_FORMAT,
                        "%s: field 'qk_rope_head_dim' (%u) must be even", f->file, m->qk_rope_dim);
        uint64_t qk = (uint64_t) m->qk_nope_dim + m->qk_rope_dim;
        if (qk * c->n_heads > DIM_MAX ||
                (uint64_t) (m->qk_nope_dim + m->v_head_dim) * c->n_heads > DIM_MAX)
                return ds_error(f->err, -DS_ERR_FORMAT,
                        "%s: fields 'qk_nope_head_dim' + 'qk_rope_head_dim' / 'v_head_dim' times "
                        "num_attention_heads (%u) are over %u",
                        f->file, c->n_heads, DIM_MAX);
        c->head_dim = (uint32_t) qk;
        c->n_kv_heads = c->n_heads;

        /* YaRN sharpens the softmax too: with mscale_all_dim, the scale is multiplied by
         * m^2, m = 0.1 mscale_all_dim ln(factor) + 1 (both V2 and V3 in the reference). */
        double scale = 1.0 / sqrt((double) qk);
        if (rope->type == BK_ROPE_YARN && rope->mscale_all_dim > 0 && rope->factor > 1) {
                double mm = 0.1 * rope->mscale_all_dim * log(rope->factor) + 1.0;
                scale *= mm * mm;
        }
        m->softmax_scale = (float) scale;
        return 0;
}

static int parse_moe(const Field *f, bool v3_defaults, BkMoeConfig *m)
{
        const char *method = NULL, *scoring = NULL;
        bool has_routed = field_get(f, "n_routed_experts") != NULL;
        int r;

        if ((r = field_uint(f, "n_routed_experts", false, 0, 1, 1u << 16, &m->n_routed)) < 0 ||
                (r = field_uint(f, "n_shared_experts", false, 0, 0, 1u << 16, &m->n_shared)) < 0 ||
                (r = field_uint(f, "first_k_dense_replace", false, 0, 0, LAYERS_MAX,
                         &m->first_dense)) < 0 ||
                (r = field_uint(f, "moe_layer_freq", false, 1, 1, LAYERS_MAX, &m->layer_freq)) <
                        0 ||
                (r = field_bool(f, "norm_topk_prob", false, &m->norm_topk_prob)) < 0 ||
                (r = field_float(f, "routed_scaling_factor", false, 1.0, 0, false,
                         &m->routed_scaling_factor)) < 0 ||
                (r = field_string(f, "topk_method", false, &method)) < 0 ||
                (r = field_string(f, "scoring_func", false, &scoring)) < 0)
                return r;
        if (!has_routed)
                return 0; /* every layer dense */
        if ((r = field_uint(f, "num_experts_per_tok", true, 0, 1, m->n_routed, &m->top_k)) < 0 ||
                (r = field_uint(f, "moe_intermediate_size", true, 0, 1, DIM_MAX, &m->expert_dim)) <
                        0 ||
                (r = field_uint(f, "n_group", false, 1, 1, m->n_routed, &m->n_group)) < 0 ||
                (r = field_uint(f, "topk_group", false, 1, 1, m->n_group, &m->topk_group)) < 0)
                return r;
        if ((uint64_t) m->n_shared * m->expert_dim > DIM_MAX)
                return ds_error(f->err, -DS_ERR_FORMAT,
                        "%s: field 'n_shared_experts' (%u) times moe_intermediate_size (%u) is "
                        "over %u",
                        f->file, m->n_shared, m->expert_dim, DIM_MAX);

        /* deepseek_v3 configs may leave these out: V3 routing is the rule there. */
        if (!method)
                method = v3_defaults ? "noaux_tc" : "greedy";
        if (!scoring)
                scoring = v3_defaults ? "sigmoid" : "softmax";
        if (!strcmp(method, "greedy"))
                m->topk_method = BK_TOPK_GREEDY;
        else if (!strcmp(method, "group_limited_greedy"))
                m->topk_method = BK_TOPK_GROUP_LIMITED_GREEDY;
        else if (!strcmp(method, "noaux_tc"))
                m->topk_method = BK_TOPK_NOAUX_TC;
        else
                return ds_error(f->err, -DS_ERR_UNSUPPORTED,
                        "%s: field 'topk_method': '%.64s' is not supported (supported: greedy, "
                        "group_limited_greedy, noaux_tc)",
                        f->file, method);
        if (!strcmp(scoring, "softmax"))
                m->scoring = BK_SCORING_SOFTMAX;
        else if (!strcmp(scoring, "sigmoid"))
                m->scoring = BK_SCORING_SIGMOID;
        else
                return ds_error(f->err, -DS_ERR_UNSUPPORTED,
                        "%s: field 'scoring_func': '%.64s' is not supported (supported: softmax, "
                        "sigmoid)",
                        f->file, scoring);
        /* The reference pairs them this way: the V2 gate softmaxes, the V3 router sigmoids. */
        if ((m->topk_method == BK_TOPK_NOAUX_TC) != (m->scoring == BK_SCORING_SIGMOID))
                return ds_error(f->err, -DS_ERR_UNSUPPORTED,
                        "%s: field 'scoring_func': '%s' with topk_method '%s' is not supported "
                        "(softmax goes with greedy or group_limited_greedy, sigmoid with noaux_tc)",
                        f->file, scoring, method);

        if (m->n_routed % m->n_group != 0)
                return ds_error(f->err, -DS_ERR_FORMAT,
                        "%s: field 'n_group' (%u) must divide n_routed_experts (%u)", f->file,
                        m->n_group, m->n_routed);
        uint32_t per_group = m->n_routed / m->n_group;
        if (m->topk_method == BK_TOPK_NOAUX_TC && per_group < 2)
                return ds_error(f->err, -DS_ERR_FORMAT,
                        "%s: field 'n_group' (%u): noaux_tc ranks groups by their top 2, so each "
                        "needs 2 or more of the %u experts",
                        f->file, m->n_group, m->n_routed);
        if (m->topk_method != BK_TOPK_GREEDY && m->top_k > m->topk_group * per_group)
                return ds_error(f->err, -DS_ERR_FORMAT,
                        "%s: field 'num_experts_per_tok' (%u) is more than the %u experts of "
                        "topk_group (%u) groups",
                        f->file, m->top_k, m->topk_group * per_group, m->topk_group);
        return 0;
}

// --- Token ids

static int parse_token_ids(const Field *f, uint32_t vocab, ModelInfo *info)
{
        const cJSON *eos = field_get(f, "eos_token_id"), *e;
        uint32_t id;
        int r;

        info->bos_id = -1;
        if (field_get(f, "bos_token_id")) {
                r = field_uint(f, "bos_token_id", true, 0, 0, vocab - 1, &id);
                if (r < 0)
                        return r;
                info->bos_id = (int32_t) id;
        }

        info->n_eos = 0;
        if (!eos)
                return 0;
        if (cJSON_IsNumber(eos)) {
                r = field_uint(f, "eos_token_id", true, 0, 0, vocab - 1, &id);
                if (r < 0)
                        return r;
                info->eos_ids[info->n_eos++] = (int32_t) id;
                return 0;
        }
        if (!cJSON_IsArray(eos))
                return field_error(f, -DS_ERR_FORMAT, "eos_token_id", eos,
                        "a token id, a list of them, or null");
        cJSON_ArrayForEach(e, eos)
        {
                double d = cJSON_IsNumber(e) ? e->valuedouble : -1;

                if (!isfinite(d) || d != floor(d) || d < 0 || d >= vocab)
                        return field_error(f, -DS_ERR_FORMAT, "eos_token_id", eos,
                                "a list of token ids below vocab_size");
                if (info->n_eos == ELEMENTSOF(info->eos_ids))
                        return ds_error(f->err, -DS_ERR_UNSUPPORTED,
                                "%s: field 'eos_token_id' lists more than %zu ids", f->file,
                                ELEMENTSOF(info->eos_ids));
                info->eos_ids[info->n_eos++] = (int32_t) d;
        }
        return 0;
}

// --- Quantization

/* AutoAWQ GEMM only. legacy reads quant_config.json's spelling (w_bit, q_group_size). */
static int parse_quant(const Field *q, bool legacy, ModelInfo *info)
{
        const char *method = NULL, *version = NULL;
        const cJSON *skip, *e;
        uint32_t bits, gs;
        bool zero_point;
        int r;

        if (!legacy) {
                r = field_string(q, "quant_method", true, &method);
                if (r < 0)
                        return r;
                if (strcasecmp(method, "awq"))
                        return ds_error(q->err, -DS_ERR_UNSUPPORTED,
                                "%s: field '%squant_method': quantization method '%.64s' is not "
                                "supported (supported: awq)",
                                q->file, q->prefix, method);
        }
        r = field_uint(q, legacy ? "w_bit" : "bits", true, 0, 0, 64, &bits);
        if (r < 0)
                return r;
        if (bits != 4)
                return ds_error(q->err, -DS_ERR_UNSUPPORTED,
                        "%s: field '%s%s': %u-bit AWQ is not supported (only 4)", q->file,
                        q->prefix, legacy ? "w_bit" : "bits", bits);
        r = field_uint(q, legacy ? "q_group_size" : "group_size", true, 0, 0, UINT32_MAX, &gs);
        if (r < 0)
                return r;
        if (gs != 32 && gs != 64 && gs != 128)
                return ds_error(q->err, -DS_ERR_UNSUPPORTED,
                        "%s: field '%s%s': group size %u is not supported (32, 64 or 128)", q->file,
                        q->prefix, legacy ? "q_group_size" : "group_size", gs);
        r = field_bool(q, "zero_point", true, &zero_point);
        if (r < 0)
                return r;
        if (!zero_point)
                return ds_error(q->err, -DS_ERR_UNSUPPORTED,
                        "%s: field '%szero_point': AWQ without zero points is not supported",
                        q->file, q->prefix);
        r = field_string(q, "version", false, &version);
        if (r < 0)
                return r;
        if (version && !strcasecmp(version, "gemv"))
                return ds_error(q->err, -DS_ERR_UNSUPPORTED,
                        "%s: field '%sversion': the AWQ GEMV layout (qweight [out, in/8]) is not "
                        "supported; requantize as GEMM",
                        q->file, q->prefix);
        if (version && strcasecmp(version, "gemm"))
                return ds_error(q->err, -DS_ERR_UNSUPPORTED,
                        "%s: field '%sversion': AWQ version '%.64s' is not supported (supported: "
                        "gemm)",
                        q->file, q->prefix, version);

        info->n_not_convert = 0;
        skip = field_get(q, "modules_to_not_convert");
        if (skip && !cJSON_IsArray(skip))
                return field_error(q, -DS_ERR_FORMAT, "modules_to_not_convert", skip,
                        "a list of module names or null");
        cJSON_ArrayForEach(e, skip)
        {
                if (!cJSON_IsString(e) || !e->valuestring[0])
                        return field_error(q, -DS_ERR_FORMAT, "modules_to_not_convert", skip,
                                "a list of module names or null");
                if (info->n_not_convert == ELEMENTSOF(info->not_convert) ||
                        strlen(e->valuestring) >= sizeof(info->not_convert[0]))
                        return ds_error(q->err, -DS_ERR_UNSUPPORTED,
                                "%s: field '%smodules_to_not_convert': more than %zu names, or a "
                                "name over %zu bytes",
                                q->file, q->prefix, ELEMENTSOF(info->not_convert),
                                sizeof(info->not_convert[0]) - 1);
                strcpy(info->not_convert[info->n_not_convert++], e->valuestring);
        }

        info->group_size = gs;
        snprintf(info->quant, sizeof(info->quant), "awq-int4 g%u", gs);
        return 0;
}

// --- Entry points

/* Parses a whole JSON document: a NUL byte or anything but whitespace after the value is
 * an error, as in Python's json.loads. */
static int config_json_parse(
        const char *name, const char *json, size_t len, cJSON **ret, DsError *err)
{
        _cleanup_free_ char *text = malloc(len + 1);

        if (!text)
                return -ENOMEM;
        if (len > 0)
                memcpy(text, json, len);
        text[len] = 0;
        if (strlen(text) != len)
                return ds_error(err, -DS_ERR_FORMAT, "%s: holds a NUL byte", name);
        *ret = cJSON_ParseWithOpts(text, NULL, true);
        if (!*ret)
                return ds_error(err, -DS_ERR_FORMAT, "%s: not valid JSON", name);
        return 0;
}

int model_config_parse(const char *name, const char *json, size_t len, BkConfig *ret_cfg,
        ModelInfo *ret_info, DsError *err)
{
        _cleanup_(cjson_deletep) cJSON *root = NULL;
        const cJSON *quant;
        BkConfig c = {};
        ModelInfo info = {};
        bool sliding, attn_bias, mlp_bias;
        const char *act;
        Field f;
        int r;

        if (!name || (!json && len > 0) || !ret_cfg || !ret_info)
                return -EINVAL;
        r = config_json_parse(name, json, len, &root, err);
        if (r < 0)
                return r;
        if (!cJSON_IsObject(root))
                return ds_error(err, -DS_ERR_FORMAT, "%s: not a JSON object", name);
        f = (Field){name, "", root, err};

        if ((r = parse_arch(&f, &c.arch, &info)) < 0 || (r = parse_dims(&f, &c)) < 0 ||
                (r = parse_rope(&f, c.max_positions, &c.rope)) < 0 ||
                (r = parse_token_ids(&f, c.vocab_size, &info)) < 0 ||
                (r = field_bool(&f, "tie_word_embeddings", false, &info.tie_embeddings)) < 0 ||
                (r = field_string(&f, "hidden_act", false, &act)) < 0)
                return r;
        if (act && strcmp(act, "silu"))
                return ds_error(err, -DS_ERR_UNSUPPORTED,
                        "%s: field 'hidden_act': activation '%.64s' is not supported (supported: "
                        "silu)",
                        name, act);

        if (bk_is_mla(&c)) {
                const char *type = NULL;
                if ((r = field_string(&f, "model_type", false, &type)) < 0 ||
                        (r = parse_mla(&f, &c.rope, &c)) < 0 ||
                        (r = parse_moe(&f,
                                 c.arch == BK_ARCH_DEEPSEEK_V3 ||
                                         (type && !strcmp(type, "deepseek_v3")),
                                 &c.moe)) < 0 ||
                        (r = field_bool(&f, "attention_bias", false, &attn_bias)) < 0 ||
                        (r = field_bool(&f, "mlp_bias", false, &mlp_bias)) < 0)
                        return r;
                if (attn_bias || mlp_bias)
                        return ds_error(err, -DS_ERR_UNSUPPORTED,
                                "%s: field '%s': DeepSeek projections with biases are not "
                                "supported",
                                name, attn_bias ? "attention_bias" : "mlp_bias");
        } else if (c.arch == BK_ARCH_QWEN2) {
                r = field_bool(&f, "use_sliding_window", false, &sliding);
                if (r < 0)
                        return r;
                if (sliding)
                        return ds_error(err, -DS_ERR_UNSUPPORTED,
                                "%s: field 'use_sliding_window': sliding-window attention is not "
                                "supported",
                                name);
                info.qkv_bias = true;
        } else {
                if ((r = field_bool(&f, "attention_bias", false, &attn_bias)) < 0 ||
                        (r = field_bool(&f, "mlp_bias", false, &mlp_bias)) < 0)
                        return r;
                info.qkv_bias = info.o_bias = attn_bias;
                info.mlp_bias = mlp_bias;
        }

        snprintf(info.quant, sizeof(info.quant), "dense");
        quant = field_get(&f, "quantization_config");
        if (quant) {
                if (!cJSON_IsObject(quant))
                        return field_error(
                                &f, -DS_ERR_FORMAT, "quantization_config", quant, "an object");
                Field q = {name, "quantization_config.", quant, err};
                r = parse_quant(&q, false, &info);
                if (r < 0)
                        return r;
        }

        *ret_cfg = c;
        *ret_info = info;
        return 0;
}

int model_config_load(const char *dir, BkConfig *ret_cfg, ModelInfo *ret_info, DsError *err)
{
        _cleanup_free_ char *path = NULL, *qpath = NULL, *text = NULL, *qtext = NULL;
        _cleanup_(cjson_deletep) cJSON *qroot = NULL;
        BkConfig c;
        ModelInfo info;
        size_t len;
        int r;

        if (!dir || !ret_cfg || !ret_info)
                return -EINVAL;
        if (asprintf(&path, "%s/config.json", dir) < 0) {
                path = NULL;
                return -ENOMEM;
        }
        r = st_read_text(path, CONFIG_FILE_MAX, &text, &len, err);
        if (r < 0)
                return r;
        r = model_config_parse(path, text, len, &c, &info, err);
        if (r < 0)
                return r;

        if (info.group_size == 0) {
                if (asprintf(&qpath, "%s/quant_config.json", dir) < 0) {
                        qpath = NULL;
                        return -ENOMEM;
                }
                if (access(qpath, F_OK) == 0) {
                        r = st_read_text(qpath, CONFIG_FILE_MAX, &qtext, &len, err);
                        if (r < 0)
                                return r;
                        r = config_json_parse(qpath, qtext, len, &qroot, err);
                        if (r < 0)
                                return r;
                        if (!cJSON_IsObject(qroot))
                                return ds_error(
                                        err, -DS_ERR_FORMAT, "%s: not a JSON object", qpath);
                        Field q = {qpath, "", qroot, err};
                        r = parse_quant(&q, true, &info);
                        if (r < 0)
                                return r;
                }
        }

        *ret_cfg = c;
        *ret_info = info;
        return 0;
}
