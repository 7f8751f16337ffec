/* SPDX-License-Identifier: MIT */
/* st_parse on arbitrary bytes: it must refuse or accept without reading outside the input,
 * and every tensor it accepts must lie inside the input. */
#include <stdint.h>
#include <string.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        StTensor *t = NULL;
        DsError err = {};
        size_t n = 0;
        volatile uint8_t sink = 0;

        if (st_parse("fuzz.safetensors", data, size, &t, &n, &err) < 0) {
                if (!memchr(err.msg, 0, sizeof(err.msg)) || !strstr(err.msg, "fuzz.safetensors"))
                        __builtin_trap();
                return 0;
        }
        for (size_t i = 0; i < n; i++) {
                const uint8_t *p = t[i].data;
                if (p < data || t[i].n_bytes > size || p > data + size - t[i].n_bytes)
                        __builtin_trap();
                if (t[i].n_bytes)
                        sink ^= p[0] ^ p[t[i].n_bytes - 1];
                if (i > 0 && strcmp(t[i - 1].name, t[i].name) >= 0)
                        __builtin_trap();
        }
        (void) sink;
        st_tensors_free(t, n);
        return 0;
}
