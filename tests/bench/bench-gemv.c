/* SPDX-License-Identifier: MIT */
/* bench-gemv: the INT4 GEMV alone (cuda_bench_awq), launches replayed from a CUDA graph with
 * the weights coming from DRAM: the Qwen2-7B and 32B linears (g128) at 1, 8 and 16 rows, the
 * DeepSeek-V2-Lite expert GEMV (64 experts, top-6, g64) at 1, 8 and 16 tokens, and the 7B
 * gate_up and down through the expert GEMV as one expert. Prints microseconds per launch
 * and the weight bytes read per second. Exits 77 without a device. */
#include <stdio.h>

#include "cuda_backend.h"
#include "test_util.h"

int main(void)
{
        static const struct {
                const char *name;
                uint32_t in, out, gs, experts, top_k;
        } shapes[] = {
                {"7B qkv", 3584, 4608, 128, 0, 0},
                {"7B o", 3584, 3584, 128, 0, 0},
                {"7B gate_up", 3584, 37888, 128, 0, 0},
                {"7B down", 18944, 3584, 128, 0, 0},
                {"32B qkv", 5120, 7168, 128, 0, 0},
                {"32B o", 5120, 5120, 128, 0, 0},
                {"32B gate_up", 5120, 55296, 128, 0, 0},
                {"32B down", 27648, 5120, 128, 0, 0},
                {"V2-Lite expert gate_up", 2048, 2816, 64, 64, 6},
                {"V2-Lite expert down", 1408, 2048, 64, 64, 6},
                /* the 7B matrices through the staged expert kernel, as one expert of one
                 * pair a token: is its shared-memory staging faster than the dense
                 * kernel's registers at 1 row? */
                {"7B gate_up, staged", 3584, 37888, 128, 1, 1},
                {"7B down, staged", 18944, 3584, 128, 1, 1},
        };
        static const uint32_t rows[] = {1, 8, 16};

        if (!cuda_device_present()) {
                printf("SKIP: no CUDA device\n");
                return TEST_SKIP;
        }
        printf("%-24s %5s %6s %9s %9s %8s\n", "shape", "rows", "splits", "us", "MB", "GB/s");
        for (size_t s = 0; s < ELEMENTSOF(shapes); s++)
                for (size_t r = 0; r < ELEMENTSOF(rows); r++) {
                        DsError err = {0};
                        double us = 0, bytes = 0;
                        uint32_t splits = 0;
                        int rc = cuda_bench_awq(shapes[s].in, shapes[s].out, shapes[s].gs, rows[r],
                                shapes[s].experts, shapes[s].top_k, &us, &bytes, &splits, &err);
                        if (rc < 0) {
                                fprintf(stderr, "bench-gemv: %s\n", err.msg);
                                return 1;
                        }
                        printf("%-24s %5u %6u %9.2f %9.2f %8.0f\n", shapes[s].name, rows[r], splits,
                                us, bytes / 1e6, bytes / us / 1e3);
                }
        return 0;
}
