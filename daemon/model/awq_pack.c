/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "awq_pack.h"
#include "half.h"

float awq_weight(const uint32_t *qweight, const uint32_t *qzeros, const uint16_t *scales,
        uint32_t out, uint32_t gs, uint32_t k, uint32_t n)
{
        uint32_t g = k / gs;
        int q = (int) awq_nibble(qweight, out, k, n);
        int z = (int) awq_nibble(qzeros, out, g, n);

        return (float) (q - z) * f16_to_f32(scales[(uint64_t) g * out + n]);
}

/* fminf/fmaxf return the other operand for a NaN, so the result is always a valid nibble
 * and the conversion to unsigned is defined. */
static unsigned clamp_nibble(float v)
{
        return (unsigned) fmaxf(0.0f, fminf(15.0f, v));
}

static void put_nibble(uint32_t *packed, uint32_t out, uint32_t row, uint32_t col, unsigned v)
{
        packed[(uint64_t) row * (out / 8) + col / 8] |= (uint32_t) v << (4 * AWQ_REV[col % 8]);
}

int awq_quantize_rtn(const float *w, uint32_t in, uint32_t out, uint32_t gs, uint32_t *qweight,
        uint32_t *qzeros, uint16_t *scales)
{
        if (!w || !qweight || !qzeros || !scales)
                return -EINVAL;
        if (in == 0 || out == 0 || gs == 0 || in % gs != 0 || out % 8 != 0)
                return -EINVAL;

        uint32_t n_groups = in / gs;

        memset(qweight, 0, (uint64_t) in * (out / 8) * sizeof(*qweight));
        memset(qzeros, 0, (uint64_t) n_groups * (out / 8) * sizeof(*qzeros));

        /* Row n of w is output n, contiguous over the inputs: one pass per (n, group)
         * reads gs consecutive floats twice (range, then quantize). */
        for (uint32_t n = 0; n < out; n++) {
                const float *row = w + (uint64_t) n * in;

                for (uint32_t g = 0; g < n_groups; g++) {
                        const float *grp = row + (uint64_t) g * gs;
                        float mn = grp[0], mx = grp[0];

                        for (uint32_t i = 1; i < gs; i++) {
                                mn = fminf(mn, grp[i]);
                                mx = fmaxf(mx, grp[i]);
                        }

                        /* AutoAWQ stores the scale in fp16 and quantizes with that
                         * rounded value, so a loader's (q - z) * s reproduces its
                         * dequantized weights exactly. */
                        uint16_t s16 = f32_to_f16(fmaxf(mx - mn, 1e-5f) / 15.0f);
                        float s = f16_to_f32(s16);
                        /* rintf rounds half to even, as torch.round does. */
                        unsigned z = clamp_nibble(-rintf(mn / s));

                        scales[(uint64_t) g * out + n] = s16;
                        put_nibble(qzeros, out, g, n, z);
                        for (uint32_t i = 0; i < gs; i++) {
                                unsigned q = clamp_nibble(rintf(grp[i] / s) + (float) z);
                                put_nibble(qweight, out, g * gs + i, n, q);
                        }
                }
        }
        return 0;
}
