/* SPDX-License-Identifier: MIT */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#ifdef DSD_NUMA
#include <numa.h>
#endif

#include "cuda_staging.cuh"

/* The NUMA node sysfs gives the PCI device of CUDA device dev, or -1. */
static int device_node(int dev)
{
        char bus[32], path[96];
        int node = -1;

        if (cudaDeviceGetPCIBusId(bus, sizeof(bus), dev) != cudaSuccess)
                return -1;
        for (char *c = bus; *c; c++)
                *c = (char) tolower((unsigned char) *c);
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", bus);
        FILE *f = fopen(path, "re");
        if (!f)
                return -1;
        if (fscanf(f, "%d", &node) != 1)
                node = -1;
        fclose(f);
        return node;
}

static int staging_alloc(CuStaging *s, int i)
{
#ifdef DSD_NUMA
        if (s->numa) {
                void *p = numa_alloc_onnode(STAGING_BYTES, s->node);
                if (!p)
                        return -ENOMEM;
                if (cudaHostRegister(p, STAGING_BYTES, cudaHostRegisterDefault) != cudaSuccess) {
                        numa_free(p, STAGING_BYTES);
                        return -EIO;
                }
                s->buf[i] = (unsigned char *) p;
                return 0;
        }
#endif
        return cudaMallocHost((void **) &s->buf[i], STAGING_BYTES) == cudaSuccess ? 0 : -ENOMEM;
}

int cu_staging_open(CuStaging *s, int dev, DsError *err)
{
        memset(s, 0, sizeof(*s));
        s->node = device_node(dev);
#ifdef DSD_NUMA
        s->numa = s->node >= 0 && numa_available() >= 0;
#endif
        for (int i = 0; i < 2; i++) {
                int r = staging_alloc(s, i);
                if (r == 0 && cudaEventCreateWithFlags(&s->done[i], cudaEventDisableTiming) !=
                                      cudaSuccess)
                        r = -EIO;
                if (r < 0) {
                        cu_staging_close(s);
                        return ds_error(err, r,
                                "cuda backend: %zu bytes of pinned staging memory (NUMA node %d)",
                                STAGING_BYTES, s->node);
                }
        }
        if (!s->numa)
                s->node = -1;
        return 0;
}

int cu_staging_copy(CuStaging *s, cudaStream_t st, void *dst, const void *src, size_t bytes,
        DsError *err)
{
        for (size_t off = 0; off < bytes; off += STAGING_BYTES) {
                size_t n = bytes - off < STAGING_BYTES ? bytes - off : STAGING_BYTES;
                int i = s->cur;
                s->cur ^= 1;
                /* the DMA out of this buffer two chunks ago must be done before refilling */
                cudaError_t e = cudaEventSynchronize(s->done[i]);
                if (e == cudaSuccess) {
                        memcpy(s->buf[i], (const unsigned char *) src + off, n);
                        e = cudaMemcpyAsync((unsigned char *) dst + off, s->buf[i], n,
                                cudaMemcpyHostToDevice, st);
                }
                if (e == cudaSuccess)
                        e = cudaEventRecord(s->done[i], st);
                if (e != cudaSuccess)
                        return ds_error(err, -EIO, "cuda backend: staged upload: %s",
                                cudaGetErrorString(e));
        }
        return 0;
}

void cu_staging_close(CuStaging *s)
{
        for (int i = 0; i < 2; i++) {
                if (s->done[i]) {
                        cudaEventSynchronize(s->done[i]);
                        cudaEventDestroy(s->done[i]);
                }
                if (!s->buf[i])
                        continue;
#ifdef DSD_NUMA
                if (s->numa) {
                        cudaHostUnregister(s->buf[i]);
                        numa_free(s->buf[i], STAGING_BYTES);
                        continue;
                }
#endif
                cudaFreeHost(s->buf[i]);
        }
        memset(s, 0, sizeof(*s));
}
