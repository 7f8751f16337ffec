/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <float.h>
#include <math.h>

#include "q8_pack.h"

/* 1.5 * 2^23: for |v| <= 2^22, (v + ROUND_MAGIC) - ROUND_MAGIC is v rounded to an integer
 * in the current rounding mode, rintf(v) exactly, without a call that keeps the loop from
 * being vectorized. Only where float arithmetic is done in float: with x87's wider
 * registers the sum would not round. */
#define ROUND_MAGIC 12582912.0f
_Static_assert(FLT_EVAL_METHOD == 0, "the rounding of ROUND_MAGIC needs float evaluation");

uint32_t q8_group_size(uint32_t in)
{
        static const uint32_t sizes[] = {128, 64, 32};

        if (in == 0)
                return 0;
        for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
                if (in % sizes[i] == 0)
                        return sizes[i];
        return 0;
}

/* The header's formula as it reads, for the groups quantize_group() leaves: those with a
 * NaN or an infinity, and those whose scale is subnormal. */
static float quantize_group_slow(const float *w, uint32_t gs, int8_t *q)
{
        float amax = 0.0f;

        for (uint32_t i = 0; i < gs; i++)
                amax = fmaxf(amax, fabsf(w[i]));
        float s = amax / 127.0f;
        for (uint32_t i = 0; i < gs; i++)
                /* fminf/fmaxf return the number for a NaN: the conversion is defined. */
                q[i] = s == 0.0f ? 0 : (int8_t) fmaxf(-127.0f, fminf(127.0f, rintf(w[i] / s)));
        return s;
}

/* One group of gs weights; gs is a constant where it is inlined, so that the compiler
 * unrolls and vectorizes the loops, which a 7B lm_head (545M weights) needs to load in
 * well under a second. */
static inline __attribute__((always_inline)) float quantize_group(
        const float *restrict w, uint32_t gs, int8_t *restrict q)
{
        float lane_max[8] = {0}, lane_sum[8] = {0}, amax = 0.0f, sum = 0.0f;

        /* Eight independent maxima rather than one chain of gs dependent ones; the maximum
         * does not depend on the order. The sum only detects a NaN or an infinity. */
        for (uint32_t i = 0; i < gs; i += 8)
                for (uint32_t j = 0; j < 8; j++) {
                        float a = fabsf(w[i + j]);
                        lane_max[j] = a > lane_max[j] ? a : lane_max[j];
                        lane_sum[j] += a;
                }
        for (uint32_t j = 0; j < 8; j++) {
                amax = lane_max[j] > amax ? lane_max[j] : amax;
                sum += lane_sum[j];
        }
        if (!(sum <= FLT_MAX))
                return quantize_group_slow(w, gs, q);

        float s = amax / 127.0f;
        if (s == 0.0f) {
                for (uint32_t i = 0; i < gs; i++)
                        q[i] = 0;
                return s;
        }
        if (s < FLT_MIN)
                return quantize_group_slow(w, gs, q);
        /* A division, not a multiplication by 1 / s: the header promises w / s. With s
         * normal and every |w| <= amax, |w / s| <= 127 (1 + 2^-22): no clamp is needed and
         * the rounding gives -127 .. 127. */
        for (uint32_t i = 0; i < gs; i++)
                q[i] = (int8_t) (int32_t) ((w[i] / s + ROUND_MAGIC) - ROUND_MAGIC);
        return s;
}

void q8_quantize_row(const float *w, uint32_t in, uint32_t gs, int8_t *q, float *scales)
{
        for (uint32_t g = 0; g < in / gs; g++) {
                const float *wg = w + (uint64_t) g * gs;
                int8_t *qg = q + (uint64_t) g * gs;

                switch (gs) {
                case 128:
                        scales[g] = quantize_group(wg, 128, qg);
                        break;
                case 64:
                        scales[g] = quantize_group(wg, 64, qg);
                        break;
                default:
                        assert(gs == 32);
                        scales[g] = quantize_group(wg, 32, qg);
                        break;
                }
        }
}
