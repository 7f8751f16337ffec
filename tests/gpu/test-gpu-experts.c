/* SPDX-License-Identifier: MIT */
/* The MoE expert products, the GEMV (cu_gemv_experts, passes of 8 rows) and the grouped
 * GEMM (cu_gemm_experts, blocks of 32 rows), through cuda_test_experts against cpu_linear
 * on each (token, expert) pair. The routing gives experts 70 rows (three blocks, the last
 * odd), 40, 9 and 1 rows, some none, and the rest random counts; group sizes 32, 64 and
 * 128, the DeepSeek-V2-Lite expert shapes (2048 -> 2816 fused gate|up with x_div = top_k,
 * 1408 -> 2048 down with x_div = 1) and odd ones (K not a multiple of the 64-k chunk, N
 * not of the 16-column tile; the GEMM falls back to the GEMV where it needs multiples).
 * Then the contract that a pair's result does not depend on the other rows of its
 * expert: the rows listed in reverse and some pairs moved to other experts leave every
 * other pair's result bit for bit the same; and one token (one row an expert) against the
 * CPU and bit for bit against the same token twice. Last, a MoE layer's down at one row
 * ending in the residual add and the next norm (cu_gemv_res_moe: a pair a slice, the last
 * slice in ends it), and the linear after it taking the quantized row, against the CPU's
 * weighted sum of the pairs in pair order. Tolerance: relative error 3e-3 per pair (the GPU rounds
 * x to FP16). */
#include "gpu_util.h"

#define TOL     3e-3
#define EXPERTS 12
#define TOKENS  70
#define TOP_K   4
#define BUSY    3 /* every token picks it: TOKENS rows */
#define IDLE_LO 9 /* experts IDLE_LO.. get no rows */

/* expert_of[t * top_k + j]: distinct experts per token: BUSY, then expert 4 for tokens
 * 0..39, 5 for 40..48 and 6 for 49 (40, 9 and 1 rows), then experts of the pool in random
 * order (top_k <= 2 + ELEMENTSOF(pool)). */
static void route(uint32_t *expert_of, uint32_t top_k)
{
        static const uint32_t pool[] = {0, 1, 2, 7, 8};
        for (uint32_t t = 0; t < TOKENS; t++) {
                uint32_t *ex = expert_of + t * top_k, j = 1;
                ex[0] = BUSY;
                if (t < 50)
                        ex[j++] = t < 40 ? 4 : t < 49 ? 5 : 6;
                while (j < top_k) {
                        uint32_t e = pool[rnd_u32() % ELEMENTSOF(pool)], dup = 0;
                        for (uint32_t i = 0; i < j; i++)
                                dup |= ex[i] == e;
                        if (!dup)
                                ex[j++] = e;
                }
        }
}

/* Both kernels' results against want, then the moved and reversed rows against the first
 * run bit for bit. Returns the worst relative error. */
static double check_kernel(const BkLinear *ex, const uint32_t *expert_of, uint32_t n_pairs,
        uint32_t x_div, bool grouped, const float *x, const float *want, uint32_t in, uint32_t out,
        uint32_t gs)
{
        DsError err = {0};
        const char *kind = grouped ? "GEMM" : "GEMV";
        float *got = (float *) rnd_alloc((size_t) n_pairs * out * 4);
        float *again = (float *) rnd_alloc((size_t) n_pairs * out * 4);
        uint32_t *moved = (uint32_t *) rnd_alloc(n_pairs * 4);
        double worst = 0;

        CHECK(cuda_test_experts(
                      ex, EXPERTS, expert_of, n_pairs, x_div, false, grouped, x, got, &err) == 0,
                "%s", err.msg);
        for (uint32_t p = 0; p < n_pairs; p++) {
                double e = rel_err(got + (size_t) p * out, want + (size_t) p * out, out);
                CHECK(e < TOL, "%s %u->%u g%u pair %u (expert %u): relative error %.3g", kind, in,
                        out, gs, p, expert_of[p], e);
                worst = fmax(worst, e);
        }

        /* every third pair to another expert (IDLE_LO wakes up), rows listed in reverse */
        for (uint32_t p = 0; p < n_pairs; p++)
                moved[p] = p % 3 == 1 ? (expert_of[p] + 1 + p % 5) % (IDLE_LO + 1) : expert_of[p];
        CHECK(cuda_test_experts(
                      ex, EXPERTS, moved, n_pairs, x_div, true, grouped, x, again, &err) == 0,
                "%s", err.msg);
        for (uint32_t p = 0; p < n_pairs; p++)
                if (moved[p] == expert_of[p])
                        CHECK(memcmp(got + (size_t) p * out, again + (size_t) p * out,
                                      (size_t) out * 4) == 0,
                                "%s %u->%u g%u pair %u: result changed with the other rows "
                                "of expert %u",
                                kind, in, out, gs, p, expert_of[p]);
        free(moved);
        free(got);
        free(again);
        return worst;
}

/* One token of TOP_K pairs, one row an expert, as a batch-1 decode step gives them (where
 * the grid is one wave of them, in CTAs of 4 warps): against want, then bit for bit
 * against the same token twice (two rows an expert). Returns the worst relative error. */
static double check_one_token(const BkLinear *ex, uint32_t in, uint32_t out, uint32_t gs)
{
        DsError err = {0};
        uint32_t expert_of[2 * TOP_K];
        float *x = rnd_f32((size_t) 2 * in, -2.0f, 2.0f);
        float *want = (float *) rnd_alloc((size_t) TOP_K * out * 4);
        float *got = (float *) rnd_alloc((size_t) 2 * TOP_K * out * 4);
        float *again = (float *) rnd_alloc((size_t) 2 * TOP_K * out * 4);
        float *scratch = (float *) rnd_alloc(cpu_linear_scratch_size(&ex[0]) * 4);
        double worst = 0;

        memcpy(x + in, x, (size_t) in * 4);
        for (uint32_t p = 0; p < 2 * TOP_K; p++)
                expert_of[p] = (p % TOP_K * 5 + 1) % EXPERTS; /* distinct within a token */
        for (uint32_t p = 0; p < TOP_K; p++)
                cpu_linear(&ex[expert_of[p]], x, 1, want + (size_t) p * out, scratch, NULL);
        CHECK(cuda_test_experts(ex, EXPERTS, expert_of, TOP_K, TOP_K, false, false, x, got, &err) ==
                        0,
                "%s", err.msg);
        for (uint32_t p = 0; p < TOP_K; p++) {
                double e = rel_err(got + (size_t) p * out, want + (size_t) p * out, out);
                CHECK(e < TOL,
                        "GEMV %u->%u g%u one token, pair %u (expert %u): relative error "
                        "%.3g",
                        in, out, gs, p, expert_of[p], e);
                worst = fmax(worst, e);
        }
        CHECK(cuda_test_experts(
                      ex, EXPERTS, expert_of, 2 * TOP_K, TOP_K, false, false, x, again, &err) == 0,
                "%s", err.msg);
        CHECK(memcmp(got, again, (size_t) TOP_K * out * 4) == 0,
                "GEMV %u->%u g%u: one token's result changed when its experts got two rows", in,
                out, gs);
        free(x);
        free(want);
        free(got);
        free(again);
        free(scratch);
        return worst;
}

static double check(uint32_t in, uint32_t out, uint32_t gs, uint32_t x_div)
{
        uint32_t top_k = x_div > 1 ? x_div : TOP_K, n_pairs = TOKENS * top_k;
        uint32_t x_rows = (n_pairs + x_div - 1) / x_div;
        BkLinear ex[EXPERTS];
        for (uint32_t e = 0; e < EXPERTS; e++)
                ex[e] = rnd_linear(true, in, out, gs, false, BK_DT_F16);
        uint32_t *expert_of = (uint32_t *) rnd_alloc(n_pairs * 4);
        route(expert_of, top_k);
        float *x = rnd_f32((size_t) x_rows * in, -2.0f, 2.0f);
        float *want = (float *) rnd_alloc((size_t) n_pairs * out * 4);
        float *scratch = (float *) rnd_alloc(cpu_linear_scratch_size(&ex[0]) * 4);

        for (uint32_t p = 0; p < n_pairs; p++)
                cpu_linear(&ex[expert_of[p]], x + (size_t) (p / x_div) * in, 1,
                        want + (size_t) p * out, scratch, NULL);
        double worst = check_kernel(ex, expert_of, n_pairs, x_div, false, x, want, in, out, gs);
        worst = fmax(
                worst, check_kernel(ex, expert_of, n_pairs, x_div, true, x, want, in, out, gs));
        worst = fmax(worst, check_one_token(ex, in, out, gs));
        free(expert_of);
        free(x);
        free(want);
        free(scratch);
        return worst;
}

/* A MoE layer's down of one token's n_pairs pairs in CTAs of 2 kw warps, ending in the
 * residual add and the next norm, then the linear after it: the residual and that linear's
 * output against the CPU. The pairs' experts are distinct, their weights random but the
 * last two's 1 (as the shared experts' slices). Returns the worst relative error. */
static double check_moe_res(uint32_t in, uint32_t out, uint32_t gs, uint32_t n_pairs, uint32_t kw)
{
        DsError err = {0};
        const float eps = 1e-6f;
        const uint32_t C = 200;
        BkLinear ex[EXPERTS];
        for (uint32_t e = 0; e < EXPERTS; e++)
                ex[e] = rnd_linear(true, in, out, gs, false, BK_DT_F16);
        BkLinear c = rnd_linear(true, out, C, 128, true, BK_DT_F16);
        uint32_t expert_of[8];
        float *pair_w = rnd_f32(n_pairs, 0.05f, 1.0f);
        float *x = rnd_f32((size_t) n_pairs * in, -2.0f, 2.0f);
        float *h = rnd_f32(out, -4.0f, 4.0f), *w = rnd_f32(out, 0.5f, 1.5f);
        float *want_h = (float *) rnd_alloc(out * 4), *xn = (float *) rnd_alloc(out * 4);
        float *d = (float *) rnd_alloc(out * 4), *y = (float *) rnd_alloc(C * 4);
        float *want = (float *) rnd_alloc(C * 4), *sum = (float *) rnd_alloc(out * 4);
        size_t sc = cpu_linear_scratch_size(&ex[0]);
        if (cpu_linear_scratch_size(&c) > sc)
                sc = cpu_linear_scratch_size(&c);
        float *scratch = (float *) rnd_alloc(sc * 4);

        CHECK(n_pairs <= ELEMENTSOF(expert_of), "at most %zu pairs", ELEMENTSOF(expert_of));
        for (uint32_t p = 0; p < n_pairs; p++) {
                expert_of[p] = (p * 5 + 1) % EXPERTS; /* distinct up to 12 pairs */
                if (p + 2 >= n_pairs)
                        pair_w[p] = 1.0f;
        }
        /* the pairs in order, each times its weight, then the residual, as the CPU adds */
        memset(sum, 0, out * 4);
        for (uint32_t p = 0; p < n_pairs; p++) {
                cpu_linear(&ex[expert_of[p]], x + (size_t) p * in, 1, d, scratch, NULL);
                for (uint32_t i = 0; i < out; i++)
                        sum[i] += pair_w[p] * d[i];
        }
        for (uint32_t i = 0; i < out; i++)
                want_h[i] = h[i] + sum[i];
        cpu_norm_linear(want_h, w, out, eps, &c, xn, scratch, want);
        for (uint32_t i = 0; i < C; i++)
                y[i] = NAN;
        CHECK(cuda_test_moe_res(
                      ex, EXPERTS, expert_of, pair_w, n_pairs, kw, &c, x, h, w, eps, y, &err) == 0,
                "%s", err.msg);
        double eh = rel_err(h, want_h, out), e = rel_err(y, want, C);
        CHECK(eh < TOL && e < TOL,
                "moe res %u->%u g%u, %u pairs in CTAs of 2 x %u warps: residual error %.3g, next "
                "linear %.3g",
                in, out, gs, n_pairs, kw, eh, e);
        free(pair_w);
        free(x);
        free(h);
        free(w);
        free(want_h);
        free(xn);
        free(d);
        free(y);
        free(want);
        free(sum);
        free(scratch);
        return fmax(e, eh);
}

int main(void)
{
        static const struct {
                uint32_t in, out, gs, x_div;
        } shapes[] = {
                {2048, 2816, 64, 6},
                {1408, 2048, 64, 1},
                {2048, 2816, 128, 6},
                {1408, 2048, 128, 1},
                {320, 200, 64, 3},
                {96, 40, 32, 1},
        };
        double worst = 0;

        gpu_require();
        for (size_t s = 0; s < ELEMENTSOF(shapes); s++)
                worst = fmax(
                        worst, check(shapes[s].in, shapes[s].out, shapes[s].gs, shapes[s].x_div));
        /* V2-Lite's down (6 routed and 2 shared pairs) in both CTA widths; a slice of 32
         * chunks (x through shared memory); 5 chunks, 3 pairs, groups of 64; 2 chunks, fewer
         * than a half's warps */
        worst = fmax(worst, check_moe_res(1408, 2048, 128, 8, 5));
        worst = fmax(worst, check_moe_res(1408, 2048, 128, 8, 3));
        worst = fmax(worst, check_moe_res(2048, 1024, 128, 6, 5));
        worst = fmax(worst, check_moe_res(320, 256, 64, 3, 3));
        worst = fmax(worst, check_moe_res(128, 512, 64, 5, 5));
        printf("experts: worst relative error %.3g (tolerance %g)\n", worst, TOL);
        return 0;
}
