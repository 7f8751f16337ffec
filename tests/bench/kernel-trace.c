/* SPDX-License-Identifier: MIT */
/* kernel-trace: a CUDA injection library that prints, when the process exits, what each
 * kernel adds to the critical path of a repeated step, graph replays included (the device
 * has no Nsight Systems; CUPTI's activity records give every kernel node's start and end):
 *
 *   CUDA_INJECTION64_PATH=build-dev/tests/bench/libkernel-trace.so \
 *     DSD_BENCH_ONLY=b1 build-dev/tests/bench/bench-cuda /tmp/q7
 *
 * A step runs from one launch of the kernel named by DSD_TRACE_STEP (default k_embed, the
 * first kernel of dsd's forward pass) to the next; the last DSD_TRACE_STEPS (default 8)
 * complete steps are summarised. A kernel's share of the critical path is its end minus
 * the latest end before it in the step, so kernels that overlap their predecessor (through
 * programmatic dependent launch) are charged only for what they add. Kernels overlap and
 * CUPTI adds time of its own, so the shares sum to the traced step, which runs slower than
 * an untraced one: compare shares, and take step times from untraced runs. DSD_TRACE_CSV
 * names a file for every record (start ns, duration ns, mangled name). */
#include <cupti.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct Rec {
        uint64_t start, end;
        const char *name; /* CUPTI's, valid for the life of the process */
} Rec;

static Rec *recs;
static size_t n_recs, cap_recs;
static bool lost;

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
        *size = (size_t) 8 << 20;
        *buf = aligned_alloc(8, *size);
        *max_records = 0;
}

static void CUPTIAPI buffer_completed(
        CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
        CUpti_Activity *r = NULL;
        (void) ctx;
        (void) stream;
        (void) size;
        while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
                if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
                        continue;
                const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *) r;
                if (n_recs == cap_recs) {
                        size_t cap = cap_recs ? 2 * cap_recs : 65536;
                        Rec *n = realloc(recs, cap * sizeof(*n));
                        if (!n) {
                                lost = true;
                                break;
                        }
                        recs = n;
                        cap_recs = cap;
                }
                recs[n_recs++] = (Rec){k->start, k->end, k->name};
        }
        free(buf);
}

static int by_start(const void *a, const void *b)
{
        const Rec *x = a, *y = b;
        return (x->start > y->start) - (x->start < y->start);
}

/* The readable part of a mangled name: _Z11k_attentionILj7EE... gives "k_attention<7>",
 * a plain name itself. */
static void short_name(const char *m, char *out, size_t n)
{
        char *end;
        if (strncmp(m, "_Z", 2) != 0) {
                snprintf(out, n, "%s", m);
                return;
        }
        unsigned long len = strtoul(m + 2, &end, 10);
        if (len == 0 || len >= n || strlen(end) < len) {
                snprintf(out, n, "%s", m);
                return;
        }
        memcpy(out, end, len);
        out[len] = '\0';
        const char *t = end + len;
        if (*t != 'I')
                return;
        /* template arguments: the literals' values (Lj7E, Lb1E), in order */
        size_t o = len;
        out[o++] = '<';
        for (t++; *t && *t != 'E' && o + 4 < n; t++) {
                if (*t != 'L')
                        continue;
                t += 2; /* the literal's type letter */
                if (out[o - 1] != '<')
                        out[o++] = ',';
                while (*t && *t != 'E' && o + 2 < n)
                        out[o++] = *t++;
        }
        out[o++] = '>';
        out[o] = '\0';
}

typedef struct Share {
        char name[96];
        uint32_t count;
        uint64_t crit, busy;
} Share;

static int by_crit(const void *a, const void *b)
{
        const Share *x = a, *y = b;
        return (x->crit < y->crit) - (x->crit > y->crit);
}

static void report(void)
{
        cuptiActivityFlushAll(1);
        const char *step = getenv("DSD_TRACE_STEP"), *csv = getenv("DSD_TRACE_CSV");
        const char *ns = getenv("DSD_TRACE_STEPS");
        if (!step || !*step)
                step = "k_embed";
        long want = ns ? strtol(ns, NULL, 10) : 8;
        if (want < 1)
                want = 8;
        qsort(recs, n_recs, sizeof(*recs), by_start);

        if (csv) {
                FILE *f = fopen(csv, "w");
                if (!f) {
                        fprintf(stderr, "kernel-trace: %s: cannot write\n", csv);
                } else {
                        for (size_t i = 0; i < n_recs; i++)
                                fprintf(f, "%llu,%llu,%s\n", (unsigned long long) recs[i].start,
                                        (unsigned long long) (recs[i].end - recs[i].start),
                                        recs[i].name);
                        fclose(f);
                }
        }

        /* the starts of the last want + 1 steps */
        size_t *marks = calloc((size_t) want + 1, sizeof(*marks)), n_marks = 0;
        Share *sh = calloc(256, sizeof(*sh));
        size_t n_sh = 0;
        if (!marks || !sh) {
                fprintf(stderr, "kernel-trace: out of memory\n");
                goto out;
        }
        for (size_t i = n_recs; i-- > 0 && n_marks < (size_t) want + 1;)
                if (strstr(recs[i].name, step))
                        marks[n_marks++] = i;
        if (n_marks < 2) {
                fprintf(stderr, "kernel-trace: %zu kernels, fewer than two named %s: no steps\n",
                        n_recs, step);
                goto out;
        }
        uint64_t total = 0;
        for (size_t s = n_marks - 1; s > 0; s--) {
                size_t a = marks[s], b = marks[s - 1];
                uint64_t last_end = recs[a].start;
                total += recs[b].start - recs[a].start;
                for (size_t i = a; i < b; i++) {
                        char nm[96];
                        short_name(recs[i].name, nm, sizeof(nm));
                        size_t k = 0;
                        while (k < n_sh && strcmp(sh[k].name, nm) != 0)
                                k++;
                        if (k == n_sh) {
                                if (n_sh == 256)
                                        continue;
                                snprintf(sh[n_sh++].name, sizeof(sh[0].name), "%s", nm);
                        }
                        sh[k].count++;
                        sh[k].busy += recs[i].end - recs[i].start;
                        if (recs[i].end > last_end) {
                                sh[k].crit += recs[i].end - last_end;
                                last_end = recs[i].end;
                        }
                }
        }
        double steps = (double) (n_marks - 1);
        qsort(sh, n_sh, sizeof(*sh), by_crit);
        fprintf(stderr, "kernel-trace: %.0f steps from %s, %.1f us a traced step%s\n", steps, step,
                (double) total / steps / 1e3, lost ? " (records lost: out of memory)" : "");
        fprintf(stderr, "%-40s %8s %12s %10s %10s\n", "kernel", "per step", "critical us",
                "us each", "busy each");
        for (size_t k = 0; k < n_sh; k++)
                fprintf(stderr, "%-40s %8.1f %12.1f %10.2f %10.2f\n", sh[k].name,
                        sh[k].count / steps, (double) sh[k].crit / steps / 1e3,
                        (double) sh[k].crit / sh[k].count / 1e3,
                        (double) sh[k].busy / sh[k].count / 1e3);
out:
        free(marks);
        free(sh);
        free(recs);
}

/* Called by the CUDA driver when CUDA_INJECTION64_PATH names this library. */
int InitializeInjection(void);

int InitializeInjection(void)
{
        if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
                cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
                fprintf(stderr, "kernel-trace: CUPTI activity tracing unavailable\n");
                return 0;
        }
        atexit(report);
        return 1;
}
