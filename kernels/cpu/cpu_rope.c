/* SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdbool.h>

#include "cpu_rope.h"

/* _compute_default_rope_parameters: 1.0 / (base ** (arange(0, d, 2).float() / d)). */
static void rope_default(float theta, uint32_t d, float *inv_freq)
{
        for (uint32_t i = 0; i < d / 2; i++) {
                float exponent = (float) (2 * i) / (float) d;
                inv_freq[i] = 1.0f / powf(theta, exponent);
        }
}

/* _compute_llama3_parameters: low frequencies divided by factor, high ones kept, a smooth
 * blend in between. PyTorch evaluates `scalar / tensor` as tensor.reciprocal() * scalar,
 * so the divisions below are written that way. */
static void rope_llama3(const BkRope *r, uint32_t d, float *inv_freq)
{
        float old_ctx = (float) r->original_max_pos;
        float low_freq_wavelen = (float) ((double) r->original_max_pos / r->low_freq_factor);
        float high_freq_wavelen = (float) ((double) r->original_max_pos / r->high_freq_factor);
        float span = (float) ((double) r->high_freq_factor - r->low_freq_factor);

        rope_default(r->theta, d, inv_freq);
        for (uint32_t i = 0; i < d / 2; i++) {
                float wavelen = (1.0f / inv_freq[i]) * (float) (2 * M_PI);
                float f = wavelen > low_freq_wavelen ? inv_freq[i] / r->factor : inv_freq[i];
                bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
                if (medium) {
                        float smooth = ((1.0f / wavelen) * old_ctx - r->low_freq_factor) / span;
                        f = (1.0f - smooth) * f / r->factor + smooth * f;
                }
                inv_freq[i] = f;
        }
}

/* find_correction_dim, in double as transformers' Python does it. */
static double yarn_correction_dim(double rotations, uint32_t d, double base, double max_pos)
{
        return (d * log(max_pos / (rotations * 2 * M_PI))) / (2 * log(base));
}

/* _compute_yarn_parameters with truncate: interpolated (divided by factor) frequencies
 * below the low correction dimension, extrapolated ones above the high one, a linear ramp
 * between. */
static void rope_yarn(const BkRope *r, uint32_t d, float *inv_freq)
{
        double low = floor(yarn_correction_dim(r->beta_fast, d, r->theta, r->original_max_pos));
        double high = ceil(yarn_correction_dim(r->beta_slow, d, r->theta, r->original_max_pos));

        low = MAX(low, 0.0);
        high = MIN(high, (double) d - 1);
        if (low == high)
                high += 0.001; /* transformers' guard against a zero-width ramp */

        for (uint32_t i = 0; i < d / 2; i++) {
                float pos_freq = powf(r->theta, (float) (2 * i) / (float) d);
                float extrapolation = 1.0f / pos_freq;
                float interpolation = 1.0f / (r->factor * pos_freq);
                float ramp = ((float) i - (float) low) / (float) (high - low);
                ramp = fminf(fmaxf(ramp, 0.0f), 1.0f);
                float extrapolation_factor = 1.0f - ramp;
                inv_freq[i] = interpolation * (1.0f - extrapolation_factor) +
                              extrapolation * extrapolation_factor;
        }
}

int cpu_rope_init(const BkRope *rope, uint32_t head_dim, float *inv_freq,
        float *ret_attention_factor, DsError *err)
{
        if (!(rope->theta > 0.0f))
                return ds_error(err, -EINVAL, "rope theta %g is not positive", rope->theta);

        switch (rope->type) {
        case BK_ROPE_DEFAULT:
                rope_default(rope->theta, head_dim, inv_freq);
                *ret_attention_factor = 1.0f;
                return 0;
        case BK_ROPE_LLAMA3:
                if (!(rope->factor > 0.0f) || rope->original_max_pos == 0 ||
                        !(rope->high_freq_factor > rope->low_freq_factor) ||
                        !(rope->low_freq_factor > 0.0f))
                        return ds_error(err, -EINVAL, "llama3 rope scaling: bad parameters");
                rope_llama3(rope, head_dim, inv_freq);
                *ret_attention_factor = 1.0f;
                return 0;
        case BK_ROPE_YARN:
                /* The loader resolves attention_factor, its defaults included. */
                if (!(rope->factor > 0.0f) || rope->original_max_pos == 0 ||
                        !(rope->attention_factor > 0.0f))
                        return ds_error(err, -EINVAL, "yarn rope scaling: bad parameters");
                rope_yarn(rope, head_dim, inv_freq);
                *ret_attention_factor = rope->attention_factor;
                return 0;
        default:
                return ds_error(err, -DS_ERR_UNSUPPORTED, "rope type %d", (int) rope->type);
        }
}

void cpu_rope_angles(const float *inv_freq, uint32_t head_dim, float attention_factor, uint32_t pos,
        float *cos_out, float *sin_out)
{
        for (uint32_t i = 0; i < head_dim / 2; i++) {
                float freq = (float) pos * inv_freq[i];
                cos_out[i] = cosf(freq) * attention_factor;
                sin_out[i] = sinf(freq) * attention_factor;
        }
}

void cpu_rope_apply(
        float *x, uint32_t n_heads, uint32_t head_dim, const float *cos_in, const float *sin_in)
{
        uint32_t half = head_dim / 2;

        for (uint32_t h = 0; h < n_heads; h++) {
                float *v = x + (size_t) h * head_dim;
                for (uint32_t i = 0; i < half; i++) {
                        float a = v[i], b = v[i + half];
                        v[i] = a * cos_in[i] - b * sin_in[i];
                        v[i + half] = b * cos_in[i] + a * sin_in[i];
                }
        }
}

void cpu_rope_apply_pairs(float *x, uint32_t dim, const float *cos_in, const float *sin_in)
{
        for (uint32_t i = 0; i < dim / 2; i++) {
                float a = x[2 * i], b = x[2 * i + 1];
                x[2 * i] = a * cos_in[i] - b * sin_in[i];
                x[2 * i + 1] = a * sin_in[i] + b * cos_in[i];
        }
}
