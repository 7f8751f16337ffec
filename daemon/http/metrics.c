/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

/* Bucket bounds in seconds: latencies from a cached-prefix token to a long queue. */
static const double latency_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
        2.5, 5, 10, 20, 40, 80, 160, 320};
/* Inter-token latency is a decode step: finer at the low end. */
static const double itl_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01,
        0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5};
#define BUCKETS_MAX ELEMENTSOF(latency_bounds)

typedef struct Histogram {
        uint64_t buckets[BUCKETS_MAX]; /* not cumulative; summed when rendered */
        uint64_t count;                /* observations, +Inf bucket */
        double sum;
} Histogram;

static const struct {
        const char *name;
        const char *help;
        const double *bounds;
        size_t n_bounds;
} histograms[_METRIC_HISTOGRAM_MAX] = {
        [METRIC_TTFT] = {"dsd_time_to_first_token_seconds",
                "Time from receiving a request to its first generated token.", latency_bounds,
                ELEMENTSOF(latency_bounds)},
        [METRIC_INTER_TOKEN] = {"dsd_inter_token_latency_seconds",
                "Time between two consecutive tokens of one request.", itl_bounds,
                ELEMENTSOF(itl_bounds)},
        [METRIC_E2E] = {"dsd_e2e_request_latency_seconds",
                "Time from receiving a request to its end.", latency_bounds,
                ELEMENTSOF(latency_bounds)},
        [METRIC_QUEUE] = {"dsd_request_queue_time_seconds",
                "Time a request waited before its first prefill step.", latency_bounds,
                ELEMENTSOF(latency_bounds)},
};

static const struct {
        const char *name;
        const char *help;
} gauges[_METRIC_GAUGE_MAX] =
        {
                [METRIC_RUNNING] = {"dsd_requests_running", "Requests admitted to the batch."},
                [METRIC_WAITING] = {"dsd_requests_waiting", "Requests waiting for admission."},
                [METRIC_KV_BLOCKS_USED] = {"dsd_kv_cache_blocks_used", "KV-cache blocks in use."},
                [METRIC_KV_BLOCKS_TOTAL] = {"dsd_kv_cache_blocks_total", "KV-cache blocks in all."},
                [METRIC_KV_USAGE] = {"dsd_kv_cache_usage_ratio",
                        "Fraction of the KV-cache blocks in use, 0 to 1."},
                [METRIC_GPU_MEMORY_USED] = {"dsd_gpu_memory_used_bytes",
                        "Device memory held by dsd (weights and KV cache); 0 on the CPU backend."},
},
  counters[_METRIC_COUNTER_MAX] = {
          [METRIC_PROMPT_TOKENS] = {"dsd_prompt_tokens_total",
                  "Prompt tokens of finished requests."},
          [METRIC_GENERATED_TOKENS] = {"dsd_generation_tokens_total", "Generated tokens."},
          [METRIC_PREEMPTIONS] = {"dsd_preemptions_total",
                  "Times a request was preempted and recomputed."},
          [METRIC_RELOADS] = {"dsd_reloads_total", "Model or configuration reloads."},
          [METRIC_CLIENT_VIOLATIONS] = {"dsd_client_violations_total",
                  "Clients disconnected for breaking the protocol."},
};

static const char *const reason_names[_METRIC_REASON_MAX] = {
        [METRIC_REASON_LENGTH] = "length",
        [METRIC_REASON_EOS] = "eos",
        [METRIC_REASON_STOP] = "stop",
        [METRIC_REASON_CANCELLED] = "cancelled",
        [METRIC_REASON_ERROR] = "error",
};

struct Metrics {
        pthread_mutex_t lock; /* guards everything below */
        char *model;
        Histogram hist[_METRIC_HISTOGRAM_MAX];
        double gauge[_METRIC_GAUGE_MAX];
        uint64_t counter[_METRIC_COUNTER_MAX];
        uint64_t finished[_METRIC_REASON_MAX];
};

int metrics_new(const char *model, Metrics **ret)
{
        Metrics *m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;
        m->model = strdup(model ? model : "");
        if (!m->model) {
                free(m);
                return -ENOMEM;
        }
        pthread_mutex_init(&m->lock, NULL);
        *ret = m;
        return 0;
}

Metrics *metrics_free(Metrics *m)
{
        if (!m)
                return NULL;
        pthread_mutex_destroy(&m->lock);
        free(m->model);
        free(m);
        return NULL;
}

int metrics_set_model(Metrics *m, const char *model)
{
        char *s = strdup(model ? model : "");
        if (!s)
                return -ENOMEM;
        pthread_mutex_lock(&m->lock);
        free(m->model);
        m->model = s;
        pthread_mutex_unlock(&m->lock);
        return 0;
}

static void observe_locked(Metrics *m, MetricHistogram h, double v)
{
        Histogram *x = &m->hist[h];

        /* Bucket i counts v <= bounds[i] and > bounds[i-1]; past the last: only +Inf. */
        for (size_t i = 0; i < histograms[h].n_bounds; i++)
                if (v <= histograms[h].bounds[i]) {
                        x->buckets[i]++;
                        break;
                }
        x->count++;
        x->sum += v;
}

void metrics_observe(Metrics *m, MetricHistogram h, double seconds)
{
        assert(h >= 0 && h < _METRIC_HISTOGRAM_MAX);
        if (!isfinite(seconds) || seconds < 0)
                return;
        pthread_mutex_lock(&m->lock);
        observe_locked(m, h, seconds);
        pthread_mutex_unlock(&m->lock);
}

void metrics_set(Metrics *m, MetricGauge g, double v)
{
        assert(g >= 0 && g < _METRIC_GAUGE_MAX);
        pthread_mutex_lock(&m->lock);
        m->gauge[g] = v;
        pthread_mutex_unlock(&m->lock);
}

void metrics_add(Metrics *m, MetricCounter c, uint64_t n)
{
        assert(c >= 0 && c < _METRIC_COUNTER_MAX);
        pthread_mutex_lock(&m->lock);
        m->counter[c] += n;
        pthread_mutex_unlock(&m->lock);
}

static MetricReason reason_of(FinishReason f)
{
        switch (f) {
        case FINISH_LENGTH:
                return METRIC_REASON_LENGTH;
        case FINISH_EOS:
                return METRIC_REASON_EOS;
        case FINISH_STOP:
                return METRIC_REASON_STOP;
        default:
                return METRIC_REASON_CANCELLED;
        }
}

void metrics_on_event(Metrics *m, const SchedEvent *ev, uint64_t *last_token_ns)
{
        pthread_mutex_lock(&m->lock);
        switch (ev->type) {
        case SCHED_EV_TOKEN:
                m->counter[METRIC_GENERATED_TOKENS]++;
                if (*last_token_ns && ev->publish_ns >= *last_token_ns)
                        observe_locked(m, METRIC_INTER_TOKEN,
                                (double) (ev->publish_ns - *last_token_ns) * 1e-9);
                *last_token_ns = ev->publish_ns;
                break;
        case SCHED_EV_FINAL:
                m->counter[METRIC_PROMPT_TOKENS] += ev->usage.prompt_tokens;
                m->counter[METRIC_PREEMPTIONS] += ev->usage.preemptions;
                m->finished[reason_of(ev->finish)]++;
                if (ev->usage.generated_tokens > 0)
                        observe_locked(m, METRIC_TTFT, (double) ev->usage.ttft_usec * 1e-6);
                /* A request cancelled before its first step was never scheduled. */
                if (ev->usage.queue_usec > 0 || ev->finish != FINISH_CANCELLED)
                        observe_locked(m, METRIC_QUEUE, (double) ev->usage.queue_usec * 1e-6);
                observe_locked(m, METRIC_E2E, (double) ev->usage.total_usec * 1e-6);
                break;
        case SCHED_EV_ERROR:
                m->finished[METRIC_REASON_ERROR]++;
                break;
        default:
                break;
        }
        pthread_mutex_unlock(&m->lock);
}

int metrics_escape_label(StrBuf *out, const char *v)
{
        int r = 0;
        for (const char *c = v; r >= 0 && *c; c++) {
                if (*c == '\\')
                        r = strbuf_puts(out, "\\\\");
                else if (*c == '"')
                        r = strbuf_puts(out, "\\\"");
                else if (*c == '\n')
                        r = strbuf_puts(out, "\\n");
                else
                        r = strbuf_append(out, c, 1);
        }
        return r;
}

/* A sample value: Prometheus reads Go's float syntax; %.17g round-trips a double. */
static int value(StrBuf *out, double v)
{
        if (isnan(v))
                return strbuf_puts(out, "NaN");
        if (isinf(v))
                return strbuf_puts(out, v > 0 ? "+Inf" : "-Inf");
        return strbuf_printf(out, "%.17g", v);
}

static int family(StrBuf *out, const char *name, const char *help, const char *type)
{
        return strbuf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{model="..."[,extra]} */
static int series(StrBuf *out, const char *name, const char *model, const char *extra)
{
        int r = strbuf_printf(out, "%s{model=\"", name);
        r = r ?: metrics_escape_label(out, model);
        r = r ?: strbuf_puts(out, "\"");
        if (extra)
                r = r ?: strbuf_printf(out, ",%s", extra);
        return r ?: strbuf_puts(out, "} ");
}

static int render_locked(Metrics *m, StrBuf *out)
{
        int r = 0;

        for (int h = 0; r >= 0 && h < _METRIC_HISTOGRAM_MAX; h++) {
                const Histogram *x = &m->hist[h];
                char name[128], le[64];
                uint64_t cum = 0;

                r = r ?: family(out, histograms[h].name, histograms[h].help, "histogram");
                snprintf(name, sizeof(name), "%s_bucket", histograms[h].name);
                for (size_t i = 0; r >= 0 && i < histograms[h].n_bounds; i++) {
                        cum += x->buckets[i];
                        snprintf(le, sizeof(le), "le=\"%.17g\"", histograms[h].bounds[i]);
                        r = r ?: series(out, name, m->model, le);
                        r = r ?: strbuf_printf(out, "%" PRIu64 "\n", cum);
                }
                r = r ?: series(out, name, m->model, "le=\"+Inf\"");
                r = r ?: strbuf_printf(out, "%" PRIu64 "\n", x->count);
                snprintf(name, sizeof(name), "%s_sum", histograms[h].name);
                r = r ?: series(out, name, m->model, NULL);
                r = r ?: value(out, x->sum);
                r = r ?: strbuf_puts(out, "\n");
                snprintf(name, sizeof(name), "%s_count", histograms[h].name);
                r = r ?: series(out, name, m->model, NULL);
                r = r ?: strbuf_printf(out, "%" PRIu64 "\n", x->count);
        }
        for (int g = 0; r >= 0 && g < _METRIC_GAUGE_MAX; g++) {
                r = r ?: family(out, gauges[g].name, gauges[g].help, "gauge");
                r = r ?: series(out, gauges[g].name, m->model, NULL);
                r = r ?: value(out, m->gauge[g]);
                r = r ?: strbuf_puts(out, "\n");
        }
        for (int c = 0; r >= 0 && c < _METRIC_COUNTER_MAX; c++) {
                r = r ?: family(out, counters[c].name, counters[c].help, "counter");
                r = r ?: series(out, counters[c].name, m->model, NULL);
                r = r ?: strbuf_printf(out, "%" PRIu64 "\n", m->counter[c]);
        }
        r = r
                    ?: family(out, "dsd_requests_finished_total", "Finished requests by reason.",
                               "counter");
        for (int i = 0; r >= 0 && i < _METRIC_REASON_MAX; i++) {
                char label[64];
                snprintf(label, sizeof(label), "reason=\"%s\"", reason_names[i]);
                r = r ?: series(out, "dsd_requests_finished_total", m->model, label);
                r = r ?: strbuf_printf(out, "%" PRIu64 "\n", m->finished[i]);
        }
        return r;
}

int metrics_render(Metrics *m, StrBuf *out)
{
        pthread_mutex_lock(&m->lock);
        int r = render_locked(m, out);
        pthread_mutex_unlock(&m->lock);
        return r;
}
