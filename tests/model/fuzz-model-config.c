/* SPDX-License-Identifier: MIT */
/* model_config_parse on arbitrary bytes: refuse with a message naming the file, or accept a
 * configuration whose dimensions are consistent. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        BkConfig c;
        ModelInfo info;
        DsError err = {};

        if (model_config_parse("fuzz/config.json", (const char *) data, size, &c, &info, &err) <
                0) {
                if (!memchr(err.msg, 0, sizeof(err.msg)) || !strstr(err.msg, "fuzz/config.json")) {
                        fprintf(stderr, "message does not name the file: '%s'\n", err.msg);
                        __builtin_trap();
                }
                return 0;
        }
        if (c.hidden == 0 || c.n_heads == 0 || c.n_kv_heads == 0 || c.n_heads % c.n_kv_heads ||
                c.head_dim == 0 || c.head_dim % 2 || c.vocab_size == 0 ||
                c.vocab_sample != c.vocab_size || c.n_layers == 0 || !(c.rms_eps > 0) ||
                !(c.rope.theta > 0) || info.n_eos > 8 || info.bos_id >= (int32_t) c.vocab_size)
                __builtin_trap();
        if (c.rope.type == BK_ROPE_YARN && !(c.rope.attention_factor > 0))
                __builtin_trap();
        if (info.group_size && info.group_size != 32 && info.group_size != 64 &&
                info.group_size != 128)
                __builtin_trap();
        return 0;
}
