/* SPDX-License-Identifier: MIT */
/* A JSON value rendered for an error message ("got ..."), cut to fit. */
#pragma once

#include <stddef.h>

#include <cjson/cJSON.h>

/* Writes j's compact JSON into buf (at most size bytes with the NUL, with "..." when cut)
 * and returns buf, or "?" when it cannot be rendered. */
const char *json_excerpt(const cJSON *j, char *buf, size_t size);
