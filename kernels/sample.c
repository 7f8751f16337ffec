/* SPDX-License-Identifier: MIT */
/* One sampling decision from a row of float32 logits, shared by every backend. Pure C,
 * no allocation, no global state: the result depends only on the logits, the request's
 * parameters and history, its seed and its draw index, never on the rest of the batch.
 *
 * Candidates are ordered by (logit descending, id ascending), a total order, so every
 * tie is broken towards the lowest id and the outcome does not depend on a sort's
 * stability. */
#include <assert.h>
#include <math.h>
#include <stdbool.h>

#include "backend.h"

/* ---------------------------------------------------------------------------------------
 * Counter-based random numbers: splitmix64's finalizer applied to (seed, draw). */

static uint64_t mix64(uint64_t z)
{
        z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
        return z ^ (z >> 31);
}

/* The draw-th number of the request seeded with seed, uniform in [0, 1). */
static double sample_uniform(uint64_t seed, uint64_t draw)
{
        const uint64_t golden_gamma = UINT64_C(0x9e3779b97f4a7c15);
        uint64_t z = mix64(seed + golden_gamma) + (draw + 1) * golden_gamma;

        return (double) (mix64(z) >> 11) * 0x1.0p-53;
}

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
                if (s->repetition_penalty > 0.0f && s->repetition_penalty != 1.0f)
                        val[id] = val[id] > 0.0f ? val[id] / s->repetition_penalty
                                                 : val[id] * s->repetition_penalty;
                val[id] -= s->presence_penalty;
                val[id] -= s->frequency_penalty * (float) count[id];
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

int32_t bk_sample(const float *logits, uint32_t vocab, const BkSampling *s, const int32_t *history,
        uint32_t n_history, uint64_t draw, float *scratch_f, int32_t *scratch_i)
{
        float *val = scratch_f;   /* (vocab) logits, then probabilities, indexed by id */
        int32_t *ids = scratch_i; /* (vocab) the candidates still in play */
        uint32_t n = vocab;
        bool sorted = false;

        assert(logits && s && vocab > 0 && scratch_f && scratch_i);
        assert(history || n_history == 0);

        for (uint32_t i = 0; i < vocab; i++)
                val[i] = logits[i];

        /* penalties */
        apply_penalties(val, vocab, s, history, n_history, ids);

        /* greedy */
        if (s->temperature <= 0.0f)
                return argmax(val, vocab);

        for (uint32_t i = 0; i < vocab; i++)
                ids[i] = (int32_t) i;

        /* top-k */
        if (s->top_k > 0 && s->top_k < n) {
                select_top_k(val, ids, n, s->top_k);
                n = s->top_k;
                sorted = true;
        }

        /* temperature and softmax */
        float max = val[ids[0]];
        for (uint32_t j = 1; j < n; j++)
                max = fmaxf(max, val[ids[j]]);
        double sum = 0.0;
        for (uint32_t j = 0; j < n; j++) {
                float p = expf((val[ids[j]] - max) / s->temperature);
                val[ids[j]] = p;
                sum += p;
        }
        for (uint32_t j = 0; j < n; j++)
                val[ids[j]] = (float) (val[ids[j]] / sum);

        /* top-p: the smallest best-first prefix whose mass reaches top_p */
        if (s->top_p > 0.0f && s->top_p < 1.0f && n > 1) {
                /* A candidate below (1 - top_p) / (n - 1) can never be in the prefix: all
                 * of them together weigh less than 1 - top_p (llama2.c's sample_topp). The
                 * likeliest one, of probability 1 / sum, is always kept. */
                if (!sorted) {
                        float cutoff =
                                fminf((1.0f - s->top_p) / (float) (n - 1), (float) (1.0 / sum));
                        uint32_t kept = 0;
                        for (uint32_t j = 0; j < n; j++)
                                if (val[ids[j]] >= cutoff)
                                        ids[kept++] = ids[j];
                        n = kept;
                        sort_best_first(val, ids, n);
                        sorted = true;
                }
                double cum = 0.0;
                uint32_t keep = n;
                for (uint32_t j = 0; j < n; j++) {
                        cum += val[ids[j]];
                        if (cum >= s->top_p) {
                                keep = j + 1;
                                break;
                        }
                }
                n = keep;
        }

        /* min-p: drop candidates less likely than min_p times the likeliest */
        if (s->min_p > 0.0f) {
                float pmax = 0.0f;
                for (uint32_t j = 0; j < n; j++)
                        pmax = fmaxf(pmax, val[ids[j]]);
                float floor_p = s->min_p * pmax;
                uint32_t kept = 0;
                for (uint32_t j = 0; j < n; j++)
                        if (val[ids[j]] >= floor_p)
                                ids[kept++] = ids[j];
                n = kept;
        }

        /* renormalize and draw */
        double total = 0.0;
        for (uint32_t j = 0; j < n; j++)
                total += val[ids[j]];
        double target = sample_uniform(s->seed, draw) * total;
        double cum = 0.0;
        for (uint32_t j = 0; j < n; j++) {
                cum += val[ids[j]];
                if (target < cum)
                        return ids[j];
        }
        return ids[n - 1]; /* rounding left target at the very top */
}
