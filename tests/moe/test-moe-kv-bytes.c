/* SPDX-License-Identifier: MIT */
/* MLA's KV cache holds only the latent and the shared rope key: kv_lora_rank +
 * qk_rope_head_dim floats per token per layer on the CPU backend.
 * - DeepSeek-V2-Lite's config (the one `dsquant synth --shape deepseek-v2-lite` writes):
 *   27 × 576 × 4 bytes. No weights are needed: the backend only checks that every
 *   tensor is present and has its shape, so one dummy buffer stands in for all of them.
 * - The V2 and V3 fixtures: 3 × (256 + 32) × 4 bytes. */
#include <string.h>

#include "backend.h"
#include "model.h"
#include "test_util.h"

/* DeepSeek-V2-Lite's published config.json, abridged to what dsd reads, in the form
 * dsquant synth writes it. */
static const char V2_LITE[] =
        "{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"model_type\": \"deepseek_v2\","
        " \"hidden_size\": 2048, \"intermediate_size\": 10944, \"num_hidden_layers\": 27,"
        " \"num_attention_heads\": 16, \"num_key_value_heads\": 16, \"vocab_size\": 102400,"
        " \"max_position_embeddings\": 163840, \"rms_norm_eps\": 1e-06, \"q_lora_rank\": null,"
        " \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64,"
        " \"v_head_dim\": 128, \"n_routed_experts\": 64, \"n_shared_experts\": 2,"
        " \"num_experts_per_tok\": 6, \"moe_intermediate_size\": 1408,"
        " \"first_k_dense_replace\": 1, \"moe_layer_freq\": 1, \"n_group\": 1,"
        " \"topk_group\": 1, \"topk_method\": \"greedy\", \"scoring_func\": \"softmax\","
        " \"norm_topk_prob\": false, \"routed_scaling_factor\": 1.0, \"rope_theta\": 10000,"
        " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, \"beta_fast\": 32,"
        " \"beta_slow\": 1, \"mscale\": 0.707, \"mscale_all_dim\": 0.707,"
        " \"original_max_position_embeddings\": 4096}, \"tie_word_embeddings\": false}";

static uint64_t dummy[64];

static BkLinear fake(uint32_t in, uint32_t out)
{
        return (BkLinear){.kind = BK_LINEAR_DENSE,
                .in = in,
                .out = out,
                .w = {.dtype = BK_DT_F16, .data = dummy}};
}

static BkExpert fake_mlp(uint32_t hidden, uint32_t width)
{
        return (BkExpert){fake(hidden, width), fake(hidden, width), fake(width, hidden)};
}

/* Loads a BkModel of cfg's shape whose every tensor is the dummy buffer, and returns
 * the CPU backend's KV bytes per token. */
static uint64_t cpu_kv_bytes(const BkConfig *c)
{
        const BkMlaConfig *m = &c->mla;
        const BkMoeConfig *mc = &c->moe;
        BkTensor t = {.dtype = BK_DT_F16, .data = dummy};
        BkModel model = {.cfg = *c, .embed = t, .final_norm = t};
        BkLayer *layers = calloc(c->n_layers, sizeof(*layers));
        BkExpert *experts = calloc(mc->n_routed, sizeof(*experts));
        Backend *b = NULL;
        DsError err = {0};

        CHECK(layers && experts, "out of memory");
        for (uint32_t e = 0; e < mc->n_routed; e++)
                experts[e] = fake_mlp(c->hidden, mc->expert_dim);
        for (uint32_t l = 0; l < c->n_layers; l++) {
                BkLayer *L = &layers[l];
                *L = (BkLayer){.attn_norm = t, .mlp_norm = t};
                L->q = fake(c->hidden, c->n_heads * (m->qk_nope_dim + m->qk_rope_dim));
                L->mla.kv_a = fake(c->hidden, m->kv_lora_rank + m->qk_rope_dim);
                L->mla.kv_a_norm = t;
                L->mla.kv_b = fake(m->kv_lora_rank, c->n_heads * (m->qk_nope_dim + m->v_head_dim));
                L->o = fake(c->n_heads * m->v_head_dim, c->hidden);
                if (l < mc->first_dense) {
                        BkExpert d = fake_mlp(c->hidden, c->intermediate);
                        L->gate = d.gate;
                        L->up = d.up;
                        L->down = d.down;
                        continue;
                }
                L->moe = (BkMoe){.experts = experts,
                        .router = t,
                        .shared = fake_mlp(c->hidden, mc->n_shared * mc->expert_dim)};
        }
        model.layers = layers;
        model.lm_head = fake(c->hidden, c->vocab_size);

        CHECK(backend_cpu_ops.create(&(BkOptions){0}, &b, &err) == 0, "%s", err.msg);
        CHECK(backend_cpu_ops.load(b, &model, &err) == 0, "load: %s", err.msg);
        uint64_t bytes = backend_cpu_ops.kv_bytes_per_token(b);
        /* The cache is sized by that figure: 4 blocks of 16 tokens fit exactly. */
        CHECK(backend_cpu_ops.kv_init(b, 16, bytes * 16 * 4, &err) == 4, "kv_init: %s", err.msg);
        backend_cpu_ops.free(b);
        free(layers);
        free(experts);
        return bytes;
}

int main(void)
{
        BkConfig c;
        ModelInfo info;
        DsError err = {0};

        CHECK(model_config_parse(
                      "v2-lite config.json", V2_LITE, strlen(V2_LITE), &c, &info, &err) == 0,
                "%s", err.msg);
        uint64_t bytes = cpu_kv_bytes(&c);
        printf("DeepSeek-V2-Lite: %llu KV bytes per token (27 layers x 576 floats)\n",
                (unsigned long long) bytes);
        CHECK(bytes == 27u * 576u * sizeof(float), "V2-Lite: %llu", (unsigned long long) bytes);

        const char *fixtures[] = {"fixtures/tiny-deepseek-v2-awq", "fixtures/tiny-deepseek-v3-awq"};
        for (size_t i = 0; i < ELEMENTSOF(fixtures); i++) {
                Model *m = NULL;
                Backend *b = NULL;
                CHECK(model_load(test_shared(fixtures[i]), &(ModelOptions){0}, &m, &err) == 0, "%s",
                        err.msg);
                CHECK(backend_cpu_ops.create(&(BkOptions){0}, &b, &err) == 0, "%s", err.msg);
                CHECK(backend_cpu_ops.load(b, &m->bk, &err) == 0, "%s", err.msg);
                const BkConfig *fc = &m->bk.cfg;
                uint64_t want = (uint64_t) fc->n_layers *
                                (fc->mla.kv_lora_rank + fc->mla.qk_rope_dim) * sizeof(float);
                bytes = backend_cpu_ops.kv_bytes_per_token(b);
                printf("%s: %llu KV bytes per token\n", fixtures[i], (unsigned long long) bytes);
                CHECK(bytes == want && want == 3u * 288u * 4u, "%s: %llu, expected %llu",
                        fixtures[i], (unsigned long long) bytes, (unsigned long long) want);
                backend_cpu_ops.free(b);
                model_free(m);
        }
        return 0;
}
