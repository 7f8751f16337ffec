/* SPDX-License-Identifier: MIT */
/* Writes a safetensors file the way the reference writer does: header padded with spaces
 * to a multiple of 8, tensors contiguous in the order added. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "safetensors.h"

typedef struct StWriter StWriter;

int st_writer_new(StWriter **ret);
/* Copies data (n_bytes must equal numel * dtype size). */
int st_writer_add(StWriter *w, const char *name, StDtype dtype, uint32_t n_dims,
        const uint64_t *shape, const void *data, size_t n_bytes);
/* Writes the file; returns 0 or a negative errno with a message in err. */
int st_writer_write(StWriter *w, const char *path, DsError *err);
StWriter *st_writer_free(StWriter *w);
DEFINE_TRIVIAL_CLEANUP_FUNC(StWriter *, st_writer_free);
