/* SPDX-License-Identifier: MIT */
/* Small helpers for test programs: exit 0 to pass, 1 to fail, 77 to skip with a reason. */
#pragma once

#include <stdio.h>
#include <stdlib.h>

#define TEST_SKIP 77

#define CHECK(cond, ...)                                                                           \
        do {                                                                                       \
                if (!(cond)) {                                                                     \
                        fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);   \
                        fprintf(stderr, __VA_ARGS__);                                              \
                        fprintf(stderr, "\n");                                                     \
                        exit(1);                                                                   \
                }                                                                                  \
        } while (0)

/* $DSD_SHARED/rel, in a static buffer. The shared folder is required: a missing one fails
 * the test rather than skipping it, so that CI cannot pass without the references. */
static inline const char *test_shared(const char *rel)
{
        static char buf[4][4096];
        static int next;
        const char *dir = getenv("DSD_SHARED");
        if (!dir) {
                fprintf(stderr, "DSD_SHARED is not set; run through 'meson test'\n");
                exit(1);
        }
        char *b = buf[next++ % 4];
        snprintf(b, sizeof(buf[0]), "%s/%s", dir, rel);
        return b;
}

static inline const char *test_build(const char *rel)
{
        static char buf[4][4096];
        static int next;
        const char *dir = getenv("DSD_BUILD");
        if (!dir) {
                fprintf(stderr, "DSD_BUILD is not set; run through 'meson test'\n");
                exit(1);
        }
        char *b = buf[next++ % 4];
        snprintf(b, sizeof(buf[0]), "%s/%s", dir, rel);
        return b;
}
