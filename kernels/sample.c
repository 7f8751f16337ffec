/* SPDX-License-Identifier: MIT */
/* One sampling decision from a row of float32 logits, shared by every backend. Pure C,
 * no allocation, no global state: the result depends only on the logits, the request's
 * parameters and history, its seed and its draw index, never on the rest of the batch.
 * The CUDA backend makes the same decision on the device (kernels/cuda/cuda_sample.cu)
 * through the same arithmetic (sample_math.h) and the same random bits (philox.h).
 *
 * Candidates are ordered by (logit descending, id ascending), a total order, so every
 * tie is broken towards the lowest id and the outcome does not depend on a sort's
 * stability. Top-k and top-p cut that order; the draw then walks the kept ids in
 * ascending id order, which a device can do without sorting. */
#include <assert.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

/* sample_math.h's arithmetic must round each operation on its own, as the device does. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "backend.h"
#include "philox.h"
#include "sample_math.h"

/* ---------------------------------------------------------------------------------------
 * Ordering candidates: a binary heap keyed on val[], usable as a bounded top-k selector
 * and as an in-place heapsort. */

/* True when id a ranks before id b: larger value first, lower id on a tie. */
static bool ranks_before(const float *val, int32_t a, int32_t b)
{
        return val[a] > val[b] || (val[a] == val[b] && a < b);
}

/* Restores the heap below i in which every parent ranks *after* its children, so the
 * root is the worst-ranked candidate of heap[0..n). */
static void sift_down(const float *val, int32_t *heap, uint32_t n, uint32_t i)
{
        for (;;) {
                uint32_t worst = i, l = 2 * i + 1, r = 2 * i + 2;

                if (l < n && ranks_before(val, heap[worst], heap[l]))
                        worst = l;
                if (r < n && ranks_before(val, heap[worst], heap[r]))
                        worst = r;
                if (worst == i)
                        return;
                int32_t t = heap[i];
                heap[i] = heap[worst];
                heap[worst] = t;
                i = worst;
        }
}

static void heapify(const float *val, int32_t *heap, uint32_t n)
{
        for (uint32_t i = n / 2; i-- > 0;)
                sift_down(val, heap, n, i);
}

/* Sorts ids[0..n) best first. */
static void sort_best_first(const float *val, int32_t *ids, uint32_t n)
{
        heapify(val, ids, n);
        for (uint32_t end = n; end > 1; end--) {
                /* The root is the worst of ids[0..end): it goes to the back. */
                int32_t t = ids[0];
                ids[0] = ids[end - 1];
                ids[end - 1] = t;
                sift_down(val, ids, end - 1, 0);
        }
}

/* Keeps the k best of ids[0..n) in ids[0..k), sorted best first. Requires 0 < k <= n. */
static void select_top_k(const float *val, int32_t *ids, uint32_t n, uint32_t k)
{
        heapify(val, ids, k);
        for (uint32_t i = k; i < n; i++)
                if (ranks_before(val, ids[i], ids[0])) {
                        ids[0] = ids[i];
                        sift_down(val, ids, k, 0);
                }
        sort_best_first(val, ids, k);
}

/* ---------------------------------------------------------------------------------------
 * The pipeline: penalties, greedy or (top-k, temperature, softmax, top-p, min-p, draw). */

/* val[0..vocab) holds the logits. Uses count[] as scratch and leaves it all zero for the
 * ids in history. */
static void apply_penalties(float *val, uint32_t vocab, const BkSampling *s, const int32_t *history,
        uint32_t n_history, int32_t *count)
{
        /* Count occurrences, touching only the history's ids. */
        for (uint32_t i = 0; i < n_history; i++)
                if (history[i] >= 0 && (uint32_t) history[i] < vocab)
                        count[history[i]] = 0;
        for (uint32_t i = 0; i < n_history; i++)
                if (history[i] >= 0 && (uint32_t) history[i] < vocab)
                        count[history[i]]++;

        /* Each distinct id once, at its first occurrence; clearing its count marks it done. */
        for (uint32_t i = 0; i < n_history; i++) {
                int32_t id = history[i];
                if (id < 0 || (uint32_t) id >= vocab || count[id] == 0)
                        continue;
                val[id] = sm_penalize(val[id], (uint32_t) count[id], s->repetition_penalty,
                        s->presence_penalty, s->frequency_penalty);
                count[id] = 0;
        }
}

static int32_t argmax(const float *val, uint32_t vocab)
{
        int32_t best = 0;

        for (uint32_t i = 1; i < vocab; i++)
                if (val[i] > val[best])
                        best = (int32_t) i;
        return best;
}

static int cmp_id(const void *a, const void *b)
{
        int32_t x = *(const int32_t *) a, y = *(const int32_t *) b;
        return (x > y) - (x < y);
}

int32_t bk_sample(const float *logits, uint32_t vocab, const BkSampling *s, const int32_t *history,
        uint32_t n_history, uint64_t draw, float *scratch_f, int32_t *scratch_i)
{
        float *val = scratch_f;   /* (vocab) penalized logits, indexed by id */
        int32_t *ids = scratch_i; /* (vocab) the candidates still in play */
        float temp = s->temperature;
        uint32_t n = 0;
        bool by_id = true; /* ids[] ascending; else best first */

        assert(logits && s && vocab > 0 && vocab <= SM_VOCAB_MAX && scratch_f && scratch_i);
        assert(history || n_history == 0);

        for (uint32_t i = 0; i < vocab; i++)
                val[i] = logits[i];

        /* penalties */
        apply_penalties(val, vocab, s, history, n_history, ids);

        /* greedy, and rows no weight can be computed for (an infinite largest logit) */
        int32_t best = argmax(val, vocab);
        float max = val[best];
        if (temp <= 0.0f || !isfinite(max))
                return best;

        /* temperature: the candidates of nonzero weight (the likeliest weighs SM_ONE) */
        for (uint32_t i = 0; i < vocab; i++)
                if (sm_weight(val[i], max, temp) > 0)
                        ids[n++] = (int32_t) i;

        /* top-k among them */
        if (s->top_k > 0 && s->top_k < n) {
                select_top_k(val, ids, n, s->top_k);
                n = s->top_k;
                by_id = false;
        }

        /* top-p: the smallest best-first prefix whose weight reaches top_p of the total */
        if (s->top_p > 0.0f && s->top_p < 1.0f && n > 1) {
                uint64_t total = 0, cum = 0;
                for (uint32_t j = 0; j < n; j++)
                        total += sm_weight(val[ids[j]], max, temp);
                uint64_t need = sm_top_p_need(s->top_p, total);
                if (by_id) {
                        /* The candidates lighter than c weigh less than total - need
                         * together, so the others reach need, and so does everything at
                         * or above the least logit among them: the prefix lies there
                         * (llama2.c's sample_topp cutoff, taken to logits so that it holds
                         * whether or not weights fall with the logit). */
                        uint64_t c = (total - need) / (n - 1);
                        float least = max;
                        for (uint32_t j = 0; j < n; j++)
                                if (sm_weight(val[ids[j]], max, temp) >= c)
                                        least = fminf(least, val[ids[j]]);
                        uint32_t kept = 0;
                        for (uint32_t j = 0; j < n; j++)
                                if (val[ids[j]] >= least)
                                        ids[kept++] = ids[j];
                        n = kept;
                        sort_best_first(val, ids, n);
                }
                by_id = false;
                uint32_t keep = n;
                for (uint32_t j = 0; j < n; j++) {
                        cum += sm_weight(val[ids[j]], max, temp);
                        if (cum >= need) {
                                keep = j + 1;
                                break;
                        }
                }
                n = keep;
        }

        /* min-p: drop candidates less likely than min_p times the likeliest */
        if (s->min_p > 0.0f) {
                double floor_w = sm_min_p_floor(s->min_p);
                uint32_t kept = 0;
                for (uint32_t j = 0; j < n; j++)
                        if ((double) sm_weight(val[ids[j]], max, temp) >= floor_w)
                                ids[kept++] = ids[j];
                n = kept;
        }

        /* the draw: inverse CDF over the kept ids in ascending id order */
        if (!by_id)
                qsort(ids, n, sizeof(*ids), cmp_id);
        uint64_t total = 0, cum = 0;
        for (uint32_t j = 0; j < n; j++)
                total += sm_weight(val[ids[j]], max, temp);
        uint64_t target = sm_target(philox_draw(s->seed, draw), total);
        for (uint32_t j = 0; j < n; j++) {
                cum += sm_weight(val[ids[j]], max, temp);
                if (cum > target)
                        return ids[j];
        }
        return best; /* unreachable with exact sums: the likeliest is always kept */
}
