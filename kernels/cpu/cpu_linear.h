/* SPDX-License-Identifier: MIT */
/* The CPU backend's hot spot: y = x · W + bias for dense, AWQ INT4 and 8-bit (Q8)
 * weights, with float32 accumulation. Every output's sum runs over the inputs in ascending
 * order whatever the number of rows, so one row's result never depends on the other rows. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "cpu_pool.h"

/* Element i of a vector or matrix tensor, widened to float32. */
float cpu_tensor_get(BkTensor t, size_t i);

/* Checks that l is a well-formed layer of in inputs and out outputs; fills err naming
 * what (e.g. "layer 3 q_proj") when not. */
int cpu_linear_check(const BkLinear *l, uint32_t in, uint32_t out, const char *what, DsError *err);

/* Floats of scratch cpu_linear() needs for l, per thread of its pool. */
size_t cpu_linear_scratch_size(const BkLinear *l);

/* y (rows, l->out) = x (rows, l->in) · W + bias. scratch holds cpu_linear_scratch_size()
 * floats for each of cpu_pool_threads(pool). The output columns are split among the
 * pool's threads (NULL: the caller alone); the bits of y never depend on how. */
void cpu_linear(
        const BkLinear *l, const float *x, uint32_t rows, float *y, float *scratch, CpuPool *pool);

/* row (l->out) = input row k of W (the [in][out] view), dequantized to float32 exactly as
 * cpu_linear() sees it: for code that needs W itself, like MLA's absorbed attention. */
void cpu_linear_row(const BkLinear *l, uint32_t k, float *row);
