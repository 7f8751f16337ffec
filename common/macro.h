/* SPDX-License-Identifier: MIT */
/* Scope-bound cleanup and small helpers shared by every dsd library (after systemd's
 * macro-fundamental.h). Header-only, so ipc/ and kernels/ can use it without linking. */
#pragma once

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#define _cleanup_(f)   __attribute__((cleanup(f)))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _unused_       __attribute__((unused))
#define _likely_(x)    __builtin_expect(!!(x), 1)
#define _unlikely_(x)  __builtin_expect(!!(x), 0)

#define ELEMENTSOF(x) (sizeof(x) / sizeof((x)[0]))
#define MIN(a, b)     ((a) < (b) ? (a) : (b))
#define MAX(a, b)     ((a) > (b) ? (a) : (b))

/* Hand ownership on: the variable is left NULL / -EBADF so its cleanup does nothing. */
#define TAKE_PTR(p)                                                                                \
        ({                                                                                         \
                typeof(p) _tp = (p);                                                               \
                (p) = NULL;                                                                        \
                _tp;                                                                               \
        })
#define TAKE_FD(fd)                                                                                \
        ({                                                                                         \
                int _tf = (fd);                                                                    \
                (fd) = -EBADF;                                                                     \
                _tf;                                                                               \
        })

static inline void freep(void *p)
{
        free(*(void **) p);
}
#define _cleanup_free_ _cleanup_(freep)

static inline void closep(int *fd)
{
        if (*fd >= 0)
                close(*fd);
}
#define _cleanup_close_ _cleanup_(closep)

/* For a destructor `void f(T *)` that accepts NULL, defines `fp(T **)` for _cleanup_. */
#define DEFINE_TRIVIAL_CLEANUP_FUNC(type, func)                                                    \
        static inline void func##p(type *p)                                                        \
        {                                                                                          \
                if (*p)                                                                            \
                        func(*p);                                                                  \
        }
