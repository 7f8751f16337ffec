/* SPDX-License-Identifier: MIT */
/* model_config_parse on configurations that must be accepted, checking the values that
 * defaults and the two RoPE spellings produce; and quant_config.json, the older AutoAWQ
 * file, through model_config_load. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "model.h"
#include "test_util.h"

#define BASE                                                                                       \
        "\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":512,"                            \
        "\"intermediate_size\":1408,\"num_hidden_layers\":2,\"num_attention_heads\":4,"            \
        "\"vocab_size\":1024,\"max_position_embeddings\":4096"

static void parse(const char *json, BkConfig *c, ModelInfo *info)
{
        DsError err = {};
        int r = model_config_parse("test/config.json", json, strlen(json), c, info, &err);
        CHECK(r == 0, "%s: %s", json, err.msg);
}

static bool near(float a, float b)
{
        return fabsf(a - b) <= 1e-6f * fmaxf(1.0f, fabsf(b));
}

int main(void)
{
        BkConfig c;
        ModelInfo info;

        /* Defaults: kv heads = heads, head_dim = hidden / heads, theta 10000, eps 1e-6. */
        parse("{" BASE "}", &c, &info);
        CHECK(c.arch == BK_ARCH_QWEN2 && c.n_kv_heads == 4 && c.head_dim == 128, "defaults");
        CHECK(c.rope.type == BK_ROPE_DEFAULT && c.rope.theta == 10000.0f, "rope default");
        CHECK(near(c.rms_eps, 1e-6f) && c.vocab_sample == 1024, "eps / vocab_sample");
        CHECK(info.bos_id == -1 && info.n_eos == 0 && !info.tie_embeddings, "ids / tie");
        CHECK(info.qkv_bias && !info.o_bias && !info.mlp_bias, "qwen2 biases");
        CHECK(info.group_size == 0 && !strcmp(info.quant, "dense"), "dense");

        /* Published YaRN: attention_factor defaults to 0.1 ln(factor) + 1. */
        parse("{" BASE ",\"rope_theta\":1e6,\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4.0,"
              "\"original_max_position_embeddings\":1024},\"eos_token_id\":[5,7],"
              "\"bos_token_id\":3,\"tie_word_embeddings\":true}",
                &c, &info);
        CHECK(c.rope.type == BK_ROPE_YARN && c.rope.theta == 1e6f && c.rope.factor == 4.0f, "yarn");
        CHECK(c.rope.original_max_pos == 1024 && c.rope.beta_fast == 32 && c.rope.beta_slow == 1,
                "yarn defaults");
        CHECK(near(c.rope.attention_factor, 0.1f * logf(4.0f) + 1.0f), "attention_factor %g",
                c.rope.attention_factor);
        CHECK(info.n_eos == 2 && info.eos_ids[0] == 5 && info.eos_ids[1] == 7 && info.bos_id == 3,
                "ids");
        CHECK(info.tie_embeddings, "tie");

        /* DeepSeek-style mscale == mscale_all_dim cancels; original defaults to max positions. */
        parse("{" BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":40,"
              "\"mscale\":0.707,\"mscale_all_dim\":0.707,\"beta_fast\":16}}",
                &c, &info);
        CHECK(near(c.rope.attention_factor, 1.0f) && c.rope.original_max_pos == 4096 &&
                        c.rope.beta_fast == 16,
                "yarn mscale");

        /* transformers 5: rope_parameters, Llama 3.1 smoothing, attention_bias. */
        parse("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":512,"
              "\"intermediate_size\":1024,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
              "\"num_key_value_heads\":1,\"head_dim\":64,\"vocab_size\":1024,"
              "\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-5,\"attention_bias\":true,"
              "\"rope_parameters\":{\"rope_theta\":500000.0,\"rope_type\":\"llama3\",\"factor\":8,"
              "\"low_freq_factor\":1,\"high_freq_factor\":4,"
              "\"original_max_position_embeddings\":8192}}",
                &c, &info);
        CHECK(c.arch == BK_ARCH_LLAMA && c.head_dim == 64 && c.n_kv_heads == 1, "llama dims");
        CHECK(c.rope.type == BK_ROPE_LLAMA3 && c.rope.theta == 500000.0f && c.rope.factor == 8 &&
                        c.rope.low_freq_factor == 1 && c.rope.high_freq_factor == 4 &&
                        c.rope.original_max_pos == 8192,
                "llama3");
        CHECK(info.qkv_bias && info.o_bias && !info.mlp_bias, "llama biases");

        /* AWQ: version is case-insensitive; modules_to_not_convert kept. */
        parse("{" BASE ",\"quantization_config\":{\"quant_method\":\"awq\",\"bits\":4,"
              "\"group_size\":64,\"zero_point\":true,\"version\":\"GEMM\","
              "\"modules_to_not_convert\":[\"mlp.down_proj\",\"visual\"]}}",
                &c, &info);
        CHECK(info.group_size == 64 && !strcmp(info.quant, "awq-int4 g64"), "awq");
        CHECK(info.n_not_convert == 2 && !strcmp(info.not_convert[0], "mlp.down_proj") &&
                        !strcmp(info.not_convert[1], "visual"),
                "modules_to_not_convert");

        /* quant_config.json next to a config.json without quantization_config. */
        char dir[] = "/tmp/dsd-test-config-XXXXXX", path[4096];
        DsError err = {};
        FILE *f;
        CHECK(mkdtemp(dir), "mkdtemp");
        snprintf(path, sizeof(path), "%s/config.json", dir);
        CHECK((f = fopen(path, "w")) && fputs("{" BASE "}", f) >= 0 && fclose(f) == 0, "write");
        snprintf(path, sizeof(path), "%s/quant_config.json", dir);
        CHECK((f = fopen(path, "w")) &&
                        fputs("{\"zero_point\":true,\"q_group_size\":128,\"w_bit\":4,"
                              "\"version\":\"GEMM\"}",
                                f) >= 0 &&
                        fclose(f) == 0,
                "write");
        int r = model_config_load(dir, &c, &info, &err);
        CHECK(r == 0, "%s", err.msg);
        CHECK(info.group_size == 128 && !strcmp(info.quant, "awq-int4 g128"), "legacy awq");
        unlink(path);
        snprintf(path, sizeof(path), "%s/config.json", dir);
        unlink(path);
        rmdir(dir);

        printf("config defaults, rope forms, AWQ and quant_config.json parse as expected\n");
        return 0;
}
