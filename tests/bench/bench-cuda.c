/* SPDX-License-Identifier: MIT */
/* bench-cuda MODEL_DIR: the CUDA backend on one checkpoint (a `dsquant synth` shape):
 * load time, GPU memory, device copy bandwidth measured in the same run, prefill of 512
 * and 2048 tokens (TTFT at 2048), and decode tokens/s at batch 1, 8, 32, 64, 128 with
 * 512-token contexts, and the bytes a batch-1 step reads (for MoE, of the experts it
 * touches) against the copy bandwidth. Prefill times are wall-clock medians of whole step()
 * calls after warm-up. Decode steps run as dsd's scheduler runs them: each submitted before
 * the one before is collected, its tokens chained on the device (BkSeq.chained), and a
 * step's time is the median of DECODE intervals between consecutive collects, after a
 * warm-up of WARMUP steps and WARMUP_S seconds at least (the graph of each bucket is
 * captured during warm-up). Then each decode batch's graph replayed back
 * to back (cuda_bench_replay, the mean of DECODE replays): the step without the host's
 * part, whose difference from the step is what the host still adds. Exits 77 without a
 * device or without a model directory.
 *
 * For profiling one phase at a time (nsys, ncu), DSD_BENCH_ONLY names what runs, e.g.
 * "p2048" or "b1,b64": prefill lengths p512/p2048 and decode batches bN; what is skipped
 * prints as 0. Prefill 512 still runs when a decode batch is asked for: it fills the
 * shared prefix. Each phase is an NVTX range of its name (ncu --nvtx --nvtx-include
 * "b1/"), and DSD_BENCH_DEVICE is passed as BkOptions.device ("eager" for per-kernel
 * profiling, "no-pdl" for decode graphs without programmatic edges). DSD_BENCH_SAMPLING
 * (any value) makes decode steps sample with temperature 0.8 and top-p 0.9 instead of
 * greedily, to price sampling on the device. DSD_BENCH_UNCHAINED (any value) runs each decode
 * step through step() instead, its ids back on the host before the next is planned, to
 * price the chaining. DSD_BENCH_LM_HEAD_INT8 (any value) loads the lm_head quantized to 8
 * bits (ModelOptions.lm_head_int8). */
#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_backend.h"
#include "model.h"
#include "q8_pack.h"
#include "test_util.h"

#define BT     16
#define CTX    512
#define DECODE 32
/* Decode steps, and seconds, at least before the measured ones: after the prefill phase
 * steps run up to 13% slower for tens of ms, for a reason not known (PERF.md, thirteenth
 * session). */
#define WARMUP   3
#define WARMUP_S 0.1
#define PRIVATE  8 /* blocks of decoded positions per sequence */

/* Sequence s's sampling in decode steps (see DSD_BENCH_SAMPLING). */
static BkSampling decode_sampling(uint32_t s)
{
        if (!getenv("DSD_BENCH_SAMPLING"))
                return (BkSampling){.repetition_penalty = 1};
        return (BkSampling){.temperature = 0.8f, .top_p = 0.9f, .repetition_penalty = 1, .seed = s};
}

/* True when phase (e.g. "b64") is to run: DSD_BENCH_ONLY unset, or naming it. */
static bool phase_on(const char *phase)
{
        const char *only = getenv("DSD_BENCH_ONLY");
        if (!only || !*only)
                return true;
        size_t n = strlen(phase);
        for (const char *p = only; (p = strstr(p, phase)) != NULL; p += n)
                if ((p == only || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
                        return true;
        return false;
}

static double now_s(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
        double x = *(const double *) a, y = *(const double *) b;
        return (x > y) - (x < y);
}

static double median(double *v, int n)
{
        qsort(v, (size_t) n, sizeof(double), cmp_d);
        return v[n / 2];
}

/* Device-to-device copy of 2 GiB, bytes read + written per second, median of 10. */
static double copy_bandwidth(void)
{
        size_t n = (size_t) 2 << 30;
        void *a, *b;
        cudaEvent_t e0, e1;
        double t[10];

        CHECK(cudaMalloc(&a, n) == cudaSuccess && cudaMalloc(&b, n) == cudaSuccess, "malloc");
        cudaMemset(a, 1, n);
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        for (int i = 0; i < 12; i++) {
                cudaEventRecord(e0, 0);
                cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
                cudaEventRecord(e1, 0);
                cudaEventSynchronize(e1);
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                if (i >= 2)
                        t[i - 2] = 2.0 * n / (ms * 1e-3);
        }
        cudaFree(a);
        cudaFree(b);
        return median(t, 10);
}

static double linear_bytes(const BkLinear *x)
{
        if (x->kind == BK_LINEAR_AWQ)
                return (double) x->in * x->out / 2 + (double) x->in / x->group_size * x->out * 4;
        if (x->kind == BK_LINEAR_Q8)
                return (double) x->in * x->out + (double) x->in / x->group_size * x->out * 4;
        return (double) x->in * x->out * 2;
}

static double expert_bytes(const BkExpert *e)
{
        return linear_bytes(&e->gate) + linear_bytes(&e->up) + linear_bytes(&e->down);
}

/* Bytes a batch-1 decode step reads: every weight it uses once (in a MoE layer the router,
 * top_k routed experts and the shared experts; MLA's kv_b_proj as the FP16 W_UK and W_UV),
 * plus the KV cache of ctx tokens. */
static double step_bytes(const BkModel *m, uint64_t kv_per_token, uint32_t ctx)
{
        const BkConfig *c = &m->cfg;
        bool mla = bk_is_mla(c);
        double bytes = linear_bytes(&m->lm_head);
        for (uint32_t l = 0; l < c->n_layers; l++) {
                const BkLayer *L = &m->layers[l];
                bytes += linear_bytes(&L->o);
                if (!mla) {
                        const BkExpert mlp = {L->gate, L->up, L->down};
                        bytes += linear_bytes(&L->q) + linear_bytes(&L->k) + linear_bytes(&L->v) +
                                 expert_bytes(&mlp);
                        continue;
                }
                const BkMlaConfig *a = &c->mla;
                bytes += c->mla.q_lora_rank ? linear_bytes(&L->mla.q_a) + linear_bytes(&L->mla.q_b)
                                            : linear_bytes(&L->q);
                bytes += linear_bytes(&L->mla.kv_a) + (double) c->n_heads *
                                                              (a->qk_nope_dim + a->v_head_dim) *
                                                              a->kv_lora_rank * 2;
                if (!L->moe.experts) {
                        const BkExpert mlp = {L->gate, L->up, L->down};
                        bytes += expert_bytes(&mlp);
                        continue;
                }
                bytes += (double) c->moe.n_routed * c->hidden * 2 +
                         c->moe.top_k * expert_bytes(&L->moe.experts[0]);
                if (c->moe.n_shared)
                        bytes += expert_bytes(&L->moe.shared);
        }
        return bytes + (double) kv_per_token * ctx;
}

int main(int argc, char **argv)
{
        const BackendOps *ops = &backend_cuda_ops;
        DsError err = {0};
        Model *model = NULL;
        Backend *b = NULL;
        size_t free0, free1, total;

        if (argc < 2) {
                printf("SKIP: usage: bench-cuda MODEL_DIR\n");
                return TEST_SKIP;
        }
        if (!cuda_device_present()) {
                printf("SKIP: no CUDA device\n");
                return TEST_SKIP;
        }
        struct cudaDeviceProp prop;
        cudaGetDeviceProperties(&prop, 0);
        double bw = copy_bandwidth();
        cudaMemGetInfo(&free0, &total);

        double t0 = now_s();
        ModelOptions mopt = {.lm_head_int8 = getenv("DSD_BENCH_LM_HEAD_INT8") != NULL};
        CHECK(model_load(argv[1], &mopt, &model, &err) == 0, "%s", err.msg);
        double t_map = now_s() - t0;
        CHECK(ops->create(&(BkOptions){.device = getenv("DSD_BENCH_DEVICE")}, &b, &err) == 0, "%s",
                err.msg);
        CHECK(ops->load(b, &model->bk, &err) == 0, "%s", err.msg);
        double t_load = now_s() - t0;
        cudaMemGetInfo(&free1, &total);
        const BkConfig *c = &model->bk.cfg;

        uint64_t kvt = ops->kv_bytes_per_token(b);
        /* blocks 0..127 for the prompt; each decoding sequence shares its first CTX / BT
         * and owns PRIVATE more */
        uint32_t blocks_per_seq = CTX / BT + PRIVATE;
        uint64_t n_blocks = 2048 / BT + (uint64_t) 128 * PRIVATE;
        CHECK(ops->kv_init(b, BT, n_blocks * BT * kvt, &err) == (int64_t) n_blocks, "%s", err.msg);

        int32_t *prompt = calloc(2048, sizeof(int32_t));
        uint32_t *blocks = calloc(2048 / BT, sizeof(uint32_t));
        for (uint32_t i = 0; i < 2048; i++)
                prompt[i] = (int32_t) ((i * 7919u + 13u) % c->vocab_sample);
        for (uint32_t i = 0; i < 2048 / BT; i++)
                blocks[i] = i;

        /* prefill */
        static const uint32_t batches[] = {1, 8, 32, 64, 128};
        double pf[2] = {0}, pf_tps[2] = {0};
        uint32_t lens[2] = {512, 2048};
        bool any_decode = false;
        for (size_t k = 0; k < ELEMENTSOF(batches); k++) {
                char name[16];
                snprintf(name, sizeof(name), "b%u", batches[k]);
                any_decode = any_decode || phase_on(name);
        }
        for (int k = 0; k < 2; k++) {
                char name[16];
                snprintf(name, sizeof(name), "p%u", lens[k]);
                if (!phase_on(name) && !(k == 0 && any_decode))
                        continue;
                double t[6];
                nvtxRangePushA(name);
                for (int i = 0; i < 6; i++) {
                        int32_t id;
                        BkSeq s = {.tokens = prompt,
                                .n_tokens = lens[k],
                                .blocks = blocks,
                                .n_blocks = 2048 / BT,
                                .sample = true,
                                .sampling = {.repetition_penalty = 1}};
                        double s0 = now_s();
                        CHECK(ops->step(b, &s, 1, &id, &err) == 0, "%s", err.msg);
                        t[i] = now_s() - s0;
                }
                nvtxRangePop();
                pf[k] = median(t + 1, 5);
                pf_tps[k] = lens[k] / pf[k];
        }

        /* decode: every sequence shares the 512-token prefix in blocks 0..31 (filled by the
         * last prefill) and owns blocks for what follows. */
        double dec[ELEMENTSOF(batches)] = {0}, dec_ms[ELEMENTSOF(batches)] = {0};
        double replay_ms[ELEMENTSOF(batches)] = {0};
        uint32_t *tables = calloc((size_t) 128 * blocks_per_seq, sizeof(uint32_t));
        for (uint32_t s = 0; s < 128; s++)
                for (uint32_t i = 0; i < blocks_per_seq; i++)
                        tables[s * blocks_per_seq + i] =
                                i < CTX / BT ? i : 2048 / BT + s * PRIVATE + i - CTX / BT;
        for (size_t k = 0; k < ELEMENTSOF(batches); k++) {
                uint32_t n = batches[k];
                char name[16];
                snprintf(name, sizeof(name), "b%u", n);
                if (!phase_on(name))
                        continue;
                BkSeq q[128];
                int32_t ids[128], cur[128];
                bool unchained = getenv("DSD_BENCH_UNCHAINED") != NULL;
                double t[DECODE], last = 0, start = now_s();
                uint32_t n_t = 0, warm = 0; /* steps 0 .. warm - 1 warm up, once known */
                memcpy(cur, prompt, n * sizeof(*cur));
                nvtxRangePushA(name);
                for (uint32_t step = 0;; step++) {
                        bool more = warm == 0 || step < warm + DECODE;
                        CHECK(step < PRIVATE * BT, "%u decode steps pass the blocks", step);
                        for (uint32_t s = 0; s < n && more; s++)
                                q[s] = (BkSeq){.tokens = &cur[s],
                                        .n_tokens = 1,
                                        .pos = CTX + step,
                                        .blocks = &tables[s * blocks_per_seq],
                                        .n_blocks = blocks_per_seq,
                                        .sample = true,
                                        .sampling = decode_sampling(s),
                                        .draw = step,
                                        .chained = step > 0 && !unchained,
                                        .prev = s};
                        /* Chained, step - 1 is collected after step is submitted; unchained,
                         * step runs to its end. */
                        if (more && unchained)
                                CHECK(ops->step(b, q, n, ids, &err) == 0, "%s", err.msg);
                        else if (more)
                                CHECK(ops->submit(b, q, n, &err) == 0, "%s", err.msg);
                        if (!unchained && step > 0)
                                CHECK(ops->collect(b, ids, n, &err) == 0, "%s", err.msg);
                        if (unchained ? more : step > 0) {
                                uint32_t done = unchained ? step : step - 1;
                                double now = now_s();
                                if (warm > 0)
                                        t[n_t++] = now - last;
                                else if (done + 1 >= WARMUP && now - start >= WARMUP_S)
                                        warm = done + 1;
                                last = now;
                                memcpy(cur, ids, n * sizeof(*cur));
                        }
                        if (!more)
                                break;
                }
                nvtxRangePop();
                dec_ms[k] = median(t, DECODE) * 1e3;
                dec[k] = n / (dec_ms[k] * 1e-3);
                /* not under a CUPTI injection (kernel-trace.c): its trace is of the last
                 * steps, which must stay the steps measured above */
                double us = 0;
                if (!getenv("CUDA_INJECTION64_PATH") &&
                        cuda_bench_replay(b, n, DECODE, &us, &err) == 0)
                        replay_ms[k] = us * 1e-3;
        }

        double bytes = step_bytes(&model->bk, kvt, CTX);
        double achieved = dec_ms[0] > 0 ? bytes / (dec_ms[0] * 1e-3) : 0;
        printf("\n| %s | %s |\n|---|---|\n", argv[1], prop.name);
        printf("| load (map + upload + repack) | %.2f s (map %.2f s) |\n", t_load, t_map);
        printf("| GPU memory for weights + scratch | %.2f GiB |\n",
                (double) (free0 - free1) / (1 << 30));
        printf("| device copy bandwidth (read+write) | %.0f GB/s |\n", bw / 1e9);
        printf("| prefill 512 | %.1f ms, %.0f tok/s |\n", pf[0] * 1e3, pf_tps[0]);
        printf("| prefill 2048 = TTFT@2048 | %.1f ms, %.0f tok/s |\n", pf[1] * 1e3, pf_tps[1]);
        printf("| decode sampling | %s |\n",
                getenv("DSD_BENCH_SAMPLING") ? "temperature 0.8, top-p 0.9" : "greedy");
        for (size_t k = 0; k < ELEMENTSOF(batches); k++)
                printf("| decode batch %u, ctx %u | %.3f ms/step, %.0f tok/s |\n", batches[k], CTX,
                        dec_ms[k], dec[k]);
        for (size_t k = 0; k < ELEMENTSOF(batches); k++)
                if (replay_ms[k] > 0)
                        printf("| graph replays back to back, batch %u | %.3f ms/step: "
                               "%.3f ms of the step is the host's |\n",
                                batches[k], replay_ms[k], dec_ms[k] - replay_ms[k]);
        printf("| batch-1 bytes/step | %.2f GB, %.0f GB/s = %.0f%% of copy bandwidth |\n",
                bytes / 1e9, achieved / 1e9, 100.0 * achieved / bw);
        /* A greedy step of one row reads the 8-bit copy of a dense lm_head instead (its scales
         * a group of 128 or fewer inputs, and a few FP16 rows: not counted). */
        const BkLinear *head = &model->bk.lm_head;
        const char *dev = getenv("DSD_BENCH_DEVICE");
        if (head->kind == BK_LINEAR_DENSE && !getenv("DSD_BENCH_SAMPLING") &&
                !(dev && strstr(dev, "no-screen"))) {
                uint32_t gs = q8_group_size(head->in);
                double read = bytes - (double) head->in * head->out * 2 +
                              (double) head->in * head->out +
                              (double) head->in / gs * head->out * 4;
                double rate = dec_ms[0] > 0 ? read / (dec_ms[0] * 1e-3) : 0;
                printf("| batch-1 bytes/step read (lm_head screened, 8 bits) | %.2f GB, %.0f GB/s "
                       "= %.0f%% of copy bandwidth |\n",
                        read / 1e9, rate / 1e9, 100.0 * rate / bw);
        }

        ops->free(b);
        model_free(model);
        free(prompt);
        free(blocks);
        free(tables);
        return 0;
}
