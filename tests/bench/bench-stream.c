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
 * The cases marked L2 read bytes that the launch before read too (40 MB at most, of the
 * H200's 60 MB L2): whether a weight matrix brought into L2 while DRAM idles, and kept
 * there, would then stream faster than from DRAM. Exits 77 without a device. */
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
                {"7B gate|up, 5 CTAs an SM", {MB(70.5), 660, 4, false}},
                {"7B gate|up, 4 CTAs an SM", {MB(70.5), 528, 5, false}},
                {"7B gate|up, 3 CTAs an SM", {MB(70.5), 396, 6, false}},
                {"7B gate|up, 2 CTAs an SM", {MB(70.5), 264, 8, false}},
                {"7B gate|up, 2 CTAs an SM", {MB(70.5), 264, 10, false}},
                {"7B gate|up, a CTA an SM", {MB(70.5), 132, 16, false}},
                {"7B gate|up, a CTA an SM", {MB(70.5), 132, 20, false}},
                {"32B gate|up, 5 CTAs an SM", {MB(150.2), 660, 4, false}},
                {"32B gate|up, 2 CTAs an SM", {MB(150.2), 264, 10, false}},
                {"7B MLP, 2 CTAs an SM", {MB(105.7), 264, 10, false}},
                {"7B MLP, a CTA a group", {MB(105.7), 148, 10, false}},
                {"7B MLP, a CTA a group", {MB(105.7), 148, 16, false}},
                {"V2-Lite MoE, 2 CTAs an SM", {MB(34.6), 264, 10, false}},
                {"V2-Lite MoE, a CTA a chunk", {MB(34.6), 176, 10, false}},
                {"V2-Lite MoE, a CTA a chunk", {MB(34.6), 176, 16, false}},
                {"V2-Lite MoE, a CTA 2 chunks", {MB(34.6), 88, 10, false}},
                {"V2-Lite MoE, a CTA 2 chunks", {MB(34.6), 88, 20, false}},
                {"V2-Lite MoE, 2 CTAs an SM", {MB(34.6), 264, 10, true}},
                {"7B down, 2 CTAs an SM", {MB(36.1), 264, 10, false}},
                {"7B down, 2 CTAs an SM", {MB(36.1), 264, 10, true}},
                {"24 MB, 2 CTAs an SM", {MB(24.0), 264, 10, false}},
                {"24 MB, 2 CTAs an SM", {MB(24.0), 264, 10, true}},
                {"7B o, 2 CTAs an SM", {MB(6.6), 224, 10, false}},
                {"7B o, 2 CTAs an SM", {MB(6.6), 224, 10, true}},
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
        printf("%-28s %5s %8s %6s %6s %8s %8s %7s\n", "grid", "from", "MB", "CTAs", "warps",
                "KB/CTA", "us", "TB/s");
        for (int i = 0; i < N; i++)
                printf("%-28s %5s %8.1f %6u %6u %8.0f %8.2f %7.2f\n", cases[i].what,
                        c[i].hot ? "L2" : "DRAM", c[i].bytes / 1e6, c[i].ctas, c[i].warps,
                        c[i].bytes / 1024.0 / c[i].ctas, c[i].us, c[i].tbs);
        return 0;
}
