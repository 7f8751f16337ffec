/* SPDX-License-Identifier: MIT */
/* One request from text to finished output on a fresh sequence: template, tokenize,
 * prefill in chunks, decode token by token, detokenize incrementally, stop. */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "holdback.h"
#include "log.h"

/* Prefill tokens per step: bounds the backend's scratch, as the scheduler's budget will. */
#define PREFILL_CHUNK 512u

int engine_encode_prompt(
        Engine *e, const char *text, bool chat, int32_t **ret_ids, size_t *ret_n, DsError *err)
{
        _cleanup_free_ char *rendered = NULL;
        _cleanup_free_ int32_t *ids = NULL;
        bool templated = false;
        size_t n = 0;
        int r;

        if (chat) {
                if (tokenizer_chat_family(e->tok) == CHAT_NONE)
                        log_warning("%s: the tokenizer has no known chat template; running a raw "
                                    "completion",
                                e->model->dir);
                else {
                        ChatMessage msg = {.role = "user", .content = text};
                        r = chat_render(e->tok, &msg, 1, &rendered, err);
                        if (r < 0)
                                return r;
                        text = rendered;
                        templated = true;
                }
        }
        r = tokenizer_encode(e->tok, text, strlen(text), &ids, &n, err);
        if (r < 0)
                return r;

        /* A chat template writes its own BOS. */
        int32_t bos = tokenizer_bos(e->tok);
        if (!templated && tokenizer_add_bos(e->tok) && bos >= 0) {
                int32_t *with = malloc((n + 1) * sizeof(*with));
                if (!with)
                        return ds_error(err, -ENOMEM, "out of memory");
                with[0] = bos;
                if (n)
                        memcpy(with + 1, ids, n * sizeof(*ids));
                free(ids);
                ids = with;
                n++;
        }
        if (n == 0)
                return ds_error(err, -EINVAL,
                        "the prompt is empty and the tokenizer adds no BOS token to start from");
        *ret_ids = TAKE_PTR(ids);
        *ret_n = n;
        return 0;
}

int engine_generate(Engine *e, const char *text, const GenParams *gp, GenEmit emit, void *userdata,
        GenResult *ret, DsError *err)
{
        _cleanup_free_ int32_t *prompt = NULL, *history = NULL;
        _cleanup_free_ uint32_t *blocks = NULL;
        _cleanup_(tok_stream_freep) TokStream *ts = NULL;
        const BkConfig *cfg = &e->model->bk.cfg;
        GenResult res = {};
        _cleanup_(holdback_done) Holdback pend = {};
        char piece[TOK_STREAM_OUT_MAX];
        size_t n_prompt = 0;
        int32_t next = -1;
        uint64_t t0;
        int r;

        r = engine_encode_prompt(e, text, gp->chat, &prompt, &n_prompt, err);
        if (r < 0)
                return r;

        uint64_t capacity =
                MIN((uint64_t) cfg->max_positions, (uint64_t) e->kv.n_total * e->block_tokens);
        if (n_prompt >= capacity)
                return ds_error(err, -DS_ERR_CONTEXT_FULL,
                        "the prompt has %zu tokens, more than the context of %llu allows", n_prompt,
                        (unsigned long long) capacity);
        uint32_t max_new = (uint32_t) MIN((uint64_t) gp->max_tokens, capacity - n_prompt);
        uint32_t total = (uint32_t) n_prompt + max_new;
        uint32_t n_blocks = (total + e->block_tokens - 1) / e->block_tokens;

        blocks = calloc(n_blocks ? n_blocks : 1, sizeof(*blocks));
        history = calloc(total ? total : 1, sizeof(*history));
        if (!blocks || !history)
                return ds_error(err, -ENOMEM, "out of memory");
        r = kv_pool_alloc(&e->kv, n_blocks, blocks);
        if (r < 0)
                return ds_error(err, r, "the KV cache has %u free blocks, the request needs %u",
                        e->kv.n_free, n_blocks);
        memcpy(history, prompt, n_prompt * sizeof(*prompt));

        r = tok_stream_new(e->tok, &ts);
        if (r < 0) {
                ds_error(err, r, "out of memory");
                goto out;
        }
        r = tok_stream_prime(ts, prompt, n_prompt);
        if (r < 0) {
                ds_error(err, r, "cannot decode the prompt's tokens");
                goto out;
        }

        /* Prefill, in chunks; the last chunk samples the first new token. */
        t0 = now_usec();
        for (uint32_t pos = 0; pos < n_prompt; pos += PREFILL_CHUNK) {
                BkSeq s = {
                        .tokens = prompt + pos,
                        .n_tokens = (uint32_t) MIN((size_t) PREFILL_CHUNK, n_prompt - pos),
                        .pos = pos,
                        .blocks = blocks,
                        .n_blocks = n_blocks,
                        .sampling = gp->sampling,
                        .history = history,
                        .n_history = (uint32_t) n_prompt,
                };
                s.sample = max_new > 0 && pos + s.n_tokens == n_prompt;
                r = e->ops->step(e->be, &s, 1, &next, err);
                if (r < 0)
                        goto out;
        }
        res.prefill_usec = now_usec() - t0;
        res.prompt_tokens = (uint32_t) n_prompt;
        res.finish = FINISH_LENGTH;

        /* Decode: each step feeds the token sampled by the previous one. */
        t0 = now_usec();
        for (uint32_t i = 0; i < max_new; i++) {
                if (engine_is_eos(e, next)) {
                        res.finish = FINISH_EOS;
                        break;
                }
                history[n_prompt + i] = next;
                res.generated_tokens++;
                int n = tok_stream_push(ts, next, piece);
                if (n < 0) {
                        r = ds_error(err, n, "cannot decode token %d", next);
                        goto out;
                }
                r = holdback_append(&pend, piece, (size_t) n);
                if (r < 0) {
                        ds_error(err, r, "out of memory");
                        goto out;
                }
                if (holdback_release(&pend, gp->stops, gp->n_stops, false, emit, userdata)) {
                        res.finish = FINISH_STOP;
                        break;
                }
                if (i + 1 == max_new)
                        break;
                BkSeq s = {
                        .n_tokens = 1,
                        .pos = (uint32_t) n_prompt + i,
                        .blocks = blocks,
                        .n_blocks = n_blocks,
                        .sample = true,
                        .sampling = gp->sampling,
                        .history = history,
                        .n_history = (uint32_t) n_prompt + i + 1,
                        .draw = i + 1,
                };
                int32_t token = next;
                s.tokens = &token;
                r = e->ops->step(e->be, &s, 1, &next, err);
                if (r < 0)
                        goto out;
        }
        if (res.finish != FINISH_STOP) {
                int n = tok_stream_flush(ts, piece);
                if (n > 0 && holdback_append(&pend, piece, (size_t) n) < 0) {
                        r = ds_error(err, -ENOMEM, "out of memory");
                        goto out;
                }
                if (holdback_release(&pend, gp->stops, gp->n_stops, true, emit, userdata))
                        res.finish = FINISH_STOP;
        }
        res.decode_usec = now_usec() - t0;
        if (ret)
                *ret = res;
        r = 0;
out:
        kv_pool_release(&e->kv, blocks, n_blocks);
        return r;
}
