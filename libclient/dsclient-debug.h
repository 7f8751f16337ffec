/* SPDX-License-Identifier: MIT */
/* Test-only entry points of libdsclient: exported under the DSCLIENT_DEBUG version node,
 * not installed, no stability promise. The hostile-client tests use them to scribble on
 * their own segment and ring the daemon's doorbell. */
#pragma once

#include <stddef.h>

#include "dsclient.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The mapped segment of a ring-mode connection (its address and size) and the doorbell
 * eventfd, all still owned by c. Returns 0, -EINVAL, or -EOPNOTSUPP in socket mode. */
DS_PUBLIC int ds_debug_segment(ds_client *c, void **ret_addr, size_t *ret_size, int *ret_doorbell);

#ifdef __cplusplus
}
#endif
