/* SPDX-License-Identifier: MIT */
/* The daemon's Prometheus metrics (text exposition format 0.0.4), every name prefixed
 * dsd_ and every series labelled with the model. One mutex guards the values: the I/O
 * thread feeds the engine's events in (metrics_on_event()) and samples the engine's
 * gauges, and renders for GET /metrics; nothing here blocks for long or logs. */
#pragma once

#include <stdint.h>

#include "macro.h"
#include "scheduler.h"
#include "strbuf.h"

typedef enum MetricHistogram {
        METRIC_TTFT,        /* enqueue to the first generated token */
        METRIC_INTER_TOKEN, /* between two tokens of one request, as the engine published */
        METRIC_E2E,         /* enqueue to the last event */
        METRIC_QUEUE,       /* enqueue to the first scheduled prefill chunk */
        _METRIC_HISTOGRAM_MAX,
} MetricHistogram;

typedef enum MetricGauge {
        METRIC_RUNNING, /* admitted requests */
        METRIC_WAITING, /* requests waiting for admission */
        METRIC_KV_BLOCKS_USED,
        METRIC_KV_BLOCKS_TOTAL,
        METRIC_KV_USAGE,        /* used / total, 0..1 */
        METRIC_GPU_MEMORY_USED, /* bytes of device memory dsd holds (0 on the CPU backend) */
        _METRIC_GAUGE_MAX,
} MetricGauge;

typedef enum MetricCounter {
        METRIC_PROMPT_TOKENS,
        METRIC_GENERATED_TOKENS,
        METRIC_PREEMPTIONS,
        METRIC_RELOADS,
        METRIC_CLIENT_VIOLATIONS, /* clients disconnected for breaking the protocol */
        _METRIC_COUNTER_MAX,
} MetricCounter;

/* Label values of dsd_requests_finished_total{reason}. */
typedef enum MetricReason {
        METRIC_REASON_LENGTH,
        METRIC_REASON_EOS,
        METRIC_REASON_STOP,
        METRIC_REASON_CANCELLED,
        METRIC_REASON_ERROR,
        _METRIC_REASON_MAX,
} MetricReason;

typedef struct Metrics Metrics;

/* model labels every series; it may contain any byte (escaped on output). */
int metrics_new(const char *model, Metrics **ret);
Metrics *metrics_free(Metrics *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(Metrics *, metrics_free);

/* After a reload: the label changes, the values go on. -ENOMEM leaves the old label. */
int metrics_set_model(Metrics *m, const char *model);

void metrics_observe(Metrics *m, MetricHistogram h, double seconds);
void metrics_set(Metrics *m, MetricGauge g, double v);
void metrics_add(Metrics *m, MetricCounter c, uint64_t n);

/* Accounts one engine event: a TOKEN counts a generated token and, with *last_token_ns
 * (the request's previous token's publish time, 0 before its first; kept by the caller
 * per request), an inter-token latency; a FINAL counts the prompt tokens, preemptions,
 * finish reason and the request's TTFT, queue and end-to-end times; an ERROR counts as
 * finished with reason error. */
void metrics_on_event(Metrics *m, const SchedEvent *ev, uint64_t *last_token_ns);

/* Appends the exposition text. 0 or -ENOMEM. */
int metrics_render(Metrics *m, StrBuf *out);

/* Appends v escaped as a label value (backslash, double quote and newline). */
int metrics_escape_label(StrBuf *out, const char *v);
