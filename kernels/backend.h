/* SPDX-License-Identifier: MIT */
/* The one interface the daemon sees of compute (DESIGN.md §6): create a backend, hand it
 * a model's weights, size the paged KV cache, and run one step for a batch of sequences.
 * Backends sit behind a const BackendOps table chosen at run time, like Redis ae's
 * multiplexers. kernels/ knows nothing about files, clients or processes: the loader in
 * daemon/ turns a checkpoint into the BkModel below. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef enum BkDtype {
        BK_DT_F32,
        BK_DT_F16,
        BK_DT_BF16,
        _BK_DT_MAX,
} BkDtype;

/* A vector or matrix of plain numbers, row-major. data is aligned to the element size. */
typedef struct BkTensor {
        BkDtype dtype;
        const void *data;
} BkTensor;

typedef enum BkLinearKind {
        BK_LINEAR_DENSE, /* w: [out][in] in w.dtype, the Hugging Face nn.Linear layout */
        BK_LINEAR_AWQ,   /* AutoAWQ GEMM layout, see docs/formats.md of shared/ */
        BK_LINEAR_Q8,    /* 8-bit rows with a float32 scale a group: the lm_head at load */
        _BK_LINEAR_MAX,
} BkLinearKind;

/* y[out] = x[in] · W + bias. */
typedef struct BkLinear {
        BkLinearKind kind;
        uint32_t in, out;
        BkTensor w;              /* DENSE: [out][in] */
        const uint32_t *qweight; /* AWQ: [in][out/8], nibble order REV = 0,4,1,5,2,6,3,7 */
        const uint32_t *qzeros;  /* AWQ: [in/group_size][out/8], same packing */
        const uint16_t *scales;  /* AWQ: [in/group_size][out], IEEE fp16 */
        uint32_t group_size;     /* AWQ: 32, 64 or 128; Q8: 32, 64 or 128 dividing in */
        /* Q8: y[o] = sum over groups g of q8_scales[o][g] * (sum over k of g of
         * q8[o][k] * x[k]), q8 in -127..127 (see daemon/model/q8_pack.h) */
        const int8_t *q8;       /* Q8: [out][in] */
        const float *q8_scales; /* Q8: [out][in / group_size] */
        BkTensor bias;          /* [out], data NULL when the layer has none */
} BkLinear;

typedef enum BkArch {
        BK_ARCH_LLAMA,
        BK_ARCH_QWEN2,
        BK_ARCH_DEEPSEEK_V2, /* MLA attention, MoE MLPs (BkConfig.mla, .moe) */
        BK_ARCH_DEEPSEEK_V3, /* V2 plus q LoRA and the noaux_tc sigmoid router as a rule */
        _BK_ARCH_MAX,
} BkArch;

typedef enum BkRopeType {
        BK_ROPE_DEFAULT,
        BK_ROPE_LLAMA3, /* Llama-3.1 frequency smoothing */
        BK_ROPE_YARN,   /* YaRN as transformers' _compute_yarn_parameters does it */
        _BK_ROPE_MAX,
} BkRopeType;

typedef struct BkRope {
        BkRopeType type;
        float theta;
        float factor;               /* LLAMA3, YARN */
        float low_freq_factor;      /* LLAMA3 */
        float high_freq_factor;     /* LLAMA3 */
        uint32_t original_max_pos;  /* LLAMA3, YARN */
        float beta_fast, beta_slow; /* YARN */
        float attention_factor;     /* YARN: multiplies cos and sin */
        float mscale;               /* YARN, DeepSeek: 0 when absent */
        float mscale_all_dim;       /* YARN, DeepSeek: 0 when absent; also scales the softmax */
} BkRope;

/* Multi-head latent attention (DeepSeek-V2/V3), P = qk_nope_dim, R = qk_rope_dim. Keys and
 * values come from one compressed latent per token, so only that latent and the shared
 * rope key are cached: kv_lora_rank + R numbers per token per layer. */
typedef struct BkMlaConfig {
        uint32_t q_lora_rank;  /* 0: q_proj maps hidden straight to n_heads (P + R) */
        uint32_t kv_lora_rank; /* width of the cached latent c_kv */
        uint32_t qk_nope_dim;  /* P: the part of a query/key head without rope */
        uint32_t qk_rope_dim;  /* R: the roped part; one k_pe head shared by all heads */
        uint32_t v_head_dim;   /* Vd */
        float softmax_scale;   /* resolved by the loader: (P+R)^-0.5, times m^2 where the
                                * reference applies YaRN's mscale_all_dim */
} BkMlaConfig;

typedef enum BkTopkMethod {
        BK_TOPK_GREEDY,               /* plain top-k of the scores */
        BK_TOPK_GROUP_LIMITED_GREEDY, /* top-k within the topk_group groups of best max */
        BK_TOPK_NOAUX_TC,             /* biased scores, groups ranked by their top-2 sum */
        _BK_TOPK_MAX,
} BkTopkMethod;

typedef enum BkScoring {
        BK_SCORING_SOFTMAX,
        BK_SCORING_SIGMOID,
        _BK_SCORING_MAX,
} BkScoring;

/* DeepSeek mixture of experts. A layer is MoE when layer >= first_dense and
 * layer % layer_freq == 0; the loader decides and fills BkLayer.moe accordingly. */
typedef struct BkMoeConfig {
        uint32_t n_routed;    /* routed experts; 0 for a dense model */
        uint32_t n_shared;    /* shared experts, run as one MLP of n_shared * expert_dim */
        uint32_t top_k;       /* experts per token */
        uint32_t expert_dim;  /* moe_intermediate_size */
        uint32_t first_dense; /* first_k_dense_replace */
        uint32_t layer_freq;  /* moe_layer_freq */
        uint32_t n_group;     /* expert groups (1 when ungrouped) */
        uint32_t topk_group;  /* groups kept */
        BkTopkMethod topk_method;
        BkScoring scoring;
        bool norm_topk_prob;
        float routed_scaling_factor;
} BkMoeConfig;

/* Every dimension comes from config.json through the loader: one source of truth. */
typedef struct BkConfig {
        BkArch arch;
        uint32_t hidden;
        uint32_t intermediate;
        uint32_t n_layers;
        uint32_t n_heads;
        uint32_t n_kv_heads;
        uint32_t head_dim;
        uint32_t vocab_size;    /* rows of the embedding and lm_head, padding included */
        uint32_t vocab_sample;  /* ids >= this are padding and are never sampled */
        uint32_t max_positions; /* context limit */
        float rms_eps;
        BkRope rope;
        /* DeepSeek only (zero otherwise). There head_dim is P + R and n_kv_heads n_heads. */
        BkMlaConfig mla;
        BkMoeConfig moe;
} BkConfig;

/* True for the architectures with MLA attention (and MoE MLPs): DeepSeek-V2 and V3. */
static inline bool bk_is_mla(const BkConfig *c)
{
        return c->arch == BK_ARCH_DEEPSEEK_V2 || c->arch == BK_ARCH_DEEPSEEK_V3;
}

/* The MLA projections besides q (q_proj when there is no q LoRA) and o of BkLayer. */
typedef struct BkMla {
        BkLinear q_a;       /* q LoRA only: hidden → q_lora_rank */
        BkTensor q_a_norm;  /* q LoRA only: [q_lora_rank], RMSNorm eps 1e-6 */
        BkLinear q_b;       /* q LoRA only: q_lora_rank → n_heads (P + R) */
        BkLinear kv_a;      /* kv_a_proj_with_mqa: hidden → kv_lora_rank + R, [c_kv | k_pe] */
        BkTensor kv_a_norm; /* [kv_lora_rank], RMSNorm eps 1e-6 */
        BkLinear kv_b;      /* kv_lora_rank → n_heads (P + Vd), per head [k_nope | v] */
} BkMla;

/* One SwiGLU MLP: down(silu(gate(x)) * up(x)). */
typedef struct BkExpert {
        BkLinear gate, up, down;
} BkExpert;

typedef struct BkMoe {
        BkExpert *experts;   /* [n_routed]; NULL when the layer has a dense MLP */
        BkTensor router;     /* [n_routed][hidden] mlp.gate.weight, never quantized */
        BkTensor score_bias; /* [n_routed] e_score_correction_bias; data NULL when none */
        BkExpert shared;     /* n_shared * expert_dim wide; in = 0 when n_shared is 0 */
} BkMoe;

typedef struct BkLayer {
        BkTensor attn_norm;      /* [hidden] */
        BkLinear q, k, v, o;     /* MLA: q is q_proj (without q LoRA) or unused; k, v unused */
        BkTensor mlp_norm;       /* [hidden] */
        BkLinear gate, up, down; /* the dense MLP; unused in a MoE layer */
        BkMla mla;               /* DeepSeek only */
        BkMoe moe;               /* DeepSeek MoE layers only */
} BkLayer;

typedef struct BkModel {
        BkConfig cfg;
        BkTensor embed;      /* [vocab_size][hidden] */
        BkLayer *layers;     /* [n_layers] */
        BkTensor final_norm; /* [hidden] */
        BkLinear lm_head;    /* the embedding as a DENSE linear when tied */
} BkModel;

/* Sampling for one request. temperature 0 means greedy (argmax, lowest id on a tie). The
 * filters apply in the order penalties, top-k, temperature, top-p, min-p; 0 disables a
 * filter (top_p 1 too), 1 disables the repetition penalty. Probabilities are integer
 * weights (kernels/sample_math.h): an id below 2^-34 of the likeliest is never drawn and
 * top-k does not count it. The draw-th sample of a request uses Philox4x32-10 keyed by
 * seed (kernels/philox.h). */
typedef struct BkSampling {
        float temperature;
        uint32_t top_k;
        float top_p;
        float min_p;
        float repetition_penalty; /* divides positive logits, multiplies negative ones */
        float presence_penalty;   /* subtracted once from every id seen in history */
        float frequency_penalty;  /* subtracted per occurrence in history */
        uint64_t seed;
} BkSampling;

/* One sequence's part of a step: a prefill chunk or one decode token. */
typedef struct BkSeq {
        const int32_t *tokens; /* [n_tokens] fed at positions pos .. pos+n_tokens-1 */
        uint32_t n_tokens;
        uint32_t pos;
        const uint32_t *blocks; /* KV block ids covering positions 0 .. pos+n_tokens-1 */
        uint32_t n_blocks;
        bool sample; /* sample after the last token of this chunk */
        BkSampling sampling;
        const int32_t *history; /* ids the penalties count (prompt and output so far) */
        uint32_t n_history;
        uint64_t draw;        /* the request's draw counter: its n-th sampled token */
        float *logits;        /* optional out: [n_tokens][vocab_size], or NULL */
        float *sample_logits; /* optional out: [vocab_size] the raw logits of the row
                               * sampled from (for logprobs), or NULL; only with sample */
        /* submit() only: the one token fed is the id sampled for seqs[prev] of the step
         * submitted just before this one, which need not be collected yet; tokens is
         * unused. That step must have sampled seqs[prev]. */
        bool chained;
        uint32_t prev;
} BkSeq;

typedef struct BkOptions {
        const char *device; /* backend-specific; NULL for the default */
        uint32_t threads;   /* CPU worker threads; 0 means one */
} BkOptions;

typedef struct Backend Backend;

typedef struct BackendOps {
        const char *name;
        /* Returns 0, or a negative code with a message in err. */
        int (*create)(const BkOptions *opt, Backend **ret, DsError *err);
        /* The model's memory must stay valid until free() (the CPU backend reads it in
         * place; a device backend copies it). */
        int (*load)(Backend *b, const BkModel *model, DsError *err);
        /* Sizes the KV cache to at most mem_bytes in blocks of block_tokens positions;
         * returns the number of blocks (>0) or a negative code. Drops any earlier cache. */
        int64_t (*kv_init)(Backend *b, uint32_t block_tokens, uint64_t mem_bytes, DsError *err);
        /* Bytes of KV cache one position of one sequence takes, all layers together. */
        uint64_t (*kv_bytes_per_token)(const Backend *b);
        /* Runs one forward step. ret_ids[i] gets the sampled id of seqs[i], or -1 when
         * seqs[i].sample is false. Each sequence's logits and sample are bit-identical
         * whatever else is in the batch. */
        int (*step)(Backend *b, const BkSeq *seqs, uint32_t n_seqs, int32_t *ret_ids, DsError *err);
        /* step() in two halves, so that the host builds the next step while one runs.
         * submit() starts a step of the same sequences step() takes, chained ones included;
         * collect() waits for the oldest step submitted and not collected and writes its
         * ids. At most two steps are outstanding (-EBUSY for a third). A step's seqs may
         * be reused once submit() returns, except the logits and sample_logits buffers,
         * filled by the time collect() returns. A backend may run the step inside submit().
         * A failed submit leaves nothing outstanding for its step; a failed collect drops
         * its step. */
        int (*submit)(Backend *b, const BkSeq *seqs, uint32_t n_seqs, DsError *err);
        int (*collect)(Backend *b, int32_t *ret_ids, uint32_t n_seqs, DsError *err);
        /* True when submit() returns while a decode step runs (on a device), so that what
         * the host does meanwhile costs the step nothing; false when it computes there. */
        bool overlaps;
        /* Device memory in use and the device's total, in bytes; NULL for a backend that
         * computes in host memory. May be called from any thread. */
        int (*mem_info)(const Backend *b, uint64_t *ret_used, uint64_t *ret_total);
        /* Runs once what the backend would otherwise choose and load on its first use in a
         * step of up to max_rows rows (a device library's kernels for each row count), so
         * that no request waits for it. NULL where nothing is. */
        int (*warm)(Backend *b, uint32_t max_rows, DsError *err);
        void (*free)(Backend *b);
} BackendOps;

extern const BackendOps backend_cpu_ops;

/* The table for "cpu", "cuda" or "auto" (cuda when built and a device is present), or
 * NULL when that backend is not available in this build or on this machine. */
const BackendOps *backend_find(const char *name);

/* The checks every backend makes of a model before load(): a known architecture,
 * dimensions that agree with each other, and every tensor and linear layer the
 * architecture needs present with its shape. 0, or a negative code with a message naming
 * the layer and tensor. */
int bk_model_check(const BkModel *m, DsError *err);

/* Shared by the backends' submit(): copies seqs into out, each chained one fed the id
 * prev_ids (the n_prev ids of the step it chains from) holds for it, in tok[i]. 0, or
 * -EINVAL naming the sequence when a chained one feeds more than one token or its
 * predecessor sampled no id for it. */
int bk_chain_resolve(const BkSeq *seqs, uint32_t n, const int32_t *prev_ids, uint32_t n_prev,
        BkSeq *out, int32_t *tok, DsError *err);

/* Shared by every backend: one sampling decision from a row of float32 logits, computed
 * on the host in the CPU backend and mirrored on the device by the CUDA one. scratch
 * holds vocab floats and vocab ints. Returns the chosen id. */
int32_t bk_sample(const float *logits, uint32_t vocab, const BkSampling *s, const int32_t *history,
        uint32_t n_history, uint64_t draw, float *scratch_f, int32_t *scratch_i);
