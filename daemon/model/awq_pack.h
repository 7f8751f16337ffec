/* SPDX-License-Identifier: MIT */
/* The AutoAWQ GEMM INT4 layout (shared/docs/formats.md): packing, unpacking and
 * round-to-nearest quantization, used by quantize-at-load and by dsquant. */
#pragma once

#include <stdint.h>

/* Logical column j of a packed word is nibble AWQ_REV[j]. */
static const unsigned AWQ_REV[8] = {0, 4, 1, 5, 2, 6, 3, 7};

static inline unsigned awq_nibble(const uint32_t *packed, uint32_t out, uint32_t row, uint32_t col)
{
        uint32_t word = packed[(uint64_t) row * (out / 8) + col / 8];
        return (word >> (4 * AWQ_REV[col % 8])) & 0xF;
}

/* Dequantized W[k][n] = (q - z) * s of an AWQ layer with out outputs and group gs. */
float awq_weight(const uint32_t *qweight, const uint32_t *qzeros, const uint16_t *scales,
        uint32_t out, uint32_t gs, uint32_t k, uint32_t n);

/* Quantizes w ([out][in] row-major float32, the nn.Linear layout) the way AutoAWQ's
 * pseudo_quantize_tensor does with zero points, without the activation-aware search:
 * per group of gs inputs, scale = max(max - min, 1e-5) / 15 (stored as fp16, and that
 * rounded value used), zero = clamp(-round(min / scale), 0, 15),
 * q = clamp(round(w / scale) + zero, 0, 15). in % gs == 0 and out % 8 == 0, else -EINVAL.
 * Outputs: qweight [in][out/8], qzeros [in/gs][out/8], scales [in/gs][out]. */
int awq_quantize_rtn(const float *w, uint32_t in, uint32_t out, uint32_t gs, uint32_t *qweight,
        uint32_t *qzeros, uint16_t *scales);
