/* SPDX-License-Identifier: MIT */
#include <string.h>

#include "backend.h"
#ifdef DSD_CUDA
#include "cuda_backend.h"
#endif

const BackendOps *backend_find(const char *name)
{
        if (!name)
                name = "auto";
#ifdef DSD_CUDA
        if (!strcmp(name, "cuda") || !strcmp(name, "auto"))
                if (cuda_device_present())
                        return &backend_cuda_ops;
#endif
        if (!strcmp(name, "cpu") || !strcmp(name, "auto"))
                return &backend_cpu_ops;
        return NULL;
}
