/* SPDX-License-Identifier: MIT */
/* IEEE binary16 and bfloat16 <-> float32, exact in the widening direction and
 * round-to-nearest-even when narrowing. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline float f32_from_bits(uint32_t u)
{
        float f;
        memcpy(&f, &u, sizeof(f));
        return f;
}

static inline uint32_t f32_to_bits(float f)
{
        uint32_t u;
        memcpy(&u, &f, sizeof(u));
        return u;
}

static inline float f16_to_f32(uint16_t h)
{
        uint32_t sign = (uint32_t) (h & 0x8000) << 16;
        uint32_t exp = (h >> 10) & 0x1f;
        uint32_t mant = h & 0x3ff;

        if (exp == 0) {
                if (mant == 0)
                        return f32_from_bits(sign);
                /* Subnormal: value is mant * 2^-24, exactly representable in float32. */
                float v = (float) mant * (1.0f / 16777216.0f);
                return sign ? -v : v;
        }
        if (exp == 31)
                return f32_from_bits(sign | 0x7f800000u | (mant << 13));
        return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

static inline uint16_t f32_to_f16(float f)
{
        uint32_t x = f32_to_bits(f);
        uint32_t sign = (x >> 16) & 0x8000;
        uint32_t absx = x & 0x7fffffffu;

        if (absx >= 0x7f800000u) /* inf or nan */
                return (uint16_t) (sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
        if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
                return (uint16_t) (sign | 0x7c00);
        if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
                if (absx < 0x33000000u)
                        return (uint16_t) sign;
                uint32_t e = absx >> 23;
                uint32_t m = (absx & 0x7fffff) | 0x800000;
                uint32_t shift = 126 - e; /* 14..24 */
                uint32_t half = m >> shift;
                uint32_t rem = m & ((1u << shift) - 1);
                uint32_t mid = 1u << (shift - 1);
                if (rem > mid || (rem == mid && (half & 1)))
                        half++;
                return (uint16_t) (sign | half);
        }
        uint32_t r = absx + 0xfff + ((absx >> 13) & 1); /* round to nearest even */
        return (uint16_t) (sign | (((r >> 23) - 112) << 10) | ((r >> 13) & 0x3ff));
}

static inline float bf16_to_f32(uint16_t b)
{
        return f32_from_bits((uint32_t) b << 16);
}

/* dst[i] = f16_to_f32(the i-th half at src), bit for bit, for n halfs at src, which need
 * not be aligned (a mapped tensor). Without f16_to_f32's branches, so that compilers
 * vectorize it: widening a 7B lm_head one half at a time took a second. */
static inline void f16_row_to_f32(const void *src, size_t n, float *dst)
{
        const unsigned char *p = (const unsigned char *) src;

        for (size_t i = 0; i < n; i++) {
                uint16_t h;
                memcpy(&h, p + 2 * i, sizeof(h));
                uint32_t sign = (uint32_t) (h & 0x8000) << 16;
                uint32_t em = (uint32_t) (h & 0x7fff) << 13;
                /* Times 2^112 moves the exponent bias from 15 to 127, exactly for normal and
                 * subnormal halfs alike; exponent 31 (inf, NaN) then gets float's 255. */
                uint32_t bits = f32_to_bits(f32_from_bits(em) * f32_from_bits(0x77800000u));
                bits |= em >= 0x0f800000u ? 0x7f800000u : 0;
                dst[i] = f32_from_bits(bits | sign);
        }
}

/* dst[i] = bf16_to_f32(the i-th bfloat16 at src) for n values at src, aligned or not. */
static inline void bf16_row_to_f32(const void *src, size_t n, float *dst)
{
        const unsigned char *p = (const unsigned char *) src;

        for (size_t i = 0; i < n; i++) {
                uint16_t b;
                memcpy(&b, p + 2 * i, sizeof(b));
                dst[i] = bf16_to_f32(b);
        }
}

static inline uint16_t f32_to_bf16(float f)
{
        uint32_t x = f32_to_bits(f);
        if ((x & 0x7fffffffu) > 0x7f800000u)
                return (uint16_t) ((x >> 16) | 0x40);
        x += 0x7fff + ((x >> 16) & 1);
        return (uint16_t) (x >> 16);
}
