/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>

#include "kv_pool.h"

int kv_pool_init(KvPool *p, uint32_t n_blocks)
{
        *p = (KvPool){};
        p->free_ids = calloc(n_blocks ? n_blocks : 1, sizeof(uint32_t));
        if (!p->free_ids)
                return -ENOMEM;
        /* Hand out low ids first: the stack pops from the top. */
        for (uint32_t i = 0; i < n_blocks; i++)
                p->free_ids[i] = n_blocks - 1 - i;
        p->n_free = p->n_total = n_blocks;
        return 0;
}

void kv_pool_done(KvPool *p)
{
        free(p->free_ids);
        *p = (KvPool){};
}

int kv_pool_alloc(KvPool *p, uint32_t n, uint32_t *ret)
{
        if (n > p->n_free)
                return -ENOSPC;
        for (uint32_t i = 0; i < n; i++)
                ret[i] = p->free_ids[--p->n_free];
        return 0;
}

void kv_pool_release(KvPool *p, const uint32_t *ids, uint32_t n)
{
        for (uint32_t i = 0; i < n; i++) {
                assert(p->n_free < p->n_total);
                assert(ids[i] < p->n_total);
                p->free_ids[p->n_free++] = ids[i];
        }
}
