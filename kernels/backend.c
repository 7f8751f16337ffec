/* SPDX-License-Identifier: MIT */
#include <string.h>

#include "backend.h"
#ifdef DSD_CUDA
#include "cuda_backend.h"
#endif

int bk_config_check(const BkModel *m, DsError *err)
{
        const BkConfig *c = &m->cfg;

        if ((unsigned) c->arch >= _BK_ARCH_MAX)
                return ds_error(err, -DS_ERR_UNSUPPORTED, "architecture %d", (int) c->arch);
        if (c->hidden == 0 || c->intermediate == 0 || c->n_layers == 0 || c->n_heads == 0 ||
                c->n_kv_heads == 0 || c->n_heads % c->n_kv_heads != 0 || c->head_dim == 0 ||
                c->head_dim % 2 != 0 || c->vocab_size == 0 || c->vocab_sample == 0 ||
                c->vocab_sample > c->vocab_size || c->max_positions == 0 || !m->layers)
                return ds_error(err, -DS_ERR_FORMAT, "inconsistent model dimensions");
        return 0;
}

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
