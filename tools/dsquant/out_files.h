/* SPDX-License-Identifier: MIT */
/* The small files of a model directory (config.json, tokenizer files), each written to a
 * temporary file beside it and renamed, like st_writer_write() does for the weights. */
#pragma once

#include <cjson/cJSON.h>

#include "error.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(cJSON *, cJSON_Delete);

/* Creates dir (one level) unless it already exists as a directory. */
int out_dir_prepare(const char *dir, DsError *err);
/* Writes len bytes of text to dir/name. */
int out_write_text(const char *dir, const char *name, const char *text, size_t len, DsError *err);
/* Writes json, indented, with a final newline, to dir/name. */
int out_write_json(const char *dir, const char *name, const cJSON *json, DsError *err);
