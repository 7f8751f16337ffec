/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "kv_pool.h"
#include "test_util.h"

int main(void)
{
        KvPool p;
        uint32_t a[8], b[8];

        CHECK(kv_pool_init(&p, 8) == 0, "init");
        CHECK(kv_pool_alloc(&p, 5, a) == 0, "first allocation");
        CHECK(p.n_free == 3, "%u free", p.n_free);
        CHECK(kv_pool_alloc(&p, 4, b) == -ENOSPC, "over-allocation fails");
        CHECK(p.n_free == 3, "a failed allocation takes nothing (%u free)", p.n_free);
        CHECK(kv_pool_alloc(&p, 3, b) == 0, "the rest");

        bool seen[8] = {};
        for (int i = 0; i < 5; i++)
                seen[a[i]] = true;
        for (int i = 0; i < 3; i++) {
                CHECK(!seen[b[i]], "block %u handed out twice", b[i]);
                seen[b[i]] = true;
        }
        kv_pool_release(&p, a, 5);
        CHECK(p.n_free == 5, "release returns blocks");
        CHECK(kv_pool_alloc(&p, 5, b) == 0, "released blocks are reusable");
        kv_pool_done(&p);
        printf("1 passed, 0 failed\n");
        return 0;
}
