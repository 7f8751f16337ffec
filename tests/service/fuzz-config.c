/* SPDX-License-Identifier: MIT */
/* config_parse on arbitrary bytes: refuse with a message naming the file, or accept a
 * configuration whose every field is in range and which survives config_to_json and a
 * second parse unchanged. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        _cleanup_free_ char *a = NULL, *b = NULL;
        DsdConfig c, again;
        DsError err = {};

        if (config_parse("fuzz/dsd.json", (const char *) data, size, &c, &err) < 0) {
                if (!memchr(err.msg, 0, sizeof(err.msg)) || strncmp(err.msg, "fuzz/dsd.json", 13)) {
                        fprintf(stderr, "message does not start with the file: '%s'\n", err.msg);
                        __builtin_trap();
                }
                return 0;
        }
        if (c.backend < 0 || c.backend >= _CONFIG_BACKEND_MAX || c.bus < 0 ||
                c.bus >= _CONFIG_BUS_MAX || c.device > 255 || c.limits.max_batch < 1 ||
                c.limits.max_batch > 1024 || !(c.limits.kv_memory_fraction > 0) ||
                c.limits.kv_memory_fraction > 1 || c.limits.client_max_requests < 1 ||
                c.socket_mode > 0777 || c.socket_path[0] != '/' ||
                c.n_allowed_uids > CONFIG_IDS_MAX || c.n_allowed_gids > CONFIG_IDS_MAX ||
                c.log_level < LOG_LVL_ERR || c.log_level > LOG_LVL_DEBUG ||
                (c.model[0] && c.model[0] != '/') || !memchr(c.model, 0, sizeof(c.model)))
                __builtin_trap();
        if (config_to_json(&c, &a) < 0)
                return 0; /* out of memory */
        if (config_parse("fuzz/again.json", a, strlen(a), &again, &err) < 0) {
                fprintf(stderr, "config_to_json output refused: %s\n%s\n", err.msg, a);
                __builtin_trap();
        }
        if (config_to_json(&again, &b) == 0 && strcmp(a, b) != 0)
                __builtin_trap();
        return 0;
}
