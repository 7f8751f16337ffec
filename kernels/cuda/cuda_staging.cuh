/* SPDX-License-Identifier: MIT */
/* Pinned host staging for the weight upload: two buffers allocated on the GPU's NUMA node
 * (libnuma; the node from /sys/bus/pci/devices/BUS/numa_node) and registered with CUDA, so
 * every byte of a checkpoint crosses PCIe by DMA from memory next to the GPU while the CPU
 * fills the other buffer. Without libnuma, or when the device reports no node, the
 * buffers come from cudaMallocHost. */
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>

extern "C" {
#include "error.h"
}

#define STAGING_BYTES ((size_t) 32 << 20)

typedef struct CuStaging {
        unsigned char *buf[2];
        cudaEvent_t done[2]; /* the copy out of buf[i] has finished */
        int cur;
        int node;  /* the NUMA node the buffers are on, -1 when not placed */
        bool numa; /* allocated by libnuma and registered, else cudaMallocHost */
} CuStaging;

/* Sets up s for CUDA device dev. 0, or a negative code with a message. */
int cu_staging_open(CuStaging *s, int dev, DsError *err);

/* dst (device) = src (host), bytes long, through the staging buffers on stream st: src may
 * be reused on return; dst is complete when st reaches this point. */
int cu_staging_copy(CuStaging *s, cudaStream_t st, void *dst, const void *src, size_t bytes,
        DsError *err);

/* Waits for the copies and releases the buffers; s may be zeroed or half open. */
void cu_staging_close(CuStaging *s);
