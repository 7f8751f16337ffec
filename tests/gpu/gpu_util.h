/* SPDX-License-Identifier: MIT */
/* Helpers for the gpu suite: skipping without a device, random data that is never all
 * zeros, random AWQ / dense linears and whole random models, and relative errors. */
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu_linear.h"
#include "cuda_backend.h"
#include "half.h"
#include "test_util.h"

static inline void gpu_require(void)
{
        if (!cuda_device_present()) {
                printf("SKIP: no CUDA device\n");
                exit(TEST_SKIP);
        }
}

static uint64_t gpu_rng = 0x9e3779b97f4a7c15u;

static inline uint32_t rnd_u32(void)
{
        gpu_rng ^= gpu_rng << 13;
        gpu_rng ^= gpu_rng >> 7;
        gpu_rng ^= gpu_rng << 17;
        return (uint32_t) (gpu_rng >> 16);
}

/* Uniform in [lo, hi). */
static inline float rnd_f(float lo, float hi)
{
        return lo + (hi - lo) * (float) (rnd_u32() & 0xffffff) / 16777216.0f;
}

static inline void *rnd_alloc(size_t bytes)
{
        void *p = calloc(1, bytes ? bytes : 1);
        CHECK(p, "out of memory");
        return p;
}

static inline uint16_t *rnd_f16(size_t n, float lo, float hi)
{
        uint16_t *h = (uint16_t *) rnd_alloc(n * 2);
        for (size_t i = 0; i < n; i++)
                h[i] = f32_to_f16(rnd_f(lo, hi));
        return h;
}

static inline float *rnd_f32(size_t n, float lo, float hi)
{
        float *f = (float *) rnd_alloc(n * 4);
        for (size_t i = 0; i < n; i++)
                f[i] = rnd_f(lo, hi);
        return f;
}

/* A random linear; memory is leaked on purpose (tests are short-lived processes). */
static inline BkLinear rnd_linear(
        bool awq, uint32_t in, uint32_t out, uint32_t gs, bool bias, BkDtype dense_dtype)
{
        BkLinear l = {.kind = awq ? BK_LINEAR_AWQ : BK_LINEAR_DENSE, .in = in, .out = out};
        float scale = 1.0f / sqrtf((float) in);
        if (awq) {
                uint32_t *qw = (uint32_t *) rnd_alloc((size_t) in * out / 8 * 4);
                uint32_t *qz = (uint32_t *) rnd_alloc((size_t) in / gs * out / 8 * 4);
                for (size_t i = 0; i < (size_t) in * out / 8; i++)
                        qw[i] = rnd_u32();
                for (size_t i = 0; i < (size_t) in / gs * out / 8; i++)
                        qz[i] = rnd_u32();
                l.qweight = qw;
                l.qzeros = qz;
                l.scales = rnd_f16((size_t) in / gs * out, 0.2f * scale, 0.4f * scale);
                l.group_size = gs;
        } else if (dense_dtype == BK_DT_F32) {
                l.w = (BkTensor){BK_DT_F32, rnd_f32((size_t) in * out, -2 * scale, 2 * scale)};
        } else {
                l.w = (BkTensor){BK_DT_F16, rnd_f16((size_t) in * out, -2 * scale, 2 * scale)};
        }
        if (bias)
                l.bias = (BkTensor){BK_DT_F32, rnd_f32(out, -0.5f, 0.5f)};
        return l;
}

typedef struct RndShape {
        uint32_t hidden, inter, layers, heads, kv_heads, head_dim, vocab, gs;
        bool qkv_bias;
        BkRopeType rope;
} RndShape;

static inline BkModel rnd_model(const RndShape *s)
{
        BkModel m = {0};
        BkConfig *c = &m.cfg;
        uint32_t q_dim = s->heads * s->head_dim, kv = s->kv_heads * s->head_dim;

        *c = (BkConfig){
                .arch = s->qkv_bias ? BK_ARCH_QWEN2 : BK_ARCH_LLAMA,
                .hidden = s->hidden,
                .intermediate = s->inter,
                .n_layers = s->layers,
                .n_heads = s->heads,
                .n_kv_heads = s->kv_heads,
                .head_dim = s->head_dim,
                .vocab_size = s->vocab,
                .vocab_sample = s->vocab - 3,
                .max_positions = 4096,
                .rms_eps = 1e-6f,
                .rope = {.type = s->rope,
                        .theta = 10000.0f,
                        .factor = 4.0f,
                        .low_freq_factor = 1.0f,
                        .high_freq_factor = 4.0f,
                        .original_max_pos = 512,
                        .beta_fast = 32.0f,
                        .beta_slow = 1.0f,
                        .attention_factor = 1.1f},
        };
        m.embed = (BkTensor){BK_DT_F16, rnd_f16((size_t) s->vocab * s->hidden, -1.0f, 1.0f)};
        m.final_norm = (BkTensor){BK_DT_F32, rnd_f32(s->hidden, 0.5f, 1.5f)};
        m.lm_head = rnd_linear(false, s->hidden, s->vocab, 0, false, BK_DT_F16);
        m.layers = (BkLayer *) rnd_alloc(s->layers * sizeof(BkLayer));
        for (uint32_t l = 0; l < s->layers; l++) {
                BkLayer *L = &m.layers[l];
                L->attn_norm = (BkTensor){BK_DT_F16, rnd_f16(s->hidden, 0.5f, 1.5f)};
                L->mlp_norm = (BkTensor){BK_DT_F32, rnd_f32(s->hidden, 0.5f, 1.5f)};
                L->q = rnd_linear(true, s->hidden, q_dim, s->gs, s->qkv_bias, BK_DT_F16);
                L->k = rnd_linear(true, s->hidden, kv, s->gs, s->qkv_bias, BK_DT_F16);
                L->v = rnd_linear(true, s->hidden, kv, s->gs, s->qkv_bias, BK_DT_F16);
                L->o = rnd_linear(true, q_dim, s->hidden, s->gs, false, BK_DT_F16);
                L->gate = rnd_linear(true, s->hidden, s->inter, s->gs, false, BK_DT_F16);
                L->up = rnd_linear(true, s->hidden, s->inter, s->gs, false, BK_DT_F16);
                L->down = rnd_linear(true, s->inter, s->hidden, s->gs, false, BK_DT_F16);
        }
        return m;
}

/* The CPU's side of a GEMV that ends in the residual add and the next norm (cu_gemv_res),
 * then of the linear c after it: xn (n) = w * (h / rms(h)), rms(h) = sqrt(mean h^2 + eps),
 * and want = xn · C + c's bias (scratch: cpu_linear_scratch_size(c) floats). */
static inline void cpu_norm_linear(const float *h, const float *w, uint32_t n, float eps,
        const BkLinear *c, float *xn, float *scratch, float *want)
{
        double ss = 0;
        for (uint32_t i = 0; i < n; i++)
                ss += (double) h[i] * h[i];
        float inv = (float) (1.0 / sqrt(ss / n + eps));
        for (uint32_t i = 0; i < n; i++)
                xn[i] = w[i] * (h[i] * inv);
        cpu_linear(c, xn, 1, want, scratch, NULL);
}

/* ‖a − b‖ / ‖b‖ over n floats, in double. */
static inline double rel_err(const float *a, const float *b, size_t n)
{
        double d = 0, r = 0;
        for (size_t i = 0; i < n; i++) {
                d += ((double) a[i] - b[i]) * ((double) a[i] - b[i]);
                r += (double) b[i] * b[i];
        }
        return sqrt(d) / sqrt(r);
}

static inline Backend *backend_open(
        const BackendOps *ops, const BkModel *m, const char *device, uint32_t blocks)
{
        DsError err = {0};
        Backend *b = NULL;
        BkOptions o = {.device = device};
        CHECK(ops->create(&o, &b, &err) == 0, "%s create: %s", ops->name, err.msg);
        CHECK(ops->load(b, m, &err) == 0, "%s load: %s", ops->name, err.msg);
        CHECK(ops->kv_init(b, 16, ops->kv_bytes_per_token(b) * 16 * blocks, &err) ==
                        (int64_t) blocks,
                "%s kv_init: %s", ops->name, err.msg);
        return b;
}

/* One step of seqs on the CPU and on the CUDA backend: every row's logits, seqs[0]'s rows
 * first, into want from the CPU and into got from the GPU, which is poisoned with NaN
 * first so that a row the GPU does not write shows. */
static inline void gpu_step_both(
        Backend *cpu, Backend *gpu, BkSeq *seqs, uint32_t n, uint32_t V, float *want, float *got)
{
        DsError err = {0};
        int32_t *ids = (int32_t *) rnd_alloc((size_t) n * 4);
        size_t rows = 0;

        for (uint32_t i = 0; i < n; i++) {
                seqs[i].logits = want + rows * V;
                rows += seqs[i].n_tokens;
        }
        CHECK(backend_cpu_ops.step(cpu, seqs, n, ids, &err) == 0, "cpu step: %s", err.msg);
        for (uint32_t i = 0; i < n; i++)
                seqs[i].logits = got + (size_t) (seqs[i].logits - want);
        for (size_t i = 0; i < rows * V; i++)
                got[i] = NAN;
        CHECK(backend_cuda_ops.step(gpu, seqs, n, ids, &err) == 0, "cuda step: %s", err.msg);
        free(ids);
}

/* On the CUDA backend, n <= 20 sequences, a 20-token prompt each, then 24 greedy steps of
 * all of them; out (24, n) gets the ids. chained: the steps go through submit and collect,
 * each after the first submitted before the one it follows is collected and fed its ids
 * on the backend (BkSeq.chained). */
static inline void gpu_greedy(Backend *b, uint32_t V, uint32_t n, int32_t *out, bool chained)
{
        DsError err = {0};
        static uint32_t blocks[20][8];
        int32_t prompt[20], cur[20];
        BkSeq q[20];

        for (uint32_t s = 0; s < n; s++) {
                for (uint32_t i = 0; i < 8; i++)
                        blocks[s][i] = s * 8 + i;
                for (uint32_t i = 0; i < 20; i++)
                        prompt[i] = (int32_t) ((s * 131 + i * 17) % V);
                BkSeq p = {.tokens = prompt,
                        .n_tokens = 20,
                        .blocks = blocks[s],
                        .n_blocks = 8,
                        .sample = true,
                        .sampling = {.repetition_penalty = 1}};
                CHECK(backend_cuda_ops.step(b, &p, 1, &cur[s], &err) == 0, "%s", err.msg);
        }
        for (uint32_t step = 0; step < 24; step++) {
                for (uint32_t s = 0; s < n; s++)
                        q[s] = (BkSeq){.tokens = &cur[s],
                                .n_tokens = 1,
                                .pos = 20 + step,
                                .blocks = blocks[s],
                                .n_blocks = 8,
                                .sample = true,
                                .sampling = {.repetition_penalty = 1}};
                int32_t next[20];
                if (chained) {
                        for (uint32_t s = 0; s < n && step > 0; s++)
                                q[s] = (BkSeq){.n_tokens = 1,
                                        .pos = 20 + step,
                                        .blocks = blocks[s],
                                        .n_blocks = 8,
                                        .sample = true,
                                        .sampling = {.repetition_penalty = 1},
                                        .chained = true,
                                        .prev = s};
                        CHECK(backend_cuda_ops.submit(b, q, n, &err) == 0, "%s", err.msg);
                        if (step == 0)
                                continue;
                        CHECK(backend_cuda_ops.collect(b, next, n, &err) == 0, "%s", err.msg);
                        memcpy(&out[(step - 1) * n], next, n * sizeof(*next));
                        continue;
                }
                CHECK(backend_cuda_ops.step(b, q, n, next, &err) == 0, "%s", err.msg);
                memcpy(&out[step * n], next, n * sizeof(*next));
                memcpy(cur, next, n * sizeof(*next));
        }
        if (chained)
                CHECK(backend_cuda_ops.collect(b, &out[23 * n], n, &err) == 0, "%s", err.msg);
        for (uint32_t k = 0; k < 24 * n; k++)
                CHECK(out[k] >= 0 && out[k] < (int32_t) V - 3, "id %d", out[k]);
}

/* The same greedy decodes of 1 (the one-row paths: o and down ending in the next norm),
 * 2 (x through shared memory in the GEMVs), 5 (a padded graph bucket) and 20 sequences (the
 * cuBLAS path) on graph and on eager backends of one model
 * must give the same ids, and so must chained steps on both: from graphs, the ids stay on
 * the device; eager, they come through the host. */
static inline void gpu_graph_vs_eager(Backend *graph, Backend *eager, uint32_t V, size_t model)
{
        static const uint32_t batches[] = {1, 2, 5, 20};
        for (size_t i = 0; i < sizeof(batches) / sizeof(batches[0]); i++) {
                uint32_t n = batches[i];
                int32_t a[24 * 20], b[24 * 20], c[24 * 20], d[24 * 20];
                gpu_greedy(graph, V, n, a, false);
                gpu_greedy(eager, V, n, b, false);
                gpu_greedy(graph, V, n, c, true);
                gpu_greedy(eager, V, n, d, true);
                for (uint32_t k = 0; k < 24 * n; k++) {
                        CHECK(a[k] == b[k], "model %zu batch %u: graph id %d, eager %d at step %u",
                                model, n, a[k], b[k], k / n);
                        CHECK(c[k] == b[k] && d[k] == b[k],
                                "model %zu batch %u: chained graph id %d, chained eager %d, "
                                "eager %d at step %u",
                                model, n, c[k], d[k], b[k], k / n);
                }
                printf("model %zu batch %u: graph ids == eager ids == chained ids (24 steps)\n",
                        model, n);
        }
}
