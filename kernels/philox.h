/* SPDX-License-Identifier: MIT */
/* Philox4x32-10, the counter-based generator of Salmon, Moraes, Dror and Shaw, "Parallel
 * random numbers: as easy as 1, 2, 3" (SC'11), as Random123 defines it: ten rounds of
 * two 32x32->64 multiplies over a 128-bit counter under a 64-bit key. A pure function of
 * (counter, key), so a request's n-th random number needs no state and is the same on the
 * host (kernels/sample.c) and on the device (kernels/cuda/cuda_sample.cu). */
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define PHILOX_FN static inline __host__ __device__
#else
#define PHILOX_FN static inline
#endif

#define PHILOX_M0 UINT32_C(0xD2511F53)
#define PHILOX_M1 UINT32_C(0xCD9E8D57)
#define PHILOX_W0 UINT32_C(0x9E3779B9) /* the key schedule: golden ratio */
#define PHILOX_W1 UINT32_C(0xBB67AE85) /* ... and sqrt(3) - 1 */

/* ctr[4] becomes Philox4x32-10(ctr, key). */
PHILOX_FN void philox4x32_10(uint32_t ctr[4], const uint32_t key[2])
{
        uint32_t k0 = key[0], k1 = key[1];

        for (int round = 0; round < 10; round++) {
                uint64_t p0 = (uint64_t) PHILOX_M0 * ctr[0];
                uint64_t p1 = (uint64_t) PHILOX_M1 * ctr[2];
                uint32_t c1 = ctr[1], c3 = ctr[3];
                ctr[0] = (uint32_t) (p1 >> 32) ^ c1 ^ k0;
                ctr[1] = (uint32_t) p1;
                ctr[2] = (uint32_t) (p0 >> 32) ^ c3 ^ k1;
                ctr[3] = (uint32_t) p0;
                k0 += PHILOX_W0;
                k1 += PHILOX_W1;
        }
}

/* The random 64 bits of a request's draw-th sample: counter (draw, 0), key seed. Read as
 * a fraction of 2^64 it is the request's uniform in [0, 1). */
PHILOX_FN uint64_t philox_draw(uint64_t seed, uint64_t draw)
{
        uint32_t ctr[4] = {(uint32_t) draw, (uint32_t) (draw >> 32), 0, 0};
        const uint32_t key[2] = {(uint32_t) seed, (uint32_t) (seed >> 32)};

        philox4x32_10(ctr, key);
        return (uint64_t) ctr[0] | (uint64_t) ctr[1] << 32;
}
