/* SPDX-License-Identifier: MIT */
/* Writes a safetensors file the way the reference writer does: header padded with spaces
 * to a multiple of 8, tensors contiguous in the order added. The file appears under its
 * name only once complete: it is written to a temporary file in the same directory and
 * renamed. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "safetensors.h"

typedef struct StWriter StWriter;

/* Produces bytes [offset, offset + n_bytes) of one tensor into buf, at write time. The
 * writer asks for each tensor's bytes in order, in chunks of at most ST_WRITER_CHUNK
 * bytes that start at multiples of the dtype size, so a generator can stream tensors far
 * larger than memory. Returns 0 or a negative code with a message in err. */
typedef int (*StFillFn)(void *userdata, uint64_t offset, void *buf, size_t n_bytes, DsError *err);

#define ST_WRITER_CHUNK ((size_t) 8 << 20)

int st_writer_new(StWriter **ret);
/* Copies data (n_bytes must equal numel * dtype size). -EINVAL for a bad name, dtype or
 * shape, or a size mismatch; -EEXIST for a duplicate name. */
int st_writer_add(StWriter *w, const char *name, StDtype dtype, uint32_t n_dims,
        const uint64_t *shape, const void *data, size_t n_bytes);
/* Adds a tensor whose bytes fill() produces during st_writer_write(); userdata must stay
 * valid until then. Same errors as st_writer_add(). */
int st_writer_add_lazy(StWriter *w, const char *name, StDtype dtype, uint32_t n_dims,
        const uint64_t *shape, StFillFn fill, void *userdata);
/* Adds a string pair to the header's "__metadata__" (e.g. "format": "pt"). */
int st_writer_add_metadata(StWriter *w, const char *key, const char *value);
/* Writes the file; returns 0 or a negative errno with a message in err. */
int st_writer_write(StWriter *w, const char *path, DsError *err);
StWriter *st_writer_free(StWriter *w);
DEFINE_TRIVIAL_CLEANUP_FUNC(StWriter *, st_writer_free);
