/* SPDX-License-Identifier: MIT */
/* bench-handoff: what the decode chain's hand-offs cost alone (cuda_bench_handoff): a
 * cluster's all-to-all of one float a block by cluster.sync and by cl_send, a grid's
 * hand-off to the next with and without programmatic dependent launch, and a barrier of a
 * resident grid through a counter (a persistent kernel's hand-off). Exits 77 without a
 * device. */
#include <stdio.h>

#include "cuda_backend.h"
#include "test_util.h"

int main(void)
{
        if (!cuda_device_present()) {
                printf("SKIP: no CUDA device\n");
                return TEST_SKIP;
        }
        CudaHandoffBench r = {0};
        DsError err = {0};
        if (cuda_bench_handoff(&r, &err) < 0) {
                fprintf(stderr, "bench-handoff: %s\n", err.msg);
                return 1;
        }
        printf("cluster exchange, cycles a round (%.0f MHz):\n", r.clock_mhz);
        printf("%8s %12s %10s\n", "blocks", "cluster.sync", "cl_send");
        for (int i = 0; i < 3; i++)
                printf("%8u %12.0f %10.0f\n", r.cluster[i], r.sync_cycles[i], r.send_cycles[i]);
        printf("grid barrier through a counter, then a read of another block's word:\n");
        printf("%8s %10s %8s\n", "blocks", "cycles", "ns");
        for (int i = 0; i < 3; i++)
                printf("%8u %10.0f %8.0f\n", r.grid_blocks[i], r.grid_cycles[i],
                        r.grid_cycles[i] * 1e3 / r.clock_mhz);
        printf("grid hand-off after a 12 MB grid's last block: %.0f ns to the wait's return "
               "(programmatic), %.0f ns to the first block's start (plain launch)\n",
                r.pdl_ns, r.launch_ns);
        return 0;
}
