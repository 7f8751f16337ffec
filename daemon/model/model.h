/* SPDX-License-Identifier: MIT */
/* A checkpoint directory turned into a BkModel: config.json parsed and validated,
 * safetensors mapped, every tensor found and shape-checked, linear layers described as
 * AWQ INT4 or dense, or quantized to INT4 at load when asked. */
#pragma once

#include <stdbool.h>

#include "backend.h"
#include "safetensors.h"
#include "error.h"

typedef struct ModelOptions {
        bool quantize_int4;  /* round-to-nearest INT4, group 128, for FP16/BF16/F32 linears */
        void (*progress)(void *userdata, uint32_t layers_done, uint32_t n_layers);
        void *userdata;
} ModelOptions;

typedef struct ModelInfo {
        char architecture[64];   /* as config.json names it */
        char quant[64];          /* "awq-int4 g128", "f16", "int4-at-load g128", ... */
        int32_t bos_id;          /* -1 when none */
        int32_t eos_ids[8];      /* config.json eos_token_id, int or list */
        uint32_t n_eos;
} ModelInfo;

typedef struct Model {
        BkModel bk;           /* what the backend consumes; pointers into the maps or owned */
        ModelInfo info;
        char *dir;
        StArchive *archive;
        void **owned;         /* buffers made at load (quantized, realigned) */
        size_t n_owned;
} Model;

/* Parses DIR/config.json into cfg and info without touching the weights. */
int model_config_load(const char *dir, BkConfig *ret_cfg, ModelInfo *ret_info, DsError *err);

int model_load(const char *dir, const ModelOptions *opt, Model **ret, DsError *err);
Model *model_free(Model *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(Model *, model_free);
