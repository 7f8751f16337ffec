/* SPDX-License-Identifier: MIT */
#include <string.h>

#include "backend.h"

const BackendOps *backend_find(const char *name)
{
        if (!name || !strcmp(name, "cpu") || !strcmp(name, "auto"))
                return &backend_cpu_ops;
        return NULL;
}
