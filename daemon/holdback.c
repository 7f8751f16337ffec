/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "holdback.h"
#include "macro.h"

int holdback_reserve(Holdback *h, size_t cap)
{
        if (cap <= h->cap)
                return 0;
        char *b = realloc(h->buf, cap);
        if (!b)
                return -ENOMEM;
        h->buf = b;
        h->cap = cap;
        return 0;
}

int holdback_append(Holdback *h, const char *s, size_t n)
{
        int r;

        if (h->len + n > h->cap) {
                r = holdback_reserve(h, MAX(h->cap * 2, h->len + n + 256));
                if (r < 0)
                        return r;
        }
        if (n)
                memcpy(h->buf + h->len, s, n);
        h->len += n;
        return 0;
}

bool holdback_release(Holdback *h, const char *const *stops, uint32_t n_stops, bool final,
        HoldbackEmit emit, void *userdata)
{
        size_t cut = h->len, keep = 0;
        bool stopped = false;

        for (uint32_t i = 0; i < n_stops; i++) {
                const char *hit = memmem(h->buf, h->len, stops[i], strlen(stops[i]));
                if (hit && (size_t) (hit - h->buf) <= cut) {
                        cut = (size_t) (hit - h->buf);
                        stopped = true;
                }
        }
        if (!stopped && !final)
                /* Longest tail of the text that a stop string begins with. */
                for (uint32_t i = 0; i < n_stops; i++) {
                        size_t sl = strlen(stops[i]);
                        for (size_t k = MIN(sl - 1, h->len); k > keep; k--)
                                if (!memcmp(h->buf + h->len - k, stops[i], k)) {
                                        keep = k;
                                        break;
                                }
                }
        cut = stopped ? cut : h->len - keep;
        if (cut > 0 && emit)
                emit(userdata, h->buf, cut);
        if (stopped)
                h->len = 0;
        else if (cut > 0) {
                memmove(h->buf, h->buf + cut, h->len - cut);
                h->len -= cut;
        }
        return stopped;
}

void holdback_done(Holdback *h)
{
        free(h->buf);
        *h = (Holdback){};
}
