/* SPDX-License-Identifier: MIT */
/* Running every kind of step a request will take once, on sequences of its own, before
 * the daemon serves: a device backend pays for a kernel's, a library's and a decode
 * graph's first use when it happens (the CUDA runtime loads modules lazily, cuBLAS sets
 * itself up on its first call, a decode bucket's graph is captured on its first step).
 * Unwarmed, the first of a 7B model's requests after a start waited 93 ms for its first
 * token, where later ones waited 5.5; warmed up, 18 (docs/PERF.md, twenty-ninth
 * session). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

#define WARM_CHAINED 2  /* chained steps after each first step: both staging pairs */
#define WARM_SHORT   32 /* the short prompt's tokens */

typedef struct WarmUp {
        Engine *e;
        uint32_t n;       /* sequences */
        uint32_t *blocks; /* the first sequence's, then each other's */
        uint32_t first;   /* the first sequence's blocks: its prompt and decode steps */
        uint32_t other;   /* another's: its decode steps from position 0 */
        uint32_t *pos;    /* each sequence's next position */
        int32_t *tokens;  /* the prompt's ids, and each decode token */
        int32_t *ids;     /* (n) a step's sampled ids */
        BkSeq *seqs;      /* (n) */
} WarmUp;

static void warm_seq(WarmUp *w, uint32_t i, uint32_t n_tokens, bool chained)
{
        w->seqs[i] = (BkSeq){
                .tokens = w->tokens,
                .n_tokens = n_tokens,
                .pos = w->pos[i],
                .blocks = w->blocks + (i == 0 ? 0 : w->first + (i - 1) * w->other),
                .n_blocks = i == 0 ? w->first : w->other,
                .sample = true,
                .sampling = {.repetition_penalty = 1.0f, .top_p = 1.0f},
                .chained = chained,
                .prev = i,
        };
        w->pos[i] += n_tokens;
}

/* Steps of the first k sequences as the scheduler runs decoding: one submitted, then
 * chained ones, each submitted before the one before it is collected. */
static int warm_decode(WarmUp *w, uint32_t k, DsError *err)
{
        const BackendOps *ops = w->e->ops;
        uint32_t out = 0; /* steps submitted and not collected */
        int r = 0;

        for (uint32_t s = 0; r == 0 && s <= WARM_CHAINED; s++) {
                for (uint32_t i = 0; i < k; i++)
                        warm_seq(w, i, 1, s > 0);
                r = ops->submit(w->e->be, w->seqs, k, err);
                if (r == 0)
                        out++;
                if (r == 0 && out == 2) {
                        r = ops->collect(w->e->be, w->ids, k, err);
                        out--;
                }
        }
        /* what is still outstanding, also after a failure (its error is the first one) */
        for (DsError spare = {}; out > 0; out--) {
                int c = ops->collect(w->e->be, w->ids, k, r < 0 ? &spare : err);
                if (r == 0)
                        r = c;
        }
        return r;
}

int engine_warm_up(Engine *e, uint32_t max_seqs, uint32_t prefill_tokens, uint32_t *ret_prompt,
        uint32_t *ret_seqs, DsError *err)
{
        const uint32_t decode_steps = 1 + WARM_CHAINED;
        uint32_t bt = e->block_tokens, vocab = e->model->bk.cfg.vocab_sample;
        WarmUp w = {.e = e};
        int r;

        /* the library's routines for every step size, before the prompt is fitted to the
         * free blocks: a step's rows are at most its token budget */
        if (e->ops->warm && (r = e->ops->warm(e->be, prefill_tokens, err)) < 0) {
                ds_error_prefix(err, "warm-up");
                return r;
        }
        /* the prompt within the context and the free blocks, its decode steps after it */
        uint64_t most =
                MIN((uint64_t) e->model->bk.cfg.max_positions, (uint64_t) e->kv.n_free * bt);
        prefill_tokens = (uint32_t) MIN(
                (uint64_t) prefill_tokens, most > decode_steps ? most - decode_steps : 0);
        if (prefill_tokens == 0 || vocab == 0 || max_seqs == 0)
                return ds_error(err, -ENOSPC,
                        "warm-up: %u free KV blocks of %u positions and a context of %u "
                        "positions leave no room for a prompt and %u decode steps",
                        e->kv.n_free, bt, e->model->bk.cfg.max_positions, decode_steps);
        w.first = (prefill_tokens + decode_steps + bt - 1) / bt;
        w.other = (decode_steps + bt - 1) / bt;
        w.n = MIN(max_seqs, 1 + (e->kv.n_free - w.first) / w.other);
        uint32_t n_blocks = w.first + (w.n - 1) * w.other;
        w.blocks = calloc(n_blocks, sizeof(*w.blocks));
        w.pos = calloc(w.n, sizeof(*w.pos));
        w.tokens = calloc(prefill_tokens, sizeof(*w.tokens));
        w.ids = calloc(w.n, sizeof(*w.ids));
        w.seqs = calloc(w.n, sizeof(*w.seqs));
        if (!w.blocks || !w.pos || !w.tokens || !w.ids || !w.seqs) {
                r = ds_error(err, -ENOMEM, "warm-up: out of memory");
                goto out;
        }
        r = kv_pool_alloc(&e->kv, n_blocks, w.blocks);
        if (r < 0) {
                ds_error(err, r, "warm-up: no KV blocks");
                goto out;
        }
        for (uint32_t i = 0; i < prefill_tokens; i++)
                w.tokens[i] = (int32_t) (i % vocab);

        /* a short prompt and a long one (the kernels and library routines differ with the
         * rows), then decode steps of 1, 2, 4 .. sequences: the backend's buckets */
        uint32_t lens[2] = {MIN(WARM_SHORT, prefill_tokens), prefill_tokens};
        for (int i = 0; r == 0 && i < 2; i++) {
                w.pos[0] = 0;
                warm_seq(&w, 0, lens[i], false);
                r = e->ops->step(e->be, w.seqs, 1, w.ids, err);
        }
        for (uint32_t k = 1; r == 0; k = MIN(2 * k, w.n)) {
                for (uint32_t i = 0; i < k; i++)
                        w.pos[i] = i == 0 ? prefill_tokens : 0;
                r = warm_decode(&w, k, err);
                if (k == w.n)
                        break;
        }
        kv_pool_release(&e->kv, w.blocks, n_blocks);
        if (r == 0 && ret_prompt)
                *ret_prompt = prefill_tokens;
        if (r == 0 && ret_seqs)
                *ret_seqs = w.n;
out:
        free(w.blocks);
        free(w.pos);
        free(w.tokens);
        free(w.ids);
        free(w.seqs);
        return r;
}
