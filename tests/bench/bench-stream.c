/* SPDX-License-Identifier: MIT */
/* bench-stream: how fast grids of a few shapes stream a layer's weights with the GEMVs' load
 * pattern and no arithmetic (cuda_bench_stream). The fused-MoE proposal of
 * docs/design-notes.md needs to know whether a V2-Lite MoE layer's 34.6 MB (8 pairs of a
 * gate, an up and a down of 2048 x 1408 at 4 bits) read by one CTA a (pair, run of
 * intermediate chunks) streams as fast as by a GEMV's grid: 176 CTAs for runs of one chunk of
 * 64, 88 for runs of two. The same for a 7B dense MLP (105.7 MB) in one CTA an AWQ group of
 * 128 intermediate columns (148). 264 and 660 CTAs are the H200's 132 SMs at two CTAs of 10
 * warps (cu_gemv_res's shape) and five of 4 (k_gemv_qx's resident gate|up), for comparison.
 * The 7B and 32B gate|up's bytes also go through one to five CTAs an SM of as many warps in
 * all: whether another shape of resident CTAs would stream them faster than k_gemv_qx's.
 * The last cases ask whether a matrix brought into L2 while DRAM idles (read, or prefetched
 * in bulk, plain or marked evict_last) streams faster than from DRAM, and whether it is still
 * there after another matrix's stream: 7B's down (36.1 MB) after its gate|up (70.5 MB), of
 * the H200's 60 MB L2. Exits 77 without a device. */
#include <stdio.h>

#include "cuda_backend.h"
#include "test_util.h"

#define MB(x) ((size_t) ((x) *1e6))

int main(void)
{
        if (!cuda_device_present()) {
                printf("SKIP: no CUDA device\n");
                return TEST_SKIP;
        }
        static const struct {
                const char *what;
                CudaStreamCase c;
        } cases[] = {
                {"7B gate|up, 5 CTAs an SM", {MB(70.5), 660, 4}},
                {"7B gate|up, 4 CTAs an SM", {MB(70.5), 528, 5}},
                {"7B gate|up, 3 CTAs an SM", {MB(70.5), 396, 6}},
                {"7B gate|up, 2 CTAs an SM", {MB(70.5), 264, 8}},
                {"7B gate|up, 2 CTAs an SM", {MB(70.5), 264, 10}},
                {"7B gate|up, a CTA an SM", {MB(70.5), 132, 16}},
                {"7B gate|up, a CTA an SM", {MB(70.5), 132, 20}},
                {"32B gate|up, 5 CTAs an SM", {MB(150.2), 660, 4}},
                {"32B gate|up, 2 CTAs an SM", {MB(150.2), 264, 10}},
                {"7B MLP, 2 CTAs an SM", {MB(105.7), 264, 10}},
                {"7B MLP, a CTA a group", {MB(105.7), 148, 10}},
                {"7B MLP, a CTA a group", {MB(105.7), 148, 16}},
                {"V2-Lite MoE, 2 CTAs an SM", {MB(34.6), 264, 10}},
                {"V2-Lite MoE, a CTA a chunk", {MB(34.6), 176, 10}},
                {"V2-Lite MoE, a CTA a chunk", {MB(34.6), 176, 16}},
                {"V2-Lite MoE, a CTA 2 chunks", {MB(34.6), 88, 10}},
                {"V2-Lite MoE, a CTA 2 chunks", {MB(34.6), 88, 20}},
                {"V2-Lite MoE, 2 CTAs an SM", {MB(34.6), 264, 10, STREAM_READ}},
                {"7B o, 2 CTAs an SM", {MB(6.6), 224, 10}},
                {"7B o, 2 CTAs an SM", {MB(6.6), 224, 10, STREAM_READ}},
                {"24 MB, 2 CTAs an SM", {MB(24.0), 264, 10}},
                {"24 MB, 2 CTAs an SM", {MB(24.0), 264, 10, STREAM_READ}},
                {"24 MB, 2 CTAs an SM", {MB(24.0), 264, 10, STREAM_KEEP, MB(70.5)}},
                {"7B down, 2 CTAs an SM", {MB(36.1), 264, 10}},
                {"7B down, 2 CTAs an SM", {MB(36.1), 264, 10, STREAM_READ}},
                {"7B down, 2 CTAs an SM", {MB(36.1), 264, 10, STREAM_PREFETCH}},
                {"7B down, 2 CTAs an SM", {MB(36.1), 264, 10, STREAM_KEEP}},
                {"7B down, 2 CTAs an SM", {MB(36.1), 264, 10, STREAM_READ, MB(70.5)}},
                {"7B down, 2 CTAs an SM", {MB(36.1), 264, 10, STREAM_PREFETCH, MB(70.5)}},
                {"7B down, 2 CTAs an SM", {MB(36.1), 264, 10, STREAM_KEEP, MB(70.5)}},
                {"7B down, 2 CTAs an SM", {MB(36.1), 264, 10, STREAM_NOTHING, MB(70.5)}},
        };
        enum { N = sizeof(cases) / sizeof(cases[0]) };
        CudaStreamCase c[N];
        for (int i = 0; i < N; i++)
                c[i] = cases[i].c;
        DsError err = {0};
        if (cuda_bench_stream(c, N, &err) < 0) {
                fprintf(stderr, "bench-stream: %s\n", err.msg);
                return 1;
        }
        static const char *const before[] = {"-", "read", "prefetch", "kept"};
        printf("%-28s %8s %6s %6s %8s %8s %8s %8s %7s\n", "grid", "MB", "CTAs", "warps", "KB/CTA",
                "before", "MB then", "us", "TB/s");
        for (int i = 0; i < N; i++)
                printf("%-28s %8.1f %6u %6u %8.0f %8s %8.1f %8.2f %7.2f\n", cases[i].what,
                        c[i].bytes / 1e6, c[i].ctas, c[i].warps, c[i].bytes / 1024.0 / c[i].ctas,
                        before[c[i].before], c[i].between / 1e6, c[i].us, c[i].tbs);
        return 0;
}
