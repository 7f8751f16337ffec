/* SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <string.h>

#include "json_excerpt.h"
#include "macro.h"

const char *json_excerpt(const cJSON *j, char *buf, size_t size)
{
        _cleanup_free_ char *s = cJSON_PrintUnformatted(j);

        if (!s)
                return "?";
        if (strlen(s) >= size && size > 4)
                snprintf(buf, size, "%.*s...", (int) size - 4, s);
        else
                snprintf(buf, size, "%s", s);
        return buf;
}
