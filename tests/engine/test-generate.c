/* SPDX-License-Identifier: MIT */
/* engine_generate on the synthetic model: stop strings cut the output exactly before
 * their first occurrence, max_tokens bounds it, and the streamed pieces add up to the
 * same text whatever the stop strings hold back. */
#include <string.h>

#include "engine.h"
#include "gen_text.h"

static bool utf8_start(unsigned char c)
{
        return (c & 0xc0) != 0x80;
}

int main(void)
{
        _cleanup_(engine_freep) Engine *e = NULL;
        static Collect full, cut, again;
        DsError err = {};
        GenResult res;

        CHECK(engine_open(test_build("models/tiny"), NULL, &e, &err) == 0, "%s", err.msg);

        GenParams gp = {.max_tokens = 48, .sampling = {.temperature = 0, .top_p = 1}};
        CHECK(engine_generate(e, "The quick brown fox", &gp, collect, &full, &res, &err) == 0, "%s",
                err.msg);
        CHECK(res.generated_tokens == 48 || res.finish == FINISH_EOS, "%u tokens, finish %s",
                res.generated_tokens, finish_reason_name(res.finish));
        CHECK(full.len >= 8, "only %zu bytes of output to pick a stop string from", full.len);

        /* A stop string taken from the middle of the output, starting on a character. */
        size_t at = full.len / 2;
        while (at > 0 && !utf8_start((unsigned char) full.buf[at]))
                at--;
        char stop[4] = {};
        size_t sl = 0;
        while (sl < 3 && at + sl < full.len)
                stop[sl] = full.buf[at + sl], sl++;
        while (sl > 1 && !utf8_start((unsigned char) full.buf[at + sl]) && at + sl < full.len)
                stop[--sl] = 0;
        const char *first = strstr(full.buf, stop);
        CHECK(first, "stop string not found");
        size_t expect = (size_t) (first - full.buf);

        const char *stops[] = {"never-generated-\x01", stop};
        gp.stops = stops;
        gp.n_stops = 2;
        CHECK(engine_generate(e, "The quick brown fox", &gp, collect, &cut, &res, &err) == 0, "%s",
                err.msg);
        CHECK(res.finish == FINISH_STOP, "finish %s", finish_reason_name(res.finish));
        CHECK(cut.len == expect && !memcmp(cut.buf, full.buf, expect),
                "stop '%s': got %zu bytes, want the %zu before its first occurrence", stop, cut.len,
                expect);

        /* A stop string that never matches holds text back but loses none of it. */
        const char *never[] = {"\x01\x02"};
        gp.stops = never;
        gp.n_stops = 1;
        CHECK(engine_generate(e, "The quick brown fox", &gp, collect, &again, &res, &err) == 0,
                "%s", err.msg);
        CHECK(again.len == full.len && !memcmp(again.buf, full.buf, full.len),
                "output changed under a stop string that never matches");

        /* The same engine serves one request after another: the KV blocks came back. */
        CHECK(e->kv.n_free == e->kv.n_total, "%u of %u KV blocks free", e->kv.n_free,
                e->kv.n_total);
        printf("1 passed, 0 failed\n");
        return 0;
}
