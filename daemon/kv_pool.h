/* SPDX-License-Identifier: MIT */
/* Ids of the paged KV cache's blocks: which are free. The backend owns the memory; this
 * owns the bookkeeping, so the scheduler can hand blocks to sequences and take them
 * back without asking the device. */
#pragma once

#include <stdint.h>

typedef struct KvPool {
        uint32_t *free_ids; /* (n_total) stack of free block ids; the top n_free are valid */
        uint32_t n_free;
        uint32_t n_total;
} KvPool;

int kv_pool_init(KvPool *p, uint32_t n_blocks);
void kv_pool_done(KvPool *p);
/* Takes n blocks into ret (all or nothing): 0, or -ENOSPC when fewer are free. */
int kv_pool_alloc(KvPool *p, uint32_t n, uint32_t *ret);
void kv_pool_release(KvPool *p, const uint32_t *ids, uint32_t n);
