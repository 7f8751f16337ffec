/* SPDX-License-Identifier: MIT */
/* Whole random models on the CUDA backend against the CPU backend, which exercises every
 * kernel of a step (embedding, RMSNorm + residual, RoPE of each type + KV append, paged
 * attention over several items, SwiGLU, the GEMV and cuBLAS linears, the add_norm's
 * quantized rows and the integer GEMV that takes them, argmax), at 1 to 16 query heads a
 * KV head:
 *  - a chunked prefill of 300 tokens, a 3-sequence decode, then steps of 2 and of 1
 *    sequence, and one sequence prefilled to 1100 positions and decoded there, logits
 *    within 1e-2 relative error of the CPU's for every position;
 *  - decode steps of 8 and of 5 sequences (a padded graph bucket) at contexts, worked out
 *    from the device's SM count, where their attention items outnumber the decode graph's
 *    item blocks, so that the graph's blocks loop over several items (8 KV heads, at 132
 *    SMs from 512 and 768 positions): logits within 1e-2 of the CPU's, and the graph's ids
 *    the same as an eager backend's; a device where no model gets there fails;
 *  - 24 greedy decode steps of 2, of 5 (a padded graph bucket) and of 20 sequences (the
 *    cuBLAS path): graph replays give the same ids as eager steps, and so do chained steps
 *    (submit, collect) on either;
 *  - 24 greedy steps of one sequence give the same ids through the screened lm_head as
 *    through the whole FP16 lm_head ("no-screen"). */
#include <cuda_runtime_api.h>

#include "gpu_util.h"

#define TOL    1e-2
#define BLOCKS 512 /* 8 sequences of LOOP_BT */

#define LOOP_STEPS  3  /* decode steps of each looping batch */
#define LOOP_SPREAD 9  /* positions between one sequence's context and the next's there */
#define LOOP_BT     64 /* blocks a sequence there: contexts up to 1024 positions */

/* One step of seqs on both backends (gpu_step_both); every row's logits within TOL of the
 * CPU's. Returns the relative error; what and at name the step in the failure. */
static double step_within(Backend *cpu, Backend *gpu, BkSeq *seqs, uint32_t n, uint32_t V, float *a,
        float *b, const char *what, uint32_t at)
{
        size_t rows = 0;

        for (uint32_t i = 0; i < n; i++)
                rows += seqs[i].n_tokens;
        gpu_step_both(cpu, gpu, seqs, n, V, a, b);
        double e = rel_err(b, a, rows * V);
        CHECK(e < TOL, "%s %u: relative error %.3g", what, at, e);
        return e;
}

static double compare_prefill(const BkModel *m, Backend *cpu, Backend *gpu)
{
        DsError err = {0};
        uint32_t V = m->cfg.vocab_size, n = 300;
        static uint32_t blocks[3][64];
        int32_t *tokens = (int32_t *) rnd_alloc(n * 4), ids[3];
        float *a = (float *) rnd_alloc((size_t) n * V * 4),
              *b = (float *) rnd_alloc((size_t) n * V * 4);
        double worst = 0;

        for (uint32_t s = 0; s < 3; s++)
                for (uint32_t i = 0; i < 64; i++)
                        blocks[s][i] = s * 64 + 63 - i; /* scattered, not in order */
        for (uint32_t i = 0; i < n; i++)
                tokens[i] = (int32_t) (rnd_u32() % V);

        /* the prompt in chunks of 1, 17 and the rest, for sequence 0 */
        uint32_t cuts[] = {0, 1, 18, n};
        for (uint32_t c = 0; c + 1 < ELEMENTSOF(cuts); c++) {
                BkSeq s = {.tokens = tokens + cuts[c],
                        .n_tokens = cuts[c + 1] - cuts[c],
                        .pos = cuts[c],
                        .blocks = blocks[0],
                        .n_blocks = 64,
                        .sample = true,
                        .sampling = {.repetition_penalty = 1}};
                worst = fmax(worst, step_within(cpu, gpu, &s, 1, V, a, b, "prefill chunk", c));
        }

        /* three sequences: two short prompts, then decodes of all three together */
        for (uint32_t s = 1; s < 3; s++) {
                BkSeq q = {.tokens = tokens,
                        .n_tokens = 40 * s,
                        .pos = 0,
                        .blocks = blocks[s],
                        .n_blocks = 64,
                        .sampling = {.repetition_penalty = 1}};
                CHECK(backend_cpu_ops.step(cpu, &q, 1, ids, &err) == 0, "%s", err.msg);
                CHECK(backend_cuda_ops.step(gpu, &q, 1, ids, &err) == 0, "%s", err.msg);
        }
        for (uint32_t step = 0; step < 4; step++) {
                BkSeq q[3];
                uint32_t pos[3] = {n + step, 40 + step, 80 + step};
                for (uint32_t s = 0; s < 3; s++)
                        q[s] = (BkSeq){.tokens = &tokens[step * 3 + s],
                                .n_tokens = 1,
                                .pos = pos[s],
                                .blocks = blocks[s],
                                .n_blocks = 64,
                                .sample = true,
                                .sampling = {.repetition_penalty = 1}};
                worst = fmax(worst, step_within(cpu, gpu, q, 3, V, a, b, "decode step", step));
        }
        /* steps of two rows, then of one: the GEMVs' passes of 1-2 rows, the attention's
         * items of batch 1 */
        for (uint32_t step = 0; step < 4; step++) {
                uint32_t ns = step < 2 ? 2 : 1, first = step < 2 ? 0 : 2;
                uint32_t pos[3] = {n + 4 + step, 44 + step, 82 + step};
                BkSeq q[2];
                for (uint32_t k = 0; k < ns; k++)
                        q[k] = (BkSeq){.tokens = &tokens[12 + step * 2 + k],
                                .n_tokens = 1,
                                .pos = pos[first + k],
                                .blocks = blocks[first + k],
                                .n_blocks = 64,
                                .sample = true,
                                .sampling = {.repetition_penalty = 1}};
                worst = fmax(worst, step_within(cpu, gpu, q, ns, V, a, b, "decode step, rows", ns));
        }
        free(tokens);
        free(a);
        free(b);
        return worst;
}

/* One sequence to a long context: decode rows of items of 32 positions (att_chunk), more
 * than one round of the small steps' attention kernel at head_dim 128, the row's own
 * position in the item's second round. */
static double compare_long(const BkModel *m, Backend *cpu, Backend *gpu)
{
        uint32_t V = m->cfg.vocab_size, n = 1110;
        static uint32_t blocks[72];
        int32_t *tokens = (int32_t *) rnd_alloc((n + 2) * 4);
        float *a = (float *) rnd_alloc((size_t) 600 * V * 4),
              *b = (float *) rnd_alloc((size_t) 600 * V * 4);
        double worst = 0;

        for (uint32_t i = 0; i < 72; i++)
                blocks[i] = (i * 37) % 72 + 100; /* scattered over blocks earlier tests used */
        for (uint32_t i = 0; i < n + 2; i++)
                tokens[i] = (int32_t) (rnd_u32() % V);
        for (uint32_t step = 0; step < 4; step++) {
                uint32_t pos = step < 2 ? step * 550 : n + step - 2;
                BkSeq s = {.tokens = tokens + pos,
                        .n_tokens = step == 0   ? 550
                                    : step == 1 ? n - 550
                                                : 1,
                        .pos = pos,
                        .blocks = blocks,
                        .n_blocks = 72,
                        .sample = true,
                        .sampling = {.repetition_penalty = 1}};
                worst = fmax(worst,
                        step_within(cpu, gpu, &s, 1, V, a, b, "long context, position", pos));
        }
        free(tokens);
        free(a);
        free(b);
        return worst;
}

/* ---------------------------------------------------------------------------------------
 * Decode graphs whose attention blocks loop over items */

/* How kernels/cuda/cuda_backend.cu cuts the attention of a step of n <= 8 decode rows at the
 * device's SM count (to keep in step with att_wave, att_row_items, att_graph_items and
 * att_chunk there): a row into items of 16 to 128 positions (ATT_CHUNK), at most
 * row_items(n) of them while that many of 128 cover the row, items of 128 beyond. The decode
 * graph of a bucket of rows launches graph_items(bucket) item blocks, which loop over the
 * items past them, a padded row with one item; an eager step launches a block an item. */
static uint32_t row_items(int n_sm, uint32_t kv_heads, uint32_t n)
{
        uint32_t wave = MAX(1u, 2 * (uint32_t) n_sm / kv_heads);
        return MIN(64u, MAX(1u, wave / n));
}

static uint32_t graph_items(int n_sm, uint32_t kv_heads, uint32_t bucket)
{
        uint32_t most = 0;
        for (uint32_t n = 1; n <= bucket; n++)
                most = MAX(most, n * row_items(n_sm, kv_heads, n));
        return most;
}

static uint32_t bucket_of(uint32_t n)
{
        uint32_t bucket = 1;
        while (bucket < n)
                bucket *= 2;
        return bucket;
}

/* Attention items of the decode row at pos in a step of n sequences (att_chunk). */
static uint32_t pos_items(int n_sm, uint32_t kv_heads, uint32_t n, uint32_t pos)
{
        uint32_t most = row_items(n_sm, kv_heads, n), chunk = 16;
        while (chunk < (pos + most) / most && chunk < 128)
                chunk *= 2;
        return (pos + chunk) / chunk;
}

/* Attention items of step k of the looping decode of n sequences from base: sequence s at
 * position base + LOOP_SPREAD s + k, and the graph's padded rows. */
static uint32_t loop_items(int n_sm, uint32_t kv_heads, uint32_t n, uint32_t base, uint32_t k)
{
        uint32_t items = bucket_of(n) - n;
        for (uint32_t s = 0; s < n; s++)
                items += pos_items(n_sm, kv_heads, n, base + LOOP_SPREAD * s + k);
        return items;
}

/* The smallest base from which, at every step of the looping decode of n sequences, every
 * row has more than row_items(n) items (of 128 positions) and the step more items than its
 * graph has item blocks, the contexts within LOOP_BT blocks; 0 where there is none. */
static uint32_t loop_base(int n_sm, uint32_t kv_heads, uint32_t n)
{
        uint32_t grid = graph_items(n_sm, kv_heads, bucket_of(n));
        uint32_t most = row_items(n_sm, kv_heads, n);
        uint32_t base = most * 128; /* the first position whose row has more items */
        for (; base + LOOP_SPREAD * (n - 1) + LOOP_STEPS <= LOOP_BT * 16; base++) {
                uint32_t k = 0;
                while (k < LOOP_STEPS && loop_items(n_sm, kv_heads, n, base, k) > grid)
                        k++;
                if (k == LOOP_STEPS)
                        return base;
        }
        return 0;
}

/* n <= 8 sequences prefilled to base + LOOP_SPREAD s positions in two chunks (on the CPU and
 * on both CUDA backends), each in its own blocks, interleaved with the others', then
 * LOOP_STEPS decode steps of all of them whose attention items outnumber the decode graph's
 * item blocks: gpu's logits within TOL of the CPU's (a step that returns logits runs
 * eager), then the same step without logits from gpu's graph and on eager, which give the
 * same ids; every backend goes on from eager's. */
static double compare_loop(const BkModel *m, Backend *cpu, Backend *gpu, Backend *eager, int n_sm,
        uint32_t n, uint32_t base, size_t model)
{
        DsError err = {0};
        const BackendOps *ops[] = {&backend_cpu_ops, &backend_cuda_ops, &backend_cuda_ops};
        Backend *bs[] = {cpu, gpu, eager};
        uint32_t V = m->cfg.vocab_size, kv = m->cfg.n_kv_heads;
        uint32_t grid = graph_items(n_sm, kv, bucket_of(n)), fewest = UINT32_MAX, most = 0;
        static uint32_t blocks[8][LOOP_BT];
        static int32_t tokens[8][LOOP_BT * 16];
        int32_t cur[8], ids[8], eids[8];
        float *a = (float *) rnd_alloc((size_t) 8 * V * 4),
              *b = (float *) rnd_alloc((size_t) 8 * V * 4);
        BkSeq q[8];
        double worst = 0;

        CHECK(n <= 8, "batch %u", n);
        for (uint32_t s = 0; s < n; s++) {
                for (uint32_t i = 0; i < LOOP_BT; i++)
                        blocks[s][i] = (LOOP_BT - 1 - i) * 8 + s;
                for (uint32_t i = 0; i < LOOP_BT * 16; i++)
                        tokens[s][i] = (int32_t) (rnd_u32() % V);
                cur[s] = tokens[s][base + LOOP_SPREAD * s];
        }

        /* the prompts: their first halves in one step, then the rest in another */
        for (uint32_t c = 0; c < 2; c++) {
                for (uint32_t s = 0; s < n; s++) {
                        uint32_t len = base + LOOP_SPREAD * s, half = len / 2;
                        q[s] = (BkSeq){.tokens = tokens[s] + (c ? half : 0),
                                .n_tokens = c ? len - half : half,
                                .pos = c ? half : 0,
                                .blocks = blocks[s],
                                .n_blocks = LOOP_BT,
                                .sampling = {.repetition_penalty = 1}};
                }
                for (size_t i = 0; i < ELEMENTSOF(bs); i++)
                        CHECK(ops[i]->step(bs[i], q, n, ids, &err) == 0, "%s prefill: %s",
                                ops[i]->name, err.msg);
        }

        for (uint32_t k = 0; k < LOOP_STEPS; k++) {
                uint32_t items = loop_items(n_sm, kv, n, base, k);
                CHECK(items > grid,
                        "model %zu batch %u step %u: %u attention items, not more than the "
                        "graph's %u blocks at %d SMs",
                        model, n, k, items, grid, n_sm);
                fewest = MIN(fewest, items);
                most = MAX(most, items);
                for (uint32_t s = 0; s < n; s++)
                        q[s] = (BkSeq){.tokens = &cur[s],
                                .n_tokens = 1,
                                .pos = base + LOOP_SPREAD * s + k,
                                .blocks = blocks[s],
                                .n_blocks = LOOP_BT,
                                .sample = true,
                                .sampling = {.repetition_penalty = 1}};
                worst = fmax(worst, step_within(cpu, gpu, q, n, V, a, b, "looping decode step", k));
                for (uint32_t s = 0; s < n; s++)
                        q[s].logits = NULL;
                CHECK(backend_cuda_ops.step(gpu, q, n, ids, &err) == 0, "%s", err.msg);
                CHECK(backend_cuda_ops.step(eager, q, n, eids, &err) == 0, "%s", err.msg);
                for (uint32_t s = 0; s < n; s++)
                        CHECK(ids[s] == eids[s],
                                "model %zu batch %u step %u sequence %u: graph id %d, eager %d",
                                model, n, k, s, ids[s], eids[s]);
                memcpy(cur, eids, n * sizeof(*eids));
        }
        printf("model %zu batch %u at positions %u-%u: %u-%u attention items a step, the graph's "
               "%u blocks loop (%d SMs); graph ids == eager ids\n",
                model, n, base, base + LOOP_SPREAD * (n - 1) + LOOP_STEPS - 1, fewest, most, grid,
                n_sm);
        free(a);
        free(b);
        return worst;
}

/* 24 greedy steps of one sequence, and its 20-token prompt, through the screened lm_head
 * (gpu: its 8-bit copy and the rows it cannot rule out in FP16) and through the whole FP16
 * lm_head ("no-screen"): the same ids, from graphs and chained. */
static void screen_vs_plain(Backend *gpu, const BkModel *m, size_t model)
{
        Backend *plain = backend_open(&backend_cuda_ops, m, "0 no-screen", BLOCKS);
        uint32_t V = m->cfg.vocab_size;
        int32_t a[24], b[24];
        for (int chained = 0; chained < 2; chained++) {
                gpu_greedy(gpu, V, 1, a, chained);
                gpu_greedy(plain, V, 1, b, chained);
                for (uint32_t k = 0; k < 24; k++)
                        CHECK(a[k] == b[k],
                                "model %zu%s: screened id %d, FP16 lm_head id %d at step %u", model,
                                chained ? " chained" : "", a[k], b[k], k);
        }
        printf("model %zu batch 1: screened lm_head ids == FP16 lm_head ids (24 steps)\n", model);
        backend_cuda_ops.free(plain);
}

int main(void)
{
        static const RndShape shapes[] = {
                {256, 352, 2, 8, 2, 32, 300, 32, true, BK_ROPE_DEFAULT},
                {192, 320, 2, 7, 1, 64, 517, 64, false, BK_ROPE_LLAMA3},
                {256, 256, 1, 4, 4, 64, 260, 128, true, BK_ROPE_YARN},
                /* hidden 512: its steps of up to 4 rows take the integer GEMV */
                {512, 384, 2, 8, 2, 128, 300, 128, false, BK_ROPE_DEFAULT},
                /* a wide MLP: its graphs of 17 to 32 rows failed with cudaErrorLossyQuery
                 * while the capture's bookkeeping queried cuBLAS's nodes without their
                 * edge data (inferred: down's cuBLAS kernel at K 16384 has such edges) */
                {512, 16384, 1, 8, 2, 64, 300, 128, true, BK_ROPE_DEFAULT},
                /* 8 KV heads: one wave of the small steps' attention is 2 n_sm / 8 item
                 * blocks (33 at 132 SMs), which decode graphs of 5 and 8 rows at some
                 * hundreds of positions outgrow (compare_loop) */
                {256, 320, 2, 16, 8, 32, 300, 32, true, BK_ROPE_DEFAULT},
                /* 16 query heads a KV head (ATT_GROUP_MAX): more than the small steps'
                 * attention kernel takes (a warp a head, 8 warps), so the generic one */
                {256, 320, 2, 16, 1, 64, 300, 64, false, BK_ROPE_LLAMA3},
        };
        double worst = 0;

        gpu_require();

        /* BkOptions.device leads with the device index (dsd --device N); one the machine
         * lacks is refused by name */
        DsError err = {0};
        Backend *none = NULL;
        int r = backend_cuda_ops.create(&(BkOptions){.device = "4096"}, &none, &err);
        CHECK(r == -ENODEV && !none && strstr(err.msg, "device 4096"),
                "device 4096: create returned %d: %s", r, err.msg);

        /* the decode batches whose graphs must loop over attention items in some model */
        static const uint32_t loop_batches[] = {8, 5};
        uint32_t looped[ELEMENTSOF(loop_batches)] = {0};
        int n_sm = 0;
        CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess &&
                        n_sm > 0,
                "device 0: no SM count");

        for (size_t i = 0; i < ELEMENTSOF(shapes); i++) {
                BkModel m = rnd_model(&shapes[i]);
                Backend *cpu = backend_open(&backend_cpu_ops, &m, NULL, BLOCKS);
                Backend *gpu = backend_open(&backend_cuda_ops, &m, "0", BLOCKS);
                Backend *eager = backend_open(&backend_cuda_ops, &m, "eager", BLOCKS);
                double e = fmax(compare_prefill(&m, cpu, gpu), compare_long(&m, cpu, gpu));
                for (size_t j = 0; j < ELEMENTSOF(loop_batches); j++) {
                        uint32_t n = loop_batches[j], base = loop_base(n_sm, shapes[i].kv_heads, n);
                        if (base == 0) {
                                printf("model %zu batch %u: no graph's attention blocks loop "
                                       "over items within %u positions: not checked\n",
                                        i, n, LOOP_BT * 16);
                                continue;
                        }
                        e = fmax(e, compare_loop(&m, cpu, gpu, eager, n_sm, n, base, i));
                        looped[j]++;
                }
                printf("model %zu: logits relative error %.3g (tolerance %g)\n", i, e, TOL);
                worst = fmax(worst, e);
                backend_cpu_ops.free(cpu);

                gpu_graph_vs_eager(gpu, eager, m.cfg.vocab_size, i);
                screen_vs_plain(gpu, &m, i);
                backend_cuda_ops.free(eager);
                backend_cuda_ops.free(gpu);
        }
        for (size_t j = 0; j < ELEMENTSOF(loop_batches); j++)
                CHECK(looped[j] > 0,
                        "batch %u: at %d SMs no model's decode graph loops over attention items "
                        "within %u positions, which this test is to cover",
                        loop_batches[j], n_sm, LOOP_BT * 16);
        printf("worst logits relative error %.3g\n", worst);
        return 0;
}
