/* SPDX-License-Identifier: MIT */
/* A checkpoint directory turned into a BkModel: config.json parsed and validated,
 * safetensors mapped, every tensor found and shape-checked, linear layers described as
 * AWQ INT4 or dense, or quantized to INT4 at load when asked (and the lm_head to 8 bits). */
#pragma once

#include <stdbool.h>

#include "backend.h"
#include "safetensors.h"
#include "error.h"

typedef struct ModelOptions {
        bool quantize_int4; /* round-to-nearest INT4, group 128, for FP16/BF16/F32 linears */
        /* the lm_head (the embedding's copy when tied) as 8-bit rows, q8_pack.h */
        bool lm_head_int8;
        void (*progress)(void *userdata, uint32_t layers_done, uint32_t n_layers);
        void *userdata;
} ModelOptions;

typedef struct ModelInfo {
        char architecture[64]; /* as config.json names it */
        /* "awq-int4 g128", "f16", "int4-at-load g128", ..., followed by ", lm_head int8 g128"
         * when the lm_head was quantized to 8 bits at load */
        char quant[64];
        int32_t bos_id;     /* -1 when none */
        int32_t eos_ids[8]; /* config.json eos_token_id, int or list */
        uint32_t n_eos;
        bool tie_embeddings; /* lm_head is the embedding (tie_word_embeddings) */
        bool qkv_bias;       /* q/k/v_proj have biases (Qwen2; Llama attention_bias) */
        bool o_bias;         /* o_proj has a bias (Llama attention_bias) */
        bool mlp_bias;       /* gate/up/down_proj have biases (Llama mlp_bias) */
        uint32_t group_size; /* AWQ group size of the checkpoint's linears; 0 when dense */
        /* quantization_config.modules_to_not_convert: a linear whose name contains one of
         * these is stored dense in an AWQ checkpoint. */
        char not_convert[16][64];
        uint32_t n_not_convert;
} ModelInfo;

typedef struct Model {
        BkModel bk; /* what the backend consumes; pointers into the maps or owned */
        ModelInfo info;
        char *dir;
        StArchive *archive;
        void **owned; /* buffers made at load (quantized, realigned) */
        size_t n_owned;
} Model;

/* Parses one config.json held in memory (the fuzzer's entry point); name is used only in
 * messages. Quantization comes from its quantization_config only. */
int model_config_parse(const char *name, const char *json, size_t len, BkConfig *ret_cfg,
        ModelInfo *ret_info, DsError *err);

/* Parses DIR/config.json into cfg and info without touching the weights; the quantization
 * comes from DIR/quant_config.json (the older AutoAWQ file) when config.json has none. */
int model_config_load(const char *dir, BkConfig *ret_cfg, ModelInfo *ret_info, DsError *err);

int model_load(const char *dir, const ModelOptions *opt, Model **ret, DsError *err);
Model *model_free(Model *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(Model *, model_free);
