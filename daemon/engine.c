/* SPDX-License-Identifier: MIT */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "log.h"

/* Without a configured budget the cache holds one sequence of this many positions (or
 * the model's whole context if shorter): enough for --generate and the tests without
 * reserving gigabytes for a 128k-context model on the CPU. */
#define ENGINE_DEFAULT_KV_POSITIONS 8192u
/* A host KV cache lives in host memory next to everything else, so its share is of
 * MemAvailable capped at this, not of all of it. */
#define ENGINE_HOST_KV_MAX (4ull << 30)

uint64_t now_usec(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

const char *finish_reason_name(FinishReason r)
{
        static const char *const names[_FINISH_MAX] = {
                [FINISH_LENGTH] = "length",
                [FINISH_EOS] = "eos",
                [FINISH_STOP] = "stop",
                [FINISH_CANCELLED] = "cancelled",
        };
        return r >= 0 && r < _FINISH_MAX ? names[r] : "unknown";
}

static void load_progress(void *userdata, uint32_t done, uint32_t n)
{
        const char *dir = userdata;

        fprintf(stderr, "\rloading %s: %u/%u layers", dir, done, n);
        if (done == n)
                fputc('\n', stderr);
}

static void add_eos(Engine *e, int32_t id)
{
        if (id < 0 || engine_is_eos(e, id) || e->n_eos >= ELEMENTSOF(e->eos_ids))
                return;
        e->eos_ids[e->n_eos++] = id;
}

void engine_memory(const Engine *e, uint64_t *ret_used, uint64_t *ret_total)
{
        *ret_used = *ret_total = 0;
        if (e && e->ops->mem_info && e->ops->mem_info(e->be, ret_used, ret_total) < 0)
                *ret_used = *ret_total = 0;
}

static uint64_t mem_available(void)
{
        FILE *f = fopen("/proc/meminfo", "re");
        char line[256];
        unsigned long long kb;
        uint64_t ret = ENGINE_HOST_KV_MAX;

        while (f && fgets(line, sizeof(line), f))
                if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                        ret = (uint64_t) kb * 1024;
                        break;
                }
        if (f)
                fclose(f);
        return ret;
}

/* The memory a KV cache may take its share of: a device backend's free memory (its own,
 * next to little else), or the host's, where it lives beside everything else, capped. */
static uint64_t kv_free_memory(const Engine *e)
{
        uint64_t used, total;

        if (e->ops->mem_info && e->ops->mem_info(e->be, &used, &total) == 0 && total > used)
                return total - used;
        return MIN(mem_available(), ENGINE_HOST_KV_MAX);
}

bool engine_is_eos(const Engine *e, int32_t id)
{
        for (uint32_t i = 0; i < e->n_eos; i++)
                if (e->eos_ids[i] == id)
                        return true;
        return false;
}

int engine_open(const char *dir, const EngineOptions *opt, Engine **ret, DsError *err)
{
        _cleanup_(engine_freep) Engine *e = NULL;
        EngineOptions defaults = {};
        char path[PATH_MAX];
        bool unknown_template = false;
        uint64_t t0 = now_usec();
        int r;

        if (!opt)
                opt = &defaults;
        e = calloc(1, sizeof(*e));
        if (!e)
                return ds_error(err, -ENOMEM, "out of memory");

        ModelOptions mo = {
                .quantize_int4 = opt->quantize_int4,
                .lm_head_int8 = opt->lm_head_int8,
                .progress = opt->progress  ? opt->progress
                            : opt->verbose ? load_progress
                                           : NULL,
                .userdata = opt->progress ? opt->progress_userdata : (void *) dir,
        };
        r = model_load(dir, &mo, &e->model, err);
        if (r < 0)
                return r;

        snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
        r = tokenizer_load(path, &e->tok, err);
        if (r < 0)
                return r;
        snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
        r = tokenizer_load_config(e->tok, path, &unknown_template, err);
        if (r < 0)
                return r;
        if (unknown_template)
                log_warning("%s: chat template of an unknown family; --chat falls back to raw "
                            "completion",
                        path);

        /* Ids past the tokenizer's vocabulary are padding rows of the embedding. */
        BkConfig *cfg = &e->model->bk.cfg;
        uint32_t n_vocab = tokenizer_n_vocab(e->tok);
        if (n_vocab > cfg->vocab_size)
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: tokenizer has %u ids but the model's vocab_size is %u", dir, n_vocab,
                        cfg->vocab_size);
        cfg->vocab_sample = n_vocab;

        for (uint32_t i = 0; i < e->model->info.n_eos; i++)
                add_eos(e, e->model->info.eos_ids[i]);
        add_eos(e, tokenizer_eos(e->tok));

        e->ops = backend_find(opt->backend ? opt->backend : "auto");
        if (!e->ops)
                return ds_error(err, -DS_ERR_UNSUPPORTED,
                        "backend '%s' is not available in this build or on this machine",
                        opt->backend);
        BkOptions bo = {.threads = opt->threads, .device = opt->device};
        r = e->ops->create(&bo, &e->be, err);
        if (r < 0)
                return r;
        r = e->ops->load(e->be, &e->model->bk, err);
        /* "auto" means the best backend that runs this model: a device backend that
         * refuses the architecture leaves the CPU reference to run it. */
        bool automatic = !opt->backend || !strcmp(opt->backend, "auto");
        if (r == -DS_ERR_UNSUPPORTED && automatic && e->ops != &backend_cpu_ops) {
                log_warning("%s: %s; running on the CPU backend instead", dir,
                        err ? err->msg : "not supported");
                e->ops->free(e->be);
                e->be = NULL;
                e->ops = &backend_cpu_ops;
                r = e->ops->create(&bo, &e->be, err);
                if (r < 0)
                        return r;
                r = e->ops->load(e->be, &e->model->bk, err);
        }
        if (r < 0)
                return r;

        e->block_tokens = opt->kv_block_tokens ? opt->kv_block_tokens : 16;
        uint64_t kv_bytes = opt->kv_bytes;
        if (!kv_bytes && opt->kv_fraction > 0)
                kv_bytes = (uint64_t) (opt->kv_fraction * (double) kv_free_memory(e));
        if (!kv_bytes) {
                uint64_t positions = MIN(cfg->max_positions, ENGINE_DEFAULT_KV_POSITIONS);
                uint64_t blocks = (positions + e->block_tokens - 1) / e->block_tokens;
                kv_bytes = blocks * e->block_tokens * e->ops->kv_bytes_per_token(e->be);
        }
        int64_t n_blocks = e->ops->kv_init(e->be, e->block_tokens, kv_bytes, err);
        if (n_blocks < 0)
                return (int) n_blocks;
        if (n_blocks > UINT32_MAX)
                n_blocks = UINT32_MAX;
        r = kv_pool_init(&e->kv, (uint32_t) n_blocks);
        if (r < 0)
                return ds_error(err, r, "out of memory for the KV block pool");

        e->load_usec = now_usec() - t0;
        *ret = TAKE_PTR(e);
        return 0;
}

Engine *engine_free(Engine *e)
{
        if (!e)
                return NULL;
        if (e->be)
                e->ops->free(e->be);
        kv_pool_done(&e->kv);
        tokenizer_free(e->tok);
        model_free(e->model);
        free(e);
        return NULL;
}
