/* SPDX-License-Identifier: MIT */
/* The 8-bit lm_head of BK_LINEAR_Q8 (kernels/backend.h): symmetric per-group quantization
 * of a dense [out][in] weight, one row at a time, done at load (ModelOptions.lm_head_int8)
 * so that a device reads half the bytes of an FP16 lm_head at decode. */
#pragma once

#include <stdint.h>

/* The group of a Q8 linear of in inputs: the largest of 128, 64 and 32 that divides in,
 * or 0 when none does (in 0 included). */
uint32_t q8_group_size(uint32_t in);

/* Quantizes one row w (in floats) in groups of gs consecutive inputs (gs is 32, 64 or 128
 * and divides in) into q (in) and scales (in / gs). Per group, in plain float32 arithmetic and the
 * default rounding mode, so that every build gives the same bits: amax = the largest fabsf(w[k]) of
 * the group (fmaxf, so a NaN is passed over), s = amax / 127.0f, q[k] = (int8_t) fmaxf(-127.0f,
 * fminf(127.0f, rintf(w[k] / s))), rintf rounding half to even; a weight of magnitude amax becomes
 * +-127. When s is 0 (amax 0, or a subnormal amax so small that amax / 127 underflows to 0) the
 * group gets s = 0 and every q = 0: such a group contributes nothing. The weight is
 * read back as q[k] * s, within s / 2 (up to float rounding) of w[k] while s is a normal
 * float, that is for amax >= 127 * FLT_MIN (about 1.5e-36). */
void q8_quantize_row(const float *w, uint32_t in, uint32_t gs, int8_t *q, float *scales);
