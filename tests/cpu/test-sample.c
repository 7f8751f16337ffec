/* SPDX-License-Identifier: MIT */
/* bk_sample on hand-built logits: greedy and its tie rule, the candidate set each filter
 * keeps, the distribution it draws from, the (seed, draw) determinism, padding ids, and
 * the three penalties; Philox4x32-10 against Random123's known answers, the draw against
 * a direct computation from them, and the sampler's exponential against exp(). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "philox.h"
#include "sample_math.h"
#include "test_util.h"

#define VOCAB_MAX 256
#define DRAWS     20000

static float scratch_f[VOCAB_MAX];
static int32_t scratch_i[VOCAB_MAX];

static BkSampling plain(float temperature)
{
        return (BkSampling){.temperature = temperature, .repetition_penalty = 1.0f, .seed = 42};
}

static int32_t sample(const float *logits, uint32_t vocab, const BkSampling *s,
        const int32_t *history, uint32_t n_history, uint64_t draw)
{
        return bk_sample(logits, vocab, s, history, n_history, draw, scratch_f, scratch_i);
}

/* Draws DRAWS times; checks that only ids with want[id] > 0 appear and that their
 * frequencies are within 0.02 of want[] (probabilities summing to 1). */
static void check_distribution(const char *what, const float *logits, uint32_t vocab,
        const BkSampling *s, const double *want)
{
        uint32_t count[VOCAB_MAX] = {0};

        for (uint64_t d = 0; d < DRAWS; d++) {
                int32_t id = sample(logits, vocab, s, NULL, 0, d);
                CHECK(id >= 0 && (uint32_t) id < vocab, "%s: id %d", what, id);
                CHECK(want[id] > 0, "%s: id %d drawn, outside the allowed set", what, id);
                count[id]++;
        }
        for (uint32_t i = 0; i < vocab; i++) {
                double got = (double) count[i] / DRAWS;
                CHECK(fabs(got - want[i]) < 0.02, "%s: id %u drawn %.3f, expected %.3f", what, i,
                        got, want[i]);
        }
}

static void test_greedy(void)
{
        const float logits[] = {1, 3, 3, 2, -5};
        BkSampling s = plain(0);

        CHECK(sample(logits, 5, &s, NULL, 0, 0) == 1, "argmax with a tie takes the lowest id");
        /* Greedy ignores the seed and the draw. */
        s.seed = 7;
        CHECK(sample(logits, 5, &s, NULL, 0, 99) == 1, "greedy depends on the seed");
}

static void test_top_k_one_is_greedy(void)
{
        float logits[VOCAB_MAX];
        BkSampling g = plain(0), k1 = plain(1.5f);

        k1.top_k = 1;
        for (uint32_t trial = 0; trial < 50; trial++) {
                for (uint32_t i = 0; i < VOCAB_MAX; i++)
                        logits[i] = (float) ((i * 2654435761u + trial * 40503u) % 1000) / 100.0f;
                logits[trial] = logits[trial + 100]; /* a tie somewhere */
                int32_t want = sample(logits, VOCAB_MAX, &g, NULL, 0, 0);
                for (uint64_t d = 0; d < 20; d++) {
                        k1.seed = trial;
                        CHECK(sample(logits, VOCAB_MAX, &k1, NULL, 0, d) == want,
                                "top-k 1 differs from greedy (trial %u)", trial);
                }
        }
}

static void test_filters(void)
{
        /* Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1. */
        const float p[] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
        BkSampling s;

        s = plain(1);
        check_distribution("no filter", p, 4, &s, (const double[]){0.5, 0.3, 0.15, 0.05});

        s = plain(1);
        s.top_k = 2;
        check_distribution("top-k 2", p, 4, &s, (const double[]){0.625, 0.375, 0, 0});

        s = plain(1);
        s.top_p = 0.75f;
        check_distribution("top-p 0.75", p, 4, &s, (const double[]){0.625, 0.375, 0, 0});

        s = plain(1);
        s.top_p = 0.85f;
        check_distribution(
                "top-p 0.85", p, 4, &s, (const double[]){0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0});

        s = plain(1);
        s.top_p = 0.3f;
        check_distribution("top-p 0.3 keeps the best", p, 4, &s, (const double[]){1, 0, 0, 0});

        s = plain(1);
        s.min_p = 0.2f; /* drops p < 0.1 */
        check_distribution(
                "min-p 0.2", p, 4, &s, (const double[]){0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0});

        s = plain(1);
        s.min_p = 0.5f; /* drops p < 0.25 */
        check_distribution("min-p 0.5", p, 4, &s, (const double[]){0.625, 0.375, 0, 0});

        /* Temperature 2 on logits (2, 0): p0 = e / (e + 1). */
        const float two[] = {2, 0};
        double p0 = exp(1.0) / (exp(1.0) + 1.0);
        s = plain(2);
        check_distribution("temperature 2", two, 2, &s, (const double[]){p0, 1 - p0});

        /* All filters together, on 8 ids: top-k 6 keeps 0..5, top-p 0.9 then min-p. */
        const float eight[] = {3, 2.5f, 2, 1.5f, 1, 0.5f, 0, -0.5f};
        s = plain(1);
        s.top_k = 6;
        s.top_p = 0.9f;
        s.min_p = 0.1f;
        double q[8], z = 0;
        for (int i = 0; i < 6; i++)
                z += exp(eight[i]);
        for (int i = 0; i < 8; i++)
                q[i] = i < 6 ? exp(eight[i]) / z : 0;
        /* q = 0.414, 0.251, 0.152, 0.092, 0.056, 0.034: top-p 0.9 keeps 0..3 (cumulative
         * 0.910); min-p 0.1 drops p < 0.041, none of those. */
        CHECK(q[0] + q[1] + q[2] < 0.9 && q[0] + q[1] + q[2] + q[3] > 0.9, "bad test");
        double kept = q[0] + q[1] + q[2] + q[3];
        double want[8] = {0};
        for (int i = 0; i < 4; i++)
                want[i] = q[i] / kept;
        check_distribution("top-k + top-p + min-p", eight, 8, &s, want);
}

static void test_determinism(void)
{
        float flat[64] = {0};
        BkSampling a = plain(1), b = plain(1);
        int32_t seq_a[64], seq_b[64];
        uint32_t differ = 0;

        a.seed = 1234;
        b.seed = 1235;
        for (uint64_t d = 0; d < 64; d++) {
                seq_a[d] = sample(flat, 64, &a, NULL, 0, d);
                CHECK(sample(flat, 64, &a, NULL, 0, d) == seq_a[d], "same seed and draw differ");
                seq_b[d] = sample(flat, 64, &b, NULL, 0, d);
                differ += seq_a[d] != seq_b[d];
        }
        CHECK(differ > 32, "seeds 1234 and 1235 agree on %u of 64 draws", 64 - differ);
        CHECK(memcmp(seq_a, seq_b, sizeof(seq_a)) != 0, "different seeds, same sequence");
}

static void test_padding(void)
{
        /* Ids 8 and 9 are padding with the largest logits: vocab 8 is passed. */
        float logits[10] = {0, 1, 2, 3, 0, 0, 0, 0, 100, 200};
        BkSampling s = plain(0);

        CHECK(sample(logits, 8, &s, NULL, 0, 0) == 3, "greedy picked padding");
        s = plain(5);
        for (uint64_t d = 0; d < 2000; d++)
                CHECK(sample(logits, 8, &s, NULL, 0, d) < 8, "padding sampled");
        /* History naming padding ids is ignored. */
        const int32_t hist[] = {9, 8, 3};
        s = plain(0);
        s.repetition_penalty = 10;
        CHECK(sample(logits, 8, &s, hist, 3, 0) == 2, "penalty with padding in history");
}

static void test_penalties(void)
{
        BkSampling s;

        /* Repetition divides a positive logit: 2 / 1.2 = 1.67 < 1.9. */
        const float pos[] = {2.0f, 1.9f, -1};
        s = plain(0);
        s.repetition_penalty = 1.2f;
        CHECK(sample(pos, 3, &s, (const int32_t[]){0}, 1, 0) == 1, "repetition, positive");
        /* ... once per distinct id: 2 / 1.2 = 1.67 > 1.5, where twice would give 1.39. */
        const float pos2[] = {2.0f, 1.5f};
        CHECK(sample(pos2, 2, &s, (const int32_t[]){0, 0}, 2, 0) == 0,
                "repetition applied more than once");
        /* ... and multiplies a negative one: -1 * 1.2 = -1.2 < -1.1. */
        const float neg[] = {-1.0f, -1.1f};
        CHECK(sample(neg, 2, &s, (const int32_t[]){0}, 1, 0) == 1, "repetition, negative");

        /* Presence: once per distinct id. 1.0 - 0.3 < 0.8; 1.0 - 0.1 > 0.8 even seen 3 times. */
        const float pr[] = {1.0f, 0.8f};
        const int32_t three[] = {0, 0, 0};
        s = plain(0);
        s.presence_penalty = 0.3f;
        CHECK(sample(pr, 2, &s, three, 3, 0) == 1, "presence 0.3");
        s.presence_penalty = 0.1f;
        CHECK(sample(pr, 2, &s, three, 3, 0) == 0, "presence counted per occurrence");

        /* Frequency: per occurrence. 1.0 - 3 * 0.1 < 0.8; 1.0 - 3 * 0.05 > 0.8. */
        s = plain(0);
        s.frequency_penalty = 0.1f;
        CHECK(sample(pr, 2, &s, three, 3, 0) == 1, "frequency 0.1");
        s.frequency_penalty = 0.05f;
        CHECK(sample(pr, 2, &s, three, 3, 0) == 0, "frequency 0.05");

        /* Penalties also shape sampling: with top-k 1 the penalized argmax is chosen. */
        s = plain(1);
        s.top_k = 1;
        s.repetition_penalty = 1.2f;
        CHECK(sample(pos, 3, &s, (const int32_t[]){0}, 1, 5) == 1, "penalty before top-k");
}

/* Philox4x32-10 known answers from Random123's kat_vectors file (D. E. Shaw Research),
 * as quoted in DEShawResearch/fs123, core123/ut/ut_philox.cpp, test_kat_philox4x32:
 * counter, key, result; the third is the digits of pi. */
static void test_philox_kat(void)
{
        static const uint32_t kat[3][10] = {
                {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
                {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
                        0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
                {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
                        0x94fdcceb, 0x5001e420, 0x24126ea1},
        };

        for (int v = 0; v < 3; v++) {
                uint32_t ctr[4] = {kat[v][0], kat[v][1], kat[v][2], kat[v][3]};
                philox4x32_10(ctr, &kat[v][4]);
                for (int i = 0; i < 4; i++)
                        CHECK(ctr[i] == kat[v][6 + i], "Philox KAT %d word %d: %08x, want %08x", v,
                                i, ctr[i], kat[v][6 + i]);
        }
        /* philox_draw is counter (draw, 0, 0, 0) under key seed, first two words. */
        uint64_t r = philox_draw(0, 0);
        CHECK(r == (0x6627e8d5u | (uint64_t) 0xe169c58du << 32), "philox_draw(0, 0) %016llx",
                (unsigned long long) r);
}

/* On flat logits every candidate weighs the same, so the draw-th id is
 * floor(n * u) with u the draw's 64 random bits as a fraction of 2^64. */
static void test_draw_reference(void)
{
        const uint32_t n = 37;
        float flat[37];
        BkSampling s = plain(1);

        for (uint32_t i = 0; i < n; i++)
                flat[i] = 0.25f;
        s.seed = 0x0123456789abcdefu;
        for (uint64_t d = 0; d < 2000; d++) {
                uint32_t ctr[4] = {(uint32_t) d, (uint32_t) (d >> 32), 0, 0};
                const uint32_t key[2] = {(uint32_t) s.seed, (uint32_t) (s.seed >> 32)};
                philox4x32_10(ctr, key);
                /* n * u = n * (hi 2^32 + lo) / 2^64, with the products split to stay exact */
                uint64_t lo = (uint64_t) n * ctr[0], hi = (uint64_t) n * ctr[1] + (lo >> 32);
                int32_t want = (int32_t) (hi >> 32);
                CHECK(sample(flat, n, &s, NULL, 0, d) == want, "draw %llu: %d, want %d",
                        (unsigned long long) d, sample(flat, n, &s, NULL, 0, d), want);
        }
}

static void check_exp_at(float x, double *worst, uint64_t *prev)
{
        double want = exp((double) x), got = sm_exp(x);
        uint64_t w = sm_weight(x, 0.0f, 1.0f);

        *worst = fmax(*worst, fabs(got - want) / want);
        CHECK(w <= *prev, "weight rises from %llu to %llu at %a", (unsigned long long) *prev,
                (unsigned long long) w, x);
        *prev = w;
}

/* The sampler's exponential: within 2 ulp of exp() over its range, exactly 1 at 0, and
 * weights that never rise as the logit falls, checked every 1e-5 and on every float
 * around the points where the range reduction steps (odd multiples of ln2 / 2). */
static void test_exp(void)
{
        double worst = 0;
        uint64_t prev = UINT64_MAX;

        CHECK(sm_exp(0.0f) == 1.0f && sm_exp(-0.0f) == 1.0f, "exp(0) is not 1");
        for (uint32_t i = 0; i <= 2400000; i++)
                check_exp_at((float) i * -1e-5f, &worst, &prev);
        for (int k = 1; k < 70; k += 2) {
                float x = (float) (-k * 0.34657359027997264);
                for (int i = 0; i < 4000; i++)
                        x = nextafterf(x, 0.0f);
                prev = UINT64_MAX;
                for (int i = 0; i < 8000; i++, x = nextafterf(x, -INFINITY))
                        check_exp_at(x, &worst, &prev);
        }
        CHECK(worst < 2.5e-7, "exp relative error %.3g", worst);
        CHECK(sm_weight(SM_X_MIN - 0.5f, 0.0f, 1.0f) == 0 && sm_weight(NAN, 0.0f, 1.0f) == 0,
                "weight below the range");
        printf("sm_exp: worst relative error %.3g\n", worst);
}

int main(void)
{
        test_philox_kat();
        test_draw_reference();
        test_exp();
        test_greedy();
        test_top_k_one_is_greedy();
        test_filters();
        test_determinism();
        test_padding();
        test_penalties();
        printf("bk_sample: all checks passed\n");
        return 0;
}
