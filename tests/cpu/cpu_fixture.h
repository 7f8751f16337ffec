/* SPDX-License-Identifier: MIT */
/* Helpers for the CPU backend's fixture tests: golden.json, golden_logits.f32, a loaded
 * model with a backend and a fresh KV cache, and one step of one sequence. */
#pragma once

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model.h"
#include "test_util.h"

#define FIX_BLOCK_TOKENS 16
#define FIX_MAX_BLOCKS   64

typedef struct Golden {
        int32_t *input_ids; /* (n_input) */
        uint32_t n_input;
        int32_t *prompt; /* (n_prompt) greedy_prompt_ids */
        uint32_t n_prompt;
        int32_t *new_ids; /* (n_new) greedy_new_ids */
        double *margins;  /* (n_new) greedy_top2_margins */
        uint32_t n_new;
        float *logits; /* (n_input, vocab) golden_logits.f32 */
} Golden;

static inline char *fix_read_file(const char *path, size_t *ret_len)
{
        FILE *f = fopen(path, "rb");
        CHECK(f, "cannot open %s", path);
        CHECK(fseek(f, 0, SEEK_END) == 0, "%s", path);
        long len = ftell(f);
        CHECK(len >= 0, "%s", path);
        rewind(f);
        char *buf = malloc((size_t) len + 1);
        CHECK(buf, "out of memory");
        CHECK(fread(buf, 1, (size_t) len, f) == (size_t) len, "short read of %s", path);
        buf[len] = 0;
        fclose(f);
        *ret_len = (size_t) len;
        return buf;
}

static inline int32_t *fix_int_array(const cJSON *root, const char *name, uint32_t *ret_n)
{
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, name);
        CHECK(cJSON_IsArray(a), "golden.json: no array '%s'", name);
        uint32_t n = (uint32_t) cJSON_GetArraySize(a);
        int32_t *v = calloc(n ? n : 1, sizeof(int32_t));
        CHECK(v, "out of memory");
        for (uint32_t i = 0; i < n; i++)
                v[i] = (int32_t) cJSON_GetArrayItem(a, (int) i)->valuedouble;
        *ret_n = n;
        return v;
}

/* Reads fixture dir's golden.json and golden_logits.f32 (vocab columns). */
static inline Golden fix_golden(const char *dir, uint32_t vocab)
{
        char path[4096];
        size_t len;
        Golden g = {0};

        snprintf(path, sizeof(path), "%s/golden.json", dir);
        char *text = fix_read_file(path, &len);
        cJSON *root = cJSON_Parse(text);
        CHECK(root, "%s: not JSON", path);
        g.input_ids = fix_int_array(root, "input_ids", &g.n_input);
        g.prompt = fix_int_array(root, "greedy_prompt_ids", &g.n_prompt);
        g.new_ids = fix_int_array(root, "greedy_new_ids", &g.n_new);
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "greedy_top2_margins");
        CHECK(cJSON_GetArraySize(m) == (int) g.n_new, "%s: margins", path);
        g.margins = calloc(g.n_new, sizeof(double));
        CHECK(g.margins, "out of memory");
        for (uint32_t i = 0; i < g.n_new; i++)
                g.margins[i] = cJSON_GetArrayItem(m, (int) i)->valuedouble;
        cJSON_Delete(root);
        free(text);

        snprintf(path, sizeof(path), "%s/golden_logits.f32", dir);
        g.logits = (float *) fix_read_file(path, &len);
        CHECK(len == (size_t) g.n_input * vocab * sizeof(float), "%s: %zu bytes, expected %zu",
                path, len, (size_t) g.n_input * vocab * sizeof(float));
        return g;
}

static inline void fix_golden_free(Golden *g)
{
        free(g->input_ids);
        free(g->prompt);
        free(g->new_ids);
        free(g->margins);
        free(g->logits);
}

typedef struct Fixture {
        Model *model;
        Backend *b;
        uint32_t vocab;
} Fixture;

/* Loads fixture dir with the options mo on a CPU backend of threads threads (0 means
 * one). */
static inline Fixture fix_open_with(const char *dir, uint32_t threads, const ModelOptions *mo)
{
        DsError err = {0};
        Fixture f = {0};

        CHECK(model_load(dir, mo, &f.model, &err) == 0, "model_load %s: %s", dir, err.msg);
        CHECK(backend_cpu_ops.create(&(BkOptions){.threads = threads}, &f.b, &err) == 0, "%s",
                err.msg);
        CHECK(backend_cpu_ops.load(f.b, &f.model->bk, &err) == 0, "%s", err.msg);
        f.vocab = f.model->bk.cfg.vocab_size;
        return f;
}

static inline Fixture fix_open_threads(const char *dir, uint32_t threads)
{
        return fix_open_with(dir, threads, &(ModelOptions){0});
}

static inline Fixture fix_open(const char *dir)
{
        return fix_open_threads(dir, 0);
}

/* Drops the cache and makes a fresh one of FIX_MAX_BLOCKS blocks. */
static inline void fix_kv_reset(Fixture *f)
{
        DsError err = {0};
        uint64_t bytes =
                backend_cpu_ops.kv_bytes_per_token(f->b) * FIX_BLOCK_TOKENS * FIX_MAX_BLOCKS;
        CHECK(backend_cpu_ops.kv_init(f->b, FIX_BLOCK_TOKENS, bytes, &err) == FIX_MAX_BLOCKS, "%s",
                err.msg);
}

static inline void fix_close(Fixture *f)
{
        backend_cpu_ops.free(f->b);
        model_free(f->model);
}

/* ‖a − b‖ / ‖b‖ over n floats, in double. */
static inline double fix_rel_err(const float *a, const float *b, size_t n)
{
        double d = 0, r = 0;
        for (size_t i = 0; i < n; i++) {
                d += ((double) a[i] - b[i]) * ((double) a[i] - b[i]);
                r += (double) b[i] * b[i];
        }
        return sqrt(d) / sqrt(r);
}

/* One step of one sequence using the identity block table: tokens at pos, logits out
 * (or NULL), greedy sample when sample; returns the sampled id or -1. */
static inline int32_t fix_step(
        Fixture *f, const int32_t *tokens, uint32_t n, uint32_t pos, float *logits, bool sample)
{
        static uint32_t blocks[FIX_MAX_BLOCKS];
        DsError err = {0};
        int32_t id;

        for (uint32_t i = 0; i < FIX_MAX_BLOCKS; i++)
                blocks[i] = i;
        BkSeq s = {
                .tokens = tokens,
                .n_tokens = n,
                .pos = pos,
                .blocks = blocks,
                .n_blocks = FIX_MAX_BLOCKS,
                .sample = sample,
                .sampling = {.temperature = 0, .repetition_penalty = 1},
                .logits = logits,
        };
        CHECK(backend_cpu_ops.step(f->b, &s, 1, &id, &err) == 0, "step: %s", err.msg);
        return id;
}
