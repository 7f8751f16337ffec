/* SPDX-License-Identifier: MIT */
/* f16_row_to_f32 and bf16_row_to_f32 (common/half.h), which the loader widens the lm_head
 * with, give f16_to_f32 and bf16_to_f32 bit for bit for every one of the 65536 inputs, read
 * from an aligned and from a misaligned address; and f16 values agree with a decoding by
 * ldexpf written here. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "test_util.h"

#define N 65536

/* IEEE half by arithmetic, for the finite values. */
static float half_value(uint16_t h)
{
        int e = (h >> 10) & 31, m = h & 1023;
        float v = e == 0 ? ldexpf((float) m, -24) : ldexpf((float) (m | 1024), e - 25);
        return (h & 0x8000) ? -v : v;
}

int main(void)
{
        uint8_t *bytes = malloc(2 * N + 1);
        float *got = malloc(N * sizeof(float));

        CHECK(bytes && got, "oom");
        for (size_t off = 0; off < 2; off++) {
                for (uint32_t i = 0; i < N; i++) {
                        uint16_t h = (uint16_t) i;
                        memcpy(bytes + off + 2 * i, &h, 2);
                }
                f16_row_to_f32(bytes + off, N, got);
                for (uint32_t i = 0; i < N; i++) {
                        uint32_t want = f32_to_bits(f16_to_f32((uint16_t) i));
                        CHECK(f32_to_bits(got[i]) == want,
                                "f16 %04x at offset %zu: %08x, want %08x", i, off,
                                f32_to_bits(got[i]), want);
                        if (((i >> 10) & 31) != 31)
                                CHECK(got[i] == half_value((uint16_t) i) &&
                                                signbit(got[i]) ==
                                                        signbit(half_value((uint16_t) i)),
                                        "f16 %04x: %a, by arithmetic %a", i, got[i],
                                        half_value((uint16_t) i));
                        else if (i & 1023)
                                CHECK(isnan(got[i]), "f16 %04x: %a is not NaN", i, got[i]);
                        else
                                CHECK(isinf(got[i]), "f16 %04x: %a is not infinite", i, got[i]);
                }
                bf16_row_to_f32(bytes + off, N, got);
                for (uint32_t i = 0; i < N; i++)
                        CHECK(f32_to_bits(got[i]) == i << 16, "bf16 %04x at offset %zu: %08x", i,
                                off, f32_to_bits(got[i]));
        }
        printf("f16_row_to_f32, bf16_row_to_f32: all 65536 values bit-identical, aligned and "
               "not\n");
        free(bytes);
        free(got);
        return 0;
}
