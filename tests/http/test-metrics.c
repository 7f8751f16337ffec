/* SPDX-License-Identifier: MIT */
/* Renders the metrics after a known set of events and prints the exposition text, which
 * check-exposition.py parses strictly and checks against the expected values. */
#include <stdio.h>
#include <string.h>

#include "metrics.h"
#include "test_util.h"

int main(void)
{
        Metrics *m;
        StrBuf b = {};
        uint64_t last = 0;

        CHECK(metrics_new("mod\"el\\x\ny", &m) == 0, "new");
        /* One request: three tokens 1 ms apart, then a FINAL by length. */
        for (int i = 0; i < 3; i++) {
                SchedEvent ev = {.type = SCHED_EV_TOKEN, .publish_ns = 1000000ull * (i + 1)};
                metrics_on_event(m, &ev, &last);
        }
        SchedEvent fin = {.type = SCHED_EV_FINAL,
                .finish = FINISH_LENGTH,
                .usage = {.prompt_tokens = 5,
                        .generated_tokens = 3,
                        .preemptions = 1,
                        .queue_usec = 2000,
                        .ttft_usec = 30000,
                        .total_usec = 50000}};
        metrics_on_event(m, &fin, &last);
        SchedEvent err = {.type = SCHED_EV_ERROR};
        metrics_on_event(m, &err, &last);
        metrics_add(m, METRIC_RELOADS, 2);
        metrics_add(m, METRIC_CLIENT_VIOLATIONS, 1);
        metrics_set(m, METRIC_KV_USAGE, 0.25);
        metrics_observe(m, METRIC_E2E, 1000); /* past the last bound: only +Inf */
        CHECK(metrics_render(m, &b) == 0, "render");
        fwrite(b.data, 1, b.len, stdout);
        strbuf_free(&b);
        metrics_free(m);
        return 0;
}
