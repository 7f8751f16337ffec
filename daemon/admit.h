/* SPDX-License-Identifier: MIT */
/* Admission of one submission record (DESIGN.md §4 step 3): the record is already a
 * private copy; this validates it, copies the bytes it references out of the data area
 * (shared memory in ring mode, the frame in socket mode) before anything reads them,
 * checks those copies, tokenizes or applies the chat template, and builds the
 * scheduler's request. Called on the I/O thread; the tokenizer is only read. */
#pragma once

#include <stdint.h>

#include "engine.h"
#include "error.h"
#include "scheduler.h"
#include "wire.h"

/* Builds the request for rec, whose refs point into data (data_size bytes). Returns 0 and
 * *ret; or a negative code with *ret_wire_code:
 *   0                        a protocol violation (malformed record or packed lists):
 *                            the caller disconnects the client;
 *   DS_WIRE_ERR_*            the request is refused; err holds the message for the
 *                            client's error record (it names the limit or the field).
 * ret->id, ->client, ->enqueue_usec and ->userdata are left for the caller. */
int admit_submit(Engine *e, const struct ds_wire_submit *rec, const uint8_t *data,
        uint32_t data_size, SchedRequest **ret, uint32_t *ret_wire_code, DsError *err);
