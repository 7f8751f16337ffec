/* SPDX-License-Identifier: MIT */
/* engine_generate's output gathered into one string, for the engine tests. */
#pragma once

#include <string.h>

#include "test_util.h"

typedef struct Collect {
        char buf[65536];
        size_t len;
        unsigned pieces;
} Collect;

/* A GenEmit: appends the piece to the Collect in userdata. */
static inline void collect(void *userdata, const char *text, size_t len)
{
        Collect *c = userdata;
        CHECK(c->len + len < sizeof(c->buf), "output too long");
        memcpy(c->buf + c->len, text, len);
        c->len += len;
        c->buf[c->len] = 0;
        c->pieces++;
}
