/* SPDX-License-Identifier: MIT */
/* A sequence's logits and samples do not depend on its batch, on the MoE fixtures: the
 * rows of one tile are routed to different experts, and each expert runs on a gathered
 * subset of them, so this is where batch identity could break. The CPU suite's
 * test-batch-identical.c is reused as is (8 sequences alone, then staggered in one batch
 * with chunked prompts and shuffled KV blocks, compared with memcmp); only its main,
 * which names the dense fixtures, is renamed out of the way. */
int cpu_batch_identical_main(void);
#define main cpu_batch_identical_main
#include "test-batch-identical.c"
#undef main

int main(void)
{
        check_fixture(test_shared("fixtures/tiny-deepseek-v2-awq"));
        check_fixture(test_shared("fixtures/tiny-deepseek-v3-awq"));
        return 0;
}
