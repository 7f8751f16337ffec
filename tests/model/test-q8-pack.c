/* SPDX-License-Identifier: MIT */
/* q8_quantize_row against its contract (daemon/model/q8_pack.h), checked here from the
 * weights alone: every scale is amax / 127 of its group, every |q| <= 127, q * s within
 * half a step of w, the weight of magnitude amax at +-127, halves rounded to even, and q
 * the header's formula itself (rintf, fminf, fmaxf) bit for bit, on random rows of several
 * widths and on groups of zeros, huge, tiny, subnormal, infinite and NaN weights. The
 * group sizes of q8_group_size() too. */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"
#include "q8_pack.h"
#include "test_util.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng(void)
{
        rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
        return (uint32_t) (rng_state >> 33);
}

/* Uniform in [-1, 1). */
static double urand(void)
{
        return (double) rng() / 2147483648.0 - 1.0;
}

/* The header's formula as it is written there, for one weight. */
static int8_t formula_q(float w, float s)
{
        if (s == 0.0f)
                return 0;
        return (int8_t) fmaxf(-127.0f, fminf(127.0f, rintf(w / s)));
}

/* Quantizes w (in) in groups of gs and checks every group; the half-step bound where the
 * header promises it, for finite weights and a normal scale. */
static void check_row(const char *what, const float *w, uint32_t in, uint32_t gs)
{
        int8_t *q = malloc(in);
        float *scales = malloc(in / gs * sizeof(float));
        double worst = 0;

        CHECK(gs && q && scales, "%s: group size %u", what, gs);
        memset(q, 0x55, in);
        q8_quantize_row(w, in, gs, q, scales);

        for (uint32_t g = 0; g < in / gs; g++) {
                const float *wg = w + (size_t) g * gs;
                const int8_t *qg = q + (size_t) g * gs;
                float amax = 0.0f;
                bool finite = true;

                for (uint32_t k = 0; k < gs; k++) {
                        finite &= isfinite(wg[k]);
                        if (!isnan(wg[k]) && fabsf(wg[k]) > amax)
                                amax = fabsf(wg[k]);
                }
                float s = amax / 127.0f;
                CHECK(memcmp(&scales[g], &s, sizeof(s)) == 0,
                        "%s: group %u: scale %a, amax %a / 127 is %a", what, g, scales[g], amax, s);

                for (uint32_t k = 0; k < gs; k++) {
                        CHECK(qg[k] >= -127 && qg[k] <= 127, "%s: w[%u] = %a: q %d", what,
                                g * gs + k, wg[k], qg[k]);
                        CHECK(qg[k] == formula_q(wg[k], s), "%s: w[%u] = %a: q %d, formula %d",
                                what, g * gs + k, wg[k], qg[k], formula_q(wg[k], s));
                        if (s == 0.0f) {
                                CHECK(qg[k] == 0, "%s: zero scale, q %d", what, qg[k]);
                                continue;
                        }
                        if (!finite || s < FLT_MIN)
                                continue;
                        /* w / s carries a float rounding of at most 127 * 2^-24 steps. */
                        double err = fabs((double) qg[k] * s - wg[k]);
                        CHECK(err <= s * (0.5 + 1e-5),
                                "%s: w[%u] = %a: q %d * s %a is off by %g steps", what, g * gs + k,
                                wg[k], qg[k], s, err / s);
                        worst = fmax(worst, err / s);
                        if (fabsf(wg[k]) == amax)
                                CHECK(qg[k] == (wg[k] > 0 ? 127 : -127),
                                        "%s: w[%u] = %a = +-amax: q %d", what, g * gs + k, wg[k],
                                        qg[k]);
                }
        }
        printf("%s: in %u, group %u: worst %.4f steps\n", what, in, gs, worst);
        free(q);
        free(scales);
}

/* Random rows whose groups' magnitudes spread over 1e-6 .. 1e3, with the largest weight
 * placed, with a random sign, at a random place. */
static void test_random(uint32_t in)
{
        float *w = malloc(in * sizeof(float));
        char what[64];

        CHECK(w, "oom");
        for (int rep = 0; rep < 20; rep++) {
                uint32_t gs = q8_group_size(in);
                for (uint32_t g = 0; g < in / gs; g++) {
                        double mag = pow(10.0, -6.0 + 9.0 * (urand() + 1.0) / 2.0);
                        for (uint32_t k = 0; k < gs; k++)
                                w[g * gs + k] = (float) (mag * urand());
                        uint32_t at = rng() % gs;
                        w[g * gs + at] = (float) (rng() % 2 ? mag : -mag);
                }
                snprintf(what, sizeof(what), "random %u #%d", in, rep);
                check_row(what, w, in, gs);
        }
        free(w);
}

/* Weights within a few ulps of half steps k + 1/2 of scales that are not powers of two,
 * where w / s rounds the other way from, say, w * (1 / s) often enough to tell them
 * apart. */
static void test_near_ties(void)
{
        static const float amaxes[] = {1.0f, 0.3f, 7.77f, 1e-3f, 123.456f};
        float w[128];
        char what[64];

        for (size_t a = 0; a < ELEMENTSOF(amaxes); a++)
                for (int rep = 0; rep < 40; rep++) {
                        float s = amaxes[a] / 127.0f;
                        w[0] = rep % 2 ? amaxes[a] : -amaxes[a];
                        for (uint32_t k = 1; k < 128; k++) {
                                float v = (float) (((int) (rng() % 253) - 126 + 0.5) * s);
                                for (int u = (int) (rng() % 5) - 2; u != 0; u += u > 0 ? -1 : 1)
                                        v = nextafterf(v, u > 0 ? INFINITY : -INFINITY);
                                w[k] = v;
                        }
                        snprintf(what, sizeof(what), "near ties, amax %g #%d", amaxes[a], rep);
                        check_row(what, w, 128, 128);
                }
}

static void test_special(void)
{
        float w[32 * 12];
        uint32_t n = 0;

        /* All zeros, negative zeros included. */
        for (uint32_t k = 0; k < 32; k++)
                w[n++] = k % 2 ? -0.0f : 0.0f;
        /* amax 127: s is exactly 1, so k + 0.5 are ties, rounded to even. */
        for (uint32_t k = 0; k < 32; k++)
                w[n++] = k == 0 ? 127.0f : (float) ((int) k - 16) + 0.5f;
        /* Huge: FLT_MAX itself and its neighbours. */
        for (uint32_t k = 0; k < 32; k++)
                w[n++] = k == 5 ? -FLT_MAX : FLT_MAX * (float) urand();
        /* Tiny but with a normal scale. */
        for (uint32_t k = 0; k < 32; k++)
                w[n++] = 1e-30f * (float) urand();
        /* Subnormal scale: the formula still holds, the half-step bound does not. */
        for (uint32_t k = 0; k < 32; k++)
                w[n++] = 1e-38f * (float) urand();
        /* amax / 127 underflows to 0: every q is 0. */
        for (uint32_t k = 0; k < 32; k++)
                w[n++] = k % 3 ? 1e-44f : -1e-44f;
        /* A NaN is passed over by the maximum and becomes 127. */
        for (uint32_t k = 0; k < 32; k++)
                w[n++] = k == 7 ? NAN : (float) urand();
        /* An infinity makes the scale infinite: finite weights 0, the infinity NaN: 127. */
        for (uint32_t k = 0; k < 32; k++)
                w[n++] = k == 3 ? -INFINITY : (float) urand();
        /* Two weights at +-amax, the rest tiny next to them. */
        for (uint32_t k = 0; k < 32; k++)
                w[n++] = k == 1 ? 3.0f : k == 30 ? -3.0f : 1e-7f * (float) urand();
        /* Every weight +-amax. */
        for (uint32_t k = 0; k < 32; k++)
                w[n++] = k % 2 ? 0.25f : -0.25f;
        /* One weight, the rest zero. */
        for (uint32_t k = 0; k < 32; k++)
                w[n++] = k == 31 ? -1e-3f : 0.0f;
        /* Weights an ulp either side of half steps. */
        for (uint32_t k = 0; k < 32; k++)
                w[n++] = k == 0 ? 127.0f : nextafterf((float) k + 0.5f, k % 2 ? 0.0f : 1000.0f);
        check_row("special groups", w, n, 32);

        int8_t q[32 * 12];
        float s[12];
        q8_quantize_row(w, n, 32, q, s);
        CHECK(s[0] == 0.0f && s[5] == 0.0f, "zero groups: scales %g %g", s[0], s[5]);
        CHECK(s[1] == 1.0f, "amax 127: scale %a", s[1]);
        for (uint32_t k = 1; k < 32; k++) {
                /* k - 16 + 0.5 rounds to the even of k - 16 and k - 15. */
                int lo = (int) k - 16, want = lo % 2 == 0 ? lo : lo + 1;
                CHECK(q[32 + k] == want, "tie %g: q %d, want %d", w[32 + k], q[32 + k], want);
        }
        CHECK(q[6 * 32 + 7] == 127 && isfinite(s[6]), "NaN: q %d, scale %g", q[6 * 32 + 7], s[6]);
        CHECK(isinf(s[7]) && q[7 * 32 + 3] == 127 && q[7 * 32 + 4] == 0, "inf: q %d %d, scale %g",
                q[7 * 32 + 3], q[7 * 32 + 4], s[7]);
        CHECK(q[8 * 32 + 1] == 127 && q[8 * 32 + 30] == -127, "two at amax");
        CHECK(q[10 * 32 + 31] == -127 && q[10 * 32] == 0, "one weight");
}

int main(void)
{
        static const uint32_t sizes[][2] = {{32, 32}, {64, 64}, {96, 32}, {128, 128}, {160, 32},
                {192, 64}, {3584, 128}, {5120, 128}, {48, 0}, {100, 0}, {16, 0}, {0, 0}};

        for (size_t i = 0; i < ELEMENTSOF(sizes); i++)
                CHECK(q8_group_size(sizes[i][0]) == sizes[i][1], "q8_group_size(%u) = %u, want %u",
                        sizes[i][0], q8_group_size(sizes[i][0]), sizes[i][1]);

        static const uint32_t widths[] = {32, 64, 96, 128, 192, 3584};
        for (size_t i = 0; i < ELEMENTSOF(widths); i++)
                test_random(widths[i]);
        test_near_ties();
        test_special();
        return 0;
}
