/* SPDX-License-Identifier: MIT */
/* DeepSeek MLA + MoE on the CUDA backend against the CPU backend, on random models of
 * three kinds (V2 greedy softmax routing without q LoRA; V2 group-limited with two shared
 * experts; V3 noaux_tc sigmoid routing with q LoRA and a score bias):
 *  - an MLA layer's attention output at one row in one launch (cu_mla_out) against the
 *    same arithmetic in double, on five shapes (check_mla_out);
 *  - the router kernel on 4096 random rows: the same experts as cpu_moe_route wherever
 *    the k-th and (k+1)-th choice values are further apart than rounding (1e-5), weights
 *    within 1e-5 relative;
 *  - prefills of eighteen sequences (one chunked, 200 tokens: latent items of several
 *    chunks, W_UK and W_UV over several 64-row groups, experts with more than 16 rows, the
 *    cuBLAS path; its first chunk of one row routes in add_norm's router epilogue, and
 *    steps of up to 32 rows take their router logits from it), two decode steps of six of them (a
 * small step: many 32-position items a row), two of all eighteen (more than 8 sequences and 16
 * rows: 160-position items, several row tiles) and two of the first alone (one row: a MoE layer's
 * down ends in the next norm, cu_gemv_res_moe, where the next q|kv_a takes quantized rows),
 * logits within 1e-2 relative error of the CPU's for every row but where routing met a near tie
 * (see rows_err);
 *  - 24 greedy decode steps of 1, 2, 5 and 20 sequences after 20-token prompts: graph
 *    replays give the ids eager steps give, and so do chained steps (submit, collect). */
#include "cpu_moe.h"
#include "gpu_util.h"

#define TOL     1e-2
#define FLIP    5e-2
#define BLOCKS  640
#define MARGIN  1e-5
#define N_SEQ   18
#define N_SMALL 6 /* sequences of the small decode steps */

typedef struct DsShape {
        BkArch arch;
        uint32_t hidden, inter, layers, heads, vocab, gs;
        uint32_t q_lora, rank, nope, rope, vd;
        uint32_t experts, shared, top_k, expert_dim, n_group, topk_group;
        BkTopkMethod method;
        BkScoring scoring;
        bool norm;
        float scaling;
} DsShape;

/* A random AWQ linear of about unit gain: rnd_linear's scales make each layer multiply
 * the norm of its input by about 2.6, and through the MLA chain (q_proj, W_UK, the scores)
 * that makes attention one-hot and sensitive to rounding far beyond real models. */
static BkLinear unit_linear(uint32_t in, uint32_t out, uint32_t gs)
{
        BkLinear l = rnd_linear(true, in, out, gs, false, BK_DT_F16);
        uint16_t *sc = (uint16_t *) l.scales;
        for (size_t i = 0; i < (size_t) in / gs * out; i++)
                sc[i] = f32_to_f16(f16_to_f32(sc[i]) * 0.4f);
        return l;
}

static BkExpert rnd_expert(uint32_t hidden, uint32_t width, uint32_t gs)
{
        return (BkExpert){
                .gate = unit_linear(hidden, width, gs),
                .up = unit_linear(hidden, width, gs),
                .down = unit_linear(width, hidden, gs),
        };
}

static BkModel rnd_deepseek(const DsShape *s)
{
        BkModel m = {0};
        BkConfig *c = &m.cfg;
        uint32_t qk = s->nope + s->rope, q_dim = s->heads * qk;

        *c = (BkConfig){
                .arch = s->arch,
                .hidden = s->hidden,
                .intermediate = s->inter,
                .n_layers = s->layers,
                .n_heads = s->heads,
                .n_kv_heads = s->heads,
                .head_dim = qk,
                .vocab_size = s->vocab,
                .vocab_sample = s->vocab - 3,
                .max_positions = 4096,
                .rms_eps = 1e-6f,
                .rope = {.type = BK_ROPE_YARN,
                        .theta = 10000.0f,
                        .factor = 40.0f,
                        .original_max_pos = 512,
                        .beta_fast = 32.0f,
                        .beta_slow = 1.0f,
                        .attention_factor = 1.2f},
                .mla = {.q_lora_rank = s->q_lora,
                        .kv_lora_rank = s->rank,
                        .qk_nope_dim = s->nope,
                        .qk_rope_dim = s->rope,
                        .v_head_dim = s->vd,
                        .softmax_scale = 1.3f / sqrtf((float) qk)},
                .moe = {.n_routed = s->experts,
                        .n_shared = s->shared,
                        .top_k = s->top_k,
                        .expert_dim = s->expert_dim,
                        .first_dense = 1,
                        .layer_freq = 1,
                        .n_group = s->n_group,
                        .topk_group = s->topk_group,
                        .topk_method = s->method,
                        .scoring = s->scoring,
                        .norm_topk_prob = s->norm,
                        .routed_scaling_factor = s->scaling},
        };
        m.embed = (BkTensor){BK_DT_F16, rnd_f16((size_t) s->vocab * s->hidden, -1.0f, 1.0f)};
        m.final_norm = (BkTensor){BK_DT_F32, rnd_f32(s->hidden, 0.5f, 1.5f)};
        m.lm_head = rnd_linear(false, s->hidden, s->vocab, 0, false, BK_DT_F16);
        m.layers = (BkLayer *) rnd_alloc(s->layers * sizeof(BkLayer));
        for (uint32_t l = 0; l < s->layers; l++) {
                BkLayer *L = &m.layers[l];
                uint32_t gs = s->gs;
                L->attn_norm = (BkTensor){BK_DT_F16, rnd_f16(s->hidden, 0.5f, 1.5f)};
                L->mlp_norm = (BkTensor){BK_DT_F32, rnd_f32(s->hidden, 0.5f, 1.5f)};
                if (s->q_lora) {
                        L->mla.q_a = unit_linear(s->hidden, s->q_lora, gs);
                        L->mla.q_a_norm = (BkTensor){BK_DT_F32, rnd_f32(s->q_lora, 0.5f, 1.5f)};
                        L->mla.q_b = unit_linear(s->q_lora, q_dim, gs);
                } else
                        L->q = unit_linear(s->hidden, q_dim, gs);
                L->mla.kv_a = unit_linear(s->hidden, s->rank + s->rope, gs);
                L->mla.kv_a_norm = (BkTensor){BK_DT_F16, rnd_f16(s->rank, 0.5f, 1.5f)};
                L->mla.kv_b = unit_linear(s->rank, s->heads * (s->nope + s->vd), gs);
                L->o = unit_linear(s->heads * s->vd, s->hidden, gs);
                if (l == 0) {
                        BkExpert d = rnd_expert(s->hidden, s->inter, gs);
                        L->gate = d.gate;
                        L->up = d.up;
                        L->down = d.down;
                        continue;
                }
                L->moe.experts = (BkExpert *) rnd_alloc(s->experts * sizeof(BkExpert));
                for (uint32_t e = 0; e < s->experts; e++)
                        L->moe.experts[e] = rnd_expert(s->hidden, s->expert_dim, gs);
                /* routers wide enough that the choices differ from row to row */
                L->moe.router = (BkTensor){
                        BK_DT_F16, rnd_f16((size_t) s->experts * s->hidden, -0.3f, 0.3f)};
                if (s->method == BK_TOPK_NOAUX_TC)
                        L->moe.score_bias = (BkTensor){BK_DT_F32, rnd_f32(s->experts, -0.1f, 0.1f)};
                if (s->shared)
                        L->moe.shared = rnd_expert(s->hidden, s->shared * s->expert_dim, gs);
        }
        return m;
}

/* What ranks expert e in a row: softmax keeps the logits' order, sigmoid plus bias does not. */
static float rank_key(const BkMoeConfig *mc, const float *lg, const float *bias, uint32_t e)
{
        if (mc->scoring == BK_SCORING_SOFTMAX)
                return lg[e];
        float v = 1.0f / (1.0f + expf(-lg[e]));
        return mc->topk_method == BK_TOPK_NOAUX_TC && bias ? v + bias[e] : v;
}

/* The router kernel against cpu_moe_route on random logits. */
static void check_routing(const BkMoeConfig *mc, const float *bias)
{
        DsError err = {0};
        uint32_t rows = 4096, E = mc->n_routed, K = mc->top_k, skipped = 0;
        float *lg = rnd_f32((size_t) rows * E, -4.0f, 4.0f);
        uint32_t *gi = (uint32_t *) rnd_alloc((size_t) rows * K * 4);
        float *gw = (float *) rnd_alloc((size_t) rows * K * 4);
        float *scratch = (float *) rnd_alloc(cpu_moe_route_scratch(mc) * 4);
        uint32_t ci[64];
        float cw[64];

        CHECK(K <= 64, "top_k %u", K);
        BkTensor bt = {BK_DT_F32, bias};

        CHECK(cuda_test_moe_route(mc, lg, bias, rows, gi, gw, &err) == 0, "%s", err.msg);
        for (uint32_t r = 0; r < rows; r++) {
                cpu_moe_route(mc, lg + (size_t) r * E, bt, scratch, ci, cw);
                const uint32_t *g = gi + (size_t) r * K;
                if (memcmp(ci, g, K * 4) != 0) {
                        /* a different choice is allowed only between experts whose ranking
                         * values (the logit, or sigmoid plus bias) are within rounding */
                        for (uint32_t x = 0; x < K; x++)
                                for (uint32_t y = 0; y < K; y++) {
                                        bool cx_only = true, gy_only = true;
                                        for (uint32_t z = 0; z < K; z++) {
                                                cx_only = cx_only && g[z] != ci[x];
                                                gy_only = gy_only && ci[z] != g[y];
                                        }
                                        if (!cx_only || !gy_only)
                                                continue;
                                        float kx = rank_key(mc, lg + (size_t) r * E, bias, ci[x]);
                                        float ky = rank_key(mc, lg + (size_t) r * E, bias, g[y]);
                                        CHECK(fabsf(kx - ky) < MARGIN,
                                                "row %u: CPU expert %u, GPU expert %u, ranking "
                                                "values %g and %g",
                                                r, ci[x], g[y], kx, ky);
                                }
                        skipped++;
                        continue;
                }
                for (uint32_t k = 0; k < K; k++) {
                        float a = gw[(size_t) r * K + k];
                        CHECK(fabsf(a - cw[k]) <= 1e-5f * fabsf(cw[k]) + 1e-7f,
                                "row %u expert %u: weight %g, CPU %g", r, ci[k], a, cw[k]);
                }
        }
        printf("routing method %d scoring %d: %u rows equal, %u near ties\n", (int) mc->topk_method,
                (int) mc->scoring, rows - skipped, skipped);
        CHECK(skipped < rows / 100, "%u near ties of %u rows", skipped, rows);
        free(lg);
        free(gi);
        free(gw);
        free(scratch);
}

/* An MLA layer's attention output at one row (cu_mla_out: the combine of n_items items'
 * partials, W_UV, o in one launch) against the same arithmetic in double on the CPU, with
 * o by cpu_linear: relative error under 3e-3 (the GPU rounds the latent rows and the values
 * to FP16, as the three kernels it replaces did). */
static void check_mla_out(
        uint32_t H, uint32_t rank, uint32_t Vd, uint32_t gs, uint32_t N, uint32_t n_items)
{
        DsError err = {0};
        BkLinear o = rnd_linear(true, H * Vd, N, gs, false, BK_DT_F16);
        uint16_t *wuv = rnd_f16(
                (size_t) H * Vd * rank, -2.0f / sqrtf((float) rank), 2.0f / sqrtf((float) rank));
        float *acc = rnd_f32((size_t) n_items * H * rank, -1.0f, 1.0f);
        float *ml = (float *) rnd_alloc((size_t) n_items * H * 8);
        float *v = (float *) rnd_alloc((size_t) H * Vd * 4);
        double *lat = (double *) rnd_alloc((size_t) rank * 8);
        float *want = (float *) rnd_alloc((size_t) N * 4),
              *got = (float *) rnd_alloc((size_t) N * 4);
        float *scratch = (float *) rnd_alloc(cpu_linear_scratch_size(&o) * 4);

        /* an item's running max and its sum of exponentials (at least its max's 1) */
        for (size_t i = 0; i < (size_t) n_items * H; i++) {
                ml[2 * i] = rnd_f(-6.0f, 6.0f);
                ml[2 * i + 1] = rnd_f(1.0f, 8.0f);
        }
        for (uint32_t h = 0; h < H; h++) {
                double m = -INFINITY, l = 0;
                for (uint32_t i = 0; i < n_items; i++)
                        m = fmax(m, ml[2 * ((size_t) i * H + h)]);
                memset(lat, 0, (size_t) rank * 8);
                for (uint32_t i = 0; i < n_items; i++) {
                        const float *e = ml + 2 * ((size_t) i * H + h);
                        double w = exp(e[0] - m);
                        l += w * e[1];
                        for (uint32_t d = 0; d < rank; d++)
                                lat[d] += w * acc[((size_t) i * H + h) * rank + d];
                }
                for (uint32_t k = 0; k < Vd; k++) {
                        double s = 0;
                        for (uint32_t d = 0; d < rank; d++)
                                s += f16_to_f32(wuv[((size_t) h * Vd + k) * rank + d]) * lat[d] / l;
                        v[h * Vd + k] = (float) s;
                }
        }
        cpu_linear(&o, v, 1, want, scratch, NULL);
        CHECK(cuda_test_mla_out(&o, wuv, H, rank, Vd, n_items, acc, ml, got, &err) == 0, "%s",
                err.msg);
        double e = rel_err(got, want, N);
        printf("mla out: %u heads, rank %u, Vd %u, groups of %u, o to %u, %u items: relative "
               "error %.3g\n",
                H, rank, Vd, gs, N, n_items, e);
        CHECK(e < 3e-3, "mla out of %u heads, %u items: relative error %.3g", H, n_items, e);
        free(wuv);
        free(acc);
        free(ml);
        free(v);
        free(lat);
        free(want);
        free(got);
        free(scratch);
}

/* Over the whole test: rows compared, rows counted as routing flips, rows after a flip in
 * their sequence, and the squared differences and references of the clean rows. */
static uint32_t n_rows, n_flips, n_tainted;
static double sum_d2, sum_r2;
static bool tainted[N_SEQ];

/* Compares n rows of sequence seq's logits, row by row. A row whose router input sat
 * within rounding of a tie between experts (the GPU rounds the normed hidden state to FP16
 * before the router, the CPU does not) takes another expert there, and its logits differ
 * by far more than rounding: a row above FLIP counts as such a flip, and the later rows of
 * its sequence, which attend to its changed keys, are counted but not compared. The test
 * fails when more than 2% of the rows flip, when fewer than half are clean, or when the
 * clean rows of a step together are not within TOL. Returns the clean rows' error. */
static double rows_err(
        const float *got, const float *want, uint32_t n, uint32_t V, uint32_t seq, const char *what)
{
        double d2 = 0, r2 = 0;
        for (uint32_t r = 0; r < n; r++) {
                const float *g = got + (size_t) r * V, *w = want + (size_t) r * V;
                double rd = 0, rr = 0;
                for (uint32_t i = 0; i < V; i++) {
                        CHECK(g[i] == g[i], "%s: row %u has NaN logits", what, r);
                        rd += ((double) g[i] - w[i]) * ((double) g[i] - w[i]);
                        rr += (double) w[i] * w[i];
                }
                n_rows++;
                if (tainted[seq]) {
                        n_tainted++;
                        continue;
                }
                if (sqrt(rd / rr) >= FLIP) {
                        n_flips++;
                        tainted[seq] = true;
                        printf("%s: sequence %u row %u: relative error %.3g, a routing flip\n",
                                what, seq, r, sqrt(rd / rr));
                        continue;
                }
                d2 += rd;
                r2 += rr;
        }
        sum_d2 += d2;
        sum_r2 += r2;
        double e = r2 > 0 ? sqrt(d2 / r2) : 0;
        CHECK(e < TOL, "%s: sequence %u: relative error %.3g over its clean rows", what, seq, e);
        return e;
}

/* Sequence 0: 200 tokens in chunks of 1, 12, 5 and 182 (items of several 32-row chunks,
 * more than 16 rows, cuBLAS); the others: 48 tokens at once; then two decode steps of the
 * first N_SMALL sequences, two of all and two of sequence 0 alone. Every row's logits are
 * compared. */
static double compare_steps(const BkModel *m, Backend *cpu, Backend *gpu)
{
        uint32_t V = m->cfg.vocab_size, n0 = 200, n1 = 48;
        static uint32_t blocks[N_SEQ][32];
        int32_t *tokens = (int32_t *) rnd_alloc(n0 * N_SEQ * 4);
        float *a = (float *) rnd_alloc((size_t) n0 * V * 4),
              *b = (float *) rnd_alloc((size_t) n0 * V * 4);
        double worst = 0;

        memset(tainted, 0, sizeof(tainted));
        for (uint32_t s = 0; s < N_SEQ; s++)
                for (uint32_t i = 0; i < 32; i++)
                        blocks[s][i] = s * 32 + 31 - i; /* scattered, not in order */
        for (uint32_t i = 0; i < n0 * N_SEQ; i++)
                tokens[i] = (int32_t) (rnd_u32() % V);

        uint32_t cuts[] = {0, 1, 13, 18, n0};
        for (uint32_t s = 0; s < N_SEQ; s++)
                for (uint32_t c = 0; c + 1 < (s == 0 ? ELEMENTSOF(cuts) : 2); c++) {
                        uint32_t from = s == 0 ? cuts[c] : 0, to = s == 0 ? cuts[c + 1] : n1;
                        BkSeq q = {.tokens = tokens + s * n0 + from,
                                .n_tokens = to - from,
                                .pos = from,
                                .blocks = blocks[s],
                                .n_blocks = 32,
                                .sample = true,
                                .sampling = {.repetition_penalty = 1}};
                        gpu_step_both(cpu, gpu, &q, 1, V, a, b);
                        worst = fmax(worst, rows_err(b, a, q.n_tokens, V, s, "prefill"));
                }

        for (uint32_t t = 0; t < 6; t++) {
                BkSeq d[N_SEQ];
                uint32_t n = t < 2 ? N_SMALL : t < 4 ? N_SEQ : 1;
                for (uint32_t s = 0; s < n; s++)
                        d[s] = (BkSeq){.tokens = &tokens[t * N_SEQ + s],
                                .n_tokens = 1,
                                .pos = (s == 0 ? n0 : n1) + (s < N_SMALL ? t : t - 2),
                                .blocks = blocks[s],
                                .n_blocks = 32,
                                .sampling = {.repetition_penalty = 1}};
                gpu_step_both(cpu, gpu, d, n, V, a, b);
                for (uint32_t s = 0; s < n; s++)
                        worst = fmax(worst, rows_err(b + (size_t) s * V, a + (size_t) s * V, 1, V,
                                                    s, "decode"));
        }
        free(tokens);
        free(a);
        free(b);
        return worst;
}

int main(void)
{
        static const DsShape shapes[] = {
                /* V2-Lite's proportions, small: no q LoRA, greedy softmax routing */
                {BK_ARCH_DEEPSEEK_V2, 256, 512, 3, 4, 300, 64, 0, 256, 64, 32, 64, 16, 0, 3, 128, 1,
                        1, BK_TOPK_GREEDY, BK_SCORING_SOFTMAX, false, 1.0f},
                /* group-limited routing, two shared experts, 16 heads (one full head group) */
                {BK_ARCH_DEEPSEEK_V2, 256, 384, 2, 16, 333, 32, 0, 512, 128, 64, 128, 8, 2, 2, 96,
                        4, 2, BK_TOPK_GROUP_LIMITED_GREEDY, BK_SCORING_SOFTMAX, true, 1.5f},
                /* V3: q LoRA, noaux_tc sigmoid routing with a score bias, 20 heads (two
                 * head groups) */
                {BK_ARCH_DEEPSEEK_V3, 256, 384, 2, 20, 300, 64, 192, 256, 64, 32, 64, 32, 1, 4, 64,
                        8, 3, BK_TOPK_NOAUX_TC, BK_SCORING_SIGMOID, true, 2.5f},
                /* hidden 1024: add_norm in clusters of 16 blocks (add_norm_ctas), routing too */
                {BK_ARCH_DEEPSEEK_V2, 1024, 512, 2, 8, 300, 64, 0, 256, 64, 32, 64, 16, 2, 4, 128,
                        1, 1, BK_TOPK_GREEDY, BK_SCORING_SOFTMAX, true, 1.0f},
        };
        /* the router alone at the full models' expert counts, which the small shapes above
         * do not reach: each count of 32-expert columns a routing lane holds (1, 2, 4, 8)
         * is compiled apart */
        static const BkMoeConfig routers[] = {
                /* DeepSeek-V3/R1: 256 experts in 8 groups, noaux_tc sigmoid with a bias */
                {256, 1, 8, 64, 0, 1, 8, 4, BK_TOPK_NOAUX_TC, BK_SCORING_SIGMOID, true, 2.5f},
                /* DeepSeek-V2: 160 experts in 8 groups, group-limited softmax */
                {160, 2, 6, 64, 0, 1, 8, 3, BK_TOPK_GROUP_LIMITED_GREEDY, BK_SCORING_SOFTMAX, false,
                        16.0f},
                /* an expert count that fills no column: 100, greedy */
                {100, 0, 6, 64, 0, 1, 1, 1, BK_TOPK_GREEDY, BK_SCORING_SOFTMAX, false, 1.0f},
        };
        double worst = 0;

        gpu_require();
        /* V2-Lite's shape at its bench context; one item; more items than load with their
         * (max, sum) pairs and more o tiles than a warp holds at once (clusters of 4); more
         * than a chunk of items, 20 heads, groups of 32; the smallest rank */
        check_mla_out(16, 512, 128, 128, 2048, 17);
        check_mla_out(16, 512, 128, 128, 2048, 1);
        check_mla_out(4, 256, 64, 64, 2048, 40);
        check_mla_out(20, 256, 64, 32, 320, 150);
        check_mla_out(2, 64, 64, 128, 256, 5);
        for (size_t i = 0; i < ELEMENTSOF(routers); i++) {
                float *bias = routers[i].topk_method == BK_TOPK_NOAUX_TC
                                      ? rnd_f32(routers[i].n_routed, -0.1f, 0.1f)
                                      : NULL;
                check_routing(&routers[i], bias);
                free(bias);
        }
        for (size_t i = 0; i < ELEMENTSOF(shapes); i++) {
                BkModel m = rnd_deepseek(&shapes[i]);
                check_routing(&m.cfg.moe, m.layers[1].moe.score_bias.data
                                                  ? (const float *) m.layers[1].moe.score_bias.data
                                                  : NULL);
                Backend *cpu = backend_open(&backend_cpu_ops, &m, NULL, BLOCKS);
                Backend *gpu = backend_open(&backend_cuda_ops, &m, NULL, BLOCKS);
                CHECK(backend_cuda_ops.kv_bytes_per_token(gpu) ==
                                (uint64_t) m.cfg.n_layers * (shapes[i].rank + shapes[i].rope) * 2,
                        "KV bytes per token %llu",
                        (unsigned long long) backend_cuda_ops.kv_bytes_per_token(gpu));
                double e = compare_steps(&m, cpu, gpu);
                printf("model %zu: logits relative error %.3g (tolerance %g)\n", i, e, TOL);
                worst = fmax(worst, e);
                backend_cpu_ops.free(cpu);

                Backend *eager = backend_open(&backend_cuda_ops, &m, "eager", BLOCKS);
                gpu_graph_vs_eager(gpu, eager, m.cfg.vocab_size, i);
                backend_cuda_ops.free(eager);
                backend_cuda_ops.free(gpu);
        }
        printf("worst logits relative error %.3g, %.3g over all clean rows; of %u rows, %u "
               "routing flips and %u after a flip in their sequence\n",
                worst, sqrt(sum_d2 / sum_r2), n_rows, n_flips, n_tainted);
        CHECK(n_flips * 50 <= n_rows, "%u of %u rows flipped", n_flips, n_rows);
        CHECK(2 * (n_flips + n_tainted) <= n_rows, "only %u of %u rows clean",
                n_rows - n_flips - n_tainted, n_rows);
        return 0;
}
