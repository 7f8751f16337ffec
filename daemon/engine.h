/* SPDX-License-Identifier: MIT */
/* A loaded model ready to run: checkpoint, tokenizer and a backend holding the weights,
 * plus the KV-cache block pool. The one-request generation path (dsd --generate) and the
 * tests drive it directly; the serving scheduler will drive the same parts. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "error.h"
#include "kv_pool.h"
#include "model.h"
#include "tokenizer.h"

typedef struct EngineOptions {
        const char *backend;      /* "cpu", "cuda" or "auto"; NULL means auto */
        bool quantize_int4;       /* quantize FP16/BF16 linears to INT4 at load */
        bool lm_head_int8;        /* quantize the lm_head to 8 bits at load (q8_pack.h) */
        uint32_t kv_block_tokens; /* positions per KV block; 0 means 16 */
        uint64_t kv_bytes;        /* KV cache budget; 0: kv_fraction's, else one full context */
        uint32_t threads;         /* CPU backend threads; 0 means one */
        const char *device;       /* backend-specific device ("0" for CUDA device 0); NULL */
        bool verbose;             /* progress lines on stderr while loading */
        /* Without kv_bytes, the KV cache takes this share of the free memory: a device
         * backend's (mem_info) once the weights are resident, else the host's MemAvailable
         * capped at 4 GiB. 0: one full context. */
        double kv_fraction;
        /* Called after each layer loads (the daemon's STATUS= lines); overrides verbose. */
        void (*progress)(void *userdata, uint32_t layers_done, uint32_t n_layers);
        void *progress_userdata;
} EngineOptions;

typedef struct Engine {
        Model *model;
        Tokenizer *tok;
        const BackendOps *ops;
        Backend *be;
        KvPool kv;
        uint32_t block_tokens;
        int32_t eos_ids[16]; /* config.json's eos ids and the tokenizer's, deduplicated */
        uint32_t n_eos;
        uint64_t load_usec;
} Engine;

int engine_open(const char *dir, const EngineOptions *opt, Engine **ret, DsError *err);
Engine *engine_free(Engine *e);
DEFINE_TRIVIAL_CLEANUP_FUNC(Engine *, engine_free);

bool engine_is_eos(const Engine *e, int32_t id);

/* Device memory in use and in all (bytes), both 0 for a host backend. */
void engine_memory(const Engine *e, uint64_t *ret_used, uint64_t *ret_total);

typedef enum FinishReason {
        FINISH_LENGTH, /* max tokens or the context limit */
        FINISH_EOS,
        FINISH_STOP,      /* a stop string */
        FINISH_CANCELLED, /* the client cancelled or went away (serving path only) */
        _FINISH_MAX,
} FinishReason;

const char *finish_reason_name(FinishReason r);

typedef struct GenParams {
        uint32_t max_tokens;
        BkSampling sampling;
        const char *const *stops; /* stop strings, not included in the output */
        uint32_t n_stops;
        bool chat; /* wrap the text as one user turn of the chat template */
} GenParams;

typedef struct GenResult {
        uint32_t prompt_tokens;
        uint32_t generated_tokens;
        FinishReason finish;
        uint64_t prefill_usec;
        uint64_t decode_usec;
} GenResult;

/* Called with each piece of output text as it becomes final (whole UTF-8 characters,
 * never part of a stop string). */
typedef void (*GenEmit)(void *userdata, const char *text, size_t len);

/* The prompt's token ids as engine_generate() feeds them: text wrapped as one user turn of
 * the chat template when chat is set (and the tokenizer knows one), else BOS (when the
 * tokenizer adds one) and the text. Never empty. The serving path uses it too, so both
 * paths see the same ids for the same text. */
int engine_encode_prompt(
        Engine *e, const char *text, bool chat, int32_t **ret_ids, size_t *ret_n, DsError *err);

/* Runs one request to completion on a fresh sequence. */
int engine_generate(Engine *e, const char *text, const GenParams *p, GenEmit emit, void *userdata,
        GenResult *ret, DsError *err);

uint64_t now_usec(void);

/* Warms a device backend up: its first use of kernels, libraries and decode graphs
 * happens here rather than in the first requests. Runs the backend's warm op, where it has
 * one, for steps of up to prefill_tokens rows (the step's token budget), then a 32-token
 * prompt and one of prefill_tokens (fewer where the context or the free KV blocks hold
 * fewer), then decode steps of 1, 2, 4 .. up to max_seqs sequences (as many as the free
 * blocks allow), each as the scheduler runs them (one step submitted, chained ones after
 * it), on KV blocks it takes from the pool and gives back. The outputs are thrown away; the
 * model's state is what it was. The long prompt's tokens and the most sequences run go to
 * ret_prompt and ret_seqs (either may be NULL). -ENOSPC where not one prompt token and its
 * decode steps fit. */
int engine_warm_up(Engine *e, uint32_t max_seqs, uint32_t prefill_tokens, uint32_t *ret_prompt,
        uint32_t *ret_seqs, DsError *err);
