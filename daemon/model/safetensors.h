/* SPDX-License-Identifier: MIT */
/* safetensors files mapped read-only, and the set of them that one checkpoint directory
 * holds (a single model.safetensors, or shards named by model.safetensors.index.json).
 * Every check the reference reader makes is made here (shared/docs/formats.md). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef enum StDtype {
        ST_BOOL,
        ST_U8,
        ST_I8,
        ST_F8_E5M2,
        ST_F8_E4M3,
        ST_I16,
        ST_U16,
        ST_F16,
        ST_BF16,
        ST_I32,
        ST_U32,
        ST_F32,
        ST_F64,
        ST_I64,
        ST_U64,
        _ST_DTYPE_MAX,
        _ST_DTYPE_INVALID = -EINVAL,
} StDtype;

#define ST_MAX_DIMS   8
#define ST_HEADER_MAX 100000000ull

typedef struct StTensor {
        char *name;
        StDtype dtype;
        uint32_t n_dims;
        uint64_t shape[ST_MAX_DIMS];
        uint64_t numel;
        const void *data; /* inside the mapping; not necessarily aligned */
        uint64_t n_bytes;
        const char *file; /* path of the file that holds it, for messages */
} StTensor;

typedef struct StFile StFile;

/* Parses and validates a header held in memory (the fuzzer's entry point): buf is the
 * whole file. On success ret_tensors (sorted by name) point into buf. name is used only
 * in messages. */
int st_parse(const char *name, const uint8_t *buf, size_t size, StTensor **ret_tensors,
        size_t *ret_n, DsError *err);

/* Frees what st_parse returned. */
void st_tensors_free(StTensor *t, size_t n);

/* Maps path and parses it. */
int st_file_open(const char *path, StFile **ret, DsError *err);
StFile *st_file_free(StFile *f);
const StTensor *st_file_tensors(const StFile *f, size_t *ret_n);

typedef struct StArchive StArchive;

/* Opens DIR/model.safetensors.index.json (following its weight_map, checking that every
 * mapped tensor exists in the named shard and that no tensor is in two shards) or else
 * DIR/model.safetensors. */
int st_archive_open(const char *dir, StArchive **ret, DsError *err);
StArchive *st_archive_free(StArchive *a);
const StTensor *st_archive_find(const StArchive *a, const char *name);
/* All tensors, for inspection; stable order (by name). */
const StTensor *st_archive_tensor(const StArchive *a, size_t i);
size_t st_archive_size(const StArchive *a);
/* DIR/model.safetensors.index.json or DIR/model.safetensors, for messages. */
const char *st_archive_name(const StArchive *a);
/* How many safetensors files the archive maps (1, or the number of shards). */
size_t st_archive_n_files(const StArchive *a);

/* Reads a small text file (an index or a config, at most max bytes) into a NUL-terminated
 * buffer the caller frees. Errors name the path. */
int st_read_text(const char *path, size_t max, char **ret, size_t *ret_len, DsError *err);

const char *st_dtype_name(StDtype t);
size_t st_dtype_size(StDtype t);
