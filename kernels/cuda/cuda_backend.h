/* SPDX-License-Identifier: MIT */
/* The CUDA backend's C entry points (defined in cuda_backend.cu). */
#pragma once

#include <stdbool.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* BkOptions.device: NULL or "" for the defaults, else words: "eager" runs every step
 * without CUDA graphs (the tests compare the two); "int4-only" keeps no resident FP16 copy
 * of the AWQ weights for steps of more than 16 rows (they dequantize per step instead). */
extern const BackendOps backend_cuda_ops;

/* True when the CUDA runtime sees at least one device. */
bool cuda_device_present(void);

/* Test hook: y (rows, l->out) = x (rows, l->in) · W + bias through the path a step of
 * rows rows takes (the GEMV up to 16 rows, dequantize + cuBLAS above), on a fresh device
 * copy of l. */
int cuda_test_linear(const BkLinear *l, const float *x, uint32_t rows, float *y, DsError *err);

/* Test hook: the MoE expert GEMV (cu_gemv_experts) over n_experts AWQ linears of one shape
 * stored one after the other. Pair p goes to expert expert_of[p] and reads row p / x_div
 * of x (ceil(n_pairs / x_div) rows of in); an expert's rows are listed in pair order, or
 * in reverse when reverse. y (n_pairs, out) = the sum of the slices. */
int cuda_test_experts(const BkLinear *experts, uint32_t n_experts, const uint32_t *expert_of,
        uint32_t n_pairs, uint32_t x_div, bool reverse, const float *x, float *y, DsError *err);

/* Test hook: the MoE router kernel on rows rows of float32 logits (rows, n_routed) with
 * e_score_correction_bias or NULL: idx, w (rows, top_k) as cpu_moe_route returns them. */
int cuda_test_moe_route(const BkMoeConfig *mc, const float *logits, const float *bias,
        uint32_t rows, uint32_t *idx, float *w, DsError *err);

#ifdef __cplusplus
}
#endif
