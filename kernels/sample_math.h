/* SPDX-License-Identifier: MIT */
/* The arithmetic of a sampling decision that the host (kernels/sample.c) and the device
 * (kernels/cuda/cuda_sample.cu) must do bit for bit alike, so that both pick the same id
 * from the same logits.
 *
 * Only correctly rounded IEEE operations are used, one rounding each: the exponential is
 * our own polynomial rather than expf (glibc's and CUDA's differ in the last bits), the
 * device spells every float operation as an _rn intrinsic so nvcc fuses none into an FMA,
 * and sample.c turns contraction off for the host. A candidate's probability is then an
 * integer weight, 2^34 times exp((logit - max) / temperature) rounded down, and every sum
 * over candidates is an integer sum: exact, so it does not depend on the order a parallel
 * reduction adds in. Candidates below 2^-34 of the likeliest weigh 0 and are never drawn. */
#pragma once

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define SM_FN static inline __host__ __device__
#else
#define SM_FN static inline
#endif

#ifdef __CUDA_ARCH__
#define SM_ADD(a, b) __fadd_rn((a), (b))
#define SM_SUB(a, b) __fsub_rn((a), (b))
#define SM_MUL(a, b) __fmul_rn((a), (b))
#define SM_DIV(a, b) __fdiv_rn((a), (b))
#else
#define SM_ADD(a, b) ((a) + (b))
#define SM_SUB(a, b) ((a) - (b))
#define SM_MUL(a, b) ((a) * (b))
#define SM_DIV(a, b) ((a) / (b))
#endif

/* Weights are fractions of 2^34, so a vocabulary of up to 2^19 ids sums below 2^53 and
 * top-p's threshold is exact in double. */
#define SM_ONE       0x1p34f
#define SM_VOCAB_MAX (1u << 19)
/* exp(-24) * 2^34 < 1: below this scaled logit every weight is 0. */
#define SM_X_MIN -24.0f

/* exp(x) for SM_X_MIN <= x <= 0 within a few ulp: x = k ln2 + r with |r| <= ln2/2 (ln2 in
 * two parts, k ln2_hi exact), a degree-7 Taylor polynomial in r, times 2^k. exp(0) is
 * exactly 1. */
SM_FN float sm_exp(float x)
{
        const float ln2_hi = 0.693145751953125f, ln2_lo = 1.42860677e-6f;
        float k = floorf(SM_ADD(SM_MUL(x, 1.44269504f), 0.5f));
        float r = SM_SUB(SM_SUB(x, SM_MUL(k, ln2_hi)), SM_MUL(k, ln2_lo));
        float p = 1.0f / 5040.0f;

        p = SM_ADD(SM_MUL(p, r), 1.0f / 720.0f);
        p = SM_ADD(SM_MUL(p, r), 1.0f / 120.0f);
        p = SM_ADD(SM_MUL(p, r), 1.0f / 24.0f);
        p = SM_ADD(SM_MUL(p, r), 1.0f / 6.0f);
        p = SM_ADD(SM_MUL(p, r), 0.5f);
        p = SM_ADD(SM_MUL(p, r), 1.0f);
        p = SM_ADD(SM_MUL(p, r), 1.0f);
        return ldexpf(p, (int) k); /* exact: the result is a normal float */
}

/* The scaled logit of a candidate of (penalized) logit v in a row whose largest is max. */
SM_FN float sm_scaled(float v, float max, float temperature)
{
        return SM_DIV(SM_SUB(v, max), temperature);
}

/* The weight of a candidate of scaled logit x. */
SM_FN uint64_t sm_weight_of(float x)
{
        if (!(x >= SM_X_MIN)) /* NaN too */
                return 0;
        return (uint64_t) SM_MUL(sm_exp(x), SM_ONE);
}

SM_FN uint64_t sm_weight(float v, float max, float temperature)
{
        return sm_weight_of(sm_scaled(v, max, temperature));
}

/* A logit after the penalties of an id seen count > 0 times: repetition divides a positive
 * logit and multiplies a negative one (once), presence subtracts once, frequency per
 * occurrence. */
SM_FN float sm_penalize(float v, uint32_t count, float repetition, float presence, float frequency)
{
        if (repetition > 0.0f && repetition != 1.0f)
                v = v > 0.0f ? SM_DIV(v, repetition) : SM_MUL(v, repetition);
        v = SM_SUB(v, presence);
        return SM_SUB(v, SM_MUL(frequency, (float) count));
}

/* Top-p keeps the best-first prefix whose weight reaches this much of total. */
SM_FN uint64_t sm_top_p_need(float top_p, uint64_t total)
{
        return (uint64_t) ceil((double) top_p * (double) total);
}

/* Min-p keeps the candidates weighing at least this (the likeliest weighs SM_ONE). */
SM_FN double sm_min_p_floor(float min_p)
{
        return (double) min_p * (double) SM_ONE;
}

/* The draw: a 64-bit uniform times total, rounded down, in [0, total). */
SM_FN uint64_t sm_target(uint64_t random, uint64_t total)
{
#ifdef __CUDA_ARCH__
        return __umul64hi(random, total);
#else
        return (uint64_t) (((unsigned __int128) random * total) >> 64);
#endif
}
