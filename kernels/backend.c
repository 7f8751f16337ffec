/* SPDX-License-Identifier: MIT */
#include <errno.h>
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

int bk_chain_resolve(const BkSeq *seqs, uint32_t n, const int32_t *prev_ids, uint32_t n_prev,
        BkSeq *out, int32_t *tok, DsError *err)
{
        for (uint32_t i = 0; i < n; i++) {
                out[i] = seqs[i];
                if (!seqs[i].chained)
                        continue;
                if (seqs[i].n_tokens != 1)
                        return ds_error(err, -EINVAL,
                                "sequence %u is chained but feeds %u tokens, not one", i,
                                seqs[i].n_tokens);
                if (seqs[i].prev >= n_prev || prev_ids[seqs[i].prev] < 0)
                        return ds_error(err, -EINVAL,
                                "sequence %u chains from sequence %u of the step before, which "
                                "sampled no id for it",
                                i, seqs[i].prev);
                tok[i] = prev_ids[seqs[i].prev];
                out[i].tokens = &tok[i];
                out[i].chained = false;
        }
        return 0;
}
