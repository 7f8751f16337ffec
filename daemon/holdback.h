/* SPDX-License-Identifier: MIT */
/* Output text held back because it might be the start of a stop string. Both generation
 * paths (engine_generate() and the scheduler) push each token's text through one of these,
 * so no partial stop string is ever emitted and the text before a stop string is emitted
 * exactly once. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Holdback {
        char *buf; /* (cap) text not emitted yet; the first len bytes are valid */
        size_t len, cap;
} Holdback;

/* Receives text that became final: whole UTF-8 characters, no part of a stop string. */
typedef void (*HoldbackEmit)(void *userdata, const char *text, size_t len);

/* Makes room for cap bytes now, so appends within it never allocate. 0 or -ENOMEM. */
int holdback_reserve(Holdback *h, size_t cap);
/* Grows the buffer when needed. 0 or -ENOMEM. */
int holdback_append(Holdback *h, const char *s, size_t n);
/* Emits what can no longer become part of one of the stop strings (everything when
 * final). Returns true when a stop string was found: the text before its first occurrence
 * was emitted and the rest dropped. */
bool holdback_release(Holdback *h, const char *const *stops, uint32_t n_stops, bool final,
        HoldbackEmit emit, void *userdata);
void holdback_done(Holdback *h);
